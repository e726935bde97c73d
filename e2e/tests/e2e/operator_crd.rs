//! Operator scenario: at start the operator server-side applies the CRD it was built with
//! (`--manage-crd`, the chart's `crds.manage`), so `helm upgrade`, which never touches a chart's
//! `crds/`, still upgrades the CRD. Forbidden (RBAC without `patch`) it carries on with the CRD it
//! finds.
//!
//! On both backends: each scenario replaces the cluster's CRD with an older one first, and the
//! 403 comes from the fault injection (the genuine backend's fault proxy).

use std::time::Duration;

use crds::CloudControllerManager;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};
use kube::{Client, CustomResourceExt};
use operator::{CrdApply, OperatorConfig, OperatorHandle};
use serde_json::json;
use testkit::{Backend, FaultRule, TestCluster};

const CRD_PATH: &str = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions";

/// The CRD of an older release: no `paused` field and no `ProviderHealthy` column.
fn older_crd() -> CustomResourceDefinition {
    let mut crd = crds::crd();
    let version = &mut crd.spec.versions[0];
    if let Some(columns) = version.additional_printer_columns.as_mut() {
        columns.retain(|c| c.name != "ProviderHealthy");
    }
    let spec = version
        .schema
        .as_mut()
        .and_then(|s| s.open_api_v3_schema.as_mut())
        .and_then(|s| s.properties.as_mut())
        .and_then(|p| p.get_mut("spec"))
        .and_then(|s| s.properties.as_mut())
        .expect("the CRD has a spec schema");
    assert!(spec.remove("paused").is_some(), "the current CRD has spec.paused");
    crd
}

fn has_paused(crd: &CustomResourceDefinition) -> bool {
    crd.spec.versions[0]
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .and_then(|s| s.properties.as_ref())
        .and_then(|p| p.get("spec"))
        .and_then(|s| s.properties.as_ref())
        .is_some_and(|p| p.contains_key("paused"))
}

fn columns(crd: &CustomResourceDefinition) -> Vec<String> {
    crd.spec.versions[0].additional_printer_columns.iter().flatten().map(|c| c.name.clone()).collect()
}

/// A cluster holding the older CRD, written as `helm install` would (a plain create, or an
/// update where an earlier scenario on the shared genuine control plane left one).
async fn server_with_older_crd(backend: Backend) -> (TestCluster, Api<CustomResourceDefinition>) {
    let server = TestCluster::start_with_faults(backend).await.expect("the API server starts");
    let crds: Api<CustomResourceDefinition> = Api::all(server.client());
    let params = PostParams { field_manager: Some("helm".into()), ..Default::default() };
    let name = CloudControllerManager::crd_name();
    match crds.get_opt(name).await.expect("reading the CRD") {
        None => crds.create(&params, &older_crd()).await.expect("the older CRD is created"),
        Some(existing) => {
            let mut older = older_crd();
            older.metadata.resource_version = existing.metadata.resource_version;
            crds.replace(name, &params, &older).await.expect("the older CRD replaces the current one")
        }
    };
    let established = kube::runtime::wait::conditions::is_crd_established();
    tokio::time::timeout(
        Duration::from_secs(30),
        kube::runtime::wait::await_condition(crds.clone(), name, established),
    )
    .await
    .expect("the older CRD is established in time")
    .expect("the older CRD is established");
    (server, crds)
}

async fn start_operator(client: Client, manage_crd: bool) -> OperatorHandle {
    let mut config = OperatorConfig::new(client);
    config.manage_crd = manage_crd;
    config.timings.debounce = Duration::from_millis(50);
    operator::start(config).await.expect("the operator starts")
}

/// A CR the operator reconciles once it runs (its `ConfigValid` shows up).
async fn wait_reconciling(client: &Client) {
    let ccms: Api<CloudControllerManager> = Api::namespaced(client.clone(), "kube-system");
    let cr: CloudControllerManager = serde_json::from_value(json!({
        "apiVersion": "ccm.rs/v1alpha1", "kind": "CloudControllerManager",
        "metadata": {"name": "probe", "namespace": "kube-system"},
        "spec": {"provider": "no-such-provider"},
    }))
    .expect("a CloudControllerManager");
    ccms.create(&PostParams::default(), &cr).await.expect("the CR is created");
    for _ in 0..300 {
        let status = ccms.get_status("probe").await.ok().and_then(|c| c.status);
        if status.is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "ConfigValid")) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the operator never reconciled the CloudControllerManager");
}

