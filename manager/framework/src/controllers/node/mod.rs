//! cloud-node-controller: initializes new Nodes from cloud metadata (providerID, labels,
//! addresses) and removes the `node.cloudprovider.kubernetes.io/uninitialized` taint, keeps GA
//! labels in step with their beta copies, and refreshes addresses periodically.
//!
//! Unlike upstream, Nodes are looked up in batches: while a lookup is under way, uninitialized
//! Nodes seen within `node_batch_window` (up to the batch size) share the next
//! `instances_metadata` call; an idle controller looks a new Node up at once. The
//! address refresh goes in batches too. Writes are targeted patches that cannot clobber kubelet:
//! one JSON patch for labels, providerID and the taint (guarded by `test` operations on the
//! taint being removed) and one merge patch of `status.addresses` on the status subresource.

pub mod diff;
pub mod logic;
pub mod queue;
mod shadow;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt, stream};
use k8s_openapi::api::core::v1::{Node, NodeAddress};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use tokio::task::JoinSet;

use crate::cache::Change;
use crate::controller::{Context, Controller};
use crate::error::Error;
use crate::health::HealthHandle;
use crate::options::ControllerOptions;
use crate::ownership::{NodeOwnership, Owner};
use crate::provider::{CloudResult, InstanceMetadata};

use self::logic::{AddressDecision, InitError};
use self::queue::BatchQueue;

/// Canonical controller name (also the event component and the field manager).
pub const NAME: &str = crds::controllers::Controller::CloudNode.name();

/// API writes one batch keeps in flight. The client-side rate limit still applies; this only
/// stops one batch of hundreds from opening hundreds of requests at once.
pub const WRITES_IN_FLIGHT_PER_BATCH: usize = 32;

/// Attempts at the metadata patch when its `test` guard fails because the Node moved.
const CONFLICT_ATTEMPTS: usize = 5;

/// Reject settings the controllers cannot work with (§6 item 7: upstream accepts
/// `--concurrent-node-syncs=0` and then never initializes a Node).
pub fn validate_options(options: &ControllerOptions) -> Result<(), Error> {
    if options.concurrent_node_syncs < 1 {
        return Err(Error::InvalidFlag {
            flag: "--concurrent-node-syncs",
            message: format!("must be at least 1, got {}", options.concurrent_node_syncs),
        });
    }
    if options.node_batch_size < 1 {
        return Err(Error::InvalidFlag {
            flag: "--node-batch-size",
            message: format!("must be at least 1, got {}", options.node_batch_size),
        });
    }
    Ok(())
}

/// The two upstream node-controller histograms.
#[derive(Clone)]
pub struct NodeMetrics {
    /// `node_controller_cloud_provider_taint_removal_delay_seconds`: Node creation to untaint.
    pub taint_removal_delay: Histogram,
    /// `node_controller_initial_node_sync_delay_seconds`: Node creation to fully synced.
    pub initial_sync_delay: Histogram,
}

impl NodeMetrics {
    /// The histograms (upstream buckets 1, 4, 16, 64, 256, 1024 s), registered once per
    /// registry however often the controller is started.
    pub fn register(metrics: &crate::metrics::Metrics) -> Self {
        let buckets = || Histogram::new(exponential_buckets(1.0, 4.0, 6));
        Self {
            taint_removal_delay: metrics.get_or_register(
                "node_controller_cloud_provider_taint_removal_delay_seconds",
                "Seconds from Node creation until the cloud-node controller removed the uninitialized taint",
                buckets,
            ),
            initial_sync_delay: metrics.get_or_register(
                "node_controller_initial_node_sync_delay_seconds",
                "Seconds from Node creation until the cloud-node controller finished its first sync",
                buckets,
            ),
        }
    }
}

/// The cloud-node controller.
#[derive(Debug, Default)]
pub struct NodeController;

impl NodeController {
    /// A new controller; settings come from the [`Context`] at run time.
    pub fn new() -> Self {
        Self
    }
}

