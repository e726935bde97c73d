//! Values written the way upstream's Go flags take them: durations (`1m30s`) and booleans
//! (`t`, `FALSE`). The manager's flags, the operator's flags and [`crate::config::go_duration`]'s
//! read-back share these parsers.

use std::time::Duration;

/// Parse a Go-style duration (`10s`, `5m0s`, `1h30m`, `250ms`); negative values are rejected.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let d: kube::core::Duration = s.trim().parse().map_err(|e| format!("{s:?} is not a duration such as 10s: {e}"))?;
    if d.is_negative() {
        return Err(format!("{s:?} is negative"));
    }
    Ok(d.into())
}

/// Parse a Go-style boolean (`true`, `false`, `1`, `0`, `t`, `f`, any case).
pub fn parse_bool(s: &str) -> Result<bool, String> {
    match s.to_ascii_lowercase().as_str() {
        "true" | "t" | "1" => Ok(true),
        "false" | "f" | "0" => Ok(false),
        _ => Err(format!("{s:?} is not a boolean")),
    }
}
