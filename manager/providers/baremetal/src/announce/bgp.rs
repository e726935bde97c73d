//! BGP announcement: each address advertised as a host route (/32, /128) to configured peers,
//! by a BIRD 2 daemon the announcer configures and reloads (see [`bird`] for the I/O and
//! docs/datapath.md for why BIRD).
//!
//! This file holds the pure parts: the `loadBalancer.announcement.bgp` settings and their
//! validation, and the renderer from (settings, node facts, addresses) to BIRD's config text.

#[path = "bird.rs"]
pub mod bird;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::{self, Write as _};
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::time::Duration;

use ccm_framework::safe_yaml::{self, DocumentError, FieldPath, Problem};
use ipnet::IpNet;
use serde::{Deserialize, Deserializer};

use super::assign::{Announced, ServiceName};
use super::policy::AddressPolicies;
use crate::advertisement::RouteAttributes;

/// Peers one node may have: enough for a pair of top-of-rack routers per family, with room.
pub const MAX_PEERS: usize = 16;
/// Communities added to every announced route, at most.
pub const MAX_COMMUNITIES: usize = 16;
/// Longest `passwordFile` path, in bytes.
pub const MAX_PATH_BYTES: usize = 1024;
/// Longest password, in bytes (Linux's TCP-MD5 key limit, `TCP_MD5SIG_MAXKEYLEN`).
pub const MAX_PASSWORD_BYTES: usize = 80;
/// The hold time when none is given (MetalLB's default too).
pub const DEFAULT_HOLD_TIME: Duration = Duration::from_secs(90);
/// The BGP port.
pub const BGP_PORT: u16 = 179;
/// The port BIRD listens on when `listenPort` is not given: not 179, which the announcer's
/// BIRD (uid 65532; Kubernetes gives a non-root process no added capability) cannot bind, and
/// BIRD stops a session whose listening socket failed. The Node opens every session itself.
pub const DEFAULT_LISTEN_PORT: u16 = 1790;
/// BFD's receive and transmit intervals when not given (MetalLB's BFD profile defaults).
pub const DEFAULT_BFD_INTERVAL: Duration = Duration::from_millis(300);
/// BFD's detection multiplier when not given (MetalLB's default too).
pub const DEFAULT_BFD_MULTIPLIER: u32 = 3;
/// The shortest BFD interval accepted (MetalLB's lower bound).
pub const MIN_BFD_INTERVAL: Duration = Duration::from_millis(10);
/// The longest BFD interval accepted (MetalLB's upper bound).
pub const MAX_BFD_INTERVAL: Duration = Duration::from_secs(60);
/// The graceful-restart time when not given (BIRD's and FRR's default).
pub const DEFAULT_RESTART_TIME: Duration = Duration::from_secs(120);
/// The longest restart time: RFC 4724 carries it in 12 bits.
pub const MAX_RESTART_SECONDS: u64 = 4095;
/// The BFD protocol rendered when any peer has BFD; BGP asks it for the sessions.
pub const BFD_PROTOCOL: &str = "ccm_bfd";
/// The environment variable the announcer process reads the node's IPv4 address from (the
/// default router ID; the DaemonSet sets it from the downward API's `status.hostIP`).
pub const NODE_IP_ENV: &str = "NODE_IP";

/// The message of a malformed IP address.
pub const BAD_IP: &str = "is not an IP address such as 192.0.2.1 or 2001:db8::1";
/// The message of a malformed router ID.
pub const BAD_ROUTER_ID: &str = "is not a BGP router ID: an IPv4 address other than 0.0.0.0, such as 192.0.2.1";
/// The message of a reserved or zero AS number.
pub const BAD_ASN: &str = "must be an AS number from 1 to 4294967294, other than 23456 (AS_TRANS)";
/// The message of a hold time BGP does not allow.
pub const BAD_HOLD_TIME: &str = "must be 0s (no keepalives) or whole seconds from 3s to 65535s, such as 90s";
/// The message of an empty peer list.
pub const NO_PEERS: &str = "must list at least one peer";
/// The message of a peer list beyond [`MAX_PEERS`].
pub const TOO_MANY_PEERS: &str = "lists more than 16 peers";
/// The message of a peer address nobody can peer with.
pub const BAD_PEER_ADDRESS: &str = "must be a unicast address of the peer (not unspecified, loopback or multicast)";
/// The message of port 0.
pub const BAD_PORT: &str = "must be a TCP port from 1 to 65535";
/// The message of a multihop value out of range.
pub const BAD_MULTIHOP: &str = "must be a hop count from 1 to 255";
/// The message of a bad `passwordFile`.
pub const BAD_PASSWORD_FILE: &str =
    "must be an absolute path of at most 1024 bytes (a mounted Secret key, for example)";
/// The message of a BFD interval out of range.
pub const BAD_BFD_INTERVAL: &str = "must be whole milliseconds from 10ms to 60s, such as 300ms";
/// The message of a BFD multiplier out of range.
pub const BAD_BFD_MULTIPLIER: &str = "must be a packet count from 1 to 255, such as 3";
/// The message of BFD on a multihop peer.
pub const BFD_MULTIHOP: &str = "needs a directly connected peer: BIRD runs multihop BFD only from a fixed local address, which the announcer does not set; drop multihop or bfd";
/// The message of a graceful-restart time out of range.
pub const BAD_RESTART_TIME: &str = "must be whole seconds from 1s to 4095s (RFC 4724), such as 120s";
/// The message of a malformed community.
pub const BAD_COMMUNITY: &str = crate::advertisement::BAD_COMMUNITY;
/// The message of a community list beyond [`MAX_COMMUNITIES`].
pub const TOO_MANY_COMMUNITIES: &str = "lists more than 16 communities";

/// The fixed messages this module's checks raise, for the cloud-config schema.
pub const MESSAGES: &[&str] = &[
    BAD_IP,
    BAD_ROUTER_ID,
    BAD_ASN,
    BAD_HOLD_TIME,
    NO_PEERS,
    TOO_MANY_PEERS,
    BAD_PEER_ADDRESS,
    BAD_PORT,
    BAD_MULTIHOP,
    BAD_PASSWORD_FILE,
    BAD_BFD_INTERVAL,
    BAD_BFD_MULTIPLIER,
    BFD_MULTIHOP,
    BAD_RESTART_TIME,
    BAD_COMMUNITY,
    TOO_MANY_COMMUNITIES,
];

/// `loadBalancer.announcement.bgp`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BgpConfig {
    /// This cluster's AS number (every node speaks as this AS).
    pub local_asn: u32,
    /// The BGP router ID; by default the node's IPv4 address.
    #[serde(default, deserialize_with = "router_id")]
    pub router_id: Option<Ipv4Addr>,
    /// The routers every node peers with.
    #[serde(default)]
    pub peers: Vec<PeerConfig>,
    /// Standard communities (`65000:100`) added to every announced route.
    #[serde(default)]
    pub communities: Vec<String>,
    /// `LOCAL_PREF` of the announced routes (sent to iBGP peers only, as BGP defines).
    #[serde(default)]
    pub local_pref: Option<u32>,
    /// The TCP port BIRD listens on for sessions a peer opens (default
    /// [`DEFAULT_LISTEN_PORT`]); the Node opens sessions to each peer's `port` either way.
    #[serde(default)]
    pub listen_port: Option<u16>,
}

