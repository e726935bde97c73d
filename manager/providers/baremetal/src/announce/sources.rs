//! Where an announcer's [`Facts`] come from (I/O), kept current while it runs:
//!
//! - the pools and the inventory of the cloud-config it mounts, read again every 5 s, so a pool
//!   edit reaches it as soon as the kubelet updates the mounted Secret (as the manager's);
//! - with `loadBalancer.poolResources`, the `LoadBalancerIPPool` resources, watched;
//! - with `loadBalancer.importPools`, MetalLB's and Cilium's pools, read and watched as the
//!   manager reads them (and only from MetalLB's namespace);
//! - this host's interfaces and gateways, read every 30 s by the caller's `host` function.
//!
//! Pools are merged in the manager's precedence ([`PoolSources`]), so the announcer allows
//! exactly the addresses the manager hands out. A source that cannot be read leaves its pools
//! out (their addresses are then not announced) and is retried.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use super::guard::{Facts, HostFacts};
use super::policy::PolicyBlocks;
use crate::config::{self, CloudConfig};
use crate::pool_import::{ImportSource, Source};
use crate::pool_import_watch;
use crate::pool_watch::{self, PoolSources};

/// How the sources are read.
#[derive(Debug, Clone)]
pub struct SourceSettings {
    /// The mounted cloud-config.
    pub config_path: PathBuf,
    /// How often the file is read again.
    pub reread: Duration,
    /// How often this host's interfaces and routes are read again.
    pub host_every: Duration,
    /// How long after a failed read of the imported pools it is tried again.
    pub retry: Duration,
}

impl SourceSettings {
    /// Defaults: the file every 5 s (as the manager), the host every 30 s, a retry after 30 s.
    pub fn new(config_path: impl Into<PathBuf>) -> Self {
        Self {
            config_path: config_path.into(),
            reread: Duration::from_secs(5),
            host_every: Duration::from_secs(30),
            retry: Duration::from_secs(30),
        }
    }
}

/// The inventory's IP addresses.
fn inventory(config: &CloudConfig) -> BTreeSet<IpAddr> {
    config
        .instances
        .iter()
        .flat_map(|i| i.addresses.iter())
        .filter(|a| a.type_.is_ip())
        .filter_map(|a| a.address.parse().ok())
        .collect()
}

/// Start reading the sources of `config` (already parsed from `settings.config_path`) until
/// `cancel`; the receiver holds the latest facts, `None` until the first are known.
pub fn spawn(
    client: kube::Client,
    config: CloudConfig,
    settings: SourceSettings,
    host: impl Fn() -> HostFacts + Send + 'static,
    cancel: CancellationToken,
) -> watch::Receiver<Option<Arc<Facts>>> {
    let (tx, rx) = watch::channel(None);
    let pools_of = |c: &CloudConfig| config::build_pools(&c.load_balancer).unwrap_or_default();
    let pools = Arc::new(PoolSources::new(pools_of(&config), Default::default()));
    let changed = Arc::new(Notify::new());
    let lb = &config.load_balancer;
    let resources_listed = Arc::new(AtomicBool::new(!lb.pool_resources));
    if lb.pool_resources {
        let (listed, wake) = (resources_listed.clone(), changed.clone());
        let on_change = move || {
            listed.store(true, Ordering::Release);
            wake.notify_one();
        };
        tokio::spawn(pool_watch::watch_pools(client.clone(), pools.clone(), on_change, cancel.clone()));
    }
    let imports_read = Arc::new(AtomicBool::new(lb.import_pools.is_empty()));
    if !lb.import_pools.is_empty() {
        let imports = lb.import_pools.clone();
        let task = read_imports(client, imports, pools.clone(), imports_read.clone(), changed.clone(), settings.retry);
        tokio::spawn(cancellable(task, cancel.clone()));
    }
    tokio::spawn(async move {
        let mut inventory = inventory(&config);
        let mut last_file = std::fs::read(&settings.config_path).ok();
        let mut host_facts = host();
        let mut reread = tokio::time::interval(settings.reread);
        let mut host_tick = tokio::time::interval(settings.host_every);
        loop {
            let complete = resources_listed.load(Ordering::Acquire) && imports_read.load(Ordering::Acquire);
            let merged = pools.merged().pools;
            let policies = (merged.iter())
                .filter(|p| p.policy != Default::default())
                .map(|p| PolicyBlocks { blocks: p.blocks.clone(), policy: p.policy.clone() })
                .collect();
            let blocks = merged.into_iter().flat_map(|p| p.blocks).collect();
            let facts =
                Facts { pools: blocks, inventory: inventory.clone(), host: host_facts.clone(), complete, policies };
            tx.send_if_modified(|current| {
                let differs = current.as_deref() != Some(&facts);
                if differs {
                    *current = Some(Arc::new(facts));
                }
                differs
            });
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = changed.notified() => {}
                _ = host_tick.tick() => host_facts = host(),
                _ = reread.tick() => {
                    let bytes = std::fs::read(&settings.config_path).ok();
                    if bytes.is_none() || bytes == last_file {
                        continue;
                    }
                    match bytes.as_deref().map(config::parse) {
                        Some(Ok(new)) => {
                            pools.set_config(pools_of(&new));
                            inventory = self::inventory(&new);
                            tracing::info!("the cloud-config changed; the announcer took in its pools and inventory");
                        }
                        Some(Err(error)) => {
                            tracing::warn!(%error, "the cloud-config changed but is invalid; the announcer keeps its pools")
                        }
                        None => {}
                    }
                    last_file = bytes;
                }
            }
        }
    });
    rx
}

/// Read the imported pools until it works, then keep them current as the manager does.
async fn read_imports(
    client: kube::Client,
    imports: Vec<ImportSource>,
    pools: Arc<PoolSources>,
    read: Arc<AtomicBool>,
    changed: Arc<Notify>,
    retry: Duration,
) {
    let order: Vec<Source> = imports.iter().map(|i| i.source).collect();
    loop {
        match pool_import_watch::read_all(&client, &imports).await {
            Ok(first) => {
                pools.set_imported(first.imported(), &order);
                read.store(true, Ordering::Release);
                changed.notify_one();
                let wake = changed.clone();
                let stop = CancellationToken::new();
                let _stop_with_this_task = stop.clone().drop_guard();
                pool_import_watch::spawn(client, imports, &first, pools, move || wake.notify_one(), None, stop);
                return std::future::pending().await;
            }
            Err(error) => {
                tracing::warn!(%error, "the announcer cannot read the imported pools; their addresses are not announced until it can");
                tokio::time::sleep(retry).await;
            }
        }
    }
}

/// Run `task` until `cancel`.
async fn cancellable(task: impl std::future::Future<Output = ()>, cancel: CancellationToken) {
    tokio::select! {
        _ = cancel.cancelled() => {}
        _ = task => {}
    }
}
