//! Node-initialization benchmark driver.
//!
//! Registers N Nodes the way kubelet with `--cloud-provider=external` does (uninitialized
//! taint, Hostname address), starts a cloud-controller-manager as its own process, and times
//! how long until every Node has lost the taint. It only watches API objects, so it can time
//! any CCM binary against any API server: give it the manager's command line (with
//! `{kubeconfig}` where the kubeconfig path goes) and optionally a kubeconfig; without one it
//! starts the local test API server in-process.
//!
//! A run whose command line is `upstream FLAGS` runs the upstream Go manager
//! (`../shared/upstream` or `CCM_UPSTREAM`) with its `bench` provider at `--instance-latency`,
//! returning an InternalIP as ours does, so both make the same Node changes; its metrics come
//! from its own plain-HTTP port. Ours and upstream's runs interleave in the order given.
//!
//! Reported per run: time to all initialized, cloud calls (scraped from the manager's
//! `/metrics` when `--metrics-url` is given), API writes per Node (from the test API server's
//! request log, when the server is one), and the manager's peak RSS (`VmHWM`). With
//! `--one-at-a-time N` it instead registers N Nodes one after another, each after the previous
//! one is initialized and deleted, and reports each Node's time from creation to initialized
//! (mean, median, min, max): the wait a single joining Node sees.
//!
//! ```text
//! bench-nodes --nodes 5000 --metrics-url https://127.0.0.1:10258/metrics \
//!   --run 'a=target/release/cloud-controller-manager --kubeconfig={kubeconfig} ...' \
//!   --run 'b=...'
//! ```

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ccm_framework::cache::{Cache, Change, Subscription, run_watch};
use clap::Parser;
use e2e::bench::{self, BackendArg, BoxError, proc_status_kib};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::watcher;
use testkit::fixtures::UNINITIALIZED;
use testkit::genuine::ControlPlane;
use testkit::{Meta, NodeFixture, RequestLog, TestApiServer};
use tokio::task::JoinSet;

/// The taint kubelet registers Nodes with under `--cloud-provider=external`.
/// Label marking the Nodes this driver created (so a real cluster's own Nodes are left alone).
const BENCH_LABEL: &str = "bench.ccm.rs/node";
/// Field manager of the driver's own writes.
const DRIVER: &str = "bench-nodes";
/// `--one-at-a-time`: the pause after each Node.
const ROUND_GAP: Duration = Duration::from_millis(500);
/// Upstream's flags before a run's own: only the cloud-node controller, no leader election.
const UPSTREAM_FLAGS: &str = "--controllers=cloud-node-controller --leader-elect=false";

#[derive(Parser, Debug)]
#[command(name = "bench-nodes", about = "Time Node initialization by a cloud-controller-manager")]
struct Args {
    /// Nodes to register.
    #[arg(long, default_value_t = 5000)]
    nodes: usize,
    /// Kubeconfig of the API server to use; without it `--backend` picks a fresh server per run.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// The API server started for each run: `genuine` (etcd + kube-apiserver from
    /// `CCM_TEST_ASSETS`, writes counted from its audit log) or `local` (in-process).
    #[arg(long, value_enum, default_value_t = BackendArg::Local)]
    backend: BackendArg,
    /// Skip measuring the API server's own limit for the same writes.
    #[arg(long)]
    no_limit: bool,
    /// A run, as `LABEL=COMMAND LINE`; `{kubeconfig}` in the command line is replaced by the
    /// kubeconfig path. Repeat for several runs. Arguments are split on whitespace.
    #[arg(long = "run", required = true)]
    runs: Vec<String>,
    /// The manager's Prometheus endpoint (plain HTTP); cloud calls are read from it at the end.
    #[arg(long)]
    metrics_url: Option<String>,
    /// Counter family (without `_total`) that counts cloud calls in the manager's metrics.
    #[arg(long, default_value = "cloudprovider_api_requests")]
    cloud_calls_metric: String,
    /// Give up on a run after this many seconds.
    #[arg(long, default_value_t = 1800)]
    timeout_seconds: u64,
    /// Reference rate in Nodes per second for the ratio column (upstream's Go CCM at its
    /// defaults on this setup).
    #[arg(long, default_value_t = 6.7)]
    reference_rate: f64,
    /// Latency of upstream's instance calls (`BENCH_INSTANCE_LATENCY`); match ours' cloud-config.
    #[arg(long, default_value = "20ms")]
    instance_latency: String,
    /// Directory for the managers' logs (default: a temporary directory).
    #[arg(long)]
    log_dir: Option<PathBuf>,
    /// Register Nodes shaped like the real cluster's kubelet Node (`e2e::realistic`: labels,
    /// annotations, conditions, capacity, nodeInfo, 50 images each) instead of minimal ones.
    #[arg(long)]
    realistic: bool,
    /// Instead of registering `--nodes` at once, register this many Nodes one after another
    /// once the manager is up (a warm-up Node initialized first), each after the previous is
    /// initialized and deleted (and half a second has passed), and time each from its creation
    /// reaching a watch to it initialized: the real cluster's time-to-initialized, on any
    /// backend. Upstream's Nodes then keep their own addresses (no `BENCH_INTERNAL_IP`), as on
    /// the real cluster.
    #[arg(long, value_parser = at_least_one)]
    one_at_a_time: Option<usize>,
}

