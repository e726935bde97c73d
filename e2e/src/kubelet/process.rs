//! The emulated pods: one `cloud-controller-manager` process each, started with the pod's
//! arguments and its log as stdout and stderr, and asked to stop with SIGTERM.

use std::collections::BTreeMap;
use std::fs;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::DeploymentStatus;
use kube::Client;

use crate::Error;

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

/// A pod and its process, as the kubelet keeps it.
pub(super) struct Pod {
    /// What callers see of it.
    pub(super) info: PodInfo,
    /// Its process, while one runs.
    pub(super) child: Option<Child>,
    /// When its process exited, until it is restarted.
    pub(super) exited_at: Option<Instant>,
    /// When SIGTERM was sent.
    pub(super) term_sent: Option<Instant>,
    /// Its directory (the cloud-config copy), removed with it.
    pub(super) dir: PathBuf,
}

/// Everything the kubelet keeps, shared by its handle and its loop.
#[derive(Default)]
pub(super) struct State {
    /// The pods, terminating ones included.
    pub(super) pods: Vec<Pod>,
    /// The last pod number given.
    pub(super) counter: u64,
    /// The last status written per Deployment, so a write is not repeated before the watch
    /// shows it.
    pub(super) written: BTreeMap<(String, String), DeploymentStatus>,
}

/// The state, also after a panic elsewhere poisoned its lock.
pub(super) fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|e| e.into_inner())
}

/// Ask a process to stop (SIGTERM) through `kill(1)`; without it, kill it at once.
pub(super) fn terminate(child: &Child) {
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

/// A free TCP port on 127.0.0.1 for a pod's `--secure-port`.
pub(super) fn free_port() -> Result<u16, Error> {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| Error::io("finding a free port", e))
}

/// Start the pod's process: its arguments, `HOSTNAME` set to its name, output to its log.
pub(super) fn spawn(config: &KubeletConfig, info: &PodInfo) -> Result<Child, Error> {
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
