//! bench-pools: the `baremetal` provider's address pools and L2 announcement at scale.
//!
//! The driver starts a fresh API server (the local test server in-process, or with `--backend
//! genuine` etcd and kube-apiserver from `CCM_TEST_ASSETS`), creates the Nodes, and runs as
//! child processes (this binary re-executed, so each is measured alone):
//!
//! - the manager: `bench-pools manager <flags>` is the framework's `run_main` with the
//!   `baremetal` provider registered, as in `cloud-controller-manager`, only
//!   `service-lb-controller`, no leader election, a cloud-config with `--pools` IPv4 /22 pools
//!   and `loadBalancer.announcement.l2`;
//! - one L2 announcer per Node: `bench-pools announcer <kubeconfig> <namespace> <node>` runs
//!   the announcer loop of `cloud-controller-manager announce` (its Lease, production timings:
//!   6 s duration, 2 s renewal, 2 s settling) without the packet sockets, and prints the set of
//!   addresses it owns on every change, which is what it would hand its ARP/NDP responder.
//!
//! Once the manager is healthy and the announcers have settled, the driver creates the
//! Services (each annotated `ccm.rs/address-pool` with one pool, round-robin) and measures:
//! (a) from the first create to every Service having an address in its status (the driver's
//! watch); (b) to every address being owned by exactly one announcer, the one the election
//! over all nodes picks (the announcers' lines, timed on arrival; with `--late-announcers` the
//! announcers start only then, and (b) runs from their start); (c) failover: one announcer
//! stopped gracefully (SIGTERM: it deletes its Lease), then restarted, then killed (SIGKILL:
//! its Lease runs out), each timed until every address is owned by exactly one of the others;
//! (d) the peak RSS (`VmHWM`) of the manager and of each announcer process, and CPU time.
//! Results and command: docs/benchmarks.md.
//!
//! ```sh
//! cargo build -p e2e --bin bench-pools
//! target/debug/bench-pools                      # local API server
//! CCM_TEST_ASSETS=target/envtest-assets target/debug/bench-pools --backend genuine
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::time::{Duration, Instant};

use ccm_framework::cache::{Cache, Change};
use ccm_framework::events::EventSink;
use ccm_provider_baremetal::announce::announcer::{self, AnnouncerSettings, LEASE_LABEL, LEASE_LABEL_L2};
use ccm_provider_baremetal::announce::elect;
use ccm_provider_baremetal::announce::guard::Facts;
use ccm_provider_baremetal::ipam::ADDRESS_POOL_ANNOTATION;
use ccm_provider_baremetal::ipam::IpBlock;
use clap::Parser;
use e2e::bench::{self, BackendArg, BoxError, ManagerProcess, create_all, proc_cpu_secs, proc_status_kib};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{Api, ListParams};
use testkit::{Backend, Meta, NodeFixture, TestCluster};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::{mpsc, watch};

/// Field manager of everything the driver writes.
const DRIVER: &str = "bench-pools";
/// The internal subcommand running the manager.
const MANAGER: &str = "manager";
/// The internal subcommand running one announcer.
const ANNOUNCER: &str = "announcer";
/// How the announcer child reports the addresses it owns: `owned a,b,c`.
const OWNED: &str = "owned";
/// Third octet step between pools: pool `k` is `10.200.(4k).0/22`.
const POOL_STEP: usize = 4;