/// What became of one Node in a batch.
#[derive(Debug)]
enum Outcome {
    /// Nothing more to do until the Node changes.
    Done,
    /// The Node is gone.
    Gone,
    /// Try again after a backoff (or the delay the cloud asked for).
    Retry { reason: String, after: Option<Duration> },
}

impl Outcome {
    fn retry(reason: impl Into<String>) -> Self {
        Outcome::Retry { reason: reason.into(), after: None }
    }
}

#[async_trait]
impl Controller for NodeController {
    fn name(&self) -> &'static str {
        NAME
    }

    async fn run(self: Box<Self>, ctx: Context, _health: HealthHandle) -> Result<(), Error> {
        validate_options(&ctx.options)?;
        if ctx.provider.instances().is_none() {
            tracing::warn!(
                provider = ctx.provider.name(),
                "cloud provider does not support instances; {NAME} stays idle"
            );
            ctx.shutdown.cancelled().await;
            return Ok(());
        }
        if let Some(comparer) = crate::controllers::shadow::Comparer::from_context(&ctx, NAME) {
            shadow::run(ctx, comparer).await;
            return Ok(());
        }
        let metrics = NodeMetrics::register(&ctx.metrics);
        let mut changes = ctx.nodes.subscribe();
        if !wait_for_nodes(&ctx).await {
            return Ok(());
        }
        let refresh = tokio::spawn(refresh_loop(ctx.clone()));
        let result = init_loop(&ctx, &metrics, &mut changes).await;
        refresh.abort();
        result
    }
}

