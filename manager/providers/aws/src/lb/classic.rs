//! What a Service asks of a Classic ELB and what differs from what exists (pure), as upstream
//! builds it: listeners (TCP, SSL, HTTP, HTTPS from `ssl-cert`, `ssl-ports` and
//! `backend-protocol`), the health check, the attributes, proxy-protocol backends, the SSL
//! negotiation policy, tags and instances. Differences are computed so that an unchanged
//! Service makes no change; where upstream writes on every sync whatever exists (attributes,
//! the proxy-protocol policy, the SSL policy of each listener, additional tags), this compares
//! first.

use std::collections::{BTreeMap, BTreeSet};

use super::names::{PROXY_PROTOCOL_POLICY, ssl_policy_name};
use super::spec::{ServiceShape, refused_annotation};
use crate::annotations::{self as ann, AnnotationError, HealthPort, HealthProtocol};
use crate::config::{ClusterProbe, ProbeMode};
use ccm_framework::provider::CloudError;

/// A listener: as sent (protocols in lower case, as upstream sends them) or as described.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listener {
    /// `tcp`, `ssl`, `http` or `https`.
    pub protocol: String,
    /// The load balancer's port.
    pub port: i32,
    /// The instances' protocol.
    pub instance_protocol: String,
    /// The nodePort.
    pub instance_port: i32,
    /// The certificate of an SSL or HTTPS listener.
    pub certificate: Option<String>,
}

impl Listener {
    /// Whether two listeners are the same (upstream's `elbListenersAreEqual`: protocols and the
    /// certificate in any case).
    pub fn same(&self, other: &Listener) -> bool {
        self.protocol.eq_ignore_ascii_case(&other.protocol)
            && self.instance_protocol.eq_ignore_ascii_case(&other.instance_protocol)
            && self.port == other.port
            && self.instance_port == other.instance_port
            && match (&self.certificate, &other.certificate) {
                (None, None) => true,
                (Some(a), Some(b)) => a.eq_ignore_ascii_case(b),
                _ => false,
            }
    }

    /// Whether it terminates TLS (its SSL negotiation policy applies).
    pub fn is_tls(&self) -> bool {
        self.protocol.eq_ignore_ascii_case("ssl") || self.protocol.eq_ignore_ascii_case("https")
    }
}

/// The listeners of the Service's ports that have a nodePort (upstream's `buildListener`).
pub fn listeners(shape: &ServiceShape) -> Result<Vec<Listener>, CloudError> {
    let a = &shape.annotations;
    let backend = a.backend_protocol.as_deref();
    shape
        .ports
        .iter()
        .map(|p| {
            let lower = p.protocol.to_ascii_lowercase();
            let name = p.name.as_deref().map(str::to_ascii_lowercase);
            let mut l = Listener {
                protocol: lower.clone(),
                port: p.port,
                instance_protocol: lower,
                instance_port: p.node_port,
                certificate: None,
            };
            match &a.tls {
                Some(tls) if tls.ports.covers(p.port, name.as_deref()) => {
                    let (front, back) = match backend {
                        None => ("ssl", "tcp"),
                        Some(b @ ("https" | "http")) => ("https", b),
                        Some(b @ ("ssl" | "tcp")) => ("ssl", b),
                        Some(_) => {
                            return Err(refused_annotation(AnnotationError::Invalid {
                                annotation: ann::BACKEND_PROTOCOL,
                                expected: format!(
                                    "https, http, ssl or tcp with {} (Invalid backend protocol)",
                                    ann::SSL_CERT
                                ),
                            }));
                        }
                    };
                    l.protocol = front.into();
                    l.instance_protocol = back.into();
                    l.certificate = Some(tls.certificate_arn.clone());
                }
                _ if backend == Some("http") => {
                    l.protocol = "http".into();
                    l.instance_protocol = "http".into();
                }
                _ => {}
            }
            Ok(l)
        })
        .collect()
}

/// The listeners to create and the load-balancer ports whose listeners to delete: any
/// difference replaces the listener on that port, as upstream.
pub fn listener_changes(have: &[Listener], want: &[Listener]) -> (Vec<Listener>, Vec<i32>) {
    let removals: Vec<i32> = have.iter().filter(|h| !want.iter().any(|w| w.same(h))).map(|h| h.port).collect();
    let additions: Vec<Listener> = want.iter().filter(|w| !have.iter().any(|h| h.same(w))).cloned().collect();
    (additions, removals)
}

/// A Classic ELB's health check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthCheck {
    /// `<PROTOCOL>:<port><path>`.
    pub target: String,
    /// Seconds between checks.
    pub interval: i32,
    /// Seconds before a check fails.
    pub timeout: i32,
    /// Successes before healthy.
    pub healthy_threshold: i32,
    /// Failures before unhealthy.
    pub unhealthy_threshold: i32,
}

