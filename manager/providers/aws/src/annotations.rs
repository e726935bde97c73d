//! cloud-provider-aws's Service annotations, parsed and validated in one pure step.
//!
//! Every annotation is read before the first call that changes anything in AWS, so a bad value
//! refuses the whole sync (an error naming the annotation and the expected form) instead of
//! leaving a half-built load balancer. Values follow upstream's syntax; every list and string a
//! user supplies is bounded. Which annotations count depends on the kind of load balancer
//! ([`kind`]): a Classic ELB for every Service whose type is not `nlb`, `nlb-ip` or `external`,
//! as upstream.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::Service;

/// `nlb` (exactly): a Network Load Balancer; `external` and `nlb-ip` belong to the AWS Load
/// Balancer Controller; anything else, absent included, a Classic ELB (as upstream).
pub const TYPE: &str = "service.beta.kubernetes.io/aws-load-balancer-type";
/// Any value but `false` makes the load balancer internal.
pub const INTERNAL: &str = "service.beta.kubernetes.io/aws-load-balancer-internal";
/// Comma-separated subnet IDs or `Name` tags.
pub const SUBNETS: &str = "service.beta.kubernetes.io/aws-load-balancer-subnets";
/// Comma-separated `key=value` tags added to every object made for the Service.
pub const EXTRA_TAGS: &str = "service.beta.kubernetes.io/aws-load-balancer-additional-resource-tags";
/// `TCP`, `HTTP` or `HTTPS` (and `SSL` on a Classic ELB).
pub const HC_PROTOCOL: &str = "service.beta.kubernetes.io/aws-load-balancer-healthcheck-protocol";
/// A port number or `traffic-port`.
pub const HC_PORT: &str = "service.beta.kubernetes.io/aws-load-balancer-healthcheck-port";
/// The HTTP(S) health-check path.
pub const HC_PATH: &str = "service.beta.kubernetes.io/aws-load-balancer-healthcheck-path";
/// Seconds between health checks.
pub const HC_INTERVAL: &str = "service.beta.kubernetes.io/aws-load-balancer-healthcheck-interval";
/// Seconds before a health check fails.
pub const HC_TIMEOUT: &str = "service.beta.kubernetes.io/aws-load-balancer-healthcheck-timeout";
/// Successes before a target is healthy.
pub const HC_HEALTHY: &str = "service.beta.kubernetes.io/aws-load-balancer-healthcheck-healthy-threshold";
/// Failures before a target is unhealthy.
pub const HC_UNHEALTHY: &str = "service.beta.kubernetes.io/aws-load-balancer-healthcheck-unhealthy-threshold";
/// `true` or `false`: cross-zone load balancing.
pub const CROSS_ZONE: &str = "service.beta.kubernetes.io/aws-load-balancer-cross-zone-load-balancing-enabled";
/// `true` or `false`: access logs to S3.
pub const ACCESS_LOG_ENABLED: &str = "service.beta.kubernetes.io/aws-load-balancer-access-log-enabled";
/// The access-log bucket.
pub const ACCESS_LOG_BUCKET: &str = "service.beta.kubernetes.io/aws-load-balancer-access-log-s3-bucket-name";
/// The access-log key prefix.
pub const ACCESS_LOG_PREFIX: &str = "service.beta.kubernetes.io/aws-load-balancer-access-log-s3-bucket-prefix";
/// Classic only (NLBs publish every 5 minutes).
pub const ACCESS_LOG_EMIT_INTERVAL: &str = "service.beta.kubernetes.io/aws-load-balancer-access-log-emit-interval";
/// `key=value` target-group attributes.
pub const TARGET_GROUP_ATTRIBUTES: &str = "service.beta.kubernetes.io/aws-load-balancer-target-group-attributes";
/// A certificate ARN: TLS listeners.
pub const SSL_CERT: &str = "service.beta.kubernetes.io/aws-load-balancer-ssl-cert";
/// The ports (numbers or names) that get TLS listeners, or `*`.
pub const SSL_PORTS: &str = "service.beta.kubernetes.io/aws-load-balancer-ssl-ports";
/// The TLS listeners' security policy.
pub const SSL_POLICY: &str = "service.beta.kubernetes.io/aws-load-balancer-ssl-negotiation-policy";
/// The targets' protocol: `ssl` on an NLB's TLS ports; `http`, `https`, `ssl` or `tcp` on a
/// Classic ELB.
pub const BACKEND_PROTOCOL: &str = "service.beta.kubernetes.io/aws-load-balancer-backend-protocol";
/// Comma-separated Elastic IP allocation IDs, one per subnet.
pub const EIP_ALLOCATIONS: &str = "service.beta.kubernetes.io/aws-load-balancer-eip-allocations";
/// Comma-separated private IPv4 addresses, one per subnet.
pub const PRIVATE_IPV4: &str = "service.beta.kubernetes.io/aws-load-balancer-private-ipv4-addresses";
/// `key=value` (or `key`) Node labels selecting the targets.
pub const TARGET_NODE_LABELS: &str = "service.beta.kubernetes.io/aws-load-balancer-target-node-labels";
/// The load balancer's security groups (replacing any other).
pub const SECURITY_GROUPS: &str = "service.beta.kubernetes.io/aws-load-balancer-security-groups";
/// Security groups added to the load balancer's.
pub const EXTRA_SECURITY_GROUPS: &str = "service.beta.kubernetes.io/aws-load-balancer-extra-security-groups";
/// Classic only: `*` enables proxy protocol on every backend.
pub const PROXY_PROTOCOL: &str = "service.beta.kubernetes.io/aws-load-balancer-proxy-protocol";
/// Classic only.
pub const CONNECTION_DRAINING_ENABLED: &str =
    "service.beta.kubernetes.io/aws-load-balancer-connection-draining-enabled";
/// Classic only.
pub const CONNECTION_DRAINING_TIMEOUT: &str =
    "service.beta.kubernetes.io/aws-load-balancer-connection-draining-timeout";
/// Classic only.
pub const CONNECTION_IDLE_TIMEOUT: &str = "service.beta.kubernetes.io/aws-load-balancer-connection-idle-timeout";
/// Client CIDRs, used when `spec.loadBalancerSourceRanges` is empty.
pub const SOURCE_RANGES: &str = "service.beta.kubernetes.io/load-balancer-source-ranges";

