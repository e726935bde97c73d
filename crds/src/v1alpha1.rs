//! `CloudControllerManager`, API group `ccm.rs`, version `v1alpha1`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ResourceRequirements, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::core::Duration;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::controllers;

/// The API group of every resource in this crate.
pub const GROUP: &str = "ccm.rs";
/// The API version of this module's types.
pub const VERSION: &str = "v1alpha1";
/// The default key of the cloud-config inside its Secret.
pub const DEFAULT_CLOUD_CONFIG_KEY: &str = "cloud.conf";

/// The CEL message when `handleUnclassedServices` is set without a class.
pub const HANDLE_UNCLASSED_MESSAGE: &str =
    "handleUnclassedServices needs loadBalancerClass: without a class the manager already handles Services without one";

/// The CEL message when a `nodePlatforms` entry is not a platform name.
pub const NODE_PLATFORMS_MESSAGE: &str = "every entry must be a platform name, the scheme of a providerID such as aws or gce: a letter, then letters, digits, '+', '-' or '.'";

/// The CEL rule of `nodePlatforms` (the same test as [`crate::validation::is_platform_name`]).
pub const NODE_PLATFORMS_RULE: &str = "self.all(p, p.matches('^[a-zA-Z][a-zA-Z0-9+.-]*$'))";

/// The CEL message when `orphans.sweep` is set on a shadow manager.
pub const SWEEP_IN_SHADOW_MESSAGE: &str =
    "orphans.sweep deletes cloud objects, which a shadow manager never does: turn off shadow or sweep";

/// Desired state of a cloud-controller-manager for one cloud provider.
// Clippy reads printcolumns of the same `type_` as one attribute repeated.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "ccm.rs",
    version = "v1alpha1",
    kind = "CloudControllerManager",
    plural = "cloudcontrollermanagers",
    shortname = "ccm",
    category = "cloud",
    namespaced,
    status = "CloudControllerManagerStatus",
    derive = "PartialEq",
    doc = "Runs a cloud-controller-manager for one cloud provider: node initialization, node lifecycle, load balancers and routes.",
    printcolumn(name = "Provider", type_ = "string", json_path = ".spec.provider"),
    printcolumn(name = "Mode", type_ = "string", json_path = ".spec.mode"),
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status"),
    printcolumn(
        name = "ProviderHealthy",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"ProviderHealthy\")].status"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[cfg_attr(test, kube(cel))]
#[x_kube(validation = kube::core::Rule::new("!has(self.handleUnclassedServices) || !self.handleUnclassedServices || has(self.loadBalancerClass)").message(HANDLE_UNCLASSED_MESSAGE).field_path(".handleUnclassedServices"))]
#[x_kube(validation = kube::core::Rule::new("!has(self.orphans) || !has(self.orphans.sweep) || !self.orphans.sweep || !has(self.shadow) || !self.shadow").message(SWEEP_IN_SHADOW_MESSAGE).field_path(".orphans.sweep"))]
#[serde(rename_all = "camelCase")]
pub struct CloudControllerManagerSpec {
    /// Name of a registered cloud provider (for example `baremetal`). Immutable.
    #[schemars(length(min = 1, max = 63))]
    #[x_kube(validation = kube::core::Rule::new("self == oldSelf").message("provider is immutable; create a new CloudControllerManager instead"))]
    pub provider: String,

    /// Where the provider's cloud-config comes from. Optional: some providers need none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cloud_config: Option<CloudConfigSource>,

    /// Shadow mode: the manager decides without acting (no write to Nodes, Services or routes,
    /// only cloud reads) and reports where its decisions differ from what is there, in the
    /// `ShadowAgrees` condition and `status.shadow` (docs/shadow.md).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shadow: bool,

    /// Controllers to run, in upstream `--controllers` syntax: `*`, a name or alias, or
    /// `-name` to disable; the first entry naming a controller wins.
    #[serde(default = "default_controllers")]
    #[schemars(length(max = 16))]
    #[x_kube(validation = kube::core::Rule::new(controllers_rule()).message(controllers_message().as_str()))]
    pub controllers: Vec<String>,

    /// How the manager runs: `Deployment`, `DaemonSet` or `Embedded` (inside the operator).
    #[serde(default)]
    pub mode: Mode,

    /// Cluster name handed to the provider's load-balancer and route calls.
    #[serde(default = "default_cluster_name")]
    #[schemars(length(min = 1, max = 253))]
    pub cluster_name: String,

    /// Pod network CIDRs, comma-separated, at most one per IP family. Needed for routes.
    #[serde(default, rename = "clusterCIDR", skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128))]
    #[x_kube(validation = kube::core::Rule::new("self.split(',').size() <= 2").message("at most two CIDRs, one per IP family"))]
    #[x_kube(validation = kube::core::Rule::new("self.split(',').all(c, isCIDR(c.trim()))").message("every entry must be a CIDR such as 10.244.0.0/16"))]
    #[x_kube(validation = kube::core::Rule::new(
        "self.split(',').size() != 2 || !self.split(',').all(c, isCIDR(c.trim())) || cidr(self.split(',')[0].trim()).ip().family() != cidr(self.split(',')[1].trim()).ip().family()"
    ).message("two CIDRs must be of different IP families"))]
    pub cluster_cidr: Option<String>,

    /// Whether the route controller programs pod-network routes (when the provider can).
    #[serde(default = "default_true")]
    pub configure_cloud_routes: bool,

    /// Only handle Services with exactly this `spec.loadBalancerClass` (unset: unclassed ones).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub load_balancer_class: Option<String>,

    /// With `loadBalancerClass`, also handle Services that have no `spec.loadBalancerClass`, as
    /// an unclassed manager would (upstream's service controller takes exactly those). Needs
    /// `loadBalancerClass`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub handle_unclassed_services: bool,

    /// The platforms whose Nodes this manager owns (`--cloud-provider-platforms`, KEP-5778's
    /// proposed node ownership): each the scheme of a providerID (`aws` owns `aws:///...`).
    /// Other platforms' Nodes are never initialized, deleted, tainted or routed by it, and two
    /// resources whose platforms are disjoint may both run the Node and route controllers.
    /// Empty: every Node, as upstream.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8), inner(length(max = 63)))]
    #[x_kube(validation = kube::core::Rule::new(NODE_PLATFORMS_RULE).message(NODE_PLATFORMS_MESSAGE))]
    pub node_platforms: Vec<String>,

    /// Cloud objects that carry this cluster's ownership and belong to no Service (load
    /// balancers left by a Service deleted while no manager ran): always reported in
    /// `status.orphans`; deleted only with `sweep: true` (`--orphan-sweep`, docs/orphans.md).
    #[serde(default, skip_serializing_if = "Orphans::is_default")]
    pub orphans: Orphans,

    /// Leader election timings of the manager replicas.
    #[serde(default)]
    pub leader_election: LeaderElection,

    /// Worker counts of the controllers.
    #[serde(default)]
    pub concurrency: Concurrency,

    /// Workload settings for `Deployment` and `DaemonSet` modes; ignored when `Embedded`.
    #[serde(default)]
    pub deployment: DeploymentSettings,

    /// Per-node announcers of the `baremetal` provider's addresses (docs/l2-announcement.md): a
    /// DaemonSet answering ARP/NDP (`l2`) and, with `bgp`, a BIRD sidecar advertising them. The
    /// operator must allow it (the chart's `announcer.enabled`); Deployment and DaemonSet modes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub announcer: Option<Announcer>,

    /// Run an upstream cloud-controller-manager image instead of this project's manager
    /// (docs/profiles/README.md): a profile says which image, command, flags and cloud-config it
    /// takes. Deployment and DaemonSet modes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream: Option<UpstreamManager>,

    /// Extra arguments appended to the manager's command line.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(max = 4096)))]
    pub extra_args: Vec<String>,

    /// Stop changing the workload; status is still kept current.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
}

