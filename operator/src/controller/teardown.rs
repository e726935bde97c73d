//! Teardown: what goes when a resource is deleted or no longer wants a child. The workload
//! first, then the manager's RBAC once its Pods are gone (a stopping manager needs its Lease
//! rights to release the Lease), bounded by [`TEARDOWN_GRACE`]; the finalizer holds the
//! resource until what ownerReferences cannot remove is gone.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::EventType;

use super::context::Ctx;
use super::events::publish;
use crate::apply::ChildKey;
use crate::build::Kind;
use crate::error::Error;
use crate::names;
use crds::reasons::{self, degraded};

/// How long the manager's RBAC outlives its workload at most, waiting for its Pods to stop: the
/// Pods' termination grace (30 s) plus the garbage collector's and the kubelet's delays.
pub const TEARDOWN_GRACE: Duration = Duration::from_secs(60);

/// How soon a CR whose teardown waits for Pods is looked at again (Pod deletions also wake it).
pub const TEARDOWN_RECHECK: Duration = Duration::from_secs(2);

/// Whether RBAC deletion keeps waiting with `pods_left` manager Pods after `waited` (pure).
pub fn teardown_waits(pods_left: usize, waited: Duration) -> bool {
    pods_left > 0 && waited < TEARDOWN_GRACE
}

/// Whether the manager's RBAC of `uid` must stay for now: its Pods still exist (a stopping
/// manager needs its Lease rights to release the Lease) and [`TEARDOWN_GRACE`] has not run
/// out since the wait began.
pub fn rbac_must_wait(ctx: &Ctx, uid: &str) -> bool {
    let pods = ctx.pods_of(uid).len();
    if pods == 0 {
        ctx.memory.teardown_over(uid);
        return false;
    }
    let wait = teardown_waits(pods, ctx.memory.teardown_waited(uid));
    if !wait {
        ctx.memory.teardown_over(uid);
        tracing::warn!(uid, pods, grace = ?TEARDOWN_GRACE, "manager Pods still exist after the grace; deleting their RBAC anyway");
    }
    wait
}

