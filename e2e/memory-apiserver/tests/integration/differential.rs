//! The differential test: the same request sequence against the local server and a genuine
//! kube-apiserver, responses compared after dropping what is volatile (uids, resourceVersions,
//! timestamps, random name suffixes, allocated addresses). Every remaining difference is either
//! fixed in the local server or listed as deliberate in `e2e/README.md` and in [`DELIBERATE`].

use std::collections::BTreeMap;

use http::Method;
use k8s_openapi::api::core::v1::Namespace;
use kube::Client;
use kube::api::Api;
use serde_json::{Value, json};
use testkit::{Backend, TestCluster};

const CRD: &str = "widgets.diff.ccm.rs";

/// Differences that are deliberate, as `(step or "*", JSON pointer prefix)`; each has its reason
/// in `e2e/README.md` ("Deliberate differences from a genuine API server").
const DELIBERATE: &[(&str, &str)] = &[
    // Update operations record the fields the client sent, not the server's defaults or `.` markers.
    ("*", "/metadata/managedFields"),
    // List items keep their apiVersion and kind (served from per-object encodings).
    ("*", "/items/"),
    // The local server is single-stack; the harness's genuine one is dual-stack.
    ("service headless", "/spec/ipFamil"),
    // A failed JSON-patch `test` operation names the operation that failed.
    ("json patch failing test", "/"),
    // The genuine server reports this cause twice (two validation passes); the local one once.
    ("add finalizer while deleting", "/"),
    // The last finalizer's removal answers with the object as it was before the final delete.
    ("remove finalizer", "/metadata/finalizers"),
];

/// One request of the sequence.
struct Step {
    name: &'static str,
    method: Method,
    path: String,
    content_type: &'static str,
    body: Option<Value>,
}

fn step(name: &'static str, method: Method, path: impl Into<String>, body: Option<Value>) -> Step {
    Step { name, method, path: path.into(), content_type: "application/json", body }
}

fn patch(name: &'static str, path: impl Into<String>, content_type: &'static str, body: Value) -> Step {
    Step { name, method: Method::PATCH, path: path.into(), content_type, body: Some(body) }
}

fn test_crd() -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD},
        "spec": {
            "group": "diff.ccm.rs",
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
            "versions": [{
                "name": "v1",
                "served": true,
                "storage": true,
                "subresources": {"status": {}},
                "additionalPrinterColumns": [{"name": "Size", "type": "string", "jsonPath": ".spec.size"}],
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "properties": {
                        "spec": {
                            "type": "object",
                            "required": ["size"],
                            "x-kubernetes-validations": [
                                {"rule": "self.replicas <= 5 || self.size == 'large'", "message": "more than 5 replicas need size large"},
                                {"rule": "self.size == oldSelf.size", "message": "size is immutable"}
                            ],
                            "properties": {
                                "size": {"type": "string", "enum": ["small", "large"]},
                                "label": {"type": "string", "maxLength": 8, "default": "none"},
                                "replicas": {"type": "integer", "format": "int32", "minimum": 0, "maximum": 10, "default": 1},
                                "ports": {"type": "array", "maxItems": 2, "items": {"type": "integer"}},
                                "mode": {"type": "string", "default": "Deployment"}
                            }
                        },
                        "status": {"type": "object", "properties": {"ready": {"type": "boolean"}, "message": {"type": "string", "maxLength": 32768}}}
                    }
                }}
            }]
        }
    })
}

