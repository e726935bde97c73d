//! Pools read in place from MetalLB and Cilium (`loadBalancer.importPools`), for a migration in
//! which no Service changes address (pure; the listing is in [`crate::pool_import_watch`]).
//!
//! A MetalLB `IPAddressPool` (`metallb.io/v1beta1`) or a Cilium `CiliumLoadBalancerIPPool`
//! (`cilium.io/v2` or `v2alpha1`) becomes a [`LoadBalancerIPPoolSpec`], the type of our own pool
//! resources, and from there an allocator pool. What the spec cannot say becomes a [`Warning`]
//! naming the field and what is lost; nothing is dropped silently. Where a selector cannot be
//! expressed the imported pool admits more Services, never fewer: a Service keeps its address
//! only while the pool holding it admits it.
//!
//! Precedence: the cloud-config's pools, then `LoadBalancerIPPool` resources, then the imported
//! pools in the order of `importPools`; MetalLB's pools by `serviceAllocation.priority` (set
//! ones first, lowest first), then by creation time and name; Cilium's by creation time and
//! name. An imported address range overlapping an earlier pool is trimmed to what is left, so
//! every address keeps exactly one pool.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;

use crds::pool::{LoadBalancerIPPool, LoadBalancerIPPoolSpec, MAX_ENTRY_LENGTH, MAX_POOL_ENTRIES, MAX_POOL_NAMESPACES};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement, Time};
use kube::api::ObjectMeta;
use serde::Deserialize;
use serde_json::Value;

use crate::ipam::{IpBlock, Pool};
use crate::pool_resources::{self, Merged};

/// The most pools read from one source; more are left out with a warning.
pub const MAX_IMPORTED_POOLS: usize = 256;
/// The most selectors one MetalLB `serviceAllocation` list may hold.
pub const MAX_SELECTORS: usize = 16;
/// The most requirements (labels plus expressions) one selector may hold.
pub const MAX_REQUIREMENTS: usize = 32;

/// Cilium's pseudo-label for the Service's namespace in `serviceSelector`.
pub const CILIUM_NAMESPACE_LABEL: &str = "io.kubernetes.service.namespace";
/// Cilium's pseudo-label for the Service's name in `serviceSelector`.
pub const CILIUM_NAME_LABEL: &str = "io.kubernetes.service.name";

/// Where pools are imported from (`loadBalancer.importPools` entries).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// MetalLB's `IPAddressPool` (`metallb.io/v1beta1`, namespaced).
    Metallb,
    /// Cilium's `CiliumLoadBalancerIPPool` (`cilium.io/v2`, else `v2alpha1`; cluster-scoped).
    Cilium,
}

impl Source {
    /// The API group.
    pub fn group(self) -> &'static str {
        match self {
            Source::Metallb => "metallb.io",
            Source::Cilium => "cilium.io",
        }
    }

    /// Versions to try, newest first.
    pub fn versions(self) -> &'static [&'static str] {
        match self {
            Source::Metallb => &["v1beta1"],
            Source::Cilium => &["v2", "v2alpha1"],
        }
    }

    /// The kind.
    pub fn kind(self) -> &'static str {
        match self {
            Source::Metallb => "IPAddressPool",
            Source::Cilium => "CiliumLoadBalancerIPPool",
        }
    }

    /// The resource's plural.
    pub fn plural(self) -> &'static str {
        match self {
            Source::Metallb => "ipaddresspools",
            Source::Cilium => "ciliumloadbalancerippools",
        }
    }

    /// The spelling in `loadBalancer.importPools`.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Metallb => "metallb",
            Source::Cilium => "cilium",
        }
    }

    /// The imported pool's name: `metallb:<namespace>/<name>` or `cilium:<name>`, so it can
    /// clash with no pool of ours.
    pub fn pool_name(self, namespace: Option<&str>, name: &str) -> String {
        match namespace {
            Some(ns) => format!("{}:{ns}/{name}", self.as_str()),
            None => format!("{}:{name}", self.as_str()),
        }
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Something of the source pool the converted pool cannot express.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    /// The field path in the source object (`spec.serviceAllocation.serviceSelectors`).
    pub field: String,
    /// What is lost or changed.
    pub lost: String,
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.lost)
    }
}

fn warn(field: impl Into<String>, lost: impl Into<String>) -> Warning {
    Warning { field: field.into(), lost: lost.into() }
}

/// Why a source pool cannot be imported at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImportError {
    /// A field does not have the form the source's API defines.
    #[error("{field} must be {expected}")]
    Malformed {
        /// The field path.
        field: String,
        /// The expected form.
        expected: &'static str,
    },
    /// A list or string is longer than we accept.
    #[error("{field} holds more than {max} {what}")]
    TooLarge {
        /// The field path.
        field: String,
        /// The bound.
        max: usize,
        /// What is counted.
        what: &'static str,
    },
}

fn malformed(field: impl Into<String>, expected: &'static str) -> ImportError {
    ImportError::Malformed { field: field.into(), expected }
}

