//! bench-services: the service-lb-controller at scale, with the manager as its own process.
//!
//! For each configuration ("variant") the driver starts a fresh API server (the local test
//! server in-process, or with `--backend genuine` etcd and kube-apiserver from
//! `CCM_TEST_ASSETS`), creates Nodes and LoadBalancer Services, starts the manager command
//! line with the variant's extra flags, and measures: the time until every Service has an
//! ingress, the time until every load balancer has the new host set after one Node is added,
//! cloud calls (from the manager's `cloudprovider_api_requests_total`), API writes by verb and
//! resource (from the local request log or the kube-apiserver audit log), writes and cloud
//! calls during an idle window, and the manager's peak RSS. After the manager has stopped it
//! measures the API server's own limit for the same work: the manager's two writes per
//! Service (finalizer patch, status patch with an ingress) from a tight client with no cloud
//! latency, at the best of a few concurrencies.
//!
//! By default (`--create precreate`) the Nodes and Services exist before the manager starts
//! and the clock runs from the manager's start, so it measures the manager and not the
//! driver; `--create during` keeps the older mode (Services created while the manager runs,
//! clock from the first create). It knows nothing about the provider: the manager command line
//! is a parameter, with `{kubeconfig}`, `{port}` and `{cloud_config}` placeholders. A variant
//! whose flags start with the word `upstream` runs the upstream Go manager instead (its `bench`
//! provider at the same load-balancer latency, from `../shared/upstream` or `CCM_UPSTREAM`),
//! so ours and upstream's interleave on the same server in one run.
//!
//! ```sh
//! cargo build --release -p cloud-controller-manager --bin cloud-controller-manager
//! cargo test --workspace --no-run                       # builds target/debug/bench-services
//! CCM_TEST_ASSETS=/tmp/ccm-assets target/debug/bench-services --backend genuine
//! ```

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ccm_framework::cache::{Cache, Change};
use clap::Parser;
use e2e::bench::{self, BackendArg, BoxError, ManagerProcess, create_all, has_ingress, metric_by};
use k8s_openapi::api::core::v1::{Namespace, Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use testkit::genuine::ControlPlane;
use testkit::{NodeFixture, RequestLog, TestApiServer};

/// Field manager of everything the driver writes; other writes are the manager's.
const DRIVER: &str = "bench-services";
/// The manager's gauge of events waiting to be written.
const EVENTS_PENDING: &str = "ccm_events_pending";
/// Field manager of the driver's limit measurement (after the manager has stopped).
const LIMIT: &str = "bench-services-limit";

const DEFAULT_MANAGER: &str = "target/release/cloud-controller-manager --cloud-provider=fake \
--cloud-config={cloud_config} --kubeconfig={kubeconfig} --leader-elect=false --bind-address=127.0.0.1 \
--secure-port={port} --authorization-always-allow-paths=/healthz,/metrics --controllers=service-lb-controller";

/// The three configurations of the issue. Ours name `--concurrent-service-syncs` explicitly (at
/// the framework's default) so the numbers do not depend on the flag's compiled default.
fn default_variants() -> Vec<String> {
    let ours = crds::defaults::CONCURRENT_SERVICE_SYNCS as usize;
    vec![
        format!("ours-no-client-limit=--concurrent-service-syncs={ours} --kube-api-qps=0"),
        format!("ours-20qps=--concurrent-service-syncs={ours} --kube-api-qps=20 --kube-api-burst=30"),
        "upstream-equivalent=--concurrent-service-syncs=1 --kube-api-qps=20 --kube-api-burst=30".to_string(),
    ]
}

/// Upstream's flags before a variant's own: the same single controller, no leader election.
const UPSTREAM_FLAGS: &str = "--controllers=service-lb-controller --leader-elect=false";
/// Upstream's default `--concurrent-service-syncs`.
const UPSTREAM_SERVICE_SYNCS: usize = 1;

/// Command line.
#[derive(Debug, Parser)]
#[command(name = "bench-services", about = "Benchmark the service-lb-controller with the manager as its own process")]
struct Args {
    /// Cluster to run against; without it, `--backend` picks a fresh server per variant.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Without `--kubeconfig`, the API server each variant starts: `genuine` (etcd +
    /// kube-apiserver from `CCM_TEST_ASSETS`, writes counted from its audit log) or `local`.
    #[arg(long, value_enum, default_value_t = BackendArg::Local)]
    backend: BackendArg,
    /// When the Services are created: `precreate` (before the manager starts; the clock runs
    /// from the manager's start) or `during` (while it runs; the clock runs from the first
    /// create, so it also measures the driver).
    #[arg(long, value_enum, default_value_t = CreateMode::Precreate)]
    create: CreateMode,
    /// Create requests the driver keeps in flight.
    #[arg(long, default_value_t = 16)]
    create_concurrency: usize,
    /// LoadBalancer Services to create.
    #[arg(long, default_value_t = 1000)]
    services: usize,
    /// Create the Services with `allocateLoadBalancerNodePorts: false`: the default node-port
    /// range (30000-32767) holds 2,768 ports, fewer than the 10,000 Services of the scale run.
    #[arg(long)]
    no_node_ports: bool,
    /// Nodes to create before the manager starts.
    #[arg(long, default_value_t = 200)]
    nodes: usize,
    /// Latency of every load-balancer call, written into the fake's cloud-config.
    #[arg(long, default_value = "50ms")]
    lb_latency: String,
    /// Length of the idle window, in seconds.
    #[arg(long, default_value_t = 60)]
    idle_seconds: u64,
    /// Skip measuring the API server's own limit for the same writes.
    #[arg(long)]
    no_limit: bool,
    /// Manager command line; `{kubeconfig}`, `{port}` and `{cloud_config}` are substituted.
    #[arg(long, default_value = DEFAULT_MANAGER)]
    manager: String,
    /// `NAME=EXTRA FLAGS` appended to the manager command line, or `NAME=upstream FLAGS` for the
    /// upstream Go manager with those flags; repeatable, run in the order given.
    #[arg(long = "variant")]
    variants: Vec<String>,
    /// Where the cloud-config and manager logs go (default: a fresh directory under /tmp).
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// Give up on a phase after this many seconds.
    #[arg(long, default_value_t = 600)]
    timeout_seconds: u64,
    /// Give every Node a `spec.podCIDR` (`10.<i/256>.<i%256>.0/24`, inside `--cluster-cidr=10.0.0.0/8`)
    /// for the route controller; after the idle window, time one more Node's route (the
    /// manager's `create_route` count rising, and its `NetworkUnavailable` False).
    #[arg(long)]
    pod_cidrs: bool,
    /// Objects as real clusters have them (issue 50): Nodes shaped like the real cluster's
    /// kubelet Node (`e2e::realistic`), Services as `kubectl apply` of a chart leaves them, and
    /// one EndpointSlice of three Pods per Service, created right after the Services. The
    /// objects' sizes are printed.
    #[arg(long)]
    realistic: bool,
}

/// How the driver's objects look.
#[derive(Clone, Copy, Debug)]
struct Shape {
    pod_cidrs: bool,
    realistic: bool,
}

/// When the driver creates the Services.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum CreateMode {
    Precreate,
    During,
}

