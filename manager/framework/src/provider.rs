//! The cloud provider contract: what a cloud vendor implements.
//!
//! This is the Rust counterpart of upstream's `cloudprovider.Interface`, with its traps fixed:
//! absence is a value (`Option`, `bool`), never an error; errors are one enum that callers
//! match structurally; and batch lookups exist, with default implementations that fan out
//! single lookups with bounded concurrency, so a provider with a batch API overrides one
//! method and everyone else gets batching for free.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use futures::stream::{self, StreamExt};
use k8s_openapi::api::core::v1::{LoadBalancerStatus, Node, NodeAddress, Service};
use tokio_util::sync::CancellationToken;

/// Result of a cloud call.
pub type CloudResult<T> = Result<T, CloudError>;

/// Why a cloud call failed. Controllers match on the variant, never on the message.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CloudError {
    /// The provider does not implement this call.
    #[error("not implemented by the cloud provider")]
    NotImplemented,
    /// Another controller owns this object (for example a dedicated load-balancer controller);
    /// the generic controller must leave it alone.
    #[error("implemented elsewhere")]
    ImplementedElsewhere,
    /// An asynchronous cloud operation is under way: try again after a fixed delay instead of
    /// backing off exponentially.
    #[error("{message} (retrying in {after:?})")]
    RetryAfter {
        /// When to try again.
        after: Duration,
        /// What is pending, for events and logs.
        message: String,
    },
    /// The cloud API rate-limited the call.
    #[error("throttled by the cloud API: {message}")]
    Throttled {
        /// The delay the API asked for, if it said.
        retry_after: Option<Duration>,
        /// Details.
        message: String,
    },
    /// The credentials were rejected.
    #[error("unauthorized by the cloud API: {0}")]
    Unauthorized(String),
    /// The cloud API could not be reached or answered with a server error.
    #[error("cloud API unavailable: {0}")]
    Unavailable(String),
    /// The cloud-config is invalid. The message must never quote the config's content.
    #[error("invalid cloud-config: {0}")]
    InvalidConfig(String),
    /// The manager runs in shadow mode and refused a call that would change the cloud
    /// ([`CallKind::Mutating`]); it never reached the provider.
    #[error("{call} refused: the manager runs in shadow mode and makes no mutating cloud calls")]
    RefusedInShadowMode {
        /// The refused call.
        call: Call,
    },
    /// The provider will not give this Service a load balancer until the Service or the
    /// provider's configuration changes (no free address, a clash, a malformed annotation).
    /// The service controller writes it as the Service's `LoadBalancerProvisioned=False`
    /// condition, emits `SyncLoadBalancerFailed` and retries with backoff. Build it with
    /// [`CloudError::refused`]; the message names fields and counts, never config content.
    #[error("{reason}: {message}")]
    Refused {
        /// Why, from a fixed set; becomes the condition's reason.
        reason: Refusal,
        /// What the user can act on, at most [`MAX_REFUSAL_MESSAGE_BYTES`].
        message: String,
    },
    /// The object is no longer this cluster's: its ownership changed since it was listed
    /// ([`LoadBalancer::delete_owned`] refuses it). The caller leaves it alone and forgets it;
    /// the message says what changed, never tag values.
    #[error("no longer this cluster's: {0}")]
    NotOwned(String),
    /// Anything else.
    #[error("{0}")]
    Other(String),
}

/// The longest [`CloudError::Refused`] message kept; longer ones are cut on a character
/// boundary, so a provider cannot make the Service's status grow without bound.
pub const MAX_REFUSAL_MESSAGE_BYTES: usize = 1024;

/// Reasons of [`CloudError::Refused`], defined with every other condition reason in
/// [`crds::reasons::service_load_balancer`].
pub use crds::reasons::service_load_balancer as refusal_reasons;

/// Why a provider refuses a Service a load balancer; each is one reason of the Service's
/// `LoadBalancerProvisioned=False` condition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// Every address of every pool the Service may use is taken.
    PoolExhausted,
    /// No pool is allowed for this Service.
    NoPoolMatches,
    /// The Service's sharing key names an address whose Services clash with it.
    SharingConflict,
    /// A requested address is held by another Service.
    RequestedAddressTaken,
    /// A requested address is in no pool the Service may use, or is not an address.
    RequestedAddressUnavailable,
    /// An annotation of the Service is malformed.
    InvalidAnnotation,
    /// The Service asks for something the provider cannot do.
    UnsupportedService,
    /// A limit of the cloud account is reached.
    QuotaExceeded,
}

