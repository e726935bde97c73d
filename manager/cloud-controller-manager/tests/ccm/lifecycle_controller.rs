//! cloud-node-lifecycle-controller against both API server backends and the fake provider: one test
//! per upstream behaviour (L1–L5, named after its ID) plus our additions (batched checks with
//! bounded concurrency, the deletion grace period).

use crate::kit::{Engine, EngineFor};
use std::time::{Duration, Instant};

use ccm_framework::controllers::lifecycle::{self, LifecycleController};
use ccm_framework::controllers::node::logic::TAINT_SHUTDOWN;
use ccm_framework::options::ControllerOptions;
use ccm_framework::provider::{CloudError, InstanceMetadata};
use ccm_provider_fake::{FakeInstance, FakeProvider, methods};
use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeSpec, NodeStatus, Taint};
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;
use testkit::{Backend, FaultRule, RequestRecord, TestCluster, eventually_within};

const WAIT: Duration = Duration::from_secs(15);
const PERIOD: Duration = Duration::from_millis(100);

/// The engine the lifecycle controller runs on, and what these tests ask of it.
type Env = EngineFor<LifecycleController>;

fn options() -> ControllerOptions {
    ControllerOptions { node_monitor_period: PERIOD, ..Default::default() }
}

impl Env {
    /// The server and fake, with the controller not started yet.
    async fn start(backend: Backend, options: ControllerOptions) -> Env {
        Env::with_cluster(TestCluster::start(backend).await.expect("API server starts"), options).await
    }

    /// Like [`start`](Self::start), with API fault injection.
    async fn start_with_faults(backend: Backend, options: ControllerOptions) -> Env {
        Env::with_cluster(TestCluster::start_with_faults(backend).await.expect("API server starts"), options).await
    }

    async fn with_cluster(cluster: TestCluster, options: ControllerOptions) -> Env {
        Env::new(Engine::start(cluster, options, FakeProvider::new()).await)
    }

    fn run(&self) {
        Engine::run(self, Box::new(LifecycleController::new()));
    }

    /// Create the Node and give its instance to the fake.
    async fn node(&self, name: &str, ready: Option<&str>, taints: Vec<Taint>, instance: Option<FakeInstance>) {
        self.node_with_provider_id(name, Some(format!("fake://{name}")), ready, taints, instance).await;
    }

    /// [`Self::node`] with the given providerID (`None`: a Node the kubelet registered without one).
    async fn node_with_provider_id(
        &self,
        name: &str,
        provider_id: Option<String>,
        ready: Option<&str>,
        taints: Vec<Taint>,
        instance: Option<FakeInstance>,
    ) {
        if let Some(i) = instance {
            self.fake.set_instance(name, i);
        }
        let node = Node {
            metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
            spec: Some(NodeSpec { provider_id, taints: (!taints.is_empty()).then_some(taints), ..Default::default() }),
            status: Some(NodeStatus {
                conditions: ready
                    .map(|s| vec![NodeCondition { type_: "Ready".into(), status: s.into(), ..Default::default() }]),
                ..Default::default()
            }),
        };
        let pp = PostParams { field_manager: Some("kubelet".into()), ..Default::default() };
        self.nodes.create(&pp, &node).await.expect("create node");
        // The controller works from the cache: wait until it has the Node.
        eventually_within("the Node in the controller's cache", WAIT, || async {
            self.ctx.nodes.get(None, name).map(|_| ())
        })
        .await;
    }

    async fn get(&self, name: &str) -> Option<Node> {
        self.nodes.get_opt(name).await.expect("get node")
    }

    fn controller_writes(&self) -> Vec<RequestRecord> {
        self.cluster.request_log().filter(is_controller_write)
    }

    async fn events(&self, reason: &str, node: &str) -> usize {
        let events = self.cluster.events(reason).await.expect("list events");
        events.iter().filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(node)).count()
    }

    /// Let `n` passes run.
    async fn passes(&self, n: u32) {
        tokio::time::sleep(PERIOD * n + Duration::from_millis(100)).await;
    }
}

