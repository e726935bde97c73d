//! node-route-controller against both API server backends and the fake provider: start conditions
//! (R1, R2 and our §6 item 6 fix), the decision table (R8–R10), NetworkUnavailable (R12, R13),
//! retries (§6 item 5), node-change triggers and the 200-operation cap.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ccm_framework::controllers::route::logic::{NETWORK_UNAVAILABLE, REASON_NO_ROUTE_CREATED, REASON_ROUTE_CREATED};
use ccm_framework::controllers::route::{FIELD_MANAGER, RouteController};
use ccm_framework::engine::testing::{RunningController, run_controller};
use ccm_framework::options::ControllerOptions;
use ccm_framework::provider::{CloudError, Route};
use ccm_provider_fake::{FakeCapabilities, FakeProvider, methods};
use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeCondition, NodeSpec, NodeStatus};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;
use testkit::{Backend, TestCluster, eventually_within};

const WAIT: Duration = Duration::from_secs(20);
const CLUSTER: &str = "kubernetes";

fn options() -> ControllerOptions {
    ControllerOptions {
        cluster_cidrs: vec!["10.244.0.0/16".parse().unwrap()],
        // Long enough that only node changes and retries cause passes, unless a test says so.
        route_reconciliation_period: Duration::from_secs(3600),
        ..Default::default()
    }
}

struct Env {
    cluster: TestCluster,
    fake: Arc<FakeProvider>,
    running: RunningController,
}

impl Drop for Env {
    fn drop(&mut self) {
        self.running.context.shutdown.cancel();
    }
}

impl Env {
    async fn start(backend: Backend, options: ControllerOptions, fake: FakeProvider) -> Env {
        let cluster = TestCluster::start(backend).await.expect("API server starts");
        Self::start_on(cluster, options, fake).await
    }

    async fn start_on(cluster: TestCluster, options: ControllerOptions, fake: FakeProvider) -> Env {
        let fake = Arc::new(fake);
        let running = run_controller(cluster.client(), fake.clone(), options, Box::new(RouteController::new())).await;
        Env { cluster, fake, running }
    }

    fn nodes(&self) -> Api<Node> {
        Api::all(self.cluster.client())
    }

    async fn node(&self, name: &str) -> Node {
        self.nodes().get(name).await.expect("get node")
    }

    fn routes(&self) -> Vec<(String, String)> {
        let mut r: Vec<_> =
            self.fake.cloud_routes(CLUSTER).into_iter().map(|r| (r.target_node, r.destination_cidr)).collect();
        r.sort();
        r
    }

    fn condition_writes(&self) -> usize {
        self.cluster.request_log().count(|r| {
            r.is_write()
                && r.resource.as_deref() == Some("nodes")
                && r.subresource.as_deref() == Some("status")
                && r.field_manager.as_deref() == Some(FIELD_MANAGER)
        })
    }

    async fn events(&self, reason: &str) -> Vec<Event> {
        self.cluster.events(reason).await.expect("list events")
    }
}

async fn create_nodes(cluster: &TestCluster, nodes: &[Node]) {
    let api: Api<Node> = Api::all(cluster.client());
    for n in nodes {
        api.create(&PostParams::default(), n).await.expect("create node");
    }
}

fn addr(ip: &str) -> NodeAddress {
    NodeAddress { type_: "InternalIP".into(), address: ip.into() }
}

fn node(name: &str, pod_cidr: Option<&str>, ip: &str) -> Node {
    Node {
        metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
        spec: Some(NodeSpec {
            pod_cidr: pod_cidr.map(String::from),
            pod_cidrs: pod_cidr.map(|c| vec![c.to_string()]),
            ..Default::default()
        }),
        status: Some(NodeStatus { addresses: Some(vec![addr(ip)]), ..Default::default() }),
    }
}

fn route(name: &str, target: &str, cidr: &str) -> Route {
    Route { name: name.into(), target_node: target.into(), destination_cidr: cidr.into(), ..Default::default() }
}

fn condition(n: &Node) -> Option<NodeCondition> {
    n.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == NETWORK_UNAVAILABLE).cloned()
}

fn status_reason(n: &Node) -> Option<(String, String)> {
    condition(n).map(|c| (c.status, c.reason.unwrap_or_default()))
}

fn created() -> Option<(String, String)> {
    Some(("False".into(), REASON_ROUTE_CREATED.into()))
}

fn not_created() -> Option<(String, String)> {
    Some(("True".into(), REASON_NO_ROUTE_CREATED.into()))
}

// ---- Start conditions ----------------------------------------------------------------------

