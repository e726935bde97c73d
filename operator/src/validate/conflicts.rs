//! Conflicts between resources (pure): two managers must never run the same controller on the
//! same objects, and a manager's Lease must never be another's. The older resource wins; the
//! newer one is refused with `Conflict`, and a name that a core component's Lease or another
//! resource's Lease uses with `ReservedName`.

use ccm_framework::leader_migration::{self, Placement};
use ccm_framework::registry::Registry;
use crds::CloudControllerManager;
use crds::controllers::{Controller, ControllerSelection, route_controller_runs};
use crds::validation::validate_spec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{Resource, ResourceExt};

use super::manager_config::{effective_leader_migration, migration_lease_name, migration_lease_namespace};
use super::verdict::{Failure, Validation};
use crds::reasons::config_valid as reason;

/// The controllers a CloudControllerManager would run, as far as conflicts go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    /// Namespace of the CR.
    pub namespace: String,
    /// Name of the CR.
    pub name: String,
    /// UID of the CR.
    pub uid: String,
    /// Creation time; older CRs win conflicts.
    pub created: Option<Time>,
    /// Enabled node controllers (cloud-node, cloud-node-lifecycle).
    pub node_controllers: Vec<&'static str>,
    /// Whether it would run the route controller (enabled and `configureCloudRoutes`).
    pub routes: bool,
    /// When it runs the service controller, the `loadBalancerClass`es it takes (`None`: Services
    /// without one): its class, and no class too with `handleUnclassedServices`.
    pub services: Option<Vec<Option<String>>>,
    /// With leader migration: the migration Lease (namespace, name) and the controllers it runs
    /// under it. Two resources that migrate a controller under the same Lease never run it at
    /// once, so it is no conflict.
    pub migration: Option<((String, String), Vec<&'static str>)>,
    /// `spec.nodePlatforms`: the platforms whose Nodes it owns; empty: every Node.
    pub platforms: Vec<String>,
}

impl Peer {
    /// The conflict view of a CR, or `None` when it cannot run at all (being deleted, invalid
    /// spec, unknown provider): such a CR blocks no one.
    pub fn from_cr(cr: &CloudControllerManager, registry: &Registry) -> Option<Peer> {
        if validate_spec(&cr.spec).is_err() {
            return None;
        }
        let selection = ControllerSelection::parse(&cr.spec.controllers).ok()?;
        Peer::with_controllers(cr, &selection, registry)
    }

    /// [`Peer::from_cr`] for a CR whose spec passed `validate_spec`, with `spec.controllers`
    /// already resolved (`selection`).
    pub fn with_controllers(
        cr: &CloudControllerManager,
        selection: &ControllerSelection,
        registry: &Registry,
    ) -> Option<Peer> {
        // A resource in shadow mode writes nothing a controller owns (docs/shadow.md): it
        // neither blocks nor is blocked, so it can run beside the manager it would replace.
        if cr.meta().deletion_timestamp.is_some()
            || cr.spec.shadow
            || (cr.spec.upstream.is_none() && !registry.contains(&cr.spec.provider))
        {
            return None;
        }
        Some(Peer {
            namespace: cr.namespace().unwrap_or_default(),
            name: cr.name_any(),
            uid: cr.uid().unwrap_or_default(),
            created: cr.meta().creation_timestamp.clone(),
            node_controllers: [Controller::CloudNode, Controller::CloudNodeLifecycle]
                .into_iter()
                .filter(|c| selection.is_enabled(*c))
                .map(Controller::name)
                .collect(),
            // Whether the provider programs routes is not asked: a peer that might run the
            // route controller blocks the same ones.
            routes: route_controller_runs(selection, cr.spec.configure_cloud_routes, true),
            services: selection.is_enabled(Controller::ServiceLb).then(|| {
                let class = cr.spec.load_balancer_class.clone();
                let unclassed = cr.spec.handle_unclassed_services && class.is_some();
                std::iter::once(class).chain(unclassed.then_some(None)).collect()
            }),
            migration: effective_leader_migration(&cr.spec).map(|m| {
                let migrated = Controller::ALL
                    .into_iter()
                    .filter(|c| m.placement(c.name()) == Placement::Migrated)
                    .map(Controller::name)
                    .collect();
                let namespace = migration_lease_namespace(cr).unwrap_or_default();
                ((namespace, m.leader_name), migrated)
            }),
            platforms: cr.spec.node_platforms.clone(),
        })
    }

