//! Shared helpers.

use std::future::Future;
use std::time::Duration;

use e2e_apiserver::TestApiServer;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::api::{Api, ObjectMeta, PostParams};

pub async fn server() -> TestApiServer {
    TestApiServer::start().await.expect("server starts")
}

/// Polls `f` until it returns `Some`, for up to 10 s.
pub async fn eventually<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        if tokio::time::Instant::now() > deadline {
            panic!("timed out waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub fn node(name: &str) -> Node {
    Node { metadata: ObjectMeta { name: Some(name.into()), ..Default::default() }, ..Default::default() }
}

pub fn config_map(name: &str, data: &[(&str, &str)]) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
        data: Some(data.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
        ..Default::default()
    }
}

pub async fn create_node(client: &kube::Client, name: &str) -> Node {
    Api::<Node>::all(client.clone()).create(&PostParams::default(), &node(name)).await.expect("node created")
}

/// The API error a result carries (panics on success or a non-API error).
pub fn api_err<T: std::fmt::Debug>(r: Result<T, kube::Error>) -> Box<kube::core::Status> {
    match r {
        Err(kube::Error::Api(s)) => s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// Sends a raw request with a JSON body; returns the response text.
pub async fn raw(
    client: &kube::Client,
    method: &str,
    path: &str,
    content_type: &str,
    body: &serde_json::Value,
) -> Result<String, kube::Error> {
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", content_type)
        .body(serde_json::to_vec(body).unwrap())
        .unwrap();
    client.request_text(req).await
}

/// A client that does not retry 429/503/504 (kube's default client does, honouring Retry-After).
pub fn no_retry_client(s: &e2e_apiserver::TestApiServer) -> kube::Client {
    let mut cfg = s.kube_config();
    cfg.default_retry = false;
    kube::Client::try_from(cfg).unwrap()
}