/// What one run measured.
#[derive(Debug, Default)]
struct Outcome {
    label: String,
    nodes: usize,
    seconds: f64,
    cloud_calls: Option<u64>,
    cloud_calls_by_method: BTreeMap<String, u64>,
    node_writes: Option<usize>,
    node_writes_by_kind: BTreeMap<String, usize>,
    event_writes: Option<usize>,
    peak_rss_bytes: Option<u64>,
    backend: &'static str,
    /// The same writes (a metadata and a status patch per Node) by a tight client at its best
    /// concurrency: seconds and that concurrency.
    limit: Option<(f64, usize)>,
    /// Why the run stopped early, if it did.
    failed: Option<String>,
    /// `--one-at-a-time`: seconds from each Node's creation reaching a watch to it initialized.
    joins: Vec<f64>,
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    let log_dir = args
        .log_dir
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join(format!("bench-nodes-{}", std::process::id())));
    std::fs::create_dir_all(&log_dir)?;
    let mut outcomes = Vec::new();
    for run in &args.runs {
        let (label, command) = run.split_once('=').ok_or("--run takes LABEL=COMMAND")?;
        eprintln!("== run {label}: {} Nodes", args.one_at_a_time.unwrap_or(args.nodes));
        // A failed run (a timeout, say) is reported in its row; the other runs go on.
        let outcome = run_once(&args, label, command, &log_dir).await.unwrap_or_else(|e| Outcome {
            label: label.to_string(),
            nodes: args.nodes,
            failed: Some(e.to_string()),
            backend: args.backend.label(args.kubeconfig.as_deref()),
            ..Default::default()
        });
        eprintln!("{}", describe(&outcome, args.reference_rate));
        outcomes.push(outcome);
    }
    println!("{}", table(&outcomes, args.reference_rate));
    eprintln!("manager logs: {}", log_dir.display());
    Ok(())
}