/// A source pool converted.
#[derive(Debug, Clone, PartialEq)]
pub struct Imported {
    /// Where it comes from.
    pub source: Source,
    /// The source object's namespace (MetalLB) and name.
    pub namespace: Option<String>,
    /// The source object's name.
    pub name: String,
    /// The converted pool, named by [`Source::pool_name`], with the source's creation time.
    pub resource: LoadBalancerIPPool,
    /// MetalLB's `serviceAllocation.priority` when set (non-zero).
    pub priority: Option<i64>,
    /// What the conversion could not express.
    pub warnings: Vec<Warning>,
}

/// A source object as read from the API server: its metadata and its `spec`.
#[derive(Debug, Clone, Default)]
pub struct SourceObject {
    /// The object's metadata.
    pub metadata: ObjectMeta,
    /// The object's `spec` (any JSON; checked here).
    pub spec: Value,
}

fn object<'a>(value: &'a Value, field: &str) -> Result<&'a serde_json::Map<String, Value>, ImportError> {
    value.as_object().ok_or_else(|| malformed(field, "an object"))
}

fn opt_bool(spec: &serde_json::Map<String, Value>, key: &str, default: bool) -> Result<bool, ImportError> {
    match spec.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(malformed(format!("spec.{key}"), "true or false")),
    }
}

fn string_list(value: Option<&Value>, field: &str, max: usize, what: &'static str) -> Result<Vec<String>, ImportError> {
    let Some(value) = value.filter(|v| !v.is_null()) else { return Ok(Vec::new()) };
    let items = value.as_array().ok_or_else(|| malformed(field, "a list of strings"))?;
    if items.len() > max {
        return Err(ImportError::TooLarge { field: field.to_string(), max, what });
    }
    items
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let text = v.as_str().ok_or_else(|| malformed(format!("{field}[{i}]"), "a string"))?;
            if text.len() > MAX_ENTRY_LENGTH {
                return Err(ImportError::TooLarge {
                    field: format!("{field}[{i}]"),
                    max: MAX_ENTRY_LENGTH,
                    what: "characters",
                });
            }
            Ok(text.trim().to_string())
        })
        .collect()
}

fn selector(value: &Value, field: &str) -> Result<LabelSelector, ImportError> {
    let selector: LabelSelector = serde_json::from_value(value.clone())
        .map_err(|_| malformed(field, "a label selector (matchLabels, matchExpressions)"))?;
    let size = selector.match_labels.as_ref().map_or(0, |m| m.len())
        + selector.match_expressions.as_ref().map_or(0, |m| m.len());
    if size > MAX_REQUIREMENTS {
        return Err(ImportError::TooLarge { field: field.to_string(), max: MAX_REQUIREMENTS, what: "requirements" });
    }
    Ok(selector)
}

fn unknown_fields(spec: &serde_json::Map<String, Value>, known: &[&str], warnings: &mut Vec<Warning>) {
    for key in spec.keys().filter(|k| !known.contains(&k.as_str())) {
        let key: String = key.chars().take(64).collect();
        warnings.push(warn(format!("spec.{key}"), "not understood by this importer; ignored"));
    }
}

/// A CIDR in canonical form (host bits cleared, as MetalLB's and Cilium's parsers do).
fn cidr(text: &str, field: &str) -> Result<ipnet::IpNet, ImportError> {
    let net: ipnet::IpNet = text.parse().map_err(|_| malformed(field, "a CIDR such as 192.0.2.0/24"))?;
    Ok(net.trunc())
}

fn address(text: &str, field: &str) -> Result<IpAddr, ImportError> {
    text.trim().parse().map_err(|_| malformed(field, "an IP address"))
}

fn range(first: IpAddr, last: IpAddr, field: &str) -> Result<String, ImportError> {
    IpBlock::parse_range(&format!("{first}-{last}"))
        .map_err(|_| malformed(field, "a range of one family whose end is not before its start"))?;
    Ok(format!("{first}-{last}"))
}

fn spec_with(cidrs: Vec<String>, ranges: Vec<String>) -> LoadBalancerIPPoolSpec {
    LoadBalancerIPPoolSpec {
        cidrs,
        ranges,
        auto_assign: true,
        avoid_buggy_ips: false,
        // Both MetalLB and Cilium share an address between Services that ask to.
        allow_sharing: true,
        namespaces: Vec::new(),
        namespace_selector: None,
        service_selector: None,
    }
}

fn imported(
    source: Source,
    metadata: &ObjectMeta,
    spec: LoadBalancerIPPoolSpec,
    priority: Option<i64>,
    warnings: Vec<Warning>,
) -> Imported {
    let name = metadata.name.clone().unwrap_or_default();
    let namespace = metadata.namespace.clone();
    let pool_name = source.pool_name(namespace.as_deref(), &name);
    Imported {
        source,
        resource: LoadBalancerIPPool {
            metadata: ObjectMeta {
                name: Some(pool_name),
                creation_timestamp: metadata.creation_timestamp.clone(),
                ..Default::default()
            },
            spec,
            status: None,
        },
        namespace,
        name,
        priority,
        warnings,
    }
}

