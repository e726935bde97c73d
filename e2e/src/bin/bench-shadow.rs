//! bench-shadow: the cost of shadow mode (docs/shadow.md) on a genuine kube-apiserver.
//!
//! The driver starts etcd and kube-apiserver (`CCM_TEST_ASSETS`), registers N Nodes as kubelet
//! does (tainted, Ready, their own addresses) and M LoadBalancer Services, and runs the manager
//! binary three times over them, one after the other, with the same fake cloud-config
//! (`profile: bench`, so a fresh process adopts the load balancers a previous one made):
//!
//! 1. `normal-init`: a normal manager initializes every Node and serves every Service;
//! 2. `normal-steady`: the same manager restarted over the initialized objects;
//! 3. `shadow`: the same command line with `--shadow`.
//!
//! Per run: API writes by verb and resource (the audit log), cloud calls by method (the
//! manager's `cloudprovider_api_requests_total`) over the whole run and over a window of
//! whole resync periods after it is ready, the time until it is ready (all initialized; the
//! first address refresh; every shadow controller's first full pass and `ShadowAgrees`), and
//! its peak RSS (`VmHWM`, sampled `VmRSS`). Results and command: docs/benchmarks.md.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Parser;
use e2e::bench::{BoxError, ManagerProcess, metric_by};
use k8s_openapi::api::core::v1::{Namespace, Node, Service};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams, ObjectMeta, PostParams};
use testkit::fixtures::UNINITIALIZED;
use testkit::genuine::ControlPlane;
use testkit::{NodeFixture, RequestLog};
use tokio::task::JoinSet;

/// Field manager of the driver's writes; every other write is the manager's.
const DRIVER: &str = "bench-shadow";
const NAMESPACE: &str = "bench";
/// The CloudControllerManager both managers report on (kube-system/bench).
const RESOURCE: &str = "bench";
const CALLS: &str = "cloudprovider_api_requests_total";
const PASSES: &str = "ccm_shadow_passes_total";
const DIFFERENCES: &str = "ccm_shadow_differences";
const REFUSED: &str = "ccm_shadow_refused_calls_total";
/// Provider calls that change the cloud.
const MUTATING: [&str; 5] =
    ["ensure_load_balancer", "update_load_balancer", "ensure_load_balancer_deleted", "create_route", "delete_route"];

#[derive(Debug, Parser)]
#[command(name = "bench-shadow", about = "Measure shadow mode beside a normal manager on a genuine kube-apiserver")]
struct Args {
    /// Nodes to register.
    #[arg(long, default_value_t = 5000)]
    nodes: usize,
    /// LoadBalancer Services to create.
    #[arg(long, default_value_t = 1000)]
    services: usize,
    /// The manager binary.
    #[arg(long, default_value = "target/debug/cloud-controller-manager")]
    manager: String,
    /// Resync period given to both managers (`--node-status-update-frequency` and
    /// `--load-balancer-resync-period`), in seconds.
    #[arg(long, default_value_t = 30)]
    resync_seconds: u64,
    /// Whole resync periods in the measuring window after a run is ready.
    #[arg(long, default_value_t = 2)]
    window_resyncs: u64,
    /// Give up on a phase after this many seconds.
    #[arg(long, default_value_t = 900)]
    timeout_seconds: u64,
    /// Skip the `normal-steady` run.
    #[arg(long)]
    no_steady: bool,
    /// Where the cloud-config and manager logs go (default: a fresh directory under /tmp).
    #[arg(long)]
    work_dir: Option<PathBuf>,
}

/// What one run measured.
#[derive(Debug, Default)]
struct Report {
    label: String,
    ready_secs: f64,
    agrees_secs: Option<f64>,
    calls: BTreeMap<String, u64>,
    window_calls: BTreeMap<String, u64>,
    window_secs: f64,
    window_passes: BTreeMap<String, u64>,
    writes: BTreeMap<String, usize>,
    refused: BTreeMap<String, u64>,
    differences: u64,
    peak_rss_mib: f64,
}

fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(std::env::var("RUST_LOG").unwrap_or_else(|_| "warn,kube_client::client::builder=off".into()))
        .init();
    tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(run(args))
}

