//! The example provider initializes a Node through the built-in cloud-node-controller, run
//! against both API server backends.

use std::time::Duration;

use ccm_framework::options::ControllerOptions;
use ccm_framework::registry::{ClusterSettings, Registry};
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::PostParams;
use testkit::fixtures::UNINITIALIZED;
use testkit::{TestCluster, eventually_within, kubelet_node};

const CONFIG: &[u8] = b"
region: eu-1
instances:
  worker-1: { id: i-0a1, type: small, zone: eu-1a, address: 10.0.0.11 }
";

testkit::backend_tests! {
    async fn the_cloud_node_controller_initializes_a_node_from_the_example_cloud(backend) {
        let mut registry = Registry::new();
        registry.register(example_cloud::NAME, example_cloud::factory).unwrap();
        let provider = registry.create(example_cloud::NAME, Some(CONFIG), &ClusterSettings::default()).unwrap();
        assert!(provider.load_balancer().is_none(), "the example cloud has no load balancers");

        let cluster = TestCluster::start(backend).await.unwrap();
        let nodes: Api<Node> = Api::all(cluster.client());
        nodes.create(&PostParams::default(), &kubelet_node("worker-1")).await.unwrap();

        let running = ccm_framework::engine::testing::run_builtin(
            cluster.client(),
            provider,
            ControllerOptions { node_batch_window: Duration::from_millis(10), ..Default::default() },
            "cloud-node-controller",
        )
        .await
        .expect("cloud-node-controller is built in");

        let node = eventually_within("worker-1 initialized", Duration::from_secs(20), || async {
            let node = nodes.get("worker-1").await.unwrap();
            let spec = node.spec.clone().unwrap_or_default();
            // Only the uninitialized taint: kube-apiserver's admission adds a not-ready one too.
            let uninitialized = spec.taints.unwrap_or_default().iter().any(|t| t.key == UNINITIALIZED);
            (spec.provider_id.is_some() && !uninitialized).then_some(node)
        })
        .await;
        assert_eq!(node.spec.unwrap().provider_id.as_deref(), Some("example://i-0a1"));
        let labels = node.metadata.labels.unwrap_or_default();
        assert_eq!(labels.get("topology.kubernetes.io/zone").map(String::as_str), Some("eu-1a"));
        assert_eq!(labels.get("node.kubernetes.io/instance-type").map(String::as_str), Some("small"));
        running.stop().await.unwrap();
        drop(cluster);
    }
}
