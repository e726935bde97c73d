//! The desired state of the data path, and how a Service and its Nodes become it. Pure: no
//! sockets, no clocks.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Node, Service};

use super::proxy_protocol::ProxyProtocol;

/// The annotation older clients use for source ranges when `spec.loadBalancerSourceRanges` is
/// empty (comma-separated CIDRs).
pub const SOURCE_RANGES_ANNOTATION: &str = "service.beta.kubernetes.io/load-balancer-source-ranges";

/// kube-proxy's node health port, probed for `externalTrafficPolicy: Cluster`.
pub const KUBE_PROXY_HEALTH_PORT: u16 = 10256;

/// The path probed on kube-proxy's health ports.
pub const HEALTH_PATH: &str = "/healthz";

/// Most source ranges one Service may carry (bounds user input).
pub const MAX_SOURCE_RANGES: usize = 1000;

/// Most ports one Service may carry (the API server allows far fewer in practice).
pub const MAX_PORTS: usize = 1000;

/// A transport protocol the data path forwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    /// TCP: one upstream connection per client connection.
    Tcp,
    /// UDP: one upstream socket per client address (a session), expired when idle.
    Udp,
}

impl Protocol {
    /// The Kubernetes spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One listener: an address, a port and a protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ListenerKey {
    /// The ingress address.
    pub address: IpAddr,
    /// The Service port.
    pub port: u16,
    /// The protocol.
    pub protocol: Protocol,
}

impl fmt::Display for ListenerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.address {
            IpAddr::V4(a) => write!(f, "{}/{a}:{}", self.protocol, self.port),
            IpAddr::V6(a) => write!(f, "{}/[{a}]:{}", self.protocol, self.port),
        }
    }
}

/// A Service port and the backend port it forwards to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortSpec {
    /// The protocol.
    pub protocol: Protocol,
    /// The port clients connect to.
    pub port: u16,
    /// The port on every backend (the Service's nodePort).
    pub target_port: u16,
}

/// A backend host: a Node and the address traffic goes to.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Backend {
    /// The Node name (metrics label).
    pub name: String,
    /// The address traffic and health checks go to.
    pub ip: IpAddr,
}

/// How TCP bytes are moved between client and backend.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TcpForwarding {
    /// Copy while few connections are open, splice once the data path carries at least
    /// [`SPLICE_FROM_OPEN_CONNECTIONS`]: splice saves the copies that bound a loaded proxy,
    /// while a lone connection measured faster copied (docs/benchmarks.md).
    #[default]
    Auto,
    /// splice(2) through a pipe per direction on Linux (no copy through user space); a
    /// connection the kernel will not splice is copied instead. Elsewhere the same as `Copy`.
    Splice,
    /// Read into a buffer and write it out (`tokio::io::copy_bidirectional`).
    Copy,
}

/// Open TCP connections from which [`TcpForwarding::Auto`] splices new ones.
pub const SPLICE_FROM_OPEN_CONNECTIONS: usize = 32;

impl TcpForwarding {
    /// Pure: whether a new connection is spliced, given the TCP connections already open.
    pub fn splices(self, open_connections: usize) -> bool {
        match self {
            Self::Auto => open_connections >= SPLICE_FROM_OPEN_CONNECTIONS,
            Self::Splice => true,
            Self::Copy => false,
        }
    }
}

/// How a backend is chosen for a new connection or session.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Balance {
    /// Healthy backends in turn.
    #[default]
    RoundRobin,
    /// The healthy backend with the fewest open connections.
    LeastConnections,
}

/// Session affinity.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Affinity {
    /// None: every connection is balanced on its own.
    #[default]
    None,
    /// `sessionAffinity: ClientIP`: the client's source address picks the backend (hashing).
    ClientIp,
}

/// The health check of a Service's backends.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum HealthCheck {
    /// No checks: every backend takes traffic.
    None,
    /// An HTTP GET on every backend at this port and path; a 2xx answer is a success.
    Http {
        /// The port on the backend.
        port: u16,
        /// The request path.
        path: String,
    },
}

