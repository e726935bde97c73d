//! Waiting for a condition in tests, with a deadline and a clear failure.

use std::future::Future;
use std::time::{Duration, Instant};

/// How often [`eventually`] re-checks.
pub const POLL: Duration = Duration::from_millis(20);

/// Re-run `check` until it returns `Some`, and return that value; panic if `within` passes
/// first. For tests only: it polls.
pub async fn eventually<T, F, Fut>(within: Duration, check: F) -> T
where
    F: Fn() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "condition not reached within {within:?}");
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
        let got = eventually(Duration::from_secs(5), || async {
            let n = tries.fetch_add(1, Ordering::SeqCst);
            (n >= 2).then_some(n)
        })
        .await;
        assert_eq!(got, 2);
    }

    #[tokio::test]
    #[should_panic(expected = "condition not reached")]
    async fn fails_when_the_deadline_passes() {
        eventually(Duration::from_millis(50), || async { None::<()> }).await;
    }
}
