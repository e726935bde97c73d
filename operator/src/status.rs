//! Status (pure): the conditions and fields the operator owns, computed from what the
//! reconcile saw, and whether they differ from what the object already says.
//!
//! Conditions: `ConfigValid`, `Available`, `Progressing` (a latch: it turns True only when a new
//! pod template starts rolling out, and False when that rollout is done, so scaling and node
//! churn never flip it), `Degraded` (terminal causes at once, transient ones only after they
//! persist for a window; the message lists every cause), `ProviderHealthy` (Unknown until the
//! manager reports; never overwritten after that), and `Ready` from [`compute_ready`].

use std::time::Duration;

use crds::conditions::{self, DesiredCondition, Status, compute_ready, merge_conditions, types};
use crds::controllers::ControllerSelection;
use crds::{CloudControllerManager, CloudControllerManagerStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{Resource, ResourceExt};
use serde_json::json;

use crate::validate::Validation;
use crds::reasons::{available, config_valid, degraded, progressing, provider_healthy};

/// What the Deployment reports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeploymentObservation {
    /// `metadata.generation`.
    pub generation: i64,
    /// `status.observedGeneration`.
    pub observed_generation: i64,
    /// `spec.replicas`.
    pub desired: i32,
    /// `status.replicas`: pods of any template.
    pub replicas: i32,
    /// `status.updatedReplicas`: pods of the current template.
    pub updated: i32,
    /// `status.readyReplicas`.
    pub ready: i32,
    /// `status.availableReplicas`.
    pub available: i32,
    /// The `Progressing` condition says `ProgressDeadlineExceeded`.
    pub deadline_exceeded: bool,
}

/// What the DaemonSet reports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DaemonSetObservation {
    /// `metadata.generation`.
    pub generation: i64,
    /// `status.observedGeneration`.
    pub observed_generation: i64,
    /// `status.desiredNumberScheduled`.
    pub desired: i32,
    /// `status.currentNumberScheduled`: nodes running a pod of any template.
    pub current: i32,
    /// `status.updatedNumberScheduled`: nodes running the current template.
    pub updated: i32,
    /// `status.numberReady`.
    pub ready: i32,
    /// `status.numberAvailable`.
    pub available: i32,
}

/// A manager container that does not run as it should.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailingContainer {
    /// `pod/container`.
    pub name: String,
    /// The `Degraded` reason: [`degraded::MANAGER_CRASH_LOOPING`] or
    /// [`degraded::MANAGER_CANNOT_START`].
    pub reason: &'static str,
    /// What the kubelet reports (state, restarts, last exit code); never the container's output.
    pub detail: String,
}

/// What the Pods of the manager workload report (Deployment and DaemonSet modes).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodsObservation {
    /// Pods not being deleted.
    pub pods: i32,
    /// Containers that crash-loop or cannot start, sorted by name.
    pub failing: Vec<FailingContainer>,
    /// Every manager Pod, those being deleted too (one may still lead), sorted by name.
    pub managers: Vec<ManagerPod>,
}

/// A manager Pod as far as the status needs it to name the leader's manager.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ManagerPod {
    /// The Pod's name (the start of a pod-network manager's Lease identity).
    pub name: String,
    /// Its Node (the start of a host-network manager's identity).
    pub node: Option<String>,
    /// Its upstream profile (`ccm.rs/upstream-profile`), absent for this project's manager.
    pub upstream_profile: Option<String>,
}

/// Which manager the Lease holder `holder` runs (pure): client-go and this project's manager
/// both name a holder `<hostname>_<uuid>`, the hostname being the Pod's name, or its Node's on
/// the host network. `None` when no manager Pod of the resource matches.
pub fn leader_manager(holder: &str, managers: &[ManagerPod]) -> Option<String> {
    let host = holder.split_once('_').map_or(holder, |(h, _)| h);
    let pod = managers
        .iter()
        .find(|p| p.name == host)
        .or_else(|| managers.iter().find(|p| p.node.as_deref() == Some(host)))?;
    Some(match &pod.upstream_profile {
        Some(profile) => format!("upstream/{profile}"),
        None => MANAGER_NAME.to_string(),
    })
}

/// `status.leaderManager` for this project's manager.
pub const MANAGER_NAME: &str = "cloud-controller-manager";

/// The embedded engine's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EngineState {
    /// Started, not yet running its controllers or waiting for its Lease.
    Starting,
    /// Running (leading or standing by).
    Running,
    /// Failed; the message says why.
    Failed(String),
}

/// The workload as observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Workload {
    /// Nothing runs for this CR.
    None,
    /// Deployment mode.
    Deployment(DeploymentObservation),
    /// DaemonSet mode.
    DaemonSet(DaemonSetObservation),
    /// Embedded mode.
    Embedded(EngineState),
}

/// The manager's leader-election Lease.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaseObservation {
    /// `spec.holderIdentity`, when set.
    pub holder: Option<String>,
    /// Whether the holder renewed within `leaseDurationSeconds`.
    pub fresh: bool,
}

/// Transient failures of this CR's reconciles, since the first of the current streak.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TransientFailures {
    /// When the streak began.
    pub since: Option<Time>,
    /// `(Degraded reason, message)`, sorted.
    pub causes: Vec<(&'static str, String)>,
}

/// Everything the status computation needs.
#[derive(Debug)]
pub struct StatusInput<'a> {
    /// The CR as last read.
    pub cr: &'a CloudControllerManager,
    /// Its `spec.controllers` as the reconcile resolved it; `None` when it does not parse.
    pub controllers: Option<&'a ControllerSelection>,
    /// The validation verdict.
    pub validation: &'a Validation,
    /// The workload.
    pub workload: &'a Workload,
    /// The Lease, if it exists.
    pub lease: Option<&'a LeaseObservation>,
    /// The leader-migration Lease, with leader migration, if it exists.
    pub migration_lease: Option<&'a LeaseObservation>,
    /// The manager Pods (empty in Embedded mode, and where no kubelet runs them).
    pub pods: &'a PodsObservation,
    /// The announcer DaemonSet of `spec.announcer`, when it exists.
    pub announcers: Option<&'a DaemonSetObservation>,
    /// The node-manager DaemonSet of `spec.upstream`, when it exists.
    pub node_managers: Option<&'a DaemonSetObservation>,
    /// The announcers' Leases in the resource's namespace (read with `spec.announcer` only).
    pub announcer_leases: &'a [crate::announcing::AnnouncerLease],
    /// Whether this reconcile started a new rollout (new or changed pod template, or an
    /// embedded engine (re)start for a spec or Secret change).
    pub rollout_started: bool,
    /// Set while a mode switch keeps the previous mode's workload serving: what it waits for.
    pub switching: Option<&'a str>,
    /// Transient failures.
    pub transient: &'a TransientFailures,
    /// How long transient failures must persist before `Degraded` turns True.
    pub degraded_window: Duration,
    /// Now.
    pub now: Time,
}