async fn run(args: Args) -> Result<(), BoxError> {
    let work = args
        .work_dir
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join(format!("bench-shadow-{}", std::process::id())));
    std::fs::create_dir_all(&work)?;
    let cloud_config = work.join("fake.yaml");
    // batchSize 1: one lookup call per Node, so calls count objects read (as upstream calls).
    std::fs::write(&cloud_config, "profile: bench\nbatchSize: 1\n")?;
    let assets = testkit::genuine::assets_dir().ok_or("bench-shadow needs CCM_TEST_ASSETS")?;
    let (plane, _keep) = tokio::task::block_in_place(|| ControlPlane::start_on_own_thread(assets))?;
    let client = plane.admin_client().await?;
    let kubeconfig = plane.admin_kubeconfig_path();
    let log = plane.request_log();
    install_resource(&client).await?;
    create_objects(&client, &args).await?;

    let resync = format!("{}s", args.resync_seconds);
    let base = format!(
        "{} --cloud-provider=fake --cloud-config={} --kubeconfig={} --bind-address=127.0.0.1 \
         --authorization-always-allow-paths=/healthz,/metrics --configure-cloud-routes=false \
         --node-status-update-frequency={resync} --load-balancer-resync-period={resync} \
         --ccm-resource=kube-system/{RESOURCE} --ccm-resource-interval=5s --kube-api-qps=0",
        args.manager,
        cloud_config.display(),
        kubeconfig.display()
    );
    let mut runs = vec![("normal-init", Ready::Initialized, String::new())];
    if !args.no_steady {
        runs.push(("normal-steady", Ready::Refreshed, String::new()));
    }
    runs.push(("shadow", Ready::Compared, " --shadow".to_string()));
    let mut reports = Vec::new();
    for (label, ready, extra) in runs {
        eprintln!("== {label}");
        let report = run_manager(&args, &client, &log, &work, label, &format!("{base}{extra}"), ready).await?;
        eprintln!("{report:#?}");
        reports.push(report);
    }
    print_table(&args, &reports);
    eprintln!("manager logs: {}", work.display());
    Ok(())
}

