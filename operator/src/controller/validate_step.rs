//! The validate step: the `ConfigValid` verdict of one reconcile, and the conflicts it settles.
//! CRs that lost a conflict to this one are told to look again when that changes.
//!
//! The provider parses the cloud-config on a blocking thread within
//! [`validate::PARSE_TIME_LIMIT`], so one resource's hostile document never delays another's
//! reconcile; a document that ran past it is refused again without being parsed again.

use std::collections::BTreeSet;

use super::context::{Ctx, Input};
use super::dereference_step::Dereferenced;
use crate::validate::{self, Checked, Peer, SecretState, Subject, Validation};

/// The verdict, with the provider validation built when it is valid.
pub async fn validate_step(ctx: &Ctx, input: &Input<'_>, found: &Dereferenced, allowed: bool) -> Checked {
    if !allowed {
        update_losers(ctx, &input.key, None, &[]);
        return Checked::without_provider(validate::namespace_not_allowed(input.namespace, &ctx.shared.allowed));
    }
    // The operator's Roles exist, and its watches run, only where it is both allowed and serving.
    let workload_namespaces = validate::AllowedNamespaces::new(&ctx.shared.scope.within(ctx.shared.allowed.as_slice()));
    if let Some(refused) = validate::lease_namespace_not_allowed(input.cr, &workload_namespaces) {
        update_losers(ctx, &input.key, None, &[]);
        return Checked::without_provider(refused);
    }
    // CRs in namespaces the operator may not serve never run, so they block no one.
    let mut peers = ctx.peers.peers(&ctx.crs, &ctx.shared.registry);
    peers.retain(|p| ctx.shared.allowed.contains(&p.namespace));
    let content = match &found.secret {
        SecretState::Found { key, data, .. } => Some(crate::hash::cloud_config(&input.uid, key, data)),
        _ => None,
    };
    let limit = validate::PARSE_TIME_LIMIT;
    let known_slow = content.is_some() && ctx.memory.timed_out(&input.uid) == content;
    let checked = if known_slow {
        Checked::without_provider(validate::parse_timed_out(&input.cr.spec.provider, limit))
    } else {
        let subject = Subject {
            cr: input.cr.clone(),
            controllers: found.controllers.clone(),
            secret: found.secret.clone(),
            peers: peers.clone(),
        };
        match validate::validate_bounded(subject, ctx.shared.registry.clone(), ctx.shared.environment, limit).await {
            Some(checked) => {
                ctx.memory.set_timed_out(&input.uid, None);
                checked
            }
            None => {
                tracing::warn!(cr = %input.key, limit = ?limit, "checking the cloud-config ran past the time limit; refused");
                if content.is_some() {
                    ctx.memory.set_timed_out(&input.uid, content);
                }
                Checked::without_provider(validate::parse_timed_out(&input.cr.spec.provider, limit))
            }
        }
    };
    let validation =
        validate::check_policy(input.cr, checked.validation, &ctx.shared.build.policy, &ctx.shared.build.manager_image);
    let validation = validate::check_foreign(input.cr, validation, &found.foreign);
    // This CR as the others see it: the dereference step worked it out with theirs.
    let me = peers.iter().find(|p| p.uid == input.uid);
    update_losers(ctx, &input.key, me, &peers);
    // The winners learn of this loser now: a winner last reconciled before this CR existed
    // would otherwise not wake it when it goes.
    if let Validation::Invalid { conflicts_with, .. } = &validation {
        ctx.memory.add_loser(conflicts_with, &input.key);
    }
    let provider = checked.provider.filter(|_| validation.is_valid());
    Checked { validation, provider }
}

/// Remember which newer CRs conflict with `key`, and reconcile those whose verdict may
/// have changed (so a loser deploys once the winner goes, and vice versa).
fn update_losers(ctx: &Ctx, key: &str, me: Option<&Peer>, peers: &[Peer]) {
    let now_losers: BTreeSet<String> = match me {
        Some(me) => peers
            .iter()
            .filter(|p| validate::conflicts_of(p, std::slice::from_ref(me)).iter().any(|(k, _)| k == key))
            .map(Peer::key)
            .collect(),
        None => BTreeSet::new(),
    };
    ctx.wake(ctx.memory.set_losers(key, now_losers));
}