async fn run_once(args: &Args, label: &str, command: &str, log_dir: &Path) -> Result<Outcome, BoxError> {
    // A fresh server per run (local or genuine), or the given cluster with our Nodes recreated.
    let local = match (&args.kubeconfig, args.backend) {
        (None, BackendArg::Local) => Some(TestApiServer::builder().request_log_capacity(1_000_000).start().await?),
        _ => None,
    };
    let plane = match (&args.kubeconfig, args.backend) {
        (None, BackendArg::Genuine) => {
            let assets = testkit::genuine::assets_dir().ok_or("--backend genuine needs CCM_TEST_ASSETS")?;
            Some(tokio::task::block_in_place(|| ControlPlane::start_on_own_thread(assets))?)
        }
        _ => None,
    };
    let (plane, _keep) = match plane {
        Some((p, k)) => (Some(p), Some(k)),
        None => (None, None),
    };
    let backend = args.backend.label(args.kubeconfig.as_deref());
    let (client, kubeconfig) = match (&local, &plane, &args.kubeconfig) {
        (Some(server), _, _) => (server.client(), server.kubeconfig_path().to_path_buf()),
        (None, Some(plane), _) => (plane.admin_client().await?, plane.admin_kubeconfig_path()),
        (None, None, Some(path)) => {
            let config =
                kube::Config::from_custom_kubeconfig(Kubeconfig::read_from(path)?, &KubeConfigOptions::default())
                    .await?;
            (kube::Client::try_from(config)?, path.clone())
        }
        (None, None, None) => unreachable!("one of the three is set"),
    };
    let nodes: Api<Node> = Api::all(client.clone());
    delete_bench_nodes(&nodes).await?;
    if let Some(rounds) = args.one_at_a_time {
        let joins = one_at_a_time(args, label, command, &kubeconfig, &nodes, log_dir, rounds).await?;
        if args.kubeconfig.is_some() {
            delete_bench_nodes(&nodes).await?;
        }
        return Ok(Outcome { label: label.to_string(), nodes: rounds, backend, joins, ..Default::default() });
    }
    create_nodes(&nodes, args.nodes, args.realistic).await?;

    // Watch Nodes the way a controller would; count the tainted ones.
    let (cache, mut changes, watch) = watch_bench_nodes(&nodes).await?;
    let mut tainted: HashSet<String> = cache.state().iter().filter(|n| is_tainted(n)).map(|n| name(n)).collect();
    assert_eq!(tainted.len(), args.nodes, "every created Node starts tainted");

    // The local server's request log, or the genuine server's audit log, from here on.
    let request_log: Option<RequestLog> = match (&local, &plane) {
        (Some(server), _) => Some(server.request_log()),
        (None, Some(plane)) => Some(plane.request_log()),
        _ => None,
    };
    let mark = request_log.as_ref().map(RequestLog::mark);

    let started = Instant::now();
    let (mut child, guard, log_path, metrics_url) = spawn_manager(args, label, command, &kubeconfig, log_dir)?;

    let deadline = started + Duration::from_secs(args.timeout_seconds);
    while !tainted.is_empty() {
        if let Some(status) = child.try_wait()? {
            return Err(format!("manager exited early ({status}); see {}", log_path.display()).into());
        }
        let change = tokio::select! {
            c = changes.recv() => c,
            _ = tokio::time::sleep(Duration::from_millis(500)) => continue,
        };
        match change {
            Some(Change::Applied { new, .. }) => {
                if is_tainted(&new) {
                    tainted.insert(name(&new));
                } else {
                    tainted.remove(&name(&new));
                }
            }
            Some(Change::Deleted(n)) => {
                tainted.remove(&name(&n));
            }
            Some(Change::Resynced) => {
                tainted = cache.state().iter().filter(|n| is_tainted(n)).map(|n| name(n)).collect();
            }
            None => return Err("node watch stopped".into()),
        }
        if Instant::now() > deadline {
            return Err(format!("{} Nodes still tainted after {}s", tainted.len(), args.timeout_seconds).into());
        }
    }
    let seconds = started.elapsed().as_secs_f64();

    let mut outcome = Outcome { label: label.to_string(), nodes: args.nodes, seconds, backend, ..Default::default() };
    // Give in-flight writes that trail the taint removal (none expected) a moment to land.
    tokio::time::sleep(Duration::from_millis(500)).await;
    if let Some(url) = &metrics_url {
        match scrape(url).await {
            Ok(text) => {
                let by_method = sum_counter(&text, &args.cloud_calls_metric);
                outcome.cloud_calls = Some(by_method.values().sum());
                outcome.cloud_calls_by_method = by_method;
            }
            Err(e) => eprintln!("could not scrape {url}: {e}"),
        }
    }
    if let (Some(log), Some(mark)) = (&request_log, mark) {
        let mut by_kind = BTreeMap::new();
        let mut node_writes = 0;
        let mut event_writes = 0;
        let records = log.since(mark);
        let ours = records.iter().filter(|r| {
            r.is_write() && r.field_manager.as_deref() != Some(DRIVER) && r.user.as_deref() != Some("system:apiserver")
        });
        for r in ours {
            match r.resource.as_deref() {
                Some("nodes") => {
                    node_writes += 1;
                    let kind = format!("{} {}", r.verb, r.subresource.as_deref().unwrap_or("node"));
                    *by_kind.entry(kind).or_insert(0) += 1;
                }
                Some(res) if res.starts_with("events") => event_writes += 1,
                _ => {}
            }
        }
        outcome.node_writes = Some(node_writes);
        outcome.node_writes_by_kind = by_kind;
        outcome.event_writes = Some(event_writes);
    }
    outcome.peak_rss_bytes = proc_status_kib(child.id(), "VmHWM:").map(|kib| kib * 1024);
    drop(guard);
    let _ = child.wait();
    watch.abort();
    if !args.no_limit {
        outcome.limit = Some(
            bench::measure_limit("Nodes", args.nodes, |round, i| {
                let api = nodes.clone();
                async move {
                    let name = format!("bench-node-{i:05}");
                    let pp = PatchParams { field_manager: Some(format!("{DRIVER}-limit")), ..Default::default() };
                    let meta = serde_json::json!({"metadata": {"labels": {"bench.ccm.rs/limit": round.to_string()}}});
                    api.patch(&name, &pp, &Patch::Merge(&meta)).await?;
                    let status = serde_json::json!({"status": {"addresses": [
                        {"type": "InternalIP", "address": format!("10.{}.{}.{}", round, i / 256, i % 256)},
                        {"type": "Hostname", "address": name},
                    ]}});
                    api.patch_status(&name, &pp, &Patch::Merge(&status)).await?;
                    Ok(())
                }
            })
            .await?,
        );
    }
    if args.kubeconfig.is_some() {
        delete_bench_nodes(&nodes).await?;
    }
    Ok(outcome)
}

