//! The aws cloud-config: upstream cloud-provider-aws's INI file, read the way upstream's parser
//! (gcfg) reads it, so an upstream `cloud.conf` starts here unchanged.
//!
//! Section and key names are case-insensitive (`-` counts as `_`). Booleans take `true`, `yes`,
//! `on`, `1` and their opposites in any case, and a bare key means true; integers are decimal or
//! `0x` hexadecimal. Sections and keys upstream does not know are ignored, as there, but with a
//! warning naming them (upstream ignores them silently). Messages name the section and key and
//! never quote a value: a cloud-config may hold account IDs and ARNs that do not belong in status
//! or logs.

use std::collections::BTreeMap;
use std::fmt;

/// The largest cloud-config accepted, checked before parsing.
pub const MAX_CONFIG_BYTES: usize = 1024 * 1024;

/// Why a cloud-config was rejected: where, and what is wrong (never the value itself).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(String);

impl ConfigError {
    fn at(line: usize, message: impl fmt::Display) -> Self {
        ConfigError(format!("line {line}: {message}"))
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

/// The clients an endpoint override can point elsewhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// EC2 (upstream's service ID `EC2`).
    Ec2,
    /// Classic Elastic Load Balancing (`Elastic Load Balancing`).
    Elb,
    /// Elastic Load Balancing v2 (`Elastic Load Balancing v2`).
    Elbv2,
    /// STS, for `RoleARN` (ours: upstream has no STS override).
    Sts,
    /// The instance metadata service (`ec2imds`; no region).
    Imds,
}

impl Endpoint {
    /// Whether an override's `Service` value names this client: upstream's SDK service IDs
    /// (exact case), and our lower-case aliases (`elasticloadbalancing` names both load-balancer
    /// APIs, which share their endpoint in AWS).
    pub fn named_by(self, service: &str) -> bool {
        let upstream = match self {
            Self::Ec2 => service == "EC2",
            Self::Elb => service == "Elastic Load Balancing",
            Self::Elbv2 => service == "Elastic Load Balancing v2",
            Self::Sts => false,
            Self::Imds => service == "ec2imds",
        };
        let alias = match self {
            Self::Ec2 => service.eq_ignore_ascii_case("ec2"),
            Self::Elb => service.eq_ignore_ascii_case("elasticloadbalancing"),
            Self::Elbv2 => {
                service.eq_ignore_ascii_case("elasticloadbalancing") || service.eq_ignore_ascii_case("elbv2")
            }
            Self::Sts => service.eq_ignore_ascii_case("sts"),
            Self::Imds => false,
        };
        upstream || alias
    }

    const ALL: [Endpoint; 5] = [Self::Ec2, Self::Elb, Self::Elbv2, Self::Sts, Self::Imds];
}

/// Upstream service IDs that are accepted and have no use here.
const INERT_SERVICES: &[&str] = &["KMS"];

/// An endpoint override (`[ServiceOverride "N"]`): where to send one service's calls.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServiceOverride {
    /// The service: an upstream SDK service ID (`EC2`, `Elastic Load Balancing`, `Elastic Load
    /// Balancing v2`, `KMS`, `ec2imds`) or one of our aliases (`ec2`, `elasticloadbalancing`,
    /// `elbv2`, `sts`).
    pub service: String,
    /// The region the override applies to; empty applies it to every region (ours).
    pub region: String,
    /// The endpoint URL.
    pub url: String,
    /// The region to sign requests for, when it differs from `region`.
    pub signing_region: String,
    /// `SigningMethod`: read, unused (as upstream).
    pub signing_method: String,
    /// The service name to sign requests for, when it differs from the SDK's.
    pub signing_name: String,
}

/// `ClusterServiceLoadBalancerHealthProbeMode`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ProbeMode {
    /// `ServiceNodePort` or empty (upstream's default): each target's traffic port.
    #[default]
    ServiceNodePort,
    /// `Shared`: kube-proxy's health port for `externalTrafficPolicy: Cluster` Services.
    Shared,
    /// Any other value: an error at each NLB sync, as upstream (Classic ELBs take the default).
    Unsupported,
}

/// `ClusterServiceLoadBalancerHealthProbeMode` and the `ClusterServiceShared…` keys.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterProbe {
    /// The mode.
    pub mode: ProbeMode,
    /// `ClusterServiceSharedLoadBalancerHealthProbePort`; 0 means 10256.
    pub port: i32,
    /// `ClusterServiceSharedLoadBalancerHealthProbePath`; empty means `/healthz`.
    pub path: String,
}

impl ClusterProbe {
    /// The shared probe's port (10256 unless configured).
    pub fn shared_port(&self) -> i32 {
        if self.port == 0 { 10256 } else { self.port }
    }

    /// The shared probe's path (`/healthz` unless configured).
    pub fn shared_path(&self) -> &str {
        if self.path.is_empty() { "/healthz" } else { &self.path }
    }
}

