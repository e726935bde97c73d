//! The load-balancer state on each LoadBalancer Service this manager handles, in KEP-6128's
//! shape (S31, S33): the conditions `Accepted`, `Programmed` and `Degraded`, True as well as
//! False, each with a reason and the `observedGeneration` it describes. A refusal also keeps
//! the earlier `LoadBalancerProvisioned=False` (deprecated, S25). Pure: the controller turns a
//! [`StatusApply`] into one server-side apply of the Service's status, made only when something
//! changed (S31).

use k8s_openapi::api::core::v1::{LoadBalancerIngress, LoadBalancerStatus, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use serde_json::{Value, json};

use crds::conditions::{DesiredCondition, Status, set_condition};

use super::logic;
use crate::provider::{CloudError, MAX_REFUSAL_MESSAGE_BYTES, Refusal};

/// The types and reasons, defined with every other reason in
/// [`crds::reasons::load_balancer_state`].
pub use crds::reasons::load_balancer_state as reasons;

/// `Accepted`: True once the provider took the Service; False while it refuses it.
pub const ACCEPTED: &str = reasons::ACCEPTED;
/// `Programmed`: True once the load balancer is made as the Service asks.
pub const PROGRAMMED: &str = reasons::PROGRAMMED;
/// `Degraded` (abnormal-true): True while a load balancer serves the Service but not as asked.
pub const DEGRADED: &str = reasons::DEGRADED;
/// The deprecated refusal condition, written alongside `Accepted=False` (S25).
pub const LEGACY: &str = crds::reasons::service_load_balancer::CONDITION_TYPE;
/// Every condition type this controller writes on a Service.
pub const TYPES: [&str; 4] = [ACCEPTED, PROGRAMMED, DEGRADED, LEGACY];

/// What the latest sync of a Service, or a node pass's host update, found.
#[derive(Debug, Clone, Copy)]
pub enum Outcome<'a> {
    /// The load balancer was ensured; `hosts` is false when no Node may serve it.
    Ensured {
        /// Whether any Node is a host.
        hosts: bool,
    },
    /// A node pass gave the load balancer its hosts.
    HostsUpdated {
        /// Whether any Node is a host.
        hosts: bool,
    },
    /// The provider refused the Service; `serving`: its earlier load balancer still serves.
    Refused {
        /// Why.
        refusal: Refusal,
        /// The provider's message.
        message: &'a str,
        /// Whether the Service keeps reporting an address.
        serving: bool,
    },
    /// The ensure failed for a reason that may pass; `serving`: the Service reports an address.
    Failed {
        /// The error.
        error: &'a CloudError,
        /// Whether the Service reports an address.
        serving: bool,
    },
    /// A node pass's host update failed (retried through a full ensure, S18).
    HostUpdateFailed {
        /// The error.
        error: &'a CloudError,
    },
}

/// The reason a transient error gives `Programmed=False` and `Degraded=True`.
pub fn error_reason(error: &CloudError) -> &'static str {
    match error {
        CloudError::Throttled { .. } => reasons::THROTTLED,
        CloudError::Unavailable(_) => reasons::CLOUD_UNAVAILABLE,
        CloudError::Unauthorized(_) => reasons::CLOUD_UNAUTHORIZED,
        CloudError::RetryAfter { .. } => reasons::IN_PROGRESS,
        CloudError::InvalidConfig(_) => reasons::INVALID_CLOUD_CONFIG,
        _ => reasons::CLOUD_ERROR,
    }
}

/// `message` cut to the refusal bound on a character boundary, so the status stays small.
fn bounded(message: &str) -> String {
    let mut end = message.len().min(MAX_REFUSAL_MESSAGE_BYTES);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    message[..end].to_string()
}

fn existing<'a>(svc: &'a Service, type_: &str) -> Option<&'a Condition> {
    svc.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == type_)
}

fn kept(svc: &Service, type_: &str) -> Option<DesiredCondition> {
    existing(svc, type_).map(|c| DesiredCondition {
        type_: c.type_.clone(),
        status: Status::parse(&c.status),
        reason: c.reason.clone(),
        message: c.message.clone(),
    })
}

