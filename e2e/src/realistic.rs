//! Objects shaped as real clusters have them, for the benchmark drivers (issue 50): a Node as
//! a v1.36 kubelet registers it with `--cloud-provider=external`, taken from the real cluster's
//! own kubelet (`e2e/fixtures/kubelet-node.json`: `kubectl get node -o json` with uid,
//! resourceVersion, managedFields and timestamps left out), varied per Node in its name,
//! addresses and images.

use k8s_openapi::api::core::v1::{ContainerImage, Node, NodeAddress};
use serde_json::Error;

/// The real cluster's kubelet Node.
const KUBELET_NODE: &str = include_str!("../fixtures/kubelet-node.json");

/// Images each Node lists: the kubelet reports at most 50 (`--node-status-max-images`).
pub const IMAGES: usize = 50;

/// A digest-like hex string of 64 characters from `seed` (deterministic).
fn digest(seed: u64) -> String {
    (0..4u64).map(|k| format!("{:016x}", seed.wrapping_add(k).wrapping_mul(0x9E37_79B9_7F4A_7C15))).collect()
}

/// Node `i` of a realistic fleet named `name`: the kubelet's Node with this name and hostname,
/// InternalIP `10.<i/65536>.<i/256%256>.<i%256+1>`-style (unique per `i`), and [`IMAGES`]
/// images, each with a digest and a tag name and a size of its own, drawn from a catalogue
/// bigger than one Node's share so Nodes differ. Labels from `labels` are added.
pub fn node(name: &str, i: usize, labels: &[(&str, &str)]) -> Result<Node, Error> {
    let mut node: Node = serde_json::from_str(KUBELET_NODE)?;
    node.metadata.name = Some(name.to_string());
    let node_labels = node.metadata.labels.get_or_insert_default();
    node_labels.insert("kubernetes.io/hostname".into(), name.to_string());
    for (k, v) in labels {
        node_labels.insert(k.to_string(), v.to_string());
    }
    let status = node.status.get_or_insert_default();
    let ip = format!("10.{}.{}.{}", (i / 65_536) % 256, (i / 254) % 256, i % 254 + 1);
    status.addresses = Some(vec![
        NodeAddress { type_: "InternalIP".into(), address: ip },
        NodeAddress { type_: "Hostname".into(), address: name.to_string() },
    ]);
    status.images = Some(
        (0..IMAGES)
            .map(|k| {
                // 400 images in the catalogue; each Node holds 50 of them, offset by its index.
                let id = (i * 7 + k) % 400;
                let repo = format!("registry.example.com/team-{}/service-{}", id % 23, id);
                ContainerImage {
                    names: Some(vec![
                        format!("{repo}@sha256:{}", digest(id as u64)),
                        format!("{repo}:v1.{}.{}", id % 17, k),
                    ]),
                    size_bytes: Some(5_000_000 + (id as i64) * 731_113),
                }
            })
            .collect(),
    );
    Ok(node)
}

/// The JSON size of `node` in bytes, as the drivers print it.
pub fn json_bytes(node: &Node) -> usize {
    serde_json::to_vec(node).map(|v| v.len()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn realistic_nodes_are_the_kubelets_shape_varied_per_node_and_uninitialized_and_ready() {
        let (a, b) = (node("bench-a", 0, &[("bench", "true")]).unwrap(), node("bench-b", 1, &[]).unwrap());
        for n in [&a, &b] {
            let status = n.status.as_ref().unwrap();
            assert_eq!(status.images.as_ref().unwrap().len(), IMAGES);
            assert!(status.node_info.is_some() && status.capacity.is_some() && status.allocatable.is_some());
            let ready = status.conditions.iter().flatten().find(|c| c.type_ == "Ready").unwrap();
            assert_eq!(ready.status, "True");
            let taints = n.spec.as_ref().unwrap().taints.as_ref().unwrap();
            assert!(taints.iter().any(|t| t.key == "node.cloudprovider.kubernetes.io/uninitialized"));
            assert!(json_bytes(n) > 10_000, "{} bytes", json_bytes(n));
        }
        assert_eq!(a.metadata.labels.as_ref().unwrap()["kubernetes.io/hostname"], "bench-a");
        assert_eq!(a.metadata.labels.as_ref().unwrap()["bench"], "true");
        let ip = |n: &Node| n.status.as_ref().unwrap().addresses.as_ref().unwrap()[0].address.clone();
        assert_ne!(ip(&a), ip(&b));
        assert_ne!(a.status.as_ref().unwrap().images, b.status.as_ref().unwrap().images);
        let ips: std::collections::BTreeSet<String> = (0..5000).map(|i| ip(&node("n", i, &[]).unwrap())).collect();
        assert_eq!(ips.len(), 5000, "every Node's address is its own");
    }
}
