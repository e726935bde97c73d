//! BGP announcement through BIRD, in network namespaces this test creates (issue 27 items 3 and
//! 5): a "node" namespace runs BIRD on the config our announcer renders and reloads, as the
//! announcer pod's sidecar runs it (uid 65532, no capability); a "router" namespace runs a second BIRD peering with it
//! over a veth pair, over IPv4 (with a TCP-MD5 password) and IPv6. Needs root and BIRD 2
//! (`apt-get install bird2`); otherwise it prints `SKIPPED` and returns.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ccm_provider_baremetal::announce::bgp::bird::{self, BgpError, BirdAnnouncer, BirdSettings, Changed};
use ccm_provider_baremetal::announce::bgp::{Advertisement, BgpConfig, NodeFacts, PeerConfig, protocol_name};
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

    fn new() -> Self {
        let id = format!("{}", std::process::id() % 100_000);
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
        let mut command = Command::new("ip");
        command.args(["netns", "exec", ns]);
        if least_privilege {
            command.args([
                "setpriv",
                "--reuid=65532",
                "--regid=65532",
                "--clear-groups",
                "--inh-caps=-all",
                "--bounding-set=-all",
            ]);
        }
        command.arg("bird").arg("-f").arg("-c").arg(config).arg("-s").arg(socket);
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
    Advertisement { addresses, prefixes }
}

fn peer(address: &str, password_file: Option<PathBuf>) -> PeerConfig {
    PeerConfig {
        address: address.parse().expect("ip"),
        asn: 64513,
        port: None,
        password_file,
        hold_time: None,
        multihop: None,
    }
}

#[tokio::test]
async fn bgp_host_routes_reach_a_bird_router_and_are_withdrawn_with_sessions_kept_across_reloads() {
    if let Some(reason) = missing_prerequisite() {
        eprintln!("SKIPPED: {reason}");
        return;
    }
    let mut lab = Lab::new();
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

    // The pod's shared volume: group 65532 (its fsGroup), group-writable, so BIRD reads the
    // config the announcer writes and makes its socket there.
    let shared = lab.dir.join("node");
    std::fs::create_dir_all(&shared).expect("shared dir");
    std::os::unix::fs::chown(&shared, Some(0), Some(65532)).expect("chown the shared dir");
    std::fs::set_permissions(&shared, std::os::unix::fs::PermissionsExt::from_mode(0o2770)).expect("chmod");
    let settings = BirdSettings {
        config_path: shared.join("bird.conf"),
        socket_path: shared.join("bird.ctl"),
        timeout: Duration::from_secs(5),
    };
    let config = BgpConfig {
        local_asn: 64512,
        peers: vec![peer(ROUTER6, None), peer(ROUTER4, Some(password_file))],
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

    assert_eq!(established_since(&router_socket, "node4").await, Some(since4), "IPv4 session kept across reloads");
    assert_eq!(established_since(&router_socket, "node6").await, Some(since6), "IPv6 session kept across reloads");
    let text = std::fs::read_to_string(&settings.config_path).expect("config");
    assert!(!text.contains("protocol kernel"), "BIRD writes no kernel routes, so it needs no NET_ADMIN");

    // The loop the announcer process runs follows the latest set, and stops on cancel.
    let (tx, rx) = watch::channel(fewer);
    let cancel = CancellationToken::new();
    let task = tokio::spawn(bird::run(announcer, rx, cancel.clone()));
    tx.send(set(&["203.0.113.12", "2001:db8:cc::11"])).expect("loop running");
    until_routes(&router_socket, "the loop's change", |r| {
        r.contains("203.0.113.12/32") && !r.contains("203.0.113.11/32")
    })
    .await;
    cancel.cancel();
    tokio::time::timeout(WAIT, task).await.expect("the loop stops on cancel").expect("no panic");

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
}
