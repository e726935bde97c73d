//! Issue 49 on the real cluster: the route controller in its watch-based mode (KEP-5237's
//! alpha gate) over the three kubelets' Nodes. The manager runs on the host beside the
//! cluster with the `fake` provider, whose route table lives in the process (the `baremetal`
//! provider offers no routes), and only the route controller. Each Node gets the pod CIDR its
//! CNI already hands out (this cluster's kube-controller-manager allocates none); the last one
//! gets it while the manager runs, which is the Node change the watch reacts to.

use std::sync::Arc;
use std::time::{Duration, Instant};

use e2e::bench::ManagerProcess;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::multinode::{all_ready, measured, power_on_any_stopped};
use crate::{Ctx, bin_dir, wait};

/// The route controller's pass counter and its corrections counter (R16).
const SYNC_TOTAL: &str = "route_controller_route_sync_total";
const CORRECTIONS_TOTAL: &str = "route_controller_route_corrections_total";

/// Whether Node `name` has `NetworkUnavailable` False because its route was created.
async fn route_created(nodes: &Api<Node>, name: &str) -> bool {
    let Ok(node) = nodes.get(name).await else { return false };
    let conditions = node.status.and_then(|s| s.conditions).unwrap_or_default();
    conditions
        .iter()
        .any(|c| c.type_ == "NetworkUnavailable" && c.status == "False" && c.reason.as_deref() == Some("RouteCreated"))
}

/// Give Node `name` the pod CIDR `cidr` unless it has one; returns whether it was set now.
async fn give_pod_cidr(nodes: &Api<Node>, name: &str, cidr: &str) -> bool {
    let node = nodes.get(name).await.expect("the Node");
    if node.spec.as_ref().and_then(|s| s.pod_cidr.as_ref()).is_some() {
        return false;
    }
    let patch = json!({"spec": {"podCIDR": cidr, "podCIDRs": [cidr]}});
    nodes.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("the pod CIDR");
    true
}

/// The value of the sample of `metric` whose labels include every one of `labels`.
fn sample(text: &str, metric: &str, labels: &[&str]) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && l.starts_with(metric))
        .find(|l| labels.iter().all(|want| l.contains(want)))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// Issue 49's acceptance (route metrics read on a real cluster), R14-R16: with the gate on,
/// two Nodes' routes come from the first pass; the third Node's pod CIDR, set while the manager
/// runs, gets its route from a Node-change pass; `route_controller_route_sync_total` counts
/// those passes by `trigger` and `outcome`, and the corrections counter stays at zero.
pub async fn watch_based_routes_follow_the_kubelets_nodes_and_count_passes_by_trigger(ctx: Arc<Ctx>) {
    power_on_any_stopped(&ctx).await;
    let names = ctx.cluster.node_names();
    wait("the three Nodes Ready", Duration::from_secs(120), || async { all_ready(&ctx, &names).await.then_some(()) })
        .await;
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    let cidr = |i: usize| ctx.cluster.network.node_pod_cidr(i + 1);
    for (i, name) in names.iter().enumerate().take(names.len() - 1) {
        give_pod_cidr(&nodes, name, &cidr(i)).await;
    }

    let dir = std::env::temp_dir().join(format!("ccm-realcluster-routes-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let cloud_config = dir.join("fake.yaml");
    std::fs::write(&cloud_config, "autoInstances: true\n").expect("the cloud-config");
    let manager = bin_dir().join("cloud-controller-manager");
    let command = format!(
        "{} --cloud-provider=fake --cloud-config={{cloud_config}} --kubeconfig={{kubeconfig}} --leader-elect=false \
         --bind-address=127.0.0.1 --secure-port={{port}} --authorization-always-allow-paths=/healthz,/metrics \
         --controllers=node-route-controller --configure-cloud-routes=true --cluster-cidr={} \
         --feature-gates=CloudControllerManagerWatchBasedRoutesReconciliation=true",
        manager.display(),
        ctx.cluster.network.cluster_cidr()
    );
    let log = dir.join("manager.log");
    let mut process = ManagerProcess::spawn(&command, "", &ctx.cluster.kubeconfig(), &cloud_config, &log)
        .expect("the manager starts");
    process.wait_healthy(Duration::from_secs(60)).await.expect("the manager is healthy");

    let first = &names[..names.len() - 1];
    wait("the first two Nodes' routes", Duration::from_secs(60), || async {
        for name in first {
            if !route_created(&nodes, name).await {
                return None;
            }
        }
        Some(())
    })
    .await;

    // Passes start at most once per 10 s (R14): past the first one's, the time below is the
    // join's own.
    tokio::time::sleep(Duration::from_secs(11)).await;
    // The third Node gains its pod CIDR: a Node change, not the 12-24 h safety pass.
    let last = names.last().expect("three Nodes").clone();
    let started = Instant::now();
    let set_now = give_pod_cidr(&nodes, &last, &cidr(names.len() - 1)).await;
    wait("the third Node's route", Duration::from_secs(60), || async {
        route_created(&nodes, &last).await.then_some(())
    })
    .await;
    let joined = started.elapsed().as_secs_f64();

    let text = process.metrics().await;
    process.check_running().expect("the manager still runs");
    let changed = sample(&text, SYNC_TOTAL, &[r#"trigger="node_change""#, r#"outcome="changed""#]).unwrap_or(0.0);
    let errors: u64 = text
        .lines()
        .filter(|l| l.starts_with(SYNC_TOTAL) && l.contains(r#"outcome="error""#))
        .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
        .map(|v| v as u64)
        .sum();
    let corrections = sample(&text, CORRECTIONS_TOTAL, &[]);
    let creates = sample(&text, "cloudprovider_api_requests_total", &[r#"method="create_route""#]).unwrap_or(0.0);
    measured(format!(
        "watch-based routes on three kubelet Nodes: the third Node's route {joined:.2} s after its pod CIDR{}; {SYNC_TOTAL}{{trigger=node_change,outcome=changed}} {changed}, error passes {errors}, corrections {}, create_route calls {creates}",
        if set_now { "" } else { " (already set: the timing is not a join)" },
        corrections.map(|c| c.to_string()).unwrap_or_else(|| "absent".into()),
    ));
    assert!(changed >= 2.0, "the first pass and the third Node's change each created routes:\n{text}");
    assert_eq!(errors, 0, "no pass failed:\n{text}");
    assert_eq!(corrections, Some(0.0), "the corrections counter is there and no safety pass had to correct:\n{text}");
    assert!(creates >= 3.0, "a route per Node:\n{text}");
    drop(process);
    let _ = std::fs::remove_dir_all(&dir);
}