/// Wait for the Node cache's first full list; false on shutdown. kube's store wakes only the
/// most recent of several concurrent waiters, so re-poll on a short tick rather than hang when
/// other controllers wait at the same time.
pub(crate) async fn wait_for_nodes(ctx: &Context) -> bool {
    loop {
        tokio::select! {
            _ = ctx.shutdown.cancelled() => return false,
            ready = ctx.nodes.wait_until_ready() => return ready,
            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
    }
}

/// Most Nodes per cloud lookup.
fn batch_size(ctx: &Context) -> usize {
    let provider_max = ctx.provider.instances().map(|i| i.batch_size()).unwrap_or(1);
    ctx.options.node_batch_size.min(provider_max).max(1)
}

/// Decide whether a Node needs the queue, given its previous cached state. Another platform's
/// Node (KEP-5778) never does.
fn consider(queue: &mut BatchQueue, ownership: &NodeOwnership, old: Option<&Node>, new: &Node, now: Instant) {
    let name = new.name_any();
    if ownership.owner(new) == Owner::Foreign {
        queue.remove(&name);
        return;
    }
    if logic::is_uninitialized(new) {
        match old {
            None => queue.add(&name, now),
            // A heartbeat does not warrant another cloud lookup: the Node is already queued,
            // in flight or backing off (nothing is ever dropped).
            Some(old) if logic::is_status_only_change(old, new) => {}
            // The Node itself changed (a new annotation, providerID, ...): the reason an
            // earlier attempt failed may be gone, so do not wait out the backoff.
            Some(_) => queue.add_now(&name, now),
        }
    } else if !logic::reconcile_labels(new).is_empty() {
        queue.add(&name, now);
    }
}

async fn init_loop(
    ctx: &Context,
    metrics: &NodeMetrics,
    changes: &mut crate::cache::Subscription<Node>,
) -> Result<(), Error> {
    let window = ctx.options.node_batch_window;
    let workers = ctx.options.concurrent_node_syncs.max(1);
    let max = batch_size(ctx);
    let mut queue = BatchQueue::new();
    let now = Instant::now();
    let ownership = &ctx.options.node_ownership;
    for node in ctx.nodes.state() {
        consider(&mut queue, ownership, None, &node, now);
    }
    let mut batches: JoinSet<Vec<(String, Outcome)>> = JoinSet::new();
    let mut in_batch: HashMap<tokio::task::Id, Vec<String>> = HashMap::new();
    tracing::info!(workers, batch_size = max, ?window, "{NAME} started");
    loop {
        let now = Instant::now();
        queue.promote_due(now);
        while batches.len() < workers {
            let Some(names) = queue.take_batch(max, logic::batch_wait(window, batches.len()), now) else { break };
            let handle = batches.spawn(process_batch(ctx.clone(), metrics.clone(), names.clone()));
            in_batch.insert(handle.id(), names);
        }
        // With every worker busy, a closed window is not actionable: only a backoff ending is.
        let deadline = if batches.len() < workers {
            queue.next_deadline(logic::batch_wait(window, batches.len()))
        } else {
            queue.next_backoff()
        };
        tokio::select! {
            _ = ctx.shutdown.cancelled() => break,
            change = changes.recv() => match change {
                None => break,
                Some(Change::Applied { old, new }) => {
                    if old.as_ref().is_some_and(|o| o.uid() != new.uid()) {
                        queue.remove(&new.name_any());
                    }
                    consider(&mut queue, ownership, old.as_deref(), &new, Instant::now());
                }
                Some(Change::Deleted(node)) => queue.remove(&node.name_any()),
                Some(Change::Resynced) => {
                    let now = Instant::now();
                    for node in ctx.nodes.state() {
                        consider(&mut queue, ownership, None, &node, now);
                    }
                }
            },
            Some(joined) = batches.join_next_with_id(), if !batches.is_empty() => {
                let now = Instant::now();
                let (id, outcomes) = match joined {
                    Ok((id, outcomes)) => (id, outcomes),
                    Err(e) => {
                        // A panicked batch must not strand its Nodes in flight.
                        tracing::error!(error = %e, "node batch failed");
                        let names = in_batch.get(&e.id()).cloned().unwrap_or_default();
                        (e.id(), names.into_iter().map(|n| (n, Outcome::retry("batch failed"))).collect())
                    }
                };
                in_batch.remove(&id);
                for (name, outcome) in outcomes {
                    let dirty = queue.done(&name);
                    match outcome {
                        Outcome::Done => {
                            queue.forget(&name);
                            if dirty && let Some(node) = ctx.nodes.get(None, &name) {
                                consider(&mut queue, ownership, None, &node, now);
                            }
                        }
                        Outcome::Gone => queue.remove(&name),
                        Outcome::Retry { reason, after } => {
                            let delay = queue.retry(&name, now, after);
                            tracing::warn!(node = %name, %reason, failures = queue.failures(&name), retry_in = ?delay, "node sync failed; requeued");
                        }
                    }
                }
            }
            _ = sleep_until(deadline), if deadline.is_some() => {}
        }
    }
    batches.abort_all();
    Ok(())
}

async fn sleep_until(deadline: Option<Instant>) {
    if let Some(at) = deadline {
        tokio::time::sleep_until(at.into()).await;
    }
}

fn patch_params() -> PatchParams {
    PatchParams { field_manager: Some(NAME.to_string()), ..Default::default() }
}

/// Whether the API server rejected a patch because the object moved under it (a failed `test`
/// operation is reported as 409 or 422 depending on the server).
pub(crate) fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409 || s.code == 422)
}

/// Whether the object is gone.
pub(crate) fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

/// Build a JSON patch from operations. `kube` takes `json_patch::Patch`, which deserializes
/// from the RFC 6902 array; going through serde keeps that crate out of our dependencies.
pub(crate) fn json_patch(ops: serde_json::Value) -> Result<Patch<()>, serde_json::Error> {
    Ok(Patch::Json(serde_json::from_value(ops)?))
}

