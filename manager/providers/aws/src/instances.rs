//! Instance lookups: the providerID format, the addresses a Node gets, the short-lived
//! snapshot cache shared by every controller, and the bookkeeping that keeps a Node whose
//! instance is not visible yet (EC2 is eventually consistent) from being deleted.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_sdk_ec2::types::Instance;
use k8s_openapi::api::core::v1::{Node, NodeAddress};
use prometheus_client::metrics::counter::Counter;

/// The providerID scheme.
pub const SCHEME: &str = "aws://";

/// What the controllers need of an instance.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct InstanceInfo {
    /// `i-...`.
    pub id: String,
    /// The availability zone.
    pub zone: String,
    /// The instance type (`m5.large`).
    pub instance_type: String,
    /// `pending`, `running`, `stopping`, `stopped`, `shutting-down` or `terminated`.
    pub state: String,
    /// The private DNS name (`ip-10-0-0-1.ec2.internal`), the usual Node name.
    pub private_dns: String,
    /// The Node addresses, in upstream's order (IPv4 and DNS names).
    pub addresses: Vec<NodeAddress>,
    /// The IPv6 addresses of the attached interfaces, by device index.
    pub ipv6: Vec<String>,
    /// The VPC.
    pub vpc_id: String,
    /// The subnet.
    pub subnet_id: String,
    /// The instance's security groups: (ID, name).
    pub security_groups: Vec<(String, String)>,
    /// Whether source/destination checking is on.
    pub source_dest_check: Option<bool>,
    /// The instance's tags: (key, value).
    pub tags: Vec<(String, String)>,
}

impl InstanceInfo {
    /// The providerID, `aws:///<zone>/<id>`.
    pub fn provider_id(&self) -> String {
        format!("{SCHEME}/{}/{}", self.zone, self.id)
    }

    /// Terminated instances count as gone.
    pub fn is_terminated(&self) -> bool {
        self.state == "terminated"
    }

    /// Stopped instances are shut down (upstream checks `stopped` only).
    pub fn is_shut_down(&self) -> bool {
        self.state == "stopped"
    }

    /// Build from the SDK's instance.
    pub fn from_sdk(i: &Instance) -> Option<Self> {
        let id = i.instance_id()?.to_string();
        Some(Self {
            id,
            zone: i.placement().and_then(|p| p.availability_zone()).unwrap_or_default().to_string(),
            instance_type: i.instance_type().map(|t| t.as_str().to_string()).unwrap_or_default(),
            state: i.state().and_then(|s| s.name()).map(|n| n.as_str().to_string()).unwrap_or_default(),
            private_dns: i.private_dns_name().unwrap_or_default().to_string(),
            addresses: addresses(i),
            ipv6: ipv6_addresses(i),
            vpc_id: i.vpc_id().unwrap_or_default().to_string(),
            subnet_id: i.subnet_id().unwrap_or_default().to_string(),
            security_groups: i
                .security_groups()
                .iter()
                .filter_map(|g| Some((g.group_id()?.to_string(), g.group_name().unwrap_or_default().to_string())))
                .collect(),
            source_dest_check: i.source_dest_check(),
            tags: i
                .tags()
                .iter()
                .map(|t| (t.key().unwrap_or_default().to_string(), t.value().unwrap_or_default().to_string()))
                .collect(),
        })
    }
}

/// How a Node names its instance.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum InstanceKey {
    /// By instance ID, from `spec.providerID`.
    Id(String),
    /// By private DNS name, from the Node name.
    PrivateDns(String),
}

/// Why a Node cannot name an instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyError {
    /// The providerID belongs to another provider.
    ForeignProviderId,
    /// The providerID is `aws://` but has no instance ID.
    MalformedProviderId,
}