impl Refusal {
    /// Every refusal, in declaration order.
    pub const ALL: [Refusal; 8] = [
        Refusal::PoolExhausted,
        Refusal::NoPoolMatches,
        Refusal::SharingConflict,
        Refusal::RequestedAddressTaken,
        Refusal::RequestedAddressUnavailable,
        Refusal::InvalidAnnotation,
        Refusal::UnsupportedService,
        Refusal::QuotaExceeded,
    ];

    /// The condition reason (one CamelCase word).
    pub fn reason(self) -> &'static str {
        match self {
            Refusal::PoolExhausted => refusal_reasons::POOL_EXHAUSTED,
            Refusal::NoPoolMatches => refusal_reasons::NO_POOL_MATCHES,
            Refusal::SharingConflict => refusal_reasons::SHARING_CONFLICT,
            Refusal::RequestedAddressTaken => refusal_reasons::REQUESTED_ADDRESS_TAKEN,
            Refusal::RequestedAddressUnavailable => refusal_reasons::REQUESTED_ADDRESS_UNAVAILABLE,
            Refusal::InvalidAnnotation => refusal_reasons::INVALID_ANNOTATION,
            Refusal::UnsupportedService => refusal_reasons::UNSUPPORTED_SERVICE,
            Refusal::QuotaExceeded => refusal_reasons::QUOTA_EXCEEDED,
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.reason())
    }
}

impl CloudError {
    /// A fixed-delay retry error.
    pub fn retry_after(after: Duration, message: impl Into<String>) -> Self {
        CloudError::RetryAfter { after, message: message.into() }
    }

    /// A refusal with its reason; the message is cut to [`MAX_REFUSAL_MESSAGE_BYTES`].
    pub fn refused(reason: Refusal, message: impl Into<String>) -> Self {
        let mut message = message.into();
        if message.len() > MAX_REFUSAL_MESSAGE_BYTES {
            let mut end = MAX_REFUSAL_MESSAGE_BYTES;
            while !message.is_char_boundary(end) {
                end -= 1;
            }
            message.truncate(end);
        }
        CloudError::Refused { reason, message }
    }

    /// The delay the error asks for, if it asks for one.
    pub fn requested_delay(&self) -> Option<Duration> {
        match self {
            CloudError::RetryAfter { after, .. } => Some(*after),
            CloudError::Throttled { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// A short stable label for metrics (`not_implemented`, `throttled`, ...).
    pub fn kind(&self) -> &'static str {
        match self {
            CloudError::NotImplemented => "not_implemented",
            CloudError::ImplementedElsewhere => "implemented_elsewhere",
            CloudError::RetryAfter { .. } => "retry_after",
            CloudError::Throttled { .. } => "throttled",
            CloudError::Unauthorized(_) => "unauthorized",
            CloudError::Unavailable(_) => "unavailable",
            CloudError::InvalidConfig(_) => "invalid_config",
            CloudError::RefusedInShadowMode { .. } => "refused_in_shadow_mode",
            CloudError::Refused { .. } => "refused",
            CloudError::NotOwned(_) => "not_owned",
            CloudError::Other(_) => "other",
        }
    }
}

/// Every call of the provider traits, so a provider can say which of them only read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Call {
    /// [`CloudProvider::initialize`].
    Initialize,
    /// [`CloudProvider::health`].
    Health,
    /// [`Instances::instance_exists`] and its batch form.
    InstanceExists,
    /// [`Instances::instance_shutdown`] and its batch form.
    InstanceShutdown,
    /// [`Instances::instance_metadata`] and its batch form.
    InstanceMetadata,
    /// [`LoadBalancer::get_load_balancer`].
    GetLoadBalancer,
    /// [`LoadBalancer::ensure_load_balancer`].
    EnsureLoadBalancer,
    /// [`LoadBalancer::update_load_balancer`].
    UpdateLoadBalancer,
    /// [`LoadBalancer::ensure_load_balancer_deleted`].
    EnsureLoadBalancerDeleted,
    /// [`LoadBalancer::list_owned`].
    ListOwned,
    /// [`LoadBalancer::delete_owned`].
    DeleteOwned,
    /// [`Routes::list_routes`].
    ListRoutes,
    /// [`Routes::create_route`].
    CreateRoute,
    /// [`Routes::delete_route`].
    DeleteRoute,
    /// [`Zones::zone_by_provider_id`].
    ZoneByProviderId,
    /// [`Zones::zone_by_node_name`].
    ZoneByNodeName,
    /// [`Clusters::list_clusters`].
    ListClusters,
    /// [`Clusters::master`].
    Master,
}

impl Call {
    /// Every call, in declaration order.
    pub const ALL: [Call; 18] = [
        Call::Initialize,
        Call::Health,
        Call::InstanceExists,
        Call::InstanceShutdown,
        Call::InstanceMetadata,
        Call::GetLoadBalancer,
        Call::EnsureLoadBalancer,
        Call::UpdateLoadBalancer,
        Call::EnsureLoadBalancerDeleted,
        Call::ListOwned,
        Call::DeleteOwned,
        Call::ListRoutes,
        Call::CreateRoute,
        Call::DeleteRoute,
        Call::ZoneByProviderId,
        Call::ZoneByNodeName,
        Call::ListClusters,
        Call::Master,
    ];

