//! Shadow mode: every enabled controller decides as usual but acts on nothing.
//!
//! In shadow mode a controller watches, asks the provider only reads, works out what it
//! would write to each Node and Service and which load balancers and routes it would create,
//! update or delete, and records each of those as a typed [`Difference`] against what is
//! there, in the manager's [`Shadow`] record. Nothing is written to Nodes, Services or routes;
//! the engine wraps the provider in [`ShadowProvider`], which refuses every mutating call.
//! The record feeds the `ShadowAgrees` condition and `status.shadow` (the status reporter),
//! `ccm_shadow_differences{controller,kind}` (metrics) and one event per differing object.
//! See docs/shadow.md.

pub mod provider;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use crate::metrics::Metrics;

pub use provider::ShadowProvider;

/// Most differences listed in a report (`status.shadow.differences`).
pub const REPORT_LIMIT: usize = 20;
/// Most field paths kept per difference.
pub const MAX_FIELDS: usize = 16;
/// Longest field path or value kept, in bytes; longer ones are cut with [`ELLIPSIS`].
pub const MAX_TEXT: usize = 256;
/// Most objects recorded per controller; further differing objects are counted, not kept.
pub const MAX_OBJECTS_PER_CONTROLLER: usize = 100_000;
/// Marks a cut value.
pub const ELLIPSIS: &str = "...";
/// Reason of the event published for an object whose decisions differ.
pub const EVENT_REASON: &str = "ShadowDifference";

/// What the manager would have done that is not already so.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DifferenceKind {
    /// It would patch the object (labels, providerID, taints, addresses, finalizers, status).
    WouldPatch,
    /// It would delete the object (a Node whose instance is gone).
    WouldDelete,
    /// The object holds a value this manager would have written otherwise, in a field it
    /// writes only once (the labels and providerID of an initialized Node), so it would not
    /// rewrite it now.
    Differs,
    /// It would ask the cloud for a load balancer the cloud does not have.
    WouldCreateLoadBalancer,
    /// It would ask the cloud to change a load balancer.
    WouldUpdateLoadBalancer,
    /// It would ask the cloud to delete a load balancer.
    WouldDeleteLoadBalancer,
    /// It would create a route.
    WouldCreateRoute,
    /// It would delete a route.
    WouldDeleteRoute,
}

impl DifferenceKind {
    /// Every kind.
    pub const ALL: [DifferenceKind; 8] = [
        DifferenceKind::WouldPatch,
        DifferenceKind::WouldDelete,
        DifferenceKind::Differs,
        DifferenceKind::WouldCreateLoadBalancer,
        DifferenceKind::WouldUpdateLoadBalancer,
        DifferenceKind::WouldDeleteLoadBalancer,
        DifferenceKind::WouldCreateRoute,
        DifferenceKind::WouldDeleteRoute,
    ];

    /// The kebab-case name used in reports, metrics and events.
    pub fn as_str(self) -> &'static str {
        match self {
            DifferenceKind::WouldPatch => "would-patch",
            DifferenceKind::WouldDelete => "would-delete",
            DifferenceKind::Differs => "differs",
            DifferenceKind::WouldCreateLoadBalancer => "would-create-load-balancer",
            DifferenceKind::WouldUpdateLoadBalancer => "would-update-load-balancer",
            DifferenceKind::WouldDeleteLoadBalancer => "would-delete-load-balancer",
            DifferenceKind::WouldCreateRoute => "would-create-route",
            DifferenceKind::WouldDeleteRoute => "would-delete-route",
        }
    }
}

impl fmt::Display for DifferenceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The object a difference is about. Routes are named `<node>/<destination CIDR>`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey {
    /// `Node`, `Service` or `Route`.
    pub kind: &'static str,
    /// Empty for cluster-scoped objects.
    pub namespace: String,
    /// The name.
    pub name: String,
}

impl ObjectKey {
    /// A Node.
    pub fn node(name: impl Into<String>) -> Self {
        Self { kind: "Node", namespace: String::new(), name: name.into() }
    }

    /// A Service.
    pub fn service(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self { kind: "Service", namespace: namespace.into(), name: name.into() }
    }

    /// A cloud route, named after its target and destination.
    pub fn route(target: &str, destination: &str) -> Self {
        Self { kind: "Route", namespace: String::new(), name: format!("{target}/{destination}") }
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.namespace.is_empty() {
            write!(f, "{}/{}", self.kind, self.name)
        } else {
            write!(f, "{}/{}/{}", self.kind, self.namespace, self.name)
        }
    }
}