/// Every `aws-load-balancer-*` key of upstream cloud-provider-aws.
pub const UPSTREAM_KEYS: [&str; 30] = [
    TYPE,
    INTERNAL,
    SUBNETS,
    EXTRA_TAGS,
    HC_PROTOCOL,
    HC_PORT,
    HC_PATH,
    HC_INTERVAL,
    HC_TIMEOUT,
    HC_HEALTHY,
    HC_UNHEALTHY,
    CROSS_ZONE,
    ACCESS_LOG_ENABLED,
    ACCESS_LOG_BUCKET,
    ACCESS_LOG_PREFIX,
    ACCESS_LOG_EMIT_INTERVAL,
    TARGET_GROUP_ATTRIBUTES,
    SSL_CERT,
    SSL_PORTS,
    SSL_POLICY,
    BACKEND_PROTOCOL,
    EIP_ALLOCATIONS,
    PRIVATE_IPV4,
    TARGET_NODE_LABELS,
    SECURITY_GROUPS,
    EXTRA_SECURITY_GROUPS,
    PROXY_PROTOCOL,
    CONNECTION_DRAINING_ENABLED,
    CONNECTION_DRAINING_TIMEOUT,
    CONNECTION_IDLE_TIMEOUT,
];

/// Classic-only keys: no meaning on an NLB (upstream ignores them there too).
pub const CLASSIC_ONLY: [&str; 5] = [
    ACCESS_LOG_EMIT_INTERVAL,
    PROXY_PROTOCOL,
    CONNECTION_DRAINING_ENABLED,
    CONNECTION_DRAINING_TIMEOUT,
    CONNECTION_IDLE_TIMEOUT,
];

/// The longest annotation value read.
pub const MAX_VALUE_LEN: usize = 4096;
/// At most this many items in a list annotation (subnets, addresses, groups, ports).
pub const MAX_LIST: usize = 32;
/// At most this many tags (AWS allows 50 per resource, the ownership tags included).
pub const MAX_TAGS: usize = 40;

/// A bad annotation: which one and the form it expects. Never quotes the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnnotationError {
    /// The value does not have the expected form.
    #[error("annotation {annotation}: expected {expected}")]
    Invalid {
        /// The annotation's key.
        annotation: &'static str,
        /// The expected form.
        expected: String,
    },
    /// Two annotations (or an annotation and the Service) contradict each other.
    #[error("annotation {annotation}: {reason}")]
    Conflict {
        /// The annotation's key.
        annotation: &'static str,
        /// Why it cannot apply.
        reason: String,
    },
    /// Refused as upstream refuses it, with upstream's message word for word (which names the
    /// annotation or the value itself), so its events read the same after a migration.
    #[error("{message}")]
    Upstream {
        /// The annotation's key.
        annotation: &'static str,
        /// Upstream's message.
        message: String,
    },
}

impl AnnotationError {
    /// The annotation the error is about.
    pub fn annotation(&self) -> &'static str {
        match self {
            Self::Invalid { annotation, .. }
            | Self::Conflict { annotation, .. }
            | Self::Upstream { annotation, .. } => annotation,
        }
    }
}

fn invalid(annotation: &'static str, expected: impl Into<String>) -> AnnotationError {
    AnnotationError::Invalid { annotation, expected: expected.into() }
}

fn conflict(annotation: &'static str, reason: impl Into<String>) -> AnnotationError {
    AnnotationError::Conflict { annotation, reason: reason.into() }
}

/// Upstream's refusal of `annotation`, with upstream's `message`.
pub fn upstream(annotation: &'static str, message: impl Into<String>) -> AnnotationError {
    AnnotationError::Upstream { annotation, message: message.into() }
}

/// Upstream's message for an Elastic IP or private address count that is not the subnet count
/// (`what`: `EIP AllocationIDs`, `Private IPv4Addresses`).
pub fn count_message(what: &str, given: usize, subnets: usize) -> String {
    format!("error creating load balancer: Must have same number of {what} ({given}) and SubnetIDs ({subnets})")
}

/// Who serves the Service's load balancer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LbKind {
    /// A Network Load Balancer made here (`aws-load-balancer-type: nlb`).
    Nlb,
    /// A Classic ELB made here (any other type, or none: upstream's default).
    Classic,
    /// The AWS Load Balancer Controller (`external`, `nlb-ip`).
    Elsewhere,
}

/// The health-check protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum HealthProtocol {
    /// A TCP connect.
    Tcp,
    /// A TLS handshake (Classic ELBs only).
    Ssl,
    /// `GET <path>` over HTTP.
    Http,
    /// `GET <path>` over HTTPS.
    Https,
}

impl HealthProtocol {
    /// The API's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tcp => "TCP",
            Self::Ssl => "SSL",
            Self::Http => "HTTP",
            Self::Https => "HTTPS",
        }
    }

    /// Whether the check sends a path.
    pub fn has_path(self) -> bool {
        matches!(self, Self::Http | Self::Https)
    }
}

/// The health-check port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HealthPort {
    /// The target's own port (the nodePort).
    TrafficPort,
    /// A fixed port.
    Port(i32),
}

/// The `healthcheck-*` annotations; `None` keeps the default.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HealthCheck {
    /// `healthcheck-protocol`.
    pub protocol: Option<HealthProtocol>,
    /// `healthcheck-port`.
    pub port: Option<HealthPort>,
    /// `healthcheck-path` (used only with HTTP and HTTPS, as upstream).
    pub path: Option<String>,
    /// `healthcheck-interval` (seconds, 5–300).
    pub interval: Option<i32>,
    /// `healthcheck-timeout` (seconds, 2–120).
    pub timeout: Option<i32>,
    /// `healthcheck-healthy-threshold` (2–10).
    pub healthy_threshold: Option<i32>,
    /// `healthcheck-unhealthy-threshold` (2–10).
    pub unhealthy_threshold: Option<i32>,
}

/// The `access-log-*` annotations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessLog {
    /// Whether logs are written.
    pub enabled: bool,
    /// The bucket.
    pub bucket: String,
    /// The key prefix.
    pub prefix: String,
    /// `access-log-emit-interval` (Classic ELBs: 5 or 60 minutes).
    pub emit_interval: Option<i32>,
}