/// One BGP peer.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PeerConfig {
    /// The peer's address; an IPv4 peer gets the IPv4 host routes, an IPv6 peer the IPv6 ones.
    #[serde(deserialize_with = "ip")]
    pub address: IpAddr,
    /// The peer's AS number (equal to `localAsn` for iBGP).
    pub asn: u32,
    /// The peer's TCP port (default 179).
    #[serde(default)]
    pub port: Option<u16>,
    /// A file holding the TCP-MD5 password (for example a mounted Secret key); read by the
    /// announcer, never logged.
    #[serde(default)]
    pub password_file: Option<PathBuf>,
    /// The hold time (default 90s); keepalives every third of it.
    #[serde(default, deserialize_with = "crate::duration::optional")]
    pub hold_time: Option<Duration>,
    /// Allow a peer this many hops away (eBGP defaults to a directly connected peer).
    #[serde(default)]
    pub multihop: Option<u8>,
    /// Bidirectional Forwarding Detection on this session (default: off).
    #[serde(default)]
    pub bfd: Option<BfdConfig>,
    /// Graceful restart (RFC 4724) on this session (default: off, BIRD's "aware" mode).
    #[serde(default)]
    pub graceful_restart: Option<GracefulRestartConfig>,
}

/// `peers[].bfd`: BFD (RFC 5880) beside the session, so a dead link or node takes the routes
/// off the router within `minTx × multiplier` instead of the hold time.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BfdConfig {
    /// Whether BFD runs (default true: giving the section turns it on).
    #[serde(default = "enabled")]
    pub enabled: bool,
    /// The shortest interval this node accepts BFD packets at (default 300ms).
    #[serde(default, deserialize_with = "crate::duration::optional")]
    pub min_rx: Option<Duration>,
    /// The shortest interval this node wants to send BFD packets at (default 300ms).
    #[serde(default, deserialize_with = "crate::duration::optional")]
    pub min_tx: Option<Duration>,
    /// Packets missed in a row before the peer declares the session down (default 3).
    #[serde(default)]
    pub multiplier: Option<u32>,
}

/// `peers[].gracefulRestart`: when this node's BIRD restarts, the router keeps its routes
/// (marked stale) for `restartTime` instead of withdrawing them.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GracefulRestartConfig {
    /// Whether graceful restart is advertised (default true: giving the section turns it on).
    #[serde(default = "enabled")]
    pub enabled: bool,
    /// How long the router keeps the routes of a restarting node (default 120s).
    #[serde(default, deserialize_with = "crate::duration::optional")]
    pub restart_time: Option<Duration>,
}

fn enabled() -> bool {
    true
}

impl BfdConfig {
    /// The receive interval in whole milliseconds (validated).
    fn min_rx_ms(&self) -> u128 {
        self.min_rx.unwrap_or(DEFAULT_BFD_INTERVAL).as_millis()
    }

    /// The transmit interval in whole milliseconds (validated).
    fn min_tx_ms(&self) -> u128 {
        self.min_tx.unwrap_or(DEFAULT_BFD_INTERVAL).as_millis()
    }

    fn multiplier(&self) -> u32 {
        self.multiplier.unwrap_or(DEFAULT_BFD_MULTIPLIER)
    }

    fn validate(&self, at: &FieldPath) -> Result<(), DocumentError> {
        let at = at.field("bfd");
        for (field, interval) in [("minRx", self.min_rx), ("minTx", self.min_tx)] {
            if let Some(interval) = interval
                && !bfd_interval_ok(interval)
            {
                return Err(DocumentError::invalid(at.field(field), BAD_BFD_INTERVAL));
            }
        }
        if !(1..=255).contains(&self.multiplier()) {
            return Err(DocumentError::invalid(at.field("multiplier"), BAD_BFD_MULTIPLIER));
        }
        Ok(())
    }
}

/// Whole milliseconds (BIRD's config and MetalLB's profiles count in them) within bounds.
fn bfd_interval_ok(interval: Duration) -> bool {
    interval.subsec_nanos().is_multiple_of(1_000_000) && (MIN_BFD_INTERVAL..=MAX_BFD_INTERVAL).contains(&interval)
}

impl GracefulRestartConfig {
    /// The restart time in seconds (validated: 1..=4095).
    fn restart_seconds(&self) -> u64 {
        self.restart_time.unwrap_or(DEFAULT_RESTART_TIME).as_secs()
    }

    fn validate(&self, at: &FieldPath) -> Result<(), DocumentError> {
        if let Some(time) = self.restart_time
            && (time.subsec_nanos() != 0 || !(1..=MAX_RESTART_SECONDS).contains(&time.as_secs()))
        {
            return Err(DocumentError::invalid(at.field("gracefulRestart").field("restartTime"), BAD_RESTART_TIME));
        }
        Ok(())
    }
}

fn ip<'de, D: Deserializer<'de>>(deserializer: D) -> Result<IpAddr, D::Error> {
    let text = String::deserialize(deserializer)?;
    text.trim().parse().map_err(|_| safe_yaml::custom(BAD_IP))
}

fn router_id<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Ipv4Addr>, D::Error> {
    let text = String::deserialize(deserializer)?;
    match text.trim().parse::<Ipv4Addr>() {
        Ok(id) if !id.is_unspecified() => Ok(Some(id)),
        _ => Err(safe_yaml::custom(BAD_ROUTER_ID)),
    }
}

impl BgpConfig {
    /// Check everything the types cannot express; the error names the first culprit under
    /// `path` (the place of this section in the document).
    pub fn validate(&self, path: &FieldPath) -> Result<(), DocumentError> {
        let invalid = |field: FieldPath, message| Err(DocumentError::invalid(field, message));
        if !valid_asn(self.local_asn) {
            return invalid(path.field("localAsn"), BAD_ASN);
        }
        let peers = path.field("peers");
        if self.peers.is_empty() {
            return invalid(peers, NO_PEERS);
        }
        if self.peers.len() > MAX_PEERS {
            return invalid(peers, TOO_MANY_PEERS);
        }
        let mut seen: BTreeMap<IpAddr, usize> = BTreeMap::new();
        for (i, peer) in self.peers.iter().enumerate() {
            let at = peers.index(i);
            peer.validate(&at)?;
            if let Some(first) = seen.insert(peer.address, i) {
                let how = "duplicates the peer address of";
                return Err(DocumentError::at(
                    at.field("address"),
                    Problem::Clash { how, other: peers.index(first).field("address") },
                ));
            }
        }
        if self.listen_port == Some(0) {
            return invalid(path.field("listenPort"), BAD_PORT);
        }
        let communities = path.field("communities");
        if self.communities.len() > MAX_COMMUNITIES {
            return invalid(communities, TOO_MANY_COMMUNITIES);
        }
        for (i, community) in self.communities.iter().enumerate() {
            if crate::advertisement::parse_community(community).is_none() {
                return invalid(communities.index(i), BAD_COMMUNITY);
            }
        }
        Ok(())
    }
}

