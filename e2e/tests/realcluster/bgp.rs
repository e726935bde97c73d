//! BGP on three Nodes through the operator-rendered announcer: its BIRD sidecar (the image the
//! project's image builder made from the Dockerfile's `bird` target) peers with the router's
//! BIRD from every Node; the router holds one route with a next hop per Node (ECMP); a Node
//! powered off has its next hop withdrawn within the hold time while a client keeps polling;
//! back on, it is announced again.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ccm_provider_baremetal::announce::announce_reasons::{BGP_SESSION_ESTABLISHED, BGP_SESSION_LOST};
use ccm_provider_baremetal::announce::announcer::lease_name;
use ccm_provider_baremetal::announce::bgp_sessions::SESSIONS_ANNOTATION;
use e2e::realcluster::Place;
use e2e::realcluster::router::{RouterBird, RouterConfig, router_next_hops};
use e2e::realcluster::traffic::Poller;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use serde_json::json;

use crate::l2::{ANNOUNCER_LABEL, label_for_announcers};
use crate::multinode::{
    BGP_ADDRESS, Inventory, NODE_ASN, POLL, ROLLED_ARGS, ROUTER_ASN, all_ready, announcer_generation,
    announcers_rolled, blocking, cloud_config, first_answer, label_for_managers, lb_service, measured, power_off,
    power_on, power_on_any_stopped, service_addr, spec,
};
use crate::{CCM_NAME, CCM_NS, Ctx, apply, put_cloud_config, wait};

/// The hold time both sides use (the cloud-config's `holdTime` and the router's offer): a
/// silent Node's routes go within it.
pub const HOLD_SECONDS: u16 = 3;
/// The uid BIRD runs as in the sidecar (the operator's `NON_ROOT_UID`).
const BIRD_UID: &str = "65532";

/// A Node's address on the router's segment: an added Node's own address; the host's Node
/// (whose node address is elsewhere) its bridge's, where its BIRD's sessions come from.
pub fn segment_ip(ctx: &Ctx, node: &str) -> Ipv4Addr {
    if node == ctx.cluster.node_name {
        ctx.cluster.network.segment_address(1)
    } else {
        ctx.cluster.node(node).map(|p| p.ip).expect("a Node's address")
    }
}

/// The router's next hops for the BGP address, as a set.
pub async fn next_hops(ctx: &Arc<Ctx>) -> BTreeSet<Ipv4Addr> {
    let c = ctx.clone();
    blocking(move || router_next_hops(&c.cluster, BGP_ADDRESS).unwrap_or_default()).await.into_iter().collect()
}

/// Waits until the router's route to the BGP address has exactly `hops` as next hops; returns
/// the seconds since `since`.
pub async fn route_via(ctx: &Arc<Ctx>, hops: &BTreeSet<Ipv4Addr>, since: Instant) -> f64 {
    wait(&format!("the router's route to {BGP_ADDRESS} via {hops:?}"), Duration::from_secs(120), || async {
        (next_hops(ctx).await == *hops).then(|| since.elapsed().as_secs_f64())
    })
    .await
}

/// Once every one of `nodes`' announcer Leases names its BGP sessions all established (`up`)
/// or none (`!up`): when that was seen.
async fn sessions_in_leases(ctx: &Ctx, nodes: &[String], up: bool) -> Instant {
    let leases: Api<Lease> = Api::namespaced(ctx.client.clone(), CCM_NS);
    let what = if up { "Established" } else { "not Established" };
    wait(&format!("every announcer Lease naming its BGP sessions {what}"), Duration::from_secs(60), || async {
        let all = nodes.iter().map(|node| {
            let leases = leases.clone();
            async move {
                let lease = leases.get_opt(&lease_name(node)).await.ok()??;
                let text = lease.metadata.annotations?.remove(SESSIONS_ANNOTATION)?;
                let sessions: Vec<serde_json::Value> = serde_json::from_str(&text).ok()?;
                let established = sessions.iter().filter(|s| s["state"] == "Established").count();
                (!sessions.is_empty() && (if up { established == sessions.len() } else { established == 0 }))
                    .then_some(())
            }
        });
        futures::future::join_all(all).await.into_iter().all(|r| r.is_some()).then_some(())
    })
    .await;
    Instant::now()
}

