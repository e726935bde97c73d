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

/// For a test that measures its whole process (CPU time), which the other tests of this binary
/// share: runs `test` (its full name) alone in a child process of this binary. Returns true in
/// that child, where the test does its work; in the parent, waits for the child, fails with its
/// output if it failed, and returns false.
pub fn alone_in_a_process(test: &str) -> bool {
    const CHILD: &str = "CCM_TEST_ALONE";
    if std::env::var_os(CHILD).is_some() {
        return true;
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let out = std::process::Command::new(exe)
        .args([test, "--exact", "--test-threads=1", "--nocapture"])
        .env(CHILD, "1")
        .output()
        .expect("the test binary runs");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{test}, alone in a process:\n{stdout}{stderr}");
    assert!(stdout.contains("1 passed"), "{test} ran in the child:\n{stdout}");
    false
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

/// Installs the CRD and creates `kube-system/fake`, a resource of the fake provider for the
/// manager to report on (`--ccm-resource`).
pub async fn install_fake_ccm(cluster: &e2e_apiserver::TestCluster) -> kube::Api<crds::CloudControllerManager> {
    cluster.install_crd(&crds::crd()).await.unwrap();
    let api: kube::Api<crds::CloudControllerManager> = kube::Api::namespaced(cluster.client(), "kube-system");
    let ccm: crds::CloudControllerManager = serde_json::from_value(serde_json::json!({
        "apiVersion": "ccm.rs/v1alpha1",
        "kind": "CloudControllerManager",
        "metadata": {"name": "fake", "namespace": "kube-system"},
        "spec": {"provider": "fake"},
    }))
    .unwrap();
    api.create(&kube::api::PostParams::default(), &ccm).await.unwrap();
    api
}
