//! A pool's node selector on three Nodes (issue 47 item 2): the `l2` pool's advertisement
//! admits only Nodes labelled [`EDGE_LABEL`]. With the label on the Node the election would not
//! pick, that Node answers ARP for the Service's address; labelled as well, the Node the
//! election picks takes the address over at once (no announcer restarts), seen from the
//! client's neighbour table while the client keeps polling the address.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ccm_provider_baremetal::announce::elect;
use e2e::realcluster::Place;
use e2e::realcluster::traffic::Poller;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, DeleteParams};
use serde_json::json;

use crate::l2::{ANNOUNCER_LABEL, announcers_on_added_nodes, answering_macs, one_node_answers, records_name};
use crate::multinode::{
    Inventory, L2_POOL, NS, POLL, ROLLED_ARGS, announcer_generation, announcers_rolled, client_neighbour, cloud_config,
    first_answer, lb_service, measured, service_addr, spec,
};
use crate::{Ctx, apply, put_cloud_config, wait};

/// The label the `l2` pool's `advertisement.nodeSelector` asks for.
pub const EDGE_LABEL: &str = "ccm-e2e/edge";

/// Puts [`EDGE_LABEL`] on `node`, or takes it off.
fn set_edge(ctx: &Ctx, node: &str, on: bool) {
    let label = if on { format!("{EDGE_LABEL}=true") } else { format!("{EDGE_LABEL}-") };
    ctx.cluster.kubectl_raw(&["label", "node", node, &label, "--overwrite"]).expect("labelling a Node");
}

pub async fn l2_address_follows_the_pools_node_selector(ctx: Arc<Ctx>) {
    let (_, _, added) = announcers_on_added_nodes(&ctx).await;
    for node in &added {
        set_edge(&ctx, node, false);
    }
    let before = announcer_generation(&ctx).await;
    put_cloud_config(
        &ctx,
        &cloud_config(&ctx, &Inventory { l2_node_selector: Some(EDGE_LABEL), ..Inventory::default() }),
    )
    .await;
    let announcer = json!({"l2": true, "nodeSelector": {ANNOUNCER_LABEL: "true"}});
    apply(&ctx.client, spec("DaemonSet", 2, Some(announcer), ROLLED_ARGS)).await;
    announcers_rolled(&ctx, 2, before).await;

    let annotations = json!({"ccm.rs/address-pool": "l2", "ccm.rs/ip-mode": "VIP"});
    let ip = lb_service(&ctx, "web-l2p", "web", annotations, false).await;
    assert!(L2_POOL.0 <= ip && ip <= L2_POOL.1, "an address of the l2 pool: {ip}");
    let addr = service_addr(ip);
    // The Node the election picks among both, and the other.
    let winner = elect::elect(IpAddr::V4(ip), added.iter().map(String::as_str)).expect("two Nodes").to_string();
    let other = added.iter().find(|n| **n != winner).cloned().expect("the other added Node");
    let mac = |n: &str| ctx.cluster.segment_mac(n).unwrap_or_else(|e| panic!("{n}'s hardware address: {e}"));
    let (winner_mac, other_mac) = (mac(&winner), mac(&other));

    // Only the Node the election would not pick is labelled: it answers.
    set_edge(&ctx, &other, true);
    assert_eq!(one_node_answers(&ctx, ip).await, other_mac, "{other}, the only Node the pool admits, answers");
    let flush = ctx.cluster.command_in(Place::Client, "ip", &["neigh", "flush", "to", &ip.to_string()]);
    flush.unwrap_or_else(|e| panic!("flushing the client's neighbour entry: {e}"));
    first_answer(&ctx, Some(Place::Client), addr, "web").await;
    records_name(&ctx, "web-l2p", &other).await;

    // The election's Node labelled too: it takes the address over.
    let poller = Poller::start(&ctx.cluster, Some(Place::Client), addr, POLL, "pod=web-").expect("the client's poller");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let t = Instant::now();
    set_edge(&ctx, &winner, true);
    let moved =
        wait(&format!("the client's neighbour entry for {ip} naming {winner}"), Duration::from_secs(60), || {
            let entry = client_neighbour(&ctx, ip);
            let (mac, elapsed) = (winner_mac.clone(), t.elapsed().as_secs_f64());
            async move { entry.contains(&mac).then_some(elapsed) }
        })
        .await;
    records_name(&ctx, "web-l2p", &winner).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let traffic = poller.stop().expect("the poller");
    assert_eq!(answering_macs(&ctx, ip).await, BTreeSet::from([winner_mac]), "only {winner} answers ARP for {ip}");
    measured(format!(
        "L2 pool node selector: {other} alone labelled answered; {winner} labelled to the client's neighbour entry naming it {moved:.1} s; {} (a request every 100 ms, no announcer restarted)",
        traffic.summary()
    ));

    // Leave the cluster as the other scenarios expect it.
    let services: Api<Service> = Api::namespaced(ctx.client.clone(), NS);
    let _ = services.delete("web-l2p", &DeleteParams::default()).await;
    for node in &added {
        set_edge(&ctx, node, false);
    }
    let before = announcer_generation(&ctx).await;
    put_cloud_config(&ctx, &cloud_config(&ctx, &Inventory::default())).await;
    announcers_rolled(&ctx, 2, before).await;
}
