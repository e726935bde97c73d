//! A real single-node Kubernetes cluster for tests: etcd, kube-apiserver,
//! kube-controller-manager and kube-scheduler, and a node made of containerd (runc, the CNI
//! bridge plugin), a kubelet with `--cloud-provider=external` and kube-proxy in iptables mode.
//!
//! `CCM_REALCLUSTER_ASSETS` names a directory holding the Kubernetes binaries
//! (`e2e/realcluster/setup.sh` prepares it); containerd, runc, the CNI plugins and iptables come
//! from the host. One cluster serves a whole test binary. It needs root: it creates a bridge,
//! iptables rules, mounts and cgroups. [`RealCluster::stop`] puts the host back and reports
//! what still differs from the [`host::Snapshot`] taken before the start; a run that was
//! killed is cleaned up by the next start.

pub mod host;
pub mod images;
mod pki;

use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

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
    /// The Linux bridge the pods attach to; its address is the node's.
    pub bridge: String,
    /// The node's address (first of the pod range, the bridge's).
    pub node_ip: Ipv4Addr,
    /// The pod range's prefix length.
    pub pod_prefix: u8,
    /// The Service range.
    pub service_cidr: String,
    /// The `kubernetes` Service's address (first of the Service range).
    pub kubernetes_ip: Ipv4Addr,
}

impl Default for Network {
    fn default() -> Self {
        Network {
            bridge: "ccmrc0".into(),
            node_ip: Ipv4Addr::new(10, 244, 0, 1),
            pod_prefix: 24,
            service_cidr: "10.96.0.0/16".into(),
            kubernetes_ip: Ipv4Addr::new(10, 96, 0, 1),
        }
    }
}

