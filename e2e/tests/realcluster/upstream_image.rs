//! Issue 48 on the real cluster: an upstream CCM image run from a `CloudControllerManager`
//! (`spec.upstream`, the `generic` profile): the upstream Go CCM of `../shared/upstream` (its
//! `bench` provider), built into an image by the project's image builder, initializes a
//! kubelet's newly registered Node and gives a LoadBalancer Service an address (and removes its
//! finalizer on deletion) with the operator's upstream ClusterRole (no request forbidden in its
//! log); the resource reports Ready with the leader named; a cloud-config
//! rotation rolls its Pods; deleting the resource leaves nothing behind.

use std::sync::Arc;
use std::time::{Duration, Instant};

use e2e::realcluster::images;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams};
use serde_json::json;

use crate::multinode::{all_ready, initialized, measured, power_off, power_on, power_on_any_stopped};
use crate::{CCM_NAME, CCM_NS, Ctx, OPERATOR_NS, apply, deployment_available, helm, helm_args, wait};

/// The resource of this scenario, beside (never with) the others' `baremetal`.
const NAME: &str = "upstream";
const SECRET: &str = "upstream-cloud-config";
/// The namespace of this scenario's LoadBalancer Service.
const LB_NS: &str = "upstream-lb";

pub(crate) async fn resource_named(ctx: &Ctx, name: &str) -> Option<crds::CloudControllerManager> {
    let crs: Api<crds::CloudControllerManager> = Api::namespaced(ctx.client.clone(), CCM_NS);
    crs.get_opt(name).await.ok()?
}

async fn resource(ctx: &Ctx) -> Option<crds::CloudControllerManager> {
    resource_named(ctx, NAME).await
}

/// `(status, reason)` of condition `type_` of resource `name`, once the status is of the
/// current generation.
pub(crate) async fn condition_of(ctx: &Ctx, name: &str, type_: &str) -> Option<(String, String)> {
    let cr = resource_named(ctx, name).await?;
    let status = cr.status?;
    (status.observed_generation == cr.metadata.generation).then_some(())?;
    let c = status.conditions.into_iter().find(|c| c.type_ == type_)?;
    Some((c.status, c.reason))
}

async fn condition(ctx: &Ctx, type_: &str) -> Option<(String, String)> {
    condition_of(ctx, NAME, type_).await
}

/// The manager Pods of resource `name`, not being deleted.
pub(crate) async fn pods_of(ctx: &Ctx, name: &str) -> Vec<Pod> {
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), CCM_NS);
    let selector = format!("app.kubernetes.io/name=cloud-controller-manager,app.kubernetes.io/instance={name}");
    let list = api.list(&kube::api::ListParams::default().labels(&selector)).await.map(|l| l.items);
    list.unwrap_or_default().into_iter().filter(|p| p.metadata.deletion_timestamp.is_none()).collect()
}

async fn pods(ctx: &Ctx) -> Vec<Pod> {
    pods_of(ctx, NAME).await
}

/// Resource `name` Ready, its leader named and equal to its Lease's holder; returns the leader.
pub(crate) async fn ready_with_leader_of(ctx: &Ctx, name: &str, what: &str) -> String {
    let leases: Api<Lease> = Api::namespaced(ctx.client.clone(), CCM_NS);
    wait(what, Duration::from_secs(180), || async {
        let (status, _) = condition_of(ctx, name, "Ready").await?;
        (status == "True").then_some(())?;
        let leader = resource_named(ctx, name).await?.status?.leader?;
        let holder = leases.get_opt(name).await.ok()??.spec?.holder_identity?;
        (leader == holder).then_some(leader)
    })
    .await
}

async fn ready_with_leader(ctx: &Ctx, what: &str) -> String {
    ready_with_leader_of(ctx, NAME, what).await
}

/// Builds an upstream image from `binary` with `build` and imports it into every Node; `false`,
/// after one line saying what is missing (see `../shared/<shared>/README.md`), without it.
pub(crate) fn imported(
    ctx: &Ctx,
    binary: Result<std::path::PathBuf, String>,
    what: &str,
    shared: &str,
    build: fn(&std::path::Path, &std::path::Path) -> Result<(), e2e::Error>,
) -> bool {
    let binary = match binary {
        Ok(b) => b,
        Err(why) => {
            println!("    skipped: {what} is not here ({why}); see ../shared/{shared}/README.md");
            return false;
        }
    };
    let name = binary.file_name().and_then(|n| n.to_str()).unwrap_or("upstream");
    let out = ctx.cluster.state_dir().join(format!("images/{name}.tar"));
    build(&binary, &out).unwrap_or_else(|e| panic!("the image of {what}: {e}"));
    ctx.cluster.import_image(&out).unwrap_or_else(|e| panic!("importing the image of {what}: {e}"));
    true
}

