//! Network Load Balancers for `type: LoadBalancer` Services through ELBv2.
//!
//! Every object is created with tags naming the cluster and the Service, and only objects whose
//! tags say so are ever changed or deleted. They are found by the load balancer's name, by
//! attachment to it, and by the [`ledger`] of what a tag scan at start (and every hour) and this
//! process's own calls have seen: an ensure that died half-way leaves objects that the next
//! process's scan finds and its ensure adopts or removes, without each sync scanning them all. Each step compares what exists with what the Service asks for and
//! changes only the difference, so a sync that failed part-way resumes where it stopped.
//!
//! Objects per Service: one NLB; one target group per Service port (instance targets on the
//! nodePort, HTTP health check on kube-proxy's port 10256 `/healthz`, or on
//! `healthCheckNodePort` for `externalTrafficPolicy: Local`); one listener per port; and, unless
//! `DisableSecurityGroupIngress`, ingress rules on the Nodes' security group for the nodePorts
//! from `loadBalancerSourceRanges`, marked by their description.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_ec2::types::{Filter, IpPermission, IpRange, Ipv6Range, UserIdGroupPair};
use aws_sdk_elasticloadbalancingv2::types::{
    Action, ActionTypeEnum, Certificate, IpAddressType, LoadBalancerAttribute, LoadBalancerSchemeEnum,
    LoadBalancerTypeEnum, ProtocolEnum, Tag, TargetDescription, TargetGroupAttribute, TargetTypeEnum,
};
use k8s_openapi::api::core::v1::{LoadBalancerIngress, LoadBalancerStatus, Node, Service};

use super::AwsProvider;
use super::annotations::{self as ann, HealthPort, HealthProtocol, LbKind, NlbAnnotations};
use super::config::ClusterProbe;
use super::errors::code;
use super::instances::{InstanceInfo, InstanceKey, key_of};
use super::ledger::{self, Kind, Owner};
use ccm_framework::provider::{CloudError, CloudResult, LoadBalancer, Refusal, default_load_balancer_name};

/// Tag key prefix marking cluster ownership (`kubernetes.io/cluster/<id>`).
pub const TAG_CLUSTER_PREFIX: &str = "kubernetes.io/cluster/";
/// Tag naming the Service (`<namespace>/<name>`), as upstream.
pub const TAG_SERVICE: &str = "kubernetes.io/service-name";
/// Tag naming the Service port a target group serves.
pub const TAG_SERVICE_PORT: &str = "kubernetes.io/service-port";
/// kube-proxy's health port, checked for `externalTrafficPolicy: Cluster`.
pub const KUBE_PROXY_HEALTH_PORT: i32 = 10256;
/// Retry delay while ELBv2 still considers a target group in use.
const IN_USE_RETRY: Duration = Duration::from_secs(10);
/// Event reason (Warning, on the Service) when ELBv2 forces a new load balancer.
pub const REASON_LOAD_BALANCER_REPLACED: &str = "LoadBalancerReplaced";
/// The event's action.
const ACTION_REPLACE: &str = "ReplaceLoadBalancer";

/// The note of the [`REASON_LOAD_BALANCER_REPLACED`] event: why, and what the user sees.
pub fn replacement_note(reason: &str) -> String {
    format!(
        "the load balancer was deleted and is being made again because {reason} (ELBv2 fixes this at creation): \
         the Service gets a new hostname and open connections were dropped"
    )
}

/// One listener and its target group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DesiredPort {
    /// The Service port (the listener's port).
    pub port: i32,
    /// The target group's protocol: `TCP`, `UDP`, or `TLS` (`backend-protocol: ssl`).
    pub protocol: String,
    /// The nodePort (the targets' port).
    pub node_port: i32,
    /// The listener's TLS settings, for a TLS listener.
    pub tls: Option<ListenerTls>,
}

impl DesiredPort {
    /// The listener's protocol: `TLS` with a certificate, else the target group's.
    pub fn listener_protocol(&self) -> &str {
        if self.tls.is_some() { "TLS" } else { &self.protocol }
    }
}

/// A TLS listener's certificate and policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerTls {
    /// The certificate ARN.
    pub certificate_arn: String,
    /// The security policy (ELBv2's default when `None`).
    pub policy: Option<String>,
}

/// The target groups' health check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthSpec {
    /// `TCP`, `HTTP` or `HTTPS`.
    pub protocol: HealthProtocol,
    /// The port checked.
    pub port: HealthPort,
    /// The path (HTTP and HTTPS only).
    pub path: Option<String>,
    /// Seconds between checks.
    pub interval: i32,
    /// Seconds before a check fails.
    pub timeout: i32,
    /// Successes before healthy.
    pub healthy_threshold: i32,
    /// Failures before unhealthy.
    pub unhealthy_threshold: i32,
}

impl HealthSpec {
    /// The port as ELBv2 writes it.
    pub fn port_string(&self) -> String {
        match self.port {
            HealthPort::TrafficPort => "traffic-port".into(),
            HealthPort::Port(p) => p.to_string(),
        }
    }
}

/// The health check for a Service: kube-proxy's `/healthz` on 10256 for `Cluster`, the
/// Service's `healthCheckNodePort` for `Local` (upstream's intervals and thresholds for each),
/// then the `healthcheck-*` annotations on top.
pub fn health_spec(local: bool, health_check_node_port: i32, a: &ann::HealthCheck, probe: &ClusterProbe) -> HealthSpec {
    let mut h = if local && health_check_node_port > 0 {
        HealthSpec {
            protocol: HealthProtocol::Http,
            port: HealthPort::Port(health_check_node_port),
            path: Some("/healthz".into()),
            interval: 10,
            timeout: 10,
            healthy_threshold: 2,
            unhealthy_threshold: 2,
        }
    } else if !probe.shared {
        // Upstream's ServiceNodePort mode.
        HealthSpec {
            protocol: HealthProtocol::Tcp,
            port: HealthPort::TrafficPort,
            path: None,
            interval: 30,
            timeout: 10,
            healthy_threshold: 3,
            unhealthy_threshold: 3,
        }
    } else {
        HealthSpec {
            protocol: HealthProtocol::Http,
            port: HealthPort::Port(probe.port),
            path: Some(probe.path.clone()),
            interval: 30,
            timeout: 10,
            healthy_threshold: 3,
            unhealthy_threshold: 3,
        }
    };
    if let Some(p) = a.protocol {
        h.protocol = p;
    }
    if let Some(p) = a.port {
        h.port = p;
    }
    h.path = match h.protocol {
        HealthProtocol::Tcp => None,
        _ => a.path.clone().or(h.path),
    };
    h.interval = a.interval.unwrap_or(h.interval);
    h.timeout = a.timeout.unwrap_or(h.timeout).min(h.interval);
    h.healthy_threshold = a.healthy_threshold.unwrap_or(h.healthy_threshold);
    h.unhealthy_threshold = a.unhealthy_threshold.unwrap_or(h.unhealthy_threshold);
    h
}

/// The ports the health check reaches on the Nodes from inside the VPC, to open there: a fixed
/// port other than kube-proxy's shared one (opened once by the cluster's owner), or the
/// nodePorts for `traffic-port`.
pub fn health_rule_ports(d: &Desired) -> BTreeSet<(String, i32)> {
    match d.health.port {
        HealthPort::Port(p) if Some(p) == d.shared_probe_port || p == KUBE_PROXY_HEALTH_PORT => BTreeSet::new(),
        HealthPort::Port(p) => [("tcp".to_string(), p)].into(),
        HealthPort::TrafficPort => d.ports.iter().map(|p| ("tcp".to_string(), p.node_port)).collect(),
    }
}

/// Whether a Node is a target: it carries every `target-node-labels` label (and value).
pub fn node_selected(node: &Node, labels: &BTreeMap<String, Option<String>>) -> bool {
    let have = node.metadata.labels.as_ref();
    labels.iter().all(|(k, v)| match (have.and_then(|l| l.get(k)), v) {
        (Some(_), None) => true,
        (Some(actual), Some(want)) => actual == want,
        (None, _) => false,
    })
}

/// The load-balancer attributes the annotations manage, with their values when absent.
pub fn lb_attributes(a: &NlbAnnotations) -> BTreeMap<&'static str, String> {
    let mut out = BTreeMap::from([
        ("load_balancing.cross_zone.enabled", a.cross_zone.unwrap_or(false).to_string()),
        ("access_logs.s3.enabled", "false".to_string()),
    ]);
    if let Some(log) = &a.access_log {
        out.insert("access_logs.s3.enabled", log.enabled.to_string());
        if log.enabled {
            out.insert("access_logs.s3.bucket", log.bucket.clone());
            out.insert("access_logs.s3.prefix", log.prefix.clone());
        }
    }
    out
}

/// The target-group attributes the annotations manage, with ELBv2's values for instance
/// targets when absent.
pub fn tg_attributes(a: &NlbAnnotations) -> BTreeMap<&'static str, String> {
    let t = &a.target_group_attributes;
    BTreeMap::from([
        ("preserve_client_ip.enabled", t.preserve_client_ip.unwrap_or(true).to_string()),
        ("proxy_protocol_v2.enabled", t.proxy_protocol_v2.unwrap_or(false).to_string()),
    ])
}

/// The attributes in `want` whose value differs from `have`.
pub fn attribute_changes(
    want: &BTreeMap<&'static str, String>,
    have: &BTreeMap<String, String>,
) -> Vec<(&'static str, String)> {
    want.iter().filter(|(k, v)| have.get(**k) != Some(*v)).map(|(k, v)| (*k, v.clone())).collect()
}

/// What a Service asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Desired {
    /// The load balancer's name.
    pub name: String,
    /// `internal` or `internet-facing`.
    pub internal: bool,
    /// Subnets from the annotation, if given.
    pub subnets: Vec<String>,
    /// Listeners.
    pub ports: Vec<DesiredPort>,
    /// The health check of every target group.
    pub health: HealthSpec,
    /// The shared cluster probe's port, when the health check uses it (opened once by the
    /// cluster's owner, not per Service).
    pub shared_probe_port: Option<i32>,
    /// Client CIDRs (IPv4) allowed to the nodePorts.
    pub source_ranges: Vec<String>,
    /// Tags on every object.
    pub tags: BTreeMap<String, String>,
    /// Every annotation, parsed and validated.
    pub annotations: NlbAnnotations,
    /// `ipv4`, or `dualstack` when the Service's `ipFamilies` include IPv6.
    pub ip_address_type: &'static str,
}

/// The NLB's IP address type for the Service's families: `dualstack` with IPv6 (an NLB with
/// instance targets serves IPv6 clients that way; IPv6-only NLBs do not exist), else `ipv4`.
pub fn ip_address_type(spec: &k8s_openapi::api::core::v1::ServiceSpec) -> &'static str {
    if spec.ip_families.iter().flatten().any(|f| f == "IPv6") { "dualstack" } else { "ipv4" }
}

/// Whether the Service's load balancer belongs to another controller.
pub fn implemented_elsewhere(service: &Service) -> bool {
    ann::kind(service) == Ok(LbKind::Elsewhere)
}

/// `<namespace>/<name>`.
pub fn service_key(service: &Service) -> String {
    format!(
        "{}/{}",
        service.metadata.namespace.as_deref().unwrap_or("default"),
        service.metadata.name.as_deref().unwrap_or_default()
    )
}

/// The ownership tags of a Service's objects.
pub fn ownership_tags(cluster_id: &str, service: &Service) -> BTreeMap<String, String> {
    BTreeMap::from([
        (format!("{TAG_CLUSTER_PREFIX}{cluster_id}"), "owned".to_string()),
        (TAG_SERVICE.to_string(), service_key(service)),
    ])
}

