//! The ccm-operator: reconciles `CloudControllerManager` resources into running
//! cloud-controller-managers (a Deployment, a DaemonSet, or an engine inside the operator) and
//! reports their state as status conditions.
//!
//! The reconcile pipeline is [`dereference`] → [`validate`] (pure) → [`build`] (pure) →
//! [`apply`] → [`status`] (pure) → a status write, only when something changed.
//!
//! Embedding (the sandbox, tests): [`start`] runs the whole operator in the current process
//! and returns an [`OperatorHandle`]; [`run`] runs it until a token fires.

pub mod announcer;
pub mod announcing;
pub mod apply;
pub mod build;
pub mod controller;
pub mod dereference;
pub mod desired;
pub mod embedded;
pub mod error;
pub mod hash;
pub mod metrics;
pub mod names;
pub mod node_manager;
pub mod profiles;
pub mod reasons;
pub mod status;
pub mod switch;
pub mod validate;
pub mod watch;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ccm_framework::events::EventSink;
use ccm_framework::health::HealthRegistry;
use ccm_framework::http::{HttpConfig, HttpState, Listener};
use ccm_framework::leader::{LeaderElectionConfig, LeaderElector, TermEnd};
use ccm_framework::registry::Registry;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::wait::{await_condition, conditions};
use kube::{Api, Client, CustomResourceExt};
use tokio::sync::{mpsc, watch as tokio_watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use build::BuildSettings;
pub use controller::Timings;
pub use error::Error;
pub use watch::Scope;

use controller::Guarded;
use embedded::Engines;
use metrics::OperatorMetrics;

/// Where cloud-config Secrets are read when nothing else is configured.
pub const DEFAULT_CLOUD_CONFIG_NAMESPACE: &str = "kube-system";

/// `/readyz` check: the CRD is established.
pub const CRD_CHECK: &str = "crd-established";
/// `/healthz` check: the operator's main loop runs.
pub const MAIN_LOOP_CHECK: &str = "main-loop";

/// Everything the operator needs to run.
#[derive(Clone)]
pub struct OperatorConfig {
    /// A client for the cluster.
    pub client: Client,
    /// Namespaces served.
    pub scope: Scope,
    /// Namespaces where cloud-config Secrets are read and managers run (the chart renders the
    /// operator's namespaced Roles there); a CloudControllerManager elsewhere gets
    /// `ConfigValid=False` `NamespaceNotAllowed`. `None`: the served namespaces when `scope`
    /// lists them, else [`DEFAULT_CLOUD_CONFIG_NAMESPACE`].
    pub cloud_config_namespaces: Option<Vec<String>>,
    /// Manager image and the ClusterRoles bound per CR.
    pub build: BuildSettings,
    /// Providers known to validation and to Embedded mode.
    pub registry: Registry,
    /// This operator replica's identity (Lease holder of its own and its embedded engines').
    pub identity: String,
    /// The operator's own election on Lease `ccm-operator`; `None` reconciles unconditionally.
    pub leader_election: Option<LeaderElectionConfig>,
    /// Where to serve `/healthz`, `/livez`, `/readyz` and `/metrics`; `None` serves nothing.
    pub http: Option<HttpConfig>,
    /// Controller timings.
    pub timings: Timings,
    /// Server-side apply the CRD this operator was built with at start (`--manage-crd`).
    pub manage_crd: bool,
    /// What this installation allows: Embedded mode (`--embedded-enabled`) and whether the
    /// process is on its Node's network (`--embedded-host-network`).
    pub environment: validate::Environment,
}

impl std::fmt::Debug for OperatorConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OperatorConfig")
            .field("scope", &self.scope)
            .field("cloud_config_namespaces", &self.cloud_config_namespaces)
            .field("build", &self.build)
            .field("identity", &self.identity)
            .field("leader_election", &self.leader_election)
            .field("http", &self.http)
            .field("timings", &self.timings)
            .field("manage_crd", &self.manage_crd)
            .field("environment", &self.environment)
            .finish_non_exhaustive()
    }
}

impl OperatorConfig {
    /// A configuration with defaults: every namespace, built-in providers, no election, no HTTP,
    /// and the CRD kept current (as the binary does).
    pub fn new(client: Client) -> Self {
        Self {
            client,
            scope: Scope::All,
            cloud_config_namespaces: None,
            build: BuildSettings::default(),
            registry: ccm_builtin::registry(),
            identity: ccm_framework::leader::default_identity(),
            leader_election: None,
            http: None,
            timings: Timings::default(),
            manage_crd: true,
            environment: validate::Environment::default(),
        }
    }