    /// Whether `self` and `other` both run `controller` under the same migration Lease.
    fn both_migrate(&self, other: &Peer, controller: &str) -> bool {
        match (&self.migration, &other.migration) {
            (Some((a, ca)), Some((b, cb))) => a == b && ca.contains(&controller) && cb.contains(&controller),
            _ => false,
        }
    }

    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// Whether `self` was created before `other` (ties broken by namespace, then name).
    fn precedes(&self, other: &Peer) -> bool {
        let a = (self.created.as_ref().map(|t| t.0), &self.namespace, &self.name);
        let b = (other.created.as_ref().map(|t| t.0), &other.namespace, &other.name);
        a < b
    }

    /// Whether `self` and `other` own disjoint sets of Nodes (both name platforms, none in
    /// common): their Node and route controllers never act on the same Node (KEP-5778).
    fn owns_other_nodes_than(&self, other: &Peer) -> bool {
        ccm_framework::ownership::disjoint(&self.platforms, &other.platforms)
    }

    /// What `self` and `other` would both do, described for a message; empty when nothing.
    fn overlap(&self, other: &Peer) -> Vec<String> {
        let mut out = Vec::new();
        let disjoint_nodes = self.owns_other_nodes_than(other);
        let nodes: Vec<&str> = self
            .node_controllers
            .iter()
            .filter(|c| other.node_controllers.contains(c) && !self.both_migrate(other, c) && !disjoint_nodes)
            .copied()
            .collect();
        if !nodes.is_empty() {
            out.push(format!("both run {}", nodes.join(" and ")));
        }
        if self.routes && other.routes && !disjoint_nodes && !self.both_migrate(other, Controller::NodeRoute.name()) {
            out.push(format!("both run {}", Controller::NodeRoute));
        }
        if let (Some(a), Some(b)) = (&self.services, &other.services)
            && !self.both_migrate(other, Controller::ServiceLb.name())
        {
            out.extend(a.iter().filter(|class| b.contains(class)).map(|class| match class {
                None => "both handle LoadBalancer Services without a loadBalancerClass".to_string(),
                Some(class) => format!("both handle LoadBalancer Services of class {class:?}"),
            }));
        }
        out
    }
}

/// The older CRs that `me` conflicts with, sorted, each with what overlaps.
pub fn conflicts_of(me: &Peer, peers: &[Peer]) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = peers
        .iter()
        .filter(|p| p.uid != me.uid && p.precedes(me))
        .filter_map(|p| {
            let overlap = me.overlap(p);
            (!overlap.is_empty()).then(|| (p.key(), overlap))
        })
        .collect();
    out.sort();
    out
}

/// One `Conflict` failure for each older CR that `me` conflicts with, and their keys.
pub fn conflict_failures(me: &Peer, peers: &[Peer]) -> (Vec<Failure>, Vec<String>) {
    conflicts_of(me, peers)
        .into_iter()
        .map(|(other, overlap)| {
            let failure = Failure {
                reason: reason::CONFLICT,
                message: format!(
                    "conflicts with CloudControllerManager {other}, which was created earlier: {}; this one is not deployed",
                    overlap.join(", ")
                ),
            };
            (failure, other)
        })
        .unzip()
}

/// Lease names of core components (and of this operator) that no resource may take: the
/// manager's Lease is named after its resource, and its own Role grants update on that name.
pub const RESERVED_LEASE_NAMES: [&str; 4] =
    ["kube-controller-manager", "kube-scheduler", "cloud-controller-manager", crate::names::OPERATOR_LEASE];
