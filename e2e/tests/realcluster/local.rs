//! `externalTrafficPolicy: Local` on three Nodes: one web Pod on one added Node; kube-proxy's
//! health-check port and NodePort answer on that Node only, the L2 announcer on that Node is the
//! one answering ARP, the proxy data path forwards to that Node only; the Pod moved to the other
//! added Node, the announcement and the proxy follow it.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use e2e::realcluster::Place;
use e2e::realcluster::traffic::http_get;
use k8s_openapi::api::core::v1::Service;
use kube::api::Api;
use serde_json::json;

use crate::multinode::{
    L2_POOL, NS, all_ready, arp_replies, blocking, first_answer, lb_service, measured, power_on_any_stopped,
    service_addr, web_deployment,
};
use crate::{Ctx, wait};

/// The backend Deployment of this scenario (label `app=web-local`).
const APP: &str = "web-local";
/// Requests sent through the proxy data path after each move; every one must be answered.
const PROXY_REQUESTS: usize = 20;

/// What a request from the client to `addr` got: the status line's code for an HTTP answer,
/// `None` when nothing answered.
fn status_from_client(ctx: &Arc<Ctx>, addr: SocketAddr) -> Option<u16> {
    let body = ctx.cluster.run_in(Place::Client, move || http_get(addr)).ok()?.ok()?;
    body.lines().next()?.split_whitespace().nth(1)?.parse().ok()
}

/// Whether a request from the client to `addr` reached a Pod of [`APP`].
fn answered_from_client(ctx: &Arc<Ctx>, addr: SocketAddr) -> bool {
    let body = ctx.cluster.run_in(Place::Client, move || http_get(addr)).ok().and_then(Result::ok);
    body.is_some_and(|b| b.contains(&format!("pod={APP}-")))
}

/// The Service's NodePort and health-check NodePort.
async fn node_ports(ctx: &Ctx, name: &str) -> (u16, u16) {
    let services: Api<Service> = Api::namespaced(ctx.client.clone(), NS);
    let spec = services.get(name).await.ok().and_then(|s| s.spec).expect("the Service's spec");
    let port = spec.ports.as_ref().and_then(|p| p.first()).and_then(|p| p.node_port).expect("a NodePort");
    let health = spec.health_check_node_port.expect("a health-check NodePort (externalTrafficPolicy: Local)");
    (u16::try_from(port).expect("a port"), u16::try_from(health).expect("a port"))
}

/// Each Node's address and what its health-check port and NodePort answer the client.
async fn per_node(ctx: &Arc<Ctx>, names: &[String], node_port: u16, health: u16) -> Vec<(String, Option<u16>, bool)> {
    let mut out = Vec::new();
    for n in names {
        let ip = IpAddr::V4(ctx.cluster.node(n).map(|p| p.ip).expect("a Node's address"));
        let c = ctx.clone();
        let (code, answered) = blocking(move || {
            (
                status_from_client(&c, SocketAddr::new(ip, health)),
                answered_from_client(&c, SocketAddr::new(ip, node_port)),
            )
        })
        .await;
        out.push((n.clone(), code, answered));
    }
    out
}

/// Waits until kube-proxy answers on `with` only: its health-check port 200 and its NodePort
/// reaching the Pod, every other Node's health-check port 503 and its NodePort silent.
async fn kube_proxy_answers_on(ctx: &Arc<Ctx>, names: &[String], with: &str, node_port: u16, health: u16) {
    let seen =
        wait(&format!("kube-proxy answering for the Service on {with} only"), Duration::from_secs(60), || async {
            let all = per_node(ctx, names, node_port, health).await;
            all.iter()
                .all(
                    |(n, code, answered)| {
                        if n == with { *code == Some(200) && *answered } else { *code == Some(503) && !*answered }
                    },
                )
                .then_some(all)
        })
        .await;
    for (n, code, answered) in seen {
        eprintln!("    {n}: health-check port {code:?}, NodePort answered: {answered}");
    }
}

/// Waits until ARP requests for `ip` are answered by `node`'s hardware address alone.
async fn arp_answered_by(ctx: &Arc<Ctx>, ip: Ipv4Addr, node: &str) {
    let mac = ctx.cluster.segment_mac(node).unwrap_or_else(|e| panic!("{node}'s hardware address: {e}"));
    wait(&format!("only {node} answering ARP for {ip}"), Duration::from_secs(60), || async {
        let c = ctx.clone();
        let answering: BTreeSet<String> = blocking(move || arp_replies(&c, ip)).await.into_iter().collect();
        (answering == BTreeSet::from([mac.clone()])).then_some(())
    })
    .await;
}

/// Sends [`PROXY_REQUESTS`] requests from the host through the proxy data path; how many a Pod
/// of [`APP`] answered.
async fn through_the_proxy(addr: SocketAddr) -> usize {
    blocking(move || {
        (0..PROXY_REQUESTS).filter(|_| http_get(addr).is_ok_and(|b| b.contains(&format!("pod={APP}-")))).count()
    })
    .await
}

