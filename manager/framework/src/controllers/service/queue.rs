//! A work queue of Service keys with client-go's guarantees: a key is handed to one worker at a
//! time, a key added while it is being processed is processed again afterwards, delayed adds
//! keep the earliest time, and failures back off exponentially per key: cloud failures from 5 s
//! to 300 s, failed API writes on their own count from 200 ms to 5 s (S32).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::logic::{api_backoff_delay, backoff_delay};

/// Whether another party may work on a key right now (see [`WorkQueue::try_claim`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// The caller now holds the key and must call [`WorkQueue::done`].
    Claimed,
    /// A worker holds the key.
    Busy,
    /// The key is waiting for a worker, which will see the latest state anyway.
    Queued,
}

#[derive(Default)]
struct State {
    queue: VecDeque<String>,
    dirty: HashSet<String>,
    processing: HashSet<String>,
    waiting: BinaryHeap<Reverse<(Instant, String)>>,
    ready_at: HashMap<String, Instant>,
    failures: HashMap<String, u32>,
    /// S32: failed API writes since the last success, counted apart from `failures`.
    api_failures: HashMap<String, u32>,
}

impl State {
    /// Returns whether the key became available to a worker.
    fn add(&mut self, key: String) -> bool {
        if !self.dirty.insert(key.clone()) {
            return false;
        }
        if self.processing.contains(&key) {
            return false;
        }
        self.queue.push_back(key);
        true
    }

    /// Move due delayed keys to the queue; returns how many became available.
    fn promote(&mut self, now: Instant) -> usize {
        let mut made_ready = 0;
        while let Some(Reverse((at, _))) = self.waiting.peek() {
            if *at > now {
                break;
            }
            let Some(Reverse((at, key))) = self.waiting.pop() else { break };
            // Stale heap entries (superseded by an earlier time) are skipped.
            if self.ready_at.get(&key) == Some(&at) {
                self.ready_at.remove(&key);
                made_ready += usize::from(self.add(key));
            }
        }
        made_ready
    }
}

/// The service controller's queue; shared by its workers and its node pass.
#[derive(Default)]
pub struct WorkQueue {
    state: Mutex<State>,
    notify: Notify,
}

impl WorkQueue {
    /// An empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queue `key` now.
    pub fn add(&self, key: impl Into<String>) {
        if self.lock().add(key.into()) {
            self.notify.notify_one();
        }
    }

    /// Queue `key` after `delay`; an earlier pending time wins.
    pub fn add_after(&self, key: impl Into<String>, delay: Duration) {
        if delay.is_zero() {
            return self.add(key);
        }
        let key = key.into();
        let at = Instant::now() + delay;
        let mut state = self.lock();
        if state.ready_at.get(&key).is_some_and(|t| *t <= at) {
            return;
        }
        state.ready_at.insert(key.clone(), at);
        state.waiting.push(Reverse((at, key)));
        drop(state);
        // Wake a worker so it sleeps until the new, possibly earlier, deadline.
        self.notify.notify_one();
    }

    /// Queue `key` after its next backoff delay (5 s, 10 s, ... 300 s) and return the delay.
    pub fn add_rate_limited(&self, key: impl Into<String>) -> Duration {
        self.add_rate_limited_at_most(key, super::logic::BACKOFF_MAX)
    }

    /// [`Self::add_rate_limited`] with the delay capped at `max`.
    pub fn add_rate_limited_at_most(&self, key: impl Into<String>, max: Duration) -> Duration {
        let key = key.into();
        let delay = {
            let mut state = self.lock();
            let n = state.failures.entry(key.clone()).or_insert(0);
            *n = n.saturating_add(1);
            backoff_delay(*n).min(max)
        };
        self.add_after(key, delay);
        delay
    }

    /// S32: queue `key` after its next API back-off delay (200 ms, 400 ms, ... 5 s) and return
    /// the delay. The cloud back-off's count is left as it is.
    pub fn add_api_rate_limited(&self, key: impl Into<String>) -> Duration {
        let key = key.into();
        let delay = {
            let mut state = self.lock();
            let n = state.api_failures.entry(key.clone()).or_insert(0);
            *n = n.saturating_add(1);
            api_backoff_delay(*n)
        };
        self.add_after(key, delay);
        delay
    }