/// Convert a MetalLB `IPAddressPool`.
pub fn from_metallb(object: &SourceObject) -> Result<Imported, ImportError> {
    let spec = self::object(&object.spec, "spec")?;
    let mut warnings = Vec::new();
    unknown_fields(spec, &["addresses", "autoAssign", "avoidBuggyIPs", "serviceAllocation"], &mut warnings);
    let (mut cidrs, mut ranges) = (Vec::new(), Vec::new());
    let entries = string_list(spec.get("addresses"), "spec.addresses", MAX_POOL_ENTRIES, "entries")?;
    if entries.is_empty() {
        return Err(malformed("spec.addresses", "a non-empty list of CIDRs or first-last ranges"));
    }
    for (i, entry) in entries.iter().enumerate() {
        let field = format!("spec.addresses[{i}]");
        match entry.split_once('-') {
            Some((first, last)) => {
                ranges.push(range(address(first, &field)?, address(last, &field)?, &field)?);
            }
            None => cidrs.push(cidr(entry, &field)?.to_string()),
        }
    }
    let mut out = spec_with(cidrs, ranges);
    out.auto_assign = opt_bool(spec, "autoAssign", true)?;
    out.avoid_buggy_ips = opt_bool(spec, "avoidBuggyIPs", false)?;
    let mut priority = None;
    if let Some(allocation) = spec.get("serviceAllocation").filter(|v| !v.is_null()) {
        let allocation = self::object(allocation, "spec.serviceAllocation")?;
        let known = ["priority", "namespaces", "namespaceSelectors", "serviceSelectors"];
        for key in allocation.keys().filter(|k| !known.contains(&k.as_str())) {
            let key: String = key.chars().take(64).collect();
            warnings.push(warn(format!("spec.serviceAllocation.{key}"), "not understood by this importer; ignored"));
        }
        priority = match allocation.get("priority") {
            None | Some(Value::Null) => None,
            Some(v) => match v.as_i64() {
                Some(0) => None,
                Some(p) => Some(p),
                None => return Err(malformed("spec.serviceAllocation.priority", "an integer")),
            },
        };
        let namespaces = string_list(
            allocation.get("namespaces"),
            "spec.serviceAllocation.namespaces",
            MAX_POOL_NAMESPACES,
            "namespaces",
        )?;
        let selectors = |key: &str| -> Result<Vec<LabelSelector>, ImportError> {
            let field = format!("spec.serviceAllocation.{key}");
            let Some(list) = allocation.get(key).filter(|v| !v.is_null()) else { return Ok(Vec::new()) };
            let list = list.as_array().ok_or_else(|| malformed(field.clone(), "a list of label selectors"))?;
            if list.len() > MAX_SELECTORS {
                return Err(ImportError::TooLarge { field, max: MAX_SELECTORS, what: "selectors" });
            }
            list.iter().enumerate().map(|(i, s)| selector(s, &format!("{field}[{i}]"))).collect()
        };
        let namespace_selectors = selectors("namespaceSelectors")?;
        let service_selectors = selectors("serviceSelectors")?;
        match (namespaces.is_empty(), namespace_selectors.len()) {
            (_, 0) => out.namespaces = namespaces,
            (true, 1) => out.namespace_selector = namespace_selectors.into_iter().next(),
            _ => warnings.push(warn(
                "spec.serviceAllocation.namespaceSelectors",
                "MetalLB admits a Service whose namespace is listed or matches any selector; one pool cannot say \"any\", so the imported pool admits every namespace",
            )),
        }
        match service_selectors.len() {
            0 => {}
            1 => out.service_selector = service_selectors.into_iter().next(),
            _ => warnings.push(warn(
                "spec.serviceAllocation.serviceSelectors",
                "MetalLB admits a Service matching any of the selectors; one pool cannot say \"any\", so the imported pool admits every Service",
            )),
        }
    }
    Ok(imported(Source::Metallb, &object.metadata, out, priority, warnings))
}

