//! Embedded mode: the manager engine runs inside the operator, one per CloudControllerManager.
//!
//! Each engine elects a leader on the Lease named after the CR in its namespace (the same
//! Lease a Deployment-mode manager would use), so two operator replicas, or an old and a new
//! mode during a switch, never run the controllers at once. An engine runs the provider that
//! validation built (the factory runs once per reconcile). It is restarted only when what
//! reaches it changes: its `ManagerConfig`, or the part of the cloud-config its provider reads
//! only at start ([`RestartKey`]); an edit of any other spec field leaves it running, and any
//! other cloud-config edit (the baremetal pools) is handed, once validated, to the running
//! provider's `reload`. An engine is stopped, releasing its Lease, when the CR is deleted,
//! switches mode, or this operator stops leading.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ccm_framework::config::ManagerConfig;
use ccm_framework::engine::{Engine, EngineBuilder, INFORMER_SYNC_CHECK, LeaderLoss};
use ccm_framework::options::ControllerOptions;
use ccm_framework::provider::{CloudProvider, Reload};
use crds::CloudControllerManager;
use futures::FutureExt;
use kube::core::DeserializeGuard;
use kube::runtime::reflector::ObjectRef;
use kube::{Client, ResourceExt};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::metrics::OperatorMetrics;
use crate::status::EngineState;
use crate::validate::Validated;

/// How often a starting engine is checked for synced caches.
const READY_POLL: Duration = Duration::from_millis(200);
/// How long a stopping engine gets before it is abandoned.
const STOP_TIMEOUT: Duration = Duration::from_secs(45);
/// How often the embedded engine reports provider health on the CR.
pub const STATUS_INTERVAL: Duration = Duration::from_secs(30);
/// Why an engine could not start without a provider from validation (which always hands one
/// with a valid verdict).
const NOT_BUILT: &str = "no provider was built for this configuration";
/// How long a failed engine waits before it is started again with the same configuration.
pub const RESTART_BACKOFF: Duration = Duration::from_secs(30);
/// How often the CR of a starting engine is reconciled, whatever the triggers: the engine's
/// "running" notification is a wake-up, and a reconcile that misses it (or the Lease event)
/// must not leave `EngineStarting` until the periodic resync.
pub const STARTING_RECHECK: Duration = Duration::from_secs(2);

/// How soon the CR must be reconciled again because of its engine's state (pure): a starting
/// engine every [`STARTING_RECHECK`], a failed one when it may be restarted.
pub fn recheck_after(state: &EngineState) -> Option<Duration> {
    match state {
        EngineState::Starting => Some(STARTING_RECHECK),
        EngineState::Failed(_) => Some(RESTART_BACKOFF),
        EngineState::Running => None,
    }
}

/// What decides a restart: everything that reaches the engine. That is the `ManagerConfig` it
/// runs and the hash of the cloud-config's restart-only part (its provider's), nothing else of
/// the spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestartKey {
    /// The configuration the engine runs.
    config: ManagerConfig,
    /// The hash of the part of the cloud-config the provider reads only at start (empty without
    /// one).
    restart_hash: String,
}

impl RestartKey {
    /// The key of a valid configuration.
    pub fn of(validated: &Validated) -> Self {
        let restart_hash = validated.cloud_config.as_ref().map(|c| c.restart_hash.clone()).unwrap_or_default();
        Self { config: validated.config.clone(), restart_hash }
    }
}

/// The hash of the whole cloud-config (empty without one): a change with the same
/// [`RestartKey`] is reloaded in place.
fn config_hash(validated: &Validated) -> String {
    validated.cloud_config.as_ref().map(|c| c.hash.clone()).unwrap_or_default()
}

/// What to do with a running engine for a new configuration (pure).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// Leave it as it is.
    Keep,
    /// Hand the new cloud-config to its provider's `reload`.
    Reload,
    /// Stop it and start a new one.
    Restart,
}