/// One field that differs and the value this manager would give it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldDifference {
    /// The field path, for example `metadata.labels[topology.kubernetes.io/zone]`.
    pub path: String,
    /// Our value, rendered short (JSON for structures); empty for a removal.
    pub ours: String,
}

impl FieldDifference {
    /// A field and our value, both cut to [`MAX_TEXT`].
    pub fn new(path: impl Into<String>, ours: impl Into<String>) -> Self {
        Self { path: bounded(path.into()), ours: bounded(ours.into()) }
    }
}

/// One decision this manager would act on, about one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Difference {
    /// The controller that decided (canonical name).
    pub controller: &'static str,
    /// The object.
    pub object: ObjectKey,
    /// What it would do.
    pub kind: DifferenceKind,
    /// The fields concerned (at most [`MAX_FIELDS`]).
    pub fields: Vec<FieldDifference>,
}

impl Difference {
    /// A difference with these fields, kept to [`MAX_FIELDS`].
    pub fn new(
        controller: &'static str,
        object: ObjectKey,
        kind: DifferenceKind,
        mut fields: Vec<FieldDifference>,
    ) -> Self {
        fields.truncate(MAX_FIELDS);
        Self { controller, object, kind, fields }
    }

    /// One line for events and logs: kind, then `path=ours` pairs, bounded.
    pub fn summary(&self) -> String {
        let fields: Vec<String> = self
            .fields
            .iter()
            .map(|f| if f.ours.is_empty() { f.path.clone() } else { format!("{}={}", f.path, f.ours) })
            .collect();
        let line =
            if fields.is_empty() { self.kind.to_string() } else { format!("{}: {}", self.kind, fields.join(", ")) };
        bounded_to(line, 1024)
    }
}

/// Cut `s` to [`MAX_TEXT`] bytes on a character boundary.
pub fn bounded(s: String) -> String {
    bounded_to(s, MAX_TEXT)
}

fn bounded_to(mut s: String, max: usize) -> String {
    if s.len() <= max {
        return s;
    }
    let mut cut = max.saturating_sub(ELLIPSIS.len());
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    s.truncate(cut);
    s.push_str(ELLIPSIS);
    s
}

/// Counts by controller and kind.
pub type Counts = BTreeMap<(&'static str, DifferenceKind), usize>;

/// What the record says now, for the status and the condition.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Summary {
    /// Controllers that finished at least one full pass.
    pub compared: Vec<&'static str>,
    /// Controllers running in shadow mode that have not finished a full pass yet.
    pub pending: Vec<&'static str>,
    /// Differences by controller and kind.
    pub counts: Counts,
    /// All differences (sum of `counts`).
    pub total: usize,
    /// Objects that differ.
    pub objects: usize,
    /// The first differences in (controller, object, kind) order, at most the limit asked for.
    pub first: Vec<Difference>,
}

impl Summary {
    /// Whether every controller compared and none differs.
    pub fn agrees(&self) -> bool {
        self.pending.is_empty() && self.total == 0
    }

    /// `controller kind=n, ...` for the condition's message; "no differences" when empty.
    pub fn counts_text(&self) -> String {
        if self.counts.is_empty() {
            return "no differences".to_string();
        }
        self.counts.iter().map(|((c, k), n)| format!("{c} {k}={n}")).collect::<Vec<_>>().join(", ")
    }
}

#[derive(Default)]
struct State {
    /// Per controller, per object, the differences of its latest evaluation.
    objects: BTreeMap<&'static str, BTreeMap<ObjectKey, Vec<Difference>>>,
    /// Per controller, whether a full pass finished.
    passes: BTreeMap<&'static str, u64>,
    /// Objects not kept because a controller's record was full.
    overflow: BTreeMap<&'static str, usize>,
}

/// The manager's shadow record: cheap to clone, shared by the controllers (which write it)
/// and the status reporter (which reads it). Present in [`crate::options::ControllerOptions`]
/// exactly when the manager runs in shadow mode.
#[derive(Clone, Default)]
pub struct Shadow {
    state: Arc<Mutex<State>>,
}

impl fmt::Debug for Shadow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shadow").finish_non_exhaustive()
    }
}

/// Shadow records are equal when they are the same record.
impl PartialEq for Shadow {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.state, &other.state)
    }
}