/// How the manager runs.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, schemars::JsonSchema)]
pub enum Mode {
    /// A Deployment with leader election between its replicas.
    #[default]
    Deployment,
    /// One manager pod per control-plane node, with leader election between them.
    DaemonSet,
    /// The operator runs the controllers in its own pod.
    Embedded,
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Mode::Deployment => "Deployment",
            Mode::DaemonSet => "DaemonSet",
            Mode::Embedded => "Embedded",
        })
    }
}

/// Source of the provider's cloud-config.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new("!has(self.credentialsKey) || self.credentialsKey != self.secretRef.key").message("credentialsKey must name another key than secretRef.key").field_path(".credentialsKey"))]
#[x_kube(validation = kube::core::Rule::new("!has(self.caBundleKey) || (self.caBundleKey != self.secretRef.key && (!has(self.credentialsKey) || self.caBundleKey != self.credentialsKey))").message("caBundleKey must name another key than secretRef.key and credentialsKey").field_path(".caBundleKey"))]
pub struct CloudConfigSource {
    /// A key of a Secret in the same namespace as the CloudControllerManager.
    pub secret_ref: SecretKeyRef,
    /// Another key of the same Secret holding the cloud's credentials as a file, mounted beside
    /// the cloud-config: an AWS shared credentials file for `aws` (`AWS_SHARED_CREDENTIALS_FILE`),
    /// a service-account key for the `gcp` profile (`GOOGLE_APPLICATION_CREDENTIALS`). Other
    /// providers take their credentials in the cloud-config itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253), regex(pattern = r"^[-._a-zA-Z0-9]+$"))]
    pub credentials_key: Option<String>,
    /// Another key of the same Secret holding PEM CA certificates the manager trusts instead of
    /// its image's (a private cloud's endpoints): mounted beside the cloud-config and named by
    /// `SSL_CERT_FILE`, which Go's and this project's TLS stacks read; a cloud-config can also
    /// point at the file (OpenStack's and vSphere's `ca-file`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253), regex(pattern = r"^[-._a-zA-Z0-9]+$"))]
    pub ca_bundle_key: Option<String>,
}

