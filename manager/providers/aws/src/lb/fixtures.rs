//! The Service the load balancer's unit tests start from.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};

use crate::annotations as ann;

/// An `nlb` Service `shop/web` with these annotations, ports ((port, protocol, nodePort)),
/// `externalTrafficPolicy` and `healthCheckNodePort` (0: none).
pub(super) fn svc(annotations: &[(&str, &str)], ports: &[(i32, &str, i32)], etp: &str, hcnp: i32) -> Service {
    let mut s = Service::default();
    s.metadata.name = Some("web".into());
    s.metadata.namespace = Some("shop".into());
    s.metadata.uid = Some("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0".into());
    let mut a: BTreeMap<String, String> = [(ann::TYPE.to_string(), "nlb".to_string())].into();
    a.extend(annotations.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    s.metadata.annotations = Some(a);
    s.spec = Some(ServiceSpec {
        type_: Some("LoadBalancer".into()),
        ports: Some(
            ports
                .iter()
                .map(|(p, proto, np)| ServicePort {
                    port: *p,
                    protocol: Some(proto.to_string()),
                    node_port: Some(*np),
                    ..Default::default()
                })
                .collect(),
        ),
        external_traffic_policy: Some(etp.into()),
        health_check_node_port: (hcnp > 0).then_some(hcnp),
        ..Default::default()
    });
    s
}