/// Everything the data path needs to serve one Service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceSpec {
    /// A stable identifier (`namespace/name`), also the metrics label.
    pub key: String,
    /// The ingress addresses to listen on.
    pub addresses: Vec<IpAddr>,
    /// The ports to listen on.
    pub ports: Vec<PortSpec>,
    /// The backends.
    pub backends: Vec<Backend>,
    /// The backends' health check.
    pub health_check: HealthCheck,
    /// Session affinity.
    pub affinity: Affinity,
    /// Backend selection.
    pub balance: Balance,
    /// Client source ranges allowed in; empty allows every client.
    pub source_ranges: Vec<IpNet>,
}

/// Per-Service choices applied with [`DataPath::apply_with`](super::DataPath::apply_with),
/// beside the [`ServiceSpec`] so callers that build a spec field by field need not name them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServiceOptions {
    /// The PROXY protocol header each backend connection starts with; `None` sends none.
    pub proxy_protocol: Option<ProxyProtocol>,
}

impl ServiceSpec {
    /// Every listener, with the backend port it forwards to.
    pub fn listeners(&self) -> BTreeMap<ListenerKey, u16> {
        let mut out = BTreeMap::new();
        for address in &self.addresses {
            for p in &self.ports {
                out.insert(ListenerKey { address: *address, port: p.port, protocol: p.protocol }, p.target_port);
            }
        }
        out
    }
}

/// Health-check timing, kube-proxy's conventions by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthSettings {
    /// Time between two checks of one backend.
    pub interval: Duration,
    /// How long one check may take.
    pub timeout: Duration,
    /// Consecutive failures that mark a backend unhealthy.
    pub unhealthy_threshold: u32,
    /// Consecutive successes that mark a backend healthy again.
    pub healthy_threshold: u32,
}

impl Default for HealthSettings {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(2),
            timeout: Duration::from_secs(3),
            unhealthy_threshold: 2,
            healthy_threshold: 1,
        }
    }
}

impl HealthSettings {
    /// The longest time from a backend failing to it being taken out of rotation: one interval
    /// until the first failed check starts, then each failed check may take the timeout.
    pub fn detection_bound(&self) -> Duration {
        let per_check = self.interval.max(self.timeout);
        self.interval + per_check * self.unhealthy_threshold
    }
}

/// How a listener is bound.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum BindMode {
    /// The address must be configured on an interface of this host.
    #[default]
    Local,
    /// Bind even when the address is not local (`IP_FREEBIND`); the address must be routed to
    /// this host for traffic to arrive.
    Freebind,
}

/// Data-path settings shared by every Service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// Health-check timing.
    pub health: HealthSettings,
    /// Whether backends are health-checked at all.
    pub health_checks: bool,
    /// The health port for `externalTrafficPolicy: Cluster` (kube-proxy's 10256).
    pub cluster_health_port: u16,
    /// How long connections to a removed backend or on a removed port may continue.
    pub drain_timeout: Duration,
    /// How long a UDP session lives without traffic.
    pub udp_idle_timeout: Duration,
    /// How long a TCP connection lives with no byte moving either way.
    pub tcp_idle_timeout: Duration,
    /// Most TCP connections one listener holds; more are reset at accept and counted.
    pub max_tcp_connections_per_listener: usize,
    /// Most TCP connections one Service holds over all its listeners (its share of the total).
    pub max_tcp_connections_per_service: usize,
    /// Most TCP connections the whole data path holds.
    pub max_tcp_connections: usize,
    /// Most UDP sessions one listener keeps; a new client beyond it evicts the least recently
    /// active session.
    pub max_udp_sessions_per_listener: usize,
    /// Most UDP sessions one Service keeps over all its listeners.
    pub max_udp_sessions_per_service: usize,
    /// Most UDP sessions the whole data path keeps.
    pub max_udp_sessions: usize,
    /// How long connecting to a backend may take before the next one is tried.
    pub connect_timeout: Duration,
    /// Backend selection when there is no affinity.
    pub balance: Balance,
    /// How listeners are bound.
    pub bind: BindMode,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            health: HealthSettings::default(),
            health_checks: true,
            cluster_health_port: KUBE_PROXY_HEALTH_PORT,
            drain_timeout: Duration::from_secs(30),
            udp_idle_timeout: Duration::from_secs(60),
            tcp_idle_timeout: DEFAULT_TCP_IDLE_TIMEOUT,
            max_tcp_connections_per_listener: DEFAULT_MAX_TCP_CONNECTIONS_PER_LISTENER,
            max_tcp_connections_per_service: DEFAULT_MAX_TCP_CONNECTIONS / 2,
            max_tcp_connections: DEFAULT_MAX_TCP_CONNECTIONS,
            max_udp_sessions_per_listener: DEFAULT_MAX_UDP_SESSIONS_PER_LISTENER,
            max_udp_sessions_per_service: DEFAULT_MAX_UDP_SESSIONS / 2,
            max_udp_sessions: DEFAULT_MAX_UDP_SESSIONS,
            connect_timeout: Duration::from_secs(3),
            balance: Balance::RoundRobin,
            bind: BindMode::Local,
        }
    }
}