    /// Reset the key's backoffs, the cloud's and the API's.
    pub fn forget(&self, key: &str) {
        let mut state = self.lock();
        state.failures.remove(key);
        state.api_failures.remove(key);
    }

    /// How many API writes of the key failed since its last [`Self::forget`].
    pub fn api_failures(&self, key: &str) -> u32 {
        self.lock().api_failures.get(key).copied().unwrap_or(0)
    }

    /// How many failures the key has had since its last [`Self::forget`].
    pub fn failures(&self, key: &str) -> u32 {
        self.lock().failures.get(key).copied().unwrap_or(0)
    }

    /// Keys waiting for a worker now (not counting delayed ones).
    pub fn len(&self) -> usize {
        self.lock().queue.len()
    }

    /// Whether no key is waiting for a worker now.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keys waiting for a worker, being processed, or delayed.
    pub fn pending(&self) -> usize {
        let s = self.lock();
        s.dirty.len() + s.processing.len() + s.ready_at.len()
    }

    /// Take the key for work outside the workers (the node pass), unless a worker holds it or
    /// it is queued.
    pub fn try_claim(&self, key: &str) -> Claim {
        let mut state = self.lock();
        if state.processing.contains(key) {
            Claim::Busy
        } else if state.dirty.contains(key) {
            Claim::Queued
        } else {
            state.processing.insert(key.to_string());
            Claim::Claimed
        }
    }

    /// The next key to process, waiting until one is available; `None` on shutdown.
    pub async fn next(&self, shutdown: &CancellationToken) -> Option<String> {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let (deadline, woke) = {
                let mut state = self.lock();
                let woke = state.promote(Instant::now());
                if let Some(key) = state.queue.pop_front() {
                    state.dirty.remove(&key);
                    state.processing.insert(key.clone());
                    drop(state);
                    // Others may take the rest of what just became due.
                    for _ in 1..woke {
                        self.notify.notify_one();
                    }
                    return Some(key);
                }
                (state.waiting.peek().map(|Reverse((at, _))| *at), woke)
            };
            debug_assert_eq!(woke, 0);
            let sleep = async {
                match deadline {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = shutdown.cancelled() => return None,
                _ = &mut notified => {}
                _ = sleep => {}
            }
        }
    }