/// The cloud-config's settings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AwsConfig {
    /// `Zone`: its region is the region used, ahead of `Region` (as upstream).
    pub zone: String,
    /// `Region`: the region when no `Zone` is given.
    pub region: String,
    /// `VPC`: the cluster's VPC.
    pub vpc: String,
    /// `SubnetID`: the load-balancer subnet used when none is discovered.
    pub subnet_id: String,
    /// `RouteTableID`: the route table for pod routes (otherwise the cluster-tagged one).
    pub route_table_id: String,
    /// `KubernetesClusterID`: the cluster ID of the ownership tags.
    pub cluster_id: String,
    /// `KubernetesClusterTag`: the legacy cluster ID; resources are then also tagged
    /// `KubernetesCluster=<id>`, as upstream.
    pub cluster_tag: String,
    /// `RoleARN`: a role to assume for every call.
    pub role_arn: String,
    /// `SourceARN`: sent as `x-amz-source-arn` when the role is assumed.
    pub source_arn: String,
    /// `DisableSecurityGroupIngress`: leave the instances' security groups alone.
    pub disable_security_group_ingress: bool,
    /// `ElbSecurityGroup`: the Classic ELBs' security group instead of a `k8s-elb-*` one per
    /// load balancer; never changed here.
    pub elb_security_group: String,
    /// `ZoneIDAsZone` (ours): the zone ID (`use1-az6`) as `topology.kubernetes.io/zone`.
    pub zone_id_as_zone: bool,
    /// `NodeIPFamilies` (`ipv4`, `ipv6`; the key repeated, as upstream), in order.
    pub node_ip_families: Vec<String>,
    /// The health check of `externalTrafficPolicy: Cluster` Services.
    pub cluster_probe: ClusterProbe,
    /// `NLBSecurityGroupMode` as written: `Managed` gives new NLBs a security group of their
    /// own; another value is an error when an NLB is made, as upstream.
    pub nlb_security_group_mode: String,
    /// `SupportedTopologyInstanceTypePattern`: the instance types that must have a network
    /// topology (their Nodes wait for it); upstream's default pattern without the key.
    pub topology_types: crate::topology::TopologyTypes,
    /// Endpoint overrides, by section name.
    pub overrides: BTreeMap<String, ServiceOverride>,
    /// What the parser ignored (unknown sections and keys), one line each, naming them.
    pub warnings: Vec<String>,
}

impl AwsConfig {
    /// The region to use: the region of `Zone` (upstream lets the zone win), else `Region`.
    /// Empty when neither is set (the SDK's chain, environment or metadata, decides).
    pub fn effective_region(&self) -> String {
        if !self.zone.is_empty() {
            return region_of_zone(&self.zone).unwrap_or_default();
        }
        self.region.clone()
    }

    /// The override of `client` for `region`: one for that region first, then one without a
    /// region. The metadata service's applies whatever the region, as upstream.
    pub fn endpoint(&self, client: Endpoint, region: &str) -> Option<&ServiceOverride> {
        let named = |o: &&ServiceOverride| client.named_by(&o.service);
        if client == Endpoint::Imds {
            return self.overrides.values().find(named);
        }
        self.overrides
            .values()
            .filter(named)
            .find(|o| o.region == region)
            .or_else(|| self.overrides.values().filter(named).find(|o| o.region.is_empty()))
    }

    /// Whether new NLBs get a managed security group; an error for a mode other than `Managed`
    /// (only raised where upstream raises it: when an NLB is made).
    pub fn managed_nlb_security_groups(&self) -> Result<bool, ConfigError> {
        match self.nlb_security_group_mode.as_str() {
            "" => Ok(false),
            "Managed" => Ok(true),
            _ => Err(ConfigError(
                "invalid NLB security group mode [Global] NLBSecurityGroupMode; expected Managed".into(),
            )),
        }
    }

    /// The cluster ID the config names (`KubernetesClusterTag` wins, as upstream, and marks the
    /// legacy tags), or `None` when it names none and the ID must be read from the manager's
    /// own instance.
    pub fn configured_cluster(&self) -> Option<crate::cluster::ClusterIdentity> {
        if !self.cluster_tag.is_empty() {
            return Some(crate::cluster::ClusterIdentity { id: self.cluster_tag.clone(), legacy: true });
        }
        (!self.cluster_id.is_empty())
            .then(|| crate::cluster::ClusterIdentity { id: self.cluster_id.clone(), legacy: false })
    }
}

/// The region of an availability zone as upstream derives it (the leading `letters-…-digits`):
/// `us-east-1a` → `us-east-1`, `us-gov-west-1b` → `us-gov-west-1`, local zones such as
/// `us-west-2-lax-1a` → `us-west-2`.
pub fn region_of_zone(zone: &str) -> Option<String> {
    let b = zone.as_bytes();
    let mut i = 0;
    let mut groups = 0;
    // One or more `letters-` groups.
    loop {
        let start = i;
        while i < b.len() && b[i].is_ascii_alphabetic() {
            i += 1;
        }
        if i > start && i < b.len() && b[i] == b'-' {
            i += 1;
            groups += 1;
        } else {
            i = start;
            break;
        }
    }
    let digits = i;
    while i < b.len() && b[i].is_ascii_digit() {
        i += 1;
    }
    (groups > 0 && i > digits).then(|| zone[..i].to_string())
}

