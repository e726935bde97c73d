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
//!
//! Files: `handle.rs` (the [`Kubelet`] a caller holds), `sync.rs` (the Deployment watch and
//! one pass over the pods), `process.rs` (a pod's manager process), `args.rs` (its command line
//! and cloud-config), `rollout.rs` (the Deployment controller's decisions, pure), `binary.rs`
//! (where the manager binary is), and what an emulated Node answers: `node_ports.rs` (following
//! Nodes and Services), `node_port_plan.rs` (which listeners, pure) and `echo.rs` (serving one).

mod args;
mod binary;
mod echo;
#[cfg(test)]
mod fixtures;
mod handle;
mod node_port_plan;
mod node_ports;
mod process;
mod rollout;
mod sync;

pub use self::binary::{BUILD_MANAGER, find_manager_binary, manager_binary};
pub use self::echo::{echo_line, serve_node_port, serve_udp_echo};
pub use self::handle::Kubelet;
pub use self::node_port_plan::{KUBE_PROXY_HEALTH_PORT, NodePortKey, NodePortRole, node_port_plan};
pub use self::node_ports::NodePorts;
pub use self::process::{KubeletConfig, PodInfo};
pub use self::rollout::{Counts, Plan, PlanPod, deployment_status, max_unavailable, plan};
pub use self::sync::FIELD_MANAGER;
