//! The call log and fault injection: every call counted per method, the recent ones kept with
//! their subject; errors injected per method, by count or by a seeded rate.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use ccm_framework::provider::CloudError;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

/// The metric family of load-balancer changes, by `change` label.
pub type ChangeMetric = Family<Vec<(String, String)>, Counter>;

/// How many recent calls the log keeps with their subject.
pub const RECENT_CALLS: usize = 4096;

/// Names of the methods the call log counts and faults can target.
pub mod methods {
    /// `CloudProvider::initialize`.
    pub const INITIALIZE: &str = "initialize";
    /// `CloudProvider::health`.
    pub const HEALTH: &str = "health";
    /// `Instances::instance_exists`.
    pub const INSTANCE_EXISTS: &str = "instance_exists";
    /// `Instances::instance_shutdown`.
    pub const INSTANCE_SHUTDOWN: &str = "instance_shutdown";
    /// `Instances::instance_metadata`.
    pub const INSTANCE_METADATA: &str = "instance_metadata";
    /// `Instances::instances_exist` (one batch is one call).
    pub const INSTANCES_EXIST: &str = "instances_exist";
    /// `Instances::instances_shutdown` (one batch is one call).
    pub const INSTANCES_SHUTDOWN: &str = "instances_shutdown";
    /// `Instances::instances_metadata` (one batch is one call).
    pub const INSTANCES_METADATA: &str = "instances_metadata";
    /// `LoadBalancer::get_load_balancer`.
    pub const GET_LOAD_BALANCER: &str = "get_load_balancer";
    /// `LoadBalancer::ensure_load_balancer`.
    pub const ENSURE_LOAD_BALANCER: &str = "ensure_load_balancer";
    /// `LoadBalancer::update_load_balancer`.
    pub const UPDATE_LOAD_BALANCER: &str = "update_load_balancer";
    /// `LoadBalancer::ensure_load_balancer_deleted`.
    pub const ENSURE_LOAD_BALANCER_DELETED: &str = "ensure_load_balancer_deleted";
    /// `Routes::list_routes`.
    pub const LIST_ROUTES: &str = "list_routes";
    /// `Routes::create_route`.
    pub const CREATE_ROUTE: &str = "create_route";
    /// `Routes::delete_route`.
    pub const DELETE_ROUTE: &str = "delete_route";
    /// `Zones::zone_by_provider_id`.
    pub const ZONE_BY_PROVIDER_ID: &str = "zone_by_provider_id";
    /// `Zones::zone_by_node_name`.
    pub const ZONE_BY_NODE_NAME: &str = "zone_by_node_name";
    /// `Clusters::list_clusters`.
    pub const LIST_CLUSTERS: &str = "list_clusters";
    /// `Clusters::master`.
    pub const MASTER: &str = "master";
    /// `LoadBalancer::list_owned`.
    pub const LIST_OWNED: &str = "list_owned";
    /// `LoadBalancer::delete_owned`.
    pub const DELETE_OWNED: &str = "delete_owned";

    /// Every method name.
    pub const ALL: [&str; 21] = [
        INITIALIZE,
        HEALTH,
        INSTANCE_EXISTS,
        INSTANCE_SHUTDOWN,
        INSTANCE_METADATA,
        INSTANCES_EXIST,
        INSTANCES_SHUTDOWN,
        INSTANCES_METADATA,
        GET_LOAD_BALANCER,
        ENSURE_LOAD_BALANCER,
        UPDATE_LOAD_BALANCER,
        ENSURE_LOAD_BALANCER_DELETED,
        LIST_ROUTES,
        CREATE_ROUTE,
        DELETE_ROUTE,
        ZONE_BY_PROVIDER_ID,
        ZONE_BY_NODE_NAME,
        LIST_CLUSTERS,
        MASTER,
        LIST_OWNED,
        DELETE_OWNED,
    ];

    /// Whether `name` is a method name (or `*`, every method).
    pub fn is_known(name: &str) -> bool {
        name == "*" || ALL.contains(&name)
    }
}

/// What a load-balancer call did to the cloud: the call log keeps these apart from the calls,
/// since `ensure_load_balancer` both creates and updates, and a hand-over must show no create.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LoadBalancerChange {
    /// A load balancer that did not exist was created.
    Create,
    /// An existing (or adopted) load balancer was ensured or updated.
    Update,
    /// An existing load balancer was deleted.
    Delete,
}

impl LoadBalancerChange {
    /// Every change, in label order.
    pub const ALL: [LoadBalancerChange; 3] = [Self::Create, Self::Update, Self::Delete];

    /// The lower-case name (`create`, `update`, `delete`), as in the metric's label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Create => "create",
            Self::Update => "update",
            Self::Delete => "delete",
        }
    }
}

/// One recorded call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// The method (see [`methods`]).
    pub method: &'static str,
    /// What it was about: a Node or Service name, a route, or empty.
    pub subject: String,
}

#[derive(Default)]
struct CallLogInner {
    counts: BTreeMap<&'static str, usize>,
    total: usize,
    recent: VecDeque<Call>,
    changes: BTreeMap<LoadBalancerChange, usize>,
    recent_changes: VecDeque<(LoadBalancerChange, String)>,
}

/// Counts of calls per method, plus the most recent calls with their subject.
#[derive(Default)]
pub struct CallLog {
    inner: Mutex<CallLogInner>,
    change_metric: ChangeMetric,
    in_flight: AtomicUsize,
    peak_in_flight: AtomicUsize,
}

impl std::fmt::Debug for CallLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallLog").field("counts", &self.counts()).finish()
    }
}

