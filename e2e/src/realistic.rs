//! Objects shaped as real clusters have them, for the benchmark drivers (issue 50): a Node as
//! a v1.36 kubelet registers it with `--cloud-provider=external`, taken from the real cluster's
//! own kubelet (`e2e/fixtures/kubelet-node.json`: `kubectl get node -o json` with uid,
//! resourceVersion, managedFields and timestamps left out), varied per Node in its name,
//! addresses and images; and a Service as `kubectl apply` of a Helm-style manifest leaves it,
//! with the EndpointSlice the endpoint-slice controller would write for its three Pods.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ContainerImage, Node, NodeAddress, ObjectReference, Service};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::ObjectMeta;
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

/// [`node`] as its cloud-controller-manager leaves it: `provider_id` set, no uninitialized taint.
pub fn initialized_node(name: &str, i: usize, provider_id: &str) -> Result<Node, Error> {
    let mut node = node(name, i, &[])?;
    let spec = node.spec.get_or_insert_default();
    spec.provider_id = Some(provider_id.to_string());
    if let Some(taints) = spec.taints.as_mut() {
        taints.retain(|t| t.key != "node.cloudprovider.kubernetes.io/uninitialized");
    }
    Ok(node)
}

/// Pods behind each realistic Service.
pub const ENDPOINTS: usize = 3;