/// The kinds of value a key takes.
enum Kind {
    Str,
    Bool,
    Int,
}

/// The `[Global]` keys upstream reads, and the kind of each (by lower-case name).
fn global_kind(name: &str) -> Option<Kind> {
    Some(match name {
        "zone"
        | "region"
        | "vpc"
        | "subnetid"
        | "routetableid"
        | "rolearn"
        | "sourcearn"
        | "kubernetesclustertag"
        | "kubernetesclusterid"
        | "elbsecuritygroup"
        | "nodeipfamilies"
        | "clusterserviceloadbalancerhealthprobemode"
        | "clusterservicesharedloadbalancerhealthprobepath"
        | "supportedtopologyinstancetypepattern"
        | "nlbsecuritygroupmode" => Kind::Str,
        "disablesecuritygroupingress" | "zoneidaszone" => Kind::Bool,
        "clusterservicesharedloadbalancerhealthprobeport" => Kind::Int,
        _ => return None,
    })
}

/// gcfg's booleans (any case).
fn parse_bool(value: &str) -> Option<bool> {
    match value.to_ascii_lowercase().as_str() {
        "true" | "yes" | "on" | "1" => Some(true),
        "false" | "no" | "off" | "0" => Some(false),
        _ => None,
    }
}

/// gcfg's int32: decimal, or hexadecimal with `0x`.
fn parse_int(value: &str) -> Option<i32> {
    let v = value.trim();
    let (neg, digits) = match v.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, v.strip_prefix('+').unwrap_or(v)),
    };
    let n = match digits.strip_prefix("0x").or_else(|| digits.strip_prefix("0X")) {
        Some(hex) => i64::from_str_radix(hex, 16).ok()?,
        None => digits.parse::<i64>().ok()?,
    };
    i32::try_from(if neg { -n } else { n }).ok()
}

/// A name as gcfg matches it: any case, `-` as `_`.
fn fold(name: &str) -> String {
    name.to_ascii_lowercase().replace('-', "_")
}

/// Parse an INI cloud-config (at most [`MAX_CONFIG_BYTES`]).
pub fn parse(bytes: &[u8]) -> Result<AwsConfig, ConfigError> {
    if bytes.len() > MAX_CONFIG_BYTES {
        return Err(ConfigError(format!(
            "the cloud-config is {} bytes; at most {MAX_CONFIG_BYTES} are accepted",
            bytes.len()
        )));
    }
    let text =
        std::str::from_utf8(bytes).map_err(|e| ConfigError(format!("not UTF-8 (at byte {})", e.valid_up_to())))?;
    let mut config = AwsConfig::default();
    let mut section: Option<Section> = None;
    for (index, raw) in text.lines().enumerate() {
        let line_no = index + 1;
        let line = raw.trim();
        if line.is_empty() || line.starts_with(';') || line.starts_with('#') {
            continue;
        }
        if line.starts_with('[') {
            let (name, sub) = parse_header(line).ok_or_else(|| ConfigError::at(line_no, "malformed section header"))?;
            section = Some(match (fold(&name).as_str(), sub) {
                ("global", None) => Section::Global,
                ("global", Some(_)) => {
                    config
                        .warnings
                        .push(format!("line {line_no}: [Global] takes no subsection; the section is ignored"));
                    Section::Ignored
                }
                ("serviceoverride", Some(sub)) => {
                    if sub.is_empty() || sub.len() > 64 {
                        return Err(ConfigError::at(
                            line_no,
                            "[ServiceOverride] needs a short name, as in [ServiceOverride \"1\"]",
                        ));
                    }
                    config.overrides.entry(sub.clone()).or_default();
                    Section::Override(sub)
                }
                ("serviceoverride", None) => {
                    return Err(ConfigError::at(
                        line_no,
                        "[ServiceOverride] needs a name, as in [ServiceOverride \"1\"]",
                    ));
                }
                _ => {
                    config.warnings.push(format!("line {line_no}: an unknown section is ignored{NOT_QUOTED}"));
                    Section::Ignored
                }
            });
            continue;
        }
        let (key, value) = match line.split_once('=') {
            Some((k, v)) => (k.trim(), Some(parse_value(v).map_err(|why| ConfigError::at(line_no, why))?)),
            None => (line, None),
        };
        if key.is_empty() || !key.starts_with(|c: char| c.is_ascii_alphabetic()) {
            return Err(ConfigError::at(line_no, "expected `Key = value`"));
        }
        let Some(current) = &section else {
            return Err(ConfigError::at(line_no, "a key is outside any section"));
        };
        let name = fold(key);
        match current {
            Section::Ignored => {}
            Section::Global => global(&mut config, line_no, key, &name, value)?,
            Section::Override(sub) => {
                let entry = config.overrides.entry(sub.clone()).or_default();
                let field = match name.as_str() {
                    "service" => &mut entry.service,
                    "region" => &mut entry.region,
                    "url" => &mut entry.url,
                    "signingregion" => &mut entry.signing_region,
                    "signingmethod" => &mut entry.signing_method,
                    "signingname" => &mut entry.signing_name,
                    _ => {
                        config
                            .warnings
                            .push(format!("line {line_no}: [ServiceOverride] an unknown key is ignored{NOT_QUOTED}"));
                        continue;
                    }
                };
                *field = value
                    .ok_or_else(|| ConfigError::at(line_no, format!("[ServiceOverride] {key}: a value is required")))?;
            }
        }
    }
    validate(&mut config)?;
    Ok(config)
}

