//! The cloud-node controller's work queue: deduplicated Node names, collected into batches over
//! a short window, with per-node exponential backoff on failure. Pure bookkeeping (time is
//! passed in), so it is tested without a server or a clock.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

/// First retry delay after a failure.
pub const BACKOFF_BASE: Duration = Duration::from_millis(250);
/// Longest retry delay (upstream's per-item cap).
pub const BACKOFF_MAX: Duration = Duration::from_secs(1000);

/// The delay before retry number `failures` (1 for the first failure).
pub fn backoff_delay(failures: u32) -> Duration {
    let shift = failures.saturating_sub(1).min(32);
    BACKOFF_BASE.saturating_mul(1u32 << shift.min(31)).min(BACKOFF_MAX)
}

/// Deduplicating batch queue with per-item backoff.
#[derive(Debug, Default)]
pub struct BatchQueue {
    /// Ready names with the instant they became ready.
    ready: VecDeque<(String, Instant)>,
    queued: HashSet<String>,
    /// Names waiting out a backoff, by due time; stale heap entries are skipped.
    delayed: BinaryHeap<Reverse<(Instant, String)>>,
    due: HashMap<String, Instant>,
    failures: HashMap<String, u32>,
    in_flight: HashSet<String>,
    /// Names that changed while in flight: looked at again when their batch ends.
    dirty: HashSet<String>,
}

impl BatchQueue {
    /// An empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    /// Queue `name` for the next batch, unless it is already queued, in flight (then it is
    /// looked at again after), or waiting out a backoff (a heartbeat must not cut it short).
    pub fn add(&mut self, name: &str, now: Instant) {
        if self.in_flight.contains(name) {
            self.dirty.insert(name.to_string());
        } else if !self.queued.contains(name) && !self.due.contains_key(name) {
            self.push_ready(name.to_string(), now);
        }
    }

    /// Like [`Self::add`], but also ends a pending backoff: the Node itself changed, so the
    /// reason it failed may be gone. The failure count is kept.
    pub fn add_now(&mut self, name: &str, now: Instant) {
        if self.due.remove(name).is_some() {
            self.push_ready(name.to_string(), now);
        } else {
            self.add(name, now);
        }
    }

    fn push_ready(&mut self, name: String, now: Instant) {
        if self.queued.insert(name.clone()) {
            self.ready.push_back((name, now));
        }
    }

    /// Retry `name` after its backoff; `after` overrides the delay (a provider's RetryAfter).
    pub fn retry(&mut self, name: &str, now: Instant, after: Option<Duration>) -> Duration {
        let failures = self.failures.entry(name.to_string()).or_insert(0);
        *failures = failures.saturating_add(1);
        let delay = after.unwrap_or_else(|| backoff_delay(*failures));
        let at = now + delay;
        self.due.insert(name.to_string(), at);
        self.delayed.push(Reverse((at, name.to_string())));
        delay
    }

    /// Forget the failure history of `name` (it succeeded).
    pub fn forget(&mut self, name: &str) {
        self.failures.remove(name);
    }

    /// Drop every trace of `name` (the Node was deleted).
    pub fn remove(&mut self, name: &str) {
        self.failures.remove(name);
        self.due.remove(name);
        self.dirty.remove(name);
        if self.queued.remove(name) {
            self.ready.retain(|(n, _)| n != name);
        }
    }

    /// Failures recorded for `name`.
    pub fn failures(&self, name: &str) -> u32 {
        self.failures.get(name).copied().unwrap_or(0)
    }

    /// Whether `name` is waiting out a backoff.
    pub fn is_delayed(&self, name: &str) -> bool {
        self.due.contains_key(name)
    }

    /// Move names whose backoff has expired to the ready list.
    pub fn promote_due(&mut self, now: Instant) {
        while let Some(Reverse((at, _))) = self.delayed.peek() {
            if *at > now {
                break;
            }
            let Some(Reverse((at, name))) = self.delayed.pop() else { break };
            // Only the latest schedule for a name counts.
            if self.due.get(&name) == Some(&at) {
                self.due.remove(&name);
                if self.in_flight.contains(&name) {
                    self.dirty.insert(name);
                } else {
                    // Ready as of its due time, so the window is not added on top of the backoff.
                    self.push_ready(name, at);
                }
            }
        }
    }

    /// Take a batch of at most `max` names when the batch is full or the oldest name has waited
    /// `window`. Taken names are in flight until [`Self::done`].
    pub fn take_batch(&mut self, max: usize, window: Duration, now: Instant) -> Option<Vec<String>> {
        let (_, oldest) = self.ready.front()?;
        if self.ready.len() < max && now < *oldest + window {
            return None;
        }
        let n = self.ready.len().min(max.max(1));
        let batch: Vec<String> = self.ready.drain(..n).map(|(name, _)| name).collect();
        for name in &batch {
            self.queued.remove(name);
            self.in_flight.insert(name.clone());
        }
        Some(batch)
    }

    /// `name`'s batch finished; returns whether it changed meanwhile and should be looked at
    /// again (the caller decides, from the current object, whether to [`Self::add`] it).
    pub fn done(&mut self, name: &str) -> bool {
        self.in_flight.remove(name);
        self.dirty.remove(name)
    }