/// Decide a running engine's fate: restart when the [`RestartKey`] changed or a failed engine's
/// back-off has passed (or it failed and the config changed); reload when only the part of the
/// cloud-config the provider reloads changed; keep otherwise.
pub fn plan(same_key: bool, same_config: bool, failed: bool, backoff_passed: bool, has_provider: bool) -> Plan {
    match (same_key, same_config, failed) {
        (false, _, _) => Plan::Restart,
        (true, false, false) if has_provider => Plan::Reload,
        (true, false, _) => Plan::Restart,
        (true, true, true) if backoff_passed => Plan::Restart,
        (true, true, _) => Plan::Keep,
    }
}

struct Entry {
    key: RestartKey,
    config_hash: String,
    /// The running engine's provider, for reloads; `None` when it could not be built.
    provider: Option<Arc<dyn CloudProvider>>,
    started: std::time::Instant,
    state: Arc<Mutex<EngineState>>,
    stop: CancellationToken,
    task: JoinHandle<()>,
    namespace: String,
    name: String,
}

/// Every embedded engine of this operator process.
pub struct Engines {
    client: Client,
    identity: String,
    engines: tokio::sync::Mutex<HashMap<String, Entry>>,
    notify: mpsc::UnboundedSender<ObjectRef<DeserializeGuard<CloudControllerManager>>>,
    metrics: OperatorMetrics,
    crash: CancellationToken,
}

impl std::fmt::Debug for Engines {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engines").field("identity", &self.identity).finish_non_exhaustive()
    }
}

fn set(state: &Mutex<EngineState>, s: EngineState) {
    *state.lock().unwrap_or_else(|e| e.into_inner()) = s;
}

impl Engines {
    /// Engines that use `client` and elect with `identity`. `notify` receives the CR of an
    /// engine whose state changed (to reconcile it); `crash` kills every engine without
    /// releasing its Lease, as a process crash would (tests).
    pub fn new(
        client: Client,
        identity: String,
        notify: mpsc::UnboundedSender<ObjectRef<DeserializeGuard<CloudControllerManager>>>,
        metrics: OperatorMetrics,
        crash: CancellationToken,
    ) -> Self {
        Self { client, identity, engines: tokio::sync::Mutex::new(HashMap::new()), notify, metrics, crash }
    }

    /// The identity the engines elect with.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// The state of the engine of CR `uid`, if one exists. An engine whose task ended without
    /// saying why (it panicked) counts as failed, so it is restarted rather than shown as
    /// starting or running forever.
    pub async fn state(&self, uid: &str) -> Option<EngineState> {
        let engines = self.engines.lock().await;
        engines.get(uid).map(|e| {
            let state = e.state.lock().unwrap_or_else(|p| p.into_inner()).clone();
            match state {
                EngineState::Starting | EngineState::Running if e.task.is_finished() => {
                    EngineState::Failed("the embedded engine stopped unexpectedly".into())
                }
                s => s,
            }
        })
    }

    /// Make sure the engine for `cr` runs with this configuration. Returns whether an engine
    /// was (re)started. `provider` is the one validation built from this configuration, which
    /// a (re)started engine runs; `cloud_config` is the Secret's (validated) value, handed to
    /// the running provider's `reload` when only what it reloads changed.
    pub async fn ensure(
        &self,
        cr: &CloudControllerManager,
        validated: &Validated,
        provider: Option<Arc<dyn CloudProvider>>,
        cloud_config: Option<&[u8]>,
    ) -> bool {
        let uid = cr.uid().unwrap_or_default();
        let key = RestartKey::of(validated);
        let config = config_hash(validated);
        let mut engines = self.engines.lock().await;
        if let Some(existing) = engines.get_mut(&uid) {
            let failed = existing.task.is_finished()
                || matches!(*existing.state.lock().unwrap_or_else(|p| p.into_inner()), EngineState::Failed(_));
            // A failed engine is retried, but not in a tight loop.
            let step = plan(
                existing.key == key,
                existing.config_hash == config,
                failed,
                existing.started.elapsed() >= RESTART_BACKOFF,
                existing.provider.is_some(),
            );
            match step {
                Plan::Keep => return false,
                Plan::Reload => {
                    let cr_key = format!("{}/{}", existing.namespace, existing.name);
                    let running = existing.provider.clone();
                    if let Some(outcome) = reload_bounded(running, cloud_config).await {
                        match &outcome {
                            Reload::Applied(what) => {
                                tracing::info!(cr = %cr_key, %what, "applied the cloud-config edit to the running embedded engine without a restart")
                            }
                            Reload::Unchanged => {
                                tracing::debug!(cr = %cr_key, "the cloud-config changed but nothing the provider uses did")
                            }
                            Reload::RestartNeeded(what) => {
                                tracing::info!(cr = %cr_key, %what, "the cloud-config edit needs a restart of the embedded engine")
                            }
                            Reload::Invalid(error) => {
                                tracing::warn!(cr = %cr_key, %error, "the provider refused the cloud-config edit; restarting the embedded engine")
                            }
                        }
                        if matches!(outcome, Reload::Applied(_) | Reload::Unchanged) {
                            existing.config_hash = config;
                            return false;
                        }
                    }
                }
                Plan::Restart => {}
            }
        }
        if let Some(old) = engines.remove(&uid) {
            tracing::info!(cr = %format!("{}/{}", old.namespace, old.name), "restarting the embedded engine");
            stop_entry(old).await;
        }
        let entry = self.start(cr, validated, provider, key);
        engines.insert(uid, entry);
        self.metrics.set_engines(engines.len());
        true
    }

