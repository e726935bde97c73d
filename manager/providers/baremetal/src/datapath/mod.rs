//! An L4 data path for load balancers: TCP and UDP proxies on Tokio, provider-independent.
//!
//! A provider turns each `type: LoadBalancer` Service into a [`ServiceSpec`] (see
//! [`config::service_spec`]) and hands it to [`DataPath::apply`], again whenever the Service or
//! its Nodes change, and calls [`DataPath::remove`] when the Service goes. The data path then:
//!
//! - listens on every ingress address and Service port (TCP and UDP) and forwards each
//!   connection, or each UDP client's session, to a backend at the Service's nodePort;
//! - health-checks backends the way kube-proxy expects (`:10256/healthz` for
//!   `externalTrafficPolicy: Cluster`, the Service's `healthCheckNodePort` for `Local`);
//! - picks backends round-robin or by least connections, or by source-address hashing for
//!   `sessionAffinity: ClientIP`, and refuses clients outside `loadBalancerSourceRanges`;
//! - reconfigures live: unchanged listeners keep their connections, connections to a removed
//!   backend or on a removed port drain for [`Settings::drain_timeout`];
//! - bounds what a flood can take: TCP connections per listener, per Service and in total, an
//!   idle timeout for TCP, and UDP sessions per listener, per Service and in total, a full
//!   listener evicting its least recently active session (see [`limits`]);
//! - on request, starts each backend TCP connection with a PROXY protocol header naming the
//!   client (see [`proxy_protocol`]);
//! - counts connections, bytes and backend health per Service and backend.

pub mod config;
pub mod health;
pub mod limits;
mod meter;
pub mod metrics;
pub mod proxy_protocol;
#[cfg(test)]
mod proxy_protocol_parse;
pub mod select;
#[cfg(target_os = "linux")]
mod splice;
mod tcp;
mod udp;

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use ipnet::IpNet;
use prometheus_client::metrics::counter::Counter;
use socket2::{Domain, Socket, Type};
use tokio_util::sync::CancellationToken;

pub use self::config::{
    Affinity, Backend, Balance, BindMode, HealthCheck, HealthSettings, ListenerKey, PortSpec, Protocol,
    SPLICE_FROM_OPEN_CONNECTIONS, ServiceOptions, ServiceSpec, Settings, TcpForwarding,
};
use self::metrics::{BackendCounters, DataPathMetrics, HealthLabels, RefusedLabels, ServiceLabels};
pub use self::proxy_protocol::ProxyProtocol;
use self::select::{Candidate, Health};
use ccm_framework::metrics::Metrics;

/// Pending connections per TCP listener.
const BACKLOG: i32 = 1024;

/// Why the data path could not apply a Service.
#[derive(Debug, thiserror::Error)]
pub enum DataPathError {
    /// Some listeners could not be opened; the others serve.
    #[error("cannot listen on {}: {}", .failed.iter().map(|(k, _)| k.to_string()).collect::<Vec<_>>().join(", "), .failed.first().map(|(_, e)| e.to_string()).unwrap_or_default())]
    Bind {
        /// Each listener that failed, with the socket error.
        failed: Vec<(ListenerKey, io::Error)>,
    },
    /// The data path has been shut down.
    #[error("the data path is shut down")]
    ShutDown,
}

/// What the data path holds, for diagnostics and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Held {
    /// TCP connections, from accept until closed.
    pub tcp_connections: usize,
    /// UDP sessions.
    pub udp_sessions: usize,
}

/// One backend of one Service, shared by its listeners.
#[derive(Debug)]
pub(crate) struct BackendRt {
    name: String,
    ip: IpAddr,
    health: Mutex<Option<(health::Target, Arc<health::State>)>>,
    active: AtomicUsize,
    /// Fires when the backend has left and its drain time is over.
    drain: CancellationToken,
    service: String,
    metrics: DataPathMetrics,
    /// Series are created on first use, so a TCP-only Service exports no UDP series.
    tcp: OnceLock<BackendCounters>,
    udp: OnceLock<BackendCounters>,
}

