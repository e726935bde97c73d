//! Pools' advertisement policies applied to addresses (pure): for each announced address, the
//! policy of the pool it lies in ([`crate::advertisement`]), with its node selector resolved
//! against the Nodes' labels. The election ([`super::assign`]) and the BGP advertisement
//! ([`super::bgp`]) read the result.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use crate::advertisement::{PoolPolicy, RouteAttributes};
use crate::ipam::IpBlock;

/// A pool's address blocks with its policy (only pools that have one).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PolicyBlocks {
    /// Its address blocks.
    pub blocks: Vec<IpBlock>,
    /// Its policy.
    pub policy: PoolPolicy,
}

/// What one address's pool asks of the announcers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AddressPolicy {
    /// The Nodes that may announce it; `None`: every Node.
    pub nodes: Option<BTreeSet<String>>,
    /// The Nodes that should answer ARP/NDP for it, in order.
    pub preferred: Vec<String>,
    /// The interfaces ARP/NDP for it is answered on; empty: every L2 interface.
    pub l2_interfaces: BTreeSet<String>,
    /// BGP attributes of its route beyond the global ones.
    pub route: RouteAttributes,
}

impl AddressPolicy {
    /// Whether `node` may announce the address.
    pub fn allows(&self, node: &str) -> bool {
        self.nodes.as_ref().is_none_or(|nodes| nodes.contains(node))
    }
}

/// Per address, what its pool asks; an address not listed asks nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AddressPolicies(BTreeMap<IpAddr, AddressPolicy>);

impl AddressPolicies {
    /// The policy of `address`, if its pool has one.
    pub fn get(&self, address: IpAddr) -> Option<&AddressPolicy> {
        self.0.get(&address)
    }

    /// Whether `node` may announce `address`.
    pub fn allows(&self, address: IpAddr, node: &str) -> bool {
        self.get(address).is_none_or(|p| p.allows(node))
    }

    /// The preferred nodes of `address`'s pool (empty: none).
    pub fn preferred(&self, address: IpAddr) -> &[String] {
        self.get(address).map(|p| p.preferred.as_slice()).unwrap_or_default()
    }

    /// The interfaces of every address whose pool answers on some interfaces only.
    pub fn l2_interfaces(&self) -> BTreeMap<IpAddr, BTreeSet<String>> {
        (self.0.iter())
            .filter(|(_, p)| !p.l2_interfaces.is_empty())
            .map(|(a, p)| (*a, p.l2_interfaces.clone()))
            .collect()
    }

    /// The route attributes of every address whose pool sets some.
    pub fn routes(&self) -> BTreeMap<IpAddr, RouteAttributes> {
        (self.0.iter()).filter(|(_, p)| !p.route.is_empty()).map(|(a, p)| (*a, p.route.clone())).collect()
    }
}

/// The policies of `addresses` from the pools' `policies`, node selectors matched against
/// `nodes` (name to labels). Pools do not overlap (the manager refuses overlapping entries),
/// so an address lies in one pool at most.
pub fn resolve(
    policies: &[PolicyBlocks],
    addresses: impl IntoIterator<Item = IpAddr>,
    nodes: &BTreeMap<String, BTreeMap<String, String>>,
) -> AddressPolicies {
    let mut matching: BTreeMap<usize, Option<BTreeSet<String>>> = BTreeMap::new();
    let mut out = BTreeMap::new();
    for address in addresses {
        let Some((index, pool)) =
            policies.iter().enumerate().find(|(_, p)| p.blocks.iter().any(|b| b.contains(address)))
        else {
            continue;
        };
        let selected = matching.entry(index).or_insert_with(|| {
            let selector = pool.policy.node_selector.as_ref()?;
            Some(nodes.iter().filter(|(_, labels)| selector.matches(labels)).map(|(n, _)| n.clone()).collect())
        });
        out.insert(
            address,
            AddressPolicy {
                nodes: selected.clone(),
                preferred: pool.policy.preferred.clone(),
                l2_interfaces: pool.policy.l2_interfaces.iter().cloned().collect(),
                route: pool.policy.route.clone(),
            },
        );
    }
    AddressPolicies(out)
}

/// What the responder on `interface` answers for: the owned addresses whose pool answers on
/// that interface (`only_on`: address to its pool's interfaces; an address not in it, every
/// interface).
pub fn answered_on(
    owned: &BTreeSet<IpAddr>,
    only_on: &BTreeMap<IpAddr, BTreeSet<String>>,
    interface: &str,
) -> BTreeSet<IpAddr> {
    owned.iter().copied().filter(|a| only_on.get(a).is_none_or(|names| names.contains(interface))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::selector::LabelSelectorConfig;

    #[test]
    fn an_address_takes_its_pools_policy_with_the_nodes_its_selector_matches() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let labels = |edge: bool| BTreeMap::from([("edge".to_string(), edge.to_string())]);
        let nodes = BTreeMap::from([("w1".to_string(), labels(true)), ("w2".to_string(), labels(false))]);
        let edge = PoolPolicy {
            node_selector: Some(LabelSelectorConfig {
                match_labels: BTreeMap::from([("edge".to_string(), "true".to_string())]),
                ..Default::default()
            }),
            preferred: vec!["w9".to_string()],
            l2_interfaces: vec!["eth1".to_string()],
            route: RouteAttributes { communities: vec![(65000, 7)], ..Default::default() },
        };
        let only_route =
            PoolPolicy { route: RouteAttributes { local_pref: Some(300), ..Default::default() }, ..Default::default() };
        let policies = [
            PolicyBlocks { blocks: vec![IpBlock::parse_cidr("192.0.2.0/28").unwrap()], policy: edge },
            PolicyBlocks { blocks: vec![IpBlock::parse_cidr("2001:db8::/120").unwrap()], policy: only_route },
        ];
        let got = resolve(&policies, [ip("192.0.2.1"), ip("2001:db8::1"), ip("198.51.100.1")], &nodes);
        assert!(got.allows(ip("192.0.2.1"), "w1"));
        assert!(!got.allows(ip("192.0.2.1"), "w2"), "w2's labels do not match");
        assert!(!got.allows(ip("192.0.2.1"), "w3"), "a node without a Node object matches nothing");
        assert_eq!(got.preferred(ip("192.0.2.1")), ["w9"]);
        assert!(got.allows(ip("2001:db8::1"), "w2"), "a pool without a selector allows every node");
        assert!(got.allows(ip("198.51.100.1"), "w2") && got.get(ip("198.51.100.1")).is_none(), "no pool policy");
        assert!(got.preferred(ip("198.51.100.1")).is_empty());
        let routes = got.routes();
        assert_eq!(routes.len(), 2);
        assert_eq!(routes[&ip("192.0.2.1")].communities, [(65000, 7)]);
        assert_eq!(routes[&ip("2001:db8::1")].local_pref, Some(300));
        // Only the edge pool's address is held to an interface: eth1 answers for all three
        // owned, eth0 not for the edge pool's.
        let only_on = got.l2_interfaces();
        assert_eq!(only_on.keys().copied().collect::<Vec<_>>(), [ip("192.0.2.1")]);
        let owned = BTreeSet::from([ip("192.0.2.1"), ip("2001:db8::1"), ip("198.51.100.1")]);
        assert_eq!(answered_on(&owned, &only_on, "eth1"), owned);
        assert_eq!(answered_on(&owned, &only_on, "eth0"), BTreeSet::from([ip("2001:db8::1"), ip("198.51.100.1")]));
    }
}
