//! Operator scenarios: two operator replicas, one leads; a crash hands over; an idle
//! operator writes nothing.

use std::time::Duration;

use crate::kit::{Env, HARNESS_AGENT, by_code_under_test, micro_now};
use ccm_framework::leader::LeaderElectionConfig;
use crds::conditions::types;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Patch, PatchParams};
use operator::OperatorHandle;
use serde_json::json;
use testkit::{eventually, poll_within};

async fn start_replica(env: &Env, identity: &str) -> OperatorHandle {
    let mut config = env.operator_config();
    config.identity = identity.to_string();
    config.leader_election = Some(LeaderElectionConfig {
        namespace: env.ns.clone(),
        name: operator::names::OPERATOR_LEASE.to_string(),
        identity: identity.to_string(),
        lease_duration: Duration::from_secs(4),
        renew_deadline: Duration::from_secs(3),
        retry_period: Duration::from_millis(500),
        release_on_cancel: true,
    });
    operator::start(config).await.expect("the operator starts")
}

async fn holder(env: &Env, lease: &str) -> Option<String> {
    env.api::<Lease>().get_opt(lease).await.ok()??.spec?.holder_identity.filter(|h| !h.is_empty())
}

/// Fast Lease timings for the CR's own election (embedded engine).
const FAST_LEASE: &str = r#"{"leaseDuration": "4s", "renewDeadline": "3s", "retryPeriod": "1s"}"#;

testkit::backend_tests! {
    async fn only_one_operator_reconciles_and_a_crash_hands_over(backend) {
        let env = Env::start(backend, "failover").await;
        env.secret("cfg", "cloud.conf", "autoInstances: true\n").await;
        let a = start_replica(&env, "operator-a").await;
        let b = start_replica(&env, "operator-b").await;
        let leader_id = poll_within(testkit::WAIT, || async { holder(&env, "ccm-operator").await })
            .await
            .expect("one operator leads");
        let (leader, standby) = if leader_id == "operator-a" { (a, b) } else { (b, a) };
        leader.wait_leading(true).await;
        assert!(!standby.is_leading(), "both replicas lead");

        let le: serde_json::Value = serde_json::from_str(FAST_LEASE).unwrap();
        env.apply_cr("dep", json!({"provider": "fake", "configureCloudRoutes": false, "controllers": ["cloud-node"]}))
            .await;
        env.apply_cr(
            "emb",
            json!({"provider": "fake", "mode": "Embedded", "configureCloudRoutes": false, "controllers": ["service"],
                   "cloudConfig": {"secretRef": {"name": "cfg"}}, "leaderElection": le}),
        )
        .await;
        eventually("the leader to deploy and to run the embedded engine", || async {
            env.api::<Deployment>().get_opt("ccm-dep").await.unwrap().is_some()
                && holder(&env, "emb").await.as_deref() == Some(leader.identity())
        })
        .await;

        // Crash the leader: nothing is released, the standby waits the Leases out.
        let standby_id = standby.identity().to_string();
        leader.abort();
        tokio::time::timeout(Duration::from_secs(20), standby.wait_leading(true)).await.expect("the standby takes over");
        env.apply_cr(
            "dep",
            json!({"provider": "fake", "configureCloudRoutes": false, "controllers": ["cloud-node"], "deployment": {"replicas": 3}}),
        )
        .await;
        eventually("the new leader to reconcile changes", || async {
            env.api::<Deployment>().get("ccm-dep").await.unwrap().spec.unwrap().replicas == Some(3)
        })
        .await;
        eventually("the new leader's engine to take the CR's Lease", || async {
            holder(&env, "emb").await.as_deref() == Some(standby_id.as_str())
        })
        .await;
        env.wait_condition("emb", types::AVAILABLE, |c| c.status == "True" && c.message.contains(&standby_id)).await;

        // A graceful stop releases both Leases at once.
        standby.stop().await.unwrap();
        assert_eq!(holder(&env, "ccm-operator").await, None, "the operator Lease is released");
        assert_eq!(holder(&env, "emb").await, None, "the engine's Lease is released");
        env.finish().await;
    }
}

