//! L2 announcement on a real (namespaced) Ethernet segment: two "node" namespaces each run a
//! responder on a bridge shared with a client namespace. The client resolves the address by ARP
//! and NDP and connects to the elected node; then the owner stops gracefully and the client
//! follows the other node's gratuitous ARP / unsolicited NA. Needs root (network namespaces);
//! prints one `SKIPPED:` line otherwise. Everything lives in namespaces the test creates and
//! deletes (a guard deletes them on panic too); no host interface is touched.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::process::Command;
use std::time::{Duration, Instant};

use ccm_provider_baremetal::announce::elect;
use ccm_provider_baremetal::announce::responder::{self, L2Socket};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

const NODES: [&str; 2] = ["node-a", "node-b"];
const PORT: u16 = 8080;

/// Runs `ip` with `args`; the error carries its stderr.
fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip").args(args).output().map_err(|e| format!("ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

pub(crate) fn must(args: &[&str]) {
    if let Err(e) = ip(args) {
        panic!("{e}");
    }
}

/// The namespaces of one test run, deleted when dropped (also while panicking).
pub(crate) struct Namespaces(pub(crate) Vec<String>);

impl Drop for Namespaces {
    fn drop(&mut self) {
        for ns in &self.0 {
            let _ = ip(&["netns", "del", ns]);
        }
    }
}

/// Runs `f` on a thread that entered namespace `ns`; sockets it opens stay in `ns`.
pub(crate) fn in_ns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let path = format!("/var/run/netns/{ns}");
    std::thread::spawn(move || {
        let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        // SAFETY: setns(2) on this thread only, with a namespace file we hold open.
        let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns {path}: {}", std::io::Error::last_os_error());
        f()
    })
    .join()
    .expect("namespace thread")
}

pub(crate) fn sysctl(ns: &str, key: &str, value: &str) {
    let path = format!("/proc/sys/{}", key.replace('.', "/"));
    let value = value.to_string();
    in_ns(ns, move || std::fs::write(&path, value).unwrap_or_else(|e| panic!("{path}: {e}")));
}

/// Why this test cannot run here, if it cannot.
pub(crate) fn cannot_run() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root for network namespaces (CI runs as root): sudo -E cargo test -p ccm-provider-baremetal --test baremetal l2_announce".into());
    }
    // Unique per call: tests run in parallel threads of one process and each probes.
    static PROBES: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = PROBES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let probe = format!("ccml2-probe-{}-{n}", std::process::id());
    match ip(&["netns", "add", &probe]) {
        Ok(()) => {
            let _ = ip(&["netns", "del", &probe]);
            None
        }
        Err(e) => Some(format!("cannot create a network namespace (needs iproute2 and CAP_SYS_ADMIN): {e}")),
    }
}

/// Serves the node's name to every connection on `listener`.
pub(crate) fn serve(listener: TcpListener, name: &'static str) {
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut stream = stream;
            let _ = stream.write_all(name.as_bytes());
        }
    });
}

/// Which node answers on `vip` from the client's namespace, if any.
pub(crate) fn who_answers(vip: IpAddr) -> Option<String> {
    let mut stream = TcpStream::connect_timeout(&SocketAddr::new(vip, PORT), Duration::from_millis(300)).ok()?;
    stream.set_read_timeout(Some(Duration::from_millis(500))).ok()?;
    let mut name = String::new();
    stream.read_to_string(&mut name).ok()?;
    Some(name)
}

