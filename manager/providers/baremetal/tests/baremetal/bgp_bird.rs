//! BGP announcement through BIRD, in network namespaces this test creates (issue 27 items 3 and
//! 5): a "node" namespace runs BIRD on the config our announcer renders and reloads, as the
//! announcer pod's sidecar runs it (uid 65532, no capability); a "router" namespace runs a second BIRD peering with it
//! over a veth pair, over IPv4 (with a TCP-MD5 password) and IPv6. Issue 47 item 3 adds BFD
//! (the router withdraws within the detection time when the node goes silent) and graceful
//! restart (the router keeps the route while the node's BIRD restarts). Needs root and BIRD 2
//! (`apt-get install bird2`), and iptables for the BFD test; otherwise it prints `SKIPPED`.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ccm_provider_baremetal::advertisement::RouteAttributes;
use ccm_provider_baremetal::announce::bgp::bird::{self, BgpError, BirdAnnouncer, BirdSettings, Changed};
use ccm_provider_baremetal::announce::bgp::{
    Advertisement, BfdConfig, BgpConfig, GracefulRestartConfig, NodeFacts, PeerConfig, protocol_name,
};
use ccm_provider_baremetal::announce::bgp_sessions;
use testkit::eventually_within;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

const NODE4: &str = "10.233.0.1";
const ROUTER4: &str = "10.233.0.2";
const NODE6: &str = "fdcc:233::1";
const ROUTER6: &str = "fdcc:233::2";
const PASSWORD: &str = "md5-test-pw";
/// How long any one expectation may take (BIRD connects within about a second).
const WAIT: Duration = Duration::from_secs(10);

/// Why this machine cannot run the test, if it cannot.
pub(crate) fn missing_prerequisite() -> Option<&'static str> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let root = status.lines().any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"));
    if !root {
        return Some("BGP through BIRD needs root (network namespaces); run the tests as root");
    }
    let runs = |program: &str, arg: &str| {
        Command::new(program).arg(arg).stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
    };
    if !runs("bird", "--version") {
        return Some("BGP through BIRD needs BIRD 2: apt-get install -y --no-install-recommends bird2");
    }
    if !runs("setpriv", "--version") {
        return Some(
            "BGP through BIRD needs util-linux's setpriv: apt-get install -y --no-install-recommends util-linux",
        );
    }
    if !runs("ip", "-V") {
        return Some("BGP through BIRD needs iproute2's ip: apt-get install -y --no-install-recommends iproute2");
    }
    None
}

/// Who a BIRD runs as.
#[derive(Clone, Copy)]
enum Privilege {
    /// root, all capabilities (the router).
    Root,
    /// uid and gid 65532 with at most this one capability, as the announcer pod's sidecar.
    Uid65532(Option<&'static str>),
}

/// The namespaces, veth, BIRD processes and files of one run; all removed on drop, also after a
/// panic.
struct Lab {
    id: String,
    dir: PathBuf,
    birds: Vec<Child>,
}

impl Lab {
    fn node_ns(&self) -> String {
        format!("ccmbgp{}n", self.id)
    }
    fn router_ns(&self) -> String {
        format!("ccmbgp{}r", self.id)
    }
    fn node_veth(&self) -> String {
        format!("cbn{}", self.id)
    }
    fn router_veth(&self) -> String {
        format!("cbr{}", self.id)
    }

    /// A lab whose names carry `tag`, so the tests of this binary run side by side.
    fn new(tag: char) -> Self {
        let id = format!("{}{tag}", std::process::id() % 100_000);
        let dir = std::env::temp_dir().join(format!("ccm-bgp-bird-{id}"));
        let lab = Lab { id, dir, birds: Vec::new() };
        lab.cleanup_system();
        std::fs::create_dir_all(&lab.dir).expect("scratch dir");
        let (n, r, vn, vr) = (lab.node_ns(), lab.router_ns(), lab.node_veth(), lab.router_veth());
        ip(&["netns", "add", &n]);
        ip(&["netns", "add", &r]);
        ip(&["link", "add", &vn, "type", "veth", "peer", "name", &vr]);
        ip(&["link", "set", &vn, "netns", &n]);
        ip(&["link", "set", &vr, "netns", &r]);
        for (ns, veth, v4, v6) in [(&n, &vn, NODE4, NODE6), (&r, &vr, ROUTER4, ROUTER6)] {
            ip(&["-n", ns, "addr", "add", &format!("{v4}/24"), "dev", veth]);
            // nodad: usable at once, not after duplicate address detection.
            ip(&["-n", ns, "addr", "add", &format!("{v6}/64"), "dev", veth, "nodad"]);
            ip(&["-n", ns, "link", "set", veth, "up"]);
            ip(&["-n", ns, "link", "set", "lo", "up"]);
        }
        lab
    }

