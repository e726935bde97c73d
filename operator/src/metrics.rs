//! The operator's Prometheus metrics: reconcile counts, durations, errors by reason, writes.

use std::sync::Arc;
use std::time::Duration;

use ccm_framework::metrics::Metrics;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

/// Label of the error counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// The error's metric label (see [`crate::Error::metric_label`]) or failure reason.
    pub reason: String,
}

/// Label of the write counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabel {
    /// `apply`, `delete`, `status` or `finalizer`.
    pub verb: String,
    /// The object kind.
    pub kind: String,
}

/// The operator's metric families, registered in one [`Metrics`] registry.
#[derive(Clone)]
pub struct OperatorMetrics {
    /// The registry served on `/metrics`.
    pub registry: Arc<Metrics>,
    reconciles: Counter,
    errors: Family<ReasonLabel, Counter>,
    duration: Histogram,
    writes: Family<WriteLabel, Counter>,
    leader: Gauge,
    engines: Gauge,
}

impl std::fmt::Debug for OperatorMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OperatorMetrics").finish_non_exhaustive()
    }
}

impl Default for OperatorMetrics {
    fn default() -> Self {
        Self::new(Arc::new(Metrics::new()))
    }
}

impl OperatorMetrics {
    /// Register every family in `registry`.
    pub fn new(registry: Arc<Metrics>) -> Self {
        let m = Self {
            registry,
            reconciles: Counter::default(),
            errors: Family::default(),
            duration: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
            writes: Family::default(),
            leader: Gauge::default(),
            engines: Gauge::default(),
        };
        let r = &m.registry;
        r.register("ccm_operator_reconcile", "CloudControllerManager reconciles run", m.reconciles.clone());
        r.register(
            "ccm_operator_reconcile_errors",
            "Failed reconciles and failures inside them, by reason",
            m.errors.clone(),
        );
        r.register("ccm_operator_reconcile_duration_seconds", "Duration of one reconcile", m.duration.clone());
        r.register("ccm_operator_writes", "API writes made by the operator, by verb and kind", m.writes.clone());
        r.register(
            "ccm_operator_leader",
            "1 while this operator replica holds the ccm-operator Lease",
            m.leader.clone(),
        );
        r.register("ccm_operator_embedded_engines", "Embedded-mode engines running in this process", m.engines.clone());
        m
    }

    /// Count one reconcile that took `elapsed`.
    pub fn reconciled(&self, elapsed: Duration) {
        self.reconciles.inc();
        self.duration.observe(elapsed.as_secs_f64());
    }

    /// Count one error or failure by reason.
    pub fn error(&self, reason: &str) {
        self.errors.get_or_create(&ReasonLabel { reason: reason.to_string() }).inc();
    }

    /// Count one API write.
    pub fn write(&self, verb: &str, kind: &str) {
        self.writes.get_or_create(&WriteLabel { verb: verb.to_string(), kind: kind.to_string() }).inc();
    }

    /// Set the leader gauge.
    pub fn set_leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }

    /// Set the engine gauge.
    pub fn set_engines(&self, n: usize) {
        self.engines.set(i64::try_from(n).unwrap_or(i64::MAX));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconciles_errors_and_writes_are_exposed() {
        let m = OperatorMetrics::default();
        m.reconciled(Duration::from_millis(3));
        m.error("conflict");
        m.write("apply", "Deployment");
        let text = m.registry.encode();
        assert!(text.contains("ccm_operator_reconcile_total 1"), "{text}");
        assert!(text.contains("ccm_operator_reconcile_errors_total{reason=\"conflict\"} 1"), "{text}");
        assert!(text.contains("ccm_operator_writes_total{verb=\"apply\",kind=\"Deployment\"} 1"), "{text}");
        assert!(text.contains("ccm_operator_reconcile_duration_seconds_count 1"), "{text}");
    }
}
