//! Shadow mode against both API server backends: a shadow manager beside a cluster a normal
//! manager has set up writes nothing to Nodes or Services (the local server's request log, the
//! genuine server's audit log), makes no mutating cloud call (the fake's call log), and reports
//! zero differences when it agrees and exactly the expected ones when its configuration
//! differs: in the condition, `status.shadow`, the metrics and the events.

use std::sync::Arc;
use std::time::Duration;

use ccm_framework::engine::{EngineBuilder, RunningEngine};
use ccm_framework::options::ControllerOptions;
use ccm_framework::status::StatusTarget;
use ccm_provider_fake::{FakeInstance, FakeProvider, methods};
use crds::CloudControllerManager;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::PostParams;
use kube::{Api, Client};
use testkit::{RequestRecord, TestCluster, eventually_within, init_tracing, kubelet_node, lb_service};
use tokio::time::sleep;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(30);
const NODES: usize = 4;
const NODE_CONTROLLER: &str = "cloud-node-controller";
const SERVICE_CONTROLLER: &str = "service-lb-controller";

/// The calls that change the fake cloud.
const MUTATING: [&str; 5] = [
    methods::ENSURE_LOAD_BALANCER,
    methods::UPDATE_LOAD_BALANCER,
    methods::ENSURE_LOAD_BALANCER_DELETED,
    methods::CREATE_ROUTE,
    methods::DELETE_ROUTE,
];

fn mutating_calls(fake: &FakeProvider) -> usize {
    MUTATING.iter().map(|m| fake.calls().count(m)).sum()
}

fn node_name(i: usize) -> String {
    format!("shadow-n{i}")
}

/// A fake cloud with one derived instance per Node, in `zone` when given.
fn cloud(zone: Option<&str>) -> FakeProvider {
    let fake = FakeProvider::new();
    for i in 0..NODES {
        let mut instance = FakeInstance::derived(&node_name(i));
        if let Some(zone) = zone {
            instance.metadata.zone = zone.to_string();
        }
        fake.set_instance(&node_name(i), instance);
    }
    fake
}

fn options(shadow: bool) -> ControllerOptions {
    ControllerOptions {
        configure_cloud_routes: false,
        node_batch_window: Duration::from_millis(20),
        shadow,
        ..Default::default()
    }
}

async fn start(client: Client, fake: Arc<FakeProvider>, options: ControllerOptions) -> RunningEngine {
    EngineBuilder::new(client, fake, options)
        .report_status(
            Some(StatusTarget { namespace: "kube-system".into(), name: "fake".into() }),
            Duration::from_millis(100),
        )
        .build()
        .unwrap()
        .start(CancellationToken::new())
        .await
        .unwrap()
}

fn is_node_or_service_write(r: &RequestRecord) -> bool {
    r.is_write() && matches!(r.resource.as_deref(), Some("nodes" | "services"))
}

/// A mark after which no write of the stopped manager can still appear: the server logs a
/// request after answering it, so wait until the log has been quiet for a while.
async fn quiet_mark(cluster: &TestCluster) -> u64 {
    let mut seen = cluster.request_log().count(is_node_or_service_write);
    loop {
        sleep(Duration::from_millis(700)).await;
        let now = cluster.request_log().count(is_node_or_service_write);
        if now == seen {
            return cluster.request_log().mark();
        }
        seen = now;
    }
}

fn shadow_condition(ccm: &CloudControllerManager) -> Option<Condition> {
    ccm.status.as_ref()?.conditions.iter().find(|c| c.type_ == "ShadowAgrees").cloned()
}

async fn wait_shadow(api: &Api<CloudControllerManager>, status: &str) -> CloudControllerManager {
    eventually_within("ShadowAgrees with the status", WAIT, || async {
        let ccm = api.get("fake").await.ok()?;
        shadow_condition(&ccm).filter(|c| c.status == status).map(|_| ccm)
    })
    .await
}

/// The cluster as a normal manager left it: Nodes initialized, the Service served.
async fn set_up_by_a_normal_manager(cluster: &TestCluster, fake: Arc<FakeProvider>) {
    let nodes: Api<Node> = Api::all(cluster.client());
    let services: Api<Service> = Api::namespaced(cluster.client(), "default");
    for i in 0..NODES {
        nodes.create(&PostParams::default(), &kubelet_node(&node_name(i))).await.unwrap();
    }
    services.create(&PostParams::default(), &lb_service("default", "web")).await.unwrap();
    let normal = start(cluster.client(), fake, options(false)).await;
    for i in 0..NODES {
        eventually_within("the Node's provider ID", WAIT, || async {
            let n = nodes.get(&node_name(i)).await.ok()?;
            n.spec.and_then(|s| s.provider_id).map(|_| ())
        })
        .await;
    }
    eventually_within("web's ingress", WAIT, || async {
        let svc = services.get("web").await.ok()?;
        svc.status?.load_balancer?.ingress.filter(|i| !i.is_empty()).map(|_| ())
    })
    .await;
    normal.stop().await.unwrap();
}

