//! Merge, JSON, strategic merge patches and server-side apply with field ownership.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::common::*;

#[tokio::test]
async fn merge_patch_sets_and_null_removes_keys() {
    let s = server().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    cms.create(&PostParams::default(), &config_map("m", &[("a", "1"), ("b", "2")])).await.unwrap();
    let cm = cms
        .patch("m", &PatchParams::default(), &Patch::Merge(json!({"data": {"a": "9", "b": null, "c": "3"}})))
        .await
        .unwrap();
    let data = cm.data.unwrap();
    assert_eq!(
        (data.get("a").map(String::as_str), data.get("b"), data.get("c").map(String::as_str)),
        (Some("9"), None, Some("3"))
    );
}

#[tokio::test]
async fn json_patch_applies_operations_and_failed_test_is_rejected() {
    let s = server().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    cms.create(&PostParams::default(), &config_map("j", &[("a", "1")])).await.unwrap();
    let path = "/api/v1/namespaces/default/configmaps/j";
    let ct = "application/json-patch+json";
    let ops = json!([
        {"op": "test", "path": "/data/a", "value": "1"},
        {"op": "replace", "path": "/data/a", "value": "2"},
        {"op": "add", "path": "/data/b", "value": "x"}
    ]);
    let cm: ConfigMap = serde_json::from_str(&raw(&s.client(), "PATCH", path, ct, &ops).await.unwrap()).unwrap();
    assert_eq!(cm.data.as_ref().unwrap()["a"], "2");
    assert_eq!(cm.data.as_ref().unwrap()["b"], "x");
    let failing = json!([
        {"op": "test", "path": "/data/a", "value": "1"},
        {"op": "remove", "path": "/data/a"}
    ]);
    let e = api_err(raw(&s.client(), "PATCH", path, ct, &failing).await);
    assert_eq!(e.code, 422);
    assert_eq!(cms.get("j").await.unwrap().data.unwrap()["a"], "2", "a failed patch changes nothing");
}

#[tokio::test]
async fn strategic_merge_patch_merges_keyed_lists() {
    let s = server().await;
    let deps: Api<Deployment> = Api::default_namespaced(s.client());
    let d: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "d", "finalizers": ["a/x"]},
        "spec": {
            "selector": {"matchLabels": {"app": "d"}},
            "template": {
                "metadata": {"labels": {"app": "d"}},
                "spec": {
                    "containers": [
                        {"name": "main", "image": "main:1", "ports": [{"containerPort": 80}], "env": [{"name": "A", "value": "1"}]},
                        {"name": "side", "image": "side:1"}
                    ],
                    "volumes": [{"name": "v1", "emptyDir": {}}],
                    "tolerations": [{"key": "t1", "operator": "Exists"}]
                }
            }
        }
    }))
    .unwrap();
    deps.create(&PostParams::default(), &d).await.unwrap();
    let patch = json!({
        "metadata": {"finalizers": ["a/y"]},
        "spec": {"template": {"spec": {
            "containers": [
                {"name": "main", "image": "main:2", "ports": [{"containerPort": 443}], "env": [{"name": "B", "value": "2"}]},
                {"name": "side", "$patch": "delete"}
            ],
            "volumes": [{"name": "v2", "emptyDir": {}}],
            "tolerations": [{"key": "t2", "operator": "Exists"}]
        }}}
    });
    let d = deps.patch("d", &PatchParams::default(), &Patch::Strategic(patch)).await.unwrap();
    assert_eq!(d.metadata.finalizers.unwrap(), vec!["a/x", "a/y"], "finalizers merge as a set");
    let pod = d.spec.unwrap().template.spec.unwrap();
    assert_eq!(pod.containers.len(), 1);
    let main = &pod.containers[0];
    assert_eq!(main.image.as_deref(), Some("main:2"));
    assert_eq!(main.ports.as_ref().unwrap().len(), 2, "ports merge by containerPort");
    assert_eq!(main.env.as_ref().unwrap().len(), 2, "env merges by name");
    assert_eq!(pod.volumes.unwrap().len(), 2, "volumes merge by name");
    assert_eq!(pod.tolerations.unwrap().len(), 1, "tolerations are replaced as a list");
}

