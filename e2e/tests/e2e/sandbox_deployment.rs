//! The sandbox demo in Deployment mode: the emulated kubelet runs the manager Deployment's two
//! replicas as real `cloud-controller-manager` processes. Exactly one leads (the Lease holder and
//! each process's `/metrics`); killing the leader's process hands the Lease over and the kubelet
//! restarts it; rotating the cloud-config Secret changes the pod-template hash, the kubelet rolls
//! both processes onto the new config, and the resource goes Progressing, then Available again.

use std::time::Duration;

use crds::CloudControllerManager;
use crds::conditions::types;
use e2e::demo::{self, Demo, DemoMode, DemoOptions, Snapshot};
use e2e::kubelet::{self, PodInfo};
use e2e::probe;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Secret, Service};
use kube::api::{Api, Patch, PatchParams};
use operator::reasons::progressing;
use serde_json::json;
use testkit::{TestApiServer, eventually_within};

const DEPLOYMENT: &str = "ccm-baremetal";
const WAIT: Duration = Duration::from_secs(90);
const ROTATED_POOL: &str = "203.0.113.100-203.0.113.109";

/// Which pods say they lead, from their own `/metrics`.
async fn leaders_by_metrics(pods: &[PodInfo]) -> Option<Vec<String>> {
    let mut leaders = Vec::new();
    for p in pods {
        let r = probe::get(p.address(), "/metrics", Duration::from_secs(2)).await?;
        let v = probe::metric(&r.body, "leader_election_master_status", &format!("name=\"{}\"", demo::CR_NAME))?;
        if v == 1.0 {
            leaders.push(p.name.clone());
        }
    }
    Some(leaders)
}

/// The pod holding the Lease, when exactly one pod says it leads and the Lease agrees.
async fn single_leader(demo: &Demo) -> Option<PodInfo> {
    let pods = demo.kubelet()?.pods_of(demo::NAMESPACE, DEPLOYMENT);
    if pods.len() != 2 || pods.iter().any(|p| !p.ready) {
        return None;
    }
    let holder = demo.snapshot().await.ok()?.leader()?;
    let leaders = leaders_by_metrics(&pods).await?;
    let [leader] = leaders.as_slice() else { return None };
    holder.starts_with(&format!("{leader}_")).then(|| pods.into_iter().find(|p| &p.name == leader)).flatten()
}

