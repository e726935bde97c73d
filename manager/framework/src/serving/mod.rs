//! The endpoint server shared by the manager (`--secure-port`) and the operator: HTTPS (a
//! self-signed certificate unless one is given), delegated authentication and authorization
//! ([`auth`]), and limits that keep it answering under load.
//!
//! Resilience, in order of a connection's life:
//! - at most [`Limits::max_connections`] open at once (lowered to leave descriptors for the
//!   rest of the process); when full, the connection idle the longest is closed to make room,
//!   else the request waiting longest for its token or access review, and a new one is closed
//!   at once only when every slot is answering an allowed request. Requests with made-up tokens
//!   therefore never keep the kubelet's probes out, and wait at most
//!   [`auth::AuthSettings::review_queue_timeout`] for a review slot (then 429);
//! - `accept` errors pause the loop (10 ms doubling to 1 s) and are logged at most once per
//!   [`Limits::warn_every`]; running out of descriptors also lowers the limit and closes idle
//!   connections, so the process gets descriptors back; each quiet
//!   [`Limits::limit_recovery_every`] then raises the limit back towards its ceiling;
//! - the TLS handshake, the request head, and idleness between requests each have a timeout.
//!
//! Certificate files are re-read every [`Limits::tls_reload_every`]; a changed, usable pair
//! serves new connections, an unusable one keeps the previous pair and is logged once.
//!
//! Pure decisions live in [`logic`].

pub mod auth;
pub mod logic;
pub mod probe;
pub mod tls;

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use crate::client::{self, ClientSource, RateLimitLayer};
use crate::error::Error;

pub use auth::{AuthConfig, AuthSettings, Gatekeeper, KubeReviews, Reviews, TokenOutcome};
pub use logic::{Activity, Gate, UserInfo};
pub use tls::{MinVersion, Tls, TlsFiles, TlsFlagNames, TlsOptions, load_tls};

/// Limits and timeouts of the endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Most connections open at once (further lowered by the open-file limit).
    pub max_connections: usize,
    /// Time a client has to complete the TLS handshake.
    pub tls_handshake_timeout: Duration,
    /// Time a client has to send a request's head, from when the server starts reading it.
    pub header_read_timeout: Duration,
    /// A connection with no request in progress for this long is closed.
    pub idle_timeout: Duration,
    /// First pause after a failed `accept`; it doubles up to `accept_backoff_max`.
    pub accept_backoff_first: Duration,
    /// Longest pause after failed `accept`s.
    pub accept_backoff_max: Duration,
    /// At most one "accepting a connection failed" warning per this period.
    pub warn_every: Duration,
    /// After descriptor exhaustion lowered the connection limit, each period without another
    /// one raises it back by a step, up to the limit the server started with.
    pub limit_recovery_every: Duration,
    /// How often certificate files ([`Tls::Files`]) are checked for a new pair.
    pub tls_reload_every: Duration,
    /// Largest request body read by a [`BodyHandler`] (larger: 413); a [`Handler`] reads none.
    pub max_body_bytes: usize,
    /// Time a client has to send a request's body once its head is read.
    pub body_read_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 128,
            tls_handshake_timeout: Duration::from_secs(10),
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            accept_backoff_first: Duration::from_millis(10),
            accept_backoff_max: Duration::from_secs(1),
            warn_every: Duration::from_secs(10),
            limit_recovery_every: Duration::from_secs(10),
            tls_reload_every: Duration::from_secs(5),
            max_body_bytes: 0,
            body_read_timeout: Duration::from_secs(10),
        }
    }
}

/// Where and how to serve.
#[derive(Debug, Clone)]
pub struct HttpConfig {
    /// `--bind-address` and `--secure-port` (port 0 picks a free port, for tests).
    pub address: SocketAddr,
    /// HTTPS with a generated or given certificate, or plain HTTP.
    pub tls: Tls,
    /// `--tls-min-version`, `--tls-cipher-suites` and `--tls-curve-preferences`.
    pub tls_options: TlsOptions,
    /// Delegated authentication and authorization; `None` serves every path to anyone (tests,
    /// embedding behind an authenticating proxy).
    pub auth: Option<AuthConfig>,
    /// Connection limit and timeouts.
    pub limits: Limits,
}

