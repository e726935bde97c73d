//! An emulated kubelet (and Deployment controller) for the manager's own workload, so that
//! Deployment mode runs end to end against the local API server with real processes.
//!
//! It watches the Deployments the operator creates (label `app.kubernetes.io/managed-by:
//! ccm-operator`, a container named `cloud-controller-manager`) and runs one local
//! `cloud-controller-manager` process per replica, with the Deployment's arguments except:
//! `--cloud-config` points at a private copy of the mounted Secret key, `--kubeconfig` at the
//! local server, and each process gets its own free `--secure-port` on `--bind-address=127.0.0.1`.
//! Processes are "pods": a crashed one is restarted (a container restart); a changed pod template
//! (the operator's `ccm.rs/template-hash` annotation) is rolled out as the Deployment's strategy
//! says (no surge; its `maxUnavailable`, `100%` for host-network managers); scaling starts or stops
//! processes. Readiness is each process's `/readyz`; from it the Deployment's status is written
//! (replicas, updated, ready, available, observedGeneration, `Available` and `Progressing`) only
//! when it changed.
//!
//! Limits: Deployments only (no DaemonSets), `--flag=value` arguments only, Secret volumes only,
//! and no pod objects are created. Processes are stopped with SIGTERM (then SIGKILL after the
//! grace period) and killed when the [`Kubelet`] is dropped, so a failing test leaves none behind.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::{Deployment, DeploymentCondition, DeploymentStatus, DeploymentStrategy};
use k8s_openapi::api::core::v1::{Node, PodTemplateSpec, Secret, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use operator::names;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::Error;

/// The field manager of the Deployment status writes.
pub const FIELD_MANAGER: &str = "sandbox-kubelet";
/// How long one `/readyz` probe may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// How the emulated kubelet runs.
#[derive(Clone)]
pub struct KubeletConfig {
    /// A client for the API server.
    pub client: Client,
    /// The kubeconfig the processes get (`--kubeconfig`).
    pub kubeconfig: PathBuf,
    /// The `cloud-controller-manager` binary.
    pub manager_binary: PathBuf,
    /// Where to create the kubelet's directory (cloud-config copies, logs); default: the system
    /// temporary directory. The kubelet's own directory is removed when it stops.
    pub work_root: Option<PathBuf>,
    /// How often pods are checked (events also wake it).
    pub sync_period: Duration,
    /// How long a stopping process gets between SIGTERM and SIGKILL.
    pub termination_grace: Duration,
    /// How long a crashed process waits before it is started again.
    pub restart_delay: Duration,
}

impl std::fmt::Debug for KubeletConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeletConfig")
            .field("kubeconfig", &self.kubeconfig)
            .field("manager_binary", &self.manager_binary)
            .field("work_root", &self.work_root)
            .finish_non_exhaustive()
    }
}

impl KubeletConfig {
    /// Defaults: half-second sync, 10 s grace, 1 s restart delay, the system temp directory.
    pub fn new(client: Client, kubeconfig: impl Into<PathBuf>, manager_binary: impl Into<PathBuf>) -> Self {
        Self {
            client,
            kubeconfig: kubeconfig.into(),
            manager_binary: manager_binary.into(),
            work_root: None,
            sync_period: Duration::from_millis(500),
            termination_grace: Duration::from_secs(10),
            restart_delay: Duration::from_secs(1),
        }
    }
}

/// One emulated pod (a manager process), as seen from outside.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodInfo {
    /// Pod name (`<deployment>-<template hash>-<n>`); also the process's `HOSTNAME`, so it starts
    /// the manager's leader-election identity.
    pub name: String,
    /// The Deployment's namespace.
    pub namespace: String,
    /// The Deployment's name.
    pub deployment: String,
    /// The pod template hash it runs.
    pub template_hash: String,
    /// The process id, while a process runs.
    pub pid: Option<u32>,
    /// Its `--secure-port` on 127.0.0.1.
    pub port: u16,
    /// Whether its `/readyz` answered 200 at the last probe.
    pub ready: bool,
    /// How often its process was restarted after exiting.
    pub restarts: u32,
    /// Being stopped (SIGTERM sent).
    pub terminating: bool,
    /// The command-line arguments it runs with.
    pub args: Vec<String>,
    /// Its private copy of the cloud-config, if it has one.
    pub cloud_config: Option<PathBuf>,
    /// Where its stdout and stderr go.
    pub log: PathBuf,
    /// When the current process started.
    pub started_at: Option<Instant>,
    /// How the last process exited (`exit status: 1`, `signal: 9 (SIGKILL)`), once one did.
    pub last_exit: Option<String>,
}

impl PodInfo {
    /// The address of its `/healthz`, `/readyz` and `/metrics`.
    pub fn address(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }
}

struct Pod {
    info: PodInfo,
    child: Option<Child>,
    exited_at: Option<Instant>,
    term_sent: Option<Instant>,
    dir: PathBuf,
}

#[derive(Default)]
struct State {
    pods: Vec<Pod>,
    counter: u64,
    /// The last status written per Deployment, so a write is not repeated before the watch
    /// shows it.
    written: BTreeMap<(String, String), DeploymentStatus>,
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|e| e.into_inner())
}

/// A running emulated kubelet; dropping it kills every process it started.
pub struct Kubelet {
    state: Arc<Mutex<State>>,
    stop: CancellationToken,
    task: Option<JoinHandle<()>>,
    work_dir: PathBuf,
    grace: Duration,
}

impl std::fmt::Debug for Kubelet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kubelet").field("work_dir", &self.work_dir).finish_non_exhaustive()
    }
}

