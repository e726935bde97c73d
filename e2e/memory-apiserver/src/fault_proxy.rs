//! A fault-injecting proxy in front of another API server (the test kit puts it in front of a
//! genuine kube-apiserver): this server's fault rules (error rates, 429s with Retry-After,
//! latency, closing watches) for scenarios that run on both backends.
//!
//! Clients speak plain HTTP to the proxy on loopback; the proxy forwards with the client it was
//! given (a genuine server's client-certificate authentication cannot pass through a proxy that
//! reads requests). Scenarios that check authorization use the genuine server directly.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::StreamExt;
use http::{Method, Response, header};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::debug;

use crate::error::ApiError;
use crate::error::Error;
use crate::faults::{FaultConfig, FaultTarget, Faults};
use crate::response::{Body, error_response};
use crate::server::kube_verb;

/// The fault state of a proxy: the same knobs as the local server's.
pub(crate) struct ProxyFaults {
    pub config: Mutex<FaultConfig>,
    pub watch_close: watch::Sender<u64>,
    pub open_watches: AtomicUsize,
    pub close_every: Mutex<Option<JoinHandle<()>>>,
    pub runtime: tokio::runtime::Handle,
}

impl ProxyFaults {
    pub fn new() -> ProxyFaults {
        ProxyFaults {
            config: Mutex::new(FaultConfig::default()),
            watch_close: watch::channel(0).0,
            open_watches: AtomicUsize::new(0),
            close_every: Mutex::new(None),
            runtime: tokio::runtime::Handle::current(),
        }
    }

    pub fn close_watches(&self) {
        self.watch_close.send_modify(|g| *g += 1);
    }
}

impl FaultTarget for ProxyFaults {
    fn config(&self) -> &Mutex<FaultConfig> {
        &self.config
    }

    fn close_watches(&self) {
        ProxyFaults::close_watches(self);
    }

    fn open_watches(&self) -> usize {
        self.open_watches.load(Ordering::Relaxed)
    }

    fn close_every(&self) -> &Mutex<Option<JoinHandle<()>>> {
        &self.close_every
    }

    fn runtime(&self) -> tokio::runtime::Handle {
        self.runtime.clone()
    }

    fn compact_history(&self) -> bool {
        false
    }
}

/// A running proxy; stops when dropped.
pub struct FaultProxy {
    url: String,
    state: Arc<ProxyFaults>,
    task: JoinHandle<()>,
}

/// Verb of a Kubernetes API path, as the API server names it (`get`, `list`, `watch`, ...).
fn verb(method: &Method, path: &str, query: &str) -> &'static str {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let rest: &[&str] = match segments.as_slice() {
        ["api", _version, rest @ ..] => rest,
        ["apis", _group, _version, rest @ ..] => rest,
        _ => return "unknown",
    };
    let rest = match rest {
        ["namespaces", _ns, tail @ ..] if !tail.is_empty() => tail,
        other => other,
    };
    let named = rest.len() >= 2;
    let watch = query.split('&').any(|kv| kv == "watch=true" || kv == "watch=1");
    kube_verb(method, named, watch)
}

impl FaultProxy {
    /// Listens on a free loopback port and forwards to the server `upstream` talks to.
    pub async fn start(upstream: kube::Client) -> Result<FaultProxy, Error> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let state = Arc::new(ProxyFaults::new());
        let serving = state.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let (state, upstream) = (serving.clone(), upstream.clone());
                tokio::spawn(async move {
                    let svc = service_fn(move |req| handle(state.clone(), upstream.clone(), req));
                    if let Err(e) = http1::Builder::new().serve_connection(TokioIo::new(stream), svc).await {
                        debug!(error = %e, "proxy connection ended with an error");
                    }
                });
            }
        });
        Ok(FaultProxy { url, state, task })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The proxy's fault injection.
    pub fn faults(&self) -> Faults {
        Faults::new(self.state.clone())
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
        self.state.close_watches();
    }
}

