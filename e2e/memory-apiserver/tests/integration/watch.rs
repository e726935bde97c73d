//! Watch semantics: resume by resourceVersion, bookmarks, initial events, timeouts, 410 Gone.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use memory_apiserver::TestApiServer;
use serde_json::json;

use crate::common::*;

async fn next_event(
    stream: &mut (impl futures::Stream<Item = Result<WatchEvent<ConfigMap>, kube::Error>> + Unpin),
) -> WatchEvent<ConfigMap> {
    tokio::time::timeout(Duration::from_secs(10), stream.try_next())
        .await
        .expect("event in time")
        .expect("no stream error")
        .expect("stream open")
}

fn describe(e: &WatchEvent<ConfigMap>) -> String {
    match e {
        WatchEvent::Added(o) => format!("ADDED {}", o.metadata.name.clone().unwrap()),
        WatchEvent::Modified(o) => format!("MODIFIED {}", o.metadata.name.clone().unwrap()),
        WatchEvent::Deleted(o) => format!("DELETED {}", o.metadata.name.clone().unwrap()),
        WatchEvent::Bookmark(_) => "BOOKMARK".into(),
        WatchEvent::Error(e) => format!("ERROR {}", e.code),
    }
}

#[tokio::test]
async fn watch_resumes_after_a_resource_version_in_order() {
    let s = server().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    let a = cms.create(&PostParams::default(), &config_map("a", &[])).await.unwrap();
    cms.create(&PostParams::default(), &config_map("b", &[])).await.unwrap();
    cms.patch("a", &PatchParams::default(), &Patch::Merge(json!({"data": {"x": "1"}}))).await.unwrap();
    cms.delete("b", &DeleteParams::default()).await.unwrap();
    let rv = a.metadata.resource_version.unwrap();
    let mut stream = cms.watch(&WatchParams::default(), &rv).await.unwrap().boxed();
    let mut seen = vec![];
    for _ in 0..3 {
        seen.push(describe(&next_event(&mut stream).await));
    }
    assert_eq!(seen, ["ADDED b", "MODIFIED a", "DELETED b"]);
    cms.create(&PostParams::default(), &config_map("c", &[])).await.unwrap();
    assert_eq!(describe(&next_event(&mut stream).await), "ADDED c");
}

#[tokio::test]
async fn deleted_events_carry_a_new_resource_version() {
    let s = server().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    let a = cms.create(&PostParams::default(), &config_map("a", &[])).await.unwrap();
    let rv = a.metadata.resource_version.clone().unwrap();
    let mut stream = cms.watch(&WatchParams::default(), &rv).await.unwrap().boxed();
    cms.delete("a", &DeleteParams::default()).await.unwrap();
    match next_event(&mut stream).await {
        WatchEvent::Deleted(o) => {
            assert!(o.metadata.resource_version.unwrap().parse::<u64>().unwrap() > rv.parse().unwrap())
        }
        other => panic!("unexpected {}", describe(&other)),
    }
}

#[tokio::test]
async fn send_initial_events_streams_state_then_marks_the_end() {
    let s = server().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    for n in ["a", "b"] {
        cms.create(&PostParams::default(), &config_map(n, &[])).await.unwrap();
    }
    let mut stream = cms.watch(&WatchParams::streaming_lists(), "0").await.unwrap().boxed();
    assert_eq!(describe(&next_event(&mut stream).await), "ADDED a");
    assert_eq!(describe(&next_event(&mut stream).await), "ADDED b");
    match next_event(&mut stream).await {
        WatchEvent::Bookmark(b) => {
            assert_eq!(b.metadata.annotations.get("k8s.io/initial-events-end").map(String::as_str), Some("true"))
        }
        other => panic!("expected the initial-events-end bookmark, got {}", describe(&other)),
    }
    cms.create(&PostParams::default(), &config_map("c", &[])).await.unwrap();
    assert_eq!(describe(&next_event(&mut stream).await), "ADDED c");
}

#[tokio::test]
async fn watch_without_version_starts_with_current_state() {
    let s = server().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    cms.create(&PostParams::default(), &config_map("a", &[])).await.unwrap();
    let mut stream = cms.watch(&WatchParams::default(), "0").await.unwrap().boxed();
    assert_eq!(describe(&next_event(&mut stream).await), "ADDED a");
}