/// Convert a Cilium `CiliumLoadBalancerIPPool` (`v2` or `v2alpha1`, whose `cidrs` is read as
/// `blocks`).
pub fn from_cilium(object: &SourceObject) -> Result<Imported, ImportError> {
    let spec = self::object(&object.spec, "spec")?;
    let mut warnings = Vec::new();
    unknown_fields(spec, &["blocks", "cidrs", "serviceSelector", "disabled", "allowFirstLastIPs"], &mut warnings);
    let allow_first_last = match spec.get("allowFirstLastIPs") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s.eq_ignore_ascii_case("yes") => Some(true),
        Some(Value::String(s)) if s.eq_ignore_ascii_case("no") => Some(false),
        Some(_) => return Err(malformed("spec.allowFirstLastIPs", "Yes or No")),
    };
    let mut blocks: Vec<(String, &Value)> = Vec::new();
    for key in ["blocks", "cidrs"] {
        let Some(list) = spec.get(key).filter(|v| !v.is_null()) else { continue };
        let list = list.as_array().ok_or_else(|| malformed(format!("spec.{key}"), "a list of blocks"))?;
        blocks.extend(list.iter().enumerate().map(|(i, b)| (format!("spec.{key}[{i}]"), b)));
    }
    if blocks.is_empty() {
        return Err(malformed("spec.blocks", "a non-empty list of {cidr} or {start, stop} blocks"));
    }
    if blocks.len() > MAX_POOL_ENTRIES {
        return Err(ImportError::TooLarge { field: "spec.blocks".into(), max: MAX_POOL_ENTRIES, what: "blocks" });
    }
    let (mut cidrs, mut ranges) = (Vec::new(), Vec::new());
    let mut first_last_given_out = false;
    for (field, block) in blocks {
        let block = self::object(block, &field)?;
        let text = |key: &str| -> Result<Option<String>, ImportError> {
            let f = format!("{field}.{key}");
            match block.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) if s.len() <= MAX_ENTRY_LENGTH => Ok(Some(s.trim().to_string())),
                Some(Value::String(_)) => {
                    Err(ImportError::TooLarge { field: f, max: MAX_ENTRY_LENGTH, what: "characters" })
                }
                Some(_) => Err(malformed(f, "a string")),
            }
        };
        match (text("cidr")?, text("start")?, text("stop")?) {
            (Some(c), None, None) => {
                let net = cidr(&c, &format!("{field}.cidr"))?;
                // Cilium never reserves the ends of a /31, /32, /127 or /128.
                let reservable = net.max_prefix_len() - net.prefix_len() >= 2;
                match allow_first_last {
                    Some(false) if reservable => {
                        let first = step(net.network(), 1);
                        let last = step(net.broadcast(), -1);
                        ranges.push(range(first, last, &format!("{field}.cidr"))?);
                    }
                    None if reservable => {
                        first_last_given_out = true;
                        cidrs.push(net.to_string());
                    }
                    _ => cidrs.push(net.to_string()),
                }
            }
            (None, Some(start), stop) => {
                let first = address(&start, &format!("{field}.start"))?;
                let last = match stop {
                    Some(stop) => address(&stop, &format!("{field}.stop"))?,
                    None => first,
                };
                ranges.push(range(first, last, &field)?);
            }
            _ => return Err(malformed(field, "either cidr, or start with an optional stop")),
        }
    }
    if first_last_given_out {
        warnings.push(warn(
            "spec.allowFirstLastIPs",
            "unset: the first and last address of each CIDR are handed out, as Cilium 1.16 and later do; Cilium 1.15 and older reserved them (set No to keep them reserved)",
        ));
    }
    let mut out = spec_with(cidrs, ranges);
    if opt_bool(spec, "disabled", false)? {
        out.auto_assign = false;
        warnings.push(warn(
            "spec.disabled",
            "imported with autoAssign false: Services keep their addresses and get none automatically, but a Service may still request one of its addresses, which Cilium refuses",
        ));
    }
    if let Some(value) = spec.get("serviceSelector").filter(|v| !v.is_null()) {
        let (namespaces, rest) = cilium_selector(selector(value, "spec.serviceSelector")?, &mut warnings);
        out.namespaces = namespaces;
        out.service_selector = rest;
    }
    Ok(imported(Source::Cilium, &object.metadata, out, None, warnings))
}

/// Split Cilium's pseudo-labels out of a selector: the namespace one becomes the pool's
/// namespaces where it can (`matchLabels` or `In`), every other use of them is dropped with a
/// warning (the pool then admits more).
fn cilium_selector(mut selector: LabelSelector, warnings: &mut Vec<Warning>) -> (Vec<String>, Option<LabelSelector>) {
    let mut namespaces: Option<Vec<String>> = None;
    let mut narrow = |values: Vec<String>| {
        namespaces = Some(match namespaces.take() {
            None => values,
            Some(before) => before.into_iter().filter(|n| values.contains(n)).collect(),
        });
    };
    if let Some(labels) = selector.match_labels.as_mut() {
        if let Some(ns) = labels.remove(CILIUM_NAMESPACE_LABEL) {
            narrow(vec![ns]);
        }
        if labels.remove(CILIUM_NAME_LABEL).is_some() {
            warnings.push(warn(
                format!("spec.serviceSelector.matchLabels.{CILIUM_NAME_LABEL}"),
                "a pool cannot select Services by name; the imported pool admits Services of any name",
            ));
        }
    }
    let expressions: Vec<LabelSelectorRequirement> = selector.match_expressions.take().unwrap_or_default();
    let mut kept = Vec::new();
    for (i, requirement) in expressions.into_iter().enumerate() {
        let field = format!("spec.serviceSelector.matchExpressions[{i}]");
        if requirement.key == CILIUM_NAMESPACE_LABEL && requirement.operator == "In" {
            narrow(requirement.values.unwrap_or_default());
        } else if requirement.key == CILIUM_NAMESPACE_LABEL || requirement.key == CILIUM_NAME_LABEL {
            warnings.push(warn(
                field,
                format!(
                    "{} {} cannot be expressed by a pool (only a namespace In list can); dropped, so the imported pool admits more Services",
                    requirement.key, requirement.operator
                ),
            ));
        } else {
            kept.push(requirement);
        }
    }
    selector.match_expressions = (!kept.is_empty()).then_some(kept);
    if selector.match_labels.as_ref().is_some_and(|m| m.is_empty()) {
        selector.match_labels = None;
    }
    let rest = (selector.match_labels.is_some() || selector.match_expressions.is_some()).then_some(selector);
    let mut namespaces = namespaces.unwrap_or_default();
    namespaces.truncate(MAX_POOL_NAMESPACES);
    (namespaces, rest)
}

fn to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