/// Default [`Settings::tcp_idle_timeout`]: long enough for idle database and websocket
/// connections that send keepalives, short enough that abandoned ones give their slot back.
pub const DEFAULT_TCP_IDLE_TIMEOUT: Duration = Duration::from_secs(10 * 60);

/// Default [`Settings::max_tcp_connections`]. Sized to memory first: a busy connection holds
/// up to two 64 KiB pipes (splice) or two 32 KiB buffers (copy), so 2,048 of them stay within
/// 256 MiB, half the manager pod's default 512 MiB memory limit. Descriptors come second: at
/// most [`DESCRIPTORS_PER_TCP_CONNECTION`] each, far inside the hard limit container runtimes
/// set once the soft limit is raised to it; a lower limit gives lower defaults (see
/// [`resolve_caps`]).
pub const DEFAULT_MAX_TCP_CONNECTIONS: usize = 2048;

/// Default [`Settings::max_tcp_connections_per_listener`]: half the total, so one flooded
/// listener leaves the other half to every other Service.
pub const DEFAULT_MAX_TCP_CONNECTIONS_PER_LISTENER: usize = 1024;

/// Default [`Settings::max_udp_sessions`]: one descriptor each.
pub const DEFAULT_MAX_UDP_SESSIONS: usize = 8192;

/// Default [`Settings::max_udp_sessions_per_listener`]: a session per client address, and a
/// spoofed source is a new client, so a flood only ever recycles this many.
pub const DEFAULT_MAX_UDP_SESSIONS_PER_LISTENER: usize = 1024;

/// The largest value a connection or session cap may take (bounds the cloud-config).
pub const MAX_CAP: usize = 1_000_000;

/// Descriptors one TCP connection may hold: client and backend sockets, and a splice pipe
/// (two descriptors) per direction under load.
pub const DESCRIPTORS_PER_TCP_CONNECTION: u64 = 6;

/// Descriptors one UDP session holds: its connected upstream socket.
pub const DESCRIPTORS_PER_UDP_SESSION: u64 = 1;

/// Descriptors kept out of the data path's budget for the rest of the process (API client,
/// watches, health endpoint, listeners, health checks), or a quarter of a smaller limit.
pub const RESERVED_DESCRIPTORS: u64 = 1024;

/// The connection and session caps as configured; `None` is the default, fitted to the
/// machine by [`resolve_caps`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CapsConfig {
    /// `maxTcpConnectionsPerListener`.
    pub tcp_per_listener: Option<usize>,
    /// `maxTcpConnectionsPerService`.
    pub tcp_per_service: Option<usize>,
    /// `maxTcpConnections`.
    pub tcp_total: Option<usize>,
    /// `maxUdpSessionsPerListener`.
    pub udp_per_listener: Option<usize>,
    /// `maxUdpSessionsPerService`.
    pub udp_per_service: Option<usize>,
    /// `maxUdpSessions`.
    pub udp_total: Option<usize>,
}

