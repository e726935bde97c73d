//! The [`Kubelet`] a caller holds: it starts the loop, shows the pods, kills one as a crash
//! would, and stops every process (gracefully on `shutdown`, at once when dropped).

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::binary::BUILD_MANAGER;
use super::process::{KubeletConfig, PodInfo, State, lock, terminate};
use super::sync::{Ctx, run};
use crate::Error;

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

/// Numbers the kubelets of this process, for their directories.
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
