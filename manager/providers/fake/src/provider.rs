//! The fake provider itself: its in-memory cloud (instances, load balancers, routes) behind the
//! provider traits, steered by tests through [`FakeProvider`]'s setters.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use futures::stream::{self, StreamExt};
use k8s_openapi::api::core::v1::{LoadBalancerIngress, LoadBalancerStatus, Node, NodeAddress, Service};
use kube::ResourceExt;

use ccm_framework::provider::{
    CloudError, CloudProvider, CloudResult, Clusters, Health, InitContext, InstanceMetadata, Instances, LoadBalancer,
    OwnedObject, Route, Routes, Zone, Zones, default_load_balancer_name,
};
use ccm_framework::registry::{FactoryInput, Registry};

use crate::addresses::{AddressPool, BenchCounter, bench_ingress};
use crate::calls::{CallLog, Fault, Faults, InFlight, LoadBalancerChange, methods};
use crate::config::{FakeConfig, FakeInstanceConfig, FakeProfile};

/// The name the fake provider is registered under.
pub const NAME: &str = "fake";

/// The prefix of providerIDs the fake derives (`fake://<node name>`).
pub const PROVIDER_ID_PREFIX: &str = "fake://";

/// The prefix of providerIDs in the `bench` profile (`bench://<node name>`).
pub const BENCH_PROVIDER_ID_PREFIX: &str = "bench://";
/// The instance type of every `bench` instance.
pub const BENCH_INSTANCE_TYPE: &str = "bench.small";
/// The zone of every `bench` instance.
pub const BENCH_ZONE: &str = "bench-zone-a";
/// The region of every `bench` instance.
pub const BENCH_REGION: &str = "bench-region";
/// `bench`'s default latency of an instance call (upstream's `BENCH_INSTANCE_LATENCY`).
pub const BENCH_INSTANCE_LATENCY: Duration = Duration::from_millis(20);
/// `bench`'s default latency of a load-balancer call (upstream's `BENCH_LB_LATENCY`).
pub const BENCH_LB_LATENCY: Duration = Duration::from_millis(50);

/// The name of the metric counting load-balancer changes (`_total` is appended on exposition).
pub const CHANGES_METRIC: &str = "fake_load_balancer_changes";

/// Register the fake provider under [`NAME`].
pub fn register(registry: &mut Registry) -> Result<(), ccm_framework::registry::RegistryError> {
    registry.register(NAME, |input: FactoryInput<'_>| {
        let provider = FakeProvider::from_cloud_config(input.cloud_config)?;
        provider.state().cluster_name = input.cluster.cluster_name.clone();
        Ok(Arc::new(provider) as Arc<dyn CloudProvider>)
    })
}

/// One instance in the fake cloud.
#[derive(Debug, Clone, PartialEq)]
pub struct FakeInstance {
    /// What `instance_metadata` returns while the instance exists.
    pub metadata: InstanceMetadata,
    /// What `instance_exists` returns.
    pub exists: bool,
    /// What `instance_shutdown` returns.
    pub shutdown: bool,
}

impl FakeInstance {
    /// A running instance with this metadata.
    pub fn running(metadata: InstanceMetadata) -> Self {
        Self { metadata, exists: true, shutdown: false }
    }

    /// The running instance `auto_instances` mode derives for a Node name: providerID
    /// `fake://<name>`, and an instance type, zone, region and InternalIP derived from the name.
    pub fn derived(name: &str) -> Self {
        let h = fnv1a(name.as_bytes());
        let types = ["fake.small", "fake.medium", "fake.large"];
        let zones = ["fake-zone-a", "fake-zone-b", "fake-zone-c"];
        // 10.x.y.z with z in 1..=254, so the address is never a network or broadcast address.
        let ip = Ipv4Addr::new(10, (h >> 8) as u8, (h >> 16) as u8, 1 + ((h >> 24) % 254) as u8);
        Self::running(InstanceMetadata {
            provider_id: format!("{PROVIDER_ID_PREFIX}{name}"),
            instance_type: types[(h % 3) as usize].to_string(),
            node_addresses: vec![NodeAddress { type_: "InternalIP".into(), address: ip.to_string() }],
            zone: zones[((h >> 4) % 3) as usize].to_string(),
            region: "fake-region-1".to_string(),
            additional_labels: BTreeMap::new(),
        })
    }

    /// The instance upstream's `bench` provider reports for `node`: providerID
    /// `bench://<name>`, `bench.small` in `bench-zone-a`/`bench-region`, and the Node's own
    /// Hostname and InternalIP addresses (a Hostname of its name if it has none), after an
    /// InternalIP derived from the name when `internal_ip` is set.
    pub fn bench(node: &Node, internal_ip: bool) -> Self {
        let name = node.name_any();
        let own = node.status.as_ref().and_then(|s| s.addresses.as_ref());
        let mut addresses: Vec<NodeAddress> =
            own.into_iter().flatten().filter(|a| a.type_ == "Hostname" || a.type_ == "InternalIP").cloned().collect();
        if addresses.is_empty() {
            addresses.push(NodeAddress { type_: "Hostname".into(), address: name.clone() });
        }
        if internal_ip {
            addresses
                .insert(0, NodeAddress { type_: "InternalIP".into(), address: bench_internal_ip(&name).to_string() });
        }
        Self::running(InstanceMetadata {
            provider_id: format!("{BENCH_PROVIDER_ID_PREFIX}{name}"),
            instance_type: BENCH_INSTANCE_TYPE.to_string(),
            node_addresses: addresses,
            zone: BENCH_ZONE.to_string(),
            region: BENCH_REGION.to_string(),
            additional_labels: BTreeMap::new(),
        })
    }

    /// The instance a cloud-config entry describes: fields left out take the values
    /// [`Self::derived`] gives the name.
    pub(crate) fn from_config(config: &FakeInstanceConfig) -> FakeInstance {
        let mut i = FakeInstance::derived(&config.name);
        let m = &mut i.metadata;
        if let Some(v) = &config.provider_id {
            m.provider_id = v.clone();
        }
        if let Some(v) = &config.instance_type {
            m.instance_type = v.clone();
        }
        if let Some(v) = &config.zone {
            m.zone = v.clone();
        }
        if let Some(v) = &config.region {
            m.region = v.clone();
        }
        if let Some(v) = &config.addresses {
            m.node_addresses =
                v.iter().map(|a| NodeAddress { type_: a.type_.clone(), address: a.address.clone() }).collect();
        }
        m.additional_labels = config.labels.clone();
        i.exists = config.exists;
        i.shutdown = config.shutdown;
        i
    }
}

/// A load balancer in the fake cloud.
#[derive(Debug, Clone, PartialEq)]
pub struct FakeLoadBalancer {
    /// The cloud-side name (`load_balancer_name`).
    pub name: String,
    /// The Service it serves, as `namespace/name`.
    pub service: String,
    /// The cluster name it was ensured with.
    pub cluster_name: String,
    /// Names of the backend Nodes, sorted; load balancers with the same set share one copy.
    pub hosts: Arc<[String]>,
    /// The status handed back to the service controller.
    pub status: LoadBalancerStatus,
}

/// Which capabilities the fake offers (upstream's `Disable*` toggles, inverted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FakeCapabilities {
    /// `instances()` returns the fake.
    pub instances: bool,
    /// `load_balancer()` returns the fake.
    pub load_balancer: bool,
    /// `routes()` returns the fake.
    pub routes: bool,
    /// `zones()` returns the fake.
    pub zones: bool,
    /// `clusters()` returns the fake.
    pub clusters: bool,
}

impl Default for FakeCapabilities {
    fn default() -> Self {
        Self { instances: true, load_balancer: true, routes: true, zones: true, clusters: true }
    }
}

struct State {
    cluster_name: String,
    instances: BTreeMap<String, FakeInstance>,
    by_provider_id: HashMap<String, String>,
    auto_instances: bool,
    /// Names removed while in auto mode: they stay absent until set again.
    gone: BTreeSet<String>,
    load_balancers: BTreeMap<String, FakeLoadBalancer>,
    addresses: AddressPool,
    /// The host set last stored: 10,000 load balancers over 5,000 Nodes would otherwise keep
    /// 50 million names (2.8 GiB measured), which is the fake's bookkeeping, not the manager's.
    last_hosts: HostNames,
    routes: BTreeMap<(String, String), Route>,
    faults: Faults,
    health: Health,
    latency: Duration,
    load_balancer_latency: Duration,
    batch_size: usize,
    capabilities: FakeCapabilities,
    profile: FakeProfile,
    bench_internal_ip: bool,
    bench_addresses: BenchCounter,
}

