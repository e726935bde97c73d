//! The webhook server: one HTTPS listener (no delegated auth: the API server is the caller),
//! requests dispatched to the selected webhooks by path, bodies bounded per webhook, each
//! decision bounded in time, and upstream's metrics
//! (`cloud_provider_webhook_request_total{code,webhook}`,
//! `cloud_provider_webhook_request_duration_seconds{code,webhook}`).

use std::sync::Arc;
use std::time::Instant;

use http::{Method, StatusCode};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use tokio_util::sync::CancellationToken;

use super::review;
use super::{ADMIT_TIME_LIMIT, AdmissionContext, AdmissionWebhook, WebhookSettings};
use crate::error::Error;
use crate::metrics::Metrics;
use crate::serving::{Answer, BodyHandler, BodyRequest, Limits, Listener};

/// Upstream's buckets of `cloud_provider_webhook_request_duration_seconds`.
const BUCKETS: [f64; 8] = [0.25, 0.5, 0.7, 1.0, 1.5, 3.0, 5.0, 10.0];

/// Most connections the webhook listener keeps open (each may carry a body of up to a few MiB).
pub const MAX_CONNECTIONS: usize = 64;

/// Labels of the webhook metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    code: String,
    webhook: String,
}

type Durations = Family<RequestLabels, Histogram, fn() -> Histogram>;

fn histogram() -> Histogram {
    Histogram::new(BUCKETS)
}

/// The selected webhooks and what answering them needs.
pub struct WebhookServer {
    webhooks: Vec<Arc<dyn AdmissionWebhook>>,
    ctx: AdmissionContext,
    requests: Family<RequestLabels, Counter>,
    durations: Durations,
}

impl std::fmt::Debug for WebhookServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.webhooks.iter().map(|w| w.name()).collect();
        f.debug_struct("WebhookServer").field("webhooks", &names).finish_non_exhaustive()
    }
}

impl WebhookServer {
    /// Serve `webhooks` (already selected) for a manager described by `ctx`, counting in
    /// `metrics`.
    pub fn new(webhooks: Vec<Arc<dyn AdmissionWebhook>>, ctx: AdmissionContext, metrics: &Metrics) -> Self {
        let requests = metrics.get_or_register(
            "cloud_provider_webhook_request",
            "Number of HTTP requests partitioned by status code.",
            Family::default,
        );
        let durations: Durations = metrics.get_or_register(
            "cloud_provider_webhook_request_duration_seconds",
            "Request latency in seconds. Broken down by status code.",
            || Family::new_with_constructor(histogram as fn() -> Histogram),
        );
        Self { webhooks, ctx, requests, durations }
    }

    /// The largest body any of the webhooks reads.
    pub fn max_body_bytes(&self) -> usize {
        self.webhooks.iter().map(|w| w.max_body_bytes()).max().unwrap_or(0)
    }

    /// The webhooks served, by name.
    pub fn names(&self) -> Vec<String> {
        self.webhooks.iter().map(|w| w.name().to_string()).collect()
    }

    /// Answer one request: 404 for a path no webhook serves, 405 for a method other than
    /// POST, 413 past the webhook's body limit, 400 for a body that is not an AdmissionReview,
    /// 500 when the webhook fails or takes longer than [`ADMIT_TIME_LIMIT`].
    pub async fn answer(&self, request: BodyRequest) -> Answer {
        let path = request.path.split_once('?').map_or(request.path.as_str(), |(p, _)| p);
        let Some(webhook) = self.webhooks.iter().find(|w| w.path() == path) else {
            return Answer::text(StatusCode::NOT_FOUND, "not found\n");
        };
        let started = Instant::now();
        let answer = decide(webhook.as_ref(), &self.ctx, &request).await;
        let labels = RequestLabels { code: answer.status.as_u16().to_string(), webhook: webhook.name().to_string() };
        self.requests.get_or_create(&labels).inc();
        self.durations.get_or_create(&labels).observe(started.elapsed().as_secs_f64());
        answer
    }

    /// This server as the listener's handler.
    pub fn handler(self: Arc<Self>) -> BodyHandler {
        Arc::new(move |request: BodyRequest| {
            let server = self.clone();
            Box::pin(async move { server.answer(request).await })
        })
    }
}

async fn decide(webhook: &dyn AdmissionWebhook, ctx: &AdmissionContext, request: &BodyRequest) -> Answer {
    if request.method != Method::POST {
        return Answer::text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
    }
    if request.body.len() > webhook.max_body_bytes() {
        return Answer::text(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the request body is larger than {} bytes\n", webhook.max_body_bytes()),
        );
    }
    let admission_request = match review::parse(request.content_type.as_deref(), &request.body) {
        Ok(r) => r,
        Err(error) => {
            tracing::info!(webhook = webhook.name(), %error, "refused a request that is not an AdmissionReview");
            return Answer::text(StatusCode::BAD_REQUEST, format!("{error}\n"));
        }
    };
    let decided = tokio::time::timeout(ADMIT_TIME_LIMIT, webhook.admit(ctx, &admission_request)).await;
    let admission = match decided {
        Ok(Ok(admission)) => admission,
        Ok(Err(error)) => {
            tracing::warn!(webhook = webhook.name(), %error, "admission webhook failed");
            return Answer::text(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("error generating admission response: {error}\n"),
            );
        }
        Err(_) => {
            tracing::warn!(webhook = webhook.name(), limit = ?ADMIT_TIME_LIMIT, "admission webhook took too long");
            return Answer::text(StatusCode::INTERNAL_SERVER_ERROR, "the webhook took too long to decide\n");
        }
    };
    if let review::Admission::Denied { message, .. } = &admission {
        tracing::info!(
            webhook = webhook.name(),
            namespace = admission_request.namespace.as_deref().unwrap_or_default(),
            name = admission_request.name.as_deref().unwrap_or_default(),
            operation = %admission_request.operation,
            reason = %message,
            "admission denied"
        );
    }
    Answer {
        status: StatusCode::OK,
        content_type: "application/json",
        body: review::answer(&admission_request.uid, &admission).to_string(),
    }
}

