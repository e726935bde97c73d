//! The engine: shared caches, leader election, and the controllers, in one embeddable value.
//!
//! Given a client, a provider and [`ControllerOptions`], an [`Engine`] watches Nodes and
//! Services once for all controllers, serves health and metrics, and, while this replica holds
//! the leader Lease (or always, without leader election), initializes the provider and runs
//! every enabled controller as a task. The binary (the `program` module, above this one) and
//! the operator's Embedded mode both build one with [`EngineBuilder`].
//!
//! Leadership: caches warm while standing by, so a new leader starts on synced caches. When a
//! term ends, every controller must stop within a grace period before anything else happens.
//! Losing the Lease then either returns [`Error::LeadershipLost`] (upstream's behaviour: the
//! binary exits with status 1, see [`LeaderLoss::Exit`]) or stands by for the next term in the
//! same process ([`LeaderLoss::StandBy`], the default, for the embedded mode). A graceful stop
//! releases the Lease after the controllers stopped, so a standby takes over at once.
//!
//! Leader migration (upstream M7, [`crate::leader_migration`]): while holding the main Lease,
//! the engine starts the controllers the configuration does not name, then takes the migration
//! Lease (same identity and timings; same namespace unless
//! [`EngineBuilder::leader_migration_namespace`] says otherwise) and starts the migrated ones. Controllers the
//! configuration gives to another component never start. Losing either Lease ends the term as
//! losing the main one does; a graceful stop releases both.

pub mod instrument;
pub mod startup;
pub mod testing;

use std::collections::BTreeSet;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, ObjectReference, Service};
use kube::runtime::events::EventType;
use kube::runtime::watcher;
use kube::{Api, Client};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::cache::{Cache, run_watch};
use crate::controller::{Context, Controller};
use crate::error::Error;
use crate::events::EventSink;
use crate::health::HealthRegistry;
use crate::http::{HttpConfig, HttpState, Listener};
use crate::leader::{self, LeaderElectionConfig, LeaderElector, LeaderStatus, TermEnd};
use crate::leader_migration::{LeaderMigrationConfiguration, Placement};
use crate::metrics::Metrics;
use crate::options::ControllerOptions;
use crate::provider::{CloudProvider, InitContext};
use crate::shadow::{Shadow, ShadowProvider};
use crate::status::{StatusReporter, StatusTarget};

/// Nodes per page of the Node cache's (re)list: a kubelet's Node is about 12 KB of JSON, and
/// pages of kube's default 500 held the manager's peak RSS 21 MiB higher at 5,000 such Nodes
/// (docs/benchmarks.md); smaller pages gained nothing more.
const NODE_LIST_PAGE: u32 = 100;

/// The manager name used in metrics and events, as upstream.
pub const MANAGER_NAME: &str = "cloud-controller-manager";

/// How long controllers get to stop after a leadership term ends.
pub const DEFAULT_STOP_GRACE: Duration = Duration::from_secs(30);

/// The `/readyz` check that passes once the shared caches have synced.
pub const INFORMER_SYNC_CHECK: &str = "informer-sync";

/// The `/healthz` check of leader election (upstream's name).
pub const LEADER_ELECTION_CHECK: &str = "leaderElection";

/// The `/healthz` check of the leader-migration Lease (with `--enable-leader-migration`).
pub const LEADER_MIGRATION_CHECK: &str = "leaderMigration";

/// Builds a fresh controller for each leadership term.
pub type ControllerFactory = Arc<dyn Fn() -> Box<dyn Controller> + Send + Sync>;

/// What to do when this replica loses the Lease.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LeaderLoss {
    /// Stop the controllers and campaign again, in process.
    #[default]
    StandBy,
    /// Stop the controllers and return [`Error::LeadershipLost`] (upstream exits the process).
    Exit,
}

/// Why a controller is not started, or `None` to start it (S24, R1).
pub fn skip_reason(name: &str, provider: &dyn CloudProvider, options: &ControllerOptions) -> Option<String> {
    use crds::controllers::Controller;
    match Controller::from_name(name)? {
        Controller::CloudNode | Controller::CloudNodeLifecycle if provider.instances().is_none() => {
            Some(format!("cloud provider {:?} does not support instances", provider.name()))
        }
        Controller::ServiceLb if provider.load_balancer().is_none() => {
            Some(format!("cloud provider {:?} does not support load balancers", provider.name()))
        }
        // An empty or invalid --cluster-cidr is the route controller's to report, on its own
        // health check, so the manager stays up; upstream exits the whole manager here (R2).
        Controller::NodeRoute if !startup::routes_would_run(options, provider) => {
            Some(if options.configure_cloud_routes {
                format!("cloud provider {:?} does not support routes", provider.name())
            } else {
                "--configure-cloud-routes is false".into()
            })
        }
        _ => None,
    }
}

