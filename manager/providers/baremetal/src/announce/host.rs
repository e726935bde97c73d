//! This host's own network, for the announcer's guard (I/O, Linux): the addresses and prefixes
//! of its interfaces (`getifaddrs`) and the gateways of its routes (`/proc/net/route`,
//! `/proc/net/ipv6_route`). The announcer runs on the host network, so these are the node's.
//! Parsing the route tables is pure and tested; a table that cannot be read gives nothing.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

use super::guard::HostFacts;

/// This host's interfaces and gateways, now (what cannot be read is left out, and logged).
pub fn read() -> HostFacts {
    let interfaces = interfaces().unwrap_or_else(|error| {
        tracing::warn!(%error, "cannot list this host's interface addresses; the announcer's guard goes without them");
        Vec::new()
    });
    let mut gateways = BTreeSet::new();
    for (path, parse) in
        [("/proc/net/route", gateways_v4 as fn(&str) -> BTreeSet<IpAddr>), ("/proc/net/ipv6_route", gateways_v6)]
    {
        if let Ok(text) = std::fs::read_to_string(path) {
            gateways.extend(parse(&text));
        }
    }
    HostFacts { interfaces, gateways }
}

/// The gateways of `/proc/net/route`: the third column, little-endian hex; zero is none.
pub fn gateways_v4(table: &str) -> BTreeSet<IpAddr> {
    table
        .lines()
        .skip(1)
        .filter_map(|line| line.split_whitespace().nth(2))
        .filter_map(|hex| u32::from_str_radix(hex, 16).ok())
        .filter(|raw| *raw != 0)
        .map(|raw| IpAddr::V4(Ipv4Addr::from(raw.to_le_bytes())))
        .collect()
}

/// The next hops of `/proc/net/ipv6_route`: the fifth column, 32 hex digits; zero is none.
pub fn gateways_v6(table: &str) -> BTreeSet<IpAddr> {
    table
        .lines()
        .filter_map(|line| line.split_whitespace().nth(4))
        .filter(|hex| hex.len() == 32)
        .filter_map(|hex| u128::from_str_radix(hex, 16).ok())
        .filter(|raw| *raw != 0)
        .map(|raw| IpAddr::V6(Ipv6Addr::from(raw)))
        .collect()
}

/// The length of a netmask's prefix.
fn prefix_len(mask: IpAddr) -> u8 {
    let ones = match mask {
        IpAddr::V4(v4) => u32::from(v4).leading_ones(),
        IpAddr::V6(v6) => u128::from(v6).leading_ones(),
    };
    u8::try_from(ones).unwrap_or(0)
}

/// The IP address of a socket address, if it is one.
///
/// # Safety
/// `address` is null or points at a socket address whose length fits its family.
unsafe fn ip_of(address: *const libc::sockaddr) -> Option<IpAddr> {
    if address.is_null() {
        return None;
    }
    // SAFETY: non-null, and getifaddrs gives socket addresses of their family's length.
    match i32::from(unsafe { (*address).sa_family }) {
        libc::AF_INET => {
            let v4 = unsafe { &*(address as *const libc::sockaddr_in) };
            Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(v4.sin_addr.s_addr))))
        }
        libc::AF_INET6 => {
            let v6 = unsafe { &*(address as *const libc::sockaddr_in6) };
            Some(IpAddr::V6(Ipv6Addr::from(v6.sin6_addr.s6_addr)))
        }
        _ => None,
    }
}

/// Every IP address of every interface, with its prefix.
pub fn interfaces() -> std::io::Result<Vec<IpNet>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list freed below by freeifaddrs.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut current = head;
    while !current.is_null() {
        // SAFETY: a node of the list, valid until freeifaddrs.
        let entry = unsafe { &*current };
        // SAFETY: the entry's address and netmask are null or valid socket addresses.
        let (address, mask) = unsafe { (ip_of(entry.ifa_addr), ip_of(entry.ifa_netmask)) };
        if let Some(address) = address {
            let len = mask.map(prefix_len).unwrap_or(if address.is_ipv4() { 32 } else { 128 });
            if let Ok(net) = IpNet::new(address, len) {
                out.push(net);
            }
        }
        current = entry.ifa_next;
    }
    // SAFETY: `head` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gateways_are_read_from_the_kernels_route_tables() {
        let v4 = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
                  eth0\t00000000\t0101A8C0\t0003\t0\t0\t100\t00000000\t0\t0\t0\n\
                  eth0\t0001A8C0\t00000000\t0001\t0\t0\t100\t00FFFFFF\t0\t0\t0\n";
        assert_eq!(gateways_v4(v4), BTreeSet::from(["192.168.1.1".parse().unwrap()]));
        let v6 = "00000000000000000000000000000000 00 00000000000000000000000000000000 00 fe800000000000000000000000000001 00000400 00000001 00000000 00000003 eth0\n\
                  20010db8000000000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00000001 eth0\n";
        assert_eq!(gateways_v6(v6), BTreeSet::from(["fe80::1".parse().unwrap()]));
        assert!(gateways_v4("garbage").is_empty() && gateways_v6("").is_empty());
    }

    #[test]
    fn this_hosts_interfaces_include_loopback_with_its_prefix() {
        let nets = interfaces().expect("getifaddrs");
        assert!(nets.contains(&"127.0.0.1/8".parse().unwrap()), "{nets:?}");
        assert_eq!(prefix_len("255.255.255.0".parse().unwrap()), 24);
        assert_eq!(prefix_len("ffff:ffff:ffff:ffff::".parse().unwrap()), 64);
    }
}