/// The target-group attributes upstream supports.
pub const TG_ATTRIBUTES: [&str; 2] = ["preserve_client_ip.enabled", "proxy_protocol_v2.enabled"];

/// Which ports get TLS listeners.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SslPorts {
    /// `*` or absent: every TCP port.
    All,
    /// The listed port numbers and names.
    Listed {
        /// Port numbers.
        numbers: BTreeSet<i32>,
        /// Port names.
        names: BTreeSet<String>,
    },
}

impl SslPorts {
    /// Whether a Service port gets a TLS listener.
    pub fn covers(&self, port: i32, name: Option<&str>) -> bool {
        match self {
            Self::All => true,
            Self::Listed { numbers, names } => numbers.contains(&port) || name.is_some_and(|n| names.contains(n)),
        }
    }
}

/// TLS listeners (`ssl-cert` set).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tls {
    /// The certificate ARN.
    pub certificate_arn: String,
    /// `ssl-ports`.
    pub ports: SslPorts,
    /// `ssl-negotiation-policy` (the API's default when absent).
    pub policy: Option<String>,
}

/// Everything the annotations ask of a load balancer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LbAnnotations {
    /// `internal`.
    pub internal: bool,
    /// `subnets`: IDs (`subnet-…`) or `Name` tags.
    pub subnets: Vec<String>,
    /// `additional-resource-tags`.
    pub extra_tags: BTreeMap<String, String>,
    /// `healthcheck-*`.
    pub health: HealthCheck,
    /// `cross-zone-load-balancing-enabled`.
    pub cross_zone: Option<bool>,
    /// `access-log-*`.
    pub access_log: Option<AccessLog>,
    /// `target-group-attributes` (NLB): the attributes it names, validated as upstream; `None`
    /// when absent (then the target groups' attributes are left as they are).
    pub target_group_attributes: Option<BTreeMap<String, String>>,
    /// `ssl-*`.
    pub tls: Option<Tls>,
    /// `backend-protocol`, as written.
    pub backend_protocol: Option<String>,
    /// `ssl-negotiation-policy` is present (Classic ELBs set it even without `ssl-cert`).
    pub ssl_policy: Option<String>,
    /// `eip-allocations`.
    pub eip_allocations: Vec<String>,
    /// `private-ipv4-addresses`.
    pub private_ipv4: Vec<Ipv4Addr>,
    /// `target-node-labels`: key and value (`None`: the key only must be present).
    pub target_node_labels: BTreeMap<String, Option<String>>,
    /// `load-balancer-source-ranges`.
    pub source_ranges: Vec<IpNet>,
    /// `security-groups`.
    pub security_groups: Vec<String>,
    /// `extra-security-groups`.
    pub extra_security_groups: Vec<String>,
    /// `proxy-protocol: "*"` (Classic ELBs).
    pub proxy_protocol: bool,
    /// `connection-draining-enabled` (Classic ELBs).
    pub connection_draining: Option<bool>,
    /// `connection-draining-timeout` (Classic ELBs, seconds).
    pub connection_draining_timeout: Option<i32>,
    /// `connection-idle-timeout` (Classic ELBs, seconds).
    pub idle_timeout: Option<i32>,
    /// Classic-only keys that are set on an NLB (no effect there).
    pub ignored: Vec<&'static str>,
}

/// An annotation's trimmed value; over-long values are an error.
fn get<'a>(a: &'a BTreeMap<String, String>, key: &'static str) -> Result<Option<&'a str>, AnnotationError> {
    match a.get(key) {
        None => Ok(None),
        Some(v) if v.len() > MAX_VALUE_LEN => Err(invalid(key, format!("at most {MAX_VALUE_LEN} characters"))),
        Some(v) => Ok(Some(v.trim())),
    }
}

/// Go's `strconv.ParseBool`, as upstream reads booleans.
fn boolean(key: &'static str, v: &str) -> Result<bool, AnnotationError> {
    match v {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        _ => Err(invalid(key, "true or false")),
    }
}

fn int_in(key: &'static str, v: &str, lo: i32, hi: i32, what: &str) -> Result<i32, AnnotationError> {
    v.parse::<i32>()
        .ok()
        .filter(|n| (lo..=hi).contains(n))
        .ok_or_else(|| invalid(key, format!("{what}: an integer from {lo} to {hi}")))
}

/// A comma-separated list of at most [`MAX_LIST`] non-empty items.
fn list(key: &'static str, v: &str) -> Result<Vec<String>, AnnotationError> {
    let items: Vec<String> = v.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_string).collect();
    if items.len() > MAX_LIST {
        return Err(invalid(key, format!("at most {MAX_LIST} comma-separated items")));
    }
    let mut seen = BTreeSet::new();
    if items.iter().any(|i| !seen.insert(i.clone())) {
        return Err(invalid(key, "comma-separated items, each once"));
    }
    Ok(items)
}

/// `k=v,k2=v2` as upstream reads it: a bare `k` or `k=` has the value `""`, `k=v=w` has `v`;
/// items with an empty key are skipped. At most `max` pairs.
fn pairs(key: &'static str, v: &str, max: usize) -> Result<Vec<(String, String)>, AnnotationError> {
    let mut out = Vec::new();
    for pair in v.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let mut parts = pair.split('=');
        let k = parts.next().unwrap_or_default();
        if k.is_empty() {
            continue;
        }
        out.push((k.to_string(), parts.next().unwrap_or_default().to_string()));
    }
    if out.len() > max {
        return Err(invalid(key, format!("at most {max} key=value pairs")));
    }
    Ok(out)
}

/// An AWS ID: `<prefix>` then 8 or 17 hexadecimal digits.
fn is_aws_id(s: &str, prefix: &str) -> bool {
    s.strip_prefix(prefix).is_some_and(|h| (h.len() == 8 || h.len() == 17) && h.chars().all(|c| c.is_ascii_hexdigit()))
}

