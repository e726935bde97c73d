//! Pure decisions of the route controller: the keep/add/update/delete table (R8, R9), which
//! routes it is responsible for, the `NetworkUnavailable` condition (R12, R13), and when
//! watch-based passes run and how they are counted (R14–R16).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeCondition};

use crate::provider::Route;

/// Most route creations and deletions in flight at once (upstream's
/// `maxConcurrentRouteOperations`).
pub const MAX_ROUTE_OPERATIONS: usize = 200;
/// The Node condition this controller owns.
pub const NETWORK_UNAVAILABLE: &str = "NetworkUnavailable";
/// Reason when every pod CIDR of the Node has its route.
pub const REASON_ROUTE_CREATED: &str = "RouteCreated";
/// Reason when some route is missing.
pub const REASON_NO_ROUTE_CREATED: &str = "NoRouteCreated";
/// Message with [`REASON_ROUTE_CREATED`].
pub const MESSAGE_ROUTE_CREATED: &str = "RouteController created a route";
/// Message with [`REASON_NO_ROUTE_CREATED`].
pub const MESSAGE_NO_ROUTE_CREATED: &str = "RouteController failed to create a route";
/// First retry delay after a failed route operation.
pub const RETRY_BASE: Duration = Duration::from_secs(1);
/// Largest retry delay after failed route operations.
pub const RETRY_MAX: Duration = Duration::from_secs(300);

/// What happens to one (Node, pod CIDR) pair (R8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// The route exists and is right.
    Keep,
    /// No route for this CIDR: create it.
    Add,
    /// A route exists with stale Node addresses: delete and recreate it.
    Update,
}

/// A route to create for a Node.
#[derive(Debug, Clone, PartialEq)]
pub struct Creation {
    /// The Node's UID, the cloud-side name hint.
    pub name_hint: String,
    /// The route.
    pub route: Route,
}

/// One reconcile pass worked out from the cloud's routes and the cached Nodes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    /// Routes to delete (R9), listed before creations.
    pub deletions: Vec<Route>,
    /// Routes to create (R11).
    pub creations: Vec<Creation>,
    /// Per Node, the action of each pod CIDR; an empty map marks a Node that has routes but
    /// no pod CIDRs (R12).
    pub actions: BTreeMap<String, BTreeMap<String, Action>>,
    /// Whether every deletion must finish before any creation starts (R10).
    pub deletions_first: bool,
    /// Listed routes whose CIDR does not parse; left alone.
    pub unparsable: Vec<String>,
}

fn address_set(addresses: &[NodeAddress]) -> BTreeSet<(&str, &str)> {
    addresses.iter().map(|a| (a.type_.as_str(), a.address.as_str())).collect()
}

fn pod_cidrs(node: &Node) -> Vec<String> {
    let spec = node.spec.as_ref();
    match spec.and_then(|s| s.pod_cidrs.clone()).filter(|c| !c.is_empty()) {
        Some(cidrs) => cidrs,
        None => spec.and_then(|s| s.pod_cidr.clone()).into_iter().filter(|c| !c.is_empty()).collect(),
    }
}

fn node_addresses(node: &Node) -> Vec<NodeAddress> {
    node.status.as_ref().and_then(|s| s.addresses.clone()).unwrap_or_default()
}

/// R9: the controller is responsible for a route whose first or last address lies inside one of
/// the cluster CIDRs. `None` when the route's CIDR does not parse.
pub fn is_responsible(destination: &str, cluster_cidrs: &[IpNet]) -> Option<bool> {
    let net: IpNet = destination.trim().parse().ok()?;
    let (first, last) = (net.network(), net.broadcast());
    Some(cluster_cidrs.iter().any(|c| c.contains(&first) || c.contains(&last)))
}