/// The caps the data path runs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    /// Per listener, per Service, total: TCP connections.
    pub tcp: (usize, usize, usize),
    /// Per listener, per Service, total: UDP sessions.
    pub udp: (usize, usize, usize),
}

impl Caps {
    /// Descriptors the data path holds at its fullest.
    pub fn descriptors(&self) -> u64 {
        (self.tcp.2 as u64)
            .saturating_mul(DESCRIPTORS_PER_TCP_CONNECTION)
            .saturating_add((self.udp.2 as u64).saturating_mul(DESCRIPTORS_PER_UDP_SESSION))
    }
}

/// The caps for a process whose open-file soft limit is `soft_limit` (`None`: unknown), and
/// the names of the configured caps that had to be lowered (pure).
///
/// Totals are the configured ones, else [`DEFAULT_MAX_TCP_CONNECTIONS`] and
/// [`DEFAULT_MAX_UDP_SESSIONS`]; when at their fullest they need more than the limit minus
/// [`RESERVED_DESCRIPTORS`] (a quarter of a smaller limit), both shrink in proportion. A
/// Service's share defaults to half the total, so a flooded Service leaves the other half to
/// every other one however many listeners it has; a listener's cap defaults to
/// [`DEFAULT_MAX_TCP_CONNECTIONS_PER_LISTENER`] (UDP: [`DEFAULT_MAX_UDP_SESSIONS_PER_LISTENER`]).
/// A listener's cap never exceeds its Service's, nor that the total. Only a configured cap that
/// had to be lowered is named: defaults fitted to the machine are what a default means.
pub fn resolve_caps(config: &CapsConfig, soft_limit: Option<u64>) -> (Caps, Vec<&'static str>) {
    let mut lowered = Vec::new();
    let (mut tcp_total, mut udp_total) =
        (config.tcp_total.unwrap_or(DEFAULT_MAX_TCP_CONNECTIONS), config.udp_total.unwrap_or(DEFAULT_MAX_UDP_SESSIONS));
    if let Some(limit) = soft_limit {
        let budget = limit.saturating_sub(RESERVED_DESCRIPTORS.min(limit / 4));
        let need = Caps { tcp: (0, 0, tcp_total), udp: (0, 0, udp_total) }.descriptors();
        if need > budget {
            // u128: the products of two u64 cannot overflow it.
            let scale = |n: usize| {
                usize::try_from((u128::from(n as u64) * u128::from(budget) / u128::from(need)).max(1)).unwrap_or(1)
            };
            (tcp_total, udp_total) = (scale(tcp_total), scale(udp_total));
            if config.tcp_total.is_some() {
                lowered.push("maxTcpConnections");
            }
            if config.udp_total.is_some() {
                lowered.push("maxUdpSessions");
            }
        }
    }
    let mut fit = |value: Option<usize>, default: usize, cap: usize, name: &'static str| match value {
        Some(v) if v > cap => {
            lowered.push(name);
            cap.max(1)
        }
        Some(v) => v,
        None => default.min(cap).max(1),
    };
    let tcp_service = fit(config.tcp_per_service, tcp_total / 2, tcp_total, "maxTcpConnectionsPerService");
    let tcp_listener = fit(
        config.tcp_per_listener,
        DEFAULT_MAX_TCP_CONNECTIONS_PER_LISTENER,
        tcp_service,
        "maxTcpConnectionsPerListener",
    );
    let udp_service = fit(config.udp_per_service, udp_total / 2, udp_total, "maxUdpSessionsPerService");
    let udp_listener =
        fit(config.udp_per_listener, DEFAULT_MAX_UDP_SESSIONS_PER_LISTENER, udp_service, "maxUdpSessionsPerListener");
    (Caps { tcp: (tcp_listener, tcp_service, tcp_total), udp: (udp_listener, udp_service, udp_total) }, lowered)
}