/// The instance ID in a providerID: `aws:///us-east-1a/i-123`, `aws:////i-123`,
/// `aws://us-east-1a/i-123` (seen on old clusters) or a bare `i-123`.
pub fn instance_id_of(provider_id: &str) -> Result<String, KeyError> {
    let rest = match provider_id.strip_prefix(SCHEME) {
        Some(rest) => rest,
        None if provider_id.starts_with("i-") && !provider_id.contains('/') => return Ok(provider_id.to_string()),
        None => return Err(KeyError::ForeignProviderId),
    };
    let last = rest.rsplit('/').find(|s| !s.is_empty()).ok_or(KeyError::MalformedProviderId)?;
    if last.starts_with("i-") && last.len() > 2 && last.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
        Ok(last.to_string())
    } else {
        Err(KeyError::MalformedProviderId)
    }
}

/// How `node` names its instance: providerID first, then the Node name as private DNS name.
pub fn key_of(node: &Node) -> Result<InstanceKey, KeyError> {
    match node.spec.as_ref().and_then(|s| s.provider_id.as_deref()).filter(|p| !p.is_empty()) {
        Some(pid) => instance_id_of(pid).map(InstanceKey::Id),
        None => Ok(InstanceKey::PrivateDns(node.metadata.name.clone().unwrap_or_default())),
    }
}

fn address(type_: &str, value: &str) -> NodeAddress {
    NodeAddress { type_: type_.to_string(), address: value.to_string() }
}

/// Node addresses in upstream's order: the private IPs of the attached interfaces (by device
/// index, each interface's primary IP first), the public IP, the private DNS name (as
/// InternalDNS and Hostname), then the public DNS name. Duplicates are dropped.
pub fn addresses(i: &Instance) -> Vec<NodeAddress> {
    let mut out: Vec<NodeAddress> = Vec::new();
    let mut push = |a: NodeAddress| {
        if !a.address.is_empty() && !out.contains(&a) {
            out.push(a);
        }
    };
    let mut enis: Vec<_> =
        i.network_interfaces().iter().filter(|n| n.status().is_none_or(|s| s.as_str() == "in-use")).collect();
    enis.sort_by_key(|n| n.attachment().and_then(|a| a.device_index()).unwrap_or(i32::MAX));
    for eni in &enis {
        let mut ips: Vec<_> = eni.private_ip_addresses().iter().collect();
        ips.sort_by_key(|p| !p.primary().unwrap_or(false));
        for ip in ips {
            if let Some(a) = ip.private_ip_address() {
                push(address("InternalIP", a));
            }
        }
    }
    if let Some(a) = i.private_ip_address() {
        push(address("InternalIP", a));
    }
    if let Some(a) = i.public_ip_address() {
        push(address("ExternalIP", a));
    }
    if let Some(d) = i.private_dns_name() {
        push(address("InternalDNS", d));
        push(address("Hostname", d));
    }
    if let Some(d) = i.public_dns_name() {
        push(address("ExternalDNS", d));
    }
    out
}

/// The IPv6 addresses of the instance's attached interfaces, by device index.
pub fn ipv6_addresses(i: &Instance) -> Vec<String> {
    let mut enis: Vec<_> =
        i.network_interfaces().iter().filter(|n| n.status().is_none_or(|s| s.as_str() == "in-use")).collect();
    enis.sort_by_key(|n| n.attachment().and_then(|a| a.device_index()).unwrap_or(i32::MAX));
    let mut out: Vec<String> = Vec::new();
    for a in enis.iter().flat_map(|e| e.ipv6_addresses()).filter_map(|a| a.ipv6_address()) {
        if !out.iter().any(|o| o == a) {
            out.push(a.to_string());
        }
    }
    out
}