/// R8–R10: the plan for one pass.
pub fn plan(routes: &[Route], nodes: &[&Node], cluster_cidrs: &[IpNet]) -> Plan {
    let mut out = Plan { deletions_first: routes.first().is_some_and(|r| r.enable_node_addresses), ..Plan::default() };

    // Node name -> destination -> route, for live routes that name a target. A blackhole does
    // not count as the route of its CIDR: it is deleted and replaced in the same pass.
    let mut existing: BTreeMap<&str, BTreeMap<&str, &Route>> = BTreeMap::new();
    for r in routes.iter().filter(|r| !r.target_node.is_empty() && !r.blackhole) {
        existing.entry(r.target_node.as_str()).or_default().insert(r.destination_cidr.as_str(), r);
    }

    let mut known: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for node in nodes {
        let name = node.metadata.name.as_deref().unwrap_or_default();
        let cidrs = pod_cidrs(node);
        known.insert(name, cidrs.clone());
        if cidrs.is_empty() {
            continue; // R7
        }
        let addresses = node_addresses(node);
        let mine = existing.get(name);
        let actions = out.actions.entry(name.to_string()).or_default();
        for cidr in cidrs {
            let action = match mine.and_then(|m| m.get(cidr.as_str())) {
                Some(r) if !r.enable_node_addresses => Action::Keep,
                Some(r) if address_set(&r.target_node_addresses) == address_set(&addresses) => Action::Keep,
                Some(_) => Action::Update,
                None => Action::Add,
            };
            if action != Action::Keep {
                out.creations.push(Creation {
                    name_hint: node.metadata.uid.clone().unwrap_or_default(),
                    route: Route {
                        target_node: name.to_string(),
                        target_node_addresses: addresses.clone(),
                        destination_cidr: cidr.clone(),
                        ..Route::default()
                    },
                });
            }
            actions.insert(cidr, action);
        }
    }

    for r in routes {
        match is_responsible(&r.destination_cidr, cluster_cidrs) {
            None => {
                out.unparsable.push(r.destination_cidr.clone());
                continue;
            }
            Some(false) => continue,
            Some(true) => {}
        }
        let delete = match known.get(r.target_node.as_str()) {
            _ if r.blackhole => true,
            None => true, // unknown or empty target
            Some(cidrs) if !cidrs.contains(&r.destination_cidr) => {
                if cidrs.is_empty() {
                    // R12: the Node has routes but no pod CIDRs.
                    out.actions.entry(r.target_node.clone()).or_default();
                }
                true
            }
            Some(_) => {
                out.actions.get(&r.target_node).and_then(|a| a.get(&r.destination_cidr)) == Some(&Action::Update)
            }
        };
        if delete {
            out.deletions.push(r.clone());
        }
    }
    // Replacing a route in place (same destination) also waits for the deletion.
    out.deletions_first |=
        out.deletions.iter().any(|d| out.creations.iter().any(|c| c.route.destination_cidr == d.destination_cidr));
    out
}

/// R12: the `NetworkUnavailable` status, reason and message for a Node's actions once the
/// pass is over (successful creations have become [`Action::Keep`]).
pub fn network_condition(actions: &BTreeMap<String, Action>) -> (&'static str, &'static str, &'static str) {
    if !actions.is_empty() && actions.values().all(|a| *a == Action::Keep) {
        ("False", REASON_ROUTE_CREATED, MESSAGE_ROUTE_CREATED)
    } else {
        ("True", REASON_NO_ROUTE_CREATED, MESSAGE_NO_ROUTE_CREATED)
    }
}

/// The Node's current `NetworkUnavailable` condition, if any.
pub fn current_condition(node: &Node) -> Option<&NodeCondition> {
    node.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == NETWORK_UNAVAILABLE)
}

/// R13: the condition is written only when its status or reason differs.
pub fn condition_needs_write(current: Option<&NodeCondition>, status: &str, reason: &str) -> bool {
    current.is_none_or(|c| c.status != status || c.reason.as_deref() != Some(reason))
}

/// Delay before retrying after `failures` consecutive passes with failed operations:
/// 1 s, doubling, at most 300 s.
pub fn retry_delay(failures: u32) -> Duration {
    let factor = 1u32.checked_shl(failures.saturating_sub(1)).unwrap_or(u32::MAX);
    RETRY_BASE.checked_mul(factor).map_or(RETRY_MAX, |d| d.min(RETRY_MAX))
}