impl Settings {
    /// These settings with `caps`.
    pub fn with_caps(self, caps: Caps) -> Settings {
        Settings {
            max_tcp_connections_per_listener: caps.tcp.0,
            max_tcp_connections_per_service: caps.tcp.1,
            max_tcp_connections: caps.tcp.2,
            max_udp_sessions_per_listener: caps.udp.0,
            max_udp_sessions_per_service: caps.udp.1,
            max_udp_sessions: caps.udp.2,
            ..self
        }
    }
}

/// Why a Service cannot be turned into a [`ServiceSpec`]. Messages name fields, not secrets.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// A field holds a value the data path cannot use.
    #[error("{field}: {message}")]
    Invalid {
        /// The field path (for example `spec.loadBalancerSourceRanges[2]`).
        field: String,
        /// What is wrong.
        message: String,
    },
}

fn invalid(field: impl Into<String>, message: impl Into<String>) -> SpecError {
    SpecError::Invalid { field: field.into(), message: message.into() }
}

/// The [`ServiceSpec`] of a `type: LoadBalancer` Service served on `addresses`, with `nodes`
/// as backends (their first InternalIP, at the Service's nodePorts).
pub fn service_spec(
    service: &Service,
    nodes: &[&Node],
    addresses: &[IpAddr],
    settings: &Settings,
) -> Result<ServiceSpec, SpecError> {
    let namespace = service.metadata.namespace.as_deref().unwrap_or_default();
    let name = service.metadata.name.as_deref().unwrap_or_default();
    let spec = service.spec.as_ref().ok_or_else(|| invalid("spec", "missing"))?;

    let mut ports = Vec::new();
    for (i, p) in spec.ports.iter().flatten().enumerate() {
        if i >= MAX_PORTS {
            return Err(invalid("spec.ports", format!("more than {MAX_PORTS} ports")));
        }
        let protocol = match p.protocol.as_deref().unwrap_or("TCP") {
            "TCP" => Protocol::Tcp,
            "UDP" => Protocol::Udp,
            // SCTP is not proxied; the port is skipped rather than failing the Service.
            _ => continue,
        };
        let port = u16::try_from(p.port).ok().filter(|p| *p != 0);
        let port = port.ok_or_else(|| invalid(format!("spec.ports[{i}].port"), "out of range"))?;
        let Some(target_port) = p.node_port.and_then(|n| u16::try_from(n).ok()).filter(|n| *n != 0) else {
            // No nodePort (allocateLoadBalancerNodePorts: false, or not allocated yet).
            continue;
        };
        ports.push(PortSpec { protocol, port, target_port });
    }

    let mut backends: BTreeSet<Backend> = BTreeSet::new();
    for node in nodes {
        let addresses = node.status.as_ref().and_then(|s| s.addresses.as_ref());
        let ip = addresses
            .into_iter()
            .flatten()
            .filter(|a| a.type_ == "InternalIP")
            .find_map(|a| a.address.parse::<IpAddr>().ok());
        if let Some(ip) = ip {
            backends.insert(Backend { name: node.metadata.name.clone().unwrap_or_default(), ip });
        }
    }

    let health_check = if !settings.health_checks {
        HealthCheck::None
    } else {
        let local = spec.external_traffic_policy.as_deref() == Some("Local");
        let port = match spec.health_check_node_port.and_then(|p| u16::try_from(p).ok()).filter(|p| *p != 0) {
            Some(port) if local => port,
            _ => settings.cluster_health_port,
        };
        HealthCheck::Http { port, path: HEALTH_PATH.to_string() }
    };

    let affinity =
        if spec.session_affinity.as_deref() == Some("ClientIP") { Affinity::ClientIp } else { Affinity::None };

    let source_ranges = source_ranges(service)?;

    Ok(ServiceSpec {
        key: format!("{namespace}/{name}"),
        addresses: addresses.to_vec(),
        ports,
        backends: backends.into_iter().collect(),
        health_check,
        affinity,
        balance: settings.balance,
        source_ranges,
    })
}

