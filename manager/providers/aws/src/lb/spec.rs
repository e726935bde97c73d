//! The checks upstream makes of a Service before any load balancer (pure), in upstream's order
//! and with upstream's messages, and the Service's shape both kinds of load balancer start from:
//! its ports, client ranges, traffic policy and the status it shows.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{LoadBalancerIngress, LoadBalancerStatus, Service};

use crate::annotations::{self as ann, AnnotationError, LbAnnotations, LbKind};
use ccm_framework::provider::{CloudError, Refusal, default_load_balancer_name};

/// Annotation of ours: `"true"` lets a change that AWS cannot make in place (the scheme, an NLB's
/// subnets or fixed addresses, a security group on an NLB made without) replace the load
/// balancer, with a new hostname. Without it such a change is refused and the load balancer kept.
pub const REPLACE: &str = "ccm.rs/aws-load-balancer-replace";

/// A Service port that gets a listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortSpec {
    /// The port.
    pub port: i32,
    /// `TCP` or `UDP`.
    pub protocol: String,
    /// The nodePort (0 when none is allocated).
    pub node_port: i32,
    /// The port's name.
    pub name: Option<String>,
}

/// What both kinds of load balancer take from the Service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceShape {
    /// The load balancer's name (`a` + the UID without dashes, 32 characters).
    pub name: String,
    /// The Service's ports that have a nodePort (upstream skips the others).
    pub ports: Vec<PortSpec>,
    /// Every Service port (a Classic ELB's own group opens them all, as upstream).
    pub all_ports: Vec<PortSpec>,
    /// `externalTrafficPolicy: Local`.
    pub local: bool,
    /// `healthCheckNodePort` (0 when none).
    pub health_check_node_port: i32,
    /// The client CIDRs, sorted (`0.0.0.0/0` when none is given; IPv6 ones only on a
    /// dual-stack NLB).
    pub source_ranges: Vec<String>,
    /// The parsed annotations.
    pub annotations: LbAnnotations,
    /// `ccm.rs/aws-load-balancer-replace: "true"`.
    pub replace: bool,
}

impl ServiceShape {
    /// Whether the clients are everyone (upstream's default range).
    pub fn open_to_all(&self) -> bool {
        self.source_ranges == ["0.0.0.0/0"]
    }
}

fn unsupported(message: impl Into<String>) -> CloudError {
    CloudError::refused(Refusal::UnsupportedService, message)
}

/// A bad annotation as the Service's refusal.
pub fn refused_annotation(e: AnnotationError) -> CloudError {
    CloudError::refused(Refusal::InvalidAnnotation, e.to_string())
}

/// The NLB's IP address type for the Service's families: `dualstack` with IPv6 (ours; an NLB
/// with instance targets serves IPv6 clients that way), else `ipv4`.
pub fn ip_address_type(service: &Service) -> &'static str {
    let v6 = service.spec.as_ref().and_then(|s| s.ip_families.as_ref()).is_some_and(|f| f.iter().any(|f| f == "IPv6"));
    if v6 { "dualstack" } else { "ipv4" }
}