/// The chart allowing the upstream images, and no resource of earlier scenarios left, so that
/// only the scenario's own manager initializes Nodes or serves Services meanwhile.
pub(crate) async fn upstream_images_allowed_and_no_other_resource(ctx: &Ctx) {
    chart_allowing_the_upstream_image(ctx).await;
    let crs: Api<crds::CloudControllerManager> = Api::namespaced(ctx.client.clone(), CCM_NS);
    let _ = crs.delete(CCM_NAME, &DeleteParams::default()).await;
    wait("no other resource", Duration::from_secs(120), || async {
        (!matches!(crs.get_opt(CCM_NAME).await, Ok(Some(_)))).then_some(())
    })
    .await;
}

/// The chart installed (this scenario alone) or upgraded, allowing the upstream images too.
async fn chart_allowing_the_upstream_image(ctx: &Ctx) {
    let mut rest = helm_args(images::TAG, false);
    rest.extend([
        "--set".to_string(),
        format!("announcer.birdImage={}", images::BIRD),
        "--set".to_string(),
        format!(
            "admissionPolicy.allowedImages=[\"{}\",\"{}\",\"{}\"]",
            images::MANAGER,
            images::UPSTREAM_BENCH.split(':').next().unwrap_or_default(),
            images::UPSTREAM_AWS.split(':').next().unwrap_or_default()
        ),
    ]);
    let installed = deployment_available(&ctx.client, OPERATOR_NS, "ccm-operator").await.is_some();
    let mut args = if installed {
        vec!["upgrade", "ccm-operator", "charts/ccm-operator"]
    } else {
        vec!["install", "ccm-operator", "charts/ccm-operator", "--create-namespace"]
    };
    args.extend(rest.iter().map(String::as_str));
    helm(ctx, &args);
    wait("the operator Deployment available", Duration::from_secs(120), || {
        deployment_available(&ctx.client, OPERATOR_NS, "ccm-operator")
    })
    .await;
}

fn secret(content: &str) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": SECRET, "namespace": CCM_NS,
            "labels": {crds::CLOUD_CONFIG_LABEL: crds::CLOUD_CONFIG_LABEL_VALUE}},
        "stringData": {"cloud.conf": content}})
}

/// The Secret and the resource running the upstream image (`generic` profile) with `replicas`.
async fn apply_resource(ctx: &Ctx, replicas: i32) {
    apply(&ctx.client, secret("# the bench provider reads no cloud config\n")).await;
    apply(
        &ctx.client,
        json!({"apiVersion": "ccm.rs/v1alpha1", "kind": "CloudControllerManager",
            "metadata": {"name": NAME, "namespace": CCM_NS},
            "spec": {"provider": "bench", "upstream": {"profile": "generic"},
                "cloudConfig": {"secretRef": {"name": SECRET}},
                "deployment": {"image": images::UPSTREAM_BENCH, "imagePullPolicy": "Never", "replicas": replicas}}}),
    )
    .await;
}