/// Upstream's legacy name for `running_managed_controllers` (`cloud-node`, `service`, ...).
pub fn metric_name(canonical: &str) -> String {
    crds::controllers::Controller::from_name(canonical).map_or_else(|| canonical.to_string(), |c| c.alias().to_string())
}

/// Labels of `running_managed_controllers`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ControllerLabels {
    name: String,
    manager: String,
}

/// Labels of `leader_election_master_status`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LeaseLabels {
    name: String,
}

#[derive(Clone)]
struct EngineMetrics {
    running: Family<ControllerLabels, Gauge>,
    leader: Family<LeaseLabels, Gauge>,
}

impl EngineMetrics {
    fn new(metrics: &Metrics) -> Self {
        Self {
            running: metrics.get_or_register(
                "running_managed_controllers",
                "Indicates where instances of a controller are currently running",
                Family::default,
            ),
            leader: metrics.get_or_register(
                "leader_election_master_status",
                "Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates master. 'name' is the string used to identify the lease.",
                Family::default,
            ),
        }
    }

    fn controller(&self, name: &str) -> Gauge {
        self.running.get_or_create(&ControllerLabels { name: metric_name(name), manager: MANAGER_NAME.into() }).clone()
    }
}

/// Configures an [`Engine`].
pub struct EngineBuilder {
    client: Client,
    event_client: Option<Client>,
    provider: Arc<dyn CloudProvider>,
    options: ControllerOptions,
    leader_election: Option<LeaderElectionConfig>,
    leader_migration: Option<LeaderMigrationConfiguration>,
    migration_namespace: Option<String>,
    migration_identity: Option<String>,
    identity: Option<String>,
    http: Option<HttpConfig>,
    extra: Vec<(String, ControllerFactory)>,
    builtin: bool,
    metrics: Option<Arc<Metrics>>,
    health: Option<HealthRegistry>,
    on_leader_loss: LeaderLoss,
    status: Option<(StatusTarget, Duration)>,
    stop_grace: Duration,
    instrument: bool,
}

impl std::fmt::Debug for EngineBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineBuilder")
            .field("provider", &self.provider.name())
            .field("options", &self.options)
            .field("leader_election", &self.leader_election)
            .field("http", &self.http)
            .finish_non_exhaustive()
    }
}

impl EngineBuilder {
    /// An engine for `provider` with these options: no leader election, no HTTP endpoint, the
    /// built-in controllers that `options.controllers` enables.
    ///
    /// `client` is used for everything but events: give it the client-side rate limit (see
    /// [`crate::client`]).
    pub fn new(client: Client, provider: Arc<dyn CloudProvider>, options: ControllerOptions) -> Self {
        Self {
            client,
            event_client: None,
            provider,
            options,
            leader_election: None,
            leader_migration: None,
            migration_namespace: None,
            migration_identity: None,
            identity: None,
            http: None,
            extra: Vec::new(),
            builtin: true,
            metrics: None,
            health: None,
            on_leader_loss: LeaderLoss::default(),
            status: None,
            stop_grace: DEFAULT_STOP_GRACE,
            instrument: true,
        }
    }

    /// Elect a leader on this Lease; controllers run only while leading.
    pub fn leader_election(mut self, config: Option<LeaderElectionConfig>) -> Self {
        self.leader_election = config;
        self
    }

    /// Leader migration: run the controllers `config` migrates only while also holding its
    /// Lease (needs [`Self::leader_election`]).
    pub fn leader_migration(mut self, config: Option<LeaderMigrationConfiguration>) -> Self {
        self.leader_migration = config;
        self
    }

    /// The migration Lease's namespace (default: the main Lease's, as upstream), so managers in
    /// different namespaces can share it.
    pub fn leader_migration_namespace(mut self, namespace: Option<String>) -> Self {
        self.migration_namespace = namespace;
        self
    }

    /// The holder identity on the migration Lease (default: the main Lease's, as upstream). A
    /// process running several engines (the operator's Embedded mode) gives each its own, so
    /// two of its engines sharing a migration Lease do not both take it as theirs.
    pub fn migration_identity(mut self, identity: impl Into<String>) -> Self {
        self.migration_identity = Some(identity.into());
        self
    }

