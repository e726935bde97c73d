//! What the moto tests share: the world seeded in moto, the API-server side (`Env`), Nodes,
//! Services and readers of what AWS holds.

pub(crate) use std::collections::{BTreeMap, BTreeSet};
pub(crate) use std::future::Future;
pub(crate) use std::sync::atomic::{AtomicUsize, Ordering};
pub(crate) use std::sync::{Arc, Mutex};
pub(crate) use std::time::Duration;

pub(crate) use ccm_framework::controller::{Context, Controller};
pub(crate) use ccm_framework::controllers::lifecycle::LifecycleController;
pub(crate) use ccm_framework::controllers::node::NodeController;
pub(crate) use ccm_framework::controllers::route::RouteController;
pub(crate) use ccm_framework::controllers::service::ServiceController;
pub(crate) use ccm_framework::controllers::service::condition as service_condition;
pub(crate) use ccm_framework::health::HealthRegistry;
pub(crate) use ccm_framework::options::ControllerOptions;
pub(crate) use ccm_framework::provider::refusal_reasons;
pub(crate) use ccm_framework::provider::{CloudError, CloudProvider, Health, InitContext, Instances, LoadBalancer};
pub(crate) use ccm_provider_aws::annotations;
pub(crate) use ccm_provider_aws::config::AwsConfig;
pub(crate) use ccm_provider_aws::sdk::ec2;
pub(crate) use ccm_provider_aws::{AwsOptions, AwsProvider, Clients};
pub(crate) use k8s_openapi::api::core::v1::{
    Node, NodeCondition, NodeSpec, NodeStatus, Service, ServicePort, ServiceSpec, Taint,
};
pub(crate) use k8s_openapi::api::events::v1::Event;
pub(crate) use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
pub(crate) use serde_json::json;
pub(crate) use testkit::{Backend, TestCluster};
pub(crate) use tokio::io::{AsyncReadExt, AsyncWriteExt};
pub(crate) use tokio::net::{TcpListener, TcpStream};
pub(crate) use tokio_util::sync::CancellationToken;

pub(crate) use crate::moto::{self, Moto};
pub(crate) use crate::wire;

pub(crate) const WAIT: Duration = Duration::from_secs(60);
pub(crate) const CLUSTER: &str = "moto-test";
pub(crate) const ZONE: &str = "us-east-1a";
pub(crate) const TAINT_UNINITIALIZED: &str = "node.cloudprovider.kubernetes.io/uninitialized";
pub(crate) const TAINT_SHUTDOWN: &str = "node.cloudprovider.kubernetes.io/shutdown";

// ---------------------------------------------------------------------------------------------
// moto

pub(crate) fn options_for(url: &str) -> AwsOptions {
    AwsOptions {
        credentials: Some(ec2::config::Credentials::new("testing", "testing", None, None, "test")),
        endpoint_url: Some(url.to_string()),
        cache_ttl: Duration::from_millis(500),
        absence_confirm_after: Duration::from_secs(2),
        max_attempts: 3,
        ..Default::default()
    }
}

pub(crate) fn config() -> AwsConfig {
    AwsConfig { zone: ZONE.into(), cluster_id: CLUSTER.into(), ..Default::default() }
}

pub(crate) fn provider(url: &str) -> Arc<AwsProvider> {
    Arc::new(AwsProvider::new(config(), CLUSTER, options_for(url)))
}

/// The world in moto: a VPC with cluster-tagged public subnets (the main route table goes to an
/// internet gateway), a cluster-tagged route table and the Nodes' cluster-tagged security group.
pub(crate) struct World {
    pub(crate) vpc: String,
    pub(crate) subnets: Vec<String>,
    pub(crate) sg: String,
    pub(crate) rtb: String,
}

pub(crate) fn tag(k: &str, v: &str) -> ec2::types::Tag {
    ec2::types::Tag::builder().key(k).value(v).build()
}

pub(crate) fn tags_spec(kind: ec2::types::ResourceType, tags: &[(&str, &str)]) -> ec2::types::TagSpecification {
    let mut b = ec2::types::TagSpecification::builder().resource_type(kind);
    for (k, v) in tags {
        b = b.tags(tag(k, v));
    }
    b.build()
}

