//! Load-balancer IP allocation.
//!
//! One [`Allocator`] holds every assignment behind a single lock, so two Services can never be
//! handed the same address whatever the concurrency (the failure of stateless allocators that
//! re-list Services on every call). It is rebuilt from the Services' reported ingress IPs when
//! the provider starts, so a restart keeps every address where it was. Choices are
//! deterministic: pools in configuration order, blocks in order, lowest free address first.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::{Arc, Mutex, MutexGuard};

use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;

use crate::selector::LabelSelectorConfig;
use ccm_framework::provider::Refusal;

/// Annotation listing the addresses a Service asks for (comma-separated, one per family).
pub const LOAD_BALANCER_IPS_ANNOTATION: &str = "ccm.rs/load-balancer-ips";
/// Annotation whose value is a sharing key: Services with the same key and distinct ports may
/// share an address in a pool that allows sharing.
pub const ALLOW_SHARED_IP_ANNOTATION: &str = "ccm.rs/allow-shared-ip";
/// MetalLB's requested-address annotations, read when ours is absent (for a migration that keeps
/// every address), newest name first.
pub const METALLB_LOAD_BALANCER_IPS_ANNOTATIONS: [&str; 2] =
    ["metallb.io/loadBalancerIPs", "metallb.universe.tf/loadBalancerIPs"];
/// MetalLB's sharing-key annotations, read when ours is absent, newest name first.
pub const METALLB_ALLOW_SHARED_IP_ANNOTATIONS: [&str; 2] =
    ["metallb.io/allow-shared-ip", "metallb.universe.tf/allow-shared-ip"];
/// The label kube-vip-cloud-provider puts on every Service it gave an address (key).
pub const KUBE_VIP_IMPLEMENTATION_LABEL: &str = "implementation";
/// ... and its value.
pub const KUBE_VIP_IMPLEMENTATION_VALUE: &str = "kube-vip";
/// Cilium LB-IPAM's requested-address annotations, read after MetalLB's, newest name first.
pub const CILIUM_LOAD_BALANCER_IPS_ANNOTATIONS: [&str; 2] = ["lbipam.cilium.io/ips", "io.cilium/lb-ipam-ips"];
/// Cilium LB-IPAM's sharing-key annotations, read after MetalLB's, newest name first.
pub const CILIUM_SHARING_KEY_ANNOTATIONS: [&str; 2] = ["lbipam.cilium.io/sharing-key", "io.cilium/lb-ipam-sharing-key"];

/// Annotation naming the other namespaces whose Services may share this Service's address
/// (comma-separated namespace names, `*` for any). A sharing key is scoped to its namespace:
/// Services of two namespaces share only when each names the other's namespace, as Cilium's
/// `lbipam.cilium.io/sharing-cross-namespace` does (read when ours is absent).
pub const SHARING_CROSS_NAMESPACE_ANNOTATION: &str = "ccm.rs/sharing-cross-namespace";
/// Cilium LB-IPAM's cross-namespace sharing annotations, read when ours is absent, newest first.
pub const CILIUM_SHARING_CROSS_NAMESPACE_ANNOTATIONS: [&str; 2] =
    ["lbipam.cilium.io/sharing-cross-namespace", "io.cilium/lb-ipam-sharing-cross-namespace"];
/// The most namespaces one cross-namespace sharing annotation may name.
const MAX_SHARING_NAMESPACES: usize = 64;

/// Annotation naming the pool a Service takes its addresses from (a pool resource's name, or an
/// imported pool's `metallb:<namespace>/<name>` / `cilium:<name>`).
pub const ADDRESS_POOL_ANNOTATION: &str = "ccm.rs/address-pool";
/// MetalLB's pool annotations, read when ours is absent, newest name first: their value is the
/// `IPAddressPool`'s name, which also matches that pool once imported.
pub const METALLB_ADDRESS_POOL_ANNOTATIONS: [&str; 2] = ["metallb.io/address-pool", "metallb.universe.tf/address-pool"];
/// The longest pool name an annotation may give (a Kubernetes object name, plus an import prefix).
const MAX_POOL_NAME: usize = 253 + 64;

/// The first of `names` the Service carries with a non-blank value, with that name.
fn first_annotation<'a>(service: &'a Service, names: &[&'static str]) -> Option<(&'static str, &'a str)> {
    names
        .iter()
        .find_map(|n| service.annotations().get(*n).map(|v| (*n, v.as_str())).filter(|(_, v)| !v.trim().is_empty()))
}

/// An IP family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    /// IPv4.
    V4,
    /// IPv6.
    V6,
}

impl Family {
    /// The family of `ip`.
    pub fn of(ip: IpAddr) -> Self {
        if ip.is_ipv4() { Family::V4 } else { Family::V6 }
    }

    /// The other family.
    pub fn other(self) -> Self {
        match self {
            Family::V4 => Family::V6,
            Family::V6 => Family::V4,
        }
    }

    /// A `spec.ipFamilies` entry (`IPv4` / `IPv6`).
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "IPv4" => Some(Family::V4),
            "IPv6" => Some(Family::V6),
            _ => None,
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        })
    }
}

fn to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

fn from_u128(family: Family, value: u128) -> IpAddr {
    match family {
        // Blocks of family V4 only ever hold 32-bit values.
        Family::V4 => IpAddr::V4(Ipv4Addr::from(value as u32)),
        Family::V6 => IpAddr::V6(Ipv6Addr::from(value)),
    }
}

/// IPv4 addresses ending in .0 or .255, which some clients and routers mishandle.
fn is_buggy(ip: IpAddr) -> bool {
    matches!(ip, IpAddr::V4(v4) if matches!(v4.octets()[3], 0 | 255))
}

/// Address classes that are never handed out: refused when a pool entry lies wholly in one,
/// left out of the entry otherwise. Loopback is the exception a pool may allow
/// (`allowLoopback: true`), for a data path that answers on the node itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reserved {
    /// `0.0.0.0/8` ("this network", includes the unspecified 0.0.0.0) and `::`.
    Unspecified,
    /// `127.0.0.0/8` and `::1`.
    Loopback,
    /// `169.254.0.0/16` and `fe80::/10`.
    LinkLocal,
    /// `224.0.0.0/4` and `ff00::/8`.
    Multicast,
    /// `255.255.255.255`, the limited broadcast address.
    Broadcast,
}

impl Reserved {
    /// Every class.
    pub const ALL: [Reserved; 5] =
        [Reserved::Unspecified, Reserved::Loopback, Reserved::LinkLocal, Reserved::Multicast, Reserved::Broadcast];

    /// The blocks of the class.
    pub fn blocks(self) -> Vec<IpBlock> {
        let v4 = |a: [u8; 4], b: [u8; 4]| IpBlock::between(IpAddr::from(a), IpAddr::from(b));
        let v6 = |a: &str, b: &str| {
            let parse = |t: &str| t.parse::<Ipv6Addr>().map(IpAddr::V6).unwrap_or(IpAddr::V6(Ipv6Addr::UNSPECIFIED));
            IpBlock::between(parse(a), parse(b))
        };
        match self {
            Reserved::Unspecified => vec![v4([0, 0, 0, 0], [0, 255, 255, 255]), v6("::", "::")],
            Reserved::Loopback => vec![v4([127, 0, 0, 0], [127, 255, 255, 255]), v6("::1", "::1")],
            Reserved::LinkLocal => vec![
                v4([169, 254, 0, 0], [169, 254, 255, 255]),
                v6("fe80::", "febf:ffff:ffff:ffff:ffff:ffff:ffff:ffff"),
            ],
            Reserved::Multicast => {
                vec![v4([224, 0, 0, 0], [239, 255, 255, 255]), v6("ff00::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff")]
            }
            Reserved::Broadcast => vec![v4([255, 255, 255, 255], [255, 255, 255, 255])],
        }
    }

    /// Whether `ip` is in the class.
    pub fn contains(self, ip: IpAddr) -> bool {
        self.blocks().iter().any(|b| b.contains(ip))
    }

    /// Why an entry made only of this class is refused (fixed text).
    pub fn refusal(self) -> &'static str {
        match self {
            Reserved::Unspecified => "lies wholly in 0.0.0.0/8 or is ::, which are never handed out",
            Reserved::Loopback => {
                "lies wholly in the loopback range (127.0.0.0/8, ::1); set allowLoopback: true on the pool to use it"
            }
            Reserved::LinkLocal => "lies wholly in a link-local range (169.254.0.0/16, fe80::/10)",
            Reserved::Multicast => "lies wholly in a multicast range (224.0.0.0/4, ff00::/8)",
            Reserved::Broadcast => "is the broadcast address 255.255.255.255",
        }
    }
}

/// An inclusive range of addresses of one family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpBlock {
    family: Family,
    first: u128,
    last: u128,
    /// An address inside the block that is never handed out: the subnet-router anycast address
    /// (RFC 4291 2.6.1) of an IPv6 CIDR of /126 or wider, which routers on that subnet answer.
    anycast: Option<u128>,
}

impl IpBlock {
    /// Parse a CIDR such as `192.168.10.0/24` or `fd00:10::/120`; host bits must be zero.
    /// Errors are fixed texts: the input may be configuration and is never quoted.
    pub fn parse_cidr(text: &str) -> Result<Self, &'static str> {
        let net: ipnet::IpNet = text.trim().parse().map_err(|_| "is not a CIDR such as 192.168.10.0/24")?;
        if net.trunc() != net {
            return Err("has host bits set; write the network address of the prefix");
        }
        let mut block = Self::between(net.network(), net.broadcast());
        // `::/0`'s first address is the unspecified one, left out as reserved already.
        if matches!(net, ipnet::IpNet::V6(_)) && net.prefix_len() <= 126 && !net.network().is_unspecified() {
            block.anycast = Some(block.first);
        }
        Ok(block)
    }

    /// Parse an inclusive range `start-end` of one family.
    pub fn parse_range(text: &str) -> Result<Self, &'static str> {
        let (start, end) = text.split_once('-').ok_or("is not of the form start-end")?;
        let start: IpAddr = start.trim().parse().map_err(|_| "starts with something that is not an IP address")?;
        let end: IpAddr = end.trim().parse().map_err(|_| "ends with something that is not an IP address")?;
        if Family::of(start) != Family::of(end) {
            return Err("mixes IPv4 and IPv6");
        }
        if to_u128(start) > to_u128(end) {
            return Err("ends before it starts");
        }
        Ok(Self::between(start, end))
    }

    /// The reserved class this block lies wholly in, if any (loopback only when not allowed).
    pub fn wholly_reserved(&self, allow_loopback: bool) -> Option<Reserved> {
        Reserved::ALL.into_iter().filter(|r| !(allow_loopback && *r == Reserved::Loopback)).find(|r| {
            r.blocks().iter().any(|b| b.family == self.family && b.first <= self.first && self.last <= b.last)
        })
    }

    /// The parts of the block that may be handed out: every [`Reserved`] address left out
    /// (loopback kept when allowed). Empty when nothing is left.
    pub fn usable_parts(&self, allow_loopback: bool) -> Vec<IpBlock> {
        let mut holes: Vec<IpBlock> = Reserved::ALL
            .into_iter()
            .filter(|r| !(allow_loopback && *r == Reserved::Loopback))
            .flat_map(|r| r.blocks())
            .filter(|b| b.overlaps(self))
            .collect();
        holes.sort_by_key(|b| b.first);
        let mut parts = Vec::new();
        let mut next = Some(self.first);
        for hole in holes {
            let Some(start) = next else { break };
            if hole.first > start {
                parts.push(Self { first: start, last: hole.first - 1, ..*self });
            }
            next = if hole.last >= self.last { None } else { Some(start.max(hole.last + 1)) };
        }
        if let Some(start) = next
            && start <= self.last
        {
            parts.push(Self { first: start, last: self.last, ..*self });
        }
        parts
    }

    fn between(first: IpAddr, last: IpAddr) -> Self {
        Self { family: Family::of(first), first: to_u128(first), last: to_u128(last), anycast: None }
    }

    /// Whether `ip` is this block's subnet-router anycast address, never handed out.
    pub fn skips(&self, ip: IpAddr) -> bool {
        Family::of(ip) == self.family && self.anycast == Some(to_u128(ip))
    }

    /// 1 when the block's anycast address lies in it (a part of a split block may not hold it).
    fn skipped_count(&self) -> u128 {
        u128::from(self.anycast.is_some_and(|a| (self.first..=self.last).contains(&a)))
    }

    /// The block's family.
    pub fn family(&self) -> Family {
        self.family
    }

    /// The first address.
    pub fn first(&self) -> IpAddr {
        from_u128(self.family, self.first)
    }

    /// The last address.
    pub fn last(&self) -> IpAddr {
        from_u128(self.family, self.last)
    }

    /// Whether `ip` lies in the block.
    pub fn contains(&self, ip: IpAddr) -> bool {
        Family::of(ip) == self.family && (self.first..=self.last).contains(&to_u128(ip))
    }

    /// Whether the two blocks share an address.
    pub fn overlaps(&self, other: &IpBlock) -> bool {
        self.family == other.family && self.first <= other.last && other.first <= self.last
    }

    /// Addresses the allocator may hand out from this block.
    pub fn usable(&self, avoid_buggy: bool) -> u128 {
        let size = (self.last - self.first).saturating_add(1) - self.skipped_count();
        if !avoid_buggy || self.family == Family::V6 {
            return size;
        }
        // Count values in [first, last] congruent to 0 or 255 modulo 256.
        let count_upto = |x: u128, residue: u128| if x < residue { 0 } else { (x - residue) / 256 + 1 };
        let in_block = |residue: u128| {
            count_upto(self.last, residue) - if self.first == 0 { 0 } else { count_upto(self.first - 1, residue) }
        };
        size - in_block(0) - in_block(255)
    }
}

