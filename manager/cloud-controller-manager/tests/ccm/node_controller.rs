//! cloud-node-controller against both API server backends and the fake provider: one test per
//! upstream behaviour (N1–N18 but N3, which has no counterpart here; named after its ID, see
//! docs/behaviours.md) plus our additions (batching, §6 fixes,
//! write budget, idle cost).

use crate::kit::{Engine, EngineFor};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use ccm_framework::controllers::lifecycle::LifecycleController;
use ccm_framework::controllers::node::logic::{
    ANNOTATION_PROVIDED_NODE_IP, LABEL_INSTANCE_TYPE, LABEL_INSTANCE_TYPE_BETA, LABEL_REGION, LABEL_REGION_BETA,
    LABEL_ZONE, LABEL_ZONE_BETA, TAINT_UNINITIALIZED,
};
use ccm_framework::controllers::node::{self, NodeController};
use ccm_framework::options::ControllerOptions;
use ccm_framework::provider::{CloudError, InstanceMetadata};
use ccm_provider_fake::{FakeInstance, FakeProvider, methods};
use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeCondition, Taint};
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;
use testkit::{Backend, NodeFixture, RequestRecord, TestCluster, eventually_within, kubelet_node, uninitialized_taint};

const WAIT: Duration = Duration::from_secs(15);

/// The engine the node controller runs on, and what these tests ask of it.
type Env = EngineFor<NodeController>;

/// Options for fast tests: a short batch window and a refresh that stays out of the way.
fn options() -> ControllerOptions {
    ControllerOptions {
        node_batch_window: Duration::from_millis(50),
        node_status_update_frequency: Duration::from_secs(3600),
        ..Default::default()
    }
}

impl Env {
    async fn start(backend: Backend, options: ControllerOptions, fake: FakeProvider) -> Env {
        let cluster = TestCluster::start(backend).await.expect("API server starts");
        Env::new(Engine::start(cluster, options, fake).await)
    }

    async fn started(backend: Backend, options: ControllerOptions, fake: FakeProvider) -> Env {
        let env = Env::start(backend, options, fake).await;
        env.run(Box::new(NodeController::new()));
        env
    }

    async fn create(&self, node: Node) -> Node {
        self.nodes
            .create(&PostParams { field_manager: Some("kubelet".into()), ..Default::default() }, &node)
            .await
            .expect("create node")
    }

    async fn get(&self, name: &str) -> Node {
        self.nodes.get(name).await.expect("get node")
    }

    /// Node writes made by a controller (its field manager), for one Node or all.
    fn writes_by(&self, manager: &str, node: Option<&str>) -> Vec<RequestRecord> {
        self.cluster.request_log().filter(|r| {
            r.is_write()
                && r.resource.as_deref() == Some("nodes")
                && r.field_manager.as_deref() == Some(manager)
                && node.is_none_or(|n| r.name.as_deref() == Some(n))
        })
    }

    fn metadata_calls(&self) -> usize {
        self.fake.calls().count(methods::INSTANCES_METADATA)
    }

    async fn wait_initialized(&self, name: &str) -> Node {
        eventually_within("the Node to be initialized", WAIT, || async {
            Some(self.get(name).await).filter(|n| !tainted(n))
        })
        .await
    }
}

fn addr(t: &str, a: &str) -> NodeAddress {
    NodeAddress { type_: t.into(), address: a.into() }
}

/// The taint kube-apiserver's TaintNodesByCondition admission adds to every new Node.
fn not_ready_taint() -> Taint {
    Taint { key: "node.kubernetes.io/not-ready".into(), value: None, effect: "NoSchedule".into(), time_added: None }
}

fn with_node_ip(mut node: Node, ip: &str) -> Node {
    node.metadata.annotations = Some(BTreeMap::from([(ANNOTATION_PROVIDED_NODE_IP.to_string(), ip.to_string())]));
    node
}

fn tainted(node: &Node) -> bool {
    node.spec.as_ref().and_then(|s| s.taints.as_ref()).is_some_and(|ts| ts.iter().any(|t| t.key == TAINT_UNINITIALIZED))
}

fn labels(node: &Node) -> BTreeMap<String, String> {
    node.metadata.labels.clone().unwrap_or_default()
}

fn addresses(node: &Node) -> Vec<NodeAddress> {
    node.status.as_ref().and_then(|s| s.addresses.clone()).unwrap_or_default()
}

