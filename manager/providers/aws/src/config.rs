//! The aws cloud-config: upstream cloud-provider-aws's INI format (`[Global]` and
//! `[ServiceOverride "N"]` sections), so an existing file keeps working.
//!
//! Keys and section names are case-insensitive, as in upstream's parser. Keys that upstream
//! knows but these controllers do not use are accepted and ignored; unknown keys are errors, so
//! a typo never silently changes behaviour. Messages name the section and key and never quote a
//! value: a cloud-config may hold account IDs and ARNs that do not belong in status or logs.

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

/// An endpoint override (`[ServiceOverride "N"]`): where to send one service's calls.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServiceOverride {
    /// The service: `ec2`, `elasticloadbalancing` (ELBv2) or `sts`.
    pub service: String,
    /// The region the override applies to; empty applies it to every region.
    pub region: String,
    /// The endpoint URL.
    pub url: String,
    /// The region to sign requests for, when it differs from `region`.
    pub signing_region: String,
}

/// The settings these controllers use.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AwsConfig {
    /// `Zone`: the zone the cluster runs in; its region is the default region.
    pub zone: String,
    /// `Region` (an extension; upstream derives it from the zone or the metadata service).
    pub region: String,
    /// `VPC`: the VPC of the cluster.
    pub vpc: String,
    /// `SubnetID`: the subnet of the cluster (the default load-balancer subnet).
    pub subnet_id: String,
    /// `RouteTableID`: the route table for pod routes (otherwise cluster-tagged tables).
    pub route_table_id: String,
    /// `KubernetesClusterTag` (legacy) or `KubernetesClusterID`: the cluster's tag value.
    pub cluster_id: String,
    /// `RoleARN`: a role to assume for every call.
    pub role_arn: String,
    /// `DisableSecurityGroupIngress`: leave instance security groups alone.
    pub disable_security_group_ingress: bool,
    /// `ElbSecurityGroup`: a security group to use instead of the instances' own ones for
    /// load-balancer ingress rules.
    pub elb_security_group: String,
    /// `ZoneIDAsZone` (ours): the zone ID (`use1-az6`) as `topology.kubernetes.io/zone`.
    pub zone_id_as_zone: bool,
    /// `NodeIPFamilies` (`ipv4`, `ipv6`; the key repeated, as upstream), in order.
    pub node_ip_families: Vec<String>,
    /// The health check of `externalTrafficPolicy: Cluster` Services.
    pub cluster_probe: ClusterProbe,
    /// `NLBSecurityGroupMode = Managed`: a security group made and removed with each NLB.
    pub nlb_security_group_managed: bool,
    /// `SupportedTopologyInstanceTypePattern`: the instance types that must have a network
    /// topology (their Nodes wait for it); upstream's default pattern without the key.
    pub topology_types: crate::topology::TopologyTypes,
    /// Endpoint overrides, by section name.
    pub overrides: BTreeMap<String, ServiceOverride>,
}

/// `ClusterServiceLoadBalancerHealthProbeMode` and the `ClusterServiceShared…` keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterProbe {
    /// `Shared` (our default): every Service's targets are checked on kube-proxy's health port;
    /// `ServiceNodePort` (upstream's default): a TCP check of each target's own nodePort.
    pub shared: bool,
    /// `ClusterServiceSharedLoadBalancerHealthProbePort` (10256).
    pub port: i32,
    /// `ClusterServiceSharedLoadBalancerHealthProbePath` (`/healthz`).
    pub path: String,
}

impl Default for ClusterProbe {
    fn default() -> Self {
        Self { shared: true, port: 10256, path: "/healthz".into() }
    }
}

impl AwsConfig {
    /// The region to use: `Region`, or the region of `Zone` (the zone without its letter).
    /// Empty when neither is set (the SDK's chain, environment or metadata, decides).
    pub fn effective_region(&self) -> String {
        if !self.region.is_empty() {
            return self.region.clone();
        }
        region_of_zone(&self.zone).unwrap_or_default()
    }

    /// The endpoint URL for `service` in `region`, if overridden.
    pub fn endpoint(&self, service: &str, region: &str) -> Option<&ServiceOverride> {
        let matching = |o: &&ServiceOverride| o.service.eq_ignore_ascii_case(service);
        self.overrides
            .values()
            .filter(matching)
            .find(|o| o.region == region)
            .or_else(|| self.overrides.values().filter(matching).find(|o| o.region.is_empty()))
    }
}

