//! Operator scenarios: what the installation cannot run is refused before anything changes
//! (Embedded mode the chart did not enable; a proxy data path off the host network).

use std::time::Duration;

use crate::kit::{Env, exists};
use crds::conditions::types;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ServiceAccount;
use operator::reasons::config_valid;
use operator::validate::Environment;
use serde_json::json;
use testkit::eventually;

const PROXY: &str =
    "instances: [{name: n1}]\nloadBalancer:\n  mode: proxy\n  pools: [{name: lan, cidrs: [10.0.0.0/30]}]\n";

testkit::backend_tests! {
    /// As the chart runs it without embedded.enabled: a switch to Embedded mode is refused with
    /// EmbeddedNotEnabled naming spec.mode, and the running manager's Deployment and RBAC stay
    /// (it used to be deleted for an engine that then stalled on 403s holding the Lease).
    async fn embedded_mode_the_chart_did_not_enable_is_refused_before_anything_is_torn_down(backend) {
        let env = Env::start(backend, "noembed").await;
        env.secret("cfg", "cloud.conf", "autoInstances: true\n").await;
        let mut config = env.operator_config();
        config.environment = Environment { embedded_enabled: false, host_network: false };
        let op = operator::start(config).await.unwrap();
        let spec = |mode: &str| json!({"provider": "fake", "mode": mode, "configureCloudRoutes": false,
            "cloudConfig": {"secretRef": {"name": "cfg"}}});
        env.apply_cr("e", spec("Deployment")).await;
        eventually("the manager Deployment", || async { exists::<Deployment>(&env, "ccm-e").await }).await;
        env.apply_cr("e", spec("Embedded")).await;
        let c = env.wait_status("e", types::CONFIG_VALID, "False", config_valid::EMBEDDED_NOT_ENABLED).await;
        assert!(c.message.contains("spec.mode") && c.message.contains("embedded.enabled=true"), "{}", c.message);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(exists::<Deployment>(&env, "ccm-e").await, "the working manager was torn down");
        assert!(exists::<ServiceAccount>(&env, "ccm-e").await);
        // Back to Deployment mode: accepted again, nothing was lost.
        env.apply_cr("e", spec("Deployment")).await;
        env.wait_status("e", types::CONFIG_VALID, "True", config_valid::VALID).await;
        op.stop().await.unwrap();
        env.finish().await;
    }
}

testkit::backend_tests! {
    /// baremetal's proxy data path listens where the manager runs: off the host network (or in
    /// the chart's operator Pod) it would be unreachable, so it is refused naming the fields,
    /// instead of giving Services an address nothing answers on.
    async fn a_proxy_data_path_off_the_host_network_is_refused_naming_the_fields(backend) {
        let env = Env::start(backend, "proxy").await;
        env.secret("bm", "cloud.conf", PROXY).await;
        let mut config = env.operator_config();
        config.environment = Environment { embedded_enabled: true, host_network: false };
        let op = operator::start(config).await.unwrap();
        env.apply_cr("pod-net", json!({"provider": "baremetal", "cloudConfig": {"secretRef": {"name": "bm"}},
            "deployment": {"hostNetwork": false}})).await;
        let c = env.wait_status("pod-net", types::CONFIG_VALID, "False", config_valid::PROXY_NEEDS_HOST_NETWORK).await;
        assert!(c.message.contains("spec.deployment.hostNetwork is false"), "{}", c.message);
        assert!(!exists::<Deployment>(&env, "ccm-pod-net").await, "deployed although unreachable");
        // On the host network (the default) it is accepted.
        env.apply_cr("pod-net", json!({"provider": "baremetal", "cloudConfig": {"secretRef": {"name": "bm"}}})).await;
        env.wait_status("pod-net", types::CONFIG_VALID, "True", config_valid::VALID).await;
        eventually("the Deployment", || async { exists::<Deployment>(&env, "ccm-pod-net").await }).await;
        op.stop().await.unwrap();
        env.finish().await;
    }
}
