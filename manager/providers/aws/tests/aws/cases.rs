//! The differential suite's cases: each a Service or a Node (or the shared `world`), run
//! through upstream's binary and through ours. A case's fields are what the snapshot
//! attributes to its owner (see `snapshot.rs`).
//!
//! Two cloud-configs: `Default` (upstream's defaults), and `Modes` (`NLBSecurityGroupMode =
//! Managed`, `ElbSecurityGroup`, the `Shared` health-probe mode). Services are created before
//! either manager starts; `then` says what phase two does to them, after the managers settled
//! (an edit, a deletion). Nodes: see [`nodes`].

use crate::kit::*;
use annotations as a;
use k8s_openapi::api::core::v1::ServiceSpec;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// Which cloud-config a case runs under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Config {
    /// Upstream's defaults.
    Default,
    /// `NLBSecurityGroupMode = Managed`, `ElbSecurityGroup`, the `Shared` probe mode.
    Modes,
}

impl Config {
    /// Its `[Global]` lines beyond the world's.
    pub(crate) fn extra(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Config::Default => &[],
            Config::Modes => &[
                ("NLBSecurityGroupMode", "Managed"),
                ("ElbSecurityGroup", "{sg elb-shared}"),
                ("ClusterServiceLoadBalancerHealthProbeMode", "Shared"),
            ],
        }
    }

    /// Its name in reports.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Config::Default => "default cloud-config",
            Config::Modes => "Managed NLB groups, ElbSecurityGroup, Shared probe",
        }
    }
}

/// What phase two does to a Service.
#[derive(Clone, Copy)]
pub(crate) enum Then {
    /// Nothing.
    Keep,
    /// Changes it (a replace of the whole object).
    Edit(fn(&mut Service)),
    /// Deletes it.
    Delete,
}

/// A Service case.
#[derive(Clone)]
pub(crate) struct Svc {
    pub(crate) namespace: &'static str,
    /// Values may name the world's objects: `{subnet NAME}`, `{sg NAME}`, `{eip N}`, `{cert}`.
    pub(crate) annotations: Vec<(&'static str, &'static str)>,
    /// (protocol, port); nodePorts are assigned per case.
    pub(crate) ports: Vec<(&'static str, i32)>,
    pub(crate) spec: Option<fn(&mut ServiceSpec)>,
    pub(crate) then: Then,
    /// Whether a manager acts on it at all (`false` for the AWS Load Balancer Controller's).
    pub(crate) handled: bool,
}

/// What a case is.
#[derive(Clone)]
pub(crate) enum Kind {
    Service(Svc),
    /// A Node, by the owner key its fields carry (`node n0`, `node {n1 dns}`).
    Node(&'static str),
    /// Fields no one Service owns.
    World,
}

/// One case.
#[derive(Clone)]
pub(crate) struct Case {
    /// The Service's name, or the Node case's name.
    pub(crate) id: &'static str,
    pub(crate) config: Config,
    /// What it shows (the annotation, key or behaviour).
    pub(crate) covers: &'static str,
    pub(crate) kind: Kind,
}

impl Case {
    fn service(id: &'static str, covers: &'static str) -> Case {
        Case {
            id,
            config: Config::Default,
            covers,
            kind: Kind::Service(Svc {
                namespace: "default",
                annotations: Vec::new(),
                ports: Vec::new(),
                spec: None,
                then: Then::Keep,
                handled: true,
            }),
        }
    }

    fn svc(&mut self) -> &mut Svc {
        match &mut self.kind {
            Kind::Service(s) => s,
            _ => unreachable!("a Service case"),
        }
    }

    fn nlb(self) -> Case {
        self.ann(a::TYPE, "nlb")
    }

    fn ann(mut self, key: &'static str, value: &'static str) -> Case {
        self.svc().annotations.push((key, value));
        self
    }

    fn port(mut self, protocol: &'static str, port: i32) -> Case {
        self.svc().ports.push((protocol, port));
        self
    }

