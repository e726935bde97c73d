//! The cloud-node-lifecycle controller on three Nodes with real kubelets: a machine removed from
//! the baremetal inventory whose Node stops is deleted; a machine the inventory marks shut down
//! whose Node stops gets the shutdown taint and keeps its Node; both come back, the deleted one
//! registering again and initialized.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::api::Api;

use crate::multinode::{
    Inventory, all_ready, cloud_config, initialized, measured, power_off, power_on, power_on_any_stopped,
};
use crate::{Ctx, node_ready, put_cloud_config, wait};

/// The taint the lifecycle controller puts on a NotReady Node whose machine is shut down.
const SHUTDOWN_TAINT: &str = "node.cloudprovider.kubernetes.io/shutdown";

/// Whether Node `name` carries the shutdown taint (`None`: no such Node).
async fn has_shutdown_taint(ctx: &Ctx, name: &str) -> Option<bool> {
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    let node = nodes.get_opt(name).await.ok()??;
    let taints = node.spec.and_then(|s| s.taints).unwrap_or_default();
    Some(taints.iter().any(|t| t.key == SHUTDOWN_TAINT))
}

/// Issue 46 (L5 and the deletion of absent instances on a real cluster): the inventory edited
/// so that one added Node's machine is gone and the other's is shut down, both Nodes powered
/// off; the first Node is deleted once NotReady, the second tainted and kept. The inventory put
/// back and both powered on: the deleted Node registers again and is initialized, the taint goes.
pub async fn lifecycle_a_removed_machines_node_is_deleted_and_a_shut_down_ones_is_tainted(ctx: Arc<Ctx>) {
    power_on_any_stopped(&ctx).await;
    let names = ctx.cluster.node_names();
    wait("the three Nodes Ready", Duration::from_secs(60), || async { all_ready(&ctx, &names).await.then_some(()) })
        .await;
    let (shut, gone) = (names[1].clone(), names[2].clone());
    let keep_bgp = Inventory { bgp: true, ..Inventory::default() };
    let edited = Inventory { absent: vec![gone.clone()], shut_down: vec![shut.clone()], ..keep_bgp.clone() };

    let t = Instant::now();
    put_cloud_config(&ctx, &cloud_config(&ctx, &edited)).await;
    let shut_secs = power_off(&ctx, &shut).await;
    let gone_secs = power_off(&ctx, &gone).await;
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    let not_ready = wait("both stopped Nodes NotReady", Duration::from_secs(120), || async {
        let both =
            node_ready(&ctx, &shut).await == Some(false) && matches!(node_ready(&ctx, &gone).await, Some(false) | None);
        both.then(|| t.elapsed().as_secs_f64())
    })
    .await;
    let deleted = wait(&format!("{gone}'s Node deleted"), Duration::from_secs(180), || async {
        nodes.get_opt(&gone).await.ok()?.is_none().then(|| t.elapsed().as_secs_f64())
    })
    .await;
    let tainted = wait(&format!("{shut}'s Node tainted {SHUTDOWN_TAINT}"), Duration::from_secs(180), || async {
        has_shutdown_taint(&ctx, &shut).await?.then(|| t.elapsed().as_secs_f64())
    })
    .await;
    assert_eq!(has_shutdown_taint(&ctx, &shut).await, Some(true), "the shut-down machine's Node is kept");
    measured(format!(
        "lifecycle: inventory edited and {shut}, {gone} powered off ({shut_secs:.1} s, {gone_secs:.1} s): both NotReady after {not_ready:.1} s; {gone} (machine removed) deleted after {deleted:.1} s; {shut} (machine shut down) tainted after {tainted:.1} s and kept"
    ));

    let t = Instant::now();
    put_cloud_config(&ctx, &cloud_config(&ctx, &keep_bgp)).await;
    let shut_on = power_on(&ctx, &shut).await;
    let untainted = wait(&format!("the shutdown taint gone from {shut}"), Duration::from_secs(180), || async {
        (!has_shutdown_taint(&ctx, &shut).await?).then(|| t.elapsed().as_secs_f64())
    })
    .await;
    let gone_on = power_on(&ctx, &gone).await;
    let registered = Instant::now();
    wait(&format!("{gone} registered again and initialized"), Duration::from_secs(180), || initialized(&ctx, &gone))
        .await;
    measured(format!(
        "lifecycle: inventory put back; {shut} Ready in {shut_on:.1} s and its taint gone after {untainted:.1} s; {gone} registered again and Ready in {gone_on:.1} s, initialized {:.1} s later",
        registered.elapsed().as_secs_f64()
    ));
}
