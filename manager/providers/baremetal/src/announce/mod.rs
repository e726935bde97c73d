//! Announcement: making assigned addresses reachable from other machines, by answering ARP and
//! NDP from one elected node per address (L2) or by advertising host routes through a routing
//! daemon (BGP). Off unless `loadBalancer.announcement` configures it.

pub mod announcer;
pub mod assign;
pub mod bgp;
pub mod bgp_sessions;
pub mod codec;
pub mod elect;
pub mod guard;
pub mod health;
#[cfg(feature = "datapath")]
pub mod health_probe;
#[cfg(feature = "datapath")]
pub mod host;
pub mod l2;
pub mod metrics;
#[cfg(feature = "datapath")]
pub mod node;
pub mod plan;
pub mod policy;
pub mod publish;
pub mod pulse;
pub mod records;
pub mod records_writer;
pub mod reflect;
pub mod remind;
#[cfg(feature = "datapath")]
pub mod responder;
pub mod sources;

/// The manager binary's subcommand that runs the per-node announcer (the runtime, [`node`],
/// needs the `datapath` feature; deployers need the name without it).
pub const SUBCOMMAND: &str = "announce";

/// Reasons of the events announcers publish on Services (explained in docs/troubleshooting.md).
pub mod announce_reasons {
    /// Normal: a node started announcing one of the Service's addresses (the note names the
    /// node, the address and ARP or NDP).
    pub const L2_ANNOUNCING: &str = "L2Announcing";
    /// Warning: an address in the Service's status is not announced, and never answered (the
    /// note names the address and why: outside every pool, a node's address, a gateway, ...).
    pub const ANNOUNCEMENT_REFUSED: &str = "AnnouncementRefused";
    /// Warning: an `externalTrafficPolicy: Local` Service's addresses are not announced because
    /// its ready endpoints run only where no live announcer may answer (none runs there, or the
    /// pool's node selector leaves those nodes out; the note names the nodes).
    pub const NO_ELIGIBLE_ANNOUNCER: &str = "NoEligibleAnnouncer";
    /// Warning, on the Node: its announcer gives every address up (the note says why: an
    /// interface down, a stopped or held-up responder, kube-proxy failing its health check).
    pub const ANNOUNCER_UNHEALTHY: &str = "AnnouncerUnhealthy";
    /// Normal, on the Node: its announcer is healthy again and takes part in elections.
    pub const ANNOUNCER_HEALTHY: &str = "AnnouncerHealthy";
    /// Warning, on the Node: a BGP session of its announcer that was established is not (the
    /// note names the peer, the state and BIRD's last error).
    pub const BGP_SESSION_LOST: &str = "BGPSessionLost";
    /// Normal, on the Node: a lost BGP session is established again.
    pub const BGP_SESSION_ESTABLISHED: &str = "BGPSessionEstablished";
}

use serde::Deserialize;

/// `loadBalancer.announcement` in the cloud-config: how assigned addresses reach the network.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AnnouncementConfig {
    /// L2 announcement (ARP for IPv4, NDP for IPv6); off when absent.
    #[serde(default)]
    pub l2: Option<l2::L2Config>,
    /// BGP announcement (host routes to peers); off when absent.
    #[serde(default)]
    pub bgp: Option<bgp::BgpConfig>,
    /// What an announcer checks before it answers for addresses (interfaces and responders by
    /// default; kube-proxy when configured).
    #[serde(default)]
    pub health: Option<health::HealthConfig>,
}