    /// The trait method's name, as in `cloudprovider_api_requests_total{method}`.
    pub fn method(self) -> &'static str {
        match self {
            Call::Initialize => "initialize",
            Call::Health => "health",
            Call::InstanceExists => "instance_exists",
            Call::InstanceShutdown => "instance_shutdown",
            Call::InstanceMetadata => "instance_metadata",
            Call::GetLoadBalancer => "get_load_balancer",
            Call::EnsureLoadBalancer => "ensure_load_balancer",
            Call::UpdateLoadBalancer => "update_load_balancer",
            Call::EnsureLoadBalancerDeleted => "ensure_load_balancer_deleted",
            Call::ListOwned => "list_owned",
            Call::DeleteOwned => "delete_owned",
            Call::ListRoutes => "list_routes",
            Call::CreateRoute => "create_route",
            Call::DeleteRoute => "delete_route",
            Call::ZoneByProviderId => "zone_by_provider_id",
            Call::ZoneByNodeName => "zone_by_node_name",
            Call::ListClusters => "list_clusters",
            Call::Master => "master",
        }
    }

    /// What the traits' contract says the call does: lookups read; ensure, update, create and
    /// delete change the cloud. `initialize` counts as mutating because it may spawn tasks
    /// that act (a provider whose initialize only prepares reads overrides
    /// [`CloudProvider::call_kind`]).
    pub fn default_kind(self) -> CallKind {
        match self {
            Call::Health
            | Call::InstanceExists
            | Call::InstanceShutdown
            | Call::InstanceMetadata
            | Call::GetLoadBalancer
            | Call::ListOwned
            | Call::ListRoutes
            | Call::ZoneByProviderId
            | Call::ZoneByNodeName
            | Call::ListClusters
            | Call::Master => CallKind::Read,
            Call::Initialize
            | Call::EnsureLoadBalancer
            | Call::UpdateLoadBalancer
            | Call::EnsureLoadBalancerDeleted
            | Call::DeleteOwned
            | Call::CreateRoute
            | Call::DeleteRoute => CallKind::Mutating,
        }
    }
}

impl fmt::Display for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.method())
    }
}

/// Whether a call only reads the cloud. Shadow mode lets only reads through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CallKind {
    /// Reads, with no effect on the cloud or the cluster.
    Read,
    /// Changes the cloud (or may: anything with side effects).
    Mutating,
}

/// Well-known reasons for [`Health::Unhealthy`], defined with every other condition reason in
/// [`crds::reasons::provider_healthy`]; they become the `ProviderHealthy` condition's reason.
pub use crds::reasons::provider_healthy as health_reasons;

/// Outcome of a provider health probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    /// The provider can do its job.
    Healthy {
        /// Optional detail (for example "3 instances, 2 pools").
        message: String,
    },
    /// The provider cannot do its job right now.
    Unhealthy {
        /// One CamelCase word; see [`health_reasons`].
        reason: String,
        /// What is wrong, without secrets.
        message: String,
    },
}

