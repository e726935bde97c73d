//! Operator scenarios around the manager's Pods: a crash loop shows in status at once, a
//! DaemonSet that matches no Node says so, and the manager's RBAC outlives its Pods on a mode
//! switch and on deletion (so a stopping manager can release its Lease).
//!
//! No kubelet runs here: the harness creates the Pods a ReplicaSet would (with the pod
//! template's labels) and writes their status as a kubelet would.

use std::time::{Duration, Instant};

use crate::kit::{Env, crb_exists, exists, status_reason};
use crds::conditions::types;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use operator::reasons::{available, degraded, provider_healthy};
use serde_json::{Value, json};
use testkit::eventually;

fn spec(mode: &str) -> Value {
    json!({"provider": "fake", "mode": mode, "configureCloudRoutes": false, "cloudConfig": {"secretRef": {"name": "cfg"}}})
}

/// The manager's RBAC in the namespace and cluster-wide: all of it, or none of it.
async fn rbac(env: &Env, cr: &str) -> (bool, bool, bool) {
    let name = format!("ccm-{cr}");
    (exists::<ServiceAccount>(env, &name).await, exists::<RoleBinding>(env, &name).await, crb_exists(env, cr).await)
}

/// A manager Pod of workload `kind` `ccm-<cr>`, with its pod template's labels, as its
/// controller would create it.
async fn manager_pod(env: &Env, cr: &str, pod: &str, workload: &str) {
    let labels = match workload {
        "Deployment" => {
            env.api::<Deployment>().get(&format!("ccm-{cr}")).await.unwrap().spec.unwrap().template.metadata
        }
        _ => env.api::<DaemonSet>().get(&format!("ccm-{cr}")).await.unwrap().spec.unwrap().template.metadata,
    }
    .unwrap()
    .labels
    .unwrap();
    let body: Pod = serde_json::from_value(json!({
        "metadata": {"name": pod, "namespace": env.ns, "labels": labels},
        "spec": {"containers": [{"name": "cloud-controller-manager", "image": "example.test/ccm:e2e"}]},
    }))
    .unwrap();
    env.api::<Pod>().create(&PostParams::default(), &body).await.unwrap();
}

/// Write a Pod's container status as the kubelet would.
async fn container_status(env: &Env, pod: &str, status: Value) {
    let mut c = json!({"name": "cloud-controller-manager", "image": "example.test/ccm:e2e", "imageID": ""});
    for (k, v) in status.as_object().unwrap() {
        c[k] = v.clone();
    }
    let body = json!({"status": {"phase": "Running", "containerStatuses": [c]}});
    env.api::<Pod>().patch_status(pod, &PatchParams::default(), &Patch::Merge(&body)).await.unwrap();
}

const CRASH_LOOP: fn() -> Value = || {
    json!({"ready": false, "restartCount": 3, "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s"}},
           "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}}})
};

/// ProviderHealthy=True as the manager's leader writes it (its field manager, forced).
async fn manager_reports_healthy(env: &Env, cr: &str) {
    let body = json!({
        "apiVersion": "ccm.rs/v1alpha1", "kind": "CloudControllerManager",
        "status": {"conditions": [{"type": "ProviderHealthy", "status": "True", "reason": "Healthy",
            "message": "probe passed", "lastTransitionTime": "2026-01-01T00:00:00Z"}]},
    });
    env.crs()
        .patch_status(cr, &PatchParams::apply("cloud-controller-manager").force(), &Patch::Apply(&body))
        .await
        .unwrap();
}

