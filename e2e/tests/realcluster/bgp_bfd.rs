//! BFD and graceful restart through the operator (issue 47 item 3): `spec.announcer.bfd` and
//! `gracefulRestart` on three Nodes, with the router's BIRD running BFD and graceful restart.
//! The BIRD sidecars the operator renders (root with `NET_RAW` only, `-R`, the `preStop` hook)
//! bring BFD Up with the router; a Node powered off is withdrawn on BFD's detection, not the
//! hold time; an announcer Pod replaced leaves its Node's next hop on the router throughout.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use e2e::realcluster::router::{RouterBfd, RouterBird, RouterConfig, protocol_name};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams};
use serde_json::json;

use crate::bgp::{HOLD_SECONDS, announcer_pods, exec, next_hops, route_via, segment_ip};
use crate::l2::ANNOUNCER_LABEL;
use crate::multinode::{
    BGP_ADDRESS, Inventory, NODE_ASN, ROLLED_ARGS, ROUTER_ASN, announcer_generation, announcers_rolled, blocking,
    cloud_config, lb_service, measured, power_off, power_on, spec,
};
use crate::{CCM_NS, Ctx, apply, put_cloud_config, wait};

/// The Nodes' BFD and graceful restart, as a user writes them in the cloud-config's peer.
const PEER_EXTRA: &str =
    "          bfd: {minRx: 100ms, minTx: 100ms, multiplier: 3}\n          gracefulRestart: {restartTime: 120s}\n";
/// The router's BFD: 100 ms both ways, three packets (0.3 s to declare a Node down).
const ROUTER_BFD: RouterBfd = RouterBfd { interval_ms: 100, multiplier: 3, graceful: false };

/// The router's configuration for the three Nodes, BFD as `bfd`.
fn router(ctx: &Ctx, nodes: &BTreeSet<Ipv4Addr>, bfd: RouterBfd) -> RouterConfig {
    RouterConfig {
        address: ctx.cluster.network.router_address(),
        asn: ROUTER_ASN,
        peer_asn: NODE_ASN,
        peers: nodes.iter().copied().collect(),
        hold_seconds: HOLD_SECONDS,
        bfd: Some(bfd),
        graceful_restart: true,
    }
}

/// Once the router has every one of `nodes` Established and BFD Up: the seconds since `t`.
async fn all_up(bird: &RouterBird, nodes: &BTreeSet<Ipv4Addr>, t: Instant, what: &str) -> f64 {
    wait(what, Duration::from_secs(120), || async {
        let b = bird.clone();
        let (established, bfd) = blocking(move || Ok::<_, e2e::Error>((b.established()?, b.bfd_up()?))).await.ok()?;
        let every = nodes.iter().all(|n| established.contains(&protocol_name(*n)) && bfd.contains(n));
        every.then(|| t.elapsed().as_secs_f64())
    })
    .await
}

