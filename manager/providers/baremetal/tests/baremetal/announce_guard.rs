//! Issue 45 item 3, on a real (namespaced) Ethernet segment with BIRD: an address written by
//! hand into a Service's status and outside the pools is never answered by ARP or NDP and never
//! advertised over BGP, while a pool address beside it is. The whole announcer runs (its loop on
//! the local API server, the responder and BIRD in a "node" namespace); a "client" namespace on
//! the same bridge resolves the addresses and runs the BGP router. Needs root and BIRD 2; prints
//! `SKIPPED:` otherwise. Namespaces, BIRD processes and files go when the test ends.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::bgp_bird::{missing_prerequisite, router_routes};
use crate::l2_announce::{Namespaces, cannot_run, in_ns, must, neighbour, serve, sysctl, who_answers};
use ccm_framework::events::EventSink;
use ccm_provider_baremetal::announce::announce_reasons::ANNOUNCEMENT_REFUSED;
use ccm_provider_baremetal::announce::announcer::{self, AnnouncerSettings};
use ccm_provider_baremetal::announce::bgp::bird::{self, BirdAnnouncer, BirdSettings};
use ccm_provider_baremetal::announce::bgp::{Advertisement, BgpConfig, NodeFacts, PeerConfig};
use ccm_provider_baremetal::announce::guard::Facts;
use ccm_provider_baremetal::announce::responder::{self, L2Socket};
use ccm_provider_baremetal::ipam::IpBlock;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use testkit::{Backend, ServiceFixture, TestCluster, eventually, lb_service};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

const CLASS: &str = "ccm.rs/announce-guard-test";
const NODE4: &str = "10.253.0.11";
const CLIENT4: &str = "10.253.0.1";
const NODE6: &str = "fd00:253::11";
const CLIENT6: &str = "fd00:253::1";
const PORT: u16 = 8080;

/// BIRD processes and their files, stopped and removed on drop.
struct Birds(Vec<Child>, PathBuf);

impl Drop for Birds {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.1);
    }
}

fn bird_in(ns: &str, config: &std::path::Path, socket: &std::path::Path) -> Child {
    Command::new("ip")
        .args(["netns", "exec", ns, "bird", "-f", "-c"])
        .arg(config)
        .arg("-s")
        .arg(socket)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start bird")
}

fn peer(address: &str) -> PeerConfig {
    PeerConfig {
        address: address.parse().expect("ip"),
        asn: 64513,
        port: None,
        password_file: None,
        hold_time: None,
        multihop: None,
        bfd: None,
        graceful_restart: None,
    }
}

