//! Framework integration tests against both API server backends: leader election, the HTTP
//! endpoints, the ProviderHealthy reporter, and the binary.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ccm_framework::controller::{Context, Controller};
use ccm_framework::engine::{EngineBuilder, RunningEngine};
use ccm_framework::health::HealthHandle;
use ccm_framework::http::{HttpConfig, Tls, TlsFiles};
use ccm_framework::leader::LeaderElectionConfig;
use ccm_framework::options::ControllerOptions;
use ccm_framework::provider::{Health, health_reasons};
use ccm_framework::status::StatusTarget;
use ccm_provider_fake::FakeProvider;
use crds::CloudControllerManager;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use testkit::{TestCluster, eventually_within};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::{Instant, sleep, timeout};
use tokio_util::sync::CancellationToken;

const PROBE: &str = "probe-controller";

/// Counts how many copies run at once, across every engine sharing it.
#[derive(Clone, Default)]
struct Tally {
    running: Arc<AtomicUsize>,
    peak: Arc<AtomicUsize>,
    started: Arc<AtomicUsize>,
    handle: Arc<Mutex<Option<HealthHandle>>>,
}

struct Probe(Tally);

#[async_trait::async_trait]
impl Controller for Probe {
    fn name(&self) -> &'static str {
        PROBE
    }

    async fn run(self: Box<Self>, ctx: Context, health: HealthHandle) -> Result<(), ccm_framework::Error> {
        let t = &self.0;
        let now = t.running.fetch_add(1, Ordering::SeqCst) + 1;
        t.peak.fetch_max(now, Ordering::SeqCst);
        t.started.fetch_add(1, Ordering::SeqCst);
        *t.handle.lock().unwrap() = Some(health);
        ctx.shutdown.cancelled().await;
        t.running.fetch_sub(1, Ordering::SeqCst);
        Ok(())
    }
}

fn probe_engine(client: Client, fake: Arc<FakeProvider>, tally: &Tally) -> EngineBuilder {
    let tally = tally.clone();
    EngineBuilder::new(client, fake, ControllerOptions::default())
        .without_builtin_controllers()
        .controller(PROBE, Arc::new(move || Box::new(Probe(tally.clone())) as Box<dyn Controller>))
}

fn fast_election(name: &str, identity: &str) -> LeaderElectionConfig {
    LeaderElectionConfig {
        identity: identity.into(),
        lease_duration: Duration::from_secs(3),
        renew_deadline: Duration::from_secs(2),
        retry_period: Duration::from_millis(500),
        ..LeaderElectionConfig::new("kube-system", name)
    }
}

async fn start(builder: EngineBuilder) -> RunningEngine {
    builder.build().unwrap().start(CancellationToken::new()).await.unwrap()
}