/// The fake provider. See the module documentation.
pub struct FakeProvider {
    state: Mutex<State>,
    calls: CallLog,
    initialized: AtomicBool,
}

impl std::fmt::Debug for FakeProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeProvider").field("calls", &self.calls).finish_non_exhaustive()
    }
}

impl Default for FakeProvider {
    fn default() -> Self {
        Self::new()
    }
}

impl FakeProvider {
    /// An empty fake cloud: every capability on, no instances, no latency, batch size 100,
    /// healthy.
    pub fn new() -> Self {
        Self {
            state: Mutex::new(State {
                cluster_name: "kubernetes".to_string(),
                instances: BTreeMap::new(),
                by_provider_id: HashMap::new(),
                auto_instances: false,
                gone: BTreeSet::new(),
                load_balancers: BTreeMap::new(),
                addresses: AddressPool::default(),
                last_hosts: HostNames::default(),
                routes: BTreeMap::new(),
                faults: Faults::default(),
                health: Health::healthy("fake cloud"),
                latency: Duration::ZERO,
                load_balancer_latency: Duration::ZERO,
                batch_size: 100,
                capabilities: FakeCapabilities::default(),
                profile: FakeProfile::Fake,
                bench_internal_ip: false,
                bench_addresses: BenchCounter::default(),
            }),
            calls: CallLog::default(),
            initialized: AtomicBool::new(false),
        }
    }

    /// Build from cloud-config bytes (`None` or empty: the defaults of [`FakeProvider::new`]).
    pub fn from_cloud_config(bytes: Option<&[u8]>) -> CloudResult<Self> {
        let config = match bytes {
            Some(b) => FakeConfig::parse(b)?,
            None => FakeConfig::default(),
        };
        Self::from_config(&config)
    }

