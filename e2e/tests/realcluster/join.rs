//! Issue 50 item 3 on the real cluster: how long a kubelet's freshly registered Node waits for
//! its cloud-controller-manager, ours beside the upstream Go CCM (`../shared/upstream`) in the
//! same run, each run as a Pod by the operator from a `CloudControllerManager` (ours: provider
//! `fake` with `profile: bench`, which answers every instance call after 20 ms as upstream's
//! `bench` provider does; upstream: its image through `spec.upstream` with the `generic`
//! profile), one replica on the host's Node, leader election on, default controllers; so the
//! difference is the manager's, not the provider's. The resource of the other scenarios is
//! deleted first, so nothing else initializes the Node; each resource is deleted after its
//! round. Each round also times a LoadBalancer Service from its creation to its address (the
//! bench providers': 50 ms per load-balancer call, no data path), and the operator's time from
//! the apply to `Ready`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use e2e::realcluster::images;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Service};
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

/// The namespace of the scenario's LoadBalancer Service.
const LB_NS: &str = "join-lb";

/// A LoadBalancer Service created and followed through a watch until it has an address (the
/// bench providers' `198.18.x.y`); then deleted, through the manager's finalizer. Returns the
/// seconds from the create to the address reaching the watch, and the address.
async fn service_round(ctx: &Ctx) -> (f64, String) {
    let services: Api<Service> = Api::namespaced(ctx.client.clone(), LB_NS);
    apply(&ctx.client, json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": LB_NS}})).await;
    let config = watcher::Config::default().fields("metadata.name=join");
    let mut changes = watcher(services.clone(), config).applied_objects().boxed();
    let service = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "join", "namespace": LB_NS},
        "spec": {"type": "LoadBalancer", "ports": [{"port": 80, "targetPort": 80}]}});
    let service: Service = serde_json::from_value(service).expect("a Service");
    let started = Instant::now();
    services.create(&Default::default(), &service).await.expect("creating the Service");
    let addressed = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(change) = changes.next().await {
            let Ok(svc) = change else { continue };
            let ip = svc.status.and_then(|s| s.load_balancer?.ingress?.into_iter().next()?.ip);
            if let Some(ip) = ip {
                return (started.elapsed().as_secs_f64(), ip);
            }
        }
        panic!("the watch of the Service ended");
    })
    .await
    .unwrap_or_else(|_| panic!("the Service got no address within 60 s"));
    let _ = services.delete("join", &Default::default()).await;
    wait("the Service gone through the manager's finalizer", Duration::from_secs(60), || async {
        services.get_opt("join").await.ok()?.is_none().then_some(())
    })
    .await;
    addressed
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
    let upstream_here =
        imported(&ctx, e2e::upstream::binary(), "the upstream Go CCM", "upstream", images::build_upstream_bench);
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
    let mut results: Vec<Round> = Vec::new();
    for _ in 0..ROUNDS {
        for &who in &who_order {
            let ready = start(&ctx, who).await;
            let (initialized_after, after_start) = round(&ctx, &name).await;
            let node = initialized(&ctx, &name).await.expect("initialized");
            let provider_id = node.spec.and_then(|s| s.provider_id).unwrap_or_default();
            let (addressed_after, address) = service_round(&ctx).await;
            stop(&ctx, who).await;
            results.push(Round { who, ready, initialized_after, after_start, provider_id, addressed_after, address });
        }
    }
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(ctx.client.clone());
    let _ = namespaces.delete(LB_NS, &Default::default()).await;
    for r in &results {
        measured(format!(
            "{:?} as a Pod (its resource applied to Ready {:.1} s): a registering Node ({name}) initialized {:.3} s after its creation reached a watch, {:.1} s after its kubelet started ({}); a LoadBalancer Service created to its address {} in a watch {:.3} s",
            r.who, r.ready, r.initialized_after, r.after_start, r.provider_id, r.address, r.addressed_after
        ));
        assert_eq!(r.provider_id, format!("bench://{name}"), "{:?} initialized it", r.who);
        assert!(r.address.starts_with("198.18."), "{:?}: the bench providers' addresses: {}", r.who, r.address);
    }
    let mean = |w: Who, field: fn(&Round) -> f64| {
        let v: Vec<f64> = results.iter().filter(|r| r.who == w).map(field).collect();
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    };
    let both = |field: fn(&Round) -> f64| Some((mean(Who::Ours, field)?, mean(Who::Upstream, field)?));
    if let (Some(node), Some(service), Some(ready)) =
        (both(|r| r.initialized_after), both(|r| r.addressed_after), both(|r| r.ready))
    {
        measured(format!(
            "managers as Pods, mean of {ROUNDS}: time-to-initialized ours {:.3} s, upstream {:.3} s (ours/upstream {:.2}); Service to address ours {:.3} s, upstream {:.3} s ({:.2}); the operator's apply to Ready ours {:.1} s, upstream {:.1} s",
            node.0,
            node.1,
            node.0 / node.1,
            service.0,
            service.1,
            service.0 / service.1,
            ready.0,
            ready.1
        ));
    }
}

/// What one round measured.
struct Round {
    who: Who,
    /// Seconds from the resource's apply to Ready with its leader named.
    ready: f64,
    /// Seconds from the Node's creation reaching a watch to it initialized.
    initialized_after: f64,
    /// Seconds from the kubelet's start to the Node initialized.
    after_start: f64,
    provider_id: String,
    /// Seconds from a LoadBalancer Service's creation to its address reaching a watch.
    addressed_after: f64,
    address: String,
}