impl Health {
    /// A healthy outcome with a message.
    pub fn healthy(message: impl Into<String>) -> Self {
        Health::Healthy { message: message.into() }
    }

    /// An unhealthy outcome.
    pub fn unhealthy(reason: impl Into<String>, message: impl Into<String>) -> Self {
        Health::Unhealthy { reason: reason.into(), message: message.into() }
    }

    /// Whether the outcome is healthy.
    pub fn is_healthy(&self) -> bool {
        matches!(self, Health::Healthy { .. })
    }

    /// The condition reason for this outcome.
    pub fn reason(&self) -> &str {
        match self {
            Health::Healthy { .. } => health_reasons::HEALTHY,
            Health::Unhealthy { reason, .. } => reason,
        }
    }

    /// The condition message for this outcome.
    pub fn message(&self) -> &str {
        match self {
            Health::Healthy { message } | Health::Unhealthy { message, .. } => message,
        }
    }
}

/// What [`CloudProvider::reload`] did with a new cloud-config. Texts name fields and counts,
/// never values of the config.
#[derive(Debug, Clone, PartialEq)]
pub enum Reload {
    /// Nothing the provider uses changed (for example only comments or formatting).
    Unchanged,
    /// The change is in effect, without a restart; the text says what changed.
    Applied(String),
    /// Something changed that the provider reads only at start: it keeps running with the
    /// old configuration until the manager restarts. The text names what changed.
    RestartNeeded(String),
    /// The new cloud-config is invalid; the running configuration stays.
    Invalid(CloudError),
}

/// What a provider gets when the manager starts leading.
#[derive(Clone)]
pub struct InitContext {
    /// A client for the cluster, rate-limited like the controllers' own.
    pub client: kube::Client,
    /// Cancelled when the manager stops leading or shuts down; tasks the provider spawns must
    /// stop when it fires.
    pub shutdown: CancellationToken,
    /// The manager's metrics registry, for the provider's own series (register with
    /// `get_or_register`: `initialize` runs once per leadership term).
    pub metrics: std::sync::Arc<crate::metrics::Metrics>,
    /// The manager's event sink, for events on the objects the provider serves.
    pub events: crate::events::EventSink,
}

impl fmt::Debug for InitContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InitContext").finish_non_exhaustive()
    }
}

/// A cloud provider. Capabilities it lacks return `None`; the matching controllers then stay
/// off with a log line, and the manager keeps running.
#[async_trait]
pub trait CloudProvider: Send + Sync + 'static {
    /// The registered name, also used in log lines and metrics.
    fn name(&self) -> &str;

    /// Called once each time the manager starts leading, before any controller runs. May
    /// spawn tasks (caches, probes, extra controllers) that stop on `ctx.shutdown`.
    async fn initialize(&self, _ctx: InitContext) -> CloudResult<()> {
        Ok(())
    }

    /// Instance lookups (InstancesV2 semantics), used by the node and lifecycle controllers.
    fn instances(&self) -> Option<&dyn Instances> {
        None
    }

    /// Load balancers, used by the service controller.
    fn load_balancer(&self) -> Option<&dyn LoadBalancer> {
        None
    }

    /// Pod-network routes, used by the route controller.
    fn routes(&self) -> Option<&dyn Routes> {
        None
    }

    /// Deprecated zone lookups; no generic controller needs them when `instances` exists.
    fn zones(&self) -> Option<&dyn Zones> {
        None
    }

    /// Cluster listing; no generic controller calls it.
    fn clusters(&self) -> Option<&dyn Clusters> {
        None
    }

    /// Whether `call` only reads. The default follows the traits' meaning
    /// ([`Call::default_kind`]); a provider whose lookup has side effects (it tags, caches in
    /// the cloud, ...) says [`CallKind::Mutating`] for it, and shadow mode then refuses it.
    fn call_kind(&self, call: Call) -> CallKind {
        call.default_kind()
    }

    /// Whether the provider has the cluster ID it needs (upstream's `HasClusterID`).
    fn has_cluster_id(&self) -> bool {
        true
    }

    /// What the provider serves and which Service fields and annotations its load balancers
    /// honour (KEP-6128's report; served on `/capabilities`). The default reports the
    /// controllers it serves and nothing about the fields ([`Support::Unknown`]).
    ///
    /// [`Support::Unknown`]: crate::capabilities::Support::Unknown
    fn capabilities(&self) -> crate::capabilities::Capabilities {
        crate::capabilities::Capabilities {
            provider: self.name().to_string(),
            instances: self.instances().is_some(),
            routes: self.routes().is_some(),
            load_balancer: self.load_balancer().map(|_| crate::capabilities::LoadBalancerCapabilities::unreported()),
        }
    }

    /// A cheap probe of whether the provider can do its job (credentials, endpoint, config).
    async fn health(&self) -> Health {
        Health::healthy("")
    }

    /// Take a new cloud-config while running (the manager calls it when the file changes, the
    /// operator when the Secret does). Apply what can change in place and say so; the default
    /// applies nothing and asks for a restart. Must be cheap and bounded like the factory, and
    /// must change nothing when it does not return [`Reload::Applied`].
    fn reload(&self, _cloud_config: Option<&[u8]>) -> Reload {
        Reload::RestartNeeded(format!("provider {} reads its cloud-config only at start", self.name()))
    }

    /// The part of the cloud-config this provider was built from whose change needs a
    /// restart, as opaque bytes that only ever go into a hash (they may hold config values);
    /// `None`, the default, means all of it. The operator rolls the manager's pods (or
    /// restarts an embedded engine) only when this changes, and hands other edits to
    /// [`Self::reload`]. Must agree with it: a change outside these bytes must be reloadable.
    fn restart_fingerprint(&self) -> Option<Vec<u8>> {
        None
    }
}