/// Who serves the Service, from `aws-load-balancer-type`, as upstream: exactly `nlb` is an
/// NLB, `nlb-ip` and `external` the AWS Load Balancer Controller's, anything else a Classic ELB.
pub fn kind(service: &Service) -> LbKind {
    match service.metadata.annotations.as_ref().and_then(|a| a.get(TYPE)).map(String::as_str) {
        Some("nlb") => LbKind::Nlb,
        Some("nlb-ip" | "external") => LbKind::Elsewhere,
        _ => LbKind::Classic,
    }
}

/// Parse every annotation a load balancer of `kind` uses.
pub fn parse(annotations: &BTreeMap<String, String>, kind: LbKind) -> Result<LbAnnotations, AnnotationError> {
    let a = annotations;
    let nlb = kind == LbKind::Nlb;
    // Upstream's refusals of bring-your-own security groups on an NLB (the key merely present).
    if nlb && a.contains_key(SECURITY_GROUPS) {
        return Err(upstream(
            SECURITY_GROUPS,
            format!("BYO security group annotation {SECURITY_GROUPS:?} is not supported by NLB"),
        ));
    }
    if nlb && a.contains_key(EXTRA_SECURITY_GROUPS) {
        return Err(upstream(
            EXTRA_SECURITY_GROUPS,
            format!("BYO extra security group annotation {EXTRA_SECURITY_GROUPS:?} is not supported by NLB"),
        ));
    }
    let mut out = LbAnnotations {
        internal: get(a, INTERNAL)?.is_some_and(|v| !v.is_empty() && v != "false"),
        ..Default::default()
    };
    if let Some(v) = get(a, SUBNETS)? {
        out.subnets = list(SUBNETS, v)?;
        if out.subnets.iter().any(|s| s.len() > 255) {
            return Err(invalid(SUBNETS, "subnet IDs (subnet-…) or Name tags of at most 255 characters"));
        }
    }
    if let Some(v) = get(a, EXTRA_TAGS)? {
        for (k, val) in pairs(EXTRA_TAGS, v, MAX_TAGS)? {
            if k.starts_with("kubernetes.io/") || k.starts_with("aws:") || k.len() > 128 || val.len() > 256 {
                return Err(invalid(
                    EXTRA_TAGS,
                    "key=value tags, keys of at most 128 characters outside kubernetes.io/ and aws:, values of at most 256",
                ));
            }
            out.extra_tags.insert(k, val);
        }
    }
    out.health = health(a)?;
    if let Some(v) = get(a, CROSS_ZONE)?.filter(|v| !v.is_empty()) {
        out.cross_zone = Some(boolean(CROSS_ZONE, v)?);
    }
    out.access_log = access_log(a, nlb)?;
    if let Some(v) = get(a, TARGET_GROUP_ATTRIBUTES)? {
        if !nlb {
            return Err(upstream(
                TARGET_GROUP_ATTRIBUTES,
                "target group attributes annotation is only supported for NLB",
            ));
        }
        out.target_group_attributes = Some(target_group_attributes(v)?);
    }
    out.tls = tls(a)?;
    out.backend_protocol = get(a, BACKEND_PROTOCOL)?.filter(|v| !v.is_empty()).map(str::to_string);
    out.ssl_policy = match get(a, SSL_POLICY)? {
        Some(v) if !v.is_empty() => Some(ssl_policy(v)?),
        _ => None,
    };
    if let Some(v) = get(a, EIP_ALLOCATIONS)? {
        out.eip_allocations = list(EIP_ALLOCATIONS, v)?;
        if out.eip_allocations.iter().any(|e| !is_aws_id(e, "eipalloc-")) {
            return Err(invalid(EIP_ALLOCATIONS, "comma-separated Elastic IP allocation IDs (eipalloc-…)"));
        }
    }
    if let Some(v) = get(a, PRIVATE_IPV4)? {
        out.private_ipv4 = list(PRIVATE_IPV4, v)?
            .iter()
            .map(|s| s.parse::<Ipv4Addr>())
            .collect::<Result<_, _>>()
            .map_err(|_| invalid(PRIVATE_IPV4, "comma-separated IPv4 addresses"))?;
    }
    if let Some(v) = get(a, TARGET_NODE_LABELS)? {
        for (k, val) in pairs(TARGET_NODE_LABELS, v, MAX_LIST)? {
            if k.len() > 317 || val.len() > 63 {
                return Err(invalid(TARGET_NODE_LABELS, "comma-separated Node labels key=value or key"));
            }
            // An empty value only asks for the key, as upstream.
            out.target_node_labels.insert(k, (!val.is_empty()).then_some(val));
        }
    }
    if let Some(v) = get(a, SOURCE_RANGES)? {
        out.source_ranges = list(SOURCE_RANGES, v)?
            .iter()
            .map(|s| s.parse::<IpNet>().map(|n| n.trunc()))
            .collect::<Result<_, _>>()
            .map_err(|_| {
                invalid(
                    SOURCE_RANGES,
                    "a comma-separated list of source IP ranges. For example, 10.0.0.0/24,192.168.2.0/24",
                )
            })?;
    }
    for (key, field) in [(SECURITY_GROUPS, 0), (EXTRA_SECURITY_GROUPS, 1)] {
        if let Some(v) = get(a, key)? {
            let groups = list(key, v)?;
            if groups.len() > 5 || groups.iter().any(|g| !is_aws_id(g, "sg-")) {
                return Err(invalid(key, "at most 5 comma-separated security group IDs (sg-…)"));
            }
            if field == 0 {
                out.security_groups = groups;
            } else {
                out.extra_security_groups = groups;
            }
        }
    }
    if nlb {
        out.ignored = CLASSIC_ONLY.iter().copied().filter(|k| a.contains_key(*k)).collect();
    } else {
        classic_only(a, &mut out)?;
    }
    // Combinations (NLB addresses).
    if !out.eip_allocations.is_empty() && out.internal && nlb {
        return Err(conflict(
            EIP_ALLOCATIONS,
            format!("Elastic IPs need an internet-facing load balancer; remove it or {INTERNAL}"),
        ));
    }
    if !out.private_ipv4.is_empty() && !out.internal && nlb {
        return Err(conflict(
            PRIVATE_IPV4,
            format!("private addresses need an internal load balancer ({INTERNAL}: \"true\")"),
        ));
    }
    for (key, what, n) in [
        (EIP_ALLOCATIONS, "EIP AllocationIDs", out.eip_allocations.len()),
        (PRIVATE_IPV4, "Private IPv4Addresses", out.private_ipv4.len()),
    ] {
        if nlb && n > 0 && !out.subnets.is_empty() && n != out.subnets.len() {
            return Err(upstream(key, count_message(what, n, out.subnets.len())));
        }
    }
    Ok(out)
}