/// The computed status.
#[derive(Debug, Clone, PartialEq)]
pub struct ComputedStatus {
    /// The operator's fields and the merged condition list (including the manager's
    /// `ProviderHealthy`, which is left out of the apply body unless the operator owns it).
    pub status: CloudControllerManagerStatus,
    /// Whether the operator's apply includes `ProviderHealthy` (only until the manager reports).
    pub owns_provider_healthy: bool,
    /// Whether anything the operator owns differs from the object.
    pub changed: bool,
}

impl ComputedStatus {
    /// The server-side apply body for the status subresource.
    pub fn apply_body(&self) -> serde_json::Value {
        let conditions: Vec<&Condition> = self
            .status
            .conditions
            .iter()
            .filter(|c| c.type_ != types::PROVIDER_HEALTHY || self.owns_provider_healthy)
            // The manager's alone (one writer per field, docs/architecture.md).
            .filter(|c| c.type_ != types::SHADOW_AGREES)
            .collect();
        let mut status = serde_json::Map::new();
        status.insert("conditions".into(), json!(conditions));
        let s = &self.status;
        let fields = [
            ("observedGeneration", s.observed_generation.map(|v| json!(v))),
            ("provider", s.provider.as_ref().map(|v| json!(v))),
            ("mode", s.mode.map(|v| json!(v))),
            ("controllers", s.controllers.as_ref().map(|v| json!(v))),
            ("replicas", s.replicas.map(|v| json!(v))),
            ("readyReplicas", s.ready_replicas.map(|v| json!(v))),
            ("leader", s.leader.as_ref().map(|v| json!(v))),
            ("leaderManager", s.leader_manager.as_ref().map(|v| json!(v))),
            ("migrationLease", s.migration_lease.as_ref().map(|v| json!(v))),
            ("announcers", s.announcers.as_ref().map(|v| json!(v))),
            ("nodeManagers", s.node_managers.as_ref().map(|v| json!(v))),
        ];
        for (k, v) in fields {
            if let Some(v) = v {
                status.insert(k.into(), v);
            }
        }
        json!({
            "apiVersion": CloudControllerManager::api_version(&()),
            "kind": CloudControllerManager::kind(&()),
            "status": status,
        })
    }
}

/// How long until the transient failures have lasted the whole window (when `Degraded` turns
/// True), so a reconcile can be scheduled then.
pub fn requeue_for_degraded(transient: &TransientFailures, window: Duration, now: &Time) -> Option<Duration> {
    let since = transient.since.as_ref()?;
    let elapsed = now.0.duration_since(since.0);
    let elapsed = Duration::try_from(elapsed).unwrap_or_default();
    window.checked_sub(elapsed).filter(|d| !d.is_zero())
}

/// Compute the status.
pub fn compute(input: &StatusInput<'_>) -> ComputedStatus {
    let cr = input.cr;
    let existing = cr.status.clone().unwrap_or_default();
    let generation = cr.meta().generation;
    let mut desired = vec![
        config_valid(input, &existing),
        available_condition(input),
        progressing_condition(input, &existing),
        degraded_condition(input),
    ];
    // With no manager running, a report it made no longer holds: say so (taking the condition
    // over from the manager, which takes it back when it reports again). Before any report,
    // AwaitingManager already says as much.
    let reported = conditions::find(&existing.conditions, types::PROVIDER_HEALTHY)
        .is_some_and(|c| c.reason != provider_healthy::AWAITING_MANAGER);
    let upstream = cr.spec.upstream.is_some();
    let no_manager = no_manager_running(input).filter(|_| reported || upstream);
    let owns_provider_healthy = upstream
        || no_manager.is_some()
        || match conditions::find(&existing.conditions, types::PROVIDER_HEALTHY) {
            None => true,
            Some(c) => {
                c.reason == provider_healthy::AWAITING_MANAGER || c.reason == provider_healthy::NO_MANAGER_RUNNING
            }
        };
    if let Some(message) = no_manager {
        desired.push(DesiredCondition::new(
            types::PROVIDER_HEALTHY,
            Status::Unknown,
            provider_healthy::NO_MANAGER_RUNNING,
            message,
        ));
    } else if let Some(message) = upstream.then(|| upstream_health(input)).flatten() {
        // An upstream CCM reports nothing to the resource: its /healthz (the readiness probe)
        // and its Lease are what there is.
        desired.push(DesiredCondition::new(
            types::PROVIDER_HEALTHY,
            Status::True,
            provider_healthy::UPSTREAM_HEALTHZ,
            message,
        ));
    } else if owns_provider_healthy {
        desired.push(DesiredCondition::new(
            types::PROVIDER_HEALTHY,
            Status::Unknown,
            provider_healthy::AWAITING_MANAGER,
            if upstream {
                "waiting for a ready replica and a Lease holder (an upstream manager reports no health of its own)"
            } else {
                "waiting for the manager to report provider health"
            },
        ));
    }
    // The announcers' state, with announcers only; gone with `spec.announcer`.
    if cr.spec.announcer.is_some() {
        desired.push(crate::announcing::condition(input.announcer_leases));
    }
    let mut merged = merge_conditions(&existing.conditions, desired, generation, &input.now);
    if cr.spec.announcer.is_none() {
        merged.retain(|c| c.type_ != types::ANNOUNCING);
    }
    let ready = compute_ready(&merged);
    merged = merge_conditions(&merged, [ready], generation, &input.now);

    let (replicas, ready_replicas) = match input.workload {
        Workload::None => (0, 0),
        Workload::Deployment(d) => (d.replicas, d.ready),
        Workload::DaemonSet(d) => (d.current, d.ready),
        Workload::Embedded(EngineState::Running) => (1, 1),
        Workload::Embedded(_) => (1, 0),
    };
    // The operator is this field's one writer (docs/architecture.md), also while the spec is
    // invalid for other reasons.
    let controllers = input.controllers.map(ControllerSelection::enabled_names);
    let leader = input.lease.filter(|l| l.fresh).and_then(|l| l.holder.clone());
    let leader_manager = match input.workload {
        Workload::Embedded(_) => leader.as_ref().map(|_| "embedded".to_string()),
        _ => leader.as_deref().and_then(|h| leader_manager(h, &input.pods.managers)),
    };
    let status = CloudControllerManagerStatus {
        observed_generation: generation,
        conditions: merged,
        // A name over the CRD's limit is not repeated (the status write would carry it).
        provider: (cr.spec.provider.chars().count() <= crds::validation::limits::PROVIDER)
            .then(|| cr.spec.provider.clone()),
        mode: Some(cr.spec.mode),
        controllers,
        replicas: Some(replicas),
        ready_replicas: Some(ready_replicas),
        leader,
        leader_manager,
        migration_lease: crate::validate::migration_lease_namespace(cr)
            .zip(crate::validate::migration_lease_name(&cr.spec))
            .map(|(namespace, name)| crds::v1alpha1::MigrationLeaseStatus {
                namespace,
                name,
                holder: input.migration_lease.filter(|l| l.fresh).and_then(|l| l.holder.clone()),
            }),
        // The manager's (shadow mode); never applied by the operator.
        shadow: None,
        // The manager's leader writes the orphan report; never applied by the operator.
        orphans: None,
        // Zeros until the DaemonSet exists; gone with `spec.announcer`.
        announcers: cr.spec.announcer.as_ref().map(|_| node_pods(input.announcers)),
        // Likewise while the resource runs a node manager.
        node_managers: crate::profiles::node_manager_of(cr).map(|_| node_pods(input.node_managers)),
    };
    let changed = differs(&status, &existing);
    ComputedStatus { status, owns_provider_healthy, changed }
}