/// A user's name in a warning, cut short.
/// Why a warning gives a line number and no name: an unknown name is the file's own text (a
/// value written without `=` reads as a key), which stays out of logs.
const NOT_QUOTED: &str = " (its name is not repeated: the cloud-config's text stays out of logs)";

/// One `[Global]` line: `value` is `None` for a bare key.
fn global(
    config: &mut AwsConfig,
    line_no: usize,
    key: &str,
    name: &str,
    value: Option<String>,
) -> Result<(), ConfigError> {
    let Some(kind) = global_kind(name) else {
        config.warnings.push(format!("line {line_no}: [Global] an unknown key is ignored{NOT_QUOTED}"));
        return Ok(());
    };
    let at = |what: &str| ConfigError::at(line_no, format!("[Global] {key}: {what}"));
    match kind {
        Kind::Bool => {
            // A bare key is true, an empty value an error (gcfg).
            let b = match value {
                None => true,
                Some(v) => parse_bool(&v).ok_or_else(|| at("not a boolean (true or false)"))?,
            };
            match name {
                "disablesecuritygroupingress" => config.disable_security_group_ingress = b,
                _ => config.zone_id_as_zone = b,
            }
        }
        Kind::Int => {
            let v = value.ok_or_else(|| at("a value is required"))?;
            config.cluster_probe.port = parse_int(&v).ok_or_else(|| at("not an integer"))?;
        }
        Kind::Str if name == "nodeipfamilies" => match value {
            // A bare key empties the list (gcfg's multi-valued variables).
            None => config.node_ip_families.clear(),
            Some(v) => {
                for f in v.split(',').map(|f| f.trim().to_ascii_lowercase()).filter(|f| !f.is_empty()) {
                    if (f == "ipv4" || f == "ipv6") && !config.node_ip_families.contains(&f) {
                        config.node_ip_families.push(f);
                    } else {
                        config.warnings.push(format!(
                            "line {line_no}: [Global] NodeIPFamilies: a value other than ipv4 or ipv6, or one repeated, is ignored"
                        ));
                    }
                }
            }
        },
        Kind::Str => {
            let v = value.ok_or_else(|| at("a value is required"))?;
            let field = match name {
                "zone" => &mut config.zone,
                "region" => &mut config.region,
                "vpc" => &mut config.vpc,
                "subnetid" => &mut config.subnet_id,
                "routetableid" => &mut config.route_table_id,
                "rolearn" => &mut config.role_arn,
                "sourcearn" => &mut config.source_arn,
                "kubernetesclustertag" => &mut config.cluster_tag,
                "kubernetesclusterid" => &mut config.cluster_id,
                "elbsecuritygroup" => &mut config.elb_security_group,
                "clusterservicesharedloadbalancerhealthprobepath" => &mut config.cluster_probe.path,
                "nlbsecuritygroupmode" => &mut config.nlb_security_group_mode,
                "clusterserviceloadbalancerhealthprobemode" => {
                    config.cluster_probe.mode = match v.as_str() {
                        "" | "ServiceNodePort" => ProbeMode::ServiceNodePort,
                        "Shared" => ProbeMode::Shared,
                        _ => ProbeMode::Unsupported,
                    };
                    return Ok(());
                }
                _ => {
                    config.topology_types = crate::topology::TopologyTypes::parse(&v).map_err(at)?;
                    return Ok(());
                }
            };
            *field = v;
        }
    }
    Ok(())
}

