//! The announcer's pure decisions around the election: which addresses of which Services are
//! announced at all, which announcers are alive (from their Leases, timed on this node's clock),
//! and which addresses this node owns.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use tokio::time::Instant;

use super::elect;
use super::policy::AddressPolicies;

/// Ingress addresses read from one Service at most (the API server allows more; an announcer
/// must not be made to hold an unbounded list).
pub const MAX_ADDRESSES_PER_SERVICE: usize = 16;

/// The `ipMode` whose traffic goes to the manager's own proxy, not to kube-proxy on the
/// announcing node; such addresses are not announced by L2 (the proxy's node owns them).
const IP_MODE_PROXY: &str = "Proxy";

/// A Service as `namespace/name`.
pub type ServiceName = String;

/// The label that ties an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// The Service annotation naming the nodes that should answer ARP/NDP for its addresses, in
/// order of preference (`worker-1,worker-2`); the first live eligible one answers, and without
/// one the election decides as usual.
pub const PREFERRED_NODES_ANNOTATION: &str = "ccm.rs/l2-preferred-nodes";
/// The most nodes [`PREFERRED_NODES_ANNOTATION`] names that are read.
pub const MAX_PREFERRED_NODES: usize = 16;
/// The longest node name read from [`PREFERRED_NODES_ANNOTATION`] (an object name's limit).
const MAX_NODE_NAME: usize = 253;

/// What the announcer needs of one Service.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Announced {
    /// The addresses to announce ([`addresses_of`]).
    pub addresses: Vec<IpAddr>,
    /// `externalTrafficPolicy: Local`: only nodes with a ready endpoint may announce.
    pub local: bool,
    /// The nodes that should answer, in order ([`PREFERRED_NODES_ANNOTATION`]); empty: any.
    pub preferred: Vec<String>,
}

impl Announced {
    /// Read `service`; `None` when it has nothing to announce.
    pub fn of(service: &Service, class: Option<&str>) -> Option<Self> {
        let addresses = addresses_of(service, class);
        if addresses.is_empty() {
            return None;
        }
        let local = service.spec.as_ref().and_then(|s| s.external_traffic_policy.as_deref()) == Some("Local");
        let preferred = service.metadata.annotations.as_ref().and_then(|a| a.get(PREFERRED_NODES_ANNOTATION));
        Some(Self { addresses, local, preferred: preferred.map(|p| preferred_nodes(p)).unwrap_or_default() })
    }
}

/// The node names of a [`PREFERRED_NODES_ANNOTATION`] value: comma-separated, blanks and
/// names longer than an object name dropped, at most [`MAX_PREFERRED_NODES`], each once.
pub fn preferred_nodes(value: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for name in value.split(',').map(str::trim).filter(|n| !n.is_empty() && n.len() <= MAX_NODE_NAME) {
        if out.len() == MAX_PREFERRED_NODES {
            break;
        }
        if !out.iter().any(|n| n == name) {
            out.push(name.to_string());
        }
    }
    out
}

/// The nodes with a ready endpoint, per Service (`namespace/name`), from EndpointSlices. An
/// endpoint whose `ready` is unset counts as ready, as the API asks consumers to read it.
pub fn ready_nodes<'a>(slices: impl IntoIterator<Item = &'a EndpointSlice>) -> BTreeMap<ServiceName, BTreeSet<String>> {
    let mut out: BTreeMap<ServiceName, BTreeSet<String>> = BTreeMap::new();
    for slice in slices {
        let Some(service) = slice.metadata.labels.as_ref().and_then(|l| l.get(SERVICE_NAME_LABEL)) else { continue };
        let namespace = slice.metadata.namespace.as_deref().unwrap_or_default();
        let nodes = out.entry(format!("{namespace}/{service}")).or_default();
        for endpoint in &slice.endpoints {
            let ready = endpoint.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true);
            if let (true, Some(node)) = (ready, &endpoint.node_name) {
                nodes.insert(node.clone());
            }
        }
    }
    out
}