/// Issue 48 item 1 and 2 for an upstream image on the real cluster.
pub async fn an_upstream_image_initializes_a_registering_node_reports_its_leader_and_rolls_on_rotation(ctx: Arc<Ctx>) {
    let found = e2e::upstream::binary();
    if !imported(&ctx, found, "the upstream Go CCM", "upstream", images::build_upstream_bench) {
        return;
    }
    power_on_any_stopped(&ctx).await;
    let names = ctx.cluster.node_names();
    wait("the three Nodes Ready", Duration::from_secs(120), || async { all_ready(&ctx, &names).await.then_some(()) })
        .await;
    upstream_images_allowed_and_no_other_resource(&ctx).await;

    let t = Instant::now();
    apply_resource(&ctx, 2).await;
    let leader = ready_with_leader(&ctx, "the upstream manager Ready with its leader named").await;
    measured(format!(
        "upstream image: resource applied to Ready with leader {leader}: {:.1} s",
        t.elapsed().as_secs_f64()
    ));
    let (status, reason) = condition(&ctx, "ProviderHealthy").await.expect("ProviderHealthy");
    assert_eq!((status.as_str(), reason.as_str()), ("True", crds::reasons::provider_healthy::UPSTREAM_HEALTHZ));
    let bindings: Api<ClusterRoleBinding> = Api::all(ctx.client.clone());
    let binding_name = format!("ccm-operator:{CCM_NS}:{NAME}:upstream");
    let binding = bindings.get(&binding_name).await.expect("the upstream binding");
    assert_eq!(binding.role_ref.name, "ccm-manager-upstream");

    // A kubelet's new Node, initialized by the upstream manager.
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    // A Node the leader does not run on (a host-network manager's identity starts with its
    // Node's name): this measures initialization, not a failover.
    let name = names.iter().rev().find(|n| !leader.starts_with(&format!("{n}_"))).expect("three Nodes").clone();
    power_off(&ctx, &name).await;
    let _ = nodes.delete(&name, &DeleteParams::default()).await;
    wait(&format!("{name}'s Node gone"), Duration::from_secs(60), || async {
        nodes.get_opt(&name).await.ok()?.is_none().then_some(())
    })
    .await;
    let t = Instant::now();
    power_on(&ctx, &name).await;
    let node = wait(&format!("{name} initialized by the upstream image"), Duration::from_secs(120), || {
        initialized(&ctx, &name)
    })
    .await;
    let provider_id = node.spec.and_then(|s| s.provider_id).unwrap_or_default();
    assert_eq!(provider_id, format!("bench://{name}"), "the bench provider's providerID");
    let labels = node.metadata.labels.unwrap_or_default();
    assert_eq!(labels.get("node.kubernetes.io/instance-type").map(String::as_str), Some("bench.small"));
    measured(format!("upstream image: kubelet start to Node initialized: {:.1} s", t.elapsed().as_secs_f64()));

    // A LoadBalancer Service gets the bench provider's address, and its deletion goes through
    // the service controller's finalizer.
    let services: Api<k8s_openapi::api::core::v1::Service> = Api::namespaced(ctx.client.clone(), LB_NS);
    apply(&ctx.client, json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": LB_NS}})).await;
    let t = Instant::now();
    apply(
        &ctx.client,
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "bench", "namespace": LB_NS},
            "spec": {"type": "LoadBalancer", "ports": [{"port": 80, "targetPort": 80}]}}),
    )
    .await;
    let ip = wait("the Service's bench address", Duration::from_secs(60), || async {
        let s = services.get_opt("bench").await.ok()??;
        s.status?.load_balancer?.ingress?.first()?.ip.clone()
    })
    .await;
    assert!(ip.starts_with("198.18."), "the bench provider's addresses: {ip}");
    measured(format!("upstream image: LoadBalancer Service to address {ip}: {:.1} s", t.elapsed().as_secs_f64()));
    let _ = services.delete("bench", &DeleteParams::default()).await;
    wait("the Service gone through the controller's finalizer", Duration::from_secs(60), || async {
        services.get_opt("bench").await.ok()?.is_none().then_some(())
    })
    .await;

    // Everything it did, it was allowed to: the upstream ClusterRole and the own Role suffice.
    let running = pods(&ctx).await;
    assert_eq!(running.len(), 2, "two replicas");
    for p in &running {
        // A log that cannot be read must fail the check, not pass it empty.
        let log = ctx.cluster.kubectl_raw(&["logs", "-n", CCM_NS, &p.name_any()]).expect("the manager Pod's log");
        assert!(log.contains("acquire leader lease"), "not the manager's log: {log}");
        let forbidden: Vec<&str> = log.lines().filter(|l| l.contains("forbidden")).take(3).collect();
        assert!(forbidden.is_empty(), "{}: {forbidden:#?}", p.name_any());
    }

    // A cloud-config rotation rolls the Pods (the bench provider reloads nothing).
    let before: Vec<String> = running.iter().map(|p| p.name_any()).collect();
    let t = Instant::now();
    apply(&ctx.client, secret("# rotated\n")).await;
    wait("the upstream manager's Pods replaced after the rotation", Duration::from_secs(180), || async {
        let now = pods(&ctx).await;
        let fresh = now.iter().filter(|p| !before.contains(&p.name_any()) && crate::is_ready(p)).count();
        (fresh == 2 && now.len() == 2).then_some(())
    })
    .await;
    let leader = ready_with_leader(&ctx, "Ready with a leader after the rotation").await;
    measured(format!(
        "upstream image: rotation to new Pods Ready, leader {leader}: {:.1} s",
        t.elapsed().as_secs_f64()
    ));

    // Deleting the resource leaves nothing of it.
    let crs: Api<crds::CloudControllerManager> = Api::namespaced(ctx.client.clone(), CCM_NS);
    let _ = crs.delete(NAME, &DeleteParams::default()).await;
    wait("the upstream resource and its children gone", Duration::from_secs(120), || async {
        let gone = resource(&ctx).await.is_none()
            && pods(&ctx).await.is_empty()
            && bindings.get_opt(&binding_name).await.ok()?.is_none();
        gone.then_some(())
    })
    .await;
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(ctx.client.clone(), CCM_NS);
    let _ = secrets.delete(SECRET, &DeleteParams::default()).await;
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(ctx.client.clone());
    let _ = namespaces.delete(LB_NS, &DeleteParams::default()).await;
}