/// `--one-at-a-time`: starts the manager, lets it initialize a warm-up Node, then registers
/// `rounds` Nodes one after another; returns each one's seconds from its creation reaching the
/// watch to its taint gone from it.
async fn one_at_a_time(
    args: &Args,
    label: &str,
    command: &str,
    kubeconfig: &Path,
    nodes: &Api<Node>,
    log_dir: &Path,
    rounds: usize,
) -> Result<Vec<f64>, BoxError> {
    let (cache, mut changes, watch) = watch_bench_nodes(nodes).await?;
    let (mut child, guard, log_path, _) = spawn_manager(args, label, command, kubeconfig, log_dir)?;
    let pp = PostParams { field_manager: Some(DRIVER.into()), ..Default::default() };
    let timeout = Duration::from_secs(args.timeout_seconds);
    let mut joins = Vec::with_capacity(rounds);
    // Round 0 is the warm-up: it waits for the manager's start and is not counted.
    for i in 0..=rounds {
        let name = format!("bench-node-{i:05}");
        nodes.create(&pp, &bench_node(&name, i, args.realistic)?).await?;
        let deadline = Instant::now() + timeout;
        let mut seen: Option<Instant> = None;
        let joined = loop {
            if let Some(status) = child.try_wait()? {
                return Err(format!("manager exited early ({status}); see {}", log_path.display()).into());
            }
            if Instant::now() > deadline {
                return Err(format!("{name} still tainted after {}s", args.timeout_seconds).into());
            }
            let change = tokio::select! {
                c = changes.recv() => c,
                _ = tokio::time::sleep(Duration::from_millis(500)) => continue,
            };
            match change {
                Some(Change::Applied { new, .. }) if self::name(&new) == name => {
                    let at = *seen.get_or_insert_with(Instant::now);
                    if !is_tainted(&new) {
                        break at.elapsed().as_secs_f64();
                    }
                }
                Some(_) => {}
                None => return Err("node watch stopped".into()),
            }
        };
        if i > 0 {
            joins.push(joined);
        }
        nodes.delete(&name, &DeleteParams::default()).await?;
        // The next Node is created only once this one is gone from the manager's view too.
        while cache.get(None, &name).is_some() {
            match changes.recv().await {
                Some(_) => {}
                None => return Err("node watch stopped".into()),
            }
        }
        // Spaced as kubelets join, so neither manager's client rate limit (20 QPS by default;
        // a Node costs a write and an Event) is what gets measured.
        tokio::time::sleep(ROUND_GAP).await;
    }
    watch.abort();
    drop(guard);
    let _ = child.wait();
    Ok(joins)
}

