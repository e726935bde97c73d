//! Pure decisions of the endpoint server: which paths skip authorization, bearer tokens, the
//! review caches, which connection to close when full, and the accept back-off. No I/O here;
//! time is always passed in.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

use http::Method;

/// Upstream's `--authorization-always-allow-paths` default.
pub const DEFAULT_ALWAYS_ALLOW_PATHS: [&str; 3] = ["/healthz", "/readyz", "/livez"];

/// Whether `path` (no query string) is served without authentication or authorization.
/// An entry matches exactly, or, when it ends in `*`, as a prefix (upstream's rule).
pub fn always_allowed(patterns: &[String], path: &str) -> bool {
    patterns.iter().any(|p| match p.strip_suffix('*') {
        Some(prefix) => path.starts_with(prefix),
        None => p == path,
    })
}

/// Check `--authorization-always-allow-paths` entries: each starts with `/`, and `*` may only
/// end one.
pub fn validate_always_allow_paths(patterns: &[String]) -> Result<(), String> {
    for p in patterns {
        if !p.starts_with('/') {
            return Err(format!("{p:?} does not start with /"));
        }
        if p.trim_end_matches('*').contains('*') || p.matches('*').count() > 1 {
            return Err(format!("{p:?}: '*' is only allowed once, at the end"));
        }
    }
    Ok(())
}

/// The token of an `Authorization: Bearer <token>` header (scheme case-insensitive), or `None`
/// when the header is missing, of another scheme, or empty.
pub fn bearer_token(header: Option<&str>) -> Option<&str> {
    let (scheme, token) = header?.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty() && !token.contains(' ')).then_some(token)
}

/// The authorization verb of a non-resource request, as the API server derives it.
pub fn verb_for(method: &Method) -> &'static str {
    match *method {
        Method::GET | Method::HEAD => "get",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        Method::OPTIONS => "options",
        _ => "unknown",
    }
}

/// Who a token belongs to, as TokenReview reports it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct UserInfo {
    /// `status.user.username`.
    pub username: String,
    /// `status.user.uid`.
    pub uid: String,
    /// `status.user.groups`.
    pub groups: Vec<String>,
    /// `status.user.extra`, sorted.
    pub extra: std::collections::BTreeMap<String, Vec<String>>,
}

/// The group upstream authorizes without asking (the API server's own superusers).
pub const PRIVILEGED_GROUP: &str = "system:masters";

/// What the gate decided for one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gate {
    /// Serve it.
    Allow,
    /// 401: no token, or one the API server did not accept.
    Unauthorized,
    /// 403: authenticated, but SubjectAccessReview denied it.
    Forbidden {
        /// The user, for the message.
        user: String,
        /// The verb asked for.
        verb: &'static str,
    },
    /// 500: the review could not be made (the API server was unreachable, ...).
    Failed,
    /// 429: every review slot stayed taken for the whole queue wait; the client may retry.
    Busy,
}

impl Gate {
    /// The HTTP status and body for a refusal; `None` for [`Gate::Allow`].
    pub fn refusal(&self, path: &str) -> Option<(http::StatusCode, String)> {
        match self {
            Gate::Allow => None,
            Gate::Unauthorized => Some((http::StatusCode::UNAUTHORIZED, "Unauthorized\n".into())),
            Gate::Forbidden { user, verb } => {
                Some((http::StatusCode::FORBIDDEN, format!("forbidden: User {user:?} cannot {verb} path {path:?}\n")))
            }
            Gate::Failed => Some((http::StatusCode::INTERNAL_SERVER_ERROR, "authorization check failed\n".into())),
            Gate::Busy => {
                Some((http::StatusCode::TOO_MANY_REQUESTS, "too many requests awaiting authentication\n".into()))
            }
        }
    }
}

/// A map whose entries expire, bounded in size: when full, expired entries go first, then the
/// one closest to expiry.
#[derive(Debug)]
pub struct TtlCache<K, V> {
    entries: HashMap<K, (V, Instant)>,
    capacity: usize,
}

