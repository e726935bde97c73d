//! Foreign cloud-controller-managers (pure): a CCM this operator does not run, found by the
//! Leases upstream CCMs elect on, keeps a resource from starting controllers that would
//! compete with it, unless the resource takes over by leader migration.
//!
//! Upstream managers elect on `kube-system/cloud-controller-manager` (their default
//! `--leader-elect-resource-name`, which no resource may be named: [`super::RESERVED_LEASE_NAMES`])
//! and, while migrating, on `kube-system/cloud-provider-extraction-migration`. A fresh holder of
//! the first is never one of this operator's managers; of the second, only when no resource of
//! this operator migrates on it.

use std::time::Duration;

use ccm_framework::leader_migration::DEFAULT_LEADER_NAME;
use crds::CloudControllerManager;
use crds::reasons::config_valid as reason;

use super::verdict::{Failure, Validation};

/// The namespace of the Leases upstream CCMs elect on by default.
pub const FOREIGN_LEASE_NAMESPACE: &str = "kube-system";
/// The Leases upstream CCMs elect on by default: the leader Lease and the migration Lease.
pub const FOREIGN_LEASES: [&str; 2] = ["cloud-controller-manager", DEFAULT_LEADER_NAME];

/// Whether `namespace/name` is one of [`FOREIGN_LEASES`].
pub fn is_foreign_lease(namespace: &str, name: &str) -> bool {
    namespace == FOREIGN_LEASE_NAMESPACE && FOREIGN_LEASES.contains(&name)
}

/// A fresh holder of a foreign Lease that is not one of this operator's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForeignHolder {
    /// The Lease's namespace.
    pub namespace: String,
    /// The Lease's name.
    pub name: String,
    /// Its holder identity.
    pub holder: String,
    /// When it expires unrenewed: the resource is looked at again then.
    pub expires_in: Option<Duration>,
}

/// The fresh holders of [`FOREIGN_LEASES`] among `observed` (`(namespace, name, holder if
/// fresh, expiry)`), leaving out the Leases some resource of this operator migrates on
/// (`ours`, as `(namespace, name)`).
pub fn foreign_holders(
    observed: &[(String, String, Option<String>, Option<Duration>)],
    ours: &[(String, String)],
) -> Vec<ForeignHolder> {
    observed
        .iter()
        .filter(|(ns, name, _, _)| is_foreign_lease(ns, name))
        .filter(|(ns, name, _, _)| !ours.iter().any(|(o_ns, o_name)| o_ns == ns && o_name == name))
        .filter_map(|(ns, name, holder, expires_in)| {
            let holder = holder.clone().filter(|h| !h.is_empty())?;
            Some(ForeignHolder { namespace: ns.clone(), name: name.clone(), holder, expires_in: *expires_in })
        })
        .collect()
}

/// `verdict`, or `ForeignManager` when it is valid but `holders` shows a CCM this operator does
/// not run and `cr` neither takes over by leader migration nor runs in shadow mode. What already runs keeps running
/// (the apply step stops only conflicts between this operator's own resources); a resource
/// that runs nothing yet starts nothing.
pub fn check_foreign(cr: &CloudControllerManager, verdict: Validation, holders: &[ForeignHolder]) -> Validation {
    if !verdict.is_valid() || holders.is_empty() {
        return verdict;
    }
    // Taking over by migration, or shadow mode (deciding without acting competes with no one).
    if cr.spec.shadow || cr.spec.leader_election.migration.as_ref().is_some_and(|m| m.enabled) {
        return verdict;
    }
    let held: Vec<String> =
        holders.iter().map(|h| format!("Lease {}/{} is held by {:?}", h.namespace, h.name, h.holder)).collect();
    Validation::refused(vec![Failure {
        reason: reason::FOREIGN_MANAGER,
        message: format!(
            "a cloud-controller-manager this operator does not run is active ({}): this resource's controllers would compete with it; stop it, or take over from it with spec.leaderElection.migration (docs/migrating.md)",
            held.join("; ")
        ),
    }])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::testing::cr;
    use crate::validate::{Validated, manager_config};
    use serde_json::json;

    fn observed(name: &str, holder: Option<&str>) -> (String, String, Option<String>, Option<Duration>) {
        ("kube-system".into(), name.into(), holder.map(String::from), Some(Duration::from_secs(12)))
    }

    fn valid(c: &CloudControllerManager) -> Validation {
        Validation::Valid(Validated {
            config: manager_config(c, None).expect("a config"),
            cloud_config: None,
            provider_has_routes: false,
        })
    }

    #[test]
    fn only_fresh_holders_of_the_upstream_leases_that_no_resource_migrates_on_are_foreign() {
        let all = [
            observed("cloud-controller-manager", Some("vm_1")),
            observed("cloud-provider-extraction-migration", Some("vm_2")),
            observed("aws", Some("vm_3")),
            observed("cloud-controller-manager", None),
            ("ccm-system".into(), "cloud-controller-manager".into(), Some("vm_4".into()), None),
        ];
        let found = foreign_holders(&all, &[]);
        let holders: Vec<&str> = found.iter().map(|h| h.holder.as_str()).collect();
        assert_eq!(holders, ["vm_1", "vm_2"]);
        let ours = [("kube-system".to_string(), "cloud-provider-extraction-migration".to_string())];
        let found = foreign_holders(&all, &ours);
        assert_eq!(found.iter().map(|h| h.holder.as_str()).collect::<Vec<_>>(), ["vm_1"], "a migration of ours");
    }

    #[test]
    fn a_foreign_manager_keeps_a_resource_from_starting_unless_it_takes_over_by_migration() {
        let holders = vec![ForeignHolder {
            namespace: "kube-system".into(),
            name: "cloud-controller-manager".into(),
            holder: "ip-10-0-1-5_0b9f".into(),
            expires_in: None,
        }];
        let plain = cr("aws", 1, json!({"provider": "plain"}));
        let v = check_foreign(&plain, valid(&plain), &holders);
        let (r, message) = v.summary().expect("refused");
        assert_eq!(r, reason::FOREIGN_MANAGER);
        assert!(message.contains("kube-system/cloud-controller-manager is held by \"ip-10-0-1-5_0b9f\""), "{message}");
        assert!(message.contains("spec.leaderElection.migration"), "{message}");
        assert!(check_foreign(&plain, valid(&plain), &[]).is_valid(), "no foreign manager");
        let migrating = cr("aws", 1, json!({"provider": "plain", "leaderElection": {"migration": {"enabled": true}}}));
        assert!(check_foreign(&migrating, valid(&migrating), &holders).is_valid(), "taking over by migration");
        let shadow = cr("aws", 1, json!({"provider": "plain", "shadow": true}));
        assert!(check_foreign(&shadow, valid(&shadow), &holders).is_valid(), "shadow mode competes with no one");
        // An invalid verdict stays as it was.
        let invalid = Validation::refused(vec![Failure { reason: reason::INVALID_SPEC, message: "x".into() }]);
        assert_eq!(check_foreign(&plain, invalid.clone(), &holders), invalid);
    }
}
