//! The sandbox builder: server, CRDs and components.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use memory_apiserver::Sandbox;

use crate::common::*;

#[tokio::test]
async fn sandbox_installs_crds_and_runs_components() {
    let sandbox = Sandbox::builder()
        .port(0)
        .crd(crate::crd::widget_crd("Namespaced"))
        .component("writer", |ctx| async move {
            let cms: Api<ConfigMap> = Api::default_namespaced(ctx.client);
            cms.create(&PostParams::default(), &config_map("from-component", &[])).await?;
            Ok(())
        })
        .start()
        .await
        .unwrap();
    let client = sandbox.server().client();
    let cms: Api<ConfigMap> = Api::default_namespaced(client);
    eventually("component ran", || async { cms.get("from-component").await.ok() }).await;
    crate::crd::widgets(sandbox.server(), Some("default")).list(&Default::default()).await.unwrap();
    assert!(sandbox.usage().contains(&sandbox.server().kubeconfig_path().display().to_string()));
    sandbox.shutdown().await;
}
