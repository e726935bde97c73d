//! Create, get, update, delete and the Status errors.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, NodeStatus, Pod};
use kube::Discovery;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::common::*;

#[tokio::test]
async fn create_sets_uid_timestamp_resource_version_and_generation() {
    let s = server().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    let cm = cms.create(&PostParams::default(), &config_map("a", &[("k", "v")])).await.unwrap();
    let m = &cm.metadata;
    assert_eq!(m.namespace.as_deref(), Some("default"));
    assert_eq!(m.uid.as_ref().unwrap().len(), 36);
    assert!(m.creation_timestamp.is_some());
    assert!(m.resource_version.as_ref().unwrap().parse::<u64>().unwrap() > 0);
    // ConfigMaps have no spec to version: a genuine server sets no generation.
    assert_eq!(m.generation, None);
    let got = cms.get("a").await.unwrap();
    assert_eq!(got.metadata.uid, m.uid);
    assert_eq!(got.data.unwrap()["k"], "v");
}

#[tokio::test]
async fn generate_name_appends_a_random_suffix() {
    let s = server().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    let mut cm = config_map("", &[]);
    cm.metadata.name = None;
    cm.metadata.generate_name = Some("gen-".into());
    let a = cms.create(&PostParams::default(), &cm).await.unwrap();
    let b = cms.create(&PostParams::default(), &cm).await.unwrap();
    let (a, b) = (a.metadata.name.unwrap(), b.metadata.name.unwrap());
    assert!(a.starts_with("gen-") && a.len() == 9, "{a}");
    assert_ne!(a, b);
}

#[tokio::test]
async fn errors_are_status_objects_with_reason_and_code() {
    let s = server().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    let e = api_err(cms.get("missing").await);
    assert_eq!((e.code, e.reason.as_str()), (404, "NotFound"));
    assert_eq!(e.message, "configmaps \"missing\" not found");

    cms.create(&PostParams::default(), &config_map("dup", &[])).await.unwrap();
    let e = api_err(cms.create(&PostParams::default(), &config_map("dup", &[])).await);
    assert_eq!((e.code, e.reason.as_str()), (409, "AlreadyExists"));

    let e = api_err(cms.create(&PostParams::default(), &config_map("Not_Valid", &[])).await);
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));

    let mut nameless = config_map("", &[]);
    nameless.metadata.name = None;
    let e = api_err(cms.create(&PostParams::default(), &nameless).await);
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));

    let other_ns: Api<ConfigMap> = Api::namespaced(s.client(), "nope");
    let e = api_err(other_ns.create(&PostParams::default(), &config_map("x", &[])).await);
    assert_eq!((e.code, e.reason.as_str()), (404, "NotFound"));
}