    /// This replica's identity (events, the Lease holder, the resource's `status.leader`);
    /// default: the leader-election identity, else `<hostname>_<random>`.
    pub fn identity(mut self, identity: impl Into<String>) -> Self {
        self.identity = Some(identity.into());
        self
    }

    /// Serve `/healthz`, `/livez`, `/readyz` and `/metrics`.
    pub fn http(mut self, config: Option<HttpConfig>) -> Self {
        self.http = config;
        self
    }

    /// Also run a vendor controller, built afresh by `factory` for each leadership term. It
    /// always runs while leading (`--controllers` selects only the built-in ones).
    pub fn controller(mut self, name: impl Into<String>, factory: ControllerFactory) -> Self {
        self.extra.push((name.into(), factory));
        self
    }

    /// Run no built-in controller, only those added with [`Self::controller`].
    pub fn without_builtin_controllers(mut self) -> Self {
        self.builtin = false;
        self
    }

    /// The client events are written with (default: the main client). Give it no rate limit:
    /// the event sink has its own budget.
    pub fn event_client(mut self, client: Client) -> Self {
        self.event_client = Some(client);
        self
    }

    /// Register metrics here (default: a new registry).
    pub fn metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Report `/healthz` checks here (default: a new registry).
    pub fn health(mut self, health: HealthRegistry) -> Self {
        self.health = Some(health);
        self
    }

    /// What losing the Lease does (default: stand by).
    pub fn on_leader_loss(mut self, policy: LeaderLoss) -> Self {
        self.on_leader_loss = policy;
        self
    }

    /// While leading, report the provider's health on this CloudControllerManager every
    /// `interval` (`--ccm-resource`).
    pub fn report_status(mut self, target: Option<StatusTarget>, interval: Duration) -> Self {
        self.status = target.map(|t| (t, interval));
        self
    }

    /// How long controllers get to stop when a term ends (default 30s).
    pub fn stop_grace(mut self, grace: Duration) -> Self {
        self.stop_grace = grace;
        self
    }

    /// Count and time cloud calls in `/metrics` (default on).
    pub fn instrument_provider(mut self, on: bool) -> Self {
        self.instrument = on;
        self
    }

    /// Check the settings and build the engine.
    pub fn build(self) -> Result<Engine, Error> {
        if let Some(le) = &self.leader_election {
            le.validate().map_err(|message| Error::InvalidFlag { flag: "--leader-elect", message })?;
        }
        if let Some(m) = &self.leader_migration {
            let Some(le) = &self.leader_election else {
                return Err(Error::InvalidFlag {
                    flag: "--enable-leader-migration",
                    message: "leader migration needs leader election; set --leader-elect=true or turn migration off"
                        .into(),
                });
            };
            m.validate()
                .map_err(|e| Error::InvalidFlag { flag: "--leader-migration-config", message: e.to_string() })?;
            let namespace = self.migration_namespace.as_deref().unwrap_or(&le.namespace);
            if m.leader_name == le.name && namespace == le.namespace {
                return Err(Error::InvalidFlag {
                    flag: "--leader-migration-config",
                    message: "leaderName must differ from the main Lease's name".into(),
                });
            }
        }
        let metrics = self.metrics.unwrap_or_else(|| Arc::new(Metrics::new()));
        // Shadow mode: only reads reach the provider (inside the instrumentation, so refused
        // calls are counted there too), and the controllers compare into one record per engine.
        let shadow = self.options.shadow.then(Shadow::new);
        let provider: Arc<dyn CloudProvider> = match shadow {
            Some(_) => Arc::new(ShadowProvider::new(self.provider, &metrics)),
            None => self.provider,
        };
        let provider: Arc<dyn CloudProvider> = if self.instrument {
            Arc::new(instrument::InstrumentedProvider::new(provider, &metrics))
        } else {
            provider
        };
        let identity = self
            .identity
            .or_else(|| self.leader_election.as_ref().map(|le| le.identity.clone()))
            .unwrap_or_else(leader::default_identity);
        let leader_election = self.leader_election.map(|le| LeaderElectionConfig { identity: identity.clone(), ..le });
        let mut controllers = Vec::new();
        if self.builtin {
            for controller in self.options.controllers.enabled() {
                let factory: ControllerFactory = Arc::new(move || crate::controllers::builtin(controller));
                controllers.push((controller.name().to_string(), factory));
            }
        }
        controllers.extend(self.extra);
        Ok(Engine {
            event_client: self.event_client.unwrap_or_else(|| self.client.clone()),
            client: self.client,
            provider,
            options: Arc::new(self.options),
            shadow,
            leader_election,
            leader_migration: self.leader_migration,
            migration_namespace: self.migration_namespace,
            migration_identity: self.migration_identity,
            identity,
            http: self.http,
            controllers,
            engine_metrics: EngineMetrics::new(&metrics),
            metrics,
            health: self.health.unwrap_or_default(),
            ready: HealthRegistry::new(),
            on_leader_loss: self.on_leader_loss,
            status: self.status,
            stop_grace: self.stop_grace,
            leading: watch::channel(false).0,
        })
    }
}