#[derive(Debug, Parser)]
#[command(name = "bench-pools", about = "Benchmark baremetal pools and L2 announcement with 1,000 Services")]
struct Args {
    /// The API server: `genuine` (etcd + kube-apiserver from `CCM_TEST_ASSETS`) or `local`.
    #[arg(long, value_enum, default_value_t = BackendArg::Local)]
    backend: BackendArg,
    /// LoadBalancer Services to create, spread round-robin over the pools.
    #[arg(long, default_value_t = 1000)]
    services: usize,
    /// Address pools (IPv4 /22 each, 1,024 addresses).
    #[arg(long, default_value_t = 4)]
    pools: usize,
    /// Nodes, each with its own announcer process.
    #[arg(long, default_value_t = 4)]
    nodes: usize,
    /// Create requests the driver keeps in flight.
    #[arg(long, default_value_t = 16)]
    create_concurrency: usize,
    /// Flags appended to the manager's command line.
    #[arg(long, default_value = "--kube-api-qps=0", allow_hyphen_values = true)]
    manager_flags: String,
    /// Start the announcers only once every Service has its address (as after a rollout of
    /// the announcers' DaemonSet): (b) then runs from their start and includes their settling.
    #[arg(long)]
    late_announcers: bool,
    /// Where the cloud-config and the logs go (default: a fresh directory under /tmp).
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// Give up on a phase after this many seconds.
    #[arg(long, default_value_t = 300)]
    timeout_seconds: u64,
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().collect();
    match argv.get(1).map(String::as_str) {
        Some(MANAGER) => return run_manager(&argv[2..]),
        Some(ANNOUNCER) => return run_announcer(&argv[2..]),
        _ => {}
    }
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(std::env::var("RUST_LOG").unwrap_or_else(|_| "warn,kube_client::client::builder=off".into()))
        .init();
    let result = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(BoxError::from)
        .and_then(|runtime| runtime.block_on(run(args)));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("bench-pools: {error}");
            ExitCode::FAILURE
        }
    }
}

/// The manager child: what `cloud-controller-manager` runs, with the baremetal provider only.
fn run_manager(flags: &[String]) -> ExitCode {
    let mut registry = ccm_framework::registry::Registry::new();
    if let Err(error) = ccm_provider_baremetal::register(&mut registry) {
        eprintln!("{error}");
        return ExitCode::FAILURE;
    }
    let args = std::iter::once("cloud-controller-manager".to_string()).chain(flags.iter().cloned());
    ccm_framework::program::app::run_main_from(registry, args)
}

/// The announcer child: `cloud-controller-manager announce` without its packet sockets (they
/// only answer what the owned set says); prints the owned set on every change.
fn run_announcer(args: &[String]) -> ExitCode {
    let [kubeconfig, namespace, node] = args else {
        eprintln!("usage: bench-pools {ANNOUNCER} <kubeconfig> <namespace> <node>");
        return ExitCode::from(2);
    };
    tracing_subscriber::fmt().with_env_filter(std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into())).init();
    // One worker, as the real subcommand runs.
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("starting the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(announce(Path::new(kubeconfig), namespace, node)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("announcer {node}: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn announce(kubeconfig: &Path, namespace: &str, node: &str) -> Result<(), BoxError> {
    let client = client_from(kubeconfig).await?;
    let cancel = ccm_framework::process::shutdown_on_signal();
    let events = EventSink::spawn(client.clone(), Some(node.to_string()), cancel.clone());
    let (owned, mut changes) = watch::channel(BTreeSet::<IpAddr>::new());
    let printer = tokio::spawn(async move {
        // `changed` still reports the last value (the empty set) after the sender is gone.
        while changes.changed().await.is_ok() {
            let line = {
                let set = changes.borrow_and_update();
                set.iter().map(IpAddr::to_string).collect::<Vec<_>>().join(",")
            };
            let mut out = std::io::stdout().lock();
            if writeln!(out, "{OWNED} {line}").and_then(|()| out.flush()).is_err() {
                return;
            }
        }
    });
    // Every pool of the run lies in 10.200.0.0/16 (pool `k` is 10.200.(4k).0/22): the announcer
    // answers for nothing outside what the pools hand out.
    let pools = vec![IpBlock::parse_cidr("10.200.0.0/16")?];
    let settings = AnnouncerSettings::new(node, namespace).with_facts(Facts::of_pools(pools));
    announcer::run(client, settings, owned, Some(events), cancel).await?;
    let _ = printer.await;
    Ok(())
}

async fn client_from(kubeconfig: &Path) -> Result<kube::Client, BoxError> {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig)?;
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
    Ok(kube::Client::try_from(config)?)
}