/// How long after `t0` the client in namespace `client` first reaches `node` on `vip` (polled
/// every 10 ms), or `None` after `within`.
pub(crate) async fn reached(
    client: &str,
    vip: IpAddr,
    node: String,
    t0: Instant,
    within: Duration,
) -> Option<Duration> {
    let client = client.to_string();
    tokio::task::spawn_blocking(move || {
        in_ns(&client, move || {
            loop {
                if who_answers(vip).as_deref() == Some(node.as_str()) {
                    return Some(t0.elapsed());
                }
                if t0.elapsed() > within {
                    return None;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        })
    })
    .await
    .expect("probe thread")
}

/// The client's neighbour entry for `vip` (its link-layer address), as `ip neigh` shows it.
pub(crate) fn neighbour(client: &str, vip: IpAddr) -> String {
    let out = Command::new("ip").args(["-n", client, "neigh", "show", &vip.to_string()]).output().expect("ip neigh");
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// A namespaced Ethernet segment: a switch (a bridge in its own namespace, so no host interface
/// is touched), two node namespaces and a client's, deleted when dropped.
pub(crate) struct Segment {
    /// The node namespaces, in the order of the names given.
    pub(crate) nodes: [String; 2],
    /// The client's namespace.
    pub(crate) client: String,
    /// The switch's namespace (bridge `br0`; node `i`'s port is `p{i}`, the client's `p2`).
    pub(crate) switch: String,
    _cleanup: Namespaces,
}

/// Build a segment under a unique name from `prefix`: node `i` has `eth0` (MAC [`mac_of`]`(i)`,
/// 10.254.0.1x/24 and fd00:254::1x/64), the client .1. Each node takes TCP traffic for `vips`
/// on [`PORT`] (as kube-proxy would) answering with its name, and never answers ARP for them
/// itself: the addresses are routed locally, not assigned, and arp_ignore=1 keeps the kernel's
/// ARP to assigned addresses (NDP never answers for routes). IPv6 addresses survive a link
/// going down and up (keep_addr_on_down), as on a server.
pub(crate) fn segment(prefix: &str, names: [&'static str; 2], vips: &[IpAddr]) -> Segment {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().subsec_nanos();
    let prefix = format!("{prefix}-{}-{}", std::process::id(), nanos % 100_000);
    let [sw, a, b, c] = ["sw", "a", "b", "c"].map(|n| format!("{prefix}-{n}"));
    let cleanup = Namespaces(vec![sw.clone(), a.clone(), b.clone(), c.clone()]);
    for ns in [&sw, &a, &b, &c] {
        must(&["netns", "add", ns]);
    }
    // No multicast snooping: it would need MLD queriers.
    must(&["-n", &sw, "link", "add", "br0", "type", "bridge", "mcast_snooping", "0"]);
    must(&["-n", &sw, "link", "set", "br0", "up"]);
    let hosts = [(&a, 11u8), (&b, 12), (&c, 1)];
    for (i, (ns, host)) in hosts.iter().enumerate() {
        let port = format!("p{i}");
        must(&["-n", &sw, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns", ns]);
        must(&["-n", &sw, "link", "set", &port, "master", "br0", "up"]);
        sysctl(ns, "net.ipv6.conf.all.keep_addr_on_down", "1");
        must(&["-n", ns, "link", "set", "eth0", "address", &mac_of(i), "up"]);
        must(&["-n", ns, "link", "set", "lo", "up"]);
        must(&["-n", ns, "addr", "add", &format!("10.254.0.{host}/24"), "dev", "eth0"]);
        must(&["-n", ns, "addr", "add", &format!("fd00:254::{host}/64"), "dev", "eth0", "nodad"]);
    }
    for (ns, name) in [(&a, names[0]), (&b, names[1])] {
        sysctl(ns, "net.ipv4.conf.all.arp_ignore", "1");
        sysctl(ns, "net.ipv4.conf.all.arp_announce", "2");
        // IPv6 binds only assigned addresses unless told otherwise; the address is routed.
        sysctl(ns, "net.ipv6.ip_nonlocal_bind", "1");
        for vip in vips {
            let (family, len) = if vip.is_ipv4() { ("-4", 32) } else { ("-6", 128) };
            must(&["-n", ns, family, "route", "add", "local", &format!("{vip}/{len}"), "dev", "lo"]);
            let vip = *vip;
            let listener = in_ns(ns, move || TcpListener::bind(SocketAddr::new(vip, PORT)).expect("bind the address"));
            serve(listener, name);
        }
    }
    Segment { nodes: [a, b], client: c, switch: sw, _cleanup: cleanup }
}

pub(crate) fn mac_of(i: usize) -> String {
    format!("02:00:00:00:00:{:02x}", 0x11 + i)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_reaches_the_elected_node_by_arp_and_ndp_and_follows_a_graceful_failover() {
    if let Some(reason) = cannot_run() {
        eprintln!("SKIPPED: {reason}");
        return;
    }
    // Two addresses, one per family, that the same node wins, so one stop moves both.
    let (v4, v6) = (100u8..250)
        .map(|n| (IpAddr::from([10, 254, 0, n]), format!("fd00:254::{n}").parse::<IpAddr>().unwrap()))
        .find(|(v4, v6)| elect::elect(*v4, NODES) == elect::elect(*v6, NODES))
        .expect("a pair with one owner");
    let vips: BTreeSet<IpAddr> = [v4, v6].into();
    let owner = elect::elect(v4, NODES).unwrap();
    let other = NODES.into_iter().find(|n| *n != owner).unwrap();
    let segment = segment("ccml2", NODES, &[v4, v6]);
    let (a, b, c) = (segment.nodes[0].clone(), segment.nodes[1].clone(), segment.client.clone());

    let mut responders = Vec::new();
    for (i, (ns, name)) in [(&a, NODES[0]), (&b, NODES[1])].into_iter().enumerate() {
        let socket = in_ns(ns, || L2Socket::open("eth0")).expect("open the packet socket");
        assert_eq!(socket.mac().map(|b| format!("{b:02x}")).join(":"), mac_of(i));
        let owned = elect::owned_by(name, &vips, &NODES);
        let (tx, rx) = watch::channel(owned);
        let cancel = CancellationToken::new();
        let task = tokio::spawn(responder::run(socket, rx, cancel.clone()));
        responders.push((name, tx, cancel, task));
    }

    // The client resolves both addresses to the owner alone and reaches it.
    let started = Instant::now();
    for vip in [v4, v6] {
        let answer = tokio::task::spawn_blocking({
            let c = c.clone();
            move || {
                let deadline = Instant::now() + Duration::from_secs(10);
                loop {
                    let answer = in_ns(&c, move || who_answers(vip));
                    if answer.is_some() || Instant::now() > deadline {
                        return answer;
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        })
        .await
        .unwrap();
        assert_eq!(answer.as_deref(), Some(owner), "{vip} reached the elected node");
        let owner_mac = mac_of(NODES.iter().position(|n| *n == owner).unwrap());
        let entry = neighbour(&c, vip);
        assert!(entry.contains(&owner_mac), "{vip} resolved to {entry:?}, expected the owner's {owner_mac}");
    }
    let first_answer = started.elapsed();

    // Graceful stop of the owner: its responder ends, the other recomputes without it.
    let t0 = Instant::now();
    for (name, tx, cancel, _) in &responders {
        if *name == owner {
            cancel.cancel();
        } else {
            tx.send_replace(elect::owned_by(name, &vips, &[*name]));
        }
    }
    let probes = tokio::join!(
        reached(&c, v4, other.into(), t0, Duration::from_secs(15)),
        reached(&c, v6, other.into(), t0, Duration::from_secs(15))
    );
    let mut failover = Vec::new();
    for (vip, probe) in [(v4, probes.0), (v6, probes.1)] {
        let took = probe.unwrap_or_else(|| panic!("{vip} never moved to {other}"));
        let entry = neighbour(&c, vip);
        let other_mac = mac_of(NODES.iter().position(|n| *n == other).unwrap());
        assert!(entry.contains(&other_mac), "{vip} now resolves to {entry:?}, expected {other_mac}");
        failover.push(took);
    }
    eprintln!(
        "L2 announcement: first answer after {:?}; graceful failover {owner} -> {other}: IPv4 {} ms, IPv6 {} ms (goal <= 2000 ms)",
        first_answer,
        failover[0].as_millis(),
        failover[1].as_millis()
    );
    for (_, _, cancel, task) in responders {
        cancel.cancel();
        task.await.unwrap().expect("responder ran without error");
    }
}

mod announcer_on_the_api_server {
    use std::collections::BTreeSet;
    use std::net::IpAddr;
    use std::time::{Duration, Instant};

    use ccm_framework::events::EventSink;
    use ccm_provider_baremetal::announce::announce_reasons::L2_ANNOUNCING;
    use ccm_provider_baremetal::announce::announcer::{self, AnnouncerSettings, lease_name};
    use ccm_provider_baremetal::announce::elect;
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::api::core::v1::Service;
    use k8s_openapi::api::events::v1::Event;
    use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
    use serde_json::json;
    use testkit::{ServiceFixture, TestCluster, eventually, lb_service};
    use tokio::sync::watch;
    use tokio::task::JoinHandle;
    use tokio_util::sync::CancellationToken;

    /// A class of this test's own, so that on a shared genuine server only its Service counts.
    const CLASS: &str = "ccm.rs/l2-announcer-test";
    const NODES: [&str; 2] = ["node-a", "node-b"];

    struct Running {
        owned: watch::Receiver<BTreeSet<IpAddr>>,
        cancel: CancellationToken,
        task: JoinHandle<()>,
    }

    fn start(client: &kube::Client, namespace: &str, node: &str) -> Running {
        let settings = crate::kit::fast_announcer(node, namespace, CLASS);
        let (tx, owned) = watch::channel(BTreeSet::new());
        let cancel = CancellationToken::new();
        let events = EventSink::spawn(client.clone(), Some(node.into()), cancel.clone());
        let task = tokio::spawn({
            let (client, cancel) = (client.clone(), cancel.clone());
            async move { announcer::run(client, settings, tx, Some(events), cancel).await.expect("announcer runs") }
        });
        Running { owned, cancel, task }
    }

    async fn owns(running: &Running, want: &BTreeSet<IpAddr>, within: Duration) -> Option<Duration> {
        let mut owned = running.owned.clone();
        let t0 = Instant::now();
        tokio::time::timeout(within, owned.wait_for(|o| o == want)).await.ok()?.ok()?;
        Some(t0.elapsed())
    }

    testkit::backend_tests! {
        async fn announcers_elect_one_node_per_address_report_it_and_take_over_on_stop_and_on_crash(backend) {
            let cluster = TestCluster::start(backend).await.unwrap();
            let client = cluster.client();
            let namespace = cluster.fresh_namespace("l2").await.unwrap();
            let services: Api<Service> = Api::namespaced(client.clone(), &namespace);
            let svc = lb_service(&namespace, "web").with_class(CLASS);
            services.create(&PostParams::default(), &svc).await.unwrap();
            // Two addresses the same node wins, so one stop moves both.
            let (v4, v6) = crate::kit::pair_one_node_wins(NODES);
            let status = json!({"status": {"loadBalancer": {"ingress": [
                {"ip": v4.to_string(), "ipMode": "VIP"}, {"ip": v6.to_string(), "ipMode": "VIP"}]}}});
            services.patch_status("web", &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();
            let both: BTreeSet<IpAddr> = [v4, v6].into();
            let none = BTreeSet::new();
            let owner = elect::elect(v4, NODES).unwrap();
            let other = NODES.into_iter().find(|n| *n != owner).unwrap();

            let mut running: Vec<(&str, Running)> = NODES.iter().map(|n| (*n, start(&client, &namespace, n))).collect();
            let wait = Duration::from_secs(20);
            for (node, r) in &running {
                let want = if *node == owner { &both } else { &none };
                assert!(owns(r, want, wait).await.is_some(), "{node} owns {want:?}");
            }
            // Each node holds a Lease; the owner says so on the Service.
            let leases: Api<Lease> = Api::namespaced(client.clone(), &namespace);
            for node in NODES {
                let lease = leases.get(&lease_name(node)).await.unwrap();
                assert_eq!(lease.spec.unwrap().holder_identity.as_deref(), Some(node));
            }
            let events: Api<Event> = Api::namespaced(client.clone(), &namespace);
            // Both announcers start at once and each waits to settle (1 s here) before claiming.
            // One whose start (its first lists, then its Lease) takes longer than that may be
            // preceded by the other, which then hands the addresses over: the owner's event must
            // be there.
            let note = eventually("the owner's L2Announcing event on the Service", || async {
                events.list(&ListParams::default()).await.ok()?.items.into_iter().find_map(|e| {
                    (e.reason.as_deref() == Some(L2_ANNOUNCING)
                        && e.regarding.as_ref()?.name.as_deref() == Some("web")
                        && e.note.as_deref()?.contains(&format!("node {owner} announces")))
                    .then(|| e.note.unwrap_or_default())
                })
            })
            .await;
            assert!(note.contains(owner) && note.contains(&format!("{v4} (ARP)")) && note.contains(&format!("{v6} (NDP)")), "{note}");

            // Graceful stop: the Lease is deleted and the other node takes over at once.
            let position = running.iter().position(|(n, _)| *n == owner).unwrap();
            let (_, stopped) = running.remove(position);
            let t0 = Instant::now();
            stopped.cancel.cancel();
            stopped.task.await.unwrap();
            assert_eq!(*stopped.owned.borrow(), none, "a stopped announcer owns nothing");
            let other_running = &running[0].1;
            assert!(owns(other_running, &both, wait).await.is_some(), "{other} takes over");
            let graceful = t0.elapsed();
            assert!(leases.get_opt(&lease_name(owner)).await.unwrap().is_none(), "the stopped node's Lease is gone");

            // The owner comes back and wins its addresses back; then it crashes (no Lease
            // deletion) and the other node takes over when the Lease runs out.
            let back = start(&client, &namespace, owner);
            assert!(owns(&back, &both, wait).await.is_some(), "{owner} wins its addresses back");
            assert!(owns(other_running, &none, wait).await.is_some(), "{other} lets them go");
            let t1 = Instant::now();
            back.task.abort();
            assert!(owns(other_running, &both, wait).await.is_some(), "{other} takes over after a crash");
            let crash = t1.elapsed();
            back.cancel.cancel();
            eprintln!(
                "L2 announcer ({backend:?}): addresses move after a graceful stop in {} ms, after a crash in {} ms (Lease 2 s, renewed every 0.5 s)",
                graceful.as_millis(),
                crash.as_millis()
            );
            assert!(crash >= Duration::from_millis(1000), "a crash is noticed only when the Lease runs out");
            for (_, r) in running {
                r.cancel.cancel();
                r.task.await.unwrap();
            }
        }
    }

    testkit::backend_tests! {
        /// Issue 47 item 2: `ccm.rs/l2-preferred-nodes` puts the answer on the named node (here
        /// the one the election would not pick); when it stops the election decides, and when
        /// it is back it answers again.
        async fn a_preferred_node_answers_hands_over_when_it_stops_and_answers_again_when_back(backend) {
            use ccm_provider_baremetal::announce::assign::PREFERRED_NODES_ANNOTATION;
            let cluster = TestCluster::start(backend).await.unwrap();
            let client = cluster.client();
            let namespace = cluster.fresh_namespace("l2pref").await.unwrap();
            let (v4, v6) = crate::kit::pair_one_node_wins(NODES);
            let hashed = elect::elect(v4, NODES).unwrap();
            let preferred = NODES.into_iter().find(|n| *n != hashed).unwrap();
            let services: Api<Service> = Api::namespaced(client.clone(), &namespace);
            let mut svc = lb_service(&namespace, "web").with_class(CLASS);
            svc.metadata.annotations = Some([(PREFERRED_NODES_ANNOTATION.to_string(), format!("gone-node,{preferred}"))].into());
            services.create(&PostParams::default(), &svc).await.unwrap();
            let status = json!({"status": {"loadBalancer": {"ingress": [
                {"ip": v4.to_string(), "ipMode": "VIP"}, {"ip": v6.to_string(), "ipMode": "VIP"}]}}});
            services.patch_status("web", &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();
            let both: BTreeSet<IpAddr> = [v4, v6].into();
            let none = BTreeSet::new();
            let wait = Duration::from_secs(20);

            let mut running: Vec<(&str, Running)> = NODES.iter().map(|n| (*n, start(&client, &namespace, n))).collect();
            for (node, r) in &running {
                let want = if *node == preferred { &both } else { &none };
                assert!(owns(r, want, wait).await.is_some(), "{node} owns {want:?} (preferred: {preferred})");
            }
            let position = running.iter().position(|(n, _)| *n == preferred).unwrap();
            let (_, stopped) = running.remove(position);
            stopped.cancel.cancel();
            stopped.task.await.unwrap();
            let other = &running[0].1;
            assert!(owns(other, &both, wait).await.is_some(), "{hashed} takes over while {preferred} is gone");
            let back = start(&client, &namespace, preferred);
            assert!(owns(&back, &both, wait).await.is_some(), "{preferred} answers again once back");
            assert!(owns(other, &none, wait).await.is_some(), "{hashed} lets go");
            // Without the annotation the election's node answers.
            let unset = json!({"metadata": {"annotations": {PREFERRED_NODES_ANNOTATION: null}}});
            services.patch("web", &PatchParams::default(), &Patch::Merge(&unset)).await.unwrap();
            assert!(owns(other, &both, wait).await.is_some(), "{hashed} answers without a preference");
            for r in [back, running.remove(0).1] {
                r.cancel.cancel();
                r.task.await.unwrap();
            }
        }
    }

    testkit::backend_tests! {
    /// Issue 45 item 3: an announcer announces only what the pools hand out. An address written
    /// by hand into a Service's status outside every pool, or a Node's address inside one, is
    /// never owned (so never answered) and never handed to BGP, and the node that would have
    /// announced it says why on the Service; BGP's export filter gets the pools' prefixes; a
    /// pool edit in the mounted cloud-config reaches the announcer without a restart.
    async fn an_address_outside_the_pools_or_of_a_node_is_never_announced_and_is_reported_on_its_service(backend) {
        use ccm_provider_baremetal::announce::announce_reasons::ANNOUNCEMENT_REFUSED;
        use ccm_provider_baremetal::announce::bgp::Advertisement;
        use ccm_provider_baremetal::announce::sources::{self, SourceSettings};
        use k8s_openapi::api::core::v1::Node;
        let cluster = TestCluster::start(backend).await.unwrap();
        let client = cluster.client();
        let namespace = cluster.fresh_namespace("l2-guard").await.unwrap();
        let services: Api<Service> = Api::namespaced(client.clone(), &namespace);
        let ingress = |ips: &[&str]| {
            let list: Vec<serde_json::Value> = ips.iter().map(|ip| json!({"ip": ip, "ipMode": "VIP"})).collect();
            json!({"status": {"loadBalancer": {"ingress": list}}})
        };
        // A Node whose address lies inside the pool: a Service claiming it must not take it over.
        let nodes: Api<Node> = Api::all(client.clone());
        let node_name = format!("{namespace}-node");
        let node: Node = serde_json::from_value(json!({"metadata": {"name": node_name},
            "status": {"addresses": [{"type": "InternalIP", "address": "192.0.2.250"}]}})).unwrap();
        nodes.create(&PostParams::default(), &node).await.unwrap();
        nodes.patch_status(&node_name, &PatchParams::default(), &Patch::Merge(json!({"status": node.status}))).await.unwrap();
        for (name, ips) in [("web", &["192.0.2.10"][..]), ("intruder", &["198.51.100.66", "192.0.2.250"][..])] {
            services.create(&PostParams::default(), &lb_service(&namespace, name).with_class(CLASS)).await.unwrap();
            services.patch_status(name, &PatchParams::default(), &Patch::Merge(&ingress(ips))).await.unwrap();
        }

        // The announcer's facts come from its mounted cloud-config, read again as it changes.
        let dir = std::env::temp_dir().join(format!("ccm-guard-{namespace}"));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("cloud.yaml");
        let pools = |cidrs: &str| format!("loadBalancer:\n  pools:\n    - {{name: lan, cidrs: [{cidrs}]}}\n");
        std::fs::write(&path, pools("192.0.2.0/24")).unwrap();
        let config = ccm_provider_baremetal::config::parse(&std::fs::read(&path).unwrap()).unwrap();
        let cancel = CancellationToken::new();
        let mut source_settings = SourceSettings::new(&path);
        source_settings.reread = Duration::from_millis(100);
        let facts = sources::spawn(client.clone(), config, source_settings, Default::default, cancel.clone());
        let mut settings = AnnouncerSettings::new("node-g", &namespace);
        settings.class = Some(CLASS.into());
        (settings.lease_duration, settings.renew_interval, settings.settle) =
            (Duration::from_secs(2), Duration::from_millis(500), Duration::from_millis(500));
        settings.facts = facts;
        let (bgp, mut advertised) = watch::channel(Advertisement::default());
        settings.bgp = Some(bgp);
        let (tx, mut owned) = watch::channel(BTreeSet::new());
        let events = EventSink::spawn(client.clone(), Some("node-g".into()), cancel.clone());
        let task = tokio::spawn({
            let (client, cancel) = (client.clone(), cancel.clone());
            async move { announcer::run(client, settings, tx, Some(events), cancel).await.expect("announcer runs") }
        });
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let web: BTreeSet<IpAddr> = [ip("192.0.2.10")].into();
        let wait = Duration::from_secs(20);
        tokio::time::timeout(wait, owned.wait_for(|o| *o == web)).await.expect("web's address is owned").unwrap();
        let advertisement = tokio::time::timeout(wait, advertised.wait_for(|a| a.addresses == web)).await.unwrap().unwrap().clone();
        assert_eq!(advertisement.prefixes, ["192.0.2.0/24".parse::<ipnet::IpNet>().unwrap()], "BIRD's filter: the pools only");

        let event_api: Api<Event> = Api::namespaced(client.clone(), &namespace);
        let joined = eventually("an AnnouncementRefused event naming both of the intruder's addresses", || async {
            event_api.list(&ListParams::default()).await.ok()?.items.into_iter()
                .filter(|e| e.reason.as_deref() == Some(ANNOUNCEMENT_REFUSED) && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("intruder"))
                .filter_map(|e| e.note)
                .find(|n| n.contains("198.51.100.66") && n.contains("192.0.2.250"))
        }).await;
        assert!(joined.contains("198.51.100.66 is not announced") && joined.contains("no load-balancer pool"), "{joined}");
        assert!(joined.contains("192.0.2.250 is not announced") && joined.contains("a node's address"), "{joined}");
        assert_eq!(*owned.borrow(), web, "the intruder's addresses are never owned");
        assert_eq!(advertised.borrow().addresses, web, "nor advertised");

        // A pool edit in the mounted file reaches the announcer: the intruder's first address is
        // now a pool's and is announced; the Node's never is.
        std::fs::write(&path, pools("192.0.2.0/24, 198.51.100.64/28")).unwrap();
        let both: BTreeSet<IpAddr> = [ip("192.0.2.10"), ip("198.51.100.66")].into();
        tokio::time::timeout(wait, owned.wait_for(|o| *o == both)).await.expect("the edit reaches the announcer").unwrap();
        cancel.cancel();
        task.await.unwrap();
        nodes.delete(&node_name, &Default::default()).await.unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }
    }
}
