//! `ccm-operator`: runs the operator, or prints the CRD (`ccm-operator crd`).

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use ccm_framework::client::{self, ClientSource, RateLimitLayer};
use ccm_framework::http::{HttpConfig, Tls, TlsFiles};
use ccm_framework::serving::{AuthConfig, AuthSettings, TlsOptions};
use clap::{ArgAction, Parser, Subcommand};
use operator::{BuildSettings, OperatorConfig, Scope, Timings};
use tracing_subscriber::EnvFilter;

/// Where a pod's own namespace is mounted in-cluster.
const NAMESPACE_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

/// The ccm-operator: reconciles CloudControllerManager resources into running
/// cloud-controller-managers.
#[derive(Debug, Parser)]
#[command(name = "ccm-operator", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: RunFlags,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print the CloudControllerManager CustomResourceDefinition as YAML.
    Crd,
    /// Run the operator (the default).
    Run,
}

#[derive(Debug, clap::Args)]
struct RunFlags {
    /// Path to a kubeconfig; default: in-cluster configuration, else the usual kubeconfig.
    #[arg(long, env = "KUBECONFIG", value_name = "path")]
    kubeconfig: Option<String>,
    /// Namespaces to serve, comma-separated; empty serves every namespace.
    #[arg(long, env = "WATCH_NAMESPACES", value_delimiter = ',', value_name = "namespaces")]
    namespaces: Vec<String>,
    /// Namespaces, comma-separated, where the operator reads cloud-config Secrets and runs
    /// managers (its RBAC to read Secrets exists only there); a CloudControllerManager in any
    /// other namespace is refused with NamespaceNotAllowed. Default: the --namespaces list when
    /// given, else kube-system.
    #[arg(long, env = "CLOUD_CONFIG_NAMESPACES", value_delimiter = ',', value_name = "namespaces")]
    cloud_config_namespaces: Vec<String>,
    /// Image of the cloud-controller-manager in Deployment and DaemonSet modes (a CR's
    /// spec.deployment.image overrides it).
    #[arg(long, env = "MANAGER_IMAGE", default_value_t = BuildSettings::default().manager_image, value_name = "image")]
    manager_image: String,
    /// ClusterRole (installed by the Helm chart) bound cluster-wide to each manager's
    /// ServiceAccount; the operator needs only `bind` on it.
    #[arg(long, default_value = "ccm-manager", value_name = "name")]
    manager_cluster_role: String,
    /// ClusterRole (installed by the Helm chart) bound in each CR's namespace to its manager,
    /// for the manager's Lease and the CR's status; the operator needs only `bind` on it.
    #[arg(long, default_value = "ccm-manager-namespace", value_name = "name")]
    manager_namespace_role: String,
    /// Read-only ClusterRole (installed by the Helm chart) bound cluster-wide, instead of
    /// --manager-cluster-role, to the manager of a CR with spec.shadow: a shadow manager reads
    /// Nodes and Services and writes none.
    #[arg(long, default_value_t = BuildSettings::default().manager_shadow_cluster_role, value_name = "name")]
    manager_shadow_cluster_role: String,
    /// ClusterRole (installed by the Helm chart) bound cluster-wide, instead of
    /// --manager-cluster-role, to an upstream CCM image's ServiceAccount (spec.upstream).
    #[arg(long, default_value_t = BuildSettings::default().manager_upstream_cluster_role, value_name = "name")]
    manager_upstream_cluster_role: String,
    /// HTTPS address of /healthz, /livez, /readyz and /metrics; empty disables them. Paths
    /// outside --authorization-always-allow-paths need a bearer token that the API server
    /// accepts (TokenReview) and allows (SubjectAccessReview), as the manager's --secure-port.
    #[arg(long, default_value = "0.0.0.0:8080", value_name = "host:port")]
    http_address: String,
    /// PEM certificate of the endpoint; without it a self-signed one is generated at start.
    #[arg(long, default_value = "", value_name = "path")]
    tls_cert_file: String,
    /// PEM private key of --tls-cert-file. Both files are re-read when they change.
    #[arg(long, default_value = "", value_name = "path")]
    tls_private_key_file: String,
    /// Oldest TLS version accepted: VersionTLS12 (default) or VersionTLS13; older ones are refused.
    #[arg(long, default_value = "", value_name = "version")]
    tls_min_version: String,
    /// Cipher suites offered, comma-separated, by upstream's names; a suite rustls cannot
    /// provide is refused at start. Empty: every available suite.
    #[arg(long, default_value = "", value_name = "suites")]
    tls_cipher_suites: String,
    /// Kubeconfig for TokenReviews; empty: the operator's own client configuration.
    #[arg(long, default_value = "", value_name = "path")]
    authentication_kubeconfig: String,
    /// Kubeconfig for SubjectAccessReviews; empty: the operator's own client configuration.
    #[arg(long, default_value = "", value_name = "path")]
    authorization_kubeconfig: String,
    /// Paths served without a token; an entry ending in '*' is a prefix.
    #[arg(long, value_delimiter = ',', default_value = "/healthz,/readyz,/livez", value_name = "paths")]
    authorization_always_allow_paths: Vec<String>,
    /// Elect a leader on Lease `ccm-operator`, so that only one replica reconciles.
    #[arg(long, default_value_t = true, action = ArgAction::Set, value_name = "bool")]
    leader_elect: bool,
    /// Namespace of the operator's Lease; default: the pod's namespace, else kube-system.
    #[arg(long, env = "POD_NAMESPACE", value_name = "namespace")]
    leader_elect_namespace: Option<String>,
    /// How long transient failures must last before Degraded turns True.
    #[arg(long, default_value = "2m", value_parser = ccm_framework::go_values::parse_duration, value_name = "duration")]
    degraded_window: Duration,
    /// At start, server-side apply the CloudControllerManager CRD this binary was built with (the
    /// chart's crds.manage); when RBAC forbids it, log that and use the CRD as it is.
    #[arg(long, default_value_t = true, action = ArgAction::Set, value_name = "bool")]
    manage_crd: bool,
    /// Allow `spec.mode: Embedded` (the chart's embedded.enabled, which grants the operator the
    /// manager's rights); when false such a resource is refused with EmbeddedNotEnabled and
    /// whatever already runs for it is left alone.
    #[arg(long, default_value_t = true, action = ArgAction::Set, value_name = "bool")]
    embedded_enabled: bool,
    /// Whether this process shares its Node's network namespace, where an embedded engine's
    /// proxy listeners (baremetal loadBalancer.mode: proxy) are reachable; the chart's operator
    /// Pod is not, and passes false.
    #[arg(long, default_value_t = true, action = ArgAction::Set, value_name = "bool")]
    embedded_host_network: bool,
    /// Images a CloudControllerManager's spec.deployment.image may name, on repository
    /// boundaries: `registry/repo:` any tag, `registry/repo@` any digest, `registry/` any
    /// repository there, `registry/repo` any tag or digest of it (not `registry/repo-evil`), an
    /// entry with a tag or digest that image only. Empty: only --manager-image.
    #[arg(long, value_delimiter = ',', value_name = "strings")]
    allowed_images: Vec<String>,
    /// spec.deployment.image must be pinned by digest (name@sha256:...).
    #[arg(long, default_value_t = false, action = ArgAction::Set, value_name = "bool")]
    require_image_digest: bool,
    /// spec.deployment.image may be tagged latest, or have no tag (which pulls latest).
    #[arg(long, default_value_t = false, action = ArgAction::Set, value_name = "bool")]
    allow_latest_image: bool,
    /// The most a manager container may request or be limited to, as name=quantity pairs,
    /// comma-separated; a resource not listed may not be asked for, and with a memory maximum a
    /// CR's spec.deployment.resources must set a memory limit. Empty: no maximum.
    #[arg(long, value_delimiter = ',', default_value = operator::validate::DEFAULT_MAX_CONTAINER_RESOURCES, value_name = "name=quantity")]
    max_container_resources: Vec<String>,
    /// Allow DaemonSet mode on every Node: an empty spec.deployment.nodeSelector, and a
    /// toleration of every taint (operator Exists without a key).
    #[arg(long, default_value_t = false, action = ArgAction::Set, value_name = "bool")]
    allow_any_node: bool,
    /// Lease names no CloudControllerManager (nor its migration Lease) may take, besides the
    /// built-in ones, comma-separated; an entry ending in '*' is a prefix.
    #[arg(long, value_delimiter = ',', value_name = "names")]
    reserved_lease_names: Vec<String>,
    /// The most replicas a CloudControllerManager may ask for (spec.deployment.replicas).
    #[arg(long, default_value_t = operator::validate::DEFAULT_MAX_REPLICAS, value_name = "int")]
    max_replicas: i32,
    /// Priority classes a CloudControllerManager may name (spec.deployment.priorityClassName);
    /// no priority class is always allowed.
    #[arg(long, value_delimiter = ',', default_value = operator::validate::DEFAULT_PRIORITY_CLASS, value_name = "strings")]
    allowed_priority_classes: Vec<String>,
    /// Allow spec.announcer: per-node announcer DaemonSets (host network, NET_RAW for L2) of the
    /// baremetal provider (the chart's announcer.enabled, which installs their ClusterRoles).
    #[arg(long, default_value_t = false, action = ArgAction::Set, value_name = "bool")]
    allow_announcers: bool,
    /// Namespaces, comma-separated, where spec.announcer may be set; empty: every namespace of
    /// --cloud-config-namespaces.
    #[arg(long, value_delimiter = ',', value_name = "namespaces")]
    announcer_namespaces: Vec<String>,
    /// Image of the BIRD sidecar of spec.announcer.bgp; empty refuses bgp.
    #[arg(long, default_value = "", value_name = "image")]
    bird_image: String,
    /// ClusterRole (installed by the Helm chart) bound cluster-wide to each announcer's
    /// ServiceAccount; the operator needs only `bind` on it.
    #[arg(long, default_value_t = BuildSettings::default().announcer_cluster_role, value_name = "name")]
    announcer_cluster_role: String,
    /// ClusterRole (installed by the Helm chart) bound in each CR's namespace to its announcers
    /// (their Leases); the operator needs only `bind` on it.
    #[arg(long, default_value_t = BuildSettings::default().announcer_namespace_role, value_name = "name")]
    announcer_namespace_role: String,
    /// ClusterRole (installed by the Helm chart) bound cluster-wide to the node manager of an
    /// upstream profile that has one (spec.upstream.nodeManager); the operator needs only `bind`
    /// on it.
    #[arg(long, default_value_t = BuildSettings::default().node_manager_cluster_role, value_name = "name")]
    node_manager_cluster_role: String,
    /// Reconcile every CloudControllerManager at least this often.
    #[arg(long, default_value = "5m", value_parser = ccm_framework::go_values::parse_duration, value_name = "duration")]
    resync_period: Duration,
    /// Reconciles running at once.
    #[arg(long, default_value_t = 8, value_name = "int")]
    concurrency: u16,
    /// Log level (RUST_LOG overrides it).
    #[arg(long, default_value = "info", value_name = "level")]
    log_level: String,
    /// Log as JSON lines.
    #[arg(long, default_value_t = false)]
    log_json: bool,
}