    /// Build from a parsed config.
    pub fn from_config(config: &FakeConfig) -> CloudResult<Self> {
        config.validate()?;
        let p = Self::new();
        {
            let mut st = p.state();
            if config.profile == FakeProfile::Bench {
                st.profile = FakeProfile::Bench;
                st.bench_internal_ip = config.bench_internal_ip;
                st.latency = BENCH_INSTANCE_LATENCY;
                st.load_balancer_latency = BENCH_LB_LATENCY;
            }
            if let Some(l) = config.latency {
                st.latency = l.into();
            }
            if let Some(l) = config.load_balancer_latency {
                st.load_balancer_latency = l.into();
            }
            if let Some(b) = config.batch_size {
                st.batch_size = b;
            }
            if let Some(r) = config.load_balancer_ip_range {
                st.addresses = AddressPool::new(r);
            }
            if let Some(seed) = config.seed {
                st.faults.seed(seed);
            }
            let bench = config.profile == FakeProfile::Bench;
            st.auto_instances = config.auto_instances || bench;
            // Bench offers InstancesV2 and LoadBalancer only.
            st.capabilities = FakeCapabilities {
                instances: !config.disable_instances,
                load_balancer: !config.disable_load_balancers,
                routes: !config.disable_routes && !bench,
                zones: !config.disable_zones && !bench,
                clusters: !config.disable_clusters && !bench,
            };
            if let Some(h) = &config.health {
                st.health = if h.healthy {
                    Health::healthy(h.message.clone())
                } else {
                    Health::unhealthy(h.reason.clone().unwrap_or_else(|| "ProbeFailing".into()), h.message.clone())
                };
            }
            for f in &config.failures {
                st.faults
                    .set(&f.method, Fault { remaining: f.times, rate: f.rate.unwrap_or(1.0), error: f.to_error() });
            }
        }
        for i in &config.instances {
            p.set_instance(&i.name, FakeInstance::from_config(i));
        }
        Ok(p)
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The call log.
    pub fn calls(&self) -> &CallLog {
        &self.calls
    }

    /// Whether `initialize` has run at least once.
    pub fn initialized(&self) -> bool {
        self.initialized.load(Ordering::SeqCst)
    }

    /// Add or replace the instance for Node `name`.
    pub fn set_instance(&self, name: &str, instance: FakeInstance) {
        let mut st = self.state();
        if let Some(old) = st.instances.get(name).map(|i| i.metadata.provider_id.clone()) {
            st.by_provider_id.remove(&old);
        }
        if !instance.metadata.provider_id.is_empty() {
            st.by_provider_id.insert(instance.metadata.provider_id.clone(), name.to_string());
        }
        st.gone.remove(name);
        st.instances.insert(name.to_string(), instance);
    }

    /// Remove the instance for Node `name`; in `auto_instances` mode the name stays absent
    /// until [`Self::set_instance`] brings it back.
    pub fn remove_instance(&self, name: &str) {
        let mut st = self.state();
        if let Some(old) = st.instances.remove(name) {
            st.by_provider_id.remove(&old.metadata.provider_id);
        }
        st.gone.insert(name.to_string());
    }

    /// The instance the fake would report for a Node of this name and no providerID (in the
    /// `bench` profile: nor addresses).
    pub fn instance(&self, name: &str) -> Option<FakeInstance> {
        let st = self.state();
        if st.profile == FakeProfile::Bench {
            let node = Node {
                metadata: kube::api::ObjectMeta { name: Some(name.into()), ..Default::default() },
                ..Default::default()
            };
            return st.bench_lookup(&node);
        }
        st.instances
            .get(name)
            .cloned()
            .or_else(|| (st.auto_instances && !st.gone.contains(name)).then(|| FakeInstance::derived(name)))
    }

    /// Turn `auto_instances` mode on or off: when on, every Node name not set explicitly is a
    /// running instance ([`FakeInstance::derived`]).
    pub fn set_auto_instances(&self, on: bool) {
        self.state().auto_instances = on;
    }

    /// Latency added to every instance, zone, route and cluster call (and each batch chunk).
    pub fn set_latency(&self, latency: Duration) {
        self.state().latency = latency;
    }

    /// Latency added to every load-balancer call.
    pub fn set_load_balancer_latency(&self, latency: Duration) {
        self.state().load_balancer_latency = latency;
    }

    /// The batch size `Instances::batch_size` reports; batch calls are chunked by it.
    pub fn set_batch_size(&self, batch_size: usize) {
        self.state().batch_size = batch_size.max(1);
    }

    /// What `health` returns from now on.
    pub fn set_health(&self, health: Health) {
        self.state().health = health;
    }

    /// Which capabilities are offered from now on.
    pub fn set_capabilities(&self, capabilities: FakeCapabilities) {
        self.state().capabilities = capabilities;
    }

    /// Seed of the generator behind rate faults (runs are reproducible by default).
    pub fn set_seed(&self, seed: u64) {
        self.state().faults.seed(seed);
    }

    /// Fail the next `times` calls of `method` (or `*`) with `error`.
    pub fn fail_next(&self, method: &str, times: usize, error: CloudError) {
        self.set_fault(method, Fault { remaining: Some(times), rate: 1.0, error });
    }

    /// Fail calls of `method` (or `*`) with probability `rate` (0..=1) until cleared.
    pub fn fail_rate(&self, method: &str, rate: f64, error: CloudError) {
        self.set_fault(method, Fault { remaining: None, rate: rate.clamp(0.0, 1.0), error });
    }

    /// Install a fault for `method` (or `*`), replacing its previous one.
    pub fn set_fault(&self, method: &str, fault: Fault) {
        self.state().faults.set(method, fault);
    }

    /// Remove the fault of `method` (or `*`).
    pub fn clear_fault(&self, method: &str) {
        self.state().faults.remove(method);
    }

    /// Remove every fault.
    pub fn clear_faults(&self) {
        self.state().faults.clear();
    }

    /// Every load balancer, by cloud-side name.
    pub fn load_balancers(&self) -> Vec<FakeLoadBalancer> {
        self.state().load_balancers.values().cloned().collect()
    }

    /// The load balancer serving Service `namespace/name`, if any.
    pub fn load_balancer_for(&self, namespace: &str, name: &str) -> Option<FakeLoadBalancer> {
        let key = format!("{namespace}/{name}");
        self.state().load_balancers.values().find(|lb| lb.service == key).cloned()
    }

    /// Add a load balancer directly (for example an orphan the controller should clean up).
    pub fn insert_load_balancer(&self, lb: FakeLoadBalancer) {
        let mut st = self.state();
        st.addresses.claim_status(&lb.status);
        st.load_balancers.insert(lb.name.clone(), lb);
    }

    /// Every route of `cluster_name`, sorted by name.
    pub fn cloud_routes(&self, cluster_name: &str) -> Vec<Route> {
        self.state().routes.iter().filter(|((c, _), _)| c == cluster_name).map(|(_, r)| r.clone()).collect()
    }

    /// Add a route directly (for example a blackhole the controller should delete).
    pub fn insert_route(&self, cluster_name: &str, route: Route) {
        self.state().routes.insert((cluster_name.to_string(), route.name.clone()), route);
    }

    /// Count the call, apply the latency and any fault.
    async fn call(&self, method: &'static str, subject: impl Into<String>, lb: bool) -> CloudResult<()> {
        let started = tokio::time::Instant::now();
        self.calls.record(method, subject.into());
        let (latency, fault) = {
            let mut st = self.state();
            let latency = if lb { st.load_balancer_latency } else { st.latency };
            (latency, st.faults.draw(method))
        };
        if !latency.is_zero() {
            wait_until(started + latency).await;
        }
        match fault {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Which cloud the fake answers as.
    pub fn profile(&self) -> FakeProfile {
        self.state().profile
    }

    fn lookup(&self, node: &Node) -> Option<FakeInstance> {
        let st = self.state();
        if st.profile == FakeProfile::Bench {
            return st.bench_lookup(node);
        }
        let name = node.name_any();
        if let Some(pid) = node.spec.as_ref().and_then(|s| s.provider_id.as_deref()).filter(|p| !p.is_empty()) {
            if let Some(owner) = st.by_provider_id.get(pid) {
                return st.instances.get(owner).cloned();
            }
            if st.auto_instances
                && let Some(derived) = pid.strip_prefix(PROVIDER_ID_PREFIX)
                && !st.gone.contains(derived)
                && !st.instances.contains_key(derived)
            {
                return Some(FakeInstance::derived(derived));
            }
        }
        st.instances
            .get(&name)
            .cloned()
            .or_else(|| (st.auto_instances && !st.gone.contains(&name)).then(|| FakeInstance::derived(&name)))
    }

    fn lookup_by_provider_id(&self, pid: &str) -> Option<FakeInstance> {
        let st = self.state();
        if let Some(owner) = st.by_provider_id.get(pid) {
            return st.instances.get(owner).cloned();
        }
        let derived = pid.strip_prefix(PROVIDER_ID_PREFIX)?;
        (st.auto_instances && !st.gone.contains(derived) && !st.instances.contains_key(derived))
            .then(|| FakeInstance::derived(derived))
    }

    fn existing(&self, node: &Node) -> Option<FakeInstance> {
        self.lookup(node).filter(|i| i.exists)
    }

    /// Run `one` on each chunk of `nodes` as a single batch call of `method`.
    async fn batch<T: Send>(
        &self,
        method: &'static str,
        nodes: &[&Node],
        one: impl Fn(&Self, &Node) -> T + Send + Sync,
    ) -> Vec<CloudResult<T>> {
        let (size, concurrency) = (self.batch_size().max(1), self.batch_concurrency().max(1));
        let one = &one;
        let chunks: Vec<_> = nodes
            .chunks(size)
            .map(|chunk| async move {
                let subject = format!("{} nodes", chunk.len());
                match self.call(method, subject, false).await {
                    Ok(()) => chunk.iter().map(|n| Ok(one(self, n))).collect::<Vec<_>>(),
                    Err(e) => chunk.iter().map(|_| Err(e.clone())).collect(),
                }
            })
            .collect();
        stream::iter(chunks).buffered(concurrency).flat_map(stream::iter).collect().await
    }

    /// Bench has no batch API: a batch is one call of `method` per Node, as upstream makes.
    async fn fan_out<T: Send>(
        &self,
        method: &'static str,
        nodes: &[&Node],
        one: impl Fn(&Self, &Node) -> T + Send + Sync,
    ) -> Vec<CloudResult<T>> {
        let one = &one;
        let calls: Vec<_> = nodes
            .iter()
            .map(|n| async move { self.call(method, n.name_any(), false).await.map(|()| one(self, n)) })
            .collect();
        stream::iter(calls).buffered(self.batch_concurrency().max(1)).collect().await
    }

    fn is_bench(&self) -> bool {
        self.state().profile == FakeProfile::Bench
    }

    /// Record what a load-balancer call did.
    fn changed(&self, change: LoadBalancerChange, service: &Service) {
        self.calls.record_change(change, Self::service_key(service));
    }

    fn service_key(service: &Service) -> String {
        format!("{}/{}", service.namespace().unwrap_or_default(), service.name_any())
    }
}

impl State {
    /// `bench`'s instance for `node`: an instance set explicitly, else every Node not removed.
    fn bench_lookup(&self, node: &Node) -> Option<FakeInstance> {
        let name = node.name_any();
        if let Some(i) = self.instances.get(&name) {
            return Some(i.clone());
        }
        (!self.gone.contains(&name)).then(|| FakeInstance::bench(node, self.bench_internal_ip))
    }

    /// The load balancer `name` of `service`. In the `bench` profile a Service whose status
    /// holds a bench address has one: the shared cloud another process made it in (bench's
    /// state lives in each process, so this is how two of them model one cloud); it is
    /// adopted here with that address.
    fn existing_load_balancer(
        &mut self,
        name: &str,
        cluster_name: &str,
        service: &Service,
    ) -> Option<&mut FakeLoadBalancer> {
        if !self.load_balancers.contains_key(name) && self.profile == FakeProfile::Bench {
            let status = service.status.as_ref().and_then(|s| s.load_balancer.as_ref());
            if let Some(ip) = bench_ingress(status) {
                self.bench_addresses.claim(ip);
                let status = LoadBalancerStatus {
                    ingress: Some(vec![LoadBalancerIngress { ip: Some(ip.to_string()), ..Default::default() }]),
                };
                let lb = FakeLoadBalancer {
                    name: name.to_string(),
                    service: FakeProvider::service_key(service),
                    cluster_name: cluster_name.to_string(),
                    hosts: Arc::from(Vec::new()),
                    status,
                };
                self.load_balancers.insert(name.to_string(), lb);
            }
        }
        self.load_balancers.get_mut(name)
    }

    /// The names of `nodes`, sorted, as a shared copy (see [`HostNames`]).
    fn intern_hosts(&mut self, nodes: &[&Node]) -> Arc<[String]> {
        let names: Vec<&str> = nodes.iter().map(|n| n.metadata.name.as_deref().unwrap_or_default()).collect();
        self.last_hosts.intern(&names)
    }
}

/// The last host set a load-balancer call brought, sorted and shared, so that no name is
/// copied unless the set changed (with 5,000 Nodes, copying them on every call was most of
/// the fake's own cost). The manager passes the same Node list in the same order until a
/// Node changes, so a call is first checked against the last call's order: linear, where
/// sorting 5,000 names on every call under the state lock was 42% of the manager's CPU at
/// 10,000 Services.
#[derive(Debug, Default)]
struct HostNames {
    sorted: Arc<[String]>,
    /// For each position of the last call's list, where its name is in `sorted`.
    rank: Vec<u32>,
}

impl HostNames {
    /// `names` sorted; the stored copy when it holds the same names.
    fn intern(&mut self, names: &[&str]) -> Arc<[String]> {
        // `rank` is a permutation of `sorted`'s positions, so a match at every position means
        // the same names: `sorted` is then `names` sorted.
        let same_order = self.rank.len() == names.len()
            && names.iter().zip(&self.rank).all(|(n, &r)| self.sorted.get(r as usize).is_some_and(|s| s == n));
        if same_order {
            return self.sorted.clone();
        }
        let mut order: Vec<usize> = (0..names.len()).collect();
        order.sort_unstable_by(|&a, &b| names[a].cmp(names[b]));
        if !self.sorted.iter().map(String::as_str).eq(order.iter().map(|&i| names[i])) {
            self.sorted = order.iter().map(|&i| names[i].to_string()).collect();
        }
        self.rank = vec![0; names.len()];
        for (position, &i) in order.iter().enumerate() {
            // A host list is bounded by the cluster's Nodes, far below u32::MAX.
            self.rank[i] = u32::try_from(position).unwrap_or(u32::MAX);
        }
        self.sorted.clone()
    }
}

/// FNV-1a: a stable hash, so derived instances are the same on every run and platform.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ *b as u64).wrapping_mul(0x0100_0000_01b3))
}

/// 32-bit FNV-1a, as Go's `hash/fnv.New32a`.
fn fnv1a32(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5u32, |h, b| (h ^ *b as u32).wrapping_mul(0x0100_0193))
}

/// The InternalIP upstream's `bench` derives from a Node name with `BENCH_INTERNAL_IP=1`:
/// `10.(h>>8).(h>>16).(1 + (h>>24) % 254)` of its 32-bit FNV-1a hash.
pub fn bench_internal_ip(name: &str) -> Ipv4Addr {
    let h = fnv1a32(name.as_bytes());
    Ipv4Addr::new(10, (h >> 8) as u8, (h >> 16) as u8, 1 + ((h >> 24) % 254) as u8)
}

#[async_trait]
impl CloudProvider for FakeProvider {
    fn name(&self) -> &str {
        NAME
    }