impl Shadow {
    /// An empty record.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Announce that `controller` compares in shadow mode (it counts as pending until its
    /// first full pass).
    pub fn register(&self, controller: &'static str) {
        let mut state = self.lock();
        state.passes.entry(controller).or_insert(0);
        state.objects.entry(controller).or_default();
    }

    /// Record the latest evaluation of one object by `controller` (an empty list: it agrees).
    /// Returns whether its differences changed, so the caller publishes one event per change.
    pub fn set(&self, controller: &'static str, object: ObjectKey, differences: Vec<Difference>) -> bool {
        let mut state = self.lock();
        let State { objects, overflow, .. } = &mut *state;
        let map = objects.entry(controller).or_default();
        if differences.is_empty() {
            return map.remove(&object).is_some();
        }
        if map.len() >= MAX_OBJECTS_PER_CONTROLLER && !map.contains_key(&object) {
            *overflow.entry(controller).or_insert(0) += 1;
            return false;
        }
        match map.get(&object) {
            Some(old) if *old == differences => false,
            _ => {
                map.insert(object, differences);
                true
            }
        }
    }

    /// After a full pass of `controller`: forget objects `keep` rejects (gone, or now out of
    /// its scope) and count the pass.
    pub fn finish_pass(&self, controller: &'static str, mut keep: impl FnMut(&ObjectKey) -> bool) {
        let mut state = self.lock();
        if let Some(map) = state.objects.get_mut(controller) {
            map.retain(|k, _| keep(k));
        }
        state.overflow.remove(controller);
        *state.passes.entry(controller).or_insert(0) += 1;
    }

    /// Full passes `controller` finished.
    pub fn passes(&self, controller: &str) -> u64 {
        self.lock().passes.get(controller).copied().unwrap_or(0)
    }

    /// The differences recorded for one object by one controller.
    pub fn differences_of(&self, controller: &str, object: &ObjectKey) -> Vec<Difference> {
        self.lock().objects.get(controller).and_then(|m| m.get(object)).cloned().unwrap_or_default()
    }

    /// The record now, listing at most `limit` differences.
    pub fn summary(&self, limit: usize) -> Summary {
        let state = self.lock();
        summarize(&state, limit)
    }
}

fn summarize(state: &State, limit: usize) -> Summary {
    let mut out = Summary::default();
    for (controller, passes) in &state.passes {
        if *passes > 0 { out.compared.push(*controller) } else { out.pending.push(*controller) }
    }
    let mut seen = std::collections::BTreeSet::new();
    for (controller, map) in &state.objects {
        for (object, differences) in map {
            seen.insert(object);
            for d in differences {
                *out.counts.entry((*controller, d.kind)).or_insert(0) += 1;
                out.total += 1;
                if out.first.len() < limit {
                    out.first.push(d.clone());
                }
            }
        }
    }
    out.objects = seen.len();
    out
}

/// Labels of the shadow metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DifferenceLabels {
    /// The controller.
    pub controller: String,
    /// The kind of difference.
    pub kind: String,
}

/// Labels of the refused-call counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallLabels {
    /// The provider method.
    pub method: String,
}

/// The shadow metric families.
#[derive(Clone, Debug)]
pub struct ShadowMetrics {
    differences: Family<DifferenceLabels, Gauge>,
    refused: Family<CallLabels, Counter>,
    passes: Family<DifferenceLabels, Counter>,
}

impl ShadowMetrics {
    /// Register (or find) the families in `metrics`.
    pub fn register(metrics: &Metrics) -> Self {
        Self {
            differences: metrics.get_or_register(
                "ccm_shadow_differences",
                "Shadow mode: differences between this manager's decisions and the cluster, by controller and kind.",
                Family::default,
            ),
            refused: metrics.get_or_register(
                "ccm_shadow_refused_calls",
                "Shadow mode: mutating cloud calls refused before reaching the provider, by method.",
                Family::default,
            ),
            passes: metrics.get_or_register(
                "ccm_shadow_passes",
                "Shadow mode: full comparison passes finished, by controller (kind is \"all\").",
                Family::default,
            ),
        }
    }

