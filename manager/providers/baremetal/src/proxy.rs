//! `loadBalancer.mode: proxy`: the manager's leader also carries the traffic of the addresses
//! it assigns, with the data path ([`crate::datapath`]), and reports `ipMode: Proxy`.
//!
//! Backends are the eligible Nodes' InternalIPs at the Service's nodePorts (kube-proxy takes it
//! from there); health checks follow kube-proxy's conventions. Listeners bind on the node the
//! leader runs on, either because the pool's addresses are configured on one of its interfaces
//! (`bind: local`, the default) or with `IP_FREEBIND` when the pool is routed to that node
//! (`bind: freebind`). See docs/datapath.md.

use std::fmt;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Duration;

#[cfg(feature = "datapath")]
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, Patch, PatchParams};
use serde::{Deserialize, Deserializer};
#[cfg(feature = "datapath")]
use tokio_util::sync::CancellationToken;

#[cfg(feature = "datapath")]
use crate::datapath::{
    Balance, BindMode, DataPath, DataPathError, HealthSettings, ProxyProtocol, ServiceOptions, Settings,
};
#[cfg(feature = "datapath")]
use ccm_framework::events::EventSink;
#[cfg(feature = "datapath")]
use ccm_framework::events::components::SERVICE_CONTROLLER;
#[cfg(feature = "datapath")]
use ccm_framework::metrics::Metrics;
use ccm_framework::provider::CloudError;
#[cfg(feature = "datapath")]
use ccm_framework::provider::Refusal;
use ccm_framework::safe_yaml;
#[cfg(feature = "datapath")]
use k8s_openapi::api::core::v1::ObjectReference;
#[cfg(feature = "datapath")]
use kube::Resource;

/// The annotation kube-vip reads the addresses to announce from (comma-separated).
pub const KUBE_VIP_ANNOTATION: &str = "kube-vip.io/loadbalancerIPs";

/// Field manager of the provider's own Service writes (the kube-vip annotation).
pub const FIELD_MANAGER: &str = "ccm-baremetal-provider";

/// `ipMode` reported in proxy mode: traffic reaches the backends through this proxy.
pub const IP_MODE_PROXY: &str = "Proxy";

/// The annotation choosing one Service's `ipMode`: `VIP` or `Proxy`.
pub const IP_MODE_ANNOTATION: &str = "ccm.rs/ip-mode";

/// The `ipMode` a Service's ingress gets, and so who carries its traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpMode {
    /// kube-proxy on the node an announcer draws the traffic to (or a router) delivers it.
    Vip,
    /// The leader's data path carries it.
    Proxy,
}

impl IpMode {
    /// The value of `status.loadBalancer.ingress[].ipMode`.
    pub fn as_str(self) -> &'static str {
        match self {
            IpMode::Vip => crate::IP_MODE,
            IpMode::Proxy => IP_MODE_PROXY,
        }
    }
}

/// The `ipMode` of `service`: its [`IP_MODE_ANNOTATION`] when set, else `Proxy` with the data
/// path on (`proxy_on`) and `VIP` without. Asking `Proxy` without the data path, or another
/// value, is an error naming the annotation (never echoing the value).
pub fn ip_mode_of(service: &Service, proxy_on: bool) -> Result<IpMode, String> {
    let asked = service.metadata.annotations.as_ref().and_then(|a| a.get(IP_MODE_ANNOTATION));
    match asked.map(|v| v.trim()) {
        None => Ok(if proxy_on { IpMode::Proxy } else { IpMode::Vip }),
        Some(v) if v.eq_ignore_ascii_case(crate::IP_MODE) => Ok(IpMode::Vip),
        Some(v) if v.eq_ignore_ascii_case(IP_MODE_PROXY) => {
            if proxy_on {
                Ok(IpMode::Proxy)
            } else {
                Err(format!(
                    "annotation {IP_MODE_ANNOTATION}: Proxy needs loadBalancer.mode: proxy in the cloud-config (this manager only assigns addresses)"
                ))
            }
        }
        Some(_) => Err(format!("annotation {IP_MODE_ANNOTATION}: must be VIP or Proxy")),
    }
}

/// The annotation asking the data path to start each backend connection with a PROXY protocol
/// header: `v1` or `v2`.
pub const PROXY_PROTOCOL_ANNOTATION: &str = "ccm.rs/proxy-protocol";

/// The PROXY protocol version `service` asks for with [`PROXY_PROTOCOL_ANNOTATION`] (`None`:
/// no header). A value other than `v1` or `v2`, or the annotation on a Service with a UDP
/// port (the header exists for TCP only), is an error naming the annotation (never echoing the
/// value).
#[cfg(feature = "datapath")]
pub fn proxy_protocol_of(service: &Service) -> Result<Option<ProxyProtocol>, String> {
    let Some(asked) = service.metadata.annotations.as_ref().and_then(|a| a.get(PROXY_PROTOCOL_ANNOTATION)) else {
        return Ok(None);
    };
    let version = match asked.trim() {
        v if v.eq_ignore_ascii_case("v1") => ProxyProtocol::V1,
        v if v.eq_ignore_ascii_case("v2") => ProxyProtocol::V2,
        _ => return Err(format!("annotation {PROXY_PROTOCOL_ANNOTATION}: must be v1 or v2")),
    };
    let ports = service.spec.as_ref().and_then(|s| s.ports.as_ref());
    if let Some(udp) = ports.into_iter().flatten().find(|p| p.protocol.as_deref() == Some("UDP")) {
        return Err(format!(
            "annotation {PROXY_PROTOCOL_ANNOTATION}: the PROXY protocol is for TCP only, and port {} is UDP (serve the UDP ports from another Service)",
            udp.port
        ));
    }
    Ok(Some(version))
}

