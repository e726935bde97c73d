//! The `cloud-controller-manager` command line, compatible with upstream's flags.
//!
//! Names and defaults are upstream's (`k8s.io/cloud-provider` options, controller-manager and
//! component-base), so a Deployment written for an upstream manager keeps working. Flags
//! upstream accepts but that have no effect here (profiling, client certificates and
//! request-header authentication, webhooks, ...) are accepted with a warning. Values upstream accepts but that break
//! the manager (`--concurrent-node-syncs=0`, an unparsable `--cluster-cidr` when routes would
//! run) are rejected at start. Flags that are not upstream's are listed under "Additions".

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgAction, Parser};
use crds::controllers::ControllerSelection;

use crate::client::ClientSource;
use crate::config::{LeaderElectionSettings, LeaderMigrationSource, ManagerConfig, workers};
use crate::error::Error;
use crate::http::{HttpConfig, Tls, TlsFiles};
use crate::leader::LeaderElectionConfig;
use crate::leader_migration::LeaderMigrationConfiguration;
use crate::options::ControllerOptions;
use crate::provider::CloudProvider;
use crate::serving::{AuthConfig, AuthSettings, TlsOptions};
use crate::status::StatusTarget;

/// Parse a Go-style duration (`10s`, `5m0s`, `1h30m`, `250ms`); negative values are rejected.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let d: kube::core::Duration = s.trim().parse().map_err(|e| format!("{s:?} is not a duration such as 10s: {e}"))?;
    if d.is_negative() {
        return Err(format!("{s:?} is negative"));
    }
    Ok(d.into())
}

/// Parse a Go-style boolean (`true`, `false`, `1`, `0`, `t`, `f`, any case).
pub fn parse_bool(s: &str) -> Result<bool, String> {
    match s.to_ascii_lowercase().as_str() {
        "true" | "t" | "1" => Ok(true),
        "false" | "f" | "0" => Ok(false),
        _ => Err(format!("{s:?} is not a boolean")),
    }
}