/// A configured engine; [`Engine::start`] or [`Engine::run`] it.
pub struct Engine {
    client: Client,
    event_client: Client,
    provider: Arc<dyn CloudProvider>,
    options: Arc<ControllerOptions>,
    /// The shadow record, in shadow mode.
    shadow: Option<Shadow>,
    leader_election: Option<LeaderElectionConfig>,
    leader_migration: Option<LeaderMigrationConfiguration>,
    migration_namespace: Option<String>,
    migration_identity: Option<String>,
    identity: String,
    http: Option<HttpConfig>,
    controllers: Vec<(String, ControllerFactory)>,
    metrics: Arc<Metrics>,
    engine_metrics: EngineMetrics,
    health: HealthRegistry,
    ready: HealthRegistry,
    on_leader_loss: LeaderLoss,
    status: Option<(StatusTarget, Duration)>,
    stop_grace: Duration,
    leading: watch::Sender<bool>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("provider", &self.provider.name())
            .field("identity", &self.identity)
            .field("controllers", &self.controllers.iter().map(|(n, _)| n).collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

/// A started engine.
pub struct RunningEngine {
    shutdown: CancellationToken,
    task: JoinHandle<Result<(), Error>>,
    local_addr: Option<SocketAddr>,
    health: HealthRegistry,
    ready: HealthRegistry,
    metrics: Arc<Metrics>,
    leading: watch::Receiver<bool>,
    leader: Option<watch::Receiver<LeaderStatus>>,
    migration: Option<watch::Receiver<LeaderStatus>>,
    identity: String,
}

impl std::fmt::Debug for RunningEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunningEngine").field("identity", &self.identity).field("local_addr", &self.local_addr).finish()
    }
}

impl RunningEngine {
    /// The HTTP endpoint's bound address, if serving.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.local_addr
    }

    /// This replica's identity.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// `/healthz` checks.
    pub fn health(&self) -> &HealthRegistry {
        &self.health
    }

    /// `/readyz` checks.
    pub fn ready(&self) -> &HealthRegistry {
        &self.ready
    }

    /// The metrics registry.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Whether controllers are running (this replica leads, or there is no election).
    pub fn is_leading(&self) -> bool {
        *self.leading.borrow()
    }

    /// Follow [`Self::is_leading`].
    pub fn leading(&self) -> watch::Receiver<bool> {
        self.leading.clone()
    }

    /// The leader-election status, when electing.
    pub fn leader_status(&self) -> Option<LeaderStatus> {
        self.leader.as_ref().map(|r| r.borrow().clone())
    }

    /// The leader-migration Lease's status, with leader migration.
    pub fn migration_status(&self) -> Option<LeaderStatus> {
        self.migration.as_ref().map(|r| r.borrow().clone())
    }

    /// Wait until [`Self::is_leading`] equals `leading`.
    pub async fn wait_leading(&self, leading: bool) {
        let mut rx = self.leading.clone();
        let _ = rx.wait_for(|l| *l == leading).await;
    }

    /// The token that stops the engine.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    /// Whether the engine has finished.
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// Stop gracefully (controllers stop, the Lease is released) and wait.
    pub async fn stop(self) -> Result<(), Error> {
        self.shutdown.cancel();
        self.wait().await
    }

    /// Wait for the engine to finish on its own (shutdown token, or an error).
    pub async fn wait(self) -> Result<(), Error> {
        match self.task.await {
            Ok(result) => result,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => Ok(()),
        }
    }

    /// Kill the engine without any cleanup, as a crash would (tests of Lease expiry).
    pub fn abort(self) {
        self.task.abort();
        // The HTTP server and background tasks follow the token; the Lease is not released.
        self.shutdown.cancel();
    }
}

