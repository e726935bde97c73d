//! What the controller remembers about each resource between its reconciles, in one place:
//! retry counts, transient failures, a rollout in flight, a teardown waiting for Pods, a
//! cloud-config that ran past the time limit, and which newer resources lost a conflict to it.
//! Forgotten when the resource is cleaned up.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::status::TransientFailures;

/// What is remembered of one resource (by UID).
#[derive(Debug, Default)]
struct Remembered {
    /// Failed reconciles in a row (the error policy's back-off).
    errors: u32,
    /// Reconciles in a row with transient failures (their requeue's back-off).
    transient_retries: u32,
    /// The transient failures and since when they last.
    failures: TransientFailures,
    /// Its new pod template was applied and its workload controller has not observed it yet:
    /// the cached CR may not show the `Progressing=True` written for it.
    rollout: bool,
    /// Since when the deletion of its manager's RBAC waits for its Pods.
    teardown_since: Option<Instant>,
    /// The hash of the cloud-config whose check ran past the time limit: the same content is
    /// refused at once next time instead of tying up another thread.
    timed_out: Option<String>,
}

impl Remembered {
    /// Whether nothing is remembered (the entry can go).
    fn is_empty(&self) -> bool {
        self.errors == 0
            && self.transient_retries == 0
            && self.failures.causes.is_empty()
            && self.failures.since.is_none()
            && !self.rollout
            && self.teardown_since.is_none()
            && self.timed_out.is_none()
    }
}

#[derive(Debug, Default)]
struct State {
    /// By UID.
    resources: HashMap<String, Remembered>,
    /// For each CR (`namespace/name`), the newer CRs that conflict with it.
    losers: HashMap<String, BTreeSet<String>>,
}

impl State {
    /// Change what is remembered of `uid`, if anything is, and drop the entry once empty.
    fn update(&mut self, uid: &str, change: impl FnOnce(&mut Remembered)) {
        if let Some(r) = self.resources.get_mut(uid) {
            change(r);
            if r.is_empty() {
                self.resources.remove(uid);
            }
        }
    }
}

/// The controller's memory of every resource.
#[derive(Debug, Default)]
pub struct Memory {
    state: Mutex<State>,
}

impl Memory {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Count one more failed reconcile of `uid`; returns how many in a row.
    pub fn failed_reconcile(&self, uid: &str) -> u32 {
        let mut state = self.lock();
        let r = state.resources.entry(uid.to_string()).or_default();
        r.errors = r.errors.saturating_add(1);
        r.errors
    }

    /// A reconcile of `uid` succeeded: its failed-reconcile streak ends.
    pub fn reconciled(&self, uid: &str) {
        self.lock().update(uid, |r| r.errors = 0);
    }

    /// Count one more reconcile of `uid` with transient failures (`true`), or end the streak;
    /// returns how many in a row.
    pub fn transient_retry(&self, uid: &str, failing: bool) -> u32 {
        let mut state = self.lock();
        if !failing {
            state.update(uid, |r| r.transient_retries = 0);
            return 0;
        }
        let r = state.resources.entry(uid.to_string()).or_default();
        r.transient_retries = r.transient_retries.saturating_add(1);
        r.transient_retries
    }