/// Whether `tags` mark an object of this cluster and Service.
pub fn owned_by(tags: &BTreeMap<String, String>, cluster_id: &str, service: &Service) -> bool {
    tags.contains_key(&format!("{TAG_CLUSTER_PREFIX}{cluster_id}"))
        && tags.get(TAG_SERVICE).is_some_and(|v| *v == service_key(service))
}

/// The description marking our security-group rules for a load balancer.
pub fn rule_description(lb_name: &str) -> String {
    format!("kubernetes.io/rule/nlb/client={lb_name}")
}

/// The description marking our health-check rules for a load balancer.
pub fn health_rule_description(lb_name: &str) -> String {
    format!("kubernetes.io/rule/nlb/health={lb_name}")
}

/// A target group name (at most 32 characters, stable for the same port mapping).
pub fn target_group_name(lb_name: &str, port: &DesiredPort) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in format!("{lb_name}/{}/{}/{}", port.port, port.protocol, port.node_port).bytes() {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("k8s-{:05}-{:016x}", port.port.clamp(0, 99_999), hash)
}

/// A bad annotation as the Service's refusal: `InvalidAnnotation`, or `UnsupportedService` for
/// a Service that would get a Classic Load Balancer.
pub fn refused_annotation(e: ann::AnnotationError) -> CloudError {
    let reason = match e {
        ann::AnnotationError::ClassicRefused => Refusal::UnsupportedService,
        _ => Refusal::InvalidAnnotation,
    };
    CloudError::refused(reason, e.to_string())
}

/// What the Service asks for with the default cluster health probe.
pub fn desired(service: &Service, cluster_id: &str) -> Result<Desired, CloudError> {
    desired_with(service, cluster_id, &ClusterProbe::default())
}

/// What the Service asks for, or why it cannot be served.
pub fn desired_with(service: &Service, cluster_id: &str, probe: &ClusterProbe) -> Result<Desired, CloudError> {
    let spec = service.spec.as_ref().ok_or_else(|| CloudError::Other("the Service has no spec".into()))?;
    let empty = BTreeMap::new();
    let annotations =
        ann::parse(service.metadata.annotations.as_ref().unwrap_or(&empty)).map_err(refused_annotation)?;
    let mut ports = Vec::new();
    for p in spec.ports.iter().flatten() {
        let protocol = p.protocol.clone().unwrap_or_else(|| "TCP".into());
        if protocol != "TCP" && protocol != "UDP" {
            return Err(CloudError::refused(
                Refusal::UnsupportedService,
                format!("port {}: protocol {protocol} is not supported by Network Load Balancers here", p.port),
            ));
        }
        let node_port = p.node_port.unwrap_or(0);
        if node_port == 0 {
            return Err(CloudError::Other(format!("port {} has no nodePort yet", p.port)));
        }
        if ports.iter().any(|d: &DesiredPort| d.port == p.port) {
            return Err(CloudError::refused(
                Refusal::UnsupportedService,
                format!("port {} is used by two protocols; TCP_UDP listeners are not supported", p.port),
            ));
        }
        // TLS for the TCP ports `ssl-ports` names, as upstream.
        let tls = annotations.tls.as_ref().filter(|t| protocol == "TCP" && t.ports.covers(p.port, p.name.as_deref()));
        let target_protocol = if tls.is_some_and(|t| t.backend_tls) { "TLS".to_string() } else { protocol };
        ports.push(DesiredPort {
            port: p.port,
            protocol: target_protocol,
            node_port,
            tls: tls.map(|t| ListenerTls { certificate_arn: t.certificate_arn.clone(), policy: t.policy.clone() }),
        });
    }
    if ports.is_empty() {
        return Err(CloudError::refused(Refusal::UnsupportedService, "the Service has no ports"));
    }
    let local = spec.external_traffic_policy.as_deref() == Some("Local");
    let health = health_spec(local, spec.health_check_node_port.unwrap_or(0), &annotations.health, probe);
    // The spec wins over the annotation, as upstream. IPv6 ranges count on a dual-stack load
    // balancer only (an IPv4 one has no IPv6 clients).
    let dual = ip_address_type(spec) == "dualstack";
    let mut nets: Vec<ipnet::IpNet> = Vec::new();
    for r in spec.load_balancer_source_ranges.iter().flatten().map(|r| r.trim()).filter(|r| !r.is_empty()) {
        let net = r.parse::<ipnet::IpNet>().map_err(|_| {
            CloudError::refused(
                Refusal::UnsupportedService,
                format!("spec.loadBalancerSourceRanges: {r:?} is not a CIDR"),
            )
        })?;
        nets.push(net.trunc());
    }
    if nets.is_empty() {
        nets = annotations.source_ranges.clone();
    }
    let mut source_ranges: Vec<String> =
        nets.iter().filter(|n| dual || matches!(n, ipnet::IpNet::V4(_))).map(|n| n.to_string()).collect();
    if source_ranges.is_empty() {
        source_ranges.push("0.0.0.0/0".into());
        if dual {
            source_ranges.push("::/0".into());
        }
    }
    source_ranges.sort();
    source_ranges.dedup();
    let mut tags = ownership_tags(cluster_id, service);
    for (k, v) in &annotations.extra_tags {
        tags.insert(k.clone(), v.clone());
    }
    Ok(Desired {
        name: default_load_balancer_name(service),
        internal: annotations.internal,
        subnets: annotations.subnets.clone(),
        ports,
        health,
        source_ranges,
        tags,
        annotations,
        ip_address_type: ip_address_type(spec),
        shared_probe_port: (!local && probe.shared).then_some(probe.port),
    })
}

/// A security-group rule: (group, protocol, port, source, description); the source is a CIDR
/// or, for a rule that admits a security group's members, that group's ID (`sg-…`).
type Rule = (String, String, i32, String, String);

/// Whether a rule's source is a security group rather than a CIDR.
pub fn source_is_group(source: &str) -> bool {
    source.starts_with("sg-")
}

/// The Nodes' ingress rules for a Service, on each of `node_groups`. Without a load-balancer
/// group, the client CIDRs reach the nodePorts and the VPC's CIDRs the health-check ports (the
/// NLB keeps the client's address). With one (`NLBSecurityGroupMode = Managed`), the NLB's
/// group is the one source of both, as upstream and AWS recommend: only traffic that passed
/// the load balancer's own rules reaches the Nodes.
pub fn node_rules(
    desired: &Desired,
    node_groups: &[String],
    lb_group: Option<&str>,
    vpc_cidrs: &[String],
) -> BTreeSet<Rule> {
    let client = rule_description(&desired.name);
    let health = health_rule_description(&desired.name);
    let client_sources: Vec<String> = match lb_group {
        Some(g) => vec![g.to_string()],
        None => desired.source_ranges.clone(),
    };
    let health_sources: Vec<String> = match lb_group {
        Some(g) => vec![g.to_string()],
        None => vpc_cidrs.to_vec(),
    };
    let mut out = BTreeSet::new();
    for g in node_groups {
        for p in &desired.ports {
            // EC2 knows tcp and udp; a TLS target group is TCP underneath.
            let proto = if p.protocol == "UDP" { "udp" } else { "tcp" };
            for src in &client_sources {
                out.insert((g.clone(), proto.to_string(), p.node_port, src.clone(), client.clone()));
            }
        }
        for (proto, port) in health_rule_ports(desired) {
            for src in &health_sources {
                out.insert((g.clone(), proto.clone(), port, src.clone(), health.clone()));
            }
        }
    }
    out
}

/// The rules to add and to remove, given the wanted and the existing ones.
pub fn rule_diff(want: &BTreeSet<Rule>, have: &BTreeSet<Rule>) -> (Vec<Rule>, Vec<Rule>) {
    (want.difference(have).cloned().collect(), have.difference(want).cloned().collect())
}

#[derive(Debug, Clone)]
struct LbInfo {
    arn: String,
    dns: String,
    internal: bool,
    created: Option<f64>,
    ip_address_type: String,
    /// The [`TAG_ADDRESSES`] tag; `None` on a load balancer made before it (or by upstream).
    addresses: Option<String>,
    security_groups: BTreeSet<String>,
}

/// Tag recording which fixed addresses (`eip-allocations`, `private-ipv4-addresses`) the load
/// balancer was created with: ELBv2 cannot change them in place, so a change replaces it.
pub const TAG_ADDRESSES: &str = "kubernetes.io/service-load-balancer-addresses";

/// The [`TAG_ADDRESSES`] value for the annotations: "" without fixed addresses, else a
/// fingerprint of them (a tag value holds 256 characters; the lists may be longer).
pub fn addresses_fingerprint(a: &NlbAnnotations) -> String {
    if a.eip_allocations.is_empty() && a.private_ipv4.is_empty() {
        return String::new();
    }
    let text = format!("{:?}/{:?}", a.eip_allocations, a.private_ipv4);
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{hash:016x}")
}

/// The security groups of the load balancer: the annotations' and the managed one, if any.
pub fn wanted_security_groups(a: &NlbAnnotations, managed: Option<&str>) -> BTreeSet<String> {
    a.security_groups.iter().chain(a.extra_security_groups.iter()).cloned().chain(managed.map(str::to_string)).collect()
}

/// Whether the load balancer gets a managed security group: `NLBSecurityGroupMode = Managed`
/// and no `security-groups` annotation (which replaces every other group, as upstream).
pub fn wants_managed_group(managed_mode: bool, a: &NlbAnnotations) -> bool {
    managed_mode && a.security_groups.is_empty()
}

/// Tag marking a security group made for one NLB in `NLBSecurityGroupMode = Managed` (upstream's
/// key), besides the cluster and Service ownership tags.
pub const TAG_SG_MODE: &str = "kubernetes.io/cloud-provider-aws/NLBSecurityGroupMode";

/// The name of an NLB's managed security group.
pub fn managed_group_name(lb_name: &str) -> String {
    format!("k8s-nlb-{lb_name}")
}

/// Why an existing load balancer must be replaced (ELBv2 fixes these at creation), if it must.
pub fn replacement_reason(
    have_internal: bool,
    have_addresses: Option<&str>,
    have_security_groups: &BTreeSet<String>,
    want_security_groups: bool,
    desired: &Desired,
) -> Option<String> {
    let a = &desired.annotations;
    if have_internal != desired.internal {
        return Some(format!("{} changed the scheme", ann::INTERNAL));
    }
    // Without the tag (made before it, or adopted from upstream) the addresses are taken as
    // they are, and the tag is written.
    if have_addresses.is_some_and(|h| h != addresses_fingerprint(a)) {
        return Some(format!("{} or {} changed", ann::EIP_ALLOCATIONS, ann::PRIVATE_IPV4));
    }
    if have_security_groups.is_empty() == want_security_groups {
        return Some(format!(
            "{} / {} added to or removed from a load balancer (an NLB keeps or lacks security groups for life)",
            ann::SECURITY_GROUPS,
            ann::EXTRA_SECURITY_GROUPS
        ));
    }
    None
}

/// The `subnets` annotation as IDs: IDs as given, each name (`Name` tag) by the one subnet of
/// the VPC that carries it (`found`: (ID, name)).
pub fn resolve_subnets(requested: &[String], found: &[(String, String)]) -> Result<Vec<String>, ann::AnnotationError> {
    let mut out = Vec::new();
    for item in requested {
        if item.starts_with("subnet-") {
            out.push(item.clone());
            continue;
        }
        let ids: Vec<&String> = found.iter().filter(|(_, n)| n == item).map(|(id, _)| id).collect();
        match ids.as_slice() {
            [id] => out.push((*id).clone()),
            [] => {
                return Err(ann::AnnotationError::Conflict {
                    annotation: ann::SUBNETS,
                    reason: format!("no subnet of the VPC is named {item:?}"),
                });
            }
            _ => {
                return Err(ann::AnnotationError::Conflict {
                    annotation: ann::SUBNETS,
                    reason: format!("{} subnets of the VPC are named {item:?}; give the ID", ids.len()),
                });
            }
        }
    }
    out.dedup();
    Ok(out)
}

