//! The baremetal cloud-config: typed YAML, parsed strictly and validated before use.
//!
//! Every struct denies unknown fields, so a typo is an error with its path and line rather than
//! a silently ignored setting. Messages name the offending key or value and never echo more of
//! the document than that.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

use serde::{Deserialize, Deserializer};

use super::ipam::{IpBlock, Pool};

/// Why a cloud-config was rejected: the path of the culprit and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(String);

impl ConfigError {
    fn at(path: impl fmt::Display, message: impl fmt::Display) -> Self {
        ConfigError(format!("{path}: {message}"))
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

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
    #[serde(default)]
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
            None => format!("{}://{}", super::NAME, self.name),
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
}

impl Default for LoadBalancerConfig {
    fn default() -> Self {
        Self { pools: Vec::new(), retry_after: default_retry_after() }
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
}

/// A label selector (the Kubernetes shape).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LabelSelectorConfig {
    /// Labels that must be present with these values.
    #[serde(default)]
    pub match_labels: BTreeMap<String, String>,
    /// Set-based requirements.
    #[serde(default)]
    pub match_expressions: Vec<SelectorRequirement>,
}

impl LabelSelectorConfig {
    /// Whether `labels` satisfy every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.match_labels.iter().all(|(k, v)| labels.get(k) == Some(v))
            && self.match_expressions.iter().all(|r| {
                let value = labels.get(&r.key);
                match r.operator {
                    SelectorOperator::In => value.is_some_and(|v| r.values.contains(v)),
                    SelectorOperator::NotIn => value.is_none_or(|v| !r.values.contains(v)),
                    SelectorOperator::Exists => value.is_some(),
                    SelectorOperator::DoesNotExist => value.is_none(),
                }
            })
    }
}

/// One set-based selector requirement.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SelectorRequirement {
    /// The label key.
    pub key: String,
    /// How the key relates to the values.
    pub operator: SelectorOperator,
    /// Values for `In` / `NotIn`; must be empty otherwise.
    #[serde(default)]
    pub values: Vec<String>,
}

/// Selector operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum SelectorOperator {
    /// The label's value is one of the values.
    In,
    /// The label is absent or its value is none of the values.
    NotIn,
    /// The label is present.
    Exists,
    /// The label is absent.
    DoesNotExist,
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

/// Parse a duration written as a number and a unit: `500ms`, `10s`, `2m`, `1h`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number.parse().map_err(|_| format!("{text:?} is not a duration such as 500ms, 10s or 2m"))?;
    let seconds = match unit {
        "ms" => value / 1000.0,
        "s" => value,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        _ => return Err(format!("{text:?} has no unit: use ms, s, m or h (for example 10s)")),
    };
    if !seconds.is_finite() || seconds > 1e9 {
        return Err(format!("{text:?} is too long"));
    }
    Ok(Duration::from_secs_f64(seconds))
}

fn duration<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
    // A visitor, so the error is raised inside the YAML deserializer and carries the field's
    // path and line.
    struct Visitor;
    impl serde::de::Visitor<'_> for Visitor {
        type Value = Duration;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a duration such as 500ms, 10s or 2m")
        }
        fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Duration, E> {
            parse_duration(text).map_err(E::custom)
        }
    }
    deserializer.deserialize_str(Visitor)
}

/// Parse and validate a cloud-config document.
pub fn parse(bytes: &[u8]) -> Result<CloudConfig, ConfigError> {
    let config: CloudConfig = serde_yaml::from_slice(bytes).map_err(|e| ConfigError(describe_yaml_error(&e)))?;
    config.validate()?;
    Ok(config)
}

/// A YAML error as a short message: the path, what is wrong, and the line. Long quoted values
/// are cut so that a mistake never echoes a large part of the document.
fn describe_yaml_error(error: &serde_yaml::Error) -> String {
    let mut message = shorten_quoted(&error.to_string(), 40);
    if !message.contains(" at line ")
        && let Some(location) = error.location()
    {
        message.push_str(&format!(" at line {} column {}", location.line(), location.column()));
    }
    message
}

