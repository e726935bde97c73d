//! Self-healing announcers (issue 47 item 4, docs/l2-announcement.md#self-healing): an
//! announcer whose interface goes down gives its addresses up while its Lease is still renewed,
//! says why on its Lease and Node, stops advertising them over BGP, and takes them back when the
//! interface is up again; a client on the segment follows both moves. And kube-proxy's health check as the probe makes it, against
//! a stand-in endpoint that turns unhealthy and back.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

use ccm_provider_baremetal::announce::health::{Health, HealthzTarget, parse_healthz};
use ccm_provider_baremetal::announce::health_probe::{self, Monitor};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// A stand-in for kube-proxy's health endpoint answering with the status in `status` (0: read
/// the request and never answer).
async fn switchable_healthz(status: Arc<AtomicU16>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let status = status.load(Ordering::SeqCst);
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                let _ = stream.read(&mut buf).await;
                if status == 0 {
                    tokio::time::sleep(Duration::from_secs(30)).await;
                    return;
                }
                let body = if status == 200 { "ok" } else { "unhealthy" };
                let answer = format!("HTTP/1.1 {status} X\r\nContent-Length: {}\r\n\r\n{body}", body.len());
                let _ = stream.write_all(answer.as_bytes()).await;
            });
        }
    });
    addr
}

fn target(addr: SocketAddr) -> HealthzTarget {
    parse_healthz(&format!("http://{addr}/healthz"), None).expect("a valid URL")
}

#[tokio::test]
async fn the_kube_proxy_probe_tells_healthy_from_unhealthy_silent_and_absent() {
    let status = Arc::new(AtomicU16::new(200));
    let addr = switchable_healthz(status.clone()).await;
    let short = Duration::from_millis(300);
    assert_eq!(health_probe::kube_proxy(&target(addr), short).await, Ok(()));
    status.store(503, Ordering::SeqCst);
    assert_eq!(health_probe::kube_proxy(&target(addr), short).await, Err("answered HTTP 503".into()));
    status.store(0, Ordering::SeqCst);
    assert_eq!(health_probe::kube_proxy(&target(addr), short).await, Err("no answer within 300 ms".into()));
    // A port nobody listens on: bind one, note it, close it.
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
    let refused = health_probe::kube_proxy(&target(closed), short).await.unwrap_err();
    assert!(refused.starts_with("cannot connect"), "{refused}");
}

#[tokio::test]
async fn the_monitor_turns_unhealthy_after_two_failed_kube_proxy_checks_and_healthy_after_one_success() {
    let status = Arc::new(AtomicU16::new(200));
    let addr = switchable_healthz(status.clone()).await;
    let interval = Duration::from_millis(100);
    let monitor = Monitor { links: Vec::new(), responders: Vec::new(), kube_proxy: Some(target(addr)), interval };
    let cancel = tokio_util::sync::CancellationToken::new();
    let mut health = health_probe::spawn(monitor, cancel.clone());
    tokio::time::sleep(Duration::from_millis(350)).await;
    assert_eq!(*health.borrow(), Health::Healthy);
    let t0 = Instant::now();
    status.store(503, Ordering::SeqCst);
    let reason = tokio::time::timeout(Duration::from_secs(5), health.wait_for(|h| !h.is_healthy()))
        .await
        .expect("unhealthy within 5 s")
        .unwrap()
        .reason()
        .unwrap();
    let down = t0.elapsed();
    assert_eq!(reason, "kube-proxy's health check failed 2 times in a row: answered HTTP 503");
    assert!(down >= interval, "two checks, an interval apart, took only {down:?}");
    let t1 = Instant::now();
    status.store(200, Ordering::SeqCst);
    tokio::time::timeout(Duration::from_secs(5), health.wait_for(Health::is_healthy))
        .await
        .expect("healthy again")
        .unwrap();
    eprintln!(
        "kube-proxy health (100 ms interval): unhealthy {} ms after it started failing, healthy {} ms after it recovered",
        down.as_millis(),
        t1.elapsed().as_millis()
    );
    cancel.cancel();
}