/// What one run measured.
#[derive(Debug, Default)]
struct Report {
    create_secs: f64,
    /// (a) From the first create to every Service having an address.
    addressed_secs: f64,
    /// (b) From the first create (or the late announcers' start) to every address owned by
    /// exactly the announcer the election picks.
    announced_secs: f64,
    /// Services per pool, and Services whose address is outside the pool they named.
    per_pool: Vec<usize>,
    wrong_pool: usize,
    /// Addresses owned by each announcer once every one is announced.
    owned_per_node: Vec<usize>,
    /// Graceful stop: addresses moved, time until all are owned by another live announcer,
    /// and when the stopped one reported letting them go.
    graceful_moved: usize,
    graceful_secs: f64,
    graceful_released_secs: Option<f64>,
    /// The restarted announcer owns its addresses again (includes its 2 s settling).
    rejoin_secs: f64,
    /// Crash: addresses moved and time until all are owned by another live announcer.
    crash_moved: usize,
    crash_secs: f64,
    /// CPU seconds from the first create to the end of (b): manager, announcers (together),
    /// this driver (which holds the local API server), and the whole machine (other users too).
    cpu: [f64; 4],
    /// RSS before the first Service: the manager's, and the announcers' (settled).
    manager_idle_rss_mib: f64,
    announcer_idle_rss_mib: Vec<f64>,
    manager_peak_rss_mib: f64,
    /// Peak RSS of every announcer process, in MiB, in the order they ended.
    announcer_peak_rss_mib: Vec<f64>,
}

