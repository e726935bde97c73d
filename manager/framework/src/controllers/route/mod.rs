//! node-route-controller (alias `route`): pod-network routes (reference §2.4, R1–R13).
//!
//! A pass lists the cloud's routes, plans with [`logic::plan`], runs deletions and creations
//! with at most [`logic::MAX_ROUTE_OPERATIONS`] in flight, and writes each Node's
//! `NetworkUnavailable` condition when it changed. When an operation failed, a pass runs again
//! after a backoff instead of waiting for the next period.
//!
//! When passes run: with watch-based routes (alpha and off by default as in upstream v1.36, KEP-5237:
//! `CloudControllerManagerWatchBasedRoutesReconciliation`) at start, shortly after a Node is
//! added or deleted or changes its pod CIDRs or addresses, at most once per
//! `route_min_sync_interval` (10 s), and by a safety pass every `--min-resync-period` to twice
//! that (12–24 h); with the gate off, every `--route-reconciliation-period` and shortly after
//! those Node changes. Each pass counts in `route_controller_route_sync_total{trigger,outcome}`;
//! with watch-based routes, a safety pass that had to create or delete a route also counts in
//! `route_controller_route_corrections_total`.
//!
//! With node ownership (`--cloud-provider-platforms`, KEP-5778) only this manager's Nodes get
//! routes; routes to another platform's Nodes are left alone.

pub mod diff;
pub mod logic;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use serde_json::json;

use crate::cache::Change;
use crate::controller::{Context, Controller};
use crate::controllers::shadow::Comparer;
use crate::events::components::ROUTE_CONTROLLER;
use crate::health::HealthHandle;
use crate::provider::{Route, Routes};
use crate::shadow::ObjectKey;

use logic::{Action, Plan, SyncOutcome, Trigger, WatchSchedule};

/// Canonical controller name.
pub const NAME: &str = crds::controllers::Controller::NodeRoute.name();
/// Field manager of this controller's Node status patches.
pub const FIELD_MANAGER: &str = "route-controller";
/// How long Node changes are collected before the pass they trigger.
pub const CHANGE_DELAY: Duration = Duration::from_millis(200);

/// The route controller.
#[derive(Debug, Default)]
pub struct RouteController;

impl RouteController {
    /// A new controller; it reads its settings from the [`Context`] it is run with.
    pub fn new() -> Self {
        Self
    }
}

/// What one pass achieved.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PassOutcome {
    /// Routes deleted.
    pub deleted: usize,
    /// Routes created.
    pub created: usize,
    /// Cloud operations (list, create, delete) that failed.
    pub failed: usize,
    /// Node conditions written.
    pub conditions_written: usize,
}

/// Shadow mode: record what the pass would do, object by object, and close the pass.
fn record_shadow(comparer: &Comparer, plan: &Plan, nodes: &[Arc<Node>]) {
    let mut found = diff::differences(plan, nodes.iter().map(|n| n.as_ref()));
    let by_name: BTreeMap<String, &Arc<Node>> = nodes.iter().map(|n| (n.name_any(), n)).collect();
    for node in nodes {
        let key = ObjectKey::node(node.name_any());
        let differences = found.remove(&key).unwrap_or_default();
        comparer.record(key, Some(node_ref(node)), differences);
    }
    let mut routes = std::collections::BTreeSet::new();
    for (key, differences) in found {
        // A route's event goes to its target Node, when there is one.
        let target = key.name.split_once('/').map(|(t, _)| t.to_string()).unwrap_or_default();
        routes.insert(key.clone());
        comparer.record(key, by_name.get(&target).map(|n| node_ref(n)), differences);
    }
    // Routes no longer planned are done; Nodes no longer cached are gone.
    comparer.finish_pass(|k| if k.kind == "Route" { routes.contains(k) } else { by_name.contains_key(&k.name) });
}

fn node_changed_for_routes(old: &Node, new: &Node) -> bool {
    let cidrs = |n: &Node| n.spec.as_ref().map(|s| (s.pod_cidrs.clone(), s.pod_cidr.clone()));
    let addresses = |n: &Node| n.status.as_ref().and_then(|s| s.addresses.clone());
    cidrs(old) != cidrs(new) || addresses(old) != addresses(new)
}

/// Upstream references the Node by name and UID; the recorder files it under `default`.
fn node_ref(node: &Node) -> ObjectReference {
    node.object_ref(&())
}

/// Labels of `route_controller_route_sync_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SyncLabels {
    trigger: &'static str,
    outcome: &'static str,
}

struct Reconciler {
    ctx: Context,
    sync_total: Family<SyncLabels, Counter>,
    /// `route_controller_route_corrections_total`, with watch-based routes only (as upstream).
    corrections: Option<Counter>,
    /// Shadow mode: record the plan instead of carrying it out.
    comparer: Option<Comparer>,
}

