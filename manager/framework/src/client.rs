//! Kubernetes client construction and the client-side rate limit.
//!
//! Every request the controllers send waits on one shared token bucket (`--kube-api-qps`
//! refilled per second, `--kube-api-burst` deep), like client-go's default rate limiter. The
//! limit is a tower layer inside the client, so it also covers watches and the reflectors.
//! Events use a separate client without it: they have their own budget (see
//! [`crate::events`]), and must never delay controller work.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use http::{Request, Response};
use kube::client::{Body, ClientBuilder};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use tokio::time::{Instant, Sleep};
use tower::{BoxError, Layer, Service};

use crate::error::Error;
use crate::safe_yaml;

/// Upstream's `--kube-api-qps` default for the cloud-controller-manager.
pub const DEFAULT_QPS: f32 = 20.0;
/// Upstream's `--kube-api-burst` default for the cloud-controller-manager.
pub const DEFAULT_BURST: u32 = 30;

/// A token bucket shared by every clone of a rate-limited client.
///
/// Callers reserve a token and wait until it is due, so waiters are served in the order they
/// asked and a burst never exceeds `burst` requests.
#[derive(Debug)]
pub struct TokenBucket {
    qps: f64,
    burst: f64,
    state: Mutex<BucketState>,
}

#[derive(Debug)]
struct BucketState {
    /// Tokens available at `at`; negative when reservations are queued.
    tokens: f64,
    at: Instant,
}

impl TokenBucket {
    /// A full bucket. `qps` must be positive; `burst` is at least 1.
    pub fn new(qps: f32, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        Self { qps: f64::from(qps), burst, state: Mutex::new(BucketState { tokens: burst, at: Instant::now() }) }
    }

    /// Take one token; returns how long the caller must wait before using it.
    pub fn reserve(&self) -> Duration {
        self.reserve_at(Instant::now())
    }

    fn reserve_at(&self, now: Instant) -> Duration {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let elapsed = now.saturating_duration_since(st.at).as_secs_f64();
        st.tokens = (st.tokens + elapsed * self.qps).min(self.burst);
        st.at = now;
        st.tokens -= 1.0;
        if st.tokens >= 0.0 { Duration::ZERO } else { Duration::from_secs_f64(-st.tokens / self.qps) }
    }

    /// Wait for a token.
    pub async fn acquire(&self) {
        let wait = self.reserve();
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

/// How long requests waited for the rate limiter, for `rest_client_rate_limiter_duration_seconds`.
pub type WaitObserver = Arc<dyn Fn(Duration) + Send + Sync>;

/// A tower layer that makes every request wait for a token of a shared [`TokenBucket`].
#[derive(Clone)]
pub struct RateLimitLayer {
    bucket: Option<Arc<TokenBucket>>,
    observer: Option<WaitObserver>,
}

impl std::fmt::Debug for RateLimitLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimitLayer").field("bucket", &self.bucket).finish_non_exhaustive()
    }
}

impl RateLimitLayer {
    /// A limit of `qps` requests per second with bursts of `burst`; `qps <= 0` disables it
    /// (upstream: `--kube-api-qps=0` means no limit).
    pub fn new(qps: f32, burst: u32) -> Self {
        let bucket = (qps > 0.0 && qps.is_finite()).then(|| Arc::new(TokenBucket::new(qps, burst)));
        Self { bucket, observer: None }
    }

    /// No limit.
    pub fn disabled() -> Self {
        Self { bucket: None, observer: None }
    }

    /// Report every wait (including zero waits) to `observer`.
    pub fn with_observer(mut self, observer: WaitObserver) -> Self {
        self.observer = Some(observer);
        self
    }

    /// Whether a limit is in force.
    pub fn is_enabled(&self) -> bool {
        self.bucket.is_some()
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimited<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimited {
            inner,
            bucket: self.bucket.clone(),
            observer: self.observer.clone(),
            sleep: None,
            permitted: false,
        }
    }
}

/// The service [`RateLimitLayer`] produces. The wait happens in `poll_ready`, so the kube
/// client's request buffer holds back every later request in order while one waits.
pub struct RateLimited<S> {
    inner: S,
    bucket: Option<Arc<TokenBucket>>,
    observer: Option<WaitObserver>,
    sleep: Option<Pin<Box<Sleep>>>,
    permitted: bool,
}

impl<S, ReqBody> Service<Request<ReqBody>> for RateLimited<S>
where
    S: Service<Request<ReqBody>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        if let Some(bucket) = &self.bucket
            && !self.permitted
        {
            if self.sleep.is_none() {
                let wait = bucket.reserve();
                if let Some(observe) = &self.observer {
                    observe(wait);
                }
                if wait.is_zero() {
                    self.permitted = true;
                } else {
                    self.sleep = Some(Box::pin(tokio::time::sleep(wait)));
                }
            }
            if let Some(sleep) = self.sleep.as_mut() {
                ready!(sleep.as_mut().poll(cx));
                self.sleep = None;
                self.permitted = true;
            }
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        self.permitted = false;
        self.inner.call(req)
    }
}

/// An existing [`Client`] as a tower service, so layers can be put in front of it.
#[derive(Clone)]
pub struct ClientService(pub Client);

impl Service<Request<Body>> for ClientService {
    type Response = Response<Body>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let client = self.0.clone();
        Box::pin(async move { client.send(req).await.map_err(BoxError::from) })
    }
}

