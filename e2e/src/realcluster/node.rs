//! A Node's processes: containerd, the kubelet and kube-proxy, with the configuration each
//! reads (rendered from a [`NodePlan`], the pure part), started inside the Node's network
//! namespace for the Nodes added to the host's, and stopped as a machine losing power would
//! stop them.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::process::{self, Launcher, Spec};
use super::{cgroup, host, images, netns, run, write};
use crate::Error;

/// The kubelet's and kube-proxy's ports, below the kernel's ephemeral range.
pub(crate) const KUBELET_PORT: u16 = 24250;
/// kube-proxy's metrics port (loopback; each Node has its own).
pub(crate) const PROXY_METRICS_PORT: u16 = 24249;
/// kube-proxy's health port: where load balancers check Nodes (its default, on the node IP).
pub const PROXY_HEALTH_PORT: u16 = 10256;

/// The daemons of a Node, in the order they start.
pub(crate) const DAEMONS: &[&str] = &["containerd", "kubelet", "kube-proxy"];

/// What every Node's configuration needs from the host.
#[derive(Debug, Clone)]
pub(crate) struct Host {
    /// The runc binary.
    pub runc: PathBuf,
    /// The CNI plugins' directory.
    pub cni_bin: PathBuf,
    /// Whether containerd must clamp `oom_score_adj` (root without CAP_SYS_RESOURCE).
    pub restrict_oom: bool,
    /// The resolver list the Pods get.
    pub resolv: String,
    /// The cluster CA (the kubelet's client CA).
    pub ca: PathBuf,
}

/// One Node: its name and number, its addresses, where its files live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodePlan {
    /// The Node's name.
    pub name: String,
    /// 1 for the host's Node, 2 and up for the added ones.
    pub number: usize,
    /// The node address (`--node-ip`, kube-proxy's NodePorts and health port).
    pub ip: Ipv4Addr,
    /// This Node's Pod range.
    pub pod_cidr: String,
    /// The CNI bridge's address, the Pods' gateway.
    pub pod_gateway: Ipv4Addr,
    /// Every Node's Pod ranges together (kube-proxy's `clusterCIDR`).
    pub cluster_cidr: String,
    /// The CNI bridge (the host's bridge for the host's Node; one inside each namespace else).
    pub cni_bridge: String,
    /// The network namespace (also its cgroup root, its host-side veth); None for the host's.
    pub netns: Option<String>,
    /// Its configuration, data and logs (`etc/`, `var/`, `logs/`).
    pub dir: PathBuf,
    /// Pid files, containerd's state and socket, the CNI plugin's IP allocations.
    pub run: PathBuf,
}

impl NodePlan {
    /// `etc/`: configuration files and kubeconfigs.
    pub fn etc(&self) -> PathBuf {
        self.dir.join("etc")
    }

    /// `var/`: containerd's content, the kubelet's root, Pod logs.
    pub fn var(&self) -> PathBuf {
        self.dir.join("var")
    }

    /// A daemon's log.
    pub fn log(&self, daemon: &str) -> PathBuf {
        self.dir.join("logs").join(format!("{daemon}.log"))
    }

    /// A daemon's pid file.
    pub fn pid_file(&self, daemon: &str) -> PathBuf {
        self.run.join(format!("{daemon}.pid"))
    }

    /// containerd's socket.
    pub fn socket(&self) -> PathBuf {
        self.run.join("containerd/containerd.sock")
    }

    /// The kubelet's `cgroupRoot`, for a Node in a namespace.
    pub fn cgroup_root(&self) -> Option<String> {
        self.netns.as_deref().map(cgroup::root_of)
    }

    /// containerd's configuration. A Node in a namespace keeps its Pods' namespaces under its
    /// own state directory and its own runc state, so that its stop finds exactly its own.
    pub(crate) fn containerd_toml(&self, host: &Host) -> String {
        let s = |p: &Path| p.to_string_lossy().into_owned();
        let own = self.netns.is_some();
        format!(
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
{netns}  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "{runc}"
{runc_root}  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{cni}"
    conf_dir = "{cni_conf}"
"#,
            root = s(&self.var().join("containerd")),
            run = s(&self.run),
            sock = s(&self.socket()),
            pause = images::PAUSE,
            restrict_oom = host.restrict_oom,
            netns = if own { "  netns_mounts_under_state_dir = true\n" } else { "" },
            runc = s(&host.runc),
            runc_root = if own { format!("        Root = \"{}/runc\"\n", s(&self.run)) } else { String::new() },
            cni = s(&host.cni_bin),
            cni_conf = s(&self.etc().join("cni")),
        )
    }

