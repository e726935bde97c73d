//! cloud-node-lifecycle-controller: every `node_monitor_period` (sliding), removes the shutdown
//! taint from Ready Nodes, and asks the cloud about Nodes that are not Ready: Nodes whose
//! instance is gone are deleted (after `node_deletion_grace_period`, zero by default as
//! upstream), Nodes whose instance is shut down get the shutdown taint.
//!
//! Unlike upstream's serial loop, the existence and shutdown checks go to the cloud in batches
//! with a bounded number in flight.
//!
//! A Node with no providerID is checked like any other (the provider looks it up by name), so
//! one whose machine is gone is deleted (§6 item 13; upstream bug k/k#141364: its providers answer "not
//! found" as an error, and the Node stays). With node ownership (`--cloud-provider-platforms`,
//! KEP-5778) only this manager's Nodes are checked: another platform's, and one with neither a
//! providerID nor the platform annotation, are never deleted or tainted.

pub mod logic;
mod shadow;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::{Node, ObjectReference};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, PatchParams, Preconditions};
use kube::runtime::events::EventType;

use crate::controller::{Context, Controller};
use crate::controllers::node::{is_conflict, is_not_found, json_patch, logic as node_logic, wait_for_nodes};
use crate::error::Error;
use crate::health::HealthHandle;
use crate::provider::{CloudError, CloudResult, Instances};

use self::logic::{AbsenceTracker, Action, NodeKey};
use self::shadow::ShadowPass;
use crate::controllers::shadow::Comparer;

/// Canonical controller name (also the event component and the field manager).
pub const NAME: &str = crds::controllers::Controller::CloudNodeLifecycle.name();

/// Cloud batch calls one pass keeps in flight.
pub const BATCHES_IN_FLIGHT: usize = 4;

/// API writes one pass keeps in flight.
const WRITES_IN_FLIGHT: usize = 16;

/// Attempts at a taint patch when its `test` guard fails because the Node moved.
const CONFLICT_ATTEMPTS: usize = 5;

/// The cloud-node-lifecycle controller.
#[derive(Debug, Default)]
pub struct LifecycleController;

impl LifecycleController {
    /// A new controller; settings come from the [`Context`] at run time.
    pub fn new() -> Self {
        Self
    }
}

#[async_trait]
impl Controller for LifecycleController {
    fn name(&self) -> &'static str {
        NAME
    }

    async fn run(self: Box<Self>, ctx: Context, _health: HealthHandle) -> Result<(), Error> {
        if ctx.options.node_monitor_period.is_zero() {
            return Err(Error::InvalidFlag { flag: "--node-monitor-period", message: "must be greater than 0".into() });
        }
        if ctx.provider.instances().is_none() {
            tracing::warn!(
                provider = ctx.provider.name(),
                "cloud provider does not support instances; {NAME} stays idle"
            );
            ctx.shutdown.cancelled().await;
            return Ok(());
        }
        if !wait_for_nodes(&ctx).await {
            return Ok(());
        }
        let mut tracker = AbsenceTracker::new();
        let comparer = crate::controllers::shadow::Comparer::from_context(&ctx, NAME);
        loop {
            tokio::select! {
                _ = ctx.shutdown.cancelled() => return Ok(()),
                _ = monitor_pass(&ctx, &mut tracker, comparer.as_ref()) => {}
            }
            tokio::select! {
                _ = ctx.shutdown.cancelled() => return Ok(()),
                _ = tokio::time::sleep(ctx.options.node_monitor_period) => {}
            }
        }
    }
}

fn key(node: &Node) -> NodeKey {
    (node.name_any(), node.uid().unwrap_or_default())
}

fn patch_params() -> PatchParams {
    PatchParams { field_manager: Some(NAME.to_string()), ..Default::default() }
}

fn reference(node: &Node) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(node.name_any()),
        uid: node.uid(),
        ..Default::default()
    }
}

/// One pass over every cached Node. In shadow mode (`comparer`) every write it would make is
/// recorded as a difference instead.
pub(crate) async fn monitor_pass(ctx: &Context, tracker: &mut AbsenceTracker, comparer: Option<&Comparer>) {
    match comparer {
        None => decide_and_act(ctx, tracker, None).await,
        Some(comparer) => {
            let mut plan = ShadowPass::default();
            decide_and_act(ctx, tracker, Some(&mut plan)).await;
            plan.commit(ctx, comparer);
        }
    }
}

