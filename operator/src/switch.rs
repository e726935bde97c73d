//! A switch between Deployment and DaemonSet mode: when the previous mode's workload may go
//! (pure).
//!
//! Both workloads run the same manager on the same leader-election Lease (named after the
//! resource, whatever the mode), so while both run only one of them leads: keeping the old one
//! a little longer is safe, and pruning it before the new one serves is an outage.

use crate::status::Workload;

/// What to do with the previous mode's workload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Switch {
    /// Prune it now.
    PruneOld,
    /// Keep it serving; the message says what the switch waits for.
    KeepOld(String),
}

/// Whether the old workload (`old_kind`, e.g. `"Deployment"`) may be pruned, given the new
/// workload as observed. It goes once the new one has an available Pod. On the host network the
/// two would fight over the same host ports on a Node, so there it goes as soon as the new one
/// has somewhere to run (like a `maxUnavailable: 100%` rollout), but not while no Node matches
/// the new DaemonSet.
pub fn decide(old_kind: &str, new: &Workload, host_network: bool) -> Switch {
    let keep =
        |waits_for: &str| Switch::KeepOld(format!("switching modes: the {old_kind} keeps serving until {waits_for}"));
    match new {
        Workload::Deployment(d) if d.available > 0 => Switch::PruneOld,
        Workload::DaemonSet(d) if d.available > 0 => Switch::PruneOld,
        Workload::Deployment(d) if host_network && d.desired > 0 => Switch::PruneOld,
        // A DaemonSet's desired count is only known once its controller observed it.
        Workload::DaemonSet(d) if host_network && d.desired > 0 && d.observed_generation >= d.generation => {
            Switch::PruneOld
        }
        Workload::DaemonSet(d) if d.observed_generation >= d.generation && d.desired == 0 => {
            keep("the DaemonSet matches a Node")
        }
        Workload::DaemonSet(_) => keep("the DaemonSet has an available Pod"),
        Workload::Deployment(_) => keep("the Deployment has an available Pod"),
        // Not observed yet (just created).
        Workload::None | Workload::Embedded(_) => keep("the new workload has an available Pod"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::{DaemonSetObservation, DeploymentObservation};

    fn ds(generation: i64, observed: i64, desired: i32, available: i32) -> Workload {
        Workload::DaemonSet(DaemonSetObservation {
            generation,
            observed_generation: observed,
            desired,
            available,
            ..Default::default()
        })
    }

    fn dep(desired: i32, available: i32) -> Workload {
        Workload::Deployment(DeploymentObservation {
            generation: 1,
            observed_generation: 1,
            desired,
            available,
            ..Default::default()
        })
    }

    #[test]
    fn the_old_workload_stays_until_the_new_one_has_an_available_pod() {
        for host_network in [false, true] {
            assert!(matches!(decide("Deployment", &Workload::None, host_network), Switch::KeepOld(_)));
            assert_eq!(decide("Deployment", &ds(1, 1, 1, 1), host_network), Switch::PruneOld);
            assert_eq!(decide("DaemonSet", &dep(2, 1), host_network), Switch::PruneOld);
        }
        assert!(matches!(decide("Deployment", &ds(1, 1, 1, 0), false), Switch::KeepOld(_)));
        assert!(matches!(decide("DaemonSet", &dep(2, 0), false), Switch::KeepOld(_)));
    }

    #[test]
    fn a_daemon_set_that_matches_no_node_keeps_the_deployment_even_on_the_host_network() {
        for host_network in [false, true] {
            let Switch::KeepOld(message) = decide("Deployment", &ds(1, 1, 0, 0), host_network) else {
                panic!("pruned the Deployment while no Node can run the DaemonSet");
            };
            assert!(message.contains("Deployment keeps serving") && message.contains("matches a Node"), "{message}");
        }
        // Not observed yet: its zero counts mean nothing.
        assert!(matches!(decide("Deployment", &ds(1, 0, 0, 0), true), Switch::KeepOld(_)));
    }

    #[test]
    fn on_the_host_network_the_old_workload_goes_once_the_new_one_has_a_node() {
        // Both would want the same host ports on that Node.
        assert_eq!(decide("Deployment", &ds(1, 1, 1, 0), true), Switch::PruneOld);
        assert_eq!(decide("DaemonSet", &dep(1, 0), true), Switch::PruneOld);
    }
}