/// Check the Service as upstream does for a load balancer of `kind` and read its shape.
pub fn check(service: &Service, kind: LbKind) -> Result<ServiceShape, CloudError> {
    let empty = BTreeMap::new();
    let raw = service.metadata.annotations.as_ref().unwrap_or(&empty);
    let annotations = ann::parse(raw, kind).map_err(refused_annotation)?;
    let spec = service.spec.clone().unwrap_or_default();
    if spec.session_affinity.as_deref().is_some_and(|a| a != "None") {
        return Err(unsupported(format!(
            "unsupported load balancer affinity: {}",
            spec.session_affinity.as_deref().unwrap_or_default()
        )));
    }
    let all_ports: Vec<PortSpec> = spec
        .ports
        .iter()
        .flatten()
        .map(|p| PortSpec {
            port: p.port,
            protocol: p.protocol.clone().unwrap_or_else(|| "TCP".into()),
            node_port: p.node_port.unwrap_or(0),
            name: p.name.clone(),
        })
        .collect();
    if all_ports.is_empty() {
        return Err(unsupported("requested load balancer with no ports"));
    }
    if all_ports.iter().any(|p| p.protocol != all_ports[0].protocol) {
        return Err(unsupported("mixed protocol is not supported for LoadBalancer"));
    }
    let dual = ip_address_type(service) == "dualstack" && kind == LbKind::Nlb;
    let source_ranges =
        source_ranges(spec.load_balancer_source_ranges.as_deref().unwrap_or_default(), &annotations, dual)?;
    for p in &all_ports {
        let ok = match kind {
            LbKind::Nlb => p.protocol == "TCP" || p.protocol == "UDP",
            _ => p.protocol == "TCP",
        };
        if !ok {
            return Err(unsupported(format!("Protocol {} not supported by LoadBalancer", p.protocol)));
        }
    }
    if spec.load_balancer_ip.as_deref().is_some_and(|ip| !ip.is_empty()) {
        return Err(unsupported("LoadBalancerIP cannot be specified for AWS ELB"));
    }
    let replace = raw.get(REPLACE).is_some_and(|v| v.trim() == "true");
    Ok(ServiceShape {
        name: default_load_balancer_name(service),
        ports: all_ports.iter().filter(|p| p.node_port != 0).cloned().collect(),
        all_ports,
        local: spec.external_traffic_policy.as_deref() == Some("Local"),
        health_check_node_port: spec.health_check_node_port.unwrap_or(0),
        source_ranges,
        annotations,
        replace,
    })
}

