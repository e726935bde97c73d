//! node-route-controller (alias `route`): pod-network routes (reference §2.4, R1–R13).
//!
//! A pass lists the cloud's routes, plans with [`logic::plan`], runs deletions and creations
//! with at most [`logic::MAX_ROUTE_OPERATIONS`] in flight, and writes each Node's
//! `NetworkUnavailable` condition when it changed. Passes run every
//! `--route-reconciliation-period`, shortly after relevant Node changes, and, when an operation
//! failed, again after a backoff instead of waiting for the next period.

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
use prometheus_client::metrics::counter::Counter;
use serde_json::json;

use crate::cache::Change;
use crate::controller::{Context, Controller};
use crate::controllers::shadow::Comparer;
use crate::events::components::ROUTE_CONTROLLER;
use crate::health::HealthHandle;
use crate::provider::{Route, Routes};
use crate::shadow::ObjectKey;

use logic::{Action, Plan};

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

struct Reconciler {
    ctx: Context,
    sync_total: Counter,
    /// Shadow mode: record the plan instead of carrying it out.
    comparer: Option<Comparer>,
}

impl Reconciler {
    fn routes(&self) -> Option<&dyn Routes> {
        self.ctx.provider.routes()
    }

    /// One full pass (R6–R13).
    async fn pass(&self) -> PassOutcome {
        let Some(routes_api) = self.routes() else { return PassOutcome::default() };
        let cluster = self.ctx.options.cluster_name.as_str();
        self.sync_total.inc();
        let routes = match routes_api.list_routes(cluster).await {
            Ok(r) => r,
            Err(error) => {
                tracing::warn!(%error, "listing routes failed");
                return PassOutcome { failed: 1, ..PassOutcome::default() };
            }
        };
        let nodes = self.ctx.nodes.state();
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
        let mut changes = ctx.nodes.subscribe();
        let sync_total =
            ctx.metrics.get_or_register("route_controller_route_sync", "Route reconcile passes", Counter::default);
        let comparer = Comparer::from_context(&ctx, NAME);
        let reconciler = Reconciler { ctx: ctx.clone(), sync_total, comparer };
        let period = ctx.options.route_reconciliation_period.max(Duration::from_millis(100));
        tracing::info!(?period, cidrs = ?ctx.options.cluster_cidrs, "route controller started");
        health.set_healthy();

        // R4: a fixed-rate period; the first tick is immediate.
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut soon: Option<tokio::time::Instant> = None;
        let mut failures: u32 = 0;
        loop {
            let wake = async {
                match soon {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tick.tick() => {}
                _ = wake => {}
                change = changes.recv() => {
                    let relevant = match &change {
                        None => break,
                        Some(Change::Applied { old: Some(old), new }) => node_changed_for_routes(old, new),
                        Some(_) => true,
                    };
                    if relevant {
                        let at = tokio::time::Instant::now() + CHANGE_DELAY;
                        soon = Some(soon.map_or(at, |s| s.min(at)));
                    }
                    continue;
                }
            }
            soon = None;
            let outcome = tokio::select! {
                _ = shutdown.cancelled() => break,
                o = reconciler.pass() => o,
            };
            tracing::debug!(?outcome, "route pass finished");
            if outcome.failed > 0 {
                // §6 item 5: retry failed operations without waiting for the period.
                failures = failures.saturating_add(1);
                let delay = logic::retry_delay(failures);
                if delay < period {
                    soon = Some(tokio::time::Instant::now() + delay);
                }
            } else {
                failures = 0;
            }
        }
        Ok(())
    }
}
