//! Fault injection: error rates (500 or 429 with Retry-After), added latency, closing watches,
//! compacting the event history.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinHandle;

use serde::{Deserialize, Serialize};

use crate::error::ApiError;

/// One fault rule; applies to requests whose path starts with `path_prefix` (all when unset).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct FaultRule {
    /// Only requests whose path starts with this (e.g. `/api/v1/nodes`); all when `None`.
    pub path_prefix: Option<String>,
    /// Only these Kubernetes verbs (`get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, ...); all when empty.
    pub verbs: Vec<String>,
    /// Fraction of matching requests that fail, 0.0 to 1.0.
    pub error_rate: f64,
    /// Status of injected failures: 500 (InternalError), 429 (TooManyRequests) or 403
    /// (Forbidden, to stand in for RBAC, which this server does not implement).
    pub status: u16,
    /// `Retry-After` seconds sent with 429s.
    pub retry_after_seconds: u64,
    /// Latency added to every matching request, in milliseconds.
    pub latency_ms: u64,
}

/// The whole fault configuration, as `GET/PUT /_test/faults` exchange it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct FaultConfig {
    /// Rules, checked in order; latencies add up, the first failing rule wins.
    pub rules: Vec<FaultRule>,
    /// Close every open watch this often (seconds); `None` to stop.
    pub close_watches_every_seconds: Option<u64>,
}

impl FaultConfig {
    /// Latency to add and the error to answer with, for a request.
    pub(crate) fn decide(&self, path: &str, verb: &str) -> (Duration, Option<ApiError>) {
        let mut latency = Duration::ZERO;
        let mut error = None;
        for r in &self.rules {
            if r.path_prefix.as_deref().is_some_and(|p| !path.starts_with(p)) {
                continue;
            }
            if !r.verbs.is_empty() && !r.verbs.iter().any(|v| v == verb) {
                continue;
            }
            latency += Duration::from_millis(r.latency_ms);
            if error.is_none() && r.error_rate > 0.0 && crate::util::random_f64() < r.error_rate {
                error = Some(match r.status {
                    429 => ApiError::too_many_requests(r.retry_after_seconds.max(1)),
                    403 => ApiError::forbidden_fault(),
                    _ => ApiError::internal("injected fault"),
                });
            }
        }
        (latency, error)
    }
}

/// What fault injection steers: the local server, or the fault proxy in front of a genuine
/// kube-apiserver.
pub(crate) trait FaultTarget: Send + Sync + 'static {
    /// The configuration requests are checked against.
    fn config(&self) -> &Mutex<FaultConfig>;
    /// Ends every open watch.
    fn close_watches(&self);
    /// Watches open now.
    fn open_watches(&self) -> usize;
    /// The task closing watches periodically, if one runs.
    fn close_every(&self) -> &Mutex<Option<JoinHandle<()>>>;
    /// Where that task runs.
    fn runtime(&self) -> tokio::runtime::Handle;
    /// Drops the event history; false where the target cannot (a genuine etcd compacts on its
    /// own schedule).
    fn compact_history(&self) -> bool;
}

/// Handle to fault injection, on either backend.
#[derive(Clone)]
pub struct Faults {
    target: Arc<dyn FaultTarget>,
}

impl Faults {
    pub(crate) fn new(target: Arc<dyn FaultTarget>) -> Faults {
        Faults { target }
    }

    fn config_lock(&self) -> std::sync::MutexGuard<'_, FaultConfig> {
        self.target.config().lock().unwrap_or_else(|e| e.into_inner())
    }

    fn update(&self, f: impl FnOnce(&mut FaultConfig)) {
        f(&mut self.config_lock());
    }

    /// The current configuration.
    pub fn config(&self) -> FaultConfig {
        self.config_lock().clone()
    }

    /// Replaces the whole configuration.
    pub fn set_config(&self, cfg: FaultConfig) {
        let every = cfg.close_watches_every_seconds;
        self.update(|c| *c = cfg);
        self.schedule_close(every.map(Duration::from_secs));
    }

    /// Adds a rule.
    pub fn add_rule(&self, rule: FaultRule) {
        self.update(|c| c.rules.push(rule));
    }

    /// Fails this fraction of all requests with `status` (500, or 429 with `Retry-After: 1`).
    pub fn set_error_rate(&self, rate: f64, status: u16) {
        self.add_rule(FaultRule { error_rate: rate, status, retry_after_seconds: 1, ..Default::default() });
    }

    /// Fails this fraction of requests under `prefix` with `status`.
    pub fn set_path_error_rate(&self, prefix: &str, rate: f64, status: u16) {
        self.add_rule(FaultRule {
            path_prefix: Some(prefix.into()),
            error_rate: rate,
            status,
            retry_after_seconds: 1,
            ..Default::default()
        });
    }

    /// Adds latency to every request.
    pub fn set_latency(&self, latency: Duration) {
        self.add_rule(FaultRule { latency_ms: latency.as_millis() as u64, ..Default::default() });
    }

    /// Adds latency to requests under `prefix`.
    pub fn set_path_latency(&self, prefix: &str, latency: Duration) {
        self.add_rule(FaultRule {
            path_prefix: Some(prefix.into()),
            latency_ms: latency.as_millis() as u64,
            ..Default::default()
        });
    }

    /// Removes every rule and stops periodic watch closing.
    pub fn clear(&self) {
        self.set_config(FaultConfig::default());
    }

    /// Ends every open watch now (clients see a clean end of stream and re-watch).
    pub fn close_watches(&self) {
        self.target.close_watches();
    }

    /// Ends every open watch every `period` (`None` stops it).
    pub fn close_watches_every(&self, period: Option<Duration>) {
        self.update(|c| c.close_watches_every_seconds = period.map(|p| p.as_secs().max(1)));
        self.schedule_close(period);
    }

    /// Drops the event history: watches resuming from any earlier version get 410 Gone.
    /// Local server only: a genuine etcd compacts on its own schedule, so through the proxy this
    /// panics rather than let a test pass without the 410 it meant to cause.
    pub fn compact_history(&self) {
        if !self.target.compact_history() {
            panic!("compact_history is not available on the genuine backend");
        }
    }

    /// Number of watches currently open.
    pub fn open_watches(&self) -> usize {
        self.target.open_watches()
    }

    fn schedule_close(&self, period: Option<Duration>) {
        let mut slot = self.target.close_every().lock().unwrap_or_else(|e| e.into_inner());
        if let Some(old) = slot.take() {
            old.abort();
        }
        if let Some(period) = period.filter(|p| !p.is_zero()) {
            let target = Arc::downgrade(&self.target);
            *slot = Some(self.target.runtime().spawn(async move {
                loop {
                    tokio::time::sleep(period).await;
                    match target.upgrade() {
                        Some(t) => t.close_watches(),
                        None => return,
                    }
                }
            }));
        }
    }
}