impl fmt::Debug for dyn CloudProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CloudProvider").field("name", &self.name()).finish_non_exhaustive()
    }
}

/// What the cloud knows about a Node's instance.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct InstanceMetadata {
    /// Becomes `spec.providerID` when the Node has none. Must not be empty unless the Node
    /// already has one: a Node is never untainted without a providerID.
    pub provider_id: String,
    /// Becomes the `node.kubernetes.io/instance-type` label (and its beta copy) when non-empty.
    pub instance_type: String,
    /// Becomes `status.addresses`.
    pub node_addresses: Vec<NodeAddress>,
    /// Becomes the `topology.kubernetes.io/zone` label (and its beta copy) when non-empty.
    pub zone: String,
    /// Becomes the `topology.kubernetes.io/region` label (and its beta copy) when non-empty.
    pub region: String,
    /// Extra labels; keys in the `kubernetes.io` / `k8s.io` namespaces are dropped.
    pub additional_labels: BTreeMap<String, String>,
}

/// Instance lookups with InstancesV2 semantics. Implementations should look a Node up by
/// `spec.providerID` first and fall back to its name.
#[async_trait]
pub trait Instances: Send + Sync {
    /// Whether the Node's instance exists. `false` makes the lifecycle controller delete the
    /// Node, so return an error, never `false`, when unsure. A stopped instance exists.
    async fn instance_exists(&self, node: &Node) -> CloudResult<bool>;

    /// Whether the Node's instance is shut down.
    async fn instance_shutdown(&self, node: &Node) -> CloudResult<bool>;

    /// The instance's metadata, or `None` when the cloud does not know it (yet).
    async fn instance_metadata(&self, node: &Node) -> CloudResult<Option<InstanceMetadata>>;

    /// The most Nodes one batch call should carry. The default fan-out treats this as a
    /// hint; providers with a batch API return their API's page size.
    fn batch_size(&self) -> usize {
        100
    }

    /// How many single lookups the default batch methods run at once.
    fn batch_concurrency(&self) -> usize {
        10
    }

    /// [`Self::instance_metadata`] for many Nodes; results are in input order.
    async fn instances_metadata(&self, nodes: &[&Node]) -> Vec<CloudResult<Option<InstanceMetadata>>> {
        let limit = self.batch_concurrency().max(1);
        // Collect the (lazy) futures first: a closure held across the await trips the Send check.
        let calls: Vec<_> = nodes.iter().map(|n| self.instance_metadata(n)).collect();
        stream::iter(calls).buffered(limit).collect().await
    }

