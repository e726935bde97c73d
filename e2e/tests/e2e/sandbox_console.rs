//! The sandbox as a console: a busy port is named with the `--port 0` hint, the per-run
//! kubeconfig is printed and removed on exit, and after the picture the live log reports what
//! happens in the cluster, here a leader's crash and a cloud-config rotation, each within 2 s.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use e2e::demo;
use e2e::kubelet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

/// How soon a change must show in the live log.
const LIVE: Duration = Duration::from_secs(2);

/// Kills the sandbox if the test fails before it stops it.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The sandbox binary with `args`, its stdout lines on a channel.
fn start(args: &[&str]) -> (Guard, mpsc::Receiver<String>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sandbox"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the sandbox starts");
    let stdout = child.stdout.take().unwrap();
    let rx = crate::kit::line_channel(stdout);
    (Guard(child), rx)
}

/// SIGINT (Ctrl-C), then the exit status within 30 s.
fn interrupt(guard: &mut Guard) -> Option<std::process::ExitStatus> {
    let pid = guard.0.id().to_string();
    assert!(Command::new("kill").args(["-s", "INT", &pid]).status().unwrap().success());
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(s) = guard.0.try_wait().unwrap() {
            return Some(s);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

async fn client_for(kubeconfig: &std::path::Path) -> Client {
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(kubeconfig).expect("the kubeconfig is written"),
        &Default::default(),
    )
    .await
    .unwrap();
    Client::try_from(config).unwrap()
}

#[test]
fn a_busy_port_is_named_with_the_port_0_hint() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_sandbox"))
        .args(["--server-only", "--port", &port])
        .output()
        .expect("the sandbox runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains(&format!("127.0.0.1:{port} is already in use")), "{err}");
    assert!(err.contains("--port 0"), "{err}");
}

#[test]
fn the_default_kubeconfig_is_per_run_printed_and_removed_on_exit() {
    let (mut guard, rx) = start(&["--server-only", "--port", "0"]);
    let (lines, found) =
        crate::kit::read_until(&rx, Some("sandbox"), Duration::from_secs(30), |l| l.starts_with("Kubeconfig: "));
    assert!(found, "no kubeconfig line:\n{}", lines.join("\n"));
    let path = PathBuf::from(lines.last().unwrap().trim_start_matches("Kubeconfig: "));
    let pid = guard.0.id();
    assert!(path.display().to_string().contains(&format!("ccm-operator-sandbox-{pid}")), "{}", path.display());
    assert!(path.is_file(), "{} exists while the sandbox runs", path.display());
    let status = interrupt(&mut guard);
    assert!(status.is_some_and(|s| s.success()), "the sandbox did not stop cleanly: {status:?}");
    assert!(!path.exists(), "{} is removed on exit", path.display());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_live_log_shows_a_leader_crash_and_a_secret_rotation_within_2s() {
    let binary = kubelet::manager_binary().expect("the cloud-controller-manager binary");
    let dir = std::env::temp_dir().join(format!("sandbox-console-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    let (mut guard, rx) = start(&[
        "--mode",
        "deployment",
        "--port",
        "0",
        "--loopback-net",
        "22",
        "--kubeconfig",
        &kubeconfig.display().to_string(),
        "--manager-binary",
        &binary.display().to_string(),
    ]);
    let (lines, found) =
        crate::kit::read_until(&rx, Some("sandbox"), Duration::from_secs(150), |l| l.contains("] live log:"));
    assert!(found, "the sandbox never reached its live log:\n{}", lines.join("\n"));
    let client = client_for(&kubeconfig).await;

    // The leader's process, by its Lease: its pod name starts the holder identity.
    let leases: Api<Lease> = Api::namespaced(client.clone(), demo::NAMESPACE);
    let holder = leases.get(demo::CR_NAME).await.unwrap().spec.unwrap().holder_identity.expect("a leader");
    let pod = holder.split('_').next().unwrap().to_string();
    let table = lines.iter().find(|l| l.starts_with(&format!("{pod} "))).expect("the leader is in the process table");
    let pid = table.split_whitespace().nth(1).unwrap().to_string();
    let killed = Instant::now();
    assert!(Command::new("kill").args(["-9", &pid]).status().unwrap().success());
    let (log, found) = crate::kit::read_until(&rx, Some("sandbox"), LIVE, |l| {
        l.contains(&format!("process {pod} (the leader) exited"))
    });
    assert!(found, "the leader's crash is not in the live log within {LIVE:?}:\n{}", log.join("\n"));
    eprintln!("crash logged after {:?}", killed.elapsed());
    let (log, found) = crate::kit::read_until(&rx, Some("sandbox"), Duration::from_secs(30), |l| {
        l.contains("leader: ") && l.contains(" holds Lease") && !l.contains(&format!("leader: {holder} "))
    });
    assert!(found, "the hand-over is not in the live log:\n{}", log.join("\n"));

    // Rotating the cloud-config Secret.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), demo::NAMESPACE);
    let secret = json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": demo::SECRET_NAME, "namespace": demo::NAMESPACE, "labels": {(crds::CLOUD_CONFIG_LABEL): crds::CLOUD_CONFIG_LABEL_VALUE}},
        "stringData": {demo::SECRET_KEY: demo::cloud_config(22, "203.0.113.100-203.0.113.109")}});
    let rotated = Instant::now();
    secrets
        .patch(demo::SECRET_NAME, &PatchParams::apply("sandbox-demo").force(), &Patch::Apply(&secret))
        .await
        .unwrap();
    let (log, found) = crate::kit::read_until(&rx, Some("sandbox"), LIVE, |l| {
        l.contains(&format!("Secret {}/{} changed", demo::NAMESPACE, demo::SECRET_NAME))
    });
    assert!(found, "the rotation is not in the live log within {LIVE:?}:\n{}", log.join("\n"));
    eprintln!("rotation logged after {:?}", rotated.elapsed());
    let (log, found) = crate::kit::read_until(&rx, Some("sandbox"), Duration::from_secs(60), |l| {
        l.contains("replaced by the rollout")
    });
    assert!(found, "the rollout is not in the live log:\n{}", log.join("\n"));

    let status = interrupt(&mut guard);
    assert!(status.is_some_and(|s| s.success()), "the sandbox did not stop cleanly: {status:?}");
    assert!(!kubeconfig.exists(), "the kubeconfig is removed on exit");
    let _ = std::fs::remove_dir_all(&dir);
}