impl CloudConfigSource {
    /// The keys mounted beside the cloud-config: `credentialsKey`, then `caBundleKey`.
    pub fn extra_keys(&self) -> Vec<&str> {
        [&self.credentials_key, &self.ca_bundle_key].into_iter().flatten().map(String::as_str).collect()
    }
}

/// A key in a Secret of the resource's own namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    /// Name of the Secret.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Key inside the Secret's data.
    #[serde(default = "default_cloud_config_key")]
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

/// Leader election timings (Go duration strings such as `15s`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new(
    "duration(self.leaseDuration) > duration(self.renewDeadline) && duration(self.renewDeadline) > duration(self.retryPeriod) && duration(self.retryPeriod) > duration('0s')"
).message("leaseDuration must be greater than renewDeadline, which must be greater than retryPeriod, which must be positive"))]
pub struct LeaderElection {
    /// How long a lease is valid without renewal; a standby waits this long after a crash.
    #[serde(default = "default_lease_duration", deserialize_with = "go_duration::deserialize")]
    #[schemars(length(max = 32))]
    pub lease_duration: Duration,
    /// How long the leader keeps trying to renew before it steps down.
    #[serde(default = "default_renew_deadline", deserialize_with = "go_duration::deserialize")]
    #[schemars(length(max = 32))]
    pub renew_deadline: Duration,
    /// How often candidates retry acquiring or renewing.
    #[serde(default = "default_retry_period", deserialize_with = "go_duration::deserialize")]
    #[schemars(length(max = 32))]
    pub retry_period: Duration,
    /// Leader migration (upstream's `--enable-leader-migration`): hand controllers over between
    /// two managers, upstream's or this one, through a second Lease (in this namespace unless
    /// `migration.leaseNamespace` says otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub migration: Option<LeaderMigration>,
}

impl Default for LeaderElection {
    fn default() -> Self {
        Self {
            lease_duration: default_lease_duration(),
            renew_deadline: default_renew_deadline(),
            retry_period: default_retry_period(),
            migration: None,
        }
    }
}

/// The most `spec.leaderElection.migration.controllerLeaders` entries.
pub const MAX_CONTROLLER_LEADERS: usize = 16;

/// Leader migration: the `LeaderMigrationConfiguration` of upstream's
/// `--leader-migration-config`. Without `leaderName` and `controllerLeaders`, upstream's
/// default: Lease `cloud-provider-extraction-migration` for `route`, `service` and
/// `cloud-node-lifecycle`, any component.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct LeaderMigration {
    /// Turn leader migration on.
    #[serde(default)]
    pub enabled: bool,
    /// Name of the migration Lease, in `leaseNamespace` (default
    /// `cloud-provider-extraction-migration`). Every manager taking part must use the same.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = kube::core::Rule::new("self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')").message("leaderName must be a valid Lease name (lowercase letters, digits, '-' and '.')"))]
    pub leader_name: Option<String>,
    /// Namespace of the migration Lease (default: this resource's namespace). Set it to move a
    /// manager to a new namespace: both resources name the same Lease here. Must be a namespace
    /// the operator serves; the manager is granted that one Lease there and nothing else.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    #[x_kube(validation = kube::core::Rule::new("self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')").message("leaseNamespace must be a namespace name (lowercase letters, digits and '-', at most 63 characters)"))]
    pub lease_namespace: Option<String>,
    /// Controllers under migration and the component that runs each (`cloud-controller-manager`
    /// or `*` for this manager). Controllers not named run under the main Lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    #[x_kube(validation = kube::core::Rule::new("self.all(x, self.exists_one(y, y.name == x.name))").message("controllerLeaders: each name may appear once"))]
    pub controller_leaders: Option<Vec<ControllerLeader>>,
}

/// One controller under migration.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ControllerLeader {
    /// The controller: a name or alias of this manager's controllers, or another component's.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// The component that runs it: `cloud-controller-manager` or `*` (this manager), or
    /// another (e.g. `kube-controller-manager`: it then does not run here).
    #[schemars(length(min = 1, max = 253))]
    pub component: String,
}