fn provider_id(node: &Node) -> Option<String> {
    node.spec.as_ref().and_then(|s| s.provider_id.clone())
}

fn metadata(name: &str, addresses: Vec<NodeAddress>) -> InstanceMetadata {
    InstanceMetadata {
        provider_id: format!("fake://{name}"),
        instance_type: "fake.large".into(),
        node_addresses: addresses,
        zone: "zone-a".into(),
        region: "region-1".into(),
        additional_labels: BTreeMap::new(),
    }
}

fn fake_with(instances: &[(&str, InstanceMetadata)]) -> FakeProvider {
    let fake = FakeProvider::new();
    for (name, meta) in instances {
        fake.set_instance(name, FakeInstance::running(meta.clone()));
    }
    fake
}

testkit::backend_tests! {
    async fn n1_node_deleted_while_waiting_is_dropped_without_further_lookups(backend) {
        let env = Env::started(backend, options(), FakeProvider::new()).await;
        // No instance: every lookup returns None, so the Node waits in backoff.
        env.create(kubelet_node("gone").with_hostname()).await;
        eventually_within("a metadata lookup", WAIT, || async { env.metadata_calls() >= 1 }).await;
        env.nodes.delete("gone", &Default::default()).await.expect("delete");
        tokio::time::sleep(Duration::from_millis(300)).await;
        let after_delete = env.metadata_calls();
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(env.metadata_calls(), after_delete, "a deleted Node is never looked up again");
    }

    async fn n2_node_without_provider_id_stays_tainted_and_is_retried(backend) {
        let no_id = InstanceMetadata { provider_id: String::new(), ..metadata("n", vec![addr("InternalIP", "10.0.0.1")]) };
        let env = Env::started(backend, options(), fake_with(&[("n", no_id)])).await;
        env.create(kubelet_node("n").with_hostname()).await;
        eventually_within("three metadata lookups", WAIT, || async { env.metadata_calls() >= 3 }).await;
        let node = env.get("n").await;
        assert!(tainted(&node), "never untainted without a providerID");
        assert!(provider_id(&node).is_none());
        assert!(
            env.writes_by(node::NAME, Some("n")).is_empty(),
            "nothing is written for a Node that cannot be initialized"
        );
        // Once the cloud knows the providerID, the retry succeeds with no Node event needed.
        env.fake.set_instance("n", FakeInstance::running(metadata("n", vec![addr("InternalIP", "10.0.0.1")])));
        let node = env.wait_initialized("n").await;
        assert_eq!(provider_id(&node).as_deref(), Some("fake://n"));
    }

    async fn n2_cloud_error_keeps_the_taint_and_retries_with_backoff(backend) {
        let env = Env::start(backend, options(), fake_with(&[("n", metadata("n", vec![addr("InternalIP", "10.0.0.1")]))])).await;
        env.fake.fail_next(methods::INSTANCES_METADATA, 3, CloudError::Unavailable("503".into()));
        env.create(kubelet_node("n").with_hostname()).await;
        let started = Instant::now();
        env.run(Box::new(NodeController::new()));
        env.wait_initialized("n").await;
        assert_eq!(env.metadata_calls(), 4, "three failures, then success");
        // 250 ms + 500 ms + 1 s of backoff at least.
        assert!(started.elapsed() >= Duration::from_millis(1750), "retries back off: {:?}", started.elapsed());
    }

    async fn n2_missing_metadata_requeues_with_backoff_instead_of_waiting_for_an_event(backend) {
        // §6 item 1: upstream leaves the Node tainted until its next update event.
        let env = Env::started(backend, options(), FakeProvider::new()).await;
        env.create(kubelet_node("late").with_hostname()).await;
        eventually_within("two metadata lookups", WAIT, || async { env.metadata_calls() >= 2 }).await;
        assert!(tainted(&env.get("late").await));
        env.fake.set_instance("late", FakeInstance::running(metadata("late", vec![addr("InternalIP", "10.0.0.7")])));
        env.wait_initialized("late").await;
    }

    async fn n4_existing_provider_id_is_never_overwritten(backend) {
        let env = Env::started(backend, options(), fake_with(&[("n", metadata("n", vec![addr("InternalIP", "10.0.0.1")]))])).await;
        let mut n = kubelet_node("n").with_hostname();
        n.spec.as_mut().unwrap().provider_id = Some("fake://set-by-kubelet".into());
        env.create(n).await;
        let node = env.wait_initialized("n").await;
        assert_eq!(provider_id(&node).as_deref(), Some("fake://set-by-kubelet"));
        assert_eq!(labels(&node).get(LABEL_ZONE).map(String::as_str), Some("zone-a"));
    }

    async fn n5_node_ip_not_among_cloud_addresses_keeps_the_node_tainted_until_fixed(backend) {
        let env = Env::started(backend, options(), fake_with(&[("n", metadata("n", vec![addr("InternalIP", "10.0.0.1")]))])).await;
        env.create(with_node_ip(kubelet_node("n").with_hostname(), "10.0.0.99")).await;
        eventually_within("two metadata lookups", WAIT, || async { env.metadata_calls() >= 2 }).await;
        assert!(tainted(&env.get("n").await), "an invalid node IP blocks untainting");
        assert!(env.writes_by(node::NAME, Some("n")).is_empty());
        // Fixing the annotation is a real change: retried at once, not after the backoff.
        let fix = json!({"metadata": {"annotations": {ANNOTATION_PROVIDED_NODE_IP: "10.0.0.1"}}});
        env.nodes.patch("n", &PatchParams::default(), &Patch::Merge(fix)).await.expect("patch");
        let node = env.wait_initialized("n").await;
        assert_eq!(addresses(&node), vec![addr("InternalIP", "10.0.0.1"), addr("Hostname", "n")]);
    }

    async fn n6_n7_n8_instance_type_zone_and_region_labels_with_beta_copies(backend) {
        let env = Env::started(backend, options(), fake_with(&[("n", metadata("n", vec![addr("InternalIP", "10.0.0.1")]))])).await;
        let mut n = kubelet_node("n").with_hostname();
        n.metadata.labels.as_mut().unwrap().insert(LABEL_INSTANCE_TYPE.into(), "stale".into());
        env.create(n).await;
        let node = env.wait_initialized("n").await;
        let l = labels(&node);
        for (k, v) in [
            (LABEL_INSTANCE_TYPE, "fake.large"),
            (LABEL_INSTANCE_TYPE_BETA, "fake.large"),
            (LABEL_ZONE, "zone-a"),
            (LABEL_ZONE_BETA, "zone-a"),
            (LABEL_REGION, "region-1"),
            (LABEL_REGION_BETA, "region-1"),
            ("kubernetes.io/hostname", "n"),
        ] {
            assert_eq!(l.get(k).map(String::as_str), Some(v), "{k}");
        }
    }

    async fn n9_only_the_uninitialized_taint_is_removed(backend) {
        let env = Env::started(backend, options(), fake_with(&[("n", metadata("n", vec![addr("InternalIP", "10.0.0.1")]))])).await;
        let mut n = kubelet_node("n").with_hostname();
        let other =
            Taint { key: "dedicated".into(), value: Some("gpu".into()), effect: "NoSchedule".into(), time_added: None };
        let also_uninit = Taint { effect: "NoExecute".into(), value: None, ..uninitialized_taint() };
        n.spec.as_mut().unwrap().taints = Some(vec![other.clone(), uninitialized_taint(), also_uninit]);
        env.create(n).await;
        let node = env.wait_initialized("n").await;
        let mut expected = vec![other];
        if env.cluster.is_genuine() {
            // kube-apiserver's TaintNodesByCondition admission taints every new Node not-ready.
            expected.push(not_ready_taint());
        }
        assert_eq!(node.spec.unwrap().taints.unwrap(), expected, "matched by key only; other taints kept");
    }

    async fn n9_taint_list_changed_between_read_and_write_is_kept(backend) {
        let fake = fake_with(&[("n", metadata("n", vec![addr("InternalIP", "10.0.0.1")]))]);
        fake.set_latency(Duration::from_millis(400));
        let env = Env::started(backend, options(), fake).await;
        env.create(kubelet_node("n").with_hostname()).await;
        eventually_within("a cloud call in flight", WAIT, || async { env.fake.calls().in_flight() > 0 }).await;
        // Another controller puts a taint in front of ours while the cloud call is running.
        let maintenance = json!({"key": "example.com/maintenance", "effect": "NoSchedule"});
        let ops = json!([{"op": "add", "path": "/spec/taints/0", "value": maintenance}]);
        let patch: Patch<()> = Patch::Json(serde_json::from_value(ops).unwrap());
        env.nodes
            .patch("n", &PatchParams { field_manager: Some("kcm".into()), ..Default::default() }, &patch)
            .await
            .expect("patch");
        let node = env.wait_initialized("n").await;
        let keys: Vec<String> = node.spec.unwrap().taints.unwrap().into_iter().map(|t| t.key).collect();
        let mut expected = vec!["example.com/maintenance".to_string()];
        if env.cluster.is_genuine() {
            // Added by kube-apiserver's admission at create, kept like any other taint.
            expected.push(not_ready_taint().key);
        }
        assert_eq!(keys, expected);
        let writes = env.writes_by(node::NAME, Some("n"));
        assert!(writes.iter().any(|w| w.status == 422), "the stale patch was rejected by its guard: {writes:?}");
    }

    async fn n10_additional_labels_are_filtered(backend) {
        let mut meta = metadata("n", vec![addr("InternalIP", "10.0.0.1")]);
        meta.additional_labels = BTreeMap::from([
            ("kubernetes.io/arch".to_string(), "cloud".to_string()),
            ("node.kubernetes.io/custom".to_string(), "cloud".to_string()),
            ("sub.k8s.io/x".to_string(), "cloud".to_string()),
            ("example.com/pool".to_string(), "blue".to_string()),
            ("team".to_string(), "cloud".to_string()),
        ]);
        let env = Env::started(backend, options(), fake_with(&[("n", meta)])).await;
        let mut n = kubelet_node("n").with_hostname();
        n.metadata.labels.as_mut().unwrap().insert("team".into(), "kubelet".into());
        n.metadata.labels.as_mut().unwrap().insert("kubernetes.io/arch".into(), "amd64".into());
        env.create(n).await;
        let l = labels(&env.wait_initialized("n").await);
        assert_eq!(l.get("example.com/pool").map(String::as_str), Some("blue"), "a new key is added");
        assert_eq!(l.get("team").map(String::as_str), Some("kubelet"), "an existing key is kept");
        assert_eq!(l.get("kubernetes.io/arch").map(String::as_str), Some("amd64"), "reserved keys are discarded");
        assert!(!l.contains_key("node.kubernetes.io/custom") && !l.contains_key("sub.k8s.io/x"));
    }

    async fn n11_initialization_costs_two_targeted_writes_and_emits_synced(backend) {
        let env = Env::started(backend, options(), fake_with(&[("n", metadata("n", vec![addr("InternalIP", "10.0.0.1")]))])).await;
        env.create(kubelet_node("n").with_hostname()).await;
        env.wait_initialized("n").await;
        eventually_within("n's two addresses", WAIT, || async {
            env.get("n").await.status.and_then(|s| s.addresses).map(|a| a.len()) == Some(2)
        })
        .await;
        // A server logs a request after its change is visible, so the log may trail the reads.
        eventually_within("n's two writes in the request log", WAIT, || async {
            env.writes_by(node::NAME, Some("n")).len() >= 2
        })
        .await;
        let writes = env.writes_by(node::NAME, Some("n"));
        assert_eq!(writes.len(), 2, "one status patch and one metadata patch: {writes:?}");
        assert!(writes.iter().all(|w| w.verb == "patch"), "patches only, never a PUT: {writes:?}");
        let status = writes.iter().filter(|w| w.subresource.as_deref() == Some("status")).count();
        assert_eq!(status, 1);
        if !env.cluster.is_genuine() {
            // The audit log records no Content-Type; on genuine the guarded JSON patch shows in
            // n9_taint_list_changed_between_read_and_write_is_kept (its test op answers 422).
            assert!(writes.iter().any(|w| w.content_type.as_deref() == Some("application/json-patch+json")));
        }
        // Metrics and the Synced event. The controller records the delays once the server has
        // answered its writes, which may be after the server logged them.
        let counted = |text: &str| {
            let line = |l: &str| text.lines().any(|x| x == l);
            line("node_controller_cloud_provider_taint_removal_delay_seconds_count 1")
                && line("node_controller_initial_node_sync_delay_seconds_count 1")
        };
        let text = testkit::poll_within(WAIT, || async {
            let text = env.ctx.metrics.encode();
            counted(&text).then_some(text)
        })
        .await
        .unwrap_or_else(|| env.ctx.metrics.encode());
        assert!(counted(&text), "both delays observed once: {text}");
        eventually_within("the Synced event of n", WAIT, || async {
            let synced = env.cluster.events("Synced").await.ok()?;
            synced.iter().any(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("n")).then_some(())
        })
        .await;
        // Nothing more happens once initialized.
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(env.writes_by(node::NAME, Some("n")).len(), 2);
        assert_eq!(env.metadata_calls(), 1);
    }

    async fn n11_kubelet_status_update_between_read_and_write_is_not_lost(backend) {
        let fake = fake_with(&[("n", metadata("n", vec![addr("InternalIP", "10.0.0.1")]))]);
        fake.set_latency(Duration::from_millis(400));
        let env = Env::started(backend, options(), fake).await;
        env.create(kubelet_node("n").with_hostname()).await;
        // The controller has read the Node and is waiting on the cloud: kubelet writes now.
        eventually_within("a cloud call in flight", WAIT, || async { env.fake.calls().in_flight() > 0 }).await;
        let ready = NodeCondition {
            type_: "Ready".into(),
            status: "True".into(),
            reason: Some("KubeletReady".into()),
            ..Default::default()
        };
        let status = json!({"status": {"conditions": [ready]}});
        let kubelet = PatchParams { field_manager: Some("kubelet".into()), ..Default::default() };
        env.nodes.patch_status("n", &kubelet, &Patch::Strategic(status)).await.expect("kubelet status patch");
        let label = json!({"metadata": {"labels": {"kubelet-added": "yes"}}});
        env.nodes.patch("n", &kubelet, &Patch::Strategic(label)).await.expect("kubelet label patch");
        env.wait_initialized("n").await;
        let node = eventually_within("n's two addresses", WAIT, || async { Some(env.get("n").await).filter(|n| addresses(n).len() == 2) }).await;
        let conditions = node.status.as_ref().and_then(|s| s.conditions.clone()).unwrap_or_default();
        assert!(
            conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True"),
            "kubelet's condition survives: {conditions:?}"
        );
        assert_eq!(labels(&node).get("kubelet-added").map(String::as_str), Some("yes"), "kubelet's label survives");
        assert_eq!(labels(&node).get(LABEL_ZONE).map(String::as_str), Some("zone-a"));
        assert_eq!(addresses(&node), vec![addr("InternalIP", "10.0.0.1"), addr("Hostname", "n")]);
    }

    async fn n12_label_reconciliation_makes_no_cloud_call(backend) {
        let env = Env::started(backend, options(), FakeProvider::new()).await;
        // Wait for the start-up refresh pass (over an empty cluster) to be done.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut n = kubelet_node("old").with_hostname();
        n.spec.as_mut().unwrap().taints = None;
        n.metadata.labels.as_mut().unwrap().extend([
            (LABEL_ZONE_BETA.to_string(), "z1".to_string()),
            (LABEL_INSTANCE_TYPE_BETA.to_string(), "t1".to_string()),
            (LABEL_REGION.to_string(), "ga-only".to_string()),
        ]);
        env.create(n).await;
        let node = eventually_within("old's zone label", WAIT, || async { Some(env.get("old").await).filter(|n| labels(n).contains_key(LABEL_ZONE)) }).await;
        let l = labels(&node);
        assert_eq!(l.get(LABEL_ZONE).map(String::as_str), Some("z1"));
        assert_eq!(l.get(LABEL_INSTANCE_TYPE).map(String::as_str), Some("t1"));
        assert_eq!(l.get(LABEL_REGION).map(String::as_str), Some("ga-only"), "no beta region: GA left alone");
        assert_eq!(env.fake.calls().total(), 0, "no cloud call");
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(env.writes_by(node::NAME, Some("old")).len(), 1, "one merge patch, and no loop on our own write");
    }

    async fn n13_periodic_refresh_skips_tainted_nodes(backend) {
        let no_id = InstanceMetadata { provider_id: String::new(), ..metadata("t", vec![addr("InternalIP", "10.0.0.5")]) };
        let opts = ControllerOptions { node_status_update_frequency: Duration::from_millis(100), ..options() };
        let env = Env::started(backend, opts, fake_with(&[("t", no_id)])).await;
        env.create(kubelet_node("t").with_hostname()).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let node = env.get("t").await;
        assert!(tainted(&node));
        assert_eq!(addresses(&node), vec![addr("Hostname", "t")], "the refresh never wrote a tainted Node's addresses");
        assert!(env.writes_by(node::NAME, Some("t")).is_empty());
    }

    async fn n14_no_cloud_addresses_leaves_addresses_alone(backend) {
        let env = Env::started(backend, options(), fake_with(&[("n", metadata("n", vec![]))])).await;
        env.create(kubelet_node("n").with_hostname()).await;
        let node = env.wait_initialized("n").await;
        assert_eq!(addresses(&node), vec![addr("Hostname", "n")]);
        // The watch may show the initialized Node before the request log has the write (CI).
        eventually_within("the initializing write recorded", WAIT, || async {
            !env.writes_by(node::NAME, Some("n")).is_empty()
        })
        .await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let writes = env.writes_by(node::NAME, Some("n"));
        assert_eq!(writes.len(), 1, "the initialization only, no status write: {writes:?}");
    }

    async fn n15_kubelet_hostname_is_kept_when_the_cloud_reports_none(backend) {
        let cloud = vec![addr("InternalIP", "10.0.0.1"), addr("ExternalIP", "1.2.3.4")];
        let with_host = vec![addr("InternalIP", "10.0.0.2"), addr("Hostname", "cloud-host")];
        let env = Env::started(backend,
            options(),
            fake_with(&[("a", metadata("a", cloud.clone())), ("b", metadata("b", with_host.clone()))]),
        )
        .await;
        env.create(kubelet_node("a").with_hostname()).await;
        env.create(kubelet_node("b").with_hostname()).await;
        let a = eventually_within("a's three addresses", WAIT, || async { Some(env.get("a").await).filter(|n| addresses(n).len() == 3) }).await;
        assert_eq!(addresses(&a), vec![cloud[0].clone(), cloud[1].clone(), addr("Hostname", "a")]);
        // Addresses (status) and the taint (metadata) are two writes: wait for both.
        let b = eventually_within("b's addresses with the cloud's host name, untainted", WAIT, || async { Some(env.get("b").await).filter(|n| addresses(n) == with_host && !tainted(n)) }).await;
        assert_eq!(addresses(&b), with_host, "the cloud's hostname replaces the kubelet's");
    }

    async fn n16_dual_stack_node_ip_table(backend) {
        let cloud = vec![
            addr("InternalIP", "10.0.0.1"),
            addr("InternalIP", "10.0.0.2"),
            addr("InternalIP", "fd00::1"),
            addr("InternalIP", "fd00::2"),
            addr("ExternalIP", "1.2.3.4"),
        ];
        // (node, annotation, expected addresses); the Hostname comes from kubelet (N15).
        let table: Vec<(&str, &str, Vec<NodeAddress>)> = vec![
            (
                "worked-example",
                "10.0.0.2",
                vec![addr("InternalIP", "10.0.0.2"), addr("ExternalIP", "1.2.3.4"), addr("Hostname", "worked-example")],
            ),
            (
                "v4-v6",
                "10.0.0.2,fd00::1",
                vec![
                    addr("InternalIP", "10.0.0.2"),
                    addr("InternalIP", "fd00::1"),
                    addr("ExternalIP", "1.2.3.4"),
                    addr("Hostname", "v4-v6"),
                ],
            ),
            (
                "v6-v4",
                "fd00::2,10.0.0.1",
                vec![
                    addr("InternalIP", "fd00::2"),
                    addr("InternalIP", "10.0.0.1"),
                    addr("ExternalIP", "1.2.3.4"),
                    addr("Hostname", "v6-v4"),
                ],
            ),
            (
                "internal-external",
                "10.0.0.1,fd00::9",
                vec![], // fd00::9 is not a cloud address: stays tainted
            ),
            (
                "no-annotation",
                "",
                vec![
                    addr("InternalIP", "10.0.0.1"),
                    addr("InternalIP", "10.0.0.2"),
                    addr("InternalIP", "fd00::1"),
                    addr("InternalIP", "fd00::2"),
                    addr("ExternalIP", "1.2.3.4"),
                    addr("Hostname", "no-annotation"),
                ],
            ),
        ];
        let instances: Vec<(&str, InstanceMetadata)> =
            table.iter().map(|(n, _, _)| (*n, metadata(n, cloud.clone()))).collect();
        let env = Env::started(backend, options(), fake_with(&instances)).await;
        for (name, annotation, _) in &table {
            let node = kubelet_node(name).with_hostname();
            env.create(if annotation.is_empty() { node } else { with_node_ip(node, annotation) }).await;
        }
        for (name, annotation, want) in &table {
            if want.is_empty() {
                continue;
            }
            let node =
                eventually_within("the Node initialized with the addresses wanted", WAIT, || async { Some(env.get(name).await).filter(|n| !tainted(n) && addresses(n) == *want) }).await;
            assert_eq!(addresses(&node), *want, "{name} {annotation}");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            tainted(&env.get("internal-external").await),
            "an annotated IP missing from the cloud blocks initialization"
        );
    }

    async fn n17_refresh_writes_only_real_changes_including_same_type_and_reordering(backend) {
        // §6 item 2: upstream re-patches dual-stack Nodes every period and misses reordering.
        let dual = vec![addr("InternalIP", "10.0.0.1"), addr("InternalIP", "fd00::1")];
        let opts = ControllerOptions { node_status_update_frequency: Duration::from_millis(150), ..options() };
        let env = Env::started(backend, opts, fake_with(&[("d", metadata("d", dual.clone()))])).await;
        env.create(kubelet_node("d").with_hostname()).await;
        env.wait_initialized("d").await;
        let status_writes =
            || env.writes_by(node::NAME, Some("d")).iter().filter(|w| w.subresource.as_deref() == Some("status")).count();
        eventually_within("one status write", WAIT, || async { status_writes() == 1 }).await;
        let passes_before = env.metadata_calls();
        tokio::time::sleep(Duration::from_millis(1200)).await;
        assert!(env.metadata_calls() >= passes_before + 3, "the refresh ran several times");
        assert_eq!(status_writes(), 1, "unchanged dual-stack addresses are not re-written");
        // The cloud swaps the order of the two InternalIPs: that is a change.
        let swapped = vec![dual[1].clone(), dual[0].clone()];
        env.fake.set_instance("d", FakeInstance::running(metadata("d", swapped.clone())));
        let node =
            eventually_within("the swapped addresses", WAIT, || async { Some(env.get("d").await).filter(|n| addresses(n).first() == swapped.first()) }).await;
        assert_eq!(addresses(&node), vec![swapped[0].clone(), swapped[1].clone(), addr("Hostname", "d")]);
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert_eq!(status_writes(), 2, "exactly one more write for the reordering");
    }

    async fn n18_periodic_refresh_updates_only_addresses_in_batches_with_concurrent_workers(backend) {
        let names: Vec<String> = (0..40).map(|i| format!("r{i:02}")).collect();
        let instances: Vec<(&str, InstanceMetadata)> =
            names.iter().map(|n| (n.as_str(), metadata(n, vec![addr("InternalIP", "10.0.1.1")]))).collect();
        let fake = fake_with(&instances);
        fake.set_batch_size(10);
        let opts = ControllerOptions {
            node_status_update_frequency: Duration::from_secs(2),
            concurrent_node_status_updates: 4,
            ..options()
        };
        let env = Env::started(backend, opts, fake).await;
        for n in &names {
            env.create(kubelet_node(n).with_hostname()).await;
        }
        for n in &names {
            env.wait_initialized(n).await;
        }
        // New addresses and a new zone in the cloud; only the addresses may follow.
        env.fake.set_latency(Duration::from_millis(300));
        for n in &names {
            let mut meta = metadata(n, vec![addr("InternalIP", "10.0.2.2")]);
            meta.zone = "zone-moved".into();
            env.fake.set_instance(n, FakeInstance::running(meta));
        }
        for n in &names {
            eventually_within("the new address", WAIT, || async { Some(env.get(n).await).filter(|node| addresses(node)[0].address == "10.0.2.2") }).await;
        }
        // Watch one whole pass from the start: four batches of ten, all four workers busy at once.
        env.fake.calls().reset();
        eventually_within("four batches in flight at once", WAIT, || async { env.fake.calls().peak_in_flight() == 4 && env.metadata_calls() >= 4 }).await;
        let subjects = env.fake.calls().subjects(methods::INSTANCES_METADATA);
        assert!(subjects.iter().all(|s| s == "10 nodes"), "40 Nodes in batches of 10: {subjects:?}");
        for n in &names {
            assert_eq!(labels(&env.get(n).await).get(LABEL_ZONE).map(String::as_str), Some("zone-a"), "labels untouched");
        }
    }

    async fn a_new_node_on_an_idle_controller_is_looked_up_alone_and_nodes_arriving_meanwhile_share_a_call(backend) {
        let fake = FakeProvider::new();
        fake.set_auto_instances(true);
        // Each lookup takes 2 s: the Nodes created meanwhile queue behind the first one's.
        fake.set_latency(Duration::from_secs(2));
        let opts = ControllerOptions { node_batch_window: Duration::from_millis(1500), ..options() };
        let env = Env::started(backend, opts, fake).await;
        let names: Vec<String> = (0..50).map(|i| format!("b{i:02}")).collect();
        env.create(kubelet_node(&names[0]).with_hostname()).await;
        eventually_within("the first Node's lookup", WAIT, || async { env.metadata_calls() == 1 }).await;
        for n in &names[1..] {
            env.create(kubelet_node(n).with_hostname()).await;
        }
        for n in &names {
            env.wait_initialized(n).await;
        }
        let subjects = env.fake.calls().subjects(methods::INSTANCES_METADATA);
        assert_eq!(subjects.first().map(String::as_str), Some("1 nodes"), "the idle controller did not wait for others: {subjects:?}");
        assert!(env.metadata_calls() <= 3, "the other 49 in at most two lookups: {subjects:?}");
        assert_eq!(env.fake.calls().count(methods::INSTANCE_METADATA), 0, "no single lookups");
    }

    async fn batch_size_one_and_one_worker_reproduce_upstream_one_call_per_node(backend) {
        let fake = FakeProvider::new();
        fake.set_auto_instances(true);
        let opts = ControllerOptions { node_batch_size: 1, concurrent_node_syncs: 1, ..options() };
        let env = Env::started(backend, opts, fake).await;
        for i in 0..5 {
            env.create(kubelet_node(&format!("u{i}")).with_hostname()).await;
        }
        for i in 0..5 {
            env.wait_initialized(&format!("u{i}")).await;
        }
        assert_eq!(env.metadata_calls(), 5);
        assert_eq!(env.fake.calls().peak_in_flight(), 1);
    }

    async fn concurrency_below_one_is_rejected_at_start(backend) {
        // §6 item 7: upstream accepts --concurrent-node-syncs=0 and never initializes anything.
        let env = Env::start(backend, ControllerOptions { concurrent_node_syncs: 0, ..options() }, FakeProvider::new()).await;
        let result = env.run(Box::new(NodeController::new())).await.expect("task");
        assert!(matches!(result, Err(ccm_framework::Error::InvalidFlag { flag: "--concurrent-node-syncs", .. })), "{result:?}");
    }

    async fn idle_cluster_costs_no_writes_and_only_the_periodic_refresh(backend) {
        let fake = FakeProvider::new();
        fake.set_auto_instances(true);
        let opts = ControllerOptions {
            node_status_update_frequency: Duration::from_secs(2),
            node_monitor_period: Duration::from_millis(200),
            ..options()
        };
        let env = Env::start(backend, opts, fake).await;
        env.run(Box::new(NodeController::new()));
        env.run(Box::new(LifecycleController::new()));
        let names: Vec<String> = (0..20).map(|i| format!("idle{i:02}")).collect();
        for n in &names {
            env.create(kubelet_node(n).with_hostname()).await;
        }
        let ready = json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}});
        for n in &names {
            env.wait_initialized(n).await;
            env.nodes.patch_status(n, &PatchParams::default(), &Patch::Strategic(ready.clone())).await.expect("ready");
        }
        // Let initialization writes, the lifecycle checks of not-yet-Ready Nodes and events settle.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let mark = env.cluster.request_log().mark();
        env.fake.calls().reset();
        let window = Duration::from_secs(10);
        tokio::time::sleep(window).await;
        // kube-apiserver's own upkeep (its identity Lease, the `kubernetes` endpoints) is not ours.
        let writes: Vec<RequestRecord> = env
            .cluster
            .request_log()
            .since(mark)
            .into_iter()
            .filter(|r| r.is_write() && r.user.as_deref() != Some("system:apiserver"))
            .collect();
        assert!(writes.is_empty(), "no API writes while nothing changes: {writes:?}");
        let counts = env.fake.calls().counts();
        let refresh_passes = env.metadata_calls();
        assert!((4..=6).contains(&refresh_passes), "one lookup per 2 s refresh pass over 10 s: {counts:?}");
        assert_eq!(env.fake.calls().total(), refresh_passes, "no other cloud call: {counts:?}");
    }
}
