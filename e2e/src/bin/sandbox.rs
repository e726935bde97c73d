//! The sandbox: try ccm-operator on one machine, with no cluster.
//!
//! ```sh
//! cargo run -p e2e --bin sandbox                      # the demo, Embedded mode, http://127.0.0.1:8080
//! cargo run -p e2e --bin sandbox -- --mode deployment # manager replicas as local processes
//! cargo run -p e2e --bin sandbox -- --server-only     # just the API server with the CRD
//! ```
//!
//! The demo starts the local API server, installs the CRD, runs the operator in this process,
//! registers simulated Nodes, applies a baremetal CloudControllerManager and a LoadBalancer
//! Service, prints progress and the final picture, then keeps serving until Ctrl-C with a live
//! log: one line per change in the cluster (leader, processes, rollouts, Nodes, Services).
//! Deployment mode runs the `cloud-controller-manager` binary found next to this one; it builds
//! nothing itself.

use std::io::Write;
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use e2e::demo::{self, Demo, DemoMode, DemoOptions};
use memory_apiserver::Sandbox;
use tracing_subscriber::EnvFilter;

/// How long the demo may take to reach its final picture before the sandbox says so (and keeps
/// serving for inspection).
const DEMO_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    /// The manager's controllers run inside the operator.
    Embedded,
    /// A manager Deployment; the sandbox plays the kubelet and runs its replicas as processes.
    Deployment,
}

/// A local Kubernetes API server with ccm-operator and a simulated baremetal cluster.
#[derive(Debug, Parser)]
#[command(name = "sandbox")]
struct Args {
    /// Which way the demo runs the cloud-controller-manager.
    #[arg(long, value_enum, default_value = "embedded")]
    mode: Mode,
    /// Manager replicas in Deployment mode.
    #[arg(long, default_value_t = 2)]
    replicas: i32,
    /// Only the API server with the CRD: no operator, no demo objects.
    #[arg(long)]
    server_only: bool,
    /// Port to listen on; 0 picks a free one.
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    address: IpAddr,
    /// Where to write the kubeconfig (default: <temp dir>/ccm-operator-sandbox-<pid>/kubeconfig).
    /// It is removed when the sandbox stops.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Do not install the CloudControllerManager CRD (with --server-only).
    #[arg(long, requires = "server_only")]
    no_crds: bool,
    /// The cloud-controller-manager binary for Deployment mode (default: the one next to this
    /// executable).
    #[arg(long)]
    manager_binary: Option<PathBuf>,
    /// Second octet N of the loopback addresses the demo uses: load-balancer pool
    /// 127.N.0.240/28, Nodes 127.N.1.11-13. Give two sandboxes different values to run both.
    #[arg(long, default_value_t = 0)]
    loopback_net: u8,
}

/// Wait for Ctrl-C or SIGTERM.
async fn stop_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}

fn say(started: Instant, line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "[{:>5.1}s] {line}", started.elapsed().as_secs_f64());
    let _ = out.flush();
}