fn accepted() -> DesiredCondition {
    DesiredCondition::new(ACCEPTED, Status::True, reasons::ACCEPTED, "the provider accepted the Service")
}

fn programmed() -> DesiredCondition {
    DesiredCondition::new(
        PROGRAMMED,
        Status::True,
        reasons::PROGRAMMED_REASON,
        "the load balancer is made as the Service asks",
    )
}

fn not_degraded() -> DesiredCondition {
    DesiredCondition::new(DEGRADED, Status::False, reasons::AS_EXPECTED, "")
}

fn hosts_degraded(hosts: bool) -> DesiredCondition {
    if hosts {
        return not_degraded();
    }
    DesiredCondition::new(
        DEGRADED,
        Status::True,
        reasons::NO_HOSTS,
        "no Node may serve the load balancer: every Node is excluded, tainted for removal or being deleted",
    )
}

/// Whether `Programmed` already says True for the Service's current generation.
fn programmed_now(svc: &Service) -> bool {
    existing(svc, PROGRAMMED).is_some_and(|c| c.status == "True" && c.observed_generation == svc.metadata.generation)
}

/// The conditions `outcome` calls for, in [`TYPES`] order; `LoadBalancerProvisioned` only while
/// refused.
pub fn desired(svc: &Service, outcome: Outcome<'_>) -> Vec<DesiredCondition> {
    match outcome {
        Outcome::Ensured { hosts } => vec![accepted(), programmed(), hosts_degraded(hosts)],
        Outcome::HostsUpdated { hosts } => vec![
            kept(svc, ACCEPTED).unwrap_or_else(accepted),
            kept(svc, PROGRAMMED).unwrap_or_else(programmed),
            hosts_degraded(hosts),
        ],
        Outcome::Refused { refusal, message, serving } => {
            let message = bounded(message);
            let degraded = if serving {
                DesiredCondition::new(
                    DEGRADED,
                    Status::True,
                    reasons::CHANGE_REFUSED,
                    "the load balancer serves the Service as it was before the refused change; see Accepted",
                )
            } else {
                not_degraded()
            };
            vec![
                DesiredCondition::new(ACCEPTED, Status::False, refusal.reason(), message.clone()),
                DesiredCondition::new(
                    PROGRAMMED,
                    Status::False,
                    reasons::NOT_ACCEPTED,
                    "the provider refused the Service; see Accepted",
                ),
                degraded,
                DesiredCondition::new(LEGACY, Status::False, refusal.reason(), message),
            ]
        }
        Outcome::Failed { error, serving } => {
            let reason = error_reason(error);
            let message = bounded(&error.to_string());
            let accepted = kept(svc, ACCEPTED).unwrap_or_else(|| {
                DesiredCondition::new(ACCEPTED, Status::Unknown, reasons::PENDING, "the provider has not answered yet")
            });
            let programmed = if programmed_now(svc) {
                programmed()
            } else {
                DesiredCondition::new(PROGRAMMED, Status::False, reason, message.clone())
            };
            // A cloud still at work is no failure.
            let degraded = if serving && reason != reasons::IN_PROGRESS {
                DesiredCondition::new(DEGRADED, Status::True, reason, message)
            } else {
                not_degraded()
            };
            vec![accepted, programmed, degraded]
        }
        Outcome::HostUpdateFailed { error } => vec![
            kept(svc, ACCEPTED).unwrap_or_else(accepted),
            kept(svc, PROGRAMMED).unwrap_or_else(programmed),
            DesiredCondition::new(DEGRADED, Status::True, reasons::HOST_UPDATE_FAILED, bounded(&error.to_string())),
        ],
    }
}

/// One write of the Service's status: this controller's conditions and the ingress it reports,
/// as a server-side apply with the controller's field manager. Conditions of its types left
/// out are removed; so is one an older manager wrote with a patch, by a second write
/// ([`StatusApply::leftovers`]).
#[derive(Debug, Clone, PartialEq)]
pub struct StatusApply {
    /// The body to apply.
    pub body: Value,
}

/// The ingress list a Service reports.
fn ingress_of(status: Option<&LoadBalancerStatus>) -> Vec<LoadBalancerIngress> {
    status.and_then(|s| s.ingress.clone()).unwrap_or_default()
}