impl Engine {
    /// The identity this engine uses.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// `/healthz` checks.
    pub fn health(&self) -> &HealthRegistry {
        &self.health
    }

    /// The metrics registry.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Run until `shutdown` fires or an error ends it.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), Error> {
        self.start(shutdown).await?.wait().await
    }

    /// Bind the HTTP endpoint and start in the background.
    pub async fn start(self, shutdown: CancellationToken) -> Result<RunningEngine, Error> {
        let listener = match &self.http {
            Some(config) => Some(Listener::bind(config).await?),
            None => None,
        };
        let local_addr = listener.as_ref().map(Listener::local_addr);
        if let Some(listener) = listener {
            let capabilities = crate::capabilities::to_json(&self.provider.capabilities());
            let state = HttpState {
                health: self.health.clone(),
                ready: self.ready.clone(),
                metrics: self.metrics.clone(),
                capabilities: Some(capabilities.into()),
            };
            tokio::spawn(listener.serve(state, shutdown.clone()));
        }
        let elector = self.leader_election.clone().map(|c| LeaderElector::new(self.client.clone(), c));
        let migration = match (&self.leader_election, &self.leader_migration) {
            (Some(le), Some(m)) => Some(LeaderElector::new(
                self.client.clone(),
                LeaderElectionConfig {
                    namespace: self.migration_namespace.clone().unwrap_or_else(|| le.namespace.clone()),
                    name: m.leader_name.clone(),
                    identity: self.migration_identity.clone().unwrap_or_else(|| le.identity.clone()),
                    ..le.clone()
                },
            )),
            _ => None,
        };
        let running = RunningEngine {
            shutdown: shutdown.clone(),
            local_addr,
            health: self.health.clone(),
            ready: self.ready.clone(),
            metrics: self.metrics.clone(),
            leading: self.leading.subscribe(),
            leader: elector.as_ref().map(LeaderElector::subscribe),
            migration: migration.as_ref().map(LeaderElector::subscribe),
            identity: self.identity.clone(),
            task: tokio::spawn(self.main_loop(elector, migration, shutdown).in_current_span()),
        };
        Ok(running)
    }

    /// The controllers of each Lease: (main, migrated). Controllers another component owns are
    /// left out, logged once here.
    #[allow(clippy::type_complexity)]
    fn partition(&self) -> (Vec<(String, ControllerFactory)>, Vec<(String, ControllerFactory)>) {
        let Some(m) = &self.leader_migration else { return (self.controllers.clone(), Vec::new()) };
        let (mut main, mut migrated) = (Vec::new(), Vec::new());
        for (name, factory) in &self.controllers {
            match m.placement(name) {
                Placement::Main => main.push((name.clone(), factory.clone())),
                Placement::Migrated => migrated.push((name.clone(), factory.clone())),
                Placement::OtherComponent { component } => tracing::info!(
                    controller = %name,
                    %component,
                    lease = %m.leader_name,
                    "not starting controller: the leader-migration configuration gives it to another component"
                ),
            }
        }
        let names: Vec<&str> = self.controllers.iter().map(|(n, _)| n.as_str()).collect();
        let unmatched = m.unmatched(&names);
        if !unmatched.is_empty() {
            tracing::info!(entries = ?unmatched, "leader-migration entries that name no controller of this manager (another component's, or not enabled)");
        }
        tracing::info!(
            lease = %m.leader_name,
            main = ?main.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
            migrated = ?migrated.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
            "leader migration enabled"
        );
        (main, migrated)
    }

    async fn main_loop(
        self,
        mut elector: Option<LeaderElector>,
        mut migration: Option<LeaderElector>,
        shutdown: CancellationToken,
    ) -> Result<(), Error> {
        let background = shutdown.child_token();
        tracing::info!(provider = self.provider.name(), identity = %self.identity, "starting cloud-controller-manager engine");
        let (nodes, node_writer) = Cache::<Node>::new();
        let (services, service_writer) = Cache::<Service>::new();
        tokio::spawn(run_watch(
            Api::<Node>::all(self.client.clone()),
            watcher::Config::default().page_size(NODE_LIST_PAGE),
            node_writer.trimmed(crate::cache::trim_node),
            background.clone(),
        ));
        tokio::spawn(run_watch(
            Api::<Service>::all(self.client.clone()),
            watcher::Config::default(),
            service_writer.trimmed(crate::cache::trim_service),
            background.clone(),
        ));
        let synced =
            self.ready.handle_with(INFORMER_SYNC_CHECK, Err("the Node and Service caches have not synced yet".into()));
        {
            let (nodes, services, token) = (nodes.clone(), services.clone(), background.clone());
            tokio::spawn(async move {
                tokio::select! {
                    _ = token.cancelled() => {}
                    ok = async { nodes.wait_until_ready().await && services.wait_until_ready().await } => {
                        if ok {
                            tracing::info!("caches synced");
                            synced.set_healthy();
                        }
                    }
                }
            });
        }
        let events = EventSink::spawn_observed(
            self.event_client.clone(),
            Some(self.identity.clone()),
            &self.metrics,
            background.clone(),
        );
        if let Some(e) = &elector {
            self.spawn_leader_monitor(LEADER_ELECTION_CHECK, e.subscribe(), e.config().clone(), background.clone());
        }
        if let Some(e) = &migration {
            self.spawn_leader_monitor(LEADER_MIGRATION_CHECK, e.subscribe(), e.config().clone(), background.clone());
        }
        let (main_controllers, migrated_controllers) = self.partition();
        let running = Arc::new(Mutex::new(BTreeSet::<String>::new()));
        // What became of the Lease, for the closing line.
        let mut lease = "not used (--leader-elect=false)".to_string();
        let result = loop {
            if let Some(e) = elector.as_mut() {
                if !e.acquire(&shutdown).await {
                    break Ok(());
                }
                publish_became_leader(&events, e.config());
            }
            let term = shutdown.child_token();
            let ctx = Context {
                client: self.client.clone(),
                provider: self.provider.clone(),
                options: self.options.clone(),
                shadow: self.shadow.clone(),
                nodes: nodes.clone(),
                services: services.clone(),
                events: events.clone(),
                orphans: crate::orphans::OrphanRecord::new(),
                metrics: self.metrics.clone(),
                shutdown: term.clone(),
            };
            self.leading.send_replace(true);
            let migration_lost = CancellationToken::new();
            let second = migration.take().map(|elector| SecondLease {
                elector,
                controllers: migrated_controllers.clone(),
                lost: migration_lost.clone(),
            });
            let term_task = tokio::spawn(self.term(ctx, main_controllers.clone(), second, running.clone()));
            let end = match elector.as_mut() {
                Some(e) => tokio::select! {
                    end = e.hold(&shutdown) => end,
                    _ = migration_lost.cancelled() => TermEnd::Lost,
                },
                None => {
                    shutdown.cancelled().await;
                    TermEnd::Stopped
                }
            };
            term.cancel();
            let stopped = tokio::time::timeout(self.stop_grace, term_task).await;
            self.leading.send_replace(false);
            let mut stopped = stopped;
            if let Ok(Ok(returned)) = &mut stopped {
                migration = returned.take();
            }
            if stopped.is_err() {
                let names: Vec<String> = running.lock().unwrap_or_else(|e| e.into_inner()).iter().cloned().collect();
                tracing::error!(controllers = ?names, grace = ?self.stop_grace, "controllers did not stop; keeping the Lease unreleased");
                lease = "left to expire (controllers did not stop)".to_string();
                break Err(Error::ControllersDidNotStop { names, grace: self.stop_grace });
            }
            match end {
                TermEnd::Stopped => {
                    if let Some(e) = elector.as_mut() {
                        lease = if !e.config().release_on_cancel {
                            "kept until it expires (--leader-elect-release-on-shutdown=false)".to_string()
                        } else {
                            // The migration Lease first: its controllers already stopped.
                            if let Some(m) = migration.as_mut() {
                                let released = m.release().await;
                                tracing::debug!(lease = %m.status().lease, %released, "leader-migration lease");
                            }
                            e.release().await.to_string()
                        };
                    }
                    break Ok(());
                }
                TermEnd::Lost => match self.on_leader_loss {
                    LeaderLoss::Exit => {
                        lease = "lost".to_string();
                        break Err(Error::LeadershipLost);
                    }
                    LeaderLoss::StandBy => {
                        // Not renewed while standing by: hand the migration Lease on now.
                        if let Some(m) = migration.as_mut() {
                            m.release().await;
                        }
                        tracing::info!("controllers stopped after losing the lease; standing by")
                    }
                },
            }
        };
        background.cancel();
        // Pending events get a short grace to be written (counted as dropped if not).
        // The one INFO line of a stop: the controllers' and the Lease's own lines are at debug.
        match events.closed().await {
            Some(0) => tracing::info!(%lease, "cloud-controller-manager engine stopped"),
            Some(n) => tracing::info!(%lease, unwritten_events = n, "cloud-controller-manager engine stopped"),
            None => tracing::info!(%lease, unwritten_events = "unknown", "cloud-controller-manager engine stopped"),
        }
        result
    }

    fn spawn_leader_monitor(
        &self,
        check: &str,
        mut rx: watch::Receiver<LeaderStatus>,
        config: LeaderElectionConfig,
        stop: CancellationToken,
    ) {
        let check = self.health.handle(check);
        let gauge = self.engine_metrics.leader.get_or_create(&LeaseLabels { name: config.name.clone() }).clone();
        tokio::spawn(async move {
            loop {
                let status = rx.borrow_and_update().clone();
                gauge.set(i64::from(status.leading));
                match leader::check_health(
                    &status,
                    tokio::time::Instant::now(),
                    config.lease_duration,
                    leader::HEALTH_TOLERANCE,
                ) {
                    Ok(()) => check.set_healthy(),
                    Err(reason) => check.set_unhealthy(reason),
                }
                tokio::select! {
                    _ = stop.cancelled() => return,
                    changed = rx.changed() => if changed.is_err() { return },
                    _ = tokio::time::sleep(config.retry_period) => {}
                }
            }
        });
    }

    /// One leadership term: initialize the provider, run `controllers` until `ctx.shutdown`;
    /// with leader migration, then take the second Lease and run its controllers too. Returns
    /// the second Lease's elector for the next term (or its release).
    fn term(
        &self,
        ctx: Context,
        controllers: Vec<(String, ControllerFactory)>,
        second: Option<SecondLease>,
        running: Arc<Mutex<BTreeSet<String>>>,
    ) -> impl Future<Output = Option<LeaderElector>> + Send + 'static {
        let health = self.health.clone();
        let gauges = self.engine_metrics.clone();
        let reporter = self.status.as_ref().map(|(target, interval)| {
            StatusReporter::new(ctx.client.clone(), target.clone(), ctx.provider.clone(), *interval)
                .with_shadow(ctx.shadow.clone())
                .with_orphans(ctx.orphans.clone())
        });
        async move {
            let token = ctx.shutdown.clone();
            let Some(mut second) = second else {
                if !initialize(&ctx).await {
                    return None;
                }
                let mut tasks = JoinSet::new();
                start_controllers(&mut tasks, controllers, &ctx, &health, &gauges, &running);
                if let Some(reporter) = reporter {
                    tasks.spawn(reporter.run(token.clone()));
                }
                while tasks.join_next().await.is_some() {}
                return None;
            };
            if !initialize(&ctx).await {
                return Some(second.elector);
            }
            let mut tasks = JoinSet::new();
            start_controllers(&mut tasks, controllers, &ctx, &health, &gauges, &running);
            if let Some(reporter) = reporter {
                tasks.spawn(reporter.run(token.clone()));
            }
            // Upstream's order (M7): the main Lease's controllers run, then the migration Lease.
            if second.elector.acquire(&token).await {
                publish_became_leader(&ctx.events, second.elector.config());
                start_controllers(&mut tasks, second.controllers, &ctx, &health, &gauges, &running);
                if second.elector.hold(&token).await == TermEnd::Lost {
                    second.lost.cancel();
                }
            }
            while tasks.join_next().await.is_some() {}
            Some(second.elector)
        }
    }
}