fn validate(config: &mut AwsConfig) -> Result<(), ConfigError> {
    // Upstream's pattern, in AWS's lower case (a zone in capitals names no region).
    let lower = config.zone.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if !config.zone.is_empty() && (region_of_zone(&config.zone).is_none() || !lower) {
        return Err(ConfigError("[Global] Zone: not an availability zone name (like us-east-1a)".into()));
    }
    for (key, value, prefix) in [
        ("VPC", &config.vpc, "vpc-"),
        ("SubnetID", &config.subnet_id, "subnet-"),
        ("RouteTableID", &config.route_table_id, "rtb-"),
        ("ElbSecurityGroup", &config.elb_security_group, "sg-"),
    ] {
        if !value.is_empty() && !value.starts_with(prefix) {
            return Err(ConfigError(format!("[Global] {key}: expected an ID starting with {prefix:?}")));
        }
    }
    if !config.role_arn.is_empty() && role_account(&config.role_arn).is_none() {
        return Err(ConfigError(
            "[Global] RoleARN: expected an ARN (arn:<partition>:iam::<account>:role/<name>)".into(),
        ));
    }
    for (key, id) in [("KubernetesClusterID", &config.cluster_id), ("KubernetesClusterTag", &config.cluster_tag)] {
        if !id.is_empty() && !id.chars().all(|c| c.is_ascii_graphic()) {
            return Err(ConfigError(format!("[Global] {key}: must be printable ASCII without spaces")));
        }
    }
    if !config.cluster_tag.is_empty() && !config.cluster_id.is_empty() && config.cluster_tag != config.cluster_id {
        return Err(ConfigError(
            "[Global] KubernetesClusterID and KubernetesClusterTag name different clusters".into(),
        ));
    }
    let mut seen = std::collections::BTreeSet::new();
    let mut warnings = Vec::new();
    for (i, o) in config.overrides.values_mut().enumerate() {
        // Numbered, not named: the name is the user's text.
        let at = format!("[ServiceOverride] #{}", i + 1);
        o.service = o.service.trim().to_string();
        o.region = o.region.trim().to_string();
        if o.service.is_empty() {
            return Err(ConfigError(format!("{at} Service: required")));
        }
        if o.url.trim().is_empty() {
            return Err(ConfigError(format!("{at} URL: required")));
        }
        let url = o.url.trim();
        if !(url.starts_with("https://") || url.starts_with("http://")) {
            return Err(ConfigError(format!("{at} URL: expected an http:// or https:// URL")));
        }
        o.url = url.to_string();
        if !seen.insert((o.service.clone(), o.region.clone())) {
            return Err(ConfigError(format!("{at}: a second override of the same Service and Region")));
        }
        if !Endpoint::ALL.iter().any(|e| e.named_by(&o.service)) && !INERT_SERVICES.contains(&o.service.as_str()) {
            warnings.push(format!(
                "{at} Service: no client of this provider has that service ID; the override has no effect"
            ));
        }
    }
    config.warnings.extend(warnings);
    Ok(())
}

/// The account of a role ARN (`arn:<partition>:iam::<account>:role/...`): the
/// `x-amz-source-account` header upstream sends when assuming it.
pub fn role_account(arn: &str) -> Option<&str> {
    let parts: Vec<&str> = arn.splitn(6, ':').collect();
    match parts.as_slice() {
        ["arn", partition, service, _region, account, resource]
            if !partition.is_empty() && !service.is_empty() && !resource.is_empty() && !account.is_empty() =>
        {
            Some(account)
        }
        _ => None,
    }
}

enum Section {
    Global,
    Override(String),
    /// A section upstream ignores: its keys are skipped.
    Ignored,
}

/// `[Name]` or `[Name "sub"]` (the subsection with gcfg's `\"` and `\\` escapes).
fn parse_header(line: &str) -> Option<(String, Option<String>)> {
    let inner = line.strip_prefix('[')?.strip_suffix(']')?.trim();
    match inner.split_once(char::is_whitespace) {
        None => Some((inner.to_string(), None)),
        Some((name, rest)) => {
            let quoted = rest.trim().strip_prefix('"')?.strip_suffix('"')?;
            let mut sub = String::new();
            let mut chars = quoted.chars();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => sub.push(chars.next()?),
                    '"' => return None,
                    c => sub.push(c),
                }
            }
            Some((name.to_string(), Some(sub)))
        }
    }
}

/// A value as gcfg reads it: quoted parts with `\\ \" \n \t` escapes, a comment (`;` or `#`)
/// outside quotes ends it, surrounding blanks outside quotes are dropped.
fn parse_value(raw: &str) -> Result<String, &'static str> {
    let mut out = String::new();
    let mut quoted = false;
    // Length of `out` up to its last character that was quoted or not blank.
    let mut keep = 0;
    let mut chars = raw.trim_start().chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                quoted = !quoted;
                keep = out.len();
            }
            '\\' => {
                let e = chars.next().ok_or("a value ends with a lone backslash")?;
                out.push(match e {
                    'n' => '\n',
                    't' => '\t',
                    '\\' | '"' => e,
                    _ => return Err("unknown escape in a value (use \\\\, \\\", \\n or \\t)"),
                });
                keep = out.len();
            }
            ';' | '#' if !quoted => break,
            c => {
                out.push(c);
                if quoted || !c.is_whitespace() {
                    keep = out.len();
                }
            }
        }
    }
    if quoted {
        return Err("a quoted value is not closed");
    }
    out.truncate(keep);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const FULL: &str = r#"