/// What the manager does with orphaned cloud objects (`spec.orphans`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct Orphans {
    /// Delete orphans (`--orphan-sweep`): an object found orphaned by two scans in a row, that
    /// carries this cluster's ownership. Off: they are only reported. Not with `shadow`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub sweep: bool,
}

impl Orphans {
    /// Whether nothing is set (the field is then left out).
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

/// Worker counts; each must be at least 1.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct Concurrency {
    /// `--concurrent-node-syncs`: cloud-node workers.
    #[serde(default = "default_node_syncs")]
    #[schemars(range(min = 1))]
    #[x_kube(validation = kube::core::Rule::new("self >= 1").message("must be at least 1"))]
    pub node_syncs: i32,
    /// `--concurrent-service-syncs`: load-balancer calls of service syncs in flight (S29).
    #[serde(default = "default_service_syncs")]
    #[schemars(range(min = 1))]
    #[x_kube(validation = kube::core::Rule::new("self >= 1").message("must be at least 1"))]
    pub service_syncs: i32,
    /// `--concurrent-route-syncs`: route workers.
    #[serde(default = "default_route_syncs")]
    #[schemars(range(min = 1))]
    #[x_kube(validation = kube::core::Rule::new("self >= 1").message("must be at least 1"))]
    pub route_syncs: i32,
}

impl Default for Concurrency {
    fn default() -> Self {
        Self {
            node_syncs: default_node_syncs(),
            service_syncs: default_service_syncs(),
            route_syncs: default_route_syncs(),
        }
    }
}

/// Settings of the manager workload (Deployment and DaemonSet modes).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeploymentSettings {
    /// Manager replicas (Deployment mode); more than one runs leader election.
    #[serde(default = "default_replicas")]
    #[schemars(range(min = 1))]
    #[x_kube(validation = kube::core::Rule::new("self >= 1").message("must be at least 1"))]
    pub replicas: i32,
    /// Manager image; defaults to the operator's `--manager-image`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub image: Option<String>,
    /// Image pull policy of the manager container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<PullPolicy>,
    /// Resource requests and limits of the manager container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Node selector of the manager pods (DaemonSet mode defaults to control-plane nodes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("maxProperties" = 32))]
    pub node_selector: Option<BTreeMap<String, String>>,
    /// Tolerations added to the defaults (uninitialized, not-ready, unreachable, control-plane).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub tolerations: Option<Vec<Toleration>>,
    /// Priority class of the manager pods.
    #[serde(default = "default_priority_class")]
    #[schemars(length(max = 253))]
    pub priority_class_name: String,
    /// Run on the host network, so the manager works before the pod network does. Turn it off
    /// only when the pod network and the API server's Service address work without this
    /// manager (see docs/security.md); the pod then passes the `restricted` Pod Security profile.
    #[serde(default = "default_true")]
    pub host_network: bool,
}

impl Default for DeploymentSettings {
    fn default() -> Self {
        Self {
            replicas: default_replicas(),
            image: None,
            image_pull_policy: None,
            resources: None,
            node_selector: None,
            tolerations: None,
            priority_class_name: default_priority_class(),
            host_network: true,
        }
    }
}

/// The message when an announcer announces nothing.
pub const ANNOUNCER_NOTHING_MESSAGE: &str = "announcer: set l2, bgp or both to true";
/// The message when BIRD options are set without the BIRD sidecar.
pub const ANNOUNCER_BIRD_OPTIONS_MESSAGE: &str =
    "announcer: bfd and gracefulRestart configure the BIRD sidecar: set bgp to true";

/// The per-node announcer DaemonSet of the `baremetal` provider. Which interfaces and peers it
/// uses comes from the cloud-config's `loadBalancer.announcement`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new("self.l2 || self.bgp").message(ANNOUNCER_NOTHING_MESSAGE))]
#[x_kube(validation = kube::core::Rule::new("self.bgp || !(self.bfd || self.gracefulRestart)").message(ANNOUNCER_BIRD_OPTIONS_MESSAGE))]
pub struct Announcer {
    /// Answer ARP and NDP for the addresses (`loadBalancer.announcement.l2`): the announcer
    /// container gets `NET_RAW`, its only capability.
    #[serde(default = "default_true")]
    pub l2: bool,
    /// Advertise the addresses over BGP (`loadBalancer.announcement.bgp`) through a BIRD
    /// sidecar (non-root, no capability, unless `bfd`), from the image the operator is configured
    /// with.
    #[serde(default)]
    pub bgp: bool,
    /// Nodes that announce (default: every node; the announcers tolerate every taint).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("maxProperties" = 32))]
    pub node_selector: Option<BTreeMap<String, String>>,
    /// Serve the announcers' metrics on this port of each Node's address (HTTPS, bearer tokens
    /// checked with TokenReview and SubjectAccessReview: `get` on the non-resource URL
    /// `/metrics`). Default: no endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1024, max = 65535))]
    pub metrics_port: Option<i32>,
    /// Give the BIRD sidecar `NET_RAW`, which BIRD needs for BFD (it marks BFD packets with
    /// `SO_PRIORITY` 7; Linux 5.17 and later accept `NET_RAW` for that). Set it when a peer has
    /// `bfd` in the cloud-config; without it BGP works and BFD stays down. Needs `bgp`.
    #[serde(default)]
    pub bfd: bool,
    /// Stop the BIRD sidecar with `birdc graceful restart` (a `preStop` hook) and start it in
    /// graceful-restart recovery (`bird -R`), so a router keeps this Node's routes while its
    /// announcer Pod is replaced. Set it when peers have `gracefulRestart`. Needs `bgp`.
    #[serde(default)]
    pub graceful_restart: bool,
}

