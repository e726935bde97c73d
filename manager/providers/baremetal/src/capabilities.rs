//! What the baremetal provider's load balancers honour (KEP-6128's capability report, see
//! `ccm_framework::capabilities`), in the mode the provider runs in: with `loadBalancer.mode:
//! addresses` it assigns addresses and kube-proxy carries the traffic (`ipMode: VIP`); with
//! `mode: proxy` the leader's data path carries it (`ipMode: Proxy`). Pure.

use ccm_framework::capabilities::{Capabilities, Feature, LoadBalancerCapabilities, Support};

use crate::ipam::{
    ADDRESS_POOL_ANNOTATION, ALLOW_SHARED_IP_ANNOTATION, CILIUM_LOAD_BALANCER_IPS_ANNOTATIONS,
    CILIUM_SHARING_CROSS_NAMESPACE_ANNOTATIONS, CILIUM_SHARING_KEY_ANNOTATIONS, LOAD_BALANCER_IPS_ANNOTATION,
    METALLB_ADDRESS_POOL_ANNOTATIONS, METALLB_ALLOW_SHARED_IP_ANNOTATIONS, METALLB_LOAD_BALANCER_IPS_ANNOTATIONS,
    SHARING_CROSS_NAMESPACE_ANNOTATION,
};
use crate::proxy::IP_MODE_ANNOTATION;

/// The annotation the data path reads client ranges from (only builds with it read it).
#[cfg(feature = "datapath")]
const SOURCE_RANGES_ANNOTATION: &str = crate::datapath::config::SOURCE_RANGES_ANNOTATION;

/// The report of a baremetal provider named `name`: `load_balancer` when it has pools (the
/// service controller runs), `proxy` when its data path carries the traffic (`loadBalancer.mode:
/// proxy` in a build with the data path). It looks instances up and programs no routes.
pub fn capabilities(name: &str, load_balancer: bool, proxy: bool) -> Capabilities {
    let lb = if proxy { proxy_mode() } else { address_mode() };
    Capabilities {
        provider: name.to_string(),
        instances: true,
        routes: false,
        load_balancer: load_balancer.then_some(lb),
    }
}

/// Requested addresses, as both modes treat them.
const REQUESTED: &str = "given when a pool admitting the Service holds it and it is free, else refused (`RequestedAddressUnavailable`, `RequestedAddressTaken`); `ccm.rs/load-balancer-ips` and MetalLB's and Cilium's annotations win over it";

/// Two families, as both modes treat them.
const DUAL_STACK: &str = "an address of each family from pools of that family (`PreferDualStack`: the second when one is free; `RequireDualStack`: both or none)";

/// Mode addresses: an address from a pool, traffic left to the announcer and kube-proxy.
fn address_mode() -> LoadBalancerCapabilities {
    LoadBalancerCapabilities::from_fields([
        (
            Feature::TcpPorts,
            Support::Honoured,
            "an address from a pool; an announcer draws the traffic and kube-proxy forwards it (`ipMode: VIP`); a port the pool refuses (`minPort`, `allowedPorts`) refuses the Service",
        ),
        (Feature::UdpPorts, Support::Honoured, "kube-proxy forwards it, as TCP"),
        (Feature::SctpPorts, Support::Honoured, "kube-proxy forwards it, as TCP"),
        (Feature::MixedProtocols, Support::Honoured, "one address for the ports of every protocol"),
        (Feature::LoadBalancerIp, Support::Honoured, REQUESTED),
        (
            Feature::SourceRanges,
            Support::Honoured,
            "enforced by kube-proxy, not the provider: it drops other clients on the address (`ipMode: VIP`)",
        ),
        (Feature::SessionAffinity, Support::Honoured, "kube-proxy keeps a client on one endpoint (`ipMode: VIP`)"),
        (
            Feature::ExternalTrafficPolicyLocal,
            Support::Honoured,
            "the provider's L2 and BGP announcers announce the address only from Nodes with a ready endpoint; kube-proxy keeps the client address",
        ),
        (Feature::DualStack, Support::Honoured, DUAL_STACK),
        (
            Feature::NoNodePorts,
            Support::Honoured,
            "no nodePort is needed: kube-proxy takes the address straight to the endpoints",
        ),
        (
            Feature::IpModeProxy,
            Support::Refused,
            "the status says `ipMode: VIP`; asking `Proxy` with `ccm.rs/ip-mode` is refused (`InvalidAnnotation`) without `loadBalancer.mode: proxy`",
        ),
    ])
    .with_annotations(shared_annotations())
    .with_annotations([(IP_MODE_ANNOTATION, "`VIP` only; `Proxy` needs `loadBalancer.mode: proxy`")])
    .with_orphans(true)
}

