//! kube-runtime's watcher, reflector and Controller, unchanged, including after injected watch
//! drops and 410 Gone.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, Event};
use memory_apiserver::TestApiServer;
use serde_json::json;

use crate::common::*;

async fn wait_for_store(store: &Store<ConfigMap>, n: usize, what: &str) {
    eventually(what, || async { (store.state().len() == n).then_some(()) }).await;
}

/// Runs a reflector in the background; returns its store and how many init cycles it saw.
fn spawn_reflector(api: Api<ConfigMap>, cfg: watcher::Config) -> (Store<ConfigMap>, Arc<AtomicUsize>) {
    let (reader, writer) = reflector::store();
    let inits = Arc::new(AtomicUsize::new(0));
    let counter = inits.clone();
    let stream = reflector::reflector(writer, watcher::watcher(api, cfg)).default_backoff();
    tokio::spawn(async move {
        stream
            .for_each(|ev| {
                if let Ok(Event::InitDone) = ev {
                    counter.fetch_add(1, Ordering::Relaxed);
                }
                async {}
            })
            .await
    });
    (reader, inits)
}

async fn relists_after_gone(cfg: watcher::Config) {
    // Default (5 s) bookmarks: a bookmark past the compaction point would let the watcher skip the relist.
    let s = server().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    cms.create(&PostParams::default(), &config_map("a", &[])).await.unwrap();
    let (store, inits) = spawn_reflector(cms.clone(), cfg);
    wait_for_store(&store, 1, "initial sync").await;
    // Changes while compacted and disconnected: the watcher must relist to see them.
    s.faults().compact_history();
    cms.create(&PostParams::default(), &config_map("b", &[])).await.unwrap();
    s.faults().compact_history();
    s.faults().close_watches();
    cms.create(&PostParams::default(), &config_map("c", &[])).await.unwrap();
    wait_for_store(&store, 3, "resync after 410").await;
    eventually("a second init cycle", || async { (inits.load(Ordering::Relaxed) >= 2).then_some(()) }).await;
    // And it keeps watching.
    cms.create(&PostParams::default(), &config_map("d", &[])).await.unwrap();
    wait_for_store(&store, 4, "watching after relist").await;
}

#[tokio::test]
async fn watcher_relists_after_410_with_list_then_watch() {
    relists_after_gone(watcher::Config::default()).await;
}

#[tokio::test]
async fn watcher_relists_after_410_with_streaming_lists() {
    relists_after_gone(watcher::Config::default().streaming_lists()).await;
}

#[tokio::test]
async fn watcher_pages_large_initial_lists() {
    let s = server().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    for i in 0..30 {
        cms.create(&PostParams::default(), &config_map(&format!("c{i}"), &[])).await.unwrap();
    }
    let (store, _) = spawn_reflector(cms.clone(), watcher::Config::default().page_size(7));
    wait_for_store(&store, 30, "paged initial list").await;
    let pages = s.request_log().count(|r| r.verb == "list" && r.path.ends_with("/configmaps"));
    assert_eq!(pages, 5, "30 objects in pages of 7");
}

#[tokio::test]
async fn reflector_stays_in_sync_across_injected_watch_drops() {
    let s = TestApiServer::builder().bookmark_interval(Duration::from_millis(200)).start().await.unwrap();
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    let (store, inits) = spawn_reflector(cms.clone(), watcher::Config::default());
    wait_for_store(&store, 0, "empty").await;
    s.faults().close_watches_every(Some(Duration::from_secs(1)));
    for i in 0..20 {
        cms.create(&PostParams::default(), &config_map(&format!("c{i}"), &[])).await.unwrap();
        if i % 5 == 0 {
            s.faults().close_watches();
        }
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
    wait_for_store(&store, 20, "all objects after drops").await;
    cms.patch("c3", &PatchParams::default(), &Patch::Merge(json!({"data": {"v": "2"}}))).await.unwrap();
    eventually("update seen", || async {
        store
            .state()
            .iter()
            .find(|c| c.metadata.name.as_deref() == Some("c3"))
            .and_then(|c| c.data.as_ref())
            .and_then(|d| d.get("v").cloned())
    })
    .await;
    s.faults().close_watches_every(None);
    // Drops resume from the last version: no relist needed while history covers the gap.
    assert_eq!(inits.load(Ordering::Relaxed), 1, "no relist after plain watch drops");
    let watches = s.request_log().count(|r| r.verb == "watch");
    assert!(watches >= 3, "watch was re-established ({watches} watches)");
}

#[derive(Debug, thiserror::Error)]
#[error("reconcile failed")]
struct ReconcileError(#[from] kube::Error);

#[tokio::test]
async fn controller_reconciles_and_survives_watch_drops() {
    let s = TestApiServer::builder().bookmark_interval(Duration::from_millis(200)).start().await.unwrap();
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    let ctx = Arc::new(cms.clone());
    let reconcile = |cm: Arc<ConfigMap>, api: Arc<Api<ConfigMap>>| async move {
        let name = cm.metadata.name.clone().unwrap_or_default();
        let want = cm.data.as_ref().and_then(|d| d.get("input")).cloned().unwrap_or_default();
        let have = cm.data.as_ref().and_then(|d| d.get("output")).cloned();
        if have.as_deref() != Some(want.as_str()) {
            let cfg =
                json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"output": want}});
            api.patch(&name, &PatchParams::apply("test-controller"), &Patch::Apply(&cfg)).await?;
        }
        Ok::<_, ReconcileError>(Action::await_change())
    };
    let error_policy =
        |_: Arc<ConfigMap>, _: &ReconcileError, _: Arc<Api<ConfigMap>>| Action::requeue(Duration::from_millis(100));
    let controller = Controller::new(cms.clone(), watcher::Config::default())
        .run(reconcile, error_policy, ctx)
        .for_each(|_| async {});
    let handle = tokio::spawn(controller);

    let output = |name: &'static str| {
        let cms = cms.clone();
        async move { cms.get(name).await.ok()?.data?.get("output").cloned() }
    };
    cms.create(&PostParams::default(), &config_map("one", &[("input", "1")])).await.unwrap();
    assert_eq!(eventually("first reconcile", || output("one")).await, "1");

    s.faults().close_watches();
    cms.patch("one", &PatchParams::default(), &Patch::Merge(json!({"data": {"input": "2"}}))).await.unwrap();
    eventually("reconcile after a watch drop", || async {
        (output("one").await.as_deref() == Some("2")).then_some(())
    })
    .await;

    s.faults().compact_history();
    s.faults().close_watches();
    cms.create(&PostParams::default(), &config_map("two", &[("input", "x")])).await.unwrap();
    assert_eq!(eventually("reconcile after 410", || output("two")).await, "x");

    // Once converged, the controller stops writing.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mark = s.request_log().mark();
    tokio::time::sleep(Duration::from_millis(700)).await;
    let writes = s.request_log().since(mark).into_iter().filter(|r| r.is_write()).count();
    assert_eq!(writes, 0, "no writes while idle");
    handle.abort();
}