testkit::backend_tests! {
    async fn m5_two_engines_on_one_lease_exactly_one_leads_and_a_crash_hands_over_within_the_lease_duration(backend) {
        let cluster = TestCluster::start(backend).await.unwrap();
        let tally = Tally::default();
        let fake = Arc::new(FakeProvider::new());
        let a = start(probe_engine(cluster.client(), fake.clone(), &tally).leader_election(Some(fast_election("ccm", "a"))))
            .await;
        let b = start(probe_engine(cluster.client(), fake.clone(), &tally).leader_election(Some(fast_election("ccm", "b"))))
            .await;
        eventually_within("a leader", Duration::from_secs(10), || async { a.is_leading() || b.is_leading() }).await;
        eventually_within("its controller", Duration::from_secs(5), || async { tally.running.load(Ordering::SeqCst) == 1 }).await;
        // For a few renewals, never both.
        for _ in 0..40 {
            assert!(!(a.is_leading() && b.is_leading()), "two leaders");
            sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(tally.peak.load(Ordering::SeqCst), 1);
        let (leader, standby) = if a.is_leading() { (a, b) } else { (b, a) };
        let lease: Lease = Api::namespaced(cluster.client(), "kube-system").get("ccm").await.unwrap();
        assert_eq!(lease.spec.unwrap().holder_identity.as_deref(), Some(leader.identity()));

        // A crash does not release the Lease: the standby waits for it to expire.
        let crashed = Instant::now();
        leader.abort();
        standby.wait_leading(true).await;
        let took = crashed.elapsed();
        assert!(took <= Duration::from_millis(5000), "handover took {took:?}, lease is 3s");
        assert!(took >= Duration::from_millis(1500), "handover took {took:?}: the lease cannot have expired yet");
        eventually_within("the standby's controller", Duration::from_secs(5), || async { tally.started.load(Ordering::SeqCst) == 2 }).await;
        assert_eq!(tally.peak.load(Ordering::SeqCst), 1, "controllers never overlapped");
        standby.stop().await.unwrap();
        drop(cluster);
    }

    async fn a_graceful_stop_releases_the_lease_and_the_standby_takes_over_within_the_retry_period(backend) {
        let cluster = TestCluster::start(backend).await.unwrap();
        let tally = Tally::default();
        let fake = Arc::new(FakeProvider::new());
        let a = start(probe_engine(cluster.client(), fake.clone(), &tally).leader_election(Some(fast_election("ccm", "a"))))
            .await;
        a.wait_leading(true).await;
        let b = start(probe_engine(cluster.client(), fake.clone(), &tally).leader_election(Some(fast_election("ccm", "b"))))
            .await;
        sleep(Duration::from_secs(1)).await;
        assert!(!b.is_leading());
        let stopping = Instant::now();
        a.stop().await.unwrap();
        b.wait_leading(true).await;
        let took = stopping.elapsed();
        // retryPeriod is 500ms (up to 600ms with jitter); well under the 3s lease.
        assert!(took <= Duration::from_millis(2000), "handover took {took:?}");
        let lease: Lease = Api::namespaced(cluster.client(), "kube-system").get("ccm").await.unwrap();
        let spec = lease.spec.unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some("b"));
        assert_eq!(spec.lease_transitions, Some(1));
        assert_eq!(tally.peak.load(Ordering::SeqCst), 1);
        b.stop().await.unwrap();
        drop(cluster);
    }

    async fn a_leader_whose_lease_is_taken_stops_its_controllers_and_stands_by(backend) {
        let cluster = TestCluster::start(backend).await.unwrap();
        let tally = Tally::default();
        let a = start(
            probe_engine(cluster.client(), Arc::new(FakeProvider::new()), &tally)
                .leader_election(Some(fast_election("ccm", "a"))),
        )
        .await;
        a.wait_leading(true).await;
        eventually_within("the controller", Duration::from_secs(5), || async { tally.running.load(Ordering::SeqCst) == 1 }).await;
        // Someone else writes themselves in as holder with a long lease.
        let leases: Api<Lease> = Api::namespaced(cluster.client(), "kube-system");
        let mut lease = leases.get("ccm").await.unwrap();
        let spec = lease.spec.as_mut().unwrap();
        spec.holder_identity = Some("intruder".into());
        spec.lease_duration_seconds = Some(3);
        leases.replace("ccm", &PostParams::default(), &lease).await.unwrap();
        a.wait_leading(false).await;
        eventually_within("the controller to stop", Duration::from_secs(5), || async { tally.running.load(Ordering::SeqCst) == 0 }).await;
        assert!(!a.is_finished(), "the engine stands by");
        assert_eq!(a.leader_status().unwrap().holder.as_deref(), Some("intruder"));
        // The intruder never renews: the engine takes the Lease back and restarts its controllers.
        timeout(Duration::from_secs(10), a.wait_leading(true)).await.unwrap();
        eventually_within("a second term", Duration::from_secs(5), || async { tally.started.load(Ordering::SeqCst) == 2 }).await;
        a.stop().await.unwrap();
        drop(cluster);
    }
}

/// A minimal HTTP/1.1 GET over any stream; returns the status code and body.
async fn get_over<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(mut s: S, path: &str) -> (u16, String) {
    let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw).await;
    let text = String::from_utf8_lossy(&raw).to_string();
    let status = text.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    (status, body)
}

async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    get_over(tokio::net::TcpStream::connect(addr).await.unwrap(), path).await
}

