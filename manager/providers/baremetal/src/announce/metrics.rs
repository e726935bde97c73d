//! The announcer's Prometheus gauges (docs/l2-announcement.md#metrics): which addresses this
//! node answers ARP/NDP for and advertises over BGP, its BGP sessions, and its health, kept in
//! step with the announcer's own channels. Served by `announce --secure-port`.

use std::collections::{BTreeSet, HashSet};
use std::net::IpAddr;
use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::bgp::Advertisement;
use super::bgp_sessions::Session;
use super::health::Health;
use ccm_framework::metrics::Metrics;

/// Most per-address series shown per protocol; the counts stay exact beyond it.
pub const MAX_ADDRESS_SERIES: usize = 1024;

/// `ccm_announcer_announced`: 1 per address this node announces.
pub const ANNOUNCED: &str = "ccm_announcer_announced";
/// `ccm_announcer_addresses`: how many addresses this node announces, per protocol.
pub const ADDRESSES: &str = "ccm_announcer_addresses";
/// `ccm_announcer_bgp_session_up`: 1 per BGP peer whose session is Established, else 0.
pub const SESSION_UP: &str = "ccm_announcer_bgp_session_up";
/// `ccm_announcer_healthy`: 1 while the node's health checks pass, 0 while it gives its
/// addresses up.
pub const HEALTHY: &str = "ccm_announcer_healthy";

/// Labels of [`ANNOUNCED`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct AddressLabels {
    /// `l2` (ARP/NDP answered here) or `bgp` (advertised from here).
    pub protocol: String,
    /// The address.
    pub address: String,
}

/// Labels of [`ADDRESSES`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ProtocolLabels {
    /// `l2` or `bgp`.
    pub protocol: String,
}

/// Labels of [`SESSION_UP`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct PeerLabels {
    /// The peer's address.
    pub peer: String,
    /// Its BGP state as BIRD reports it (`Established`, `Active`, `Down`, ...).
    pub state: String,
}

/// What the gauges show at one moment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    /// Addresses answered by ARP/NDP here (`None`: no L2 announcement configured).
    pub l2: Option<BTreeSet<IpAddr>>,
    /// Addresses advertised over BGP from here (`None`: no BGP configured).
    pub bgp: Option<BTreeSet<IpAddr>>,
    /// The BGP sessions.
    pub sessions: Vec<Session>,
    /// Whether the node's health checks pass.
    pub healthy: bool,
}

/// The registered gauge families.
#[derive(Debug)]
pub struct AnnouncerGauges {
    announced: Family<AddressLabels, Gauge>,
    addresses: Family<ProtocolLabels, Gauge>,
    sessions: Family<PeerLabels, Gauge>,
    healthy: Gauge,
    /// The series set last time, so an address or peer state gone loses its series.
    shown: Mutex<(HashSet<AddressLabels>, HashSet<PeerLabels>)>,
}

impl AnnouncerGauges {
    /// Register the families in `metrics`.
    pub fn register(metrics: &Metrics) -> Self {
        let gauges = Self {
            announced: Family::default(),
            addresses: Family::default(),
            sessions: Family::default(),
            healthy: Gauge::default(),
            shown: Mutex::default(),
        };
        metrics.register(
            ANNOUNCED,
            "Addresses this node announces (1 per address and protocol)",
            gauges.announced.clone(),
        );
        metrics.register(ADDRESSES, "How many addresses this node announces, per protocol", gauges.addresses.clone());
        metrics.register(SESSION_UP, "BGP sessions of this node: 1 when Established, else 0", gauges.sessions.clone());
        metrics.register(HEALTHY, "1 while this node's announcer health checks pass", gauges.healthy.clone());
        gauges
    }

