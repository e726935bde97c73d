//! The baremetal cloud-config: typed YAML, parsed strictly and validated before use.
//!
//! Every struct denies unknown fields, so a typo is an error with its path and line rather than
//! a silently ignored setting. Errors are [`DocumentError`]s: a path made of field names and
//! indices and a fixed description, never a value or key of the document (which may hold
//! secrets). The document is size- and depth-limited before parsing ([`CLOUD_CONFIG_LIMITS`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::net::IpAddr;
use std::sync::OnceLock;
use std::time::Duration;

use serde::{Deserialize, Deserializer};

pub use crate::duration::{BAD_DURATION, HUGE_DURATION, NEGATIVE_DURATION, parse_duration};
use crate::ipam::{IpBlock, Pool};
use crate::name::NAME;
pub use crate::selector::{LabelSelectorConfig, SelectorOperator, SelectorRequirement};
use ccm_framework::safe_yaml::{
    self, CLOUD_CONFIG_LIMITS, DUPLICATE_KEY, DocumentError, FieldPath, Problem, Schema, unique_string_map,
};

/// Why a cloud-config was rejected: the path of the culprit and what is wrong with it.
pub type ConfigError = DocumentError;

/// The whole cloud-config document.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CloudConfig {
    /// The machines that may become Nodes.
    #[serde(default)]
    pub instances: Vec<InstanceConfig>,
    /// Load-balancer IP pools.
    #[serde(default)]
    pub load_balancer: LoadBalancerConfig,
    /// Node lifecycle: absent-node policy and liveness probing.
    #[serde(default)]
    pub lifecycle: LifecycleConfig,
}

/// One machine of the inventory.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct InstanceConfig {
    /// The Node name.
    pub name: String,
    /// The providerID; `baremetal://<name>` when unset.
    #[serde(default, rename = "providerID")]
    pub provider_id: Option<String>,
    /// The Node's addresses, in the order they are reported.
    #[serde(default)]
    pub addresses: Vec<AddressConfig>,
    /// Becomes the `node.kubernetes.io/instance-type` label.
    #[serde(default)]
    pub instance_type: Option<String>,
    /// Becomes the `topology.kubernetes.io/zone` label.
    #[serde(default)]
    pub zone: Option<String>,
    /// Becomes the `topology.kubernetes.io/region` label.
    #[serde(default)]
    pub region: Option<String>,
    /// Extra Node labels (never in the `kubernetes.io` / `k8s.io` namespaces).
    #[serde(default, deserialize_with = "unique_string_map")]
    pub labels: BTreeMap<String, String>,
    /// Whether the machine is running or known to be shut down.
    #[serde(default)]
    pub state: InstanceState,
}

impl InstanceConfig {
    /// The providerID this instance reports.
    pub fn effective_provider_id(&self) -> String {
        match &self.provider_id {
            Some(id) => id.clone(),
            None => format!("{NAME}://{}", self.name),
        }
    }
}

/// A declared instance state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InstanceState {
    /// Running (unless its probe fails).
    #[default]
    Running,
    /// Shut down: the lifecycle controller taints its Node.
    Shutdown,
}

/// One Node address.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AddressConfig {
    /// The address type, as in `NodeAddress.type`.
    #[serde(rename = "type")]
    pub type_: AddressType,
    /// The address: an IP for the IP types, a DNS name otherwise.
    pub address: String,
}

/// Node address types (the names Kubernetes uses).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
pub enum AddressType {
    /// `InternalIP`.
    InternalIP,
    /// `ExternalIP`.
    ExternalIP,
    /// `InternalDNS`.
    InternalDNS,
    /// `ExternalDNS`.
    ExternalDNS,
    /// `Hostname`.
    Hostname,
}

impl AddressType {
    /// The Kubernetes spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            AddressType::InternalIP => "InternalIP",
            AddressType::ExternalIP => "ExternalIP",
            AddressType::InternalDNS => "InternalDNS",
            AddressType::ExternalDNS => "ExternalDNS",
            AddressType::Hostname => "Hostname",
        }
    }

    /// Whether the address must be an IP.
    pub fn is_ip(self) -> bool {
        matches!(self, AddressType::InternalIP | AddressType::ExternalIP)
    }
}

/// Load-balancer settings.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LoadBalancerConfig {
    /// Address pools, tried in this order.
    #[serde(default)]
    pub pools: Vec<PoolConfig>,
    /// How long a Service waits before retrying when no address can be given to it.
    #[serde(default = "default_retry_after", deserialize_with = "duration")]
    pub retry_after: Duration,
    /// `addresses` (default: assign only) or `proxy` (the leader also carries the traffic).
    #[serde(default)]
    pub mode: crate::proxy::Mode,
    /// Data-path settings for `mode: proxy`.
    #[serde(default)]
    pub proxy: crate::proxy::ProxyConfig,
    /// Write kube-vip's `kube-vip.io/loadbalancerIPs` annotation on every Service with addresses.
    #[serde(default)]
    pub kube_vip: bool,
    /// Also hand out addresses from `LoadBalancerIPPool` resources (after the pools above; the
    /// CRD must be installed). Read at start.
    #[serde(default)]
    pub pool_resources: bool,
    /// The port rule of every pool that is not in this file: `LoadBalancerIPPool` resources and
    /// imported pools (their authors choose addresses, not ports). Unset: the default rule.
    #[serde(default)]
    pub resource_pool_ports: Option<PortRuleConfig>,
    /// Also hand out addresses from MetalLB's, Cilium's or kube-vip-cloud-provider's pools, read
    /// in place at start (after the pool resources; needs `poolResources: true`); MetalLB's from
    /// its own namespace only, kube-vip's from its one ConfigMap. See
    /// docs/migrating-load-balancers.md.
    #[serde(default)]
    pub import_pools: Vec<crate::pool_import::ImportSource>,
    /// How assigned addresses are announced to the network (L2, BGP); none by default.
    #[serde(default)]
    pub announcement: crate::announce::AnnouncementConfig,
}

impl Default for LoadBalancerConfig {
    fn default() -> Self {
        Self {
            pools: Vec::new(),
            retry_after: default_retry_after(),
            mode: Default::default(),
            proxy: Default::default(),
            kube_vip: false,
            pool_resources: false,
            resource_pool_ports: None,
            import_pools: Vec::new(),
            announcement: Default::default(),
        }
    }
}

/// One address pool.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PoolConfig {
    /// Unique pool name.
    pub name: String,
    /// CIDRs whose every address belongs to the pool.
    #[serde(default)]
    pub cidrs: Vec<String>,
    /// Inclusive `start-end` ranges.
    #[serde(default)]
    pub ranges: Vec<String>,
    /// Only Services in these namespaces may use the pool; empty means all.
    #[serde(default)]
    pub namespaces: Vec<String>,
    /// Only Services whose labels match may use the pool.
    #[serde(default)]
    pub service_selector: Option<LabelSelectorConfig>,
    /// Skip IPv4 addresses ending in `.0` or `.255`, which some clients mishandle.
    #[serde(default, rename = "avoidBuggyIPs")]
    pub avoid_buggy_ips: bool,
    /// Let Services with the same `ccm.rs/allow-shared-ip` key and distinct ports share an IP.
    #[serde(default)]
    pub allow_sharing: bool,
    /// Allow loopback addresses (127.0.0.0/8, ::1), which are otherwise refused or left out:
    /// only useful when the data path answers on the node itself.
    #[serde(default)]
    pub allow_loopback: bool,
    /// Service ports below this are refused on the pool's addresses (default 1).
    #[serde(default)]
    pub min_port: Option<u16>,
    /// Service ports allowed on the pool's addresses (`"443"`, `"8000-8999"`); unset allows
    /// every port, except on a pool holding node addresses, which then allows none (see
    /// [`crate::ports`]).
    #[serde(default)]
    pub allowed_ports: Option<Vec<String>>,
    /// How the announcers announce the pool's addresses: which nodes, which node first for
    /// L2, and the BGP attributes of its routes (docs/datapath.md, "Advertisement per pool").
    #[serde(default)]
    pub advertisement: Option<crate::advertisement::PolicyConfig>,
}

/// A port rule on its own: `minPort` and `allowedPorts`, as a pool has them.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PortRuleConfig {
    /// Service ports below this are refused (default 1).
    #[serde(default)]
    pub min_port: Option<u16>,
    /// Service ports allowed; unset allows every port, except on a pool holding node
    /// addresses, which then allows none.
    #[serde(default)]
    pub allowed_ports: Option<Vec<String>>,
}

