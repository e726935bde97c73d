//! The endpoint server (`ccm_framework::serving`) over real sockets: HTTPS by default, delegated
//! authentication and authorization (with a mock reviewer here; the genuine API server in
//! `serving_genuine.rs`), timeouts, and resilience against connection and file-descriptor
//! exhaustion, the last one with the real binary.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use ccm_framework::serving::probe::{self, ProbeResponse};
use ccm_framework::serving::{
    Answer, AuthConfig, AuthSettings, HttpConfig, Limits, Listener, Reviews, ServerStats, TokenOutcome, UserInfo,
};
use http::{Method, StatusCode};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use testkit::TestApiServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::sleep;
use tokio_util::sync::CancellationToken;

const PROM_USER: &str = "system:serviceaccount:monitoring:prometheus";

/// TokenReview and SubjectAccessReview answers from two tables.
struct Mock {
    tokens: BTreeMap<&'static str, &'static str>,
    grants: Vec<(&'static str, &'static str)>,
}

#[ccm_framework::async_trait]
impl Reviews for Mock {
    async fn review_token(&self, token: &str) -> Result<TokenOutcome, String> {
        Ok(match self.tokens.get(token) {
            Some(name) => TokenOutcome::Authenticated(UserInfo { username: name.to_string(), ..Default::default() }),
            None => TokenOutcome::Rejected,
        })
    }
    async fn review_access(&self, user: &UserInfo, path: &str, verb: &str) -> Result<bool, String> {
        Ok(verb == "get" && self.grants.iter().any(|(u, p)| *u == user.username && *p == path))
    }
}

fn mock_auth() -> AuthConfig {
    AuthConfig::new(AuthSettings::default()).with_reviews(Arc::new(Mock {
        tokens: BTreeMap::from([("prom-token", PROM_USER), ("nobody-token", "system:serviceaccount:default:nobody")]),
        grants: vec![(PROM_USER, "/metrics")],
    }))
}

/// A handler answering every path with its own name.
fn echo() -> ccm_framework::serving::Handler {
    Arc::new(|_: &Method, path: &str| Answer::text(StatusCode::OK, format!("served {path}")))
}

async fn serve(config: HttpConfig) -> (SocketAddr, Arc<ServerStats>, CancellationToken) {
    let listener = Listener::bind(&config).await.unwrap();
    let (addr, stats) = (listener.local_addr(), listener.stats());
    let stop = CancellationToken::new();
    tokio::spawn(listener.serve_with(echo(), stop.clone()));
    (addr, stats, stop)
}

fn localhost() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

async fn https(addr: SocketAddr, path: &str, token: Option<&str>) -> Option<ProbeResponse> {
    probe::get(addr, path, token, Duration::from_secs(5)).await
}

fn status(r: Option<ProbeResponse>) -> u16 {
    r.map_or(0, |r| r.status)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_endpoint_is_https_with_a_generated_certificate_unless_told_otherwise() {
    let (addr, _, stop) = serve(HttpConfig::new(localhost())).await;
    assert_eq!(https(addr, "/livez", None).await.unwrap().body, "served /livez");
    // Plain HTTP on the HTTPS port gets no HTTP answer.
    assert_eq!(probe::get_plain(addr, "/livez", None, Duration::from_secs(5)).await, None);
    stop.cancel();

    let (addr, _, stop) = serve(HttpConfig::plain(localhost())).await;
    assert_eq!(status(probe::get_plain(addr, "/livez", None, Duration::from_secs(5)).await), 200);
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_needs_an_accepted_and_authorized_token_and_health_paths_need_none() {
    let (addr, _, stop) = serve(HttpConfig::new(localhost()).with_auth(mock_auth())).await;
    assert_eq!(status(https(addr, "/metrics", None).await), 401, "no token");
    assert_eq!(status(https(addr, "/metrics", Some("forged")).await), 401, "a token the API server rejects");
    let denied = https(addr, "/metrics", Some("nobody-token")).await.unwrap();
    assert_eq!(denied.status, 403);
    assert!(denied.body.contains("cannot get path \"/metrics\""), "{}", denied.body);
    let allowed = https(addr, "/metrics", Some("prom-token")).await.unwrap();
    assert_eq!((allowed.status, allowed.body.as_str()), (200, "served /metrics"));
    for path in ["/healthz", "/readyz", "/livez", "/healthz?verbose"] {
        assert_eq!(status(https(addr, path, None).await), 200, "{path}");
    }
    // A check's detail is not in the always-allowed list.
    assert_eq!(status(https(addr, "/healthz/leaderElection", None).await), 401);
    assert_eq!(status(https(addr, "/healthz/leaderElection", Some("prom-token")).await), 403);
    stop.cancel();
}

/// CPU time (user + system) of a process so far, from `/proc/<pid>/stat`.
fn cpu_time(pid: &str) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name, which is in parentheses and may contain spaces.
    let fields: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    let per_second: u64 = std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100);
    Duration::from_millis(ticks * 1000 / per_second)
}