async fn process_batch(ctx: Context, metrics: NodeMetrics, names: Vec<String>) -> Vec<(String, Outcome)> {
    let mut outcomes = Vec::with_capacity(names.len());
    let mut tainted = Vec::new();
    let mut labels_only = Vec::new();
    for name in names {
        match ctx.nodes.get(None, &name) {
            None => outcomes.push((name, Outcome::Gone)),
            Some(node) if logic::is_uninitialized(&node) => tainted.push(node),
            Some(node) => labels_only.push(node),
        }
    }
    let mut results: Vec<CloudResult<Option<InstanceMetadata>>> = Vec::new();
    if !tainted.is_empty() {
        if let Some(instances) = ctx.provider.instances() {
            let refs: Vec<&Node> = tainted.iter().map(|n| n.as_ref()).collect();
            results = instances.instances_metadata(&refs).await;
        }
        if results.len() != tainted.len() {
            tracing::error!(asked = tainted.len(), got = results.len(), "instances_metadata returned the wrong count");
        }
    }
    let api: Api<Node> = Api::all(ctx.client.clone());
    let (ctx, api, metrics) = (&ctx, &api, &metrics);
    let mut results = results.into_iter();
    let mut work: Vec<BoxFuture<'_, (String, Outcome)>> = Vec::new();
    for node in tainted {
        let result = results.next();
        work.push(
            async move {
                let name = node.name_any();
                let outcome = match result {
                    Some(r) => initialize(ctx, api, metrics, &node, r).await,
                    None => Outcome::retry("the cloud returned no result for this Node"),
                };
                (name, outcome)
            }
            .boxed(),
        );
    }
    for node in labels_only {
        work.push(async move { (node.name_any(), reconcile_labels(api, &node).await) }.boxed());
    }
    outcomes.extend(stream::iter(work).buffer_unordered(WRITES_IN_FLIGHT_PER_BATCH).collect::<Vec<_>>().await);
    outcomes
}

/// Seconds since the Node was created, for the delay histograms.
fn seconds_since_creation(node: &Node) -> Option<f64> {
    let created = node.metadata.creation_timestamp.as_ref()?.0;
    let now = k8s_openapi::jiff::Timestamp::now();
    Some((now.as_millisecond() - created.as_millisecond()).max(0) as f64 / 1000.0)
}

/// Initialize one tainted Node from its metadata: at most one status write (addresses, only
/// when they differ) and one JSON patch (labels, providerID, taint). Addresses go first so the
/// Node is schedulable only once its addresses are right.
async fn initialize(
    ctx: &Context,
    api: &Api<Node>,
    metrics: &NodeMetrics,
    cached: &Node,
    result: CloudResult<Option<InstanceMetadata>>,
) -> Outcome {
    let name = cached.name_any();
    let meta = match result {
        Ok(Some(meta)) => meta,
        // §6 item 1: upstream waits for the next Node event; we retry with backoff.
        Ok(None) => return Outcome::retry("the cloud has no metadata for this instance yet"),
        Err(e) => return Outcome::Retry { after: e.requested_delay(), reason: e.to_string() },
    };
    let mut fresh: Option<Node> = None;
    for _ in 0..CONFLICT_ATTEMPTS {
        let node = fresh.as_ref().unwrap_or(cached);
        if !logic::is_uninitialized(node) {
            return Outcome::Done;
        }
        let plan = match logic::plan_initialization(node, &meta) {
            Ok(plan) => plan,
            Err(e @ InitError::MissingProviderId) | Err(e @ InitError::InvalidNodeIp(_)) => {
                return Outcome::retry(e.to_string());
            }
        };
        for warning in &plan.label_warnings {
            match warning {
                logic::LabelWarning::Reserved(key) => {
                    tracing::warn!(node = %name, label = %key, "discarding additional label in a reserved namespace")
                }
                logic::LabelWarning::Conflicting(key) => {
                    tracing::warn!(node = %name, label = %key, "keeping the Node's own value of an additional label")
                }
            }
        }
        if let Some(addresses) = &plan.addresses {
            match write_addresses(api, &name, addresses).await {
                Ok(()) => {}
                Err(e) if is_not_found(&e) => return Outcome::Gone,
                Err(e) => return Outcome::retry(format!("patching addresses: {e}")),
            }
        }
        let patch = match json_patch(plan.patch) {
            Ok(p) => p,
            Err(e) => return Outcome::retry(format!("building the patch: {e}")),
        };
        // The response is not read: ask for its metadata only, not the whole Node back.
        match api.patch_metadata(&name, &patch_params(), &patch).await {
            Ok(_) => {
                if let Some(s) = seconds_since_creation(node) {
                    metrics.taint_removal_delay.observe(s);
                }
                tracing::info!(node = %name, provider_id = ?plan.provider_id, "initialized node from the cloud");
                // Queued on the event sink's own budget; dropped rather than delaying Nodes.
                ctx.events.publish(
                    NAME,
                    node.object_ref(&()),
                    EventType::Normal,
                    "Synced",
                    "Node synced successfully",
                    "InitializeNode",
                );
                if let Some(s) = seconds_since_creation(node) {
                    metrics.initial_sync_delay.observe(s);
                }
                return Outcome::Done;
            }
            Err(e) if is_not_found(&e) => return Outcome::Gone,
            Err(e) if is_conflict(&e) => {
                tracing::debug!(node = %name, error = %e, "node changed under the patch; re-reading");
                match api.get(&name).await {
                    Ok(n) => fresh = Some(n),
                    Err(e) if is_not_found(&e) => return Outcome::Gone,
                    Err(e) => return Outcome::retry(format!("re-reading after a conflict: {e}")),
                }
            }
            Err(e) => return Outcome::retry(format!("patching node: {e}")),
        }
    }
    Outcome::retry("the Node kept changing under the patch")
}