    /// The namespaces where Secrets are read and managers run, resolved (see
    /// [`Self::cloud_config_namespaces`]).
    pub fn allowed_namespaces(&self) -> validate::AllowedNamespaces {
        match (&self.cloud_config_namespaces, &self.scope) {
            (Some(list), _) => validate::AllowedNamespaces::new(list),
            (None, Scope::Namespaces(list)) => validate::AllowedNamespaces::new(list),
            (None, Scope::All) => validate::AllowedNamespaces::new(&[DEFAULT_CLOUD_CONFIG_NAMESPACE]),
        }
    }

    /// The operator's own leader election in `namespace` with upstream timings.
    pub fn operator_lease(namespace: &str, identity: &str) -> LeaderElectionConfig {
        LeaderElectionConfig {
            identity: identity.to_string(),
            ..LeaderElectionConfig::new(namespace, names::OPERATOR_LEASE)
        }
    }
}

/// A running operator.
pub struct OperatorHandle {
    shutdown: CancellationToken,
    crash: CancellationToken,
    task: JoinHandle<Result<(), Error>>,
    leading: tokio_watch::Receiver<bool>,
    local_addr: Option<SocketAddr>,
    metrics: OperatorMetrics,
    identity: String,
}

impl std::fmt::Debug for OperatorHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OperatorHandle")
            .field("identity", &self.identity)
            .field("local_addr", &self.local_addr)
            .finish()
    }
}

impl OperatorHandle {
    /// Whether this replica currently reconciles.
    pub fn is_leading(&self) -> bool {
        *self.leading.borrow()
    }

    /// Wait until [`Self::is_leading`] equals `leading`.
    pub async fn wait_leading(&self, leading: bool) {
        let mut rx = self.leading.clone();
        let _ = rx.wait_for(|l| *l == leading).await;
    }

    /// The bound address of the HTTP endpoint, if serving.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.local_addr
    }

    /// The operator's metrics.
    pub fn metrics(&self) -> &OperatorMetrics {
        &self.metrics
    }

    /// This replica's identity.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// Stop gracefully (engines stop and release their Leases, then the operator's Lease is
    /// released) and wait.
    pub async fn stop(self) -> Result<(), Error> {
        self.shutdown.cancel();
        self.wait().await
    }

    /// Wait until the operator ends (its shutdown token fired, or it failed).
    pub async fn wait(self) -> Result<(), Error> {
        match self.task.await {
            Ok(r) => r,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => Ok(()),
        }
    }

    /// Kill the operator without cleanup, as a crash would: no Lease is released.
    pub fn abort(self) {
        self.crash.cancel();
        self.task.abort();
        self.shutdown.cancel();
    }
}

/// Run the operator until `shutdown` fires.
pub async fn run(config: OperatorConfig, shutdown: CancellationToken) -> Result<(), Error> {
    let handle = start_with(config, shutdown).await?;
    handle.wait().await
}

/// Start the operator in the background.
pub async fn start(config: OperatorConfig) -> Result<OperatorHandle, Error> {
    start_with(config, CancellationToken::new()).await
}

async fn start_with(config: OperatorConfig, shutdown: CancellationToken) -> Result<OperatorHandle, Error> {
    let metrics = OperatorMetrics::default();
    let health = HealthRegistry::new();
    let ready = HealthRegistry::new();
    let main_check = health.handle(MAIN_LOOP_CHECK);
    let crd_check = ready.handle(CRD_CHECK);
    crd_check.set_unhealthy("waiting for the CloudControllerManager CRD to be established");
    let local_addr = match &config.http {
        Some(http) => {
            let listener = Listener::bind(http).await?;
            let addr = listener.local_addr();
            let state = HttpState {
                health: health.clone(),
                ready: ready.clone(),
                metrics: metrics.registry.clone(),
                capabilities: None,
            };
            tokio::spawn(listener.serve(state, shutdown.clone()));
            Some(addr)
        }
        None => None,
    };
    let (leading_tx, leading) = tokio_watch::channel(false);
    let identity = config.identity.clone();
    let task_metrics = metrics.clone();
    let token = shutdown.clone();
    let crash = CancellationToken::new();
    let task_crash = crash.clone();
    let task = tokio::spawn(async move {
        let result = main_loop(config, task_metrics, crd_check, leading_tx, token, task_crash).await;
        if let Err(e) = &result {
            main_check.set_unhealthy(e.to_string());
            tracing::error!(error = %e, "ccm-operator stopped with an error");
        }
        result
    });
    Ok(OperatorHandle { shutdown, crash, task, leading, local_addr, metrics, identity })
}

