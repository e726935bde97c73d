//! Go-style durations in the cloud-config, shared by the config and the proxy settings so that
//! neither module imports the other.

use std::time::Duration;

use serde::{Deserialize, Deserializer};

/// The message of a malformed duration (registered with the schema, so it is shown as is).
pub const BAD_DURATION: &str = "is not a duration such as 1m30s, 500ms or 2h (units h, m, s, ms, us, ns)";
/// The message of a negative duration.
pub const NEGATIVE_DURATION: &str = "must not be negative";
/// The message of a duration beyond what the provider can wait.
pub const HUGE_DURATION: &str = "is longer than 1000000000s";

/// `deserialize_with` for an optional Go-style duration field: the field given is parsed with
/// [`parse_duration`] (its error one of the fixed messages), absent stays `None`.
pub fn optional<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Duration>, D::Error> {
    let text = String::deserialize(deserializer)?;
    parse_duration(&text).map(Some).map_err(ccm_framework::safe_yaml::custom)
}

/// Parse a Go-style duration: a sequence of numbers with units, such as `1m30s`, `500ms`,
/// `2h` or `1.5s` (units `h`, `m`, `s`, `ms`, `us`/`µs`, `ns`; `0` alone is zero). The error is
/// one of the fixed messages above, never the text.
pub fn parse_duration(text: &str) -> Result<Duration, &'static str> {
    // kube's Go duration parser; its own message quotes the input, so only the outcome is kept.
    let parsed: kube::core::Duration = text.trim().parse().map_err(|_| BAD_DURATION)?;
    if parsed.is_negative() {
        return Err(NEGATIVE_DURATION);
    }
    let duration = Duration::from(parsed);
    if duration > Duration::from_secs(1_000_000_000) {
        return Err(HUGE_DURATION);
    }
    Ok(duration)
}