fn instructions(kubeconfig: &str, mode: DemoMode, demo: &Demo, url: Option<&str>) -> String {
    let mut s = match url {
        Some(url) => format!(
            "The Service carries traffic: the manager's data path forwards its external IP to the Nodes' nodePorts,\n\
             where each emulated Node answers with its name:\n\n\
             \x20 curl {url}\n\n"
        ),
        None => String::new(),
    };
    s.push_str(&format!(
        "The sandbox keeps serving until Ctrl-C. In another shell:\n\n\
         \x20 export KUBECONFIG={kubeconfig}\n\
         \x20 kubectl get ccm,nodes,svc -A\n\
         \x20 kubectl -n {ns} get ccm {cr} -o jsonpath='{{range .status.conditions[*]}}{{.type}}={{.status}} {{.reason}}{{\"\\n\"}}{{end}}'\n\
         \x20 kubectl get nodes -o wide --show-labels\n\
         \x20 kubectl -n {ns} get lease {cr} -o jsonpath='{{.spec.holderIdentity}}{{\"\\n\"}}'\n\n\
         A port added to the Service answers within seconds (the live log below says so):\n\n\
         \x20 kubectl patch svc {svc} --type=json -p '[{{\"op\":\"add\",\"path\":\"/spec/ports/-\",\"value\":{{\"name\":\"alt\",\"port\":{alt},\"targetPort\":8080}}}}]'\n\n\
         Another LoadBalancer Service gets the next address of {pool}:\n\n\
         \x20 kubectl create service loadbalancer demo2 --tcp={alt}:8080 --dry-run=client -o yaml | kubectl apply --server-side -f -\n\
         \x20 kubectl get svc demo2     # then: curl http://<its EXTERNAL-IP>:{alt}/\n",
        ns = demo::NAMESPACE,
        cr = demo::CR_NAME,
        svc = demo::SERVICE_NAME,
        alt = demo::SERVICE_PORT + 1,
        pool = demo.pool(),
    ));
    if mode == DemoMode::Deployment
        && let Some(kubelet) = demo.kubelet()
    {
        let endpoint = kubelet
            .pods()
            .into_iter()
            .find(|p| !p.terminating)
            .map_or_else(|| "127.0.0.1:<port>".to_string(), |p| p.address().to_string());
        s.push_str(&format!(
            "\nDeployment mode: each replica is a local cloud-controller-manager process (table above).\n\
             \x20 curl -sk https://{endpoint}/metrics | grep leader_election_master_status\n\
             \x20 curl -sk 'https://{endpoint}/healthz?verbose'\n\
             \x20 kill <pid of the leader>   # the other replica takes the Lease; the process is restarted\n\n\
             Rotating the cloud-config rolls the processes one at a time:\n\n\
             \x20 kubectl -n {ns} get secret {secret} -o jsonpath='{{.data.{key_escaped}}}' | base64 -d > /tmp/cloud.yaml\n\
             \x20 echo '# rotated' >> /tmp/cloud.yaml\n\
             \x20 kubectl -n {ns} create secret generic {secret} --from-file={key}=/tmp/cloud.yaml --dry-run=client -o yaml | kubectl apply --server-side -f -\n\n\
             Process logs: {logs}\n",
            ns = demo::NAMESPACE,
            secret = demo::SECRET_NAME,
            key = demo::SECRET_KEY,
            key_escaped = demo::SECRET_KEY.replace('.', "\\."),
            logs = kubelet.work_dir().join("logs").display(),
        ));
    }
    s.push_str("\nkubectl create sends protobuf, which the sandbox does not take: pipe --dry-run=client -o yaml into kubectl apply --server-side, as above.\nPress Ctrl-C to stop (manager processes, the kubeconfig and temporary files are removed).\n");
    s
}

/// Why the sandbox cannot listen on `address:port`, if it cannot (checked before anything starts).
fn port_problem(address: IpAddr, port: u16) -> Option<String> {
    match std::net::TcpListener::bind((address, port)) {
        Ok(_) => None,
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => Some(format!(
            "{} is already in use (another sandbox, or another server?); \
             pass --port <n> for another port, or --port 0 for a free one",
            std::net::SocketAddr::new(address, port)
        )),
        Err(e) => Some(format!("cannot listen on {}: {e}", std::net::SocketAddr::new(address, port))),
    }
}

/// The kubeconfig this run writes, and removes when it stops.
struct KubeconfigFile {
    path: PathBuf,
    /// The per-run directory made for it (removed too), when the path was not given.
    own_dir: Option<PathBuf>,
}

impl KubeconfigFile {
    fn new(given: Option<PathBuf>) -> Self {
        match given {
            Some(path) => Self { path, own_dir: None },
            None => {
                let dir = std::env::temp_dir().join(format!("ccm-operator-sandbox-{}", std::process::id()));
                Self { path: dir.join("kubeconfig"), own_dir: Some(dir) }
            }
        }
    }
}