/// The health check upstream sets: on the first listener's nodePort, TCP (SSL for an `https`
/// or `ssl` backend), or HTTP kube-proxy in `Shared` mode; for `externalTrafficPolicy: Local`
/// HTTP `/healthz` on the `healthCheckNodePort`; then the protocol, port and path annotations;
/// 10 s interval, 5 s timeout, thresholds 2 and 6 unless annotated.
pub fn health_check(shape: &ServiceShape, listeners: &[Listener], probe: &ClusterProbe) -> HealthCheck {
    let a = &shape.annotations.health;
    let first = listeners.first().map(|l| l.instance_port).unwrap_or(0);
    let (mut protocol, mut port, mut path) = if shape.local {
        let port = if a.port == Some(HealthPort::TrafficPort) { first } else { shape.health_check_node_port };
        (HealthProtocol::Http, port, "/healthz".to_string())
    } else {
        let backend = shape.annotations.backend_protocol.as_deref().map(str::to_ascii_lowercase);
        let p =
            if matches!(backend.as_deref(), Some("https" | "ssl")) { HealthProtocol::Ssl } else { HealthProtocol::Tcp };
        if probe.mode == ProbeMode::Shared {
            (HealthProtocol::Http, probe.shared_port(), probe.shared_path().to_string())
        } else {
            (p, first, String::new())
        }
    };
    if let Some(p) = a.protocol {
        protocol = p;
    }
    if let Some(HealthPort::Port(p)) = a.port {
        port = p;
    }
    if protocol.has_path() {
        if path.is_empty() {
            path = "/".into();
        }
        if let Some(p) = &a.path {
            path = p.clone();
        }
    } else {
        path.clear();
    }
    HealthCheck {
        target: format!("{}:{port}{path}", protocol.as_str()),
        interval: a.interval.unwrap_or(10),
        timeout: a.timeout.unwrap_or(5),
        healthy_threshold: a.healthy_threshold.unwrap_or(2),
        unhealthy_threshold: a.unhealthy_threshold.unwrap_or(6),
    }
}

/// A Classic ELB's attributes as the annotations ask for them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Attributes {
    /// Cross-zone load balancing.
    pub cross_zone: bool,
    /// Access logs on.
    pub access_log: bool,
    /// Their interval (minutes), when asked.
    pub emit_interval: Option<i32>,
    /// Their bucket, when asked.
    pub bucket: Option<String>,
    /// Their prefix, when asked.
    pub prefix: Option<String>,
    /// Connection draining on.
    pub draining: bool,
    /// Its timeout, when asked.
    pub draining_timeout: Option<i32>,
    /// The idle timeout (60 s unless asked).
    pub idle_timeout: i32,
}

/// The attributes upstream sets: everything off and a 60 s idle timeout unless annotated.
pub fn attributes(shape: &ServiceShape) -> Attributes {
    let a = &shape.annotations;
    let log = a.access_log.as_ref();
    Attributes {
        cross_zone: a.cross_zone.unwrap_or(false),
        access_log: log.is_some_and(|l| l.enabled),
        emit_interval: log.and_then(|l| l.emit_interval),
        bucket: log.map(|l| l.bucket.clone()).filter(|b| !b.is_empty()),
        prefix: log.map(|l| l.prefix.clone()).filter(|p| !p.is_empty()),
        draining: a.connection_draining.unwrap_or(false),
        draining_timeout: a.connection_draining_timeout,
        idle_timeout: a.idle_timeout.unwrap_or(60),
    }
}

/// Whether the attributes differ, field by field: the optional ones only when asked (AWS
/// fills in its own values for the others).
pub fn attributes_differ(have: &Attributes, want: &Attributes) -> bool {
    let asked = |w: &Option<i32>, h: &Option<i32>| w.is_some() && w != h;
    let asked_s = |w: &Option<String>, h: &Option<String>| w.is_some() && w != h;
    have.cross_zone != want.cross_zone
        || have.access_log != want.access_log
        || have.draining != want.draining
        || have.idle_timeout != want.idle_timeout
        || asked(&want.emit_interval, &have.emit_interval)
        || asked_s(&want.bucket, &have.bucket)
        || asked_s(&want.prefix, &have.prefix)
        || asked(&want.draining_timeout, &have.draining_timeout)
}

