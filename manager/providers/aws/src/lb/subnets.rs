//! Where a new load balancer goes (pure): the subnets the annotation names, else one per zone
//! of the VPC chosen as upstream chooses them, and the fixed address each subnet gets.

use std::collections::BTreeMap;

use crate::annotations::{self as ann, LbAnnotations};

/// The tag that marks a subnet for load balancers of this scheme.
pub fn subnet_role_tag(internal: bool) -> &'static str {
    if internal { "kubernetes.io/role/internal-elb" } else { "kubernetes.io/role/elb" }
}

/// A subnet of the VPC as the choice of a new load balancer's subnets sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubnetCandidate {
    /// The availability zone.
    pub zone: String,
    /// The subnet ID.
    pub id: String,
    /// Whether it carries this cluster's tag (`kubernetes.io/cluster/<id>` or the legacy tag).
    pub cluster_tagged: bool,
    /// Whether it carries no `kubernetes.io/cluster/` tag at all.
    pub untagged: bool,
    /// Whether it carries the scheme's role tag key ([`subnet_role_tag`]).
    pub has_role: bool,
}

/// A route table of the VPC as the public/private test sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteTableInfo {
    /// Whether it is the VPC's main table.
    pub main: bool,
    /// The subnets explicitly associated with it.
    pub subnets: Vec<String>,
    /// Whether a route goes to an internet gateway (`igw-…`).
    pub to_internet: bool,
}

/// Whether a subnet is public (upstream's `isSubnetPublic`): its table, else the VPC's main
/// table, routes to an internet gateway. An error when neither table exists.
pub fn is_public(tables: &[RouteTableInfo], subnet: &str) -> Result<bool, String> {
    let table = tables
        .iter()
        .rev()
        .find(|t| t.subnets.iter().any(|s| s == subnet))
        .or_else(|| tables.iter().find(|t| t.main))
        .ok_or_else(|| format!("could not locate routing table for subnet {subnet}"))?;
    Ok(table.to_internet)
}

/// One subnet per zone for a new load balancer, as upstream (`findELBSubnets`): subnets with
/// this cluster's tag or no cluster tag (another cluster's are left out); public ones only for
/// an internet-facing load balancer (by route table); in a zone, the one with the role tag,
/// then the one with the cluster tag, then the lowest ID; zones sorted by name, and zones whose
/// type is known and not `availability-zone` (local, wavelength, outposts) left out.
/// `candidates` are in the order EC2 lists them; `fallback` is tried when none qualifies by
/// its tags (upstream's own subnet; here `SubnetID`).
pub fn pick_subnets(
    candidates: Vec<SubnetCandidate>,
    fallback: Option<SubnetCandidate>,
    tables: &[RouteTableInfo],
    zone_types: &BTreeMap<String, String>,
    internal: bool,
) -> Result<Vec<String>, String> {
    let mut usable: Vec<SubnetCandidate> = candidates.into_iter().filter(|s| s.cluster_tagged || s.untagged).collect();
    if usable.is_empty() {
        usable.extend(fallback);
    }
    let mut by_zone: BTreeMap<String, SubnetCandidate> = BTreeMap::new();
    for s in usable {
        if s.zone.is_empty() || s.id.is_empty() {
            continue;
        }
        if !internal && !is_public(tables, &s.id)? {
            continue;
        }
        let better = match by_zone.get(&s.zone) {
            None => true,
            Some(have) if have.has_role != s.has_role => s.has_role,
            Some(have) if have.cluster_tagged != s.cluster_tagged => s.cluster_tagged,
            Some(have) => s.id < have.id,
        };
        if better {
            by_zone.insert(s.zone.clone(), s);
        }
    }
    Ok(by_zone
        .into_iter()
        .filter(|(zone, _)| zone_types.get(zone).is_none_or(|t| t == "availability-zone"))
        .map(|(_, s)| s.id)
        .collect())
}

/// The `subnets` annotation as IDs: IDs as given, each name (`Name` tag) by the one subnet of
/// the VPC that carries it (`found`: (ID, name)).
pub fn resolve_subnets(requested: &[String], found: &[(String, String)]) -> Result<Vec<String>, ann::AnnotationError> {
    let mut out = Vec::new();
    for item in requested {
        if item.starts_with("subnet-") {
            out.push(item.clone());
            continue;
        }
        let ids: Vec<&String> = found.iter().filter(|(_, n)| n == item).map(|(id, _)| id).collect();
        match ids.as_slice() {
            [id] => out.push((*id).clone()),
            [] => {
                return Err(ann::AnnotationError::Conflict {
                    annotation: ann::SUBNETS,
                    reason: format!("no subnet of the VPC is named {item:?}"),
                });
            }
            _ => {
                return Err(ann::AnnotationError::Conflict {
                    annotation: ann::SUBNETS,
                    reason: format!("{} subnets of the VPC are named {item:?}; give the ID", ids.len()),
                });
            }
        }
    }
    out.dedup();
    Ok(out)
}