    /// [`Self::instance_exists`] for many Nodes; results are in input order.
    async fn instances_exist(&self, nodes: &[&Node]) -> Vec<CloudResult<bool>> {
        let limit = self.batch_concurrency().max(1);
        // Collect the (lazy) futures first: a closure held across the await trips the Send check.
        let calls: Vec<_> = nodes.iter().map(|n| self.instance_exists(n)).collect();
        stream::iter(calls).buffered(limit).collect().await
    }

    /// [`Self::instance_shutdown`] for many Nodes; results are in input order.
    async fn instances_shutdown(&self, nodes: &[&Node]) -> Vec<CloudResult<bool>> {
        let limit = self.batch_concurrency().max(1);
        // Collect the (lazy) futures first: a closure held across the await trips the Send check.
        let calls: Vec<_> = nodes.iter().map(|n| self.instance_shutdown(n)).collect();
        stream::iter(calls).buffered(limit).collect().await
    }
}

/// Load balancers for `type: LoadBalancer` Services. Every method gets the cluster name
/// (`--cluster-name`) and must treat the Service as read-only.
#[async_trait]
pub trait LoadBalancer: Send + Sync {
    /// The load balancer's status if this controller created one for the Service, `None` if
    /// there is none. Absence is never an error.
    async fn get_load_balancer(&self, cluster_name: &str, service: &Service)
    -> CloudResult<Option<LoadBalancerStatus>>;

    /// The cloud-side name of the Service's load balancer.
    fn load_balancer_name(&self, _cluster_name: &str, service: &Service) -> String {
        default_load_balancer_name(service)
    }

    /// Create or update the load balancer and return its status. May return
    /// [`CloudError::RetryAfter`] while the cloud works, or
    /// [`CloudError::ImplementedElsewhere`] to hand the Service to another controller.
    async fn ensure_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
        nodes: &[&Node],
    ) -> CloudResult<LoadBalancerStatus>;

    /// Update only the backend hosts.
    async fn update_load_balancer(&self, cluster_name: &str, service: &Service, nodes: &[&Node]) -> CloudResult<()>;

    /// Delete the load balancer; succeed when it is already gone. Must not return
    /// [`CloudError::ImplementedElsewhere`].
    async fn ensure_load_balancer_deleted(&self, cluster_name: &str, service: &Service) -> CloudResult<()>;

    /// Every cloud object that carries this cluster's ownership (made for a Service of this
    /// cluster), with the Service it names, for the orphan report (S34). Only objects this
    /// provider would delete with the Service's load balancer; never one without the cluster's
    /// ownership mark. The default, [`CloudError::NotImplemented`], reports "unsupported".
    async fn list_owned(&self, _cluster_name: &str) -> CloudResult<Vec<OwnedObject>> {
        Err(CloudError::NotImplemented)
    }

    /// Delete objects [`Self::list_owned`] returned that belong to no Service (S35); the
    /// provider orders the deletions (a load balancer before its target groups and security
    /// groups) and re-checks ownership before each. One result per object, in input order; an
    /// object already gone is a success. Never called in shadow mode.
    async fn delete_owned(&self, _cluster_name: &str, objects: &[OwnedObject]) -> Vec<CloudResult<()>> {
        objects.iter().map(|_| Err(CloudError::NotImplemented)).collect()
    }
}

/// A cloud object made for a Service of this cluster, as [`LoadBalancer::list_owned`] lists it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OwnedObject {
    /// What it is, in lower case: `load-balancer`, `target-group`, `security-group`,
    /// `address`, ...
    pub kind: String,
    /// Its cloud-side identity: a name, an ARN, an address.
    pub id: String,
    /// The Service (`namespace/name`) its ownership names; `None` when it names none (it is
    /// then an orphan as soon as nothing uses it).
    pub service: Option<String>,
    /// The UID of that Service, when the object records it.
    pub service_uid: Option<String>,
    /// The name of the load balancer it is or belongs to, when that name is derived from the
    /// Service ([`LoadBalancer::load_balancer_name`]): a Service of the same name whose load
    /// balancer is named otherwise is a later object, so this one is an orphan.
    pub load_balancer: Option<String>,
}

