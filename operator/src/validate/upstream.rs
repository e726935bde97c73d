//! `spec.upstream` (pure): what an upstream CCM image cannot do, refused naming the field.
//!
//! An upstream manager takes upstream's flags only: this project's own settings (shadow mode,
//! the orphan sweep, load-balancer classes, node ownership, the announcers, the embedded
//! engine, the migration Lease in another namespace) have no flag there and would silently do
//! nothing, so a resource asking for them is refused instead.

use crds::{CloudControllerManager, Mode};
use kube::ResourceExt;

use super::verdict::Failure;
use crate::profiles;
use crds::reasons::config_valid as reason;

/// Why `spec.upstream` cannot run as specified, one failure per field; empty when it can or
/// when the resource runs the Rust manager.
pub fn upstream_refused(cr: &CloudControllerManager) -> Vec<Failure> {
    let spec = &cr.spec;
    let Some(upstream) = &spec.upstream else { return Vec::new() };
    let namespace = cr.namespace().unwrap_or_default();
    let profile = profiles::profile(upstream.profile);
    let name = upstream.profile.as_str();
    let mut out = Vec::new();
    let mut refuse = |field: &str, why: String| {
        out.push(Failure { reason: reason::INVALID_SPEC, message: format!("{field}: {why}") });
    };
    if let Some(why) = profile.refused {
        refuse("spec.upstream.profile", why.to_string());
    }
    if !profile.cloud_provider.is_empty() && spec.provider != profile.cloud_provider {
        refuse(
            "spec.provider",
            format!(
                "the {name} profile's manager registers the cloud provider {:?}, not {:?}; set spec.provider to {:?}",
                profile.cloud_provider, spec.provider, profile.cloud_provider
            ),
        );
    }
    if let Some(ns) = profile.namespace.filter(|ns| namespace != *ns) {
        refuse(
            "metadata.namespace",
            format!(
                "the {name} profile's manager locks Lease(s) {} in {ns}; create the resource in {ns}",
                profile.leases.join(", ")
            ),
        );
    }
    if profile.image.is_empty() && spec.deployment.image.is_none() {
        refuse(
            "spec.deployment.image",
            format!("the {name} profile has no image of its own; name the CCM image to run"),
        );
    }
    if profile.node_manager.is_none() && upstream.node_manager.as_ref().is_some_and(|n| n.enabled) {
        refuse(
            "spec.upstream.nodeManager",
            format!("the {name} profile has no node manager; its CCM initializes Nodes itself (remove the field)"),
        );
    }
    let unsupported = |what: &str| {
        format!("upstream CCMs have no {what}; it is this project's manager's (remove spec.upstream to run it)")
    };
    if spec.mode == Mode::Embedded {
        refuse("spec.mode", "Embedded runs this project's controllers inside the operator; an upstream image runs as a Deployment or DaemonSet".into());
    }
    if spec.shadow {
        refuse("spec.shadow", unsupported("shadow mode"));
    }
    if spec.orphans.sweep {
        refuse("spec.orphans.sweep", unsupported("orphan sweep"));
    }
    if spec.load_balancer_class.is_some() {
        refuse(
            "spec.loadBalancerClass",
            unsupported("--load-balancer-class flag (they take Services without a class only)"),
        );
    }
    if !spec.node_platforms.is_empty() {
        refuse("spec.nodePlatforms", unsupported("node ownership (--cloud-provider-platforms)"));
    }
    if spec.announcer.is_some() {
        refuse("spec.announcer", unsupported("announcers (they belong to the baremetal provider)"));
    }
    if spec.concurrency.route_syncs != crds::v1alpha1::Concurrency::default().route_syncs {
        refuse(
            "spec.concurrency.routeSyncs",
            unsupported("--concurrent-route-syncs flag (their route controller has one worker)"),
        );
    }
    for (i, arg) in spec.extra_args.iter().enumerate() {
        let flag = arg.split('=').next().unwrap_or_default();
        if profiles::NOT_UPSTREAM_EXTRA_ARGS.contains(&flag) {
            refuse(&format!("spec.extraArgs[{i}]"), unsupported(&format!("{flag} flag")));
        }
    }
    if spec.leader_election.migration.as_ref().is_some_and(|m| m.enabled && m.lease_namespace.is_some()) {
        refuse(
            "spec.leaderElection.migration.leaseNamespace",
            unsupported("--leader-migration-lease-namespace flag (their migration Lease is in their own namespace)"),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::testing::cr;
    use serde_json::json;

    fn messages(spec: serde_json::Value) -> Vec<String> {
        messages_in("kube-system", spec)
    }

    fn messages_in(namespace: &str, spec: serde_json::Value) -> Vec<String> {
        let mut c = cr("a", 1, spec);
        c.metadata.namespace = Some(namespace.into());
        upstream_refused(&c).into_iter().map(|f| f.message).collect()
    }

    #[test]
    fn a_profile_with_its_own_provider_name_is_accepted_and_another_name_is_refused_naming_spec_provider() {
        assert!(messages(json!({"provider": "aws", "upstream": {"profile": "aws"}})).is_empty());
        assert!(messages(json!({"provider": "gce", "upstream": {"profile": "gcp"}})).is_empty());
        let m = messages(json!({"provider": "gcp", "upstream": {"profile": "gcp"}}));
        assert_eq!(m.len(), 1);
        assert!(m[0].starts_with("spec.provider: ") && m[0].contains("\"gce\""), "{m:?}");
    }

    #[test]
    fn a_node_manager_is_refused_naming_the_field_on_a_profile_without_one() {
        let m = messages(json!({"provider": "aws", "upstream": {"profile": "aws", "nodeManager": {}}}));
        assert_eq!(m.len(), 1, "{m:?}");
        assert!(m[0].starts_with("spec.upstream.nodeManager: the aws profile has no node manager"), "{m:?}");
        assert!(
            messages(json!({"provider": "aws", "upstream": {"profile": "aws", "nodeManager": {"enabled": false}}}))
                .is_empty()
        );
        assert!(messages(json!({"provider": "azure", "upstream": {"profile": "azure", "nodeManager": {"image": "r.example/cnm:v1"}}})).is_empty());
    }

    #[test]
    fn generic_takes_any_provider_name_and_needs_an_image() {
        let m = messages(json!({"provider": "nimbus", "upstream": {"profile": "generic"}}));
        assert_eq!(m.len(), 1);
        assert!(m[0].starts_with("spec.deployment.image: "), "{m:?}");
        assert!(
            messages(json!({"provider": "nimbus", "upstream": {"profile": "generic"}, "deployment": {"image": "example.com/nimbus-ccm:v1"}}))
                .is_empty()
        );
    }

    #[test]
    fn settings_only_the_rust_manager_has_are_refused_each_naming_its_field() {
        let m = messages(json!({
            "provider": "aws",
            "upstream": {"profile": "aws"},
            "mode": "Embedded",
            "shadow": true,
            "orphans": {"sweep": true},
            "loadBalancerClass": "example.com/lb",
            "nodePlatforms": ["aws"],
            "announcer": {"l2": true},
            "concurrency": {"routeSyncs": 4},
            "extraArgs": ["--v=2", "--node-batch-size=50"],
            "leaderElection": {"migration": {"enabled": true, "leaseNamespace": "other"}},
        }));
        let fields: Vec<&str> = m.iter().map(|m| m.split(':').next().unwrap_or_default()).collect();
        assert_eq!(
            fields,
            [
                "spec.mode",
                "spec.shadow",
                "spec.orphans.sweep",
                "spec.loadBalancerClass",
                "spec.nodePlatforms",
                "spec.announcer",
                "spec.concurrency.routeSyncs",
                "spec.extraArgs[1]",
                "spec.leaderElection.migration.leaseNamespace"
            ]
        );
        // The same settings without spec.upstream are not this check's business.
        assert!(messages(json!({"provider": "aws", "shadow": true})).is_empty());
    }

    #[test]
    fn the_azure_profile_must_live_where_its_lock_lease_is() {
        let spec = json!({"provider": "azure", "upstream": {"profile": "azure"}});
        assert!(messages(spec.clone()).is_empty(), "kube-system");
        let m = messages_in("cloud", spec);
        assert_eq!(m.len(), 1);
        assert!(m[0].starts_with("metadata.namespace: ") && m[0].contains("aks-managed-resource-locker"), "{m:?}");
    }

    #[test]
    fn the_kind_profile_is_refused_with_the_reason_it_cannot_run_as_a_pod() {
        let m = messages(json!({"provider": "kind", "upstream": {"profile": "kind"}}));
        assert_eq!(m.len(), 1);
        assert!(m[0].starts_with("spec.upstream.profile: ") && m[0].contains("container runtime socket"), "{m:?}");
    }
}
