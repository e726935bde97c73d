//! The dereference step: what a reconcile reads for its resource before validating it. The
//! cloud-config Secret (only in an allowed namespace), and `spec.controllers` resolved once
//! for every step after it.

use crds::controllers::ControllerSelection;

use super::context::{Ctx, Input};
use crate::validate::{Controllers, SecretState};

/// What the dereference step found.
#[derive(Debug)]
pub struct Dereferenced {
    /// The cloud-config Secret.
    pub secret: SecretState,
    /// `spec.controllers`, resolved.
    pub controllers: Controllers,
}

/// Read the referenced Secret, only in an allowed namespace (Embedded mode gets its
/// cloud-config from here too, so it never reads elsewhere either), and resolve
/// `spec.controllers`.
pub async fn dereference(ctx: &Ctx, input: &Input<'_>, allowed: bool) -> Dereferenced {
    let secret = match &input.cr.spec.cloud_config {
        Some(src) if allowed => {
            ctx.secret_reader
                .read(&ctx.shared.client, &ctx.secrets, input.namespace, &src.secret_ref.name, &src.secret_ref.key)
                .await
        }
        _ => SecretState::NotReferenced,
    };
    Dereferenced { secret, controllers: ControllerSelection::parse(&input.cr.spec.controllers) }
}