pub(crate) async fn seed(c: &Clients) -> World {
    let cluster_tag = format!("kubernetes.io/cluster/{CLUSTER}");
    let vpc = c.ec2.create_vpc().cidr_block("10.0.0.0/16").send().await.unwrap().vpc.unwrap().vpc_id.unwrap();
    let mut subnets = Vec::new();
    for (i, zone) in ["us-east-1a", "us-east-1b"].iter().enumerate() {
        let s = c
            .ec2
            .create_subnet()
            .vpc_id(&vpc)
            .cidr_block(format!("10.0.{}.0/24", i + 1))
            .availability_zone(*zone)
            .tag_specifications(tags_spec(
                ec2::types::ResourceType::Subnet,
                &[(&cluster_tag, "shared"), ("kubernetes.io/role/elb", "1")],
            ))
            .send()
            .await
            .unwrap();
        subnets.push(s.subnet.unwrap().subnet_id.unwrap());
    }
    let sg = c
        .ec2
        .create_security_group()
        .group_name("nodes")
        .description("nodes")
        .vpc_id(&vpc)
        .tag_specifications(tags_spec(ec2::types::ResourceType::SecurityGroup, &[(&cluster_tag, "owned")]))
        .send()
        .await
        .unwrap()
        .group_id
        .unwrap();
    let rtb = c
        .ec2
        .create_route_table()
        .vpc_id(&vpc)
        .tag_specifications(tags_spec(ec2::types::ResourceType::RouteTable, &[(&cluster_tag, "owned")]))
        .send()
        .await
        .unwrap()
        .route_table
        .unwrap()
        .route_table_id
        .unwrap();
    let igw =
        c.ec2.create_internet_gateway().send().await.unwrap().internet_gateway.unwrap().internet_gateway_id.unwrap();
    c.ec2.attach_internet_gateway().internet_gateway_id(&igw).vpc_id(&vpc).send().await.unwrap();
    let main = main_table(c, &vpc).await;
    c.ec2
        .create_route()
        .route_table_id(&main)
        .destination_cidr_block("0.0.0.0/0")
        .gateway_id(&igw)
        .send()
        .await
        .unwrap();
    World { vpc, subnets, sg, rtb }
}

/// The VPC's main route table.
pub(crate) async fn main_table(c: &Clients, vpc: &str) -> String {
    let t = c
        .ec2
        .describe_route_tables()
        .filters(ec2::types::Filter::builder().name("vpc-id").values(vpc).build())
        .filters(ec2::types::Filter::builder().name("association.main").values("true").build())
        .send()
        .await
        .unwrap();
    t.route_tables()[0].route_table_id().unwrap().to_string()
}