impl Reconciler {
    fn new(ctx: &Context) -> Self {
        let sync_total = ctx.metrics.get_or_register(
            "route_controller_route_sync",
            "A metric counting the amount of times routes have been synced with the cloud provider, by trigger and outcome.",
            Family::default,
        );
        let corrections = ctx.options.watch_based_routes.then(|| {
            ctx.metrics.get_or_register(
                "route_controller_route_corrections",
                "Safety (periodic) route passes that had to create or delete a route.",
                Counter::default,
            )
        });
        Self { ctx: ctx.clone(), sync_total, corrections, comparer: Comparer::from_context(ctx, NAME) }
    }

    fn routes(&self) -> Option<&dyn Routes> {
        self.ctx.provider.routes()
    }

    /// One full pass (R6–R13) for `trigger`, counted (R16).
    async fn pass(&self, trigger: Trigger) -> PassOutcome {
        let out = self.reconcile().await;
        let outcome = SyncOutcome::of(out.created, out.deleted, out.failed);
        self.sync_total.get_or_create(&SyncLabels { trigger: trigger.label(), outcome: outcome.label() }).inc();
        if let Some(corrections) = &self.corrections
            && logic::is_correction(trigger, out.created, out.deleted)
        {
            corrections.inc();
            tracing::info!(
                created = out.created,
                deleted = out.deleted,
                "the safety pass corrected routes a Node change did not"
            );
        }
        out
    }

    async fn reconcile(&self) -> PassOutcome {
        let Some(routes_api) = self.routes() else { return PassOutcome::default() };
        let cluster = self.ctx.options.cluster_name.as_str();
        let mut routes = match routes_api.list_routes(cluster).await {
            Ok(r) => r,
            Err(error) => {
                tracing::warn!(%error, "listing routes failed");
                return PassOutcome { failed: 1, ..PassOutcome::default() };
            }
        };
        // KEP-5778: another platform's Nodes and their routes are not this manager's.
        let ownership = &self.ctx.options.node_ownership;
        let (nodes, others): (Vec<Arc<Node>>, Vec<Arc<Node>>) =
            self.ctx.nodes.state().into_iter().partition(|n| ownership.owns(n));
        if !others.is_empty() {
            let foreign: std::collections::BTreeSet<String> = others.iter().map(|n| n.name_any()).collect();
            routes.retain(|r| !foreign.contains(&r.target_node));
        }
        let refs: Vec<&Node> = nodes.iter().map(|n| n.as_ref()).collect();
        let Plan { deletions, creations, mut actions, deletions_first, unparsable } =
            logic::plan(&routes, &refs, &self.ctx.options.cluster_cidrs);
        for cidr in unparsable {
            tracing::warn!(%cidr, "ignoring a route whose destination does not parse");
        }
        if let Some(comparer) = &self.comparer {
            let plan = Plan { deletions, creations, actions, deletions_first, unparsable: Vec::new() };
            record_shadow(comparer, &plan, &nodes);
            return PassOutcome::default();
        }
        let by_name: BTreeMap<String, &Arc<Node>> = nodes.iter().map(|n| (n.name_any(), n)).collect();

        enum Op {
            Delete(Route),
            Create(logic::Creation),
        }
        enum Done {
            Deleted(Route, Result<(), String>),
            Created(logic::Creation, Duration, Result<(), String>),
        }
        let run = |op: Op| async move {
            match op {
                Op::Delete(route) => {
                    let r = routes_api.delete_route(cluster, &route).await.map_err(|e| e.to_string());
                    Done::Deleted(route, r)
                }
                Op::Create(c) => {
                    let started = Instant::now();
                    let r = routes_api.create_route(cluster, &c.name_hint, &c.route).await.map_err(|e| e.to_string());
                    Done::Created(c, started.elapsed(), r)
                }
            }
        };
        let limit = logic::MAX_ROUTE_OPERATIONS;
        let results: Vec<Done> = if deletions_first {
            // R10: a route being replaced must be gone before its successor is created.
            let mut done: Vec<Done> = futures::stream::iter(deletions.into_iter().map(Op::Delete))
                .map(run)
                .buffer_unordered(limit)
                .collect()
                .await;
            let created: Vec<Done> = futures::stream::iter(creations.into_iter().map(Op::Create))
                .map(run)
                .buffer_unordered(limit)
                .collect()
                .await;
            done.extend(created);
            done
        } else {
            let ops = deletions.into_iter().map(Op::Delete).chain(creations.into_iter().map(Op::Create));
            futures::stream::iter(ops).map(run).buffer_unordered(limit).collect().await
        };

        let mut out = PassOutcome::default();
        for done in results {
            match done {
                Done::Deleted(route, Ok(())) => {
                    out.deleted += 1;
                    tracing::info!(cidr = %route.destination_cidr, node = %route.target_node, "deleted route");
                }
                Done::Deleted(route, Err(error)) => {
                    out.failed += 1;
                    tracing::warn!(cidr = %route.destination_cidr, node = %route.target_node, %error, "deleting route failed");
                }
                Done::Created(c, _, Ok(())) => {
                    out.created += 1;
                    tracing::info!(cidr = %c.route.destination_cidr, node = %c.route.target_node, "created route");
                    if let Some(a) = actions.get_mut(&c.route.target_node) {
                        a.insert(c.route.destination_cidr.clone(), Action::Keep);
                    }
                }
                Done::Created(c, took, Err(error)) => {
                    out.failed += 1;
                    tracing::warn!(cidr = %c.route.destination_cidr, node = %c.route.target_node, %error, "creating route failed");
                    if let Some(node) = by_name.get(&c.route.target_node) {
                        self.ctx.events.publish(
                            ROUTE_CONTROLLER,
                            node_ref(node),
                            EventType::Warning,
                            "FailedToCreateRoute",
                            format!(
                                "Could not create route {} {} for node {} after {:?}: {error}",
                                c.name_hint, c.route.destination_cidr, c.route.target_node, took
                            ),
                            "CreateRoute",
                        );
                    }
                }
            }
        }

        for (name, node_actions) in &actions {
            // Read the Node again: its condition may have changed during the pass.
            let Some(node) = self.ctx.nodes.get(None, name) else { continue };
            let (status, reason, message) = logic::network_condition(node_actions);
            let current = logic::current_condition(&node);
            if !logic::condition_needs_write(current, status, reason) {
                continue;
            }
            let now = Time(k8s_openapi::jiff::Timestamp::now());
            // lastTransitionTime moves only when the status does.
            let transition = match current {
                Some(c) if c.status == status => c.last_transition_time.clone().unwrap_or_else(|| now.clone()),
                _ => now.clone(),
            };
            let patch = json!({ "status": { "conditions": [{
                "type": logic::NETWORK_UNAVAILABLE,
                "status": status,
                "reason": reason,
                "message": message,
                "lastTransitionTime": transition,
                "lastHeartbeatTime": now,
            }] } });
            let params = PatchParams { field_manager: Some(FIELD_MANAGER.to_string()), ..PatchParams::default() };
            let api: Api<Node> = Api::all(self.ctx.client.clone());
            match api.patch_status(name, &params, &Patch::Strategic(patch)).await {
                Ok(_) => out.conditions_written += 1,
                Err(kube::Error::Api(s)) if s.is_not_found() => {}
                Err(error) => tracing::warn!(node = %name, %error, "writing the NetworkUnavailable condition failed"),
            }
        }
        out
    }
}