    /// Show `snapshot`: series it no longer has are removed.
    pub fn show(&self, snapshot: &Snapshot) {
        let mut addresses = HashSet::new();
        for (protocol, set) in [("l2", &snapshot.l2), ("bgp", &snapshot.bgp)] {
            let Some(set) = set else { continue };
            self.addresses.get_or_create(&ProtocolLabels { protocol: protocol.into() }).set(len(set));
            for address in set.iter().take(MAX_ADDRESS_SERIES) {
                addresses.insert(AddressLabels { protocol: protocol.into(), address: address.to_string() });
            }
        }
        let peers: HashSet<PeerLabels> =
            snapshot.sessions.iter().map(|s| PeerLabels { peer: s.peer.to_string(), state: s.state.clone() }).collect();
        let mut shown = self.shown.lock().unwrap_or_else(|e| e.into_inner());
        for gone in shown.0.difference(&addresses) {
            self.announced.remove(gone);
        }
        for gone in shown.1.difference(&peers) {
            self.sessions.remove(gone);
        }
        for labels in &addresses {
            self.announced.get_or_create(labels).set(1);
        }
        for session in &snapshot.sessions {
            let labels = PeerLabels { peer: session.peer.to_string(), state: session.state.clone() };
            self.sessions.get_or_create(&labels).set(i64::from(session.established()));
        }
        self.healthy.set(i64::from(snapshot.healthy));
        *shown = (addresses, peers);
    }
}

fn len(set: &BTreeSet<IpAddr>) -> i64 {
    i64::try_from(set.len()).unwrap_or(i64::MAX)
}

/// The announcer's channels the gauges follow.
#[derive(Debug, Clone)]
pub struct Inputs {
    /// The addresses this node owns (answered by its responders when `l2`).
    pub owned: watch::Receiver<BTreeSet<IpAddr>>,
    /// Whether the owned addresses are answered by ARP/NDP here (L2 configured).
    pub l2: bool,
    /// What BIRD advertises (BGP configured).
    pub bgp: Option<watch::Receiver<Advertisement>>,
    /// The BGP sessions BIRD reports.
    pub sessions: watch::Receiver<Vec<Session>>,
    /// The node's health.
    pub health: watch::Receiver<Health>,
}

impl Inputs {
    fn snapshot(&self) -> Snapshot {
        Snapshot {
            l2: self.l2.then(|| self.owned.borrow().clone()),
            bgp: self.bgp.as_ref().map(|b| b.borrow().addresses.clone()),
            sessions: self.sessions.borrow().clone(),
            healthy: matches!(*self.health.borrow(), Health::Healthy),
        }
    }
}