fn shorten_quoted(message: &str, max: usize) -> String {
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(open) = rest.find('"') {
        out.push_str(&rest[..=open]);
        rest = &rest[open + 1..];
        let Some(close) = rest.find('"') else { break };
        let quoted = &rest[..close];
        if quoted.chars().count() > max {
            out.extend(quoted.chars().take(max));
            out.push('…');
        } else {
            out.push_str(quoted);
        }
        out.push('"');
        rest = &rest[close + 1..];
    }
    out.push_str(rest);
    out
}

impl CloudConfig {
    /// Check everything the types cannot express; the error names the first culprit.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_instances()?;
        build_pools(&self.load_balancer)?;
        if let Some(probe) = &self.lifecycle.probe {
            validate_probe(probe)?;
        }
        Ok(())
    }

    fn validate_instances(&self) -> Result<(), ConfigError> {
        let mut names: HashMap<&str, usize> = HashMap::new();
        let mut provider_ids: HashMap<String, usize> = HashMap::new();
        // Lower-cased names and DNS-like addresses: the inventory matches Nodes on both.
        let mut lookup_names: HashMap<String, usize> = HashMap::new();
        for (i, instance) in self.instances.iter().enumerate() {
            let path = format!("instances[{i}]");
            validate_dns_subdomain(&instance.name).map_err(|m| ConfigError::at(format!("{path}.name"), m))?;
            if let Some(first) = names.insert(&instance.name, i) {
                return Err(ConfigError::at(
                    format!("{path}.name"),
                    format!("duplicate instance name {:?} (also instances[{first}])", instance.name),
                ));
            }
            if let Some(other) = lookup_names.insert(instance.name.clone(), i) {
                return Err(ConfigError::at(
                    format!("{path}.name"),
                    format!("{:?} is also an address of instances[{other}]; Nodes are matched on both", instance.name),
                ));
            }
            if let Some(id) = &instance.provider_id {
                validate_provider_id(id).map_err(|m| ConfigError::at(format!("{path}.providerID"), m))?;
            }
            let id = instance.effective_provider_id();
            if let Some(first) = provider_ids.insert(id.clone(), i) {
                return Err(ConfigError::at(
                    format!("{path}.providerID"),
                    format!("duplicate providerID {id:?} (also instances[{first}])"),
                ));
            }
            for (j, address) in instance.addresses.iter().enumerate() {
                let apath = format!("{path}.addresses[{j}].address");
                validate_address(address).map_err(|m| ConfigError::at(&apath, m))?;
                if !address.type_.is_ip() {
                    let key = address.address.to_ascii_lowercase();
                    match lookup_names.get(&key) {
                        Some(&other) if other != i => {
                            return Err(ConfigError::at(
                                apath,
                                format!(
                                    "{:?} also names instances[{other}]; Nodes are matched on it, so it must be unique",
                                    address.address
                                ),
                            ));
                        }
                        _ => {
                            lookup_names.insert(key, i);
                        }
                    }
                }
            }
            for (field, value) in
                [("instanceType", &instance.instance_type), ("zone", &instance.zone), ("region", &instance.region)]
            {
                if let Some(value) = value {
                    validate_label_value(value).map_err(|m| ConfigError::at(format!("{path}.{field}"), m))?;
                }
            }
            for (key, value) in &instance.labels {
                validate_label_key(key).map_err(|m| ConfigError::at(format!("{path}.labels"), m))?;
                if is_reserved_label(key) {
                    return Err(ConfigError::at(
                        format!("{path}.labels"),
                        format!(
                            "key {key:?} is in the kubernetes.io / k8s.io namespace; the node controller drops such labels, use your own prefix"
                        ),
                    ));
                }
                validate_label_value(value).map_err(|m| ConfigError::at(format!("{path}.labels.{key}"), m))?;
            }
        }
        Ok(())
    }
}