    fn start(
        &self,
        cr: &CloudControllerManager,
        validated: &Validated,
        provider: Option<Arc<dyn CloudProvider>>,
        restart_key: RestartKey,
    ) -> Entry {
        let namespace = cr.namespace().unwrap_or_default();
        let name = cr.name_any();
        let state = Arc::new(Mutex::new(EngineState::Starting));
        let stop = CancellationToken::new();
        // The same configuration a Deployment-mode manager gets as arguments, through the
        // binary's start-up checks.
        let config = &validated.config;
        let options = config.controller_options();
        let built = match provider.clone() {
            Some(provider) => {
                self.build_engine(config, options, provider, &namespace, &name).map_err(|e| e.to_string())
            }
            None => Err(NOT_BUILT.to_string()),
        };
        let notify = self.notify.clone();
        let cr_ref = ObjectRef::new(&name).within(&namespace);
        let task_state = state.clone();
        let token = stop.clone();
        let crash = self.crash.clone();
        let key = format!("{namespace}/{name}");
        // The engine's lines carry the CR they run for.
        let span = tracing::info_span!("embedded", cr = %key);
        let task = tokio::spawn(
            async move {
                let changed = |s: EngineState| {
                    set(&task_state, s);
                    let _ = notify.send(cr_ref.clone());
                };
                let engine = match built {
                    Ok(engine) => engine,
                    Err(e) => {
                        tracing::warn!(error = %e, "the embedded engine could not be built");
                        return changed(EngineState::Failed(e.to_string()));
                    }
                };
                let running = match engine.start(token.clone()).await {
                    Ok(r) => r,
                    Err(e) => {
                        tracing::warn!(error = %e, "the embedded engine could not start");
                        return changed(EngineState::Failed(e.to_string()));
                    }
                };
                tracing::info!("embedded engine started");
                let ready = running.ready().clone();
                let mut synced = false;
                while !(running.is_finished() || token.is_cancelled() || crash.is_cancelled()) {
                    if !synced && ready.get(INFORMER_SYNC_CHECK) == Some(Ok(())) {
                        synced = true;
                        changed(EngineState::Running);
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(READY_POLL) => {}
                        _ = token.cancelled() => {}
                        _ = crash.cancelled() => {}
                    }
                }
                if crash.is_cancelled() {
                    running.abort();
                    return;
                }
                // A panic in the engine is a failure of this CR's engine, not of the operator.
                let result = AssertUnwindSafe(running.wait()).catch_unwind().await;
                if !token.is_cancelled() {
                    let message = match result {
                        Ok(Ok(())) => "the engine stopped unexpectedly".to_string(),
                        Ok(Err(e)) => e.to_string(),
                        Err(_) => "the engine panicked".to_string(),
                    };
                    tracing::warn!(error = %message, "embedded engine failed");
                    changed(EngineState::Failed(message));
                } else {
                    // The engine's own closing line (in this task's span, naming the CR) says it.
                    tracing::debug!("embedded engine stopped");
                }
            }
            .instrument(span),
        );
        let config_hash = config_hash(validated);
        Entry {
            key: restart_key,
            config_hash,
            provider,
            started: std::time::Instant::now(),
            state,
            stop,
            task,
            namespace,
            name,
        }
    }