    /// Start BIRD in `ns` on `config`, with control socket `socket`; `least_privilege` runs it
    /// as the announcer pod's sidecar runs: uid and gid 65532 and no capability at all
    /// (Kubernetes gives a non-root process none of the capabilities it adds).
    fn start_bird(&mut self, ns: &str, config: &Path, socket: &Path, least_privilege: bool) {
        let privilege = if least_privilege { Privilege::Uid65532(None) } else { Privilege::Root };
        self.start_bird_as(ns, config, socket, privilege, false);
    }

    /// Start BIRD in `ns` as `privilege` says; `recovery` starts it in graceful-restart
    /// recovery (`-R`: tells peers it kept its forwarding state, and waits for its protocols
    /// before End-of-RIB, so a helper keeps the stale routes until they are refreshed).
    fn start_bird_as(&mut self, ns: &str, config: &Path, socket: &Path, privilege: Privilege, recovery: bool) {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", ns]);
        if let Privilege::Uid65532(cap) = privilege {
            command.args(["setpriv", "--reuid=65532", "--regid=65532", "--clear-groups"]);
            match cap {
                None => command.args(["--inh-caps=-all", "--bounding-set=-all"]),
                Some(cap) => command.args([
                    format!("--inh-caps=-all,+{cap}"),
                    format!("--ambient-caps=+{cap}"),
                    format!("--bounding-set=-all,+{cap}"),
                ]),
            };
        }
        command.arg("bird").arg("-f").arg("-c").arg(config).arg("-s").arg(socket);
        if recovery {
            command.arg("-R");
        }
        let child = command.stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("start bird");
        self.birds.push(child);
    }