impl HttpConfig {
    /// HTTPS with a self-signed certificate, no authentication, default limits.
    pub fn new(address: SocketAddr) -> Self {
        Self {
            address,
            tls: Tls::SelfSigned,
            tls_options: TlsOptions::default(),
            auth: None,
            limits: Limits::default(),
        }
    }

    /// Plain HTTP, no authentication: for tests.
    pub fn plain(address: SocketAddr) -> Self {
        Self { tls: Tls::Plain, ..Self::new(address) }
    }

    /// Use this TLS setting.
    pub fn with_tls(mut self, tls: Tls) -> Self {
        self.tls = tls;
        self
    }

    /// Offer these TLS versions, cipher suites and key-exchange groups.
    pub fn with_tls_options(mut self, options: TlsOptions) -> Self {
        self.tls_options = options;
        self
    }

    /// Require delegated authentication and authorization.
    pub fn with_auth(mut self, auth: AuthConfig) -> Self {
        self.auth = Some(auth);
        self
    }

    /// Use these limits.
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// Give the delegated auth its API clients when it has no reviewer yet: clients from
    /// `--authentication-kubeconfig` / `--authorization-kubeconfig` when set, else from
    /// `default` (the process's own client configuration). Reviews are not rate-limited by
    /// `--kube-api-qps`; they are bounded by the cache and by the reviews-in-flight limit.
    pub async fn resolve_auth(mut self, default: &kube::Config) -> Result<Self, Error> {
        if let Some(auth) = self.auth.as_mut()
            && auth.reviews.is_none()
        {
            let authentication = review_client(auth.authentication_kubeconfig.as_deref(), default).await?;
            let authorization = review_client(auth.authorization_kubeconfig.as_deref(), default).await?;
            auth.reviews = Some(Arc::new(KubeReviews::new(authentication, authorization)));
        }
        Ok(self)
    }
}

async fn review_client(kubeconfig: Option<&str>, default: &kube::Config) -> Result<kube::Client, Error> {
    let config = match kubeconfig.filter(|p| !p.is_empty()) {
        Some(path) => client::load_config(&ClientSource { kubeconfig: Some(path.to_string()), master: None }).await?,
        None => default.clone(),
    };
    client::build_client(config, &RateLimitLayer::disabled())
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
    /// A `text/plain` answer.
    pub fn text(status: StatusCode, body: impl Into<String>) -> Self {
        Self { status, content_type: "text/plain; charset=utf-8", body: body.into() }
    }
}

/// What answers an authorized request: method and path with query string.
pub type Handler = Arc<dyn Fn(&Method, &str) -> Answer + Send + Sync>;

/// A request whose body was read (at most [`Limits::max_body_bytes`]).
#[derive(Debug, Clone)]
pub struct BodyRequest {
    /// The method.
    pub method: Method,
    /// The path with its query string.
    pub path: String,
    /// The `Content-Type` header, if any.
    pub content_type: Option<String>,
    /// The body.
    pub body: Bytes,
}

/// What answers an authorized request together with its body (the webhook server).
pub type BodyHandler = Arc<dyn Fn(BodyRequest) -> futures::future::BoxFuture<'static, Answer> + Send + Sync>;

/// How a server answers: from the head alone, or with the body read first.
#[derive(Clone)]
enum Responder {
    Head(Handler),
    Body(BodyHandler),
}

/// Counters of the server, for tests and diagnostics.
#[derive(Debug, Default)]
pub struct ServerStats {
    /// Connections accepted.
    pub accepted: AtomicU64,
    /// Connections closed at once because every slot was answering a request.
    pub rejected: AtomicU64,
    /// Idle connections closed to make room.
    pub evicted: AtomicU64,
    /// Failed `accept` calls.
    pub accept_errors: AtomicU64,
    /// "accepting a connection failed" warnings logged.
    pub accept_warnings: AtomicU64,
    /// Connections open now.
    pub open: AtomicUsize,
    /// The connection limit now.
    pub limit: AtomicUsize,
    /// Times the connection limit was raised back after exhaustion.
    pub limit_raised: AtomicU64,
    /// Certificate pairs re-read from changed files and served.
    pub tls_reloads: AtomicU64,
    /// Changed certificate files found unusable (each distinct content counted once).
    pub tls_reload_failures: AtomicU64,
}