async fn decide_and_act(ctx: &Context, tracker: &mut AbsenceTracker, mut shadow: Option<&mut ShadowPass>) {
    let Some(instances) = ctx.provider.instances() else { return };
    let api: Api<Node> = Api::all(ctx.client.clone());
    let mut untaint = Vec::new();
    let mut check = Vec::new();
    let ownership = &ctx.options.node_ownership;
    for node in ctx.nodes.state().into_iter().filter(|n| ownership.owns(n)) {
        match logic::classify(&node) {
            Action::Nothing => {}
            Action::RemoveShutdownTaint => untaint.push(node),
            Action::CheckInstance => check.push(node),
        }
    }
    // Only Nodes still not Ready keep an absence record; Ready means the instance is alive.
    let not_ready: HashSet<NodeKey> = check.iter().map(|n| key(n)).collect();
    tracker.retain(|k| not_ready.contains(k));

    let api_ref = &api;
    if let Some(plan) = shadow.as_mut() {
        for node in std::mem::take(&mut untaint) {
            plan.add(node, shadow::remove_shutdown_taint());
        }
    }
    stream::iter(untaint)
        .for_each_concurrent(WRITES_IN_FLIGHT, |node| async move {
            if let Err(e) = patch_taints(api_ref, &node, TaintChange::RemoveShutdown).await {
                tracing::warn!(node = %node.name_any(), error = %e, "removing the shutdown taint failed; next pass");
            }
        })
        .await;
    if check.is_empty() {
        return;
    }

    let size = ctx.options.node_batch_size.min(instances.batch_size()).max(1);
    let exists = batched(instances, &check, size, Check::Exists).await;
    let now = Instant::now();
    let grace = ctx.options.node_deletion_grace_period;
    let mut delete = Vec::new();
    let mut existing = Vec::new();
    for (node, result) in check.iter().zip(exists) {
        match result {
            // L3: an error changes nothing (and does not reset a running grace period).
            Err(e) => {
                tracing::warn!(node = %node.name_any(), error = %e, "instance existence check failed");
                if let Some(plan) = shadow.as_mut() {
                    plan.unknown.insert(node.name_any());
                }
            }
            Ok(true) => {
                tracker.present(&key(node));
                existing.push(node.clone());
            }
            Ok(false) => {
                if tracker.absent(key(node), now, grace) {
                    delete.push(node.clone());
                } else {
                    tracing::info!(node = %node.name_any(), ?grace, "instance reported absent; waiting out the deletion grace period");
                }
            }
        }
    }

    if let Some(plan) = shadow.as_mut() {
        for node in std::mem::take(&mut delete) {
            plan.add(node, shadow::delete_node());
        }
    }
    let tracker_deleted: Vec<NodeKey> = stream::iter(delete)
        .map(|node| async move { delete_node(ctx, api_ref, &node).await.then(|| key(&node)) })
        .buffer_unordered(WRITES_IN_FLIGHT)
        .filter_map(|k| async move { k })
        .collect()
        .await;
    for k in &tracker_deleted {
        tracker.present(k);
    }

    if existing.is_empty() {
        return;
    }
    let shutdown = batched(instances, &existing, size, Check::Shutdown).await;
    let mut unknown = Vec::new();
    let mut to_taint: Vec<Arc<Node>> = existing
        .into_iter()
        .zip(shutdown)
        .filter_map(|(node, result)| match result {
            Ok(true) if !logic::has_shutdown_taint(&node) => Some(node),
            Ok(_) => None,
            Err(e) => {
                tracing::warn!(node = %node.name_any(), error = %e, "instance shutdown check failed");
                unknown.push(node.name_any());
                None
            }
        })
        .collect();
    if let Some(plan) = shadow.as_mut() {
        plan.unknown.extend(unknown);
        for node in std::mem::take(&mut to_taint) {
            plan.add(node, shadow::add_shutdown_taint());
        }
    }
    stream::iter(to_taint)
        .for_each_concurrent(WRITES_IN_FLIGHT, |node| async move {
            if let Err(e) = patch_taints(api_ref, &node, TaintChange::AddShutdown).await {
                tracing::warn!(node = %node.name_any(), error = %e, "adding the shutdown taint failed; next pass");
            }
        })
        .await;
}