/// Why a pass runs: the `trigger` label of `route_controller_route_sync_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Trigger {
    /// A Node was added or deleted or changed its pod CIDRs or addresses (and the pass at
    /// start, which upstream owes to the informer's initial Add events).
    NodeChange,
    /// The safety pass (or, with watch-based routes off, the fixed period).
    Periodic,
}

impl Trigger {
    /// The label value (upstream's).
    pub fn label(self) -> &'static str {
        match self {
            Trigger::NodeChange => "node_change",
            Trigger::Periodic => "periodic",
        }
    }
}

/// What a pass did: the `outcome` label of `route_controller_route_sync_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SyncOutcome {
    /// It created or deleted at least one route.
    Changed,
    /// Everything was in place.
    Noop,
    /// Listing the routes, or some operation, failed (ours: upstream counts no failed pass).
    Error,
}

impl SyncOutcome {
    /// The outcome of a pass with these counts.
    pub fn of(created: usize, deleted: usize, failed: usize) -> Self {
        if failed > 0 {
            SyncOutcome::Error
        } else if created + deleted > 0 {
            SyncOutcome::Changed
        } else {
            SyncOutcome::Noop
        }
    }

    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            SyncOutcome::Changed => "changed",
            SyncOutcome::Noop => "noop",
            SyncOutcome::Error => "error",
        }
    }
}

/// Whether a pass counts in `route_controller_route_corrections_total`: a safety pass that had
/// to create or delete a route, which a watched Node change should have caused earlier.
pub fn is_correction(trigger: Trigger, created: usize, deleted: usize) -> bool {
    trigger == Trigger::Periodic && created + deleted > 0
}

/// The next safety pass's delay: between `base` and twice `base`, by `random` (any `u64`), as
/// upstream's informer resync (12–24 h by default).
pub fn safety_delay(base: Duration, random: u64) -> Duration {
    // Integer arithmetic: a float product rounds the largest draws up to twice `base`.
    let nanos = base.as_nanos();
    let extra = nanos.saturating_mul(u128::from(random >> 11)) >> 53;
    base + Duration::from_nanos(u64::try_from(extra).unwrap_or(u64::MAX))
}

/// When watch-based passes run (R14): each requested trigger is kept until a pass starts;
/// passes start at most once per `min_interval` (upstream's bucket of one token per 10 s).
#[derive(Debug, Clone)]
pub struct WatchSchedule {
    min_interval: Duration,
    last_start: Option<Instant>,
    pending: Option<(Trigger, Instant)>,
}

impl WatchSchedule {
    /// No pass run yet, nothing pending.
    pub fn new(min_interval: Duration) -> Self {
        Self { min_interval, last_start: None, pending: None }
    }

    /// Ask for a pass for `trigger`, not before `at`. A Node change wins the label over a
    /// pending safety pass (both run as one pass).
    pub fn request(&mut self, trigger: Trigger, at: Instant) {
        self.pending = Some(match self.pending {
            None => (trigger, at),
            Some((pending, when)) => {
                let label = if pending == Trigger::NodeChange { pending } else { trigger };
                (label, when.min(at))
            }
        });
    }

    /// When the pending pass may start (`None`: nothing pending).
    pub fn due(&self) -> Option<Instant> {
        let (_, at) = self.pending?;
        Some(match self.last_start {
            Some(last) => at.max(last + self.min_interval),
            None => at,
        })
    }

    /// Start the pending pass at `now` (call once [`Self::due`] has passed): its trigger.
    pub fn start(&mut self, now: Instant) -> Option<Trigger> {
        let (trigger, _) = self.pending.take()?;
        self.last_start = Some(now);
        Some(trigger)
    }

    /// Whether a pass is pending.
    pub fn is_pending(&self) -> bool {
        self.pending.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeSpec, NodeStatus};
    use kube::api::ObjectMeta;

    fn cidrs(s: &[&str]) -> Vec<IpNet> {
        s.iter().map(|c| c.parse().unwrap()).collect()
    }

    fn addr(ip: &str) -> NodeAddress {
        NodeAddress { type_: "InternalIP".into(), address: ip.into() }
    }

