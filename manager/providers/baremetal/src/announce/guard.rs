//! What an announcer may announce (pure): an address of a load-balancer pool, and never a
//! node's address, a gateway, a link-local, loopback, unspecified, multicast or broadcast
//! address, nor the network or broadcast address of a subnet this node is on.
//!
//! A Service's status is only as trustworthy as whoever may write it: without this check,
//! writing `status.loadBalancer.ingress` would make every node answer ARP for the gateway or
//! advertise any host route over BGP. MetalLB's speaker likewise announces only addresses of
//! its pools. The facts come from the announcer's sources ([`super::sources`]: the cloud-config
//! it mounts, pool resources, imported pools, this host's interfaces and routes) and its Node
//! watch.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

use ipnet::IpNet;
use tokio::time::Instant;

use super::assign::{Announced, ServiceName};
use crate::ipam::{IpBlock, Reserved};

/// How often the same refusal (Service, address, reason) is reported again while it lasts.
pub const REPORT_EVERY: Duration = Duration::from_secs(10 * 60);

/// Why an address is not announced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Refusal {
    /// In no load-balancer pool this announcer knows.
    OutsidePools,
    /// An address of a node (the inventory's, a Node's, or one of this host's interfaces).
    NodeAddress,
    /// A gateway of one of this host's routes.
    Gateway,
    /// Link-local (`169.254.0.0/16`, `fe80::/10`).
    LinkLocal,
    /// Loopback, unspecified, multicast or the broadcast address `255.255.255.255`.
    Reserved,
    /// The network or broadcast address of a subnet this host is on.
    SubnetEdge,
}

impl Refusal {
    /// A short name for logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::OutsidePools => "outside_pools",
            Refusal::NodeAddress => "node_address",
            Refusal::Gateway => "gateway",
            Refusal::LinkLocal => "link_local",
            Refusal::Reserved => "reserved",
            Refusal::SubnetEdge => "subnet_edge",
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Refusal::OutsidePools => "it is in no load-balancer pool",
            Refusal::NodeAddress => "it is a node's address",
            Refusal::Gateway => "it is a gateway of this node",
            Refusal::LinkLocal => "it is link-local",
            Refusal::Reserved => "it is a loopback, unspecified, multicast or broadcast address",
            Refusal::SubnetEdge => "it is the network or broadcast address of a subnet this node is on",
        })
    }
}

/// What this host knows of its own network: its interfaces' addresses with their prefixes,
/// and its routes' gateways.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostFacts {
    /// Every address of every interface, with its prefix length.
    pub interfaces: Vec<IpNet>,
    /// Every gateway of the routing tables read.
    pub gateways: BTreeSet<IpAddr>,
}

/// What the announcer knows from its sources, besides the Nodes it watches.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Facts {
    /// The address blocks of every pool, in the manager's precedence (only their union counts).
    pub pools: Vec<IpBlock>,
    /// The inventory's `InternalIP` and `ExternalIP` addresses.
    pub inventory: BTreeSet<IpAddr>,
    /// This host's own network.
    pub host: HostFacts,
    /// Whether every configured source has been read once; refusals are reported only then
    /// (before, an address of a pool not yet read would be reported for nothing).
    pub complete: bool,
    /// The pools with an advertisement policy.
    pub policies: Vec<super::policy::PolicyBlocks>,
}

impl Facts {
    /// Facts of pools alone (tests, and callers that know no more).
    pub fn of_pools(pools: Vec<IpBlock>) -> Self {
        Self { pools, complete: true, ..Self::default() }
    }
}

/// The check itself, built from the facts and the Nodes' addresses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Guard {
    pools: Vec<IpBlock>,
    never: BTreeMap<IpAddr, Refusal>,
    subnets: Vec<IpNet>,
}

