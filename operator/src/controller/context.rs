//! What every step of a reconcile works with: the operator-wide inputs ([`Shared`]), the
//! leadership term's caches and writers ([`Ctx`]), one reconcile's view of its resource
//! ([`Input`]) and what its build-and-apply step did ([`Outcome`]).

use std::sync::Arc;
use std::time::Duration;

use ccm_framework::events::EventSink;
use ccm_framework::registry::Registry;
use crds::CloudControllerManager;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::PartialObjectMeta;
use kube::core::DeserializeGuard;
use kube::runtime::events::EventType;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client, ResourceExt};
use tokio::sync::mpsc;

use super::memory::Memory;
use crate::apply::{Applier, ChildStores, NameConflict};
use crate::build::BuildSettings;
use crate::dereference::{PeerCache, SecretReader};
use crate::embedded::Engines;
use crate::metrics::OperatorMetrics;
use crate::names;
use crate::validate::{AllowedNamespaces, Environment};
use crate::watch::Scope;

/// The CR as the controller sees it: valid or not.
pub type Guarded = DeserializeGuard<CloudControllerManager>;

/// How long a resource's reconcile waits for more triggers. It merges the burst of watch
/// events one apply causes (the children, then the resource's status) into one reconcile; it
/// is paid once per step of a rollout. 100 ms made 100 resources Ready in 5.0 s instead of 8.0 s
/// (1 s) with the same 11 writes each; none made 12.9 writes each (bench-operator, genuine
/// kube-apiserver, docs/benchmarks.md).
pub const DEBOUNCE: Duration = Duration::from_millis(100);

/// Timings of the controller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timings {
    /// Requeue every CR at least this often (watch events can be missed).
    pub requeue: Duration,
    /// Transient failures turn `Degraded` True only after lasting this long.
    pub degraded_window: Duration,
    /// Trailing-edge debounce of reconcile triggers ([`DEBOUNCE`] by default).
    pub debounce: Duration,
    /// Re-check a fresh Lease at most this often (to notice a holder that stopped renewing).
    pub lease_recheck: Duration,
    /// Reconciles running at once (0: unbounded).
    pub concurrency: u16,
}

impl Default for Timings {
    fn default() -> Self {
        Self {
            requeue: Duration::from_secs(300),
            degraded_window: Duration::from_secs(120),
            debounce: DEBOUNCE,
            lease_recheck: Duration::from_secs(30),
            concurrency: 8,
        }
    }
}

/// What the controller needs from the rest of the operator.
#[derive(Clone)]
pub struct Shared {
    /// The client.
    pub client: Client,
    /// Namespaces served.
    pub scope: Scope,
    /// Namespaces where Secrets are read and managers run.
    pub allowed: AllowedNamespaces,
    /// Providers, for validation (which hands embedded engines the providers it built).
    pub registry: Registry,
    /// Build inputs.
    pub build: BuildSettings,
    /// What this installation allows (Embedded mode, the host network).
    pub environment: Environment,
    /// Timings.
    pub timings: Timings,
    /// Embedded engines of this process.
    pub engines: Arc<Engines>,
    /// Sends CRs to reconcile (engine state changes, conflicts).
    pub trigger: mpsc::UnboundedSender<ObjectRef<Guarded>>,
    /// Events on the CRs.
    pub events: EventSink,
    /// Metrics.
    pub metrics: OperatorMetrics,
}

/// Per-leadership-term reconcile context.
pub struct Ctx {
    /// The operator-wide inputs.
    pub shared: Shared,
    /// The CRs.
    pub crs: Store<Guarded>,
    /// The children of every CR.
    pub children: ChildStores,
    /// The metadata of Secrets labelled as cloud-configs.
    pub secrets: Store<PartialObjectMeta<Secret>>,
    /// Leases.
    pub leases: Store<Lease>,
    /// The manager Pods (stripped to their container statuses), for status and teardown.
    pub pods: Store<Pod>,
    /// Reads referenced cloud-config keys.
    pub secret_reader: SecretReader,
    /// The conflict views of the CRs, each worked out once per version.
    pub peers: PeerCache,
    /// Writes the children.
    pub applier: Arc<Applier>,
    /// What is remembered of each CR between reconciles.
    pub memory: Memory,
    /// True once every store has listed. One task waits on the stores (kube's `Store` wakes only
    /// the last of several waiters); reconciles wait on this channel, which wakes them all.
    pub ready: tokio::sync::watch::Receiver<bool>,
}

impl Ctx {
    /// Waits until every store has listed once (immediate after that).
    pub async fn wait_ready(&self) {
        // A closed channel means the term is ending; the reconcile then fails on I/O.
        let _ = self.ready.clone().wait_for(|ready| *ready).await;
    }

    /// The CRs of `namespace`.
    pub fn api(&self, namespace: &str) -> Api<Guarded> {
        Api::namespaced(self.shared.client.clone(), namespace)
    }

    /// The manager Pods of the CR with UID `uid`, from the cache.
    pub fn pods_of(&self, uid: &str) -> Vec<Arc<Pod>> {
        self.pods
            .state()
            .into_iter()
            .filter(|p| p.labels().get(names::LABEL_OWNER_UID).map(String::as_str) == Some(uid))
            .collect()
    }

    /// Reconcile the CRs `keys` (`namespace/name`) soon.
    pub fn wake(&self, keys: impl IntoIterator<Item = String>) {
        for key in keys {
            if let Some((ns, name)) = key.split_once('/') {
                let _ = self.shared.trigger.send(ObjectRef::new(name).within(ns));
            }
        }
    }

    /// The manager pods of `uid`: its announcers' pods left out.
    pub fn manager_pods_of(&self, uid: &str) -> Vec<Arc<Pod>> {
        self.pods_of(uid).into_iter().filter(|p| names::is_manager_pod(p.labels())).collect()
    }
}

/// What every step of one reconcile knows about the CR.
pub struct Input<'a> {
    /// The CR.
    pub cr: &'a CloudControllerManager,
    /// Its namespace.
    pub namespace: &'a str,
    /// Its name.
    pub name: &'a str,
    /// `namespace/name`.
    pub key: String,
    /// Its UID.
    pub uid: String,
    /// When the reconcile began.
    pub now: Time,
}

/// What the build-and-apply step did.
#[derive(Default)]
pub struct Outcome {
    /// The children written.
    pub applied: Vec<String>,
    /// The children deleted.
    pub pruned: Vec<String>,
    /// A new pod template was applied, or an embedded engine (re)started.
    pub rollout_started: bool,
    /// An event about the embedded engine.
    pub engine_event: Option<(EventType, &'static str, String)>,
    /// Transient failures of this reconcile: `(Degraded reason, message)`.
    pub transient: Vec<(&'static str, String)>,
    /// The manager's RBAC waits for its Pods to stop before it is deleted.
    pub teardown_waiting: bool,
    /// A mode switch keeps the previous workload serving: what it waits for.
    pub switching: Option<String>,
    /// Children whose names are taken by objects this resource does not own: nothing was
    /// applied or pruned.
    pub name_conflicts: Vec<NameConflict>,
}

/// Now, as the API's time.
pub fn now() -> Time {
    Time(Timestamp::now())
}