impl OwnedObject {
    /// An object of `kind` with `id`, made for `service`.
    pub fn new(kind: &str, id: &str, service: Option<String>) -> Self {
        Self { kind: kind.to_string(), id: id.to_string(), service, service_uid: None, load_balancer: None }
    }
}

/// Upstream's default load-balancer name: `a` + the Service UID without dashes, at most 32
/// characters.
pub fn default_load_balancer_name(service: &Service) -> String {
    let uid = service.metadata.uid.as_deref().unwrap_or_default().replace('-', "");
    let mut name = format!("a{uid}");
    name.truncate(32);
    name
}

/// A pod-network route in the cloud.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Route {
    /// The cloud-side name; ignored on create.
    pub name: String,
    /// Name of the Node the route points at.
    pub target_node: String,
    /// Whether `target_node_addresses` is meaningful for this provider.
    pub enable_node_addresses: bool,
    /// The target Node's addresses (when `enable_node_addresses`).
    pub target_node_addresses: Vec<NodeAddress>,
    /// The pod CIDR.
    pub destination_cidr: String,
    /// A route whose target is gone; blackholes inside the cluster CIDR are deleted.
    pub blackhole: bool,
}

/// Pod-network routes.
#[async_trait]
pub trait Routes: Send + Sync {
    /// The routes this cluster manages.
    async fn list_routes(&self, cluster_name: &str) -> CloudResult<Vec<Route>>;
    /// Create a route; `name_hint` is the Node's UID.
    async fn create_route(&self, cluster_name: &str, name_hint: &str, route: &Route) -> CloudResult<()>;
    /// Delete a route returned by [`Self::list_routes`].
    async fn delete_route(&self, cluster_name: &str, route: &Route) -> CloudResult<()>;
}

/// A failure domain.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Zone {
    /// The zone.
    pub failure_domain: String,
    /// The region.
    pub region: String,
}

/// Deprecated zone lookups (kept for providers ported from upstream).
#[async_trait]
pub trait Zones: Send + Sync {
    /// The zone of an instance by providerID.
    async fn zone_by_provider_id(&self, provider_id: &str) -> CloudResult<Option<Zone>>;
    /// The zone of an instance by Node name.
    async fn zone_by_node_name(&self, node_name: &str) -> CloudResult<Option<Zone>>;
}

/// Cluster listing.
#[async_trait]
pub trait Clusters: Send + Sync {
    /// Names of the clusters the cloud knows.
    async fn list_clusters(&self) -> CloudResult<Vec<String>>;
    /// The control-plane address of a cluster.
    async fn master(&self, cluster_name: &str) -> CloudResult<String>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    struct Slow {
        in_flight: AtomicUsize,
        peak: AtomicUsize,
        calls: AtomicUsize,
    }