impl ServerStats {
    fn add(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// One open connection: closed through `cancel`.
#[derive(Debug)]
struct Slot {
    cancel: CancellationToken,
    activity: Mutex<Activity>,
}

impl Slot {
    fn activity(&self) -> Activity {
        *self.activity.lock().unwrap_or_else(|e| e.into_inner())
    }
    fn set(&self, activity: Activity) {
        *self.activity.lock().unwrap_or_else(|e| e.into_inner()) = activity;
    }
    fn idle_since(&self) -> Option<Instant> {
        match self.activity() {
            Activity::Idle(since) => Some(since),
            Activity::Reviewing(_) | Activity::Serving => None,
        }
    }
}

/// Marks a slot in use for the life of a request, idle again after it.
struct InUse(Arc<Slot>);

impl InUse {
    fn new(slot: Arc<Slot>, activity: Activity) -> Self {
        slot.set(activity);
        Self(slot)
    }
}

impl Drop for InUse {
    fn drop(&mut self) {
        self.0.set(Activity::Idle(Instant::now()));
    }
}

/// The open connections.
#[derive(Debug)]
struct Table {
    slots: Mutex<HashMap<u64, Arc<Slot>>>,
    next: AtomicU64,
    stats: Arc<ServerStats>,
    /// Set by an exhaustion, cleared by the next recovery tick.
    exhausted: AtomicBool,
}

impl Table {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Slot>>> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn limit(&self) -> usize {
        self.stats.limit.load(Ordering::Relaxed)
    }

    /// A slot for a new connection, closing the longest-idle one when full; `None` when every
    /// slot is busy.
    fn admit(self: &Arc<Self>) -> Option<SlotGuard> {
        let mut slots = self.lock();
        while slots.len() >= self.limit() {
            let victim = logic::eviction_victim(slots.iter().map(|(id, s)| (*id, s.activity())))?;
            if let Some(s) = slots.remove(&victim) {
                s.cancel.cancel();
                ServerStats::add(&self.stats.evicted);
            }
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let slot =
            Arc::new(Slot { cancel: CancellationToken::new(), activity: Mutex::new(Activity::Idle(Instant::now())) });
        slots.insert(id, slot.clone());
        self.stats.open.store(slots.len(), Ordering::Relaxed);
        Some(SlotGuard { table: self.clone(), id, slot })
    }

    /// Out of descriptors: lower the limit and close idle connections down to it.
    fn on_exhaustion(&self) {
        self.exhausted.store(true, Ordering::Relaxed);
        let mut slots = self.lock();
        let limit = logic::limit_after_exhaustion(self.limit(), slots.len());
        if limit < self.limit() {
            tracing::warn!(limit, "out of file descriptors: lowering the endpoint's connection limit");
            self.stats.limit.store(limit, Ordering::Relaxed);
        }
        // At least one, so the next accept can succeed.
        let mut closed = 0;
        while slots.len() > limit || closed == 0 {
            let Some(victim) = logic::eviction_victim(slots.iter().map(|(id, s)| (*id, s.activity()))) else {
                break;
            };
            if let Some(s) = slots.remove(&victim) {
                s.cancel.cancel();
                ServerStats::add(&self.stats.evicted);
            }
            closed += 1;
        }
        self.stats.open.store(slots.len(), Ordering::Relaxed);
    }

    /// A recovery tick: with no exhaustion since the last one, raise the limit a step back
    /// towards `ceiling`.
    fn on_recovery_tick(&self, ceiling: usize) {
        if self.exhausted.swap(false, Ordering::Relaxed) {
            return;
        }
        let current = self.limit();
        let raised = logic::limit_after_quiet_period(current, ceiling);
        if raised > current {
            self.stats.limit.store(raised, Ordering::Relaxed);
            ServerStats::add(&self.stats.limit_raised);
            tracing::info!(
                limit = raised,
                ceiling,
                "no descriptor exhaustion lately: raising the endpoint's connection limit"
            );
        }
    }
}

/// Removes its slot when the connection task ends.
struct SlotGuard {
    table: Arc<Table>,
    id: u64,
    slot: Arc<Slot>,
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        let mut slots = self.table.lock();
        slots.remove(&self.id);
        self.table.stats.open.store(slots.len(), Ordering::Relaxed);
    }
}

/// A bound listener, ready to serve.
pub struct Listener {
    tcp: TcpListener,
    tls: Option<TlsAcceptor>,
    reloader: Option<Arc<tls::CertReloader>>,
    address: SocketAddr,
    gate: Option<Arc<Gatekeeper>>,
    limits: Limits,
    stats: Arc<ServerStats>,
    /// The limit the server started with; recovery never raises it past this.
    ceiling: usize,
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener")
            .field("address", &self.address)
            .field("tls", &self.tls.is_some())
            .field("authenticated", &self.gate.is_some())
            .finish()
    }
}

/// This process's soft open-file limit (Linux), if known.
fn open_files_limit() -> Option<u64> {
    std::fs::read_to_string("/proc/self/limits").ok().as_deref().and_then(logic::parse_open_files_limit)
}

impl Listener {
    /// Bind `config.address`, preparing TLS first so bad files fail at start.
    pub async fn bind(config: &HttpConfig) -> Result<Self, Error> {
        let serve_error = |message: String| Error::Serve { address: config.address.to_string(), message };
        let (tls, reloader) = match tls::server_config(&config.tls, &config.tls_options, config.address.ip())? {
            Some(server) => (Some(TlsAcceptor::from(Arc::new(server.config))), server.reloader),
            None => (None, None),
        };
        let gate = match &config.auth {
            None => None,
            Some(auth) => {
                logic::validate_always_allow_paths(&auth.settings.always_allow_paths)
                    .map_err(|m| Error::InvalidFlag { flag: "--authorization-always-allow-paths", message: m })?;
                let reviews = auth.reviews.clone().ok_or_else(|| {
                    serve_error("delegated authentication has no API client (call HttpConfig::resolve_auth)".into())
                })?;
                Some(Arc::new(Gatekeeper::new(auth.settings.clone(), reviews)))
            }
        };
        let tcp = TcpListener::bind(config.address).await.map_err(|e| serve_error(e.to_string()))?;
        let address = tcp.local_addr().map_err(|e| serve_error(e.to_string()))?;
        let stats = Arc::new(ServerStats::default());
        let ceiling = logic::effective_max_connections(config.limits.max_connections, open_files_limit());
        stats.limit.store(ceiling, Ordering::Relaxed);
        Ok(Self { tcp, tls, reloader, address, gate, limits: config.limits.clone(), stats, ceiling })
    }

