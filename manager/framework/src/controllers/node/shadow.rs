//! The cloud-node controller in shadow mode: look every Node up (a read), compare with
//! [`super::diff::differences`], write nothing.

use std::sync::Arc;

use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;

use super::{batch_size, diff, logic};
use crate::cache::Change;
use crate::controller::Context;
use crate::controllers::shadow::{Comparer, Pass, Trigger, reference};
use crate::shadow::ObjectKey;

/// Which Node a change asks to compare again: added, deleted, or changed beyond status (a
/// heartbeat does not).
fn relevant(change: &Change<Node>) -> Option<String> {
    match change {
        Change::Applied { old: Some(old), new } if logic::is_status_only_change(old, new) => None,
        Change::Applied { new, .. } => Some(new.name_any()),
        Change::Deleted(node) => Some(node.name_any()),
        Change::Resynced => None,
    }
}

/// Compare until shutdown: every Node every `--node-status-update-frequency`, and changed
/// Nodes as they change.
pub(crate) async fn run(ctx: Context, comparer: Comparer) {
    let mut trigger = Trigger::new(ctx.nodes.subscribe(), relevant, ctx.options.node_status_update_frequency);
    if !super::wait_for_nodes(&ctx).await {
        return;
    }
    while let Some(pass) = trigger.next(&ctx.shutdown).await {
        match pass {
            Pass::Full => {
                let nodes = ctx.nodes.state();
                compare(&ctx, &comparer, nodes).await;
                let cache = ctx.nodes.clone();
                comparer.finish_pass(|k| cache.get(None, &k.name).is_some());
            }
            Pass::Objects(names) => {
                let mut nodes = Vec::new();
                for name in names {
                    match ctx.nodes.get(None, &name) {
                        Some(node) => nodes.push(node),
                        None => comparer.record(ObjectKey::node(name), None, Vec::new()),
                    }
                }
                compare(&ctx, &comparer, nodes).await;
                comparer.observe();
            }
        }
    }
}

/// One metadata lookup per Node, batched as the controller batches; a failed lookup keeps
/// the Node's previous comparison.
async fn compare(ctx: &Context, comparer: &Comparer, nodes: Vec<Arc<Node>>) {
    let Some(instances) = ctx.provider.instances() else { return };
    let chunks: Vec<Vec<Arc<Node>>> = nodes.chunks(batch_size(ctx)).map(<[Arc<Node>]>::to_vec).collect();
    stream::iter(chunks)
        .for_each_concurrent(ctx.options.node_status_workers().max(1), |chunk| async move {
            let refs: Vec<&Node> = chunk.iter().map(|n| n.as_ref()).collect();
            let results = instances.instances_metadata(&refs).await;
            for (node, result) in chunk.iter().zip(results) {
                let key = ObjectKey::node(node.name_any());
                match result {
                    Ok(Some(meta)) => {
                        comparer.record(key, Some(reference(node.as_ref())), diff::differences(node, &meta))
                    }
                    // The controller would wait (tainted) or leave the Node alone.
                    Ok(None) => comparer.record(key, None, Vec::new()),
                    Err(error) => tracing::debug!(node = %key.name, %error, "shadow: lookup failed; next pass"),
                }
            }
        })
        .await;
}
