//! What an L2 responder sends when the set of addresses it owns changes: gratuitous ARP /
//! unsolicited NA for each gained address, a few times and spaced (one lost frame must not
//! leave clients on the old node), and which IPv6 solicited-node multicast groups to be in.
//! Pure: the responder feeds it the owned set and the clock, and does what it says.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv6Addr};
use std::time::Duration;

use tokio::time::Instant;

use super::elect::OwnershipChange;

/// Announcements sent for each gained address.
pub const ANNOUNCEMENTS: u32 = 3;

/// Time between two announcements of one address.
pub const ANNOUNCEMENT_SPACING: Duration = Duration::from_millis(500);

/// Pending gratuitous announcements: address -> (next due, how many are left).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct AnnouncePlan {
    pending: BTreeMap<IpAddr, (Instant, u32)>,
}

impl AnnouncePlan {
    /// Apply an ownership change at `now`: gained addresses are due at once, lost ones are
    /// forgotten (the new owner announces them).
    pub fn apply(&mut self, change: &OwnershipChange, now: Instant) {
        for address in &change.lost {
            self.pending.remove(address);
        }
        for address in &change.gained {
            self.pending.insert(*address, (now, ANNOUNCEMENTS));
        }
    }

    /// The addresses to announce at `now`; each is rescheduled [`ANNOUNCEMENT_SPACING`] later
    /// until its [`ANNOUNCEMENTS`] are spent.
    pub fn due(&mut self, now: Instant) -> Vec<IpAddr> {
        let mut out = Vec::new();
        self.pending.retain(|address, (at, left)| {
            if *at > now {
                return true;
            }
            out.push(*address);
            *left -= 1;
            *at = now + ANNOUNCEMENT_SPACING;
            *left > 0
        });
        out
    }

    /// When the next announcement is due, if any.
    pub fn next_due(&self) -> Option<Instant> {
        self.pending.values().map(|(at, _)| *at).min()
    }
}

/// The solicited-node multicast group of an IPv6 address (RFC 4291 2.7.1): where Neighbor
/// Solicitations for it are sent, so the responder must be in it to hear them.
pub fn solicited_node_group(address: Ipv6Addr) -> Ipv6Addr {
    let o = address.octets();
    Ipv6Addr::new(0xff02, 0, 0, 0, 0, 1, 0xff00 | u16::from(o[13]), u16::from_be_bytes([o[14], o[15]]))
}

/// The groups to be in for `owned` (several addresses may share one).
pub fn groups(owned: &BTreeSet<IpAddr>) -> BTreeSet<Ipv6Addr> {
    owned
        .iter()
        .filter_map(|a| match a {
            IpAddr::V6(v6) => Some(solicited_node_group(*v6)),
            IpAddr::V4(_) => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(items: &[&str]) -> BTreeSet<IpAddr> {
        items.iter().map(|s| s.parse().unwrap()).collect()
    }

    #[test]
    fn a_gained_address_is_announced_at_once_then_twice_more_spaced() {
        let now = Instant::now();
        let mut plan = AnnouncePlan::default();
        plan.apply(&OwnershipChange::between(&set(&[]), &set(&["192.0.2.1"])), now);
        assert_eq!(plan.next_due(), Some(now));
        assert_eq!(plan.due(now), vec!["192.0.2.1".parse::<IpAddr>().unwrap()]);
        assert!(plan.due(now + Duration::from_millis(499)).is_empty());
        assert_eq!(plan.due(now + ANNOUNCEMENT_SPACING).len(), 1);
        assert_eq!(plan.due(now + ANNOUNCEMENT_SPACING * 2).len(), 1);
        assert!(plan.due(now + ANNOUNCEMENT_SPACING * 10).is_empty());
        assert_eq!(plan.next_due(), None);
    }

    #[test]
    fn a_lost_address_is_no_longer_announced() {
        let now = Instant::now();
        let mut plan = AnnouncePlan::default();
        plan.apply(&OwnershipChange::between(&set(&[]), &set(&["192.0.2.1", "2001:db8::1"])), now);
        plan.apply(&OwnershipChange::between(&set(&["192.0.2.1", "2001:db8::1"]), &set(&["2001:db8::1"])), now);
        assert_eq!(plan.due(now), vec!["2001:db8::1".parse::<IpAddr>().unwrap()]);
    }

    #[test]
    fn solicited_node_group_takes_the_low_24_bits() {
        let group = solicited_node_group("2001:db8::1:2a3b:4c5d".parse().unwrap());
        assert_eq!(group, "ff02::1:ff3b:4c5d".parse::<Ipv6Addr>().unwrap());
        // Two addresses with the same low 24 bits share a group; IPv4 needs none.
        let owned = set(&["2001:db8::aa:1", "2001:db8:1::aa:1", "192.0.2.1"]);
        assert_eq!(groups(&owned).len(), 1);
    }
}
