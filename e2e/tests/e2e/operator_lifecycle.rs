//! Operator scenarios: mode switches prune, deletion cleans up, nothing is orphaned.

use crate::kit::{Env, crb_exists, exists};
use crds::conditions::types;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::DeleteParams;
use operator::reasons::{available, progressing};

/// How long the garbage collector may take (see the deletion test).
const GC_WAIT: std::time::Duration = std::time::Duration::from_secs(120);
use serde_json::{Value, json};
use testkit::eventually;

fn spec(mode: &str) -> Value {
    json!({"provider": "fake", "mode": mode, "configureCloudRoutes": false, "cloudConfig": {"secretRef": {"name": "cfg"}}})
}

async fn lease_holder(env: &Env, name: &str) -> Option<String> {
    env.api::<Lease>().get_opt(name).await.unwrap()?.spec?.holder_identity.filter(|h| !h.is_empty())
}

testkit::backend_tests! {
    async fn mode_switches_prune_what_the_previous_mode_created(backend) {
        let env = Env::start(backend, "switch").await;
        env.secret("cfg", "cloud.conf", "autoInstances: true\n").await;
        let op = env.operator().await;
        env.apply_cr("sw", spec("Deployment")).await;
        eventually("Deployment-mode children", || async {
            exists::<Deployment>(&env, "ccm-sw").await
                && exists::<PodDisruptionBudget>(&env, "ccm-sw").await
                && exists::<ServiceAccount>(&env, "ccm-sw").await
                && exists::<RoleBinding>(&env, "ccm-sw").await
                && crb_exists(&env, "sw").await
        })
        .await;

        env.apply_cr("sw", spec("DaemonSet")).await;
        // The Deployment keeps serving while the DaemonSet cannot: no Node matches it yet.
        let progressing = env.wait_status("sw", types::PROGRESSING, "True", progressing::MODE_SWITCHING).await;
        assert!(progressing.message.contains("Deployment keeps serving"), "{}", progressing.message);
        let ds = env.api::<DaemonSet>().get("ccm-sw").await.unwrap();
        let generation = ds.metadata.generation;
        env.write_status::<DaemonSet>(
            "ccm-sw",
            json!({"observedGeneration": generation, "desiredNumberScheduled": 0, "currentNumberScheduled": 0, "numberReady": 0, "numberMisscheduled": 0}),
        )
        .await;
        env.wait_status("sw", types::AVAILABLE, "False", available::NO_MATCHING_NODES).await;
        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
        assert!(exists::<Deployment>(&env, "ccm-sw").await, "the Deployment went before the DaemonSet could serve");
        // The DaemonSet's Pod is available: now the Deployment goes.
        env.write_status::<DaemonSet>(
            "ccm-sw",
            json!({"observedGeneration": generation, "desiredNumberScheduled": 1, "currentNumberScheduled": 1, "updatedNumberScheduled": 1, "numberReady": 1, "numberAvailable": 1, "numberMisscheduled": 0}),
        )
        .await;
        eventually("the Deployment and PDB to be pruned and a DaemonSet to exist", || async {
            !exists::<Deployment>(&env, "ccm-sw").await
                && !exists::<PodDisruptionBudget>(&env, "ccm-sw").await
                && exists::<DaemonSet>(&env, "ccm-sw").await
        })
        .await;
        assert!(exists::<ServiceAccount>(&env, "ccm-sw").await && crb_exists(&env, "sw").await);

        env.apply_cr("sw", spec("Embedded")).await;
        eventually("every child to be pruned in Embedded mode", || async {
            !exists::<DaemonSet>(&env, "ccm-sw").await
                && !exists::<ServiceAccount>(&env, "ccm-sw").await
                && !exists::<RoleBinding>(&env, "ccm-sw").await
                && !crb_exists(&env, "sw").await
        })
        .await;
        // The embedded engine leads on the CR's own Lease.
        env.wait_status("sw", types::AVAILABLE, "True", available::AS_EXPECTED).await;
        env.wait_status("sw", types::PROGRESSING, "False", progressing::AS_EXPECTED).await;
        assert_eq!(lease_holder(&env, "sw").await.as_deref(), Some(op.identity()));
        let cr = env.cr("sw").await;
        assert_eq!(cr.status.unwrap().leader.as_deref(), Some(op.identity()));
        // The engine reports provider health itself.
        env.wait_condition("sw", types::PROVIDER_HEALTHY, |c| c.status == "True").await;

        env.apply_cr("sw", spec("Deployment")).await;
        eventually("the engine to release its Lease and the Deployment to return", || async {
            lease_holder(&env, "sw").await.is_none() && exists::<Deployment>(&env, "ccm-sw").await
        })
        .await;
        op.stop().await.unwrap();
        env.finish().await;
    }
}

