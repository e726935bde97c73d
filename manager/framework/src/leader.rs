//! Leader election on a `coordination.k8s.io/v1` Lease.
//!
//! The same protocol as client-go's: a candidate takes the Lease when it is absent, released
//! or not renewed for `leaseDuration` (measured on this replica's clock from when it last saw
//! the record change, so clock skew between replicas does not matter); the leader renews it
//! every `retryPeriod` and steps down when it could not renew for `renewDeadline`. Unlike
//! upstream's cloud-controller-manager, a leader that shuts down gracefully releases the Lease
//! so a standby takes over within about `retryPeriod` instead of waiting out `leaseDuration`.
//!
//! The decisions ([`decide`], [`Observer`], [`should_step_down`], [`check_health`]) are pure
//! functions of the record and the time, unit-tested with a fake clock; [`LeaderElector`]
//! does the I/O.

use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::instrument::WithSubscriber;

/// How long releasing the Lease on shutdown may take before the process exits without it.
pub const RELEASE_TIMEOUT: Duration = Duration::from_secs(2);

/// Leader-election settings; defaults are upstream's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderElectionConfig {
    /// `--leader-elect-resource-namespace`.
    pub namespace: String,
    /// `--leader-elect-resource-name`.
    pub name: String,
    /// This candidate's identity, written as the Lease's holder.
    pub identity: String,
    /// `--leader-elect-lease-duration`: how long standbys wait before taking an unrenewed Lease.
    pub lease_duration: Duration,
    /// `--leader-elect-renew-deadline`: how long the leader keeps trying to renew before it
    /// steps down.
    pub renew_deadline: Duration,
    /// `--leader-elect-retry-period`: how often candidates try to acquire and leaders renew.
    pub retry_period: Duration,
    /// Release the Lease on graceful shutdown (upstream's CCM never does).
    pub release_on_cancel: bool,
}

impl LeaderElectionConfig {
    /// Upstream defaults (15s / 10s / 2s, `kube-system/cloud-controller-manager`) with a fresh
    /// identity.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
            identity: default_identity(),
            lease_duration: crds::defaults::LEASE_DURATION,
            renew_deadline: crds::defaults::RENEW_DEADLINE,
            retry_period: crds::defaults::RETRY_PERIOD,
            release_on_cancel: true,
        }
    }

    /// Check the timing rules client-go enforces.
    pub fn validate(&self) -> Result<(), String> {
        if self.identity.is_empty() {
            return Err("the leader-election identity must not be empty".into());
        }
        crds::validation::leader_election_timings(self.lease_duration, self.renew_deadline, self.retry_period)
    }
}

impl Default for LeaderElectionConfig {
    fn default() -> Self {
        Self::new(crds::defaults::LEASE_NAMESPACE, crds::defaults::LEASE_NAME)
    }
}

/// The most a candidate stretches `retryPeriod` by, at random, so standbys do not poll in step.
pub const JITTER: f64 = crds::defaults::LEADER_ELECTION_JITTER;

/// How long past an expired Lease the `leaderElection` health check tolerates a leader that
/// has not stepped down (upstream: 20s).
pub const HEALTH_TOLERANCE: Duration = Duration::from_secs(20);

/// A random value from the standard library's per-process random seed (no extra dependency).
fn random_u64() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(Instant::now().elapsed().as_nanos());
    h.finish()
}

/// Upstream's identity format: `<hostname>_<random UUID>`.
pub fn default_identity() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok().map(|h| h.trim().to_string()))
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_string());
    let (a, b) = (random_u64(), random_u64());
    // A version-4-shaped UUID.
    format!(
        "{host}_{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0x0fff,
        0x8000 | (b >> 48) & 0x3fff,
        b & 0xffff_ffff_ffff
    )
}

/// The parts of a Lease the protocol reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRecord {
    /// Who holds it; `None` (or empty) when released.
    pub holder: Option<String>,
    /// How long the holder's claim lasts after each renewal.
    pub lease_duration: Duration,
    /// The last renewal, as the holder wrote it (only compared, never trusted as a clock).
    pub renew_time: Option<Timestamp>,
    /// How many times the holder changed.
    pub transitions: i32,
}

