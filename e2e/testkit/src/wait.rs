//! The earlier signature of the wait, kept until the `aws` provider's tests move to
//! [`crate::eventually`] (issue 43); new code calls that.

use std::future::Future;
use std::time::Duration;

/// [`crate::eventually_within`] without a name: `check` until it returns `Some`, within `within`.
pub async fn eventually<T, F, Fut>(within: Duration, check: F) -> T
where
    F: Fn() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    crate::eventually_within("a condition", within, check).await
}
