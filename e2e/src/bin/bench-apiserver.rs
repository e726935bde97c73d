//! Benchmark of the local test API server (not a timed test; results go to docs/benchmarks.md).
//!
//! Starts the server as a child process (so its RSS is its own), opens watches, creates Nodes
//! and LoadBalancer Services concurrently, checks every watch saw every object, and times full
//! lists of the Nodes.
//!
//! ```sh
//! cargo run --release -p e2e --bin bench-apiserver
//! cargo run --release -p e2e --bin bench-apiserver -- --nodes 10000 --services 2000 --watches 50
//! ```

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use e2e::bench::{BoxError, ChildGuard};
use futures::{StreamExt, TryStreamExt};
use http_body_util::BodyExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use memory_apiserver::{RemoteControl, TestApiServer};
use serde_json::json;

/// Benchmarks the local test API server.
#[derive(Debug, Parser)]
#[command(name = "bench-apiserver")]
struct Args {
    /// Nodes to create.
    #[arg(long, default_value_t = 10_000)]
    nodes: usize,
    /// LoadBalancer Services to create.
    #[arg(long, default_value_t = 2_000)]
    services: usize,
    /// Concurrent watches (four fifths on Nodes, the rest on Services).
    #[arg(long, default_value_t = 50)]
    watches: usize,
    /// Concurrent create requests.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Timed full lists of the Nodes.
    #[arg(long, default_value_t = 10)]
    list_runs: usize,
    /// Keep the server running this many seconds after the run (to poke at it with curl).
    #[arg(long, default_value_t = 0)]
    hold: u64,
    /// Internal: run only the server and print its URL.
    #[arg(long, hide = true)]
    serve: bool,
}

fn node(i: usize) -> serde_json::Value {
    let name = format!("node-{i:05}");
    let conditions: Vec<serde_json::Value> =
        ["Ready", "MemoryPressure", "DiskPressure", "PIDPressure", "NetworkUnavailable"]
            .iter()
            .map(|t| {
                json!({
                    "type": t, "status": if *t == "Ready" { "True" } else { "False" },
                    "lastHeartbeatTime": "2025-01-01T00:00:00Z", "lastTransitionTime": "2025-01-01T00:00:00Z",
                    "reason": "KubeletReady", "message": "kubelet is posting ready status",
                })
            })
            .collect();
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "node.kubernetes.io/instance-type": "m5.large",
                "topology.kubernetes.io/zone": format!("zone-{}", i % 3),
                "bench/shard": format!("s{}", i % 10),
            },
        },
        "spec": {
            "providerID": format!("bench://{name}"),
            "podCIDR": format!("10.{}.{}.0/24", 100 + i / 256 % 100, i % 256),
            "taints": [{"key": "node.cloudprovider.kubernetes.io/uninitialized", "value": "true", "effect": "NoSchedule"}],
        },
        "status": {
            "addresses": [{"type": "InternalIP", "address": format!("192.168.{}.{}", i / 256 % 256, i % 256)}, {"type": "Hostname", "address": name}],
            "capacity": {"cpu": "2", "memory": "8Gi", "pods": "110", "ephemeral-storage": "100Gi"},
            "allocatable": {"cpu": "1900m", "memory": "7.5Gi", "pods": "110", "ephemeral-storage": "90Gi"},
            "conditions": conditions,
            "nodeInfo": {
                "machineID": "0", "systemUUID": "0", "bootID": "0", "kernelVersion": "6.1.0", "osImage": "Debian GNU/Linux 12",
                "containerRuntimeVersion": "containerd://1.7.0", "kubeletVersion": "v1.33.0", "kubeProxyVersion": "v1.33.0",
                "operatingSystem": "linux", "architecture": "amd64",
            },
        },
    })
}

fn service(i: usize) -> serde_json::Value {
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": format!("svc-{i:05}"), "namespace": "default", "labels": {"app": format!("app-{i}")}},
        "spec": {"type": "LoadBalancer", "selector": {"app": format!("app-{i}")}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]},
    })
}

fn config_map(i: usize) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": format!("cm-{i:05}")}, "data": {"key": "value"}})
}

