//! Operator benchmark: N CloudControllerManagers (Deployment or Embedded mode) reconciled from
//! cold.
//!
//! Starts the test API server, installs the CRD, and runs the operator as a child process (this
//! binary re-executed with `--operator`, which runs `operator::run`), so its memory is measured
//! alone. Then it creates N resources and, in Deployment mode, plays the rest of the cluster: the
//! deployment controller (writes each Deployment's status as rolled out) and each manager (holds
//! the resource's Lease and reports `ProviderHealthy`); in Embedded mode the operator's own
//! engines do that. It reports the time until every resource is `Ready`, the operator's API
//! writes per resource (from the request log), the operator's RSS, and the API server's limit:
//! the time the same server takes to accept as many writes as the whole run made (driver's and
//! operator's, Lease writes left out), made as label patches of the resources themselves (the
//! costliest kind here: a custom resource with CEL rules), at the best of three concurrencies.
//! An idle period must add no writes but Lease renewals.
//!
//! ```text
//! cargo run --release -p e2e --bin bench-operator -- --crs 100 [--mode embedded] [--backend genuine]
//! ```

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;
use crds::CloudControllerManager;
use crds::conditions::{self, types};
use e2e::bench::{self, BackendArg, ChildGuard, proc_status_kib};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, CustomResourceExt, ResourceExt};
use serde_json::{Value, json};
use testkit::{Backend, TestCluster};

/// The user agent of the driver's own requests.
const DRIVER: &str = "bench-operator-driver";
/// The namespace the resources live in.
const NAMESPACE: &str = "bench";

#[derive(Parser, Debug)]
#[command(name = "bench-operator", about = "Time N CloudControllerManagers reconciled from cold")]
struct Args {
    /// Resources to create.
    #[arg(long, default_value_t = 100)]
    crs: usize,
    /// Idle period after all are Ready, checked for writes.
    #[arg(long, default_value = "10")]
    idle_seconds: u64,
    /// The API server: `genuine` (etcd + kube-apiserver from `CCM_TEST_ASSETS`, writes
    /// counted from its audit log) or `local` (in-process).
    #[arg(long, value_enum, default_value_t = BackendArg::Local)]
    backend: BackendArg,
    /// How the resources run their managers.
    #[arg(long, value_enum, default_value_t = ModeArg::Deployment)]
    mode: ModeArg,
    /// The operator's reconcile-trigger debounce in milliseconds (default: the operator's own).
    #[arg(long)]
    debounce_ms: Option<u64>,
    /// Skip measuring the API server's limit for the same number of writes.
    #[arg(long)]
    no_limit: bool,
    /// Internal: run the operator against this kubeconfig (the child process).
    #[arg(long, hide = true)]
    operator: Option<PathBuf>,
}

/// The resources' `spec.mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum ModeArg {
    /// A manager Deployment per resource (the driver plays its rollout and manager).
    Deployment,
    /// The controllers run inside the operator.
    Embedded,
}

impl From<ModeArg> for crds::v1alpha1::Mode {
    fn from(mode: ModeArg) -> Self {
        match mode {
            ModeArg::Deployment => Self::Deployment,
            ModeArg::Embedded => Self::Embedded,
        }
    }
}

/// Create requests the driver keeps in flight, so the clock measures the operator rather than
/// the driver's round trips (100 one at a time took 1.2–1.7 s, half an Embedded run).
const CREATE_CONCURRENCY: usize = 16;

async fn run_operator(kubeconfig: PathBuf, debounce_ms: Option<u64>) {
    // The operator's own log on standard error, at RUST_LOG (warn unless set).
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()))
        .init();
    let kubeconfig = kube::config::Kubeconfig::read_from(&kubeconfig).expect("a kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await.expect("a config");
    // As the operator binary does: its client (HTTP/2 where TLS offers it) and malloc arenas.
    ccm_framework::process::limit_malloc_arenas();
    let client = ccm_framework::client::build_client(config, &ccm_framework::client::RateLimitLayer::disabled())
        .expect("a client");
    let mut config = operator::OperatorConfig::new(client);
    config.scope = operator::Scope::Namespaces(vec![NAMESPACE.to_string()]);
    config.build.manager_image = "example.test/cloud-controller-manager:bench".into();
    if let Some(ms) = debounce_ms {
        config.timings.debounce = Duration::from_millis(ms);
    }
    if let Err(e) = operator::run(config, ccm_framework::process::shutdown_on_signal()).await {
        eprintln!("operator failed: {e}");
        std::process::exit(1);
    }
}