    /// Release a key taken with [`Self::next`] or [`Self::try_claim`]; re-queues it if it was
    /// added meanwhile.
    pub fn done(&self, key: &str) {
        let mut state = self.lock();
        state.processing.remove(key);
        if state.dirty.contains(key) {
            state.queue.push_back(key.to_string());
            drop(state);
            self.notify.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[tokio::test]
    async fn s23_a_key_is_never_handed_out_twice_at_once_and_is_redone_if_added_meanwhile() {
        let q = WorkQueue::new();
        let stop = CancellationToken::new();
        q.add("a");
        q.add("a");
        q.add("b");
        assert_eq!(q.next(&stop).await.as_deref(), Some("a"));
        q.add("a"); // while processing
        assert_eq!(q.next(&stop).await.as_deref(), Some("b"));
        assert!(q.is_empty(), "a waits for its worker to finish");
        q.done("a");
        assert_eq!(q.next(&stop).await.as_deref(), Some("a"));
        q.done("a");
        q.done("b");
        assert_eq!(q.pending(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn delayed_adds_keep_the_earliest_time() {
        let q = WorkQueue::new();
        let stop = CancellationToken::new();
        let t0 = Instant::now();
        q.add_after("a", Duration::from_secs(10));
        q.add_after("a", Duration::from_secs(3));
        q.add_after("a", Duration::from_secs(20));
        assert_eq!(q.next(&stop).await.as_deref(), Some("a"));
        assert_eq!(Instant::now() - t0, Duration::from_secs(3));
        q.done("a");
        // The superseded entries do not bring it back.
        stop.cancel();
        assert_eq!(q.next(&stop).await, None);
        assert_eq!(q.pending(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn s12_failures_back_off_per_key_until_forgotten() {
        let q = WorkQueue::new();
        assert_eq!(q.add_rate_limited("a"), Duration::from_secs(5));
        assert_eq!(q.add_rate_limited("a"), Duration::from_secs(10));
        assert_eq!(q.add_rate_limited("b"), Duration::from_secs(5));
        assert_eq!(q.failures("a"), 2);
        q.forget("a");
        assert_eq!(q.add_rate_limited("a"), Duration::from_secs(5));
    }

    #[tokio::test(start_paused = true)]
    async fn s32_api_failures_back_off_on_their_own_and_never_lengthen_the_cloud_backoff() {
        let q = WorkQueue::new();
        let stop = CancellationToken::new();
        assert_eq!(q.add_rate_limited("a"), Duration::from_secs(5));
        assert_eq!(q.add_rate_limited("a"), Duration::from_secs(10));
        // A long API outage: many failed writes.
        let api: Vec<u128> = (0..10).map(|_| q.add_api_rate_limited("a").as_millis()).collect();
        assert_eq!(&api[..6], [200, 400, 800, 1600, 3200, 5000]);
        assert!(api.iter().all(|d| *d <= 5000), "{api:?}");
        assert_eq!((q.failures("a"), q.api_failures("a")), (2, 10), "the cloud count is untouched");
        // The key is due at the earliest time queued (the first API retry), not after 10 s.
        let t0 = Instant::now();
        assert_eq!(q.next(&stop).await.as_deref(), Some("a"));
        assert!(Instant::now() - t0 <= Duration::from_millis(200));
        q.done("a");
        // The next cloud failure continues where the cloud left off.
        assert_eq!(q.add_rate_limited("a"), Duration::from_secs(20));
        q.forget("a");
        assert_eq!((q.failures("a"), q.api_failures("a")), (0, 0));
        assert_eq!(q.add_api_rate_limited("a"), Duration::from_millis(200));
    }

    #[tokio::test]
    async fn s27_refusals_back_off_from_five_seconds_to_at_most_thirty() {
        let q = WorkQueue::new();
        let max = super::super::logic::REFUSED_BACKOFF_MAX;
        let got: Vec<u64> = (0..6).map(|_| q.add_rate_limited_at_most("a", max).as_secs()).collect();
        assert_eq!(got, [5, 10, 20, 30, 30, 30]);
    }

    #[tokio::test]
    async fn claims_respect_workers_and_queued_keys() {
        let q = WorkQueue::new();
        let stop = CancellationToken::new();
        assert_eq!(q.try_claim("a"), Claim::Claimed);
        q.add("a");
        assert!(q.is_empty(), "a claimed key is not handed to workers");
        q.done("a");
        assert_eq!(q.try_claim("a"), Claim::Queued);
        assert_eq!(q.next(&stop).await.as_deref(), Some("a"));
        assert_eq!(q.try_claim("a"), Claim::Busy);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn many_workers_drain_every_key_once() {
        let q = Arc::new(WorkQueue::new());
        let stop = CancellationToken::new();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let (q, stop, seen) = (q.clone(), stop.clone(), seen.clone());
            tasks.push(tokio::spawn(async move {
                while let Some(k) = q.next(&stop).await {
                    seen.lock().unwrap().push(k.clone());
                    tokio::task::yield_now().await;
                    q.done(&k);
                }
            }));
        }
        for i in 0..500 {
            q.add(format!("k{i}"));
            if i % 7 == 0 {
                q.add_after(format!("d{i}"), Duration::from_millis(5));
            }
        }
        while q.pending() > 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        stop.cancel();
        for t in tasks {
            t.await.unwrap();
        }
        let mut seen = seen.lock().unwrap().clone();
        seen.sort();
        let before = seen.len();
        seen.dedup();
        assert_eq!(before, seen.len(), "no key processed twice");
        assert_eq!(seen.len(), 500 + 72);
    }
}