#[tokio::test]
async fn raw_http_errors_cover_bad_request_method_and_media_type() {
    let s = server().await;
    let c = s.client();
    let send = |method: &str, path: &str, ct: &str, body: &str| {
        let req = http::Request::builder()
            .method(method)
            .uri(path)
            .header("content-type", ct)
            .body(body.as_bytes().to_vec())
            .unwrap();
        let c = c.clone();
        async move { c.request_text(req).await }
    };
    let e = api_err(send("POST", "/api/v1/namespaces/default/configmaps", "application/json", "{not json").await);
    assert_eq!((e.code, e.reason.as_str()), (400, "BadRequest"));
    let e = api_err(send("POST", "/api/v1/namespaces/default/configmaps/x", "application/json", "{}").await);
    assert_eq!((e.code, e.reason.as_str()), (405, "MethodNotAllowed"));
    send("POST", "/api/v1/namespaces/default/configmaps", "application/json", r#"{"metadata":{"name":"x"}}"#)
        .await
        .unwrap();
    let e = api_err(send("PATCH", "/api/v1/namespaces/default/configmaps/x", "text/plain", "{}").await);
    assert_eq!((e.code, e.reason.as_str()), (415, "UnsupportedMediaType"));
    let e = api_err(send("GET", "/api/v1/nopes", "application/json", "").await);
    assert_eq!(e.code, 404);
}

#[tokio::test]
async fn update_with_stale_resource_version_conflicts() {
    let s = server().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    let v1 = cms.create(&PostParams::default(), &config_map("c", &[("n", "1")])).await.unwrap();
    let mut a = v1.clone();
    a.data = Some([("n".to_string(), "2".to_string())].into());
    let v2 = cms.replace("c", &PostParams::default(), &a).await.unwrap();
    assert_ne!(v2.metadata.resource_version, v1.metadata.resource_version);
    let mut stale = v1.clone();
    stale.data = Some([("n".to_string(), "3".to_string())].into());
    let e = api_err(cms.replace("c", &PostParams::default(), &stale).await);
    assert_eq!((e.code, e.reason.as_str()), (409, "Conflict"));
    assert!(e.message.contains("the object has been modified"), "{}", e.message);
    // Without a resourceVersion the update is unconditional.
    stale.metadata.resource_version = None;
    cms.replace("c", &PostParams::default(), &stale).await.unwrap();
    assert_eq!(cms.get("c").await.unwrap().data.unwrap()["n"], "3");
}

#[tokio::test]
async fn generation_bumps_only_for_spec_changes() {
    let s = server().await;
    let deployments: Api<Deployment> = Api::default_namespaced(s.client());
    let d: Deployment = serde_json::from_value(json!({"metadata": {"name": "d"}, "spec": {"replicas": 1}})).unwrap();
    deployments.create(&PostParams::default(), &d).await.unwrap();
    let pp = PatchParams::default();
    let labelled =
        deployments.patch("d", &pp, &Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}}))).await.unwrap();
    assert_eq!(labelled.metadata.generation, Some(1));
    let spec = deployments.patch("d", &pp, &Patch::Merge(json!({"spec": {"replicas": 2}}))).await.unwrap();
    assert_eq!(spec.metadata.generation, Some(2));
    let same = deployments.patch("d", &pp, &Patch::Merge(json!({"spec": {"replicas": 2}}))).await.unwrap();
    assert_eq!(same.metadata.generation, Some(2));
    // Types without a generation (Leases, ConfigMaps) never get one.
    let leases: Api<Lease> = Api::default_namespaced(s.client());
    let l = Lease { metadata: ObjectMeta { name: Some("l".into()), ..Default::default() }, ..Default::default() };
    leases.create(&PostParams::default(), &l).await.unwrap();
    let spec = leases.patch("l", &pp, &Patch::Merge(json!({"spec": {"holderIdentity": "me"}}))).await.unwrap();
    assert_eq!(spec.metadata.generation, None);
}

#[tokio::test]
async fn status_subresource_isolates_status_from_spec() {
    let s = server().await;
    let nodes: Api<Node> = Api::all(s.client());
    create_node(&s.client(), "n1").await;
    let pp = PatchParams::default();
    // Writes to the main resource ignore status.
    let n = nodes
        .patch("n1", &pp, &Patch::Merge(json!({"spec": {"podCIDR": "10.0.0.0/24"}, "status": {"phase": "Running"}})))
        .await
        .unwrap();
    assert_eq!(n.spec.unwrap().pod_cidr.as_deref(), Some("10.0.0.0/24"));
    assert!(n.status.as_ref().and_then(|s| s.phase.as_ref()).is_none());
    // Writes to /status ignore spec but may change labels.
    let n = nodes
        .patch_status(
            "n1",
            &pp,
            &Patch::Merge(json!({"spec": {"podCIDR": "10.9.9.0/24"}, "metadata": {"labels": {"x": "y"}}, "status": {"phase": "Running"}})),
        )
        .await
        .unwrap();
    assert_eq!(n.spec.unwrap().pod_cidr.as_deref(), Some("10.0.0.0/24"));
    assert_eq!(n.status.unwrap().phase.as_deref(), Some("Running"));
    assert_eq!(n.metadata.labels.unwrap()["x"], "y");
    // PUT on /status with a changed spec keeps the spec too.
    let mut cur = nodes.get("n1").await.unwrap();
    cur.spec.as_mut().unwrap().unschedulable = Some(true);
    cur.status = Some(NodeStatus { phase: Some("Terminated".into()), ..Default::default() });
    let n = nodes.replace_status("n1", &PostParams::default(), &cur).await.unwrap();
    assert_eq!(n.spec.unwrap().unschedulable, None);
    assert_eq!(n.status.unwrap().phase.as_deref(), Some("Terminated"));
}