/// Build the allocator's pools, checking names, CIDRs, ranges, namespaces, selectors and
/// that no two address blocks overlap.
pub fn build_pools(config: &LoadBalancerConfig) -> Result<Vec<Pool>, ConfigError> {
    if config.retry_after.is_zero() {
        return Err(ConfigError::at("loadBalancer.retryAfter", "must be greater than zero"));
    }
    let mut pools = Vec::with_capacity(config.pools.len());
    let mut names: HashMap<&str, usize> = HashMap::new();
    // Every block seen so far, with the path that declared it, for overlap messages.
    let mut seen: Vec<(IpBlock, String)> = Vec::new();
    for (i, pool) in config.pools.iter().enumerate() {
        let path = format!("loadBalancer.pools[{i}]");
        if pool.name.trim().is_empty() {
            return Err(ConfigError::at(format!("{path}.name"), "must not be empty"));
        }
        if let Some(first) = names.insert(&pool.name, i) {
            return Err(ConfigError::at(
                format!("{path}.name"),
                format!("duplicate pool name {:?} (also loadBalancer.pools[{first}])", pool.name),
            ));
        }
        if pool.cidrs.is_empty() && pool.ranges.is_empty() {
            return Err(ConfigError::at(
                format!("{path} ({})", pool.name),
                "needs at least one entry in cidrs or ranges",
            ));
        }
        let mut blocks = Vec::new();
        let entries =
            pool.cidrs.iter().enumerate().map(|(j, c)| (format!("{path}.cidrs[{j}]"), IpBlock::parse_cidr(c))).chain(
                pool.ranges.iter().enumerate().map(|(j, r)| (format!("{path}.ranges[{j}]"), IpBlock::parse_range(r))),
            );
        for (entry_path, parsed) in entries {
            let block = parsed.map_err(|m| ConfigError::at(&entry_path, m))?;
            if let Some((_, other)) = seen.iter().find(|(b, _)| b.overlaps(&block)) {
                return Err(ConfigError::at(
                    &entry_path,
                    format!("overlaps {other}; an address may belong to one pool entry only"),
                ));
            }
            seen.push((block, format!("{entry_path} (pool {})", pool.name)));
            blocks.push(block);
        }
        let mut namespaces = BTreeSet::new();
        for (j, ns) in pool.namespaces.iter().enumerate() {
            validate_dns_label(ns).map_err(|m| ConfigError::at(format!("{path}.namespaces[{j}]"), m))?;
            namespaces.insert(ns.clone());
        }
        if let Some(selector) = &pool.service_selector {
            validate_selector(selector, &format!("{path}.serviceSelector"))?;
        }
        pools.push(Pool {
            name: pool.name.clone(),
            blocks,
            namespaces,
            selector: pool.service_selector.clone(),
            avoid_buggy_ips: pool.avoid_buggy_ips,
            allow_sharing: pool.allow_sharing,
        });
    }
    Ok(pools)
}

fn validate_probe(probe: &ProbeConfig) -> Result<(), ConfigError> {
    let path = "lifecycle.probe";
    if probe.port == 0 {
        return Err(ConfigError::at(format!("{path}.port"), "must be between 1 and 65535"));
    }
    if probe.interval.is_zero() {
        return Err(ConfigError::at(format!("{path}.interval"), "must be greater than zero"));
    }
    if probe.timeout.is_zero() {
        return Err(ConfigError::at(format!("{path}.timeout"), "must be greater than zero"));
    }
    if probe.timeout > probe.interval {
        return Err(ConfigError::at(
            format!("{path}.timeout"),
            format!("{:?} is longer than interval {:?}", probe.timeout, probe.interval),
        ));
    }
    if probe.failure_threshold == 0 {
        return Err(ConfigError::at(format!("{path}.failureThreshold"), "must be at least 1"));
    }
    if probe.success_threshold == 0 {
        return Err(ConfigError::at(format!("{path}.successThreshold"), "must be at least 1"));
    }
    if probe.concurrency == 0 {
        return Err(ConfigError::at(format!("{path}.concurrency"), "must be at least 1"));
    }
    if probe.address_types.is_empty() {
        return Err(ConfigError::at(format!("{path}.addressTypes"), "must name at least one address type"));
    }
    Ok(())
}

