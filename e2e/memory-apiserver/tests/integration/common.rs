//! Helpers these modules share beyond the test kit's.

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PostParams};
use memory_apiserver::TestApiServer;

pub use testkit::{config_map, eventually, node};

pub async fn server() -> TestApiServer {
    TestApiServer::start().await.expect("server starts")
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
pub fn no_retry_client(s: &TestApiServer) -> kube::Client {
    let mut cfg = s.kube_config();
    cfg.default_retry = false;
    kube::Client::try_from(cfg).unwrap()
}
