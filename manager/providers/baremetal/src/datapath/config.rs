//! The desired state of the data path, and how a Service and its Nodes become it. Pure: no
//! sockets, no clocks.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Node, Service};

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
    /// Most TCP connections the whole data path holds.
    pub max_tcp_connections: usize,
    /// Most UDP sessions one listener keeps; a new client beyond it evicts the least recently
    /// active session.
    pub max_udp_sessions_per_listener: usize,
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
            max_tcp_connections: DEFAULT_MAX_TCP_CONNECTIONS,
            max_udp_sessions_per_listener: DEFAULT_MAX_UDP_SESSIONS_PER_LISTENER,
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
/// set once the soft limit is raised to it; lower limits shrink it (see
/// [`Settings::fit_to_descriptors`]).
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

impl Settings {
    /// The caps shrunk, in proportion, so that the data path at its fullest stays within
    /// `soft_limit` open files minus [`RESERVED_DESCRIPTORS`] (pure). Returns the settings and
    /// whether they shrank. Per-listener caps never exceed the totals.
    pub fn fit_to_descriptors(&self, soft_limit: u64) -> (Settings, bool) {
        let reserve = RESERVED_DESCRIPTORS.min(soft_limit / 4);
        let budget = soft_limit.saturating_sub(reserve);
        let tcp = self.max_tcp_connections as u64;
        let udp = self.max_udp_sessions as u64;
        let need = tcp
            .saturating_mul(DESCRIPTORS_PER_TCP_CONNECTION)
            .saturating_add(udp.saturating_mul(DESCRIPTORS_PER_UDP_SESSION));
        let mut fitted = self.clone();
        let shrank = need > budget;
        if shrank {
            // u128: the products of two u64 cannot overflow it.
            let scale =
                |n: u64| usize::try_from((u128::from(n) * u128::from(budget) / u128::from(need)).max(1)).unwrap_or(1);
            fitted.max_tcp_connections = scale(tcp);
            fitted.max_udp_sessions = scale(udp);
        }
        fitted.max_tcp_connections_per_listener =
            fitted.max_tcp_connections_per_listener.min(fitted.max_tcp_connections).max(1);
        fitted.max_udp_sessions_per_listener = fitted.max_udp_sessions_per_listener.min(fitted.max_udp_sessions).max(1);
        (fitted, shrank)
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
        let defaults = Settings::default();
        let (same, shrank) = defaults.fit_to_descriptors(1 << 20);
        assert!(!shrank);
        assert_eq!(same, defaults, "a raised limit keeps the defaults");
        let (fitted, shrank) = defaults.fit_to_descriptors(20_000);
        assert!(shrank);
        let used = fitted.max_tcp_connections as u64 * DESCRIPTORS_PER_TCP_CONNECTION
            + fitted.max_udp_sessions as u64 * DESCRIPTORS_PER_UDP_SESSION;
        assert!(used <= 20_000 - RESERVED_DESCRIPTORS, "{used}");
        let wanted = DEFAULT_MAX_TCP_CONNECTIONS as u64 * DESCRIPTORS_PER_TCP_CONNECTION
            + DEFAULT_MAX_UDP_SESSIONS as u64 * DESCRIPTORS_PER_UDP_SESSION;
        let expected = DEFAULT_MAX_TCP_CONNECTIONS as u64 * (20_000 - RESERVED_DESCRIPTORS) / wanted;
        assert_eq!(fitted.max_tcp_connections as u64, expected);
        assert!(fitted.max_tcp_connections_per_listener <= fitted.max_tcp_connections);
        assert!(fitted.max_udp_sessions_per_listener <= fitted.max_udp_sessions);
        // An unraised 1024: a quarter stays for the rest of the process, every cap at least 1.
        let (tiny, _) = defaults.fit_to_descriptors(1024);
        assert!(tiny.max_tcp_connections as u64 * 6 + tiny.max_udp_sessions as u64 <= 768);
        let (none, _) = defaults.fit_to_descriptors(0);
        assert_eq!((none.max_tcp_connections, none.max_udp_sessions), (1, 1));
    }

    #[test]
    fn detection_bound_covers_the_failure_threshold() {
        let h = HealthSettings::default();
        assert_eq!(h.detection_bound(), Duration::from_secs(2 + 3 * 2));
    }
}