/// The manager's command line for a run (`upstream FLAGS` runs the upstream Go manager with its
/// `bench` provider) and the metrics URL to scrape.
fn manager_command(args: &Args, command: &str, kubeconfig: &Path) -> Result<(Command, Option<String>), BoxError> {
    Ok(match bench::upstream_flags(command) {
        Some(flags) => {
            let args_up: Vec<String> = format!("{UPSTREAM_FLAGS} {flags}").split_whitespace().map(Into::into).collect();
            let mut env = vec![("BENCH_INSTANCE_LATENCY".to_string(), args.instance_latency.clone())];
            // One at a time, Nodes keep their kubelet's addresses, as on the real cluster.
            if args.one_at_a_time.is_none() {
                env.push(("BENCH_INTERNAL_IP".to_string(), "1".to_string()));
            }
            let l = e2e::upstream::Launch::new(kubeconfig, &args_up, &env)?;
            let mut c = Command::new(&l.program);
            c.args(&l.args).envs(l.env.iter().map(|(k, v)| (k, v)));
            (c, Some(format!("http://{}/metrics", l.http)))
        }
        None => {
            let kubeconfig = kubeconfig.to_string_lossy().to_string();
            let argv: Vec<String> =
                command.split_whitespace().map(|a| a.replace("{kubeconfig}", &kubeconfig)).collect();
            let (program, rest) = argv.split_first().ok_or("empty manager command line")?;
            let mut c = Command::new(program);
            c.args(rest);
            (c, args.metrics_url.clone())
        }
    })
}

/// Start a run's manager with its output in `<log_dir>/<label>.log`: the process, the guard
/// that kills it, the log's path and the metrics URL to scrape.
fn spawn_manager(
    args: &Args,
    label: &str,
    command: &str,
    kubeconfig: &Path,
    log_dir: &Path,
) -> Result<(std::process::Child, KillOnDrop, PathBuf, Option<String>), BoxError> {
    let log_path = log_dir.join(format!("{label}.log"));
    let log = std::fs::File::create(&log_path)?;
    let (mut command_line, metrics_url) = manager_command(args, command, kubeconfig)?;
    let child = command_line.stdout(Stdio::from(log.try_clone()?)).stderr(Stdio::from(log)).spawn()?;
    let guard = KillOnDrop(Some(child.id()));
    Ok((child, guard, log_path, metrics_url))
}

/// Kills the manager if the run ends early (error or panic).
struct KillOnDrop(Option<u32>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(pid) = self.0.take() {
            // SIGKILL through kill(1): this crate has no libc binding, and the manager needs no
            // graceful shutdown once measured.
            let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
        }
    }
}

fn name(node: &Node) -> String {
    node.metadata.name.clone().unwrap_or_default()
}

fn is_tainted(node: &Node) -> bool {
    node.spec.as_ref().and_then(|s| s.taints.as_ref()).is_some_and(|ts| ts.iter().any(|t| t.key == UNINITIALIZED))
}

/// A Node as kubelet registers it with `--cloud-provider=external`: host name, Linux, Ready,
/// labelled as the benchmark's; with `realistic`, the real kubelet's whole shape.
fn bench_node(name: &str, i: usize, realistic: bool) -> Result<Node, BoxError> {
    if realistic {
        return Ok(e2e::realistic::node(name, i, &[(BENCH_LABEL, "true")])?);
    }
    Ok(testkit::kubelet_node(name)
        .with_hostname()
        .with_labels(&[("kubernetes.io/os", "linux"), (BENCH_LABEL, "true")])
        .ready())
}

