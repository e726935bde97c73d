//! Named health checks, one per running controller plus `leaderElection`, served on
//! `/healthz/<name>`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use crate::serving::logic::WarnLimiter;

/// A failing check is logged at most once per this period, however often `/healthz` is asked
/// (the path needs no authentication, so anyone could otherwise flood the log).
pub const FAILURE_LOG_EVERY: Duration = Duration::from_secs(30);

/// The state of one check: `Ok` or the reason it fails.
pub type CheckState = Result<(), String>;

/// Every named check; cheap to clone.
#[derive(Clone, Default, Debug)]
pub struct HealthRegistry {
    checks: Arc<RwLock<BTreeMap<String, CheckState>>>,
    failure_logs: Arc<Mutex<BTreeMap<String, WarnLimiter>>>,
}

impl HealthRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Register (or reset to healthy) the check `name` and return its handle.
    pub fn handle(&self, name: &str) -> HealthHandle {
        self.handle_with(name, Ok(()))
    }

    /// Register the check `name` in the given state and return its handle; use this for a
    /// check that starts failing, so no reader ever sees it healthy in between.
    pub fn handle_with(&self, name: &str, state: CheckState) -> HealthHandle {
        self.set(name, state);
        HealthHandle { name: name.to_string(), registry: self.clone() }
    }

    /// The state of `name`, if registered.
    pub fn get(&self, name: &str) -> Option<CheckState> {
        self.checks.read().unwrap_or_else(|e| e.into_inner()).get(name).cloned()
    }

    /// Every check, sorted by name.
    pub fn all(&self) -> Vec<(String, CheckState)> {
        self.checks.read().unwrap_or_else(|e| e.into_inner()).iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }

    /// Remove a check (its controller stopped).
    pub fn remove(&self, name: &str) {
        self.checks.write().unwrap_or_else(|e| e.into_inner()).remove(name);
    }

    /// Whether a failure of `name` seen at `now` should be logged: `Some(suppressed)` at most
    /// once per [`FAILURE_LOG_EVERY`] per check, with the number of failures not logged since.
    pub fn failure_log_allowed(&self, name: &str, now: Instant) -> Option<u64> {
        let mut logs = self.failure_logs.lock().unwrap_or_else(|e| e.into_inner());
        logs.entry(name.to_string()).or_insert_with(|| WarnLimiter::new(FAILURE_LOG_EVERY)).allow(now)
    }

    fn set(&self, name: &str, state: CheckState) {
        self.checks.write().unwrap_or_else(|e| e.into_inner()).insert(name.to_string(), state);
    }
}

/// The handle a controller uses to report its own health.
#[derive(Clone, Debug)]
pub struct HealthHandle {
    name: String,
    registry: HealthRegistry,
}

impl HealthHandle {
    /// The check's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Mark the check healthy.
    pub fn set_healthy(&self) {
        self.registry.set(&self.name, Ok(()));
    }

    /// Mark the check failing with a reason (shown on `/healthz/<name>`).
    pub fn set_unhealthy(&self, reason: impl Into<String>) {
        self.registry.set(&self.name, Err(reason.into()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_report_into_their_registry() {
        let r = HealthRegistry::new();
        let h = r.handle("node-route-controller");
        assert_eq!(r.get("node-route-controller"), Some(Ok(())));
        h.set_unhealthy("--cluster-cidr is empty");
        assert_eq!(r.get("node-route-controller"), Some(Err("--cluster-cidr is empty".into())));
        h.set_healthy();
        assert_eq!(r.all(), vec![("node-route-controller".to_string(), Ok(()))]);
        let syncing = r.handle_with("informer-sync", Err("not synced".into()));
        assert_eq!(r.get("informer-sync"), Some(Err("not synced".into())));
        syncing.set_healthy();
        r.remove("node-route-controller");
        assert!(r.get("node-route-controller").is_none());
    }

    #[test]
    fn a_failing_check_is_logged_once_per_period_whatever_the_request_rate() {
        let r = HealthRegistry::new();
        let t0 = Instant::now();
        assert_eq!(r.failure_log_allowed("leaderElection", t0), Some(0));
        let logged = (1..=1000u64)
            .filter(|ms| r.failure_log_allowed("leaderElection", t0 + Duration::from_millis(*ms)).is_some())
            .count();
        assert_eq!(logged, 0, "1,000 requests within a second log nothing more");
        // Each check has its own period.
        assert_eq!(r.failure_log_allowed("informer-sync", t0), Some(0));
        assert_eq!(r.failure_log_allowed("leaderElection", t0 + FAILURE_LOG_EVERY), Some(1000));
    }
}