testkit::backend_tests! {
    /// A manager that crash-loops sets Degraded (ManagerCrashLooping, naming the pod) as soon as
    /// the kubelet reports it, with no transient window, and ProviderHealthy stops claiming the
    /// manager's last report; both recover with the Pod.
    async fn a_crash_looping_manager_is_degraded_at_once_and_provider_health_stops_claiming_health(backend) {
        let env = Env::start(backend, "crashloop").await;
        env.secret("cfg", "cloud.conf", "autoInstances: true\n").await;
        let mut config = env.operator_config();
        // Long enough that only the crash-loop cause, which is immediate, can turn Degraded.
        config.timings.degraded_window = Duration::from_secs(600);
        let op = operator::start(config).await.unwrap();
        env.apply_cr("cl", spec("Deployment")).await;
        eventually("the Deployment", || async { exists::<Deployment>(&env, "ccm-cl").await }).await;
        manager_pod(&env, "cl", "ccm-cl-a", "Deployment").await;
        env.write_status::<Deployment>("ccm-cl", json!({"observedGeneration": 1, "replicas": 1, "updatedReplicas": 1,
            "readyReplicas": 1, "availableReplicas": 1})).await;
        container_status(&env, "ccm-cl-a", json!({"ready": true, "restartCount": 0, "state": {"running": {}}})).await;
        manager_reports_healthy(&env, "cl").await;
        env.wait_status("cl", types::DEGRADED, "False", degraded::AS_EXPECTED).await;
        env.wait_status("cl", types::PROVIDER_HEALTHY, "True", "Healthy").await;

        // The manager crashes: the kubelet reports the back-off, the Deployment no ready replica.
        let crashed = Instant::now();
        container_status(&env, "ccm-cl-a", CRASH_LOOP()).await;
        env.write_status::<Deployment>("ccm-cl", json!({"readyReplicas": 0, "availableReplicas": 0})).await;
        let c = env.wait_status("cl", types::DEGRADED, "True", degraded::MANAGER_CRASH_LOOPING).await;
        println!("Degraded=True ManagerCrashLooping {:?} after the kubelet's report", crashed.elapsed());
        assert!(c.message.contains("ccm-cl-a/cloud-controller-manager: CrashLoopBackOff, 3 restarts, last exit code 1"), "{}", c.message);
        let h = env.wait_status("cl", types::PROVIDER_HEALTHY, "Unknown", provider_healthy::NO_MANAGER_RUNNING).await;
        assert!(h.message.contains("no manager replica is ready"), "{}", h.message);
        assert_eq!(status_reason(&env.cr("cl").await, types::READY).0, "False");

        // Recovered: Degraded clears; the operator waits for the manager's next report, which
        // takes the condition back.
        container_status(&env, "ccm-cl-a", json!({"ready": true, "restartCount": 4, "state": {"running": {}},
            "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}}})).await;
        env.write_status::<Deployment>("ccm-cl", json!({"readyReplicas": 1, "availableReplicas": 1})).await;
        env.wait_status("cl", types::DEGRADED, "False", degraded::AS_EXPECTED).await;
        env.wait_status("cl", types::PROVIDER_HEALTHY, "Unknown", provider_healthy::AWAITING_MANAGER).await;
        manager_reports_healthy(&env, "cl").await;
        env.wait_status("cl", types::PROVIDER_HEALTHY, "True", "Healthy").await;
        op.stop().await.unwrap();
        env.finish().await;
    }
}

testkit::backend_tests! {
    /// A DaemonSet whose nodeSelector and tolerations match no Node says so, naming the selector,
    /// instead of "0 of 0 pods available".
    async fn a_daemonset_that_matches_no_node_says_so(backend) {
        let env = Env::start(backend, "nonodes").await;
        env.secret("cfg", "cloud.conf", "autoInstances: true\n").await;
        let op = env.operator().await;
        env.apply_cr("ds", spec("DaemonSet")).await;
        eventually("the DaemonSet", || async { exists::<DaemonSet>(&env, "ccm-ds").await }).await;
        let generation = env.api::<DaemonSet>().get("ccm-ds").await.unwrap().metadata.generation.unwrap();
        env.write_status::<DaemonSet>("ccm-ds", json!({"observedGeneration": generation, "desiredNumberScheduled": 0,
            "currentNumberScheduled": 0, "numberMisscheduled": 0, "numberReady": 0})).await;
        let c = env.wait_status("ds", types::AVAILABLE, "False", available::NO_MATCHING_NODES).await;
        assert!(c.message.contains("node-role.kubernetes.io/control-plane="), "{}", c.message);
        op.stop().await.unwrap();
        env.finish().await;
    }
}

testkit::backend_tests! {
    /// On a switch to Embedded mode and on deletion, the workload goes first and the manager's
    /// RBAC (ServiceAccount, RoleBindings, ClusterRoleBinding) only once its Pods are gone: a
    /// stopping manager needs it to release its Lease. The finalizer stays until then.
    async fn a_mode_switch_and_a_deletion_keep_the_managers_rbac_until_its_pods_are_gone(backend) {
        let env = Env::start(backend, "teardown").await;
        env.secret("cfg", "cloud.conf", "autoInstances: true\n").await;
        let op = env.operator().await;
        let pods: Api<Pod> = env.api::<Pod>();

        // Switch to Embedded while a manager Pod still runs.
        env.apply_cr("sw", spec("Deployment")).await;
        eventually("Deployment-mode children", || async {
            exists::<Deployment>(&env, "ccm-sw").await && rbac(&env, "sw").await == (true, true, true)
        })
        .await;
        manager_pod(&env, "sw", "ccm-sw-a", "Deployment").await;
        // The operator has seen the Pod once it reports its crash loop.
        container_status(&env, "ccm-sw-a", CRASH_LOOP()).await;
        env.wait_status("sw", types::DEGRADED, "True", degraded::MANAGER_CRASH_LOOPING).await;
        env.apply_cr("sw", spec("Embedded")).await;
        eventually("the Deployment to be deleted", || async { !exists::<Deployment>(&env, "ccm-sw").await }).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(rbac(&env, "sw").await, (true, true, true), "the RBAC went while the manager Pod still ran");
        // The Pod stops (the garbage collector and the kubelet would do this).
        let gone = Instant::now();
        pods.delete("ccm-sw-a", &DeleteParams::default().grace_period(0)).await.unwrap();
        eventually("the RBAC to go after the Pod", || async { rbac(&env, "sw").await == (false, false, false) }).await;
        println!("RBAC deleted {:?} after the last manager Pod", gone.elapsed());

        // Deletion: the workload goes at once, the finalizer (and the RBAC) wait for the Pod.
        // Nothing in common with "sw", which keeps running Embedded (it would conflict).
        let mut del = spec("DaemonSet");
        del["controllers"] = json!(["service"]);
        del["loadBalancerClass"] = json!("example.test/del");
        env.apply_cr("del", del).await;
        eventually("DaemonSet-mode children", || async {
            exists::<DaemonSet>(&env, "ccm-del").await && rbac(&env, "del").await == (true, true, true)
        })
        .await;
        manager_pod(&env, "del", "ccm-del-a", "DaemonSet").await;
        container_status(&env, "ccm-del-a", CRASH_LOOP()).await;
        env.wait_status("del", types::DEGRADED, "True", degraded::MANAGER_CRASH_LOOPING).await;
        env.crs().delete("del", &DeleteParams::default()).await.unwrap();
        // Explicitly, by the operator: this does not wait for a garbage collector.
        eventually("the DaemonSet to be deleted", || async { !exists::<DaemonSet>(&env, "ccm-del").await }).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(env.crs().get_opt("del").await.unwrap().is_some(), "the finalizer went while the manager Pod ran");
        assert!(crb_exists(&env, "del").await);
        assert!(exists::<RoleBinding>(&env, "ccm-del").await);
        pods.delete("ccm-del-a", &DeleteParams::default().grace_period(0)).await.unwrap();
        eventually("the resource and its ClusterRoleBinding to go after the Pod", || async {
            env.crs().get_opt("del").await.unwrap().is_none() && !crb_exists(&env, "del").await
        })
        .await;
        op.stop().await.unwrap();
        env.finish().await;
    }
}
