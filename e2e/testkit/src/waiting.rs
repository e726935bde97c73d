//! Waiting for a condition in tests: one polling loop, with a deadline and a failure that names
//! what was awaited.
//!
//! A check answers `bool` (the condition holds or not) or `Option<T>` (the value, once there);
//! [`eventually`] and [`eventually_within`] return that value or panic, [`poll_within`] gives
//! `None` instead of panicking (for "this does not happen" checks).

use std::future::Future;
use std::time::{Duration, Instant};

/// How long a test waits for one expectation unless it says otherwise.
pub const WAIT: Duration = Duration::from_secs(30);

/// How often a condition is checked again.
pub const POLL: Duration = Duration::from_millis(20);

/// What a check answers: `bool`, or `Option<T>` carrying the value once there.
pub trait Settled {
    /// What the wait returns once the condition holds.
    type Value;
    /// The value, once the condition holds.
    fn settled(self) -> Option<Self::Value>;
}

impl Settled for bool {
    type Value = ();
    fn settled(self) -> Option<()> {
        self.then_some(())
    }
}

impl<T> Settled for Option<T> {
    type Value = T;
    fn settled(self) -> Option<T> {
        self
    }
}

/// Re-runs `check` until it holds and returns its value; panics naming `what` after [`WAIT`].
pub async fn eventually<S, F, Fut>(what: &str, check: F) -> S::Value
where
    S: Settled,
    F: FnMut() -> Fut,
    Fut: Future<Output = S>,
{
    eventually_within(what, WAIT, check).await
}

/// [`eventually`] with its own deadline.
pub async fn eventually_within<S, F, Fut>(what: &str, within: Duration, check: F) -> S::Value
where
    S: Settled,
    F: FnMut() -> Fut,
    Fut: Future<Output = S>,
{
    match poll_within(within, check).await {
        Some(value) => value,
        None => panic!("timed out waiting for {what} (within {within:?})"),
    }
}

/// Re-runs `check` until it holds and returns its value, or `None` once `within` has passed.
pub async fn poll_within<S, F, Fut>(within: Duration, mut check: F) -> Option<S::Value>
where
    S: Settled,
    F: FnMut() -> Fut,
    Fut: Future<Output = S>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(value) = check().await.settled() {
            return Some(value);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[tokio::test]
    async fn returns_the_first_value_that_appears() {
        let tries = AtomicU32::new(0);
        let got = eventually("the third try", || async {
            let n = tries.fetch_add(1, Ordering::SeqCst);
            (n >= 2).then_some(n)
        })
        .await;
        assert_eq!(got, 2);
    }

    #[tokio::test]
    async fn a_boolean_check_waits_until_it_is_true() {
        let tries = AtomicU32::new(0);
        eventually("the second try", || async { tries.fetch_add(1, Ordering::SeqCst) >= 1 }).await;
        assert_eq!(tries.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    #[should_panic(expected = "timed out waiting for nothing")]
    async fn fails_naming_what_it_waited_for_when_the_deadline_passes() {
        eventually_within("nothing", Duration::from_millis(50), || async { None::<()> }).await;
    }

    #[tokio::test]
    async fn poll_within_answers_none_when_the_deadline_passes() {
        assert_eq!(poll_within(Duration::from_millis(50), || async { false }).await, None);
    }
}
