//! The sandbox demo as the README runs it (`cargo run -p e2e --bin sandbox`): the binary, in
//! Embedded mode, reaches the final picture (every Node initialized with a providerID, the
//! Service's external IP, the resource Ready), carries traffic on the external IP (the printed
//! `curl` line, a port added live, a Node deleted), keeps serving for kubectl, and stops cleanly
//! on Ctrl-C.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crds::CloudControllerManager;
use e2e::demo::{self, MACHINES};
use k8s_openapi::api::core::v1::{Node, Service};
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Loopback network of this test's sandbox (127.21.0.240/28, Nodes 127.21.1.x), apart from
/// the other tests' sandboxes.
const NET: &str = "21";

/// GET `url` (`http://ip:port/`) the way the printed `curl` line does: the response body.
async fn get(url: &str) -> Option<String> {
    let addr = url.strip_prefix("http://")?.trim_end_matches('/').to_string();
    let connect = tokio::net::TcpStream::connect(addr);
    let mut stream = tokio::time::timeout(Duration::from_secs(2), connect).await.ok()?.ok()?;
    stream.write_all(b"GET / HTTP/1.1\r\nHost: sandbox\r\nConnection: close\r\n\r\n").await.ok()?;
    let mut response = String::new();
    tokio::time::timeout(Duration::from_secs(2), stream.read_to_string(&mut response)).await.ok()?.ok()?;
    response.split_once("\r\n\r\n").map(|(_, body)| body.to_string())
}

/// Retry `get` for up to 10 s until the body satisfies `ok`.
async fn get_until(url: &str, ok: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut last = None;
    while Instant::now() < deadline {
        last = get(url).await;
        if last.as_deref().is_some_and(&ok) {
            return last.unwrap_or_default();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("GET {url}: no expected answer within 10 s; last: {last:?}");
}

/// Kills the sandbox if the test fails before it stops it.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedded_demo_reaches_the_final_picture_and_keeps_serving() {
    let dir = std::env::temp_dir().join(format!("sandbox-embedded-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    let started = Instant::now();
    let child = Command::new(env!("CARGO_BIN_EXE_sandbox"))
        .args(["--port", "0", "--loopback-net", NET, "--kubeconfig"])
        .arg(&kubeconfig)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the sandbox starts");
    let mut guard = Guard(child);
    let stdout = guard.0.stdout.take().unwrap();
    let rx = crate::kit::line_channel(stdout);

    let (progress, done) = crate::kit::read_until(&rx, None, Duration::from_secs(120), |l| l.contains("] done:"));
    assert!(done, "the demo never reached its final picture:\n{}", progress.join("\n"));
    let took = started.elapsed();
    let (rest, printed) = crate::kit::read_until(&rx, None, Duration::from_secs(30), |l| l.starts_with("Press Ctrl-C"));
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
    assert!(picture.contains("service/web") && picture.contains("127.21.0."), "{picture}");
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
    let ip = ip.expect("an external IP");
    assert!(ip.starts_with("127.21.0."), "{ip}");
    let cr =
        Api::<CloudControllerManager>::namespaced(client.clone(), demo::NAMESPACE).get(demo::CR_NAME).await.unwrap();
    assert!(cr.status.unwrap().conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True"));

    // The printed curl line works, with curl itself where the machine has it.
    let curl = picture.lines().map(str::trim).find(|l| l.starts_with("curl http://")).expect("a curl line");
    let url = curl.strip_prefix("curl ").unwrap().to_string();
    assert_eq!(url, format!("http://{ip}:{}/", demo::SERVICE_PORT));
    let answer = |body: &str| body.starts_with("node=bm-node-") && body.ends_with(" service=default/web\n");
    if Command::new("curl").arg("--version").output().is_ok() {
        let out = Command::new("sh").args(["-c", &format!("{curl} --silent --max-time 5")]).output().unwrap();
        let body = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(out.status.success() && answer(&body), "`{curl}` printed {body:?}");
    } else {
        eprintln!("no curl on this machine: the same GET from the test instead");
    }
    let body = get_until(&url, answer).await;
    eprintln!("GET {url}: {body}");

    // A port added to the live Service: logged, and it answers within seconds.
    let alt = demo::SERVICE_PORT + 1;
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let add_port = serde_json::json!([{"op": "add", "path": "/spec/ports/-",
        "value": {"name": "alt", "port": alt, "targetPort": 8080, "protocol": "TCP"}}]);
    let added = Instant::now();
    services
        .patch(
            demo::SERVICE_NAME,
            &PatchParams::default(),
            &Patch::<()>::Json(serde_json::from_value(add_port).unwrap()),
        )
        .await
        .unwrap();
    let (log, found) = crate::kit::read_until(&rx, None, Duration::from_secs(10), |l| {
        l.contains("ports now") && l.contains(&format!("{alt}/TCP"))
    });
    assert!(found, "the new port is not in the live log:\n{}", log.join("\n"));
    get_until(&format!("http://{ip}:{alt}/"), answer).await;
    eprintln!("port {alt} logged and answering after {:?}", added.elapsed());
    assert!(get(&url).await.is_some_and(|b| answer(&b)), "the first port still answers");

    // A deleted Node: logged, and only the others answer.
    Api::<Node>::all(client.clone()).delete("bm-node-3", &DeleteParams::default()).await.unwrap();
    let (log, found) =
        crate::kit::read_until(&rx, None, Duration::from_secs(10), |l| l.contains("Node bm-node-3 deleted"));
    assert!(found, "the deleted Node is not in the live log:\n{}", log.join("\n"));
    // Within seconds, six answers in a row come from the other Nodes.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut bodies = Vec::new();
        for _ in 0..6 {
            bodies.push(get_until(&url, answer).await);
        }
        if bodies.iter().all(|b| !b.contains("bm-node-3")) {
            break;
        }
        assert!(Instant::now() < deadline, "the deleted Node still answers after 10 s: {bodies:?}");
    }

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