static NEXT_DIR: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl Kubelet {
    /// Start watching Deployments and running their replicas.
    pub fn start(config: KubeletConfig) -> Result<Kubelet, Error> {
        if !config.manager_binary.is_file() {
            return Err(Error::ManagerBinary(format!(
                "{} does not exist; build it with `{BUILD_MANAGER}`",
                config.manager_binary.display()
            )));
        }
        let root = config.work_root.clone().unwrap_or_else(std::env::temp_dir);
        let n = NEXT_DIR.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let work_dir = root.join(format!("ccm-sandbox-kubelet-{}-{n}", std::process::id()));
        fs::create_dir_all(work_dir.join("logs"))
            .map_err(|e| Error::io(format!("creating {}", work_dir.display()), e))?;
        let state = Arc::new(Mutex::new(State::default()));
        let stop = CancellationToken::new();
        let grace = config.termination_grace;
        let ctx = Ctx { config, state: state.clone(), work_dir: work_dir.clone() };
        let task = tokio::spawn(run(ctx, stop.clone()));
        Ok(Kubelet { state, stop, task: Some(task), work_dir, grace })
    }

    /// Every pod, terminating ones included, sorted by name.
    pub fn pods(&self) -> Vec<PodInfo> {
        let mut pods: Vec<PodInfo> = lock(&self.state).pods.iter().map(|p| p.info.clone()).collect();
        pods.sort_by(|a, b| a.name.cmp(&b.name));
        pods
    }

    /// The running pods of Deployment `namespace/name` (not terminating).
    pub fn pods_of(&self, namespace: &str, name: &str) -> Vec<PodInfo> {
        self.pods().into_iter().filter(|p| p.namespace == namespace && p.deployment == name && !p.terminating).collect()
    }

    /// Kill a pod's process with SIGKILL, as a crash would (no Lease release); the kubelet
    /// restarts it. Returns whether a process ran.
    pub fn kill(&self, pod: &str) -> bool {
        let mut st = lock(&self.state);
        match st.pods.iter_mut().find(|p| p.info.name == pod).and_then(|p| p.child.as_mut()) {
            Some(child) => child.kill().is_ok(),
            None => false,
        }
    }

    /// This kubelet's directory (logs under `logs/`).
    pub fn work_dir(&self) -> &Path {
        &self.work_dir
    }

    /// Stop: no more starts, every process gets SIGTERM and the grace period, then SIGKILL; the
    /// directory is removed.
    pub async fn shutdown(mut self) {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            let abort = task.abort_handle();
            if tokio::time::timeout(Duration::from_secs(5), task).await.is_err() {
                abort.abort();
            }
        }
        {
            let mut st = lock(&self.state);
            for pod in &mut st.pods {
                if let Some(child) = &pod.child {
                    terminate(child);
                }
            }
        }
        let deadline = Instant::now() + self.grace;
        loop {
            let running = {
                let mut st = lock(&self.state);
                let mut running = 0;
                for pod in &mut st.pods {
                    if let Some(child) = pod.child.as_mut() {
                        match child.try_wait() {
                            Ok(None) if Instant::now() < deadline => running += 1,
                            Ok(None) => {
                                let _ = child.kill();
                                let _ = child.wait();
                                pod.child = None;
                            }
                            _ => pod.child = None,
                        }
                    }
                }
                running
            };
            if running == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // Drop removes the directory.
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            task.abort();
        }
        let mut st = lock(&self.state);
        for pod in &mut st.pods {
            if let Some(mut child) = pod.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        st.pods.clear();
        drop(st);
        let _ = fs::remove_dir_all(&self.work_dir);
    }
}

/// Ask a process to stop (SIGTERM) through `kill(1)`; without it, kill it at once.
fn terminate(child: &Child) {
    let sent = Command::new("kill")
        .args(["-s", "TERM", &child.id().to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !sent {
        // Only reachable when kill(1) is missing; the caller's grace loop then sees the exit.
        let _ = Command::new("kill").args(["-9", &child.id().to_string()]).status();
    }
}

struct Ctx {
    config: KubeletConfig,
    state: Arc<Mutex<State>>,
    work_dir: PathBuf,
}

async fn run(ctx: Ctx, stop: CancellationToken) {
    let api: Api<Deployment> = Api::all(ctx.config.client.clone());
    let selector = format!("{}={}", names::LABEL_MANAGED_BY, names::MANAGED_BY);
    let (reader, writer) = reflector::store();
    let mut events =
        watcher(api, watcher::Config::default().labels(&selector)).default_backoff().reflect(writer).boxed();
    // The store is only fed while this loop polls the stream: never wait on it elsewhere.
    let mut listed = false;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            e = events.next() => match e {
                None => return,
                Some(Err(error)) => tracing::debug!(%error, "sandbox kubelet: Deployment watch failed; retrying"),
                Some(Ok(watcher::Event::InitDone)) => listed = true,
                Some(Ok(_)) => {}
            },
            _ = tokio::time::sleep(ctx.config.sync_period) => {}
        }
        if listed {
            sync(&ctx, &reader).await;
        }
    }
}

/// A Deployment that runs the manager, with what the kubelet needs of it.
struct Workload {
    namespace: String,
    name: String,
    desired: i32,
    /// Pods the rollout may take down at once (the strategy's `maxUnavailable`, resolved).
    max_unavailable: i32,
    hash: String,
    template: PodTemplateSpec,
    deployment: Arc<Deployment>,
}

fn workload(d: &Arc<Deployment>) -> Option<Workload> {
    let spec = d.spec.as_ref()?;
    let pod_spec = spec.template.spec.as_ref()?;
    if !pod_spec.containers.iter().any(|c| c.name == names::CONTAINER_NAME) || d.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let hash = d
        .annotations()
        .get(names::ANNOTATION_TEMPLATE_HASH)
        .cloned()
        .unwrap_or_else(|| operator::hash::of_json(&spec.template));
    Some(Workload {
        namespace: d.namespace().unwrap_or_default(),
        name: d.name_any(),
        desired: spec.replicas.unwrap_or(1).max(0),
        max_unavailable: max_unavailable(spec.strategy.as_ref(), spec.replicas.unwrap_or(1).max(0)),
        hash,
        template: spec.template.clone(),
        deployment: d.clone(),
    })
}

/// What to do for one Deployment (pure): pods to stop and how many to start.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Pods to stop.
    pub terminate: Vec<String>,
    /// New pods of the current template to start.
    pub start: usize,
}

/// A live pod as the planner sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanPod {
    /// Its name.
    pub name: String,
    /// Whether it runs the current template.
    pub current: bool,
    /// Whether it is ready.
    pub ready: bool,
}

/// A Deployment strategy's `maxUnavailable` for `desired` replicas, as the Deployment
/// controller resolves it (pure): `Recreate` takes every pod down; a percentage rounds down;
/// unset is `25%`; and since this kubelet never surges, at least one.
pub fn max_unavailable(strategy: Option<&DeploymentStrategy>, desired: i32) -> i32 {
    if strategy.and_then(|s| s.type_.as_deref()) == Some("Recreate") {
        return desired.max(1);
    }
    let value = strategy.and_then(|s| s.rolling_update.as_ref()).and_then(|r| r.max_unavailable.as_ref());
    let n = match value {
        Some(IntOrString::Int(n)) => *n,
        Some(IntOrString::String(p)) => match p.strip_suffix('%').and_then(|p| p.parse::<i64>().ok()) {
            Some(pct) => i32::try_from(i64::from(desired) * pct / 100).unwrap_or(desired),
            None => 1,
        },
        None => desired / 4,
    };
    n.clamp(1, desired.max(1))
}

/// The rollout and scaling decision for one Deployment (pure): no surge, at most
/// `max_unavailable` pods down; surplus pods go old first, then unready first; old pods are
/// replaced only while the others keep `desired - max_unavailable` ready.
pub fn plan(desired: i32, max_unavailable: i32, pods: &[PlanPod]) -> Plan {
    let desired = usize::try_from(desired.max(0)).unwrap_or(0);
    let mut plan = Plan::default();
    let current: Vec<&PlanPod> = pods.iter().filter(|p| p.current).collect();
    let mut old: Vec<&PlanPod> = pods.iter().filter(|p| !p.current).collect();
    // Unready first, then by name, so the choice is stable.
    old.sort_by_key(|p| (p.ready, p.name.clone()));
    if current.len() > desired {
        let mut surplus: Vec<&PlanPod> = current.clone();
        surplus.sort_by_key(|p| (p.ready, std::cmp::Reverse(p.name.clone())));
        plan.terminate = surplus.iter().take(current.len() - desired).map(|p| p.name.clone()).collect();
        plan.terminate.extend(old.iter().map(|p| p.name.clone()));
        return plan;
    }
    let total = current.len() + old.len();
    if total > desired {
        plan.terminate = old.iter().take(total - desired).map(|p| p.name.clone()).collect();
        return plan;
    }
    if total < desired {
        plan.start = desired - total;
        return plan;
    }
    let mut ready = pods.iter().filter(|p| p.ready).count() as i64;
    let floor = desired as i64 - i64::from(max_unavailable.max(1));
    for victim in old {
        if ready - i64::from(victim.ready) < floor {
            break;
        }
        ready -= i64::from(victim.ready);
        plan.terminate.push(victim.name.clone());
    }
    plan
}