#[tokio::test]
async fn bookmarks_are_sent_when_allowed() {
    let s = TestApiServer::builder().bookmark_interval(Duration::from_millis(100)).start().await.unwrap();
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    let rv = s.resource_version().to_string();
    let mut stream = cms.watch(&WatchParams::default(), &rv).await.unwrap().boxed();
    assert_eq!(describe(&next_event(&mut stream).await), "BOOKMARK");
    let mut plain = cms.watch(&WatchParams::default().disable_bookmarks().timeout(1), &rv).await.unwrap().boxed();
    let ended = tokio::time::timeout(Duration::from_secs(5), plain.try_next()).await.expect("ends").unwrap();
    assert!(ended.is_none(), "no bookmark without allowWatchBookmarks");
}

#[tokio::test]
async fn watch_ends_after_timeout_seconds() {
    let s = server().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    let rv = s.resource_version().to_string();
    let started = std::time::Instant::now();
    let mut stream = cms.watch(&WatchParams::default().timeout(1), &rv).await.unwrap().boxed();
    let end = tokio::time::timeout(Duration::from_secs(5), stream.try_next()).await.expect("ends in time").unwrap();
    assert!(end.is_none());
    assert!(started.elapsed() >= Duration::from_millis(900));
}

#[tokio::test]
async fn watching_from_a_compacted_version_gets_410_gone() {
    let s = server().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    let a = cms.create(&PostParams::default(), &config_map("a", &[])).await.unwrap();
    cms.create(&PostParams::default(), &config_map("b", &[])).await.unwrap();
    s.faults().compact_history();
    let mut stream = cms.watch(&WatchParams::default(), &a.metadata.resource_version.unwrap()).await.unwrap().boxed();
    match next_event(&mut stream).await {
        WatchEvent::Error(e) => assert_eq!((e.code, e.reason.as_str()), (410, "Expired")),
        other => panic!("expected 410, got {}", describe(&other)),
    }
}

#[tokio::test]
async fn history_is_bounded_and_falling_behind_it_gets_410() {
    let s = TestApiServer::builder().event_history_size(5).start().await.unwrap();
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    let first = cms.create(&PostParams::default(), &config_map("first", &[])).await.unwrap();
    for i in 0..10 {
        cms.create(&PostParams::default(), &config_map(&format!("c{i}"), &[])).await.unwrap();
    }
    let mut stream =
        cms.watch(&WatchParams::default(), &first.metadata.resource_version.unwrap()).await.unwrap().boxed();
    assert_eq!(describe(&next_event(&mut stream).await), "ERROR 410");
}

#[tokio::test]
async fn selector_watches_see_objects_enter_and_leave() {
    let s = server().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    let rv = s.resource_version().to_string();
    let mut stream = cms.watch(&WatchParams::default().labels("team=a"), &rv).await.unwrap().boxed();
    cms.create(&PostParams::default(), &config_map("x", &[])).await.unwrap();
    let pp = PatchParams::default();
    cms.patch("x", &pp, &Patch::Merge(json!({"metadata": {"labels": {"team": "a"}}}))).await.unwrap();
    assert_eq!(describe(&next_event(&mut stream).await), "ADDED x");
    cms.patch("x", &pp, &Patch::Merge(json!({"data": {"k": "v"}}))).await.unwrap();
    assert_eq!(describe(&next_event(&mut stream).await), "MODIFIED x");
    cms.patch("x", &pp, &Patch::Merge(json!({"metadata": {"labels": {"team": "b"}}}))).await.unwrap();
    assert_eq!(describe(&next_event(&mut stream).await), "DELETED x");
}

#[tokio::test]
async fn send_initial_events_requires_bookmarks() {
    let s = server().await;
    let req = http::Request::builder()
        .uri(
            "/api/v1/namespaces/default/configmaps?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan",
        )
        .body(vec![])
        .unwrap();
    let e = api_err(s.client().request_text(req).await);
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));
}

#[tokio::test]
async fn metadata_watches_and_lists_return_partial_objects() {
    let s = server().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    cms.create(&PostParams::default(), &config_map("a", &[("big", "data")])).await.unwrap();
    let list = cms.list_metadata(&Default::default()).await.unwrap();
    assert_eq!(list.items[0].metadata.name.as_deref(), Some("a"));
    let mut stream = cms.watch_metadata(&WatchParams::default(), "0").await.unwrap().boxed();
    let ev = tokio::time::timeout(Duration::from_secs(5), stream.try_next()).await.unwrap().unwrap().unwrap();
    assert!(matches!(ev, WatchEvent::Added(o) if o.metadata.name.as_deref() == Some("a")));
}
