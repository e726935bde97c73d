//! Status writes: the computed status applied without clobbering the manager's own condition,
//! and the `MalformedSpec` status of a CR that does not deserialize.

use crds::CloudControllerManager;
use crds::conditions::{self, DesiredCondition, Status, types};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta};
use kube::Api;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;

use super::context::{Ctx, now};
use super::events::publish;
use crate::error::Error;
use crate::names;
use crate::status;
use crds::reasons::{self, degraded};

/// A CR that does not deserialize: say so in status, once.
pub async fn malformed(ctx: &Ctx, meta: &ObjectMeta, namespace: &str, name: &str) -> Result<Action, Error> {
    let ar = ApiResource::erase::<CloudControllerManager>(&());
    let raw: Api<DynamicObject> = Api::namespaced_with(ctx.shared.client.clone(), namespace, &ar);
    let Some(current) = raw.get_opt(name).await? else { return Ok(Action::await_change()) };
    let existing: Vec<Condition> = current
        .data
        .pointer("/status/conditions")
        .and_then(|c| serde_json::from_value(c.clone()).ok())
        .unwrap_or_default();
    let message = malformed_message(current.data.get("spec"));
    let desired = [
        DesiredCondition::new(types::CONFIG_VALID, Status::False, reasons::config_valid::MALFORMED_SPEC, &message),
        DesiredCondition::new(
            types::DEGRADED,
            Status::True,
            degraded::CONFIG_INVALID,
            format!("{}: {message}", reasons::config_valid::MALFORMED_SPEC),
        ),
    ];
    let generation = meta.generation;
    let t = now();
    let mut merged = conditions::merge_conditions(&existing, desired, generation, &t);
    let ready = conditions::compute_ready(&merged);
    merged = conditions::merge_conditions(&merged, [ready], generation, &t);
    let observed = current.data.pointer("/status/observedGeneration").and_then(serde_json::Value::as_i64);
    if merged == existing && observed == generation {
        return Ok(Action::await_change());
    }
    // Not server-side apply: a genuine API server cannot build the typed object that apply
    // needs from a spec that does not fit the schema (500 "failed to create typed live
    // object"). A merge patch of the whole list, conditional on the version read, keeps the
    // other writers' conditions and fails (to be retried) if one wrote meanwhile.
    let body = serde_json::json!({
        "metadata": {"resourceVersion": current.metadata.resource_version},
        "status": {"observedGeneration": generation, "conditions": merged},
    });
    let was_malformed = conditions::find(&existing, types::CONFIG_VALID)
        .is_some_and(|c| c.reason == reasons::config_valid::MALFORMED_SPEC);
    let params = PatchParams { field_manager: Some(names::FIELD_MANAGER.into()), ..Default::default() };
    raw.patch_status(name, &params, &Patch::Merge(body)).await?;
    ctx.shared.metrics.write("status", "CloudControllerManager");
    ctx.shared.metrics.error("malformed_spec");
    if !was_malformed {
        publish(ctx, meta, EventType::Warning, reasons::events::CONFIG_INVALID, message.clone(), "Validate");
    }
    tracing::warn!(cr = %format!("{namespace}/{name}"), error = %message, "malformed CloudControllerManager");
    Ok(Action::await_change())
}

/// The `MalformedSpec` message: the JSON path of the offending field and the type expected
/// there, never the value (the deserializer's own error quotes values, so it is not used).
fn malformed_message(spec: Option<&serde_json::Value>) -> String {
    let detail = match spec {
        None => format!("spec: {}", crds::validation::messages::REQUIRED),
        Some(spec) => match crds::validation::parse_spec(spec) {
            Err(e) => e.to_string(),
            // The spec reads; something else in the object does not.
            Ok(_) => "the object's metadata or status is not of the expected types".to_string(),
        },
    };
    format!("the object does not match the CloudControllerManager schema: {detail}")
}

/// Apply the status without force, so a value the manager wrote meanwhile (its
/// `ProviderHealthy`) is never overwritten: on a conflict, recompute from a fresh read (which
/// then leaves the manager's condition out) and apply again, forcing only fields the fresh read
/// shows as the operator's.
pub async fn write_status(
    ctx: &Ctx,
    namespace: &str,
    name: &str,
    computed: &status::ComputedStatus,
    recompute: impl Fn(&CloudControllerManager) -> status::ComputedStatus,
) -> Result<(), Error> {
    let api = ctx.api(namespace);
    let params = PatchParams::apply(names::FIELD_MANAGER);
    match api.patch_status(name, &params, &Patch::Apply(computed.apply_body())).await {
        Ok(_) => {
            ctx.shared.metrics.write("status", "CloudControllerManager");
            return Ok(());
        }
        Err(kube::Error::Api(s)) if s.is_conflict() => {
            tracing::debug!(cr = %format!("{namespace}/{name}"), "status conflict; recomputing from a fresh read");
        }
        Err(e) => return Err(e.into()),
    }
    let typed: Api<CloudControllerManager> = Api::namespaced(ctx.shared.client.clone(), namespace);
    let fresh = typed.get(name).await?;
    let again = recompute(&fresh);
    if again.changed {
        typed.patch_status(name, &params.force(), &Patch::Apply(again.apply_body())).await?;
        ctx.shared.metrics.write("status", "CloudControllerManager");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_message_names_the_path_and_type_but_not_the_value() {
        let spec = serde_json::json!({"provider": "fake", "deployment": {"replicas": "SECRET-TOKEN"}});
        let m = malformed_message(Some(&spec));
        assert_eq!(
            m,
            "the object does not match the CloudControllerManager schema: spec.deployment.replicas: invalid type: string, expected i32"
        );
        let m = malformed_message(None);
        assert!(m.ends_with("spec: Required value"), "{m}");
        let spec = serde_json::json!({"provider": "fake", "leaderElection": {"leaseDuration": "forever"}});
        assert!(malformed_message(Some(&spec)).ends_with(
            "spec.leaderElection.leaseDuration: invalid duration; expected a Go duration such as 15s or 1m30s"
        ));
    }
}