/// A per-node DaemonSet's Pods for status: zeros until it exists.
fn node_pods(d: Option<&DaemonSetObservation>) -> crds::v1alpha1::NodePodsStatus {
    crds::v1alpha1::NodePodsStatus {
        desired: d.map_or(0, |d| d.desired),
        ready: d.map_or(0, |d| d.ready),
        updated: d.map_or(0, |d| d.updated),
    }
}

/// The holder of the manager's Lease while it renews it.
fn fresh_holder<'a>(input: &StatusInput<'a>) -> Option<&'a str> {
    input.lease.filter(|l| l.fresh).and_then(|l| l.holder.as_deref()).filter(|h| !h.is_empty())
}

/// For an upstream CCM: what shows it healthy (a ready replica, whose /healthz passes, and a
/// fresh Lease holder), or `None` while that is not so.
fn upstream_health(input: &StatusInput<'_>) -> Option<String> {
    let holder = fresh_holder(input)?;
    let ready = match input.workload {
        Workload::Deployment(d) => d.ready,
        Workload::DaemonSet(d) => d.ready,
        Workload::None | Workload::Embedded(_) => 0,
    };
    (ready > 0).then(|| {
        format!(
            "the upstream manager's /healthz passes on {ready} ready replica(s) and {holder} holds Lease {}; upstream CCMs report no cloud health of their own",
            lease_name(input.cr)
        )
    })
}

/// Why no manager can be reporting provider health, or `None` when one may be: no replica is
/// ready and no holder renews the Lease (a crash-looping or unschedulable manager), or the
/// embedded engine is not running. With nothing deployed the condition is left as it is.
fn no_manager_running(input: &StatusInput<'_>) -> Option<String> {
    let leader = fresh_holder(input).is_some();
    let why = match input.workload {
        Workload::None => return None,
        Workload::Embedded(EngineState::Running) => return None,
        Workload::Embedded(_) => "the embedded engine is not running".to_string(),
        Workload::Deployment(d) if d.ready == 0 => format!("no manager replica is ready (0 of {})", d.desired),
        Workload::DaemonSet(d) if d.ready == 0 => format!("no manager pod is ready (0 of {})", d.desired),
        Workload::Deployment(_) | Workload::DaemonSet(_) => return None,
    };
    if leader {
        return None;
    }
    Some(format!("{why} and no manager holds Lease {}, so nothing reports provider health", lease_name(input.cr)))
}

/// Whether `desired` changes anything in `existing`. Fields the operator leaves unset are not
/// compared: another writer (the manager) may own them.
fn differs(desired: &CloudControllerManagerStatus, existing: &CloudControllerManagerStatus) -> bool {
    fn some_differs<T: PartialEq>(d: &Option<T>, e: &Option<T>) -> bool {
        d.is_some() && d != e
    }
    desired.conditions != existing.conditions
        || some_differs(&desired.observed_generation, &existing.observed_generation)
        || some_differs(&desired.provider, &existing.provider)
        || some_differs(&desired.mode, &existing.mode)
        || some_differs(&desired.controllers, &existing.controllers)
        || some_differs(&desired.replicas, &existing.replicas)
        || some_differs(&desired.ready_replicas, &existing.ready_replicas)
        || some_differs(&desired.leader, &existing.leader)
        || desired.leader_manager != existing.leader_manager
        // Cleared when migration is turned off: the operator is its one writer.
        || desired.migration_lease != existing.migration_lease
        // Likewise when spec.announcer is removed.
        || desired.announcers != existing.announcers
        || desired.node_managers != existing.node_managers
}

fn config_valid(input: &StatusInput<'_>, existing: &CloudControllerManagerStatus) -> DesiredCondition {
    match input.validation {
        Validation::Valid(_) => DesiredCondition::new(
            types::CONFIG_VALID,
            Status::True,
            config_valid::VALID,
            "the spec, the cloud-config Secret and the provider's configuration are usable",
        ),
        Validation::Invalid { .. } => {
            let (reason, message) = input.validation.summary().unwrap_or_default();
            DesiredCondition::new(types::CONFIG_VALID, Status::False, reason, message)
        }
        // A read failure says nothing about validity: keep the last verdict.
        Validation::Unknown(failure) => match conditions::find(&existing.conditions, types::CONFIG_VALID) {
            Some(c) => DesiredCondition::new(types::CONFIG_VALID, Status::parse(&c.status), &c.reason, &c.message),
            None => DesiredCondition::new(types::CONFIG_VALID, Status::Unknown, failure.reason, &failure.message),
        },
    }
}

fn lease_name(cr: &CloudControllerManager) -> String {
    format!("{}/{}", cr.namespace().unwrap_or_default(), cr.name_any())
}

/// `Err` with the reason and message when no fresh Lease holder exists.
fn leader_check(input: &StatusInput<'_>) -> Result<String, (&'static str, String)> {
    let lease = lease_name(input.cr);
    match input.lease {
        Some(LeaseObservation { holder: Some(h), fresh: true }) if !h.is_empty() => Ok(h.clone()),
        Some(LeaseObservation { holder: Some(h), fresh: false }) if !h.is_empty() => {
            Err((available::NO_LEADER, format!("the holder of Lease {lease} ({h}) stopped renewing it")))
        }
        _ => Err((available::NO_LEADER, format!("no manager holds Lease {lease}"))),
    }
}

fn available_condition(input: &StatusInput<'_>) -> DesiredCondition {
    let cond = |status, reason: &str, message: String| DesiredCondition::new(types::AVAILABLE, status, reason, message);
    let (ok, what) = match input.workload {
        Workload::None => {
            let why = match input.validation.summary() {
                Some((reason, _)) if !input.validation.is_valid() => format!("not deployed: ConfigValid is {reason}"),
                _ => "nothing is deployed yet".to_string(),
            };
            return cond(Status::False, available::NOT_DEPLOYED, why);
        }
        Workload::Deployment(d) => (d.available > 0, format!("{} of {} replicas available", d.available, d.desired)),
        Workload::DaemonSet(d) if d.desired == 0 && d.observed_generation >= d.generation => {
            return cond(Status::False, available::NO_MATCHING_NODES, no_matching_nodes(input.cr));
        }
        Workload::DaemonSet(d) => (d.available > 0, format!("{} of {} pods available", d.available, d.desired)),
        Workload::Embedded(state) => {
            if *state != EngineState::Running {
                let message = match state {
                    EngineState::Failed(m) => format!("the embedded engine failed: {m}"),
                    _ => "the embedded engine is starting".to_string(),
                };
                return cond(Status::False, available::ENGINE_NOT_RUNNING, message);
            }
            (true, "the embedded engine is running".to_string())
        }
    };
    if !ok {
        return cond(Status::False, available::NO_AVAILABLE_REPLICAS, what);
    }
    match leader_check(input) {
        Ok(holder) => cond(Status::True, available::AS_EXPECTED, format!("{what}; {holder} leads")),
        Err((reason, message)) => cond(Status::False, reason, format!("{what}, but {message}")),
    }
}

