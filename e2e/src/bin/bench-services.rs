//! bench-services: the service-lb-controller at scale, with the manager as its own process.
//!
//! For each configuration ("variant") the driver creates Nodes, starts the manager command
//! line with the variant's extra flags, creates LoadBalancer Services as fast as it can, and
//! measures: the time until every Service has an ingress, the time until every load balancer
//! has the new host set after one Node is added, cloud calls (from the manager's
//! `cloudprovider_api_requests_total`), API writes (from the test API server's request log,
//! when the cluster is one), writes and cloud calls during an idle window, and the manager's
//! peak RSS. It knows nothing about the provider: the manager command line is a parameter, with
//! `{kubeconfig}`, `{port}` and `{cloud_config}` placeholders. Without `--kubeconfig` it
//! starts the local test API server in-process, fresh for every variant.
//!
//! ```sh
//! cargo build --release -p manager -p e2e
//! target/release/bench-services            # the three default variants
//! ```

use std::collections::{BTreeMap, HashSet};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use e2e_apiserver::genuine::ControlPlane;
use e2e_apiserver::{RequestLog, TestApiServer};
use k8s_openapi::api::core::v1::{Namespace, Node, NodeSpec, Service, ServicePort, ServiceSpec};
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams};
use kube::runtime::watcher;
use manager::cache::{Cache, CacheWriter, Change, run_watch};
use tokio::task::JoinSet;

/// Field manager of everything the driver writes; other writes are the manager's.
const DRIVER: &str = "bench-services";

const DEFAULT_MANAGER: &str = "target/release/cloud-controller-manager --cloud-provider=fake \
--cloud-config={cloud_config} --kubeconfig={kubeconfig} --leader-elect=false --bind-address=127.0.0.1 \
--secure-port={port} --controllers=service-lb-controller";

/// The three configurations of the issue. Ours name `--concurrent-service-syncs` explicitly (at
/// the manager crate's default) so the numbers do not depend on the flag's compiled default.
fn default_variants() -> Vec<String> {
    let ours = manager::controllers::service::DEFAULT_CONCURRENT_SYNCS;
    vec![
        format!("ours-no-client-limit=--concurrent-service-syncs={ours} --kube-api-qps=0"),
        format!("ours-20qps=--concurrent-service-syncs={ours} --kube-api-qps=20 --kube-api-burst=30"),
        "upstream-equivalent=--concurrent-service-syncs=1 --kube-api-qps=20 --kube-api-burst=30".to_string(),
    ]
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Command line.
#[derive(Debug, Parser)]
#[command(name = "bench-services", about = "Benchmark the service-lb-controller with the manager as its own process")]
struct Args {
    /// Cluster to run against; without it, a local test API server is started per variant.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Without `--kubeconfig`, the API server each variant starts: `genuine` (etcd +
    /// kube-apiserver from `CCM_TEST_ASSETS`, writes counted from its audit log) or `local`.
    #[arg(long, value_enum, default_value_t = BackendArg::Local)]
    backend: BackendArg,
    /// LoadBalancer Services to create.
    #[arg(long, default_value_t = 1000)]
    services: usize,
    /// Nodes to create before the manager starts.
    #[arg(long, default_value_t = 200)]
    nodes: usize,
    /// Latency of every load-balancer call, written into the fake's cloud-config.
    #[arg(long, default_value = "50ms")]
    lb_latency: String,
    /// Length of the idle window, in seconds.
    #[arg(long, default_value_t = 60)]
    idle_seconds: u64,
    /// Manager command line; `{kubeconfig}`, `{port}` and `{cloud_config}` are substituted.
    #[arg(long, default_value = DEFAULT_MANAGER)]
    manager: String,
    /// `NAME=EXTRA FLAGS` appended to the manager command line; repeatable.
    #[arg(long = "variant")]
    variants: Vec<String>,
    /// Where the cloud-config and manager logs go (default: a fresh directory under /tmp).
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// Give up on a phase after this many seconds.
    #[arg(long, default_value_t = 600)]
    timeout_seconds: u64,
}

/// What one variant measured.
#[derive(Debug, Default)]
struct Report {
    name: String,
    create_secs: f64,
    ingress_secs: f64,
    hosts_secs: f64,
    host_updates: u64,
    updates_after_unrelated_change: u64,
    calls_ingress: BTreeMap<String, u64>,
    calls_hosts: BTreeMap<String, u64>,
    writes_services: Option<usize>,
    writes_events: Option<usize>,
    writes_other: Option<usize>,
    quiet_after_secs: f64,
    idle_writes: Option<usize>,
    idle_calls: u64,
    peak_rss_mib: f64,
}

fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    tracing_subscriber::fmt().with_env_filter(std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into())).init();
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
        let report = run_variant(&args, &work, &cloud_config, i, name, extra).await?;
        eprintln!("{report:#?}");
        reports.push(report);
    }
    print_table(&args, &reports);
    Ok(())
}