fn sequence(ns: &str) -> Vec<Step> {
    let cms = format!("/api/v1/namespaces/{ns}/configmaps");
    let widgets = format!("/apis/diff.ccm.rs/v1/namespaces/{ns}/widgets");
    let svcs = format!("/api/v1/namespaces/{ns}/services");
    let cm = |name: &str, labels: Value| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "labels": labels}, "data": {"k": "v"}});
    let widget = |name: &str, spec: Value| json!({"apiVersion": "diff.ccm.rs/v1", "kind": "Widget", "metadata": {"name": name}, "spec": spec});
    let svc = |name: &str, spec: Value| json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name}, "spec": spec});
    let long = "x".repeat(32_769);
    vec![
        // CRUD and generateName.
        step("create configmap", Method::POST, &cms, Some(cm("a", json!({"app": "web", "tier": "front"})))),
        step("create duplicate", Method::POST, &cms, Some(cm("a", json!({})))),
        step("create b", Method::POST, &cms, Some(cm("b", json!({"app": "web", "tier": "back"})))),
        step("create c", Method::POST, &cms, Some(cm("c", json!({"app": "db"})))),
        step(
            "create with generateName",
            Method::POST,
            &cms,
            Some(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"generateName": "gen-"}})),
        ),
        step("create invalid label", Method::POST, &cms, Some(cm("d", json!({"bad key!": "x"})))),
        step("get", Method::GET, format!("{cms}/a"), None),
        step("get missing", Method::GET, format!("{cms}/missing"), None),
        step(
            "update stale",
            Method::PUT,
            format!("{cms}/a"),
            Some({
                let mut v = cm("a", json!({"app": "web"}));
                v["metadata"]["resourceVersion"] = json!("1");
                v
            }),
        ),
        // Selectors and pagination.
        step("list by label", Method::GET, format!("{cms}?labelSelector=app%3Dweb"), None),
        step("list by set label", Method::GET, format!("{cms}?labelSelector=tier%20in%20(back)"), None),
        step("list by field", Method::GET, format!("{cms}?fieldSelector=metadata.name%3Db"), None),
        step("list page 1", Method::GET, format!("{cms}?limit=2"), None),
        // Patches.
        patch(
            "json patch",
            format!("{cms}/a"),
            "application/json-patch+json",
            json!([{"op": "add", "path": "/data/j", "value": "1"}]),
        ),
        patch(
            "json patch failing test",
            format!("{cms}/a"),
            "application/json-patch+json",
            json!([{"op": "test", "path": "/data/k", "value": "nope"}]),
        ),
        patch(
            "merge patch",
            format!("{cms}/a"),
            "application/merge-patch+json",
            json!({"data": {"k": null, "m": "2"}}),
        ),
        patch(
            "strategic merge patch",
            format!("{cms}/a"),
            "application/strategic-merge-patch+json",
            json!({"metadata": {"labels": {"s": "1"}}}),
        ),
        // Server-side apply: ownership and conflicts.
        patch(
            "apply by one",
            format!("{cms}/applied?fieldManager=one"),
            "application/apply-patch+yaml",
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "applied"}, "data": {"x": "1"}}),
        ),
        patch(
            "apply conflict by two",
            format!("{cms}/applied?fieldManager=two"),
            "application/apply-patch+yaml",
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "applied"}, "data": {"x": "2"}}),
        ),
        patch(
            "apply forced by two",
            format!("{cms}/applied?fieldManager=two&force=true"),
            "application/apply-patch+yaml",
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "applied"}, "data": {"x": "2"}}),
        ),
        // Finalizers and deletion.
        patch(
            "add finalizer",
            format!("{cms}/b"),
            "application/merge-patch+json",
            json!({"metadata": {"finalizers": ["diff.ccm.rs/hold"]}}),
        ),
        step("delete held", Method::DELETE, format!("{cms}/b"), None),
        step("get held", Method::GET, format!("{cms}/b"), None),
        patch(
            "add finalizer while deleting",
            format!("{cms}/b"),
            "application/merge-patch+json",
            json!({"metadata": {"finalizers": ["diff.ccm.rs/hold", "diff.ccm.rs/late"]}}),
        ),
        patch(
            "remove finalizer",
            format!("{cms}/b"),
            "application/merge-patch+json",
            json!({"metadata": {"finalizers": null}}),
        ),
        step("get deleted", Method::GET, format!("{cms}/b"), None),
        // Custom resources: defaulting, schema and CEL, status isolation.
        step("widget defaulted", Method::POST, &widgets, Some(widget("w1", json!({"size": "small"})))),
        step("widget bad enum", Method::POST, &widgets, Some(widget("w2", json!({"size": "huge"})))),
        step("widget missing required", Method::POST, &widgets, Some(widget("w3", json!({"label": "a"})))),
        step(
            "widget too long",
            Method::POST,
            &widgets,
            Some(widget("w4", json!({"size": "small", "label": "123456789"}))),
        ),
        step(
            "widget above maximum",
            Method::POST,
            &widgets,
            Some(widget("w5", json!({"size": "large", "replicas": 11}))),
        ),
        step(
            "widget too many items",
            Method::POST,
            &widgets,
            Some(widget("w6", json!({"size": "small", "ports": [1, 2, 3]}))),
        ),
        step(
            "widget wrong type",
            Method::POST,
            &widgets,
            Some(widget("w7", json!({"size": "small", "replicas": "two"}))),
        ),
        step("widget cel rule", Method::POST, &widgets, Some(widget("w8", json!({"size": "small", "replicas": 6})))),
        step(
            "widget unknown field pruned",
            Method::POST,
            &widgets,
            Some(widget("w9", json!({"size": "small", "extra": true}))),
        ),
        patch(
            "widget cel transition",
            format!("{widgets}/w1"),
            "application/merge-patch+json",
            json!({"spec": {"size": "large"}}),
        ),
        patch(
            "widget status via main resource",
            format!("{widgets}/w1"),
            "application/merge-patch+json",
            json!({"status": {"ready": true}}),
        ),
        patch(
            "widget spec via status",
            format!("{widgets}/w1/status"),
            "application/merge-patch+json",
            json!({"spec": {"replicas": 3}, "status": {"ready": true}}),
        ),
        patch(
            "widget status message too long",
            format!("{widgets}/w1/status"),
            "application/merge-patch+json",
            json!({"status": {"message": long}}),
        ),
        step("widget get", Method::GET, format!("{widgets}/w1"), None),
        // Services: allocation and type changes.
        step("service cluster ip", Method::POST, &svcs, Some(svc("s1", json!({"ports": [{"port": 80}]})))),
        step(
            "service load balancer",
            Method::POST,
            &svcs,
            Some(svc("s2", json!({"type": "LoadBalancer", "ports": [{"port": 80}]}))),
        ),
        step(
            "service load balancer with class",
            Method::POST,
            &svcs,
            Some(svc(
                "s3",
                json!({"type": "LoadBalancer", "loadBalancerClass": "example.com/lb", "ports": [{"port": 443}]}),
            )),
        ),
        patch(
            "service to cluster ip",
            format!("{svcs}/s2"),
            "application/merge-patch+json",
            json!({"spec": {"type": "ClusterIP"}}),
        ),
        patch(
            "service lb class to cluster ip",
            format!("{svcs}/s3"),
            "application/merge-patch+json",
            json!({"spec": {"type": "ClusterIP", "loadBalancerClass": null}}),
        ),
        patch(
            "service cluster ip to node port",
            format!("{svcs}/s1"),
            "application/merge-patch+json",
            json!({"spec": {"type": "NodePort"}}),
        ),
        step("service bad port", Method::POST, &svcs, Some(svc("s4", json!({"ports": [{"port": 70000}]})))),
        step(
            "service headless",
            Method::POST,
            &svcs,
            Some(svc("s5", json!({"clusterIP": "None", "ports": [{"port": 80}]}))),
        ),
    ]
}