impl PeerConfig {
    fn validate(&self, at: &FieldPath) -> Result<(), DocumentError> {
        let invalid = |field: &'static str, message| Err(DocumentError::invalid(at.field(field), message));
        let address = self.address;
        if address.is_unspecified() || address.is_loopback() || address.is_multicast() {
            return invalid("address", BAD_PEER_ADDRESS);
        }
        if !valid_asn(self.asn) {
            return invalid("asn", BAD_ASN);
        }
        if self.port == Some(0) {
            return invalid("port", BAD_PORT);
        }
        if let Some(hold) = self.hold_time
            && hold_seconds(hold).is_none()
        {
            return invalid("holdTime", BAD_HOLD_TIME);
        }
        if self.multihop == Some(0) {
            return invalid("multihop", BAD_MULTIHOP);
        }
        if let Some(file) = &self.password_file
            && (!file.is_absolute() || file.as_os_str().len() > MAX_PATH_BYTES || file.to_str().is_none())
        {
            return invalid("passwordFile", BAD_PASSWORD_FILE);
        }
        if let Some(bfd) = &self.bfd {
            bfd.validate(at)?;
            if bfd.enabled && self.multihop.is_some() {
                return invalid("bfd", BFD_MULTIHOP);
            }
        }
        if let Some(restart) = &self.graceful_restart {
            restart.validate(at)?;
        }
        Ok(())
    }

    /// The BFD settings, when BFD is on.
    fn bfd_on(&self) -> Option<&BfdConfig> {
        self.bfd.as_ref().filter(|bfd| bfd.enabled)
    }

    /// The graceful-restart settings, when graceful restart is on.
    fn graceful_restart_on(&self) -> Option<&GracefulRestartConfig> {
        self.graceful_restart.as_ref().filter(|restart| restart.enabled)
    }

    /// The hold time in seconds (validated: 0 or 3..=65535).
    fn hold_seconds(&self) -> u64 {
        self.hold_time.and_then(hold_seconds).unwrap_or(DEFAULT_HOLD_TIME.as_secs())
    }
}

/// 0 and 4294967295 are reserved (RFC 7607, RFC 7300); 23456 stands in for 4-byte ASNs.
fn valid_asn(asn: u32) -> bool {
    asn != 0 && asn != u32::MAX && asn != 23456
}

/// A hold time BGP allows (RFC 4271: 0, or at least 3 seconds), in whole seconds.
fn hold_seconds(hold: Duration) -> Option<u64> {
    let secs = hold.as_secs();
    let whole = hold.subsec_nanos() == 0;
    (whole && (secs == 0 || (3..=65535).contains(&secs))).then_some(secs)
}

/// What the renderer needs to know about the node it runs on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeFacts {
    /// The node's IPv4 address (its `InternalIP`), the default router ID.
    pub ipv4: Option<Ipv4Addr>,
}

/// A peer's TCP-MD5 password, read from its `passwordFile`. It prints as `<redacted>`.
#[derive(Clone, PartialEq, Eq)]
pub struct Password(String);

impl fmt::Debug for Password {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Password(<redacted>)")
    }
}

/// Why a password file's content cannot be used (the content itself is never kept).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PasswordProblem {
    /// Nothing but whitespace.
    #[error("is empty")]
    Empty,
    /// Longer than [`MAX_PASSWORD_BYTES`].
    #[error("is longer than 80 bytes (the TCP-MD5 key limit)")]
    TooLong,
    /// Holds a character BIRD's config strings cannot carry.
    #[error("holds a character other than printable ASCII without '\"' and '\\'")]
    BadCharacter,
}

impl Password {
    /// The password in a file's content: one line (a trailing newline is dropped), printable
    /// ASCII without `"` or `\` (BIRD's strings have no escapes), at most 80 bytes.
    pub fn from_file_content(content: &[u8]) -> Result<Self, PasswordProblem> {
        let content = content.strip_suffix(b"\n").unwrap_or(content);
        let content = content.strip_suffix(b"\r").unwrap_or(content);
        if content.len() > MAX_PASSWORD_BYTES {
            return Err(PasswordProblem::TooLong);
        }
        if content.iter().all(u8::is_ascii_whitespace) {
            return Err(PasswordProblem::Empty);
        }
        if !content.iter().all(|&b| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\') {
            return Err(PasswordProblem::BadCharacter);
        }
        // Checked above: ASCII only.
        Ok(Self(content.iter().map(|&b| char::from(b)).collect()))
    }
}

/// Why no BIRD config could be rendered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenderError {
    /// `routerId` is unset and the node has no IPv4 address to default to.
    #[error("loadBalancer.announcement.bgp.routerId: must be set, as this node has no IPv4 address to default to")]
    NoRouterId,
}

/// What a node advertises: a host route for each of `addresses` that lies in one of `prefixes`
/// (the load-balancer pools), and an export filter that lets only host routes of those
/// prefixes leave the node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Advertisement {
    /// The addresses (checked by the announcer's [`super::guard`] already).
    pub addresses: BTreeSet<IpAddr>,
    /// The pools as CIDRs.
    pub prefixes: Vec<IpNet>,
    /// Attributes of the routes whose pool sets some ([`super::policy`]).
    pub routes: BTreeMap<IpAddr, RouteAttributes>,
}