impl<K: Eq + Hash + Clone, V: Clone> TtlCache<K, V> {
    /// An empty cache of at most `capacity` entries (at least 1).
    pub fn new(capacity: usize) -> Self {
        Self { entries: HashMap::new(), capacity: capacity.max(1) }
    }

    /// The value for `key` if it has not expired at `now`.
    pub fn get(&mut self, key: &K, now: Instant) -> Option<V> {
        match self.entries.get(key) {
            Some((v, until)) if *until > now => Some(v.clone()),
            Some(_) => {
                self.entries.remove(key);
                None
            }
            None => None,
        }
    }

    /// Remember `value` for `ttl` from `now`; a zero TTL stores nothing.
    pub fn insert(&mut self, key: K, value: V, ttl: Duration, now: Instant) {
        if ttl.is_zero() {
            return;
        }
        if self.entries.len() >= self.capacity && !self.entries.contains_key(&key) {
            self.entries.retain(|_, (_, until)| *until > now);
            if self.entries.len() >= self.capacity
                && let Some(soonest) = self.entries.iter().min_by_key(|(_, (_, until))| *until).map(|(k, _)| k.clone())
            {
                self.entries.remove(&soonest);
            }
        }
        self.entries.insert(key, (value, now + ttl));
    }

    /// Entries held (expired ones included until touched).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the cache holds nothing.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// What an open connection is doing, for choosing which one to close.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activity {
    /// No request in progress since this instant.
    Idle(Instant),
    /// A request waiting for its TokenReview or SubjectAccessReview since this instant: an
    /// unauthenticated client must not keep a slot a probe needs.
    Reviewing(Instant),
    /// Answering an allowed request (fast: health, metrics).
    Serving,
}

/// Which open connection to close to make room for a new one: the one idle the longest, else
/// the request waiting longest for a review. `None` when every connection is serving.
pub fn eviction_victim<I>(connections: I) -> Option<u64>
where
    I: IntoIterator<Item = (u64, Activity)>,
{
    connections
        .into_iter()
        .filter_map(|(id, activity)| match activity {
            Activity::Idle(since) => Some(((0, since), id)),
            Activity::Reviewing(since) => Some(((1, since), id)),
            Activity::Serving => None,
        })
        .min()
        .map(|(_, id)| id)
}

/// File descriptors kept free for everything but served connections (the API client's
/// connections and watches, files, the runtime).
pub const RESERVED_DESCRIPTORS: u64 = 64;
/// The fewest connections the server allows, whatever the descriptor limit.
pub const MIN_CONNECTIONS: usize = 4;

/// The connection limit: the configured one, lowered so that served connections leave
/// [`RESERVED_DESCRIPTORS`] of the process's open-file limit free.
pub fn effective_max_connections(configured: usize, open_files_limit: Option<u64>) -> usize {
    let by_fds = open_files_limit
        .map(|n| usize::try_from(n.saturating_sub(RESERVED_DESCRIPTORS)).unwrap_or(usize::MAX))
        .unwrap_or(usize::MAX);
    configured.min(by_fds).max(MIN_CONNECTIONS)
}

/// Descriptors handed back when `accept` reports the process is out of them.
pub const EXHAUSTION_HEADROOM: usize = 16;

/// The new connection limit after `accept` failed for lack of descriptors with `open`
/// connections: that many less [`EXHAUSTION_HEADROOM`], so the rest of the process gets
/// descriptors back; never raised, never below [`MIN_CONNECTIONS`].
pub fn limit_after_exhaustion(current_limit: usize, open: usize) -> usize {
    current_limit.min(open.saturating_sub(EXHAUSTION_HEADROOM)).max(MIN_CONNECTIONS)
}