/// The Node's addresses for `[Global] NodeIPFamilies` (`ipv4`, `ipv6`, in the order given;
/// empty means `ipv4`): each family's IPs in turn, then the DNS names, as upstream.
pub fn node_addresses(v4_and_dns: &[NodeAddress], ipv6: &[String], families: &[String]) -> Vec<NodeAddress> {
    let ipv4_only = [String::from("ipv4")];
    let families = if families.is_empty() { &ipv4_only[..] } else { families };
    let is_dns = |a: &&NodeAddress| a.type_.ends_with("DNS") || a.type_ == "Hostname";
    let mut out = Vec::new();
    for f in families {
        match f.as_str() {
            "ipv4" => out.extend(v4_and_dns.iter().filter(|a| !is_dns(a)).cloned()),
            "ipv6" => out.extend(ipv6.iter().map(|a| address("InternalIP", a))),
            _ => {}
        }
    }
    out.extend(v4_and_dns.iter().filter(is_dns).cloned());
    out
}

/// Cache hit and miss counters (`aws_instance_cache_{hits,misses}_total`) and DescribeInstances
/// calls (`aws_describe_instances_calls_total`).
#[derive(Debug, Clone, Default)]
pub struct CacheCounters {
    /// Lookups answered from the snapshot.
    pub hits: Counter,
    /// Lookups that needed a call.
    pub misses: Counter,
    /// DescribeInstances calls (pages) made.
    pub describe_calls: Counter,
}

/// A short-lived snapshot of the instances looked up recently, shared by every controller.
#[derive(Debug)]
pub struct InstanceCache {
    ttl: Duration,
    inner: Mutex<CacheInner>,
    /// Counters.
    pub counters: CacheCounters,
}

#[derive(Debug, Default)]
struct CacheInner {
    by_id: HashMap<String, (Instant, Arc<InstanceInfo>)>,
    id_by_dns: HashMap<String, String>,
}

/// The most entries kept; past it, the snapshot starts over (the next lookups refill it).
const MAX_ENTRIES: usize = 100_000;

impl InstanceCache {
    /// A cache whose entries are fresh for `ttl`.
    pub fn new(ttl: Duration) -> Self {
        Self { ttl, inner: Mutex::new(CacheInner::default()), counters: CacheCounters::default() }
    }

    /// The fresh entry for `key`, counting a hit or a miss.
    pub fn get(&self, key: &InstanceKey) -> Option<Arc<InstanceInfo>> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let id = match key {
            InstanceKey::Id(id) => Some(id.as_str()),
            InstanceKey::PrivateDns(dns) => inner.id_by_dns.get(dns).map(String::as_str),
        };
        let found = id
            .and_then(|id| inner.by_id.get(id))
            .filter(|(at, _)| at.elapsed() < self.ttl)
            .map(|(_, info)| info.clone());
        if found.is_some() {
            self.counters.hits.inc()
        } else {
            self.counters.misses.inc()
        };
        found
    }

    /// Store instances just described.
    pub fn put(&self, infos: &[Arc<InstanceInfo>]) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if inner.by_id.len() + infos.len() > MAX_ENTRIES {
            *inner = CacheInner::default();
        }
        let now = Instant::now();
        for info in infos {
            if !info.private_dns.is_empty() {
                inner.id_by_dns.insert(info.private_dns.clone(), info.id.clone());
            }
            inner.by_id.insert(info.id.clone(), (now, info.clone()));
        }
    }

    /// Forget an instance (after changing it).
    pub fn invalidate(&self, id: &str) {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).by_id.remove(id);
    }
}

/// First sightings of absence: an instance is reported gone only when two lookups at least
/// `confirm_after` apart both miss it, so a Node whose instance EC2 does not show yet (just
/// launched) is not deleted.
#[derive(Debug)]
pub struct AbsenceTracker {
    confirm_after: Duration,
    first_miss: Mutex<HashMap<InstanceKey, Instant>>,
}

/// What to report for an instance that a lookup did not find.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Absence {
    /// Confirmed gone.
    Confirmed,
    /// Not confirmed yet: look again after this long.
    Unconfirmed(Duration),
}

impl AbsenceTracker {
    /// A tracker that needs two misses `confirm_after` apart.
    pub fn new(confirm_after: Duration) -> Self {
        Self { confirm_after, first_miss: Mutex::new(HashMap::new()) }
    }

