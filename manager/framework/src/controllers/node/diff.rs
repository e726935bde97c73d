//! Shadow mode's pure decision for one Node: what this controller would write, or would have
//! written at initialization, compared with the Node as it is. No I/O here.

use k8s_openapi::api::core::v1::{Node, NodeAddress};

use super::NAME;
use super::logic::{self, AddressDecision, TAINT_UNINITIALIZED};
use crate::provider::InstanceMetadata;
use crate::shadow::{Difference, DifferenceKind, FieldDifference, ObjectKey};

fn label_path(key: &str) -> String {
    format!("metadata.labels[{key}]")
}

fn addresses_text(addresses: &[NodeAddress]) -> String {
    addresses.iter().map(|a| format!("{}={}", a.type_, a.address)).collect::<Vec<_>>().join(",")
}

fn provider_id(node: &Node) -> &str {
    node.spec.as_ref().and_then(|s| s.provider_id.as_deref()).unwrap_or_default()
}

/// The differences for `node` given the cloud's metadata for it.
///
/// A tainted Node gets one `would-patch` with everything the initialization writes (or none
/// while it could not be initialized: the controller would wait). An initialized Node gets a
/// `would-patch` for what the controller still writes on initialized Nodes (GA labels copied
/// from beta ones, addresses) and a `differs` for what it writes only at initialization
/// (the instance labels and the providerID) when the Node holds another value.
pub fn differences(node: &Node, meta: &InstanceMetadata) -> Vec<Difference> {
    let object = ObjectKey::node(node.metadata.name.clone().unwrap_or_default());
    if logic::is_uninitialized(node) {
        let Ok(plan) = logic::plan_initialization(node, meta) else { return Vec::new() };
        let mut fields: Vec<FieldDifference> =
            plan.labels.iter().map(|(k, v)| FieldDifference::new(label_path(k), v.clone())).collect();
        if let Some(id) = &plan.provider_id {
            fields.push(FieldDifference::new("spec.providerID", id.clone()));
        }
        if let Some(addresses) = &plan.addresses {
            fields.push(FieldDifference::new("status.addresses", addresses_text(addresses)));
        }
        fields.push(FieldDifference::new(format!("spec.taints[{TAINT_UNINITIALIZED}]"), ""));
        return vec![Difference::new(NAME, object, DifferenceKind::WouldPatch, fields)];
    }
    let mut out = Vec::new();
    let mut patch: Vec<FieldDifference> =
        logic::reconcile_labels(node).iter().map(|(k, v)| FieldDifference::new(label_path(k), v.clone())).collect();
    if let AddressDecision::Changed(list) = logic::desired_addresses(node, &meta.node_addresses) {
        patch.push(FieldDifference::new("status.addresses", addresses_text(&list)));
    }
    if !patch.is_empty() {
        out.push(Difference::new(NAME, object.clone(), DifferenceKind::WouldPatch, patch));
    }
    let (labels, _) = logic::init_labels(node, meta);
    let mut differs: Vec<FieldDifference> =
        labels.iter().map(|(k, v)| FieldDifference::new(label_path(k), v.clone())).collect();
    if !meta.provider_id.is_empty() && provider_id(node) != meta.provider_id {
        differs.push(FieldDifference::new("spec.providerID", meta.provider_id.clone()));
    }
    if !differs.is_empty() {
        out.push(Difference::new(NAME, object, DifferenceKind::Differs, differs));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeSpec, NodeStatus, Taint};
    use kube::api::ObjectMeta;
    use std::collections::BTreeMap;

    fn meta(zone: &str) -> InstanceMetadata {
        InstanceMetadata {
            provider_id: "fake://n1".into(),
            instance_type: "small".into(),
            zone: zone.into(),
            region: "r1".into(),
            node_addresses: vec![NodeAddress { type_: "InternalIP".into(), address: "10.0.0.1".into() }],
            additional_labels: BTreeMap::new(),
        }
    }

    fn initialized(zone: &str) -> Node {
        let labels = [
            ("node.kubernetes.io/instance-type", "small"),
            ("beta.kubernetes.io/instance-type", "small"),
            ("topology.kubernetes.io/zone", zone),
            ("failure-domain.beta.kubernetes.io/zone", zone),
            ("topology.kubernetes.io/region", "r1"),
            ("failure-domain.beta.kubernetes.io/region", "r1"),
        ];
        Node {
            metadata: ObjectMeta {
                name: Some("n1".into()),
                labels: Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
                ..Default::default()
            },
            spec: Some(NodeSpec { provider_id: Some("fake://n1".into()), ..Default::default() }),
            status: Some(NodeStatus {
                addresses: Some(vec![NodeAddress { type_: "InternalIP".into(), address: "10.0.0.1".into() }]),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn a_node_initialized_as_we_would_have_shows_no_difference() {
        assert_eq!(differences(&initialized("z1"), &meta("z1")), Vec::new());
    }

    #[test]
    fn another_zone_differs_on_both_zone_labels_with_our_value() {
        let d = differences(&initialized("z1"), &meta("z2"));
        assert_eq!(d.len(), 1, "{d:?}");
        assert_eq!(d[0].kind, DifferenceKind::Differs);
        let paths: Vec<(&str, &str)> = d[0].fields.iter().map(|f| (f.path.as_str(), f.ours.as_str())).collect();
        assert_eq!(
            paths,
            vec![
                ("metadata.labels[failure-domain.beta.kubernetes.io/zone]", "z2"),
                ("metadata.labels[topology.kubernetes.io/zone]", "z2"),
            ]
        );
    }

    #[test]
    fn a_tainted_node_would_be_patched_with_everything_initialization_writes() {
        let mut node = initialized("z1");
        node.metadata.labels = None;
        node.spec = Some(NodeSpec {
            taints: Some(vec![Taint {
                key: TAINT_UNINITIALIZED.into(),
                effect: "NoSchedule".into(),
                ..Default::default()
            }]),
            ..Default::default()
        });
        let d = differences(&node, &meta("z1"));
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].kind, DifferenceKind::WouldPatch);
        let paths: Vec<&str> = d[0].fields.iter().map(|f| f.path.as_str()).collect();
        assert!(paths.contains(&"spec.providerID"), "{paths:?}");
        assert!(paths.contains(&"metadata.labels[topology.kubernetes.io/zone]"), "{paths:?}");
        assert!(paths.contains(&"spec.taints[node.cloudprovider.kubernetes.io/uninitialized]"), "{paths:?}");
    }

    #[test]
    fn changed_cloud_addresses_would_be_patched_on_an_initialized_node() {
        let mut m = meta("z1");
        m.node_addresses[0].address = "10.0.0.9".into();
        let d = differences(&initialized("z1"), &m);
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].kind, DifferenceKind::WouldPatch);
        assert_eq!(d[0].fields[0], FieldDifference::new("status.addresses", "InternalIP=10.0.0.9"));
    }
}
