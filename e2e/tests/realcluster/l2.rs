//! L2 announcement on three Nodes: announcers on the two added Nodes, one of them answering
//! ARP for a Service's address; that Node loses power and the other claims the address, seen
//! from the client's neighbour table, while the client keeps polling the address.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crds::announcement::ServiceAnnouncement;
use e2e::realcluster::Place;
use e2e::realcluster::traffic::Poller;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use serde_json::json;

use crate::multinode::{
    L2_POOL, POLL, ROLLED_ARGS, all_ready, announcers_rolled, arp_replies, blocking, client_neighbour, first_answer,
    label_for_managers, lb_service, leader_node, managers_by_node, measured, node_of_mac, power_off, power_on,
    power_on_any_stopped, service_addr, spec,
};
use crate::{CCM_NAME, CCM_NS, Ctx, apply, is_ready, wait};

/// The label that puts announcers on a Node (`spec.announcer.nodeSelector`).
pub const ANNOUNCER_LABEL: &str = "ccm-e2e/announcer";

/// Labels a Node for the announcers.
pub fn label_for_announcers(ctx: &Ctx, node: &str) {
    let label = format!("{ANNOUNCER_LABEL}=true");
    ctx.cluster.kubectl_raw(&["label", "node", node, &label, "--overwrite"]).expect("labelling a Node");
}

/// The announcer Pod on `node` (not being deleted) and its first container's ID.
async fn announcer_on(ctx: &Ctx, node: &str) -> Option<(Pod, Option<String>)> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), CCM_NS);
    let prefix = format!("ccm-{CCM_NAME}-announcer-");
    let list = pods.list(&ListParams::default()).await.ok()?;
    let pod = list.items.into_iter().find(|p| {
        p.name_any().starts_with(&prefix)
            && p.metadata.deletion_timestamp.is_none()
            && p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node)
    })?;
    let id = pod.status.as_ref()?.container_statuses.as_ref()?.first()?.container_id.clone();
    Some((pod, id))
}

/// Powers on what an earlier failure left off, and labels the two added Nodes for announcers
/// and the host's Node alone for managers; returns every Node's name, the host's and the added
/// ones'.
pub async fn announcers_on_added_nodes(ctx: &Arc<Ctx>) -> (Vec<String>, String, Vec<String>) {
    power_on_any_stopped(ctx).await;
    let names = ctx.cluster.node_names();
    let host = ctx.cluster.node_name.clone();
    let added = names[1..].to_vec();
    for n in &added {
        label_for_managers(ctx, n, false);
        label_for_announcers(ctx, n);
    }
    label_for_managers(ctx, &host, true);
    (names, host, added)
}

/// Once one Node answers ARP for `ip` (see [`one_node_answers`]) and the client reached the
/// Service through it after resolving the address again: its hardware address and name, one of
/// `added`.
pub async fn settled_announcer(ctx: &Arc<Ctx>, ip: Ipv4Addr, added: &[String]) -> (String, String) {
    let mac = one_node_answers(ctx, ip).await;
    // The client may still hold the first announcer's address: resolve it again.
    let flush = ctx.cluster.command_in(Place::Client, "ip", &["neigh", "flush", "to", &ip.to_string()]);
    flush.unwrap_or_else(|e| panic!("flushing the client's neighbour entry: {e}"));
    first_answer(ctx, Some(Place::Client), service_addr(ip), "web").await;
    let node = node_of_mac(ctx, &mac).expect("the answering hardware address is a Node's");
    assert!(added.contains(&node), "an announcing Node is an added one: {node}");
    (mac, node)
}

/// The hardware address of the one Node answering ARP for `ip`, once the same one answers twice
/// in a row: the first announcer live may answer before the other has been live long enough to
/// take part (docs/l2-announcement.md).
pub async fn one_node_answers(ctx: &Arc<Ctx>, ip: Ipv4Addr) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut previous = BTreeSet::new();
    loop {
        let now = answering_macs(ctx, ip).await;
        if now.len() == 1 && now == previous {
            return now.into_iter().next().unwrap_or_default();
        }
        assert!(Instant::now() < deadline, "exactly one Node answers ARP for {ip}: {now:?}");
        previous = now;
    }
}

/// The distinct hardware addresses that answered the client's ARP requests for `ip`.
pub async fn answering_macs(ctx: &Arc<Ctx>, ip: Ipv4Addr) -> BTreeSet<String> {
    let c = ctx.clone();
    blocking(move || arp_replies(&c, ip)).await.into_iter().collect()
}

/// Once the `ServiceAnnouncement` records of Service `service` (in the multi-Node namespace) name
/// exactly `node` (issue 47 item 1: which Node answers, as data): when that was seen.
pub async fn records_name(ctx: &Arc<Ctx>, service: &str, node: &str) -> Instant {
    let records: Api<ServiceAnnouncement> = Api::namespaced(ctx.client.clone(), CCM_NS);
    wait(
        &format!("the ServiceAnnouncement records of {service} naming {node} alone"),
        Duration::from_secs(60),
        || async {
            let list = records.list(&ListParams::default()).await.ok()?.items;
            let nodes: Vec<String> = list
                .into_iter()
                .filter(|r| r.spec.service.namespace == crate::multinode::NS && r.spec.service.name == service)
                .map(|r| r.spec.node)
                .collect();
            (nodes == [node]).then_some(())
        },
    )
    .await;
    Instant::now()
}

