//! What a Service asks of a Network Load Balancer (pure), as upstream builds it: the
//! listeners and their target groups (named as upstream names them), the health check, the
//! tags, and the load-balancer and target-group attributes. Plain inputs in, plain values out;
//! nothing here reads AWS.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Node, Service};

use super::names::{TargetGroupKey, target_group_name};
use super::spec::{self, ServiceShape};
use super::tags::lb_tags;
use crate::annotations::{self as ann, HealthPort, HealthProtocol, LbAnnotations, LbKind};
use crate::cluster::ClusterIdentity;
use crate::config::{ClusterProbe, ProbeMode};
use ccm_framework::provider::CloudError;

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
    /// The target group's name (upstream's).
    pub target_group: String,
}

impl DesiredPort {
    /// The listener's protocol: `TLS` with a certificate, else the Service port's.
    pub fn listener_protocol(&self) -> &str {
        if self.tls.is_some() {
            "TLS"
        } else if self.protocol == "UDP" {
            "UDP"
        } else {
            "TCP"
        }
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

/// A target group's health check, as upstream builds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthSpec {
    /// TCP, HTTP or HTTPS.
    pub protocol: HealthProtocol,
    /// The port checked.
    pub port: HealthPort,
    /// The path (HTTP and HTTPS only).
    pub path: String,
    /// Seconds between checks.
    pub interval: i32,
    /// Seconds before a check fails: sent only when annotated (upstream never sends it, so
    /// AWS's default applies).
    pub timeout: Option<i32>,
    /// Successes before healthy.
    pub healthy_threshold: i32,
    /// Failures before unhealthy.
    pub unhealthy_threshold: i32,
}

impl HealthSpec {
    /// The port as ELBv2 writes it: `traffic-port` or a number.
    pub fn port_string(&self) -> String {
        match self.port {
            HealthPort::TrafficPort => "traffic-port".into(),
            HealthPort::Port(p) => p.to_string(),
        }
    }

    /// The path to send: none for TCP, as upstream.
    pub fn api_path(&self) -> Option<String> {
        self.protocol.has_path().then(|| self.path.clone())
    }
}

/// Everything a Service asks of its NLB.
#[derive(Debug, Clone)]
pub struct Desired {
    /// The Service's shape (name, ports, client ranges, annotations, ...).
    pub shape: ServiceShape,
    /// The load balancer's name.
    pub name: String,
    /// `internal`.
    pub internal: bool,
    /// Listeners and target groups, one per port with a nodePort.
    pub ports: Vec<DesiredPort>,
    /// The health check of every target group.
    pub health: HealthSpec,
    /// The tags of the load balancer, its listeners and target groups.
    pub tags: BTreeMap<String, String>,
    /// `ipv4`, or `dualstack` for a Service with IPv6 (ours).
    pub ip_address_type: &'static str,
}

impl Desired {
    /// The annotations.
    pub fn annotations(&self) -> &LbAnnotations {
        &self.shape.annotations
    }