    /// The CNI configuration: the bridge plugin on this Node's bridge and Pod range, no
    /// masquerade (the Nodes route each other's Pod ranges).
    pub(crate) fn cni_conflist(&self) -> String {
        serde_json::json!({
            "cniVersion": "1.0.0",
            "name": "ccm-realcluster",
            "plugins": [
                {
                    "type": "bridge", "bridge": self.cni_bridge, "isGateway": true, "ipMasq": false, "hairpinMode": true,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": self.pod_cidr, "gateway": self.pod_gateway.to_string()}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": format!("{}/cni-ipam", self.run.to_string_lossy()),
                    }
                },
                {"type": "portmap", "capabilities": {"portMappings": true}}
            ]
        })
        .to_string()
    }

    /// The kubelet's configuration file.
    pub(crate) fn kubelet_yaml(&self, host: &Host) -> String {
        format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# 1.35+ refuses cgroup v1 (and hybrid) hosts unless told otherwise.
failCgroupV1: false
cgroupDriver: cgroupfs
{cgroup_root}failSwapOn: false
containerRuntimeEndpoint: unix://{sock}
address: {ip}
port: {KUBELET_PORT}
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
            cgroup_root = match self.cgroup_root() {
                // Two kubelets must not share /kubepods.
                Some(root) => format!("cgroupRoot: {root}\n"),
                None => String::new(),
            },
            sock = self.socket().to_string_lossy(),
            ip = self.ip,
            pod_logs = self.var().join("pod-logs").to_string_lossy(),
            ca = host.ca.to_string_lossy(),
            resolv = host.resolv,
        )
    }

    /// The kubelet's command line.
    pub(crate) fn kubelet_args(&self) -> Vec<String> {
        let s = |p: PathBuf| p.to_string_lossy().into_owned();
        vec![
            format!("--config={}", s(self.etc().join("kubelet.yaml"))),
            format!("--kubeconfig={}", s(self.etc().join("kubelet.kubeconfig"))),
            format!("--root-dir={}", s(self.var().join("kubelet"))),
            format!("--cert-dir={}", s(self.var().join("kubelet/pki"))),
            format!("--hostname-override={}", self.name),
            format!("--node-ip={}", self.ip),
            "--cloud-provider=external".into(),
            "--v=1".into(),
        ]
    }

    /// kube-proxy's configuration file.
    pub(crate) fn kube_proxy_yaml(&self) -> String {
        format!(
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {{kubeconfig: {kubeconfig}}}
mode: iptables
clusterCIDR: {pods}
hostnameOverride: {node}
bindAddress: {ip}
# Load balancers health-check Nodes here (kube-proxy's default port), so it is on the node
# address as in any cluster; never on the host's other interfaces.
healthzBindAddress: {ip}:{PROXY_HEALTH_PORT}
metricsBindAddress: 127.0.0.1:{PROXY_METRICS_PORT}
nodePortAddresses: [\"{ip}/32\"]
# 0: leave the host's conntrack settings alone (kube-proxy would set them host-wide).
conntrack: {{maxPerCore: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}}
",
            kubeconfig = self.etc().join("kube-proxy.kubeconfig").to_string_lossy(),
            pods = self.cluster_cidr,
            node = self.name,
            ip = self.ip,
        )
    }

    /// kube-proxy's command line.
    pub(crate) fn kube_proxy_args(&self) -> Vec<String> {
        vec![format!("--config={}", self.etc().join("kube-proxy.yaml").to_string_lossy()), "--v=1".into()]
    }

    /// containerd's command line.
    pub(crate) fn containerd_args(&self) -> Vec<String> {
        vec!["--config".into(), self.etc().join("containerd.toml").to_string_lossy().into_owned()]
    }

    /// Writes the four configuration files.
    pub(crate) fn write_config(&self, host: &Host) -> Result<(), Error> {
        for dir in [self.etc().join("cni"), self.var(), self.dir.join("logs"), self.run.join("containerd")] {
            std::fs::create_dir_all(&dir).map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
        }
        write(&self.etc().join("containerd.toml"), &self.containerd_toml(host))?;
        write(&self.etc().join("cni/10-ccm-realcluster.conflist"), &self.cni_conflist())?;
        write(&self.etc().join("kubelet.yaml"), &self.kubelet_yaml(host))?;
        write(&self.etc().join("kube-proxy.yaml"), &self.kube_proxy_yaml())
    }

    fn spec(&self, program: PathBuf, daemon: &str, args: Vec<String>) -> Spec {
        Spec {
            program,
            args,
            log: self.log(daemon),
            pid_file: self.pid_file(daemon),
            netns: self.netns.as_deref().map(netns::path),
            hostname: self.netns.as_ref().map(|_| self.name.clone()),
        }
    }
}