/// Sends a step; returns the status code and the body as JSON (or as a string).
async fn send(client: &Client, s: &Step) -> (u16, Value) {
    let body = s.body.as_ref().map(|b| serde_json::to_vec(b).expect("json")).unwrap_or_default();
    let req = http::Request::builder()
        .method(s.method.clone())
        .uri(&s.path)
        .header(http::header::CONTENT_TYPE, s.content_type)
        .header(http::header::ACCEPT, "application/json")
        .body(kube::client::Body::from(body))
        .expect("request");
    let res = client.send(req).await.unwrap_or_else(|e| panic!("{}: {e}", s.name));
    let code = res.status().as_u16();
    let bytes = http_body_util::BodyExt::collect(res.into_body()).await.expect("body").to_bytes();
    let value =
        serde_json::from_slice(&bytes).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()));
    (code, value)
}

/// Drops what legitimately differs between two servers.
fn normalize(v: &mut Value) {
    match v {
        Value::Object(map) => {
            for k in ["uid", "resourceVersion", "creationTimestamp", "deletionTimestamp", "time", "selfLink"] {
                if let Some(x) = map.get_mut(k) {
                    *x = json!("<volatile>");
                }
            }
            if let (Some(Value::String(g)), Some(Value::String(n))) =
                (map.get("generateName").cloned(), map.get_mut("name"))
                && n.starts_with(&g)
            {
                *n = format!("{g}<random>");
            }
            for k in ["clusterIP", "nodePort", "continue"] {
                if let Some(x) = map.get_mut(k)
                    && x.as_str() != Some("None")
                    && !x.is_null()
                {
                    *x = json!(format!("<{k}>"));
                }
            }
            if let Some(Value::Array(ips)) = map.get_mut("clusterIPs") {
                for ip in ips.iter_mut().filter(|ip| ip.as_str() != Some("None")) {
                    *ip = json!("<clusterIP>");
                }
            }
            for x in map.values_mut() {
                normalize(x);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(normalize),
        _ => {}
    }
}

/// Leaf differences as `pointer: local != genuine`.
fn differences(path: &str, local: &Value, genuine: &Value, out: &mut Vec<(String, String)>) {
    match (local, genuine) {
        (Value::Object(a), Value::Object(b)) => {
            let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for k in keys {
                let (x, y) = (a.get(k).unwrap_or(&Value::Null), b.get(k).unwrap_or(&Value::Null));
                differences(&format!("{path}/{k}"), x, y, out);
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                differences(&format!("{path}/{i}"), x, y, out);
            }
        }
        (a, b) if a != b => out.push((path.to_string(), format!("local {} != genuine {}", short(a), short(b)))),
        _ => {}
    }
}

fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.len() > 300 { format!("{}...", &s[..300]) } else { s }
}

/// Sets up both servers the same way: the test CRD and one namespace of the same name.
async fn prepare(cluster: &TestCluster, ns: &str) {
    let crd: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition =
        serde_json::from_value(test_crd()).expect("crd");
    cluster.install_crd(&crd).await.expect("the CRD is established");
    let namespaces: Api<Namespace> = Api::all(cluster.client());
    let body: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}})).expect("namespace");
    namespaces.create(&Default::default(), &body).await.expect("namespace");
}