impl Default for Announcer {
    fn default() -> Self {
        Self { l2: true, bgp: false, node_selector: None, metrics_port: None, bfd: false, graceful_restart: false }
    }
}

/// An upstream cloud-controller-manager run from its own image (`spec.upstream`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct UpstreamManager {
    /// Which cloud's CCM: its image, command, `--cloud-provider` name and cloud-config form.
    /// `generic` runs `spec.deployment.image` with its own entrypoint.
    pub profile: UpstreamProfile,
    /// The profile's per-node manager (Azure's cloud-node-manager), which initializes Nodes in
    /// place of the CCM's cloud-node controller: a DaemonSet on every Node while the resource's
    /// controllers include `cloud-node`. Only profiles that have one take it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_manager: Option<UpstreamNodeManager>,
}

/// `spec.upstream.nodeManager`: whether and what the profile's per-node manager runs.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct UpstreamNodeManager {
    /// Run it (default). `false` keeps the cloud-node controller in the CCM, for a cluster
    /// that runs the node manager itself or needs none.
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// Its image; default: the profile's pinned release. Keep its minor version the CCM's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub image: Option<String>,
}

/// The upstream CCMs the operator knows how to run (docs/profiles/).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum UpstreamProfile {
    /// kubernetes/cloud-provider-aws.
    Aws,
    /// kubernetes/cloud-provider-gcp.
    Gcp,
    /// kubernetes-sigs/cloud-provider-azure.
    Azure,
    /// kubernetes/cloud-provider-openstack.
    Openstack,
    /// hetznercloud/hcloud-cloud-controller-manager.
    Hetzner,
    /// kubernetes/cloud-provider-vsphere.
    Vsphere,
    /// digitalocean/digitalocean-cloud-controller-manager.
    Digitalocean,
    /// oracle/oci-cloud-controller-manager.
    Oracle,
    /// kubernetes-sigs/cloud-provider-kind.
    Kind,
    /// Any image built on `k8s.io/cloud-provider`'s app: upstream flags, its own entrypoint.
    Generic,
}

impl UpstreamProfile {
    /// Every profile, in documentation order.
    pub const ALL: [UpstreamProfile; 10] = [
        UpstreamProfile::Aws,
        UpstreamProfile::Gcp,
        UpstreamProfile::Azure,
        UpstreamProfile::Openstack,
        UpstreamProfile::Hetzner,
        UpstreamProfile::Vsphere,
        UpstreamProfile::Digitalocean,
        UpstreamProfile::Oracle,
        UpstreamProfile::Kind,
        UpstreamProfile::Generic,
    ];

    /// The name as written in `spec.upstream.profile`.
    pub fn as_str(self) -> &'static str {
        match self {
            UpstreamProfile::Aws => "aws",
            UpstreamProfile::Gcp => "gcp",
            UpstreamProfile::Azure => "azure",
            UpstreamProfile::Openstack => "openstack",
            UpstreamProfile::Hetzner => "hetzner",
            UpstreamProfile::Vsphere => "vsphere",
            UpstreamProfile::Digitalocean => "digitalocean",
            UpstreamProfile::Oracle => "oracle",
            UpstreamProfile::Kind => "kind",
            UpstreamProfile::Generic => "generic",
        }
    }
}

/// Container image pull policy.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, schemars::JsonSchema)]
pub enum PullPolicy {
    /// Always pull.
    Always,
    /// Pull when the image is not on the node.
    IfNotPresent,
    /// Never pull.
    Never,
}

impl PullPolicy {
    /// The Kubernetes string form.
    pub fn as_str(self) -> &'static str {
        match self {
            PullPolicy::Always => "Always",
            PullPolicy::IfNotPresent => "IfNotPresent",
            PullPolicy::Never => "Never",
        }
    }
}