    fn spec(mut self, f: fn(&mut ServiceSpec)) -> Case {
        self.svc().spec = Some(f);
        self
    }

    fn ns(mut self, namespace: &'static str) -> Case {
        self.svc().namespace = namespace;
        self
    }

    fn then(mut self, then: Then) -> Case {
        self.svc().then = then;
        self
    }

    fn ignored(mut self) -> Case {
        self.svc().handled = false;
        self
    }

    fn modes(mut self) -> Case {
        self.config = Config::Modes;
        self
    }

    /// The owner key of its fields.
    pub(crate) fn owner(&self) -> String {
        match &self.kind {
            Kind::Service(s) => format!("{}/{}", s.namespace, self.id),
            Kind::Node(owner) => owner.to_string(),
            Kind::World => crate::snapshot::WORLD.to_string(),
        }
    }

    /// The Service, with nodePorts from `index` (4 per case) and a `healthCheckNodePort` for
    /// `Local` traffic.
    pub(crate) fn build(&self, index: usize, fill: impl Fn(&str) -> String) -> Option<Service> {
        let Kind::Service(s) = &self.kind else { return None };
        let mut svc = testkit::lb_service(s.namespace, self.id);
        svc.metadata.annotations =
            Some(s.annotations.iter().map(|(k, v)| (k.to_string(), fill(v))).collect::<BTreeMap<_, _>>())
                .filter(|m| !m.is_empty());
        let ports = if s.ports.is_empty() { vec![("TCP", 80)] } else { s.ports.clone() };
        let spec = svc.spec.get_or_insert_default();
        spec.ports = Some(
            ports
                .iter()
                .enumerate()
                .map(|(i, (protocol, port))| ServicePort {
                    name: Some(port_name(*protocol, *port)),
                    port: *port,
                    protocol: Some(protocol.to_string()),
                    target_port: Some(IntOrString::Int(8080 + i as i32)),
                    node_port: Some(node_port(index, i)),
                    ..Default::default()
                })
                .collect(),
        );
        spec.external_traffic_policy = Some("Cluster".into());
        if let Some(f) = s.spec {
            f(spec);
        }
        if spec.external_traffic_policy.as_deref() == Some("Local") && spec.health_check_node_port.is_none() {
            spec.health_check_node_port = Some(32000 + index as i32);
        }
        Some(svc)
    }
}

/// A port's name: `http` for 80, `https` for 443 (the `ssl-ports` cases name them), else
/// `<protocol>-<port>`.
fn port_name(protocol: &str, port: i32) -> String {
    match port {
        80 => "http".into(),
        443 => "https".into(),
        _ => format!("{}-{port}", protocol.to_ascii_lowercase()),
    }
}

/// The nodePort of port `i` of case `index`.
pub(crate) fn node_port(index: usize, i: usize) -> i32 {
    30000 + (index * 4 + i) as i32
}

fn node(id: &'static str, owner: &'static str, covers: &'static str) -> Case {
    Case { id, config: Config::Default, covers, kind: Kind::Node(owner) }
}

fn local(s: &mut ServiceSpec) {
    s.external_traffic_policy = Some("Local".into());
}

fn ranges(s: &mut ServiceSpec) {
    s.load_balancer_source_ranges = Some(vec!["203.0.113.0/24".into(), "198.51.100.0/24".into()]);
}

fn client_ip(s: &mut ServiceSpec) {
    s.session_affinity = Some("ClientIP".into());
}

fn load_balancer_ip(s: &mut ServiceSpec) {
    s.load_balancer_ip = Some("203.0.113.7".into());
}

fn set_annotation(svc: &mut Service, key: &str, value: Option<&str>) {
    let annotations = svc.metadata.annotations.get_or_insert_default();
    match value {
        Some(v) => annotations.insert(key.to_string(), v.to_string()),
        None => annotations.remove(key),
    };
}

/// Port 80 becomes 81, and 444 is added on the next nodePort.
fn edit_ports(svc: &mut Service) {
    let ports = svc.spec.as_mut().and_then(|s| s.ports.as_mut()).expect("ports");
    let node_port = ports[0].node_port.expect("a nodePort");
    ports[0].port = 81;
    ports[0].name = Some("tcp-81".into());
    ports.push(ServicePort {
        name: Some("tcp-444".into()),
        port: 444,
        protocol: Some("TCP".into()),
        node_port: Some(node_port + 1),
        target_port: Some(IntOrString::Int(8444)),
        ..Default::default()
    });
}

fn edit_health(svc: &mut Service) {
    set_annotation(svc, a::HC_INTERVAL, Some("10"));
    set_annotation(svc, a::HC_HEALTHY, Some("4"));
}

fn edit_classic(svc: &mut Service) {
    set_annotation(svc, a::PROXY_PROTOCOL, Some("*"));
    set_annotation(svc, a::CONNECTION_IDLE_TIMEOUT, Some("90"));
    set_annotation(svc, a::HC_INTERVAL, Some("20"));
    let spec = svc.spec.as_mut().expect("spec");
    spec.load_balancer_source_ranges = Some(vec!["192.0.2.0/24".into()]);
    edit_ports(svc);
}

fn edit_internal(svc: &mut Service) {
    set_annotation(svc, a::INTERNAL, Some("true"));
}

fn edit_untyped(svc: &mut Service) {
    set_annotation(svc, a::TYPE, None);
}

fn edit_cluster_ip(svc: &mut Service) {
    let spec = svc.spec.as_mut().expect("spec");
    spec.type_ = Some("ClusterIP".into());
    for p in spec.ports.iter_mut().flatten() {
        p.node_port = None;
    }
    spec.external_traffic_policy = None;
}

fn edit_ranges(svc: &mut Service) {
    set_annotation(svc, a::SOURCE_RANGES, Some("192.0.2.0/24"));
}

/// Every case, in a fixed order (the order gives the nodePorts).
pub(crate) fn all() -> Vec<Case> {
    use Case as C;
    vec![
        // ---- Network Load Balancers: listeners and protocols
        C::service("nlb-basic", "an NLB: one TCP listener, its target group, tags, subnets, rules").nlb(),
        C::service("nlb-two-ports", "two TCP listeners and target groups").nlb().port("TCP", 80).port("TCP", 443),
        C::service("nlb-udp", "a UDP listener; udp client rules").nlb().port("UDP", 53),
        C::service("nlb-tls", "ssl-cert with ssl-ports by number: TLS on 443, TCP on 80")
            .nlb()
            .port("TCP", 80)
            .port("TCP", 443)
            .ann(a::SSL_CERT, "{cert}")
            .ann(a::SSL_PORTS, "443"),
        C::service("nlb-tls-policy", "ssl-negotiation-policy, ssl-ports by port name")
            .nlb()
            .port("TCP", 443)
            .ann(a::SSL_CERT, "{cert}")
            .ann(a::SSL_PORTS, "https")
            .ann(a::SSL_POLICY, "ELBSecurityPolicy-TLS13-1-2-2021-06"),
        C::service("nlb-tls-backend", "backend-protocol ssl: a TLS target group")
            .nlb()
            .port("TCP", 443)
            .ann(a::SSL_CERT, "{cert}")
            .ann(a::BACKEND_PROTOCOL, "ssl"),
        // ---- scheme, clients
        C::service("nlb-internal", "internal: true; internal subnets by role tag and route table")
            .nlb()
            .ann(a::INTERNAL, "true"),
        C::service("nlb-internal-false", "internal: \"false\" is internet-facing").nlb().ann(a::INTERNAL, "false"),
        C::service("nlb-ranges-spec", "spec.loadBalancerSourceRanges: client rules, health rules, MTU rules")
            .nlb()
            .spec(ranges),
        C::service("nlb-ranges-annotation", "the load-balancer-source-ranges annotation")
            .nlb()
            .ann(a::SOURCE_RANGES, "192.0.2.0/24"),
        // ---- health checks
        C::service("nlb-hc-http", "healthcheck-protocol (lower case), -path and -port")
            .nlb()
            .ann(a::HC_PROTOCOL, "http")
            .ann(a::HC_PATH, "/ready")
            .ann(a::HC_PORT, "32100"),
        C::service("nlb-hc-https", "healthcheck-protocol HTTPS without a path").nlb().ann(a::HC_PROTOCOL, "HTTPS"),
        C::service("nlb-hc-tcp-path", "healthcheck-path with a TCP check").nlb().ann(a::HC_PATH, "/ignored"),
        C::service("nlb-hc-numbers", "healthcheck-interval, -healthy-threshold, -unhealthy-threshold")
            .nlb()
            .ann(a::HC_INTERVAL, "10")
            .ann(a::HC_HEALTHY, "5")
            .ann(a::HC_UNHEALTHY, "4"),
        C::service("nlb-hc-timeout", "healthcheck-timeout").nlb().ann(a::HC_TIMEOUT, "6"),
        C::service("nlb-local", "externalTrafficPolicy: Local: HTTP /healthz on healthCheckNodePort").nlb().spec(local),
        C::service("nlb-local-traffic-port", "Local with healthcheck-port: traffic-port")
            .nlb()
            .spec(local)
            .ann(a::HC_PORT, "traffic-port"),
        // ---- attributes and tags
        C::service("nlb-cross-zone", "cross-zone-load-balancing-enabled").nlb().ann(a::CROSS_ZONE, "true"),
        C::service("nlb-access-logs", "access-log-enabled, -s3-bucket-name, -s3-bucket-prefix")
            .nlb()
            .ann(a::ACCESS_LOG_ENABLED, "true")
            .ann(a::ACCESS_LOG_BUCKET, "logs-bucket")
            .ann(a::ACCESS_LOG_PREFIX, "nlb"),
        C::service("nlb-tg-attributes", "target-group-attributes")
            .nlb()
            .ann(a::TARGET_GROUP_ATTRIBUTES, "preserve_client_ip.enabled=false,proxy_protocol_v2.enabled=true"),
        C::service("nlb-extra-tags", "additional-resource-tags").nlb().ann(a::EXTRA_TAGS, "team=web,env=prod"),
        // ---- placement and targets
        C::service("nlb-subnets", "subnets by name and by ID").nlb().ann(a::SUBNETS, "a-elb,{subnet b-elb}"),
        C::service("nlb-node-labels", "target-node-labels key=value").nlb().ann(a::TARGET_NODE_LABELS, "pool=blue"),
        C::service("nlb-node-labels-key", "target-node-labels with an empty value (key only)")
            .nlb()
            .ann(a::TARGET_NODE_LABELS, "pool="),
        C::service("nlb-eips", "eip-allocations, one per annotated subnet")
            .nlb()
            .ann(a::SUBNETS, "a-elb,b-elb")
            .ann(a::EIP_ALLOCATIONS, "{eip 0},{eip 1}"),
        C::service("nlb-eips-count", "eip-allocations not matching the subnets")
            .nlb()
            .ann(a::EIP_ALLOCATIONS, "{eip 2}"),
        C::service("nlb-private-ips", "private-ipv4-addresses on an internal NLB")
            .nlb()
            .ann(a::INTERNAL, "true")
            .ann(a::SUBNETS, "a-private,e-private")
            .ann(a::PRIVATE_IPV4, "10.0.12.10,10.0.5.10"),
        C::service("nlb-namespaced-long-name", "target-group name from a namespace and a long name").nlb().ns("team-a"),
        // ---- refused, or left to others
        C::service("nlb-byo-sg", "security-groups on an NLB is refused").nlb().ann(a::SECURITY_GROUPS, "{sg byo-1}"),
        C::service("nlb-extra-sg", "extra-security-groups on an NLB is refused")
            .nlb()
            .ann(a::EXTRA_SECURITY_GROUPS, "{sg byo-2}"),
        C::service("nlb-client-ip", "sessionAffinity: ClientIP is refused").nlb().spec(client_ip),
        C::service("nlb-lb-ip", "loadBalancerIP is refused").nlb().spec(load_balancer_ip),
        C::service("nlb-mixed", "TCP and UDP ports together are refused").nlb().port("TCP", 80).port("UDP", 53),
        C::service("nlb-hc-bad-protocol", "healthcheck-protocol other than TCP/HTTP/HTTPS is refused")
            .nlb()
            .ann(a::HC_PROTOCOL, "SSL"),
        C::service("nlb-tg-attributes-udp", "preserve_client_ip off with a UDP port is refused")
            .nlb()
            .port("UDP", 53)
            .ann(a::TARGET_GROUP_ATTRIBUTES, "preserve_client_ip.enabled=false"),
        C::service("type-external", "type external: the AWS Load Balancer Controller's")
            .ann(a::TYPE, "external")
            .ignored(),
        C::service("type-nlb-ip", "type nlb-ip: the AWS Load Balancer Controller's").ann(a::TYPE, "nlb-ip").ignored(),
        C::service("type-upper-nlb", "type NLB (not exactly nlb) is a Classic ELB").ann(a::TYPE, "NLB"),
        // ---- Classic ELBs
        C::service("classic-basic", "no type annotation: a Classic ELB, its k8s-elb group, the Nodes' rule"),
        C::service("classic-two-ports", "two TCP listeners; the health check on the first nodePort")
            .port("TCP", 80)
            .port("TCP", 8080),
        C::service("classic-internal", "internal: true on a Classic ELB").ann(a::INTERNAL, "true"),
        C::service("classic-ranges", "source ranges on the k8s-elb group").spec(ranges),
        C::service("classic-ssl", "ssl-cert on ssl-ports: SSL to TCP")
            .port("TCP", 80)
            .port("TCP", 443)
            .ann(a::SSL_CERT, "{cert}")
            .ann(a::SSL_PORTS, "443"),
        C::service("classic-https-backend", "backend-protocol https with a certificate: HTTPS to HTTPS, SSL check")
            .port("TCP", 443)
            .ann(a::SSL_CERT, "{cert}")
            .ann(a::BACKEND_PROTOCOL, "https"),
        C::service("classic-http-backend", "backend-protocol http without a certificate: HTTP to HTTP")
            .ann(a::BACKEND_PROTOCOL, "http"),
        C::service("classic-ssl-policy", "ssl-negotiation-policy: the k8s-SSLNegotiationPolicy policy")
            .port("TCP", 443)
            .ann(a::SSL_CERT, "{cert}")
            .ann(a::BACKEND_PROTOCOL, "ssl")
            .ann(a::SSL_POLICY, "ELBSecurityPolicy-2016-08"),
        C::service("classic-proxy-protocol", "proxy-protocol: *").ann(a::PROXY_PROTOCOL, "*"),
        C::service("classic-draining", "connection-draining-enabled and -timeout")
            .ann(a::CONNECTION_DRAINING_ENABLED, "true")
            .ann(a::CONNECTION_DRAINING_TIMEOUT, "45"),
        C::service("classic-idle", "connection-idle-timeout").ann(a::CONNECTION_IDLE_TIMEOUT, "120"),
        C::service("classic-cross-zone", "cross-zone-load-balancing-enabled").ann(a::CROSS_ZONE, "true"),
        C::service("classic-access-logs", "access logs with an emit interval")
            .ann(a::ACCESS_LOG_ENABLED, "true")
            .ann(a::ACCESS_LOG_BUCKET, "logs-bucket")
            .ann(a::ACCESS_LOG_PREFIX, "elb")
            .ann(a::ACCESS_LOG_EMIT_INTERVAL, "5"),
        C::service("classic-hc", "every healthcheck-* annotation")
            .ann(a::HC_PROTOCOL, "HTTP")
            .ann(a::HC_PATH, "/hc")
            .ann(a::HC_PORT, "32101")
            .ann(a::HC_INTERVAL, "15")
            .ann(a::HC_TIMEOUT, "4")
            .ann(a::HC_HEALTHY, "3")
            .ann(a::HC_UNHEALTHY, "5"),
        C::service("classic-hc-lower-case", "healthcheck-protocol in lower case").ann(a::HC_PROTOCOL, "http"),
        C::service("classic-local", "Local: HTTP /healthz on healthCheckNodePort").spec(local),
        C::service("classic-local-traffic-port", "Local with healthcheck-port: traffic-port")
            .spec(local)
            .ann(a::HC_PORT, "traffic-port"),
        C::service("classic-extra-tags", "additional-resource-tags on the ELB and its group")
            .ann(a::EXTRA_TAGS, "team=web,env=prod"),
        C::service("classic-byo-sg", "security-groups: the ELB's groups instead of k8s-elb")
            .ann(a::SECURITY_GROUPS, "{sg byo-1}"),
        C::service("classic-extra-sg", "extra-security-groups beside k8s-elb")
            .ann(a::EXTRA_SECURITY_GROUPS, "{sg byo-2}"),
        C::service("classic-subnets", "subnets by name and ID").ann(a::SUBNETS, "a-elb,{subnet c-untagged}"),
        C::service("classic-node-labels", "target-node-labels").ann(a::TARGET_NODE_LABELS, "pool=blue"),
        C::service("classic-udp", "UDP on a Classic ELB is refused").port("UDP", 53),
        C::service("classic-tg-attributes", "target-group-attributes on a Classic ELB is refused")
            .ann(a::TARGET_GROUP_ATTRIBUTES, "proxy_protocol_v2.enabled=true"),
        C::service("classic-proxy-bad", "proxy-protocol other than * is refused").ann(a::PROXY_PROTOCOL, "yes"),
        C::service("classic-client-ip", "sessionAffinity: ClientIP on a Classic ELB is refused").spec(client_ip),
        // ---- phase two: changes after creation
        C::service("nlb-edit-ports", "an NLB's ports changed: listeners and target groups follow")
            .nlb()
            .then(Then::Edit(edit_ports)),
        C::service("nlb-edit-health", "an NLB's health-check interval changed: a new target group")
            .nlb()
            .then(Then::Edit(edit_health)),
        C::service("nlb-edit-ranges", "an NLB's source ranges changed: rules follow")
            .nlb()
            .then(Then::Edit(edit_ranges)),
        C::service("nlb-edit-internal", "internal set on an existing NLB").nlb().then(Then::Edit(edit_internal)),
        C::service("nlb-edit-untyped", "an NLB's type annotation removed").nlb().then(Then::Edit(edit_untyped)),
        C::service("nlb-deleted", "an NLB's Service deleted: nothing left").nlb().then(Then::Delete),
        C::service("nlb-to-cluster-ip", "an NLB's Service made ClusterIP: nothing left")
            .nlb()
            .then(Then::Edit(edit_cluster_ip)),
        C::service("classic-edit", "a Classic ELB's ports, proxy protocol, idle timeout, interval and ranges changed")
            .then(Then::Edit(edit_classic)),
        C::service("classic-edit-internal", "internal set on an existing Classic ELB").then(Then::Edit(edit_internal)),
        C::service("classic-deleted", "a Classic ELB's Service deleted: nothing left").then(Then::Delete),
        // ---- Nodes (see `nodes`)
        node("node-provider-id", "node n0", "a Node with a providerID: labels, addresses, taint removed"),
        node("node-dns-name", "node {n1 dns}", "a Node named by private DNS name, no providerID; removed in phase two"),
        node("node-untagged-group", "node n2", "an instance whose only group is untagged: it takes the rules"),
        node("node-excluded", "node n3", "exclude-from-external-load-balancers: never a target"),
        node("node-added", "node n4", "a Node added in phase two: a target of every load balancer"),
        node("node-terminated", "node n5", "an instance terminated in phase two: its NotReady Node deleted"),
        node("node-untagged-instance", "node {n6 dns}", "an instance without the cluster tag, named by DNS name"),
        Case {
            id: "world",
            config: Config::Default,
            covers: "rules no one load balancer owns (path MTU)",
            kind: Kind::World,
        },
        // ---- NLBSecurityGroupMode = Managed, ElbSecurityGroup, Shared probe mode
        C::service("modes-nlb", "Managed: a new NLB gets its own group, named as upstream").nlb().modes(),
        C::service("modes-nlb-ranges", "Managed: the group admits the source ranges").nlb().spec(ranges).modes(),
        C::service("modes-nlb-tls", "Managed with a TLS listener")
            .nlb()
            .port("TCP", 443)
            .ann(a::SSL_CERT, "{cert}")
            .modes(),
        C::service("modes-nlb-udp", "Managed with a UDP listener").nlb().port("UDP", 53).modes(),
        C::service("modes-nlb-local", "Shared probe mode leaves Local alone").nlb().spec(local).modes(),
        C::service("modes-nlb-hc-annotated", "Shared probe mode over the health-check annotations on an NLB")
            .nlb()
            .ann(a::HC_PROTOCOL, "TCP")
            .ann(a::HC_PORT, "32102")
            .modes(),
        C::service("modes-classic", "ElbSecurityGroup: the Classic ELB's group, unchanged; Shared probe").modes(),
        C::service("modes-classic-byo", "security-groups wins over ElbSecurityGroup")
            .ann(a::SECURITY_GROUPS, "{sg byo-1}")
            .modes(),
        C::service("modes-classic-hc-annotated", "health-check annotations win over Shared on a Classic ELB")
            .ann(a::HC_PROTOCOL, "TCP")
            .modes(),
        Case { id: "modes-world", config: Config::Modes, covers: "rules no one load balancer owns", kind: Kind::World },
        Case {
            id: "modes-node",
            config: Config::Modes,
            covers: "Node initialization under the second config",
            kind: Kind::Node("node n0"),
        },
    ]
}

/// The Nodes of a config at the start, and what phase two does: (name, instance, providerID
/// set, labels). A Node without a providerID is named by its instance's private DNS name.
pub(crate) struct NodeDef {
    pub(crate) instance: &'static str,
    pub(crate) provider_id: bool,
    pub(crate) labels: &'static [(&'static str, &'static str)],
    pub(crate) phase: NodePhase,
}

/// When a Node is there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NodePhase {
    /// From the start.
    Always,
    /// Created in phase two.
    Added,
    /// Deleted in phase two.
    Removed,
    /// Its instance terminated and the Node marked NotReady in phase two.
    Terminated,
}

const EXCLUDE: &str = "node.kubernetes.io/exclude-from-external-load-balancers";

/// The Nodes under `config`.
pub(crate) fn nodes(config: Config) -> Vec<NodeDef> {
    let n = |instance, provider_id, labels, phase| NodeDef { instance, provider_id, labels, phase };
    match config {
        Config::Default => vec![
            n("n0", true, &[], NodePhase::Always),
            n("n1", false, &[], NodePhase::Removed),
            n("n2", true, &[("pool", "blue")], NodePhase::Always),
            n("n3", true, &[(EXCLUDE, "true")], NodePhase::Always),
            n("n4", true, &[], NodePhase::Added),
            n("n5", true, &[], NodePhase::Terminated),
            n("n6", false, &[(EXCLUDE, "true")], NodePhase::Always),
        ],
        Config::Modes => {
            vec![n("n0", true, &[], NodePhase::Always), n("n2", true, &[("pool", "blue")], NodePhase::Always)]
        }
    }
}
