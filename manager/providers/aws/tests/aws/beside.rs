//! Ours beside a running upstream cloud-provider-aws v1.36.1 (its own binary), on the
//! [`takeover`] scene: in shadow mode with its own Lease while upstream leads (no difference on
//! upstream's Services; then one Service's hostname made wrong, the control, is exactly one
//! difference), and taking the controllers over by leader migration (both configured with one
//! migration Lease) when upstream stops gracefully. Ours talks to moto through its own counting proxy, so its calls
//! are told apart from upstream's. The counts go to stderr, so the CI log shows them.

use std::io::Write as _;
use std::time::Instant;

use crate::differential::{our_provider, settle};
use crate::kit::*;
use crate::proxy::Proxy;
use crate::takeover::{self, Scene};
use crate::upstream::{self, Upstream};
use crate::world;
use ccm_framework::engine::{EngineBuilder, RunningEngine};
use ccm_framework::leader::LeaderElectionConfig;
use ccm_framework::leader_migration::LeaderMigrationConfiguration;
use k8s_openapi::api::coordination::v1::Lease;

/// The Lease namespace both managers use.
const LEASE_NAMESPACE: &str = "kube-system";
/// Upstream's main Lease (its default).
const UPSTREAM_LEASE: &str = "cloud-controller-manager";
/// Upstream's default migration Lease, shared by both.
const MIGRATION_LEASE: &str = "cloud-provider-extraction-migration";

/// Every controller under migration, for any component: neither manager runs one without the
/// migration Lease. Upstream names them by their aliases; ours reads the same file.
const MIGRATION_CONFIG: &str = "apiVersion: controllermanager.config.k8s.io/v1alpha1
kind: LeaderMigrationConfiguration
leaderName: cloud-provider-extraction-migration
resourceLock: leases
controllerLeaders:
  - name: cloud-node
    component: \"*\"
  - name: cloud-node-lifecycle
    component: \"*\"
  - name: service
    component: \"*\"
  - name: route
    component: \"*\"
";

/// Checks what the runs need; `None` (skipped) without upstream's binary, a genuine API server
/// or moto.
async fn prerequisites() -> Option<std::path::PathBuf> {
    let binary = upstream::binary_async().await?;
    if !Backend::genuine_available() {
        return None;
    }
    let probe = Moto::start("beside").await?;
    assert!(probe.corrected, "the runs beside upstream need moto's corrections (python3 with moto)");
    drop(probe);
    testkit::init_tracing();
    Some(binary)
}

