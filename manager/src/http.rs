//! The health and metrics endpoint (`--bind-address:--secure-port`).
//!
//! | Path | Answer |
//! |---|---|
//! | `/healthz` | 200 `ok` when every check passes, else 500 listing each check |
//! | `/healthz/<check>` | one check: `leaderElection` or a running controller's canonical name |
//! | `/livez` | 200 while the process serves requests; never depends on the API server |
//! | `/readyz` | 200 once the shared caches have synced (standby replicas are ready too) |
//! | `/metrics` | Prometheus text exposition |
//!
//! TLS is used when a certificate and key are given; otherwise plain HTTP (upstream would
//! generate a self-signed certificate). Requests are not authenticated: bind to a private
//! address, or put the port behind a NetworkPolicy.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::{self, ServerConfig};
use tokio_util::sync::CancellationToken;

use crate::Error;
use crate::health::HealthRegistry;
use crate::metrics::Metrics;

/// Upstream's `--secure-port` default for the cloud-controller-manager.
pub const DEFAULT_SECURE_PORT: u16 = 10258;

/// Content type of the metrics exposition (prometheus-client writes OpenMetrics text).
pub const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Where and how to serve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpConfig {
    /// `--bind-address` and `--secure-port` (port 0 picks a free port, for tests).
    pub address: SocketAddr,
    /// `--tls-cert-file` and `--tls-private-key-file`.
    pub tls: Option<TlsFiles>,
}

/// PEM files for TLS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// Certificate chain, leaf first.
    pub cert: PathBuf,
    /// Private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

/// What the endpoints report on.
#[derive(Clone, Debug)]
pub struct HttpState {
    /// `/healthz` checks.
    pub health: HealthRegistry,
    /// `/readyz` checks.
    pub ready: HealthRegistry,
    /// `/metrics`.
    pub metrics: Arc<Metrics>,
}

/// The answer to one request: status, content type and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// HTTP status.
    pub status: StatusCode,
    /// `Content-Type`.
    pub content_type: &'static str,
    /// Body.
    pub body: String,
}

impl Answer {
    fn text(status: StatusCode, body: impl Into<String>) -> Self {
        Self { status, content_type: "text/plain; charset=utf-8", body: body.into() }
    }
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
            if let Err(reason) = state {
                tracing::info!(check = %name, %reason, endpoint = what, "health check failed");
            }
        }
        body.push_str(&format!("{what} check failed\n"));
        Answer::text(StatusCode::INTERNAL_SERVER_ERROR, body)
    } else {
        body.push_str(&format!("{what} check passed\n"));
        Answer::text(StatusCode::OK, body)
    }
}

/// A bound listener, ready to serve.
pub struct Listener {
    tcp: TcpListener,
    tls: Option<TlsAcceptor>,
    address: SocketAddr,
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener").field("address", &self.address).field("tls", &self.tls.is_some()).finish()
    }
}

/// Load a rustls server configuration from PEM files.
pub fn load_tls(files: &TlsFiles) -> Result<ServerConfig, Error> {
    let read =
        |path: &PathBuf| std::fs::read(path).map_err(|source| Error::Io { path: path.display().to_string(), source });
    let cert_pem = read(&files.cert)?;
    let key_pem = read(&files.key)?;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| Error::InvalidFlag { flag: "--tls-cert-file", message: format!("not a PEM certificate: {e}") })?;
    if certs.is_empty() {
        return Err(Error::InvalidFlag { flag: "--tls-cert-file", message: "no certificate in the file".into() });
    }
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|_| Error::InvalidFlag {
        flag: "--tls-private-key-file",
        message: "no PEM private key in the file".into(),
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .and_then(|b| b.with_no_client_auth().with_single_cert(certs, key))
        .map_err(|e| Error::InvalidFlag { flag: "--tls-private-key-file", message: e.to_string() })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

impl Listener {
    /// Bind `config.address`, loading the TLS material first so a bad file fails at start.
    pub async fn bind(config: &HttpConfig) -> Result<Self, Error> {
        let tls = match &config.tls {
            Some(files) => Some(TlsAcceptor::from(Arc::new(load_tls(files)?))),
            None => None,
        };
        let tcp = TcpListener::bind(config.address)
            .await
            .map_err(|e| Error::Serve { address: config.address.to_string(), message: e.to_string() })?;
        let address = tcp
            .local_addr()
            .map_err(|e| Error::Serve { address: config.address.to_string(), message: e.to_string() })?;
        Ok(Self { tcp, tls, address })
    }

    /// The bound address (the real port when port 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.address
    }

    /// Serve until `shutdown` fires; open connections are closed gracefully.
    pub async fn serve(self, state: HttpState, shutdown: CancellationToken) {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        tracing::info!(address = %self.address, scheme, "serving health and metrics");
        loop {
            let (stream, peer) = tokio::select! {
                _ = shutdown.cancelled() => return,
                accepted = self.tcp.accept() => match accepted {
                    Ok(a) => a,
                    Err(error) => {
                        tracing::warn!(%error, "accepting a connection failed");
                        continue;
                    }
                },
            };
            let state = state.clone();
            let shutdown = shutdown.clone();
            let tls = self.tls.clone();
            tokio::spawn(async move {
                match tls {
                    Some(acceptor) => match acceptor.accept(stream).await {
                        Ok(stream) => serve_connection(TokioIo::new(stream), state, shutdown).await,
                        Err(error) => tracing::debug!(%error, %peer, "TLS handshake failed"),
                    },
                    None => serve_connection(TokioIo::new(stream), state, shutdown).await,
                }
            });
        }
    }
}

async fn serve_connection<I>(io: I, state: HttpState, shutdown: CancellationToken)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let service = service_fn(move |req: Request<Incoming>| {
        let state = state.clone();
        async move {
            let path = req.uri().path_and_query().map_or("/", |p| p.as_str());
            let a = answer(&state, req.method(), path);
            let body = if req.method() == Method::HEAD { Bytes::new() } else { Bytes::from(a.body) };
            let response = Response::builder()
                .status(a.status)
                .header(header::CONTENT_TYPE, a.content_type)
                .header(header::CACHE_CONTROL, "no-cache, private")
                .body(Full::new(body))
                .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())));
            Ok::<_, Infallible>(response)
        }
    });
    let conn = http1::Builder::new().serve_connection(io, service);
    tokio::pin!(conn);
    tokio::select! {
        result = conn.as_mut() => {
            if let Err(error) = result {
                tracing::debug!(%error, "connection ended with an error");
            }
        }
        _ = shutdown.cancelled() => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::gauge::Gauge;

    fn state() -> HttpState {
        HttpState { health: HealthRegistry::new(), ready: HealthRegistry::new(), metrics: Arc::new(Metrics::new()) }
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
}
