//! AWS errors as [`CloudError`]s, and the record of recent throttling that sets the retry delay
//! and the `ProviderHealthy` reason.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use aws_sdk_ec2::config::http::HttpResponse;
use aws_sdk_ec2::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};

use ccm_framework::provider::CloudError;

/// Error codes AWS uses for rate limiting (EC2 answers `RequestLimitExceeded` with 503, ELBv2
/// `Throttling` with 400).
const THROTTLING_CODES: &[&str] = &[
    "RequestLimitExceeded",
    "Throttling",
    "ThrottlingException",
    "ThrottledException",
    "TooManyRequestsException",
    "RequestThrottled",
    "RequestThrottledException",
    "SlowDown",
    "EC2ThrottledException",
    "BandwidthLimitExceeded",
];

/// Error codes for rejected or insufficient credentials.
const AUTH_CODES: &[&str] = &[
    "AuthFailure",
    "UnauthorizedOperation",
    "InvalidClientTokenId",
    "SignatureDoesNotMatch",
    "AccessDenied",
    "AccessDeniedException",
    "ExpiredToken",
    "ExpiredTokenException",
    "OptInRequired",
    "UnrecognizedClientException",
];

/// The error code of an SDK error, if the service sent one.
pub fn code<E, R>(err: &SdkError<E, R>) -> Option<&str>
where
    E: ProvideErrorMetadata,
{
    match err {
        SdkError::ServiceError(e) => e.err().code(),
        _ => None,
    }
}

/// Whether the error is a throttling answer.
pub fn is_throttling<E, R>(err: &SdkError<E, R>) -> bool
where
    E: ProvideErrorMetadata,
{
    code(err).is_some_and(|c| THROTTLING_CODES.contains(&c))
}

/// Recent throttling answers: they set the delay of [`CloudError::Throttled`] and make
/// `health` report `Throttled` while they last.
#[derive(Debug)]
pub struct ThrottleLog {
    window: Duration,
    events: Mutex<VecDeque<Instant>>,
}

impl ThrottleLog {
    /// A log that remembers answers for `window`.
    pub fn new(window: Duration) -> Self {
        Self { window, events: Mutex::new(VecDeque::new()) }
    }

    /// Record a throttling answer; returns how many are in the window now.
    pub fn record(&self) -> usize {
        let mut events = self.events.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        events.push_back(now);
        Self::prune(&mut events, now, self.window);
        // Bounded: a storm of answers keeps only the most recent ones.
        while events.len() > 1024 {
            events.pop_front();
        }
        events.len()
    }

    /// Answers in the window now.
    pub fn recent(&self) -> usize {
        let mut events = self.events.lock().unwrap_or_else(|e| e.into_inner());
        Self::prune(&mut events, Instant::now(), self.window);
        events.len()
    }

    /// The delay to ask for after `count` recent answers: 1 s doubling, at most the window
    /// (answers older than it no longer count, so waiting longer gains nothing).
    pub fn delay(&self, count: usize) -> Duration {
        Self::delay_for(count).min(self.window)
    }

    /// The delay after `count` recent answers without a window: 1 s doubling, at most 60 s.
    pub fn delay_for(count: usize) -> Duration {
        let exp = count.saturating_sub(1).min(6) as u32;
        Duration::from_secs(1u64 << exp).min(Duration::from_secs(60))
    }

    fn prune(events: &mut VecDeque<Instant>, now: Instant, window: Duration) {
        while events.front().is_some_and(|t| now.duration_since(*t) > window) {
            events.pop_front();
        }
    }
}

/// Turn an SDK error of `operation` into a [`CloudError`], recording throttling in `log`.
pub fn classify<E>(operation: &str, err: SdkError<E, HttpResponse>, log: &ThrottleLog) -> CloudError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    if is_throttling(&err) {
        let count = log.record();
        return CloudError::Throttled {
            retry_after: Some(log.delay(count)),
            message: format!("{operation}: {}", code(&err).unwrap_or("throttled")),
        };
    }
    if let Some(c) = code(&err)
        && AUTH_CODES.contains(&c)
    {
        return CloudError::Unauthorized(format!("{operation}: {c}"));
    }
    let text = DisplayErrorContext(&err).to_string();
    match &err {
        SdkError::DispatchFailure(_) | SdkError::TimeoutError(_) => {
            if text.contains("credentials") {
                CloudError::Unauthorized(format!("{operation}: no usable credentials: {text}"))
            } else {
                CloudError::Unavailable(format!("{operation}: {text}"))
            }
        }
        SdkError::ResponseError(_) => CloudError::Unavailable(format!("{operation}: {text}")),
        SdkError::ConstructionFailure(_) => {
            if text.contains("credentials") {
                CloudError::Unauthorized(format!("{operation}: no usable credentials"))
            } else {
                CloudError::Other(format!("{operation}: {text}"))
            }
        }
        SdkError::ServiceError(e) => {
            let service = e.err();
            let message = format!(
                "{operation}: {}: {}",
                service.code().unwrap_or("error"),
                service.message().unwrap_or("no message")
            );
            if e.raw().status().is_server_error() {
                CloudError::Unavailable(message)
            } else {
                CloudError::Other(message)
            }
        }
        _ => CloudError::Other(format!("{operation}: {text}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn throttle_delay_doubles_and_is_capped() {
        assert_eq!(ThrottleLog::delay_for(1), Duration::from_secs(1));
        assert_eq!(ThrottleLog::delay_for(2), Duration::from_secs(2));
        assert_eq!(ThrottleLog::delay_for(4), Duration::from_secs(8));
        assert_eq!(ThrottleLog::delay_for(100), Duration::from_secs(60));
    }

    #[test]
    fn throttle_delay_never_exceeds_the_window() {
        let log = ThrottleLog::new(Duration::from_secs(5));
        assert_eq!(log.delay(2), Duration::from_secs(2));
        assert_eq!(log.delay(10), Duration::from_secs(5));
    }

    #[test]
    fn throttle_log_forgets_after_its_window() {
        let log = ThrottleLog::new(Duration::from_millis(30));
        assert_eq!(log.record(), 1);
        assert_eq!(log.record(), 2);
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(log.recent(), 0);
    }
}
