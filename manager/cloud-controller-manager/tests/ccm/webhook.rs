//! The manager's webhook listener as the genuine kube-apiserver calls it (issue 49 item 5): the
//! binary with the baremetal provider serves its requested-address webhook over TLS on
//! loopback, a `ValidatingWebhookConfiguration` points the API server at it, and a Service that
//! asks for an address no pool gives is refused at creation while one from a pool is created.
//! The in-memory API server calls no webhooks, so this runs on the genuine backend only.

use std::net::TcpStream;
use std::time::{Duration, Instant};

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    RuleWithOperations, ValidatingWebhook, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use testkit::{Backend, TestCluster};

/// The baremetal webhook's path (`ccm_provider_baremetal::admission::WEBHOOK_PATH`).
const PATH: &str = "/validate-baremetal-requested-addresses";

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn service(namespace: &str, name: &str, ip: &str) -> Service {
    Service {
        metadata: ObjectMeta { name: Some(name.into()), namespace: Some(namespace.into()), ..Default::default() },
        spec: Some(ServiceSpec {
            type_: Some("LoadBalancer".into()),
            load_balancer_ip: Some(ip.into()),
            ports: Some(vec![ServicePort { port: 80, ..Default::default() }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn configuration(namespace: &str, port: u16, ca: &str) -> ValidatingWebhookConfiguration {
    ValidatingWebhookConfiguration {
        metadata: ObjectMeta { name: Some(format!("ccm-test-{namespace}")), ..Default::default() },
        webhooks: Some(vec![ValidatingWebhook {
            name: "requested-addresses.baremetal.ccm.rs".into(),
            admission_review_versions: vec!["v1".into()],
            side_effects: "None".into(),
            failure_policy: Some("Fail".into()),
            timeout_seconds: Some(10),
            client_config: WebhookClientConfig {
                url: Some(format!("https://127.0.0.1:{port}{PATH}")),
                ca_bundle: Some(ByteString(ca.as_bytes().to_vec())),
                service: None,
            },
            // This test's namespace only: the API server is shared by nothing else, but a
            // configuration should never reach further than it means to.
            namespace_selector: Some(LabelSelector {
                match_labels: Some([("kubernetes.io/metadata.name".to_string(), namespace.to_string())].into()),
                ..Default::default()
            }),
            rules: Some(vec![RuleWithOperations {
                api_groups: Some(vec!["".into()]),
                api_versions: Some(vec!["v1".into()]),
                operations: Some(vec!["CREATE".into(), "UPDATE".into()]),
                resources: Some(vec!["services".into()]),
                scope: None,
            }]),
            ..Default::default()
        }]),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_genuine_api_server_calls_the_managers_webhook_which_refuses_an_address_no_pool_gives() {
    if !Backend::genuine_available() {
        eprintln!("SKIPPED: needs the genuine API server (CCM_TEST_ASSETS): it calls admission webhooks");
        return;
    }
    let cluster = TestCluster::start(Backend::Genuine).await.expect("the API server starts");
    let namespace = cluster.fresh_namespace("webhook").await.expect("a namespace");
    let dir = std::env::temp_dir().join(format!("ccm-webhook-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let tls = testkit::tls::loopback_serving().expect("certificates");
    let (cert, key, cloud_config) = (dir.join("tls.crt"), dir.join("tls.key"), dir.join("cloud.yaml"));
    std::fs::write(&cert, &tls.cert).unwrap();
    std::fs::write(&key, &tls.key).unwrap();
    std::fs::write(&cloud_config, "loadBalancer:\n  pools:\n    - name: default\n      cidrs: [\"192.0.2.0/28\"]\n")
        .unwrap();
    let (port, webhook_port) = (free_port(), free_port());
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_cloud-controller-manager"))
        .args([
            "--cloud-provider=baremetal",
            &format!("--cloud-config={}", cloud_config.display()),
            &format!("--kubeconfig={}", cluster.kubeconfig_path().display()),
            "--bind-address=127.0.0.1",
            &format!("--secure-port={port}"),
            "--configure-cloud-routes=false",
            "--leader-elect=false",
            "--feature-gates=CloudControllerManagerWebhook=true",
            "--webhooks=*",
            "--webhook-bind-address=127.0.0.1",
            &format!("--webhook-secure-port={webhook_port}"),
            &format!("--webhook-tls-cert-file={}", cert.display()),
            &format!("--webhook-tls-private-key-file={}", key.display()),
        ])
        .env_remove("RUST_LOG")
        .kill_on_drop(true)
        .spawn()
        .expect("the manager starts");
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect(("127.0.0.1", webhook_port)).is_err() {
        assert!(Instant::now() < deadline, "the webhook listener never opened");
        assert!(child.try_wait().unwrap().is_none(), "the manager exited");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let configurations: Api<ValidatingWebhookConfiguration> = Api::all(cluster.client());
    configurations
        .create(&PostParams::default(), &configuration(&namespace, webhook_port, &tls.ca))
        .await
        .expect("the webhook configuration");
    let services: Api<Service> = Api::namespaced(cluster.client(), &namespace);
    // The API server picks the configuration up within a moment: until then a Service passes.
    let t = Instant::now();
    let refusal = loop {
        match services.create(&PostParams::default(), &service(&namespace, "outside", "198.51.100.7")).await {
            Err(kube::Error::Api(status)) if status.message.contains("denied the request") => break status.message,
            Ok(_) => {
                let _ = services.delete("outside", &DeleteParams::default()).await;
            }
            Err(e) => assert!(t.elapsed() < Duration::from_secs(30), "no refusal by the webhook: {e}"),
        }
        assert!(t.elapsed() < Duration::from_secs(30), "the webhook never refused the Service");
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert!(
        refusal.contains(&format!("{namespace}/outside asks for 198.51.100.7, which is in no load-balancer pool")),
        "the refusal names the Service and the address: {refusal}"
    );
    services
        .create(&PostParams::default(), &service(&namespace, "inside", "192.0.2.5"))
        .await
        .expect("an address of a pool passes the webhook");
    println!(
        "the genuine API server refused through the manager's webhook {:.1} s after the configuration",
        t.elapsed().as_secs_f64()
    );

    let _ = child.kill().await;
    let _ = std::fs::remove_dir_all(&dir);
}