fn fixture(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

testkit::backend_tests! {
    async fn readyz_healthz_checks_and_metrics_are_served(backend) {
        let cluster = TestCluster::start(backend).await.unwrap();
        let tally = Tally::default();
        let fake = Arc::new(FakeProvider::new());
        let engine = start(
            probe_engine(cluster.client(), fake.clone(), &tally)
                .leader_election(Some(fast_election("ccm-http", "me")))
                .http(Some(HttpConfig::plain("127.0.0.1:0".parse().unwrap()))),
        )
        .await;
        let addr = engine.local_addr().unwrap();
        assert_eq!(get(addr, "/livez").await.0, 200);
        let mut ready = (0, String::new());
        for _ in 0..200 {
            ready = get(addr, "/readyz").await;
            if ready.0 == 200 {
                break;
            }
            sleep(Duration::from_millis(25)).await;
        }
        assert_eq!(ready.0, 200, "{}", ready.1);
        engine.wait_leading(true).await;
        eventually_within("the probe controller", Duration::from_secs(5), || async { tally.handle.lock().unwrap().is_some() }).await;

        assert_eq!(get(addr, "/healthz").await, (200, "ok".to_string()));
        assert_eq!(get(addr, "/healthz/leaderElection").await.0, 200);
        assert_eq!(get(addr, &format!("/healthz/{PROBE}")).await.0, 200);
        let verbose = get(addr, "/healthz?verbose").await.1;
        assert!(verbose.contains("[+]leaderElection ok") && verbose.contains("[+]probe-controller ok"), "{verbose}");
        assert_eq!(get(addr, "/healthz/no-such-check").await.0, 404);

        tally.handle.lock().unwrap().as_ref().unwrap().set_unhealthy("cloud API unreachable");
        let (code, body) = get(addr, &format!("/healthz/{PROBE}")).await;
        assert_eq!(code, 500);
        assert!(body.contains("cloud API unreachable"), "{body}");
        assert_eq!(get(addr, "/healthz").await.0, 500);
        assert_eq!(get(addr, "/livez").await.0, 200, "liveness does not follow controller health");

        let (code, metrics) = get(addr, "/metrics").await;
        assert_eq!(code, 200);
        for line in [
            r#"running_managed_controllers{name="probe-controller",manager="cloud-controller-manager"} 1"#,
            r#"leader_election_master_status{name="ccm-http"} 1"#,
            r#"cloudprovider_api_requests_total{provider="fake",method="initialize",result="success"} 1"#,
            "# TYPE cloudprovider_api_request_duration_seconds histogram",
        ] {
            assert!(metrics.contains(line), "missing {line} in\n{metrics}");
        }
        engine.stop().await.unwrap();
        drop(cluster);
    }

    async fn the_endpoint_speaks_tls_when_given_a_certificate(backend) {
        let cluster = TestCluster::start(backend).await.unwrap();
        let tls = TlsFiles { cert: fixture("tls.crt"), key: fixture("tls.key") };
        let engine = start(
            probe_engine(cluster.client(), Arc::new(FakeProvider::new()), &Tally::default())
                .http(Some(HttpConfig::new("127.0.0.1:0".parse().unwrap()).with_tls(Tls::Files(tls)))),
        )
        .await;
        let addr = engine.local_addr().unwrap();

        use tokio_rustls::rustls::pki_types::pem::PemObject;
        use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};
        use tokio_rustls::rustls::{self, ClientConfig, RootCertStore};
        let mut roots = RootCertStore::empty();
        roots.add(CertificateDer::from_pem_file(fixture("ca.crt")).unwrap()).unwrap();
        let config = ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let stream = connector.connect(ServerName::try_from("localhost").unwrap(), tcp).await.unwrap();
        assert_eq!(get_over(stream, "/livez").await, (200, "ok".to_string()));
        // Plain HTTP on the TLS port gets no answer.
        assert_eq!(get(addr, "/livez").await.0, 0);
        engine.stop().await.unwrap();
        drop(cluster);
    }
}

async fn install_ccm(cluster: &TestCluster) -> Api<CloudControllerManager> {
    let api = crate::kit::install_fake_ccm(cluster).await;
    // The operator's own condition, which the manager must leave alone.
    let operator = serde_json::json!({
        "apiVersion": "ccm.rs/v1alpha1", "kind": "CloudControllerManager",
        "status": {"conditions": [{
            "type": "Available", "status": "True", "reason": "AsExpected", "message": "",
            "lastTransitionTime": "2026-01-01T00:00:00Z"
        }]}
    });
    api.patch_status("fake", &PatchParams::apply("ccm-operator").force(), &Patch::Apply(&operator)).await.unwrap();
    api
}

