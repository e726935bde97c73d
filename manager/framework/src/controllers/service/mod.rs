//! service-lb-controller (alias `service`): load balancers for `type: LoadBalancer` Services
//! (reference §2.3, behaviours S1–S24).
//!
//! Decisions live in [`logic`]; this module does the I/O. Service changes feed a work queue
//! (one sync per key at a time, per-key backoff) whose syncs hold one of
//! `--concurrent-service-syncs` cloud slots only while they call the provider: the API writes
//! around a call (finalizer, status) wait without one, so the cloud stays busy while the API
//! server answers ([`SYNCS_PER_CLOUD_SLOT`]). Node changes trigger a parallel pass that calls
//! `update_load_balancer` only for Services whose host set changed, storing each host set
//! before calling the cloud.
//!
//! Every LoadBalancer Service it handles carries its load-balancer state in KEP-6128's shape,
//! `Accepted`, `Programmed` and `Degraded` ([`condition`], S31, S33), written with the ingress in
//! one server-side apply of the status, and only when something changed. A provider's refusal
//! ([`CloudError::Refused`]) is `Accepted=False` with its reason, besides the
//! `SyncLoadBalancerFailed` event; its reported ingress stays while the provider still has a
//! load balancer for it, and goes when `get_load_balancer` finds none (S30): kube-proxy forwards
//! whatever a Service reports.
//!
//! An API write the server refuses (5xx, 429, no answer) is retried on its own short back-off
//! (200 ms to 5 s) that never touches the cloud back-off, and the retry does not ask the cloud
//! again for what it already answered (S32). The provider's own objects are scanned for orphans
//! (S34, [`orphans`]), deleted only with `--orphan-sweep` (S35).

pub mod condition;
pub mod diff;
pub mod logic;
pub mod orphans;
pub mod queue;
mod shadow;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use crds::conditions::DesiredCondition;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{LoadBalancerStatus, Node, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use serde_json::json;
use tokio::sync::Notify;
use tokio::task::JoinSet;

use crate::cache::Change;
use crate::controller::{Context, Controller};
use crate::events::components::SERVICE_CONTROLLER;
use crate::health::HealthHandle;
use crate::orphans::OrphanSummary;
use crate::provider::{CloudError, LoadBalancer, OwnedObject};

use condition::Outcome;
use logic::{HostSet, SyncPlan};
use queue::{Claim, WorkQueue};

/// Canonical controller name.
pub const NAME: &str = crds::controllers::Controller::ServiceLb.name();
/// Field manager of this controller's patches.
pub const FIELD_MANAGER: &str = "service-controller";
/// Fastest pace of the periodic re-ensure, in Services per second.
pub const RESYNC_MAX_PER_SECOND: u32 = 20;

/// The service load-balancer controller.
#[derive(Debug, Default)]
pub struct ServiceController;

impl ServiceController {
    /// A new controller; it reads its settings from the [`Context`] it is run with.
    pub fn new() -> Self {
        Self
    }
}

/// The `kind` label of the orphan metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: String,
}

/// The labels of `service_controller_orphans_deleted_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SweepLabels {
    kind: String,
    outcome: String,
}

#[derive(Clone)]
struct ServiceMetrics {
    sync_total: Counter,
    nodesync_error_total: Counter,
    nodesync_latency: Histogram,
    update_host_latency: Histogram,
    api_retries: Counter,
    orphans: Family<KindLabel, Gauge>,
    orphans_deleted: Family<SweepLabels, Counter>,
}

impl ServiceMetrics {
    fn register(ctx: &Context) -> Self {
        let r = &ctx.metrics;
        let latency = || Histogram::new(exponential_buckets(1.0, 2.0, 15));
        Self {
            sync_total: r.get_or_register(
                "service_controller_loadbalancer_sync",
                "Load balancer host updates made by the service controller",
                Counter::default,
            ),
            nodesync_error_total: r.get_or_register(
                "service_controller_nodesync_error",
                "Load balancer host updates that failed in a node pass",
                Counter::default,
            ),
            nodesync_latency: r.get_or_register(
                "service_controller_nodesync_latency_seconds",
                "Duration of one node pass over every load balancer",
                latency,
            ),
            update_host_latency: r.get_or_register(
                "service_controller_update_loadbalancer_host_latency_seconds",
                "Duration of one load balancer host update",
                latency,
            ),
            api_retries: r.get_or_register(
                "service_controller_api_retries",
                "Service syncs retried on the API back-off after the API server refused a write (S32)",
                Counter::default,
            ),
            orphans: r.get_or_register(
                "service_controller_orphans",
                "Cloud objects of this cluster that belong to no Service, by kind, as of the last scan (S34)",
                Family::<KindLabel, Gauge>::default,
            ),
            orphans_deleted: r.get_or_register(
                "service_controller_orphans_deleted",
                "Orphaned cloud objects the sweep deleted or failed to delete, by kind and outcome (S35)",
                Family::<SweepLabels, Counter>::default,
            ),
        }
    }
}

/// Why one sync failed; the message becomes the `SyncLoadBalancerFailed` event.
#[derive(Debug, thiserror::Error)]
enum SyncError {
    #[error("failed to ensure load balancer: {0}")]
    Ensure(CloudError),
    #[error("failed to check if load balancer exists before cleanup: {0}")]
    Get(CloudError),
    #[error("failed to delete load balancer: {0}")]
    Delete(CloudError),
    #[error("failed to add load balancer cleanup finalizer: {0}")]
    AddFinalizer(kube::Error),
    #[error("failed to remove load balancer cleanup finalizer: {0}")]
    RemoveFinalizer(kube::Error),
    #[error("failed to update load balancer status: {0}")]
    Status(kube::Error),
}

impl SyncError {
    /// Whether the provider refused the Service (see [`logic::REFUSED_BACKOFF_MAX`]).
    fn is_refusal(&self) -> bool {
        matches!(self, SyncError::Ensure(CloudError::Refused { .. }))
    }

