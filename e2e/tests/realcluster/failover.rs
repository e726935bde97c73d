//! Deployment mode on three Nodes: the leader's Node loses power and the other Node's manager
//! takes over once the Lease runs out, while a client on the segment keeps polling the proxied
//! address; then a drain that the PodDisruptionBudget lets through once and holds back while it
//! would take the last manager.

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use e2e::realcluster::Place;
use e2e::realcluster::traffic::Poller;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use serde_json::json;

use crate::multinode::{
    Inventory, NS, POLL, PROXIED_ADDRESS, blocking, cloud_config, first_answer, holder_node, initialized,
    install_chart, label_for_managers, lb_service, leader_node, managers_by_node, managers_ready_on, measured,
    power_off, power_on, power_on_any_stopped, service_addr, spec, web_backends,
};
use crate::{CCM_NS, Ctx, apply, is_ready, lease_holder, put_cloud_config, wait};

/// Puts the proxied pool's address on a Node's loopback (`bind: local`: the leader listens on
/// it wherever it runs).
fn bind_proxied_address(ctx: &Ctx, node: &str) {
    let address = format!("{PROXIED_ADDRESS}/32");
    ctx.cluster.command_in(Place::Node(node), "ip", &["addr", "replace", &address, "dev", "lo"]).expect("ip addr");
}

/// The router's static route to the proxied address, moved to the leading manager's Node as
/// soon as the Lease names it: what keepalived or a script does for a proxy that runs on one
/// Node at a time. It polls every 100 ms.
struct RouteFollower {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Vec<(f64, String)>>,
}

