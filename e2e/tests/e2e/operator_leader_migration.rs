//! Operator scenario M7, ours to ours: a CloudControllerManager moved to a new name in the same
//! namespace (create the new one with leader migration on, delete the old one) hands its migrated
//! controllers over through the migration Lease, without a gap longer than the lease duration and
//! without both managers running them at once. The emulated kubelet runs each resource's
//! Deployment as real `cloud-controller-manager` processes; which controllers each runs is read
//! from their `/metrics` (`running_managed_controllers`), the Lease's holder from the API.

use std::time::{Duration, Instant};

use crate::kit::Env;
use e2e::kubelet::{self, Kubelet, KubeletConfig, PodInfo};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::DeleteParams;
use serde_json::{Value, json};

/// The resources' lease duration.
const LEASE: Duration = Duration::from_secs(4);
/// Upstream's default migration Lease, which both resources use.
const MIGRATION_LEASE: &str = "cloud-provider-extraction-migration";
/// Upstream's default migrated controllers this provider runs (routes are off), by metric name.
const MIGRATED: [&str; 2] = ["cloud-node-lifecycle", "service"];
const WAIT: Duration = Duration::from_secs(90);

/// cloud-node-controller is not in upstream's default migration set, so both resources leave it
/// out (it would otherwise run under each one's own Lease, which the operator refuses as a
/// conflict).
fn spec() -> Value {
    json!({
        "provider": "fake",
        "controllers": ["*", "-cloud-node"],
        "configureCloudRoutes": false,
        "cloudConfig": {"secretRef": {"name": "cfg"}},
        "deployment": {"replicas": 1},
        "leaderElection": {"leaseDuration": "4s", "renewDeadline": "3s", "retryPeriod": "1s", "migration": {"enabled": true}},
    })
}

/// Whether any running pod of `deployment` runs every migrated controller, by its `/metrics`.
async fn runs_migrated(kubelet: &Kubelet, ns: &str, deployment: &str) -> bool {
    for pod in kubelet.pods_of(ns, deployment) {
        if runs(&pod).await {
            return true;
        }
    }
    false
}

async fn runs(pod: &PodInfo) -> bool {
    let Some(r) = ccm_framework::serving::probe::get(pod.address(), "/metrics", None, Duration::from_secs(1)).await
    else {
        return false;
    };
    MIGRATED.iter().all(|c| {
        r.body.lines().any(|l| {
            l.starts_with("running_managed_controllers{") && l.contains(&format!("name=\"{c}\"")) && l.ends_with(" 1")
        })
    })
}

async fn holder(env: &Env, lease: &str) -> Option<String> {
    env.api::<Lease>().get_opt(lease).await.ok().flatten()?.spec?.holder_identity
}

/// One observation of both resources' managers.
struct Sample {
    at: Instant,
    old: bool,
    new: bool,
    holder: Option<String>,
}

async fn sample(env: &Env, kubelet: &Kubelet) -> Sample {
    let (old, new) =
        (runs_migrated(kubelet, &env.ns, "ccm-old").await, runs_migrated(kubelet, &env.ns, "ccm-new").await);
    Sample { at: Instant::now(), old, new, holder: holder(env, MIGRATION_LEASE).await }
}

e2e_apiserver::backend_tests! {
    async fn m7_a_resource_moved_to_a_new_name_hands_its_migrated_controllers_over_without_a_gap_or_an_overlap(backend) {
        let env = Env::start(backend, "migration").await;
        let binary = kubelet::manager_binary().expect("the cloud-controller-manager binary");
        let kubelet = Kubelet::start(KubeletConfig::new(env.client.clone(), env.cluster.kubeconfig_path(), binary))
            .expect("the emulated kubelet starts");
        env.secret("cfg", "cloud.conf", "autoInstances: true\nlatency: 1ms\n").await;
        let op = env.operator().await;
        env.apply_cr("old", spec()).await;
        let mut samples = Vec::new();
        let started = Instant::now();
        loop {
            let s = sample(&env, &kubelet).await;
            let done = s.old;
            samples.push(s);
            if done {
                break;
            }
            assert!(started.elapsed() < WAIT, "the old resource's manager never ran the migrated controllers");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let old_holder = holder(&env, MIGRATION_LEASE).await.expect("the migration Lease is held");
        assert!(old_holder.starts_with("ccm-old-"), "{old_holder}");

        // The new resource is valid beside the old one (no Conflict) and leads its own Lease, but
        // does not run the migrated controllers while the old one holds the migration Lease.
        env.apply_cr("new", spec()).await;
        env.wait_condition("new", "ConfigValid", |c| c.status == "True").await;
        let started = Instant::now();
        while !holder(&env, "new").await.is_some_and(|h| h.starts_with("ccm-new-")) {
            assert!(started.elapsed() < WAIT, "the new resource's manager never led its own Lease");
            samples.push(sample(&env, &kubelet).await);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        for _ in 0..20 {
            samples.push(sample(&env, &kubelet).await);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }

        // Delete the old resource: its manager stops, releases the Lease, the new one takes over.
        env.crs().delete("old", &DeleteParams::default()).await.unwrap();
        let deleted = Instant::now();
        loop {
            let s = sample(&env, &kubelet).await;
            let done = s.new && !s.old;
            samples.push(s);
            if done {
                break;
            }
            assert!(deleted.elapsed() < WAIT, "the new resource's manager never took the migrated controllers over");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        for _ in 0..10 {
            samples.push(sample(&env, &kubelet).await);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }

        let overlaps = samples.iter().filter(|s| s.old && s.new).count();
        let last_old = samples.iter().rev().find(|s| s.old).map(|s| s.at).expect("the old manager ran them");
        let first_new = samples.iter().find(|s| s.new).map(|s| s.at).expect("the new manager ran them");
        let gap = first_new.saturating_duration_since(last_old);
        let mut transitions = Vec::new();
        for s in &samples {
            if transitions.last().map(|(_, h): &(Instant, Option<String>)| h) != Some(&s.holder) {
                transitions.push((s.at, s.holder.clone()));
            }
        }
        let history: Vec<String> = transitions
            .iter()
            .map(|(at, h)| {
                let ms = at.saturating_duration_since(deleted).as_millis() as i128
                    - deleted.saturating_duration_since(*at).as_millis() as i128;
                format!("{ms:+} ms: {}", h.as_deref().unwrap_or("(none)"))
            })
            .collect();
        println!(
            "ours to ours ({}): longest interval with no manager running {:?}: {gap:?} (lease {LEASE:?}); samples with both running them: {overlaps} of {}; {MIGRATION_LEASE} holders relative to the deletion: {history:?}",
            env.cluster.backend().name(),
            MIGRATED,
            samples.len()
        );
        assert_eq!(overlaps, 0, "both managers ran the migrated controllers at once");
        assert!(gap <= LEASE, "the hand-over left them unowned for {gap:?}, longer than the {LEASE:?} lease");
        let new_holder = holder(&env, MIGRATION_LEASE).await.expect("the migration Lease is held");
        assert!(new_holder.starts_with("ccm-new-"), "{new_holder}");
        op.stop().await.unwrap();
        kubelet.shutdown().await;
        env.finish().await;
    }
}