#[async_trait]
impl Controller for RouteController {
    fn name(&self) -> &'static str {
        NAME
    }

    async fn run(self: Box<Self>, ctx: Context, health: HealthHandle) -> Result<(), crate::error::Error> {
        // R1: not configured or not supported: stay off without failing the manager.
        if !ctx.options.configure_cloud_routes {
            tracing::info!("--configure-cloud-routes=false; route controller not started");
            return Ok(());
        }
        if ctx.provider.routes().is_none() {
            tracing::info!(provider = %ctx.provider.name(), "provider has no routes; route controller not started");
            return Ok(());
        }
        // R2, deliberately softened (§6 item 6): an unusable --cluster-cidr disables this
        // controller and fails its health check instead of stopping the manager.
        let cidr_problem = match (&ctx.options.cluster_cidr_error, ctx.options.cluster_cidrs.is_empty()) {
            (Some(error), _) => Some(format!("route controller disabled: invalid --cluster-cidr: {error}")),
            (None, true) => Some(
                "route controller disabled: --cluster-cidr is empty, but the provider manages routes; \
                 set --cluster-cidr or --configure-cloud-routes=false"
                    .to_string(),
            ),
            (None, false) => None,
        };
        if let Some(problem) = cidr_problem {
            tracing::error!(reason = %problem, "route controller disabled");
            health.set_unhealthy(problem);
            ctx.shutdown.cancelled().await;
            return Ok(());
        }

        let shutdown = ctx.shutdown.clone();
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            ok = crate::controllers::service::caches_ready(&ctx.nodes) => if !ok {
                health.set_unhealthy("the Node cache stopped before its first list");
                return Ok(());
            },
        }
        let changes = ctx.nodes.subscribe();
        let reconciler = Reconciler::new(&ctx);
        health.set_healthy();
        if ctx.options.watch_based_routes {
            watch_loop(&reconciler, changes, &shutdown).await;
        } else {
            periodic_loop(&reconciler, changes, &shutdown).await;
        }
        Ok(())
    }
}