/// Every flag. Field docs are the `--help` text.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "cloud-controller-manager",
    version,
    about = "Runs the cloud-specific control loops of a Kubernetes cluster (nodes, node lifecycle, load balancers, routes).",
    long_about = "The cloud-controller-manager runs the cloud-specific control loops of a Kubernetes cluster: \
it initializes Nodes from cloud instance metadata, deletes Nodes whose instances are gone, provisions \
load balancers for Services of type LoadBalancer, and programs pod-network routes.",
    max_term_width = 120
)]
pub struct Flags {
    // ----- Cloud provider flags
    /// Name of the cloud provider to run (required: an empty name is rejected).
    #[arg(long, default_value = "", value_name = "string", help_heading = "Cloud provider flags")]
    pub cloud_provider: String,
    /// Path of the cloud provider's configuration file; empty means the provider gets no
    /// configuration.
    #[arg(long, default_value = "", value_name = "string", help_heading = "Cloud provider flags")]
    pub cloud_config: String,
    /// Start even when the provider reports no cluster ID on its instances (a legacy mode).
    /// (DEPRECATED)
    #[arg(long, default_value_t = false, num_args = 0..=1, require_equals = true, default_missing_value = "true",
        value_parser = parse_bool, action = ArgAction::Set, help_heading = "Cloud provider flags")]
    pub allow_untagged_cloud: bool,
    /// Volume plugin for an external cloud provider. Has no effect here.
    #[arg(long, default_value = "", value_name = "string", help_heading = "Cloud provider flags")]
    pub external_cloud_volume_plugin: String,

    // ----- Generic flags
    /// Controllers to run, comma-separated: '*' turns on every controller that is on by default,
    /// 'name' turns one on, '-name' turns one off; the first entry naming a controller wins.
    /// Controllers: cloud-node-controller, cloud-node-lifecycle-controller,
    /// node-route-controller, service-lb-controller (aliases: cloud-node,
    /// cloud-node-lifecycle, route, service).
    #[arg(long, value_delimiter = ',', default_value = "*", value_name = "strings", help_heading = "Generic flags")]
    pub controllers: Vec<String>,
    /// Pause between starting two controllers. Has no effect here: controllers start together.
    #[arg(long, default_value = "0s", value_parser = parse_duration, value_name = "duration", help_heading = "Generic flags")]
    pub controller_start_interval: Duration,
    /// Lower bound of the random resync period of the shared caches. Has no effect here: the
    /// caches never resync.
    #[arg(long, default_value = "12h0m0s", value_parser = parse_duration, value_name = "duration", help_heading = "Generic flags")]
    pub min_resync_period: Duration,
    /// Requests per second the manager may send to the Kubernetes API server (client-side token
    /// bucket); 0 turns the limit off.
    #[arg(long, default_value_t = 20.0, value_name = "float32", help_heading = "Generic flags")]
    pub kube_api_qps: f32,
    /// Requests that may be sent at once above --kube-api-qps (the token bucket's depth).
    #[arg(long, default_value_t = 30, value_name = "int32", help_heading = "Generic flags")]
    pub kube_api_burst: i64,
    /// Content type for API server requests. Has no effect here: requests use JSON.
    #[arg(
        long,
        default_value = "application/vnd.kubernetes.protobuf",
        value_name = "string",
        help_heading = "Generic flags"
    )]
    pub kube_api_content_type: String,
    /// Name of this cluster, passed to every load-balancer and route call of the provider.
    #[arg(long, default_value = crds::defaults::CLUSTER_NAME, value_name = "string", help_heading = "Generic flags")]
    pub cluster_name: String,
    /// Pod address range(s) of the cluster, one CIDR or an IPv4,IPv6 pair; the route controller
    /// manages routes within it.
    #[arg(long, default_value = "", value_name = "string", help_heading = "Generic flags")]
    pub cluster_cidr: String,
    /// Allocate pod CIDRs to Nodes. Has no effect here: there is no node IPAM controller.
    #[arg(long, default_value_t = false, num_args = 0..=1, require_equals = true, default_missing_value = "true",
        value_parser = parse_bool, action = ArgAction::Set, help_heading = "Generic flags")]
    pub allocate_node_cidrs: bool,
    /// Pod CIDR allocator type. Has no effect here.
    #[arg(long, default_value = "RangeAllocator", value_name = "string", help_heading = "Generic flags")]
    pub cidr_allocator_type: String,
    /// Program the Nodes' pod CIDRs as routes in the cloud (the route controller).
    #[arg(long, default_value_t = true, num_args = 0..=1, require_equals = true, default_missing_value = "true",
        value_parser = parse_bool, action = ArgAction::Set, help_heading = "Generic flags")]
    pub configure_cloud_routes: bool,
    /// How often the route controller compares the cloud's routes with the Nodes.
    #[arg(long, default_value = "10s", value_parser = parse_duration, value_name = "duration", help_heading = "Generic flags")]
    pub route_reconciliation_period: Duration,
    /// How often the cloud-node-lifecycle-controller checks Nodes against their instances.
    #[arg(long, default_value = "5s", value_parser = parse_duration, value_name = "duration", help_heading = "Generic flags")]
    pub node_monitor_period: Duration,
    /// Has no effect; see --node-monitor-period and --route-reconciliation-period instead.
    /// (DEPRECATED)
    #[arg(long, value_parser = parse_duration, value_name = "duration", help_heading = "Generic flags")]
    pub node_sync_period: Option<Duration>,
    /// Give each controller its own service account. Has no effect here: every controller uses
    /// the manager's credentials.
    #[arg(long, default_value_t = false, num_args = 0..=1, require_equals = true, default_missing_value = "true",
        value_parser = parse_bool, action = ArgAction::Set, help_heading = "Generic flags")]
    pub use_service_account_credentials: bool,
    /// Feature gates as Name=true|false pairs. Accepted for compatibility; no gate changes
    /// anything here.
    #[arg(long, default_value = "", value_name = "mapStringBool", help_heading = "Generic flags")]
    pub feature_gates: String,

    // ----- Leader-election flags
    /// Run the controllers only while holding the leader Lease; needed when several replicas
    /// run for high availability.
    #[arg(long, default_value_t = true, num_args = 0..=1, require_equals = true, default_missing_value = "true",
        value_parser = parse_bool, action = ArgAction::Set, help_heading = "Leader-election flags")]
    pub leader_elect: bool,
    /// How long a standby waits after the leader's last renewal before taking the Lease over:
    /// the longest a stopped leader goes unreplaced. Used with leader election only.
    #[arg(long, default_value = "15s", value_parser = parse_duration, value_name = "duration", help_heading = "Leader-election flags")]
    pub leader_elect_lease_duration: Duration,
    /// How long the leader keeps failing to renew before it stops leading; shorter than the
    /// lease duration. Used with leader election only.
    #[arg(long, default_value = "10s", value_parser = parse_duration, value_name = "duration", help_heading = "Leader-election flags")]
    pub leader_elect_renew_deadline: Duration,
    /// Kind of object holding the leader lock; only 'leases' is supported.
    #[arg(long, default_value = "leases", value_name = "string", help_heading = "Leader-election flags")]
    pub leader_elect_resource_lock: String,
    /// Name of the leader-election Lease.
    #[arg(
        long,
        default_value = crds::defaults::LEASE_NAME,
        value_name = "string",
        help_heading = "Leader-election flags"
    )]
    pub leader_elect_resource_name: String,
    /// Namespace of the leader-election Lease.
    #[arg(long, default_value = crds::defaults::LEASE_NAMESPACE, value_name = "string", help_heading = "Leader-election flags")]
    pub leader_elect_resource_namespace: String,
    /// Pause between two attempts to acquire or renew the Lease. Used with leader election only.
    #[arg(long, default_value = "2s", value_parser = parse_duration, value_name = "duration", help_heading = "Leader-election flags")]
    pub leader_elect_retry_period: Duration,
    /// Leader migration (upstream KEP-2436): after the main Lease, take a second Lease (the
    /// configuration's leaderName, in the main Lease's namespace unless
    /// --leader-migration-lease-namespace says otherwise) and run the controllers the
    /// configuration assigns to cloud-controller-manager or '*' only while holding it. Needs
    /// leader election.
    #[arg(long, default_value_t = false, num_args = 0..=1, require_equals = true, default_missing_value = "true",
        value_parser = parse_bool, action = ArgAction::Set, help_heading = "Leader-migration flags")]
    pub enable_leader_migration: bool,
    /// A LeaderMigrationConfiguration file (controllermanager.config.k8s.io v1alpha1, v1beta1 or
    /// v1); empty: upstream's default (Lease cloud-provider-extraction-migration with route,
    /// service and cloud-node-lifecycle). Used with --enable-leader-migration only.
    #[arg(long, default_value = "", value_name = "string", help_heading = "Leader-migration flags")]
    pub leader_migration_config: String,

    // ----- Node controller flags
    /// Workers initializing Nodes in parallel (upstream's default is 1). At least 1 (upstream
    /// takes 0 and then never initializes a Node).
    #[arg(long, default_value_t = crds::defaults::CONCURRENT_NODE_SYNCS.into(), value_name = "int32", help_heading = "Node controller flags")]
    pub concurrent_node_syncs: i64,
    /// Workers refreshing Node addresses in parallel; 0 uses --concurrent-node-syncs.
    #[arg(long, default_value_t = 0, value_name = "int32", help_heading = "Node controller flags")]
    pub concurrent_node_status_updates: i64,

    // ----- Service controller flags
    /// Services synced in parallel (and the parallelism of node-change passes). Default 32, not
    /// upstream's 1: with 1, a cluster with hundreds of Services waits minutes to hours for load
    /// balancers. `=1` reproduces upstream.
    #[arg(long, default_value_t = crds::defaults::CONCURRENT_SERVICE_SYNCS.into(), value_name = "int32", help_heading = "Service controller flags")]
    pub concurrent_service_syncs: i64,

    // ----- Misc flags
    /// How often the cloud-node-controller refreshes every Node's addresses.
    #[arg(long, default_value = "5m0s", value_parser = parse_duration, value_name = "duration", help_heading = "Misc flags")]
    pub node_status_update_frequency: Duration,
    /// Kubeconfig file with the API server address and credentials (--master overrides the
    /// address). Empty: the in-cluster configuration.
    #[arg(long, default_value = "", value_name = "string", help_heading = "Misc flags")]
    pub kubeconfig: String,
    /// API server address; takes precedence over the kubeconfig's.
    #[arg(long, default_value = "", value_name = "string", help_heading = "Misc flags")]
    pub master: String,

    // ----- Debugging flags
    /// Profiling endpoints. Has no effect here: there are none.
    #[arg(long, default_value_t = true, num_args = 0..=1, require_equals = true, default_missing_value = "true",
        value_parser = parse_bool, action = ArgAction::Set, help_heading = "Debugging flags")]
    pub profiling: bool,
    /// Block profiling. Has no effect here.
    #[arg(long, default_value_t = false, num_args = 0..=1, require_equals = true, default_missing_value = "true",
        value_parser = parse_bool, action = ArgAction::Set, help_heading = "Debugging flags")]
    pub contention_profiling: bool,

    // ----- Secure serving flags
    /// Address the --secure-port endpoint listens on; 0.0.0.0 or :: listens everywhere.
    #[arg(long, default_value = "0.0.0.0", value_name = "ip", help_heading = "Secure serving flags")]
    pub bind_address: String,
    /// HTTPS port of the /healthz, /livez, /readyz and /metrics endpoint; 0 turns it off. Paths
    /// outside --authorization-always-allow-paths need a bearer token the API server accepts
    /// (TokenReview) and allows (SubjectAccessReview).
    #[arg(long, default_value_t = crds::defaults::SECURE_PORT, value_name = "int", help_heading = "Secure serving flags")]
    pub secure_port: u16,
    /// PEM certificate for the endpoint, followed by any intermediate certificates. Without it,
    /// a self-signed certificate for localhost is generated in memory at start.
    #[arg(long, default_value = "", value_name = "string", help_heading = "Secure serving flags")]
    pub tls_cert_file: String,
    /// PEM private key of --tls-cert-file.
    #[arg(long, default_value = "", value_name = "string", help_heading = "Secure serving flags")]
    pub tls_private_key_file: String,
    /// Directory of generated TLS certificates. Has no effect here: the self-signed certificate
    /// is kept in memory only.
    #[arg(long, default_value = "", value_name = "string", help_heading = "Secure serving flags")]
    pub cert_dir: String,
    /// Cipher suites offered, comma-separated, by upstream's names (e.g.
    /// TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256). Only ECDHE suites with AES-GCM or
    /// ChaCha20-Poly1305 are available; any other name is refused at start. TLS 1.3 suites stay
    /// on unless the list names one. Empty: every available suite.
    #[arg(long, default_value = "", value_name = "strings", help_heading = "Secure serving flags")]
    pub tls_cipher_suites: String,
    /// Oldest TLS version accepted: VersionTLS12 (the default when empty) or VersionTLS13;
    /// VersionTLS10 and VersionTLS11 are refused at start.
    #[arg(long, default_value = "", value_name = "string", help_heading = "Secure serving flags")]
    pub tls_min_version: String,
    /// TLS key-exchange groups. Has no effect here.
    #[arg(long, default_value = "", value_name = "strings", help_heading = "Secure serving flags")]
    pub tls_curve_preferences: String,
    /// Extra certificate/key pairs chosen by SNI. Has no effect here.
    #[arg(long, value_name = "namedCertKey", help_heading = "Secure serving flags")]
    pub tls_sni_cert_key: Vec<String>,
    /// HTTP/2 stream limit. Has no effect here: the endpoint speaks HTTP/1.1.
    #[arg(long, default_value_t = 0, value_name = "int", help_heading = "Secure serving flags")]
    pub http2_max_streams_per_connection: i64,
    /// Turn HTTP/2 off. Has no effect here: the endpoint speaks HTTP/1.1.
    #[arg(long, default_value_t = false, num_args = 0..=1, require_equals = true, default_missing_value = "true",
        value_parser = parse_bool, action = ArgAction::Set, help_heading = "Secure serving flags")]
    pub disable_http2_serving: bool,
    /// Bind with SO_REUSEPORT. Has no effect here.
    #[arg(long, default_value_t = false, num_args = 0..=1, require_equals = true, default_missing_value = "true",
        value_parser = parse_bool, action = ArgAction::Set, help_heading = "Secure serving flags")]
    pub permit_port_sharing: bool,
    /// Bind with SO_REUSEADDR. Has no effect here.
    #[arg(long, default_value_t = false, num_args = 0..=1, require_equals = true, default_missing_value = "true",
        value_parser = parse_bool, action = ArgAction::Set, help_heading = "Secure serving flags")]
    pub permit_address_sharing: bool,

    // ----- Authentication and authorization flags
    /// Kubeconfig of the API server that checks bearer tokens (TokenReview); empty: --kubeconfig
    /// or the in-cluster configuration.
    #[arg(long, default_value = "", value_name = "string", help_heading = "Authentication flags")]
    pub authentication_kubeconfig: String,
    /// Skip reading authentication settings from the cluster. Has no effect here.
    #[arg(long, default_value_t = false, num_args = 0..=1, require_equals = true, default_missing_value = "true",
        value_parser = parse_bool, action = ArgAction::Set, help_heading = "Authentication flags")]
    pub authentication_skip_lookup: bool,
    /// How long a TokenReview answer is reused (a rejected token: at most 5s).
    #[arg(long, default_value = "10s", value_parser = parse_duration, value_name = "duration", help_heading = "Authentication flags")]
    pub authentication_token_webhook_cache_ttl: Duration,
    /// Start even if authentication settings cannot be read. Has no effect here.
    #[arg(long, default_value_t = false, num_args = 0..=1, require_equals = true, default_missing_value = "true",
        value_parser = parse_bool, action = ArgAction::Set, help_heading = "Authentication flags")]
    pub authentication_tolerate_lookup_failure: bool,
    /// CA bundle for client certificates. Has no effect here.
    #[arg(long, default_value = "", value_name = "string", help_heading = "Authentication flags")]
    pub client_ca_file: String,
    /// CA bundle of authenticating proxies. Has no effect here.
    #[arg(long, default_value = "", value_name = "string", help_heading = "Authentication flags")]
    pub requestheader_client_ca_file: String,
    /// Proxy certificate names allowed to assert users. Has no effect here.
    #[arg(long, value_name = "strings", help_heading = "Authentication flags")]
    pub requestheader_allowed_names: Vec<String>,
    /// Headers carrying the user name. Has no effect here.
    #[arg(long, value_name = "strings", help_heading = "Authentication flags")]
    pub requestheader_username_headers: Vec<String>,
    /// Headers carrying groups. Has no effect here.
    #[arg(long, value_name = "strings", help_heading = "Authentication flags")]
    pub requestheader_group_headers: Vec<String>,
    /// Header prefixes carrying extra user attributes. Has no effect here.
    #[arg(long, value_name = "strings", help_heading = "Authentication flags")]
    pub requestheader_extra_headers_prefix: Vec<String>,
    /// Headers carrying the user UID. Has no effect here.
    #[arg(long, value_name = "strings", help_heading = "Authentication flags")]
    pub requestheader_uid_headers: Vec<String>,
    /// Kubeconfig of the API server that authorizes requests (SubjectAccessReview); empty:
    /// --kubeconfig or the in-cluster configuration.
    #[arg(long, default_value = "", value_name = "string", help_heading = "Authorization flags")]
    pub authorization_kubeconfig: String,
    /// Paths served to anyone, without a token; an entry ending in '*' is a prefix.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "/healthz,/readyz,/livez",
        value_name = "strings",
        help_heading = "Authorization flags"
    )]
    pub authorization_always_allow_paths: Vec<String>,
    /// How long an allowing SubjectAccessReview answer is reused.
    #[arg(long, default_value = "10s", value_parser = parse_duration, value_name = "duration", help_heading = "Authorization flags")]
    pub authorization_webhook_cache_authorized_ttl: Duration,
    /// How long a denying SubjectAccessReview answer is reused (upstream: 10s; shorter here so
    /// a new RoleBinding takes effect sooner).
    #[arg(long, default_value = "5s", value_parser = parse_duration, value_name = "duration", help_heading = "Authorization flags")]
    pub authorization_webhook_cache_unauthorized_ttl: Duration,

    // ----- Webhook flags (accepted, no effect)
    /// Admission webhooks to serve. Has no effect here: no webhook is served.
    #[arg(long, value_delimiter = ',', value_name = "strings", help_heading = "Webhook flags")]
    pub webhooks: Vec<String>,
    /// Address of the webhook endpoint. Has no effect here.
    #[arg(long, default_value = "0.0.0.0", value_name = "ip", help_heading = "Webhook flags")]
    pub webhook_bind_address: String,
    /// Port of the webhook endpoint. Has no effect here.
    #[arg(long, default_value_t = 10260, value_name = "int", help_heading = "Webhook flags")]
    pub webhook_secure_port: u16,
    /// Directory of the webhook certificates. Has no effect here.
    #[arg(long, default_value = "", value_name = "string", help_heading = "Webhook flags")]
    pub webhook_cert_dir: String,

    // ----- Global flags
    /// Log verbosity: 0-2 info, 3-4 debug, 5 and more trace (RUST_LOG, when set, wins).
    #[arg(short = 'v', long = "v", default_value_t = 0, value_name = "Level", help_heading = "Global flags")]
    pub verbosity: u8,
    /// Per-file verbosity. Has no effect here: use RUST_LOG.
    #[arg(long, default_value = "", value_name = "pattern=N,...", help_heading = "Global flags")]
    pub vmodule: String,
    /// Log format: "text" or "json".
    #[arg(long, default_value = "text", value_name = "string", help_heading = "Global flags")]
    pub logging_format: String,

    // ----- Additions
    /// (Addition) Route operations run concurrently by the route controller; never more than
    /// 200 are in flight.
    #[arg(long, default_value_t = crds::defaults::CONCURRENT_ROUTE_SYNCS.into(), value_name = "int", help_heading = "Additions (not upstream flags)")]
    pub concurrent_route_syncs: i64,
    /// (Addition) Most Nodes per batched cloud instance lookup; the provider's own batch size
    /// caps it too. 1 reproduces upstream's one call per Node.
    #[arg(long, default_value_t = 500, value_name = "int", help_heading = "Additions (not upstream flags)")]
    pub node_batch_size: i64,
    /// (Addition) How long new Nodes are collected before one batched lookup.
    #[arg(long, default_value = "100ms", value_parser = parse_duration, value_name = "duration", help_heading = "Additions (not upstream flags)")]
    pub node_batch_window: Duration,
    /// (Addition) How long an instance must be reported absent before its Node is deleted. 0 is
    /// upstream's immediate deletion.
    #[arg(long, default_value = "0s", value_parser = parse_duration, value_name = "duration", help_heading = "Additions (not upstream flags)")]
    pub node_deletion_grace_period: Duration,
    /// (Addition) Handle only Services with this spec.loadBalancerClass instead of those with
    /// none. Empty: upstream's behaviour.
    #[arg(long, default_value = "", value_name = "string", help_heading = "Additions (not upstream flags)")]
    pub load_balancer_class: String,
    /// (Addition) With --load-balancer-class, also handle Services without a
    /// spec.loadBalancerClass (as the unclassed manager would). Needs --load-balancer-class.
    #[arg(long, default_value_t = false, num_args = 0..=1, require_equals = true, default_missing_value = "true",
        value_parser = parse_bool, action = ArgAction::Set, help_heading = "Additions (not upstream flags)")]
    pub handle_unclassed_services: bool,
    /// (Addition) Re-ensure every load balancer this often to repair drift in the cloud. 0
    /// (upstream) never does.
    #[arg(long, default_value = "0s", value_parser = parse_duration, value_name = "duration", help_heading = "Additions (not upstream flags)")]
    pub load_balancer_resync_period: Duration,
    /// (Addition) <namespace>/<name> of the CloudControllerManager resource on which the leader
    /// reports the ProviderHealthy condition and the controllers and leader status fields.
    #[arg(long, default_value = "", value_name = "namespace/name", help_heading = "Additions (not upstream flags)")]
    pub ccm_resource: String,
    /// (Addition) Shadow mode: every controller decides without acting. Only cloud reads, no
    /// write to Nodes, Services or routes; the differences go to the ShadowAgrees condition and
    /// status.shadow of --ccm-resource, metrics and events (docs/shadow.md). The Lease defaults
    /// to cloud-controller-manager-shadow; leader migration is refused.
    #[arg(long, default_value_t = false, num_args = 0..=1, require_equals = true, default_missing_value = "true",
        value_parser = parse_bool, action = ArgAction::Set, help_heading = "Additions (not upstream flags)")]
    pub shadow: bool,
    /// (Addition) How often the leader probes the provider's health for --ccm-resource.
    #[arg(long, default_value = "30s", value_parser = parse_duration, value_name = "duration", help_heading = "Additions (not upstream flags)")]
    pub ccm_resource_interval: Duration,
    /// (Addition) Namespace of the leader-migration Lease; empty: the main Lease's
    /// (--leader-elect-resource-namespace, as upstream). Lets a manager in another namespace share
    /// the migration Lease. Used with --enable-leader-migration only.
    #[arg(long, default_value = "", value_name = "string", help_heading = "Additions (not upstream flags)")]
    pub leader_migration_lease_namespace: String,
    /// (Addition) Release the leader Lease on graceful shutdown, so a standby takes over within
    /// about --leader-elect-retry-period. Upstream never releases it.
    #[arg(long, default_value_t = true, num_args = 0..=1, require_equals = true, default_missing_value = "true",
        value_parser = parse_bool, action = ArgAction::Set, help_heading = "Additions (not upstream flags)")]
    pub leader_elect_release_on_shutdown: bool,
    /// (Addition) Exit with status 1 when the leader Lease is lost, as upstream does. When
    /// false, the controllers stop and the process stands by for the next term.
    #[arg(long, default_value_t = true, num_args = 0..=1, require_equals = true, default_missing_value = "true",
        value_parser = parse_bool, action = ArgAction::Set, help_heading = "Additions (not upstream flags)")]
    pub exit_on_lost_lease: bool,
}