/// What one variant measured.
#[derive(Debug, Default)]
struct Report {
    name: String,
    backend: &'static str,
    /// Sync workers of the variant (its `--concurrent-service-syncs`), for the cloud bound.
    workers: usize,
    create_nodes_secs: f64,
    create_secs: f64,
    ingress_secs: f64,
    first_ingress_secs: f64,
    hosts_secs: f64,
    host_updates: u64,
    updates_after_unrelated_change: u64,
    calls_ingress: BTreeMap<String, u64>,
    calls_hosts: BTreeMap<String, u64>,
    /// Manager writes by `verb resource[/subresource]` until the backlog drained.
    writes: Option<BTreeMap<String, usize>>,
    /// Manager writes by the time every Service had its ingress.
    writes_at_ingress: Option<BTreeMap<String, usize>>,
    quiet_after_secs: f64,
    idle_writes: Option<usize>,
    idle_calls: u64,
    idle_writes_by: Option<BTreeMap<String, usize>>,
    idle_calls_by: BTreeMap<String, u64>,
    peak_rss_mib: f64,
    /// Event-related counters the manager exposes (e.g. dropped events), if any.
    event_metrics: BTreeMap<String, u64>,
    /// The API server's limit for the same writes: seconds and the concurrency that gave it.
    limit: Option<(f64, usize)>,
    /// CPU seconds from the manager's start to the last ingress: the manager, the API server
    /// with etcd (genuine backend only), and this driver.
    cpu_ingress: Option<(f64, Option<f64>, f64)>,
    /// The manager's CPU seconds for the added Node.
    cpu_hosts: f64,
    /// Every manager request in the idle window (reads too) by `verb resource[/subresource]`.
    idle_requests_by: Option<BTreeMap<String, usize>>,
    /// With `--pod-cidrs`: seconds from creating a Node to the manager's `create_route` count
    /// rising, and to its `NetworkUnavailable` False.
    join_route_secs: Option<(f64, f64)>,
    /// Why the variant stopped early, if it did.
    failed: Option<String>,
}

fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(std::env::var("RUST_LOG").unwrap_or_else(|_| {
            // The client builder logs every failed probe while a control plane starts.
            "warn,kube_client::client::builder=off".into()
        }))
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(run(args))
}

async fn run(args: Args) -> Result<(), BoxError> {
    let work = match &args.work_dir {
        Some(d) => d.clone(),
        None => std::env::temp_dir().join(format!("bench-services-{}", std::process::id())),
    };
    std::fs::create_dir_all(&work)?;
    let cloud_config = work.join("fake-cloud-config.yaml");
    std::fs::write(&cloud_config, format!("autoInstances: true\nloadBalancerLatency: {}\n", args.lb_latency))?;
    let variants: Vec<String> = if args.variants.is_empty() { default_variants() } else { args.variants.clone() };
    let mut reports = Vec::new();
    for (i, v) in variants.iter().enumerate() {
        let (name, extra) = v.split_once('=').unwrap_or((v.as_str(), ""));
        eprintln!("== {name}: {extra}");
        let mut report = Report {
            name: name.to_string(),
            workers: workers(extra),
            backend: args.backend.label(args.kubeconfig.as_deref()),
            ..Default::default()
        };
        // A failed phase ends the variant, not the run; its processes stop as it returns.
        if let Err(e) = run_variant(&args, &work, &cloud_config, i, extra, &mut report).await {
            eprintln!("{name} failed: {e}");
            report.failed = Some(e.to_string());
        }
        eprintln!("{report:#?}");
        reports.push(report);
    }
    print_table(&args, &reports);
    eprintln!("manager logs: {}", work.display());
    Ok(())
}