/// Whether the client resolves `vip` (a neighbour entry with a link-layer address).
fn resolved(client: &str, vip: IpAddr) -> bool {
    neighbour(client, vip).contains("lladdr")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_written_address_outside_the_pools_is_never_answered_by_arp_or_ndp_nor_advertised_over_bgp() {
    if let Some(reason) = cannot_run().or_else(|| missing_prerequisite().map(String::from)) {
        eprintln!("SKIPPED: {reason}");
        return;
    }
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().subsec_nanos();
    let prefix = format!("ccmg-{}-{}", std::process::id() % 10_000, nanos % 10_000);
    let [sw, node, client] = ["sw", "n", "c"].map(|n| format!("{prefix}-{n}"));
    let _cleanup = Namespaces(vec![sw.clone(), node.clone(), client.clone()]);
    for ns in [&sw, &node, &client] {
        must(&["netns", "add", ns]);
    }
    must(&["-n", &sw, "link", "add", "br0", "type", "bridge", "mcast_snooping", "0"]);
    must(&["-n", &sw, "link", "set", "br0", "up"]);
    for (i, (ns, v4, v6)) in [(&node, NODE4, NODE6), (&client, CLIENT4, CLIENT6)].into_iter().enumerate() {
        let port = format!("p{i}");
        must(&["-n", &sw, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns", ns]);
        must(&["-n", &sw, "link", "set", &port, "master", "br0", "up"]);
        must(&["-n", ns, "link", "set", "eth0", "up"]);
        must(&["-n", ns, "link", "set", "lo", "up"]);
        must(&["-n", ns, "addr", "add", &format!("{v4}/24"), "dev", "eth0"]);
        must(&["-n", ns, "addr", "add", &format!("{v6}/64"), "dev", "eth0", "nodad"]);
    }
    let ip = |s: &str| s.parse::<IpAddr>().expect("ip");
    let (inside4, inside6) = (ip("10.253.0.100"), ip("fd00:253::100"));
    let (outside4, outside6, far) = (ip("10.253.0.200"), ip("fd00:253::200"), ip("198.51.100.9"));
    // The node takes traffic for every one of them, as kube-proxy would for whatever a
    // Service's status says; only an announcement can bring a client's packets to it.
    sysctl(&node, "net.ipv4.conf.all.arp_ignore", "1");
    sysctl(&node, "net.ipv4.conf.all.arp_announce", "2");
    sysctl(&node, "net.ipv6.ip_nonlocal_bind", "1");
    for vip in [inside4, outside4] {
        must(&["-n", &node, "route", "add", "local", &format!("{vip}/32"), "dev", "lo"]);
    }
    for vip in [inside6, outside6] {
        must(&["-n", &node, "-6", "route", "add", "local", &format!("{vip}/128"), "dev", "lo"]);
    }
    let listeners = in_ns(&node, move || {
        [inside4, inside6, outside4, outside6].map(|vip| TcpListener::bind(SocketAddr::new(vip, PORT)).expect("bind"))
    });
    for listener in listeners {
        serve(listener, "node");
    }

    // Services: one holding pool addresses, one whose status was written by hand.
    let cluster = TestCluster::start(Backend::Local).await.expect("the API server");
    let kube = cluster.client();
    let namespace = cluster.fresh_namespace("guard").await.expect("a namespace");
    let services: Api<Service> = Api::namespaced(kube.clone(), &namespace);
    for (name, ips) in [("inside", vec![inside4, inside6]), ("outside", vec![outside4, outside6, far])] {
        services.create(&PostParams::default(), &lb_service(&namespace, name).with_class(CLASS)).await.unwrap();
        let ingress: Vec<serde_json::Value> =
            ips.iter().map(|ip| json!({"ip": ip.to_string(), "ipMode": "VIP"})).collect();
        let status = json!({"status": {"loadBalancer": {"ingress": ingress}}});
        services.patch_status(name, &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();
    }

    // The router: the client's BIRD, taking every route the node sends.
    let dir = std::env::temp_dir().join(format!("ccm-guard-{prefix}"));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let mut birds = Birds(Vec::new(), dir.clone());
    let (router_config, router_socket) = (dir.join("router.conf"), dir.join("router.ctl"));
    std::fs::write(
        &router_config,
        format!(
            "router id {CLIENT4};\nprotocol device {{}}\n\
             protocol bgp node4 {{ local as 64513; neighbor {NODE4} as 64512; connect delay time 1; connect retry time 1; ipv4 {{ import all; export none; }}; }}\n\
             protocol bgp node6 {{ local as 64513; neighbor {NODE6} as 64512; connect delay time 1; connect retry time 1; ipv6 {{ import all; export none; }}; }}\n"
        ),
    )
    .expect("router config");
    birds.0.push(bird_in(&client, &router_config, &router_socket));

    // The announcer: its loop on the API server, its responder and BIRD in the node namespace.
    let cancel = CancellationToken::new();
    let pools = ["10.253.0.96/28", "fd00:253::100/125"].map(|p| IpBlock::parse_cidr(p).expect("pool")).to_vec();
    let mut settings = AnnouncerSettings::new("node", &namespace).with_facts(Facts::of_pools(pools));
    settings.class = Some(CLASS.into());
    (settings.lease_duration, settings.renew_interval, settings.settle) =
        (Duration::from_secs(2), Duration::from_millis(500), Duration::from_millis(200));
    let (bgp, advertised) = watch::channel(Advertisement::default());
    settings.bgp = Some(bgp);
    let bird_settings = BirdSettings {
        config_path: dir.join("node.conf"),
        socket_path: dir.join("node.ctl"),
        timeout: Duration::from_secs(5),
    };
    let bgp_config = BgpConfig { local_asn: 64512, peers: vec![peer(CLIENT4), peer(CLIENT6)], ..BgpConfig::default() };
    let node_facts = NodeFacts { ipv4: Some(NODE4.parse().expect("ip")) };
    let announcer_bird = BirdAnnouncer::new(bgp_config, node_facts, bird_settings.clone());
    let (sessions, _) = watch::channel(Vec::new());
    tokio::spawn(bird::run(announcer_bird, advertised, sessions, cancel.clone()));
    let (owned_tx, owned) = watch::channel(BTreeSet::new());
    let socket = in_ns(&node, || L2Socket::open("eth0")).expect("the packet socket");
    let responder = tokio::spawn(responder::run(socket, owned.clone(), cancel.clone()));
    let events = EventSink::spawn(kube.clone(), Some("node".into()), cancel.clone());
    let started = Instant::now();
    let task = tokio::spawn({
        let (kube, cancel) = (kube.clone(), cancel.clone());
        async move { announcer::run(kube, settings, owned_tx, Some(events), cancel).await.expect("announcer runs") }
    });
    // BIRD starts once its first config is written (as the sidecar waits for it).
    let written = async {
        while !bird_settings.config_path.exists() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(20), written).await.expect("the announcer writes BIRD's config");
    birds.0.push(bird_in(&node, &bird_settings.config_path, &bird_settings.socket_path));

    // The pool addresses: answered by ARP and NDP, reached, and learned by the router.
    for vip in [inside4, inside6] {
        let c = client.clone();
        let answer = tokio::task::spawn_blocking(move || {
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                let answer = in_ns(&c, move || who_answers(vip));
                if answer.is_some() || Instant::now() > deadline {
                    return answer;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        })
        .await
        .unwrap();
        assert_eq!(answer.as_deref(), Some("node"), "{vip} of the pool is answered and reached");
    }
    let reached = started.elapsed();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let routes = router_routes(&router_socket).await;
        if routes.contains("10.253.0.100/32") && routes.contains("fd00:253::100/128") {
            break;
        }
        assert!(Instant::now() < deadline, "the router never learned the pool addresses:\n{routes}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let advertised_after = started.elapsed();

    // The hand-written addresses: never answered (so never reached), never advertised, and the
    // Service says why.
    for vip in [outside4, outside6] {
        let c = client.clone();
        let answer = tokio::task::spawn_blocking(move || {
            (0..5).find_map(|_| {
                let answer = in_ns(&c, move || who_answers(vip));
                std::thread::sleep(Duration::from_millis(200));
                answer
            })
        })
        .await
        .unwrap();
        assert_eq!(answer, None, "{vip} outside the pools was reached");
        assert!(!resolved(&client, vip), "{vip} outside the pools was answered: {}", neighbour(&client, vip));
    }
    assert!(resolved(&client, inside4) && resolved(&client, inside6), "the pool addresses stay resolved");
    let routes = router_routes(&router_socket).await;
    for vip in ["10.253.0.200/32", "fd00:253::200/128", "198.51.100.9/32"] {
        assert!(!routes.contains(vip), "{vip} outside the pools was advertised:\n{routes}");
    }
    let text = std::fs::read_to_string(&bird_settings.config_path).expect("BIRD's config");
    for vip in ["10.253.0.200", "fd00:253::200", "198.51.100.9"] {
        assert!(!text.contains(vip), "{vip} is in BIRD's config");
    }
    assert!(text.contains("net ~ [ 10.253.0.96/28{32,32} ]"), "the export filter holds the pool: {text}");
    assert_eq!(*owned.borrow(), BTreeSet::from([inside4, inside6]), "only the pool addresses are owned");
    let events: Api<Event> = Api::namespaced(kube.clone(), &namespace);
    let note = eventually("an AnnouncementRefused event on the hand-written Service", || async {
        events.list(&ListParams::default()).await.ok()?.items.into_iter().find_map(|e| {
            (e.reason.as_deref() == Some(ANNOUNCEMENT_REFUSED)
                && e.regarding.as_ref()?.name.as_deref() == Some("outside"))
            .then(|| e.note.unwrap_or_default())
        })
    })
    .await;
    for vip in ["10.253.0.200", "fd00:253::200", "198.51.100.9"] {
        assert!(note.contains(&format!("{vip} is not announced: it is in no load-balancer pool")), "{note}");
    }
    eprintln!(
        "announcement guard: pool addresses answered after {} ms and advertised after {} ms; the hand-written ones never answered nor advertised",
        reached.as_millis(),
        advertised_after.as_millis()
    );
    cancel.cancel();
    task.await.unwrap();
    responder.await.unwrap().expect("the responder ran without error");
}
