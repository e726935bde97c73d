//! The `/_test/...` HTTP endpoints (fault injection, request log, stats) and a client for them,
//! so tests and benchmarks can drive a server running in another process.

use std::collections::HashMap;
use std::sync::Arc;

use http::{Method, Request};
use http_body_util::BodyExt;
use hyper::Response;
use hyper::body::Incoming;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::core::Core;
use crate::error::ApiError;
use crate::error::Error;
use crate::faults::{FaultConfig, FaultRule, Faults};
use crate::request_log::{RequestLog, RequestRecord};
use crate::response::{Body, error_response, json_response};
use crate::util::parse_query;

/// Server statistics from `GET /_test/stats`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Stats {
    /// Current global resource version.
    pub resource_version: u64,
    /// Objects stored, all resources.
    pub objects: usize,
    /// Watches open.
    pub open_watches: usize,
    /// Requests logged since start.
    pub requests: u64,
    /// Resident set size of the server process, bytes (Linux).
    pub rss_bytes: Option<u64>,
}

/// Which request log records to return or count.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RequestFilter {
    /// Only this Kubernetes verb.
    pub verb: Option<String>,
    /// Only this field manager.
    pub field_manager: Option<String>,
    /// Only user agents starting with this.
    pub user_agent: Option<String>,
    /// Only writes.
    pub writes_only: bool,
    /// Only records with `seq >= since`.
    pub since: Option<u64>,
}

impl RequestFilter {
    fn from_query(q: &HashMap<String, String>) -> Self {
        RequestFilter {
            verb: q.get("verb").cloned(),
            field_manager: q.get("fieldManager").cloned(),
            user_agent: q.get("userAgent").cloned(),
            writes_only: q.get("writes").is_some_and(|v| v == "true"),
            since: q.get("since").and_then(|s| s.parse().ok()),
        }
    }

    fn to_query(&self) -> String {
        let mut parts = vec![];
        let enc = |s: &str| {
            s.bytes()
                .map(|b| {
                    if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                        (b as char).to_string()
                    } else {
                        format!("%{b:02X}")
                    }
                })
                .collect::<String>()
        };
        if let Some(v) = &self.verb {
            parts.push(format!("verb={}", enc(v)));
        }
        if let Some(v) = &self.field_manager {
            parts.push(format!("fieldManager={}", enc(v)));
        }
        if let Some(v) = &self.user_agent {
            parts.push(format!("userAgent={}", enc(v)));
        }
        if self.writes_only {
            parts.push("writes=true".into());
        }
        if let Some(s) = self.since {
            parts.push(format!("since={s}"));
        }
        parts.join("&")
    }

    /// Whether a record passes the filter.
    pub fn matches(&self, r: &RequestRecord) -> bool {
        self.verb.as_ref().is_none_or(|v| *v == r.verb)
            && self.field_manager.as_ref().is_none_or(|m| r.field_manager.as_ref() == Some(m))
            && self.user_agent.as_ref().is_none_or(|u| r.user_agent.starts_with(u.as_str()))
            && (!self.writes_only || r.is_write())
            && self.since.is_none_or(|s| r.seq >= s)
    }
}

pub(crate) async fn handle(core: &Arc<Core>, req: Request<Incoming>) -> Response<Body> {
    match handle_inner(core, req).await {
        Ok(r) => r,
        Err(e) => error_response(&e),
    }
}

async fn handle_inner(core: &Arc<Core>, req: Request<Incoming>) -> Result<Response<Body>, ApiError> {
    let method = req.method().clone();
    let path = req.uri().path().trim_end_matches('/').to_string();
    let q = parse_query(req.uri().query());
    let body =
        req.into_body().collect().await.map(|c| c.to_bytes()).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let faults = Faults::new(core.clone());
    let log = RequestLog::new(core.clone());
    let ok = || json_response(200, &json!({"ok": true}));
    let parse = |what: &str| ApiError::bad_request(format!("invalid {what}"));
    match (method, path.as_str()) {
        (Method::GET, "/_test/faults") => {
            Ok(json_response(200, &serde_json::to_value(faults.config()).unwrap_or_default()))
        }
        (Method::PUT | Method::POST, "/_test/faults") => {
            let cfg: FaultConfig = serde_json::from_slice(&body).map_err(|_| parse("fault config"))?;
            faults.set_config(cfg);
            Ok(ok())
        }
        (Method::DELETE, "/_test/faults") => {
            faults.clear();
            Ok(ok())
        }
        (Method::POST, "/_test/faults/rules") => {
            let rule: FaultRule = serde_json::from_slice(&body).map_err(|_| parse("fault rule"))?;
            faults.add_rule(rule);
            Ok(ok())
        }
        (Method::POST, "/_test/watches/close") => {
            faults.close_watches();
            Ok(ok())
        }
        (Method::POST, "/_test/compact") => {
            faults.compact_history();
            Ok(ok())
        }
        (Method::GET, "/_test/requests") => {
            let f = RequestFilter::from_query(&q);
            Ok(json_response(200, &serde_json::to_value(log.filter(|r| f.matches(r))).unwrap_or_default()))
        }
        (Method::GET, "/_test/requests/count") => {
            let f = RequestFilter::from_query(&q);
            Ok(json_response(200, &json!({"count": log.count(|r| f.matches(r))})))
        }
        (Method::DELETE, "/_test/requests") => {
            log.clear();
            Ok(ok())
        }
        (Method::GET, "/_test/stats") => {
            Ok(json_response(200, &serde_json::to_value(core.stats()).unwrap_or_default()))
        }
        _ => Err(ApiError::not_found_path()),
    }
}