impl RouteFollower {
    fn start(ctx: Arc<Ctx>, address: Ipv4Addr) -> RouteFollower {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let t = Instant::now();
            let mut current: Option<String> = None;
            let mut moves = Vec::new();
            while !flag.load(Ordering::SeqCst) {
                if let Some(node) = leader_node(&ctx).await
                    && current.as_deref() != Some(node.as_str())
                {
                    let via = ctx.cluster.node(&node).map(|n| n.ip.to_string()).unwrap_or_default();
                    let c = ctx.clone();
                    let route = format!("{address}/32");
                    let done = blocking(move || {
                        c.cluster.command_in(Place::Router, "ip", &["route", "replace", &route, "via", &via])
                    })
                    .await;
                    if done.is_ok() {
                        moves.push((t.elapsed().as_secs_f64(), node.clone()));
                        current = Some(node);
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            moves
        });
        RouteFollower { stop, task }
    }

    async fn stop(self) -> Vec<(f64, String)> {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await.unwrap_or_default()
    }
}

/// Issue 46: the chart installed again, two manager replicas on the two added Nodes, the
/// proxied address reached by a client on the segment through the router; the leader's Node
/// powered off (kubelet and containers killed, nothing deleted): the other manager leads once
/// the Lease runs out, and the client's longest gap is measured. The Node then comes back.
pub async fn leader_failover(ctx: Arc<Ctx>) {
    let names = ctx.cluster.node_names();
    assert_eq!(names.len(), 3, "{names:?}");
    wait("three Nodes Ready", Duration::from_secs(60), || async {
        crate::multinode::all_ready(&ctx, &names).await.then_some(())
    })
    .await;
    let secs = install_chart(&ctx).await;
    measured(format!("helm install (announcers allowed, BIRD image) to the operator available: {secs:.1} s"));
    let added = names[1..].to_vec();
    for n in &added {
        label_for_managers(&ctx, n, true);
        bind_proxied_address(&ctx, n);
    }
    put_cloud_config(&ctx, &cloud_config(&ctx, &Inventory::default())).await;
    let t = Instant::now();
    apply(&ctx.client, spec("Deployment", 2, None, &[])).await;
    managers_ready_on(&ctx, &added).await;
    for n in &names {
        wait(&format!("{n} initialized"), Duration::from_secs(90), || initialized(&ctx, n)).await;
    }
    measured(format!(
        "resource applied to a manager Ready on {} and {} and all three Nodes initialized: {:.1} s",
        added[0],
        added[1],
        t.elapsed().as_secs_f64()
    ));

    web_backends(&ctx).await;
    let t = Instant::now();
    let annotations =
        json!({"ccm.rs/address-pool": "proxied", "ccm.rs/load-balancer-ips": PROXIED_ADDRESS.to_string()});
    let ip = lb_service(&ctx, "web-proxied", "web", annotations, false).await;
    assert_eq!(ip, PROXIED_ADDRESS);
    let follower = RouteFollower::start(ctx.clone(), ip);
    let addr = service_addr(ip);
    first_answer(&ctx, Some(Place::Client), addr, "web").await;
    measured(format!(
        "proxied Service created to the client's first answer through the leader: {:.1} s",
        t.elapsed().as_secs_f64()
    ));

    let poller = Poller::start(&ctx.cluster, Some(Place::Client), addr, POLL, "pod=web-").expect("the client's poller");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let holder = lease_holder(&ctx).await.expect("a leader");
    let leader = holder_node(&ctx, &holder).expect("the leader's Node");
    assert!(added.contains(&leader), "the leader runs on an added Node: {holder}");
    let (leader_pod, old_container) = managers_by_node(&ctx)
        .await
        .into_iter()
        .find(|(n, _)| *n == leader)
        .map(|(_, p)| (kube::ResourceExt::name_any(&p), container_id(&p)))
        .expect("the leader's Pod");
    let stopped_at = poller.started().elapsed();
    let t = Instant::now();
    let stop_secs = power_off(&ctx, &leader).await;
    let (new_holder, new_node) = wait("a manager on another Node leading", Duration::from_secs(150), || async {
        let h = lease_holder(&ctx).await?;
        let n = holder_node(&ctx, &h)?;
        (h != holder && n != leader).then_some((h, n))
    })
    .await;
    let lead_secs = t.elapsed().as_secs_f64();
    // Nothing told the API server: the old leader's Pod is still there, not being deleted.
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), CCM_NS);
    let left = pods.get_opt(&leader_pod).await.expect("get").expect("the old leader's Pod object is left behind");
    assert!(left.metadata.deletion_timestamp.is_none(), "nobody deleted the powered-off Node's Pod");
    wait("the client answered again", Duration::from_secs(60), || async {
        let since = stopped_at + Duration::from_secs_f64(lead_secs);
        poller.traffic().answered_since(since).then_some(())
    })
    .await;
    let back_secs = t.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let traffic = poller.stop().expect("the poller");
    let moves = follower.stop().await;
    let gap = traffic.longest_outage().map(|o| o.seconds()).unwrap_or(0.0);
    measured(format!(
        "leader failover: {leader} powered off ({stop_secs:.1} s) to {new_node}'s manager leading: {lead_secs:.1} s ({new_holder}); the old Pod still Running in the API"
    ));
    measured(format!(
        "leader failover: the client's traffic to the proxied address answered again after {back_secs:.1} s; {} (a request every 100 ms)",
        traffic.summary()
    ));
    // About the Lease duration (15 s), or about a minute when the standby's first Lease read
    // after the cut hangs (docs/real-cluster.md).
    assert!(gap > 0.0 && gap < 180.0, "a gap, and traffic again: {traffic:?}");
    let moved: Vec<String> = moves.iter().map(|(s, n)| format!("{n} at {s:.1} s")).collect();
    println!("    the router's route to {ip} followed the leader: {}", moved.join(", "));

    let secs = power_on(&ctx, &leader).await;
    bind_proxied_address(&ctx, &leader);
    let t = Instant::now();
    // The API still shows the Pod Ready from before the power cut: wait for its new container
    // (else the next scenario's drain meets it restarting, and the budget lets it go).
    wait("the same Pod Ready again in a new container", Duration::from_secs(120), || async {
        let pod = pods.get(&leader_pod).await.ok()?;
        (is_ready(&pod) && container_id(&pod).is_some() && container_id(&pod) != old_container).then_some(())
    })
    .await;
    managers_ready_on(&ctx, &added).await;
    measured(format!(
        "leader failover: {leader} started again: Ready in {secs:.1} s, its manager Pod Ready again (standby) {:.1} s later",
        t.elapsed().as_secs_f64()
    ));
    let _ = NS;
}

/// The ID of a Pod's first container (a new one after the kubelet restarted it).
fn container_id(pod: &Pod) -> Option<String> {
    pod.status.as_ref()?.container_statuses.as_ref()?.first()?.container_id.clone()
}