    /// The client CIDRs.
    pub fn source_ranges(&self) -> &[String] {
        &self.shape.source_ranges
    }
}

/// The NLB health check upstream builds (`buildNLBHealthCheckConfiguration`): TCP on the
/// traffic port every 30 s with thresholds 3 and 3; for `externalTrafficPolicy: Local` HTTP
/// `/healthz` on the `healthCheckNodePort` every 10 s with 2 and 2; then the protocol, path and
/// port annotations; then, in `Shared` mode and not Local, kube-proxy's port and path over
/// them; then the interval and threshold annotations.
pub fn health_spec(shape: &ServiceShape, probe: &ClusterProbe) -> Result<HealthSpec, CloudError> {
    let a = &shape.annotations.health;
    let mut h = if shape.local {
        HealthSpec {
            protocol: HealthProtocol::Http,
            port: HealthPort::Port(shape.health_check_node_port),
            path: "/healthz".into(),
            interval: 10,
            timeout: None,
            healthy_threshold: 2,
            unhealthy_threshold: 2,
        }
    } else {
        HealthSpec {
            protocol: HealthProtocol::Tcp,
            port: HealthPort::TrafficPort,
            path: "/".into(),
            interval: 30,
            timeout: None,
            healthy_threshold: 3,
            unhealthy_threshold: 3,
        }
    };
    if let Some(p) = a.protocol {
        h.protocol = p;
    }
    match h.protocol {
        HealthProtocol::Http | HealthProtocol::Https => {
            if let Some(path) = &a.path {
                h.path = path.clone();
            }
        }
        HealthProtocol::Tcp => h.path.clear(),
        HealthProtocol::Ssl => {
            return Err(spec::refused_annotation(ann::upstream(
                ann::HC_PROTOCOL,
                "Unsupported health check protocol SSL",
            )));
        }
    }
    if let Some(p) = a.port {
        h.port = p;
    }
    match probe.mode {
        ProbeMode::Shared if !shape.local => {
            h.path = probe.shared_path().to_string();
            h.port = HealthPort::Port(probe.shared_port());
            h.protocol = HealthProtocol::Http;
        }
        ProbeMode::Shared | ProbeMode::ServiceNodePort => {}
        ProbeMode::Unsupported => {
            return Err(CloudError::InvalidConfig(
                "Unsupported ClusterServiceLoadBalancerHealthProbeMode in [Global]; expected Shared or ServiceNodePort"
                    .into(),
            ));
        }
    }
    h.interval = a.interval.unwrap_or(h.interval);
    h.timeout = a.timeout;
    h.healthy_threshold = a.healthy_threshold.unwrap_or(h.healthy_threshold);
    h.unhealthy_threshold = a.unhealthy_threshold.unwrap_or(h.unhealthy_threshold);
    Ok(h)
}

/// Everything the Service asks of its NLB in the cluster `cluster`, or why it cannot have one.
pub fn desired(service: &Service, cluster: &ClusterIdentity, probe: &ClusterProbe) -> Result<Desired, CloudError> {
    let shape = spec::check(service, LbKind::Nlb)?;
    let health = health_spec(&shape, probe)?;
    let a = &shape.annotations;
    // Upstream's AWS restriction: client IP preservation stays on for UDP.
    if let Some(attrs) = &a.target_group_attributes
        && attrs.get("preserve_client_ip.enabled").is_some_and(|v| v == "false")
        && shape.all_ports.iter().any(|p| p.protocol == "UDP")
    {
        return Err(spec::refused_annotation(ann::upstream(
            ann::TARGET_GROUP_ATTRIBUTES,
            "error validating target group attributes: client IP preservation can't be disabled for UDP ports",
        )));
    }
    let namespace = service.metadata.namespace.as_deref().unwrap_or("default");
    let name = service.metadata.name.as_deref().unwrap_or_default();
    let ports = shape
        .ports
        .iter()
        .map(|p| {
            let tls = a
                .tls
                .as_ref()
                .filter(|t| p.protocol != "UDP" && t.ports.covers(p.port, p.name.as_deref()))
                .map(|t| ListenerTls { certificate_arn: t.certificate_arn.clone(), policy: t.policy.clone() });
            let protocol = if tls.is_some() && a.backend_protocol.as_deref() == Some("ssl") {
                "TLS".to_string()
            } else {
                p.protocol.clone()
            };
            let target_group = target_group_name(&TargetGroupKey {
                cluster_id: &cluster.id,
                namespace,
                name,
                port: p.port,
                node_port: p.node_port,
                protocol: &protocol,
                health_protocol: health.protocol.as_str(),
                health_interval: health.interval,
            });
            DesiredPort { port: p.port, protocol, node_port: p.node_port, tls, target_group }
        })
        .collect();
    Ok(Desired {
        name: shape.name.clone(),
        internal: a.internal,
        ports,
        health,
        tags: lb_tags(cluster, service, &a.extra_tags),
        ip_address_type: spec::ip_address_type(service),
        shape,
    })
}

/// The ports the health checks reach on the Nodes: the nodePort for `traffic-port`, else the
/// health-check port (upstream's `healthCheckPorts`).
pub fn health_rule_ports(d: &Desired) -> BTreeSet<i32> {
    d.ports
        .iter()
        .map(|p| match d.health.port {
            HealthPort::TrafficPort => p.node_port,
            HealthPort::Port(hp) => hp,
        })
        .collect()
}

/// The nodePorts clients reach, and their protocol (`udp` if any port is UDP, as upstream).
pub fn client_ports(d: &Desired) -> (BTreeSet<i32>, &'static str) {
    let protocol = if d.ports.iter().any(|p| p.protocol == "UDP") { "udp" } else { "tcp" };
    (d.ports.iter().map(|p| p.node_port).collect(), protocol)
}

/// Whether a Node is a target: it carries every `target-node-labels` label (and value, where
/// one is given).
pub fn node_selected(node: &Node, labels: &BTreeMap<String, Option<String>>) -> bool {
    let have = node.metadata.labels.as_ref();
    labels.iter().all(|(k, v)| match (have.and_then(|l| l.get(k)), v) {
        (Some(_), None) => true,
        (Some(actual), Some(want)) => actual == want,
        (None, _) => false,
    })
}

/// The load-balancer attributes upstream reconciles: cross-zone and access logs (`false` when
/// the annotations are absent), and the bucket and prefix while logs are on.
pub fn lb_attributes(a: &LbAnnotations) -> BTreeMap<&'static str, String> {
    let enabled = a.access_log.as_ref().is_some_and(|l| l.enabled);
    let mut out = BTreeMap::from([
        ("load_balancing.cross_zone.enabled", a.cross_zone.unwrap_or(false).to_string()),
        ("access_logs.s3.enabled", enabled.to_string()),
    ]);
    if let Some(log) = a.access_log.as_ref().filter(|l| l.enabled) {
        out.insert("access_logs.s3.bucket", log.bucket.clone());
        out.insert("access_logs.s3.prefix", log.prefix.clone());
    }
    out
}