/// How long a Service waits when one of its listeners cannot be opened.
#[cfg(feature = "datapath")]
const BIND_RETRY: Duration = Duration::from_secs(5);

/// The message of a zero duration or threshold.
pub const NOT_POSITIVE: &str = "must be greater than zero";

/// The largest connection or session cap the cloud-config may set.
pub const MAX_CAP: usize = 1_000_000;

/// The message of a cap out of range.
pub const CAP_OUT_OF_RANGE: &str = "must be between 1 and 1000000";

/// Fixed messages this module's fields raise (registered with the cloud-config schema).
pub const MESSAGES: &[&str] = &[NOT_POSITIVE, CAP_OUT_OF_RANGE];

/// What the provider does for a `type: LoadBalancer` Service.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Mode {
    /// Assign addresses only (`ipMode: VIP`); an announcer and kube-proxy carry the traffic.
    #[default]
    Addresses,
    /// Assign addresses and proxy their traffic from the leader (`ipMode: Proxy`).
    Proxy,
}

/// How proxy listeners bind their addresses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum BindConfig {
    /// The address is configured on an interface of the leader's node.
    #[default]
    Local,
    /// `IP_FREEBIND`: bind addresses the node does not have; the pool must be routed to it.
    Freebind,
}

/// Backend selection.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum BalanceConfig {
    /// Healthy backends in turn.
    #[default]
    RoundRobin,
    /// The healthy backend with the fewest open connections.
    LeastConnections,
}

/// `loadBalancer.proxy`: data-path settings for `mode: proxy`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ProxyConfig {
    /// How listeners bind.
    #[serde(default)]
    pub bind: BindConfig,
    /// Backend selection (Services with `sessionAffinity: ClientIP` hash the source instead).
    #[serde(default)]
    pub balance: BalanceConfig,
    /// Health-check backends (kube-proxy's conventions); off sends traffic to every Node.
    #[serde(default = "yes")]
    pub health_checks: bool,
    /// kube-proxy's health port, checked for `externalTrafficPolicy: Cluster`.
    #[serde(default = "default_health_port")]
    pub cluster_health_port: u16,
    /// Time between two checks of one backend.
    #[serde(default = "default_interval", deserialize_with = "positive_duration")]
    pub health_check_interval: Duration,
    /// How long one check may take.
    #[serde(default = "default_timeout", deserialize_with = "positive_duration")]
    pub health_check_timeout: Duration,
    /// Consecutive failures before a backend takes no new traffic.
    #[serde(default = "default_unhealthy", deserialize_with = "positive_u32")]
    pub unhealthy_threshold: u32,
    /// Consecutive successes before it takes traffic again.
    #[serde(default = "default_healthy", deserialize_with = "positive_u32")]
    pub healthy_threshold: u32,
    /// How long connections to a removed backend or port may continue.
    #[serde(default = "default_drain", deserialize_with = "positive_duration")]
    pub drain_timeout: Duration,
    /// How long a UDP session lives without traffic.
    #[serde(default = "default_udp_idle", deserialize_with = "positive_duration")]
    pub udp_idle_timeout: Duration,
    /// How long a TCP connection lives with no byte moving either way.
    #[serde(default = "default_tcp_idle", deserialize_with = "positive_duration")]
    pub tcp_idle_timeout: Duration,
    /// Most TCP connections one listener holds; more are reset at once. Unset: the default,
    /// fitted to the machine's open-file limit (see [`crate::datapath::config::resolve_caps`]).
    #[serde(default, deserialize_with = "cap")]
    pub max_tcp_connections_per_listener: Option<usize>,
    /// Most TCP connections one Service holds over all its listeners.
    #[serde(default, deserialize_with = "cap")]
    pub max_tcp_connections_per_service: Option<usize>,
    /// Most TCP connections the whole data path holds.
    #[serde(default, deserialize_with = "cap")]
    pub max_tcp_connections: Option<usize>,
    /// Most UDP sessions one listener keeps; a new client beyond it evicts the least recently
    /// active one.
    #[serde(default, deserialize_with = "cap")]
    pub max_udp_sessions_per_listener: Option<usize>,
    /// Most UDP sessions one Service keeps over all its listeners.
    #[serde(default, deserialize_with = "cap")]
    pub max_udp_sessions_per_service: Option<usize>,
    /// Most UDP sessions the whole data path keeps.
    #[serde(default, deserialize_with = "cap")]
    pub max_udp_sessions: Option<usize>,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        Self {
            bind: BindConfig::Local,
            balance: BalanceConfig::RoundRobin,
            health_checks: true,
            cluster_health_port: default_health_port(),
            health_check_interval: default_interval(),
            health_check_timeout: default_timeout(),
            unhealthy_threshold: default_unhealthy(),
            healthy_threshold: default_healthy(),
            drain_timeout: default_drain(),
            udp_idle_timeout: default_udp_idle(),
            tcp_idle_timeout: default_tcp_idle(),
            max_tcp_connections_per_listener: None,
            max_tcp_connections_per_service: None,
            max_tcp_connections: None,
            max_udp_sessions_per_listener: None,
            max_udp_sessions_per_service: None,
            max_udp_sessions: None,
        }
    }
}