    /// Set the difference gauges of `controller` from `summary` (every kind, zeros included).
    pub fn observe(&self, controller: &'static str, summary: &Summary) {
        for kind in DifferenceKind::ALL {
            let n = summary.counts.get(&(controller, kind)).copied().unwrap_or(0);
            self.differences
                .get_or_create(&DifferenceLabels { controller: controller.into(), kind: kind.as_str().into() })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    /// Count a finished full pass of `controller`.
    pub fn pass(&self, controller: &'static str) {
        self.passes.get_or_create(&DifferenceLabels { controller: controller.into(), kind: "all".into() }).inc();
    }

    /// Count a refused call.
    pub fn refused(&self, method: &str) {
        self.refused.get_or_create(&CallLabels { method: method.into() }).inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn diff(controller: &'static str, node: &str, kind: DifferenceKind) -> Difference {
        Difference::new(controller, ObjectKey::node(node), kind, vec![FieldDifference::new("spec.providerID", "x")])
    }

    #[test]
    fn a_controller_is_pending_until_its_first_full_pass_and_then_agrees_without_differences() {
        let shadow = Shadow::new();
        shadow.register("cloud-node-controller");
        let s = shadow.summary(REPORT_LIMIT);
        assert!(!s.agrees());
        assert_eq!(s.pending, vec!["cloud-node-controller"]);
        shadow.finish_pass("cloud-node-controller", |_| true);
        let s = shadow.summary(REPORT_LIMIT);
        assert!(s.agrees(), "{s:?}");
        assert_eq!(s.counts_text(), "no differences");
    }

    #[test]
    fn set_reports_a_change_once_and_an_empty_list_clears_the_object() {
        let shadow = Shadow::new();
        let d = vec![diff("c", "n1", DifferenceKind::WouldPatch)];
        assert!(shadow.set("c", ObjectKey::node("n1"), d.clone()));
        assert!(!shadow.set("c", ObjectKey::node("n1"), d), "the same differences are no change");
        assert!(shadow.set("c", ObjectKey::node("n1"), Vec::new()));
        assert!(!shadow.set("c", ObjectKey::node("n1"), Vec::new()));
        assert_eq!(shadow.summary(REPORT_LIMIT).total, 0);
    }

    #[test]
    fn summary_counts_by_controller_and_kind_and_lists_at_most_the_limit() {
        let shadow = Shadow::new();
        for i in 0..30 {
            let name = format!("n{i:02}");
            shadow.set("node", ObjectKey::node(&name), vec![diff("node", &name, DifferenceKind::Differs)]);
        }
        shadow.set(
            "service",
            ObjectKey::service("d", "s"),
            vec![Difference::new(
                "service",
                ObjectKey::service("d", "s"),
                DifferenceKind::WouldCreateLoadBalancer,
                vec![],
            )],
        );
        shadow.finish_pass("node", |_| true);
        shadow.finish_pass("service", |_| true);
        let s = shadow.summary(REPORT_LIMIT);
        assert_eq!(s.total, 31);
        assert_eq!(s.objects, 31);
        assert_eq!(s.first.len(), REPORT_LIMIT);
        assert_eq!(s.counts[&("node", DifferenceKind::Differs)], 30);
        assert_eq!(s.counts_text(), "node differs=30, service would-create-load-balancer=1");
        assert!(!s.agrees());
    }

    #[test]
    fn a_full_pass_forgets_objects_that_are_gone() {
        let shadow = Shadow::new();
        shadow.set("c", ObjectKey::node("a"), vec![diff("c", "a", DifferenceKind::WouldDelete)]);
        shadow.set("c", ObjectKey::node("b"), vec![diff("c", "b", DifferenceKind::WouldDelete)]);
        shadow.finish_pass("c", |k| k.name == "a");
        assert_eq!(shadow.summary(10).total, 1);
        assert_eq!(shadow.passes("c"), 1);
    }

    #[test]
    fn long_paths_and_values_are_cut_on_a_character_boundary() {
        let f = FieldDifference::new("p".repeat(1000), "é".repeat(1000));
        assert!(f.path.len() <= MAX_TEXT && f.path.ends_with(ELLIPSIS));
        assert!(f.ours.len() <= MAX_TEXT && f.ours.ends_with(ELLIPSIS));
        let many = (0..100).map(|i| FieldDifference::new(format!("f{i}"), "v")).collect();
        let d = Difference::new("c", ObjectKey::node("n"), DifferenceKind::WouldPatch, many);
        assert_eq!(d.fields.len(), MAX_FIELDS);
        assert!(d.summary().len() <= 1024);
    }
}
