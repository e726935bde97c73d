//! The reconcile pipeline of one CloudControllerManager: dereference → validate → build and
//! apply → observe → status → events → when to look again. A deleted CR is torn down, a
//! malformed one gets its status; the steps live in their own files.

use std::sync::Arc;
use std::time::Duration;

use crds::CloudControllerManager;
use crds::controllers::ControllerSelection;
use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};

use super::apply_step::apply_step;
use super::context::{Ctx, Guarded, Input, now};
use super::dereference_step;
use super::events::publish_events;
use super::observe::{awaiting_observation, observe};
use super::status_write::{malformed, write_status};
use super::teardown::{TEARDOWN_RECHECK, add_finalizer, cleanup, has_finalizer, remove_finalizer};
use super::validate_step::validate_step;
use crate::announcing::AnnouncerLease;
use crate::apply::NameConflict;
use crate::dereference;
use crate::error::Error;
use crate::names;
use crate::status::{self, StatusInput, TransientFailures, Workload};
use crate::validate::{self, Checked};

pub fn error_policy(obj: Arc<Guarded>, error: &Error, ctx: Arc<Ctx>) -> Action {
    let key = format!("{}/{}", obj.namespace().unwrap_or_default(), obj.name_any());
    let uid = obj.uid().unwrap_or_default();
    let attempt = ctx.memory.failed_reconcile(&uid);
    let delay = backoff(attempt);
    tracing::warn!(cr = %key, %error, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

/// Exponential backoff: 1s, 2s, 4s, ... capped at 2 minutes.
pub fn backoff(attempt: u32) -> Duration {
    let secs = 1u64 << attempt.saturating_sub(1).min(7);
    Duration::from_secs(secs.min(120))
}

pub async fn reconcile(obj: Arc<Guarded>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let started = std::time::Instant::now();
    let result = reconcile_inner(&obj, &ctx).await;
    ctx.shared.metrics.reconciled(started.elapsed());
    match &result {
        Ok(_) => ctx.memory.reconciled(&obj.uid().unwrap_or_default()),
        Err(e) => ctx.shared.metrics.error(e.metric_label()),
    }
    result
}

async fn reconcile_inner(obj: &Guarded, ctx: &Ctx) -> Result<Action, Error> {
    ctx.wait_ready().await;
    let meta = obj.meta();
    let namespace = meta.namespace.clone().ok_or(Error::MissingField("metadata.namespace"))?;
    let name = meta.name.clone().ok_or(Error::MissingField("metadata.name"))?;
    if !ctx.shared.scope.contains(&namespace) {
        return Ok(Action::await_change());
    }
    if meta.deletion_timestamp.is_some() {
        if has_finalizer(meta) {
            // Only where the operator serves (and may delete): a field pointing elsewhere was
            // refused, and granted nothing there.
            let lease_namespace = obj
                .0
                .as_ref()
                .ok()
                .and_then(validate::foreign_lease_namespace)
                .filter(|ns| ctx.shared.scope.contains(ns) && ctx.shared.allowed.contains(ns));
            if !cleanup(ctx, meta, &namespace, &name, lease_namespace.as_deref()).await? {
                // The manager's Pods are still stopping; they keep their RBAC to release the Lease.
                return Ok(Action::requeue(TEARDOWN_RECHECK));
            }
            remove_finalizer(ctx, &namespace, &name, meta).await?;
        }
        return Ok(Action::await_change());
    }
    match &obj.0 {
        Err(_) => malformed(ctx, meta, &namespace, &name).await,
        Ok(_) if !has_finalizer(meta) => {
            // The finalizer write triggers the next reconcile, which does the work.
            add_finalizer(ctx, &namespace, &name, meta).await?;
            Ok(Action::await_change())
        }
        Ok(cr) => reconcile_cr(ctx, cr, &namespace, &name).await,
    }
}

/// One reconcile of a valid-looking CR, as a pipeline over values: dereference → validate →
/// build and apply → observe → status → events → when to look again.
async fn reconcile_cr(ctx: &Ctx, cr: &CloudControllerManager, namespace: &str, name: &str) -> Result<Action, Error> {
    let input = Input {
        cr,
        namespace,
        name,
        key: format!("{namespace}/{name}"),
        uid: cr.uid().ok_or(Error::MissingField("metadata.uid"))?,
        now: now(),
    };
    let allowed = ctx.shared.allowed.contains(namespace);
    let found = dereference_step::dereference(ctx, &input, allowed).await;
    let Checked { mut validation, provider } = validate_step(ctx, &input, &found, allowed).await;
    let outcome = apply_step(ctx, &input, &validation, provider, &found.secret).await;
    if !outcome.name_conflicts.is_empty() {
        validation = validate::name_conflicts(outcome.name_conflicts.iter().map(NameConflict::message));
    }
    let (workload, pods, lease) = observe(ctx, &input).await;
    let migration_lease = validate::migration_lease_namespace(cr)
        .zip(validate::migration_lease_name(&cr.spec))
        .and_then(|(ns, lease_name)| ctx.leases.get(&ObjectRef::new(&lease_name).within(&ns)));
    let rollout_started = ctx.memory.rollout(&input.uid, outcome.rollout_started, awaiting_observation(&workload));
    let lease_obs = lease.as_deref().map(|l| dereference::observe_lease(l, &input.now));
    let announcers = cr.spec.announcer.as_ref().and_then(|_| {
        let key = ObjectRef::new(&names::announcer_name(name)).within(namespace);
        ctx.children.daemon_sets.get(&key).map(|d| dereference::observe_daemon_set(&d))
    });
    let node_managers = crate::profiles::node_manager_of(cr).and_then(|_| {
        let key = ObjectRef::new(&names::node_manager_name(name)).within(namespace);
        ctx.children.daemon_sets.get(&key).map(|d| dereference::observe_daemon_set(&d))
    });
    let migration_obs = migration_lease.as_deref().map(|l| dereference::observe_lease(l, &input.now));
    // The announcers' own Leases, beside their DaemonSet in this namespace, and when the first
    // live one runs out (an announcer that stops renewing changes nothing in its Lease).
    let mut announcer_leases: Vec<AnnouncerLease> = Vec::new();
    let mut announcer_expiry: Option<Duration> = None;
    if cr.spec.announcer.is_some() {
        for lease in ctx.leases.state().iter().filter(|l| l.metadata.namespace.as_deref() == Some(namespace)) {
            let fresh = dereference::observe_lease(lease, &input.now).fresh;
            let Some(announcer) = AnnouncerLease::of(lease, fresh) else { continue };
            if fresh && let Some(expiry) = dereference::lease_expiry(lease, &input.now) {
                announcer_expiry = Some(announcer_expiry.map_or(expiry, |e| e.min(expiry)));
            }
            announcer_leases.push(announcer);
        }
    }

    // Status.
    for (reason, _) in &outcome.transient {
        ctx.shared.metrics.error(reason);
    }
    let (failures, new_failures) = ctx.memory.track_failures(&input.uid, outcome.transient.clone(), &input.now);
    let compute = |cr: &CloudControllerManager| {
        // A fresh read after a write conflict may carry other controllers.
        let reresolved;
        let controllers = if cr.spec.controllers == input.cr.spec.controllers {
            found.controllers.as_ref().ok()
        } else {
            reresolved = ControllerSelection::parse(&cr.spec.controllers).ok();
            reresolved.as_ref()
        };
        status::compute(&StatusInput {
            cr,
            controllers,
            validation: &validation,
            workload: &workload,
            lease: lease_obs.as_ref(),
            migration_lease: migration_obs.as_ref(),
            pods: &pods,
            announcers: announcers.as_ref(),
            node_managers: node_managers.as_ref(),
            announcer_leases: &announcer_leases,
            rollout_started,
            switching: outcome.switching.as_deref(),
            transient: &failures,
            degraded_window: ctx.shared.timings.degraded_window,
            now: input.now.clone(),
        })
    };
    let computed = compute(cr);
    if computed.changed {
        write_status(ctx, namespace, name, &computed, compute).await?;
    }

    publish_events(ctx, &input, &computed, &outcome, &new_failures, &workload);
    if computed.changed || !outcome.applied.is_empty() || !outcome.pruned.is_empty() {
        tracing::info!(cr = %input.key, applied = outcome.applied.len(), pruned = outcome.pruned.len(), status_written = computed.changed, "reconciled");
    }
    let mut next = next_look(ctx, &input, &failures, lease.as_deref(), lease_obs.as_ref(), &workload);
    // A foreign holder that stops renewing changes no holder: look again when its Lease expires.
    if let Some(expiry) = found.foreign.iter().filter_map(|h| h.expires_in).min() {
        next = next.min(expiry.max(ctx.shared.timings.lease_recheck));
    }
    if outcome.teardown_waiting {
        next = next.min(TEARDOWN_RECHECK);
    }
    if let Some(expiry) = announcer_expiry {
        next = next.min(expiry.max(ctx.shared.timings.lease_recheck));
    }
    Ok(Action::requeue(next))
}

/// When to look at the CR again: the resync period, sooner while transient failures last,
/// when a fresh Lease would expire, or while an embedded engine is starting.
fn next_look(
    ctx: &Ctx,
    input: &Input<'_>,
    failures: &TransientFailures,
    lease: Option<&Lease>,
    lease_obs: Option<&status::LeaseObservation>,
    workload: &Workload,
) -> Duration {
    let timings = &ctx.shared.timings;
    let t = &input.now;
    let mut next = timings.requeue;
    let attempt = ctx.memory.transient_retry(&input.uid, !failures.causes.is_empty());
    if !failures.causes.is_empty() {
        next = next.min(backoff(attempt));
        if let Some(d) = status::requeue_for_degraded(failures, timings.degraded_window, t) {
            next = next.min(d);
        }
    }
    if let Some(l) = lease
        && lease_obs.is_some_and(|o| o.fresh)
        && let Some(expiry) = dereference::lease_expiry(l, t)
    {
        next = next.min(expiry.max(timings.lease_recheck));
    }
    // Level-triggered: an engine that is not running yet is looked at again soon, whether or
    // not its state-change notification arrives.
    if let Workload::Embedded(state) = workload
        && let Some(d) = crate::embedded::recheck_after(state)
    {
        next = next.min(d);
    }
    next
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_caps() {
        assert_eq!(backoff(1), Duration::from_secs(1));
        assert_eq!(backoff(2), Duration::from_secs(2));
        assert_eq!(backoff(5), Duration::from_secs(16));
        assert_eq!(backoff(50), Duration::from_secs(120));
    }
}