impl ProxyConfig {
    /// The first cap set above a wider one also set (a listener's above its Service's or the
    /// total, a Service's above the total), as (field, the wider field), for the validation
    /// error (pure).
    pub fn cap_above_total(&self) -> Option<(&'static str, &'static str)> {
        let above = |narrow: Option<usize>, wide: Option<usize>| narrow.zip(wide).is_some_and(|(n, w)| n > w);
        let pairs = [
            (
                self.max_tcp_connections_per_listener,
                self.max_tcp_connections_per_service,
                ("maxTcpConnectionsPerListener", "maxTcpConnectionsPerService"),
            ),
            (
                self.max_tcp_connections_per_listener,
                self.max_tcp_connections,
                ("maxTcpConnectionsPerListener", "maxTcpConnections"),
            ),
            (
                self.max_tcp_connections_per_service,
                self.max_tcp_connections,
                ("maxTcpConnectionsPerService", "maxTcpConnections"),
            ),
            (
                self.max_udp_sessions_per_listener,
                self.max_udp_sessions_per_service,
                ("maxUdpSessionsPerListener", "maxUdpSessionsPerService"),
            ),
            (
                self.max_udp_sessions_per_listener,
                self.max_udp_sessions,
                ("maxUdpSessionsPerListener", "maxUdpSessions"),
            ),
            (self.max_udp_sessions_per_service, self.max_udp_sessions, ("maxUdpSessionsPerService", "maxUdpSessions")),
        ];
        pairs.into_iter().find(|(n, w, _)| above(*n, *w)).map(|(_, _, fields)| fields)
    }
}

#[cfg(feature = "datapath")]
impl ProxyConfig {
    /// The caps as configured (unset ones are fitted to the machine at start).
    pub fn caps(&self) -> crate::datapath::config::CapsConfig {
        crate::datapath::config::CapsConfig {
            tcp_per_listener: self.max_tcp_connections_per_listener,
            tcp_per_service: self.max_tcp_connections_per_service,
            tcp_total: self.max_tcp_connections,
            udp_per_listener: self.max_udp_sessions_per_listener,
            udp_per_service: self.max_udp_sessions_per_service,
            udp_total: self.max_udp_sessions,
        }
    }

    /// The data-path settings for a process whose open-file soft limit is `soft_limit`
    /// (`None`: unknown, the default caps as they are), and the configured caps it lowered.
    pub fn settings_for(&self, soft_limit: Option<u64>) -> (Settings, Vec<&'static str>) {
        let (caps, lowered) = crate::datapath::config::resolve_caps(&self.caps(), soft_limit);
        (self.settings().with_caps(caps), lowered)
    }

    /// The data-path settings, caps unfitted ([`Self::settings_for`] fits them).
    pub fn settings(&self) -> Settings {
        Settings {
            health: HealthSettings {
                interval: self.health_check_interval,
                timeout: self.health_check_timeout,
                unhealthy_threshold: self.unhealthy_threshold,
                healthy_threshold: self.healthy_threshold,
            },
            health_checks: self.health_checks,
            cluster_health_port: self.cluster_health_port,
            drain_timeout: self.drain_timeout,
            udp_idle_timeout: self.udp_idle_timeout,
            tcp_idle_timeout: self.tcp_idle_timeout,
            balance: match self.balance {
                BalanceConfig::RoundRobin => Balance::RoundRobin,
                BalanceConfig::LeastConnections => Balance::LeastConnections,
            },
            bind: match self.bind {
                BindConfig::Local => BindMode::Local,
                BindConfig::Freebind => BindMode::Freebind,
            },
            ..Settings::default()
        }
    }
}

fn yes() -> bool {
    true
}
// kube-proxy's health port and the check timing cloud load balancers use with it.
fn default_health_port() -> u16 {
    10256
}
fn default_interval() -> Duration {
    Duration::from_secs(2)
}
fn default_timeout() -> Duration {
    Duration::from_secs(3)
}
fn default_unhealthy() -> u32 {
    2
}
fn default_healthy() -> u32 {
    1
}
fn default_drain() -> Duration {
    Duration::from_secs(30)
}
fn default_udp_idle() -> Duration {
    Duration::from_secs(60)
}
// The data path's defaults, from its constants (docs/datapath.md says why these numbers).
fn default_tcp_idle() -> Duration {
    Duration::from_secs(10 * 60)
}
fn cap<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<usize>, D::Error> {
    let value = u64::deserialize(deserializer)?;
    match usize::try_from(value) {
        Ok(value) if (1..=MAX_CAP).contains(&value) => Ok(Some(value)),
        _ => Err(safe_yaml::custom(CAP_OUT_OF_RANGE)),
    }
}

