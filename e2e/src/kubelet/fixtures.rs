//! The Nodes and Services the node-port tests start from.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Service, ServicePort, ServiceSpec};
use kube::api::ObjectMeta;
use testkit::NodeFixture;

/// A Node with a Hostname and an InternalIP address.
pub(super) fn node(name: &str, ip: &str) -> Arc<Node> {
    Arc::new(testkit::node(name).with_address("Hostname", name).with_address("InternalIP", ip))
}

/// A `LoadBalancer` Service `demo/<name>` on port 80 with these (protocol, nodePort) ports;
/// `externalTrafficPolicy: Local` with that `healthCheckNodePort` when one is given.
pub(super) fn service(name: &str, ports: &[(&str, i32)], local_hcnp: Option<i32>) -> Arc<Service> {
    Arc::new(Service {
        metadata: ObjectMeta { name: Some(name.into()), namespace: Some("demo".into()), ..Default::default() },
        spec: Some(ServiceSpec {
            type_: Some("LoadBalancer".into()),
            ports: Some(
                ports
                    .iter()
                    .map(|(protocol, np)| ServicePort {
                        protocol: Some(protocol.to_string()),
                        port: 80,
                        node_port: Some(*np),
                        ..Default::default()
                    })
                    .collect(),
            ),
            external_traffic_policy: local_hcnp.map(|_| "Local".into()),
            health_check_node_port: local_hcnp,
            ..Default::default()
        }),
        ..Default::default()
    })
}