    /// When something next becomes actionable: a ready batch's window closing or a backoff
    /// ending. `None` when nothing is waiting.
    pub fn next_deadline(&self, window: Duration) -> Option<Instant> {
        let window_end = self.ready.front().map(|(_, at)| *at + window);
        let backoff_end = self.delayed.peek().map(|Reverse((at, _))| *at);
        match (window_end, backoff_end) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// When the earliest backoff ends, if any Node is backing off.
    pub fn next_backoff(&self) -> Option<Instant> {
        self.delayed.peek().map(|Reverse((at, _))| *at)
    }

    /// Names waiting for a batch.
    pub fn ready_len(&self) -> usize {
        self.ready.len()
    }

    /// Names in flight.
    pub fn in_flight_len(&self) -> usize {
        self.in_flight.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: Duration = Duration::from_millis(100);

    #[test]
    fn names_are_batched_after_the_window_or_when_full() {
        let t0 = Instant::now();
        let mut q = BatchQueue::new();
        q.add("a", t0);
        q.add("b", t0 + Duration::from_millis(50));
        q.add("a", t0 + Duration::from_millis(60));
        assert_eq!(q.take_batch(10, W, t0 + Duration::from_millis(99)), None);
        assert_eq!(q.next_deadline(W), Some(t0 + W));
        assert_eq!(q.take_batch(10, W, t0 + W), Some(vec!["a".to_string(), "b".to_string()]));
        for n in ["c", "d", "e"] {
            q.add(n, t0 + W);
        }
        assert_eq!(
            q.take_batch(2, W, t0 + W),
            Some(vec!["c".to_string(), "d".to_string()]),
            "a full batch goes at once"
        );
        assert_eq!(q.take_batch(2, W, t0 + W), None);
        assert_eq!(q.ready_len(), 1);
    }

    #[test]
    fn a_name_changed_in_flight_is_reported_dirty_once() {
        let t0 = Instant::now();
        let mut q = BatchQueue::new();
        q.add("a", t0);
        q.take_batch(1, W, t0).unwrap();
        q.add("a", t0);
        assert_eq!(q.ready_len(), 0, "not queued twice while in flight");
        assert!(q.done("a"));
        q.add("b", t0);
        q.take_batch(1, W, t0).unwrap();
        assert!(!q.done("b"));
    }

    #[test]
    fn failures_back_off_exponentially_and_heartbeats_do_not_cut_the_wait() {
        let t0 = Instant::now();
        let mut q = BatchQueue::new();
        q.add("a", t0);
        q.take_batch(1, W, t0).unwrap();
        q.done("a");
        assert_eq!(q.retry("a", t0, None), BACKOFF_BASE);
        q.add("a", t0 + Duration::from_millis(10));
        assert_eq!(q.ready_len(), 0, "a plain add does not skip the backoff");
        q.promote_due(t0 + BACKOFF_BASE - Duration::from_millis(1));
        assert_eq!(q.ready_len(), 0);
        q.promote_due(t0 + BACKOFF_BASE);
        assert_eq!(q.ready_len(), 1);
        // Ready as of its due time: the batch window does not stack on the backoff.
        assert!(q.take_batch(10, W, t0 + BACKOFF_BASE + W).is_some());
        q.done("a");
        assert_eq!(q.retry("a", t0, None), BACKOFF_BASE * 2);
        assert_eq!(q.failures("a"), 2);
        q.forget("a");
        assert_eq!(q.failures("a"), 0);
    }

    #[test]
    fn a_real_change_ends_the_backoff_and_keeps_the_count() {
        let t0 = Instant::now();
        let mut q = BatchQueue::new();
        q.retry("a", t0, None);
        q.add_now("a", t0);
        assert_eq!(q.ready_len(), 1);
        assert!(!q.is_delayed("a"));
        assert_eq!(q.failures("a"), 1);
        // The stale heap entry is ignored when it comes due.
        q.take_batch(1, W, t0 + W).unwrap();
        q.done("a");
        q.promote_due(t0 + BACKOFF_MAX);
        assert_eq!(q.ready_len(), 0);
    }

    #[test]
    fn requested_delay_overrides_backoff_and_remove_forgets_everything() {
        let t0 = Instant::now();
        let mut q = BatchQueue::new();
        assert_eq!(q.retry("a", t0, Some(Duration::from_secs(7))), Duration::from_secs(7));
        assert_eq!(q.next_deadline(W), Some(t0 + Duration::from_secs(7)));
        q.remove("a");
        q.promote_due(t0 + Duration::from_secs(8));
        assert_eq!(q.ready_len(), 0);
        assert_eq!(q.failures("a"), 0);
    }

    #[test]
    fn backoff_is_capped() {
        assert_eq!(backoff_delay(1), BACKOFF_BASE);
        assert_eq!(backoff_delay(3), BACKOFF_BASE * 4);
        assert_eq!(backoff_delay(40), BACKOFF_MAX);
        assert_eq!(backoff_delay(u32::MAX), BACKOFF_MAX);
    }
}
