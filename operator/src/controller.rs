//! The CloudControllerManager controller: watches, the reconcile pipeline, cleanup.
//!
//! Watches (each label- or field-selected, with `managedFields` stripped): the CRs in every
//! served namespace (through a deserialization guard, so one malformed object cannot stall the
//! others); and only in the allowed namespaces (`--cloud-config-namespaces`, where the chart
//! grants namespaced Roles), one watcher per namespace merged into one store: the children
//! (owned Deployments, DaemonSets, ServiceAccounts, Roles, RoleBindings, PDBs), Secret metadata
//! (mapped to the CRs referencing the Secret), and Leases (mapped to the CR of the same name
//! when the holder changes). The ClusterRoleBinding is watched cluster-wide by label and mapped
//! through its owner annotation. A reconcile reads only these caches, except a referenced
//! Secret's data after it changed.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ccm_framework::events::EventSink;
use ccm_framework::registry::Registry;
use crds::conditions::{self, DesiredCondition, Status, types};
use crds::{CloudControllerManager, Mode};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ObjectReference, Pod, Secret, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{ApiResource, DynamicObject, ObjectMeta, PartialObjectMeta, Patch, PatchParams};
use kube::core::DeserializeGuard;
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::events::EventType;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{PredicateConfig, WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::apply::{self, Applier, ChildKey, ChildStores, NameConflict};
use crate::build::{self, BuildSettings, Desired, Kind};
use crate::dereference::{self, SecretReader};
use crate::embedded::Engines;
use crate::error::Error;
use crate::metrics::OperatorMetrics;
use crate::names;
use crate::status::{self, EngineState, PodsObservation, StatusInput, TransientFailures, Workload};
use crate::switch::{self, Switch};
use crate::validate::{self, AllowedNamespaces, SecretState, Validation};
use crate::watch::{self, Scope};
use crds::reasons::{self, degraded};

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
    /// Providers, for validation and embedded engines.
    pub registry: Registry,
    /// Build inputs.
    pub build: BuildSettings,
    /// What this installation allows (Embedded mode, the host network).
    pub environment: validate::Environment,
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
struct Ctx {
    shared: Shared,
    crs: Store<Guarded>,
    children: ChildStores,
    secrets: Store<PartialObjectMeta<Secret>>,
    leases: Store<Lease>,
    /// The manager Pods (stripped to their container statuses), for status and teardown.
    pods: Store<Pod>,
    /// For each CR (UID), since when the deletion of its manager's RBAC waits for its Pods.
    teardown_since: Mutex<HashMap<String, std::time::Instant>>,
    /// CRs (by UID) whose new pod template this operator applied and whose workload controller
    /// has not observed it yet: the cached CR may not show the `Progressing=True` written for it.
    rollouts: Mutex<BTreeSet<String>>,
    secret_reader: SecretReader,
    applier: Arc<Applier>,
    failures: Mutex<HashMap<String, TransientFailures>>,
    retries: Mutex<HashMap<String, u32>>,
    /// For each CR (`namespace/name`), the newer CRs that conflict with it.
    losers: Mutex<HashMap<String, BTreeSet<String>>>,
    /// For each CR (UID), the hash of the cloud-config whose check ran past the time limit: the
    /// same content is refused at once next time instead of tying up another thread.
    timed_out: Mutex<HashMap<String, String>>,
    /// True once every store has listed. One task waits on the stores (kube's `Store` wakes only
    /// the last of several waiters); reconciles wait on this channel, which wakes them all.
    ready: tokio::sync::watch::Receiver<bool>,
}

fn now() -> Time {
    Time(Timestamp::now())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn strip<K: Resource>(o: &mut K) {
    let meta = o.meta_mut();
    meta.managed_fields = None;
    if let Some(a) = meta.annotations.as_mut() {
        a.remove("kubectl.kubernetes.io/last-applied-configuration");
    }
}

/// A label-selected, merged, stripped watch of children of kind `K`, feeding `writer`;
/// deletions make the applier forget the object.
fn child_stream<K>(
    apis: Vec<Api<K>>,
    kind: Kind,
    applier: Arc<Applier>,
    extra_strip: fn(&mut K),
) -> (Store<K>, futures::stream::BoxStream<'static, Result<K, watcher::Error>>)
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
{
    let (reader, writer) = reflector::store();
    let config = watcher::Config::default().labels(&names::managed_selector());
    let stream = watch::merged(apis, config, reader.clone())
        .modify(move |o| {
            strip(o);
            extra_strip(o);
        })
        .inspect(move |e| {
            if let Ok(watcher::Event::Delete(o)) = e {
                applier.forget(&ChildKey::from_meta(kind, o.meta()));
            }
        })
        .reflect(writer)
        .touched_objects()
        .boxed();
    (reader, stream)
}

fn no_extra<K>(_: &mut K) {}

fn strip_deployment(d: &mut Deployment) {
    if let Some(spec) = d.spec.as_mut() {
        spec.template.spec = None;
    }
}

fn strip_daemon_set(d: &mut DaemonSet) {
    if let Some(spec) = d.spec.as_mut() {
        spec.template.spec = None;
    }
}

/// One `Api` per namespace of `namespaces`.
fn namespaced_apis<K>(client: &Client, namespaces: &[String]) -> Vec<Api<K>>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    K::DynamicType: Default,
{
    namespaces.iter().map(|ns| Api::namespaced(client.clone(), ns)).collect()
}

/// Run the controller until `stop` fires.
pub async fn run(shared: Shared, trigger_rx: mpsc::UnboundedReceiver<ObjectRef<Guarded>>, stop: CancellationToken) {
    let client = shared.client.clone();
    let scope = shared.scope.clone();
    let applier = Arc::new(Applier::new(client.clone()));
    // Everything but the CRs and the ClusterRoleBindings is watched only where the operator may
    // work: RBAC grants it Secrets, Leases and the manager's objects there and nowhere else.
    let workload_namespaces = scope.within(shared.allowed.as_slice());
    tracing::info!(namespaces = ?workload_namespaces, "watching Secrets, Leases and manager objects");

    let (cr_reader, cr_writer) = reflector::store::<Guarded>();
    let cr_stream = watch::merged(scope.apis::<Guarded>(&client), watcher::Config::default(), cr_reader.clone())
        .modify(strip)
        .reflect(cr_writer)
        .applied_objects();

    let (deployments, deployment_stream) = child_stream(
        namespaced_apis::<Deployment>(&client, &workload_namespaces),
        Kind::Deployment,
        applier.clone(),
        strip_deployment,
    );
    let (daemon_sets, daemon_set_stream) = child_stream(
        namespaced_apis::<DaemonSet>(&client, &workload_namespaces),
        Kind::DaemonSet,
        applier.clone(),
        strip_daemon_set,
    );
    let (service_accounts, sa_stream) = child_stream(
        namespaced_apis::<PartialObjectMeta<ServiceAccount>>(&client, &workload_namespaces),
        Kind::ServiceAccount,
        applier.clone(),
        no_extra,
    );
    let (role_bindings, rb_stream) = child_stream(
        namespaced_apis::<PartialObjectMeta<RoleBinding>>(&client, &workload_namespaces),
        Kind::RoleBinding,
        applier.clone(),
        no_extra,
    );
    let (roles, role_stream) = child_stream(
        namespaced_apis::<PartialObjectMeta<Role>>(&client, &workload_namespaces),
        Kind::Role,
        applier.clone(),
        no_extra,
    );
    let (pdbs, pdb_stream) = child_stream(
        namespaced_apis::<PartialObjectMeta<PodDisruptionBudget>>(&client, &workload_namespaces),
        Kind::PodDisruptionBudget,
        applier.clone(),
        no_extra,
    );
    let (cluster_role_bindings, crb_stream) = child_stream(
        vec![Api::<PartialObjectMeta<ClusterRoleBinding>>::all(client.clone())],
        Kind::ClusterRoleBinding,
        applier.clone(),
        no_extra,
    );

    let (secrets, secrets_writer) = reflector::store::<PartialObjectMeta<Secret>>();
    // Only Secrets labelled as cloud-configs: a resource cannot point the operator at any other
    // Secret of the namespace (bootstrap tokens, other components' credentials).
    let secret_stream = watch::merged(
        namespaced_apis::<PartialObjectMeta<Secret>>(&client, &workload_namespaces),
        watcher::Config::default().labels(&names::cloud_config_selector()),
        secrets.clone(),
    )
    .modify(|s| {
        // Only the name and resourceVersion are needed.
        let m = &mut s.metadata;
        *m = ObjectMeta {
            name: m.name.take(),
            namespace: m.namespace.take(),
            resource_version: m.resource_version.take(),
            uid: m.uid.take(),
            ..Default::default()
        };
    })
    .reflect(secrets_writer)
    .touched_objects();

    let (leases, leases_writer) = reflector::store::<Lease>();
    let lease_apis = namespaced_apis::<Lease>(&client, &workload_namespaces);
    let lease_stream = watch::merged(lease_apis, watcher::Config::default(), leases.clone())
        .modify(strip)
        .reflect(leases_writer)
        .touched_objects()
        // Renewals are not news; a new holder is.
        .predicate_filter(
            |l: &Lease| {
                use std::hash::{Hash, Hasher};
                let mut h = std::collections::hash_map::DefaultHasher::new();
                l.spec.as_ref().and_then(|s| s.holder_identity.clone()).hash(&mut h);
                Some(h.finish())
            },
            PredicateConfig::default(),
        );

    let (pods, pods_writer) = reflector::store::<Pod>();
    let seen_pods: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
    let pod_stream = watch::merged(
        namespaced_apis::<Pod>(&client, &workload_namespaces),
        watcher::Config::default().labels(&names::managed_selector()),
        pods.clone(),
    )
    .modify(dereference::strip_pod)
    .reflect(pods_writer)
    // Only what status and teardown read is news (not every kubelet heartbeat); a deletion
    // always is.
    .filter_map(move |event| {
        let seen = seen_pods.clone();
        async move {
            match event {
                Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => {
                    let summary = pod_summary(&p);
                    let before = lock(&seen).insert(p.uid().unwrap_or_default(), summary);
                    (before != Some(summary)).then_some(Ok(p))
                }
                Ok(watcher::Event::Delete(p)) => {
                    lock(&seen).remove(&p.uid().unwrap_or_default());
                    Some(Ok(p))
                }
                Ok(_) => None,
                Err(e) => Some(Err(e)),
            }
        }
    });
    let crs_for_pods = cr_reader.clone();
    let crs_for_leases = cr_reader.clone();

    let (ready_tx, ready) = tokio::sync::watch::channel(false);
    let ctx = Arc::new(Ctx {
        shared: shared.clone(),
        crs: cr_reader.clone(),
        children: ChildStores {
            service_accounts,
            cluster_role_bindings,
            role_bindings,
            roles,
            deployments,
            daemon_sets,
            pdbs,
        },
        secrets,
        leases,
        pods,
        teardown_since: Mutex::new(HashMap::new()),
        rollouts: Mutex::new(BTreeSet::new()),
        secret_reader: SecretReader::default(),
        applier,
        failures: Mutex::new(HashMap::new()),
        retries: Mutex::new(HashMap::new()),
        losers: Mutex::new(HashMap::new()),
        timed_out: Mutex::new(HashMap::new()),
        ready,
    });
    let gate = ctx.clone();
    tokio::spawn(async move {
        gate.children.wait_ready().await;
        let _ = gate.secrets.wait_until_ready().await;
        let _ = gate.leases.wait_until_ready().await;
        let _ = gate.pods.wait_until_ready().await;
        let _ = ready_tx.send(true);
    });

    let crs_for_secrets = cr_reader.clone();
    let triggers = futures::stream::unfold(trigger_rx, |mut rx| async move { rx.recv().await.map(|r| (r, rx)) });
    let config = ControllerConfig::default().debounce(shared.timings.debounce).concurrency(shared.timings.concurrency);
    let stopped = stop.clone();
    Controller::for_stream(cr_stream, cr_reader)
        .with_config(config)
        .owns_stream(deployment_stream)
        .owns_stream(daemon_set_stream)
        .owns_stream(sa_stream)
        // A migration Lease's Role and RoleBindings in another namespace carry no ownerReference.
        .watches_stream(rb_stream, |rb: PartialObjectMeta<RoleBinding>| owner_of_child(rb.meta()))
        .watches_stream(role_stream, |role: PartialObjectMeta<Role>| owner_of_child(role.meta()))
        .owns_stream(pdb_stream)
        .watches_stream(crb_stream, |crb: PartialObjectMeta<ClusterRoleBinding>| {
            owner_annotation(crb.annotations().get(names::ANNOTATION_OWNER).map(String::as_str))
        })
        .watches_stream(secret_stream, move |secret: PartialObjectMeta<Secret>| {
            referencing(&crs_for_secrets, &secret.namespace().unwrap_or_default(), &secret.name_any())
        })
        .watches_stream(lease_stream, move |lease: Lease| {
            let (namespace, name) = (lease.namespace().unwrap_or_default(), lease.name_any());
            // Its own resource, and those whose migration Lease it is (status.migrationLease).
            let mut crs = migrating_under(&crs_for_leases, &namespace, &name);
            crs.push(ObjectRef::<Guarded>::new(&name).within(&namespace));
            crs
        })
        .watches_stream(pod_stream, move |pod: Pod| {
            owner_of_pod(&crs_for_pods, pod.labels().get(names::LABEL_OWNER_UID).map(String::as_str))
        })
        .reconcile_on(triggers)
        .graceful_shutdown_on(async move { stopped.cancelled().await })
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::debug!(%error, "reconcile trigger failed");
            }
        })
        .await;
}