/// The BIRD config text announcing `advertisement` to the configured peers. Deterministic: the
/// same inputs give the same text, so an unchanged set never causes a reload. `passwords` maps
/// a peer's index in `config.peers` to its password (peers with a `passwordFile` only).
///
/// Addresses go into a `protocol static` as blackhole host routes: the route only has to exist
/// in BIRD's table to be exported, and there is no `protocol kernel`, so nothing is written to
/// the node's routing table; peers get the node itself as next hop (`next hop self`), where
/// kube-proxy or the proxy data path takes the traffic. Each peer exports only its family's
/// host routes from that static protocol, and only those inside a pool prefix (a second check
/// after the announcer's, in BIRD itself); it imports nothing. An address outside every prefix
/// is not rendered at all. A route whose pool sets attributes carries them from the static
/// protocol (its communities beside the global ones, its `LOCAL_PREF` in place of the global).
pub fn render(
    config: &BgpConfig,
    node: &NodeFacts,
    passwords: &BTreeMap<usize, Password>,
    advertisement: &Advertisement,
) -> Result<String, RenderError> {
    let prefixes = &advertisement.prefixes;
    let in_pools = |a: &IpAddr| prefixes.iter().any(|p| p.contains(a));
    let router_id = config.router_id.or(node.ipv4).ok_or(RenderError::NoRouterId)?;
    let mut out = String::new();
    // Writing to a String cannot fail; the results are ignored on purpose.
    let _ = writeln!(out, "# Rendered by ccm-provider-baremetal's BGP announcer; rewritten on every change.");
    let _ = writeln!(out, "router id {router_id};\n");
    // Interfaces, so BIRD knows which peers are directly connected.
    let _ = writeln!(out, "protocol device {{\n}}\n");
    // Only when a peer wants BFD, so a config without it stays as it was. The sessions and
    // their timers come from each BGP protocol's request (per-peer `bfd { ... }`).
    if config.peers.iter().any(|peer| peer.bfd_on().is_some()) {
        let _ = writeln!(out, "protocol bfd {BFD_PROTOCOL} {{\n}}\n");
    }
    for (name, family, v4) in [(STATIC_V4, "ipv4", true), (STATIC_V6, "ipv6", false)] {
        let _ = writeln!(out, "protocol static {name} {{\n  {family};");
        let addresses = advertisement.addresses.iter().filter(|a| a.is_ipv4() == v4 && announceable(**a));
        for address in addresses.filter(|a| in_pools(a)) {
            let len = if v4 { 32 } else { 128 };
            match advertisement.routes.get(address).filter(|r| !r.is_empty()) {
                None => {
                    let _ = writeln!(out, "  route {address}/{len} blackhole;");
                }
                Some(route) => {
                    let _ = writeln!(out, "  route {address}/{len} blackhole {{ {}}};", route_commands(route));
                }
            }
        }
        let _ = writeln!(out, "}}\n");
    }
    let communities: Vec<(u16, u16)> =
        config.communities.iter().filter_map(|c| crate::advertisement::parse_community(c)).collect();
    for (filter, source, v4) in [(FILTER_V4, STATIC_V4, true), (FILTER_V6, STATIC_V6, false)] {
        let (len, family): (u8, Vec<&IpNet>) = if v4 {
            (32, prefixes.iter().filter(|p| matches!(p, IpNet::V4(_))).collect())
        } else {
            (128, prefixes.iter().filter(|p| matches!(p, IpNet::V6(_))).collect())
        };
        let _ = writeln!(out, "filter {filter} {{");
        if !family.is_empty() {
            let set: Vec<String> = family.iter().map(|p| format!("{p}{{{len},{len}}}")).collect();
            let _ = writeln!(out, "  if proto = \"{source}\" && net ~ [ {} ] then {{", set.join(", "));
            for (high, low) in &communities {
                let _ = writeln!(out, "    bgp_community.add(({high}, {low}));");
            }
            if let Some(pref) = config.local_pref {
                // A pool's own LOCAL_PREF, set on its routes, wins over the global one.
                if advertisement.routes.values().any(|r| r.local_pref.is_some()) {
                    let _ = writeln!(out, "    if !defined(bgp_local_pref) then bgp_local_pref = {pref};");
                } else {
                    let _ = writeln!(out, "    bgp_local_pref = {pref};");
                }
            }
            let _ = writeln!(out, "    accept;\n  }}");
        }
        let _ = writeln!(out, "  reject;\n}}\n");
    }
    let mut peers: Vec<(usize, &PeerConfig)> = config.peers.iter().enumerate().collect();
    peers.sort_by_key(|(_, peer)| peer.address);
    for (index, peer) in peers {
        let _ = writeln!(out, "protocol bgp {} {{", protocol_name(peer.address));
        let listen = config.listen_port.unwrap_or(DEFAULT_LISTEN_PORT);
        let _ = writeln!(out, "  local port {listen} as {};", config.local_asn);
        let port = peer.port.unwrap_or(BGP_PORT);
        let _ = writeln!(out, "  neighbor {} port {port} as {};", peer.address, peer.asn);
        let _ = writeln!(out, "  hold time {};", peer.hold_seconds());
        if let Some(hops) = peer.multihop {
            let _ = writeln!(out, "  multihop {hops};");
        } else if peer.asn == config.local_asn && peer.bfd_on().is_some() {
            // BIRD takes an iBGP peer as multihop, and multihop BFD needs a fixed local address:
            // with BFD an iBGP peer is taken as directly connected (single-hop BFD).
            let _ = writeln!(out, "  direct;");
        }
        if let Some(Password(password)) = passwords.get(&index) {
            let _ = writeln!(out, "  password \"{password}\";");
        }
        let restart = peer.graceful_restart_on();
        if let Some(bfd) = peer.bfd_on() {
            let _ = writeln!(out, "  bfd {{");
            let _ = writeln!(out, "    min rx interval {} ms;", bfd.min_rx_ms());
            let _ = writeln!(out, "    min tx interval {} ms;", bfd.min_tx_ms());
            let _ = writeln!(out, "    multiplier {};", bfd.multiplier());
            if restart.is_some() {
                // BFD down restarts the session gracefully (no NOTIFICATION), so this side
                // never forces a hard withdrawal the router's graceful restart would spare.
                let _ = writeln!(out, "    graceful;");
            }
            let _ = writeln!(out, "  }};");
        }
        if let Some(restart) = restart {
            let _ = writeln!(out, "  graceful restart on;");
            let _ = writeln!(out, "  graceful restart time {};", restart.restart_seconds());
        }
        let (family, filter) = if peer.address.is_ipv4() { ("ipv4", FILTER_V4) } else { ("ipv6", FILTER_V6) };
        let _ =
            writeln!(out, "  {family} {{\n    import none;\n    export filter {filter};\n    next hop self;\n  }};");
        let _ = writeln!(out, "}}\n");
    }
    Ok(out)
}

/// BIRD filter commands setting `route`'s attributes, each followed by a space.
fn route_commands(route: &RouteAttributes) -> String {
    let mut out = String::new();
    for (high, low) in &route.communities {
        let _ = write!(out, "bgp_community.add(({high}, {low})); ");
    }
    for (a, b, c) in &route.large_communities {
        let _ = write!(out, "bgp_large_community.add(({a}, {b}, {c})); ");
    }
    if let Some(pref) = route.local_pref {
        let _ = write!(out, "bgp_local_pref = {pref}; ");
    }
    out
}

/// The static protocol holding the IPv4 host routes.
pub const STATIC_V4: &str = "ccm_v4";
/// The static protocol holding the IPv6 host routes.
pub const STATIC_V6: &str = "ccm_v6";
const FILTER_V4: &str = "ccm_export_v4";
const FILTER_V6: &str = "ccm_export_v6";

/// The BIRD protocol name of a peer: from its address, so reordering peers in the config
/// changes nothing (a renamed protocol would restart its session).
pub fn protocol_name(address: IpAddr) -> String {
    let text: String = address.to_string().chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
    format!("peer_{text}")
}

/// The addresses this node advertises: every announced address of an
/// `externalTrafficPolicy: Cluster` Service (every node advertises it; the router spreads the
/// traffic by ECMP and kube-proxy forwards it), and of a `Local` Service only while this node
/// has a ready endpoint for it, so no traffic arrives where it would be dropped. An address two
/// Services share is advertised when either wants it. An address whose pool's node selector
/// leaves this node out is not advertised from it (`policies`).
pub fn advertised(
    me: &str,
    announced: &BTreeMap<ServiceName, Announced>,
    ready: &BTreeMap<ServiceName, BTreeSet<String>>,
    policies: &AddressPolicies,
) -> BTreeSet<IpAddr> {
    announced
        .iter()
        .filter(|(name, service)| !service.local || ready.get(*name).is_some_and(|nodes| nodes.contains(me)))
        .flat_map(|(_, service)| service.addresses.iter().copied())
        .filter(|address| announceable(*address) && policies.allows(*address, me))
        .collect()
}