/// The sync workers a variant's flags ask for (the default of ours or upstream's when not given).
fn workers(extra: &str) -> usize {
    let default = match bench::upstream_flags(extra) {
        Some(_) => UPSTREAM_SERVICE_SYNCS,
        None => crds::defaults::CONCURRENT_SERVICE_SYNCS as usize,
    };
    extra
        .split_whitespace()
        .find_map(|w| w.strip_prefix("--concurrent-service-syncs=").and_then(|v| v.parse().ok()))
        .unwrap_or(default)
}

/// A duration such as `50ms` or `1s`, in seconds.
fn seconds_of(text: &str) -> Option<f64> {
    if let Some(ms) = text.strip_suffix("ms") {
        return ms.parse::<f64>().ok().map(|v| v / 1000.0);
    }
    text.strip_suffix('s').and_then(|s| s.parse().ok())
}

/// The cluster of one variant: a fresh local or genuine server, or a namespace on the given
/// cluster. Dropping it stops the processes it started.
struct Cluster {
    _server: Option<TestApiServer>,
    _plane: Option<ControlPlane>,
    /// Keeps the control plane's thread (and so its processes) alive.
    _keep: Option<std::sync::mpsc::Sender<()>>,
    /// The request log (local) or audit log (genuine); none on an external cluster.
    log: Option<RequestLog>,
    client: kube::Client,
    kubeconfig: PathBuf,
    namespace: String,
    node_prefix: String,
    /// kube-apiserver and etcd of a genuine backend, for their CPU time.
    server_pids: Vec<u32>,
}

/// CPU seconds of `pids` so far, summed (a process that is gone counts 0).
fn cpu_of(pids: &[u32]) -> f64 {
    pids.iter().filter_map(|p| bench::proc_cpu_secs(*p)).sum()
}

async fn cluster(args: &Args, index: usize) -> Result<Cluster, BoxError> {
    match &args.kubeconfig {
        None if args.backend == BackendArg::Genuine => {
            let assets = testkit::genuine::assets_dir().ok_or("--backend genuine needs CCM_TEST_ASSETS")?;
            let (plane, keep) = tokio::task::block_in_place(|| ControlPlane::start_on_own_thread(assets))?;
            Ok(Cluster {
                client: plane.admin_client().await?,
                kubeconfig: plane.admin_kubeconfig_path(),
                log: Some(plane.request_log()),
                server_pids: plane.pids().to_vec(),
                _plane: Some(plane),
                _keep: Some(keep),
                _server: None,
                namespace: "bench".into(),
                node_prefix: "bench-node".into(),
            })
        }
        None => {
            let server = TestApiServer::builder().request_log_capacity(1_000_000).start().await?;
            Ok(Cluster {
                client: server.client(),
                kubeconfig: server.kubeconfig_path().to_path_buf(),
                log: Some(server.request_log()),
                _plane: None,
                _keep: None,
                _server: Some(server),
                namespace: "bench".into(),
                node_prefix: "bench-node".into(),
                server_pids: Vec::new(),
            })
        }
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)?;
            let config = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
            Ok(Cluster {
                client: kube::Client::try_from(config)?,
                kubeconfig: path.clone(),
                log: None,
                _plane: None,
                _keep: None,
                _server: None,
                namespace: format!("bench-services-{}-{index}", std::process::id()),
                node_prefix: format!("bench-{}-{index}", std::process::id()),
                server_pids: Vec::new(),
            })
        }
    }
}

fn post() -> PostParams {
    PostParams { field_manager: Some(DRIVER.into()), ..Default::default() }
}

/// A Node as a kubelet registers it once running: with its providerID and Ready (so the
/// lifecycle controller, when enabled, has no reason to ask the cloud about it).
fn node(name: &str) -> Node {
    testkit::node(name).with_provider_id(&format!("fake://{name}")).ready()
}

/// [`node`] (the kubelet's shape when `realistic`), with `spec.podCIDR`
/// `10.<i/256>.<i%256>.0/24` when `pod_cidrs`.
fn node_at(name: &str, i: usize, shape: Shape) -> Node {
    let mut n = if shape.realistic {
        // The fixture is parsed once at start (`print_sizes`), so it parses here too.
        e2e::realistic::initialized_node(name, i, &format!("fake://{name}")).unwrap_or_else(|_| node(name))
    } else {
        node(name)
    };
    if shape.pod_cidrs {
        n.spec.get_or_insert_default().pod_cidr = Some(format!("10.{}.{}.0/24", (i / 256) % 256, i % 256));
    }
    n
}

/// Whether `node` has `NetworkUnavailable` False.
fn network_available(node: &Node) -> bool {
    let conditions = node.status.as_ref().and_then(|s| s.conditions.as_ref());
    conditions.is_some_and(|c| c.iter().any(|c| c.type_ == "NetworkUnavailable" && c.status == "False"))
}