/// The region of an availability zone: `us-east-1a` → `us-east-1`; local zones such as
/// `us-west-2-lax-1a` → `us-west-2`.
pub fn region_of_zone(zone: &str) -> Option<String> {
    let zone = zone.trim();
    if zone.len() < 2 || !zone.ends_with(|c: char| c.is_ascii_lowercase()) {
        return None;
    }
    let parts: Vec<&str> = zone.split('-').collect();
    if parts.len() < 3 {
        return None;
    }
    // The region is the first three dash-separated parts with the zone letter stripped.
    let third = parts[2].trim_end_matches(|c: char| c.is_ascii_lowercase());
    if third.is_empty() || !third.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    Some(format!("{}-{}-{}", parts[0], parts[1], third))
}

/// Keys upstream accepts that these controllers do not use: accepted and ignored.
const IGNORED_GLOBAL_KEYS: &[&str] = &[
    "kubernetesclustertag",
    "disablestrictzonecheck",
    "sourcearn",
    "tagaggregatorrolearn",
    "clusterserviceloadbalancerhealthprobeport",
    "clusterserviceloadbalancerhealthprobepath",
];

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
    let mut legacy_tag = String::new();
    let mut section: Option<Section> = None;
    for (index, raw) in text.lines().enumerate() {
        let line_no = index + 1;
        let line = raw.trim();
        if line.is_empty() || line.starts_with(';') || line.starts_with('#') {
            continue;
        }
        if line.starts_with('[') {
            let header = parse_header(line).ok_or_else(|| ConfigError::at(line_no, "malformed section header"))?;
            section = Some(match header {
                (name, None) if name.eq_ignore_ascii_case("global") => Section::Global,
                (name, Some(sub)) if name.eq_ignore_ascii_case("serviceoverride") => {
                    if sub.is_empty() || sub.len() > 64 {
                        return Err(ConfigError::at(
                            line_no,
                            "[ServiceOverride] needs a short name, as in [ServiceOverride \"1\"]",
                        ));
                    }
                    config.overrides.entry(sub.clone()).or_default();
                    Section::Override(sub)
                }
                (_, _) => {
                    return Err(ConfigError::at(
                        line_no,
                        // The name is the user's text: never quoted.
                        "unknown section; known: [Global], [ServiceOverride \"N\"]",
                    ));
                }
            });
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            return Err(ConfigError::at(line_no, "expected `Key = value`"));
        };
        let key = key.trim();
        let value = unquote(value.trim());
        let Some(current) = &section else {
            return Err(ConfigError::at(line_no, "a key is outside any section"));
        };
        let lower = key.to_ascii_lowercase();
        match current {
            Section::Global => {
                let field = match lower.as_str() {
                    "zone" => &mut config.zone,
                    "region" => &mut config.region,
                    "vpc" => &mut config.vpc,
                    "subnetid" => &mut config.subnet_id,
                    "routetableid" => &mut config.route_table_id,
                    "kubernetesclusterid" => &mut config.cluster_id,
                    "rolearn" => &mut config.role_arn,
                    "elbsecuritygroup" => &mut config.elb_security_group,
                    "disablesecuritygroupingress" => {
                        config.disable_security_group_ingress = parse_bool(&value).ok_or_else(|| {
                            ConfigError::at(
                                line_no,
                                "[Global] DisableSecurityGroupIngress: not a boolean (true or false)",
                            )
                        })?;
                        continue;
                    }
                    "clusterserviceloadbalancerhealthprobemode" => {
                        config.cluster_probe.shared = match value.as_str() {
                            "Shared" | "" => true,
                            "ServiceNodePort" => false,
                            _ => {
                                return Err(ConfigError::at(
                                    line_no,
                                    "[Global] ClusterServiceLoadBalancerHealthProbeMode: expected Shared or ServiceNodePort",
                                ));
                            }
                        };
                        continue;
                    }
                    "clusterservicesharedloadbalancerhealthprobeport" => {
                        config.cluster_probe.port = value.parse().ok().filter(|p| (1..=65535).contains(p)).ok_or_else(|| {
                            ConfigError::at(
                                line_no,
                                "[Global] ClusterServiceSharedLoadBalancerHealthProbePort: expected a port from 1 to 65535",
                            )
                        })?;
                        continue;
                    }
                    "clusterservicesharedloadbalancerhealthprobepath" => {
                        if !value.starts_with('/') || value.len() > 1024 || value.contains(char::is_whitespace) {
                            return Err(ConfigError::at(
                                line_no,
                                "[Global] ClusterServiceSharedLoadBalancerHealthProbePath: expected a path starting with /",
                            ));
                        }
                        config.cluster_probe.path = value;
                        continue;
                    }
                    "zoneidaszone" => {
                        config.zone_id_as_zone = parse_bool(&value).ok_or_else(|| {
                            ConfigError::at(line_no, "[Global] ZoneIDAsZone: not a boolean (true or false)")
                        })?;
                        continue;
                    }
                    "nodeipfamilies" => {
                        for f in value.split(',').map(|f| f.trim().to_ascii_lowercase()).filter(|f| !f.is_empty()) {
                            if (f != "ipv4" && f != "ipv6") || config.node_ip_families.contains(&f) {
                                return Err(ConfigError::at(
                                    line_no,
                                    "[Global] NodeIPFamilies: expected ipv4 or ipv6, each once",
                                ));
                            }
                            config.node_ip_families.push(f);
                        }
                        continue;
                    }
                    "supportedtopologyinstancetypepattern" => {
                        config.topology_types = crate::topology::TopologyTypes::parse(&value).map_err(|why| {
                            ConfigError::at(line_no, format!("[Global] SupportedTopologyInstanceTypePattern: {why}"))
                        })?;
                        continue;
                    }
                    "nlbsecuritygroupmode" => {
                        config.nlb_security_group_managed = match value.as_str() {
                            "Managed" => true,
                            "" => false,
                            _ => {
                                return Err(ConfigError::at(
                                    line_no,
                                    "[Global] NLBSecurityGroupMode: expected Managed (or no value)",
                                ));
                            }
                        };
                        continue;
                    }
                    other if IGNORED_GLOBAL_KEYS.contains(&other) => {
                        if other == "kubernetesclustertag" {
                            legacy_tag = value;
                        }
                        continue;
                    }
                    _ => {
                        return Err(ConfigError::at(
                            line_no,
                            "[Global] unknown key; known: Zone, Region, VPC, SubnetID, RouteTableID, KubernetesClusterID, KubernetesClusterTag, RoleARN, ElbSecurityGroup, DisableSecurityGroupIngress, NLBSecurityGroupMode, NodeIPFamilies, ZoneIDAsZone, ClusterServiceLoadBalancerHealthProbeMode, SupportedTopologyInstanceTypePattern",
                        ));
                    }
                };
                *field = value;
            }
            Section::Override(name) => {
                let entry = config.overrides.entry(name.clone()).or_default();
                let field = match lower.as_str() {
                    "service" => &mut entry.service,
                    "region" => &mut entry.region,
                    "url" => &mut entry.url,
                    "signingregion" => &mut entry.signing_region,
                    // Upstream's signing method and name: the SDK derives both per service.
                    "signingmethod" | "signingname" => continue,
                    _ => {
                        return Err(ConfigError::at(
                            line_no,
                            "[ServiceOverride] unknown key; known: Service, Region, URL, SigningRegion, SigningMethod, SigningName",
                        ));
                    }
                };
                *field = value;
            }
        }
    }
    if config.cluster_id.is_empty() {
        config.cluster_id = legacy_tag;
    }
    validate(&config)?;
    Ok(config)
}