/// The Service's allowed source ranges: `spec.loadBalancerSourceRanges`, else the legacy
/// annotation; empty allows every client.
pub fn source_ranges(service: &Service) -> Result<Vec<IpNet>, SpecError> {
    let from_spec = service.spec.as_ref().and_then(|s| s.load_balancer_source_ranges.clone()).unwrap_or_default();
    let (field, entries): (&str, Vec<String>) = if !from_spec.is_empty() {
        ("spec.loadBalancerSourceRanges", from_spec)
    } else {
        let annotation = service.metadata.annotations.as_ref().and_then(|a| a.get(SOURCE_RANGES_ANNOTATION));
        let entries = annotation
            .map(|a| a.split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect())
            .unwrap_or_default();
        ("metadata.annotations[service.beta.kubernetes.io/load-balancer-source-ranges]", entries)
    };
    if entries.len() > MAX_SOURCE_RANGES {
        return Err(invalid(field, format!("more than {MAX_SOURCE_RANGES} ranges")));
    }
    entries
        .iter()
        .enumerate()
        .map(|(i, e)| {
            e.trim().parse::<IpNet>().map(|n| n.trunc()).map_err(|_| invalid(format!("{field}[{i}]"), "not a CIDR"))
        })
        .collect()
}

/// What changes between two sets of listeners.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListenerPlan {
    /// Listeners to open.
    pub open: Vec<ListenerKey>,
    /// Listeners to close (their connections drain).
    pub close: Vec<ListenerKey>,
    /// Listeners kept whose backend port changes.
    pub retarget: Vec<(ListenerKey, u16)>,
}