    fn node(name: &str, pods: &[&str], ip: &str) -> Node {
        Node {
            metadata: ObjectMeta { name: Some(name.into()), uid: Some(format!("uid-{name}")), ..Default::default() },
            spec: Some(NodeSpec {
                pod_cidrs: (!pods.is_empty()).then(|| pods.iter().map(|s| s.to_string()).collect()),
                ..Default::default()
            }),
            status: Some(NodeStatus { addresses: Some(vec![addr(ip)]), ..Default::default() }),
        }
    }

    fn route(target: &str, cidr: &str, ip: Option<&str>) -> Route {
        Route {
            name: format!("r-{target}-{cidr}"),
            target_node: target.into(),
            enable_node_addresses: ip.is_some(),
            target_node_addresses: ip.map(|i| vec![addr(i)]).unwrap_or_default(),
            destination_cidr: cidr.into(),
            blackhole: false,
        }
    }

    fn destinations(rs: &[Route]) -> Vec<&str> {
        rs.iter().map(|r| r.destination_cidr.as_str()).collect()
    }

    #[test]
    fn r8_keep_add_and_update() {
        let nodes = [
            node("a", &["10.244.0.0/24"], "10.0.0.1"),
            node("b", &["10.244.1.0/24"], "10.0.0.2"),
            node("c", &["10.244.2.0/24"], "10.0.0.3"),
        ];
        let refs: Vec<&Node> = nodes.iter().collect();
        let routes = [route("a", "10.244.0.0/24", Some("10.0.0.1")), route("b", "10.244.1.0/24", Some("10.0.0.9"))];
        let p = plan(&routes, &refs, &cidrs(&["10.244.0.0/16"]));
        assert_eq!(p.actions["a"]["10.244.0.0/24"], Action::Keep);
        assert_eq!(p.actions["b"]["10.244.1.0/24"], Action::Update);
        assert_eq!(p.actions["c"]["10.244.2.0/24"], Action::Add);
        assert_eq!(destinations(&p.deletions), ["10.244.1.0/24"], "an update deletes the stale route first");
        let created: Vec<(&str, &str)> =
            p.creations.iter().map(|c| (c.route.target_node.as_str(), c.name_hint.as_str())).collect();
        assert_eq!(created, [("b", "uid-b"), ("c", "uid-c")]);
        assert_eq!(p.creations[0].route.target_node_addresses, vec![addr("10.0.0.2")]);
        assert!(p.deletions_first, "R10: the provider reports node addresses");
    }

    #[test]
    fn r8_addresses_are_ignored_without_enable_node_addresses_and_compared_as_sets() {
        let mut n = node("a", &["10.244.0.0/24"], "10.0.0.1");
        n.status.as_mut().unwrap().addresses =
            Some(vec![addr("10.0.0.1"), NodeAddress { type_: "Hostname".into(), address: "a".into() }]);
        let mut r = route("a", "10.244.0.0/24", Some("10.0.0.1"));
        r.target_node_addresses.insert(0, NodeAddress { type_: "Hostname".into(), address: "a".into() });
        let p = plan(&[r], &[&n], &cidrs(&["10.244.0.0/16"]));
        assert_eq!(p.actions["a"]["10.244.0.0/24"], Action::Keep, "same set, other order");
        let p = plan(&[route("a", "10.244.0.0/24", None)], &[&n], &cidrs(&["10.244.0.0/16"]));
        assert_eq!(p.actions["a"]["10.244.0.0/24"], Action::Keep);
        assert!(p.deletions.is_empty() && p.creations.is_empty());
        assert!(!p.deletions_first, "R10: creates and deletes overlap without node addresses");
        let p = plan(&[route("gone", "10.244.9.0/24", None)], &[&n], &cidrs(&["10.244.0.0/16"]));
        assert_eq!((p.deletions.len(), p.creations.len()), (1, 1));
        assert!(!p.deletions_first, "different destinations may overlap");
    }

