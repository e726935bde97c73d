//! Which ports of a Service its pools refuse, given where the nodes' addresses are (pure).
//!
//! The rule of one pool is [`crate::ports::PortRule`]; this applies it to a Service's
//! addresses, with "holds node addresses" decided from the inventory and the Nodes.

use std::collections::BTreeSet;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{Node, Service};

use crate::config::InstanceConfig;
use crate::ipam::{Pool, Reserved};
use crate::ports::Refusal;

/// The addresses of nodes: the inventory's InternalIP and ExternalIP addresses and every IP
/// the Nodes report.
pub fn node_addresses<'a>(
    instances: impl IntoIterator<Item = &'a InstanceConfig>,
    nodes: &[&Node],
) -> BTreeSet<IpAddr> {
    let inventory = instances
        .into_iter()
        .flat_map(|i| i.addresses.iter())
        .filter(|a| a.type_.is_ip())
        .filter_map(|a| a.address.parse::<IpAddr>().ok());
    let reported = nodes
        .iter()
        .filter_map(|n| n.status.as_ref()?.addresses.as_ref())
        .flatten()
        .filter_map(|a| a.address.parse::<IpAddr>().ok());
    inventory.chain(reported).collect()
}

/// A port of a Service its pool refuses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefusedPort {
    /// Its index in `spec.ports`.
    pub index: usize,
    /// The port.
    pub port: u16,
    /// The pool.
    pub pool: String,
    /// Why.
    pub refusal: Refusal,
}

impl std::fmt::Display for RefusedPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (i, port, pool) = (self.index, self.port, &self.pool);
        write!(f, "spec.ports[{i}].port: port {port} is refused by pool {pool}: ")?;
        match self.refusal {
            Refusal::BelowMinimum(min) => write!(f, "its minPort is {min}"),
            Refusal::NotAllowed => f.write_str("it is outside the pool's allowedPorts"),
            Refusal::NodeAddresses => f.write_str(
                "the pool holds node addresses (every loopback address is one), where a Service could take a host's port, and lists no allowedPorts",
            ),
        }
    }
}

/// Whether `pool` holds a node's address: one of `nodes`, or any loopback address, which every
/// node answers on itself (local daemons listen there: etcd, the kubelet's health port, a
/// resolver).
pub fn holds_node_addresses(pool: &Pool, nodes: &BTreeSet<IpAddr>) -> bool {
    let loopback = Reserved::Loopback.blocks();
    pool.blocks.iter().any(|b| nodes.iter().any(|ip| b.contains(*ip)) || loopback.iter().any(|l| l.overlaps(b)))
}

/// Every port of `service` that a pool holding one of `ips` refuses, in `spec.ports` order.
/// Addresses outside every pool (kept after a pool edit) have no rule.
pub fn refused_ports(service: &Service, ips: &[IpAddr], pools: &[Pool], nodes: &BTreeSet<IpAddr>) -> Vec<RefusedPort> {
    let ports = service.spec.as_ref().and_then(|s| s.ports.as_ref());
    let mut refused = Vec::new();
    for pool in pools.iter().filter(|p| ips.iter().any(|ip| p.blocks.iter().any(|b| b.contains(*ip)))) {
        let holds_nodes = holds_node_addresses(pool, nodes);
        for (index, p) in ports.into_iter().flatten().enumerate() {
            let Ok(port) = u16::try_from(p.port) else { continue };
            if let Err(refusal) = pool.ports.check(port, holds_nodes) {
                refused.push(RefusedPort { index, port, pool: pool.name.clone(), refusal });
            }
        }
    }
    refused
}