/// (instance ID, private DNS name) of `n` new instances, tagged for the cluster as a cluster's
/// instances are (a Node named by DNS name needs the tag, as upstream).
pub(crate) async fn launch(c: &Clients, w: &World, n: i32) -> Vec<(String, String)> {
    let cluster_tag = format!("kubernetes.io/cluster/{CLUSTER}");
    let r = c
        .ec2
        .run_instances()
        .image_id("ami-12345678")
        .instance_type(ec2::types::InstanceType::M5Large)
        .min_count(n)
        .max_count(n)
        .subnet_id(&w.subnets[0])
        .security_group_ids(&w.sg)
        .tag_specifications(tags_spec(ec2::types::ResourceType::Instance, &[(&cluster_tag, "owned")]))
        .send()
        .await
        .unwrap();
    r.instances()
        .iter()
        .map(|i| (i.instance_id().unwrap().to_string(), i.private_dns_name().unwrap().to_string()))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// the API-server side: one place to switch backends

pub(crate) struct Env {
    pub(crate) cluster: TestCluster,
    pub(crate) ctx: Context,
    pub(crate) shutdown: CancellationToken,
}

impl Drop for Env {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

impl Env {
    pub(crate) async fn start(backend: Backend, provider: Arc<dyn CloudProvider>, options: ControllerOptions) -> Env {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
        let cluster = TestCluster::start(backend).await.expect("API server starts");
        let shutdown = CancellationToken::new();
        let ctx = ccm_framework::engine::testing::context(cluster.client(), provider, options, shutdown.clone()).await;
        Env { cluster, ctx, shutdown }
    }

    pub(crate) fn run(&self, controller: Box<dyn Controller>) {
        let health = HealthRegistry::new().handle(controller.name());
        tokio::spawn(controller.run(self.ctx.clone(), health));
    }

    pub(crate) fn nodes(&self) -> Api<Node> {
        Api::all(self.cluster.client())
    }

    pub(crate) fn services(&self) -> Api<Service> {
        Api::namespaced(self.cluster.client(), "default")
    }

    pub(crate) async fn create_node(&self, node: Node) {
        let pp = PostParams { field_manager: Some("kubelet".into()), ..Default::default() };
        self.nodes().create(&pp, &node).await.expect("create node");
    }
}

pub(crate) fn options() -> ControllerOptions {
    ControllerOptions {
        node_batch_window: Duration::from_millis(50),
        node_monitor_period: Duration::from_millis(500),
        concurrent_service_syncs: 2,
        cluster_name: CLUSTER.into(),
        ..Default::default()
    }
}

pub(crate) fn node(name: &str, provider_id: Option<&str>, ready: Option<&str>, taints: Vec<Taint>) -> Node {
    Node {
        metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
        spec: Some(NodeSpec {
            provider_id: provider_id.map(str::to_string),
            taints: (!taints.is_empty()).then_some(taints),
            ..Default::default()
        }),
        status: Some(NodeStatus {
            conditions: ready
                .map(|s| vec![NodeCondition { type_: "Ready".into(), status: s.into(), ..Default::default() }]),
            ..Default::default()
        }),
    }
}

pub(crate) fn uninitialized() -> Vec<Taint> {
    vec![Taint {
        key: TAINT_UNINITIALIZED.into(),
        value: Some("true".into()),
        effect: "NoSchedule".into(),
        time_added: None,
    }]
}

pub(crate) fn has_taint(n: &Node, key: &str) -> bool {
    n.spec.as_ref().and_then(|s| s.taints.as_ref()).is_some_and(|ts| ts.iter().any(|t| t.key == key))
}

pub(crate) fn pid(id: &str) -> String {
    format!("aws:///{ZONE}/{id}")
}

pub(crate) async fn eventually<T, F, Fut>(f: F) -> T
where
    F: Fn() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    testkit::wait::eventually(WAIT, f).await
}

// ---------------------------------------------------------------------------------------------
// Load balancers

/// What moto holds for the test's cluster.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct LbState {
    pub(crate) lbs: Vec<(String, String)>,
    /// (TG ARN, protocol, port, health port, targets).
    pub(crate) tgs: Vec<(String, String, i32, String, BTreeSet<String>)>,
    /// (listener port, target group port).
    pub(crate) listeners: BTreeSet<(i32, i32)>,
    /// (protocol, port, cidr, description) on any security group.
    pub(crate) rules: BTreeSet<(String, i32, String, String)>,
}

pub(crate) async fn lb_state(c: &Clients) -> LbState {
    let mut st = LbState::default();
    let lbs = c.elb.describe_load_balancers().send().await.unwrap();
    let arns: Vec<String> = lbs.load_balancers().iter().map(|l| l.load_balancer_arn().unwrap().to_string()).collect();
    let tgs = c.elb.describe_target_groups().send().await.unwrap();
    let tg_arns: Vec<String> = tgs.target_groups().iter().map(|t| t.target_group_arn().unwrap().to_string()).collect();
    let mut tagged: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for chunk in arns.iter().chain(tg_arns.iter()).cloned().collect::<Vec<_>>().chunks(20) {
        let r = c.elb.describe_tags().set_resource_arns(Some(chunk.to_vec())).send().await.unwrap();
        for d in r.tag_descriptions() {
            tagged.insert(
                d.resource_arn().unwrap().to_string(),
                d.tags().iter().map(|t| (t.key().unwrap().to_string(), t.value().unwrap_or("").to_string())).collect(),
            );
        }
    }
    let mine = |arn: &str| tagged.get(arn).is_some_and(|t| t.contains_key(&format!("kubernetes.io/cluster/{CLUSTER}")));
    let mut tg_ports = BTreeMap::new();
    for t in tgs.target_groups() {
        let arn = t.target_group_arn().unwrap();
        assert!(mine(arn), "every target group carries the cluster tag");
        // A controller running beside the test may delete it in between: then it is gone.
        let Ok(th) = c.elb.describe_target_health().target_group_arn(arn).send().await else { continue };
        let targets =
            th.target_health_descriptions().iter().map(|d| d.target().unwrap().id().unwrap().to_string()).collect();
        tg_ports.insert(arn.to_string(), t.port().unwrap());
        st.tgs.push((
            arn.to_string(),
            t.protocol().unwrap().as_str().to_string(),
            t.port().unwrap(),
            t.health_check_port().unwrap_or_default().to_string(),
            targets,
        ));
    }
    for l in lbs.load_balancers() {
        let arn = l.load_balancer_arn().unwrap();
        assert!(mine(arn), "every load balancer carries the cluster tag");
        st.lbs.push((arn.to_string(), tagged[arn]["kubernetes.io/service-name"].clone()));
        let ls = c.elb.describe_listeners().load_balancer_arn(arn).send().await.unwrap();
        for li in ls.listeners() {
            let tg = li.default_actions()[0].target_group_arn().unwrap();
            st.listeners.insert((li.port().unwrap(), tg_ports.get(tg).copied().unwrap_or(-1)));
        }
    }
    st.tgs.sort_by_key(|t| t.2);
    let sgs = c.ec2.describe_security_groups().send().await.unwrap();
    for g in sgs.security_groups() {
        for p in g.ip_permissions() {
            for r in p.ip_ranges() {
                let d = r.description().unwrap_or_default();
                if d.starts_with("kubernetes.io/rule/nlb/") {
                    st.rules.insert((
                        p.ip_protocol().unwrap().to_string(),
                        p.from_port().unwrap(),
                        r.cidr_ip().unwrap().to_string(),
                        d.to_string(),
                    ));
                }
            }
        }
    }
    st
}