testkit::backend_tests! {
    async fn deletion_removes_the_cluster_role_binding_and_stops_the_engine(backend) {
        let env = Env::start(backend, "delete").await;
        env.secret("cfg", "cloud.conf", "autoInstances: true\n").await;
        let op = env.operator().await;
        env.apply_cr("gone", spec("Deployment")).await;
        eventually("the ClusterRoleBinding", || async { crb_exists(&env, "gone").await }).await;
        // Namespaced children go with the CR through the garbage collector: they name it as
        // their controlling owner.
        let uid = env.cr("gone").await.metadata.uid;
        eventually("the children to exist", || async {
            exists::<Deployment>(&env, "ccm-gone").await && exists::<ServiceAccount>(&env, "ccm-gone").await
        })
        .await;
        let owned_by_cr = |refs: Option<Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference>>| {
            refs.unwrap_or_default().iter().any(|r| {
                r.kind == "CloudControllerManager" && Some(&r.uid) == uid.as_ref() && r.controller == Some(true)
            })
        };
        assert!(owned_by_cr(env.api::<Deployment>().get("ccm-gone").await.unwrap().metadata.owner_references));
        assert!(owned_by_cr(env.api::<ServiceAccount>().get("ccm-gone").await.unwrap().metadata.owner_references));
        env.crs().delete("gone", &DeleteParams::default()).await.unwrap();
        eventually("the CR (finalizer removed) and its ClusterRoleBinding to go", || async {
            env.crs().get_opt("gone").await.unwrap().is_none() && !crb_exists(&env, "gone").await
        })
        .await;
        if env.garbage_collects() {
            // The genuine backend collects only with kube-controller-manager beside it
            // (e2e/envtest/setup.sh adds it when the real-cluster kit is there). Its garbage
            // collector learns a freshly installed CRD's kind at its 30 s discovery resync, so
            // the wait is longer than the others (41 s measured on genuine).
            let gone = testkit::poll_within(GC_WAIT, || async {
                (!exists::<Deployment>(&env, "ccm-gone").await && !exists::<ServiceAccount>(&env, "ccm-gone").await)
                    .then_some(())
            })
            .await;
            assert!(gone.is_some(), "namespaced children not garbage-collected within {GC_WAIT:?}");
        }

        // An embedded engine stops and releases its Lease.
        env.apply_cr("emb", spec("Embedded")).await;
        eventually("the engine to lead", || async { lease_holder(&env, "emb").await.is_some() }).await;
        env.crs().delete("emb", &DeleteParams::default()).await.unwrap();
        eventually("the CR to go and the Lease to be released", || async {
            env.crs().get_opt("emb").await.unwrap().is_none() && lease_holder(&env, "emb").await.is_none()
        })
        .await;
        op.stop().await.unwrap();
        env.finish().await;
    }
}

async fn http_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    let path = path.to_string();
    tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(addr).expect("the endpoint accepts connections");
        let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        let code = response.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
        (code, response)
    })
    .await
    .unwrap()
}

testkit::backend_tests! {
    async fn health_readiness_and_metrics_are_served(backend) {
        let env = Env::start(backend, "http").await;
        let mut config = env.operator_config();
        config.http = Some(ccm_framework::http::HttpConfig::plain("127.0.0.1:0".parse().unwrap()));
        let op = operator::start(config).await.unwrap();
        let addr = op.local_addr().expect("an HTTP address");
        env.apply_cr("web", spec("Deployment")).await;
        env.wait_condition("web", types::READY, |_| true).await;
        assert_eq!(http_get(addr, "/healthz").await.0, 200);
        assert_eq!(http_get(addr, "/livez").await.0, 200);
        eventually("/readyz to pass once the CRD is established", || async { http_get(addr, "/readyz").await.0 == 200 })
            .await;
        let (code, body) = http_get(addr, "/metrics").await;
        assert_eq!(code, 200);
        for family in [
            "ccm_operator_reconcile_total",
            "ccm_operator_reconcile_duration_seconds",
            "ccm_operator_writes_total",
            "ccm_operator_leader",
        ] {
            assert!(body.contains(family), "{family} missing from /metrics");
        }
        op.stop().await.unwrap();
        env.finish().await;
    }
}