/// Mode proxy: the leader's data path listens on the addresses and forwards to the nodePorts.
fn proxy_mode() -> LoadBalancerCapabilities {
    let lb = LoadBalancerCapabilities::from_fields([
        (
            Feature::TcpPorts,
            Support::Honoured,
            "the leader's data path listens on each address and port and forwards to the Nodes' nodePorts (`ipMode: Proxy`); a port the pool refuses (`minPort`, `allowedPorts`) refuses the Service",
        ),
        (Feature::UdpPorts, Support::Honoured, "as TCP, one session per client address"),
        (
            Feature::SctpPorts,
            Support::Ignored,
            "the data path does not proxy SCTP: the port gets no listener (`ccm.rs/ip-mode: VIP` leaves the Service to kube-proxy)",
        ),
        (Feature::MixedProtocols, Support::Honoured, "TCP and UDP listeners on one address"),
        (Feature::LoadBalancerIp, Support::Honoured, REQUESTED),
        (
            Feature::SourceRanges,
            Support::Honoured,
            "the data path closes connections from other clients (else the `load-balancer-source-ranges` annotation)",
        ),
        (
            Feature::SessionAffinity,
            Support::Honoured,
            "the client address picks the backend Node (rendezvous hashing)",
        ),
        (
            Feature::ExternalTrafficPolicyLocal,
            Support::Honoured,
            "health checks on `healthCheckNodePort`, so only Nodes with a local endpoint get traffic (unless `proxy.healthChecks: false`); Pods see the proxy's address, not the client's, unless `ccm.rs/proxy-protocol` sends it",
        ),
        (Feature::DualStack, Support::Honoured, DUAL_STACK),
        (
            Feature::NoNodePorts,
            Support::Ignored,
            "a port without a nodePort gets no listener: the address is reported and the port not served (`ccm.rs/ip-mode: VIP` leaves the Service to kube-proxy)",
        ),
        (
            Feature::IpModeProxy,
            Support::Honoured,
            "`Proxy` by default; `ccm.rs/ip-mode: VIP` leaves one Service's traffic to kube-proxy",
        ),
    ])
    .with_annotations(shared_annotations())
    .with_annotations([(IP_MODE_ANNOTATION, "`VIP` or `Proxy`: who carries this Service's traffic")]);
    #[cfg(feature = "datapath")]
    let lb = lb.with_annotations([
        (SOURCE_RANGES_ANNOTATION, "client CIDRs when `spec.loadBalancerSourceRanges` is empty"),
        (
            crate::proxy::PROXY_PROTOCOL_ANNOTATION,
            "`v1` or `v2`: each backend connection starts with a PROXY protocol header naming the client (TCP ports only)",
        ),
    ]);
    lb.with_orphans(true)
}