/// Patches carry our field manager; deletes are the only other write, and nobody else deletes
/// Nodes in these tests.
fn is_controller_write(r: &RequestRecord) -> bool {
    r.is_write()
        && r.resource.as_deref() == Some("nodes")
        && (r.field_manager.as_deref() == Some(lifecycle::NAME) || r.verb == "delete")
}

fn shutdown_taint() -> Taint {
    Taint { key: TAINT_SHUTDOWN.into(), effect: "NoSchedule".into(), value: None, time_added: None }
}

fn has_shutdown_taint(node: &Node) -> bool {
    node.spec.as_ref().and_then(|s| s.taints.as_ref()).is_some_and(|ts| ts.iter().any(|t| t.key == TAINT_SHUTDOWN))
}

fn running(name: &str) -> FakeInstance {
    FakeInstance::running(InstanceMetadata { provider_id: format!("fake://{name}"), ..Default::default() })
}

fn shut_down(name: &str) -> FakeInstance {
    FakeInstance { shutdown: true, ..running(name) }
}

fn cloud_calls(env: &Env) -> usize {
    env.fake.calls().total()
}

testkit::backend_tests! {
    async fn l1_ready_node_shutdown_taint_is_removed_without_a_cloud_call(backend) {
        let env = Env::start(backend, options()).await;
        let other =
            Taint { key: "dedicated".into(), effect: "NoSchedule".into(), value: Some("x".into()), time_added: None };
        env.node("back", Some("True"), vec![other.clone(), shutdown_taint()], Some(running("back"))).await;
        env.run();
        let node = eventually_within("back without the shutdown taint", WAIT, || async { env.get("back").await.filter(|n| !has_shutdown_taint(n)) }).await;
        let mut expected = vec![other];
        if env.cluster.is_genuine() {
            // kube-apiserver's TaintNodesByCondition admission taints every new Node not-ready.
            expected.push(Taint { key: "node.kubernetes.io/not-ready".into(), ..shutdown_taint() });
        }
        assert_eq!(node.spec.unwrap().taints.unwrap(), expected, "only the shutdown taint goes");
        env.passes(3).await;
        assert_eq!(cloud_calls(&env), 0, "Ready Nodes cost no cloud call");
        assert_eq!(env.controller_writes().len(), 1, "one patch, no repeat");
        assert_eq!(env.events("Synced", "back").await + env.events("DeletingNode", "back").await, 0, "no event");
    }

    async fn l1_ready_node_without_taint_costs_nothing(backend) {
        let env = Env::start(backend, options()).await;
        env.node("fine", Some("True"), vec![], Some(running("fine"))).await;
        env.run();
        env.passes(5).await;
        assert_eq!(cloud_calls(&env), 0);
        assert!(env.controller_writes().is_empty());
    }

    async fn l2_nodes_not_ready_unknown_or_without_condition_are_checked_in_batches(backend) {
        let env = Env::start(backend, ControllerOptions { node_monitor_period: Duration::from_secs(3600), ..options() }).await;
        env.fake.set_batch_size(10);
        for (i, ready) in (0..30).zip([Some("False"), Some("Unknown"), None].into_iter().cycle()) {
            let name = format!("nr{i:02}");
            env.node(&name, ready, vec![], Some(running(&name))).await;
        }
        env.node("ready", Some("True"), vec![], Some(running("ready"))).await;
        env.run();
        eventually_within("three shutdown checks", WAIT, || async { env.fake.calls().count(methods::INSTANCES_SHUTDOWN) == 3 }).await;
        assert_eq!(env.fake.calls().count(methods::INSTANCES_EXIST), 3, "30 Nodes in batches of 10, Ready one skipped");
        assert_eq!(env.fake.calls().count(methods::INSTANCE_EXISTS), 0, "no single lookups");
        assert!(env.controller_writes().is_empty(), "existing, running instances change nothing");
    }

    async fn l2_checks_run_with_bounded_concurrency(backend) {
        let env = Env::start(backend, ControllerOptions { node_monitor_period: Duration::from_secs(3600), ..options() }).await;
        env.fake.set_batch_size(5);
        env.fake.set_latency(Duration::from_millis(200));
        for i in 0..50 {
            let name = format!("c{i:02}");
            env.node(&name, Some("False"), vec![], Some(running(&name))).await;
        }
        env.run();
        eventually_within("ten shutdown checks", WAIT, || async { env.fake.calls().count(methods::INSTANCES_SHUTDOWN) == 10 }).await;
        assert_eq!(env.fake.calls().count(methods::INSTANCES_EXIST), 10);
        let peak = env.fake.calls().peak_in_flight();
        assert!(peak > 1 && peak <= lifecycle::BATCHES_IN_FLIGHT, "parallel but bounded: peak {peak}");
    }

    async fn l3_existence_check_error_changes_nothing(backend) {
        let env = Env::start(backend, options()).await;
        env.node("flaky", Some("False"), vec![], None).await; // absent from the cloud...
        env.fake.fail_rate(methods::INSTANCES_EXIST, 1.0, CloudError::Unavailable("503".into())); // ...but the cloud errors
        env.run();
        eventually_within("three existence checks", WAIT, || async { env.fake.calls().count(methods::INSTANCES_EXIST) >= 3 }).await;
        assert!(env.get("flaky").await.is_some(), "an error never deletes");
        assert_eq!(env.fake.calls().count(methods::INSTANCES_SHUTDOWN), 0, "no shutdown check after an error");
        assert!(env.controller_writes().is_empty());
    }

    async fn l4_node_whose_instance_is_gone_is_deleted_with_an_event(backend) {
        let env = Env::start(backend, options()).await;
        env.node("gone", Some("Unknown"), vec![], None).await;
        env.node("alive", Some("Unknown"), vec![], Some(running("alive"))).await;
        env.run();
        eventually_within("gone deleted", WAIT, || async { env.get("gone").await.is_none() }).await;
        eventually_within("one DeletingNode event for gone", WAIT, || async { env.events("DeletingNode", "gone").await == 1 }).await;
        env.passes(3).await;
        assert!(env.get("alive").await.is_some());
        let deletes = env.cluster.request_log().count(|r| r.verb == "delete" && r.resource.as_deref() == Some("nodes"));
        assert_eq!(deletes, 1);
    }

    async fn l4_failed_delete_emits_deleting_node_failed_and_is_retried_next_pass(backend) {
        let env = Env::start_with_faults(backend, options()).await;
        env.node("stuck", Some("False"), vec![], None).await;
        env.cluster.faults().add_rule(FaultRule {
            path_prefix: Some("/api/v1/nodes/stuck".into()),
            verbs: vec!["delete".into()],
            error_rate: 1.0,
            status: 500,
            ..Default::default()
        });
        env.run();
        eventually_within("a DeletingNodeFailed event for stuck", WAIT, || async { env.events("DeletingNodeFailed", "stuck").await >= 1 }).await;
        assert!(env.get("stuck").await.is_some());
        env.cluster.faults().clear();
        eventually_within("stuck deleted", WAIT, || async { env.get("stuck").await.is_none() }).await;
    }

    async fn l5_shut_down_instance_gets_the_shutdown_taint_once(backend) {
        let env = Env::start(backend, options()).await;
        env.node("off", Some("False"), vec![], Some(shut_down("off"))).await;
        env.run();
        let node = eventually_within("off with the shutdown taint", WAIT, || async { env.get("off").await.filter(has_shutdown_taint) }).await;
        let taint = node.spec.unwrap().taints.unwrap().into_iter().find(|t| t.key == TAINT_SHUTDOWN).unwrap();
        assert_eq!((taint.effect.as_str(), taint.value), ("NoSchedule", None));
        env.passes(4).await;
        assert_eq!(env.controller_writes().len(), 1, "an existing taint is not written again");
        // Back up and Ready: L1 removes it.
        let ready = json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}});
        env.nodes.patch_status("off", &PatchParams::default(), &Patch::Strategic(ready)).await.expect("ready");
        eventually_within("off without the shutdown taint", WAIT, || async { env.get("off").await.filter(|n| !has_shutdown_taint(n)) }).await;
    }

    async fn l5_shutdown_check_error_adds_no_taint(backend) {
        let env = Env::start(backend, options()).await;
        env.node("off", Some("False"), vec![], Some(shut_down("off"))).await;
        env.fake.fail_rate(methods::INSTANCES_SHUTDOWN, 1.0, CloudError::Other("boom".into()));
        env.run();
        eventually_within("three shutdown checks", WAIT, || async { env.fake.calls().count(methods::INSTANCES_SHUTDOWN) >= 3 }).await;
        assert!(!has_shutdown_taint(&env.get("off").await.unwrap()));
        assert!(env.controller_writes().is_empty());
    }

    async fn l7_deletion_grace_period_survives_a_brief_not_found(backend) {
        let grace = Duration::from_secs(2);
        let env = Env::start(backend, ControllerOptions { node_deletion_grace_period: grace, ..options() }).await;
        env.node("blip", Some("False"), vec![], Some(running("blip"))).await;
        env.run();
        // The cloud says "not found" for about a second, then finds the instance again.
        env.fake.remove_instance("blip");
        let absent_from = env.fake.calls().count(methods::INSTANCES_EXIST);
        eventually_within("five more existence checks", WAIT, || async { env.fake.calls().count(methods::INSTANCES_EXIST) >= absent_from + 5 }).await;
        env.fake.set_instance("blip", running("blip"));
        tokio::time::sleep(grace + Duration::from_millis(500)).await;
        assert!(env.get("blip").await.is_some(), "a brief absence inside the grace period deletes nothing");
        assert_eq!(env.events("DeletingNode", "blip").await, 0);
    }

    async fn l7_deletion_grace_period_deletes_after_continuous_absence(backend) {
        let grace = Duration::from_millis(1500);
        let env = Env::start(backend, ControllerOptions { node_deletion_grace_period: grace, ..options() }).await;
        env.node("dead", Some("False"), vec![], None).await;
        let started = Instant::now();
        env.run();
        eventually_within("dead deleted", WAIT, || async { env.get("dead").await.is_none() }).await;
        assert!(started.elapsed() >= grace, "deleted only after the grace period: {:?}", started.elapsed());
        assert!(env.fake.calls().count(methods::INSTANCES_EXIST) >= 5, "absence was confirmed on every pass meanwhile");
    }
}

