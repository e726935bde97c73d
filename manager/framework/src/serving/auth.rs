//! Delegated authentication and authorization, as upstream's components do it: a bearer token
//! is checked with a TokenReview (`authentication.k8s.io/v1`), then the request with a
//! SubjectAccessReview (`authorization.k8s.io/v1`) for the non-resource URL and verb. Answers
//! are cached briefly; the decisions themselves are in [`super::logic`].

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use http::Method;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use kube::Client;
use kube::api::{Api, PostParams};
use tokio::sync::Semaphore;

use super::logic::{self, Gate, PRIVILEGED_GROUP, TtlCache, UserInfo, WarnLimiter};

/// What the API server said about a token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenOutcome {
    /// The token is valid for this user.
    Authenticated(UserInfo),
    /// The token is not valid (unknown, expired, wrong audience, ...).
    Rejected,
}

/// The two reviews, behind a trait so the gate is tested without an API server.
#[async_trait]
pub trait Reviews: Send + Sync {
    /// TokenReview `token`. `Err` when no answer could be had (the message never quotes the token).
    async fn review_token(&self, token: &str) -> Result<TokenOutcome, String>;
    /// SubjectAccessReview: may `user` do `verb` on the non-resource URL `path`?
    async fn review_access(&self, user: &UserInfo, path: &str, verb: &str) -> Result<bool, String>;
}

/// [`Reviews`] through the Kubernetes API.
#[derive(Clone)]
pub struct KubeReviews {
    authentication: Client,
    authorization: Client,
}

impl KubeReviews {
    /// TokenReviews through `authentication`, SubjectAccessReviews through `authorization`.
    pub fn new(authentication: Client, authorization: Client) -> Self {
        Self { authentication, authorization }
    }
}

#[async_trait]
impl Reviews for KubeReviews {
    async fn review_token(&self, token: &str) -> Result<TokenOutcome, String> {
        let review = TokenReview {
            spec: TokenReviewSpec { token: Some(token.to_string()), audiences: None },
            ..Default::default()
        };
        let api: Api<TokenReview> = Api::all(self.authentication.clone());
        // The error is built from the status only: the request body holds the token.
        let answer = api.create(&PostParams::default(), &review).await.map_err(|e| describe(&e))?;
        let status = answer.status.unwrap_or_default();
        if status.authenticated != Some(true) {
            return Ok(TokenOutcome::Rejected);
        }
        let user = status.user.unwrap_or_default();
        Ok(TokenOutcome::Authenticated(UserInfo {
            username: user.username.unwrap_or_default(),
            uid: user.uid.unwrap_or_default(),
            groups: user.groups.unwrap_or_default(),
            extra: user.extra.unwrap_or_default(),
        }))
    }

    async fn review_access(&self, user: &UserInfo, path: &str, verb: &str) -> Result<bool, String> {
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.username.clone()),
                uid: Some(user.uid.clone()).filter(|u| !u.is_empty()),
                groups: Some(user.groups.clone()),
                extra: Some(user.extra.clone()).filter(|e| !e.is_empty()),
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some(path.to_string()),
                    verb: Some(verb.to_string()),
                }),
                resource_attributes: None,
            },
            ..Default::default()
        };
        let api: Api<SubjectAccessReview> = Api::all(self.authorization.clone());
        let answer = api.create(&PostParams::default(), &review).await.map_err(|e| describe(&e))?;
        Ok(answer.status.is_some_and(|s| s.allowed && s.denied != Some(true)))
    }
}

/// A short description of a failed review, from the API's status only.
fn describe(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(status) => format!("{} {}", status.code, status.reason),
        other => other.to_string(),
    }
}

/// Cache times and sizes of the gate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthSettings {
    /// `--authorization-always-allow-paths`: served to anyone.
    pub always_allow_paths: Vec<String>,
    /// `--authentication-token-webhook-cache-ttl`: how long a TokenReview answer is reused.
    pub token_ttl: Duration,
    /// `--authorization-webhook-cache-authorized-ttl`.
    pub allowed_ttl: Duration,
    /// `--authorization-webhook-cache-unauthorized-ttl`.
    pub denied_ttl: Duration,
    /// Most entries of each cache.
    pub cache_size: usize,
    /// Most reviews in flight at once; further requests wait up to `review_queue_timeout`.
    pub max_reviews_in_flight: usize,
    /// The longest a request waits for a review slot before it gets a 429, so a flood of
    /// made-up tokens cannot keep connections waiting.
    pub review_queue_timeout: Duration,
    /// The longest one review may take before the request gets a 500.
    pub review_timeout: Duration,
}

