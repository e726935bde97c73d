//! The I/O around pool resources (`loadBalancer.poolResources: true`): the pools' sources
//! (cloud-config and resources), a watch of `LoadBalancerIPPool`s and of Namespaces' labels,
//! and the status writes. Decisions are in [`crate::pool_resources`].

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use crds::pool::{LoadBalancerIPPool, LoadBalancerIPPoolStatus};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::core::PartialObjectMeta;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Resource, ResourceExt};
use serde_json::json;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::ipam::{Allocator, Pool, RehomeReport};
use crate::pool_import::{self, Imported, Outcome, Source};
use crate::pool_resources::{self, Merged};
use crate::ports::PortRule;

/// Field manager of the pools' status writes.
pub const FIELD_MANAGER: &str = "ccm-baremetal-pools";

/// How long usage changes are gathered before the statuses are written: a burst of Services
/// costs one write per pool, not one per Service.
const STATUS_DELAY: Duration = Duration::from_millis(300);

#[derive(Debug, Default)]
struct Sources {
    config: Vec<Pool>,
    /// The port rule of every pool not in the cloud-config (`resourcePoolPorts`).
    resource_ports: PortRule,
    resources: BTreeMap<String, LoadBalancerIPPool>,
    /// Pools imported from MetalLB or Cilium, and the order of their sources.
    imported: Vec<Imported>,
    import_order: Vec<Source>,
    /// The import's one-line summary, for the health message.
    import_summary: Option<String>,
}

impl Sources {
    /// Every pool in precedence order, those not from the cloud-config under its
    /// `resourcePoolPorts` rule, and what became of each imported pool.
    fn merge(&self) -> (Merged, BTreeMap<String, Outcome>) {
        let resources: Vec<&LoadBalancerIPPool> = self.resources.values().collect();
        let mut merged = pool_resources::merge(&self.config, &resources);
        let outcomes = pool_import::append(&mut merged, &self.imported, &self.import_order);
        for pool in merged.pools.iter_mut().skip(self.config.len()) {
            pool.ports = self.resource_ports.clone();
        }
        (merged, outcomes)
    }
}

/// Where the allocator's pools come from, the Namespaces' labels, and the signal that usage
/// changed. Shared by the provider and its watch task.
#[derive(Debug, Default)]
pub struct PoolSources {
    sources: Mutex<Sources>,
    namespaces: RwLock<HashMap<String, BTreeMap<String, String>>>,
    /// Notified when addresses are assigned or released, or the pools change.
    pub changed: Notify,
}