/// The connection limit at a quiet tick (no descriptor exhaustion since the last one): back up
/// by [`EXHAUSTION_HEADROOM`] towards `ceiling`, so one exhaustion does not lower it for good.
pub fn limit_after_quiet_period(current_limit: usize, ceiling: usize) -> usize {
    current_limit.max(ceiling.min(current_limit.saturating_add(EXHAUSTION_HEADROOM)))
}

/// The soft "Max open files" of a `/proc/<pid>/limits` text; `None` when unlimited or absent.
pub fn parse_open_files_limit(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.trim_start_matches("Max open files").split_whitespace().next()?.parse().ok()
}

/// Whether an `accept` error means the process or system ran out of file descriptors
/// (EMFILE, ENFILE on Linux).
pub fn is_descriptor_exhaustion(error: &std::io::Error) -> bool {
    matches!(error.raw_os_error(), Some(23 | 24))
}

/// The pause after a failed `accept`: doubles from `first` to `max`, back to `first` after a
/// success. Without it a persistent error (EMFILE) makes the accept loop spin.
#[derive(Debug, Clone)]
pub struct Backoff {
    first: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// Start at `first`, cap at `max`.
    pub fn new(first: Duration, max: Duration) -> Self {
        Self { first, max, next: first }
    }

    /// The pause to take now; the next one is twice as long, up to the cap.
    pub fn failure(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.max);
        d
    }

    /// An accept succeeded.
    pub fn success(&mut self) {
        self.next = self.first;
    }
}

/// Rate limit for a repeated warning: at most one per `every`, carrying how many were
/// suppressed since the last one.
#[derive(Debug, Clone)]
pub struct WarnLimiter {
    every: Duration,
    last: Option<Instant>,
    suppressed: u64,
}

impl WarnLimiter {
    /// At most one warning per `every`.
    pub fn new(every: Duration) -> Self {
        Self { every, last: None, suppressed: 0 }
    }