/// The Classic-only keys.
fn classic_only(a: &BTreeMap<String, String>, out: &mut LbAnnotations) -> Result<(), AnnotationError> {
    match get(a, PROXY_PROTOCOL)? {
        None | Some("") => {}
        Some("*") => out.proxy_protocol = true,
        Some(v) => {
            return Err(upstream(
                PROXY_PROTOCOL,
                format!("annotation {PROXY_PROTOCOL:?}={v:?} detected, but the only value supported currently is '*'"),
            ));
        }
    }
    if let Some(v) = get(a, CONNECTION_DRAINING_ENABLED)?.filter(|v| !v.is_empty()) {
        out.connection_draining = Some(boolean(CONNECTION_DRAINING_ENABLED, v)?);
    }
    if let Some(v) = get(a, CONNECTION_DRAINING_TIMEOUT)?.filter(|v| !v.is_empty()) {
        out.connection_draining_timeout = Some(int_in(CONNECTION_DRAINING_TIMEOUT, v, 1, 3600, "seconds")?);
    }
    if let Some(v) = get(a, CONNECTION_IDLE_TIMEOUT)?.filter(|v| !v.is_empty()) {
        out.idle_timeout = Some(int_in(CONNECTION_IDLE_TIMEOUT, v, 1, 4000, "seconds")?);
    }
    Ok(())
}

/// `target-group-attributes`, validated as upstream: the two supported keys, exactly `true` or
/// `false` each.
fn target_group_attributes(v: &str) -> Result<BTreeMap<String, String>, AnnotationError> {
    let mut out = BTreeMap::new();
    for (k, val) in pairs(TARGET_GROUP_ATTRIBUTES, v, 8)? {
        if val.is_empty() {
            return Err(conflict(
                TARGET_GROUP_ATTRIBUTES,
                format!("error validating target group attributes: attribute value is empty for {k:?}"),
            ));
        }
        if !TG_ATTRIBUTES.contains(&k.as_str()) {
            return Err(invalid(
                TARGET_GROUP_ATTRIBUTES,
                "preserve_client_ip.enabled=true|false,proxy_protocol_v2.enabled=true|false (the attributes supported by the controller)",
            ));
        }
        if val != "true" && val != "false" {
            return Err(invalid(TARGET_GROUP_ATTRIBUTES, format!("true or false for {k}")));
        }
        out.insert(k, val);
    }
    Ok(out)
}

fn health(a: &BTreeMap<String, String>) -> Result<HealthCheck, AnnotationError> {
    let mut h = HealthCheck::default();
    if let Some(v) = get(a, HC_PROTOCOL)? {
        h.protocol = Some(match v.to_ascii_uppercase().as_str() {
            "TCP" => HealthProtocol::Tcp,
            "SSL" => HealthProtocol::Ssl,
            "HTTP" => HealthProtocol::Http,
            "HTTPS" => HealthProtocol::Https,
            _ => return Err(invalid(HC_PROTOCOL, "TCP, HTTP or HTTPS (or SSL on a Classic ELB)")),
        });
    }
    if let Some(v) = get(a, HC_PORT)? {
        h.port = Some(if v == "traffic-port" {
            HealthPort::TrafficPort
        } else {
            HealthPort::Port(
                int_in(HC_PORT, v, 1, 65535, "traffic-port or a port")
                    .map_err(|_| invalid(HC_PORT, "traffic-port or a port number from 1 to 65535"))?,
            )
        });
    }
    if let Some(v) = get(a, HC_PATH)?.filter(|v| !v.is_empty()) {
        if !v.starts_with('/') || v.len() > 1024 || v.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(invalid(HC_PATH, "a path starting with / of at most 1024 characters, no spaces"));
        }
        h.path = Some(v.to_string());
    }
    if let Some(v) = get(a, HC_INTERVAL)? {
        h.interval = Some(int_in(HC_INTERVAL, v, 5, 300, "seconds")?);
    }
    if let Some(v) = get(a, HC_TIMEOUT)? {
        h.timeout = Some(int_in(HC_TIMEOUT, v, 2, 120, "seconds")?);
    }
    if let Some(v) = get(a, HC_HEALTHY)? {
        h.healthy_threshold = Some(int_in(HC_HEALTHY, v, 2, 10, "a count")?);
    }
    if let Some(v) = get(a, HC_UNHEALTHY)? {
        h.unhealthy_threshold = Some(int_in(HC_UNHEALTHY, v, 2, 10, "a count")?);
    }
    if let (Some(t), Some(i)) = (h.timeout, h.interval)
        && t > i
    {
        return Err(conflict(HC_TIMEOUT, format!("the timeout must not be longer than {HC_INTERVAL}")));
    }
    Ok(h)
}

fn access_log(a: &BTreeMap<String, String>, nlb: bool) -> Result<Option<AccessLog>, AnnotationError> {
    let enabled = match get(a, ACCESS_LOG_ENABLED)?.filter(|v| !v.is_empty()) {
        None => None,
        Some(v) => Some(boolean(ACCESS_LOG_ENABLED, v)?),
    };
    let bucket = get(a, ACCESS_LOG_BUCKET)?.unwrap_or_default();
    let prefix = get(a, ACCESS_LOG_PREFIX)?.unwrap_or_default();
    if !bucket.is_empty()
        && (bucket.len() < 3
            || bucket.len() > 63
            || !bucket.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '-'))
    {
        return Err(invalid(ACCESS_LOG_BUCKET, "an S3 bucket name (3 to 63 of a-z, 0-9, '.', '-')"));
    }
    if prefix.len() > 1024 || prefix.contains("AWSLogs") {
        return Err(invalid(ACCESS_LOG_PREFIX, "a key prefix of at most 1024 characters, without AWSLogs"));
    }
    let emit_interval = match get(a, ACCESS_LOG_EMIT_INTERVAL)?.filter(|v| !v.is_empty() && !nlb) {
        None => None,
        Some(v) => Some(
            v.parse::<i32>()
                .ok()
                .filter(|n| *n == 5 || *n == 60)
                .ok_or_else(|| invalid(ACCESS_LOG_EMIT_INTERVAL, "5 or 60 (minutes)"))?,
        ),
    };
    if enabled == Some(true) && bucket.is_empty() {
        return Err(conflict(ACCESS_LOG_ENABLED, format!("access logs need {ACCESS_LOG_BUCKET}")));
    }
    if enabled.is_none() && bucket.is_empty() && prefix.is_empty() && emit_interval.is_none() {
        return Ok(None);
    }
    Ok(Some(AccessLog {
        enabled: enabled.unwrap_or(false),
        bucket: bucket.to_string(),
        prefix: prefix.to_string(),
        emit_interval,
    }))
}