async fn run(args: Args) -> Result<(), BoxError> {
    let work = match &args.work_dir {
        Some(d) => d.clone(),
        None => std::env::temp_dir().join(format!("bench-pools-{}", std::process::id())),
    };
    std::fs::create_dir_all(&work)?;
    let backend = match args.backend {
        BackendArg::Local => Backend::Local,
        BackendArg::Genuine if Backend::genuine_available() => Backend::Genuine,
        BackendArg::Genuine => return Err("--backend genuine needs CCM_TEST_ASSETS".into()),
    };
    if args.nodes < 2 {
        return Err("--nodes must be at least 2: failover needs another announcer".into());
    }
    if args.pools == 0 || args.services > args.pools * 1024 {
        return Err(format!("{} Services do not fit {} pools of 1,024 addresses", args.services, args.pools).into());
    }
    let cluster = TestCluster::start(backend).await?;
    let client = cluster.client();
    let namespace = cluster.fresh_namespace("bench-pools").await?;
    let kubeconfig = cluster.kubeconfig_path();
    let cloud_config = work.join("baremetal-cloud-config.yaml");
    std::fs::write(&cloud_config, cloud_config_text(args.pools))?;
    let timeout = Duration::from_secs(args.timeout_seconds);
    let mut report = Report::default();

    let node_names: Vec<String> = (0..args.nodes).map(|i| format!("bench-pools-node-{i}")).collect();
    let nodes: Api<Node> = Api::all(client.clone());
    create_all(&nodes, DRIVER, args.nodes, args.create_concurrency, |i| node(&node_names[i])).await?;

    // By default the announcers first, settled before any address exists, as on a running
    // cluster.
    let mut announcers = Announcers::new(&kubeconfig, &namespace, node_names.clone(), &work);
    if !args.late_announcers {
        for i in 0..args.nodes {
            announcers.start(i)?;
        }
        wait_for_leases(&client, &namespace, args.nodes, timeout).await?;
        // Every announcer counts the others only after seeing them live for the settling time.
        tokio::time::sleep(AnnouncerSettings::new("", "").settle + Duration::from_secs(1)).await;
    }

    let exe = std::env::current_exe()?;
    let command = format!(
        "{} {MANAGER} --cloud-provider={} --cloud-config={{cloud_config}} --kubeconfig={{kubeconfig}} \
         --leader-elect=false --bind-address=127.0.0.1 --secure-port={{port}} \
         --authorization-always-allow-paths=/healthz,/metrics --controllers=service-lb-controller",
        exe.display(),
        ccm_provider_baremetal::NAME
    );
    let mut manager =
        ManagerProcess::spawn(&command, &args.manager_flags, &kubeconfig, &cloud_config, &work.join("manager.log"))?;
    manager.wait_healthy(Duration::from_secs(60)).await?;

    report.manager_idle_rss_mib = rss_mib(manager.pid()).unwrap_or_default();
    report.announcer_idle_rss_mib = announcers.rss_mib();

    let services: Api<Service> = Api::namespaced(client.clone(), &namespace);
    let (cache, writer) = Cache::<Service>::new();
    let _watch = bench::watch(services.clone(), writer);
    cache.wait_until_ready().await;
    let mut changes = cache.subscribe();

    // (a) and (b): the clock runs from the first create.
    let cpu_before = cpu_now(&manager, &announcers);
    let started = Instant::now();
    let creating = tokio::spawn({
        let (services, ns, pools, n, in_flight) =
            (services.clone(), namespace.clone(), args.pools, args.services, args.create_concurrency);
        async move {
            create_all(&services, DRIVER, n, in_flight, |i| service(&ns, i, pools)).await.map_err(|e| e.to_string())
        }
    });
    let mut addresses: BTreeMap<String, Vec<IpAddr>> = BTreeMap::new();
    let deadline = Instant::now() + timeout;
    let live_all = vec![true; args.nodes];
    let mut addressed = None;
    // Once every Service has its address: what each node owns once the election has settled.
    let mut expected: Option<Vec<BTreeSet<IpAddr>>> = None;
    loop {
        if addressed.is_none() && addresses.len() >= args.services {
            addressed = Some(started.elapsed());
            let want: BTreeSet<IpAddr> = addresses.values().flatten().copied().collect();
            expected = Some(announcers.elected(&want));
        }
        if args.late_announcers && addressed.is_some() {
            break;
        }
        if expected.as_ref().is_some_and(|e| announcers.owned == *e) {
            report.announced_secs = started.elapsed().as_secs_f64();
            break;
        }
        manager.check_running()?;
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            let want: BTreeSet<IpAddr> = addresses.values().flatten().copied().collect();
            let why = announcers.check(&want, &live_all).err().unwrap_or_else(|| "not as elected".into());
            return Err(format!("{} of {} Services addressed; {why}", addresses.len(), args.services).into());
        }
        tokio::select! {
            change = changes.recv() => match change {
                Some(Change::Applied { new, .. }) => note_addresses(&mut addresses, &new),
                Some(Change::Resynced) => cache.state().iter().for_each(|s| note_addresses(&mut addresses, s)),
                Some(Change::Deleted(_)) => {}
                None => return Err("the Service watch stopped".into()),
            },
            update = announcers.updates.recv() => match update {
                Some(update) => announcers.apply(update),
                None => return Err("every announcer reader stopped".into()),
            },
            _ = tokio::time::sleep(remaining.min(Duration::from_millis(500))) => {}
        }
    }
    report.addressed_secs = addressed.unwrap_or_default().as_secs_f64();
    report.create_secs = creating.await?.map_err(BoxError::from)?;
    if args.late_announcers {
        let t1 = Instant::now();
        for i in 0..args.nodes {
            announcers.start(i)?;
        }
        let expected = expected.unwrap_or_default();
        while announcers.owned != expected {
            announcers.next_update(t1 + timeout, || "the late announcers did not settle as elected".into()).await?;
        }
        report.announced_secs = t1.elapsed().as_secs_f64();
    }
    let cpu_after = cpu_now(&manager, &announcers);
    report.cpu = std::array::from_fn(|i| cpu_after[i] - cpu_before[i]);
    eprintln!(
        "   created in {:.2} s; every Service addressed after {:.2} s, every address announced after {:.2} s",
        report.create_secs, report.addressed_secs, report.announced_secs
    );
    let want: BTreeSet<IpAddr> = addresses.values().flatten().copied().collect();
    report.per_pool = vec![0; args.pools];
    for (name, ips) in &addresses {
        let named = name.strip_prefix("svc-").and_then(|i| i.parse::<usize>().ok()).map(|i| i % args.pools);
        for ip in ips {
            let pool = pool_of(*ip);
            if let Some(count) = pool.and_then(|p| report.per_pool.get_mut(p)) {
                *count += 1;
            }
            if pool != named {
                report.wrong_pool += 1;
            }
        }
    }
    report.owned_per_node = announcers.owned.iter().map(BTreeSet::len).collect();

    // (c) Graceful stop of the announcer owning the most, then its return, then a crash.
    let victim = (0..args.nodes).max_by_key(|i| announcers.owned[*i].len()).unwrap_or(0);
    let before = announcers.owned[victim].clone();
    report.graceful_moved = before.len();
    let mut live = live_all.clone();
    live[victim] = false;
    let t0 = Instant::now();
    announcers.stop(victim, false)?;
    let released = announcers.wait(&want, &live, timeout, Some(victim)).await?;
    report.graceful_secs = t0.elapsed().as_secs_f64();
    report.graceful_released_secs = released.map(|t| (t - t0).as_secs_f64());
    eprintln!(
        "   graceful stop of {}: {} addresses moved in {:.3} s",
        node_names[victim],
        before.len(),
        report.graceful_secs
    );
    announcers.reap(victim, timeout).await;

    let t0 = Instant::now();
    announcers.start(victim)?;
    loop {
        if announcers.owned[victim] == before && announcers.check(&want, &live_all).is_ok() {
            break;
        }
        announcers
            .next_update(t0 + timeout, || format!("{} did not win its addresses back", node_names[victim]))
            .await?;
    }
    report.rejoin_secs = t0.elapsed().as_secs_f64();
    eprintln!("   {} owns its addresses again after {:.2} s", node_names[victim], report.rejoin_secs);

    report.crash_moved = announcers.owned[victim].len();
    let t0 = Instant::now();
    announcers.stop(victim, true)?;
    announcers.wait(&want, &live, timeout, None).await?;
    report.crash_secs = t0.elapsed().as_secs_f64();
    eprintln!(
        "   crash of {}: {} addresses moved in {:.2} s",
        node_names[victim], report.crash_moved, report.crash_secs
    );
    announcers.reap(victim, timeout).await;

    // (d) Memory: the manager's and each announcer's high-water mark.
    for i in (0..args.nodes).filter(|i| *i != victim) {
        announcers.stop(i, false)?;
        announcers.reap(i, timeout).await;
    }
    report.announcer_peak_rss_mib = announcers.peak_rss_mib.clone();
    report.manager_peak_rss_mib = manager.stop();
    print_table(&args, backend, &report);
    eprintln!("logs: {}", work.display());
    Ok(())
}

