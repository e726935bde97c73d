//! The sandbox demo as the README runs it (`cargo run -p e2e --bin sandbox`): the binary, in
//! Embedded mode, reaches the final picture (every Node initialized with a providerID, the
//! Service's external IP, the resource Ready), keeps serving for kubectl, and stops cleanly on
//! Ctrl-C.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crds::CloudControllerManager;
use e2e::demo::{self, MACHINES};
use k8s_openapi::api::core::v1::{Node, Service};
use kube::Client;
use kube::api::Api;

/// Kills the sandbox if the test fails before it stops it.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Lines of the sandbox's stdout until `until` matches one (or the timeout).
fn read_until(rx: &mpsc::Receiver<String>, timeout: Duration, until: impl Fn(&str) -> bool) -> (Vec<String>, bool) {
    let deadline = Instant::now() + timeout;
    let mut lines = Vec::new();
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        match rx.recv_timeout(left) {
            Ok(line) => {
                let done = until(&line);
                lines.push(line);
                if done {
                    return (lines, true);
                }
            }
            Err(_) => break,
        }
    }
    (lines, false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedded_demo_reaches_the_final_picture_and_keeps_serving() {
    let dir = std::env::temp_dir().join(format!("sandbox-embedded-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    let started = Instant::now();
    let child = Command::new(env!("CARGO_BIN_EXE_sandbox"))
        .args(["--port", "0", "--kubeconfig"])
        .arg(&kubeconfig)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the sandbox starts");
    let mut guard = Guard(child);
    let stdout = guard.0.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });

    let (progress, done) = read_until(&rx, Duration::from_secs(120), |l| l.contains("] done:"));
    assert!(done, "the demo never reached its final picture:\n{}", progress.join("\n"));
    let took = started.elapsed();
    let (rest, printed) = read_until(&rx, Duration::from_secs(30), |l| l.starts_with("Press Ctrl-C"));
    assert!(printed, "the picture and instructions were not printed:\n{}", rest.join("\n"));
    let picture = rest.join("\n");
    eprintln!("{}\n{picture}\n(final picture after {took:?})", progress.join("\n"));

    // The picture, as kubectl would show it.
    assert!(picture.contains("cloudcontrollermanager.ccm.rs/baremetal"), "{picture}");
    for (name, _, _) in MACHINES {
        assert!(
            picture.contains(&format!("baremetal://{name}")),
            "{name} is not initialized in the picture:\n{picture}"
        );
    }
    let ccm_row = picture.lines().find(|l| l.starts_with("cloudcontrollermanager.ccm.rs/")).unwrap();
    assert!(ccm_row.contains("Embedded") && ccm_row.contains("True"), "{ccm_row}");
    assert!(picture.contains("service/web") && picture.contains("203.0.113."), "{picture}");
    assert!(picture.contains(&format!("export KUBECONFIG={}", kubeconfig.display())), "{picture}");
    assert!(picture.contains("kubectl get ccm,nodes,svc"), "{picture}");

    // Still serving: the same state through the printed kubeconfig.
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(&kubeconfig).expect("the kubeconfig is written"),
        &Default::default(),
    )
    .await
    .unwrap();
    let client = Client::try_from(config).unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    for n in nodes.list(&Default::default()).await.unwrap() {
        let spec = n.spec.unwrap_or_default();
        assert!(spec.provider_id.is_some_and(|p| p.starts_with("baremetal://")));
        assert!(!spec.taints.iter().flatten().any(|t| t.key == demo::UNINITIALIZED));
    }
    let svc = Api::<Service>::namespaced(client.clone(), "default").get(demo::SERVICE_NAME).await.unwrap();
    let ip = svc.status.and_then(|s| s.load_balancer?.ingress?.first()?.ip.clone());
    assert!(ip.is_some_and(|ip| ip.starts_with("203.0.113.")));
    let cr = Api::<CloudControllerManager>::namespaced(client, demo::NAMESPACE).get(demo::CR_NAME).await.unwrap();
    assert!(cr.status.unwrap().conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True"));

    // Ctrl-C stops it.
    let pid = guard.0.id().to_string();
    assert!(Command::new("kill").args(["-s", "INT", &pid]).status().unwrap().success());
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = guard.0.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status.is_some_and(|s| s.success()), "the sandbox did not stop cleanly on Ctrl-C: {status:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