impl PoolSources {
    /// Sources holding the cloud-config's pools only; pools from elsewhere (resources, imports)
    /// get `resource_ports` as their port rule.
    pub fn new(config: Vec<Pool>, resource_ports: PortRule) -> Self {
        Self { sources: Mutex::new(Sources { config, resource_ports, ..Sources::default() }), ..Self::default() }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Sources> {
        self.sources.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The cloud-config's pools.
    pub fn config_pools(&self) -> Vec<Pool> {
        self.lock().config.clone()
    }

    /// The merged pools and every resource's verdict.
    pub fn merged(&self) -> Merged {
        self.lock().merge().0
    }

    /// Replace the imported pools; returns what became of each (after our own pools).
    pub fn set_imported(&self, imported: Vec<Imported>, order: &[Source]) -> BTreeMap<String, Outcome> {
        let mut sources = self.lock();
        sources.imported = imported;
        sources.import_order = order.to_vec();
        sources.merge().1
    }

    /// Record the import's summary for the health message.
    pub fn set_import_summary(&self, summary: String) {
        self.lock().import_summary = Some(summary);
    }

    /// The import's summary, when pools are imported.
    pub fn import_summary(&self) -> Option<String> {
        self.lock().import_summary.clone()
    }

    /// Replace the cloud-config's pools.
    pub fn set_config(&self, pools: Vec<Pool>) {
        self.lock().config = pools;
    }

    /// Replace the pool resources.
    pub fn set_resources(&self, resources: impl IntoIterator<Item = LoadBalancerIPPool>) {
        self.lock().resources = resources.into_iter().map(|r| (r.name_any(), r)).collect();
    }

    /// The resources as last seen.
    fn resources(&self) -> Vec<LoadBalancerIPPool> {
        self.lock().resources.values().cloned().collect()
    }

    /// [`PoolSources::apply`], log `what` when the pools changed, and wake the status writer.
    pub fn apply_and_wake(&self, allocator: &Allocator, what: &str) {
        if let Some(report) = self.apply(allocator) {
            tracing::info!(pools = allocator.pools().len(), outside_pools = report.outside_pools.len(), "{what}");
        }
        self.changed.notify_one();
    }

    /// Give the allocator the merged pools when they differ from its own; `None` when equal.
    pub fn apply(&self, allocator: &Allocator) -> Option<RehomeReport> {
        let merged = self.merged();
        if *allocator.pools() == merged.pools {
            return None;
        }
        let report = allocator.replace_pools(merged.pools);
        self.changed.notify_one();
        Some(report)
    }

    /// The labels of `namespace` as last seen (empty when unknown).
    pub fn namespace_labels(&self, namespace: &str) -> BTreeMap<String, String> {
        self.namespaces.read().unwrap_or_else(|e| e.into_inner()).get(namespace).cloned().unwrap_or_default()
    }

    fn set_namespace(&self, name: String, labels: Option<BTreeMap<String, String>>) {
        let mut map = self.namespaces.write().unwrap_or_else(|e| e.into_inner());
        match labels {
            Some(labels) => map.insert(name, labels),
            None => map.remove(&name),
        };
    }
}

/// Every pool resource, for the first merge before the allocator is rebuilt.
pub async fn list_pools(client: kube::Client) -> Result<Vec<LoadBalancerIPPool>, kube::Error> {
    let api: Api<LoadBalancerIPPool> = Api::all(client);
    Ok(api.list(&ListParams::default()).await?.items)
}

/// Every Namespace's labels, for the pools' namespace selectors.
pub async fn list_namespaces(client: kube::Client, sources: &PoolSources) -> Result<(), kube::Error> {
    let api: Api<Namespace> = Api::all(client);
    for ns in api.list_metadata(&ListParams::default()).await?.items {
        sources.set_namespace(ns.name_any(), Some(ns.labels().clone()));
    }
    Ok(())
}

/// Watch pools and Namespaces and keep the pools' statuses, until `shutdown`.
pub fn spawn(client: kube::Client, sources: Arc<PoolSources>, allocator: Arc<Allocator>, shutdown: CancellationToken) {
    let (pools, writer) = (sources.clone(), allocator.clone());
    // A status write of ours comes back through the watch too: the writer compares before writing.
    let on_change = move || pools.apply_and_wake(&writer, "load-balancer pools changed");
    tokio::spawn(watch_pools(client.clone(), sources.clone(), on_change, shutdown.clone()));
    tokio::spawn(watch_namespaces(client.clone(), sources.clone(), shutdown.clone()));
    tokio::spawn(write_statuses(client, sources, allocator, shutdown));
}

/// Keep `sources`' pool resources current until `shutdown`, calling `on_change` after each
/// change is taken in (the first time once they are listed).
pub async fn watch_pools(
    client: kube::Client,
    sources: Arc<PoolSources>,
    on_change: impl Fn() + Send + 'static,
    shutdown: CancellationToken,
) {
    let api: Api<LoadBalancerIPPool> = Api::all(client);
    let mut stream = watcher::watcher(api, watcher::Config::default()).default_backoff().boxed();
    let mut listing: Option<Vec<LoadBalancerIPPool>> = None;
    loop {
        let event = tokio::select! {
            _ = shutdown.cancelled() => return,
            e = stream.next() => e,
        };
        let mut seen = sources.resources();
        match event {
            None => return,
            Some(Err(error)) => {
                tracing::warn!(%error, "watching LoadBalancerIPPools failed; retrying");
                continue;
            }
            Some(Ok(Event::Init)) => {
                listing = Some(Vec::new());
                continue;
            }
            Some(Ok(Event::InitApply(pool))) => {
                listing.get_or_insert_with(Vec::new).push(pool);
                continue;
            }
            Some(Ok(Event::InitDone)) => seen = listing.take().unwrap_or_default(),
            Some(Ok(Event::Apply(pool))) => {
                seen.retain(|p| p.name_any() != pool.name_any());
                seen.push(pool);
            }
            Some(Ok(Event::Delete(pool))) => seen.retain(|p| p.name_any() != pool.name_any()),
        }
        sources.set_resources(seen);
        on_change();
    }
}

async fn watch_namespaces(client: kube::Client, sources: Arc<PoolSources>, shutdown: CancellationToken) {
    let api: Api<PartialObjectMeta<Namespace>> = Api::all(client);
    let mut stream = watcher::watcher(api, watcher::Config::default()).default_backoff().boxed();
    loop {
        let event = tokio::select! {
            _ = shutdown.cancelled() => return,
            e = stream.next() => e,
        };
        match event {
            None => return,
            Some(Err(error)) => tracing::warn!(%error, "watching Namespaces failed; retrying"),
            Some(Ok(Event::Apply(ns) | Event::InitApply(ns))) => {
                sources.set_namespace(ns.name_any(), Some(ns.labels().clone()))
            }
            Some(Ok(Event::Delete(ns))) => sources.set_namespace(ns.name_any(), None),
            Some(Ok(Event::Init | Event::InitDone)) => {}
        }
    }
}

/// Write every pool's status that changed, whenever usage or the pools change.
async fn write_statuses(
    client: kube::Client,
    sources: Arc<PoolSources>,
    allocator: Arc<Allocator>,
    shutdown: CancellationToken,
) {
    let api: Api<LoadBalancerIPPool> = Api::all(client);
    let mut written = Written::new();
    loop {
        write_pass(&api, &sources, &allocator, &mut written).await;
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = sources.changed.notified() => {}
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(STATUS_DELAY) => {}
        }
    }
}

fn same_ignoring_time(a: &LoadBalancerIPPoolStatus, b: &LoadBalancerIPPoolStatus) -> bool {
    let strip = |s: &LoadBalancerIPPoolStatus| {
        let mut s = s.clone();
        for c in &mut s.conditions {
            c.last_transition_time = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        }
        s
    };
    strip(a) == strip(b)
}

/// What this task last wrote to each pool, with the resourceVersion the pool had before: while
/// the watch still shows that version, the write is not repeated.
type Written = HashMap<String, (Option<String>, LoadBalancerIPPoolStatus)>;

async fn write_pass(
    api: &Api<LoadBalancerIPPool>,
    sources: &PoolSources,
    allocator: &Allocator,
    written: &mut Written,
) {
    let merged = sources.merged();
    let pools = allocator.pools();
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let resources = sources.resources();
    written.retain(|name, _| resources.iter().any(|r| &r.name_any() == name));
    for resource in resources {
        let name = resource.name_any();
        let Some(verdict) = merged.verdicts.get(&name) else { continue };
        let counts = pools
            .iter()
            .find(|p| verdict.is_valid() && p.name == name)
            .map(|p| pool_resources::counts(p, |b| allocator.in_use_in(b)));
        let desired = pool_resources::desired_status(&resource, verdict, counts.as_ref(), &now);
        let stale = written.get(&name).is_some_and(|(before, status)| {
            *before == resource.meta().resource_version && same_ignoring_time(status, &desired)
        });
        if stale || !pool_resources::status_changed(&resource, &desired) {
            continue;
        }
        let patch = json!({
            "apiVersion": "ccm.rs/v1alpha1",
            "kind": "LoadBalancerIPPool",
            "status": desired,
        });
        match api.patch_status(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&patch)).await {
            Ok(_) => {
                written.insert(name, (resource.meta().resource_version.clone(), desired));
            }
            Err(kube::Error::Api(s)) if s.is_not_found() => {}
            Err(error) => tracing::warn!(pool = %name, %error, "could not write the LoadBalancerIPPool's status"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ports::PortRule;

    #[test]
    fn pool_resources_and_imported_pools_follow_the_cloud_configs_resource_pool_ports() {
        let doc = "loadBalancer:\n  poolResources: true\n  resourcePoolPorts: {minPort: 1024, allowedPorts: [\"8443\"]}\n  pools:\n    - {name: own, cidrs: [192.0.2.0/28]}\n";
        let config = crate::config::parse(doc.as_bytes()).unwrap();
        let rule = crate::config::resource_pool_ports(&config.load_balancer).unwrap();
        assert_eq!(rule, PortRule { min_port: 1024, allowed: Some(vec![8443..=8443]) });
        let sources = PoolSources::new(crate::config::build_pools(&config.load_balancer).unwrap(), rule.clone());
        let resource: LoadBalancerIPPool = serde_json::from_value(json!({
            "metadata": {"name": "lab"}, "spec": {"cidrs": ["198.51.100.0/28"]},
        }))
        .unwrap();
        sources.set_resources([resource]);
        let merged = sources.merged();
        assert_eq!(merged.pools[0].ports, PortRule::default(), "a cloud-config pool keeps its own rule");
        assert_eq!(merged.pools[1].ports, rule, "a pool author cannot open more ports than the cloud-config allows");
        let bad = "loadBalancer:\n  resourcePoolPorts: {allowedPorts: [\"9-1\"]}\n";
        let err = crate::config::parse(bad.as_bytes()).unwrap_err().to_string();
        assert!(err.contains("loadBalancer.resourcePoolPorts.allowedPorts[0]"), "{err}");
    }
}