/// The cloud-config: `pools` IPv4 /22 pools and L2 announcement (which the announcers read in
/// a cluster; the manager validates it).
fn cloud_config_text(pools: usize) -> String {
    let mut text = String::from("loadBalancer:\n  pools:\n");
    for k in 0..pools {
        text.push_str(&format!("    - name: pool-{k}\n      cidrs: [10.200.{}.0/22]\n", k * POOL_STEP));
    }
    text.push_str("  announcement:\n    l2:\n      interfaces: [eth0]\n");
    text
}

/// The pool an address of [`cloud_config_text`] belongs to.
fn pool_of(ip: IpAddr) -> Option<usize> {
    match ip {
        IpAddr::V4(v4) if v4.octets()[..2] == [10, 200] => Some(usize::from(v4.octets()[2]) / POOL_STEP),
        _ => None,
    }
}

/// A Ready Node as a kubelet registers it.
fn node(name: &str) -> Node {
    testkit::node(name).ready()
}

/// Service `svc-<i>`, asking for pool `i % pools`.
fn service(namespace: &str, i: usize, pools: usize) -> Service {
    let pool = format!("pool-{}", i % pools);
    testkit::lb_service(namespace, &format!("svc-{i}")).with_annotations(&[(ADDRESS_POOL_ANNOTATION, &pool)])
}

