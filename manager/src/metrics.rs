//! The Prometheus registry shared by the engine, the controllers and the provider wrapper.

use std::sync::Mutex;

use prometheus_client::encoding::text::encode;
use prometheus_client::registry::{Metric, Registry};

/// A registry that components add their metric families to.
#[derive(Default)]
pub struct Metrics {
    registry: Mutex<Registry>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Register a metric family. Names follow upstream where a metric exists upstream.
    pub fn register(&self, name: &str, help: &str, metric: impl Metric) {
        self.registry.lock().unwrap_or_else(|e| e.into_inner()).register(name, help, metric);
    }

    /// The Prometheus text exposition of every registered metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let registry = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::counter::Counter;

    #[test]
    fn registered_metrics_are_encoded() {
        let m = Metrics::new();
        let c: Counter = Counter::default();
        m.register("service_controller_loadbalancer_sync", "Load balancer syncs", c.clone());
        c.inc();
        let text = m.encode();
        assert!(text.contains("service_controller_loadbalancer_sync_total 1"), "{text}");
    }
}
