//! Which node announces each address: rendezvous (highest-random-weight) hashing over
//! (address, node). Every announcer computes the same answer from the same set of live
//! announcers, with no coordination, and a node that leaves moves only its own addresses.
//!
//! The weight is SHA-256 of `"<node>#<address>"`, the same inputs MetalLB's speakers hash, so
//! the spread is uniform and stable across versions and platforms (std's hashers promise
//! neither).

use std::collections::BTreeSet;
use std::net::IpAddr;

use ring::digest::{SHA256, digest};

/// The weight of `node` for `address`; the highest weight announces.
pub fn weight(address: IpAddr, node: &str) -> [u8; 32] {
    let input = format!("{node}#{address}");
    let hash = digest(&SHA256, input.as_bytes());
    let mut out = [0u8; 32];
    out.copy_from_slice(hash.as_ref());
    out
}

/// The node among `candidates` that announces `address`, or `None` when there is no
/// candidate. Ties (equal weights, in practice only the same name twice) go to the smaller name
/// so the answer never depends on the candidates' order.
pub fn elect<'a, I>(address: IpAddr, candidates: I) -> Option<&'a str>
where
    I: IntoIterator<Item = &'a str>,
{
    candidates
        .into_iter()
        .map(|node| (weight(address, node), node))
        .max_by(|(wa, na), (wb, nb)| wa.cmp(wb).then_with(|| nb.cmp(na)))
        .map(|(_, node)| node)
}

/// The nodes that may announce a Service's addresses: every live announcer for
/// `externalTrafficPolicy: Cluster`; for `Local`, only live announcers that also run a ready
/// endpoint of the Service (announcing from a node without one would drop the traffic, so
/// with none the address is not announced at all, as MetalLB does).
pub fn eligible<'a>(
    live: &'a BTreeSet<String>,
    local_policy: bool,
    nodes_with_ready_endpoints: &BTreeSet<String>,
) -> impl Iterator<Item = &'a str> {
    live.iter().filter(move |node| !local_policy || nodes_with_ready_endpoints.contains(*node)).map(String::as_str)
}

/// The addresses `me` announces among `addresses`, each elected over `candidates`.
pub fn owned_by<'a>(
    me: &str,
    addresses: impl IntoIterator<Item = &'a IpAddr>,
    candidates: &[&str],
) -> BTreeSet<IpAddr> {
    addresses.into_iter().filter(|address| elect(**address, candidates.iter().copied()) == Some(me)).copied().collect()
}

/// What changed in the set of addresses a node announces.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OwnershipChange {
    /// Newly owned: announce them at once with gratuitous ARP / unsolicited NA.
    pub gained: BTreeSet<IpAddr>,
    /// No longer owned: stop answering for them (the new owner's announcements move clients).
    pub lost: BTreeSet<IpAddr>,
}

impl OwnershipChange {
    /// The difference between what was owned (`before`) and what is owned now (`after`).
    pub fn between(before: &BTreeSet<IpAddr>, after: &BTreeSet<IpAddr>) -> Self {
        Self { gained: after.difference(before).copied().collect(), lost: before.difference(after).copied().collect() }
    }

    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        self.gained.is_empty() && self.lost.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn addresses(n: u32) -> Vec<IpAddr> {
        (0..n)
            .map(|i| {
                if i % 2 == 0 {
                    IpAddr::from([10, 1, (i >> 8) as u8, i as u8])
                } else {
                    IpAddr::from([0x2001, 0xdb8, 0, 0, 0, 0, (i >> 16) as u16, i as u16])
                }
            })
            .collect()
    }