/// One message naming every refused port.
pub fn describe(refused: &[RefusedPort]) -> String {
    let parts: Vec<String> = refused.iter().map(ToString::to_string).collect();
    format!("{}; the Service gets no address and no listener until its ports are allowed", parts.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ipam::IpBlock;
    use crate::ports::PortRule;
    use k8s_openapi::api::core::v1::{NodeAddress, NodeStatus, ServicePort, ServiceSpec};

    fn pool(name: &str, cidr: &str, ports: PortRule) -> Pool {
        Pool {
            name: name.into(),
            blocks: vec![IpBlock::parse_cidr(cidr).unwrap()],
            namespaces: Default::default(),
            selector: None,
            namespace_selector: None,
            auto_assign: true,
            avoid_buggy_ips: false,
            allow_sharing: false,
            ports,
            disabled: false,
            policy: Default::default(),
        }
    }

    fn service(ports: &[i32]) -> Service {
        Service {
            spec: Some(ServiceSpec {
                ports: Some(ports.iter().map(|p| ServicePort { port: *p, ..Default::default() }).collect()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn a_refused_port_is_named_by_its_index_and_pool() {
        let pools = [
            pool("nodes", "192.0.2.0/28", PortRule { min_port: 1, allowed: Some(vec![8080..=8080]) }),
            pool("vips", "198.51.100.0/28", PortRule::default()),
        ];
        let nodes = BTreeSet::from([ip("192.0.2.1")]);
        let refused = refused_ports(&service(&[8080, 22]), &[ip("192.0.2.5")], &pools, &nodes);
        assert_eq!(refused.len(), 1);
        let text = describe(&refused);
        assert!(text.starts_with("spec.ports[1].port: port 22 is refused by pool nodes"), "{text}");
        assert!(text.contains("allowedPorts"), "{text}");
        assert!(refused_ports(&service(&[22]), &[ip("198.51.100.3")], &pools, &nodes).is_empty());
        assert!(refused_ports(&service(&[22]), &[ip("203.0.113.1")], &pools, &nodes).is_empty(), "outside every pool");
    }

    #[test]
    fn a_loopback_pool_holds_the_nodes_own_addresses_and_allows_no_port_until_allowed_ports_lists_some() {
        // Every node answers on loopback itself (etcd, the kubelet's healthz, a local resolver).
        let none = BTreeSet::new();
        for (cidr, address) in [("127.0.0.240/28", "127.0.0.241"), ("::1/128", "::1")] {
            let lo = pool("lo", cidr, PortRule::default());
            let refused = refused_ports(&service(&[2379]), &[ip(address)], &[lo], &none);
            assert_eq!(refused.len(), 1, "{cidr}");
            assert_eq!(refused[0].refusal, Refusal::NodeAddresses, "{cidr}");
        }
        let listed = pool("lo", "127.0.0.240/28", PortRule { min_port: 1, allowed: Some(vec![8080..=8080]) });
        assert!(
            refused_ports(&service(&[8080]), &[ip("127.0.0.241")], std::slice::from_ref(&listed), &none).is_empty()
        );
        assert_eq!(
            refused_ports(&service(&[2379]), &[ip("127.0.0.241")], &[listed], &none)[0].refusal,
            Refusal::NotAllowed
        );
    }

    #[test]
    fn node_addresses_come_from_the_inventory_and_the_nodes() {
        let doc = "instances:\n  - name: a\n    addresses:\n      - {type: InternalIP, address: 192.0.2.1}\n      - {type: Hostname, address: a.lan}\n";
        let config = crate::config::parse(doc.as_bytes()).unwrap();
        let node = Node {
            status: Some(NodeStatus {
                addresses: Some(vec![NodeAddress { type_: "ExternalIP".into(), address: "198.51.100.7".into() }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let found = node_addresses(&config.instances, &[&node]);
        assert_eq!(found, BTreeSet::from([ip("192.0.2.1"), ip("198.51.100.7")]));
        // The default rule of a pool then depends on whether it holds one of them.
        let pools = [pool("lan", "192.0.2.0/28", PortRule::default())];
        let refused = refused_ports(&service(&[80]), &[ip("192.0.2.9")], &pools, &found);
        assert_eq!(refused[0].refusal, Refusal::NodeAddresses);
        assert!(refused_ports(&service(&[80]), &[ip("192.0.2.9")], &pools, &BTreeSet::new()).is_empty());
    }
}