    async fn initialize(&self, ctx: InitContext) -> CloudResult<()> {
        self.call(methods::INITIALIZE, "", false).await?;
        let family = self.calls.change_metric();
        ctx.metrics.get_or_register(
            CHANGES_METRIC,
            "Load balancers the fake cloud created, updated or deleted",
            || family,
        );
        self.initialized.store(true, Ordering::SeqCst);
        Ok(())
    }

    fn instances(&self) -> Option<&dyn Instances> {
        self.state().capabilities.instances.then_some(self as &dyn Instances)
    }

    fn load_balancer(&self) -> Option<&dyn LoadBalancer> {
        self.state().capabilities.load_balancer.then_some(self as &dyn LoadBalancer)
    }

    fn routes(&self) -> Option<&dyn Routes> {
        self.state().capabilities.routes.then_some(self as &dyn Routes)
    }

    fn zones(&self) -> Option<&dyn Zones> {
        self.state().capabilities.zones.then_some(self as &dyn Zones)
    }

    fn clusters(&self) -> Option<&dyn Clusters> {
        self.state().capabilities.clusters.then_some(self as &dyn Clusters)
    }

    async fn health(&self) -> Health {
        self.calls.record(methods::HEALTH, String::new());
        self.state().health.clone()
    }

    fn capabilities(&self) -> ccm_framework::capabilities::Capabilities {
        let c = self.state().capabilities;
        crate::orphans::capabilities(NAME, c.instances, c.routes, c.load_balancer)
    }
}

#[async_trait]
impl Instances for FakeProvider {
    async fn instance_exists(&self, node: &Node) -> CloudResult<bool> {
        let _guard = InFlight::enter(&self.calls);
        self.call(methods::INSTANCE_EXISTS, node.name_any(), false).await?;
        Ok(self.lookup(node).is_some_and(|i| i.exists))
    }

    async fn instance_shutdown(&self, node: &Node) -> CloudResult<bool> {
        let _guard = InFlight::enter(&self.calls);
        self.call(methods::INSTANCE_SHUTDOWN, node.name_any(), false).await?;
        Ok(self.existing(node).is_some_and(|i| i.shutdown))
    }

    async fn instance_metadata(&self, node: &Node) -> CloudResult<Option<InstanceMetadata>> {
        let _guard = InFlight::enter(&self.calls);
        self.call(methods::INSTANCE_METADATA, node.name_any(), false).await?;
        Ok(self.existing(node).map(|i| i.metadata))
    }

    fn batch_size(&self) -> usize {
        self.state().batch_size
    }

    async fn instances_metadata(&self, nodes: &[&Node]) -> Vec<CloudResult<Option<InstanceMetadata>>> {
        let _guard = InFlight::enter(&self.calls);
        if self.is_bench() {
            return self.fan_out(methods::INSTANCE_METADATA, nodes, |p, n| p.existing(n).map(|i| i.metadata)).await;
        }
        self.batch(methods::INSTANCES_METADATA, nodes, |p, n| p.existing(n).map(|i| i.metadata)).await
    }

    async fn instances_exist(&self, nodes: &[&Node]) -> Vec<CloudResult<bool>> {
        let _guard = InFlight::enter(&self.calls);
        if self.is_bench() {
            return self.fan_out(methods::INSTANCE_EXISTS, nodes, |p, n| p.lookup(n).is_some_and(|i| i.exists)).await;
        }
        self.batch(methods::INSTANCES_EXIST, nodes, |p, n| p.lookup(n).is_some_and(|i| i.exists)).await
    }

    async fn instances_shutdown(&self, nodes: &[&Node]) -> Vec<CloudResult<bool>> {
        let _guard = InFlight::enter(&self.calls);
        if self.is_bench() {
            return self
                .fan_out(methods::INSTANCE_SHUTDOWN, nodes, |p, n| p.existing(n).is_some_and(|i| i.shutdown))
                .await;
        }
        self.batch(methods::INSTANCES_SHUTDOWN, nodes, |p, n| p.existing(n).is_some_and(|i| i.shutdown)).await
    }
}

#[async_trait]
impl LoadBalancer for FakeProvider {
    async fn get_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
    ) -> CloudResult<Option<LoadBalancerStatus>> {
        let _guard = InFlight::enter(&self.calls);
        self.call(methods::GET_LOAD_BALANCER, Self::service_key(service), true).await?;
        let name = self.load_balancer_name(cluster_name, service);
        Ok(self.state().existing_load_balancer(&name, cluster_name, service).map(|lb| lb.status.clone()))
    }

    fn load_balancer_name(&self, _cluster_name: &str, service: &Service) -> String {
        // Services built in tests often have no UID; keep their names distinct anyway.
        if service.metadata.uid.as_deref().is_some_and(|u| !u.is_empty()) {
            default_load_balancer_name(service)
        } else {
            format!("fake-{}-{}", service.namespace().unwrap_or_default(), service.name_any())
        }
    }

    async fn ensure_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
        nodes: &[&Node],
    ) -> CloudResult<LoadBalancerStatus> {
        let _guard = InFlight::enter(&self.calls);
        self.call(methods::ENSURE_LOAD_BALANCER, Self::service_key(service), true).await?;
        let name = self.load_balancer_name(cluster_name, service);
        let mut st = self.state();
        let bench = st.profile == FakeProfile::Bench;
        // Bench ignores spec.loadBalancerIP, as upstream's does.
        let requested = service
            .spec
            .as_ref()
            .and_then(|s| s.load_balancer_ip.as_deref())
            .and_then(|ip| ip.parse().ok())
            .filter(|_| !bench);
        let hosts = st.intern_hosts(nodes);
        if let Some(lb) = st.existing_load_balancer(&name, cluster_name, service) {
            lb.hosts = hosts;
            lb.cluster_name = cluster_name.to_string();
            let status = lb.status.clone();
            drop(st);
            self.changed(LoadBalancerChange::Update, service);
            return Ok(status);
        }
        let ip = match requested {
            Some(ip) => ip,
            None if bench => st.bench_addresses.allocate()?,
            None => st.addresses.allocate()?,
        };
        st.addresses.claim(ip);
        let status = LoadBalancerStatus {
            ingress: Some(vec![LoadBalancerIngress { ip: Some(ip.to_string()), ..Default::default() }]),
        };
        st.load_balancers.insert(
            name.clone(),
            FakeLoadBalancer {
                name,
                service: Self::service_key(service),
                cluster_name: cluster_name.to_string(),
                hosts,
                status: status.clone(),
            },
        );
        drop(st);
        self.changed(LoadBalancerChange::Create, service);
        Ok(status)
    }

    async fn update_load_balancer(&self, cluster_name: &str, service: &Service, nodes: &[&Node]) -> CloudResult<()> {
        let _guard = InFlight::enter(&self.calls);
        self.call(methods::UPDATE_LOAD_BALANCER, Self::service_key(service), true).await?;
        let name = self.load_balancer_name(cluster_name, service);
        // Updating a load balancer that does not exist is a no-op, as in upstream's fake.
        let mut st = self.state();
        let hosts = st.intern_hosts(nodes);
        let Some(lb) = st.existing_load_balancer(&name, cluster_name, service) else { return Ok(()) };
        lb.hosts = hosts;
        drop(st);
        self.changed(LoadBalancerChange::Update, service);
        Ok(())
    }

    async fn ensure_load_balancer_deleted(&self, cluster_name: &str, service: &Service) -> CloudResult<()> {
        let _guard = InFlight::enter(&self.calls);
        self.call(methods::ENSURE_LOAD_BALANCER_DELETED, Self::service_key(service), true).await?;
        let name = self.load_balancer_name(cluster_name, service);
        let mut st = self.state();
        if st.existing_load_balancer(&name, cluster_name, service).is_none() {
            return Ok(());
        }
        if let Some(lb) = st.load_balancers.remove(&name) {
            st.addresses.release(&lb.status);
            st.bench_addresses.release(&lb.status);
        }
        drop(st);
        self.changed(LoadBalancerChange::Delete, service);
        Ok(())
    }

    async fn list_owned(&self, cluster_name: &str) -> CloudResult<Vec<OwnedObject>> {
        let _guard = InFlight::enter(&self.calls);
        self.call(methods::LIST_OWNED, cluster_name, true).await?;
        let lbs = self.load_balancers();
        let listed = lbs.iter().map(|lb| crate::orphans::Listed {
            name: &lb.name,
            service: &lb.service,
            cluster_name: &lb.cluster_name,
        });
        Ok(crate::orphans::owned(listed, cluster_name))
    }

    async fn delete_owned(&self, cluster_name: &str, objects: &[OwnedObject]) -> Vec<CloudResult<()>> {
        let _guard = InFlight::enter(&self.calls);
        let mut out = Vec::with_capacity(objects.len());
        for object in objects {
            if let Err(e) = self.call(methods::DELETE_OWNED, object.id.clone(), true).await {
                out.push(Err(e));
                continue;
            }
            let mut st = self.state();
            // Only a load balancer of this cluster; one already gone is a success.
            if object.kind == crate::orphans::KIND
                && st.load_balancers.get(&object.id).is_some_and(|lb| lb.cluster_name == cluster_name)
                && let Some(lb) = st.load_balancers.remove(&object.id)
            {
                st.addresses.release(&lb.status);
                st.bench_addresses.release(&lb.status);
            }
            out.push(Ok(()));
        }
        out
    }
}