/// The CR owning a namespaced child: its controller ownerReference, else (a child in another
/// namespace, which none can carry) its owner annotation.
fn owner_of_child(meta: &ObjectMeta) -> Option<ObjectRef<Guarded>> {
    let namespace = meta.namespace.as_deref()?;
    let kind = CloudControllerManager::kind(&());
    meta.owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true) && o.kind == kind)
        .map(|o| ObjectRef::new(&o.name).within(namespace))
        .or_else(|| owner_annotation(meta.annotations.as_ref()?.get(names::ANNOTATION_OWNER).map(String::as_str)))
}

/// The CRs whose leader-migration Lease is `namespace/name`.
fn migrating_under(crs: &Store<Guarded>, namespace: &str, name: &str) -> Vec<ObjectRef<Guarded>> {
    crs.state()
        .iter()
        .filter(|o| {
            o.0.as_ref().ok().is_some_and(|cr| {
                validate::migration_lease_name(&cr.spec).as_deref() == Some(name)
                    && validate::migration_lease_namespace(cr).as_deref() == Some(namespace)
            })
        })
        .map(|o| ObjectRef::from_obj(&**o))
        .collect()
}

/// The CR named by a ClusterRoleBinding's owner annotation.
fn owner_annotation(value: Option<&str>) -> Option<ObjectRef<Guarded>> {
    let (ns, name) = value?.split_once('/')?;
    Some(ObjectRef::new(name).within(ns))
}

/// The CR whose UID a manager Pod's `ccm.rs/owner-uid` label names.
fn owner_of_pod(crs: &Store<Guarded>, uid: Option<&str>) -> Option<ObjectRef<Guarded>> {
    let uid = uid?;
    crs.state().iter().find(|o| o.uid().as_deref() == Some(uid)).map(|o| ObjectRef::from_obj(&**o))
}

