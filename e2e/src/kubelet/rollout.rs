//! The Deployment controller's decisions for the emulated pods (pure): how many pods a rollout
//! may take down, which pods to stop and how many to start, and the status to report.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{DeploymentCondition, DeploymentStatus, DeploymentStrategy};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// What to do for one Deployment (pure): pods to stop and how many to start.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Pods to stop.
    pub terminate: Vec<String>,
    /// New pods of the current template to start.
    pub start: usize,
}

/// A live pod as the planner sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanPod {
    /// Its name.
    pub name: String,
    /// Whether it runs the current template.
    pub current: bool,
    /// Whether it is ready.
    pub ready: bool,
}

/// A Deployment strategy's `maxUnavailable` for `desired` replicas, as the Deployment
/// controller resolves it (pure): `Recreate` takes every pod down; a percentage rounds down;
/// unset is `25%`; and since this kubelet never surges, at least one.
pub fn max_unavailable(strategy: Option<&DeploymentStrategy>, desired: i32) -> i32 {
    if strategy.and_then(|s| s.type_.as_deref()) == Some("Recreate") {
        return desired.max(1);
    }
    let value = strategy.and_then(|s| s.rolling_update.as_ref()).and_then(|r| r.max_unavailable.as_ref());
    let n = match value {
        Some(IntOrString::Int(n)) => *n,
        Some(IntOrString::String(p)) => match p.strip_suffix('%').and_then(|p| p.parse::<i64>().ok()) {
            Some(pct) => i32::try_from(i64::from(desired) * pct / 100).unwrap_or(desired),
            None => 1,
        },
        None => desired / 4,
    };
    n.clamp(1, desired.max(1))
}

/// The rollout and scaling decision for one Deployment (pure): no surge, at most
/// `max_unavailable` pods down; surplus pods go old first, then unready first; old pods are
/// replaced only while the others keep `desired - max_unavailable` ready.
pub fn plan(desired: i32, max_unavailable: i32, pods: &[PlanPod]) -> Plan {
    let desired = usize::try_from(desired.max(0)).unwrap_or(0);
    let mut plan = Plan::default();
    let current: Vec<&PlanPod> = pods.iter().filter(|p| p.current).collect();
    let mut old: Vec<&PlanPod> = pods.iter().filter(|p| !p.current).collect();
    // Unready first, then by name, so the choice is stable.
    old.sort_by_key(|p| (p.ready, p.name.clone()));
    if current.len() > desired {
        let mut surplus: Vec<&PlanPod> = current.clone();
        surplus.sort_by_key(|p| (p.ready, std::cmp::Reverse(p.name.clone())));
        plan.terminate = surplus.iter().take(current.len() - desired).map(|p| p.name.clone()).collect();
        plan.terminate.extend(old.iter().map(|p| p.name.clone()));
        return plan;
    }
    let total = current.len() + old.len();
    if total > desired {
        plan.terminate = old.iter().take(total - desired).map(|p| p.name.clone()).collect();
        return plan;
    }
    if total < desired {
        plan.start = desired - total;
        return plan;
    }
    let mut ready = pods.iter().filter(|p| p.ready).count() as i64;
    let floor = desired as i64 - i64::from(max_unavailable.max(1));
    for victim in old {
        if ready - i64::from(victim.ready) < floor {
            break;
        }
        ready -= i64::from(victim.ready);
        plan.terminate.push(victim.name.clone());
    }
    plan
}

/// The status counts of one Deployment (pure).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    /// `spec.replicas`.
    pub desired: i32,
    /// Live pods of any template.
    pub replicas: i32,
    /// Live pods of the current template.
    pub updated: i32,
    /// Ready pods.
    pub ready: i32,
    /// The strategy's `maxUnavailable`, resolved ([`max_unavailable`]).
    pub max_unavailable: i32,
}