/// A subnet of the load balancer and the fixed address it gets there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubnetMapping {
    /// The subnet ID.
    pub subnet: String,
    /// An Elastic IP allocation (internet-facing).
    pub allocation_id: Option<String>,
    /// A private IPv4 address inside the subnet (internal).
    pub private_ipv4: Option<std::net::Ipv4Addr>,
}

/// Pair the subnets with the annotations' addresses: Elastic IPs in order, one per subnet;
/// private addresses by the subnet whose CIDR holds them, one per subnet.
pub fn subnet_mappings(
    subnets: &[(String, Option<ipnet::Ipv4Net>)],
    a: &NlbAnnotations,
) -> Result<Vec<SubnetMapping>, ann::AnnotationError> {
    let mut out: Vec<SubnetMapping> = subnets
        .iter()
        .map(|(id, _)| SubnetMapping { subnet: id.clone(), allocation_id: None, private_ipv4: None })
        .collect();
    if !a.eip_allocations.is_empty() {
        if a.eip_allocations.len() != subnets.len() {
            return Err(ann::AnnotationError::Conflict {
                annotation: ann::EIP_ALLOCATIONS,
                reason: format!("one per subnet: {} given for {} subnets", a.eip_allocations.len(), subnets.len()),
            });
        }
        for (m, e) in out.iter_mut().zip(&a.eip_allocations) {
            m.allocation_id = Some(e.clone());
        }
    }
    if !a.private_ipv4.is_empty() {
        if a.private_ipv4.len() != subnets.len() {
            return Err(ann::AnnotationError::Conflict {
                annotation: ann::PRIVATE_IPV4,
                reason: format!("one per subnet: {} given for {} subnets", a.private_ipv4.len(), subnets.len()),
            });
        }
        for ip in &a.private_ipv4 {
            let slot = subnets
                .iter()
                .position(|(_, cidr)| cidr.is_some_and(|c| c.contains(ip)))
                .filter(|i| out[*i].private_ipv4.is_none())
                .ok_or_else(|| ann::AnnotationError::Conflict {
                    annotation: ann::PRIVATE_IPV4,
                    reason: format!("{ip} is not inside a subnet of the load balancer that has no address yet"),
                })?;
            out[slot].private_ipv4 = Some(*ip);
        }
    }
    Ok(out)
}

#[derive(Debug, Clone)]
struct TgInfo {
    arn: String,
    protocol: String,
    port: i32,
    health_port: String,
    health_path: String,
    health_protocol: String,
    /// (interval, timeout, healthy, unhealthy).
    health_timing: (i32, i32, i32, i32),
    lb_arns: Vec<String>,
}

/// A TLS listener's certificate, as ELBv2 takes it.
fn listener_certificates(p: &DesiredPort) -> Option<Vec<Certificate>> {
    p.tls.as_ref().map(|t| vec![Certificate::builder().certificate_arn(&t.certificate_arn).build()])
}

/// The ledger's owner for the Service's objects.
fn owner(cluster_id: &str, service: &Service) -> Owner {
    Owner { cluster: cluster_id.to_string(), service: service_key(service) }
}

/// A network load balancer as the sync compares it; `None` for other types.
fn lb_info(lb: &aws_sdk_elasticloadbalancingv2::types::LoadBalancer) -> Option<LbInfo> {
    if lb.r#type().is_some_and(|t| *t != LoadBalancerTypeEnum::Network) {
        return None;
    }
    Some(LbInfo {
        arn: lb.load_balancer_arn().unwrap_or_default().to_string(),
        dns: lb.dns_name().unwrap_or_default().to_string(),
        internal: lb.scheme().is_some_and(|s| *s == LoadBalancerSchemeEnum::Internal),
        created: lb.created_time().map(|t| t.as_secs_f64()),
        ip_address_type: lb.ip_address_type().map(|t| t.as_str().to_string()).unwrap_or_default(),
        addresses: None,
        security_groups: lb.security_groups().iter().cloned().collect(),
    })
}

/// A target group as the sync compares it.
fn tg_info(tg: &aws_sdk_elasticloadbalancingv2::types::TargetGroup) -> TgInfo {
    TgInfo {
        arn: tg.target_group_arn().unwrap_or_default().to_string(),
        protocol: tg.protocol().map(|p| p.as_str().to_string()).unwrap_or_default(),
        port: tg.port().unwrap_or_default(),
        health_port: tg.health_check_port().unwrap_or_default().to_string(),
        health_path: tg.health_check_path().unwrap_or_default().to_string(),
        health_protocol: tg.health_check_protocol().map(|p| p.as_str().to_string()).unwrap_or_default(),
        health_timing: (
            tg.health_check_interval_seconds().unwrap_or_default(),
            tg.health_check_timeout_seconds().unwrap_or_default(),
            tg.healthy_threshold_count().unwrap_or_default(),
            tg.unhealthy_threshold_count().unwrap_or_default(),
        ),
        lb_arns: tg.load_balancer_arns().to_vec(),
    }
}

fn to_tags(tags: &BTreeMap<String, String>) -> Vec<Tag> {
    tags.iter().map(|(k, v)| Tag::builder().key(k).value(v).build()).collect()
}

impl AwsProvider {
    fn elb_err<E>(
        &self,
        op: &str,
    ) -> impl Fn(aws_sdk_ec2::error::SdkError<E, aws_sdk_ec2::config::http::HttpResponse>) -> CloudError + '_
    where
        E: aws_sdk_ec2::error::ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    {
        let op = op.to_string();
        move |e| self.classify(&op, e)
    }

    /// Tags of ELBv2 resources, 20 ARNs per call.
    async fn elb_tags(&self, arns: &[String]) -> CloudResult<BTreeMap<String, BTreeMap<String, String>>> {
        let elb = &self.clients().await?.elb;
        let mut out = BTreeMap::new();
        for chunk in arns.chunks(20) {
            let r = elb
                .describe_tags()
                .set_resource_arns(Some(chunk.to_vec()))
                .send()
                .await
                .map_err(self.elb_err("DescribeTags"))?;
            for d in r.tag_descriptions() {
                let tags = d
                    .tags()
                    .iter()
                    .map(|t| (t.key().unwrap_or_default().to_string(), t.value().unwrap_or_default().to_string()))
                    .collect();
                out.insert(d.resource_arn().unwrap_or_default().to_string(), tags);
            }
        }
        Ok(out)
    }

    /// Every network load balancer of the account, one page of 400 per call.
    async fn all_lbs(&self) -> CloudResult<Vec<LbInfo>> {
        let elb = &self.clients().await?.elb;
        let mut all = Vec::new();
        let mut marker: Option<String> = None;
        loop {
            let page = elb
                .describe_load_balancers()
                .set_marker(marker.take())
                .page_size(400)
                .send()
                .await
                .map_err(self.elb_err("DescribeLoadBalancers"))?;
            all.extend(page.load_balancers().iter().filter_map(lb_info));
            match page.next_marker().filter(|m| !m.is_empty()) {
                Some(m) => marker = Some(m.to_string()),
                None => break,
            }
        }
        Ok(all)
    }

    /// Every target group of the account, one page of 400 per call.
    async fn all_tgs(&self) -> CloudResult<Vec<TgInfo>> {
        let elb = &self.clients().await?.elb;
        let mut all = Vec::new();
        let mut marker: Option<String> = None;
        loop {
            let page = elb
                .describe_target_groups()
                .set_marker(marker.take())
                .page_size(400)
                .send()
                .await
                .map_err(self.elb_err("DescribeTargetGroups"))?;
            all.extend(page.target_groups().iter().map(tg_info));
            match page.next_marker().filter(|m| !m.is_empty()) {
                Some(m) => marker = Some(m.to_string()),
                None => break,
            }
        }
        Ok(all)
    }

    /// Learn every owned load balancer and target group by their tags, when a scan is due
    /// (first use, then every [`ledger::RESCAN`]); concurrent syncs share one scan.
    async fn learn(&self) -> CloudResult<()> {
        if !self.ledger.scan_due(std::time::Instant::now(), ledger::RESCAN) {
            return Ok(());
        }
        let _one = self.ledger_scan.lock().await;
        let started = std::time::Instant::now();
        if !self.ledger.scan_due(started, ledger::RESCAN) {
            return Ok(());
        }
        let lbs: Vec<String> = self.all_lbs().await?.into_iter().map(|l| l.arn).collect();
        let tgs: Vec<String> = self.all_tgs().await?.into_iter().map(|t| t.arn).collect();
        for (kind, arns) in [(Kind::LoadBalancer, lbs), (Kind::TargetGroup, tgs)] {
            for (arn, tags) in self.elb_tags(&arns).await? {
                for owner in Owner::from_tags(&tags, TAG_CLUSTER_PREFIX, TAG_SERVICE) {
                    self.ledger.add(kind, &owner, &arn);
                }
            }
        }
        self.ledger.scanned(started);
        tracing::debug!(objects = self.ledger.len(), "learnt the cluster's ELBv2 objects from their tags");
        Ok(())
    }

    /// Load balancers of the Service, oldest first: the one with its name and any other the
    /// ledger knows, kept only where their tags name this cluster and Service.
    async fn owned_lbs(&self, cluster_id: &str, service: &Service) -> CloudResult<Vec<LbInfo>> {
        self.learn().await?;
        let owner = owner(cluster_id, service);
        let elb = &self.clients().await?.elb;
        let mut found: Vec<LbInfo> =
            match elb.describe_load_balancers().names(default_load_balancer_name(service)).send().await {
                Ok(r) => r.load_balancers().iter().filter_map(lb_info).collect(),
                Err(e) if code(&e) == Some("LoadBalancerNotFound") => Vec::new(),
                Err(e) => return Err(self.classify("DescribeLoadBalancers", e)),
            };
        // Known by the ledger under another name (an older UID's, or one made by hand): each
        // on its own, as one missing ARN fails a call for several.
        for arn in self.ledger.get(Kind::LoadBalancer, &owner) {
            if found.iter().any(|l| l.arn == arn) {
                continue;
            }
            match elb.describe_load_balancers().load_balancer_arns(&arn).send().await {
                Ok(r) => found.extend(r.load_balancers().iter().filter_map(lb_info)),
                Err(e) if code(&e) == Some("LoadBalancerNotFound") => {
                    self.ledger.remove(Kind::LoadBalancer, &owner, &arn);
                }
                Err(e) => return Err(self.classify("DescribeLoadBalancers", e)),
            }
        }
        let arns: Vec<String> = found.iter().map(|l| l.arn.clone()).collect();
        let tags = self.elb_tags(&arns).await?;
        let mut mine = Vec::new();
        for mut l in found {
            if tags.get(&l.arn).is_some_and(|t| owned_by(t, cluster_id, service)) {
                self.ledger.add(Kind::LoadBalancer, &owner, &l.arn);
                l.addresses = tags.get(&l.arn).and_then(|t| t.get(TAG_ADDRESSES)).cloned();
                mine.push(l);
            } else {
                self.ledger.remove(Kind::LoadBalancer, &owner, &l.arn);
            }
        }
        mine.sort_by(|a, b| {
            a.created.partial_cmp(&b.created).unwrap_or(std::cmp::Ordering::Equal).then(a.arn.cmp(&b.arn))
        });
        Ok(mine)
    }