/// A subnet of the load balancer and the fixed address it gets there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubnetMapping {
    /// The subnet ID.
    pub subnet: String,
    /// An Elastic IP allocation (internet-facing).
    pub allocation_id: Option<String>,
    /// A private IPv4 address inside the subnet (internal).
    pub private_ipv4: Option<std::net::Ipv4Addr>,
}

/// Pair the subnets with the annotations' addresses: Elastic IPs in order, one per subnet;
/// private addresses by the subnet whose CIDR holds them, one per subnet.
pub fn subnet_mappings(
    subnets: &[(String, Option<ipnet::Ipv4Net>)],
    a: &LbAnnotations,
) -> Result<Vec<SubnetMapping>, ann::AnnotationError> {
    let mut out: Vec<SubnetMapping> = subnets
        .iter()
        .map(|(id, _)| SubnetMapping { subnet: id.clone(), allocation_id: None, private_ipv4: None })
        .collect();
    if !a.eip_allocations.is_empty() {
        if a.eip_allocations.len() != subnets.len() {
            return Err(ann::upstream(
                ann::EIP_ALLOCATIONS,
                ann::count_message("EIP AllocationIDs", a.eip_allocations.len(), subnets.len()),
            ));
        }
        for (m, e) in out.iter_mut().zip(&a.eip_allocations) {
            m.allocation_id = Some(e.clone());
        }
    }
    if !a.private_ipv4.is_empty() {
        if a.private_ipv4.len() != subnets.len() {
            return Err(ann::upstream(
                ann::PRIVATE_IPV4,
                ann::count_message("Private IPv4Addresses", a.private_ipv4.len(), subnets.len()),
            ));
        }
        for ip in &a.private_ipv4 {
            let slot = subnets
                .iter()
                .position(|(_, cidr)| cidr.is_some_and(|c| c.contains(ip)))
                .filter(|i| out[*i].private_ipv4.is_none())
                .ok_or_else(|| ann::AnnotationError::Conflict {
                    annotation: ann::PRIVATE_IPV4,
                    reason: format!("{ip} is not inside a subnet of the load balancer that has no address yet"),
                })?;
            out[slot].private_ipv4 = Some(*ip);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elastic_ips_pair_in_order_and_private_addresses_by_subnet_cidr() {
        let subnets = vec![
            ("subnet-a".to_string(), Some("10.0.1.0/24".parse().unwrap())),
            ("subnet-b".to_string(), Some("10.0.2.0/24".parse().unwrap())),
        ];
        let eips =
            LbAnnotations { eip_allocations: vec!["eipalloc-1".into(), "eipalloc-2".into()], ..Default::default() };
        let m = subnet_mappings(&subnets, &eips).unwrap();
        assert_eq!(m[0].allocation_id.as_deref(), Some("eipalloc-1"));
        assert_eq!(m[1].allocation_id.as_deref(), Some("eipalloc-2"));
        let ips = LbAnnotations {
            internal: true,
            private_ipv4: vec!["10.0.2.10".parse().unwrap(), "10.0.1.10".parse().unwrap()],
            ..Default::default()
        };
        let m = subnet_mappings(&subnets, &ips).unwrap();
        assert_eq!(m[0].private_ipv4, Some("10.0.1.10".parse().unwrap()));
        assert_eq!(m[1].private_ipv4, Some("10.0.2.10".parse().unwrap()));
        let outside = LbAnnotations {
            private_ipv4: vec!["10.0.1.10".parse().unwrap(), "10.9.9.9".parse().unwrap()],
            ..Default::default()
        };
        assert_eq!(subnet_mappings(&subnets, &outside).unwrap_err().annotation(), ann::PRIVATE_IPV4);
        let one = LbAnnotations { eip_allocations: vec!["eipalloc-1".into()], ..Default::default() };
        assert_eq!(subnet_mappings(&subnets, &one).unwrap_err().annotation(), ann::EIP_ALLOCATIONS);
        assert!(
            subnet_mappings(&subnets, &LbAnnotations::default()).unwrap().iter().all(|m| m.allocation_id.is_none())
        );
    }

    #[test]
    fn subnet_names_resolve_to_exactly_one_subnet_of_the_vpc() {
        let found = vec![
            ("subnet-a".to_string(), "public-a".to_string()),
            ("subnet-b".to_string(), "twin".to_string()),
            ("subnet-c".to_string(), "twin".to_string()),
        ];
        let ask = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(resolve_subnets(&ask(&["public-a", "subnet-x"]), &found).unwrap(), ask(&["subnet-a", "subnet-x"]));
        assert_eq!(resolve_subnets(&ask(&["nope"]), &found).unwrap_err().annotation(), ann::SUBNETS);
        assert!(resolve_subnets(&ask(&["twin"]), &found).unwrap_err().to_string().contains("give the ID"));
    }

    fn s(zone: &str, id: &str, cluster_tagged: bool, untagged: bool, has_role: bool) -> SubnetCandidate {
        SubnetCandidate { zone: zone.into(), id: id.into(), cluster_tagged, untagged, has_role }
    }

    fn public(subnets: &[&str]) -> Vec<RouteTableInfo> {
        vec![
            RouteTableInfo { main: true, subnets: Vec::new(), to_internet: false },
            RouteTableInfo { main: false, subnets: subnets.iter().map(|s| s.to_string()).collect(), to_internet: true },
        ]
    }

    #[test]
    fn another_clusters_subnets_are_left_out_and_untagged_ones_kept() {
        let all = ["subnet-1", "subnet-2", "subnet-3"];
        let c = vec![
            s("a", "subnet-1", false, false, true),
            s("b", "subnet-2", false, true, false),
            s("c", "subnet-3", true, false, false),
        ];
        assert_eq!(
            pick_subnets(c, None, &public(&all), &BTreeMap::new(), false).unwrap(),
            vec!["subnet-2".to_string(), "subnet-3".to_string()]
        );
    }

    #[test]
    fn internet_facing_takes_public_subnets_by_route_table_with_the_main_table_as_fallback() {
        let c = vec![s("a", "subnet-1", true, false, false), s("b", "subnet-2", true, false, false)];
        let tables = public(&["subnet-2"]);
        assert_eq!(
            pick_subnets(c.clone(), None, &tables, &BTreeMap::new(), false).unwrap(),
            vec!["subnet-2".to_string()]
        );
        assert_eq!(
            pick_subnets(c.clone(), None, &tables, &BTreeMap::new(), true).unwrap().len(),
            2,
            "internal takes both"
        );
        let main_public = vec![RouteTableInfo { main: true, subnets: Vec::new(), to_internet: true }];
        assert_eq!(pick_subnets(c.clone(), None, &main_public, &BTreeMap::new(), false).unwrap().len(), 2);
        let e = pick_subnets(c, None, &[], &BTreeMap::new(), false).unwrap_err();
        assert!(e.contains("could not locate routing table for subnet"), "{e}");
    }

    #[test]
    fn in_a_zone_the_role_tag_wins_then_the_cluster_tag_then_the_lowest_id() {
        let all = ["subnet-1", "subnet-2", "subnet-3", "subnet-9"];
        let t = public(&all);
        let z = BTreeMap::new();
        let pick = |c: Vec<SubnetCandidate>| pick_subnets(c, None, &t, &z, false).unwrap();
        assert_eq!(
            pick(vec![s("a", "subnet-1", true, false, false), s("a", "subnet-9", false, true, true)]),
            vec!["subnet-9".to_string()]
        );
        assert_eq!(
            pick(vec![s("a", "subnet-1", false, true, false), s("a", "subnet-9", true, false, false)]),
            vec!["subnet-9".to_string()]
        );
        assert_eq!(
            pick(vec![s("a", "subnet-3", true, false, false), s("a", "subnet-2", true, false, false)]),
            vec!["subnet-2".to_string()]
        );
    }

    #[test]
    fn local_and_wavelength_zones_are_left_out_and_zones_come_sorted() {
        let t = public(&["subnet-1", "subnet-2", "subnet-3"]);
        let types: BTreeMap<String, String> = [
            ("us-west-2-lax-1a".to_string(), "local-zone".to_string()),
            ("us-west-2a".to_string(), "availability-zone".to_string()),
        ]
        .into();
        let c = vec![
            s("us-west-2b", "subnet-3", true, false, false),
            s("us-west-2-lax-1a", "subnet-1", true, false, false),
            s("us-west-2a", "subnet-2", true, false, false),
        ];
        assert_eq!(
            pick_subnets(c, None, &t, &types, false).unwrap(),
            vec!["subnet-2".to_string(), "subnet-3".to_string()]
        );
    }

    #[test]
    fn the_fallback_subnet_is_used_only_when_no_subnet_qualifies_by_its_tags() {
        let t = public(&["subnet-1", "subnet-f"]);
        let fallback = Some(s("a", "subnet-f", false, false, false));
        let other = vec![s("a", "subnet-1", false, false, true)];
        assert_eq!(
            pick_subnets(other, fallback.clone(), &t, &BTreeMap::new(), false).unwrap(),
            vec!["subnet-f".to_string()]
        );
        let mine = vec![s("a", "subnet-1", true, false, false)];
        assert_eq!(pick_subnets(mine, fallback, &t, &BTreeMap::new(), false).unwrap(), vec!["subnet-1".to_string()]);
    }
}
