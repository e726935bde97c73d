//! Status conditions: their types, polarity, reasons, and helpers that merge them.
//!
//! The helpers are pure: the caller passes the current time, so a merge is deterministic and
//! `lastTransitionTime` moves only when a condition's `status` really changes.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// Condition type names.
pub mod types {
    /// Summary: True when the manager is configured, available, healthy and settled.
    pub const READY: &str = "Ready";
    /// True when the spec, the referenced Secret and the provider's cloud-config are usable.
    pub const CONFIG_VALID: &str = "ConfigValid";
    /// True when a manager is running and holds its leader-election Lease.
    pub const AVAILABLE: &str = "Available";
    /// True while a spec, image or cloud-config change rolls out (abnormal-true).
    pub const PROGRESSING: &str = "Progressing";
    /// True when something is wrong that needs a human (abnormal-true).
    pub const DEGRADED: &str = "Degraded";
    /// True when the provider's health probe passes; written by the running manager.
    pub const PROVIDER_HEALTHY: &str = "ProviderHealthy";
    /// Shadow mode only: True when this manager's decisions match the cluster; written by the
    /// manager (docs/shadow.md). Not an input of `Ready`.
    pub const SHADOW_AGREES: &str = "ShadowAgrees";

    /// With `spec.announcer`: True while every live announcer is healthy and every BGP session
    /// it reports is established; written by the operator from the announcers' Leases. Not an
    /// input of `Ready` (the manager serves whatever the announcers do).
    pub const ANNOUNCING: &str = "Announcing";

    /// Every condition type, sorted.
    pub const ALL: [&str; 6] = [AVAILABLE, CONFIG_VALID, DEGRADED, PROGRESSING, PROVIDER_HEALTHY, READY];
}

/// Reasons of the `Ready` summary condition (they live in [`crate::reasons::ready`]).
pub use crate::reasons::ready as reasons;

/// The longest Condition message a kube-apiserver accepts (`metav1.Condition.message`), in bytes.
pub const MAX_MESSAGE_BYTES: usize = 32_768;

/// What ends a message that [`cap_message`] cut.
pub const TRUNCATED_MARKER: &str = " ... (truncated)";

/// `message` cut to at most [`MAX_MESSAGE_BYTES`] bytes on a character boundary, ending with
/// [`TRUNCATED_MARKER`] when cut, so a status write is never refused for its length.
pub fn cap_message(mut message: String) -> String {
    if message.len() <= MAX_MESSAGE_BYTES {
        return message;
    }
    let mut end = MAX_MESSAGE_BYTES - TRUNCATED_MARKER.len();
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    message.truncate(end);
    message.push_str(TRUNCATED_MARKER);
    message
}

/// Whether True is the good state of a condition type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Polarity {
    /// True is good (Ready, ConfigValid, Available, ProviderHealthy).
    Positive,
    /// True is bad (Progressing, Degraded).
    Negative,
}

/// The polarity of a condition type; unknown types are taken as positive.
pub fn polarity(type_: &str) -> Polarity {
    match type_ {
        types::PROGRESSING | types::DEGRADED => Polarity::Negative,
        _ => Polarity::Positive,
    }
}

/// A condition's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// `True`.
    True,
    /// `False`.
    False,
    /// `Unknown`.
    Unknown,
}

impl Status {
    /// The API string.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::True => "True",
            Status::False => "False",
            Status::Unknown => "Unknown",
        }
    }

    /// Parse the API string; anything unrecognized is `Unknown`.
    pub fn parse(s: &str) -> Self {
        match s {
            "True" => Status::True,
            "False" => Status::False,
            _ => Status::Unknown,
        }
    }

    /// `True` for `true`, `False` for `false`.
    pub fn from_bool(b: bool) -> Self {
        if b { Status::True } else { Status::False }
    }
}

/// A condition as a controller wants it, before timestamps and generation are filled in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DesiredCondition {
    /// Condition type.
    pub type_: String,
    /// Status.
    pub status: Status,
    /// One-word CamelCase reason.
    pub reason: String,
    /// Human-readable message; keep it deterministic (sorted names, no timestamps).
    pub message: String,
}