/// Issue 47 item 4, a responder alive but deaf: the kernel unbinds a packet socket from an
/// interface that is removed, for good, so a responder whose interface was deleted and created
/// again under the same name (a bond or VLAN re-created, a veth replaced) kept running, its
/// interface up again by name, and answered nothing. It now re-binds to the new interface and
/// announces again with the new hardware address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_responder_follows_its_interface_when_it_is_deleted_and_created_again() {
    use ccm_provider_baremetal::announce::responder::{self, FOLLOW_INTERVAL, L2Socket};
    use tokio::sync::watch;
    use tokio_util::sync::CancellationToken;

    use crate::l2_announce::{cannot_run, in_ns, mac_of, must, neighbour, reached, segment};

    if let Some(reason) = cannot_run() {
        eprintln!("SKIPPED: {reason}");
        return;
    }
    const NODES: [&str; 2] = ["recreated-a", "recreated-b"];
    let vip: IpAddr = "10.254.0.150".parse().expect("ip");
    let segment = segment("ccml2r", NODES, &[vip]);
    let (a, sw, c) = (segment.nodes[0].clone(), segment.switch.clone(), segment.client.clone());
    let socket = in_ns(&a, || L2Socket::open("eth0")).expect("open the packet socket");
    let (_owned, rx) = watch::channel(BTreeSet::from([vip]));
    let cancel = CancellationToken::new();
    let task = tokio::spawn(responder::run(socket, rx, cancel.clone()));
    let wait = Duration::from_secs(10);
    assert!(
        reached(&c, vip, NODES[0].into(), Instant::now(), wait).await.is_some(),
        "{vip} first reaches {}",
        NODES[0]
    );

    // The node's eth0 deleted (with its veth peer on the switch) and created again, with another
    // hardware address; the client forgets the old one.
    must(&["-n", &sw, "link", "del", "p0"]);
    let t0 = Instant::now();
    must(&["-n", &sw, "link", "add", "p0", "type", "veth", "peer", "name", "eth0", "netns", &a]);
    must(&["-n", &sw, "link", "set", "p0", "master", "br0", "up"]);
    let new_mac = "02:00:00:00:00:31";
    assert_ne!(new_mac, mac_of(0));
    must(&["-n", &a, "link", "set", "eth0", "address", new_mac, "up"]);
    must(&["-n", &a, "addr", "add", "10.254.0.11/24", "dev", "eth0"]);
    must(&["-n", &c, "neigh", "flush", "all"]);
    let took = reached(&c, vip, NODES[0].into(), t0, wait).await;
    let entry = neighbour(&c, vip);
    let took = took.unwrap_or_else(|| panic!("{vip} not answered on the re-created interface: {entry:?}"));
    assert!(entry.contains(new_mac), "{vip} resolves to the new interface's address: {entry:?}");
    eprintln!(
        "L2 responder: interface deleted and created again to the client reaching the node through it: {} ms (checked every {} ms)",
        took.as_millis(),
        FOLLOW_INTERVAL.as_millis()
    );
    cancel.cancel();
    task.await.expect("responder task").expect("responder ran without error");
}