    /// Target groups of the Service: those attached to its load balancers `lbs` and any other
    /// the ledger knows (made before a crash, or detached from a replaced load balancer).
    async fn owned_tgs(&self, cluster_id: &str, service: &Service, lbs: &[&str]) -> CloudResult<Vec<TgInfo>> {
        self.learn().await?;
        let owner = owner(cluster_id, service);
        let elb = &self.clients().await?.elb;
        let mut found: Vec<TgInfo> = Vec::new();
        for lb in lbs {
            match elb.describe_target_groups().load_balancer_arn(*lb).send().await {
                Ok(r) => found.extend(r.target_groups().iter().map(tg_info)),
                Err(e) if matches!(code(&e), Some("TargetGroupNotFound" | "LoadBalancerNotFound")) => {}
                Err(e) => return Err(self.classify("DescribeTargetGroups", e)),
            }
        }
        let known: Vec<String> = self
            .ledger
            .get(Kind::TargetGroup, &owner)
            .into_iter()
            .filter(|a| !found.iter().any(|t| t.arn == *a))
            .collect();
        for chunk in known.chunks(20) {
            match elb.describe_target_groups().set_target_group_arns(Some(chunk.to_vec())).send().await {
                Ok(r) => found.extend(r.target_groups().iter().map(tg_info)),
                // One is gone: ask for each to learn which.
                Err(e) if code(&e) == Some("TargetGroupNotFound") => {
                    for arn in chunk {
                        match elb.describe_target_groups().target_group_arns(arn).send().await {
                            Ok(r) => found.extend(r.target_groups().iter().map(tg_info)),
                            Err(e) if code(&e) == Some("TargetGroupNotFound") => {
                                self.ledger.remove(Kind::TargetGroup, &owner, arn);
                            }
                            Err(e) => return Err(self.classify("DescribeTargetGroups", e)),
                        }
                    }
                }
                Err(e) => return Err(self.classify("DescribeTargetGroups", e)),
            }
        }
        found.sort_by(|a, b| a.arn.cmp(&b.arn));
        found.dedup_by(|a, b| a.arn == b.arn);
        for t in &found {
            self.ledger.add(Kind::TargetGroup, &owner, &t.arn);
        }
        Ok(found)
    }

    /// The instances behind `nodes` that can be targets (not terminated).
    async fn node_instances(&self, nodes: &[&Node]) -> CloudResult<Vec<Arc<InstanceInfo>>> {
        let keys: Vec<InstanceKey> = nodes.iter().filter_map(|n| key_of(n).ok()).collect();
        let found = self.lookup(&keys).await?;
        let mut out: Vec<Arc<InstanceInfo>> = found.into_iter().flatten().filter(|i| !i.is_terminated()).collect();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        out.dedup_by(|a, b| a.id == b.id);
        Ok(out)
    }

    /// The VPC: the config's, or the Nodes' instances'.
    fn vpc_of(&self, instances: &[Arc<InstanceInfo>]) -> Option<String> {
        if !self.config.vpc.is_empty() {
            return Some(self.config.vpc.clone());
        }
        instances.iter().map(|i| i.vpc_id.clone()).find(|v| !v.is_empty())
    }

    /// Subnets for a new load balancer: the annotation's, else one per zone of the VPC, preferring
    /// cluster-tagged subnets and the `kubernetes.io/role/elb` (or `internal-elb`) role tag, else
    /// the config's SubnetID.
    async fn subnets_for(&self, desired: &Desired, vpc: &str, cluster_id: &str) -> CloudResult<Vec<String>> {
        let ec2 = &self.clients().await?.ec2;
        if !desired.subnets.is_empty() {
            let names: Vec<String> = desired.subnets.iter().filter(|s| !s.starts_with("subnet-")).cloned().collect();
            let mut found = Vec::new();
            if !names.is_empty() {
                let r = ec2
                    .describe_subnets()
                    .filters(Filter::builder().name("vpc-id").values(vpc).build())
                    .filters(Filter::builder().name("tag:Name").set_values(Some(names)).build())
                    .send()
                    .await
                    .map_err(self.elb_err("DescribeSubnets"))?;
                for sn in r.subnets() {
                    let name = sn.tags().iter().find(|t| t.key() == Some("Name")).and_then(|t| t.value());
                    if let (Some(id), Some(name)) = (sn.subnet_id(), name) {
                        found.push((id.to_string(), name.to_string()));
                    }
                }
            }
            return resolve_subnets(&desired.subnets, &found).map_err(refused_annotation);
        }
        let r = ec2
            .describe_subnets()
            .filters(Filter::builder().name("vpc-id").values(vpc).build())
            .send()
            .await
            .map_err(self.elb_err("DescribeSubnets"))?;
        let role = if desired.internal { "kubernetes.io/role/internal-elb" } else { "kubernetes.io/role/elb" };
        let cluster_key = format!("{TAG_CLUSTER_PREFIX}{cluster_id}");
        let subnets: Vec<(String, String, bool, bool)> = r
            .subnets()
            .iter()
            .map(|s| {
                let has = |k: &str| s.tags().iter().any(|t| t.key() == Some(k));
                (
                    s.availability_zone().unwrap_or_default().to_string(),
                    s.subnet_id().unwrap_or_default().to_string(),
                    has(&cluster_key),
                    has(role),
                )
            })
            .collect();
        let any_tagged = subnets.iter().any(|s| s.2);
        let mut by_zone: BTreeMap<String, (bool, String)> = BTreeMap::new();
        for (zone, id, tagged, has_role) in subnets {
            if any_tagged && !tagged {
                continue;
            }
            let better = match by_zone.get(&zone) {
                None => true,
                Some((role_before, id_before)) => {
                    (has_role && !role_before) || (has_role == *role_before && id < *id_before)
                }
            };
            if better {
                by_zone.insert(zone, (has_role, id));
            }
        }
        let mut ids: Vec<String> = by_zone.into_values().map(|(_, id)| id).collect();
        if ids.is_empty() && !self.config.subnet_id.is_empty() {
            ids.push(self.config.subnet_id.clone());
        }
        if ids.is_empty() {
            return Err(CloudError::Other(format!(
                "no subnet found for the load balancer in VPC {vpc}; tag subnets with {role} or set the {} annotation",
                ann::SUBNETS
            )));
        }
        Ok(ids)
    }

    /// The subnets of a new load balancer with their fixed addresses; read-only, so a bad
    /// pairing is found before anything changes.
    async fn plan_subnets(&self, desired: &Desired, vpc: &str, cluster_id: &str) -> CloudResult<Vec<SubnetMapping>> {
        let ids = self.subnets_for(desired, vpc, cluster_id).await?;
        let mut cidrs: BTreeMap<String, ipnet::Ipv4Net> = BTreeMap::new();
        if !desired.annotations.private_ipv4.is_empty() {
            let ec2 = &self.clients().await?.ec2;
            let r = ec2
                .describe_subnets()
                .set_subnet_ids(Some(ids.clone()))
                .send()
                .await
                .map_err(self.elb_err("DescribeSubnets"))?;
            for sn in r.subnets() {
                if let (Some(id), Some(Ok(c))) = (sn.subnet_id(), sn.cidr_block().map(|c| c.parse::<ipnet::Ipv4Net>()))
                {
                    cidrs.insert(id.to_string(), c);
                }
            }
        }
        let with_cidrs: Vec<(String, Option<ipnet::Ipv4Net>)> =
            ids.into_iter().map(|id| (id.clone(), cidrs.get(&id).copied())).collect();
        subnet_mappings(&with_cidrs, &desired.annotations).map_err(refused_annotation)
    }

    async fn create_lb(
        &self,
        desired: &Desired,
        subnets: Vec<SubnetMapping>,
        groups: BTreeSet<String>,
    ) -> CloudResult<LbInfo> {
        let elb = &self.clients().await?.elb;
        let scheme =
            if desired.internal { LoadBalancerSchemeEnum::Internal } else { LoadBalancerSchemeEnum::InternetFacing };
        let mappings = subnets
            .iter()
            .map(|m| {
                aws_sdk_elasticloadbalancingv2::types::SubnetMapping::builder()
                    .subnet_id(&m.subnet)
                    .set_allocation_id(m.allocation_id.clone())
                    .set_private_ipv4_address(m.private_ipv4.map(|ip| ip.to_string()))
                    .build()
            })
            .collect();
        let mut tags = desired.tags.clone();
        let addresses = addresses_fingerprint(&desired.annotations);
        tags.insert(TAG_ADDRESSES.to_string(), addresses.clone());
        let r = elb
            .create_load_balancer()
            .name(&desired.name)
            .r#type(LoadBalancerTypeEnum::Network)
            .scheme(scheme)
            .set_subnet_mappings(Some(mappings))
            .ip_address_type(IpAddressType::from(desired.ip_address_type))
            .set_security_groups((!groups.is_empty()).then(|| groups.iter().cloned().collect()))
            .set_tags(Some(to_tags(&tags)))
            .send()
            .await
            .map_err(self.elb_err("CreateLoadBalancer"))?;
        let lb = r
            .load_balancers()
            .first()
            .ok_or_else(|| CloudError::Other("CreateLoadBalancer returned nothing".into()))?;
        tracing::info!(name = %desired.name, "created network load balancer");
        let arn = lb.load_balancer_arn().unwrap_or_default().to_string();
        self.remember(Kind::LoadBalancer, desired, &arn);
        Ok(LbInfo {
            arn,
            dns: lb.dns_name().unwrap_or_default().to_string(),
            internal: desired.internal,
            created: None,
            ip_address_type: desired.ip_address_type.to_string(),
            addresses: Some(addresses),
            security_groups: groups,
        })
    }

    async fn delete_lb(&self, arn: &str) -> CloudResult<()> {
        let elb = &self.clients().await?.elb;
        match elb.delete_load_balancer().load_balancer_arn(arn).send().await {
            Ok(_) => {}
            Err(e) if code(&e) == Some("LoadBalancerNotFound") => {}
            Err(e) => return Err(self.classify("DeleteLoadBalancer", e)),
        }
        self.ledger.forget(Kind::LoadBalancer, arn);
        Ok(())
    }

    /// Remember an object just made for `desired`'s Service.
    fn remember(&self, kind: Kind, desired: &Desired, arn: &str) {
        for owner in Owner::from_tags(&desired.tags, TAG_CLUSTER_PREFIX, TAG_SERVICE) {
            self.ledger.add(kind, &owner, arn);
        }
    }

    /// Delete a target group; `Ok(false)` while ELBv2 still has it in use.
    async fn delete_tg(&self, arn: &str) -> CloudResult<bool> {
        let elb = &self.clients().await?.elb;
        match elb.delete_target_group().target_group_arn(arn).send().await {
            Ok(_) => {
                self.ledger.forget(Kind::TargetGroup, arn);
                Ok(true)
            }
            Err(e) if code(&e) == Some("TargetGroupNotFound") => {
                self.ledger.forget(Kind::TargetGroup, arn);
                Ok(true)
            }
            Err(e) if code(&e) == Some("ResourceInUse") => Ok(false),
            Err(e) => Err(self.classify("DeleteTargetGroup", e)),
        }
    }