impl Guard {
    /// The guard for `facts`, with `nodes` the addresses the Nodes report.
    pub fn new(facts: &Facts, nodes: impl IntoIterator<Item = IpAddr>) -> Self {
        let mut never: BTreeMap<IpAddr, Refusal> = BTreeMap::new();
        for gateway in &facts.host.gateways {
            never.insert(*gateway, Refusal::Gateway);
        }
        let interfaces = facts.host.interfaces.iter().map(IpNet::addr);
        for address in facts.inventory.iter().copied().chain(nodes).chain(interfaces) {
            never.insert(address, Refusal::NodeAddress);
        }
        // Only subnets that have a network and a broadcast address distinct from their hosts.
        let subnets = facts
            .host
            .interfaces
            .iter()
            .map(IpNet::trunc)
            .filter(|n| n.max_prefix_len() - n.prefix_len() >= 2)
            .collect();
        Self { pools: facts.pools.clone(), never, subnets }
    }

    /// Whether `address` may be announced, and why not.
    pub fn check(&self, address: IpAddr) -> Result<(), Refusal> {
        if Reserved::LinkLocal.contains(address) {
            return Err(Refusal::LinkLocal);
        }
        if [Reserved::Unspecified, Reserved::Loopback, Reserved::Multicast, Reserved::Broadcast]
            .into_iter()
            .any(|r| r.contains(address))
        {
            return Err(Refusal::Reserved);
        }
        if let Some(refusal) = self.never.get(&address) {
            return Err(*refusal);
        }
        if self.subnets.iter().any(|n| n.network() == address || (n.addr().is_ipv4() && n.broadcast() == address)) {
            return Err(Refusal::SubnetEdge);
        }
        if !self.pools.iter().any(|b| b.contains(address)) {
            return Err(Refusal::OutsidePools);
        }
        Ok(())
    }

    /// The pools as CIDRs, per family, for a routing daemon's export filter.
    pub fn prefixes(&self) -> Vec<IpNet> {
        let mut out: Vec<IpNet> = self.pools.iter().flat_map(cidrs).collect();
        out.sort();
        out.dedup();
        out
    }
}

/// A refused address of a Service.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Refused {
    /// The Service (`namespace/name`).
    pub service: ServiceName,
    /// The address.
    pub address: IpAddr,
    /// Why.
    pub refusal: Refusal,
}

/// Keep of every Service only the addresses `guard` allows (a Service left with none drops
/// out), and list the others with why.
pub fn screen(
    services: BTreeMap<ServiceName, Announced>,
    guard: &Guard,
) -> (BTreeMap<ServiceName, Announced>, Vec<Refused>) {
    let mut refused = Vec::new();
    let mut allowed = BTreeMap::new();
    for (service, mut announced) in services {
        announced.addresses.retain(|address| match guard.check(*address) {
            Ok(()) => true,
            Err(refusal) => {
                refused.push(Refused { service: service.clone(), address: *address, refusal });
                false
            }
        });
        if !announced.addresses.is_empty() {
            allowed.insert(service, announced);
        }
    }
    (allowed, refused)
}

/// When each refusal was last reported, so a lasting one is repeated every [`REPORT_EVERY`]
/// rather than on every pass.
#[derive(Debug, Default)]
pub struct Reports {
    last: HashMap<(ServiceName, IpAddr), (Refusal, Instant)>,
}

impl Reports {
    /// The refusals to report now among `refused` (new ones, changed reasons, and those last
    /// reported at least `every` ago); those no longer refused are forgotten.
    pub fn due(&mut self, refused: &[Refused], now: Instant, every: Duration) -> Vec<Refused> {
        let current: BTreeSet<(&str, IpAddr)> = refused.iter().map(|r| (r.service.as_str(), r.address)).collect();
        self.last.retain(|(service, address), _| current.contains(&(service.as_str(), *address)));
        let mut due = Vec::new();
        for r in refused {
            let key = (r.service.clone(), r.address);
            let report = match self.last.get(&key) {
                Some((refusal, at)) => *refusal != r.refusal || now.saturating_duration_since(*at) >= every,
                None => true,
            };
            if report {
                self.last.insert(key, (r.refusal, now));
                due.push(r.clone());
            }
        }
        due
    }
}