/// An address pool, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct Pool {
    /// The pool's name.
    pub name: String,
    /// Its address blocks, in configuration order (cidrs, then ranges).
    pub blocks: Vec<IpBlock>,
    /// Namespaces allowed to use it; empty means every namespace.
    pub namespaces: BTreeSet<String>,
    /// Services allowed to use it, by label.
    pub selector: Option<LabelSelectorConfig>,
    /// Namespaces allowed to use it, by label (pool resources only).
    pub namespace_selector: Option<LabelSelectorConfig>,
    /// Hand its addresses to Services that do not ask for one of them; false keeps the pool
    /// for requested addresses.
    pub auto_assign: bool,
    /// Skip IPv4 .0 and .255 addresses.
    pub avoid_buggy_ips: bool,
    /// Allow address sharing between Services with the same sharing key.
    pub allow_sharing: bool,
    /// The Service ports allowed on its addresses.
    pub ports: crate::ports::PortRule,
    /// Hands out no address, not even a requested one (a disabled Cilium pool): Services keep
    /// those they hold.
    pub disabled: bool,
    /// How its addresses are announced (`advertisement`); the default: by every announcer.
    pub policy: crate::advertisement::PoolPolicy,
}

impl Pool {
    /// Whether the pool is the one `name` names: by its own name, or, for an imported MetalLB
    /// pool (`metallb:<namespace>/<name>`), by the MetalLB pool's name as MetalLB's annotation
    /// gives it.
    pub fn is_named(&self, name: &str) -> bool {
        self.name == name
            || self.name.strip_prefix("metallb:").and_then(|r| r.split_once('/')).is_some_and(|(_, n)| n == name)
    }

    /// Whether the pool admits `request`: its pool annotation, namespaces and selectors.
    pub fn admits(&self, request: &LbRequest) -> bool {
        request.pool.as_ref().is_none_or(|p| self.is_named(&p.name))
            && (self.namespaces.is_empty() || self.namespaces.contains(&request.key.namespace))
            && self.selector.as_ref().is_none_or(|s| s.matches(&request.labels))
            && self.namespace_selector.as_ref().is_none_or(|s| s.matches(&request.namespace_labels))
    }

    fn has_family(&self, family: Option<Family>) -> bool {
        self.blocks.iter().any(|b| family.is_none_or(|f| b.family == f))
    }

    /// Addresses the allocator may hand out from this pool (saturating).
    pub fn usable(&self) -> u128 {
        self.blocks.iter().fold(0u128, |sum, b| sum.saturating_add(b.usable(self.avoid_buggy_ips)))
    }
}

/// A Service's identity for allocation.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServiceKey {
    /// The namespace.
    pub namespace: String,
    /// The name.
    pub name: String,
}

impl ServiceKey {
    /// The key of `service`.
    pub fn of(service: &Service) -> Self {
        Self { namespace: service.namespace().unwrap_or_default(), name: service.name_any() }
    }
}

impl fmt::Display for ServiceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// `spec.ipFamilyPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FamilyPolicy {
    /// One address (the default).
    SingleStack,
    /// One address per family when both can be had, else one.
    PreferDualStack,
    /// One address per family, or nothing.
    RequireDualStack,
}

/// One address a request needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    /// Exactly this address.
    Exact(IpAddr),
    /// Any free address of this family (`None`: any family).
    Any {
        /// The family, if it matters.
        family: Option<Family>,
        /// Whether the request fails without it (false for PreferDualStack's second family).
        required: bool,
    },
}

/// A protocol and port, for sharing conflicts.
pub type PortKey = (String, i32);

/// What a Service asks of the allocator, derived from its spec and annotations.
#[derive(Debug, Clone, PartialEq)]
pub struct LbRequest {
    /// Namespace and name.
    pub key: ServiceKey,
    /// The Service's UID; a different UID under the same key is a new object.
    pub uid: Option<String>,
    /// The Service's labels, for pool selectors.
    pub labels: BTreeMap<String, String>,
    /// The labels of the Service's namespace, for pools' namespace selectors (filled in by the
    /// provider; empty when unknown).
    pub namespace_labels: BTreeMap<String, String>,
    /// The addresses needed, in the order they are reported.
    pub slots: Vec<Slot>,
    /// The `ccm.rs/allow-shared-ip` key.
    pub sharing_key: Option<String>,
    /// The other namespaces whose Services may share with it (`*`: any), from
    /// [`SHARING_CROSS_NAMESPACE_ANNOTATION`].
    pub sharing_namespaces: BTreeSet<String>,
    /// The Service's (protocol, port) pairs.
    pub ports: BTreeSet<PortKey>,
    /// The pool the Service names by annotation, if any.
    pub pool: Option<PoolRequest>,
}

/// A pool named by a Service's annotation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolRequest {
    /// The annotation that named it.
    pub annotation: &'static str,
    /// The pool's name as given.
    pub name: String,
}

impl LbRequest {
    /// Whether `pool` may hand this request an address it did not ask for: an `autoAssign`
    /// pool, or any pool the Service names (as MetalLB does for `autoAssign: false` pools),
    /// never a disabled one.
    fn may_pick_from(&self, pool: &Pool) -> bool {
        !pool.disabled && (pool.auto_assign || self.pool.is_some())
    }
}

fn pool_request_of(service: &Service, key: &ServiceKey) -> Result<Option<PoolRequest>, AllocError> {
    let names = [ADDRESS_POOL_ANNOTATION, METALLB_ADDRESS_POOL_ANNOTATIONS[0], METALLB_ADDRESS_POOL_ANNOTATIONS[1]];
    let Some((annotation, value)) = first_annotation(service, &names) else { return Ok(None) };
    let name = value.trim();
    if name.len() > MAX_POOL_NAME || name.contains(char::is_whitespace) || name.contains(',') {
        return Err(AllocError::Invalid(format!(
            "{annotation} of {key}: expected one pool name (at most {MAX_POOL_NAME} characters, no spaces or commas)"
        )));
    }
    Ok(Some(PoolRequest { annotation, name: name.to_string() }))
}

/// Why a request could not be served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllocError {
    /// The Service's request is malformed (a bad annotation); it needs an edit.
    Invalid(String),
    /// Nothing suitable is free right now (exhaustion, address taken, family missing), with
    /// the reason the Service's `LoadBalancerProvisioned` condition gives.
    Unsatisfiable(Refusal, String),
    /// The allocator has not been rebuilt from the cluster's Services yet.
    NotReady,
}

impl fmt::Display for AllocError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AllocError::Invalid(m) | AllocError::Unsatisfiable(_, m) => f.write_str(m),
            AllocError::NotReady => f.write_str(
                "load-balancer addresses are not handed out until the provider has read the existing Services",
            ),
        }
    }
}

fn sharing_key_of(service: &Service) -> Option<String> {
    let names = [
        ALLOW_SHARED_IP_ANNOTATION,
        METALLB_ALLOW_SHARED_IP_ANNOTATIONS[0],
        METALLB_ALLOW_SHARED_IP_ANNOTATIONS[1],
        CILIUM_SHARING_KEY_ANNOTATIONS[0],
        CILIUM_SHARING_KEY_ANNOTATIONS[1],
    ];
    first_annotation(service, &names).map(|(_, v)| v.trim().to_string())
}

/// The namespaces a Service lets share its address, from [`SHARING_CROSS_NAMESPACE_ANNOTATION`]
/// (else Cilium's): namespace names or `*`, at most [`MAX_SHARING_NAMESPACES`].
fn sharing_namespaces_of(service: &Service, key: &ServiceKey) -> Result<BTreeSet<String>, AllocError> {
    let names = [
        SHARING_CROSS_NAMESPACE_ANNOTATION,
        CILIUM_SHARING_CROSS_NAMESPACE_ANNOTATIONS[0],
        CILIUM_SHARING_CROSS_NAMESPACE_ANNOTATIONS[1],
    ];
    let Some((annotation, value)) = first_annotation(service, &names) else { return Ok(BTreeSet::new()) };
    let entries: Vec<&str> = value.split(',').map(str::trim).filter(|e| !e.is_empty()).collect();
    let namespace = |e: &str| {
        e.len() <= 63
            && e.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && !e.starts_with('-')
            && !e.ends_with('-')
    };
    if entries.len() > MAX_SHARING_NAMESPACES || !entries.iter().all(|e| *e == "*" || namespace(e)) {
        return Err(AllocError::Invalid(format!(
            "{annotation} of {key}: expected at most {MAX_SHARING_NAMESPACES} namespace names or *, comma-separated"
        )));
    }
    Ok(entries.into_iter().map(String::from).collect())
}

fn ports_of(service: &Service) -> BTreeSet<PortKey> {
    let ports = service.spec.as_ref().and_then(|s| s.ports.as_ref());
    ports.into_iter().flatten().map(|p| (p.protocol.clone().unwrap_or_else(|| "TCP".to_string()), p.port)).collect()
}

