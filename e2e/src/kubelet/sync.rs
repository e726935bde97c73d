//! The kubelet's loop: it watches the operator's manager Deployments and, on each event and
//! every sync period, reaps and restarts processes, probes readiness, stops and starts pods as
//! [`rollout`](super::rollout) decides, and writes each Deployment's status when it changed.

use std::collections::BTreeSet;
use std::fs;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::{Deployment, DeploymentStatus};
use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use operator::names;
use tokio_util::sync::CancellationToken;

use super::args::resolve_args;
use super::process::{KubeletConfig, Pod, PodInfo, State, free_port, lock, spawn, terminate};
use super::rollout::{Counts, PlanPod, deployment_status, max_unavailable, plan, status_differs};
use crate::Error;

/// The field manager of the Deployment status writes.
pub const FIELD_MANAGER: &str = "sandbox-kubelet";
/// How long one `/readyz` probe may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// What the loop works with.
pub(super) struct Ctx {
    /// How it runs.
    pub(super) config: KubeletConfig,
    /// The pods, shared with the handle.
    pub(super) state: Arc<Mutex<State>>,
    /// The kubelet's directory.
    pub(super) work_dir: PathBuf,
}

/// Watch the Deployments and sync the pods until `stop` fires.
pub(super) async fn run(ctx: Ctx, stop: CancellationToken) {
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

/// The workload of a manager Deployment; `None` for another Deployment or one being deleted.
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

/// One pass: reap, restart and stop processes, probe readiness, then roll out, scale and
/// report each Deployment.
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

/// Start one pod of the current template.
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

/// Write the Deployment's status, unless the last one written or seen says the same.
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