/// Issue 48 item 4 on the real cluster: the upstream Go CCM started by hand on the host (leader
/// election on its default Lease `kube-system/cloud-controller-manager`) beside a new resource:
/// the resource reports `ForeignManager` naming the holder and deploys nothing while it runs;
/// once it stops, the resource deploys by itself.
pub async fn a_foreign_ccm_started_by_hand_is_reported_and_nothing_fights_it(ctx: Arc<Ctx>) {
    if let Err(why) = e2e::upstream::binary() {
        println!("    skipped: the upstream Go CCM is not here ({why}); see ../shared/upstream/README.md");
        return;
    }
    if deployment_available(&ctx.client, OPERATOR_NS, "ccm-operator").await.is_none() {
        chart_allowing_the_upstream_image(&ctx).await;
    }
    let dir = ctx.cluster.state_dir().join("foreign-ccm");
    std::fs::create_dir_all(&dir).expect("a directory for its log");
    let mut foreign = e2e::bench::ManagerProcess::spawn_upstream(
        "--controllers=cloud-node-controller",
        &ctx.cluster.kubeconfig(),
        &[],
        &dir.join("upstream.log"),
    )
    .expect("the foreign CCM starts");
    foreign.wait_healthy(Duration::from_secs(60)).await.expect("the foreign CCM is healthy");
    let leases: Api<Lease> = Api::namespaced(ctx.client.clone(), "kube-system");
    let holder =
        wait("the foreign CCM leading on kube-system/cloud-controller-manager", Duration::from_secs(60), || async {
            leases.get_opt("cloud-controller-manager").await.ok()??.spec?.holder_identity.filter(|h| !h.is_empty())
        })
        .await;

    apply_resource(&ctx, 1).await;
    let message = wait("ForeignManager reported", Duration::from_secs(60), || async {
        let cr = resource(&ctx).await?;
        let c = cr.status?.conditions.into_iter().find(|c| c.type_ == "ConfigValid")?;
        (c.reason == crds::reasons::config_valid::FOREIGN_MANAGER).then_some(c.message)
    })
    .await;
    assert!(message.contains(&format!("is held by {holder:?}")), "{message}");
    // Nothing of the resource's runs beside it, a while later too.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> = Api::namespaced(ctx.client.clone(), CCM_NS);
    assert!(deployments.get_opt(&format!("ccm-{NAME}")).await.expect("reading").is_none(), "no competing manager");
    assert!(pods(&ctx).await.is_empty());

    let t = Instant::now();
    foreign.stop();
    let leader = ready_with_leader(&ctx, "the resource Ready once the foreign CCM stopped").await;
    measured(format!(
        "foreign CCM stopped to the resource's own manager Ready (leader {leader}): {:.1} s",
        t.elapsed().as_secs_f64()
    ));
    let crs: Api<crds::CloudControllerManager> = Api::namespaced(ctx.client.clone(), CCM_NS);
    let _ = crs.delete(NAME, &DeleteParams::default()).await;
    wait("the resource gone", Duration::from_secs(120), || async {
        (resource(&ctx).await.is_none() && pods(&ctx).await.is_empty()).then_some(())
    })
    .await;
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(ctx.client.clone(), CCM_NS);
    let _ = secrets.delete(SECRET, &DeleteParams::default()).await;
}
