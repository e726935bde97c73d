//! Which Service ports a pool lets its addresses take (pure).
//!
//! A Service picks its own ports. On addresses that belong to load balancers alone that is
//! harmless, but a pool may hold node addresses (a pool made of the nodes' own IPs, as small
//! clusters do): there a Service on port 22, 6443 or 10250 would take a host port of a node,
//! in proxy mode by binding it before (or instead of) the host's daemon, in address mode by
//! kube-proxy capturing the traffic. Each pool therefore has a rule: `minPort` (default 1) and
//! `allowedPorts` (default: every port, but no port at all on a pool holding node addresses,
//! so an operator opens exactly the ports meant for tenants there).

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::ops::RangeInclusive;

use k8s_openapi::api::core::v1::{Node, Service};

use crate::config::InstanceConfig;
use crate::ipam::Pool;

/// Most `allowedPorts` entries one pool may list (bounds the cloud-config).
pub const MAX_PORT_RANGES: usize = 256;

/// The message of an `allowedPorts` entry that is not a port or a port range.
pub const BAD_PORT_RANGE: &str = "is not a port or a first-last port range within 1-65535";

/// The message of a `minPort` of 0.
pub const BAD_MIN_PORT: &str = "must be between 1 and 65535";

/// The message of too many `allowedPorts` entries.
pub const TOO_MANY_RANGES: &str = "lists more than 256 entries";

/// A pool's port rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortRule {
    /// Ports below this are refused.
    pub min_port: u16,
    /// The ports allowed; `None` is the default (every port, none on a pool holding node
    /// addresses).
    pub allowed: Option<Vec<RangeInclusive<u16>>>,
}

impl Default for PortRule {
    fn default() -> Self {
        Self { min_port: 1, allowed: None }
    }
}

/// Why a pool refuses a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Below the pool's `minPort`.
    BelowMinimum(u16),
    /// Outside the pool's `allowedPorts`.
    NotAllowed,
    /// The pool holds node addresses and lists no `allowedPorts`.
    NodeAddresses,
}

impl PortRule {
    /// Whether `port` may be used on this pool's addresses; `holds_node_addresses` picks the
    /// default when `allowedPorts` is unset.
    pub fn check(&self, port: u16, holds_node_addresses: bool) -> Result<(), Refusal> {
        if port < self.min_port {
            return Err(Refusal::BelowMinimum(self.min_port));
        }
        match &self.allowed {
            Some(ranges) if ranges.iter().any(|r| r.contains(&port)) => Ok(()),
            Some(_) => Err(Refusal::NotAllowed),
            None if holds_node_addresses => Err(Refusal::NodeAddresses),
            None => Ok(()),
        }
    }
}

/// Parse an `allowedPorts` entry: `"443"` or `"8000-8999"`.
pub fn parse_range(text: &str) -> Result<RangeInclusive<u16>, &'static str> {
    let port = |t: &str| t.trim().parse::<u16>().ok().filter(|p| *p != 0).ok_or(BAD_PORT_RANGE);
    let (first, last) = match text.split_once('-') {
        Some((a, b)) => (port(a)?, port(b)?),
        None => {
            let p = port(text)?;
            (p, p)
        }
    };
    if first > last {
        return Err(BAD_PORT_RANGE);
    }
    Ok(first..=last)
}

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
                "the pool holds node addresses, where a Service could take a host's port, and lists no allowedPorts",
            ),
        }
    }
}

/// Every port of `service` that a pool holding one of `ips` refuses, in `spec.ports` order.
/// Addresses outside every pool (kept after a pool edit) have no rule.
pub fn refused_ports(service: &Service, ips: &[IpAddr], pools: &[Pool], nodes: &BTreeSet<IpAddr>) -> Vec<RefusedPort> {
    let ports = service.spec.as_ref().and_then(|s| s.ports.as_ref());
    let mut refused = Vec::new();
    for pool in pools.iter().filter(|p| ips.iter().any(|ip| p.blocks.iter().any(|b| b.contains(*ip)))) {
        let holds_nodes = nodes.iter().any(|ip| pool.blocks.iter().any(|b| b.contains(*ip)));
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
    format!("{}; no listener is opened for the Service until its ports are allowed", parts.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ipam::IpBlock;
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
    fn a_pool_of_load_balancer_addresses_allows_every_port_by_default() {
        let rule = PortRule::default();
        for port in [1, 22, 80, 6443, 10250, 65535] {
            assert_eq!(rule.check(port, false), Ok(()));
        }
    }

    #[test]
    fn a_pool_holding_node_addresses_allows_no_port_until_allowed_ports_lists_some() {
        assert_eq!(PortRule::default().check(8080, true), Err(Refusal::NodeAddresses));
        let rule = PortRule { min_port: 1, allowed: Some(vec![80..=80, 8000..=8999]) };
        assert_eq!(rule.check(80, true), Ok(()));
        assert_eq!(rule.check(8443, true), Ok(()));
        assert_eq!(rule.check(22, true), Err(Refusal::NotAllowed));
        assert_eq!(rule.check(10250, false), Err(Refusal::NotAllowed), "a list applies to every pool");
    }

    #[test]
    fn ports_below_the_minimum_are_refused() {
        let rule = PortRule { min_port: 1024, allowed: None };
        assert_eq!(rule.check(443, false), Err(Refusal::BelowMinimum(1024)));
        assert_eq!(rule.check(1024, false), Ok(()));
        let both = PortRule { min_port: 1024, allowed: Some(vec![1..=2000]) };
        assert_eq!(both.check(80, false), Err(Refusal::BelowMinimum(1024)));
        assert_eq!(both.check(1500, false), Ok(()));
    }

    #[test]
    fn allowed_port_entries_are_ports_or_ordered_ranges() {
        assert_eq!(parse_range("443"), Ok(443..=443));
        assert_eq!(parse_range("8000-8999"), Ok(8000..=8999));
        for bad in ["0", "65536", "9-1", "a", "1-", "-5", "1-2-3", ""] {
            assert_eq!(parse_range(bad), Err(BAD_PORT_RANGE), "{bad}");
        }
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