    /// A lookup missed `key`.
    pub fn missed(&self, key: &InstanceKey) -> Absence {
        let mut map = self.first_miss.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if map.len() > MAX_ENTRIES {
            map.clear();
        }
        let first = *map.entry(key.clone()).or_insert(now);
        let waited = now.duration_since(first);
        if waited >= self.confirm_after && first != now {
            Absence::Confirmed
        } else {
            Absence::Unconfirmed(self.confirm_after.saturating_sub(waited).max(Duration::from_secs(1)))
        }
    }

    /// A lookup found `key`: forget earlier misses.
    pub fn found(&self, key: &InstanceKey) {
        self.first_miss.lock().unwrap_or_else(|e| e.into_inner()).remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sdk_ec2::types::{
        InstanceNetworkInterface, InstanceNetworkInterfaceAttachment, InstancePrivateIpAddress, NetworkInterfaceStatus,
    };
    use k8s_openapi::api::core::v1::NodeSpec;

    fn eni(index: i32, ips: &[(&str, bool)]) -> InstanceNetworkInterface {
        let mut b = InstanceNetworkInterface::builder()
            .status(NetworkInterfaceStatus::InUse)
            .attachment(InstanceNetworkInterfaceAttachment::builder().device_index(index).build());
        for (ip, primary) in ips {
            b = b.private_ip_addresses(
                InstancePrivateIpAddress::builder().private_ip_address(*ip).primary(*primary).build(),
            );
        }
        b.build()
    }

    #[test]
    fn addresses_follow_upstream_order() {
        let i = Instance::builder()
            .network_interfaces(eni(1, &[("10.0.1.5", true)]))
            .network_interfaces(eni(0, &[("10.0.0.9", false), ("10.0.0.5", true)]))
            .private_ip_address("10.0.0.5")
            .public_ip_address("54.1.2.3")
            .private_dns_name("ip-10-0-0-5.ec2.internal")
            .public_dns_name("ec2-54-1-2-3.compute-1.amazonaws.com")
            .build();
        let got: Vec<(String, String)> = addresses(&i).into_iter().map(|a| (a.type_, a.address)).collect();
        let want = [
            ("InternalIP", "10.0.0.5"),
            ("InternalIP", "10.0.0.9"),
            ("InternalIP", "10.0.1.5"),
            ("ExternalIP", "54.1.2.3"),
            ("InternalDNS", "ip-10-0-0-5.ec2.internal"),
            ("Hostname", "ip-10-0-0-5.ec2.internal"),
            ("ExternalDNS", "ec2-54-1-2-3.compute-1.amazonaws.com"),
        ];
        assert_eq!(got, want.map(|(t, a)| (t.to_string(), a.to_string())));
    }

    #[test]
    fn node_ip_families_order_ipv4_and_ipv6_addresses_before_the_dns_names() {
        use aws_sdk_ec2::types::InstanceIpv6Address;
        let mut second = eni(1, &[("10.0.1.5", true)]);
        second.ipv6_addresses = Some(vec![InstanceIpv6Address::builder().ipv6_address("2600:1f18::b").build()]);
        let mut first = eni(0, &[("10.0.0.5", true)]);
        first.ipv6_addresses = Some(vec![InstanceIpv6Address::builder().ipv6_address("2600:1f18::a").build()]);
        let i = Instance::builder()
            .network_interfaces(second)
            .network_interfaces(first)
            .private_dns_name("ip-10-0-0-5.ec2.internal")
            .build();
        let v6 = ipv6_addresses(&i);
        assert_eq!(v6, vec!["2600:1f18::a".to_string(), "2600:1f18::b".into()]);
        let pairs = |fams: &[&str]| -> Vec<(String, String)> {
            let fams: Vec<String> = fams.iter().map(|f| f.to_string()).collect();
            node_addresses(&addresses(&i), &v6, &fams).into_iter().map(|a| (a.type_, a.address)).collect()
        };
        let ip = |a: &str| ("InternalIP".to_string(), a.to_string());
        let dns = [
            ("InternalDNS".to_string(), "ip-10-0-0-5.ec2.internal".to_string()),
            ("Hostname".to_string(), "ip-10-0-0-5.ec2.internal".to_string()),
        ];
        assert_eq!(pairs(&[]), [vec![ip("10.0.0.5"), ip("10.0.1.5")], dns.to_vec()].concat());
        assert_eq!(
            pairs(&["ipv6", "ipv4"]),
            [vec![ip("2600:1f18::a"), ip("2600:1f18::b"), ip("10.0.0.5"), ip("10.0.1.5")], dns.to_vec()].concat()
        );
        assert_eq!(pairs(&["ipv6"]), [vec![ip("2600:1f18::a"), ip("2600:1f18::b")], dns.to_vec()].concat());
    }

    #[test]
    fn provider_ids_in_every_upstream_form_name_the_instance() {
        for pid in ["aws:///us-east-1a/i-0abc", "aws:////i-0abc", "aws://us-east-1a/i-0abc", "i-0abc"] {
            assert_eq!(instance_id_of(pid), Ok("i-0abc".to_string()), "{pid}");
        }
        assert_eq!(instance_id_of("gce://p/z/n"), Err(KeyError::ForeignProviderId));
        assert_eq!(instance_id_of("aws:///us-east-1a/"), Err(KeyError::MalformedProviderId));
        assert_eq!(instance_id_of("aws:///us-east-1a/vol-1"), Err(KeyError::MalformedProviderId));
    }

    #[test]
    fn nodes_are_looked_up_by_provider_id_first_then_by_name() {
        let mut n = Node::default();
        n.metadata.name = Some("ip-10-0-0-5.ec2.internal".into());
        assert_eq!(key_of(&n), Ok(InstanceKey::PrivateDns("ip-10-0-0-5.ec2.internal".into())));
        n.spec = Some(NodeSpec { provider_id: Some("aws:///us-east-1a/i-1".into()), ..Default::default() });
        assert_eq!(key_of(&n), Ok(InstanceKey::Id("i-1".into())));
    }

    #[test]
    fn cache_serves_fresh_entries_by_id_and_name_and_counts() {
        let cache = InstanceCache::new(Duration::from_secs(60));
        let info = Arc::new(InstanceInfo { id: "i-1".into(), private_dns: "a.internal".into(), ..Default::default() });
        assert!(cache.get(&InstanceKey::Id("i-1".into())).is_none());
        cache.put(&[info]);
        assert!(cache.get(&InstanceKey::Id("i-1".into())).is_some());
        assert!(cache.get(&InstanceKey::PrivateDns("a.internal".into())).is_some());
        assert_eq!(cache.counters.hits.get(), 2);
        assert_eq!(cache.counters.misses.get(), 1);
        let stale = InstanceCache::new(Duration::ZERO);
        stale.put(&[Arc::new(InstanceInfo { id: "i-1".into(), ..Default::default() })]);
        assert!(stale.get(&InstanceKey::Id("i-1".into())).is_none(), "entries expire");
    }

    #[test]
    fn absence_needs_two_misses_apart_and_a_sighting_resets_it() {
        let t = AbsenceTracker::new(Duration::from_millis(40));
        let k = InstanceKey::Id("i-1".into());
        assert!(matches!(t.missed(&k), Absence::Unconfirmed(_)));
        assert!(matches!(t.missed(&k), Absence::Unconfirmed(_)), "a second miss right away is not enough");
        std::thread::sleep(Duration::from_millis(50));
        t.found(&k);
        assert!(matches!(t.missed(&k), Absence::Unconfirmed(_)), "found in between: start over");
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(t.missed(&k), Absence::Confirmed);
    }
}
