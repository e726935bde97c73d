//! The segment's upstream router as BGP speaker: BIRD 2 in the router's namespace, peering
//! with every Node, installing what it learns into the router's routing table (equal paths
//! merged into one multipath route), so the client's packets follow the Nodes' announcements.
//! Rendering its configuration and reading `birdc` and `ip route` are pure; starting it and
//! asking it go through the cluster.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use super::{Place, RealCluster};
use crate::Error;

/// What the router's BIRD is configured with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouterConfig {
    /// Its router ID and session address (the router's address on the segment).
    pub address: Ipv4Addr,
    /// Its AS.
    pub asn: u32,
    /// The Nodes' AS (eBGP: another than the router's).
    pub peer_asn: u32,
    /// The Nodes' addresses, one session each.
    pub peers: Vec<Ipv4Addr>,
    /// The hold time it offers, in seconds (3 or more); the session uses the smaller of both
    /// sides', so a short one here makes a silent Node's routes go in that time.
    pub hold_seconds: u16,
    /// BFD on every session, if any.
    pub bfd: Option<RouterBfd>,
    /// Graceful restart (RFC 4724) on every session: the router keeps a restarting Node's
    /// routes, stale, until it is back.
    pub graceful_restart: bool,
}

/// The router's BFD: its intervals both ways, its multiplier, and what BFD down does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouterBfd {
    /// The receive and transmit interval, in milliseconds.
    pub interval_ms: u32,
    /// Packets missed before the router declares a Node down.
    pub multiplier: u32,
    /// `bfd graceful` (BFD down starts a graceful restart, the routes kept stale) rather than
    /// `bfd on` (BFD down withdraws the routes at once).
    pub graceful: bool,
}

/// BIRD's name of the session with `peer` (`peer_198_19_0_2`).
pub fn protocol_name(peer: Ipv4Addr) -> String {
    format!("peer_{}", peer.to_string().replace('.', "_"))
}

impl RouterConfig {
    /// The whole `bird.conf`: every Node's session imports its routes (nothing exported back),
    /// the kernel protocol installs the best ones with equal paths merged (ECMP), and the
    /// timers are short so a stopped Node's routes go within the hold time and a returning one
    /// is accepted at once.
    pub fn render(&self) -> String {
        let keepalive = (self.hold_seconds / 3).max(1);
        let mut options = String::new();
        let mut bfd_protocol = String::new();
        if let Some(bfd) = self.bfd {
            let (ms, mult) = (bfd.interval_ms, bfd.multiplier);
            bfd_protocol = format!(
                "protocol bfd {{ interface \"*\" {{ min rx interval {ms} ms; min tx interval {ms} ms; multiplier {mult}; }}; }}\n"
            );
            options.push_str(if bfd.graceful { "  bfd graceful;\n" } else { "  bfd on;\n" });
        }
        if self.graceful_restart {
            options.push_str("  graceful restart on;\n");
        }
        let mut out = format!(
            "router id {address};\nlog stderr all;\nprotocol device {{ scan time 2; }}\n{bfd_protocol}\
             protocol kernel {{\n  ipv4 {{ import none; export all; }};\n  merge paths on;\n}}\n\
             template bgp nodes {{\n  local {address} as {asn};\n  hold time {hold};\n  keepalive time {keepalive};\n  \
             connect delay time 1;\n  connect retry time 2;\n  error wait time 1, 2;\n{options}  \
             ipv4 {{ import all; export none; }};\n}}\n",
            address = self.address,
            asn = self.asn,
            hold = self.hold_seconds,
        );
        for peer in &self.peers {
            out.push_str(&format!(
                "protocol bgp {} from nodes {{ neighbor {peer} as {}; }}\n",
                protocol_name(*peer),
                self.peer_asn
            ));
        }
        out
    }
}