fn from_u128(like: IpAddr, value: u128) -> IpAddr {
    match like {
        IpAddr::V4(_) => IpAddr::V4(std::net::Ipv4Addr::from(value as u32)),
        IpAddr::V6(_) => IpAddr::V6(std::net::Ipv6Addr::from(value)),
    }
}

/// `ip` moved by `by` (callers stay inside a block of at least four addresses).
fn step(ip: IpAddr, by: i8) -> IpAddr {
    let v = to_u128(ip);
    from_u128(ip, if by >= 0 { v.saturating_add(by as u128) } else { v.saturating_sub(by.unsigned_abs() as u128) })
}

/// What became of one imported pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Whether any of its addresses are handed out.
    pub used: bool,
    /// The conversion's warnings, then what the merge changed (trimmed overlaps).
    pub notes: Vec<String>,
}

/// The order imported pools are added in (see the module's precedence).
fn order_key(import: &Imported, sources: &[Source]) -> (usize, bool, i64, Option<Time>, String) {
    let position = sources.iter().position(|s| *s == import.source).unwrap_or(usize::MAX);
    let priority = import.priority.unwrap_or(i64::MAX);
    (
        position,
        import.priority.is_none(),
        priority,
        import.resource.metadata.creation_timestamp.clone(),
        import.resource.metadata.name.clone().unwrap_or_default(),
    )
}

/// `block` without the addresses of `taken`.
fn subtract(block: &IpBlock, taken: &[IpBlock]) -> Vec<IpBlock> {
    let mut parts = vec![*block];
    for hole in taken.iter().filter(|h| h.overlaps(block)) {
        let mut next = Vec::new();
        for part in parts {
            if !part.overlaps(hole) {
                next.push(part);
                continue;
            }
            let (first, last) = (to_u128(part.first()), to_u128(part.last()));
            let (hole_first, hole_last) = (to_u128(hole.first()), to_u128(hole.last()));
            let like = part.first();
            if hole_first > first
                && let Ok(b) = IpBlock::parse_range(&format!("{}-{}", part.first(), from_u128(like, hole_first - 1)))
            {
                next.push(b);
            }
            if hole_last < last
                && let Ok(b) = IpBlock::parse_range(&format!("{}-{}", from_u128(like, hole_last + 1), part.last()))
            {
                next.push(b);
            }
        }
        parts = next;
    }
    parts
}

/// Add the imported pools after the pools already merged, in the documented order; returns
/// what became of each, by pool name.
pub fn append(merged: &mut Merged, imports: &[Imported], sources: &[Source]) -> BTreeMap<String, Outcome> {
    let mut ordered: Vec<&Imported> = imports.iter().collect();
    ordered.sort_by_key(|i| order_key(i, sources));
    let mut outcomes = BTreeMap::new();
    for import in ordered {
        let name = import.resource.metadata.name.clone().unwrap_or_default();
        let mut notes: Vec<String> = import.warnings.iter().map(|w| w.to_string()).collect();
        let used = match pool_resources::to_pool(&import.resource) {
            Err(verdict) => {
                notes.push(format!("not imported: {}", verdict.message));
                false
            }
            Ok(pool) => add_trimmed(merged, pool, &mut notes),
        };
        outcomes.insert(name, Outcome { used, notes });
    }
    outcomes
}