/// Issue 46: the manager on the host's Node only (never stopped, so this measures the
/// announcers alone), announcers on the two added Nodes; a `VIP` Service of the `l2` pool is
/// answered by exactly one of them; that Node powered off, the other claims the address once
/// the first's announcer Lease runs out: the client's neighbour entry names the other Node's
/// hardware address, and the longest gap in the client's traffic is measured.
pub async fn l2_address_moves_when_its_node_loses_power(ctx: Arc<Ctx>) {
    let (names, host, added) = announcers_on_added_nodes(&ctx).await;
    let macs: Vec<(String, String)> = added
        .iter()
        .map(|n| (n.clone(), ctx.cluster.segment_mac(n).unwrap_or_else(|e| panic!("{n}'s hardware address: {e}"))))
        .collect();

    let t = Instant::now();
    let announcer = json!({"l2": true, "nodeSelector": {ANNOUNCER_LABEL: "true"}});
    apply(&ctx.client, spec("DaemonSet", 2, Some(announcer), ROLLED_ARGS)).await;
    announcers_rolled(&ctx, 2, 0).await;
    let daemon_sets: Api<DaemonSet> = Api::namespaced(ctx.client.clone(), CCM_NS);
    let workload = format!("ccm-{CCM_NAME}");
    wait(&format!("the manager on {host} only, leading"), Duration::from_secs(120), || async {
        let status = daemon_sets.get_opt(&workload).await.ok()??.status?;
        let on: Vec<String> = managers_by_node(&ctx).await.into_iter().map(|(n, _)| n).collect();
        (status.desired_number_scheduled == 1 && status.number_ready == 1 && on == [host.clone()]).then_some(())?;
        (leader_node(&ctx).await? == host).then_some(())
    })
    .await;
    measured(format!(
        "announcers applied (on {} and {}) to both available and the manager leading on {host} only: {:.1} s",
        added[0],
        added[1],
        t.elapsed().as_secs_f64()
    ));

    let t = Instant::now();
    let annotations = json!({"ccm.rs/address-pool": "l2", "ccm.rs/ip-mode": "VIP"});
    let ip = lb_service(&ctx, "web-l2", "web", annotations, false).await;
    assert!(L2_POOL.0 <= ip && ip <= L2_POOL.1, "an address of the l2 pool: {ip}");
    let addr = service_addr(ip);
    first_answer(&ctx, Some(Place::Client), addr, "web").await;
    measured(format!(
        "L2 Service created to the client's first answer through the announcing Node's kube-proxy: {:.1} s",
        t.elapsed().as_secs_f64()
    ));
    let (first_mac, announcing) = settled_announcer(&ctx, ip, &added).await;
    let neighbour = client_neighbour(&ctx, ip);
    assert!(neighbour.contains(&first_mac), "the client's neighbour entry names {announcing}: {neighbour}");
    // Which Node answers, as data: the record names the Node the client's ARP reached.
    records_name(&ctx, "web-l2", &announcing).await;
    let (other, other_mac) = macs.iter().find(|(n, _)| *n != announcing).cloned().expect("the other added Node");

    let poller = Poller::start(&ctx.cluster, Some(Place::Client), addr, POLL, "pod=web-").expect("the client's poller");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (_, old_container) = announcer_on(&ctx, &announcing).await.expect("the announcing Node's announcer");
    let stopped_at = poller.started().elapsed();
    let t = Instant::now();
    let stop_secs = power_off(&ctx, &announcing).await;
    // Watched beside the traffic checks: the powered-off Node's record deleted by the live
    // announcer once its Lease ran out, the new one's written.
    let record_seen = tokio::spawn({
        let (ctx, other) = (ctx.clone(), other.clone());
        async move { records_name(&ctx, "web-l2", &other).await }
    });
    let moved = wait(&format!("the client's neighbour entry for {ip} naming {other}"), Duration::from_secs(60), || {
        let entry = client_neighbour(&ctx, ip);
        let mac = other_mac.clone();
        let elapsed = t.elapsed().as_secs_f64();
        async move { entry.contains(&mac).then_some(elapsed) }
    })
    .await;
    wait("the client answered again", Duration::from_secs(60), || async {
        poller.traffic().answered_since(stopped_at + Duration::from_secs_f64(stop_secs)).then_some(())
    })
    .await;
    let back = t.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let traffic = poller.stop().expect("the poller");
    let answering = answering_macs(&ctx, ip).await;
    assert_eq!(answering, BTreeSet::from([other_mac.clone()]), "only {other} answers ARP for {ip} now");
    let gap = traffic.longest_outage().map(|o| o.seconds()).unwrap_or(0.0);
    measured(format!(
        "L2 move: {announcing} powered off ({stop_secs:.1} s) to the client's neighbour entry naming {other}: {moved:.1} s; traffic again after {back:.1} s; {} (a request every 100 ms)",
        traffic.summary()
    ));
    assert!(gap < 30.0, "traffic again within the announcer Lease and a little: {traffic:?}");
    let record = record_seen.await.expect("the record watch").duration_since(t).as_secs_f64();
    measured(format!(
        "L2 move: the ServiceAnnouncement of web-l2 names {other} alone {record:.1} s after the power-off (named {announcing} before)"
    ));

    let secs = power_on(&ctx, &announcing).await;
    let t = Instant::now();
    wait("the three Nodes Ready", Duration::from_secs(60), || async { all_ready(&ctx, &names).await.then_some(()) })
        .await;
    // The API still shows the announcer Ready from before the power cut: wait for its new
    // container.
    wait(&format!("{announcing}'s announcer Ready again in a new container"), Duration::from_secs(120), || async {
        let (pod, id) = announcer_on(&ctx, &announcing).await?;
        (is_ready(&pod) && id.is_some() && id != old_container).then_some(())
    })
    .await;
    measured(format!(
        "L2: {announcing} started again: Ready in {secs:.1} s, its announcer available {:.1} s later",
        t.elapsed().as_secs_f64()
    ));
}