/// Starts a Node in its namespace (made by the caller, with its configuration and kubeconfigs
/// written): its cgroup root, containerd with `images` imported, the kubelet and kube-proxy,
/// all from the launcher's thread. Returns the kubelet's pid.
pub(crate) fn start(plan: &NodePlan, assets: &Path, launcher: &Launcher, images: &[PathBuf]) -> Result<u32, Error> {
    if let Some(root) = plan.cgroup_root() {
        cgroup::create(root.trim_start_matches('/'))?;
    }
    let containerd = which_containerd();
    let pid = launcher.launch(plan.spec(containerd, "containerd", plan.containerd_args()))?;
    let sock = plan.socket().to_string_lossy().into_owned();
    process::wait_for("containerd up", Some(pid), Duration::from_secs(30), &plan.log("containerd"), || {
        run("ctr", &["-a", &sock, "version"]).is_ok()
    })?;
    for archive in images {
        images::import_into(&plan.socket(), archive)?;
    }
    let kubelet = launcher.launch(plan.spec(assets.join("kubelet"), "kubelet", plan.kubelet_args()))?;
    launcher.launch(plan.spec(assets.join("kube-proxy"), "kube-proxy", plan.kube_proxy_args()))?;
    Ok(kubelet)
}

/// Kills a running Node's kube-proxy alone, as a crash would (SIGKILL: its rules stay, its
/// health endpoint goes).
pub(crate) fn kill_kube_proxy(plan: &NodePlan) {
    process::stop_components(&plan.run, &["kube-proxy"], Duration::ZERO);
}

/// Starts a running Node's kube-proxy again, from the launcher's thread.
pub(crate) fn start_kube_proxy(plan: &NodePlan, assets: &Path, launcher: &Launcher) -> Result<u32, Error> {
    launcher.launch(plan.spec(assets.join("kube-proxy"), "kube-proxy", plan.kube_proxy_args()))
}

fn which_containerd() -> PathBuf {
    super::which("containerd").unwrap_or_else(|| PathBuf::from("containerd"))
}

/// Stops the Node in namespace `netns` as a machine losing power would: its link to the
/// segment goes first, so no FIN or RST leaves it (peers' TCP connections and BGP sessions
/// to it end by their own timeouts, or by the RSTs of the Node once it is back); then SIGKILL
/// to everything in its namespace (containerd, the kubelet, kube-proxy, the shims,
/// host-network Pods) and in its cgroups (the other Pods); then what a reboot would clear: the
/// shims' sockets, the mounts under `dirs`, its run directory, its cgroups, its namespace.
/// Its data (`var/`) stays for a restart.
pub(crate) fn power_off(netns_name: &str, run_dir: &Path, dirs: &[PathBuf]) {
    let _ = run("ip", &["link", "del", netns_name]);
    let root = netns_name.to_string();
    let shims: Vec<String> = netns::pids_in(netns_name)
        .into_iter()
        .filter_map(|pid| {
            let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            shim_of(&String::from_utf8_lossy(&raw))
        })
        .filter_map(|(address, namespace, id)| shim_socket(&address, &namespace, &id))
        .collect();
    process::kill_all(
        || {
            let mut all = netns::pids_in(netns_name);
            all.extend(cgroup::pids(&root));
            all.sort_unstable();
            all.dedup();
            all
        },
        Duration::from_secs(15),
    );
    for socket in shims {
        let _ = std::fs::remove_file(socket);
    }
    let mut roots: Vec<String> = dirs.iter().map(|d| format!("{}/", d.to_string_lossy())).collect();
    roots.push(format!("{}/", run_dir.to_string_lossy()));
    host::unmount_under(&roots);
    let _ = std::fs::remove_dir_all(run_dir);
    cgroup::remove(&root);
    netns::delete(netns_name);
}

