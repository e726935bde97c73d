//! A real Kubernetes cluster for tests: etcd, kube-apiserver, kube-controller-manager and
//! kube-scheduler, and a node made of containerd (runc, the CNI bridge plugin), a kubelet with
//! `--cloud-provider=external` and kube-proxy in iptables mode. [`RealCluster::add_node`] adds
//! Nodes, each with its own containerd, kubelet and kube-proxy in a network namespace of its
//! own on a host bridge (the segment), which a client and a router namespace join too; Nodes
//! added so can be stopped abruptly and started again.
//!
//! `CCM_REALCLUSTER_ASSETS` names a directory holding the Kubernetes binaries
//! (`e2e/realcluster/setup.sh` prepares it); containerd, runc, the CNI plugins and iptables come
//! from the host. One cluster serves a whole test binary. It needs root: it creates a bridge,
//! iptables rules, mounts and cgroups. [`RealCluster::stop`] puts the host back and reports
//! what still differs from the [`host::Snapshot`] taken before the start; a run that was
//! killed is cleaned up by the next start.

mod cgroup;
pub mod holders;
pub mod host;
pub mod images;
pub mod netns;
pub mod node;
mod pki;
mod process;
pub mod router;
pub mod traffic;

use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use node::NodePlan;
use process::{Launcher, stop_components, wait_for};

use crate::Error;

/// The environment variable naming the assets directory.
pub const ASSETS_ENV: &str = "CCM_REALCLUSTER_ASSETS";

/// The one line printed when the real-cluster scenarios are skipped.
pub const HOW_TO_ENABLE: &str = "real-cluster runs skipped: as root, set CCM_REALCLUSTER_ASSETS to the directory \
     `bash e2e/realcluster/setup.sh` prints (README: Testing on a real cluster)";

/// The binaries the assets directory must hold.
pub const BINARIES: &[&str] = &[
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubelet",
    "kube-proxy",
    "kubectl",
    "pause",
    "rc-cri",
];

/// Host commands the node needs (Debian packages containerd, runc, iptables, iproute2).
const HOST_COMMANDS: &[&str] = &["containerd", "ctr", "runc", "iptables", "ip"];
/// Where Debian's containernetworking-plugins puts the CNI plugins.
const CNI_DIRS: &[&str] = &["/usr/lib/cni", "/opt/cni/bin"];
/// Pid files, containerd's state and socket, saved kernel settings. Short: a unix socket path
/// holds at most 107 bytes.
const RUN_DIR: &str = "/run/ccm-realcluster";
/// The comment on the harness's own FORWARD rules, so teardown removes exactly those.
const RULE_COMMENT: &str = "ccm-realcluster";

/// Where the assets are, if configured; [`RealCluster::preflight`] checks what they hold.
pub fn assets_dir() -> Option<PathBuf> {
    let dir = PathBuf::from(std::env::var_os(ASSETS_ENV).filter(|v| !v.is_empty())?);
    Some(dir)
}

/// Addresses of the cluster's network.
#[derive(Debug, Clone)]
pub struct Network {
    /// The Linux bridge the host's Node's pods attach to; its address is that node's.
    pub bridge: String,
    /// The host's Node's address (first of the pod range, the bridge's).
    pub node_ip: Ipv4Addr,
    /// The prefix length of each Node's pod range.
    pub pod_prefix: u8,
    /// The Service range.
    pub service_cidr: String,
    /// The `kubernetes` Service's address (first of the Service range).
    pub kubernetes_ip: Ipv4Addr,
    /// The segment: a host bridge that the added Nodes, the client and the router join. It is
    /// also the name of their link on it, so the interface to the segment has one name on
    /// every Node (on the host's Node it is the bridge itself).
    pub segment_bridge: String,
    /// The segment's network (a /24 of the benchmarking range, so it meets no real network):
    /// Node n at `.n` (the host's Node at `.1`), the client at `.100`, the router at `.254`.
    pub segment: Ipv4Addr,
}

/// The segment's prefix length.
pub const SEGMENT_PREFIX: u8 = 24;
/// The most Nodes a cluster has (each takes a /24 of the pod range and an address below the
/// client's on the segment).
pub const MAX_NODES: usize = 16;
/// The client's namespace: a machine on the segment behind the router.
pub const CLIENT_NETNS: &str = "ccmrc-client";
/// The router's namespace: the upstream router of the segment (BIRD runs here).
pub const ROUTER_NETNS: &str = "ccmrc-router";

impl Default for Network {
    fn default() -> Self {
        Network {
            bridge: "ccmrc0".into(),
            node_ip: Ipv4Addr::new(10, 244, 0, 1),
            pod_prefix: 24,
            service_cidr: "10.96.0.0/16".into(),
            kubernetes_ip: Ipv4Addr::new(10, 96, 0, 1),
            segment_bridge: "ccmnodes0".into(),
            segment: Ipv4Addr::new(198, 19, 0, 0),
        }
    }
}

impl Network {
    /// The host's Node's pod range, e.g. `10.244.0.0/24`.
    pub fn pod_cidr(&self) -> String {
        self.node_pod_cidr(1)
    }

    /// Every Node's pod ranges together, e.g. `10.244.0.0/16` (kube-proxy's `clusterCIDR`).
    pub fn cluster_cidr(&self) -> String {
        let [a, b, _, _] = self.node_ip.octets();
        format!("{a}.{b}.0.0/16")
    }

    /// Node `n`'s pod range (n from 1): the n-th of the cluster's, e.g. `10.244.1.0/24` for 2.
    pub fn node_pod_cidr(&self, n: usize) -> String {
        let [a, b, c, _] = self.node_ip.octets();
        format!("{a}.{b}.{}.0/{}", usize::from(c) + n - 1, self.pod_prefix)
    }

    /// Node `n`'s pod gateway (its CNI bridge's address), the first of its range.
    pub fn node_pod_gateway(&self, n: usize) -> Ipv4Addr {
        let [a, b, c, _] = self.node_ip.octets();
        Ipv4Addr::new(a, b, (usize::from(c) + n - 1) as u8, 1)
    }

    /// An address of the segment: its network with the last octet `host`.
    pub fn segment_address(&self, host: u8) -> Ipv4Addr {
        let [a, b, c, _] = self.segment.octets();
        Ipv4Addr::new(a, b, c, host)
    }

    /// The segment, e.g. `198.19.0.0/24`.
    pub fn segment_cidr(&self) -> String {
        format!("{}/{SEGMENT_PREFIX}", self.segment)
    }