/// The leader-migration Lease of a term and the controllers it guards.
struct SecondLease {
    elector: LeaderElector,
    controllers: Vec<(String, ControllerFactory)>,
    /// Fired when the Lease is lost, which ends the term.
    lost: CancellationToken,
}

/// Start each of `controllers` the provider supports under a [`Supervisor`].
fn start_controllers(
    tasks: &mut JoinSet<()>,
    controllers: Vec<(String, ControllerFactory)>,
    ctx: &Context,
    health: &HealthRegistry,
    gauges: &EngineMetrics,
    running: &Arc<Mutex<BTreeSet<String>>>,
) {
    for (name, factory) in controllers {
        if let Some(reason) = skip_reason(&name, ctx.provider.as_ref(), &ctx.options) {
            tracing::info!(controller = %name, %reason, "skipping controller");
            continue;
        }
        if let Some(shadow) = &ctx.shadow {
            // Only the built-in controllers know how to compare without acting.
            let Some(builtin) = crds::controllers::Controller::from_name(&name) else {
                tracing::warn!(controller = %name, "not started: shadow mode runs only the built-in controllers");
                continue;
            };
            // Pending from the start, so ShadowAgrees waits for every controller's first pass.
            shadow.register(builtin.name());
        }
        tracing::info!(controller = %name, "starting controller");
        let gauge = gauges.controller(&name);
        let supervisor = Supervisor { name, factory, health: health.clone(), gauge, running: running.clone() };
        tasks.spawn(supervisor.run(ctx.clone()));
    }
}