    /// Record this reconcile's transient failures; returns the streak and which causes are new.
    pub fn track_failures(
        &self,
        uid: &str,
        mut causes: Vec<(&'static str, String)>,
        now: &Time,
    ) -> (TransientFailures, Vec<(&'static str, String)>) {
        causes.sort();
        causes.dedup();
        let mut state = self.lock();
        if causes.is_empty() {
            state.update(uid, |r| r.failures = TransientFailures::default());
            return (TransientFailures::default(), Vec::new());
        }
        let entry = &mut state.resources.entry(uid.to_string()).or_default().failures;
        let new: Vec<_> = causes.iter().filter(|c| !entry.causes.contains(c)).cloned().collect();
        entry.since.get_or_insert_with(|| now.clone());
        entry.causes = causes;
        (entry.clone(), new)
    }

    /// Whether a rollout of `uid` counts as started: this reconcile `started` one, or one is
    /// still in flight while the workload controller has not observed it (`awaiting`).
    pub fn rollout(&self, uid: &str, started: bool, awaiting: bool) -> bool {
        let mut state = self.lock();
        if started {
            state.resources.entry(uid.to_string()).or_default().rollout = true;
        }
        let in_flight = state.resources.get(uid).is_some_and(|r| r.rollout) && awaiting;
        if !in_flight {
            state.update(uid, |r| r.rollout = false);
        }
        started || in_flight
    }

    /// How long the deletion of `uid`'s RBAC has waited for its Pods (from now, the first
    /// time it is asked).
    pub fn teardown_waited(&self, uid: &str) -> Duration {
        let mut state = self.lock();
        let r = state.resources.entry(uid.to_string()).or_default();
        r.teardown_since.get_or_insert_with(Instant::now).elapsed()
    }

    /// The deletion of `uid`'s RBAC waits no longer.
    pub fn teardown_over(&self, uid: &str) {
        self.lock().update(uid, |r| r.teardown_since = None);
    }

    /// The hash of `uid`'s cloud-config that ran past the time limit, if one did.
    pub fn timed_out(&self, uid: &str) -> Option<String> {
        self.lock().resources.get(uid).and_then(|r| r.timed_out.clone())
    }

    /// Remember (`Some`) or forget (`None`) that `uid`'s cloud-config of hash `content` ran past
    /// the time limit.
    pub fn set_timed_out(&self, uid: &str, content: Option<String>) {
        let mut state = self.lock();
        match content {
            Some(hash) => state.resources.entry(uid.to_string()).or_default().timed_out = Some(hash),
            None => state.update(uid, |r| r.timed_out = None),
        }
    }

    /// Set the newer CRs that lost a conflict to `key` (`namespace/name`); returns those whose
    /// verdict may have changed (they lost or stopped losing).
    pub fn set_losers(&self, key: &str, now_losers: BTreeSet<String>) -> BTreeSet<String> {
        let mut state = self.lock();
        let before = if now_losers.is_empty() {
            state.losers.remove(key)
        } else {
            state.losers.insert(key.to_string(), now_losers.clone())
        }
        .unwrap_or_default();
        before.symmetric_difference(&now_losers).cloned().collect()
    }

    /// Record `loser` among the losers of each of `winners`.
    pub fn add_loser(&self, winners: &[String], loser: &str) {
        let mut state = self.lock();
        for winner in winners {
            state.losers.entry(winner.clone()).or_default().insert(loser.to_string());
        }
    }

    /// Forget everything about `uid` (it was cleaned up).
    pub fn forget(&self, uid: &str) {
        self.lock().resources.remove(uid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streaks_count_up_and_end() {
        let m = Memory::default();
        assert_eq!((m.failed_reconcile("a"), m.failed_reconcile("a")), (1, 2));
        m.reconciled("a");
        assert_eq!(m.failed_reconcile("a"), 1);
        assert_eq!((m.transient_retry("a", true), m.transient_retry("a", true)), (1, 2));
        assert_eq!(m.transient_retry("a", false), 0);
        assert_eq!(m.transient_retry("a", true), 1);
    }

    #[test]
    fn a_rollout_stays_started_until_the_workload_controller_observed_it() {
        let m = Memory::default();
        assert!(!m.rollout("a", false, true), "none started");
        assert!(m.rollout("a", true, true));
        assert!(m.rollout("a", false, true), "in flight");
        assert!(!m.rollout("a", false, false), "observed");
        assert!(!m.rollout("a", false, true), "over");
    }

    #[test]
    fn losers_report_who_changed_and_everything_is_forgotten_with_the_resource() {
        let m = Memory::default();
        let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
        assert_eq!(m.set_losers("ns/old", set(&["ns/b", "ns/c"])), set(&["ns/b", "ns/c"]));
        assert_eq!(m.set_losers("ns/old", set(&["ns/c"])), set(&["ns/b"]));
        m.add_loser(&["ns/old".to_string()], "ns/d");
        assert_eq!(m.set_losers("ns/old", BTreeSet::new()), set(&["ns/c", "ns/d"]));
        m.set_timed_out("u", Some("h".into()));
        assert_eq!(m.timed_out("u").as_deref(), Some("h"));
        m.forget("u");
        assert_eq!(m.timed_out("u"), None);
    }

    #[test]
    fn a_resource_with_nothing_left_to_remember_takes_no_room() {
        let m = Memory::default();
        m.failed_reconcile("a");
        m.rollout("a", true, true);
        m.reconciled("a");
        m.rollout("a", false, false);
        assert!(m.lock().resources.is_empty());
    }
}