    /// The bound address (the real port when port 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.address
    }

    /// The server's counters (live while it serves).
    pub fn stats(&self) -> Arc<ServerStats> {
        self.stats.clone()
    }

    /// Serve `handler` until `shutdown` fires; open connections then finish their request.
    pub async fn serve_with(self, handler: Handler, shutdown: CancellationToken) {
        self.serve_responder(Responder::Head(handler), shutdown).await
    }

    /// Serve `handler`, which gets each request's body (at most [`Limits::max_body_bytes`]),
    /// until `shutdown` fires.
    pub async fn serve_bodies(self, handler: BodyHandler, shutdown: CancellationToken) {
        self.serve_responder(Responder::Body(handler), shutdown).await
    }

    async fn serve_responder(self, handler: Responder, shutdown: CancellationToken) {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let what = match handler {
            Responder::Head(_) => "serving health and metrics",
            Responder::Body(_) => "serving admission webhooks",
        };
        tracing::info!(
            address = %self.address,
            scheme,
            authenticated = self.gate.is_some(),
            max_connections = self.stats.limit.load(Ordering::Relaxed),
            "{what}"
        );
        if let Some(reloader) = self.reloader.clone() {
            tokio::spawn(reload_certificates(
                reloader,
                self.limits.tls_reload_every,
                self.stats.clone(),
                shutdown.clone(),
            ));
        }
        let table = Arc::new(Table {
            slots: Mutex::new(HashMap::new()),
            next: AtomicU64::new(0),
            stats: self.stats.clone(),
            exhausted: AtomicBool::new(false),
        });
        let mut recovery = tokio::time::interval(self.limits.limit_recovery_every.max(Duration::from_millis(10)));
        recovery.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut backoff = logic::Backoff::new(self.limits.accept_backoff_first, self.limits.accept_backoff_max);
        let mut warnings = logic::WarnLimiter::new(self.limits.warn_every);
        let shared =
            Arc::new(Shared { handler, gate: self.gate.clone(), limits: self.limits.clone(), tls: self.tls.clone() });
        loop {
            let accepted = tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = recovery.tick() => {
                    table.on_recovery_tick(self.ceiling);
                    continue;
                }
                accepted = self.tcp.accept() => accepted,
            };
            match accepted {
                Ok((stream, _peer)) => {
                    backoff.success();
                    ServerStats::add(&self.stats.accepted);
                    let Some(guard) = table.admit() else {
                        // Every slot is answering a request: close this one at once.
                        ServerStats::add(&self.stats.rejected);
                        drop(stream);
                        continue;
                    };
                    let _ = stream.set_nodelay(true);
                    tokio::spawn(connection(stream, guard, shared.clone(), shutdown.clone()));
                }
                Err(error) => {
                    ServerStats::add(&self.stats.accept_errors);
                    if logic::is_descriptor_exhaustion(&error) {
                        table.on_exhaustion();
                    }
                    let pause = backoff.failure();
                    if let Some(suppressed) = warnings.allow(Instant::now()) {
                        ServerStats::add(&self.stats.accept_warnings);
                        tracing::warn!(%error, suppressed, ?pause, "accepting a connection failed; pausing");
                    }
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(pause) => {}
                    }
                }
            }
        }
    }
}