#[async_trait]
impl Routes for FakeProvider {
    async fn list_routes(&self, cluster_name: &str) -> CloudResult<Vec<Route>> {
        let _guard = InFlight::enter(&self.calls);
        self.call(methods::LIST_ROUTES, cluster_name, false).await?;
        Ok(self.cloud_routes(cluster_name))
    }

    async fn create_route(&self, cluster_name: &str, name_hint: &str, route: &Route) -> CloudResult<()> {
        let _guard = InFlight::enter(&self.calls);
        self.call(methods::CREATE_ROUTE, route.destination_cidr.clone(), false).await?;
        // The hint (a Node UID) is shared by a dual-stack Node's two routes: add the CIDR.
        let name = format!("{cluster_name}-{name_hint}-{}", route.destination_cidr.replace(['/', ':', '.'], "-"));
        let stored = Route { name: name.clone(), ..route.clone() };
        self.state().routes.insert((cluster_name.to_string(), name), stored);
        Ok(())
    }

    async fn delete_route(&self, cluster_name: &str, route: &Route) -> CloudResult<()> {
        let _guard = InFlight::enter(&self.calls);
        self.call(methods::DELETE_ROUTE, route.destination_cidr.clone(), false).await?;
        self.state().routes.remove(&(cluster_name.to_string(), route.name.clone()));
        Ok(())
    }
}

#[async_trait]
impl Zones for FakeProvider {
    async fn zone_by_provider_id(&self, provider_id: &str) -> CloudResult<Option<Zone>> {
        let _guard = InFlight::enter(&self.calls);
        self.call(methods::ZONE_BY_PROVIDER_ID, provider_id, false).await?;
        Ok(self
            .lookup_by_provider_id(provider_id)
            .filter(|i| i.exists)
            .map(|i| Zone { failure_domain: i.metadata.zone, region: i.metadata.region }))
    }

    async fn zone_by_node_name(&self, node_name: &str) -> CloudResult<Option<Zone>> {
        let _guard = InFlight::enter(&self.calls);
        self.call(methods::ZONE_BY_NODE_NAME, node_name, false).await?;
        Ok(self
            .instance(node_name)
            .filter(|i| i.exists)
            .map(|i| Zone { failure_domain: i.metadata.zone, region: i.metadata.region }))
    }
}

#[async_trait]
impl Clusters for FakeProvider {
    async fn list_clusters(&self) -> CloudResult<Vec<String>> {
        let _guard = InFlight::enter(&self.calls);
        self.call(methods::LIST_CLUSTERS, "", false).await?;
        Ok(vec![self.state().cluster_name.clone()])
    }

    async fn master(&self, cluster_name: &str) -> CloudResult<String> {
        let _guard = InFlight::enter(&self.calls);
        self.call(methods::MASTER, cluster_name, false).await?;
        Ok("127.0.0.1".to_string())
    }
}

/// Below this, the rest of a latency is slept on a blocking thread.
const TIMER_GRAIN: Duration = Duration::from_millis(1);

