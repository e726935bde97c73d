//! Helpers every module of this test binary shares.

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;

/// How long a test waits for one expectation.
pub const WAIT: Duration = Duration::from_secs(30);

/// Re-runs `f` until it returns `Some` and returns that; fails naming `what` after [`WAIT`].
pub async fn eventually<T, F, Fut>(what: &str, f: F) -> T
where
    F: Fn() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    eventually_within(WAIT, what, f).await
}

/// [`eventually`] with its own deadline.
pub async fn eventually_within<T, F, Fut>(within: Duration, what: &str, f: F) -> T
where
    F: Fn() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let _named = Named(what);
    e2e_apiserver::wait::eventually(within, f).await
}

/// Names what a failed wait was waiting for (the poll loop's own message has only the time).
struct Named<'a>(&'a str);

impl Drop for Named<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("(waiting for {})", self.0);
        }
    }
}

/// The Service's load-balancer ingress as (IP, ipMode) pairs.
pub fn ingress(service: &Service) -> Vec<(String, Option<String>)> {
    service
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|l| l.ingress.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|i| Some((i.ip.clone()?, i.ip_mode.clone())))
        .collect()
}