/// A `type: LoadBalancer` Service asking for an NLB (`aws-load-balancer-type: nlb`).
pub(crate) fn lb_service(name: &str, ports: &[(i32, i32)]) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            annotations: Some([(annotations::TYPE.to_string(), "nlb".to_string())].into()),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("LoadBalancer".into()),
            ports: Some(
                ports
                    .iter()
                    .map(|(p, np)| ServicePort {
                        name: Some(format!("p{p}")),
                        port: *p,
                        node_port: Some(*np),
                        protocol: Some("TCP".into()),
                        ..Default::default()
                    })
                    .collect(),
            ),
            external_traffic_policy: Some("Cluster".into()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub(crate) fn targets(st: &LbState) -> Vec<BTreeSet<String>> {
    st.tgs.iter().map(|t| t.4.clone()).collect()
}

/// The Service's `LoadBalancerProvisioned` condition once its reason is `reason` (or once it is
/// gone, for `None`).
pub(crate) async fn condition(
    env: &Env,
    name: &str,
    reason: Option<&str>,
) -> Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    eventually(|| async {
        let s = env.services().get(name).await.ok()?;
        let c = s
            .status
            .and_then(|st| st.conditions)
            .and_then(|cs| cs.into_iter().find(|c| c.type_ == service_condition::LEGACY));
        match (reason, c) {
            (Some(r), Some(c)) if c.reason == r => Some(Some(c)),
            (None, None) => Some(None),
            _ => None,
        }
    })
    .await
}

/// The first event with `reason` in the default namespace.
pub(crate) async fn event(env: &Env, reason: &str) -> Event {
    let events: Api<Event> = Api::namespaced(env.cluster.client(), "default");
    eventually(|| async {
        events.list(&Default::default()).await.ok()?.items.into_iter().find(|e| e.reason.as_deref() == Some(reason))
    })
    .await
}

/// What Elastic Load Balancing holds for one Classic ELB, read through moto's API.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ClassicState {
    pub(crate) dns: String,
    pub(crate) internal: bool,
    /// (protocol, port, instance port), as moto reports them.
    pub(crate) listeners: BTreeSet<(String, i32, i32)>,
    /// (target, interval, timeout, healthy, unhealthy).
    pub(crate) health: Option<(String, i32, i32, i32, i32)>,
    pub(crate) groups: Vec<String>,
    pub(crate) subnets: BTreeSet<String>,
    pub(crate) instances: BTreeSet<String>,
    pub(crate) tags: BTreeMap<String, String>,
    /// Backend ports with proxy protocol.
    pub(crate) proxy: BTreeSet<i32>,
    /// (cross-zone, access log, draining, draining timeout, idle timeout).
    pub(crate) attributes: (bool, bool, bool, Option<i32>, i32),
}