    /// The engine for `config`, running `provider`, through the binary's start-up checks.
    fn build_engine(
        &self,
        config: &ManagerConfig,
        mut options: ControllerOptions,
        provider: Arc<dyn CloudProvider>,
        namespace: &str,
        name: &str,
    ) -> Result<Engine, ccm_framework::Error> {
        config.check()?;
        let leader_migration = config.leader_migration_config()?;
        ccm_framework::engine::startup::start_up_checks(&mut options, provider.as_ref(), false)?;
        EngineBuilder::new(self.client.clone(), provider, options)
            .leader_election(config.leader_election_config(&self.identity))
            .leader_migration(leader_migration)
            .leader_migration_namespace(config.leader_migration_namespace.clone())
            // Engines of this process may share a migration Lease: one holder identity each.
            .migration_identity(format!("{}_{namespace}_{name}", self.identity))
            .identity(self.identity.clone())
            .on_leader_loss(LeaderLoss::StandBy)
            .report_status(config.ccm_resource.clone(), STATUS_INTERVAL)
            .build()
    }

    /// Stop the engine of CR `uid` (releasing its Lease). Returns whether one ran.
    pub async fn stop(&self, uid: &str) -> bool {
        let mut engines = self.engines.lock().await;
        let entry = engines.remove(uid);
        self.metrics.set_engines(engines.len());
        drop(engines);
        match entry {
            Some(e) => {
                stop_entry(e).await;
                true
            }
            None => false,
        }
    }

    /// Stop every engine (this operator stops leading or shuts down).
    pub async fn stop_all(&self) {
        let entries: Vec<Entry> = self.engines.lock().await.drain().map(|(_, e)| e).collect();
        self.metrics.set_engines(0);
        futures::future::join_all(entries.into_iter().map(stop_entry)).await;
    }

    /// UIDs of the CRs with an engine.
    pub async fn running(&self) -> Vec<String> {
        self.engines.lock().await.keys().cloned().collect()
    }
}

/// `provider.reload` on a blocking thread within the factory's time limit; `None` when it
/// panicked or ran out of time (the engine is then restarted).
async fn reload_bounded(provider: Option<Arc<dyn CloudProvider>>, cloud_config: Option<&[u8]>) -> Option<Reload> {
    let provider = provider?;
    let bytes = cloud_config.map(<[u8]>::to_vec);
    let task = tokio::task::spawn_blocking(move || provider.reload(bytes.as_deref()));
    match tokio::time::timeout(ccm_framework::registry::FACTORY_TIME_LIMIT, task).await {
        Ok(Ok(outcome)) => Some(outcome),
        _ => None,
    }
}