impl BackendRt {
    fn health(&self) -> Health {
        match &*self.health.lock().unwrap_or_else(|e| e.into_inner()) {
            None => Health::Healthy,
            Some((_, state)) => state.health(),
        }
    }

    fn counters(&self, protocol: Protocol) -> &BackendCounters {
        let cell = match protocol {
            Protocol::Tcp => &self.tcp,
            Protocol::Udp => &self.udp,
        };
        cell.get_or_init(|| BackendCounters::new(&self.metrics, &self.service, &self.name, protocol.as_str()))
    }
}

/// Counts a connection or session as open while it lives.
pub(crate) struct ActiveGuard {
    backend: Arc<BackendRt>,
    protocol: Protocol,
}

impl ActiveGuard {
    fn new(backend: Arc<BackendRt>, protocol: Protocol) -> Self {
        backend.active.fetch_add(1, Ordering::Relaxed);
        let counters = backend.counters(protocol);
        counters.connections.inc();
        counters.active.inc();
        Self { backend, protocol }
    }
}

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.backend.active.fetch_sub(1, Ordering::Relaxed);
        self.backend.counters(self.protocol).active.dec();
    }
}

/// What new connections of a Service are routed by; swapped whole on reconfiguration.
#[derive(Debug)]
pub(crate) struct Routing {
    backends: Vec<Arc<BackendRt>>,
    ranges: Vec<IpNet>,
    affinity: Affinity,
    balance: Balance,
    /// The header new TCP connections send their backend first.
    proxy_protocol: Option<ProxyProtocol>,
}

/// A Service's state shared by its listeners.
#[derive(Debug)]
pub(crate) struct ServiceShared {
    key: String,
    routing: RwLock<Arc<Routing>>,
    turn: AtomicUsize,
    settings: Arc<Settings>,
    tcp_forwarding: TcpForwarding,
    /// TCP connections open in the whole data path (what [`TcpForwarding::Auto`] looks at).
    open_tcp: Arc<AtomicUsize>,
    /// TCP connections held in the whole data path, from accept (what the cap counts).
    held_tcp: Arc<AtomicUsize>,
    /// UDP sessions held in the whole data path.
    held_udp: Arc<AtomicUsize>,
    /// TCP connections this Service holds over all its listeners (what its share counts).
    service_tcp: Arc<AtomicUsize>,
    /// UDP sessions this Service holds over all its listeners.
    service_udp: Arc<AtomicUsize>,
    source_refused: Counter,
    no_backend: Counter,
    listener_full: Counter,
    service_full: Counter,
    total_full: Counter,
    evicted: Counter,
    idle_closed: Counter,
}