async fn sync(ctx: &Ctx, reader: &Store<Deployment>) {
    let workloads: Vec<Workload> = reader.state().iter().filter_map(workload).collect();
    let wanted: BTreeSet<(String, String)> = workloads.iter().map(|w| (w.namespace.clone(), w.name.clone())).collect();
    let now = Instant::now();

    // Reap exited processes, finish terminations, restart crashed pods, stop orphans.
    let mut restart: Vec<String> = Vec::new();
    {
        let mut st = lock(&ctx.state);
        for pod in &mut st.pods {
            let orphan = !wanted.contains(&(pod.info.namespace.clone(), pod.info.deployment.clone()));
            if orphan && !pod.info.terminating {
                pod.info.terminating = true;
            }
            if pod.info.terminating && pod.term_sent.is_none() {
                if let Some(child) = &pod.child {
                    terminate(child);
                }
                pod.term_sent = Some(now);
            }
            if let Some(child) = pod.child.as_mut() {
                match child.try_wait() {
                    Ok(Some(status)) => {
                        if !pod.info.terminating {
                            tracing::info!(pod = %pod.info.name, %status, "sandbox kubelet: manager process exited");
                        }
                        pod.child = None;
                        pod.info.pid = None;
                        pod.info.ready = false;
                        pod.info.last_exit = Some(status.to_string());
                        pod.exited_at = Some(now);
                    }
                    Ok(None) => {
                        if pod.term_sent.is_some_and(|t| now.duration_since(t) > ctx.config.termination_grace) {
                            let _ = child.kill();
                        }
                    }
                    Err(_) => {}
                }
            }
            if pod.child.is_none()
                && !pod.info.terminating
                && pod.exited_at.is_some_and(|t| now.duration_since(t) >= ctx.config.restart_delay)
            {
                restart.push(pod.info.name.clone());
            }
        }
        // Terminated pods are gone, with their cloud-config copies.
        st.pods.retain(|p| {
            let gone = p.info.terminating && p.child.is_none();
            if gone {
                let _ = fs::remove_dir_all(&p.dir);
            }
            !gone
        });
        for name in &restart {
            if let Some(pod) = st.pods.iter_mut().find(|p| &p.info.name == name) {
                match spawn(&ctx.config, &pod.info) {
                    Ok(child) => {
                        pod.info.pid = Some(child.id());
                        pod.info.restarts += 1;
                        pod.info.started_at = Some(Instant::now());
                        pod.child = Some(child);
                        pod.exited_at = None;
                    }
                    Err(error) => tracing::warn!(pod = %name, %error, "sandbox kubelet: restart failed"),
                }
            }
        }
    }

    // Readiness.
    let probes: Vec<(String, SocketAddr)> = lock(&ctx.state)
        .pods
        .iter()
        .filter(|p| p.child.is_some() && !p.info.terminating)
        .map(|p| (p.info.name.clone(), p.info.address()))
        .collect();
    let results = futures::future::join_all(probes.into_iter().map(|(name, addr)| async move {
        let ok = crate::probe::get(addr, "/readyz", PROBE_TIMEOUT).await.is_some_and(|r| r.status == 200);
        (name, ok)
    }))
    .await;
    {
        let mut st = lock(&ctx.state);
        for (name, ok) in results {
            if let Some(pod) = st.pods.iter_mut().find(|p| p.info.name == name) {
                pod.info.ready = ok && pod.child.is_some();
            }
        }
    }

    for w in &workloads {
        let planned = {
            let st = lock(&ctx.state);
            let live: Vec<PlanPod> = st
                .pods
                .iter()
                .filter(|p| p.info.namespace == w.namespace && p.info.deployment == w.name && !p.info.terminating)
                .map(|p| PlanPod {
                    name: p.info.name.clone(),
                    current: p.info.template_hash == w.hash,
                    ready: p.info.ready,
                })
                .collect();
            plan(w.desired, w.max_unavailable, &live)
        };
        if !planned.terminate.is_empty() {
            let mut st = lock(&ctx.state);
            for pod in st.pods.iter_mut().filter(|p| planned.terminate.contains(&p.info.name)) {
                tracing::info!(pod = %pod.info.name, "sandbox kubelet: stopping manager process");
                pod.info.terminating = true;
                pod.info.ready = false;
                if let Some(child) = &pod.child {
                    terminate(child);
                }
                pod.term_sent = Some(Instant::now());
            }
        }
        for _ in 0..planned.start {
            if let Err(error) = start_pod(ctx, w).await {
                tracing::warn!(deployment = %format!("{}/{}", w.namespace, w.name), %error, "sandbox kubelet: cannot start a manager process yet");
                break;
            }
        }
        if let Err(error) = write_status(ctx, w).await {
            tracing::debug!(deployment = %w.name, %error, "sandbox kubelet: status write failed");
        }
    }
}

fn free_port() -> Result<u16, Error> {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| Error::io("finding a free port", e))
}

/// The Deployment's arguments for one pod: the cloud-config copied out of its Secret into
/// `pod_dir`, and the local kubeconfig, port and address.
async fn resolve_args(
    client: &Client,
    namespace: &str,
    template: &PodTemplateSpec,
    kubeconfig: &Path,
    port: u16,
    pod_dir: &Path,
) -> Result<(Vec<String>, Option<PathBuf>), Error> {
    let spec = template.spec.as_ref().ok_or_else(|| Error::Other("the pod template has no spec".into()))?;
    let container = spec
        .containers
        .iter()
        .find(|c| c.name == names::CONTAINER_NAME)
        .ok_or_else(|| Error::Other("no cloud-controller-manager container".into()))?;
    let mut args = Vec::new();
    let mut cloud_config = None;
    for arg in container.args.iter().flatten() {
        let flag = arg.split_once('=').map_or(arg.as_str(), |(f, _)| f);
        if matches!(flag, "--kubeconfig" | "--master" | "--secure-port" | "--bind-address") {
            continue;
        }
        if let Some(path) = arg.strip_prefix("--cloud-config=") {
            let file = copy_mounted_secret(client, namespace, template, path, pod_dir).await?;
            args.push(format!("--cloud-config={}", file.display()));
            cloud_config = Some(file);
            continue;
        }
        args.push(arg.clone());
    }
    args.push(format!("--kubeconfig={}", kubeconfig.display()));
    args.push("--bind-address=127.0.0.1".into());
    args.push(format!("--secure-port={port}"));
    // The sandbox's API server serves no TokenReview, so a token cannot be checked: open
    // /metrics to anyone on loopback, as the demo's instructions use it.
    args.push("--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics".into());
    Ok((args, cloud_config))
}

