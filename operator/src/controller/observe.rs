//! Observe: the workload (or embedded engine), its Pods and the Lease of a resource, from the
//! caches, for the status step.

use std::sync::Arc;

use crds::Mode;
use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::reflector::ObjectRef;

use super::context::{Ctx, Input};
use crate::dereference;
use crate::names;
use crate::status::{PodsObservation, Workload};

/// The workload (or engine), its Pods and the Lease, from the caches.
pub async fn observe(ctx: &Ctx, input: &Input<'_>) -> (Workload, PodsObservation, Option<Arc<Lease>>) {
    let workload = observe_workload(ctx, input).await;
    let lease = ctx.leases.get(&ObjectRef::new(input.name).within(input.namespace));
    let pods = match input.cr.spec.mode {
        // Pods left by a previous mode are the teardown's business, not this status's.
        Mode::Embedded => PodsObservation::default(),
        Mode::Deployment | Mode::DaemonSet => {
            let pods = ctx.manager_pods_of(&input.uid);
            dereference::observe_pods(pods.iter().map(|p| &**p))
        }
    };
    (workload, pods, lease)
}

/// The workload (or engine) of the CR's current mode, from the caches.
pub async fn observe_workload(ctx: &Ctx, input: &Input<'_>) -> Workload {
    let (namespace, name) = (input.namespace, input.name);
    match input.cr.spec.mode {
        Mode::Embedded => match ctx.shared.engines.state(&input.uid).await {
            Some(state) => Workload::Embedded(state),
            None => Workload::None,
        },
        Mode::Deployment => ctx
            .children
            .deployments
            .get(&ObjectRef::new(&names::workload_name(name)).within(namespace))
            .map_or(Workload::None, |d| Workload::Deployment(dereference::observe_deployment(&d))),
        Mode::DaemonSet => ctx
            .children
            .daemon_sets
            .get(&ObjectRef::new(&names::workload_name(name)).within(namespace))
            .map_or(Workload::None, |d| Workload::DaemonSet(dereference::observe_daemon_set(&d))),
    }
}

/// Whether a pod template just applied is still unseen by the workload's controller (pure): the
/// workload is not in the cache yet, or its controller has not observed its generation. Until
/// then its counts describe the old template, and the rollout counts as just started (the
/// cached CR may lag behind the `Progressing=True` written for it, and a status computed from
/// that stale copy would otherwise write `Progressing=False` over it).
pub fn awaiting_observation(workload: &Workload) -> bool {
    match workload {
        Workload::None => true,
        Workload::Deployment(d) => d.observed_generation < d.generation,
        Workload::DaemonSet(d) => d.observed_generation < d.generation,
        Workload::Embedded(_) => false,
    }
}
