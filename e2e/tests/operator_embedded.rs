//! Operator scenario: Embedded mode with the `baremetal` provider initializes Nodes, assigns a
//! LoadBalancer IP, and reports provider health.

mod operator_support;

use crds::conditions::{reasons as ready_reasons, types};
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{Api, Patch, PatchParams, PostParams};
use operator::reasons::available;
use operator_support::{Env, HARNESS_AGENT, eventually};
use serde_json::json;

const CLOUD_CONFIG: &str = "\
instances:
  - name: bm-node-1
    addresses:
      - {type: InternalIP, address: 10.0.0.11}
    zone: rack-a
  - name: bm-node-2
    addresses:
      - {type: InternalIP, address: 10.0.0.12}
    zone: rack-b
loadBalancer:
  pools:
    - name: lab
      cidrs: [192.0.2.0/28]
";

const UNINITIALIZED: &str = "node.cloudprovider.kubernetes.io/uninitialized";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_baremetal_initializes_nodes_and_assigns_a_load_balancer_ip() {
    let env = Env::start("embedded").await;
    if !env.plays_controllers() {
        // It registers fake Nodes, which a real cluster's node controller would remove.
        eprintln!("skipped: registers simulated Nodes, which only the local API server keeps");
        return env.finish().await;
    }
    let nodes: Api<Node> = Api::all(env.harness.clone());
    for name in ["bm-node-1", "bm-node-2"] {
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"taints": [{"key": UNINITIALIZED, "value": "true", "effect": "NoSchedule"}]},
        }))
        .unwrap();
        nodes.create(&PostParams::default(), &node).await.unwrap();
    }
    env.secret("bm", "cloud.conf", CLOUD_CONFIG).await;
    let op = env.operator().await;
    env.apply_cr(
        "baremetal",
        json!({"provider": "baremetal", "mode": "Embedded", "cloudConfig": {"secretRef": {"name": "bm"}}}),
    )
    .await;

    eventually("both Nodes to be initialized", || async {
        let mut done = true;
        for name in ["bm-node-1", "bm-node-2"] {
            let n = nodes.get(name).await.unwrap();
            let spec = n.spec.unwrap_or_default();
            let untainted = spec.taints.unwrap_or_default().iter().all(|t| t.key != UNINITIALIZED);
            done &= untainted && spec.provider_id.as_deref() == Some(&format!("baremetal://{name}"));
        }
        done
    })
    .await;
    let node = nodes.get("bm-node-1").await.unwrap();
    assert_eq!(node.metadata.labels.unwrap().get("topology.kubernetes.io/zone").map(String::as_str), Some("rack-a"));

    let services: Api<Service> = env.api();
    let svc: Service = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "namespace": env.ns},
        "spec": {"type": "LoadBalancer", "ports": [{"port": 80}], "selector": {"app": "web"}},
    }))
    .unwrap();
    services.patch("web", &PatchParams::apply(HARNESS_AGENT).force(), &Patch::Apply(&svc)).await.unwrap();
    eventually("a load-balancer IP from the pool", || async {
        services
            .get("web")
            .await
            .ok()
            .and_then(|s| s.status?.load_balancer?.ingress)
            .is_some_and(|i| i.iter().any(|i| i.ip.as_deref().is_some_and(|ip| ip.starts_with("192.0.2."))))
    })
    .await;

    env.wait_status("baremetal", types::PROVIDER_HEALTHY, "True", "Healthy").await;
    env.wait_status("baremetal", types::AVAILABLE, "True", available::AS_EXPECTED).await;
    env.wait_status("baremetal", types::READY, "True", ready_reasons::AS_EXPECTED).await;
    op.stop().await.unwrap();
    env.finish().await;
}