impl LeaseRecord {
    /// Read the record from a Lease.
    pub fn from_lease(lease: &Lease) -> Self {
        let spec = lease.spec.clone().unwrap_or_default();
        Self {
            holder: spec.holder_identity.filter(|h| !h.is_empty()),
            lease_duration: Duration::from_secs(spec.lease_duration_seconds.unwrap_or(0).max(0) as u64),
            renew_time: spec.renew_time.map(|t| t.0),
            transitions: spec.lease_transitions.unwrap_or(0),
        }
    }
}

/// What a candidate should do with the Lease now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// There is no Lease: create it, holding it.
    Create,
    /// The Lease is free (released or expired): take it over.
    Acquire,
    /// We hold it: renew it.
    Renew,
    /// Someone else holds it and their claim has not expired.
    Wait {
        /// The current holder.
        holder: String,
        /// How long until their claim expires if they stop renewing.
        expires_in: Duration,
    },
}

/// Remembers when this replica last saw the Lease record change.
#[derive(Debug, Clone, Default)]
pub struct Observer {
    record: Option<LeaseRecord>,
    observed_at: Option<Instant>,
}

impl Observer {
    /// Note the record as read at `now`; the expiry clock restarts only when it changed.
    pub fn observe(&mut self, record: Option<&LeaseRecord>, now: Instant) {
        if self.record.as_ref() != record || self.observed_at.is_none() {
            self.record = record.cloned();
            self.observed_at = Some(now);
        }
    }

    /// When the current record was first seen.
    pub fn observed_at(&self) -> Option<Instant> {
        self.observed_at
    }

    /// The last record seen.
    pub fn record(&self) -> Option<&LeaseRecord> {
        self.record.as_ref()
    }
}

/// Decide what `identity` should do, given the record it just read (already passed to
/// `observer`) and the current time.
pub fn decide(identity: &str, record: Option<&LeaseRecord>, observer: &Observer, now: Instant) -> Decision {
    let Some(record) = record else { return Decision::Create };
    match record.holder.as_deref() {
        Some(h) if h == identity => Decision::Renew,
        None => Decision::Acquire,
        Some(holder) => {
            let seen = observer.observed_at().unwrap_or(now);
            let expires = seen + record.lease_duration;
            if now >= expires {
                Decision::Acquire
            } else {
                Decision::Wait { holder: holder.to_string(), expires_in: expires - now }
            }
        }
    }
}

/// Whether a leader whose last successful renewal was at `last_renew` must step down.
pub fn should_step_down(last_renew: Instant, now: Instant, renew_deadline: Duration) -> bool {
    now.saturating_duration_since(last_renew) >= renew_deadline
}

/// Upstream's `leaderElection` health check: failing only for a leader that has not renewed
/// for longer than the lease plus `tolerance` (it should have stepped down long before).
pub fn check_health(
    status: &LeaderStatus,
    now: Instant,
    lease_duration: Duration,
    tolerance: Duration,
) -> Result<(), String> {
    match (status.leading, status.last_renewed) {
        (true, Some(at)) if now.saturating_duration_since(at) > lease_duration + tolerance => Err(format!(
            "failed election to renew leadership on lease {}: last renewed {:?} ago",
            status.lease,
            now.saturating_duration_since(at)
        )),
        _ => Ok(()),
    }
}

/// What the elector reports to the rest of the manager.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaderStatus {
    /// `namespace/name` of the Lease.
    pub lease: String,
    /// Whether this replica leads.
    pub leading: bool,
    /// The holder as last seen (this replica's identity while leading).
    pub holder: Option<String>,
    /// When this replica last renewed (while leading).
    pub last_renewed: Option<Instant>,
}

/// Why [`LeaderElector::hold`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TermEnd {
    /// The Lease could not be renewed in time, or another candidate took it.
    Lost,
    /// The stop token fired while still leading.
    Stopped,
}

