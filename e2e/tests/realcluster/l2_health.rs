//! Self-healing announcers on three Nodes (issue 47 item 4): the Node answering ARP for a
//! Service's address loses its kube-proxy (killed: its rules stay, its health endpoint goes)
//! while it stays up and its announcer keeps renewing its Lease; the announcer gives the address
//! up, says why on its Lease and Node, the other Node claims it, and the client follows. With
//! kube-proxy back, the first Node takes part again and wins the address back.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ccm_provider_baremetal::announce::announce_reasons::{ANNOUNCER_HEALTHY, ANNOUNCER_UNHEALTHY};
use ccm_provider_baremetal::announce::announcer::lease_name;
use ccm_provider_baremetal::announce::health::UNHEALTHY_ANNOTATION;
use e2e::realcluster::Place;
use e2e::realcluster::traffic::Poller;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams};
use serde_json::json;

use crate::l2::{ANNOUNCER_LABEL, announcers_on_added_nodes, answering_macs, records_name, settled_announcer};
use crate::multinode::{
    Inventory, L2_POOL, NS, POLL, ROLLED_ARGS, announcer_generation, announcers_rolled, blocking, client_neighbour,
    cloud_config, first_answer, lb_service, measured, service_addr, spec,
};
use crate::{CCM_NS, Ctx, apply, put_cloud_config, wait};

/// The unhealthy mark on `node`'s announcer Lease, if any.
async fn unhealthy_mark(ctx: &Ctx, node: &str) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(ctx.client.clone(), CCM_NS);
    leases.get_opt(&lease_name(node)).await.ok()??.metadata.annotations?.remove(UNHEALTHY_ANNOTATION)
}

/// The note of an event of `reason` on Node `node`, if there is one.
pub async fn node_event(ctx: &Ctx, node: &str, reason: &str) -> Option<String> {
    let events: Api<Event> = Api::namespaced(ctx.client.clone(), "default");
    events.list(&ListParams::default()).await.ok()?.items.into_iter().find_map(|e| {
        let on_node = e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(node);
        if e.reason.as_deref() == Some(reason) && on_node { e.note } else { None }
    })
}

