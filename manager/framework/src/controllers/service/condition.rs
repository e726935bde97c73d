//! Pure decisions about the Service condition `LoadBalancerProvisioned`: present (False) while
//! the provider refuses the Service a load balancer ([`CloudError::Refused`]), absent otherwise.
//! No I/O here; the controller turns a [`ConditionWrite`] into one status patch.
//!
//! [`CloudError::Refused`]: crate::provider::CloudError::Refused

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use serde_json::{Value, json};

use crate::provider::Refusal;

/// The condition type, defined with its reasons in [`crds::reasons::service_load_balancer`].
pub const CONDITION_TYPE: &str = crds::reasons::service_load_balancer::CONDITION_TYPE;

/// A change of the Service's `LoadBalancerProvisioned` condition.
#[derive(Debug, Clone, PartialEq)]
pub enum ConditionWrite {
    /// Set the condition to this value.
    Set(Condition),
    /// Remove the condition.
    Remove,
}

impl ConditionWrite {
    /// The strategic merge patch of the Service's status that makes this change; conditions are
    /// a list keyed by `type`, so other writers' conditions stay.
    pub fn patch(&self) -> Value {
        match self {
            ConditionWrite::Set(c) => json!({ "status": { "conditions": [c] } }),
            ConditionWrite::Remove => {
                json!({ "status": { "conditions": [{ "type": CONDITION_TYPE, "$patch": "delete" }] } })
            }
        }
    }
}

/// The Service's current `LoadBalancerProvisioned` condition, if any.
pub fn current(svc: &Service) -> Option<&Condition> {
    svc.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == CONDITION_TYPE)
}

/// The write that records `refusal` on the Service, or `None` when the condition already says
/// exactly that. `lastTransitionTime` stays when the condition was already False.
pub fn on_refusal(svc: &Service, refusal: Refusal, message: &str, now: &Time) -> Option<ConditionWrite> {
    let generation = svc.metadata.generation;
    let existing = current(svc);
    if let Some(c) = existing
        && c.status == "False"
        && c.reason == refusal.reason()
        && c.message == message
        && c.observed_generation == generation
    {
        return None;
    }
    let last_transition_time = match existing {
        Some(c) if c.status == "False" => c.last_transition_time.clone(),
        _ => now.clone(),
    };
    Some(ConditionWrite::Set(Condition {
        type_: CONDITION_TYPE.to_string(),
        status: "False".to_string(),
        reason: refusal.reason().to_string(),
        message: message.to_string(),
        observed_generation: generation,
        last_transition_time,
    }))
}

/// The write that clears the condition once the Service has its load balancer or no longer
/// wants one, or `None` when it has none (the common case: no write at all).
pub fn on_cleared(svc: &Service) -> Option<ConditionWrite> {
    current(svc).map(|_| ConditionWrite::Remove)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ServiceStatus;

    fn at(secs: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap())
    }

    fn with(conditions: Vec<Condition>, generation: i64) -> Service {
        let mut svc = Service::default();
        svc.metadata.generation = Some(generation);
        svc.status = Some(ServiceStatus { conditions: Some(conditions), ..Default::default() });
        svc
    }

    fn set(w: Option<ConditionWrite>) -> Condition {
        match w {
            Some(ConditionWrite::Set(c)) => c,
            other => panic!("expected a Set, got {other:?}"),
        }
    }

    #[test]
    fn a_first_refusal_sets_the_condition_false_with_its_reason_and_generation() {
        let c = set(on_refusal(&with(vec![], 3), Refusal::PoolExhausted, "no free address", &at(10)));
        assert_eq!(c.type_, "LoadBalancerProvisioned");
        assert_eq!((c.status.as_str(), c.reason.as_str()), ("False", "PoolExhausted"));
        assert_eq!(c.message, "no free address");
        assert_eq!(c.observed_generation, Some(3));
        assert_eq!(c.last_transition_time, at(10));
    }

    #[test]
    fn the_same_refusal_again_writes_nothing() {
        let first = set(on_refusal(&with(vec![], 1), Refusal::SharingConflict, "port 80/TCP", &at(10)));
        assert_eq!(on_refusal(&with(vec![first], 1), Refusal::SharingConflict, "port 80/TCP", &at(20)), None);
    }

    #[test]
    fn another_reason_keeps_the_transition_time_and_a_true_condition_moves_it() {
        let first = set(on_refusal(&with(vec![], 1), Refusal::PoolExhausted, "m", &at(10)));
        let second = set(on_refusal(&with(vec![first.clone()], 2), Refusal::NoPoolMatches, "m", &at(20)));
        assert_eq!(second.reason, "NoPoolMatches");
        assert_eq!(second.observed_generation, Some(2));
        assert_eq!(second.last_transition_time, at(10), "still False: no transition");
        let foreign_true = Condition { status: "True".into(), ..first };
        let third = set(on_refusal(&with(vec![foreign_true], 2), Refusal::NoPoolMatches, "m", &at(30)));
        assert_eq!(third.last_transition_time, at(30));
    }

    #[test]
    fn clearing_removes_only_a_present_condition() {
        assert_eq!(on_cleared(&Service::default()), None);
        assert_eq!(on_cleared(&with(vec![], 1)), None);
        let c = set(on_refusal(&with(vec![], 1), Refusal::QuotaExceeded, "m", &at(1)));
        assert_eq!(on_cleared(&with(vec![c], 1)), Some(ConditionWrite::Remove));
    }

    #[test]
    fn patches_touch_only_this_condition_type() {
        assert_eq!(
            ConditionWrite::Remove.patch(),
            json!({"status": {"conditions": [{"type": "LoadBalancerProvisioned", "$patch": "delete"}]}})
        );
        let c = set(on_refusal(&with(vec![], 1), Refusal::PoolExhausted, "m", &at(1)));
        let patch = ConditionWrite::Set(c).patch();
        assert_eq!(patch["status"]["conditions"][0]["reason"], "PoolExhausted");
        assert_eq!(patch["status"]["conditions"].as_array().map(Vec::len), Some(1));
    }
}