fn note_addresses(addresses: &mut BTreeMap<String, Vec<IpAddr>>, service: &Service) {
    let ips: Vec<IpAddr> = testkit::ingress_ips(service).iter().filter_map(|ip| ip.parse().ok()).collect();
    if !ips.is_empty() {
        addresses.insert(service.metadata.name.clone().unwrap_or_default(), ips);
    }
}

async fn wait_for_leases(
    client: &kube::Client,
    namespace: &str,
    count: usize,
    timeout: Duration,
) -> Result<(), BoxError> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let lp = ListParams::default().labels(&format!("{LEASE_LABEL}={LEASE_LABEL_L2}"));
    let deadline = Instant::now() + timeout;
    loop {
        let found = leases.list(&lp).await?.items.len();
        if found >= count {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("only {found} of {count} announcer Leases appeared").into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One announcer's report: the set it owns, from process `generation` of node `node`.
struct Update {
    node: usize,
    generation: u64,
    at: Instant,
    owned: BTreeSet<IpAddr>,
}

/// The announcer processes and what each last said it owns.
struct Announcers {
    kubeconfig: PathBuf,
    namespace: String,
    names: Vec<String>,
    logs: PathBuf,
    children: Vec<Option<tokio::process::Child>>,
    generations: Vec<u64>,
    owned: Vec<BTreeSet<IpAddr>>,
    updates: mpsc::UnboundedReceiver<Update>,
    sender: mpsc::UnboundedSender<Update>,
    peak_rss_mib: Vec<f64>,
}

impl Announcers {
    fn new(kubeconfig: &Path, namespace: &str, names: Vec<String>, logs: &Path) -> Self {
        let (sender, updates) = mpsc::unbounded_channel();
        let n = names.len();
        Self {
            kubeconfig: kubeconfig.to_path_buf(),
            namespace: namespace.to_string(),
            names,
            logs: logs.to_path_buf(),
            children: (0..n).map(|_| None).collect(),
            generations: vec![0; n],
            owned: vec![BTreeSet::new(); n],
            updates,
            sender,
            peak_rss_mib: Vec::new(),
        }
    }

    /// Start node `i`'s announcer process; its lines are read by a task of its own.
    fn start(&mut self, i: usize) -> Result<(), BoxError> {
        self.generations[i] += 1;
        let generation = self.generations[i];
        let log = self.logs.join(format!("announcer-{i}-{generation}.log"));
        let mut child = tokio::process::Command::new(std::env::current_exe()?)
            .arg(ANNOUNCER)
            .arg(&self.kubeconfig)
            .arg(&self.namespace)
            .arg(&self.names[i])
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log)?)
            .kill_on_drop(true)
            .spawn()?;
        let stdout = child.stdout.take().ok_or("the announcer's stdout")?;
        let sender = self.sender.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let at = Instant::now();
                let Some(list) = line.strip_prefix(OWNED).map(str::trim) else { continue };
                let owned = list.split(',').filter_map(|a| a.parse().ok()).collect();
                if sender.send(Update { node: i, generation, at, owned }).is_err() {
                    return;
                }
            }
        });
        self.owned[i].clear();
        self.children[i] = Some(child);
        Ok(())
    }

    /// What each node owns once the election over every node has settled on `want`.
    fn elected(&self, want: &BTreeSet<IpAddr>) -> Vec<BTreeSet<IpAddr>> {
        let names: Vec<&str> = self.names.iter().map(String::as_str).collect();
        names.iter().map(|name| elect::owned_by(name, want, &names)).collect()
    }

    /// The current RSS of every running announcer, in MiB.
    fn rss_mib(&self) -> Vec<f64> {
        self.children.iter().flatten().filter_map(|c| rss_mib(c.id()?)).collect()
    }

    /// Stop node `i`'s announcer: SIGTERM (graceful: it deletes its Lease) or SIGKILL (a crash:
    /// its Lease runs out). Its peak RSS is read first.
    fn stop(&mut self, i: usize, crash: bool) -> Result<(), BoxError> {
        let child = self.children[i].as_mut().ok_or("announcer not running")?;
        let pid = child.id().ok_or("announcer already exited")?;
        if let Some(kib) = proc_status_kib(pid, "VmHWM:") {
            self.peak_rss_mib.push(kib as f64 / 1024.0);
        }
        if crash {
            child.start_kill()?;
        } else {
            std::process::Command::new("kill").arg("-TERM").arg(pid.to_string()).status()?;
        }
        Ok(())
    }

    /// Wait for node `i`'s process to exit (killed after `timeout`).
    async fn reap(&mut self, i: usize, timeout: Duration) {
        if let Some(mut child) = self.children[i].take()
            && tokio::time::timeout(timeout, child.wait()).await.is_err()
        {
            eprintln!("announcer {} did not exit in time; killed", self.names[i]);
            let _ = child.kill().await;
        }
    }

    fn apply(&mut self, update: Update) {
        // Lines from an earlier process of the same node are stale.
        if update.generation == self.generations[update.node] {
            self.owned[update.node] = update.owned;
        }
    }

    /// Ok when every address of `want` is owned by exactly one announcer marked `live`;
    /// otherwise how many are unowned and how many owned twice.
    fn check(&self, want: &BTreeSet<IpAddr>, live: &[bool]) -> Result<(), String> {
        let (mut none, mut many) = (0, 0);
        for ip in want {
            match self.owned.iter().zip(live).filter(|(o, l)| **l && o.contains(ip)).count() {
                0 => none += 1,
                1 => {}
                _ => many += 1,
            }
        }
        if none == 0 && many == 0 {
            Ok(())
        } else {
            Err(format!("{none} of {} addresses unowned, {many} owned by more than one announcer", want.len()))
        }
    }

    /// Apply the next update, failing with `why()` at `deadline`; its node and arrival.
    async fn next_update(&mut self, deadline: Instant, why: impl Fn() -> String) -> Result<(usize, Instant), BoxError> {
        let remaining = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(remaining, self.updates.recv()).await {
            Ok(Some(update)) => {
                let seen = (update.node, update.at);
                self.apply(update);
                Ok(seen)
            }
            Ok(None) => Err("every announcer reader stopped".into()),
            Err(_) => Err(why().into()),
        }
    }

    /// Wait until every address of `want` is owned by exactly one `live` announcer; with
    /// `watching`, also return when that (stopped) node reported owning nothing.
    async fn wait(
        &mut self,
        want: &BTreeSet<IpAddr>,
        live: &[bool],
        timeout: Duration,
        watching: Option<usize>,
    ) -> Result<Option<Instant>, BoxError> {
        let deadline = Instant::now() + timeout;
        let mut released = None;
        while self.check(want, live).is_err() {
            let why = self.check(want, live).err().unwrap_or_default();
            let (node, at) = self.next_update(deadline, || why.clone()).await?;
            if Some(node) == watching && self.owned[node].is_empty() && released.is_none() {
                released = Some(at);
            }
        }
        Ok(released)
    }
}

