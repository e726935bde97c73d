//! Events on the CloudControllerManagers: `ConfigValid` transitions, applies, prunes, new
//! transient failures, and what happened to an embedded engine.

use crds::CloudControllerManager;
use crds::conditions::{self, types};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::runtime::events::EventType;

use super::context::{Ctx, Input, Outcome};
use crate::names;
use crate::status::{self, EngineState, Workload};
use crds::reasons::{self, degraded};

/// Publish one event on the CR of `meta`.
pub fn publish(ctx: &Ctx, meta: &ObjectMeta, type_: EventType, reason: &str, note: String, action: &str) {
    let reference = ObjectReference {
        api_version: Some(CloudControllerManager::api_version(&()).into_owned()),
        kind: Some(CloudControllerManager::kind(&()).into_owned()),
        name: meta.name.clone(),
        namespace: meta.namespace.clone(),
        uid: meta.uid.clone(),
        resource_version: None,
        field_path: None,
    };
    ctx.shared.events.publish(names::FIELD_MANAGER, reference, type_, reason, note, action);
}

/// Events: ConfigValid transitions, applies, prunes, new transient failures, engine changes.
pub fn publish_events(
    ctx: &Ctx,
    input: &Input<'_>,
    computed: &status::ComputedStatus,
    outcome: &Outcome,
    new_failures: &[(&'static str, String)],
    workload: &Workload,
) {
    let meta = input.cr.meta();
    let existing = input.cr.status.clone().unwrap_or_default();
    let before =
        conditions::find(&existing.conditions, types::CONFIG_VALID).map(|c| (c.status.clone(), c.reason.clone()));
    let after = conditions::find(&computed.status.conditions, types::CONFIG_VALID)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()));
    if let Some((status_after, reason_after, message)) = after
        && before.as_ref().map(|(s, r)| (s.as_str(), r.as_str()))
            != Some((status_after.as_str(), reason_after.as_str()))
    {
        if status_after == "False" {
            publish(
                ctx,
                meta,
                EventType::Warning,
                reasons::events::CONFIG_INVALID,
                format!("{reason_after}: {message}"),
                "Validate",
            );
        } else if status_after == "True" && before.is_some_and(|(s, _)| s == "False") {
            publish(ctx, meta, EventType::Normal, reasons::events::CONFIG_VALID, message, "Validate");
        }
    }
    if !outcome.applied.is_empty() {
        publish(
            ctx,
            meta,
            EventType::Normal,
            reasons::events::APPLIED,
            format!("applied {}", outcome.applied.join(", ")),
            "Apply",
        );
    }
    if !outcome.pruned.is_empty() {
        publish(
            ctx,
            meta,
            EventType::Normal,
            reasons::events::PRUNED,
            format!("deleted {}", outcome.pruned.join(", ")),
            "Prune",
        );
    }
    for (reason, message) in new_failures {
        let event_reason = if *reason == degraded::APPLY_FAILED { reasons::events::APPLY_FAILED } else { reason };
        publish(ctx, meta, EventType::Warning, event_reason, message.clone(), "Apply");
    }
    if let Some((type_, reason, note)) = outcome.engine_event.clone() {
        publish(ctx, meta, type_, reason, note, "Engine");
    }
    if let Workload::Embedded(EngineState::Failed(m)) = workload {
        let was_failed = conditions::find(&existing.conditions, types::DEGRADED)
            .is_some_and(|c| c.reason == degraded::ENGINE_FAILED);
        if !was_failed {
            publish(ctx, meta, EventType::Warning, reasons::events::ENGINE_FAILED, m.clone(), "Engine");
        }
    }
}