/// Derive the allocation request of a Service.
pub fn request_for(service: &Service) -> Result<LbRequest, AllocError> {
    let key = ServiceKey::of(service);
    let spec = service.spec.clone().unwrap_or_default();
    let policy = match spec.ip_family_policy.as_deref() {
        Some("PreferDualStack") => FamilyPolicy::PreferDualStack,
        Some("RequireDualStack") => FamilyPolicy::RequireDualStack,
        _ => FamilyPolicy::SingleStack,
    };
    let families: Vec<Family> = spec.ip_families.iter().flatten().filter_map(|f| Family::parse(f)).collect();

    // Our annotation, then MetalLB's, win over the deprecated spec.loadBalancerIP.
    let names = [
        LOAD_BALANCER_IPS_ANNOTATION,
        METALLB_LOAD_BALANCER_IPS_ANNOTATIONS[0],
        METALLB_LOAD_BALANCER_IPS_ANNOTATIONS[1],
        CILIUM_LOAD_BALANCER_IPS_ANNOTATIONS[0],
        CILIUM_LOAD_BALANCER_IPS_ANNOTATIONS[1],
    ];
    // kube-vip-cloud-provider's record of what it gave (every family; spec.loadBalancerIP holds
    // only the first), read only on the Services it labelled: ours carry the annotation as an
    // output (`loadBalancer.kubeVip`).
    let kube_vip =
        service.labels().get(KUBE_VIP_IMPLEMENTATION_LABEL).map(String::as_str) == Some(KUBE_VIP_IMPLEMENTATION_VALUE);
    let (source, text) = match first_annotation(service, &names)
        .or_else(|| kube_vip.then(|| first_annotation(service, &[crate::proxy::KUBE_VIP_ANNOTATION])).flatten())
    {
        Some((name, value)) => (name, value.to_string()),
        None => ("spec.loadBalancerIP", spec.load_balancer_ip.clone().unwrap_or_default()),
    };
    let mut requested = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let ip: IpAddr = part
            .parse()
            .map_err(|_| AllocError::Invalid(format!("{source} of {key}: {part:?} is not an IP address")))?;
        if requested.iter().any(|r: &IpAddr| Family::of(*r) == Family::of(ip)) {
            return Err(AllocError::Invalid(format!(
                "{source} of {key}: at most one {} address may be requested",
                Family::of(ip)
            )));
        }
        requested.push(ip);
    }

    let slots = if !requested.is_empty() {
        if policy == FamilyPolicy::RequireDualStack && requested.len() < 2 {
            return Err(AllocError::Unsatisfiable(
                Refusal::RequestedAddressUnavailable,
                format!(
                    "{key} has ipFamilyPolicy RequireDualStack but {source} names only an {} address; name one IPv4 and one IPv6",
                    Family::of(requested[0])
                ),
            ));
        }
        // Report in spec.ipFamilies order when it is given.
        requested.sort_by_key(|ip| families.iter().position(|f| *f == Family::of(*ip)).unwrap_or(usize::MAX));
        requested.into_iter().map(Slot::Exact).collect()
    } else {
        match policy {
            FamilyPolicy::SingleStack => vec![Slot::Any { family: families.first().copied(), required: true }],
            FamilyPolicy::PreferDualStack | FamilyPolicy::RequireDualStack => {
                let primary = families.first().copied().unwrap_or(Family::V4);
                vec![
                    Slot::Any { family: Some(primary), required: true },
                    Slot::Any { family: Some(primary.other()), required: policy == FamilyPolicy::RequireDualStack },
                ]
            }
        }
    };

    let pool = pool_request_of(service, &key)?;
    Ok(LbRequest {
        key,
        uid: service.metadata.uid.clone(),
        labels: service.labels().clone(),
        namespace_labels: BTreeMap::new(),
        slots,
        sharing_key: sharing_key_of(service),
        sharing_namespaces: sharing_namespaces_of(service, &ServiceKey::of(service))?,
        ports: ports_of(service),
        pool,
    })
}

#[derive(Debug, Clone)]
struct Holder {
    sharing_key: Option<String>,
    ports: BTreeSet<PortKey>,
    /// The other namespaces it shares with (`*`: any).
    namespaces: BTreeSet<String>,
}

impl Holder {
    fn allows(&self, namespace: &str) -> bool {
        self.namespaces.contains("*") || self.namespaces.contains(namespace)
    }

    /// Whether this holder (of `key`) and `other` (of `other_key`) may hold one address: the
    /// same sharing key, no common port, and the same namespace unless each allows the other's.
    fn shares_with(&self, key: &ServiceKey, other: &Holder, other_key: &ServiceKey) -> bool {
        self.sharing_key.is_some()
            && other.sharing_key == self.sharing_key
            && other.ports.is_disjoint(&self.ports)
            && (key.namespace == other_key.namespace
                || (self.allows(&other_key.namespace) && other.allows(&key.namespace)))
    }
}

#[derive(Debug, Clone)]
struct IpUse {
    /// The pool holding the address; `None` for an address kept by its Services after a pool
    /// edit took it out of every pool.
    pool: Option<usize>,
    holders: BTreeMap<ServiceKey, Holder>,
}

#[derive(Debug, Clone)]
struct Assignment {
    uid: Option<String>,
    ips: Vec<IpAddr>,
}

#[derive(Debug, Default)]
struct State {
    /// The pools, swapped together with the assignments' pool indices (see [`rehome`]).
    pools: Arc<Vec<Pool>>,
    ips: BTreeMap<IpAddr, IpUse>,
    services: HashMap<ServiceKey, Assignment>,
    restored: bool,
}

/// Two UIDs denote the same object unless both are known and differ.
fn same_object(a: &Option<String>, b: &Option<String>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => a == b,
        _ => true,
    }
}

impl State {
    /// Whether `key` may hold `ip` next to its current holders.
    fn can_hold(&self, pools: &[Pool], ip: IpAddr, key: &ServiceKey, holder: &Holder) -> bool {
        let Some(usage) = self.ips.get(&ip) else { return true };
        let mut others = usage.holders.iter().filter(|(k, _)| *k != key).peekable();
        if others.peek().is_none() {
            return true;
        }
        usage.pool.is_some_and(|p| pools[p].allow_sharing) && others.all(|(k, h)| holder.shares_with(key, h, k))
    }

    fn release(&mut self, key: &ServiceKey) -> Vec<IpAddr> {
        let Some(assignment) = self.services.remove(key) else { return Vec::new() };
        for ip in &assignment.ips {
            self.drop_holder(*ip, key);
        }
        assignment.ips
    }

    fn drop_holder(&mut self, ip: IpAddr, key: &ServiceKey) {
        if let Some(usage) = self.ips.get_mut(&ip) {
            usage.holders.remove(key);
            if usage.holders.is_empty() {
                self.ips.remove(&ip);
            }
        }
    }

    /// The lowest address of `block` that is free (and not buggy when avoided).
    fn first_free(&self, block: &IpBlock, avoid_buggy: bool) -> Option<IpAddr> {
        let mut used = self.ips.range(block.first()..=block.last()).map(|(ip, _)| to_u128(*ip)).peekable();
        let mut candidate = block.first;
        loop {
            if candidate > block.last {
                return None;
            }
            let ip = from_u128(block.family, candidate);
            while used.next_if(|u| *u < candidate).is_some() {}
            // Pools built by the config never hold 0.0.0.0 or ::; this guard covers any other.
            let skipped = (avoid_buggy && is_buggy(ip)) || block.skips(ip);
            if !skipped && !ip.is_unspecified() && used.peek() != Some(&candidate) {
                return Some(ip);
            }
            candidate = candidate.checked_add(1)?;
        }
    }

    fn in_use(&self, block: &IpBlock) -> usize {
        self.ips.range(block.first()..=block.last()).count()
    }
}

/// A snapshot of pool usage, for health messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolUsage {
    /// The pool's name.
    pub name: String,
    /// Addresses in use (shared addresses count once).
    pub in_use: usize,
    /// Addresses that can be handed out.
    pub usable: u128,
}

/// What rebuilding from existing Services found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RestoreReport {
    /// Addresses recorded as assigned.
    pub restored: usize,
    /// Reported addresses in no pool (the Service gets a pool address on its next sync).
    pub outside_pools: usize,
    /// Addresses claimed by a younger Service that cannot share them (it gets a new one).
    pub conflicts: usize,
}

/// What swapping the pools did to the assignments.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RehomeReport {
    /// Assigned addresses that are in one of the new pools.
    pub in_pools: usize,
    /// Assigned addresses in none of the new pools: they stay with their Services until those
    /// go (a live address is never taken away), and no one else gets them.
    pub outside_pools: Vec<IpAddr>,
}

/// Point every assigned address at its pool in `pools` (pure): an address keeps its Services
/// whatever the edit; one in no pool any more is marked outside the pools.
fn rehome(ips: &mut BTreeMap<IpAddr, IpUse>, pools: &[Pool]) -> RehomeReport {
    let mut report = RehomeReport::default();
    for (ip, usage) in ips.iter_mut() {
        usage.pool = pool_of(pools, *ip);
        match usage.pool {
            Some(_) => report.in_pools += 1,
            None => report.outside_pools.push(*ip),
        }
    }
    report
}

fn pool_of(pools: &[Pool], ip: IpAddr) -> Option<usize> {
    pools.iter().position(|p| p.blocks.iter().any(|b| b.contains(ip)))
}

/// The allocator: every pool and every assignment, behind one lock.
#[derive(Debug)]
pub struct Allocator {
    state: Mutex<State>,
}

impl Allocator {
    /// An allocator over `pools` that refuses to allocate until [`Self::restore`] ran.
    pub fn new(pools: Vec<Pool>) -> Self {
        Self { state: Mutex::new(State { pools: Arc::new(pools), ..State::default() }) }
    }

    /// The pools in use now.
    pub fn pools(&self) -> Arc<Vec<Pool>> {
        self.lock().pools.clone()
    }

    /// Swap in new pools, keeping every assignment: an address still in a pool stays with its
    /// Services; one in no pool stays with them too (reported, never handed to anyone else) and
    /// is released when they go. New addresses come from the new pools only.
    pub fn replace_pools(&self, pools: Vec<Pool>) -> RehomeReport {
        let mut state = self.lock();
        let report = rehome(&mut state.ips, &pools);
        state.pools = Arc::new(pools);
        report
    }