impl CallLog {
    fn lock(&self) -> MutexGuard<'_, CallLogInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn record(&self, method: &'static str, subject: String) {
        let mut inner = self.lock();
        *inner.counts.entry(method).or_default() += 1;
        inner.total += 1;
        if inner.recent.len() == RECENT_CALLS {
            inner.recent.pop_front();
        }
        inner.recent.push_back(Call { method, subject });
    }

    pub(crate) fn record_change(&self, change: LoadBalancerChange, subject: String) {
        self.change_metric.get_or_create(&vec![("change".to_string(), change.as_str().to_string())]).inc();
        let mut inner = self.lock();
        *inner.changes.entry(change).or_default() += 1;
        if inner.recent_changes.len() == RECENT_CALLS {
            inner.recent_changes.pop_front();
        }
        inner.recent_changes.push_back((change, subject));
    }

    /// The changes as a metric family (`fake_load_balancer_changes_total{change}` once the
    /// provider registers it), so a test can read them from a manager process's `/metrics`.
    pub fn change_metric(&self) -> ChangeMetric {
        self.change_metric.clone()
    }

    /// Load balancers changed this way so far.
    pub fn changes(&self, change: LoadBalancerChange) -> usize {
        self.lock().changes.get(&change).copied().unwrap_or(0)
    }

    /// Services (`namespace/name`) of the recent changes of this kind, oldest first.
    pub fn changed(&self, change: LoadBalancerChange) -> Vec<String> {
        self.lock().recent_changes.iter().filter(|(c, _)| *c == change).map(|(_, s)| s.clone()).collect()
    }

    /// Calls of `method` so far (a batch call counts once, under its batch method name).
    pub fn count(&self, method: &str) -> usize {
        self.lock().counts.get(method).copied().unwrap_or(0)
    }

    /// Every call so far.
    pub fn total(&self) -> usize {
        self.lock().total
    }

    /// Counts per method that was called at least once.
    pub fn counts(&self) -> BTreeMap<String, usize> {
        self.lock().counts.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    /// The most recent calls (at most [`RECENT_CALLS`]), oldest first.
    pub fn recent(&self) -> Vec<Call> {
        self.lock().recent.iter().cloned().collect()
    }

    /// Subjects of the recent calls of `method`, oldest first.
    pub fn subjects(&self, method: &str) -> Vec<String> {
        self.lock().recent.iter().filter(|c| c.method == method).map(|c| c.subject.clone()).collect()
    }

    /// Calls running right now.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// The most calls that ran at once since the last reset.
    pub fn peak_in_flight(&self) -> usize {
        self.peak_in_flight.load(Ordering::SeqCst)
    }

    /// Forget every count and recorded call.
    pub fn reset(&self) {
        *self.lock() = CallLogInner::default();
        self.peak_in_flight.store(self.in_flight(), Ordering::SeqCst);
    }
}

/// Decrements the in-flight count when a call ends, however it ends.
pub(crate) struct InFlight<'a>(&'a CallLog);

impl<'a> InFlight<'a> {
    pub(crate) fn enter(log: &'a CallLog) -> Self {
        let now = log.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        log.peak_in_flight.fetch_max(now, Ordering::SeqCst);
        Self(log)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// An injected failure for one method (or `*`, every method without its own fault).
#[derive(Debug, Clone, PartialEq)]
pub struct Fault {
    /// Fail only this many more calls; `None` for no count limit.
    pub remaining: Option<usize>,
    /// Probability (0..=1) that a call fails while the fault is active.
    pub rate: f64,
    /// The error returned.
    pub error: CloudError,
}

/// The installed faults and the generator behind their rates.
#[derive(Debug, Clone)]
pub(crate) struct Faults {
    by_method: HashMap<String, Fault>,
    rng: u64,
}

impl Default for Faults {
    fn default() -> Self {
        Self { by_method: HashMap::new(), rng: 0x5eed_cafe_f00d_d00d }
    }
}

impl Faults {
    /// Install a fault for `method` (or `*`), replacing its previous one.
    pub(crate) fn set(&mut self, method: &str, fault: Fault) {
        self.by_method.insert(method.to_string(), fault);
    }

    /// The fault installed for `method` (or `*`).
    #[cfg(test)]
    pub(crate) fn get(&self, method: &str) -> Option<&Fault> {
        self.by_method.get(method)
    }

    /// Remove the fault of `method` (or `*`).
    pub(crate) fn remove(&mut self, method: &str) {
        self.by_method.remove(method);
    }

    /// Remove every fault.
    pub(crate) fn clear(&mut self) {
        self.by_method.clear();
    }

    /// Seed the generator behind rate faults.
    pub(crate) fn seed(&mut self, seed: u64) {
        self.rng = seed;
    }

    /// The error a call of `method` fails with, if its fault (or else `*`'s) fires now.
    pub(crate) fn draw(&mut self, method: &str) -> Option<CloudError> {
        let key = if self.by_method.contains_key(method) { method } else { "*" };
        let rate = {
            let fault = self.by_method.get(key)?;
            if fault.remaining == Some(0) {
                return None;
            }
            fault.rate
        };
        let hit = rate >= 1.0 || (rate > 0.0 && self.next_unit() < rate);
        let fault = self.by_method.get_mut(key)?;
        if !hit {
            return None;
        }
        if let Some(n) = fault.remaining.as_mut() {
            *n -= 1;
        }
        Some(fault.error.clone())
    }

    /// splitmix64: a tiny reproducible generator, enough for fault rates.
    fn next_unit(&mut self) -> f64 {
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }
}