/// Writes `lease` back without a holder. A conflict means the Lease moved since we last read
/// it: a renewal whose answer we never saw (its task was cancelled on the way out) moves it too,
/// so the Lease is read again and, if we still hold it, released from that read, once.
async fn release_lease(api: &Api<Lease>, name: &str, identity: &str, mut lease: Lease) -> Result<Lease, kube::Error> {
    let params = PostParams::default();
    clear_holder(&mut lease);
    match api.replace(name, &params, &lease).await {
        Err(kube::Error::Api(status)) if status.is_conflict() => {
            let mut fresh = api.get(name).await?;
            if fresh.spec.as_ref().and_then(|s| s.holder_identity.as_deref()) != Some(identity) {
                return Err(kube::Error::Api(status));
            }
            clear_holder(&mut fresh);
            api.replace(name, &params, &fresh).await
        }
        result => result,
    }
}

/// A Lease record with no holder, free to take at once.
fn clear_holder(lease: &mut Lease) {
    let now = MicroTime(Timestamp::now());
    let spec = lease.spec.get_or_insert_with(Default::default);
    spec.holder_identity = None;
    spec.lease_duration_seconds = Some(1);
    spec.renew_time = Some(now.clone());
    spec.acquire_time = Some(now);
}

/// What became of a held Lease on the way out ([`LeaderElector::release`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// We were not leading: nothing to give up.
    NotHeld,
    /// Handed over: a standby can take it at once.
    Released,
    /// Another candidate had already taken it.
    AlreadyTaken,
    /// The API server did not answer; standbys take the Lease when it expires.
    LeftToExpire,
    /// The API server refused the release (logged); standbys take the Lease when it expires.
    Refused,
}

impl std::fmt::Display for Release {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Release::NotHeld => "not held",
            Release::Released => "released",
            Release::AlreadyTaken => "already taken over",
            Release::LeftToExpire => "left to expire (API server unreachable)",
            Release::Refused => "left to expire (release refused)",
        })
    }
}

/// Runs the protocol against the API server.
pub struct LeaderElector {
    api: Api<Lease>,
    config: LeaderElectionConfig,
    observer: Observer,
    /// The Lease as last written or read, for the one-call renew fast path.
    last: Option<Lease>,
    status: watch::Sender<LeaderStatus>,
}

impl std::fmt::Debug for LeaderElector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderElector").field("config", &self.config).finish_non_exhaustive()
    }
}

/// The outcome of one attempt.
enum Attempt {
    Holding,
    Held { by: String },
}

impl LeaderElector {
    /// An elector for `config` using `client`.
    pub fn new(client: Client, config: LeaderElectionConfig) -> Self {
        let api = Api::namespaced(client, &config.namespace);
        let lease = format!("{}/{}", config.namespace, config.name);
        let (status, _) = watch::channel(LeaderStatus { lease, ..Default::default() });
        Self { api, config, observer: Observer::default(), last: None, status }
    }

    /// The settings.
    pub fn config(&self) -> &LeaderElectionConfig {
        &self.config
    }

    /// Follow this replica's leadership.
    pub fn subscribe(&self) -> watch::Receiver<LeaderStatus> {
        self.status.subscribe()
    }

    /// The current status.
    pub fn status(&self) -> LeaderStatus {
        self.status.borrow().clone()
    }

    fn set_status(&self, f: impl FnOnce(&mut LeaderStatus)) {
        self.status.send_if_modified(|s| {
            let before = s.clone();
            f(s);
            *s != before
        });
    }

