//! Fault injection and the request log, in process and over the `/_test` HTTP endpoints.

use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::api::{Api, Patch, PatchParams, PostParams, WatchParams};
use memory_apiserver::{FaultConfig, FaultRule, RemoteControl, RequestFilter};
use serde_json::json;

use crate::common::*;

#[tokio::test]
async fn path_error_rate_fails_only_matching_requests() {
    let s = server().await;
    s.faults().set_path_error_rate("/api/v1/nodes", 1.0, 500);
    let nodes: Api<Node> = Api::all(s.client());
    let e = api_err(nodes.list(&Default::default()).await);
    assert_eq!((e.code, e.reason.as_str()), (500, "InternalError"));
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    cms.list(&Default::default()).await.unwrap();
    s.faults().clear();
    nodes.list(&Default::default()).await.unwrap();
}

#[tokio::test]
async fn throttling_answers_429_with_retry_after() {
    let s = server().await;
    s.faults().add_rule(FaultRule {
        error_rate: 1.0,
        status: 429,
        retry_after_seconds: 7,
        verbs: vec!["create".into()],
        ..Default::default()
    });
    let cms: Api<ConfigMap> = Api::default_namespaced(no_retry_client(&s));
    let e = api_err(cms.create(&PostParams::default(), &config_map("a", &[])).await);
    assert_eq!((e.code, e.reason.as_str()), (429, "TooManyRequests"));
    assert_eq!(e.details.unwrap().retry_after_seconds, 7);
    cms.list(&Default::default()).await.expect("other verbs pass");
    // The header is set too.
    let req = http::Request::builder()
        .method("POST")
        .uri(format!("{}/api/v1/namespaces/default/configmaps", s.url()))
        .header("content-type", "application/json")
        .body(r#"{"metadata":{"name":"b"}}"#.to_string())
        .unwrap();
    let (status, retry_after) = raw_http(&s.addr(), req).await;
    assert_eq!(status, 429);
    assert_eq!(retry_after.as_deref(), Some("7"));
}

/// One HTTP/1.1 request over a plain TCP socket: (status, Retry-After header).
async fn raw_http(addr: &std::net::SocketAddr, req: http::Request<String>) -> (u16, Option<String>) {
    use std::io::{Read, Write};
    let addr = *addr;
    let head = format!(
        "{} {} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{}",
        req.method(),
        req.uri().path(),
        req.body().len(),
        req.body()
    );
    let out = tokio::task::spawn_blocking(move || {
        let mut sock = std::net::TcpStream::connect(addr).unwrap();
        sock.write_all(head.as_bytes()).unwrap();
        let mut out = String::new();
        sock.read_to_string(&mut out).unwrap();
        out
    })
    .await
    .unwrap();
    let status = out.split_whitespace().nth(1).unwrap().parse().unwrap();
    let retry = out
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("retry-after:"))
        .map(|l| l.split(':').nth(1).unwrap().trim().to_string());
    (status, retry)
}

#[tokio::test]
async fn latency_is_added_to_matching_requests() {
    let s = server().await;
    s.faults().set_path_latency("/api/v1/namespaces/default/configmaps", Duration::from_millis(300));
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    let t = Instant::now();
    cms.list(&Default::default()).await.unwrap();
    assert!(t.elapsed() >= Duration::from_millis(300));
}

#[tokio::test]
async fn closing_watches_ends_open_streams() {
    let s = server().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    let rv = s.resource_version().to_string();
    let mut stream = cms.watch(&WatchParams::default(), &rv).await.unwrap().boxed();
    eventually("watch registered", || async { (s.faults().open_watches() == 1).then_some(()) }).await;
    s.faults().close_watches();
    let end = tokio::time::timeout(Duration::from_secs(5), stream.try_next()).await.expect("closed").unwrap();
    assert!(end.is_none());
    // Periodic closing.
    s.faults().close_watches_every(Some(Duration::from_secs(1)));
    let mut stream = cms.watch(&WatchParams::default(), &rv).await.unwrap().boxed();
    let end = tokio::time::timeout(Duration::from_secs(5), stream.try_next()).await.expect("closed again").unwrap();
    assert!(end.is_none());
    s.faults().close_watches_every(None);
}

#[tokio::test]
async fn request_log_counts_writes_and_filters_by_manager() {
    let s = server().await;
    let log = s.request_log();
    log.clear();
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    cms.create(&PostParams { field_manager: Some("creator".into()), ..Default::default() }, &config_map("a", &[]))
        .await
        .unwrap();
    cms.get("a").await.unwrap();
    cms.patch(
        "a",
        &PatchParams::apply("applier"),
        &Patch::Apply(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}, "data": {"k": "v"}})),
    )
    .await
    .unwrap();
    assert_eq!(log.count_writes(), 2);
    let creates = log.by_field_manager("creator");
    assert_eq!(creates.len(), 1);
    assert_eq!((creates[0].verb.as_str(), creates[0].status), ("create", 201));
    let applies = log.by_field_manager("applier");
    assert_eq!(applies[0].content_type.as_deref(), Some("application/apply-patch+yaml"));
    assert_eq!(applies[0].resource.as_deref(), Some("configmaps"));
    assert_eq!(applies[0].name.as_deref(), Some("a"));
    let gets = log.filter(|r| r.verb == "get");
    assert_eq!(gets[0].path, "/api/v1/namespaces/default/configmaps/a");
    let mark = log.mark();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(log.since(mark).iter().all(|r| !r.is_write()), "no writes while idle");
    log.clear();
    assert!(log.is_empty());
}

#[tokio::test]
async fn control_endpoints_drive_faults_and_the_log_over_http() {
    let s = server().await;
    let ctl = RemoteControl::new(s.client());
    let cfg = FaultConfig {
        rules: vec![FaultRule {
            path_prefix: Some("/api/v1/nodes".into()),
            error_rate: 1.0,
            status: 500,
            ..Default::default()
        }],
        close_watches_every_seconds: None,
    };
    ctl.set_faults(&cfg).await.unwrap();
    assert_eq!(ctl.faults().await.unwrap(), cfg);
    assert_eq!(s.faults().config(), cfg);
    let nodes: Api<Node> = Api::all(s.client());
    assert_eq!(api_err(nodes.list(&Default::default()).await).code, 500);
    ctl.clear_faults().await.unwrap();
    nodes.list(&Default::default()).await.unwrap();

    ctl.clear_requests().await.unwrap();
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    cms.create(&PostParams { field_manager: Some("http-test".into()), ..Default::default() }, &config_map("a", &[]))
        .await
        .unwrap();
    let writes = RequestFilter { writes_only: true, ..Default::default() };
    assert_eq!(ctl.count_requests(&writes).await.unwrap(), 1);
    let mine = RequestFilter { field_manager: Some("http-test".into()), ..Default::default() };
    assert_eq!(ctl.requests(&mine).await.unwrap()[0].verb, "create");
    let stats = ctl.stats().await.unwrap();
    assert!(stats.objects >= 5 && stats.resource_version > 0);

    let a = cms.get("a").await.unwrap();
    cms.create(&PostParams::default(), &config_map("b", &[])).await.unwrap();
    ctl.compact_history().await.unwrap();
    let mut stream = cms.watch(&WatchParams::default(), &a.metadata.resource_version.unwrap()).await.unwrap().boxed();
    let ev = tokio::time::timeout(Duration::from_secs(5), stream.try_next()).await.unwrap().unwrap().unwrap();
    assert!(matches!(ev, kube::api::WatchEvent::Error(e) if e.code == 410));
    ctl.close_watches().await.unwrap();
}