/// Which API server a variant starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum BackendArg {
    Local,
    Genuine,
}

/// The cluster of one variant: a fresh local or genuine server, or a namespace on the given
/// cluster.
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
}

async fn cluster(args: &Args, index: usize) -> Result<Cluster, BoxError> {
    match &args.kubeconfig {
        None if args.backend == BackendArg::Genuine => {
            let assets = e2e_apiserver::genuine::assets_dir().ok_or("--backend genuine needs CCM_TEST_ASSETS")?;
            let (plane, keep) = tokio::task::block_in_place(|| ControlPlane::start_on_own_thread(assets))?;
            Ok(Cluster {
                client: plane.admin_client().await?,
                kubeconfig: plane.admin_kubeconfig_path(),
                log: Some(plane.request_log()),
                _plane: Some(plane),
                _keep: Some(keep),
                _server: None,
                namespace: "bench".into(),
                node_prefix: "bench-node".into(),
            })
        }
        None => {
            let server = TestApiServer::start().await?;
            Ok(Cluster {
                client: server.client(),
                kubeconfig: server.kubeconfig_path().to_path_buf(),
                log: Some(server.request_log()),
                _plane: None,
                _keep: None,
                _server: Some(server),
                namespace: "bench".into(),
                node_prefix: "bench-node".into(),
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
            })
        }
    }
}

fn post() -> PostParams {
    PostParams { field_manager: Some(DRIVER.into()), ..Default::default() }
}

fn node(name: &str) -> Node {
    Node {
        metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
        spec: Some(NodeSpec { provider_id: Some(format!("fake://{name}")), ..Default::default() }),
        ..Default::default()
    }
}

fn service(ns: &str, name: &str) -> Service {
    Service {
        metadata: ObjectMeta { name: Some(name.into()), namespace: Some(ns.into()), ..Default::default() },
        spec: Some(ServiceSpec {
            type_: Some("LoadBalancer".into()),
            selector: Some(BTreeMap::from([("app".to_string(), name.to_string())])),
            ports: Some(vec![ServicePort { name: Some("http".into()), port: 80, ..Default::default() }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn has_ingress(s: &Service) -> bool {
    s.status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|l| l.ingress.as_ref())
        .is_some_and(|i| !i.is_empty())
}

/// Feed `writer` from a watch on `api`; the returned closure stops it.
fn watch(api: Api<Service>, writer: CacheWriter<Service>) -> impl FnOnce() {
    // The token's type comes from `run_watch`, so this crate needs no tokio-util of its own.
    let token = Default::default();
    tokio::spawn(run_watch(api, watcher::Config::default(), writer, Clone::clone(&token)));
    move || token.cancel()
}

fn free_port() -> Result<u16, BoxError> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// GET `path` from the manager's HTTP endpoint (plain HTTP/1.0).
fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let status = out.split_whitespace().nth(1)?.parse().ok()?;
    let body = out.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    Some((status, body))
}

/// Sum of the samples of `metric` grouped by the value of `label` (or "" for none).
fn metric_by(text: &str, metric: &str, label: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some(rest) = line.strip_prefix(metric) else { continue };
        if !(rest.starts_with('{') || rest.starts_with(' ')) {
            continue;
        }
        let (labels, value) = match rest.split_once('}') {
            Some((l, v)) => (l.trim_start_matches('{'), v),
            None => ("", rest),
        };
        let Some(value) = value.split_whitespace().next().and_then(|v| v.parse::<f64>().ok()) else { continue };
        let key = labels
            .split(',')
            .find_map(|kv| {
                kv.split_once('=').filter(|(k, _)| *k == label).map(|(_, v)| v.trim_matches('"').to_string())
            })
            .unwrap_or_default();
        *out.entry(key).or_insert(0) += value as u64;
    }
    out
}

fn metric_total(text: &str, metric: &str) -> u64 {
    metric_by(text, metric, "").values().sum()
}

fn diff(after: &BTreeMap<String, u64>, before: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    after.iter().map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0))).filter(|(_, v)| *v > 0).collect()
}