/// The apply that makes `svc` report `conditions` (none: this controller's are removed) and
/// `ingress`, or `None` when it already does: nothing is written then (S31). Times and the
/// generation are filled in as [`crds::conditions::set_condition`] does.
pub fn status_apply(
    svc: &Service,
    conditions: &[DesiredCondition],
    ingress: &LoadBalancerStatus,
    now: &Time,
) -> Option<StatusApply> {
    let current: Vec<Condition> = svc.status.as_ref().and_then(|s| s.conditions.clone()).unwrap_or_default();
    let mut merged = current.clone();
    let mut changed = false;
    for d in conditions {
        changed |= set_condition(&mut merged, d.clone(), svc.metadata.generation, now);
    }
    let wanted: Vec<&str> = conditions.iter().map(|d| d.type_.as_str()).collect();
    changed |= current.iter().any(|c| TYPES.contains(&c.type_.as_str()) && !wanted.contains(&c.type_.as_str()));
    let current_status = svc.status.as_ref().and_then(|s| s.load_balancer.as_ref());
    changed |= logic::ingress_changed(current_status, ingress);
    if !changed {
        return None;
    }
    let ours: Vec<&Condition> =
        TYPES.iter().filter(|t| wanted.contains(t)).filter_map(|t| merged.iter().find(|c| c.type_ == *t)).collect();
    // The ingress as it stands when only conditions change, so the apply keeps owning it.
    let ingress = ingress_of(Some(ingress));
    let body = json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": { "name": svc.metadata.name, "namespace": svc.metadata.namespace },
        "status": { "conditions": ours, "loadBalancer": { "ingress": ingress } },
    });
    Some(StatusApply { body })
}

impl StatusApply {
    /// Conditions of this controller's types that `after` (the Service the apply returned) still
    /// carries though the apply left them out: written by an older manager with a patch, so
    /// the apply cannot remove them. Empty almost always.
    pub fn leftovers(&self, after: &Service) -> Vec<String> {
        let applied: Vec<&str> = self.body["status"]["conditions"]
            .as_array()
            .map(|a| a.iter().filter_map(|c| c["type"].as_str()).collect())
            .unwrap_or_default();
        let present = after.status.as_ref().and_then(|s| s.conditions.as_ref());
        present
            .into_iter()
            .flatten()
            .filter(|c| TYPES.contains(&c.type_.as_str()) && !applied.contains(&c.type_.as_str()))
            .map(|c| c.type_.clone())
            .collect()
    }
}