impl Drop for KubeconfigFile {
    fn drop(&mut self) {
        // It points at a server that is gone: leave nothing that looks usable.
        let _ = std::fs::remove_file(&self.path);
        if let Some(dir) = &self.own_dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// "built 3 min ago", from a file's modification time.
fn built_ago(path: &std::path::Path) -> String {
    let age = std::fs::metadata(path).and_then(|m| m.modified()).ok().and_then(|t| t.elapsed().ok());
    match age.map(|a| a.as_secs()) {
        Some(s) if s < 120 => format!("built {s}s ago"),
        Some(s) if s < 7200 => format!("built {} min ago", s / 60),
        Some(s) => format!("built {} h ago", s / 3600),
        None => "build time unknown".into(),
    }
}

async fn run(args: Args) -> Result<(), String> {
    let started = Instant::now();
    if let Some(problem) = port_problem(args.address, args.port) {
        return Err(problem);
    }
    let mode = match args.mode {
        Mode::Embedded => DemoMode::Embedded,
        Mode::Deployment => DemoMode::Deployment,
    };
    // Deployment mode needs the manager binary: find it before starting anything.
    let manager_binary = match (mode, args.server_only, args.manager_binary) {
        (DemoMode::Deployment, false, None) => Some(e2e::kubelet::manager_binary().map_err(|e| e.to_string())?),
        (_, _, given) => given,
    };
    let kubeconfig_file = KubeconfigFile::new(args.kubeconfig);
    let address = args.address;
    let mut builder = Sandbox::builder()
        .port(args.port)
        .kubeconfig_path(&kubeconfig_file.path)
        .server(move |s| s.bind_address(address));
    if !args.no_crds {
        builder = builder.crd(crds::crd());
    }
    let sandbox = builder.start().await.map_err(|e| {
        let text = e.to_string();
        if text.contains("Address already in use") {
            format!("{address}:{} is already in use; pass --port <n>, or --port 0 for a free one", args.port)
        } else {
            format!("starting the API server: {text}")
        }
    })?;
    let kubeconfig = sandbox.server().kubeconfig_path().display().to_string();
    if args.server_only {
        println!("{}", sandbox.usage());
        stop_signal().await;
        sandbox.shutdown().await;
        drop(kubeconfig_file);
        println!("sandbox stopped; removed {kubeconfig}");
        return Ok(());
    }
    say(
        started,
        &format!(
            "local API server on {} (kubeconfig {kubeconfig}, removed on exit); CloudControllerManager CRD installed",
            sandbox.server().url()
        ),
    );
    if let Some(binary) = &manager_binary {
        say(started, &format!("manager binary: {} ({})", binary.display(), built_ago(binary)));
    }
    say(started, "starting the operator in this process (it waits for its CRD and takes its Lease)...");
    let options =
        DemoOptions { mode, replicas: args.replicas, manager_binary, work_root: None, loopback_net: args.loopback_net };
    let progress = move |line: &str| say(started, line);
    let demo =
        match Demo::start(sandbox.server().client(), sandbox.server().kubeconfig_path(), options, &progress).await {
            Ok(d) => d,
            Err(e) => {
                sandbox.shutdown().await;
                return Err(format!("starting the demo: {e}"));
            }
        };
    say(started, "waiting for the operator and the manager to initialize the Nodes and the Service...");
    let outcome = tokio::select! {
        r = demo.wait_until_complete(DEMO_TIMEOUT, &progress) => Some(r),
        _ = stop_signal() => None,
    };
    match outcome {
        None => {
            stop(started, demo, sandbox).await;
            return Ok(());
        }
        Some(Ok(_)) => {
            say(started, "done: every Node initialized, the Service has an external IP, the resource is Ready")
        }
        Some(Err(e)) => say(started, &format!("not there yet ({e}); the sandbox keeps serving so you can look")),
    }
    // The live log starts from what the picture shows.
    let since = demo.world().await.unwrap_or_default();
    let url = match demo.snapshot().await {
        Ok(snap) => {
            let pods = demo.kubelet().map(e2e::kubelet::Kubelet::pods).unwrap_or_default();
            println!("\n{}", snap.picture(&pods));
            snap.url()
        }
        Err(e) => {
            println!("\n(could not read the picture: {e})");
            None
        }
    };
    println!("{}", instructions(&kubeconfig, mode, &demo, url.as_deref()));
    say(started, "live log: one line per change in the cluster (leader, processes, rollouts, Nodes, Services)");
    tokio::select! {
        _ = demo.follow(since, &progress) => {}
        _ = stop_signal() => {}
    }
    stop(started, demo, sandbox).await;
    Ok(())
}

/// Stop the demo (manager processes get SIGTERM, engines release their Leases), then the server.
async fn stop(started: Instant, demo: Demo, sandbox: Sandbox) {
    say(started, "stopping: manager processes and the operator first, then the API server...");
    demo.shutdown().await;
    sandbox.shutdown().await;
    say(started, "stopped");
}

fn main() -> ExitCode {
    let args = Args::parse();
    // The demo prints its own progress on stdout; logs (stderr) only say what went wrong.
    let default = if args.server_only { "info" } else { "warn" };
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default)))
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: could not start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}