/// The Deployment status the real controller would report for these counts (pure);
/// `previous` keeps condition timestamps when nothing changed.
pub fn deployment_status(
    generation: Option<i64>,
    replica_set: &str,
    c: Counts,
    previous: Option<&DeploymentStatus>,
    now: &Time,
) -> DeploymentStatus {
    let available = c.ready;
    let minimum = available >= c.desired - c.max_unavailable;
    let complete = c.updated == c.desired && c.replicas == c.desired && available == c.desired;
    let condition = |type_: &str, status: bool, reason: &str, message: String| {
        let status = if status { "True" } else { "False" }.to_string();
        let old = previous.and_then(|p| p.conditions.as_ref()).and_then(|cs| cs.iter().find(|x| x.type_ == type_));
        let same = old.is_some_and(|o| o.status == status);
        let unchanged =
            old.is_some_and(|o| same && o.reason.as_deref() == Some(reason) && o.message.as_deref() == Some(&message));
        DeploymentCondition {
            type_: type_.into(),
            status,
            reason: Some(reason.into()),
            message: Some(message),
            last_transition_time: if same {
                old.and_then(|o| o.last_transition_time.clone())
            } else {
                Some(now.clone())
            },
            last_update_time: if unchanged { old.and_then(|o| o.last_update_time.clone()) } else { Some(now.clone()) },
        }
    };
    let available_condition = if minimum {
        condition("Available", true, "MinimumReplicasAvailable", "Deployment has minimum availability.".into())
    } else {
        condition(
            "Available",
            false,
            "MinimumReplicasUnavailable",
            "Deployment does not have minimum availability.".into(),
        )
    };
    let progressing = if complete {
        condition(
            "Progressing",
            true,
            "NewReplicaSetAvailable",
            format!("ReplicaSet \"{replica_set}\" has successfully progressed."),
        )
    } else {
        condition("Progressing", true, "ReplicaSetUpdated", format!("ReplicaSet \"{replica_set}\" is progressing."))
    };
    DeploymentStatus {
        observed_generation: generation,
        replicas: Some(c.replicas),
        updated_replicas: Some(c.updated),
        ready_replicas: Some(c.ready),
        available_replicas: Some(available),
        unavailable_replicas: Some((c.desired - available).max(0)),
        conditions: Some(vec![available_condition, progressing]),
        ..Default::default()
    }
}