/// Stops the kubelet and kube-proxy of a running Node gracefully (their connections to the
/// API server close), for the cluster's own stop; [`power_off`] does the rest.
pub(crate) fn stop_gracefully(run_dir: &Path) {
    process::stop_components(run_dir, &["kube-proxy", "kubelet"], Duration::from_secs(10));
}

/// The containerd address, namespace and container id of a shim's command line
/// (`containerd-shim-runc-v2 -namespace NS -id ID -address SOCK`; NUL- or space-separated).
pub(crate) fn shim_of(cmdline: &str) -> Option<(String, String, String)> {
    let words: Vec<&str> = cmdline.split(['\0', ' ']).filter(|w| !w.is_empty()).collect();
    if !words.first()?.contains("containerd-shim") {
        return None;
    }
    let value = |flag: &str| words.windows(2).find(|w| w[0] == flag).map(|w| w[1].to_string());
    Some((value("-address")?, value("-namespace")?, value("-id")?))
}

/// The socket a shim listens on: containerd names it by the SHA-256 of
/// `ADDRESS/NAMESPACE/ID` under `/run/containerd/s` (host-wide, whatever the containerd).
fn shim_socket(address: &str, namespace: &str, id: &str) -> Option<String> {
    use std::io::Write;
    let mut child = std::process::Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .ok()?;
    child.stdin.take()?.write_all(format!("{address}/{namespace}/{id}").as_bytes()).ok()?;
    let out = child.wait_with_output().ok()?;
    let digest = String::from_utf8_lossy(&out.stdout).split_whitespace().next()?.to_string();
    Some(format!("/run/containerd/s/{digest}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host() -> Host {
        Host {
            runc: "/usr/sbin/runc".into(),
            cni_bin: "/usr/lib/cni".into(),
            restrict_oom: true,
            resolv: "/etc/resolv.conf".into(),
            ca: "/s/pki/ca.crt".into(),
        }
    }

    fn added() -> NodePlan {
        NodePlan {
            name: "node-2".into(),
            number: 2,
            ip: Ipv4Addr::new(198, 19, 0, 2),
            pod_cidr: "10.244.1.0/24".into(),
            pod_gateway: Ipv4Addr::new(10, 244, 1, 1),
            cluster_cidr: "10.244.0.0/16".into(),
            cni_bridge: "cni0".into(),
            netns: Some("ccmrc-node-2".into()),
            dir: "/s/nodes/node-2".into(),
            run: "/run/ccm-realcluster/nodes/node-2".into(),
        }
    }

    fn hosts() -> NodePlan {
        NodePlan {
            name: "vm".into(),
            number: 1,
            ip: Ipv4Addr::new(10, 244, 0, 1),
            pod_cidr: "10.244.0.0/24".into(),
            pod_gateway: Ipv4Addr::new(10, 244, 0, 1),
            cni_bridge: "ccmrc0".into(),
            netns: None,
            dir: "/s".into(),
            run: "/run/ccm-realcluster".into(),
            ..added()
        }
    }

    #[test]
    fn an_added_nodes_kubelet_has_its_own_cgroup_root_root_dir_socket_and_node_ip() {
        let plan = added();
        let yaml = plan.kubelet_yaml(&host());
        assert!(yaml.contains("cgroupRoot: /ccmrc-node-2\n"), "{yaml}");
        assert!(
            yaml.contains(
                "containerRuntimeEndpoint: unix:///run/ccm-realcluster/nodes/node-2/containerd/containerd.sock"
            )
        );
        assert!(yaml.contains("address: 198.19.0.2\n"));
        assert!(yaml.contains("podLogsDir: /s/nodes/node-2/var/pod-logs\n"));
        assert_eq!(
            plan.kubelet_args(),
            [
                "--config=/s/nodes/node-2/etc/kubelet.yaml",
                "--kubeconfig=/s/nodes/node-2/etc/kubelet.kubeconfig",
                "--root-dir=/s/nodes/node-2/var/kubelet",
                "--cert-dir=/s/nodes/node-2/var/kubelet/pki",
                "--hostname-override=node-2",
                "--node-ip=198.19.0.2",
                "--cloud-provider=external",
                "--v=1",
            ]
        );
    }

    #[test]
    fn the_hosts_node_keeps_the_default_kubepods_and_containerds_shared_paths() {
        let plan = hosts();
        assert!(!plan.kubelet_yaml(&host()).contains("cgroupRoot"));
        let toml = plan.containerd_toml(&host());
        assert!(!toml.contains("netns_mounts_under_state_dir") && !toml.contains("Root ="), "{toml}");
        assert!(toml.contains("state = \"/run/ccm-realcluster/containerd\"\n"));
        assert!(toml.contains("address = \"/run/ccm-realcluster/containerd/containerd.sock\"\n"));
        assert!(toml.contains("root = \"/s/var/containerd\"\n"));
        assert_eq!(plan.cgroup_root(), None);
    }

    #[test]
    fn an_added_nodes_containerd_keeps_pod_namespaces_and_runc_state_under_its_own_run_directory() {
        let toml = added().containerd_toml(&host());
        assert!(toml.contains("  netns_mounts_under_state_dir = true\n  stream_server_address"), "{toml}");
        assert!(toml.contains("        Root = \"/run/ccm-realcluster/nodes/node-2/runc\"\n  [plugins"), "{toml}");
        assert!(toml.contains("restrict_oom_score_adj = true\n"));
        assert!(toml.contains("conf_dir = \"/s/nodes/node-2/etc/cni\"\n"));
    }

    #[test]
    fn the_cni_bridge_serves_the_nodes_pod_range_without_masquerade() {
        let conf: serde_json::Value = serde_json::from_str(&added().cni_conflist()).expect("JSON");
        let bridge = &conf["plugins"][0];
        assert_eq!(bridge["bridge"], "cni0");
        assert_eq!(bridge["ipMasq"], false);
        assert_eq!(bridge["ipam"]["ranges"][0][0]["subnet"], "10.244.1.0/24");
        assert_eq!(bridge["ipam"]["ranges"][0][0]["gateway"], "10.244.1.1");
        assert_eq!(bridge["ipam"]["dataDir"], "/run/ccm-realcluster/nodes/node-2/cni-ipam");
    }

    #[test]
    fn kube_proxy_serves_nodeports_and_health_on_the_node_address_for_the_whole_pod_range() {
        let yaml = added().kube_proxy_yaml();
        assert!(yaml.contains("clusterCIDR: 10.244.0.0/16\n"), "{yaml}");
        assert!(yaml.contains("healthzBindAddress: 198.19.0.2:10256\n"));
        assert!(yaml.contains("nodePortAddresses: [\"198.19.0.2/32\"]\n"));
        assert!(yaml.contains("hostnameOverride: node-2\n"));
        assert!(yaml.contains("kubeconfig: /s/nodes/node-2/etc/kube-proxy.kubeconfig}"));
    }

    #[test]
    fn an_added_nodes_daemons_enter_its_namespace_with_its_name_as_host_name() {
        let spec = added().spec("/a/kubelet".into(), "kubelet", vec![]);
        assert_eq!(spec.netns, Some(PathBuf::from("/run/netns/ccmrc-node-2")));
        assert_eq!(spec.hostname.as_deref(), Some("node-2"));
        assert_eq!(spec.pid_file, PathBuf::from("/run/ccm-realcluster/nodes/node-2/kubelet.pid"));
        assert_eq!(spec.log, PathBuf::from("/s/nodes/node-2/logs/kubelet.log"));
        let spec = hosts().spec("/a/kubelet".into(), "kubelet", vec![]);
        assert_eq!((spec.netns, spec.hostname), (None, None));
    }

    #[test]
    fn a_shims_command_line_names_its_containerd_namespace_and_container() {
        let cmd =
            "/usr/bin/containerd-shim-runc-v2\0-namespace\0k8s.io\0-id\0abc123\0-address\0/run/x/containerd.sock\0";
        assert_eq!(shim_of(cmd), Some(("/run/x/containerd.sock".into(), "k8s.io".into(), "abc123".into())));
        assert_eq!(shim_of("/usr/bin/containerd --config x"), None);
    }
}