fn init_logging(level: &str, json: bool) {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new(ccm_framework::process::default_directives(level)));
    // Colours only on a terminal: `kubectl logs` and log files get plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    let _ = if json { builder.json().try_init() } else { builder.try_init() };
}

/// Refuses a `--max-container-resources` below the resources the operator gives a CR that sets
/// none: its managers could never start.
fn defaults_within(maximums: &[operator::validate::ResourceMaximum]) -> Result<(), operator::Error> {
    let defaults = operator::build::default_resources();
    for (name, quantity) in defaults.requests.iter().chain(defaults.limits.iter()).flatten() {
        let Some(max) = maximums.iter().find(|m| &m.name == name) else { continue };
        if operator::validate::quantity::Amount::parse(&quantity.0).is_ok_and(|a| a > max.amount) {
            return Err(operator::Error::Config(format!(
                "--max-container-resources: {name} {} is below the {} the operator gives managers whose resource sets no spec.deployment.resources",
                max.shown, quantity.0
            )));
        }
    }
    Ok(())
}

fn lease_namespace(flag: Option<String>) -> String {
    flag.filter(|n| !n.is_empty())
        .or_else(|| std::fs::read_to_string(NAMESPACE_FILE).ok().map(|n| n.trim().to_string()))
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "kube-system".to_string())
}

