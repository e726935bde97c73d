//! The `cloud-controller-manager` command line, compatible with upstream's flags.
//!
//! Names and defaults are upstream's (`k8s.io/cloud-provider` options, controller-manager and
//! component-base, v1.36), so a Deployment written for an upstream manager keeps working: every
//! flag of upstream's `--help` parses (checked against a snapshot of it by the
//! `upstream_flags` test of the `cloud-controller-manager` crate). Flags upstream accepts but
//! that have no effect here (profiling, client certificates and request-header authentication,
//! SNI certificates, ...) are accepted with a warning ([`super::warnings`]). Values upstream accepts but that break the manager
//! (`--concurrent-node-syncs=0`, say) are rejected at start ([`super::settings`]). Flags that are
//! not upstream's are listed under "Additions".

use std::time::Duration;

use clap::{ArgAction, Parser};

use crate::go_values::{parse_bool, parse_duration};

/// Every flag. Field docs are the `--help` text.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "cloud-controller-manager",
    version,
    about = "Runs the cloud-specific control loops of a Kubernetes cluster (nodes, node lifecycle, load balancers, routes).",
    long_about = "The cloud-controller-manager runs the cloud-specific control loops of a Kubernetes cluster: \
it initializes Nodes from cloud instance metadata, deletes Nodes whose instances are gone, provisions \
load balancers for Services of type LoadBalancer, and programs pod-network routes.",
    max_term_width = 120,
    // Go's pflag: a flag given twice keeps the last value (list flags add up).
    args_override_self = true,
    // Upstream's --version takes an optional value (version[=true]); see `version` below.
    disable_version_flag = true
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
    /// With watch-based routes, the route controller's safety pass runs at a random period
    /// between this and twice this (upstream's informer resync). The shared caches never resync.
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
    /// How often the route controller compares the cloud's routes with the Nodes, when
    /// watch-based routes are off (--feature-gates=CloudControllerManagerWatchBasedRoutesReconciliation=false).
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
    /// Feature gates as Name=true|false pairs (repeatable). Effective here:
    /// CloudControllerManagerWatchBasedRoutesReconciliation (ALPHA - default=false: routes
    /// reconciled on Node changes, at most once per 10s, and every --min-resync-period to
    /// twice that), CloudControllerManagerWebhook (ALPHA - default=false: serve the providers'
    /// admission webhooks), AllAlpha, AllBeta. Upstream's other gates are accepted with a
    /// warning.
    #[arg(long, value_name = "mapStringBool", help_heading = "Generic flags")]
    pub feature_gates: Vec<String>,

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
    /// Key-exchange groups offered, comma-separated Go crypto/tls CurveIDs (or Go's names):
    /// 29 (X25519), 23 (CurveP256), 24 (CurveP384). Order is ignored; 25 and the post-quantum
    /// hybrids are left out with a warning; an unknown entry is refused at start. Empty: all
    /// three.
    #[arg(long, default_value = "", value_name = "int32Slice", help_heading = "Secure serving flags")]
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

    // ----- Webhook flags (KEP-2699; served with --feature-gates=CloudControllerManagerWebhook=true)
    /// Admission webhooks to serve, comma-separated: '*' serves every on-by-default webhook
    /// of the provider, 'name' one, '-name' turns one off. Empty (the default, as upstream):
    /// none.
    #[arg(long, value_delimiter = ',', value_name = "strings", help_heading = "Webhook flags")]
    pub webhooks: Vec<String>,
    /// Address the webhook server listens on; 0.0.0.0 or :: listens everywhere.
    #[arg(long, default_value = "0.0.0.0", value_name = "ip", help_heading = "Webhook serving flags")]
    pub webhook_bind_address: String,
    /// HTTPS port of the admission webhooks, apart from --secure-port; 0 serves none.
    #[arg(long, default_value_t = 10260, value_name = "int", help_heading = "Webhook serving flags")]
    pub webhook_secure_port: u16,
    /// Directory of generated webhook certificates. Has no effect here: the self-signed
    /// certificate is kept in memory only.
    #[arg(long, default_value = "", value_name = "string", help_heading = "Webhook serving flags")]
    pub webhook_cert_dir: String,
    /// PEM certificate of the webhook server, followed by any intermediates; re-read when it
    /// changes. Without it, a self-signed certificate for localhost is generated in memory.
    #[arg(long, default_value = "", value_name = "string", help_heading = "Webhook serving flags")]
    pub webhook_tls_cert_file: String,
    /// PEM private key of --webhook-tls-cert-file.
    #[arg(long, default_value = "", value_name = "string", help_heading = "Webhook serving flags")]
    pub webhook_tls_private_key_file: String,
    /// Cipher suites of the webhook server, as --tls-cipher-suites.
    #[arg(long, default_value = "", value_name = "strings", help_heading = "Webhook serving flags")]
    pub webhook_tls_cipher_suites: String,
    /// Oldest TLS version of the webhook server, as --tls-min-version.
    #[arg(long, default_value = "", value_name = "string", help_heading = "Webhook serving flags")]
    pub webhook_tls_min_version: String,
    /// Key-exchange groups of the webhook server, as --tls-curve-preferences.
    #[arg(long, default_value = "", value_name = "int32Slice", help_heading = "Webhook serving flags")]
    pub webhook_tls_curve_preferences: String,
    /// Extra certificate/key pairs of the webhook server chosen by SNI. Has no effect here.
    #[arg(long, value_name = "namedCertKey", help_heading = "Webhook serving flags")]
    pub webhook_tls_sni_cert_key: Vec<String>,
    /// Turn HTTP/2 off on the webhook server. Has no effect here: it speaks HTTP/1.1.
    #[arg(long, default_value_t = false, num_args = 0..=1, require_equals = true, default_missing_value = "true",
        value_parser = parse_bool, action = ArgAction::Set, help_heading = "Webhook serving flags")]
    pub webhook_disable_http2_serving: bool,

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
    /// Longest time between log flushes. Has no effect here: every line is written at once.
    #[arg(long, default_value = "5s", value_parser = parse_duration, value_name = "duration", help_heading = "Global flags")]
    pub log_flush_frequency: Duration,
    /// Info-line buffer of split text output (alpha upstream). Has no effect here.
    #[arg(long, default_value = "", value_name = "quantity", help_heading = "Global flags")]
    pub log_text_info_buffer_size: String,
    /// Split text output: errors to stderr, the rest to stdout (alpha upstream). Has no effect
    /// here.
    #[arg(long, default_value_t = false, num_args = 0..=1, require_equals = true, default_missing_value = "true",
        value_parser = parse_bool, action = ArgAction::Set, help_heading = "Global flags")]
    pub log_text_split_stream: bool,
    /// Print the version and exit (`--version`, `--version=raw`); `=false` is a no-op and
    /// `=vX.Y.Z` (upstream: override the reported version) is accepted with a warning.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_name = "version",
        help_heading = "Global flags")]
    pub version: Option<String>,

    // ----- Additions
    /// (Addition) Route operations run concurrently by the route controller; never more than
    /// 200 are in flight.
    #[arg(long, default_value_t = crds::defaults::CONCURRENT_ROUTE_SYNCS.into(), value_name = "int", help_heading = "Additions (not upstream flags)")]
    pub concurrent_route_syncs: i64,
    /// (Addition) Most Nodes per batched cloud instance lookup; the provider's own batch size
    /// caps it too. 1 reproduces upstream's one call per Node.
    #[arg(long, default_value_t = 500, value_name = "int", help_heading = "Additions (not upstream flags)")]
    pub node_batch_size: i64,
    /// (Addition) While a lookup is under way, how long new Nodes are collected before the next
    /// batched lookup (an idle controller looks a new Node up at once).
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
    /// (Addition) Delete orphaned cloud objects: those that carry this cluster's ownership and
    /// belong to no Service, once two scans in a row found them (docs/orphans.md). Off, they are
    /// only reported (status.orphans of --ccm-resource, the service_controller_orphans metric).
    /// Refused with --shadow.
    #[arg(long, default_value_t = false, num_args = 0..=1, require_equals = true, default_missing_value = "true",
        value_parser = parse_bool, action = ArgAction::Set, help_heading = "Additions (not upstream flags)")]
    pub orphan_sweep: bool,
    /// (Addition) Time between two orphan scans of the leader; 0s turns the scan off.
    #[arg(long, default_value = "10m0s", value_parser = parse_duration, value_name = "duration", help_heading = "Additions (not upstream flags)")]
    pub orphan_scan_period: Duration,
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
    /// (Addition, KEP-5778's proposed flag) Node ownership: the platforms this manager owns,
    /// comma-separated, each the scheme of a providerID (`aws` owns `aws:///...`). Nodes whose
    /// providerID names another platform (or, without one, whose
    /// `cloudprovider.kubernetes.io/platform` annotation does) are never initialized, deleted,
    /// tainted or routed by this manager; a Node with neither is initialized when the cloud
    /// knows it but never deleted. Empty: every Node (upstream).
    #[arg(long, value_delimiter = ',', value_name = "strings", help_heading = "Additions (not upstream flags)")]
    pub cloud_provider_platforms: Vec<String>,
    /// (Addition) Exit with status 1 when the leader Lease is lost, as upstream does. When
    /// false, the controllers stop and the process stands by for the next term.
    #[arg(long, default_value_t = true, num_args = 0..=1, require_equals = true, default_missing_value = "true",
        value_parser = parse_bool, action = ArgAction::Set, help_heading = "Additions (not upstream flags)")]
    pub exit_on_lost_lease: bool,
}

impl Flags {
    /// Parse `args` (the first is the program name).
    pub fn try_parse_args<I, T>(args: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        Self::try_parse_from(args)
    }
}