/// Log settings from `-v` and `--logging-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogSettings {
    /// The `tracing` level.
    pub level: tracing::Level,
    /// JSON lines instead of text.
    pub json: bool,
}

/// Everything the binary needs, validated.
#[derive(Debug, Clone)]
pub struct Settings {
    /// `--cloud-provider`.
    pub provider: String,
    /// `--cloud-config`, if given.
    pub cloud_config: Option<PathBuf>,
    /// The engine and controller options.
    pub options: ControllerOptions,
    /// Leader election, unless `--leader-elect=false`.
    pub leader_election: Option<LeaderElectionConfig>,
    /// Leader migration (`--enable-leader-migration`), read and validated.
    pub leader_migration: Option<LeaderMigrationConfiguration>,
    /// The migration Lease's namespace (`--leader-migration-lease-namespace`, else the main
    /// Lease's).
    pub leader_migration_namespace: String,
    /// `--exit-on-lost-lease`.
    pub exit_on_lost_lease: bool,
    /// `--kubeconfig` and `--master`.
    pub client: ClientSource,
    /// `--kube-api-qps` (0: no limit).
    pub qps: f32,
    /// `--kube-api-burst`.
    pub burst: u32,
    /// The endpoint, unless `--secure-port=0`.
    pub http: Option<HttpConfig>,
    /// `--ccm-resource`.
    pub ccm_resource: Option<StatusTarget>,
    /// `--ccm-resource-interval`.
    pub ccm_resource_interval: Duration,
    /// `--allow-untagged-cloud`.
    pub allow_untagged_cloud: bool,
    /// Logging.
    pub log: LogSettings,
    /// One line per accepted flag that has no effect or is deprecated.
    pub warnings: Vec<String>,
}