fn provider_condition(
    ccm: &CloudControllerManager,
) -> Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    ccm.status.as_ref()?.conditions.iter().find(|c| c.type_ == "ProviderHealthy").cloned()
}

async fn wait_condition(
    api: &Api<CloudControllerManager>,
    f: impl Fn(&CloudControllerManager) -> bool,
) -> CloudControllerManager {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let ccm = api.get("fake").await.unwrap();
        if f(&ccm) {
            return ccm;
        }
        assert!(Instant::now() < deadline, "status never matched: {:?}", ccm.status);
        sleep(Duration::from_millis(50)).await;
    }
}

fn status_writes(cluster: &TestCluster, since: u64) -> usize {
    cluster
        .request_log()
        .since(since)
        .iter()
        .filter(|r| {
            r.is_write()
                && r.subresource.as_deref() == Some("status")
                && r.field_manager.as_deref() == Some("cloud-controller-manager")
        })
        .count()
}

testkit::backend_tests! {
    async fn provider_healthy_flips_with_the_probe_and_back_and_nothing_is_written_when_nothing_changed(backend) {
        let cluster = TestCluster::start(backend).await.unwrap();
        let api = install_ccm(&cluster).await;
        let fake = Arc::new(FakeProvider::new());
        let engine = start(probe_engine(cluster.client(), fake.clone(), &Tally::default()).identity("ccm-0").report_status(
            Some(StatusTarget { namespace: "kube-system".into(), name: "fake".into() }),
            Duration::from_millis(100),
        ))
        .await;

        let ccm = wait_condition(&api, |c| provider_condition(c).is_some_and(|c| c.status == "True")).await;
        let status = ccm.status.clone().unwrap();
        // status.leader and status.controllers have one writer, the operator (docs/architecture.md).
        assert_eq!((status.leader.as_deref(), status.controllers.as_ref()), (None, None));
        assert!(status.conditions.iter().any(|c| c.type_ == "Available"), "the operator's condition is kept");
        let first = provider_condition(&ccm).unwrap();
        assert_eq!(first.reason, "Healthy");

        // Ten probe intervals with nothing new: no write at all. The mark is taken once the write
        // that set the condition is in the log: the server logs a request after answering it, so
        // a mark taken as soon as the condition shows could precede that write's own record.
        let deadline = Instant::now() + Duration::from_secs(10);
        while status_writes(&cluster, 0) == 0 {
            assert!(Instant::now() < deadline, "the status write never reached the request log");
            sleep(Duration::from_millis(20)).await;
        }
        let mark = cluster.request_log().mark();
        sleep(Duration::from_secs(1)).await;
        assert_eq!(status_writes(&cluster, mark), 0, "status written although nothing changed");

        // A new message alone keeps lastTransitionTime (times have one-second precision).
        fake.set_health(Health::healthy("3 instances"));
        let ccm = wait_condition(&api, |c| provider_condition(c).is_some_and(|c| c.message == "3 instances")).await;
        assert_eq!(provider_condition(&ccm).unwrap().last_transition_time, first.last_transition_time);

        fake.set_health(Health::unhealthy(health_reasons::CREDENTIALS_REJECTED, "the API answered 401"));
        let ccm = wait_condition(&api, |c| provider_condition(c).is_some_and(|c| c.status == "False")).await;
        let sick = provider_condition(&ccm).unwrap();
        assert_eq!(sick.reason, "CredentialsRejected");
        assert_eq!(sick.message, "the API answered 401");
        assert!(sick.last_transition_time > first.last_transition_time, "a flip moves lastTransitionTime");

        fake.set_health(Health::healthy(""));
        let ccm = wait_condition(&api, |c| provider_condition(c).is_some_and(|c| c.status == "True")).await;
        assert_eq!(provider_condition(&ccm).unwrap().reason, "Healthy");
        assert!(ccm.status.unwrap().conditions.iter().any(|c| c.type_ == "Available"));
        engine.stop().await.unwrap();
        drop(cluster);
    }

    async fn the_binary_runs_the_fake_provider_against_the_api_server_and_stops_on_sigterm(backend) {
        let cluster = TestCluster::start(backend).await.unwrap();
        // One per backend: both variants run at once in this process.
        let dir = std::env::temp_dir().join(format!("ccm-bin-test-{}-{}", std::process::id(), cluster.backend().name()));
        std::fs::create_dir_all(&dir).unwrap();
        let cloud_config = dir.join("fake.yaml");
        std::fs::write(&cloud_config, "autoInstances: true\nlatency: 1ms\n").unwrap();
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_cloud-controller-manager"))
            .args([
                "--cloud-provider=fake",
                &format!("--cloud-config={}", cloud_config.display()),
                &format!("--kubeconfig={}", cluster.kubeconfig_path().display()),
                "--bind-address=127.0.0.1",
                &format!("--secure-port={port}"),
                "--configure-cloud-routes=false",
                "--leader-elect-retry-period=500ms",
            ])
            .env_remove("RUST_LOG")
            .stderr(std::fs::File::create(dir.join("stderr")).unwrap())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            // HTTPS with the generated certificate, as a kubelet probes it.
            if ccm_framework::serving::probe::get(addr, "/readyz", None, Duration::from_secs(5))
                .await
                .is_some_and(|r| r.status == 200)
            {
                break;
            }
            assert!(Instant::now() < deadline, "the binary never became ready");
            sleep(Duration::from_millis(100)).await;
        }
        let leases: Api<Lease> = Api::namespaced(cluster.client(), "kube-system");
        let deadline = Instant::now() + Duration::from_secs(10);
        while leases.get_opt("cloud-controller-manager").await.unwrap().and_then(|l| l.spec?.holder_identity).is_none() {
            assert!(Instant::now() < deadline, "the binary never took the lease");
            sleep(Duration::from_millis(100)).await;
        }
        let pid = child.id().unwrap().to_string();
        assert!(std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
        let status = timeout(Duration::from_secs(30), child.wait()).await.unwrap().unwrap();
        assert!(status.success(), "exit status {status:?}");
        // A graceful stop released the Lease.
        let lease = leases.get("cloud-controller-manager").await.unwrap();
        assert_eq!(lease.spec.unwrap().holder_identity, None);
        // The stop is one INFO line saying so, and nothing louder.
        let log = std::fs::read_to_string(dir.join("stderr")).unwrap();
        let stop = log.split_once("received SIGTERM").map(|(_, after)| after).expect("the signal is logged");
        let lines: Vec<&str> = stop.lines().skip(1).filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "one line after the signal's:\n{stop}");
        assert!(lines[0].contains(" INFO") && lines[0].contains("engine stopped"), "{stop}");
        assert!(lines[0].contains("lease=released"), "{stop}");
        let _ = std::fs::remove_dir_all(&dir);
        drop(cluster);
    }
}

