//! Which cloud objects the orphan scan lists as this cluster's (S34), and whether one listed may
//! still be deleted (S35), decided from tags, names and descriptions only (pure). The calls are
//! in `inventory.rs`.
//!
//! Ownership is upstream's marking: `kubernetes.io/cluster/<id>=owned` (or the legacy
//! `KubernetesCluster=<id>`); load balancers and target groups also name their Service in
//! `kubernetes.io/service-name`. Security groups carry no Service tag, so only the two kinds this
//! provider makes are listed: a Classic ELB's `k8s-elb-<name>` group (its description names the
//! Service) and an NLB's managed group (its Service is that of the load balancer using it).

use std::collections::BTreeMap;

use ccm_framework::provider::OwnedObject;

use super::names::{MANAGED_GROUP_DESCRIPTION, classic_group_name};
use super::tags::TAG_SERVICE;
use crate::cluster::ClusterIdentity;

/// An ELBv2 load balancer (an NLB; any type is listed when it carries the tags).
pub const KIND_LOAD_BALANCER: &str = "load-balancer";
/// A Classic ELB, identified by its name.
pub const KIND_CLASSIC_LOAD_BALANCER: &str = "classic-load-balancer";
/// An ELBv2 target group, identified by its ARN.
pub const KIND_TARGET_GROUP: &str = "target-group";
/// A security group made for a load balancer, identified by its group ID.
pub const KIND_SECURITY_GROUP: &str = "security-group";

/// The most pages read per listing call. A scan is a report, so an account with more objects
/// than this (tens of thousands) is listed in part and said so, rather than holding the leader
/// for minutes; the next scan starts over.
pub const MAX_PAGES: usize = 25;

/// Why a listed object is not deleted: its tags changed since the scan listed it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotOwned {
    /// The cluster's ownership tag is gone (or now names another cluster).
    #[error("{kind} {id} no longer carries cluster {cluster}'s ownership tag; left alone")]
    ClusterTag {
        /// The object's kind.
        kind: String,
        /// Its identity.
        id: String,
        /// This cluster's ID.
        cluster: String,
    },
    /// The Service tag names another Service than the one listed.
    #[error("{kind} {id} now names Service {now:?} instead of {listed:?}; left alone")]
    ServiceChanged {
        /// The object's kind.
        kind: String,
        /// Its identity.
        id: String,
        /// The Service the scan listed it for.
        listed: Option<String>,
        /// The Service its tag names now.
        now: Option<String>,
    },
    /// A kind this provider never lists.
    #[error("{kind} {id}: not a kind the aws provider lists; left alone")]
    UnknownKind {
        /// The object's kind.
        kind: String,
        /// Its identity.
        id: String,
    },
}

fn pairs(tags: &BTreeMap<String, String>) -> impl Iterator<Item = (&str, &str)> {
    tags.iter().map(|(k, v)| (k.as_str(), v.as_str()))
}

/// The Service a tag names, when it has the `namespace/name` form.
fn service_of(tags: &BTreeMap<String, String>) -> Option<String> {
    tags.get(TAG_SERVICE).filter(|s| s.split_once('/').is_some_and(|(ns, n)| !ns.is_empty() && !n.is_empty())).cloned()
}

/// An ELBv2 load balancer or target group (`kind`) as owned, when its tags carry the cluster's
/// ownership and name a Service. Without a Service tag it is not one this provider made for a
/// Service, so it is not listed (a sweep must never take it). No load-balancer name is given: the
/// provider adopts any NLB tagged for the Service, whatever its name.
pub fn elbv2_owned(
    kind: &str,
    arn: &str,
    tags: &BTreeMap<String, String>,
    cluster: &ClusterIdentity,
) -> Option<OwnedObject> {
    if arn.is_empty() || !cluster.owns(pairs(tags)) {
        return None;
    }
    Some(OwnedObject::new(kind, arn, Some(service_of(tags)?)))
}