    /// S32: the API server refused a write for a reason that passes (5xx, 429, no answer).
    fn is_transient_api_error(&self) -> bool {
        match self {
            SyncError::AddFinalizer(e) | SyncError::RemoveFinalizer(e) | SyncError::Status(e) => {
                logic::is_transient_api_error(e)
            }
            _ => false,
        }
    }

    /// S12: a fixed delay requested by the cloud, instead of exponential backoff.
    fn requested_delay(&self) -> Option<Duration> {
        match self {
            SyncError::Ensure(e) | SyncError::Get(e) | SyncError::Delete(e) => e.requested_delay(),
            _ => None,
        }
    }
}

/// [`Inner::hosts`]'s memo.
#[derive(Default)]
struct HostsCache {
    /// The Node-change count it was computed at; `None` before the first computation.
    version: Option<u64>,
    set: Arc<HostSet>,
    nodes: Arc<Vec<Arc<Node>>>,
}

/// What the start-up scan saw: each Service key's hash with its resourceVersion's hash, so
/// that the cache's first list, should it reach the controller after the scan, does not sync
/// the same objects twice. Hashes, not the strings: the map lives as long as the controller
/// and at 10,000 Services the strings would hold about 1.5 MiB. Two 64-bit hashes colliding
/// together (~2^-128) is the only way a new object could be mistaken for a scanned one.
#[derive(Default)]
struct Scanned {
    hasher: std::hash::RandomState,
    seen: HashMap<u64, u64>,
}

impl Scanned {
    fn insert(&mut self, key: &str, resource_version: &str) {
        use std::hash::BuildHasher;
        let entry = (self.hasher.hash_one(key), self.hasher.hash_one(resource_version));
        self.seen.insert(entry.0, entry.1);
    }

    /// Whether `key` at `resource_version` was scanned; forgets the key either way.
    fn take(&mut self, key: &str, resource_version: Option<&str>) -> bool {
        use std::hash::BuildHasher;
        let scanned = self.seen.remove(&self.hasher.hash_one(key));
        scanned.is_some_and(|rv| resource_version.is_some_and(|v| self.hasher.hash_one(v) == rv))
    }
}

/// Syncs in flight per cloud slot. A sync spends one load-balancer call in the cloud and up to
/// two API writes around it; with a slot per sync, the writes' round trips left the cloud idle
/// (1,000 Services on a genuine kube-apiserver: 1.4x the server's own limit with 32 syncs,
/// 0.86x with 128). Four per slot let the writes of three syncs wait while one calls the cloud,
/// without more calls in flight than the flag allows.
pub const SYNCS_PER_CLOUD_SLOT: usize = 4;

/// S32: what the cloud answered to a sync whose API write then failed, so its retry writes
/// without asking the cloud again.
enum Settled {
    /// An ensure of the Service as it was then (its UID, its fields that shape the load balancer),
    /// with these hosts, returned this status.
    Ensured { svc: Arc<Service>, hosts: Arc<HostSet>, status: LoadBalancerStatus },
    /// The load balancer of the Service with this UID was deleted.
    Deleted { uid: Option<String> },
}

/// What a node pass's host update came to.
enum HostUpdate {
    /// The load balancer has its new hosts.
    Done,
    /// Nothing to record: another controller's, or no load balancer any more.
    Skipped,
    /// The update failed; the full ensure retries it (S18).
    Failed(CloudError),
}

struct Inner {
    ctx: Context,
    /// `--concurrent-service-syncs` permits: provider calls of queued syncs in flight at most.
    cloud_slots: Arc<tokio::sync::Semaphore>,
    class: Option<String>,
    /// S28: with a class, also Services without one.
    also_unclassed: bool,
    finalizer: String,
    queue: WorkQueue,
    /// S16/S23: the host set each Service's load balancer was last given (or is being given).
    last_hosts: Mutex<HashMap<String, Arc<HostSet>>>,
    /// The latest host set and the Nodes it came from, as of a [`Self::nodes_version`]. The
    /// set is shared by every entry of `last_hosts` that equals it (a private copy per Service
    /// would cost tens of KiB each with a few hundred Nodes), and computed once per Node change
    /// instead of once per sync: at 5,000 Nodes a set is ~0.5 MiB and 5,000 string copies.
    hosts_cache: Mutex<HostsCache>,
    /// Bumped on every Node change this controller receives.
    nodes_version: AtomicU64,
    /// S5/S14: each Service as last synced, for deletions without a finalizer and UID changes.
    synced: Mutex<HashMap<String, Arc<Service>>>,
    node_pass_wanted: AtomicBool,
    node_pass: Notify,
    metrics: ServiceMetrics,
    /// S32: cloud answers whose API write failed, by key.
    settled: Mutex<HashMap<String, Settled>>,
    /// S31: each Service as this controller's last status apply returned it, until the cache
    /// shows it (or a later state): the next write compares with, and keeps, what is there.
    written: Mutex<HashMap<String, Written>>,
}

/// S31: what the comparisons read of a status apply's response. Not the whole Service: while the
/// watch lags behind the writes, thousands are held at once (8,287 at the peak of the
/// 10,000-Service realistic run, 6.4 MiB as whole Services).
#[derive(Debug)]
struct Written {
    uid: Option<String>,
    resource_version: Option<String>,
    status: Option<k8s_openapi::api::core::v1::ServiceStatus>,
}