/// What a manager in shadow mode found (docs/shadow.md); written by the manager.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ShadowReport {
    /// Differences in all.
    pub total: i64,
    /// Objects that differ.
    pub objects: i64,
    /// Controllers that have not finished their first comparison.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub pending: Vec<String>,
    /// Differences by controller and kind.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub counts: Vec<ShadowCount>,
    /// The first differences, in controller and object order (at most 20).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 20))]
    pub differences: Vec<ShadowDifference>,
}

/// A count of differences of one kind from one controller.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ShadowCount {
    /// The controller.
    pub controller: String,
    /// The kind of difference (`would-patch`, `differs`, `would-create-load-balancer`, ...).
    pub kind: String,
    /// How many.
    pub count: i64,
}

/// One decision the manager would act on.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ShadowDifference {
    /// The controller.
    pub controller: String,
    /// The kind of difference.
    pub kind: String,
    /// `Kind/name` or `Kind/namespace/name` (routes: `Route/<node>/<CIDR>`).
    pub object: String,
    /// The fields concerned and this manager's value (at most 16).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub fields: Vec<ShadowField>,
}

/// A field and the value this manager would give it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ShadowField {
    /// The field path, for example `metadata.labels[topology.kubernetes.io/zone]`.
    pub path: String,
    /// This manager's value; empty for a removal.
    #[serde(default)]
    pub ours: String,
}

/// The orphan report (written by the manager's leader, `status.orphans`): cloud objects that
/// carry this cluster's ownership and belong to no existing Service.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct OrphanReport {
    /// Whether the provider lists what it owns; false: nothing can be reported.
    pub supported: bool,
    /// Whether orphans are deleted (`spec.orphans.sweep`).
    #[serde(default)]
    pub sweep: bool,
    /// Orphans found by the last scan.
    pub total: i64,
    /// Orphans by kind.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub counts: Vec<OrphanCount>,
    /// The first orphans, by kind and identity (at most 20).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 20))]
    pub objects: Vec<OrphanObject>,
    /// Orphans deleted since the manager started leading.
    #[serde(default)]
    pub deleted: i64,
    /// Deletions that failed since the manager started leading (retried on the next scan).
    #[serde(default)]
    pub failed: i64,
}

/// How many orphans of one kind.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct OrphanCount {
    /// `load-balancer`, `target-group`, `security-group`, `address`, ...
    pub kind: String,
    /// How many.
    pub count: i64,
}

/// One orphaned cloud object.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct OrphanObject {
    /// Its kind.
    pub kind: String,
    /// Its cloud-side identity (a name, an ARN, an address).
    pub id: String,
    /// The Service (`namespace/name`) its ownership names, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
}

/// Observed state, written by the operator (and `ProviderHealthy` by the manager).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct CloudControllerManagerStatus {
    /// The `metadata.generation` this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Conditions, one per type: Ready, ConfigValid, Available, Progressing, Degraded, ProviderHealthy.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = kube::core::ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
    /// The provider being run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// The mode being run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<Mode>,
    /// Canonical names of the enabled controllers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub controllers: Option<Vec<String>>,
    /// Manager replicas that exist.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// Manager replicas that are ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_replicas: Option<i32>,
    /// Holder identity of the manager's leader-election Lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader: Option<String>,
    /// The manager the leader runs, which holds every controller in `controllers` (with leader
    /// migration, those the migration Lease moves are its holder's): `cloud-controller-manager`
    /// (this project's), `upstream/<profile>` (`spec.upstream`), or `embedded`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader_manager: Option<String>,
    /// With leader migration: the migration Lease and its holder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub migration_lease: Option<MigrationLeaseStatus>,
    /// Shadow mode only: what the manager would do differently (written by the manager).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shadow: Option<ShadowReport>,
    /// Orphaned cloud objects, when the service controller runs (written by the manager).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub orphans: Option<OrphanReport>,
    /// With `spec.announcer`: its DaemonSet's Pods, as the DaemonSet controller counts them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub announcers: Option<NodePodsStatus>,
    /// While an upstream profile's node manager runs (`spec.upstream.nodeManager`): its
    /// DaemonSet's Pods, likewise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_managers: Option<NodePodsStatus>,
}

/// The Pods of a per-node DaemonSet (announcers, node managers).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodePodsStatus {
    /// Nodes that should run one.
    pub desired: i32,
    /// Its Pods that are ready.
    pub ready: i32,
    /// Its Pods running the current template.
    pub updated: i32,
}

/// The leader-migration Lease a manager takes part in.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct MigrationLeaseStatus {
    /// The Lease's namespace (`spec.leaderElection.migration.leaseNamespace`, or this one).
    pub namespace: String,
    /// The Lease's name (`spec.leaderElection.migration.leaderName`).
    pub name: String,
    /// Its holder identity while it is renewed (this manager's or another's); absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
}