/// What the start-up apply of the CRD did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CrdApply {
    /// The CRD now matches the one this operator was built with.
    Applied,
    /// RBAC does not allow it (the chart's `crds.manage: false`): someone else upgrades the CRD.
    Forbidden(String),
    /// Any other failure, after retrying transient ones.
    Failed(String),
}

/// Attempts of the start-up CRD apply when the server fails transiently.
const CRD_APPLY_ATTEMPTS: u32 = 3;

/// Server-side apply the CloudControllerManager CRD this operator was built with (field manager
/// `ccm-operator`, forced), so that `helm upgrade`, which never touches a chart's `crds/`, still
/// upgrades it. Never fails the start: the caller logs the outcome and waits for the CRD anyway.
pub async fn apply_crd(client: &Client, shutdown: &CancellationToken) -> CrdApply {
    apply_one_crd(client, &crds::crd(), shutdown).await
}

/// The same for the `LoadBalancerIPPool` CRD the chart ships beside it (the baremetal
/// provider's pools), which `helm upgrade` would leave at the installed version too.
pub async fn apply_pool_crd(client: &Client, shutdown: &CancellationToken) -> CrdApply {
    apply_one_crd(client, &crds::pool_crd(), shutdown).await
}

/// The same for the `ServiceAnnouncement` CRD (which node answers for a Service's addresses,
/// written by the baremetal provider's L2 announcers).
pub async fn apply_announcement_crd(client: &Client, shutdown: &CancellationToken) -> CrdApply {
    apply_one_crd(client, &crds::announcement_crd(), shutdown).await
}

async fn apply_one_crd(client: &Client, crd: &CustomResourceDefinition, shutdown: &CancellationToken) -> CrdApply {
    let name = crd.metadata.name.as_deref().unwrap_or_default();
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply(names::FIELD_MANAGER).force();
    let mut attempt = 0;
    loop {
        attempt += 1;
        let error = match api.patch(name, &params, &Patch::Apply(crd)).await {
            Ok(_) => return CrdApply::Applied,
            Err(kube::Error::Api(s)) if s.is_forbidden() => return CrdApply::Forbidden(s.message),
            // The server understood and refused (invalid for this Kubernetes version, ...).
            Err(kube::Error::Api(s)) if (400..500).contains(&s.code) && s.code != 429 => {
                return CrdApply::Failed(s.message);
            }
            Err(e) => e.to_string(),
        };
        if attempt >= CRD_APPLY_ATTEMPTS {
            return CrdApply::Failed(error);
        }
        tokio::select! {
            _ = shutdown.cancelled() => return CrdApply::Failed(error),
            _ = tokio::time::sleep(controller::backoff(attempt)) => {}
        }
    }
}

/// Wait until the CloudControllerManager CRD is Established (or `shutdown` fires).
pub async fn wait_for_crd(client: &Client, shutdown: &CancellationToken) -> Result<bool, Error> {
    let name = crds::CloudControllerManager::crd_name();
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let established = api.get_opt(name).await.ok().flatten().is_some_and(|crd| {
        crd.status
            .and_then(|s| s.conditions)
            .into_iter()
            .flatten()
            .any(|c| c.type_ == "Established" && c.status == "True")
    });
    if established {
        return Ok(true);
    }
    tracing::info!(crd = name, "waiting for the CustomResourceDefinition to be established");
    tokio::select! {
        _ = shutdown.cancelled() => Ok(false),
        r = await_condition(api, name, conditions::is_crd_established()) => {
            r.map(|_| true).map_err(|e| Error::Wait { what: format!("CRD {name}"), message: e.to_string() })
        }
    }
}

/// Forwards CR triggers (engine state changes, conflicts) to the current term's controller.
#[derive(Clone, Default)]
struct TriggerHub {
    current: Arc<Mutex<Option<mpsc::UnboundedSender<ObjectRef<Guarded>>>>>,
}