fn driver_client(server: &TestCluster) -> Client {
    let mut config = server.kube_config();
    config.headers.push(("user-agent".parse().expect("a header"), DRIVER.parse().expect("a value")));
    Client::try_from(config).expect("a client")
}

/// Now as a Lease's `renewTime` (kube-apiserver takes exactly six fractional digits).
fn micro_now() -> Value {
    serde_json::to_value(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(Timestamp::now()))
        .unwrap_or(Value::Null)
}

/// Play the deployment controller and the managers until told to stop.
async fn play_cluster(client: Client, mut stop: tokio::sync::watch::Receiver<bool>) {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NAMESPACE);
    let crs: Api<CloudControllerManager> = Api::namespaced(client.clone(), NAMESPACE);
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(client.clone(), NAMESPACE);
    let mut managed: HashSet<String> = HashSet::new();
    let mut stream =
        watcher(deployments.clone(), watcher::Config::default()).default_backoff().applied_objects().boxed();
    let mut renew = tokio::time::interval(Duration::from_secs(5));
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = renew.tick() => {
                for cr in managed.iter() {
                    let _ = leases.patch(cr, &PatchParams::apply(DRIVER).force(), &Patch::Apply(lease(cr))).await;
                }
            }
            Some(Ok(d)) = stream.next() => {
                let name = d.metadata.name.clone().unwrap_or_default();
                let generation = d.metadata.generation;
                let replicas = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
                let observed = d.status.as_ref().and_then(|s| s.observed_generation);
                if observed != generation {
                    let status = json!({"status": {"observedGeneration": generation, "replicas": replicas,
                        "updatedReplicas": replicas, "readyReplicas": replicas, "availableReplicas": replicas}});
                    let _ = deployments.patch_status(&name, &PatchParams::default(), &Patch::Merge(status)).await;
                }
                let Some(cr) = name.strip_prefix("ccm-").map(str::to_string) else { continue };
                if managed.insert(cr.clone()) {
                    let _ = leases.patch(&cr, &PatchParams::apply(DRIVER).force(), &Patch::Apply(lease(&cr))).await;
                    let health = json!({
                        "apiVersion": "ccm.rs/v1alpha1", "kind": "CloudControllerManager",
                        "status": {"conditions": [{"type": "ProviderHealthy", "status": "True", "reason": "Healthy",
                            "message": "", "lastTransitionTime": Timestamp::now().to_string()}]},
                    });
                    let _ = crs.patch_status(&cr, &PatchParams::apply("cloud-controller-manager").force(), &Patch::Apply(health)).await;
                }
            }
        }
    }
}

/// A write of the run: anyone's but the API server's own.
fn is_run_write(r: &testkit::RequestRecord) -> bool {
    r.is_write() && r.user.as_deref() != Some("system:apiserver")
}

/// A write of the operator (or its engines): the run's, not the driver's.
fn is_operator_write(r: &testkit::RequestRecord) -> bool {
    is_run_write(r) && r.user_agent != DRIVER
}

/// A Lease write (the audit log names the resource with its group, the local log without).
fn is_lease(r: &testkit::RequestRecord) -> bool {
    r.resource.as_deref().is_some_and(|x| x == "leases" || x.starts_with("leases."))
}