    /// Wait until this replica holds the Lease. Returns false if `stop` fired first.
    pub async fn acquire(&mut self, stop: &CancellationToken) -> bool {
        tracing::info!(lease = %self.status().lease, identity = %self.config.identity, "attempting to acquire leader lease");
        loop {
            match self.attempt().await {
                Ok(Attempt::Holding) => {
                    tracing::info!(lease = %self.status().lease, identity = %self.config.identity, "successfully acquired lease");
                    return true;
                }
                Ok(Attempt::Held { by }) if !by.is_empty() => {
                    if self.status().holder.as_deref() != Some(by.as_str()) {
                        tracing::info!(lease = %self.status().lease, holder = %by, "new leader elected");
                    }
                    self.set_status(|s| s.holder = Some(by));
                }
                Ok(Attempt::Held { .. }) => {}
                Err(error) => tracing::warn!(%error, lease = %self.status().lease, "error retrieving lease"),
            }
            let pause = self.config.retry_period.mul_f64(1.0 + (JITTER - 1.0) * unit_random());
            tokio::select! {
                _ = stop.cancelled() => return false,
                _ = tokio::time::sleep(pause) => {}
            }
        }
    }

    /// Renew every `retryPeriod` until the Lease is lost or `stop` fires.
    pub async fn hold(&mut self, stop: &CancellationToken) -> TermEnd {
        let mut last_renew = self.status().last_renewed.unwrap_or_else(Instant::now);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return TermEnd::Stopped,
                _ = tokio::time::sleep(self.config.retry_period) => {}
            }
            let budget = self.config.renew_deadline.saturating_sub(last_renew.elapsed());
            let outcome = tokio::select! {
                _ = stop.cancelled() => return TermEnd::Stopped,
                r = tokio::time::timeout(budget, self.attempt()) => r,
            };
            match outcome {
                Ok(Ok(Attempt::Holding)) => {
                    last_renew = Instant::now();
                    continue;
                }
                Ok(Ok(Attempt::Held { by })) => {
                    tracing::warn!(lease = %self.status().lease, holder = %by, "leader lease taken by another candidate");
                    self.lose(Some(by).filter(|b| !b.is_empty()));
                    return TermEnd::Lost;
                }
                Ok(Err(error)) => tracing::warn!(%error, lease = %self.status().lease, "failed to renew lease"),
                Err(_) => tracing::warn!(lease = %self.status().lease, "renewing the lease timed out"),
            }
            if should_step_down(last_renew, Instant::now(), self.config.renew_deadline) {
                tracing::error!(lease = %self.status().lease, "leaderelection lost: could not renew within the renew deadline");
                self.lose(None);
                return TermEnd::Lost;
            }
        }
    }

    fn lose(&mut self, holder: Option<String>) {
        self.last = None;
        self.set_status(|s| {
            s.leading = false;
            s.last_renewed = None;
            s.holder = holder;
        });
    }

    /// Give the Lease up so a standby can take it at once (only if we still hold it).
    ///
    /// Called on the way out, when the API server may already be gone (a `kill %1 %2`, a node
    /// shutting down): the attempt is bounded by [`RELEASE_TIMEOUT`], and an unreachable server is
    /// an expected outcome, returned as [`Release::LeftToExpire`] for the caller's one closing
    /// line; standbys then take the Lease when it expires. An answer of the API server itself
    /// refusing the release (say, a 403) is logged as a warning and returned as
    /// [`Release::Refused`].
    pub async fn release(&mut self) -> Release {
        if !self.status().leading {
            return Release::NotHeld;
        }
        let Some(lease) = self.last.take() else { return Release::NotHeld };
        // kube's request tracing logs a refused connection at ERROR; for these requests that
        // is no news, so they run without a subscriber and the outcome is logged below instead.
        let request = release_lease(&self.api, &self.config.name, &self.config.identity, lease)
            .with_subscriber(tracing::subscriber::NoSubscriber::default());
        let result = tokio::time::timeout(RELEASE_TIMEOUT, request).await;
        self.lose(None);
        let lease = self.status().lease;
        // The caller's closing line reports the outcome; the details stay at debug.
        match result {
            Ok(Ok(_)) => {
                tracing::debug!(%lease, "released leader lease");
                Release::Released
            }
            // Someone else already moved the Lease on: nothing of ours to release.
            Ok(Err(kube::Error::Api(s))) if s.is_conflict() => Release::AlreadyTaken,
            Ok(Err(kube::Error::Api(status))) => {
                tracing::warn!(%lease, error = %status, "could not release the leader lease; standbys wait for it to expire");
                Release::Refused
            }
            Ok(Err(error)) => {
                tracing::debug!(%lease, %error, "API server unreachable; the leader lease expires by itself");
                Release::LeftToExpire
            }
            Err(_) => {
                tracing::debug!(%lease, timeout = ?RELEASE_TIMEOUT, "API server did not answer; the leader lease expires by itself");
                Release::LeftToExpire
            }
        }
    }

    /// One acquire-or-renew attempt.
    async fn attempt(&mut self) -> Result<Attempt, kube::Error> {
        // Fast path: renew from the Lease we last wrote; a conflict falls back to a read.
        if self.status().leading
            && let Some(lease) = self.last.clone()
        {
            match self.write(lease, false).await {
                Ok(()) => return Ok(Attempt::Holding),
                Err(kube::Error::Api(s)) if s.is_conflict() => {}
                Err(e) => return Err(e),
            }
        }
        let current = self.api.get_opt(&self.config.name).await?;
        let record = current.as_ref().map(LeaseRecord::from_lease);
        let now = Instant::now();
        self.observer.observe(record.as_ref(), now);
        let decision = decide(&self.config.identity, record.as_ref(), &self.observer, now);
        let result = match (decision, current) {
            (Decision::Create, _) => self.create().await,
            (Decision::Acquire, Some(lease)) => self.write(lease, true).await,
            (Decision::Renew, Some(lease)) => self.write(lease, false).await,
            (Decision::Wait { holder, .. }, _) => return Ok(Attempt::Held { by: holder }),
            // Acquire/Renew always come with a Lease.
            (_, None) => return Ok(Attempt::Held { by: String::new() }),
        };
        match result {
            Ok(()) => Ok(Attempt::Holding),
            // Another candidate wrote first; the next read tells who.
            Err(kube::Error::Api(s)) if s.is_conflict() || s.is_already_exists() => {
                let by = self.observer.record().and_then(|r| r.holder.clone()).unwrap_or_default();
                Ok(Attempt::Held { by })
            }
            Err(e) => Err(e),
        }
    }

    async fn create(&mut self) -> Result<(), kube::Error> {
        let now = MicroTime(Timestamp::now());
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(self.config.name.clone()),
                namespace: Some(self.config.namespace.clone()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(self.config.identity.clone()),
                lease_duration_seconds: Some(self.config.lease_duration.as_secs().max(1) as i32),
                acquire_time: Some(now.clone()),
                renew_time: Some(now),
                lease_transitions: Some(0),
                ..Default::default()
            }),
        };
        let created = self.api.create(&PostParams::default(), &lease).await?;
        self.held(created);
        Ok(())
    }

    /// Write `lease` with us as holder; `take` marks a change of holder.
    async fn write(&mut self, mut lease: Lease, take: bool) -> Result<(), kube::Error> {
        let now = MicroTime(Timestamp::now());
        let spec = lease.spec.get_or_insert_with(Default::default);
        if take {
            spec.acquire_time = Some(now.clone());
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        spec.holder_identity = Some(self.config.identity.clone());
        spec.lease_duration_seconds = Some(self.config.lease_duration.as_secs().max(1) as i32);
        spec.renew_time = Some(now);
        // The resourceVersion from the read makes this a compare-and-swap.
        let written = self.api.replace(&self.config.name, &PostParams::default(), &lease).await?;
        self.held(written);
        Ok(())
    }

    fn held(&mut self, lease: Lease) {
        let now = Instant::now();
        self.observer.observe(Some(&LeaseRecord::from_lease(&lease)), now);
        self.last = Some(lease);
        let identity = self.config.identity.clone();
        self.set_status(|s| {
            s.leading = true;
            s.holder = Some(identity);
            s.last_renewed = Some(now);
        });
    }
}