async fn write_addresses(api: &Api<Node>, name: &str, addresses: &[NodeAddress]) -> Result<(), kube::Error> {
    api.patch_status(name, &patch_params(), &Patch::Merge(logic::addresses_patch(addresses))).await.map(|_| ())
}

/// Copy beta labels to their GA keys on an initialized Node (N12): no cloud call, one merge
/// patch of the labels only when something differs.
async fn reconcile_labels(api: &Api<Node>, node: &Node) -> Outcome {
    let labels = logic::reconcile_labels(node);
    if labels.is_empty() {
        return Outcome::Done;
    }
    let name = node.name_any();
    match api.patch_metadata(&name, &patch_params(), &Patch::Merge(logic::labels_patch(&labels))).await {
        Ok(_) => {
            tracing::info!(node = %name, labels = ?labels.keys().collect::<Vec<_>>(), "reconciled GA labels");
            Outcome::Done
        }
        Err(e) if is_not_found(&e) => Outcome::Gone,
        Err(e) => Outcome::retry(format!("patching labels: {e}")),
    }
}

/// The periodic address refresh (N18): sliding, every `node_status_update_frequency`.
async fn refresh_loop(ctx: Context) {
    loop {
        refresh_addresses(&ctx).await;
        tokio::select! {
            _ = ctx.shutdown.cancelled() => return,
            _ = tokio::time::sleep(ctx.options.node_status_update_frequency) => {}
        }
    }
}

/// One refresh pass: initialized Nodes in batches, `node_status_workers()` batches at once;
/// addresses only, written only when they changed.
pub(crate) async fn refresh_addresses(ctx: &Context) {
    let ownership = &ctx.options.node_ownership;
    let nodes: Vec<Arc<Node>> = ctx
        .nodes
        .state()
        .into_iter()
        .filter(|n| !logic::is_uninitialized(n) && ownership.owner(n) != Owner::Foreign)
        .collect();
    if nodes.is_empty() {
        return;
    }
    let size = batch_size(ctx);
    let chunks: Vec<Vec<Arc<Node>>> = nodes.chunks(size).map(<[Arc<Node>]>::to_vec).collect();
    let started = Instant::now();
    let written: usize = stream::iter(chunks)
        .map(|chunk| refresh_chunk(ctx, chunk))
        .buffer_unordered(ctx.options.node_status_workers().max(1))
        .fold(0, |acc, n| async move { acc + n })
        .await;
    tracing::debug!(nodes = nodes.len(), written, elapsed = ?started.elapsed(), "address refresh pass done");
}