#[derive(Debug, Clone, Copy)]
enum Check {
    Exists,
    Shutdown,
}

/// Ask the cloud about `nodes` in chunks of `size`, `BATCHES_IN_FLIGHT` chunks at once;
/// results are in input order.
async fn batched(instances: &dyn Instances, nodes: &[Arc<Node>], size: usize, check: Check) -> Vec<CloudResult<bool>> {
    let calls: Vec<_> = nodes
        .chunks(size)
        .map(|chunk| async move {
            let refs: Vec<&Node> = chunk.iter().map(|n| n.as_ref()).collect();
            let results = match check {
                Check::Exists => instances.instances_exist(&refs).await,
                Check::Shutdown => instances.instances_shutdown(&refs).await,
            };
            // A provider returning the wrong count must not shift answers onto other Nodes.
            if results.len() != refs.len() {
                tracing::error!(
                    expected = refs.len(),
                    got = results.len(),
                    ?check,
                    "batch call returned the wrong number of results"
                );
                return refs.iter().map(|_| Err(CloudError::Other("missing batch result".into()))).collect();
            }
            results
        })
        .collect();
    stream::iter(calls).buffered(BATCHES_IN_FLIGHT).flat_map(stream::iter).collect().await
}

/// Delete a Node whose instance is gone (L4); returns whether it is gone now.
async fn delete_node(ctx: &Context, api: &Api<Node>, node: &Node) -> bool {
    let name = node.name_any();
    tracing::info!(node = %name, "deleting node since its instance no longer exists in the cloud");
    ctx.events.publish(
        NAME,
        reference(node),
        EventType::Normal,
        "DeletingNode",
        format!("Deleting node {name} because it does not exist in the cloud provider"),
        "DeleteNode",
    );
    // The UID precondition keeps a re-registered Node of the same name safe.
    let dp = DeleteParams {
        preconditions: Some(Preconditions { uid: node.uid(), resource_version: None }),
        ..Default::default()
    };
    match api.delete(&name, &dp).await {
        Ok(_) => true,
        Err(e) if is_not_found(&e) => true,
        Err(e) => {
            tracing::error!(node = %name, error = %e, "unable to delete node");
            ctx.events.publish(
                NAME,
                reference(node),
                EventType::Warning,
                "DeletingNodeFailed",
                format!("Error deleting node {name}: {e}"),
                "DeleteNode",
            );
            false
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum TaintChange {
    AddShutdown,
    RemoveShutdown,
}

/// Add or remove the shutdown taint with a guarded JSON patch, re-reading on conflict.
async fn patch_taints(api: &Api<Node>, cached: &Node, change: TaintChange) -> Result<(), kube::Error> {
    let name = cached.name_any();
    let mut fresh: Option<Node> = None;
    for _ in 0..CONFLICT_ATTEMPTS {
        let node = fresh.as_ref().unwrap_or(cached);
        let ops = match change {
            TaintChange::AddShutdown if logic::has_shutdown_taint(node) => return Ok(()),
            TaintChange::AddShutdown => node_logic::add_taint_ops(node, &logic::shutdown_taint()),
            TaintChange::RemoveShutdown if !logic::has_shutdown_taint(node) => return Ok(()),
            TaintChange::RemoveShutdown => node_logic::remove_taint_ops(node, logic::is_shutdown_taint),
        };
        let patch = json_patch(serde_json::Value::Array(ops)).map_err(kube::Error::SerdeError)?;
        match api.patch(&name, &patch_params(), &patch).await {
            Ok(_) => {
                tracing::info!(node = %name, ?change, "shutdown taint updated");
                return Ok(());
            }
            Err(e) if is_not_found(&e) => return Ok(()),
            Err(e) if is_conflict(&e) => fresh = Some(api.get(&name).await?),
            Err(e) => return Err(e),
        }
    }
    tracing::warn!(node = %name, "node kept changing under the taint patch; next pass");
    Ok(())
}