/// CPU seconds so far: manager, announcers, this process, the whole machine.
fn cpu_now(manager: &ManagerProcess, announcers: &Announcers) -> [f64; 4] {
    let announcers = announcers.children.iter().flatten().filter_map(|c| proc_cpu_secs(c.id()?)).sum();
    [
        proc_cpu_secs(manager.pid()).unwrap_or_default(),
        announcers,
        proc_cpu_secs(std::process::id()).unwrap_or_default(),
        machine_busy_secs().unwrap_or_default(),
    ]
}

/// Busy CPU seconds of the whole machine since boot (every CPU but idle and iowait), from
/// `/proc/stat` in USER_HZ ticks.
fn machine_busy_secs() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let ticks: Vec<u64> = stat.lines().next()?.split_whitespace().skip(1).filter_map(|v| v.parse().ok()).collect();
    let idle = ticks.get(3)? + ticks.get(4)?;
    Some((ticks.iter().take(8).sum::<u64>() - idle) as f64 / 100.0)
}

fn rss_mib(pid: u32) -> Option<f64> {
    proc_status_kib(pid, "VmRSS:").map(|kib| kib as f64 / 1024.0)
}

fn ms(secs: f64) -> String {
    format!("{:.0} ms", secs * 1000.0)
}

fn print_table(args: &Args, backend: Backend, r: &Report) {
    let mib = |v: &[f64]| v.iter().map(|m| format!("{m:.1}")).collect::<Vec<_>>().join(", ");
    println!(
        "\n{} LoadBalancer Services over {} pools, {} announcers ({} backend, manager flags `{}`)\n",
        args.services,
        args.pools,
        args.nodes,
        backend.name(),
        args.manager_flags
    );
    println!("| | |\n|---|---|");
    println!("| driver: creating the Services ({} in flight) | {:.2} s |", args.create_concurrency, r.create_secs);
    println!("| (a) every Service has an address (from the first create) | {:.2} s |", r.addressed_secs);
    println!("| (a) of which after the last create | {:.2} s |", r.addressed_secs - r.create_secs);
    let from = if args.late_announcers { "from the announcers' start" } else { "from the first create" };
    println!(
        "| (b) every address owned by exactly one live announcer, the elected one ({from}) | {:.2} s |",
        r.announced_secs
    );
    let [manager, announcers, driver, machine] = r.cpu;
    println!(
        "| CPU during (a)+(b): manager / announcers together / driver{} / whole machine ({} cores) | {manager:.1} / {announcers:.1} / {driver:.1} / {machine:.1} s |",
        if backend == Backend::Local { " with the API server" } else { "" },
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let pools = r.per_pool.iter().map(usize::to_string).collect::<Vec<_>>().join(" / ");
    println!("| addresses per pool / outside the named pool | {pools} / {} |", r.wrong_pool);
    let owned = r.owned_per_node.iter().map(usize::to_string).collect::<Vec<_>>().join(" / ");
    println!("| addresses owned per announcer | {owned} |");
    let released = r.graceful_released_secs.map_or_else(|| "n/a".into(), ms);
    println!(
        "| (c) graceful stop (SIGTERM): {} addresses owned by others after | {} (the stopped one let go after {released}) |",
        r.graceful_moved,
        ms(r.graceful_secs)
    );
    println!("| the restarted announcer owns its addresses again after | {:.2} s |", r.rejoin_secs);
    println!(
        "| (c) crash (SIGKILL, 6 s Lease): {} addresses owned by others after | {:.2} s |",
        r.crash_moved, r.crash_secs
    );
    println!("| manager RSS before the first Service | {:.1} MiB |", r.manager_idle_rss_mib);
    if !r.announcer_idle_rss_mib.is_empty() {
        println!("| announcer RSS before the first Service (settled) | {} MiB |", mib(&r.announcer_idle_rss_mib));
    }
    println!("| (d) manager peak RSS (own process) | {:.1} MiB |", r.manager_peak_rss_mib);
    println!(
        "| (d) announcer peak RSS (one process each, in the order they ended) | {} MiB |",
        mib(&r.announcer_peak_rss_mib)
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_map_back_to_the_pool_they_came_from() {
        let text = cloud_config_text(4);
        assert!(text.contains("name: pool-3\n      cidrs: [10.200.12.0/22]"), "{text}");
        assert_eq!(pool_of("10.200.0.1".parse().unwrap()), Some(0));
        assert_eq!(pool_of("10.200.7.255".parse().unwrap()), Some(1));
        assert_eq!(pool_of("10.200.12.9".parse().unwrap()), Some(3));
        assert_eq!(pool_of("192.0.2.1".parse().unwrap()), None);
    }
}