async fn create_nodes(api: &Api<Node>, count: usize, realistic: bool) -> Result<(), BoxError> {
    const IN_FLIGHT: usize = 64;
    let sample = bench_node("bench-node-00000", 0, realistic)?;
    eprintln!(
        "Node objects as sent: {} bytes of JSON each ({}), {} images",
        e2e::realistic::json_bytes(&sample),
        if realistic { "the real kubelet's shape" } else { "minimal" },
        sample.status.as_ref().and_then(|s| s.images.as_ref()).map_or(0, Vec::len)
    );
    let started = Instant::now();
    let pp = Arc::new(PostParams { field_manager: Some(DRIVER.into()), ..Default::default() });
    let mut tasks = JoinSet::new();
    for i in 0..count {
        if tasks.len() >= IN_FLIGHT
            && let Some(done) = tasks.join_next().await
        {
            done??;
        }
        let (api, pp) = (api.clone(), pp.clone());
        let node = bench_node(&format!("bench-node-{i:05}"), i, realistic)?;
        tasks.spawn(async move { api.create(&pp, &node).await.map(|_| ()) });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    eprintln!("registered {count} Nodes in {:.1}s", started.elapsed().as_secs_f64());
    Ok(())
}

async fn delete_bench_nodes(api: &Api<Node>) -> Result<(), BoxError> {
    let existing = api.list_metadata(&ListParams::default().labels(BENCH_LABEL)).await?;
    for n in existing.items {
        if let Some(name) = n.metadata.name {
            let _ = api.delete(&name, &DeleteParams::default()).await;
        }
    }
    Ok(())
}

/// GET a metrics URL and return the body: `https://` (the manager's default; its self-signed
/// certificate is not verified) or plain `http://` (blocking I/O).
async fn scrape(url: &str) -> Result<String, BoxError> {
    if let Some(rest) = url.strip_prefix("https://") {
        let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        let addr: std::net::SocketAddr = authority.parse()?;
        let path = if path.is_empty() { "/" } else { path };
        let r =
            ccm_framework::serving::probe::get(addr, path, None, Duration::from_secs(10)).await.ok_or("no answer")?;
        return if r.status == 200 { Ok(r.body) } else { Err(format!("HTTP {}", r.status).into()) };
    }
    let url = url.to_string();
    tokio::task::spawn_blocking(move || scrape_blocking(&url)).await?
}

fn scrape_blocking(url: &str) -> Result<String, BoxError> {
    use std::io::{Read, Write};
    let rest = url.strip_prefix("http://").ok_or("only http:// metrics URLs are supported")?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let mut stream = std::net::TcpStream::connect(authority)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: {authority}\r\nConnection: close\r\n\r\n").as_bytes())?;
    let mut body = String::new();
    stream.read_to_string(&mut body)?;
    let (head, body) = body.split_once("\r\n\r\n").ok_or("malformed HTTP response")?;
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        return Err(head.lines().next().unwrap_or_default().to_string().into());
    }
    Ok(body.to_string())
}

/// Sum a counter family's `_total` samples by their `method` label (or `all`).
fn sum_counter(text: &str, family: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let prefix = format!("{family}_total");
    for line in text.lines().filter(|l| l.starts_with(&prefix)) {
        let Some((series, value)) = line.rsplit_once(' ') else { continue };
        let Ok(value) = value.parse::<f64>() else { continue };
        let method = series
            .split_once("method=\"")
            .and_then(|(_, rest)| rest.split_once('"'))
            .map(|(m, _)| m.to_string())
            .unwrap_or_else(|| "all".to_string());
        *out.entry(method).or_insert(0) += value as u64;
    }
    out
}

fn mib(bytes: Option<u64>) -> String {
    bytes.map(|b| format!("{:.1}", b as f64 / (1024.0 * 1024.0))).unwrap_or_else(|| "n/a".into())
}

fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map(|v| v.to_string()).unwrap_or_else(|| "n/a".into())
}

fn describe(o: &Outcome, reference: f64) -> String {
    if !o.joins.is_empty() {
        let (mean, median, min, max) = spread(&o.joins);
        return format!(
            "{}: {} Nodes one at a time, creation to initialized: mean {mean:.4}s, median {median:.4}s, min {min:.4}s, max {max:.4}s [{} backend]",
            o.label,
            o.joins.len(),
            o.backend
        );
    }
    let rate = o.nodes as f64 / o.seconds;
    let mut s = format!(
        "{}: {} Nodes in {:.2}s ({:.1} Nodes/s, {:.2}x reference); cloud calls {} {:?}; node writes {} {:?}; event writes {}; peak RSS {} MiB",
        o.label,
        o.nodes,
        o.seconds,
        rate,
        rate / reference,
        opt(o.cloud_calls),
        o.cloud_calls_by_method,
        opt(o.node_writes),
        o.node_writes_by_kind,
        opt(o.event_writes),
        mib(o.peak_rss_bytes),
    );
    if let Some(w) = o.node_writes {
        let _ = write!(s, "; {:.2} node writes per Node", w as f64 / o.nodes as f64);
    }
    if let Some(why) = &o.failed {
        let _ = write!(s, "; FAILED: {why}");
    }
    if let Some((limit, c)) = o.limit {
        let _ = write!(s, "; API server limit {limit:.2}s at concurrency {c} ({:.2}x of it)", o.seconds / limit);
    }
    let _ = write!(s, " [{} backend]", o.backend);
    s
}

