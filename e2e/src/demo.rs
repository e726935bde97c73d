//! The sandbox demo: the operator in-process against the local API server, a baremetal
//! `CloudControllerManager` (Embedded or Deployment mode) with an inventory of simulated machines,
//! Nodes registered the way kubelets with `--cloud-provider=external` register, and one
//! `type: LoadBalancer` Service. In Deployment mode the [`Kubelet`] runs the manager replicas as
//! local processes.
//!
//! The Service carries traffic: the Nodes' InternalIPs and the load-balancer pool are loopback
//! addresses (Linux routes all of `127.0.0.0/8` to `lo`), the baremetal provider runs in `proxy`
//! mode, and [`NodePorts`] answers on each emulated Node's nodePorts, so
//! `curl http://<EXTERNAL-IP>:<port>/` works from the user's shell. The inventory configures no
//! probes, and nothing outside the machine is ever contacted.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crds::CloudControllerManager;
use crds::conditions::types;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Secret, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use operator::{OperatorConfig, OperatorHandle};
use serde_json::json;

use crate::Error;
use crate::kubelet::{Kubelet, KubeletConfig, NodePorts, PodInfo};

/// The taint a kubelet with `--cloud-provider=external` registers its Node with.
pub const UNINITIALIZED: &str = "node.cloudprovider.kubernetes.io/uninitialized";
/// Namespace of the CloudControllerManager and its Secret.
pub const NAMESPACE: &str = "kube-system";
/// Name of the CloudControllerManager.
pub const CR_NAME: &str = "baremetal";
/// Name of the cloud-config Secret.
pub const SECRET_NAME: &str = "baremetal-cloud-config";
/// Key of the cloud-config in the Secret.
pub const SECRET_KEY: &str = "cloud.yaml";
/// The LoadBalancer Service (in `default`).
pub const SERVICE_NAME: &str = "web";
/// The Service's port (above 1024, so an unprivileged user's data path can listen on it).
pub const SERVICE_PORT: i32 = 8000;
/// The simulated machines: name, last octet of the InternalIP (see [`node_ip`]), zone.
pub const MACHINES: [(&str, u8, &str); 3] =
    [("bm-node-1", 11, "rack-a"), ("bm-node-2", 12, "rack-a"), ("bm-node-3", 13, "rack-b")];

/// The load-balancer pool of loopback network `net`: `127.<net>.0.240/28`.
pub fn lb_pool(net: u8) -> String {
    format!("127.{net}.0.240/28")
}

/// A simulated machine's InternalIP on loopback network `net`: `127.<net>.1.<host>`.
pub fn node_ip(net: u8, host: u8) -> String {
    format!("127.{net}.1.{host}")
}
/// After this long without a progress line, the wait says what it still waits for.
const WAITING_NOTICE: Duration = Duration::from_secs(5);
/// Field manager of the objects the demo writes as "the user".
const USER: &str = "sandbox-demo";
/// Field manager of the Nodes the demo registers as "the kubelets".
const KUBELET: &str = "kubelet";

/// Which way the demo runs the manager.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DemoMode {
    /// Inside the operator.
    #[default]
    Embedded,
    /// As a Deployment, whose replicas the emulated kubelet runs as local processes.
    Deployment,
}

impl std::fmt::Display for DemoMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DemoMode::Embedded => "Embedded",
            DemoMode::Deployment => "Deployment",
        })
    }
}

/// Demo settings.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// Embedded or Deployment mode.
    pub mode: DemoMode,
    /// Manager replicas in Deployment mode.
    pub replicas: i32,
    /// The `cloud-controller-manager` binary (Deployment mode); default: built or found by
    /// [`crate::kubelet::manager_binary`].
    pub manager_binary: Option<PathBuf>,
    /// Where the emulated kubelet keeps its files (default: the system temporary directory).
    pub work_root: Option<PathBuf>,
    /// Second octet of the loopback addresses (pool `127.<net>.0.240/28`, Nodes
    /// `127.<net>.1.11`-`13`); another value lets two demos run side by side.
    pub loopback_net: u8,
}

impl Default for DemoOptions {
    fn default() -> Self {
        Self { mode: DemoMode::Embedded, replicas: 2, manager_binary: None, work_root: None, loopback_net: 0 }
    }
}

/// The baremetal inventory of the simulated machines on loopback network `net`, with `pool` for
/// load balancers: a loopback CIDR turns on `proxy` mode (the manager's leader carries the
/// traffic); any other pool (a CIDR or a `first-last` range) only hands out addresses.
pub fn cloud_config(net: u8, pool: &str) -> String {
    let mut yaml = String::from("# Simulated machines on loopback, never probed.\ninstances:\n");
    for (name, host, zone) in MACHINES {
        let ip = node_ip(net, host);
        yaml.push_str(&format!(
            "  - name: {name}\n    addresses:\n      - {{type: InternalIP, address: {ip}}}\n      - {{type: Hostname, address: {name}}}\n    instanceType: sandbox-small\n    zone: {zone}\n    region: sandbox\n"
        ));
    }
    let key = if pool.contains('/') { "cidrs" } else { "ranges" };
    if pool.starts_with("127.") {
        // Short health-check and drain times: a deleted Node leaves the rotation at once.
        yaml.push_str(&format!(
            "loadBalancer:\n  mode: proxy\n  proxy:\n    healthCheckInterval: 1s\n    drainTimeout: 5s\n  pools:\n    - name: sandbox\n      {key}: [\"{pool}\"]\n      allowedPorts: [\"1024-65535\"]\n      allowLoopback: true\n"
        ));
    } else {
        yaml.push_str(&format!("loadBalancer:\n  pools:\n    - name: sandbox\n      {key}: [\"{pool}\"]\n"));
    }
    yaml
}