/// `kubectl drain` with the kit's kubectl, giving up after `timeout`.
async fn drain(ctx: &Arc<Ctx>, node: &str, timeout: &str) -> Result<String, String> {
    let (c, n, limit) = (ctx.clone(), node.to_string(), format!("--timeout={timeout}"));
    blocking(move || {
        c.cluster
            .kubectl_raw(&["drain", &n, "--ignore-daemonsets", "--delete-emptydir-data", &limit])
            .map_err(|e| e.to_string())
    })
    .await
}

fn uncordon(ctx: &Ctx, node: &str) {
    ctx.cluster.kubectl_raw(&["uncordon", node]).expect("kubectl uncordon");
}

/// The manager PodDisruptionBudget's `disruptionsAllowed`.
fn disruptions_allowed(ctx: &Ctx) -> Option<i64> {
    let name = format!("ccm-{}", crate::CCM_NAME);
    let out = ctx
        .cluster
        .kubectl_raw(&["get", "pdb", "-n", CCM_NS, &name, "-o", "jsonpath={.status.disruptionsAllowed}"])
        .ok()?;
    out.trim().parse().ok()
}

/// Issue 46: two manager replicas with their PodDisruptionBudget (minAvailable 1): draining the
/// leader's Node evicts its manager (the other leads); draining the other Node then is refused
/// while its manager is the last one, and goes through once the first Node is back.
pub async fn drain_respects_the_pdb(ctx: Arc<Ctx>) {
    power_on_any_stopped(&ctx).await;
    let names = ctx.cluster.node_names();
    let added = names[1..].to_vec();
    managers_ready_on(&ctx, &added).await;
    wait("the PodDisruptionBudget allowing one disruption", Duration::from_secs(60), || async {
        (disruptions_allowed(&ctx) == Some(1)).then_some(())
    })
    .await;
    let leader = leader_node(&ctx).await.expect("a leader");
    let other = added.iter().find(|n| **n != leader).cloned().expect("the other added Node");

    let t = Instant::now();
    drain(&ctx, &leader, "120s").await.unwrap_or_else(|e| panic!("draining {leader}: {e}"));
    let drained = t.elapsed().as_secs_f64();
    wait(&format!("{other}'s manager leading"), Duration::from_secs(60), || async {
        (leader_node(&ctx).await? == other).then_some(())
    })
    .await;
    measured(format!(
        "drain of {leader} (the leader's Node): its manager evicted in {drained:.1} s, {other}'s leading after {:.1} s",
        t.elapsed().as_secs_f64()
    ));
    // The evicted replica's replacement has nowhere to go (the other Node has a manager on the
    // same host port): one manager left, none may go.
    wait("the budget allowing no disruption", Duration::from_secs(60), || async {
        (disruptions_allowed(&ctx) == Some(0)).then_some(())
    })
    .await;
    let t = Instant::now();
    let refused = drain(&ctx, &other, "15s").await;
    let held = t.elapsed().as_secs_f64();
    let message = refused.expect_err("the PodDisruptionBudget holds the last manager back");
    assert!(message.contains("disruption budget"), "refused for the budget: {message}");
    let still = managers_by_node(&ctx).await;
    assert!(still.iter().any(|(n, p)| *n == other && is_ready(p)), "the last manager keeps running on {other}");
    measured(format!(
        "drain of {other} with one manager left: evictions refused by the PodDisruptionBudget for {held:.1} s (kubectl gave up), the manager kept"
    ));

    let t = Instant::now();
    uncordon(&ctx, &leader);
    wait(&format!("a manager Ready on {leader} again"), Duration::from_secs(120), || async {
        managers_by_node(&ctx).await.iter().any(|(n, p)| *n == leader && is_ready(p)).then_some(())
    })
    .await;
    let back = t.elapsed().as_secs_f64();
    drain(&ctx, &other, "120s").await.unwrap_or_else(|e| panic!("draining {other} once two run: {e}"));
    measured(format!(
        "uncordon of {leader} to its manager Ready: {back:.1} s; then the drain of {other} went through: {:.1} s",
        t.elapsed().as_secs_f64()
    ));
    uncordon(&ctx, &other);
    managers_ready_on(&ctx, &added).await;
}