/// Write the Secret key mounted at `path` to a private file under `pod_dir` (mode 0600).
async fn copy_mounted_secret(
    client: &Client,
    namespace: &str,
    template: &PodTemplateSpec,
    path: &str,
    pod_dir: &Path,
) -> Result<PathBuf, Error> {
    let spec = template.spec.as_ref().ok_or_else(|| Error::Other("the pod template has no spec".into()))?;
    let container = spec.containers.iter().find(|c| c.name == names::CONTAINER_NAME);
    let mount = container
        .and_then(|c| c.volume_mounts.as_ref())
        .into_iter()
        .flatten()
        .filter(|m| path.starts_with(&m.mount_path))
        .max_by_key(|m| m.mount_path.len())
        .ok_or_else(|| Error::Other(format!("nothing is mounted at {path}")))?;
    let relative = path[mount.mount_path.len()..].trim_start_matches('/').to_string();
    let volume = spec
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == mount.name)
        .ok_or_else(|| Error::Other(format!("volume {} is not defined", mount.name)))?;
    let source = volume
        .secret
        .as_ref()
        .ok_or_else(|| Error::Other(format!("volume {} is not a Secret (only Secrets are supported)", mount.name)))?;
    let secret_name = source.secret_name.clone().unwrap_or_default();
    let key = source
        .items
        .iter()
        .flatten()
        .find(|i| i.path == relative)
        .map(|i| i.key.clone())
        .unwrap_or_else(|| relative.clone());
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let secret = secrets
        .get_opt(&secret_name)
        .await?
        .ok_or_else(|| Error::Other(format!("Secret {namespace}/{secret_name} does not exist")))?;
    let value = secret
        .data
        .as_ref()
        .and_then(|d| d.get(&key))
        .ok_or_else(|| Error::Other(format!("Secret {namespace}/{secret_name} has no key {key}")))?;
    let file = pod_dir.join("cloud-config").join(&relative);
    if let Some(parent) = file.parent() {
        fs::create_dir_all(parent).map_err(|e| Error::io(format!("creating {}", parent.display()), e))?;
    }
    write_private(&file, &value.0)?;
    Ok(file)
}

fn write_private(file: &Path, data: &[u8]) -> Result<(), Error> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(file)
        .map_err(|e| Error::io(format!("writing {}", file.display()), e))?;
    f.write_all(data).map_err(|e| Error::io(format!("writing {}", file.display()), e))
}

fn spawn(config: &KubeletConfig, info: &PodInfo) -> Result<Child, Error> {
    let log = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&info.log)
        .map_err(|e| Error::io(format!("opening {}", info.log.display()), e))?;
    let err = log.try_clone().map_err(|e| Error::io("duplicating the log file", e))?;
    Command::new(&config.manager_binary)
        .args(&info.args)
        .env("HOSTNAME", &info.name)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(err)
        .spawn()
        .map_err(|e| Error::io(format!("starting {}", config.manager_binary.display()), e))
}

async fn start_pod(ctx: &Ctx, w: &Workload) -> Result<(), Error> {
    let n = {
        let mut st = lock(&ctx.state);
        st.counter += 1;
        st.counter
    };
    let short = &w.hash[..w.hash.len().min(8)];
    let name = format!("{}-{short}-{n:05x}", w.name);
    let dir = ctx.work_dir.join("pods").join(&name);
    fs::create_dir_all(&dir).map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    let port = free_port()?;
    let resolved =
        resolve_args(&ctx.config.client, &w.namespace, &w.template, &ctx.config.kubeconfig, port, &dir).await;
    let (args, cloud_config) = match resolved {
        Ok(r) => r,
        Err(e) => {
            let _ = fs::remove_dir_all(&dir);
            return Err(e);
        }
    };
    let info = PodInfo {
        name: name.clone(),
        namespace: w.namespace.clone(),
        deployment: w.name.clone(),
        template_hash: w.hash.clone(),
        pid: None,
        port,
        ready: false,
        restarts: 0,
        terminating: false,
        args,
        cloud_config,
        log: ctx.work_dir.join("logs").join(format!("{name}.log")),
        started_at: None,
        last_exit: None,
    };
    let child = match spawn(&ctx.config, &info) {
        Ok(c) => c,
        Err(e) => {
            let _ = fs::remove_dir_all(&dir);
            return Err(e);
        }
    };
    tracing::info!(pod = %name, pid = child.id(), port, "sandbox kubelet: started a manager process");
    let mut info = info;
    info.pid = Some(child.id());
    info.started_at = Some(Instant::now());
    lock(&ctx.state).pods.push(Pod { info, child: Some(child), exited_at: None, term_sent: None, dir });
    Ok(())
}

/// The status counts of one Deployment (pure).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    /// `spec.replicas`.
    pub desired: i32,
    /// Live pods of any template.
    pub replicas: i32,
    /// Live pods of the current template.
    pub updated: i32,
    /// Ready pods.
    pub ready: i32,
    /// The strategy's `maxUnavailable`, resolved ([`max_unavailable`]).
    pub max_unavailable: i32,
}

/// The Deployment status the real controller would report for these counts (pure);
/// `previous` keeps condition timestamps when nothing changed.
pub fn deployment_status(
    generation: Option<i64>,
    replica_set: &str,
    c: Counts,
    previous: Option<&DeploymentStatus>,
    now: &Time,
) -> DeploymentStatus {
    let available = c.ready;
    let minimum = available >= c.desired - c.max_unavailable;
    let complete = c.updated == c.desired && c.replicas == c.desired && available == c.desired;
    let condition = |type_: &str, status: bool, reason: &str, message: String| {
        let status = if status { "True" } else { "False" }.to_string();
        let old = previous.and_then(|p| p.conditions.as_ref()).and_then(|cs| cs.iter().find(|x| x.type_ == type_));
        let same = old.is_some_and(|o| o.status == status);
        let unchanged =
            old.is_some_and(|o| same && o.reason.as_deref() == Some(reason) && o.message.as_deref() == Some(&message));
        DeploymentCondition {
            type_: type_.into(),
            status,
            reason: Some(reason.into()),
            message: Some(message),
            last_transition_time: if same {
                old.and_then(|o| o.last_transition_time.clone())
            } else {
                Some(now.clone())
            },
            last_update_time: if unchanged { old.and_then(|o| o.last_update_time.clone()) } else { Some(now.clone()) },
        }
    };
    let available_condition = if minimum {
        condition("Available", true, "MinimumReplicasAvailable", "Deployment has minimum availability.".into())
    } else {
        condition(
            "Available",
            false,
            "MinimumReplicasUnavailable",
            "Deployment does not have minimum availability.".into(),
        )
    };
    let progressing = if complete {
        condition(
            "Progressing",
            true,
            "NewReplicaSetAvailable",
            format!("ReplicaSet \"{replica_set}\" has successfully progressed."),
        )
    } else {
        condition("Progressing", true, "ReplicaSetUpdated", format!("ReplicaSet \"{replica_set}\" is progressing."))
    };
    DeploymentStatus {
        observed_generation: generation,
        replicas: Some(c.replicas),
        updated_replicas: Some(c.updated),
        ready_replicas: Some(c.ready),
        available_replicas: Some(available),
        unavailable_replicas: Some((c.desired - available).max(0)),
        conditions: Some(vec![available_condition, progressing]),
        ..Default::default()
    }
}

/// Whether two statuses differ in anything but condition timestamps (pure).
fn status_differs(a: &DeploymentStatus, b: &DeploymentStatus) -> bool {
    let key = |s: &DeploymentStatus| {
        let conditions: BTreeMap<String, (String, Option<String>, Option<String>)> = s
            .conditions
            .iter()
            .flatten()
            .map(|c| (c.type_.clone(), (c.status.clone(), c.reason.clone(), c.message.clone())))
            .collect();
        (
            s.observed_generation,
            s.replicas,
            s.updated_replicas,
            s.ready_replicas,
            s.available_replicas,
            s.unavailable_replicas,
            conditions,
        )
    };
    key(a) != key(b)
}