/// `client` behind `layer`: for callers (tests, the operator) that already hold a client.
pub fn with_rate_limit(client: &Client, layer: &RateLimitLayer) -> Client {
    if !layer.is_enabled() {
        return client.clone();
    }
    Client::new(layer.layer(ClientService(client.clone())), client.default_namespace().to_string())
}

/// Where to find the API server: upstream's `--kubeconfig` and `--master`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientSource {
    /// `--kubeconfig`: a kubeconfig file path.
    pub kubeconfig: Option<String>,
    /// `--master`: overrides the server address of the kubeconfig.
    pub master: Option<String>,
}

/// How long reading and parsing one kubeconfig file may take (on a blocking thread).
pub const KUBECONFIG_TIME_LIMIT: Duration = Duration::from_secs(10);

/// Load the client configuration: the kubeconfig file when given, else the in-cluster
/// configuration, else the default kubeconfig locations (`$KUBECONFIG`, `~/.kube/config`);
/// then `--master` overrides the server address.
///
/// Every kubeconfig goes through [`read_kubeconfig`] (bounded, off the async runtime), and
/// every error is a path or a fixed description: kubeconfigs hold credentials.
pub async fn load_config(source: &ClientSource) -> Result<Config, Error> {
    let mut config = match &source.kubeconfig {
        Some(path) if !path.is_empty() => {
            let path = std::path::PathBuf::from(path);
            let kubeconfig = read_kubeconfig_bounded(vec![path.clone()]).await?;
            config_from(kubeconfig, &path.display().to_string()).await?
        }
        _ => match Config::incluster() {
            Ok(c) => c,
            Err(_) => {
                let paths = default_kubeconfig_paths().ok_or_else(|| {
                    Error::ClientConfig(
                        "no in-cluster configuration, and no kubeconfig path could be determined (set KUBECONFIG or --kubeconfig)"
                            .into(),
                    )
                })?;
                let shown = paths.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ");
                let kubeconfig = read_kubeconfig_bounded(paths).await.map_err(|e| {
                    Error::ClientConfig(format!("no in-cluster configuration, and the default kubeconfig: {e}"))
                })?;
                config_from(kubeconfig, &shown).await?
            }
        },
    };
    if let Some(master) = source.master.as_deref().filter(|m| !m.is_empty()) {
        // Not quoted: a URL may carry credentials.
        config.cluster_url = master
            .parse()
            .map_err(|_| Error::ClientConfig("--master is not a URL such as https://10.0.0.1:6443".into()))?;
        check_server_url(&config.cluster_url).map_err(|m| Error::ClientConfig(format!("--master: {m}")))?;
    }
    Ok(config)
}

async fn config_from(kubeconfig: Kubeconfig, shown: &str) -> Result<Config, Error> {
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| Error::ClientConfig(format!("kubeconfig {shown}: {}", describe_kubeconfig_error(&e))))?;
    check_server_url(&config.cluster_url).map_err(|m| Error::ClientConfig(format!("kubeconfig {shown}: {m}")))?;
    Ok(config)
}

/// `$KUBECONFIG`'s paths, else `~/.kube/config` (kube's and kubectl's order).
fn default_kubeconfig_paths() -> Option<Vec<std::path::PathBuf>> {
    if let Some(value) = std::env::var_os("KUBECONFIG") {
        let paths: Vec<_> = std::env::split_paths(&value).filter(|p| !p.as_os_str().is_empty()).collect();
        if !paths.is_empty() {
            return Some(paths);
        }
    }
    std::env::home_dir().map(|home| home.join(".kube").join("config")).map(|p| vec![p])
}

/// Whether the server is an `http(s)://host` URL; a fixed message otherwise.
fn check_server_url(url: &http::Uri) -> Result<(), &'static str> {
    match (url.scheme_str(), url.host()) {
        (Some("https" | "http"), Some(host)) if !host.is_empty() => Ok(()),
        _ => Err("the cluster's server is not an https:// or http:// URL with a host"),
    }
}

/// [`read_kubeconfig`] of every path, merged in order, on a blocking thread and within
/// [`KUBECONFIG_TIME_LIMIT`].
async fn read_kubeconfig_bounded(paths: Vec<std::path::PathBuf>) -> Result<Kubeconfig, Error> {
    let task = tokio::task::spawn_blocking(move || {
        paths.iter().try_fold(Kubeconfig::default(), |merged, path| {
            let next = read_kubeconfig(path)?;
            merged.merge(next).map_err(|e| {
                Error::ClientConfig(format!("kubeconfig {}: {}", path.display(), describe_kubeconfig_error(&e)))
            })
        })
    });
    match tokio::time::timeout(KUBECONFIG_TIME_LIMIT, task).await {
        Ok(Ok(result)) => result,
        Ok(Err(_)) => Err(Error::ClientConfig("reading the kubeconfig failed (the reader panicked)".into())),
        Err(_) => Err(Error::ClientConfig(format!(
            "reading the kubeconfig took longer than the limit of {}s",
            KUBECONFIG_TIME_LIMIT.as_secs()
        ))),
    }
}