/// Issue 47 item 4, a responder that runs but does not answer: its loop held up (here the
/// thread of its runtime blocked, as a blocking call in it would) leaves requests unread. The
/// loop beats a pulse at least every 250 ms even when idle, so an idle responder stays healthy,
/// while one held up past [`RESPONDER_STALL`] makes the node unhealthy, naming it, until it runs
/// again; the requests the kernel dropped meanwhile are counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_responder_held_up_is_unhealthy_after_the_stall_time_and_healthy_when_it_runs_again() {
    use ccm_provider_baremetal::announce::health::RESPONDER_STALL;
    use ccm_provider_baremetal::announce::health_probe::WatchedResponder;
    use ccm_provider_baremetal::announce::responder::{self, FOLLOW_INTERVAL, L2Socket};
    use tokio::sync::watch;
    use tokio_util::sync::CancellationToken;

    use crate::l2_announce::{cannot_run, in_ns, segment};

    if let Some(reason) = cannot_run() {
        eprintln!("SKIPPED: {reason}");
        return;
    }
    const NODES: [&str; 2] = ["held-a", "held-b"];
    let vip: IpAddr = "10.254.0.160".parse().expect("ip");
    let segment = segment("ccml2s", NODES, &[vip]);
    let socket = in_ns(&segment.nodes[0], || L2Socket::open("eth0")).expect("open the packet socket");
    let pulse = socket.pulse();
    // The responder on a runtime of its own, on one thread the test can hold up.
    let (owned_tx, owned) = watch::channel(BTreeSet::from([vip]));
    let cancel = CancellationToken::new();
    let stopped = CancellationToken::new();
    let (spawner, spawned) = std::sync::mpsc::channel::<Box<dyn FnOnce() + Send>>();
    let responder_thread = {
        let (cancel, stopped) = (cancel.clone(), stopped.clone());
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            runtime.block_on(async move {
                let blocker = tokio::task::spawn_blocking(move || spawned.recv().ok());
                let responder = health_probe::watched(responder::run(socket, owned, cancel), stopped);
                let hold = async {
                    // Each function received runs on this thread, holding the runtime up.
                    if let Ok(Some(hold)) = blocker.await {
                        hold();
                    }
                    std::future::pending::<()>().await
                };
                tokio::select! { ran = responder => ran, _ = hold => unreachable!() }
            })
        })
    };
    let interval = Duration::from_millis(100);
    let watched = WatchedResponder { interface: "eth0".into(), stopped, pulse: pulse.clone() };
    let monitor = Monitor { links: Vec::new(), responders: vec![watched], kube_proxy: None, interval };
    let monitor_stop = CancellationToken::new();
    let mut health = health_probe::spawn(monitor, monitor_stop.clone());

    // Idle (no request on the segment) is not held up.
    let idle_until = Instant::now() + Duration::from_millis(1500);
    let mut longest = Duration::ZERO;
    while Instant::now() < idle_until {
        longest = longest.max(pulse.silent_for());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(longest < Duration::from_secs(1), "an idle responder's loop went {longest:?} without a pass");
    assert!(health.borrow().is_healthy(), "{:?}", *health.borrow());

    // Held up for the stall time and more; meanwhile the client asks for 200 neighbours, three
    // ARP requests each, more than the socket's buffer holds.
    let hold_for = RESPONDER_STALL + Duration::from_secs(2);
    let t0 = Instant::now();
    spawner.send(Box::new(move || std::thread::sleep(hold_for))).expect("hold the responder up");
    in_ns(&segment.client, || {
        let udp = std::net::UdpSocket::bind("10.254.0.1:0").expect("bind");
        for host in 20u8..220 {
            // Unresolved neighbours: each datagram makes the kernel ask for its address.
            let _ = udp.send_to(b"x", (std::net::Ipv4Addr::new(10, 254, 0, host), 9));
        }
    });
    let reason = tokio::time::timeout(RESPONDER_STALL * 2, health.wait_for(|h| !h.is_healthy()))
        .await
        .expect("unhealthy while held up")
        .expect("the monitor runs")
        .reason()
        .expect("a reason");
    let detected = t0.elapsed();
    assert!(reason.starts_with("the ARP/NDP responder on eth0 has not read a request for 3."), "{reason}");
    // The loop's last pass came at most one follow interval before the hold began.
    assert!(
        detected + FOLLOW_INTERVAL >= RESPONDER_STALL,
        "unhealthy after {detected:?}, before the stall time since its last pass"
    );
    tokio::time::timeout(hold_for * 2, health.wait_for(Health::is_healthy))
        .await
        .expect("healthy again once it runs")
        .expect("the monitor runs");
    let recovered = t0.elapsed();
    assert!(recovered >= hold_for, "healthy at {recovered:?}, while still held up");
    // The first check after the hold reads the kernel's count.
    let counted = Instant::now() + Duration::from_secs(2);
    while pulse.dropped() == 0 && Instant::now() < counted {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(pulse.dropped() > 0, "requests arrived unread while held up, yet none counted as dropped");
    eprintln!(
        "L2 responder held up {} ms: unhealthy after {} ms (stall time {} ms, checks every {} ms), healthy {} ms after the hold ended; {} requests dropped unread",
        hold_for.as_millis(),
        detected.as_millis(),
        RESPONDER_STALL.as_millis(),
        interval.as_millis(),
        (recovered - hold_for).as_millis(),
        pulse.dropped()
    );
    drop(owned_tx);
    cancel.cancel();
    monitor_stop.cancel();
    responder_thread.join().expect("responder thread").expect("responder ran without error");
}

mod interface_down_on_the_api_server {
    use super::*;

    use ccm_framework::events::EventSink;
    use ccm_provider_baremetal::announce::announce_reasons::{ANNOUNCER_HEALTHY, ANNOUNCER_UNHEALTHY};
    use ccm_provider_baremetal::announce::announcer::{self, AnnouncerSettings, lease_name};
    use ccm_provider_baremetal::announce::bgp::Advertisement;
    use ccm_provider_baremetal::announce::elect;
    use ccm_provider_baremetal::announce::guard::Facts;
    use ccm_provider_baremetal::announce::health::UNHEALTHY_ANNOTATION;
    use ccm_provider_baremetal::announce::health_probe::LinkProbe;
    use ccm_provider_baremetal::announce::responder::{self, L2Socket};
    use ccm_provider_baremetal::ipam::IpBlock;
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::api::core::v1::{Node, Service};
    use k8s_openapi::api::events::v1::Event;
    use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
    use serde_json::json;
    use testkit::{ServiceFixture, TestCluster, eventually, lb_service};
    use tokio::sync::watch;
    use tokio_util::sync::CancellationToken;

    use crate::l2_announce::{cannot_run, in_ns, must, reached, segment};

    const CLASS: &str = "ccm.rs/l2-health-test";

    /// The note of the newest event of `reason` on Node `node`, once there is one.
    async fn node_event(events: &Api<Event>, node: &str, reason: &str) -> String {
        eventually(&format!("a {reason} event on Node {node}"), || async {
            events.list(&ListParams::default()).await.ok()?.items.into_iter().find_map(|e| {
                (e.reason.as_deref() == Some(reason) && e.regarding.as_ref()?.name.as_deref() == Some(node))
                    .then(|| e.note.unwrap_or_default())
            })
        })
        .await
    }

    testkit::backend_tests! {
        async fn an_announcer_whose_interface_goes_down_gives_its_addresses_up_says_why_and_takes_them_back(backend) {
            if let Some(reason) = cannot_run() {
                eprintln!("SKIPPED: {reason}");
                return;
            }
            let cluster = TestCluster::start(backend).await.unwrap();
            let client = cluster.client();
            let namespace = cluster.fresh_namespace("l2-health").await.unwrap();
            // Node names of this run's own (Nodes are cluster-wide), so its events are its own.
            let names: [&'static str; 2] =
                [format!("{namespace}-a"), format!("{namespace}-b")].map(|n| &*Box::leak(n.into_boxed_str()));
            let nodes: Api<Node> = Api::all(client.clone());
            for name in names {
                nodes.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": name}})).unwrap()).await.unwrap();
            }
            let (v4, v6) = (100u8..250)
                .map(|n| (IpAddr::from([10, 254, 0, n]), format!("fd00:254::{n}").parse::<IpAddr>().unwrap()))
                .find(|(v4, v6)| elect::elect(*v4, names) == elect::elect(*v6, names))
                .expect("a pair with one owner");
            let owner = elect::elect(v4, names).unwrap();
            let other = names.into_iter().find(|n| *n != owner).unwrap();
            let services: Api<Service> = Api::namespaced(client.clone(), &namespace);
            services.create(&PostParams::default(), &lb_service(&namespace, "web").with_class(CLASS)).await.unwrap();
            let status = json!({"status": {"loadBalancer": {"ingress": [
                {"ip": v4.to_string(), "ipMode": "VIP"}, {"ip": v6.to_string(), "ipMode": "VIP"}]}}});
            services.patch_status("web", &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();

            // Each node: a responder on its eth0, a health monitor probing that eth0 every
            // 100 ms, and an announcer (in this process, talking to the API server).
            let segment = segment("ccml2h", names, &[v4, v6]);
            let cancel = CancellationToken::new();
            let mut tasks = Vec::new();
            let mut owned = Vec::new();
            for (ns, name) in segment.nodes.iter().zip(names) {
                let socket = in_ns(ns, || L2Socket::open("eth0")).expect("open the packet socket");
                let link = in_ns(ns, || LinkProbe::open("eth0")).expect("open the link probe");
                let pulse = socket.pulse();
                let (tx, rx) = watch::channel(BTreeSet::<IpAddr>::new());
                let stopped = CancellationToken::new();
                let responder = health_probe::watched(responder::run(socket, rx.clone(), cancel.clone()), stopped.clone());
                tasks.push(tokio::spawn(async move { responder.await.expect("responder runs"); }));
                let monitor = Monitor {
                    links: vec![link],
                    responders: vec![health_probe::WatchedResponder {
                        interface: "eth0".into(),
                        stopped,
                        pulse,
                    }],
                    kube_proxy: None,
                    interval: Duration::from_millis(100),
                };
                let pools = ["10.254.0.0/24", "fd00:254::/64"].map(|p| IpBlock::parse_cidr(p).expect("pool")).to_vec();
                let mut settings = AnnouncerSettings::new(name, &namespace).with_facts(Facts::of_pools(pools));
                settings.class = Some(CLASS.into());
                (settings.lease_duration, settings.renew_interval, settings.settle) =
                    (Duration::from_secs(2), Duration::from_millis(500), Duration::from_secs(1));
                settings.health = health_probe::spawn(monitor, cancel.clone());
                let (bgp, advertised) = watch::channel(Advertisement::default());
                settings.bgp = Some(bgp);
                let events = EventSink::spawn(client.clone(), Some(name.into()), cancel.clone());
                let (client, cancel) = (client.clone(), cancel.clone());
                tasks.push(tokio::spawn(async move {
                    announcer::run(client, settings, tx, Some(events), cancel).await.expect("announcer runs")
                }));
                owned.push((name, rx, advertised));
            }
            let wait = Duration::from_secs(20);
            let c = segment.client.clone();
            for vip in [v4, v6] {
                assert!(reached(&c, vip, owner.into(), Instant::now(), wait).await.is_some(), "{vip} first reaches {owner}");
            }

            // The owner's interface goes down; its Lease is still renewed (the API server is
            // reached another way), yet the other node takes the addresses and the client follows.
            let owner_ns = &segment.nodes[names.iter().position(|n| *n == owner).unwrap()];
            let t0 = Instant::now();
            must(&["-n", owner_ns, "link", "set", "eth0", "down"]);
            let moved = tokio::join!(reached(&c, v4, other.into(), t0, wait), reached(&c, v6, other.into(), t0, wait));
            let down = [(v4, moved.0), (v6, moved.1)].map(|(vip, took)| took.unwrap_or_else(|| panic!("{vip} never moved to {other}")));
            let (_, owner_owned, owner_bgp) = owned.iter().find(|(n, _, _)| *n == owner).unwrap();
            assert!(owner_owned.borrow().is_empty(), "the unhealthy owner answers for nothing");
            assert!(owner_bgp.borrow().addresses.is_empty(), "and advertises nothing over BGP");
            let (_, _, other_bgp) = owned.iter().find(|(n, _, _)| *n == other).unwrap();
            assert_eq!(other_bgp.borrow().addresses, BTreeSet::from([v4, v6]), "the healthy node still advertises both");
            let leases: Api<Lease> = Api::namespaced(client.clone(), &namespace);
            let lease = leases.get(&lease_name(owner)).await.unwrap();
            let why = lease.metadata.annotations.unwrap_or_default().remove(UNHEALTHY_ANNOTATION);
            assert_eq!(why.as_deref(), Some("interface eth0 is down"), "the Lease says why");
            let node_events: Api<Event> = Api::namespaced(client.clone(), "default");
            let note = node_event(&node_events, owner, ANNOUNCER_UNHEALTHY).await;
            assert!(note.contains(&format!("node {owner} gives up 2 announced address(es)")) && note.contains("interface eth0 is down"), "{note}");

            // Up again: it settles like a newcomer, wins its addresses back, and the client follows.
            let t1 = Instant::now();
            must(&["-n", owner_ns, "link", "set", "eth0", "up"]);
            let back = tokio::join!(reached(&c, v4, owner.into(), t1, wait), reached(&c, v6, owner.into(), t1, wait));
            let up = [(v4, back.0), (v6, back.1)].map(|(vip, took)| took.unwrap_or_else(|| panic!("{vip} never came back to {owner}")));
            let mut owner_bgp = owner_bgp.clone();
            // A bool, not the `Ref`: holding the channel's read lock would block the announcer's
            // next send (its write lock) and so its task, for good.
            let advertised_again =
                tokio::time::timeout(wait, owner_bgp.wait_for(|a| a.addresses.len() == 2)).await.is_ok_and(|r| r.is_ok());
            assert!(advertised_again, "healthy again: the owner advertises both over BGP");
            let lease = leases.get(&lease_name(owner)).await.unwrap();
            assert!(!lease.metadata.annotations.unwrap_or_default().contains_key(UNHEALTHY_ANNOTATION), "healthy: the annotation is gone");
            let note = node_event(&node_events, owner, ANNOUNCER_HEALTHY).await;
            assert!(note.contains("healthy again"), "{note}");
            eprintln!(
                "L2 self-healing ({backend:?}): interface down to the client reaching the other node: IPv4 {} ms, IPv6 {} ms; up again to the owner answering: IPv4 {} ms, IPv6 {} ms (checks every 100 ms, settle 1 s)",
                down[0].as_millis(), down[1].as_millis(), up[0].as_millis(), up[1].as_millis()
            );
            cancel.cancel();
            for task in tasks {
                task.await.unwrap();
            }
            for name in names {
                nodes.delete(name, &Default::default()).await.unwrap();
            }
        }
    }
}