fn progressing_reason(s: &Snapshot) -> Option<(String, String)> {
    s.condition(types::PROGRESSING).map(|c| (c.status, c.reason))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_manager_processes_elect_one_leader_hand_over_on_a_crash_and_roll_on_secret_rotation() {
    let binary = kubelet::manager_binary().expect("the cloud-controller-manager binary");
    let server = TestApiServer::start().await.expect("the local API server starts");
    server.install_crd(&crds::crd()).await.expect("the CRD installs");
    let options = DemoOptions {
        mode: DemoMode::Deployment,
        replicas: 2,
        manager_binary: Some(binary),
        work_root: None,
        loopback_net: 23,
    };
    let say = |line: &str| eprintln!("{line}");
    let demo = Demo::start(server.client(), server.kubeconfig_path(), options, &say).await.expect("the demo starts");
    let snap = demo.wait_until_complete(WAIT, &say).await.expect("the final picture");
    assert_eq!(snap.initialized_nodes().len(), demo::MACHINES.len());
    assert!(snap.external_ip().is_some_and(|ip| ip.starts_with("127.23.0.")));
    let kubelet = demo.kubelet().expect("Deployment mode has a kubelet");

    // Two processes, exactly one leads.
    let leader = eventually_within("exactly one leader among two ready processes", WAIT, || single_leader(&demo)).await;
    let pods = kubelet.pods_of(demo::NAMESPACE, DEPLOYMENT);
    assert_eq!(pods.len(), 2);
    let deployments: Api<Deployment> = Api::namespaced(server.client(), demo::NAMESPACE);
    let d = deployments.get(DEPLOYMENT).await.unwrap();
    let status = d.status.clone().unwrap();
    assert_eq!((status.replicas, status.ready_replicas, status.updated_replicas), (Some(2), Some(2), Some(2)));
    assert_eq!(status.observed_generation, d.metadata.generation);
    eprintln!("{}", demo.picture().await.unwrap());

    // A crash of the leader: the other process takes the Lease, the kubelet restarts the crashed one.
    let old_pid = leader.pid;
    assert!(kubelet.kill(&leader.name), "the leader's process runs");
    let new_leader = eventually_within("the other process to take over", WAIT, || async {
        single_leader(&demo).await.filter(|l| l.name != leader.name)
    })
    .await;
    let restarted = eventually_within("the crashed process to be restarted and ready", WAIT, || async {
        kubelet
            .pods_of(demo::NAMESPACE, DEPLOYMENT)
            .into_iter()
            .find(|p| p.name == leader.name && p.ready && p.restarts == 1)
    })
    .await;
    assert_ne!(restarted.pid, old_pid);
    assert_ne!(new_leader.name, leader.name);
    let crs: Api<CloudControllerManager> = Api::namespaced(server.client(), demo::NAMESPACE);
    eventually_within("Available after the hand-over", WAIT, || async {
        let s = demo.snapshot().await.ok()?;
        (s.is_true(types::AVAILABLE) && s.leader()?.starts_with(&format!("{}_", new_leader.name))).then_some(())
    })
    .await;

    // Rotating the cloud-config: a new pod template, both processes replaced with the new config.
    let before: Vec<PodInfo> = kubelet.pods_of(demo::NAMESPACE, DEPLOYMENT);
    let old_hash = before[0].template_hash.clone();
    let rotated = demo::cloud_config(23, ROTATED_POOL);
    let secrets: Api<Secret> = Api::namespaced(server.client(), demo::NAMESPACE);
    let secret = json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": demo::SECRET_NAME, "namespace": demo::NAMESPACE, "labels": {(crds::CLOUD_CONFIG_LABEL): crds::CLOUD_CONFIG_LABEL_VALUE}},
        "stringData": {demo::SECRET_KEY: rotated}});
    secrets
        .patch(demo::SECRET_NAME, &PatchParams::apply("sandbox-demo").force(), &Patch::Apply(&secret))
        .await
        .unwrap();
    eventually_within("Progressing=True RollingOut", WAIT, || async {
        let s = demo.snapshot().await.ok()?;
        (progressing_reason(&s) == Some(("True".into(), progressing::ROLLING_OUT.into()))).then_some(())
    })
    .await;
    let after = eventually_within("both processes on the new template, ready", WAIT, || async {
        let pods = kubelet.pods_of(demo::NAMESPACE, DEPLOYMENT);
        (pods.len() == 2 && pods.iter().all(|p| p.template_hash != old_hash && p.ready)).then_some(pods)
    })
    .await;
    for p in &after {
        assert!(before.iter().all(|b| b.pid != p.pid), "{} is a new process", p.name);
        let file = p.cloud_config.as_ref().expect("a cloud-config copy");
        let content = std::fs::read_to_string(file).expect("the copy is readable");
        assert!(content.contains(ROTATED_POOL), "{} runs with the rotated cloud-config", p.name);
        assert!(p.args.iter().any(|a| a == &format!("--cloud-config={}", file.display())));
    }
    eventually_within("Progressing=False and Available=True after the rollout", WAIT, || async {
        let s = demo.snapshot().await.ok()?;
        let done = progressing_reason(&s).is_some_and(|(st, _)| st == "False")
            && s.is_true(types::AVAILABLE)
            && s.is_true(types::READY);
        done.then_some(())
    })
    .await;
    eventually_within("exactly one leader after the rollout", WAIT, || single_leader(&demo)).await;
    let d = deployments.get(DEPLOYMENT).await.unwrap();
    let progressing = d.status.unwrap().conditions.unwrap().into_iter().find(|c| c.type_ == "Progressing").unwrap();
    assert_eq!(progressing.reason.as_deref(), Some("NewReplicaSetAvailable"));

    // The new config is the one in force: a new Service gets an address of the rotated pool.
    let services: Api<Service> = Api::namespaced(server.client(), "default");
    let svc = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "after-rotation"},
        "spec": {"type": "LoadBalancer", "ports": [{"port": 443, "protocol": "TCP"}]}});
    services.patch("after-rotation", &PatchParams::apply("sandbox-demo"), &Patch::Apply(&svc)).await.unwrap();
    let ip = eventually_within("an address from the rotated pool", WAIT, || async {
        let s = services.get("after-rotation").await.ok()?;
        s.status?.load_balancer?.ingress?.first()?.ip.clone()
    })
    .await;
    let last: u8 = ip.strip_prefix("203.0.113.").and_then(|o| o.parse().ok()).unwrap_or(0);
    assert!((100..=109).contains(&last), "{ip} is from {ROTATED_POOL}");
    assert!(crs.get(demo::CR_NAME).await.unwrap().status.is_some());
    eprintln!("{}", demo.picture().await.unwrap());

    let work_dir = kubelet.work_dir().to_path_buf();
    let pids: Vec<u32> = kubelet.pods().iter().filter_map(|p| p.pid).collect();
    demo.shutdown().await;
    assert!(!work_dir.exists(), "the kubelet's directory (cloud-config copies) is removed");
    for pid in pids {
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists(), "process {pid} is gone");
    }
    server.shutdown().await;
}
