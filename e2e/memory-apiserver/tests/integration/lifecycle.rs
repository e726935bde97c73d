//! Deletion: finalizers, preconditions, ownerReference garbage collection, namespaces.

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams, Preconditions, PropagationPolicy};
use serde_json::json;

use crate::common::*;

fn owned_by(name: &str, owner: &ConfigMap) -> ConfigMap {
    let mut cm = config_map(name, &[]);
    cm.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        name: owner.metadata.name.clone().unwrap(),
        uid: owner.metadata.uid.clone().unwrap(),
        block_owner_deletion: Some(true),
        ..Default::default()
    }]);
    cm
}

#[tokio::test]
async fn finalizers_hold_deletion_until_removed() {
    let s = server().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    let mut cm = config_map("f", &[]);
    cm.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    cms.create(&PostParams::default(), &cm).await.unwrap();
    let deleting = cms.delete("f", &DeleteParams::default()).await.unwrap();
    let obj = deleting.left().expect("object still there");
    assert!(obj.metadata.deletion_timestamp.is_some());
    assert_eq!(obj.metadata.deletion_grace_period_seconds, Some(0));
    // No new finalizers once deleting.
    let e = api_err(
        cms.patch(
            "f",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": ["example.com/hold", "x/y"]}})),
        )
        .await,
    );
    assert_eq!(e.code, 422);
    // Other changes are still allowed.
    cms.patch("f", &PatchParams::default(), &Patch::Merge(json!({"data": {"a": "b"}}))).await.unwrap();
    cms.patch("f", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"finalizers": null}}))).await.unwrap();
    assert_eq!(api_err(cms.get("f").await).code, 404);
}

#[tokio::test]
async fn delete_preconditions_are_checked() {
    let s = server().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    cms.create(&PostParams::default(), &config_map("p", &[])).await.unwrap();
    let dp = DeleteParams {
        preconditions: Some(Preconditions { uid: Some("not-the-uid".into()), resource_version: None }),
        ..Default::default()
    };
    let e = api_err(cms.delete("p", &dp).await);
    assert_eq!((e.code, e.reason.as_str()), (409, "Conflict"));
    cms.delete("p", &DeleteParams::default()).await.unwrap();
}

#[tokio::test]
async fn background_deletion_collects_dependents() {
    let s = server().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    let owner = cms.create(&PostParams::default(), &config_map("owner", &[])).await.unwrap();
    cms.create(&PostParams::default(), &owned_by("child-1", &owner)).await.unwrap();
    cms.create(&PostParams::default(), &owned_by("child-2", &owner)).await.unwrap();
    cms.delete("owner", &DeleteParams::background()).await.unwrap();
    eventually("dependents collected", || async {
        let left = cms.list(&Default::default()).await.unwrap().items.len();
        (left == 0).then_some(())
    })
    .await;
}

#[tokio::test]
async fn foreground_deletion_waits_for_dependents() {
    let s = server().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    let owner = cms.create(&PostParams::default(), &config_map("owner", &[])).await.unwrap();
    let mut child = owned_by("child", &owner);
    child.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    cms.create(&PostParams::default(), &child).await.unwrap();
    let dp = DeleteParams { propagation_policy: Some(PropagationPolicy::Foreground), ..Default::default() };
    cms.delete("owner", &dp).await.unwrap();
    let o = cms.get("owner").await.unwrap();
    assert!(o.metadata.finalizers.unwrap().contains(&"foregroundDeletion".to_string()));
    eventually("child marked for deletion", || async {
        cms.get("child").await.unwrap().metadata.deletion_timestamp.map(|_| ())
    })
    .await;
    assert!(cms.get("owner").await.is_ok(), "owner waits for the child");
    cms.patch("child", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"finalizers": null}})))
        .await
        .unwrap();
    eventually("owner deleted", || async { cms.get("owner").await.is_err().then_some(()) }).await;
}

#[tokio::test]
async fn orphan_deletion_keeps_dependents_without_the_reference() {
    let s = server().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    let owner = cms.create(&PostParams::default(), &config_map("owner", &[])).await.unwrap();
    cms.create(&PostParams::default(), &owned_by("child", &owner)).await.unwrap();
    cms.delete("owner", &DeleteParams::orphan()).await.unwrap();
    eventually("owner deleted", || async { cms.get("owner").await.is_err().then_some(()) }).await;
    let child = cms.get("child").await.unwrap();
    assert!(child.metadata.owner_references.unwrap_or_default().is_empty());
}

#[tokio::test]
async fn deleting_a_namespace_removes_its_contents() {
    let s = server().await;
    let nss: Api<Namespace> = Api::all(s.client());
    let ns =
        Namespace { metadata: ObjectMeta { name: Some("doomed".into()), ..Default::default() }, ..Default::default() };
    nss.create(&PostParams::default(), &ns).await.unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(s.client(), "doomed");
    cms.create(&PostParams::default(), &config_map("a", &[])).await.unwrap();
    let mut held = config_map("held", &[]);
    held.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    cms.create(&PostParams::default(), &held).await.unwrap();
    nss.delete("doomed", &DeleteParams::default()).await.unwrap();
    let n = nss.get("doomed").await.unwrap();
    assert_eq!(n.status.unwrap().phase.as_deref(), Some("Terminating"));
    let e = api_err(cms.create(&PostParams::default(), &config_map("late", &[])).await);
    assert_eq!((e.code, e.reason.as_str()), (403, "Forbidden"));
    eventually("plain object removed", || async { cms.get("a").await.is_err().then_some(()) }).await;
    assert!(nss.get("doomed").await.is_ok(), "namespace waits for finalizers of its contents");
    cms.patch("held", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"finalizers": null}}))).await.unwrap();
    eventually("namespace removed", || async { nss.get("doomed").await.is_err().then_some(()) }).await;
}