/// `base` as `kubectl apply` of a chart's manifest leaves it: the recommended labels, a Pod
/// selector, Helm's and Prometheus's annotations and `last-applied-configuration` (the
/// manifest itself). Its name, namespace, type and ports stay `base`'s.
pub fn service(mut base: Service) -> Result<Service, Error> {
    let name = base.metadata.name.clone().unwrap_or_default();
    let namespace = base.metadata.namespace.clone().unwrap_or_default();
    let labels: BTreeMap<String, String> = [
        ("app.kubernetes.io/name", name.as_str()),
        ("app.kubernetes.io/instance", "shop-prod"),
        ("app.kubernetes.io/component", "frontend"),
        ("app.kubernetes.io/part-of", "shop"),
        ("app.kubernetes.io/managed-by", "Helm"),
        ("app.kubernetes.io/version", "3.14.2"),
        ("helm.sh/chart", "shop-frontend-3.14.2"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    base.metadata.labels.get_or_insert_default().extend(labels);
    let spec = base.spec.get_or_insert_default();
    spec.selector = Some(
        [("app.kubernetes.io/name", name.as_str()), ("app.kubernetes.io/instance", "shop-prod")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    spec.session_affinity = Some("None".into());
    spec.external_traffic_policy = Some("Cluster".into());
    let annotations = base.metadata.annotations.get_or_insert_default();
    for (k, v) in [
        ("meta.helm.sh/release-name", "shop-prod"),
        ("meta.helm.sh/release-namespace", namespace.as_str()),
        ("prometheus.io/scrape", "true"),
        ("prometheus.io/port", "9090"),
        ("prometheus.io/path", "/metrics"),
    ] {
        annotations.insert(k.to_string(), v.to_string());
    }
    let manifest = serde_json::to_string(&base)?;
    base.metadata
        .annotations
        .get_or_insert_default()
        .insert("kubectl.kubernetes.io/last-applied-configuration".into(), format!("{manifest}\n"));
    Ok(base)
}

/// The EndpointSlice the endpoint-slice controller writes for `service` (number `i`) with
/// [`ENDPOINTS`] ready Pods spread over `nodes` (names; none gives Pods without a Node).
pub fn endpoint_slice(service: &Service, i: usize, nodes: &[String]) -> EndpointSlice {
    let name = service.metadata.name.clone().unwrap_or_default();
    let ports = service.spec.as_ref().and_then(|s| s.ports.clone()).unwrap_or_default();
    let endpoints = (0..ENDPOINTS)
        .map(|k| {
            let n = i * ENDPOINTS + k;
            let pod = format!("{name}-7d9f8c6b5-{:05x}", n % 0xf_ffff);
            Endpoint {
                addresses: vec![format!("10.{}.{}.{}", 100 + (n / 65_536) % 100, (n / 256) % 256, n % 256)],
                conditions: Some(EndpointConditions {
                    ready: Some(true),
                    serving: Some(true),
                    terminating: Some(false),
                }),
                node_name: (!nodes.is_empty()).then(|| nodes[n % nodes.len()].clone()),
                target_ref: Some(ObjectReference {
                    kind: Some("Pod".into()),
                    name: Some(pod),
                    namespace: service.metadata.namespace.clone(),
                    uid: Some(format!("{:08x}-1b2c-4d5e-8f90-{:012x}", n, n.wrapping_mul(2_654_435_761))),
                    ..Default::default()
                }),
                zone: Some(format!("zone-{}", n % 3)),
                ..Default::default()
            }
        })
        .collect();
    EndpointSlice {
        metadata: ObjectMeta {
            name: Some(format!("{name}-{:05x}", i % 0xf_ffff)),
            namespace: service.metadata.namespace.clone(),
            labels: Some(
                [
                    ("kubernetes.io/service-name", name.as_str()),
                    ("endpointslice.kubernetes.io/managed-by", "endpointslice-controller.k8s.io"),
                    ("app.kubernetes.io/name", name.as_str()),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ),
            ..Default::default()
        },
        address_type: "IPv4".into(),
        endpoints,
        ports: Some(
            ports
                .iter()
                .map(|p| EndpointPort {
                    name: p.name.clone(),
                    port: Some(match p.target_port {
                        Some(IntOrString::Int(n)) => n,
                        _ => p.port,
                    }),
                    protocol: p.protocol.clone(),
                    ..Default::default()
                })
                .collect(),
        ),
    }
}

/// The JSON size of `object` in bytes, as the drivers print it.
pub fn json_bytes<T: serde::Serialize>(object: &T) -> usize {
    serde_json::to_vec(object).map(|v| v.len()).unwrap_or(0)
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

    #[test]
    fn realistic_services_keep_their_ports_and_carry_labels_a_selector_and_their_manifest() {
        let base = testkit::lb_service("bench", "svc-7");
        let svc = service(base.clone()).unwrap();
        assert_eq!(svc.metadata.name, base.metadata.name);
        let spec = svc.spec.as_ref().unwrap();
        assert_eq!(spec.ports, base.spec.as_ref().unwrap().ports);
        assert_eq!(spec.type_.as_deref(), Some("LoadBalancer"));
        assert_eq!(spec.selector.as_ref().unwrap()["app.kubernetes.io/name"], "svc-7");
        let applied = &svc.metadata.annotations.as_ref().unwrap()["kubectl.kubernetes.io/last-applied-configuration"];
        let manifest: Service = serde_json::from_str(applied).unwrap();
        assert_eq!(manifest.spec.unwrap().ports, base.spec.as_ref().unwrap().ports);
        assert!(json_bytes(&svc) > 2 * json_bytes(&base), "{} against {}", json_bytes(&svc), json_bytes(&base));

        let nodes = vec!["n-0".to_string(), "n-1".to_string()];
        let (a, b) = (endpoint_slice(&svc, 7, &nodes), endpoint_slice(&svc, 8, &nodes));
        assert_eq!(a.endpoints.len(), ENDPOINTS);
        assert_eq!(a.metadata.labels.as_ref().unwrap()["kubernetes.io/service-name"], "svc-7");
        assert_eq!(a.ports.as_ref().unwrap().len(), spec.ports.as_ref().unwrap().len());
        assert_ne!(a.endpoints[0].addresses, b.endpoints[0].addresses, "every Pod's address is its own");
        assert!(a.endpoints.iter().all(|e| e.node_name.as_ref().is_some_and(|n| nodes.contains(n))));
    }
}