/// Read a kubeconfig file within [`safe_yaml::KUBECONFIG_LIMITS`] (checked on the bytes
/// before any parser sees them), resolving relative file references against the file's
/// directory as kubectl does. Errors name the file, a field path and the kind of problem,
/// never the file's content (it holds credentials). Blocking: see [`load_config`].
pub fn read_kubeconfig(path: &std::path::Path) -> Result<Kubeconfig, Error> {
    use std::io::Read;
    let limits = safe_yaml::KUBECONFIG_LIMITS;
    let shown = path.display();
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(limits.max_bytes as u64 + 1).read_to_end(&mut bytes))
        .map_err(|e| Error::ClientConfig(format!("reading kubeconfig {shown}: {}", e.kind())))?;
    let text =
        safe_yaml::check(&bytes, &limits).map_err(|e| Error::ClientConfig(format!("kubeconfig {shown}: {e}")))?;
    // kube's parser, on the very bytes just checked; its message may quote the file, so a
    // failure is described by this crate's parser (paths and kinds), or by its kind alone.
    let mut kubeconfig = Kubeconfig::from_yaml(text).map_err(|e| {
        let schema = kubeconfig_schema();
        match safe_yaml::documents_from_slice::<Kubeconfig>(&bytes, &limits, schema) {
            Err(parse) => Error::ClientConfig(format!("kubeconfig {shown}: {parse}")),
            Ok(_) => Error::ClientConfig(format!("kubeconfig {shown}: {}", describe_kubeconfig_error(&e))),
        }
    })?;
    if let Some(dir) = path.parent() {
        absolutize(&mut kubeconfig, dir);
    }
    Ok(kubeconfig)
}

fn kubeconfig_schema() -> &'static safe_yaml::Schema {
    static SCHEMA: std::sync::OnceLock<safe_yaml::Schema> = std::sync::OnceLock::new();
    SCHEMA.get_or_init(|| {
        safe_yaml::Schema::new()
            .with::<Kubeconfig>()
            .with::<kube::config::NamedCluster>()
            .with::<kube::config::Cluster>()
            .with::<kube::config::NamedContext>()
            .with::<kube::config::Context>()
            .with::<kube::config::NamedAuthInfo>()
            .with::<kube::config::AuthInfo>()
            .with::<kube::config::ExecConfig>()
            .with::<kube::config::AuthProviderConfig>()
            .with::<kube::config::NamedExtension>()
            .with::<kube::config::Preferences>()
    })
}

/// Make relative file references absolute against `dir` (what kube's own file reader does):
/// certificate authority, client certificate and key, token file, and an exec command that
/// contains a path separator.
fn absolutize(kubeconfig: &mut Kubeconfig, dir: &std::path::Path) {
    let fix = |file: &mut Option<String>| {
        if let Some(name) = file.as_deref()
            && std::path::Path::new(name).is_relative()
            && let Some(absolute) = dir.join(name).to_str()
        {
            *file = Some(absolute.to_owned());
        }
    };
    for cluster in kubeconfig.clusters.iter_mut().filter_map(|c| c.cluster.as_mut()) {
        fix(&mut cluster.certificate_authority);
    }
    for auth in kubeconfig.auth_infos.iter_mut().filter_map(|a| a.auth_info.as_mut()) {
        fix(&mut auth.client_certificate);
        fix(&mut auth.client_key);
        fix(&mut auth.token_file);
        if let Some(exec) = auth.exec.as_mut()
            && exec.command.as_deref().is_some_and(|c| c.contains(std::path::MAIN_SEPARATOR))
        {
            fix(&mut exec.command);
        }
    }
}

/// A kubeconfig error as fixed text: kube's messages may quote names, URLs or paths from the file.
fn describe_kubeconfig_error(error: &kube::config::KubeconfigError) -> &'static str {
    use kube::config::KubeconfigError as E;
    match error {
        E::CurrentContextNotSet => "no current-context is set",
        E::KindMismatch | E::ApiVersionMismatch => "its documents have different kinds or apiVersions",
        E::LoadContext(_) => "the current context is not defined in the file",
        E::LoadClusterOfContext(_) => "the current context's cluster is not defined in the file",
        E::FindPath => "no kubeconfig path could be determined",
        E::ReadConfig(..) => "the file could not be read",
        E::Parse(_) => "the file is not a valid kubeconfig",
        E::MissingClusterUrl => "the cluster has no server URL",
        E::ParseClusterUrl(_) => "the cluster's server is not a valid URL",
        E::ParseProxyUrl(_) => "the cluster's proxy-url is not a valid URL",
        E::LoadCertificateAuthority(_) => "the certificate authority could not be loaded",
        E::LoadClientCertificate(_) => "the client certificate could not be loaded",
        E::LoadClientKey(_) => "the client key could not be loaded",
        E::ParseCertificates(_) => "a PEM certificate could not be parsed",
    }
}

/// A client-building error as fixed text.
fn describe_client_error(error: &kube::Error) -> &'static str {
    match error {
        kube::Error::Auth(_) => "the kubeconfig's credentials could not be used",
        kube::Error::RustlsTls(_) => "the kubeconfig's TLS settings (certificates or keys) could not be used",
        kube::Error::InferKubeconfig(e) => describe_kubeconfig_error(e),
        kube::Error::InferConfig(_) => "the configuration could not be loaded",
        _ => "the client could not be built from the configuration",
    }
}

/// client-go's switch to turn HTTP/2 off (any non-empty value), honoured the same way.
pub const DISABLE_HTTP2_ENV: &str = "DISABLE_HTTP2";

/// How often an HTTP/2 connection is pinged, idle or not (client-go's `ReadIdleTimeout`).
pub const HTTP2_PING_INTERVAL: Duration = Duration::from_secs(30);
/// How long a ping may go unanswered before the connection is dropped (client-go's `PingTimeout`).
pub const HTTP2_PING_TIMEOUT: Duration = Duration::from_secs(15);

/// Which HTTP version a client offers the API server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HttpVersion {
    /// HTTP/2 where TLS negotiates it (ALPN), else HTTP/1.1: client-go's default.
    Http2,
    /// HTTP/1.1 only: kube's default stack, one connection per request in flight.
    Http1,
}