#[tokio::test]
async fn pods_start_pending_and_dry_run_stores_nothing() {
    let s = server().await;
    let pods: Api<Pod> = Api::default_namespaced(s.client());
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
        "status": {"phase": "Running"}
    }))
    .unwrap();
    let dry = pods.create(&PostParams { dry_run: true, ..Default::default() }, &pod).await.unwrap();
    assert_eq!(dry.metadata.name.as_deref(), Some("p"));
    assert_eq!(api_err(pods.get("p").await).code, 404);
    let p = pods.create(&PostParams::default(), &pod).await.unwrap();
    assert_eq!(p.status.unwrap().phase.as_deref(), Some("Pending"));
    pods.delete("p", &DeleteParams { dry_run: true, ..Default::default() }).await.unwrap();
    assert!(pods.get("p").await.is_ok());
    pods.delete("p", &DeleteParams::default()).await.unwrap();
    assert_eq!(api_err(pods.get("p").await).code, 404);
}

#[tokio::test]
async fn default_namespaces_exist_and_discovery_lists_builtin_groups() {
    let s = server().await;
    let nss: Api<Namespace> = Api::all(s.client());
    for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        let n = nss.get(ns).await.unwrap();
        assert_eq!(n.status.unwrap().phase.as_deref(), Some("Active"));
    }
    let d = Discovery::new(s.client()).run().await.unwrap();
    let groups: Vec<String> = d.groups().map(|g| g.name().to_string()).collect();
    for g in [
        "",
        "apps",
        "coordination.k8s.io",
        "events.k8s.io",
        "rbac.authorization.k8s.io",
        "policy",
        "apiextensions.k8s.io",
    ] {
        assert!(groups.iter().any(|x| x == g), "missing group {g:?} in {groups:?}");
    }
    let v = s.client().apiserver_version().await.unwrap();
    assert_eq!(v.major, "1");
}

#[tokio::test]
async fn events_are_shared_between_core_and_events_k8s_io() {
    use k8s_openapi::api::core::v1::Event as CoreEvent;
    use k8s_openapi::api::events::v1::Event;
    let s = server().await;
    let v1: Api<Event> = Api::default_namespaced(s.client());
    let ev: Event = serde_json::from_value(json!({
        "metadata": {"name": "e1"},
        "eventTime": "2024-01-01T00:00:00.000000Z",
        "reportingController": "ctl",
        "reportingInstance": "ctl-1",
        "action": "Sync",
        "reason": "Synced",
        "note": "hello",
        "type": "Normal",
        "regarding": {"kind": "Node", "name": "n1", "apiVersion": "v1"}
    }))
    .unwrap();
    v1.create(&PostParams::default(), &ev).await.unwrap();
    let core: Api<CoreEvent> = Api::default_namespaced(s.client());
    let lp = kube::api::ListParams::default().fields("involvedObject.kind=Node,involvedObject.name=n1");
    let list = core.list(&lp).await.unwrap();
    assert_eq!(list.items.len(), 1);
    assert_eq!(list.items[0].message.as_deref(), Some("hello"));
    let none = core.list(&kube::api::ListParams::default().fields("involvedObject.name=other")).await.unwrap();
    assert!(none.items.is_empty());
}
