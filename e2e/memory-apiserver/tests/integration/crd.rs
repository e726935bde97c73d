//! CustomResourceDefinitions: registration, serving, status subresource, removal.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Discovery;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use memory_apiserver::TestApiServer;
use serde_json::json;

use crate::common::*;

/// A `widgets.example.com` CRD with a status subresource and a list-map of conditions.
pub fn widget_crd(scope: &str) -> CustomResourceDefinition {
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "scope": scope,
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "shortNames": ["wd"]},
            "versions": [{
                "name": "v1",
                "served": true,
                "storage": true,
                "subresources": {"status": {}},
                "additionalPrinterColumns": [{"name": "Size", "type": "integer", "jsonPath": ".spec.size"}],
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "properties": {
                        "spec": {"type": "object", "properties": {"size": {"type": "integer"}}},
                        "status": {"type": "object", "properties": {
                            "x": {"type": "integer"},
                            "conditions": {
                                "type": "array",
                                "x-kubernetes-list-type": "map",
                                "x-kubernetes-list-map-keys": ["type"],
                                "items": {"type": "object", "properties": {"type": {"type": "string"}, "status": {"type": "string"}}}
                            }
                        }}
                    }
                }}
            }]
        }
    }))
    .unwrap()
}

pub fn widget_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("example.com", "v1", "Widget"), "widgets")
}

pub fn widgets(s: &TestApiServer, ns: Option<&str>) -> Api<DynamicObject> {
    match ns {
        Some(ns) => Api::namespaced_with(s.client(), ns, &widget_resource()),
        None => Api::all_with(s.client(), &widget_resource()),
    }
}

pub fn widget(name: &str, size: i64) -> DynamicObject {
    DynamicObject::new(name, &widget_resource()).data(json!({"spec": {"size": size}}))
}

#[tokio::test]
async fn creating_a_crd_serves_its_resources_and_sets_established() {
    let s = server().await;
    let crd = s.install_crd(&widget_crd("Namespaced")).await.unwrap();
    let conds = crd.status.unwrap().conditions.unwrap();
    assert!(conds.iter().any(|c| c.type_ == "Established" && c.status == "True"));
    let d = Discovery::new(s.client()).run().await.unwrap();
    let (ar, caps) = d.resolve_gvk(&GroupVersionKind::gvk("example.com", "v1", "Widget")).expect("discovered");
    assert_eq!(ar.plural, "widgets");
    assert_eq!(caps.scope, kube::discovery::Scope::Namespaced);

    let api = widgets(&s, Some("default"));
    let w = api.create(&PostParams::default(), &widget("w1", 3)).await.unwrap();
    assert_eq!(w.metadata.generation, Some(1));
    assert_eq!(api.get("w1").await.unwrap().data["spec"]["size"], 3);
    let all = widgets(&s, None).list(&Default::default()).await.unwrap();
    assert_eq!(all.items.len(), 1);
}

#[tokio::test]
async fn custom_resource_status_is_a_subresource() {
    let s = server().await;
    s.install_crd(&widget_crd("Namespaced")).await.unwrap();
    let api = widgets(&s, Some("default"));
    let mut w = widget("w", 1);
    w.data["status"] = json!({"conditions": [{"type": "Ready", "status": "True"}]});
    let created = api.create(&PostParams::default(), &w).await.unwrap();
    assert!(created.data.get("status").is_none(), "status is dropped on create");
    let pp = PatchParams::default();
    let w = api.patch("w", &pp, &Patch::Merge(json!({"spec": {"size": 2}, "status": {"x": 1}}))).await.unwrap();
    assert!(w.data.get("status").is_none());
    assert_eq!(w.metadata.generation, Some(2));
    let w = api
        .patch_status(
            "w",
            &pp,
            &Patch::Merge(json!({"spec": {"size": 9}, "metadata": {"labels": {"a": "b"}}, "status": {"x": 1}})),
        )
        .await
        .unwrap();
    assert_eq!(w.data["spec"]["size"], 2);
    assert_eq!(w.data["status"]["x"], 1);
    assert!(w.metadata.labels.is_none(), "custom resource status writes change only status");
    assert_eq!(w.metadata.generation, Some(2), "status writes do not bump generation");
}

#[tokio::test]
async fn apply_on_custom_resources_uses_schema_list_types() {
    let s = server().await;
    s.install_crd(&widget_crd("Cluster")).await.unwrap();
    let api = widgets(&s, None);
    api.create(&PostParams::default(), &widget("w", 1)).await.unwrap();
    let cfg = |ty: &str| {
        json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"},
            "status": {"conditions": [{"type": ty, "status": "True"}]}})
    };
    api.patch_status("w", &PatchParams::apply("one"), &Patch::Apply(cfg("A"))).await.unwrap();
    let w = api.patch_status("w", &PatchParams::apply("two"), &Patch::Apply(cfg("B"))).await.unwrap();
    assert_eq!(w.data["status"]["conditions"].as_array().unwrap().len(), 2);
}

#[tokio::test]
async fn deleting_a_crd_stops_serving_and_removes_objects() {
    let s = server().await;
    s.install_crd(&widget_crd("Namespaced")).await.unwrap();
    let api = widgets(&s, Some("default"));
    api.create(&PostParams::default(), &widget("w", 1)).await.unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(s.client());
    crds.delete("widgets.example.com", &DeleteParams::default()).await.unwrap();
    let e = api_err(api.get("w").await);
    assert_eq!(e.code, 404);
    // Re-creating starts empty.
    s.install_crd(&widget_crd("Namespaced")).await.unwrap();
    assert!(api.list(&Default::default()).await.unwrap().items.is_empty());
}

#[tokio::test]
async fn invalid_crds_are_rejected() {
    let s = server().await;
    let mut crd = widget_crd("Namespaced");
    crd.metadata.name = Some("wrong.example.com".into());
    let crds: Api<CustomResourceDefinition> = Api::all(s.client());
    let e = api_err(crds.create(&PostParams::default(), &crd).await);
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));
}