/// Every difference in the sequence's responses between the two servers, by step.
async fn compare_sequences(
    local: &TestCluster,
    genuine: &TestCluster,
    ns: &str,
) -> BTreeMap<String, Vec<(String, String)>> {
    let mut found = BTreeMap::new();
    let (lc, gc) = (local.client(), genuine.client());
    for s in sequence(ns) {
        let ((lcode, mut lbody), (gcode, mut gbody)) = (send(&lc, &s).await, send(&gc, &s).await);
        normalize(&mut lbody);
        normalize(&mut gbody);
        let mut diffs = vec![];
        if lcode != gcode {
            diffs.push(("(status code)".to_string(), format!("local {lcode} != genuine {gcode}")));
        }
        differences("", &lbody, &gbody, &mut diffs);
        diffs.retain(|(path, _)| {
            !DELIBERATE.iter().any(|(name, prefix)| (*name == "*" || *name == s.name) && path.starts_with(prefix))
        });
        if !diffs.is_empty() {
            found.insert(s.name.to_string(), diffs);
        }
    }
    found
}

/// Every Service address a server handed out in the namespace; none is the range's first.
async fn cluster_ips(cluster: &TestCluster, ns: &str) -> Vec<String> {
    let svcs: Api<k8s_openapi::api::core::v1::Service> = Api::namespaced(cluster.client(), ns);
    let list = svcs.list(&Default::default()).await.expect("services");
    list.items.iter().filter_map(|s| s.spec.as_ref()?.cluster_ip.clone()).filter(|ip| ip != "None").collect()
}

/// A list at an old resourceVersion (`resourceVersionMatch=Exact`) is `410 Expired` on both
/// servers once history is compacted (at once on the local server, which keeps none; by the
/// genuine server's periodic etcd compaction, every 10 s in the harness).
async fn expired_list(cluster: &TestCluster, ns: &str) -> Value {
    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(cluster.client(), ns);
    let old = cms.list_metadata(&Default::default()).await.expect("list").metadata.resource_version.unwrap_or_default();
    let body: k8s_openapi::api::core::v1::ConfigMap =
        serde_json::from_value(json!({"metadata": {"generateName": "churn-"}})).expect("configmap");
    cms.create(&Default::default(), &body).await.expect("a write after the old version");
    let params = kube::api::ListParams::default().at(&old).matching(kube::api::VersionMatch::Exact);
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(45);
    loop {
        match cms.list_metadata(&params).await {
            Err(kube::Error::Api(e)) => return json!({"code": e.code, "reason": e.reason}),
            Ok(_) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                // Compaction keeps the latest revision: keep writing so `old` falls behind it.
                cms.create(&Default::default(), &body).await.expect("churn");
            }
            other => return json!(format!("{other:?}")),
        }
    }
}