/// The TokenReview cache entry for a token that the API server rejected lives this long at most.
pub const REJECTED_TOKEN_TTL: Duration = Duration::from_secs(5);

impl Default for AuthSettings {
    fn default() -> Self {
        Self {
            always_allow_paths: logic::DEFAULT_ALWAYS_ALLOW_PATHS.iter().map(|s| s.to_string()).collect(),
            token_ttl: Duration::from_secs(10),
            allowed_ttl: Duration::from_secs(10),
            denied_ttl: Duration::from_secs(5),
            cache_size: 1024,
            max_reviews_in_flight: 16,
            review_queue_timeout: Duration::from_secs(1),
            review_timeout: Duration::from_secs(10),
        }
    }
}

/// Authentication and authorization settings with the reviewer to use.
#[derive(Clone)]
pub struct AuthConfig {
    /// Paths, cache times and sizes.
    pub settings: AuthSettings,
    /// Who answers the reviews; `None` until the binary fills it from its client (see
    /// [`crate::serving::HttpConfig::resolve_auth`]).
    pub reviews: Option<Arc<dyn Reviews>>,
    /// `--authentication-kubeconfig`: TokenReviews through this kubeconfig instead of the main client.
    pub authentication_kubeconfig: Option<String>,
    /// `--authorization-kubeconfig`: SubjectAccessReviews through this kubeconfig instead.
    pub authorization_kubeconfig: Option<String>,
}

impl std::fmt::Debug for AuthConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthConfig")
            .field("settings", &self.settings)
            .field("reviews", &self.reviews.is_some())
            .field("authentication_kubeconfig", &self.authentication_kubeconfig)
            .field("authorization_kubeconfig", &self.authorization_kubeconfig)
            .finish()
    }
}

impl AuthConfig {
    /// Delegated auth with these settings, reviewed by the main client unless kubeconfigs are set.
    pub fn new(settings: AuthSettings) -> Self {
        Self { settings, reviews: None, authentication_kubeconfig: None, authorization_kubeconfig: None }
    }

    /// Reviewed by `reviews` (a mock in tests, [`KubeReviews`] otherwise).
    pub fn with_reviews(mut self, reviews: Arc<dyn Reviews>) -> Self {
        self.reviews = Some(reviews);
        self
    }
}

/// The authorization key of one request.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct AccessKey {
    user: UserInfo,
    verb: &'static str,
    path: String,
}

/// Why a review gave no answer.
#[derive(Debug, Clone, PartialEq, Eq)]
enum ReviewFailure {
    /// No review slot came free within the queue wait.
    Busy,
    /// The review was made and failed, or timed out.
    Failed(String),
}

/// The gate in front of every request: decides, caches, and counts.
pub struct Gatekeeper {
    settings: AuthSettings,
    reviews: Arc<dyn Reviews>,
    /// Keyed by the token's SHA-256, so tokens are not kept in memory.
    tokens: Mutex<TtlCache<[u8; 32], TokenOutcome>>,
    decisions: Mutex<TtlCache<AccessKey, bool>>,
    in_flight: Semaphore,
    failures: Mutex<WarnLimiter>,
}