/// The CloudControllerManager the demo applies (sandbox-tuned leader election, so a crashed
/// leader is replaced within seconds).
pub fn cr_spec(mode: DemoMode, replicas: i32) -> serde_json::Value {
    json!({
        "provider": "baremetal",
        "mode": mode.to_string(),
        "clusterName": "sandbox",
        "cloudConfig": {"secretRef": {"name": SECRET_NAME, "key": SECRET_KEY}},
        "controllers": ["*", "-route"],
        "leaderElection": {"leaseDuration": "6s", "renewDeadline": "4s", "retryPeriod": "1s"},
        "deployment": {"replicas": replicas},
    })
}

/// One manager process as the live log follows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessState {
    /// Its pid while a process runs.
    pub pid: Option<u32>,
    /// Whether its `/readyz` answered 200.
    pub ready: bool,
    /// Restarts after exits.
    pub restarts: u32,
    /// Being stopped (a rollout or a scale-down).
    pub terminating: bool,
    /// How its last process exited.
    pub last_exit: Option<String>,
    /// Its pod-template hash (first 8 characters).
    pub template: String,
    /// Its `/healthz` address.
    pub endpoint: String,
}

/// What the live log compares from one look at the cluster to the next.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct World {
    /// The manager Lease's holder.
    pub leader: Option<String>,
    /// Manager processes by pod name (Deployment mode).
    pub processes: BTreeMap<String, ProcessState>,
    /// Nodes: name to providerID when initialized (providerID set, taint gone), else `None`.
    pub nodes: BTreeMap<String, Option<String>>,
    /// LoadBalancer Services (`namespace/name`) to their ingress addresses.
    pub services: BTreeMap<String, Vec<String>>,
    /// LoadBalancer Services (`namespace/name`) to their ports (`8000/TCP`).
    pub service_ports: BTreeMap<String, Vec<String>>,
    /// The CloudControllerManager's conditions: type to `(status, reason)`.
    pub conditions: BTreeMap<String, (String, String)>,
    /// The cloud-config Secret's resourceVersion.
    pub secret_version: Option<String>,
    /// The manager Deployment's generation (Deployment mode).
    pub deployment_generation: Option<i64>,
}