/// The addresses to announce for `service`: its `status.loadBalancer.ingress` IPs, when it is
/// a `LoadBalancer` Service of `class` (`None`: without a class) and the ingress is not
/// `ipMode: Proxy`; at most [`MAX_ADDRESSES_PER_SERVICE`].
pub fn addresses_of(service: &Service, class: Option<&str>) -> Vec<IpAddr> {
    let Some(spec) = &service.spec else { return Vec::new() };
    if spec.type_.as_deref() != Some("LoadBalancer") || spec.load_balancer_class.as_deref() != class {
        return Vec::new();
    }
    service
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .into_iter()
        .flatten()
        .filter(|i| i.ip_mode.as_deref() != Some(IP_MODE_PROXY))
        .filter_map(|i| i.ip.as_deref()?.parse::<IpAddr>().ok())
        .filter(|ip| !ip.is_unspecified() && !ip.is_loopback() && !ip.is_multicast())
        .take(MAX_ADDRESSES_PER_SERVICE)
        .collect()
}

/// How long since each announcer's Lease last changed, on this node's clock: an announcer is
/// alive while its Lease changed less than its duration ago (as client-go's leader election
/// judges a Lease, so clock skew between nodes does not matter), and gone once deleted.
///
/// An announcer takes part in elections only once it has been alive for a settling time
/// ([`Liveness::settled`]): a starting announcer then sees the Leases of the others (and they
/// its) before it claims anything, so it never answers for an address another node holds, and
/// announcers starting together never claim each other's addresses for a moment.
#[derive(Debug, Default)]
pub struct Liveness {
    /// node -> (last renewTime seen, when it was seen to change, lease duration, alive since)
    seen: HashMap<String, (String, Instant, Duration, Instant)>,
}

/// What the announcer reads from one Lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseView {
    /// The announcing node (`spec.holderIdentity`).
    pub node: String,
    /// `spec.renewTime` as written (compared for change, never parsed).
    pub renew_time: String,
    /// `spec.leaseDurationSeconds`.
    pub duration: Duration,
}

impl LeaseView {
    /// Read `lease`; `None` without a holder, renew time or positive duration, and while its
    /// announcer says it is unhealthy ([`super::health::UNHEALTHY_ANNOTATION`]): such a node is
    /// no candidate, and when it is healthy again it settles like a newcomer.
    pub fn of(lease: &Lease) -> Option<Self> {
        if lease.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(super::health::UNHEALTHY_ANNOTATION)) {
            return None;
        }
        let spec = lease.spec.as_ref()?;
        let node = spec.holder_identity.clone().filter(|h| !h.is_empty())?;
        let renew_time = spec.renew_time.as_ref()?.0.to_string();
        let seconds = u64::try_from(spec.lease_duration_seconds?).ok().filter(|s| *s > 0)?;
        Some(Self { node, renew_time, duration: Duration::from_secs(seconds) })
    }
}

impl Liveness {
    /// Take in the current Leases at `now`; a Lease no longer present is forgotten.
    pub fn observe(&mut self, leases: &[LeaseView], now: Instant) {
        let mut next = HashMap::with_capacity(leases.len());
        for lease in leases {
            let previous = self.seen.get(&lease.node);
            let changed_at = match previous {
                Some((renew, at, _, _)) if *renew == lease.renew_time => *at,
                _ => now,
            };
            // Alive without a break since then; a Lease that had gone stale starts again.
            let since = match previous {
                Some((_, at, duration, since)) if now.saturating_duration_since(*at) < *duration => *since,
                _ => now,
            };
            next.insert(lease.node.clone(), (lease.renew_time.clone(), changed_at, lease.duration, since));
        }
        self.seen = next;
    }

    /// The announcers alive at `now`.
    pub fn live(&self, now: Instant) -> BTreeSet<String> {
        self.settled(now, Duration::ZERO)
    }

    /// The announcers alive at `now` that have been alive for at least `settle`: those that
    /// take part in elections.
    pub fn settled(&self, now: Instant, settle: Duration) -> BTreeSet<String> {
        self.seen
            .iter()
            .filter(|(_, (_, at, duration, since))| {
                now.saturating_duration_since(*at) < *duration && now.saturating_duration_since(*since) >= settle
            })
            .map(|(node, _)| node.clone())
            .collect()
    }

    /// When the next live announcer expires, so the caller can look again then.
    pub fn next_expiry(&self, now: Instant) -> Option<Instant> {
        self.next_change(now, Duration::ZERO)
    }

    /// When [`Liveness::settled`] can next change: an announcer expiring or settling.
    pub fn next_change(&self, now: Instant, settle: Duration) -> Option<Instant> {
        self.seen
            .values()
            .flat_map(|(_, at, duration, since)| [*at + *duration, *since + settle])
            .filter(|at| *at > now)
            .min()
    }
}