/// Deserializing Go duration strings with a message that names the expected form and never
/// quotes the value.
mod go_duration {
    use kube::core::Duration;
    use serde::{Deserialize, Deserializer, de::Error};

    /// The CRD's maxLength of a duration string.
    pub const MAX_LENGTH: usize = 32;
    /// The message of an unparsable duration.
    pub const INVALID: &str = "invalid duration; expected a Go duration such as 15s or 1m30s";

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        let s = String::deserialize(deserializer)?;
        if s.chars().count() > MAX_LENGTH {
            return Err(D::Error::custom(format!("Too long: may not be more than {MAX_LENGTH} bytes")));
        }
        // Go's time.ParseDuration accepts a bare zero.
        if s == "0" {
            return Ok(std::time::Duration::ZERO.into());
        }
        if s.is_empty() {
            return Err(D::Error::custom(INVALID));
        }
        s.parse::<Duration>().map_err(|_| D::Error::custom(INVALID))
    }
}

/// The message of an unparsable duration field.
pub const INVALID_DURATION: &str = go_duration::INVALID;

pub(crate) fn controllers_rule() -> String {
    let allowed: Vec<String> = controllers::allowed_entries().iter().map(|e| format!("'{e}'")).collect();
    format!("self.all(c, c in [{}])", allowed.join(", "))
}

pub(crate) fn controllers_message() -> String {
    format!(
        "each entry must be '*', a controller name or alias, optionally prefixed with '-'; known controllers: {}",
        controllers::Controller::ALL
            .iter()
            .map(|c| format!("{} ({})", c.name(), c.alias()))
            .collect::<Vec<_>>()
            .join(", ")
    )
}

fn default_controllers() -> Vec<String> {
    vec!["*".to_string()]
}
fn default_cluster_name() -> String {
    crate::defaults::CLUSTER_NAME.to_string()
}
fn default_true() -> bool {
    true
}
fn default_cloud_config_key() -> String {
    DEFAULT_CLOUD_CONFIG_KEY.to_string()
}
fn default_lease_duration() -> Duration {
    crate::defaults::LEASE_DURATION.into()
}
fn default_renew_deadline() -> Duration {
    crate::defaults::RENEW_DEADLINE.into()
}
fn default_retry_period() -> Duration {
    crate::defaults::RETRY_PERIOD.into()
}
fn default_node_syncs() -> i32 {
    crate::defaults::CONCURRENT_NODE_SYNCS
}
fn default_service_syncs() -> i32 {
    crate::defaults::CONCURRENT_SERVICE_SYNCS
}
fn default_route_syncs() -> i32 {
    crate::defaults::CONCURRENT_ROUTE_SYNCS
}
fn default_replicas() -> i32 {
    2
}
fn default_priority_class() -> String {
    "system-cluster-critical".to_string()
}

#[cfg(test)]
mod cel_tests {
    //! The CRD's CEL rules, evaluated client-side with kube's CEL support.
    use super::*;
    use serde_json::{Value, json};

    fn ccm(spec: Value) -> CloudControllerManager {
        serde_json::from_value(json!({
            "apiVersion": "ccm.rs/v1alpha1",
            "kind": "CloudControllerManager",
            "metadata": {"name": "t", "namespace": "kube-system"},
            "spec": spec,
        }))
        .expect("test spec deserializes")
    }

    fn assert_rejected(spec: Value, needle: &str) {
        let obj = ccm(spec);
        let err = obj.validate_cel().expect_err("spec must be rejected");
        assert!(format!("{err:?}").contains(needle), "expected {needle:?} in {err:?}");
    }

    #[test]
    fn valid_specs_pass() {
        for spec in [
            json!({"provider": "fake"}),
            json!({"provider": "baremetal", "mode": "Embedded", "controllers": ["*", "-route"]}),
            json!({"provider": "fake", "clusterCIDR": "10.244.0.0/16"}),
            json!({"provider": "fake", "clusterCIDR": "10.244.0.0/16,fd00:10:244::/56"}),
            json!({"provider": "fake", "controllers": ["cloud-node-controller", "-service", "route"]}),
            json!({"provider": "fake", "leaderElection": {"leaseDuration": "137s", "renewDeadline": "107s", "retryPeriod": "26s"}}),
            json!({"provider": "fake", "concurrency": {"nodeSyncs": 1, "serviceSyncs": 1, "routeSyncs": 1}}),
            json!({"provider": "fake", "leaderElection": {"migration": {"enabled": true}}}),
            json!({"provider": "fake", "leaderElection": {"migration": {"enabled": true, "leaderName": "moving.example",
                "controllerLeaders": [{"name": "service", "component": "*"}, {"name": "route", "component": "cloud-controller-manager"}]}}}),
            json!({"provider": "fake", "leaderElection": {"migration": {"enabled": true, "leaseNamespace": "ccm-moving-1"}}}),
            json!({"provider": "fake", "loadBalancerClass": "example.com/lb", "handleUnclassedServices": true}),
            json!({"provider": "fake", "handleUnclassedServices": false}),
        ] {
            let obj = ccm(spec.clone());
            obj.validate_cel().unwrap_or_else(|e| panic!("{spec} rejected: {e:?}"));
        }
    }

