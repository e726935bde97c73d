//! What the aws provider's load balancers honour (KEP-6128's capability report, see
//! `ccm_framework::capabilities`): the Service checks of [`crate::lb::check`] and the
//! annotations of [`crate::annotations`]. Where the kind of load balancer matters (an NLB for
//! `aws-load-balancer-type: nlb`, a Classic ELB otherwise) the note says which. Pure.

use ccm_framework::capabilities::{Capabilities, Feature, LoadBalancerCapabilities, Support};

use crate::annotations as ann;

/// The report of an aws provider named `name` serving these controllers.
pub fn capabilities(name: &str, instances: bool, routes: bool, load_balancer: bool) -> Capabilities {
    let lb = LoadBalancerCapabilities::from_fields([
        (
            Feature::TcpPorts,
            Support::Honoured,
            "a listener per port with a nodePort, on an NLB (`aws-load-balancer-type: nlb`) or a Classic ELB (any other type, the default); `external` and `nlb-ip` are left to the AWS Load Balancer Controller",
        ),
        (
            Feature::UdpPorts,
            Support::Honoured,
            "on an NLB; a Classic ELB refuses it (`Protocol UDP not supported by LoadBalancer`)",
        ),
        (Feature::SctpPorts, Support::Refused, "`Protocol SCTP not supported by LoadBalancer` (both kinds)"),
        (Feature::MixedProtocols, Support::Refused, "`mixed protocol is not supported for LoadBalancer`"),
        (
            Feature::LoadBalancerIp,
            Support::Refused,
            "`LoadBalancerIP cannot be specified for AWS ELB`; an NLB takes fixed addresses from `aws-load-balancer-eip-allocations` or `aws-load-balancer-private-ipv4-addresses`",
        ),
        (
            Feature::SourceRanges,
            Support::Honoured,
            "Classic: the ELB's own `k8s-elb-*` group admits only these (not with `aws-load-balancer-security-groups` or `ElbSecurityGroup`); NLB: client rules on the Nodes' groups (not with `DisableSecurityGroupIngress`) and the NLB's own group; else the source-ranges annotation; IPv6 ranges on a dual-stack NLB only",
        ),
        (Feature::SessionAffinity, Support::Refused, "`unsupported load balancer affinity: ClientIP`"),
        (
            Feature::ExternalTrafficPolicyLocal,
            Support::Honoured,
            "the health check is HTTP `/healthz` on `healthCheckNodePort` (both kinds), so only Nodes with a local endpoint take traffic",
        ),
        (
            Feature::DualStack,
            Support::Honoured,
            "an NLB for a Service whose `spec.ipFamilies` include IPv6 is `dualstack` (its targets stay IPv4); a Classic ELB is IPv4 only",
        ),
        (
            Feature::NoNodePorts,
            Support::Ignored,
            "a port without a nodePort gets no listener, as upstream (targets are instances at their nodePorts): without nodePorts nothing is served",
        ),
        (
            Feature::IpModeProxy,
            Support::Ignored,
            "not set: the status holds the DNS name only (`ipMode` needs an `ip`), so traffic always goes through the load balancer",
        ),
    ])
    .with_annotations(annotations())
    .with_orphans(true);
    Capabilities { provider: name.to_string(), instances, routes, load_balancer: load_balancer.then_some(lb) }
}