/// Node lifecycle settings.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LifecycleConfig {
    /// Report Nodes missing from the inventory as gone (they are then deleted). Off by default
    /// so that an inventory typo never deletes a Node.
    #[serde(default)]
    pub delete_absent_nodes: bool,
    /// TCP liveness probing of the instances.
    #[serde(default)]
    pub probe: Option<ProbeConfig>,
}

/// TCP liveness probe settings.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ProbeConfig {
    /// The TCP port to connect to (for example 22 or the kubelet's 10250).
    pub port: u16,
    /// Time between the starts of two probe rounds.
    #[serde(default = "default_interval", deserialize_with = "duration")]
    pub interval: Duration,
    /// How long one connection attempt may take.
    #[serde(default = "default_timeout", deserialize_with = "duration")]
    pub timeout: Duration,
    /// Consecutive failures before an instance is reported shut down.
    #[serde(default = "default_failure_threshold")]
    pub failure_threshold: u32,
    /// Consecutive successes before a shut-down instance is reported running again.
    #[serde(default = "default_success_threshold")]
    pub success_threshold: u32,
    /// Probes in flight at once.
    #[serde(default = "default_concurrency")]
    pub concurrency: usize,
    /// Which of an instance's addresses to probe, in order of preference.
    #[serde(default = "default_probe_address_types")]
    pub address_types: Vec<AddressType>,
}

fn default_retry_after() -> Duration {
    Duration::from_secs(30)
}
fn default_interval() -> Duration {
    Duration::from_secs(10)
}
fn default_timeout() -> Duration {
    Duration::from_secs(2)
}
fn default_failure_threshold() -> u32 {
    3
}
fn default_success_threshold() -> u32 {
    1
}
fn default_concurrency() -> usize {
    16
}
fn default_probe_address_types() -> Vec<AddressType> {
    vec![AddressType::InternalIP, AddressType::ExternalIP]
}

fn duration<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
    // A visitor, so the error is raised inside the YAML deserializer and carries the field's
    // path and line.
    struct Visitor;
    impl serde::de::Visitor<'_> for Visitor {
        type Value = Duration;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a duration such as 1m30s, 500ms or 2h")
        }
        fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Duration, E> {
            parse_duration(text).map_err(safe_yaml::custom)
        }
    }
    deserializer.deserialize_str(Visitor)
}

/// The names errors may print: this schema's fields and enum values, and its fixed messages.
fn schema() -> &'static Schema {
    static SCHEMA: OnceLock<Schema> = OnceLock::new();
    SCHEMA.get_or_init(|| {
        Schema::new()
            .with::<CloudConfig>()
            .with::<InstanceConfig>()
            .with::<InstanceState>()
            .with::<AddressConfig>()
            .with::<AddressType>()
            .with::<LoadBalancerConfig>()
            .with::<crate::pool_import::Source>()
            .with::<crate::pool_import::ImportEntry>()
            .with_messages(&[crate::pool_import::BAD_IMPORT_ENTRY])
            .with::<crate::proxy::Mode>()
            .with::<crate::proxy::ProxyConfig>()
            .with::<crate::proxy::BindConfig>()
            .with::<crate::proxy::BalanceConfig>()
            .with_messages(crate::proxy::MESSAGES)
            .with_messages(&[
                crate::ports::BAD_PORT_RANGE,
                crate::ports::BAD_MIN_PORT,
                crate::ports::TOO_MANY_RANGES,
                CAP_ABOVE_TOTAL_TCP,
                CAP_ABOVE_TOTAL_UDP,
                CAP_ABOVE_SERVICE_TCP,
                CAP_ABOVE_SERVICE_UDP,
                NOT_AN_L2_INTERFACE,
            ])
            .with::<PoolConfig>()
            .with::<PortRuleConfig>()
            .with::<LabelSelectorConfig>()
            .with::<SelectorRequirement>()
            .with::<SelectorOperator>()
            .with::<LifecycleConfig>()
            .with::<ProbeConfig>()
            .with::<crate::announce::AnnouncementConfig>()
            .with::<crate::announce::l2::L2Config>()
            .with_messages(crate::announce::l2::MESSAGES)
            .with::<crate::announce::bgp::BgpConfig>()
            .with::<crate::announce::bgp::PeerConfig>()
            .with::<crate::announce::bgp::BfdConfig>()
            .with::<crate::announce::bgp::GracefulRestartConfig>()
            .with_messages(crate::announce::bgp::MESSAGES)
            .with::<crate::announce::health::HealthConfig>()
            .with_messages(crate::announce::health::MESSAGES)
            .with_messages(&[BAD_DURATION, NEGATIVE_DURATION, HUGE_DURATION, DUPLICATE_KEY])
    })
}

/// Parse and validate a cloud-config document (at most [`CLOUD_CONFIG_LIMITS`]).
pub fn parse(bytes: &[u8]) -> Result<CloudConfig, ConfigError> {
    let config: CloudConfig = safe_yaml::from_slice(bytes, &CLOUD_CONFIG_LIMITS, schema())?;
    config.validate()?;
    Ok(config)
}

fn root() -> FieldPath {
    FieldPath::root()
}

impl CloudConfig {
    /// Check everything the types cannot express; the error names the first culprit.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_instances()?;
        build_pools(&self.load_balancer)?;
        resource_pool_ports(&self.load_balancer)?;
        self.validate_import_pools()?;
        if let Some((field, total)) = self.load_balancer.proxy.cap_above_total() {
            let message = match total {
                "maxTcpConnections" => CAP_ABOVE_TOTAL_TCP,
                "maxUdpSessions" => CAP_ABOVE_TOTAL_UDP,
                "maxTcpConnectionsPerService" => CAP_ABOVE_SERVICE_TCP,
                _ => CAP_ABOVE_SERVICE_UDP,
            };
            return Err(DocumentError::invalid(root().field("loadBalancer").field("proxy").field(field), message));
        }
        if let Some(probe) = &self.lifecycle.probe {
            validate_probe(probe)?;
        }
        if let Some(l2) = &self.load_balancer.announcement.l2 {
            l2.validate(&root().field("loadBalancer").field("announcement").field("l2"))?;
            // A pool answers on some of the announcers' interfaces, never on others.
            for (i, pool) in self.load_balancer.pools.iter().enumerate() {
                let names = pool.advertisement.iter().flat_map(|a| a.l2_interfaces.iter());
                if let Some((j, _)) = names.enumerate().find(|(_, name)| !l2.interfaces.contains(name)) {
                    let at = root().field("loadBalancer").field("pools").index(i);
                    let field = at.field("advertisement").field("l2Interfaces").index(j);
                    return Err(DocumentError::invalid(field, NOT_AN_L2_INTERFACE));
                }
            }
        }
        if let Some(bgp) = &self.load_balancer.announcement.bgp {
            bgp.validate(&root().field("loadBalancer").field("announcement").field("bgp"))?;
        }
        if let Some(health) = &self.load_balancer.announcement.health {
            health.validate(&root().field("loadBalancer").field("announcement").field("health"))?;
        }
        Ok(())
    }

    fn validate_instances(&self) -> Result<(), ConfigError> {
        let mut names: HashMap<&str, usize> = HashMap::new();
        let mut provider_ids: HashMap<String, usize> = HashMap::new();
        // Lower-cased names and DNS-like addresses: the inventory matches Nodes on both, with
        // the path that declared each.
        let mut lookup_names: HashMap<String, (usize, FieldPath)> = HashMap::new();
        let instances = root().field("instances");
        for (i, instance) in self.instances.iter().enumerate() {
            let path = instances.index(i);
            let name_path = path.field("name");
            validate_dns_subdomain(&instance.name).map_err(|m| DocumentError::invalid(name_path.clone(), m))?;
            if let Some(first) = names.insert(&instance.name, i) {
                return Err(clash(name_path, "duplicates", instances.index(first).field("name")));
            }
            if let Some((_, other)) = lookup_names.insert(instance.name.clone(), (i, name_path.clone())) {
                return Err(clash(name_path, "is also written (Nodes are matched on both) at", other));
            }
            let id_path = path.field("providerID");
            if let Some(id) = &instance.provider_id {
                validate_provider_id(id).map_err(|m| DocumentError::invalid(id_path.clone(), m))?;
            }
            if let Some(first) = provider_ids.insert(instance.effective_provider_id(), i) {
                let other = instances.index(first).field("providerID");
                return Err(clash(id_path, "duplicates the providerID (explicit or defaulted) of", other));
            }
            for (j, address) in instance.addresses.iter().enumerate() {
                let apath = path.field("addresses").index(j).field("address");
                validate_address(address).map_err(|m| DocumentError::invalid(apath.clone(), m))?;
                if !address.type_.is_ip() {
                    let key = address.address.to_ascii_lowercase();
                    match lookup_names.get(&key) {
                        Some((other, other_path)) if *other != i => {
                            return Err(clash(
                                apath,
                                "must be unique (Nodes are matched on it) but is also written at",
                                other_path.clone(),
                            ));
                        }
                        _ => {
                            lookup_names.insert(key, (i, apath));
                        }
                    }
                }
            }
            for (field, value) in
                [("instanceType", &instance.instance_type), ("zone", &instance.zone), ("region", &instance.region)]
            {
                if let Some(value) = value {
                    validate_label_value(value).map_err(|m| DocumentError::invalid(path.field(field), m))?;
                }
            }
            validate_labels(&instance.labels, &path.field("labels"), true)?;
        }
        Ok(())
    }
}

