//! Pools read in place from MetalLB, Cilium and kube-vip-cloud-provider
//! (`loadBalancer.importPools`), for a migration in which no Service changes address (pure; the
//! listing is in [`crate::pool_import_watch`], kube-vip's ConfigMap in
//! [`crate::pool_import_kubevip`]).
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
//! name; kube-vip's in its search order (`cidr-<namespace>`, `cidr-global`, `range-<namespace>`,
//! `range-global`). An imported address range overlapping an earlier pool is trimmed to what is left, so
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

/// kube-vip-cloud-provider's default ConfigMap namespace (`KUBEVIP_NAMESPACE`).
pub const KUBE_VIP_DEFAULT_NAMESPACE: &str = "kube-system";
/// kube-vip-cloud-provider's default ConfigMap name (`KUBEVIP_CONFIG_MAP`).
pub const KUBE_VIP_DEFAULT_NAME: &str = "kubevip";

/// Where pools are imported from (`loadBalancer.importPools` entries).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// MetalLB's `IPAddressPool` (`metallb.io/v1beta1`, namespaced).
    Metallb,
    /// Cilium's `CiliumLoadBalancerIPPool` (`cilium.io/v2`, else `v2alpha1`; cluster-scoped).
    Cilium,
    /// kube-vip-cloud-provider's ConfigMap (`kubevip` in `kube-system` unless named).
    Kubevip,
}

impl Source {
    /// The API group.
    pub fn group(self) -> &'static str {
        match self {
            Source::Metallb => "metallb.io",
            Source::Cilium => "cilium.io",
            Source::Kubevip => "",
        }
    }

    /// Versions to try, newest first.
    pub fn versions(self) -> &'static [&'static str] {
        match self {
            Source::Metallb => &["v1beta1"],
            Source::Cilium => &["v2", "v2alpha1"],
            Source::Kubevip => &["v1"],
        }
    }

    /// The kind.
    pub fn kind(self) -> &'static str {
        match self {
            Source::Metallb => "IPAddressPool",
            Source::Cilium => "CiliumLoadBalancerIPPool",
            Source::Kubevip => "ConfigMap",
        }
    }

    /// The resource's plural.
    pub fn plural(self) -> &'static str {
        match self {
            Source::Metallb => "ipaddresspools",
            Source::Cilium => "ciliumloadbalancerippools",
            Source::Kubevip => "configmaps",
        }
    }

    /// The spelling in `loadBalancer.importPools`.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Metallb => "metallb",
            Source::Cilium => "cilium",
            Source::Kubevip => "kubevip",
        }
    }

    /// The imported pool's name: `metallb:<namespace>/<name>`, `cilium:<name>` or
    /// `kubevip:<namespace>/<key>` (the ConfigMap's namespace and data key), so it can clash with
    /// no pool of ours.
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

/// The namespace MetalLB's pools are read from unless `importPools` names another (MetalLB's
/// controller reads its own namespace only).
pub const METALLB_DEFAULT_NAMESPACE: &str = "metallb-system";

/// The message of an `importPools` entry that is neither a source nor a `{source, namespace}`.
pub const BAD_IMPORT_ENTRY: &str = "must be metallb, cilium, kubevip, or {source: metallb or kubevip, namespace: NAME} (kubevip also takes name: CONFIGMAP)";

/// One `loadBalancer.importPools` entry: `metallb`, `cilium`, `kubevip`, or `{source: metallb,
/// namespace: NAME}` to read MetalLB's pools from another namespace than
/// [`METALLB_DEFAULT_NAMESPACE`], or `{source: kubevip, namespace: NS, name: NAME}` for a
/// kube-vip-cloud-provider started with `KUBEVIP_NAMESPACE` / `KUBEVIP_CONFIG_MAP`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImportSource {
    /// Where from.
    pub source: Source,
    /// The namespace given (MetalLB and kube-vip only; validated in the cloud-config).
    pub given_namespace: Option<String>,
    /// The ConfigMap's name given (kube-vip only; validated in the cloud-config).
    pub given_name: Option<String>,
}

impl ImportSource {
    /// The namespace the source's pools are read from: MetalLB's namespace, kube-vip's
    /// ConfigMap's, none for Cilium's cluster-scoped pools.
    pub fn namespace(&self) -> Option<&str> {
        match self.source {
            Source::Metallb => Some(self.given_namespace.as_deref().unwrap_or(METALLB_DEFAULT_NAMESPACE)),
            Source::Cilium => None,
            Source::Kubevip => Some(self.given_namespace.as_deref().unwrap_or(KUBE_VIP_DEFAULT_NAMESPACE)),
        }
    }

