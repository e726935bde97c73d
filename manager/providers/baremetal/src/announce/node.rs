//! `cloud-controller-manager announce`: the per-node L2 announcer process, run by a DaemonSet
//! (host network, `CAP_NET_RAW` only). It reads `loadBalancer.announcement.l2` from the same
//! mounted cloud-config as the manager, opens a packet socket per configured interface, and runs
//! [`super::announcer::run`] with a responder per socket until SIGTERM, when it deletes its
//! Lease so another node takes its addresses over at once.
//! With `loadBalancer.announcement.bgp` it also keeps a BIRD sidecar advertising this node's
//! addresses ([`super::bgp::bird::run`]; the node's IPv4 from `$NODE_IP`).
//! A health monitor ([`super::health_probe`]) watches the L2 interfaces, the responders and,
//! when configured, kube-proxy's health endpoint; while any fails the announcer gives its
//! addresses up ([`super::health`]). With `--secure-port` it serves its gauges
//! ([`super::metrics`]) over HTTPS behind token and access reviews.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::process::ExitCode;

use tokio::sync::watch;

use super::announcer::{self, AnnouncerSettings};
use super::health_probe::{self, LinkProbe, Monitor, WatchedResponder};
use super::responder::{self, L2Socket};
use ccm_framework::events::EventSink;
use ccm_framework::health::HealthRegistry;
use ccm_framework::http::{HttpConfig, HttpState, Listener};
use ccm_framework::metrics::Metrics;
use ccm_framework::process::LogSettings;
use ccm_framework::serving::{AuthConfig, AuthSettings};

/// The subcommand's name: `cloud-controller-manager announce ...`.
pub use super::SUBCOMMAND;

/// Usage text, printed for `--help` and a bad flag.
pub const USAGE: &str = "\
usage: cloud-controller-manager announce --cloud-config PATH [--node NAME] [--namespace NS] [--load-balancer-class CLASS]
                                        [--secure-port PORT] [--bind-address IP] [-v LEVEL]
  --cloud-config         the baremetal cloud-config; its loadBalancer.announcement.l2 lists the interfaces,
                         .bgp the BGP peers (BIRD beside this process; the router ID defaults to $NODE_IP)
  --node                 this node's name (default: $NODE_NAME, from the downward API)
  --namespace            where the announcer Leases live (default: $POD_NAMESPACE)
  --load-balancer-class  announce Services of this class (default: Services without a class)
  --secure-port          serve /metrics (and /healthz, /readyz, /livez) over HTTPS on this port, bearer tokens
                         checked with TokenReview and SubjectAccessReview (default 0: no endpoint)
  --bind-address         the address that endpoint listens on (default 0.0.0.0)
  -v                     log level: error, warn, info (default), debug";

/// The parsed flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Flags {
    /// `--cloud-config`.
    pub cloud_config: String,
    /// `--node` or `$NODE_NAME`.
    pub node: String,
    /// `--namespace` or `$POD_NAMESPACE`.
    pub namespace: String,
    /// `--load-balancer-class`.
    pub class: Option<String>,
    /// `--secure-port`: the metrics endpoint's port; 0, none.
    pub secure_port: u16,
    /// `--bind-address`: where the endpoint listens.
    pub bind_address: IpAddr,
    /// `-v`.
    pub level: tracing::Level,
}

/// Parse the flags after the subcommand; `env` reads defaults. The error names the flag.
pub fn parse_flags(args: &[String], env: impl Fn(&str) -> Option<String>) -> Result<Flags, String> {
    let mut cloud_config = None;
    let mut node = env("NODE_NAME");
    let mut namespace = env("POD_NAMESPACE");
    let mut class = None;
    let mut secure_port = 0;
    let mut bind_address = IpAddr::from([0, 0, 0, 0]);
    let mut level = tracing::Level::INFO;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) => (f, Some(v.to_string())),
            None => (arg.as_str(), None),
        };
        let mut value = || inline.clone().or_else(|| it.next().cloned()).ok_or(format!("{flag} needs a value"));
        match flag {
            "--cloud-config" => cloud_config = Some(value()?),
            "--node" => node = Some(value()?),
            "--namespace" => namespace = Some(value()?),
            "--load-balancer-class" => class = Some(value()?).filter(|c| !c.is_empty()),
            "--secure-port" => {
                let v = value()?;
                secure_port = v.parse().map_err(|_| format!("--secure-port: {v:?} is not a port (0-65535)"))?;
            }
            "--bind-address" => {
                let v = value()?;
                bind_address = v.parse().map_err(|_| format!("--bind-address: {v:?} is not an IP address"))?;
            }
            "-v" | "--v" => {
                let v = value()?;
                level = v.parse().map_err(|_| format!("-v: {v:?} is not one of error, warn, info, debug, trace"))?;
            }
            other => return Err(format!("unknown flag {other:?}")),
        }
    }
    let required = |v: Option<String>, what: &str| v.filter(|s| !s.is_empty()).ok_or(format!("{what} is required"));
    Ok(Flags {
        cloud_config: required(cloud_config, "--cloud-config")?,
        node: required(node, "--node (or $NODE_NAME)")?,
        namespace: required(namespace, "--namespace (or $POD_NAMESPACE)")?,
        class,
        secure_port,
        bind_address,
        level,
    })
}