/// The addresses `me` announces, each with the Service it belongs to (the first by name when
/// Services share an address), elected over the `live` announcers. For a Service with
/// `externalTrafficPolicy: Local` only live nodes in `ready` (its nodes with a ready endpoint)
/// may announce; an address shared by several Services may be announced by any node one of
/// them allows. An address whose pool has a node selector is announced only by a node it
/// selects, and its pool's preferred nodes come after the Service's (`policies`).
pub fn owned(
    me: &str,
    services: &BTreeMap<ServiceName, Announced>,
    ready: &BTreeMap<ServiceName, BTreeSet<String>>,
    live: &BTreeSet<String>,
    policies: &AddressPolicies,
) -> BTreeMap<IpAddr, ServiceName> {
    eligibility(services, ready, live, policies)
        .into_iter()
        .filter(|(address, e)| e.winner(*address) == Some(me))
        .map(|(address, e)| (address, e.service.clone()))
        .collect()
}

/// Who may answer for one address.
struct Eligible<'a> {
    /// The first Service by name listing the address.
    service: &'a ServiceName,
    /// The live nodes that may announce it.
    nodes: BTreeSet<&'a str>,
    /// The preferred nodes of the first Service by name that names some, else its pool's.
    preferred: &'a [String],
}

impl Eligible<'_> {
    /// The node that answers: the first preferred node that may, else the election's.
    fn winner(&self, address: IpAddr) -> Option<&str> {
        let preferred = self.preferred.iter().find(|p| self.nodes.contains(p.as_str())).map(String::as_str);
        preferred.or_else(|| elect::elect(address, self.nodes.iter().copied()))
    }
}

/// Per address: who may announce it.
fn eligibility<'a>(
    services: &'a BTreeMap<ServiceName, Announced>,
    ready: &'a BTreeMap<ServiceName, BTreeSet<String>>,
    live: &'a BTreeSet<String>,
    policies: &'a AddressPolicies,
) -> BTreeMap<IpAddr, Eligible<'a>> {
    let none = BTreeSet::new();
    let mut eligible: BTreeMap<IpAddr, Eligible<'a>> = BTreeMap::new();
    for (service, announced) in services {
        let nodes: Vec<&str> = elect::eligible(live, announced.local, ready.get(service).unwrap_or(&none)).collect();
        for address in &announced.addresses {
            let e = eligible.entry(*address).or_insert_with(|| Eligible {
                service,
                nodes: BTreeSet::new(),
                preferred: &[],
            });
            e.nodes.extend(nodes.iter().copied().filter(|n| policies.allows(*address, n)));
            if e.preferred.is_empty() {
                e.preferred = &announced.preferred;
            }
        }
    }
    for (address, e) in &mut eligible {
        if e.preferred.is_empty() {
            e.preferred = policies.preferred(*address);
        }
    }
    eligible
}

/// An address no live announcer may answer for although its Service has ready endpoints:
/// `externalTrafficPolicy: Local` with every ready endpoint on nodes without a live announcer
/// (a misplaced `nodeSelector`, announcers down there, or a pool's node selector choosing
/// none of those nodes), so its traffic reaches no node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stranded {
    /// The Service.
    pub service: ServiceName,
    /// Its addresses nobody answers for.
    pub addresses: Vec<IpAddr>,
    /// The nodes running its ready endpoints.
    pub endpoint_nodes: Vec<String>,
}