    #[test]
    fn r9_deletes_blackholes_orphans_and_wrong_targets_inside_the_cluster_cidr_only() {
        let nodes = [node("a", &["10.244.0.0/24"], "10.0.0.1")];
        let refs: Vec<&Node> = nodes.iter().collect();
        let mut blackhole = route("a", "10.244.0.0/24", None);
        blackhole.blackhole = true;
        let routes = [
            blackhole,
            route("gone", "10.244.5.0/24", None),  // unknown target
            route("", "10.244.6.0/24", None),      // empty target
            route("a", "10.244.7.0/24", None),     // not one of a's pod CIDRs
            route("gone", "192.168.0.0/24", None), // outside the cluster CIDR: not ours
            route("gone", "not-a-cidr", None),     // unparsable: left alone
            route("gone", "10.0.0.0/8", None),     // a supernet of the cluster CIDR: not ours
            route("gone", "10.244.0.0/16", None),  // the cluster CIDR itself: ours
        ];
        let p = plan(&routes, &refs, &cidrs(&["10.244.0.0/16"]));
        assert_eq!(
            destinations(&p.deletions),
            ["10.244.0.0/24", "10.244.5.0/24", "10.244.6.0/24", "10.244.7.0/24", "10.244.0.0/16"]
        );
        assert_eq!(p.unparsable, ["not-a-cidr"]);
        // The blackhole for a's CIDR is replaced in the same pass, after its deletion.
        assert_eq!(p.actions["a"]["10.244.0.0/24"], Action::Add);
        assert_eq!(p.creations.len(), 1);
        assert!(p.deletions_first);
    }

    #[test]
    fn r9_dual_stack_cluster_cidrs() {
        let n = node("a", &["10.244.0.0/24", "fd00:10:244::/64"], "10.0.0.1");
        let p = plan(
            &[route("x", "fd00:10:244:1::/64", None), route("x", "fd00:99::/64", None)],
            &[&n],
            &cidrs(&["10.244.0.0/16", "fd00:10:244::/56"]),
        );
        assert_eq!(destinations(&p.deletions), ["fd00:10:244:1::/64"]);
        assert_eq!(p.creations.len(), 2);
    }

    #[test]
    fn r7_r12_nodes_without_pod_cidrs() {
        let bare = node("bare", &[], "10.0.0.1");
        let routed = node("routed", &[], "10.0.0.2");
        let p = plan(&[route("routed", "10.244.3.0/24", None)], &[&bare, &routed], &cidrs(&["10.244.0.0/16"]));
        assert!(!p.actions.contains_key("bare"), "no pod CIDRs and no routes: untouched");
        assert!(p.actions["routed"].is_empty(), "routes but no pod CIDRs: an empty action map");
        assert_eq!(network_condition(&p.actions["routed"]).0, "True");
        assert_eq!(destinations(&p.deletions), ["10.244.3.0/24"]);
    }

    #[test]
    fn r7_single_pod_cidr_field_is_used_when_pod_cidrs_is_unset() {
        let mut n = node("a", &[], "10.0.0.1");
        n.spec.as_mut().unwrap().pod_cidr = Some("10.244.0.0/24".into());
        let p = plan(&[], &[&n], &cidrs(&["10.244.0.0/16"]));
        assert_eq!(p.actions["a"]["10.244.0.0/24"], Action::Add);
    }

    #[test]
    fn r12_network_unavailable_outcomes() {
        let m = |a: &[Action]| a.iter().enumerate().map(|(i, a)| (i.to_string(), *a)).collect::<BTreeMap<_, _>>();
        assert_eq!(
            network_condition(&m(&[Action::Keep, Action::Keep])),
            ("False", "RouteCreated", MESSAGE_ROUTE_CREATED)
        );
        assert_eq!(
            network_condition(&m(&[Action::Keep, Action::Add])),
            ("True", "NoRouteCreated", MESSAGE_NO_ROUTE_CREATED)
        );
        assert_eq!(network_condition(&m(&[Action::Update])).1, "NoRouteCreated");
        assert_eq!(network_condition(&m(&[])).1, "NoRouteCreated");
    }