async fn handle(
    state: Arc<ProxyFaults>,
    upstream: kube::Client,
    req: hyper::Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    let verb = verb(req.method(), &path, &query);
    let (latency, fault) = state.config.lock().unwrap_or_else(|e| e.into_inner()).decide(&path, verb);
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    if let Some(e) = fault {
        return Ok(error_response(&e));
    }
    match forward(&state, &upstream, req, verb == "watch").await {
        Ok(r) => Ok(r),
        Err(message) => Ok(error_response(&ApiError::internal(format!("fault proxy: {message}")))),
    }
}

async fn forward(
    state: &Arc<ProxyFaults>,
    upstream: &kube::Client,
    req: hyper::Request<Incoming>,
    watch: bool,
) -> Result<Response<Body>, String> {
    let (parts, body) = req.into_parts();
    let body = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
    let mut out =
        http::Request::builder().method(parts.method).uri(parts.uri.path_and_query().map_or("/", |p| p.as_str()));
    for name in [header::CONTENT_TYPE, header::ACCEPT, header::USER_AGENT] {
        if let Some(v) = parts.headers.get(&name) {
            out = out.header(name, v);
        }
    }
    let out = out.body(kube::client::Body::from(body.to_vec())).map_err(|e| e.to_string())?;
    let answer = upstream.send(out).await.map_err(|e| e.to_string())?;
    let (parts, body) = answer.into_parts();
    // kube's body is not `Sync`, which the server's body type needs: relay it through a channel.
    // A broken upstream stream ends ours; the client re-watches or retries.
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Bytes>(16);
    let mut frames = body.into_data_stream();
    let mut closer = state.watch_close.subscribe();
    let count = watch.then(|| WatchCount::new(state.clone()));
    tokio::spawn(async move {
        let _count = count;
        loop {
            tokio::select! {
                chunk = frames.next() => match chunk {
                    Some(Ok(bytes)) => {
                        if tx.send(bytes).await.is_err() {
                            return;
                        }
                    }
                    _ => return,
                },
                // Watches end when the test closes them, as the local server's do.
                _ = closer.changed(), if watch => return,
            }
        }
    });
    let stream = futures::stream::poll_fn(move |cx| rx.poll_recv(cx).map(|o| o.map(|b| Ok(Frame::data(b)))));
    let body: Body = BoxBody::new(StreamBody::new(stream));
    Ok(Response::from_parts(parts, body))
}

/// Counts an open watch for as long as it lives.
struct WatchCount(Arc<ProxyFaults>);

impl WatchCount {
    fn new(state: Arc<ProxyFaults>) -> WatchCount {
        state.open_watches.fetch_add(1, Ordering::Relaxed);
        WatchCount(state)
    }
}

impl Drop for WatchCount {
    fn drop(&mut self) {
        self.0.open_watches.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verbs_follow_the_api_servers_naming() {
        assert_eq!(verb(&Method::GET, "/api/v1/nodes", ""), "list");
        assert_eq!(verb(&Method::GET, "/api/v1/nodes", "watch=true&resourceVersion=5"), "watch");
        assert_eq!(verb(&Method::GET, "/api/v1/nodes/n1", ""), "get");
        assert_eq!(verb(&Method::DELETE, "/api/v1/nodes/stuck", ""), "delete");
        assert_eq!(verb(&Method::PATCH, "/api/v1/namespaces/ns/services/web/status", ""), "patch");
        assert_eq!(verb(&Method::GET, "/api/v1/namespaces/ns/services", ""), "list");
        assert_eq!(verb(&Method::GET, "/api/v1/namespaces/ns", ""), "get");
        assert_eq!(verb(&Method::GET, "/apis/apps/v1/namespaces/ns/deployments", ""), "list");
        assert_eq!(verb(&Method::DELETE, "/apis/apps/v1/namespaces/ns/deployments", ""), "deletecollection");
        assert_eq!(
            verb(&Method::PATCH, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/x.ccm.rs", ""),
            "patch"
        );
    }
}