/// A Classic ELB as owned, when its tags carry the cluster's ownership and name a Service. Its
/// name is given: the provider finds a Service's Classic ELB by the name derived from the
/// Service's UID only, so one of another name belongs to an earlier Service.
pub fn classic_owned(name: &str, tags: &BTreeMap<String, String>, cluster: &ClusterIdentity) -> Option<OwnedObject> {
    if name.is_empty() || !cluster.owns(pairs(tags)) {
        return None;
    }
    let service = service_of(tags)?;
    Some(OwnedObject {
        load_balancer: Some(name.to_string()),
        ..OwnedObject::new(KIND_CLASSIC_LOAD_BALANCER, name, Some(service))
    })
}

/// A security group as the scan sees it.
#[derive(Debug, Clone, Copy)]
pub struct GroupSeen<'a> {
    /// Its ID.
    pub id: &'a str,
    /// Its name.
    pub name: &'a str,
    /// Its description.
    pub description: &'a str,
    /// Its tags.
    pub tags: &'a BTreeMap<String, String>,
    /// Whether a load balancer uses it, and the Service that load balancer's tag names.
    pub used_by: Option<Option<&'a str>>,
}

/// The Classic ELB name and Service of a `k8s-elb-*` group's description, as
/// [`classic_group_description`](super::names::classic_group_description) writes it.
fn classic_group_owner(name: &str, description: &str) -> Option<(String, String)> {
    let lb = name.strip_prefix(classic_group_name("").as_str()).filter(|l| !l.is_empty())?;
    let rest = description.strip_prefix("Security group for Kubernetes ELB ")?;
    let (described, service) = rest.strip_suffix(')')?.split_once(" (")?;
    (described == lb && service.contains('/')).then(|| (lb.to_string(), service.to_string()))
}

/// A security group as owned: only a group this provider makes for a load balancer, carrying
/// the cluster's ownership. A Classic ELB's group names its Service and load balancer; an NLB's
/// managed group names the Service of the load balancer using it, and one no load balancer uses
/// names none (an orphan once nothing uses it). `uses_known` is false when the load balancers were
/// listed in part: a group whose use is unknown is then left out rather than called unused.
pub fn group_owned(group: &GroupSeen<'_>, cluster: &ClusterIdentity, uses_known: bool) -> Option<OwnedObject> {
    if group.id.is_empty() || !cluster.owns(pairs(group.tags)) {
        return None;
    }
    if let Some((lb, service)) = classic_group_owner(group.name, group.description) {
        return Some(OwnedObject {
            load_balancer: Some(lb),
            ..OwnedObject::new(KIND_SECURITY_GROUP, group.id, Some(service))
        });
    }
    let ours =
        group.name.starts_with(classic_group_name("").as_str()) || group.description == MANAGED_GROUP_DESCRIPTION;
    if !ours {
        // The Nodes' groups and any other group the cluster owns: never this provider's to delete.
        return None;
    }
    match group.used_by {
        Some(Some(service)) => Some(OwnedObject::new(KIND_SECURITY_GROUP, group.id, Some(service.to_string()))),
        // Used by a load balancer that names no Service: not ours to judge.
        Some(None) => None,
        None if uses_known => Some(OwnedObject::new(KIND_SECURITY_GROUP, group.id, None)),
        None => None,
    }
}

/// Where a kind goes in the deletion order: load balancers first (they hold their target groups
/// and security groups), then target groups, security groups last.
pub fn deletion_rank(kind: &str) -> u8 {
    match kind {
        KIND_LOAD_BALANCER | KIND_CLASSIC_LOAD_BALANCER => 0,
        KIND_TARGET_GROUP => 1,
        KIND_SECURITY_GROUP => 2,
        _ => 3,
    }
}

/// The indices of `objects` in deletion order (stable within a kind).
pub fn deletion_order(objects: &[OwnedObject]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..objects.len()).collect();
    order.sort_by_key(|&i| deletion_rank(&objects[i].kind));
    order
}