fn invalid(flag: &'static str, message: impl Into<String>) -> Error {
    Error::InvalidFlag { flag, message: message.into() }
}

fn non_zero(flag: &'static str, d: Duration) -> Result<Duration, Error> {
    if d.is_zero() {
        return Err(invalid(flag, "must be greater than 0"));
    }
    Ok(d)
}

/// Upstream's feature gates this manager knows of (none of them changes anything here).
pub const KNOWN_FEATURE_GATES: [&str; 3] = [
    "CloudControllerManagerWatchBasedRoutesReconciliation",
    "CloudControllerManagerWebhook",
    "ControllerManagerReleaseLeaderElectionLockOnExit",
];

impl Flags {
    /// Parse `args` (the first is the program name).
    pub fn try_parse_args<I, T>(args: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        Self::try_parse_from(args)
    }

    /// The settings the operator renders ([`ManagerConfig`]), checked as at start-up. Empty
    /// `--controllers` entries are dropped, so `--controllers=` runs none.
    pub fn manager_config(&self) -> Result<ManagerConfig, Error> {
        let entries: Vec<&str> = self.controllers.iter().map(String::as_str).filter(|e| !e.trim().is_empty()).collect();
        let controllers = ControllerSelection::parse(&entries).map_err(|e| invalid("--controllers", e.to_string()))?;
        let config = ManagerConfig {
            provider: self.cloud_provider.clone(),
            cloud_config: Some(PathBuf::from(&self.cloud_config)).filter(|p| !p.as_os_str().is_empty()),
            controllers,
            cluster_name: self.cluster_name.clone(),
            cluster_cidr: Some(self.cluster_cidr.clone()).filter(|c| !c.trim().is_empty()),
            configure_cloud_routes: self.configure_cloud_routes,
            concurrent_node_syncs: workers("--concurrent-node-syncs", self.concurrent_node_syncs)?,
            concurrent_service_syncs: workers("--concurrent-service-syncs", self.concurrent_service_syncs)?,
            concurrent_route_syncs: workers("--concurrent-route-syncs", self.concurrent_route_syncs)?,
            leader_election: LeaderElectionSettings {
                enabled: self.leader_elect,
                namespace: self.leader_elect_resource_namespace.clone(),
                // Never the Lease of the manager being shadowed (docs/shadow.md).
                name: match self.leader_elect_resource_name.as_str() {
                    crds::defaults::LEASE_NAME if self.shadow => format!("{}-shadow", crds::defaults::LEASE_NAME),
                    name => name.to_string(),
                },
                lease_duration: self.leader_elect_lease_duration,
                renew_deadline: self.leader_elect_renew_deadline,
                retry_period: self.leader_elect_retry_period,
            },
            leader_migration: match (self.enable_leader_migration, self.leader_migration_config.as_str()) {
                (false, _) => None,
                (true, "") => Some(LeaderMigrationSource::Default),
                (true, path) => Some(LeaderMigrationSource::File(PathBuf::from(path))),
            },
            leader_migration_namespace: Some(self.leader_migration_lease_namespace.clone()).filter(|ns| !ns.is_empty()),
            load_balancer_class: Some(self.load_balancer_class.clone()).filter(|c| !c.is_empty()),
            handle_unclassed_services: self.handle_unclassed_services,
            secure_port: self.secure_port,
            ccm_resource: match self.ccm_resource.as_str() {
                "" => None,
                target => Some(target.parse::<StatusTarget>().map_err(|m| invalid("--ccm-resource", m))?),
            },
            extra_args: Vec::new(),
            shadow: self.shadow,
        };
        config.check()?;
        Ok(config)
    }