/// Issue 47 item 3 on three Nodes: BFD and graceful restart rendered by the operator, measured
/// against the router's BIRD.
pub async fn bgp_bfd_and_graceful_restart_through_the_operator(ctx: Arc<Ctx>) {
    let (names, node_ips) = crate::bgp::three_bgp_nodes(&ctx).await;
    let bird = RouterBird::of(&ctx.cluster);
    let (c, b, conf) = (ctx.clone(), bird.clone(), router(&ctx, &node_ips, ROUTER_BFD).render());
    blocking(move || b.apply(&c.cluster, &conf)).await.unwrap_or_else(|e| panic!("the router's BIRD: {e}"));

    // The announcers with both options; the peer in the cloud-config with both.
    let t = Instant::now();
    let before = announcer_generation(&ctx).await;
    let inventory = Inventory { bgp: true, bgp_peer_extra: PEER_EXTRA, ..Inventory::default() };
    put_cloud_config(&ctx, &cloud_config(&ctx, &inventory)).await;
    let announcer = json!({"l2": true, "bgp": true, "bfd": true, "gracefulRestart": true,
                           "nodeSelector": {ANNOUNCER_LABEL: "true"}});
    apply(&ctx.client, spec("DaemonSet", 2, Some(announcer), ROLLED_ARGS)).await;
    announcers_rolled(&ctx, 3, before).await;
    let up = all_up(&bird, &node_ips, t, "every session Established and BFD Up").await;
    for (node, pod) in announcer_pods(&ctx).await {
        let pod = pod.name_any();
        // Root with NET_RAW alone: BIRD's effective set is that one capability (bit 13).
        let caps = exec(&ctx, &pod, "bird", "grep CapEff /proc/1/status");
        assert!(caps.trim().ends_with("0000000000002000"), "BIRD on {node}: {caps}");
        let cmd = exec(&ctx, &pod, "bird", "tr '\\0' ' ' < /proc/1/cmdline");
        assert!(cmd.contains("bird -f -R -c"), "BIRD on {node} starts in graceful-restart recovery: {cmd}");
    }
    let ip =
        lb_service(&ctx, "web-bgp", "web", json!({"ccm.rs/address-pool": "bgp", "ccm.rs/ip-mode": "VIP"}), false).await;
    assert_eq!(ip, BGP_ADDRESS);
    route_via(&ctx, &node_ips, Instant::now()).await;
    measured(format!(
        "BFD: announcers with spec.announcer.bfd and gracefulRestart rolled out and every session Established with BFD Up (100 ms x 3) {up:.1} s after the apply; BIRD in each sidecar has CAP_NET_RAW alone and runs with -R"
    ));

    // A Node powered off: the router's BFD declares it down and withdraws its next hop.
    let stopped = names[1].clone();
    let stopped_ip = segment_ip(&ctx, &stopped);
    let rest: BTreeSet<Ipv4Addr> = node_ips.iter().copied().filter(|a| *a != stopped_ip).collect();
    let t = Instant::now();
    let stop_secs = power_off(&ctx, &stopped).await;
    let withdrawn = route_via(&ctx, &rest, t).await;
    measured(format!(
        "BFD withdrawal: {stopped} powered off ({stop_secs:.1} s) to the router's route without it {withdrawn:.2} s (BFD 100 ms x 3; hold time {HOLD_SECONDS} s)"
    ));
    assert!(withdrawn < f64::from(HOLD_SECONDS), "withdrawn by BFD, before the hold time: {withdrawn:.2} s");
    let secs = power_on(&ctx, &stopped).await;
    let t = Instant::now();
    let back = all_up(&bird, &node_ips, t, "the Node's session and BFD back").await;
    route_via(&ctx, &node_ips, t).await;
    measured(format!("BFD: {stopped} started again: Ready in {secs:.1} s, its session and BFD Up {back:.1} s later"));

    // The router as graceful-restart helper on BFD down too (`bfd graceful`): an announcer Pod
    // replaced (its preStop: `birdc graceful restart`) keeps its Node's next hop throughout.
    let graceful = RouterBfd { graceful: true, ..ROUTER_BFD };
    let (c, b, conf) = (ctx.clone(), bird.clone(), router(&ctx, &node_ips, graceful).render());
    blocking(move || b.apply(&c.cluster, &conf)).await.unwrap_or_else(|e| panic!("the router's BIRD: {e}"));
    all_up(&bird, &node_ips, Instant::now(), "every session and BFD Up with bfd graceful").await;
    route_via(&ctx, &node_ips, Instant::now()).await;
    let replaced = names[2].clone();
    let (_, old) = announcer_pods(&ctx).await.into_iter().find(|(n, _)| *n == replaced).expect("its announcer Pod");
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), CCM_NS);
    let t = Instant::now();
    pods.delete(&old.name_any(), &DeleteParams::default()).await.expect("deleting the announcer Pod");
    let protocol = protocol_name(segment_ip(&ctx, &replaced));
    let (mut missing, mut readings, mut helped) = (0usize, 0usize, false);
    let back = loop {
        readings += 1;
        if next_hops(&ctx).await != node_ips {
            missing += 1;
        }
        let b = bird.clone();
        let p = protocol.clone();
        let shown = blocking(move || b.birdc(&["show", "protocols", "all", &p])).await.unwrap_or_default();
        helped |= shown.contains("Neighbor graceful restart active");
        let new_pod = announcer_pods(&ctx).await.into_iter().any(|(n, p)| n == replaced && p.uid() != old.uid());
        let b = bird.clone();
        let bfd = blocking(move || b.bfd_up()).await.unwrap_or_default();
        if new_pod && helped && shown.contains("Established") && bfd.contains(&segment_ip(&ctx, &replaced)) {
            break t.elapsed().as_secs_f64();
        }
        assert!(t.elapsed() < Duration::from_secs(120), "the replaced announcer's session not back: {shown}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    measured(format!(
        "graceful restart: {replaced}'s announcer Pod deleted to a new one's session Established and BFD Up {back:.1} s; the router held the Node's routes as graceful-restart helper meanwhile, its next hop missing in {missing} of {readings} readings of the router's table"
    ));
    assert!(helped, "the router helped a graceful restart");
    assert_eq!(missing, 0, "the Node's next hop stayed on the router while its announcer Pod was replaced");

    // Back as the other scenarios expect it: no BFD, no graceful restart.
    let plain = RouterConfig { bfd: None, graceful_restart: false, ..router(&ctx, &node_ips, ROUTER_BFD) };
    let (c, b, conf) = (ctx.clone(), bird.clone(), plain.render());
    blocking(move || b.apply(&c.cluster, &conf)).await.unwrap_or_else(|e| panic!("the router's BIRD: {e}"));
}