/// POSTs `n` objects to `path` with `concurrency` requests in flight; returns the elapsed time.
/// Bodies are serialized before the clock starts and responses are not parsed, so the client
/// spends little of the CPU the server is measured on.
async fn create_all(
    client: &kube::Client,
    path: &str,
    n: usize,
    concurrency: usize,
    make: fn(usize) -> serde_json::Value,
) -> Result<Duration, BoxError> {
    let bodies: Vec<Vec<u8>> = (0..n).map(|i| serde_json::to_vec(&make(i))).collect::<Result<_, _>>()?;
    let start = Instant::now();
    futures::stream::iter(bodies)
        .map(|body| {
            let client = client.clone();
            async move {
                let req = http::Request::post(path).header("content-type", "application/json").body(body)?;
                client.request_text(req).await?;
                Ok::<(), BoxError>(())
            }
        })
        .buffer_unordered(concurrency)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(start.elapsed())
}

/// GETs `path` over a fresh plain TCP connection, reading to the end (what curl measures).
async fn raw_get(addr: String, path: String) -> Result<(Duration, usize), BoxError> {
    tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let mut sock = std::net::TcpStream::connect(&addr)?;
        sock.set_nodelay(true)?;
        let start = Instant::now();
        sock.write_all(format!("GET {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n").as_bytes())?;
        let mut buf = Vec::with_capacity(64 << 20);
        sock.read_to_end(&mut buf)?;
        Ok::<_, BoxError>((start.elapsed(), buf.len()))
    })
    .await?
}

/// Counts events on a raw watch stream (one JSON line each). Counting lines instead of
/// deserializing keeps the 50 clients from using the CPU the server is being measured on.
fn spawn_watch(client: kube::Client, path: String, seen: Arc<AtomicUsize>) {
    tokio::spawn(async move {
        let Ok(req) = http::Request::get(path).body(kube::client::Body::from(Vec::new())) else { return };
        let Ok(res) = client.send(req).await else { return };
        let mut data = res.into_body().into_data_stream();
        while let Some(Ok(chunk)) = data.next().await {
            seen.fetch_add(chunk.iter().filter(|b| **b == b'\n').count(), Ordering::Relaxed);
        }
    });
}

async fn wait_for(counters: &[Arc<AtomicUsize>], want: usize) -> Duration {
    let start = Instant::now();
    while counters.iter().any(|c| c.load(Ordering::Relaxed) < want) && start.elapsed() < Duration::from_secs(120) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    start.elapsed()
}

fn mib(b: Option<u64>) -> f64 {
    b.unwrap_or(0) as f64 / (1024.0 * 1024.0)
}

fn stats(mut v: Vec<Duration>) -> String {
    v.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    format!("min {:.1} ms, median {:.1} ms, max {:.1} ms", ms(v[0]), ms(v[v.len() / 2]), ms(v[v.len() - 1]))
}