    #[async_trait]
    impl Instances for Slow {
        async fn instance_exists(&self, node: &Node) -> CloudResult<bool> {
            let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            self.peak.fetch_max(now, Ordering::SeqCst);
            self.calls.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(5)).await;
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            // Odd-numbered nodes "do not exist", so order is observable.
            Ok(!node.metadata.name.as_deref().unwrap_or_default().ends_with(['1', '3', '5', '7', '9']))
        }
        async fn instance_shutdown(&self, _: &Node) -> CloudResult<bool> {
            Err(CloudError::NotImplemented)
        }
        async fn instance_metadata(&self, _: &Node) -> CloudResult<Option<InstanceMetadata>> {
            Ok(None)
        }
        fn batch_concurrency(&self) -> usize {
            3
        }
    }

    fn node(name: &str) -> Node {
        Node { metadata: kube::api::ObjectMeta { name: Some(name.into()), ..Default::default() }, ..Default::default() }
    }

    #[tokio::test]
    async fn default_batch_fans_out_with_bounded_concurrency_in_input_order() {
        let p = Slow { in_flight: AtomicUsize::new(0), peak: AtomicUsize::new(0), calls: AtomicUsize::new(0) };
        let nodes: Vec<Node> = (0..20).map(|i| node(&format!("n{i}"))).collect();
        let refs: Vec<&Node> = nodes.iter().collect();
        let results = p.instances_exist(&refs).await;
        assert_eq!(p.calls.load(Ordering::SeqCst), 20);
        assert_eq!(p.peak.load(Ordering::SeqCst), 3, "at most batch_concurrency calls in flight");
        let got: Vec<bool> = results.into_iter().map(|r| r.unwrap()).collect();
        let want: Vec<bool> = (0..20).map(|i| i % 2 == 0).collect();
        assert_eq!(got, want);
    }

    #[tokio::test]
    async fn default_batch_keeps_per_node_errors() {
        let p = Slow { in_flight: AtomicUsize::new(0), peak: AtomicUsize::new(0), calls: AtomicUsize::new(0) };
        let nodes = [node("a"), node("b")];
        let results = p.instances_shutdown(&[&nodes[0], &nodes[1]]).await;
        assert!(results.iter().all(|r| matches!(r, Err(CloudError::NotImplemented))));
    }

    #[test]
    fn errors_are_matched_structurally_and_expose_their_delay() {
        let e = CloudError::retry_after(Duration::from_secs(15), "load balancer is being created");
        assert!(matches!(e, CloudError::RetryAfter { .. }));
        assert_eq!(e.requested_delay(), Some(Duration::from_secs(15)));
        assert_eq!(e.kind(), "retry_after");
        assert!(e.to_string().contains("being created"));
        let t = CloudError::Throttled { retry_after: None, message: "429".into() };
        assert_eq!(t.requested_delay(), None);
        assert_eq!(CloudError::ImplementedElsewhere.kind(), "implemented_elsewhere");
    }

    #[test]
    fn default_load_balancer_name_matches_upstream() {
        let mut svc = Service::default();
        svc.metadata.uid = Some("8f2c1b9e-3c4d-4e5f-9a8b-7c6d5e4f3a2b".into());
        let name = default_load_balancer_name(&svc);
        assert_eq!(name, "a8f2c1b9e3c4d4e5f9a8b7c6d5e4f3a2");
        assert_eq!(name.len(), 32);
    }

    #[test]
    fn lookups_are_reads_and_ensure_update_create_delete_are_mutating_by_default() {
        use Call::*;
        for call in [Health, InstanceExists, InstanceShutdown, InstanceMetadata, GetLoadBalancer, ListRoutes] {
            assert_eq!(call.default_kind(), CallKind::Read, "{call}");
        }
        for call in
            [Initialize, EnsureLoadBalancer, UpdateLoadBalancer, EnsureLoadBalancerDeleted, CreateRoute, DeleteRoute]
        {
            assert_eq!(call.default_kind(), CallKind::Mutating, "{call}");
        }
        let refused = CloudError::RefusedInShadowMode { call: EnsureLoadBalancer };
        assert_eq!(refused.kind(), "refused_in_shadow_mode");
        assert!(refused.to_string().contains("ensure_load_balancer"), "{refused}");
    }

    #[test]
    fn a_refusal_is_matched_by_reason_and_its_message_is_bounded() {
        let e = CloudError::refused(Refusal::PoolExhausted, "pool default: 0 of 254 IPv4 addresses free");
        assert!(matches!(e, CloudError::Refused { reason: Refusal::PoolExhausted, .. }));
        assert_eq!(e.kind(), "refused");
        assert_eq!(e.requested_delay(), None, "backoff, not a fixed delay");
        assert_eq!(e.to_string(), "PoolExhausted: pool default: 0 of 254 IPv4 addresses free");
        let long = CloudError::refused(Refusal::InvalidAnnotation, "é".repeat(MAX_REFUSAL_MESSAGE_BYTES));
        let CloudError::Refused { message, .. } = long else { panic!("a refusal") };
        assert!(message.len() <= MAX_REFUSAL_MESSAGE_BYTES && message.len() > MAX_REFUSAL_MESSAGE_BYTES - 2);
        let reasons: Vec<&str> = Refusal::ALL.iter().map(|r| r.reason()).collect();
        assert_eq!(reasons, refusal_reasons::ALL, "one reason per refusal, in the same order");
    }

    #[test]
    fn health_exposes_reason_and_message() {
        let h = Health::unhealthy(health_reasons::CREDENTIALS_REJECTED, "401 from the API");
        assert!(!h.is_healthy());
        assert_eq!(h.reason(), "CredentialsRejected");
        assert_eq!(h.message(), "401 from the API");
        assert_eq!(Health::healthy("ok").reason(), "Healthy");
    }
}