// ---- §6 item 13 and node ownership (KEP-5778) ------------------------------------------------

testkit::backend_tests! {
    async fn a_node_without_a_provider_id_whose_machine_is_gone_is_deleted(backend) {
        // Upstream bug k/k#141364: such a Node is never deleted there.
        let env = Env::start(backend, options()).await;
        env.node_with_provider_id("bare", None, Some("False"), vec![], None).await;
        env.node_with_provider_id("kept", None, Some("False"), vec![], Some(running("kept"))).await;
        env.run();
        eventually_within("bare deleted", WAIT, || async { env.get("bare").await.is_none() }).await;
        env.passes(2).await;
        assert!(env.get("kept").await.is_some(), "a Node whose machine exists stays");
    }

    async fn with_node_ownership_another_platforms_node_is_never_deleted_or_tainted(backend) {
        let ownership = ccm_framework::ownership::NodeOwnership::of(&["fake"]).expect("a platform name");
        let env = Env::start(backend, ControllerOptions { node_ownership: ownership, ..options() }).await;
        env.node("mine", Some("False"), vec![], None).await;
        env.node_with_provider_id("theirs", Some("aws:///us-east-1a/i-0abc".into()), Some("False"), vec![], None).await;
        env.node_with_provider_id("unmarked", None, Some("False"), vec![], None).await;
        env.run();
        eventually_within("mine deleted", WAIT, || async { env.get("mine").await.is_none() }).await;
        env.passes(3).await;
        for name in ["theirs", "unmarked"] {
            let node = env.get(name).await.unwrap_or_else(|| panic!("{name} was deleted"));
            assert!(!has_shutdown_taint(&node), "{name} was tainted");
        }
        assert_eq!(env.events("DeletingNode", "theirs").await, 0);
    }
}