/// The `NoMatchingNodes` message: the selector the pods use, and how to widen it.
fn no_matching_nodes(cr: &CloudControllerManager) -> String {
    let d = &cr.spec.deployment;
    let selector = d.node_selector.clone().unwrap_or_else(crate::build::control_plane_selector);
    let selector = selector.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",");
    let which = if d.node_selector.is_some() { "spec.deployment.nodeSelector" } else { "the default nodeSelector" };
    format!(
        "the DaemonSet matches no Node (0 pods scheduled): no schedulable Node has the labels of {which} ({selector}) with taints that spec.deployment.tolerations and the built-in tolerations allow; label the Nodes that should run the manager, or set spec.deployment.nodeSelector and tolerations"
    )
}

fn progressing_condition(input: &StatusInput<'_>, existing: &CloudControllerManagerStatus) -> DesiredCondition {
    let done = || DesiredCondition::new(types::PROGRESSING, Status::False, progressing::AS_EXPECTED, "");
    let rolling =
        |message: String| DesiredCondition::new(types::PROGRESSING, Status::True, progressing::ROLLING_OUT, message);
    let previous = conditions::find(&existing.conditions, types::PROGRESSING);
    let was_rolling = previous.is_some_and(|c| c.status == Status::True.as_str());
    let keep_previous = || match previous {
        Some(c) => DesiredCondition::new(types::PROGRESSING, Status::parse(&c.status), &c.reason, &c.message),
        None => done(),
    };
    if let Some(message) = input.switching {
        return DesiredCondition::new(types::PROGRESSING, Status::True, progressing::MODE_SWITCHING, message);
    }
    match input.workload {
        // Just created; the watch has not delivered the workload yet.
        Workload::None if input.rollout_started => rolling("rolling out a new pod template".to_string()),
        Workload::None => done(),
        Workload::Embedded(EngineState::Starting) => DesiredCondition::new(
            types::PROGRESSING,
            Status::True,
            progressing::ENGINE_STARTING,
            "the embedded engine is starting with the new configuration",
        ),
        Workload::Embedded(_) => done(),
        Workload::Deployment(d) => {
            let message = format!("{} of {} replicas updated, {} available", d.updated, d.desired, d.available);
            if input.rollout_started {
                return rolling("rolling out a new pod template".to_string());
            }
            // The counts describe an older spec until the controller observes the new one.
            if d.observed_generation < d.generation {
                return keep_previous();
            }
            let old_pods = d.replicas > d.updated;
            if was_rolling {
                let complete = d.updated >= d.desired && !old_pods && d.available >= d.desired;
                if complete { done() } else { rolling(message) }
            } else if old_pods {
                // A rollout this operator did not see start (for example across a restart).
                rolling(message)
            } else {
                done()
            }
        }
        Workload::DaemonSet(d) => {
            let message = format!("{} of {} nodes updated, {} available", d.updated, d.desired, d.available);
            if input.rollout_started {
                return rolling("rolling out a new pod template".to_string());
            }
            if d.observed_generation < d.generation {
                return keep_previous();
            }
            // Availability is ignored: a node going away or joining is not a rollout.
            let old_pods = d.current > d.updated;
            if was_rolling {
                if d.updated >= d.desired && !old_pods { done() } else { rolling(message) }
            } else if old_pods {
                rolling(message)
            } else {
                done()
            }
        }
    }
}

