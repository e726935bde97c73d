//! Which Service ports a pool lets its addresses take (pure).
//!
//! A Service picks its own ports. On addresses that belong to load balancers alone that is
//! harmless, but a pool may hold node addresses (a pool made of the nodes' own IPs, as small
//! clusters do): there a Service on port 22, 6443 or 10250 would take a host port of a node,
//! in proxy mode by binding it before (or instead of) the host's daemon, in address mode by
//! kube-proxy capturing the traffic. Each pool therefore has a rule: `minPort` (default 1) and
//! `allowedPorts` (default: every port, but no port at all on a pool holding node addresses,
//! so an operator opens exactly the ports meant for tenants there).

use std::ops::RangeInclusive;

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