testkit::backend_tests! {
    async fn r1_not_started_when_configure_cloud_routes_is_false(backend) {
        let env = Env::start(backend, ControllerOptions { configure_cloud_routes: false, ..options() }, FakeProvider::new()).await;
        eventually_within("the controller to return", WAIT, || async { env.running.is_finished() }).await;
        assert_eq!(env.fake.calls().count(methods::LIST_ROUTES), 0);
    }

    async fn r1_not_started_when_the_provider_has_no_routes(backend) {
        let fake = FakeProvider::new();
        fake.set_capabilities(FakeCapabilities { routes: false, ..Default::default() });
        let env = Env::start(backend, options(), fake).await;
        eventually_within("the controller to return", WAIT, || async { env.running.is_finished() }).await;
        assert_eq!(env.running.check(), Some(Ok(())));
    }

    async fn invalid_cluster_cidr_disables_the_controller_with_a_failing_health_check(backend) {
        let opts = ControllerOptions {
            cluster_cidrs: vec![],
            cluster_cidr_error: Some("invalid CIDR address: 10.244.0.0/33".into()),
            ..options()
        };
        let env = Env::start(backend, opts, FakeProvider::new()).await;
        let err = eventually_within("the controller's failed health check", WAIT, || async { env.running.check()?.err() }).await;
        assert!(err.contains("--cluster-cidr") && err.contains("10.244.0.0/33"), "{err}");
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!env.running.is_finished(), "§6 item 6: the controller stays (failing) instead of ending the manager");
        assert_eq!(env.fake.calls().count(methods::LIST_ROUTES), 0);
    }

    async fn empty_cluster_cidr_disables_the_controller_with_a_failing_health_check(backend) {
        let env = Env::start(backend, ControllerOptions { cluster_cidrs: vec![], ..options() }, FakeProvider::new()).await;
        let err = eventually_within("the controller's failed health check", WAIT, || async { env.running.check()?.err() }).await;
        assert!(err.contains("--cluster-cidr is empty"), "{err}");
        assert_eq!(env.fake.calls().count(methods::LIST_ROUTES), 0);
    }
}

// ---- R8–R11 ----------------------------------------------------------------------------------

testkit::backend_tests! {
    async fn r8_routes_created_for_nodes_with_pod_cidrs_and_condition_set(backend) {
        let cluster = TestCluster::start(backend).await.unwrap();
        create_nodes(&cluster, &[node("a", Some("10.244.0.0/24"), "10.0.0.1"), node("b", None, "10.0.0.2")]).await;
        let env = Env::start_on(cluster, options(), FakeProvider::new()).await;
        eventually_within("a's route", WAIT, || async { env.routes() == [("a".to_string(), "10.244.0.0/24".to_string())] }).await;
        eventually_within("a's RouteCreated condition", WAIT, || async { status_reason(&env.node("a").await) == created() }).await;
        let c = condition(&env.node("a").await).unwrap();
        assert_eq!(c.message.as_deref(), Some("RouteController created a route"));
        assert_eq!(condition(&env.node("b").await), None, "R12: no pod CIDRs and no routes: untouched");
    }

    async fn r9_blackhole_out_of_cidr_and_wrong_target_routes(backend) {
        let cluster = TestCluster::start(backend).await.unwrap();
        create_nodes(&cluster, &[node("a", Some("10.244.0.0/24"), "10.0.0.1")]).await;
        let fake = FakeProvider::new();
        let mut blackhole = route("r1-blackhole", "a", "10.244.0.0/24");
        blackhole.blackhole = true;
        fake.insert_route(CLUSTER, blackhole);
        fake.insert_route(CLUSTER, route("r2-unknown-node", "gone", "10.244.9.0/24"));
        fake.insert_route(CLUSTER, route("r3-empty-target", "", "10.244.8.0/24"));
        fake.insert_route(CLUSTER, route("r4-wrong-cidr", "a", "10.244.7.0/24"));
        fake.insert_route(CLUSTER, route("r5-outside", "gone", "192.168.5.0/24"));
        let env = Env::start_on(cluster, options(), fake).await;
        eventually_within("the routes wanted", WAIT, || async {
            let want = [("a".to_string(), "10.244.0.0/24".to_string()), ("gone".to_string(), "192.168.5.0/24".to_string())];
            env.routes() == want
        })
        .await;
        let blackholes = env.fake.cloud_routes(CLUSTER).into_iter().filter(|r| r.blackhole).count();
        assert_eq!(blackholes, 0, "the blackhole was replaced by a real route");
        assert_eq!(env.fake.calls().count(methods::DELETE_ROUTE), 4);
    }

    async fn r10_stale_addresses_replace_the_route_deleting_first(backend) {
        let cluster = TestCluster::start(backend).await.unwrap();
        create_nodes(
            &cluster,
            &[node("a", Some("10.244.0.0/24"), "10.0.0.1"), node("b", Some("10.244.1.0/24"), "10.0.0.2")],
        )
        .await;
        let fake = FakeProvider::new();
        for (name, target, cidr, ip) in
            [("r-a", "a", "10.244.0.0/24", "10.0.0.1"), ("r-b", "b", "10.244.1.0/24", "10.0.0.99")]
        {
            fake.insert_route(
                CLUSTER,
                Route { enable_node_addresses: true, target_node_addresses: vec![addr(ip)], ..route(name, target, cidr) },
            );
        }
        let env = Env::start_on(cluster, options(), fake).await;
        eventually_within("one route creation", WAIT, || async { env.fake.calls().count(methods::CREATE_ROUTE) == 1 }).await;
        let order: Vec<&str> = env
            .fake
            .calls()
            .recent()
            .into_iter()
            .filter(|c| c.method == methods::CREATE_ROUTE || c.method == methods::DELETE_ROUTE)
            .map(|c| c.method)
            .collect();
        assert_eq!(order, [methods::DELETE_ROUTE, methods::CREATE_ROUTE]);
        let b = env.fake.cloud_routes(CLUSTER).into_iter().find(|r| r.target_node == "b").unwrap();
        assert_eq!(b.target_node_addresses, vec![addr("10.0.0.2")]);
        assert_eq!(env.fake.calls().count(methods::DELETE_ROUTE), 1, "the up-to-date route for a is kept");
    }
}