/// The live log's lines for what changed between two looks (pure), one line per change, in a
/// stable order: Secret, Deployment, processes, Lease, conditions, Nodes, Services.
pub fn changes(before: &World, after: &World) -> Vec<String> {
    let mut out = Vec::new();
    if before.secret_version.is_some() && after.secret_version != before.secret_version {
        match &after.secret_version {
            Some(v) => out.push(format!(
                "Secret {NAMESPACE}/{SECRET_NAME} changed (resourceVersion {v}): the operator rolls the cloud-config out"
            )),
            None => out.push(format!("Secret {NAMESPACE}/{SECRET_NAME} deleted")),
        }
    }
    if let (Some(b), Some(a)) = (before.deployment_generation, after.deployment_generation)
        && a != b
    {
        out.push(format!(
            "Deployment {NAMESPACE}/{}: new pod template (generation {a}): rolling out, one process at a time",
            operator::names::workload_name(CR_NAME)
        ));
    }
    for (name, p) in &after.processes {
        let old = before.processes.get(name);
        match old {
            None => out.push(match p.pid {
                Some(pid) => {
                    format!("process {name} started (pid {pid}, template {}, http://{})", p.template, p.endpoint)
                }
                None => format!("process {name} created"),
            }),
            Some(o) => {
                if o.last_exit != p.last_exit
                    && let Some(exit) = &p.last_exit
                {
                    let was_leader = before.leader.as_deref().is_some_and(|l| l.starts_with(&format!("{name}_")));
                    let role = if was_leader { " (the leader)" } else { "" };
                    let what = if p.terminating || o.terminating { "stopped" } else { "exited" };
                    out.push(format!("process {name}{role} {what}: {exit}"));
                }
                if p.restarts > o.restarts
                    && let Some(pid) = p.pid
                {
                    out.push(format!("process {name} restarted (pid {pid}, restart #{})", p.restarts));
                }
                if p.terminating && !o.terminating {
                    out.push(format!("process {name} stopping (SIGTERM): replaced by the rollout"));
                }
                if p.ready && !o.ready {
                    out.push(format!("process {name} ready"));
                } else if !p.ready && o.ready && !p.terminating && p.pid.is_some() {
                    out.push(format!("process {name} not ready"));
                }
            }
        }
    }
    for (name, p) in before.processes.iter().filter(|(n, _)| !after.processes.contains_key(*n)) {
        // Processes of an older template removed while newer ones run: the rollout replaced it.
        let replaced = after.processes.values().any(|q| q.template != p.template);
        if replaced && !p.terminating {
            out.push(format!("process {name} stopped (SIGTERM) and removed: replaced by the rollout"));
        } else {
            out.push(format!("process {name} removed"));
        }
    }
    if after.leader != before.leader {
        match (&before.leader, &after.leader) {
            (_, Some(now)) => out.push(format!(
                "leader: {now} holds Lease {NAMESPACE}/{CR_NAME}{}",
                before.leader.as_ref().map_or_else(String::new, |b| format!(" (was {b})"))
            )),
            (Some(was), None) => out.push(format!("leader: {was} released Lease {NAMESPACE}/{CR_NAME}")),
            (None, None) => {}
        }
    }
    for (t, (status, reason)) in &after.conditions {
        if before.conditions.get(t) != Some(&(status.clone(), reason.clone())) {
            out.push(format!("CloudControllerManager {NAMESPACE}/{CR_NAME}: {t}={status} ({reason})"));
        }
    }
    for (name, id) in &after.nodes {
        match (before.nodes.get(name), id) {
            (None, None) => out.push(format!("Node {name} registered, tainted {UNINITIALIZED}")),
            (None | Some(None), Some(id)) => {
                out.push(format!("Node {name} initialized: providerID {id}, taint removed"))
            }
            _ => {}
        }
    }
    for name in before.nodes.keys().filter(|n| !after.nodes.contains_key(*n)) {
        out.push(format!("Node {name} deleted"));
    }
    for (name, ips) in &after.services {
        let old = before.services.get(name);
        if old != Some(ips) {
            if ips.is_empty() {
                if old.is_some_and(|o| !o.is_empty()) {
                    out.push(format!("Service {name}: load-balancer address removed"));
                }
            } else {
                out.push(format!("Service {name}: load-balancer address {}", ips.join(", ")));
            }
        }
    }
    for (name, ports) in &after.service_ports {
        // A new Service's ports are news only once it has an address to reach them at.
        let reachable = after.services.get(name).is_some_and(|ips| !ips.is_empty());
        if reachable && before.service_ports.get(name).is_some_and(|old| old != ports) {
            out.push(format!("Service {name}: ports now {} (the load balancer follows)", ports.join(", ")));
        }
    }
    for name in before.services.keys().filter(|n| !after.services.contains_key(*n)) {
        out.push(format!("Service {name} deleted"));
    }
    out
}

/// The running demo.
pub struct Demo {
    client: Client,
    options: DemoOptions,
    operator: Option<OperatorHandle>,
    kubelet: Option<Kubelet>,
    /// The emulated Nodes' nodePorts and kube-proxy health ports.
    node_ports: Option<NodePorts>,
    started: Instant,
}

impl std::fmt::Debug for Demo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Demo").field("options", &self.options).finish_non_exhaustive()
    }
}

/// What the demo shows, read from the API server.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// The Nodes.
    pub nodes: Vec<Node>,
    /// The LoadBalancer Service.
    pub service: Option<Service>,
    /// The CloudControllerManager.
    pub cr: Option<CloudControllerManager>,
    /// The manager Deployment (Deployment mode).
    pub deployment: Option<Deployment>,
    /// The manager's Lease.
    pub lease: Option<Lease>,
}

impl Snapshot {
    /// Nodes with a providerID and without the uninitialized taint.
    pub fn initialized_nodes(&self) -> Vec<String> {
        self.nodes
            .iter()
            .filter(|n| {
                let spec = n.spec.clone().unwrap_or_default();
                spec.provider_id.is_some() && !spec.taints.iter().flatten().any(|t| t.key == UNINITIALIZED)
            })
            .map(|n| n.name_any())
            .collect()
    }

    /// The Service's load-balancer IP.
    pub fn external_ip(&self) -> Option<String> {
        self.service
            .as_ref()?
            .status
            .as_ref()?
            .load_balancer
            .as_ref()?
            .ingress
            .as_ref()?
            .iter()
            .find_map(|i| i.ip.clone())
    }

    /// The address a client reaches the Service's first TCP port at: `http://<ip>:<port>/`.
    pub fn url(&self) -> Option<String> {
        let ip = self.external_ip()?;
        let spec = self.service.as_ref()?.spec.as_ref()?;
        let port = spec.ports.iter().flatten().find(|p| p.protocol.as_deref().unwrap_or("TCP") == "TCP")?.port;
        Some(format!("http://{ip}:{port}/"))
    }

    /// A condition of the CloudControllerManager.
    pub fn condition(&self, type_: &str) -> Option<Condition> {
        self.cr.as_ref()?.status.as_ref()?.conditions.iter().find(|c| c.type_ == type_).cloned()
    }