    /// Node `n`'s address: the host's Node keeps the bridge's; an added Node has `.n` on the
    /// segment (the host is `.1` there).
    pub fn node_address(&self, n: usize) -> Ipv4Addr {
        if n == 1 { self.node_ip } else { self.segment_address(n as u8) }
    }

    /// The client's address on the segment.
    pub fn client_address(&self) -> Ipv4Addr {
        self.segment_address(100)
    }

    /// The router's address on the segment.
    pub fn router_address(&self) -> Ipv4Addr {
        self.segment_address(254)
    }
}

/// The name of added Node `n` (2 and up).
pub fn added_node_name(n: usize) -> String {
    format!("node-{n}")
}

/// A network namespace of the segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place<'a> {
    /// The client: a machine on the segment whose default route is the router.
    Client,
    /// The router: forwards between the client and the rest; BIRD runs here.
    Router,
    /// An added Node (by name).
    Node(&'a str),
}

/// A running real cluster.
pub struct RealCluster {
    assets: PathBuf,
    state: PathBuf,
    /// The cluster's network addresses.
    pub network: Network,
    /// The Node's name (the host name, lower-cased).
    pub node_name: String,
    /// `https://NODE_IP:PORT`.
    pub api_url: String,
    before: host::Snapshot,
    /// Seconds from the start call to the Node being Ready.
    pub start_seconds: f64,
    /// What every Node's configuration needs from the host.
    host: node::Host,
    /// Starts the added Nodes' daemons (and those in the segment's namespaces).
    launcher: Launcher,
    /// The added Nodes and the images every Node gets.
    added: Mutex<Added>,
}

/// The Nodes added after the start, and what a new one needs.
#[derive(Debug, Default)]
struct Added {
    /// In the order they were added (Node 2 first).
    nodes: Vec<AddedNode>,
    /// Image archives imported since the start, for Nodes added or started later.
    images: Vec<PathBuf>,
    /// Whether the segment, the client and the router exist.
    segment: bool,
}

#[derive(Debug)]
struct AddedNode {
    plan: NodePlan,
    /// Its daemons run (not stopped by [`RealCluster::stop_node`]).
    running: bool,
    /// How many of [`Added::images`] its containerd holds.
    images: usize,
}

/// The cluster's TCP ports, below the kernel's ephemeral range (32768 and up) so that no
/// outgoing connection of a concurrent test takes one between the check and the bind.
#[derive(Debug, Clone, Copy)]
struct Ports {
    api: u16,
    etcd: u16,
    etcd_peer: u16,
    kubelet: u16,
    kcm: u16,
    scheduler: u16,
    proxy_metrics: u16,
}

impl Ports {
    const DEFAULT: Ports = Ports {
        api: 24443,
        etcd: 24379,
        etcd_peer: 24380,
        kubelet: 24250,
        kcm: 24257,
        scheduler: 24259,
        proxy_metrics: 24249,
    };

    /// Fails naming the first port something already listens on.
    fn check(&self, node_ip: Ipv4Addr) -> Result<(), Error> {
        let all =
            [self.api, self.etcd, self.etcd_peer, self.kubelet, self.kcm, self.scheduler, self.proxy_metrics, 10256];
        for port in all {
            for ip in [Ipv4Addr::LOCALHOST, node_ip] {
                if let Err(e) = TcpListener::bind((ip, port))
                    && e.kind() == std::io::ErrorKind::AddrInUse
                {
                    return Err(Error::Other(format!("port {ip}:{port} is in use (another cluster on this host?)")));
                }
            }
        }
        Ok(())
    }
}

