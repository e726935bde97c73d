//! Helpers every module of this test binary shares.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::ObjectMeta;

/// Re-runs a check until it returns `Some` (the one polling loop, from the test API server's crate).
pub use e2e_apiserver::wait::eventually;

/// Logs to the test's captured output, filtered by `RUST_LOG`; the first call in the process
/// installs the subscriber, later ones keep it.
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

/// Waits until `check` holds; after `within` it fails naming `what`.
pub async fn until(what: &str, within: Duration, check: impl Fn() -> bool) {
    let _named = Named(what);
    eventually(within, || std::future::ready(check().then_some(()))).await
}

/// Names what a failed wait was waiting for (the poll loop's own message has only the time).
struct Named<'a>(&'a str);

impl Drop for Named<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("(waiting for {})", self.0);
        }
    }
}

/// A LoadBalancer Service with one TCP port 80 -> 8080, selecting `app: <name>`.
pub fn lb_service(namespace: &str, name: &str) -> Service {
    Service {
        metadata: ObjectMeta { name: Some(name.into()), namespace: Some(namespace.into()), ..Default::default() },
        spec: Some(ServiceSpec {
            type_: Some("LoadBalancer".into()),
            selector: Some(BTreeMap::from([("app".to_string(), name.to_string())])),
            ports: Some(vec![ServicePort {
                name: Some("http".into()),
                port: 80,
                target_port: Some(IntOrString::Int(8080)),
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}