async fn write_status(ctx: &Ctx, w: &Workload) -> Result<(), Error> {
    let counts = {
        let st = lock(&ctx.state);
        let live: Vec<&Pod> = st
            .pods
            .iter()
            .filter(|p| p.info.namespace == w.namespace && p.info.deployment == w.name && !p.info.terminating)
            .collect();
        let count = |f: &dyn Fn(&&Pod) -> bool| i32::try_from(live.iter().filter(|p| f(p)).count()).unwrap_or(i32::MAX);
        Counts {
            desired: w.desired,
            replicas: count(&|_| true),
            updated: count(&|p| p.info.template_hash == w.hash),
            ready: count(&|p| p.info.ready),
            max_unavailable: w.max_unavailable,
        }
    };
    let previous = w.deployment.status.as_ref();
    let short = &w.hash[..w.hash.len().min(8)];
    let status = deployment_status(
        w.deployment.metadata.generation,
        &format!("{}-{short}", w.name),
        counts,
        previous,
        &Time(Timestamp::now()),
    );
    let key = (w.namespace.clone(), w.name.clone());
    let written = lock(&ctx.state).written.get(&key).cloned();
    let unchanged = |s: Option<&DeploymentStatus>| s.is_some_and(|p| !status_differs(p, &status));
    if unchanged(previous) || unchanged(written.as_ref()) {
        return Ok(());
    }
    let api: Api<Deployment> = Api::namespaced(ctx.config.client.clone(), &w.namespace);
    let body = serde_json::json!({ "status": status });
    let params = PatchParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() };
    api.patch_status(&w.name, &params, &Patch::Merge(&body)).await?;
    lock(&ctx.state).written.insert(key, status);
    Ok(())
}

/// The command that builds the `cloud-controller-manager` binary next to the sandbox's, with the
/// same features as the README's commands (so it rebuilds nothing they built).
pub const BUILD_MANAGER: &str = "cargo build --bin sandbox --bin cloud-controller-manager";

/// Where `cloud-controller-manager` is: next to the running executable (the sandbox binary,
/// `target/<profile>/`), or one level up (a test binary in `target/<profile>/deps/`).
pub fn find_manager_binary() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    [Some(dir), dir.parent()].into_iter().flatten().map(|d| d.join("cloud-controller-manager")).find(|p| p.is_file())
}

/// The `cloud-controller-manager` binary next to this executable. Nothing is built here: a
/// running program that starts a compiler surprises whoever runs it; the error names the
/// command that builds it instead.
pub fn manager_binary() -> Result<PathBuf, Error> {
    find_manager_binary().ok_or_else(|| {
        let dir = std::env::current_exe()
            .ok()
            .and_then(|e| e.parent().map(Path::to_path_buf))
            .map_or_else(|| "this executable's directory".to_string(), |d| d.display().to_string());
        Error::ManagerBinary(format!(
            "Deployment mode runs the cloud-controller-manager binary, which is not built yet (looked in {dir}); \
             build it with `{BUILD_MANAGER}` (or `cargo test --workspace --no-run`), or pass --manager-binary <path>"
        ))
    })
}

// Node ports: what an emulated Node answers where kube-proxy and a workload would.

/// kube-proxy's health port, answered on every emulated Node.
pub const KUBE_PROXY_HEALTH_PORT: u16 = 10256;

/// Largest HTTP request head the node-port echo reads (bounds what a client can make it hold).
const MAX_REQUEST_HEAD: usize = 8 * 1024;

/// How long a node-port connection may stay idle.
const NODE_PORT_IDLE: Duration = Duration::from_secs(60);

/// One listener of an emulated Node: its InternalIP, a port, TCP or UDP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodePortKey {
    /// The Node's InternalIP.
    pub ip: IpAddr,
    /// The port.
    pub port: u16,
    /// UDP rather than TCP.
    pub udp: bool,
}

impl std::fmt::Display for NodePortKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", SocketAddr::new(self.ip, self.port), if self.udp { "UDP" } else { "TCP" })
    }
}

/// What an emulated Node answers on one port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodePortRole {
    /// A Service's nodePort: an echo that names the Node and the Service.
    Echo {
        /// The Node.
        node: String,
        /// `namespace/name` of the Service.
        service: String,
    },
    /// kube-proxy's `/healthz` or a Service's `healthCheckNodePort`: always 200 (every emulated
    /// Node has a local endpoint).
    Health {
        /// The Node.
        node: String,
    },
}

/// The listeners emulated Nodes need for these Nodes and Services (pure): kube-proxy's health
/// port on each Node's first InternalIP, every Service's nodePorts (echo) and, for
/// `externalTrafficPolicy: Local`, its `healthCheckNodePort`. Nodes being deleted serve nothing.
pub fn node_port_plan(nodes: &[Arc<Node>], services: &[Arc<Service>]) -> BTreeMap<NodePortKey, NodePortRole> {
    let mut plan = BTreeMap::new();
    for node in nodes {
        if node.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let name = node.name_any();
        let ip = node
            .status
            .as_ref()
            .and_then(|s| s.addresses.as_ref())
            .into_iter()
            .flatten()
            .filter(|a| a.type_ == "InternalIP")
            .find_map(|a| a.address.parse::<IpAddr>().ok());
        let Some(ip) = ip else { continue };
        let health = NodePortRole::Health { node: name.clone() };
        plan.insert(NodePortKey { ip, port: KUBE_PROXY_HEALTH_PORT, udp: false }, health.clone());
        for service in services {
            let Some(spec) = service.spec.as_ref() else { continue };
            let key = format!("{}/{}", service.namespace().unwrap_or_default(), service.name_any());
            for p in spec.ports.iter().flatten() {
                let Some(port) = p.node_port.and_then(|n| u16::try_from(n).ok()).filter(|n| *n != 0) else {
                    continue;
                };
                let udp = match p.protocol.as_deref().unwrap_or("TCP") {
                    "TCP" => false,
                    "UDP" => true,
                    _ => continue,
                };
                plan.insert(
                    NodePortKey { ip, port, udp },
                    NodePortRole::Echo { node: name.clone(), service: key.clone() },
                );
            }
            let local = spec.external_traffic_policy.as_deref() == Some("Local");
            if let Some(port) = spec.health_check_node_port.and_then(|n| u16::try_from(n).ok()).filter(|_| local) {
                plan.insert(NodePortKey { ip, port, udp: false }, health.clone());
            }
        }
    }
    plan
}

/// The line the echo answers with.
pub fn echo_line(node: &str, service: &str) -> String {
    format!("node={node} service={service}\n")
}

struct Served {
    role: NodePortRole,
    stop: CancellationToken,
}

#[derive(Default)]
struct NodePortState {
    served: BTreeMap<NodePortKey, Served>,
    /// Listeners that could not be opened (an address not on this host), logged once.
    failed: BTreeSet<NodePortKey>,
}

/// Emulated Nodes' ports: for every Node whose InternalIP is an address of this host (for
/// example on loopback, `127.0.1.<n>`), an echo on each Service's nodePorts that says which Node
/// and Service answered, and 200 on kube-proxy's health port and on `healthCheckNodePort`s.
/// Follows Nodes and Services as they change; everything stops when it is dropped.
pub struct NodePorts {
    state: Arc<Mutex<NodePortState>>,
    stop: CancellationToken,
}