/// Whether a Node change can change routes (R5, upstream's filter).
fn relevant(change: &Change<Node>) -> bool {
    match change {
        Change::Applied { old: Some(old), new } => node_changed_for_routes(old, new),
        _ => true,
    }
}

/// Random bits for the safety period (a failure falls back to the clock's nanoseconds).
fn random_u64() -> u64 {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; 8];
    match ring::rand::SystemRandom::new().fill(&mut bytes) {
        Ok(()) => u64::from_le_bytes(bytes),
        Err(_) => {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos().into())
        }
    }
}

/// Sleep until `at`, or forever without one.
async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Watch-based passes (KEP-5237, R14, R15): at start, after relevant Node changes at most once
/// per `route_min_sync_interval`, a safety pass every `route_resync_period` to twice that, and
/// retries after failures (not sooner than the interval allows).
async fn watch_loop(
    reconciler: &Reconciler,
    mut changes: crate::cache::Subscription<Node>,
    shutdown: &tokio_util::sync::CancellationToken,
) {
    let options = &reconciler.ctx.options;
    let resync = options.route_resync_period.max(Duration::from_secs(1));
    let mut schedule = WatchSchedule::new(options.route_min_sync_interval);
    let mut next_safety = tokio::time::Instant::now() + logic::safety_delay(resync, random_u64());
    schedule.request(Trigger::NodeChange, Instant::now());
    tracing::info!(
        min_interval = ?options.route_min_sync_interval,
        next_safety_pass_in = ?next_safety.saturating_duration_since(tokio::time::Instant::now()),
        cidrs = ?options.cluster_cidrs,
        "route controller started (watch-based)"
    );
    let mut failures: u32 = 0;
    loop {
        let due = schedule.due().map(tokio::time::Instant::from_std);
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep_until(next_safety) => {
                schedule.request(Trigger::Periodic, Instant::now());
                next_safety = tokio::time::Instant::now() + logic::safety_delay(resync, random_u64());
                continue;
            }
            change = changes.recv() => {
                match change {
                    None => break,
                    Some(change) if relevant(&change) => schedule.request(Trigger::NodeChange, Instant::now() + CHANGE_DELAY),
                    Some(_) => {}
                }
                continue;
            }
            _ = sleep_until(due) => {}
        }
        let Some(trigger) = schedule.start(Instant::now()) else { continue };
        let outcome = tokio::select! {
            _ = shutdown.cancelled() => break,
            o = reconciler.pass(trigger) => o,
        };
        tracing::debug!(?outcome, trigger = trigger.label(), "route pass finished");
        if outcome.failed > 0 {
            failures = failures.saturating_add(1);
            schedule.request(trigger, Instant::now() + logic::retry_delay(failures));
        } else {
            failures = 0;
        }
    }
}

/// Passes every `--route-reconciliation-period` (R4), shortly after relevant Node changes (R5),
/// and retries after failures (§6 item 5): the controller with watch-based routes off.
async fn periodic_loop(
    reconciler: &Reconciler,
    mut changes: crate::cache::Subscription<Node>,
    shutdown: &tokio_util::sync::CancellationToken,
) {
    let ctx = &reconciler.ctx;
    let period = ctx.options.route_reconciliation_period.max(Duration::from_millis(100));
    tracing::info!(?period, cidrs = ?ctx.options.cluster_cidrs, "route controller started");

    // R4: a fixed-rate period; the first tick is immediate.
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut soon: Option<(tokio::time::Instant, Trigger)> = None;
    let mut failures: u32 = 0;
    loop {
        let trigger = tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tick.tick() => Trigger::Periodic,
            _ = sleep_until(soon.map(|(at, _)| at)) => soon.map_or(Trigger::NodeChange, |(_, t)| t),
            change = changes.recv() => {
                match change {
                    None => break,
                    Some(change) if relevant(&change) => {
                        let at = tokio::time::Instant::now() + CHANGE_DELAY;
                        soon = Some((soon.map_or(at, |(s, _)| s.min(at)), Trigger::NodeChange));
                    }
                    Some(_) => {}
                }
                continue;
            }
        };
        soon = None;
        let outcome = tokio::select! {
            _ = shutdown.cancelled() => break,
            o = reconciler.pass(trigger) => o,
        };
        tracing::debug!(?outcome, trigger = trigger.label(), "route pass finished");
        if outcome.failed > 0 {
            // §6 item 5: retry failed operations without waiting for the period.
            failures = failures.saturating_add(1);
            let delay = logic::retry_delay(failures);
            if delay < period {
                soon = Some((tokio::time::Instant::now() + delay, trigger));
            }
        } else {
            failures = 0;
        }
    }
}
