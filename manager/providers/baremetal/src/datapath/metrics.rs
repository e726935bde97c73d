//! Data-path metrics per Service and backend, in the manager's registry.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use ccm_framework::metrics::Metrics;

/// Labels of per-backend series.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct BackendLabels {
    /// `namespace/name` of the Service.
    pub service: String,
    /// The backend (Node) name.
    pub backend: String,
    /// `TCP` or `UDP`.
    pub protocol: String,
}

/// Labels of per-backend byte counters.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ByteLabels {
    /// `namespace/name` of the Service.
    pub service: String,
    /// The backend (Node) name.
    pub backend: String,
    /// `TCP` or `UDP`.
    pub protocol: String,
    /// `rx` (client to backend) or `tx` (backend to client).
    pub direction: String,
}

/// Labels of per-backend health.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct HealthLabels {
    /// `namespace/name` of the Service.
    pub service: String,
    /// The backend (Node) name.
    pub backend: String,
}

/// Labels of refused connections.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct RefusedLabels {
    /// `namespace/name` of the Service.
    pub service: String,
    /// `source_range` (filtered), `no_backend` (none eligible or reachable), `listener_limit`
    /// (the listener holds its cap) or `total_limit` (the data path holds its cap).
    pub reason: String,
}

/// The reasons of [`RefusedLabels`].
pub const REFUSED_REASONS: [&str; 4] = ["source_range", "no_backend", "listener_limit", "total_limit"];

/// Labels of per-Service series.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ServiceLabels {
    /// `namespace/name` of the Service.
    pub service: String,
}

/// The data path's metric families.
#[derive(Debug, Clone, Default)]
pub struct DataPathMetrics {
    /// TCP connections and UDP sessions opened per backend.
    pub connections: Family<BackendLabels, Counter>,
    /// TCP connections and UDP sessions open per backend.
    pub active: Family<BackendLabels, Gauge>,
    /// Bytes forwarded per backend and direction.
    pub bytes: Family<ByteLabels, Counter>,
    /// 1 when the backend passes its health check, 0 otherwise.
    pub healthy: Family<HealthLabels, Gauge>,
    /// Connections and sessions refused.
    pub refused: Family<RefusedLabels, Counter>,
    /// UDP sessions evicted to make room for a new client.
    pub evicted: Family<ServiceLabels, Counter>,
    /// TCP connections closed after the idle timeout.
    pub idle_closed: Family<ServiceLabels, Counter>,
}

impl DataPathMetrics {
    /// The families, registered in `registry` once per process.
    pub fn register(registry: &Metrics) -> Self {
        Self {
            connections: registry.get_or_register(
                "ccm_datapath_connections",
                "TCP connections and UDP sessions opened, per Service and backend",
                Family::default,
            ),
            active: registry.get_or_register(
                "ccm_datapath_active_connections",
                "TCP connections and UDP sessions open, per Service and backend",
                Family::default,
            ),
            bytes: registry.get_or_register(
                "ccm_datapath_bytes",
                "Bytes forwarded, per Service, backend and direction (rx: from clients, tx: to clients)",
                Family::default,
            ),
            healthy: registry.get_or_register(
                "ccm_datapath_backend_healthy",
                "1 when the backend passes its health check, per Service and backend",
                Family::default,
            ),
            refused: registry.get_or_register(
                "ccm_datapath_refused_connections",
                "Connections and sessions refused, per Service and reason",
                Family::default,
            ),
            evicted: registry.get_or_register(
                "ccm_datapath_udp_sessions_evicted",
                "UDP sessions evicted (least recently active first) to make room for a new client, per Service",
                Family::default,
            ),
            idle_closed: registry.get_or_register(
                "ccm_datapath_idle_closed_connections",
                "TCP connections closed after moving no byte for the idle timeout, per Service",
                Family::default,
            ),
        }
    }

    /// Drop every series of a backend of a Service.
    pub fn forget_backend(&self, service: &str, backend: &str) {
        for protocol in ["TCP", "UDP"] {
            let labels = BackendLabels { service: service.into(), backend: backend.into(), protocol: protocol.into() };
            self.connections.remove(&labels);
            self.active.remove(&labels);
            for direction in ["rx", "tx"] {
                self.bytes.remove(&ByteLabels {
                    service: service.into(),
                    backend: backend.into(),
                    protocol: protocol.into(),
                    direction: direction.into(),
                });
            }
        }
        self.healthy.remove(&HealthLabels { service: service.into(), backend: backend.into() });
    }

    /// Drop a Service's refused-connection series.
    pub fn forget_service(&self, service: &str) {
        for reason in REFUSED_REASONS {
            self.refused.remove(&RefusedLabels { service: service.into(), reason: reason.into() });
        }
        let labels = ServiceLabels { service: service.into() };
        self.evicted.remove(&labels);
        self.idle_closed.remove(&labels);
    }
}

/// The handles one backend's traffic updates, resolved once per backend and protocol.
#[derive(Debug, Clone)]
pub struct BackendCounters {
    /// Opened connections or sessions.
    pub connections: Counter,
    /// Open connections or sessions.
    pub active: Gauge,
    /// Bytes from clients.
    pub rx: Counter,
    /// Bytes to clients.
    pub tx: Counter,
}

impl BackendCounters {
    /// Resolve the series of `backend` of `service` for `protocol`.
    pub fn new(metrics: &DataPathMetrics, service: &str, backend: &str, protocol: &str) -> Self {
        let labels = BackendLabels { service: service.into(), backend: backend.into(), protocol: protocol.into() };
        let bytes = |direction: &str| {
            metrics
                .bytes
                .get_or_create(&ByteLabels {
                    service: service.into(),
                    backend: backend.into(),
                    protocol: protocol.into(),
                    direction: direction.into(),
                })
                .clone()
        };
        Self {
            connections: metrics.connections.get_or_create(&labels).clone(),
            active: metrics.active.get_or_create(&labels).clone(),
            rx: bytes("rx"),
            tx: bytes("tx"),
        }
    }
}
