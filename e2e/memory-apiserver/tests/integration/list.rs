//! Lists: pagination, label and field selectors, deletecollection.

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams};
use serde_json::json;

use crate::common::*;

async fn labelled(cms: &Api<ConfigMap>, name: &str, labels: &[(&str, &str)]) {
    let mut cm = config_map(name, &[]);
    cm.metadata.labels = Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
    cms.create(&PostParams::default(), &cm).await.unwrap();
}

#[tokio::test]
async fn limit_and_continue_page_through_everything_in_order() {
    let s = server().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    for i in 0..25 {
        cms.create(&PostParams::default(), &config_map(&format!("cm-{i:02}"), &[])).await.unwrap();
    }
    let mut names = vec![];
    let mut lp = ListParams::default().limit(10);
    let mut pages = 0;
    let mut first_rv = None;
    loop {
        let page = cms.list(&lp).await.unwrap();
        pages += 1;
        first_rv.get_or_insert(page.metadata.resource_version.clone());
        if pages == 1 {
            assert_eq!(page.metadata.remaining_item_count, Some(15));
        }
        names.extend(page.items.into_iter().map(|c| c.metadata.name.unwrap()));
        match page.metadata.continue_ {
            Some(c) if !c.is_empty() => lp = lp.continue_token(&c),
            _ => break,
        }
    }
    assert_eq!(pages, 3);
    let expected: Vec<String> = (0..25).map(|i| format!("cm-{i:02}")).collect();
    assert_eq!(names, expected);
    let e = api_err(cms.list(&ListParams::default().continue_token("garbage")).await);
    assert_eq!(e.code, 400);
}

#[tokio::test]
async fn label_selectors_support_every_operator() {
    let s = server().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    labelled(&cms, "a", &[("app", "web"), ("tier", "front")]).await;
    labelled(&cms, "b", &[("app", "db"), ("tier", "back")]).await;
    labelled(&cms, "c", &[("app", "cache")]).await;
    let names = |sel: &'static str| {
        let cms = cms.clone();
        async move {
            let mut v: Vec<String> = cms
                .list(&ListParams::default().labels(sel))
                .await
                .unwrap()
                .items
                .into_iter()
                .map(|c| c.metadata.name.unwrap())
                .collect();
            v.sort();
            v
        }
    };
    assert_eq!(names("app=web").await, ["a"]);
    assert_eq!(names("app!=web").await, ["b", "c"]);
    assert_eq!(names("app in (web,db)").await, ["a", "b"]);
    assert_eq!(names("app notin (web,db)").await, ["c"]);
    assert_eq!(names("tier").await, ["a", "b"]);
    assert_eq!(names("!tier").await, ["c"]);
    assert_eq!(names("app,tier=back").await, ["b"]);
    let e = api_err(cms.list(&ListParams::default().labels("app in web")).await);
    assert_eq!((e.code, e.reason.as_str()), (400, "BadRequest"));
}

#[tokio::test]
async fn field_selectors_match_names_namespaces_and_pod_node_names() {
    let s = server().await;
    let nss: Api<Namespace> = Api::all(s.client());
    nss.create(
        &PostParams::default(),
        &Namespace { metadata: ObjectMeta { name: Some("other".into()), ..Default::default() }, ..Default::default() },
    )
    .await
    .unwrap();
    for (ns, name, node) in [("default", "p1", "n1"), ("default", "p2", "n2"), ("other", "p3", "n1")] {
        let pods: Api<Pod> = Api::namespaced(s.client(), ns);
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]}
        }))
        .unwrap();
        pods.create(&PostParams::default(), &pod).await.unwrap();
    }
    let all: Api<Pod> = Api::all(s.client());
    let names = |sel: &'static str| {
        let all = all.clone();
        async move {
            let mut v: Vec<String> = all
                .list(&ListParams::default().fields(sel))
                .await
                .unwrap()
                .items
                .into_iter()
                .map(|p| p.metadata.name.unwrap())
                .collect();
            v.sort();
            v
        }
    };
    assert_eq!(names("spec.nodeName=n1").await, ["p1", "p3"]);
    assert_eq!(names("metadata.namespace=other").await, ["p3"]);
    assert_eq!(names("metadata.name=p2").await, ["p2"]);
    assert_eq!(names("spec.nodeName!=n1,metadata.namespace=default").await, ["p2"]);
    assert_eq!(names("status.phase=Pending").await, ["p1", "p2", "p3"]);
    let e = api_err(all.list(&ListParams::default().fields("spec.unknown=x")).await);
    assert_eq!(e.code, 400);
}

#[tokio::test]
async fn delete_collection_removes_only_selected_objects() {
    let s = server().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    labelled(&cms, "a", &[("group", "x")]).await;
    labelled(&cms, "b", &[("group", "x")]).await;
    labelled(&cms, "c", &[("group", "y")]).await;
    let deleted =
        cms.delete_collection(&DeleteParams::default(), &ListParams::default().labels("group=x")).await.unwrap();
    let deleted = deleted.left().expect("a list of deleted objects");
    assert_eq!(deleted.items.len(), 2);
    let left: Vec<String> =
        cms.list(&Default::default()).await.unwrap().items.into_iter().map(|c| c.metadata.name.unwrap()).collect();
    assert_eq!(left, ["c"]);
}

#[tokio::test]
async fn list_resource_version_is_the_current_version() {
    let s = server().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    let cm = cms.create(&PostParams::default(), &config_map("a", &[])).await.unwrap();
    let list = cms.list(&Default::default()).await.unwrap();
    let list_rv: u64 = list.metadata.resource_version.unwrap().parse().unwrap();
    let obj_rv: u64 = cm.metadata.resource_version.unwrap().parse().unwrap();
    assert!(list_rv >= obj_rv);
    // resourceVersion=0 (any) works; a version from the future times out like the real server.
    cms.list(&ListParams::default().match_any()).await.unwrap();
    let cms: Api<ConfigMap> = Api::default_namespaced(no_retry_client(&s));
    let e =
        api_err(cms.list(&ListParams::default().at("999999999").matching(kube::api::VersionMatch::NotOlderThan)).await);
    assert_eq!(e.code, 504);
}