// ---- R12/R13 ---------------------------------------------------------------------------------

testkit::backend_tests! {
    async fn r12_network_unavailable_outcomes(backend) {
        let cluster = TestCluster::start(backend).await.unwrap();
        create_nodes(
            &cluster,
            &[
                node("ok", Some("10.244.0.0/24"), "10.0.0.1"),
                node("failing", Some("10.244.1.0/24"), "10.0.0.2"),
                node("stripped", None, "10.0.0.3"),
            ],
        )
        .await;
        let fake = FakeProvider::new();
        // "stripped" has a route but no pod CIDR any more.
        fake.insert_route(CLUSTER, route("r-stripped", "stripped", "10.244.2.0/24"));
        fake.fail_next(methods::CREATE_ROUTE, 1, CloudError::Unavailable("quota".into()));
        let env = Env::start_on(cluster, options(), fake).await;
        eventually_within("stripped's NoRouteCreated condition", WAIT, || async { status_reason(&env.node("stripped").await) == not_created() }).await;
        // One of the two creations failed on the first pass: that Node is NoRouteCreated until the
        // retry succeeds; both end RouteCreated.
        eventually_within("both Nodes RouteCreated", WAIT, || async {
            let (ok, failing) = (status_reason(&env.node("ok").await), status_reason(&env.node("failing").await));
            ok == created() && failing == created()
        })
        .await;
        let failed = env.events("FailedToCreateRoute").await;
        assert_eq!(failed.len(), 1);
        assert!(failed[0].note.as_deref().unwrap_or_default().contains("quota"));
    }

    async fn r13_condition_written_only_when_status_or_reason_differs(backend) {
        let cluster = TestCluster::start(backend).await.unwrap();
        create_nodes(&cluster, &[node("a", Some("10.244.0.0/24"), "10.0.0.1")]).await;
        let opts = ControllerOptions { route_reconciliation_period: Duration::from_millis(200), ..options() };
        let env = Env::start_on(cluster, opts, FakeProvider::new()).await;
        eventually_within("a's RouteCreated condition", WAIT, || async { status_reason(&env.node("a").await) == created() }).await;
        let first = condition(&env.node("a").await).unwrap();
        // Several periodic passes later: still one write.
        let passes = env.fake.calls().count(methods::LIST_ROUTES);
        eventually_within("three more passes", WAIT, || async { env.fake.calls().count(methods::LIST_ROUTES) >= passes + 3 }).await;
        assert_eq!(env.condition_writes(), 1);
        // A CNI's False with another reason is taken over, without moving lastTransitionTime.
        let patch = json!({"status": {"conditions": [{"type": NETWORK_UNAVAILABLE, "status": "False", "reason": "CalicoIsUp", "message": "Calico is running on this node", "lastTransitionTime": first.last_transition_time}]}});
        env.nodes().patch_status("a", &PatchParams::default(), &Patch::Strategic(patch)).await.unwrap();
        // The log may record a write a moment after its response: wait for both.
        eventually_within("a RouteCreated, written twice", WAIT, || async {
            status_reason(&env.node("a").await) == created() && env.condition_writes() >= 2
        })
        .await;
        assert_eq!(env.condition_writes(), 2);
        assert_eq!(condition(&env.node("a").await).unwrap().last_transition_time, first.last_transition_time);
    }
}