struct ManagerProcess {
    child: Child,
    port: u16,
    peak_rss_kib: Arc<AtomicU64>,
    stop_sampling: Arc<AtomicBool>,
}

impl ManagerProcess {
    fn spawn(command: &str, extra: &str, kubeconfig: &Path, cloud_config: &Path, log: &Path) -> Result<Self, BoxError> {
        let port = free_port()?;
        let line = command
            .replace("{kubeconfig}", &kubeconfig.display().to_string())
            .replace("{cloud_config}", &cloud_config.display().to_string())
            .replace("{port}", &port.to_string());
        let mut words = line.split_whitespace().chain(extra.split_whitespace());
        let program = words.next().ok_or("empty manager command line")?;
        let child = Command::new(program)
            .args(words)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log)?)
            .spawn()
            .map_err(|e| format!("starting {program}: {e}"))?;
        let peak = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (pid, p, s) = (child.id(), peak.clone(), stop.clone());
        tokio::spawn(async move {
            while !s.load(Ordering::Relaxed) {
                if let Some(kib) = rss_kib(pid) {
                    p.fetch_max(kib, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        Ok(Self { child, port, peak_rss_kib: peak, stop_sampling: stop })
    }

    fn metrics(&self) -> String {
        http_get(self.port, "/metrics").map(|(_, b)| b).unwrap_or_default()
    }

    async fn wait_healthy(&mut self, timeout: Duration) -> Result<(), BoxError> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Err(format!("manager exited with {status}").into());
            }
            if http_get(self.port, "/healthz").is_some_and(|(code, _)| code == 200) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err("manager did not become healthy".into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn stop(mut self) -> f64 {
        self.stop_sampling.store(true, Ordering::Relaxed);
        // The kernel's high-water mark catches peaks between samples.
        if let Some(hwm) = proc_status_kib(self.child.id(), "VmHWM:") {
            self.peak_rss_kib.fetch_max(hwm, Ordering::Relaxed);
        }
        let _ = Command::new("kill").arg("-TERM").arg(self.child.id().to_string()).status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.peak_rss_kib.load(Ordering::Relaxed) as f64 / 1024.0
    }
}

fn rss_kib(pid: u32) -> Option<u64> {
    proc_status_kib(pid, "VmRSS:")
}

fn proc_status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find(|l| l.starts_with(field))?.split_whitespace().nth(1)?.parse().ok()
}

/// Manager writes since `mark` by resource, from the request or audit log; `None` on an
/// external cluster. The driver's writes and the genuine server's own are left out.
async fn manager_writes(log: Option<&RequestLog>, since: u64) -> Option<BTreeMap<String, usize>> {
    let mut out = BTreeMap::new();
    for r in log?.since(since).iter().filter(|r| {
        r.is_write() && r.field_manager.as_deref() != Some(DRIVER) && r.user.as_deref() != Some("system:apiserver")
    }) {
        *out.entry(r.resource.clone().unwrap_or_default()).or_insert(0) += 1;
    }
    Some(out)
}

async fn log_mark(log: Option<&RequestLog>) -> u64 {
    log.map(RequestLog::mark).unwrap_or(0)
}

async fn run_variant(
    args: &Args,
    work: &Path,
    cloud_config: &Path,
    index: usize,
    name: &str,
    extra: &str,
) -> Result<Report, BoxError> {
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
    for i in 0..args.nodes {
        nodes.create(&post(), &node(&format!("{}-{i}", c.node_prefix))).await?;
    }

    // Watch our Services through the manager crate's cache (one watch, change stream).
    let services: Api<Service> = Api::namespaced(c.client.clone(), &c.namespace);
    let (cache, writer) = Cache::<Service>::new();
    let stop_watch = watch(services.clone(), writer);
    cache.wait_until_ready().await;
    let mut changes = cache.subscribe();

    let log = work.join(format!("manager-{index}-{name}.log"));
    let mut manager = ManagerProcess::spawn(&args.manager, extra, &c.kubeconfig, cloud_config, &log)?;
    manager.wait_healthy(Duration::from_secs(30)).await?;
    let mark = log_mark(control).await;
    let calls0 = metric_by(&manager.metrics(), "cloudprovider_api_requests_total", "method");

    // Phase 1: create every Service, wait for every ingress.
    let started = Instant::now();
    let mut creates = JoinSet::new();
    let per_task = args.services.div_ceil(32);
    for t in 0..32 {
        let (api, ns) = (services.clone(), c.namespace.clone());
        let range = (t * per_task)..((t + 1) * per_task).min(args.services);
        creates.spawn(async move {
            for i in range {
                api.create(&post(), &service(&ns, &format!("svc-{i}"))).await?;
            }
            Ok::<(), kube::Error>(())
        });
    }
    while let Some(r) = creates.join_next().await {
        r??;
    }
    let create_secs = started.elapsed().as_secs_f64();
    let mut ready: HashSet<String> = HashSet::new();
    let deadline = Instant::now() + timeout;
    while ready.len() < args.services {
        for s in cache.state() {
            if has_ingress(&s) {
                ready.insert(s.metadata.name.clone().unwrap_or_default());
            }
        }
        if ready.len() >= args.services {
            break;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, changes.recv()).await {
            Ok(Some(Change::Applied { new, .. })) if has_ingress(&new) => {
                ready.insert(new.metadata.name.clone().unwrap_or_default());
            }
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => {
                return Err(format!("only {} of {} Services got an ingress", ready.len(), args.services).into());
            }
        }
    }
    let ingress_secs = started.elapsed().as_secs_f64();
    let calls1 = metric_by(&manager.metrics(), "cloudprovider_api_requests_total", "method");

    // Phase 2: one Node that changes nothing for the load balancers, then one that does.
    let updates = |m: &str| metric_total(m, "service_controller_update_loadbalancer_host_latency_seconds_count");
    let before_unrelated = updates(&manager.metrics());
    nodes
        .create(&post(), &{
            let mut n = node(&format!("{}-excluded", c.node_prefix));
            n.metadata.labels = Some(BTreeMap::from([(
                "node.kubernetes.io/exclude-from-external-load-balancers".into(),
                "true".into(),
            )]));
            n
        })
        .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let updates_after_unrelated_change = updates(&manager.metrics()) - before_unrelated;
    let before = updates(&manager.metrics());
    let started = Instant::now();
    nodes.create(&post(), &node(&format!("{}-added", c.node_prefix))).await?;
    let deadline = Instant::now() + timeout;
    let host_updates = loop {
        let done = updates(&manager.metrics()) - before;
        if done >= args.services as u64 {
            break done;
        }
        if Instant::now() > deadline {
            return Err(format!("only {done} of {} load balancers got the new host", args.services).into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let hosts_secs = started.elapsed().as_secs_f64();
    let calls2 = metric_by(&manager.metrics(), "cloudprovider_api_requests_total", "method");

    // Phase 3: wait until the manager has been quiet (events drained) for 5 s, then idle.
    let quiet_started = Instant::now();
    let mut last = (manager_writes(control, mark).await.map(|w| w.values().sum::<usize>()), calls2.clone());
    let mut quiet_since = Instant::now();
    while quiet_since.elapsed() < Duration::from_secs(5) && quiet_started.elapsed() < timeout {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = (
            manager_writes(control, mark).await.map(|w| w.values().sum::<usize>()),
            metric_by(&manager.metrics(), "cloudprovider_api_requests_total", "method"),
        );
        if now != last {
            quiet_since = Instant::now();
            last = now;
        }
    }
    let quiet_after_secs = quiet_started.elapsed().as_secs_f64() - 5.0;
    // Everything phases 1 and 2 caused, including events written in the background.
    let writes = manager_writes(control, mark).await;
    let idle_mark = log_mark(control).await;
    let idle_calls0 = metric_total(&manager.metrics(), "cloudprovider_api_requests_total");
    tokio::time::sleep(Duration::from_secs(args.idle_seconds)).await;
    let idle_writes = manager_writes(control, idle_mark).await.map(|w| w.values().sum());
    let idle_calls = metric_total(&manager.metrics(), "cloudprovider_api_requests_total") - idle_calls0;

    let peak_rss_mib = manager.stop();
    stop_watch();
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
    Ok(Report {
        name: name.to_string(),
        create_secs,
        ingress_secs,
        hosts_secs,
        host_updates,
        updates_after_unrelated_change,
        calls_ingress: diff(&calls1, &calls0),
        calls_hosts: diff(&calls2, &calls1),
        writes_services: writes.as_ref().map(|w| w.get("services").copied().unwrap_or(0)),
        writes_events: writes.as_ref().map(|w| w.get("events.events.k8s.io").copied().unwrap_or(0)),
        writes_other: writes
            .as_ref()
            .map(|w| w.iter().filter(|(k, _)| *k != "services" && *k != "events.events.k8s.io").map(|(_, v)| v).sum()),
        quiet_after_secs,
        idle_writes,
        idle_calls,
        peak_rss_mib,
    })
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
    println!(
        "\n{} LoadBalancer Services, {} Nodes, load-balancer latency {}, idle window {} s\n",
        args.services, args.nodes, args.lb_latency, args.idle_seconds
    );
    print!("| |");
    for r in reports {
        print!(" {} |", r.name);
    }
    println!();
    print!("|---|");
    for _ in reports {
        print!("---|");
    }
    println!();
    let row = |label: &str, f: &dyn Fn(&Report) -> String| {
        print!("| {label} |");
        for r in reports {
            print!(" {} |", f(r));
        }
        println!();
    };
    row("creating the Services (driver)", &|r| format!("{:.2} s", r.create_secs));
    row("every Service has an ingress", &|r| format!("{:.2} s", r.ingress_secs));
    row("every LB has the added Node", &|r| format!("{:.2} s", r.hosts_secs));
    row("cloud calls until ingress", &|r| calls(&r.calls_ingress));
    row("cloud calls for the added Node", &|r| calls(&r.calls_hosts));
    row("host updates for the added Node", &|r| r.host_updates.to_string());
    row("host updates for an excluded Node", &|r| r.updates_after_unrelated_change.to_string());
    row("API writes: Service patches (rate-limited)", &|r| opt(r.writes_services));
    row("API writes: events (own budget)", &|r| opt(r.writes_events));
    row("API writes: other", &|r| opt(r.writes_other));
    row("quiet (events drained) after", &|r| format!("{:.1} s", r.quiet_after_secs.max(0.0)));
    row("idle: API writes", &|r| opt(r.idle_writes));
    row("idle: cloud calls", &|r| r.idle_calls.to_string());
    row("manager peak RSS", &|r| format!("{:.1} MiB", r.peak_rss_mib));
}