/// The proxy-protocol policy changes (upstream's rules): for each listener's nodePort, set the
/// policy where proxy protocol is on and the backend lacks it, clear it where it is off and the
/// backend has it; clear it on backends no listener uses. `backends` maps each backend port to
/// whether it has the policy. Returns (port, on).
pub fn backend_policy_changes(listeners: &[Listener], backends: &BTreeMap<i32, bool>, proxy: bool) -> Vec<(i32, bool)> {
    let mut out = Vec::new();
    let mut used = BTreeSet::new();
    for l in listeners {
        if !used.insert(l.instance_port) {
            continue;
        }
        match backends.get(&l.instance_port) {
            None if proxy => out.push((l.instance_port, true)),
            Some(have) if *have != proxy => out.push((l.instance_port, proxy)),
            _ => {}
        }
    }
    for (port, has) in backends {
        if !used.contains(port) && *has {
            out.push((*port, false));
        }
    }
    out
}

/// Whether a backend's policies include proxy protocol.
pub fn has_proxy_protocol(policies: &[String]) -> bool {
    policies.iter().any(|p| p == PROXY_PROTOCOL_POLICY)
}

/// The ports of the TLS listeners whose policies are not exactly the SSL negotiation policy
/// for `reference` (upstream sets it on each of them on every sync).
pub fn ssl_policy_ports(listeners: &[(Listener, Vec<String>)], reference: &str) -> Vec<i32> {
    let name = ssl_policy_name(reference);
    listeners.iter().filter(|(l, p)| l.is_tls() && p.as_slice() != [name.clone()]).map(|(l, _)| l.port).collect()
}