impl ServiceShared {
    fn routing(&self) -> Arc<Routing> {
        self.routing.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The refusal counter of a full cap.
    fn full(&self, full: limits::Full) -> &Counter {
        match full {
            limits::Full::Listener => &self.listener_full,
            limits::Full::Service => &self.service_full,
            limits::Full::DataPath => &self.total_full,
        }
    }

    /// A backend for a client, skipping those in `tried`.
    fn choose(&self, routing: &Routing, client: IpAddr, tried: &[usize]) -> Option<usize> {
        let candidates: Vec<Candidate> = routing
            .backends
            .iter()
            .map(|b| Candidate { ip: b.ip, health: b.health(), active: b.active.load(Ordering::Relaxed) })
            .collect();
        let turn = self.turn.fetch_add(1, Ordering::Relaxed);
        select::pick(&candidates, routing.balance, routing.affinity, client, turn, tried)
    }
}

/// One listener's state: its Service and where it forwards to.
#[derive(Debug)]
pub(crate) struct PortShared {
    service: Arc<ServiceShared>,
    target_port: AtomicU16,
    /// Fires when the listener has been removed and its drain time is over.
    drain: CancellationToken,
    /// TCP connections or UDP sessions this listener holds (what its cap counts).
    held: Arc<AtomicUsize>,
}

#[derive(Debug)]
struct ListenerRt {
    target_port: u16,
    stop_accepting: CancellationToken,
    port: Arc<PortShared>,
}

#[derive(Debug)]
struct ServiceRt {
    shared: Arc<ServiceShared>,
    spec: ServiceSpec,
    listeners: BTreeMap<ListenerKey, ListenerRt>,
    /// Parent of every task of the Service; fires when it is removed and drained.
    token: CancellationToken,
}

struct Inner {
    settings: Arc<Settings>,
    tcp_forwarding: TcpForwarding,
    open_tcp: Arc<AtomicUsize>,
    held_tcp: Arc<AtomicUsize>,
    held_udp: Arc<AtomicUsize>,
    monitor: health::Monitor,
    metrics: DataPathMetrics,
    services: Mutex<HashMap<String, ServiceRt>>,
    root: CancellationToken,
}

/// The data path: every Service's listeners, backends and health checkers.
#[derive(Clone)]
pub struct DataPath {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for DataPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataPath").field("settings", &self.inner.settings).finish_non_exhaustive()
    }
}

impl DataPath {
    /// An empty data path whose tasks all stop when `shutdown` fires. Registers its metric
    /// families in `registry` (once per process).
    pub fn new(settings: Settings, registry: &Metrics, shutdown: CancellationToken) -> Self {
        Self::with_tcp_forwarding(settings, TcpForwarding::default(), registry, shutdown)
    }

    /// [`DataPath::new`] with a chosen way of moving TCP bytes (benchmarks and tests compare
    /// them; the default is the fastest the platform offers).
    pub fn with_tcp_forwarding(
        settings: Settings,
        tcp_forwarding: TcpForwarding,
        registry: &Metrics,
        shutdown: CancellationToken,
    ) -> Self {
        let monitor = health::Monitor::new(settings.health, shutdown.clone());
        Self {
            inner: Arc::new(Inner {
                settings: Arc::new(settings),
                tcp_forwarding,
                open_tcp: Arc::new(AtomicUsize::new(0)),
                held_tcp: Arc::new(AtomicUsize::new(0)),
                held_udp: Arc::new(AtomicUsize::new(0)),
                monitor,
                metrics: DataPathMetrics::register(registry),
                services: Mutex::new(HashMap::new()),
                root: shutdown,
            }),
        }
    }

    /// The settings.
    pub fn settings(&self) -> &Settings {
        &self.inner.settings
    }

    fn services(&self) -> std::sync::MutexGuard<'_, HashMap<String, ServiceRt>> {
        self.inner.services.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Serve `spec`, creating the Service or reconfiguring it in place. Needs a Tokio runtime.
    /// Listeners that cannot be opened are reported (the rest serve) and retried by the next
    /// call. The Service gets the default [`ServiceOptions`] (no PROXY protocol header).
    pub fn apply(&self, spec: ServiceSpec) -> Result<(), DataPathError> {
        self.apply_with(spec, ServiceOptions::default())
    }

    /// [`DataPath::apply`] with per-Service options; changed options apply to new connections.
    pub fn apply_with(&self, spec: ServiceSpec, options: ServiceOptions) -> Result<(), DataPathError> {
        if self.inner.root.is_cancelled() {
            return Err(DataPathError::ShutDown);
        }
        let mut services = self.services();
        let rt = services.entry(spec.key.clone()).or_insert_with(|| self.new_service(&spec.key));
        self.update_backends(rt, &spec, options);
        let failed = self.update_listeners(rt, &spec);
        rt.spec = spec;
        if failed.is_empty() { Ok(()) } else { Err(DataPathError::Bind { failed }) }
    }