    async fn ensure_tg(
        &self,
        desired: &Desired,
        port: &DesiredPort,
        vpc: &str,
        existing: &[TgInfo],
    ) -> CloudResult<String> {
        let elb = &self.clients().await?.elb;
        let h = &desired.health;
        let health_port = h.port_string();
        let health_protocol = ProtocolEnum::from(h.protocol.as_str());
        let timing = (h.interval, h.timeout, h.healthy_threshold, h.unhealthy_threshold);
        if let Some(tg) = existing.iter().find(|t| t.protocol == port.protocol && t.port == port.node_port) {
            let path_differs = h.path.as_ref().is_some_and(|p| *p != tg.health_path);
            if tg.health_port != health_port
                || path_differs
                || tg.health_protocol != h.protocol.as_str()
                || tg.health_timing != timing
            {
                elb.modify_target_group()
                    .target_group_arn(&tg.arn)
                    .health_check_protocol(health_protocol)
                    .health_check_port(&health_port)
                    .set_health_check_path(h.path.clone())
                    .health_check_interval_seconds(h.interval)
                    .health_check_timeout_seconds(h.timeout)
                    .healthy_threshold_count(h.healthy_threshold)
                    .unhealthy_threshold_count(h.unhealthy_threshold)
                    .send()
                    .await
                    .map_err(self.elb_err("ModifyTargetGroup"))?;
            }
            return Ok(tg.arn.clone());
        }
        let mut tags = desired.tags.clone();
        tags.insert(TAG_SERVICE_PORT.to_string(), format!("{}/{}", port.port, port.protocol));
        let name = target_group_name(&desired.name, port);
        let r = elb
            .create_target_group()
            .name(&name)
            .protocol(ProtocolEnum::from(port.protocol.as_str()))
            .port(port.node_port)
            .vpc_id(vpc)
            .target_type(TargetTypeEnum::Instance)
            .health_check_enabled(true)
            .health_check_protocol(health_protocol)
            .health_check_port(&health_port)
            .set_health_check_path(h.path.clone())
            .health_check_interval_seconds(h.interval)
            .health_check_timeout_seconds(h.timeout)
            .healthy_threshold_count(h.healthy_threshold)
            .unhealthy_threshold_count(h.unhealthy_threshold)
            .set_tags(Some(to_tags(&tags)))
            .send()
            .await;
        let arn = match r {
            Ok(r) => r
                .target_groups()
                .first()
                .and_then(|t| t.target_group_arn())
                .map(str::to_string)
                .ok_or_else(|| CloudError::Other("CreateTargetGroup returned nothing".into()))?,
            // Made by an earlier try whose answer was lost: adopt it if its tags say it is ours.
            Err(e) if code(&e) == Some("DuplicateTargetGroupName") => self.adopt_tg(desired, &name).await?,
            Err(e) => return Err(self.classify("CreateTargetGroup", e)),
        };
        self.remember(Kind::TargetGroup, desired, &arn);
        Ok(arn)
    }

    /// The ARN of the target group named `name` if its tags name `desired`'s Service.
    async fn adopt_tg(&self, desired: &Desired, name: &str) -> CloudResult<String> {
        let elb = &self.clients().await?.elb;
        let r = elb.describe_target_groups().names(name).send().await.map_err(self.elb_err("DescribeTargetGroups"))?;
        let arn = r.target_groups().first().and_then(|t| t.target_group_arn()).unwrap_or_default().to_string();
        let tags = self.elb_tags(std::slice::from_ref(&arn)).await?;
        let ours = tags.get(&arn).is_some_and(|t| {
            desired
                .tags
                .iter()
                .filter(|(k, _)| k.starts_with(TAG_CLUSTER_PREFIX) || *k == TAG_SERVICE)
                .all(|(k, v)| t.get(k) == Some(v))
        });
        if !ours {
            return Err(CloudError::Other(format!(
                "target group name {name} is taken by a target group of another Service or cluster"
            )));
        }
        tracing::info!(%name, "adopted a target group made by an earlier try");
        Ok(arn)
    }

    /// Set the target group's managed attributes where they differ.
    async fn sync_tg_attributes(&self, tg_arn: &str, want: &BTreeMap<&'static str, String>) -> CloudResult<()> {
        let elb = &self.clients().await?.elb;
        let r = elb
            .describe_target_group_attributes()
            .target_group_arn(tg_arn)
            .send()
            .await
            .map_err(self.elb_err("DescribeTargetGroupAttributes"))?;
        let have: BTreeMap<String, String> = r
            .attributes()
            .iter()
            .map(|a| (a.key().unwrap_or_default().to_string(), a.value().unwrap_or_default().to_string()))
            .collect();
        let changes = attribute_changes(want, &have);
        if changes.is_empty() {
            return Ok(());
        }
        let attrs = changes.iter().map(|(k, v)| TargetGroupAttribute::builder().key(*k).value(v).build()).collect();
        elb.modify_target_group_attributes()
            .target_group_arn(tg_arn)
            .set_attributes(Some(attrs))
            .send()
            .await
            .map_err(self.elb_err("ModifyTargetGroupAttributes"))?;
        Ok(())
    }

    /// Set the load balancer's managed attributes where they differ.
    async fn sync_lb_attributes(&self, lb_arn: &str, want: &BTreeMap<&'static str, String>) -> CloudResult<()> {
        let elb = &self.clients().await?.elb;
        let r = elb
            .describe_load_balancer_attributes()
            .load_balancer_arn(lb_arn)
            .send()
            .await
            .map_err(self.elb_err("DescribeLoadBalancerAttributes"))?;
        let have: BTreeMap<String, String> = r
            .attributes()
            .iter()
            .map(|a| (a.key().unwrap_or_default().to_string(), a.value().unwrap_or_default().to_string()))
            .collect();
        let changes = attribute_changes(want, &have);
        if changes.is_empty() {
            return Ok(());
        }
        let attrs = changes.iter().map(|(k, v)| LoadBalancerAttribute::builder().key(*k).value(v).build()).collect();
        elb.modify_load_balancer_attributes()
            .load_balancer_arn(lb_arn)
            .set_attributes(Some(attrs))
            .send()
            .await
            .map_err(self.elb_err("ModifyLoadBalancerAttributes"))?;
        Ok(())
    }

    async fn sync_targets(&self, tg_arn: &str, node_port: i32, instances: &[Arc<InstanceInfo>]) -> CloudResult<()> {
        let elb = &self.clients().await?.elb;
        let r = elb
            .describe_target_health()
            .target_group_arn(tg_arn)
            .send()
            .await
            .map_err(self.elb_err("DescribeTargetHealth"))?;
        let have: BTreeSet<(String, i32)> = r
            .target_health_descriptions()
            .iter()
            .filter_map(|d| d.target())
            .map(|t| (t.id().unwrap_or_default().to_string(), t.port().unwrap_or(node_port)))
            .collect();
        let want: BTreeSet<(String, i32)> = instances.iter().map(|i| (i.id.clone(), node_port)).collect();
        let add: Vec<TargetDescription> =
            want.difference(&have).map(|(id, port)| TargetDescription::builder().id(id).port(*port).build()).collect();
        let remove: Vec<TargetDescription> =
            have.difference(&want).map(|(id, port)| TargetDescription::builder().id(id).port(*port).build()).collect();
        if !add.is_empty() {
            elb.register_targets()
                .target_group_arn(tg_arn)
                .set_targets(Some(add))
                .send()
                .await
                .map_err(self.elb_err("RegisterTargets"))?;
        }
        if !remove.is_empty() {
            elb.deregister_targets()
                .target_group_arn(tg_arn)
                .set_targets(Some(remove))
                .send()
                .await
                .map_err(self.elb_err("DeregisterTargets"))?;
        }
        Ok(())
    }

    async fn sync_listeners(&self, lb_arn: &str, wanted: &[(DesiredPort, String)]) -> CloudResult<()> {
        let elb = &self.clients().await?.elb;
        let r = elb
            .describe_listeners()
            .load_balancer_arn(lb_arn)
            .send()
            .await
            .map_err(self.elb_err("DescribeListeners"))?;
        let forward = |tg: &str| Action::builder().r#type(ActionTypeEnum::Forward).target_group_arn(tg).build();
        let mut seen = BTreeSet::new();
        for l in r.listeners() {
            let arn = l.listener_arn().unwrap_or_default();
            let port = l.port().unwrap_or_default();
            let protocol = l.protocol().map(|p| p.as_str()).unwrap_or_default();
            let target = l.default_actions().first().and_then(|a| a.target_group_arn()).unwrap_or_default();
            let certificate = l.certificates().first().and_then(|c| c.certificate_arn()).unwrap_or_default();
            let policy = l.ssl_policy().unwrap_or_default();
            match wanted.iter().find(|(p, _)| p.port == port) {
                Some((p, tg)) if !seen.contains(&port) => {
                    seen.insert(port);
                    let tls_differs = match &p.tls {
                        None => false,
                        Some(t) => {
                            t.certificate_arn != certificate || t.policy.as_deref().is_some_and(|want| want != policy)
                        }
                    };
                    if p.listener_protocol() != protocol
                        || tg != target
                        || l.default_actions().len() != 1
                        || tls_differs
                    {
                        elb.modify_listener()
                            .listener_arn(arn)
                            .protocol(ProtocolEnum::from(p.listener_protocol()))
                            .port(p.port)
                            .set_certificates(listener_certificates(p))
                            .set_ssl_policy(p.tls.as_ref().and_then(|t| t.policy.clone()))
                            .default_actions(forward(tg))
                            .send()
                            .await
                            .map_err(self.elb_err("ModifyListener"))?;
                    }
                }
                _ => match elb.delete_listener().listener_arn(arn).send().await {
                    Ok(_) => {}
                    Err(e) if code(&e) == Some("ListenerNotFound") => {}
                    Err(e) => return Err(self.classify("DeleteListener", e)),
                },
            }
        }
        for (p, tg) in wanted.iter().filter(|(p, _)| !seen.contains(&p.port)) {
            elb.create_listener()
                .load_balancer_arn(lb_arn)
                .protocol(ProtocolEnum::from(p.listener_protocol()))
                .port(p.port)
                .set_certificates(listener_certificates(p))
                .set_ssl_policy(p.tls.as_ref().and_then(|t| t.policy.clone()))
                .default_actions(forward(tg))
                .send()
                .await
                .map_err(self.elb_err("CreateListener"))?;
        }
        Ok(())
    }