pub async fn l2_address_moves_when_its_nodes_kube_proxy_fails_and_comes_back(ctx: Arc<Ctx>) {
    let (_, _, added) = announcers_on_added_nodes(&ctx).await;

    // Announcers that check their Node's kube-proxy every 500 ms.
    let t = Instant::now();
    let before = announcer_generation(&ctx).await;
    put_cloud_config(&ctx, &cloud_config(&ctx, &Inventory { kube_proxy_health: true, ..Inventory::default() })).await;
    let announcer = json!({"l2": true, "nodeSelector": {ANNOUNCER_LABEL: "true"}});
    apply(&ctx.client, spec("DaemonSet", 2, Some(announcer), ROLLED_ARGS)).await;
    announcers_rolled(&ctx, 2, before).await;
    measured(format!("announcers checking kube-proxy rolled out: {:.1} s", t.elapsed().as_secs_f64()));

    let annotations = json!({"ccm.rs/address-pool": "l2", "ccm.rs/ip-mode": "VIP"});
    let ip = lb_service(&ctx, "web-l2h", "web", annotations, false).await;
    assert!(L2_POOL.0 <= ip && ip <= L2_POOL.1, "an address of the l2 pool: {ip}");
    let addr = service_addr(ip);
    first_answer(&ctx, Some(Place::Client), addr, "web").await;
    let (first_mac, announcing) = settled_announcer(&ctx, ip, &added).await;
    let other = added.iter().find(|n| **n != announcing).cloned().expect("the other added Node");
    let other_mac = ctx.cluster.segment_mac(&other).unwrap_or_else(|e| panic!("{other}'s hardware address: {e}"));
    assert_eq!(unhealthy_mark(&ctx, &announcing).await, None, "healthy announcers carry no mark");
    records_name(&ctx, "web-l2h", &announcing).await;

    // kube-proxy dies on the announcing Node; the Node, its kubelet and its announcer live on.
    let poller = Poller::start(&ctx.cluster, Some(Place::Client), addr, POLL, "pod=web-").expect("the client's poller");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let killed_at = poller.started().elapsed();
    let t = Instant::now();
    let (c, n) = (ctx.clone(), announcing.clone());
    blocking(move || c.cluster.kill_kube_proxy(&n)).await.unwrap_or_else(|e| panic!("killing kube-proxy: {e}"));
    let marked = wait(&format!("{announcing}'s Lease marked unhealthy"), Duration::from_secs(30), || async {
        let mark = unhealthy_mark(&ctx, &announcing).await?;
        Some((mark, t.elapsed().as_secs_f64()))
    })
    .await;
    assert!(
        marked.0.starts_with("kube-proxy's health check failed 2 times in a row"),
        "the Lease says why: {}",
        marked.0
    );
    let moved = wait(&format!("the client's neighbour entry for {ip} naming {other}"), Duration::from_secs(60), || {
        let entry = client_neighbour(&ctx, ip);
        let (mac, elapsed) = (other_mac.clone(), t.elapsed().as_secs_f64());
        async move { entry.contains(&mac).then_some(elapsed) }
    })
    .await;
    wait("the client answered through the other Node", Duration::from_secs(60), || async {
        poller.traffic().answered_since(killed_at + Duration::from_secs_f64(moved)).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let traffic = poller.stop().expect("the poller");
    assert_eq!(
        answering_macs(&ctx, ip).await,
        BTreeSet::from([other_mac.clone()]),
        "only {other} answers ARP for {ip}"
    );
    let note = wait(&format!("an {ANNOUNCER_UNHEALTHY} event on Node {announcing}"), Duration::from_secs(30), || {
        node_event(&ctx, &announcing, ANNOUNCER_UNHEALTHY)
    })
    .await;
    assert!(note.contains("kube-proxy's health check failed"), "{note}");
    // On the resource too: `Announcing` False naming the Node and why.
    let why = format!("{announcing}: kube-proxy's health check failed");
    crate::bgp::announcing_is(&ctx, "False", crds::reasons::announcing::ANNOUNCER_UNHEALTHY, |m| m.contains(&why))
        .await;
    // The unhealthy Node deletes its own record; the other's names it.
    records_name(&ctx, "web-l2h", &other).await;
    measured(format!(
        "L2 self-healing: {announcing}'s kube-proxy killed to its Lease marked unhealthy {:.1} s, to the client's neighbour entry naming {other} {moved:.1} s; {} (a request every 100 ms; the Node stayed up)",
        marked.1,
        traffic.summary()
    ));

    // kube-proxy back: the mark goes and the elected Node answers again.
    let t = Instant::now();
    let (c, n) = (ctx.clone(), announcing.clone());
    blocking(move || c.cluster.start_kube_proxy(&n)).await.unwrap_or_else(|e| panic!("starting kube-proxy: {e}"));
    let healthy = wait(&format!("{announcing}'s unhealthy mark gone"), Duration::from_secs(60), || async {
        unhealthy_mark(&ctx, &announcing).await.is_none().then(|| t.elapsed().as_secs_f64())
    })
    .await;
    let back = wait(
        &format!("the client's neighbour entry for {ip} naming {announcing} again"),
        Duration::from_secs(60),
        || {
            let entry = client_neighbour(&ctx, ip);
            let (mac, elapsed) = (first_mac.clone(), t.elapsed().as_secs_f64());
            async move { entry.contains(&mac).then_some(elapsed) }
        },
    )
    .await;
    first_answer(&ctx, Some(Place::Client), addr, "web").await;
    records_name(&ctx, "web-l2h", &announcing).await;
    wait(&format!("an {ANNOUNCER_HEALTHY} event on Node {announcing}"), Duration::from_secs(30), || {
        node_event(&ctx, &announcing, ANNOUNCER_HEALTHY)
    })
    .await;
    measured(format!(
        "L2 self-healing: {announcing}'s kube-proxy started again to its mark gone {healthy:.1} s, to the client's neighbour entry naming it again {back:.1} s"
    ));

    // Leave the cluster as the other scenarios expect it: no such Service, announcers without
    // the kube-proxy check.
    let services: Api<Service> = Api::namespaced(ctx.client.clone(), NS);
    let _ = services.delete("web-l2h", &DeleteParams::default()).await;
    let before = announcer_generation(&ctx).await;
    put_cloud_config(&ctx, &cloud_config(&ctx, &Inventory::default())).await;
    announcers_rolled(&ctx, 2, before).await;
}