fn validate_selector(selector: &LabelSelectorConfig, path: &str) -> Result<(), ConfigError> {
    for (key, value) in &selector.match_labels {
        validate_label_key(key).map_err(|m| ConfigError::at(format!("{path}.matchLabels"), m))?;
        validate_label_value(value).map_err(|m| ConfigError::at(format!("{path}.matchLabels.{key}"), m))?;
    }
    for (i, requirement) in selector.match_expressions.iter().enumerate() {
        let rpath = format!("{path}.matchExpressions[{i}]");
        validate_label_key(&requirement.key).map_err(|m| ConfigError::at(format!("{rpath}.key"), m))?;
        match requirement.operator {
            SelectorOperator::In | SelectorOperator::NotIn if requirement.values.is_empty() => {
                return Err(ConfigError::at(
                    format!("{rpath}.values"),
                    format!("operator {:?} needs at least one value", requirement.operator),
                ));
            }
            SelectorOperator::Exists | SelectorOperator::DoesNotExist if !requirement.values.is_empty() => {
                return Err(ConfigError::at(
                    format!("{rpath}.values"),
                    format!("operator {:?} takes no values", requirement.operator),
                ));
            }
            _ => {}
        }
        for value in &requirement.values {
            validate_label_value(value).map_err(|m| ConfigError::at(format!("{rpath}.values"), m))?;
        }
    }
    Ok(())
}

fn validate_address(address: &AddressConfig) -> Result<(), String> {
    let text = &address.address;
    if text.is_empty() {
        return Err("must not be empty".into());
    }
    if address.type_.is_ip() {
        text.parse::<IpAddr>()
            .map(|_| ())
            .map_err(|_| format!("{text:?} is not an IP address ({})", address.type_.as_str()))
    } else if text.chars().any(|c| c.is_whitespace() || c == '/' || c == ':') || text.len() > 253 {
        Err(format!("{text:?} is not a DNS name ({})", address.type_.as_str()))
    } else {
        Ok(())
    }
}

fn validate_provider_id(id: &str) -> Result<(), String> {
    match id.split_once("://") {
        Some((scheme, rest)) if !scheme.is_empty() && !rest.is_empty() && !id.chars().any(char::is_whitespace) => {
            Ok(())
        }
        _ => Err(format!("{id:?} is not of the form <scheme>://<id>")),
    }
}

fn is_alnum(c: char) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit()
}

/// An RFC 1123 label: what a namespace name must be.
fn validate_dns_label(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.chars().all(|c| is_alnum(c) || c == '-')
        && name.starts_with(is_alnum)
        && name.ends_with(is_alnum);
    if ok { Ok(()) } else { Err(format!("{name:?} is not a valid name (lower-case letters, digits and '-')")) }
}

/// An RFC 1123 subdomain: what a Node name must be.
fn validate_dns_subdomain(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("must not be empty".into());
    }
    let ok = name.len() <= 253
        && name.split('.').all(|part| {
            !part.is_empty()
                && part.chars().all(|c| is_alnum(c) || c == '-')
                && part.starts_with(is_alnum)
                && part.ends_with(is_alnum)
        });
    if ok {
        Ok(())
    } else {
        Err(format!("{name:?} is not a valid Node name (lower-case letters, digits, '-' and '.')"))
    }
}

fn validate_label_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix
        && validate_dns_subdomain(prefix).is_err()
    {
        return Err(format!("key {key:?} has an invalid prefix"));
    }
    let alnum = |c: char| c.is_ascii_alphanumeric();
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.chars().all(|c| alnum(c) || matches!(c, '-' | '_' | '.'))
        && name.starts_with(alnum)
        && name.ends_with(alnum);
    if ok { Ok(()) } else { Err(format!("key {key:?} is not a valid label key")) }
}

