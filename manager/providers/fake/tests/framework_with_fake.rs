//! Framework functions that take a provider, exercised with the fake one: which controllers
//! run for a provider's capabilities, the metrics wrapper, and the provider-dependent flag
//! checks. They live here because the framework cannot depend on a provider crate.

use std::sync::Arc;

use ccm_framework::engine::instrument::InstrumentedProvider;
use ccm_framework::engine::skip_reason;
use ccm_framework::engine::startup::check_with_provider;
use ccm_framework::metrics::Metrics;
use ccm_framework::options::ControllerOptions;
use ccm_framework::program::flags::Flags;
use ccm_framework::program::settings::Settings;
use ccm_framework::provider::{CloudError, CloudProvider};
use ccm_provider_fake::{FakeCapabilities, FakeProvider, methods};
use crds::controllers::{CLOUD_NODE, CLOUD_NODE_LIFECYCLE, NODE_ROUTE, SERVICE_LB};
use testkit::node;

fn settings(args: &[&str]) -> Result<Settings, ccm_framework::Error> {
    let mut all = vec!["cloud-controller-manager"];
    all.extend_from_slice(args);
    Flags::try_parse_args(all).unwrap().settings()
}

// engine::skip_reason
#[test]
fn s24_r1_controllers_without_their_capability_are_skipped() {
    let fake = FakeProvider::new();
    let options = ControllerOptions { cluster_cidrs: vec!["10.244.0.0/16".parse().unwrap()], ..Default::default() };
    for name in [CLOUD_NODE, CLOUD_NODE_LIFECYCLE, SERVICE_LB, NODE_ROUTE] {
        assert_eq!(skip_reason(name, &fake, &options), None, "{name}");
    }
    fake.set_capabilities(FakeCapabilities {
        instances: false,
        load_balancer: false,
        routes: false,
        ..Default::default()
    });
    for name in [CLOUD_NODE, CLOUD_NODE_LIFECYCLE, SERVICE_LB, NODE_ROUTE] {
        let reason = skip_reason(name, &fake, &options).unwrap();
        assert!(reason.contains("does not support"), "{name}: {reason}");
    }
}

#[test]
fn r1_route_controller_needs_configure_cloud_routes() {
    let fake = FakeProvider::new();
    let off = ControllerOptions { configure_cloud_routes: false, ..Default::default() };
    assert!(skip_reason(NODE_ROUTE, &fake, &off).unwrap().contains("--configure-cloud-routes"));
    // An empty or invalid CIDR is reported by the controller itself, on its health check.
    let no_cidr = ControllerOptions::default();
    assert_eq!(skip_reason(NODE_ROUTE, &fake, &no_cidr), None);
    let bad = ControllerOptions { cluster_cidr_error: Some("not a CIDR".into()), ..Default::default() };
    assert_eq!(skip_reason(NODE_ROUTE, &fake, &bad), None);
}

// engine::instrument
#[tokio::test]
async fn calls_are_counted_by_method_and_result_and_reach_the_provider() {
    let fake = Arc::new(FakeProvider::new());
    fake.set_auto_instances(true);
    fake.fail_next(methods::INSTANCE_EXISTS, 1, CloudError::Throttled { retry_after: None, message: "429".into() });
    let metrics = Metrics::new();
    let p = InstrumentedProvider::new(fake.clone(), &metrics);
    let inst = p.instances().unwrap();
    assert!(inst.instance_exists(&node("a")).await.is_err());
    assert!(inst.instance_exists(&node("a")).await.unwrap());
    let n = [node("a"), node("b")];
    assert_eq!(inst.instances_metadata(&[&n[0], &n[1]]).await.len(), 2);
    assert_eq!(fake.calls().count(methods::INSTANCE_EXISTS), 2);
    assert_eq!(fake.calls().count(methods::INSTANCES_METADATA), 1, "the provider's own batch method is used");
    let text = metrics.encode();
    for line in [
        r#"cloudprovider_api_requests_total{provider="fake",method="instance_exists",result="throttled"} 1"#,
        r#"cloudprovider_api_requests_total{provider="fake",method="instance_exists",result="success"} 1"#,
        r#"cloudprovider_api_requests_total{provider="fake",method="instances_metadata",result="success"} 1"#,
        r#"cloudprovider_api_request_duration_seconds_count{provider="fake",method="instance_exists"} 2"#,
    ] {
        assert!(text.contains(line), "missing {line} in\n{text}");
    }
}

#[tokio::test]
async fn missing_capabilities_stay_missing_through_the_wrapper() {
    let fake = Arc::new(FakeProvider::new());
    fake.set_capabilities(FakeCapabilities { load_balancer: false, routes: false, ..Default::default() });
    let p = InstrumentedProvider::new(fake, &Metrics::new());
    assert!(p.load_balancer().is_none());
    assert!(p.routes().is_none());
    assert!(p.instances().is_some());
    assert_eq!(p.name(), "fake");
}

// engine::startup::check_with_provider
#[test]
fn r2_an_unparsable_cluster_cidr_does_not_stop_the_manager() {
    let s = settings(&["--cluster-cidr=10.244.0.0/33"]).unwrap();
    let fake = FakeProvider::new();
    let mut options = s.options.clone();
    check_with_provider(&mut options, &fake).unwrap();
    // Kept for the route controller, which reports it on its health check.
    assert!(options.cluster_cidr_error.as_deref().is_some_and(|e| e.contains("--cluster-cidr")));
    // Without the routes capability, or with routes off, the value is ignored.
    fake.set_capabilities(FakeCapabilities { routes: false, ..Default::default() });
    let mut options = s.options.clone();
    check_with_provider(&mut options, &fake).unwrap();
    assert!(options.cluster_cidr_error.is_none());
    let s = settings(&["--cluster-cidr=nonsense", "--configure-cloud-routes=false"]).unwrap();
    let mut options = s.options.clone();
    check_with_provider(&mut options, &FakeProvider::new()).unwrap();
    assert!(options.cluster_cidr_error.is_none());
    // A good dual-stack value parses.
    let s = settings(&["--cluster-cidr=10.244.0.0/16,fd00:10:244::/56"]).unwrap();
    assert_eq!(s.options.cluster_cidrs.len(), 2);
}