    /// Validate and convert to [`Settings`].
    pub fn settings(&self) -> Result<Settings, Error> {
        let mut warnings = Vec::new();
        let mut warn = |flag: &str, why: &str| warnings.push(format!("{flag} is accepted for compatibility but {why}"));
        let defaults = Flags::try_parse_args(["cloud-controller-manager"])
            .map_err(|e| invalid("--help", format!("flag defaults do not parse: {e}")))?;

        if self.allow_untagged_cloud {
            warn("--allow-untagged-cloud", "is deprecated");
        }
        if !self.external_cloud_volume_plugin.is_empty() {
            warn("--external-cloud-volume-plugin", "has no effect");
        }
        if !self.controller_start_interval.is_zero() {
            warn("--controller-start-interval", "has no effect: controllers start together");
        }
        if self.min_resync_period != defaults.min_resync_period {
            warn("--min-resync-period", "has no effect: the shared caches never resync");
        }
        if self.kube_api_content_type != defaults.kube_api_content_type {
            warn("--kube-api-content-type", "has no effect: requests use JSON");
        }
        if self.allocate_node_cidrs {
            warn("--allocate-node-cidrs", "has no effect: there is no node IPAM controller");
        }
        if self.cidr_allocator_type != defaults.cidr_allocator_type {
            warn("--cidr-allocator-type", "has no effect");
        }
        if self.node_sync_period.is_some() {
            warn("--node-sync-period", "is deprecated and has no effect");
        }
        if self.use_service_account_credentials {
            warn("--use-service-account-credentials", "has no effect: controllers use the manager's credentials");
        }
        if !self.feature_gates.is_empty() {
            for gate in self.feature_gates.split(',').filter(|g| !g.trim().is_empty()) {
                let (name, value) = gate.split_once('=').unwrap_or((gate, "true"));
                parse_bool(value.trim()).map_err(|e| invalid("--feature-gates", format!("{}: {e}", name.trim())))?;
                if !KNOWN_FEATURE_GATES.contains(&name.trim()) {
                    warnings.push(format!("--feature-gates: {} is not a feature gate of this manager", name.trim()));
                }
            }
            warnings.push("--feature-gates is accepted for compatibility but no gate changes behaviour".into());
        }
        if !self.enable_leader_migration && !self.leader_migration_config.is_empty() {
            warnings
                .push("--leader-migration-config has no effect without --enable-leader-migration (as upstream)".into());
        }
        if !self.enable_leader_migration && !self.leader_migration_lease_namespace.is_empty() {
            warnings.push("--leader-migration-lease-namespace has no effect without --enable-leader-migration".into());
        }
        let mut warn = |flag: &str, why: &str| warnings.push(format!("{flag} is accepted for compatibility but {why}"));
        if !self.profiling || self.contention_profiling {
            warn("--profiling", "has no effect: there are no profiling endpoints");
        }
        for (flag, set) in [
            ("--cert-dir", !self.cert_dir.is_empty()),
            ("--tls-curve-preferences", !self.tls_curve_preferences.is_empty()),
            ("--tls-sni-cert-key", !self.tls_sni_cert_key.is_empty()),
            ("--http2-max-streams-per-connection", self.http2_max_streams_per_connection != 0),
            ("--disable-http2-serving", self.disable_http2_serving),
            ("--permit-port-sharing", self.permit_port_sharing),
            ("--permit-address-sharing", self.permit_address_sharing),
            ("--authentication-skip-lookup", self.authentication_skip_lookup),
            ("--authentication-tolerate-lookup-failure", self.authentication_tolerate_lookup_failure),
            ("--client-ca-file", !self.client_ca_file.is_empty()),
            ("--requestheader-client-ca-file", !self.requestheader_client_ca_file.is_empty()),
            ("--requestheader-allowed-names", !self.requestheader_allowed_names.is_empty()),
            ("--webhooks", !self.webhooks.is_empty()),
            ("--webhook-cert-dir", !self.webhook_cert_dir.is_empty()),
            ("--vmodule", !self.vmodule.is_empty()),
        ] {
            if set {
                warn(flag, "has no effect here");
            }
        }

        let config = self.manager_config()?;
        let leader_migration = config.leader_migration_config()?;
        let leader_migration_namespace = config.migration_lease_namespace().to_string();
        let options = ControllerOptions {
            route_reconciliation_period: non_zero("--route-reconciliation-period", self.route_reconciliation_period)?,
            node_monitor_period: non_zero("--node-monitor-period", self.node_monitor_period)?,
            node_status_update_frequency: non_zero(
                "--node-status-update-frequency",
                self.node_status_update_frequency,
            )?,
            concurrent_node_status_updates: match self.concurrent_node_status_updates {
                0 => 0,
                n => workers("--concurrent-node-status-updates", n)?,
            },
            node_batch_size: workers("--node-batch-size", self.node_batch_size)?,
            node_batch_window: self.node_batch_window,
            node_deletion_grace_period: self.node_deletion_grace_period,
            load_balancer_resync_period: Some(self.load_balancer_resync_period).filter(|d| !d.is_zero()),
            ..config.controller_options()
        };

        let leader_election = if self.leader_elect {
            if self.leader_elect_resource_lock != "leases" {
                return Err(invalid(
                    "--leader-elect-resource-lock",
                    format!("{:?} is not supported; use leases", self.leader_elect_resource_lock),
                ));
            }
            config
                .leader_election_config(&crate::leader::default_identity())
                .map(|le| LeaderElectionConfig { release_on_cancel: self.leader_elect_release_on_shutdown, ..le })
        } else {
            None
        };

        if !(self.kube_api_qps.is_finite() && self.kube_api_qps >= 0.0) {
            return Err(invalid("--kube-api-qps", "must be 0 (no limit) or positive"));
        }
        if self.kube_api_qps > 0.0 && self.kube_api_burst < 1 {
            return Err(invalid("--kube-api-burst", "must be at least 1 when --kube-api-qps is positive"));
        }
        let burst =
            u32::try_from(self.kube_api_burst.max(0)).map_err(|_| invalid("--kube-api-burst", "is too large"))?;

        // Checked even with the endpoint off: a refused value is never silently ignored.
        let tls_options = TlsOptions::from_flags(&self.tls_min_version, &self.tls_cipher_suites)?;
        let http = if self.secure_port == 0 {
            None
        } else {
            let ip: IpAddr = if self.bind_address.is_empty() {
                IpAddr::from([0, 0, 0, 0])
            } else {
                self.bind_address
                    .parse()
                    .map_err(|_| invalid("--bind-address", format!("{:?} is not an IP address", self.bind_address)))?
            };
            let tls = match (self.tls_cert_file.is_empty(), self.tls_private_key_file.is_empty()) {
                (true, true) => Tls::SelfSigned,
                (false, false) => Tls::Files(TlsFiles {
                    cert: PathBuf::from(&self.tls_cert_file),
                    key: PathBuf::from(&self.tls_private_key_file),
                }),
                _ => {
                    return Err(invalid(
                        "--tls-cert-file",
                        "--tls-cert-file and --tls-private-key-file must be given together",
                    ));
                }
            };
            let always_allow_paths: Vec<String> =
                self.authorization_always_allow_paths.iter().filter(|p| !p.is_empty()).cloned().collect();
            crate::serving::logic::validate_always_allow_paths(&always_allow_paths)
                .map_err(|m| invalid("--authorization-always-allow-paths", m))?;
            let auth = AuthConfig {
                authentication_kubeconfig: Some(self.authentication_kubeconfig.clone()).filter(|s| !s.is_empty()),
                authorization_kubeconfig: Some(self.authorization_kubeconfig.clone()).filter(|s| !s.is_empty()),
                ..AuthConfig::new(AuthSettings {
                    always_allow_paths,
                    token_ttl: self.authentication_token_webhook_cache_ttl,
                    allowed_ttl: self.authorization_webhook_cache_authorized_ttl,
                    denied_ttl: self.authorization_webhook_cache_unauthorized_ttl,
                    ..AuthSettings::default()
                })
            };
            Some(
                HttpConfig::new(SocketAddr::new(ip, self.secure_port))
                    .with_tls(tls)
                    .with_tls_options(tls_options)
                    .with_auth(auth),
            )
        };

        let json = match self.logging_format.as_str() {
            "text" => false,
            "json" => true,
            other => return Err(invalid("--logging-format", format!("{other:?} is not one of text, json"))),
        };
        let level = match self.verbosity {
            0..=2 => tracing::Level::INFO,
            3..=4 => tracing::Level::DEBUG,
            _ => tracing::Level::TRACE,
        };

        Ok(Settings {
            provider: config.provider,
            cloud_config: config.cloud_config,
            options,
            leader_election,
            leader_migration,
            leader_migration_namespace,
            exit_on_lost_lease: self.exit_on_lost_lease,
            client: ClientSource {
                kubeconfig: Some(self.kubeconfig.clone()).filter(|s| !s.is_empty()),
                master: Some(self.master.clone()).filter(|s| !s.is_empty()),
            },
            qps: self.kube_api_qps,
            burst,
            http,
            ccm_resource: config.ccm_resource,
            ccm_resource_interval: non_zero("--ccm-resource-interval", self.ccm_resource_interval)?,
            allow_untagged_cloud: self.allow_untagged_cloud,
            log: LogSettings { level, json },
            warnings,
        })
    }
}

