//! Leader migration (M7) through the binary, on both backends: two managers with different main
//! Leases share one migration Lease, so each migrated controller runs in exactly one of them, and
//! the other takes the migrated controllers over when the holder stops (SIGTERM) or dies (SIGKILL).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use testkit::TestCluster;
use tokio::time::{Instant, sleep, timeout};

/// The migration Lease the managers share.
const MIGRATION_LEASE: &str = "ccm-moving";
/// The lease duration the managers run with.
const LEASE: Duration = Duration::from_secs(3);
/// The migrated controllers, by their legacy metric names (`running_managed_controllers`).
const MIGRATED: [&str; 2] = ["cloud-node-lifecycle", "service"];

const CONFIG: &str = "apiVersion: controllermanager.config.k8s.io/v1alpha1
kind: LeaderMigrationConfiguration
leaderName: ccm-moving
resourceLock: leases
controllerLeaders:
  - name: cloud-node-lifecycle
    component: '*'
  - name: service-lb-controller
    component: cloud-controller-manager
  - name: route
    component: kube-controller-manager
";

struct Manager {
    child: tokio::process::Child,
    addr: SocketAddr,
    log: PathBuf,
}

impl Manager {
    async fn start(cluster: &TestCluster, dir: &Path, main_lease: &str) -> Manager {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let log = dir.join(format!("{main_lease}-{port}.log"));
        let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_cloud-controller-manager"))
            .args([
                "--cloud-provider=fake".to_string(),
                format!("--cloud-config={}", dir.join("fake.yaml").display()),
                format!("--kubeconfig={}", cluster.kubeconfig_path().display()),
                "--bind-address=127.0.0.1".into(),
                format!("--secure-port={port}"),
                "--authorization-always-allow-paths=/healthz,/healthz/*,/readyz,/livez,/metrics".into(),
                "--controllers=*".into(),
                format!("--leader-elect-resource-name={main_lease}"),
                "--leader-elect-lease-duration=3s".into(),
                "--leader-elect-renew-deadline=2s".into(),
                "--leader-elect-retry-period=500ms".into(),
                "--enable-leader-migration".into(),
                format!("--leader-migration-config={}", dir.join("migration.yaml").display()),
            ])
            .env_remove("RUST_LOG")
            .stderr(std::fs::File::create(&log).unwrap())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        Manager { child, addr: format!("127.0.0.1:{port}").parse().unwrap(), log }
    }

    /// The `running_managed_controllers` gauges at 1, or `None` while the endpoint is down.
    async fn running(&self) -> Option<Vec<String>> {
        let r = ccm_framework::serving::probe::get(self.addr, "/metrics", None, Duration::from_secs(2)).await?;
        (r.status == 200).then(|| {
            r.body
                .lines()
                .filter(|l| l.starts_with("running_managed_controllers{") && l.ends_with(" 1"))
                .filter_map(|l| l.split("name=\"").nth(1)?.split('"').next().map(String::from))
                .collect()
        })
    }

    async fn signal(&self, signal: &str) {
        let pid = self.child.id().unwrap().to_string();
        assert!(std::process::Command::new("kill").args([signal, &pid]).status().unwrap().success());
    }
}

fn setup(cluster: &TestCluster, test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ccm-{test}-{}-{}", std::process::id(), cluster.backend().name()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("fake.yaml"), "autoInstances: true\nlatency: 1ms\n").unwrap();
    std::fs::write(dir.join("migration.yaml"), CONFIG).unwrap();
    dir
}

async fn migration_holder(cluster: &TestCluster) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(cluster.client(), "kube-system");
    leases.get_opt(MIGRATION_LEASE).await.ok().flatten()?.spec?.holder_identity
}

/// Which manager runs each migrated controller, checked over `samples` rounds: never both, and
/// the non-migrated cloud-node controller in both. Returns the index of the one running them.
async fn exactly_one_runs_the_migrated_controllers(managers: &[&Manager], samples: usize) -> usize {
    let mut holder = None;
    for _ in 0..samples {
        let mut running = Vec::new();
        for m in managers {
            running.push(m.running().await.unwrap_or_default());
        }
        for c in MIGRATED {
            let owners: Vec<usize> = (0..managers.len()).filter(|i| running[*i].iter().any(|r| r == c)).collect();
            assert!(owners.len() <= 1, "{c} runs in managers {owners:?} at once: {running:?}");
            if let [one] = owners[..] {
                assert!(holder.is_none() || holder == Some(one), "{c} moved without a stop: {running:?}");
                holder = Some(one);
            }
        }
        for (i, r) in running.iter().enumerate() {
            assert!(r.iter().any(|c| c == "cloud-node"), "manager {i} runs cloud-node under its own Lease: {r:?}");
            assert!(!r.iter().any(|c| c == "route"), "route belongs to kube-controller-manager: {r:?}");
        }
        sleep(Duration::from_millis(100)).await;
    }
    holder.expect("one manager runs the migrated controllers")
}