; upstream-style config
[Global]
Zone = us-east-1a
Region = eu-west-1
VPC = vpc-0abc
SubnetID = subnet-0123
KubernetesClusterID = prod
RoleARN = arn:aws:iam::123456789012:role/ccm
SourceARN = arn:aws:eks:us-east-1:123456789012:cluster/prod
DisableSecurityGroupIngress = true
ElbSecurityGroup = sg-0lb
NodeIPFamilies = ipv4

[ServiceOverride "1"]
Service = EC2
Region = us-east-1
URL = http://127.0.0.1:5000
SigningRegion = us-east-1
SigningName = ec2

[serviceoverride "2"]
service = Elastic Load Balancing v2
Region = us-east-1
url = "http://127.0.0.1:5001"
SigningRegion = us-east-1

[ServiceOverride "3"]
Service = Elastic Load Balancing
Region = us-east-1
URL = http://127.0.0.1:5002
SigningRegion = us-east-1

[ServiceOverride "4"]
Service = KMS
Region = us-east-1
URL = http://127.0.0.1:5003
SigningRegion = us-east-1
"#;

    #[test]
    fn an_upstream_cloud_conf_parses_with_upstreams_service_ids_and_the_zone_winning() {
        let c = parse(FULL.as_bytes()).unwrap();
        assert_eq!(c.effective_region(), "us-east-1", "Zone wins over Region, as upstream");
        assert_eq!(c.vpc, "vpc-0abc");
        assert_eq!(c.subnet_id, "subnet-0123");
        assert_eq!(c.configured_cluster().unwrap().id, "prod");
        assert_eq!(c.source_arn, "arn:aws:eks:us-east-1:123456789012:cluster/prod");
        assert!(c.disable_security_group_ingress);
        assert_eq!(c.elb_security_group, "sg-0lb");
        assert_eq!(c.endpoint(Endpoint::Ec2, "us-east-1").unwrap().url, "http://127.0.0.1:5000");
        assert_eq!(c.endpoint(Endpoint::Ec2, "us-east-1").unwrap().signing_name, "ec2");
        assert_eq!(c.endpoint(Endpoint::Elbv2, "us-east-1").unwrap().url, "http://127.0.0.1:5001");
        assert_eq!(c.endpoint(Endpoint::Elb, "us-east-1").unwrap().url, "http://127.0.0.1:5002");
        assert!(c.endpoint(Endpoint::Ec2, "eu-west-1").is_none(), "a regional override applies to its region only");
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    }

    #[test]
    fn region_is_used_without_a_zone() {
        assert_eq!(parse(b"[Global]\nRegion = eu-west-1\n").unwrap().effective_region(), "eu-west-1");
    }

    #[test]
    fn unknown_sections_keys_and_services_are_warnings_by_line_never_quoting_them_not_errors() {
        let c = parse(
            b"[Global]\nZone = us-east-1a\nDisableStrictZoneCheck = true\nSomeFutureKey = x\n[Global \"sub\"]\nVPC = nope\n[Extra]\nA = b\n[ServiceOverride \"1\"]\nService = s3\nRegion = us-east-1\nURL = http://h\nSigningRegion = us-east-1\nColour = red\n[Global]\nAKIASECRETWRITTENASAKEY\n",
        )
        .unwrap();
        let all = c.warnings.join("\n");
        for expected in [
            "line 3: [Global] an unknown key is ignored",
            "line 4: [Global] an unknown key is ignored",
            "[Global] takes no subsection",
            "line 7: an unknown section is ignored",
            "line 14: [ServiceOverride] an unknown key is ignored",
            "line 16: [Global] an unknown key is ignored",
            "no effect",
        ] {
            assert!(all.contains(expected), "{expected}: {all}");
        }
        for text in ["SomeFutureKey", "Extra", "Colour", "AKIASECRET"] {
            assert!(!all.contains(text), "{text} quoted: {all}");
        }
        assert!(c.vpc.is_empty(), "a [Global \"sub\"] section is ignored");
    }

    #[test]
    fn legacy_cluster_tag_is_the_id_and_marks_legacy_tags_and_a_mismatch_is_refused() {
        let c = parse(b"[Global]\nKubernetesClusterTag = old\n").unwrap();
        let id = c.configured_cluster().unwrap();
        assert_eq!((id.id.as_str(), id.legacy), ("old", true));
        let c = parse(b"[Global]\nKubernetesClusterTag = same\nKubernetesClusterID = same\n").unwrap();
        assert!(c.configured_cluster().unwrap().legacy);
        let e = parse(b"[Global]\nKubernetesClusterTag = a\nKubernetesClusterID = b\n").unwrap_err().to_string();
        assert!(e.contains("KubernetesClusterTag") && !e.contains(" a ") && !e.contains(" b"), "{e}");
        assert!(parse(b"[Global]\n").unwrap().configured_cluster().is_none());
    }

    #[test]
    fn nlb_security_group_mode_is_checked_only_when_asked() {
        assert!(parse(b"[Global]\nNLBSecurityGroupMode = Managed\n").unwrap().managed_nlb_security_groups().unwrap());
        assert!(!parse(b"[Global]\n").unwrap().managed_nlb_security_groups().unwrap());
        let odd = parse(b"[Global]\nNLBSecurityGroupMode = managed-ish\n").unwrap();
        let e = odd.managed_nlb_security_groups().unwrap_err().to_string();
        assert!(e.contains("NLBSecurityGroupMode") && !e.contains("managed-ish"), "{e}");
    }

    #[test]
    fn supported_topology_instance_type_pattern_is_read_and_a_bad_one_refused_by_key() {
        use crate::topology::TopologyTypes;
        let c = parse(b"[Global]\nSupportedTopologyInstanceTypePattern = ^(g6|p5)\\\\.\n").unwrap();
        assert!(c.topology_types.requires("g6.xlarge") && !c.topology_types.requires("trn1.2xlarge"));
        assert_eq!(parse(b"[Global]\n").unwrap().topology_types, TopologyTypes::Upstream);
        let e = parse(b"[Global]\nSupportedTopologyInstanceTypePattern = (p5\n").unwrap_err().to_string();
        assert!(
            e.contains("SupportedTopologyInstanceTypePattern") && e.contains("line 2") && !e.contains("(p5"),
            "{e}"
        );
    }

    #[test]
    fn health_probe_mode_defaults_to_service_node_port_and_shared_keys_default_when_zero_or_empty() {
        let c = parse(b"[Global]\n").unwrap();
        assert_eq!(c.cluster_probe.mode, ProbeMode::ServiceNodePort, "upstream's default");
        let c = parse(b"[Global]\nClusterServiceLoadBalancerHealthProbeMode = \nClusterServiceSharedLoadBalancerHealthProbePort = 0\nClusterServiceSharedLoadBalancerHealthProbePath =\n").unwrap();
        assert_eq!(c.cluster_probe.mode, ProbeMode::ServiceNodePort);
        assert_eq!((c.cluster_probe.shared_port(), c.cluster_probe.shared_path()), (10256, "/healthz"));
        let c = parse(b"[Global]\nClusterServiceLoadBalancerHealthProbeMode = Shared\nClusterServiceSharedLoadBalancerHealthProbePort = 0x2AF8\nClusterServiceSharedLoadBalancerHealthProbePath = /livez\n").unwrap();
        assert_eq!(c.cluster_probe.mode, ProbeMode::Shared);
        assert_eq!((c.cluster_probe.shared_port(), c.cluster_probe.shared_path()), (11000, "/livez"));
        let c = parse(b"[Global]\nClusterServiceLoadBalancerHealthProbeMode = Sometimes\n").unwrap();
        assert_eq!(
            c.cluster_probe.mode,
            ProbeMode::Unsupported,
            "an error at each NLB sync, as upstream, not at start"
        );
        let e = parse(b"[Global]\nClusterServiceSharedLoadBalancerHealthProbePort = ten\n").unwrap_err().to_string();
        assert!(e.contains("ClusterServiceSharedLoadBalancerHealthProbePort"), "{e}");
    }

    #[test]
    fn booleans_and_integers_parse_as_gcfg() {
        for (text, want) in [
            ("true", true),
            ("YES", true),
            ("on", true),
            ("1", true),
            ("False", false),
            ("no", false),
            ("OFF", false),
            ("0", false),
        ] {
            let c = parse(format!("[Global]\nDisableSecurityGroupIngress = {text}\n").as_bytes()).unwrap();
            assert_eq!(c.disable_security_group_ingress, want, "{text}");
        }
        assert!(
            parse(b"[Global]\nDisableSecurityGroupIngress\n").unwrap().disable_security_group_ingress,
            "a bare key is true"
        );
        assert!(parse(b"[Global]\nDisableSecurityGroupIngress =\n").is_err(), "an empty boolean is an error");
        assert!(parse(b"[Global]\nVPC\n").is_err(), "a bare string key is an error");
        assert_eq!(parse_int("010"), Some(10));
        assert_eq!(parse_int("0x10"), Some(16));
        assert_eq!(parse_int("-5"), Some(-5));
        assert_eq!(parse_int("1e3"), None);
    }

    #[test]
    fn names_fold_case_and_dashes_and_values_take_quotes_escapes_and_comments() {
        let c =
            parse(b"[GLOBAL]\nkubernetesclusterid = \"pr\\\"od\" ; comment\nzone = us-east-1a # comment\n").unwrap();
        assert_eq!(c.cluster_id, "pr\"od");
        assert_eq!(c.zone, "us-east-1a");
        assert_eq!(parse_value(" \"a ; b\" c ").unwrap(), "a ; b c");
        assert!(parse_value("\"open").is_err());
    }

    #[test]
    fn node_ip_families_are_read_in_order_and_odd_values_warned_and_ignored() {
        let c = parse(b"[Global]\nNodeIPFamilies = ipv6\nNodeIPFamilies = ipv4\n").unwrap();
        assert_eq!(c.node_ip_families, vec!["ipv6".to_string(), "ipv4".to_string()]);
        let c = parse(b"[Global]\nNodeIPFamilies = ipx\nNodeIPFamilies = ipv4\nNodeIPFamilies = ipv4\n").unwrap();
        assert_eq!(c.node_ip_families, vec!["ipv4".to_string()]);
        assert_eq!(c.warnings.len(), 2, "{:?}", c.warnings);
        let c = parse(b"[Global]\nNodeIPFamilies = ipv4\nNodeIPFamilies\nNodeIPFamilies = ipv6\n").unwrap();
        assert_eq!(c.node_ip_families, vec!["ipv6".to_string()], "a bare key empties the list");
    }

    #[test]
    fn zone_id_as_zone_is_a_boolean() {
        assert!(parse(b"[Global]\nZoneIDAsZone = true\n").unwrap().zone_id_as_zone);
        assert!(parse(b"[Global]\nZoneIDAsZone = maybe\n").unwrap_err().to_string().contains("ZoneIDAsZone"));
    }

    #[test]
    fn empty_config_is_valid() {
        assert_eq!(parse(b"").unwrap(), AwsConfig::default());
    }

    #[test]
    fn overrides_need_service_and_url_and_a_repeat_is_refused() {
        let dup = b"[ServiceOverride \"1\"]\nService = EC2\nRegion = r\nURL = http://a\n[ServiceOverride \"2\"]\nService = EC2\nRegion = r\nURL = http://b\n";
        assert!(parse(dup).unwrap_err().to_string().contains("second override"));
        let c = parse(b"[ServiceOverride \"1\"]\nService = sts\nURL = http://a\n[ServiceOverride \"2\"]\nService = ec2imds\nURL = http://169.254.169.254\n").unwrap();
        assert_eq!(c.endpoint(Endpoint::Sts, "any").unwrap().url, "http://a", "no Region: every region (ours)");
        assert_eq!(c.endpoint(Endpoint::Imds, "").unwrap().url, "http://169.254.169.254");
        assert!(c.endpoint(Endpoint::Ec2, "any").is_none());
    }

    #[test]
    fn errors_name_the_key_and_never_quote_the_value() {
        let secret = "arn-like-secret-value-42";
        for (text, expect) in [
            (format!("[Global]\nDisableSecurityGroupIngress = {secret}\n"), "DisableSecurityGroupIngress"),
            (format!("[Global]\nVPC = {secret}\n"), "VPC"),
            (format!("[Global]\nRoleARN = {secret}\n"), "RoleARN"),
            (format!("[Global]\nZone = 42{secret}\n"), "Zone"),
            ("[Global]\nZone = SECRET-TOKEN-12345\n".to_string(), "Zone"),
            (format!("[ServiceOverride \"{secret}\"]\nURL = http://h\n"), "Service: required"),
            (format!("[ServiceOverride \"x\"]\nService = EC2\nURL = {secret}\n"), "URL"),
            (format!("Zone = {secret}\n"), "outside any section"),
        ] {
            let e = parse(text.as_bytes()).unwrap_err().to_string();
            assert!(e.contains(expect), "{e:?} should name {expect}");
            assert!(!e.contains(secret), "{e:?} quotes the value");
        }
    }

    #[test]
    fn oversized_config_is_rejected_before_parsing() {
        let big = vec![b';'; MAX_CONFIG_BYTES + 1];
        assert!(parse(&big).unwrap_err().to_string().contains("at most"));
    }

    #[test]
    fn region_of_zone_follows_upstreams_pattern() {
        assert_eq!(region_of_zone("us-east-1a").as_deref(), Some("us-east-1"));
        assert_eq!(region_of_zone("us-west-2-lax-1a").as_deref(), Some("us-west-2"));
        assert_eq!(region_of_zone("us-gov-west-1b").as_deref(), Some("us-gov-west-1"));
        assert_eq!(region_of_zone("ap-southeast-2c").as_deref(), Some("ap-southeast-2"));
        assert_eq!(region_of_zone("us-east-1").as_deref(), Some("us-east-1"));
        assert_eq!(region_of_zone("bogus"), None);
        assert_eq!(region_of_zone("1a"), None);
    }

    #[test]
    fn role_account_reads_the_account_of_a_role_arn() {
        assert_eq!(role_account("arn:aws:iam::123456789012:role/ccm"), Some("123456789012"));
        assert_eq!(role_account("arn:aws:iam:::role/ccm"), None);
        assert_eq!(role_account("not-an-arn"), None);
    }
}