/// The annotations both modes read: requested addresses, sharing and pools, ours first, then
/// MetalLB's, then Cilium's (the first one set wins).
fn shared_annotations() -> Vec<(&'static str, &'static str)> {
    let mut out = vec![
        (LOAD_BALANCER_IPS_ANNOTATION, "the addresses asked for, one per family (over `spec.loadBalancerIP`)"),
        (
            ALLOW_SHARED_IP_ANNOTATION,
            "a sharing key: Services with one key and distinct ports share an address of a pool that allows sharing",
        ),
        (SHARING_CROSS_NAMESPACE_ANNOTATION, "the other namespaces (or `*`) whose Services may share the address"),
        (ADDRESS_POOL_ANNOTATION, "the pool to take addresses from (an `autoAssign: false` one too)"),
    ];
    out.extend(
        METALLB_LOAD_BALANCER_IPS_ANNOTATIONS.map(|a| (a, "MetalLB's addresses asked for, when ours is absent")),
    );
    out.extend(METALLB_ALLOW_SHARED_IP_ANNOTATIONS.map(|a| (a, "MetalLB's sharing key, when ours is absent")));
    out.extend(METALLB_ADDRESS_POOL_ANNOTATIONS.map(|a| (a, "MetalLB's pool name, when ours is absent")));
    out.extend(CILIUM_LOAD_BALANCER_IPS_ANNOTATIONS.map(|a| (a, "Cilium's addresses asked for, after MetalLB's")));
    out.extend(CILIUM_SHARING_KEY_ANNOTATIONS.map(|a| (a, "Cilium's sharing key, after MetalLB's")));
    out.extend(
        CILIUM_SHARING_CROSS_NAMESPACE_ANNOTATIONS.map(|a| (a, "Cilium's sharing namespaces, when ours is absent")),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ipam::{AllocError, Family, Slot, request_for};
    use crate::proxy::{IpMode, ip_mode_of};
    use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};

    fn service(ports: &[(&str, Option<i32>)]) -> Service {
        Service {
            metadata: kube::api::ObjectMeta {
                name: Some("web".into()),
                namespace: Some("shop".into()),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                type_: Some("LoadBalancer".into()),
                ports: Some(
                    ports
                        .iter()
                        .enumerate()
                        .map(|(i, (protocol, node_port))| ServicePort {
                            protocol: Some(protocol.to_string()),
                            port: 80 + i as i32,
                            node_port: *node_port,
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn lb(proxy: bool) -> LoadBalancerCapabilities {
        capabilities(crate::NAME, true, proxy).load_balancer.unwrap()
    }

    #[test]
    fn every_field_is_reported_in_both_modes_and_no_orphan_listing_is_claimed() {
        for proxy in [false, true] {
            let c = capabilities(crate::NAME, true, proxy);
            assert!((c.instances, c.routes) == (true, false));
            let lb = c.load_balancer.unwrap();
            assert!(lb.fields.iter().all(|f| f.support != Support::Unknown && !f.note.is_empty()), "{lb:?}");
            assert!(lb.orphans);
            assert!(lb.annotations.iter().any(|a| a.name == LOAD_BALANCER_IPS_ANNOTATION));
        }
        assert!(capabilities(crate::NAME, false, false).load_balancer.is_none(), "no pools, no service controller");
    }

    #[test]
    fn the_ip_mode_claims_are_the_annotation_checks_own() {
        let mut asks_proxy = service(&[("TCP", Some(30080))]);
        asks_proxy.metadata.annotations = Some([(IP_MODE_ANNOTATION.to_string(), "Proxy".to_string())].into());
        assert!(ip_mode_of(&asks_proxy, false).is_err());
        assert_eq!(lb(false).support(Feature::IpModeProxy), Support::Refused);
        assert_eq!(ip_mode_of(&asks_proxy, true), Ok(IpMode::Proxy));
        assert_eq!(lb(true).support(Feature::IpModeProxy), Support::Honoured);
    }

    #[test]
    fn a_requested_address_and_two_families_are_what_the_request_asks_the_allocator_for() {
        let mut s = service(&[("TCP", Some(30080))]);
        s.spec.as_mut().unwrap().load_balancer_ip = Some("192.0.2.7".into());
        let request = request_for(&s).unwrap();
        assert_eq!(request.slots, [Slot::Exact("192.0.2.7".parse().unwrap())]);
        let mut s = service(&[("TCP", Some(30080))]);
        let spec = s.spec.as_mut().unwrap();
        spec.ip_family_policy = Some("RequireDualStack".into());
        spec.ip_families = Some(vec!["IPv6".into(), "IPv4".into()]);
        let families: Vec<Option<Family>> = request_for(&s)
            .unwrap()
            .slots
            .iter()
            .map(|slot| match slot {
                Slot::Any { family, required: true } => *family,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(families, [Some(Family::V6), Some(Family::V4)]);
        s.metadata.annotations = Some([(LOAD_BALANCER_IPS_ANNOTATION.to_string(), "192.0.2.7".to_string())].into());
        assert!(matches!(request_for(&s), Err(AllocError::Unsatisfiable(..))), "RequireDualStack with one address");
        for proxy in [false, true] {
            assert_eq!(lb(proxy).support(Feature::LoadBalancerIp), Support::Honoured);
            assert_eq!(lb(proxy).support(Feature::DualStack), Support::Honoured);
        }
    }

    #[cfg(feature = "datapath")]
    #[test]
    fn the_proxy_mode_claims_are_what_the_data_path_makes_of_the_service() {
        use crate::datapath::config::{Affinity, Protocol, Settings, service_spec};
        let mut s = service(&[("TCP", Some(30080)), ("UDP", Some(30081)), ("SCTP", Some(30082)), ("TCP", None)]);
        let spec = s.spec.as_mut().unwrap();
        spec.session_affinity = Some("ClientIP".into());
        spec.load_balancer_source_ranges = Some(vec!["198.51.100.0/24".into()]);
        let ip = "192.0.2.7".parse().unwrap();
        let served = service_spec(&s, &[], &[ip], &Settings::default()).unwrap();
        let protocols: Vec<(Protocol, u16)> = served.ports.iter().map(|p| (p.protocol, p.port)).collect();
        assert_eq!(
            protocols,
            [(Protocol::Tcp, 80), (Protocol::Udp, 81)],
            "SCTP and the port without a nodePort skipped"
        );
        assert_eq!(served.affinity, Affinity::ClientIp);
        assert_eq!(served.source_ranges, ["198.51.100.0/24".parse::<ipnet::IpNet>().unwrap()]);
        let proxy = lb(true);
        for (feature, support) in [
            (Feature::SctpPorts, Support::Ignored),
            (Feature::NoNodePorts, Support::Ignored),
            (Feature::MixedProtocols, Support::Honoured),
            (Feature::SessionAffinity, Support::Honoured),
            (Feature::SourceRanges, Support::Honoured),
        ] {
            assert_eq!(proxy.support(feature), support, "{feature:?}");
        }
        assert!(proxy.annotations.iter().any(|a| a.name == SOURCE_RANGES_ANNOTATION));
        assert!(proxy.annotations.iter().any(|a| a.name == crate::proxy::PROXY_PROTOCOL_ANNOTATION));
        assert!(
            !lb(false).annotations.iter().any(|a| a.name == SOURCE_RANGES_ANNOTATION),
            "kube-proxy reads the field only"
        );
    }
}