/// Whether `object`, listed by a scan, may still be deleted given its tags read again now: the
/// cluster's ownership must still be there and, for the kinds tagged with a Service, the same
/// Service named.
pub fn still_owned(
    object: &OwnedObject,
    tags: &BTreeMap<String, String>,
    cluster: &ClusterIdentity,
) -> Result<(), NotOwned> {
    if deletion_rank(&object.kind) > 2 {
        return Err(NotOwned::UnknownKind { kind: object.kind.clone(), id: object.id.clone() });
    }
    if !cluster.owns(pairs(tags)) {
        return Err(NotOwned::ClusterTag {
            kind: object.kind.clone(),
            id: object.id.clone(),
            cluster: cluster.id.clone(),
        });
    }
    if object.kind != KIND_SECURITY_GROUP {
        let now = service_of(tags);
        if now != object.service {
            return Err(NotOwned::ServiceChanged {
                kind: object.kind.clone(),
                id: object.id.clone(),
                listed: object.service.clone(),
                now,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lb::names::classic_group_description;

    fn cluster() -> ClusterIdentity {
        ClusterIdentity { id: "prod".into(), legacy: false }
    }

    fn tags(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    const OWNED: (&str, &str) = ("kubernetes.io/cluster/prod", "owned");
    const SVC: (&str, &str) = ("kubernetes.io/service-name", "shop/web");

    #[test]
    fn s34_an_elbv2_object_is_listed_only_with_the_clusters_owned_tag_and_a_service() {
        let c = cluster();
        let o = elbv2_owned(KIND_LOAD_BALANCER, "arn:lb", &tags(&[OWNED, SVC]), &c).unwrap();
        assert_eq!(
            (o.kind.as_str(), o.id.as_str(), o.service.as_deref()),
            ("load-balancer", "arn:lb", Some("shop/web"))
        );
        assert_eq!(o.load_balancer, None, "an NLB is the Service's whatever its name");
        let legacy = ClusterIdentity { id: "prod".into(), legacy: true };
        assert!(
            elbv2_owned(KIND_TARGET_GROUP, "arn:tg", &tags(&[("KubernetesCluster", "prod"), SVC]), &legacy).is_some()
        );
        // Shared, another cluster's, untagged, no Service, a malformed Service: not listed.
        assert!(
            elbv2_owned(KIND_LOAD_BALANCER, "a", &tags(&[("kubernetes.io/cluster/prod", "shared"), SVC]), &c).is_none()
        );
        assert!(
            elbv2_owned(KIND_LOAD_BALANCER, "a", &tags(&[("kubernetes.io/cluster/other", "owned"), SVC]), &c).is_none()
        );
        assert!(elbv2_owned(KIND_LOAD_BALANCER, "a", &tags(&[SVC]), &c).is_none());
        assert!(elbv2_owned(KIND_LOAD_BALANCER, "a", &tags(&[OWNED]), &c).is_none());
        assert!(
            elbv2_owned(KIND_LOAD_BALANCER, "a", &tags(&[OWNED, ("kubernetes.io/service-name", "web")]), &c).is_none()
        );
    }

    #[test]
    fn s34_a_classic_elb_is_listed_with_its_name_so_an_earlier_services_one_is_told_apart() {
        let c = cluster();
        let o = classic_owned("a0123", &tags(&[OWNED, SVC]), &c).unwrap();
        assert_eq!(o.kind, KIND_CLASSIC_LOAD_BALANCER);
        assert_eq!((o.service.as_deref(), o.load_balancer.as_deref()), (Some("shop/web"), Some("a0123")));
        assert!(classic_owned("a0123", &tags(&[SVC]), &c).is_none());
    }

    #[test]
    fn s34_only_the_groups_made_for_load_balancers_are_listed_with_the_service_they_serve() {
        let c = cluster();
        let owned = tags(&[OWNED]);
        let description = classic_group_description("a0123", "shop/web");
        let classic =
            GroupSeen { id: "sg-1", name: "k8s-elb-a0123", description: &description, tags: &owned, used_by: None };
        let o = group_owned(&classic, &c, true).unwrap();
        assert_eq!((o.kind.as_str(), o.id.as_str()), ("security-group", "sg-1"));
        assert_eq!((o.service.as_deref(), o.load_balancer.as_deref()), (Some("shop/web"), Some("a0123")));
        // The Nodes' group, though the cluster owns it, is never listed.
        let nodes = GroupSeen { id: "sg-2", name: "nodes", description: "nodes", tags: &owned, used_by: None };
        assert!(group_owned(&nodes, &c, true).is_none());
        // A managed group: the Service of the load balancer using it, none when unused.
        let managed = GroupSeen {
            id: "sg-3",
            name: "k8s-shop-web-0123456789",
            description: MANAGED_GROUP_DESCRIPTION,
            tags: &owned,
            used_by: Some(Some("shop/web")),
        };
        assert_eq!(group_owned(&managed, &c, true).unwrap().service.as_deref(), Some("shop/web"));
        let unused = GroupSeen { used_by: None, ..managed };
        assert_eq!(group_owned(&unused, &c, true).unwrap().service, None);
        assert!(group_owned(&unused, &c, false).is_none(), "use unknown: not called unused");
        assert!(group_owned(&GroupSeen { used_by: Some(None), ..managed }, &c, true).is_none());
        // Without the owned tag: never.
        let shared = tags(&[("kubernetes.io/cluster/prod", "shared")]);
        assert!(group_owned(&GroupSeen { tags: &shared, ..classic }, &c, true).is_none());
    }

    #[test]
    fn s35_deletions_go_load_balancers_then_target_groups_then_security_groups() {
        let objects = vec![
            OwnedObject::new(KIND_SECURITY_GROUP, "sg", None),
            OwnedObject::new(KIND_TARGET_GROUP, "tg", None),
            OwnedObject::new(KIND_CLASSIC_LOAD_BALANCER, "clb", None),
            OwnedObject::new(KIND_TARGET_GROUP, "tg2", None),
            OwnedObject::new(KIND_LOAD_BALANCER, "lb", None),
        ];
        let ids: Vec<&str> = deletion_order(&objects).into_iter().map(|i| objects[i].id.as_str()).collect();
        assert_eq!(ids, ["clb", "lb", "tg", "tg2", "sg"]);
    }

    #[test]
    fn s35_an_object_whose_tags_changed_since_the_scan_is_refused() {
        let c = cluster();
        let lb = OwnedObject::new(KIND_LOAD_BALANCER, "arn:lb", Some("shop/web".into()));
        assert_eq!(still_owned(&lb, &tags(&[OWNED, SVC]), &c), Ok(()));
        let moved = tags(&[("kubernetes.io/cluster/other", "owned"), SVC]);
        assert!(matches!(still_owned(&lb, &moved, &c), Err(NotOwned::ClusterTag { .. })));
        let shared = tags(&[("kubernetes.io/cluster/prod", "shared"), SVC]);
        assert!(matches!(still_owned(&lb, &shared, &c), Err(NotOwned::ClusterTag { .. })));
        let other = tags(&[OWNED, ("kubernetes.io/service-name", "shop/api")]);
        assert!(matches!(still_owned(&lb, &other, &c), Err(NotOwned::ServiceChanged { .. })));
        // Groups carry no Service tag: ownership alone.
        let sg = OwnedObject::new(KIND_SECURITY_GROUP, "sg-1", Some("shop/web".into()));
        assert_eq!(still_owned(&sg, &tags(&[OWNED]), &c), Ok(()));
        assert!(still_owned(&sg, &tags(&[]), &c).is_err());
        let odd = OwnedObject::new("address", "192.0.2.1", None);
        assert!(matches!(still_owned(&odd, &tags(&[OWNED]), &c), Err(NotOwned::UnknownKind { .. })));
        assert!(
            NotOwned::ClusterTag { kind: "load-balancer".into(), id: "x".into(), cluster: "prod".into() }
                .to_string()
                .contains("prod")
        );
    }
}