/// Add `pool` without the addresses earlier pools hold; false when nothing is left.
fn add_trimmed(merged: &mut Merged, mut pool: Pool, notes: &mut Vec<String>) -> bool {
    let taken: Vec<(IpBlock, String)> =
        merged.pools.iter().flat_map(|p| p.blocks.iter().map(move |b| (*b, p.name.clone()))).collect();
    let mut blocks = Vec::new();
    for block in &pool.blocks {
        for (other, owner) in taken.iter().filter(|(b, _)| b.overlaps(block)) {
            let first = to_u128(block.first()).max(to_u128(other.first()));
            let last = to_u128(block.last()).min(to_u128(other.last()));
            notes.push(format!(
                "{}-{} also belongs to the earlier pool {owner}, which keeps it",
                from_u128(block.first(), first),
                from_u128(block.first(), last)
            ));
        }
        let holes: Vec<IpBlock> = taken.iter().map(|(b, _)| *b).collect();
        blocks.extend(subtract(block, &holes));
    }
    if blocks.is_empty() {
        notes.push("not imported: every address belongs to an earlier pool".to_string());
        return false;
    }
    pool.blocks = blocks;
    merged.pools.push(pool);
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn at(secs: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap())
    }

    fn obj(namespace: Option<&str>, name: &str, created: i64, spec: Value) -> SourceObject {
        SourceObject {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: namespace.map(Into::into),
                creation_timestamp: Some(at(created)),
                ..Default::default()
            },
            spec,
        }
    }

    fn metallb(spec: Value) -> Result<Imported, ImportError> {
        from_metallb(&obj(Some("metallb-system"), "pool", 1, spec))
    }

    fn cilium(spec: Value) -> Result<Imported, ImportError> {
        from_cilium(&obj(None, "pool", 1, spec))
    }

    fn fields(import: &Imported) -> Vec<&str> {
        import.warnings.iter().map(|w| w.field.as_str()).collect()
    }

    #[test]
    fn metallb_addresses_become_cidrs_and_ranges_with_host_bits_cleared() {
        let i = metallb(json!({"addresses": [
            "192.0.2.0/28", "192.0.2.77/32", "198.51.100.10 - 198.51.100.20", "2001:db8::/120", "203.0.113.9/24"
        ]}))
        .unwrap();
        assert_eq!(i.resource.spec.cidrs, ["192.0.2.0/28", "192.0.2.77/32", "2001:db8::/120", "203.0.113.0/24"]);
        assert_eq!(i.resource.spec.ranges, ["198.51.100.10-198.51.100.20"]);
        assert_eq!(i.resource.metadata.name.as_deref(), Some("metallb:metallb-system/pool"));
        assert!(i.resource.spec.auto_assign && !i.resource.spec.avoid_buggy_ips && i.resource.spec.allow_sharing);
        assert!(i.warnings.is_empty(), "{:?}", i.warnings);
        assert_eq!(i.resource.metadata.creation_timestamp, Some(at(1)));
    }

    #[test]
    fn metallb_malformed_or_oversized_addresses_refuse_the_pool_naming_the_field() {
        for (spec, needle) in [
            (json!({"addresses": ["lab"]}), "spec.addresses[0] must be a CIDR"),
            (json!({"addresses": ["192.0.2.9-192.0.2.1"]}), "spec.addresses[0] must be a range"),
            (json!({"addresses": ["192.0.2.1-2001:db8::1"]}), "spec.addresses[0] must be a range"),
            (json!({"addresses": ["192.0.2.1-x"]}), "spec.addresses[0] must be an IP address"),
            (json!({"addresses": []}), "spec.addresses must be a non-empty list"),
            (json!({"addresses": "192.0.2.0/24"}), "spec.addresses must be a list of strings"),
            (json!({"addresses": ["192.0.2.0/24"], "autoAssign": "yes"}), "spec.autoAssign must be true or false"),
        ] {
            let err = metallb(spec.clone()).unwrap_err().to_string();
            assert!(err.contains(needle), "{spec}: {err}");
        }
        let many: Vec<String> = (0..65).map(|i| format!("10.0.{i}.0/24")).collect();
        let err = metallb(json!({"addresses": many})).unwrap_err();
        assert!(matches!(err, ImportError::TooLarge { max: 64, .. }), "{err}");
        let long = format!("{}/24", "1".repeat(120));
        assert!(matches!(metallb(json!({"addresses": [long]})).unwrap_err(), ImportError::TooLarge { .. }));
    }

    #[test]
    fn metallb_auto_assign_and_avoid_buggy_ips_carry_over() {
        let i = metallb(json!({"addresses": ["192.0.2.0/24"], "autoAssign": false, "avoidBuggyIPs": true})).unwrap();
        assert!(!i.resource.spec.auto_assign && i.resource.spec.avoid_buggy_ips);
    }

    #[test]
    fn metallb_one_selector_or_a_namespace_list_carries_over_and_priority_is_kept() {
        let i = metallb(json!({"addresses": ["192.0.2.0/24"], "serviceAllocation": {
            "priority": 5,
            "namespaces": ["web", "api"],
            "serviceSelectors": [{"matchLabels": {"tier": "front"}}],
        }}))
        .unwrap();
        assert_eq!(i.resource.spec.namespaces, ["web", "api"]);
        assert_eq!(i.resource.spec.service_selector.unwrap().match_labels.unwrap()["tier"], "front");
        assert_eq!(i.priority, Some(5));
        assert!(i.warnings.is_empty());
        let j = metallb(json!({"addresses": ["192.0.2.0/24"], "serviceAllocation": {
            "priority": 0, "namespaceSelectors": [{"matchLabels": {"team": "a"}}],
        }}))
        .unwrap();
        assert_eq!(j.resource.spec.namespace_selector.unwrap().match_labels.unwrap()["team"], "a");
        assert_eq!(j.priority, None, "priority 0 is MetalLB's unset");
    }

    #[test]
    fn metallb_any_of_several_selectors_widens_the_pool_with_a_warning() {
        let i = metallb(json!({"addresses": ["192.0.2.0/24"], "serviceAllocation": {
            "namespaces": ["web"],
            "namespaceSelectors": [{"matchLabels": {"team": "a"}}],
            "serviceSelectors": [{"matchLabels": {"a": "1"}}, {"matchLabels": {"b": "2"}}],
        }}))
        .unwrap();
        assert!(i.resource.spec.namespaces.is_empty() && i.resource.spec.namespace_selector.is_none());
        assert!(i.resource.spec.service_selector.is_none());
        assert_eq!(
            fields(&i),
            ["spec.serviceAllocation.namespaceSelectors", "spec.serviceAllocation.serviceSelectors"]
        );
        assert!(i.warnings[1].lost.contains("admits every Service"));
        let many: Vec<Value> = (0..17).map(|_| json!({})).collect();
        let err = metallb(json!({"addresses": ["192.0.2.0/24"], "serviceAllocation": {"serviceSelectors": many}}));
        assert!(matches!(err, Err(ImportError::TooLarge { max: 16, .. })), "{err:?}");
    }

    #[test]
    fn unknown_fields_are_warnings_not_silent_drops() {
        let i = metallb(json!({"addresses": ["192.0.2.0/24"], "announce": true, "serviceAllocation": {"zone": "a"}}))
            .unwrap();
        assert_eq!(fields(&i), ["spec.announce", "spec.serviceAllocation.zone"]);
        let c = cilium(json!({"blocks": [{"cidr": "192.0.2.0/31"}], "futureField": 1})).unwrap();
        assert_eq!(fields(&c), ["spec.futureField"]);
    }

    #[test]
    fn cilium_blocks_and_v2alpha1_cidrs_become_cidrs_and_ranges() {
        let c = cilium(json!({
            "allowFirstLastIPs": "Yes",
            "blocks": [{"cidr": "192.0.2.0/28"}, {"start": "198.51.100.5", "stop": "198.51.100.9"}, {"start": "203.0.113.7"}],
            "cidrs": [{"cidr": "2001:db8::/124"}],
        }))
        .unwrap();
        assert_eq!(c.resource.spec.cidrs, ["192.0.2.0/28", "2001:db8::/124"]);
        assert_eq!(c.resource.spec.ranges, ["198.51.100.5-198.51.100.9", "203.0.113.7-203.0.113.7"]);
        assert_eq!(c.resource.metadata.name.as_deref(), Some("cilium:pool"));
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
        for (spec, needle) in [
            (json!({"blocks": [{"cidr": "192.0.2.0/28", "start": "192.0.2.1"}]}), "spec.blocks[0] must be either cidr"),
            (json!({"blocks": [{"start": "192.0.2.9", "stop": "192.0.2.1"}]}), "spec.blocks[0] must be a range"),
            (json!({"blocks": [{"cidr": "x"}]}), "spec.blocks[0].cidr must be a CIDR"),
            (json!({"blocks": []}), "spec.blocks must be a non-empty list"),
            (json!({"blocks": [{"cidr": "192.0.2.0/28"}], "allowFirstLastIPs": "Maybe"}), "Yes or No"),
        ] {
            let err = cilium(spec.clone()).unwrap_err().to_string();
            assert!(err.contains(needle), "{spec}: {err}");
        }
    }

    #[test]
    fn cilium_reserved_first_and_last_become_a_range_and_unset_is_a_warning() {
        let no = cilium(json!({"allowFirstLastIPs": "No", "blocks": [
            {"cidr": "192.0.2.0/28"}, {"cidr": "192.0.2.16/31"}, {"cidr": "2001:db8::/126"}
        ]}))
        .unwrap();
        assert_eq!(no.resource.spec.ranges, ["192.0.2.1-192.0.2.14", "2001:db8::1-2001:db8::2"]);
        assert_eq!(no.resource.spec.cidrs, ["192.0.2.16/31"], "a /31 keeps both ends, as in Cilium");
        let unset = cilium(json!({"blocks": [{"cidr": "192.0.2.0/28"}]})).unwrap();
        assert_eq!(unset.resource.spec.cidrs, ["192.0.2.0/28"]);
        assert_eq!(fields(&unset), ["spec.allowFirstLastIPs"]);
        let small = cilium(json!({"blocks": [{"cidr": "192.0.2.7/32"}]})).unwrap();
        assert!(small.warnings.is_empty(), "no end to reserve in a /32");
    }

    #[test]
    fn cilium_disabled_keeps_addresses_without_auto_assignment() {
        let c = cilium(json!({"disabled": true, "blocks": [{"cidr": "192.0.2.0/31"}]})).unwrap();
        assert!(!c.resource.spec.auto_assign);
        assert_eq!(fields(&c), ["spec.disabled"]);
    }

    #[test]
    fn cilium_namespace_pseudo_label_becomes_namespaces_and_name_is_dropped_with_a_warning() {
        let c = cilium(json!({"blocks": [{"cidr": "192.0.2.0/31"}], "serviceSelector": {
            "matchLabels": {"io.kubernetes.service.name": "web", "app": "x"},
            "matchExpressions": [
                {"key": "io.kubernetes.service.namespace", "operator": "In", "values": ["a", "b"]},
                {"key": "io.kubernetes.service.namespace", "operator": "NotIn", "values": ["c"]},
                {"key": "tier", "operator": "Exists"},
            ],
        }}))
        .unwrap();
        assert_eq!(c.resource.spec.namespaces, ["a", "b"]);
        let rest = c.resource.spec.service_selector.clone().unwrap();
        assert_eq!(rest.match_labels.unwrap().keys().collect::<Vec<_>>(), ["app"]);
        assert_eq!(rest.match_expressions.unwrap()[0].key, "tier");
        assert_eq!(
            fields(&c),
            ["spec.serviceSelector.matchLabels.io.kubernetes.service.name", "spec.serviceSelector.matchExpressions[1]"]
        );
        let only_ns = cilium(json!({"blocks": [{"cidr": "192.0.2.0/31"}], "serviceSelector": {
            "matchLabels": {"io.kubernetes.service.namespace": "a"}}}))
        .unwrap();
        assert_eq!(only_ns.resource.spec.namespaces, ["a"]);
        assert!(only_ns.resource.spec.service_selector.is_none());
    }

    fn config_pool(name: &str, cidr: &str) -> Pool {
        let mut r = from_metallb(&obj(None, name, 0, json!({"addresses": [cidr]}))).unwrap().resource;
        r.metadata.name = Some(name.into());
        pool_resources::to_pool(&r).unwrap()
    }

    #[test]
    fn imports_follow_our_pools_in_source_priority_and_age_order_and_overlaps_are_trimmed() {
        let mut merged = Merged { pools: vec![config_pool("ours", "192.0.2.4/30")], ..Default::default() };
        let old = from_metallb(&obj(Some("m"), "old", 1, json!({"addresses": ["198.51.100.0/30"]}))).unwrap();
        let urgent = from_metallb(&obj(
            Some("m"),
            "urgent",
            9,
            json!({
            "addresses": ["192.0.2.0/28"], "serviceAllocation": {"priority": 10}}),
        ))
        .unwrap();
        let first = from_metallb(&obj(
            Some("m"),
            "first",
            9,
            json!({
            "addresses": ["203.0.113.0/30"], "serviceAllocation": {"priority": 1}}),
        ))
        .unwrap();
        let cil =
            from_cilium(&obj(None, "c", 0, json!({"allowFirstLastIPs": "Yes", "blocks": [{"cidr": "192.0.2.8/30"}]})))
                .unwrap();
        let outcomes = append(&mut merged, &[cil, old, urgent, first], &[Source::Metallb, Source::Cilium]);
        let names: Vec<&str> = merged.pools.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["ours", "metallb:m/first", "metallb:m/urgent", "metallb:m/old"]);
        let urgent_blocks: Vec<(IpAddr, IpAddr)> =
            merged.pools[2].blocks.iter().map(|b| (b.first(), b.last())).collect();
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(urgent_blocks, [(ip("192.0.2.0"), ip("192.0.2.3")), (ip("192.0.2.8"), ip("192.0.2.15"))]);
        assert!(
            outcomes["metallb:m/urgent"].notes[0].contains("192.0.2.4-192.0.2.7 also belongs to the earlier pool ours")
        );
        let c = &outcomes["cilium:c"];
        assert!(!c.used && c.notes.iter().any(|n| n.contains("every address belongs to an earlier pool")), "{c:?}");
        assert!(outcomes["metallb:m/old"].used);
    }

    #[test]
    fn import_pools_is_validated_naming_the_field() {
        let ok =
            crate::config::parse(b"loadBalancer:\n  poolResources: true\n  importPools: [metallb, cilium]\n").unwrap();
        assert_eq!(ok.load_balancer.import_pools, [Source::Metallb, Source::Cilium]);
        let alone = crate::config::parse(b"loadBalancer:\n  importPools: [metallb]\n").unwrap_err().to_string();
        assert!(alone.contains("loadBalancer.importPools") && alone.contains("poolResources: true"), "{alone}");
        let twice = crate::config::parse(b"loadBalancer:\n  poolResources: true\n  importPools: [cilium, cilium]\n")
            .unwrap_err()
            .to_string();
        assert!(twice.contains("loadBalancer.importPools[1]") && twice.contains("duplicates"), "{twice}");
        let other = crate::config::parse(b"loadBalancer:\n  poolResources: true\n  importPools: [calico]\n")
            .unwrap_err()
            .to_string();
        assert!(other.contains("importPools") && other.contains("metallb"), "{other}");
    }

    #[test]
    fn cilium_annotations_ask_for_addresses_and_sharing() {
        use crate::ipam::{Slot, request_for};
        use k8s_openapi::api::core::v1::Service;
        let service = |annotations: Value| -> Service {
            serde_json::from_value(json!({"metadata": {"name": "s", "namespace": "d", "annotations": annotations}}))
                .unwrap()
        };
        let r =
            request_for(&service(json!({"lbipam.cilium.io/ips": "192.0.2.7", "lbipam.cilium.io/sharing-key": "k"})))
                .unwrap();
        assert_eq!(r.slots, [Slot::Exact("192.0.2.7".parse().unwrap())]);
        assert_eq!(r.sharing_key.as_deref(), Some("k"));
        let old =
            request_for(&service(json!({"io.cilium/lb-ipam-ips": "192.0.2.8", "io.cilium/lb-ipam-sharing-key": "o"})))
                .unwrap();
        assert_eq!(old.slots, [Slot::Exact("192.0.2.8".parse().unwrap())]);
        assert_eq!(old.sharing_key.as_deref(), Some("o"));
        let mixed =
            request_for(&service(json!({"metallb.io/allow-shared-ip": "m", "lbipam.cilium.io/sharing-key": "c"})))
                .unwrap();
        assert_eq!(mixed.sharing_key.as_deref(), Some("m"), "MetalLB's name is read first");
    }

    #[test]
    fn an_import_left_with_only_reserved_addresses_is_reported_not_used() {
        let mut merged = Merged::default();
        let lo = from_metallb(&obj(Some("m"), "lo", 1, json!({"addresses": ["127.0.0.0/30"]}))).unwrap();
        let outcomes = append(&mut merged, &[lo], &[Source::Metallb]);
        let o = &outcomes["metallb:m/lo"];
        assert!(!o.used && o.notes[0].starts_with("not imported: spec.cidrs[0]"), "{o:?}");
        assert!(merged.pools.is_empty());
    }
}