impl Network {
    /// The pod range, e.g. `10.244.0.0/24`.
    pub fn pod_cidr(&self) -> String {
        let [a, b, c, _] = self.node_ip.octets();
        format!("{a}.{b}.{c}.0/{}", self.pod_prefix)
    }
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

fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Starts a daemon with its output in `logs/<name>.log` and records its pid in the run
/// directory. It gets SIGKILL when the thread that started it ends, so a killed test binary
/// takes its cluster along (the next start cleans up what that leaves).
fn daemon(name: &str, program: &Path, args: &[String], logs: &Path) -> Result<u32, Error> {
    let log = std::fs::File::create(logs.join(format!("{name}.log"))).map_err(|e| Error::io("creating a log", e))?;
    let err = log.try_clone().map_err(|e| Error::io("creating a log", e))?;
    let mut cmd = Command::new(program);
    cmd.args(args).stdin(Stdio::null()).stdout(log).stderr(err);
    // SAFETY: setsid and prctl are async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn().map_err(|e| Error::io(format!("starting {}", program.display()), e))?;
    write(&Path::new(RUN_DIR).join(format!("{name}.pid")), &format!("{}\n{}\n", child.id(), program.display()))?;
    Ok(child.id())
}

/// Whether `pid` still runs. Our own exited children are reaped here (a zombie would answer
/// signal 0 for ever); others' are read from `/proc`.
fn alive(pid: u32) -> bool {
    let mut status = 0;
    // SAFETY: a non-blocking wait; it fails harmlessly (ECHILD) for a process not our child.
    if unsafe { libc::waitpid(pid as libc::pid_t, &mut status, libc::WNOHANG) } == pid as libc::pid_t {
        return false;
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The state follows the command name in parentheses; Z is a zombie, X dead.
    stat.rsplit_once(')').is_some_and(|(_, rest)| !matches!(rest.trim_start().chars().next(), Some('Z' | 'X') | None))
}

/// Waits until `check` answers true, failing early when the process `pid` exits.
fn wait_for(what: &str, pid: Option<u32>, within: Duration, log: &Path, check: impl Fn() -> bool) -> Result<(), Error> {
    let deadline = Instant::now() + within;
    loop {
        if check() {
            return Ok(());
        }
        let dead = pid.is_some_and(|p| !alive(p));
        if dead || Instant::now() > deadline {
            return Err(Error::Other(format!(
                "{what}: {}; {} ends:\n{}",
                if dead { "the process exited" } else { "timed out" },
                log.display(),
                tail(log, 20)
            )));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
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
    /// that lives as long as the cluster (see [`daemon`]). `state` is emptied first.
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

        let mut cluster = RealCluster {
            assets: assets.to_path_buf(),
            state: state.to_path_buf(),
            api_url: String::new(),
            network,
            node_name,
            before,
            start_seconds: 0.0,
        };
        match cluster.boot(&cni_dir, started) {
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

    fn boot(&mut self, cni_dir: &Path, started: Instant) -> Result<(), Error> {
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
        let etcd = daemon(
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
        )?;
        let p = |name: &str| s(&pki.join(name));
        let api = daemon(
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
        )?;
        let _ = etcd;
        wait_for(
            "kube-apiserver ready",
            Some(api),
            Duration::from_secs(120),
            &logs.join("kube-apiserver.log"),
            || self.kubectl_raw(&["get", "--raw", "/readyz"]).is_ok_and(|o| o.trim() == "ok"),
        )?;

        let sock = Self::containerd_socket();
        let runc = which("runc").unwrap_or_else(|| PathBuf::from("runc"));
        // Root without CAP_SYS_RESOURCE cannot lower oom_score_adj; CRI asks -998 for sandboxes,
        // which runc then fails to set unless containerd clamps it.
        let restrict_oom = std::fs::write("/proc/self/oom_score_adj", "-1").is_err();
        let _ = std::fs::write("/proc/self/oom_score_adj", "0");
        std::fs::create_dir_all(etc.join("cni")).map_err(|e| Error::io("creating the CNI directory", e))?;
        write(
            &etc.join("containerd.toml"),
            &format!(
                r#"version = 2
root = "{root}"
state = "{run}/containerd"
[grpc]
  address = "{sock}"
[ttrpc]
  address = "{sock}.ttrpc"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  restrict_oom_score_adj = {restrict_oom}
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "{runc}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{cni}"
    conf_dir = "{cni_conf}"
"#,
                root = s(&var.join("containerd")),
                run = RUN_DIR,
                sock = s(&sock),
                pause = images::PAUSE,
                runc = s(&runc),
                cni = s(cni_dir),
                cni_conf = s(&etc.join("cni")),
            ),
        )?;
        write(
            &etc.join("cni/10-ccm-realcluster.conflist"),
            &serde_json::json!({
                "cniVersion": "1.0.0",
                "name": "ccm-realcluster",
                "plugins": [
                    {
                        "type": "bridge", "bridge": net.bridge, "isGateway": true, "ipMasq": false, "hairpinMode": true,
                        "ipam": {
                            "type": "host-local",
                            "ranges": [[{"subnet": net.pod_cidr(), "gateway": net.node_ip.to_string()}]],
                            "routes": [{"dst": "0.0.0.0/0"}],
                            "dataDir": format!("{RUN_DIR}/cni-ipam"),
                        }
                    },
                    {"type": "portmap", "capabilities": {"portMappings": true}}
                ]
            })
            .to_string(),
        )?;
        let containerd = daemon(
            "containerd",
            &which("containerd").unwrap_or_else(|| PathBuf::from("containerd")),
            &["--config".into(), s(&etc.join("containerd.toml"))],
            &logs,
        )?;
        wait_for("containerd up", Some(containerd), Duration::from_secs(30), &logs.join("containerd.log"), || {
            run("ctr", &["-a", &s(&sock), "version"]).is_ok()
        })?;
        let archive = self.state.join("pause.tar");
        images::build_pause(&self.assets.join("pause"), &archive)?;
        images::import(&archive)?;

        let kubelet_start = chrono_now();
        let resolv = if std::fs::read_to_string("/etc/resolv.conf").is_ok_and(|r| r.contains("nameserver 127.0.0.53"))
            && Path::new("/run/systemd/resolve/resolv.conf").is_file()
        {
            "/run/systemd/resolve/resolv.conf"
        } else {
            "/etc/resolv.conf"
        };
        let kubelet_port = ports.kubelet;
        write(
            &etc.join("kubelet.yaml"),
            &format!(
                "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# 1.35+ refuses cgroup v1 (and hybrid) hosts unless told otherwise.
failCgroupV1: false
cgroupDriver: cgroupfs
failSwapOn: false
containerRuntimeEndpoint: unix://{sock}
address: {ip}
port: {kubelet_port}
readOnlyPort: 0
healthzPort: 0
podLogsDir: {pod_logs}
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: true}}
  x509: {{clientCAFile: {ca}}}
authorization: {{mode: Webhook}}
clusterDomain: cluster.local
resolvConf: {resolv}
# Images come from archives, not a registry: never collect them.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {{memory.available: 100Mi, nodefs.available: 2%, imagefs.available: 2%, nodefs.inodesFree: 2%}}
maxPods: 50
serializeImagePulls: false
",
                sock = s(&sock),
                ip = net.node_ip,
                pod_logs = s(&var.join("pod-logs")),
                ca = p("ca.crt"),
            ),
        )?;
        let kubelet = daemon(
            "kubelet",
            &self.assets.join("kubelet"),
            &[
                format!("--config={}", s(&etc.join("kubelet.yaml"))),
                format!("--kubeconfig={}", s(&etc.join("kubelet.kubeconfig"))),
                format!("--root-dir={}", s(&var.join("kubelet"))),
                format!("--cert-dir={}", s(&var.join("kubelet/pki"))),
                format!("--hostname-override={}", self.node_name),
                format!("--node-ip={}", net.node_ip),
                "--cloud-provider=external".into(),
                "--v=1".into(),
            ],
            &logs,
        )?;
        let kcm_kubeconfig = s(&etc.join("kube-controller-manager.kubeconfig"));
        daemon(
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
        )?;
        let sched_kubeconfig = s(&etc.join("kube-scheduler.kubeconfig"));
        daemon(
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
        )?;
        write(
            &etc.join("kube-proxy.yaml"),
            &format!(
                "apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {{kubeconfig: {kubeconfig}}}
mode: iptables
clusterCIDR: {pods}
hostnameOverride: {node}
bindAddress: {ip}
# Load balancers health-check Nodes here (kube-proxy's default port), so it is on the node
# address as in any cluster; never on the host's other interfaces.
healthzBindAddress: {ip}:10256
metricsBindAddress: 127.0.0.1:{metrics}
nodePortAddresses: [\"{ip}/32\"]
# 0: leave the host's conntrack settings alone (kube-proxy would set them host-wide).
conntrack: {{maxPerCore: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}}
",
                kubeconfig = s(&etc.join("kube-proxy.kubeconfig")),
                pods = net.pod_cidr(),
                node = self.node_name,
                ip = net.node_ip,
                metrics = ports.proxy_metrics,
            ),
        )?;
        daemon(
            "kube-proxy",
            &self.assets.join("kube-proxy"),
            &[format!("--config={}", s(&etc.join("kube-proxy.yaml"))), "--v=1".into()],
            &logs,
        )?;

        // Ready with a heartbeat from this kubelet.
        let jsonpath = "{.status.conditions[?(@.type==\"Ready\")].status} {.status.conditions[?(@.type==\"Ready\")].lastHeartbeatTime}";
        wait_for("the Node Ready", Some(kubelet), Duration::from_secs(180), &logs.join("kubelet.log"), || {
            let out = self.kubectl_raw(&["get", "node", &self.node_name, "-o", &format!("jsonpath={jsonpath}")]);
            let out = out.unwrap_or_default();
            let mut words = out.split_whitespace();
            words.next() == Some("True") && words.next().is_some_and(|heartbeat| heartbeat >= kubelet_start.as_str())
        })?;
        // The kubelet rewrote kernel settings (kernel.panic=10, vm.overcommit_memory=1, ...) on
        // its way to Ready and never checks them again: put the host's back now.
        let deadline = Instant::now() + Duration::from_secs(5);
        while host::sysctl("kernel/panic_on_oops").as_deref() != Some("1") && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        restore_sysctls(&self.before.sysctls, &["vm/", "kernel/"]);
        self.start_seconds = started.elapsed().as_secs_f64();
        Ok(())
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

    /// Removes the cluster's data (etcd, containerd's content and snapshots, the images), keeping
    /// the certificates and logs; for after a [`RealCluster::stop`] that left the host clean.
    pub fn remove_data(&self) {
        for dir in ["var", "images"] {
            let _ = std::fs::remove_dir_all(self.state.join(dir));
        }
        let _ = std::fs::remove_file(self.state.join("pause.tar"));
    }

    /// Stops every component, removes what the cluster added to the host and puts back the
    /// kernel settings. Returns what still differs from the host before the start (empty when
    /// the host is as it was).
    pub fn stop(&self) -> Stopped {
        let steps = teardown(&self.assets, &self.network.bridge, &self.before.sysctls);
        let mut leftovers = host::Snapshot::take().differences(&self.before);
        let sock = Self::containerd_socket();
        for needle in [self.state.to_string_lossy().into_owned(), sock.to_string_lossy().into_owned()] {
            leftovers.extend(
                host::processes_mentioning(&needle).into_iter().map(|(pid, cmd)| format!("process {pid}: {cmd}")),
            );
        }
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

fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: signalling a process we started (its pid file names the program, checked below).
    unsafe {
        libc::kill(pid as libc::pid_t, sig);
    }
}

/// Pid of a component from its pid file, if that process still runs the recorded program.
fn recorded_pid(name: &str) -> Option<u32> {
    let text = std::fs::read_to_string(Path::new(RUN_DIR).join(format!("{name}.pid"))).ok()?;
    let mut lines = text.lines();
    let pid: u32 = lines.next()?.parse().ok()?;
    let program = lines.next()?;
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok()?;
    let target = std::fs::canonicalize(program).unwrap_or_else(|_| PathBuf::from(program));
    (exe == target).then_some(pid)
}

fn stop_components(names: &[&str], grace: Duration) {
    let pids: Vec<u32> = names.iter().filter_map(|n| recorded_pid(n)).collect();
    for pid in &pids {
        signal(*pid, libc::SIGTERM);
    }
    let deadline = Instant::now() + grace;
    while pids.iter().any(|p| alive(*p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    for pid in pids.iter().filter(|p| alive(**p)) {
        signal(*pid, libc::SIGKILL);
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while pids.iter().any(|p| alive(*p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
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
    let _ = teardown(&assets, &Network::default().bridge, &saved);
}

/// Stops the components, the pods (through CRI, so each gets its CNI DEL) and the shims,
/// unmounts what is left, removes the kubelet's cgroups and iptables chains, the harness's
/// FORWARD rules and bridge, and writes the saved kernel settings back.
fn teardown(
    assets: &Path,
    bridge: &str,
    saved_sysctls: &std::collections::BTreeSet<String>,
) -> Vec<(&'static str, f64)> {
    let mut steps = Vec::new();
    let mut t = Instant::now();
    let mut step = |name: &'static str, t: &mut Instant| {
        steps.push((name, t.elapsed().as_secs_f64()));
        *t = Instant::now();
    };
    let run_dir = Path::new(RUN_DIR);
    let sock = RealCluster::containerd_socket();
    stop_components(&COMPONENTS[..4], Duration::from_secs(20));
    step("node components", &mut t);
    let _ = run(&assets.join("kube-proxy").to_string_lossy(), &["--cleanup"]);
    if recorded_pid("containerd").is_some() {
        let endpoint = format!("unix://{}", sock.display());
        let _ = run(&assets.join("rc-cri").to_string_lossy(), &["-endpoint", &endpoint, "stopall"]);
    }
    step("pods", &mut t);
    stop_components(&["containerd"], Duration::from_secs(20));
    for (pid, cmd) in host::processes_mentioning(&sock.to_string_lossy()) {
        if cmd.contains("containerd-shim") {
            signal(pid, libc::SIGKILL);
        }
    }
    step("containerd", &mut t);
    // One after the other: an API server whose etcd is already gone waits out its grace.
    stop_components(&["kube-apiserver"], Duration::from_secs(20));
    step("kube-apiserver", &mut t);
    stop_components(&["etcd"], Duration::from_secs(20));
    step("etcd", &mut t);

    let state = std::fs::read_to_string(run_dir.join("state")).unwrap_or_default();
    let roots: Vec<String> = [state.trim().to_string(), RUN_DIR.to_string()]
        .into_iter()
        .filter(|r| !r.is_empty())
        .map(|r| format!("{r}/"))
        .collect();
    for _ in 0..3 {
        let mut mounts: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split_whitespace().nth(4).map(str::to_string))
            .filter(|m| roots.iter().any(|r| m.starts_with(r.as_str())))
            .collect();
        if mounts.is_empty() {
            break;
        }
        mounts.sort_by(|a, b| b.cmp(a));
        for m in mounts {
            if run("umount", &[&m]).is_err() {
                let _ = run("umount", &["-l", &m]);
            }
        }
    }
    remove_kubepods_cgroups();
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
    for dir in ["-i", "-o"] {
        while run(
            "iptables",
            &["-w", "-D", "FORWARD", dir, bridge, "-m", "comment", "--comment", RULE_COMMENT, "-j", "ACCEPT"],
        )
        .is_ok()
        {}
    }
    let _ = run("ip", &["link", "del", bridge]);
    restore_sysctls(saved_sysctls, &[""]);
    let _ = std::fs::remove_dir_all(run_dir);
    step("host", &mut t);
    steps
}

/// Removes the kubelet's (empty, once the pods are gone) `kubepods` cgroups, deepest first.
fn remove_kubepods_cgroups() {
    let Ok(controllers) = std::fs::read_dir("/sys/fs/cgroup") else { return };
    let mut roots: Vec<PathBuf> = controllers.flatten().map(|c| c.path().join("kubepods")).collect();
    roots.push(PathBuf::from("/sys/fs/cgroup/kubepods"));
    for root in roots.into_iter().filter(|r| r.is_dir()) {
        let mut dirs = Vec::new();
        collect_dirs(&root, &mut dirs);
        dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
        for dir in dirs {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

fn collect_dirs(dir: &Path, out: &mut Vec<PathBuf>) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                collect_dirs(&entry.path(), out);
            }
        }
    }
    out.push(dir.to_path_buf());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pod_range_is_the_node_addresses_network() {
        assert_eq!(Network::default().pod_cidr(), "10.244.0.0/24");
    }
}