fn positive_duration<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
    struct Visitor;
    impl serde::de::Visitor<'_> for Visitor {
        type Value = Duration;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a duration such as 2s or 500ms")
        }
        fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Duration, E> {
            let duration = crate::duration::parse_duration(text).map_err(safe_yaml::custom)?;
            if duration.is_zero() { Err(safe_yaml::custom(NOT_POSITIVE)) } else { Ok(duration) }
        }
    }
    deserializer.deserialize_str(Visitor)
}

fn positive_u32<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u32, D::Error> {
    let value = u32::deserialize(deserializer)?;
    if value == 0 { Err(safe_yaml::custom(NOT_POSITIVE)) } else { Ok(value) }
}

/// Event reason (Warning, on the Service): every backend of its load balancer fails its health
/// check, so new connections are refused.
pub const REASON_ALL_BACKENDS_UNHEALTHY: &str = "AllBackendsUnhealthy";
/// Event reason (Normal, on the Service): a backend passes its health check again.
pub const REASON_BACKENDS_HEALTHY: &str = "BackendsHealthy";

/// A change in whether every backend of a Service is unhealthy.
#[cfg(feature = "datapath")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendsTransition {
    /// Every backend is unhealthy now; some was not before.
    AllUnhealthy,
    /// Some backend is no longer unhealthy.
    Recovered,
}

/// Whether a Service's backends (`health`) are all unhealthy now, and the transition from
/// `was_all_unhealthy`, if any (pure). A Service without backends is not "all unhealthy": that
/// is the service controller's `UnAvailableLoadBalancer`.
#[cfg(feature = "datapath")]
pub fn backends_transition(
    was_all_unhealthy: bool,
    health: impl IntoIterator<Item = crate::datapath::select::Health>,
) -> (bool, Option<BackendsTransition>) {
    use crate::datapath::select::Health;
    let (mut any, mut all) = (false, true);
    for h in health {
        any = true;
        all &= h == Health::Unhealthy;
    }
    let now = any && all;
    let transition = match (was_all_unhealthy, now) {
        (false, true) => Some(BackendsTransition::AllUnhealthy),
        (true, false) => Some(BackendsTransition::Recovered),
        _ => None,
    };
    (now, transition)
}

/// The proxy of one provider: a data path per leadership term.
#[cfg(feature = "datapath")]
pub struct ProxyRuntime {
    /// The settings, caps unfitted; each term fits them to the open-file limit of its time.
    config: ProxyConfig,
    settings: Settings,
    current: Mutex<Option<DataPath>>,
    /// The served Services' references, by `namespace/name`, for events on them.
    refs: std::sync::Arc<Mutex<std::collections::HashMap<String, ObjectReference>>>,
}

#[cfg(feature = "datapath")]
impl fmt::Debug for ProxyRuntime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProxyRuntime").field("settings", &self.settings).finish_non_exhaustive()
    }
}

#[cfg(feature = "datapath")]
impl ProxyRuntime {
    /// A runtime with these settings; nothing runs until [`Self::start`].
    pub fn new(config: &ProxyConfig) -> Self {
        Self {
            config: config.clone(),
            settings: config.settings(),
            current: Mutex::new(None),
            refs: Default::default(),
        }
    }

    /// Start a fresh data path for a leadership term; it stops when `shutdown` fires. With
    /// `events`, a Service whose backends all turn unhealthy gets a Warning (and a Normal event
    /// when one recovers).
    pub fn start(&self, metrics: &Metrics, events: Option<EventSink>, shutdown: CancellationToken) {
        let token = shutdown.child_token();
        let fresh = DataPath::new(self.fitted_settings(), metrics, token.clone());
        if let Some(events) = events.filter(|_| self.settings.health_checks) {
            let interval = self.settings.health.interval;
            tokio::spawn(watch_backends(fresh.clone(), self.refs.clone(), events, interval, token));
        }
        if let Some(previous) = self.lock().replace(fresh) {
            previous.shutdown();
        }
    }