impl std::fmt::Debug for Gatekeeper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gatekeeper").field("settings", &self.settings).finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Gatekeeper {
    /// A gate with empty caches.
    pub fn new(settings: AuthSettings, reviews: Arc<dyn Reviews>) -> Self {
        Self {
            tokens: Mutex::new(TtlCache::new(settings.cache_size)),
            decisions: Mutex::new(TtlCache::new(settings.cache_size)),
            in_flight: Semaphore::new(settings.max_reviews_in_flight.max(1)),
            failures: Mutex::new(WarnLimiter::new(Duration::from_secs(10))),
            settings,
            reviews,
        }
    }

    /// Decide on a request for `path` (no query string) with this `Authorization` header.
    pub async fn check(&self, method: &Method, path: &str, authorization: Option<&str>) -> Gate {
        if logic::always_allowed(&self.settings.always_allow_paths, path) {
            return Gate::Allow;
        }
        let Some(token) = logic::bearer_token(authorization) else {
            return Gate::Unauthorized;
        };
        let user = match self.authenticate(token).await {
            Ok(TokenOutcome::Authenticated(user)) => user,
            Ok(TokenOutcome::Rejected) => return Gate::Unauthorized,
            Err(ReviewFailure::Busy) => return Gate::Busy,
            Err(ReviewFailure::Failed(message)) => {
                self.warn_failure("TokenReview", &message);
                // Upstream answers 401 when the token cannot be checked.
                return Gate::Unauthorized;
            }
        };
        if user.groups.iter().any(|g| g == PRIVILEGED_GROUP) {
            return Gate::Allow;
        }
        let verb = logic::verb_for(method);
        match self.authorize(user.clone(), verb, path).await {
            Ok(true) => Gate::Allow,
            Ok(false) => Gate::Forbidden { user: user.username, verb },
            Err(ReviewFailure::Busy) => Gate::Busy,
            Err(ReviewFailure::Failed(message)) => {
                self.warn_failure("SubjectAccessReview", &message);
                Gate::Failed
            }
        }
    }

    async fn authenticate(&self, token: &str) -> Result<TokenOutcome, ReviewFailure> {
        let digest = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
        let mut key = [0u8; 32];
        key.copy_from_slice(digest.as_ref());
        if let Some(hit) = lock(&self.tokens).get(&key, Instant::now()) {
            return Ok(hit);
        }
        let outcome = self.bounded(self.reviews.review_token(token)).await?;
        let ttl = match outcome {
            TokenOutcome::Authenticated(_) => self.settings.token_ttl,
            TokenOutcome::Rejected => self.settings.token_ttl.min(REJECTED_TOKEN_TTL),
        };
        lock(&self.tokens).insert(key, outcome.clone(), ttl, Instant::now());
        Ok(outcome)
    }

    async fn authorize(&self, user: UserInfo, verb: &'static str, path: &str) -> Result<bool, ReviewFailure> {
        let key = AccessKey { user, verb, path: path.to_string() };
        if let Some(hit) = lock(&self.decisions).get(&key, Instant::now()) {
            return Ok(hit);
        }
        let allowed = self.bounded(self.reviews.review_access(&key.user, path, verb)).await?;
        let ttl = if allowed { self.settings.allowed_ttl } else { self.settings.denied_ttl };
        lock(&self.decisions).insert(key, allowed, ttl, Instant::now());
        Ok(allowed)
    }

    /// Run one review with a bounded number in flight, a bounded wait for a slot and a time
    /// limit.
    async fn bounded<T>(&self, review: impl Future<Output = Result<T, String>>) -> Result<T, ReviewFailure> {
        let _permit = tokio::time::timeout(self.settings.review_queue_timeout, self.in_flight.acquire())
            .await
            .map_err(|_| ReviewFailure::Busy)?
            .map_err(|_| ReviewFailure::Failed("shutting down".into()))?;
        tokio::time::timeout(self.settings.review_timeout, review)
            .await
            .map_err(|_| ReviewFailure::Failed(format!("no answer within {:?}", self.settings.review_timeout)))?
            .map_err(ReviewFailure::Failed)
    }

    fn warn_failure(&self, what: &str, message: &str) {
        if let Some(suppressed) = lock(&self.failures).allow(Instant::now()) {
            tracing::warn!(review = what, error = %message, suppressed, "delegated auth: review failed");
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Answers from tables: token → user, (user, path) → allowed.
    #[derive(Default)]
    pub(crate) struct MockReviews {
        pub tokens: BTreeMap<String, UserInfo>,
        pub grants: Vec<(String, String)>,
        pub fail: bool,
        pub token_calls: AtomicUsize,
        pub access_calls: AtomicUsize,
    }

    #[async_trait]
    impl Reviews for MockReviews {
        async fn review_token(&self, token: &str) -> Result<TokenOutcome, String> {
            self.token_calls.fetch_add(1, Ordering::SeqCst);
            if self.fail {
                return Err("503 ServiceUnavailable".into());
            }
            Ok(self.tokens.get(token).cloned().map_or(TokenOutcome::Rejected, TokenOutcome::Authenticated))
        }
        async fn review_access(&self, user: &UserInfo, path: &str, verb: &str) -> Result<bool, String> {
            self.access_calls.fetch_add(1, Ordering::SeqCst);
            assert_eq!(verb, "get");
            Ok(self.grants.iter().any(|(u, p)| *u == user.username && p == path))
        }
    }

    fn user(name: &str, groups: &[&str]) -> UserInfo {
        UserInfo { username: name.into(), groups: groups.iter().map(|g| g.to_string()).collect(), ..Default::default() }
    }

    fn mock() -> MockReviews {
        MockReviews {
            tokens: BTreeMap::from([
                ("prom-token".to_string(), user("system:serviceaccount:monitoring:prometheus", &[])),
                ("nobody-token".to_string(), user("system:serviceaccount:default:nobody", &[])),
                ("admin-token".to_string(), user("admin", &[PRIVILEGED_GROUP])),
            ]),
            grants: vec![("system:serviceaccount:monitoring:prometheus".into(), "/metrics".into())],
            ..Default::default()
        }
    }

    /// Reviews that never answer: a slow or flooded API server.
    pub(crate) struct Hangs;

    #[async_trait]
    impl Reviews for Hangs {
        async fn review_token(&self, _: &str) -> Result<TokenOutcome, String> {
            futures::future::pending().await
        }
        async fn review_access(&self, _: &UserInfo, _: &str, _: &str) -> Result<bool, String> {
            futures::future::pending().await
        }
    }

    async fn gate(g: &Gatekeeper, path: &str, header: Option<&str>) -> Gate {
        g.check(&Method::GET, path, header).await
    }

    #[tokio::test]
    async fn no_token_or_an_unknown_token_is_401_a_denied_one_403_a_granted_one_allowed() {
        let reviews = Arc::new(mock());
        let g = Gatekeeper::new(AuthSettings::default(), reviews.clone());
        assert_eq!(gate(&g, "/metrics", None).await, Gate::Unauthorized);
        assert_eq!(gate(&g, "/metrics", Some("Basic abc")).await, Gate::Unauthorized);
        assert_eq!(gate(&g, "/metrics", Some("Bearer forged")).await, Gate::Unauthorized);
        assert_eq!(
            gate(&g, "/metrics", Some("Bearer nobody-token")).await,
            Gate::Forbidden { user: "system:serviceaccount:default:nobody".into(), verb: "get" }
        );
        assert_eq!(gate(&g, "/metrics", Some("Bearer prom-token")).await, Gate::Allow);
        // The grant is for /metrics only.
        assert!(matches!(gate(&g, "/healthz/leaderElection", Some("Bearer prom-token")).await, Gate::Forbidden { .. }));
    }

    #[tokio::test]
    async fn always_allowed_paths_need_no_token_and_ask_nobody() {
        let reviews = Arc::new(mock());
        let g = Gatekeeper::new(AuthSettings::default(), reviews.clone());
        for p in ["/healthz", "/readyz", "/livez"] {
            assert_eq!(gate(&g, p, None).await, Gate::Allow);
            assert_eq!(gate(&g, p, Some("Bearer forged")).await, Gate::Allow);
        }
        assert_eq!(reviews.token_calls.load(Ordering::SeqCst), 0);
        assert_eq!(reviews.access_calls.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn system_masters_are_allowed_without_a_subject_access_review() {
        let reviews = Arc::new(mock());
        let g = Gatekeeper::new(AuthSettings::default(), reviews.clone());
        assert_eq!(gate(&g, "/metrics", Some("Bearer admin-token")).await, Gate::Allow);
        assert_eq!(reviews.access_calls.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn answers_are_reused_within_their_ttl_and_asked_again_after() {
        let reviews = Arc::new(mock());
        let settings = AuthSettings {
            token_ttl: Duration::from_millis(300),
            allowed_ttl: Duration::from_millis(300),
            denied_ttl: Duration::from_millis(100),
            ..AuthSettings::default()
        };
        let g = Gatekeeper::new(settings, reviews.clone());
        for _ in 0..20 {
            assert_eq!(gate(&g, "/metrics", Some("Bearer prom-token")).await, Gate::Allow);
            assert!(matches!(gate(&g, "/metrics", Some("Bearer nobody-token")).await, Gate::Forbidden { .. }));
        }
        assert_eq!(reviews.token_calls.load(Ordering::SeqCst), 2, "one TokenReview per token");
        assert_eq!(reviews.access_calls.load(Ordering::SeqCst), 2, "one SubjectAccessReview per user and path");
        // The denial expires first.
        tokio::time::sleep(Duration::from_millis(150)).await;
        gate(&g, "/metrics", Some("Bearer prom-token")).await;
        gate(&g, "/metrics", Some("Bearer nobody-token")).await;
        assert_eq!(reviews.access_calls.load(Ordering::SeqCst), 3, "only the denial was asked again");
        tokio::time::sleep(Duration::from_millis(200)).await;
        gate(&g, "/metrics", Some("Bearer prom-token")).await;
        assert_eq!(reviews.token_calls.load(Ordering::SeqCst), 3, "the token is reviewed again after its TTL");
    }

    #[tokio::test]
    async fn a_review_that_fails_is_401_for_the_token_500_for_access_and_never_cached() {
        let reviews = Arc::new(MockReviews { fail: true, ..mock() });
        let g = Gatekeeper::new(AuthSettings::default(), reviews.clone());
        assert_eq!(gate(&g, "/metrics", Some("Bearer prom-token")).await, Gate::Unauthorized);
        assert_eq!(gate(&g, "/metrics", Some("Bearer prom-token")).await, Gate::Unauthorized);
        assert_eq!(reviews.token_calls.load(Ordering::SeqCst), 2);

        struct AccessFails;
        #[async_trait]
        impl Reviews for AccessFails {
            async fn review_token(&self, _: &str) -> Result<TokenOutcome, String> {
                Ok(TokenOutcome::Authenticated(user("u", &[])))
            }
            async fn review_access(&self, _: &UserInfo, _: &str, _: &str) -> Result<bool, String> {
                Err("timeout".into())
            }
        }
        let g = Gatekeeper::new(AuthSettings::default(), Arc::new(AccessFails));
        assert_eq!(gate(&g, "/metrics", Some("Bearer t")).await, Gate::Failed);
    }

    #[tokio::test]
    async fn a_review_that_hangs_ends_at_the_review_timeout() {
        let settings = AuthSettings { review_timeout: Duration::from_millis(50), ..AuthSettings::default() };
        let g = Gatekeeper::new(settings, Arc::new(Hangs));
        let started = std::time::Instant::now();
        assert_eq!(gate(&g, "/metrics", Some("Bearer t")).await, Gate::Unauthorized);
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[tokio::test]
    async fn with_every_review_slot_taken_a_request_gets_429_after_the_queue_wait_and_probes_pass() {
        let settings = AuthSettings {
            max_reviews_in_flight: 2,
            review_queue_timeout: Duration::from_millis(100),
            review_timeout: Duration::from_secs(600),
            ..AuthSettings::default()
        };
        let g = Arc::new(Gatekeeper::new(settings, Arc::new(Hangs)));
        // Two made-up tokens take both slots and hang.
        let hanging: Vec<_> = (0..2)
            .map(|i| {
                let g = g.clone();
                tokio::spawn(async move { gate(&g, "/metrics", Some(&format!("Bearer made-up-{i}"))).await })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let started = std::time::Instant::now();
        assert_eq!(gate(&g, "/metrics", Some("Bearer another")).await, Gate::Busy);
        let waited = started.elapsed();
        assert!(waited >= Duration::from_millis(100) && waited < Duration::from_secs(5), "waited {waited:?}");
        // Always-allowed paths (the kubelet's probes) ask for no slot at all.
        assert_eq!(gate(&g, "/livez", None).await, Gate::Allow);
        for h in hanging {
            assert!(!h.is_finished());
            h.abort();
        }
    }
}