/// Wait for a cache's first list. kube-runtime's readiness signal keeps only the last waiter's
/// waker, so with several waiters (the engine, other controllers) one can sleep forever; asking
/// again every 100 ms re-registers ours.
pub(crate) async fn caches_ready<K>(cache: &crate::cache::Cache<K>) -> bool
where
    K: kube::Resource<DynamicType = ()> + Clone + std::fmt::Debug + Send + Sync + 'static,
{
    loop {
        if let Ok(ready) = tokio::time::timeout(Duration::from_millis(100), cache.wait_until_ready()).await {
            return ready;
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn split_key(key: &str) -> (&str, &str) {
    key.split_once('/').unwrap_or(("", key))
}

fn patch_params() -> PatchParams {
    PatchParams { field_manager: Some(FIELD_MANAGER.to_string()), ..PatchParams::default() }
}

fn ignore_not_found(r: Result<Service, kube::Error>) -> Result<(), kube::Error> {
    match r {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.is_not_found() => Ok(()),
        Err(e) => Err(e),
    }
}

impl Inner {
    /// The Services this manager takes (S1, S28).
    fn class_filter(&self) -> logic::ClassFilter<'_> {
        logic::ClassFilter { class: self.class.as_deref(), also_unclassed: self.also_unclassed }
    }

    /// Run a queued sync's provider call(s) holding one cloud slot (S29). The semaphore is
    /// never closed; if it were, the call would run without a slot rather than not at all.
    async fn in_cloud_slot<T>(&self, call: impl std::future::Future<Output = T>) -> T {
        let _slot = self.cloud_slots.acquire().await.ok();
        call.await
    }

    fn lb(&self) -> Option<&dyn LoadBalancer> {
        self.ctx.provider.load_balancer()
    }

    fn cluster(&self) -> &str {
        &self.ctx.options.cluster_name
    }

    fn event(&self, svc: &Service, type_: EventType, reason: &str, note: impl Into<String>, action: &str) {
        self.ctx.events.publish(SERVICE_CONTROLLER, svc.object_ref(&()), type_, reason, note, action);
    }

    fn api(&self, ns: &str) -> Api<Service> {
        Api::namespaced(self.ctx.client.clone(), ns)
    }

    fn request_node_pass(&self) {
        self.node_pass_wanted.store(true, Ordering::SeqCst);
        self.node_pass.notify_one();
    }

    /// Current load-balancer hosts from the Node cache (S19).
    fn hosts(&self) -> (Arc<HostSet>, Arc<Vec<Arc<Node>>>) {
        let version = self.nodes_version.load(Ordering::Acquire);
        {
            let cache = lock(&self.hosts_cache);
            if cache.version == Some(version) {
                return (cache.set.clone(), cache.nodes.clone());
            }
        }
        let nodes: Vec<Arc<Node>> =
            self.ctx.nodes.state().into_iter().filter(|n| logic::is_load_balancer_host(n)).collect();
        let set = logic::host_set(nodes.iter().map(|n| n.as_ref()));
        let nodes = Arc::new(nodes);
        let mut cache = lock(&self.hosts_cache);
        if *cache.set != set {
            cache.set = Arc::new(set);
        }
        cache.nodes = nodes.clone();
        cache.version = Some(version);
        (cache.set.clone(), nodes)
    }

    // ---- Service events -------------------------------------------------------------------

    fn on_service_change(&self, change: Change<Service>, initial: &mut Scanned) {
        let class = self.class_filter();
        match change {
            Change::Applied { old: None, new } => {
                let key = logic::service_key(&new);
                // The cache's first list may reach us after the start-up scan saw the same object.
                if initial.take(&key, new.metadata.resource_version.as_deref()) {
                    return;
                }
                if logic::should_sync_added(&new, class, &self.finalizer) {
                    self.queue.add(key);
                }
            }
            Change::Applied { old: Some(old), new } => {
                let key = logic::service_key(&new);
                self.caught_up(&key, &new);
                if logic::should_sync_updated(&old, &new, class, &self.finalizer) {
                    if let Some(field) = logic::update_trigger(&old, &new, class) {
                        tracing::debug!(service = %key, field, "service changed");
                    }
                    self.queue.add(key);
                } else if let Some(last) = lock(&self.synced).get_mut(&key)
                    && last.metadata.uid == new.metadata.uid
                {
                    // Nothing that matters changed (often our own finalizer or status write):
                    // share the cache's copy instead of keeping an older one alive.
                    *last = new;
                }
            }
            Change::Deleted(last) => {
                let key = logic::service_key(&last);
                if lock(&self.synced).contains_key(&key) {
                    self.queue.add(key);
                }
            }
            Change::Resynced => self.rescan_services(),
        }
    }

    /// After missing changes: compare every cached Service with its last synced state.
    fn rescan_services(&self) {
        let class = self.class_filter();
        let synced = lock(&self.synced).clone();
        let mut seen = HashSet::new();
        for svc in self.ctx.services.state() {
            let key = logic::service_key(&svc);
            let wanted = match synced.get(&key) {
                Some(last) if last.resource_version() == svc.resource_version() => false,
                Some(last) => logic::should_sync_updated(last, &svc, class, &self.finalizer),
                None => logic::should_sync_added(&svc, class, &self.finalizer),
            };
            if wanted {
                self.queue.add(key.clone());
            }
            seen.insert(key);
        }
        for key in synced.keys().filter(|k| !seen.contains(*k)) {
            self.queue.add(key.clone());
        }
    }

    fn on_node_change(&self, change: Change<Node>) {
        // Any change, even one no host set sees: providers are handed the Nodes themselves.
        self.nodes_version.fetch_add(1, Ordering::AcqRel);
        let wanted = match &change {
            Change::Applied { old: None, .. } | Change::Deleted(_) | Change::Resynced => true,
            Change::Applied { old: Some(old), new } => logic::node_update_changes_hosts(old, new),
        };
        if wanted {
            self.request_node_pass();
        }
    }

    // ---- Service sync ---------------------------------------------------------------------

    async fn sync(&self, key: &str) -> Result<(), SyncError> {
        let (ns, name) = split_key(key);
        let current = self.ctx.services.get(Some(ns), name);
        let last = lock(&self.synced).get(key).cloned();
        let class = self.class_filter();

        // S6: deleted and recreated under the same name while we were not looking.
        if let (Some(cur), Some(old)) = (&current, &last)
            && logic::recreated_since(cur, old, class)
        {
            self.delete_gone(key, old).await?;
        }
        let last = lock(&self.synced).get(key).cloned();

        match logic::plan_sync(current.as_deref(), last.as_deref(), class, &self.finalizer) {
            SyncPlan::Ensure => match current {
                Some(svc) => self.ensure(key, svc).await,
                None => Ok(()),
            },
            SyncPlan::Cleanup => match current {
                Some(svc) => self.cleanup(key, svc).await,
                None => Ok(()),
            },
            SyncPlan::DeleteGone => match last {
                Some(old) => self.delete_gone(key, &old).await,
                None => Ok(()),
            },
            SyncPlan::Forget => {
                self.forget(key);
                Ok(())
            }
        }
    }

    fn forget(&self, key: &str) {
        lock(&self.synced).remove(key);
        lock(&self.last_hosts).remove(key);
        lock(&self.settled).remove(key);
        lock(&self.written).remove(key);
    }

    /// Drop the memo of our last write once the cache shows it, or anything later.
    fn caught_up(&self, key: &str, cached: &Service) {
        let mut written = lock(&self.written);
        if let Some(w) = written.get(key)
            && (w.uid != cached.metadata.uid
                || w.resource_version == cached.metadata.resource_version
                || w.status == cached.status)
        {
            written.remove(key);
        }
    }

    /// The Service with the status this controller last wrote, when the cache is behind it.
    fn view(&self, key: &str, svc: Arc<Service>) -> Arc<Service> {
        match lock(&self.written).get(key) {
            Some(w) if w.uid == svc.metadata.uid && w.status != svc.status => {
                let mut view = (*svc).clone();
                view.status = w.status.clone();
                Arc::new(view)
            }
            _ => svc,
        }
    }

    /// S31: one server-side apply of the Service's status with `conditions` and `ingress`,
    /// unless it already says so; then, rarely, a patch removing conditions of ours that an
    /// older manager wrote. Returns whether it wrote.
    async fn write_state(
        &self,
        key: &str,
        svc: &Service,
        conditions: &[DesiredCondition],
        ingress: &LoadBalancerStatus,
    ) -> Result<bool, kube::Error> {
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let Some(apply) = condition::status_apply(svc, conditions, ingress, &now) else { return Ok(false) };
        let api = self.api(split_key(key).0);
        let name = svc.name_any();
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let after = match api.patch_status(&name, &params, &Patch::Apply(&apply.body)).await {
            Ok(after) => after,
            Err(kube::Error::Api(s)) if s.is_not_found() => return Ok(false),
            Err(e) => return Err(e),
        };
        let leftovers = apply.leftovers(&after);
        let after = if leftovers.is_empty() {
            after
        } else {
            let patch = Patch::Strategic(condition::delete_patch(&leftovers));
            match api.patch_status(&name, &patch_params(), &patch).await {
                Ok(cleaned) => cleaned,
                Err(kube::Error::Api(s)) if s.is_not_found() => return Ok(true),
                Err(e) => return Err(e),
            }
        };
        let written = Written {
            uid: after.metadata.uid,
            resource_version: after.metadata.resource_version,
            status: after.status,
        };
        lock(&self.written).insert(key.to_string(), written);
        Ok(true)
    }

    /// The ingress the Service reports (as last written).
    fn reported(svc: &Service) -> LoadBalancerStatus {
        svc.status.as_ref().and_then(|s| s.load_balancer.clone()).unwrap_or_default()
    }

    /// S32: the status an ensure of `svc` with `hosts` already returned, if its write failed and
    /// nothing that shapes the load balancer changed since.
    fn settled_ensure(&self, key: &str, svc: &Service, hosts: &Arc<HostSet>) -> Option<LoadBalancerStatus> {
        let mut settled = lock(&self.settled);
        match settled.remove(key)? {
            Settled::Ensured { svc: then, hosts: then_hosts, status }
                if then.metadata.uid == svc.metadata.uid
                    && logic::update_trigger(&then, svc, self.class_filter()).is_none()
                    && (Arc::ptr_eq(&then_hosts, hosts) || *then_hosts == **hosts) =>
            {
                Some(status)
            }
            _ => None,
        }
    }

    /// S7–S10, S31–S33.
    async fn ensure(&self, key: &str, svc: Arc<Service>) -> Result<(), SyncError> {
        let Some(lb) = self.lb() else { return Ok(()) };
        lock(&self.synced).insert(key.to_string(), svc.clone());
        let svc = self.view(key, svc);

        if !logic::has_finalizer(&svc, &self.finalizer) {
            self.event(&svc, EventType::Normal, "EnsuringLoadBalancer", "Ensuring load balancer", "EnsureLoadBalancer");
            let patch = json!({ "metadata": { "finalizers": [self.finalizer] } });
            self.api(split_key(key).0)
                .patch(&svc.name_any(), &patch_params(), &Patch::Strategic(patch))
                .await
                .map_err(SyncError::AddFinalizer)?;
        }

        // S23: record the hosts before the cloud call so a concurrent node pass compares
        // against what this ensure is installing. Read and recorded under one lock: a node pass
        // that finds no record first has bumped the version, so this read already sees its Node.
        let (hosts, nodes) = {
            let mut last = lock(&self.last_hosts);
            let (hosts, nodes) = self.hosts();
            last.insert(key.to_string(), hosts.clone());
            (hosts, nodes)
        };
        // S32: a retry after a failed write does not ask the cloud again.
        let result = match self.settled_ensure(key, &svc, &hosts) {
            Some(status) => Ok(status),
            None => {
                if logic::has_finalizer(&svc, &self.finalizer) {
                    self.event(
                        &svc,
                        EventType::Normal,
                        "EnsuringLoadBalancer",
                        "Ensuring load balancer",
                        "EnsureLoadBalancer",
                    );
                }
                if hosts.is_empty() {
                    self.event(
                        &svc,
                        EventType::Warning,
                        "UnAvailableLoadBalancer",
                        "There are no available nodes for LoadBalancer",
                        "EnsureLoadBalancer",
                    );
                }
                // The Node list is built once the slot is held: at 5,000 Nodes it is 40 KiB, and
                // every sync queued for a slot would hold one (5 MiB with 128 waiting).
                let call = async {
                    let refs: Vec<&Node> = nodes.iter().map(|n| n.as_ref()).collect();
                    lb.ensure_load_balancer(self.cluster(), &svc, &refs).await
                };
                let result = self.in_cloud_slot(call).await;
                if result.is_ok() {
                    self.event(
                        &svc,
                        EventType::Normal,
                        "EnsuredLoadBalancer",
                        "Ensured load balancer",
                        "EnsureLoadBalancer",
                    );
                }
                result
            }
        };
        match result {
            Ok(status) => {
                let conditions = condition::desired(&svc, Outcome::Ensured { hosts: !hosts.is_empty() });
                if let Err(e) = self.write_state(key, &svc, &conditions, &status).await {
                    lock(&self.settled).insert(key.to_string(), Settled::Ensured { svc: svc.clone(), hosts, status });
                    return Err(SyncError::Status(e));
                }
                Ok(())
            }
            Err(CloudError::ImplementedElsewhere) => {
                // S8: another controller owns it; keep the finalizer, write no status.
                tracing::debug!(service = %key, "load balancer implemented elsewhere");
                Ok(())
            }
            Err(e) => {
                let mut ingress = Self::reported(&svc);
                let outcome = match &e {
                    CloudError::Refused { reason, message } => {
                        // S30: the status keeps only a load balancer the provider says exists.
                        if logic::reports_ingress(&svc) {
                            let exists = self.in_cloud_slot(lb.get_load_balancer(self.cluster(), &svc)).await;
                            if logic::ingress_is_stale(&svc, exists.ok().map(|s| s.is_some())) {
                                tracing::info!(service = %key, "the provider refused the Service and holds no load balancer for it; clearing its ingress");
                                ingress = LoadBalancerStatus::default();
                            }
                        }
                        let serving = ingress.ingress.as_ref().is_some_and(|i| !i.is_empty());
                        Outcome::Refused { refusal: *reason, message, serving }
                    }
                    error => Outcome::Failed { error, serving: logic::reports_ingress(&svc) },
                };
                let conditions = condition::desired(&svc, outcome);
                if let Err(error) = self.write_state(key, &svc, &conditions, &ingress).await {
                    // The event and the cloud's retry still follow; the retry writes it again.
                    tracing::warn!(service = %key, %error, "could not record the load balancer's state in the Service's status");
                }
                Err(SyncError::Ensure(e))
            }
        }
    }

    /// S11: delete the load balancer if there is one, then release the Service.
    async fn cleanup(&self, key: &str, svc: Arc<Service>) -> Result<(), SyncError> {
        let Some(lb) = self.lb() else { return Ok(()) };
        let svc = self.view(key, svc);
        let svc = svc.as_ref();
        // S32: a retry after a failed write does not ask the cloud again.
        let deleted = match lock(&self.settled).remove(key) {
            Some(Settled::Deleted { uid }) => uid == svc.metadata.uid,
            _ => false,
        };
        if !deleted {
            self.in_cloud_slot(async {
                let exists = lb.get_load_balancer(self.cluster(), svc).await.map_err(SyncError::Get)?.is_some();
                if exists {
                    self.event(
                        svc,
                        EventType::Normal,
                        "DeletingLoadBalancer",
                        "Deleting load balancer",
                        "DeleteLoadBalancer",
                    );
                    match lb.ensure_load_balancer_deleted(self.cluster(), svc).await {
                        Ok(()) | Err(CloudError::ImplementedElsewhere) => {}
                        Err(e) => return Err(SyncError::Delete(e)),
                    }
                }
                Ok(())
            })
            .await?;
        }
        let remember =
            || lock(&self.settled).insert(key.to_string(), Settled::Deleted { uid: svc.metadata.uid.clone() });
        // The stale ingress and our conditions go first (one write), so a released finalizer
        // means the cleanup is complete. A Service on its way out keeps its status: one write
        // fewer, nobody reads it.
        if !logic::is_being_deleted(svc)
            && let Err(e) = self.write_state(key, svc, &[], &LoadBalancerStatus::default()).await
        {
            remember();
            return Err(SyncError::Status(e));
        }
        if logic::has_finalizer(svc, &self.finalizer) {
            let patch = json!({ "metadata": { "$deleteFromPrimitiveList/finalizers": [self.finalizer] } });
            let r = self.api(split_key(key).0).patch(&svc.name_any(), &patch_params(), &Patch::Strategic(patch)).await;
            if let Err(e) = ignore_not_found(r) {
                remember();
                return Err(SyncError::RemoveFinalizer(e));
            }
        }
        self.event(svc, EventType::Normal, "DeletedLoadBalancer", "Deleted load balancer", "DeleteLoadBalancer");
        self.forget(key);
        Ok(())
    }

    /// S14 (and S6): the Service went away without our finalizer; delete what it had.
    async fn delete_gone(&self, key: &str, last: &Service) -> Result<(), SyncError> {
        let Some(lb) = self.lb() else { return Ok(()) };
        self.event(last, EventType::Normal, "DeletingLoadBalancer", "Deleting load balancer", "DeleteLoadBalancer");
        if let Err(e) = self.in_cloud_slot(lb.ensure_load_balancer_deleted(self.cluster(), last)).await {
            self.event(
                last,
                EventType::Warning,
                "DeleteLoadBalancerFailed",
                format!("Error deleting load balancer: {e}"),
                "DeleteLoadBalancer",
            );
            return Err(SyncError::Delete(e));
        }
        self.event(last, EventType::Normal, "DeletedLoadBalancer", "Deleted load balancer", "DeleteLoadBalancer");
        self.forget(key);
        Ok(())
    }

    /// One worker-held sync with S12's requeue rules.
    async fn process(&self, key: &str) {
        match self.sync(key).await {
            Ok(()) => self.queue.forget(key),
            Err(error) => {
                let (ns, name) = split_key(key);
                // A Service already gone got its DeleteLoadBalancerFailed event (S14).
                if let Some(svc) = self.ctx.services.get(Some(ns), name) {
                    self.event(
                        &svc,
                        EventType::Warning,
                        "SyncLoadBalancerFailed",
                        format!("Error syncing load balancer: {error}"),
                        "SyncLoadBalancer",
                    );
                }
                match error.requested_delay() {
                    Some(delay) => {
                        tracing::warn!(service = %key, %error, ?delay, "load balancer sync failed; retrying after the requested delay");
                        self.queue.add_after(key, delay);
                    }
                    // S32: the API server's trouble; the cloud's back-off is left as it is.
                    None if error.is_transient_api_error() => {
                        let delay = self.queue.add_api_rate_limited(key);
                        self.metrics.api_retries.inc();
                        tracing::info!(service = %key, %error, ?delay, "the API server refused a write; retrying on the API back-off");
                    }
                    None if error.is_refusal() => {
                        let delay = self.queue.add_rate_limited_at_most(key, logic::REFUSED_BACKOFF_MAX);
                        tracing::info!(service = %key, %error, ?delay, "the provider refused the load balancer; retrying with backoff");
                    }
                    None => {
                        let delay = self.queue.add_rate_limited(key);
                        tracing::warn!(service = %key, %error, ?delay, "load balancer sync failed; retrying with backoff");
                    }
                }
            }
        }
    }

    // ---- Node pass ------------------------------------------------------------------------

    /// S16–S18: give every load balancer whose host set changed its new hosts.
    async fn node_pass(self: &Arc<Self>) {
        let started = Instant::now();
        let (hosts, nodes) = self.hosts();
        let class = self.class_filter();
        let candidates: Vec<Arc<Service>> = self
            .ctx
            .services
            .state()
            .into_iter()
            .filter(|s| logic::wants_load_balancer(s, class) && !logic::is_being_deleted(s))
            .collect();
        let workers = self.ctx.options.concurrent_service_syncs.max(1);
        futures::stream::iter(candidates)
            .for_each_concurrent(workers, |svc| {
                let (this, hosts, nodes) = (self.clone(), hosts.clone(), nodes.clone());
                async move { this.update_hosts(svc, &hosts, &nodes).await }
            })
            .await;
        self.metrics.nodesync_latency.observe(started.elapsed().as_secs_f64());
    }

    async fn update_hosts(&self, svc: Arc<Service>, hosts: &Arc<HostSet>, nodes: &[Arc<Node>]) {
        let key = logic::service_key(&svc);
        match lock(&self.last_hosts).get(&key) {
            // Never synced by this process: its pending sync installs the current hosts.
            None => return,
            Some(prev) if prev == hosts => return,
            Some(_) => {}
        }
        match self.queue.try_claim(&key) {
            Claim::Claimed => {}
            // A sync is under way with an older host set: run it again afterwards.
            Claim::Busy => return self.queue.add(key),
            Claim::Queued => return,
        }
        lock(&self.last_hosts).insert(key.clone(), hosts.clone());
        let svc = self.view(&key, svc);
        let failed = match self.call_update(&svc, hosts, nodes).await {
            HostUpdate::Done => {
                self.record(&key, &svc, Outcome::HostsUpdated { hosts: !hosts.is_empty() }).await;
                false
            }
            HostUpdate::Skipped => false,
            HostUpdate::Failed(error) => {
                self.record(&key, &svc, Outcome::HostUpdateFailed { error: &error }).await;
                true
            }
        };
        if failed {
            // S18: retry through the full ensure path.
            self.queue.add(key.clone());
        }
        self.queue.done(&key);
    }

    /// S33: a node pass's outcome in the Service's conditions, keeping its ingress; a failed
    /// write is left to the next sync.
    async fn record(&self, key: &str, svc: &Service, outcome: Outcome<'_>) {
        let conditions = condition::desired(svc, outcome);
        if let Err(error) = self.write_state(key, svc, &conditions, &Self::reported(svc)).await {
            tracing::warn!(service = %key, %error, "could not record the load balancer's state in the Service's status");
        }
    }

    async fn call_update(&self, svc: &Service, hosts: &HostSet, nodes: &[Arc<Node>]) -> HostUpdate {
        let Some(lb) = self.lb() else { return HostUpdate::Skipped };
        let refs: Vec<&Node> = nodes.iter().map(|n| n.as_ref()).collect();
        self.metrics.sync_total.inc();
        let started = Instant::now();
        let result = lb.update_load_balancer(self.cluster(), svc, &refs).await;
        self.metrics.update_host_latency.observe(started.elapsed().as_secs_f64());
        match result {
            Ok(()) if hosts.is_empty() => {
                self.event(
                    svc,
                    EventType::Warning,
                    "UnAvailableLoadBalancer",
                    "There are no available nodes for LoadBalancer",
                    "UpdateLoadBalancer",
                );
                HostUpdate::Done
            }
            Ok(()) => {
                self.event(
                    svc,
                    EventType::Normal,
                    "UpdatedLoadBalancer",
                    "Updated load balancer with new hosts",
                    "UpdateLoadBalancer",
                );
                HostUpdate::Done
            }
            Err(CloudError::ImplementedElsewhere) => HostUpdate::Skipped,
            Err(error) => {
                // S17: a load balancer that no longer exists needs no hosts; S30: unless the
                // Service still reports it, which the full ensure takes out.
                let exists = lb.get_load_balancer(self.cluster(), svc).await.ok().map(|s| s.is_some());
                if logic::failed_update_needs_no_retry(svc, exists) {
                    return HostUpdate::Skipped;
                }
                tracing::warn!(service = %logic::service_key(svc), %error, "load balancer host update failed");
                self.event(
                    svc,
                    EventType::Warning,
                    "UpdateLoadBalancerFailed",
                    logic::update_failed_message(hosts, &error.to_string()),
                    "UpdateLoadBalancer",
                );
                self.metrics.nodesync_error_total.inc();
                HostUpdate::Failed(error)
            }
        }
    }

    // ---- Periodic re-ensure ---------------------------------------------------------------

    /// Queue every load-balanced Service once, paced so the cloud sees at most
    /// [`RESYNC_MAX_PER_SECOND`] re-ensures per second and the round spreads over half a period.
    fn schedule_resync(&self, period: Duration) {
        let class = self.class_filter();
        let keys: Vec<String> = self
            .ctx
            .services
            .state()
            .iter()
            .filter(|s| logic::wants_load_balancer(s, class) && !logic::is_being_deleted(s))
            .map(|s| logic::service_key(s))
            .collect();
        if keys.is_empty() {
            return;
        }
        let min_gap = Duration::from_secs(1) / RESYNC_MAX_PER_SECOND;
        let gap = (period / 2 / u32::try_from(keys.len()).unwrap_or(u32::MAX)).max(min_gap);
        tracing::debug!(services = keys.len(), ?gap, "re-ensuring every load balancer");
        for (i, key) in keys.into_iter().enumerate() {
            self.queue.add_after(key, gap * u32::try_from(i).unwrap_or(u32::MAX));
        }
    }
}

#[async_trait]
impl Controller for ServiceController {
    fn name(&self) -> &'static str {
        NAME
    }

    async fn run(self: Box<Self>, ctx: Context, health: HealthHandle) -> Result<(), crate::error::Error> {
        if ctx.provider.load_balancer().is_none() {
            // S24: not an error; the rest of the manager keeps running.
            tracing::info!(provider = %ctx.provider.name(), "provider has no load balancers; service controller not started");
            return Ok(());
        }
        let metrics = ServiceMetrics::register(&ctx);
        let slots = ctx.options.concurrent_service_syncs.max(1);
        // The orphan scan's provider calls take a slot like a sync's (S29).
        let cloud_slots = Arc::new(tokio::sync::Semaphore::new(slots));
        let scan = tokio::spawn(scan_orphans_until_shutdown(ctx.clone(), metrics.clone(), cloud_slots.clone()));
        if let Some(comparer) = crate::controllers::shadow::Comparer::from_context(&ctx, NAME) {
            health.set_healthy();
            shadow::run(ctx, comparer).await;
            let _ = scan.await;
            return Ok(());
        }
        let class = ctx.options.load_balancer_class.clone().filter(|c| !c.is_empty());
        let inner = Arc::new(Inner {
            cloud_slots,
            finalizer: logic::cleanup_finalizer(class.as_deref()),
            also_unclassed: class.is_some() && ctx.options.handle_unclassed_services,
            class,
            queue: WorkQueue::new(),
            last_hosts: Mutex::default(),
            hosts_cache: Mutex::default(),
            nodes_version: AtomicU64::new(0),
            synced: Mutex::default(),
            node_pass_wanted: AtomicBool::new(false),
            node_pass: Notify::new(),
            metrics,
            settled: Mutex::default(),
            written: Mutex::default(),
            ctx: ctx.clone(),
        });
        let shutdown = ctx.shutdown.clone();

        let ready = async { caches_ready(&ctx.services).await && caches_ready(&ctx.nodes).await };
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            ok = ready => if !ok {
                health.set_unhealthy("the Service or Node cache stopped before its first list");
                return Ok(());
            },
        }
        let mut services = ctx.services.subscribe();
        let mut nodes = ctx.nodes.subscribe();
        let mut initial = Scanned::default();
        for svc in ctx.services.state() {
            let key = logic::service_key(&svc);
            if let Some(rv) = svc.metadata.resource_version.as_deref() {
                initial.insert(&key, rv);
            }
            if logic::should_sync_added(&svc, inner.class_filter(), &inner.finalizer) {
                inner.queue.add(key);
            }
        }
        let workers = slots * SYNCS_PER_CLOUD_SLOT;
        tracing::info!(workers, cloud_slots = slots, class = ?inner.class, also_unclassed = inner.also_unclassed, finalizer = %inner.finalizer, "service controller started");
        health.set_healthy();

        let mut tasks = JoinSet::new();
        for _ in 0..workers {
            let (inner, shutdown) = (inner.clone(), shutdown.clone());
            tasks.spawn(async move {
                while let Some(key) = inner.queue.next(&shutdown).await {
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = inner.process(&key) => {}
                    }
                    inner.queue.done(&key);
                }
            });
        }
        {
            let (inner, shutdown) = (inner.clone(), shutdown.clone());
            tasks.spawn(async move {
                loop {
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = inner.node_pass.notified() => {}
                    }
                    // Coalesce: changes arriving during a pass cause exactly one more pass.
                    while inner.node_pass_wanted.swap(false, Ordering::SeqCst) {
                        tokio::select! {
                            _ = shutdown.cancelled() => return,
                            _ = inner.node_pass() => {}
                        }
                    }
                }
            });
        }
        if let Some(period) = ctx.options.load_balancer_resync_period.filter(|p| !p.is_zero()) {
            let (inner, shutdown) = (inner.clone(), shutdown.clone());
            tasks.spawn(async move {
                let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tick.tick() => inner.schedule_resync(period),
                    }
                }
            });
        }

        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                change = services.recv() => match change {
                    Some(c) => inner.on_service_change(c, &mut initial),
                    None => break,
                },
                change = nodes.recv() => match change {
                    Some(c) => inner.on_node_change(c),
                    None => break,
                },
            }
        }
        shutdown.cancelled().await;
        while tasks.join_next().await.is_some() {}
        let _ = scan.await;
        Ok(())
    }
}