/// A LoadBalancer Service; without node ports when `node_ports` is false; as a chart's when
/// `realistic`.
fn service(ns: &str, name: &str, node_ports: bool, realistic: bool) -> Service {
    let mut service = testkit::lb_service(ns, name);
    if let Some(spec) = service.spec.as_mut() {
        spec.allocate_load_balancer_node_ports = (!node_ports).then_some(false);
    }
    if realistic {
        // Serializing a Service cannot fail; the plain one is the fallback all the same.
        return e2e::realistic::service(service.clone()).unwrap_or(service);
    }
    service
}

/// Print the sizes of the objects a run sends (and check the realistic fixture parses).
fn print_sizes(shape: Shape, node_ports: bool) -> Result<(), BoxError> {
    let node = if shape.realistic { e2e::realistic::initialized_node("n", 0, "fake://n")? } else { node("n") };
    let svc = service("bench", "svc-0", node_ports, shape.realistic);
    let slice = shape.realistic.then(|| e2e::realistic::endpoint_slice(&svc, 0, &["n".to_string()]));
    eprintln!(
        "objects as sent ({}): Node {} bytes of JSON, Service {} bytes{}",
        if shape.realistic { "realistic" } else { "minimal" },
        e2e::realistic::json_bytes(&node),
        e2e::realistic::json_bytes(&svc),
        slice
            .map(|s| format!(
                ", EndpointSlice {} bytes ({} endpoints)",
                e2e::realistic::json_bytes(&s),
                s.endpoints.len()
            ))
            .unwrap_or_default()
    );
    Ok(())
}

fn metric_total(text: &str, metric: &str) -> u64 {
    metric_by(text, metric, "").values().sum()
}

/// Every sample whose metric name mentions events (for example a dropped-events counter),
/// summed by name.
fn event_metrics(text: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let name = line.split(['{', ' ']).next().unwrap_or_default();
        if !name.starts_with("ccm_events") {
            continue;
        }
        if let Some(v) = line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) {
            *out.entry(name.to_string()).or_insert(0) += v as u64;
        }
    }
    out
}

fn diff(after: &BTreeMap<String, u64>, before: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    after.iter().map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0))).filter(|(_, v)| *v > 0).collect()
}

/// Manager writes since `mark` by `verb resource[/subresource]`, from the request or audit
/// log; `None` on an external cluster. The driver's writes and the genuine server's own are
/// left out.
fn manager_writes(log: Option<&RequestLog>, since: u64) -> Option<BTreeMap<String, usize>> {
    let mut out = BTreeMap::new();
    for r in log?.since(since).iter().filter(|r| {
        r.is_write()
            && !matches!(r.field_manager.as_deref(), Some(DRIVER | LIMIT))
            && r.user.as_deref() != Some("system:apiserver")
    }) {
        let mut key = format!("{} {}", r.verb, r.resource.as_deref().unwrap_or("?"));
        if let Some(sub) = &r.subresource {
            key = format!("{key}/{sub}");
        }
        *out.entry(key).or_insert(0) += 1;
    }
    Some(out)
}

/// Every manager request since `mark` (reads too) by `verb resource[/subresource]`: the
/// driver's writes, its Service watch in `namespace`, the server's own requests and the genuine
/// backend's kube-controller-manager (same user, its own user agent) left out.
fn manager_requests(log: Option<&RequestLog>, since: u64, namespace: &str) -> Option<BTreeMap<String, usize>> {
    let mut out = BTreeMap::new();
    for r in log?.since(since).iter().filter(|r| {
        !matches!(r.field_manager.as_deref(), Some(DRIVER | LIMIT))
            && r.user.as_deref() != Some("system:apiserver")
            && !r.user_agent.starts_with("kube-controller-manager")
            && !(r.resource.as_deref() == Some("services") && r.namespace.as_deref() == Some(namespace))
    }) {
        let sub = r.subresource.as_ref().map(|s| format!("/{s}")).unwrap_or_default();
        *out.entry(format!("{} {}{sub}", r.verb, r.resource.as_deref().unwrap_or(r.path.as_str()))).or_insert(0) += 1;
    }
    Some(out)
}

fn log_mark(log: Option<&RequestLog>) -> u64 {
    log.map(RequestLog::mark).unwrap_or(0)
}

/// Writes other than Lease renewals, which go on every few seconds with leader election on.
fn total_without_leases(w: &Option<BTreeMap<String, usize>>) -> Option<usize> {
    w.as_ref().map(|w| w.iter().filter(|(k, _)| !k.contains("leases")).map(|(_, v)| v).sum())
}