fn crd_patches(server: &TestCluster) -> usize {
    let name = CloudControllerManager::crd_name();
    server
        .request_log()
        .filter(|r| r.verb == "patch" && r.path.trim_end_matches('/') == format!("{CRD_PATH}/{name}"))
        .iter()
        .filter(|r| r.field_manager.as_deref() == Some("ccm-operator"))
        .count()
}

/// Puts the current CRD back: on the genuine backend the control plane outlives this scenario,
/// and later turns of other modules in this test binary expect the CRD this build serves.
async fn restore_current_crd(server: &TestCluster) {
    server.faults().clear();
    server.install_crd(&crds::crd()).await.expect("the current CRD is restored");
}

testkit::backend_tests! {
    async fn an_older_crd_is_upgraded_to_the_operators_own_at_start(backend) {
        let (server, crds) = server_with_older_crd(backend).await;
        let before = crds.get(CloudControllerManager::crd_name()).await.unwrap();
        assert!(!has_paused(&before) && !columns(&before).contains(&"ProviderHealthy".to_string()));

        let op = start_operator(server.client(), true).await;
        wait_reconciling(&server.client()).await;

        let after = crds.get(CloudControllerManager::crd_name()).await.unwrap();
        assert!(has_paused(&after), "spec.paused is served after the operator started");
        assert_eq!(columns(&after), columns(&crds::crd()), "the printer columns are the operator's");
        let managers: Vec<String> =
            after.metadata.managed_fields.iter().flatten().filter_map(|m| m.manager.clone()).collect();
        assert!(managers.iter().any(|m| m == "ccm-operator"), "applied with field manager ccm-operator: {managers:?}");
        assert_eq!(crd_patches(&server), 1, "one apply at start");
        // The pool CRD the chart ships beside it is kept current the same way.
        let pool = crds.get(crds::LoadBalancerIPPool::crd_name()).await.expect("the pool CRD is applied");
        let pool_managers: Vec<String> =
            pool.metadata.managed_fields.iter().flatten().filter_map(|m| m.manager.clone()).collect();
        assert!(pool_managers.iter().any(|m| m == "ccm-operator"), "{pool_managers:?}");
        assert_eq!(columns(&pool), columns(&crds::pool_crd()));
        // And the announcers' ServiceAnnouncement CRD.
        let records = crds.get(crds::ServiceAnnouncement::crd_name()).await.expect("the announcement CRD is applied");
        assert_eq!(columns(&records), columns(&crds::announcement_crd()));
        op.stop().await.unwrap();
        drop(server);
    }
}

testkit::backend_tests! {
    async fn a_forbidden_crd_apply_is_logged_and_the_operator_still_starts(backend) {
        let (server, crds) = server_with_older_crd(backend).await;
        server.faults().add_rule(FaultRule {
            path_prefix: Some(CRD_PATH.into()),
            verbs: vec!["patch".into()],
            error_rate: 1.0,
            status: 403,
            ..Default::default()
        });
        let token = tokio_util::sync::CancellationToken::new();
        match operator::apply_crd(&server.client(), &token).await {
            CrdApply::Forbidden(_) => {}
            other => panic!("a 403 is reported as Forbidden, got {other:?}"),
        }

        let op = start_operator(server.client(), true).await;
        wait_reconciling(&server.client()).await;
        let after = crds.get(CloudControllerManager::crd_name()).await.unwrap();
        assert!(!has_paused(&after), "the CRD is left as it was");
        op.stop().await.unwrap();
        restore_current_crd(&server).await;
        drop(server);
    }
}

testkit::backend_tests! {
    async fn with_manage_crd_off_the_operator_only_reads_its_crd(backend) {
        let (server, crds) = server_with_older_crd(backend).await;
        let op = start_operator(server.client(), false).await;
        wait_reconciling(&server.client()).await;
        assert_eq!(crd_patches(&server), 0, "no apply of the CRD");
        assert!(!has_paused(&crds.get(CloudControllerManager::crd_name()).await.unwrap()));
        op.stop().await.unwrap();
        restore_current_crd(&server).await;
        drop(server);
    }
}
