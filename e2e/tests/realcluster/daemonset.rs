//! DaemonSet mode on three Nodes: one manager per Node, and a spec change rolled out one Node
//! at a time.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use kube::api::Api;

use crate::multinode::{
    ROLLED_ARGS, label_for_managers, leader_node, managers_by_node, measured, power_on_any_stopped, spec,
};
use crate::{CCM_NAME, CCM_NS, Ctx, apply, is_ready, wait};

/// The manager DaemonSet's generation now (0 when there is none).
pub async fn manager_generation(ctx: &Ctx) -> i64 {
    let daemon_sets: Api<DaemonSet> = Api::namespaced(ctx.client.clone(), CCM_NS);
    let ds = daemon_sets.get_opt(&format!("ccm-{CCM_NAME}")).await.ok().flatten();
    ds.and_then(|d| d.metadata.generation).unwrap_or(0)
}

/// Issue 46: DaemonSet mode with every Node labelled: one manager on each Node, one leading;
/// then a template change rolls one Node at a time (never more than one Node without a Ready
/// manager), measured per Node.
pub async fn daemonset_one_per_node_rolls_node_by_node(ctx: Arc<Ctx>) {
    power_on_any_stopped(&ctx).await;
    let names = ctx.cluster.node_names();
    for n in &names {
        label_for_managers(&ctx, n, true);
    }
    let t = Instant::now();
    apply(&ctx.client, spec("DaemonSet", 2, None, &[])).await;
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), CCM_NS);
    let daemon_sets: Api<DaemonSet> = Api::namespaced(ctx.client.clone(), CCM_NS);
    let workload = format!("ccm-{CCM_NAME}");
    wait("a DaemonSet manager Ready on each Node and the Deployment gone", Duration::from_secs(180), || async {
        let status = daemon_sets.get_opt(&workload).await.ok()??.status?;
        let gone = deployments.get_opt(&workload).await.ok()?.is_none();
        (gone && status.desired_number_scheduled == 3 && status.number_ready == 3).then_some(())
    })
    .await;
    let on: BTreeSet<String> = managers_by_node(&ctx).await.into_iter().map(|(n, _)| n).collect();
    assert_eq!(on, names.iter().cloned().collect::<BTreeSet<_>>(), "one manager on each Node");
    let leader = wait("a manager leading", Duration::from_secs(60), || leader_node(&ctx)).await;
    measured(format!(
        "Deployment to DaemonSet: a manager on each of the three Nodes in {:.1} s ({leader}'s leading)",
        t.elapsed().as_secs_f64()
    ));

    // A template change: the DaemonSet replaces one Node's manager at a time.
    let generation = manager_generation(&ctx).await;
    let t = Instant::now();
    apply(&ctx.client, spec("DaemonSet", 2, None, ROLLED_ARGS)).await;
    let mut updated: Vec<(String, f64)> = Vec::new();
    let mut fewest_ready = usize::MAX;
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        let pods = managers_by_node(&ctx).await;
        let ready: BTreeSet<&String> = pods.iter().filter(|(_, p)| is_ready(p)).map(|(n, _)| n).collect();
        fewest_ready = fewest_ready.min(ready.len());
        for (node, pod) in &pods {
            let args = pod.spec.as_ref().and_then(|s| s.containers[0].args.clone()).unwrap_or_default();
            let new = ROLLED_ARGS.iter().all(|a| args.iter().any(|x| x == a));
            if new && is_ready(pod) && !updated.iter().any(|(n, _)| n == node) {
                updated.push((node.clone(), t.elapsed().as_secs_f64()));
            }
        }
        let status = daemon_sets.get_opt(&workload).await.ok().flatten().and_then(|d| {
            let g = d.metadata.generation?;
            Some((g, d.status?))
        });
        let done = status.is_some_and(|(g, s)| {
            g > generation
                && s.observed_generation == Some(g)
                && s.updated_number_scheduled == Some(3)
                && s.number_available == Some(3)
        });
        if done && updated.len() == 3 {
            break;
        }
        assert!(Instant::now() < deadline, "the rollout did not finish in 240 s: {updated:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let total = t.elapsed().as_secs_f64();
    assert!(fewest_ready >= 2, "never more than one Node without a Ready manager (fewest Ready: {fewest_ready})");
    let order: Vec<String> = updated.iter().map(|(n, s)| format!("{n} at {s:.1} s")).collect();
    measured(format!(
        "DaemonSet rollout of a spec change: node by node in {total:.1} s ({}); at least {fewest_ready} of 3 managers Ready throughout",
        order.join(", ")
    ));
    wait("a manager leading after the rollout", Duration::from_secs(60), || leader_node(&ctx)).await;
}