/// Re-read the certificate files every `every` until `shutdown`. Logs name the files, never
/// their content; an unusable pair is logged once until the files change again.
async fn reload_certificates(
    reloader: Arc<tls::CertReloader>,
    every: Duration,
    stats: Arc<ServerStats>,
    shutdown: CancellationToken,
) {
    let mut tick = tokio::time::interval(every.max(Duration::from_millis(10)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let r = reloader.clone();
        // Two small files, but still blocking I/O: off the runtime's workers.
        let Ok(outcome) = tokio::task::spawn_blocking(move || r.reload()).await else { continue };
        match outcome {
            tls::Reload::Unchanged | tls::Reload::StillRejected => {}
            tls::Reload::Replaced => {
                ServerStats::add(&stats.tls_reloads);
                tracing::info!(cert = %reloader.files().cert.display(), "serving the new certificate from the changed files");
            }
            tls::Reload::Rejected(error) => {
                ServerStats::add(&stats.tls_reload_failures);
                tracing::warn!(
                    %error,
                    cert = %reloader.files().cert.display(),
                    "the changed certificate files are unusable; still serving the previous certificate"
                );
            }
        }
    }
}

/// What every connection task needs.
struct Shared {
    handler: Responder,
    gate: Option<Arc<Gatekeeper>>,
    limits: Limits,
    tls: Option<TlsAcceptor>,
}

async fn connection(stream: TcpStream, guard: SlotGuard, shared: Arc<Shared>, shutdown: CancellationToken) {
    let slot = guard.slot.clone();
    match &shared.tls {
        Some(acceptor) => {
            let handshake = tokio::select! {
                _ = slot.cancel.cancelled() => return,
                _ = shutdown.cancelled() => return,
                r = tokio::time::timeout(shared.limits.tls_handshake_timeout, acceptor.accept(stream)) => r,
            };
            match handshake {
                Ok(Ok(tls)) => serve_http(TokioIo::new(tls), slot, shared.clone(), shutdown).await,
                Ok(Err(error)) => tracing::debug!(%error, "TLS handshake failed"),
                Err(_) => tracing::debug!("TLS handshake timed out"),
            }
        }
        None => serve_http(TokioIo::new(stream), slot, shared.clone(), shutdown).await,
    }
    drop(guard);
}

fn respond(status: StatusCode, content_type: &'static str, body: String, method: &Method) -> Response<Full<Bytes>> {
    let body = if *method == Method::HEAD { Bytes::new() } else { Bytes::from(body) };
    let mut builder = Response::builder();
    if status == StatusCode::TOO_MANY_REQUESTS {
        builder = builder.header(header::RETRY_AFTER, "1");
    }
    builder
        .status(status)
        .header(header::CONTENT_TYPE, content_type)
        .header(header::CACHE_CONTROL, "no-cache, private")
        .header(header::X_CONTENT_TYPE_OPTIONS, "nosniff")
        .body(Full::new(body))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
}

async fn handle(req: Request<Incoming>, slot: Arc<Slot>, shared: Arc<Shared>) -> Response<Full<Bytes>> {
    let method = req.method().clone();
    let path_and_query = req.uri().path_and_query().map_or("/", |p| p.as_str());
    let path = path_and_query.split_once('?').map_or(path_and_query, |(p, _)| p);
    let _in_use = if let Some(gate) = &shared.gate {
        // Until the gate answers, the connection may be closed to make room for a probe.
        let in_use = InUse::new(slot.clone(), Activity::Reviewing(Instant::now()));
        let authorization = req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
        let decision = gate.check(&method, path, authorization).await;
        if let Some((status, body)) = decision.refusal(path) {
            return respond(status, "text/plain; charset=utf-8", body, &method);
        }
        slot.set(Activity::Serving);
        in_use
    } else {
        InUse::new(slot, Activity::Serving)
    };
    let a = match &shared.handler {
        Responder::Head(handler) => handler(&method, path_and_query),
        Responder::Body(handler) => {
            let path = path_and_query.to_string();
            let content_type = req.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).map(String::from);
            match read_body(req, &shared.limits).await {
                Ok(body) => handler(BodyRequest { method: method.clone(), path, content_type, body }).await,
                Err(refusal) => refusal,
            }
        }
    };
    respond(a.status, a.content_type, a.body, &method)
}