/// The announcer Pods (not being deleted) by Node.
pub async fn announcer_pods(ctx: &Ctx) -> Vec<(String, Pod)> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), CCM_NS);
    let prefix = format!("ccm-{CCM_NAME}-announcer-");
    let list = pods.list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default();
    list.into_iter()
        .filter(|p| p.name_any().starts_with(&prefix) && p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| Some((p.spec.as_ref()?.node_name.clone()?, p)))
        .collect()
}

/// Runs `sh -c SCRIPT` in a Pod's container; its output.
pub fn exec(ctx: &Ctx, pod: &str, container: &str, script: &str) -> String {
    ctx.cluster
        .kubectl_raw(&["exec", "-n", CCM_NS, pod, "-c", container, "--", "sh", "-c", script])
        .unwrap_or_else(|e| panic!("exec in {pod}/{container}: {e}"))
}

/// The BGP scenarios' start: the BIRD image built, all three Nodes on and Ready, labelled for
/// announcers, the host's for managers; the Node names and their addresses on the router's
/// segment.
pub async fn three_bgp_nodes(ctx: &Arc<Ctx>) -> (Vec<String>, BTreeSet<Ipv4Addr>) {
    assert!(
        ctx.bird_image,
        "the BIRD sidecar image was not built: install Debian's bird2 (apt-get install bird2), as .ci/run does"
    );
    power_on_any_stopped(ctx).await;
    let names = ctx.cluster.node_names();
    wait("the three Nodes Ready", Duration::from_secs(60), || async { all_ready(ctx, &names).await.then_some(()) })
        .await;
    for n in &names {
        label_for_announcers(ctx, n);
    }
    label_for_managers(ctx, &ctx.cluster.node_name, true);
    let node_ips = names.iter().map(|n| segment_ip(ctx, n)).collect();
    (names, node_ips)
}