    /// Security groups whose rules we may have written (the VPC's, or all when unknown).
    async fn security_groups(
        &self,
        vpc: Option<&str>,
        ids: Option<&[String]>,
    ) -> CloudResult<Vec<aws_sdk_ec2::types::SecurityGroup>> {
        let ec2 = &self.clients().await?.ec2;
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut req = ec2.describe_security_groups().set_next_token(token.take());
            if let Some(vpc) = vpc {
                req = req.filters(Filter::builder().name("vpc-id").values(vpc).build());
            }
            if let Some(ids) = ids {
                req = req.set_group_ids(Some(ids.to_vec()));
            } else {
                req = req.max_results(1000);
            }
            let page = req.send().await.map_err(self.elb_err("DescribeSecurityGroups"))?;
            out.extend(page.security_groups().iter().cloned());
            match page.next_token().filter(|t| !t.is_empty()) {
                Some(t) => token = Some(t.to_string()),
                None => break,
            }
        }
        Ok(out)
    }

    /// Our rules for `lb_name` on the given groups.
    fn rules_in(groups: &[aws_sdk_ec2::types::SecurityGroup], lb_name: &str) -> BTreeSet<Rule> {
        let ours = [rule_description(lb_name), health_rule_description(lb_name)];
        let mut out = BTreeSet::new();
        for g in groups {
            for p in g.ip_permissions() {
                let v4 = p.ip_ranges().iter().map(|r| (r.cidr_ip(), r.description()));
                let v6 = p.ipv6_ranges().iter().map(|r| (r.cidr_ipv6(), r.description()));
                let pairs = p.user_id_group_pairs().iter().map(|r| (r.group_id(), r.description()));
                for (cidr, d) in v4.chain(v6).chain(pairs) {
                    let d = d.unwrap_or_default();
                    if ours.iter().any(|o| o == d) {
                        out.insert((
                            g.group_id().unwrap_or_default().to_string(),
                            p.ip_protocol().unwrap_or_default().to_string(),
                            p.from_port().unwrap_or_default(),
                            cidr.unwrap_or_default().to_string(),
                            d.to_string(),
                        ));
                    }
                }
            }
        }
        out
    }

    async fn apply_rules(&self, add: Vec<Rule>, remove: Vec<Rule>) -> CloudResult<()> {
        let ec2 = &self.clients().await?.ec2;
        let perm = |(_, proto, port, cidr, desc): &Rule| {
            let b = IpPermission::builder().ip_protocol(proto).from_port(*port).to_port(*port);
            if source_is_group(cidr) {
                b.user_id_group_pairs(UserIdGroupPair::builder().group_id(cidr).description(desc).build()).build()
            } else if cidr.contains(':') {
                b.ipv6_ranges(Ipv6Range::builder().cidr_ipv6(cidr).description(desc).build()).build()
            } else {
                b.ip_ranges(IpRange::builder().cidr_ip(cidr).description(desc).build()).build()
            }
        };
        for rule in &remove {
            match ec2.revoke_security_group_ingress().group_id(&rule.0).ip_permissions(perm(rule)).send().await {
                Ok(_) => {}
                Err(e)
                    if code(&e).is_some_and(|c| {
                        c.starts_with("InvalidPermission.NotFound") || c == "InvalidGroup.NotFound"
                    }) => {}
                Err(e) => return Err(self.classify("RevokeSecurityGroupIngress", e)),
            }
        }
        for rule in &add {
            match ec2.authorize_security_group_ingress().group_id(&rule.0).ip_permissions(perm(rule)).send().await {
                Ok(_) => {}
                // An identical rule made by someone else already lets the traffic in.
                Err(e) if code(&e) == Some("InvalidPermission.Duplicate") => {}
                Err(e) => return Err(self.classify("AuthorizeSecurityGroupIngress", e)),
            }
        }
        Ok(())
    }

    /// The security group of each instance that receives our rules: `ElbSecurityGroup` when
    /// set, else the instance's group tagged with the cluster, else its only (or first) group.
    async fn target_groups_for_rules(
        &self,
        instances: &[Arc<InstanceInfo>],
        cluster_id: &str,
    ) -> CloudResult<Vec<String>> {
        if !self.config.elb_security_group.is_empty() {
            return Ok(vec![self.config.elb_security_group.clone()]);
        }
        let ids: BTreeSet<String> = instances.iter().flat_map(|i| i.security_groups.iter().cloned()).collect();
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<String> = ids.into_iter().collect();
        let groups = self.security_groups(None, Some(&ids)).await?;
        let cluster_key = format!("{TAG_CLUSTER_PREFIX}{cluster_id}");
        let tagged: BTreeSet<String> = groups
            .iter()
            .filter(|g| g.tags().iter().any(|t| t.key() == Some(cluster_key.as_str())))
            .filter_map(|g| g.group_id().map(str::to_string))
            .collect();
        let mut out = BTreeSet::new();
        for i in instances {
            let mut own: Vec<&String> = i.security_groups.iter().collect();
            own.sort();
            if let Some(g) = own.iter().find(|g| tagged.contains(**g)) {
                out.insert((*g).clone());
            } else if let Some(g) = own.first() {
                out.insert((*g).clone());
            }
        }
        Ok(out.into_iter().collect())
    }

    async fn vpc_cidrs(&self, vpc: &str) -> CloudResult<Vec<String>> {
        let ec2 = &self.clients().await?.ec2;
        let r = ec2.describe_vpcs().vpc_ids(vpc).send().await.map_err(self.elb_err("DescribeVpcs"))?;
        Ok(r.vpcs().iter().filter_map(|v| v.cidr_block()).map(str::to_string).collect())
    }

    /// The Service's managed security groups, found by tags (oldest ID first).
    async fn managed_groups(&self, cluster_id: &str, service: &Service) -> CloudResult<Vec<String>> {
        let ec2 = &self.clients().await?.ec2;
        let r = ec2
            .describe_security_groups()
            .filters(Filter::builder().name("tag-key").values(format!("{TAG_CLUSTER_PREFIX}{cluster_id}")).build())
            .filters(Filter::builder().name(format!("tag:{TAG_SERVICE}")).values(service_key(service)).build())
            .filters(Filter::builder().name(format!("tag:{TAG_SG_MODE}")).values("Managed").build())
            .send()
            .await
            .map_err(self.elb_err("DescribeSecurityGroups"))?;
        let mut ids: Vec<String> =
            r.security_groups().iter().filter_map(|g| g.group_id()).map(str::to_string).collect();
        ids.sort();
        Ok(ids)
    }

    /// The managed security group: the one found, else a new one tagged at creation (a create
    /// whose answer was lost leaves a group the next sync finds).
    async fn ensure_managed_group(&self, desired: &Desired, vpc: &str, existing: &[String]) -> CloudResult<String> {
        if let Some(id) = existing.first() {
            return Ok(id.clone());
        }
        let ec2 = &self.clients().await?.ec2;
        let mut tags = desired.tags.clone();
        tags.insert(TAG_SG_MODE.to_string(), "Managed".to_string());
        let mut spec = aws_sdk_ec2::types::TagSpecification::builder()
            .resource_type(aws_sdk_ec2::types::ResourceType::SecurityGroup);
        for (k, v) in &tags {
            spec = spec.tags(aws_sdk_ec2::types::Tag::builder().key(k).value(v).build());
        }
        let r = ec2
            .create_security_group()
            .group_name(managed_group_name(&desired.name))
            .description(format!("Security group for the Kubernetes load balancer {}", desired.name))
            .vpc_id(vpc)
            .tag_specifications(spec.build())
            .send()
            .await
            .map_err(self.elb_err("CreateSecurityGroup"))?;
        r.group_id().map(str::to_string).ok_or_else(|| CloudError::Other("CreateSecurityGroup returned nothing".into()))
    }

    /// Delete security groups; returns how many are still in use (retried later).
    async fn delete_groups(&self, ids: &[String]) -> CloudResult<usize> {
        let ec2 = &self.clients().await?.ec2;
        let mut pending = 0;
        for id in ids {
            match ec2.delete_security_group().group_id(id).send().await {
                Ok(_) => {}
                Err(e) if code(&e) == Some("InvalidGroup.NotFound") => {}
                Err(e) if code(&e) == Some("DependencyViolation") => pending += 1,
                Err(e) => return Err(self.classify("DeleteSecurityGroup", e)),
            }
        }
        Ok(pending)
    }

    async fn sync_rules(
        &self,
        desired: &Desired,
        instances: &[Arc<InstanceInfo>],
        vpc: &str,
        cluster_id: &str,
        managed: Option<&str>,
    ) -> CloudResult<()> {
        let mut want: BTreeSet<Rule> = BTreeSet::new();
        let client = rule_description(&desired.name);
        // The managed group lets the clients in on the listener ports.
        if let Some(g) = managed {
            for p in &desired.ports {
                let proto = if p.protocol == "UDP" { "udp" } else { "tcp" };
                for cidr in &desired.source_ranges {
                    want.insert((g.to_string(), proto.to_string(), p.port, cidr.clone(), client.clone()));
                }
            }
        }
        let groups = if self.config.disable_security_group_ingress {
            Vec::new()
        } else {
            self.target_groups_for_rules(instances, cluster_id).await?
        };
        // The VPC's CIDRs are the health checks' source only without a load-balancer group.
        let vpc_cidrs = if managed.is_none() && !groups.is_empty() && !health_rule_ports(desired).is_empty() {
            self.vpc_cidrs(vpc).await?
        } else {
            Vec::new()
        };
        want.extend(node_rules(desired, &groups, managed, &vpc_cidrs));
        let all = self.security_groups(Some(vpc), None).await?;
        let mut have = Self::rules_in(&all, &desired.name);
        if self.config.disable_security_group_ingress {
            // Only the managed group's rules are ours to change then.
            have.retain(|r| managed.is_some_and(|m| r.0 == m));
        }
        let (add, remove) = rule_diff(&want, &have);
        self.apply_rules(add, remove).await
    }

    async fn ensure(
        &self,
        cluster_name: &str,
        service: &Service,
        nodes: &[&Node],
        create: bool,
    ) -> CloudResult<Option<LoadBalancerStatus>> {
        // Every annotation is validated before the first call that changes anything.
        match ann::kind(service) {
            Ok(LbKind::Nlb) => {}
            Ok(LbKind::Elsewhere) => return Err(CloudError::ImplementedElsewhere),
            Err(e) => return Err(refused_annotation(e)),
        }
        let cluster_id = self.cluster_id(cluster_name).to_string();
        let desired = desired_with(service, &cluster_id, &self.config.cluster_probe)?;
        let selected: Vec<&Node> =
            nodes.iter().copied().filter(|n| node_selected(n, &desired.annotations.target_node_labels)).collect();
        let instances = self.node_instances(&selected).await?;
        let mut lbs = self.owned_lbs(&cluster_id, service).await?;
        // Looked up while attached: a duplicate or replaced load balancer's delete detaches them.
        let lb_arns: Vec<&str> = lbs.iter().map(|l| l.arn.as_str()).collect();
        let tgs = self.owned_tgs(&cluster_id, service, &lb_arns).await?;
        // Duplicates (a create whose answer was lost, or an emulator's same-name copy): keep the
        // oldest, remove the rest.
        for extra in lbs.iter().skip(1) {
            tracing::warn!(service = %service_key(service), "removing a duplicate load balancer");
            self.delete_lb(&extra.arn).await?;
        }
        lbs.truncate(1);
        let mut lb = lbs.pop();
        let vpc = match self.vpc_of(&instances) {
            Some(v) => v,
            None => {
                return Err(CloudError::Other(
                    "cannot tell the VPC: set [Global] VPC in the cloud-config or give the Service a Node".into(),
                ));
            }
        };
        let managed_mode = wants_managed_group(self.config.nlb_security_group_managed, &desired.annotations);
        let managed_found = if self.config.nlb_security_group_managed {
            self.managed_groups(&cluster_id, service).await?
        } else {
            Vec::new()
        };
        let want_groups = managed_mode || !wanted_security_groups(&desired.annotations, None).is_empty();
        let replace = lb.as_ref().and_then(|l| {
            replacement_reason(l.internal, l.addresses.as_deref(), &l.security_groups, want_groups, &desired)
        });
        // Subnets and addresses are planned (read-only) before a replaced load balancer goes.
        let plan = if lb.is_none() && create || replace.is_some() {
            Some(self.plan_subnets(&desired, &vpc, &cluster_id).await?)
        } else {
            None
        };
        // Every check is done: from here on things change.
        let managed = if managed_mode && (lb.is_some() || plan.is_some()) {
            Some(self.ensure_managed_group(&desired, &vpc, &managed_found).await?)
        } else {
            None
        };
        let groups = wanted_security_groups(&desired.annotations, managed.as_deref());
        if let (Some(existing), Some(reason)) = (&lb, &replace) {
            tracing::warn!(service = %service_key(service), %reason, "replacing the load balancer");
            self.delete_lb(&existing.arn).await?;
            // Evented once the old one is gone: the next sync finds none, so no repeat.
            if let Some(events) = self.event_sink() {
                use kube::Resource;
                let reference = service.object_ref(&());
                events.publish(
                    ccm_framework::controllers::service::COMPONENT,
                    reference,
                    kube::runtime::events::EventType::Warning,
                    REASON_LOAD_BALANCER_REPLACED,
                    replacement_note(reason),
                    ACTION_REPLACE,
                );
            }
            lb = None;
        }
        let lb = match (lb, plan) {
            (Some(lb), _) => lb,
            (None, Some(plan)) => self.create_lb(&desired, plan, groups.clone()).await?,
            (None, None) => return Ok(None),
        };
        if lb.addresses.is_none() {
            let tag = BTreeMap::from([(TAG_ADDRESSES.to_string(), addresses_fingerprint(&desired.annotations))]);
            let elb = &self.clients().await?.elb;
            elb.add_tags()
                .resource_arns(&lb.arn)
                .set_tags(Some(to_tags(&tag)))
                .send()
                .await
                .map_err(self.elb_err("AddTags"))?;
        }
        if lb.ip_address_type != desired.ip_address_type {
            let elb = &self.clients().await?.elb;
            elb.set_ip_address_type()
                .load_balancer_arn(&lb.arn)
                .ip_address_type(IpAddressType::from(desired.ip_address_type))
                .send()
                .await
                .map_err(self.elb_err("SetIpAddressType"))?;
        }
        if !groups.is_empty() && groups != lb.security_groups {
            let elb = &self.clients().await?.elb;
            elb.set_security_groups()
                .load_balancer_arn(&lb.arn)
                .set_security_groups(Some(groups.into_iter().collect()))
                .send()
                .await
                .map_err(self.elb_err("SetSecurityGroups"))?;
        }
        self.sync_lb_attributes(&lb.arn, &lb_attributes(&desired.annotations)).await?;
        let tg_attrs = tg_attributes(&desired.annotations);
        let mut wanted = Vec::new();
        for port in &desired.ports {
            let arn = self.ensure_tg(&desired, port, &vpc, &tgs).await?;
            self.sync_tg_attributes(&arn, &tg_attrs).await?;
            self.sync_targets(&arn, port.node_port, &instances).await?;
            wanted.push((port.clone(), arn));
        }
        self.sync_listeners(&lb.arn, &wanted).await?;
        let keep: BTreeSet<&str> = wanted.iter().map(|(_, a)| a.as_str()).collect();
        for tg in tgs.iter().filter(|t| !keep.contains(t.arn.as_str())) {
            if !self.delete_tg(&tg.arn).await? {
                tracing::debug!(lbs = tg.lb_arns.len(), "target group still in use; removed on a later sync");
            }
        }
        self.sync_rules(&desired, &instances, &vpc, &cluster_id, managed.as_deref()).await?;
        // Managed groups no longer wanted (switched to bring-your-own, or a duplicate).
        let stale: Vec<String> = managed_found.into_iter().filter(|g| Some(g) != managed.as_ref()).collect();
        if self.delete_groups(&stale).await? > 0 {
            return Err(CloudError::retry_after(
                IN_USE_RETRY,
                "a managed security group is still in use; removed on retry",
            ));
        }
        Ok(Some(status(&lb.dns)))
    }
}

