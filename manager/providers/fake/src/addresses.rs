//! Load-balancer address allocation: addresses handed out in order from a range, released ones
//! reused first, and addresses taken by other means (a Service's `loadBalancerIP`, a load balancer
//! inserted by a test) never handed out twice.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ccm_framework::provider::{CloudError, CloudResult};
use ipnet::IpNet;
use k8s_openapi::api::core::v1::LoadBalancerStatus;

/// Default range load-balancer addresses come from (RFC 2544 benchmarking range: big, and
/// never routed).
pub const DEFAULT_LB_RANGE: &str = "198.18.0.0/15";

/// The addresses of one range: which were handed out and which are in use.
#[derive(Debug, Clone)]
pub(crate) struct AddressPool {
    range: IpNet,
    /// Offsets below this were handed out at least once.
    next: u128,
    /// Offsets released since, handed out again first.
    free: BTreeSet<u128>,
    used: BTreeSet<IpAddr>,
}

impl Default for AddressPool {
    fn default() -> Self {
        let range: IpNet = DEFAULT_LB_RANGE.parse().unwrap_or_else(|_| unreachable!("constant range parses"));
        Self::new(range)
    }
}

impl AddressPool {
    /// An empty pool over `range`.
    pub(crate) fn new(range: IpNet) -> Self {
        Self { range, next: 0, free: BTreeSet::new(), used: BTreeSet::new() }
    }

    /// The range addresses come from.
    #[cfg(test)]
    pub(crate) fn range(&self) -> IpNet {
        self.range
    }

    /// The next address not in use.
    pub(crate) fn allocate(&mut self) -> CloudResult<IpAddr> {
        let (first, count) = host_range(&self.range);
        loop {
            let offset = match self.free.pop_first() {
                Some(o) => o,
                None if self.next < count => {
                    self.next += 1;
                    self.next - 1
                }
                None => {
                    return Err(CloudError::Other(format!("load-balancer address range {} is exhausted", self.range)));
                }
            };
            let ip = nth_ip(&self.range, first + offset);
            if self.used.insert(ip) {
                return Ok(ip);
            }
        }
    }

    /// Mark `ip` in use (whether or not it lies in the range).
    pub(crate) fn claim(&mut self, ip: IpAddr) {
        self.used.insert(ip);
    }

    /// Mark every ingress address of `status` in use.
    pub(crate) fn claim_status(&mut self, status: &LoadBalancerStatus) {
        for ip in ingress_ips(status) {
            self.claim(ip);
        }
    }

    /// Give back every ingress address of `status`.
    pub(crate) fn release(&mut self, status: &LoadBalancerStatus) {
        let (first, _) = host_range(&self.range);
        for ip in ingress_ips(status) {
            self.used.remove(&ip);
            if self.range.contains(&ip) {
                let offset = ip_to_u128(ip) - ip_to_u128(self.range.network()) - first;
                self.free.insert(offset);
            }
        }
    }
}

/// How many addresses the `bench` counter cycles through (`198.18.0-255.1-250`).
pub const BENCH_ADDRESSES: u32 = 250 * 256;

/// The `n`th address the upstream `bench` provider hands out: `198.18.(n/250 % 256).(n%250 + 1)`.
pub fn bench_address(n: u32) -> Ipv4Addr {
    Ipv4Addr::new(198, 18, ((n / 250) % 256) as u8, (n % 250 + 1) as u8)
}

/// Whether `ip` is one the `bench` counter can hand out.
pub fn is_bench_address(ip: IpAddr) -> bool {
    matches!(ip, IpAddr::V4(v4) if { let o = v4.octets(); o[0] == 198 && o[1] == 18 && (1..=250).contains(&o[3]) })
}

/// The `bench` provider's counter: addresses in the order upstream's hands them out, skipping
/// the ones in use (upstream's cloud lives in one process and never sees another's addresses;
/// ours adopts them, so it must not hand them out again).
#[derive(Debug, Clone, Default)]
pub(crate) struct BenchCounter {
    next: u32,
    used: BTreeSet<IpAddr>,
}

impl BenchCounter {
    /// The next counter address not in use.
    pub(crate) fn allocate(&mut self) -> CloudResult<IpAddr> {
        for _ in 0..BENCH_ADDRESSES {
            let ip = IpAddr::V4(bench_address(self.next));
            self.next = self.next.wrapping_add(1);
            if self.used.insert(ip) {
                return Ok(ip);
            }
        }
        Err(CloudError::Other("every bench load-balancer address is in use".into()))
    }

    /// Mark `ip` in use.
    pub(crate) fn claim(&mut self, ip: IpAddr) {
        self.used.insert(ip);
    }

    /// Give back every ingress address of `status` (the counter itself never goes back, as
    /// upstream's does not).
    pub(crate) fn release(&mut self, status: &LoadBalancerStatus) {
        for ip in ingress_ips(status) {
            self.used.remove(&ip);
        }
    }
}