impl std::fmt::Debug for NodePorts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodePorts").finish_non_exhaustive()
    }
}

impl NodePorts {
    /// Start following Nodes and Services (needs a Tokio runtime).
    pub fn start(client: Client) -> NodePorts {
        let state = Arc::new(Mutex::new(NodePortState::default()));
        let stop = CancellationToken::new();
        tokio::spawn(run_node_ports(client, state.clone(), stop.clone()));
        NodePorts { state, stop }
    }

    /// What is served now, sorted.
    pub fn served(&self) -> Vec<(NodePortKey, NodePortRole)> {
        let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.served.iter().map(|(k, s)| (*k, s.role.clone())).collect()
    }
}

impl Drop for NodePorts {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn run_node_ports(client: Client, state: Arc<Mutex<NodePortState>>, stop: CancellationToken) {
    let (nodes, node_writer) = reflector::store::<Node>();
    let (services, service_writer) = reflector::store::<Service>();
    let mut node_events = watcher(Api::<Node>::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .reflect(node_writer)
        .boxed();
    let mut service_events = watcher(Api::<Service>::all(client), watcher::Config::default())
        .default_backoff()
        .reflect(service_writer)
        .boxed();
    let (mut nodes_listed, mut services_listed) = (false, false);
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            e = node_events.next() => match e {
                None => break,
                Some(Err(error)) => tracing::debug!(%error, "sandbox node ports: Node watch failed; retrying"),
                Some(Ok(watcher::Event::InitDone)) => nodes_listed = true,
                Some(Ok(_)) => {}
            },
            e = service_events.next() => match e {
                None => break,
                Some(Err(error)) => tracing::debug!(%error, "sandbox node ports: Service watch failed; retrying"),
                Some(Ok(watcher::Event::InitDone)) => services_listed = true,
                Some(Ok(_)) => {}
            },
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
        if nodes_listed && services_listed {
            let plan = node_port_plan(&nodes.state(), &services.state());
            sync_node_ports(&state, plan, &stop).await;
        }
    }
    let mut st = state.lock().unwrap_or_else(|e| e.into_inner());
    for served in st.served.values() {
        served.stop.cancel();
    }
    st.served.clear();
}

async fn sync_node_ports(
    state: &Arc<Mutex<NodePortState>>,
    plan: BTreeMap<NodePortKey, NodePortRole>,
    stop: &CancellationToken,
) {
    let wanted: Vec<(NodePortKey, NodePortRole)> = {
        let mut st = state.lock().unwrap_or_else(|e| e.into_inner());
        st.served.retain(|key, served| {
            let keep = plan.get(key) == Some(&served.role);
            if !keep {
                served.stop.cancel();
            }
            keep
        });
        st.failed.retain(|key| plan.contains_key(key));
        plan.into_iter().filter(|(key, _)| !st.served.contains_key(key)).collect()
    };
    for (key, role) in wanted {
        let addr = SocketAddr::new(key.ip, key.port);
        let token = stop.child_token();
        let started = if key.udp {
            tokio::net::UdpSocket::bind(addr).await.map(|s| {
                tokio::spawn(serve_udp_echo(s, role.clone(), token.clone()));
            })
        } else {
            tokio::net::TcpListener::bind(addr).await.map(|l| {
                tokio::spawn(serve_node_port(l, role.clone(), token.clone()));
            })
        };
        let mut st = state.lock().unwrap_or_else(|e| e.into_inner());
        match started {
            Ok(()) => {
                tracing::debug!(listener = %key, ?role, "sandbox node port serving");
                st.failed.remove(&key);
                st.served.insert(key, Served { role, stop: token });
            }
            Err(error) => {
                if st.failed.insert(key) {
                    tracing::debug!(listener = %key, %error, "sandbox node port cannot listen (address not on this host?)");
                }
            }
        }
    }
}

/// Serve one TCP node port (an echo or a health endpoint) until `stop` fires.
pub async fn serve_node_port(listener: tokio::net::TcpListener, role: NodePortRole, stop: CancellationToken) {
    let role = Arc::new(role);
    loop {
        let (stream, _) = tokio::select! {
            _ = stop.cancelled() => return,
            r = listener.accept() => match r {
                Ok(s) => s,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let (role, stop) = (role.clone(), stop.clone());
        tokio::spawn(async move {
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = tokio::time::timeout(NODE_PORT_IDLE, answer(stream, &role)) => {}
            }
        });
    }
}

/// Whether the bytes start like an HTTP request line (`GET /`, `HEAD /`, ...).
fn looks_like_http(head: &[u8]) -> bool {
    let method_len = head.iter().take_while(|b| b.is_ascii_uppercase()).count();
    method_len > 0 && head.get(method_len) == Some(&b' ')
}

async fn answer(mut stream: tokio::net::TcpStream, role: &NodePortRole) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut head = Vec::new();
    let mut buf = [0u8; 2048];
    // HTTP clients speak first; a raw client (nc) may wait for us: greet it after a moment.
    let first = tokio::time::timeout(Duration::from_millis(300), stream.read(&mut buf)).await;
    match first {
        Ok(Ok(0)) | Ok(Err(_)) => return,
        Ok(Ok(n)) => head.extend_from_slice(&buf[..n]),
        Err(_) => {}
    }
    let http = matches!(role, NodePortRole::Health { .. }) || looks_like_http(&head);
    if http {
        while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_REQUEST_HEAD {
            match tokio::time::timeout(Duration::from_secs(2), stream.read(&mut buf)).await {
                Ok(Ok(n)) if n > 0 => head.extend_from_slice(&buf[..n]),
                _ => break,
            }
        }
        let body = match role {
            NodePortRole::Echo { node, service } => echo_line(node, service),
            NodePortRole::Health { node } => format!("{{\"node\":\"{node}\",\"localEndpoints\":1}}\n"),
        };
        let response = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        let _ = stream.write_all(response.as_bytes()).await;
        let _ = stream.shutdown().await;
        return;
    }
    let NodePortRole::Echo { node, service } = role else { return };
    if stream.write_all(echo_line(node, service).as_bytes()).await.is_err() || stream.write_all(&head).await.is_err() {
        return;
    }
    loop {
        match stream.read(&mut buf).await {
            Ok(n) if n > 0 => {
                if stream.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
            _ => return,
        }
    }
}

/// Serve one UDP node port: each datagram is answered with the echo line and the payload.
pub async fn serve_udp_echo(socket: tokio::net::UdpSocket, role: NodePortRole, stop: CancellationToken) {
    let NodePortRole::Echo { node, service } = role else { return };
    let line = echo_line(&node, &service);
    let mut buf = vec![0u8; 65_535];
    loop {
        let (n, peer) = tokio::select! {
            _ = stop.cancelled() => return,
            r = socket.recv_from(&mut buf) => match r { Ok(r) => r, Err(_) => continue },
        };
        let mut reply = line.clone().into_bytes();
        reply.extend_from_slice(&buf[..n]);
        let _ = socket.send_to(&reply, peer).await;
    }
}

#[cfg(test)]
mod node_port_tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeAddress, NodeStatus, ServicePort, ServiceSpec};
    use kube::api::ObjectMeta;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn node(name: &str, ip: &str) -> Arc<Node> {
        Arc::new(Node {
            metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
            status: Some(NodeStatus {
                addresses: Some(vec![
                    NodeAddress { type_: "Hostname".into(), address: name.into() },
                    NodeAddress { type_: "InternalIP".into(), address: ip.into() },
                ]),
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    fn service(name: &str, ports: &[(&str, i32)], local_hcnp: Option<i32>) -> Arc<Service> {
        Arc::new(Service {
            metadata: ObjectMeta { name: Some(name.into()), namespace: Some("demo".into()), ..Default::default() },
            spec: Some(ServiceSpec {
                type_: Some("LoadBalancer".into()),
                ports: Some(
                    ports
                        .iter()
                        .map(|(protocol, np)| ServicePort {
                            protocol: Some(protocol.to_string()),
                            port: 80,
                            node_port: Some(*np),
                            ..Default::default()
                        })
                        .collect(),
                ),
                external_traffic_policy: local_hcnp.map(|_| "Local".into()),
                health_check_node_port: local_hcnp,
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    #[test]
    fn every_node_serves_every_node_port_and_the_health_ports() {
        let ip: IpAddr = "127.0.1.1".parse().unwrap();
        let plan = node_port_plan(
            &[node("n1", "127.0.1.1"), node("n2", "127.0.1.2")],
            &[
                service("web", &[("TCP", 30080), ("UDP", 30053)], None),
                service("local", &[("TCP", 30081)], Some(32000)),
            ],
        );
        let echo = |service: &str| NodePortRole::Echo { node: "n1".into(), service: service.into() };
        assert_eq!(plan.get(&NodePortKey { ip, port: 30080, udp: false }), Some(&echo("demo/web")));
        assert_eq!(plan.get(&NodePortKey { ip, port: 30053, udp: true }), Some(&echo("demo/web")));
        assert_eq!(plan.get(&NodePortKey { ip, port: 30081, udp: false }), Some(&echo("demo/local")));
        let health = NodePortRole::Health { node: "n1".into() };
        assert_eq!(plan.get(&NodePortKey { ip, port: KUBE_PROXY_HEALTH_PORT, udp: false }), Some(&health));
        assert_eq!(plan.get(&NodePortKey { ip, port: 32000, udp: false }), Some(&health));
        assert_eq!(plan.len(), 10, "five listeners on each of two Nodes: {plan:?}");
    }

    #[test]
    fn nodes_without_an_internal_ip_serve_nothing() {
        let mut bare = (*node("n1", "x")).clone();
        bare.status = None;
        assert!(node_port_plan(&[Arc::new(bare)], &[service("web", &[("TCP", 30080)], None)]).is_empty());
    }

    #[tokio::test]
    async fn the_echo_names_node_and_service_to_http_and_raw_clients() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        let role = NodePortRole::Echo { node: "n1".into(), service: "demo/web".into() };
        tokio::spawn(serve_node_port(listener, role, stop.clone()));

        let mut http = tokio::net::TcpStream::connect(addr).await.unwrap();
        http.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
        let mut response = String::new();
        http.read_to_string(&mut response).await.unwrap();
        assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
        assert!(response.ends_with("\r\n\r\nnode=n1 service=demo/web\n"), "{response}");

        let mut raw = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut greeting = [0u8; 25];
        raw.read_exact(&mut greeting).await.unwrap();
        assert_eq!(&greeting, b"node=n1 service=demo/web\n");
        raw.write_all(b"ping").await.unwrap();
        let mut echo = [0u8; 4];
        raw.read_exact(&mut echo).await.unwrap();
        assert_eq!(&echo, b"ping");
        stop.cancel();
    }

    /// GET `/` on `addr`; the response body.
    async fn http_get(addr: SocketAddr) -> Option<String> {
        let connect = tokio::net::TcpStream::connect(addr);
        let mut stream = tokio::time::timeout(Duration::from_secs(2), connect).await.ok()?.ok()?;
        stream.write_all(b"GET / HTTP/1.1\r\nHost: lb\r\nConnection: close\r\n\r\n").await.ok()?;
        let mut response = String::new();
        tokio::time::timeout(Duration::from_secs(2), stream.read_to_string(&mut response)).await.ok()?.ok()?;
        response.split_once("\r\n\r\n").map(|(_, body)| body.to_string())
    }

    async fn eventually<T, F, Fut>(what: &str, f: F) -> T
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Option<T>>,
    {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(v) = f().await {
                return v;
            }
            assert!(Instant::now() < deadline, "{what}: not reached in 30 s");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    e2e_apiserver::backend_tests! {
        /// The sandbox's picture end to end: emulated Nodes on loopback answer on the nodePorts,
        /// the baremetal provider in proxy mode serves the Service's address, and a GET on
        /// `<EXTERNAL-IP>:<port>` (TCP) and a datagram (UDP) come back naming Node and Service;
        /// a deleted Node stops answering.
        async fn an_http_get_and_a_datagram_on_the_external_ip_reach_an_emulated_node(backend) {
            use kube::api::{DeleteParams, PostParams};
            use ccm_framework::provider::CloudProvider;
            use ccm_provider_baremetal::BaremetalProvider;

            let cluster = e2e_apiserver::TestCluster::start(backend).await.unwrap();
            let b: u8 = if cluster.is_genuine() { 160 } else { 60 };
            let ns = cluster.fresh_namespace("node-ports").await.unwrap();
            let nodes: Api<Node> = Api::all(cluster.client());
            for (suffix, host) in [("a", 1), ("b", 2)] {
                let name = format!("np{b}-{suffix}");
                let node = (*node(&name, &format!("127.{b}.0.{host}"))).clone();
                nodes.create(&PostParams::default(), &node).await.unwrap();
                let status = serde_json::json!({ "status": node.status });
                nodes.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();
            }
            let node_ports = NodePorts::start(cluster.client());
            let np = 30000 + u16::from(b) * 10;
            let mut web = (*service("web", &[("TCP", i32::from(np)), ("UDP", i32::from(np) + 1)], None)).clone();
            web.metadata.namespace = Some(ns.clone());
            if let Some(ports) = web.spec.as_mut().and_then(|s| s.ports.as_mut()) {
                ports[0].name = Some("http".into());
                ports[0].port = 8080;
                ports[1].name = Some("dns".into());
                ports[1].port = 5353;
            }
            let services: Api<Service> = Api::namespaced(cluster.client(), &ns);
            services.create(&PostParams::default(), &web).await.unwrap();

            let config = format!(
                "loadBalancer:\n  mode: proxy\n  proxy:\n    healthCheckInterval: 100ms\n    healthCheckTimeout: 100ms\n    drainTimeout: 1s\n  pools:\n    - name: sandbox\n      cidrs: [127.{b}.0.240/29]\n      allowLoopback: true\n"
            );
            let provider = std::sync::Arc::new(BaremetalProvider::from_cloud_config(Some(config.as_bytes())).unwrap());
            let options = ccm_framework::options::ControllerOptions { concurrent_service_syncs: 2, ..Default::default() };
            let running = ccm_framework::engine::testing::run_controller(
                cluster.client(),
                provider as std::sync::Arc<dyn CloudProvider>,
                options,
                Box::new(ccm_framework::controllers::service::ServiceController::new()),
            )
            .await;
            let ip: IpAddr = eventually("an external IP", || async {
                let svc = services.get("web").await.ok()?;
                let ingress = svc.status?.load_balancer?.ingress?;
                ingress.first()?.ip.as_deref()?.parse().ok()
            })
            .await;

            let expected = |node: &str| format!("node={node} service={ns}/web\n");
            let mut answered = BTreeSet::new();
            for _ in 0..6 {
                let body = eventually("GET / answers", || http_get(SocketAddr::new(ip, 8080))).await;
                answered.insert(body);
            }
            assert_eq!(answered, BTreeSet::from([expected(&format!("np{b}-a")), expected(&format!("np{b}-b"))]));

            let client = tokio::net::UdpSocket::bind(SocketAddr::new(ip, 0)).await.unwrap();
            client.send_to(b"hi", SocketAddr::new(ip, 5353)).await.unwrap();
            let mut buf = [0u8; 256];
            let (n, _) = tokio::time::timeout(Duration::from_secs(5), client.recv_from(&mut buf)).await.unwrap().unwrap();
            let reply = String::from_utf8_lossy(&buf[..n]).to_string();
            assert!(reply.starts_with(&format!("node=np{b}-")) && reply.ends_with(&format!("service={ns}/web\nhi")), "{reply}");

            // Deleting a Node takes it out of the load balancer (no GC on the genuine backend,
            // but nothing holds a Node back).
            nodes.delete(&format!("np{b}-b"), &DeleteParams::default()).await.unwrap();
            let only_a = expected(&format!("np{b}-a"));
            eventually("only the remaining Node answers", || async {
                for _ in 0..4 {
                    if http_get(SocketAddr::new(ip, 8080)).await.as_deref() != Some(only_a.as_str()) {
                        return None;
                    }
                }
                Some(())
            })
            .await;
            running.stop().await.unwrap();
            drop(node_ports);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, current: bool, ready: bool) -> PlanPod {
        PlanPod { name: name.into(), current, ready }
    }

    #[test]
    fn scaling_up_from_nothing_starts_every_replica() {
        assert_eq!(plan(2, 1, &[]), Plan { terminate: vec![], start: 2 });
    }

    #[test]
    fn a_rollout_replaces_one_pod_at_a_time_keeping_one_ready() {
        // Two ready old pods: stop one.
        let p = plan(2, 1, &[pod("a", false, true), pod("b", false, true)]);
        assert_eq!(p, Plan { terminate: vec!["a".into()], start: 0 });
        // One old left: start its replacement.
        assert_eq!(plan(2, 1, &[pod("b", false, true)]), Plan { terminate: vec![], start: 1 });
        // The new one is not ready: the last old one stays.
        assert_eq!(plan(2, 1, &[pod("b", false, true), pod("n1", true, false)]), Plan::default());
        // Ready: replace the last old one.
        let p = plan(2, 1, &[pod("b", false, true), pod("n1", true, true)]);
        assert_eq!(p.terminate, vec!["b".to_string()]);
        // Done.
        assert_eq!(plan(2, 1, &[pod("n1", true, true), pod("n2", true, true)]), Plan::default());
    }

    #[test]
    fn the_strategy_sets_how_many_pods_a_rollout_takes_down_at_once() {
        // The operator's host-network Deployments: every old pod goes at once, as the
        // Deployment controller does, so a second replica never waits for a port.
        let host = operator::build::deployment_strategy(true);
        assert_eq!(max_unavailable(Some(&host), 2), 2);
        let p = plan(2, max_unavailable(Some(&host), 2), &[pod("a", false, true), pod("b", false, true)]);
        assert_eq!(p, Plan { terminate: vec!["a".into(), "b".into()], start: 0 });
        // On the pod network: one at a time.
        let pod_network = operator::build::deployment_strategy(false);
        assert_eq!(max_unavailable(Some(&pod_network), 2), 1);
        let p = plan(2, max_unavailable(Some(&pod_network), 2), &[pod("a", false, true), pod("b", false, true)]);
        assert_eq!(p.terminate, vec!["a".to_string()]);
        // Percentages round down, unset is 25%, and never below one without a surge.
        let pct = |v: &str| DeploymentStrategy {
            rolling_update: Some(k8s_openapi::api::apps::v1::RollingUpdateDeployment {
                max_unavailable: Some(IntOrString::String(v.into())),
                max_surge: None,
            }),
            ..Default::default()
        };
        assert_eq!(max_unavailable(Some(&pct("50%")), 3), 1);
        assert_eq!(max_unavailable(Some(&pct("0%")), 3), 1);
        assert_eq!(max_unavailable(None, 8), 2);
        let recreate = DeploymentStrategy { type_: Some("Recreate".into()), rolling_update: None };
        assert_eq!(max_unavailable(Some(&recreate), 3), 3);
    }

    #[test]
    fn an_unready_old_pod_goes_first() {
        let p = plan(2, 1, &[pod("a", false, true), pod("b", false, false)]);
        assert_eq!(p.terminate, vec!["b".to_string()]);
    }

    #[test]
    fn scaling_down_stops_surplus_pods() {
        let p = plan(1, 1, &[pod("a", true, true), pod("b", true, true)]);
        assert_eq!(p.terminate, vec!["b".to_string()]);
        let p = plan(1, 1, &[pod("old", false, true), pod("a", true, true)]);
        assert_eq!(p.terminate, vec!["old".to_string()]);
        assert_eq!(plan(0, 1, &[pod("a", true, true)]).terminate, vec!["a".to_string()]);
    }

    #[test]
    fn status_reports_a_complete_rollout_as_the_deployment_controller_does() {
        let now = Time(Timestamp::now());
        let done = deployment_status(
            Some(3),
            "ccm-x-1234",
            Counts { desired: 2, replicas: 2, updated: 2, ready: 2, max_unavailable: 1 },
            None,
            &now,
        );
        assert_eq!(
            (done.observed_generation, done.available_replicas, done.unavailable_replicas),
            (Some(3), Some(2), Some(0))
        );
        let conditions = done.conditions.clone().unwrap();
        assert_eq!(conditions[0].reason.as_deref(), Some("MinimumReplicasAvailable"));
        assert_eq!(conditions[1].reason.as_deref(), Some("NewReplicaSetAvailable"));
        let rolling = deployment_status(
            Some(4),
            "ccm-x-5678",
            Counts { desired: 2, replicas: 2, updated: 1, ready: 1, max_unavailable: 1 },
            Some(&done),
            &now,
        );
        let conditions = rolling.conditions.clone().unwrap();
        assert_eq!(
            (conditions[0].status.as_str(), conditions[1].reason.as_deref()),
            ("True", Some("ReplicaSetUpdated"))
        );
        // The same counts again: nothing to write.
        let later = Time(Timestamp::now());
        let again = deployment_status(
            Some(4),
            "ccm-x-5678",
            Counts { desired: 2, replicas: 2, updated: 1, ready: 1, max_unavailable: 1 },
            Some(&rolling),
            &later,
        );
        assert!(!status_differs(&rolling, &again));
        assert_eq!(again.conditions.unwrap()[0].last_transition_time, conditions[0].last_transition_time);
        let down = deployment_status(
            Some(4),
            "x",
            Counts { desired: 2, replicas: 2, updated: 2, ready: 0, max_unavailable: 1 },
            None,
            &now,
        );
        assert_eq!(down.conditions.unwrap()[0].status, "False");
    }
}
