//! The health and metrics endpoint (`--bind-address:--secure-port`).
//!
//! | Path | Answer | Needs |
//! |---|---|---|
//! | `/healthz` | 200 `ok` when every check passes, else 500 listing each check | nothing (always allowed) |
//! | `/healthz/<check>` | one check: `leaderElection` or a running controller's canonical name | `get` on the path |
//! | `/livez` | 200 while the process serves requests; never depends on the API server | nothing |
//! | `/readyz` | 200 once the shared caches have synced (standby replicas are ready too) | nothing |
//! | `/metrics` | Prometheus text exposition | `get` on `/metrics` |
//! | `/capabilities` | the provider's capability report as JSON (KEP-6128; docs/provider-capabilities.md) | `get` on `/capabilities` |
//!
//! Served by [`crate::serving`]: HTTPS (a self-signed certificate unless one is given), bearer
//! tokens checked with TokenReview and SubjectAccessReview except on
//! `--authorization-always-allow-paths`, and connection limits and timeouts.

use std::sync::Arc;

use http::{Method, StatusCode};
use tokio_util::sync::CancellationToken;

use crate::health::HealthRegistry;
use crate::metrics::Metrics;

pub use crate::serving::{Answer, HttpConfig, Limits, Listener, Tls, TlsFiles, load_tls};

/// Upstream's `--secure-port` default for the cloud-controller-manager.
pub const DEFAULT_SECURE_PORT: u16 = 10258;

/// Content type of the metrics exposition (prometheus-client writes OpenMetrics text).
pub const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Content type of `/capabilities`.
pub const CAPABILITIES_CONTENT_TYPE: &str = "application/json";

/// What the endpoints report on.
#[derive(Clone, Debug)]
pub struct HttpState {
    /// `/healthz` checks.
    pub health: HealthRegistry,
    /// `/readyz` checks.
    pub ready: HealthRegistry,
    /// `/metrics`.
    pub metrics: Arc<Metrics>,
    /// `/capabilities`: the provider's report, as JSON; `None` where no provider runs (the
    /// operator's endpoint), which answers 404.
    pub capabilities: Option<Arc<str>>,
}

/// Answer a request for `path` (query string allowed). Pure, so it is tested without sockets.
pub fn answer(state: &HttpState, method: &Method, path: &str) -> Answer {
    if method != Method::GET && method != Method::HEAD {
        return Answer::text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
    }
    let (path, query) = path.split_once('?').unwrap_or((path, ""));
    let verbose = query.split('&').any(|q| q == "verbose" || q.starts_with("verbose="));
    match path.trim_end_matches('/') {
        "/healthz" => aggregate(&state.health, "healthz", verbose),
        "/readyz" => aggregate(&state.ready, "readyz", verbose),
        "/livez" | "/livez/ping" | "/healthz/ping" | "/readyz/ping" => Answer::text(StatusCode::OK, "ok"),
        "/metrics" => {
            Answer { status: StatusCode::OK, content_type: METRICS_CONTENT_TYPE, body: state.metrics.encode() }
        }
        "/capabilities" if state.capabilities.is_some() => Answer {
            status: StatusCode::OK,
            content_type: CAPABILITIES_CONTENT_TYPE,
            body: state.capabilities.as_deref().unwrap_or_default().to_string(),
        },
        p => {
            let single = p
                .strip_prefix("/healthz/")
                .map(|name| (&state.health, name))
                .or_else(|| p.strip_prefix("/readyz/").map(|name| (&state.ready, name)));
            match single {
                Some((registry, name)) => match registry.get(name) {
                    Some(Ok(())) => Answer::text(StatusCode::OK, "ok"),
                    Some(Err(reason)) => {
                        Answer::text(StatusCode::INTERNAL_SERVER_ERROR, format!("internal server error: {reason}\n"))
                    }
                    None => Answer::text(StatusCode::NOT_FOUND, format!("no check named {name:?}\n")),
                },
                None => Answer::text(StatusCode::NOT_FOUND, "not found\n"),
            }
        }
    }
}

/// Kubernetes' aggregate format: `ok`, or one `[+]`/`[-]` line per check.
fn aggregate(registry: &HealthRegistry, what: &str, verbose: bool) -> Answer {
    let checks = registry.all();
    let failed = checks.iter().any(|(_, s)| s.is_err());
    if !failed && !verbose {
        return Answer::text(StatusCode::OK, "ok");
    }
    let mut body = String::new();
    for (name, state) in &checks {
        match state {
            Ok(()) => body.push_str(&format!("[+]{name} ok\n")),
            // Reasons are shown only on /<what>/<check>, as Kubernetes does.
            Err(_) => body.push_str(&format!("[-]{name} failed: reason withheld\n")),
        }
    }
    if failed {
        for (name, state) in &checks {
            if let Err(reason) = state
                && let Some(suppressed) = registry.failure_log_allowed(name, std::time::Instant::now())
            {
                tracing::info!(check = %name, %reason, endpoint = what, suppressed, "health check failed");
            }
        }
        body.push_str(&format!("{what} check failed\n"));
        Answer::text(StatusCode::INTERNAL_SERVER_ERROR, body)
    } else {
        body.push_str(&format!("{what} check passed\n"));
        Answer::text(StatusCode::OK, body)
    }
}