    /// Stop serving a Service: its listeners close now, open connections drain. Returns whether
    /// it was served.
    pub fn remove(&self, key: &str) -> bool {
        let Some(rt) = self.services().remove(key) else { return false };
        for listener in rt.listeners.values() {
            listener.stop_accepting.cancel();
        }
        for backend in &rt.shared.routing().backends {
            self.release_backend(&rt.shared.key, backend);
        }
        self.inner.metrics.forget_service(key);
        let token = rt.token.clone();
        let drain = self.inner.settings.drain_timeout;
        tokio::spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep(drain) => token.cancel(),
                _ = token.cancelled() => {}
            }
        });
        true
    }

    /// Remove every Service `keep` rejects (a full resynchronisation).
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        let gone: Vec<String> = self.services().keys().filter(|k| !keep(k)).cloned().collect();
        for key in gone {
            self.remove(&key);
        }
    }

    /// Stop everything now: listeners, connections, sessions and health checks.
    pub fn shutdown(&self) {
        self.inner.root.cancel();
        self.services().clear();
    }

    /// The Services served, sorted.
    pub fn keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self.services().keys().cloned().collect();
        keys.sort();
        keys
    }

    /// The open listeners of a Service.
    pub fn listeners(&self, key: &str) -> Vec<ListenerKey> {
        self.services().get(key).map(|s| s.listeners.keys().copied().collect()).unwrap_or_default()
    }

    /// The health of each backend of a Service, by backend name.
    pub fn backend_health(&self, key: &str) -> BTreeMap<String, Health> {
        let services = self.services();
        let Some(rt) = services.get(key) else { return BTreeMap::new() };
        rt.shared.routing().backends.iter().map(|b| (b.name.clone(), b.health())).collect()
    }

    /// TCP connections and UDP sessions the whole data path holds now.
    pub fn held(&self) -> Held {
        Held {
            tcp_connections: self.inner.held_tcp.load(Ordering::Acquire),
            udp_sessions: self.inner.held_udp.load(Ordering::Acquire),
        }
    }

    /// The TCP connections or UDP sessions one listener of a Service holds now.
    pub fn listener_held(&self, key: &str, listener: &ListenerKey) -> Option<usize> {
        let services = self.services();
        services.get(key)?.listeners.get(listener).map(|l| l.port.held.load(Ordering::Acquire))
    }

    /// How many health checkers run (one per distinct target).
    pub fn health_checkers(&self) -> usize {
        self.inner.monitor.checkers()
    }

    fn new_service(&self, key: &str) -> ServiceRt {
        let refused = |reason: &str| {
            self.inner
                .metrics
                .refused
                .get_or_create(&RefusedLabels { service: key.to_string(), reason: reason.to_string() })
                .clone()
        };
        let per_service = |family: &prometheus_client::metrics::family::Family<ServiceLabels, Counter>| {
            family.get_or_create(&ServiceLabels { service: key.to_string() }).clone()
        };
        let shared = ServiceShared {
            key: key.to_string(),
            routing: RwLock::new(Arc::new(Routing {
                backends: Vec::new(),
                ranges: Vec::new(),
                affinity: Affinity::None,
                balance: Balance::RoundRobin,
                proxy_protocol: None,
            })),
            turn: AtomicUsize::new(0),
            settings: self.inner.settings.clone(),
            tcp_forwarding: self.inner.tcp_forwarding,
            open_tcp: self.inner.open_tcp.clone(),
            held_tcp: self.inner.held_tcp.clone(),
            held_udp: self.inner.held_udp.clone(),
            service_tcp: Arc::new(AtomicUsize::new(0)),
            service_udp: Arc::new(AtomicUsize::new(0)),
            source_refused: refused("source_range"),
            no_backend: refused("no_backend"),
            listener_full: refused(limits::Full::Listener.reason()),
            service_full: refused(limits::Full::Service.reason()),
            total_full: refused(limits::Full::DataPath.reason()),
            evicted: per_service(&self.inner.metrics.evicted),
            idle_closed: per_service(&self.inner.metrics.idle_closed),
        };
        ServiceRt {
            shared: Arc::new(shared),
            spec: ServiceSpec {
                key: key.to_string(),
                addresses: Vec::new(),
                ports: Vec::new(),
                backends: Vec::new(),
                health_check: HealthCheck::None,
                affinity: Affinity::None,
                balance: Balance::RoundRobin,
                source_ranges: Vec::new(),
            },
            listeners: BTreeMap::new(),
            token: self.inner.root.child_token(),
        }
    }

    fn health_target(check: &HealthCheck, ip: IpAddr) -> Option<health::Target> {
        match check {
            HealthCheck::None => None,
            HealthCheck::Http { port, path } => Some(health::Target { ip, port: *port, path: path.clone() }),
        }
    }

    /// Point a backend at the health target `check` implies, subscribing and unsubscribing.
    fn set_health(&self, service: &str, backend: &BackendRt, check: &HealthCheck) {
        let wanted = Self::health_target(check, backend.ip);
        let mut slot = backend.health.lock().unwrap_or_else(|e| e.into_inner());
        let labels = HealthLabels { service: service.to_string(), backend: backend.name.clone() };
        if slot.is_none() && wanted.is_none() {
            // Unchecked backends always take traffic.
            self.inner.metrics.healthy.get_or_create(&labels).set(1);
            return;
        }
        if slot.as_ref().map(|(t, _)| t) == wanted.as_ref() {
            return;
        }
        if let Some((old, state)) = slot.take() {
            state.detach_gauge(service);
            self.inner.monitor.unsubscribe(&old);
        }
        let gauge = self.inner.metrics.healthy.get_or_create(&labels).clone();
        match wanted {
            Some(target) => {
                let state = self.inner.monitor.subscribe(&target);
                state.attach_gauge(service, gauge);
                *slot = Some((target, state));
            }
            None => {
                gauge.set(1);
            }
        }
    }

    /// Stop checking a backend that left and let its connections drain.
    fn release_backend(&self, service: &str, backend: &Arc<BackendRt>) {
        if let Some((target, state)) = backend.health.lock().unwrap_or_else(|e| e.into_inner()).take() {
            state.detach_gauge(service);
            self.inner.monitor.unsubscribe(&target);
        }
        self.inner.metrics.forget_backend(service, &backend.name);
        let token = backend.drain.clone();
        let drain = self.inner.settings.drain_timeout;
        tokio::spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep(drain) => token.cancel(),
                _ = token.cancelled() => {}
            }
        });
    }

    fn update_backends(&self, rt: &mut ServiceRt, spec: &ServiceSpec, options: ServiceOptions) {
        let current = rt.shared.routing();
        let mut old: HashMap<(String, IpAddr), Arc<BackendRt>> =
            current.backends.iter().map(|b| ((b.name.clone(), b.ip), b.clone())).collect();
        let mut backends = Vec::with_capacity(spec.backends.len());
        for wanted in &spec.backends {
            let backend = match old.remove(&(wanted.name.clone(), wanted.ip)) {
                Some(existing) => existing,
                None => Arc::new(BackendRt {
                    name: wanted.name.clone(),
                    ip: wanted.ip,
                    health: Mutex::new(None),
                    active: AtomicUsize::new(0),
                    drain: rt.token.child_token(),
                    service: spec.key.clone(),
                    metrics: self.inner.metrics.clone(),
                    tcp: OnceLock::new(),
                    udp: OnceLock::new(),
                }),
            };
            self.set_health(&spec.key, &backend, &spec.health_check);
            backends.push(backend);
        }
        for gone in old.values() {
            tracing::info!(service = %spec.key, backend = %gone.name, "backend left; its connections drain");
            self.release_backend(&spec.key, gone);
        }
        let routing = Routing {
            backends,
            ranges: spec.source_ranges.clone(),
            affinity: spec.affinity,
            balance: spec.balance,
            proxy_protocol: options.proxy_protocol,
        };
        *rt.shared.routing.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(routing);
    }

    fn update_listeners(&self, rt: &mut ServiceRt, spec: &ServiceSpec) -> Vec<(ListenerKey, io::Error)> {
        let current: BTreeMap<ListenerKey, u16> = rt.listeners.iter().map(|(k, l)| (*k, l.target_port)).collect();
        let plan = config::plan_listeners(&current, &spec.listeners());
        for key in &plan.close {
            if let Some(listener) = rt.listeners.remove(key) {
                tracing::info!(service = %spec.key, listener = %key, "listener removed; its connections drain");
                listener.stop_accepting.cancel();
                let drain = listener.port.drain.clone();
                let timeout = self.inner.settings.drain_timeout;
                tokio::spawn(async move {
                    tokio::select! {
                        _ = tokio::time::sleep(timeout) => drain.cancel(),
                        _ = drain.cancelled() => {}
                    }
                });
            }
        }
        for (key, target) in &plan.retarget {
            if let Some(listener) = rt.listeners.get_mut(key) {
                listener.target_port = *target;
                listener.port.target_port.store(*target, Ordering::Relaxed);
            }
        }
        let desired = spec.listeners();
        let mut failed = Vec::new();
        for key in plan.open {
            let target = desired.get(&key).copied().unwrap_or_default();
            let port = Arc::new(PortShared {
                service: rt.shared.clone(),
                target_port: AtomicU16::new(target),
                drain: rt.token.child_token(),
                held: Arc::new(AtomicUsize::new(0)),
            });
            let stop = port.drain.child_token();
            let addr = SocketAddr::new(key.address, key.port);
            let bound = match key.protocol {
                Protocol::Tcp => bind_tcp(addr, self.inner.settings.bind)
                    .map(|l| tokio::spawn(tcp::serve(l, port.clone(), stop.clone())))
                    .map(drop),
                Protocol::Udp => bind_udp(addr, self.inner.settings.bind)
                    .map(|s| tokio::spawn(udp::serve(Arc::new(s), port.clone(), stop.clone())))
                    .map(drop),
            };
            match bound {
                Ok(()) => {
                    tracing::debug!(service = %spec.key, listener = %key, target, "listening");
                    rt.listeners.insert(key, ListenerRt { target_port: target, stop_accepting: stop, port });
                }
                Err(error) => {
                    tracing::warn!(service = %spec.key, listener = %key, %error, "cannot listen");
                    failed.push((key, error));
                }
            }
        }
        failed
    }
}

fn socket_for(addr: SocketAddr, type_: Type, bind: BindMode) -> io::Result<Socket> {
    let socket = Socket::new(Domain::for_address(addr), type_, None)?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    if bind == BindMode::Freebind {
        match addr {
            SocketAddr::V4(_) => socket.set_freebind_v4(true)?,
            SocketAddr::V6(_) => socket.set_freebind_v6(true)?,
        }
    }
    socket.set_nonblocking(true)?;
    Ok(socket)
}

fn bind_tcp(addr: SocketAddr, bind: BindMode) -> io::Result<tokio::net::TcpListener> {
    let socket = socket_for(addr, Type::STREAM, bind)?;
    // A restarted manager rebinds while old connections sit in TIME_WAIT.
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    socket.listen(BACKLOG)?;
    tokio::net::TcpListener::from_std(socket.into())
}

fn bind_udp(addr: SocketAddr, bind: BindMode) -> io::Result<tokio::net::UdpSocket> {
    let socket = socket_for(addr, Type::DGRAM, bind)?;
    socket.bind(&addr.into())?;
    tokio::net::UdpSocket::from_std(socket.into())
}

#[cfg(test)]
mod proxy_protocol_tests;
#[cfg(test)]
mod tests;