/// S34, S35: scan the provider's own objects for orphans every `--orphan-scan-period` until
/// shutdown (in shadow mode too, which never deletes), reporting each scan in the context's
/// orphan record and the metrics. Stops at once when the provider cannot list its objects.
async fn scan_orphans_until_shutdown(ctx: Context, metrics: ServiceMetrics, cloud_slots: Arc<tokio::sync::Semaphore>) {
    let period = ctx.options.orphan_scan_period;
    if period.is_zero() {
        return;
    }
    tokio::select! {
        _ = ctx.shutdown.cancelled() => return,
        ok = caches_ready(&ctx.services) => if !ok { return },
    }
    let sweep = ctx.options.orphan_sweep && ctx.shadow.is_none();
    let mut scanner = OrphanScanner::default();
    loop {
        if !scanner.scan(&ctx, &metrics, sweep, &cloud_slots).await {
            return;
        }
        tokio::select! {
            _ = ctx.shutdown.cancelled() => return,
            _ = tokio::time::sleep(period) => {}
        }
    }
}

/// The orphan scan's state across scans.
#[derive(Default)]
struct OrphanScanner {
    tracker: orphans::Tracker,
    deleted: u64,
    failed: u64,
    /// Kinds ever counted, so a kind whose orphans are gone reads 0 instead of its last count.
    kinds: std::collections::BTreeSet<String>,
}