/// A hash of what the operator reads from a manager Pod: its deletion and, per container,
/// readiness, restarts and state.
fn pod_summary(pod: &Pod) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    pod.metadata.deletion_timestamp.is_some().hash(&mut h);
    let statuses = pod.status.as_ref().and_then(|s| s.container_statuses.as_ref());
    for c in statuses.into_iter().flatten() {
        (&c.name, c.ready, c.restart_count).hash(&mut h);
        let state = c.state.as_ref();
        state.and_then(|s| s.waiting.as_ref()).and_then(|w| w.reason.as_deref()).hash(&mut h);
        state.is_some_and(|s| s.running.is_some()).hash(&mut h);
    }
    h.finish()
}

/// The CRs in `namespace` whose cloud-config is Secret `name`.
fn referencing(crs: &Store<Guarded>, namespace: &str, name: &str) -> Vec<ObjectRef<Guarded>> {
    crs.state()
        .iter()
        .filter(|o| o.namespace().as_deref() == Some(namespace))
        .filter(|o| {
            o.0.as_ref().ok().and_then(|c| c.spec.cloud_config.as_ref()).is_some_and(|s| s.secret_ref.name == name)
        })
        .map(|o| ObjectRef::from_obj(&**o))
        .collect()
}

fn error_policy(obj: Arc<Guarded>, error: &Error, ctx: Arc<Ctx>) -> Action {
    let key = format!("{}/{}", obj.namespace().unwrap_or_default(), obj.name_any());
    let uid = obj.uid().unwrap_or_default();
    let attempt = {
        let mut retries = lock(&ctx.retries);
        let n = retries.entry(uid).or_insert(0);
        *n = n.saturating_add(1);
        *n
    };
    let delay = backoff(attempt);
    tracing::warn!(cr = %key, %error, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

/// Exponential backoff: 1s, 2s, 4s, ... capped at 2 minutes.
pub fn backoff(attempt: u32) -> Duration {
    let secs = 1u64 << attempt.saturating_sub(1).min(7);
    Duration::from_secs(secs.min(120))
}

async fn reconcile(obj: Arc<Guarded>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let started = std::time::Instant::now();
    let result = reconcile_inner(&obj, &ctx).await;
    ctx.shared.metrics.reconciled(started.elapsed());
    match &result {
        Ok(_) => {
            lock(&ctx.retries).remove(&obj.uid().unwrap_or_default());
        }
        Err(e) => ctx.shared.metrics.error(e.metric_label()),
    }
    result
}

impl Ctx {
    /// Waits until every store has listed once (immediate after that).
    async fn wait_ready(&self) {
        // A closed channel means the term is ending; the reconcile then fails on I/O.
        let _ = self.ready.clone().wait_for(|ready| *ready).await;
    }

    fn publish(&self, meta: &ObjectMeta, type_: EventType, reason: &str, note: String, action: &str) {
        let reference = ObjectReference {
            api_version: Some(CloudControllerManager::api_version(&()).into_owned()),
            kind: Some(CloudControllerManager::kind(&()).into_owned()),
            name: meta.name.clone(),
            namespace: meta.namespace.clone(),
            uid: meta.uid.clone(),
            resource_version: None,
            field_path: None,
        };
        self.shared.events.publish(names::FIELD_MANAGER, reference, type_, reason, note, action);
    }

    fn api(&self, namespace: &str) -> Api<Guarded> {
        Api::namespaced(self.shared.client.clone(), namespace)
    }

    /// Record this reconcile's transient failures; returns the streak and which causes are new.
    fn track_failures(
        &self,
        uid: &str,
        mut causes: Vec<(&'static str, String)>,
        now: &Time,
    ) -> (TransientFailures, Vec<(&'static str, String)>) {
        causes.sort();
        causes.dedup();
        let mut failures = lock(&self.failures);
        if causes.is_empty() {
            failures.remove(uid);
            return (TransientFailures::default(), Vec::new());
        }
        let entry = failures.entry(uid.to_string()).or_default();
        let new: Vec<_> = causes.iter().filter(|c| !entry.causes.contains(c)).cloned().collect();
        entry.since.get_or_insert_with(|| now.clone());
        entry.causes = causes;
        (entry.clone(), new)
    }

    /// Remember which newer CRs conflict with `key`, and reconcile those whose verdict may
    /// have changed (so a loser deploys once the winner goes, and vice versa).
    fn update_losers(&self, key: &str, me: Option<&validate::Peer>, peers: &[validate::Peer]) {
        let now_losers: BTreeSet<String> = match me {
            Some(me) => peers
                .iter()
                .filter(|p| validate::conflicts_of(p, std::slice::from_ref(me)).iter().any(|(k, _)| k == key))
                .map(validate::Peer::key)
                .collect(),
            None => BTreeSet::new(),
        };
        let before = {
            let mut losers = lock(&self.losers);
            if now_losers.is_empty() { losers.remove(key) } else { losers.insert(key.to_string(), now_losers.clone()) }
        }
        .unwrap_or_default();
        for changed in before.symmetric_difference(&now_losers) {
            if let Some((ns, name)) = changed.split_once('/') {
                let _ = self.shared.trigger.send(ObjectRef::new(name).within(ns));
            }
        }
    }

    /// Record `loser` among the losers of each of `winners`, so it is reconciled when they go.
    fn add_loser(&self, winners: &[String], loser: &str) {
        let mut losers = lock(&self.losers);
        for winner in winners {
            losers.entry(winner.clone()).or_default().insert(loser.to_string());
        }
    }

    /// The manager Pods of the CR with UID `uid`, from the cache.
    fn pods_of(&self, uid: &str) -> Vec<Arc<Pod>> {
        self.pods
            .state()
            .into_iter()
            .filter(|p| p.labels().get(names::LABEL_OWNER_UID).map(String::as_str) == Some(uid))
            .collect()
    }

    /// The manager pods of `uid`: its announcers' pods left out.
    fn manager_pods_of(&self, uid: &str) -> Vec<Arc<Pod>> {
        self.pods_of(uid).into_iter().filter(|p| names::is_manager_pod(p.labels())).collect()
    }

    /// Whether the manager's RBAC of `uid` must stay for now: its Pods still exist (a stopping
    /// manager needs its Lease rights to release the Lease) and [`TEARDOWN_GRACE`] has not run
    /// out since the wait began.
    fn rbac_must_wait(&self, uid: &str) -> bool {
        let pods = self.pods_of(uid).len();
        let mut since = lock(&self.teardown_since);
        if pods == 0 {
            since.remove(uid);
            return false;
        }
        let started = *since.entry(uid.to_string()).or_insert_with(std::time::Instant::now);
        let wait = teardown_waits(pods, started.elapsed());
        if !wait {
            since.remove(uid);
            tracing::warn!(uid, pods, grace = ?TEARDOWN_GRACE, "manager Pods still exist after the grace; deleting their RBAC anyway");
        }
        wait
    }

    /// The desired children whose names are taken by an object the CR with UID `uid` does not
    /// own. The stores show only labelled objects, so a name they lack (and the operator did not
    /// just create) is read from the server; the object itself is never written.
    async fn name_conflicts(&self, desired: &[Desired], uid: &str) -> Result<Vec<NameConflict>, String> {
        let mut out = Vec::new();
        for d in desired {
            let key = ChildKey::of(d);
            let observed = match self.children.meta(&key) {
                Some(meta) => Some(meta),
                None if self.applier.remembers(&key) => continue,
                None => self.applier.read_meta(&key).await.map_err(|e| format!("reading {key}: {e}"))?,
            };
            if !apply::may_apply_over(observed.as_ref(), uid) {
                out.push(NameConflict { key });
            }
        }
        Ok(out)
    }

    /// Delete every child of `uid` not in `keep`: the workload first, then the manager's RBAC,
    /// but only once the workload's Pods are gone (see [`Ctx::rbac_must_wait`]). Returns the
    /// deleted ones, failures, and whether RBAC deletion waits for Pods.
    async fn prune(&self, uid: &str, keep: &[ChildKey]) -> (Vec<String>, Vec<(&'static str, String)>, bool) {
        let mut pruned = Vec::new();
        let mut failures = Vec::new();
        let (workload, rbac): (Vec<ChildKey>, Vec<ChildKey>) =
            self.children.owned_by(uid).into_iter().filter(|k| !keep.contains(k)).partition(|k| is_workload(k.kind));
        self.delete_children(uid, &workload, &mut pruned, &mut failures).await;
        let waiting = !rbac.is_empty() && self.rbac_must_wait(uid);
        if !waiting {
            self.delete_children(uid, &rbac, &mut pruned, &mut failures).await;
        }
        (pruned, failures, waiting)
    }

    /// Delete `keys` (children of `uid`), recording what existed and what failed.
    async fn delete_children(
        &self,
        uid: &str,
        keys: &[ChildKey],
        pruned: &mut Vec<String>,
        failures: &mut Vec<(&'static str, String)>,
    ) {
        for key in keys {
            match self.applier.delete_owned(key, uid).await {
                Ok(existed) => {
                    self.shared.metrics.write("delete", key.kind.as_str());
                    if existed {
                        pruned.push(key.to_string());
                    }
                }
                Err(e) => failures.push((degraded::APPLY_FAILED, format!("deleting {key}: {e}"))),
            }
        }
    }
}

/// How long the manager's RBAC outlives its workload at most, waiting for its Pods to stop: the
/// Pods' termination grace (30 s) plus the garbage collector's and the kubelet's delays.
pub const TEARDOWN_GRACE: Duration = Duration::from_secs(60);

/// How soon a CR whose teardown waits for Pods is looked at again (Pod deletions also wake it).
const TEARDOWN_RECHECK: Duration = Duration::from_secs(2);

/// Whether RBAC deletion keeps waiting with `pods_left` manager Pods after `waited` (pure).
pub fn teardown_waits(pods_left: usize, waited: Duration) -> bool {
    pods_left > 0 && waited < TEARDOWN_GRACE
}

/// Whether a pod template just applied is still unseen by the workload's controller (pure): the
/// workload is not in the cache yet, or its controller has not observed its generation. Until
/// then its counts describe the old template, and the rollout counts as just started (the
/// cached CR may lag behind the `Progressing=True` written for it, and a status computed from
/// that stale copy would otherwise write `Progressing=False` over it).
pub fn awaiting_observation(workload: &Workload) -> bool {
    match workload {
        Workload::None => true,
        Workload::Deployment(d) => d.observed_generation < d.generation,
        Workload::DaemonSet(d) => d.observed_generation < d.generation,
        Workload::Embedded(_) => false,
    }
}

/// The kinds that run or guard manager Pods, deleted before the RBAC those Pods use.
fn is_workload(kind: Kind) -> bool {
    matches!(kind, Kind::Deployment | Kind::DaemonSet | Kind::PodDisruptionBudget)
}

fn has_finalizer(meta: &ObjectMeta) -> bool {
    meta.finalizers.iter().flatten().any(|f| f == names::FINALIZER)
}

async fn add_finalizer(ctx: &Ctx, namespace: &str, name: &str, meta: &ObjectMeta) -> Result<(), Error> {
    // The resourceVersion test makes this fail, rather than clobber, if the list changed.
    let rv = meta.resource_version.clone().unwrap_or_default();
    let ops = if meta.finalizers.as_ref().is_none_or(Vec::is_empty) {
        serde_json::json!([
            {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
            {"op": "add", "path": "/metadata/finalizers", "value": [names::FINALIZER]},
        ])
    } else {
        serde_json::json!([
            {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
            {"op": "add", "path": "/metadata/finalizers/-", "value": names::FINALIZER},
        ])
    };
    patch_finalizers(ctx, namespace, name, ops).await
}

async fn remove_finalizer(ctx: &Ctx, namespace: &str, name: &str, meta: &ObjectMeta) -> Result<(), Error> {
    let Some(i) = meta.finalizers.iter().flatten().position(|f| f == names::FINALIZER) else { return Ok(()) };
    let path = format!("/metadata/finalizers/{i}");
    let ops = serde_json::json!([
        {"op": "test", "path": path, "value": names::FINALIZER},
        {"op": "remove", "path": path},
    ]);
    match patch_finalizers(ctx, namespace, name, ops).await {
        Err(Error::Kube(kube::Error::Api(s))) if s.is_not_found() => Ok(()),
        other => other,
    }
}

async fn patch_finalizers(ctx: &Ctx, namespace: &str, name: &str, ops: serde_json::Value) -> Result<(), Error> {
    let patch: json_patch::Patch = serde_json::from_value(ops).map_err(|e| Error::Config(e.to_string()))?;
    ctx.api(namespace).patch(name, &PatchParams::default(), &Patch::<()>::Json(patch)).await?;
    ctx.shared.metrics.write("finalizer", "CloudControllerManager");
    Ok(())
}

async fn reconcile_inner(obj: &Guarded, ctx: &Ctx) -> Result<Action, Error> {
    ctx.wait_ready().await;
    let meta = obj.meta();
    let namespace = meta.namespace.clone().ok_or(Error::MissingField("metadata.namespace"))?;
    let name = meta.name.clone().ok_or(Error::MissingField("metadata.name"))?;
    if !ctx.shared.scope.contains(&namespace) {
        return Ok(Action::await_change());
    }
    if meta.deletion_timestamp.is_some() {
        if has_finalizer(meta) {
            // Only where the operator serves (and may delete): a field pointing elsewhere was
            // refused, and granted nothing there.
            let lease_namespace = obj
                .0
                .as_ref()
                .ok()
                .and_then(validate::foreign_lease_namespace)
                .filter(|ns| ctx.shared.scope.contains(ns) && ctx.shared.allowed.contains(ns));
            if !cleanup(ctx, meta, &namespace, &name, lease_namespace.as_deref()).await? {
                // The manager's Pods are still stopping; they keep their RBAC to release the Lease.
                return Ok(Action::requeue(TEARDOWN_RECHECK));
            }
            remove_finalizer(ctx, &namespace, &name, meta).await?;
        }
        return Ok(Action::await_change());
    }
    match &obj.0 {
        Err(_) => malformed(ctx, meta, &namespace, &name).await,
        Ok(_) if !has_finalizer(meta) => {
            // The finalizer write triggers the next reconcile, which does the work.
            add_finalizer(ctx, &namespace, &name, meta).await?;
            Ok(Action::await_change())
        }
        Ok(cr) => reconcile_cr(ctx, cr, &namespace, &name).await,
    }
}

/// Stop an embedded engine, delete the workload, and once its Pods are gone remove what
/// ownerReferences cannot (the ClusterRoleBinding, and the Role and RoleBindings of a migration
/// Lease in another namespace, `lease_namespace`). Returns false while the Pods still run: the
/// garbage collector would otherwise delete the workload and the manager's RBAC at once when the
/// finalizer goes, and a stopping manager could not release its Lease.
async fn cleanup(
    ctx: &Ctx,
    meta: &ObjectMeta,
    namespace: &str,
    name: &str,
    lease_namespace: Option<&str>,
) -> Result<bool, Error> {
    let uid = meta.uid.clone().unwrap_or_default();
    let key = format!("{namespace}/{name}");
    if ctx.shared.engines.stop(&uid).await {
        ctx.publish(
            meta,
            EventType::Normal,
            reasons::events::ENGINE_STOPPED,
            "the CloudControllerManager is being deleted".into(),
            "StopEngine",
        );
    }
    let workload: Vec<ChildKey> = ctx.children.owned_by(&uid).into_iter().filter(|k| is_workload(k.kind)).collect();
    let mut deleted = Vec::new();
    let mut failures = Vec::new();
    ctx.delete_children(&uid, &workload, &mut deleted, &mut failures).await;
    if let Some((_, message)) = failures.first() {
        ctx.publish(meta, EventType::Warning, reasons::events::CLEANUP_FAILED, message.clone(), "Cleanup");
        return Err(Error::Cleanup(message.clone()));
    }
    if !deleted.is_empty() {
        ctx.publish(
            meta,
            EventType::Normal,
            reasons::events::PRUNED,
            format!("deleted {}", deleted.join(", ")),
            "Cleanup",
        );
    }
    if ctx.rbac_must_wait(&uid) {
        return Ok(false);
    }
    let mut crbs: Vec<ChildKey> = ctx
        .children
        .owned_by(&uid)
        .into_iter()
        .filter(|k| k.kind == Kind::ClusterRoleBinding || k.namespace.as_deref().is_some_and(|ns| ns != namespace))
        .collect();
    let mut by_name = vec![ChildKey {
        kind: Kind::ClusterRoleBinding,
        namespace: None,
        name: names::cluster_role_binding_name(namespace, name),
    }];
    if let Some(lease_ns) = lease_namespace {
        let at = |kind: Kind, object: String| ChildKey { kind, namespace: Some(lease_ns.to_string()), name: object };
        by_name.extend([
            at(Kind::Role, names::migration_role_name(namespace, name)),
            at(Kind::RoleBinding, names::migration_role_name(namespace, name)),
            at(Kind::RoleBinding, names::migration_create_binding_name(namespace, name)),
        ]);
    }
    for key in by_name {
        if !crbs.contains(&key) {
            crbs.push(key);
        }
    }
    let mut deleted = Vec::new();
    // Only objects labelled as this operator's for this CR are deleted, whatever their name:
    // RBAC lets the operator delete any, so the code is what keeps others safe.
    for crb in crbs {
        match ctx.applier.delete_owned(&crb, &uid).await {
            Ok(existed) => {
                ctx.shared.metrics.write("delete", crb.kind.as_str());
                if existed {
                    deleted.push(crb.to_string());
                }
            }
            Err(e) => {
                ctx.publish(
                    meta,
                    EventType::Warning,
                    reasons::events::CLEANUP_FAILED,
                    format!("deleting {crb}: {e}"),
                    "Cleanup",
                );
                return Err(e.into());
            }
        }
    }
    lock(&ctx.failures).remove(&uid);
    lock(&ctx.timed_out).remove(&uid);
    ctx.update_losers(&key, None, &[]);
    if !deleted.is_empty() {
        ctx.publish(
            meta,
            EventType::Normal,
            reasons::events::CLEANED_UP,
            format!("deleted {}", deleted.join(", ")),
            "Cleanup",
        );
    }
    lock(&ctx.teardown_since).remove(&uid);
    lock(&ctx.rollouts).remove(&uid);
    tracing::info!(cr = %key, "cleaned up");
    Ok(true)
}

/// A CR that does not deserialize: say so in status, once.
async fn malformed(ctx: &Ctx, meta: &ObjectMeta, namespace: &str, name: &str) -> Result<Action, Error> {
    let ar = ApiResource::erase::<CloudControllerManager>(&());
    let raw: Api<DynamicObject> = Api::namespaced_with(ctx.shared.client.clone(), namespace, &ar);
    let Some(current) = raw.get_opt(name).await? else { return Ok(Action::await_change()) };
    let existing: Vec<Condition> = current
        .data
        .pointer("/status/conditions")
        .and_then(|c| serde_json::from_value(c.clone()).ok())
        .unwrap_or_default();
    let message = malformed_message(current.data.get("spec"));
    let desired = [
        DesiredCondition::new(types::CONFIG_VALID, Status::False, reasons::config_valid::MALFORMED_SPEC, &message),
        DesiredCondition::new(
            types::DEGRADED,
            Status::True,
            degraded::CONFIG_INVALID,
            format!("{}: {message}", reasons::config_valid::MALFORMED_SPEC),
        ),
    ];
    let generation = meta.generation;
    let t = now();
    let mut merged = conditions::merge_conditions(&existing, desired, generation, &t);
    let ready = conditions::compute_ready(&merged);
    merged = conditions::merge_conditions(&merged, [ready], generation, &t);
    let observed = current.data.pointer("/status/observedGeneration").and_then(serde_json::Value::as_i64);
    if merged == existing && observed == generation {
        return Ok(Action::await_change());
    }
    // Not server-side apply: a genuine API server cannot build the typed object that apply
    // needs from a spec that does not fit the schema (500 "failed to create typed live
    // object"). A merge patch of the whole list, conditional on the version read, keeps the
    // other writers' conditions and fails (to be retried) if one wrote meanwhile.
    let body = serde_json::json!({
        "metadata": {"resourceVersion": current.metadata.resource_version},
        "status": {"observedGeneration": generation, "conditions": merged},
    });
    let was_malformed = conditions::find(&existing, types::CONFIG_VALID)
        .is_some_and(|c| c.reason == reasons::config_valid::MALFORMED_SPEC);
    let params = PatchParams { field_manager: Some(names::FIELD_MANAGER.into()), ..Default::default() };
    raw.patch_status(name, &params, &Patch::Merge(body)).await?;
    ctx.shared.metrics.write("status", "CloudControllerManager");
    ctx.shared.metrics.error("malformed_spec");
    if !was_malformed {
        ctx.publish(meta, EventType::Warning, reasons::events::CONFIG_INVALID, message.clone(), "Validate");
    }
    tracing::warn!(cr = %format!("{namespace}/{name}"), error = %message, "malformed CloudControllerManager");
    Ok(Action::await_change())
}

/// The `MalformedSpec` message: the JSON path of the offending field and the type expected
/// there, never the value (the deserializer's own error quotes values, so it is not used).
fn malformed_message(spec: Option<&serde_json::Value>) -> String {
    let detail = match spec {
        None => format!("spec: {}", crds::validation::messages::REQUIRED),
        Some(spec) => match crds::validation::parse_spec(spec) {
            Err(e) => e.to_string(),
            // The spec reads; something else in the object does not.
            Ok(_) => "the object's metadata or status is not of the expected types".to_string(),
        },
    };
    format!("the object does not match the CloudControllerManager schema: {detail}")
}

/// Apply the status without force, so a value the manager wrote meanwhile (its
/// `ProviderHealthy`) is never overwritten: on a conflict, recompute from a fresh read (which
/// then leaves the manager's condition out) and apply again, forcing only fields the fresh read
/// shows as the operator's.
async fn write_status(
    ctx: &Ctx,
    namespace: &str,
    name: &str,
    computed: &status::ComputedStatus,
    recompute: impl Fn(&CloudControllerManager) -> status::ComputedStatus,
) -> Result<(), Error> {
    let api = ctx.api(namespace);
    let params = PatchParams::apply(names::FIELD_MANAGER);
    match api.patch_status(name, &params, &Patch::Apply(computed.apply_body())).await {
        Ok(_) => {
            ctx.shared.metrics.write("status", "CloudControllerManager");
            return Ok(());
        }
        Err(kube::Error::Api(s)) if s.is_conflict() => {
            tracing::debug!(cr = %format!("{namespace}/{name}"), "status conflict; recomputing from a fresh read");
        }
        Err(e) => return Err(e.into()),
    }
    let typed: Api<CloudControllerManager> = Api::namespaced(ctx.shared.client.clone(), namespace);
    let fresh = typed.get(name).await?;
    let again = recompute(&fresh);
    if again.changed {
        typed.patch_status(name, &params.force(), &Patch::Apply(again.apply_body())).await?;
        ctx.shared.metrics.write("status", "CloudControllerManager");
    }
    Ok(())
}

fn template_hash(meta: Option<&ObjectMeta>) -> Option<String> {
    meta?.annotations.as_ref()?.get(names::ANNOTATION_TEMPLATE_HASH).cloned()
}

/// One reconcile of a valid-looking CR, as a pipeline over values: dereference → validate →
/// build and apply → observe → status → events → when to look again.
async fn reconcile_cr(ctx: &Ctx, cr: &CloudControllerManager, namespace: &str, name: &str) -> Result<Action, Error> {
    let input = Input {
        cr,
        namespace,
        name,
        key: format!("{namespace}/{name}"),
        uid: cr.uid().ok_or(Error::MissingField("metadata.uid"))?,
        now: now(),
    };
    let allowed = ctx.shared.allowed.contains(namespace);
    let secret = dereference_secret(ctx, &input, allowed).await;
    let mut validation = validate_step(ctx, &input, &secret, allowed).await;
    let outcome = apply_step(ctx, &input, &validation, &secret).await;
    if !outcome.name_conflicts.is_empty() {
        validation = validate::name_conflicts(outcome.name_conflicts.iter().map(NameConflict::message));
    }
    let (workload, pods, lease) = observe(ctx, &input).await;
    let migration_lease = validate::migration_lease_namespace(cr)
        .zip(validate::migration_lease_name(&cr.spec))
        .and_then(|(ns, lease_name)| ctx.leases.get(&ObjectRef::new(&lease_name).within(&ns)));
    let rollout_started = {
        let mut rollouts = lock(&ctx.rollouts);
        if outcome.rollout_started {
            rollouts.insert(input.uid.clone());
        }
        let in_flight = rollouts.contains(&input.uid) && awaiting_observation(&workload);
        if !in_flight {
            rollouts.remove(&input.uid);
        }
        outcome.rollout_started || in_flight
    };
    let lease_obs = lease.as_deref().map(|l| dereference::observe_lease(l, &input.now));
    let announcers = cr.spec.announcer.as_ref().and_then(|_| {
        let key = ObjectRef::new(&names::announcer_name(name)).within(namespace);
        ctx.children.daemon_sets.get(&key).map(|d| dereference::observe_daemon_set(&d))
    });
    let migration_obs = migration_lease.as_deref().map(|l| dereference::observe_lease(l, &input.now));

    // Status.
    for (reason, _) in &outcome.transient {
        ctx.shared.metrics.error(reason);
    }
    let (failures, new_failures) = ctx.track_failures(&input.uid, outcome.transient.clone(), &input.now);
    let compute = |cr: &CloudControllerManager| {
        status::compute(&StatusInput {
            cr,
            validation: &validation,
            workload: &workload,
            lease: lease_obs.as_ref(),
            migration_lease: migration_obs.as_ref(),
            pods: &pods,
            announcers: announcers.as_ref(),
            rollout_started,
            switching: outcome.switching.as_deref(),
            transient: &failures,
            degraded_window: ctx.shared.timings.degraded_window,
            now: input.now.clone(),
        })
    };
    let computed = compute(cr);
    if computed.changed {
        write_status(ctx, namespace, name, &computed, compute).await?;
    }

    publish_events(ctx, &input, &computed, &outcome, &new_failures, &workload);
    if computed.changed || !outcome.applied.is_empty() || !outcome.pruned.is_empty() {
        tracing::info!(cr = %input.key, applied = outcome.applied.len(), pruned = outcome.pruned.len(), status_written = computed.changed, "reconciled");
    }
    let mut next = next_look(ctx, &input, &failures, lease.as_deref(), lease_obs.as_ref(), &workload);
    if outcome.teardown_waiting {
        next = next.min(TEARDOWN_RECHECK);
    }
    Ok(Action::requeue(next))
}

/// What every step of one reconcile knows about the CR.
struct Input<'a> {
    cr: &'a CloudControllerManager,
    namespace: &'a str,
    name: &'a str,
    /// `namespace/name`.
    key: String,
    uid: String,
    now: Time,
}

/// What the build-and-apply step did.
#[derive(Default)]
struct Outcome {
    applied: Vec<String>,
    pruned: Vec<String>,
    rollout_started: bool,
    engine_event: Option<(EventType, &'static str, String)>,
    /// Transient failures of this reconcile: `(Degraded reason, message)`.
    transient: Vec<(&'static str, String)>,
    /// The manager's RBAC waits for its Pods to stop before it is deleted.
    teardown_waiting: bool,
    /// A mode switch keeps the previous workload serving: what it waits for.
    switching: Option<String>,
    /// Children whose names are taken by objects this resource does not own: nothing was
    /// applied or pruned.
    name_conflicts: Vec<NameConflict>,
}

/// Read the referenced Secret, only in an allowed namespace (Embedded mode gets its
/// cloud-config from here too, so it never reads elsewhere either).
async fn dereference_secret(ctx: &Ctx, input: &Input<'_>, allowed: bool) -> SecretState {
    match &input.cr.spec.cloud_config {
        Some(src) if allowed => {
            ctx.secret_reader
                .read(&ctx.shared.client, &ctx.secrets, input.namespace, &src.secret_ref.name, &src.secret_ref.key)
                .await
        }
        _ => SecretState::NotReferenced,
    }
}

/// The `ConfigValid` verdict; also tells CRs that lost a conflict to this one to look again.
///
/// The provider parses the cloud-config on a blocking thread within
/// [`validate::PARSE_TIME_LIMIT`], so one resource's hostile document never delays another's
/// reconcile; a document that ran past it is refused again without being parsed again.
async fn validate_step(ctx: &Ctx, input: &Input<'_>, secret: &SecretState, allowed: bool) -> Validation {
    if !allowed {
        ctx.update_losers(&input.key, None, &[]);
        return validate::namespace_not_allowed(input.namespace, &ctx.shared.allowed);
    }
    // The operator's Roles exist, and its watches run, only where it is both allowed and serving.
    let workload_namespaces = validate::AllowedNamespaces::new(&ctx.shared.scope.within(ctx.shared.allowed.as_slice()));
    if let Some(refused) = validate::lease_namespace_not_allowed(input.cr, &workload_namespaces) {
        ctx.update_losers(&input.key, None, &[]);
        return refused;
    }
    // CRs in namespaces the operator may not serve never run, so they block no one.
    let mut peers = dereference::peers(std::slice::from_ref(&ctx.crs), &ctx.shared.registry);
    peers.retain(|p| ctx.shared.allowed.contains(&p.namespace));
    let content = match secret {
        SecretState::Found { key, data, .. } => Some(crate::hash::cloud_config(&input.uid, key, data)),
        _ => None,
    };
    let limit = validate::PARSE_TIME_LIMIT;
    let known_slow = content.is_some() && lock(&ctx.timed_out).get(&input.uid) == content.as_ref();
    let validation = if known_slow {
        validate::parse_timed_out(&input.cr.spec.provider, limit)
    } else {
        let verdict = validate::validate_bounded(
            input.cr.clone(),
            secret.clone(),
            ctx.shared.registry.clone(),
            peers.clone(),
            ctx.shared.environment,
            limit,
        )
        .await;
        match verdict {
            Some(v) => {
                lock(&ctx.timed_out).remove(&input.uid);
                v
            }
            None => {
                tracing::warn!(cr = %input.key, limit = ?limit, "checking the cloud-config ran past the time limit; refused");
                if let Some(hash) = content {
                    lock(&ctx.timed_out).insert(input.uid.clone(), hash);
                }
                validate::parse_timed_out(&input.cr.spec.provider, limit)
            }
        }
    };
    let validation =
        validate::check_policy(input.cr, validation, &ctx.shared.build.policy, &ctx.shared.build.manager_image);
    let me = validate::Peer::from_cr(input.cr, &ctx.shared.registry);
    ctx.update_losers(&input.key, me.as_ref(), &peers);
    // The winners learn of this loser now: a winner last reconciled before this CR existed
    // would otherwise not wake it when it goes.
    if let Validation::Invalid { conflicts_with, .. } = &validation {
        ctx.add_loser(conflicts_with, &input.key);
    }
    validation
}

/// Build the children of a valid CR and apply them (or run its embedded engine), pruning what
/// is no longer wanted. An invalid CR (or an unreadable Secret) leaves whatever runs as it was,
/// except that a conflicting one is stopped.
async fn apply_step(ctx: &Ctx, input: &Input<'_>, validation: &Validation, secret: &SecretState) -> Outcome {
    let cr = input.cr;
    let uid = &input.uid;
    let mut out = Outcome::default();
    if let Validation::Unknown(f) = validation {
        out.transient.push((degraded::SECRET_UNREADABLE, f.message.clone()));
    }
    // A resource that conflicts with an older one, or whose name is a core component's Lease,
    // must not keep running: whatever it runs is stopped.
    let conflicting = matches!(validation, Validation::Invalid { conflicts_with, .. } if !conflicts_with.is_empty())
        || matches!(validation, Validation::Invalid { failures, .. }
            if failures.first().is_some_and(|f| f.reason == reasons::config_valid::RESERVED_NAME));
    match (validation, cr.spec.paused) {
        (_, true) => {}
        (Validation::Valid(v), false) if cr.spec.mode == Mode::Embedded => {
            let data = match secret {
                SecretState::Found { data, .. } => Some(data.as_slice()),
                _ => None,
            };
            if ctx.shared.engines.ensure(cr, v, data).await {
                out.rollout_started = true;
                out.engine_event = Some((
                    EventType::Normal,
                    reasons::events::ENGINE_STARTED,
                    format!("started the embedded engine (Lease {})", input.key),
                ));
            }
            let (p, f, waiting) = ctx.prune(uid, &[]).await;
            out.pruned = p;
            out.transient.extend(f);
            out.teardown_waiting = waiting;
        }
        (Validation::Valid(v), false) => {
            if ctx.shared.engines.stop(uid).await {
                out.engine_event =
                    Some((EventType::Normal, reasons::events::ENGINE_STOPPED, format!("mode is now {}", cr.spec.mode)));
            }
            let desired = build::build(cr, v, &ctx.shared.build);
            // Nothing is applied or pruned while a child's name is taken by an object this
            // resource does not own, or a binding would reach beyond its own manager.
            let lease_namespace = validate::foreign_lease_namespace(cr);
            if let Some(why) = desired.iter().find_map(|d| {
                build::binding_overreach(d, input.namespace, input.name, lease_namespace.as_deref(), &ctx.shared.build)
            }) {
                tracing::error!(cr = %input.key, %why, "refusing to apply a binding beyond the resource's manager");
                out.transient.push((degraded::APPLY_FAILED, format!("refused: {why}")));
                return out;
            }
            match ctx.name_conflicts(&desired, uid).await {
                Ok(conflicts) if conflicts.is_empty() => {}
                Ok(conflicts) => {
                    out.name_conflicts = conflicts;
                    return out;
                }
                Err(e) => {
                    out.transient.push((degraded::APPLY_FAILED, e));
                    return out;
                }
            }
            let mut keep: Vec<ChildKey> = desired.iter().map(ChildKey::of).collect();
            for d in &desired {
                let child = ChildKey::of(d);
                let observed = ctx.children.meta(&child);
                match ctx.applier.apply(d, observed.as_ref()).await {
                    Ok(true) => {
                        ctx.shared.metrics.write("apply", child.kind.as_str());
                        if matches!(d, Desired::Deployment(_) | Desired::DaemonSet(_))
                            && template_hash(observed.as_ref()) != template_hash(Some(d.meta()))
                        {
                            out.rollout_started = true;
                        }
                        out.applied.push(child.to_string());
                    }
                    Ok(false) => {}
                    Err(e) => out.transient.push((degraded::APPLY_FAILED, format!("applying {child}: {e}"))),
                }
            }
            // A Deployment <-> DaemonSet switch: the old workload serves until the new one can.
            let old: Vec<ChildKey> =
                ctx.children.owned_by(uid).into_iter().filter(|k| is_workload(k.kind) && !keep.contains(k)).collect();
            if let Some(old_kind) = old.iter().map(|k| k.kind).find(|k| matches!(k, Kind::Deployment | Kind::DaemonSet))
            {
                let new = observe_workload(ctx, input).await;
                if let Switch::KeepOld(message) =
                    switch::decide(old_kind.as_str(), &new, cr.spec.deployment.host_network)
                {
                    keep.extend(old);
                    out.switching = Some(message);
                }
            }
            let (p, f, waiting) = ctx.prune(uid, &keep).await;
            out.pruned = p;
            out.transient.extend(f);
            out.teardown_waiting = waiting;
        }
        (Validation::Invalid { .. }, false) if conflicting => {
            // Two managers must never run the same controller: stop this one.
            if ctx.shared.engines.stop(uid).await {
                out.engine_event = Some((
                    EventType::Normal,
                    reasons::events::ENGINE_STOPPED,
                    format!("stopped: {}", validation.summary().map(|(r, _)| r).unwrap_or_default()),
                ));
            }
            let (p, f, waiting) = ctx.prune(uid, &[]).await;
            out.pruned = p;
            out.transient.extend(f);
            out.teardown_waiting = waiting;
        }
        // Invalid otherwise, or unreadable Secret: whatever runs keeps running as it was.
        _ => {}
    }
    out
}

/// The workload (or engine), its Pods and the Lease, from the caches.
async fn observe(ctx: &Ctx, input: &Input<'_>) -> (Workload, PodsObservation, Option<Arc<Lease>>) {
    let workload = observe_workload(ctx, input).await;
    let lease = ctx.leases.get(&ObjectRef::new(input.name).within(input.namespace));
    let pods = match input.cr.spec.mode {
        // Pods left by a previous mode are the teardown's business, not this status's.
        Mode::Embedded => PodsObservation::default(),
        Mode::Deployment | Mode::DaemonSet => {
            let pods = ctx.manager_pods_of(&input.uid);
            dereference::observe_pods(pods.iter().map(|p| &**p))
        }
    };
    (workload, pods, lease)
}

/// The workload (or engine) of the CR's current mode, from the caches.
async fn observe_workload(ctx: &Ctx, input: &Input<'_>) -> Workload {
    let (namespace, name) = (input.namespace, input.name);
    match input.cr.spec.mode {
        Mode::Embedded => match ctx.shared.engines.state(&input.uid).await {
            Some(state) => Workload::Embedded(state),
            None => Workload::None,
        },
        Mode::Deployment => ctx
            .children
            .deployments
            .get(&ObjectRef::new(&names::workload_name(name)).within(namespace))
            .map_or(Workload::None, |d| Workload::Deployment(dereference::observe_deployment(&d))),
        Mode::DaemonSet => ctx
            .children
            .daemon_sets
            .get(&ObjectRef::new(&names::workload_name(name)).within(namespace))
            .map_or(Workload::None, |d| Workload::DaemonSet(dereference::observe_daemon_set(&d))),
    }
}

/// Events: ConfigValid transitions, applies, prunes, new transient failures, engine changes.
fn publish_events(
    ctx: &Ctx,
    input: &Input<'_>,
    computed: &status::ComputedStatus,
    outcome: &Outcome,
    new_failures: &[(&'static str, String)],
    workload: &Workload,
) {
    let meta = input.cr.meta();
    let existing = input.cr.status.clone().unwrap_or_default();
    let before =
        conditions::find(&existing.conditions, types::CONFIG_VALID).map(|c| (c.status.clone(), c.reason.clone()));
    let after = conditions::find(&computed.status.conditions, types::CONFIG_VALID)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()));
    if let Some((status_after, reason_after, message)) = after
        && before.as_ref().map(|(s, r)| (s.as_str(), r.as_str()))
            != Some((status_after.as_str(), reason_after.as_str()))
    {
        if status_after == "False" {
            ctx.publish(
                meta,
                EventType::Warning,
                reasons::events::CONFIG_INVALID,
                format!("{reason_after}: {message}"),
                "Validate",
            );
        } else if status_after == "True" && before.is_some_and(|(s, _)| s == "False") {
            ctx.publish(meta, EventType::Normal, reasons::events::CONFIG_VALID, message, "Validate");
        }
    }
    if !outcome.applied.is_empty() {
        ctx.publish(
            meta,
            EventType::Normal,
            reasons::events::APPLIED,
            format!("applied {}", outcome.applied.join(", ")),
            "Apply",
        );
    }
    if !outcome.pruned.is_empty() {
        ctx.publish(
            meta,
            EventType::Normal,
            reasons::events::PRUNED,
            format!("deleted {}", outcome.pruned.join(", ")),
            "Prune",
        );
    }
    for (reason, message) in new_failures {
        let event_reason = if *reason == degraded::APPLY_FAILED { reasons::events::APPLY_FAILED } else { reason };
        ctx.publish(meta, EventType::Warning, event_reason, message.clone(), "Apply");
    }
    if let Some((type_, reason, note)) = outcome.engine_event.clone() {
        ctx.publish(meta, type_, reason, note, "Engine");
    }
    if let Workload::Embedded(EngineState::Failed(m)) = workload {
        let was_failed = conditions::find(&existing.conditions, types::DEGRADED)
            .is_some_and(|c| c.reason == degraded::ENGINE_FAILED);
        if !was_failed {
            ctx.publish(meta, EventType::Warning, reasons::events::ENGINE_FAILED, m.clone(), "Engine");
        }
    }
}

/// When to look at the CR again: the resync period, sooner while transient failures last,
/// when a fresh Lease would expire, or while an embedded engine is starting.
fn next_look(
    ctx: &Ctx,
    input: &Input<'_>,
    failures: &TransientFailures,
    lease: Option<&Lease>,
    lease_obs: Option<&status::LeaseObservation>,
    workload: &Workload,
) -> Duration {
    let timings = &ctx.shared.timings;
    let t = &input.now;
    let retry_key = format!("transient:{}", input.uid);
    let mut next = timings.requeue;
    if !failures.causes.is_empty() {
        let attempt = {
            let mut retries = lock(&ctx.retries);
            let n = retries.entry(retry_key).or_insert(0);
            *n = n.saturating_add(1);
            *n
        };
        next = next.min(backoff(attempt));
        if let Some(d) = status::requeue_for_degraded(failures, timings.degraded_window, t) {
            next = next.min(d);
        }
    } else {
        lock(&ctx.retries).remove(&retry_key);
    }
    if let Some(l) = lease
        && lease_obs.is_some_and(|o| o.fresh)
        && let Some(expiry) = dereference::lease_expiry(l, t)
    {
        next = next.min(expiry.max(timings.lease_recheck));
    }
    // Level-triggered: an engine that is not running yet is looked at again soon, whether or
    // not its state-change notification arrives.
    if let Workload::Embedded(state) = workload
        && let Some(d) = crate::embedded::recheck_after(state)
    {
        next = next.min(d);
    }
    next
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_caps() {
        assert_eq!(backoff(1), Duration::from_secs(1));
        assert_eq!(backoff(2), Duration::from_secs(2));
        assert_eq!(backoff(5), Duration::from_secs(16));
        assert_eq!(backoff(50), Duration::from_secs(120));
    }

    #[test]
    fn malformed_message_names_the_path_and_type_but_not_the_value() {
        let spec = serde_json::json!({"provider": "fake", "deployment": {"replicas": "SECRET-TOKEN"}});
        let m = malformed_message(Some(&spec));
        assert_eq!(
            m,
            "the object does not match the CloudControllerManager schema: spec.deployment.replicas: invalid type: string, expected i32"
        );
        let m = malformed_message(None);
        assert!(m.ends_with("spec: Required value"), "{m}");
        let spec = serde_json::json!({"provider": "fake", "leaderElection": {"leaseDuration": "forever"}});
        assert!(malformed_message(Some(&spec)).ends_with(
            "spec.leaderElection.leaseDuration: invalid duration; expected a Go duration such as 15s or 1m30s"
        ));
    }

    #[test]
    fn the_managers_rbac_waits_for_its_pods_but_not_beyond_the_grace() {
        assert!(!teardown_waits(0, Duration::ZERO), "no Pods: delete at once");
        use crate::status::{DaemonSetObservation, DeploymentObservation};
        let dep = |generation, observed| {
            Workload::Deployment(DeploymentObservation {
                generation,
                observed_generation: observed,
                ..Default::default()
            })
        };
        assert!(awaiting_observation(&Workload::None), "not in the cache yet");
        assert!(awaiting_observation(&dep(2, 1)), "the controller has not seen the new template");
        assert!(!awaiting_observation(&dep(2, 2)), "observed: its counts tell the rollout");
        let ds =
            Workload::DaemonSet(DaemonSetObservation { generation: 3, observed_generation: 2, ..Default::default() });
        assert!(awaiting_observation(&ds));
        assert!(!awaiting_observation(&Workload::Embedded(EngineState::Running)));
        assert!(teardown_waits(2, Duration::from_secs(5)));
        assert!(teardown_waits(1, TEARDOWN_GRACE - Duration::from_millis(1)));
        assert!(!teardown_waits(1, TEARDOWN_GRACE), "bounded");
        for kind in Kind::ALL {
            let rbac = matches!(kind, Kind::ServiceAccount | Kind::ClusterRoleBinding | Kind::RoleBinding | Kind::Role);
            assert_eq!(is_workload(kind), !rbac, "{kind}");
        }
    }

    #[test]
    fn owner_annotation_names_the_cr() {
        let r = owner_annotation(Some("kube-system/aws")).unwrap();
        assert_eq!((r.namespace.as_deref(), r.name.as_str()), (Some("kube-system"), "aws"));
        assert!(owner_annotation(Some("nonsense")).is_none());
        assert!(owner_annotation(None).is_none());
    }

    #[test]
    fn a_child_maps_to_its_owner_by_reference_or_across_namespaces_by_annotation() {
        let owned = ObjectMeta {
            namespace: Some("kube-system".into()),
            owner_references: Some(vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                kind: "CloudControllerManager".into(),
                name: "aws".into(),
                controller: Some(true),
                ..Default::default()
            }]),
            ..Default::default()
        };
        let r = owner_of_child(&owned).unwrap();
        assert_eq!((r.namespace.as_deref(), r.name.as_str()), (Some("kube-system"), "aws"));
        let foreign = ObjectMeta {
            namespace: Some("ccm-moving".into()),
            annotations: Some([(names::ANNOTATION_OWNER.to_string(), "ccm-a/aws".to_string())].into()),
            ..Default::default()
        };
        let r = owner_of_child(&foreign).unwrap();
        assert_eq!((r.namespace.as_deref(), r.name.as_str()), (Some("ccm-a"), "aws"));
        assert!(owner_of_child(&ObjectMeta { namespace: Some("x".into()), ..Default::default() }).is_none());
    }
}