fn ssl_policy(v: &str) -> Result<String, AnnotationError> {
    if v.len() <= 128 && v.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.') {
        Ok(v.to_string())
    } else {
        Err(invalid(SSL_POLICY, "a security policy name (ELBSecurityPolicy-TLS13-1-2-2021-06)"))
    }
}

fn tls(a: &BTreeMap<String, String>) -> Result<Option<Tls>, AnnotationError> {
    let Some(cert) = get(a, SSL_CERT)?.filter(|c| !c.is_empty()) else {
        return Ok(None);
    };
    // One ARN: `arn:<partition>:acm|iam:<region>:<account>:…`.
    let parts: Vec<&str> = cert.splitn(6, ':').collect();
    if parts.len() != 6 || parts[0] != "arn" || !(parts[2] == "acm" || parts[2] == "iam") || cert.contains(',') {
        return Err(invalid(SSL_CERT, "one certificate ARN (arn:aws:acm:<region>:<account>:certificate/<id>)"));
    }
    let ports = match get(a, SSL_PORTS)? {
        None | Some("*") | Some("") => SslPorts::All,
        Some(v) => {
            let mut numbers = BTreeSet::new();
            let mut names = BTreeSet::new();
            for item in list(SSL_PORTS, v)? {
                if item == "*" {
                    return Err(invalid(SSL_PORTS, "* alone, or comma-separated port numbers and names"));
                }
                match item.parse::<i32>() {
                    Ok(n) if (1..=65535).contains(&n) => {
                        numbers.insert(n);
                    }
                    Ok(_) => return Err(invalid(SSL_PORTS, "comma-separated port numbers (1-65535) and names")),
                    Err(_) if item.len() <= 63 => {
                        names.insert(item);
                    }
                    Err(_) => return Err(invalid(SSL_PORTS, "comma-separated port numbers and names")),
                }
            }
            SslPorts::Listed { numbers, names }
        }
    };
    let policy = match get(a, SSL_POLICY)? {
        None | Some("") => None,
        Some(v) => Some(ssl_policy(v)?),
    };
    Ok(Some(Tls { certificate_arn: cert.to_string(), ports, policy }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ann(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn nlb(pairs: &[(&str, &str)]) -> Result<LbAnnotations, AnnotationError> {
        parse(&ann(pairs), LbKind::Nlb)
    }

    fn err(pairs: &[(&str, &str)]) -> AnnotationError {
        nlb(pairs).unwrap_err()
    }

    fn with_type(v: Option<&str>) -> Service {
        let mut s = Service::default();
        s.metadata.annotations = v.map(|v| ann(&[(TYPE, v)]));
        s
    }

    #[test]
    fn upstream_key_list_has_thirty_distinct_aws_load_balancer_keys() {
        let set: BTreeSet<&str> = UPSTREAM_KEYS.iter().copied().collect();
        assert_eq!(set.len(), 30);
        assert!(set.iter().all(|k| k.starts_with("service.beta.kubernetes.io/aws-load-balancer-")));
    }

    #[test]
    fn type_nlb_exactly_is_an_nlb_external_and_nlb_ip_are_elsewhere_and_anything_else_classic() {
        assert_eq!(kind(&with_type(Some("nlb"))), LbKind::Nlb);
        assert_eq!(kind(&with_type(Some("external"))), LbKind::Elsewhere);
        assert_eq!(kind(&with_type(Some("nlb-ip"))), LbKind::Elsewhere);
        for classic in [None, Some(""), Some("NLB"), Some("elb"), Some("clb"), Some(" nlb")] {
            assert_eq!(kind(&with_type(classic)), LbKind::Classic, "{classic:?}");
        }
    }

    #[test]
    fn internal_is_any_value_but_false() {
        assert!(nlb(&[(INTERNAL, "true")]).unwrap().internal);
        assert!(nlb(&[(INTERNAL, "0.0.0.0/0")]).unwrap().internal);
        assert!(!nlb(&[(INTERNAL, "false")]).unwrap().internal);
        assert!(!nlb(&[]).unwrap().internal);
    }

    #[test]
    fn subnets_take_ids_and_names_bounded() {
        let a = nlb(&[(SUBNETS, "subnet-0123abcd, private-a")]).unwrap();
        assert_eq!(a.subnets, vec!["subnet-0123abcd".to_string(), "private-a".into()]);
        let many = (0..40).map(|i| format!("s{i}")).collect::<Vec<_>>().join(",");
        assert_eq!(err(&[(SUBNETS, &many)]).annotation(), SUBNETS);
        assert_eq!(err(&[(SUBNETS, "a,a")]).annotation(), SUBNETS);
    }

    #[test]
    fn extra_tags_read_as_upstream_and_refuse_reserved_keys_and_too_many() {
        let a = nlb(&[(EXTRA_TAGS, "team=web,bare,eq=a=b,=skipped")]).unwrap();
        assert_eq!(a.extra_tags.get("bare").map(String::as_str), Some(""));
        assert_eq!(a.extra_tags.get("eq").map(String::as_str), Some("a"), "k=v=w reads v, as upstream");
        assert_eq!(a.extra_tags.len(), 3);
        assert_eq!(err(&[(EXTRA_TAGS, "kubernetes.io/x=1")]).annotation(), EXTRA_TAGS);
        assert_eq!(err(&[(EXTRA_TAGS, "aws:x=1")]).annotation(), EXTRA_TAGS);
        let many = (0..41).map(|i| format!("k{i}=v")).collect::<Vec<_>>().join(",");
        assert_eq!(err(&[(EXTRA_TAGS, &many)]).annotation(), EXTRA_TAGS);
    }

    #[test]
    fn healthcheck_keys_parse_with_upstream_syntax_and_aws_bounds() {
        let a = nlb(&[
            (HC_PROTOCOL, "http"),
            (HC_PORT, "8080"),
            (HC_PATH, "/ready"),
            (HC_INTERVAL, "30"),
            (HC_TIMEOUT, "6"),
            (HC_HEALTHY, "3"),
            (HC_UNHEALTHY, "4"),
        ])
        .unwrap();
        assert_eq!(
            a.health,
            HealthCheck {
                protocol: Some(HealthProtocol::Http),
                port: Some(HealthPort::Port(8080)),
                path: Some("/ready".into()),
                interval: Some(30),
                timeout: Some(6),
                healthy_threshold: Some(3),
                unhealthy_threshold: Some(4),
            }
        );
        assert_eq!(nlb(&[(HC_PORT, "traffic-port")]).unwrap().health.port, Some(HealthPort::TrafficPort));
        assert_eq!(nlb(&[(HC_PROTOCOL, "ssl")]).unwrap().health.protocol, Some(HealthProtocol::Ssl));
        for (key, bad) in [
            (HC_PROTOCOL, "UDP"),
            (HC_PORT, "0"),
            (HC_PORT, "http"),
            (HC_PATH, "ready"),
            (HC_INTERVAL, "4"),
            (HC_INTERVAL, "x"),
            (HC_TIMEOUT, "121"),
            (HC_HEALTHY, "1"),
            (HC_UNHEALTHY, "11"),
        ] {
            let e = err(&[(key, bad)]);
            assert_eq!(e.annotation(), key, "{key}={bad}: {e}");
            assert!(e.to_string().contains("expected"), "{e}");
        }
        assert_eq!(err(&[(HC_INTERVAL, "10"), (HC_TIMEOUT, "11")]).annotation(), HC_TIMEOUT);
        // A path with TCP is ignored, as upstream (not refused).
        assert!(nlb(&[(HC_PROTOCOL, "TCP"), (HC_PATH, "/x")]).is_ok());
    }

    #[test]
    fn cross_zone_and_access_logs_are_read_for_both_kinds() {
        let a = nlb(&[
            (CROSS_ZONE, "true"),
            (ACCESS_LOG_ENABLED, "true"),
            (ACCESS_LOG_BUCKET, "logs-bucket"),
            (ACCESS_LOG_PREFIX, "web"),
        ])
        .unwrap();
        assert_eq!(a.cross_zone, Some(true));
        assert_eq!(
            a.access_log,
            Some(AccessLog { enabled: true, bucket: "logs-bucket".into(), prefix: "web".into(), emit_interval: None })
        );
        assert_eq!(err(&[(CROSS_ZONE, "yes")]).annotation(), CROSS_ZONE);
        assert_eq!(err(&[(ACCESS_LOG_ENABLED, "true")]).annotation(), ACCESS_LOG_ENABLED);
        assert_eq!(
            err(&[(ACCESS_LOG_ENABLED, "true"), (ACCESS_LOG_BUCKET, "Bad_Bucket")]).annotation(),
            ACCESS_LOG_BUCKET
        );
        let c = parse(&ann(&[(ACCESS_LOG_EMIT_INTERVAL, "5")]), LbKind::Classic).unwrap();
        assert_eq!(c.access_log.unwrap().emit_interval, Some(5));
        assert_eq!(
            parse(&ann(&[(ACCESS_LOG_EMIT_INTERVAL, "7")]), LbKind::Classic).unwrap_err().annotation(),
            ACCESS_LOG_EMIT_INTERVAL
        );
    }

    #[test]
    fn target_group_attributes_are_validated_as_upstream_and_refused_on_classic() {
        let a = nlb(&[(TARGET_GROUP_ATTRIBUTES, "preserve_client_ip.enabled=false,proxy_protocol_v2.enabled=true")])
            .unwrap();
        let attrs = a.target_group_attributes.unwrap();
        assert_eq!(attrs["preserve_client_ip.enabled"], "false");
        assert_eq!(attrs["proxy_protocol_v2.enabled"], "true");
        assert!(nlb(&[]).unwrap().target_group_attributes.is_none(), "absent: left as they are");
        assert_eq!(err(&[(TARGET_GROUP_ATTRIBUTES, "stickiness.enabled=true")]).annotation(), TARGET_GROUP_ATTRIBUTES);
        assert_eq!(
            err(&[(TARGET_GROUP_ATTRIBUTES, "proxy_protocol_v2.enabled=True")]).annotation(),
            TARGET_GROUP_ATTRIBUTES
        );
        assert!(err(&[(TARGET_GROUP_ATTRIBUTES, "proxy_protocol_v2.enabled=")]).to_string().contains("value is empty"));
        let e =
            parse(&ann(&[(TARGET_GROUP_ATTRIBUTES, "proxy_protocol_v2.enabled=true")]), LbKind::Classic).unwrap_err();
        assert!(e.to_string().contains("only supported for NLB"), "{e}");
    }

    #[test]
    fn ssl_cert_ports_and_policy_make_tls_listeners_and_backend_protocol_is_kept_as_written() {
        let cert = "arn:aws:acm:us-east-1:123456789012:certificate/abc";
        let a = nlb(&[
            (SSL_CERT, cert),
            (SSL_PORTS, "443, https"),
            (SSL_POLICY, "ELBSecurityPolicy-TLS13-1-2-2021-06"),
            (BACKEND_PROTOCOL, "ssl"),
        ])
        .unwrap();
        let tls = a.tls.unwrap();
        assert_eq!(tls.certificate_arn, cert);
        assert!(
            tls.ports.covers(443, None) && tls.ports.covers(8443, Some("https")) && !tls.ports.covers(80, Some("http"))
        );
        assert_eq!(tls.policy.as_deref(), Some("ELBSecurityPolicy-TLS13-1-2-2021-06"));
        assert_eq!(a.backend_protocol.as_deref(), Some("ssl"));
        let all = nlb(&[(SSL_CERT, cert)]).unwrap().tls.unwrap();
        assert_eq!(all.ports, SslPorts::All);
        assert!(nlb(&[(SSL_PORTS, "443")]).unwrap().tls.is_none(), "no certificate, no TLS");
        assert_eq!(nlb(&[(SSL_POLICY, "p1")]).unwrap().ssl_policy.as_deref(), Some("p1"));
        assert_eq!(err(&[(SSL_CERT, "my-cert")]).annotation(), SSL_CERT);
        assert_eq!(err(&[(SSL_CERT, cert), (SSL_PORTS, "70000")]).annotation(), SSL_PORTS);
        assert_eq!(err(&[(SSL_CERT, cert), (SSL_POLICY, "a b")]).annotation(), SSL_POLICY);
    }

    #[test]
    fn eip_allocations_and_private_addresses_match_scheme_and_subnets() {
        let a = nlb(&[(EIP_ALLOCATIONS, "eipalloc-0123456789abcdef0,eipalloc-01234567")]).unwrap();
        assert_eq!(a.eip_allocations.len(), 2);
        assert_eq!(err(&[(EIP_ALLOCATIONS, "1.2.3.4")]).annotation(), EIP_ALLOCATIONS);
        assert_eq!(err(&[(EIP_ALLOCATIONS, "eipalloc-01234567"), (INTERNAL, "true")]).annotation(), EIP_ALLOCATIONS);
        assert_eq!(
            err(&[(EIP_ALLOCATIONS, "eipalloc-01234567"), (SUBNETS, "subnet-01234567,subnet-89abcdef")]).annotation(),
            EIP_ALLOCATIONS
        );
        let p = nlb(&[(PRIVATE_IPV4, "10.0.1.10, 10.0.2.10"), (INTERNAL, "true")]).unwrap();
        assert_eq!(p.private_ipv4, vec![Ipv4Addr::new(10, 0, 1, 10), Ipv4Addr::new(10, 0, 2, 10)]);
        assert_eq!(err(&[(PRIVATE_IPV4, "10.0.1.10")]).annotation(), PRIVATE_IPV4, "internet-facing");
        assert_eq!(err(&[(PRIVATE_IPV4, "fd00::1"), (INTERNAL, "true")]).annotation(), PRIVATE_IPV4);
    }

    #[test]
    fn target_node_labels_with_an_empty_value_ask_for_the_key_only() {
        let a = nlb(&[(TARGET_NODE_LABELS, "pool=lb, edge, zone=")]).unwrap();
        assert_eq!(a.target_node_labels.get("pool"), Some(&Some("lb".to_string())));
        assert_eq!(a.target_node_labels.get("edge"), Some(&None));
        assert_eq!(a.target_node_labels.get("zone"), Some(&None), "k= is presence only, as upstream");
    }

    #[test]
    fn source_ranges_annotation_takes_cidrs() {
        let a = nlb(&[(SOURCE_RANGES, "203.0.113.7/24, 198.51.100.0/24")]).unwrap();
        assert_eq!(a.source_ranges[0].to_string(), "203.0.113.0/24");
        assert_eq!(err(&[(SOURCE_RANGES, "not-a-cidr")]).annotation(), SOURCE_RANGES);
    }

    #[test]
    fn security_groups_take_at_most_five_ids_on_a_classic_elb_and_are_refused_on_an_nlb() {
        let classic = |pairs: &[(&str, &str)]| parse(&ann(pairs), LbKind::Classic);
        let a = classic(&[(SECURITY_GROUPS, "sg-01234567"), (EXTRA_SECURITY_GROUPS, "sg-0123456789abcdef0")]).unwrap();
        assert_eq!(a.security_groups, vec!["sg-01234567".to_string()]);
        assert_eq!(a.extra_security_groups, vec!["sg-0123456789abcdef0".to_string()]);
        assert_eq!(classic(&[(SECURITY_GROUPS, "web")]).unwrap_err().annotation(), SECURITY_GROUPS);
        let six = (0..6).map(|i| format!("sg-0000000{i}")).collect::<Vec<_>>().join(",");
        assert_eq!(classic(&[(EXTRA_SECURITY_GROUPS, &six)]).unwrap_err().annotation(), EXTRA_SECURITY_GROUPS);
        let e = err(&[(SECURITY_GROUPS, "")]);
        assert!(
            e.to_string().contains("BYO security group annotation") && e.to_string().contains("not supported by NLB"),
            "{e}"
        );
        assert!(
            err(&[(EXTRA_SECURITY_GROUPS, "sg-01234567")]).to_string().contains("BYO extra security group annotation")
        );
    }

    #[test]
    fn classic_only_keys_apply_to_classic_elbs_and_are_listed_as_ignored_on_nlbs() {
        let a = nlb(&[(PROXY_PROTOCOL, "*"), (CONNECTION_IDLE_TIMEOUT, "60")]).unwrap();
        assert_eq!(a.ignored, vec![PROXY_PROTOCOL, CONNECTION_IDLE_TIMEOUT]);
        assert!(!a.proxy_protocol);
        let c = parse(
            &ann(&[
                (PROXY_PROTOCOL, "*"),
                (CONNECTION_DRAINING_ENABLED, "true"),
                (CONNECTION_DRAINING_TIMEOUT, "30"),
                (CONNECTION_IDLE_TIMEOUT, "120"),
            ]),
            LbKind::Classic,
        )
        .unwrap();
        assert!(c.proxy_protocol && c.ignored.is_empty());
        assert_eq!(
            (c.connection_draining, c.connection_draining_timeout, c.idle_timeout),
            (Some(true), Some(30), Some(120))
        );
        let e = parse(&ann(&[(PROXY_PROTOCOL, "yes")]), LbKind::Classic).unwrap_err();
        assert_eq!(e.annotation(), PROXY_PROTOCOL);
        assert!(e.to_string().contains("only value supported"), "{e}");
        let long = "x".repeat(MAX_VALUE_LEN + 1);
        let e = err(&[(HC_PATH, &long)]);
        assert_eq!(e.annotation(), HC_PATH);
        assert!(!e.to_string().contains("xxxx"), "the value is never quoted");
    }
}