/// Waits until `manager` runs every migrated controller; returns how long that took.
async fn until_it_runs_the_migrated_controllers(manager: &Manager, within: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let running = manager.running().await.unwrap_or_default();
        if MIGRATED.iter().all(|c| running.iter().any(|r| r == c)) {
            return started.elapsed();
        }
        assert!(started.elapsed() < within, "the standby never ran the migrated controllers: {running:?}");
        sleep(Duration::from_millis(50)).await;
    }
}

async fn two_managers(cluster: &TestCluster, dir: &Path) -> (Manager, Manager) {
    let a = Manager::start(cluster, dir, "ccm-a").await;
    let b = Manager::start(cluster, dir, "ccm-b").await;
    let deadline = Instant::now() + Duration::from_secs(60);
    for m in [&a, &b] {
        while !m.running().await.is_some_and(|r| r.iter().any(|c| c == "cloud-node")) {
            let log = std::fs::read_to_string(&m.log).unwrap_or_default();
            assert!(Instant::now() < deadline, "a manager never led its main Lease:\n{log}");
            sleep(Duration::from_millis(100)).await;
        }
    }
    (a, b)
}

testkit::backend_tests! {
    async fn m7_two_managers_share_the_migration_lease_and_a_graceful_stop_hands_the_migrated_controllers_over(backend) {
        let cluster = TestCluster::start(backend).await.unwrap();
        let dir = setup(&cluster, "migration-graceful");
        let (a, b) = two_managers(&cluster, &dir).await;
        let holder = exactly_one_runs_the_migrated_controllers(&[&a, &b], 30).await;
        let (mut leaving, staying) = if holder == 0 { (a, b) } else { (b, a) };
        let identity = migration_holder(&cluster).await.expect("the migration Lease is held");
        let log = std::fs::read_to_string(&leaving.log).unwrap();
        assert!(log.contains(&identity), "the holder of {MIGRATION_LEASE} is the manager running them");
        assert!(log.contains("not starting controller") && log.contains("kube-controller-manager"), "{log}");

        // The migration Lease has its own health check and its own leader_election_master_status series.
        for (m, leading) in [(&leaving, 1), (&staying, 0)] {
            let get = |path: &'static str| ccm_framework::serving::probe::get(m.addr, path, None, Duration::from_secs(2));
            assert_eq!(get("/healthz/leaderMigration").await.map(|r| r.status), Some(200));
            let metrics = get("/metrics").await.unwrap().body;
            let series = format!("leader_election_master_status{{name=\"{MIGRATION_LEASE}\"}} {leading}");
            assert!(metrics.contains(&series), "{series} in:\n{metrics}");
        }

        leaving.signal("-TERM").await;
        let took = until_it_runs_the_migrated_controllers(&staying, LEASE * 2).await;
        println!("graceful stop: the migrated controllers restarted in the other manager after {took:?}");
        assert!(took <= LEASE, "hand-over took {took:?}, longer than the {LEASE:?} lease");
        let status = timeout(Duration::from_secs(30), leaving.child.wait()).await.unwrap().unwrap();
        assert!(status.success(), "{status:?}");
        let log = std::fs::read_to_string(&leaving.log).unwrap();
        assert!(log.contains("lease=released"), "{log}");
        assert_ne!(migration_holder(&cluster).await, Some(identity), "the migration Lease moved");
        staying.signal("-TERM").await;
        let _ = std::fs::remove_dir_all(&dir);
        drop(cluster);
    }

    async fn m7_when_the_migration_lease_holder_is_killed_the_other_manager_runs_the_migrated_controllers_within_the_lease_duration(backend) {
        let cluster = TestCluster::start(backend).await.unwrap();
        let dir = setup(&cluster, "migration-killed");
        let (a, b) = two_managers(&cluster, &dir).await;
        let holder = exactly_one_runs_the_migrated_controllers(&[&a, &b], 20).await;
        let (mut dead, staying) = if holder == 0 { (a, b) } else { (b, a) };
        dead.signal("-KILL").await;
        let took = until_it_runs_the_migrated_controllers(&staying, LEASE * 3).await;
        println!("SIGKILL: the migrated controllers restarted in the other manager after {took:?}");
        // The Lease is not released: the standby waits it out (plus a retry period and start-up).
        assert!(took <= LEASE + Duration::from_secs(2), "hand-over took {took:?}, lease {LEASE:?}");
        let _ = dead.child.wait().await;
        exactly_one_runs_the_migrated_controllers(&[&staying], 5).await;
        staying.signal("-TERM").await;
        let _ = std::fs::remove_dir_all(&dir);
        drop(cluster);
    }
}