/// Run the subcommand with `args` (after `announce`); the process's exit code.
pub fn main(args: &[String]) -> ExitCode {
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let flags = match parse_flags(args, |k| std::env::var(k).ok()) {
        Ok(flags) => flags,
        Err(error) => {
            eprintln!("{error}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    ccm_framework::process::init_logging(LogSettings { level: flags.level, json: false });
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("starting the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(flags)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(%error, "announcer stopped");
            ExitCode::FAILURE
        }
    }
}

async fn run(flags: Flags) -> Result<(), String> {
    // The cloud-config is read with the manager's bounded parser; only field paths reach errors.
    let bytes = std::fs::read(&flags.cloud_config).map_err(|e| format!("--cloud-config: cannot read the file: {e}"))?;
    let config = crate::config::parse(&bytes).map_err(|e| format!("--cloud-config: {e}"))?;
    let cancel = ccm_framework::process::shutdown_on_signal();
    let announcement = config.load_balancer.announcement.clone();
    if announcement.l2.is_none() && announcement.bgp.is_none() {
        tracing::info!("loadBalancer.announcement sets neither l2 nor bgp: nothing to announce; idle until stopped");
        cancel.cancelled().await;
        return Ok(());
    }
    let health = announcement.health.clone().unwrap_or_default();
    let mut sockets = Vec::new();
    let mut links = Vec::new();
    for interface in announcement.l2.iter().flat_map(|l2| &l2.interfaces) {
        sockets.push(L2Socket::open(interface).map_err(|e| e.to_string())?);
        if health.check_interfaces {
            links.push(LinkProbe::open(interface).map_err(|e| e.to_string())?);
        }
    }
    let kube_config = kube::Config::infer().await.map_err(|e| format!("connecting to the API server: {e}"))?;
    let client =
        kube::Client::try_from(kube_config.clone()).map_err(|e| format!("connecting to the API server: {e}"))?;
    let metrics = if flags.secure_port == 0 {
        None
    } else {
        let address = std::net::SocketAddr::new(flags.bind_address, flags.secure_port);
        let (address, metrics) = serve_metrics(address, &kube_config, cancel.clone()).await?;
        tracing::info!(%address, "serving /metrics");
        Some(metrics)
    };
    let events = EventSink::spawn(client.clone(), Some(flags.node.clone()), cancel.clone());
    let (owned, watching) = watch::channel(BTreeSet::<IpAddr>::new());
    let responders_stop = tokio_util::sync::CancellationToken::new();
    let mut responders = Vec::new();
    let mut stopped = Vec::new();
    // A pool may answer on some interfaces only: each responder gets its share of the owned set.
    let (only_on_tx, only_on) = watch::channel(Default::default());
    for socket in sockets {
        tracing::info!(interface = socket.interface(), "answering ARP and NDP");
        let done = tokio_util::sync::CancellationToken::new();
        stopped.push(WatchedResponder {
            interface: socket.interface().to_string(),
            stopped: done.clone(),
            pulse: socket.pulse(),
        });
        let answered = responder::on_interface(
            watching.clone(),
            only_on.clone(),
            socket.interface().to_string(),
            responders_stop.clone(),
        );
        let task = responder::run(socket, answered, responders_stop.clone());
        responders.push(tokio::spawn(health_probe::watched(task, done)));
    }
    let mut settings = AnnouncerSettings::new(flags.node, flags.namespace);
    settings.class = flags.class;
    // Which node answers, as data (docs/l2-announcement.md#which-node-answers): only for L2,
    // whose answering node is one per address.
    settings.record = announcement.l2.is_some();
    settings.interfaces = announcement.l2.iter().flat_map(|l2| l2.interfaces.clone()).collect();
    settings.l2_interfaces = Some(only_on_tx);
    // Only what the pools hand out is ever announced: the pools (file, resources, imports),
    // the inventory and this host's own network, kept current (docs/security.md).
    let sources = super::sources::SourceSettings::new(&flags.cloud_config);
    settings.facts = super::sources::spawn(client.clone(), config, sources, super::host::read, cancel.clone());
    // Self-healing: an interface down, a stopped responder or a failing kube-proxy gives this
    // node's addresses up until healthy again (docs/l2-announcement.md#self-healing).
    let node_ip = std::env::var(super::bgp::NODE_IP_ENV).ok().and_then(|ip| ip.parse().ok());
    let kube_proxy = health.kube_proxy(node_ip).map_err(|e| e.to_string())?;
    let monitor = Monitor { links, responders: stopped, kube_proxy, interval: health.interval() };
    settings.health = health_probe::spawn(monitor, cancel.clone());
    let mut bgp_advertised = None;
    if let Some(bgp) = announcement.bgp {
        // BGP: the BIRD sidecar advertises what this node serves (docs/datapath.md).
        let (tx, rx) = watch::channel(super::bgp::Advertisement::default());
        settings.bgp = Some(tx);
        let ipv4 = match node_ip {
            Some(std::net::IpAddr::V4(ip)) => Some(ip),
            _ => None,
        };
        let bird = super::bgp::bird::BirdAnnouncer::new(bgp, super::bgp::NodeFacts { ipv4 }, Default::default());
        // Its sessions go into this node's Lease (docs/bgp-announcement.md#session-state).
        let (sessions, read) = watch::channel(Vec::new());
        settings.bgp_sessions = read;
        bgp_advertised = Some(rx.clone());
        tokio::spawn(super::bgp::bird::run(bird, rx, sessions, cancel.clone()));
    }
    if let Some(metrics) = metrics {
        let gauges = super::metrics::AnnouncerGauges::register(&metrics);
        let inputs = super::metrics::Inputs {
            owned: watching.clone(),
            l2: settings.record,
            bgp: bgp_advertised,
            sessions: settings.bgp_sessions.clone(),
            health: settings.health.clone(),
        };
        tokio::spawn(super::metrics::run(gauges, inputs, cancel.clone()));
    }
    let result = announcer::run(client, settings, owned, Some(events), cancel).await;
    responders_stop.cancel();
    for responder in responders {
        if let Ok(Err(error)) = responder.await {
            tracing::warn!(%error, "responder stopped");
        }
    }
    result.map_err(|e| e.to_string())
}

/// The metrics endpoint on `address` (the `--bind-address:--secure-port` of an announcer):
/// HTTPS with a self-signed certificate, delegated authentication and authorization through
/// `kube_config`'s identity, as the manager's endpoint (docs/l2-announcement.md#metrics).
/// Returns where it listens and the registry to fill.
pub async fn serve_metrics(
    address: std::net::SocketAddr,
    kube_config: &kube::Config,
    cancel: tokio_util::sync::CancellationToken,
) -> Result<(std::net::SocketAddr, std::sync::Arc<Metrics>), String> {
    let config = HttpConfig::new(address)
        .with_auth(AuthConfig::new(AuthSettings::default()))
        .resolve_auth(kube_config)
        .await
        .map_err(|e| format!("--secure-port: {e}"))?;
    let listener = Listener::bind(&config).await.map_err(|e| format!("--secure-port: {e}"))?;
    let local = listener.local_addr();
    let metrics = std::sync::Arc::new(Metrics::new());
    // No health check of its own: an unhealthy node's announcer gives its addresses up and
    // keeps running (a restart would not mend an interface), so liveness is only "it answers".
    let state = HttpState {
        health: HealthRegistry::new(),
        ready: HealthRegistry::new(),
        metrics: metrics.clone(),
        capabilities: None,
    };
    tokio::spawn(listener.serve(state, cancel));
    Ok((local, metrics))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn flags_take_values_inline_or_next_and_default_from_the_downward_api() {
        let env = |k: &str| match k {
            "NODE_NAME" => Some("worker-1".to_string()),
            "POD_NAMESPACE" => Some("kube-system".to_string()),
            _ => None,
        };
        let flags =
            parse_flags(&args("--cloud-config=/etc/ccm/cloud.yaml --load-balancer-class x -v debug"), env).unwrap();
        assert_eq!(flags.node, "worker-1");
        assert_eq!(flags.namespace, "kube-system");
        assert_eq!(flags.cloud_config, "/etc/ccm/cloud.yaml");
        assert_eq!(flags.class.as_deref(), Some("x"));
        assert_eq!(flags.level, tracing::Level::DEBUG);
        assert_eq!((flags.secure_port, flags.bind_address), (0, IpAddr::from([0, 0, 0, 0])), "no endpoint by default");
        let flags = parse_flags(&args("--cloud-config c --node n --namespace ns"), env).unwrap();
        assert_eq!((flags.node.as_str(), flags.namespace.as_str(), flags.class), ("n", "ns", None));
        let flags = parse_flags(&args("--cloud-config c --secure-port=7473 --bind-address 192.0.2.4"), env).unwrap();
        assert_eq!((flags.secure_port, flags.bind_address), (7473, IpAddr::from([192, 0, 2, 4])));
    }

    #[test]
    fn a_missing_or_unknown_flag_is_named() {
        let none = |_: &str| None;
        assert!(parse_flags(&args("--node n --namespace ns"), none).unwrap_err().contains("--cloud-config"));
        assert!(parse_flags(&args("--cloud-config c --namespace ns"), none).unwrap_err().contains("--node"));
        assert!(
            parse_flags(&args("--cloud-config c --node n --namespace ns --bogus"), none)
                .unwrap_err()
                .contains("--bogus")
        );
        assert!(parse_flags(&args("--cloud-config"), none).unwrap_err().contains("needs a value"));
        let base = "--cloud-config c --node n --namespace ns";
        assert!(
            parse_flags(&args(&format!("{base} --secure-port 70000")), none).unwrap_err().contains("--secure-port")
        );
        assert!(
            parse_flags(&args(&format!("{base} --bind-address $(POD_IP)")), none)
                .unwrap_err()
                .contains("--bind-address")
        );
        assert!(
            parse_flags(&args("--cloud-config c --node n --namespace ns -v loud"), none).unwrap_err().contains("-v")
        );
    }
}