impl DesiredCondition {
    /// Build a desired condition; the message is capped with [`cap_message`].
    pub fn new(
        type_: impl Into<String>,
        status: Status,
        reason: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Self { type_: type_.into(), status, reason: reason.into(), message: cap_message(message.into()) }
    }
}

/// The condition of `type_`, if present.
pub fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// The status of `type_`, `Unknown` when absent.
pub fn status_of(conditions: &[Condition], type_: &str) -> Status {
    find(conditions, type_).map(|c| Status::parse(&c.status)).unwrap_or(Status::Unknown)
}

/// Set one condition. `lastTransitionTime` becomes `now` only when the condition is new or its
/// status changed; reason, message and `observedGeneration` are always updated. The list stays
/// sorted by type. Returns whether anything changed.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    desired: DesiredCondition,
    generation: Option<i64>,
    now: &Time,
) -> bool {
    let mut desired = desired;
    desired.message = cap_message(desired.message);
    let changed = match conditions.iter_mut().find(|c| c.type_ == desired.type_) {
        Some(existing) => {
            let mut changed = false;
            if existing.status != desired.status.as_str() {
                existing.status = desired.status.as_str().to_string();
                existing.last_transition_time = now.clone();
                changed = true;
            }
            if existing.reason != desired.reason {
                existing.reason = desired.reason;
                changed = true;
            }
            if existing.message != desired.message {
                existing.message = desired.message;
                changed = true;
            }
            if existing.observed_generation != generation {
                existing.observed_generation = generation;
                changed = true;
            }
            changed
        }
        None => {
            conditions.push(Condition {
                type_: desired.type_,
                status: desired.status.as_str().to_string(),
                reason: desired.reason,
                message: desired.message,
                observed_generation: generation,
                last_transition_time: now.clone(),
            });
            true
        }
    };
    conditions.sort_by(|a, b| a.type_.cmp(&b.type_));
    changed
}

/// Merge several desired conditions into a copy of `existing` (see [`set_condition`]).
pub fn merge_conditions(
    existing: &[Condition],
    desired: impl IntoIterator<Item = DesiredCondition>,
    generation: Option<i64>,
    now: &Time,
) -> Vec<Condition> {
    let mut out = existing.to_vec();
    for d in desired {
        set_condition(&mut out, d, generation, now);
    }
    out.sort_by(|a, b| a.type_.cmp(&b.type_));
    out
}