testkit::backend_tests! {
    async fn an_idle_operator_neither_applies_nor_writes_status(backend) {
        let env = Env::start(backend, "idle").await;
        let log = env.request_log();
        let idle = Duration::from_secs(std::env::var("E2E_IDLE_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(60));
        env.secret("cfg", "cloud.conf", "autoInstances: true\n").await;
        let op = env.operator().await;
        let base = json!({"provider": "fake", "configureCloudRoutes": false});
        let with = |extra: serde_json::Value| {
            let mut s = base.clone();
            for (k, v) in extra.as_object().unwrap() {
                s[k] = v.clone();
            }
            s
        };
        env.apply_cr("dep", with(json!({"controllers": ["cloud-node"], "cloudConfig": {"secretRef": {"name": "cfg"}}})))
            .await;
        env.apply_cr("loser", with(json!({"controllers": ["cloud-node"]}))).await;
        env.apply_cr("ds", with(json!({"controllers": ["service"], "mode": "DaemonSet"}))).await;
        env.apply_cr("emb", with(json!({"controllers": ["cloud-node-lifecycle"], "mode": "Embedded"}))).await;
        env.apply_cr("bad", json!({"provider": "nimbus"})).await;

        // Play the deployment controller and the manager for `dep`, renewing its Lease throughout.
        let d = poll_within(testkit::WAIT, || async {
            env.api::<Deployment>().get_opt("ccm-dep").await.ok().flatten()
        })
        .await
        .unwrap();
        env.write_status::<Deployment>(
            "ccm-dep",
            json!({"observedGeneration": d.metadata.generation, "replicas": 2, "updatedReplicas": 2, "readyReplicas": 2, "availableReplicas": 2}),
        )
        .await;
        let ds = poll_within(testkit::WAIT, || async {
            env.api::<DaemonSet>().get_opt("ccm-ds").await.ok().flatten()
        })
        .await
        .unwrap();
        env.write_status::<DaemonSet>(
            "ccm-ds",
            json!({"observedGeneration": ds.metadata.generation, "desiredNumberScheduled": 1, "currentNumberScheduled": 1,
                   "updatedNumberScheduled": 1, "numberReady": 1, "numberAvailable": 1, "numberMisscheduled": 0}),
        )
        .await;
        let renew = {
            let leases = env.api::<Lease>();
            let ns = env.ns.clone();
            tokio::spawn(async move {
                loop {
                    let lease = json!({
                        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                        "metadata": {"name": "dep", "namespace": ns},
                        "spec": {"holderIdentity": "manager-0", "leaseDurationSeconds": 15, "renewTime": micro_now()},
                    });
                    let _ = leases.patch("dep", &PatchParams::apply(HARNESS_AGENT).force(), &Patch::Apply(&lease)).await;
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
            })
        };
        env.wait_status("dep", types::AVAILABLE, "True", operator::reasons::available::AS_EXPECTED).await;
        env.wait_status("emb", types::AVAILABLE, "True", operator::reasons::available::AS_EXPECTED).await;
        env.wait_condition("emb", types::PROVIDER_HEALTHY, |c| c.status == "True").await;
        env.wait_status("loser", types::CONFIG_VALID, "False", operator::reasons::config_valid::CONFLICT).await;
        env.wait_status("bad", types::CONFIG_VALID, "False", operator::reasons::config_valid::UNKNOWN_PROVIDER).await;
        // Let the last triggers drain.
        tokio::time::sleep(Duration::from_secs(3)).await;

        let mark = log.mark();
        tokio::time::sleep(idle).await;
        let records = log.since(mark);
        let writes: Vec<String> = records
            .iter()
            .filter(|r| {
                r.is_write() && by_code_under_test(r) && r.resource.as_deref() != Some("leases.coordination.k8s.io")
            })
            .map(|r| {
                format!(
                    "{} {} {}?{} ({:?}, {:?})",
                    r.verb,
                    r.path,
                    r.subresource.as_deref().unwrap_or(""),
                    r.query,
                    r.field_manager,
                    r.user
                )
            })
            .collect();
        assert!(writes.is_empty(), "writes during {idle:?} of idle:\n{}", writes.join("\n"));
        let reads =
            records.iter().filter(|r| by_code_under_test(r) && matches!(r.verb.as_str(), "get" | "list")).count();
        println!(
            "{} requests by the operator during {idle:?} of idle, {reads} of them get/list",
            records.iter().filter(|r| by_code_under_test(r)).count()
        );
        renew.abort();
        op.stop().await.unwrap();
        env.finish().await;
    }
}
