//! An upstream profile's node manager (issue 48: Azure's cloud-node-manager DaemonSet,
//! `spec.upstream.nodeManager`, docs/profiles/azure.md), on both backends: rendered beside the
//! CCM with its own ServiceAccount and binding, the CCM then without cloud-node, its Pods counted
//! in status; turned off, exactly its objects go and the CCM takes cloud-node back; deleting the
//! resource leaves no binding behind.

use std::time::Duration;

use crate::kit::{Env, exists};
use crds::conditions::types;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use operator::Scope;
use operator::reasons::config_valid;
use serde_json::json;
use testkit::poll_within;

/// Azure's profile runs in kube-system only (its lock Lease is there).
const NAMESPACE: &str = "kube-system";
/// The resource's name.
const NAME: &str = "azure";

/// The `--controllers=` argument of the CCM's Deployment, once it exists.
async fn controllers_arg(env: &Env) -> Option<String> {
    let d = env.api::<Deployment>().get_opt("ccm-azure").await.ok()??;
    let args = d.spec?.template.spec?.containers.first()?.args.clone()?;
    args.into_iter().find(|a| a.starts_with("--controllers="))
}

testkit::backend_tests! {
    async fn an_azure_resource_runs_cloud_node_manager_beside_its_ccm_until_turned_off_and_leaves_no_binding(backend) {
        let mut env = Env::start(backend, "nodemgr").await;
        env.ns = NAMESPACE.into();
        let namespaces: Api<Namespace> = Api::all(env.harness.clone());
        if namespaces.get_opt(NAMESPACE).await.expect("reading namespaces").is_none() {
            namespaces.create(&PostParams::default(), &testkit::namespace(NAMESPACE)).await.expect("kube-system");
        }
        env.secret("azure-cfg", "azure.json", "{\"cloud\": \"AzurePublicCloud\"}").await;
        let mut config = env.operator_config();
        config.scope = Scope::Namespaces(vec![NAMESPACE.into()]);
        config.build.policy.allowed_images = vec![
            "mcr.microsoft.com/oss/kubernetes/azure-cloud-controller-manager".into(),
            "mcr.microsoft.com/oss/kubernetes/azure-cloud-node-manager".into(),
        ];
        let op = operator::start(config).await.expect("the operator starts");
        let spec = json!({"provider": "azure", "upstream": {"profile": "azure"},
                          "cloudConfig": {"secretRef": {"name": "azure-cfg", "key": "azure.json"}}});
        env.apply_cr(NAME, spec).await;
        env.wait_status(NAME, types::CONFIG_VALID, "True", config_valid::VALID).await;

        // Beside the CCM: its DaemonSet, ServiceAccount and binding; the CCM without cloud-node.
        let name = operator::names::node_manager_name(NAME);
        let daemon_sets = env.api::<DaemonSet>();
        let ds = poll_within(Duration::from_secs(30), || async { daemon_sets.get_opt(&name).await.ok().flatten() })
            .await
            .expect("the node-manager DaemonSet");
        let pod = ds.spec.as_ref().and_then(|s| s.template.spec.clone()).expect("a pod template");
        assert_eq!(pod.containers[0].command, Some(vec!["cloud-node-manager".to_string()]));
        assert_eq!(pod.service_account_name.as_deref(), Some(name.as_str()));
        assert!(exists::<ServiceAccount>(&env, &name).await, "its ServiceAccount");
        let crbs: Api<ClusterRoleBinding> = Api::all(env.harness.clone());
        let crb_name = operator::names::node_manager_cluster_role_binding_name(NAMESPACE, NAME);
        let crb = crbs.get_opt(&crb_name).await.unwrap().expect("its ClusterRoleBinding");
        assert_eq!(crb.role_ref.name, "ccm-node-manager");
        let controllers = poll_within(Duration::from_secs(30), || controllers_arg(&env)).await;
        assert_eq!(controllers.as_deref(), Some("--controllers=*,-cloud-node-controller"));

        // Its Pods in status, as the DaemonSet controller counts them (no kubelet here).
        let counted = poll_within(Duration::from_secs(30), || async { env.cr(NAME).await.status?.node_managers }).await;
        assert_eq!(counted.map(|n| (n.desired, n.ready)), Some((0, 0)));
        let generation = ds.metadata.generation.unwrap_or(1);
        env.write_status::<DaemonSet>(&name, json!({"observedGeneration": generation,
            "desiredNumberScheduled": 3, "currentNumberScheduled": 3, "numberReady": 2, "updatedNumberScheduled": 3,
            "numberMisscheduled": 0}))
            .await;
        let counted = poll_within(Duration::from_secs(30), || async {
            env.cr(NAME).await.status?.node_managers.filter(|n| n.desired == 3)
        })
        .await;
        assert_eq!(counted.map(|n| (n.desired, n.ready, n.updated)), Some((3, 2, 3)));

        // Turned off: exactly its objects go, and the CCM takes cloud-node back.
        let off = json!({"spec": {"upstream": {"profile": "azure", "nodeManager": {"enabled": false}}}});
        env.crs().patch(NAME, &PatchParams::default(), &Patch::Merge(&off)).await.expect("turned off");
        let gone = poll_within(Duration::from_secs(30), || async {
            let ds = daemon_sets.get_opt(&name).await.ok()?;
            let crb = crbs.get_opt(&crb_name).await.ok()?;
            (ds.is_none() && crb.is_none()).then_some(())
        })
        .await;
        assert!(gone.is_some(), "the node-manager DaemonSet and ClusterRoleBinding are pruned");
        assert!(!exists::<ServiceAccount>(&env, &name).await, "and its ServiceAccount");
        let controllers = poll_within(Duration::from_secs(30), || async {
            controllers_arg(&env).await.filter(|c| c == "--controllers=*")
        })
        .await;
        assert!(controllers.is_some(), "the CCM runs cloud-node again");
        let cleared = poll_within(Duration::from_secs(30), || async {
            env.cr(NAME).await.status.is_some_and(|s| s.node_managers.is_none()).then_some(())
        })
        .await;
        assert!(cleared.is_some(), "status.nodeManagers goes with it");

        // On again, then the resource deleted: no binding is left (the finalizer's work).
        let on = json!({"spec": {"upstream": {"nodeManager": null}}});
        env.crs().patch(NAME, &PatchParams::default(), &Patch::Merge(&on)).await.expect("on again");
        poll_within(Duration::from_secs(30), || async { crbs.get_opt(&crb_name).await.ok().flatten() })
            .await
            .expect("bound again");
        env.crs().delete(NAME, &DeleteParams::default()).await.expect("deleted");
        let gone = poll_within(Duration::from_secs(60), || async {
            let crb = crbs.get_opt(&crb_name).await.ok()?;
            let cr = env.crs().get_opt(NAME).await.ok()?;
            (crb.is_none() && cr.is_none()).then_some(())
        })
        .await;
        assert!(gone.is_some(), "the node manager's ClusterRoleBinding goes with the resource");
        let _ = tokio::time::timeout(Duration::from_secs(20), op.stop()).await;
        env.finish().await;
    }
}