/// The first `bench` address among a Service's ingress addresses: the load balancer a
/// `bench` cloud in another process made for it.
pub(crate) fn bench_ingress(status: Option<&LoadBalancerStatus>) -> Option<IpAddr> {
    ingress_ips(status?).into_iter().find(|ip| is_bench_address(*ip))
}

fn ingress_ips(status: &LoadBalancerStatus) -> Vec<IpAddr> {
    status.ingress.iter().flatten().filter_map(|i| i.ip.as_deref()?.parse().ok()).collect()
}

fn ip_to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u32::from(v4) as u128,
        IpAddr::V6(v6) => u128::from(v6),
    }
}

/// Offset of the first usable address from the network address, and how many there are.
fn host_range(net: &IpNet) -> (u128, u128) {
    let bits = match net {
        IpNet::V4(_) => 32 - net.prefix_len() as u32,
        IpNet::V6(_) => 128 - net.prefix_len() as u32,
    };
    let size: u128 = if bits >= 127 { u128::MAX / 2 } else { 1u128 << bits };
    // Skip the network and (for IPv4) broadcast addresses when the range has room for them.
    match net {
        IpNet::V4(_) if size > 2 => (1, size - 2),
        IpNet::V6(_) if size > 1 => (1, size - 1),
        _ => (0, size),
    }
}

fn nth_ip(net: &IpNet, offset: u128) -> IpAddr {
    match net {
        IpNet::V4(n) => IpAddr::V4(Ipv4Addr::from(u32::from(n.network()).wrapping_add(offset as u32))),
        IpNet::V6(n) => IpAddr::V6(Ipv6Addr::from(u128::from(n.network()).wrapping_add(offset))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::LoadBalancerIngress;

    fn status(ip: IpAddr) -> LoadBalancerStatus {
        LoadBalancerStatus {
            ingress: Some(vec![LoadBalancerIngress { ip: Some(ip.to_string()), ..Default::default() }]),
        }
    }

    #[test]
    fn addresses_skip_network_broadcast_and_claimed_ones_and_released_ones_come_back() {
        let mut pool = AddressPool::new("192.0.2.0/29".parse().unwrap());
        pool.claim("192.0.2.2".parse().unwrap());
        let got: Vec<String> = (0..5).map(|_| pool.allocate().unwrap().to_string()).collect();
        assert_eq!(got, ["192.0.2.1", "192.0.2.3", "192.0.2.4", "192.0.2.5", "192.0.2.6"]);
        assert!(matches!(pool.allocate(), Err(CloudError::Other(m)) if m.contains("192.0.2.0/29")));
        pool.release(&status("192.0.2.4".parse().unwrap()));
        assert_eq!(pool.allocate().unwrap().to_string(), "192.0.2.4");
    }

    #[test]
    fn the_bench_counter_follows_upstreams_sequence_and_skips_addresses_in_use() {
        assert_eq!(bench_address(0).to_string(), "198.18.0.1");
        assert_eq!(bench_address(249).to_string(), "198.18.0.250");
        assert_eq!(bench_address(250).to_string(), "198.18.1.1");
        assert_eq!(bench_address(BENCH_ADDRESSES).to_string(), "198.18.0.1", "wraps as upstream's does");
        let mut c = BenchCounter::default();
        c.claim("198.18.0.2".parse().unwrap());
        let got: Vec<String> = (0..3).map(|_| c.allocate().unwrap().to_string()).collect();
        assert_eq!(got, ["198.18.0.1", "198.18.0.3", "198.18.0.4"]);
        c.release(&status("198.18.0.1".parse().unwrap()));
        assert_eq!(c.allocate().unwrap().to_string(), "198.18.0.5", "the counter never goes back");
    }

    #[test]
    fn bench_addresses_are_198_18_with_a_last_octet_of_1_to_250() {
        for (ip, want) in [
            ("198.18.0.1", true),
            ("198.18.255.250", true),
            ("198.18.0.251", false),
            ("198.18.0.0", false),
            ("198.19.0.1", false),
            ("2001:db8::1", false),
        ] {
            assert_eq!(is_bench_address(ip.parse().unwrap()), want, "{ip}");
        }
        let two = LoadBalancerStatus {
            ingress: Some(vec![
                LoadBalancerIngress { hostname: Some("lb.example".into()), ..Default::default() },
                LoadBalancerIngress { ip: Some("192.0.2.1".into()), ..Default::default() },
                LoadBalancerIngress { ip: Some("198.18.3.7".into()), ..Default::default() },
            ]),
        };
        assert_eq!(bench_ingress(Some(&two)).unwrap().to_string(), "198.18.3.7");
        assert_eq!(bench_ingress(None), None);
    }

    #[test]
    fn an_ipv6_range_hands_out_addresses_after_the_network_address() {
        let mut pool = AddressPool::new("2001:db8::/126".parse().unwrap());
        let got: Vec<String> = (0..3).map(|_| pool.allocate().unwrap().to_string()).collect();
        assert_eq!(got, ["2001:db8::1", "2001:db8::2", "2001:db8::3"]);
        assert!(pool.allocate().is_err());
    }
}