/// A TCP relay in front of the API server: the manager talks to it, and stopping it makes the
/// API server unreachable (connection refused), as when the API server stops first.
struct Relay {
    addr: SocketAddr,
    stop: CancellationToken,
}

impl Relay {
    async fn start(upstream: String) -> Relay {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        let token = stop.clone();
        tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            loop {
                tokio::select! {
                    _ = token.cancelled() => break,
                    accepted = listener.accept() => {
                        let Ok((mut inbound, _)) = accepted else { continue };
                        let upstream = upstream.clone();
                        conns.spawn(async move {
                            if let Ok(mut out) = tokio::net::TcpStream::connect(upstream).await {
                                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                            }
                        });
                    }
                }
            }
            // The listener and every relayed connection close here.
            conns.abort_all();
        });
        Relay { addr, stop }
    }
}

testkit::backend_tests! {
    /// Stopping the API server first, then the manager (an order the quick start allows): the
    /// outage is WARN lines with context (watches retrying, renewals failing), never an ERROR,
    /// and the stop itself is quiet: it says the Lease will expire by itself and exits 0.
    async fn an_api_server_stopped_before_the_manager_gives_warnings_then_a_quiet_stop_never_an_error(backend) {
        let cluster = TestCluster::start(backend).await.unwrap();
        let url = cluster.url();
        let upstream = url.split("://").nth(1).unwrap().trim_end_matches('/').to_string();
        let relay = Relay::start(upstream.clone()).await;
        // One per backend: both variants run at once in this process.
        let dir = std::env::temp_dir().join(format!("ccm-stop-order-{}-{}", std::process::id(), cluster.backend().name()));
        std::fs::create_dir_all(&dir).unwrap();
        let kubeconfig = dir.join("kubeconfig");
        let original = std::fs::read_to_string(cluster.kubeconfig_path()).unwrap();
        assert!(original.contains(&upstream), "the kubeconfig names {upstream}");
        std::fs::write(&kubeconfig, original.replace(&upstream, &relay.addr.to_string())).unwrap();
        let cloud_config = dir.join("fake.yaml");
        std::fs::write(&cloud_config, "autoInstances: true\nlatency: 1ms\n").unwrap();
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let stderr = dir.join("stderr");
        let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_cloud-controller-manager"))
            .args([
                "--cloud-provider=fake",
                &format!("--cloud-config={}", cloud_config.display()),
                &format!("--kubeconfig={}", kubeconfig.display()),
                "--bind-address=127.0.0.1",
                &format!("--secure-port={port}"),
                "--configure-cloud-routes=false",
                "--leader-elect-retry-period=500ms",
                "--leader-elect-resource-name=stop-order",
            ])
            .env_remove("RUST_LOG")
            .stderr(std::fs::File::create(&stderr).unwrap())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut child = child;
        let leases: Api<Lease> = Api::namespaced(cluster.client(), "kube-system");
        let deadline = Instant::now() + Duration::from_secs(30);
        while leases.get_opt("stop-order").await.unwrap().and_then(|l| l.spec?.holder_identity).is_none() {
            assert!(Instant::now() < deadline, "the binary never took the lease");
            sleep(Duration::from_millis(100)).await;
        }

        relay.stop.cancel();
        // Long enough for watches to retry and a renewal (every 500 ms) to fail.
        sleep(Duration::from_secs(3)).await;
        let pid = child.id().unwrap().to_string();
        assert!(std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
        let status = timeout(Duration::from_secs(30), child.wait()).await.unwrap().unwrap();
        assert!(status.success(), "exit status {status:?}");

        let log = std::fs::read_to_string(&stderr).unwrap();
        let errors: Vec<&str> = log.lines().filter(|l| l.contains("ERROR")).collect();
        assert!(errors.is_empty(), "ERROR lines:\n{}", errors.join("\n"));
        assert!(log.lines().any(|l| l.contains(" WARN")), "the outage itself is reported:\n{log}");
        let stop = log.split_once("received SIGTERM").map(|(_, after)| after).expect("the stop is logged");
        let loud: Vec<&str> = stop.lines().filter(|l| l.contains(" WARN")).collect();
        assert!(loud.is_empty(), "the stop logs warnings:\n{}", loud.join("\n"));
        // One INFO line for the stop, naming what became of the Lease.
        let infos: Vec<&str> = stop.lines().filter(|l| l.contains(" INFO")).collect();
        assert_eq!(infos.len(), 1, "one INFO line after the signal:\n{stop}");
        assert!(infos[0].contains("engine stopped") && infos[0].contains("lease=left to expire"), "{stop}");
        let _ = std::fs::remove_dir_all(&dir);
        drop(cluster);
    }
}

#[test]
fn the_binary_prints_its_version_and_upstream_flags() {
    let out =
        std::process::Command::new(env!("CARGO_BIN_EXE_cloud-controller-manager")).arg("--version").output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains(env!("CARGO_PKG_VERSION")));
    let out =
        std::process::Command::new(env!("CARGO_BIN_EXE_cloud-controller-manager")).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--cloud-provider",
        "--cloud-config",
        "--controllers",
        "--cluster-cidr",
        "--configure-cloud-routes",
        "--concurrent-node-syncs",
        "--leader-elect-resource-namespace",
        "--kube-api-qps",
        "--secure-port",
        "--tls-private-key-file",
        "--ccm-resource",
    ] {
        assert!(help.contains(flag), "--help lacks {flag}");
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cloud-controller-manager"))
        .args(["--cloud-provider=fake", "--concurrent-node-syncs=0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--concurrent-node-syncs"));
}

