//! The environment (pure): what the operator's own installation allows, for the checks the
//! spec alone cannot make. The namespaces where it may work, Embedded mode, and whether a proxy
//! data path's listeners would be reachable where the provider runs.

use ccm_framework::config::ManagerConfig;
use ccm_provider_baremetal::deploy;
use crds::controllers::Controller;
use crds::{CloudControllerManager, Mode};

use super::manager_config::foreign_lease_namespace;
use super::secret::SecretState;
use super::verdict::{Failure, Validation};
use crds::reasons::config_valid as reason;

/// The namespaces where the operator reads cloud-config Secrets and runs managers (the chart
/// renders its namespaced Roles there). A CloudControllerManager elsewhere is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowedNamespaces(Vec<String>);

impl AllowedNamespaces {
    /// The namespaces of `list`, trimmed, empty entries dropped, sorted and deduplicated.
    pub fn new<S: AsRef<str>>(list: &[S]) -> Self {
        let mut v: Vec<String> = list.iter().map(|s| s.as_ref().trim().to_string()).filter(|s| !s.is_empty()).collect();
        v.sort();
        v.dedup();
        Self(v)
    }

    /// Whether `namespace` is allowed.
    pub fn contains(&self, namespace: &str) -> bool {
        self.0.iter().any(|n| n == namespace)
    }

    /// The namespaces, sorted.
    pub fn as_slice(&self) -> &[String] {
        &self.0
    }

    /// The namespaces for a message: `none` when there are none.
    fn listed(&self) -> String {
        if self.0.is_empty() { "none".to_string() } else { self.0.join(", ") }
    }
}

/// The verdict for a CloudControllerManager whose namespace is not allowed, naming the setting
/// that allows it.
pub fn namespace_not_allowed(namespace: &str, allowed: &AllowedNamespaces) -> Validation {
    let list = allowed.listed();
    Validation::refused(vec![Failure {
        reason: reason::NAMESPACE_NOT_ALLOWED,
        message: format!(
            "the operator does not read Secrets or run managers in namespace {namespace} (allowed: {list}); add it to the Helm value cloudConfig.namespaces (the operator's --cloud-config-namespaces), or create the CloudControllerManager in an allowed namespace"
        ),
    }])
}

/// The `NamespaceNotAllowed` verdict when `spec.leaderElection.migration.leaseNamespace` names a
/// namespace the operator does not serve (it has no rights there to grant the Lease), else
/// `None` (pure).
pub fn lease_namespace_not_allowed(cr: &CloudControllerManager, allowed: &AllowedNamespaces) -> Option<Validation> {
    let lease_namespace = foreign_lease_namespace(cr)?;
    if allowed.contains(&lease_namespace) {
        return None;
    }
    let list = allowed.listed();
    Some(Validation::refused(vec![Failure {
        reason: reason::NAMESPACE_NOT_ALLOWED,
        message: format!(
            "spec.leaderElection.migration.leaseNamespace: the operator does not serve namespace {lease_namespace} (allowed: {list}), so it cannot grant the manager the migration Lease there; choose an allowed namespace, or add it to the Helm value cloudConfig.namespaces (the operator's --cloud-config-namespaces)"
        ),
    }]))
}

/// What the operator's own installation allows, for the checks the spec alone cannot make.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Environment {
    /// Embedded mode may run: the operator's ServiceAccount holds the manager's rights
    /// (`--embedded-enabled`, the chart's `embedded.enabled`).
    pub embedded_enabled: bool,
    /// The operator process shares its Node's network namespace (`--embedded-host-network`), so
    /// an embedded engine's proxy listeners are reachable from outside (the sandbox, a binary on
    /// a host). The chart's operator Pod is on the pod network.
    pub host_network: bool,
}

impl Default for Environment {
    fn default() -> Self {
        Self { embedded_enabled: true, host_network: true }
    }
}

/// Whether a valid resource's manager (its `config`) would run a proxy data path: the baremetal
/// provider with `loadBalancer.mode: proxy` and the service controller enabled. Its listeners
/// open in the network namespace of the process that runs the provider.
pub fn runs_proxy_data_path(config: &ManagerConfig, secret: &SecretState) -> bool {
    let SecretState::Found { data, .. } = secret else { return false };
    config.provider == deploy::NAME
        && config.controllers.is_enabled(Controller::ServiceLb)
        && deploy::needs(data).is_ok_and(|n| n.proxy_data_path)
}