#[tokio::test]
async fn strategic_merge_patch_merges_taints_and_conditions() {
    let s = server().await;
    let nodes: Api<Node> = Api::all(s.client());
    let n: Node = serde_json::from_value(json!({
        "metadata": {"name": "n"},
        "spec": {"taints": [{"key": "a", "effect": "NoSchedule"}, {"key": "b", "effect": "NoSchedule"}]},
        "status": {"conditions": [{"type": "Ready", "status": "False"}, {"type": "DiskPressure", "status": "False"}]}
    }))
    .unwrap();
    nodes.create(&PostParams::default(), &n).await.unwrap();
    let n = nodes
        .patch(
            "n",
            &PatchParams::default(),
            &Patch::Strategic(
                json!({"spec": {"taints": [{"key": "a", "$patch": "delete"}, {"key": "c", "effect": "NoExecute"}]}}),
            ),
        )
        .await
        .unwrap();
    let keys: Vec<String> = n.spec.unwrap().taints.unwrap().into_iter().map(|t| t.key).collect();
    assert_eq!(keys, vec!["b", "c"]);
    let n = nodes
        .patch_status(
            "n",
            &PatchParams::default(),
            &Patch::Strategic(json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}})),
        )
        .await
        .unwrap();
    let conds = n.status.unwrap().conditions.unwrap();
    assert_eq!(conds.len(), 2);
    assert_eq!(conds.iter().find(|c| c.type_ == "Ready").unwrap().status, "True");
}

#[tokio::test]
async fn strategic_merge_patch_is_unsupported_for_custom_resources() {
    let s = server().await;
    s.install_crd(&crate::crd::widget_crd("Namespaced")).await.unwrap();
    let api = crate::crd::widgets(&s, Some("default"));
    api.create(&PostParams::default(), &crate::crd::widget("w", 1)).await.unwrap();
    let e = api_err(api.patch("w", &PatchParams::default(), &Patch::Strategic(json!({"spec": {"size": 2}}))).await);
    assert_eq!((e.code, e.reason.as_str()), (415, "UnsupportedMediaType"));
}

fn condition_status(n: &Node, ty: &str) -> Option<String> {
    n.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == ty).map(|c| c.status.clone())
}

#[tokio::test]
async fn apply_by_two_managers_keeps_both_list_map_entries() {
    let s = server().await;
    let nodes: Api<Node> = Api::all(s.client());
    create_node(&s.client(), "n").await;
    let a = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"},
        "status": {"conditions": [{"type": "A", "status": "True"}]}});
    let b = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"},
        "status": {"conditions": [{"type": "B", "status": "False"}]}});
    nodes.patch_status("n", &PatchParams::apply("manager-a"), &Patch::Apply(&a)).await.unwrap();
    let n = nodes.patch_status("n", &PatchParams::apply("manager-b"), &Patch::Apply(&b)).await.unwrap();
    assert_eq!(condition_status(&n, "A").as_deref(), Some("True"));
    assert_eq!(condition_status(&n, "B").as_deref(), Some("False"));
    let managers: Vec<(String, String)> =
        n.metadata.managed_fields.unwrap().into_iter().map(|m| (m.manager.unwrap(), m.operation.unwrap())).collect();
    assert!(managers.contains(&("manager-a".into(), "Apply".into())), "{managers:?}");
    assert!(managers.contains(&("manager-b".into(), "Apply".into())), "{managers:?}");
    // A re-applies without its condition: its entry goes, B's stays.
    let a2 = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"}, "status": {"conditions": []}});
    let n = nodes.patch_status("n", &PatchParams::apply("manager-a"), &Patch::Apply(&a2)).await.unwrap();
    assert_eq!(condition_status(&n, "A"), None);
    assert_eq!(condition_status(&n, "B").as_deref(), Some("False"));
}