/// Upstream started with leader election on its default Lease, plus `flags`, and settled over
/// the scene's Services.
async fn upstream_leads(binary: &std::path::Path, s: &Scene, flags: &[&str]) -> (Upstream, BTreeMap<String, String>) {
    let mut all = vec!["--leader-elect=true"];
    all.extend_from_slice(flags);
    let up = Upstream::start(binary, &s.cluster.kubeconfig_path(), &s.conf_path, &s.dir.join("upstream.log"), &all);
    let pending = settle(&s.proxy, &s.client, &s.services, Duration::from_secs(5), || async { true }).await;
    assert!(pending.is_empty(), "upstream did not settle: {pending:?}\n{}", up.log_tail(40));
    // Upstream initializes the Nodes on its own schedule; a Node still tainted when ours
    // first looks would be a difference of timing, not of behaviour.
    let waited = Instant::now();
    loop {
        let pending = uninitialized_nodes(&s.client).await;
        if pending.is_empty() {
            break;
        }
        assert!(
            waited.elapsed() < Duration::from_secs(60),
            "upstream never initialized {pending:?}\n{}",
            up.log_tail(40)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let made = takeover::hostnames(&s.client, &s.services).await;
    assert!(
        made.values().all(|h| !h.is_empty()),
        "upstream gave every Service a hostname: {made:?}\n{}",
        up.log_tail(40)
    );
    (up, made)
}

/// The Nodes still carrying the cloud provider's uninitialized taint.
async fn uninitialized_nodes(client: &kube::Client) -> Vec<String> {
    let nodes = Api::<Node>::all(client.clone()).list(&Default::default()).await.map(|l| l.items).unwrap_or_default();
    nodes.into_iter().filter(|n| has_taint(n, TAINT_UNINITIALIZED)).filter_map(|n| n.metadata.name).collect()
}

/// The holder of a Lease in [`LEASE_NAMESPACE`], if any.
async fn holder(client: &kube::Client, name: &str) -> Option<String> {
    let lease = Api::<Lease>::namespaced(client.clone(), LEASE_NAMESPACE).get_opt(name).await.ok()??;
    lease.spec?.holder_identity.filter(|h| !h.is_empty())
}

/// Ours, with `options` and leader election on `lease`, talking to moto through `proxy`.
async fn start_ours(
    s: &Scene,
    proxy: &Proxy,
    options: ControllerOptions,
    lease: &str,
    migration: Option<LeaderMigrationConfiguration>,
) -> RunningEngine {
    let conf = world::cloud_conf(&s.world, &proxy.url, &[]);
    let mut election = LeaderElectionConfig::new(LEASE_NAMESPACE, lease);
    election.identity = format!("ours-{lease}");
    EngineBuilder::new(s.client.clone(), our_provider(&conf), options)
        .leader_election(Some(election))
        .leader_migration(migration)
        .build()
        .expect("engine")
        .start(CancellationToken::new())
        .await
        .expect("engine starts")
}

/// The sum of the samples of `metric` whose labels contain `label="value"`.
fn metric_sum(text: &str, metric: &str, label: &str, value: &str) -> f64 {
    let needle = format!("{label}=\"{value}\"");
    text.lines()
        .filter(|l| l.starts_with(&format!("{metric}{{")) && l.contains(&needle))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// The non-zero `ccm_shadow_differences` samples, by their labels.
fn shadow_differences(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| l.starts_with("ccm_shadow_differences{"))
        .filter_map(|l| {
            let (labels, value) = l.rsplit_once(' ')?;
            let value: f64 = value.parse().ok()?;
            (value != 0.0).then(|| (labels.trim_start_matches("ccm_shadow_differences").to_string(), value))
        })
        .collect()
}

/// The objects with a `ShadowDifference` event, with its note.
async fn shadow_events(client: &kube::Client) -> Vec<String> {
    Api::<Event>::all(client.clone())
        .list(&Default::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("ShadowDifference"))
        .map(|e| {
            let object = e.regarding.as_ref().map(|r| {
                format!("{}/{}", r.kind.as_deref().unwrap_or_default(), r.name.as_deref().unwrap_or_default())
            });
            format!("{}: {}", object.unwrap_or_default(), e.note.unwrap_or_default())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ours_in_shadow_mode_beside_upstream_makes_no_mutating_call_and_reports_only_a_deliberate_difference() {
    let Some(binary) = prerequisites().await else { return };
    let started = Instant::now();
    let s = takeover::scene("shadow").await;
    let (up, made) = upstream_leads(&binary, &s, &[]).await;

    let ours_proxy = Proxy::start(s.moto.port).await;
    let options = ControllerOptions { configure_cloud_routes: false, shadow: true, ..Default::default() };
    let ours = start_ours(&s, &ours_proxy, options, "cloud-controller-manager-shadow", None).await;
    let waited = Instant::now();
    let passed = |text: &str| {
        ["cloud-node-controller", "service-lb-controller"]
            .iter()
            .all(|c| metric_sum(text, "ccm_shadow_passes_total", "controller", c) >= 1.0)
    };
    while !passed(&ours.metrics().encode()) {
        assert!(waited.elapsed() < Duration::from_secs(120), "ours never finished a shadow pass");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let first_pass = waited.elapsed();
    // Differences on changes come within 200 ms; a few seconds more show they stay.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let text = ours.metrics().encode();
    let differences = shadow_differences(&text);
    let refused: f64 = text
        .lines()
        .filter(|l| l.starts_with("ccm_shadow_refused_calls_total{"))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum();
    let events = shadow_events(&s.client).await;
    let ours_reads = crate::proxy::actions_since(&ours_proxy, 0);
    let upstream_holds = holder(&s.client, UPSTREAM_LEASE).await;
    let ours_holds = holder(&s.client, "cloud-controller-manager-shadow").await;
    let hostnames_changed = takeover::changed(&made, &takeover::hostnames(&s.client, &s.services).await);

    // The control: one Service's hostname made wrong is reported within moments, alone.
    let edited = &s.services[0];
    let (ns, name) = (edited.metadata.namespace.as_deref().unwrap(), edited.metadata.name.as_deref().unwrap());
    let before_control = events.clone();
    let wrong = json!({"status": {"loadBalancer": {"ingress": [{"hostname": "elsewhere.example"}]}}});
    Api::<Service>::namespaced(s.client.clone(), ns)
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&wrong))
        .await
        .expect("status patch");
    let waited = Instant::now();
    let mut control = BTreeMap::new();
    let mut control_events = Vec::new();
    while waited.elapsed() < Duration::from_secs(30) {
        control = shadow_differences(&ours.metrics().encode());
        control_events = shadow_events(&s.client).await;
        control_events.retain(|e| !before_control.contains(e));
        if !control.is_empty() && !control_events.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let control_seen = waited.elapsed();
    let _ = ours.stop().await;
    up.terminate().await;
    let ours_calls = takeover::mutating_since(&ours_proxy, 0);
    let _ = writeln!(
        std::io::stderr(),
        "shadow beside upstream cloud-provider-aws v1.36.1 ({} Services, upstream leading): ours made {} mutating calls {:?} \
         (reads {ours_reads:?}), {} refused calls, {} differences {differences:?}, {} ShadowDifference events {events:?}, \
         {} hostnames changed; first pass of every controller {:.1} s, run {:.0} s",
        s.services.len(),
        ours_calls.values().sum::<usize>(),
        ours_calls,
        refused as u64,
        differences.values().sum::<f64>() as u64,
        events.len(),
        hostnames_changed.len(),
        first_pass.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    let _ = writeln!(
        std::io::stderr(),
        "  control: {ns}/{name}'s hostname made wrong: {} differences {control:?} after {:.1} s, events {control_events:?}",
        control.values().sum::<f64>() as u64,
        control_seen.as_secs_f64()
    );
    let _ = std::fs::remove_dir_all(&s.dir);
    assert!(ours_calls.is_empty(), "shadow mode made mutating calls: {ours_calls:?}");
    assert_eq!(refused, 0.0, "shadow mode tried a mutating call");
    assert!(differences.is_empty(), "shadow mode reports differences: {differences:?}\n{events:#?}");
    assert!(events.is_empty(), "shadow mode reported a difference on upstream's work: {events:#?}");
    assert!(hostnames_changed.is_empty(), "{hostnames_changed:?}");
    assert!(
        upstream_holds.as_ref().is_some_and(|h| !h.starts_with("ours")),
        "upstream kept its Lease: {upstream_holds:?}"
    );
    assert_eq!(ours_holds.as_deref(), Some("ours-cloud-controller-manager-shadow"), "ours leads its own Lease");
    let only = control.iter().next().map(|(labels, n)| (labels.as_str(), *n));
    assert!(
        control.len() == 1
            && only.is_some_and(|(l, n)| l.contains("service-lb-controller") && l.contains("would-patch") && n == 1.0),
        "the wrong hostname is exactly one would-patch: {control:?}"
    );
    assert!(
        control_events.len() == 1 && control_events[0].starts_with(&format!("Service/{name}:")),
        "one ShadowDifference event, on {name}: {control_events:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ours_takes_over_by_leader_migration_without_a_mutating_call() {
    let Some(binary) = prerequisites().await else { return };
    let started = Instant::now();
    let s = takeover::scene("migration").await;
    let config_path = s.dir.join("leader-migration.yaml");
    std::fs::write(&config_path, MIGRATION_CONFIG).unwrap();
    let flag = format!("--leader-migration-config={}", config_path.display());
    let (up, made) = upstream_leads(&binary, &s, &["--enable-leader-migration", &flag]).await;
    let upstream_migration = holder(&s.client, MIGRATION_LEASE).await;
    assert!(upstream_migration.is_some(), "upstream holds the migration Lease\n{}", up.log_tail(40));

    // Ours with its own main Lease and the same migration Lease: standing by.
    let ours_proxy = Proxy::start(s.moto.port).await;
    let migration = LeaderMigrationConfiguration::read_file(&config_path).expect("the migration file");
    let options = ControllerOptions { configure_cloud_routes: false, ..Default::default() };
    let ours = start_ours(&s, &ours_proxy, options, "ccm-aws-ours", Some(migration)).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let standby_requests = takeover::requests(&ours_proxy);
    let standby_calls = takeover::mutating_since(&ours_proxy, 0);
    assert_eq!(holder(&s.client, MIGRATION_LEASE).await, upstream_migration, "upstream kept the migration Lease");

    // Upstream stops gracefully; ours takes the migration Lease and adopts.
    let before = takeover::events_now(&s.client).await;
    let stopping = Instant::now();
    up.terminate().await;
    let exited = Instant::now();
    let mut took = None;
    while took.is_none() {
        assert!(exited.elapsed() < Duration::from_secs(90), "ours never took the migration Lease");
        if ours.migration_status().is_some_and(|m| m.leading) {
            took = Some(Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let took = took.unwrap_or_else(Instant::now);
    let pending = takeover::first_full_sync(&ours_proxy, &s.client, &s.services, &before).await;
    let synced = Instant::now();
    let ours_calls = takeover::mutating_since(&ours_proxy, 0);
    let hostnames_changed = takeover::changed(&made, &takeover::hostnames(&s.client, &s.services).await);
    let ours_holds = holder(&s.client, MIGRATION_LEASE).await;
    let _ = ours.stop().await;
    let _ = writeln!(
        std::io::stderr(),
        "leader migration from upstream cloud-provider-aws v1.36.1 (graceful stop, {} Services): ours made {} mutating calls {:?} \
         ({standby_requests} requests, {standby_calls:?} mutating while standing by), {} hostnames changed; migration Lease without an owner {:.1} s \
         (upstream took {:.1} s to exit), ours' first full sync {:.1} s after it took the Lease, run {:.0} s",
        s.services.len(),
        ours_calls.values().sum::<usize>(),
        ours_calls,
        hostnames_changed.len(),
        took.duration_since(exited).as_secs_f64(),
        exited.duration_since(stopping).as_secs_f64(),
        synced.duration_since(took).as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    let _ = std::fs::remove_dir_all(&s.dir);
    assert!(pending.is_empty(), "ours never ensured {pending:?}");
    assert!(standby_calls.is_empty(), "ours made mutating calls while upstream held the migration Lease");
    assert!(ours_calls.is_empty(), "ours' takeover made mutating calls: {ours_calls:?}");
    assert!(hostnames_changed.is_empty(), "{hostnames_changed:?}");
    assert_eq!(ours_holds.as_deref(), Some("ours-ccm-aws-ours"), "ours holds the migration Lease");
}