fn validate_label_value(value: &str) -> Result<(), String> {
    let alnum = |c: char| c.is_ascii_alphanumeric();
    let ok = value.is_empty()
        || (value.len() <= 63
            && value.chars().all(|c| alnum(c) || matches!(c, '-' | '_' | '.'))
            && value.starts_with(alnum)
            && value.ends_with(alnum));
    if ok {
        Ok(())
    } else {
        Err(format!("{value:?} is not a valid label value (at most 63 letters, digits, '-', '_' or '.')"))
    }
}

/// Whether the node controller would drop this additional label (upstream N10).
pub fn is_reserved_label(key: &str) -> bool {
    let Some((prefix, _)) = key.split_once('/') else { return false };
    ["kubernetes.io", "k8s.io"].iter().any(|ns| prefix == *ns || prefix.ends_with(&format!(".{ns}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(doc: &str) -> String {
        parse(doc.as_bytes()).expect_err("the document must be rejected").to_string()
    }

    /// Assert the message names `field` (and, when given, the line).
    fn assert_names(doc: &str, field: &str) -> String {
        let message = err(doc);
        assert!(message.contains(field), "message {message:?} does not name {field:?}");
        message
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
    fn unknown_top_level_field_is_named_with_its_line() {
        let m = assert_names("instances: []\nloadbalancer: {}\n", "loadbalancer");
        assert!(m.contains("line 2"), "{m}");
    }

    #[test]
    fn unknown_instance_field_is_named_with_its_path_and_line() {
        let m = assert_names("instances:\n  - name: a\n    zones: x\n", "instances[0]: unknown field `zones`");
        assert!(m.contains("line 3"), "{m}");
    }

    #[test]
    fn unknown_field_on_the_first_line_still_has_a_line_number() {
        let m = assert_names("pools: []\n", "pools");
        assert!(m.contains("line 1"), "{m}");
    }

    #[test]
    fn missing_instance_name_is_named() {
        assert_names("instances:\n  - addresses: []\n", "missing field `name`");
    }

    #[test]
    fn invalid_instance_name_is_named() {
        assert_names("instances:\n  - name: Node_1\n", "instances[0].name");
        assert_names("instances:\n  - name: \"\"\n", "instances[0].name");
    }

    #[test]
    fn duplicate_instance_names_name_both_entries() {
        let m = assert_names("instances:\n  - name: a\n  - name: b\n  - name: a\n", "instances[2].name");
        assert!(m.contains("instances[0]") && m.contains("\"a\""), "{m}");
    }

    #[test]
    fn duplicate_provider_ids_are_named() {
        let doc = "instances:\n  - name: a\n    providerID: metal://x\n  - name: b\n    providerID: metal://x\n";
        assert_names(doc, "instances[1].providerID");
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
        assert!(m.contains("InternalIP"), "{m}");
    }

    #[test]
    fn an_ip_address_type_with_a_non_ip_is_named() {
        assert_names(
            "instances:\n  - name: a\n    addresses:\n      - {type: InternalIP, address: 10.0.0.300}\n",
            "instances[0].addresses[0].address",
        );
    }

    #[test]
    fn a_hostname_shared_by_two_instances_is_named() {
        let doc = "instances:\n  - name: a\n    addresses: [{type: Hostname, address: box.lan}]\n  - name: b\n    addresses: [{type: Hostname, address: BOX.lan}]\n";
        let m = assert_names(doc, "instances[1].addresses[0].address");
        assert!(m.contains("instances[0]"), "{m}");
    }

    #[test]
    fn a_hostname_equal_to_another_instances_name_is_named() {
        let doc = "instances:\n  - name: a\n  - name: b\n    addresses: [{type: Hostname, address: A}]\n";
        assert_names(doc, "instances[1].addresses[0].address");
    }

    #[test]
    fn unknown_state_is_named() {
        assert_names("instances:\n  - name: a\n    state: off\n", "instances[0].state");
    }

    #[test]
    fn reserved_label_namespace_is_named() {
        let m = assert_names(
            "instances:\n  - name: a\n    labels: {node-role.kubernetes.io/worker: \"\"}\n",
            "instances[0].labels",
        );
        assert!(m.contains("node-role.kubernetes.io/worker"), "{m}");
    }

    #[test]
    fn invalid_label_value_is_named() {
        assert_names(
            "instances:\n  - name: a\n    labels: {example.com/x: \"a b\"}\n",
            "instances[0].labels.example.com/x",
        );
    }

    #[test]
    fn invalid_zone_is_named() {
        assert_names("instances:\n  - name: a\n    zone: \"rack 1\"\n", "instances[0].zone");
    }

    #[test]
    fn pool_without_name_is_named() {
        assert_names("loadBalancer:\n  pools:\n    - cidrs: [10.0.0.0/24]\n", "missing field `name`");
    }

    #[test]
    fn duplicate_pool_names_are_named() {
        let doc =
            "loadBalancer:\n  pools:\n    - {name: a, cidrs: [10.0.0.0/24]}\n    - {name: a, cidrs: [10.0.1.0/24]}\n";
        assert_names(doc, "loadBalancer.pools[1].name");
    }

    #[test]
    fn pool_without_addresses_is_named() {
        assert_names("loadBalancer:\n  pools:\n    - name: empty\n", "loadBalancer.pools[0] (empty)");
    }

    #[test]
    fn malformed_cidr_is_named_with_its_value() {
        let m = assert_names(
            "loadBalancer:\n  pools:\n    - {name: a, cidrs: [10.0.0.0/33]}\n",
            "loadBalancer.pools[0].cidrs[0]",
        );
        assert!(m.contains("10.0.0.0/33"), "{m}");
    }

    #[test]
    fn cidr_with_host_bits_is_named_with_the_fix() {
        let m = assert_names(
            "loadBalancer:\n  pools:\n    - {name: a, cidrs: [10.0.0.7/24]}\n",
            "loadBalancer.pools[0].cidrs[0]",
        );
        assert!(m.contains("10.0.0.0/24"), "{m}");
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
        let m = assert_names(doc, "loadBalancer.pools[1].ranges[0]");
        assert!(m.contains("loadBalancer.pools[0].cidrs[0] (pool a)"), "{m}");
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
        assert_names(&format!("{base}        matchLabel: {{a: b}}\n"), "unknown field `matchLabel`");
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
            ("interval: 5s", "missing field `port`"),
        ];
        for (body, field) in cases {
            assert_names(&format!("lifecycle:\n  probe:\n    {body}\n"), field);
        }
    }

    #[test]
    fn delete_absent_nodes_must_be_a_boolean() {
        assert_names("lifecycle:\n  deleteAbsentNodes: maybe\n", "lifecycle.deleteAbsentNodes");
    }

    #[test]
    fn retry_after_errors_are_named() {
        assert_names(&format!("{POOL}  retryAfter: soon\n"), "loadBalancer.retryAfter");
        assert_names(&format!("{POOL}  retryAfter: 0s\n"), "loadBalancer.retryAfter");
    }

    #[test]
    fn wrong_shapes_are_named() {
        assert_names("instances: {a: 1}\n", "instances: invalid type");
        assert_names("- a\n", "invalid type: sequence");
        assert_names("instances: []\n---\ninstances: []\n", "more than one document");
        assert_names(
            "lifecycle:\n  deleteAbsentNodes: true\n  deleteAbsentNodes: false\n",
            "duplicate field `deleteAbsentNodes`",
        );
    }

    #[test]
    fn long_values_are_cut_in_messages() {
        let long = "x".repeat(500);
        let m = err(&format!("{long}\n"));
        assert!(m.len() < 200, "{m}");
        assert!(m.contains('…'), "{m}");
    }

    #[test]
    fn durations_accept_the_usual_units() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
        assert!(parse_duration("10").is_err());
        assert!(parse_duration("s").is_err());
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
}
