//! A pool's L2 interfaces (`advertisement.l2Interfaces`) on real (namespaced) Ethernet: one node
//! with two interfaces, each on a segment of its own with a client. The node owns two
//! addresses; one's pool answers on `eth1` only. The client on `eth0`'s segment resolves the
//! other address and never this one; the client on `eth1`'s resolves both; the pool's
//! interfaces lifted, the first client resolves it too. The responders get their addresses
//! through [`responder::on_interface`], as the announcer process wires them. Needs root;
//! prints one `SKIPPED:` line otherwise; everything lives in namespaces the test deletes.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::time::{Duration, Instant};

use ccm_provider_baremetal::announce::responder::{self, L2Socket};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::l2_announce::{Namespaces, cannot_run, in_ns, must, serve, sysctl, who_answers};

const NODE: &str = "node-a";
const PORT: u16 = 8080;

/// Whether the client in `ns` reaches the node on `vip` within `within` (polled).
async fn answers(ns: &str, vip: IpAddr, within: Duration) -> bool {
    let ns = ns.to_string();
    tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + within;
        loop {
            let ns = ns.clone();
            if in_ns(&ns, move || who_answers(vip)).as_deref() == Some(NODE) {
                return true;
            }
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    })
    .await
    .expect("probe thread")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pools_l2_interfaces_are_the_only_ones_its_addresses_are_answered_on() {
    if let Some(reason) = cannot_run() {
        eprintln!("SKIPPED: {reason}");
        return;
    }
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().subsec_nanos();
    let prefix = format!("ccmif-{}-{}", std::process::id(), nanos % 100_000);
    let [sw0, sw1, node, c0, c1] = ["s0", "s1", "n", "c0", "c1"].map(|n| format!("{prefix}-{n}"));
    let _cleanup = Namespaces(vec![sw0.clone(), sw1.clone(), node.clone(), c0.clone(), c1.clone()]);
    for ns in [&sw0, &sw1, &node, &c0, &c1] {
        must(&["netns", "add", ns]);
    }
    let (everywhere, only_eth1): (IpAddr, IpAddr) = ([10, 254, 0, 100].into(), [10, 254, 0, 101].into());
    // Segment i: a bridge, the node's eth<i> (10.25<4-i>.0.11) and client c<i> (.1); both
    // clients reach the addresses on their own link (c1 by an on-link route).
    for (i, (sw, client)) in [(&sw0, &c0), (&sw1, &c1)].into_iter().enumerate() {
        let subnet = 254 - i;
        must(&["-n", sw, "link", "add", "br0", "type", "bridge"]);
        must(&["-n", sw, "link", "set", "br0", "up"]);
        for (port, ns, ifname, host) in [("pn", &node, format!("eth{i}"), 11), ("pc", client, "eth0".to_string(), 1)] {
            must(&["-n", sw, "link", "add", port, "type", "veth", "peer", "name", &ifname, "netns", ns]);
            must(&["-n", sw, "link", "set", port, "master", "br0", "up"]);
            must(&["-n", ns, "link", "set", &ifname, "up"]);
            must(&["-n", ns, "addr", "add", &format!("10.{subnet}.0.{host}/24"), "dev", &ifname]);
        }
        must(&["-n", client, "link", "set", "lo", "up"]);
        if i == 1 {
            for vip in [everywhere, only_eth1] {
                must(&["-n", client, "route", "add", &format!("{vip}/32"), "dev", "eth0"]);
            }
        }
    }
    // The node takes the addresses' traffic (as kube-proxy would) but its kernel never answers
    // ARP for them: they are routed locally, not assigned.
    must(&["-n", &node, "link", "set", "lo", "up"]);
    sysctl(&node, "net.ipv4.conf.all.arp_ignore", "1");
    sysctl(&node, "net.ipv4.conf.all.rp_filter", "0");
    for vip in [everywhere, only_eth1] {
        must(&["-n", &node, "route", "add", "local", &format!("{vip}/32"), "dev", "lo"]);
        let listener = in_ns(&node, move || TcpListener::bind(SocketAddr::new(vip, PORT)).expect("bind"));
        serve(listener, NODE);
    }

    // The node owns both; the pool of `only_eth1` answers on eth1 only.
    let (owned_tx, owned) = watch::channel(BTreeSet::from([everywhere, only_eth1]));
    let restricted = BTreeMap::from([(only_eth1, BTreeSet::from(["eth1".to_string()]))]);
    let (only_on_tx, only_on) = watch::channel(restricted);
    let cancel = CancellationToken::new();
    let mut tasks = Vec::new();
    for interface in ["eth0", "eth1"] {
        let socket = in_ns(&node, move || L2Socket::open(interface)).expect("open the packet socket");
        let answered = responder::on_interface(owned.clone(), only_on.clone(), interface.into(), cancel.clone());
        tasks.push(tokio::spawn(responder::run(socket, answered, cancel.clone())));
    }

    let t0 = Instant::now();
    assert!(answers(&c0, everywhere, Duration::from_secs(10)).await, "eth0's client reaches the unrestricted address");
    assert!(answers(&c1, everywhere, Duration::from_secs(10)).await, "eth1's client reaches the unrestricted address");
    assert!(answers(&c1, only_eth1, Duration::from_secs(10)).await, "eth1's client reaches the eth1 pool's address");
    let first = t0.elapsed();
    assert!(
        !answers(&c0, only_eth1, Duration::from_secs(2)).await,
        "eth0's client must not resolve an address whose pool answers on eth1 only"
    );
    // The pool's interfaces lifted: eth0 answers for it too.
    let t1 = Instant::now();
    only_on_tx.send_replace(BTreeMap::new());
    assert!(
        answers(&c0, only_eth1, Duration::from_secs(10)).await,
        "eth0's client reaches it once the pool allows eth0"
    );
    eprintln!(
        "pool L2 interfaces: both segments answered {} ms after start; eth0 not for the eth1-only pool (2 s of tries); \
         answered there {} ms after the pool's interfaces were lifted",
        first.as_millis(),
        t1.elapsed().as_millis()
    );
    drop(owned_tx);
    cancel.cancel();
    for task in tasks {
        task.await.expect("responder task").expect("responder ran without error");
    }
}