/// Bind the listener of `settings` for `server` (TLS files and options checked here, so a bad
/// file fails at start).
pub async fn bind(settings: &WebhookSettings, server: &WebhookServer) -> Result<Listener, Error> {
    let limits = Limits {
        max_connections: MAX_CONNECTIONS.min(settings.http.limits.max_connections),
        max_body_bytes: server.max_body_bytes(),
        ..settings.http.limits.clone()
    };
    let config = settings.http.clone().with_limits(limits);
    Listener::bind(&config).await
}

/// Serve `server` on `listener` until `shutdown`.
pub async fn serve(listener: Listener, server: WebhookServer, shutdown: CancellationToken) {
    tracing::info!(webhooks = ?server.names(), address = %listener.local_addr(), "serving admission webhooks");
    listener.serve_bodies(Arc::new(server).handler(), shutdown).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::webhook::review::{API_VERSION, Admission, AdmissionRequest};
    use async_trait::async_trait;
    use bytes::Bytes;

    /// Denies every object named "bad"; fails on "boom"; sleeps on "slow".
    struct Picky;

    #[async_trait]
    impl AdmissionWebhook for Picky {
        fn name(&self) -> &str {
            "picky"
        }
        fn path(&self) -> &str {
            "/validate-picky"
        }
        fn max_body_bytes(&self) -> usize {
            4096
        }
        async fn admit(&self, _: &AdmissionContext, request: &AdmissionRequest) -> Result<Admission, String> {
            match request.name.as_deref() {
                Some("bad") => Ok(Admission::denied("bad is a bad name")),
                Some("boom") => Err("the pools could not be read".into()),
                _ => Ok(Admission::allowed()),
            }
        }
    }

    fn request(path: &str, name: &str) -> BodyRequest {
        let body = serde_json::json!({"apiVersion": API_VERSION, "kind": "AdmissionReview",
            "request": {"uid": format!("uid-{name}"), "name": name, "operation": "CREATE"}});
        BodyRequest {
            method: Method::POST,
            path: path.into(),
            content_type: Some("application/json".into()),
            body: Bytes::from(body.to_string()),
        }
    }

    fn server(metrics: &Metrics) -> WebhookServer {
        WebhookServer::new(vec![Arc::new(Picky)], AdmissionContext::default(), metrics)
    }

    #[tokio::test]
    async fn requests_are_dispatched_by_path_and_answered_allowed_or_denied_with_the_reason() {
        let metrics = Metrics::new();
        let s = server(&metrics);
        let ok = s.answer(request("/validate-picky", "good")).await;
        assert_eq!(ok.status, StatusCode::OK);
        let v: serde_json::Value = serde_json::from_str(&ok.body).unwrap();
        assert_eq!((v["response"]["uid"].as_str(), v["response"]["allowed"].as_bool()), (Some("uid-good"), Some(true)));
        let no = s.answer(request("/validate-picky?timeout=10s", "bad")).await;
        let v: serde_json::Value = serde_json::from_str(&no.body).unwrap();
        assert_eq!(v["response"]["allowed"], false);
        assert_eq!(v["response"]["status"]["message"], "bad is a bad name");
        assert_eq!(s.answer(request("/other", "good")).await.status, StatusCode::NOT_FOUND);
        let failed = s.answer(request("/validate-picky", "boom")).await;
        assert_eq!(failed.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(failed.body.contains("pools could not be read"));
        let text = metrics.encode();
        assert!(text.contains(r#"cloud_provider_webhook_request_total{code="200",webhook="picky"} 2"#), "{text}");
        assert!(text.contains(r#"cloud_provider_webhook_request_total{code="500",webhook="picky"} 1"#), "{text}");
        assert!(text.contains("cloud_provider_webhook_request_duration_seconds_bucket"), "{text}");
    }

    #[tokio::test]
    async fn wrong_methods_types_and_oversized_bodies_are_refused_before_the_webhook() {
        let s = server(&Metrics::new());
        let mut get = request("/validate-picky", "good");
        get.method = Method::GET;
        assert_eq!(s.answer(get).await.status, StatusCode::METHOD_NOT_ALLOWED);
        let mut text = request("/validate-picky", "good");
        text.content_type = Some("text/plain".into());
        let a = s.answer(text).await;
        assert_eq!(a.status, StatusCode::BAD_REQUEST);
        assert!(a.body.contains("application/json"), "{}", a.body);
        let mut big = request("/validate-picky", "good");
        big.body = Bytes::from(vec![b' '; 5000]);
        assert_eq!(s.answer(big).await.status, StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(s.max_body_bytes(), 4096);
    }
}