    fn nodes(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("node-{i}")).collect()
    }

    #[test]
    fn every_announcer_elects_the_same_node_whatever_the_order_of_candidates() {
        let names = nodes(5);
        let forward: Vec<&str> = names.iter().map(String::as_str).collect();
        let mut backward = forward.clone();
        backward.reverse();
        for address in addresses(200) {
            assert_eq!(elect(address, forward.iter().copied()), elect(address, backward.iter().copied()));
        }
        // Fixed answers (computed with Python's hashlib): a change of hash or input format
        // would split a cluster running two versions during a rollout, so it must fail here.
        let v4: IpAddr = "192.0.2.10".parse().unwrap();
        let v6: IpAddr = "2001:db8::10".parse().unwrap();
        assert_eq!(elect(v4, forward.iter().copied()), Some("node-0"));
        assert_eq!(weight(v4, "node-0")[..4], [0xcc, 0xd8, 0x07, 0x5c]);
        assert_eq!(elect(v6, forward.iter().copied()), Some("node-2"));
        assert_eq!(weight(v6, "node-2")[..4], [0xef, 0x60, 0x3d, 0x9e]);
    }

    #[test]
    fn no_candidate_means_no_announcer() {
        assert_eq!(elect("192.0.2.1".parse().unwrap(), std::iter::empty()), None);
    }

    #[test]
    fn addresses_spread_evenly_over_nodes() {
        let names = nodes(4);
        let candidates: Vec<&str> = names.iter().map(String::as_str).collect();
        let mut per_node: BTreeMap<&str, usize> = BTreeMap::new();
        let all = addresses(4000);
        for address in &all {
            *per_node.entry(elect(*address, candidates.iter().copied()).unwrap()).or_default() += 1;
        }
        assert_eq!(per_node.len(), 4, "{per_node:?}");
        for (node, count) in &per_node {
            // 1,000 expected each; a uniform hash stays within a few standard deviations (~27).
            assert!((850..=1150).contains(count), "{node} announces {count} of 4000: {per_node:?}");
        }
    }

    #[test]
    fn a_leaving_node_moves_only_its_own_addresses_and_a_joining_one_takes_only_what_it_wins() {
        let names = nodes(5);
        let all: Vec<&str> = names.iter().map(String::as_str).collect();
        let without_2: Vec<&str> = all.iter().copied().filter(|n| *n != "node-2").collect();
        let addrs = addresses(1000);
        let mut moved = 0;
        for address in &addrs {
            let before = elect(*address, all.iter().copied()).unwrap();
            let after = elect(*address, without_2.iter().copied()).unwrap();
            if before == "node-2" {
                moved += 1;
                assert_ne!(after, "node-2");
            } else {
                assert_eq!(before, after, "{address} moved from {before} though node-2 left");
            }
        }
        assert!(moved > 100, "node-2 owned only {moved} of 1000");
        // Joining is the same relation read backwards: only addresses the newcomer wins move.
        for address in &addrs {
            let before = elect(*address, without_2.iter().copied()).unwrap();
            let after = elect(*address, all.iter().copied()).unwrap();
            assert!(after == before || after == "node-2");
        }
    }

    #[test]
    fn local_policy_elects_only_among_nodes_with_ready_endpoints() {
        let live: BTreeSet<String> = nodes(4).into_iter().collect();
        let ready: BTreeSet<String> = ["node-3".to_string(), "elsewhere".to_string()].into();
        let local: Vec<&str> = eligible(&live, true, &ready).collect();
        assert_eq!(local, ["node-3"]);
        assert_eq!(eligible(&live, false, &ready).count(), 4);
        assert_eq!(eligible(&live, true, &BTreeSet::new()).count(), 0);
    }

    #[test]
    fn ownership_change_names_gained_and_lost_addresses() {
        let names = nodes(3);
        let all: Vec<&str> = names.iter().map(String::as_str).collect();
        let addrs = addresses(300);
        let before = owned_by("node-1", &addrs, &all);
        let after = owned_by("node-1", &addrs, &["node-1", "node-2"]);
        let change = OwnershipChange::between(&before, &after);
        assert!(change.lost.is_empty(), "node-0 leaving takes nothing from node-1");
        assert!(!change.gained.is_empty());
        for address in &change.gained {
            assert_eq!(elect(*address, all.iter().copied()), Some("node-0"));
        }
        assert!(OwnershipChange::between(&after, &after).is_empty());
    }
}