fn validate(config: &AwsConfig) -> Result<(), ConfigError> {
    if !config.zone.is_empty() && region_of_zone(&config.zone).is_none() {
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
    if !config.role_arn.is_empty() && !config.role_arn.starts_with("arn:") {
        return Err(ConfigError("[Global] RoleARN: expected an ARN (arn:...)".into()));
    }
    if !config.cluster_id.is_empty() && !config.cluster_id.chars().all(|c| c.is_ascii_graphic()) {
        return Err(ConfigError("[Global] KubernetesClusterID: must be printable ASCII without spaces".into()));
    }
    for (i, o) in config.overrides.values().enumerate() {
        // Numbered, not named: the name is the user's text.
        let at = format!("[ServiceOverride] #{}", i + 1);
        if o.service.is_empty() {
            return Err(ConfigError(format!("{at} Service: required")));
        }
        if !["ec2", "elasticloadbalancing", "elbv2", "sts"].iter().any(|s| o.service.eq_ignore_ascii_case(s)) {
            return Err(ConfigError(format!("{at} Service: expected ec2, elasticloadbalancing or sts")));
        }
        if o.url.is_empty() {
            return Err(ConfigError(format!("{at} URL: required")));
        }
        if !(o.url.starts_with("https://") || o.url.starts_with("http://")) {
            return Err(ConfigError(format!("{at} URL: expected an http:// or https:// URL")));
        }
    }
    Ok(())
}

enum Section {
    Global,
    Override(String),
}

/// `[Name]` or `[Name "sub"]`.
fn parse_header(line: &str) -> Option<(String, Option<String>)> {
    let inner = line.strip_prefix('[')?.strip_suffix(']')?.trim();
    match inner.split_once(char::is_whitespace) {
        None => Some((inner.to_string(), None)),
        Some((name, rest)) => {
            let sub = rest.trim().strip_prefix('"')?.strip_suffix('"')?;
            Some((name.to_string(), Some(sub.to_string())))
        }
    }
}

fn unquote(value: &str) -> String {
    // A trailing comment after an unquoted value, as gcfg allows.
    if let Some(inner) = value.strip_prefix('"').and_then(|v| v.strip_suffix('"')) {
        return inner.to_string();
    }
    let cut = value.find([';', '#']).unwrap_or(value.len());
    value[..cut].trim().to_string()
}

fn parse_bool(value: &str) -> Option<bool> {
    match value.to_ascii_lowercase().as_str() {
        "true" | "yes" | "on" | "1" => Some(true),
        "false" | "no" | "off" | "0" | "" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FULL: &str = r#"
; upstream-style config
[Global]
Zone = us-east-1a
VPC = vpc-0abc
SubnetID = subnet-0123
KubernetesClusterTag = legacy
KubernetesClusterID = prod
RoleARN = arn:aws:iam::123456789012:role/ccm
DisableSecurityGroupIngress = true
ElbSecurityGroup = sg-0lb
NodeIPFamilies = ipv4

[ServiceOverride "1"]
Service = ec2
Region = us-east-1
URL = http://127.0.0.1:5000
SigningRegion = us-east-1

[serviceoverride "2"]
service = elasticloadbalancing
url = "http://127.0.0.1:5000"
"#;

    #[test]
    fn parses_upstream_global_keys_and_service_overrides() {
        let c = parse(FULL.as_bytes()).unwrap();
        assert_eq!(c.zone, "us-east-1a");
        assert_eq!(c.effective_region(), "us-east-1");
        assert_eq!(c.vpc, "vpc-0abc");
        assert_eq!(c.subnet_id, "subnet-0123");
        assert_eq!(c.cluster_id, "prod", "KubernetesClusterID wins over the legacy tag");
        assert_eq!(c.role_arn, "arn:aws:iam::123456789012:role/ccm");
        assert!(c.disable_security_group_ingress);
        assert_eq!(c.elb_security_group, "sg-0lb");
        assert_eq!(c.endpoint("ec2", "us-east-1").unwrap().url, "http://127.0.0.1:5000");
        assert_eq!(c.endpoint("elasticloadbalancing", "eu-west-1").unwrap().url, "http://127.0.0.1:5000");
        assert!(c.endpoint("ec2", "eu-west-1").is_none(), "a regional override applies to its region only");
    }

    #[test]
    fn legacy_cluster_tag_is_used_when_the_id_is_absent() {
        let c = parse(b"[Global]\nKubernetesClusterTag = old\n").unwrap();
        assert_eq!(c.cluster_id, "old");
    }

    #[test]
    fn nlb_security_group_mode_managed_is_read_and_other_values_refused_by_key() {
        assert!(parse(b"[Global]\nNLBSecurityGroupMode = Managed\n").unwrap().nlb_security_group_managed);
        assert!(!parse(b"[Global]\n").unwrap().nlb_security_group_managed);
        let e = parse(b"[Global]\nNLBSecurityGroupMode = managed-ish\n").unwrap_err().to_string();
        assert!(e.contains("NLBSecurityGroupMode") && !e.contains("managed-ish"), "{e}");
    }

    #[test]
    fn supported_topology_instance_type_pattern_is_read_and_a_bad_one_refused_by_key() {
        use crate::topology::TopologyTypes;
        let c = parse(b"[Global]\nSupportedTopologyInstanceTypePattern = ^(g6|p5)\\.\n").unwrap();
        assert!(c.topology_types.requires("g6.xlarge") && !c.topology_types.requires("trn1.2xlarge"));
        assert_eq!(parse(b"[Global]\n").unwrap().topology_types, TopologyTypes::Upstream);
        let e = parse(b"[Global]\nSupportedTopologyInstanceTypePattern = (p5\n").unwrap_err().to_string();
        assert!(
            e.contains("SupportedTopologyInstanceTypePattern") && e.contains("line 2") && !e.contains("(p5"),
            "{e}"
        );
    }

    #[test]
    fn cluster_health_probe_keys_are_read_and_checked() {
        let c = parse(b"[Global]\nClusterServiceLoadBalancerHealthProbeMode = ServiceNodePort\n").unwrap();
        assert!(!c.cluster_probe.shared);
        let c = parse(
            b"[Global]\nClusterServiceSharedLoadBalancerHealthProbePort = 10999\nClusterServiceSharedLoadBalancerHealthProbePath = /livez\n",
        )
        .unwrap();
        assert_eq!(c.cluster_probe, ClusterProbe { shared: true, port: 10999, path: "/livez".into() });
        for bad in [
            &b"[Global]\nClusterServiceLoadBalancerHealthProbeMode = Sometimes\n"[..],
            b"[Global]\nClusterServiceSharedLoadBalancerHealthProbePort = 0\n",
            b"[Global]\nClusterServiceSharedLoadBalancerHealthProbePath = livez\n",
        ] {
            assert!(parse(bad).unwrap_err().to_string().contains("ClusterService"));
        }
    }

    #[test]
    fn node_ip_families_are_read_in_order_and_checked() {
        let c = parse(b"[Global]\nNodeIPFamilies = ipv6\nNodeIPFamilies = ipv4\n").unwrap();
        assert_eq!(c.node_ip_families, vec!["ipv6".to_string(), "ipv4".to_string()]);
        assert!(parse(b"[Global]\nNodeIPFamilies = ipx\n").unwrap_err().to_string().contains("NodeIPFamilies"));
        assert!(parse(b"[Global]\nNodeIPFamilies = ipv4\nNodeIPFamilies = ipv4\n").is_err());
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
    fn errors_name_the_key_and_never_quote_the_value() {
        let secret = "arn-like-secret-value-42";
        for (text, expect) in [
            (format!("[Global]\nDisableSecurityGroupIngress = {secret}\n"), "DisableSecurityGroupIngress"),
            (format!("[Global]\nVPC = {secret}\n"), "VPC"),
            (format!("[Global]\nRoleARN = {secret}\n"), "RoleARN"),
            (format!("[Global]\nZone = {secret}\n"), "Zone"),
            (format!("[Global]\n{secret} = x\n"), "unknown key"),
            (format!("[{secret}]\n"), "unknown section"),
            (format!("[ServiceOverride \"{secret}\"]\nURL = http://h\n"), "Service: required"),
            (format!("[ServiceOverride \"x\"]\n{secret} = 1\n"), "unknown key"),
            (format!("[ServiceOverride \"x\"]\nService = ec2\nURL = {secret}\n"), "URL"),
            (format!("[ServiceOverride \"x\"]\nService = {secret}\nURL = http://h\n"), "Service"),
            (format!("Zone = {secret}\n"), "outside any section"),
            (format!("[Global]\n{secret}\n"), "Key = value"),
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
    fn region_of_zone_handles_regular_and_local_zones() {
        assert_eq!(region_of_zone("us-east-1a").as_deref(), Some("us-east-1"));
        assert_eq!(region_of_zone("us-west-2-lax-1a").as_deref(), Some("us-west-2"));
        assert_eq!(region_of_zone("ap-southeast-2c").as_deref(), Some("ap-southeast-2"));
        assert_eq!(region_of_zone("us-east-1"), None);
        assert_eq!(region_of_zone("bogus"), None);
    }

    #[test]
    fn unknown_section_is_an_error() {
        let e = parse(b"[Bogus]\n").unwrap_err().to_string();
        assert!(e.contains("unknown section") && !e.contains("Bogus"), "{e}");
    }
}