/// The request's body, bounded in size and time; the answer to send instead when it is not.
async fn read_body(req: Request<Incoming>, limits: &Limits) -> Result<Bytes, Answer> {
    use http_body_util::BodyExt;
    let limited = http_body_util::Limited::new(req.into_body(), limits.max_body_bytes);
    match tokio::time::timeout(limits.body_read_timeout, limited.collect()).await {
        Err(_) => Err(Answer::text(StatusCode::REQUEST_TIMEOUT, "the request body took too long\n")),
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(error)) if error.is::<http_body_util::LengthLimitError>() => Err(Answer::text(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the request body is larger than {} bytes\n", limits.max_body_bytes),
        )),
        Ok(Err(_)) => Err(Answer::text(StatusCode::BAD_REQUEST, "the request body could not be read\n")),
    }
}

/// Requests heads larger than this are refused (hyper's minimum is 8 KiB).
const MAX_HEAD_BYTES: usize = 32 * 1024;

async fn serve_http<I>(io: I, slot: Arc<Slot>, shared: Arc<Shared>, shutdown: CancellationToken)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let service = {
        let (slot, shared) = (slot.clone(), shared.clone());
        service_fn(move |req: Request<Incoming>| {
            let (slot, shared) = (slot.clone(), shared.clone());
            async move { Ok::<_, Infallible>(handle(req, slot, shared).await) }
        })
    };
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(shared.limits.header_read_timeout)
        .max_buf_size(MAX_HEAD_BYTES)
        .keep_alive(true);
    let conn = builder.serve_connection(io, service);
    tokio::pin!(conn);
    let idle = shared.limits.idle_timeout;
    let mut tick = tokio::time::interval((idle / 4).max(Duration::from_millis(100)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(error) = result {
                    tracing::debug!(%error, "connection ended with an error");
                }
                return;
            }
            // Closed to make room, or idle too long: drop it at once.
            _ = slot.cancel.cancelled() => return,
            _ = tick.tick() => {
                if slot.idle_since().is_some_and(|since| since.elapsed() >= idle) {
                    return;
                }
            }
            _ = shutdown.cancelled() => {
                conn.as_mut().graceful_shutdown();
                let _ = tokio::time::timeout(Duration::from_secs(5), conn.as_mut()).await;
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::auth::tests::Hangs;
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_rustls::rustls;

    async fn get(addr: SocketAddr, path: &str, token: Option<&str>) -> std::io::Result<TcpStream> {
        let mut s = TcpStream::connect(addr).await?;
        let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
        s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n{auth}\r\n").as_bytes()).await?;
        Ok(s)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn requests_stuck_in_review_never_keep_a_probe_out() {
        let settings = AuthSettings {
            review_queue_timeout: Duration::from_secs(60),
            review_timeout: Duration::from_secs(60),
            ..AuthSettings::default()
        };
        let config = HttpConfig::plain(SocketAddr::from(([127, 0, 0, 1], 0)))
            .with_auth(AuthConfig::new(settings).with_reviews(Arc::new(Hangs)))
            .with_limits(Limits { max_connections: 8, ..Limits::default() });
        let listener = Listener::bind(&config).await.expect("bind");
        let (addr, stats) = (listener.local_addr(), listener.stats());
        let shutdown = CancellationToken::new();
        let handler: Handler = Arc::new(|_: &Method, _: &str| Answer::text(StatusCode::OK, "ok"));
        tokio::spawn(listener.serve_with(handler, shutdown.clone()));

        // Every slot taken by a request whose token review hangs.
        let mut flood = Vec::new();
        for i in 0..8 {
            flood.push(get(addr, "/metrics", Some(&format!("made-up-{i}"))).await.expect("connect"));
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while stats.open.load(Ordering::Relaxed) < 8 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;

        // The kubelet's probe still gets its answer, in far less than any review timeout.
        let started = Instant::now();
        let mut probe = get(addr, "/livez", None).await.expect("connect");
        let mut buf = [0u8; 256];
        let n = tokio::time::timeout(Duration::from_secs(5), probe.read(&mut buf))
            .await
            .expect("the probe is answered")
            .expect("read");
        assert!(
            String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"),
            "{}",
            String::from_utf8_lossy(&buf[..n])
        );
        assert!(started.elapsed() < Duration::from_secs(2), "answered in {:?}", started.elapsed());
        assert!(stats.evicted.load(Ordering::Relaxed) >= 1, "a stuck review made room");
        assert_eq!(stats.rejected.load(Ordering::Relaxed), 0);
        shutdown.cancel();
    }
    /// The certificate the server presents to a new connection (not verified), or `None`
    /// when the handshake fails.
    async fn presented(
        addr: SocketAddr,
        versions: &[&'static rustls::SupportedProtocolVersion],
    ) -> Option<(Vec<u8>, rustls::CipherSuite)> {
        let tcp = TcpStream::connect(addr).await.ok()?;
        let name = rustls::pki_types::ServerName::try_from("localhost").ok()?;
        let connector = probe::insecure_connector_with(versions);
        let tls = tokio::time::timeout(Duration::from_secs(5), connector.connect(name, tcp)).await.ok()?.ok()?;
        let (_, conn) = tls.get_ref();
        Some((conn.peer_certificates()?.first()?.to_vec(), conn.negotiated_cipher_suite()?.suite()))
    }

    async fn serve_tls(config: HttpConfig) -> (SocketAddr, Arc<ServerStats>, CancellationToken) {
        let listener = Listener::bind(&config).await.expect("bind");
        let (addr, stats) = (listener.local_addr(), listener.stats());
        let shutdown = CancellationToken::new();
        let handler: Handler = Arc::new(|_: &Method, _: &str| Answer::text(StatusCode::OK, "ok"));
        tokio::spawn(listener.serve_with(handler, shutdown.clone()));
        (addr, stats, shutdown)
    }

    /// Replace a file the way a Secret volume does: a new file renamed over the old.
    fn replace(path: &std::path::Path, content: &str) {
        let tmp = path.with_extension("new");
        std::fs::write(&tmp, content).unwrap();
        std::fs::rename(&tmp, path).unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn replaced_certificate_files_reach_new_connections_and_a_bad_pair_keeps_the_old_one() {
        let dir = std::env::temp_dir().join(format!("ccm-serving-reload-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let files = TlsFiles { cert: dir.join("tls.crt"), key: dir.join("tls.key") };
        let (a_cert, a_key, a_der) = tls::tests::pem_pair("a.test");
        std::fs::write(&files.cert, &a_cert).unwrap();
        std::fs::write(&files.key, &a_key).unwrap();
        let limits = Limits { tls_reload_every: Duration::from_millis(50), ..Limits::default() };
        let config = HttpConfig::new(SocketAddr::from(([127, 0, 0, 1], 0)))
            .with_tls(Tls::Files(files.clone()))
            .with_limits(limits);
        let (addr, stats, shutdown) = serve_tls(config).await;
        let all = rustls::DEFAULT_VERSIONS;
        assert_eq!(presented(addr, all).await.expect("handshake").0, a_der);

        // A garbage certificate: the old pair keeps serving, one failure counted.
        replace(&files.cert, "-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n");
        let deadline = Instant::now() + Duration::from_secs(5);
        while stats.tls_reload_failures.load(Ordering::Relaxed) == 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(stats.tls_reload_failures.load(Ordering::Relaxed), 1, "reported once, not every poll");
        assert_eq!(presented(addr, all).await.expect("handshake").0, a_der);

        // The new pair: the next connection gets it.
        let (b_cert, b_key, b_der) = tls::tests::pem_pair("b.test");
        replace(&files.key, &b_key);
        replace(&files.cert, &b_cert);
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut seen = a_der.clone();
        while seen != b_der && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
            seen = presented(addr, all).await.expect("handshake").0;
        }
        assert_eq!(seen, b_der, "the replaced certificate is served");
        assert!(stats.tls_reloads.load(Ordering::Relaxed) >= 1);
        shutdown.cancel();
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn min_version_and_cipher_suites_are_what_a_client_can_negotiate() {
        let tls12: &[&'static rustls::SupportedProtocolVersion] = &[&rustls::version::TLS12];
        let tls13: &[&'static rustls::SupportedProtocolVersion] = &[&rustls::version::TLS13];
        let local = SocketAddr::from(([127, 0, 0, 1], 0));

        let options = TlsOptions::from_flags("VersionTLS13", "").unwrap();
        let (addr, _, stop) = serve_tls(HttpConfig::new(local).with_tls_options(options)).await;
        assert!(presented(addr, tls12).await.is_none(), "a TLS 1.2 client is refused");
        assert!(presented(addr, tls13).await.is_some());
        stop.cancel();

        // The self-signed certificate is ECDSA: one ECDSA suite for TLS 1.2.
        let options = TlsOptions::from_flags("VersionTLS12", "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384").unwrap();
        let (addr, _, stop) = serve_tls(HttpConfig::new(local).with_tls_options(options)).await;
        let (_, suite) = presented(addr, tls12).await.expect("TLS 1.2 handshake");
        assert_eq!(suite, rustls::CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384);
        stop.cancel();

        let options = TlsOptions::from_flags("", "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305").unwrap();
        let (addr, _, stop) = serve_tls(HttpConfig::new(local).with_tls_options(options)).await;
        let (_, suite) = presented(addr, tls12).await.expect("TLS 1.2 handshake");
        assert_eq!(suite, rustls::CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256);
        stop.cancel();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn curve_preferences_are_the_key_exchange_groups_a_client_can_negotiate() {
        use rustls::NamedGroup;
        let local = SocketAddr::from(([127, 0, 0, 1], 0));
        let handshake = |addr: SocketAddr, groups: &'static [NamedGroup]| async move {
            let tcp = TcpStream::connect(addr).await.ok()?;
            let name = rustls::pki_types::ServerName::try_from("localhost").ok()?;
            let connector = probe::insecure_connector_with_groups(&[], groups);
            let tls = tokio::time::timeout(Duration::from_secs(5), connector.connect(name, tcp)).await.ok()?.ok()?;
            tls.get_ref().1.negotiated_key_exchange_group().map(|g| g.name())
        };
        // --tls-curve-preferences=24 (Go's CurveP384): a client with only X25519 is refused.
        let options = TlsOptions::parse(tls::SERVING_FLAGS, "", "", "24").unwrap();
        let (addr, _, stop) = serve_tls(HttpConfig::new(local).with_tls_options(options)).await;
        assert_eq!(handshake(addr, &[NamedGroup::X25519]).await, None);
        assert_eq!(handshake(addr, &[NamedGroup::X25519, NamedGroup::secp384r1]).await, Some(NamedGroup::secp384r1));
        stop.cancel();
        // Unset: every group, X25519 first.
        let (addr, _, stop) = serve_tls(HttpConfig::new(local)).await;
        assert_eq!(handshake(addr, &[NamedGroup::X25519]).await, Some(NamedGroup::X25519));
        assert_eq!(handshake(addr, &[NamedGroup::secp256r1]).await, Some(NamedGroup::secp256r1));
        stop.cancel();
    }
}