/// Delete every child of `uid` not in `keep`: the workload first, then the manager's RBAC,
/// but only once the workload's Pods are gone (see [`rbac_must_wait`]). Returns the
/// deleted ones, failures, and whether RBAC deletion waits for Pods.
pub async fn prune(ctx: &Ctx, uid: &str, keep: &[ChildKey]) -> (Vec<String>, Vec<(&'static str, String)>, bool) {
    let mut pruned = Vec::new();
    let mut failures = Vec::new();
    let (workload, rbac): (Vec<ChildKey>, Vec<ChildKey>) =
        ctx.children.owned_by(uid).into_iter().filter(|k| !keep.contains(k)).partition(|k| is_workload(k.kind));
    delete_children(ctx, uid, &workload, &mut pruned, &mut failures).await;
    let waiting = !rbac.is_empty() && rbac_must_wait(ctx, uid);
    if !waiting {
        delete_children(ctx, uid, &rbac, &mut pruned, &mut failures).await;
    }
    (pruned, failures, waiting)
}

/// Delete `keys` (children of `uid`), recording what existed and what failed.
pub async fn delete_children(
    ctx: &Ctx,
    uid: &str,
    keys: &[ChildKey],
    pruned: &mut Vec<String>,
    failures: &mut Vec<(&'static str, String)>,
) {
    for key in keys {
        match ctx.applier.delete_owned(key, uid).await {
            Ok(existed) => {
                ctx.shared.metrics.write("delete", key.kind.as_str());
                if existed {
                    pruned.push(key.to_string());
                }
            }
            Err(e) => failures.push((degraded::APPLY_FAILED, format!("deleting {key}: {e}"))),
        }
    }
}

/// The kinds that run or guard manager Pods, deleted before the RBAC those Pods use.
pub fn is_workload(kind: Kind) -> bool {
    matches!(kind, Kind::Deployment | Kind::DaemonSet | Kind::PodDisruptionBudget)
}

/// Whether the CR carries the operator's finalizer.
pub fn has_finalizer(meta: &ObjectMeta) -> bool {
    meta.finalizers.iter().flatten().any(|f| f == names::FINALIZER)
}

/// Add the operator's finalizer, failing if the CR changed since `meta` was read.
pub async fn add_finalizer(ctx: &Ctx, namespace: &str, name: &str, meta: &ObjectMeta) -> Result<(), Error> {
    // The resourceVersion test makes this fail, rather than clobber, if the list changed.
    let rv = meta.resource_version.clone().unwrap_or_default();
    let ops = if meta.finalizers.as_ref().is_none_or(Vec::is_empty) {
        serde_json::json!([
            {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
            {"op": "add", "path": "/metadata/finalizers", "value": [names::FINALIZER]},
        ])
    } else {
        serde_json::json!([
            {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
            {"op": "add", "path": "/metadata/finalizers/-", "value": names::FINALIZER},
        ])
    };
    patch_finalizers(ctx, namespace, name, ops).await
}

/// Remove the operator's finalizer (a CR already gone is fine).
pub async fn remove_finalizer(ctx: &Ctx, namespace: &str, name: &str, meta: &ObjectMeta) -> Result<(), Error> {
    let Some(i) = meta.finalizers.iter().flatten().position(|f| f == names::FINALIZER) else { return Ok(()) };
    let path = format!("/metadata/finalizers/{i}");
    let ops = serde_json::json!([
        {"op": "test", "path": path, "value": names::FINALIZER},
        {"op": "remove", "path": path},
    ]);
    match patch_finalizers(ctx, namespace, name, ops).await {
        Err(Error::Kube(kube::Error::Api(s))) if s.is_not_found() => Ok(()),
        other => other,
    }
}

async fn patch_finalizers(ctx: &Ctx, namespace: &str, name: &str, ops: serde_json::Value) -> Result<(), Error> {
    let patch: json_patch::Patch = serde_json::from_value(ops).map_err(|e| Error::Config(e.to_string()))?;
    ctx.api(namespace).patch(name, &PatchParams::default(), &Patch::<()>::Json(patch)).await?;
    ctx.shared.metrics.write("finalizer", "CloudControllerManager");
    Ok(())
}

/// Stop an embedded engine, delete the workload, and once its Pods are gone remove what
/// ownerReferences cannot (the ClusterRoleBinding, and the Role and RoleBindings of a migration
/// Lease in another namespace, `lease_namespace`). Returns false while the Pods still run: the
/// garbage collector would otherwise delete the workload and the manager's RBAC at once when the
/// finalizer goes, and a stopping manager could not release its Lease.
pub async fn cleanup(
    ctx: &Ctx,
    meta: &ObjectMeta,
    namespace: &str,
    name: &str,
    lease_namespace: Option<&str>,
) -> Result<bool, Error> {
    let uid = meta.uid.clone().unwrap_or_default();
    let key = format!("{namespace}/{name}");
    if ctx.shared.engines.stop(&uid).await {
        publish(
            ctx,
            meta,
            EventType::Normal,
            reasons::events::ENGINE_STOPPED,
            "the CloudControllerManager is being deleted".into(),
            "StopEngine",
        );
    }
    let workload: Vec<ChildKey> = ctx.children.owned_by(&uid).into_iter().filter(|k| is_workload(k.kind)).collect();
    let mut deleted = Vec::new();
    let mut failures = Vec::new();
    delete_children(ctx, &uid, &workload, &mut deleted, &mut failures).await;
    if let Some((_, message)) = failures.first() {
        publish(ctx, meta, EventType::Warning, reasons::events::CLEANUP_FAILED, message.clone(), "Cleanup");
        return Err(Error::Cleanup(message.clone()));
    }
    if !deleted.is_empty() {
        publish(
            ctx,
            meta,
            EventType::Normal,
            reasons::events::PRUNED,
            format!("deleted {}", deleted.join(", ")),
            "Cleanup",
        );
    }
    if rbac_must_wait(ctx, &uid) {
        return Ok(false);
    }
    let mut crbs: Vec<ChildKey> = ctx
        .children
        .owned_by(&uid)
        .into_iter()
        .filter(|k| k.kind == Kind::ClusterRoleBinding || k.namespace.as_deref().is_some_and(|ns| ns != namespace))
        .collect();
    let mut by_name: Vec<ChildKey> = [
        names::cluster_role_binding_name(namespace, name),
        names::shadow_cluster_role_binding_name(namespace, name),
        names::upstream_cluster_role_binding_name(namespace, name),
        names::node_manager_cluster_role_binding_name(namespace, name),
    ]
    .into_iter()
    .map(|name| ChildKey { kind: Kind::ClusterRoleBinding, namespace: None, name })
    .collect();
    if let Some(lease_ns) = lease_namespace {
        let at = |kind: Kind, object: String| ChildKey { kind, namespace: Some(lease_ns.to_string()), name: object };
        by_name.extend([
            at(Kind::Role, names::migration_role_name(namespace, name)),
            at(Kind::RoleBinding, names::migration_role_name(namespace, name)),
            at(Kind::RoleBinding, names::migration_create_binding_name(namespace, name)),
        ]);
    }
    for key in by_name {
        if !crbs.contains(&key) {
            crbs.push(key);
        }
    }
    let mut deleted = Vec::new();
    // Only objects labelled as this operator's for this CR are deleted, whatever their name:
    // RBAC lets the operator delete any, so the code is what keeps others safe.
    for crb in crbs {
        match ctx.applier.delete_owned(&crb, &uid).await {
            Ok(existed) => {
                ctx.shared.metrics.write("delete", crb.kind.as_str());
                if existed {
                    deleted.push(crb.to_string());
                }
            }
            Err(e) => {
                publish(
                    ctx,
                    meta,
                    EventType::Warning,
                    reasons::events::CLEANUP_FAILED,
                    format!("deleting {crb}: {e}"),
                    "Cleanup",
                );
                return Err(e.into());
            }
        }
    }
    ctx.memory.forget(&uid);
    // The CRs that lost a conflict to this one may deploy now.
    ctx.wake(ctx.memory.set_losers(&key, BTreeSet::new()));
    if !deleted.is_empty() {
        publish(
            ctx,
            meta,
            EventType::Normal,
            reasons::events::CLEANED_UP,
            format!("deleted {}", deleted.join(", ")),
            "Cleanup",
        );
    }
    tracing::info!(cr = %key, "cleaned up");
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::observe::awaiting_observation;
    use crate::status::{EngineState, Workload};

    #[test]
    fn the_managers_rbac_waits_for_its_pods_but_not_beyond_the_grace() {
        assert!(!teardown_waits(0, Duration::ZERO), "no Pods: delete at once");
        use crate::status::{DaemonSetObservation, DeploymentObservation};
        let dep = |generation, observed| {
            Workload::Deployment(DeploymentObservation {
                generation,
                observed_generation: observed,
                ..Default::default()
            })
        };
        assert!(awaiting_observation(&Workload::None), "not in the cache yet");
        assert!(awaiting_observation(&dep(2, 1)), "the controller has not seen the new template");
        assert!(!awaiting_observation(&dep(2, 2)), "observed: its counts tell the rollout");
        let ds =
            Workload::DaemonSet(DaemonSetObservation { generation: 3, observed_generation: 2, ..Default::default() });
        assert!(awaiting_observation(&ds));
        assert!(!awaiting_observation(&Workload::Embedded(EngineState::Running)));
        assert!(teardown_waits(2, Duration::from_secs(5)));
        assert!(teardown_waits(1, TEARDOWN_GRACE - Duration::from_millis(1)));
        assert!(!teardown_waits(1, TEARDOWN_GRACE), "bounded");
        for kind in Kind::ALL {
            let rbac = matches!(kind, Kind::ServiceAccount | Kind::ClusterRoleBinding | Kind::RoleBinding | Kind::Role);
            assert_eq!(is_workload(kind), !rbac, "{kind}");
        }
    }
}