fn degraded_condition(input: &StatusInput<'_>) -> DesiredCondition {
    let mut causes: Vec<(&'static str, String)> = Vec::new();
    if let (false, Some((reason, message))) = (input.validation.is_valid(), input.validation.summary())
        && matches!(input.validation, Validation::Invalid { .. })
    {
        causes.push((degraded::CONFIG_INVALID, format!("{reason}: {message}")));
    }
    match input.workload {
        Workload::Deployment(d) if d.deadline_exceeded => causes.push((
            degraded::ROLLOUT_STALLED,
            "the Deployment exceeded its progress deadline; check the manager pods".to_string(),
        )),
        Workload::Embedded(EngineState::Failed(m)) => causes.push((degraded::ENGINE_FAILED, m.clone())),
        _ => {}
    }
    // At once: the kubelet already waited (CrashLoopBackOff, ImagePullBackOff), and each
    // failing container is named.
    if !matches!(input.workload, Workload::Embedded(_) | Workload::None) {
        for reason in [degraded::MANAGER_CRASH_LOOPING, degraded::MANAGER_CANNOT_START] {
            let details: Vec<String> = input
                .pods
                .failing
                .iter()
                .filter(|f| f.reason == reason)
                .map(|f| format!("{}: {}", f.name, f.detail))
                .collect();
            if !details.is_empty() {
                causes.push((reason, details.join(", ")));
            }
        }
    }
    let persisted = input.transient.since.as_ref().is_some_and(|since| {
        let elapsed = Duration::try_from(input.now.0.duration_since(since.0)).unwrap_or_default();
        elapsed >= input.degraded_window
    });
    if persisted {
        causes.extend(input.transient.causes.iter().cloned());
    }
    match causes.first() {
        None => DesiredCondition::new(types::DEGRADED, Status::False, degraded::AS_EXPECTED, ""),
        Some((reason, _)) => DesiredCondition::new(
            types::DEGRADED,
            Status::True,
            *reason,
            causes.iter().map(|(r, m)| format!("{r}: {m}")).collect::<Vec<_>>().join("; "),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::{Failure, Validated};
    use crds::conditions::reasons as ready_reasons;
    use k8s_openapi::jiff::Timestamp;

    fn at(secs: i64) -> Time {
        Time(Timestamp::from_second(secs).unwrap())
    }

    /// A `fake` resource in `mode`, at its first generation.
    fn cr(mode: &str) -> CloudControllerManager {
        let mut cr = testkit::cr("kube-system", "aws", json!({"provider": "fake", "mode": mode}));
        cr.metadata.generation = Some(1);
        cr
    }

    fn valid() -> Validation {
        Validation::Valid(Validated {
            config: ccm_framework::config::ManagerConfig::default(),
            cloud_config: None,
            provider_has_routes: false,
        })
    }

    fn leader() -> LeaseObservation {
        LeaseObservation { holder: Some("pod-a".into()), fresh: true }
    }

    fn deploy(desired: i32, replicas: i32, updated: i32, available: i32) -> Workload {
        Workload::Deployment(DeploymentObservation {
            generation: 2,
            observed_generation: 2,
            desired,
            replicas,
            updated,
            ready: available,
            available,
            deadline_exceeded: false,
        })
    }

    struct Run {
        cr: CloudControllerManager,
        validation: Validation,
        lease: Option<LeaseObservation>,
        migration_lease: Option<LeaseObservation>,
        pods: PodsObservation,
        transient: TransientFailures,
        now: i64,
    }

    impl Run {
        fn new(mode: &str) -> Self {
            Self {
                cr: cr(mode),
                validation: valid(),
                lease: Some(leader()),
                migration_lease: None,
                pods: PodsObservation::default(),
                transient: Default::default(),
                now: 100,
            }
        }

        /// Compute, store the result on the CR as the API server would, and return it.
        fn step(&mut self, workload: Workload, rollout_started: bool) -> ComputedStatus {
            let controllers = ControllerSelection::parse(&self.cr.spec.controllers).ok();
            let out = compute(&StatusInput {
                cr: &self.cr,
                controllers: controllers.as_ref(),
                validation: &self.validation,
                workload: &workload,
                lease: self.lease.as_ref(),
                migration_lease: self.migration_lease.as_ref(),
                pods: &self.pods,
                node_managers: None,
                announcers: None,
                announcer_leases: &[],
                rollout_started,
                switching: None,
                transient: &self.transient,
                degraded_window: Duration::from_secs(120),
                now: at(self.now),
            });
            self.cr.status = Some(out.status.clone());
            self.now += 1;
            out
        }

        fn cond(&self, type_: &str) -> Condition {
            conditions::find(&self.cr.status.as_ref().unwrap().conditions, type_).unwrap().clone()
        }
    }

    #[test]
    fn an_upstream_manager_is_healthy_while_a_replica_is_ready_and_a_holder_renews_its_lease() {
        let mut r = Run::new("Deployment");
        r.cr.spec.upstream =
            Some(crds::v1alpha1::UpstreamManager { profile: crds::v1alpha1::UpstreamProfile::Aws, node_manager: None });
        r.lease = None;
        r.step(deploy(2, 2, 2, 0), true);
        let waiting = r.cond(types::PROVIDER_HEALTHY);
        assert_eq!(
            (waiting.status.as_str(), waiting.reason.as_str()),
            ("Unknown", provider_healthy::NO_MANAGER_RUNNING)
        );
        r.lease = Some(leader());
        let out = r.step(deploy(2, 2, 2, 2), false);
        assert!(out.owns_provider_healthy, "nothing else writes it for an upstream manager");
        let healthy = r.cond(types::PROVIDER_HEALTHY);
        assert_eq!((healthy.status.as_str(), healthy.reason.as_str()), ("True", provider_healthy::UPSTREAM_HEALTHZ));
        assert!(healthy.message.contains("pod-a holds Lease"), "{}", healthy.message);
        assert_eq!(r.cond(types::READY).status, "True");
        assert_eq!(r.cr.status.as_ref().unwrap().leader.as_deref(), Some("pod-a"));
        assert_eq!(r.cr.status.as_ref().unwrap().leader_manager, None, "no Pod of the resource is pod-a");
        r.pods.managers =
            vec![ManagerPod { name: "pod-a".into(), node: Some("n1".into()), upstream_profile: Some("aws".into()) }];
        r.step(deploy(2, 2, 2, 2), false);
        assert_eq!(r.cr.status.as_ref().unwrap().leader_manager.as_deref(), Some("upstream/aws"));
        // Every replica fails /healthz and the Lease goes stale: no longer healthy.
        r.lease = Some(LeaseObservation { holder: Some("pod-a".into()), fresh: false });
        r.step(deploy(2, 2, 2, 0), false);
        assert_eq!(r.cond(types::PROVIDER_HEALTHY).status, "Unknown");
        assert_ne!(r.cond(types::READY).status, "True");
    }

    /// Status of a valid Deployment-mode `cr` whose manager is available, with these per-node
    /// DaemonSets observed.
    fn with_node_pods(
        cr: &CloudControllerManager,
        announcers: Option<&DaemonSetObservation>,
        node_managers: Option<&DaemonSetObservation>,
    ) -> ComputedStatus {
        let controllers = ControllerSelection::parse(&cr.spec.controllers).ok();
        compute(&StatusInput {
            cr,
            controllers: controllers.as_ref(),
            validation: &valid(),
            workload: &deploy(2, 2, 2, 2),
            lease: None,
            migration_lease: None,
            pods: &PodsObservation::default(),
            announcers,
            node_managers,
            announcer_leases: &[],
            rollout_started: false,
            switching: None,
            transient: &TransientFailures::default(),
            degraded_window: Duration::from_secs(120),
            now: at(1),
        })
    }

    #[test]
    fn announcer_counts_follow_the_daemonset_and_go_with_spec_announcer() {
        let mut cr = cr("Deployment");
        cr.spec.announcer = Some(crds::v1alpha1::Announcer::default());
        let daemon_set = DaemonSetObservation { desired: 3, current: 3, updated: 2, ready: 1, ..Default::default() };
        let compute_with = |cr: &CloudControllerManager, d: Option<&DaemonSetObservation>| with_node_pods(cr, d, None);
        let before = compute_with(&cr, None);
        let zero = crds::v1alpha1::NodePodsStatus::default();
        assert_eq!(before.status.announcers, Some(zero), "zeros until the DaemonSet exists");
        cr.status = Some(before.status);
        let out = compute_with(&cr, Some(&daemon_set));
        assert!(out.changed);
        let want = crds::v1alpha1::NodePodsStatus { desired: 3, ready: 1, updated: 2 };
        assert_eq!(out.status.announcers.as_ref(), Some(&want));
        assert_eq!(out.apply_body()["status"]["announcers"], json!({"desired": 3, "ready": 1, "updated": 2}));
        cr.status = Some(out.status);
        assert!(!compute_with(&cr, Some(&daemon_set)).changed, "written only when it changed");
        let announcing = conditions::find(&cr.status.as_ref().unwrap().conditions, types::ANNOUNCING).cloned().unwrap();
        assert_eq!((announcing.status.as_str(), announcing.reason.as_str()), ("Unknown", "AwaitingAnnouncers"));
        let all = cr.status.as_ref().unwrap().conditions.clone();
        let without: Vec<Condition> = all.iter().filter(|c| c.type_ != types::ANNOUNCING).cloned().collect();
        assert_eq!(compute_ready(&all), compute_ready(&without), "Announcing is no input of Ready");
        cr.spec.announcer = None;
        let gone = compute_with(&cr, Some(&daemon_set));
        assert!(gone.changed && gone.status.announcers.is_none(), "cleared with spec.announcer");
        assert!(conditions::find(&gone.status.conditions, types::ANNOUNCING).is_none(), "and Announcing with it");
        let body = gone.apply_body();
        let listed = body["status"]["conditions"].as_array().unwrap();
        assert!(listed.iter().all(|c| c["type"] != "Announcing"), "left out of the apply, so it is removed");
    }

    #[test]
    fn node_manager_counts_follow_its_daemonset_and_go_when_it_stops_running() {
        let mut cr = cr("Deployment");
        cr.spec.provider = "azure".into();
        cr.spec.upstream = Some(serde_json::from_value(json!({"profile": "azure"})).unwrap());
        let daemon_set = DaemonSetObservation { desired: 3, current: 3, updated: 3, ready: 2, ..Default::default() };
        let compute_with = |cr: &CloudControllerManager, d: Option<&DaemonSetObservation>| with_node_pods(cr, None, d);
        let before = compute_with(&cr, None);
        assert_eq!(before.status.node_managers, Some(crds::v1alpha1::NodePodsStatus::default()), "zeros first");
        cr.status = Some(before.status);
        let out = compute_with(&cr, Some(&daemon_set));
        assert!(out.changed);
        assert_eq!(out.apply_body()["status"]["nodeManagers"], json!({"desired": 3, "ready": 2, "updated": 3}));
        cr.status = Some(out.status);
        assert!(!compute_with(&cr, Some(&daemon_set)).changed, "written only when it changed");
        cr.spec.upstream =
            Some(serde_json::from_value(json!({"profile": "azure", "nodeManager": {"enabled": false}})).unwrap());
        let gone = compute_with(&cr, Some(&daemon_set));
        assert!(gone.changed && gone.status.node_managers.is_none(), "cleared when it stops running");
    }

    #[test]
    fn first_visit_sets_every_condition_with_provider_health_unknown() {
        let mut r = Run::new("Deployment");
        let out = r.step(deploy(2, 2, 2, 2), false);
        assert!(out.changed);
        let types: Vec<_> = out.status.conditions.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(types, conditions::types::ALL);
        assert_eq!(r.cond(types::PROVIDER_HEALTHY).status, "Unknown");
        assert_eq!(r.cond(types::READY).reason, ready_reasons::AWAITING_STATUS);
        assert_eq!(r.cond(types::AVAILABLE).status, "True");
        assert!(out.owns_provider_healthy);
    }

    #[test]
    fn recomputing_unchanged_inputs_is_not_a_change() {
        let mut r = Run::new("Deployment");
        r.step(deploy(2, 2, 2, 2), false);
        let again = r.step(deploy(2, 2, 2, 2), false);
        assert!(!again.changed, "an identical recompute must not write");
    }

    #[test]
    fn manager_reported_provider_health_is_left_alone_and_feeds_ready() {
        let mut r = Run::new("Deployment");
        r.step(deploy(2, 2, 2, 2), false);
        // The manager writes its own ProviderHealthy.
        let status = r.cr.status.as_mut().unwrap();
        let ph = status.conditions.iter_mut().find(|c| c.type_ == types::PROVIDER_HEALTHY).unwrap();
        ph.status = "True".into();
        ph.reason = "Healthy".into();
        let out = r.step(deploy(2, 2, 2, 2), false);
        assert!(!out.owns_provider_healthy);
        let body = out.apply_body();
        let types: Vec<_> =
            body["status"]["conditions"].as_array().unwrap().iter().map(|c| c["type"].clone()).collect();
        assert!(!types.contains(&json!("ProviderHealthy")), "{types:?}");
        assert_eq!(r.cond(types::READY).status, "True");
        assert_eq!(r.cond(types::PROVIDER_HEALTHY).reason, "Healthy");
    }

    #[test]
    fn deployment_rollout_sets_progressing_until_every_replica_is_updated_and_available() {
        let mut r = Run::new("Deployment");
        r.step(deploy(2, 2, 2, 2), false);
        assert_eq!(r.cond(types::PROGRESSING).status, "False");
        // New template applied: generation 3 not yet observed.
        let mut w = deploy(2, 2, 2, 2);
        if let Workload::Deployment(d) = &mut w {
            d.generation = 3;
        }
        r.step(w.clone(), true);
        assert_eq!(r.cond(types::PROGRESSING).status, "True");
        assert_eq!(r.cond(types::READY).reason, ready_reasons::PROGRESSING);
        r.step(w, false);
        assert_eq!(r.cond(types::PROGRESSING).status, "True", "stale counts keep it");
        r.step(deploy(2, 2, 1, 1), false);
        assert_eq!(r.cond(types::PROGRESSING).status, "True");
        assert!(r.cond(types::PROGRESSING).message.contains("1 of 2 replicas updated"));
        r.step(deploy(2, 2, 2, 1), false);
        assert_eq!(r.cond(types::PROGRESSING).status, "True");
        r.step(deploy(2, 2, 2, 2), false);
        assert_eq!(r.cond(types::PROGRESSING).status, "False");
    }

    #[test]
    fn scaling_and_pod_loss_do_not_flip_progressing() {
        let mut r = Run::new("Deployment");
        r.step(deploy(2, 2, 2, 2), false);
        let transition = r.cond(types::PROGRESSING).last_transition_time;
        // Scale to 3: the new pod is of the current template, not yet available.
        r.step(deploy(3, 3, 3, 2), false);
        // A pod dies.
        r.step(deploy(3, 3, 3, 1), false);
        // Scaling bumped generation before the controller caught up.
        let mut w = deploy(4, 3, 3, 3);
        if let Workload::Deployment(d) = &mut w {
            d.generation = 9;
        }
        r.step(w, false);
        assert_eq!(r.cond(types::PROGRESSING).status, "False");
        assert_eq!(r.cond(types::PROGRESSING).last_transition_time, transition);
    }

    #[test]
    fn old_template_pods_mean_a_rollout_even_unseen() {
        let mut r = Run::new("Deployment");
        r.step(deploy(2, 3, 1, 2), false);
        assert_eq!(r.cond(types::PROGRESSING).status, "True");
    }

    fn daemonset(desired: i32, current: i32, updated: i32, available: i32) -> Workload {
        Workload::DaemonSet(DaemonSetObservation {
            generation: 1,
            observed_generation: 1,
            desired,
            current,
            updated,
            ready: available,
            available,
        })
    }

    #[test]
    fn daemonset_rollout_is_read_from_its_status_and_node_churn_is_ignored() {
        let mut r = Run::new("DaemonSet");
        r.step(daemonset(3, 3, 3, 3), false);
        assert_eq!(r.cond(types::PROGRESSING).status, "False");
        assert_eq!(r.cond(types::AVAILABLE).status, "True");
        // A node joins: its pod is of the current template.
        r.step(daemonset(4, 4, 4, 3), false);
        assert_eq!(r.cond(types::PROGRESSING).status, "False");
        // New template.
        r.step(daemonset(4, 4, 0, 4), true);
        assert_eq!(r.cond(types::PROGRESSING).status, "True");
        r.step(daemonset(4, 4, 2, 3), false);
        assert!(r.cond(types::PROGRESSING).message.contains("2 of 4 nodes updated"));
        // Done even with an unavailable node.
        r.step(daemonset(4, 4, 4, 3), false);
        assert_eq!(r.cond(types::PROGRESSING).status, "False");
        assert_eq!(r.cr.status.as_ref().unwrap().replicas, Some(4));
    }

    #[test]
    fn m7_status_shows_the_migration_leases_namespace_and_its_renewing_holder_and_clears_them_with_migration_off() {
        let mut r = Run::new("Deployment");
        let deployment = || Workload::Deployment(DeploymentObservation::default());
        r.step(deployment(), false);
        assert_eq!(r.cr.status.as_ref().unwrap().migration_lease, None);
        r.cr.spec.leader_election.migration = Some(crds::v1alpha1::LeaderMigration {
            enabled: true,
            lease_namespace: Some("ccm-moving".into()),
            ..Default::default()
        });
        r.migration_lease = Some(LeaseObservation { holder: Some("ccm-aws-1_x".into()), fresh: true });
        let out = r.step(deployment(), false);
        assert!(out.changed);
        let want = crds::v1alpha1::MigrationLeaseStatus {
            namespace: "ccm-moving".into(),
            name: "cloud-provider-extraction-migration".into(),
            holder: Some("ccm-aws-1_x".into()),
        };
        assert_eq!(out.status.migration_lease.as_ref(), Some(&want));
        assert_eq!(out.apply_body()["status"]["migrationLease"]["namespace"], "ccm-moving");
        assert!(!r.step(deployment(), false).changed, "unchanged: no write");
        // A holder that stopped renewing is not shown.
        r.migration_lease = Some(LeaseObservation { holder: Some("ccm-aws-1_x".into()), fresh: false });
        assert_eq!(r.step(deployment(), false).status.migration_lease.unwrap().holder, None);
        // Migration off: the field goes (a write, though the desired value is absent).
        r.cr.spec.leader_election.migration = None;
        let out = r.step(deployment(), false);
        assert!(out.changed);
        assert!(out.apply_body()["status"].get("migrationLease").is_none());
    }

    #[test]
    fn available_needs_an_available_replica_and_a_fresh_leader() {
        let mut r = Run::new("Deployment");
        r.step(deploy(2, 2, 2, 0), false);
        assert_eq!(r.cond(types::AVAILABLE).reason, available::NO_AVAILABLE_REPLICAS);
        r.lease = Some(LeaseObservation { holder: Some("pod-a".into()), fresh: false });
        r.step(deploy(2, 2, 2, 2), false);
        assert_eq!(r.cond(types::AVAILABLE).reason, available::NO_LEADER);
        assert!(r.cond(types::AVAILABLE).message.contains("stopped renewing"));
        assert_eq!(r.cr.status.as_ref().unwrap().leader, None);
        r.lease = None;
        r.step(deploy(2, 2, 2, 2), false);
        assert_eq!(r.cond(types::AVAILABLE).reason, available::NO_LEADER);
        r.lease = Some(leader());
        r.step(deploy(2, 2, 2, 2), false);
        assert_eq!(r.cond(types::AVAILABLE).status, "True");
        assert_eq!(r.cr.status.as_ref().unwrap().leader.as_deref(), Some("pod-a"));
    }

    #[test]
    fn invalid_config_is_degraded_at_once_and_not_deployed() {
        let mut r = Run::new("Deployment");
        r.validation = Validation::Invalid {
            failures: vec![Failure {
                reason: config_valid::SECRET_NOT_FOUND,
                message: "Secret \"x\" does not exist".into(),
            }],
            conflicts_with: vec![],
        };
        r.step(Workload::None, false);
        assert_eq!(r.cond(types::CONFIG_VALID).reason, config_valid::SECRET_NOT_FOUND);
        assert_eq!(r.cond(types::DEGRADED).status, "True");
        assert!(r.cond(types::DEGRADED).message.contains("SecretNotFound"));
        assert_eq!(r.cond(types::AVAILABLE).reason, available::NOT_DEPLOYED);
        assert_eq!(r.cond(types::READY).reason, ready_reasons::CONFIG_INVALID);
    }

    #[test]
    fn transient_failures_degrade_only_after_the_window_and_list_every_cause() {
        let mut r = Run::new("Deployment");
        r.transient = TransientFailures {
            since: Some(at(100)),
            causes: vec![
                (degraded::APPLY_FAILED, "Deployment: 500".into()),
                (degraded::SECRET_UNREADABLE, "503".into()),
            ],
        };
        r.step(deploy(2, 2, 2, 2), false);
        assert_eq!(r.cond(types::DEGRADED).status, "False");
        r.now = 100 + 120;
        r.step(deploy(2, 2, 2, 2), false);
        let d = r.cond(types::DEGRADED);
        assert_eq!((d.status.as_str(), d.reason.as_str()), ("True", degraded::APPLY_FAILED));
        assert!(d.message.contains("ApplyFailed: Deployment: 500") && d.message.contains("SecretUnreadable: 503"));
        r.transient = TransientFailures::default();
        r.step(deploy(2, 2, 2, 2), false);
        assert_eq!(r.cond(types::DEGRADED).status, "False");
    }

    #[test]
    fn stalled_rollout_is_degraded_at_once() {
        let mut r = Run::new("Deployment");
        let mut w = deploy(2, 2, 1, 1);
        if let Workload::Deployment(d) = &mut w {
            d.deadline_exceeded = true;
        }
        r.step(w, false);
        assert_eq!(r.cond(types::DEGRADED).reason, degraded::ROLLOUT_STALLED);
    }

    #[test]
    fn unreadable_secret_keeps_the_previous_config_verdict() {
        let mut r = Run::new("Deployment");
        r.step(deploy(2, 2, 2, 2), false);
        r.validation = Validation::Unknown(Failure { reason: config_valid::SECRET_UNREADABLE, message: "503".into() });
        let out = r.step(deploy(2, 2, 2, 2), false);
        assert_eq!(r.cond(types::CONFIG_VALID).status, "True");
        assert!(!out.changed);
    }

    #[test]
    fn embedded_engine_states_map_to_conditions() {
        let mut r = Run::new("Embedded");
        r.step(Workload::Embedded(EngineState::Starting), true);
        assert_eq!(r.cond(types::PROGRESSING).reason, progressing::ENGINE_STARTING);
        assert_eq!(r.cond(types::AVAILABLE).reason, available::ENGINE_NOT_RUNNING);
        r.step(Workload::Embedded(EngineState::Running), false);
        assert_eq!(r.cond(types::PROGRESSING).status, "False");
        assert_eq!(r.cond(types::AVAILABLE).status, "True");
        r.step(Workload::Embedded(EngineState::Failed("provider init: 401".into())), false);
        assert_eq!(r.cond(types::DEGRADED).reason, degraded::ENGINE_FAILED);
    }

    #[test]
    fn status_carries_observed_generation_and_resolved_controllers() {
        let mut r = Run::new("Deployment");
        r.cr.spec.controllers = vec!["*".into(), "-route".into()];
        r.cr.metadata.generation = Some(7);
        let out = r.step(deploy(2, 2, 2, 1), false);
        let s = out.status;
        assert_eq!(s.observed_generation, Some(7));
        assert_eq!(
            s.controllers.unwrap(),
            ["cloud-node-controller", "cloud-node-lifecycle-controller", "service-lb-controller"]
        );
        assert_eq!((s.replicas, s.ready_replicas), (Some(2), Some(1)));
        assert!(s.conditions.iter().all(|c| c.observed_generation == Some(7)));
    }

    #[test]
    fn degraded_requeue_fires_when_the_window_ends() {
        let t = TransientFailures { since: Some(at(100)), causes: vec![] };
        assert_eq!(requeue_for_degraded(&t, Duration::from_secs(120), &at(150)), Some(Duration::from_secs(70)));
        assert_eq!(requeue_for_degraded(&t, Duration::from_secs(120), &at(300)), None);
    }

    #[test]
    fn the_leaders_manager_is_found_by_pod_name_or_on_the_host_network_by_node() {
        let pod = |name: &str, node: &str, profile: Option<&str>| ManagerPod {
            name: name.into(),
            node: Some(node.into()),
            upstream_profile: profile.map(str::to_string),
        };
        // A switch under way: the old upstream Pod on node-2 (being deleted), the new one on node-3.
        let managers = [pod("ccm-aws-old", "node-2", Some("aws")), pod("ccm-aws-new", "node-3", None)];
        assert_eq!(leader_manager("node-2_0b9f-11", &managers).as_deref(), Some("upstream/aws"));
        assert_eq!(leader_manager("node-3_77aa", &managers).as_deref(), Some(MANAGER_NAME));
        assert_eq!(leader_manager("ccm-aws-new_77aa", &managers).as_deref(), Some(MANAGER_NAME));
        // A holder that is no Pod of the resource (a manager run by hand) is not guessed.
        assert_eq!(leader_manager("laptop_1234", &managers), None);
    }

    fn crash_looping() -> PodsObservation {
        PodsObservation {
            pods: 2,
            failing: vec![FailingContainer {
                name: "ccm-aws-1/cloud-controller-manager".into(),
                reason: degraded::MANAGER_CRASH_LOOPING,
                detail: "CrashLoopBackOff, 3 restarts, last exit code 1 (Error)".into(),
            }],
            managers: Vec::new(),
        }
    }

    #[test]
    fn a_crash_looping_manager_is_degraded_at_once_and_provider_health_stops_claiming_health() {
        let mut r = Run::new("Deployment");
        r.step(deploy(2, 2, 2, 2), false);
        // The manager reported health, then its pods crash-loop: no replica ready, no leader.
        let mut healthy = r.cond(types::PROVIDER_HEALTHY);
        (healthy.status, healthy.reason) = ("True".into(), "Healthy".into());
        r.cr.status.as_mut().unwrap().conditions.retain(|c| c.type_ != types::PROVIDER_HEALTHY);
        r.cr.status.as_mut().unwrap().conditions.push(healthy);
        r.lease = Some(LeaseObservation { holder: Some("pod-a".into()), fresh: false });
        r.pods = crash_looping();
        let out = r.step(deploy(2, 2, 2, 0), false);
        // No transient window: the kubelet's back-off already is one.
        let degraded = r.cond(types::DEGRADED);
        assert_eq!((degraded.status.as_str(), degraded.reason.as_str()), ("True", degraded::MANAGER_CRASH_LOOPING));
        assert!(degraded.message.contains("ccm-aws-1/cloud-controller-manager: CrashLoopBackOff, 3 restarts"));
        let health = r.cond(types::PROVIDER_HEALTHY);
        assert_eq!((health.status.as_str(), health.reason.as_str()), ("Unknown", provider_healthy::NO_MANAGER_RUNNING));
        assert!(out.owns_provider_healthy, "the operator takes the condition over");
        assert!(
            out.apply_body()["status"]["conditions"].as_array().unwrap().iter().any(|c| c["type"] == "ProviderHealthy")
        );
        assert_eq!(r.cond(types::READY).status, "False");
        // Recovered: a replica is ready and leads; Degraded clears, the operator waits for a report.
        r.pods = PodsObservation { pods: 2, failing: Vec::new(), managers: Vec::new() };
        r.lease = Some(leader());
        r.step(deploy(2, 2, 2, 2), false);
        assert_eq!(r.cond(types::DEGRADED).status, "False");
        assert_eq!(r.cond(types::PROVIDER_HEALTHY).reason, provider_healthy::AWAITING_MANAGER);
    }

    #[test]
    fn a_running_manager_keeps_its_provider_health_even_with_no_replica_ready() {
        // Readiness failing while the leader still renews: the manager reports, leave it alone.
        let mut r = Run::new("Deployment");
        r.step(deploy(2, 2, 2, 2), false);
        let mut healthy = r.cond(types::PROVIDER_HEALTHY);
        (healthy.status, healthy.reason) = ("True".into(), "Healthy".into());
        r.cr.status.as_mut().unwrap().conditions.retain(|c| c.type_ != types::PROVIDER_HEALTHY);
        r.cr.status.as_mut().unwrap().conditions.push(healthy);
        let out = r.step(deploy(2, 2, 2, 0), false);
        assert!(!out.owns_provider_healthy);
        assert_eq!(r.cond(types::PROVIDER_HEALTHY).reason, "Healthy");
        // Nothing deployed (an invalid spec leaves a previous manager running): left alone too.
        let out = r.step(Workload::None, false);
        assert!(!out.owns_provider_healthy);
    }

    #[test]
    fn a_manager_that_cannot_start_is_degraded_with_its_own_reason() {
        let mut r = Run::new("DaemonSet");
        r.pods = PodsObservation {
            pods: 1,
            failing: vec![FailingContainer {
                name: "ccm-aws-x/cloud-controller-manager".into(),
                reason: degraded::MANAGER_CANNOT_START,
                detail: "ImagePullBackOff, 0 restarts".into(),
            }],
            managers: Vec::new(),
        };
        r.lease = None;
        r.step(daemonset(1, 1, 1, 0), false);
        assert_eq!(r.cond(types::DEGRADED).reason, degraded::MANAGER_CANNOT_START);
        // Never reported: still awaited, not "no longer running".
        assert_eq!(r.cond(types::PROVIDER_HEALTHY).reason, provider_healthy::AWAITING_MANAGER);
    }

    #[test]
    fn a_daemonset_that_matches_no_node_says_so() {
        let mut r = Run::new("DaemonSet");
        r.step(daemonset(0, 0, 0, 0), false);
        let available = r.cond(types::AVAILABLE);
        assert_eq!((available.status.as_str(), available.reason.as_str()), ("False", available::NO_MATCHING_NODES));
        assert!(available.message.contains("node-role.kubernetes.io/control-plane"), "{}", available.message);
        assert!(available.message.contains("nodeSelector") && available.message.contains("tolerations"));
        // Not before the DaemonSet controller has looked at this generation.
        let mut fresh = daemonset(0, 0, 0, 0);
        if let Workload::DaemonSet(d) = &mut fresh {
            d.generation = 2;
        }
        r.step(fresh, false);
        assert_eq!(r.cond(types::AVAILABLE).reason, available::NO_AVAILABLE_REPLICAS);
    }
}