fn unit_random() -> f64 {
    (random_u64() >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(holder: Option<&str>, secs: u64, renewed: i64) -> LeaseRecord {
        LeaseRecord {
            holder: holder.map(Into::into),
            lease_duration: Duration::from_secs(secs),
            renew_time: Some(Timestamp::from_second(renewed).unwrap()),
            transitions: 0,
        }
    }

    #[test]
    fn a_missing_lease_is_created_and_a_released_one_taken_at_once() {
        let t0 = Instant::now();
        let obs = Observer::default();
        assert_eq!(decide("me", None, &obs, t0), Decision::Create);
        let mut obs = Observer::default();
        let released = record(None, 1, 100);
        obs.observe(Some(&released), t0);
        assert_eq!(decide("me", Some(&released), &obs, t0), Decision::Acquire);
    }

    #[test]
    fn our_own_lease_is_renewed() {
        let t0 = Instant::now();
        let mut obs = Observer::default();
        let mine = record(Some("me"), 15, 100);
        obs.observe(Some(&mine), t0);
        assert_eq!(decide("me", Some(&mine), &obs, t0 + Duration::from_secs(60)), Decision::Renew);
    }

    #[test]
    fn another_holders_lease_expires_lease_duration_after_it_last_changed_on_our_clock() {
        let t0 = Instant::now();
        let mut obs = Observer::default();
        let theirs = record(Some("other"), 15, 100);
        obs.observe(Some(&theirs), t0);
        let at = |s| t0 + Duration::from_secs(s);
        assert_eq!(
            decide("me", Some(&theirs), &obs, at(5)),
            Decision::Wait { holder: "other".into(), expires_in: Duration::from_secs(10) }
        );
        // The holder renews at t=10: the expiry clock restarts.
        let renewed = record(Some("other"), 15, 110);
        obs.observe(Some(&renewed), at(10));
        assert!(matches!(decide("me", Some(&renewed), &obs, at(20)), Decision::Wait { .. }));
        // Reading the same record again does not restart the clock.
        obs.observe(Some(&renewed), at(20));
        assert_eq!(decide("me", Some(&renewed), &obs, at(25)), Decision::Acquire);
    }

    #[test]
    fn the_holders_own_timestamps_are_not_trusted_as_a_clock() {
        // A holder whose clock is far in the past still gets a full lease from when we saw it.
        let t0 = Instant::now();
        let mut obs = Observer::default();
        let skewed = record(Some("other"), 15, 1);
        obs.observe(Some(&skewed), t0);
        assert!(matches!(decide("me", Some(&skewed), &obs, t0 + Duration::from_secs(14)), Decision::Wait { .. }));
    }

    #[test]
    fn a_leader_steps_down_once_the_renew_deadline_passes_without_a_renewal() {
        let t0 = Instant::now();
        let deadline = Duration::from_secs(10);
        assert!(!should_step_down(t0, t0 + Duration::from_secs(9), deadline));
        assert!(should_step_down(t0, t0 + Duration::from_secs(10), deadline));
    }

    #[test]
    fn health_fails_only_for_a_leader_stuck_past_lease_plus_tolerance() {
        let t0 = Instant::now();
        let lease = Duration::from_secs(15);
        let leading =
            LeaderStatus { lease: "kube-system/ccm".into(), leading: true, holder: None, last_renewed: Some(t0) };
        assert!(check_health(&leading, t0 + Duration::from_secs(35), lease, HEALTH_TOLERANCE).is_ok());
        let err = check_health(&leading, t0 + Duration::from_secs(36), lease, HEALTH_TOLERANCE).unwrap_err();
        assert!(err.contains("failed election to renew leadership"), "{err}");
        let standby = LeaderStatus { leading: false, ..leading };
        assert!(check_health(&standby, t0 + Duration::from_secs(3600), lease, HEALTH_TOLERANCE).is_ok());
    }

    #[test]
    fn identity_is_hostname_underscore_uuid_and_unique() {
        let a = default_identity();
        let b = default_identity();
        assert_ne!(a, b);
        let (host, uuid) = a.rsplit_once('_').unwrap();
        assert!(!host.is_empty());
        let parts: Vec<usize> = uuid.split('-').map(str::len).collect();
        assert_eq!(parts, [8, 4, 4, 4, 12], "{uuid}");
    }

    #[test]
    fn config_validation_follows_client_go_rules() {
        let ok = LeaderElectionConfig::default();
        assert!(ok.validate().is_ok());
        assert_eq!(ok.lease_duration, Duration::from_secs(15));
        assert_eq!(ok.renew_deadline, Duration::from_secs(10));
        assert_eq!(ok.retry_period, Duration::from_secs(2));
        let bad = LeaderElectionConfig { renew_deadline: Duration::from_secs(15), ..ok.clone() };
        assert!(bad.validate().unwrap_err().contains("lease-duration"));
        let bad = LeaderElectionConfig { retry_period: Duration::from_secs(9), ..ok.clone() };
        assert!(bad.validate().unwrap_err().contains("retry-period"));
    }

    #[tokio::test]
    async fn a_renewal_whose_answer_was_lost_does_not_keep_the_lease_from_being_released() {
        let server = testkit::TestApiServer::start().await.unwrap();
        let config = LeaderElectionConfig::new("kube-system", "lost-renewal");
        let identity = config.identity.clone();
        let mut elector = LeaderElector::new(server.client(), config);
        assert!(elector.acquire(&CancellationToken::new()).await, "the Lease is free");
        // A renewal that reached the API server but whose answer the cancelled task never read:
        // the Lease moved on under the same holder.
        let api: Api<Lease> = Api::namespaced(server.client(), "kube-system");
        let mut moved = api.get("lost-renewal").await.unwrap();
        moved.spec.as_mut().unwrap().renew_time = Some(MicroTime(Timestamp::now()));
        api.replace("lost-renewal", &PostParams::default(), &moved).await.unwrap();

        assert!(matches!(elector.release().await, Release::Released));
        let after = api.get("lost-renewal").await.unwrap();
        assert_eq!(after.spec.unwrap().holder_identity, None, "released, not left to expire");

        // Another candidate that took the Lease meanwhile keeps it.
        let mut elector = LeaderElector::new(server.client(), LeaderElectionConfig::new("kube-system", "taken"));
        assert!(elector.acquire(&CancellationToken::new()).await);
        let mut taken = api.get("taken").await.unwrap();
        taken.spec.as_mut().unwrap().holder_identity = Some("someone-else".into());
        api.replace("taken", &PostParams::default(), &taken).await.unwrap();
        assert!(matches!(elector.release().await, Release::AlreadyTaken));
        let kept = api.get("taken").await.unwrap();
        assert_eq!(kept.spec.unwrap().holder_identity.as_deref(), Some("someone-else"));
        assert_ne!(identity, "someone-else");
        server.shutdown().await;
    }

    #[tokio::test]
    async fn releasing_after_the_api_server_is_gone_is_quick_quiet_and_reports_left_to_expire() {
        let server = testkit::TestApiServer::start().await.unwrap();
        let mut elector = LeaderElector::new(server.client(), LeaderElectionConfig::new("kube-system", "release-test"));
        assert!(elector.acquire(&CancellationToken::new()).await, "the Lease is free");
        assert!(elector.status().leading);
        // Stopped before the manager, as `kill %1 %2` does.
        server.shutdown().await;

        let logs = crate::test_log::Captured::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(logs.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .finish();
        let _guard = tracing::subscriber::set_default(subscriber);
        let started = std::time::Instant::now();
        let result = elector.release().await;
        let took = started.elapsed();
        drop(_guard);

        let text = logs.text();
        assert!(
            matches!(result, Release::LeftToExpire),
            "an unreachable API server is not an error on the way out: {result:?}"
        );
        assert!(took <= RELEASE_TIMEOUT + Duration::from_secs(1), "release took {took:?}");
        assert!(!elector.status().leading);
        // The caller's closing line carries the outcome; nothing at INFO or above from here.
        assert!(text.is_empty(), "no line at INFO or above: {text}");
    }
}
