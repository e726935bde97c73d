//! Shadow mode's pure decision for one route pass: the routes this controller would create
//! or delete and the `NetworkUnavailable` conditions it would write. No I/O here.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;

use super::NAME;
use super::logic::{self, Action, NETWORK_UNAVAILABLE, Plan};
use crate::shadow::{Difference, DifferenceKind, FieldDifference, ObjectKey};

/// The differences of a pass planned as `plan` over `nodes`, assuming every operation
/// would succeed (so a Node whose routes would be created would get `NetworkUnavailable=False`).
/// Keyed by the object they are about.
pub fn differences<'a>(plan: &Plan, nodes: impl IntoIterator<Item = &'a Node>) -> BTreeMap<ObjectKey, Vec<Difference>> {
    let mut out: BTreeMap<ObjectKey, Vec<Difference>> = BTreeMap::new();
    for route in &plan.deletions {
        let key = ObjectKey::route(&route.target_node, &route.destination_cidr);
        let d = Difference::new(
            NAME,
            key.clone(),
            DifferenceKind::WouldDeleteRoute,
            vec![FieldDifference::new("destinationCIDR", route.destination_cidr.clone())],
        );
        out.entry(key).or_default().push(d);
    }
    for c in &plan.creations {
        let key = ObjectKey::route(&c.route.target_node, &c.route.destination_cidr);
        let d = Difference::new(
            NAME,
            key.clone(),
            DifferenceKind::WouldCreateRoute,
            vec![
                FieldDifference::new("destinationCIDR", c.route.destination_cidr.clone()),
                FieldDifference::new("targetNode", c.route.target_node.clone()),
            ],
        );
        out.entry(key).or_default().push(d);
    }
    let by_name: BTreeMap<&str, &Node> =
        nodes.into_iter().map(|n| (n.metadata.name.as_deref().unwrap_or_default(), n)).collect();
    for (name, actions) in &plan.actions {
        let Some(node) = by_name.get(name.as_str()) else { continue };
        // Creations are assumed to succeed, as the pass would then write.
        let after: BTreeMap<String, Action> = actions.keys().map(|cidr| (cidr.clone(), Action::Keep)).collect();
        let (status, reason, _) = logic::network_condition(&after);
        if logic::condition_needs_write(logic::current_condition(node), status, reason) {
            let key = ObjectKey::node(name.clone());
            let d = Difference::new(
                NAME,
                key.clone(),
                DifferenceKind::WouldPatch,
                vec![FieldDifference::new(
                    format!("status.conditions[{NETWORK_UNAVAILABLE}]"),
                    format!("{status}/{reason}"),
                )],
            );
            out.entry(key).or_default().push(d);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::Route;
    use ipnet::IpNet;
    use k8s_openapi::api::core::v1::{NodeCondition, NodeSpec, NodeStatus};
    use kube::api::ObjectMeta;

    fn node(name: &str, cidr: &str, condition: Option<(&str, &str)>) -> Node {
        Node {
            metadata: ObjectMeta { name: Some(name.into()), uid: Some(format!("uid-{name}")), ..Default::default() },
            spec: Some(NodeSpec { pod_cidr: Some(cidr.into()), ..Default::default() }),
            status: Some(NodeStatus {
                conditions: condition.map(|(s, r)| {
                    vec![NodeCondition {
                        type_: NETWORK_UNAVAILABLE.into(),
                        status: s.into(),
                        reason: Some(r.into()),
                        ..Default::default()
                    }]
                }),
                ..Default::default()
            }),
        }
    }

    fn route(target: &str, cidr: &str) -> Route {
        Route { target_node: target.into(), destination_cidr: cidr.into(), ..Default::default() }
    }

    #[test]
    fn routes_in_place_and_conditions_written_show_no_difference() {
        let cidrs: Vec<IpNet> = vec!["10.244.0.0/16".parse().unwrap()];
        let n = node("a", "10.244.1.0/24", Some(("False", logic::REASON_ROUTE_CREATED)));
        let plan = logic::plan(&[route("a", "10.244.1.0/24")], &[&n], &cidrs);
        assert!(differences(&plan, [&n]).is_empty());
    }

    #[test]
    fn a_missing_route_would_be_created_and_a_stale_one_deleted() {
        let cidrs: Vec<IpNet> = vec!["10.244.0.0/16".parse().unwrap()];
        let n = node("a", "10.244.1.0/24", None);
        let plan = logic::plan(&[route("gone", "10.244.9.0/24")], &[&n], &cidrs);
        let d = differences(&plan, [&n]);
        let kinds: Vec<(String, DifferenceKind)> =
            d.values().flatten().map(|d| (d.object.to_string(), d.kind)).collect();
        assert_eq!(
            kinds,
            vec![
                ("Node/a".to_string(), DifferenceKind::WouldPatch),
                ("Route/a/10.244.1.0/24".to_string(), DifferenceKind::WouldCreateRoute),
                ("Route/gone/10.244.9.0/24".to_string(), DifferenceKind::WouldDeleteRoute),
            ]
        );
    }
}