/// The message of a pool's L2 interface the announcers do not answer on.
pub const NOT_AN_L2_INTERFACE: &str = "must be one of loadBalancer.announcement.l2.interfaces";

/// The message of a per-listener TCP cap above the data path's.
pub const CAP_ABOVE_TOTAL_TCP: &str = "must not be greater than maxTcpConnections";
/// The message of a per-listener UDP cap above the data path's.
pub const CAP_ABOVE_TOTAL_UDP: &str = "must not be greater than maxUdpSessions";
/// The message of a per-listener TCP cap above the Service's share.
pub const CAP_ABOVE_SERVICE_TCP: &str = "must not be greater than maxTcpConnectionsPerService";
/// The message of a per-listener UDP cap above the Service's share.
pub const CAP_ABOVE_SERVICE_UDP: &str = "must not be greater than maxUdpSessionsPerService";

impl CloudConfig {
    /// `loadBalancer.importPools`: each source once, and only beside `poolResources: true`,
    /// whose Namespace watch the imported namespace selectors use.
    fn validate_import_pools(&self) -> Result<(), ConfigError> {
        let path = root().field("loadBalancer").field("importPools");
        let sources = &self.load_balancer.import_pools;
        for (i, import) in sources.iter().enumerate() {
            if let Some(first) = sources[..i].iter().position(|s| s.source == import.source) {
                return Err(clash(path.index(i), "duplicates", path.index(first)));
            }
            if let Some(namespace) = &import.given_namespace {
                let field = path.index(i).field("namespace");
                if import.source == crate::pool_import::Source::Cilium {
                    return Err(DocumentError::invalid(field, IMPORT_NAMESPACE_METALLB_ONLY));
                }
                validate_dns_label(namespace).map_err(|m| DocumentError::invalid(field, m))?;
            }
            if let Some(name) = &import.given_name {
                let field = path.index(i).field("name");
                if import.source != crate::pool_import::Source::Kubevip {
                    return Err(DocumentError::invalid(field, IMPORT_NAME_KUBEVIP_ONLY));
                }
                validate_dns_subdomain(name).map_err(|m| DocumentError::invalid(field, m))?;
            }
        }
        if !sources.is_empty() && !self.load_balancer.pool_resources {
            return Err(DocumentError::invalid(path, IMPORT_NEEDS_POOL_RESOURCES));
        }
        Ok(())
    }
}

/// Why a namespace on Cilium's source is refused.
pub const IMPORT_NAMESPACE_METALLB_ONLY: &str =
    "applies to metallb and kubevip only (Cilium's pools are cluster-scoped)";
/// Why a name on another source than kube-vip's is refused.
pub const IMPORT_NAME_KUBEVIP_ONLY: &str = "applies to kubevip only (its ConfigMap's name; the others list every pool)";

/// Why `importPools` without `poolResources` is refused.
pub const IMPORT_NEEDS_POOL_RESOURCES: &str =
    "needs loadBalancer.poolResources: true (imported pools join the pool resources and their Namespace watch)";

fn clash(path: FieldPath, how: &'static str, other: FieldPath) -> ConfigError {
    DocumentError::at(path, Problem::Clash { how, other })
}

fn validate_labels(labels: &BTreeMap<String, String>, path: &FieldPath, node_labels: bool) -> Result<(), ConfigError> {
    for (key, value) in labels {
        validate_label_key(key).map_err(|m| DocumentError::invalid(path.clone(), m))?;
        if node_labels && is_reserved_label(key) {
            return Err(DocumentError::invalid(
                path.clone(),
                "has a key in the kubernetes.io / k8s.io namespace; the node controller drops such labels, use your own prefix",
            ));
        }
        validate_label_value(value).map_err(|m| DocumentError::invalid(path.entry(), m))?;
    }
    Ok(())
}

/// Build the allocator's pools, checking names, CIDRs, ranges, namespaces, selectors and
/// that no two address blocks overlap. Reserved addresses are left out of the pools (see
/// [`crate::ipam::Reserved`]); an entry made only of them is refused.
pub fn build_pools(config: &LoadBalancerConfig) -> Result<Vec<Pool>, ConfigError> {
    let lb = root().field("loadBalancer");
    if config.retry_after.is_zero() {
        return Err(DocumentError::invalid(lb.field("retryAfter"), "must be greater than zero"));
    }
    let mut pools = Vec::with_capacity(config.pools.len());
    let mut names: HashMap<&str, usize> = HashMap::new();
    // Every block seen so far, with the path that declared it, for overlap messages.
    let mut seen: Vec<(IpBlock, FieldPath)> = Vec::new();
    for (i, pool) in config.pools.iter().enumerate() {
        let path = lb.field("pools").index(i);
        if pool.name.trim().is_empty() {
            return Err(DocumentError::invalid(path.field("name"), "must not be empty"));
        }
        if let Some(first) = names.insert(&pool.name, i) {
            return Err(clash(path.field("name"), "duplicates", lb.field("pools").index(first).field("name")));
        }
        if pool.cidrs.is_empty() && pool.ranges.is_empty() {
            return Err(DocumentError::invalid(path, "needs at least one entry in cidrs or ranges"));
        }
        let mut blocks = Vec::new();
        let cidrs = pool.cidrs.iter().enumerate().map(|(j, c)| (path.field("cidrs").index(j), true, c));
        let ranges = pool.ranges.iter().enumerate().map(|(j, r)| (path.field("ranges").index(j), false, r));
        for (entry_path, is_cidr, text) in cidrs.chain(ranges) {
            let block = if is_cidr { IpBlock::parse_cidr(text) } else { IpBlock::parse_range(text) }
                .map_err(|m| DocumentError::invalid(entry_path.clone(), m))?;
            if let Some((_, other)) = seen.iter().find(|(b, _)| b.overlaps(&block)) {
                return Err(clash(
                    entry_path,
                    "overlaps (an address may belong to one pool entry only)",
                    other.clone(),
                ));
            }
            if let Some(class) = block.wholly_reserved(pool.allow_loopback) {
                return Err(DocumentError::invalid(entry_path, class.refusal()));
            }
            // A pool CIDR is a block of addresses, not a subnet: its first and last addresses
            // are ordinary ones (avoidBuggyIPs leaves out .0 and .255 for clients that need it).
            let parts = block.usable_parts(pool.allow_loopback);
            if parts.is_empty() {
                return Err(DocumentError::invalid(
                    entry_path,
                    "has no address left once reserved addresses (unspecified, loopback, link-local, multicast, broadcast) are left out",
                ));
            }
            seen.push((block, entry_path));
            blocks.extend(parts);
        }
        let mut namespaces = BTreeSet::new();
        for (j, ns) in pool.namespaces.iter().enumerate() {
            validate_dns_label(ns).map_err(|m| DocumentError::invalid(path.field("namespaces").index(j), m))?;
            namespaces.insert(ns.clone());
        }
        if let Some(selector) = &pool.service_selector {
            validate_selector(selector, &path.field("serviceSelector"))?;
        }
        let ports = port_rule(pool.min_port, pool.allowed_ports.as_deref(), &path)?;
        let policy = match &pool.advertisement {
            None => Default::default(),
            Some(advertisement) => {
                let at = path.field("advertisement");
                if let Some(selector) = &advertisement.node_selector {
                    validate_selector(selector, &at.field("nodeSelector"))?;
                }
                advertisement.check(&at).map_err(|p| DocumentError::invalid(p.field, p.message))?
            }
        };
        pools.push(Pool {
            name: pool.name.clone(),
            blocks,
            namespaces,
            selector: pool.service_selector.clone(),
            namespace_selector: None,
            auto_assign: true,
            avoid_buggy_ips: pool.avoid_buggy_ips,
            allow_sharing: pool.allow_sharing,
            ports,
            disabled: false,
            policy,
        });
    }
    Ok(pools)
}