/// Whether two statuses differ in anything but condition timestamps (pure).
pub(super) fn status_differs(a: &DeploymentStatus, b: &DeploymentStatus) -> bool {
    let key = |s: &DeploymentStatus| {
        let conditions: BTreeMap<String, (String, Option<String>, Option<String>)> = s
            .conditions
            .iter()
            .flatten()
            .map(|c| (c.type_.clone(), (c.status.clone(), c.reason.clone(), c.message.clone())))
            .collect();
        (
            s.observed_generation,
            s.replicas,
            s.updated_replicas,
            s.ready_replicas,
            s.available_replicas,
            s.unavailable_replicas,
            conditions,
        )
    };
    key(a) != key(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn pod(name: &str, current: bool, ready: bool) -> PlanPod {
        PlanPod { name: name.into(), current, ready }
    }

    #[test]
    fn scaling_up_from_nothing_starts_every_replica() {
        assert_eq!(plan(2, 1, &[]), Plan { terminate: vec![], start: 2 });
    }

    #[test]
    fn a_rollout_replaces_one_pod_at_a_time_keeping_one_ready() {
        // Two ready old pods: stop one.
        let p = plan(2, 1, &[pod("a", false, true), pod("b", false, true)]);
        assert_eq!(p, Plan { terminate: vec!["a".into()], start: 0 });
        // One old left: start its replacement.
        assert_eq!(plan(2, 1, &[pod("b", false, true)]), Plan { terminate: vec![], start: 1 });
        // The new one is not ready: the last old one stays.
        assert_eq!(plan(2, 1, &[pod("b", false, true), pod("n1", true, false)]), Plan::default());
        // Ready: replace the last old one.
        let p = plan(2, 1, &[pod("b", false, true), pod("n1", true, true)]);
        assert_eq!(p.terminate, vec!["b".to_string()]);
        // Done.
        assert_eq!(plan(2, 1, &[pod("n1", true, true), pod("n2", true, true)]), Plan::default());
    }

    #[test]
    fn the_strategy_sets_how_many_pods_a_rollout_takes_down_at_once() {
        // The operator's host-network Deployments: every old pod goes at once, as the
        // Deployment controller does, so a second replica never waits for a port.
        let host = operator::build::deployment_strategy(true);
        assert_eq!(max_unavailable(Some(&host), 2), 2);
        let p = plan(2, max_unavailable(Some(&host), 2), &[pod("a", false, true), pod("b", false, true)]);
        assert_eq!(p, Plan { terminate: vec!["a".into(), "b".into()], start: 0 });
        // On the pod network: one at a time.
        let pod_network = operator::build::deployment_strategy(false);
        assert_eq!(max_unavailable(Some(&pod_network), 2), 1);
        let p = plan(2, max_unavailable(Some(&pod_network), 2), &[pod("a", false, true), pod("b", false, true)]);
        assert_eq!(p.terminate, vec!["a".to_string()]);
        // Percentages round down, unset is 25%, and never below one without a surge.
        let pct = |v: &str| DeploymentStrategy {
            rolling_update: Some(k8s_openapi::api::apps::v1::RollingUpdateDeployment {
                max_unavailable: Some(IntOrString::String(v.into())),
                max_surge: None,
            }),
            ..Default::default()
        };
        assert_eq!(max_unavailable(Some(&pct("50%")), 3), 1);
        assert_eq!(max_unavailable(Some(&pct("0%")), 3), 1);
        assert_eq!(max_unavailable(None, 8), 2);
        let recreate = DeploymentStrategy { type_: Some("Recreate".into()), rolling_update: None };
        assert_eq!(max_unavailable(Some(&recreate), 3), 3);
    }

    #[test]
    fn an_unready_old_pod_goes_first() {
        let p = plan(2, 1, &[pod("a", false, true), pod("b", false, false)]);
        assert_eq!(p.terminate, vec!["b".to_string()]);
    }

    #[test]
    fn scaling_down_stops_surplus_pods() {
        let p = plan(1, 1, &[pod("a", true, true), pod("b", true, true)]);
        assert_eq!(p.terminate, vec!["b".to_string()]);
        let p = plan(1, 1, &[pod("old", false, true), pod("a", true, true)]);
        assert_eq!(p.terminate, vec!["old".to_string()]);
        assert_eq!(plan(0, 1, &[pod("a", true, true)]).terminate, vec!["a".to_string()]);
    }

    #[test]
    fn status_reports_a_complete_rollout_as_the_deployment_controller_does() {
        let now = Time(Timestamp::now());
        let done = deployment_status(
            Some(3),
            "ccm-x-1234",
            Counts { desired: 2, replicas: 2, updated: 2, ready: 2, max_unavailable: 1 },
            None,
            &now,
        );
        assert_eq!(
            (done.observed_generation, done.available_replicas, done.unavailable_replicas),
            (Some(3), Some(2), Some(0))
        );
        let conditions = done.conditions.clone().unwrap();
        assert_eq!(conditions[0].reason.as_deref(), Some("MinimumReplicasAvailable"));
        assert_eq!(conditions[1].reason.as_deref(), Some("NewReplicaSetAvailable"));
        let rolling = deployment_status(
            Some(4),
            "ccm-x-5678",
            Counts { desired: 2, replicas: 2, updated: 1, ready: 1, max_unavailable: 1 },
            Some(&done),
            &now,
        );
        let conditions = rolling.conditions.clone().unwrap();
        assert_eq!(
            (conditions[0].status.as_str(), conditions[1].reason.as_deref()),
            ("True", Some("ReplicaSetUpdated"))
        );
        // The same counts again: nothing to write.
        let later = Time(Timestamp::now());
        let again = deployment_status(
            Some(4),
            "ccm-x-5678",
            Counts { desired: 2, replicas: 2, updated: 1, ready: 1, max_unavailable: 1 },
            Some(&rolling),
            &later,
        );
        assert!(!status_differs(&rolling, &again));
        assert_eq!(again.conditions.unwrap()[0].last_transition_time, conditions[0].last_transition_time);
        let down = deployment_status(
            Some(4),
            "x",
            Counts { desired: 2, replicas: 2, updated: 2, ready: 0, max_unavailable: 1 },
            None,
            &now,
        );
        assert_eq!(down.conditions.unwrap()[0].status, "False");
    }
}