pub(crate) async fn classic_state(c: &Clients, name: &str) -> Option<ClassicState> {
    let r = c.classic.describe_load_balancers().load_balancer_names(name).send().await.ok()?;
    let d = r.load_balancer_descriptions().first()?;
    let t = c.classic.describe_tags().load_balancer_names(name).send().await.unwrap();
    let a = c.classic.describe_load_balancer_attributes().load_balancer_name(name).send().await.unwrap();
    let a = a.load_balancer_attributes().unwrap();
    Some(ClassicState {
        dns: d.dns_name().unwrap().to_string(),
        internal: d.scheme() == Some("internal"),
        listeners: d
            .listener_descriptions()
            .iter()
            .filter_map(|l| l.listener())
            .map(|l| (l.protocol().to_string(), l.load_balancer_port(), l.instance_port()))
            .collect(),
        health: d.health_check().map(|h| {
            (h.target().to_string(), h.interval(), h.timeout(), h.healthy_threshold(), h.unhealthy_threshold())
        }),
        groups: d.security_groups().to_vec(),
        subnets: d.subnets().iter().cloned().collect(),
        instances: d.instances().iter().filter_map(|i| i.instance_id()).map(str::to_string).collect(),
        tags: t
            .tag_descriptions()
            .iter()
            .flat_map(|d| d.tags())
            .map(|t| (t.key().to_string(), t.value().unwrap_or_default().to_string()))
            .collect(),
        proxy: d
            .backend_server_descriptions()
            .iter()
            .filter(|b| b.policy_names().iter().any(|p| p == "k8s-proxyprotocol-enabled"))
            .filter_map(|b| b.instance_port())
            .collect(),
        attributes: (
            a.cross_zone_load_balancing().is_some_and(|c| c.enabled()),
            a.access_log().is_some_and(|l| l.enabled()),
            a.connection_draining().is_some_and(|d| d.enabled()),
            a.connection_draining().and_then(|d| d.timeout()),
            a.connection_settings().map(|s| s.idle_timeout()).unwrap_or_default(),
        ),
    })
}

/// A group's (name, description, tags) and its ingress as (protocol, from, to, source), sources
/// being CIDRs or group IDs.
pub(crate) async fn group_detail(
    c: &Clients,
    id: &str,
) -> (String, String, BTreeMap<String, String>, BTreeSet<(String, i32, i32, String)>) {
    let g = c.ec2.describe_security_groups().group_ids(id).send().await.unwrap();
    let g = &g.security_groups()[0];
    let mut rules = BTreeSet::new();
    for p in g.ip_permissions() {
        let (proto, from, to) =
            (p.ip_protocol().unwrap().to_string(), p.from_port().unwrap_or(-1), p.to_port().unwrap_or(-1));
        for r in p.ip_ranges() {
            rules.insert((proto.clone(), from, to, r.cidr_ip().unwrap().to_string()));
        }
        for r in p.user_id_group_pairs() {
            rules.insert((proto.clone(), from, to, r.group_id().unwrap().to_string()));
        }
    }
    (
        g.group_name().unwrap().to_string(),
        g.description().unwrap().to_string(),
        g.tags().iter().map(|t| (t.key().unwrap().to_string(), t.value().unwrap_or_default().to_string())).collect(),
        rules,
    )
}

/// The Service as the API server holds it, once it shows a hostname.
pub(crate) async fn service_with_hostname(env: &Env, name: &str) -> (Service, String) {
    eventually(|| async {
        let s = env.services().get(name).await.ok()?;
        let h = s.status.as_ref()?.load_balancer.as_ref()?.ingress.as_ref()?.first()?.hostname.clone()?;
        Some((s, h))
    })
    .await
}