/// The client CIDRs: `spec.loadBalancerSourceRanges`, else the annotation, else everyone
/// (upstream's `GetLoadBalancerSourceRanges`). IPv6 ranges count on a dual-stack NLB only.
fn source_ranges(spec: &[String], a: &LbAnnotations, dual: bool) -> Result<Vec<String>, CloudError> {
    let mut nets: Vec<ipnet::IpNet> = Vec::new();
    for r in spec.iter().map(|r| r.trim()).filter(|r| !r.is_empty()) {
        let net = r.parse::<ipnet::IpNet>().map_err(|_| {
            unsupported(format!(
                "service.Spec.LoadBalancerSourceRanges: {r:?} is not valid. Expecting a list of IP ranges. For example, 10.0.0.0/24"
            ))
        })?;
        nets.push(net.trunc());
    }
    if nets.is_empty() {
        nets = a.source_ranges.clone();
    }
    let mut out: Vec<String> =
        nets.iter().filter(|n| dual || matches!(n, ipnet::IpNet::V4(_))).map(|n| n.to_string()).collect();
    if out.is_empty() {
        out.push("0.0.0.0/0".into());
        if dual {
            out.push("::/0".into());
        }
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// Upstream's refusal of a Service whose type annotation changed after its load balancer was
/// made (it reads the hostname's form; here the other kind's load balancer is looked up).
pub fn type_change_refused(kind: LbKind) -> CloudError {
    let what = if kind == LbKind::Nlb { "NLB" } else { "Classic Load Balancer" };
    unsupported(format!("cannot update Load Balancer Type annotation {:?} after creation for {what}", ann::TYPE))
}

/// Whether the Service shows a load balancer in its status (only then can its type have changed).
pub fn shows_ingress(service: &Service) -> bool {
    service
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .is_some_and(|i| !i.is_empty())
}

/// The Service status for a load balancer: its DNS name only (the API server refuses `ipMode`
/// without an `ip`, and ELB has no fixed IP to report).
pub fn status(dns: &str) -> LoadBalancerStatus {
    LoadBalancerStatus {
        ingress: Some(vec![LoadBalancerIngress { hostname: Some(dns.to_string()), ..Default::default() }]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lb::fixtures::svc;

    fn refused(s: &Service, kind: LbKind) -> String {
        let e = check(s, kind).unwrap_err();
        assert!(matches!(e, CloudError::Refused { .. }), "{e}");
        e.to_string()
    }

    #[test]
    fn session_affinity_load_balancer_ip_and_mixed_protocols_are_refused_with_upstreams_messages() {
        let mut s = svc(&[], &[(80, "TCP", 30080)], "Cluster", 0);
        s.spec.as_mut().unwrap().session_affinity = Some("ClientIP".into());
        assert!(refused(&s, LbKind::Nlb).contains("unsupported load balancer affinity: ClientIP"));
        let mut s = svc(&[], &[(80, "TCP", 30080)], "Cluster", 0);
        s.spec.as_mut().unwrap().session_affinity = Some("None".into());
        assert!(check(&s, LbKind::Nlb).is_ok());
        s.spec.as_mut().unwrap().load_balancer_ip = Some("1.2.3.4".into());
        assert!(refused(&s, LbKind::Classic).contains("LoadBalancerIP cannot be specified for AWS ELB"));
        let s = svc(&[], &[(53, "TCP", 30053), (54, "UDP", 30054)], "Cluster", 0);
        assert!(refused(&s, LbKind::Nlb).contains("mixed protocol is not supported for LoadBalancer"));
        let s = svc(&[], &[], "Cluster", 0);
        assert!(refused(&s, LbKind::Nlb).contains("requested load balancer with no ports"));
    }

    #[test]
    fn protocols_are_tcp_or_udp_on_an_nlb_and_tcp_on_a_classic_elb() {
        let udp = svc(&[], &[(53, "UDP", 30053)], "Cluster", 0);
        assert!(check(&udp, LbKind::Nlb).is_ok());
        assert!(refused(&udp, LbKind::Classic).contains("Protocol UDP not supported by LoadBalancer"));
        let sctp = svc(&[], &[(80, "SCTP", 30080)], "Cluster", 0);
        assert!(refused(&sctp, LbKind::Nlb).contains("Protocol SCTP not supported"));
    }

    #[test]
    fn ports_without_a_node_port_are_skipped_as_upstream() {
        let s = svc(&[], &[(80, "TCP", 30080), (81, "TCP", 0)], "Cluster", 0);
        let shape = check(&s, LbKind::Nlb).unwrap();
        assert_eq!(shape.ports.len(), 1);
        assert_eq!(shape.all_ports.len(), 2);
    }

    #[test]
    fn source_ranges_come_from_the_spec_then_the_annotation_then_everyone() {
        let mut s = svc(&[(ann::SOURCE_RANGES, "198.51.100.0/24")], &[(80, "TCP", 30080)], "Cluster", 0);
        assert_eq!(check(&s, LbKind::Nlb).unwrap().source_ranges, vec!["198.51.100.0/24".to_string()]);
        s.spec.as_mut().unwrap().load_balancer_source_ranges = Some(vec!["203.0.113.9/24".into()]);
        assert_eq!(check(&s, LbKind::Nlb).unwrap().source_ranges, vec!["203.0.113.0/24".to_string()]);
        s.spec.as_mut().unwrap().load_balancer_source_ranges = Some(vec!["nope".into()]);
        assert!(refused(&s, LbKind::Nlb).contains("Expecting a list of IP ranges"));
        let open = check(&svc(&[], &[(80, "TCP", 30080)], "Cluster", 0), LbKind::Nlb).unwrap();
        assert!(open.open_to_all());
    }

    #[test]
    fn the_replace_annotation_is_read_and_a_type_change_is_refused_with_upstreams_message() {
        let s = svc(&[(REPLACE, "true")], &[(80, "TCP", 30080)], "Cluster", 0);
        assert!(check(&s, LbKind::Nlb).unwrap().replace);
        assert!(!check(&svc(&[], &[(80, "TCP", 30080)], "Cluster", 0), LbKind::Nlb).unwrap().replace);
        assert!(type_change_refused(LbKind::Nlb).to_string().contains(
            "cannot update Load Balancer Type annotation \"service.beta.kubernetes.io/aws-load-balancer-type\" after creation for NLB"
        ));
        assert!(type_change_refused(LbKind::Classic).to_string().ends_with("after creation for Classic Load Balancer"));
    }

    #[test]
    fn status_names_the_dns_name_without_ip_mode() {
        let ingress = status("lb.elb.amazonaws.com").ingress.unwrap();
        assert_eq!(ingress.len(), 1);
        assert_eq!(ingress[0].hostname.as_deref(), Some("lb.elb.amazonaws.com"));
        assert!(ingress[0].ip.is_none() && ingress[0].ip_mode.is_none(), "ipMode is only valid with an ip");
    }
}