/// The listener changes from `current` to `desired`; unchanged listeners are left alone.
pub fn plan_listeners(current: &BTreeMap<ListenerKey, u16>, desired: &BTreeMap<ListenerKey, u16>) -> ListenerPlan {
    let mut plan = ListenerPlan::default();
    for (key, target) in desired {
        match current.get(key) {
            None => plan.open.push(*key),
            Some(old) if old != target => plan.retarget.push((*key, *target)),
            Some(_) => {}
        }
    }
    plan.close = current.keys().filter(|k| !desired.contains_key(k)).copied().collect();
    plan
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeAddress, NodeStatus, ServicePort, ServiceSpec as KubeServiceSpec};
    use kube::api::ObjectMeta;

    fn svc(ports: Vec<ServicePort>) -> Service {
        Service {
            metadata: ObjectMeta { name: Some("web".into()), namespace: Some("shop".into()), ..Default::default() },
            spec: Some(KubeServiceSpec {
                type_: Some("LoadBalancer".into()),
                ports: Some(ports),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn port(protocol: &str, port: i32, node_port: Option<i32>) -> ServicePort {
        ServicePort { protocol: Some(protocol.into()), port, node_port, ..Default::default() }
    }

    fn node(name: &str, addresses: &[(&str, &str)]) -> Node {
        Node {
            metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
            status: Some(NodeStatus {
                addresses: Some(
                    addresses
                        .iter()
                        .map(|(t, a)| NodeAddress { type_: t.to_string(), address: a.to_string() })
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn backends_are_internal_ips_at_node_ports() {
        let service = svc(vec![port("TCP", 80, Some(30080)), port("UDP", 53, Some(30053))]);
        let a = node("a", &[("Hostname", "a"), ("ExternalIP", "203.0.113.1"), ("InternalIP", "10.0.0.1")]);
        let b = node("b", &[("Hostname", "b")]);
        let ip: IpAddr = "192.0.2.10".parse().unwrap();
        let spec = service_spec(&service, &[&a, &b], &[ip], &Settings::default()).unwrap();
        assert_eq!(spec.key, "shop/web");
        assert_eq!(spec.backends, [Backend { name: "a".into(), ip: "10.0.0.1".parse().unwrap() }]);
        assert_eq!(
            spec.ports,
            [
                PortSpec { protocol: Protocol::Tcp, port: 80, target_port: 30080 },
                PortSpec { protocol: Protocol::Udp, port: 53, target_port: 30053 }
            ]
        );
        assert_eq!(spec.listeners().len(), 2);
    }

    #[test]
    fn ports_without_node_port_or_of_sctp_are_not_proxied() {
        let service = svc(vec![port("TCP", 80, None), port("SCTP", 9, Some(30009)), port("TCP", 443, Some(30443))]);
        let spec = service_spec(&service, &[], &[], &Settings::default()).unwrap();
        assert_eq!(spec.ports, [PortSpec { protocol: Protocol::Tcp, port: 443, target_port: 30443 }]);
    }

    #[test]
    fn cluster_policy_checks_kube_proxy_and_local_checks_the_health_check_node_port() {
        let mut service = svc(vec![port("TCP", 80, Some(30080))]);
        let spec = service_spec(&service, &[], &[], &Settings::default()).unwrap();
        assert_eq!(spec.health_check, HealthCheck::Http { port: 10256, path: "/healthz".into() });
        let s = service.spec.as_mut().unwrap();
        s.external_traffic_policy = Some("Local".into());
        s.health_check_node_port = Some(32000);
        let spec = service_spec(&service, &[], &[], &Settings::default()).unwrap();
        assert_eq!(spec.health_check, HealthCheck::Http { port: 32000, path: "/healthz".into() });
        let off = Settings { health_checks: false, ..Settings::default() };
        assert_eq!(service_spec(&service, &[], &[], &off).unwrap().health_check, HealthCheck::None);
    }

    #[test]
    fn client_ip_session_affinity_becomes_source_hashing() {
        let mut service = svc(vec![]);
        service.spec.as_mut().unwrap().session_affinity = Some("ClientIP".into());
        assert_eq!(service_spec(&service, &[], &[], &Settings::default()).unwrap().affinity, Affinity::ClientIp);
    }

    #[test]
    fn source_ranges_come_from_the_spec_then_the_annotation() {
        let mut service = svc(vec![]);
        service.metadata.annotations =
            Some([(SOURCE_RANGES_ANNOTATION.to_string(), "10.0.0.0/8, 192.168.1.7/24".to_string())].into());
        let ranges = source_ranges(&service).unwrap();
        assert_eq!(ranges, ["10.0.0.0/8".parse::<IpNet>().unwrap(), "192.168.1.0/24".parse().unwrap()]);
        service.spec.as_mut().unwrap().load_balancer_source_ranges = Some(vec!["127.0.0.1/32".into()]);
        assert_eq!(source_ranges(&service).unwrap(), ["127.0.0.1/32".parse::<IpNet>().unwrap()]);
    }

    #[test]
    fn an_invalid_source_range_is_named_by_its_index() {
        let mut service = svc(vec![]);
        service.spec.as_mut().unwrap().load_balancer_source_ranges = Some(vec!["10.0.0.0/8".into(), "nope".into()]);
        let error = source_ranges(&service).unwrap_err().to_string();
        assert!(error.starts_with("spec.loadBalancerSourceRanges[1]"), "{error}");
        assert!(!error.contains("nope"), "values are not echoed: {error}");
    }

    #[test]
    fn the_listener_plan_touches_only_what_changed() {
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let key = |port| ListenerKey { address: a, port, protocol: Protocol::Tcp };
        let current = BTreeMap::from([(key(80), 30080), (key(443), 30443), (key(8080), 30880)]);
        let desired = BTreeMap::from([(key(80), 30080), (key(443), 31443), (key(9090), 30990)]);
        let plan = plan_listeners(&current, &desired);
        assert_eq!(plan.open, [key(9090)]);
        assert_eq!(plan.close, [key(8080)]);
        assert_eq!(plan.retarget, [(key(443), 31443)]);
    }

    #[test]
    fn auto_forwarding_copies_a_few_connections_and_splices_under_load() {
        assert!(!TcpForwarding::Auto.splices(0));
        assert!(!TcpForwarding::Auto.splices(SPLICE_FROM_OPEN_CONNECTIONS - 1));
        assert!(TcpForwarding::Auto.splices(SPLICE_FROM_OPEN_CONNECTIONS));
        assert!(TcpForwarding::Splice.splices(0));
        assert!(!TcpForwarding::Copy.splices(10_000));
    }

    #[test]
    fn caps_shrink_in_proportion_to_fit_a_low_open_file_limit() {
        let defaults = CapsConfig::default();
        let (same, lowered) = resolve_caps(&defaults, Some(1 << 20));
        assert!(lowered.is_empty());
        let settings = Settings::default();
        assert_eq!(Settings::default().with_caps(same), settings, "a raised limit keeps the defaults");
        let (fitted, _) = resolve_caps(&defaults, Some(20_000));
        assert!(fitted.descriptors() <= 20_000 - RESERVED_DESCRIPTORS, "{fitted:?}");
        let wanted = DEFAULT_MAX_TCP_CONNECTIONS as u64 * DESCRIPTORS_PER_TCP_CONNECTION
            + DEFAULT_MAX_UDP_SESSIONS as u64 * DESCRIPTORS_PER_UDP_SESSION;
        let expected = DEFAULT_MAX_TCP_CONNECTIONS as u64 * (20_000 - RESERVED_DESCRIPTORS) / wanted;
        assert_eq!(fitted.tcp.2 as u64, expected);
        assert!(fitted.tcp.0 <= fitted.tcp.1 && fitted.tcp.1 <= fitted.tcp.2);
        assert!(fitted.udp.0 <= fitted.udp.1 && fitted.udp.1 <= fitted.udp.2);
        // An unraised 1024: a quarter stays for the rest of the process, every cap at least 1.
        let (tiny, _) = resolve_caps(&defaults, Some(1024));
        assert!(tiny.descriptors() <= 768, "{tiny:?}");
        let (none, _) = resolve_caps(&defaults, Some(0));
        assert_eq!((none.tcp, none.udp), ((1, 1, 1), (1, 1, 1)));
    }

    #[test]
    fn default_caps_fit_the_machine_and_only_configured_caps_that_do_not_fit_are_named() {
        // Where the limit holds them, the defaults: a Service's share is half the total.
        let (caps, lowered) = resolve_caps(&CapsConfig::default(), Some(1 << 20));
        assert_eq!((caps.tcp, caps.udp), ((1024, 1024, 2048), (1024, 4096, 8192)));
        assert!(lowered.is_empty());
        assert_eq!(resolve_caps(&CapsConfig::default(), None).0, caps, "an unknown limit keeps them");
        // The sandbox's 20,000 open files: defaults that fit, and nothing to warn about.
        let (caps, lowered) = resolve_caps(&CapsConfig::default(), Some(20_000));
        assert!(lowered.is_empty(), "{lowered:?}");
        assert!(caps.descriptors() <= 20_000 - RESERVED_DESCRIPTORS);
        assert_eq!(caps.tcp.1, caps.tcp.2 / 2);
        // A configured cap the limit cannot hold is lowered and named; the defaults beside it are not.
        let explicit = CapsConfig { tcp_total: Some(5000), ..Default::default() };
        let (caps, lowered) = resolve_caps(&explicit, Some(20_000));
        assert_eq!(lowered, ["maxTcpConnections"]);
        assert!(caps.descriptors() <= 20_000 - RESERVED_DESCRIPTORS);
        let share = CapsConfig { tcp_per_service: Some(2000), tcp_per_listener: Some(2000), ..Default::default() };
        let (caps, lowered) = resolve_caps(&share, Some(20_000));
        assert_eq!(lowered, ["maxTcpConnectionsPerService", "maxTcpConnectionsPerListener"]);
        assert_eq!((caps.tcp.0, caps.tcp.1), (caps.tcp.2, caps.tcp.2));
        // Configured caps that fit are kept as they are.
        let fits = CapsConfig {
            tcp_total: Some(300),
            tcp_per_service: Some(200),
            tcp_per_listener: Some(100),
            ..Default::default()
        };
        let (caps, lowered) = resolve_caps(&fits, Some(20_000));
        assert_eq!((caps.tcp, lowered.len()), ((100, 200, 300), 0));
    }

    #[test]
    fn detection_bound_covers_the_failure_threshold() {
        let h = HealthSettings::default();
        assert_eq!(h.detection_bound(), Duration::from_secs(2 + 3 * 2));
    }
}