#[test]
fn the_binary_ships_every_built_in_provider() {
    // An unknown name is refused before any connection, listing what the binary registered
    // (ccm_builtin is the one list; the operator registers it too).
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cloud-controller-manager"))
        .args(["--cloud-provider=nope"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("known providers: aws, baremetal, fake"), "{stderr}");
}

testkit::backend_tests! {
    async fn the_engine_runs_the_enabled_built_in_controllers_and_skips_those_the_provider_cannot_serve(backend) {
        use k8s_openapi::api::core::v1::{Node, NodeSpec, Taint};
        use kube::api::ObjectMeta;
        let cluster = TestCluster::start(backend).await.unwrap();
        let fake = Arc::new(FakeProvider::new());
        fake.set_auto_instances(true);
        fake.set_capabilities(ccm_provider_fake::FakeCapabilities { load_balancer: false, ..Default::default() });
        let options = ControllerOptions { node_batch_window: Duration::from_millis(10), ..Default::default() };
        let engine = start(
            EngineBuilder::new(cluster.client(), fake.clone(), options)
                .leader_election(Some(fast_election("ccm-builtin", "me")))
                .http(Some(HttpConfig::plain("127.0.0.1:0".parse().unwrap()))),
        )
        .await;
        engine.wait_leading(true).await;
        let nodes: Api<Node> = Api::all(cluster.client());
        let node = Node {
            metadata: ObjectMeta { name: Some("worker-7".into()), ..Default::default() },
            spec: Some(NodeSpec {
                taints: Some(vec![Taint {
                    key: "node.cloudprovider.kubernetes.io/uninitialized".into(),
                    value: Some("true".into()),
                    effect: "NoSchedule".into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        nodes.create(&PostParams::default(), &node).await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let n = nodes.get("worker-7").await.unwrap();
            if n.spec.as_ref().and_then(|s| s.provider_id.as_deref()) == Some("fake://worker-7") {
                break;
            }
            assert!(Instant::now() < deadline, "the node was never initialized");
            sleep(Duration::from_millis(50)).await;
        }
        assert!(fake.initialized(), "initialize ran before the controllers");
        let health = engine.health().clone();
        // No load balancers: the service controller is skipped (S24).
        assert!(health.get("cloud-node-controller").is_some());
        assert!(health.get("cloud-node-lifecycle-controller").is_some());
        assert!(health.get("service-lb-controller").is_none());
        // Routes are supported but no --cluster-cidr was given: the route controller runs disabled
        // and says why on its health check, instead of the manager exiting (R2, deliberately changed).
        let route_health = health.get("node-route-controller").expect("the route controller runs");
        assert!(route_health.is_err_and(|reason| reason.contains("--cluster-cidr is empty")));
        let metrics = get(engine.local_addr().unwrap(), "/metrics").await.1;
        assert!(
            metrics.contains(r#"running_managed_controllers{name="cloud-node",manager="cloud-controller-manager"} 1"#),
            "{metrics}"
        );
        assert!(metrics.contains(r#"method="instances_metadata",result="success"}"#), "{metrics}");
        engine.stop().await.unwrap();
        assert!(health.get("cloud-node-controller").is_none(), "checks go away with their controllers");
        drop(cluster);
    }
}

/// Runs the real binary at the most verbose log level until it exits (or 20 s pass); returns
/// its whole output.
async fn binary_output(args: &[String]) -> String {
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_cloud-controller-manager"))
        .args(args)
        .env("RUST_LOG", "trace")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the binary starts");
    let out = timeout(Duration::from_secs(20), child.wait_with_output()).await.expect("the binary exits").unwrap();
    assert!(!out.status.success(), "a bad configuration stops the binary");
    String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr)
}

testkit::backend_tests! {
    /// A planted token in the cloud-config (fake and baremetal, as keys and values) or in the
    /// kubeconfig never reaches the manager's log, even at `trace`.
    async fn the_manager_log_never_quotes_a_cloud_config_or_kubeconfig(backend) {
        const TOKEN: &str = "SECRET-TOKEN-12345";
        let cluster = TestCluster::start(backend).await.unwrap();
        let dir = std::env::temp_dir().join(format!("ccm-log-token-{}-{:?}", std::process::id(), backend));
        std::fs::create_dir_all(&dir).unwrap();
        let kubeconfig = cluster.kubeconfig_path().display().to_string();
        let configs = [
            ("fake", format!("autoInstances: {TOKEN}\n{TOKEN}: {TOKEN}\n")),
            ("baremetal", format!("loadBalancer:\n  pools:\n    - name: {TOKEN}\n      cidrs: [{TOKEN}]\n")),
            ("baremetal", format!("{TOKEN}:\n  - {TOKEN}\n")),
        ];
        for (i, (provider, text)) in configs.iter().enumerate() {
            let path = dir.join(format!("cloud-{i}.yaml"));
            std::fs::write(&path, text).unwrap();
            let log = binary_output(&[
                format!("--cloud-provider={provider}"),
                format!("--cloud-config={}", path.display()),
                format!("--kubeconfig={kubeconfig}"),
                "--leader-elect=false".into(),
                "--secure-port=0".into(),
            ])
            .await;
            assert!(!log.is_empty(), "the binary says why it stopped");
            assert!(!log.contains(TOKEN), "{provider} cloud-config {i} leaked into the log:\n{log}");
        }
        let bad_kubeconfig = dir.join("kubeconfig");
        std::fs::write(&bad_kubeconfig, format!("apiVersion: v1\nclusters:\n- name: {TOKEN}\n  cluster: {{server: {TOKEN}}}\ncurrent-context: {TOKEN}\n")).unwrap();
        let cloud = dir.join("good.yaml");
        std::fs::write(&cloud, "autoInstances: true\n").unwrap();
        let log = binary_output(&[
            "--cloud-provider=fake".into(),
            format!("--cloud-config={}", cloud.display()),
            format!("--kubeconfig={}", bad_kubeconfig.display()),
            "--leader-elect=false".into(),
            "--secure-port=0".into(),
        ])
        .await;
        assert!(!log.contains(TOKEN), "the kubeconfig leaked into the log:\n{log}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// Replace a file in one step, as kubelet's symlink swap does, so it is never read half written.
fn replace_file(path: &std::path::Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

testkit::backend_tests! {
    /// The binary picks up edits of its `--cloud-config` file while it runs: a pool edit is
    /// applied, an invalid edit is refused, an edit that needs a restart says so; none of it
    /// quotes the file (a planted token never reaches the log, even at `trace`).
    async fn the_binary_reloads_pool_edits_from_its_cloud_config_file_without_quoting_it(backend) {
        use tokio::io::AsyncBufReadExt;
        const TOKEN: &str = "SECRET-TOKEN-67890";
        let cluster = TestCluster::start(backend).await.unwrap();
        let dir = std::env::temp_dir().join(format!("ccm-reload-{}-{:?}", std::process::id(), backend));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("cloud.yaml");
        let pools = "loadBalancer:\n  pools:\n    - {name: lan, cidrs: [192.0.2.0/30]}\n";
        replace_file(&path, pools);
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_cloud-controller-manager"))
            .args([
                "--cloud-provider=baremetal".to_string(),
                format!("--cloud-config={}", path.display()),
                format!("--kubeconfig={}", cluster.kubeconfig_path().display()),
                "--leader-elect=false".into(),
                "--secure-port=0".into(),
            ])
            .env("RUST_LOG", "trace")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("the binary starts");
        let log = Arc::new(Mutex::new(String::new()));
        let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
        let sink = log.clone();
        let reader = tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                let mut log = sink.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        // The watcher reads the file every 5 s.
        let wait_for = |needle: &'static str| {
            let log = log.clone();
            async move {
                let deadline = Instant::now() + Duration::from_secs(20);
                while !log.lock().unwrap().contains(needle) {
                    assert!(Instant::now() < deadline, "no {needle:?} in the log:\n{}", log.lock().unwrap());
                    sleep(Duration::from_millis(100)).await;
                }
            }
        };
        wait_for("rebuilt the load-balancer allocator").await;

        replace_file(&path, &pools.replace("192.0.2.0/30]", "192.0.2.0/30, 198.51.100.0/30]"));
        wait_for("applied the cloud-config edit without a restart").await;
        replace_file(&path, &pools.replace("192.0.2.0/30]", &format!("192.0.2.0/30, {TOKEN}]")));
        wait_for("the edited cloud-config is invalid").await;
        replace_file(&path, &format!("instances: [{{name: n1, labels: {{example.com/t: {TOKEN}}}}}]\n{pools}"));
        wait_for("needs a restart").await;

        child.kill().await.unwrap();
        reader.await.unwrap();
        let log = log.lock().unwrap().clone();
        assert!(log.contains("loadBalancer.pools[0].cidrs[1]"), "the invalid edit is named by its path:\n{log}");
        assert!(log.contains("changed: instances"), "the restart names what changed:\n{log}");
        assert!(!log.contains(TOKEN), "the cloud-config leaked into the log:\n{log}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