async fn stop_entry(entry: Entry) {
    entry.stop.cancel();
    if tokio::time::timeout(STOP_TIMEOUT, entry.task).await.is_err() {
        tracing::warn!(cr = %format!("{}/{}", entry.namespace, entry.name), "the embedded engine did not stop in time");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The resource these tests run: `kube-system/bm`.
    fn cr(spec: serde_json::Value) -> CloudControllerManager {
        testkit::cr("kube-system", "bm", spec)
    }

    fn validated(c: &CloudControllerManager, hash: Option<&str>) -> Validated {
        Validated {
            config: crate::validate::manager_config(c, None).unwrap(),
            cloud_config: hash.map(|h| crate::validate::CloudConfigRef {
                secret: "s".into(),
                key: "cloud.conf".into(),
                extra_keys: Vec::new(),
                hash: h.into(),
                restart_hash: h.into(),
            }),
            provider_has_routes: false,
        }
    }

    #[test]
    fn options_follow_the_spec() {
        let c = cr(json!({"provider": "baremetal", "mode": "Embedded", "clusterName": "lab",
            "clusterCIDR": "10.244.0.0/16", "loadBalancerClass": "x", "configureCloudRoutes": false,
            "concurrency": {"nodeSyncs": 3, "serviceSyncs": 4, "routeSyncs": 2}, "controllers": ["*", "-route"]}));
        let o = validated(&c, None).config.controller_options();
        assert_eq!(o.cluster_name, "lab");
        assert_eq!(o.cluster_cidrs.len(), 1);
        assert!(!o.configure_cloud_routes);
        assert_eq!((o.concurrent_node_syncs, o.concurrent_service_syncs, o.concurrent_route_syncs), (3, 4, 2));
        assert_eq!(o.load_balancer_class.as_deref(), Some("x"));
        assert!(!o.controllers.is_enabled(crds::controllers::Controller::NodeRoute));
    }

    #[test]
    fn leader_election_uses_the_deployment_mode_lease() {
        let c = cr(json!({"provider": "baremetal", "mode": "Embedded",
            "leaderElection": {"leaseDuration": "20s", "renewDeadline": "15s", "retryPeriod": "3s"}}));
        let le = validated(&c, None).config.leader_election_config("op-1").unwrap();
        assert_eq!((le.namespace.as_str(), le.name.as_str(), le.identity.as_str()), ("kube-system", "bm", "op-1"));
        assert_eq!(le.lease_duration, Duration::from_secs(20));
        assert!(le.release_on_cancel);
        assert!(le.validate().is_ok());
    }

    #[test]
    fn the_embedded_engine_runs_exactly_what_a_deployment_mode_manager_would_parse() {
        // One configuration, two roads: the engine's options and Lease equal those the binary
        // builds from the pod's arguments (spec.extraArgs aside, which Embedded mode refuses).
        let c = cr(json!({"provider": "baremetal", "mode": "Embedded", "clusterName": "lab",
            "clusterCIDR": "10.244.0.0/16,fd00::/48", "loadBalancerClass": "x",
            "concurrency": {"nodeSyncs": 3, "serviceSyncs": 4, "routeSyncs": 2}, "controllers": ["*", "-service"],
            "leaderElection": {"leaseDuration": "20s", "renewDeadline": "15s", "retryPeriod": "3s"}}));
        let config = validated(&c, None).config;
        let args = std::iter::once("cloud-controller-manager".to_string()).chain(config.to_args());
        let settings = ccm_framework::program::flags::Flags::try_parse_args(args).unwrap().settings().unwrap();
        let (embedded, binary) = (config.controller_options(), settings.options);
        assert_eq!(format!("{embedded:?}"), format!("{binary:?}"));
        let le = settings.leader_election.unwrap();
        let embedded_le = config.leader_election_config(&le.identity).unwrap();
        assert_eq!(embedded_le, le);
        assert_eq!(settings.ccm_resource, config.ccm_resource);
    }

    #[test]
    fn spec_shadow_runs_every_mode_in_shadow_mode_on_the_resources_own_lease() {
        let c = cr(json!({"provider": "baremetal", "mode": "Embedded", "shadow": true}));
        let config = validated(&c, None).config;
        assert!(config.shadow);
        assert!(config.controller_options().shadow, "the embedded engine compares");
        assert!(config.to_args().contains(&"--shadow=true".to_string()), "a Deployment's manager compares");
        assert_eq!(config.leader_election_config("op-1").unwrap().name, "bm", "the resource's own Lease");
        let c =
            cr(json!({"provider": "baremetal", "shadow": true, "leaderElection": {"migration": {"enabled": true}}}));
        let refused = crate::validate::manager_config(&c, None).err().map(|e| format!("{e:?}")).unwrap_or_default();
        assert!(refused.contains("spec.shadow"), "{refused}");
    }

    #[test]
    fn a_starting_engine_is_rechecked_soon_without_any_notification() {
        // Regression: a CR stayed EngineStarting until the 5-minute resync when the engine's
        // "running" wake-up did not lead to a reconcile.
        assert_eq!(recheck_after(&EngineState::Starting), Some(STARTING_RECHECK));
        assert!(STARTING_RECHECK <= Duration::from_secs(5));
        assert_eq!(recheck_after(&EngineState::Failed("x".into())), Some(RESTART_BACKOFF));
        assert_eq!(recheck_after(&EngineState::Running), None);
    }

    #[test]
    fn a_running_engine_is_reloaded_only_for_edits_that_need_no_restart() {
        // (same restart key, same config, failed, back-off passed, has provider)
        assert_eq!(plan(true, true, false, false, true), Plan::Keep);
        assert_eq!(plan(true, false, false, false, true), Plan::Reload, "a pool edit reaches the running engine");
        assert_eq!(plan(false, false, false, false, true), Plan::Restart, "a restart-only edit restarts it");
        assert_eq!(plan(true, false, false, false, false), Plan::Restart, "no provider to reload: start one");
        assert_eq!(plan(true, false, true, false, true), Plan::Restart, "a failed engine starts with the new config");
        assert_eq!(plan(true, true, true, false, true), Plan::Keep, "a failed engine waits for its back-off");
        assert_eq!(plan(true, true, true, true, true), Plan::Restart);
    }

    #[test]
    fn the_restart_key_ignores_what_the_provider_reloads() {
        let c = cr(json!({"provider": "baremetal", "mode": "Embedded"}));
        let a = validated(&c, Some("1"));
        let mut pools_edited = a.clone();
        pools_edited.cloud_config.as_mut().unwrap().hash = "2".into();
        assert_eq!(RestartKey::of(&a), RestartKey::of(&pools_edited));
        assert_ne!(config_hash(&a), config_hash(&pools_edited));
    }

    #[test]
    fn the_restart_key_changes_with_the_manager_config_or_cloud_config_only() {
        let c = cr(json!({"provider": "baremetal", "mode": "Embedded"}));
        let a = RestartKey::of(&validated(&c, Some("1")));
        assert_eq!(a, RestartKey::of(&validated(&c, Some("1"))));
        assert_ne!(a, RestartKey::of(&validated(&c, Some("2"))));
        let mut c2 = c.clone();
        c2.spec.cluster_name = "other".into();
        assert_ne!(a, RestartKey::of(&validated(&c2, Some("1"))));
        // Status changes do not restart it.
        let mut c3 = c.clone();
        c3.status = Some(Default::default());
        assert_eq!(a, RestartKey::of(&validated(&c3, Some("1"))));
    }

    #[test]
    fn an_edit_that_leaves_the_manager_config_alone_keeps_the_engine_and_one_that_changes_it_restarts() {
        let c = cr(json!({"provider": "baremetal", "mode": "Embedded"}));
        let running = RestartKey::of(&validated(&c, Some("1")));
        let decide = |edited: &CloudControllerManager| {
            let v = validated(edited, Some("1"));
            plan(RestartKey::of(&v) == running, config_hash(&v) == "1", false, false, true)
        };
        // What never reaches the engine: a label, the pod's settings.
        let mut labelled = c.clone();
        labelled.metadata.labels = Some([("team".to_string(), "net".to_string())].into());
        let mut pod_settings = c.clone();
        pod_settings.spec.deployment.replicas = 3;
        pod_settings.spec.deployment.host_network = false;
        pod_settings.spec.deployment.image = Some("example.test/ccm:v2".into());
        for edited in [&labelled, &pod_settings] {
            assert_eq!(validated(edited, Some("1")).config, validated(&c, Some("1")).config);
            assert_eq!(decide(edited), Plan::Keep);
        }
        // What the engine runs: a restart.
        let mut renamed = c.clone();
        renamed.spec.cluster_name = "lab".into();
        let mut fewer = c.clone();
        fewer.spec.controllers = vec!["*".into(), "-route".into()];
        let mut slower = c.clone();
        slower.spec.concurrency.service_syncs = 7;
        for edited in [&renamed, &fewer, &slower] {
            assert_ne!(validated(edited, Some("1")).config, validated(&c, Some("1")).config);
            assert_eq!(decide(edited), Plan::Restart);
        }
    }
}