/// Start a watch on the bench Nodes and wait for its first list. The token type is
/// tokio-util's, not a dependency here: the caller stops the watch by aborting the task.
async fn watch_bench_nodes(
    nodes: &Api<Node>,
) -> Result<(Cache<Node>, Subscription<Node>, tokio::task::JoinHandle<()>), BoxError> {
    let (cache, writer) = Cache::<Node>::new();
    let changes = cache.subscribe();
    let watch = tokio::spawn(run_watch(
        nodes.clone(),
        watcher::Config::default().labels(BENCH_LABEL),
        writer,
        Default::default(),
    ));
    if !cache.wait_until_ready().await {
        return Err("node watch stopped".into());
    }
    Ok((cache, changes, watch))
}

/// `--one-at-a-time` times at least one Node.
fn at_least_one(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

/// Mean, median, min and max of a non-empty sample.
fn spread(xs: &[f64]) -> (f64, f64, f64, f64) {
    let mut sorted = xs.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mean = sorted.iter().sum::<f64>() / sorted.len() as f64;
    let mid = sorted.len() / 2;
    let median = if sorted.len().is_multiple_of(2) { (sorted[mid - 1] + sorted[mid]) / 2.0 } else { sorted[mid] };
    (mean, median, sorted[0], sorted[sorted.len() - 1])
}

fn table(outcomes: &[Outcome], reference: f64) -> String {
    if outcomes.iter().any(|o| !o.joins.is_empty()) {
        let mut s = String::from(
            "| run | backend | Nodes, one at a time | creation to initialized: mean (s) | median (s) | min (s) | max (s) |\n|---|---|---|---|---|---|---|\n",
        );
        for o in outcomes {
            if let Some(why) = &o.failed {
                let _ = writeln!(s, "| {} | {} | {} | failed: {why} |", o.label, o.backend, o.nodes);
                continue;
            }
            let (mean, median, min, max) = spread(&o.joins);
            let _ = writeln!(
                s,
                "| {} | {} | {} | {mean:.4} | {median:.4} | {min:.4} | {max:.4} |",
                o.label,
                o.backend,
                o.joins.len()
            );
        }
        return s;
    }
    let mut s = String::from(
        "| run | backend | Nodes | time to all initialized (s) | API server limit (s) | x limit | Nodes/s | x reference | cloud calls | node writes per Node | node writes by verb | event writes | peak RSS (MiB) |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for o in outcomes {
        if let Some(why) = &o.failed {
            let _ = writeln!(s, "| {} | {} | {} | failed: {why} |", o.label, o.backend, o.nodes);
            continue;
        }
        let by_verb = o.node_writes_by_kind.iter().map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join(", ");
        let rate = o.nodes as f64 / o.seconds;
        let per_node = o.node_writes.map(|w| format!("{:.2}", w as f64 / o.nodes as f64));
        let _ = writeln!(
            s,
            "| {} | {} | {} | {:.2} | {} | {} | {:.1} | {:.2} | {} | {} | {} | {} | {} |",
            o.label,
            o.backend,
            o.nodes,
            o.seconds,
            opt(o.limit.map(|(l, _)| format!("{l:.2}"))),
            opt(o.limit.map(|(l, _)| format!("{:.2}", o.seconds / l))),
            rate,
            rate / reference,
            opt(o.cloud_calls),
            opt(per_node),
            by_verb,
            opt(o.event_writes),
            mib(o.peak_rss_bytes),
        );
    }
    s
}