    /// The settings with caps the process's open-file limit can hold, read now (the binary
    /// raised it to the hard limit at start): unset caps are fitted silently, a configured cap
    /// that has to be lowered is a warning naming it.
    fn fitted_settings(&self) -> Settings {
        let soft = ccm_framework::process::open_file_limits().map(|(soft, _)| soft);
        let (fitted, lowered) = self.config.settings_for(soft);
        let caps = (fitted.max_tcp_connections, fitted.max_tcp_connections_per_service, fitted.max_udp_sessions);
        if lowered.is_empty() {
            tracing::info!(
                open_file_limit = ?soft,
                max_tcp_connections = caps.0,
                max_tcp_connections_per_service = caps.1,
                max_udp_sessions = caps.2,
                "data-path connection caps"
            );
        } else {
            tracing::warn!(
                open_file_limit = ?soft,
                lowered = %lowered.join(", "),
                max_tcp_connections = caps.0,
                max_udp_sessions = caps.2,
                "the open-file limit cannot hold these configured connection caps; lowered them (raise the limit or lower the caps, see docs/datapath.md)"
            );
        }
        fitted
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<DataPath>> {
        self.current.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The running data path, if any (for tests and diagnostics).
    pub fn data_path(&self) -> Option<DataPath> {
        self.lock().clone()
    }

    /// Serve the Service on `ips` with `nodes` as backends.
    pub fn ensure(&self, service: &Service, nodes: &[&Node], ips: &[IpAddr]) -> Result<(), CloudError> {
        let Some(data_path) = self.data_path() else {
            return Err(CloudError::retry_after(
                Duration::from_secs(2),
                "the load-balancer data path is not running yet",
            ));
        };
        let proxy_protocol =
            proxy_protocol_of(service).map_err(|m| CloudError::refused(Refusal::InvalidAnnotation, m))?;
        let spec = crate::datapath::config::service_spec(service, nodes, ips, &self.settings)
            .map_err(|e| CloudError::Other(e.to_string()))?;
        self.refs.lock().unwrap_or_else(|e| e.into_inner()).insert(service_key(service), service.object_ref(&()));
        data_path.apply_with(spec, ServiceOptions { proxy_protocol }).map_err(|e| match &e {
            DataPathError::Bind { failed } => {
                let mut hints: Vec<String> = Vec::new();
                for hint in failed.iter().filter_map(|(key, err)| bind_hint(err.kind(), key.port)) {
                    if !hints.contains(&hint) {
                        hints.push(hint);
                    }
                }
                let message = if hints.is_empty() { e.to_string() } else { format!("{e}; {}", hints.join("; ")) };
                CloudError::retry_after(BIND_RETRY, message)
            }
            DataPathError::ShutDown => CloudError::retry_after(Duration::from_secs(2), e.to_string()),
        })
    }

    /// Stop serving the Service (its connections drain).
    pub fn remove(&self, service: &Service) {
        self.refs.lock().unwrap_or_else(|e| e.into_inner()).remove(&service_key(service));
        if let Some(data_path) = self.data_path() {
            data_path.remove(&service_key(service));
        }
    }
}

/// Every health-check interval, compare each served Service's backends with the last look
/// and publish an event (and a log line) on each transition, not on each tick.
#[cfg(feature = "datapath")]
async fn watch_backends(
    data_path: DataPath,
    refs: std::sync::Arc<Mutex<std::collections::HashMap<String, ObjectReference>>>,
    events: EventSink,
    interval: Duration,
    stop: CancellationToken,
) {
    use kube::runtime::events::EventType;
    let mut down = std::collections::HashSet::<String>::new();
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
        let keys = data_path.keys();
        down.retain(|k| keys.contains(k));
        for key in keys {
            let health = data_path.backend_health(&key);
            let (now, transition) = backends_transition(down.contains(&key), health.values().copied());
            if now {
                down.insert(key.clone());
            } else {
                down.remove(&key);
            }
            let Some(transition) = transition else { continue };
            let names = health.keys().cloned().collect::<Vec<_>>().join(", ");
            let (type_, reason, note) = match transition {
                BackendsTransition::AllUnhealthy => {
                    tracing::warn!(service = %key, backends = %names, "every load-balancer backend is unhealthy; new connections are refused");
                    (
                        EventType::Warning,
                        REASON_ALL_BACKENDS_UNHEALTHY,
                        format!(
                            "every backend fails its health check ({names}); new connections are refused until one passes (check kube-proxy's health port on the Nodes)"
                        ),
                    )
                }
                BackendsTransition::Recovered => {
                    tracing::info!(service = %key, "a load-balancer backend is healthy again");
                    (EventType::Normal, REASON_BACKENDS_HEALTHY, "a backend passes its health check again".to_string())
                }
            };
            let reference = refs.lock().unwrap_or_else(|e| e.into_inner()).get(&key).cloned();
            if let Some(reference) = reference {
                events.publish(SERVICE_CONTROLLER, reference, type_, reason, note, "HealthCheck");
            }
        }
    }
}

#[cfg(feature = "datapath")]
fn service_key(service: &Service) -> String {
    format!(
        "{}/{}",
        service.metadata.namespace.as_deref().unwrap_or_default(),
        service.metadata.name.as_deref().unwrap_or_default()
    )
}

/// What to do about a listener that could not bind `port`, by the socket error's kind (pure).
pub fn bind_hint(kind: std::io::ErrorKind, port: u16) -> Option<String> {
    use std::io::ErrorKind;
    match kind {
        // EACCES: the manager runs as uid 65532 without CAP_NET_BIND_SERVICE.
        ErrorKind::PermissionDenied if port < 1024 => Some(format!(
            "port {port} is privileged (below 1024) and the manager runs as a non-root user: on the manager's node lower net.ipv4.ip_unprivileged_port_start to {port} or less (sysctl), or use a Service port of 1024 or above"
        )),
        ErrorKind::AddrNotAvailable => Some(
            "the address must be configured on an interface of the manager's node, or set loadBalancer.proxy.bind: freebind with the pool routed to that node".into(),
        ),
        ErrorKind::AddrInUse => Some(format!(
            "another process on the manager's node already listens on that address and port {port}"
        )),
        _ => None,
    }
}

/// The kube-vip annotation's value for these addresses.
pub fn kube_vip_value(ips: &[IpAddr]) -> String {
    ips.iter().map(IpAddr::to_string).collect::<Vec<_>>().join(",")
}

/// The annotation patch that brings the Service to `want` (`None` removes the annotation),
/// or `None` when it already is there. Pure.
pub fn kube_vip_patch(service: &Service, want: Option<&str>) -> Option<serde_json::Value> {
    let have = service.metadata.annotations.as_ref().and_then(|a| a.get(KUBE_VIP_ANNOTATION)).map(String::as_str);
    (have != want).then(|| serde_json::json!({ "metadata": { "annotations": { KUBE_VIP_ANNOTATION: want } } }))
}

/// Write the kube-vip annotation when it differs. The provider writes it itself (the provider
/// contract has no way to return annotations), as a merge patch of that one key under its own
/// field manager, so nothing else on the Service is touched.
pub async fn sync_kube_vip(client: &kube::Client, service: &Service, want: Option<&str>) -> Result<(), CloudError> {
    let Some(patch) = kube_vip_patch(service, want) else { return Ok(()) };
    let namespace = service.metadata.namespace.as_deref().unwrap_or("default");
    let name = service.metadata.name.as_deref().unwrap_or_default();
    let api: Api<Service> = Api::namespaced(client.clone(), namespace);
    let params = PatchParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() };
    match api.patch(name, &params, &Patch::Merge(&patch)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(e) => Err(CloudError::Unavailable(format!("writing the {KUBE_VIP_ANNOTATION} annotation: {e}"))),
    }
}