/// Upstream's `LeaderElection` event on the Lease when this replica takes it.
fn publish_became_leader(events: &EventSink, cfg: &LeaderElectionConfig) {
    events.publish(
        MANAGER_NAME,
        lease_reference(cfg),
        EventType::Normal,
        "LeaderElection",
        format!("{} became leader", cfg.identity),
        "Acquire",
    );
}

/// Run `initialize` until it succeeds; false if the term ended first.
async fn initialize(ctx: &Context) -> bool {
    let mut backoff = Duration::from_secs(1);
    loop {
        let init = InitContext {
            client: ctx.client.clone(),
            shutdown: ctx.shutdown.clone(),
            metrics: ctx.metrics.clone(),
            events: ctx.events.clone(),
        };
        let outcome = tokio::select! {
            _ = ctx.shutdown.cancelled() => return false,
            r = ctx.provider.initialize(init) => r,
        };
        match outcome {
            Ok(()) => return true,
            Err(error) => {
                tracing::error!(%error, provider = ctx.provider.name(), retry_in = ?backoff, "cloud provider initialization failed")
            }
        }
        tokio::select! {
            _ = ctx.shutdown.cancelled() => return false,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(60));
    }
}

fn lease_reference(config: &LeaderElectionConfig) -> ObjectReference {
    ObjectReference {
        api_version: Some("coordination.k8s.io/v1".into()),
        kind: Some("Lease".into()),
        name: Some(config.name.clone()),
        namespace: Some(config.namespace.clone()),
        ..Default::default()
    }
}