/// `loadBalancer.resourcePoolPorts`, checked: the rule of every pool that is not in the
/// cloud-config (the default rule when unset).
pub fn resource_pool_ports(config: &LoadBalancerConfig) -> Result<crate::ports::PortRule, ConfigError> {
    let path = root().field("loadBalancer").field("resourcePoolPorts");
    match &config.resource_pool_ports {
        None => Ok(crate::ports::PortRule::default()),
        Some(rule) => port_rule(rule.min_port, rule.allowed_ports.as_deref(), &path),
    }
}

/// A `minPort` and `allowedPorts` under `path`, checked.
fn port_rule(
    min_port: Option<u16>,
    allowed_ports: Option<&[String]>,
    path: &FieldPath,
) -> Result<crate::ports::PortRule, ConfigError> {
    let min_port = match min_port {
        Some(0) => return Err(DocumentError::invalid(path.field("minPort"), crate::ports::BAD_MIN_PORT)),
        Some(port) => port,
        None => 1,
    };
    let allowed = match allowed_ports {
        None => None,
        Some(entries) if entries.len() > crate::ports::MAX_PORT_RANGES => {
            return Err(DocumentError::invalid(path.field("allowedPorts"), crate::ports::TOO_MANY_RANGES));
        }
        Some(entries) => Some(
            entries
                .iter()
                .enumerate()
                .map(|(j, e)| {
                    crate::ports::parse_range(e)
                        .map_err(|m| DocumentError::invalid(path.field("allowedPorts").index(j), m))
                })
                .collect::<Result<Vec<_>, _>>()?,
        ),
    };
    Ok(crate::ports::PortRule { min_port, allowed })
}

fn validate_probe(probe: &ProbeConfig) -> Result<(), ConfigError> {
    let path = root().field("lifecycle").field("probe");
    let fail = |field: &'static str, text: &'static str| Err(DocumentError::invalid(path.field(field), text));
    if probe.port == 0 {
        return fail("port", "must be between 1 and 65535");
    }
    if probe.interval.is_zero() {
        return fail("interval", "must be greater than zero");
    }
    if probe.timeout.is_zero() {
        return fail("timeout", "must be greater than zero");
    }
    if probe.timeout > probe.interval {
        return fail("timeout", "must not be longer than interval");
    }
    if probe.failure_threshold == 0 {
        return fail("failureThreshold", "must be at least 1");
    }
    if probe.success_threshold == 0 {
        return fail("successThreshold", "must be at least 1");
    }
    if probe.concurrency == 0 {
        return fail("concurrency", "must be at least 1");
    }
    if probe.address_types.is_empty() {
        return fail("addressTypes", "must name at least one address type");
    }
    Ok(())
}

fn validate_selector(selector: &LabelSelectorConfig, path: &FieldPath) -> Result<(), ConfigError> {
    validate_labels(&selector.match_labels, &path.field("matchLabels"), false)?;
    for (i, requirement) in selector.match_expressions.iter().enumerate() {
        let rpath = path.field("matchExpressions").index(i);
        validate_label_key(&requirement.key).map_err(|m| DocumentError::invalid(rpath.field("key"), m))?;
        match requirement.operator {
            SelectorOperator::In | SelectorOperator::NotIn if requirement.values.is_empty() => {
                return Err(DocumentError::invalid(
                    rpath.field("values"),
                    "needs at least one value with operator In or NotIn",
                ));
            }
            SelectorOperator::Exists | SelectorOperator::DoesNotExist if !requirement.values.is_empty() => {
                return Err(DocumentError::invalid(
                    rpath.field("values"),
                    "must be empty with operator Exists or DoesNotExist",
                ));
            }
            _ => {}
        }
        for (j, value) in requirement.values.iter().enumerate() {
            validate_label_value(value).map_err(|m| DocumentError::invalid(rpath.field("values").index(j), m))?;
        }
    }
    Ok(())
}

fn validate_address(address: &AddressConfig) -> Result<(), &'static str> {
    let text = &address.address;
    if text.is_empty() {
        return Err("must not be empty");
    }
    if address.type_.is_ip() {
        text.parse::<IpAddr>().map(|_| ()).map_err(|_| "is not an IP address (InternalIP and ExternalIP take one)")
    } else if text.chars().any(|c| c.is_whitespace() || c == '/' || c == ':') || text.len() > 253 {
        Err("is not a DNS name (no spaces, '/' or ':', at most 253 characters)")
    } else {
        Ok(())
    }
}

fn validate_provider_id(id: &str) -> Result<(), &'static str> {
    match id.split_once("://") {
        Some((scheme, rest)) if !scheme.is_empty() && !rest.is_empty() && !id.chars().any(char::is_whitespace) => {
            Ok(())
        }
        _ => Err("is not of the form <scheme>://<id>"),
    }
}

fn is_alnum(c: char) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit()
}

/// An RFC 1123 label: what a namespace name must be.
fn validate_dns_label(name: &str) -> Result<(), &'static str> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.chars().all(|c| is_alnum(c) || c == '-')
        && name.starts_with(is_alnum)
        && name.ends_with(is_alnum);
    if ok { Ok(()) } else { Err("is not a valid namespace name (lower-case letters, digits and '-')") }
}

/// An RFC 1123 subdomain: what a Node name must be.
fn validate_dns_subdomain(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("must not be empty");
    }
    let ok = name.len() <= 253
        && name.split('.').all(|part| {
            !part.is_empty()
                && part.chars().all(|c| is_alnum(c) || c == '-')
                && part.starts_with(is_alnum)
                && part.ends_with(is_alnum)
        });
    if ok { Ok(()) } else { Err("is not a valid Node name (lower-case letters, digits, '-' and '.')") }
}

fn validate_label_key(key: &str) -> Result<(), &'static str> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix
        && validate_dns_subdomain(prefix).is_err()
    {
        return Err("has a key whose prefix is not a DNS subdomain");
    }
    let alnum = |c: char| c.is_ascii_alphanumeric();
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.chars().all(|c| alnum(c) || matches!(c, '-' | '_' | '.'))
        && name.starts_with(alnum)
        && name.ends_with(alnum);
    if ok { Ok(()) } else { Err("has a key that is not a valid label key") }
}

fn validate_label_value(value: &str) -> Result<(), &'static str> {
    let alnum = |c: char| c.is_ascii_alphanumeric();
    let ok = value.is_empty()
        || (value.len() <= 63
            && value.chars().all(|c| alnum(c) || matches!(c, '-' | '_' | '.'))
            && value.starts_with(alnum)
            && value.ends_with(alnum));
    if ok { Ok(()) } else { Err("is not a valid label value (at most 63 letters, digits, '-', '_' or '.')") }
}