/// Prefixes of reserved Lease names: kube-apiserver's identity Leases (`apiserver-<hash>`,
/// formerly `kube-apiserver-<hash>`), every other `kube-` component, and the baremetal
/// announcers' Leases (`l2-announcer-<node>`), which every announcer of the namespace may write.
pub const RESERVED_LEASE_PREFIXES: [&str; 3] = ["kube-", "apiserver-", "l2-announcer-"];
/// Suffixes of reserved resource names: a resource named `x-announcer` would have the
/// ServiceAccount `ccm-x-announcer`, which is resource `x`'s announcer's (whose token the
/// admission policies let write announcer Leases only), and `x-node-manager` that of resource
/// `x`'s node manager (`spec.upstream.nodeManager`).
pub const RESERVED_NAME_SUFFIXES: [&str; 2] = ["-announcer", "-node-manager"];

/// The `ReservedName` failure when `name` (the resource's, and so its Lease's) is one a core
/// component's leader-election Lease uses, an announcer's, or one that would name another
/// resource's announcer (pure).
pub fn reserved_lease_name(name: &str) -> Option<Failure> {
    let reserved = RESERVED_LEASE_NAMES.contains(&name)
        || RESERVED_LEASE_PREFIXES.iter().any(|p| name.starts_with(p))
        || RESERVED_NAME_SUFFIXES.iter().any(|s| name.ends_with(s));
    reserved.then(|| Failure {
        reason: reason::RESERVED_NAME,
        message: format!(
            "metadata.name {name:?} is reserved: the manager's leader-election Lease is named after the resource, and this name belongs (or may belong) to a core component's or an announcer's Lease ({}, or a name starting with {}), or ends with {} (another resource's announcer or node manager); recreate the resource under another name",
            RESERVED_LEASE_NAMES.join(", "),
            RESERVED_LEASE_PREFIXES.join(" or "),
            RESERVED_NAME_SUFFIXES.join(" or ")
        ),
    })
}

/// The `ReservedName` failure when the migration Lease `cr` names is a core component's Lease or
/// another resource's main Lease in the Lease's namespace (its Role would then allow renewing
/// that Lease). The default name exists for this purpose and is always allowed (pure).
pub fn reserved_migration_lease(cr: &CloudControllerManager, peers: &[Peer]) -> Option<Failure> {
    let lease = migration_lease_name(&cr.spec)?;
    let namespace = migration_lease_namespace(cr).unwrap_or_default();
    let taken = peers.iter().any(|p| p.namespace == namespace && p.name == lease);
    let reserved = lease != leader_migration::DEFAULT_LEADER_NAME && (reserved_lease_name(&lease).is_some() || taken);
    reserved.then(|| Failure {
        reason: reason::RESERVED_NAME,
        message: format!(
            "spec.leaderElection.migration.leaderName {lease:?} is reserved: it is a core component's Lease ({}, or a name starting with {}) or another CloudControllerManager's Lease in namespace {namespace}; choose another name",
            RESERVED_LEASE_NAMES.join(", "),
            RESERVED_LEASE_PREFIXES.join(" or ")
        ),
    })
}