/// Whether the route controller would run with this provider and these options.
pub fn routes_would_run(options: &ControllerOptions, provider: &dyn CloudProvider) -> bool {
    crds::controllers::route_controller_runs(
        &options.controllers,
        options.configure_cloud_routes,
        provider.routes().is_some(),
    )
}

/// The start-up checks that need the provider, for the binary and Embedded mode alike. A
/// provider that reports no cluster ID is refused unless `allow_untagged_cloud`
/// (`--allow-untagged-cloud`; Embedded mode has no such setting). An empty or unparsable
/// `--cluster-cidr` does not stop the manager (upstream R2 does, deliberately changed): when the
/// route controller would run it keeps the error and reports it on
/// `/healthz/node-route-controller`; otherwise the value is ignored with a warning.
pub fn start_up_checks(
    options: &mut ControllerOptions,
    provider: &dyn CloudProvider,
    allow_untagged_cloud: bool,
) -> Result<(), Error> {
    if !provider.has_cluster_id() {
        if allow_untagged_cloud {
            tracing::warn!("detected a cluster without a ClusterID; a ClusterID will be required in the future");
        } else {
            return Err(Error::InvalidFlag {
                flag: "--allow-untagged-cloud",
                message: "no ClusterID found; a ClusterID is required for the cloud provider to function properly"
                    .into(),
            });
        }
    }
    check_with_provider(options, provider)
}