    /// The one object read by name (kube-vip's ConfigMap); `None` for the sources listed whole.
    pub fn object_name(&self) -> Option<&str> {
        match self.source {
            Source::Kubevip => Some(self.given_name.as_deref().unwrap_or(KUBE_VIP_DEFAULT_NAME)),
            Source::Metallb | Source::Cilium => None,
        }
    }
}

impl From<Source> for ImportSource {
    fn from(source: Source) -> Self {
        Self { source, given_namespace: None, given_name: None }
    }
}

/// The long form of an `importPools` entry.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImportEntry {
    /// `metallb`, `cilium` or `kubevip`.
    pub source: Source,
    /// MetalLB's namespace, or kube-vip's ConfigMap's.
    #[serde(default)]
    pub namespace: Option<String>,
    /// kube-vip's ConfigMap's name.
    #[serde(default)]
    pub name: Option<String>,
}

impl<'de> Deserialize<'de> for ImportSource {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = ImportSource;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(BAD_IMPORT_ENTRY)
            }
            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<ImportSource, E> {
                match text {
                    "metallb" => Ok(Source::Metallb.into()),
                    "cilium" => Ok(Source::Cilium.into()),
                    "kubevip" => Ok(Source::Kubevip.into()),
                    _ => Err(ccm_framework::safe_yaml::custom(BAD_IMPORT_ENTRY)),
                }
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<ImportSource, A::Error> {
                let entry = ImportEntry::deserialize(serde::de::value::MapAccessDeserializer::new(map))?;
                Ok(ImportSource { source: entry.source, given_namespace: entry.namespace, given_name: entry.name })
            }
        }
        deserializer.deserialize_any(Visitor)
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