/// Wait until every Service in `cache` has an ingress. The whole cache is scanned only at the
/// start, after a resync and when no change came for 500 ms; otherwise each change is looked
/// at alone. (Scanning 10,000 Services per change cost this driver 10.8 CPU seconds of the
/// 26.7 s a 10,000-Service run took: CPU the API server on the same two cores went without.)
async fn wait_for_ingresses(
    cache: &Cache<Service>,
    changes: &mut ccm_framework::cache::Subscription<Service>,
    manager: &mut ManagerProcess,
    count: usize,
    timeout: Duration,
) -> Result<f64, BoxError> {
    let started = Instant::now();
    let mut first = None;
    let mut ready: HashSet<String> = HashSet::new();
    let deadline = Instant::now() + timeout;
    let mut rescan = true;
    loop {
        if rescan {
            for s in cache.state() {
                if has_ingress(&s) {
                    ready.insert(s.metadata.name.clone().unwrap_or_default());
                }
            }
            rescan = false;
        }
        if first.is_none() && !ready.is_empty() {
            first = Some(started.elapsed().as_secs_f64());
        }
        if ready.len() >= count {
            return Ok(first.unwrap_or_else(|| started.elapsed().as_secs_f64()));
        }
        manager.check_running()?;
        if Instant::now() > deadline {
            return Err(format!("only {} of {count} Services got an ingress", ready.len()).into());
        }
        match tokio::time::timeout(Duration::from_millis(500), changes.recv()).await {
            Ok(Some(Change::Applied { new, .. })) => {
                if has_ingress(&new) {
                    ready.insert(new.metadata.name.clone().unwrap_or_default());
                }
            }
            Ok(Some(_)) | Err(_) => rescan = true,
            Ok(None) => return Err("the Service watch stopped".into()),
        }
    }
}

