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

use crate::Error;

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

/// Load the client configuration: the kubeconfig file when given, else the in-cluster
/// configuration, else the default kubeconfig locations; then `--master` overrides the
/// server address.
pub async fn load_config(source: &ClientSource) -> Result<Config, Error> {
    let mut config = match &source.kubeconfig {
        Some(path) if !path.is_empty() => {
            let kubeconfig = Kubeconfig::read_from(path)
                .map_err(|e| Error::ClientConfig(format!("reading kubeconfig {path}: {e}")))?;
            Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .map_err(|e| Error::ClientConfig(format!("kubeconfig {path}: {e}")))?
        }
        _ => match Config::incluster() {
            Ok(c) => c,
            Err(_) => Config::infer().await.map_err(|e| Error::ClientConfig(e.to_string()))?,
        },
    };
    if let Some(master) = source.master.as_deref().filter(|m| !m.is_empty()) {
        config.cluster_url =
            master.parse().map_err(|e| Error::ClientConfig(format!("--master {master:?} is not a URL: {e}")))?;
    }
    Ok(config)
}

/// Build a client from `config` with `layer` in its stack.
pub fn build_client(config: Config, layer: &RateLimitLayer) -> Result<Client, Error> {
    let builder = ClientBuilder::try_from(config).map_err(|e| Error::ClientConfig(e.to_string()))?;
    Ok(if layer.is_enabled() { builder.with_layer(layer).build() } else { builder.build() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tower::ServiceExt;

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
}