/// The additional tags missing or different on the load balancer (upstream adds them all on
/// every sync; tags are never removed).
pub fn tag_additions(want: &BTreeMap<String, String>, have: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    want.iter().filter(|(k, v)| have.get(*k) != Some(*v)).map(|(k, v)| (k.clone(), v.clone())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::annotations::LbKind;
    use crate::lb::fixtures::svc;
    use crate::lb::spec::check;

    const CERT: &str = "arn:aws:acm:us-east-1:123456789012:certificate/abc";

    fn shape(pairs: &[(&str, &str)], ports: &[(i32, &str, i32)], etp: &str, hcnp: i32) -> ServiceShape {
        let mut s = svc(pairs, ports, etp, hcnp);
        s.metadata.annotations.as_mut().unwrap().remove(ann::TYPE);
        if let Some(p) = s.spec.as_mut().unwrap().ports.as_mut() {
            for (i, port) in p.iter_mut().enumerate() {
                port.name = Some(if i == 1 { "HTTPS".into() } else { format!("p{i}") });
            }
        }
        check(&s, LbKind::Classic).unwrap()
    }

    fn l(protocol: &str, port: i32, instance_protocol: &str, node_port: i32, cert: bool) -> Listener {
        Listener {
            protocol: protocol.into(),
            port,
            instance_protocol: instance_protocol.into(),
            instance_port: node_port,
            certificate: cert.then(|| CERT.to_string()),
        }
    }

    #[test]
    fn listeners_are_tcp_unless_a_certificate_or_an_http_backend_says_otherwise() {
        let two = [(80, "TCP", 30080), (443, "TCP", 30443)];
        assert_eq!(
            listeners(&shape(&[], &two, "Cluster", 0)).unwrap(),
            vec![l("tcp", 80, "tcp", 30080, false), l("tcp", 443, "tcp", 30443, false)]
        );
        let http = listeners(&shape(&[(ann::BACKEND_PROTOCOL, "http")], &two, "Cluster", 0)).unwrap();
        assert_eq!(http[0], l("http", 80, "http", 30080, false));
        // ssl-ports names are compared with the lower-cased port name, as upstream.
        let ssl = listeners(&shape(&[(ann::SSL_CERT, CERT), (ann::SSL_PORTS, "https")], &two, "Cluster", 0)).unwrap();
        assert_eq!(ssl, vec![l("tcp", 80, "tcp", 30080, false), l("ssl", 443, "tcp", 30443, true)]);
        let https =
            listeners(&shape(&[(ann::SSL_CERT, CERT), (ann::BACKEND_PROTOCOL, "http")], &two, "Cluster", 0)).unwrap();
        assert_eq!(https[1], l("https", 443, "http", 30443, true));
        let e = listeners(&shape(&[(ann::SSL_CERT, CERT), (ann::BACKEND_PROTOCOL, "grpc")], &two, "Cluster", 0))
            .unwrap_err();
        assert!(e.to_string().contains(ann::BACKEND_PROTOCOL), "{e}");
    }

    #[test]
    fn listener_changes_replace_what_differs_in_anything_but_letter_case() {
        let want = vec![l("tcp", 80, "tcp", 30080, false), l("ssl", 443, "tcp", 30443, true)];
        let have = vec![
            l("TCP", 80, "TCP", 30080, false),
            l("SSL", 443, "SSL", 30443, true),
            l("TCP", 22, "TCP", 30022, false),
        ];
        let (add, remove) = listener_changes(&have, &want);
        assert_eq!(add, vec![want[1].clone()]);
        assert_eq!(remove, vec![443, 22]);
        assert_eq!(listener_changes(&want, &want), (Vec::new(), Vec::new()));
    }

    #[test]
    fn the_health_check_follows_upstream() {
        let p = ClusterProbe::default();
        let two = [(80, "TCP", 30080), (443, "TCP", 30443)];
        let s = shape(&[], &two, "Cluster", 0);
        let hc = health_check(&s, &listeners(&s).unwrap(), &p);
        assert_eq!(
            hc,
            HealthCheck {
                target: "TCP:30080".into(),
                interval: 10,
                timeout: 5,
                healthy_threshold: 2,
                unhealthy_threshold: 6
            }
        );
        let s = shape(&[], &two, "Local", 31999);
        assert_eq!(health_check(&s, &listeners(&s).unwrap(), &p).target, "HTTP:31999/healthz");
        let s = shape(&[(ann::HC_PORT, "traffic-port")], &two, "Local", 31999);
        assert_eq!(health_check(&s, &listeners(&s).unwrap(), &p).target, "HTTP:30080/healthz");
        let s = shape(&[(ann::BACKEND_PROTOCOL, "https")], &two, "Cluster", 0);
        assert_eq!(health_check(&s, &listeners(&s).unwrap(), &p).target, "SSL:30080");
        let s = shape(
            &[(ann::HC_PROTOCOL, "HTTP"), (ann::HC_INTERVAL, "30"), (ann::HC_UNHEALTHY, "3")],
            &two,
            "Cluster",
            0,
        );
        let hc = health_check(&s, &listeners(&s).unwrap(), &p);
        assert_eq!((hc.target.as_str(), hc.interval, hc.unhealthy_threshold), ("HTTP:30080/", 30, 3));
        let shared = ClusterProbe { mode: ProbeMode::Shared, ..Default::default() };
        let s = shape(&[], &two, "Cluster", 0);
        assert_eq!(health_check(&s, &listeners(&s).unwrap(), &shared).target, "HTTP:10256/healthz");
        let s = shape(&[(ann::HC_PROTOCOL, "TCP")], &two, "Cluster", 0);
        assert_eq!(
            health_check(&s, &listeners(&s).unwrap(), &shared).target,
            "TCP:10256",
            "annotations win on Classic"
        );
    }

    #[test]
    fn attributes_default_to_upstreams_and_compare_only_what_is_asked() {
        let s = shape(&[], &[(80, "TCP", 30080)], "Cluster", 0);
        let want = attributes(&s);
        assert_eq!(want, Attributes { idle_timeout: 60, ..Default::default() });
        let have = Attributes { draining_timeout: Some(300), idle_timeout: 60, ..Default::default() };
        assert!(!attributes_differ(&have, &want), "AWS's own draining timeout is not a difference");
        let s = shape(
            &[(ann::CONNECTION_DRAINING_ENABLED, "true"), (ann::CONNECTION_DRAINING_TIMEOUT, "30")],
            &[(80, "TCP", 30080)],
            "Cluster",
            0,
        );
        assert!(attributes_differ(&have, &attributes(&s)));
    }

    #[test]
    fn proxy_protocol_backends_are_set_and_cleared_as_upstream() {
        let ls = vec![l("tcp", 80, "tcp", 30080, false), l("tcp", 81, "tcp", 30081, false)];
        let none = BTreeMap::new();
        assert_eq!(backend_policy_changes(&ls, &none, true), vec![(30080, true), (30081, true)]);
        assert!(backend_policy_changes(&ls, &none, false).is_empty());
        let have: BTreeMap<i32, bool> = [(30080, true), (30099, true)].into();
        assert_eq!(backend_policy_changes(&ls, &have, false), vec![(30080, false), (30099, false)]);
        assert!(has_proxy_protocol(&["k8s-proxyprotocol-enabled".to_string()]));
    }

    #[test]
    fn ssl_policies_tags_change_only_where_they_differ() {
        let policy = ssl_policy_name("P");
        let ls = vec![
            (l("ssl", 443, "tcp", 30443, true), vec![policy.clone()]),
            (l("https", 8443, "http", 30444, true), vec![]),
            (l("tcp", 80, "tcp", 30080, false), vec![]),
        ];
        assert_eq!(ssl_policy_ports(&ls, "P"), vec![8443]);
        let want: BTreeMap<String, String> = [("a".to_string(), "1".to_string())].into();
        assert!(tag_additions(&want, &want).is_empty());
        assert_eq!(tag_additions(&want, &BTreeMap::new()), want);
    }
}