/// The CRD and kube-system/bench, so `--ccm-resource` has its resource.
async fn install_resource(client: &kube::Client) -> Result<(), BoxError> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = crds::crd();
    let name = crd.metadata.name.clone().unwrap_or_default();
    crds.create(&post(), &crd).await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let c = crds.get(&name).await?;
        let established = c
            .status
            .and_then(|s| s.conditions)
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Established" && c.status == "True"));
        if established {
            break;
        }
        if Instant::now() > deadline {
            return Err("the CRD was not established".into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let api: Api<crds::CloudControllerManager> = Api::namespaced(client.clone(), "kube-system");
    let ccm: crds::CloudControllerManager = serde_json::from_value(serde_json::json!({
        "apiVersion": "ccm.rs/v1alpha1",
        "kind": "CloudControllerManager",
        "metadata": {"name": RESOURCE, "namespace": "kube-system"},
        "spec": {"provider": "fake"},
    }))?;
    // The CRD's discovery can lag its condition by a moment.
    let mut tries = 0;
    while let Err(e) = api.create(&post(), &ccm).await {
        tries += 1;
        if tries > 50 {
            return Err(e.into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

fn post() -> PostParams {
    PostParams { field_manager: Some(DRIVER.into()), ..Default::default() }
}

/// A Node as kubelet with `--cloud-provider=external` registers it: tainted, Ready, with its
/// own addresses (which the bench profile reports back).
fn bench_node(i: usize) -> Node {
    let name = format!("bench-node-{i:05}");
    let ip = format!("10.1.{}.{}", i / 250, i % 250 + 1);
    testkit::kubelet_node(&name).with_address("InternalIP", &ip).with_address("Hostname", &name).ready()
}

/// The benchmark's Service `i`.
fn bench_service(i: usize) -> Service {
    testkit::lb_service(NAMESPACE, &format!("svc-{i:04}"))
}

async fn create_objects(client: &kube::Client, args: &Args) -> Result<(), BoxError> {
    let started = Instant::now();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &post(),
            &Namespace {
                metadata: ObjectMeta { name: Some(NAMESPACE.into()), ..Default::default() },
                ..Default::default()
            },
        )
        .await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let services: Api<Service> = Api::namespaced(client.clone(), NAMESPACE);
    let mut tasks: JoinSet<Result<(), kube::Error>> = JoinSet::new();
    let node_count = args.nodes;
    for i in 0..args.nodes + args.services {
        if tasks.len() >= 32
            && let Some(done) = tasks.join_next().await
        {
            done??;
        }
        if i < args.nodes {
            let api = nodes.clone();
            tasks.spawn(async move { api.create(&post(), &bench_node(i)).await.map(|_| ()) });
        } else {
            let api = services.clone();
            tasks.spawn(async move { api.create(&post(), &bench_service(i - node_count)).await.map(|_| ()) });
        }
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    eprintln!(
        "created {} Nodes and {} Services in {:.1} s",
        args.nodes,
        args.services,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// When a run counts as ready.
#[derive(Debug, Clone, Copy)]
enum Ready {
    /// Every Node untainted and every Service with an ingress.
    Initialized,
    /// One address refresh (a lookup per Node) done.
    Refreshed,
    /// Every shadow controller finished a full pass.
    Compared,
}

fn diff(after: &BTreeMap<String, u64>, before: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v.saturating_sub(before.get(k).copied().unwrap_or(0))))
        .filter(|(_, v)| *v > 0)
        .collect()
}

/// The manager's writes since `mark` by `verb resource[/subresource]` (the driver's and the
/// API server's own left out).
fn writes(log: &RequestLog, mark: u64) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for r in log.since(mark).iter().filter(|r| {
        r.is_write() && r.field_manager.as_deref() != Some(DRIVER) && r.user.as_deref() != Some("system:apiserver")
    }) {
        let mut key = format!("{} {}", r.verb, r.resource.as_deref().unwrap_or("?"));
        if let Some(sub) = &r.subresource {
            key = format!("{key}/{sub}");
        }
        *out.entry(key).or_insert(0) += 1;
    }
    out
}

/// A mark after which no write of a stopped manager can still appear: the log quiet for 3 s.
async fn quiet_mark(log: &RequestLog) -> u64 {
    let mut seen = log.mark();
    loop {
        tokio::time::sleep(Duration::from_secs(3)).await;
        let now = log.mark();
        if now == seen {
            return now;
        }
        seen = now;
    }
}

async fn initialized(client: &kube::Client, args: &Args) -> Result<bool, BoxError> {
    let nodes: Api<Node> = Api::all(client.clone());
    let tainted = nodes
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|n| {
            n.spec.as_ref().and_then(|s| s.taints.as_ref()).is_some_and(|ts| ts.iter().any(|t| t.key == UNINITIALIZED))
        })
        .count();
    if tainted > 0 {
        return Ok(false);
    }
    let services: Api<Service> = Api::namespaced(client.clone(), NAMESPACE);
    let served = services
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|s| {
            s.status
                .as_ref()
                .and_then(|s| s.load_balancer.as_ref())
                .and_then(|l| l.ingress.as_ref())
                .is_some_and(|i| !i.is_empty())
        })
        .count();
    Ok(served >= args.services)
}

/// Whether every shadow controller finished a full pass (by the metrics).
fn compared(metrics: &str) -> bool {
    let controllers: BTreeSet<String> = metric_by(metrics, DIFFERENCES, "controller").into_keys().collect();
    let passes = metric_by(metrics, PASSES, "controller");
    !controllers.is_empty() && controllers.iter().all(|c| passes.get(c).copied().unwrap_or(0) > 0)
}

async fn shadow_agrees(client: &kube::Client) -> Option<bool> {
    let api: Api<crds::CloudControllerManager> = Api::namespaced(client.clone(), "kube-system");
    let ccm = api.get(RESOURCE).await.ok()?;
    let c = ccm.status?.conditions.into_iter().find(|c| c.type_ == "ShadowAgrees")?;
    match c.status.as_str() {
        "True" => Some(true),
        "False" => Some(false),
        _ => None,
    }
}

async fn run_manager(
    args: &Args,
    client: &kube::Client,
    log: &RequestLog,
    work: &Path,
    label: &str,
    line: &str,
    ready: Ready,
) -> Result<Report, BoxError> {
    let mut report = Report { label: label.into(), ..Default::default() };
    let mark = quiet_mark(log).await;
    let started = Instant::now();
    // The line is complete but for the port; nothing else is substituted.
    let line = format!("{line} --secure-port={{port}}");
    let none = Path::new("");
    let mut manager = ManagerProcess::spawn(&line, "", none, none, &work.join(format!("{label}.log")))?;
    let deadline = started + Duration::from_secs(args.timeout_seconds);
    loop {
        manager.check_running()?;
        if Instant::now() > deadline {
            return Err(format!("{label}: not ready after {} s", args.timeout_seconds).into());
        }
        let metrics = manager.metrics().await;
        if matches!(ready, Ready::Compared) && report.agrees_secs.is_none() && shadow_agrees(client).await == Some(true)
        {
            report.agrees_secs = Some(started.elapsed().as_secs_f64());
        }
        let done = match ready {
            Ready::Initialized => initialized(client, args).await?,
            Ready::Refreshed => {
                metric_by(&metrics, CALLS, "method").get("instance_metadata").copied().unwrap_or(0)
                    + metric_by(&metrics, CALLS, "method").get("instances_metadata").copied().unwrap_or(0)
                    >= args.nodes as u64
            }
            Ready::Compared => compared(&metrics),
        };
        if done {
            break;
        }
        // Listing 5,000 Nodes is itself a load on the API server: poll those lists slowly.
        let pause = if matches!(ready, Ready::Initialized) { 5000 } else { 500 };
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
    report.ready_secs = started.elapsed().as_secs_f64();
    eprintln!("   ready after {:.1} s", report.ready_secs);
    let before = manager.metrics().await;
    let window_started = Instant::now();
    let window = Duration::from_secs(args.resync_seconds * args.window_resyncs);
    while window_started.elapsed() < window {
        manager.check_running()?;
        if matches!(ready, Ready::Compared) && report.agrees_secs.is_none() && shadow_agrees(client).await == Some(true)
        {
            report.agrees_secs = Some(started.elapsed().as_secs_f64());
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let after = manager.metrics().await;
    report.window_secs = window_started.elapsed().as_secs_f64();
    report.window_calls = diff(&metric_by(&after, CALLS, "method"), &metric_by(&before, CALLS, "method"));
    report.window_passes = diff(&metric_by(&after, PASSES, "controller"), &metric_by(&before, PASSES, "controller"));
    report.calls = metric_by(&after, CALLS, "method");
    report.refused = metric_by(&after, REFUSED, "method");
    report.differences = metric_by(&after, DIFFERENCES, "controller").values().sum();
    report.peak_rss_mib = manager.stop();
    drop(manager);
    // Writes the manager made, including those it flushed while stopping.
    let end = quiet_mark(log).await;
    report.writes = writes(log, mark);
    let _ = end;
    Ok(report)
}

fn join<V: std::fmt::Display>(m: &BTreeMap<String, V>) -> String {
    if m.is_empty() {
        return "none".into();
    }
    m.iter().map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join(", ")
}

fn print_table(args: &Args, reports: &[Report]) {
    println!(
        "\n{} Nodes, {} LoadBalancer Services, resync {} s, window {} resyncs\n",
        args.nodes, args.services, args.resync_seconds, args.window_resyncs
    );
    print!("| |");
    for r in reports {
        print!(" {} |", r.label);
    }
    println!();
    print!("|---|");
    for _ in reports {
        print!("---|");
    }
    println!();
    let row = |name: &str, f: &dyn Fn(&Report) -> String| {
        print!("| {name} |");
        for r in reports {
            print!(" {} |", f(r));
        }
        println!();
    };
    row("ready (initialized / first refresh / first full pass)", &|r| format!("{:.1} s", r.ready_secs));
    row("ShadowAgrees True", &|r| r.agrees_secs.map_or_else(|| "n/a".into(), |s| format!("{s:.1} s")));
    let keys: BTreeSet<&String> = reports.iter().flat_map(|r| r.writes.keys()).collect();
    for key in keys {
        row(&format!("API writes: {key}"), &|r| r.writes.get(key).copied().unwrap_or(0).to_string());
    }
    row("API writes to nodes and services (any subresource)", &|r| {
        r.writes
            .iter()
            .filter(|(k, _)| k.contains(" nodes") || k.contains(" services"))
            .map(|(_, v)| v)
            .sum::<usize>()
            .to_string()
    });
    row("cloud calls, whole run", &|r| join(&r.calls));
    row("mutating cloud calls, whole run", &|r| {
        MUTATING.iter().map(|m| r.calls.get(*m).copied().unwrap_or(0)).sum::<u64>().to_string()
    });
    row("cloud calls in the window", &|r| join(&r.window_calls));
    row("window", &|r| format!("{:.0} s", r.window_secs));
    let per = |r: &Report, methods: &[&str], objects: usize| {
        let calls: u64 = methods.iter().map(|m| r.window_calls.get(*m).copied().unwrap_or(0)).sum();
        let resyncs = r.window_secs / args.resync_seconds as f64;
        format!("{:.2}", calls as f64 / objects.max(1) as f64 / resyncs)
    };
    row("instance lookups per Node per resync (window)", &|r| {
        per(r, &["instance_metadata", "instances_metadata"], args.nodes)
    });
    row("get_load_balancer per Service per resync (window)", &|r| per(r, &["get_load_balancer"], args.services));
    row("ensure/update_load_balancer per Service per resync (window)", &|r| {
        per(r, &["ensure_load_balancer", "update_load_balancer"], args.services)
    });
    row("shadow full passes in the window", &|r| join(&r.window_passes));
    row("ccm_shadow_refused_calls_total by method", &|r| join(&r.refused));
    row("ccm_shadow_differences (sum)", &|r| r.differences.to_string());
    row("peak RSS", &|r| format!("{:.1} MiB", r.peak_rss_mib));
}