    /// Whether a condition of the CloudControllerManager is True.
    pub fn is_true(&self, type_: &str) -> bool {
        self.condition(type_).is_some_and(|c| c.status == "True")
    }

    /// The Lease holder.
    pub fn leader(&self) -> Option<String> {
        self.lease.as_ref()?.spec.as_ref()?.holder_identity.clone().filter(|h| !h.is_empty())
    }

    /// What stands between this snapshot and the final picture, for a progress line.
    pub fn missing(&self) -> String {
        let mut parts = Vec::new();
        if self.nodes.is_empty() || self.initialized_nodes().len() < self.nodes.len() {
            parts.push(format!("{} of {} Nodes initialized", self.initialized_nodes().len(), self.nodes.len()));
        }
        if self.external_ip().is_none() {
            parts.push(format!("Service default/{SERVICE_NAME} has no load-balancer IP yet"));
        }
        match self.condition(types::READY) {
            Some(c) if c.status == "True" => {}
            Some(c) => parts.push(format!("Ready={} ({}: {})", c.status, c.reason, c.message)),
            None => parts.push(format!("CloudControllerManager {NAMESPACE}/{CR_NAME} has no conditions yet")),
        }
        if let Some(d) = &self.deployment {
            let st = d.status.clone().unwrap_or_default();
            let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
            if st.ready_replicas.unwrap_or(0) < want {
                parts.push(format!("{}/{want} manager processes ready", st.ready_replicas.unwrap_or(0)));
            }
        }
        if parts.is_empty() { "nothing".into() } else { parts.join("; ") }
    }

    /// The final picture: every Node initialized, the Service has an IP, the resource is Ready.
    pub fn is_complete(&self) -> bool {
        !self.nodes.is_empty()
            && self.initialized_nodes().len() == self.nodes.len()
            && self.external_ip().is_some()
            && self.is_true(types::READY)
    }
}

fn age(created: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>) -> String {
    let Some(t) = created else { return "<unknown>".into() };
    let secs = Timestamp::now().duration_since(t.0).as_secs().max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s => format!("{}h", s / 3600),
    }
}

/// Columns aligned as kubectl prints them (pure).
pub fn table(rows: &[Vec<String>]) -> String {
    let widths: Vec<usize> = (0..rows.iter().map(Vec::len).max().unwrap_or(0))
        .map(|i| rows.iter().filter_map(|r| r.get(i)).map(|c| c.chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in rows {
        let last = row.len().saturating_sub(1);
        for (i, cell) in row.iter().enumerate() {
            out.push_str(cell);
            if i < last {
                out.push_str(&" ".repeat(widths[i] - cell.chars().count() + 3));
            }
        }
        out.push('\n');
    }
    out
}

fn condition_status(cr: &CloudControllerManager, type_: &str) -> String {
    cr.status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == type_))
        .map_or_else(|| "<none>".to_string(), |c| c.status.clone())
}