/// The sessions `birdc show protocols` reports Established, by protocol name.
pub fn established(show_protocols: &str) -> Vec<String> {
    show_protocols
        .lines()
        .filter(|l| l.split_whitespace().nth(1) == Some("BGP") && l.contains("Established"))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

/// The next hops of the routes `ip route show` printed (one route with `nexthop via` lines,
/// or one `via`), in order.
pub fn next_hops(ip_route: &str) -> Vec<Ipv4Addr> {
    let words: Vec<&str> = ip_route.split_whitespace().collect();
    words.windows(2).filter(|w| w[0] == "via").filter_map(|w| w[1].parse().ok()).collect()
}

/// The router's BIRD: its configuration file and control socket under the cluster's state
/// directory. It runs until the cluster stops (which kills what runs in the router).
#[derive(Debug, Clone)]
pub struct RouterBird {
    /// `bird.conf`.
    pub config: PathBuf,
    /// The control socket, for `birdc -s`.
    pub socket: PathBuf,
}

impl RouterBird {
    /// Where the router's BIRD keeps its files in this cluster.
    pub fn of(cluster: &RealCluster) -> RouterBird {
        let dir = cluster.state_dir().join("router");
        RouterBird { config: dir.join("bird.conf"), socket: dir.join("bird.ctl") }
    }

    /// Writes `config` and has BIRD run it: reconfigured when it runs already, started in the
    /// router's namespace otherwise; returns once it answers on its socket.
    pub fn apply(&self, cluster: &RealCluster, config: &str) -> Result<(), Error> {
        if let Some(dir) = self.config.parent() {
            std::fs::create_dir_all(dir).map_err(|e| Error::io("creating the router's directory", e))?;
        }
        std::fs::write(&self.config, config).map_err(|e| Error::io("writing the router's bird.conf", e))?;
        if self.birdc(&["show", "status"]).is_ok() {
            let out = self.birdc(&["configure"])?;
            if !out.contains("Reconfigured") && !out.contains("Reconfiguration in progress") {
                return Err(Error::Other(format!("the router's BIRD refused its configuration: {out}")));
            }
            return Ok(());
        }
        let s = |p: &Path| p.to_string_lossy().into_owned();
        let args = ["-f".to_string(), "-c".into(), s(&self.config), "-s".into(), s(&self.socket)];
        cluster.spawn_in(Place::Router, "bird", Path::new("bird"), &args)?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.birdc(&["show", "status"]).is_err() {
            if Instant::now() > deadline {
                return Err(Error::Other(format!("BIRD in the router never answered on {}", self.socket.display())));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }

    /// `birdc -s SOCKET ARGS...`'s output.
    pub fn birdc(&self, args: &[&str]) -> Result<String, Error> {
        let out = Command::new("birdc")
            .arg("-s")
            .arg(&self.socket)
            .args(args)
            .output()
            .map_err(|e| Error::io("running birdc", e))?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() || text.contains("Unable to connect") {
            return Err(Error::Other(format!(
                "birdc {}: {text}{}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        Ok(text)
    }

    /// The sessions that are Established now.
    pub fn established(&self) -> Result<Vec<String>, Error> {
        self.birdc(&["show", "protocols"]).map(|o| established(&o))
    }

    /// The neighbours whose BFD session is Up now.
    pub fn bfd_up(&self) -> Result<Vec<Ipv4Addr>, Error> {
        self.birdc(&["show", "bfd", "sessions"]).map(|o| bfd_up(&o))
    }
}

/// The neighbours `birdc show bfd sessions` reports Up.
pub fn bfd_up(show_bfd_sessions: &str) -> Vec<Ipv4Addr> {
    show_bfd_sessions
        .lines()
        .filter(|l| l.split_whitespace().nth(2) == Some("Up"))
        .filter_map(|l| l.split_whitespace().next().and_then(|a| a.parse().ok()))
        .collect()
}

/// The next hops the router's kernel table has for `address` (`/32`), in order.
pub fn router_next_hops(cluster: &RealCluster, address: Ipv4Addr) -> Result<Vec<Ipv4Addr>, Error> {
    let exact = format!("{address}/32");
    cluster.command_in(Place::Router, "ip", &["-4", "route", "show", "exact", &exact]).map(|o| next_hops(&o))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> RouterConfig {
        RouterConfig {
            address: Ipv4Addr::new(198, 19, 0, 254),
            asn: 64513,
            peer_asn: 64512,
            peers: vec![Ipv4Addr::new(198, 19, 0, 1), Ipv4Addr::new(198, 19, 0, 2)],
            hold_seconds: 3,
            bfd: None,
            graceful_restart: false,
        }
    }

    #[test]
    fn bfd_and_graceful_restart_are_rendered_only_when_asked_for() {
        assert!(!config().render().contains("bfd") && !config().render().contains("graceful"));
        let bfd = RouterBfd { interval_ms: 100, multiplier: 3, graceful: true };
        let conf = RouterConfig { bfd: Some(bfd), graceful_restart: true, ..config() }.render();
        assert!(
            conf.contains(
                "protocol bfd { interface \"*\" { min rx interval 100 ms; min tx interval 100 ms; multiplier 3; }; }\n"
            ),
            "{conf}"
        );
        assert!(conf.contains("  bfd graceful;\n  graceful restart on;\n"), "{conf}");
        let conf = RouterConfig { bfd: Some(RouterBfd { graceful: false, ..bfd }), ..config() }.render();
        assert!(conf.contains("  bfd on;\n") && !conf.contains("graceful"), "{conf}");
    }

    #[test]
    fn bfd_sessions_up_are_read_from_show_bfd_sessions() {
        let out = "BIRD 2.0.12 ready.\nbfd1:\nIP address                Interface  State      Since         Interval  Timeout\n\
                   198.19.0.1                ccmnodes0  Up         06:00:01.000    0.100    0.300\n\
                   198.19.0.2                ccmnodes0  Down       06:00:01.000    1.000    0.000\n";
        assert_eq!(bfd_up(out), [Ipv4Addr::new(198, 19, 0, 1)]);
    }

    #[test]
    fn the_router_peers_with_every_node_imports_their_routes_and_installs_equal_paths_as_one_route() {
        let conf = config().render();
        assert!(conf.starts_with("router id 198.19.0.254;\n"), "{conf}");
        assert!(conf.contains("merge paths on;"), "ECMP into the kernel: {conf}");
        assert!(conf.contains("ipv4 { import none; export all; };"), "the kernel gets the routes: {conf}");
        assert!(conf.contains("local 198.19.0.254 as 64513;\n  hold time 3;\n  keepalive time 1;"), "{conf}");
        assert!(conf.contains("ipv4 { import all; export none; };"), "nothing sent to the Nodes: {conf}");
        assert!(conf.contains("protocol bgp peer_198_19_0_1 from nodes { neighbor 198.19.0.1 as 64512; }\n"));
        assert!(conf.contains("protocol bgp peer_198_19_0_2 from nodes { neighbor 198.19.0.2 as 64512; }\n"));
    }

    #[test]
    fn established_sessions_are_read_from_show_protocols() {
        let out = "BIRD 2.0.12 ready.\nName       Proto      Table      State  Since         Info\n\
                   device1    Device     ---        up     06:00:00.000  \n\
                   peer_198_19_0_1 BGP        ---        up     06:00:01.000  Established   \n\
                   peer_198_19_0_2 BGP        ---        start  06:00:01.000  Active        Socket: Connection refused\n";
        assert_eq!(established(out), ["peer_198_19_0_1"]);
    }

    #[test]
    fn next_hops_are_read_from_a_multipath_route_and_from_a_single_one() {
        let multi = "198.19.16.1 proto bird metric 32 \n\tnexthop via 198.19.0.1 dev ccmnodes0 weight 1 \n\tnexthop via 198.19.0.3 dev ccmnodes0 weight 1 \n";
        assert_eq!(next_hops(multi), [Ipv4Addr::new(198, 19, 0, 1), Ipv4Addr::new(198, 19, 0, 3)]);
        let single = "198.19.16.1 via 198.19.0.2 dev ccmnodes0 proto bird metric 32 \n";
        assert_eq!(next_hops(single), [Ipv4Addr::new(198, 19, 0, 2)]);
        assert!(next_hops("").is_empty());
    }
}
