//! service-lb-controller against both API server backends and the fake provider: one test per
//! upstream behaviour (S1–S24 but S9, which cannot arise here; named after its ID, see
//! docs/behaviours.md), our deliberate fixes and additions, the
//! write budget, the idle cost and the crash test.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ccm_framework::controllers::service::logic::{
    EXCLUDE_FROM_LB_LABEL, LOAD_BALANCER_CLEANUP_FINALIZER, TO_BE_DELETED_TAINT, cleanup_finalizer,
};
use ccm_framework::controllers::service::{FIELD_MANAGER, ServiceController};
use ccm_framework::engine::testing::{RunningController, run_controller};
use ccm_framework::options::ControllerOptions;
use ccm_framework::provider::CloudError;
use ccm_provider_fake::{FakeProvider, methods};
use k8s_openapi::api::core::v1::{Node, NodeSpec, Service, ServiceSpec, Taint};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use testkit::{
    Backend, FaultRule, RequestRecord, ServiceFixture, TestCluster, eventually_within, ingress_ips, lb_service,
};

const WAIT: Duration = Duration::from_secs(20);
const NS: &str = "default";

struct Env {
    cluster: TestCluster,
    fake: Arc<FakeProvider>,
    options: ControllerOptions,
    running: Option<RunningController>,
}

fn options() -> ControllerOptions {
    ControllerOptions { concurrent_service_syncs: 1, ..Default::default() }
}

impl Env {
    async fn new(backend: Backend, options: ControllerOptions) -> Env {
        let cluster = TestCluster::start(backend).await.expect("API server starts");
        Env { cluster, fake: Arc::new(FakeProvider::new()), options, running: None }
    }

    /// An environment whose API server answers through the fault proxy.
    async fn with_faults(backend: Backend, options: ControllerOptions) -> Env {
        let cluster = TestCluster::start_with_faults(backend).await.expect("API server starts");
        let mut env = Env { cluster, fake: Arc::new(FakeProvider::new()), options, running: None };
        env.start().await;
        env
    }

    async fn started(backend: Backend, options: ControllerOptions) -> Env {
        let mut env = Env::new(backend, options).await;
        env.start().await;
        env
    }

    async fn start(&mut self) {
        let running = run_controller(
            self.cluster.client(),
            self.fake.clone(),
            self.options.clone(),
            Box::new(ServiceController::new()),
        )
        .await;
        self.running = Some(running);
    }

    async fn stop(&mut self) {
        if let Some(r) = self.running.take() {
            r.stop().await.expect("controller stops cleanly");
        }
    }

    fn services(&self) -> Api<Service> {
        Api::namespaced(self.cluster.client(), NS)
    }

    fn nodes(&self) -> Api<Node> {
        Api::all(self.cluster.client())
    }

    async fn create_service(&self, svc: Service) -> Service {
        self.services().create(&PostParams::default(), &svc).await.expect("create service")
    }

    async fn get(&self, name: &str) -> Option<Service> {
        self.services().get_opt(name).await.expect("get service")
    }

    /// A user edit (merge patch by `kubectl`).
    async fn edit(&self, name: &str, patch: Value) {
        let pp = PatchParams { field_manager: Some("kubectl".into()), ..Default::default() };
        self.services().patch(name, &pp, &Patch::Merge(patch)).await.expect("edit service");
    }

    /// Create a Node and wait until the running controller's cache holds it, so a Service
    /// created next is ensured with it (otherwise the Node may land mid-ensure and, as S23
    /// requires, cause a second sync).
    async fn create_node(&self, node: Node) {
        let name = node.metadata.name.clone().unwrap_or_default();
        self.nodes().create(&PostParams::default(), &node).await.expect("create node");
        if let Some(r) = &self.running {
            eventually_within("the Node in the controller's cache", WAIT, || async {
                r.context.nodes.get(None, &name).map(|_| ())
            })
            .await;
        }
    }

    async fn edit_node(&self, name: &str, patch: Value) {
        self.nodes().patch(name, &PatchParams::default(), &Patch::Merge(patch)).await.expect("edit node");
    }

    async fn wait_ingress(&self, name: &str) -> Service {
        eventually_within("the Service's ingress", WAIT, || async {
            self.get(name).await.filter(|s| ingress(s).is_some())
        })
        .await
    }

    fn lb_calls(&self) -> usize {
        let c = self.fake.calls();
        c.count(methods::ENSURE_LOAD_BALANCER)
            + c.count(methods::GET_LOAD_BALANCER)
            + c.count(methods::UPDATE_LOAD_BALANCER)
            + c.count(methods::ENSURE_LOAD_BALANCER_DELETED)
    }

    fn ensures(&self) -> usize {
        self.fake.calls().count(methods::ENSURE_LOAD_BALANCER)
    }

    fn updates(&self) -> usize {
        self.fake.calls().count(methods::UPDATE_LOAD_BALANCER)
    }

    fn hosts(&self, name: &str) -> Option<Vec<String>> {
        self.fake.load_balancer_for(NS, name).map(|lb| lb.hosts.to_vec())
    }

    /// Service writes made by the controller.
    fn writes(&self) -> Vec<RequestRecord> {
        self.cluster.request_log().filter(|r| {
            r.is_write()
                && r.resource.as_deref() == Some("services")
                && r.field_manager.as_deref() == Some(FIELD_MANAGER)
        })
    }

    async fn events(&self, reason: &str) -> Vec<Event> {
        self.cluster.events(reason).await.expect("list events")
    }

    async fn wait_event(&self, reason: &str) -> Event {
        eventually_within("an event with the reason", WAIT, || async { self.events(reason).await.into_iter().next() })
            .await
    }

    /// Make sure the controller has handled everything queued before now: with one worker
    /// keys are served in order, so once a fresh sentinel Service has its ingress, every
    /// earlier change has been looked at.
    async fn settle(&self, sentinel: &str) {
        self.create_service(lb_service(NS, sentinel)).await;
        self.wait_ingress(sentinel).await;
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        if let Some(r) = &self.running {
            r.context.shutdown.cancel();
        }
    }
}