impl Snapshot {
    /// The `kubectl get ccm,nodes,svc`-style picture (plus the Deployment and its processes in
    /// Deployment mode).
    pub fn picture(&self, pods: &[PodInfo]) -> String {
        let mut out = String::new();
        if let Some(cr) = &self.cr {
            let mode = cr.spec.mode.to_string();
            out.push_str(&table(&[
                vec![
                    "NAME".into(),
                    "PROVIDER".into(),
                    "MODE".into(),
                    "READY".into(),
                    "PROVIDERHEALTHY".into(),
                    "AGE".into(),
                ],
                vec![
                    format!("cloudcontrollermanager.ccm.rs/{}", cr.name_any()),
                    cr.spec.provider.clone(),
                    mode,
                    condition_status(cr, types::READY),
                    condition_status(cr, types::PROVIDER_HEALTHY),
                    age(cr.metadata.creation_timestamp.as_ref()),
                ],
            ]));
            out.push('\n');
        }
        let mut rows = vec![vec![
            "NAME".into(),
            "STATUS".into(),
            "PROVIDER-ID".into(),
            "INTERNAL-IP".into(),
            "ZONE".into(),
            "TAINTS".into(),
        ]];
        for n in &self.nodes {
            let spec = n.spec.clone().unwrap_or_default();
            let status = n.status.clone().unwrap_or_default();
            let ready = status.conditions.iter().flatten().find(|c| c.type_ == "Ready").map(|c| c.status.clone());
            let ip = status.addresses.iter().flatten().find(|a| a.type_ == "InternalIP").map(|a| a.address.clone());
            let zone = n.labels().get("topology.kubernetes.io/zone").cloned();
            let taints: Vec<String> = spec.taints.iter().flatten().map(|t| format!("{}:{}", t.key, t.effect)).collect();
            rows.push(vec![
                format!("node/{}", n.name_any()),
                if ready.as_deref() == Some("True") { "Ready".into() } else { "NotReady".into() },
                spec.provider_id.unwrap_or_else(|| "<none>".into()),
                ip.unwrap_or_else(|| "<none>".into()),
                zone.unwrap_or_else(|| "<none>".into()),
                if taints.is_empty() { "<none>".into() } else { taints.join(",") },
            ]);
        }
        out.push_str(&table(&rows));
        out.push('\n');
        if let Some(s) = &self.service {
            let spec = s.spec.clone().unwrap_or_default();
            let ports: Vec<String> = spec
                .ports
                .iter()
                .flatten()
                .map(|p| match p.node_port {
                    Some(np) => format!("{}:{np}/{}", p.port, p.protocol.clone().unwrap_or_else(|| "TCP".into())),
                    None => format!("{}/{}", p.port, p.protocol.clone().unwrap_or_else(|| "TCP".into())),
                })
                .collect();
            out.push_str(&table(&[
                vec![
                    "NAME".into(),
                    "TYPE".into(),
                    "CLUSTER-IP".into(),
                    "EXTERNAL-IP".into(),
                    "PORT(S)".into(),
                    "AGE".into(),
                ],
                vec![
                    format!("service/{}", s.name_any()),
                    spec.type_.unwrap_or_default(),
                    spec.cluster_ip.unwrap_or_else(|| "<none>".into()),
                    self.external_ip().unwrap_or_else(|| "<pending>".into()),
                    ports.join(","),
                    age(s.metadata.creation_timestamp.as_ref()),
                ],
            ]));
        }
        if let Some(d) = &self.deployment {
            let status = d.status.clone().unwrap_or_default();
            let desired = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
            out.push('\n');
            out.push_str(&table(&[
                vec!["NAME".into(), "READY".into(), "UP-TO-DATE".into(), "AVAILABLE".into()],
                vec![
                    format!("deployment.apps/{}", d.name_any()),
                    format!("{}/{desired}", status.ready_replicas.unwrap_or(0)),
                    status.updated_replicas.unwrap_or(0).to_string(),
                    status.available_replicas.unwrap_or(0).to_string(),
                ],
            ]));
            let leader = self.leader();
            let mut rows = vec![vec![
                "PROCESS (POD)".into(),
                "PID".into(),
                "ENDPOINT".into(),
                "READY".into(),
                "LEADER".into(),
                "RESTARTS".into(),
            ]];
            for p in pods.iter().filter(|p| !p.terminating) {
                let leads = leader.as_deref().is_some_and(|l| l.starts_with(&format!("{}_", p.name)));
                rows.push(vec![
                    p.name.clone(),
                    p.pid.map_or_else(|| "-".into(), |pid| pid.to_string()),
                    format!("http://{}", p.address()),
                    p.ready.to_string(),
                    if leads { "yes".into() } else { "no".into() },
                    p.restarts.to_string(),
                ]);
            }
            out.push('\n');
            out.push_str(&table(&rows));
        }
        if let Some(cr) = &self.cr {
            let conditions: Vec<String> = cr
                .status
                .iter()
                .flat_map(|s| s.conditions.iter())
                .map(|c| format!("{}={} {}", c.type_, c.status, c.reason))
                .collect();
            out.push_str(&format!("\nconditions of {NAMESPACE}/{CR_NAME}: {}\n", conditions.join(", ")));
        }
        out
    }
}

impl Demo {
    /// Start the operator (and, in Deployment mode, the emulated kubelet), register the Nodes,
    /// and apply the cloud-config Secret, the CloudControllerManager and the Service. `progress`
    /// receives one line per step. The CRD must be installed already.
    pub async fn start(
        client: Client,
        kubeconfig: &Path,
        options: DemoOptions,
        progress: &(dyn Fn(&str) + Sync),
    ) -> Result<Demo, Error> {
        let started = Instant::now();
        let mut config = OperatorConfig::new(client.clone());
        config.identity = format!("sandbox-operator_{}", std::process::id());
        let operator = operator::start(config).await?;
        progress("operator started (in this process)");
        let kubelet = match options.mode {
            DemoMode::Embedded => None,
            DemoMode::Deployment => {
                let binary = match &options.manager_binary {
                    Some(b) => b.clone(),
                    None => crate::kubelet::manager_binary()?,
                };
                let mut kc = KubeletConfig::new(client.clone(), kubeconfig, &binary);
                kc.work_root = options.work_root.clone();
                let kubelet = Kubelet::start(kc)?;
                progress(&format!("emulated kubelet started: runs manager replicas with {}", binary.display()));
                Some(kubelet)
            }
        };
        let node_ports = Some(NodePorts::start(client.clone()));
        let demo = Demo { client, options, operator: Some(operator), kubelet, node_ports, started };
        demo.register_nodes().await?;
        progress(&format!(
            "{} Nodes registered as kubelets with --cloud-provider=external do: Ready, tainted {UNINITIALIZED}",
            MACHINES.len()
        ));
        demo.apply_world().await?;
        progress(&format!(
            "applied Secret {NAMESPACE}/{SECRET_NAME} (inventory, pool {} in proxy mode), CloudControllerManager {NAMESPACE}/{CR_NAME} (mode {}), Service default/{SERVICE_NAME} (type LoadBalancer, port {SERVICE_PORT})",
            demo.pool(),
            demo.options.mode
        ));
        Ok(demo)
    }

