//! The service controller in shadow mode: ask the cloud for each Service's load balancer (a
//! read), compare with [`super::diff::differences`], write nothing.

use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::Service;

use super::{diff, logic};
use crate::cache::Change;
use crate::controller::Context;
use crate::controllers::shadow::{Comparer, Pass, Trigger, reference};
use crate::shadow::ObjectKey;

/// Full comparison interval when `--load-balancer-resync-period` is not set.
pub const DEFAULT_PERIOD: Duration = Duration::from_secs(300);

fn relevant(change: &Change<Service>) -> Option<String> {
    match change {
        Change::Applied { new, .. } => Some(logic::service_key(new)),
        Change::Deleted(svc) => Some(logic::service_key(svc)),
        Change::Resynced => None,
    }
}

fn key_of(svc: &Service) -> ObjectKey {
    ObjectKey::service(
        svc.metadata.namespace.clone().unwrap_or_default(),
        svc.metadata.name.clone().unwrap_or_default(),
    )
}

/// Compare until shutdown: every Service each period, and changed Services as they change.
pub(crate) async fn run(ctx: Context, comparer: Comparer) {
    let period = ctx.options.load_balancer_resync_period.unwrap_or(DEFAULT_PERIOD);
    let mut trigger = Trigger::new(ctx.services.subscribe(), relevant, period);
    let ready = async { super::caches_ready(&ctx.services).await && super::caches_ready(&ctx.nodes).await };
    tokio::select! {
        _ = ctx.shutdown.cancelled() => return,
        ok = ready => if !ok { return },
    }
    while let Some(pass) = trigger.next(&ctx.shutdown).await {
        match pass {
            Pass::Full => {
                compare(&ctx, &comparer, ctx.services.state()).await;
                let cache = ctx.services.clone();
                comparer.finish_pass(|k| cache.get(Some(&k.namespace), &k.name).is_some());
            }
            Pass::Objects(keys) => {
                let mut services = Vec::new();
                for key in keys {
                    let (ns, name) = key.split_once('/').unwrap_or(("", key.as_str()));
                    match ctx.services.get(Some(ns), name) {
                        Some(svc) => services.push(svc),
                        None => comparer.record(ObjectKey::service(ns, name), None, Vec::new()),
                    }
                }
                compare(&ctx, &comparer, services).await;
                comparer.observe();
            }
        }
    }
}

/// At most one `get_load_balancer` per Service that wants one or must lose one; a failed
/// read keeps the Service's previous comparison.
async fn compare(ctx: &Context, comparer: &Comparer, services: Vec<Arc<Service>>) {
    let Some(lb) = ctx.provider.load_balancer() else { return };
    let class = ctx.options.load_balancer_class.clone().filter(|c| !c.is_empty());
    let finalizer = logic::cleanup_finalizer(class.as_deref());
    let cluster = ctx.options.cluster_name.as_str();
    let also_unclassed = class.is_some() && ctx.options.handle_unclassed_services;
    let (class, finalizer) = (logic::ClassFilter { class: class.as_deref(), also_unclassed }, finalizer.as_str());
    stream::iter(services)
        .for_each_concurrent(ctx.options.concurrent_service_syncs.max(1), |svc| async move {
            let key = key_of(&svc);
            if !diff::needs_lookup(&svc, class, finalizer) {
                comparer.record(key, None, Vec::new());
                return;
            }
            match lb.get_load_balancer(cluster, &svc).await {
                Ok(status) => {
                    let name = lb.load_balancer_name(cluster, &svc);
                    let found = diff::differences(&svc, status.as_ref(), &name, class, finalizer);
                    comparer.record(key, Some(reference(svc.as_ref())), found);
                }
                Err(error) => tracing::debug!(service = %key, %error, "shadow: load balancer lookup failed; next pass"),
            }
        })
        .await;
}