// ---- Triggers, retries, concurrency ----------------------------------------------------------

testkit::backend_tests! {
    async fn r5_node_changes_trigger_a_pass_without_waiting_for_the_period(backend) {
        let env = Env::start(backend, options(), FakeProvider::new()).await;
        create_nodes(&env.cluster, &[node("a", None, "10.0.0.1")]).await;
        env.nodes()
            .patch(
                "a",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"podCIDR": "10.244.3.0/24", "podCIDRs": ["10.244.3.0/24"]}})),
            )
            .await
            .unwrap();
        eventually_within("a's route", WAIT, || async { env.routes() == [("a".to_string(), "10.244.3.0/24".to_string())] }).await;
        env.nodes().delete("a", &DeleteParams::default()).await.unwrap();
        eventually_within("no route", WAIT, || async { env.routes().is_empty() }).await;
    }

    async fn r5_unrelated_node_changes_do_not_trigger_a_pass(backend) {
        let cluster = TestCluster::start(backend).await.unwrap();
        create_nodes(&cluster, &[node("a", Some("10.244.0.0/24"), "10.0.0.1")]).await;
        let env = Env::start_on(cluster, options(), FakeProvider::new()).await;
        eventually_within("a's RouteCreated condition", WAIT, || async { status_reason(&env.node("a").await) == created() }).await;
        tokio::time::sleep(Duration::from_millis(400)).await;
        let passes = env.fake.calls().count(methods::LIST_ROUTES);
        env.nodes()
            .patch("a", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert_eq!(env.fake.calls().count(methods::LIST_ROUTES), passes);
    }

    async fn r11_failed_creation_is_retried_without_waiting_for_the_period(backend) {
        let cluster = TestCluster::start(backend).await.unwrap();
        create_nodes(&cluster, &[node("a", Some("10.244.0.0/24"), "10.0.0.1")]).await;
        let fake = FakeProvider::new();
        fake.fail_next(methods::CREATE_ROUTE, 2, CloudError::Unavailable("cloud down".into()));
        let started = Instant::now();
        let env = Env::start_on(cluster, options(), fake).await;
        eventually_within("one route", WAIT, || async { env.routes().len() == 1 }).await;
        // Retries after 1 s and 2 s; the period is an hour.
        assert!(started.elapsed() < Duration::from_secs(10));
        assert_eq!(env.fake.calls().count(methods::CREATE_ROUTE), 3);
        // Both failures share one event key, so the recorder may fold them into one series.
        let failed = eventually_within("a FailedToCreateRoute event", WAIT, || async { env.events("FailedToCreateRoute").await.into_iter().next() }).await;
        assert!(failed.note.as_deref().unwrap_or_default().contains("cloud down"));
    }

    async fn r4_r6_periodic_pass_repairs_a_deleted_route_and_counts_the_sync(backend) {
        let cluster = TestCluster::start(backend).await.unwrap();
        create_nodes(&cluster, &[node("a", Some("10.244.0.0/24"), "10.0.0.1")]).await;
        let opts = ControllerOptions { route_reconciliation_period: Duration::from_millis(300), ..options() };
        let env = Env::start_on(cluster, opts, FakeProvider::new()).await;
        eventually_within("one route", WAIT, || async { env.routes().len() == 1 }).await;
        let r = env.fake.cloud_routes(CLUSTER).remove(0);
        ccm_framework::provider::Routes::delete_route(env.fake.as_ref(), CLUSTER, &r).await.unwrap();
        eventually_within("one route again", WAIT, || async { env.routes().len() == 1 }).await;
        let text = env.running.context.metrics.encode();
        assert!(text.contains("route_controller_route_sync_total"), "{text}");
    }

    async fn r11_at_most_200_route_operations_in_flight(backend) {
        let cluster = TestCluster::start(backend).await.unwrap();
        let nodes: Vec<Node> = (0..450)
            .map(|i| node(&format!("n{i}"), Some(&format!("10.244.{}.{}/26", i / 4, (i % 4) * 64)), "10.0.0.1"))
            .collect();
        create_nodes(&cluster, &nodes).await;
        let fake = FakeProvider::new();
        fake.set_latency(Duration::from_millis(200));
        let env = Env::start_on(cluster, options(), fake).await;
        eventually_within("450 routes", WAIT, || async { env.routes().len() == 450 }).await;
        assert_eq!(env.fake.calls().peak_in_flight(), 200);
    }
}
