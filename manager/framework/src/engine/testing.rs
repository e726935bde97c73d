//! Support for controller integration tests: run one controller as the engine would.
//!
//! ```ignore
//! let server = testkit::TestApiServer::start().await?;
//! let fake = Arc::new(FakeProvider::new());
//! let running = ccm_framework::engine::testing::run_controller(
//!     server.client(), fake.clone(), ControllerOptions::default(), Box::new(MyController::new()),
//! ).await;
//! // ... create objects, wait for the controller's effect ...
//! running.stop().await?;
//! ```

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Service};
use kube::runtime::watcher;
use kube::{Api, Client};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::cache::{Cache, run_watch};
use crate::controller::{Context, Controller};
use crate::error::Error;
use crate::events::EventSink;
use crate::health::{CheckState, HealthRegistry};
use crate::metrics::Metrics;
use crate::options::ControllerOptions;
use crate::provider::{CloudProvider, InitContext};
use crate::shadow::Shadow;

/// How long [`context`] waits for the caches to sync before panicking.
pub const SYNC_TIMEOUT: Duration = Duration::from_secs(30);

/// A [`Context`] like the engine's, with caches fed by real watches on `client`, stopped by
/// `shutdown`. Waits until both caches have synced; panics after [`SYNC_TIMEOUT`].
pub async fn context(
    client: Client,
    provider: Arc<dyn CloudProvider>,
    options: ControllerOptions,
    shutdown: CancellationToken,
) -> Context {
    let (nodes, node_writer) = Cache::<Node>::new();
    let (services, service_writer) = Cache::<Service>::new();
    tokio::spawn(run_watch(
        Api::<Node>::all(client.clone()),
        watcher::Config::default(),
        node_writer.trimmed(crate::cache::trim_node),
        shutdown.clone(),
    ));
    tokio::spawn(run_watch(
        Api::<Service>::all(client.clone()),
        watcher::Config::default(),
        service_writer.trimmed(crate::cache::trim_service),
        shutdown.clone(),
    ));
    let synced = tokio::time::timeout(SYNC_TIMEOUT, async {
        nodes.wait_until_ready().await && services.wait_until_ready().await
    })
    .await;
    assert!(matches!(synced, Ok(true)), "the Node and Service caches did not sync within {SYNC_TIMEOUT:?}");
    let metrics = Arc::new(Metrics::new());
    let events = EventSink::spawn_observed(client.clone(), Some("test".into()), &metrics, shutdown.clone());
    let shadow = options.shadow.then(Shadow::new);
    let orphans = crate::orphans::OrphanRecord::new();
    Context {
        client,
        provider,
        options: Arc::new(options),
        shadow,
        nodes,
        services,
        events,
        orphans,
        metrics,
        shutdown,
    }
}

/// A controller running in the background; see [`run_controller`].
pub struct RunningController {
    /// The context the controller got (caches, metrics, events).
    pub context: Context,
    /// Its health check lives here, under its name.
    pub health: HealthRegistry,
    name: &'static str,
    task: JoinHandle<Result<(), Error>>,
}

impl std::fmt::Debug for RunningController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunningController").field("name", &self.name).finish_non_exhaustive()
    }
}

impl RunningController {
    /// The controller's `/healthz/<name>` state.
    pub fn check(&self) -> Option<CheckState> {
        self.health.get(self.name)
    }

    /// Whether `run` has returned.
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// Cancel the context and return what `run` returned (panics propagate).
    pub async fn stop(self) -> Result<(), Error> {
        self.context.shutdown.cancel();
        match self.task.await {
            Ok(result) => result,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => Ok(()),
        }
    }
}

/// Initialize `provider` and run `controller` against `client` with `options`, as the engine
/// does while leading (the provider is not wrapped in metrics, so its own call log sees every
/// call). The caches have synced when this returns.
pub async fn run_controller(
    client: Client,
    provider: Arc<dyn CloudProvider>,
    options: ControllerOptions,
    controller: Box<dyn Controller>,
) -> RunningController {
    let shutdown = CancellationToken::new();
    let context = context(client.clone(), provider.clone(), options, shutdown.clone()).await;
    let init = InitContext { client, shutdown, metrics: context.metrics.clone(), events: context.events.clone() };
    if let Err(error) = provider.initialize(init).await {
        tracing::warn!(%error, "provider initialization failed in test setup");
    }
    let health = HealthRegistry::new();
    let name = controller.name();
    let handle = health.handle(name);
    let task = tokio::spawn(controller.run(context.clone(), handle));
    RunningController { context, health, name, task }
}

/// [`run_controller`] for the built-in controller `name`; `None` if it is not built in.
pub async fn run_builtin(
    client: Client,
    provider: Arc<dyn CloudProvider>,
    options: ControllerOptions,
    name: &str,
) -> Option<RunningController> {
    let controller = crate::controllers::builtin(crds::controllers::Controller::from_name(name)?);
    Some(run_controller(client, provider, options, controller).await)
}