async fn refresh_chunk(ctx: &Context, chunk: Vec<Arc<Node>>) -> usize {
    let Some(instances) = ctx.provider.instances() else { return 0 };
    let refs: Vec<&Node> = chunk.iter().map(|n| n.as_ref()).collect();
    let results = instances.instances_metadata(&refs).await;
    let mut writes = Vec::new();
    for (node, result) in chunk.iter().zip(results) {
        let name = node.name_any();
        match result {
            Ok(Some(meta)) => {
                // Decide on the freshest cached copy: the lookup took a while.
                let current = ctx.nodes.get(None, &name).unwrap_or_else(|| node.clone());
                if logic::is_uninitialized(&current) {
                    continue; // N13
                }
                match logic::desired_addresses(&current, &meta.node_addresses) {
                    AddressDecision::Changed(list) => writes.push((name, list)),
                    AddressDecision::Invalid(e) => {
                        tracing::error!(node = %name, error = %e, "node IP does not match the cloud's addresses; addresses left as they are")
                    }
                    AddressDecision::Unchanged | AddressDecision::NoCloudAddresses => {}
                }
            }
            Ok(None) => tracing::debug!(node = %name, "no instance metadata during address refresh"),
            Err(e) => tracing::warn!(node = %name, error = %e, "address refresh lookup failed; next period"),
        }
    }
    let api: Api<Node> = Api::all(ctx.client.clone());
    let api = &api;
    stream::iter(writes)
        .map(|(name, list)| async move {
            match write_addresses(api, &name, &list).await {
                Ok(()) => 1,
                Err(e) => {
                    tracing::warn!(node = %name, error = %e, "address update failed; next period");
                    0
                }
            }
        })
        .buffer_unordered(WRITES_IN_FLIGHT_PER_BATCH)
        .fold(0, |acc, n| async move { acc + n })
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concurrency_below_one_is_rejected_at_start() {
        let o = ControllerOptions { concurrent_node_syncs: 0, ..Default::default() };
        let err = validate_options(&o).unwrap_err();
        assert!(matches!(err, Error::InvalidFlag { flag: "--concurrent-node-syncs", .. }), "{err}");
        let o = ControllerOptions { node_batch_size: 0, ..Default::default() };
        assert!(matches!(validate_options(&o), Err(Error::InvalidFlag { flag: "--node-batch-size", .. })));
        assert!(validate_options(&ControllerOptions::default()).is_ok());
    }

    #[test]
    fn delay_histograms_use_upstream_buckets() {
        let m = crate::metrics::Metrics::new();
        let h = NodeMetrics::register(&m);
        h.taint_removal_delay.observe(2.0);
        // A restarted controller gets the same series, not a duplicate.
        NodeMetrics::register(&m).taint_removal_delay.observe(3.0);
        let text = m.encode();
        for le in ["1.0", "4.0", "16.0", "64.0", "256.0", "1024.0"] {
            assert!(
                text.contains(&format!(
                    "node_controller_cloud_provider_taint_removal_delay_seconds_bucket{{le=\"{le}\"}}"
                )),
                "{text}"
            );
        }
        assert!(text.contains("node_controller_initial_node_sync_delay_seconds_count 0"), "{text}");
        assert_eq!(
            text.matches("# TYPE node_controller_cloud_provider_taint_removal_delay_seconds").count(),
            1,
            "{text}"
        );
        assert!(text.contains("node_controller_cloud_provider_taint_removal_delay_seconds_count 2"), "{text}");
    }
}