    #[test]
    fn changed_provider_is_rejected() {
        let old = ccm(json!({"provider": "fake"}));
        let new = ccm(json!({"provider": "baremetal"}));
        let err = new.validate_cel_update(&old).expect_err("provider change must be rejected");
        assert!(format!("{err:?}").contains("provider is immutable"), "{err:?}");
        new.validate_cel_update(&new.clone()).expect("an unchanged provider passes");
    }

    #[test]
    fn unknown_controller_name_is_rejected() {
        assert_rejected(json!({"provider": "fake", "controllers": ["nodeipam"]}), "known controllers");
    }

    #[test]
    fn negated_unknown_controller_is_rejected() {
        assert_rejected(json!({"provider": "fake", "controllers": ["*", "-bogus"]}), "known controllers");
    }

    #[test]
    fn zero_replicas_are_rejected() {
        assert_rejected(json!({"provider": "fake", "deployment": {"replicas": 0}}), "at least 1");
    }

    #[test]
    fn zero_concurrency_is_rejected() {
        for field in ["nodeSyncs", "serviceSyncs", "routeSyncs"] {
            assert_rejected(json!({"provider": "fake", "concurrency": {field: 0}}), "at least 1");
        }
    }

    #[test]
    fn lease_duration_not_above_renew_deadline_is_rejected() {
        assert_rejected(
            json!({"provider": "fake", "leaderElection": {"leaseDuration": "10s", "renewDeadline": "10s"}}),
            "leaseDuration must be greater than renewDeadline",
        );
        assert_rejected(
            json!({"provider": "fake", "leaderElection": {"renewDeadline": "2s", "retryPeriod": "2s"}}),
            "greater than retryPeriod",
        );
    }

    #[test]
    fn m7_a_migration_lease_name_that_is_no_lease_name_is_rejected() {
        assert_rejected(
            json!({"provider": "fake", "leaderElection": {"migration": {"enabled": true, "leaderName": "Not_A_Name"}}}),
            "leaderName must be a valid Lease name",
        );
    }

    #[test]
    fn m7_a_migration_lease_namespace_that_is_no_namespace_name_is_rejected() {
        for bad in ["Kube-System", "kube.system", "-a"] {
            let spec =
                json!({"provider": "fake", "leaderElection": {"migration": {"enabled": true, "leaseNamespace": bad}}});
            let err = ccm(spec).validate_cel().expect_err("must be rejected");
            let text = format!("{err:?}");
            assert!(text.contains("leaseNamespace must be a namespace name"), "{bad}: {text}");
        }
    }

    #[test]
    fn m7_a_controller_named_twice_in_the_migration_is_rejected() {
        assert_rejected(
            json!({"provider": "fake", "leaderElection": {"migration": {"enabled": true,
                "controllerLeaders": [{"name": "service", "component": "*"}, {"name": "service", "component": "x"}]}}}),
            "each name may appear once",
        );
    }

    #[test]
    fn s28_handle_unclassed_services_without_a_class_is_rejected() {
        assert_rejected(json!({"provider": "fake", "handleUnclassedServices": true}), HANDLE_UNCLASSED_MESSAGE);
    }

    #[test]
    fn s35_an_orphan_sweep_on_a_shadow_manager_is_rejected() {
        assert_rejected(
            json!({"provider": "fake", "shadow": true, "orphans": {"sweep": true}}),
            SWEEP_IN_SHADOW_MESSAGE,
        );
        ccm(json!({"provider": "fake", "orphans": {"sweep": true}})).validate_cel().expect("a sweep alone is valid");
        ccm(json!({"provider": "fake", "shadow": true, "orphans": {}})).validate_cel().expect("no sweep");
    }

    #[test]
    fn malformed_cluster_cidr_is_rejected() {
        assert_rejected(json!({"provider": "fake", "clusterCIDR": "10.244.0.0"}), "must be a CIDR");
    }

    #[test]
    fn three_cluster_cidrs_are_rejected() {
        assert_rejected(
            json!({"provider": "fake", "clusterCIDR": "10.0.0.0/16,10.1.0.0/16,fd00::/48"}),
            "at most two CIDRs",
        );
    }

    #[test]
    fn two_cidrs_of_one_family_are_rejected() {
        assert_rejected(json!({"provider": "fake", "clusterCIDR": "10.0.0.0/16,10.1.0.0/16"}), "different IP families");
    }
}