    fn cleanup_system(&self) {
        for ns in [self.node_ns(), self.router_ns()] {
            let _ = Command::new("ip").args(["netns", "del", &ns]).stderr(Stdio::null()).status();
        }
        // Only left in the host namespace if a run stopped between creating and moving it.
        let _ = Command::new("ip").args(["link", "del", &self.node_veth()]).stderr(Stdio::null()).status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for bird in &mut self.birds {
            let _ = bird.kill();
            let _ = bird.wait();
        }
        self.cleanup_system();
    }
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(out.status.success(), "ip {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A BIRD command's answer as text, or the error as text.
pub(crate) async fn show(socket: &Path, command: &str) -> String {
    match bird::control(socket, command, Duration::from_secs(2)).await {
        Ok(reply) => reply.lines.into_iter().map(|(_, line)| line + "\n").collect(),
        Err(e) => format!("error: {e}"),
    }
}

/// The `since` column of an established session in `show protocols`, or `None`.
async fn established_since(socket: &Path, protocol: &str) -> Option<String> {
    let text = show(socket, "show protocols").await;
    text.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        (fields.first() == Some(&protocol) && fields.get(5) == Some(&"Established")).then(|| fields[4].to_string())
    })
}

/// The routes the router learned, both tables, as `prefix via next-hop` text.
pub(crate) async fn router_routes(socket: &Path) -> String {
    let v4 = show(socket, "show route table master4").await;
    let v6 = show(socket, "show route table master6").await;
    format!("{v4}{v6}")
}

/// Poll (every 5 ms) until `check` holds on the router's routes; the time it took.
async fn until_routes(socket: &Path, what: &str, check: impl Fn(&str) -> bool) -> Duration {
    let start = Instant::now();
    loop {
        let routes = router_routes(socket).await;
        if check(&routes) {
            return start.elapsed();
        }
        assert!(start.elapsed() < WAIT, "{what} not within {WAIT:?}; the router has:\n{routes}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// `addresses` to advertise, in pools holding every test address.
fn set(addresses: &[&str]) -> Advertisement {
    let addresses: BTreeSet<IpAddr> = addresses.iter().map(|a| a.parse().expect("ip")).collect();
    let prefixes = ["203.0.113.0/24", "2001:db8:cc::/64"].map(|p| p.parse().expect("prefix")).to_vec();
    Advertisement { addresses, prefixes, ..Default::default() }
}

fn peer(address: &str, password_file: Option<PathBuf>) -> PeerConfig {
    PeerConfig {
        address: address.parse().expect("ip"),
        asn: 64513,
        port: None,
        password_file,
        hold_time: None,
        multihop: None,
        bfd: None,
        graceful_restart: None,
    }
}

/// BFD on the router's side: 100 ms both ways, three packets, so it declares the node down
/// 300 ms after the node's last packet (the node's multiplier × the slower of the intervals).
const ROUTER_BFD: &str =
    "protocol bfd { interface \"*\" { min rx interval 100 ms; min tx interval 100 ms; multiplier 3; }; }";
/// The node's BFD settings, as a user writes them: 100 ms both ways, multiplier 3.
const NODE_BFD: BfdConfig = BfdConfig {
    enabled: true,
    min_rx: Some(Duration::from_millis(100)),
    min_tx: Some(Duration::from_millis(100)),
    multiplier: Some(3),
};
/// The node's BIRD with BFD: uid 65532 and `CAP_NET_RAW` only. BIRD marks its BFD sockets
/// with `SO_PRIORITY` 7, which Linux refuses to a process without `CAP_NET_ADMIN` (recent
/// kernels, such as 6.18 here, also take `CAP_NET_RAW`); refused, BFD stays Down ("Socket error:
/// SO_PRIORITY: Operation not permitted") while BGP works.
const BFD_PRIVILEGE: Privilege = Privilege::Uid65532(Some("net_raw"));
/// The hold time of both sides in the BFD tests: what would take the routes off without BFD.
const HOLD: Duration = Duration::from_secs(90);

/// The router's state of its BFD session with the node (`Up`, `Down`, `Init`), if any.
async fn bfd_state(socket: &Path) -> Option<String> {
    let text = show(socket, "show bfd sessions").await;
    text.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        (fields.first() == Some(&NODE4)).then(|| fields.get(2).unwrap_or(&"").to_string())
    })
}

/// The pod's shared volume in `lab`: group 65532 (its fsGroup), group-writable, so BIRD reads
/// the config the announcer writes and makes its socket there; the announcer's settings on it.
fn shared_volume(lab: &Lab) -> BirdSettings {
    let shared = lab.dir.join("node");
    std::fs::create_dir_all(&shared).expect("shared dir");
    std::os::unix::fs::chown(&shared, Some(0), Some(65532)).expect("chown the shared dir");
    std::fs::set_permissions(&shared, std::os::unix::fs::PermissionsExt::from_mode(0o2770)).expect("chmod");
    BirdSettings {
        config_path: shared.join("bird.conf"),
        socket_path: shared.join("bird.ctl"),
        timeout: Duration::from_secs(5),
    }
}

/// A lab with the router's BIRD (IPv4 session to the node, BFD on, `bgp_extra` in its BGP
/// protocol) and the node's BIRD running the announcer's config for `peer`, least privileged,
/// with the node advertising 203.0.113.10 and the router holding that route with BFD up.
async fn lab_with_bfd(tag: char, node_peer: PeerConfig, bgp_extra: &str) -> (Lab, BirdSettings, PathBuf) {
    let mut lab = Lab::new(tag);
    let router_config = lab.dir.join("router.conf");
    let router_socket = lab.dir.join("router.ctl");
    let hold = HOLD.as_secs();
    std::fs::write(
        &router_config,
        format!(
            "router id {ROUTER4};\nprotocol device {{}}\n{ROUTER_BFD}\n\
             protocol bgp node4 {{ local as 64513; neighbor {NODE4} as 64512; hold time {hold}; {bgp_extra}\n  \
               connect delay time 1; connect retry time 1; ipv4 {{ import all; export none; }}; }}\n"
        ),
    )
    .expect("router config");
    lab.start_bird(&lab.router_ns(), &router_config, &router_socket, false);

    let settings = shared_volume(&lab);
    let config = BgpConfig { local_asn: 64512, peers: vec![node_peer], ..BgpConfig::default() };
    let node = NodeFacts { ipv4: Some(NODE4.parse().expect("ip")) };
    let mut announcer = BirdAnnouncer::new(config, node, settings.clone());
    // BIRD is not running yet: the config is written, the reload fails.
    let _ = announcer.announce(&set(&["203.0.113.10"])).await;
    let rendered = std::fs::read_to_string(&settings.config_path).expect("config written");
    assert!(rendered.contains("protocol bfd ccm_bfd {") && rendered.contains("  bfd {\n"), "{rendered}");
    lab.start_bird_as(&lab.node_ns(), &settings.config_path, &settings.socket_path, BFD_PRIVILEGE, false);
    until_routes(&router_socket, "the node's route", |r| r.contains("203.0.113.10/32")).await;
    let began = Instant::now();
    while bfd_state(&router_socket).await.as_deref() != Some("Up") {
        if began.elapsed() > WAIT {
            let router = show(&router_socket, "show bfd sessions").await;
            let node = show(&settings.socket_path, "show bfd sessions").await;
            let proto = show(&settings.socket_path, "show protocols all").await;
            panic!("BFD not Up within {WAIT:?}; router:\n{router}node:\n{node}{proto}");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let state = "Up";
    assert_eq!(state, "Up");
    (lab, settings, router_socket)
}

/// Run `args` in namespace `ns` (the test's own), asserting success.
fn in_ns(ns: &str, args: &[&str]) {
    let out = Command::new("ip").args(["netns", "exec", ns]).args(args).output().expect("run in namespace");
    assert!(out.status.success(), "{args:?} in {ns}: {}", String::from_utf8_lossy(&out.stderr));
}

#[tokio::test]
async fn bfd_takes_the_route_off_the_router_within_the_detection_time_when_the_node_stops_answering() {
    if let Some(reason) = missing_prerequisite() {
        eprintln!("SKIPPED: {reason}");
        return;
    }
    let iptables = Command::new("iptables").arg("-V").stdout(Stdio::null()).stderr(Stdio::null()).status();
    if !iptables.is_ok_and(|s| s.success()) {
        eprintln!("SKIPPED: the BFD test silences the link with iptables: apt-get install -y iptables");
        return;
    }
    let node_peer = PeerConfig { bfd: Some(NODE_BFD), ..peer(ROUTER4, None) };
    let (lab, _settings, router_socket) = lab_with_bfd('b', node_peer, "bfd on;").await;

    // The link goes silent both ways, carrier kept (a dead switch port, a hung node): only BFD
    // or the hold time can notice. The rules live in the node's namespace and go with it.
    let start = Instant::now();
    in_ns(&lab.node_ns(), &["iptables", "-w", "-I", "INPUT", "-j", "DROP"]);
    in_ns(&lab.node_ns(), &["iptables", "-w", "-I", "OUTPUT", "-j", "DROP"]);
    let withdrawn =
        until_routes(&router_socket, "the withdrawal on BFD down", |r| !r.contains("203.0.113.10/32")).await;
    let detection = start.elapsed().max(withdrawn);
    let state = bfd_state(&router_socket).await;
    assert_ne!(state.as_deref(), Some("Up"), "the router's BFD session is down");
    // 300 ms detection; a second for scheduling on a loaded machine, still far under 90 s.
    assert!(detection < Duration::from_secs(2), "withdrawn after {detection:?}, BFD detects in 300 ms");
    eprintln!(
        "BFD (BIRD {}; node 100 ms x 3 as uid 65532 with CAP_NET_RAW only, router 100 ms x 3): route withdrawn by the router {} ms after the link went silent (detection time 300 ms, hold time {} s)",
        bird_version(),
        detection.as_millis(),
        HOLD.as_secs()
    );
}

#[tokio::test]
async fn graceful_restart_keeps_the_route_on_the_router_marked_stale_while_the_announcers_bird_restarts() {
    if let Some(reason) = missing_prerequisite() {
        eprintln!("SKIPPED: {reason}");
        return;
    }
    let restart = GracefulRestartConfig { enabled: true, restart_time: Some(Duration::from_secs(120)) };
    let node_peer = PeerConfig { bfd: Some(NODE_BFD), graceful_restart: Some(restart), ..peer(ROUTER4, None) };
    // The router as graceful-restart helper with `bfd graceful`: BFD down starts a graceful
    // restart of the session instead of a hard one (with `bfd on` it would flush the routes).
    let (mut lab, settings, router_socket) = lab_with_bfd('g', node_peer, "bfd graceful;").await;

    for how in ["graceful restart", "kill"] {
        // The node's BIRD goes away: `birdc graceful restart` (closes without telling the
        // router) or a crash (SIGKILL).
        let start = Instant::now();
        let mut old = lab.birds.pop().expect("the node's BIRD");
        if how == "kill" {
            let _ = old.kill();
        } else {
            let reply = bird::control(&settings.socket_path, "graceful restart", Duration::from_secs(2)).await;
            assert!(reply.is_ok(), "graceful restart: {reply:?}");
        }
        let _ = old.wait();
        let _ = std::fs::remove_file(&settings.socket_path);
        // Gone from the node, the route stays on the router, stale, through BFD's detection.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let routes = show(&router_socket, "show route table master4 all").await;
        assert!(
            routes.contains("203.0.113.10/32"),
            "{how}: the router keeps the route: {routes}{}",
            show(&router_socket, "show protocols all node4").await
        );
        // BIRD 2.0.12 prints no stale flag on a route; the helper's state says the routes are
        // kept stale, and for how long.
        let protocol = show(&router_socket, "show protocols all node4").await;
        assert!(protocol.contains("Neighbor graceful restart active"), "{how}: {protocol}");
        let timer = protocol.lines().find(|l| l.contains("Restart timer:")).unwrap_or("").trim().to_string();

        // The node's BIRD back: the session re-established, the route kept and refreshed.
        lab.start_bird_as(&lab.node_ns(), &settings.config_path, &settings.socket_path, BFD_PRIVILEGE, true);
        let (mut missing, began) = (false, Instant::now());
        let state = loop {
            missing |= !router_routes(&router_socket).await.contains("203.0.113.10/32");
            // Recovery over: the node's BIRD has sent End-of-RIB, the route is no longer stale.
            let recovered = !show(&settings.socket_path, "show status").await.contains("recovery");
            let up = recovered && established_since(&router_socket, "node4").await.is_some();
            if let Some(state) = bfd_state(&router_socket).await.filter(|s| up && s == "Up") {
                break state;
            }
            assert!(began.elapsed() < WAIT, "{how}: session and BFD not Up again within {WAIT:?}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        assert_eq!(state, "Up");
        assert!(!missing, "{how}: the route never left the router");
        let routes = router_routes(&router_socket).await;
        assert!(routes.contains("203.0.113.10/32"), "{how}: still there after the restart: {routes}");
        eprintln!(
            "graceful restart ({how}, BIRD {}): route kept on the router throughout, stale while the node was away ({timer}); session and BFD Up again {} ms after the node's BIRD went away",
            bird_version(),
            start.elapsed().as_millis()
        );
    }
}

/// `bird --version`'s version, for the printed measurements.
fn bird_version() -> String {
    let out = Command::new("bird").arg("--version").output().map(|o| [o.stdout, o.stderr].concat()).unwrap_or_default();
    String::from_utf8_lossy(&out).trim().trim_start_matches("BIRD version ").to_string()
}

#[tokio::test]
async fn bgp_host_routes_reach_a_bird_router_and_are_withdrawn_with_sessions_kept_across_reloads() {
    if let Some(reason) = missing_prerequisite() {
        eprintln!("SKIPPED: {reason}");
        return;
    }
    let mut lab = Lab::new('a');
    let (node_ns, router_ns) = (lab.node_ns(), lab.router_ns());
    let password_file = lab.dir.join("peer-password");
    std::fs::write(&password_file, format!("{PASSWORD}\n")).expect("password file");

    // The router: accepts everything from the node, connects quickly.
    let router_config = lab.dir.join("router.conf");
    let router_socket = lab.dir.join("router.ctl");
    std::fs::write(
        &router_config,
        format!(
            "router id {ROUTER4};\nprotocol device {{}}\n\
             protocol bgp node4 {{ local as 64513; neighbor {NODE4} as 64512; password \"{PASSWORD}\";\n  \
               connect delay time 1; connect retry time 1; ipv4 {{ import all; export none; }}; }}\n\
             protocol bgp node6 {{ local as 64513; neighbor {NODE6} as 64512;\n  \
               connect delay time 1; connect retry time 1; ipv6 {{ import all; export none; }}; }}\n"
        ),
    )
    .expect("router config");
    lab.start_bird(&router_ns, &router_config, &router_socket, false);

    let settings = shared_volume(&lab);
    let config = BgpConfig {
        local_asn: 64512,
        peers: vec![peer(ROUTER6, None), peer(ROUTER4, Some(password_file))],
        // Not sent to these eBGP peers; rendered beside a pool's own, which BIRD must accept.
        local_pref: Some(150),
        ..BgpConfig::default()
    };
    let node = NodeFacts { ipv4: Some(NODE4.parse().expect("ip")) };
    let mut announcer = BirdAnnouncer::new(config, node, settings.clone());

    // Before BIRD runs, the config is written and the reload fails, naming the socket.
    let first = set(&["203.0.113.10", "2001:db8:cc::10"]);
    let error = announcer.announce(&first).await.expect_err("BIRD is not running yet");
    assert!(matches!(&error, BgpError::Control { path, .. } if *path == settings.socket_path), "{error}");
    let rendered = std::fs::read_to_string(&settings.config_path).expect("config written");
    assert!(!format!("{error:?}").contains(PASSWORD), "no password in errors");

    let started = Instant::now();
    lab.start_bird(&node_ns, &settings.config_path, &settings.socket_path, true);
    let status = eventually_within("the node's BIRD control socket", WAIT, || async {
        bird::control(&settings.socket_path, "show status", Duration::from_secs(1)).await.ok()
    })
    .await;
    assert_eq!(status.code, 13, "show status ends with 0013: {status:?}");
    assert_eq!(announcer.announce(&first).await.expect("reload"), Changed::Reloaded);
    assert_eq!(std::fs::read_to_string(&settings.config_path).expect("config"), rendered, "same set, same text");
    let (v4, v6) = (protocol_name(ROUTER4.parse().expect("ip")), protocol_name(ROUTER6.parse().expect("ip")));
    until_routes(&router_socket, "the first host routes", |r| {
        r.contains("203.0.113.10/32") && r.contains("2001:db8:cc::10/128")
    })
    .await;
    let session_up = started.elapsed();
    let routes = router_routes(&router_socket).await;
    assert!(routes.contains(&format!("via {NODE4}")) && routes.contains(&format!("via {NODE6}")), "{routes}");
    let since4 = established_since(&router_socket, "node4").await.expect("IPv4 session with password");
    let since6 = established_since(&router_socket, "node6").await.expect("IPv6 session");
    assert!(established_since(&settings.socket_path, &v4).await.is_some(), "the node names its peer {v4}");
    assert!(established_since(&settings.socket_path, &v6).await.is_some(), "the node names its peer {v6}");

    // Unchanged set: no write, no reload.
    assert_eq!(announcer.announce(&first).await.expect("announce"), Changed::Unchanged);

    // Two more addresses: one reload, both learned, sessions kept.
    let more = set(&["203.0.113.10", "203.0.113.11", "2001:db8:cc::10", "2001:db8:cc::11"]);
    let start = Instant::now();
    assert_eq!(announcer.announce(&more).await.expect("announce"), Changed::Reloaded);
    until_routes(&router_socket, "the added host routes", |r| {
        r.contains("203.0.113.11/32") && r.contains("2001:db8:cc::11/128")
    })
    .await;
    let to_route = start.elapsed();

    // One address per family leaves the set: withdrawn, the others stay.
    let fewer = set(&["203.0.113.11", "2001:db8:cc::11"]);
    let start = Instant::now();
    assert_eq!(announcer.announce(&fewer).await.expect("announce"), Changed::Reloaded);
    until_routes(&router_socket, "the withdrawal", |r| {
        !r.contains("203.0.113.10/32") && !r.contains("2001:db8:cc::10/128")
    })
    .await;
    let to_withdrawal = start.elapsed();
    let routes = router_routes(&router_socket).await;
    assert!(routes.contains("203.0.113.11/32") && routes.contains("2001:db8:cc::11/128"), "{routes}");

    // A pool's attributes ride on its route (issue 47 item 2): the router learns its communities
    // and large communities after one reload, the sessions stay (checked below).
    let mut attributed = fewer.clone();
    let route = RouteAttributes {
        communities: vec![(65000, 7)],
        large_communities: vec![(65000, 1, 2)],
        local_pref: Some(300),
    };
    attributed.routes.insert("203.0.113.11".parse().expect("ip"), route);
    let before = show(&router_socket, "show route table master4 all").await;
    assert!(before.contains("203.0.113.11/32") && !before.contains("(65000,7)"), "{before}");
    let start = Instant::now();
    assert_eq!(announcer.announce(&attributed).await.expect("announce"), Changed::Reloaded);
    let detail = eventually_within("the route's communities at the router", WAIT, || async {
        let all = show(&router_socket, "show route table master4 all").await;
        (all.contains("(65000,7)") && all.contains("(65000, 1, 2)")).then_some(all)
    })
    .await;
    let to_attributes = start.elapsed();
    assert!(detail.contains("203.0.113.11/32"), "{detail}");
    println!("BGP: a pool's communities at the router {} ms after the change", to_attributes.as_millis());

    assert_eq!(established_since(&router_socket, "node4").await, Some(since4), "IPv4 session kept across reloads");
    assert_eq!(established_since(&router_socket, "node6").await, Some(since6), "IPv6 session kept across reloads");
    let text = std::fs::read_to_string(&settings.config_path).expect("config");
    assert!(!text.contains("protocol kernel"), "BIRD writes no kernel routes, so it needs no NET_ADMIN");

    // The loop the announcer process runs follows the latest set, and stops on cancel.
    let (tx, rx) = watch::channel(attributed);
    let cancel = CancellationToken::new();
    let (sessions, mut read) = watch::channel(Vec::new());
    let task = tokio::spawn(bird::run(announcer, rx, sessions, cancel.clone()));
    tx.send(set(&["203.0.113.12", "2001:db8:cc::11"])).expect("loop running");
    until_routes(&router_socket, "the loop's change", |r| {
        r.contains("203.0.113.12/32") && !r.contains("203.0.113.11/32")
    })
    .await;
    // The loop publishes the sessions as BIRD reports them (issue 47 item 1): both established;
    // the router's BIRD killed, both lost, with BIRD's state; the router back, both again.
    let all =
        |want: bool| move |s: &Vec<bgp_sessions::Session>| s.len() == 2 && s.iter().all(|x| x.established() == want);
    let wait_sessions = |read: &mut watch::Receiver<Vec<bgp_sessions::Session>>, want: bool| {
        let mut read = read.clone();
        async move {
            let start = Instant::now();
            let seen = tokio::time::timeout(WAIT, read.wait_for(all(want)))
                .await
                .expect("sessions in time")
                .expect("loop running")
                .clone();
            (seen, start.elapsed())
        }
    };
    let (up, _) = wait_sessions(&mut read, true).await;
    assert_eq!(up.iter().map(|s| s.peer.to_string()).collect::<Vec<_>>(), [ROUTER6, ROUTER4], "in the config's order");
    let mut router = lab.birds.remove(0);
    let _ = router.kill();
    let _ = router.wait();
    let (down, lost_after) = wait_sessions(&mut read, false).await;
    assert!(down.iter().all(|s| ["Active", "Connect", "Idle", "OpenSent"].contains(&s.state.as_str())), "{down:?}");
    lab.start_bird(&router_ns, &router_config, &router_socket, false);
    let (_, back_after) = wait_sessions(&mut read, true).await;
    cancel.cancel();
    tokio::time::timeout(WAIT, task).await.expect("the loop stops on cancel").expect("no panic");

    eprintln!(
        "BGP session state read every {} ms: the router's BIRD killed to both sessions published lost {} ms ({:?}); restarted to both published established {} ms",
        bird::SESSION_POLL.as_millis(),
        lost_after.as_millis(),
        down.iter().map(|s| format!("{} {} {}", s.peer, s.state, s.detail)).collect::<Vec<_>>(),
        back_after.as_millis()
    );
    eprintln!(
        "BGP via BIRD (node BIRD as uid 65532 with no capability, listening on 1790): sessions up and first routes on the router {} ms after BIRD start; announce to route on the router {} ms; announce to withdrawal {} ms; sessions kept across the reloads",
        session_up.as_millis(),
        to_route.as_millis(),
        to_withdrawal.as_millis()
    );
}

/// The announcer process's loop feeds BGP the addresses each node should advertise, on both API
/// server backends (no BIRD needed: the test reads the channel `bird::run` would follow).
mod announcer_feeds_bgp {
    use std::collections::BTreeSet;
    use std::net::IpAddr;
    use std::time::Duration;

    use ccm_provider_baremetal::announce::announcer::{self, AnnouncerSettings};
    use ccm_provider_baremetal::announce::bgp::Advertisement;
    use ccm_provider_baremetal::announce::guard::Facts;
    use ccm_provider_baremetal::ipam::IpBlock;
    use k8s_openapi::api::core::v1::Service;
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    use kube::api::{Api, Patch, PatchParams, PostParams};
    use serde_json::json;
    use testkit::{ServiceFixture, TestCluster, lb_service};
    use tokio::sync::watch;
    use tokio_util::sync::CancellationToken;

    /// A class of this test's own, so that on a shared genuine server only its Service counts.
    const CLASS: &str = "ccm.rs/bgp-announcer-test";
    const WAIT: Duration = Duration::from_secs(20);

    fn start(
        client: &kube::Client,
        namespace: &str,
        node: &str,
        cancel: &CancellationToken,
    ) -> watch::Receiver<Advertisement> {
        let pools = ["198.51.100.0/24", "2001:db8:bb::/64"].map(|p| IpBlock::parse_cidr(p).expect("pool")).to_vec();
        let mut settings = AnnouncerSettings::new(node, namespace).with_facts(Facts::of_pools(pools));
        settings.class = Some(CLASS.into());
        let (bgp, advertised) = watch::channel(Advertisement::default());
        settings.bgp = Some(bgp);
        let (owned, _) = watch::channel(BTreeSet::new());
        let (client, cancel) = (client.clone(), cancel.clone());
        tokio::spawn(
            async move { announcer::run(client, settings, owned, None, cancel).await.expect("announcer runs") },
        );
        advertised
    }

    async fn advertises(rx: &watch::Receiver<Advertisement>, want: &BTreeSet<IpAddr>) -> bool {
        let mut rx = rx.clone();
        tokio::time::timeout(WAIT, rx.wait_for(|a| a.addresses == *want)).await.is_ok_and(|r| r.is_ok())
    }

    testkit::backend_tests! {
        async fn bgp_gets_every_address_of_a_cluster_service_and_a_local_one_only_where_an_endpoint_is_ready(backend) {
            let cluster = TestCluster::start(backend).await.unwrap();
            let client = cluster.client();
            let namespace = cluster.fresh_namespace("bgp").await.unwrap();
            let services: Api<Service> = Api::namespaced(client.clone(), &namespace);
            let svc = lb_service(&namespace, "web").with_class(CLASS);
            services.create(&PostParams::default(), &svc).await.unwrap();
            let status = json!({"status": {"loadBalancer": {"ingress": [
                {"ip": "198.51.100.7", "ipMode": "VIP"}, {"ip": "2001:db8:bb::7", "ipMode": "VIP"}]}}});
            services.patch_status("web", &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();
            let both: BTreeSet<IpAddr> = ["198.51.100.7".parse().unwrap(), "2001:db8:bb::7".parse().unwrap()].into();
            let none = BTreeSet::new();

            let cancel = CancellationToken::new();
            let (a, b) = (start(&client, &namespace, "node-a", &cancel), start(&client, &namespace, "node-b", &cancel));
            assert!(advertises(&a, &both).await && advertises(&b, &both).await, "Cluster: every node advertises");

            // Local, with a ready endpoint on node-a only.
            let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), &namespace);
            let slice = json!({
                "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"name": "web-1", "labels": {"kubernetes.io/service-name": "web"}},
                "addressType": "IPv4",
                "endpoints": [
                    {"addresses": ["10.1.0.5"], "nodeName": "node-a", "conditions": {"ready": true}},
                    {"addresses": ["10.1.0.6"], "nodeName": "node-b", "conditions": {"ready": false}}],
                "ports": [{"port": 8080, "protocol": "TCP"}],
            });
            slices.create(&PostParams::default(), &serde_json::from_value(slice).unwrap()).await.unwrap();
            let local = json!({"spec": {"externalTrafficPolicy": "Local"}});
            services.patch("web", &PatchParams::default(), &Patch::Merge(&local)).await.unwrap();
            assert!(advertises(&b, &none).await, "Local: node-b has no ready endpoint and withdraws");
            assert!(advertises(&a, &both).await, "Local: node-a keeps advertising");
            cancel.cancel();
        }
    }

    /// The announcer's Lease's `ccm.rs/bgp-sessions`, once it contains `want`.
    async fn sessions_say(
        leases: &kube::Api<k8s_openapi::api::coordination::v1::Lease>,
        lease: &str,
        want: &str,
    ) -> String {
        use ccm_provider_baremetal::announce::bgp_sessions::SESSIONS_ANNOTATION;
        let what = format!("the Lease's sessions saying {want}");
        testkit::eventually_within(&what, WAIT, || async {
            let text = leases.get_opt(lease).await.ok()??.metadata.annotations?.get(SESSIONS_ANNOTATION).cloned()?;
            text.contains(want).then_some(text)
        })
        .await
    }

    /// The note of the first `reason` event on Node `node`, once there.
    async fn node_event(cluster: &TestCluster, node: &str, reason: &str) -> String {
        let what = format!("a {reason} event on the Node");
        testkit::eventually_within(&what, WAIT, || async {
            cluster
                .events(reason)
                .await
                .ok()?
                .into_iter()
                .find_map(|e| (e.regarding.as_ref()?.name.as_deref() == Some(node)).then(|| e.note.unwrap_or_default()))
        })
        .await
    }

    testkit::backend_tests! {
        /// Issue 47 item 1: the sessions `bird::run` publishes are written into the announcer's
        /// Lease (`ccm.rs/bgp-sessions`), a lost one is a Warning on the Node naming the peer,
        /// the state and BIRD's error, and its return a Normal event.
        async fn bgp_sessions_are_written_into_the_lease_and_a_lost_one_is_an_event_on_the_node(backend) {
            use ccm_framework::events::EventSink;
            use ccm_provider_baremetal::announce::announce_reasons::{BGP_SESSION_ESTABLISHED, BGP_SESSION_LOST};
            use ccm_provider_baremetal::announce::announcer::lease_name;
            use ccm_provider_baremetal::announce::bgp_sessions::Session;
            use k8s_openapi::api::coordination::v1::Lease;
            use k8s_openapi::api::core::v1::Node;
            use kube::api::DeleteParams;

            let cluster = TestCluster::start(backend).await.unwrap();
            let client = cluster.client();
            let namespace = cluster.fresh_namespace("bgps").await.unwrap();
            let node = format!("{namespace}-node");
            let nodes: Api<Node> = Api::all(client.clone());
            let object = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}});
            nodes.create(&PostParams::default(), &serde_json::from_value(object).unwrap()).await.unwrap();
            let mut settings = AnnouncerSettings::new(node.clone(), namespace.clone());
            settings.class = Some(CLASS.into());
            let (sessions, read) = watch::channel(Vec::new());
            settings.bgp_sessions = read;
            let (owned, _) = watch::channel(BTreeSet::new());
            let cancel = CancellationToken::new();
            let events = EventSink::spawn(client.clone(), Some(node.clone()), cancel.clone());
            let task = tokio::spawn(announcer::run(client.clone(), settings, owned, Some(events), cancel.clone()));
            let session = |state: &str, detail: &str| Session {
                peer: "192.0.2.1".parse().unwrap(),
                state: state.into(),
                since: "16:01:03.456".into(),
                detail: detail.into(),
            };
            let leases: Api<Lease> = Api::namespaced(client.clone(), &namespace);
            let lease = lease_name(&node);
            sessions.send_replace(vec![session("Established", "")]);
            let text = sessions_say(&leases, &lease, "Established").await;
            assert_eq!(text, r#"[{"peer":"192.0.2.1","state":"Established","since":"16:01:03.456"}]"#);
            sessions.send_replace(vec![session("Active", "Socket: Connection refused")]);
            sessions_say(&leases, &lease, "Active").await;
            let note = node_event(&cluster, &node, BGP_SESSION_LOST).await;
            assert!(note.contains("BGP session with 192.0.2.1 is Active (was Established): Socket: Connection refused"), "{note}");
            assert!(cluster.events(BGP_SESSION_ESTABLISHED).await.unwrap().iter().all(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) != Some(node.as_str())),
                "coming up at start is no event");
            sessions.send_replace(vec![session("Established", "")]);
            sessions_say(&leases, &lease, "Established").await;
            let note = node_event(&cluster, &node, BGP_SESSION_ESTABLISHED).await;
            assert!(note.contains("BGP session with 192.0.2.1 is Established again"), "{note}");
            cancel.cancel();
            task.await.unwrap().unwrap();
            let _ = nodes.delete(&node, &DeleteParams::default()).await;
        }
    }
}