impl Listener {
    /// Serve the health checks and metrics of `state` until `shutdown` fires.
    pub async fn serve(self, state: HttpState, shutdown: CancellationToken) {
        self.serve_with(Arc::new(move |method: &Method, path: &str| answer(&state, method, path)), shutdown).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::gauge::Gauge;

    fn state() -> HttpState {
        HttpState {
            health: HealthRegistry::new(),
            ready: HealthRegistry::new(),
            metrics: Arc::new(Metrics::new()),
            capabilities: None,
        }
    }

    #[test]
    fn healthz_is_ok_when_every_check_passes_and_lists_them_when_one_fails() {
        let s = state();
        assert_eq!(answer(&s, &Method::GET, "/healthz").body, "ok", "no checks: healthy");
        s.health.handle("leaderElection");
        let node = s.health.handle("cloud-node-controller");
        assert_eq!(answer(&s, &Method::GET, "/healthz").status, StatusCode::OK);
        node.set_unhealthy("cloud API unreachable");
        let a = answer(&s, &Method::GET, "/healthz");
        assert_eq!(a.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(a.body.contains("[-]cloud-node-controller failed"), "{}", a.body);
        assert!(a.body.contains("[+]leaderElection ok"), "{}", a.body);
        assert!(!a.body.contains("unreachable"), "aggregate withholds reasons");
        let verbose = answer(&s, &Method::GET, "/healthz?verbose");
        assert!(verbose.body.ends_with("healthz check failed\n"));
    }

    #[test]
    fn a_single_check_answers_with_its_reason_and_unknown_checks_are_404() {
        let s = state();
        let h = s.health.handle("service-lb-controller");
        assert_eq!(answer(&s, &Method::GET, "/healthz/service-lb-controller").status, StatusCode::OK);
        h.set_unhealthy("no load balancer capability");
        let a = answer(&s, &Method::GET, "/healthz/service-lb-controller");
        assert_eq!(a.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(a.body.contains("no load balancer capability"));
        assert_eq!(answer(&s, &Method::GET, "/healthz/nope").status, StatusCode::NOT_FOUND);
        assert_eq!(answer(&s, &Method::GET, "/nope").status, StatusCode::NOT_FOUND);
    }

    #[test]
    fn livez_never_depends_on_checks_and_readyz_uses_its_own() {
        let s = state();
        s.health.handle("leaderElection").set_unhealthy("lease expired");
        s.ready.handle("informer-sync").set_unhealthy("caches not synced");
        assert_eq!(answer(&s, &Method::GET, "/livez").status, StatusCode::OK);
        assert_eq!(answer(&s, &Method::GET, "/readyz").status, StatusCode::INTERNAL_SERVER_ERROR);
        s.ready.handle("informer-sync");
        assert_eq!(answer(&s, &Method::GET, "/readyz").status, StatusCode::OK);
    }

    #[test]
    fn metrics_are_served_as_openmetrics_text() {
        let s = state();
        let g: Gauge = Gauge::default();
        s.metrics.register("leader_election_master_status", "Leader", g.clone());
        g.set(1);
        let a = answer(&s, &Method::GET, "/metrics");
        assert_eq!(a.content_type, METRICS_CONTENT_TYPE);
        assert!(a.body.contains("leader_election_master_status 1"), "{}", a.body);
        assert_eq!(answer(&s, &Method::POST, "/metrics").status, StatusCode::METHOD_NOT_ALLOWED);
    }

    #[test]
    fn capabilities_are_served_as_json_where_a_provider_runs_and_are_404_elsewhere() {
        let mut s = state();
        assert_eq!(answer(&s, &Method::GET, "/capabilities").status, StatusCode::NOT_FOUND);
        s.capabilities = Some(r#"{"provider":"fake"}"#.into());
        let a = answer(&s, &Method::GET, "/capabilities");
        assert_eq!((a.status, a.content_type), (StatusCode::OK, CAPABILITIES_CONTENT_TYPE));
        assert_eq!(a.body, r#"{"provider":"fake"}"#);
    }
}