    #[test]
    fn r13_condition_written_only_when_status_or_reason_differs() {
        let c = |status: &str, reason: &str| NodeCondition {
            type_: NETWORK_UNAVAILABLE.into(),
            status: status.into(),
            reason: Some(reason.into()),
            ..Default::default()
        };
        assert!(condition_needs_write(None, "False", REASON_ROUTE_CREATED));
        assert!(!condition_needs_write(Some(&c("False", "RouteCreated")), "False", REASON_ROUTE_CREATED));
        assert!(
            condition_needs_write(Some(&c("False", "CalicoIsUp")), "False", REASON_ROUTE_CREATED),
            "R13: a CNI's False is overwritten"
        );
        assert!(condition_needs_write(Some(&c("True", "NoRouteCreated")), "False", REASON_ROUTE_CREATED));
        let mut n = node("a", &[], "10.0.0.1");
        n.status.as_mut().unwrap().conditions = Some(vec![c("True", "NoRouteCreated")]);
        assert_eq!(current_condition(&n).map(|c| c.status.as_str()), Some("True"));
    }

    #[test]
    fn retries_back_off_from_one_second_to_five_minutes() {
        let got: Vec<u64> = (1..=10).map(|n| retry_delay(n).as_secs()).collect();
        assert_eq!(got, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300]);
        assert_eq!(retry_delay(99), RETRY_MAX);
    }

    #[test]
    fn r14_watch_based_passes_start_at_most_once_per_interval_and_node_changes_keep_their_label() {
        let t0 = Instant::now();
        let ten = Duration::from_secs(10);
        let mut s = WatchSchedule::new(ten);
        assert_eq!(s.due(), None);
        s.request(Trigger::NodeChange, t0);
        assert_eq!(s.due(), Some(t0), "the first change after a quiet spell runs at once");
        assert_eq!(s.start(t0), Some(Trigger::NodeChange));
        // A burst right after: one pass, ten seconds after the last start.
        for i in 1..50u64 {
            s.request(Trigger::NodeChange, t0 + Duration::from_millis(i * 10));
        }
        assert_eq!(s.due(), Some(t0 + ten));
        assert_eq!(s.start(t0 + ten), Some(Trigger::NodeChange));
        assert!(!s.is_pending());
        // The safety pass joins a pending change under its label, and the reverse.
        s.request(Trigger::Periodic, t0 + Duration::from_secs(30));
        s.request(Trigger::NodeChange, t0 + Duration::from_secs(31));
        assert_eq!(s.due(), Some(t0 + Duration::from_secs(30)));
        assert_eq!(s.start(t0 + Duration::from_secs(30)), Some(Trigger::NodeChange));
        s.request(Trigger::NodeChange, t0 + Duration::from_secs(50));
        s.request(Trigger::Periodic, t0 + Duration::from_secs(50));
        assert_eq!(s.start(t0 + Duration::from_secs(50)), Some(Trigger::NodeChange));
        s.request(Trigger::Periodic, t0 + Duration::from_secs(70));
        assert_eq!(s.start(t0 + Duration::from_secs(70)), Some(Trigger::Periodic));
    }

    #[test]
    fn r15_the_safety_period_is_between_once_and_twice_the_resync_period() {
        let twelve = Duration::from_secs(12 * 3600);
        assert_eq!(safety_delay(twelve, 0), twelve);
        assert!(safety_delay(twelve, u64::MAX) < twelve * 2);
        assert!(safety_delay(twelve, u64::MAX) > twelve * 2 - Duration::from_secs(1));
        let mid = safety_delay(twelve, 1u64 << 63);
        assert_eq!(mid, Duration::from_secs(18 * 3600));
    }

    #[test]
    fn r16_outcomes_and_corrections_are_labelled_as_upstream() {
        assert_eq!(SyncOutcome::of(1, 0, 0).label(), "changed");
        assert_eq!(SyncOutcome::of(0, 0, 0).label(), "noop");
        assert_eq!(SyncOutcome::of(3, 1, 1).label(), "error");
        assert_eq!((Trigger::NodeChange.label(), Trigger::Periodic.label()), ("node_change", "periodic"));
        assert!(is_correction(Trigger::Periodic, 0, 1));
        assert!(!is_correction(Trigger::Periodic, 0, 0));
        assert!(!is_correction(Trigger::NodeChange, 2, 0), "a change-driven creation is no correction");
    }
}