/// Open `n` TCP connections that never send anything.
async fn idle_connections(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    let mut held = Vec::with_capacity(n);
    for _ in 0..n {
        if let Ok(s) = TcpStream::connect(addr).await {
            held.push(s);
        }
    }
    held
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_hundred_idle_connections_neither_stop_livez_nor_keep_the_cpu_busy() {
    // It reads this process's CPU time, which the other tests of this binary would add to.
    if !crate::kit::alone_in_a_process(
        "serving::four_hundred_idle_connections_neither_stop_livez_nor_keep_the_cpu_busy",
    ) {
        return;
    }
    let limits = Limits { max_connections: 64, ..Limits::default() };
    let (addr, stats, stop) = serve(HttpConfig::new(localhost()).with_limits(limits)).await;
    let held = idle_connections(addr, 400).await;
    assert_eq!(held.len(), 400);
    sleep(Duration::from_millis(300)).await;
    let before = cpu_time("self");
    let started = Instant::now();
    for i in 0..10 {
        let t = Instant::now();
        assert_eq!(status(https(addr, "/livez", None).await), 200, "probe {i}");
        assert!(t.elapsed() < Duration::from_secs(2), "probe {i} took {:?}", t.elapsed());
        sleep(Duration::from_millis(300)).await;
    }
    let cpu = cpu_time("self").saturating_sub(before);
    let wall = started.elapsed();
    println!("400 idle connections: {cpu:?} CPU in {wall:?}; {stats:?}");
    assert!(cpu < Duration::from_millis(500), "{cpu:?} of CPU in {wall:?}");
    assert!(stats.open.load(Ordering::Relaxed) <= 64, "{stats:?}");
    assert!(stats.evicted.load(Ordering::Relaxed) >= 400 - 64, "{stats:?}");
    assert_eq!(stats.accept_errors.load(Ordering::Relaxed), 0);
    drop(held);
    stop.cancel();
}

/// Whether the server closed `s` within `within` (EOF or reset).
async fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, s.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_handshakes_slow_request_heads_and_idle_keep_alive_connections_are_closed() {
    let limits = Limits {
        tls_handshake_timeout: Duration::from_millis(300),
        header_read_timeout: Duration::from_millis(300),
        idle_timeout: Duration::from_millis(600),
        ..Limits::default()
    };
    let (tls_addr, _, stop_tls) = serve(HttpConfig::new(localhost()).with_limits(limits.clone())).await;
    let mut silent = TcpStream::connect(tls_addr).await.unwrap();
    assert!(closed_within(&mut silent, Duration::from_secs(3)).await, "TLS handshake timeout");
    stop_tls.cancel();

    let (addr, _, stop) = serve(HttpConfig::plain(localhost()).with_limits(limits)).await;
    let mut slow = TcpStream::connect(addr).await.unwrap();
    slow.write_all(b"GET /livez HTTP/1.1\r\nHost: x\r\n").await.unwrap();
    assert!(closed_within(&mut slow, Duration::from_secs(3)).await, "header read timeout");

    let mut kept = TcpStream::connect(addr).await.unwrap();
    kept.write_all(b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    let mut buf = [0u8; 1024];
    let n = kept.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    let t = Instant::now();
    assert!(closed_within(&mut kept, Duration::from_secs(5)).await, "idle timeout");
    assert!(t.elapsed() >= Duration::from_millis(250), "closed after {:?}", t.elapsed());
    stop.cancel();
}

/// The number of descriptors `pid` has open.
fn open_descriptors(pid: &str) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0)
}