impl OrphanScanner {
    /// One scan; false when the provider cannot list its objects (no scan will help).
    async fn scan(
        &mut self,
        ctx: &Context,
        metrics: &ServiceMetrics,
        sweep: bool,
        cloud_slots: &tokio::sync::Semaphore,
    ) -> bool {
        let Some(lb) = ctx.provider.load_balancer() else { return false };
        let cluster = ctx.options.cluster_name.as_str();
        // The semaphore is never closed; if it were, the call would run without a slot.
        let listed = {
            let _slot = cloud_slots.acquire().await.ok();
            lb.list_owned(cluster).await
        };
        let owned = match listed {
            Ok(owned) => owned,
            Err(CloudError::NotImplemented) => {
                tracing::info!(provider = %ctx.provider.name(), "the provider does not list the objects it owns; no orphan report");
                ctx.orphans.set(OrphanSummary::of(&[], false, sweep));
                return false;
            }
            Err(error) => {
                tracing::warn!(%error, "could not list the cloud objects of this cluster; the orphan report waits for the next scan");
                return true;
            }
        };
        // Read after the listing: every object in it was made for a Service the cache held.
        let is_orphan = |o: &OwnedObject| {
            let owner = orphans::owner_key(o).and_then(|(ns, name)| ctx.services.get(Some(ns), name));
            orphans::is_orphan(o, owner.as_deref(), |svc| lb.load_balancer_name(cluster, svc))
        };
        let mut found: Vec<OwnedObject> = owned.into_iter().filter(|o| is_orphan(o)).collect();
        let due = self.tracker.observe(&found);
        if sweep && !due.is_empty() {
            // Once more right before deleting: a Service of that name may have come since.
            let due: Vec<OwnedObject> = due.into_iter().filter(|o| is_orphan(o)).collect();
            let results = {
                let _slot = cloud_slots.acquire().await.ok();
                lb.delete_owned(cluster, &due).await
            };
            for (object, result) in due.iter().zip(results) {
                let outcome = match result {
                    Ok(()) => {
                        self.deleted += 1;
                        self.tracker.forget(object);
                        found.retain(|f| f != object);
                        tracing::info!(kind = %object.kind, id = %object.id, service = ?object.service, "deleted an orphaned cloud object");
                        "deleted"
                    }
                    Err(CloudError::NotOwned(why)) => {
                        // Not an orphan of ours after all: kept, and not tried again.
                        self.tracker.forget(object);
                        found.retain(|f| f != object);
                        tracing::warn!(kind = %object.kind, id = %object.id, reason = %why, "kept a listed cloud object: it is no longer this cluster's");
                        "kept"
                    }
                    Err(error) => {
                        self.failed += 1;
                        tracing::warn!(kind = %object.kind, id = %object.id, %error, "could not delete an orphaned cloud object; retrying on the next scan");
                        "failed"
                    }
                };
                let labels = SweepLabels { kind: object.kind.clone(), outcome: outcome.to_string() };
                metrics.orphans_deleted.get_or_create(&labels).inc();
            }
        }
        let mut summary = OrphanSummary::of(&found, true, sweep);
        self.kinds.extend(summary.counts.keys().cloned());
        for kind in &self.kinds {
            let count = summary.counts.get(kind).copied().unwrap_or(0);
            metrics
                .orphans
                .get_or_create(&KindLabel { kind: kind.clone() })
                .set(i64::try_from(count).unwrap_or(i64::MAX));
        }
        if summary.total > 0 && !sweep {
            tracing::debug!(
                orphans = summary.total,
                "orphaned cloud objects found; spec.orphans.sweep (--orphan-sweep) deletes them"
            );
        }
        summary.deleted = self.deleted;
        summary.failed = self.failed;
        ctx.orphans.set(summary);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::Cache;
    use kube::runtime::watcher;

    #[test]
    fn a_scanned_service_at_the_same_version_is_recognised_once_and_any_other_is_not() {
        let mut scanned = Scanned::default();
        scanned.insert("ns/web", "41");
        scanned.insert("ns/api", "7");
        assert!(scanned.take("ns/web", Some("41")), "the first list repeating the scan");
        assert!(!scanned.take("ns/web", Some("41")), "forgotten after one match");
        assert!(!scanned.take("ns/api", Some("8")), "changed since the scan: synced");
        assert!(!scanned.take("ns/api", Some("7")), "a mismatch forgets the key too");
        assert!(!scanned.take("ns/new", Some("41")), "never scanned");
        scanned.insert("ns/db", "3");
        assert!(!scanned.take("ns/db", None), "no version: synced");
        assert!(scanned.seen.is_empty());
    }

    #[tokio::test]
    async fn every_waiter_sees_the_cache_become_ready() {
        let (cache, mut writer) = Cache::<Node>::new();
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let c = cache.clone();
                tokio::spawn(async move { caches_ready(&c).await })
            })
            .collect();
        // Let every waiter register before the cache becomes ready.
        tokio::time::sleep(Duration::from_millis(50)).await;
        writer.apply(watcher::Event::Init);
        writer.apply(watcher::Event::InitDone);
        for w in waiters {
            let ready = tokio::time::timeout(Duration::from_secs(2), w).await;
            assert!(matches!(ready, Ok(Ok(true))), "a waiter missed the wake-up");
        }
    }
}