/// The strategic merge patch that deletes conditions of `types` (other writers' stay).
pub fn delete_patch(types: &[String]) -> Value {
    let entries: Vec<Value> = types.iter().map(|t| json!({ "type": t, "$patch": "delete" })).collect();
    json!({ "status": { "conditions": entries } })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ServiceStatus;

    fn at(secs: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap())
    }

    fn svc(generation: i64) -> Service {
        let mut s = Service::default();
        s.metadata.name = Some("web".into());
        s.metadata.namespace = Some("default".into());
        s.metadata.generation = Some(generation);
        s
    }

    fn ip(addr: &str) -> LoadBalancerStatus {
        LoadBalancerStatus { ingress: Some(vec![LoadBalancerIngress { ip: Some(addr.into()), ..Default::default() }]) }
    }

    /// What the API server holds after `apply`.
    fn after(mut s: Service, apply: &StatusApply) -> Service {
        let status: ServiceStatus = serde_json::from_value(apply.body["status"].clone()).unwrap();
        let mut conditions: Vec<Condition> = s
            .status
            .as_ref()
            .and_then(|st| st.conditions.clone())
            .unwrap_or_default()
            .into_iter()
            .filter(|c| !TYPES.contains(&c.type_.as_str()))
            .collect();
        conditions.extend(status.conditions.unwrap_or_default());
        s.status = Some(ServiceStatus { conditions: Some(conditions), load_balancer: status.load_balancer });
        s
    }

    fn cond<'a>(s: &'a Service, t: &str) -> &'a Condition {
        existing(s, t).unwrap_or_else(|| panic!("no {t}"))
    }

    #[test]
    fn s31_an_ensured_load_balancer_is_accepted_programmed_and_not_degraded_in_one_write() {
        let s = svc(3);
        let apply = status_apply(&s, &desired(&s, Outcome::Ensured { hosts: true }), &ip("192.0.2.1"), &at(10))
            .expect("a first write");
        let types: Vec<&str> = apply.body["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["type"].as_str().unwrap())
            .collect();
        assert_eq!(types, [ACCEPTED, PROGRAMMED, DEGRADED]);
        assert_eq!(apply.body["status"]["loadBalancer"]["ingress"][0]["ip"], "192.0.2.1");
        assert_eq!(apply.body["kind"], "Service");
        let s = after(s, &apply);
        for (t, status, reason) in
            [(ACCEPTED, "True", "Accepted"), (PROGRAMMED, "True", "Programmed"), (DEGRADED, "False", "AsExpected")]
        {
            let c = cond(&s, t);
            assert_eq!((c.status.as_str(), c.reason.as_str()), (status, reason), "{t}");
            assert_eq!(c.observed_generation, Some(3));
        }
        // The same outcome again writes nothing.
        assert_eq!(status_apply(&s, &desired(&s, Outcome::Ensured { hosts: true }), &ip("192.0.2.1"), &at(20)), None);
        // A new generation is a change.
        let mut newer = s.clone();
        newer.metadata.generation = Some(4);
        assert!(
            status_apply(&newer, &desired(&newer, Outcome::Ensured { hosts: true }), &ip("192.0.2.1"), &at(20))
                .is_some()
        );
    }

    #[test]
    fn s33_a_refusal_is_accepted_false_with_its_reason_and_keeps_the_deprecated_condition() {
        let s = svc(1);
        let out = Outcome::Refused { refusal: Refusal::PoolExhausted, message: "0 of 254 free", serving: false };
        let apply = status_apply(&s, &desired(&s, out), &LoadBalancerStatus::default(), &at(10)).unwrap();
        let s = after(s, &apply);
        assert_eq!(cond(&s, ACCEPTED).reason, "PoolExhausted");
        assert_eq!(cond(&s, ACCEPTED).status, "False");
        assert_eq!(cond(&s, ACCEPTED).message, "0 of 254 free");
        assert_eq!(
            (cond(&s, PROGRAMMED).status.as_str(), cond(&s, PROGRAMMED).reason.as_str()),
            ("False", "NotAccepted")
        );
        assert_eq!(cond(&s, DEGRADED).status, "False", "nothing serves");
        assert_eq!(cond(&s, LEGACY).reason, "PoolExhausted", "S25, deprecated");
        assert_eq!(status_apply(&s, &desired(&s, out), &LoadBalancerStatus::default(), &at(20)), None, "once");
        // Served by the load balancer of before the change: Degraded.
        let serving = Outcome::Refused { refusal: Refusal::InvalidAnnotation, message: "m", serving: true };
        assert_eq!(desired(&s, serving)[2].reason, "ChangeRefused");
        // Then ensured: the deprecated condition goes with the same write.
        let fixed =
            status_apply(&s, &desired(&s, Outcome::Ensured { hosts: true }), &ip("192.0.2.1"), &at(30)).unwrap();
        let s = after(s, &fixed);
        assert!(existing(&s, LEGACY).is_none());
        assert_eq!(cond(&s, ACCEPTED).last_transition_time, at(30), "False to True moves the time");
    }

    #[test]
    fn s33_transient_errors_are_programmed_false_before_the_first_success_and_degraded_after() {
        let s = svc(1);
        let throttled = CloudError::Throttled { retry_after: None, message: "429".into() };
        let first = desired(&s, Outcome::Failed { error: &throttled, serving: false });
        assert_eq!((first[0].status, first[0].reason.as_str()), (Status::Unknown, "Pending"));
        assert_eq!((first[1].status, first[1].reason.as_str()), (Status::False, "Throttled"));
        assert_eq!(first[2].status, Status::False, "nothing serves, nothing degraded");
        // Once programmed at this generation, a failed re-sync is Degraded, Programmed stays.
        let ok = status_apply(&s, &desired(&s, Outcome::Ensured { hosts: true }), &ip("192.0.2.1"), &at(5)).unwrap();
        let s = after(s, &ok);
        let down = CloudError::Unavailable("503".into());
        let later = desired(&s, Outcome::Failed { error: &down, serving: true });
        assert_eq!((later[0].status, later[1].status), (Status::True, Status::True));
        assert_eq!((later[2].status, later[2].reason.as_str()), (Status::True, "CloudUnavailable"));
        assert!(later[2].message.contains("503"));
        // A spec change not yet programmed: Programmed False, and Degraded while the old serves.
        let mut changed = s.clone();
        changed.metadata.generation = Some(2);
        let d = desired(&changed, Outcome::Failed { error: &down, serving: true });
        assert_eq!((d[1].status, d[1].reason.as_str()), (Status::False, "CloudUnavailable"));
        assert_eq!(d[2].status, Status::True);
        // A cloud still at work degrades nothing.
        let busy = CloudError::retry_after(std::time::Duration::from_secs(5), "creating");
        assert_eq!(desired(&changed, Outcome::Failed { error: &busy, serving: true })[2].status, Status::False);
        assert_eq!(error_reason(&CloudError::Other("x".into())), "CloudError");
    }

    #[test]
    fn s33_host_updates_set_and_clear_degraded_and_no_hosts_is_degraded() {
        let s = svc(1);
        let ok = status_apply(&s, &desired(&s, Outcome::Ensured { hosts: false }), &ip("192.0.2.1"), &at(5)).unwrap();
        let s = after(s, &ok);
        assert_eq!(cond(&s, DEGRADED).reason, "NoHosts");
        let e = CloudError::Unavailable("down".into());
        let failed = status_apply(&s, &desired(&s, Outcome::HostUpdateFailed { error: &e }), &ip("192.0.2.1"), &at(6));
        let s = after(s, &failed.unwrap());
        assert_eq!(cond(&s, DEGRADED).reason, "HostUpdateFailed");
        assert_eq!(cond(&s, PROGRAMMED).status, "True", "kept");
        let healed = status_apply(&s, &desired(&s, Outcome::HostsUpdated { hosts: true }), &ip("192.0.2.1"), &at(7));
        let s = after(s, &healed.unwrap());
        assert_eq!(cond(&s, DEGRADED).status, "False");
        assert_eq!(
            status_apply(&s, &desired(&s, Outcome::HostsUpdated { hosts: true }), &ip("192.0.2.1"), &at(8)),
            None,
            "a host update that changes nothing writes nothing"
        );
    }

    #[test]
    fn s31_removal_leaves_other_writers_conditions_and_finds_leftovers_of_older_managers() {
        let mut s = svc(1);
        let condition = |type_: &str, status: &str| Condition {
            type_: type_.into(),
            status: status.into(),
            reason: "Some".into(),
            message: String::new(),
            observed_generation: None,
            last_transition_time: at(0),
        };
        let foreign = condition("cilium.io/IPAMRequestSatisfied", "True");
        let legacy = condition(LEGACY, "False");
        s.status = Some(ServiceStatus { conditions: Some(vec![foreign.clone(), legacy]), ..Default::default() });
        let apply = status_apply(&s, &[], &LoadBalancerStatus::default(), &at(1)).expect("ours to remove");
        assert_eq!(apply.body["status"]["conditions"], json!([]));
        // The apply could not remove the patched condition: it is a leftover to delete.
        assert_eq!(apply.leftovers(&s), vec![LEGACY.to_string()]);
        assert_eq!(
            delete_patch(&apply.leftovers(&s)),
            json!({"status": {"conditions": [{"type": LEGACY, "$patch": "delete"}]}})
        );
        let mut clean = svc(1);
        clean.status = Some(ServiceStatus { conditions: Some(vec![foreign]), ..Default::default() });
        assert_eq!(status_apply(&clean, &[], &LoadBalancerStatus::default(), &at(1)), None, "nothing of ours");
    }

    #[test]
    fn long_messages_are_bounded() {
        let s = svc(1);
        let e = CloudError::Other("é".repeat(2000));
        let d = desired(&s, Outcome::Failed { error: &e, serving: false });
        assert!(d[1].message.len() <= MAX_REFUSAL_MESSAGE_BYTES);
    }
}
