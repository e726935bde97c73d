//! The sandbox demo: the operator in-process against the local API server, a baremetal
//! `CloudControllerManager` (Embedded or Deployment mode) with an inventory of simulated machines,
//! Nodes registered the way kubelets with `--cloud-provider=external` register, and one
//! `type: LoadBalancer` Service. In Deployment mode the [`Kubelet`] runs the manager replicas as
//! local processes.
//!
//! Every address is from the documentation ranges (RFC 5737) and the inventory configures no
//! probes, so nothing outside the machine is ever contacted.

use std::collections::BTreeSet;
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
use crate::kubelet::{Kubelet, KubeletConfig, PodInfo};

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
/// The load-balancer pool (in TEST-NET-3).
pub const LB_POOL: &str = "203.0.113.10-203.0.113.29";
/// The simulated machines: name, InternalIP (TEST-NET-1), zone.
pub const MACHINES: [(&str, &str, &str); 3] = [
    ("bm-node-1", "192.0.2.11", "rack-a"),
    ("bm-node-2", "192.0.2.12", "rack-a"),
    ("bm-node-3", "192.0.2.13", "rack-b"),
];
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
}

impl Default for DemoOptions {
    fn default() -> Self {
        Self { mode: DemoMode::Embedded, replicas: 2, manager_binary: None, work_root: None }
    }
}

/// The baremetal inventory of the simulated machines, with `pool` for load balancers.
pub fn cloud_config(pool: &str) -> String {
    let mut yaml = String::from(
        "# Simulated machines: documentation addresses (RFC 5737), never contacted (no probes).\ninstances:\n",
    );
    for (name, ip, zone) in MACHINES {
        yaml.push_str(&format!(
            "  - name: {name}\n    addresses:\n      - {{type: InternalIP, address: {ip}}}\n      - {{type: Hostname, address: {name}}}\n    instanceType: sandbox-small\n    zone: {zone}\n    region: sandbox\n"
        ));
    }
    yaml.push_str(&format!("loadBalancer:\n  pools:\n    - name: sandbox\n      ranges: [\"{pool}\"]\n"));
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

/// The running demo.
pub struct Demo {
    client: Client,
    options: DemoOptions,
    operator: Option<OperatorHandle>,
    kubelet: Option<Kubelet>,
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
        let demo = Demo { client, options, operator: Some(operator), kubelet, started };
        demo.register_nodes().await?;
        progress(&format!(
            "{} Nodes registered as kubelets with --cloud-provider=external do: Ready, tainted {UNINITIALIZED}",
            MACHINES.len()
        ));
        demo.apply_world().await?;
        progress(&format!(
            "applied Secret {NAMESPACE}/{SECRET_NAME} (inventory, pool {LB_POOL}), CloudControllerManager {NAMESPACE}/{CR_NAME} (mode {}), Service default/{SERVICE_NAME} (type LoadBalancer)",
            demo.options.mode
        ));
        Ok(demo)
    }

    /// Time since the demo started.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
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
            "metadata": {"name": SECRET_NAME, "namespace": NAMESPACE},
            "stringData": {SECRET_KEY: cloud_config(LB_POOL)},
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
                "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]},
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
        let mut told: BTreeSet<String> = BTreeSet::new();
        let mut tell = |key: String, line: String| {
            if told.insert(key) {
                progress(&line);
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

    /// Stop the emulated kubelet's processes (gracefully) and the operator.
    pub async fn shutdown(mut self) {
        if let Some(kubelet) = self.kubelet.take() {
            kubelet.shutdown().await;
        }
        if let Some(op) = self.operator.take() {
            // Engines release their Leases on the way out; a stuck one must not hold the exit.
            let _ = tokio::time::timeout(Duration::from_secs(15), op.stop()).await;
        }
    }
}