/// A watch from a list's resourceVersion, bookmarks allowed, over a create, an update and a
/// delete: the event types and objects in order (bookmarks checked to carry only a version).
async fn watched_events(cluster: &TestCluster, ns: &str) -> Vec<String> {
    use futures::StreamExt;
    use kube::api::{WatchEvent, WatchParams};
    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(cluster.client(), ns);
    let version =
        cms.list_metadata(&Default::default()).await.expect("list").metadata.resource_version.unwrap_or_default();
    let mut stream = cms.watch(&WatchParams::default().timeout(10), &version).await.expect("watch").boxed();
    let body: k8s_openapi::api::core::v1::ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "watched"}, "data": {"k": "1"}})).expect("configmap");
    cms.create(&Default::default(), &body).await.expect("create");
    let patch = kube::api::Patch::Merge(json!({"data": {"k": "2"}}));
    cms.patch("watched", &Default::default(), &patch).await.expect("update");
    cms.delete("watched", &Default::default()).await.expect("delete");
    let mut seen = vec![];
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while seen.len() < 3 {
        let next = tokio::time::timeout_at(deadline, stream.next()).await;
        match next {
            Ok(Some(Ok(WatchEvent::Added(o)))) => seen.push(format!("ADDED {}", o.metadata.name.unwrap_or_default())),
            Ok(Some(Ok(WatchEvent::Modified(o)))) => {
                let k = o.data.as_ref().and_then(|d| d.get("k")).cloned().unwrap_or_default();
                seen.push(format!("MODIFIED {} k={k}", o.metadata.name.unwrap_or_default()))
            }
            Ok(Some(Ok(WatchEvent::Deleted(o)))) => {
                seen.push(format!("DELETED {}", o.metadata.name.unwrap_or_default()))
            }
            Ok(Some(Ok(WatchEvent::Bookmark(b)))) => assert!(!b.metadata.resource_version.is_empty()),
            other => {
                seen.push(format!("unexpected {other:?}"));
                break;
            }
        }
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_and_genuine_servers_answer_the_same_sequence_alike() {
    if !Backend::genuine_available() {
        return;
    }
    let genuine = TestCluster::start(Backend::Genuine).await.expect("genuine");
    let local = TestCluster::start(Backend::Local).await.expect("local");
    let ns = format!("diff-{}", std::process::id());
    prepare(&local, &ns).await;
    prepare(&genuine, &ns).await;
    let found = compare_sequences(&local, &genuine, &ns).await;
    let watched = (watched_events(&local, &ns).await, watched_events(&genuine, &ns).await);
    assert_eq!(watched.0, ["ADDED watched", "MODIFIED watched k=2", "DELETED watched"], "local watch");
    assert_eq!(watched.0, watched.1, "watch from a resourceVersion");

    for cluster in [&local, &genuine] {
        let first = if cluster.is_genuine() { "10.0.0.1" } else { "10.96.0.1" };
        let ips = cluster_ips(cluster, &ns).await;
        assert!(!ips.is_empty() && !ips.iter().any(|ip| ip == first), "{:?}: {ips:?}", cluster.backend());
    }
    let (report_first, expired) =
        (found.is_empty(), (expired_list(&local, &ns).await, expired_list(&genuine, &ns).await));

    let report: Vec<String> =
        found.iter().flat_map(|(step, diffs)| diffs.iter().map(move |(p, d)| format!("{step}: {p}: {d}"))).collect();
    assert!(report.is_empty(), "{} differences:\n{}", report.len(), report.join("\n"));
    assert!(report_first);
    assert_eq!(expired.0, json!({"code": 410, "reason": "Expired"}), "local: 410 after compaction");
    assert_eq!(expired.0, expired.1, "410 after compaction");
}