/// Refuse what this installation cannot run as specified, before anything is applied or torn
/// down: Embedded mode when it was not enabled (the engine would stall on 403s while holding the
/// Lease, after the working manager was removed), and a proxy data path whose listeners would
/// open in a Pod's own network namespace (the Service would get an address nothing answers on).
/// Only a valid verdict changes.
pub fn check_environment(
    cr: &CloudControllerManager,
    verdict: Validation,
    secret: &SecretState,
    env: &Environment,
) -> Validation {
    let Validation::Valid(valid) = &verdict else { return verdict };
    let embedded = cr.spec.mode == Mode::Embedded;
    let mut failures = Vec::new();
    // Where the provider's process is not on the host network; only then is the cloud-config
    // asked whether it runs a proxy data path.
    let off_host = if embedded && !env.host_network {
        Some("spec.mode is Embedded and the operator's Pod is not on the host network")
    } else if !embedded && !cr.spec.deployment.host_network {
        Some("spec.deployment.hostNetwork is false")
    } else {
        None
    };
    if embedded && !env.embedded_enabled {
        failures.push(Failure {
            reason: reason::EMBEDDED_NOT_ENABLED,
            message: "spec.mode is Embedded, but this operator was installed without Embedded mode, so it lacks the manager's permissions; install the chart with embedded.enabled=true (the operator's --embedded-enabled), or set spec.mode to Deployment or DaemonSet. Whatever runs now is left running".to_string(),
        });
    } else if let Some(where_) = off_host
        && runs_proxy_data_path(&valid.config, secret)
    {
        failures.push(Failure {
            reason: reason::PROXY_NEEDS_HOST_NETWORK,
            message: format!(
                "the cloud-config sets loadBalancer.mode: proxy, whose listeners must open on the Node, but {where_}: they would open in the Pod's own network namespace, where no traffic reaches them; run on the host network (spec.mode Deployment or DaemonSet with spec.deployment.hostNetwork: true) or use loadBalancer.mode: addresses"
            ),
        });
    }
    if failures.is_empty() { verdict } else { Validation::refused(failures) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::pipeline::validate;
    use crate::validate::testing::{cr, found, reason_of};
    use serde_json::json;

    #[test]
    fn embedded_mode_is_refused_naming_spec_mode_when_the_installation_did_not_enable_it() {
        let registry = ccm_builtin::registry();
        let disabled = Environment { embedded_enabled: false, host_network: false };
        let doc = b"instances: [{name: n1}]\n";
        let embedded = cr(
            "a",
            1,
            json!({"provider": "baremetal", "mode": "Embedded",
            "cloudConfig": {"secretRef": {"name": "cfg"}}}),
        );
        let v = check_environment(&embedded, validate(&embedded, &found(doc), &registry, &[]), &found(doc), &disabled);
        assert_eq!(reason_of(&v), reason::EMBEDDED_NOT_ENABLED);
        let (_, message) = v.summary().unwrap();
        assert!(message.contains("spec.mode") && message.contains("embedded.enabled"), "{message}");
        // Not a conflict: the apply step leaves whatever runs for it alone.
        assert!(matches!(&v, Validation::Invalid { conflicts_with, .. } if conflicts_with.is_empty()));
        // Enabled, or another mode: accepted.
        let enabled = Environment { embedded_enabled: true, ..disabled };
        let v = check_environment(&embedded, validate(&embedded, &found(doc), &registry, &[]), &found(doc), &enabled);
        assert!(v.is_valid(), "{v:?}");
        let deployment = cr("a", 1, json!({"provider": "baremetal", "cloudConfig": {"secretRef": {"name": "cfg"}}}));
        let v =
            check_environment(&deployment, validate(&deployment, &found(doc), &registry, &[]), &found(doc), &disabled);
        assert!(v.is_valid(), "{v:?}");
    }

    #[test]
    fn a_proxy_data_path_is_refused_where_its_listeners_would_be_unreachable() {
        let registry = ccm_builtin::registry();
        let proxy =
            b"instances: [{name: n1}]\nloadBalancer:\n  mode: proxy\n  pools: [{name: lan, cidrs: [10.0.0.0/30]}]\n";
        let addresses = b"instances: [{name: n1}]\nloadBalancer:\n  pools: [{name: lan, cidrs: [10.0.0.0/30]}]\n";
        let in_pod = Environment { embedded_enabled: true, host_network: false };
        let check = |spec: serde_json::Value, doc: &[u8], env: &Environment| {
            let mut spec = spec;
            spec["provider"] = json!("baremetal");
            spec["cloudConfig"] = json!({"secretRef": {"name": "cfg"}});
            let c = cr("a", 1, spec);
            check_environment(&c, validate(&c, &found(doc), &registry, &[]), &found(doc), env)
        };
        let refused = [
            (json!({"deployment": {"hostNetwork": false}}), "spec.deployment.hostNetwork"),
            (json!({"mode": "DaemonSet", "deployment": {"hostNetwork": false}}), "spec.deployment.hostNetwork"),
            (json!({"mode": "Embedded"}), "spec.mode"),
        ];
        for (spec, field) in refused {
            let v = check(spec.clone(), proxy, &in_pod);
            assert_eq!(reason_of(&v), reason::PROXY_NEEDS_HOST_NETWORK, "{spec}");
            let (_, message) = v.summary().unwrap();
            assert!(message.contains(field) && message.contains("loadBalancer.mode"), "{message}");
            // Addresses mode listens nowhere: nothing to refuse.
            assert!(check(spec.clone(), addresses, &in_pod).is_valid(), "{spec}");
            // Without the service controller no listener opens either.
            let mut no_lb = spec.clone();
            no_lb["controllers"] = json!(["*", "-service"]);
            assert!(check(no_lb, proxy, &in_pod).is_valid(), "{spec}");
        }
        // On the host network it works: the default pod, and an operator process on a host.
        assert!(check(json!({}), proxy, &in_pod).is_valid());
        assert!(check(json!({"mode": "DaemonSet"}), proxy, &in_pod).is_valid());
        assert!(check(json!({"mode": "Embedded"}), proxy, &Environment::default()).is_valid());
        // An earlier failure stands.
        let c = cr("a", 1, json!({"provider": "baremetal", "mode": "Embedded"}));
        let bad = found(b"instances: [");
        let v = check_environment(&c, validate(&c, &bad, &registry, &[]), &bad, &in_pod);
        assert_eq!(reason_of(&v), reason::CLOUD_CONFIG_REJECTED);
    }

    #[test]
    fn m7_a_lease_namespace_the_operator_does_not_serve_is_refused_naming_the_field() {
        let mut c = cr(
            "aws",
            1,
            json!({"provider": "plain", "leaderElection": {"migration": {"enabled": true, "leaseNamespace": "elsewhere"}}}),
        );
        let allowed = AllowedNamespaces::new(&["kube-system", "ccm-moving"]);
        let v = lease_namespace_not_allowed(&c, &allowed).expect("refused");
        assert_eq!(reason_of(&v), reason::NAMESPACE_NOT_ALLOWED);
        assert!(v.summary().unwrap().1.starts_with("spec.leaderElection.migration.leaseNamespace:"), "{v:?}");
        c.spec.leader_election.migration.as_mut().unwrap().lease_namespace = Some("ccm-moving".into());
        assert!(lease_namespace_not_allowed(&c, &allowed).is_none());
        // Its own namespace, or migration off, needs nothing more.
        c.spec.leader_election.migration.as_mut().unwrap().lease_namespace = Some("kube-system".into());
        assert!(lease_namespace_not_allowed(&c, &AllowedNamespaces::new(&["kube-system"])).is_none());
        c.spec.leader_election.migration.as_mut().unwrap().lease_namespace = Some("elsewhere".into());
        c.spec.leader_election.migration.as_mut().unwrap().enabled = false;
        assert!(lease_namespace_not_allowed(&c, &allowed).is_none());
    }

    #[test]
    fn namespace_not_allowed_names_the_setting_that_allows_it() {
        let allowed = AllowedNamespaces::new(&["kube-system", " ", "kube-system", "cloud"]);
        assert_eq!(allowed.as_slice(), ["cloud", "kube-system"]);
        assert!(allowed.contains("cloud") && !allowed.contains("tenant-a"));
        let v = namespace_not_allowed("tenant-a", &allowed);
        let (r, message) = v.summary().unwrap();
        assert_eq!(r, reason::NAMESPACE_NOT_ALLOWED);
        assert!(
            message.contains("cloudConfig.namespaces") && message.contains("--cloud-config-namespaces"),
            "{message}"
        );
        assert!(message.contains("tenant-a") && message.contains("cloud, kube-system"), "{message}");
    }
}