    /// Assigned addresses that are in no pool (kept through a pool edit until their Services go).
    pub fn outside_pools(&self) -> Vec<IpAddr> {
        self.lock().ips.iter().filter(|(_, u)| u.pool.is_none()).map(|(ip, _)| *ip).collect()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is consistent after every statement that can panic, so a poisoned lock is
        // still usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Forget every assignment and record the addresses the given Services report. A conflict
    /// (for example left behind by another allocator) is resolved in favour of a Service that
    /// asks for the address explicitly, then of the oldest Service (then by name).
    pub fn restore(&self, services: &[Service]) -> RestoreReport {
        let mut ordered: Vec<&Service> = services.iter().collect();
        ordered.sort_by(|a, b| {
            (&a.metadata.creation_timestamp, ServiceKey::of(a))
                .cmp(&(&b.metadata.creation_timestamp, ServiceKey::of(b)))
        });
        let mut report = RestoreReport::default();
        let mut state = self.lock();
        let pools = state.pools.clone();
        *state = State { pools, ..State::default() };
        // Pass one records explicitly requested addresses, pass two everything else.
        for explicit_pass in [true, false] {
            for service in &ordered {
                self.restore_one(&mut state, service, explicit_pass, &mut report);
            }
        }
        state.restored = true;
        report
    }

    fn restore_one(&self, state: &mut State, service: &Service, explicit_pass: bool, report: &mut RestoreReport) {
        let ingress = service.status.as_ref().and_then(|s| s.load_balancer.as_ref()).and_then(|l| l.ingress.as_ref());
        let ips: Vec<IpAddr> = ingress.into_iter().flatten().filter_map(|i| i.ip.as_deref()?.parse().ok()).collect();
        if ips.is_empty() {
            return;
        }
        let requested: Vec<IpAddr> = request_for(service)
            .map(|r| r.slots.iter().filter_map(|s| if let Slot::Exact(ip) = s { Some(*ip) } else { None }).collect())
            .unwrap_or_default();
        let key = ServiceKey::of(service);
        let holder = Holder {
            sharing_key: sharing_key_of(service),
            ports: ports_of(service),
            namespaces: sharing_namespaces_of(service, &key).unwrap_or_default(),
        };
        let mut kept = state.services.get(&key).map(|a| a.ips.clone()).unwrap_or_default();
        for ip in ips {
            if kept.contains(&ip) || requested.contains(&ip) != explicit_pass {
                continue;
            }
            let Some(pool) = pool_of(&state.pools, ip) else {
                report.outside_pools += 1;
                tracing::warn!(service = %key, %ip, "reported load-balancer IP is in no pool; the Service will get a pool address on its next sync");
                continue;
            };
            if !state.can_hold(&state.pools, ip, &key, &holder) {
                report.conflicts += 1;
                let holders: Vec<String> =
                    state.ips.get(&ip).map(|u| u.holders.keys().map(|k| k.to_string()).collect()).unwrap_or_default();
                tracing::warn!(service = %key, %ip, held_by = ?holders, "load-balancer IP is also reported by a Service that asks for it or is older; this Service will get a new address on its next sync");
                continue;
            }
            state
                .ips
                .entry(ip)
                .or_insert_with(|| IpUse { pool: Some(pool), holders: BTreeMap::new() })
                .holders
                .insert(key.clone(), holder.clone());
            kept.push(ip);
            report.restored += 1;
        }
        if !kept.is_empty() {
            state.services.insert(key, Assignment { uid: service.metadata.uid.clone(), ips: kept });
        }
    }

    /// Whether [`Self::restore`] has run.
    pub fn is_ready(&self) -> bool {
        self.lock().restored
    }

    /// The addresses assigned to the Service, if any. Idempotent and side-effect free.
    pub fn assigned(&self, key: &ServiceKey, uid: &Option<String>) -> Option<Vec<IpAddr>> {
        let state = self.lock();
        state.services.get(key).filter(|a| same_object(&a.uid, uid)).map(|a| a.ips.clone())
    }

    /// Give the request its addresses: the ones it already holds when they still fit, new
    /// ones otherwise. On error nothing changes, so a Service keeps its working address while
    /// a change it asked for cannot be made.
    pub fn ensure(&self, request: &LbRequest) -> Result<Vec<IpAddr>, AllocError> {
        let mut state = self.lock();
        if !state.restored {
            return Err(AllocError::NotReady);
        }
        let pools = state.pools.clone();
        let key = &request.key;
        // An assignment under the same name but another UID belongs to a deleted object.
        if state.services.get(key).is_some_and(|a| !same_object(&a.uid, &request.uid)) {
            let stale = state.release(key);
            tracing::info!(service = %key, ips = ?stale, "released the addresses of a previous Service with the same name");
        }
        let current: Vec<IpAddr> = state.services.get(key).map(|a| a.ips.clone()).unwrap_or_default();
        let holder = Holder {
            sharing_key: request.sharing_key.clone(),
            ports: request.ports.clone(),
            namespaces: request.sharing_namespaces.clone(),
        };
        let allowed: Vec<usize> = (0..pools.len()).filter(|&p| pools[p].admits(request)).collect();

        let mut chosen: Vec<IpAddr> = Vec::new();
        for slot in &request.slots {
            match *slot {
                Slot::Exact(ip) => {
                    check_exact(&pools, &state, request, &holder, &allowed, ip)?;
                    chosen.push(ip);
                }
                Slot::Any { family, required } => {
                    let fits = |ip: &IpAddr| family.is_none_or(|f| Family::of(*ip) == f) && !chosen.contains(ip);
                    // An address a pool edit left outside every pool stays with its Service.
                    let keep = current.iter().copied().find(|ip| {
                        fits(ip)
                            && match pool_of(&pools, *ip) {
                                Some(p) => allowed.contains(&p) && state.can_hold(&pools, *ip, key, &holder),
                                None => true,
                            }
                    });
                    let picked = keep
                        .or_else(|| find_shared(&pools, &state, request, &holder, &allowed, family))
                        .or_else(|| find_free(&pools, &state, request, &allowed, family));
                    match picked {
                        Some(ip) => chosen.push(ip),
                        None if required => return Err(exhausted(&pools, &state, request, &allowed, family)),
                        None => {
                            tracing::debug!(service = %key, family = ?family, "no address of the optional second family; continuing single-stack")
                        }
                    }
                }
            }
        }

        // Commit: drop what is no longer used, record what is.
        for ip in current.iter().filter(|ip| !chosen.contains(ip)) {
            state.drop_holder(*ip, key);
        }
        for ip in &chosen {
            let pool = pool_of(&pools, *ip);
            state
                .ips
                .entry(*ip)
                .or_insert_with(|| IpUse { pool, holders: BTreeMap::new() })
                .holders
                .insert(key.clone(), holder.clone());
        }
        if current != chosen {
            tracing::info!(service = %key, ips = ?chosen, previous = ?current, "assigned load-balancer addresses");
        }
        state.services.insert(key.clone(), Assignment { uid: request.uid.clone(), ips: chosen.clone() });
        Ok(chosen)
    }

    /// Release the Service's addresses; returns what was released (nothing when the key is
    /// unknown or belongs to another object).
    pub fn release(&self, key: &ServiceKey, uid: &Option<String>) -> Vec<IpAddr> {
        let mut state = self.lock();
        if !state.services.get(key).is_some_and(|a| same_object(&a.uid, uid)) {
            return Vec::new();
        }
        let released = state.release(key);
        tracing::info!(service = %key, ips = ?released, "released load-balancer addresses");
        released
    }

    /// Every Service holding addresses: its key, UID and addresses, ordered by key (the orphan
    /// report lists them; one whose Service is gone is an orphan).
    pub fn assignments(&self) -> Vec<(ServiceKey, Option<String>, Vec<IpAddr>)> {
        let state = self.lock();
        let mut out: Vec<_> = state.services.iter().map(|(k, a)| (k.clone(), a.uid.clone(), a.ips.clone())).collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Addresses in use inside one block (for per-family usage).
    pub fn in_use_in(&self, block: &IpBlock) -> usize {
        self.lock().in_use(block)
    }

    /// Usage per pool.
    pub fn usage(&self) -> Vec<PoolUsage> {
        let state = self.lock();
        state
            .pools
            .iter()
            .map(|p| PoolUsage {
                name: p.name.clone(),
                in_use: p.blocks.iter().map(|b| state.in_use(b)).sum(),
                usable: p.usable(),
            })
            .collect()
    }
}

/// Why `pool` hands `ip` to no one who asks for it (disabled, its CIDR's subnet-router anycast
/// address, or `avoidBuggyIPs`), naming `key`; `None` when it may. The allocator and the address
/// webhook both ask this.
pub fn withheld(pool: &Pool, key: &impl fmt::Display, ip: IpAddr) -> Option<String> {
    if pool.disabled {
        return Some(format!("{key} asks for {ip}, but pool {} is disabled: it hands out no address", pool.name));
    }
    if pool.blocks.iter().any(|b| b.skips(ip)) {
        return Some(format!(
            "{key} asks for {ip}, the subnet-router anycast address of pool {}'s CIDR, which is never handed out",
            pool.name
        ));
    }
    if pool.avoid_buggy_ips && is_buggy(ip) {
        return Some(format!("{key} asks for {ip}, which pool {} skips (avoidBuggyIPs)", pool.name));
    }
    None
}

fn check_exact(
    pools: &[Pool],
    state: &State,
    request: &LbRequest,
    holder: &Holder,
    allowed: &[usize],
    ip: IpAddr,
) -> Result<(), AllocError> {
    let key = &request.key;
    let already_mine = state.ips.get(&ip).is_some_and(|u| u.holders.contains_key(key));
    let Some(pool) = pool_of(pools, ip) else {
        // Kept through a pool edit that left it outside every pool: never taken away.
        if already_mine {
            return Ok(());
        }
        return Err(AllocError::Unsatisfiable(
            Refusal::RequestedAddressUnavailable,
            format!("{key} asks for {ip}, which is in no load-balancer pool"),
        ));
    };
    if ip.is_unspecified() {
        return Err(AllocError::Invalid(format!("{key} asks for {ip}, which is never handed out")));
    }
    let pool = &pools[pool];
    if !allowed.iter().any(|p| pools[*p].name == pool.name) {
        return Err(AllocError::Unsatisfiable(
            Refusal::RequestedAddressUnavailable,
            format!("{key} asks for {ip}, but pool {} does not admit it (namespaces or serviceSelector)", pool.name),
        ));
    }
    if !already_mine && let Some(why) = withheld(pool, key, ip) {
        return Err(AllocError::Unsatisfiable(Refusal::RequestedAddressUnavailable, why));
    }
    if !state.can_hold(pools, ip, key, holder) {
        let others: Vec<String> = state
            .ips
            .get(&ip)
            .map(|u| u.holders.keys().filter(|k| *k != key).map(|k| k.to_string()).collect())
            .unwrap_or_default();
        let conflict = if pool.allow_sharing && holder.sharing_key.is_some() {
            Refusal::SharingConflict
        } else {
            Refusal::RequestedAddressTaken
        };
        let why = if !pool.allow_sharing {
            format!("pool {} does not allow sharing", pool.name)
        } else if holder.sharing_key.is_none() {
            format!("{key} has no {ALLOW_SHARED_IP_ANNOTATION} annotation")
        } else {
            format!(
                "the sharing keys differ, the ports overlap, or a holder is in another namespace and the two do not name each other's in {SHARING_CROSS_NAMESPACE_ANNOTATION}"
            )
        };
        return Err(AllocError::Unsatisfiable(
            conflict,
            format!("{key} asks for {ip}, which is assigned to {} and {why}", others.join(", ")),
        ));
    }
    Ok(())
}

/// An address already held by Services with the same sharing key that this one can join.
fn find_shared(
    pools: &[Pool],
    state: &State,
    request: &LbRequest,
    holder: &Holder,
    allowed: &[usize],
    family: Option<Family>,
) -> Option<IpAddr> {
    holder.sharing_key.as_ref()?;
    for &p in allowed.iter().filter(|&&p| pools[p].allow_sharing && request.may_pick_from(&pools[p])) {
        let pool = &pools[p];
        for block in pool.blocks.iter().filter(|b| family.is_none_or(|f| b.family == f)) {
            let found = state.ips.range(block.first()..=block.last()).find(|(ip, usage)| {
                !usage.holders.contains_key(&request.key) && state.can_hold(pools, **ip, &request.key, holder)
            });
            if let Some((ip, _)) = found {
                return Some(*ip);
            }
        }
    }
    None
}

fn find_free(
    pools: &[Pool],
    state: &State,
    request: &LbRequest,
    allowed: &[usize],
    family: Option<Family>,
) -> Option<IpAddr> {
    allowed.iter().filter(|&&p| request.may_pick_from(&pools[p])).find_map(|&p| {
        let pool = &pools[p];
        pool.blocks
            .iter()
            .filter(|b| family.is_none_or(|f| b.family == f))
            .find_map(|b| state.first_free(b, pool.avoid_buggy_ips))
    })
}

fn exhausted(
    pools: &[Pool],
    state: &State,
    request: &LbRequest,
    allowed: &[usize],
    family: Option<Family>,
) -> AllocError {
    let key = &request.key;
    let what = family.map(|f| format!("{f} ")).unwrap_or_default();
    if pools.is_empty() {
        return AllocError::Unsatisfiable(
            Refusal::NoPoolMatches,
            format!("no load-balancer pools are configured; {key} cannot get an address"),
        );
    }
    if let Some(named) = &request.pool
        && allowed.is_empty()
    {
        let exists = pools.iter().any(|p| p.is_named(&named.name));
        let why = if exists { "does not admit it (namespaces or serviceSelector)" } else { "does not exist" };
        return AllocError::Unsatisfiable(
            Refusal::NoPoolMatches,
            format!("{} of {key} names pool {}, which {why}", named.annotation, named.name),
        );
    }
    if allowed.is_empty() {
        return AllocError::Unsatisfiable(
            Refusal::NoPoolMatches,
            format!("no load-balancer pool admits {key} (check the pools' namespaces and serviceSelector)"),
        );
    }
    let auto: Vec<usize> = allowed.iter().copied().filter(|&p| request.may_pick_from(&pools[p])).collect();
    if auto.is_empty() {
        let names: Vec<&str> = allowed.iter().map(|&p| pools[p].name.as_str()).collect();
        let why = if allowed.iter().all(|&p| pools[p].disabled) {
            "are disabled: they hand out no address"
        } else {
            "hand out only requested addresses (autoAssign: false) or are disabled"
        };
        return AllocError::Unsatisfiable(
            Refusal::NoPoolMatches,
            format!("the pools that admit {key} ({}) {why}", names.join(", ")),
        );
    }
    let with_family: Vec<usize> = auto.iter().copied().filter(|&p| pools[p].has_family(family)).collect();
    if with_family.is_empty() {
        let names: Vec<&str> = auto.iter().map(|&p| pools[p].name.as_str()).collect();
        return AllocError::Unsatisfiable(
            Refusal::NoPoolMatches,
            format!("{key} needs an {what}address but the pools it may use ({}) have none", names.join(", ")),
        );
    }
    let names: Vec<&str> = with_family.iter().map(|&p| pools[p].name.as_str()).collect();
    let (in_use, usable) = with_family.iter().fold((0usize, 0u128), |(used, total), &p| {
        let pool = &pools[p];
        let blocks = pool.blocks.iter().filter(|b| family.is_none_or(|f| b.family == f));
        let (u, t) = blocks
            .fold((0usize, 0u128), |(u, t), b| (u + state.in_use(b), t.saturating_add(b.usable(pool.avoid_buggy_ips))));
        (used + u, total.saturating_add(t))
    });
    AllocError::Unsatisfiable(
        Refusal::PoolExhausted,
        format!("no free {what}address for {key}: pool {} has {in_use} of {usable} addresses in use", names.join(", ")),
    )
}

/// A pool of `blocks` (CIDRs or ranges) with every option at its default, for tests.
#[cfg(test)]
pub(crate) fn test_pool(name: &str, blocks: &[&str]) -> Pool {
    Pool {
        name: name.into(),
        blocks: blocks
            .iter()
            .map(|b| if b.contains('/') { IpBlock::parse_cidr(b) } else { IpBlock::parse_range(b) }.unwrap())
            .collect(),
        namespaces: BTreeSet::new(),
        selector: None,
        namespace_selector: None,
        auto_assign: true,
        avoid_buggy_ips: false,
        allow_sharing: false,
        ports: Default::default(),
        disabled: false,
        policy: Default::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        LoadBalancerIngress, LoadBalancerStatus, ServicePort, ServiceSpec, ServiceStatus,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use kube::api::ObjectMeta;

    fn pool(name: &str, blocks: &[&str]) -> Pool {
        test_pool(name, blocks)
    }

    fn ready(pools: Vec<Pool>) -> Allocator {
        let a = Allocator::new(pools);
        a.restore(&[]);
        a
    }

    fn svc(name: &str) -> Service {
        Service {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                uid: Some(format!("uid-{name}")),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                type_: Some("LoadBalancer".into()),
                ports: Some(vec![ServicePort { port: 80, ..Default::default() }]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn with_annotation(mut s: Service, k: &str, v: &str) -> Service {
        s.metadata.annotations.get_or_insert_with(Default::default).insert(k.into(), v.into());
        s
    }

    fn with_families(mut s: Service, policy: &str, families: &[&str]) -> Service {
        let spec = s.spec.get_or_insert_with(Default::default);
        spec.ip_family_policy = Some(policy.into());
        spec.ip_families = Some(families.iter().map(|f| f.to_string()).collect());
        s
    }

    fn with_port(mut s: Service, port: i32) -> Service {
        s.spec.as_mut().unwrap().ports = Some(vec![ServicePort { port, ..Default::default() }]);
        s
    }

    fn with_ingress(mut s: Service, ips: &[&str]) -> Service {
        s.status = Some(ServiceStatus {
            load_balancer: Some(LoadBalancerStatus {
                ingress: Some(
                    ips.iter()
                        .map(|ip| LoadBalancerIngress { ip: Some(ip.to_string()), ..Default::default() })
                        .collect(),
                ),
            }),
            ..Default::default()
        });
        s
    }

    fn ensure(a: &Allocator, s: &Service) -> Result<Vec<String>, AllocError> {
        a.ensure(&request_for(s)?).map(|ips| ips.iter().map(|ip| ip.to_string()).collect())
    }

    fn ips(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn blocks_parse_and_count_their_usable_addresses() {
        let b = IpBlock::parse_cidr("10.0.0.0/24").unwrap();
        assert_eq!((b.first().to_string(), b.last().to_string()), ("10.0.0.0".into(), "10.0.0.255".into()));
        assert_eq!(b.usable(false), 256);
        assert_eq!(b.usable(true), 254);
        // 268 addresses, minus 10.0.0.255, 10.0.1.0, 10.0.1.255 and 10.0.2.0.
        assert_eq!(IpBlock::parse_range("10.0.0.250-10.0.2.5").unwrap().usable(true), 268 - 4);
        assert_eq!(IpBlock::parse_cidr("0.0.0.0/0").unwrap().usable(true), (1u128 << 32) - 2 * (1 << 24));
        // The subnet-router anycast address fd00:: is left out.
        assert_eq!(IpBlock::parse_cidr("fd00::/120").unwrap().usable(true), 255);
        assert_eq!(IpBlock::parse_cidr("::/0").unwrap().usable(false), u128::MAX);
        assert!(
            IpBlock::parse_cidr("10.0.0.0/24").unwrap().overlaps(&IpBlock::parse_range("10.0.0.255-10.0.1.0").unwrap())
        );
        assert!(!IpBlock::parse_cidr("10.0.0.0/24").unwrap().overlaps(&IpBlock::parse_cidr("10.0.1.0/24").unwrap()));
    }

    #[test]
    fn an_ipv6_cidr_never_hands_out_its_subnet_router_anycast_address_and_a_service_holding_it_keeps_it() {
        let anycast: IpAddr = "fd00:10::".parse().unwrap();
        let block = IpBlock::parse_cidr("fd00:10::/120").unwrap();
        assert!(block.skips(anycast) && !block.skips("fd00:10::1".parse().unwrap()));
        assert!(!IpBlock::parse_cidr("fd00:10::/127").unwrap().skips(anycast), "a /127 is a point-to-point pair");
        assert!(!IpBlock::parse_range("fd00:10::-fd00:10::ff").unwrap().skips(anycast), "a range is as written");
        assert!(
            !IpBlock::parse_cidr("10.0.0.0/24").unwrap().skips("10.0.0.0".parse().unwrap()),
            "IPv4 blocks as before"
        );
        let v6 = |s: Service| with_families(s, "SingleStack", &["IPv6"]);

        let a = ready(vec![pool("v6", &["fd00:10::/120"])]);
        assert_eq!(ensure(&a, &v6(svc("a"))).unwrap(), ips(&["fd00:10::1"]), "the first address handed out");
        match ensure(&a, &with_annotation(v6(svc("b")), LOAD_BALANCER_IPS_ANNOTATION, "fd00:10::")) {
            Err(AllocError::Unsatisfiable(Refusal::RequestedAddressUnavailable, m)) => {
                assert!(m.contains("subnet-router anycast") && m.contains("v6"), "{m}")
            }
            other => panic!("asking for the anycast address is refused: {other:?}"),
        }
        assert_eq!(a.usage()[0].usable, 255);

        // Adoption without harm: a Service given that address earlier (by MetalLB, say) keeps it.
        let held = with_ingress(v6(svc("old")), &["fd00:10::"]);
        let a = Allocator::new(vec![pool("v6", &["fd00:10::/120"])]);
        a.restore(std::slice::from_ref(&held));
        assert_eq!(ensure(&a, &held).unwrap(), ips(&["fd00:10::"]));
    }

    #[test]
    fn nothing_is_allocated_before_the_restore() {
        let a = Allocator::new(vec![pool("p", &["10.0.0.0/30"])]);
        assert_eq!(ensure(&a, &svc("a")), Err(AllocError::NotReady));
        a.restore(&[]);
        assert_eq!(ensure(&a, &svc("a")).unwrap(), ips(&["10.0.0.0"]));
    }

    #[test]
    fn allocation_is_deterministic_and_idempotent() {
        let run = || {
            let a = ready(vec![pool("p", &["10.0.0.0/29"])]);
            (0..5).map(|i| ensure(&a, &svc(&format!("s{i}"))).unwrap()[0].clone()).collect::<Vec<_>>()
        };
        assert_eq!(run(), ["10.0.0.0", "10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"]);
        assert_eq!(run(), run());
        let a = ready(vec![pool("p", &["10.0.0.0/29"])]);
        let first = ensure(&a, &svc("x")).unwrap();
        for _ in 0..3 {
            assert_eq!(ensure(&a, &svc("x")).unwrap(), first, "same Service, same IPs");
        }
        assert_eq!(a.usage()[0].in_use, 1);
    }

    #[test]
    fn pools_are_tried_in_order_and_buggy_addresses_skipped() {
        let mut small = pool("small", &["10.0.0.255-10.0.1.0"]);
        small.avoid_buggy_ips = true;
        let a = ready(vec![small, pool("next", &["10.1.0.0/24"])]);
        assert_eq!(ensure(&a, &svc("a")).unwrap(), ips(&["10.1.0.0"]), "both addresses of the first pool are buggy");
    }

    #[test]
    fn exhaustion_is_unsatisfiable_with_counts_and_release_frees_the_address() {
        let a = ready(vec![pool("tiny", &["10.0.0.0/31"])]);
        ensure(&a, &svc("a")).unwrap();
        ensure(&a, &svc("b")).unwrap();
        match ensure(&a, &svc("c")) {
            Err(AllocError::Unsatisfiable(_, m)) => {
                assert!(m.contains("default/c") && m.contains("tiny") && m.contains("2 of 2"), "{m}")
            }
            other => panic!("{other:?}"),
        }
        let a_key = ServiceKey::of(&svc("a"));
        assert!(a.release(&a_key, &Some("someone-else".into())).is_empty(), "another object's UID frees nothing");
        assert_eq!(a.release(&a_key, &Some("uid-a".into())), ["10.0.0.0".parse::<IpAddr>().unwrap()]);
        assert_eq!(ensure(&a, &svc("c")).unwrap(), ips(&["10.0.0.0"]));
    }

    fn refusal(r: Result<Vec<String>, AllocError>) -> Refusal {
        match r {
            Err(AllocError::Unsatisfiable(refusal, _)) => refusal,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn each_unmet_request_names_its_refusal() {
        let mut shared = pool("shared", &["10.0.0.0/31"]);
        shared.allow_sharing = true;
        let a = ready(vec![shared]);
        let key = |s: Service, k: &str| with_annotation(s, ALLOW_SHARED_IP_ANNOTATION, k);
        ensure(&a, &key(svc("a"), "k")).unwrap();
        ensure(&a, &svc("b")).unwrap();
        assert_eq!(refusal(ensure(&a, &svc("c"))), Refusal::PoolExhausted);
        let asks = |name: &str, ip: &str| with_annotation(svc(name), LOAD_BALANCER_IPS_ANNOTATION, ip);
        assert_eq!(refusal(ensure(&a, &asks("d", "10.0.0.1"))), Refusal::RequestedAddressTaken);
        assert_eq!(refusal(ensure(&a, &asks("e", "192.0.2.1"))), Refusal::RequestedAddressUnavailable);
        // Same key, same port 80/TCP as a: a sharing conflict.
        assert_eq!(refusal(ensure(&a, &key(asks("f", "10.0.0.0"), "k"))), Refusal::SharingConflict);
        let mut v6 = svc("g");
        v6.spec.as_mut().unwrap().ip_families = Some(vec!["IPv6".into()]);
        assert_eq!(refusal(ensure(&a, &v6)), Refusal::NoPoolMatches);
    }

    #[test]
    fn a_named_pool_is_used_even_without_auto_assign_and_other_pools_are_not() {
        let mut manual = pool("manual", &["10.0.1.0/30"]);
        manual.auto_assign = false;
        let a = ready(vec![pool("general", &["10.0.0.0/30"]), manual]);
        let plain = request_for(&svc("plain")).unwrap();
        assert_eq!(a.ensure(&plain).unwrap()[0].to_string(), "10.0.0.0", "unnamed: the autoAssign pool");
        let named = request_for(&with_annotation(svc("named"), ADDRESS_POOL_ANNOTATION, "manual")).unwrap();
        assert_eq!(a.ensure(&named).unwrap()[0].to_string(), "10.0.1.0", "named: its pool, autoAssign or not");
        // A requested address must lie in the named pool.
        let outside = with_annotation(
            with_annotation(svc("outside"), ADDRESS_POOL_ANNOTATION, "manual"),
            LOAD_BALANCER_IPS_ANNOTATION,
            "10.0.0.2",
        );
        assert!(matches!(
            a.ensure(&request_for(&outside).unwrap()),
            Err(AllocError::Unsatisfiable(Refusal::RequestedAddressUnavailable, _))
        ));
        let missing = request_for(&with_annotation(svc("missing"), ADDRESS_POOL_ANNOTATION, "nope")).unwrap();
        match a.ensure(&missing) {
            Err(AllocError::Unsatisfiable(Refusal::NoPoolMatches, m)) => {
                assert!(m.contains(ADDRESS_POOL_ANNOTATION) && m.contains("does not exist"), "{m}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_named_pool_still_applies_its_namespaces_and_the_name_is_bounded() {
        let mut team = pool("team", &["10.0.2.0/30"]);
        team.namespaces = BTreeSet::from(["team-a".to_string()]);
        let a = ready(vec![team]);
        let r = request_for(&with_annotation(svc("x"), ADDRESS_POOL_ANNOTATION, "team")).unwrap();
        match a.ensure(&r) {
            Err(AllocError::Unsatisfiable(Refusal::NoPoolMatches, m)) => assert!(m.contains("does not admit"), "{m}"),
            other => panic!("naming a pool grants nothing its namespaces deny: {other:?}"),
        }
        let long = "p".repeat(MAX_POOL_NAME + 1);
        let err = request_for(&with_annotation(svc("y"), ADDRESS_POOL_ANNOTATION, &long)).unwrap_err();
        assert!(
            matches!(&err, AllocError::Invalid(m) if m.contains(ADDRESS_POOL_ANNOTATION) && !m.contains(&long)),
            "{err:?}"
        );
    }

    #[test]
    fn metallbs_pool_annotation_names_the_imported_pool_by_its_metallb_name() {
        let a =
            ready(vec![pool("other", &["10.0.0.0/30"]), pool("metallb:metallb-system/production", &["10.0.9.0/30"])]);
        for name in METALLB_ADDRESS_POOL_ANNOTATIONS {
            let r = request_for(&with_annotation(svc(name), name, "production")).unwrap();
            assert_eq!(r.pool.as_ref().map(|p| p.annotation), Some(name));
            let ip = a.ensure(&r).unwrap()[0];
            assert!(ip.to_string().starts_with("10.0.9."), "{name}: {ip}");
        }
        // Ours wins over MetalLB's.
        let both = with_annotation(
            with_annotation(svc("both"), METALLB_ADDRESS_POOL_ANNOTATIONS[0], "production"),
            ADDRESS_POOL_ANNOTATION,
            "other",
        );
        assert_eq!(a.ensure(&request_for(&both).unwrap()).unwrap()[0].to_string(), "10.0.0.0");
    }

    #[test]
    fn metallb_annotations_are_read_when_ours_is_absent() {
        let a = ready(vec![pool("p", &["10.0.0.0/24"])]);
        let old = with_annotation(svc("a"), "metallb.universe.tf/loadBalancerIPs", "10.0.0.7");
        assert_eq!(ensure(&a, &old).unwrap(), ips(&["10.0.0.7"]));
        let new = with_annotation(svc("b"), "metallb.io/loadBalancerIPs", "10.0.0.8");
        assert_eq!(ensure(&a, &new).unwrap(), ips(&["10.0.0.8"]));
        let both = with_annotation(
            with_annotation(svc("c"), LOAD_BALANCER_IPS_ANNOTATION, "10.0.0.9"),
            "metallb.io/loadBalancerIPs",
            "10.0.0.10",
        );
        assert_eq!(ensure(&a, &both).unwrap(), ips(&["10.0.0.9"]), "ours wins");
        let key = with_annotation(svc("d"), "metallb.universe.tf/allow-shared-ip", "web");
        assert_eq!(request_for(&key).unwrap().sharing_key.as_deref(), Some("web"));
        let bad = with_annotation(svc("e"), "metallb.io/loadBalancerIPs", "banana");
        assert!(matches!(ensure(&a, &bad), Err(AllocError::Invalid(m)) if m.contains("metallb.io/loadBalancerIPs")));
    }

    #[test]
    fn a_recreated_service_replaces_the_stale_assignment() {
        let a = ready(vec![pool("p", &["10.0.0.0/31"])]);
        ensure(&a, &svc("a")).unwrap();
        let mut again = svc("a");
        again.metadata.uid = Some("new-uid".into());
        assert_eq!(ensure(&a, &again).unwrap(), ips(&["10.0.0.0"]));
        assert_eq!(a.usage()[0].in_use, 1);
        assert!(a.assigned(&ServiceKey::of(&again), &Some("uid-a".into())).is_none());
    }

    #[test]
    fn requested_addresses_are_honoured_or_refused_with_the_reason() {
        let a = ready(vec![pool("p", &["10.0.0.0/24"])]);
        let mut s = svc("a");
        s.spec.as_mut().unwrap().load_balancer_ip = Some("10.0.0.42".into());
        assert_eq!(ensure(&a, &s).unwrap(), ips(&["10.0.0.42"]));
        let taken = with_annotation(svc("b"), LOAD_BALANCER_IPS_ANNOTATION, "10.0.0.42");
        match ensure(&a, &taken) {
            Err(AllocError::Unsatisfiable(_, m)) => assert!(m.contains("default/a") && m.contains("sharing"), "{m}"),
            other => panic!("{other:?}"),
        }
        let outside = with_annotation(svc("c"), LOAD_BALANCER_IPS_ANNOTATION, "192.168.0.1");
        assert!(
            matches!(ensure(&a, &outside), Err(AllocError::Unsatisfiable(_, m)) if m.contains("no load-balancer pool"))
        );
        let bad = with_annotation(svc("d"), LOAD_BALANCER_IPS_ANNOTATION, "10.0.0.1,banana");
        assert!(matches!(ensure(&a, &bad), Err(AllocError::Invalid(m)) if m.contains("banana")));
        let twice = with_annotation(svc("e"), LOAD_BALANCER_IPS_ANNOTATION, "10.0.0.1, 10.0.0.2");
        assert!(matches!(ensure(&a, &twice), Err(AllocError::Invalid(_))));
    }

    #[test]
    fn the_annotation_wins_over_spec_load_balancer_ip() {
        let a = ready(vec![pool("p", &["10.0.0.0/24"])]);
        let mut s = with_annotation(svc("a"), LOAD_BALANCER_IPS_ANNOTATION, "10.0.0.7");
        s.spec.as_mut().unwrap().load_balancer_ip = Some("10.0.0.8".into());
        assert_eq!(ensure(&a, &s).unwrap(), ips(&["10.0.0.7"]));
    }

    #[test]
    fn changing_the_requested_address_moves_the_service_and_frees_the_old_one() {
        let a = ready(vec![pool("p", &["10.0.0.0/24"])]);
        assert_eq!(ensure(&a, &svc("a")).unwrap(), ips(&["10.0.0.0"]));
        let moved = with_annotation(svc("a"), LOAD_BALANCER_IPS_ANNOTATION, "10.0.0.9");
        assert_eq!(ensure(&a, &moved).unwrap(), ips(&["10.0.0.9"]));
        assert_eq!(ensure(&a, &svc("b")).unwrap(), ips(&["10.0.0.0"]));
        // A refused change keeps the working address.
        let refused = with_annotation(svc("a"), LOAD_BALANCER_IPS_ANNOTATION, "10.0.0.0");
        assert!(ensure(&a, &refused).is_err());
        assert_eq!(a.assigned(&ServiceKey::of(&moved), &Some("uid-a".into())).unwrap()[0].to_string(), "10.0.0.9");
    }

    #[test]
    fn sharing_needs_the_pool_the_key_and_distinct_ports() {
        let mut shared = pool("shared", &["10.0.0.0/30"]);
        shared.allow_sharing = true;
        let a = ready(vec![shared]);
        let web = with_annotation(with_port(svc("web"), 80), ALLOW_SHARED_IP_ANNOTATION, "k");
        let dns = with_annotation(with_port(svc("dns"), 53), ALLOW_SHARED_IP_ANNOTATION, "k");
        let clash = with_annotation(with_port(svc("clash"), 80), ALLOW_SHARED_IP_ANNOTATION, "k");
        let other_key = with_annotation(with_port(svc("other"), 443), ALLOW_SHARED_IP_ANNOTATION, "j");
        let plain = with_port(svc("plain"), 8080);
        assert_eq!(ensure(&a, &web).unwrap(), ips(&["10.0.0.0"]));
        assert_eq!(ensure(&a, &dns).unwrap(), ips(&["10.0.0.0"]), "same key, distinct ports: shared");
        assert_eq!(ensure(&a, &clash).unwrap(), ips(&["10.0.0.1"]), "overlapping port: its own address");
        assert_eq!(ensure(&a, &other_key).unwrap(), ips(&["10.0.0.2"]), "another key: its own address");
        assert_eq!(ensure(&a, &plain).unwrap(), ips(&["10.0.0.3"]), "no key: its own address");
        // Asking for a shared address explicitly follows the same rules.
        let join = with_annotation(with_port(svc("join"), 25), ALLOW_SHARED_IP_ANNOTATION, "k");
        let join = with_annotation(join, LOAD_BALANCER_IPS_ANNOTATION, "10.0.0.0");
        assert_eq!(ensure(&a, &join).unwrap(), ips(&["10.0.0.0"]));
        // Released by one holder, the address stays with the others.
        a.release(&ServiceKey::of(&web), &Some("uid-web".into()));
        assert_eq!(a.usage()[0].in_use, 4);
        a.release(&ServiceKey::of(&dns), &Some("uid-dns".into()));
        a.release(&ServiceKey::of(&join), &Some("uid-join".into()));
        assert_eq!(a.usage()[0].in_use, 3);
    }

    fn in_namespace(mut s: Service, namespace: &str) -> Service {
        s.metadata.namespace = Some(namespace.into());
        s
    }

    #[test]
    fn a_sharing_key_is_scoped_to_its_namespace_unless_both_services_allow_the_other() {
        let mut shared = pool("shared", &["10.0.0.0/29"]);
        shared.allow_sharing = true;
        let a = ready(vec![shared]);
        let web = in_namespace(with_annotation(with_port(svc("web"), 80), ALLOW_SHARED_IP_ANNOTATION, "k"), "a");
        assert_eq!(ensure(&a, &web).unwrap(), ips(&["10.0.0.0"]));
        // The same namespace needs no opt-in, as before.
        let twin = in_namespace(with_annotation(with_port(svc("t"), 29), ALLOW_SHARED_IP_ANNOTATION, "k"), "a");
        assert_eq!(ensure(&a, &twin).unwrap(), ips(&["10.0.0.0"]));
        // Another namespace's Service with the same key neither joins nor asks its way in.
        let intruder = in_namespace(with_annotation(with_port(svc("x"), 443), ALLOW_SHARED_IP_ANNOTATION, "k"), "b");
        assert_eq!(ensure(&a, &intruder).unwrap(), ips(&["10.0.0.1"]), "its own address");
        let asking = with_annotation(intruder.clone(), LOAD_BALANCER_IPS_ANNOTATION, "10.0.0.0");
        let err = ensure(&a, &asking).unwrap_err();
        assert_eq!(refusal(Err(err.clone())), Refusal::SharingConflict, "{err}");
        assert!(err.to_string().contains(SHARING_CROSS_NAMESPACE_ANNOTATION), "{err}");
        // One side's opt-in is not enough; both sides' is, by name or `*`, ours or Cilium's.
        let open = |s: Service, v: &str| with_annotation(s, SHARING_CROSS_NAMESPACE_ANNOTATION, v);
        let one_sided = open(intruder.clone(), "a");
        assert_eq!(ensure(&a, &one_sided).unwrap(), ips(&["10.0.0.1"]));
        ensure(&a, &open(web.clone(), "b")).unwrap();
        ensure(&a, &open(twin.clone(), "b")).unwrap();
        assert_eq!(ensure(&a, &one_sided).unwrap(), ips(&["10.0.0.1"]), "keeps its own address");
        let joiner =
            open(in_namespace(with_annotation(with_port(svc("j"), 25), ALLOW_SHARED_IP_ANNOTATION, "k"), "b"), "*");
        assert_eq!(ensure(&a, &joiner).unwrap(), ips(&["10.0.0.0"]), "both sides allow it");
        let cilium = with_annotation(
            in_namespace(with_annotation(with_port(svc("c"), 26), ALLOW_SHARED_IP_ANNOTATION, "k"), "b"),
            CILIUM_SHARING_CROSS_NAMESPACE_ANNOTATIONS[0],
            "a, c",
        );
        assert_eq!(ensure(&a, &cilium).unwrap(), ips(&["10.0.0.0"]), "Cilium's opt-in reads the same");
        // Every holder must allow every other: a sibling of web that names no namespace may
        // not join an address Services of b hold.
        let sibling = in_namespace(with_annotation(with_port(svc("s"), 27), ALLOW_SHARED_IP_ANNOTATION, "k"), "a");
        assert_eq!(ensure(&a, &sibling).unwrap(), ips(&["10.0.0.2"]));
        let bad = open(in_namespace(with_port(svc("bad"), 28), "b"), "Not A Namespace");
        assert!(
            matches!(ensure(&a, &bad), Err(AllocError::Invalid(m)) if m.contains(SHARING_CROSS_NAMESPACE_ANNOTATION))
        );
    }

    #[test]
    fn restore_keeps_a_shared_address_only_for_services_allowed_to_share_across_namespaces() {
        let mut shared = pool("shared", &["10.0.0.0/30"]);
        shared.allow_sharing = true;
        let a = Allocator::new(vec![shared]);
        let keyed = |ns: &str, name: &str, port: i32| {
            let s = in_namespace(with_annotation(with_port(svc(name), port), ALLOW_SHARED_IP_ANNOTATION, "k"), ns);
            with_ingress(s, &["10.0.0.0"])
        };
        let report = a.restore(&[keyed("a", "web", 80), keyed("b", "other", 443)]);
        assert_eq!((report.restored, report.conflicts), (1, 1), "{report:?}");
        let open = |s: Service, v: &str| with_annotation(s, SHARING_CROSS_NAMESPACE_ANNOTATION, v);
        let report = a.restore(&[open(keyed("a", "web", 80), "b"), open(keyed("b", "other", 443), "a")]);
        assert_eq!((report.restored, report.conflicts), (2, 0), "{report:?}");
    }

    #[test]
    fn a_disabled_pool_keeps_its_holders_and_hands_out_nothing_not_even_a_requested_address() {
        let mut off = pool("off", &["10.0.0.0/30"]);
        off.disabled = true;
        off.allow_sharing = true;
        let a = Allocator::new(vec![off, pool("on", &["10.0.1.0/30"])]);
        let held =
            with_ingress(with_annotation(with_port(svc("held"), 80), ALLOW_SHARED_IP_ANNOTATION, "k"), &["10.0.0.1"]);
        assert_eq!(a.restore(std::slice::from_ref(&held)).restored, 1);
        assert_eq!(ensure(&a, &held).unwrap(), ips(&["10.0.0.1"]), "a holder keeps its address");
        assert_eq!(ensure(&a, &svc("new")).unwrap(), ips(&["10.0.1.0"]), "never handed out automatically");
        let asking = with_annotation(svc("asking"), LOAD_BALANCER_IPS_ANNOTATION, "10.0.0.2");
        let err = ensure(&a, &asking).unwrap_err();
        assert_eq!(refusal(Err(err.clone())), Refusal::RequestedAddressUnavailable);
        assert!(err.to_string().contains("disabled"), "{err}");
        let joiner = with_annotation(with_port(svc("joiner"), 443), ALLOW_SHARED_IP_ANNOTATION, "k");
        assert_eq!(ensure(&a, &joiner).unwrap(), ips(&["10.0.1.1"]), "no new holder joins it either");
        let named = with_annotation(svc("named"), ADDRESS_POOL_ANNOTATION, "off");
        let err = ensure(&a, &named).unwrap_err();
        assert_eq!(refusal(Err(err.clone())), Refusal::NoPoolMatches);
        assert!(err.to_string().contains("disabled"), "{err}");
    }

    #[test]
    fn a_pool_without_sharing_never_shares() {
        let a = ready(vec![pool("p", &["10.0.0.0/31"])]);
        let web = with_annotation(with_port(svc("web"), 80), ALLOW_SHARED_IP_ANNOTATION, "k");
        let dns = with_annotation(with_port(svc("dns"), 53), ALLOW_SHARED_IP_ANNOTATION, "k");
        assert_eq!(ensure(&a, &web).unwrap(), ips(&["10.0.0.0"]));
        assert_eq!(ensure(&a, &dns).unwrap(), ips(&["10.0.0.1"]));
    }

    #[test]
    fn a_port_change_that_clashes_moves_the_service_off_the_shared_address() {
        let mut shared = pool("shared", &["10.0.0.0/30"]);
        shared.allow_sharing = true;
        let a = ready(vec![shared]);
        let web = with_annotation(with_port(svc("web"), 80), ALLOW_SHARED_IP_ANNOTATION, "k");
        let dns = with_annotation(with_port(svc("dns"), 53), ALLOW_SHARED_IP_ANNOTATION, "k");
        ensure(&a, &web).unwrap();
        assert_eq!(ensure(&a, &dns).unwrap(), ips(&["10.0.0.0"]));
        let dns_on_80 = with_annotation(with_port(svc("dns"), 80), ALLOW_SHARED_IP_ANNOTATION, "k");
        assert_eq!(ensure(&a, &dns_on_80).unwrap(), ips(&["10.0.0.1"]));
    }

    #[test]
    fn dual_stack_policies() {
        let dual = || ready(vec![pool("v4", &["10.0.0.0/31"]), pool("v6", &["fd00::/127"])]);
        let a = dual();
        let require = with_families(svc("r"), "RequireDualStack", &["IPv6", "IPv4"]);
        assert_eq!(ensure(&a, &require).unwrap(), ips(&["fd00::", "10.0.0.0"]), "ipFamilies order");
        let prefer = with_families(svc("p"), "PreferDualStack", &["IPv4"]);
        assert_eq!(ensure(&a, &prefer).unwrap(), ips(&["10.0.0.1", "fd00::1"]));
        let single6 = with_families(svc("s"), "SingleStack", &["IPv6"]);
        assert!(matches!(ensure(&a, &single6), Err(AllocError::Unsatisfiable(_, m)) if m.contains("IPv6")));

        // Only IPv4 available: Prefer is best effort, Require fails and takes nothing.
        let v4_only = ready(vec![pool("v4", &["10.0.0.0/30"])]);
        let prefer = with_families(svc("p"), "PreferDualStack", &["IPv4", "IPv6"]);
        assert_eq!(ensure(&v4_only, &prefer).unwrap(), ips(&["10.0.0.0"]));
        let require = with_families(svc("r"), "RequireDualStack", &["IPv4", "IPv6"]);
        assert!(matches!(ensure(&v4_only, &require), Err(AllocError::Unsatisfiable(_, m)) if m.contains("IPv6")));
        assert_eq!(v4_only.usage()[0].in_use, 1, "a failed RequireDualStack request holds nothing");

        // Require with one requested address is refused; with both it is honoured.
        let one =
            with_annotation(with_families(svc("o"), "RequireDualStack", &[]), LOAD_BALANCER_IPS_ANNOTATION, "10.0.0.1");
        assert!(
            matches!(ensure(&dual(), &one), Err(AllocError::Unsatisfiable(_, m)) if m.contains("RequireDualStack"))
        );
        let both = with_annotation(
            with_families(svc("b"), "RequireDualStack", &["IPv4", "IPv6"]),
            LOAD_BALANCER_IPS_ANNOTATION,
            "fd00::1,10.0.0.1",
        );
        assert_eq!(ensure(&dual(), &both).unwrap(), ips(&["10.0.0.1", "fd00::1"]));
    }

    #[test]
    fn prefer_dual_stack_gains_its_second_family_when_one_frees_up() {
        let a = ready(vec![pool("v4", &["10.0.0.0/30"]), pool("v6", &["fd00::/128"])]);
        let holder = with_families(svc("h"), "SingleStack", &["IPv6"]);
        ensure(&a, &holder).unwrap();
        let prefer = with_families(svc("p"), "PreferDualStack", &["IPv4", "IPv6"]);
        assert_eq!(ensure(&a, &prefer).unwrap(), ips(&["10.0.0.0"]));
        a.release(&ServiceKey::of(&holder), &Some("uid-h".into()));
        assert_eq!(ensure(&a, &prefer).unwrap(), ips(&["10.0.0.0", "fd00::"]), "keeps its IPv4, adds the IPv6");
    }

    #[test]
    fn namespaces_and_selectors_restrict_pools() {
        let mut team = pool("team", &["10.0.0.0/31"]);
        team.namespaces = ["team-a".to_string()].into();
        let mut public = pool("public", &["10.1.0.0/31"]);
        public.selector = Some(LabelSelectorConfig {
            match_labels: [("exposure".to_string(), "public".to_string())].into(),
            ..Default::default()
        });
        let a = ready(vec![team, public]);
        let mut in_team = svc("a");
        in_team.metadata.namespace = Some("team-a".into());
        assert_eq!(ensure(&a, &in_team).unwrap(), ips(&["10.0.0.0"]));
        assert!(
            matches!(ensure(&a, &svc("b")), Err(AllocError::Unsatisfiable(_, m)) if m.contains("no load-balancer pool admits"))
        );
        let mut labelled = svc("c");
        labelled.metadata.labels = Some([("exposure".to_string(), "public".to_string())].into());
        assert_eq!(ensure(&a, &labelled).unwrap(), ips(&["10.1.0.0"]));
        let asks = with_annotation(svc("d"), LOAD_BALANCER_IPS_ANNOTATION, "10.0.0.1");
        assert!(matches!(ensure(&a, &asks), Err(AllocError::Unsatisfiable(_, m)) if m.contains("does not admit")));
    }

    #[test]
    fn restore_keeps_addresses_and_resolves_duplicates_for_the_oldest() {
        let a = Allocator::new(vec![pool("p", &["10.0.0.0/29"])]);
        let older = |mut s: Service, secs: i64| {
            s.metadata.creation_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap()));
            s
        };
        // Two Services left with the same address by a stateless allocator.
        let report = a.restore(&[
            older(with_ingress(svc("young"), &["10.0.0.3"]), 200),
            older(with_ingress(svc("old"), &["10.0.0.3"]), 100),
            older(with_ingress(svc("mid"), &["10.0.0.5", "192.168.1.1"]), 150),
        ]);
        assert_eq!(report, RestoreReport { restored: 2, outside_pools: 1, conflicts: 1 });
        assert_eq!(ensure(&a, &svc("old")).unwrap(), ips(&["10.0.0.3"]));
        assert_eq!(ensure(&a, &svc("mid")).unwrap(), ips(&["10.0.0.5"]));
        assert_eq!(ensure(&a, &svc("young")).unwrap(), ips(&["10.0.0.0"]), "the younger duplicate moves");
        assert_eq!(ensure(&a, &svc("new")).unwrap(), ips(&["10.0.0.1"]));
    }

    #[test]
    fn restore_prefers_the_service_that_asks_for_the_address() {
        let a = Allocator::new(vec![pool("p", &["10.0.0.0/29"])]);
        let mut old = with_ingress(svc("old"), &["10.0.0.4"]);
        old.metadata.creation_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::from_second(100).unwrap()));
        let mut asks =
            with_ingress(with_annotation(svc("asks"), LOAD_BALANCER_IPS_ANNOTATION, "10.0.0.4"), &["10.0.0.4"]);
        asks.metadata.creation_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::from_second(200).unwrap()));
        assert_eq!(a.restore(&[old, asks.clone()]).conflicts, 1);
        assert_eq!(ensure(&a, &asks).unwrap(), ips(&["10.0.0.4"]));
        assert_eq!(ensure(&a, &svc("old")).unwrap(), ips(&["10.0.0.0"]));
    }

    #[test]
    fn restore_then_ensure_reproduces_the_same_assignment() {
        let pools = vec![pool("p", &["10.0.0.0/28"])];
        let first = ready(pools.clone());
        let services: Vec<Service> = (0..10).map(|i| svc(&format!("s{i}"))).collect();
        let assigned: Vec<Vec<String>> = services.iter().map(|s| ensure(&first, s).unwrap()).collect();
        first.release(&ServiceKey::of(&services[3]), &Some("uid-s3".into()));
        // Restart: only what the Services report survives, in a different order.
        let reported: Vec<Service> = services
            .iter()
            .zip(&assigned)
            .enumerate()
            .filter(|(i, _)| *i != 3)
            .rev()
            .map(|(_, (s, ips))| with_ingress(s.clone(), &ips.iter().map(String::as_str).collect::<Vec<_>>()))
            .collect();
        let second = Allocator::new(pools);
        second.restore(&reported);
        for (i, s) in services.iter().enumerate().filter(|(i, _)| *i != 3) {
            assert_eq!(ensure(&second, s).unwrap(), assigned[i]);
        }
        assert_eq!(ensure(&second, &svc("newcomer")).unwrap(), assigned[3], "the freed address is reused");
    }

    #[test]
    fn restore_honours_sharing_rules() {
        let mut shared = pool("p", &["10.0.0.0/30"]);
        shared.allow_sharing = true;
        let a = Allocator::new(vec![shared]);
        let web =
            with_ingress(with_annotation(with_port(svc("web"), 80), ALLOW_SHARED_IP_ANNOTATION, "k"), &["10.0.0.1"]);
        let dns =
            with_ingress(with_annotation(with_port(svc("dns"), 53), ALLOW_SHARED_IP_ANNOTATION, "k"), &["10.0.0.1"]);
        let report = a.restore(&[web, dns]);
        assert_eq!(report.conflicts, 0);
        assert_eq!(a.usage()[0].in_use, 1);
    }

    #[test]
    fn a_pool_edit_keeps_every_assigned_address_and_new_ones_come_from_the_new_pools() {
        let a = ready(vec![pool("lan", &["10.0.0.0/31"])]);
        assert_eq!(ensure(&a, &svc("a")).unwrap(), ips(&["10.0.0.0"]));
        assert_eq!(ensure(&a, &svc("b")).unwrap(), ips(&["10.0.0.1"]));
        assert!(matches!(ensure(&a, &svc("c")), Err(AllocError::Unsatisfiable(..))), "the pool is full");

        let report = a.replace_pools(vec![pool("lan", &["10.0.0.0/31"]), pool("extra", &["10.9.0.0/31"])]);
        assert_eq!(report, RehomeReport { in_pools: 2, outside_pools: vec![] });
        assert_eq!(ensure(&a, &svc("a")).unwrap(), ips(&["10.0.0.0"]));
        assert_eq!(ensure(&a, &svc("b")).unwrap(), ips(&["10.0.0.1"]));
        assert_eq!(ensure(&a, &svc("c")).unwrap(), ips(&["10.9.0.0"]), "from the added pool");
        let usage: Vec<(String, usize)> = a.usage().into_iter().map(|u| (u.name, u.in_use)).collect();
        assert_eq!(usage, [("lan".to_string(), 2), ("extra".to_string(), 1)]);
    }

    #[test]
    fn an_address_a_pool_edit_leaves_outside_every_pool_stays_with_its_service_until_it_goes() {
        let a = ready(vec![pool("old", &["10.0.0.0/30"]), pool("kept", &["10.1.0.0/30"])]);
        assert_eq!(ensure(&a, &svc("a")).unwrap(), ips(&["10.0.0.0"]));
        let pinned = with_annotation(svc("pinned"), LOAD_BALANCER_IPS_ANNOTATION, "10.0.0.2");
        assert_eq!(ensure(&a, &pinned).unwrap(), ips(&["10.0.0.2"]));
        let mut kept = svc("k");
        kept.metadata.namespace = Some("other".into());
        ensure(&a, &with_annotation(kept.clone(), LOAD_BALANCER_IPS_ANNOTATION, "10.1.0.3")).unwrap();

        // The pool "old" goes; "kept" stays; "new" arrives.
        let report = a.replace_pools(vec![pool("kept", &["10.1.0.0/30"]), pool("new", &["10.2.0.0/31"])]);
        let outside: Vec<IpAddr> = ["10.0.0.0", "10.0.0.2"].iter().map(|ip| ip.parse().unwrap()).collect();
        assert_eq!(report, RehomeReport { in_pools: 1, outside_pools: outside.clone() });
        assert_eq!(a.outside_pools(), outside);

        // Live Services keep their addresses, requested or not.
        assert_eq!(ensure(&a, &svc("a")).unwrap(), ips(&["10.0.0.0"]));
        assert_eq!(ensure(&a, &pinned).unwrap(), ips(&["10.0.0.2"]));
        // No one else gets them: new Services get addresses from the pools.
        assert_eq!(ensure(&a, &svc("b")).unwrap(), ips(&["10.1.0.0"]));
        let grab = with_annotation(svc("grab"), LOAD_BALANCER_IPS_ANNOTATION, "10.0.0.0");
        assert!(
            matches!(ensure(&a, &grab), Err(AllocError::Unsatisfiable(_, m)) if m.contains("no load-balancer pool"))
        );
        // Addresses outside the pools count in no pool's usage.
        let usage: Vec<(String, usize)> = a.usage().into_iter().map(|u| (u.name, u.in_use)).collect();
        assert_eq!(usage, [("kept".to_string(), 2), ("new".to_string(), 0)]);

        // Released when the Service goes, and then gone for good.
        a.release(&ServiceKey::of(&svc("a")), &Some("uid-a".into()));
        assert_eq!(a.outside_pools(), outside[1..]);
        assert_eq!(ensure(&a, &svc("a")).unwrap(), ips(&["10.1.0.1"]));
    }

    #[test]
    fn a_pool_edit_back_to_the_old_pools_brings_outside_addresses_back_into_their_pool() {
        let a = ready(vec![pool("p", &["10.0.0.0/30"])]);
        ensure(&a, &svc("a")).unwrap();
        a.replace_pools(vec![pool("q", &["10.5.0.0/30"])]);
        assert_eq!(a.outside_pools().len(), 1);
        let report = a.replace_pools(vec![pool("p", &["10.0.0.0/30"])]);
        assert_eq!(report, RehomeReport { in_pools: 1, outside_pools: vec![] });
        assert_eq!(a.usage()[0].in_use, 1);
        assert_eq!(ensure(&a, &svc("b")).unwrap(), ips(&["10.0.0.1"]), "the kept address is not handed out again");
    }

    #[test]
    fn no_duplicates_across_many_services_and_families() {
        let mut shared = pool("mixed", &["10.0.0.0/27", "fd00::/123"]);
        shared.avoid_buggy_ips = true;
        let a = ready(vec![shared]);
        let mut seen = BTreeSet::new();
        for i in 0..80 {
            let s = match i % 3 {
                0 => svc(&format!("s{i}")),
                1 => with_families(svc(&format!("s{i}")), "SingleStack", &["IPv6"]),
                _ => with_families(svc(&format!("s{i}")), "PreferDualStack", &["IPv4", "IPv6"]),
            };
            if let Ok(got) = ensure(&a, &s) {
                for ip in got {
                    assert!(seen.insert(ip.clone()), "{ip} handed out twice");
                }
            }
        }
        assert_eq!(seen.len(), 31 + 31, "every usable address of both families is used once (fd00:: is skipped)");
        assert!(!seen.contains("10.0.0.0"));
    }
}