/// Issue 46 (and issue 45's proof on a real Pod): announcers with `l2` and `bgp` on all three
/// Nodes; each Pod's BIRD sidecar runs as the non-root user, reads the configuration the
/// announcer (root, for `NET_RAW`) wrote owner- and group-readable only, and peers with the
/// router; a `VIP` Service of the `bgp` pool is routed by the router to all three Nodes; a Node
/// powered off is withdrawn within the hold time, and the client's longest gap is measured.
pub async fn bgp_every_node_peers_with_the_router_ecmp_and_a_stopped_node_is_withdrawn(ctx: Arc<Ctx>) {
    let (names, node_ips) = three_bgp_nodes(&ctx).await;
    let router = RouterConfig {
        address: ctx.cluster.network.router_address(),
        asn: ROUTER_ASN,
        peer_asn: NODE_ASN,
        peers: node_ips.iter().copied().collect(),
        hold_seconds: HOLD_SECONDS,
        bfd: None,
        graceful_restart: false,
    };
    let bird = RouterBird::of(&ctx.cluster);
    let (c, b, conf) = (ctx.clone(), bird.clone(), router.render());
    blocking(move || b.apply(&c.cluster, &conf)).await.unwrap_or_else(|e| panic!("the router's BIRD: {e}"));

    let t = Instant::now();
    let before = announcer_generation(&ctx).await;
    put_cloud_config(&ctx, &cloud_config(&ctx, &Inventory { bgp: true, ..Inventory::default() })).await;
    let announcer = json!({"l2": true, "bgp": true, "nodeSelector": {ANNOUNCER_LABEL: "true"},
                           "metricsPort": crate::announcer_metrics::METRICS_PORT});
    apply(&ctx.client, spec("DaemonSet", 2, Some(announcer), ROLLED_ARGS)).await;
    announcers_rolled(&ctx, 3, before).await;
    let rolled = t.elapsed().as_secs_f64();
    let sessions = wait("a BGP session with every Node Established", Duration::from_secs(120), || async {
        let b = bird.clone();
        let up = blocking(move || b.established()).await.ok()?;
        (up.len() == names.len()).then(|| t.elapsed().as_secs_f64())
    })
    .await;
    measured(format!(
        "BGP: announcers with the BIRD sidecar applied to all three rolled out: {rolled:.1} s; every session with the router Established: {sessions:.1} s"
    ));

    // The sessions as data (issue 47 item 1): each announcer's Lease names its session with the
    // router and its state; the router shutting them down is a BGPSessionLost event on every
    // Node, and their return a BGPSessionEstablished.
    let t = Instant::now();
    let recorded = sessions_in_leases(&ctx, &names, true).await;
    let b = bird.clone();
    blocking(move || b.birdc(&["disable", "\"peer_*\""]))
        .await
        .unwrap_or_else(|e| panic!("disabling the router's sessions: {e}"));
    let t_lost = Instant::now();
    let lost = sessions_in_leases(&ctx, &names, false).await;
    for node in &names {
        let note = wait(&format!("a BGPSessionLost event on {node}"), Duration::from_secs(30), || {
            crate::l2_health::node_event(&ctx, node, BGP_SESSION_LOST)
        })
        .await;
        assert!(note.contains("(was Established)"), "{note}");
    }
    let lost_events = t_lost.elapsed().as_secs_f64();
    // And on the resource: `Announcing` False naming every Node's session.
    let every_node = |m: &str| names.iter().all(|node| m.contains(&format!("{node} to ")));
    announcing_is(&ctx, "False", crds::reasons::announcing::BGP_SESSION_DOWN, every_node).await;
    let condition_down = t_lost.elapsed().as_secs_f64();
    let b = bird.clone();
    blocking(move || b.birdc(&["enable", "\"peer_*\""]))
        .await
        .unwrap_or_else(|e| panic!("enabling the router's sessions: {e}"));
    let t_back = Instant::now();
    let back = sessions_in_leases(&ctx, &names, true).await;
    for node in &names {
        wait(&format!("a BGPSessionEstablished event on {node}"), Duration::from_secs(30), || {
            crate::l2_health::node_event(&ctx, node, BGP_SESSION_ESTABLISHED)
        })
        .await;
    }
    let all_up = format!("{} BGP sessions established", names.len());
    announcing_is(&ctx, "True", crds::reasons::announcing::AS_EXPECTED, |m| m.contains(&all_up)).await;
    let condition_up = t_back.elapsed().as_secs_f64();
    measured(format!(
        "BGP sessions as data: every announcer Lease naming its session Established {:.1} s after all were; the router's sessions disabled to every Lease saying so {:.1} s, a BGPSessionLost event on every Node {lost_events:.1} s, the resource's Announcing=False BGPSessionDown {condition_down:.1} s; enabled to every Lease Established {:.1} s, Announcing=True {condition_up:.1} s (read every 2 s)",
        recorded.duration_since(t).as_secs_f64(),
        lost.duration_since(t_lost).as_secs_f64(),
        back.duration_since(t_back).as_secs_f64()
    ));

    // The sidecar as the operator renders it: not root, and the config it reads is not world-
    // readable (the announcer writes it as root; the Pod's fsGroup lets BIRD read it).
    for (node, pod) in announcer_pods(&ctx).await {
        let pod = pod.name_any();
        let id = exec(&ctx, &pod, "bird", "id -u");
        assert_eq!(id.trim(), BIRD_UID, "BIRD on {node} runs as the non-root user");
        let mode = exec(&ctx, &pod, "bird", "stat -c %a /run/bird/bird.conf");
        assert_eq!(mode.trim(), "640", "the config on {node} is readable by its owner and group only");
        let socket = exec(&ctx, &pod, "bird", "test -S /run/bird/bird.ctl && echo socket");
        assert_eq!(socket.trim(), "socket", "BIRD on {node} listens on the control socket the announcer drives");
    }

    let t = Instant::now();
    let annotations = json!({"ccm.rs/address-pool": "bgp", "ccm.rs/ip-mode": "VIP"});
    let ip = lb_service(&ctx, "web-bgp", "web", annotations, false).await;
    assert_eq!(ip, BGP_ADDRESS, "the bgp pool's one address");
    let ecmp = route_via(&ctx, &node_ips, t).await;
    let addr = service_addr(ip);
    first_answer(&ctx, Some(Place::Client), addr, "web").await;
    measured(format!(
        "BGP: Service created to the router's route via all three Nodes (ECMP): {ecmp:.1} s; to the client's first answer: {:.1} s",
        t.elapsed().as_secs_f64()
    ));

    // The same as metrics (issue 47 item 1): every announcer's endpoint, through the genuine
    // authenticator and authorizer, shows its session with the router up and the address.
    let t = Instant::now();
    let router_ip = ctx.cluster.network.router_address();
    let seen = crate::announcer_metrics::scrape_every_announcer(&ctx, |_| {
        vec![
            format!(r#"ccm_announcer_bgp_session_up{{peer="{router_ip}",state="Established"}} 1"#),
            format!(r#"ccm_announcer_announced{{protocol="bgp",address="{BGP_ADDRESS}"}} 1"#),
            "ccm_announcer_healthy 1".to_string(),
        ]
    })
    .await;
    assert_eq!(seen.len(), names.len(), "one endpoint per Node: {seen:?}");
    measured(format!(
        "announcer metrics (HTTPS, TokenReview and SubjectAccessReview on the genuine API server): no token 401, a ServiceAccount without get /metrics 403, the reader's scrape of all three in {:.1} s: {}",
        t.elapsed().as_secs_f64(),
        seen.join(" | ")
    ));

    // ECMP hashes each flow to one next hop; hashing on ports too spreads the client's requests
    // (a connection each) over the three Nodes, so some go through the Node that is stopped.
    let hash = ["-w", "net.ipv4.fib_multipath_hash_policy=1"];
    ctx.cluster.command_in(Place::Router, "sysctl", &hash).expect("the router's ECMP hash on ports");
    let stopped = names[1].clone();
    let stopped_ip = segment_ip(&ctx, &stopped);
    let rest: BTreeSet<Ipv4Addr> = node_ips.iter().copied().filter(|a| *a != stopped_ip).collect();
    let poller = Poller::start(&ctx.cluster, Some(Place::Client), addr, POLL, "pod=web-").expect("the client's poller");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let stopped_at = poller.started().elapsed();
    let t = Instant::now();
    let stop_secs = power_off(&ctx, &stopped).await;
    let withdrawn = route_via(&ctx, &rest, t).await;
    wait("the client answered after the withdrawal", Duration::from_secs(60), || async {
        poller.traffic().answered_since(stopped_at + Duration::from_secs_f64(withdrawn)).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let traffic = poller.stop().expect("the poller");
    let gap = traffic.longest_outage().map(|o| o.seconds()).unwrap_or(0.0);
    measured(format!(
        "BGP withdrawal: {stopped} powered off ({stop_secs:.1} s) to the router's route without it: {withdrawn:.1} s (hold time {HOLD_SECONDS} s); {}; failures from {} (a request every 100 ms, each its own connection, hashed over the Nodes)",
        traffic.summary(),
        traffic
            .failure_window()
            .map(|(a, b)| format!("{:.1} s to {:.1} s after the poller started", a.as_secs_f64(), b.as_secs_f64()))
            .unwrap_or_else(|| "none".into())
    ));
    assert!(
        withdrawn < f64::from(HOLD_SECONDS) + 10.0,
        "withdrawn within the hold time and a little: {withdrawn:.1} s"
    );
    assert!(gap < f64::from(HOLD_SECONDS) + 10.0, "traffic again once withdrawn: {traffic:?}");
    if let Some((_, last)) = traffic.failure_window() {
        let after_cut = last.as_secs_f64() - stopped_at.as_secs_f64();
        assert!(after_cut < withdrawn + 2.0, "no request fails once the route is withdrawn: {after_cut:.1} s");
    }

    let secs = power_on(&ctx, &stopped).await;
    let t = Instant::now();
    let back = route_via(&ctx, &node_ips, t).await;
    measured(format!("BGP: {stopped} started again: Ready in {secs:.1} s, its next hop back {back:.1} s later"));
}

/// Once the resource's `Announcing` condition has `status` and `reason` and a message `check`
/// accepts (the operator may see the announcers' Leases change one by one): that message.
pub async fn announcing_is(ctx: &Ctx, status: &str, reason: &str, check: impl Fn(&str) -> bool) -> String {
    let crs: Api<crds::CloudControllerManager> = Api::namespaced(ctx.client.clone(), crate::CCM_NS);
    wait(&format!("the resource's Announcing {status} {reason}"), Duration::from_secs(30), || async {
        let cr = crs.get_opt(crate::CCM_NAME).await.ok()??;
        let c = cr.status?.conditions.into_iter().find(|c| c.type_ == crds::conditions::types::ANNOUNCING)?;
        (c.status == status && c.reason == reason && check(&c.message)).then_some(c.message)
    })
    .await
}
