//! A Lease's holders as a scenario samples them, and the longest time no holder renewed (pure).

use std::time::{Duration, SystemTime};

/// One look at a Lease: when, its holder (empty when released) and its renew time.
pub type Sample = (SystemTime, String, Option<SystemTime>);

/// The longest time between one holder's last renewal and the next holder's first, over the
/// samples (pure). A holder is an owner from its first renewal seen to its last one.
pub fn longest_gap(samples: &[Sample]) -> Duration {
    let mut gap = Duration::ZERO;
    let mut last: Option<(String, SystemTime)> = None;
    for (_, holder, renew) in samples {
        let Some(renew) = renew else { continue };
        if holder.is_empty() {
            continue;
        }
        match &last {
            Some((h, t)) if h != holder => {
                gap = gap.max(renew.duration_since(*t).unwrap_or_default());
                last = Some((holder.clone(), *renew));
            }
            _ => last = Some((holder.clone(), *renew)),
        }
    }
    gap
}

/// The holders in the order they held the Lease (`released` where it was emptied), each with
/// the time it was first seen, in seconds after the first sample (pure).
pub fn sequence(samples: &[Sample]) -> Vec<String> {
    let Some((start, _, _)) = samples.first() else { return Vec::new() };
    let mut out: Vec<String> = Vec::new();
    let mut last: Option<&str> = None;
    for (at, holder, _) in samples {
        if last != Some(holder.as_str()) {
            let name = if holder.is_empty() { "released" } else { holder.as_str() };
            out.push(format!("{name} at {:.1} s", at.duration_since(*start).unwrap_or_default().as_secs_f64()));
            last = Some(holder.as_str());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gap_runs_from_one_holders_last_renewal_to_the_next_holders_first() {
        let at = |s: u64| SystemTime::UNIX_EPOCH + Duration::from_secs(s);
        let samples = vec![
            (at(0), "a".to_string(), Some(at(0))),
            (at(2), "a".to_string(), Some(at(2))),
            (at(5), String::new(), Some(at(2))),
            (at(9), "b".to_string(), Some(at(9))),
            (at(10), "b".to_string(), Some(at(10))),
            (at(11), "c".to_string(), Some(at(12))),
        ];
        assert_eq!(longest_gap(&samples), Duration::from_secs(7));
        assert_eq!(longest_gap(&samples[..2]), Duration::ZERO, "one holder throughout");
        assert_eq!(sequence(&samples), ["a at 0.0 s", "released at 5.0 s", "b at 9.0 s", "c at 11.0 s"]);
    }
}