fn run(program: &str, args: &[&str]) -> Result<String, Error> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Error::io(format!("running {program}"), e))?;
    if !out.status.success() {
        return Err(Error::Other(format!(
            "{program} {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn which(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(program)).find(|p| p.is_file())
}

fn write(path: &Path, content: &str) -> Result<(), Error> {
    std::fs::write(path, content).map_err(|e| Error::io(format!("writing {}", path.display()), e))
}

/// The component daemons, in the order teardown stops them (node first, storage last).
const COMPONENTS: &[&str] =
    &["kube-proxy", "kube-scheduler", "kube-controller-manager", "kubelet", "containerd", "kube-apiserver", "etcd"];

impl RealCluster {
    /// The assets directory.
    pub fn assets(&self) -> &Path {
        &self.assets
    }

    /// The admin kubeconfig (`system:masters`).
    pub fn kubeconfig(&self) -> PathBuf {
        self.state.join("admin.kubeconfig")
    }

    /// The cluster's state directory (certificates, logs, containerd's content).
    pub fn state_dir(&self) -> &Path {
        &self.state
    }

    /// The containerd socket.
    pub fn containerd_socket() -> PathBuf {
        Path::new(RUN_DIR).join("containerd/containerd.sock")
    }

    /// A component's log file.
    pub fn log(&self, component: &str) -> PathBuf {
        self.state.join("logs").join(format!("{component}.log"))
    }

    /// The kit's `kubectl` (the same version as the cluster).
    pub fn kubectl(&self) -> PathBuf {
        self.assets.join("kubectl")
    }

    /// An admin client.
    pub async fn client(&self) -> Result<kube::Client, Error> {
        let kubeconfig = kube::config::Kubeconfig::read_from(self.kubeconfig())
            .map_err(|e| Error::Other(format!("reading the admin kubeconfig: {e}")))?;
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .map_err(|e| Error::Other(format!("the admin kubeconfig: {e}")))?;
        Ok(kube::Client::try_from(config)?)
    }

    /// Checks that the host can run a node: root, the assets, containerd, runc, iptables and
    /// the CNI plugins. The message names what is missing.
    pub fn preflight(assets: &Path) -> Result<PathBuf, Error> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err(Error::Other(format!("{ASSETS_ENV} is set but the tests do not run as root")));
        }
        let missing: Vec<&str> = BINARIES.iter().copied().filter(|b| !assets.join(b).is_file()).collect();
        if !missing.is_empty() {
            return Err(Error::Other(format!(
                "{} lacks {} (run e2e/realcluster/setup.sh)",
                assets.display(),
                missing.join(", ")
            )));
        }
        let missing: Vec<&str> = HOST_COMMANDS.iter().copied().filter(|c| which(c).is_none()).collect();
        if !missing.is_empty() {
            return Err(Error::Other(format!(
                "missing host commands {} (Debian: containerd runc iptables iproute2; e2e/realcluster/setup.sh installs them)",
                missing.join(", ")
            )));
        }
        CNI_DIRS
            .iter()
            .map(PathBuf::from)
            .find(|d| ["bridge", "host-local", "loopback", "portmap"].iter().all(|p| d.join(p).is_file()))
            .ok_or_else(|| {
                Error::Other(
                    "no CNI plugins in /usr/lib/cni or /opt/cni/bin (Debian: containernetworking-plugins)".into(),
                )
            })
    }

    /// Starts the cluster and waits until its Node is Ready. Blocking; call it from the thread
    /// that lives as long as the cluster (its daemons die with the thread that started them).
    /// `state` is emptied first.
    pub fn start(assets: &Path, state: &Path) -> Result<RealCluster, Error> {
        let started = Instant::now();
        let cni_dir = Self::preflight(assets)?;
        teardown_stale();
        let before = host::Snapshot::take();
        let network = Network::default();
        let node_name = run("hostname", &[])?.trim().to_lowercase();
        let _ = std::fs::remove_dir_all(state);
        let (logs, pki, etc) = (state.join("logs"), state.join("pki"), state.join("etc"));
        for dir in [&logs, &pki, &etc, &state.join("var"), &Path::new(RUN_DIR).join("containerd")] {
            std::fs::create_dir_all(dir).map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
        }
        write(&Path::new(RUN_DIR).join("state"), &state.to_string_lossy())?;
        // Saved before anything changes them; teardown writes them back.
        write(&Path::new(RUN_DIR).join("sysctl.orig"), &before.sysctls.iter().cloned().collect::<Vec<_>>().join("\n"))?;

        // Root without CAP_SYS_RESOURCE cannot lower oom_score_adj; CRI asks -998 for sandboxes,
        // which runc then fails to set unless containerd clamps it.
        let restrict_oom = std::fs::write("/proc/self/oom_score_adj", "-1").is_err();
        let _ = std::fs::write("/proc/self/oom_score_adj", "0");
        let resolv = if std::fs::read_to_string("/etc/resolv.conf").is_ok_and(|r| r.contains("nameserver 127.0.0.53"))
            && Path::new("/run/systemd/resolve/resolv.conf").is_file()
        {
            "/run/systemd/resolve/resolv.conf"
        } else {
            "/etc/resolv.conf"
        };
        let host = node::Host {
            runc: which("runc").unwrap_or_else(|| PathBuf::from("runc")),
            cni_bin: cni_dir,
            restrict_oom,
            resolv: resolv.into(),
            ca: pki.join("ca.crt"),
        };
        let mut cluster = RealCluster {
            assets: assets.to_path_buf(),
            state: state.to_path_buf(),
            api_url: String::new(),
            network,
            node_name,
            before,
            start_seconds: 0.0,
            host,
            launcher: Launcher::new()?,
            added: Mutex::new(Added::default()),
        };
        match cluster.boot(started) {
            Ok(()) => Ok(cluster),
            Err(e) => {
                let logs = cluster.state.join("logs");
                let leftovers = cluster.stop().leftovers;
                Err(Error::Other(format!(
                    "{e}\n(logs in {}; after teardown: {})",
                    logs.display(),
                    if leftovers.is_empty() { "host as before".to_string() } else { leftovers.join("; ") }
                )))
            }
        }
    }

    /// The host's Node.
    fn host_node(&self) -> NodePlan {
        NodePlan {
            name: self.node_name.clone(),
            number: 1,
            ip: self.network.node_ip,
            pod_cidr: self.network.pod_cidr(),
            pod_gateway: self.network.node_ip,
            cluster_cidr: self.network.cluster_cidr(),
            cni_bridge: self.network.bridge.clone(),
            netns: None,
            dir: self.state.clone(),
            run: PathBuf::from(RUN_DIR),
        }
    }

    /// Added Node `n` (2 and up).
    fn added_node(&self, n: usize) -> NodePlan {
        let name = added_node_name(n);
        NodePlan {
            number: n,
            ip: self.network.node_address(n),
            pod_cidr: self.network.node_pod_cidr(n),
            pod_gateway: self.network.node_pod_gateway(n),
            cluster_cidr: self.network.cluster_cidr(),
            cni_bridge: "cni0".into(),
            netns: Some(format!("{}{name}", netns::PREFIX)),
            dir: self.state.join("nodes").join(&name),
            run: Path::new(RUN_DIR).join("nodes").join(&name),
            name,
        }
    }

    fn boot(&mut self, started: Instant) -> Result<(), Error> {
        let net = self.network.clone();
        let (logs, pki, etc, var) =
            (self.state.join("logs"), self.state.join("pki"), self.state.join("etc"), self.state.join("var"));
        let s = |p: &Path| p.to_string_lossy().into_owned();

        // Host network: the bridge carries the node address; forwarded pod traffic is accepted
        // even where the FORWARD policy is DROP (hosts running Docker).
        if !Path::new("/proc/sys/net/bridge").exists() {
            let _ = run("modprobe", &["br_netfilter"]);
        }
        run("ip", &["link", "add", &net.bridge, "type", "bridge"])?;
        run("ip", &["addr", "add", &format!("{}/{}", net.node_ip, net.pod_prefix), "dev", &net.bridge])?;
        run("ip", &["link", "set", &net.bridge, "up"])?;
        host::set_sysctl("net/ipv4/ip_forward", "1").map_err(|e| Error::io("enabling ip_forward", e))?;
        let _ = host::set_sysctl("net/bridge/bridge-nf-call-iptables", "1");
        for dir in ["-i", "-o"] {
            run(
                "iptables",
                &[
                    "-w",
                    "-I",
                    "FORWARD",
                    "1",
                    dir,
                    &net.bridge,
                    "-m",
                    "comment",
                    "--comment",
                    RULE_COMMENT,
                    "-j",
                    "ACCEPT",
                ],
            )?;
        }

        pki::generate(&pki, &self.node_name, net.node_ip, net.kubernetes_ip)?;
        let ports = Ports::DEFAULT;
        ports.check(net.node_ip)?;
        let api_port = ports.api;
        self.api_url = format!("https://{}:{api_port}", net.node_ip);
        for (stem, _, _) in pki::identities(&self.node_name) {
            let file = if stem == "admin" {
                self.state.join("admin.kubeconfig")
            } else {
                etc.join(format!("{stem}.kubeconfig"))
            };
            self.write_kubeconfig(&file, stem)?;
        }

        let (etcd_port, peer_port) = (ports.etcd, ports.etcd_peer);
        let etcd = process::daemon(
            "etcd",
            &self.assets.join("etcd"),
            &[
                format!("--data-dir={}", s(&var.join("etcd"))),
                format!("--listen-client-urls=http://127.0.0.1:{etcd_port}"),
                format!("--advertise-client-urls=http://127.0.0.1:{etcd_port}"),
                format!("--listen-peer-urls=http://127.0.0.1:{peer_port}"),
                format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}"),
                format!("--initial-cluster=default=http://127.0.0.1:{peer_port}"),
                "--unsafe-no-fsync".into(),
                "--log-level=warn".into(),
            ],
            &logs,
            Path::new(RUN_DIR),
        )?;
        let p = |name: &str| s(&pki.join(name));
        let api = process::daemon(
            "kube-apiserver",
            &self.assets.join("kube-apiserver"),
            &[
                format!("--bind-address={}", net.node_ip),
                format!("--advertise-address={}", net.node_ip),
                format!("--secure-port={api_port}"),
                format!("--etcd-servers=http://127.0.0.1:{etcd_port}"),
                format!("--tls-cert-file={}", p("apiserver.crt")),
                format!("--tls-private-key-file={}", p("apiserver.key")),
                format!("--client-ca-file={}", p("ca.crt")),
                format!("--kubelet-client-certificate={}", p("apiserver-kubelet-client.crt")),
                format!("--kubelet-client-key={}", p("apiserver-kubelet-client.key")),
                "--kubelet-preferred-address-types=InternalIP,Hostname".into(),
                "--authorization-mode=Node,RBAC".into(),
                // As production clusters: the Node authorizer's partner, and blockOwnerDeletion
                // needing update on the owner's finalizers.
                "--enable-admission-plugins=NodeRestriction,OwnerReferencesPermissionEnforcement".into(),
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
                format!("--service-account-key-file={}", p("sa.pub")),
                format!("--service-account-signing-key-file={}", p("sa.key")),
                format!("--service-cluster-ip-range={}", net.service_cidr),
                "--service-node-port-range=30000-32767".into(),
                "--allow-privileged=true".into(),
                "--profiling=false".into(),
                format!("--cert-dir={}", s(&var.join("apiserver-certs"))),
            ],
            &logs,
            Path::new(RUN_DIR),
        )?;
        let _ = etcd;
        wait_for(
            "kube-apiserver ready",
            Some(api),
            Duration::from_secs(120),
            &logs.join("kube-apiserver.log"),
            || self.kubectl_raw(&["get", "--raw", "/readyz"]).is_ok_and(|o| o.trim() == "ok"),
        )?;

        let plan = self.host_node();
        plan.write_config(&self.host)?;
        let containerd = process::daemon(
            "containerd",
            &which("containerd").unwrap_or_else(|| PathBuf::from("containerd")),
            &plan.containerd_args(),
            &logs,
            Path::new(RUN_DIR),
        )?;
        let sock = s(&plan.socket());
        wait_for("containerd up", Some(containerd), Duration::from_secs(30), &logs.join("containerd.log"), || {
            run("ctr", &["-a", &sock, "version"]).is_ok()
        })?;
        let archive = self.state.join("pause.tar");
        images::build_pause(&self.assets.join("pause"), &archive)?;
        images::import(&archive)?;

        let kubelet_start = chrono_now();
        let kubelet =
            process::daemon("kubelet", &self.assets.join("kubelet"), &plan.kubelet_args(), &logs, Path::new(RUN_DIR))?;
        let kcm_kubeconfig = s(&etc.join("kube-controller-manager.kubeconfig"));
        process::daemon(
            "kube-controller-manager",
            &self.assets.join("kube-controller-manager"),
            &[
                format!("--kubeconfig={kcm_kubeconfig}"),
                format!("--authentication-kubeconfig={kcm_kubeconfig}"),
                format!("--authorization-kubeconfig={kcm_kubeconfig}"),
                "--bind-address=127.0.0.1".into(),
                format!("--secure-port={}", ports.kcm),
                format!("--service-account-private-key-file={}", p("sa.key")),
                format!("--root-ca-file={}", p("ca.crt")),
                format!("--cluster-signing-cert-file={}", p("ca.crt")),
                format!("--cluster-signing-key-file={}", p("ca.key")),
                "--use-service-account-credentials=true".into(),
                // The cloud controllers are the CCM's job.
                "--controllers=*,-cloud-node-lifecycle,-service-lb-controller,-node-route-controller".into(),
                format!("--service-cluster-ip-range={}", net.service_cidr),
                "--leader-elect=false".into(),
                "--v=1".into(),
            ],
            &logs,
            Path::new(RUN_DIR),
        )?;
        let sched_kubeconfig = s(&etc.join("kube-scheduler.kubeconfig"));
        process::daemon(
            "kube-scheduler",
            &self.assets.join("kube-scheduler"),
            &[
                format!("--kubeconfig={sched_kubeconfig}"),
                format!("--authentication-kubeconfig={sched_kubeconfig}"),
                format!("--authorization-kubeconfig={sched_kubeconfig}"),
                "--bind-address=127.0.0.1".into(),
                format!("--secure-port={}", ports.scheduler),
                "--leader-elect=false".into(),
                "--v=1".into(),
            ],
            &logs,
            Path::new(RUN_DIR),
        )?;
        process::daemon(
            "kube-proxy",
            &self.assets.join("kube-proxy"),
            &plan.kube_proxy_args(),
            &logs,
            Path::new(RUN_DIR),
        )?;

        self.wait_ready(&self.node_name, &kubelet_start, kubelet, &logs.join("kubelet.log"))?;
        self.start_seconds = started.elapsed().as_secs_f64();
        Ok(())
    }

    /// Waits until Node `name` is Ready with a heartbeat from the kubelet started at `since`,
    /// then puts back the kernel settings the kubelet rewrote (kernel.panic=10,
    /// vm.overcommit_memory=1, ...) on its way to Ready and never checks again; every kubelet
    /// does so at each start.
    fn wait_ready(&self, name: &str, since: &str, kubelet: u32, log: &Path) -> Result<(), Error> {
        let jsonpath = "{.status.conditions[?(@.type==\"Ready\")].status} {.status.conditions[?(@.type==\"Ready\")].lastHeartbeatTime}";
        wait_for(&format!("Node {name} Ready"), Some(kubelet), Duration::from_secs(180), log, || {
            let out = self.kubectl_raw(&["get", "node", name, "-o", &format!("jsonpath={jsonpath}")]);
            let out = out.unwrap_or_default();
            let mut words = out.split_whitespace();
            words.next() == Some("True") && words.next().is_some_and(|heartbeat| heartbeat >= since)
        })?;
        let deadline = Instant::now() + Duration::from_secs(5);
        while host::sysctl("kernel/panic_on_oops").as_deref() != Some("1") && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        restore_sysctls(&self.before.sysctls, &["vm/", "kernel/"]);
        Ok(())
    }

    fn lock(&self) -> Result<MutexGuard<'_, Added>, Error> {
        self.added.lock().map_err(|_| Error::Other("a thread panicked while changing the Nodes".into()))
    }

    /// Every Node's name, the host's first, then the added ones in order (stopped ones too).
    pub fn node_names(&self) -> Vec<String> {
        let mut names = vec![self.node_name.clone()];
        if let Ok(added) = self.lock() {
            names.extend(added.nodes.iter().map(|n| n.plan.name.clone()));
        }
        names
    }

    /// A Node's plan (its addresses, pod range, namespace and files), by name.
    pub fn node(&self, name: &str) -> Option<NodePlan> {
        if name == self.node_name {
            return Some(self.host_node());
        }
        self.lock().ok()?.nodes.iter().find(|n| n.plan.name == name).map(|n| n.plan.clone())
    }

    /// Grows the cluster to `total` Nodes (see [`RealCluster::add_node`]); returns the added
    /// Nodes' names.
    pub fn add_nodes(&self, total: usize) -> Result<Vec<String>, Error> {
        let mut names = Vec::new();
        while self.node_names().len() < total {
            names.push(self.add_node()?);
        }
        Ok(names)
    }

    /// Adds a Node: a network namespace on the segment, its own containerd (every image
    /// imported so far), kubelet (`system:node:<name>`, cgroup root and host name of its own)
    /// and kube-proxy, routes between its pod range and every other Node's; waits until it is
    /// Ready and returns its name. The first one also makes the segment, the router and the
    /// client. Blocking.
    pub fn add_node(&self) -> Result<String, Error> {
        let mut added = self.lock()?;
        let n = added.nodes.len() + 2;
        if n > MAX_NODES {
            return Err(Error::Other(format!("at most {MAX_NODES} Nodes")));
        }
        if !added.segment {
            self.make_segment()?;
            added.segment = true;
        }
        let plan = self.added_node(n);
        let pki = self.state.join("pki");
        plan.write_config(&self.host)?;
        pki::node_client(&pki, &plan.name)?;
        self.write_kubeconfig(&plan.etc().join("kubelet.kubeconfig"), &pki::kubelet_stem(&plan.name))?;
        self.write_kubeconfig(&plan.etc().join("kube-proxy.kubeconfig"), "kube-proxy")?;
        // Its pod range: from the host, and from every other added Node that runs (a stopped
        // one gets its routes when it starts).
        netns::route(None, &plan.pod_cidr, plan.ip)?;
        for other in added.nodes.iter().filter(|o| o.running) {
            netns::route(other.plan.netns.as_deref(), &plan.pod_cidr, plan.ip)?;
        }
        let mut images = vec![self.state.join("pause.tar")];
        images.extend(added.images.iter().cloned());
        let count = added.images.len();
        added.nodes.push(AddedNode { plan: plan.clone(), running: false, images: count });
        self.power_on(&plan, &added.nodes, &images)?;
        if let Some(node) = added.nodes.last_mut() {
            node.running = true;
        }
        Ok(plan.name)
    }

    /// Makes the segment: the host bridge (the host at `.1`), the router (forwarding, default
    /// route to the host) and the client (default route to the router).
    fn make_segment(&self) -> Result<(), Error> {
        let net = &self.network;
        netns::create_bridge(&net.segment_bridge, net.segment_address(1), SEGMENT_PREFIX, RULE_COMMENT)?;
        let attach = |netns: &str, address: Ipv4Addr, gateway: Ipv4Addr| netns::Attachment {
            netns: netns.into(),
            bridge: net.segment_bridge.clone(),
            inside: net.segment_bridge.clone(),
            address,
            prefix: SEGMENT_PREFIX,
            gateway: Some(gateway),
        };
        // A redirect would send the client straight to the host, past the router.
        let link_redirects = format!("net/ipv4/conf/{}/send_redirects", net.segment_bridge);
        attach(ROUTER_NETNS, net.router_address(), net.segment_address(1)).create(&[
            ("net/ipv4/ip_forward", "1"),
            ("net/ipv4/conf/all/send_redirects", "0"),
            (&link_redirects, "0"),
        ])?;
        attach(CLIENT_NETNS, net.client_address(), net.router_address())
            .create(&[("net/ipv4/conf/all/accept_redirects", "0")])?;
        Ok(())
    }

    /// Makes an added Node's namespace and routes, starts its daemons and waits until it is
    /// Ready. `nodes` are all added Nodes (itself among them).
    fn power_on(&self, plan: &NodePlan, nodes: &[AddedNode], images: &[PathBuf]) -> Result<(), Error> {
        let netns = plan.netns.clone().ok_or_else(|| Error::Other("the host's Node has no namespace".into()))?;
        let net = &self.network;
        netns::Attachment {
            netns: netns.clone(),
            bridge: net.segment_bridge.clone(),
            inside: net.segment_bridge.clone(),
            address: plan.ip,
            prefix: SEGMENT_PREFIX,
            // The host: the API server's address, the host's Node's pods.
            gateway: Some(net.segment_address(1)),
        }
        .create(&[("net/ipv4/ip_forward", "1")])?;
        for other in nodes.iter().filter(|o| o.plan.name != plan.name) {
            netns::route(Some(&netns), &other.plan.pod_cidr, other.plan.ip)?;
        }
        let since = chrono_now();
        let kubelet = node::start(plan, &self.assets, &self.launcher, images)?;
        self.wait_ready(&plan.name, &since, kubelet, &plan.log("kubelet"))
    }

    /// Stops an added Node abruptly, as a machine losing power: SIGKILL to its kubelet,
    /// kube-proxy, containerd, shims and every container, no graceful deletion of anything;
    /// then its namespace goes (nothing answers at its address) and what a reboot clears
    /// (mounts, its run directory, its cgroups). Its Node object stays, NotReady once the
    /// node-lifecycle controller notices (about 50 s). The host's Node runs the control plane
    /// and cannot be stopped.
    pub fn stop_node(&self, name: &str) -> Result<(), Error> {
        let mut added = self.lock()?;
        let node = added.nodes.iter_mut().find(|n| n.plan.name == name).ok_or_else(|| self.not_added(name))?;
        if let Some(netns) = node.plan.netns.clone() {
            node::power_off(&netns, &node.plan.run, std::slice::from_ref(&node.plan.dir));
        }
        node.running = false;
        Ok(())
    }

    /// Starts a stopped added Node again, as a machine booting: its namespace and routes, then
    /// containerd, the kubelet and kube-proxy on the data they had; waits until it is Ready.
    /// The kubelet starts its Pods again in new sandboxes.
    pub fn start_node(&self, name: &str) -> Result<(), Error> {
        let mut added = self.lock()?;
        let all_images = added.images.clone();
        let index = added.nodes.iter().position(|n| n.plan.name == name).ok_or_else(|| self.not_added(name))?;
        if added.nodes[index].running {
            return Err(Error::Other(format!("Node {name} runs already")));
        }
        let plan = added.nodes[index].plan.clone();
        plan.write_config(&self.host)?;
        let missing = all_images[added.nodes[index].images..].to_vec();
        self.power_on(&plan, &added.nodes, &missing)?;
        added.nodes[index].running = true;
        added.nodes[index].images = all_images.len();
        Ok(())
    }

    /// Kills a running added Node's kube-proxy alone (a crash: its rules stay, its health
    /// endpoint at the node address stops answering); the Node stays Ready.
    pub fn kill_kube_proxy(&self, name: &str) -> Result<(), Error> {
        node::kill_kube_proxy(&self.running_added(name)?);
        Ok(())
    }

    /// Starts a running added Node's kube-proxy again after [`RealCluster::kill_kube_proxy`].
    pub fn start_kube_proxy(&self, name: &str) -> Result<(), Error> {
        node::start_kube_proxy(&self.running_added(name)?, &self.assets, &self.launcher).map(|_| ())
    }

    /// The plan of the running added Node `name`.
    fn running_added(&self, name: &str) -> Result<NodePlan, Error> {
        let added = self.lock()?;
        let node = added.nodes.iter().find(|n| n.plan.name == name && n.running).ok_or_else(|| self.not_added(name))?;
        Ok(node.plan.clone())
    }

    fn not_added(&self, name: &str) -> Error {
        if name == self.node_name {
            Error::Other(format!("{name} is the host's Node: it runs the control plane and cannot be stopped"))
        } else {
            Error::Other(format!("no added Node {name}"))
        }
    }

    /// Imports an image archive into every running Node's containerd and keeps it for the
    /// Nodes added or started later.
    pub fn import_image(&self, archive: &Path) -> Result<(), Error> {
        let mut added = self.lock()?;
        images::import(archive)?;
        added.images.push(archive.to_path_buf());
        let Added { nodes, images: all, .. } = &mut *added;
        for node in nodes.iter_mut().filter(|n| n.running) {
            for archive in &all[node.images..] {
                images::import_into(&node.plan.socket(), archive)?;
            }
            node.images = all.len();
        }
        Ok(())
    }

    /// The network namespace of a place on the segment.
    pub fn netns(&self, place: Place<'_>) -> Result<String, Error> {
        let segment = self.lock()?.segment;
        let name = match place {
            Place::Client => CLIENT_NETNS.to_string(),
            Place::Router => ROUTER_NETNS.to_string(),
            Place::Node(name) => self.node(name).and_then(|p| p.netns).ok_or_else(|| self.not_added(name))?,
        };
        if !segment || !netns::path(&name).exists() {
            return Err(Error::Other(format!("{name} does not exist (no Node added yet, or the Node is stopped)")));
        }
        Ok(name)
    }

    /// Runs `f` on a thread inside a place's namespace (its sockets are that machine's).
    pub fn run_in<T: Send + 'static>(
        &self,
        place: Place<'_>,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, Error> {
        netns::run_in(&self.netns(place)?, f)
    }

    /// Starts `f` on a thread inside a place's namespace and returns at once (a client that
    /// keeps sending, say); join the handle for its result.
    pub fn thread_in<T: Send + 'static>(
        &self,
        place: Place<'_>,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<std::thread::JoinHandle<Result<T, Error>>, Error> {
        netns::spawn_in(&self.netns(place)?, f)
    }

    /// The hardware address a Node has on the segment (the host's Node: the segment bridge's;
    /// an added Node: its link inside its namespace), as `ip neigh` prints it.
    pub fn segment_mac(&self, node: &str) -> Result<String, Error> {
        let link = &self.network.segment_bridge;
        let text = if node == self.node_name {
            std::fs::read_to_string(format!("/sys/class/net/{link}/address"))
                .map_err(|e| Error::io(format!("reading {link}'s address"), e))?
        } else {
            // /sys shows the host's links; `ip -n` asks the namespace.
            let netns = self.node(node).and_then(|p| p.netns).ok_or_else(|| self.not_added(node))?;
            let out = run("ip", &["-n", &netns, "-br", "link", "show", link])?;
            out.split_whitespace().nth(2).unwrap_or_default().to_string()
        };
        let mac = text.trim().to_lowercase();
        if mac.len() != 17 {
            return Err(Error::Other(format!("no hardware address for {node} on {link}: {text:?}")));
        }
        Ok(mac)
    }

    /// Runs a command inside a place's namespace and returns its standard output; an error
    /// carries its standard error.
    pub fn command_in(&self, place: Place<'_>, program: &str, args: &[&str]) -> Result<String, Error> {
        let netns = self.netns(place)?;
        let out = netns::command(&netns, program)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| Error::io(format!("running {program} in {netns}"), e))?;
        if !out.status.success() {
            return Err(Error::Other(format!(
                "{program} {} in {netns} failed ({}): {}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Starts a daemon inside a place's namespace (BIRD in the router, say), its output in
    /// `logs/<namespace>-<name>.log`; it runs until [`RealCluster::stop`] (which kills every
    /// process in the segment's namespaces) or until killed by its pid.
    pub fn spawn_in(&self, place: Place<'_>, name: &str, program: &Path, args: &[String]) -> Result<u32, Error> {
        let netns = self.netns(place)?;
        let run_dir = Path::new(RUN_DIR).join("netns");
        std::fs::create_dir_all(&run_dir).map_err(|e| Error::io("creating the namespaces' run directory", e))?;
        self.launcher.launch(process::Spec {
            program: program.to_path_buf(),
            args: args.to_vec(),
            log: self.state.join("logs").join(format!("{netns}-{name}.log")),
            pid_file: run_dir.join(format!("{netns}-{name}.pid")),
            netns: Some(netns::path(&netns)),
            hostname: None,
        })
    }

    /// Resident memory of the cluster now, in KiB: each component of each running Node and of
    /// the control plane (`NODE/COMPONENT`), then the Pods' processes and the shims together.
    pub fn memory(&self) -> Vec<(String, u64)> {
        let mut out = Vec::new();
        let host = Path::new(RUN_DIR);
        for c in COMPONENTS {
            if let Some(pid) = process::recorded_pid(&host.join(format!("{c}.pid"))) {
                out.push((format!("{}/{c}", self.node_name), process::rss_kib(pid)));
            }
        }
        let mut pods: Vec<u32> = cgroup::pids("kubepods");
        if let Ok(added) = self.lock() {
            for node in added.nodes.iter().filter(|n| n.running) {
                for d in node::DAEMONS {
                    if let Some(pid) = process::recorded_pid(&node.plan.pid_file(d)) {
                        out.push((format!("{}/{d}", node.plan.name), process::rss_kib(pid)));
                    }
                }
                if let Some(root) = node.plan.cgroup_root() {
                    pods.extend(cgroup::pids(root.trim_start_matches('/')));
                }
            }
        }
        let shims = host::processes_mentioning(RUN_DIR)
            .into_iter()
            .filter(|(_, cmd)| cmd.contains("containerd-shim"))
            .map(|(pid, _)| pid);
        pods.extend(shims);
        pods.sort_unstable();
        pods.dedup();
        out.push(("pods and shims".into(), pods.iter().map(|p| process::rss_kib(*p)).sum()));
        out
    }

    fn write_kubeconfig(&self, path: &Path, stem: &str) -> Result<(), Error> {
        use base64::Engine as _;
        let pki = self.state.join("pki");
        let read = |name: String| -> Result<String, Error> {
            let bytes = std::fs::read(pki.join(&name)).map_err(|e| Error::io(format!("reading {name}"), e))?;
            Ok(base64::engine::general_purpose::STANDARD.encode(bytes))
        };
        write(
            path,
            &format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: realcluster\n  cluster:\n    server: {}\n    certificate-authority-data: {}\nusers:\n- name: {stem}\n  user:\n    client-certificate-data: {}\n    client-key-data: {}\ncontexts:\n- name: realcluster\n  context: {{cluster: realcluster, user: {stem}, namespace: default}}\ncurrent-context: realcluster\n",
                self.api_url,
                read("ca.crt".into())?,
                read(format!("{stem}.crt"))?,
                read(format!("{stem}.key"))?,
            ),
        )
    }

    /// Runs the kit's kubectl as admin and returns its standard output.
    pub fn kubectl_raw(&self, args: &[&str]) -> Result<String, Error> {
        let kubeconfig = self.kubeconfig();
        let mut all = vec!["--kubeconfig", kubeconfig.to_str().unwrap_or_default(), "--request-timeout=10s"];
        all.extend_from_slice(args);
        run(&self.kubectl().to_string_lossy(), &all)
    }

    /// Removes the cluster's data (etcd, containerd's content and snapshots, the images, the
    /// added Nodes' too), keeping the certificates and logs; for after a [`RealCluster::stop`]
    /// that left the host clean.
    pub fn remove_data(&self) {
        for dir in ["var", "images"] {
            let _ = std::fs::remove_dir_all(self.state.join(dir));
        }
        for node in std::fs::read_dir(self.state.join("nodes")).into_iter().flatten().flatten() {
            let _ = std::fs::remove_dir_all(node.path().join("var"));
        }
        let _ = std::fs::remove_file(self.state.join("pause.tar"));
    }

    /// Stops every component (the added Nodes abruptly, the host's gracefully), removes what
    /// the cluster added to the host and puts back the kernel settings. Returns what still
    /// differs from the host before the start (empty when the host is as it was).
    pub fn stop(&self) -> Stopped {
        let steps = teardown(&self.assets, &self.network, &self.before.sysctls);
        if let Ok(mut added) = self.added.lock() {
            added.nodes.iter_mut().for_each(|n| n.running = false);
            added.segment = false;
        }
        // The first `ip netns add` on a host makes /run/netns a (shared) mount point; it
        // stays after the last namespace goes. Ours, if it was none before and is empty now.
        let netns_dir = Path::new("/run/netns");
        if !self.before.mounts.contains("/run/netns")
            && std::fs::read_dir(netns_dir).is_ok_and(|mut d| d.next().is_none())
        {
            let _ = run("umount", &["/run/netns"]);
        }
        let mut leftovers = host::Snapshot::take().differences(&self.before);
        let sock = Self::containerd_socket();
        for needle in [self.state.to_string_lossy().into_owned(), sock.to_string_lossy().into_owned()] {
            leftovers.extend(
                host::processes_mentioning(&needle).into_iter().map(|(pid, cmd)| format!("process {pid}: {cmd}")),
            );
        }
        leftovers.extend(netns::ours().into_iter().map(|n| format!("network namespace {n}")));
        Stopped { leftovers, steps }
    }
}

/// What [`RealCluster::stop`] did.
#[derive(Debug)]
pub struct Stopped {
    /// What still differs from the host before the start (empty when it is as it was).
    pub leftovers: Vec<String>,
    /// Seconds each step of the teardown took.
    pub steps: Vec<(&'static str, f64)>,
}

/// The current time as the API server writes it (RFC 3339, seconds, UTC).
fn chrono_now() -> String {
    run("date", &["-u", "+%Y-%m-%dT%H:%M:%SZ"]).map(|s| s.trim().to_string()).unwrap_or_default()
}

/// Writes back saved `key value` lines whose key starts with one of `prefixes`.
fn restore_sysctls(saved: &std::collections::BTreeSet<String>, prefixes: &[&str]) {
    for line in saved {
        if let Some((key, value)) = line.split_once(' ')
            && prefixes.iter().any(|p| key.starts_with(p))
        {
            let _ = host::set_sysctl(key, value);
        }
    }
}

/// Tears down a cluster whose run directory a killed test binary left behind.
fn teardown_stale() {
    let run = Path::new(RUN_DIR);
    let Ok(state) = std::fs::read_to_string(run.join("state")) else { return };
    let saved: std::collections::BTreeSet<String> =
        std::fs::read_to_string(run.join("sysctl.orig")).unwrap_or_default().lines().map(str::to_string).collect();
    let assets = assets_dir().unwrap_or_else(|| PathBuf::from(state.trim()));
    eprintln!("real cluster: tearing down what an earlier run left ({})", state.trim());
    let _ = teardown(&assets, &Network::default(), &saved);
}

/// Removes the added Nodes (powered off: see [`node::power_off`]), everything else in the
/// harness's namespaces (the client, the router and what runs there), cgroup roots and links
/// left by a killed run, and the segment. Found by name ([`netns::PREFIX`]), so it also
/// cleans up after a killed run.
fn teardown_added(state: &Path, net: &Network) {
    for ns in netns::ours() {
        match ns.strip_prefix(netns::PREFIX).filter(|n| n.starts_with("node-")) {
            Some(name) => {
                let run_dir = Path::new(RUN_DIR).join("nodes").join(name);
                node::stop_gracefully(&run_dir);
                node::power_off(&ns, &run_dir, &[state.join("nodes").join(name)]);
            }
            None => netns::delete(&ns),
        }
    }
    // A Node stopped abruptly sent no FIN: the API server would wait on those connections
    // for its whole shutdown grace. Nothing on the segment remains to answer; end them here.
    let _ = run("ss", &["-K", "dst", &net.segment_cidr()]);
    for root in cgroup::roots_with_prefix(netns::PREFIX) {
        process::kill_all(|| cgroup::pids(&root), Duration::from_secs(10));
        cgroup::remove(&root);
    }
    let links = std::fs::read_dir("/sys/class/net").into_iter().flatten().flatten();
    for link in links.map(|l| l.file_name().to_string_lossy().into_owned()).filter(|l| l.starts_with(netns::PREFIX)) {
        let _ = run("ip", &["link", "del", &link]);
    }
    netns::delete_bridge(&net.segment_bridge, RULE_COMMENT);
}

/// Stops the added Nodes, then the host's Node's components, the pods (through CRI, so each
/// gets its CNI DEL) and the shims, unmounts what is left, removes the kubelet's cgroups and
/// iptables chains, the harness's FORWARD rules and bridges, and writes the saved kernel
/// settings back.
fn teardown(
    assets: &Path,
    net: &Network,
    saved_sysctls: &std::collections::BTreeSet<String>,
) -> Vec<(&'static str, f64)> {
    let mut steps = Vec::new();
    let mut t = Instant::now();
    let mut step = |name: &'static str, t: &mut Instant| {
        steps.push((name, t.elapsed().as_secs_f64()));
        *t = Instant::now();
    };
    let run_dir = Path::new(RUN_DIR);
    let state = std::fs::read_to_string(run_dir.join("state")).unwrap_or_default();
    let bridge = net.bridge.as_str();
    let sock = RealCluster::containerd_socket();
    if run_dir.join("nodes").is_dir() || !netns::ours().is_empty() {
        teardown_added(Path::new(state.trim()), net);
        step("added nodes", &mut t);
    }
    stop_components(run_dir, &COMPONENTS[..4], Duration::from_secs(20));
    step("node components", &mut t);
    let _ = run(&assets.join("kube-proxy").to_string_lossy(), &["--cleanup"]);
    if process::recorded_pid(&run_dir.join("containerd.pid")).is_some() {
        let endpoint = format!("unix://{}", sock.display());
        let _ = run(&assets.join("rc-cri").to_string_lossy(), &["-endpoint", &endpoint, "stopall"]);
    }
    step("pods", &mut t);
    stop_components(run_dir, &["containerd"], Duration::from_secs(20));
    for (pid, cmd) in host::processes_mentioning(&sock.to_string_lossy()) {
        if cmd.contains("containerd-shim") {
            process::signal(pid, libc::SIGKILL);
        }
    }
    step("containerd", &mut t);
    // One after the other: an API server whose etcd is already gone waits out its grace.
    stop_components(run_dir, &["kube-apiserver"], Duration::from_secs(20));
    step("kube-apiserver", &mut t);
    stop_components(run_dir, &["etcd"], Duration::from_secs(20));
    step("etcd", &mut t);

    let roots: Vec<String> = [state.trim().to_string(), RUN_DIR.to_string()]
        .into_iter()
        .filter(|r| !r.is_empty())
        .map(|r| format!("{r}/"))
        .collect();
    host::unmount_under(&roots);
    cgroup::remove("kubepods");
    for tool in ["iptables", "ip6tables"] {
        for chain in ["INPUT", "OUTPUT"] {
            while run(tool, &["-w", "-t", "filter", "-D", chain, "-j", "KUBE-FIREWALL"]).is_ok() {}
        }
        let _ = run(tool, &["-w", "-t", "filter", "-F", "KUBE-FIREWALL"]);
        let _ = run(tool, &["-w", "-t", "filter", "-X", "KUBE-FIREWALL"]);
        for table in ["filter", "nat", "mangle"] {
            let _ = run(tool, &["-w", "-t", table, "-X", "KUBE-KUBELET-CANARY"]);
        }
        let _ = run(tool, &["-w", "-t", "mangle", "-X", "KUBE-IPTABLES-HINT"]);
    }
    netns::delete_bridge(bridge, RULE_COMMENT);
    restore_sysctls(saved_sysctls, &[""]);
    let _ = std::fs::remove_dir_all(run_dir);
    step("host", &mut t);
    steps
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pod_range_is_the_node_addresses_network() {
        assert_eq!(Network::default().pod_cidr(), "10.244.0.0/24");
    }

    #[test]
    fn node_n_has_the_nth_pod_range_of_the_clusters_and_its_first_address_as_gateway() {
        let net = Network::default();
        assert_eq!(net.cluster_cidr(), "10.244.0.0/16");
        assert_eq!(net.node_pod_cidr(1), net.pod_cidr());
        assert_eq!(net.node_pod_gateway(1), net.node_ip);
        assert_eq!(net.node_pod_cidr(2), "10.244.1.0/24");
        assert_eq!(net.node_pod_gateway(3), Ipv4Addr::new(10, 244, 2, 1));
        assert_eq!(net.node_pod_cidr(MAX_NODES), "10.244.15.0/24");
    }

    #[test]
    fn added_nodes_the_client_and_the_router_have_distinct_addresses_on_the_segment() {
        let net = Network::default();
        assert_eq!(net.segment_cidr(), "198.19.0.0/24");
        assert_eq!(net.node_address(1), net.node_ip, "the host's Node keeps its bridge's address");
        assert_eq!(net.node_address(2), Ipv4Addr::new(198, 19, 0, 2));
        assert_eq!(net.client_address(), Ipv4Addr::new(198, 19, 0, 100));
        assert_eq!(net.router_address(), Ipv4Addr::new(198, 19, 0, 254));
        let mut all: Vec<Ipv4Addr> = (2..=MAX_NODES).map(|n| net.node_address(n)).collect();
        all.extend([net.segment_address(1), net.client_address(), net.router_address()]);
        let count = all.len();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), count, "no two share an address");
    }

    #[test]
    fn an_added_node_is_named_by_number_with_a_namespace_cgroup_root_and_run_directory_of_its_own() {
        let net = Network::default();
        assert_eq!(added_node_name(3), "node-3");
        let ns = format!("{}{}", netns::PREFIX, added_node_name(MAX_NODES));
        assert!(ns.len() <= 15, "{ns} is a link name too");
        assert_eq!(net.node_pod_cidr(3), "10.244.2.0/24");
    }
}
