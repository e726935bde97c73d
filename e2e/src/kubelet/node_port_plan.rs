//! What emulated Nodes answer, and where (pure): for each Node's InternalIP, kube-proxy's
//! health port, every Service's nodePorts and the `healthCheckNodePort`s.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Service};
use kube::ResourceExt;

/// kube-proxy's health port, answered on every emulated Node.
pub const KUBE_PROXY_HEALTH_PORT: u16 = 10256;

/// One listener of an emulated Node: its InternalIP, a port, TCP or UDP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodePortKey {
    /// The Node's InternalIP.
    pub ip: IpAddr,
    /// The port.
    pub port: u16,
    /// UDP rather than TCP.
    pub udp: bool,
}

impl std::fmt::Display for NodePortKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", SocketAddr::new(self.ip, self.port), if self.udp { "UDP" } else { "TCP" })
    }
}

/// What an emulated Node answers on one port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodePortRole {
    /// A Service's nodePort: an echo that names the Node and the Service.
    Echo {
        /// The Node.
        node: String,
        /// `namespace/name` of the Service.
        service: String,
    },
    /// kube-proxy's `/healthz` or a Service's `healthCheckNodePort`: always 200 (every emulated
    /// Node has a local endpoint).
    Health {
        /// The Node.
        node: String,
    },
}

/// The listeners emulated Nodes need for these Nodes and Services (pure): kube-proxy's health
/// port on each Node's first InternalIP, every Service's nodePorts (echo) and, for
/// `externalTrafficPolicy: Local`, its `healthCheckNodePort`. Nodes being deleted serve nothing.
pub fn node_port_plan(nodes: &[Arc<Node>], services: &[Arc<Service>]) -> BTreeMap<NodePortKey, NodePortRole> {
    let mut plan = BTreeMap::new();
    for node in nodes {
        if node.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let name = node.name_any();
        let ip = node
            .status
            .as_ref()
            .and_then(|s| s.addresses.as_ref())
            .into_iter()
            .flatten()
            .filter(|a| a.type_ == "InternalIP")
            .find_map(|a| a.address.parse::<IpAddr>().ok());
        let Some(ip) = ip else { continue };
        let health = NodePortRole::Health { node: name.clone() };
        plan.insert(NodePortKey { ip, port: KUBE_PROXY_HEALTH_PORT, udp: false }, health.clone());
        for service in services {
            let Some(spec) = service.spec.as_ref() else { continue };
            let key = format!("{}/{}", service.namespace().unwrap_or_default(), service.name_any());
            for p in spec.ports.iter().flatten() {
                let Some(port) = p.node_port.and_then(|n| u16::try_from(n).ok()).filter(|n| *n != 0) else {
                    continue;
                };
                let udp = match p.protocol.as_deref().unwrap_or("TCP") {
                    "TCP" => false,
                    "UDP" => true,
                    _ => continue,
                };
                plan.insert(
                    NodePortKey { ip, port, udp },
                    NodePortRole::Echo { node: name.clone(), service: key.clone() },
                );
            }
            let local = spec.external_traffic_policy.as_deref() == Some("Local");
            if let Some(port) = spec.health_check_node_port.and_then(|n| u16::try_from(n).ok()).filter(|_| local) {
                plan.insert(NodePortKey { ip, port, udp: false }, health.clone());
            }
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubelet::fixtures::{node, service};

    #[test]
    fn every_node_serves_every_node_port_and_the_health_ports() {
        let ip: IpAddr = "127.0.1.1".parse().unwrap();
        let plan = node_port_plan(
            &[node("n1", "127.0.1.1"), node("n2", "127.0.1.2")],
            &[
                service("web", &[("TCP", 30080), ("UDP", 30053)], None),
                service("local", &[("TCP", 30081)], Some(32000)),
            ],
        );
        let echo = |service: &str| NodePortRole::Echo { node: "n1".into(), service: service.into() };
        assert_eq!(plan.get(&NodePortKey { ip, port: 30080, udp: false }), Some(&echo("demo/web")));
        assert_eq!(plan.get(&NodePortKey { ip, port: 30053, udp: true }), Some(&echo("demo/web")));
        assert_eq!(plan.get(&NodePortKey { ip, port: 30081, udp: false }), Some(&echo("demo/local")));
        let health = NodePortRole::Health { node: "n1".into() };
        assert_eq!(plan.get(&NodePortKey { ip, port: KUBE_PROXY_HEALTH_PORT, udp: false }), Some(&health));
        assert_eq!(plan.get(&NodePortKey { ip, port: 32000, udp: false }), Some(&health));
        assert_eq!(plan.len(), 10, "five listeners on each of two Nodes: {plan:?}");
    }

    #[test]
    fn nodes_without_an_internal_ip_serve_nothing() {
        let mut bare = (*node("n1", "x")).clone();
        bare.status = None;
        assert!(node_port_plan(&[Arc::new(bare)], &[service("web", &[("TCP", 30080)], None)]).is_empty());
    }
}