/// The version to offer: HTTP/1.1 only through a proxy (kube's tunnels are built for it) or
/// when `DISABLE_HTTP2` is set, else HTTP/2.
pub fn http_version(config: &Config, disable_http2: Option<&str>) -> HttpVersion {
    if config.proxy_url.is_some() || disable_http2.is_some_and(|v| !v.is_empty()) {
        HttpVersion::Http1
    } else {
        HttpVersion::Http2
    }
}

/// Build a client from `config` with `layer` in its stack.
///
/// Like client-go, the client offers HTTP/2: short requests share one TLS connection, where
/// kube's HTTP/1.1 stack opens one per request in flight (about 50 KiB of buffers each, 7 MiB
/// at 10,000 Services with 144 requests in flight). Watches keep a connection each (see
/// [`Transport`]). Streams that need an HTTP/1.1 upgrade (exec, attach, port-forward) are not
/// used by the manager or the operator.
pub fn build_client(config: Config, layer: &RateLimitLayer) -> Result<Client, Error> {
    let [client] = build_clients(config, [layer])?;
    Ok(client)
}

/// One client per layer, sharing one HTTP/2 connection for short requests. The manager's controllers and its
/// event writer get one each: the API server then shares its time between their requests by
/// count, where two connections would be served turn about and events would take a third
/// of the writes while load balancers wait.
pub fn build_clients<const N: usize>(config: Config, layers: [&RateLimitLayer; N]) -> Result<[Client; N], Error> {
    let env = std::env::var(DISABLE_HTTP2_ENV).ok();
    let version = http_version(&config, env.as_deref());
    build_clients_offering(config, layers, version)
}

/// [`build_clients`] offering `version`.
fn build_clients_offering<const N: usize>(
    config: Config,
    layers: [&RateLimitLayer; N],
    version: HttpVersion,
) -> Result<[Client; N], Error> {
    // kube's message may quote a certificate or URL from the kubeconfig: kinds only.
    let described = |e: kube::Error| Error::ClientConfig(describe_client_error(&e).into());
    let shared = match version {
        HttpVersion::Http2 => Some(http2_connection(&config).map_err(described)?),
        HttpVersion::Http1 => None,
    };
    let mut clients = Vec::with_capacity(N);
    for layer in layers {
        let builder = match &shared {
            Some(connection) => kube_stack(&config, connection.clone()).map_err(described)?,
            // kube's own stack: a connection pool per client.
            None => ClientBuilder::try_from(config.clone()).map_err(described)?,
        };
        clients.push(if layer.is_enabled() { builder.with_layer(layer).build() } else { builder.build() });
    }
    // Cannot fail: one client was pushed per layer.
    clients.try_into().map_err(|_| Error::ClientConfig("client count".into()))
}

/// The service type of kube's default stack.
type KubeService = tower::util::BoxService<Request<Body>, Response<Box<kube::client::DynBody>>, BoxError>;

/// A hyper pool with kube's connect and I/O timeouts over TLS (or plain HTTP).
type Pool = hyper_util::client::legacy::Client<
    hyper_timeout::TimeoutConnector<hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>>,
    Body,
>;

/// Whether `uri` asks for a watch: a response that stays open for minutes.
pub fn is_watch(uri: &http::Uri) -> bool {
    uri.query().is_some_and(|q| q.split('&').any(|pair| pair == "watch=true" || pair == "watch=1"))
}

/// Short requests share one HTTP/2 connection; watches get HTTP/1.1 connections of their own.
///
/// An HTTP/2 connection carries at most the server's `MaxConcurrentStreams` (250 by default
/// on the Go server), and hyper, unlike Go's transport, waits for a free stream rather than
/// opening a second connection: 100 Embedded engines' watches filled it and their Lease
/// renewals waited until leadership was lost. Watches are few per engine and long-lived, so a
/// connection each costs little; what HTTP/2 saves is a connection per write in flight.
#[derive(Clone)]
struct Transport {
    shared: Pool,
    watches: Pool,
}

impl Service<Request<Body>> for Transport {
    type Response = Response<hyper::body::Incoming>;
    type Error = hyper_util::client::legacy::Error;
    type Future = hyper_util::client::legacy::ResponseFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Both pools accept requests at any time (hyper's legacy client is always ready).
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        if is_watch(req.uri()) { self.watches.request(req) } else { self.shared.request(req) }
    }
}

fn http2_connection(config: &Config) -> Result<Transport, kube::Error> {
    use hyper_util::rt::{TokioExecutor, TokioTimer};

    // Pings find a dead connection that every short request now shares.
    let shared = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .timer(TokioTimer::new())
        .http2_keep_alive_interval(HTTP2_PING_INTERVAL)
        .http2_keep_alive_timeout(HTTP2_PING_TIMEOUT)
        .http2_keep_alive_while_idle(true)
        .build(connector(config, HttpVersion::Http2)?);
    let watches = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .timer(TokioTimer::new())
        .build(connector(config, HttpVersion::Http1)?);
    Ok(Transport { shared, watches })
}

/// A connector offering `version` by ALPN, with kube's TLS settings and timeouts.
fn connector(
    config: &Config,
    version: HttpVersion,
) -> Result<
    hyper_timeout::TimeoutConnector<hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>>,
    kube::Error,