/// Keep `gauges` in step with `inputs` until `cancel` fires. A channel whose sender is gone
/// (no BGP, say) just stops changing; the task ends when all are gone.
pub async fn run(gauges: AnnouncerGauges, mut inputs: Inputs, cancel: CancellationToken) {
    let mut open = [true, inputs.bgp.is_some(), true, true];
    loop {
        gauges.show(&inputs.snapshot());
        if !open.iter().any(|o| *o) {
            return;
        }
        let bgp_changed = async {
            match inputs.bgp.as_mut() {
                Some(bgp) => bgp.changed().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = cancel.cancelled() => return,
            r = inputs.owned.changed(), if open[0] => open[0] = r.is_ok(),
            r = bgp_changed, if open[1] => open[1] = r.is_ok(),
            r = inputs.sessions.changed(), if open[2] => open[2] = r.is_ok(),
            r = inputs.health.changed(), if open[3] => open[3] = r.is_ok(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn session(peer: &str, state: &str) -> Session {
        Session { peer: ip(peer), state: state.into(), since: String::new(), detail: String::new() }
    }

    #[test]
    fn the_gauges_show_what_is_announced_and_drop_series_that_are_gone() {
        let metrics = Metrics::new();
        let gauges = AnnouncerGauges::register(&metrics);
        gauges.show(&Snapshot {
            l2: Some(BTreeSet::from([ip("192.0.2.10"), ip("fd00::10")])),
            bgp: Some(BTreeSet::from([ip("192.0.2.10")])),
            sessions: vec![session("10.0.0.1", "Established"), session("10.0.0.2", "Active")],
            healthy: true,
        });
        let text = metrics.encode();
        for line in [
            r#"ccm_announcer_announced{protocol="l2",address="192.0.2.10"} 1"#,
            r#"ccm_announcer_announced{protocol="l2",address="fd00::10"} 1"#,
            r#"ccm_announcer_announced{protocol="bgp",address="192.0.2.10"} 1"#,
            r#"ccm_announcer_addresses{protocol="l2"} 2"#,
            r#"ccm_announcer_addresses{protocol="bgp"} 1"#,
            r#"ccm_announcer_bgp_session_up{peer="10.0.0.1",state="Established"} 1"#,
            r#"ccm_announcer_bgp_session_up{peer="10.0.0.2",state="Active"} 0"#,
            "ccm_announcer_healthy 1",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
        // Unhealthy: every address given up; a session's state changes.
        gauges.show(&Snapshot {
            l2: Some(BTreeSet::new()),
            bgp: Some(BTreeSet::new()),
            sessions: vec![session("10.0.0.1", "Active"), session("10.0.0.2", "Active")],
            healthy: false,
        });
        let text = metrics.encode();
        assert!(!text.contains("ccm_announcer_announced{"), "{text}");
        assert!(!text.contains(r#"state="Established""#), "{text}");
        for line in [
            r#"ccm_announcer_addresses{protocol="l2"} 0"#,
            r#"ccm_announcer_bgp_session_up{peer="10.0.0.1",state="Active"} 0"#,
            "ccm_announcer_healthy 0",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
    }

    #[test]
    fn per_address_series_are_bounded_while_the_count_stays_exact() {
        let metrics = Metrics::new();
        let gauges = AnnouncerGauges::register(&metrics);
        let many: BTreeSet<IpAddr> = (0..(MAX_ADDRESS_SERIES as u32 + 10))
            .map(|i| IpAddr::V4(std::net::Ipv4Addr::from(0x0a00_0000 + i)))
            .collect();
        gauges.show(&Snapshot { l2: Some(many), healthy: true, ..Snapshot::default() });
        let text = metrics.encode();
        assert_eq!(text.matches("ccm_announcer_announced{").count(), MAX_ADDRESS_SERIES);
        assert!(text.contains(&format!(r#"ccm_announcer_addresses{{protocol="l2"}} {}"#, MAX_ADDRESS_SERIES + 10)));
        // No BGP configured: no BGP count at all.
        assert!(!text.contains(r#"protocol="bgp""#), "{text}");
    }

    #[tokio::test]
    async fn the_gauges_follow_the_announcers_channels() {
        let metrics = Metrics::new();
        let gauges = AnnouncerGauges::register(&metrics);
        let (owned_tx, owned) = watch::channel(BTreeSet::new());
        // No BGP: the sessions' sender is gone from the start, as in an L2-only announcer.
        let (_, sessions) = watch::channel(Vec::new());
        let (health_tx, health) = watch::channel(Health::Healthy);
        let cancel = CancellationToken::new();
        let task = tokio::spawn(run(gauges, Inputs { owned, l2: true, bgp: None, sessions, health }, cancel.clone()));
        owned_tx.send_replace(BTreeSet::from([ip("192.0.2.7")]));
        let wanted = r#"ccm_announcer_announced{protocol="l2",address="192.0.2.7"} 1"#;
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        while !metrics.encode().contains(wanted) {
            assert!(tokio::time::Instant::now() < deadline, "{}", metrics.encode());
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        health_tx.send_replace(Health::Unhealthy(Vec::new()));
        while !metrics.encode().contains("ccm_announcer_healthy 0") {
            assert!(tokio::time::Instant::now() < deadline, "{}", metrics.encode());
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        cancel.cancel();
        task.await.unwrap();
    }
}
