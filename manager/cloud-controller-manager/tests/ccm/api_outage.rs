//! Recovery after an API-server outage (issue 49 item 7): 100 LoadBalancer Services created while
//! 30% of API requests fail with 500, then deleted under the same burst. What is measured is the
//! time from the end of each burst to every Service converged: each with an address, then each
//! gone (its finalizer released). The measurement is `#[ignore]`d (it takes minutes); run it
//! with `cargo test -p cloud-controller-manager --test ccm api_outage:: -- --ignored --nocapture`
//! and see docs/benchmarks.md. The behaviour it rests on (S32: an API error never lengthens the
//! cloud back-off) is tested in `service_controller` (`s32_...`) and in the framework's unit tests.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ccm_framework::controllers::service::ServiceController;
use ccm_framework::engine::testing::run_controller;
use ccm_framework::options::ControllerOptions;
use ccm_provider_fake::FakeProvider;
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{Api, DeleteParams, PostParams};
use testkit::{Backend, FaultRule, TestCluster, ingress_ips, lb_service, node};

const NS: &str = "default";
const SERVICES: usize = 100;
/// How long each burst lasts, from its start.
const BURST: Duration = Duration::from_secs(30);
/// The longest a convergence is waited for.
const LIMIT: Duration = Duration::from_secs(600);

/// Retry an API call of the test's own until the API server answers it (the burst hits the
/// test too): `Ok`, or an error that is the server's answer rather than an injected 500.
async fn through<T, F, Fut>(mut call: F) -> Result<T, kube::Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, kube::Error>>,
{
    loop {
        match call().await {
            Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => return Err(kube::Error::Api(s)),
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            ok => return ok,
        }
    }
}

fn name(i: usize) -> String {
    format!("web-{i:03}")
}

/// How many of the Services satisfy `done`, read with retries.
async fn count(api: &Api<Service>, done: impl Fn(Option<&Service>) -> bool) -> usize {
    let mut n = 0;
    for i in 0..SERVICES {
        let key = name(i);
        let svc = through(|| async { api.get_opt(&key).await }).await.expect("a read");
        n += usize::from(done(svc.as_ref()));
    }
    n
}

async fn until_all(api: &Api<Service>, done: impl Fn(Option<&Service>) -> bool + Copy) -> Duration {
    let started = Instant::now();
    loop {
        if count(api, done).await == SERVICES {
            return started.elapsed();
        }
        assert!(started.elapsed() < LIMIT, "not converged within {LIMIT:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn burst() -> FaultRule {
    FaultRule { error_rate: 0.3, status: 500, ..Default::default() }
}

/// One run: (time to every address after the first burst, time to every Service gone after the
/// second, Services without an address at the end of the first burst, Services left at the end
/// of the second).
async fn run(backend: Backend) -> (Duration, Duration, usize, usize) {
    let cluster = TestCluster::start_with_faults(backend).await.expect("API server starts");
    let client = cluster.client();
    let nodes: Api<Node> = Api::all(client.clone());
    nodes.create(&PostParams::default(), &node("n1")).await.expect("create node");
    let fake = Arc::new(FakeProvider::new());
    let running =
        run_controller(client.clone(), fake.clone(), ControllerOptions::default(), Box::new(ServiceController::new()))
            .await;
    let api: Api<Service> = Api::namespaced(client, NS);
    let faults = cluster.faults();

    let started = Instant::now();
    faults.add_rule(burst());
    for i in 0..SERVICES {
        let svc = lb_service(NS, &name(i));
        // A 409: an earlier attempt went through and only its answer was lost.
        let _ = through(|| async { api.create(&PostParams::default(), &svc).await }).await;
    }
    tokio::time::sleep(BURST.saturating_sub(started.elapsed())).await;
    let pending_create = SERVICES - count(&api, |s| s.is_some_and(|s| !ingress_ips(s).is_empty())).await;
    faults.clear();
    let to_addresses = until_all(&api, |s| s.is_some_and(|s| !ingress_ips(s).is_empty())).await;

    let started = Instant::now();
    faults.add_rule(burst());
    for i in 0..SERVICES {
        let n = name(i);
        let _ = through(|| async { api.delete(&n, &DeleteParams::default()).await }).await;
    }
    tokio::time::sleep(BURST.saturating_sub(started.elapsed())).await;
    let pending_delete = count(&api, |s| s.is_some()).await;
    faults.clear();
    let to_gone = until_all(&api, |s| s.is_none()).await;
    assert!(fake.load_balancers().is_empty(), "every load balancer deleted");
    running.stop().await.expect("controller stops");
    (to_addresses, to_gone, pending_create, pending_delete)
}

fn report(backend: Backend, (addresses, gone, pending_create, pending_delete): (Duration, Duration, usize, usize)) {
    use std::io::Write as _;
    let _ = writeln!(
        std::io::stderr(),
        "api_outage {}: {SERVICES} Services, 30% 500s for {BURST:?} per phase; after the create burst {pending_create} without an address, all addressed {:.1} s after it ended; after the delete burst {pending_delete} left, all gone {:.1} s after it ended",
        backend.name(),
        addresses.as_secs_f64(),
        gone.as_secs_f64(),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement of minutes; see docs/benchmarks.md"]
async fn measure_recovery_after_an_api_outage_local() {
    report(Backend::Local, run(Backend::Local).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement of minutes; see docs/benchmarks.md"]
async fn measure_recovery_after_an_api_outage_genuine() {
    if !Backend::genuine_available() {
        return;
    }
    report(Backend::Genuine, run(Backend::Genuine).await);
}