    /// Time since the demo started.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// The load-balancer pool.
    pub fn pool(&self) -> String {
        lb_pool(self.options.loopback_net)
    }

    /// The emulated kubelet (Deployment mode).
    pub fn kubelet(&self) -> Option<&Kubelet> {
        self.kubelet.as_ref()
    }

    /// The demo's client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    async fn register_nodes(&self) -> Result<(), Error> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let now = Timestamp::now().to_string();
        for (name, _, _) in MACHINES {
            let node = json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": {
                    "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}},
                "spec": {"taints": [{"key": UNINITIALIZED, "value": "true", "effect": "NoSchedule"}]},
            });
            nodes.patch(name, &PatchParams::apply(KUBELET).force(), &Patch::Apply(&node)).await?;
            let status = json!({"status": {
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                    "message": "kubelet is posting ready status", "lastHeartbeatTime": now, "lastTransitionTime": now}],
                "addresses": [{"type": "Hostname", "address": name}],
                "nodeInfo": {"machineID": name, "systemUUID": name, "bootID": name, "kernelVersion": "6.8.0",
                    "osImage": "sandbox", "containerRuntimeVersion": "none://0", "kubeletVersion": "v1.33.0",
                    "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"},
            }});
            nodes.patch_status(name, &PatchParams::default(), &Patch::Merge(&status)).await?;
        }
        Ok(())
    }

    async fn apply_world(&self) -> Result<(), Error> {
        let params = PatchParams::apply(USER).force();
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), NAMESPACE);
        let secret = json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": SECRET_NAME, "namespace": NAMESPACE, "labels": {(crds::CLOUD_CONFIG_LABEL): crds::CLOUD_CONFIG_LABEL_VALUE}},
            "stringData": {SECRET_KEY: cloud_config(self.options.loopback_net, &self.pool())},
        });
        secrets.patch(SECRET_NAME, &params, &Patch::Apply(&secret)).await?;
        let crs: Api<CloudControllerManager> = Api::namespaced(self.client.clone(), NAMESPACE);
        let cr = json!({
            "apiVersion": "ccm.rs/v1alpha1", "kind": "CloudControllerManager",
            "metadata": {"name": CR_NAME, "namespace": NAMESPACE},
            "spec": cr_spec(self.options.mode, self.options.replicas),
        });
        crs.patch(CR_NAME, &params, &Patch::Apply(&cr)).await?;
        let services: Api<Service> = Api::namespaced(self.client.clone(), "default");
        let svc = json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": SERVICE_NAME, "namespace": "default"},
            "spec": {"type": "LoadBalancer", "selector": {"app": SERVICE_NAME},
                "ports": [{"name": "http", "port": SERVICE_PORT, "targetPort": 8080, "protocol": "TCP"}]},
        });
        services.patch(SERVICE_NAME, &params, &Patch::Apply(&svc)).await?;
        Ok(())
    }

    /// Read what the demo shows.
    pub async fn snapshot(&self) -> Result<Snapshot, Error> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let mut nodes: Vec<Node> = nodes.list(&Default::default()).await?.items;
        nodes.sort_by_key(|n| n.name_any());
        let services: Api<Service> = Api::namespaced(self.client.clone(), "default");
        let crs: Api<CloudControllerManager> = Api::namespaced(self.client.clone(), NAMESPACE);
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), NAMESPACE);
        let deployment = match self.options.mode {
            DemoMode::Embedded => None,
            DemoMode::Deployment => {
                let deployments: Api<Deployment> = Api::namespaced(self.client.clone(), NAMESPACE);
                deployments.get_opt(&operator::names::workload_name(CR_NAME)).await?
            }
        };
        Ok(Snapshot {
            nodes,
            service: services.get_opt(SERVICE_NAME).await?,
            cr: crs.get_opt(CR_NAME).await?,
            deployment,
            lease: leases.get_opt(CR_NAME).await?,
        })
    }

    /// The current picture.
    pub async fn picture(&self) -> Result<String, Error> {
        let pods = self.kubelet.as_ref().map(Kubelet::pods).unwrap_or_default();
        Ok(self.snapshot().await?.picture(&pods))
    }

    /// Wait for the final picture, reporting each step through `progress`.
    pub async fn wait_until_complete(
        &self,
        timeout: Duration,
        progress: &(dyn Fn(&str) + Sync),
    ) -> Result<Snapshot, Error> {
        let deadline = Instant::now() + timeout;
        // Mutexes, not cells, so the future stays Send.
        let told = std::sync::Mutex::new(BTreeSet::<String>::new());
        let last_said = std::sync::Mutex::new(Instant::now());
        let said = || *last_said.lock().unwrap_or_else(|e| e.into_inner());
        let set_said = || *last_said.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
        let tell = |key: String, line: String| {
            if told.lock().unwrap_or_else(|e| e.into_inner()).insert(key) {
                progress(&line);
                set_said();
            }
        };
        loop {
            let snap = self.snapshot().await?;
            for p in self.kubelet.as_ref().map(Kubelet::pods).unwrap_or_default() {
                if let Some(pid) = p.pid {
                    tell(
                        format!("pod {} {pid}", p.name),
                        format!("manager process {} started (pid {pid}, http://{})", p.name, p.address()),
                    );
                }
                if p.ready {
                    tell(format!("ready {} {:?}", p.name, p.pid), format!("manager process {} is ready", p.name));
                }
            }
            if let Some(leader) = snap.leader() {
                tell(format!("leader {leader}"), format!("Lease {NAMESPACE}/{CR_NAME} is held by {leader}"));
            }
            for n in &snap.nodes {
                let spec = n.spec.clone().unwrap_or_default();
                if let Some(id) = &spec.provider_id
                    && !spec.taints.iter().flatten().any(|t| t.key == UNINITIALIZED)
                {
                    tell(
                        format!("node {}", n.name_any()),
                        format!("Node {} initialized: providerID {id}, taint removed", n.name_any()),
                    );
                }
            }
            if let Some(ip) = snap.external_ip() {
                tell(format!("ip {ip}"), format!("Service default/{SERVICE_NAME} got load-balancer IP {ip}"));
            }
            for t in [types::CONFIG_VALID, types::PROVIDER_HEALTHY, types::AVAILABLE, types::READY] {
                if let Some(c) = snap.condition(t).filter(|c| c.status == "True") {
                    tell(
                        format!("cond {t}"),
                        format!("CloudControllerManager {NAMESPACE}/{CR_NAME}: {t}=True ({})", c.reason),
                    );
                }
            }
            if snap.is_complete() {
                return Ok(snap);
            }
            // Silence longer than a few seconds says what is still missing.
            if said().elapsed() >= WAITING_NOTICE {
                progress(&format!(
                    "still waiting ({:.0}s so far): {}",
                    self.started.elapsed().as_secs_f64(),
                    snap.missing()
                ));
                set_said();
            }
            if Instant::now() >= deadline {
                let missing = format!(
                    "the final picture ({} of {} Nodes initialized, IP {:?}, Ready {:?})",
                    snap.initialized_nodes().len(),
                    snap.nodes.len(),
                    snap.external_ip(),
                    snap.condition(types::READY).map(|c| (c.status, c.reason, c.message)),
                );
                return Err(Error::Timeout(missing));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Look at the cluster for the live log.
    pub async fn world(&self) -> Result<World, Error> {
        let snap = self.snapshot().await?;
        let mut world = World { leader: snap.leader(), ..World::default() };
        for n in &snap.nodes {
            let spec = n.spec.clone().unwrap_or_default();
            let initialized =
                spec.provider_id.clone().filter(|_| !spec.taints.iter().flatten().any(|t| t.key == UNINITIALIZED));
            world.nodes.insert(n.name_any(), initialized);
        }
        let services: Api<Service> = Api::all(self.client.clone());
        for s in services.list(&Default::default()).await?.items {
            if s.spec.as_ref().and_then(|x| x.type_.as_deref()) != Some("LoadBalancer") {
                continue;
            }
            let ips: Vec<String> = s
                .status
                .as_ref()
                .and_then(|st| st.load_balancer.as_ref())
                .and_then(|lb| lb.ingress.as_ref())
                .into_iter()
                .flatten()
                .filter_map(|i| i.ip.clone().or_else(|| i.hostname.clone()))
                .collect();
            let ports = s
                .spec
                .iter()
                .flat_map(|spec| spec.ports.iter().flatten())
                .map(|p| format!("{}/{}", p.port, p.protocol.as_deref().unwrap_or("TCP")))
                .collect();
            let key = format!("{}/{}", s.namespace().unwrap_or_default(), s.name_any());
            world.service_ports.insert(key.clone(), ports);
            world.services.insert(key, ips);
        }
        if let Some(cr) = &snap.cr {
            for c in cr.status.iter().flat_map(|s| s.conditions.iter()) {
                world.conditions.insert(c.type_.clone(), (c.status.clone(), c.reason.clone()));
            }
        }
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), NAMESPACE);
        world.secret_version = secrets.get_opt(SECRET_NAME).await?.and_then(|m| m.metadata.resource_version);
        world.deployment_generation = snap.deployment.as_ref().and_then(|d| d.metadata.generation);
        for p in self.kubelet.as_ref().map(Kubelet::pods).unwrap_or_default() {
            let state = ProcessState {
                pid: p.pid,
                ready: p.ready,
                restarts: p.restarts,
                terminating: p.terminating,
                last_exit: p.last_exit.clone(),
                template: p.template_hash.chars().take(8).collect(),
                endpoint: p.address().to_string(),
            };
            world.processes.insert(p.name, state);
        }
        Ok(world)
    }

    /// The live log: from `since` on, every quarter second, one line through `log` per change in
    /// the cluster (leader changes, process exits and restarts, rollouts, conditions, Nodes,
    /// Services' addresses). Runs until dropped; a failed look is retried quietly.
    pub async fn follow(&self, mut since: World, log: &(dyn Fn(&str) + Sync)) {
        loop {
            tokio::time::sleep(Duration::from_millis(250)).await;
            let Ok(now) = self.world().await else { continue };
            for line in changes(&since, &now) {
                log(&line);
            }
            since = now;
        }
    }

    /// Stop the emulated kubelet's processes (gracefully) and the operator.
    pub async fn shutdown(mut self) {
        self.node_ports.take();
        if let Some(kubelet) = self.kubelet.take() {
            kubelet.shutdown().await;
        }
        if let Some(op) = self.operator.take() {
            // Engines release their Leases on the way out; a stuck one must not hold the exit.
            let _ = tokio::time::timeout(Duration::from_secs(15), op.stop()).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn process(pid: u32, template: &str) -> ProcessState {
        ProcessState {
            pid: Some(pid),
            ready: true,
            restarts: 0,
            terminating: false,
            last_exit: None,
            template: template.into(),
            endpoint: "127.0.0.1:1".into(),
        }
    }

    fn world(processes: &[(&str, ProcessState)], leader: Option<&str>) -> World {
        World {
            leader: leader.map(Into::into),
            processes: processes.iter().map(|(n, p)| (n.to_string(), p.clone())).collect(),
            secret_version: Some("1".into()),
            ..World::default()
        }
    }

    #[test]
    fn nothing_changed_says_nothing() {
        let w = world(&[("a", process(1, "t1"))], Some("a_x"));
        assert!(changes(&w, &w).is_empty());
    }

    #[test]
    fn a_killed_leader_is_named_then_its_restart_and_the_hand_over() {
        let before = world(&[("a", process(1, "t1")), ("b", process(2, "t1"))], Some("a_x"));
        let mut crashed = before.clone();
        let a = crashed.processes.get_mut("a").unwrap();
        (a.pid, a.ready, a.last_exit) = (None, false, Some("signal: 9 (SIGKILL)".into()));
        assert_eq!(changes(&before, &crashed), ["process a (the leader) exited: signal: 9 (SIGKILL)"]);
        let mut back = crashed.clone();
        let a = back.processes.get_mut("a").unwrap();
        (a.pid, a.ready, a.restarts) = (Some(3), true, 1);
        back.leader = Some("b_y".into());
        assert_eq!(
            changes(&crashed, &back),
            [
                "process a restarted (pid 3, restart #1)",
                "process a ready",
                "leader: b_y holds Lease kube-system/baremetal (was a_x)",
            ]
        );
    }

    #[test]
    fn a_secret_rotation_and_the_rollout_it_causes_are_logged() {
        let before = world(&[("a", process(1, "t1")), ("b", process(2, "t1"))], Some("a_x"));
        let mut rotated = before.clone();
        rotated.secret_version = Some("2".into());
        assert_eq!(changes(&before, &rotated).len(), 1);
        assert!(changes(&before, &rotated)[0].starts_with("Secret kube-system/baremetal-cloud-config changed"));
        let rolled = world(&[("b", process(2, "t1")), ("c", process(4, "t2"))], Some("a_x"));
        let lines = changes(&before, &rolled);
        assert!(
            lines.contains(&"process a stopped (SIGTERM) and removed: replaced by the rollout".to_string()),
            "{lines:?}"
        );
        assert!(lines.iter().any(|l| l.starts_with("process c started (pid 4, template t2")), "{lines:?}");
    }

    #[test]
    fn nodes_and_service_addresses_are_logged_when_they_change() {
        let mut before = World::default();
        before.nodes.insert("n1".into(), None);
        let mut after = before.clone();
        after.nodes.insert("n1".into(), Some("baremetal://n1".into()));
        after.services.insert("default/web".into(), vec!["203.0.113.10".into()]);
        assert_eq!(
            changes(&before, &after),
            [
                "Node n1 initialized: providerID baremetal://n1, taint removed",
                "Service default/web: load-balancer address 203.0.113.10",
            ]
        );
    }

    #[test]
    fn a_port_added_to_a_reachable_service_is_logged_once() {
        let mut before = World::default();
        before.services.insert("default/web".into(), vec!["127.0.0.240".into()]);
        before.service_ports.insert("default/web".into(), vec!["8000/TCP".into()]);
        let mut after = before.clone();
        after.service_ports.insert("default/web".into(), vec!["8000/TCP".into(), "8001/TCP".into()]);
        assert_eq!(
            changes(&before, &after),
            ["Service default/web: ports now 8000/TCP, 8001/TCP (the load balancer follows)"]
        );
        assert!(changes(&after, &after).is_empty());
        // A Service still waiting for its address: its ports are not news yet.
        let mut pending = World::default();
        pending.services.insert("default/new".into(), vec![]);
        pending.service_ports.insert("default/new".into(), vec!["80/TCP".into()]);
        let mut more = pending.clone();
        more.service_ports.insert("default/new".into(), vec!["80/TCP".into(), "81/TCP".into()]);
        assert!(changes(&pending, &more).is_empty());
    }
}