/// Every annotation the load balancers read, with what it asks for.
fn annotations() -> [(&'static str, &'static str); 32] {
    [
        (
            ann::TYPE,
            "`nlb`: a Network Load Balancer; `external`, `nlb-ip`: left to the AWS Load Balancer Controller; else a Classic ELB",
        ),
        (ann::INTERNAL, "any value but `false`: an internal load balancer (fixed at creation)"),
        (ann::SUBNETS, "the subnets (IDs or `Name` tags)"),
        (ann::EXTRA_TAGS, "tags on every object made for the Service"),
        (ann::HC_PROTOCOL, "health-check protocol: TCP, HTTP, HTTPS (SSL on a Classic ELB)"),
        (ann::HC_PORT, "health-check port, or `traffic-port`"),
        (ann::HC_PATH, "health-check path (HTTP and HTTPS)"),
        (ann::HC_INTERVAL, "seconds between health checks"),
        (ann::HC_TIMEOUT, "seconds before a health check fails"),
        (ann::HC_HEALTHY, "successes before a target is healthy"),
        (ann::HC_UNHEALTHY, "failures before a target is unhealthy"),
        (ann::CROSS_ZONE, "cross-zone load balancing"),
        (ann::ACCESS_LOG_ENABLED, "access logs to S3"),
        (ann::ACCESS_LOG_BUCKET, "the access-log bucket"),
        (ann::ACCESS_LOG_PREFIX, "the access-log key prefix"),
        (ann::ACCESS_LOG_EMIT_INTERVAL, "Classic: minutes between access logs, 5 or 60"),
        (
            ann::TARGET_GROUP_ATTRIBUTES,
            "NLB: `preserve_client_ip.enabled`, `proxy_protocol_v2.enabled`; refused on a Classic ELB",
        ),
        (ann::SSL_CERT, "a certificate ARN: TLS listeners"),
        (ann::SSL_PORTS, "the ports (numbers or names, or `*`) that get TLS listeners"),
        (ann::SSL_POLICY, "the TLS listeners' security policy"),
        (ann::BACKEND_PROTOCOL, "the targets' protocol"),
        (ann::EIP_ALLOCATIONS, "NLB: Elastic IPs, one per subnet (fixed at creation)"),
        (ann::PRIVATE_IPV4, "NLB: private IPv4 addresses, one per subnet (fixed at creation)"),
        (ann::TARGET_NODE_LABELS, "Node labels selecting the targets"),
        (ann::SECURITY_GROUPS, "Classic: the ELB's security groups; refused on an NLB"),
        (ann::EXTRA_SECURITY_GROUPS, "Classic: security groups added to the ELB's; refused on an NLB"),
        (ann::PROXY_PROTOCOL, "Classic: `*` enables proxy protocol on every backend"),
        (ann::CONNECTION_DRAINING_ENABLED, "Classic: connection draining"),
        (ann::CONNECTION_DRAINING_TIMEOUT, "Classic: seconds of connection draining"),
        (ann::CONNECTION_IDLE_TIMEOUT, "Classic: seconds a connection may idle"),
        (ann::SOURCE_RANGES, "client CIDRs when `spec.loadBalancerSourceRanges` is empty"),
        (crate::lb::REPLACE, "`true`: a change AWS cannot make in place replaces the load balancer"),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::annotations::LbKind;
    use crate::lb::check;
    use ccm_framework::provider::CloudError;
    use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};

    fn service(protocols: &[&str]) -> Service {
        Service {
            metadata: kube::api::ObjectMeta {
                name: Some("web".into()),
                namespace: Some("shop".into()),
                uid: Some("0b6f1c2e-1111-2222-3333-444455556666".into()),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                type_: Some("LoadBalancer".into()),
                ports: Some(
                    protocols
                        .iter()
                        .enumerate()
                        .map(|(i, p)| ServicePort {
                            protocol: Some(p.to_string()),
                            port: 80 + i as i32,
                            node_port: Some(30080 + i as i32),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn refused(service: &Service, kind: LbKind) -> bool {
        matches!(check(service, kind), Err(CloudError::Refused { .. }))
    }

    fn lb() -> LoadBalancerCapabilities {
        capabilities(crate::NAME, true, true, true).load_balancer.unwrap()
    }

    #[test]
    fn the_refused_fields_are_those_the_service_check_refuses_on_both_kinds() {
        let lb = lb();
        let mut affinity = service(&["TCP"]);
        affinity.spec.as_mut().unwrap().session_affinity = Some("ClientIP".into());
        let mut address = service(&["TCP"]);
        address.spec.as_mut().unwrap().load_balancer_ip = Some("192.0.2.7".into());
        for (feature, s) in [
            (Feature::SctpPorts, service(&["SCTP"])),
            (Feature::MixedProtocols, service(&["TCP", "UDP"])),
            (Feature::SessionAffinity, affinity),
            (Feature::LoadBalancerIp, address),
        ] {
            assert_eq!(lb.support(feature), Support::Refused, "{feature:?}");
            assert!(refused(&s, LbKind::Nlb) && refused(&s, LbKind::Classic), "{feature:?}");
        }
        assert!(!refused(&service(&["TCP"]), LbKind::Classic) && !refused(&service(&["TCP"]), LbKind::Nlb));
    }

    #[test]
    fn udp_dual_stack_and_local_traffic_are_honoured_on_an_nlb_as_the_notes_say() {
        let lb = lb();
        let udp = service(&["UDP"]);
        assert!(!refused(&udp, LbKind::Nlb) && refused(&udp, LbKind::Classic));
        assert_eq!(lb.support(Feature::UdpPorts), Support::Honoured);
        let mut dual = service(&["TCP"]);
        dual.spec.as_mut().unwrap().ip_families = Some(vec!["IPv4".into(), "IPv6".into()]);
        dual.metadata.annotations = Some([(ann::TYPE.to_string(), "nlb".to_string())].into());
        let cluster = crate::cluster::ClusterIdentity { id: "c".into(), legacy: false };
        let nlb = crate::lb::desired(&dual, &cluster, &Default::default()).unwrap();
        assert_eq!(nlb.ip_address_type, "dualstack");
        assert_eq!(lb.support(Feature::DualStack), Support::Honoured);
        let spec = dual.spec.as_mut().unwrap();
        spec.external_traffic_policy = Some("Local".into());
        spec.health_check_node_port = Some(31999);
        let health = crate::lb::desired(&dual, &cluster, &Default::default()).unwrap().health;
        assert_eq!((health.protocol, health.port), (ann::HealthProtocol::Http, ann::HealthPort::Port(31999)));
        assert_eq!(health.path, "/healthz");
        assert_eq!(lb.support(Feature::ExternalTrafficPolicyLocal), Support::Honoured);
    }

    #[test]
    fn every_annotation_the_provider_parses_is_reported_once() {
        let lb = lb();
        assert!(lb.fields.iter().all(|f| f.support != Support::Unknown && !f.note.is_empty()));
        assert!(lb.orphans);
        let names: Vec<&str> = lb.annotations.iter().map(|a| a.name.as_str()).collect();
        for key in ann::UPSTREAM_KEYS.iter().chain([&ann::SOURCE_RANGES, &crate::lb::REPLACE]) {
            assert!(names.contains(key), "{key} is missing from the report");
        }
        assert_eq!(names.len(), ann::UPSTREAM_KEYS.len() + 2, "no key twice, none made up");
    }
}