> {
    use hyper_util::client::legacy::connect::HttpConnector;
    use kube::client::ConfigExt;

    let mut http = HttpConnector::new();
    http.enforce_http(false);
    // Streams share the connection, so a small frame must not wait for the server's delayed
    // ACK (Nagle): 40 ms per write cut event writes from 950/s to 250/s. Go sets it too.
    http.set_nodelay(true);
    let tls =
        hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(config.rustls_client_config()?).https_or_http();
    let tls = match config.tls_server_name.as_ref() {
        Some(name) => {
            let name = name
                .clone()
                .try_into()
                .map_err(|e| kube::Error::RustlsTls(kube::client::RustlsTlsError::InvalidServerName(e)))?;
            tls.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name))
        }
        None => tls,
    };
    let tls = match version {
        HttpVersion::Http2 => tls.enable_all_versions().wrap_connector(http),
        HttpVersion::Http1 => tls.enable_http1().wrap_connector(http),
    };
    let mut connector = hyper_timeout::TimeoutConnector::new(tls);
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    connector.set_reset_reader_on_write(config.reset_reader_on_write);
    Ok(connector)
}

/// kube's default stack over `connection`: base URL, retry of 429/503/504, credentials and
/// extra headers.
fn kube_stack(config: &Config, connection: Transport) -> Result<ClientBuilder<KubeService>, kube::Error> {
    use kube::client::retry::RetryPolicy;
    use kube::client::{ConfigExt, DynBody};
    use tower::{ServiceBuilder, ServiceExt};

    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.default_retry.then(|| tower::retry::RetryLayer::new(RetryPolicy::server_retry())))
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(BoxError::from)
        .service(connection)
        .map_response(|res| {
            res.map(|body| Box::new(http_body_util::BodyExt::map_err(body, BoxError::from)) as Box<DynBody>)
        })
        .boxed();
    // kube's `valid_until` (an exec plugin's certificate expiry) is informational and unread here.
    Ok(ClientBuilder::new(service, config.default_namespace.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tower::ServiceExt;

    const TOKEN: &str = "SECRET-TOKEN-12345";

    /// Kubeconfigs with the token in every field, each broken in some way: the YAML, a type,
    /// a reference, a URL, a certificate, a file.
    fn broken_kubeconfigs() -> Vec<String> {
        let t = TOKEN;
        let users = format!("users: [{{name: u, user: {{token: {t}, username: {t}, password: {t}}}}}]\n");
        let contexts = format!("contexts: [{{name: c, context: {{cluster: k, user: u, namespace: {t}}}}}]\n");
        let tail = format!("current-context: c\n{contexts}{users}");
        let cluster = |fields: &str| format!("clusters:\n  - name: k\n    cluster: {{{fields}}}\n{tail}");
        let user = |fields: &str| {
            format!(
                "clusters: [{{name: k, cluster: {{server: \"https://x\"}}}}]\ncurrent-context: c\n{contexts}users: [{{name: u, user: {{{fields}}}}}]\n"
            )
        };
        let mut docs = vec![
            // Not YAML, or not a kubeconfig.
            format!("apiVersion: v1\nkind: Config\n2 | {t}\n"),
            format!("{t}\n  {t}: [\n"),
            format!("clusters: [{{name: \"{t}\n"),
            format!("clusters: {t}\n"),
            format!("{t}: a: b\n"),
            format!("users:\n\t- name: {t}\n"),
            format!("apiVersion: v1\n---\napiVersion: {t}\nkind: {t}\n"),
            format!("kind: Config\n---\nkind: {t}\n"),
            format!("users: {}{t}\n", "[".repeat(200)),
            format!("clusters: *{t}\n"),
            format!("preferences: {{colors: {t}}}\n"),
            // Wrong types in every part.
            cluster(&format!("server: [{t}]")),
            cluster(&format!("server: \"https://x\", insecure-skip-tls-verify: {t}")),
            cluster(&format!("server: \"https://x\", disable-compression: {t}")),
            cluster(&format!("server: \"https://x\", extensions: {t}")),
            user(&format!("exec: {{command: [{t}]}}")),
            user(&format!("exec: {{command: {t}, args: {t}}}")),
            user(&format!("exec: {{command: {t}, env: {t}}}")),
            user(&format!("as-groups: [[{t}]]")),
            user(&format!("as: [{t}]")),
            user(&format!("auth-provider: {{name: {t}, config: [{t}]}}")),
            user(&format!("client-key-data: {{{t}: 1}}")),
            // References that do not resolve.
            format!("current-context: {t}\n{contexts}{users}"),
            format!("clusters: []\ncurrent-context: c\ncontexts: [{{name: c, context: {{cluster: {t}, user: u}}}}]\n"),
            format!("clusters: [{{name: {t}, cluster: {{server: \"https://x\"}}}}]\n{tail}"),
            // Server URLs.
            cluster(&format!("server: \"{t}\"")),
            cluster(&format!("server: \"https://{t} x\"")),
            cluster(&format!("server: \"ftp://{t}\"")),
            cluster(&format!("server: \"ftp://x\", tls-server-name: {t}")),
            cluster(&format!("server: \"https://x\", proxy-url: \"{t} x\"")),
            // Certificates and files.
            cluster(&format!("server: \"https://x\", certificate-authority-data: {t}")),
            cluster(&format!("server: \"https://x\", certificate-authority: /{t}/ca.crt")),
            cluster(&format!("server: \"https://x\", certificate-authority: {t}.crt")),
            user(&format!("client-certificate-data: {t}, client-key-data: {t}")),
            user(&format!("client-certificate: /{t}/c.crt, client-key: /{t}/c.key")),
            user(&format!("tokenFile: /{t}/token")),
        ];
        docs.push("clusters: [{name: k, cluster: {server: \"https://x\"}}]\n".to_string());
        docs
    }

    #[tokio::test]
    async fn kubeconfig_errors_never_quote_the_file() {
        let dir = std::env::temp_dir().join(format!("ccm-kubeconfig-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut accepted = Vec::new();
        for (i, doc) in broken_kubeconfigs().into_iter().enumerate() {
            let path = dir.join(format!("k{i}.yaml"));
            std::fs::write(&path, &doc).unwrap();
            let source = ClientSource { kubeconfig: Some(path.display().to_string()), master: None };
            // Loading, then building the client (certificates are read there).
            let (result, loaded) = match load_config(&source).await {
                Ok(config) => (build_client(config, &RateLimitLayer::disabled()).map(|_| ()), true),
                Err(e) => (Err(e), false),
            };
            let Err(error) = result else {
                accepted.push(doc);
                continue;
            };
            for message in [error.to_string(), format!("{error:?}")] {
                assert!(!message.contains("SECRET"), "kubeconfig {i}:\n{doc}\n=> {message}");
            }
            // Loading names the file; building a client knows only the loaded configuration.
            assert!(loaded || error.to_string().contains(&format!("k{i}.yaml")), "the file is named: {error}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(accepted.is_empty(), "accepted:\n{}", accepted.join("\n"));
    }

    #[tokio::test]
    async fn master_flag_errors_never_quote_the_url() {
        let dir = std::env::temp_dir().join(format!("ccm-kubeconfig-master-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ok.yaml");
        std::fs::write(
            &path,
            "clusters: [{name: k, cluster: {server: \"https://x\"}}]\ncontexts: [{name: c, context: {cluster: k}}]\ncurrent-context: c\n",
        )
        .unwrap();
        let kubeconfig = Some(path.display().to_string());
        for master in [format!("https://{TOKEN} x"), TOKEN.to_string(), format!("ftp://{TOKEN}")] {
            let source = ClientSource { kubeconfig: kubeconfig.clone(), master: Some(master.clone()) };
            let error = load_config(&source).await.expect_err(&master);
            assert!(!format!("{error} {error:?}").contains("SECRET"), "{error}");
        }
        let source = ClientSource { kubeconfig, master: Some("https://10.0.0.1:6443".into()) };
        assert_eq!(load_config(&source).await.unwrap().cluster_url, "https://10.0.0.1:6443/");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn relative_file_references_resolve_against_the_kubeconfig_directory() {
        let dir = std::env::temp_dir().join(format!("ccm-kubeconfig-rel-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("config");
        std::fs::write(
            &path,
            "clusters: [{name: k, cluster: {server: \"https://x\", certificate-authority: ca.crt}}]\nusers: [{name: u, user: {client-key: /abs/c.key, tokenFile: t/token, exec: {command: bin/get-token, apiVersion: client.authentication.k8s.io/v1}}}, {name: v, user: {exec: {command: aws, apiVersion: client.authentication.k8s.io/v1}}}]\n",
        )
        .unwrap();
        let config = read_kubeconfig(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let at = |name: &str| dir.join(name).display().to_string();
        assert_eq!(config.clusters[0].cluster.as_ref().unwrap().certificate_authority, Some(at("ca.crt")));
        let user = config.auth_infos[0].auth_info.as_ref().unwrap();
        assert_eq!(user.client_key.as_deref(), Some("/abs/c.key"));
        assert_eq!(user.token_file, Some(at("t/token")));
        assert_eq!(user.exec.as_ref().unwrap().command, Some(at("bin/get-token")));
        let bare = config.auth_infos[1].auth_info.as_ref().unwrap();
        assert_eq!(bare.exec.as_ref().unwrap().command.as_deref(), Some("aws"), "a bare command is looked up in PATH");
    }

    #[test]
    fn hostile_kubeconfigs_are_refused_with_the_limit_they_break() {
        let path = std::env::temp_dir().join(format!("ccm-kubeconfig-hostile-{}.yaml", std::process::id()));
        for (name, doc, problem) in safe_yaml::hostile::all() {
            std::fs::write(&path, &doc).unwrap();
            let message = read_kubeconfig(&path).unwrap_err().to_string();
            let want = match problem {
                // Kubeconfigs may be larger than cloud-configs.
                safe_yaml::Problem::TooLarge { .. } => {
                    safe_yaml::Problem::TooLarge { limit: safe_yaml::KUBECONFIG_LIMITS.max_bytes }
                }
                other => other,
            };
            assert!(message.contains(&want.to_string()), "{name}: {message}");
        }
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn an_oversized_kubeconfig_is_refused_before_parsing() {
        let path = std::env::temp_dir().join(format!("ccm-kubeconfig-big-{}.yaml", std::process::id()));
        let mut doc = format!("users: [{{name: u, user: {{token: {TOKEN}}}}}]\n");
        doc.push_str(&"# padding\n".repeat(safe_yaml::KUBECONFIG_LIMITS.max_bytes / 10 + 1));
        std::fs::write(&path, &doc).unwrap();
        let message = read_kubeconfig(&path).unwrap_err().to_string();
        std::fs::remove_file(&path).unwrap();
        assert!(message.contains(&format!("limit of {} bytes", safe_yaml::KUBECONFIG_LIMITS.max_bytes)), "{message}");
    }

    #[tokio::test(start_paused = true)]
    async fn bucket_allows_a_burst_then_paces_at_qps() {
        let bucket = TokenBucket::new(10.0, 3);
        let t0 = Instant::now();
        let waits: Vec<Duration> = (0..5).map(|_| bucket.reserve_at(t0)).collect();
        assert_eq!(&waits[..3], &[Duration::ZERO; 3], "the burst is immediate");
        assert_eq!(waits[3], Duration::from_millis(100));
        assert_eq!(waits[4], Duration::from_millis(200), "queued reservations are served in order");
        // After a quiet second the bucket is full again, but never more than the burst.
        let t1 = t0 + Duration::from_secs(10);
        let waits: Vec<Duration> = (0..4).map(|_| bucket.reserve_at(t1)).collect();
        assert_eq!(waits, [Duration::ZERO, Duration::ZERO, Duration::ZERO, Duration::from_millis(100)]);
    }

    #[derive(Clone)]
    struct Counting(Arc<AtomicUsize>);

    impl Service<Request<()>> for Counting {
        type Response = ();
        type Error = BoxError;
        type Future = std::future::Ready<Result<(), BoxError>>;
        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
            Poll::Ready(Ok(()))
        }
        fn call(&mut self, _: Request<()>) -> Self::Future {
            self.0.fetch_add(1, Ordering::SeqCst);
            std::future::ready(Ok(()))
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_layer_holds_requests_beyond_the_burst() {
        let count = Arc::new(AtomicUsize::new(0));
        let layer = RateLimitLayer::new(5.0, 2);
        let mut svc = layer.layer(Counting(count.clone()));
        let start = Instant::now();
        for _ in 0..4 {
            svc.ready().await.unwrap().call(Request::new(())).await.unwrap();
        }
        assert_eq!(count.load(Ordering::SeqCst), 4);
        // Two immediate, then one every 200ms.
        assert_eq!(start.elapsed(), Duration::from_millis(400));
    }

    #[tokio::test(start_paused = true)]
    async fn clones_of_a_layer_share_one_budget() {
        let count = Arc::new(AtomicUsize::new(0));
        let layer = RateLimitLayer::new(1.0, 1);
        let mut a = layer.layer(Counting(count.clone()));
        let mut b = layer.layer(Counting(count.clone()));
        let start = Instant::now();
        a.ready().await.unwrap().call(Request::new(())).await.unwrap();
        b.ready().await.unwrap().call(Request::new(())).await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_secs(1));
    }

    #[tokio::test(start_paused = true)]
    async fn zero_qps_disables_the_limit() {
        let layer = RateLimitLayer::new(0.0, 0);
        assert!(!layer.is_enabled());
        let count = Arc::new(AtomicUsize::new(0));
        let mut svc = layer.layer(Counting(count.clone()));
        let start = Instant::now();
        for _ in 0..100 {
            svc.ready().await.unwrap().call(Request::new(())).await.unwrap();
        }
        assert_eq!(start.elapsed(), Duration::ZERO);
        assert_eq!(count.load(Ordering::SeqCst), 100);
    }

    #[tokio::test(start_paused = true)]
    async fn waits_are_reported_to_the_observer() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = seen.clone();
        let layer = RateLimitLayer::new(2.0, 1).with_observer(Arc::new(move |d| record.lock().unwrap().push(d)));
        let mut svc = layer.layer(Counting(Arc::new(AtomicUsize::new(0))));
        for _ in 0..2 {
            svc.ready().await.unwrap().call(Request::new(())).await.unwrap();
        }
        assert_eq!(*seen.lock().unwrap(), [Duration::ZERO, Duration::from_millis(500)]);
    }

    #[test]
    fn http2_is_offered_unless_disable_http2_is_set_or_a_proxy_is_configured() {
        let direct = Config::new("https://127.0.0.1:6443".parse().unwrap());
        assert_eq!(http_version(&direct, None), HttpVersion::Http2);
        assert_eq!(http_version(&direct, Some("")), HttpVersion::Http2);
        assert_eq!(http_version(&direct, Some("true")), HttpVersion::Http1);
        let mut proxied = direct.clone();
        proxied.proxy_url = Some("http://proxy.test:3128".parse().unwrap());
        assert_eq!(http_version(&proxied, None), HttpVersion::Http1);
    }

    /// A TLS server on loopback offering `h2` (at most `max_streams` per connection) and
    /// `http/1.1`. It answers every request, after 100 ms so requests overlap, with the HTTP
    /// version it saw; a watch (`watch=true`) it holds open for a minute.
    struct AlpnServer {
        url: String,
        ca: Vec<u8>,
        /// Connections accepted.
        accepted: Arc<AtomicUsize>,
        /// Each request's path and query and its HTTP version, as they arrive.
        seen: Arc<Mutex<Vec<(String, String)>>>,
    }

    async fn alpn_server(max_streams: u32) -> AlpnServer {
        use hyper::server::conn::{http1, http2};
        use hyper_util::rt::{TokioExecutor, TokioIo};
        use tokio_rustls::rustls;

        let made = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
        let ca = made.cert.der().to_vec();
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(made.signing_key.serialize_der().into());
        let mut tls = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![made.cert.der().clone()], key)
            .unwrap();
        tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("https://{}", listener.local_addr().unwrap());
        let accepted = Arc::new(AtomicUsize::new(0));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (count, log) = (accepted.clone(), seen.clone());
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                let (acceptor, log) = (acceptor.clone(), log.clone());
                tokio::spawn(async move {
                    let Ok(stream) = acceptor.accept(tcp).await else { return };
                    let h2 = stream.get_ref().1.alpn_protocol() == Some(b"h2");
                    let answer = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                        let version = format!("{:?}", req.version());
                        let target = req.uri().path_and_query().map(|p| p.to_string()).unwrap_or_default();
                        let hold = if is_watch(req.uri()) { 60_000 } else { 100 };
                        log.lock().unwrap().push((target, version.clone()));
                        async move {
                            tokio::time::sleep(Duration::from_millis(hold)).await;
                            let body = http_body_util::Full::new(bytes::Bytes::from(version));
                            Ok::<_, std::convert::Infallible>(Response::new(body))
                        }
                    });
                    let io = TokioIo::new(stream);
                    let _ = if h2 {
                        http2::Builder::new(TokioExecutor::new())
                            .max_concurrent_streams(max_streams)
                            .serve_connection(io, answer)
                            .await
                    } else {
                        http1::Builder::new().serve_connection(io, answer).await
                    };
                });
            }
        });
        AlpnServer { url, ca, accepted, seen }
    }

    impl AlpnServer {
        fn config(&self) -> Config {
            let mut config = Config::new(self.url.parse().unwrap());
            config.root_cert = Some(vec![self.ca.clone()]);
            config
        }
    }

    /// Sends 20 overlapping requests through two clients (a rate-limited one and an unlimited
    /// one, like the manager's) offering `version`; returns the versions the server saw and how
    /// many connections it accepted.
    async fn twenty_overlapping_requests(version: HttpVersion) -> (Vec<String>, usize) {
        let server = alpn_server(250).await;
        let limited = RateLimitLayer::new(1000.0, 100);
        let clients =
            build_clients_offering(server.config(), [&limited, &RateLimitLayer::disabled()], version).unwrap();
        // Until ALPN has answered, overlapping requests each start a connection (hyper keeps
        // the first HTTP/2 one); one request first, as the manager's first lists are.
        clients[0].request_text(Request::get("/version").body(Vec::new()).unwrap()).await.unwrap();
        let requests = (0..20).map(|i| {
            let client = clients[i % 2].clone();
            async move { client.request_text(Request::get("/version").body(Vec::new()).unwrap()).await.unwrap() }
        });
        let seen = futures::future::join_all(requests).await;
        (seen, server.accepted.load(Ordering::SeqCst))
    }

    #[tokio::test]
    async fn overlapping_requests_of_both_clients_share_one_http2_connection_where_tls_negotiates_it() {
        let (seen, connections) = twenty_overlapping_requests(HttpVersion::Http2).await;
        assert!(seen.iter().all(|v| v == "HTTP/2.0"), "{seen:?}");
        assert_eq!(connections, 1);
    }

    #[tokio::test]
    async fn with_http2_disabled_each_request_in_flight_opens_an_http1_connection() {
        let (seen, connections) = twenty_overlapping_requests(HttpVersion::Http1).await;
        assert!(seen.iter().all(|v| v == "HTTP/1.1"), "{seen:?}");
        assert!(connections > 1, "{connections}");
    }

    #[test]
    fn only_watch_requests_count_as_watches() {
        let watch = |uri: &str| is_watch(&uri.parse().unwrap());
        assert!(watch("https://h/api/v1/nodes?watch=true&resourceVersion=1"));
        assert!(watch("/api/v1/services?labelSelector=a&watch=1"));
        assert!(!watch("/api/v1/nodes"));
        assert!(!watch("/api/v1/nodes?watch=false"));
        assert!(!watch("/api/v1/nodes?labelSelector=watch%3Dtrue"));
        assert!(!watch("/api/v1/namespaces/watch/services?rewatch=true"));
    }

    #[tokio::test]
    async fn open_watches_never_hold_the_streams_short_requests_need() {
        // The server allows 2 streams per HTTP/2 connection; 4 watches stay open.
        let server = alpn_server(2).await;
        let [client] =
            build_clients_offering(server.config(), [&RateLimitLayer::disabled()], HttpVersion::Http2).unwrap();
        // The connection is up and the client has the server's stream limit.
        client.request_text(Request::get("/version").body(Vec::new()).unwrap()).await.unwrap();
        let watches: Vec<_> = (0..4)
            .map(|i| {
                let client = client.clone();
                let get = Request::get(format!("/api/v1/nodes?watch=true&n={i}")).body(Vec::new()).unwrap();
                tokio::spawn(async move { client.request_text(get).await })
            })
            .collect();
        let watching = || server.seen.lock().unwrap().iter().filter(|(t, _)| t.contains("watch=true")).count();
        for _ in 0..200 {
            if watching() == 4 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        assert_eq!(watching(), 4, "every watch reached the server");
        // Five short requests at once; before watches had their own connections they waited
        // behind the watches for a free stream and this timed out.
        let requests = (0..5).map(|_| client.request_text(Request::get("/version").body(Vec::new()).unwrap()));
        let answers = tokio::time::timeout(Duration::from_secs(30), futures::future::join_all(requests))
            .await
            .expect("short requests were starved of streams");
        assert!(answers.iter().all(|a| a.as_deref().ok() == Some("HTTP/2.0")), "{answers:?}");
        let seen = server.seen.lock().unwrap().clone();
        assert!(seen.iter().filter(|(t, _)| t.contains("watch=true")).all(|(_, v)| v == "HTTP/1.1"), "{seen:?}");
        // One connection per watch and one shared by the short requests.
        assert_eq!(server.accepted.load(Ordering::SeqCst), 5);
        watches.iter().for_each(|w| w.abort());
    }
}