/// The verdict for a resource whose children's names are taken by objects it does not own, one
/// failure per conflict's message.
pub fn name_conflicts(messages: impl IntoIterator<Item = String>) -> Validation {
    Validation::refused(
        messages.into_iter().map(|message| Failure { reason: reason::NAME_CONFLICT, message }).collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::manager_config::{foreign_lease_namespace, manager_config};
    use crate::validate::pipeline::validate;
    use crate::validate::secret::SecretState;
    use crate::validate::testing::{cr, peers, reason_of, registry};
    use k8s_openapi::jiff::Timestamp;
    use serde_json::json;

    #[test]
    fn a_resource_named_like_a_core_components_lease_is_refused_naming_metadata_name() {
        for name in [
            "kube-controller-manager",
            "kube-scheduler",
            "cloud-controller-manager",
            "ccm-operator",
            "kube-x",
            "apiserver-abc",
            "l2-announcer-node-1",
            "metal-announcer",
            "azure-node-manager",
        ] {
            let v = validate(&cr(name, 1, json!({"provider": "plain"})), &SecretState::NotReferenced, &registry(), &[]);
            assert_eq!(reason_of(&v), reason::RESERVED_NAME, "{name}");
            let (_, message) = v.summary().unwrap();
            assert!(message.starts_with(&format!("metadata.name {name:?} is reserved")), "{message}");
        }
        for name in ["aws", "operator", "my-kube-ccm", "controller-manager"] {
            let v = validate(&cr(name, 1, json!({"provider": "plain"})), &SecretState::NotReferenced, &registry(), &[]);
            assert!(v.is_valid(), "{name}: {v:?}");
        }
    }

    #[test]
    fn later_cr_running_the_node_controller_conflicts_and_names_the_older() {
        let old = cr("old", 1, json!({"provider": "plain"}));
        let new = cr("new", 2, json!({"provider": "plain", "controllers": ["cloud-node"]}));
        let all = peers(&[&old, &new]);
        assert!(validate(&old, &SecretState::NotReferenced, &registry(), &all).is_valid());
        let v = validate(&new, &SecretState::NotReferenced, &registry(), &all);
        assert_eq!(reason_of(&v), reason::CONFLICT);
        let Validation::Invalid { conflicts_with, failures } = &v else { panic!() };
        assert_eq!(conflicts_with, &["kube-system/old"]);
        assert!(failures[0].message.contains("both run cloud-node-controller"), "{}", failures[0].message);
    }

    #[test]
    fn a_shadow_resource_runs_beside_the_manager_it_would_replace_and_blocks_no_one() {
        // The running resource is an upstream image; the shadow one is this project's manager.
        let running = cr("aws", 1, json!({"provider": "aws", "upstream": {"profile": "aws"}}));
        let shadow = cr("aws-shadow", 2, json!({"provider": "plain", "shadow": true}));
        let all = peers(&[&running, &shadow]);
        assert!(validate(&shadow, &SecretState::NotReferenced, &registry(), &all).is_valid());
        // An older shadow resource does not keep a newer acting one from running.
        let older_shadow = cr("first", 1, json!({"provider": "plain", "shadow": true}));
        let acting = cr("second", 2, json!({"provider": "plain"}));
        let all = peers(&[&older_shadow, &acting]);
        assert!(validate(&acting, &SecretState::NotReferenced, &registry(), &all).is_valid());
    }

    #[test]
    fn m7_resources_migrating_a_controller_under_one_lease_do_not_conflict_on_it() {
        let all_four = json!({"enabled": true, "leaderName": "moving", "controllerLeaders": [
            {"name": "cloud-node", "component": "*"}, {"name": "cloud-node-lifecycle", "component": "*"},
            {"name": "service", "component": "*"}, {"name": "route", "component": "*"}]});
        let old = cr("old", 1, json!({"provider": "plain", "leaderElection": {"migration": all_four}}));
        let new = cr("new", 2, json!({"provider": "plain", "leaderElection": {"migration": all_four}}));
        let all = peers(&[&old, &new]);
        assert!(validate(&new, &SecretState::NotReferenced, &registry(), &all).is_valid());
        // Upstream's default leaves cloud-node-controller under each main Lease: still a conflict.
        let old = cr("old", 1, json!({"provider": "plain", "leaderElection": {"migration": {"enabled": true}}}));
        let new = cr("new", 2, json!({"provider": "plain", "leaderElection": {"migration": {"enabled": true}}}));
        let v = validate(&new, &SecretState::NotReferenced, &registry(), &peers(&[&old, &new]));
        let Validation::Invalid { failures, .. } = &v else { panic!("{v:?}") };
        assert!(
            failures[0].message.contains("both run cloud-node-controller;")
                || failures[0].message.ends_with("both run cloud-node-controller; this one is not deployed"),
            "{}",
            failures[0].message
        );
        assert!(!failures[0].message.contains("LoadBalancer"), "{}", failures[0].message);
        // Different migration Leases guard nothing between them.
        let other = cr(
            "other",
            3,
            json!({"provider": "plain", "controllers": ["service"], "leaderElection": {"migration": {"enabled": true, "leaderName": "elsewhere"}}}),
        );
        let v = validate(&other, &SecretState::NotReferenced, &registry(), &peers(&[&old, &other]));
        assert_eq!(reason_of(&v), reason::CONFLICT);
    }

    #[test]
    fn m7_resources_in_two_namespaces_sharing_a_migration_lease_namespace_do_not_conflict() {
        let moving = |lease_ns: &str| {
            json!({"enabled": true, "leaderName": "moving", "leaseNamespace": lease_ns, "controllerLeaders": [
            {"name": "cloud-node", "component": "*"}, {"name": "cloud-node-lifecycle", "component": "*"},
            {"name": "service", "component": "*"}, {"name": "route", "component": "*"}]})
        };
        let in_ns = |ns: &str, name: &str, created: i64, migration: serde_json::Value| {
            let mut c = cr(name, created, json!({"provider": "plain", "leaderElection": {"migration": migration}}));
            c.metadata.namespace = Some(ns.into());
            c.metadata.uid = Some(format!("uid-{ns}-{name}"));
            c
        };
        let a = in_ns("ccm-a", "aws", 1, moving("ccm-moving"));
        let b = in_ns("ccm-b", "aws", 2, moving("ccm-moving"));
        assert!(validate(&b, &SecretState::NotReferenced, &registry(), &peers(&[&a, &b])).is_valid());
        let elsewhere = in_ns("ccm-b", "aws", 2, moving("ccm-elsewhere"));
        let v = validate(&elsewhere, &SecretState::NotReferenced, &registry(), &peers(&[&a, &elsewhere]));
        assert_eq!(reason_of(&v), reason::CONFLICT, "another lease namespace is another Lease");
        assert_eq!(foreign_lease_namespace(&b).as_deref(), Some("ccm-moving"));
        let config = manager_config(&b, None).unwrap();
        assert_eq!(config.leader_migration_namespace.as_deref(), Some("ccm-moving"));
        assert_eq!(config.leader_election.namespace, "ccm-b", "the main Lease stays in the resource's namespace");
        // Without leaseNamespace each uses a Lease in its own namespace: two Leases guard nothing.
        let a = in_ns(
            "ccm-a",
            "aws",
            1,
            json!({"enabled": true, "leaderName": "moving", "controllerLeaders": [{"name": "service", "component": "*"}]}),
        );
        let b = in_ns(
            "ccm-b",
            "aws",
            2,
            json!({"enabled": true, "leaderName": "moving", "controllerLeaders": [{"name": "service", "component": "*"}]}),
        );
        let v = validate(&b, &SecretState::NotReferenced, &registry(), &peers(&[&a, &b]));
        assert_eq!(reason_of(&v), reason::CONFLICT);
        // A migration Lease named like another resource's main Lease in the lease namespace.
        let there = in_ns("ccm-moving", "moving", 5, json!({"enabled": false}));
        let v = validate(&a, &SecretState::NotReferenced, &registry(), &peers(&[&there]));
        assert!(v.is_valid(), "{v:?}");
        let a = in_ns("ccm-a", "aws", 1, moving("ccm-moving"));
        let v = validate(&a, &SecretState::NotReferenced, &registry(), &peers(&[&there]));
        assert_eq!(reason_of(&v), reason::RESERVED_NAME);
        assert!(v.summary().unwrap().1.contains("namespace ccm-moving"), "{v:?}");
    }

    #[test]
    fn m7_a_migration_lease_named_like_a_core_components_or_another_resources_lease_is_refused() {
        for name in ["kube-scheduler", "cloud-controller-manager", "kube-anything", "old"] {
            let old = cr("old", 1, json!({"provider": "plain"}));
            let c = cr(
                "a",
                2,
                json!({"provider": "plain", "leaderElection": {"migration": {"enabled": true, "leaderName": name}}}),
            );
            let v = validate(&c, &SecretState::NotReferenced, &registry(), &peers(&[&old]));
            assert_eq!(reason_of(&v), reason::RESERVED_NAME, "{name}");
            assert!(v.summary().unwrap().1.starts_with("spec.leaderElection.migration.leaderName"), "{v:?}");
        }
        let c = cr(
            "a",
            2,
            json!({"provider": "plain", "leaderElection": {"migration": {"enabled": true, "leaderName": "cloud-provider-extraction-migration"}}}),
        );
        assert!(validate(&c, &SecretState::NotReferenced, &registry(), &[]).is_valid());
        let c = cr(
            "a",
            2,
            json!({"provider": "plain", "leaderElection": {"migration": {"enabled": true, "leaderName": "a"}}}),
        );
        let v = validate(&c, &SecretState::NotReferenced, &registry(), &[]);
        assert!(v.summary().unwrap().1.starts_with("spec.leaderElection.migration"), "{v:?}");
    }

    #[test]
    fn service_controllers_conflict_only_on_the_same_class() {
        let old = cr("old", 1, json!({"provider": "plain", "controllers": ["service"]}));
        let classed =
            cr("classed", 2, json!({"provider": "plain", "controllers": ["service"], "loadBalancerClass": "x"}));
        let unclassed = cr("unclassed", 3, json!({"provider": "plain", "controllers": ["service"]}));
        let all = peers(&[&old, &classed, &unclassed]);
        assert!(validate(&classed, &SecretState::NotReferenced, &registry(), &all).is_valid());
        let v = validate(&unclassed, &SecretState::NotReferenced, &registry(), &all);
        assert_eq!(reason_of(&v), reason::CONFLICT);
        assert!(v.summary().unwrap().1.contains("without a loadBalancerClass"));
    }

    #[test]
    fn s28_a_class_that_also_takes_unclassed_services_conflicts_with_an_unclassed_manager() {
        let old = cr("old", 1, json!({"provider": "plain", "controllers": ["service"]}));
        let both = cr(
            "both",
            2,
            json!({"provider": "plain", "controllers": ["service"], "loadBalancerClass": "x", "handleUnclassedServices": true}),
        );
        let other_class =
            cr("y", 3, json!({"provider": "plain", "controllers": ["service"], "loadBalancerClass": "y"}));
        let all = peers(&[&old, &both, &other_class]);
        let v = validate(&both, &SecretState::NotReferenced, &registry(), &all);
        assert_eq!(reason_of(&v), reason::CONFLICT);
        assert!(v.summary().unwrap().1.contains("without a loadBalancerClass"), "{v:?}");
        assert!(validate(&other_class, &SecretState::NotReferenced, &registry(), &all).is_valid());
        let alone = validate(&both, &SecretState::NotReferenced, &registry(), &peers(&[&both]));
        assert!(alone.is_valid(), "{alone:?}");
        let Validation::Valid(valid) = alone else { panic!("valid") };
        assert!(valid.config.to_args().iter().any(|a| a == "--handle-unclassed-services=true"));
    }

    #[test]
    fn route_controllers_conflict_unless_routes_are_off() {
        let old = cr("old", 1, json!({"provider": "plain", "controllers": ["route"]}));
        let off = cr("off", 2, json!({"provider": "plain", "controllers": ["route"], "configureCloudRoutes": false}));
        let on = cr("on", 3, json!({"provider": "plain", "controllers": ["route"]}));
        let all = peers(&[&old, &off, &on]);
        assert!(validate(&off, &SecretState::NotReferenced, &registry(), &all).is_valid());
        assert_eq!(reason_of(&validate(&on, &SecretState::NotReferenced, &registry(), &all)), reason::CONFLICT);
    }

    #[test]
    fn node_controllers_on_disjoint_platforms_do_not_conflict_and_shared_or_unrestricted_ones_do() {
        let nodes = json!(["cloud-node", "cloud-node-lifecycle", "route"]);
        let aws = cr("aws", 1, json!({"provider": "plain", "controllers": nodes, "nodePlatforms": ["aws"]}));
        let gce = cr("gce", 2, json!({"provider": "plain", "controllers": nodes, "nodePlatforms": ["gce"]}));
        let both = cr("both", 3, json!({"provider": "plain", "controllers": nodes, "nodePlatforms": ["gce", "aws"]}));
        let every = cr("every", 4, json!({"provider": "plain", "controllers": nodes}));
        let all = peers(&[&aws, &gce, &both, &every]);
        assert!(validate(&gce, &SecretState::NotReferenced, &registry(), &all).is_valid());
        for late in [&both, &every] {
            assert_eq!(reason_of(&validate(late, &SecretState::NotReferenced, &registry(), &all)), reason::CONFLICT);
        }
        // The service controller is not bound to Nodes: disjoint platforms still conflict there.
        let lb_a = cr("lb-a", 1, json!({"provider": "plain", "controllers": ["service"], "nodePlatforms": ["aws"]}));
        let lb_b = cr("lb-b", 2, json!({"provider": "plain", "controllers": ["service"], "nodePlatforms": ["gce"]}));
        let all = peers(&[&lb_a, &lb_b]);
        assert_eq!(reason_of(&validate(&lb_b, &SecretState::NotReferenced, &registry(), &all)), reason::CONFLICT);
    }

    #[test]
    fn the_platforms_are_rendered_and_a_bad_one_is_refused_naming_the_field() {
        let v = validate(
            &cr("mine", 1, json!({"provider": "plain", "nodePlatforms": ["aws", "gce"]})),
            &SecretState::NotReferenced,
            &registry(),
            &[],
        );
        let Validation::Valid(valid) = v else { panic!("valid: {v:?}") };
        assert!(valid.config.to_args().iter().any(|a| a == "--cloud-provider-platforms=aws,gce"));
        let v = validate(
            &cr("bad", 1, json!({"provider": "plain", "nodePlatforms": ["9lives"]})),
            &SecretState::NotReferenced,
            &registry(),
            &[],
        );
        let Validation::Invalid { failures, .. } = &v else { panic!("invalid: {v:?}") };
        assert!(failures[0].message.contains("spec.nodePlatforms"), "{failures:?}");
    }

    #[test]
    fn disjoint_controllers_do_not_conflict() {
        let a = cr("a", 1, json!({"provider": "plain", "controllers": ["cloud-node", "cloud-node-lifecycle"]}));
        let b = cr("b", 2, json!({"provider": "plain", "controllers": ["service", "route"]}));
        let all = peers(&[&a, &b]);
        assert!(validate(&b, &SecretState::NotReferenced, &registry(), &all).is_valid());
    }

    #[test]
    fn invalid_or_deleting_crs_block_no_one() {
        let bad = cr("bad", 1, json!({"provider": "nimbus"}));
        let mut deleting = cr("deleting", 1, json!({"provider": "plain"}));
        deleting.metadata.deletion_timestamp = Some(Time(Timestamp::from_second(5).unwrap()));
        let new = cr("new", 2, json!({"provider": "plain"}));
        let all = peers(&[&bad, &deleting, &new]);
        assert!(validate(&new, &SecretState::NotReferenced, &registry(), &all).is_valid());
    }

    #[test]
    fn same_creation_time_is_broken_by_name() {
        let a = cr("a", 1, json!({"provider": "plain"}));
        let b = cr("b", 1, json!({"provider": "plain"}));
        let all = peers(&[&a, &b]);
        assert!(validate(&a, &SecretState::NotReferenced, &registry(), &all).is_valid());
        assert!(!validate(&b, &SecretState::NotReferenced, &registry(), &all).is_valid());
    }

    #[test]
    fn conflict_and_missing_secret_are_both_reported() {
        let old = cr("old", 1, json!({"provider": "plain"}));
        let new = cr("new", 2, json!({"provider": "plain", "cloudConfig": {"secretRef": {"name": "cfg"}}}));
        let all = peers(&[&old, &new]);
        let v = validate(&new, &SecretState::NotFound { name: "cfg".into() }, &registry(), &all);
        let (r, message) = v.summary().unwrap();
        assert_eq!(r, reason::CONFLICT);
        assert!(message.contains("does not exist"), "{message}");
    }
}