/// Wait until `deadline` to within the operating system's sleep precision. tokio's timer has
/// millisecond ticks and rounds up, which made a 20 ms call last 21.1 ms on average where
/// upstream's `bench` provider (Go's timer) takes 20.1; benchmarks compare the managers at the
/// same cloud latency, so the last millisecond is slept on a blocking thread.
async fn wait_until(deadline: tokio::time::Instant) {
    if let Some(coarse) = deadline.checked_sub(TIMER_GRAIN)
        && coarse > tokio::time::Instant::now()
    {
        tokio::time::sleep_until(coarse).await;
    }
    let rest = deadline.saturating_duration_since(tokio::time::Instant::now());
    if !rest.is_zero() {
        // Only fails if the runtime is shutting down; the call is then moot.
        let _ = tokio::task::spawn_blocking(move || std::thread::sleep(rest)).await;
    }
    // Under a paused test clock the thread's sleep did not move tokio's time: finish there.
    if tokio::time::Instant::now() < deadline {
        tokio::time::sleep_until(deadline).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeSpec, ServiceSpec};
    use kube::api::ObjectMeta;

    fn names(hosts: &[String]) -> Vec<&str> {
        hosts.iter().map(String::as_str).collect()
    }

    #[test]
    fn load_balancer_hosts_are_the_sorted_names_whatever_order_or_change_a_call_brings() {
        let mut h = HostNames::default();
        assert!(h.intern(&[]).is_empty());
        let first = h.intern(&["n3", "n1", "n2"]);
        assert_eq!(names(&first), ["n1", "n2", "n3"]);
        let again = h.intern(&["n3", "n1", "n2"]);
        assert!(Arc::ptr_eq(&first, &again), "the same list in the same order shares the stored copy");
        let reordered = h.intern(&["n2", "n3", "n1"]);
        assert!(Arc::ptr_eq(&first, &reordered), "the same names in another order share it too");
        // Same length and order of ranks as before, one name changed: must not be taken as the same.
        assert_eq!(names(&h.intern(&["n2", "n4", "n1"])), ["n1", "n2", "n4"]);
        assert_eq!(names(&h.intern(&["n2", "n1"])), ["n1", "n2"], "a removed Node leaves the set");
        assert_eq!(names(&h.intern(&["n2", "n1", "n0"])), ["n0", "n1", "n2"], "an added Node joins it");
        assert_eq!(names(&h.intern(&["b", "a", "a"])), ["a", "a", "b"]);
        assert_eq!(names(&h.intern(&["a", "b", "b"])), ["a", "b", "b"], "repeats are counted, not just seen");
        assert!(names(&h.intern(&[])).is_empty());
    }

    /// A registry holding the fake alone.
    fn test_registry() -> Registry {
        let mut registry = Registry::new();
        register(&mut registry).unwrap();
        registry
    }

    fn node(name: &str) -> Node {
        Node { metadata: ObjectMeta { name: Some(name.into()), ..Default::default() }, ..Default::default() }
    }

    fn node_with_pid(name: &str, pid: &str) -> Node {
        Node {
            metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
            spec: Some(NodeSpec { provider_id: Some(pid.into()), ..Default::default() }),
            ..Default::default()
        }
    }

    fn service(ns: &str, name: &str, uid: &str) -> Service {
        Service {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(ns.into()),
                uid: (!uid.is_empty()).then(|| uid.into()),
                ..Default::default()
            },
            spec: Some(ServiceSpec { type_: Some("LoadBalancer".into()), ..Default::default() }),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn explicit_instances_are_found_by_provider_id_then_name() {
        let p = FakeProvider::new();
        let meta = InstanceMetadata { provider_id: "fake://i-1".into(), zone: "z1".into(), ..Default::default() };
        p.set_instance("worker-1", FakeInstance::running(meta.clone()));
        let inst = p.instances().unwrap();
        assert_eq!(inst.instance_metadata(&node("worker-1")).await.unwrap(), Some(meta.clone()));
        // A renamed Node is still found through its providerID.
        assert_eq!(inst.instance_metadata(&node_with_pid("renamed", "fake://i-1")).await.unwrap(), Some(meta));
        assert!(!inst.instance_exists(&node("unknown")).await.unwrap());
        assert_eq!(inst.instance_metadata(&node("unknown")).await.unwrap(), None);
        assert_eq!(p.calls().count(methods::INSTANCE_METADATA), 3);
        assert_eq!(p.calls().count(methods::INSTANCE_EXISTS), 1);
        assert_eq!(p.calls().total(), 4);
        assert_eq!(p.calls().subjects(methods::INSTANCE_EXISTS), ["unknown"]);
    }

    #[tokio::test]
    async fn stopped_instances_exist_and_report_shutdown_absent_ones_have_no_metadata() {
        let p = FakeProvider::new();
        p.set_instance("a", FakeInstance { shutdown: true, ..FakeInstance::derived("a") });
        p.set_instance("b", FakeInstance { exists: false, ..FakeInstance::derived("b") });
        let inst = p.instances().unwrap();
        assert!(inst.instance_exists(&node("a")).await.unwrap());
        assert!(inst.instance_shutdown(&node("a")).await.unwrap());
        assert!(!inst.instance_exists(&node("b")).await.unwrap());
        assert_eq!(inst.instance_metadata(&node("b")).await.unwrap(), None);
    }

    #[tokio::test]
    async fn auto_instances_derive_stable_metadata_from_the_name() {
        let p = FakeProvider::new();
        p.set_auto_instances(true);
        let inst = p.instances().unwrap();
        let m = inst.instance_metadata(&node("node-17")).await.unwrap().unwrap();
        assert_eq!(m.provider_id, "fake://node-17");
        assert!(m.instance_type.starts_with("fake."));
        assert!(m.zone.starts_with("fake-zone-"));
        assert_eq!(m.region, "fake-region-1");
        assert_eq!(m.node_addresses.len(), 1);
        assert_eq!(m.node_addresses[0].type_, "InternalIP");
        assert!(m.node_addresses[0].address.starts_with("10."));
        assert_eq!(Some(m), inst.instance_metadata(&node("node-17")).await.unwrap(), "same name, same metadata");
        assert!(inst.instance_exists(&node_with_pid("x", "fake://node-3")).await.unwrap());
        // Removing a name in auto mode makes it vanish, and setting it brings it back.
        p.remove_instance("node-17");
        assert!(!inst.instance_exists(&node("node-17")).await.unwrap());
        assert!(!inst.instance_exists(&node_with_pid("node-17", "fake://node-17")).await.unwrap());
        p.set_instance("node-17", FakeInstance::derived("node-17"));
        assert!(inst.instance_exists(&node("node-17")).await.unwrap());
    }

    #[tokio::test]
    async fn a_batch_is_one_call_per_chunk_of_batch_size() {
        let p = FakeProvider::new();
        p.set_auto_instances(true);
        p.set_batch_size(4);
        let nodes: Vec<Node> = (0..10).map(|i| node(&format!("n{i}"))).collect();
        let refs: Vec<&Node> = nodes.iter().collect();
        let inst = p.instances().unwrap();
        assert_eq!(inst.batch_size(), 4);
        let got = inst.instances_metadata(&refs).await;
        assert_eq!(got.len(), 10);
        for (n, r) in nodes.iter().zip(&got) {
            assert_eq!(r.as_ref().unwrap().as_ref().unwrap().provider_id, format!("fake://{}", n.name_any()));
        }
        assert_eq!(p.calls().count(methods::INSTANCES_METADATA), 3, "10 nodes in chunks of 4");
        assert_eq!(p.calls().count(methods::INSTANCE_METADATA), 0, "no single lookups");
        assert_eq!(inst.instances_exist(&refs).await.into_iter().filter(|r| *r.as_ref().unwrap()).count(), 10);
        assert_eq!(inst.instances_shutdown(&refs[..2]).await.len(), 2);
        assert_eq!(p.calls().count(methods::INSTANCES_EXIST), 3);
        assert_eq!(p.calls().count(methods::INSTANCES_SHUTDOWN), 1);
        assert_eq!(p.calls().total(), 7);
    }

    #[tokio::test]
    async fn a_failed_batch_chunk_fails_every_node_in_it() {
        let p = FakeProvider::new();
        p.set_auto_instances(true);
        p.set_batch_size(2);
        p.fail_next(methods::INSTANCES_EXIST, 1, CloudError::Unavailable("down".into()));
        let nodes: Vec<Node> = (0..4).map(|i| node(&format!("n{i}"))).collect();
        let refs: Vec<&Node> = nodes.iter().collect();
        let got = p.instances().unwrap().instances_exist(&refs).await;
        let failed = got.iter().filter(|r| r.is_err()).count();
        assert_eq!(failed, 2, "{got:?}");
        assert!(matches!(got[0], Err(CloudError::Unavailable(_))));
    }

    #[tokio::test]
    async fn fail_next_fails_exactly_n_calls_with_the_chosen_error() {
        let p = FakeProvider::new();
        p.set_auto_instances(true);
        p.fail_next(methods::INSTANCE_METADATA, 2, CloudError::retry_after(Duration::from_secs(15), "creating"));
        let inst = p.instances().unwrap();
        for _ in 0..2 {
            let e = inst.instance_metadata(&node("a")).await.unwrap_err();
            assert_eq!(e.requested_delay(), Some(Duration::from_secs(15)));
        }
        assert!(inst.instance_metadata(&node("a")).await.unwrap().is_some());
        // Other methods were never affected.
        assert!(inst.instance_exists(&node("a")).await.unwrap());
        assert_eq!(p.calls().count(methods::INSTANCE_METADATA), 3, "failed calls are counted too");
    }

    #[tokio::test]
    async fn a_wildcard_fault_hits_every_method_without_its_own() {
        let p = FakeProvider::new();
        p.set_auto_instances(true);
        p.fail_rate("*", 1.0, CloudError::Unauthorized("token revoked".into()));
        p.fail_next(methods::INSTANCE_EXISTS, 0, CloudError::Other("unused".into()));
        let inst = p.instances().unwrap();
        assert!(matches!(inst.instance_metadata(&node("a")).await, Err(CloudError::Unauthorized(_))));
        assert!(inst.instance_exists(&node("a")).await.unwrap(), "an exhausted own fault shadows *");
        p.clear_faults();
        assert!(inst.instance_metadata(&node("a")).await.is_ok());
    }

    #[tokio::test]
    async fn a_fault_rate_fails_about_that_share_of_calls_reproducibly() {
        let run = || async {
            let p = FakeProvider::new();
            p.set_auto_instances(true);
            p.fail_rate(methods::INSTANCE_EXISTS, 0.25, CloudError::Unavailable("flaky".into()));
            let mut failures = 0;
            for _ in 0..2000 {
                if p.instance_exists(&node("a")).await.is_err() {
                    failures += 1;
                }
            }
            failures
        };
        let first = run().await;
        assert!((400..=600).contains(&first), "{first} of 2000 failed");
        assert_eq!(first, run().await, "same seed, same failures");
    }

    #[tokio::test(start_paused = true)]
    async fn latency_is_applied_per_call_and_separately_for_load_balancers() {
        let p = FakeProvider::new();
        p.set_auto_instances(true);
        p.set_latency(Duration::from_millis(30));
        p.set_load_balancer_latency(Duration::from_millis(500));
        let start = tokio::time::Instant::now();
        p.instance_exists(&node("a")).await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_millis(30));
        let start = tokio::time::Instant::now();
        p.get_load_balancer("kubernetes", &service("default", "web", "")).await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_millis(500));
    }

    #[tokio::test]
    async fn load_balancers_get_stable_addresses_from_the_range_and_release_them() {
        let p = FakeProvider::from_config(&FakeConfig {
            load_balancer_ip_range: Some("192.0.2.0/30".parse().unwrap()),
            ..Default::default()
        })
        .unwrap();
        let lb = p.load_balancer().unwrap();
        let (a, b, c) = (service("ns", "a", "uid-a"), service("ns", "b", ""), service("ns", "c", ""));
        let n1 = node("n1");
        assert_eq!(lb.get_load_balancer("k", &a).await.unwrap(), None, "absence is a value");
        let sa = lb.ensure_load_balancer("k", &a, &[&n1]).await.unwrap();
        assert_eq!(sa.ingress.as_ref().unwrap()[0].ip.as_deref(), Some("192.0.2.1"));
        assert_eq!(lb.ensure_load_balancer("k", &a, &[]).await.unwrap(), sa, "re-ensure keeps the address");
        let sb = lb.ensure_load_balancer("k", &b, &[&n1]).await.unwrap();
        assert_eq!(sb.ingress.as_ref().unwrap()[0].ip.as_deref(), Some("192.0.2.2"));
        // A /30 has two usable addresses.
        assert!(matches!(lb.ensure_load_balancer("k", &c, &[]).await, Err(CloudError::Other(_))));
        lb.update_load_balancer("k", &b, &[&node("n2"), &n1]).await.unwrap();
        assert_eq!(*p.load_balancer_for("ns", "b").unwrap().hosts, ["n1", "n2"]);
        lb.ensure_load_balancer_deleted("k", &a).await.unwrap();
        lb.ensure_load_balancer_deleted("k", &a).await.unwrap();
        assert_eq!(lb.get_load_balancer("k", &a).await.unwrap(), None);
        let sc = lb.ensure_load_balancer("k", &c, &[]).await.unwrap();
        assert_eq!(sc.ingress.as_ref().unwrap()[0].ip.as_deref(), Some("192.0.2.1"), "released address reused");
        assert_eq!(p.load_balancers().len(), 2);
        assert_eq!(p.calls().count(methods::ENSURE_LOAD_BALANCER), 5);
        assert_eq!(p.calls().count(methods::ENSURE_LOAD_BALANCER_DELETED), 2);
    }

    fn bench() -> FakeProvider {
        FakeProvider::from_cloud_config(Some(b"profile: bench\nlatency: 0s\nloadBalancerLatency: 0s\n")).unwrap()
    }

    fn node_with_addresses(name: &str, addresses: &[(&str, &str)]) -> Node {
        let mut n = node(name);
        n.status = Some(k8s_openapi::api::core::v1::NodeStatus {
            addresses: Some(
                addresses.iter().map(|(t, a)| NodeAddress { type_: (*t).into(), address: (*a).into() }).collect(),
            ),
            ..Default::default()
        });
        n
    }

    fn with_ingress(mut svc: Service, ip: &str) -> Service {
        svc.status = Some(k8s_openapi::api::core::v1::ServiceStatus {
            load_balancer: Some(LoadBalancerStatus {
                ingress: Some(vec![LoadBalancerIngress { ip: Some(ip.into()), ..Default::default() }]),
            }),
            ..Default::default()
        });
        svc
    }

    fn ip(status: &LoadBalancerStatus) -> &str {
        status.ingress.as_ref().unwrap()[0].ip.as_deref().unwrap()
    }

    #[tokio::test]
    async fn the_bench_profile_reports_upstream_benchs_metadata_and_the_nodes_own_addresses() {
        let p = bench();
        let inst = p.instances().unwrap();
        let m = inst.instance_metadata(&node("node-1")).await.unwrap().unwrap();
        assert_eq!(m.provider_id, "bench://node-1");
        assert_eq!(
            (m.instance_type.as_str(), m.zone.as_str(), m.region.as_str()),
            ("bench.small", "bench-zone-a", "bench-region")
        );
        assert_eq!(
            m.node_addresses,
            [NodeAddress { type_: "Hostname".into(), address: "node-1".into() }],
            "a Hostname of the name"
        );
        assert!(m.additional_labels.is_empty());
        let own = node_with_addresses(
            "n2",
            &[("ExternalIP", "203.0.113.9"), ("InternalIP", "192.168.0.2"), ("Hostname", "h2")],
        );
        let m = inst.instance_metadata(&own).await.unwrap().unwrap();
        let got: Vec<_> = m.node_addresses.iter().map(|a| (a.type_.as_str(), a.address.as_str())).collect();
        assert_eq!(got, [("InternalIP", "192.168.0.2"), ("Hostname", "h2")], "only Hostname and InternalIP, in order");
        // Every Node exists and runs, also one with another cloud's providerID.
        assert!(inst.instance_exists(&node_with_pid("x", "fake://x")).await.unwrap());
        assert!(!inst.instance_shutdown(&node("x")).await.unwrap());
        assert_eq!(p.instance("node-1").unwrap().metadata.provider_id, "bench://node-1");
    }

    #[tokio::test]
    async fn bench_internal_ip_prepends_upstreams_fnv1a_address() {
        // Values computed with Go's hash/fnv New32a as upstream's main.go does.
        assert_eq!(bench_internal_ip("node-1").to_string(), "10.51.196.85");
        assert_eq!(bench_internal_ip("worker-a").to_string(), "10.125.249.164");
        let p = FakeProvider::from_cloud_config(Some(b"profile: bench\nbenchInternalIP: true\n")).unwrap();
        let m = p.instance_metadata(&node_with_addresses("node-1", &[("Hostname", "node-1")])).await.unwrap().unwrap();
        let got: Vec<_> = m.node_addresses.iter().map(|a| (a.type_.as_str(), a.address.as_str())).collect();
        assert_eq!(got, [("InternalIP", "10.51.196.85"), ("Hostname", "node-1")]);
    }

    #[tokio::test]
    async fn the_bench_profile_offers_instances_and_load_balancers_only_with_benchs_latencies() {
        let p = FakeProvider::from_cloud_config(Some(b"profile: bench\n")).unwrap();
        assert!(p.instances().is_some() && p.load_balancer().is_some());
        assert!(p.zones().is_none() && p.clusters().is_none() && p.routes().is_none());
        assert_eq!(p.profile(), FakeProfile::Bench);
        {
            let st = p.state();
            assert_eq!((st.latency, st.load_balancer_latency), (BENCH_INSTANCE_LATENCY, BENCH_LB_LATENCY));
        }
        let p =
            FakeProvider::from_cloud_config(Some(b"profile: bench\nlatency: 1ms\nloadBalancerLatency: 2ms\n")).unwrap();
        let st = p.state();
        assert_eq!((st.latency, st.load_balancer_latency), (Duration::from_millis(1), Duration::from_millis(2)));
    }

    #[tokio::test]
    async fn a_bench_batch_is_one_single_call_per_node_as_upstream_makes() {
        let p = bench();
        let nodes: Vec<Node> = (0..3).map(|i| node(&format!("n{i}"))).collect();
        let refs: Vec<&Node> = nodes.iter().collect();
        let got = p.instances_metadata(&refs).await;
        assert_eq!(got[2].as_ref().unwrap().as_ref().unwrap().provider_id, "bench://n2");
        assert_eq!(p.instances_exist(&refs).await.len(), 3);
        assert_eq!(p.calls().count(methods::INSTANCE_METADATA), 3);
        assert_eq!(p.calls().count(methods::INSTANCE_EXISTS), 3);
        assert_eq!(p.calls().count(methods::INSTANCES_METADATA), 0);
    }

    #[tokio::test]
    async fn bench_load_balancers_count_up_from_198_18_0_1_stable_per_service() {
        let p = bench();
        let lb = p.load_balancer().unwrap();
        let mut a = service("ns", "a", "uid-a");
        a.spec.as_mut().unwrap().load_balancer_ip = Some("192.0.2.7".into());
        let b = service("ns", "b", "uid-b");
        assert_eq!(lb.get_load_balancer("k", &a).await.unwrap(), None, "only ensured ones exist");
        assert_eq!(ip(&lb.ensure_load_balancer("k", &a, &[]).await.unwrap()), "198.18.0.1", "loadBalancerIP ignored");
        assert_eq!(ip(&lb.ensure_load_balancer("k", &b, &[]).await.unwrap()), "198.18.0.2");
        assert_eq!(ip(&lb.ensure_load_balancer("k", &a, &[]).await.unwrap()), "198.18.0.1");
        assert_eq!(ip(&lb.get_load_balancer("k", &b).await.unwrap().unwrap()), "198.18.0.2");
        assert_eq!(p.calls().changes(LoadBalancerChange::Create), 2);
        assert_eq!(p.calls().changes(LoadBalancerChange::Update), 1);
        assert_eq!(p.calls().changed(LoadBalancerChange::Create), ["ns/a", "ns/b"]);
    }

    #[tokio::test]
    async fn a_service_holding_a_bench_address_has_that_load_balancer_and_is_not_recreated() {
        let p = bench();
        let lb = p.load_balancer().unwrap();
        let adopted = with_ingress(service("ns", "old", "uid-old"), "198.18.0.1");
        let foreign = with_ingress(service("ns", "other", "uid-other"), "192.0.2.1");
        assert_eq!(ip(&lb.get_load_balancer("k", &adopted).await.unwrap().unwrap()), "198.18.0.1");
        assert_eq!(lb.get_load_balancer("k", &foreign).await.unwrap(), None, "not a bench address");
        assert_eq!(ip(&lb.ensure_load_balancer("k", &adopted, &[]).await.unwrap()), "198.18.0.1", "address kept");
        lb.update_load_balancer("k", &adopted, &[&node("n1")]).await.unwrap();
        assert_eq!(p.calls().changes(LoadBalancerChange::Create), 0);
        assert_eq!(p.calls().changes(LoadBalancerChange::Update), 2);
        // A new Service does not get the adopted address.
        let fresh = service("ns", "new", "uid-new");
        assert_eq!(ip(&lb.ensure_load_balancer("k", &fresh, &[]).await.unwrap()), "198.18.0.2");
        assert_eq!(p.calls().changes(LoadBalancerChange::Create), 1);
        let gone = with_ingress(service("ns", "gone", "uid-gone"), "198.18.9.9");
        lb.ensure_load_balancer_deleted("k", &gone).await.unwrap();
        lb.ensure_load_balancer_deleted("k", &service("ns", "never", "uid-never")).await.unwrap();
        assert_eq!(p.calls().changed(LoadBalancerChange::Delete), ["ns/gone"], "a no-op delete is no change");
    }

    #[tokio::test]
    async fn the_fake_profile_tells_load_balancer_creates_from_updates_and_ignores_bench_addresses() {
        let p = FakeProvider::new();
        let lb = p.load_balancer().unwrap();
        let svc = with_ingress(service("ns", "a", "uid-a"), "198.18.0.1");
        assert_eq!(lb.get_load_balancer("k", &svc).await.unwrap(), None, "no adoption outside bench");
        lb.ensure_load_balancer("k", &svc, &[]).await.unwrap();
        lb.ensure_load_balancer("k", &svc, &[]).await.unwrap();
        lb.update_load_balancer("k", &svc, &[]).await.unwrap();
        lb.ensure_load_balancer_deleted("k", &svc).await.unwrap();
        let counts: Vec<usize> = LoadBalancerChange::ALL.iter().map(|c| p.calls().changes(*c)).collect();
        assert_eq!(counts, [1, 2, 1]);
        let metrics = ccm_framework::metrics::Metrics::new();
        metrics.get_or_register(CHANGES_METRIC, "changes", || p.calls().change_metric());
        let text = metrics.encode();
        assert!(text.contains(r#"fake_load_balancer_changes_total{change="create"} 1"#), "{text}");
        assert!(text.contains(r#"fake_load_balancer_changes_total{change="update"} 2"#), "{text}");
    }

    #[test]
    fn the_bench_profile_refuses_settings_it_would_ignore() {
        for (yaml, want) in [
            (&b"profile: bench\ninstances: [{name: a}]\n"[..], "instances cannot be listed"),
            (b"profile: bench\nloadBalancerIPRange: 10.0.0.0/8\n", "loadBalancerIPRange cannot be set"),
            (b"benchInternalIP: true\n", "benchInternalIP needs profile: bench"),
        ] {
            let err = FakeProvider::from_cloud_config(Some(yaml)).unwrap_err();
            assert!(err.to_string().contains(want), "{err}");
        }
    }

    #[tokio::test]
    async fn routes_are_kept_per_cluster() {
        let p = FakeProvider::new();
        let r = p.routes().unwrap();
        let route = Route { target_node: "n1".into(), destination_cidr: "10.244.1.0/24".into(), ..Default::default() };
        r.create_route("k", "uid-1", &route).await.unwrap();
        p.insert_route("other", Route { name: "x".into(), ..Default::default() });
        let listed = r.list_routes("k").await.unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].name, "k-uid-1-10-244-1-0-24");
        assert_eq!(listed[0].destination_cidr, "10.244.1.0/24");
        r.delete_route("k", &listed[0]).await.unwrap();
        assert!(r.list_routes("k").await.unwrap().is_empty());
        assert_eq!(p.cloud_routes("other").len(), 1);
        assert_eq!(p.calls().subjects(methods::CREATE_ROUTE), ["10.244.1.0/24"]);
    }

    #[tokio::test]
    async fn a_dual_stack_nodes_two_routes_are_both_kept() {
        let p = FakeProvider::new();
        let r = p.routes().unwrap();
        for cidr in ["10.244.1.0/24", "fd00:10:244:1::/64"] {
            let route = Route { target_node: "n1".into(), destination_cidr: cidr.into(), ..Default::default() };
            r.create_route("k", "uid-1", &route).await.unwrap();
        }
        let mut cidrs: Vec<_> = r.list_routes("k").await.unwrap().into_iter().map(|r| r.destination_cidr).collect();
        cidrs.sort();
        assert_eq!(cidrs, ["10.244.1.0/24", "fd00:10:244:1::/64"]);
    }

    #[tokio::test]
    async fn capabilities_can_be_disabled_like_upstreams_fake() {
        let p = FakeProvider::new();
        assert!(p.instances().is_some() && p.load_balancer().is_some() && p.routes().is_some());
        p.set_capabilities(FakeCapabilities { routes: false, load_balancer: false, ..Default::default() });
        assert!(p.routes().is_none());
        assert!(p.load_balancer().is_none());
        assert!(p.instances().is_some());
    }

    #[tokio::test]
    async fn health_is_settable_and_counted() {
        let p = FakeProvider::new();
        assert!(p.health().await.is_healthy());
        p.set_health(Health::unhealthy("CredentialsRejected", "401"));
        let h = p.health().await;
        assert_eq!(h.reason(), "CredentialsRejected");
        assert_eq!(p.calls().count(methods::HEALTH), 2);
    }

    #[tokio::test]
    async fn peak_in_flight_tracks_concurrent_calls() {
        let p = Arc::new(FakeProvider::new());
        p.set_auto_instances(true);
        p.set_latency(Duration::from_millis(20));
        let tasks: Vec<_> = (0..5)
            .map(|i| {
                let p = p.clone();
                tokio::spawn(async move { p.instance_exists(&node(&format!("n{i}"))).await })
            })
            .collect();
        for t in tasks {
            t.await.unwrap().unwrap();
        }
        assert_eq!(p.calls().peak_in_flight(), 5);
        assert_eq!(p.calls().in_flight(), 0);
    }

    #[test]
    fn cloud_config_sets_every_knob() {
        let yaml = br#"
autoInstances: true
latency: 20ms
loadBalancerLatency: 1s
batchSize: 50
loadBalancerIPRange: 198.51.100.0/24
disableRoutes: true
seed: 7
instances:
  - name: node-1
    zone: zone-b
    addresses: [{type: InternalIP, address: 10.0.0.9}]
  - name: gone
    exists: false
failures:
  - method: ensure_load_balancer
    times: 2
    error: retryAfter
    retryAfter: 15s
health: {healthy: false, reason: CredentialsRejected, message: "token rejected"}
"#;
        let p = FakeProvider::from_cloud_config(Some(yaml)).unwrap();
        let st = p.state();
        assert!(st.auto_instances);
        assert_eq!(st.latency, Duration::from_millis(20));
        assert_eq!(st.load_balancer_latency, Duration::from_secs(1));
        assert_eq!(st.batch_size, 50);
        assert_eq!(st.addresses.range().to_string(), "198.51.100.0/24");
        assert!(!st.capabilities.routes && st.capabilities.instances);
        assert_eq!(st.health.reason(), "CredentialsRejected");
        let n1 = &st.instances["node-1"];
        assert_eq!(n1.metadata.zone, "zone-b");
        assert_eq!(n1.metadata.provider_id, "fake://node-1");
        assert_eq!(n1.metadata.node_addresses[0].address, "10.0.0.9");
        assert!(!st.instances["gone"].exists);
        let f = st.faults.get(methods::ENSURE_LOAD_BALANCER).unwrap();
        assert_eq!(f.remaining, Some(2));
        assert_eq!(f.error.requested_delay(), Some(Duration::from_secs(15)));
    }

    #[test]
    fn no_cloud_config_error_quotes_the_document_through_the_registry() {
        let registry = test_registry();
        let cluster = ccm_framework::registry::ClusterSettings::default();
        for doc in crate::config::tests::token_documents() {
            let err = registry.create(NAME, Some(doc.as_bytes()), &cluster).err().expect("refused");
            for text in [err.to_string(), format!("{err:?}")] {
                assert!(!text.contains("SECRET"), "{doc}\n=> {text}");
            }
        }
    }

    #[test]
    fn hostile_cloud_configs_are_refused_by_the_registry_with_the_limit_they_break() {
        let registry = test_registry();
        let cluster = ccm_framework::registry::ClusterSettings::default();
        for (name, doc, _) in ccm_framework::safe_yaml::hostile::all() {
            let err = registry.create(NAME, Some(&doc), &cluster).err().expect("refused");
            assert!(err.to_string().contains("limit of"), "{name}: {err}");
        }
    }

    #[test]
    fn the_fake_is_registered_and_built_from_its_cloud_config() {
        let registry = test_registry();
        assert!(registry.contains(NAME));
        let cluster = ccm_framework::registry::ClusterSettings { cluster_name: "prod".into(), ..Default::default() };
        let p = registry.create(NAME, Some(b"disableLoadBalancers: true\n"), &cluster).unwrap();
        assert_eq!(p.name(), "fake");
        assert!(p.load_balancer().is_none());
        let err = registry.create(NAME, Some(b"nope: 1\n"), &cluster).unwrap_err();
        assert!(err.to_string().starts_with("could not init cloud provider"), "{err}");
    }
}