    /// `Some(suppressed)` when a warning should be logged at `now`, else `None` (counted).
    pub fn allow(&mut self, now: Instant) -> Option<u64> {
        match self.last {
            Some(last) if now.saturating_duration_since(last) < self.every => {
                self.suppressed += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.suppressed))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(p: &[&str]) -> Vec<String> {
        p.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn only_listed_paths_skip_authorization_and_a_star_is_a_prefix() {
        let defaults = paths(&DEFAULT_ALWAYS_ALLOW_PATHS);
        for p in ["/healthz", "/readyz", "/livez"] {
            assert!(always_allowed(&defaults, p), "{p}");
        }
        for p in ["/metrics", "/healthz/leaderElection", "/healthz/", "/livezz", "/", "", "/%68ealthz"] {
            assert!(!always_allowed(&defaults, p), "{p}");
        }
        let star = paths(&["/healthz/*"]);
        assert!(always_allowed(&star, "/healthz/leaderElection"));
        assert!(!always_allowed(&star, "/healthz"));
        assert!(validate_always_allow_paths(&paths(&["/healthz", "/debug/*"])).is_ok());
        assert!(validate_always_allow_paths(&paths(&["healthz"])).is_err());
        assert!(validate_always_allow_paths(&paths(&["/a*b"])).is_err());
        assert!(validate_always_allow_paths(&paths(&["/a**"])).is_err());
    }

    #[test]
    fn bearer_tokens_are_taken_only_from_a_bearer_header() {
        assert_eq!(bearer_token(Some("Bearer abc.def")), Some("abc.def"));
        assert_eq!(bearer_token(Some("bearer   abc ")), Some("abc"));
        assert_eq!(bearer_token(Some("Basic dXNlcjpwYXNz")), None);
        assert_eq!(bearer_token(Some("Bearer ")), None);
        assert_eq!(bearer_token(Some("Bearer")), None);
        assert_eq!(bearer_token(Some("Bearer a b")), None);
        assert_eq!(bearer_token(None), None);
    }

    #[test]
    fn verbs_follow_the_api_server_mapping() {
        assert_eq!(verb_for(&Method::GET), "get");
        assert_eq!(verb_for(&Method::HEAD), "get");
        assert_eq!(verb_for(&Method::POST), "create");
        assert_eq!(verb_for(&Method::DELETE), "delete");
    }

    #[test]
    fn refusals_are_401_403_and_500_and_name_user_verb_and_path() {
        assert_eq!(Gate::Allow.refusal("/metrics"), None);
        assert_eq!(Gate::Unauthorized.refusal("/metrics").unwrap().0, 401);
        let (code, body) =
            Gate::Forbidden { user: "system:anonymous".into(), verb: "get" }.refusal("/metrics").unwrap();
        assert_eq!(code, 403);
        assert_eq!(body, "forbidden: User \"system:anonymous\" cannot get path \"/metrics\"\n");
        assert_eq!(Gate::Failed.refusal("/metrics").unwrap().0, 500);
    }

    #[test]
    fn cached_answers_expire_after_their_ttl() {
        let t0 = Instant::now();
        let mut c = TtlCache::new(8);
        c.insert("allowed", true, Duration::from_secs(10), t0);
        c.insert("denied", false, Duration::from_secs(2), t0);
        assert_eq!(c.get(&"allowed", t0 + Duration::from_secs(9)), Some(true));
        assert_eq!(c.get(&"denied", t0 + Duration::from_secs(1)), Some(false));
        assert_eq!(c.get(&"denied", t0 + Duration::from_secs(2)), None, "expired at exactly its TTL");
        assert_eq!(c.get(&"allowed", t0 + Duration::from_secs(10)), None);
        assert!(c.is_empty(), "expired entries are dropped when read");
        c.insert("zero", true, Duration::ZERO, t0);
        assert_eq!(c.get(&"zero", t0), None, "a zero TTL caches nothing");
    }

    #[test]
    fn a_full_cache_drops_expired_entries_first_then_the_soonest_to_expire() {
        let t0 = Instant::now();
        let mut c = TtlCache::new(3);
        c.insert(1, 'a', Duration::from_secs(1), t0);
        c.insert(2, 'b', Duration::from_secs(30), t0);
        c.insert(3, 'c', Duration::from_secs(20), t0);
        // 1 has expired by now: it makes room.
        let t1 = t0 + Duration::from_secs(5);
        c.insert(4, 'd', Duration::from_secs(30), t1);
        assert_eq!(c.len(), 3);
        assert_eq!((c.get(&2, t1), c.get(&3, t1), c.get(&4, t1)), (Some('b'), Some('c'), Some('d')));
        // Nothing expired: 3 (soonest) goes.
        c.insert(5, 'e', Duration::from_secs(30), t1);
        assert_eq!(c.len(), 3);
        assert_eq!(c.get(&3, t1), None);
        // Ten thousand distinct keys never grow it past its capacity.
        for k in 0..10_000 {
            c.insert(100 + k, 'x', Duration::from_secs(60), t1);
        }
        assert_eq!(c.len(), 3);
        // Re-inserting a present key replaces it without evicting another.
        c.insert(10_099, 'y', Duration::from_secs(60), t1);
        assert_eq!(c.get(&10_099, t1), Some('y'));
        assert_eq!(c.len(), 3);
    }

    #[test]
    fn the_longest_idle_connection_is_closed_first_and_serving_ones_never() {
        let t0 = Instant::now();
        let idle = |n| Activity::Idle(t0 + Duration::from_secs(n));
        let reviewing = |n| Activity::Reviewing(t0 + Duration::from_secs(n));
        assert_eq!(eviction_victim([(1, idle(5)), (2, idle(1)), (3, Activity::Serving), (4, idle(3))]), Some(2));
        // An idle connection goes before any request awaiting a review, however old.
        assert_eq!(eviction_victim([(1, reviewing(0)), (2, idle(9)), (3, Activity::Serving)]), Some(2));
        assert_eq!(eviction_victim([(1, Activity::Serving), (2, Activity::Serving)]), None);
        assert_eq!(eviction_victim(std::iter::empty()), None);
    }

    #[test]
    fn requests_awaiting_a_review_are_closed_oldest_first_to_make_room() {
        let t0 = Instant::now();
        let reviewing = |n| Activity::Reviewing(t0 + Duration::from_secs(n));
        assert_eq!(eviction_victim([(1, reviewing(4)), (2, Activity::Serving), (3, reviewing(2))]), Some(3));
    }

    #[test]
    fn the_connection_limit_climbs_back_after_exhaustion() {
        let mut limit = limit_after_exhaustion(128, 40);
        assert_eq!(limit, 24);
        let mut ticks = 0;
        while limit < 128 {
            limit = limit_after_quiet_period(limit, 128);
            ticks += 1;
        }
        assert_eq!((limit, ticks), (128, 7), "16 a tick, never past the ceiling");
        assert_eq!(limit_after_quiet_period(128, 128), 128);
        // A ceiling lowered below the limit (a smaller open-file limit) never lowers it here.
        assert_eq!(limit_after_quiet_period(100, 64), 100);
    }

    #[test]
    fn a_busy_review_queue_is_429() {
        let (status, _) = Gate::Busy.refusal("/metrics").expect("a refusal");
        assert_eq!(status, http::StatusCode::TOO_MANY_REQUESTS);
    }

    #[test]
    fn the_connection_limit_leaves_descriptors_for_the_rest_of_the_process() {
        assert_eq!(effective_max_connections(128, None), 128);
        assert_eq!(effective_max_connections(128, Some(1_048_576)), 128);
        assert_eq!(effective_max_connections(128, Some(128)), 64);
        assert_eq!(effective_max_connections(128, Some(20)), MIN_CONNECTIONS);
        // Out of descriptors with 40 open: hand 16 back, never raise, never below the floor.
        assert_eq!(limit_after_exhaustion(128, 40), 24);
        assert_eq!(limit_after_exhaustion(20, 100), 20);
        assert_eq!(limit_after_exhaustion(128, 3), MIN_CONNECTIONS);
    }

    #[test]
    fn the_open_files_limit_is_read_from_proc_limits() {
        let text = "Limit                     Soft Limit           Hard Limit           Units     \n\
                    Max processes             63459                63459                processes \n\
                    Max open files            256                  4096                 files     \n";
        assert_eq!(parse_open_files_limit(text), Some(256));
        assert_eq!(parse_open_files_limit("Max open files  unlimited unlimited files"), None);
        assert_eq!(parse_open_files_limit(""), None);
        assert!(is_descriptor_exhaustion(&std::io::Error::from_raw_os_error(24)));
        assert!(is_descriptor_exhaustion(&std::io::Error::from_raw_os_error(23)));
        assert!(!is_descriptor_exhaustion(&std::io::Error::from_raw_os_error(103)));
    }

    #[test]
    fn accept_backoff_doubles_from_10ms_to_1s_and_resets_on_success() {
        let mut b = Backoff::new(Duration::from_millis(10), Duration::from_secs(1));
        let got: Vec<u128> = (0..9).map(|_| b.failure().as_millis()).collect();
        assert_eq!(got, [10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
        b.success();
        assert_eq!(b.failure(), Duration::from_millis(10));
    }

    #[test]
    fn a_repeated_warning_is_logged_once_per_period_with_the_suppressed_count() {
        let t0 = Instant::now();
        let mut w = WarnLimiter::new(Duration::from_secs(10));
        assert_eq!(w.allow(t0), Some(0));
        let logged = (1..=1000).filter(|i| w.allow(t0 + Duration::from_millis(*i)).is_some()).count();
        assert_eq!(logged, 0);
        assert_eq!(w.allow(t0 + Duration::from_secs(10)), Some(1000));
        assert_eq!(w.allow(t0 + Duration::from_secs(11)), None);
    }
}