/// An ACM certificate in moto (ACM's JSON API, through moto's own endpoint).
pub(crate) async fn acm_certificate(port: u16) -> String {
    let body = r#"{"DomainName":"web.example.com"}"#;
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let req = format!(
        "POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nX-Amz-Target: CertificateManager.RequestCertificate\r\nContent-Type: application/x-amz-json-1.1\r\nAuthorization: AWS4-HMAC-SHA256 Credential=testing/20260101/us-east-1/acm/aws4_request, SignedHeaders=host, Signature=0\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    let text = String::from_utf8_lossy(&out).to_string();
    let json: serde_json::Value = serde_json::from_str(text.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    json["CertificateArn"].as_str().unwrap_or_else(|| panic!("ACM answered {text}")).to_string()
}

/// What ELBv2 holds for the one load balancer: its ARN, attributes, and per target group
/// (by port) the health check, attributes and targets, and per listener (by port) the
/// protocol, certificate and policy.
/// A target group: (protocol, health (protocol, port, path, interval, timeout, healthy,
/// unhealthy), attributes, targets).
pub(crate) type TgDetail =
    (String, (String, String, String, i32, i32, i32, i32), BTreeMap<String, String>, BTreeSet<String>);

#[derive(Debug, Default)]
pub(crate) struct NlbDetail {
    pub(crate) lb_arn: String,
    pub(crate) lb_attrs: BTreeMap<String, String>,
    /// nodePort -> (protocol, health (protocol, port, path, interval, timeout, healthy, unhealthy), attributes, targets)
    pub(crate) tgs: BTreeMap<i32, TgDetail>,
    /// port -> (protocol, certificate, policy)
    pub(crate) listeners: BTreeMap<i32, (String, String, String)>,
}

pub(crate) async fn nlb_detail(c: &Clients) -> NlbDetail {
    let mut d = NlbDetail::default();
    let lbs = c.elb.describe_load_balancers().send().await.unwrap();
    assert_eq!(lbs.load_balancers().len(), 1, "one load balancer");
    d.lb_arn = lbs.load_balancers()[0].load_balancer_arn().unwrap().to_string();
    let attrs = c.elb.describe_load_balancer_attributes().load_balancer_arn(&d.lb_arn).send().await.unwrap();
    d.lb_attrs = attrs
        .attributes()
        .iter()
        .map(|a| (a.key().unwrap().to_string(), a.value().unwrap_or("").to_string()))
        .collect();
    let tgs = c.elb.describe_target_groups().send().await.unwrap();
    for t in tgs.target_groups() {
        let arn = t.target_group_arn().unwrap();
        let a = c.elb.describe_target_group_attributes().target_group_arn(arn).send().await.unwrap();
        let th = c.elb.describe_target_health().target_group_arn(arn).send().await.unwrap();
        d.tgs.insert(
            t.port().unwrap(),
            (
                t.protocol().unwrap().as_str().to_string(),
                (
                    t.health_check_protocol().map(|p| p.as_str().to_string()).unwrap_or_default(),
                    t.health_check_port().unwrap_or_default().to_string(),
                    t.health_check_path().unwrap_or_default().to_string(),
                    t.health_check_interval_seconds().unwrap_or_default(),
                    t.health_check_timeout_seconds().unwrap_or_default(),
                    t.healthy_threshold_count().unwrap_or_default(),
                    t.unhealthy_threshold_count().unwrap_or_default(),
                ),
                a.attributes()
                    .iter()
                    .map(|a| (a.key().unwrap().to_string(), a.value().unwrap_or("").to_string()))
                    .collect(),
                th.target_health_descriptions().iter().map(|h| h.target().unwrap().id().unwrap().to_string()).collect(),
            ),
        );
    }
    let ls = c.elb.describe_listeners().load_balancer_arn(&d.lb_arn).send().await.unwrap();
    for l in ls.listeners() {
        d.listeners.insert(
            l.port().unwrap(),
            (
                l.protocol().unwrap().as_str().to_string(),
                l.certificates().first().and_then(|c| c.certificate_arn()).unwrap_or_default().to_string(),
                l.ssl_policy().unwrap_or_default().to_string(),
            ),
        );
    }
    d
}

pub(crate) fn annotated(mut s: Service, pairs: &[(&str, &str)]) -> Service {
    let a = s.metadata.annotations.get_or_insert_with(Default::default);
    for (k, v) in pairs {
        a.insert(k.to_string(), v.to_string());
    }
    s
}

/// (ARN, subnets, security groups) of the one load balancer.
pub(crate) async fn lb_shape(c: &Clients) -> (String, BTreeSet<String>, BTreeSet<String>) {
    let lbs = c.elb.describe_load_balancers().send().await.unwrap();
    assert_eq!(lbs.load_balancers().len(), 1, "one load balancer");
    let lb = &lbs.load_balancers()[0];
    (
        lb.load_balancer_arn().unwrap().to_string(),
        lb.availability_zones().iter().filter_map(|z| z.subnet_id()).map(str::to_string).collect(),
        lb.security_groups().iter().cloned().collect(),
    )
}

pub(crate) fn with_uid(mut s: Service, uid: &str) -> Service {
    s.metadata.uid = Some(uid.into());
    s
}