pub(crate) fn warn(field: impl Into<String>, lost: impl Into<String>) -> Warning {
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
    /// The pool admits Services by a rule one pool cannot express ("any of several selectors",
    /// a selector on the Service's name, a restriction this importer does not know): importing
    /// it would admit more Services than the source does, so it is left out.
    #[error("{field}: {why}; not imported, since the pool would admit more Services than it does there")]
    Inexpressible {
        /// The field path.
        field: String,
        /// What cannot be expressed.
        why: String,
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

pub(crate) fn malformed(field: impl Into<String>, expected: &'static str) -> ImportError {
    ImportError::Malformed { field: field.into(), expected }
}

pub(crate) fn inexpressible(field: impl Into<String>, why: impl Into<String>) -> ImportError {
    ImportError::Inexpressible { field: field.into(), why: why.into() }
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
    /// MetalLB's `serviceAllocation.priority` when set (non-zero); for kube-vip, the rank of
    /// the key in its search order.
    pub priority: Option<i64>,
    /// A disabled Cilium pool: its Services keep their addresses, nobody gets a new one.
    pub disabled: bool,
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

pub(crate) fn spec_with(cidrs: Vec<String>, ranges: Vec<String>) -> LoadBalancerIPPoolSpec {
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
        advertisement: None,
    }
}

pub(crate) fn imported(
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
        disabled: false,
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
        if let Some(key) = allocation.keys().find(|k| !known.contains(&k.as_str())) {
            let key: String = key.chars().take(64).collect();
            return Err(inexpressible(
                format!("spec.serviceAllocation.{key}"),
                "a restriction this importer does not understand",
            ));
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
            _ => {
                return Err(inexpressible(
                    "spec.serviceAllocation.namespaceSelectors",
                    "MetalLB admits a Service whose namespace is listed or matches any of the selectors, and one pool cannot say \"any of\"",
                ));
            }
        }
        match service_selectors.len() {
            0 => {}
            1 => out.service_selector = service_selectors.into_iter().next(),
            _ => {
                return Err(inexpressible(
                    "spec.serviceAllocation.serviceSelectors",
                    "MetalLB admits a Service matching any of the selectors, and one pool cannot say \"any of\"",
                ));
            }
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
    let disabled = opt_bool(spec, "disabled", false)?;
    if disabled {
        out.auto_assign = false;
        warnings.push(warn(
            "spec.disabled",
            "imported disabled: Services keep the addresses they hold, and no Service gets one of its addresses, requested or not, as in Cilium",
        ));
    }
    if let Some(value) = spec.get("serviceSelector").filter(|v| !v.is_null()) {
        let (namespaces, rest) = cilium_selector(selector(value, "spec.serviceSelector")?)?;
        out.namespaces = namespaces;
        out.service_selector = rest;
    }
    let mut import = imported(Source::Cilium, &object.metadata, out, None, warnings);
    import.disabled = disabled;
    Ok(import)
}

/// Split Cilium's pseudo-labels out of a selector: the namespace one becomes the pool's
/// namespaces where it can (`matchLabels` or `In`); any other use of them cannot be expressed
/// and keeps the pool out (dropping it would admit more Services).
fn cilium_selector(mut selector: LabelSelector) -> Result<(Vec<String>, Option<LabelSelector>), ImportError> {
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
        if labels.contains_key(CILIUM_NAME_LABEL) {
            return Err(inexpressible(
                format!("spec.serviceSelector.matchLabels.{CILIUM_NAME_LABEL}"),
                "a pool cannot select Services by name",
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
            let operator: String = requirement.operator.chars().take(16).collect();
            return Err(inexpressible(
                field,
                format!("{} {operator} cannot be expressed by a pool (only a namespace In list can)", requirement.key),
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
    let namespaces = namespaces.unwrap_or_default();
    if namespaces.len() > MAX_POOL_NAMESPACES {
        return Err(ImportError::TooLarge {
            field: "spec.serviceSelector".to_string(),
            max: MAX_POOL_NAMESPACES,
            what: "namespaces",
        });
    }
    Ok((namespaces, rest))
}

pub(crate) fn to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

pub(crate) fn from_u128(like: IpAddr, value: u128) -> IpAddr {
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
            Ok(mut pool) => {
                pool.disabled = import.disabled;
                add_trimmed(merged, pool, &mut notes)
            }
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
    fn metallb_selectors_one_pool_cannot_express_keep_the_pool_out_instead_of_widening_it() {
        let inexpressible = |allocation: Value, field: &str| {
            let err = metallb(json!({"addresses": ["192.0.2.0/24"], "serviceAllocation": allocation})).unwrap_err();
            assert!(matches!(&err, ImportError::Inexpressible { field: f, .. } if f == field), "{err}");
            err.to_string()
        };
        let both = inexpressible(
            json!({"namespaces": ["web"], "namespaceSelectors": [{"matchLabels": {"team": "a"}}]}),
            "spec.serviceAllocation.namespaceSelectors",
        );
        assert!(both.contains("any of") && both.contains("not imported"), "{both}");
        inexpressible(
            json!({"namespaceSelectors": [{"matchLabels": {"team": "a"}}, {"matchLabels": {"team": "b"}}]}),
            "spec.serviceAllocation.namespaceSelectors",
        );
        inexpressible(
            json!({"serviceSelectors": [{"matchLabels": {"a": "1"}}, {"matchLabels": {"b": "2"}}]}),
            "spec.serviceAllocation.serviceSelectors",
        );
        // A restriction this importer does not know could narrow who may use the pool.
        inexpressible(json!({"zone": "a"}), "spec.serviceAllocation.zone");
        let many: Vec<Value> = (0..17).map(|_| json!({})).collect();
        let err = metallb(json!({"addresses": ["192.0.2.0/24"], "serviceAllocation": {"serviceSelectors": many}}));
        assert!(matches!(err, Err(ImportError::TooLarge { max: 16, .. })), "{err:?}");
    }

    #[test]
    fn unknown_fields_are_warnings_not_silent_drops() {
        let i = metallb(json!({"addresses": ["192.0.2.0/24"], "announce": true})).unwrap();
        assert_eq!(fields(&i), ["spec.announce"]);
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
    fn cilium_disabled_keeps_addresses_and_hands_out_none_not_even_a_requested_one() {
        let c = cilium(json!({"disabled": true, "blocks": [{"cidr": "192.0.2.0/31"}]})).unwrap();
        assert!(!c.resource.spec.auto_assign && c.disabled);
        assert_eq!(fields(&c), ["spec.disabled"]);
        let mut merged = Merged::default();
        append(&mut merged, &[c], &[Source::Cilium]);
        assert!(merged.pools[0].disabled, "the allocator pool takes no new holder");
        assert!(!cilium(json!({"blocks": [{"cidr": "192.0.2.0/31"}]})).unwrap().disabled);
    }

    #[test]
    fn cilium_namespace_pseudo_label_becomes_namespaces_and_what_a_pool_cannot_say_keeps_it_out() {
        let c = cilium(json!({"blocks": [{"cidr": "192.0.2.0/31"}], "serviceSelector": {
            "matchLabels": {"app": "x"},
            "matchExpressions": [
                {"key": "io.kubernetes.service.namespace", "operator": "In", "values": ["a", "b"]},
                {"key": "tier", "operator": "Exists"},
            ],
        }}))
        .unwrap();
        assert_eq!(c.resource.spec.namespaces, ["a", "b"]);
        let rest = c.resource.spec.service_selector.clone().unwrap();
        assert_eq!(rest.match_labels.unwrap().keys().collect::<Vec<_>>(), ["app"]);
        assert_eq!(rest.match_expressions.unwrap()[0].key, "tier");
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
        for (selector, field) in [
            (
                json!({"matchLabels": {"io.kubernetes.service.name": "web"}}),
                "spec.serviceSelector.matchLabels.io.kubernetes.service.name",
            ),
            (
                json!({"matchExpressions": [{"key": "io.kubernetes.service.namespace", "operator": "NotIn", "values": ["c"]}]}),
                "spec.serviceSelector.matchExpressions[0]",
            ),
        ] {
            let err = cilium(json!({"blocks": [{"cidr": "192.0.2.0/31"}], "serviceSelector": selector})).unwrap_err();
            assert!(matches!(&err, ImportError::Inexpressible { field: f, .. } if f == field), "{err}");
        }
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
        assert_eq!(ok.load_balancer.import_pools, [Source::Metallb.into(), Source::Cilium.into()]);
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
    fn metallb_pools_are_read_from_metallbs_namespace_only_which_import_pools_may_name() {
        let parse = |pools: &str| {
            crate::config::parse(format!("loadBalancer:\n  poolResources: true\n  importPools: {pools}\n").as_bytes())
        };
        let default = parse("[metallb, cilium]").unwrap().load_balancer.import_pools;
        assert_eq!(default[0].namespace(), Some(METALLB_DEFAULT_NAMESPACE));
        assert_eq!((default[1].source, default[1].namespace()), (Source::Cilium, None));
        let named = parse("[{source: metallb, namespace: lb-system}, cilium]").unwrap().load_balancer.import_pools;
        assert_eq!((named[0].source, named[0].namespace()), (Source::Metallb, Some("lb-system")));
        let cilium = parse("[{source: cilium, namespace: x}]").unwrap_err().to_string();
        assert!(cilium.contains("loadBalancer.importPools[0].namespace"), "{cilium}");
        let bad = parse("[{source: metallb, namespace: Not_A_Namespace}]").unwrap_err().to_string();
        assert!(bad.contains("loadBalancer.importPools[0].namespace"), "{bad}");
        let twice = parse("[metallb, {source: metallb, namespace: lb}]").unwrap_err().to_string();
        assert!(twice.contains("loadBalancer.importPools[1]") && twice.contains("duplicates"), "{twice}");
    }

    #[test]
    fn kube_vips_configmap_is_read_from_its_defaults_unless_import_pools_names_another() {
        let parse = |pools: &str| {
            crate::config::parse(format!("loadBalancer:\n  poolResources: true\n  importPools: {pools}\n").as_bytes())
        };
        let default = parse("[kubevip]").unwrap().load_balancer.import_pools;
        assert_eq!((default[0].namespace(), default[0].object_name()), (Some("kube-system"), Some("kubevip")));
        let named =
            parse("[{source: kubevip, namespace: lb, name: kubevip.pools}]").unwrap().load_balancer.import_pools;
        assert_eq!((named[0].namespace(), named[0].object_name()), (Some("lb"), Some("kubevip.pools")));
        let on_metallb = parse("[{source: metallb, name: x}]").unwrap_err().to_string();
        assert!(on_metallb.contains("loadBalancer.importPools[0].name"), "{on_metallb}");
        let bad = parse("[{source: kubevip, name: Not_A_Name}]").unwrap_err().to_string();
        assert!(bad.contains("loadBalancer.importPools[0].name"), "{bad}");
        let twice = parse("[kubevip, {source: kubevip, name: other}]").unwrap_err().to_string();
        assert!(twice.contains("loadBalancer.importPools[1]") && twice.contains("duplicates"), "{twice}");
    }

    #[test]
    fn kube_vips_annotation_asks_for_every_family_on_the_services_kube_vip_labelled_only() {
        use crate::ipam::{Slot, request_for};
        use k8s_openapi::api::core::v1::Service;
        let service = |labels: Value| -> Service {
            serde_json::from_value(json!({
                "metadata": {"name": "s", "namespace": "d", "labels": labels,
                    "annotations": {"kube-vip.io/loadbalancerIPs": "192.0.2.7,2001:db8::7"}},
                "spec": {"loadBalancerIP": "192.0.2.7", "ipFamilyPolicy": "RequireDualStack"},
            }))
            .unwrap()
        };
        let labelled = request_for(&service(json!({"implementation": "kube-vip"}))).unwrap();
        assert_eq!(
            labelled.slots,
            [Slot::Exact("192.0.2.7".parse().unwrap()), Slot::Exact("2001:db8::7".parse().unwrap())]
        );
        // Without kube-vip's label the annotation is this provider's own output (loadBalancer.kubeVip).
        assert!(request_for(&service(json!({}))).is_err(), "spec.loadBalancerIP alone names one family");
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