async fn renew_time(leases: &Api<Lease>) -> Option<String> {
    let lease = leases.get_opt("cloud-controller-manager").await.ok()??;
    serde_json::to_string(&lease.spec?.renew_time?).ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_out_of_descriptors_keeps_answering_livez_renewing_its_lease_and_idle() {
    let server = TestApiServer::start().await.unwrap();
    let dir = std::env::temp_dir().join(format!("ccm-serving-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cloud_config = dir.join("fake.yaml");
    std::fs::write(&cloud_config, "autoInstances: true\nlatency: 1ms\n").unwrap();
    let log_path = dir.join("stderr.log");
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_cloud-controller-manager"))
        .args([
            "--cloud-provider=fake",
            &format!("--cloud-config={}", cloud_config.display()),
            &format!("--kubeconfig={}", server.kubeconfig_path().display()),
            "--bind-address=127.0.0.1",
            &format!("--secure-port={port}"),
            "--configure-cloud-routes=false",
            "--leader-elect-lease-duration=4s",
            "--leader-elect-renew-deadline=3s",
            "--leader-elect-retry-period=500ms",
        ])
        .env_remove("RUST_LOG")
        .stderr(std::fs::File::create(&log_path).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let pid = child.id().unwrap().to_string();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while status(https(addr, "/readyz", None).await) != 200 {
        assert!(Instant::now() < deadline, "the binary never became ready");
        sleep(Duration::from_millis(100)).await;
    }
    let leases: Api<Lease> = Api::namespaced(server.client(), "kube-system");
    while renew_time(&leases).await.is_none() {
        assert!(Instant::now() < deadline, "the binary never took the lease");
        sleep(Duration::from_millis(100)).await;
    }

    // Leave it 40 descriptors beyond what it uses now: fewer than its connection limit (128).
    let limit = open_descriptors(&pid) + 40;
    let prlimit = std::process::Command::new("prlimit")
        .args([format!("--pid={pid}"), format!("--nofile={limit}:{limit}")])
        .status()
        .expect("prlimit (util-linux)");
    assert!(prlimit.success());
    let held = idle_connections(addr, 400).await;
    assert_eq!(held.len(), 400, "the kernel queues what the process cannot accept");
    sleep(Duration::from_secs(1)).await;

    let cpu_before = cpu_time(&pid);
    let renewed_before = renew_time(&leases).await;
    let window = Instant::now();
    let mut probes = 0;
    while window.elapsed() < Duration::from_secs(5) {
        let t = Instant::now();
        assert_eq!(status(https(addr, "/livez", None).await), 200, "/livez after {:?}", window.elapsed());
        assert!(t.elapsed() < Duration::from_secs(3), "/livez took {:?}", t.elapsed());
        probes += 1;
        sleep(Duration::from_millis(500)).await;
    }
    let cpu = cpu_time(&pid).saturating_sub(cpu_before);
    let renewed_after = renew_time(&leases).await;
    let log = std::fs::read_to_string(&log_path).unwrap();
    let warnings = log.matches("accepting a connection failed").count();
    println!(
        "fd limit {limit}, 400 idle connections: {cpu:?} CPU over {:?}, {probes} /livez answered, {warnings} accept warnings, {} descriptors open",
        window.elapsed(),
        open_descriptors(&pid)
    );
    assert!(log.contains("out of file descriptors"), "descriptors were never exhausted:\n{log}");
    assert!((1..=3).contains(&warnings), "{warnings} accept warnings:\n{log}");
    assert!(cpu < Duration::from_millis(750), "{cpu:?} CPU in 5s");
    assert!(renewed_after.is_some() && renewed_after != renewed_before, "the Lease was not renewed");
    assert!(child.try_wait().unwrap().is_none(), "the manager exited:\n{log}");
    drop(held);
    let _ = child.kill().await;
    let _ = std::fs::remove_dir_all(&dir);
    server.shutdown().await;
}

/// On the genuine API server (`CCM_TEST_ASSETS`): the real binary, its TokenReviews and
/// SubjectAccessReviews made as a ServiceAccount holding only the chart's two rules for them.
mod genuine {
    use super::*;
    use k8s_openapi::api::core::v1::ServiceAccount;
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, RoleRef, Subject};
    use kube::api::{ObjectMeta, PostParams};
    use testkit::{Backend, TestCluster};

    async fn service_account(cluster: &TestCluster, ns: &str, name: &str) -> String {
        let sa = ServiceAccount {
            metadata: ObjectMeta { name: Some(name.into()), namespace: Some(ns.into()), ..Default::default() },
            ..Default::default()
        };
        Api::<ServiceAccount>::namespaced(cluster.client(), ns).create(&PostParams::default(), &sa).await.unwrap();
        cluster.control_plane().unwrap().service_account_token(ns, name).await.unwrap()
    }

    async fn grant(cluster: &TestCluster, ns: &str, sa: &str, role: &str, rules: Vec<PolicyRule>) {
        let name = format!("{ns}-{role}");
        let role = ClusterRole {
            metadata: ObjectMeta { name: Some(name.clone()), ..Default::default() },
            rules: Some(rules),
            ..Default::default()
        };
        Api::<ClusterRole>::all(cluster.client()).create(&PostParams::default(), &role).await.unwrap();
        let binding = ClusterRoleBinding {
            metadata: ObjectMeta { name: Some(name.clone()), ..Default::default() },
            role_ref: RoleRef { api_group: "rbac.authorization.k8s.io".into(), kind: "ClusterRole".into(), name },
            subjects: Some(vec![Subject {
                kind: "ServiceAccount".into(),
                name: sa.into(),
                namespace: Some(ns.into()),
                ..Default::default()
            }]),
        };
        Api::<ClusterRoleBinding>::all(cluster.client()).create(&PostParams::default(), &binding).await.unwrap();
    }

    fn rule(groups: &[&str], resources: &[&str], urls: &[&str], verbs: &[&str]) -> PolicyRule {
        let list = |v: &[&str]| (!v.is_empty()).then(|| v.iter().map(|s| s.to_string()).collect());
        PolicyRule {
            api_groups: list(groups),
            resources: list(resources),
            non_resource_urls: list(urls),
            verbs: verbs.iter().map(|s| s.to_string()).collect(),
            resource_names: None,
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn metrics_is_401_without_a_token_403_without_the_grant_200_with_it_and_healthz_needs_none() {
        if !Backend::genuine_available() {
            return;
        }
        let cluster = TestCluster::start(Backend::Genuine).await.expect("genuine API server");
        let ns = cluster.fresh_namespace("endpoint-auth").await.unwrap();
        // The endpoint's own identity: only what the chart's manager ClusterRole grants for this.
        service_account(&cluster, &ns, "endpoint").await;
        grant(
            &cluster,
            &ns,
            "endpoint",
            "delegated-auth",
            vec![
                rule(&["authentication.k8s.io"], &["tokenreviews"], &[], &["create"]),
                rule(&["authorization.k8s.io"], &["subjectaccessreviews"], &[], &["create"]),
            ],
        )
        .await;
        let (_, endpoint_kubeconfig) = cluster.service_account(&ns, "endpoint").await.unwrap();
        // A scraper granted get on /metrics, as the chart's metrics-reader ClusterRole does.
        let scraper = service_account(&cluster, &ns, "scraper").await;
        grant(&cluster, &ns, "scraper", "metrics-reader", vec![rule(&[], &[], &["/metrics"], &["get"])]).await;
        let stranger = service_account(&cluster, &ns, "stranger").await;

        let dir = std::env::temp_dir().join(format!("ccm-serving-genuine-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cloud_config = dir.join("fake.yaml");
        std::fs::write(&cloud_config, "autoInstances: true\n").unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_cloud-controller-manager"))
            .args([
                "--cloud-provider=fake",
                &format!("--cloud-config={}", cloud_config.display()),
                &format!("--kubeconfig={}", cluster.kubeconfig_path().display()),
                &format!("--authentication-kubeconfig={}", endpoint_kubeconfig.display()),
                &format!("--authorization-kubeconfig={}", endpoint_kubeconfig.display()),
                "--bind-address=127.0.0.1",
                &format!("--secure-port={port}"),
                "--configure-cloud-routes=false",
                "--leader-elect=false",
            ])
            .env_remove("RUST_LOG")
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while status(https(addr, "/livez", None).await) != 200 {
            assert!(Instant::now() < deadline, "the binary never answered /livez");
            sleep(Duration::from_millis(100)).await;
        }

        assert_eq!(status(https(addr, "/metrics", None).await), 401, "no token");
        assert_eq!(status(https(addr, "/metrics", Some("not-a-token")).await), 401, "a token the server rejects");
        let denied = https(addr, "/metrics", Some(&stranger)).await.unwrap();
        assert_eq!(denied.status, 403, "{}", denied.body);
        assert!(denied.body.contains(&format!("system:serviceaccount:{ns}:stranger")), "{}", denied.body);
        let allowed = https(addr, "/metrics", Some(&scraper)).await.unwrap();
        assert_eq!(allowed.status, 200, "{}", allowed.body);
        assert!(allowed.body.contains("# TYPE"), "{}", allowed.body);
        for path in ["/healthz", "/livez", "/readyz"] {
            let r = https(addr, path, None).await.unwrap();
            // /readyz may still be 500 while caches sync, but never 401/403.
            assert!(r.status == 200 || (path == "/readyz" && r.status == 500), "{path}: {}", r.status);
        }
        // The grant covers /metrics only.
        assert_eq!(status(https(addr, "/healthz/cloud-node-controller", Some(&scraper)).await), 403);
        let _ = child.kill().await;
        let _ = std::fs::remove_dir_all(&dir);
    }
}