async fn run_variant(
    args: &Args,
    work: &Path,
    cloud_config: &Path,
    index: usize,
    extra: &str,
    report: &mut Report,
) -> Result<(), BoxError> {
    let timeout = Duration::from_secs(args.timeout_seconds);
    let c = cluster(args, index).await?;
    let control = c.log.as_ref();
    let ns_api: Api<Namespace> = Api::all(c.client.clone());
    let ns = Namespace {
        metadata: ObjectMeta { name: Some(c.namespace.clone()), ..Default::default() },
        ..Default::default()
    };
    if let Err(e) = ns_api.create(&post(), &ns).await {
        eprintln!("namespace {}: {e}", c.namespace);
    }
    let nodes: Api<Node> = Api::all(c.client.clone());
    let prefix = c.node_prefix.clone();
    let shape = Shape { pod_cidrs: args.pod_cidrs, realistic: args.realistic };
    print_sizes(shape, !args.no_node_ports)?;
    report.create_nodes_secs = create_all(&nodes, DRIVER, args.nodes, args.create_concurrency, |i| {
        node_at(&format!("{prefix}-{i}"), i, shape)
    })
    .await?;
    let services: Api<Service> = Api::namespaced(c.client.clone(), &c.namespace);
    let ns_name = c.namespace.clone();
    let node_ports = !args.no_node_ports;
    let realistic = args.realistic;
    let make_service = move |i: usize| service(&ns_name, &format!("svc-{i}"), node_ports, realistic);
    let slices: Api<EndpointSlice> = Api::namespaced(c.client.clone(), &c.namespace);
    let slice_nodes: Vec<String> = (0..args.nodes.min(100)).map(|i| format!("{prefix}-{i}")).collect();
    let make_slice = {
        let make_service = make_service.clone();
        move |i: usize| e2e::realistic::endpoint_slice(&make_service(i), i, &slice_nodes)
    };
    if args.create == CreateMode::Precreate {
        report.create_secs =
            create_all(&services, DRIVER, args.services, args.create_concurrency, make_service.clone()).await?;
        if realistic {
            report.create_secs +=
                create_all(&slices, DRIVER, args.services, args.create_concurrency, make_slice.clone()).await?;
        }
        eprintln!(
            "   driver: {} Nodes in {:.2} s, {} Services in {:.2} s ({} in flight)",
            args.nodes, report.create_nodes_secs, args.services, report.create_secs, args.create_concurrency
        );
    }

    // Watch our Services through the framework's cache (one watch, change stream).
    let (cache, writer) = Cache::<Service>::new();
    let watch_guard = bench::watch(services.clone(), writer);
    cache.wait_until_ready().await;
    let mut changes = cache.subscribe();

    let log = work.join(format!("manager-{index}-{}.log", report.name));
    let mark = log_mark(control);
    let mut manager = match bench::upstream_flags(extra) {
        Some(flags) => ManagerProcess::spawn_upstream(
            &format!("{UPSTREAM_FLAGS} {flags}"),
            &c.kubeconfig,
            &[("BENCH_LB_LATENCY".into(), args.lb_latency.clone())],
            &log,
        )?,
        None => ManagerProcess::spawn(&args.manager, extra, &c.kubeconfig, cloud_config, &log)?,
    };
    let driver = [std::process::id()];
    let cpu0 = (cpu_of(&[manager.pid()]), cpu_of(&c.server_pids), cpu_of(&driver));
    // Phase 1: every Service gets an ingress. Precreated: the clock runs from the manager's
    // start. During: from the first create, once the manager is healthy.
    let (started, calls0) = match args.create {
        CreateMode::Precreate => (Instant::now(), BTreeMap::new()),
        CreateMode::During => {
            manager.wait_healthy(Duration::from_secs(30)).await?;
            let calls0 = metric_by(&manager.metrics().await, "cloudprovider_api_requests_total", "method");
            let started = Instant::now();
            report.create_secs =
                create_all(&services, DRIVER, args.services, args.create_concurrency, make_service).await?;
            if realistic {
                report.create_secs +=
                    create_all(&slices, DRIVER, args.services, args.create_concurrency, make_slice).await?;
            }
            (started, calls0)
        }
    };
    let wait_started = Instant::now();
    let first_after = wait_for_ingresses(&cache, &mut changes, &mut manager, args.services, timeout).await?;
    report.ingress_secs = started.elapsed().as_secs_f64();
    report.first_ingress_secs = (wait_started - started).as_secs_f64() + first_after;
    report.writes_at_ingress = manager_writes(control, mark);
    report.cpu_ingress = Some((
        cpu_of(&[manager.pid()]) - cpu0.0,
        (!c.server_pids.is_empty()).then(|| cpu_of(&c.server_pids) - cpu0.1),
        cpu_of(&driver) - cpu0.2,
    ));
    eprintln!("   every ingress after {:.2} s", report.ingress_secs);
    manager.wait_healthy(Duration::from_secs(30)).await?;
    let calls1 = metric_by(&manager.metrics().await, "cloudprovider_api_requests_total", "method");
    report.calls_ingress = diff(&calls1, &calls0);

    // Phase 2: one Node that changes nothing for the load balancers, then one that does.
    let updates = |m: &str| metric_total(m, "service_controller_update_loadbalancer_host_latency_seconds_count");
    let before_unrelated = updates(&manager.metrics().await);
    nodes
        .create(&post(), &{
            let mut n = node_at(&format!("{}-excluded", c.node_prefix), args.nodes, shape);
            n.metadata.labels = Some(BTreeMap::from([(
                "node.kubernetes.io/exclude-from-external-load-balancers".into(),
                "true".into(),
            )]));
            n
        })
        .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    report.updates_after_unrelated_change = updates(&manager.metrics().await) - before_unrelated;
    let before = updates(&manager.metrics().await);
    let cpu_before = cpu_of(&[manager.pid()]);
    let started = Instant::now();
    nodes.create(&post(), &node_at(&format!("{}-added", c.node_prefix), args.nodes + 1, shape)).await?;
    let deadline = Instant::now() + timeout;
    report.host_updates = loop {
        let done = updates(&manager.metrics().await) - before;
        if done >= args.services as u64 {
            break done;
        }
        manager.check_running()?;
        if Instant::now() > deadline {
            return Err(format!("only {done} of {} load balancers got the new host", args.services).into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    report.hosts_secs = started.elapsed().as_secs_f64();
    report.cpu_hosts = cpu_of(&[manager.pid()]) - cpu_before;
    eprintln!("   every LB has the added Node after {:.2} s", report.hosts_secs);
    let calls2 = metric_by(&manager.metrics().await, "cloudprovider_api_requests_total", "method");
    report.calls_hosts = diff(&calls2, &calls1);

    // Phase 3: wait for the backlog to drain: the manager's event queue empty
    // (`ccm_events_pending`, when it exposes the gauge) and its writes (from the log) and
    // cloud calls unchanged for 5 s; then the idle window.
    let quiet_started = Instant::now();
    let mut last = (total_without_leases(&manager_writes(control, mark)), calls2.clone());
    let mut quiet_since = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let metrics = manager.metrics().await;
        let pending = metric_by(&metrics, EVENTS_PENDING, "").values().sum::<u64>();
        let now = (
            total_without_leases(&manager_writes(control, mark)),
            metric_by(&metrics, "cloudprovider_api_requests_total", "method"),
        );
        if now != last || pending > 0 {
            quiet_since = Instant::now();
            last = now;
        }
        if quiet_since.elapsed() >= Duration::from_secs(5) {
            break;
        }
        if quiet_started.elapsed() > timeout {
            return Err(format!("the manager did not settle ({pending} events pending)").into());
        }
    }
    report.quiet_after_secs = (quiet_started.elapsed().as_secs_f64() - 5.0).max(0.0);
    // Everything phases 1 and 2 caused, including events written in the background.
    report.writes = manager_writes(control, mark);
    let idle_mark = log_mark(control);
    let idle_calls0 = metric_by(&manager.metrics().await, "cloudprovider_api_requests_total", "method");
    tokio::time::sleep(Duration::from_secs(args.idle_seconds)).await;
    report.idle_writes_by = manager_writes(control, idle_mark);
    report.idle_writes = total_without_leases(&report.idle_writes_by);
    let metrics = manager.metrics().await;
    report.idle_calls_by = diff(&metric_by(&metrics, "cloudprovider_api_requests_total", "method"), &idle_calls0);
    report.idle_calls = report.idle_calls_by.values().sum();
    report.idle_requests_by = manager_requests(control, idle_mark, &c.namespace);
    report.event_metrics = event_metrics(&metrics);
    if shape.pod_cidrs {
        // One Node joins: time its route (polled every 20 ms).
        let routes = |m: &str| metric_by(m, "cloudprovider_api_requests_total", "method").get("create_route").copied();
        let before = routes(&metrics).unwrap_or(0);
        let name = format!("{}-joined", c.node_prefix);
        let started = Instant::now();
        nodes.create(&post(), &node_at(&name, args.nodes + 2, Shape { pod_cidrs: true, ..shape })).await?;
        let (mut created, deadline) = (None, started + timeout);
        let condition = loop {
            if created.is_none() && routes(&manager.metrics().await).unwrap_or(0) > before {
                created = Some(started.elapsed().as_secs_f64());
            }
            if created.is_some() && network_available(&nodes.get(&name).await?) {
                break started.elapsed().as_secs_f64();
            }
            manager.check_running()?;
            if Instant::now() > deadline {
                return Err("the joined Node got no route".into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        report.join_route_secs = created.map(|r| (r, condition));
    }
    report.peak_rss_mib = manager.stop();
    drop(manager);
    // As in bench-nodes, the limit runs with no watch of the driver's open.
    drop(watch_guard);

    // Phase 4: the API server's own limit for the manager's writes, nothing else running.
    if !args.no_limit {
        // The API server's own limit for the manager's work: the two writes it makes per
        // Service (a strategic-merge patch adding a finalizer, a merge patch of the status with
        // an ingress) from a tight client with no cloud latency. Each round writes a new
        // finalizer and address so no patch is a no-op.
        report.limit = Some(
            bench::measure_limit("Services", args.services, |round, i| {
                let api = services.clone();
                async move {
                    let name = format!("svc-{i}");
                    let pp = PatchParams { field_manager: Some(LIMIT.into()), ..Default::default() };
                    let finalizer =
                        serde_json::json!({"metadata": {"finalizers": [format!("bench.ccm.rs/limit-{round}")]}});
                    api.patch(&name, &pp, &Patch::Strategic(finalizer)).await?;
                    let ip = format!("10.{}.{}.{}", 200 + round, i / 256, i % 256);
                    let status = serde_json::json!({"status": {"loadBalancer": {"ingress": [{"ip": ip}]}}});
                    api.patch_status(&name, &pp, &Patch::Merge(status)).await?;
                    Ok(())
                }
            })
            .await?,
        );
    }
    if args.kubeconfig.is_some() {
        let _ = ns_api.delete(&c.namespace, &DeleteParams::default()).await;
        let lp = ListParams::default();
        for n in nodes.list(&lp).await?.items {
            let name = n.metadata.name.unwrap_or_default();
            if name.starts_with(&c.node_prefix) {
                let _ = nodes.delete(&name, &DeleteParams::default()).await;
            }
        }
    }
    Ok(())
}

fn calls(m: &BTreeMap<String, u64>) -> String {
    if m.is_empty() {
        return "0".into();
    }
    m.iter().map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join(", ")
}

fn opt(v: Option<usize>) -> String {
    v.map_or_else(|| "n/a".to_string(), |v| v.to_string())
}

fn print_table(args: &Args, reports: &[Report]) {
    let latency = seconds_of(&args.lb_latency);
    let mode = match args.create {
        CreateMode::Precreate => "created before the manager starts; clocks from the manager's start",
        CreateMode::During => "created during the run; clock from the first create",
    };
    println!(
        "\n{} LoadBalancer Services and {} Nodes ({mode}), load-balancer latency {}, idle window {} s\n",
        args.services, args.nodes, args.lb_latency, args.idle_seconds
    );
    print!("| | source |");
    for r in reports {
        print!(" {} |", r.name);
    }
    println!();
    print!("|---|---|");
    for _ in reports {
        print!("---|");
    }
    println!();
    let row = |label: &str, source: &str, f: &dyn Fn(&Report) -> String| {
        print!("| {label} | {source} |");
        for r in reports {
            print!(" {} |", f(r));
        }
        println!();
    };
    let server = |r: &Report| r.backend;
    row("API server (backend)", "", &|r| server(r).to_string());
    row("failed", "", &|r| r.failed.clone().unwrap_or_else(|| "no".into()));
    row("driver: creating the Nodes", "driver on backend", &|r| format!("{:.2} s", r.create_nodes_secs));
    row("driver: creating the Services", "driver on backend", &|r| format!("{:.2} s", r.create_secs));
    row("first Service has an ingress", "driver's watch", &|r| format!("{:.2} s", r.first_ingress_secs));
    row("every Service has an ingress", "driver's watch", &|r| format!("{:.2} s", r.ingress_secs));
    row("API server limit, same 2 writes per Service", "driver, after the run", &|r| {
        r.limit.map_or_else(|| "n/a".into(), |(s, c)| format!("{s:.2} s (concurrency {c})"))
    });
    row("ingress time / API server limit", "", &|r| {
        r.limit.map_or_else(|| "n/a".into(), |(s, _)| format!("{:.2}", r.ingress_secs / s))
    });
    row("cloud-latency bound (Services x latency / workers)", "computed", &|r| {
        latency.map_or_else(|| "n/a".into(), |l| format!("{:.2} s", args.services as f64 * l / r.workers as f64))
    });
    row("ingress time / the larger bound", "", &|r| match (latency, r.limit) {
        (Some(l), Some((s, _))) => {
            format!("{:.2}", r.ingress_secs / (args.services as f64 * l / r.workers as f64).max(s))
        }
        _ => "n/a".into(),
    });
    row("CPU until every ingress: manager / API server + etcd / driver", "/proc", &|r| match r.cpu_ingress {
        Some((m, s, d)) => format!("{m:.1} / {} / {d:.1} s", s.map_or_else(|| "n/a".into(), |s| format!("{s:.1}"))),
        None => "n/a".into(),
    });
    row("cores busy until every ingress (of 2)", "/proc", &|r| match r.cpu_ingress {
        Some((m, s, d)) if r.ingress_secs > 0.0 => format!("{:.2}", (m + s.unwrap_or(0.0) + d) / r.ingress_secs),
        _ => "n/a".into(),
    });
    row("every LB has the added Node", "manager metrics", &|r| format!("{:.2} s", r.hosts_secs));
    row("manager CPU for the added Node", "/proc", &|r| format!("{:.1} s", r.cpu_hosts));
    row("cloud calls until ingress", "manager metrics", &|r| calls(&r.calls_ingress));
    row("cloud calls for the added Node", "manager metrics", &|r| calls(&r.calls_hosts));
    row("host updates for the added Node", "manager metrics", &|r| r.host_updates.to_string());
    row("host updates for an excluded Node", "manager metrics", &|r| r.updates_after_unrelated_change.to_string());
    let log = |r: &Report| if r.backend == "genuine" { "audit log" } else { "request log" };
    let keys: BTreeSet<&String> = reports.iter().filter_map(|r| r.writes.as_ref()).flat_map(|w| w.keys()).collect();
    let source = reports.first().map(log).unwrap_or("log");
    for key in keys {
        row(&format!("API writes: {key}"), source, &|r| {
            r.writes.as_ref().map_or_else(|| "n/a".into(), |w| w.get(key).copied().unwrap_or(0).to_string())
        });
    }
    row("API writes when the last ingress came: Services / events", source, &|r| {
        r.writes_at_ingress.as_ref().map_or_else(
            || "n/a".into(),
            |w| {
                let of = |p: &str| w.iter().filter(|(k, _)| k.contains(p)).map(|(_, v)| v).sum::<usize>();
                format!("{} / {}", of(" services"), of(" events"))
            },
        )
    });
    row("quiet (events drained) after", source, &|r| format!("{:.1} s", r.quiet_after_secs));
    row("idle: API writes, Lease renewals aside", source, &|r| opt(r.idle_writes));
    row("idle: cloud calls", "manager metrics", &|r| r.idle_calls.to_string());
    row("idle: API writes by verb and resource", source, &|r| match &r.idle_writes_by {
        Some(w) if !w.is_empty() => w.iter().map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join(", "),
        Some(_) => "none".to_string(),
        None => "n/a".to_string(),
    });
    row("idle: API requests (reads too) by verb and resource", source, &|r| match &r.idle_requests_by {
        Some(w) if !w.is_empty() => w.iter().map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join(", "),
        Some(_) => "none".to_string(),
        None => "n/a".to_string(),
    });
    row("a Node joins: create_route called / NetworkUnavailable False", "manager metrics, driver", &|r| {
        r.join_route_secs.map_or_else(|| "n/a".into(), |(a, b)| format!("{a:.2} s / {b:.2} s"))
    });
    row("idle: cloud calls by method", "manager metrics", &|r| {
        let calls: Vec<_> = r.idle_calls_by.iter().filter(|(_, v)| **v > 0).map(|(k, v)| format!("{k} {v}")).collect();
        if calls.is_empty() { "none".to_string() } else { calls.join(", ") }
    });
    // A labelled counter has no series until its first sample: absent reads as 0 when the
    // manager exposes the family's siblings.
    let known = ["ccm_events_written_total", "ccm_events_dropped_total", "ccm_events_aggregated_total"];
    let mut names: BTreeSet<String> = reports.iter().flat_map(|r| r.event_metrics.keys().cloned()).collect();
    if !names.is_empty() {
        names.extend(known.iter().map(|n| n.to_string()));
    }
    for name in &names {
        row(name, "manager metrics", &|r| match r.event_metrics.get(name) {
            Some(v) => v.to_string(),
            None if !r.event_metrics.is_empty() => "0".into(),
            None => "n/a".into(),
        });
    }
    row("manager peak RSS", "/proc", &|r| format!("{:.1} MiB", r.peak_rss_mib));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cloud_bound_uses_the_variants_workers_and_the_latency_in_seconds() {
        assert_eq!(workers("--concurrent-service-syncs=1 --kube-api-qps=20"), 1);
        assert_eq!(workers("--kube-api-qps=0"), crds::defaults::CONCURRENT_SERVICE_SYNCS as usize);
        assert_eq!(workers("upstream --kube-api-qps=20"), UPSTREAM_SERVICE_SYNCS);
        assert_eq!(workers("upstream --concurrent-service-syncs=32"), 32);
        assert_eq!(seconds_of("50ms"), Some(0.05));
        assert_eq!(seconds_of("2s"), Some(2.0));
        assert_eq!(seconds_of("fast"), None);
    }

    #[test]
    fn event_counters_are_summed_over_their_labels_and_other_families_ignored() {
        let text = "# HELP ccm_events_dropped Dropped\nccm_events_dropped_total{reason=\"superseded\"} 2\n\
                    ccm_events_dropped_total{reason=\"queue_full\"} 3\nccm_events_pending 0\n\
                    cloudprovider_api_requests_total{method=\"ensure_load_balancer\"} 1000\n";
        let m = event_metrics(text);
        assert_eq!(m.get("ccm_events_dropped_total"), Some(&5));
        assert_eq!(m.get("ccm_events_pending"), Some(&0));
        assert_eq!(m.len(), 2);
        assert_eq!(
            metric_by(text, "cloudprovider_api_requests_total", "method").get("ensure_load_balancer"),
            Some(&1000)
        );
    }
}