/// The fewest CIDRs covering `block` exactly.
pub fn cidrs(block: &IpBlock) -> Vec<IpNet> {
    let bits: u32 = if block.family() == crate::ipam::Family::V4 { 32 } else { 128 };
    let to_u128 = |ip: IpAddr| match ip {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    };
    let (mut first, last) = (to_u128(block.first()), to_u128(block.last()));
    let mut out = Vec::new();
    loop {
        // The largest aligned block starting at `first` that ends by `last`.
        let fits = |size: u32| match 1u128.checked_shl(size) {
            Some(count) => first.checked_add(count - 1).is_some_and(|end| end <= last),
            None => first == 0 && last == u128::MAX,
        };
        let mut size = if first == 0 { bits } else { first.trailing_zeros().min(bits) };
        while size > 0 && !fits(size) {
            size -= 1;
        }
        let prefix = u8::try_from(bits - size).unwrap_or(0);
        let net = match block.family() {
            crate::ipam::Family::V4 => {
                IpNet::V4(ipnet::Ipv4Net::new((first as u32).into(), prefix).unwrap_or_default())
            }
            crate::ipam::Family::V6 => IpNet::V6(ipnet::Ipv6Net::new(first.into(), prefix).unwrap_or_default()),
        };
        out.push(net);
        let span = 1u128.checked_shl(size).map_or(u128::MAX, |count| count - 1);
        match first.checked_add(span).and_then(|end| end.checked_add(1)) {
            Some(next) if next <= last => first = next,
            _ => return out,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    fn block(text: &str) -> IpBlock {
        if text.contains('/') { IpBlock::parse_cidr(text) } else { IpBlock::parse_range(text) }.unwrap()
    }

    fn facts() -> Facts {
        Facts {
            pools: vec![block("192.0.2.0/24"), block("2001:db8:cc::/120"), block("10.0.0.0/24")],
            inventory: BTreeSet::from([ip("10.0.0.11")]),
            host: HostFacts {
                interfaces: vec!["10.0.0.12/24".parse().unwrap(), "fe80::1/64".parse().unwrap()],
                gateways: BTreeSet::from([ip("10.0.0.1")]),
            },
            complete: true,
            policies: Vec::new(),
        }
    }

    #[test]
    fn only_pool_addresses_are_announced_and_never_a_node_gateway_or_special_address() {
        let guard = Guard::new(&facts(), [ip("10.0.0.13")]);
        assert_eq!(guard.check(ip("192.0.2.10")), Ok(()));
        assert_eq!(guard.check(ip("2001:db8:cc::10")), Ok(()));
        assert_eq!(guard.check(ip("10.0.0.50")), Ok(()), "a pool address on the node's subnet");
        assert_eq!(guard.check(ip("198.51.100.1")), Err(Refusal::OutsidePools));
        assert_eq!(guard.check(ip("2001:db8:dd::1")), Err(Refusal::OutsidePools));
        assert_eq!(guard.check(ip("10.0.0.1")), Err(Refusal::Gateway));
        assert_eq!(guard.check(ip("10.0.0.11")), Err(Refusal::NodeAddress), "the inventory's");
        assert_eq!(guard.check(ip("10.0.0.12")), Err(Refusal::NodeAddress), "this host's interface");
        assert_eq!(guard.check(ip("10.0.0.13")), Err(Refusal::NodeAddress), "a Node's status");
        assert_eq!(guard.check(ip("10.0.0.0")), Err(Refusal::SubnetEdge));
        assert_eq!(guard.check(ip("10.0.0.255")), Err(Refusal::SubnetEdge));
        assert_eq!(guard.check(ip("169.254.1.1")), Err(Refusal::LinkLocal));
        assert_eq!(guard.check(ip("fe80::2")), Err(Refusal::LinkLocal));
        for reserved in ["127.0.0.1", "0.0.0.0", "224.0.0.1", "255.255.255.255", "::1", "::", "ff02::1"] {
            assert_eq!(guard.check(ip(reserved)), Err(Refusal::Reserved), "{reserved}");
        }
        // Without pools nothing is announced: the guard fails closed.
        let empty = Guard::new(&Facts::default(), []);
        assert_eq!(empty.check(ip("192.0.2.10")), Err(Refusal::OutsidePools));
    }

    #[test]
    fn screening_keeps_allowed_addresses_and_names_each_refused_one_with_its_service() {
        let guard = Guard::new(&facts(), []);
        let services = BTreeMap::from([
            (
                "a/web".to_string(),
                Announced { addresses: vec![ip("192.0.2.1"), ip("10.0.0.1")], local: false, ..Default::default() },
            ),
            (
                "b/evil".to_string(),
                Announced { addresses: vec![ip("198.51.100.7")], local: true, ..Default::default() },
            ),
        ]);
        let (allowed, refused) = screen(services, &guard);
        assert_eq!(allowed.len(), 1);
        assert_eq!(allowed["a/web"].addresses, [ip("192.0.2.1")]);
        assert_eq!(
            refused,
            [
                Refused { service: "a/web".into(), address: ip("10.0.0.1"), refusal: Refusal::Gateway },
                Refused { service: "b/evil".into(), address: ip("198.51.100.7"), refusal: Refusal::OutsidePools },
            ]
        );
        assert!(refused[1].refusal.to_string().contains("no load-balancer pool"));
    }

    #[test]
    fn a_lasting_refusal_is_reported_once_per_period_and_again_when_its_reason_changes() {
        let mut reports = Reports::default();
        let r = |refusal| Refused { service: "a/web".into(), address: ip("10.0.0.1"), refusal };
        let t0 = Instant::now();
        let every = Duration::from_secs(600);
        assert_eq!(reports.due(&[r(Refusal::Gateway)], t0, every).len(), 1);
        assert!(reports.due(&[r(Refusal::Gateway)], t0 + Duration::from_secs(1), every).is_empty());
        assert_eq!(reports.due(&[r(Refusal::NodeAddress)], t0 + Duration::from_secs(2), every).len(), 1);
        assert!(reports.due(&[r(Refusal::NodeAddress)], t0 + Duration::from_secs(3), every).is_empty());
        assert_eq!(reports.due(&[r(Refusal::NodeAddress)], t0 + every + Duration::from_secs(2), every).len(), 1);
        // Gone, then back: reported at once.
        assert!(reports.due(&[], t0 + every + Duration::from_secs(3), every).is_empty());
        assert_eq!(reports.due(&[r(Refusal::NodeAddress)], t0 + every + Duration::from_secs(4), every).len(), 1);
    }

    #[test]
    fn blocks_become_the_fewest_cidrs_covering_them_exactly() {
        let nets = |b: &str| cidrs(&block(b)).iter().map(ToString::to_string).collect::<Vec<_>>();
        assert_eq!(nets("192.0.2.0/28"), ["192.0.2.0/28"]);
        assert_eq!(nets("192.0.2.10-192.0.2.20"), ["192.0.2.10/31", "192.0.2.12/30", "192.0.2.16/30", "192.0.2.20/32"]);
        assert_eq!(nets("0.0.0.0/0"), ["0.0.0.0/0"]);
        assert_eq!(nets("255.255.255.254-255.255.255.255"), ["255.255.255.254/31"]);
        assert_eq!(nets("2001:db8::/120"), ["2001:db8::/120"]);
        assert_eq!(nets("::/0"), ["::/0"]);
        assert_eq!(nets("2001:db8::1-2001:db8::2"), ["2001:db8::1/128", "2001:db8::2/128"]);
        let pools = vec![block("192.0.2.12/30"), block("192.0.2.10-192.0.2.11"), block("192.0.2.12/30")];
        let guard = Guard::new(&Facts::of_pools(pools), []);
        let prefixes: Vec<String> = guard.prefixes().iter().map(ToString::to_string).collect();
        assert_eq!(prefixes, ["192.0.2.10/31", "192.0.2.12/30"]);
    }
}