/// The Services with [`Stranded`] addresses (none while no announcer is live: then nobody
/// could tell).
pub fn stranded(
    services: &BTreeMap<ServiceName, Announced>,
    ready: &BTreeMap<ServiceName, BTreeSet<String>>,
    live: &BTreeSet<String>,
    policies: &AddressPolicies,
) -> Vec<Stranded> {
    if live.is_empty() {
        return Vec::new();
    }
    let eligible = eligibility(services, ready, live, policies);
    services
        .iter()
        .filter_map(|(service, announced)| {
            let endpoint_nodes: Vec<String> = ready.get(service)?.iter().cloned().collect();
            let addresses: Vec<IpAddr> = (announced.addresses.iter())
                .filter(|a| eligible.get(*a).is_some_and(|e| e.nodes.is_empty()))
                .copied()
                .collect();
            (announced.local && !endpoint_nodes.is_empty() && !addresses.is_empty()).then(|| Stranded {
                service: service.clone(),
                addresses,
                endpoint_nodes,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn none_policy() -> AddressPolicies {
        AddressPolicies::default()
    }

    #[test]
    fn a_pools_node_selector_bounds_who_answers_and_its_preferred_node_answers_first() {
        use super::super::policy::{PolicyBlocks, resolve};
        use crate::advertisement::PoolPolicy;
        use crate::selector::LabelSelectorConfig;
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<String>>();
        let edge = |yes: bool| BTreeMap::from([("edge".to_string(), yes.to_string())]);
        let labels = BTreeMap::from([
            ("w1".to_string(), edge(false)),
            ("w2".to_string(), edge(true)),
            ("w3".to_string(), edge(true)),
        ]);
        let pool = |preferred: &[&str]| PolicyBlocks {
            blocks: vec![crate::ipam::IpBlock::parse_cidr("192.0.2.0/28").unwrap()],
            policy: PoolPolicy {
                node_selector: Some(LabelSelectorConfig {
                    match_labels: BTreeMap::from([("edge".to_string(), "true".to_string())]),
                    ..Default::default()
                }),
                preferred: preferred.iter().map(|s| s.to_string()).collect(),
                ..Default::default()
            },
        };
        let addresses: Vec<IpAddr> = (1..=12).map(|i| ip(&format!("192.0.2.{i}"))).collect();
        let outside = ip("198.51.100.1");
        let service = |local, preferred: Vec<String>| {
            let mut all = addresses.clone();
            all.push(outside);
            BTreeMap::from([("a/web".to_string(), Announced { addresses: all, local, preferred })])
        };
        let live = set(&["w1", "w2", "w3"]);
        let none = BTreeMap::new();
        let policies =
            resolve(&[pool(&[])], service(false, vec![]).values().flat_map(|a| a.addresses.clone()), &labels);
        let owners =
            |services: &BTreeMap<ServiceName, Announced>, live: &BTreeSet<String>, policies: &AddressPolicies| {
                let mut by: BTreeMap<IpAddr, Vec<&str>> = BTreeMap::new();
                for node in ["w1", "w2", "w3"] {
                    for address in owned(node, services, &none, live, policies).into_keys() {
                        by.entry(address).or_default().push(node);
                    }
                }
                by
            };
        let by = owners(&service(false, vec![]), &live, &policies);
        for address in &addresses {
            assert!(matches!(by[address].as_slice(), ["w2"] | ["w3"]), "{address}: {:?}", by[address]);
        }
        assert_eq!(by[&outside].len(), 1, "an address outside the pool: any one node");
        // The pool's preferred node answers every address of the pool; gone, the selected others.
        let preferring = resolve(&[pool(&["w3"])], addresses.iter().copied(), &labels);
        let by = owners(&service(false, vec![]), &live, &preferring);
        assert!(addresses.iter().all(|a| by[a] == ["w3"]), "{by:?}");
        let by = owners(&service(false, vec![]), &set(&["w1", "w2"]), &preferring);
        assert!(addresses.iter().all(|a| by[a] == ["w2"]), "{by:?}");
        // A Service's own preference comes first, within the pool's nodes.
        let by = owners(&service(false, vec!["w2".into()]), &live, &preferring);
        assert!(addresses.iter().all(|a| by[a] == ["w2"]), "{by:?}");
        // Local with its only endpoint where the pool allows no node: stranded, nobody answers.
        let ready = BTreeMap::from([("a/web".to_string(), set(&["w1"]))]);
        let local = service(true, vec![]);
        assert!(
            ["w1", "w2", "w3"].iter().all(|n| owned(n, &local, &ready, &live, &policies).keys().all(|a| *a == outside))
        );
        let found = stranded(&local, &ready, &live, &policies);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].addresses, addresses, "the pool's addresses, not the one outside it");
        // BGP: only selected nodes advertise the pool's addresses.
        let w1 = super::super::bgp::advertised("w1", &service(false, vec![]), &none, &policies);
        assert_eq!(w1, BTreeSet::from([outside]));
        let w2 = super::super::bgp::advertised("w2", &service(false, vec![]), &none, &policies);
        assert_eq!(w2.len(), 13);
    }

    #[test]
    fn the_first_live_eligible_preferred_node_answers_and_the_election_decides_without_one() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<String>>();
        let live = set(&["w1", "w2", "w3"]);
        let address = ip("192.0.2.1");
        let hashed = elect::elect(address, ["w1", "w2", "w3"]).unwrap();
        let other = ["w1", "w2", "w3"].into_iter().find(|n| *n != hashed).unwrap();
        let service = |preferred: &[&str], local| {
            let preferred = preferred.iter().map(|s| s.to_string()).collect();
            BTreeMap::from([("a/web".to_string(), Announced { addresses: vec![address], local, preferred })])
        };
        let owner = |services: &BTreeMap<ServiceName, Announced>,
                     ready: &BTreeMap<ServiceName, BTreeSet<String>>,
                     live: &BTreeSet<String>| {
            ["w1", "w2", "w3"]
                .into_iter()
                .find(|n| owned(n, services, ready, live, &none_policy()).contains_key(&address))
        };
        let none = BTreeMap::new();
        assert_eq!(owner(&service(&[], false), &none, &live), Some(hashed), "no preference: the election");
        assert_eq!(owner(&service(&[other], false), &none, &live), Some(other), "the preferred node");
        // The first preference gone: the next one; none live: the election among the live.
        assert_eq!(owner(&service(&["gone", other], false), &none, &live), Some(other));
        assert_eq!(owner(&service(&["gone"], false), &none, &live), Some(hashed));
        // Local: a preferred node without a ready endpoint is not eligible.
        let ready = BTreeMap::from([("a/web".to_string(), set(&[hashed]))]);
        assert_eq!(owner(&service(&[other], true), &ready, &live), Some(hashed));
        // Exactly one owner whatever the preference.
        let owners: Vec<&str> = ["w1", "w2", "w3"]
            .into_iter()
            .filter(|n| owned(n, &service(&[other], false), &none, &live, &none_policy()).contains_key(&address))
            .collect();
        assert_eq!(owners, [other]);
        // Services sharing the address: the first by name that names a node decides.
        let mut shared = service(&[], false);
        shared.insert(
            "b/twin".to_string(),
            Announced { addresses: vec![address], local: false, preferred: vec![other.into()] },
        );
        shared.insert(
            "c/late".to_string(),
            Announced { addresses: vec![address], local: false, preferred: vec![hashed.into()] },
        );
        assert_eq!(owner(&shared, &none, &live), Some(other));
    }

    #[test]
    fn preferred_nodes_are_read_trimmed_once_each_and_bounded() {
        assert_eq!(preferred_nodes(" w1, w2 ,,w1 "), ["w1", "w2"]);
        assert_eq!(preferred_nodes(""), Vec::<String>::new());
        let many: Vec<String> = (0..40).map(|i| format!("n{i}")).collect();
        assert_eq!(preferred_nodes(&many.join(",")).len(), MAX_PREFERRED_NODES);
        assert_eq!(preferred_nodes(&"x".repeat(300)), Vec::<String>::new(), "longer than a node name");
    }

    #[test]
    fn a_local_service_whose_endpoints_run_where_no_announcer_lives_is_stranded() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<String>>();
        let services = BTreeMap::from([
            ("a/local".to_string(), Announced { addresses: vec![ip("192.0.2.1")], local: true, ..Default::default() }),
            (
                "a/cluster".to_string(),
                Announced { addresses: vec![ip("192.0.2.2")], local: false, ..Default::default() },
            ),
            ("a/idle".to_string(), Announced { addresses: vec![ip("192.0.2.3")], local: true, ..Default::default() }),
            ("a/served".to_string(), Announced { addresses: vec![ip("192.0.2.4")], local: true, ..Default::default() }),
        ]);
        let ready = BTreeMap::from([
            ("a/local".to_string(), set(&["w9"])),
            ("a/cluster".to_string(), set(&["w9"])),
            ("a/idle".to_string(), set(&[])),
            ("a/served".to_string(), set(&["w1", "w9"])),
        ]);
        let live = set(&["w1", "w2"]);
        let got = stranded(&services, &ready, &live, &none_policy());
        // Cluster: any live node answers; no ready endpoint: nothing to tell; one endpoint on
        // an announcer's node: answered there.
        assert_eq!(
            got,
            [Stranded {
                service: "a/local".into(),
                addresses: vec![ip("192.0.2.1")],
                endpoint_nodes: vec!["w9".into()]
            }]
        );
        assert_eq!(
            stranded(&services, &ready, &BTreeSet::new(), &none_policy()),
            [],
            "no live announcer: nobody tells"
        );
        // An address shared with a Service a live node may answer for is answered.
        let mut shared = services.clone();
        shared.insert(
            "a/twin".to_string(),
            Announced { addresses: vec![ip("192.0.2.1")], local: false, ..Default::default() },
        );
        assert_eq!(stranded(&shared, &ready, &live, &none_policy()), []);
    }
    use k8s_openapi::api::core::v1::{LoadBalancerIngress, LoadBalancerStatus, ServiceSpec, ServiceStatus};

    fn service(type_: &str, class: Option<&str>, ingress: &[(&str, Option<&str>)]) -> Service {
        Service {
            spec: Some(ServiceSpec {
                type_: Some(type_.into()),
                load_balancer_class: class.map(Into::into),
                ..Default::default()
            }),
            status: Some(ServiceStatus {
                load_balancer: Some(LoadBalancerStatus {
                    ingress: Some(
                        ingress
                            .iter()
                            .map(|(ip, mode)| LoadBalancerIngress {
                                ip: Some(ip.to_string()),
                                ip_mode: mode.map(Into::into),
                                ..Default::default()
                            })
                            .collect(),
                    ),
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn only_vip_addresses_of_our_load_balancers_are_announced() {
        let svc = service(
            "LoadBalancer",
            None,
            &[("192.0.2.1", Some("VIP")), ("2001:db8::1", None), ("192.0.2.2", Some("Proxy"))],
        );
        assert_eq!(addresses_of(&svc, None), ["192.0.2.1".parse::<IpAddr>().unwrap(), "2001:db8::1".parse().unwrap()]);
        assert!(addresses_of(&svc, Some("ccm.rs/baremetal")).is_empty(), "another class");
        assert!(addresses_of(&service("ClusterIP", None, &[("192.0.2.1", None)]), None).is_empty());
        let junk = service("LoadBalancer", None, &[("not an ip", None), ("127.0.0.1", None), ("0.0.0.0", None)]);
        assert!(addresses_of(&junk, None).is_empty());
        let many: Vec<String> = (0..100).map(|i| format!("192.0.2.{i}")).collect();
        let many: Vec<(&str, Option<&str>)> = many.iter().map(|s| (s.as_str(), None)).collect();
        assert_eq!(addresses_of(&service("LoadBalancer", None, &many), None).len(), MAX_ADDRESSES_PER_SERVICE);
    }

    fn lease(node: &str, renew: &str, secs: u64) -> LeaseView {
        LeaseView { node: node.into(), renew_time: renew.into(), duration: Duration::from_secs(secs) }
    }

    #[test]
    fn a_lease_marked_unhealthy_is_no_candidate_until_the_mark_goes() {
        let lease: Lease = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "l2-announcer-a", "annotations": {super::super::health::UNHEALTHY_ANNOTATION: "interface eth1 is down"}},
            "spec": {"holderIdentity": "a", "renewTime": "2026-12-03T12:00:00.000000Z", "leaseDurationSeconds": 6},
        }))
        .unwrap();
        assert_eq!(LeaseView::of(&lease), None, "renewed, but unhealthy");
        let mut healthy = lease.clone();
        healthy.metadata.annotations = Some(Default::default());
        assert_eq!(LeaseView::of(&healthy).map(|v| v.node), Some("a".to_string()));
    }

    #[test]
    fn an_announcer_is_alive_while_its_lease_changes_and_gone_when_deleted_or_stale() {
        let t0 = Instant::now();
        let mut liveness = Liveness::default();
        liveness.observe(&[lease("a", "r1", 6), lease("b", "r1", 6)], t0);
        assert_eq!(liveness.live(t0).len(), 2);
        // a renews, b does not.
        let t1 = t0 + Duration::from_secs(4);
        liveness.observe(&[lease("a", "r2", 6), lease("b", "r1", 6)], t1);
        let t2 = t0 + Duration::from_secs(7);
        assert_eq!(liveness.live(t2), BTreeSet::from(["a".to_string()]), "b's lease went stale");
        assert_eq!(liveness.next_expiry(t2), Some(t1 + Duration::from_secs(6)));
        // a deletes its lease on a graceful stop: gone at once.
        liveness.observe(&[lease("b", "r1", 6)], t2);
        assert!(liveness.live(t2).is_empty());
    }

    #[test]
    fn an_announcer_takes_part_only_after_settling_and_settles_again_after_going_stale() {
        let settle = Duration::from_secs(2);
        let t0 = Instant::now();
        let mut liveness = Liveness::default();
        liveness.observe(&[lease("a", "r1", 6)], t0);
        assert!(liveness.settled(t0, settle).is_empty(), "just seen: not yet");
        assert_eq!(liveness.next_change(t0, settle), Some(t0 + settle));
        let t1 = t0 + Duration::from_secs(1);
        liveness.observe(&[lease("a", "r2", 6), lease("b", "r1", 6)], t1);
        assert!(liveness.settled(t1, settle).is_empty());
        let t2 = t0 + settle;
        assert_eq!(liveness.settled(t2, settle), BTreeSet::from(["a".to_string()]), "renewals keep a's start");
        assert_eq!(liveness.next_change(t2, settle), Some(t1 + settle), "b settles next");
        // a keeps renewing; b goes stale, then renews: it settles again from then.
        liveness.observe(&[lease("a", "r3", 6), lease("b", "r1", 6)], t0 + Duration::from_secs(5));
        let t3 = t1 + Duration::from_secs(7);
        liveness.observe(&[lease("a", "r4", 6), lease("b", "r1", 6)], t3);
        assert_eq!(liveness.settled(t3, settle), BTreeSet::from(["a".to_string()]), "b went stale");
        liveness.observe(&[lease("a", "r4", 6), lease("b", "r2", 6)], t3);
        assert_eq!(liveness.settled(t3, settle), BTreeSet::from(["a".to_string()]));
        assert_eq!(liveness.settled(t3 + settle, settle).len(), 2);
    }

    #[test]
    fn each_address_is_owned_by_exactly_one_live_announcer() {
        let services: BTreeMap<ServiceName, Announced> = (0..50)
            .map(|i| {
                let addresses = vec![IpAddr::from([192, 0, 2, i]), IpAddr::from([198, 51, 100, i])];
                (format!("ns/svc-{i}"), Announced { addresses, local: false, ..Default::default() })
            })
            .collect();
        let live: BTreeSet<String> = ["a", "b", "c"].map(String::from).into();
        let mut seen = BTreeMap::new();
        for node in &live {
            for (address, service) in owned(node, &services, &BTreeMap::new(), &live, &none_policy()) {
                assert!(seen.insert(address, node.clone()).is_none(), "{address} owned twice");
                assert!(services[&service].addresses.contains(&address));
            }
        }
        assert_eq!(seen.len(), 100);
        assert!(owned("not-live", &services, &BTreeMap::new(), &live, &none_policy()).is_empty());
    }

    fn slice(service: &str, endpoints: &[(&str, Option<bool>)]) -> EndpointSlice {
        use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions};
        EndpointSlice {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                namespace: Some("ns".into()),
                labels: Some([(SERVICE_NAME_LABEL.to_string(), service.to_string())].into()),
                ..Default::default()
            },
            endpoints: endpoints
                .iter()
                .map(|(node, ready)| Endpoint {
                    node_name: Some(node.to_string()),
                    conditions: Some(EndpointConditions { ready: *ready, ..Default::default() }),
                    ..Default::default()
                })
                .collect(),
            address_type: "IPv4".into(),
            ports: None,
        }
    }

    #[test]
    fn local_services_are_announced_only_from_nodes_with_a_ready_endpoint() {
        let ready = ready_nodes(&[slice("web", &[("b", Some(true)), ("c", Some(false)), ("a", None)])]);
        assert_eq!(ready["ns/web"], ["a", "b"].map(String::from).into());
        let live: BTreeSet<String> = ["a", "b", "c"].map(String::from).into();
        let only_c: BTreeMap<ServiceName, BTreeSet<String>> = [("ns/web".to_string(), ["c".to_string()].into())].into();
        let addresses: Vec<IpAddr> = (1..=20).map(|i| IpAddr::from([192, 0, 2, i])).collect();
        let web = |local| {
            BTreeMap::from([(
                "ns/web".to_string(),
                Announced { addresses: addresses.clone(), local, ..Default::default() },
            )])
        };
        assert_eq!(owned("c", &web(true), &only_c, &live, &none_policy()).len(), 20, "c has the only endpoint");
        assert!(owned("a", &web(true), &only_c, &live, &none_policy()).is_empty());
        assert!(
            owned("c", &web(true), &BTreeMap::new(), &live, &none_policy()).is_empty(),
            "no endpoint: nobody announces"
        );
        assert!(owned("c", &web(false), &only_c, &live, &none_policy()).len() < 20, "Cluster: every live node may");
    }
}
