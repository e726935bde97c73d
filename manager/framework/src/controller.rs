//! The interface every controller implements, and what the engine hands it.

use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Node, Service};
use tokio_util::sync::CancellationToken;

use crate::cache::Cache;
use crate::events::EventSink;
use crate::health::HealthHandle;
use crate::metrics::Metrics;
use crate::options::ControllerOptions;
use crate::provider::CloudProvider;
use crate::shadow::Shadow;

/// Everything a running controller may use; cheap to clone.
#[derive(Clone)]
pub struct Context {
    /// A client for the cluster, behind the manager's client-side rate limit.
    pub client: kube::Client,
    /// The cloud provider.
    pub provider: Arc<dyn CloudProvider>,
    /// Shared settings.
    pub options: Arc<ControllerOptions>,
    /// In shadow mode (`options.shadow`), the record every controller compares into; `None`
    /// when the controllers act.
    pub shadow: Option<Shadow>,
    /// The shared Node cache (one watch for all controllers).
    pub nodes: Cache<Node>,
    /// The shared Service cache (one watch for all controllers).
    pub services: Cache<Service>,
    /// Non-blocking event publisher.
    pub events: EventSink,
    /// The orphan report the service controller fills and the status reporter writes.
    pub orphans: crate::orphans::OrphanRecord,
    /// Metrics registry.
    pub metrics: Arc<Metrics>,
    /// Fires when the controller must stop (leadership lost or shutdown).
    pub shutdown: CancellationToken,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").field("provider", &self.provider.name()).finish_non_exhaustive()
    }
}

/// A control loop run by the engine while this manager leads.
#[async_trait]
pub trait Controller: Send + 'static {
    /// Canonical name (for example `cloud-node-controller`); also the `/healthz/<name>` check.
    fn name(&self) -> &'static str;

    /// Run until `ctx.shutdown` fires. The caches may still be syncing when this is called:
    /// wait with `wait_until_ready` before the first full pass. Report trouble on `health`.
    async fn run(self: Box<Self>, ctx: Context, health: HealthHandle) -> Result<(), crate::error::Error>;
}