/// Issue 46: a Service with `externalTrafficPolicy: Local` and its one Pod on an added Node is
/// answered only where that Pod runs: by kube-proxy (health-check port and NodePort), by the L2
/// announcement (the Node with the endpoint answers ARP), and by the proxy data path (which
/// checks each Node's health-check port). The Pod moves to the other added Node and all three
/// follow; the time is measured.
pub async fn local_policy_answered_only_where_an_endpoint_runs(ctx: Arc<Ctx>) {
    power_on_any_stopped(&ctx).await;
    let names = ctx.cluster.node_names();
    wait("the three Nodes Ready", Duration::from_secs(60), || async { all_ready(&ctx, &names).await.then_some(()) })
        .await;
    let (first, second) = (names[1].clone(), names[2].clone());
    web_deployment(&ctx, APP, 1, &first).await;

    let t = Instant::now();
    let vip = json!({"ccm.rs/address-pool": "l2", "ccm.rs/ip-mode": "VIP"});
    let ip = lb_service(&ctx, "web-local-l2", APP, vip, true).await;
    assert!(L2_POOL.0 <= ip && ip <= L2_POOL.1, "an address of the l2 pool: {ip}");
    let conditions = lb_conditions(&ctx, "web-local-l2").await;
    measured(format!("the Service's load-balancer conditions (KEP-6128) on the real cluster: {conditions}"));
    let (node_port, health) = node_ports(&ctx, "web-local-l2").await;
    kube_proxy_answers_on(&ctx, &names, &first, node_port, health).await;
    arp_answered_by(&ctx, ip, &first).await;
    flush_neighbour(&ctx, ip);
    first_answer(&ctx, Some(Place::Client), service_addr(ip), APP).await;
    measured(format!(
        "Local policy, L2: Service created to only {first} (the Pod's Node) answering ARP and the client answered: {:.1} s",
        t.elapsed().as_secs_f64()
    ));

    let t = Instant::now();
    let proxied = lb_service(&ctx, "web-local-proxy", APP, json!({"ccm.rs/address-pool": "loopback"}), true).await;
    let proxy_addr = service_addr(proxied);
    first_answer(&ctx, None, proxy_addr, APP).await;
    let answered = through_the_proxy(proxy_addr).await;
    assert_eq!(answered, PROXY_REQUESTS, "the proxy forwards to the Node with the endpoint only");
    measured(format!(
        "Local policy, proxy data path: Service created to the first answer: {:.1} s; then {answered}/{PROXY_REQUESTS} answered",
        t.elapsed().as_secs_f64()
    ));

    // The Pod moves: the new one on the other added Node, the old one gone.
    let t = Instant::now();
    web_deployment(&ctx, APP, 1, &second).await;
    kube_proxy_answers_on(&ctx, &names, &second, node_port, health).await;
    let proxy_on_the_new_node = t.elapsed().as_secs_f64();
    arp_answered_by(&ctx, ip, &second).await;
    let arp_moved = t.elapsed().as_secs_f64();
    flush_neighbour(&ctx, ip);
    first_answer(&ctx, Some(Place::Client), service_addr(ip), APP).await;
    wait("the proxy data path answering every request again", Duration::from_secs(60), || async {
        (through_the_proxy(proxy_addr).await == PROXY_REQUESTS).then_some(())
    })
    .await;
    measured(format!(
        "Local policy, the Pod moved from {first} to {second}: kube-proxy answering on {second} only after {proxy_on_the_new_node:.1} s, ARP answered by {second} only after {arp_moved:.1} s, every proxied request answered after {:.1} s",
        t.elapsed().as_secs_f64()
    ));

    for what in ["service/web-local-l2", "service/web-local-proxy", "deployment/web-local"] {
        ctx.cluster.kubectl_raw(&["delete", "-n", NS, what, "--wait=false"]).expect("deleting what the scenario made");
    }
}

/// Waits until the manager wrote KEP-6128's conditions on Service `name` as a served load
/// balancer has them (`Accepted` and `Programmed` True, `Degraded` False, each for the current
/// generation); returns them as `Type=Status (Reason)`.
async fn lb_conditions(ctx: &Ctx, name: &str) -> String {
    let services: Api<Service> = Api::namespaced(ctx.client.clone(), NS);
    wait(&format!("{name}'s Accepted, Programmed and Degraded conditions"), Duration::from_secs(60), || async {
        let s = services.get(name).await.ok()?;
        let generation = s.metadata.generation;
        let all = s.status?.conditions?;
        let want = [("Accepted", "True"), ("Programmed", "True"), ("Degraded", "False")];
        let found: Vec<String> = want
            .iter()
            .map(|(t, v)| {
                let c = all.iter().find(|c| c.type_ == *t && c.status == *v && c.observed_generation == generation)?;
                Some(format!("{t}={v} ({})", c.reason))
            })
            .collect::<Option<_>>()?;
        Some(found.join(", "))
    })
    .await
}

/// Drops the client's neighbour entry for `ip`, so its next request resolves the address again.
fn flush_neighbour(ctx: &Ctx, ip: Ipv4Addr) {
    let flush = ctx.cluster.command_in(Place::Client, "ip", &["neigh", "flush", "to", &ip.to_string()]);
    flush.unwrap_or_else(|e| panic!("flushing the client's neighbour entry: {e}"));
}
