//! Issue 50 item 3 on the real cluster: how long a kubelet's freshly registered Node waits for
//! its cloud-controller-manager, ours beside the upstream Go CCM (`../shared/upstream`) in the
//! same run. Both run on the host against the cluster's API server with a provider that answers
//! every instance call after 20 ms as upstream's `bench` provider does (ours: `fake` with
//! `profile: bench`; upstream: `bench` itself), only the cloud-node controller, no leader
//! election; so the difference is the
//! manager's, not the provider's or a Pod's start. The operator's resource is deleted first, so
//! nothing else initializes the Node.

use std::sync::Arc;
use std::time::{Duration, Instant};

use e2e::bench::ManagerProcess;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};

use crate::multinode::{all_ready, initialized, measured, power_off, power_on, power_on_any_stopped};
use crate::{CCM_NAME, CCM_NS, Ctx, bin_dir, wait};

/// Rounds per manager.
const ROUNDS: usize = 3;

/// Which manager initializes the Node in a round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Who {
    Ours,
    Upstream,
}

/// Start `who` on the host over the cluster, healthy, with its log in `dir`.
async fn start(ctx: &Ctx, who: Who, dir: &std::path::Path) -> ManagerProcess {
    let kubeconfig = ctx.cluster.kubeconfig();
    let mut process = match who {
        Who::Ours => {
            let cloud_config = dir.join("fake.yaml");
            std::fs::write(&cloud_config, "profile: bench\nlatency: 20ms\n").expect("the cloud-config");
            let command = format!(
                "{} --cloud-provider=fake --cloud-config={{cloud_config}} --kubeconfig={{kubeconfig}} --leader-elect=false \
                 --bind-address=127.0.0.1 --secure-port={{port}} --authorization-always-allow-paths=/healthz,/metrics \
                 --controllers=cloud-node",
                bin_dir().join("cloud-controller-manager").display()
            );
            ManagerProcess::spawn(&command, "", &kubeconfig, &cloud_config, &dir.join("ours.log")).expect("ours starts")
        }
        Who::Upstream => ManagerProcess::spawn_upstream(
            "--controllers=cloud-node-controller --leader-elect=false",
            &kubeconfig,
            &[("BENCH_INSTANCE_LATENCY".into(), "20ms".into())],
            &dir.join("upstream.log"),
        )
        .expect("upstream starts"),
    };
    process.wait_healthy(Duration::from_secs(60)).await.expect("the manager is healthy");
    process
}

/// One round: Node `name` deleted while its machine is off, the machine started, and the
/// kubelet's new Node followed through a watch (each change timed as it arrives). Returns
/// (seconds from the Node's creation reaching the watch to it initialized, seconds from the
/// kubelet's start to initialized).
async fn round(ctx: &Arc<Ctx>, name: &str) -> (f64, f64) {
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    power_off(ctx, name).await;
    let _ = nodes.delete(name, &Default::default()).await;
    wait(&format!("{name}'s Node gone"), Duration::from_secs(60), || async {
        nodes.get_opt(name).await.ok()?.is_none().then_some(())
    })
    .await;
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut changes = watcher(nodes.clone(), config).applied_objects().boxed();
    let started = Instant::now();
    let (c, n) = (ctx.clone(), name.to_string());
    // The kubelet registers while `start_node` waits for it to be Ready.
    let starting = tokio::spawn(async move { power_on(&c, &n).await });
    let mut seen = None;
    let initialized_at = tokio::time::timeout(Duration::from_secs(120), async {
        while let Some(change) = changes.next().await {
            let Ok(node) = change else { continue };
            let at = started.elapsed().as_secs_f64();
            seen.get_or_insert(at);
            if is_initialized(&node) {
                return at;
            }
        }
        panic!("the watch of {name} ended");
    })
    .await
    .unwrap_or_else(|_| panic!("{name} not initialized within 120 s of its kubelet's start"));
    starting.await.expect("the Node starts");
    (initialized_at - seen.unwrap_or(initialized_at), initialized_at)
}

/// Whether `node` has a providerID and no uninitialized taint.
fn is_initialized(node: &Node) -> bool {
    let spec = node.spec.as_ref();
    spec.and_then(|s| s.provider_id.as_ref()).is_some()
        && !spec
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|t| t.iter().any(|t| t.key == "node.cloudprovider.kubernetes.io/uninitialized"))
}

/// Issue 50 item 3: a kubelet's new Node initialized by ours and by upstream, [`ROUNDS`] each,
/// alternating; each initializes it every time (providerID `bench://`, the Node's addresses
/// kept, as the kubelet's `--node-ip` asks).
pub async fn a_registering_nodes_wait_for_initialization_ours_beside_upstream(ctx: Arc<Ctx>) {
    let upstream_here = e2e::upstream::binary();
    power_on_any_stopped(&ctx).await;
    let names = ctx.cluster.node_names();
    wait("the three Nodes Ready", Duration::from_secs(120), || async { all_ready(&ctx, &names).await.then_some(()) })
        .await;
    // Nothing of the operator's may initialize the Node meanwhile.
    let crs: Api<crds::CloudControllerManager> = Api::namespaced(ctx.client.clone(), CCM_NS);
    let _ = crs.delete(CCM_NAME, &Default::default()).await;
    // Without the chart (this scenario alone) there is no such resource type: nothing to delete.
    wait("the resource gone", Duration::from_secs(120), || async {
        (!matches!(crs.get_opt(CCM_NAME).await, Ok(Some(_)))).then_some(())
    })
    .await;
    wait("no manager Pod", Duration::from_secs(120), || async {
        crate::manager_pods(&ctx).await.is_empty().then_some(())
    })
    .await;

    let dir = std::env::temp_dir().join(format!("ccm-realcluster-join-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let name = names.last().expect("three Nodes").clone();
    let mut who_order = vec![Who::Ours];
    match &upstream_here {
        Ok(_) => who_order.push(Who::Upstream),
        Err(why) => eprintln!("    upstream half skipped: {why}"),
    }
    let mut results: Vec<(Who, f64, f64, String)> = Vec::new();
    for _ in 0..ROUNDS {
        for &who in &who_order {
            let process = start(&ctx, who, &dir).await;
            let (after_seen, after_start) = round(&ctx, &name).await;
            let node = initialized(&ctx, &name).await.expect("initialized");
            let provider_id = node.spec.and_then(|s| s.provider_id).unwrap_or_default();
            drop(process);
            results.push((who, after_seen, after_start, provider_id));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    for (who, after_seen, after_start, provider_id) in &results {
        measured(format!(
            "a registering Node ({name}) initialized by {who:?}: {after_seen:.3} s after its creation reached a watch, {after_start:.1} s after its kubelet started ({provider_id})"
        ));
        assert_eq!(*provider_id, format!("bench://{name}"), "{who:?} initialized it");
    }
    let mean = |w: Who| {
        let v: Vec<f64> = results.iter().filter(|r| r.0 == w).map(|r| r.1).collect();
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    };
    if let (Some(ours), Some(upstream)) = (mean(Who::Ours), mean(Who::Upstream)) {
        measured(format!(
            "time-to-initialized, mean of {ROUNDS}: ours {ours:.3} s, upstream {upstream:.3} s (ours/upstream {:.2})",
            ours / upstream
        ));
    }
}
