//! The build-and-apply step: the children a valid resource should have, written (or its
//! embedded engine run, with the provider validation built), and what it no longer wants
//! pruned. An invalid resource leaves whatever runs as it was, except that a conflicting one
//! is stopped.

use std::sync::Arc;

use ccm_framework::provider::CloudProvider;
use crds::Mode;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::events::EventType;

use super::context::{Ctx, Input, Outcome};
use super::observe::observe_workload;
use super::teardown::{is_workload, prune};
use crate::apply::{self, ChildKey, NameConflict};
use crate::build::{self, Desired, Kind};
use crate::names;
use crate::switch::{self, Switch};
use crate::validate::{self, SecretState, Validation};
use crds::reasons::{self, degraded};

/// Build the children of a valid CR and apply them (or run its embedded engine), pruning what
/// is no longer wanted. An invalid CR (or an unreadable Secret) leaves whatever runs as it was,
/// except that a conflicting one is stopped.
pub async fn apply_step(
    ctx: &Ctx,
    input: &Input<'_>,
    validation: &Validation,
    provider: Option<Arc<dyn CloudProvider>>,
    secret: &SecretState,
) -> Outcome {
    let cr = input.cr;
    let uid = &input.uid;
    let mut out = Outcome::default();
    if let Validation::Unknown(f) = validation {
        out.transient.push((degraded::SECRET_UNREADABLE, f.message.clone()));
    }
    // A resource that conflicts with an older one, or whose name is a core component's Lease,
    // must not keep running: whatever it runs is stopped.
    let conflicting = matches!(validation, Validation::Invalid { conflicts_with, .. } if !conflicts_with.is_empty())
        || matches!(validation, Validation::Invalid { failures, .. }
            if failures.first().is_some_and(|f| f.reason == reasons::config_valid::RESERVED_NAME));
    match (validation, cr.spec.paused) {
        (_, true) => {}
        (Validation::Valid(v), false) if cr.spec.mode == Mode::Embedded => {
            let data = match secret {
                SecretState::Found { data, .. } => Some(data.as_slice()),
                _ => None,
            };
            if ctx.shared.engines.ensure(cr, v, provider, data).await {
                out.rollout_started = true;
                out.engine_event = Some((
                    EventType::Normal,
                    reasons::events::ENGINE_STARTED,
                    format!("started the embedded engine (Lease {})", input.key),
                ));
            }
            let (p, f, waiting) = prune(ctx, uid, &[]).await;
            out.pruned = p;
            out.transient.extend(f);
            out.teardown_waiting = waiting;
        }
        (Validation::Valid(v), false) => {
            if ctx.shared.engines.stop(uid).await {
                out.engine_event =
                    Some((EventType::Normal, reasons::events::ENGINE_STOPPED, format!("mode is now {}", cr.spec.mode)));
            }
            let desired = build::build(cr, v, &ctx.shared.build);
            // Nothing is applied or pruned while a child's name is taken by an object this
            // resource does not own, or a binding would reach beyond its own manager.
            let lease_namespace = validate::foreign_lease_namespace(cr);
            if let Some(why) = desired.iter().find_map(|d| {
                build::binding_overreach(d, input.namespace, input.name, lease_namespace.as_deref(), &ctx.shared.build)
            }) {
                tracing::error!(cr = %input.key, %why, "refusing to apply a binding beyond the resource's manager");
                out.transient.push((degraded::APPLY_FAILED, format!("refused: {why}")));
                return out;
            }
            match name_conflicts(ctx, &desired, uid).await {
                Ok(conflicts) if conflicts.is_empty() => {}
                Ok(conflicts) => {
                    out.name_conflicts = conflicts;
                    return out;
                }
                Err(e) => {
                    out.transient.push((degraded::APPLY_FAILED, e));
                    return out;
                }
            }
            let mut keep: Vec<ChildKey> = desired.iter().map(ChildKey::of).collect();
            for d in &desired {
                let child = ChildKey::of(d);
                let observed = ctx.children.meta(&child);
                match ctx.applier.apply(d, observed.as_ref()).await {
                    Ok(true) => {
                        ctx.shared.metrics.write("apply", child.kind.as_str());
                        if matches!(d, Desired::Deployment(_) | Desired::DaemonSet(_))
                            && template_hash(observed.as_ref()) != template_hash(Some(d.meta()))
                        {
                            out.rollout_started = true;
                        }
                        out.applied.push(child.to_string());
                    }
                    Ok(false) => {}
                    Err(e) => out.transient.push((degraded::APPLY_FAILED, format!("applying {child}: {e}"))),
                }
            }
            // A Deployment <-> DaemonSet switch: the old workload serves until the new one can.
            let old: Vec<ChildKey> =
                ctx.children.owned_by(uid).into_iter().filter(|k| is_workload(k.kind) && !keep.contains(k)).collect();
            if let Some(old_kind) = old.iter().map(|k| k.kind).find(|k| matches!(k, Kind::Deployment | Kind::DaemonSet))
            {
                let new = observe_workload(ctx, input).await;
                if let Switch::KeepOld(message) =
                    switch::decide(old_kind.as_str(), &new, cr.spec.deployment.host_network)
                {
                    keep.extend(old);
                    out.switching = Some(message);
                }
            }
            let (p, f, waiting) = prune(ctx, uid, &keep).await;
            out.pruned = p;
            out.transient.extend(f);
            out.teardown_waiting = waiting;
        }
        (Validation::Invalid { .. }, false) if conflicting => {
            // Two managers must never run the same controller: stop this one.
            if ctx.shared.engines.stop(uid).await {
                out.engine_event = Some((
                    EventType::Normal,
                    reasons::events::ENGINE_STOPPED,
                    format!("stopped: {}", validation.summary().map(|(r, _)| r).unwrap_or_default()),
                ));
            }
            let (p, f, waiting) = prune(ctx, uid, &[]).await;
            out.pruned = p;
            out.transient.extend(f);
            out.teardown_waiting = waiting;
        }
        // Invalid otherwise, or unreadable Secret: whatever runs keeps running as it was.
        _ => {}
    }
    out
}

/// The desired children whose names are taken by an object the CR with UID `uid` does not
/// own. The stores show only labelled objects, so a name they lack (and the operator did not
/// just create) is read from the server; the object itself is never written.
async fn name_conflicts(ctx: &Ctx, desired: &[Desired], uid: &str) -> Result<Vec<NameConflict>, String> {
    let mut out = Vec::new();
    for d in desired {
        let key = ChildKey::of(d);
        let observed = match ctx.children.meta(&key) {
            Some(meta) => Some(meta),
            None if ctx.applier.remembers(&key) => continue,
            None => ctx.applier.read_meta(&key).await.map_err(|e| format!("reading {key}: {e}"))?,
        };
        if !apply::may_apply_over(observed.as_ref(), uid) {
            out.push(NameConflict { key });
        }
    }
    Ok(out)
}

fn template_hash(meta: Option<&ObjectMeta>) -> Option<String> {
    meta?.annotations.as_ref()?.get(names::ANNOTATION_TEMPLATE_HASH).cloned()
}