fn node(name: &str) -> Node {
    Node {
        metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
        spec: Some(NodeSpec { provider_id: Some(format!("fake://{name}")), ..Default::default() }),
        ..Default::default()
    }
}

fn labelled_node(name: &str, exclude: &str) -> Node {
    let mut n = node(name);
    n.metadata.labels = Some(BTreeMap::from([(EXCLUDE_FROM_LB_LABEL.to_string(), exclude.to_string())]));
    n
}

/// A type change to ClusterIP; the ports are restated without node ports, which the local API
/// server (unlike a real one) does not drop by itself.
fn to_cluster_ip() -> Value {
    json!({"spec": {"type": "ClusterIP", "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]}})
}

fn ingress(s: &Service) -> Option<String> {
    ingress_ips(s).into_iter().next()
}

fn finalizers(s: &Service) -> Vec<String> {
    s.metadata.finalizers.clone().unwrap_or_default()
}

// ---- S3: the update matrix ---------------------------------------------------------------

/// Apply `patch` to a provisioned Service and report whether the controller synced it again.
async fn s3_case(backend: Backend, setup: fn(&mut ServiceSpec), patch: Value) -> bool {
    let env = Env::started(backend, options()).await;
    env.create_node(node("n1")).await;
    let mut svc = lb_service(NS, "web");
    // Fields some cases change need a starting value.
    svc.metadata.annotations = Some(BTreeMap::from([("keep".to_string(), "me".to_string())]));
    setup(svc.spec.as_mut().unwrap());
    env.create_service(svc).await;
    env.wait_ingress("web").await;
    let web_syncs = || {
        let c = env.fake.calls();
        [methods::ENSURE_LOAD_BALANCER, methods::GET_LOAD_BALANCER]
            .iter()
            .flat_map(|m| c.subjects(m))
            .filter(|s| s == "default/web")
            .count()
    };
    let before = web_syncs();
    assert_eq!(before, 1);
    env.edit("web", patch).await;
    env.settle("sentinel").await;
    web_syncs() > before
}

/// A case's starting spec change, none by default.
macro_rules! s3_setup {
    () => {
        |_: &mut ServiceSpec| {}
    };
    ($setup:expr) => {{
        let setup: fn(&mut ServiceSpec) = $setup;
        setup
    }};
}

macro_rules! s3 {
    ($($name:ident: $patch:expr => $triggers:expr $(, from $setup:expr)?;)*) => {$(
        testkit::backend_tests! {
            async fn $name(backend) {
                let setup = s3_setup!($($setup)?);
                assert_eq!(s3_case(backend, setup, $patch).await, $triggers, "{}", stringify!($name));
            }
        }
    )*};
}

s3! {
    s3_type_change_triggers_sync: to_cluster_ip() => true;
    s3_source_ranges_change_triggers_ensure: json!({"spec": {"loadBalancerSourceRanges": ["10.0.0.0/8"]}}) => true;
    s3_port_change_triggers_ensure: json!({"spec": {"ports": [{"name": "http", "port": 81, "targetPort": 8080, "protocol": "TCP"}]}}) => true;
    s3_port_name_change_triggers_ensure: json!({"spec": {"ports": [{"name": "web", "port": 80, "targetPort": 8080, "protocol": "TCP"}]}}) => true;
    s3_port_protocol_change_triggers_ensure: json!({"spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "UDP"}]}}) => true;
    s3_node_port_change_triggers_ensure: json!({"spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP", "nodePort": 32123}]}}) => true;
    s3_target_port_change_triggers_ensure: json!({"spec": {"ports": [{"name": "http", "port": 80, "targetPort": 9090, "protocol": "TCP"}]}}) => true;
    s3_app_protocol_change_triggers_ensure: json!({"spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP", "appProtocol": "http"}]}}) => true;
    s3_session_affinity_change_triggers_ensure: json!({"spec": {"sessionAffinity": "ClientIP"}}) => true;
    // The API server drops sessionAffinityConfig unless sessionAffinity is ClientIP.
    s3_session_affinity_config_change_triggers_ensure: json!({"spec": {"sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 60}}}}) => true,
        from |s| s.session_affinity = Some("ClientIP".into());
    s3_load_balancer_ip_change_triggers_ensure: json!({"spec": {"loadBalancerIP": "198.18.9.9"}}) => true;
    s3_external_ips_change_triggers_ensure: json!({"spec": {"externalIPs": ["192.0.2.10"]}}) => true;
    s3_annotation_change_triggers_ensure: json!({"metadata": {"annotations": {"lb.example/size": "large"}}}) => true;
    s3_annotation_removal_triggers_ensure: json!({"metadata": {"annotations": {"keep": null}}}) => true;
    s22_external_traffic_policy_change_triggers_ensure: json!({"spec": {"externalTrafficPolicy": "Local"}}) => true;
    s3_ip_families_count_change_triggers_ensure: json!({"spec": {"ipFamilies": ["IPv4", "IPv6"], "ipFamilyPolicy": "PreferDualStack"}}) => true;
    s3_label_change_does_not_trigger: json!({"metadata": {"labels": {"team": "web"}}}) => false;
    s3_selector_change_does_not_trigger: json!({"spec": {"selector": {"app": "other"}}}) => false;
    s3_foreign_finalizer_does_not_trigger: json!({"metadata": {"finalizers": [LOAD_BALANCER_CLEANUP_FINALIZER, "example.com/hold"]}}) => false;
    s3_internal_traffic_policy_change_does_not_trigger: json!({"spec": {"internalTrafficPolicy": "Local"}}) => false;
    // From PreferDualStack to RequireDualStack the families stay (on a dual-stack cluster
    // SingleStack to PreferDualStack would add one, which does count).
    s3_ip_family_policy_change_does_not_trigger: json!({"spec": {"ipFamilyPolicy": "RequireDualStack"}}) => false,
        from |s| s.ip_family_policy = Some("PreferDualStack".into());
}

/// Local backend only: kube-apiserver makes healthCheckNodePort immutable, so on a real cluster
/// it never changes alone (the comparison itself is unit-tested in `logic.rs`).
#[tokio::test]
async fn s22_health_check_node_port_change_triggers_ensure() {
    let setup: fn(&mut ServiceSpec) = |s| s.external_traffic_policy = Some("Local".into());
    let patch = json!({"spec": {"healthCheckNodePort": 32200}});
    assert!(s3_case(Backend::Local, setup, patch).await);
}

testkit::backend_tests! {
    async fn s3_foreign_status_write_does_not_trigger(backend) {
        let env = Env::started(backend, options()).await;
        env.create_service(lb_service(NS, "web")).await;
        env.wait_ingress("web").await;
        let before = env.ensures();
        let pp = PatchParams { field_manager: Some("someone-else".into()), ..Default::default() };
        let patch = json!({"status": {"conditions": [{"type": "Probe", "status": "True", "reason": "Ok", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}});
        env.services().patch_status("web", &pp, &Patch::Merge(patch)).await.expect("status patch");
        env.settle("sentinel").await;
        assert_eq!(env.ensures(), before + 1, "only the sentinel was ensured");
    }
}

// ---- S7/S11/S13: finalizer ordering and restarts -------------------------------------------

testkit::backend_tests! {
    async fn s7_finalizer_is_added_before_ensure(backend) {
        let env = Env::started(backend, options()).await;
        env.fake.set_load_balancer_latency(Duration::from_millis(500));
        env.create_service(lb_service(NS, "web")).await;
        // While the first ensure is in flight (recorded as it starts, then 500 ms in the cloud),
        // the finalizer is already stored. (Other cloud calls, the orphan scan's, may be in
        // flight too, so the ensure itself is waited for.)
        eventually_within("an ensure in flight", WAIT, || async { (env.ensures() >= 1).then_some(()) }).await;
        let svc = env.get("web").await.unwrap();
        assert_eq!(finalizers(&svc), [LOAD_BALANCER_CLEANUP_FINALIZER]);
        assert!(ingress(&svc).is_none());
        let svc = env.wait_ingress("web").await;
        let lb = env.fake.load_balancer_for(NS, "web").expect("load balancer exists");
        let lb_ip = lb.status.ingress.and_then(|i| i.first().and_then(|i| i.ip.clone()));
        assert_eq!(ingress(&svc), lb_ip);
        env.wait_event("EnsuringLoadBalancer").await;
        env.wait_event("EnsuredLoadBalancer").await;
    }

    async fn s29_syncs_write_to_the_api_while_another_holds_the_only_cloud_slot_and_never_two_calls_at_once(backend) {
        // One slot (`options()`) and a slow cloud: while the first ensure holds the slot, the
        // other syncs already wrote their finalizers. Before S29 one worker held the slot
        // through its writes, so no second finalizer came before the first load balancer.
        let env = Env::started(backend, options()).await;
        env.fake.set_load_balancer_latency(Duration::from_secs(2));
        let names: Vec<String> = (0..4).map(|i| format!("web-{i}")).collect();
        for name in &names {
            env.create_service(lb_service(NS, name)).await;
        }
        eventually_within("every Service finalized", WAIT, || async {
            let mut finalized = 0;
            for name in &names {
                if env.get(name).await.is_some_and(|svc| finalizers(&svc) == [LOAD_BALANCER_CLEANUP_FINALIZER]) {
                    finalized += 1;
                }
            }
            finalized == names.len()
        })
        .await;
        assert!(
            names.iter().all(|n| env.fake.load_balancer_for(NS, n).is_none()),
            "every finalizer was written before the first load balancer existed"
        );
        env.fake.set_load_balancer_latency(Duration::ZERO);
        for name in &names {
            env.wait_ingress(name).await;
        }
        assert_eq!(env.fake.calls().peak_in_flight(), 1, "never more provider calls than slots");
    }

    async fn s11_finalizer_removed_only_after_load_balancer_deleted(backend) {
        let env = Env::started(backend, options()).await;
        env.create_service(lb_service(NS, "web")).await;
        env.wait_ingress("web").await;
        env.fake.fail_next(methods::ENSURE_LOAD_BALANCER_DELETED, 1, CloudError::Unavailable("cloud down".into()));
        env.services().delete("web", &DeleteParams::default()).await.expect("delete");
        // The failed deletion leaves both the Service (held by the finalizer) and the LB.
        env.wait_event("SyncLoadBalancerFailed").await;
        let held = env.get("web").await.expect("held by the finalizer");
        assert!(held.metadata.deletion_timestamp.is_some());
        assert!(env.fake.load_balancer_for(NS, "web").is_some());
        // The retry (5 s backoff) deletes the LB, then the Service goes.
        eventually_within("web deleted", WAIT, || async {
            let gone = env.get("web").await.is_none();
            if gone {
                assert!(env.fake.load_balancer_for(NS, "web").is_none(), "Service released before its LB was deleted");
            }
            gone
        })
        .await;
        env.wait_event("DeletingLoadBalancer").await;
        env.wait_event("DeletedLoadBalancer").await;
    }

    async fn s13_type_change_while_stopped_is_cleaned_up_on_start(backend) {
        let mut env = Env::started(backend, options()).await;
        env.create_service(lb_service(NS, "web")).await;
        env.wait_ingress("web").await;
        env.stop().await;
        env.edit("web", to_cluster_ip()).await;
        env.start().await;
        let svc = eventually_within("web without finalizers", WAIT, || async { env.get("web").await.filter(|s| finalizers(s).is_empty()) }).await;
        assert!(env.fake.load_balancer_for(NS, "web").is_none());
        assert!(ingress(&svc).is_none(), "the stale ingress is cleared");
    }

    async fn s13_deletion_while_stopped_is_cleaned_up_on_start(backend) {
        let mut env = Env::started(backend, options()).await;
        env.create_service(lb_service(NS, "web")).await;
        env.wait_ingress("web").await;
        env.stop().await;
        env.services().delete("web", &DeleteParams::default()).await.expect("delete");
        assert!(env.get("web").await.is_some(), "KEP-992: the finalizer holds the Service");
        env.start().await;
        eventually_within("web deleted", WAIT, || async { env.get("web").await.is_none() }).await;
        assert!(env.fake.load_balancers().is_empty());
    }

    async fn s14_service_deleted_without_finalizer_still_loses_its_load_balancer(backend) {
        let env = Env::started(backend, options()).await;
        env.create_service(lb_service(NS, "web")).await;
        env.wait_ingress("web").await;
        // Someone strips the finalizer, then deletes: the Service vanishes at once.
        env.edit("web", json!({"metadata": {"finalizers": null}})).await;
        env.services().delete("web", &DeleteParams::default()).await.expect("delete");
        eventually_within("web's load balancer deleted", WAIT, || async { env.fake.load_balancer_for(NS, "web").is_none() }).await;
    }

    async fn finalizer_never_added_to_a_service_being_deleted(backend) {
        let mut env = Env::new(backend, options()).await;
        let mut svc = lb_service(NS, "web");
        svc.metadata.finalizers = Some(vec!["example.com/hold".into()]);
        env.create_service(svc).await;
        env.services().delete("web", &DeleteParams::default()).await.expect("delete");
        env.start().await;
        env.settle("sentinel").await;
        let svc = env.get("web").await.expect("held by the foreign finalizer");
        assert_eq!(finalizers(&svc), ["example.com/hold"]);
        assert!(!env.fake.calls().subjects(methods::ENSURE_LOAD_BALANCER).contains(&"default/web".to_string()));
        let failed = env.cluster.request_log().count(|r| r.name.as_deref() == Some("web") && r.status >= 400);
        assert_eq!(failed, 0, "§6 item 9: no rejected finalizer patch");
    }
}

// ---- S8/S9/S10/S12: results of ensure ------------------------------------------------------

testkit::backend_tests! {
    async fn s8_implemented_elsewhere_keeps_finalizer_and_writes_no_status(backend) {
        let env = Env::started(backend, options()).await;
        env.fake.fail_rate(methods::ENSURE_LOAD_BALANCER, 1.0, CloudError::ImplementedElsewhere);
        env.create_service(lb_service(NS, "web")).await;
        env.settle_after_failure("sentinel").await;
        let svc = env.get("web").await.unwrap();
        assert_eq!(finalizers(&svc), [LOAD_BALANCER_CLEANUP_FINALIZER]);
        assert!(ingress(&svc).is_none());
        let status_writes = env.writes().into_iter().filter(|r| r.subresource.as_deref() == Some("status")).count();
        assert_eq!(status_writes, 0);
        assert!(env.events("SyncLoadBalancerFailed").await.is_empty());
        assert_eq!(env.ensures(), 2, "no retry: the sync counted as a success");
    }
}

impl Env {
    /// [`Env::settle`] when ensures fail for every Service: wait until the sentinel's ensure
    /// has been attempted.
    async fn settle_after_failure(&self, sentinel: &str) {
        self.create_service(lb_service(NS, sentinel)).await;
        let subject = format!("{NS}/{sentinel}");
        eventually_within("the sentinel ensured", WAIT, || async {
            self.fake.calls().subjects(methods::ENSURE_LOAD_BALANCER).contains(&subject)
        })
        .await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

testkit::backend_tests! {
    async fn s10_status_written_once_and_only_when_ingress_changes(backend) {
        let env = Env::started(backend, options()).await;
        env.create_service(lb_service(NS, "web")).await;
        env.wait_ingress("web").await;
        // A change that re-ensures but yields the same ingress writes nothing.
        env.edit("web", json!({"spec": {"sessionAffinity": "ClientIP"}})).await;
        env.settle("sentinel").await;
        assert_eq!(
            env.fake.calls().subjects(methods::ENSURE_LOAD_BALANCER).iter().filter(|s| *s == "default/web").count(),
            2
        );
        let web_status: Vec<_> = env
            .writes()
            .into_iter()
            .filter(|r| r.name.as_deref() == Some("web") && r.subresource.as_deref() == Some("status"))
            .collect();
        assert_eq!(web_status.len(), 1, "{web_status:?}");
    }

    async fn s12_retry_after_requeues_at_the_requested_delay(backend) {
        let env = Env::started(backend, options()).await;
        env.fake.fail_next(
            methods::ENSURE_LOAD_BALANCER,
            1,
            CloudError::retry_after(Duration::from_millis(300), "creating"),
        );
        let started = Instant::now();
        env.create_service(lb_service(NS, "web")).await;
        env.wait_ingress("web").await;
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(300), "retried before the requested delay: {took:?}");
        assert!(took < Duration::from_secs(4), "retried with backoff instead of the requested delay: {took:?}");
        let failed = env.wait_event("SyncLoadBalancerFailed").await;
        assert!(failed.note.unwrap_or_default().contains("creating"));
    }

    async fn s12_other_errors_back_off_five_seconds(backend) {
        let env = Env::started(backend, options()).await;
        env.fake.fail_next(methods::ENSURE_LOAD_BALANCER, 1, CloudError::Unavailable("cloud down".into()));
        let started = Instant::now();
        env.create_service(lb_service(NS, "web")).await;
        env.wait_ingress("web").await;
        let took = started.elapsed();
        assert!(took >= Duration::from_secs(5), "retried before the 5 s backoff: {took:?}");
        let failed = env.wait_event("SyncLoadBalancerFailed").await;
        assert!(failed.note.unwrap_or_default().starts_with("Error syncing load balancer: "));
    }
}

// ---- S1: loadBalancerClass ------------------------------------------------------------------

testkit::backend_tests! {
    async fn s1_classed_service_is_ignored_by_the_unclassed_manager(backend) {
        let env = Env::started(backend, options()).await;
        env.create_service(lb_service(NS, "other").with_class("example.com/internal")).await;
        env.settle("sentinel").await;
        let svc = env.get("other").await.unwrap();
        assert!(ingress(&svc).is_none() && finalizers(&svc).is_empty());
        assert!(env.fake.load_balancer_for(NS, "other").is_none());
    }

    async fn load_balancer_class_manager_handles_only_its_class(backend) {
        let class = "example.com/internal";
        let env = Env::started(backend, ControllerOptions { load_balancer_class: Some(class.into()), ..options() }).await;
        env.create_service(lb_service(NS, "unclassed")).await;
        env.create_service(lb_service(NS, "theirs").with_class("example.com/external")).await;
        env.create_service(lb_service(NS, "mine").with_class(class)).await;
        let mine = env.wait_ingress("mine").await;
        assert_eq!(finalizers(&mine), [cleanup_finalizer(Some(class))]);
        // Changes are handled in order, so the two created first have been looked at.
        for name in ["unclassed", "theirs"] {
            let svc = env.get(name).await.unwrap();
            assert!(ingress(&svc).is_none() && finalizers(&svc).is_empty(), "{name} was handled");
        }
        env.services().delete("mine", &DeleteParams::default()).await.expect("delete");
        eventually_within("mine deleted", WAIT, || async { env.get("mine").await.is_none() }).await;
        assert!(env.fake.load_balancers().is_empty());
    }

    async fn s28_a_classed_manager_told_to_also_takes_unclassed_services_and_no_other_class(backend) {
        let class = "example.com/internal";
        let options = ControllerOptions { load_balancer_class: Some(class.into()), handle_unclassed_services: true, ..options() };
        let env = Env::started(backend, options).await;
        env.create_service(lb_service(NS, "theirs").with_class("example.com/external")).await;
        env.create_service(lb_service(NS, "unclassed")).await;
        env.create_service(lb_service(NS, "mine").with_class(class)).await;
        for name in ["unclassed", "mine"] {
            let svc = env.wait_ingress(name).await;
            assert_eq!(finalizers(&svc), [cleanup_finalizer(Some(class))], "{name} carries the class's finalizer");
        }
        // Changes are handled in order: the one created first has been looked at.
        let theirs = env.get("theirs").await.unwrap();
        assert!(ingress(&theirs).is_none() && finalizers(&theirs).is_empty(), "another class was handled");
        assert!(env.fake.load_balancer_for(NS, "theirs").is_none());
        env.services().delete("unclassed", &DeleteParams::default()).await.expect("delete");
        eventually_within("unclassed deleted", WAIT, || async { env.get("unclassed").await.is_none() }).await;
        assert!(env.fake.load_balancer_for(NS, "unclassed").is_none(), "its load balancer went with it");
    }
}

// ---- S7/S15–S20: hosts ------------------------------------------------------------------------

testkit::backend_tests! {
    async fn s7_zero_eligible_nodes_emits_unavailable_event_and_still_ensures(backend) {
        let env = Env::started(backend, options()).await;
        env.create_node(labelled_node("excluded", "true")).await;
        env.create_service(lb_service(NS, "web")).await;
        env.wait_ingress("web").await;
        assert_eq!(env.hosts("web"), Some(vec![]));
        let e = env.wait_event("UnAvailableLoadBalancer").await;
        assert_eq!(e.type_.as_deref(), Some("Warning"));
    }

    async fn s20_exclusion_label_value_table_decides_hosts(backend) {
        let env = Env::started(backend, options()).await;
        env.create_node(node("plain")).await;
        for (name, value) in
            [("yes-true", "true"), ("yes-one", "1"), ("no-false", "false"), ("no-f", "F"), ("junk", "maybe"), ("empty", "")]
        {
            env.create_node(labelled_node(name, value)).await;
        }
        eventually_within("seven Nodes in the controller's cache", WAIT, || async { (env.running.as_ref()?.context.nodes.state().len() == 7).then_some(()) }).await;
        env.create_service(lb_service(NS, "web")).await;
        env.wait_ingress("web").await;
        assert_eq!(env.hosts("web").unwrap(), ["no-f", "no-false", "plain"]);
    }

    async fn s16_node_added_updates_every_load_balancer_once(backend) {
        let env = Env::started(backend, ControllerOptions { concurrent_service_syncs: 4, ..options() }).await;
        env.create_node(node("n1")).await;
        for i in 0..10 {
            env.create_service(lb_service(NS, &format!("web-{i}"))).await;
        }
        for i in 0..10 {
            env.wait_ingress(&format!("web-{i}")).await;
        }
        let ensures = env.ensures();
        env.create_node(node("n2")).await;
        eventually_within("every load balancer on two hosts", WAIT, || async { (0..10).all(|i| env.hosts(&format!("web-{i}")).unwrap().len() == 2) }).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(env.updates(), 10, "one host update per load balancer");
        assert_eq!(env.ensures(), ensures, "a host change is an update, not an ensure");
        env.wait_event("UpdatedLoadBalancer").await;
    }

    async fn s15_unrelated_node_changes_call_no_update(backend) {
        let env = Env::started(backend, options()).await;
        env.create_node(node("n1")).await;
        env.create_service(lb_service(NS, "web")).await;
        env.wait_ingress("web").await;
        env.edit_node("n1", json!({"metadata": {"labels": {"team": "a"}}, "spec": {"taints": [{"key": "dedicated", "effect": "NoSchedule"}]}})).await;
        env.edit_node("n1", json!({"metadata": {"labels": {(EXCLUDE_FROM_LB_LABEL): "false"}}})).await;
        // A sentinel Node change that does count, to know the earlier ones were seen.
        env.create_node(node("n2")).await;
        eventually_within("web on two hosts", WAIT, || async { (env.hosts("web")?.len() == 2).then_some(()) }).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(env.updates(), 1, "only the added Node caused an update");
    }

    async fn s15_exclusion_label_and_provider_id_changes_update_hosts(backend) {
        let env = Env::started(backend, options()).await;
        // The API server lets a providerID be set once, never changed: n1 starts without one.
        let mut n1 = node("n1");
        n1.spec.as_mut().unwrap().provider_id = None;
        env.create_node(n1).await;
        env.create_node(node("n2")).await;
        env.create_service(lb_service(NS, "web")).await;
        env.wait_ingress("web").await;
        eventually_within("web on two hosts", WAIT, || async { (env.hosts("web")?.len() == 2).then_some(()) }).await;
        env.edit_node("n2", json!({"metadata": {"labels": {(EXCLUDE_FROM_LB_LABEL): "true"}}})).await;
        eventually_within("web on n1 only", WAIT, || async { (env.hosts("web")? == ["n1"]).then_some(()) }).await;
        // Counted from here, updates and ensures together: a node pass that finds the previous
        // sync not yet marked done hands the new host set to a queued sync (an ensure).
        let before = env.updates() + env.ensures();
        env.edit_node("n1", json!({"spec": {"providerID": "fake://n1"}})).await;
        eventually_within("one more update or ensure", WAIT, || async { env.updates() + env.ensures() == before + 1 }).await;
    }

    async fn s21_autoscaler_taint_appearing_updates_hosts(backend) {
        let env = Env::started(backend, options()).await;
        env.create_node(node("n1")).await;
        env.create_node(node("n2")).await;
        env.create_service(lb_service(NS, "web")).await;
        env.wait_ingress("web").await;
        eventually_within("web on two hosts", WAIT, || async { (env.hosts("web")?.len() == 2).then_some(()) }).await;
        let taint = Taint { key: TO_BE_DELETED_TAINT.into(), effect: "NoSchedule".into(), ..Default::default() };
        env.edit_node("n2", json!({"spec": {"taints": [taint]}})).await;
        eventually_within("web on n1 only", WAIT, || async { (env.hosts("web")? == ["n1"]).then_some(()) }).await;
    }

    async fn s18_failed_host_update_retries_through_ensure(backend) {
        let env = Env::started(backend, options()).await;
        env.create_node(node("n1")).await;
        env.create_service(lb_service(NS, "web")).await;
        env.wait_ingress("web").await;
        // Work still queued for web (its own status write) would otherwise run its ensure with
        // n2 already listed, leaving the node sync nothing to update (seen once under load).
        env.settle("sentinel").await;
        let ensures = env.ensures();
        env.fake.fail_next(methods::UPDATE_LOAD_BALANCER, 1, CloudError::Unavailable("cloud down".into()));
        env.create_node(node("n2")).await;
        let e = env.wait_event("UpdateLoadBalancerFailed").await;
        assert!(e.note.unwrap_or_default().contains("[n1, n2]"));
        eventually_within("web on two hosts", WAIT, || async { (env.hosts("web")?.len() == 2).then_some(()) }).await;
        // At least one: under load a later sync of web (its status write) may ensure once more.
        let ran = env.ensures() - ensures;
        assert!(ran >= 1, "the retry ran the ensure path ({ran} ensures)");
        let text = env.running.as_ref().unwrap().context.metrics.encode();
        assert!(text.contains("service_controller_nodesync_error_total 1"), "{text}");
    }
}

// ---- Additions ----------------------------------------------------------------------------------

testkit::backend_tests! {
    async fn s35_an_orphan_no_longer_ours_is_kept_not_failed_and_an_orphan_still_ours_is_swept_after_two_scans(backend) {
        let opts = ControllerOptions { orphan_sweep: true, orphan_scan_period: Duration::from_millis(300), ..options() };
        let mut env = Env::new(backend, opts).await;
        // A load balancer of this cluster whose Service is gone.
        env.fake.insert_load_balancer(ccm_provider_fake::FakeLoadBalancer {
            name: "a-gone".into(),
            service: format!("{NS}/gone"),
            cluster_name: env.options.cluster_name.clone(),
            hosts: Arc::from(Vec::<String>::new()),
            status: Default::default(),
        });
        // Its first deletion finds it no longer this cluster's (tags changed since the scan).
        env.fake.fail_next(methods::DELETE_OWNED, 1, CloudError::NotOwned("its ownership tag changed".into()));
        env.start().await;
        let metrics = || env.running.as_ref().unwrap().context.metrics.encode();
        let kept = r#"service_controller_orphans_deleted_total{kind="load-balancer",outcome="kept"} 1"#;
        eventually_within("the refused deletion counted as kept", WAIT, || async { metrics().contains(kept).then_some(()) }).await;
        assert!(env.fake.load_balancers().iter().any(|lb| lb.name == "a-gone"), "the object is left alone");
        assert!(!metrics().contains(r#"outcome="failed""#), "a refusal is not a failure to retry:\n{}", metrics());
        // The fake still lists it as this cluster's: due again after two more scans, then swept.
        eventually_within("the orphan swept", WAIT, || async { env.fake.load_balancers().is_empty().then_some(()) }).await;
        let deleted = r#"service_controller_orphans_deleted_total{kind="load-balancer",outcome="deleted"} 1"#;
        eventually_within("the sweep counted", WAIT, || async { metrics().contains(deleted).then_some(()) }).await;
        env.stop().await;
    }
}

testkit::backend_tests! {
    async fn s4_resync_period_repairs_cloud_side_drift(backend) {
        let env =
            Env::started(backend, ControllerOptions { load_balancer_resync_period: Some(Duration::from_millis(500)), ..options() })
                .await;
        env.create_service(lb_service(NS, "web")).await;
        env.wait_ingress("web").await;
        // Someone deletes the load balancer behind our back.
        let svc = env.get("web").await.unwrap();
        use ccm_framework::provider::LoadBalancer;
        env.fake.ensure_load_balancer_deleted("kubernetes", &svc).await.unwrap();
        eventually_within("web's load balancer", WAIT, || async { env.fake.load_balancer_for(NS, "web").map(|_| ()) }).await;
    }

    async fn two_writes_per_service_and_none_when_idle(backend) {
        let env = Env::started(backend, ControllerOptions { concurrent_service_syncs: 8, ..options() }).await;
        env.create_node(node("n1")).await;
        for i in 0..50 {
            env.create_service(lb_service(NS, &format!("web-{i}"))).await;
        }
        for i in 0..50 {
            env.wait_ingress(&format!("web-{i}")).await;
        }
        // The last status write may be seen before the server has logged it.
        eventually_within("100 Service writes in the request log", WAIT, || async { (env.writes().len() >= 100).then_some(()) })
            .await;
        let writes = env.writes();
        assert_eq!(writes.len(), 100, "finalizer and status per Service: {writes:?}");
        assert!(writes.iter().all(|w| w.status < 400));
        // Idle: no writes and no cloud calls.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let (mark, calls) = (env.cluster.request_log().mark(), env.lb_calls());
        tokio::time::sleep(Duration::from_secs(3)).await;
        let idle: Vec<_> = env
            .cluster
            .request_log()
            .since(mark)
            .into_iter()
            .filter(|r| {
                // kube-apiserver's upkeep of its own `kubernetes` Service is not ours.
                r.is_write() && r.resource.as_deref() == Some("services") && r.user.as_deref() != Some("system:apiserver")
            })
            .collect();
        assert!(idle.is_empty(), "{idle:?}");
        assert_eq!(env.lb_calls(), calls);
    }
}

// ---- Crash test ---------------------------------------------------------------------------------

testkit::backend_tests! {
    async fn crash_during_deletion_of_100_services_leaks_nothing(backend) {
        let mut env = Env::started(backend, ControllerOptions { concurrent_service_syncs: 10, ..options() }).await;
        env.create_node(node("n1")).await;
        for i in 0..100 {
            env.create_service(lb_service(NS, &format!("web-{i}"))).await;
        }
        eventually_within("100 load balancers", WAIT, || async { env.fake.load_balancers().len() == 100 }).await;
        for i in 0..100 {
            env.wait_ingress(&format!("web-{i}")).await;
        }
        env.fake.set_load_balancer_latency(Duration::from_millis(50));
        for i in 0..100 {
            env.services().delete(&format!("web-{i}"), &DeleteParams::default()).await.expect("delete");
        }
        // Stop mid-way: some deleted, some not.
        eventually_within("fewer than 80 load balancers", WAIT, || async { env.fake.load_balancers().len() < 80 }).await;
        env.stop().await;
        let left = env.fake.load_balancers().len();
        assert!(left > 0, "stopped too late to test anything");
        env.fake.set_load_balancer_latency(Duration::ZERO);
        env.start().await;
        eventually_within("no Service and no load balancer left", WAIT, || async {
            let svcs = env.services().list(&ListParams::default()).await.ok()?;
            // kube-apiserver keeps its own `kubernetes` Service in this namespace.
            let ours = svcs.items.iter().filter(|s| s.metadata.name.as_deref() != Some("kubernetes")).count();
            (ours == 0 && env.fake.load_balancers().is_empty()).then_some(())
        })
        .await;
    }
}

// ---- S25, S26: the LoadBalancerProvisioned condition ---------------------------------------------

fn provisioned(s: &Service) -> Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    use ccm_framework::controllers::service::condition::LEGACY as CONDITION_TYPE;
    s.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == CONDITION_TYPE).cloned()
}

impl Env {
    async fn wait_condition(&self, name: &str, reason: &str) -> Service {
        eventually_within("the ServiceProvisioned condition with the reason", WAIT, || async {
            self.get(name).await.filter(|s| provisioned(s).is_some_and(|c| c.reason == reason))
        })
        .await
    }

    fn status_writes(&self, name: &str) -> usize {
        self.writes()
            .into_iter()
            .filter(|r| r.name.as_deref() == Some(name) && r.subresource.as_deref() == Some("status"))
            .count()
    }
}

fn pool_exhausted() -> CloudError {
    use ccm_framework::provider::Refusal;
    CloudError::refused(Refusal::PoolExhausted, "pool default: 0 of 254 IPv4 addresses free")
}

testkit::backend_tests! {
    async fn s25_a_refusal_becomes_a_service_condition_written_once_with_its_reason(backend) {
        let env = Env::started(backend, options()).await;
        env.fake.fail_rate(methods::ENSURE_LOAD_BALANCER, 1.0, pool_exhausted());
        let created = env.create_service(lb_service(NS, "web")).await;
        let svc = env.wait_condition("web", "PoolExhausted").await;
        let c = provisioned(&svc).unwrap();
        assert_eq!(c.status, "False");
        assert_eq!(c.message, "pool default: 0 of 254 IPv4 addresses free");
        assert_eq!(c.observed_generation, created.metadata.generation);
        let failed = env.wait_event("SyncLoadBalancerFailed").await;
        assert!(failed.note.unwrap_or_default().contains("PoolExhausted: pool default"), "the event as well");
        // The retry after the 5 s backoff is refused alike: nothing new to write.
        eventually_within("a second ensure of web", WAIT, || async {
            let subjects = env.fake.calls().subjects(methods::ENSURE_LOAD_BALANCER);
            subjects.iter().filter(|s| *s == "default/web").count() >= 2
        })
        .await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(env.status_writes("web"), 1, "the condition is written only when it changes");
        let again = provisioned(&env.get("web").await.unwrap()).unwrap();
        assert_eq!(again.last_transition_time, c.last_transition_time);
        // S26: a Service that no longer wants a load balancer loses the condition.
        env.edit("web", to_cluster_ip()).await;
        eventually_within("web without the ServiceProvisioned condition", WAIT, || async { env.get("web").await.filter(|s| provisioned(s).is_none()) }).await;
    }

    async fn s26_the_condition_goes_once_the_load_balancer_exists(backend) {
        let env = Env::started(backend, options()).await;
        env.fake.fail_next(methods::ENSURE_LOAD_BALANCER, 1, pool_exhausted());
        env.create_service(lb_service(NS, "web")).await;
        env.wait_condition("web", "PoolExhausted").await;
        // The retry succeeds: the address is written and the condition removed.
        let svc = eventually_within("web's ingress and no condition", WAIT, || async {
            env.get("web").await.filter(|s| ingress(s).is_some() && provisioned(s).is_none())
        })
        .await;
        assert!(ingress(&svc).is_some());
        // A server logs a request once it has answered it, which can be after a reader sees the
        // write: wait for the log to hold the second write before counting exactly.
        eventually_within("web's second status write in the request log", WAIT, || async {
            (env.status_writes("web") >= 2).then_some(())
        })
        .await;
        assert_eq!(
            env.status_writes("web"),
            2,
            "the refusal's conditions, then the address with the conditions of success in one write (S31)"
        );
        // Other errors leave no condition behind.
        env.fake.fail_next(methods::ENSURE_LOAD_BALANCER, 1, CloudError::Unavailable("cloud down".into()));
        env.create_service(lb_service(NS, "api")).await;
        env.wait_event("SyncLoadBalancerFailed").await;
        let api = env.wait_ingress("api").await;
        assert!(provisioned(&api).is_none());
    }
}

// ---- S31, S33: the load-balancer state on the Service -----------------------------------------

fn condition(s: &Service, type_: &str) -> Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    s.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == type_).cloned()
}

/// `(status, reason, observedGeneration)` of each of the three conditions, in order.
fn states(s: &Service) -> Vec<(String, String, Option<i64>)> {
    ["Accepted", "Programmed", "Degraded"]
        .iter()
        .map(|t| condition(s, t).map(|c| (c.status, c.reason, c.observed_generation)).unwrap_or_default())
        .collect()
}

testkit::backend_tests! {
    async fn s31_s33_a_served_service_is_accepted_programmed_and_degraded_only_while_no_node_may_serve_it(backend) {
        let env = Env::started(backend, options()).await;
        env.create_service(lb_service(NS, "web")).await;
        // No Node yet: the load balancer exists but nothing may serve it.
        let svc = eventually_within("web's conditions", WAIT, || async {
            env.get("web").await.filter(|s| condition(s, "Degraded").is_some())
        })
        .await;
        let generation = svc.metadata.generation;
        assert_eq!(
            states(&svc),
            [
                ("True".into(), "Accepted".into(), generation),
                ("True".into(), "Programmed".into(), generation),
                ("True".into(), "NoHosts".into(), generation),
            ]
        );
        env.create_node(testkit::node("n1")).await;
        let svc = eventually_within("web not degraded once a Node may serve it", WAIT, || async {
            env.get("web").await.filter(|s| condition(s, "Degraded").is_some_and(|c| c.status == "False"))
        })
        .await;
        assert_eq!(condition(&svc, "Degraded").map(|c| c.reason), Some("AsExpected".into()));
        // A spec change is ensured again; the conditions keep describing the Service's current
        // generation (as the API server keeps it, if at all).
        env.edit("web", json!({"spec": {"sessionAffinity": "ClientIP"}})).await;
        eventually_within("web ensured again", WAIT, || async { (env.ensures() >= 2).then_some(()) }).await;
        let svc = eventually_within("the conditions of the current generation", WAIT, || async {
            env.get("web").await.filter(|s| {
                condition(s, "Programmed").is_some_and(|c| c.status == "True" && c.observed_generation == s.metadata.generation)
            })
        })
        .await;
        assert_eq!(condition(&svc, "Accepted").map(|c| c.status), Some("True".into()));
        assert!(condition(&svc, "LoadBalancerProvisioned").is_none(), "the deprecated condition only on refusals");
    }
}

// ---- S32: API errors are not cloud errors ---------------------------------------------------

/// How long the status writes fail: long enough for a cloud back-off (5 s, then 10 s) to put the
/// next attempt well past the end of the outage.
const OUTAGE: Duration = Duration::from_secs(16);
/// The longest wait for the address once the API server answers again: the API back-off's cap
/// (5 s) with room for a loaded machine, far below the 19 s a cloud back-off would take.
const AFTER_OUTAGE: Duration = Duration::from_secs(10);

testkit::backend_tests! {
    async fn s32_a_refused_status_write_is_retried_on_its_own_backoff_and_never_calls_the_cloud_again(backend) {
        let env = Env::with_faults(backend, options()).await;
        // Every status write of the Service fails, as during an API-server outage.
        env.cluster.faults().add_rule(FaultRule {
            path_prefix: Some(format!("/api/v1/namespaces/{NS}/services/web/status")),
            error_rate: 1.0,
            status: 500,
            ..Default::default()
        });
        env.create_service(lb_service(NS, "web")).await;
        eventually_within("the load balancer ensured", WAIT, || async { (env.ensures() >= 1).then_some(()) }).await;
        tokio::time::sleep(OUTAGE).await;
        assert!(env.get("web").await.and_then(|s| ingress(&s)).is_none(), "no status write got through");
        env.cluster.faults().clear();
        let cleared = Instant::now();
        eventually_within("the Service's ingress after the outage", AFTER_OUTAGE, || async {
            env.get("web").await.filter(|s| ingress(s).is_some())
        })
        .await;
        eprintln!("s32: address written {:?} after the API server answered again", cleared.elapsed());
        assert_eq!(env.ensures(), 1, "the retries wrote what the cloud had already answered");
    }
}