/// Whether the node controller would drop this additional label (upstream N10).
pub fn is_reserved_label(key: &str) -> bool {
    let Some((prefix, _)) = key.split_once('/') else { return false };
    ["kubernetes.io", "k8s.io"].iter().any(|ns| prefix == *ns || prefix.ends_with(&format!(".{ns}")))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn err(doc: &str) -> String {
        parse(doc.as_bytes()).expect_err("the document must be rejected").to_string()
    }

    /// Assert the message names `field` and return it.
    fn assert_names(doc: &str, field: &str) -> String {
        let message = err(doc);
        assert!(message.contains(field), "message {message:?} does not name {field:?}");
        message
    }

    fn pools_of(doc: &str) -> Vec<Pool> {
        build_pools(&parse(doc.as_bytes()).unwrap().load_balancer).unwrap()
    }

    fn blocks_of(cidr_or_range: &str, allow_loopback: bool) -> Result<Vec<(String, String)>, String> {
        let key = if cidr_or_range.contains('/') { "cidrs" } else { "ranges" };
        let doc = format!(
            "loadBalancer:\n  pools:\n    - name: p\n      allowLoopback: {allow_loopback}\n      {key}: [\"{cidr_or_range}\"]\n"
        );
        parse(doc.as_bytes()).map_err(|e| e.to_string())?;
        Ok(pools_of(&doc)[0].blocks.iter().map(|b| (b.first().to_string(), b.last().to_string())).collect())
    }

    const POOL: &str = "loadBalancer:\n  pools:\n    - name: a\n      cidrs: [10.0.0.0/24]\n";

    #[test]
    fn a_complete_document_parses_with_defaults_filled_in() {
        let doc = "instances:\n  - name: node-1\n    addresses:\n      - {type: InternalIP, address: 10.0.0.1}\n      - {type: Hostname, address: Node-1.lan}\n    labels: {example.com/rack: r1}\nloadBalancer:\n  pools:\n    - name: v4\n      cidrs: [192.168.10.0/24]\n      ranges: [\"192.168.20.10-192.168.20.20\"]\nlifecycle:\n  probe:\n    port: 22\n";
        let config = parse(doc.as_bytes()).unwrap();
        assert_eq!(config.instances[0].effective_provider_id(), "baremetal://node-1");
        assert_eq!(config.instances[0].state, InstanceState::Running);
        assert_eq!(config.load_balancer.retry_after, Duration::from_secs(30));
        assert!(!config.lifecycle.delete_absent_nodes);
        let probe = config.lifecycle.probe.unwrap();
        assert_eq!(
            (probe.interval, probe.timeout, probe.failure_threshold),
            (Duration::from_secs(10), Duration::from_secs(2), 3)
        );
        assert_eq!(probe.address_types, [AddressType::InternalIP, AddressType::ExternalIP]);
    }

    #[test]
    fn an_empty_document_is_an_empty_inventory() {
        assert_eq!(parse(b"").unwrap(), CloudConfig::default());
        assert_eq!(parse(b"{}\n").unwrap(), CloudConfig::default());
    }

    #[test]
    fn an_unknown_top_level_field_is_placed_by_line_and_lists_the_allowed_fields() {
        let m = assert_names("instances: []\nloadbalancer: {}\n", "document: has an unknown field");
        assert!(m.contains("line 2") && m.contains("loadBalancer") && !m.contains("loadbalancer"), "{m}");
    }

    #[test]
    fn an_unknown_instance_field_is_placed_by_path_and_line() {
        let m = assert_names("instances:\n  - name: a\n    zones: x\n", "instances[0]: has an unknown field");
        assert!(m.contains("line 3") && !m.contains("zones"), "{m}");
    }

    #[test]
    fn missing_instance_name_is_named() {
        assert_names("instances:\n  - addresses: []\n", "instances[0]: misses the required field name");
    }

    #[test]
    fn invalid_instance_name_is_named() {
        assert_names("instances:\n  - name: Node_1\n", "instances[0].name: is not a valid Node name");
        assert_names("instances:\n  - name: \"\"\n", "instances[0].name: must not be empty");
    }

    #[test]
    fn duplicate_instance_names_name_both_entries() {
        assert_names(
            "instances:\n  - name: a\n  - name: b\n  - name: a\n",
            "instances[2].name: duplicates instances[0].name",
        );
    }

    #[test]
    fn duplicate_provider_ids_are_named() {
        let doc = "instances:\n  - name: a\n    providerID: metal://x\n  - name: b\n    providerID: metal://x\n";
        assert_names(doc, "instances[1].providerID: duplicates the providerID");
    }

    #[test]
    fn an_explicit_provider_id_colliding_with_a_default_one_is_named() {
        let doc = "instances:\n  - name: a\n  - name: b\n    providerID: baremetal://a\n";
        assert_names(doc, "instances[1].providerID");
    }

    #[test]
    fn malformed_provider_id_is_named() {
        assert_names("instances:\n  - name: a\n    providerID: just-an-id\n", "instances[0].providerID");
    }

    #[test]
    fn unknown_address_type_is_named_with_the_valid_ones() {
        let m = assert_names(
            "instances:\n  - name: a\n    addresses:\n      - {type: PrivateIP, address: 10.0.0.1}\n",
            "instances[0].addresses[0].type",
        );
        assert!(m.contains("InternalIP") && !m.contains("PrivateIP"), "{m}");
    }

    #[test]
    fn an_ip_address_type_with_a_non_ip_is_named() {
        assert_names(
            "instances:\n  - name: a\n    addresses:\n      - {type: InternalIP, address: 10.0.0.300}\n",
            "instances[0].addresses[0].address: is not an IP address",
        );
    }

    #[test]
    fn a_hostname_shared_by_two_instances_is_named() {
        let doc = "instances:\n  - name: a\n    addresses: [{type: Hostname, address: box.lan}]\n  - name: b\n    addresses: [{type: Hostname, address: BOX.lan}]\n";
        let m = assert_names(doc, "instances[1].addresses[0].address");
        assert!(m.contains("instances[0].addresses[0].address"), "{m}");
    }

    #[test]
    fn a_hostname_equal_to_another_instances_name_is_named() {
        let doc = "instances:\n  - name: a\n  - name: b\n    addresses: [{type: Hostname, address: A}]\n";
        let m = assert_names(doc, "instances[1].addresses[0].address");
        assert!(m.contains("instances[0].name"), "{m}");
    }

    #[test]
    fn unknown_state_is_named() {
        let m = assert_names("instances:\n  - name: a\n    state: off\n", "instances[0].state");
        assert!(m.contains("running, shutdown"), "{m}");
    }

    #[test]
    fn reserved_label_namespace_is_named() {
        assert_names(
            "instances:\n  - name: a\n    labels: {node-role.kubernetes.io/worker: \"\"}\n",
            "instances[0].labels: has a key in the kubernetes.io / k8s.io namespace",
        );
    }

    #[test]
    fn invalid_label_value_is_named() {
        assert_names("instances:\n  - name: a\n    labels: {example.com/x: \"a b\"}\n", "instances[0].labels.<key>");
    }

    #[test]
    fn a_label_key_given_twice_is_refused() {
        assert_names("instances:\n  - name: a\n    labels: {x: a, x: b}\n", "instances[0].labels: gives a key twice");
    }

    #[test]
    fn invalid_zone_is_named() {
        assert_names("instances:\n  - name: a\n    zone: \"rack 1\"\n", "instances[0].zone");
    }

    #[test]
    fn pool_without_name_is_named() {
        assert_names("loadBalancer:\n  pools:\n    - cidrs: [10.0.0.0/24]\n", "misses the required field name");
    }

    #[test]
    fn duplicate_pool_names_are_named() {
        let doc =
            "loadBalancer:\n  pools:\n    - {name: a, cidrs: [10.0.0.0/24]}\n    - {name: a, cidrs: [10.0.1.0/24]}\n";
        assert_names(doc, "loadBalancer.pools[1].name: duplicates loadBalancer.pools[0].name");
    }

    #[test]
    fn pool_without_addresses_is_named() {
        assert_names("loadBalancer:\n  pools:\n    - name: empty\n", "loadBalancer.pools[0]: needs at least one entry");
    }

    #[test]
    fn malformed_cidr_is_named() {
        assert_names(
            "loadBalancer:\n  pools:\n    - {name: a, cidrs: [10.0.0.0/33]}\n",
            "loadBalancer.pools[0].cidrs[0]: is not a CIDR",
        );
    }

    #[test]
    fn cidr_with_host_bits_is_named_with_the_fix() {
        assert_names(
            "loadBalancer:\n  pools:\n    - {name: a, cidrs: [10.0.0.7/24]}\n",
            "loadBalancer.pools[0].cidrs[0]: has host bits set",
        );
    }

    #[test]
    fn malformed_ranges_are_named() {
        for range in ["10.0.0.1", "10.0.0.9-10.0.0.1", "10.0.0.1-fd00::1", "10.0.0.1-nope"] {
            let doc = format!("loadBalancer:\n  pools:\n    - name: a\n      ranges: [\"{range}\"]\n");
            assert_names(&doc, "loadBalancer.pools[0].ranges[0]");
        }
    }

    #[test]
    fn overlapping_pools_name_both_culprits() {
        let doc = "loadBalancer:\n  pools:\n    - {name: a, cidrs: [10.0.0.0/24]}\n    - {name: b, ranges: [\"10.0.0.200-10.0.1.10\"]}\n";
        let m = assert_names(doc, "loadBalancer.pools[1].ranges[0]: overlaps");
        assert!(m.contains("loadBalancer.pools[0].cidrs[0]"), "{m}");
    }

    #[test]
    fn overlap_inside_one_pool_is_named() {
        let doc = "loadBalancer:\n  pools:\n    - {name: a, cidrs: [10.0.0.0/24, 10.0.0.128/25]}\n";
        assert_names(doc, "loadBalancer.pools[0].cidrs[1]");
    }

    #[test]
    fn invalid_pool_namespace_is_named() {
        let doc = "loadBalancer:\n  pools:\n    - {name: a, cidrs: [10.0.0.0/24], namespaces: [Team_A]}\n";
        assert_names(doc, "loadBalancer.pools[0].namespaces[0]");
    }

    #[test]
    fn a_pools_advertisement_is_read_and_its_mistakes_are_named() {
        let base = "loadBalancer:\n  pools:\n    - name: a\n      cidrs: [10.0.0.0/24]\n      advertisement:\n";
        let pools = pools_of(&format!(
            "{base}        nodeSelector: {{matchLabels: {{edge: 'true'}}}}\n        l2PreferredNodes: [w2, w1]\n\
             \x20       bgp: {{communities: ['65000:7'], largeCommunities: ['65000:1:2'], localPref: 300}}\n"
        ));
        let policy = &pools[0].policy;
        assert_eq!(policy.preferred, ["w2", "w1"]);
        assert_eq!((policy.route.communities.as_slice(), policy.route.local_pref), (&[(65000, 7)][..], Some(300)));
        assert_eq!(policy.route.large_communities, [(65000, 1, 2)]);
        assert!(policy.node_selector.as_ref().is_some_and(|s| s.match_labels["edge"] == "true"));
        assert_eq!(pools_of(POOL)[0].policy, Default::default(), "no advertisement: no policy");
        for (extra, field) in [
            ("        bgp: {communities: ['65000:70000']}\n", "loadBalancer.pools[0].advertisement.bgp.communities[0]"),
            (
                "        bgp: {largeCommunities: ['1:2']}\n",
                "loadBalancer.pools[0].advertisement.bgp.largeCommunities[0]",
            ),
            ("        l2PreferredNodes: [w1, w1]\n", "loadBalancer.pools[0].advertisement.l2PreferredNodes[1]"),
            (
                "        nodeSelector: {matchExpressions: [{key: edge, operator: In}]}\n",
                "loadBalancer.pools[0].advertisement.nodeSelector.matchExpressions[0].values",
            ),
            ("        interfaces: [eth1]\n", "loadBalancer.pools[0].advertisement: has an unknown field"),
            ("        l2Interfaces: [eth1, 'eth1']\n", "loadBalancer.pools[0].advertisement.l2Interfaces[1]"),
        ] {
            assert_names(&format!("{base}{extra}"), field);
        }
        // A pool's interfaces are some of the announcers'.
        let l2 = "  announcement:\n    l2: {interfaces: [eth0, eth1]}\n";
        let pools = pools_of(&format!("{base}        l2Interfaces: [eth1]\n{l2}"));
        assert_eq!(pools[0].policy.l2_interfaces, ["eth1"]);
        let message = assert_names(
            &format!("{base}        l2Interfaces: [eth1, eth2]\n{l2}"),
            "loadBalancer.pools[0].advertisement.l2Interfaces[1]",
        );
        assert!(message.contains(NOT_AN_L2_INTERFACE), "{message}");
    }

    #[test]
    fn selector_errors_are_named() {
        let base = "loadBalancer:\n  pools:\n    - name: a\n      cidrs: [10.0.0.0/24]\n      serviceSelector:\n";
        assert_names(
            &format!("{base}        matchExpressions: [{{key: tier, operator: In}}]\n"),
            "serviceSelector.matchExpressions[0].values",
        );
        assert_names(
            &format!("{base}        matchExpressions: [{{key: tier, operator: Equals, values: [x]}}]\n"),
            "serviceSelector.matchExpressions[0].operator",
        );
        let m = assert_names(&format!("{base}        matchLabel: {{a: b}}\n"), "serviceSelector: has an unknown field");
        assert!(m.contains("matchLabels") && !m.contains("matchLabel,"), "{m}");
    }

    #[test]
    fn probe_errors_are_named() {
        let cases = [
            ("port: 0", "lifecycle.probe.port"),
            ("port: 70000", "lifecycle.probe.port"),
            ("port: 22\n    interval: 10", "lifecycle.probe.interval"),
            ("port: 22\n    interval: 10x", "lifecycle.probe.interval"),
            ("port: 22\n    interval: 1s\n    timeout: 5s", "lifecycle.probe.timeout"),
            ("port: 22\n    failureThreshold: 0", "lifecycle.probe.failureThreshold"),
            ("port: 22\n    concurrency: 0", "lifecycle.probe.concurrency"),
            ("port: 22\n    addressTypes: []", "lifecycle.probe.addressTypes"),
            ("interval: 5s", "misses the required field port"),
        ];
        for (body, field) in cases {
            assert_names(&format!("lifecycle:\n  probe:\n    {body}\n"), field);
        }
    }

    #[test]
    fn delete_absent_nodes_must_be_a_boolean() {
        assert_names(
            "lifecycle:\n  deleteAbsentNodes: maybe\n",
            "lifecycle.deleteAbsentNodes: expected true or false, found a string",
        );
    }

    #[test]
    fn retry_after_errors_are_named() {
        assert_names(&format!("{POOL}  retryAfter: soon\n"), "loadBalancer.retryAfter: is not a duration");
        assert_names(&format!("{POOL}  retryAfter: -5s\n"), "loadBalancer.retryAfter: must not be negative");
        assert_names(&format!("{POOL}  retryAfter: 0s\n"), "loadBalancer.retryAfter: must be greater than zero");
    }

    #[test]
    fn go_durations_are_accepted_wherever_the_config_takes_durations() {
        let doc = format!(
            "{POOL}  retryAfter: 1m30s\nlifecycle:\n  probe:\n    port: 22\n    interval: 2h\n    timeout: 500ms\n"
        );
        let config = parse(doc.as_bytes()).unwrap();
        assert_eq!(config.load_balancer.retry_after, Duration::from_secs(90));
        let probe = config.lifecycle.probe.unwrap();
        assert_eq!((probe.interval, probe.timeout), (Duration::from_secs(7200), Duration::from_millis(500)));
    }

    #[test]
    fn pool_port_rules_are_parsed_and_their_errors_named() {
        let doc = format!("{POOL}      minPort: 1024\n      allowedPorts: [\"8080\", \"9000-9099\"]\n");
        let pools = pools_of(&doc);
        assert_eq!(pools[0].ports.min_port, 1024);
        assert_eq!(pools[0].ports.allowed, Some(vec![8080..=8080, 9000..=9099]));
        assert_eq!(pools_of(POOL)[0].ports, crate::ports::PortRule::default());
        assert_names(
            &format!("{POOL}      minPort: 0\n"),
            "loadBalancer.pools[0].minPort: must be between 1 and 65535",
        );
        assert_names(&format!("{POOL}      minPort: 70000\n"), "loadBalancer.pools[0].minPort");
        assert_names(
            &format!("{POOL}      allowedPorts: [\"80\", \"90-10\"]\n"),
            "loadBalancer.pools[0].allowedPorts[1]: is not a port or a first-last port range",
        );
        let many = (1..=257).map(|p| format!("\"{p}\"")).collect::<Vec<_>>().join(", ");
        assert_names(
            &format!("{POOL}      allowedPorts: [{many}]\n"),
            "loadBalancer.pools[0].allowedPorts: lists more than 256",
        );
    }

    #[test]
    fn connection_caps_are_bounded_and_a_listener_cap_may_not_exceed_its_total() {
        let proxy = |body: &str| format!("{POOL}  mode: proxy\n  proxy:\n    {body}\n");
        let config = parse(
            proxy("maxTcpConnections: 100\n    maxTcpConnectionsPerListener: 50\n    tcpIdleTimeout: 90s").as_bytes(),
        )
        .unwrap();
        let p = &config.load_balancer.proxy;
        assert_eq!((p.max_tcp_connections, p.max_tcp_connections_per_listener), (Some(100), Some(50)));
        assert_eq!(p.tcp_idle_timeout, Duration::from_secs(90));
        for field in [
            "maxTcpConnections",
            "maxTcpConnectionsPerService",
            "maxTcpConnectionsPerListener",
            "maxUdpSessions",
            "maxUdpSessionsPerService",
            "maxUdpSessionsPerListener",
        ] {
            for bad in ["0", "1000001", "-1"] {
                assert_names(&proxy(&format!("{field}: {bad}")), &format!("loadBalancer.proxy.{field}"));
            }
        }
        assert_names(&proxy("tcpIdleTimeout: 0s"), "loadBalancer.proxy.tcpIdleTimeout: must be greater than zero");
        assert_names(
            &proxy("maxTcpConnections: 10\n    maxTcpConnectionsPerListener: 11"),
            "loadBalancer.proxy.maxTcpConnectionsPerListener: must not be greater than maxTcpConnections",
        );
        assert_names(
            &proxy("maxUdpSessions: 100\n    maxUdpSessionsPerListener: 101"),
            "loadBalancer.proxy.maxUdpSessionsPerListener: must not be greater than maxUdpSessions",
        );
        assert_names(
            &proxy("maxTcpConnectionsPerService: 10\n    maxTcpConnectionsPerListener: 11"),
            "loadBalancer.proxy.maxTcpConnectionsPerListener: must not be greater than maxTcpConnectionsPerService",
        );
        assert_names(
            &proxy("maxUdpSessions: 10\n    maxUdpSessionsPerService: 11"),
            "loadBalancer.proxy.maxUdpSessionsPerService: must not be greater than maxUdpSessions",
        );
        // A total alone is fine: the unset caps below it follow it.
        assert!(parse(proxy("maxTcpConnections: 10").as_bytes()).is_ok());
    }

    #[test]
    fn wrong_shapes_are_named() {
        assert_names("instances: {a: 1}\n", "instances: expected a list, found a mapping");
        assert_names("- a\n", "document: expected a mapping, found a list");
        assert_names("instances: []\n---\ninstances: []\n", "more than one YAML document");
        assert_names(
            "lifecycle:\n  deleteAbsentNodes: true\n  deleteAbsentNodes: false\n",
            "lifecycle: gives the field deleteAbsentNodes twice",
        );
    }

    #[test]
    fn durations_accept_go_syntax() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
        assert_eq!(parse_duration("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("1h2m3s4ms").unwrap(), Duration::from_millis(3_723_004));
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
        assert_eq!(parse_duration("10"), Err(BAD_DURATION));
        assert_eq!(parse_duration("s"), Err(BAD_DURATION));
        assert_eq!(parse_duration("1d"), Err(BAD_DURATION));
        assert_eq!(parse_duration("-1s"), Err(NEGATIVE_DURATION));
        assert_eq!(parse_duration("400000000h"), Err(HUGE_DURATION));
    }

    #[test]
    fn n10_reserved_label_namespaces_match_upstream() {
        for key in ["kubernetes.io/x", "node.kubernetes.io/x", "k8s.io/x", "a.k8s.io/x"] {
            assert!(is_reserved_label(key), "{key}");
        }
        for key in ["example.com/x", "plain", "notkubernetes.io/x", "kubernetes.io.example.com/x"] {
            assert!(!is_reserved_label(key), "{key}");
        }
    }

    #[test]
    fn selectors_follow_kubernetes_semantics() {
        let selector = LabelSelectorConfig {
            match_labels: [("app".to_string(), "web".to_string())].into(),
            match_expressions: vec![
                SelectorRequirement { key: "tier".into(), operator: SelectorOperator::In, values: vec!["a".into()] },
                SelectorRequirement { key: "legacy".into(), operator: SelectorOperator::DoesNotExist, values: vec![] },
            ],
        };
        let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
        };
        assert!(selector.matches(&labels(&[("app", "web"), ("tier", "a")])));
        assert!(!selector.matches(&labels(&[("app", "web"), ("tier", "b")])));
        assert!(!selector.matches(&labels(&[("app", "web"), ("tier", "a"), ("legacy", "")])));
        assert!(!selector.matches(&labels(&[("tier", "a")])));
    }

    // ----- Address hygiene (issue 13 point 7).

    #[test]
    fn pool_cidrs_are_blocks_of_addresses_not_subnets() {
        // The first and last address of a pool CIDR are ordinary addresses of the LAN around it.
        assert_eq!(blocks_of("10.0.0.0/24", false).unwrap(), [("10.0.0.0".into(), "10.0.0.255".into())]);
        assert_eq!(blocks_of("10.0.0.4/30", false).unwrap(), [("10.0.0.4".into(), "10.0.0.7".into())]);
        assert_eq!(blocks_of("10.0.0.7/32", false).unwrap(), [("10.0.0.7".into(), "10.0.0.7".into())]);
        assert_eq!(blocks_of("10.0.0.0-10.0.0.255", false).unwrap(), [("10.0.0.0".into(), "10.0.0.255".into())]);
    }

    #[test]
    fn unspecified_addresses_are_never_in_a_pool() {
        assert!(blocks_of("0.0.0.0/32", false).unwrap_err().contains("0.0.0.0/8"));
        assert!(blocks_of("0.0.0.0/8", false).is_err());
        assert!(blocks_of("::/128", false).unwrap_err().contains("is ::"));
        let everything = blocks_of("0.0.0.0/0", false).unwrap();
        assert_eq!(everything.first().unwrap().0, "1.0.0.0");
        let v6 = blocks_of("::/0", false).unwrap();
        assert_eq!(v6.first().unwrap().0, "::2", "neither :: nor ::1");
    }

    #[test]
    fn loopback_is_refused_unless_the_pool_allows_it() {
        let refused = blocks_of("127.0.0.240/28", false).unwrap_err();
        assert!(refused.contains("allowLoopback: true"), "{refused}");
        assert!(blocks_of("::1/128", false).is_err());
        assert_eq!(blocks_of("127.0.0.240/28", true).unwrap(), [("127.0.0.240".into(), "127.0.0.255".into())]);
        // A wide pool (96.0.0.0-127.255.255.255) leaves loopback out unless allowed.
        assert_eq!(blocks_of("96.0.0.0/3", false).unwrap(), [("96.0.0.0".into(), "126.255.255.255".into())]);
        assert_eq!(blocks_of("96.0.0.0/3", true).unwrap(), [("96.0.0.0".into(), "127.255.255.255".into())]);
        assert_eq!(
            blocks_of("126.255.255.0-128.0.0.9", false).unwrap(),
            [("126.255.255.0".into(), "126.255.255.255".into()), ("128.0.0.0".into(), "128.0.0.9".into())]
        );
    }

    #[test]
    fn link_local_multicast_and_broadcast_are_refused_or_left_out() {
        assert!(blocks_of("169.254.0.0/24", false).unwrap_err().contains("link-local"));
        assert!(blocks_of("fe80::/64", false).unwrap_err().contains("link-local"));
        assert!(blocks_of("224.0.0.0/24", false).unwrap_err().contains("multicast"));
        assert!(blocks_of("ff02::/120", false).unwrap_err().contains("multicast"));
        assert!(blocks_of("255.255.255.255/32", false).unwrap_err().contains("broadcast"));
        let around = blocks_of("169.253.255.250-169.255.0.5", false).unwrap();
        assert_eq!(
            around,
            [("169.253.255.250".into(), "169.253.255.255".into()), ("169.255.0.0".into(), "169.255.0.5".into())]
        );
        let top = blocks_of("223.255.255.254-255.255.255.255", false).unwrap();
        assert_eq!(
            top,
            [("223.255.255.254".into(), "223.255.255.255".into()), ("240.0.0.0".into(), "255.255.255.254".into())]
        );
    }

    #[test]
    fn a_pool_of_everything_never_hands_out_a_reserved_address() {
        let doc =
            "loadBalancer:\n  pools:\n    - {name: v4, cidrs: [0.0.0.0/0]}\n    - {name: v6, cidrs: [\"::/0\"]}\n";
        let pools = pools_of(doc);
        for pool in &pools {
            for block in &pool.blocks {
                for ip in [block.first(), block.last()] {
                    assert!(!crate::ipam::Reserved::ALL.iter().any(|r| r.contains(ip)), "{ip}");
                }
            }
        }
    }

    // ----- No configuration content in errors (issue 13 point 2).

    const TOKEN: &str = "SECRET-TOKEN-12345";

    /// Documents that put the token in every field, each wrong in some way, plus malformed YAML
    /// at various places.
    pub(crate) fn token_documents() -> Vec<String> {
        let t = TOKEN;
        let mut docs = vec![
            format!("{t}\n"),
            format!("{t}: 1\n"),
            format!("instances: {t}\n"),
            format!("instances:\n  - name: {t}\n"),
            format!("instances:\n  - name: a\n    {t}: x\n"),
            format!("instances:\n  - name: a\n    providerID: {t}\n"),
            format!("instances:\n  - name: a\n    providerID: \"x://{t} {t}\"\n"),
            format!("instances:\n  - name: a\n    addresses: [{{type: InternalIP, address: {t}}}]\n"),
            format!("instances:\n  - name: a\n    addresses: [{{type: Hostname, address: \"{t} x\"}}]\n"),
            format!("instances:\n  - name: a\n    addresses: [{{type: {t}, address: 10.0.0.1}}]\n"),
            format!("instances:\n  - name: a\n    addresses: [{{type: InternalIP, address: 10.0.0.1, {t}: 1}}]\n"),
            format!("instances:\n  - name: a\n    instanceType: \"{t} {t}\"\n"),
            format!("instances:\n  - name: a\n    zone: [{t}]\n"),
            format!("instances:\n  - name: a\n    region: {{{t}: 1}}\n"),
            format!("instances:\n  - name: a\n    labels: {{{t}: \"a b\"}}\n"),
            format!("instances:\n  - name: a\n    labels: {{\"{t}/x\": v}}\n"),
            format!("instances:\n  - name: a\n    labels: {{kubernetes.io/{t}: v}}\n"),
            format!("instances:\n  - name: a\n    labels: {{{t}: [1]}}\n"),
            format!("instances:\n  - name: a\n    labels: {{{t}: a, {t}: b}}\n"),
            format!("instances:\n  - name: a\n    state: {t}\n"),
            format!("instances:\n  - name: {t}\n  - name: {t}\n"),
            format!(
                "instances:\n  - name: a\n    addresses: [{{type: Hostname, address: {t}}}]\n  - name: b\n    addresses: [{{type: Hostname, address: {t}}}]\n"
            ),
            format!("loadBalancer:\n  {t}: 1\n"),
            format!("loadBalancer:\n  retryAfter: {t}\n"),
            format!("loadBalancer:\n  retryAfter: 1{t}\n"),
            format!("loadBalancer:\n  pools:\n    - name: {t}\n"),
            format!(
                "loadBalancer:\n  pools:\n    - {{name: {t}, cidrs: [10.0.0.0/24]}}\n    - {{name: {t}, cidrs: [10.0.1.0/24]}}\n"
            ),
            format!("loadBalancer:\n  pools:\n    - {{name: a, cidrs: [{t}]}}\n"),
            format!("loadBalancer:\n  pools:\n    - {{name: a, cidrs: [\"10.0.0.0/{t}\"]}}\n"),
            format!("loadBalancer:\n  pools:\n    - {{name: a, ranges: [{t}]}}\n"),
            format!("loadBalancer:\n  pools:\n    - {{name: a, ranges: [\"{t}-{t}\"]}}\n"),
            format!(
                "loadBalancer:\n  pools:\n    - {{name: {t}, cidrs: [10.0.0.0/24]}}\n    - {{name: b, cidrs: [10.0.0.0/25]}}\n"
            ),
            format!("loadBalancer:\n  pools:\n    - {{name: {t}, cidrs: [127.0.0.0/24]}}\n"),
            format!("loadBalancer:\n  pools:\n    - {{name: a, cidrs: [10.0.0.0/24], namespaces: [{t}]}}\n"),
            format!("loadBalancer:\n  pools:\n    - {{name: a, cidrs: [10.0.0.0/24], avoidBuggyIPs: {t}}}\n"),
            format!("loadBalancer:\n  pools:\n    - {{name: a, cidrs: [10.0.0.0/24], allowSharing: {t}}}\n"),
            format!("loadBalancer:\n  pools:\n    - {{name: a, cidrs: [10.0.0.0/24], allowLoopback: [{t}]}}\n"),
            format!(
                "loadBalancer:\n  pools:\n    - {{name: a, cidrs: [10.0.0.0/24], serviceSelector: {{matchLabels: {{{t}: \"{t} x\"}}}}}}\n"
            ),
            format!(
                "loadBalancer:\n  pools:\n    - {{name: a, cidrs: [10.0.0.0/24], serviceSelector: {{matchExpressions: [{{key: \"{t} \", operator: In, values: [x]}}]}}}}\n"
            ),
            format!(
                "loadBalancer:\n  pools:\n    - {{name: a, cidrs: [10.0.0.0/24], serviceSelector: {{matchExpressions: [{{key: k, operator: {t}}}]}}}}\n"
            ),
            format!(
                "loadBalancer:\n  pools:\n    - {{name: a, cidrs: [10.0.0.0/24], serviceSelector: {{matchExpressions: [{{key: k, operator: In, values: [\"{t} {t}\"]}}]}}}}\n"
            ),
            format!("lifecycle:\n  deleteAbsentNodes: {t}\n"),
            format!("lifecycle:\n  {t}: true\n"),
            format!("lifecycle:\n  probe:\n    port: {t}\n"),
            format!("lifecycle:\n  probe:\n    port: 22\n    interval: {t}\n"),
            format!("lifecycle:\n  probe:\n    port: 22\n    timeout: \"-{t}\"\n"),
            format!("lifecycle:\n  probe:\n    port: 22\n    failureThreshold: {t}\n"),
            format!("lifecycle:\n  probe:\n    port: 22\n    successThreshold: [{t}]\n"),
            format!("lifecycle:\n  probe:\n    port: 22\n    concurrency: {{{t}: 1}}\n"),
            format!("lifecycle:\n  probe:\n    port: 22\n    addressTypes: [{t}]\n"),
            // Malformed YAML at various places.
            format!("instances:\n  - name: \"{t}\n"),
            format!("instances:\n  - name: '{t}\n"),
            format!("instances: [{t}\n"),
            format!("instances:\n  - name: {t}\n   zone: x\n"),
            format!("instances:\n\t- name: {t}\n"),
            format!("{t}: a: b\n"),
            format!("instances: *{t}\n"),
            format!("instances: !{t} x\n"),
            format!("instances: &{t} [1]\ninstances: *{t}\n"),
            format!("lifecycle: {{deleteAbsentNodes: true}}\nlifecycle: {{{t}: 1}}\n"),
            format!("instances: []\n---\n{t}: 1\n"),
            format!("instances: [\"\\{t}\"]\n"),
            format!("<<: {t}\n"),
            format!("instances:\n  - <<: [{t}]\n"),
            format!("\"{t}\": \"\\x{t}\"\n"),
            format!("instances: [{{name: {t}}}, {t}]\n"),
            format!("? {t}\n: x\n"),
            format!("instances: {}{t}\n", "[".repeat(100)),
            format!("{t}: |\n  x\n y\n"),
        ];
        // Every field typed with the token as a whole document of the wrong type.
        for field in ["instances", "loadBalancer", "lifecycle"] {
            docs.push(format!("{field}:\n  - {t}\n"));
        }
        // The load balancer's data-path settings.
        docs.push(format!("loadBalancer:\n  mode: {t}\n"));
        docs.push(format!("loadBalancer:\n  kubeVip: {t}\n"));
        docs.push(format!("loadBalancer:\n  proxy: {t}\n"));
        docs.push(format!("loadBalancer:\n  proxy: {{{t}: 1}}\n"));
        for field in ["bind", "balance", "healthChecks", "clusterHealthPort"] {
            docs.push(format!("loadBalancer:\n  proxy: {{{field}: {t}}}\n"));
        }
        for field in ["healthCheckInterval", "healthCheckTimeout", "drainTimeout", "udpIdleTimeout"] {
            docs.push(format!("loadBalancer:\n  proxy: {{{field}: {t}}}\n"));
            docs.push(format!("loadBalancer:\n  proxy: {{{field}: 0s}}\n  {t}: 1\n"));
        }
        for field in ["unhealthyThreshold", "healthyThreshold"] {
            docs.push(format!("loadBalancer:\n  proxy: {{{field}: [{t}]}}\n"));
        }
        docs.push(format!("loadBalancer:\n  proxy: {{tcpIdleTimeout: {t}}}\n"));
        for field in
            ["maxTcpConnections", "maxTcpConnectionsPerListener", "maxUdpSessions", "maxUdpSessionsPerListener"]
        {
            docs.push(format!("loadBalancer:\n  proxy: {{{field}: {t}}}\n"));
            docs.push(format!("loadBalancer:\n  proxy: {{{field}: 0}}\n  {t}: 1\n"));
        }
        docs.push(format!("loadBalancer:\n  pools:\n    - {{name: a, cidrs: [10.0.0.0/24], minPort: {t}}}\n"));
        docs.push(format!("loadBalancer:\n  pools:\n    - {{name: a, cidrs: [10.0.0.0/24], allowedPorts: [{t}]}}\n"));
        docs.push(format!(
            "loadBalancer:\n  pools:\n    - {{name: a, cidrs: [10.0.0.0/24], allowedPorts: [\"1-{t}\"]}}\n"
        ));
        docs
    }

    #[test]
    fn no_error_quotes_the_document() {
        let docs = token_documents();
        for doc in &docs {
            let e = parse(doc.as_bytes()).expect_err(&format!("document was accepted: {doc}"));
            for message in [e.to_string(), format!("{e:?}")] {
                assert!(!message.contains("SECRET"), "{doc}\n=> {message}");
            }
        }
    }

    #[test]
    fn hostile_documents_are_refused_with_the_limit_they_break() {
        for (name, doc, problem) in safe_yaml::hostile::all() {
            assert_eq!(parse(&doc).unwrap_err().problem, problem, "{name}");
        }
    }
}
