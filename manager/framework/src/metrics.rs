//! The Prometheus registry shared by the engine, the controllers and the provider wrapper.

use std::any::Any;
use std::collections::HashMap;
use std::sync::Mutex;

use prometheus_client::encoding::text::encode;
use prometheus_client::registry::{Metric, Registry};

/// A registry that components add their metric families to.
#[derive(Default)]
pub struct Metrics {
    registry: Mutex<Registry>,
    /// Metrics registered through `get_or_register`, by name, so a controller restarted on a
    /// new leadership term keeps updating the series it registered the first time.
    shared: Mutex<HashMap<String, Box<dyn Any + Send + Sync>>>,
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

    /// The metric registered under `name` by an earlier call, or `make()` registered now.
    /// Use this (not [`Self::register`]) from code that may run more than once per process,
    /// such as a controller's `run`: registering a name twice would duplicate its series.
    pub fn get_or_register<M>(&self, name: &str, help: &str, make: impl FnOnce() -> M) -> M
    where
        M: Metric + Clone,
    {
        let mut shared = self.shared.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(existing) = shared.get(name).and_then(|m| m.downcast_ref::<M>()) {
            return existing.clone();
        }
        let metric = make();
        self.register(name, help, metric.clone());
        shared.insert(name.to_string(), Box::new(metric.clone()));
        metric
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

    #[test]
    fn get_or_register_returns_the_first_registration() {
        let m = Metrics::new();
        let a: Counter = m.get_or_register("restarts", "Restarts", Counter::default);
        let b: Counter = m.get_or_register("restarts", "Restarts", Counter::default);
        a.inc();
        b.inc();
        let text = m.encode();
        assert!(text.contains("restarts_total 2"), "{text}");
        assert_eq!(text.matches("# TYPE restarts counter").count(), 1, "{text}");
    }
}