/// The `--cluster-cidr` part of [`start_up_checks`].
pub fn check_with_provider(options: &mut ControllerOptions, provider: &dyn CloudProvider) -> Result<(), Error> {
    let routes = routes_would_run(options, provider);
    if routes {
        if let Some(message) = &options.cluster_cidr_error {
            tracing::error!(%message, "--cluster-cidr is unusable; the route controller stays disabled");
        } else if options.cluster_cidrs.is_empty() {
            tracing::error!(
                "--cluster-cidr is empty but the provider manages routes; the route controller stays disabled"
            );
        }
    } else if let Some(message) = options.cluster_cidr_error.take() {
        tracing::warn!(%message, "ignoring --cluster-cidr: the route controller does not run");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serving::MinVersion;

    fn parse(args: &[&str]) -> Flags {
        let mut all = vec!["cloud-controller-manager"];
        all.extend_from_slice(args);
        Flags::try_parse_args(all).unwrap()
    }

    fn settings(args: &[&str]) -> Result<Settings, Error> {
        parse(args).settings()
    }

    fn rejected(args: &[&str], flag: &str) -> String {
        match settings(args) {
            Err(Error::InvalidFlag { flag: f, message }) => {
                assert_eq!(f, flag, "{message}");
                message
            }
            other => panic!("{args:?} should be rejected, got {other:?}"),
        }
    }

    #[test]
    fn defaults_match_upstream_section_3_2() {
        let f = parse(&[]);
        assert_eq!(f.cloud_provider, "");
        assert_eq!(f.controllers, ["*"]);
        assert_eq!(f.kube_api_qps, 20.0);
        assert_eq!(f.kube_api_burst, 30);
        assert_eq!(f.cluster_name, "kubernetes");
        assert!(f.configure_cloud_routes);
        assert_eq!(f.route_reconciliation_period, Duration::from_secs(10));
        assert_eq!(f.node_monitor_period, Duration::from_secs(5));
        assert_eq!(f.node_status_update_frequency, Duration::from_secs(300));
        assert_eq!(f.min_resync_period, Duration::from_secs(12 * 3600));
        assert!(f.leader_elect);
        assert_eq!(f.leader_elect_lease_duration, Duration::from_secs(15));
        assert_eq!(f.leader_elect_renew_deadline, Duration::from_secs(10));
        assert_eq!(f.leader_elect_retry_period, Duration::from_secs(2));
        assert_eq!(f.leader_elect_resource_lock, "leases");
        assert_eq!(f.leader_elect_resource_name, "cloud-controller-manager");
        assert_eq!(f.leader_elect_resource_namespace, "kube-system");
        assert_eq!(f.concurrent_node_syncs, 5, "deliberately above upstream's 1");
        assert_eq!(f.concurrent_node_status_updates, 0);
        assert_eq!(f.concurrent_service_syncs, 32, "deliberately above upstream's 1");
        assert_eq!(f.bind_address, "0.0.0.0");
        assert_eq!(f.secure_port, 10258);
        assert_eq!(f.webhook_secure_port, 10260);
        assert_eq!(f.authorization_always_allow_paths, ["/healthz", "/readyz", "/livez"]);
        let s = f.settings().unwrap();
        assert!(s.warnings.is_empty(), "{:?}", s.warnings);
        assert_eq!(s.options.controllers.enabled().len(), 4);
        assert_eq!((s.qps, s.burst), (20.0, 30));
        assert_eq!(s.http.unwrap().address, "0.0.0.0:10258".parse().unwrap());
        let le = s.leader_election.unwrap();
        assert_eq!((le.namespace.as_str(), le.name.as_str()), ("kube-system", "cloud-controller-manager"));
        assert!(s.exit_on_lost_lease, "upstream exits when the lease is lost");
        assert_eq!(s.options.node_batch_size, 500);
        assert_eq!(s.options.load_balancer_resync_period, None);
        assert_eq!(s.log.level, tracing::Level::INFO);
    }

    #[test]
    fn go_style_booleans_and_durations_are_accepted() {
        let s = settings(&[
            "--leader-elect=false",
            "--configure-cloud-routes=false",
            "--node-monitor-period=1m30s",
            "--allow-untagged-cloud",
            "-v=4",
        ])
        .unwrap();
        assert!(s.leader_election.is_none());
        assert!(!s.options.configure_cloud_routes);
        assert_eq!(s.options.node_monitor_period, Duration::from_secs(90));
        assert!(s.allow_untagged_cloud);
        assert_eq!(s.log.level, tracing::Level::DEBUG);
        assert!(s.warnings.iter().any(|w| w.contains("--allow-untagged-cloud")));
        assert!(Flags::try_parse_args(["ccm", "--leader-elect=maybe"]).is_err());
        assert!(Flags::try_parse_args(["ccm", "--node-monitor-period=5"]).is_err(), "a unit is required");
    }

    #[test]
    fn m2_controllers_flag_resolves_aliases_and_rejects_unknown_names() {
        let s = settings(&["--controllers=*,-route,service"]).unwrap();
        assert!(!s.options.controllers.is_enabled(crds::controllers::Controller::NodeRoute));
        assert!(s.options.controllers.is_enabled(crds::controllers::Controller::ServiceLb));
        let msg = rejected(&["--controllers=*,bogus"], "--controllers");
        assert!(msg.contains("not in the list of known controllers"), "{msg}");
    }

    #[test]
    fn values_that_would_break_the_manager_are_rejected() {
        // Upstream accepts 0 and then never initializes a node (section 6, item 7).
        assert!(rejected(&["--concurrent-node-syncs=0"], "--concurrent-node-syncs").contains("at least 1"));
        rejected(&["--concurrent-service-syncs=0"], "--concurrent-service-syncs");
        rejected(&["--concurrent-route-syncs=0"], "--concurrent-route-syncs");
        rejected(&["--concurrent-node-status-updates=-1"], "--concurrent-node-status-updates");
        rejected(&["--node-batch-size=0"], "--node-batch-size");
        rejected(&["--route-reconciliation-period=0s"], "--route-reconciliation-period");
        rejected(&["--leader-elect-resource-lock=endpoints"], "--leader-elect-resource-lock");
        rejected(&["--leader-elect-renew-deadline=20s"], "--leader-elect");
        rejected(&["--kube-api-qps=-1"], "--kube-api-qps");
        rejected(&["--kube-api-burst=0"], "--kube-api-burst");
        rejected(&["--bind-address=not-an-ip"], "--bind-address");
        rejected(&["--tls-cert-file=/tmp/cert.pem"], "--tls-cert-file");
        rejected(&["--ccm-resource=nonamespace"], "--ccm-resource");
        rejected(&["--logging-format=xml"], "--logging-format");
        rejected(&["--feature-gates=Foo=maybe"], "--feature-gates");
        // With leader election off, its timings are not checked.
        assert!(settings(&["--leader-elect=false", "--leader-elect-renew-deadline=20s"]).is_ok());
    }

    #[test]
    fn the_endpoint_is_https_with_delegated_auth_by_default_and_takes_upstreams_auth_flags() {
        let http = settings(&[]).unwrap().http.unwrap();
        assert_eq!(http.tls, Tls::SelfSigned);
        let auth = http.auth.unwrap();
        assert_eq!(auth.settings.always_allow_paths, ["/healthz", "/readyz", "/livez"]);
        assert_eq!(auth.settings.token_ttl, Duration::from_secs(10));
        assert_eq!(auth.settings.allowed_ttl, Duration::from_secs(10));
        assert_eq!(auth.settings.denied_ttl, Duration::from_secs(5));
        assert_eq!((auth.authentication_kubeconfig, auth.authorization_kubeconfig), (None, None));

        let http = settings(&[
            "--tls-cert-file=/etc/tls/tls.crt",
            "--tls-private-key-file=/etc/tls/tls.key",
            "--authentication-kubeconfig=/etc/kubernetes/authn.conf",
            "--authorization-kubeconfig=/etc/kubernetes/authz.conf",
            "--authorization-always-allow-paths=/healthz,/metrics",
            "--authentication-token-webhook-cache-ttl=1m",
            "--authorization-webhook-cache-unauthorized-ttl=0s",
        ])
        .unwrap()
        .http
        .unwrap();
        assert!(matches!(&http.tls, Tls::Files(f) if f.cert == PathBuf::from("/etc/tls/tls.crt")));
        let auth = http.auth.unwrap();
        assert_eq!(auth.settings.always_allow_paths, ["/healthz", "/metrics"]);
        assert_eq!(auth.settings.token_ttl, Duration::from_secs(60));
        assert_eq!(auth.settings.denied_ttl, Duration::ZERO);
        assert_eq!(auth.authentication_kubeconfig.as_deref(), Some("/etc/kubernetes/authn.conf"));
        assert_eq!(auth.authorization_kubeconfig.as_deref(), Some("/etc/kubernetes/authz.conf"));
        // An empty list allows nothing without a token; a malformed entry is refused.
        let none = settings(&["--authorization-always-allow-paths="]).unwrap().http.unwrap().auth.unwrap();
        assert!(none.settings.always_allow_paths.is_empty());
        rejected(&["--authorization-always-allow-paths=healthz"], "--authorization-always-allow-paths");
        rejected(&["--authorization-always-allow-paths=/a*b"], "--authorization-always-allow-paths");
    }

    #[test]
    fn tls_min_version_and_cipher_suites_reach_the_endpoint_or_are_refused_naming_the_flag() {
        let http = settings(&[
            "--tls-min-version=VersionTLS13",
            "--tls-cipher-suites=TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,TLS_AES_128_GCM_SHA256",
        ])
        .unwrap()
        .http
        .unwrap();
        assert_eq!(http.tls_options.min_version, MinVersion::Tls13);
        assert_eq!(http.tls_options.cipher_suites, ["TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256", "TLS_AES_128_GCM_SHA256"]);
        let s = settings(&["--tls-min-version=VersionTLS12"]).unwrap();
        assert!(s.warnings.iter().all(|w| !w.contains("--tls-")), "{:?}", s.warnings);
        assert_eq!(settings(&[]).unwrap().http.unwrap().tls_options, TlsOptions::default());
        assert!(rejected(&["--tls-min-version=VersionTLS10"], "--tls-min-version").contains("VersionTLS10"));
        assert!(rejected(&["--tls-min-version=VersionTLS11"], "--tls-min-version").contains("VersionTLS11"));
        let msg = rejected(&["--tls-cipher-suites=TLS_RSA_WITH_AES_128_CBC_SHA"], "--tls-cipher-suites");
        assert!(msg.contains("TLS_RSA_WITH_AES_128_CBC_SHA"), "{msg}");
        // Refused even with the endpoint off.
        rejected(&["--secure-port=0", "--tls-cipher-suites=TLS_BOGUS"], "--tls-cipher-suites");
    }

    #[test]
    fn zero_qps_disables_the_limit_and_zero_port_disables_serving() {
        let s = settings(&["--kube-api-qps=0", "--kube-api-burst=0", "--secure-port=0"]).unwrap();
        assert_eq!(s.qps, 0.0);
        assert!(s.http.is_none());
    }

    #[test]
    fn r3_no_op_and_deprecated_flags_are_accepted_with_a_warning() {
        let s = settings(&[
            "--allocate-node-cidrs=true",
            "--cidr-allocator-type=CloudAllocator",
            "--node-sync-period=10s",
            "--use-service-account-credentials=true",
            "--profiling=false",
            "--authentication-skip-lookup",
            "--feature-gates=CloudControllerManagerWebhook=true,SomethingElse=false",
            "--leader-migration-config=/etc/migration.yaml",
            "--cert-dir=/var/run/certs",
        ])
        .unwrap();
        for flag in [
            "--allocate-node-cidrs",
            "--cidr-allocator-type",
            "--node-sync-period",
            "--use-service-account-credentials",
            "--profiling",
            "--authentication-skip-lookup",
            "SomethingElse",
            "--leader-migration-config",
            "--cert-dir",
        ] {
            assert!(s.warnings.iter().any(|w| w.contains(flag)), "no warning for {flag}: {:?}", s.warnings);
        }
    }

    #[test]
    fn m7_leader_migration_flags_give_upstreams_default_or_the_file_and_need_leader_election() {
        let s = settings(&["--enable-leader-migration"]).unwrap();
        assert_eq!(s.leader_migration, Some(LeaderMigrationConfiguration::upstream_default()));
        assert!(s.warnings.is_empty(), "{:?}", s.warnings);
        assert!(settings(&[]).unwrap().leader_migration.is_none());
        let msg = rejected(&["--enable-leader-migration", "--leader-elect=false"], "--enable-leader-migration");
        assert!(msg.contains("--leader-elect"), "{msg}");
        rejected(
            &["--enable-leader-migration", "--leader-migration-config=/nonexistent/m.yaml"],
            "--leader-migration-config",
        );
        let path = std::env::temp_dir().join(format!("ccm-flags-migration-{}.yaml", std::process::id()));
        std::fs::write(&path, "apiVersion: controllermanager.config.k8s.io/v1alpha1\nkind: LeaderMigrationConfiguration\nleaderName: moving\nresourceLock: leases\ncontrollerLeaders: [{name: cloud-node, component: '*'}]\n").unwrap();
        let arg = format!("--leader-migration-config={}", path.display());
        let s = settings(&["--enable-leader-migration", &arg]).unwrap();
        let m = s.leader_migration.unwrap();
        assert_eq!(m.leader_name, "moving");
        assert_eq!(m.placement("cloud-node-controller"), crate::leader_migration::Placement::Migrated);
        std::fs::write(&path, "apiVersion: controllermanager.config.k8s.io/v1alpha1\nkind: LeaderMigrationConfiguration\nresourceLock: leases\n").unwrap();
        let msg = rejected(&["--enable-leader-migration", &arg], "--leader-migration-config");
        assert!(msg.contains("leaderName"), "{msg}");
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn m7_the_migration_lease_namespace_defaults_to_the_main_leases_and_is_checked() {
        let s = settings(&["--enable-leader-migration", "--leader-elect-resource-namespace=ccm-a"]).unwrap();
        assert_eq!(s.leader_migration_namespace, "ccm-a");
        let s = settings(&["--enable-leader-migration", "--leader-migration-lease-namespace=ccm-moving"]).unwrap();
        assert_eq!(s.leader_migration_namespace, "ccm-moving");
        assert_eq!(s.leader_election.unwrap().namespace, "kube-system", "the main Lease stays where it was");
        let msg = rejected(
            &["--enable-leader-migration", "--leader-migration-lease-namespace=Not_A_Namespace"],
            "--leader-migration-lease-namespace",
        );
        assert!(!msg.contains("Not_A_Namespace"), "{msg}");
        let s = settings(&["--leader-migration-lease-namespace=ccm-moving"]).unwrap();
        assert!(s.warnings.iter().any(|w| w.contains("--leader-migration-lease-namespace")), "{:?}", s.warnings);
    }

    #[test]
    fn additions_fill_the_controller_options() {
        let s = settings(&[
            "--concurrent-route-syncs=4",
            "--node-batch-size=50",
            "--node-batch-window=250ms",
            "--node-deletion-grace-period=2m",
            "--load-balancer-class=example.com/lb",
            "--load-balancer-resync-period=10m",
            "--ccm-resource=kube-system/mycloud",
            "--exit-on-lost-lease=false",
        ])
        .unwrap();
        let o = &s.options;
        assert_eq!(o.concurrent_route_syncs, 4);
        assert_eq!(o.node_batch_size, 50);
        assert_eq!(o.node_batch_window, Duration::from_millis(250));
        assert_eq!(o.node_deletion_grace_period, Duration::from_secs(120));
        assert_eq!(o.load_balancer_class.as_deref(), Some("example.com/lb"));
        assert_eq!(o.load_balancer_resync_period, Some(Duration::from_secs(600)));
        assert_eq!(s.ccm_resource.unwrap().to_string(), "kube-system/mycloud");
        assert!(!s.exit_on_lost_lease);
    }
}
