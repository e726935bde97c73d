//! Issue 50 item 3 on the real cluster: how long a kubelet's freshly registered Node waits for
//! its cloud-controller-manager, ours beside the upstream Go CCM (`../shared/upstream`) in the
//! same run, each run as a Pod by the operator from a `CloudControllerManager` (ours: provider
//! `fake` with `profile: bench`, which answers every instance call after 20 ms as upstream's
//! `bench` provider does; upstream: its image through `spec.upstream` with the `generic`
//! profile), one replica on the host's Node, leader election on, default controllers; so the
//! difference is the manager's, not the provider's. The resource of the other scenarios is
//! deleted first, so nothing else initializes the Node; each resource is deleted after its
//! round. The operator's time from the apply to `Ready` is measured on the way.

use std::sync::Arc;
use std::time::{Duration, Instant};

use e2e::realcluster::images;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;

use crate::multinode::{
    MANAGER_LABEL, all_ready, initialized, label_for_managers, measured, power_off, power_on, power_on_any_stopped,
};
use crate::upstream_image::{imported, pods_of, ready_with_leader_of, upstream_images_allowed_and_no_other_resource};
use crate::{CCM_NS, Ctx, apply, wait};

/// Rounds per manager.
const ROUNDS: usize = 3;

/// Which manager initializes the Node in a round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Who {
    Ours,
    Upstream,
}

impl Who {
    /// Its resource's (and Secret's) name.
    fn name(self) -> &'static str {
        match self {
            Who::Ours => "join-ours",
            Who::Upstream => "join-upstream",
        }
    }
}

/// Applies `who`'s cloud-config Secret and resource (one replica, on the Nodes labelled
/// [`MANAGER_LABEL`]) and waits until it is Ready with its leader named; returns the seconds
/// from the apply.
async fn start(ctx: &Ctx, who: Who) -> f64 {
    let name = who.name();
    let (content, spec) = match who {
        Who::Ours => ("profile: bench\nlatency: 20ms\n", json!({"provider": "fake"})),
        Who::Upstream => (
            "# the bench provider reads no cloud config\n",
            json!({"provider": "bench", "upstream": {"profile": "generic"},
                   "deployment": {"image": images::UPSTREAM_BENCH}}),
        ),
    };
    apply(
        &ctx.client,
        json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": name, "namespace": CCM_NS,
                "labels": {crds::CLOUD_CONFIG_LABEL: crds::CLOUD_CONFIG_LABEL_VALUE}},
            "stringData": {"cloud.conf": content}}),
    )
    .await;
    let mut spec = spec;
    spec["cloudConfig"] = json!({"secretRef": {"name": name}});
    let deployment = spec["deployment"].as_object_mut().map(std::mem::take).unwrap_or_default();
    spec["deployment"] = json!(deployment);
    spec["deployment"]["replicas"] = json!(1);
    spec["deployment"]["imagePullPolicy"] = json!("Never");
    spec["deployment"]["nodeSelector"] = json!({MANAGER_LABEL: "true"});
    let t = Instant::now();
    apply(
        &ctx.client,
        json!({"apiVersion": "ccm.rs/v1alpha1", "kind": "CloudControllerManager",
            "metadata": {"name": name, "namespace": CCM_NS}, "spec": spec}),
    )
    .await;
    ready_with_leader_of(ctx, name, &format!("{who:?}'s manager Ready with its leader named")).await;
    t.elapsed().as_secs_f64()
}

/// Deletes `who`'s resource and waits until its Pods are gone.
async fn stop(ctx: &Ctx, who: Who) {
    let crs: Api<crds::CloudControllerManager> = Api::namespaced(ctx.client.clone(), CCM_NS);
    let _ = crs.delete(who.name(), &Default::default()).await;
    wait(&format!("{who:?}'s resource and Pods gone"), Duration::from_secs(120), || async {
        let gone = !matches!(crs.get_opt(who.name()).await, Ok(Some(_)));
        (gone && pods_of(ctx, who.name()).await.is_empty()).then_some(())
    })
    .await;
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

/// Issue 50 item 3: a kubelet's new Node initialized by ours and by upstream, each as a Pod,
/// [`ROUNDS`] each, alternating; each initializes it every time (providerID `bench://`, the
/// Node's addresses kept, as the kubelet's `--node-ip` asks).
pub async fn a_registering_nodes_wait_for_initialization_ours_beside_upstream(ctx: Arc<Ctx>) {
    let upstream_here = imported(&ctx, e2e::upstream::binary(), "the upstream Go CCM", "upstream", images::build_upstream_bench);
    power_on_any_stopped(&ctx).await;
    let names = ctx.cluster.node_names();
    wait("the three Nodes Ready", Duration::from_secs(120), || async { all_ready(&ctx, &names).await.then_some(()) })
        .await;
    // The chart allowing the upstream image; nothing of the other scenarios' resource may
    // initialize the Node meanwhile.
    upstream_images_allowed_and_no_other_resource(&ctx).await;
    wait("no manager Pod", Duration::from_secs(120), || async {
        crate::manager_pods(&ctx).await.is_empty().then_some(())
    })
    .await;
    label_for_managers(&ctx, &ctx.cluster.node_name, true);

    let name = names.last().expect("three Nodes").clone();
    assert_ne!(name, ctx.cluster.node_name, "the re-registered Node is never the managers' own");
    let mut who_order = vec![Who::Ours];
    if upstream_here {
        who_order.push(Who::Upstream);
    }
    let mut results: Vec<(Who, f64, f64, f64, String)> = Vec::new();
    for _ in 0..ROUNDS {
        for &who in &who_order {
            let ready = start(&ctx, who).await;
            let (after_seen, after_start) = round(&ctx, &name).await;
            let node = initialized(&ctx, &name).await.expect("initialized");
            let provider_id = node.spec.and_then(|s| s.provider_id).unwrap_or_default();
            stop(&ctx, who).await;
            results.push((who, ready, after_seen, after_start, provider_id));
        }
    }
    for (who, ready, after_seen, after_start, provider_id) in &results {
        measured(format!(
            "a registering Node ({name}) initialized by {who:?} (a Pod; its resource applied to Ready {ready:.1} s): {after_seen:.3} s after its creation reached a watch, {after_start:.1} s after its kubelet started ({provider_id})"
        ));
        assert_eq!(*provider_id, format!("bench://{name}"), "{who:?} initialized it");
    }
    let mean = |w: Who, field: fn(&(Who, f64, f64, f64, String)) -> f64| {
        let v: Vec<f64> = results.iter().filter(|r| r.0 == w).map(field).collect();
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    };
    let initialized_after = |r: &(Who, f64, f64, f64, String)| r.2;
    let ready_after = |r: &(Who, f64, f64, f64, String)| r.1;
    if let (Some(ours), Some(upstream)) = (mean(Who::Ours, initialized_after), mean(Who::Upstream, initialized_after)) {
        measured(format!(
            "time-to-initialized with the managers as Pods, mean of {ROUNDS}: ours {ours:.3} s, upstream {upstream:.3} s (ours/upstream {:.2}); the operator's apply to Ready: ours {:.1} s, upstream {:.1} s",
            ours / upstream,
            mean(Who::Ours, ready_after).unwrap_or_default(),
            mean(Who::Upstream, ready_after).unwrap_or_default()
        ));
    }
}