/// The Service status for an NLB: its DNS name only. The API server refuses `ipMode` without
/// an `ip`, and an NLB has no fixed IP to report.
fn status(dns: &str) -> LoadBalancerStatus {
    LoadBalancerStatus {
        ingress: Some(vec![LoadBalancerIngress { hostname: Some(dns.to_string()), ..Default::default() }]),
    }
}

#[async_trait]
impl LoadBalancer for AwsProvider {
    async fn get_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
    ) -> CloudResult<Option<LoadBalancerStatus>> {
        let cluster_id = self.cluster_id(cluster_name).to_string();
        Ok(self.owned_lbs(&cluster_id, service).await?.first().map(|lb| status(&lb.dns)))
    }

    async fn ensure_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
        nodes: &[&Node],
    ) -> CloudResult<LoadBalancerStatus> {
        self.ensure(cluster_name, service, nodes, true)
            .await?
            .ok_or_else(|| CloudError::Other("the load balancer was not created".into()))
    }

    async fn update_load_balancer(&self, cluster_name: &str, service: &Service, nodes: &[&Node]) -> CloudResult<()> {
        // The same diff as ensure, without creating a load balancer that is not there.
        self.ensure(cluster_name, service, nodes, false).await.map(|_| ())
    }

    async fn ensure_load_balancer_deleted(&self, cluster_name: &str, service: &Service) -> CloudResult<()> {
        let cluster_id = self.cluster_id(cluster_name).to_string();
        let lb_name = default_load_balancer_name(service);
        // Rules first: they are found by description, which needs no other object.
        if !self.config.disable_security_group_ingress {
            let vpc = (!self.config.vpc.is_empty()).then_some(self.config.vpc.as_str());
            let groups = self.security_groups(vpc, None).await?;
            let have = Self::rules_in(&groups, &lb_name);
            self.apply_rules(Vec::new(), have.into_iter().collect()).await?;
        }
        let lbs = self.owned_lbs(&cluster_id, service).await?;
        // Looked up while attached: deleting the load balancer detaches them.
        let tgs = self.owned_tgs(&cluster_id, service, &lbs.iter().map(|l| l.arn.as_str()).collect::<Vec<_>>()).await?;
        for lb in &lbs {
            self.delete_lb(&lb.arn).await?;
        }
        let mut pending = 0;
        for tg in tgs {
            if !self.delete_tg(&tg.arn).await? {
                pending += 1;
            }
        }
        // Managed groups are looked for in any mode: the mode may have been switched off since.
        let groups = self.managed_groups(&cluster_id, service).await?;
        pending += self.delete_groups(&groups).await?;
        if pending > 0 {
            return Err(CloudError::retry_after(
                IN_USE_RETRY,
                format!("{pending} target or security groups are still in use by the deleted load balancer"),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ServicePort, ServiceSpec};

    fn svc(annotations: &[(&str, &str)], ports: &[(i32, &str, i32)], etp: &str, hcnp: i32) -> Service {
        let mut s = Service::default();
        s.metadata.name = Some("web".into());
        s.metadata.namespace = Some("shop".into());
        s.metadata.uid = Some("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0".into());
        let mut a: BTreeMap<String, String> = [(ann::TYPE.to_string(), "nlb".to_string())].into();
        a.extend(annotations.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        s.metadata.annotations = Some(a);
        s.spec = Some(ServiceSpec {
            type_: Some("LoadBalancer".into()),
            ports: Some(
                ports
                    .iter()
                    .map(|(p, proto, np)| ServicePort {
                        port: *p,
                        protocol: Some(proto.to_string()),
                        node_port: Some(*np),
                        ..Default::default()
                    })
                    .collect(),
            ),
            external_traffic_policy: Some(etp.into()),
            health_check_node_port: (hcnp > 0).then_some(hcnp),
            ..Default::default()
        });
        s
    }

    #[test]
    fn cluster_traffic_policy_checks_kube_proxy_and_local_checks_the_service_port() {
        let d = desired(&svc(&[], &[(80, "TCP", 30080)], "Cluster", 0), "c").unwrap();
        assert_eq!(d.health.port, HealthPort::Port(KUBE_PROXY_HEALTH_PORT));
        assert!(health_rule_ports(&d).is_empty(), "kube-proxy's shared port is opened once by the cluster owner");
        let d = desired(&svc(&[], &[(80, "TCP", 30080)], "Local", 31999), "c").unwrap();
        assert_eq!(d.health.port, HealthPort::Port(31999));
        assert_eq!(health_rule_ports(&d), [("tcp".to_string(), 31999)].into());
    }

    #[test]
    fn internal_annotation_and_defaults() {
        let d = desired(&svc(&[(ann::INTERNAL, "true")], &[(80, "TCP", 30080)], "Cluster", 0), "c").unwrap();
        assert!(d.internal);
        assert_eq!(d.source_ranges, vec!["0.0.0.0/0".to_string()]);
        assert_eq!(d.name, "a0f1e2d3c4b5a69788796a5b4c3d2e1f");
        let d = desired(&svc(&[(ann::INTERNAL, "false")], &[(80, "TCP", 30080)], "Cluster", 0), "c").unwrap();
        assert!(!d.internal);
    }

    #[test]
    fn tags_mark_cluster_and_service_and_extra_tags_cannot_take_reserved_keys() {
        let s = svc(&[(ann::EXTRA_TAGS, "team=web, cost=1")], &[(80, "TCP", 30080)], "Cluster", 0);
        let d = desired(&s, "prod").unwrap();
        assert!(owned_by(&d.tags, "prod", &s));
        assert!(!owned_by(&d.tags, "other", &s));
        assert_eq!(d.tags.get("team").map(String::as_str), Some("web"));
        let s = svc(&[(ann::EXTRA_TAGS, "kubernetes.io/service-name=x")], &[(80, "TCP", 30080)], "Cluster", 0);
        assert!(desired(&s, "prod").is_err());
    }

    #[test]
    fn unsupported_services_are_refused_with_a_reason() {
        let e = desired(&svc(&[], &[(80, "SCTP", 30080)], "Cluster", 0), "c").unwrap_err();
        assert!(
            matches!(e, CloudError::Refused { reason: Refusal::UnsupportedService, .. })
                && e.to_string().contains("SCTP")
        );
        let e = desired(&svc(&[(ann::HC_INTERVAL, "1")], &[(80, "TCP", 30080)], "Cluster", 0), "c").unwrap_err();
        assert!(matches!(e, CloudError::Refused { reason: Refusal::InvalidAnnotation, .. }), "{e}");
        assert!(desired(&svc(&[], &[(53, "TCP", 30053), (53, "UDP", 30054)], "Cluster", 0), "c").is_err());
        assert!(desired(&svc(&[], &[(80, "TCP", 0)], "Cluster", 0), "c").unwrap_err().to_string().contains("nodePort"));
        assert!(implemented_elsewhere(&svc(&[(ann::TYPE, "external")], &[], "Cluster", 0)));
        assert!(!implemented_elsewhere(&svc(&[(ann::TYPE, "nlb")], &[], "Cluster", 0)));
    }

    #[test]
    fn target_group_names_fit_and_change_with_the_port_mapping() {
        let p = DesiredPort { port: 443, protocol: "TCP".into(), node_port: 30443, tls: None };
        let a = target_group_name("a0f1e2d3c4b5a69788796a5b4c3d2e1f", &p);
        assert!(a.len() <= 32, "{a}");
        let q = DesiredPort { node_port: 30444, ..p.clone() };
        assert_ne!(a, target_group_name("a0f1e2d3c4b5a69788796a5b4c3d2e1f", &q));
        assert_eq!(a, target_group_name("a0f1e2d3c4b5a69788796a5b4c3d2e1f", &p));
    }

    #[test]
    fn status_names_the_dns_name_without_ip_mode() {
        let ingress = status("lb.elb.amazonaws.com").ingress.unwrap();
        assert_eq!(ingress.len(), 1);
        assert_eq!(ingress[0].hostname.as_deref(), Some("lb.elb.amazonaws.com"));
        assert!(ingress[0].ip.is_none() && ingress[0].ip_mode.is_none(), "ipMode is only valid with an ip");
    }

    #[test]
    fn healthcheck_annotations_override_the_defaults_and_tcp_drops_the_path() {
        let a = ann::HealthCheck {
            protocol: Some(HealthProtocol::Tcp),
            port: Some(HealthPort::TrafficPort),
            interval: Some(10),
            healthy_threshold: Some(5),
            ..Default::default()
        };
        let h = health_spec(false, 0, &a, &ClusterProbe::default());
        assert_eq!((h.protocol, h.port, h.path.as_deref()), (HealthProtocol::Tcp, HealthPort::TrafficPort, None));
        assert_eq!((h.interval, h.timeout, h.healthy_threshold, h.unhealthy_threshold), (10, 10, 5, 3));
        let local = health_spec(
            true,
            31999,
            &ann::HealthCheck { path: Some("/ready".into()), ..Default::default() },
            &ClusterProbe::default(),
        );
        // Upstream's ServiceNodePort mode: TCP on the traffic port; a Shared probe elsewhere.
        let np = ClusterProbe { shared: false, ..Default::default() };
        let h = health_spec(false, 0, &ann::HealthCheck::default(), &np);
        assert_eq!((h.protocol, h.port, h.path), (HealthProtocol::Tcp, HealthPort::TrafficPort, None));
        let other = ClusterProbe { port: 10999, path: "/livez".into(), ..Default::default() };
        let h = health_spec(false, 0, &ann::HealthCheck::default(), &other);
        assert_eq!((h.port_string(), h.path.as_deref()), ("10999".to_string(), Some("/livez")));
        assert_eq!((local.port_string(), local.path.as_deref()), ("31999".to_string(), Some("/ready")));
        let d = desired(
            &svc(&[(ann::HC_PORT, "traffic-port")], &[(80, "TCP", 30080), (443, "TCP", 30443)], "Cluster", 0),
            "c",
        )
        .unwrap();
        assert_eq!(health_rule_ports(&d), [("tcp".to_string(), 30080), ("tcp".to_string(), 30443)].into());
    }

    #[test]
    fn ssl_ports_make_tls_listeners_and_backend_ssl_tls_target_groups() {
        let cert = "arn:aws:acm:us-east-1:123456789012:certificate/abc";
        let mut s = svc(
            &[(ann::SSL_CERT, cert), (ann::SSL_PORTS, "https"), (ann::BACKEND_PROTOCOL, "ssl")],
            &[(80, "TCP", 30080), (443, "TCP", 30443), (53, "UDP", 30053)],
            "Cluster",
            0,
        );
        s.spec.as_mut().unwrap().ports.as_mut().unwrap()[1].name = Some("https".into());
        let d = desired(&s, "c").unwrap();
        assert_eq!(d.ports[0].listener_protocol(), "TCP");
        assert_eq!((d.ports[1].listener_protocol(), d.ports[1].protocol.as_str()), ("TLS", "TLS"));
        assert_eq!(d.ports[1].tls.as_ref().unwrap().certificate_arn, cert);
        assert_eq!(d.ports[2].listener_protocol(), "UDP", "UDP ports never get TLS");
    }

    #[test]
    fn target_node_labels_select_nodes_by_key_and_value() {
        let mut n = Node::default();
        n.metadata.labels = Some([("pool".to_string(), "lb".to_string())].into());
        let want = |pairs: &[(&str, Option<&str>)]| -> BTreeMap<String, Option<String>> {
            pairs.iter().map(|(k, v)| (k.to_string(), v.map(str::to_string))).collect()
        };
        assert!(node_selected(&n, &want(&[])));
        assert!(node_selected(&n, &want(&[("pool", Some("lb"))])));
        assert!(node_selected(&n, &want(&[("pool", None)])));
        assert!(!node_selected(&n, &want(&[("pool", Some("web"))])));
        assert!(!node_selected(&n, &want(&[("edge", None)])));
    }

    #[test]
    fn attributes_have_values_when_annotations_are_absent_so_removal_converges() {
        let none = NlbAnnotations::default();
        assert_eq!(lb_attributes(&none)["load_balancing.cross_zone.enabled"], "false");
        assert_eq!(lb_attributes(&none)["access_logs.s3.enabled"], "false");
        assert_eq!(tg_attributes(&none)["preserve_client_ip.enabled"], "true");
        assert_eq!(tg_attributes(&none)["proxy_protocol_v2.enabled"], "false");
        let have: BTreeMap<String, String> = [
            ("preserve_client_ip.enabled".to_string(), "true".to_string()),
            ("proxy_protocol_v2.enabled".to_string(), "true".to_string()),
            ("deregistration_delay.timeout_seconds".to_string(), "300".to_string()),
        ]
        .into();
        assert_eq!(
            attribute_changes(&tg_attributes(&none), &have),
            vec![("proxy_protocol_v2.enabled", "false".to_string())]
        );
    }

    #[test]
    fn elastic_ips_pair_in_order_and_private_addresses_by_subnet_cidr() {
        let subnets = vec![
            ("subnet-a".to_string(), Some("10.0.1.0/24".parse().unwrap())),
            ("subnet-b".to_string(), Some("10.0.2.0/24".parse().unwrap())),
        ];
        let eips =
            NlbAnnotations { eip_allocations: vec!["eipalloc-1".into(), "eipalloc-2".into()], ..Default::default() };
        let m = subnet_mappings(&subnets, &eips).unwrap();
        assert_eq!(m[0].allocation_id.as_deref(), Some("eipalloc-1"));
        assert_eq!(m[1].allocation_id.as_deref(), Some("eipalloc-2"));
        let ips = NlbAnnotations {
            internal: true,
            private_ipv4: vec!["10.0.2.10".parse().unwrap(), "10.0.1.10".parse().unwrap()],
            ..Default::default()
        };
        let m = subnet_mappings(&subnets, &ips).unwrap();
        assert_eq!(m[0].private_ipv4, Some("10.0.1.10".parse().unwrap()));
        assert_eq!(m[1].private_ipv4, Some("10.0.2.10".parse().unwrap()));
        let outside = NlbAnnotations {
            private_ipv4: vec!["10.0.1.10".parse().unwrap(), "10.9.9.9".parse().unwrap()],
            ..Default::default()
        };
        assert_eq!(subnet_mappings(&subnets, &outside).unwrap_err().annotation(), ann::PRIVATE_IPV4);
        let one = NlbAnnotations { eip_allocations: vec!["eipalloc-1".into()], ..Default::default() };
        assert_eq!(subnet_mappings(&subnets, &one).unwrap_err().annotation(), ann::EIP_ALLOCATIONS);
        assert!(
            subnet_mappings(&subnets, &NlbAnnotations::default()).unwrap().iter().all(|m| m.allocation_id.is_none())
        );
    }

    #[test]
    fn scheme_addresses_and_security_group_presence_replace_the_load_balancer_group_changes_do_not() {
        let d = |pairs: &[(&str, &str)]| desired(&svc(pairs, &[(80, "TCP", 30080)], "Cluster", 0), "c").unwrap();
        let none = BTreeSet::new();
        let sg1: BTreeSet<String> = ["sg-01234567".to_string()].into();
        let w = |d: &Desired| !wanted_security_groups(&d.annotations, None).is_empty();
        let plain = d(&[]);
        assert_eq!(replacement_reason(false, Some(""), &none, w(&plain), &plain), None);
        assert!(replacement_reason(true, Some(""), &none, w(&plain), &plain).unwrap().contains(ann::INTERNAL));
        let eip = d(&[(ann::EIP_ALLOCATIONS, "eipalloc-01234567")]);
        assert!(replacement_reason(false, Some(""), &none, w(&eip), &eip).unwrap().contains(ann::EIP_ALLOCATIONS));
        let fp = addresses_fingerprint(&eip.annotations);
        assert_eq!(replacement_reason(false, Some(&fp), &none, w(&eip), &eip), None);
        assert_eq!(
            replacement_reason(false, None, &none, w(&eip), &eip),
            None,
            "an untagged (adopted) load balancer is kept"
        );
        let sg = d(&[(ann::SECURITY_GROUPS, "sg-01234567")]);
        assert!(
            replacement_reason(false, Some(""), &none, w(&sg), &sg).is_some(),
            "groups cannot be added to an NLB without"
        );
        let other = d(&[(ann::EXTRA_SECURITY_GROUPS, "sg-89abcdef")]);
        assert_eq!(
            replacement_reason(false, Some(""), &sg1, w(&other), &other),
            None,
            "changed in place (SetSecurityGroups)"
        );
        assert!(replacement_reason(false, Some(""), &sg1, w(&plain), &plain).is_some(), "nor all removed");
    }

    #[test]
    fn subnet_names_resolve_to_exactly_one_subnet_of_the_vpc() {
        let found = vec![
            ("subnet-a".to_string(), "public-a".to_string()),
            ("subnet-b".to_string(), "twin".to_string()),
            ("subnet-c".to_string(), "twin".to_string()),
        ];
        let ask = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(resolve_subnets(&ask(&["public-a", "subnet-x"]), &found).unwrap(), ask(&["subnet-a", "subnet-x"]));
        assert_eq!(resolve_subnets(&ask(&["nope"]), &found).unwrap_err().annotation(), ann::SUBNETS);
        assert!(resolve_subnets(&ask(&["twin"]), &found).unwrap_err().to_string().contains("give the ID"));
    }

    #[test]
    fn managed_mode_adds_a_managed_group_unless_security_groups_replace_them() {
        let extra = NlbAnnotations { extra_security_groups: vec!["sg-89abcdef".into()], ..Default::default() };
        assert!(wants_managed_group(true, &extra));
        assert!(!wants_managed_group(false, &extra));
        assert_eq!(
            wanted_security_groups(&extra, Some("sg-m")),
            ["sg-89abcdef".to_string(), "sg-m".to_string()].into()
        );
        let byo = NlbAnnotations { security_groups: vec!["sg-01234567".into()], ..Default::default() };
        assert!(!wants_managed_group(true, &byo), "security-groups replaces every other group");
        assert!(managed_group_name("a0f1e2d3c4b5a69788796a5b4c3d2e1f").len() <= 255);
    }

    #[test]
    fn ipv6_in_ip_families_makes_a_dualstack_load_balancer() {
        let mut s = svc(&[], &[(80, "TCP", 30080)], "Cluster", 0);
        assert_eq!(desired(&s, "c").unwrap().ip_address_type, "ipv4");
        let spec = s.spec.as_mut().unwrap();
        spec.ip_families = Some(vec!["IPv4".into(), "IPv6".into()]);
        spec.ip_family_policy = Some("RequireDualStack".into());
        assert_eq!(desired(&s, "c").unwrap().ip_address_type, "dualstack");
        s.spec.as_mut().unwrap().ip_families = Some(vec!["IPv6".into()]);
        assert_eq!(desired(&s, "c").unwrap().ip_address_type, "dualstack");
    }

    #[test]
    fn rule_diff_adds_missing_and_removes_stale_only() {
        let r = |port: i32| ("sg-1".to_string(), "tcp".to_string(), port, "0.0.0.0/0".to_string(), "d".to_string());
        let want: BTreeSet<Rule> = [r(1), r(2)].into();
        let have: BTreeSet<Rule> = [r(2), r(3)].into();
        let (add, remove) = rule_diff(&want, &have);
        assert_eq!(add, vec![r(1)]);
        assert_eq!(remove, vec![r(3)]);
    }

    #[test]
    fn node_rules_take_the_load_balancers_group_as_source_in_managed_mode_else_client_and_vpc_cidrs() {
        let s = svc(&[], &[(80, "TCP", 30080), (53, "UDP", 30053)], "Local", 32000);
        let d = desired(&s, "c").unwrap();
        let nodes = ["sg-nodes".to_string()];
        let vpc = ["10.0.0.0/16".to_string()];
        let sources =
            |rules: &BTreeSet<Rule>| rules.iter().map(|r| (r.1.clone(), r.2, r.3.clone())).collect::<Vec<_>>();
        // Without a load-balancer group: clients on the nodePorts, the VPC on the health port.
        let plain = node_rules(&d, &nodes, None, &vpc);
        assert_eq!(
            sources(&plain),
            vec![
                ("tcp".to_string(), 30080, "0.0.0.0/0".to_string()),
                ("tcp".to_string(), 32000, "10.0.0.0/16".to_string()),
                ("udp".to_string(), 30053, "0.0.0.0/0".to_string()),
            ]
        );
        // Managed: the NLB's group is the only source, of traffic and health checks alike.
        let managed = node_rules(&d, &nodes, Some("sg-lb"), &vpc);
        assert_eq!(
            sources(&managed),
            vec![
                ("tcp".to_string(), 30080, "sg-lb".to_string()),
                ("tcp".to_string(), 32000, "sg-lb".to_string()),
                ("udp".to_string(), 30053, "sg-lb".to_string()),
            ]
        );
        assert!(managed.iter().all(|r| r.0 == "sg-nodes" && source_is_group(&r.3)));
        assert!(node_rules(&d, &[], Some("sg-lb"), &vpc).is_empty(), "no Node group, no rule");
    }

    #[test]
    fn replacement_note_says_why_and_that_the_hostname_changes() {
        let n = replacement_note(&format!("{} changed the scheme", ann::INTERNAL));
        assert!(n.contains(ann::INTERNAL) && n.contains("new hostname"), "{n}");
    }
}