/// Whether an address is worth a route: loopback, unspecified and multicast addresses (a pool
/// with `allowLoopback` may hand out the first) mean nothing to a router.
pub fn announceable(address: IpAddr) -> bool {
    !(address.is_loopback() || address.is_unspecified() || address.is_multicast())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The section under a `bgp` key, so paths read as in the cloud-config.
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Doc {
        bgp: BgpConfig,
    }

    fn parse(yaml: &str) -> Result<BgpConfig, DocumentError> {
        let schema = safe_yaml::Schema::new().with::<Doc>().with::<BgpConfig>().with::<PeerConfig>();
        let schema = schema.with::<BfdConfig>().with::<GracefulRestartConfig>();
        let schema = schema.with_messages(&[crate::duration::BAD_DURATION]);
        let schema = schema.with_messages(MESSAGES);
        let indented: String = yaml.lines().map(|line| format!("  {line}\n")).collect();
        let doc: Doc =
            safe_yaml::from_slice(format!("bgp:\n{indented}").as_bytes(), &safe_yaml::CLOUD_CONFIG_LIMITS, &schema)?;
        doc.bgp.validate(&FieldPath::root().field("bgp"))?;
        Ok(doc.bgp)
    }

    fn message(yaml: &str) -> String {
        parse(yaml).expect_err("must be refused").to_string()
    }

    const GOOD: &str = "localAsn: 64512\npeers:\n- address: 192.0.2.1\n  asn: 64513\n";

    #[test]
    fn a_minimal_config_defaults_port_hold_time_and_router_id() {
        let config = parse(GOOD).expect("valid");
        assert_eq!(config.local_asn, 64512);
        assert_eq!(config.router_id, None);
        let peer = &config.peers[0];
        assert_eq!(peer.port, None);
        assert_eq!(peer.hold_seconds(), 90);
        let node = NodeFacts { ipv4: Some("10.0.0.5".parse().expect("ip")) };
        let text = render(&config, &node, &BTreeMap::new(), &Advertisement::default()).expect("render");
        assert!(text.contains("router id 10.0.0.5;"), "{text}");
        assert!(text.contains("neighbor 192.0.2.1 port 179 as 64513;"), "{text}");
        assert!(text.contains("hold time 90;"), "{text}");
        // A non-root BIRD cannot listen on 179 and would stop the session ("No listening socket").
        assert!(text.contains("local port 1790 as 64512;"), "{text}");
    }

    #[test]
    fn every_field_is_read() {
        let yaml = "localAsn: 64512\nrouterId: 10.1.1.1\ncommunities: ['65000:100']\nlocalPref: 200\nlistenPort: 179\npeers:\n- address: 2001:db8::1\n  asn: 64512\n  port: 1179\n  passwordFile: /etc/bgp/peer\n  holdTime: 9s\n  multihop: 3\n";
        let config = parse(yaml).expect("valid");
        assert_eq!(config.router_id, Some(Ipv4Addr::new(10, 1, 1, 1)));
        assert_eq!(config.local_pref, Some(200));
        assert_eq!(config.listen_port, Some(179));
        let peer = &config.peers[0];
        assert_eq!(peer.address, "2001:db8::1".parse::<IpAddr>().expect("ip"));
        assert_eq!((peer.port, peer.multihop, peer.hold_seconds()), (Some(1179), Some(3), 9));
        assert_eq!(peer.password_file.as_deref(), Some(std::path::Path::new("/etc/bgp/peer")));
    }

    #[test]
    fn each_invalid_field_is_named_with_the_expected_form() {
        let peer = |extra: &str| format!("localAsn: 64512\npeers:\n- address: 192.0.2.1\n  asn: 64513\n{extra}");
        let cases = [
            ("localAsn: 0\npeers: [{address: 192.0.2.1, asn: 1}]".to_string(), "bgp.localAsn", BAD_ASN),
            ("localAsn: 23456\npeers: [{address: 192.0.2.1, asn: 1}]".to_string(), "bgp.localAsn", BAD_ASN),
            ("localAsn: 1\n".to_string(), "bgp.peers", NO_PEERS),
            ("localAsn: 1\nrouterId: 0.0.0.0\npeers: [{address: 192.0.2.1, asn: 1}]".into(), "routerId", BAD_ROUTER_ID),
            (
                "localAsn: 1\nrouterId: 2001:db8::1\npeers: [{address: 192.0.2.1, asn: 1}]".into(),
                "routerId",
                BAD_ROUTER_ID,
            ),
            ("localAsn: 1\npeers: [{address: 192.0.2, asn: 1}]".into(), "bgp.peers[0].address", BAD_IP),
            ("localAsn: 1\npeers: [{address: 127.0.0.1, asn: 1}]".into(), "bgp.peers[0].address", BAD_PEER_ADDRESS),
            ("localAsn: 1\npeers: [{address: 192.0.2.1, asn: 4294967295}]".into(), "bgp.peers[0].asn", BAD_ASN),
            (peer("  port: 0\n"), "bgp.peers[0].port", BAD_PORT),
            (peer("  holdTime: 2s\n"), "bgp.peers[0].holdTime", BAD_HOLD_TIME),
            (peer("  holdTime: 1500ms\n"), "bgp.peers[0].holdTime", BAD_HOLD_TIME),
            (peer("  holdTime: 70000s\n"), "bgp.peers[0].holdTime", BAD_HOLD_TIME),
            (peer("  multihop: 0\n"), "bgp.peers[0].multihop", BAD_MULTIHOP),
            (peer("  passwordFile: secret.txt\n"), "bgp.peers[0].passwordFile", BAD_PASSWORD_FILE),
            (format!("{GOOD}communities: ['65000:70000']"), "bgp.communities[0]", BAD_COMMUNITY),
            (format!("{GOOD}communities: ['65000']"), "bgp.communities[0]", BAD_COMMUNITY),
            (format!("{GOOD}listenPort: 0"), "bgp.listenPort", BAD_PORT),
        ];
        for (yaml, path, expected) in cases {
            let text = message(&yaml);
            assert!(text.contains(path) && text.contains(expected), "{yaml:?} gave {text:?}");
        }
        let text = message(&format!("{GOOD}- address: 192.0.2.1\n  asn: 64514\n"));
        assert!(text.contains("bgp.peers[1].address: duplicates the peer address of bgp.peers[0].address"), "{text}");
        let text = message(&peer("  password: hunter2\n"));
        assert!(text.contains("unknown field") && !text.contains("hunter2"), "{text}");
    }

    #[test]
    fn the_cloud_config_names_the_full_path_of_a_bgp_mistake() {
        let doc = "loadBalancer:\n  announcement:\n    bgp:\n      localAsn: 64512\n      peers:\n      - {address: 192.0.2.1, asn: 0}\n";
        let error = crate::config::parse(doc.as_bytes()).expect_err("asn 0");
        assert_eq!(error.to_string(), format!("loadBalancer.announcement.bgp.peers[0].asn: {BAD_ASN}"));
        let doc = "loadBalancer:\n  announcement:\n    bgp:\n      localAsn: 64512\n      peers:\n      - {address: 192.0.2.300, asn: 1}\n";
        let error = crate::config::parse(doc.as_bytes()).expect_err("bad address").to_string();
        assert!(
            error.starts_with("loadBalancer.announcement.bgp.peers[0].address: ") && error.contains(BAD_IP),
            "{error}"
        );
        let doc = "loadBalancer:\n  announcement:\n    bgp:\n      localAsn: 64512\n      peers:\n      - {address: 192.0.2.1, asn: 1}\n";
        let config = crate::config::parse(doc.as_bytes()).expect("valid");
        assert_eq!(config.load_balancer.announcement.bgp.map(|b| b.peers.len()), Some(1));
    }

    #[test]
    fn the_cloud_config_names_the_full_path_of_a_bfd_or_graceful_restart_mistake() {
        let doc = |peer: &str| {
            format!(
                "loadBalancer:\n  announcement:\n    bgp:\n      localAsn: 64512\n      peers:\n      - {{address: 192.0.2.1, asn: 1, {peer}}}\n"
            )
        };
        let error = crate::config::parse(doc("bfd: {multiplier: 0}").as_bytes()).expect_err("multiplier 0");
        assert_eq!(
            error.to_string(),
            format!("loadBalancer.announcement.bgp.peers[0].bfd.multiplier: {BAD_BFD_MULTIPLIER}")
        );
        let error =
            crate::config::parse(doc("gracefulRestart: {restartTime: 5000s}").as_bytes()).expect_err("too long");
        let expected =
            format!("loadBalancer.announcement.bgp.peers[0].gracefulRestart.restartTime: {BAD_RESTART_TIME}");
        assert_eq!(error.to_string(), expected);
        let config = crate::config::parse(doc("bfd: {minRx: 100ms}, gracefulRestart: {}").as_bytes()).expect("valid");
        let peer = config.load_balancer.announcement.bgp.map(|b| b.peers[0].clone()).expect("bgp");
        assert_eq!(peer.bfd.and_then(|b| b.min_rx), Some(Duration::from_millis(100)));
        assert_eq!(peer.graceful_restart.map(|g| g.enabled), Some(true));
    }

    #[test]
    fn lists_are_bounded() {
        let peers: String = (1..=17).map(|i| format!("- address: 192.0.2.{i}\n  asn: 64513\n")).collect();
        assert!(message(&format!("localAsn: 64512\npeers:\n{peers}")).contains(TOO_MANY_PEERS));
        let communities: Vec<String> = (0..17).map(|i| format!("'65000:{i}'")).collect();
        let yaml = format!("{GOOD}communities: [{}]", communities.join(", "));
        assert!(message(&yaml).contains(TOO_MANY_COMMUNITIES));
    }

    #[test]
    fn a_password_must_fit_birds_strings_and_its_problems_never_quote_it() {
        assert_eq!(Password::from_file_content(b"s3cret pass\n"), Ok(Password("s3cret pass".into())));
        assert_eq!(Password::from_file_content(b"\n"), Err(PasswordProblem::Empty));
        assert_eq!(Password::from_file_content(&[b'a'; 81]), Err(PasswordProblem::TooLong));
        for bad in [&b"a\"b"[..], b"a\\b", b"two\nlines", "é".as_bytes(), b"tab\there"] {
            assert_eq!(Password::from_file_content(bad), Err(PasswordProblem::BadCharacter), "{bad:?}");
        }
        let password = Password::from_file_content(b"hunter2").expect("valid");
        assert!(!format!("{password:?}").contains("hunter2"));
    }

    fn addresses(list: &[&str]) -> BTreeSet<IpAddr> {
        list.iter().map(|a| a.parse().expect("ip")).collect()
    }

    fn two_peers() -> BgpConfig {
        parse(
            "localAsn: 64512\ncommunities: ['65000:100']\nlocalPref: 150\npeers:\n\
             - address: fd00::2\n  asn: 64513\n  passwordFile: /p\n\
             - address: 10.0.0.2\n  asn: 64513\n  multihop: 2\n  holdTime: 0s\n",
        )
        .expect("valid")
    }

    fn block<'a>(text: &'a str, header: &str) -> &'a str {
        let start = text.find(header).unwrap_or_else(|| panic!("no {header} in {text}"));
        let rest = &text[start..];
        &rest[..rest.find("\n}\n").map_or(rest.len(), |end| end + 2)]
    }

    /// `set` with pool prefixes holding the test addresses.
    fn adv(set: BTreeSet<IpAddr>) -> Advertisement {
        let prefixes = ["203.0.113.0/24", "2001:db8::/64", "127.0.0.0/8"].map(|p| p.parse().expect("prefix")).to_vec();
        Advertisement { addresses: set, prefixes, ..Default::default() }
    }

    #[test]
    fn rendering_puts_host_routes_per_family_and_exports_only_them_to_the_peer_of_that_family() {
        let node = NodeFacts { ipv4: Some(Ipv4Addr::new(10, 0, 0, 1)) };
        let passwords = BTreeMap::from([(0, Password("pw".into()))]);
        let set = addresses(&["203.0.113.20", "2001:db8::7", "203.0.113.3", "127.0.0.1"]);
        let text = render(&two_peers(), &node, &passwords, &adv(set)).expect("render");

        let v4 = block(&text, "protocol static ccm_v4 {");
        assert!(
            v4.contains("  ipv4;\n  route 203.0.113.3/32 blackhole;\n  route 203.0.113.20/32 blackhole;\n}"),
            "{v4}"
        );
        assert!(!text.contains("127.0.0.1"), "loopback is never announced: {text}");
        let v6 = block(&text, "protocol static ccm_v6 {");
        assert!(v6.contains("  ipv6;\n  route 2001:db8::7/128 blackhole;\n}"), "{v6}");

        let filter = block(&text, "filter ccm_export_v4 {");
        assert!(
            filter.contains("if proto = \"ccm_v4\" && net ~ [ 203.0.113.0/24{32,32}, 127.0.0.0/8{32,32} ] then {"),
            "{filter}"
        );
        assert!(filter.contains("bgp_community.add((65000, 100));") && filter.contains("bgp_local_pref = 150;"));
        assert!(filter.trim_end().ends_with("reject;\n}"), "everything else is rejected: {filter}");

        let peer4 = block(&text, "protocol bgp peer_10_0_0_2 {");
        for line in ["local port 1790 as 64512;", "neighbor 10.0.0.2 port 179 as 64513;", "hold time 0;", "multihop 2;"]
        {
            assert!(peer4.contains(line), "{line} in {peer4}");
        }
        assert!(peer4.contains("ipv4 {\n    import none;\n    export filter ccm_export_v4;\n    next hop self;\n  };"));
        assert!(!peer4.contains("password") && !peer4.contains("ipv6"), "{peer4}");
        let peer6 = block(&text, "protocol bgp peer_fd00__2 {");
        assert!(peer6.contains("password \"pw\";") && peer6.contains("export filter ccm_export_v6;"), "{peer6}");
        assert!(!text.contains("protocol kernel"), "nothing is written to the node's routing table");
    }

    #[test]
    fn rendering_is_deterministic_whatever_the_peer_order_and_changes_only_with_the_set() {
        let node = NodeFacts { ipv4: Some(Ipv4Addr::new(10, 0, 0, 1)) };
        let config = two_peers();
        let mut reversed = config.clone();
        reversed.peers.reverse();
        // The passwords follow the peers' indices.
        let set = adv(addresses(&["203.0.113.3", "203.0.113.20"]));
        let a = render(&config, &node, &BTreeMap::from([(0, Password("pw".into()))]), &set).expect("render");
        let b = render(&reversed, &node, &BTreeMap::from([(1, Password("pw".into()))]), &set).expect("render");
        assert_eq!(a, b);
        let fewer =
            render(&config, &node, &BTreeMap::from([(0, Password("pw".into()))]), &adv(addresses(&["203.0.113.3"])));
        assert_ne!(a, fewer.expect("render"));
        // An empty set still renders both static protocols, so the first address is a change
        // of the static protocol only, never of a session.
        let empty = render(&config, &node, &BTreeMap::new(), &Advertisement::default()).expect("render");
        assert!(empty.contains("protocol static ccm_v4 {\n  ipv4;\n}") && empty.contains("protocol bgp peer_10_0_0_2"));
    }

    #[test]
    fn only_host_routes_inside_the_pools_are_rendered_and_the_export_filter_admits_only_those() {
        let node = NodeFacts { ipv4: Some(Ipv4Addr::new(10, 0, 0, 1)) };
        let prefixes = vec!["203.0.113.0/28".parse().expect("prefix")];
        let advertisement = Advertisement {
            addresses: addresses(&["203.0.113.5", "198.51.100.7", "2001:db8::1"]),
            prefixes,
            ..Default::default()
        };
        let text = render(&two_peers(), &node, &BTreeMap::new(), &advertisement).expect("render");
        assert!(text.contains("route 203.0.113.5/32 blackhole;"), "{text}");
        assert!(!text.contains("198.51.100.7") && !text.contains("2001:db8::1/128"), "outside every pool: {text}");
        let v6 = block(&text, "filter ccm_export_v6 {");
        assert_eq!(v6, "filter ccm_export_v6 {\n  reject;\n}", "no IPv6 pool: nothing IPv6 leaves the node");
        let v4 = block(&text, "filter ccm_export_v4 {");
        assert!(v4.contains("net ~ [ 203.0.113.0/28{32,32} ]"), "{v4}");
    }

    #[test]
    fn a_pools_route_attributes_ride_on_its_routes_and_its_local_pref_wins_over_the_global_one() {
        let node = NodeFacts { ipv4: Some(Ipv4Addr::new(10, 0, 0, 1)) };
        let config = parse(
            "localAsn: 64512\ncommunities: ['65000:100']\nlocalPref: 150\npeers:\n- address: 10.0.0.2\n  asn: 64512\n",
        )
        .expect("valid");
        let mut advertisement = adv(addresses(&["203.0.113.5", "203.0.113.6", "2001:db8::1"]));
        let route = RouteAttributes {
            communities: vec![(65000, 7)],
            large_communities: vec![(65000, 1, 2)],
            local_pref: Some(300),
        };
        advertisement.routes.insert("203.0.113.5".parse().expect("ip"), route);
        let only_large = RouteAttributes { large_communities: vec![(1, 2, 3)], ..Default::default() };
        advertisement.routes.insert("2001:db8::1".parse().expect("ip"), only_large);
        let text = render(&config, &node, &BTreeMap::new(), &advertisement).expect("render");
        assert!(
            text.contains("route 203.0.113.5/32 blackhole { bgp_community.add((65000, 7)); bgp_large_community.add((65000, 1, 2)); bgp_local_pref = 300; };"),
            "{text}"
        );
        assert!(text.contains("route 203.0.113.6/32 blackhole;"), "a route of a pool without attributes: {text}");
        assert!(text.contains("route 2001:db8::1/128 blackhole { bgp_large_community.add((1, 2, 3)); };"), "{text}");
        assert!(text.contains("bgp_community.add((65000, 100));"), "the global community stays: {text}");
        assert!(text.contains("if !defined(bgp_local_pref) then bgp_local_pref = 150;"), "{text}");
        advertisement.routes.clear();
        let plain = render(&config, &node, &BTreeMap::new(), &advertisement).expect("render");
        assert!(plain.contains("    bgp_local_pref = 150;") && !plain.contains("defined("), "{plain}");
    }

    #[test]
    fn cluster_services_are_advertised_by_every_node_local_ones_only_where_an_endpoint_is_ready() {
        let service = |addresses: &[&str], local| Announced {
            addresses: addresses.iter().map(|a| a.parse().expect("ip")).collect(),
            local,
            ..Default::default()
        };
        let announced = BTreeMap::from([
            ("ns/cluster".to_string(), service(&["203.0.113.1", "2001:db8::1"], false)),
            ("ns/local".to_string(), service(&["203.0.113.2"], true)),
            ("ns/shared-local".to_string(), service(&["203.0.113.3"], true)),
            ("ns/shared-cluster".to_string(), service(&["203.0.113.3"], false)),
        ]);
        let ready = BTreeMap::from([("ns/local".to_string(), BTreeSet::from(["worker-1".to_string()]))]);
        let all = addresses(&["203.0.113.1", "203.0.113.2", "203.0.113.3", "2001:db8::1"]);
        assert_eq!(advertised("worker-1", &announced, &ready, &Default::default()), all);
        let elsewhere = addresses(&["203.0.113.1", "203.0.113.3", "2001:db8::1"]);
        assert_eq!(
            advertised("worker-2", &announced, &ready, &Default::default()),
            elsewhere,
            "no ready endpoint: no route"
        );
        assert!(advertised("worker-2", &BTreeMap::new(), &ready, &Default::default()).is_empty());
    }

    fn bfd_peer(extra: &str) -> BgpConfig {
        parse(&format!("localAsn: 64512\npeers:\n- address: 10.0.0.2\n  asn: 64513\n{extra}")).expect("valid")
    }

    fn peer_block(config: &BgpConfig) -> String {
        let node = NodeFacts { ipv4: Some(Ipv4Addr::new(10, 0, 0, 1)) };
        let text = render(config, &node, &BTreeMap::new(), &Advertisement::default()).expect("render");
        block(&text, "protocol bgp peer_10_0_0_2 {").to_string()
    }

    #[test]
    fn bfd_renders_a_bfd_protocol_and_the_peers_session_options_with_metallbs_defaults() {
        let config = bfd_peer("  bfd: {}\n");
        let bfd = config.peers[0].bfd.as_ref().expect("read");
        assert_eq!((bfd.enabled, bfd.min_rx, bfd.min_tx, bfd.multiplier), (true, None, None, None));
        let node = NodeFacts { ipv4: Some(Ipv4Addr::new(10, 0, 0, 1)) };
        let text = render(&config, &node, &BTreeMap::new(), &Advertisement::default()).expect("render");
        assert!(text.contains("\nprotocol bfd ccm_bfd {\n}\n"), "{text}");
        let peer = peer_block(&config);
        assert!(
            peer.contains(
                "  hold time 90;\n  bfd {\n    min rx interval 300 ms;\n    min tx interval 300 ms;\n    multiplier 3;\n  };\n  ipv4 {"
            ),
            "{peer}"
        );
        assert!(!peer.contains("graceful"), "no graceful restart unless asked: {peer}");

        let config = bfd_peer("  bfd: {enabled: true, minRx: 100ms, minTx: 1s, multiplier: 5}\n");
        let peer = peer_block(&config);
        assert!(
            peer.contains(
                "  bfd {\n    min rx interval 100 ms;\n    min tx interval 1000 ms;\n    multiplier 5;\n  };\n"
            ),
            "{peer}"
        );
    }

    #[test]
    fn bfd_turned_off_or_absent_renders_no_bfd_at_all() {
        for extra in ["", "  bfd: {enabled: false, minRx: 100ms}\n"] {
            let config = bfd_peer(extra);
            let node = NodeFacts { ipv4: Some(Ipv4Addr::new(10, 0, 0, 1)) };
            let text = render(&config, &node, &BTreeMap::new(), &Advertisement::default()).expect("render");
            assert!(!text.contains("bfd"), "{extra:?}: {text}");
        }
    }

    #[test]
    fn an_ibgp_peer_with_bfd_is_rendered_directly_connected_as_single_hop_bfd_needs() {
        let ibgp = |extra: &str| {
            parse(&format!("localAsn: 64512\npeers:\n- address: 10.0.0.2\n  asn: 64512\n{extra}")).expect("valid")
        };
        assert!(peer_block(&ibgp("  bfd: {}\n")).contains("  hold time 90;\n  direct;\n  bfd {\n"));
        assert!(!peer_block(&ibgp("")).contains("direct;"), "without BFD, BIRD's iBGP default stays");
        assert!(!peer_block(&bfd_peer("  bfd: {}\n")).contains("direct;"), "eBGP is direct already");
    }

    #[test]
    fn graceful_restart_renders_on_and_its_time_and_makes_bfd_graceful() {
        let config = bfd_peer("  gracefulRestart: {}\n");
        let peer = peer_block(&config);
        assert!(
            peer.contains("  hold time 90;\n  graceful restart on;\n  graceful restart time 120;\n  ipv4 {"),
            "{peer}"
        );
        assert!(!peer.contains("bfd"), "{peer}");

        let config = bfd_peer("  gracefulRestart: {restartTime: 300s}\n  bfd: {multiplier: 4}\n");
        let peer = peer_block(&config);
        assert!(
            peer.contains(
                "  bfd {\n    min rx interval 300 ms;\n    min tx interval 300 ms;\n    multiplier 4;\n    graceful;\n  };\n  graceful restart on;\n  graceful restart time 300;\n"
            ),
            "{peer}"
        );

        let config = bfd_peer("  gracefulRestart: {enabled: false, restartTime: 300s}\n");
        assert!(!peer_block(&config).contains("graceful"), "off: BIRD's default (aware) stays");
    }

    #[test]
    fn bfd_and_graceful_restart_mistakes_name_the_field_and_the_range() {
        let peer = |extra: &str| format!("localAsn: 64512\npeers:\n- address: 192.0.2.1\n  asn: 64513\n{extra}");
        let cases = [
            ("  bfd: {minRx: 5ms}\n", "bgp.peers[0].bfd.minRx", BAD_BFD_INTERVAL),
            ("  bfd: {minRx: 61s}\n", "bgp.peers[0].bfd.minRx", BAD_BFD_INTERVAL),
            ("  bfd: {minTx: 300500us}\n", "bgp.peers[0].bfd.minTx", BAD_BFD_INTERVAL),
            ("  bfd: {multiplier: 0}\n", "bgp.peers[0].bfd.multiplier", BAD_BFD_MULTIPLIER),
            ("  bfd: {multiplier: 256}\n", "bgp.peers[0].bfd.multiplier", BAD_BFD_MULTIPLIER),
            ("  gracefulRestart: {restartTime: 0s}\n", "bgp.peers[0].gracefulRestart.restartTime", BAD_RESTART_TIME),
            ("  gracefulRestart: {restartTime: 4096s}\n", "bgp.peers[0].gracefulRestart.restartTime", BAD_RESTART_TIME),
            (
                "  gracefulRestart: {restartTime: 1500ms}\n",
                "bgp.peers[0].gracefulRestart.restartTime",
                BAD_RESTART_TIME,
            ),
            ("  bfd: {minRx: soon}\n", "bgp.peers[0].bfd.minRx", crate::duration::BAD_DURATION),
            ("  multihop: 2\n  bfd: {}\n", "bgp.peers[0].bfd", BFD_MULTIHOP),
        ];
        for (extra, path, expected) in cases {
            let text = message(&peer(extra));
            assert!(text.starts_with(&format!("{path}: ")) && text.contains(expected), "{extra:?} gave {text:?}");
        }
        // Checked even when turned off, so turning it on later cannot fail at load.
        let text = message(&peer("  bfd: {enabled: false, multiplier: 0}\n"));
        assert!(text.contains("bgp.peers[0].bfd.multiplier"), "{text}");
        let text = message(&peer("  bfd: {interval: 300ms}\n"));
        assert!(text.contains("bgp.peers[0].bfd") && text.contains("unknown field"), "{text}");
        // The edges are accepted.
        parse(&peer("  bfd: {minRx: 10ms, minTx: 60s, multiplier: 1}\n")).expect("lower and upper edges");
        parse(&peer("  bfd: {multiplier: 255}\n  gracefulRestart: {restartTime: 4095s}\n")).expect("edges");
        parse(&peer("  gracefulRestart: {restartTime: 1s}\n")).expect("edge");
    }

    /// `bird -p` (parse only) on every rendered variant, when BIRD is installed.
    #[test]
    fn every_rendered_bfd_and_graceful_restart_variant_parses_with_bird() {
        let runs = std::process::Command::new("bird").arg("--version").output().is_ok_and(|o| o.status.success());
        if !runs {
            eprintln!("SKIPPED: no `bird` (BIRD 2) on PATH to parse-check the rendered configs");
            return;
        }
        let variants = [
            "",
            "  bfd: {}\n",
            "  bfd: {enabled: false}\n",
            "  bfd: {minRx: 10ms, minTx: 60s, multiplier: 255}\n",
            "  gracefulRestart: {}\n",
            "  gracefulRestart: {restartTime: 4095s}\n",
            "  bfd: {minRx: 100ms, minTx: 100ms, multiplier: 3}\n  gracefulRestart: {restartTime: 1s}\n",
            "  bfd: {enabled: false}\n  gracefulRestart: {}\n  multihop: 2\n",
        ];
        /// Removes the scratch directory, also after a failed assertion.
        struct Scratch(std::path::PathBuf);
        impl Drop for Scratch {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
        let scratch = Scratch(std::env::temp_dir().join(format!("ccm-bgp-parse-{}", std::process::id())));
        let dir = &scratch.0;
        std::fs::create_dir_all(dir).expect("scratch dir");
        let node = NodeFacts { ipv4: Some(Ipv4Addr::new(10, 0, 0, 1)) };
        let passwords = BTreeMap::from([(1, Password("pw".into()))]);
        for (i, extra) in variants.iter().enumerate() {
            // A second, IPv6 peer with a password beside the variant, and both families' routes.
            let yaml = format!(
                "localAsn: 64512\ncommunities: ['65000:1']\npeers:\n- address: 10.0.0.2\n  asn: 64513\n{extra}\
                 - address: fd00::2\n  asn: 64512\n  passwordFile: /p\n{extra}"
            );
            let config = parse(&yaml).expect("valid");
            let set = adv(addresses(&["203.0.113.3", "2001:db8::7"]));
            let text = render(&config, &node, &passwords, &set).expect("render");
            let file = dir.join(format!("variant-{i}.conf"));
            std::fs::write(&file, &text).expect("write");
            let out = std::process::Command::new("bird").arg("-p").arg("-c").arg(&file).output().expect("run bird -p");
            let said = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "bird -p refused variant {extra:?}: {said}\n{text}");
        }
    }

    #[test]
    fn the_router_id_is_required_when_the_node_has_no_ipv4_address() {
        let config = two_peers();
        assert_eq!(
            render(&config, &NodeFacts::default(), &BTreeMap::new(), &Advertisement::default()),
            Err(RenderError::NoRouterId)
        );
        let config = BgpConfig { router_id: Some(Ipv4Addr::new(1, 2, 3, 4)), ..config };
        let text = render(&config, &NodeFacts::default(), &BTreeMap::new(), &Advertisement::default()).expect("render");
        assert!(text.contains("router id 1.2.3.4;"));
    }
}