impl TriggerHub {
    fn spawn(&self, mut rx: mpsc::UnboundedReceiver<ObjectRef<Guarded>>) {
        let current = self.current.clone();
        tokio::spawn(async move {
            while let Some(r) = rx.recv().await {
                if let Some(tx) = current.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
                    let _ = tx.send(r);
                }
            }
        });
    }

    fn open_term(&self) -> mpsc::UnboundedReceiver<ObjectRef<Guarded>> {
        let (tx, rx) = mpsc::unbounded_channel();
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = Some(tx);
        rx
    }

    fn close_term(&self) {
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

async fn main_loop(
    config: OperatorConfig,
    metrics: OperatorMetrics,
    crd_check: ccm_framework::health::HealthHandle,
    leading: tokio_watch::Sender<bool>,
    shutdown: CancellationToken,
    crash: CancellationToken,
) -> Result<(), Error> {
    if config.manage_crd {
        for (crd, outcome) in [
            (crds::CloudControllerManager::crd_name(), apply_crd(&config.client, &shutdown).await),
            (crds::LoadBalancerIPPool::crd_name(), apply_pool_crd(&config.client, &shutdown).await),
            (crds::ServiceAnnouncement::crd_name(), apply_announcement_crd(&config.client, &shutdown).await),
        ] {
            match outcome {
                CrdApply::Applied => {
                    tracing::info!(crd, "applied the CustomResourceDefinition this operator was built with")
                }
                CrdApply::Forbidden(message) => tracing::warn!(
                    crd,
                    %message,
                    "not allowed to apply the CustomResourceDefinition (crds.manage=false?); using it as it is"
                ),
                CrdApply::Failed(message) => {
                    tracing::warn!(crd, %message, "could not apply the CustomResourceDefinition; using it as it is")
                }
            }
        }
    }
    if !wait_for_crd(&config.client, &shutdown).await? {
        return Ok(());
    }
    crd_check.set_healthy();
    let (process_tx, process_rx) = mpsc::unbounded_channel();
    let hub = TriggerHub::default();
    hub.spawn(process_rx);
    let events = EventSink::spawn_observed(
        config.client.clone(),
        Some(config.identity.clone()),
        &metrics.registry,
        shutdown.clone(),
    );
    let sink = events.clone();
    let engines = Arc::new(Engines::new(
        config.client.clone(),
        config.identity.clone(),
        process_tx.clone(),
        metrics.clone(),
        crash,
    ));
    let shared = controller::Shared {
        client: config.client.clone(),
        scope: config.scope.clone(),
        allowed: config.allowed_namespaces(),
        registry: config.registry.clone(),
        build: config.build.clone(),
        environment: config.environment,
        timings: config.timings.clone(),
        engines: engines.clone(),
        trigger: process_tx,
        events,
        metrics: metrics.clone(),
    };
    let term = |stop: CancellationToken| {
        let rx = hub.open_term();
        let shared = shared.clone();
        tokio::spawn(async move { controller::run(shared, rx, stop).await })
    };
    let set_leading = |on: bool| {
        metrics.set_leader(on);
        leading.send_replace(on);
    };
    match config.leader_election {
        None => {
            set_leading(true);
            tracing::info!(identity = %config.identity, "reconciling (leader election off)");
            let handle = term(shutdown.clone());
            let _ = handle.await;
            engines.stop_all().await;
            set_leading(false);
            tracing::info!(lease = "not used (--leader-elect=false)", "ccm-operator stopped");
        }
        Some(le) => {
            let mut elector = LeaderElector::new(config.client.clone(), le);
            loop {
                if !elector.acquire(&shutdown).await {
                    break;
                }
                set_leading(true);
                tracing::info!(identity = %config.identity, "leading: reconciling CloudControllerManagers");
                let stop = shutdown.child_token();
                let handle = term(stop.clone());
                let end = elector.hold(&shutdown).await;
                stop.cancel();
                let _ = handle.await;
                hub.close_term();
                engines.stop_all().await;
                set_leading(false);
                match end {
                    TermEnd::Stopped => {
                        let lease = elector.release().await;
                        // The operator's one INFO line of a stop.
                        tracing::info!(%lease, "ccm-operator stopped");
                        break;
                    }
                    TermEnd::Lost => {
                        tracing::warn!("lost the operator Lease; standing by");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
        }
    }
    // The sink writes what is still pending for a short grace; let it before the runtime ends.
    let _ = sink.closed().await;
    Ok(())
}
