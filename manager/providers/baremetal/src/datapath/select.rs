//! Backend selection and the source-range filter. Pure: callers pass the backends' state.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::net::IpAddr;

use ipnet::IpNet;

use super::config::{Affinity, Balance};

/// What selection needs to know about one backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    /// The backend's address (the affinity hash input).
    pub ip: IpAddr,
    /// Its health.
    pub health: Health,
    /// Its open connections (for least-connections).
    pub active: usize,
}

/// A backend's health as the checker last saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    /// Not checked yet.
    Unknown,
    /// Passing.
    Healthy,
    /// Failing: takes no new traffic.
    Unhealthy,
}

/// The backends a new connection may use: the healthy ones, or, while none is known healthy
/// (the first checks are still running), the not-yet-checked ones. Unhealthy ones never.
pub fn eligible(candidates: &[Candidate]) -> Vec<usize> {
    let healthy: Vec<usize> = (0..candidates.len()).filter(|&i| candidates[i].health == Health::Healthy).collect();
    if !healthy.is_empty() {
        return healthy;
    }
    (0..candidates.len()).filter(|&i| candidates[i].health == Health::Unknown).collect()
}

/// Pick a backend index for a connection from `client`, skipping `exclude` (backends that
/// already refused this connection). `turn` is a counter the caller increments per pick.
pub fn pick(
    candidates: &[Candidate],
    balance: Balance,
    affinity: Affinity,
    client: IpAddr,
    turn: usize,
    exclude: &[usize],
) -> Option<usize> {
    let pool: Vec<usize> = eligible(candidates).into_iter().filter(|i| !exclude.contains(i)).collect();
    if pool.is_empty() {
        return None;
    }
    if affinity == Affinity::ClientIp {
        // Rendezvous hashing: a client keeps its backend while that backend stays eligible,
        // and only the clients of a leaving backend move.
        let client = canonical(client);
        return pool.into_iter().max_by_key(|&i| {
            let mut h = DefaultHasher::new();
            (client, candidates[i].ip).hash(&mut h);
            (h.finish(), i)
        });
    }
    match balance {
        Balance::RoundRobin => Some(pool[turn % pool.len()]),
        Balance::LeastConnections => {
            let least = pool.iter().map(|&i| candidates[i].active).min()?;
            let tied: Vec<usize> = pool.into_iter().filter(|&i| candidates[i].active == least).collect();
            Some(tied[turn % tied.len()])
        }
    }
}

/// Whether `client` may connect: no ranges allow everyone, otherwise one range must hold it.
pub fn source_allowed(ranges: &[IpNet], client: IpAddr) -> bool {
    let client = canonical(client);
    ranges.is_empty() || ranges.iter().any(|r| r.contains(&client))
}

/// IPv4-mapped IPv6 addresses (dual-stack sockets) as the IPv4 address they carry.
fn canonical(ip: IpAddr) -> IpAddr {
    ip.to_canonical()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(last: u8, health: Health, active: usize) -> Candidate {
        Candidate { ip: IpAddr::from([10, 0, 0, last]), health, active }
    }

    fn client(last: u8) -> IpAddr {
        IpAddr::from([192, 168, 0, last])
    }

    #[test]
    fn round_robin_visits_every_healthy_backend_in_turn() {
        let cs = [c(1, Health::Healthy, 0), c(2, Health::Unhealthy, 0), c(3, Health::Healthy, 0)];
        let picks: Vec<_> =
            (0..4).map(|t| pick(&cs, Balance::RoundRobin, Affinity::None, client(1), t, &[]).unwrap()).collect();
        assert_eq!(picks, [0, 2, 0, 2]);
    }

    #[test]
    fn least_connections_prefers_the_idlest_backend() {
        let cs = [c(1, Health::Healthy, 5), c(2, Health::Healthy, 1), c(3, Health::Healthy, 3)];
        assert_eq!(pick(&cs, Balance::LeastConnections, Affinity::None, client(1), 7, &[]), Some(1));
    }

    #[test]
    fn unchecked_backends_serve_only_until_one_is_known_healthy() {
        let fresh = [c(1, Health::Unknown, 0), c(2, Health::Unhealthy, 0)];
        assert_eq!(eligible(&fresh), [0]);
        let mixed = [c(1, Health::Unknown, 0), c(2, Health::Healthy, 0)];
        assert_eq!(eligible(&mixed), [1]);
        let down = [c(1, Health::Unhealthy, 0)];
        assert_eq!(pick(&down, Balance::RoundRobin, Affinity::None, client(1), 0, &[]), None);
    }

    #[test]
    fn client_ip_affinity_pins_a_client_and_moves_only_the_clients_of_a_leaving_backend() {
        let cs: Vec<Candidate> = (1..=4).map(|i| c(i, Health::Healthy, 0)).collect();
        let before: Vec<usize> = (0..=255)
            .map(|i| pick(&cs, Balance::RoundRobin, Affinity::ClientIp, client(i), i as usize, &[]).unwrap())
            .collect();
        // The turn counter does not matter: the same client lands on the same backend.
        for i in 0..=255u8 {
            assert_eq!(
                pick(&cs, Balance::RoundRobin, Affinity::ClientIp, client(i), 99, &[]),
                Some(before[i as usize])
            );
        }
        let used: std::collections::BTreeSet<_> = before.iter().collect();
        assert_eq!(used.len(), 4, "clients spread over every backend");
        let mut down = cs.clone();
        down[2].health = Health::Unhealthy;
        for i in 0..=255u8 {
            let now = pick(&down, Balance::RoundRobin, Affinity::ClientIp, client(i), 0, &[]).unwrap();
            if before[i as usize] != 2 {
                assert_eq!(now, before[i as usize], "client {i} moved although its backend stayed");
            } else {
                assert_ne!(now, 2);
            }
        }
    }

    #[test]
    fn excluded_backends_are_skipped() {
        let cs = [c(1, Health::Healthy, 0), c(2, Health::Healthy, 0)];
        assert_eq!(pick(&cs, Balance::RoundRobin, Affinity::ClientIp, client(1), 0, &[0, 1]), None);
        let first = pick(&cs, Balance::RoundRobin, Affinity::ClientIp, client(1), 0, &[]).unwrap();
        assert_eq!(pick(&cs, Balance::RoundRobin, Affinity::ClientIp, client(1), 0, &[first]), Some(1 - first));
    }

    #[test]
    fn source_ranges_allow_members_only_and_empty_allows_all() {
        let ranges: Vec<IpNet> = vec!["10.0.0.0/8".parse().unwrap(), "fd00::/8".parse().unwrap()];
        assert!(source_allowed(&ranges, "10.1.2.3".parse().unwrap()));
        assert!(source_allowed(&ranges, "::ffff:10.1.2.3".parse().unwrap()));
        assert!(source_allowed(&ranges, "fd00::1".parse().unwrap()));
        assert!(!source_allowed(&ranges, "192.168.0.1".parse().unwrap()));
        assert!(source_allowed(&[], "192.168.0.1".parse().unwrap()));
    }
}