impl Core {
    pub(crate) fn stats(&self) -> Stats {
        let (resource_version, objects) = {
            let st = self.lock();
            (st.rv, st.object_count())
        };
        Stats {
            resource_version,
            objects,
            open_watches: self.open_watches.load(std::sync::atomic::Ordering::Relaxed),
            requests: self.log.lock().unwrap_or_else(|e| e.into_inner()).next_seq,
            rss_bytes: crate::util::rss_bytes(),
        }
    }
}

/// Drives a test API server's `/_test` endpoints over HTTP (e.g. one started as a process).
#[derive(Clone)]
pub struct RemoteControl {
    client: kube::Client,
}

impl RemoteControl {
    /// Uses `client` (pointing at the test API server) for the control requests.
    pub fn new(client: kube::Client) -> Self {
        RemoteControl { client }
    }

    async fn call(&self, method: Method, path: &str, body: Option<Vec<u8>>) -> Result<String, Error> {
        let mut builder = Request::builder().method(method).uri(path);
        if body.is_some() {
            builder = builder.header(http::header::CONTENT_TYPE, "application/json");
        }
        let req = builder.body(body.unwrap_or_default()).map_err(|e| Error::Control(e.to_string()))?;
        Ok(self.client.request_text(req).await?)
    }

    /// The current fault configuration.
    pub async fn faults(&self) -> Result<FaultConfig, Error> {
        Ok(serde_json::from_str(&self.call(Method::GET, "/_test/faults", None).await?)?)
    }

    /// Replaces the fault configuration.
    pub async fn set_faults(&self, cfg: &FaultConfig) -> Result<(), Error> {
        self.call(Method::PUT, "/_test/faults", Some(serde_json::to_vec(cfg)?)).await.map(drop)
    }

    /// Adds one fault rule.
    pub async fn add_fault_rule(&self, rule: &FaultRule) -> Result<(), Error> {
        self.call(Method::POST, "/_test/faults/rules", Some(serde_json::to_vec(rule)?)).await.map(drop)
    }

    /// Removes all fault rules.
    pub async fn clear_faults(&self) -> Result<(), Error> {
        self.call(Method::DELETE, "/_test/faults", None).await.map(drop)
    }

    /// Ends every open watch.
    pub async fn close_watches(&self) -> Result<(), Error> {
        self.call(Method::POST, "/_test/watches/close", None).await.map(drop)
    }

    /// Drops the event history (re-watching from older versions gets 410 Gone).
    pub async fn compact_history(&self) -> Result<(), Error> {
        self.call(Method::POST, "/_test/compact", None).await.map(drop)
    }

    /// Logged requests passing `filter`.
    pub async fn requests(&self, filter: &RequestFilter) -> Result<Vec<RequestRecord>, Error> {
        let path = format!("/_test/requests?{}", filter.to_query());
        Ok(serde_json::from_str(&self.call(Method::GET, &path, None).await?)?)
    }

    /// Number of logged requests passing `filter`.
    pub async fn count_requests(&self, filter: &RequestFilter) -> Result<usize, Error> {
        let path = format!("/_test/requests/count?{}", filter.to_query());
        let v: serde_json::Value = serde_json::from_str(&self.call(Method::GET, &path, None).await?)?;
        v.get("count")
            .and_then(serde_json::Value::as_u64)
            .map(|c| c as usize)
            .ok_or_else(|| Error::Control("no count".into()))
    }

    /// Clears the request log.
    pub async fn clear_requests(&self) -> Result<(), Error> {
        self.call(Method::DELETE, "/_test/requests", None).await.map(drop)
    }

    /// Server statistics.
    pub async fn stats(&self) -> Result<Stats, Error> {
        Ok(serde_json::from_str(&self.call(Method::GET, "/_test/stats", None).await?)?)
    }
}