/// The client of the current leadership term (set by `initialize`), for the provider's own
/// Service writes.
#[derive(Default)]
pub struct ClientSlot(Mutex<Option<kube::Client>>);

impl fmt::Debug for ClientSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientSlot").finish_non_exhaustive()
    }
}

impl ClientSlot {
    /// Replace the client.
    pub fn set(&self, client: kube::Client) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(client);
    }

    /// The client, once set.
    pub fn get(&self) -> Option<kube::Client> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(feature = "datapath")]
    #[test]
    fn only_the_turn_into_and_out_of_all_backends_unhealthy_is_a_transition() {
        use crate::datapath::select::Health::{Healthy, Unhealthy, Unknown};
        assert_eq!(backends_transition(false, [Unhealthy, Unhealthy]), (true, Some(BackendsTransition::AllUnhealthy)));
        // The next ticks, still all down: nothing new to say.
        assert_eq!(backends_transition(true, [Unhealthy, Unhealthy]), (true, None));
        assert_eq!(backends_transition(false, [Unhealthy, Healthy]), (false, None));
        assert_eq!(backends_transition(true, [Unhealthy, Healthy]), (false, Some(BackendsTransition::Recovered)));
        assert_eq!(backends_transition(false, [Unknown]), (false, None), "not checked yet is not unhealthy");
        assert_eq!(backends_transition(false, []), (false, None), "no backends is another problem");
        assert_eq!(backends_transition(true, []), (false, Some(BackendsTransition::Recovered)));
    }

    #[test]
    fn a_services_ip_mode_follows_its_annotation_and_proxy_needs_the_data_path() {
        let with = |value: &str| {
            let mut s = Service::default();
            s.metadata.annotations = Some([(IP_MODE_ANNOTATION.to_string(), value.to_string())].into());
            s
        };
        assert_eq!(ip_mode_of(&Service::default(), true), Ok(IpMode::Proxy), "the data path's default");
        assert_eq!(ip_mode_of(&Service::default(), false), Ok(IpMode::Vip), "the address mode's default");
        assert_eq!(ip_mode_of(&with("VIP"), true), Ok(IpMode::Vip), "one Service left to kube-proxy");
        assert_eq!(ip_mode_of(&with(" vip "), false), Ok(IpMode::Vip));
        assert_eq!(ip_mode_of(&with("Proxy"), true), Ok(IpMode::Proxy));
        let refused = ip_mode_of(&with("Proxy"), false).unwrap_err();
        assert!(refused.contains(IP_MODE_ANNOTATION) && refused.contains("loadBalancer.mode: proxy"), "{refused}");
        let secret = "Tunnel-s3cret";
        let invalid = ip_mode_of(&with(secret), true).unwrap_err();
        assert!(invalid.contains("must be VIP or Proxy") && !invalid.contains(secret), "{invalid}");
        assert_eq!(IpMode::Vip.as_str(), "VIP");
        assert_eq!(IpMode::Proxy.as_str(), "Proxy");
    }

    #[cfg(feature = "datapath")]
    #[test]
    fn proxy_protocol_is_v1_or_v2_on_tcp_ports_and_anything_else_is_refused_by_annotation() {
        use k8s_openapi::api::core::v1::{ServicePort, ServiceSpec};
        let with = |value: &str, protocols: &[Option<&str>]| Service {
            metadata: kube::api::ObjectMeta {
                annotations: Some([(PROXY_PROTOCOL_ANNOTATION.to_string(), value.to_string())].into()),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                ports: Some(
                    protocols
                        .iter()
                        .enumerate()
                        .map(|(i, p)| ServicePort {
                            port: 80 + i as i32,
                            protocol: p.map(String::from),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(proxy_protocol_of(&Service::default()), Ok(None), "no annotation, no header");
        assert_eq!(proxy_protocol_of(&with("v1", &[Some("TCP")])), Ok(Some(ProxyProtocol::V1)));
        assert_eq!(proxy_protocol_of(&with(" V2 ", &[None])), Ok(Some(ProxyProtocol::V2)), "TCP by default");
        let secret = "v3-s3cret";
        let unknown = proxy_protocol_of(&with(secret, &[Some("TCP")])).unwrap_err();
        assert!(unknown.contains(PROXY_PROTOCOL_ANNOTATION) && unknown.contains("v1 or v2"), "{unknown}");
        assert!(!unknown.contains(secret), "values are not echoed: {unknown}");
        let udp = proxy_protocol_of(&with("v2", &[Some("TCP"), Some("UDP")])).unwrap_err();
        assert!(udp.contains(PROXY_PROTOCOL_ANNOTATION) && udp.contains("port 81 is UDP"), "{udp}");
    }

    /// From the annotation to the bytes a backend reads, through the runtime the provider uses;
    /// on loopback block `127.49.0.0/16`, which no other test uses.
    #[cfg(feature = "datapath")]
    #[tokio::test]
    async fn the_proxy_protocol_annotation_reaches_the_backend_and_a_refused_value_leaves_the_service_as_it_was() {
        use k8s_openapi::api::core::v1::{NodeAddress, NodeStatus, ServicePort, ServiceSpec};
        use std::net::{Ipv4Addr, SocketAddr};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let ip = |host| IpAddr::V4(Ipv4Addr::new(127, 49, 0, host));
        let backend = tokio::net::TcpListener::bind(SocketAddr::new(ip(1), 30080)).await.unwrap();
        let runtime = ProxyRuntime::new(&ProxyConfig { health_checks: false, ..ProxyConfig::default() });
        runtime.start(&Metrics::new(), None, CancellationToken::new());
        let node = Node {
            status: Some(NodeStatus {
                addresses: Some(vec![NodeAddress { type_: "InternalIP".into(), address: ip(1).to_string() }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut service = Service {
            metadata: kube::api::ObjectMeta {
                name: Some("pp".into()),
                namespace: Some("default".into()),
                annotations: Some([(PROXY_PROTOCOL_ANNOTATION.to_string(), "v1".to_string())].into()),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                ports: Some(vec![ServicePort { port: 80, node_port: Some(30080), ..Default::default() }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        runtime.ensure(&service, &[&node], &[ip(100)]).expect("served");
        // A value the data path cannot use is refused; what is served stays as it was.
        service.metadata.annotations = Some([(PROXY_PROTOCOL_ANNOTATION.to_string(), "v3".to_string())].into());
        let refused = runtime.ensure(&service, &[&node], &[ip(100)]).unwrap_err();
        assert!(
            matches!(&refused, CloudError::Refused { reason: Refusal::InvalidAnnotation, message } if message.contains(PROXY_PROTOCOL_ANNOTATION)),
            "{refused:?}"
        );
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(SocketAddr::new(ip(2), 0)).unwrap();
        let mut client = socket.connect(SocketAddr::new(ip(100), 80)).await.expect("connect via the proxy");
        let client_port = client.local_addr().unwrap().port();
        client.write_all(b"x").await.unwrap();
        let (mut stream, _) = tokio::time::timeout(Duration::from_secs(10), backend.accept()).await.unwrap().unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 256];
        while !got.ends_with(b"x") {
            let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buf)).await.unwrap().unwrap();
            assert!(n > 0, "the backend got {got:?} before the end");
            got.extend_from_slice(&buf[..n]);
        }
        let expected = format!("PROXY TCP4 127.49.0.2 127.49.0.100 {client_port} 80\r\nx");
        assert_eq!(String::from_utf8_lossy(&got), expected);
    }

    #[test]
    fn a_privileged_port_gets_the_privileged_port_hint_not_the_address_hint() {
        use std::io::ErrorKind;
        let hint = bind_hint(ErrorKind::PermissionDenied, 80).expect("a hint");
        assert!(hint.contains("port 80 is privileged"), "{hint}");
        assert!(hint.contains("net.ipv4.ip_unprivileged_port_start to 80"), "{hint}");
        assert!(hint.contains("1024 or above"), "{hint}");
        assert!(!hint.contains("freebind"), "{hint}");
        let hint = bind_hint(ErrorKind::AddrNotAvailable, 80).expect("a hint");
        assert!(hint.contains("freebind") && !hint.contains("privileged"), "{hint}");
        assert!(bind_hint(ErrorKind::AddrNotAvailable, 8080).is_some_and(|h| h.contains("interface")));
        assert!(bind_hint(ErrorKind::AddrInUse, 8080).is_some_and(|h| h.contains("already listens")));
        // Not a privileged port: EACCES there has another cause this hint would not name.
        assert_eq!(bind_hint(ErrorKind::PermissionDenied, 8080), None);
    }

    #[test]
    fn the_kube_vip_patch_is_written_only_when_the_value_differs() {
        let mut service = Service::default();
        let ips: Vec<IpAddr> = vec!["192.0.2.1".parse().unwrap(), "2001:db8::1".parse().unwrap()];
        let value = kube_vip_value(&ips);
        assert_eq!(value, "192.0.2.1,2001:db8::1");
        let patch = kube_vip_patch(&service, Some(&value)).expect("a patch");
        assert_eq!(patch["metadata"]["annotations"][KUBE_VIP_ANNOTATION], "192.0.2.1,2001:db8::1");
        service.metadata.annotations = Some([(KUBE_VIP_ANNOTATION.to_string(), value.clone())].into());
        assert_eq!(kube_vip_patch(&service, Some(&value)), None);
        let removal = kube_vip_patch(&service, None).expect("a removal");
        assert!(removal["metadata"]["annotations"][KUBE_VIP_ANNOTATION].is_null());
        assert_eq!(kube_vip_patch(&Service::default(), None), None);
    }

    #[test]
    fn proxy_mode_and_its_settings_are_read_from_the_cloud_config() {
        let yaml = "loadBalancer:\n  mode: proxy\n  kubeVip: true\n  proxy:\n    bind: freebind\n    balance: leastConnections\n    healthCheckInterval: 500ms\n    unhealthyThreshold: 3\n";
        let config = crate::config::parse(yaml.as_bytes()).unwrap();
        let lb = &config.load_balancer;
        assert_eq!(lb.mode, Mode::Proxy);
        assert!(lb.kube_vip);
        assert_eq!(lb.proxy.bind, BindConfig::Freebind);
        assert_eq!(lb.proxy.balance, BalanceConfig::LeastConnections);
        assert_eq!(lb.proxy.health_check_interval, Duration::from_millis(500));
        assert_eq!(lb.proxy.unhealthy_threshold, 3);
        assert_eq!(lb.proxy.health_check_timeout, Duration::from_secs(3), "unset fields keep their defaults");
        let default = crate::config::parse(b"loadBalancer: {}\n").unwrap();
        assert_eq!(default.load_balancer.mode, Mode::Addresses, "proxy mode is opt-in");
    }

    #[test]
    fn a_zero_health_check_interval_is_refused_by_field() {
        let yaml = "loadBalancer:\n  mode: proxy\n  proxy:\n    healthCheckInterval: 0s\n";
        let error = crate::config::parse(yaml.as_bytes()).unwrap_err().to_string();
        assert!(error.contains("healthCheckInterval"), "{error}");
        assert!(error.contains(NOT_POSITIVE), "{error}");
    }

    #[cfg(feature = "datapath")]
    #[test]
    fn proxy_settings_default_to_kube_proxy_conventions() {
        let settings = ProxyConfig::default().settings();
        assert_eq!(settings.health, HealthSettings::default());
        assert_eq!(settings.cluster_health_port, 10256);
        assert_eq!(settings.bind, BindMode::Local);
    }

    #[cfg(feature = "datapath")]
    #[test]
    fn the_cloud_config_defaults_are_the_data_path_defaults() {
        let (settings, lowered) = ProxyConfig::default().settings_for(Some(1 << 20));
        assert_eq!(settings, Settings::default());
        assert!(lowered.is_empty());
        assert_eq!(MAX_CAP, crate::datapath::config::MAX_CAP);
        let yaml = "loadBalancer:\n  mode: proxy\n  proxy:\n    maxTcpConnections: 300\n    maxTcpConnectionsPerService: 200\n    maxTcpConnectionsPerListener: 100\n    maxUdpSessions: 200\n    maxUdpSessionsPerService: 50\n    maxUdpSessionsPerListener: 20\n    tcpIdleTimeout: 5s\n";
        let proxy = crate::config::parse(yaml.as_bytes()).unwrap().load_balancer.proxy;
        let (settings, _) = proxy.settings_for(Some(1 << 20));
        let tcp = (
            settings.max_tcp_connections,
            settings.max_tcp_connections_per_service,
            settings.max_tcp_connections_per_listener,
        );
        assert_eq!(tcp, (300, 200, 100));
        let udp =
            (settings.max_udp_sessions, settings.max_udp_sessions_per_service, settings.max_udp_sessions_per_listener);
        assert_eq!(udp, (200, 50, 20));
        assert_eq!(settings.tcp_idle_timeout, Duration::from_secs(5));
        let above = "loadBalancer:\n  proxy:\n    maxTcpConnections: 300\n    maxTcpConnectionsPerService: 400\n";
        let error = crate::config::parse(above.as_bytes()).unwrap_err().to_string();
        assert!(
            error.contains("loadBalancer.proxy.maxTcpConnectionsPerService") && error.contains("maxTcpConnections"),
            "{error}"
        );
    }
}