fn lease(cr: &str) -> serde_json::Value {
    json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": cr, "namespace": NAMESPACE},
        "spec": {"holderIdentity": format!("{cr}-manager-0"), "leaseDurationSeconds": 15, "renewTime": micro_now()},
    })
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    if let Some(kubeconfig) = args.operator {
        return run_operator(kubeconfig, args.debounce_ms).await;
    }
    let backend = match args.backend {
        BackendArg::Local => Backend::Local,
        BackendArg::Genuine if Backend::genuine_available() => Backend::Genuine,
        BackendArg::Genuine => panic!("--backend genuine needs CCM_TEST_ASSETS"),
    };
    let server = TestCluster::start(backend).await.expect("the API server starts");
    server.install_crd(&CloudControllerManager::crd()).await.expect("the CRD installs");
    let client = driver_client(&server);
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &Namespace {
                metadata: ObjectMeta { name: Some(NAMESPACE.into()), ..Default::default() },
                ..Default::default()
            },
        )
        .await
        .expect("the namespace is created");

    let exe = std::env::current_exe().expect("this binary's path");
    let mut command = Command::new(exe);
    command.arg("--operator").arg(server.kubeconfig_path());
    if let Some(ms) = args.debounce_ms {
        command.arg(format!("--debounce-ms={ms}"));
    }
    let child = command
        .env("RUST_LOG", std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()))
        .stdout(Stdio::null())
        .spawn()
        .expect("the operator process starts");
    let child = ChildGuard(child);
    let pid = child.0.id();
    // Let the operator start its watches, so "cold" means "no resources yet", not "not started".
    tokio::time::sleep(Duration::from_secs(2)).await;
    let idle_rss = proc_status_kib(pid, "VmRSS:").unwrap_or(0);

    let (stop, stopped) = tokio::sync::watch::channel(false);
    // Embedded engines take their Leases and report health themselves.
    let player = (args.mode == ModeArg::Deployment).then(|| tokio::spawn(play_cluster(client.clone(), stopped)));
    let log = server.request_log();
    let mark = log.mark();
    let crs: Api<CloudControllerManager> = Api::namespaced(client.clone(), NAMESPACE);
    let started = Instant::now();
    let mode = crds::v1alpha1::Mode::from(args.mode).to_string();
    futures::stream::iter(0..args.crs)
        .for_each_concurrent(CREATE_CONCURRENCY, |i| {
            // Disjoint controllers (one service controller per class), so none conflicts.
            let body = json!({
                "apiVersion": "ccm.rs/v1alpha1", "kind": "CloudControllerManager",
                "metadata": {"name": format!("c{i:03}"), "namespace": NAMESPACE},
                "spec": {"provider": "fake", "mode": mode, "controllers": ["service"],
                         "loadBalancerClass": format!("bench.example/{i}"), "configureCloudRoutes": false},
            });
            let crs = crs.clone();
            async move {
                crs.patch(&format!("c{i:03}"), &PatchParams::apply(DRIVER), &Patch::Apply(&body))
                    .await
                    .expect("a resource");
            }
        })
        .await;
    let created = started.elapsed();
    let mut peak_rss = 0;
    let mut reported_slow = false;
    let all_ready = loop {
        peak_rss = peak_rss.max(proc_status_kib(pid, "VmRSS:").unwrap_or(0));
        let list = crs.list(&ListParams::default()).await.expect("a list");
        let ready = list
            .items
            .iter()
            .filter(|c| {
                c.status
                    .as_ref()
                    .and_then(|s| conditions::find(&s.conditions, types::READY))
                    .is_some_and(|r| r.status == "True")
            })
            .count();
        if ready == args.crs {
            break started.elapsed();
        }
        // A slow run says why: the conditions of one resource not yet Ready, once.
        if !reported_slow && started.elapsed() > Duration::from_secs(10) {
            reported_slow = true;
            if let Some(c) = list.items.iter().find(|c| {
                !c.status
                    .as_ref()
                    .and_then(|s| conditions::find(&s.conditions, types::READY))
                    .is_some_and(|r| r.status == "True")
            }) {
                let conditions: Vec<String> = c
                    .status
                    .iter()
                    .flat_map(|s| &s.conditions)
                    .map(|c| format!("{}={} {}: {}", c.type_, c.status, c.reason, c.message))
                    .collect();
                eprintln!("   {ready} Ready after 10 s; {} is not: {}", c.name_any(), conditions.join("; "));
            }
        }
        if started.elapsed() > Duration::from_secs(300) {
            panic!("only {ready} of {} resources became Ready in 5 minutes", args.crs);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // Events are written from a rate-limited queue: count them too, once the writes settle.
    let settle_started = Instant::now();
    let mut last = usize::MAX;
    loop {
        let now = log.since(mark).iter().filter(|r| is_operator_write(r)).count();
        if now == last || settle_started.elapsed() > Duration::from_secs(60) {
            break;
        }
        last = now;
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let records = log.since(mark);
    let operator_writes: Vec<_> = records.iter().filter(|r| is_operator_write(r)).collect();
    let mut by_kind: BTreeMap<String, usize> = BTreeMap::new();
    for r in &operator_writes {
        let what = format!(
            "{} {}{}",
            r.verb,
            r.resource.as_deref().unwrap_or("?"),
            r.subresource.as_deref().map(|s| format!("/{s}")).unwrap_or_default()
        );
        *by_kind.entry(what).or_default() += 1;
    }
    let ready_rss = proc_status_kib(pid, "VmRSS:").unwrap_or(0);

    let idle_mark = log.mark();
    tokio::time::sleep(Duration::from_secs(args.idle_seconds)).await;
    let idle: Vec<_> = log.since(idle_mark).into_iter().filter(is_operator_write).collect();
    let idle_renewals = idle.iter().filter(|r| is_lease(r)).count();
    let idle_writes = idle.len() - idle_renewals;
    let hwm = proc_status_kib(pid, "VmHWM:").unwrap_or(0);
    // Every write of the run until it settled, the driver's creates and plays and the
    // operator's, but no Lease write: renewals are periodic, not work the run asks for.
    let run_writes = records.iter().filter(|r| is_run_write(r)).filter(|r| !is_lease(r)).count();
    let _ = stop.send(true);
    if let Some(player) = player {
        let _ = player.await;
    }
    drop(child);
    // The operator is gone, so nothing reacts to these label patches.
    let limit = if args.no_limit {
        None
    } else {
        let n = args.crs;
        let limit_client = client.clone();
        let limit = bench::measure_limit("resources' writes", run_writes.div_ceil(2), move |round, i| {
            let crs: Api<CloudControllerManager> = Api::namespaced(limit_client.clone(), NAMESPACE);
            async move {
                let name = format!("c{:03}", i % n);
                let pp = PatchParams { field_manager: Some(format!("{DRIVER}-limit")), ..Default::default() };
                for step in 0..2 {
                    let label = json!({"metadata": {"labels": {format!("bench.ccm.rs/limit-{}", i / n): format!("{round}-{step}")}}});
                    crs.patch(&name, &pp, &Patch::Merge(&label)).await?;
                }
                Ok(())
            }
        })
        .await
        .expect("the limit is measured");
        Some(limit)
    };

    let n = args.crs as f64;
    println!("| Measure | Value |");
    println!("|---|---|");
    println!("| backend | {:?} |", backend);
    println!("| resources | {} ({} mode, `fake` provider) |", args.crs, crds::v1alpha1::Mode::from(args.mode));
    if let Some(ms) = args.debounce_ms {
        println!("| operator debounce | {ms} ms |");
    }
    println!("| creating them (driver) | {:.2} s |", created.as_secs_f64());
    println!("| time to all Ready (from the first create) | {:.2} s |", all_ready.as_secs_f64());
    if let Some((limit, concurrency)) = limit {
        println!(
            "| API server limit: {run_writes} writes (the run's, driver's included, Leases left out) | {limit:.2} s at concurrency {concurrency} ({:.2}x of it) |",
            all_ready.as_secs_f64() / limit
        );
    }
    println!(
        "| operator API writes, until they settle | {} ({:.2} per resource) |",
        operator_writes.len(),
        operator_writes.len() as f64 / n
    );
    for (what, count) in &by_kind {
        println!("| &nbsp;&nbsp;{what} | {count} ({:.2} per resource) |", *count as f64 / n);
    }
    println!(
        "| operator writes during {} s idle | {idle_writes}, and {idle_renewals} Lease renewals |",
        args.idle_seconds
    );
    println!("| operator RSS before any resource | {:.1} MiB |", idle_rss as f64 / 1024.0);
    println!("| operator RSS when all Ready | {:.1} MiB |", ready_rss as f64 / 1024.0);
    println!("| operator peak RSS (VmHWM) | {:.1} MiB |", hwm.max(peak_rss) as f64 / 1024.0);
    drop(server);
}