testkit::backend_tests! {
    async fn shadow_mode_agrees_with_the_manager_that_set_up_the_cluster_and_writes_nothing(backend) {
        init_tracing();
        let cluster = TestCluster::start(backend).await.unwrap();
        let api = crate::kit::install_fake_ccm(&cluster).await;
        let fake = Arc::new(cloud(None));
        set_up_by_a_normal_manager(&cluster, fake.clone()).await;
        let mark = quiet_mark(&cluster).await;
        let mutating_before = mutating_calls(&fake);

        let engine = start(cluster.client(), fake.clone(), options(true)).await;
        let ccm = wait_shadow(&api, "True").await;
        let condition = shadow_condition(&ccm).unwrap();
        assert_eq!(condition.reason, "Agrees", "{condition:?}");
        let report = ccm.status.unwrap().shadow.expect("status.shadow");
        assert_eq!((report.total, report.objects), (0, 0), "{report:?}");
        assert!(report.differences.is_empty());
        let text = engine.metrics().encode();
        assert!(
            text.contains(r#"ccm_shadow_differences{controller="cloud-node-controller",kind="differs"} 0"#),
            "{text}"
        );
        // Let a few more passes and status intervals go by, then count.
        sleep(Duration::from_secs(1)).await;
        engine.stop().await.unwrap();
        sleep(Duration::from_millis(700)).await;
        let writes: Vec<RequestRecord> =
            cluster.request_log().since(mark).into_iter().filter(is_node_or_service_write).collect();
        assert!(writes.is_empty(), "shadow mode wrote to Nodes or Services: {writes:?}");
        assert_eq!(mutating_calls(&fake), mutating_before, "shadow mode made a mutating cloud call");
        assert!(fake.calls().count(methods::INSTANCES_METADATA) > 0, "it did read the cloud");
        drop(cluster);
    }

    async fn shadow_mode_with_another_zone_and_an_unknown_load_balancer_reports_exactly_those_differences(backend) {
        init_tracing();
        let cluster = TestCluster::start(backend).await.unwrap();
        let api = crate::kit::install_fake_ccm(&cluster).await;
        set_up_by_a_normal_manager(&cluster, Arc::new(cloud(None))).await;
        let mark = quiet_mark(&cluster).await;

        // Another cloud: every instance in another zone, and no load balancer for `web`.
        let other = Arc::new(cloud(Some("shadow-zone-x")));
        let engine = start(cluster.client(), other.clone(), options(true)).await;
        let ccm = wait_shadow(&api, "False").await;
        let condition = shadow_condition(&ccm).unwrap();
        assert_eq!(condition.reason, "Differs");
        assert_eq!(
            condition.message,
            format!(
                "{} differences on {} objects: cloud-node-controller differs={NODES}, service-lb-controller would-create-load-balancer=1",
                NODES + 1,
                NODES + 1
            )
        );
        let report = ccm.status.unwrap().shadow.expect("status.shadow");
        assert_eq!(report.total, (NODES + 1) as i64);
        let kinds: Vec<(String, String, String)> =
            report.differences.iter().map(|d| (d.controller.clone(), d.kind.clone(), d.object.clone())).collect();
        let mut want: Vec<(String, String, String)> = (0..NODES)
            .map(|i| (NODE_CONTROLLER.to_string(), "differs".to_string(), format!("Node/{}", node_name(i))))
            .collect();
        want.push((SERVICE_CONTROLLER.into(), "would-create-load-balancer".into(), "Service/default/web".into()));
        assert_eq!(kinds, want);
        for d in report.differences.iter().filter(|d| d.kind == "differs") {
            let fields: Vec<(&str, &str)> = d.fields.iter().map(|f| (f.path.as_str(), f.ours.as_str())).collect();
            assert_eq!(fields, vec![
                ("metadata.labels[failure-domain.beta.kubernetes.io/zone]", "shadow-zone-x"),
                ("metadata.labels[topology.kubernetes.io/zone]", "shadow-zone-x"),
            ]);
        }
        let text = engine.metrics().encode();
        assert!(
            text.contains(&format!(r#"ccm_shadow_differences{{controller="cloud-node-controller",kind="differs"}} {NODES}"#)),
            "{text}"
        );
        assert!(
            text.contains(r#"ccm_shadow_differences{controller="service-lb-controller",kind="would-create-load-balancer"} 1"#),
            "{text}"
        );
        // One event per differing object.
        eventually_within("a ShadowDifference event on every Node and on web", WAIT, || async {
            let differences = cluster.events("ShadowDifference").await.ok()?;
            let on: std::collections::BTreeSet<String> =
                differences.iter().filter_map(|e| e.regarding.as_ref()?.name.clone()).collect();
            (on.len() == NODES + 1).then_some(())
        })
        .await;
        engine.stop().await.unwrap();
        sleep(Duration::from_millis(700)).await;
        let writes: Vec<RequestRecord> =
            cluster.request_log().since(mark).into_iter().filter(is_node_or_service_write).collect();
        assert!(writes.is_empty(), "shadow mode wrote to Nodes or Services: {writes:?}");
        assert_eq!(mutating_calls(&other), 0, "shadow mode made a mutating cloud call");
        assert!(other.calls().count(methods::GET_LOAD_BALANCER) >= 1, "it did ask the cloud for the load balancer");
        drop(cluster);
    }

    async fn the_binary_with_shadow_compares_on_its_own_lease_and_writes_nothing(backend) {
        init_tracing();
        let cluster = TestCluster::start(backend).await.unwrap();
        let api = crate::kit::install_fake_ccm(&cluster).await;
        let nodes: Api<Node> = Api::all(cluster.client());
        // A tainted Node the binary's fake cloud knows (autoInstances): shadow mode would patch it.
        nodes.create(&PostParams::default(), &kubelet_node("shadow-bin-n0")).await.unwrap();
        let mark = quiet_mark(&cluster).await;
        let dir = std::env::temp_dir().join(format!("ccm-shadow-bin-{}-{}", std::process::id(), cluster.backend().name()));
        std::fs::create_dir_all(&dir).unwrap();
        let cloud_config = dir.join("fake.yaml");
        std::fs::write(&cloud_config, "autoInstances: true\n").unwrap();
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_cloud-controller-manager"))
            .args([
                "--cloud-provider=fake",
                &format!("--cloud-config={}", cloud_config.display()),
                &format!("--kubeconfig={}", cluster.kubeconfig_path().display()),
                "--secure-port=0",
                "--configure-cloud-routes=false",
                "--leader-elect-retry-period=500ms",
                "--ccm-resource=kube-system/fake",
                "--ccm-resource-interval=200ms",
                "--shadow",
            ])
            .env_remove("RUST_LOG")
            .stderr(std::fs::File::create(dir.join("stderr")).unwrap())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let ccm = wait_shadow(&api, "False").await;
        let report = ccm.status.unwrap().shadow.expect("status.shadow");
        let first = &report.differences[0];
        assert_eq!((first.kind.as_str(), first.object.as_str()), ("would-patch", "Node/shadow-bin-n0"), "{report:?}");
        assert!(first.fields.iter().any(|f| f.path == "spec.providerID" && f.ours == "fake://shadow-bin-n0"), "{report:?}");
        // Its own Lease, never upstream's.
        let leases: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(cluster.client(), "kube-system");
        let lease = leases.get("cloud-controller-manager-shadow").await.expect("the shadow Lease");
        assert!(lease.spec.and_then(|s| s.holder_identity).is_some());
        assert!(leases.get_opt("cloud-controller-manager").await.unwrap().is_none(), "upstream's Lease untouched");
        let pid = child.id().unwrap().to_string();
        assert!(std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
        let status = tokio::time::timeout(Duration::from_secs(30), child.wait()).await.unwrap().unwrap();
        assert!(status.success(), "exit status {status:?}");
        sleep(Duration::from_millis(700)).await;
        let writes: Vec<RequestRecord> =
            cluster.request_log().since(mark).into_iter().filter(is_node_or_service_write).collect();
        assert!(writes.is_empty(), "shadow mode wrote to Nodes or Services: {writes:?}");
        let tainted = nodes.get("shadow-bin-n0").await.unwrap();
        assert!(tainted.spec.and_then(|s| s.provider_id).is_none(), "the Node stays as kubelet registered it");
        let _ = std::fs::remove_dir_all(&dir);
        drop(cluster);
    }
}