#[tokio::test]
async fn conflicting_apply_without_force_is_409_and_force_takes_ownership() {
    let s = server().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    let a = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"k": "from-a", "only-a": "1"}});
    cms.patch("c", &PatchParams::apply("a"), &Patch::Apply(&a)).await.unwrap();
    let b = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"k": "from-b"}});
    let e = api_err(cms.patch("c", &PatchParams::apply("b"), &Patch::Apply(&b)).await);
    assert_eq!((e.code, e.reason.as_str()), (409, "Conflict"));
    assert!(e.message.contains("conflict with \"a\"") && e.message.contains(".data.k"), "{}", e.message);
    let causes = e.details.as_ref().unwrap().causes.clone();
    assert_eq!(causes[0].reason, "FieldManagerConflict");
    // Same value: shared ownership, no conflict.
    let same = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"k": "from-a"}});
    cms.patch("c", &PatchParams::apply("b"), &Patch::Apply(&same)).await.unwrap();
    // Force: b takes k; a keeps only-a.
    let cm = cms.patch("c", &PatchParams::apply("b").force(), &Patch::Apply(&b)).await.unwrap();
    assert_eq!(cm.data.as_ref().unwrap()["k"], "from-b");
    let mf = cm.metadata.managed_fields.unwrap();
    let a_fields = mf.iter().find(|m| m.manager.as_deref() == Some("a")).unwrap().fields_v1.clone().unwrap().0;
    assert_eq!(a_fields, json!({"f:data": {"f:only-a": {}}}));
}

#[tokio::test]
async fn apply_conflicts_with_fields_an_update_changed() {
    let s = server().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    let a = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"k": "1"}});
    cms.patch("c", &PatchParams::apply("applier"), &Patch::Apply(&a)).await.unwrap();
    let pp = PatchParams { field_manager: Some("editor".into()), ..Default::default() };
    cms.patch("c", &pp, &Patch::Merge(json!({"data": {"k": "2"}}))).await.unwrap();
    let e = api_err(cms.patch("c", &PatchParams::apply("applier"), &Patch::Apply(&a)).await);
    assert_eq!(e.code, 409);
    assert!(e.message.contains("editor"), "{}", e.message);
}

#[tokio::test]
async fn apply_creates_missing_objects_and_removes_dropped_fields() {
    let s = server().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    let v1 = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "labels": {"l": "1"}}, "data": {"a": "1", "b": "2"}});
    let cm = cms.patch("c", &PatchParams::apply("me"), &Patch::Apply(&v1)).await.unwrap();
    assert_eq!(cm.metadata.labels.unwrap()["l"], "1");
    let v2 = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": "1"}});
    let cm = cms.patch("c", &PatchParams::apply("me"), &Patch::Apply(&v2)).await.unwrap();
    assert_eq!(cm.data.unwrap().len(), 1);
    assert!(cm.metadata.labels.unwrap_or_default().is_empty());
    // Applying the same thing again writes nothing.
    let rv = cm.metadata.resource_version.clone();
    let again = cms.patch("c", &PatchParams::apply("me"), &Patch::Apply(&v2)).await.unwrap();
    assert_eq!(again.metadata.resource_version, rv);
}

#[tokio::test]
async fn apply_requires_a_field_manager() {
    let s = server().await;
    let req = http::Request::builder()
        .method("PATCH")
        .uri("/api/v1/namespaces/default/configmaps/x")
        .header("content-type", "application/apply-patch+yaml")
        .body(b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n".to_vec())
        .unwrap();
    let e = api_err(s.client().request_text(req).await);
    assert_eq!(e.code, 422);
    // YAML bodies are accepted.
    let req = http::Request::builder()
        .method("PATCH")
        .uri("/api/v1/namespaces/default/configmaps/x?fieldManager=yaml")
        .header("content-type", "application/apply-patch+yaml")
        .body(b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\ndata:\n  k: v\n".to_vec())
        .unwrap();
    s.client().request_text(req).await.unwrap();
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    assert_eq!(cms.get("x").await.unwrap().data.unwrap()["k"], "v");
}