/// Runs one controller for a term, restarting it with backoff when it fails (upstream
/// restarts workers after 1s).
struct Supervisor {
    name: String,
    factory: ControllerFactory,
    health: HealthRegistry,
    gauge: Gauge,
    running: Arc<Mutex<BTreeSet<String>>>,
}

impl Supervisor {
    async fn run(self, ctx: Context) {
        let handle = self.health.handle(&self.name);
        self.running.lock().unwrap_or_else(|e| e.into_inner()).insert(self.name.clone());
        self.gauge.set(1);
        let mut backoff = Duration::from_secs(1);
        loop {
            let controller = (self.factory)();
            let outcome = tokio::spawn(controller.run(ctx.clone(), handle.clone())).await;
            if ctx.shutdown.is_cancelled() {
                if let Ok(Err(error)) = outcome {
                    tracing::warn!(controller = %self.name, %error, "controller failed while stopping");
                }
                break;
            }
            match outcome {
                Ok(Ok(())) => {
                    tracing::warn!(controller = %self.name, "controller returned before shutdown; not restarting it");
                    break;
                }
                Ok(Err(error)) => {
                    tracing::error!(controller = %self.name, %error, restart_in = ?backoff, "controller failed");
                    handle.set_unhealthy(format!("controller failed: {error}"));
                }
                Err(join) => {
                    tracing::error!(controller = %self.name, error = %join, restart_in = ?backoff, "controller panicked");
                    handle.set_unhealthy("controller panicked");
                }
            }
            tokio::select! {
                _ = ctx.shutdown.cancelled() => break,
                _ = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(Duration::from_secs(60));
            handle.set_healthy();
        }
        self.gauge.set(0);
        self.health.remove(&self.name);
        self.running.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.name);
        tracing::debug!(controller = %self.name, "controller stopped");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crds::controllers::{CLOUD_NODE, CLOUD_NODE_LIFECYCLE, NODE_ROUTE, SERVICE_LB};

    #[test]
    fn running_managed_controllers_uses_upstream_legacy_names() {
        assert_eq!(metric_name(CLOUD_NODE), "cloud-node");
        assert_eq!(metric_name(CLOUD_NODE_LIFECYCLE), "cloud-node-lifecycle");
        assert_eq!(metric_name(SERVICE_LB), "service");
        assert_eq!(metric_name(NODE_ROUTE), "route");
        assert_eq!(metric_name("tagging"), "tagging");
    }
}