async fn run(flags: RunFlags) -> Result<(), operator::Error> {
    let source = ClientSource { kubeconfig: flags.kubeconfig.clone(), master: None };
    let config = client::load_config(&source).await?;
    let client = client::build_client(config.clone(), &RateLimitLayer::disabled())?;
    let namespaces: Vec<String> =
        flags.namespaces.into_iter().map(|n| n.trim().to_string()).filter(|n| !n.is_empty()).collect();
    let http = if flags.http_address.is_empty() {
        None
    } else {
        let address: SocketAddr = flags
            .http_address
            .parse()
            .map_err(|e| operator::Error::Config(format!("--http-address {:?}: {e}", flags.http_address)))?;
        let tls = match (flags.tls_cert_file.is_empty(), flags.tls_private_key_file.is_empty()) {
            (true, true) => Tls::SelfSigned,
            (false, false) => Tls::Files(TlsFiles {
                cert: flags.tls_cert_file.clone().into(),
                key: flags.tls_private_key_file.clone().into(),
            }),
            _ => {
                return Err(operator::Error::Config(
                    "--tls-cert-file and --tls-private-key-file must be given together".into(),
                ));
            }
        };
        let auth = AuthConfig {
            authentication_kubeconfig: Some(flags.authentication_kubeconfig.clone()).filter(|s| !s.is_empty()),
            authorization_kubeconfig: Some(flags.authorization_kubeconfig.clone()).filter(|s| !s.is_empty()),
            ..AuthConfig::new(AuthSettings {
                always_allow_paths: flags
                    .authorization_always_allow_paths
                    .iter()
                    .filter(|p| !p.is_empty())
                    .cloned()
                    .collect(),
                ..AuthSettings::default()
            })
        };
        let tls_options = TlsOptions::from_flags(&flags.tls_min_version, &flags.tls_cipher_suites)?;
        Some(
            HttpConfig::new(address)
                .with_tls(tls)
                .with_tls_options(tls_options)
                .with_auth(auth)
                .resolve_auth(&config)
                .await?,
        )
    };
    let mut config = OperatorConfig::new(client);
    config.scope = if namespaces.is_empty() { Scope::All } else { Scope::Namespaces(namespaces) };
    let cloud_config_namespaces: Vec<String> =
        flags.cloud_config_namespaces.into_iter().map(|n| n.trim().to_string()).filter(|n| !n.is_empty()).collect();
    if !cloud_config_namespaces.is_empty() {
        config.cloud_config_namespaces = Some(cloud_config_namespaces);
    }
    let list = |v: Vec<String>| v.into_iter().map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect();
    let max_container_resources = operator::validate::parse_max_container_resources(&flags.max_container_resources)
        .map_err(|e| operator::Error::Config(e.to_string()))?;
    defaults_within(&max_container_resources)?;
    config.build = BuildSettings {
        manager_image: flags.manager_image,
        manager_cluster_role: flags.manager_cluster_role,
        manager_namespace_role: flags.manager_namespace_role,
        manager_shadow_cluster_role: flags.manager_shadow_cluster_role,
        manager_upstream_cluster_role: flags.manager_upstream_cluster_role,
        announcer_cluster_role: flags.announcer_cluster_role,
        announcer_namespace_role: flags.announcer_namespace_role,
        node_manager_cluster_role: flags.node_manager_cluster_role,
        policy: operator::validate::Policy {
            allowed_images: list(flags.allowed_images),
            require_image_digest: flags.require_image_digest,
            allow_latest_image: flags.allow_latest_image,
            max_replicas: flags.max_replicas,
            allowed_priority_classes: list(flags.allowed_priority_classes),
            max_container_resources,
            allow_any_node: flags.allow_any_node,
            allow_announcers: flags.allow_announcers,
            announcer_namespaces: list(flags.announcer_namespaces),
            bird_image: Some(flags.bird_image.trim().to_string()).filter(|i| !i.is_empty()),
            reserved_lease_names: list(flags.reserved_lease_names),
        },
        manager_disable_http2: std::env::var(client::DISABLE_HTTP2_ENV).is_ok_and(|v| !v.is_empty()),
    };
    config.http = http;
    config.manage_crd = flags.manage_crd;
    config.environment = operator::validate::Environment {
        embedded_enabled: flags.embedded_enabled,
        host_network: flags.embedded_host_network,
    };
    config.timings = Timings {
        degraded_window: flags.degraded_window,
        requeue: flags.resync_period,
        concurrency: flags.concurrency,
        ..Timings::default()
    };
    if flags.leader_elect {
        let ns = lease_namespace(flags.leader_elect_namespace);
        config.leader_election = Some(OperatorConfig::operator_lease(&ns, &config.identity));
    }
    tracing::info!(version = env!("CARGO_PKG_VERSION"), identity = %config.identity, scope = ?config.scope, cloud_config_namespaces = ?config.allowed_namespaces().as_slice(), "starting ccm-operator");
    operator::run(config, ccm_framework::process::shutdown_on_signal()).await
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(Command::Crd) = cli.command {
        return match crds::crd_yaml() {
            Ok(yaml) => {
                print!("{yaml}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(1)
            }
        };
    }
    init_logging(&cli.run.log_level, cli.run.log_json);
    // The rendered managers' data paths are not in this process, but its watches and serving are.
    ccm_framework::process::raise_open_file_limit();
    ccm_framework::process::limit_malloc_arenas();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: could not start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(run(cli.run)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "ccm-operator failed");
            ExitCode::from(1)
        }
    }
}
