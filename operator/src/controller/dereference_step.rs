//! The dereference step: what a reconcile reads for its resource before validating it. The
//! cloud-config Secret (only in an allowed namespace), `spec.controllers` resolved once
//! for every step after it, and the foreign CCMs the Lease cache shows.

use crds::controllers::ControllerSelection;
use kube::runtime::reflector::ObjectRef;

use super::context::{Ctx, Input};
use crate::dereference;
use crate::validate::{self, Controllers, ForeignHolder, SecretState};

/// What the dereference step found.
#[derive(Debug)]
pub struct Dereferenced {
    /// The cloud-config Secret.
    pub secret: SecretState,
    /// `spec.controllers`, resolved.
    pub controllers: Controllers,
    /// Fresh holders of the Leases upstream CCMs elect on, other than this operator's managers.
    pub foreign: Vec<ForeignHolder>,
}

/// Read the referenced Secret, only in an allowed namespace (Embedded mode gets its
/// cloud-config from here too, so it never reads elsewhere either), and resolve
/// `spec.controllers`.
pub async fn dereference(ctx: &Ctx, input: &Input<'_>, allowed: bool) -> Dereferenced {
    let secret = match &input.cr.spec.cloud_config {
        Some(src) if allowed => {
            let (reader, client, secrets, name) =
                (&ctx.secret_reader, &ctx.shared.client, &ctx.secrets, &src.secret_ref.name);
            let mut config = reader.read(client, secrets, input.namespace, name, &src.secret_ref.key).await;
            // The keys mounted beside it, each read as the cloud-config is; the first missing
            // one is what the resource is told.
            for extra_key in src.extra_keys() {
                let SecretState::Found { extra, .. } = &mut config else { break };
                match reader.read(client, secrets, input.namespace, name, extra_key).await {
                    SecretState::Found { data, .. } => extra.push((extra_key.to_string(), data)),
                    other => {
                        config = other;
                        break;
                    }
                }
            }
            config
        }
        _ => SecretState::NotReferenced,
    };
    Dereferenced {
        secret,
        controllers: ControllerSelection::parse(&input.cr.spec.controllers),
        foreign: foreign_holders(ctx, input),
    }
}

/// The foreign CCMs the Lease cache shows (kube-system's, when the operator serves it).
fn foreign_holders(ctx: &Ctx, input: &Input<'_>) -> Vec<ForeignHolder> {
    let observed: Vec<_> = validate::FOREIGN_LEASES
        .iter()
        .filter_map(|name| {
            let lease = ctx.leases.get(&ObjectRef::new(name).within(validate::FOREIGN_LEASE_NAMESPACE))?;
            let seen = dereference::observe_lease(&lease, &input.now);
            Some((
                validate::FOREIGN_LEASE_NAMESPACE.to_string(),
                name.to_string(),
                seen.holder.filter(|_| seen.fresh),
                dereference::lease_expiry(&lease, &input.now),
            ))
        })
        .collect();
    // Migration Leases some resource of this operator elects on are its own.
    let ours: Vec<(String, String)> = ctx
        .crs
        .state()
        .iter()
        .filter_map(|o| o.0.as_ref().ok())
        .filter_map(|cr| validate::migration_lease_namespace(cr).zip(validate::migration_lease_name(&cr.spec)))
        .collect();
    validate::foreign_holders(&observed, &ours)
}