async fn serve() -> Result<(), BoxError> {
    let server = TestApiServer::builder().event_history_size(20_000).request_log_capacity(1_000).start().await?;
    println!("{}", server.url());
    // Run until the parent closes our stdin.
    tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        while std::io::stdin().read_line(&mut line).map(|n| n > 0).unwrap_or(false) {}
    })
    .await?;
    server.shutdown().await;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    if args.serve {
        return serve().await;
    }
    let mut child =
        Command::new(std::env::current_exe()?).arg("--serve").stdin(Stdio::piped()).stdout(Stdio::piped()).spawn()?;
    let stdout = child.stdout.take().ok_or("no child stdout")?;
    let _guard = ChildGuard(child);
    let mut url = String::new();
    BufReader::new(stdout).read_line(&mut url)?;
    let client = kube::Client::try_from(kube::Config::new(url.trim().parse()?))?;
    let control = RemoteControl::new(client.clone());
    let base = control.stats().await?;

    let nodes: Api<Node> = Api::all(client.clone());
    let rv = base.resource_version.to_string();
    let node_watches = args.watches * 4 / 5;
    let node_seen: Vec<Arc<AtomicUsize>> = (0..node_watches).map(|_| Arc::new(AtomicUsize::new(0))).collect();
    let svc_seen: Vec<Arc<AtomicUsize>> = (node_watches..args.watches).map(|_| Arc::new(AtomicUsize::new(0))).collect();
    for c in &node_seen {
        spawn_watch(
            client.clone(),
            format!("/api/v1/nodes?watch=true&resourceVersion={rv}&timeoutSeconds=290"),
            c.clone(),
        );
    }
    for c in &svc_seen {
        let path = format!("/api/v1/namespaces/default/services?watch=true&resourceVersion={rv}&timeoutSeconds=290");
        spawn_watch(client.clone(), path, c.clone());
    }
    while control.stats().await?.open_watches < args.watches {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let t_nodes = create_all(&client, "/api/v1/nodes", args.nodes, args.concurrency, node).await?;
    let fanout_nodes = wait_for(&node_seen, args.nodes).await;
    let after_nodes = control.stats().await?;
    let t_svcs =
        create_all(&client, "/api/v1/namespaces/default/services", args.services, args.concurrency, service).await?;
    let fanout_svcs = wait_for(&svc_seen, args.services).await;
    let after_svcs = control.stats().await?;

    let complete = node_seen.iter().all(|c| c.load(Ordering::Relaxed) == args.nodes)
        && svc_seen.iter().all(|c| c.load(Ordering::Relaxed) == args.services);

    let addr = url.trim().trim_start_matches("http://").to_string();
    let mut raw = vec![];
    let mut bytes = 0;
    for _ in 0..args.list_runs {
        let (t, n) = raw_get(addr.clone(), "/api/v1/nodes".into()).await?;
        raw.push(t);
        bytes = n;
    }
    let mut typed = vec![];
    let mut count = 0;
    for _ in 0..args.list_runs {
        let t = Instant::now();
        count = nodes.list(&ListParams::default()).await?.items.len();
        typed.push(t.elapsed());
    }
    let mut selected = vec![];
    for _ in 0..args.list_runs {
        let t = Instant::now();
        nodes.list(&ListParams::default().labels("bench/shard=s3")).await?;
        selected.push(t.elapsed());
    }
    let objects = after_svcs.objects - base.objects;
    let rss_delta = after_svcs.rss_bytes.unwrap_or(0).saturating_sub(base.rss_bytes.unwrap_or(0));
    // Small objects no watch is interested in: the create path on its own.
    let t_cms =
        create_all(&client, "/api/v1/namespaces/default/configmaps", args.nodes / 2, args.concurrency, config_map)
            .await?;

    println!("## bench-apiserver results");
    println!();
    println!(
        "- creates: {} Nodes in {:.2} s = {:.0}/s; {} Services (LoadBalancer) in {:.2} s = {:.0}/s ({} in flight)",
        args.nodes,
        t_nodes.as_secs_f64(),
        args.nodes as f64 / t_nodes.as_secs_f64(),
        args.services,
        t_svcs.as_secs_f64(),
        args.services as f64 / t_svcs.as_secs_f64(),
        args.concurrency
    );
    println!(
        "- watches: {} open ({} on Nodes, {} on Services); every watch saw every object: {}; last event delivered {:.0} ms / {:.0} ms after the last create",
        args.watches,
        node_watches,
        args.watches - node_watches,
        if complete { "yes" } else { "NO" },
        fanout_nodes.as_secs_f64() * 1000.0,
        fanout_svcs.as_secs_f64() * 1000.0
    );
    println!(
        "- creates without watchers: {} ConfigMaps in {:.2} s = {:.0}/s",
        args.nodes / 2,
        t_cms.as_secs_f64(),
        (args.nodes / 2) as f64 / t_cms.as_secs_f64()
    );
    println!(
        "- list {count} Nodes, plain HTTP/1.1 GET read to the end ({:.1} MiB): {}",
        bytes as f64 / (1024.0 * 1024.0),
        stats(raw)
    );
    println!("- list {count} Nodes, typed (kube Api::list, includes deserialization): {}", stats(typed));
    println!("- list with label selector (1/10 of the Nodes): {}", stats(selected));
    println!(
        "- server RSS: {:.1} MiB at start, {:.1} MiB with {} Nodes, {:.1} MiB with {} Nodes + {} Services; {:.1} KiB per object",
        mib(base.rss_bytes),
        mib(after_nodes.rss_bytes),
        args.nodes,
        mib(after_svcs.rss_bytes),
        args.nodes,
        args.services,
        rss_delta as f64 / 1024.0 / objects.max(1) as f64
    );
    if args.hold > 0 {
        println!("server at {} for {} s", url.trim(), args.hold);
        tokio::time::sleep(Duration::from_secs(args.hold)).await;
    }
    if !complete {
        return Err("some watches missed events".into());
    }
    Ok(())
}