/// Compute the `Ready` summary from the other conditions.
///
/// False when any input is in its bad state (the reason names the first by precedence:
/// ConfigValid, Degraded, ProviderHealthy, Available, Progressing; the message lists every
/// cause); Unknown when none is bad but some are missing or Unknown; True otherwise.
pub fn compute_ready(conditions: &[Condition]) -> DesiredCondition {
    let order: [(&str, &str); 5] = [
        (types::CONFIG_VALID, reasons::CONFIG_INVALID),
        (types::DEGRADED, reasons::DEGRADED),
        (types::PROVIDER_HEALTHY, reasons::PROVIDER_UNHEALTHY),
        (types::AVAILABLE, reasons::UNAVAILABLE),
        (types::PROGRESSING, reasons::PROGRESSING),
    ];
    let mut bad_reason = None;
    let mut causes = Vec::new();
    let mut unknown = Vec::new();
    for (type_, reason) in order {
        let cond = find(conditions, type_);
        let status = cond.map(|c| Status::parse(&c.status)).unwrap_or(Status::Unknown);
        let bad = match polarity(type_) {
            Polarity::Positive => status == Status::False,
            Polarity::Negative => status == Status::True,
        };
        // A missing negative condition (Progressing, Degraded) means "not happening".
        let missing_negative = cond.is_none() && polarity(type_) == Polarity::Negative;
        match cond {
            // A bad status is always a present condition: absence reads as Unknown.
            Some(c) if bad => {
                bad_reason.get_or_insert(reason);
                causes.push(if c.message.is_empty() {
                    format!("{type_}={} ({})", c.status, c.reason)
                } else {
                    format!("{type_}={} ({}): {}", c.status, c.reason, c.message)
                });
            }
            _ if status == Status::Unknown && !missing_negative => unknown.push(type_),
            _ => {}
        }
    }
    if let Some(reason) = bad_reason {
        return DesiredCondition::new(types::READY, Status::False, reason, causes.join("; "));
    }
    if !unknown.is_empty() {
        return DesiredCondition::new(
            types::READY,
            Status::Unknown,
            reasons::AWAITING_STATUS,
            format!("waiting for {}", unknown.join(", ")),
        );
    }
    DesiredCondition::new(
        types::READY,
        Status::True,
        reasons::AS_EXPECTED,
        "the cloud-controller-manager is running and healthy",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn at(secs: i64) -> Time {
        Time(Timestamp::from_second(secs).unwrap())
    }

    fn cond(type_: &str, status: Status, reason: &str) -> DesiredCondition {
        DesiredCondition::new(type_, status, reason, "")
    }

    #[test]
    fn transition_time_is_kept_when_status_is_unchanged() {
        let mut c = Vec::new();
        assert!(set_condition(&mut c, cond("Available", Status::True, "A"), Some(1), &at(100)));
        // Same status, new reason and generation: everything but the transition time moves.
        assert!(set_condition(&mut c, cond("Available", Status::True, "B"), Some(2), &at(200)));
        assert_eq!(c[0].last_transition_time, at(100));
        assert_eq!(c[0].reason, "B");
        assert_eq!(c[0].observed_generation, Some(2));
    }

    #[test]
    fn transition_time_moves_when_status_changes() {
        let mut c = Vec::new();
        set_condition(&mut c, cond("Available", Status::True, "A"), Some(1), &at(100));
        assert!(set_condition(&mut c, cond("Available", Status::False, "A"), Some(1), &at(300)));
        assert_eq!(c[0].last_transition_time, at(300));
        assert_eq!(c[0].status, "False");
    }

    #[test]
    fn setting_an_identical_condition_reports_no_change() {
        let mut c = Vec::new();
        set_condition(&mut c, cond("Available", Status::True, "A"), Some(1), &at(100));
        let before = c.clone();
        assert!(!set_condition(&mut c, cond("Available", Status::True, "A"), Some(1), &at(999)));
        assert_eq!(c, before);
    }

    #[test]
    fn conditions_are_sorted_by_type_whatever_the_insertion_order() {
        let merged = merge_conditions(
            &[],
            [
                cond("ProviderHealthy", Status::True, "Healthy"),
                cond("Available", Status::True, "A"),
                cond("Degraded", Status::False, "AsExpected"),
            ],
            Some(3),
            &at(1),
        );
        let types: Vec<_> = merged.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(types, ["Available", "Degraded", "ProviderHealthy"]);
        assert!(merged.iter().all(|c| c.observed_generation == Some(3)));
    }

    fn with(statuses: &[(&str, Status)]) -> Vec<Condition> {
        merge_conditions(&[], statuses.iter().map(|(t, s)| cond(t, *s, "R")), Some(1), &at(1))
    }

    const ALL_GOOD: [(&str, Status); 5] = [
        (types::CONFIG_VALID, Status::True),
        (types::AVAILABLE, Status::True),
        (types::PROVIDER_HEALTHY, Status::True),
        (types::PROGRESSING, Status::False),
        (types::DEGRADED, Status::False),
    ];

    fn replace(over: &[(&'static str, Status)]) -> Vec<(&'static str, Status)> {
        let mut v: Vec<(&str, Status)> = ALL_GOOD.to_vec();
        for (t, s) in over {
            v.retain(|(x, _)| x != t);
            v.push((t, *s));
        }
        v
    }

    #[test]
    fn ready_summary_table() {
        use Status::*;
        let table: Vec<(Vec<(&str, Status)>, Status, &str)> = vec![
            (replace(&[]), True, reasons::AS_EXPECTED),
            (replace(&[(types::CONFIG_VALID, False)]), False, reasons::CONFIG_INVALID),
            (replace(&[(types::DEGRADED, True)]), False, reasons::DEGRADED),
            (replace(&[(types::PROVIDER_HEALTHY, False)]), False, reasons::PROVIDER_UNHEALTHY),
            (replace(&[(types::AVAILABLE, False)]), False, reasons::UNAVAILABLE),
            (replace(&[(types::PROGRESSING, True)]), False, reasons::PROGRESSING),
            (replace(&[(types::PROVIDER_HEALTHY, Unknown)]), Unknown, reasons::AWAITING_STATUS),
            (replace(&[(types::AVAILABLE, Unknown)]), Unknown, reasons::AWAITING_STATUS),
            // Precedence: an invalid config outranks everything else.
            (replace(&[(types::AVAILABLE, False), (types::CONFIG_VALID, False)]), False, reasons::CONFIG_INVALID),
            // A bad condition outranks an unknown one.
            (replace(&[(types::PROVIDER_HEALTHY, Unknown), (types::DEGRADED, True)]), False, reasons::DEGRADED),
        ];
        for (input, status, reason) in table {
            let ready = compute_ready(&with(&input));
            assert_eq!((ready.status, ready.reason.as_str()), (status, reason), "input {input:?}");
        }
    }

    #[test]
    fn ready_message_lists_every_cause() {
        let mut c = with(&replace(&[]));
        set_condition(
            &mut c,
            DesiredCondition::new(types::DEGRADED, Status::True, "ApplyFailed", "apply failed"),
            Some(1),
            &at(2),
        );
        set_condition(
            &mut c,
            DesiredCondition::new(types::AVAILABLE, Status::False, "NoReplicas", "0/2 ready"),
            Some(1),
            &at(2),
        );
        let ready = compute_ready(&c);
        assert!(ready.message.contains("Degraded=True (ApplyFailed): apply failed"), "{}", ready.message);
        assert!(ready.message.contains("Available=False (NoReplicas): 0/2 ready"), "{}", ready.message);
    }

    #[test]
    fn missing_negative_conditions_do_not_block_ready() {
        let c = with(&[
            (types::CONFIG_VALID, Status::True),
            (types::AVAILABLE, Status::True),
            (types::PROVIDER_HEALTHY, Status::True),
        ]);
        assert_eq!(compute_ready(&c).status, Status::True);
        assert_eq!(compute_ready(&[]).status, Status::Unknown);
    }

    #[test]
    fn long_messages_are_capped_on_a_char_boundary_with_a_marker() {
        // Multi-byte characters straddle the cut.
        let long = "é".repeat(MAX_MESSAGE_BYTES);
        let capped = cap_message(long);
        assert!(capped.len() <= MAX_MESSAGE_BYTES, "{}", capped.len());
        assert!(capped.ends_with(TRUNCATED_MARKER));
        assert!(capped.trim_end_matches(TRUNCATED_MARKER).chars().all(|c| c == 'é'));
        let short = "fine".to_string();
        assert_eq!(cap_message(short.clone()), short);
        let exact = "x".repeat(MAX_MESSAGE_BYTES);
        assert_eq!(cap_message(exact.clone()), exact);
    }

    #[test]
    fn conditions_never_carry_a_message_over_the_api_limit() {
        let huge = "a".repeat(100_000);
        let d = DesiredCondition::new(types::CONFIG_VALID, Status::False, "R", huge.clone());
        assert!(d.message.len() <= MAX_MESSAGE_BYTES);
        // A desired condition built field by field is capped when set.
        let raw =
            DesiredCondition { type_: types::DEGRADED.into(), status: Status::True, reason: "R".into(), message: huge };
        let mut c = Vec::new();
        set_condition(&mut c, raw, Some(1), &at(1));
        assert!(c[0].message.len() <= MAX_MESSAGE_BYTES);
        // Ready repeats every cause; it is capped too.
        let mut all = with(&replace(&[]));
        for t in [types::CONFIG_VALID, types::AVAILABLE, types::PROVIDER_HEALTHY] {
            set_condition(&mut all, DesiredCondition::new(t, Status::False, "R", "b".repeat(30_000)), Some(1), &at(2));
        }
        assert!(compute_ready(&all).message.len() <= MAX_MESSAGE_BYTES);
    }

    #[test]
    fn polarity_of_each_type() {
        assert_eq!(polarity(types::DEGRADED), Polarity::Negative);
        assert_eq!(polarity(types::PROGRESSING), Polarity::Negative);
        for t in [types::READY, types::CONFIG_VALID, types::AVAILABLE, types::PROVIDER_HEALTHY] {
            assert_eq!(polarity(t), Polarity::Positive);
        }
    }
}