/// The attributes to change: those in `want` whose value differs from `have` (a missing one
/// counts as empty, as upstream).
pub fn attribute_changes(
    want: &BTreeMap<&'static str, String>,
    have: &BTreeMap<String, String>,
) -> Vec<(String, String)> {
    want.iter()
        .filter(|(k, v)| have.get(**k).map(String::as_str).unwrap_or("") != v.as_str())
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

/// The target-group attributes to change, as upstream: only those the annotation names, only
/// where the target group lists the attribute, only where the value differs.
pub fn tg_attribute_changes(
    annotation: &BTreeMap<String, String>,
    have: &BTreeMap<String, String>,
) -> Vec<(String, String)> {
    annotation
        .iter()
        .filter(|(k, v)| have.get(*k).is_some_and(|h| h != *v))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lb::fixtures::svc;
    use ccm_framework::provider::Refusal;

    fn c() -> ClusterIdentity {
        ClusterIdentity { id: "c".into(), legacy: false }
    }

    fn d(pairs: &[(&str, &str)], etp: &str, hcnp: i32) -> Desired {
        desired(&svc(pairs, &[(80, "TCP", 30080)], etp, hcnp), &c(), &ClusterProbe::default()).unwrap()
    }

    #[test]
    fn the_default_health_check_is_upstreams_tcp_on_the_traffic_port_without_a_timeout() {
        let h = d(&[], "Cluster", 0).health;
        assert_eq!(
            h,
            HealthSpec {
                protocol: HealthProtocol::Tcp,
                port: HealthPort::TrafficPort,
                path: String::new(),
                interval: 30,
                timeout: None,
                healthy_threshold: 3,
                unhealthy_threshold: 3,
            }
        );
        assert_eq!((h.port_string(), h.api_path()), ("traffic-port".to_string(), None));
    }

    #[test]
    fn local_traffic_checks_http_healthz_on_the_health_check_node_port() {
        let h = d(&[], "Local", 31999).health;
        assert_eq!(
            (h.protocol, h.port_string(), h.api_path()),
            (HealthProtocol::Http, "31999".into(), Some("/healthz".into()))
        );
        assert_eq!((h.interval, h.healthy_threshold, h.unhealthy_threshold), (10, 2, 2));
    }

    #[test]
    fn annotations_override_the_defaults_and_tcp_drops_the_path() {
        let h = d(
            &[(ann::HC_PROTOCOL, "http"), (ann::HC_PATH, "/ready"), (ann::HC_PORT, "8080"), (ann::HC_TIMEOUT, "6")],
            "Cluster",
            0,
        )
        .health;
        assert_eq!(
            (h.protocol, h.port_string(), h.api_path(), h.timeout),
            (HealthProtocol::Http, "8080".into(), Some("/ready".into()), Some(6))
        );
        let h = d(&[(ann::HC_PROTOCOL, "TCP"), (ann::HC_PATH, "/ignored")], "Local", 31999).health;
        assert_eq!((h.protocol, h.api_path()), (HealthProtocol::Tcp, None));
        let e = desired(
            &svc(&[(ann::HC_PROTOCOL, "SSL")], &[(80, "TCP", 30080)], "Cluster", 0),
            &c(),
            &ClusterProbe::default(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("Unsupported health check protocol"), "{e}");
    }

    #[test]
    fn shared_mode_checks_kube_proxy_over_the_annotations_for_cluster_traffic_only() {
        let shared = ClusterProbe { mode: ProbeMode::Shared, ..Default::default() };
        let s = svc(
            &[(ann::HC_PROTOCOL, "TCP"), (ann::HC_PORT, "8080"), (ann::HC_INTERVAL, "10")],
            &[(80, "TCP", 30080)],
            "Cluster",
            0,
        );
        let h = desired(&s, &c(), &shared).unwrap().health;
        assert_eq!(
            (h.protocol, h.port_string(), h.api_path(), h.interval),
            (HealthProtocol::Http, "10256".into(), Some("/healthz".into()), 10)
        );
        let local = desired(&svc(&[], &[(80, "TCP", 30080)], "Local", 31999), &c(), &shared).unwrap().health;
        assert_eq!(local.port_string(), "31999");
        let odd = ClusterProbe { mode: ProbeMode::Unsupported, ..Default::default() };
        assert!(matches!(desired(&s, &c(), &odd), Err(CloudError::InvalidConfig(_))));
    }

    #[test]
    fn target_groups_are_named_as_upstream_and_tls_ports_follow_the_annotations() {
        let cert = "arn:aws:acm:us-east-1:123456789012:certificate/abc";
        let mut s = svc(
            &[(ann::SSL_CERT, cert), (ann::SSL_PORTS, "https"), (ann::BACKEND_PROTOCOL, "ssl")],
            &[(80, "TCP", 30080), (443, "TCP", 30443)],
            "Cluster",
            0,
        );
        s.spec.as_mut().unwrap().ports.as_mut().unwrap()[1].name = Some("https".into());
        let d = desired(&s, &c(), &ClusterProbe::default()).unwrap();
        assert_eq!(d.ports[0].listener_protocol(), "TCP");
        assert_eq!((d.ports[1].listener_protocol(), d.ports[1].protocol.as_str()), ("TLS", "TLS"));
        assert!(d.ports[0].target_group.starts_with("k8s-shop-web-") && d.ports[0].target_group.len() == 23);
        assert_ne!(d.ports[0].target_group, d.ports[1].target_group);
        // Only exactly `ssl` makes TLS target groups on an NLB, as upstream.
        let mut s2 = s.clone();
        s2.metadata.annotations.as_mut().unwrap().insert(ann::BACKEND_PROTOCOL.into(), "SSL".into());
        assert_eq!(desired(&s2, &c(), &ClusterProbe::default()).unwrap().ports[1].protocol, "TCP");
    }

    #[test]
    fn udp_ports_refuse_disabling_client_ip_preservation() {
        let s = svc(
            &[(ann::TARGET_GROUP_ATTRIBUTES, "preserve_client_ip.enabled=false")],
            &[(53, "UDP", 30053)],
            "Cluster",
            0,
        );
        let e = desired(&s, &c(), &ClusterProbe::default()).unwrap_err();
        assert!(
            matches!(e, CloudError::Refused { reason: Refusal::InvalidAnnotation, .. })
                && e.to_string().contains("UDP"),
            "{e}"
        );
    }

    #[test]
    fn health_rule_and_client_ports_follow_upstream() {
        let s = svc(&[], &[(80, "TCP", 30080), (443, "TCP", 30443)], "Cluster", 0);
        let d = desired(&s, &c(), &ClusterProbe::default()).unwrap();
        assert_eq!(health_rule_ports(&d), [30080, 30443].into());
        assert_eq!(client_ports(&d), ([30080, 30443].into(), "tcp"));
        let l = desired(&svc(&[], &[(80, "TCP", 30080)], "Local", 32000), &c(), &ClusterProbe::default()).unwrap();
        assert_eq!(health_rule_ports(&l), [32000].into());
    }

    #[test]
    fn attributes_compare_as_upstream() {
        let none = LbAnnotations::default();
        let want = lb_attributes(&none);
        assert_eq!(want.len(), 2);
        let have: BTreeMap<String, String> =
            [("load_balancing.cross_zone.enabled".to_string(), "false".to_string())].into();
        assert_eq!(attribute_changes(&want, &have), vec![("access_logs.s3.enabled".to_string(), "false".to_string())]);
        let annotation: BTreeMap<String, String> =
            [("proxy_protocol_v2.enabled".to_string(), "true".to_string())].into();
        assert!(tg_attribute_changes(&annotation, &BTreeMap::new()).is_empty(), "only listed attributes change");
        let listed: BTreeMap<String, String> = [("proxy_protocol_v2.enabled".to_string(), "false".to_string())].into();
        assert_eq!(tg_attribute_changes(&annotation, &listed).len(), 1);
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
}
