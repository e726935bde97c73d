//! The `aws` provider against moto (an AWS emulator started by each test on a free loopback
//! port) and the controllers against the local API server. Every AWS outcome is checked through
//! the emulator's own API. A small proxy in front of moto injects throttling answers and
//! "kills" the manager right after a chosen request reached AWS.
//!
//! Skips (one printed line per test) when `moto_server` is not installed.
//! Everything that depends on the API server goes through [`Env`], so switching the backend
//! (local or genuine kube-apiserver) is one place.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ccm_framework::controller::{Context, Controller};
use ccm_framework::controllers::lifecycle::LifecycleController;
use ccm_framework::controllers::node::NodeController;
use ccm_framework::controllers::route::RouteController;
use ccm_framework::controllers::service::ServiceController;
use ccm_framework::controllers::service::condition as service_condition;
use ccm_framework::health::HealthRegistry;
use ccm_framework::options::ControllerOptions;
use ccm_framework::provider::refusal_reasons;
use ccm_framework::provider::{CloudError, CloudProvider, Health, InitContext, Instances, LoadBalancer};
use ccm_provider_aws::annotations;
use ccm_provider_aws::config::AwsConfig;
use ccm_provider_aws::sdk::ec2;
use ccm_provider_aws::{AwsOptions, AwsProvider, Clients};
use e2e_apiserver::{Backend, TestCluster};
use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeSpec, NodeStatus, Service, ServicePort, ServiceSpec, Taint};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

#[path = "support/moto.rs"]
mod moto;
#[path = "support/wire.rs"]
mod wire;

use moto::Moto;

const WAIT: Duration = Duration::from_secs(60);
const CLUSTER: &str = "moto-test";
const ZONE: &str = "us-east-1a";
const TAINT_UNINITIALIZED: &str = "node.cloudprovider.kubernetes.io/uninitialized";
const TAINT_SHUTDOWN: &str = "node.cloudprovider.kubernetes.io/shutdown";

// ---------------------------------------------------------------------------------------------
// moto

fn options_for(url: &str) -> AwsOptions {
    AwsOptions {
        credentials: Some(ec2::config::Credentials::new("testing", "testing", None, None, "test")),
        endpoint_url: Some(url.to_string()),
        cache_ttl: Duration::from_millis(500),
        absence_confirm_after: Duration::from_secs(2),
        max_attempts: 3,
        ..Default::default()
    }
}

fn config() -> AwsConfig {
    AwsConfig { zone: ZONE.into(), cluster_id: CLUSTER.into(), ..Default::default() }
}

fn provider(url: &str) -> Arc<AwsProvider> {
    Arc::new(AwsProvider::new(config(), CLUSTER, options_for(url)))
}

/// The world in moto: a VPC with cluster-tagged subnets, route table and security group.
struct World {
    vpc: String,
    subnets: Vec<String>,
    sg: String,
    rtb: String,
}

fn tag(k: &str, v: &str) -> ec2::types::Tag {
    ec2::types::Tag::builder().key(k).value(v).build()
}

fn tags_spec(kind: ec2::types::ResourceType, tags: &[(&str, &str)]) -> ec2::types::TagSpecification {
    let mut b = ec2::types::TagSpecification::builder().resource_type(kind);
    for (k, v) in tags {
        b = b.tags(tag(k, v));
    }
    b.build()
}

async fn seed(c: &Clients) -> World {
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
    World { vpc, subnets, sg, rtb }
}

/// (instance ID, private DNS name) of `n` new instances.
async fn launch(c: &Clients, w: &World, n: i32) -> Vec<(String, String)> {
    let r = c
        .ec2
        .run_instances()
        .image_id("ami-12345678")
        .instance_type(ec2::types::InstanceType::M5Large)
        .min_count(n)
        .max_count(n)
        .subnet_id(&w.subnets[0])
        .security_group_ids(&w.sg)
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

struct Env {
    cluster: TestCluster,
    ctx: Context,
    shutdown: CancellationToken,
}

impl Drop for Env {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

impl Env {
    async fn start(backend: Backend, provider: Arc<dyn CloudProvider>, options: ControllerOptions) -> Env {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
        let cluster = TestCluster::start(backend).await.expect("API server starts");
        let shutdown = CancellationToken::new();
        let ctx = ccm_framework::engine::testing::context(cluster.client(), provider, options, shutdown.clone()).await;
        Env { cluster, ctx, shutdown }
    }

    fn run(&self, controller: Box<dyn Controller>) {
        let health = HealthRegistry::new().handle(controller.name());
        tokio::spawn(controller.run(self.ctx.clone(), health));
    }

    fn nodes(&self) -> Api<Node> {
        Api::all(self.cluster.client())
    }

    fn services(&self) -> Api<Service> {
        Api::namespaced(self.cluster.client(), "default")
    }

    async fn create_node(&self, node: Node) {
        let pp = PostParams { field_manager: Some("kubelet".into()), ..Default::default() };
        self.nodes().create(&pp, &node).await.expect("create node");
    }
}

fn options() -> ControllerOptions {
    ControllerOptions {
        node_batch_window: Duration::from_millis(50),
        node_monitor_period: Duration::from_millis(500),
        concurrent_service_syncs: 2,
        cluster_name: CLUSTER.into(),
        ..Default::default()
    }
}

fn node(name: &str, provider_id: Option<&str>, ready: Option<&str>, taints: Vec<Taint>) -> Node {
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

fn uninitialized() -> Vec<Taint> {
    vec![Taint {
        key: TAINT_UNINITIALIZED.into(),
        value: Some("true".into()),
        effect: "NoSchedule".into(),
        time_added: None,
    }]
}

fn has_taint(n: &Node, key: &str) -> bool {
    n.spec.as_ref().and_then(|s| s.taints.as_ref()).is_some_and(|ts| ts.iter().any(|t| t.key == key))
}

fn pid(id: &str) -> String {
    format!("aws:///{ZONE}/{id}")
}

async fn eventually<T, F, Fut>(f: F) -> T
where
    F: Fn() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    e2e_apiserver::wait::eventually(WAIT, f).await
}

// ---------------------------------------------------------------------------------------------
// Nodes

e2e_apiserver::backend_tests! {
    async fn node_named_by_private_dns_name_is_initialized_from_ec2(backend) {
        let Some(moto) = Moto::start("node_named_by_private_dns_name_is_initialized_from_ec2").await else { return };
        let p = provider(&moto.url);
        let c = p.clients().await.unwrap().clone();
        let w = seed(&c).await;
        let instances = launch(&c, &w, 3).await;
        let zones = c.ec2.describe_availability_zones().zone_names(ZONE).send().await.unwrap();
        let zone_id = zones.availability_zones()[0].zone_id().unwrap().to_string();
        let env = Env::start(backend, p.clone(), options()).await;
        env.run(Box::new(NodeController::new()));
        for (_, dns) in &instances {
            env.create_node(node(dns, None, None, uninitialized())).await;
        }
        for (id, dns) in &instances {
            let n = eventually(|| async { env.nodes().get(dns).await.ok().filter(|n| !has_taint(n, TAINT_UNINITIALIZED)) })
                .await;
            assert_eq!(n.spec.as_ref().unwrap().provider_id.as_deref(), Some(pid(id).as_str()));
            let labels = n.metadata.labels.clone().unwrap_or_default();
            assert_eq!(labels.get("node.kubernetes.io/instance-type").map(String::as_str), Some("m5.large"));
            assert_eq!(labels.get("topology.kubernetes.io/zone").map(String::as_str), Some(ZONE));
            assert_eq!(labels.get("topology.kubernetes.io/region").map(String::as_str), Some("us-east-1"));
            assert_eq!(labels.get(ccm_provider_aws::LABEL_ZONE_ID), Some(&zone_id), "upstream's zone-ID label");
            // moto 5.2.5 has no DescribeInstanceTopology (it answers 500): the Node is initialized
            // all the same, without the network-node-layer labels.
            assert!(
                !labels.keys().any(|k| k.starts_with(ccm_provider_aws::topology::LABEL_LAYER_PREFIX)),
                "{labels:?}"
            );
            let addrs: Vec<(String, String)> =
                n.status.unwrap().addresses.unwrap().into_iter().map(|a| (a.type_, a.address)).collect();
            assert_eq!(addrs.first().map(|a| a.0.as_str()), Some("InternalIP"));
            assert!(addrs.contains(&("InternalDNS".into(), dns.clone())), "{addrs:?}");
            assert!(addrs.contains(&("Hostname".into(), dns.clone())), "{addrs:?}");
        }
        // Three Nodes in one window: batched, not one call per Node.
        let calls = p.cache().counters.describe_calls.get();
        assert!(calls <= 2, "{calls} DescribeInstances calls for 3 Nodes");
    }
}

e2e_apiserver::backend_tests! {
    async fn node_with_provider_id_is_initialized_and_unknown_instance_stays_tainted(backend) {
        let Some(moto) = Moto::start("node_with_provider_id_is_initialized").await else { return };
        let p = provider(&moto.url);
        let c = p.clients().await.unwrap().clone();
        let w = seed(&c).await;
        let instances = launch(&c, &w, 1).await;
        let env = Env::start(backend, p.clone(), options()).await;
        env.run(Box::new(NodeController::new()));
        let (id, dns) = &instances[0];
        env.create_node(node("custom-name", Some(&pid(id)), None, uninitialized())).await;
        env.create_node(node("ghost", Some(&pid("i-0000000000000dead")), None, uninitialized())).await;
        let n = eventually(|| async {
            env.nodes().get("custom-name").await.ok().filter(|n| !has_taint(n, TAINT_UNINITIALIZED))
        })
        .await;
        let addrs = n.status.unwrap().addresses.unwrap();
        assert!(addrs.iter().any(|a| a.type_ == "InternalDNS" && &a.address == dns));
        tokio::time::sleep(Duration::from_secs(1)).await;
        let ghost = env.nodes().get("ghost").await.unwrap();
        assert!(has_taint(&ghost, TAINT_UNINITIALIZED), "a Node without an instance is never initialized");
    }
}

e2e_apiserver::backend_tests! {
    async fn terminated_instance_deletes_its_node_and_stopped_instance_gets_the_shutdown_taint(backend) {
        let Some(moto) = Moto::start("terminated_instance_deletes_its_node").await else { return };
        let p = provider(&moto.url);
        let c = p.clients().await.unwrap().clone();
        let w = seed(&c).await;
        let instances = launch(&c, &w, 3).await;
        let env = Env::start(backend, p.clone(), options()).await;
        for (id, dns) in &instances {
            env.create_node(node(dns, Some(&pid(id)), Some("False"), vec![])).await;
        }
        c.ec2.terminate_instances().instance_ids(&instances[0].0).send().await.unwrap();
        c.ec2.stop_instances().instance_ids(&instances[1].0).send().await.unwrap();
        env.run(Box::new(LifecycleController::new()));
        let gone = &instances[0].1;
        eventually(|| async { env.nodes().get_opt(gone).await.unwrap().is_none().then_some(()) }).await;
        let stopped = &instances[1].1;
        eventually(|| async { env.nodes().get(stopped).await.ok().filter(|n| has_taint(n, TAINT_SHUTDOWN)) }).await;
        let running = env.nodes().get(&instances[2].1).await.unwrap();
        assert!(!has_taint(&running, TAINT_SHUTDOWN));
    }
}

#[tokio::test]
async fn instance_not_visible_yet_is_not_reported_gone_until_a_second_lookup_confirms() {
    let Some(moto) = Moto::start("instance_not_visible_yet").await else { return };
    let p = provider(&moto.url);
    let n = node("late", Some(&pid("i-00000000000000001")), Some("False"), vec![]);
    // First miss: unknown, never "gone".
    assert!(matches!(p.instance_exists(&n).await, Err(CloudError::RetryAfter { .. })));
    // It appears (launched just now): found, and the earlier miss is forgotten.
    let c = p.clients().await.unwrap().clone();
    let w = seed(&c).await;
    let (id, _) = launch(&c, &w, 1).await.remove(0);
    let seen = node("late", Some(&pid(&id)), Some("False"), vec![]);
    assert_eq!(p.instance_exists(&seen).await, Ok(true));
    // Really absent: gone only after two misses at least absence_confirm_after apart.
    assert!(p.instance_exists(&n).await.is_err());
    assert!(p.instance_exists(&n).await.is_err(), "a second miss right away is not a confirmation");
    tokio::time::sleep(Duration::from_millis(2100)).await;
    assert_eq!(p.instance_exists(&n).await, Ok(false));
}

#[tokio::test]
async fn zone_id_as_zone_puts_the_zone_id_in_the_zone_label() {
    let Some(moto) = Moto::start("zone_id_as_zone").await else { return };
    let p =
        Arc::new(AwsProvider::new(AwsConfig { zone_id_as_zone: true, ..config() }, CLUSTER, options_for(&moto.url)));
    let c = p.clients().await.unwrap().clone();
    let w = seed(&c).await;
    let (id, dns) = launch(&c, &w, 1).await.remove(0);
    let zones = c.ec2.describe_availability_zones().zone_names(ZONE).send().await.unwrap();
    let zone_id = zones.availability_zones()[0].zone_id().unwrap().to_string();
    let md = p.instance_metadata(&node(&dns, Some(&pid(&id)), None, vec![])).await.unwrap().unwrap();
    assert_eq!(md.zone, zone_id);
    assert_eq!(md.additional_labels.get(ccm_provider_aws::LABEL_ZONE_ID), Some(&zone_id));
    assert_eq!(md.provider_id, pid(&id), "the providerID keeps the zone name");
}

// ---------------------------------------------------------------------------------------------
// Load balancers

/// What moto holds for the test's cluster.
#[derive(Debug, Default, PartialEq)]
struct LbState {
    lbs: Vec<(String, String)>,
    /// (TG ARN, protocol, port, health port, targets).
    tgs: Vec<(String, String, i32, String, BTreeSet<String>)>,
    /// (listener port, target group port).
    listeners: BTreeSet<(i32, i32)>,
    /// (protocol, port, cidr, description) on any security group.
    rules: BTreeSet<(String, i32, String, String)>,
}

async fn lb_state(c: &Clients) -> LbState {
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
fn lb_service(name: &str, ports: &[(i32, i32)]) -> Service {
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

fn targets(st: &LbState) -> Vec<BTreeSet<String>> {
    st.tgs.iter().map(|t| t.4.clone()).collect()
}

e2e_apiserver::backend_tests! {
    async fn nlb_lifecycle_create_ports_nodes_traffic_policy_delete(backend) {
        let Some(moto) = Moto::start("nlb_lifecycle").await else { return };
        let p = provider(&moto.url);
        let c = p.clients().await.unwrap().clone();
        let w = seed(&c).await;
        let inst = launch(&c, &w, 3).await;
        let env = Env::start(backend, p.clone(), options()).await;
        for (id, dns) in &inst[..2] {
            env.create_node(node(dns, Some(&pid(id)), Some("True"), vec![])).await;
        }
        // The first ensure is to see both Nodes; one arriving later is the node pass's case below.
        eventually(|| async { (env.ctx.nodes.state().len() == 2).then_some(()) }).await;
        env.run(Box::new(ServiceController::new()));
        let mut svc = lb_service("web", &[(80, 30080)]);
        svc.spec.as_mut().unwrap().load_balancer_source_ranges = Some(vec!["203.0.113.0/24".into()]);
        env.services().create(&PostParams::default(), &svc).await.unwrap();
        let two: BTreeSet<String> = inst[..2].iter().map(|i| i.0.clone()).collect();

        // Created: one NLB, one target group on the nodePort with kube-proxy's health port, a
        // listener, targets, and the client rule from the source range.
        let s = eventually(|| async {
            env.services().get("web").await.ok().filter(|s| {
                s.status.as_ref().and_then(|st| st.load_balancer.as_ref()).and_then(|lb| lb.ingress.as_ref()).is_some()
            })
        })
        .await;
        let hostname = s.status.unwrap().load_balancer.unwrap().ingress.unwrap()[0].hostname.clone().unwrap();
        assert!(!hostname.is_empty());
        let st = lb_state(&c).await;
        assert_eq!(st.lbs.len(), 1);
        assert_eq!(st.lbs[0].1, "default/web");
        assert_eq!(st.tgs.len(), 1);
        assert_eq!((st.tgs[0].1.as_str(), st.tgs[0].2, st.tgs[0].3.as_str()), ("TCP", 30080, "10256"));
        assert_eq!(targets(&st), vec![two.clone()]);
        assert_eq!(st.listeners, BTreeSet::from([(80, 30080)]));
        assert!(st.rules.iter().any(|r| r.1 == 30080 && r.2 == "203.0.113.0/24"), "{:?}", st.rules);

        // Add a port.
        let pp = PatchParams::default();
        let ports = |list: &[(i32, i32)]| json!({"spec": {"ports": list.iter().map(|(p, np)| json!({"name": format!("p{p}"), "port": p, "nodePort": np, "protocol": "TCP"})).collect::<Vec<_>>()}});
        env.services().patch("web", &pp, &Patch::Merge(ports(&[(80, 30080), (443, 30443)]))).await.unwrap();
        let st =
            eventually(|| async { Some(lb_state(&c).await).filter(|s| s.listeners.len() == 2 && s.tgs.len() == 2) }).await;
        assert_eq!(st.listeners, BTreeSet::from([(80, 30080), (443, 30443)]));
        assert_eq!(st.lbs.len(), 1, "the load balancer is kept");

        // Remove a port: its listener, target group and rule go.
        env.services().patch("web", &pp, &Patch::Merge(ports(&[(443, 30443)]))).await.unwrap();
        let st =
            eventually(|| async { Some(lb_state(&c).await).filter(|s| s.listeners.len() == 1 && s.tgs.len() == 1) }).await;
        assert_eq!(st.listeners, BTreeSet::from([(443, 30443)]));
        assert!(!st.rules.iter().any(|r| r.1 == 30080), "{:?}", st.rules);

        // Add a Node, then remove one.
        env.create_node(node(&inst[2].1, Some(&pid(&inst[2].0)), Some("True"), vec![])).await;
        let all: BTreeSet<String> = inst.iter().map(|i| i.0.clone()).collect();
        eventually(|| async { Some(lb_state(&c).await).filter(|s| targets(s) == vec![all.clone()]) }).await;
        env.nodes().delete(&inst[0].1, &DeleteParams::default()).await.unwrap();
        let last_two: BTreeSet<String> = inst[1..].iter().map(|i| i.0.clone()).collect();
        eventually(|| async { Some(lb_state(&c).await).filter(|s| targets(s) == vec![last_two.clone()]) }).await;

        // Switch to externalTrafficPolicy: Local: the health check moves to healthCheckNodePort and
        // a health rule opens it from the VPC.
        env.services()
            .patch(
                "web",
                &pp,
                &Patch::Merge(json!({"spec": {"externalTrafficPolicy": "Local", "healthCheckNodePort": 32100}})),
            )
            .await
            .unwrap();
        // Rules are synced last in a sync: wait for both.
        let st = eventually(|| async {
            Some(lb_state(&c).await).filter(|s| {
                s.tgs.first().is_some_and(|t| t.3 == "32100")
                    && s.rules.iter().any(|r| r.1 == 32100 && r.2 == "10.0.0.0/16")
            })
        })
        .await;
        assert_eq!(st.lbs.len(), 1);

        // Delete: nothing left.
        env.services().delete("web", &DeleteParams::default()).await.unwrap();
        eventually(|| async { env.services().get_opt("web").await.unwrap().is_none().then_some(()) }).await;
        assert_eq!(lb_state(&c).await, LbState::default());
        let _ = w.vpc;
    }
}

/// The Service's `LoadBalancerProvisioned` condition once its reason is `reason` (or once it is
/// gone, for `None`).
async fn condition(
    env: &Env,
    name: &str,
    reason: Option<&str>,
) -> Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    eventually(|| async {
        let s = env.services().get(name).await.ok()?;
        let c = s
            .status
            .and_then(|st| st.conditions)
            .and_then(|cs| cs.into_iter().find(|c| c.type_ == service_condition::CONDITION_TYPE));
        match (reason, c) {
            (Some(r), Some(c)) if c.reason == r => Some(Some(c)),
            (None, None) => Some(None),
            _ => None,
        }
    })
    .await
}

/// The first event with `reason` in the default namespace.
async fn event(env: &Env, reason: &str) -> Event {
    let events: Api<Event> = Api::namespaced(env.cluster.client(), "default");
    eventually(|| async {
        events.list(&Default::default()).await.ok()?.items.into_iter().find(|e| e.reason.as_deref() == Some(reason))
    })
    .await
}

e2e_apiserver::backend_tests! {
    async fn service_without_type_annotation_is_refused_as_classic_with_an_event_and_condition_naming_the_annotation(backend) {
        let Some(moto) = Moto::start("classic_refused").await else { return };
        let p = provider(&moto.url);
        let c = p.clients().await.unwrap().clone();
        let w = seed(&c).await;
        let inst = launch(&c, &w, 1).await;
        let env = Env::start(backend, p.clone(), options()).await;
        env.create_node(node(&inst[0].1, Some(&pid(&inst[0].0)), Some("True"), vec![])).await;
        env.run(Box::new(ServiceController::new()));
        let mut svc = lb_service("classic", &[(80, 30080)]);
        svc.metadata.annotations = None;
        env.services().create(&PostParams::default(), &svc).await.unwrap();

        // Upstream would make a Classic Load Balancer: refused, the event says what to set, and
        // nothing exists in AWS.
        let e = event(&env, "SyncLoadBalancerFailed").await;
        let note = e.note.unwrap_or_default();
        assert!(note.contains(annotations::TYPE) && note.contains("\"nlb\""), "{note}");
        let cond = condition(&env, "classic", Some(refusal_reasons::UNSUPPORTED_SERVICE)).await.unwrap();
        assert_eq!(cond.status, "False");
        assert!(cond.message.contains(annotations::TYPE) && cond.message.contains("\"nlb\""), "{}", cond.message);
        assert_eq!(lb_state(&c).await, LbState::default());

        // A malformed annotation: InvalidAnnotation, naming it and the expected form.
        let patch = json!({"metadata": {"annotations": {annotations::TYPE: "nlb", annotations::HC_INTERVAL: "3"}}});
        env.services().patch("classic", &PatchParams::default(), &Patch::Merge(patch)).await.unwrap();
        let cond = condition(&env, "classic", Some(refusal_reasons::INVALID_ANNOTATION)).await.unwrap();
        assert!(cond.message.contains(annotations::HC_INTERVAL) && cond.message.contains("5 to 300"), "{}", cond.message);
        assert_eq!(lb_state(&c).await, LbState::default());

        // Fixed: the NLB is made and the condition goes.
        let patch = json!({"metadata": {"annotations": {annotations::HC_INTERVAL: "10"}}});
        env.services().patch("classic", &PatchParams::default(), &Patch::Merge(patch)).await.unwrap();
        let st = eventually(|| async { Some(lb_state(&c).await).filter(|s| s.lbs.len() == 1 && s.listeners.len() == 1) }).await;
        assert_eq!(st.lbs[0].1, "default/classic");
        assert!(condition(&env, "classic", None).await.is_none());
    }
}

e2e_apiserver::backend_tests! {
    async fn a_load_balancer_replaced_because_elbv2_requires_it_is_evented_on_the_service(backend) {
        let Some(moto) = Moto::start("replacement_evented").await else { return };
        let p = provider(&moto.url);
        let c = p.clients().await.unwrap().clone();
        let w = seed(&c).await;
        let inst = launch(&c, &w, 1).await;
        let env = Env::start(backend, p.clone(), options()).await;
        // The engine hands the provider its event sink when it starts leading.
        let init = InitContext {
            client: env.cluster.client(),
            shutdown: env.shutdown.clone(),
            metrics: env.ctx.metrics.clone(),
            events: env.ctx.events.clone(),
        };
        p.initialize(init).await.unwrap();
        env.create_node(node(&inst[0].1, Some(&pid(&inst[0].0)), Some("True"), vec![])).await;
        env.run(Box::new(ServiceController::new()));
        env.services().create(&PostParams::default(), &lb_service("moved", &[(80, 30080)])).await.unwrap();
        eventually(|| async { Some(lb_state(&c).await).filter(|s| s.lbs.len() == 1 && s.listeners.len() == 1) }).await;
        let first = lb_shape(&c).await.0;

        // The scheme is fixed at creation: a new load balancer, and a Warning saying why.
        let patch = json!({"metadata": {"annotations": {annotations::INTERNAL: "true"}}});
        env.services().patch("moved", &PatchParams::default(), &Patch::Merge(patch)).await.unwrap();
        let e = event(&env, ccm_provider_aws::lb::REASON_LOAD_BALANCER_REPLACED).await;
        assert_eq!(e.type_.as_deref(), Some("Warning"));
        assert_eq!(e.regarding.as_ref().and_then(|r| r.name.as_deref()), Some("moved"));
        let note = e.note.unwrap_or_default();
        assert!(note.contains(annotations::INTERNAL) && note.contains("new hostname"), "{note}");
        // Read with DescribeLoadBalancers only: the controller is still at work.
        eventually(|| async {
            let lbs = c.elb.describe_load_balancers().send().await.ok()?;
            let arns: Vec<&str> = lbs.load_balancers().iter().filter_map(|l| l.load_balancer_arn()).collect();
            (arns.len() == 1 && arns[0] != first).then_some(())
        })
        .await;
    }
}

/// An ACM certificate in moto (ACM's JSON API, through moto's own endpoint).
async fn acm_certificate(port: u16) -> String {
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
#[derive(Debug, Default)]
struct NlbDetail {
    lb_arn: String,
    lb_attrs: BTreeMap<String, String>,
    /// nodePort -> (protocol, health (protocol, port, path, interval, timeout, healthy, unhealthy), attributes, targets)
    tgs: BTreeMap<
        i32,
        (String, (String, String, String, i32, i32, i32, i32), BTreeMap<String, String>, BTreeSet<String>),
    >,
    /// port -> (protocol, certificate, policy)
    listeners: BTreeMap<i32, (String, String, String)>,
}

async fn nlb_detail(c: &Clients) -> NlbDetail {
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

fn annotated(mut s: Service, pairs: &[(&str, &str)]) -> Service {
    let a = s.metadata.annotations.get_or_insert_with(Default::default);
    for (k, v) in pairs {
        a.insert(k.to_string(), v.to_string());
    }
    s
}

#[tokio::test]
async fn annotations_apply_on_moto_and_changes_converge_on_the_same_load_balancer() {
    use annotations as a;
    let Some(moto) = Moto::start("annotations_apply").await else { return };
    let p = provider(&moto.url);
    let c = p.clients().await.unwrap().clone();
    let w = seed(&c).await;
    let inst = launch(&c, &w, 2).await;
    let mut nodes: Vec<Node> = inst.iter().map(|(id, dns)| node(dns, Some(&pid(id)), Some("True"), vec![])).collect();
    nodes[0].metadata.labels = Some([("pool".to_string(), "lb".to_string())].into());
    let refs: Vec<&Node> = nodes.iter().collect();
    let cert = acm_certificate(moto.port).await;
    let policy = "ELBSecurityPolicy-TLS13-1-2-2021-06";
    let mut base = with_uid(lb_service("web", &[(80, 30080), (443, 30443)]), "00000000-0000-0000-0000-0000000000aa");
    base.spec.as_mut().unwrap().ports.as_mut().unwrap()[1].name = Some("https".into());

    // Every NLB annotation at once.
    let first = annotated(
        base.clone(),
        &[
            (a::HC_PROTOCOL, "HTTP"),
            (a::HC_PORT, "8080"),
            (a::HC_PATH, "/ready"),
            (a::HC_INTERVAL, "10"),
            (a::HC_TIMEOUT, "5"),
            (a::HC_HEALTHY, "3"),
            (a::HC_UNHEALTHY, "4"),
            (a::CROSS_ZONE, "true"),
            (a::TARGET_GROUP_ATTRIBUTES, "preserve_client_ip.enabled=false,proxy_protocol_v2.enabled=true"),
            (a::TARGET_NODE_LABELS, "pool=lb"),
            (a::SSL_CERT, &cert),
            (a::SSL_PORTS, "https"),
            (a::SSL_POLICY, policy),
            (a::SOURCE_RANGES, "198.51.100.0/24"),
        ],
    );
    p.ensure_load_balancer(CLUSTER, &first, &refs).await.unwrap();
    let d = nlb_detail(&c).await;
    let only_a: BTreeSet<String> = [inst[0].0.clone()].into();
    for port in [30080, 30443] {
        let (proto, health, attrs, targets) = &d.tgs[&port];
        assert_eq!(proto, "TCP");
        assert_eq!(health, &("HTTP".into(), "8080".into(), "/ready".into(), 10, 5, 3, 4), "port {port}");
        assert_eq!(attrs["preserve_client_ip.enabled"], "false");
        assert_eq!(attrs["proxy_protocol_v2.enabled"], "true");
        assert_eq!(targets, &only_a, "target-node-labels selects the labelled Node only");
    }
    assert_eq!(d.lb_attrs["load_balancing.cross_zone.enabled"], "true");
    // (moto reports its default policy on every listener, TCP ones too.)
    assert_eq!((d.listeners[&80].0.as_str(), d.listeners[&80].1.as_str()), ("TCP", ""));
    assert_eq!(d.listeners[&443], ("TLS".into(), cert.clone(), policy.to_string()));
    let st = lb_state(&c).await;
    assert!(st.rules.iter().any(|r| r.1 == 30080 && r.2 == "198.51.100.0/24"), "{:?}", st.rules);
    assert!(st.rules.iter().any(|r| r.1 == 8080 && r.2 == "10.0.0.0/16" && r.3.contains("/health=")), "{:?}", st.rules);
    assert!(!st.rules.iter().any(|r| r.2 == "0.0.0.0/0"), "{:?}", st.rules);

    // Changed on the live Service: TCP health check on the traffic port, attributes back to
    // their defaults, every Node, no TLS, access logs on. Same load balancer.
    let second = annotated(
        base.clone(),
        &[
            (a::HC_PROTOCOL, "TCP"),
            (a::HC_PORT, "traffic-port"),
            (a::HC_INTERVAL, "30"),
            (a::CROSS_ZONE, "false"),
            (a::ACCESS_LOG_ENABLED, "true"),
            (a::ACCESS_LOG_BUCKET, "nlb-logs"),
            (a::ACCESS_LOG_PREFIX, "web"),
        ],
    );
    p.ensure_load_balancer(CLUSTER, &second, &refs).await.unwrap();
    let e = nlb_detail(&c).await;
    assert_eq!(e.lb_arn, d.lb_arn, "not recreated");
    let all: BTreeSet<String> = inst.iter().map(|i| i.0.clone()).collect();
    for port in [30080, 30443] {
        let (_, health, attrs, targets) = &e.tgs[&port];
        assert_eq!((health.0.as_str(), health.1.as_str(), health.3, health.4), ("TCP", "traffic-port", 30, 10));
        assert_eq!(attrs["preserve_client_ip.enabled"], "true");
        assert_eq!(attrs["proxy_protocol_v2.enabled"], "false");
        assert_eq!(targets, &all);
    }
    assert_eq!(e.lb_attrs["load_balancing.cross_zone.enabled"], "false");
    assert_eq!(e.lb_attrs["access_logs.s3.enabled"], "true");
    assert_eq!(e.lb_attrs["access_logs.s3.bucket"], "nlb-logs");
    assert_eq!(e.lb_attrs["access_logs.s3.prefix"], "web");
    assert_eq!(e.listeners[&443].0, "TCP");
    let st = lb_state(&c).await;
    assert!(
        st.rules.iter().any(|r| r.1 == 30443 && r.2 == "10.0.0.0/16" && r.3.contains("/health=")),
        "{:?}",
        st.rules
    );
    assert!(!st.rules.iter().any(|r| r.1 == 8080), "the old health port's rule is removed: {:?}", st.rules);

    // A bad value on the live Service changes nothing and names the annotation.
    let before = lb_state(&c).await;
    let bad = annotated(second.clone(), &[(a::HC_INTERVAL, "3")]);
    let err = p.ensure_load_balancer(CLUSTER, &bad, &refs).await.unwrap_err().to_string();
    assert!(err.contains(a::HC_INTERVAL) && err.contains("5 to 300"), "{err}");
    assert_eq!(lb_state(&c).await, before);

    // [Global] ClusterServiceLoadBalancerHealthProbeMode = ServiceNodePort (upstream's
    // default): without annotations, a TCP check of each target's own nodePort.
    p.ensure_load_balancer_deleted(CLUSTER, &second).await.unwrap();
    let mut cfg = config();
    cfg.cluster_probe.shared = false;
    let np = Arc::new(AwsProvider::new(cfg, CLUSTER, options_for(&moto.url)));
    np.ensure_load_balancer(CLUSTER, &base, &refs).await.unwrap();
    for (_, health, _, _) in nlb_detail(&c).await.tgs.values() {
        assert_eq!((health.0.as_str(), health.1.as_str()), ("TCP", "traffic-port"));
    }
    np.ensure_load_balancer_deleted(CLUSTER, &base).await.unwrap();

    // A bad value on a new Service creates nothing.
    let err = p
        .ensure_load_balancer(CLUSTER, &annotated(first.clone(), &[(a::SSL_CERT, "web-cert")]), &refs)
        .await
        .unwrap_err();
    assert!(err.to_string().contains(a::SSL_CERT), "{err}");
    assert_eq!(lb_state(&c).await, LbState::default());
}

/// (ARN, subnets, security groups, the addresses tag) of the one load balancer.
async fn lb_shape(c: &Clients) -> (String, BTreeSet<String>, BTreeSet<String>, String) {
    let lbs = c.elb.describe_load_balancers().send().await.unwrap();
    assert_eq!(lbs.load_balancers().len(), 1, "one load balancer");
    let lb = &lbs.load_balancers()[0];
    let arn = lb.load_balancer_arn().unwrap().to_string();
    let tags = c.elb.describe_tags().resource_arns(&arn).send().await.unwrap();
    let addresses = tags.tag_descriptions()[0]
        .tags()
        .iter()
        .find(|t| t.key() == Some(ccm_provider_aws::lb::TAG_ADDRESSES))
        .and_then(|t| t.value())
        .unwrap_or("<none>")
        .to_string();
    (
        arn,
        lb.availability_zones().iter().filter_map(|z| z.subnet_id()).map(str::to_string).collect(),
        lb.security_groups().iter().cloned().collect(),
        addresses,
    )
}

#[tokio::test]
async fn fixed_addresses_security_groups_and_dual_stack_on_moto_replace_only_where_elbv2_requires() {
    use annotations as a;
    let Some(moto) = Moto::start("addresses_and_groups").await else { return };
    let p = provider(&moto.url);
    let c = p.clients().await.unwrap().clone();
    let w = seed(&c).await;
    let inst = launch(&c, &w, 1).await;
    let nodes = [node(&inst[0].1, Some(&pid(&inst[0].0)), Some("True"), vec![])];
    let refs: Vec<&Node> = nodes.iter().collect();
    let base = with_uid(lb_service("web", &[(80, 30080)]), "00000000-0000-0000-0000-0000000000bb");
    let subnets: BTreeSet<String> = w.subnets.iter().cloned().collect();
    let mut eips = Vec::new();
    for _ in 0..3 {
        eips.push(
            c.ec2.allocate_address().domain(ec2::types::DomainType::Vpc).send().await.unwrap().allocation_id.unwrap(),
        );
    }

    // Elastic IPs, one per subnet. moto 5.2.5 keeps only SubnetMapping.SubnetId (its
    // create_load_balancer drops AllocationId and PrivateIPv4Address and DescribeLoadBalancers
    // reports no LoadBalancerAddresses): checked here are the subnets and the recorded
    // addresses; the pairing is `elastic_ips_pair_in_order_and_private_addresses_by_subnet_cidr`.
    let two = format!("{},{}", eips[0], eips[1]);
    p.ensure_load_balancer(CLUSTER, &annotated(base.clone(), &[(a::EIP_ALLOCATIONS, &two)]), &refs).await.unwrap();
    let (arn1, got_subnets, _, fp1) = lb_shape(&c).await;
    assert_eq!(got_subnets, subnets);
    assert_eq!(fp1.len(), 16, "the addresses are recorded: {fp1}");
    // The same again: nothing replaced.
    p.ensure_load_balancer(CLUSTER, &annotated(base.clone(), &[(a::EIP_ALLOCATIONS, &two)]), &refs).await.unwrap();
    assert_eq!(lb_shape(&c).await.0, arn1);
    // Other Elastic IPs: ELBv2 cannot change them in place, so the load balancer is replaced,
    // with nothing left of the old one.
    let other = format!("{},{}", eips[0], eips[2]);
    p.ensure_load_balancer(CLUSTER, &annotated(base.clone(), &[(a::EIP_ALLOCATIONS, &other)]), &refs).await.unwrap();
    let (arn2, _, _, fp2) = lb_shape(&c).await;
    assert_ne!(arn2, arn1);
    assert_ne!(fp2, fp1);
    let st = lb_state(&c).await;
    assert_eq!((st.lbs.len(), st.tgs.len(), st.listeners.len()), (1, 1, 1), "{st:?}");
    // One Elastic IP for two subnets: refused before anything changes.
    let before = lb_state(&c).await;
    let err = p
        .ensure_load_balancer(CLUSTER, &annotated(base.clone(), &[(a::EIP_ALLOCATIONS, &eips[1])]), &refs)
        .await
        .unwrap_err();
    assert!(err.to_string().contains(a::EIP_ALLOCATIONS), "{err}");
    assert_eq!(lb_state(&c).await, before);
    assert_eq!(lb_shape(&c).await.0, arn2);
    p.ensure_load_balancer_deleted(CLUSTER, &base).await.unwrap();
    assert_eq!(lb_state(&c).await, LbState::default());

    // Private addresses on an internal load balancer; one outside every subnet is refused first.
    let internal = annotated(base.clone(), &[(a::INTERNAL, "true")]);
    let bad = annotated(internal.clone(), &[(a::PRIVATE_IPV4, "10.0.1.10,10.0.9.10")]);
    let err = p.ensure_load_balancer(CLUSTER, &bad, &refs).await.unwrap_err();
    assert!(err.to_string().contains(a::PRIVATE_IPV4), "{err}");
    assert_eq!(lb_state(&c).await, LbState::default(), "nothing half-built");
    let good = annotated(internal.clone(), &[(a::PRIVATE_IPV4, "10.0.2.10,10.0.1.10")]);
    p.ensure_load_balancer(CLUSTER, &good, &refs).await.unwrap();
    assert_eq!(lb_shape(&c).await.1, subnets);
    p.ensure_load_balancer_deleted(CLUSTER, &good).await.unwrap();

    // Security groups: set at creation, changed in place, and their removal replaces the load
    // balancer (an NLB made with groups keeps at least one).
    let mut groups = Vec::new();
    for name in ["lb-a", "lb-b"] {
        let g = c.ec2.create_security_group().group_name(name).description(name).vpc_id(&w.vpc).send().await.unwrap();
        groups.push(g.group_id.unwrap());
    }
    let with_a = annotated(base.clone(), &[(a::SECURITY_GROUPS, &groups[0])]);
    p.ensure_load_balancer(CLUSTER, &with_a, &refs).await.unwrap();
    let (arn_a, _, sgs, _) = lb_shape(&c).await;
    assert_eq!(sgs, [groups[0].clone()].into());
    let with_both = annotated(with_a.clone(), &[(a::EXTRA_SECURITY_GROUPS, &groups[1])]);
    p.ensure_load_balancer(CLUSTER, &with_both, &refs).await.unwrap();
    let (arn_b, _, sgs, _) = lb_shape(&c).await;
    assert_eq!(arn_b, arn_a, "changed in place");
    assert_eq!(sgs, groups.iter().cloned().collect());
    p.ensure_load_balancer(CLUSTER, &base, &refs).await.unwrap();
    let (arn_c, _, sgs, _) = lb_shape(&c).await;
    assert_ne!(arn_c, arn_a);
    assert!(sgs.is_empty());
    p.ensure_load_balancer_deleted(CLUSTER, &base).await.unwrap();
    assert_eq!(lb_state(&c).await, LbState::default());

    // Dual stack, following spec.ipFamilies, switched in place both ways.
    let mut dual = base.clone();
    dual.spec.as_mut().unwrap().ip_families = Some(vec!["IPv4".into(), "IPv6".into()]);
    dual.spec.as_mut().unwrap().ip_family_policy = Some("RequireDualStack".into());
    let ip_type = |c: Clients| async move {
        let lbs = c.elb.describe_load_balancers().send().await.unwrap();
        lbs.load_balancers()[0].ip_address_type().unwrap().as_str().to_string()
    };
    dual.spec.as_mut().unwrap().load_balancer_source_ranges =
        Some(vec!["203.0.113.0/24".into(), "2001:db8::/32".into()]);
    p.ensure_load_balancer(CLUSTER, &dual, &refs).await.unwrap();
    let arn_dual = lb_shape(&c).await.0;
    assert_eq!(ip_type(c.clone()).await, "dualstack");
    let g = c.ec2.describe_security_groups().group_ids(&w.sg).send().await.unwrap();
    let v6: Vec<(i32, String)> = g.security_groups()[0]
        .ip_permissions()
        .iter()
        .flat_map(|p| p.ipv6_ranges().iter().map(move |r| (p.from_port().unwrap(), r.cidr_ipv6().unwrap().to_string())))
        .collect();
    assert_eq!(v6, vec![(30080, "2001:db8::/32".to_string())], "the IPv6 source range reaches the nodePort");
    // Instance targets on the nodePort stay in an IPv4 target group: ELBv2's IPv6 target groups
    // take only `ip` targets, and the dualstack NLB translates IPv6 clients to them.
    let tgs = c.elb.describe_target_groups().send().await.unwrap();
    for tg in tgs.target_groups() {
        assert_eq!(tg.target_type().map(|t| t.as_str()), Some("instance"));
        assert_eq!(tg.ip_address_type().map(|t| t.as_str()).unwrap_or("ipv4"), "ipv4");
    }
    p.ensure_load_balancer(CLUSTER, &base, &refs).await.unwrap();
    assert_eq!(ip_type(c.clone()).await, "ipv4");
    let g = c.ec2.describe_security_groups().group_ids(&w.sg).send().await.unwrap();
    assert!(g.security_groups()[0].ip_permissions().iter().all(|p| p.ipv6_ranges().is_empty()), "IPv6 rule removed");
    p.ensure_load_balancer(CLUSTER, &dual, &refs).await.unwrap();
    assert_eq!(ip_type(c.clone()).await, "dualstack");
    assert_eq!(lb_shape(&c).await.0, arn_dual, "changed in place (SetIpAddressType)");
    p.ensure_load_balancer_deleted(CLUSTER, &dual).await.unwrap();

    // Subnets by Name tag, as upstream; an unknown name is refused before anything is made.
    c.ec2.create_tags().resources(&w.subnets[1]).tags(tag("Name", "public-b")).send().await.unwrap();
    let named = annotated(base.clone(), &[(a::SUBNETS, "public-b")]);
    p.ensure_load_balancer(CLUSTER, &named, &refs).await.unwrap();
    assert_eq!(lb_shape(&c).await.1, [w.subnets[1].clone()].into());
    p.ensure_load_balancer_deleted(CLUSTER, &named).await.unwrap();
    let err =
        p.ensure_load_balancer(CLUSTER, &annotated(base.clone(), &[(a::SUBNETS, "nowhere")]), &refs).await.unwrap_err();
    assert!(err.to_string().contains(a::SUBNETS), "{err}");
    assert_eq!(lb_state(&c).await, LbState::default());
}

// ---------------------------------------------------------------------------------------------
// The fault proxy

#[derive(Default)]
struct Faults {
    /// Throttling answers still to give, by action.
    throttle: BTreeMap<String, usize>,
    /// Hold the answer of the N-th request (1-based) forever, after it reached moto.
    hold_at: Option<usize>,
    requests: usize,
    throttled: usize,
    actions: Vec<String>,
    /// (action, access key ID it was signed with), per request.
    signed_by: Vec<(String, String)>,
}

/// A proxy in front of moto that throttles chosen actions and can "kill" the caller right after
/// a request took effect (the answer never comes back).
struct Proxy {
    url: String,
    faults: Arc<Mutex<Faults>>,
    held: Arc<tokio::sync::Notify>,
    held_count: Arc<AtomicUsize>,
}

impl Proxy {
    async fn start(moto_port: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let faults = Arc::new(Mutex::new(Faults::default()));
        let held = Arc::new(tokio::sync::Notify::new());
        let held_count = Arc::new(AtomicUsize::new(0));
        let (f, h, hc) = (faults.clone(), held.clone(), held_count.clone());
        tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                tokio::spawn(serve(conn, moto_port, f.clone(), h.clone(), hc.clone()));
            }
        });
        Proxy { url, faults, held, held_count }
    }

    fn set(&self, f: impl FnOnce(&mut Faults)) {
        f(&mut self.faults.lock().unwrap());
    }
}

async fn serve(
    mut conn: TcpStream,
    moto_port: u16,
    faults: Arc<Mutex<Faults>>,
    held: Arc<tokio::sync::Notify>,
    held_count: Arc<AtomicUsize>,
) {
    while let Some((head, body)) = wire::read_request(&mut conn).await {
        let action = wire::action(&body);
        let (throttle, hold) = {
            let mut f = faults.lock().unwrap();
            f.requests += 1;
            f.actions.push(action.clone());
            let key = head.split("Credential=").nth(1).and_then(|c| c.split('/').next()).unwrap_or("").to_string();
            f.signed_by.push((action.clone(), key));
            let throttle = match f.throttle.get_mut(&action) {
                Some(n) if *n > 0 => {
                    *n -= 1;
                    f.throttled += 1;
                    true
                }
                _ => false,
            };
            (throttle, !throttle && f.hold_at == Some(f.requests))
        };
        if throttle {
            if conn.write_all(wire::throttled_response(wire::is_ec2(&head)).as_bytes()).await.is_err() {
                return;
            }
            continue;
        }
        // Forward on a fresh connection, one request each.
        let Some(resp) = wire::forward(moto_port, &head, &body).await else { return };
        if hold {
            // The cloud did it; the caller never learns. Wait until the test ends.
            held_count.fetch_add(1, Ordering::SeqCst);
            held.notify_one();
            std::future::pending::<()>().await;
        }
        if conn.write_all(&resp).await.is_err() {
            return;
        }
        // moto was asked to close; so do we, after a complete answer.
        return;
    }
}

/// A provider through the proxy that retries little, so faults reach the caller, and counts
/// throttling over a short window, so the delays it asks for fit the test. Standard retry mode:
/// the adaptive mode's rate limiter would slow a burst-ridden test to half a request a second.
fn proxied(url: &str, attempts: u32) -> Arc<AwsProvider> {
    proxied_with(url, attempts, config())
}

/// [`proxied`] with another cloud-config.
fn proxied_with(url: &str, attempts: u32, config: AwsConfig) -> Arc<AwsProvider> {
    let options = AwsOptions {
        max_attempts: attempts,
        throttle_window: Duration::from_secs(4),
        adaptive_retry: false,
        ..options_for(url)
    };
    Arc::new(AwsProvider::new(config, CLUSTER, options))
}

/// `NLBSecurityGroupMode = Managed`.
fn managed_config() -> AwsConfig {
    AwsConfig { nlb_security_group_managed: true, ..config() }
}

/// IDs of the managed security groups in moto.
async fn managed_sgs(c: &Clients) -> BTreeSet<String> {
    let r = c
        .ec2
        .describe_security_groups()
        .filters(ec2::types::Filter::builder().name("tag-key").values(ccm_provider_aws::lb::TAG_SG_MODE).build())
        .send()
        .await
        .unwrap();
    r.security_groups().iter().map(|g| g.group_id().unwrap().to_string()).collect()
}

fn with_uid(mut s: Service, uid: &str) -> Service {
    s.metadata.uid = Some(uid.into());
    s
}

/// moto with the world seeded, `count` instances as Ready Nodes, and a fault proxy in front.
struct Seeded {
    moto: Moto,
    direct: Arc<AwsProvider>,
    c: Clients,
    nodes: Vec<Node>,
    proxy: Proxy,
}

async fn seeded(test: &str, count: i32) -> Option<Seeded> {
    let moto = Moto::start(test).await?;
    let direct = provider(&moto.url);
    let c = direct.clients().await.unwrap().clone();
    let w = seed(&c).await;
    let inst = launch(&c, &w, count).await;
    let nodes = inst.iter().map(|(id, dns)| node(dns, Some(&pid(id)), Some("True"), vec![])).collect();
    let proxy = Proxy::start(moto.port).await;
    Some(Seeded { moto, direct, c, nodes, proxy })
}

#[tokio::test]
async fn manager_killed_mid_ensure_or_mid_delete_leaves_nothing_orphaned() {
    let Some(Seeded { moto, direct, c, nodes, proxy }) = seeded("manager_killed_mid_ensure", 2).await else { return };
    let refs: Vec<&Node> = nodes.iter().collect();

    // How many requests an uninterrupted ensure makes.
    let probe = with_uid(lb_service("probe", &[(80, 30080), (443, 30443)]), "00000000-0000-0000-0000-000000000000");
    let before = proxy.faults.lock().unwrap().requests;
    proxied(&proxy.url, 1).ensure_load_balancer(CLUSTER, &probe, &refs).await.unwrap();
    let per_ensure = proxy.faults.lock().unwrap().requests - before;
    direct.ensure_load_balancer_deleted(CLUSTER, &probe).await.unwrap();
    assert_eq!(lb_state(&c).await, LbState::default());
    assert!(per_ensure >= 8, "{per_ensure}");

    for kill_at in 1..=per_ensure {
        let svc = with_uid(
            lb_service("web", &[(80, 30080), (443, 30443)]),
            &format!("00000000-0000-0000-0000-{kill_at:012}"),
        );
        // Killed right after request `kill_at` of an ensure took effect.
        let start = proxy.faults.lock().unwrap().requests;
        proxy.set(|f| f.hold_at = Some(start + kill_at));
        let victim = proxied(&proxy.url, 1);
        let (s2, n2) = (svc.clone(), nodes.clone());
        let task = tokio::spawn(async move {
            let refs: Vec<&Node> = n2.iter().collect();
            victim.ensure_load_balancer(CLUSTER, &s2, &refs).await
        });
        let held = proxy.held_count.load(Ordering::SeqCst);
        tokio::time::timeout(Duration::from_secs(30), async {
            while proxy.held_count.load(Ordering::SeqCst) == held {
                proxy.held.notified().await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("request {kill_at} was never made"));
        task.abort();
        proxy.set(|f| f.hold_at = None);
        // A new manager resumes: one of everything, then a delete that leaves nothing.
        let restarted = provider(&moto.url);
        restarted.ensure_load_balancer(CLUSTER, &svc, &refs).await.unwrap();
        let st = lb_state(&c).await;
        assert_eq!(st.lbs.len(), 1, "killed at request {kill_at}: {st:?}");
        assert_eq!(st.tgs.len(), 2, "killed at request {kill_at}: {st:?}");
        assert_eq!(st.listeners, BTreeSet::from([(80, 30080), (443, 30443)]), "killed at request {kill_at}");

        // Killed mid-delete at the same point (bounded by the delete's own length).
        let start = proxy.faults.lock().unwrap().requests;
        proxy.set(|f| f.hold_at = Some(start + kill_at.min(4)));
        let victim = proxied(&proxy.url, 1);
        let s2 = svc.clone();
        let task = tokio::spawn(async move { victim.ensure_load_balancer_deleted(CLUSTER, &s2).await });
        let held = proxy.held_count.load(Ordering::SeqCst);
        let _ = tokio::time::timeout(Duration::from_secs(10), async {
            while proxy.held_count.load(Ordering::SeqCst) == held {
                proxy.held.notified().await;
            }
        })
        .await;
        task.abort();
        proxy.set(|f| f.hold_at = None);
        provider(&moto.url).ensure_load_balancer_deleted(CLUSTER, &svc).await.unwrap();
        assert_eq!(lb_state(&c).await, LbState::default(), "killed at request {kill_at}");
    }
}

/// (group, port, CIDR) of every rule the provider wrote.
async fn rules_by_group(c: &Clients) -> BTreeSet<(String, i32, String)> {
    let sgs = c.ec2.describe_security_groups().send().await.unwrap();
    let mut out = BTreeSet::new();
    for g in sgs.security_groups() {
        for p in g.ip_permissions() {
            for r in p.ip_ranges() {
                if r.description().unwrap_or_default().starts_with("kubernetes.io/rule/nlb/") {
                    out.insert((
                        g.group_id().unwrap().to_string(),
                        p.from_port().unwrap(),
                        r.cidr_ip().unwrap().to_string(),
                    ));
                }
            }
        }
    }
    out
}

/// (port, source group) of every rule the provider wrote on `group` that admits a group.
async fn group_sourced_rules(c: &Clients, group: &str) -> BTreeSet<(i32, String)> {
    let sgs = c.ec2.describe_security_groups().group_ids(group).send().await.unwrap();
    let mut out = BTreeSet::new();
    for p in sgs.security_groups()[0].ip_permissions() {
        for pair in p.user_id_group_pairs() {
            if pair.description().unwrap_or_default().starts_with("kubernetes.io/rule/nlb/") {
                out.insert((p.from_port().unwrap(), pair.group_id().unwrap().to_string()));
            }
        }
    }
    out
}

#[tokio::test]
async fn elb_security_group_takes_the_rules_and_disable_security_group_ingress_writes_none() {
    let Some(moto) = Moto::start("global_security_group_keys").await else { return };
    let p = provider(&moto.url);
    let c = p.clients().await.unwrap().clone();
    let w = seed(&c).await;
    let inst = launch(&c, &w, 1).await;
    let nodes = [node(&inst[0].1, Some(&pid(&inst[0].0)), Some("True"), vec![])];
    let refs: Vec<&Node> = nodes.iter().collect();
    let svc = with_uid(lb_service("web", &[(80, 30080)]), "00000000-0000-0000-0000-0000000000dd");
    let shared = c
        .ec2
        .create_security_group()
        .group_name("elb")
        .description("elb")
        .vpc_id(&w.vpc)
        .send()
        .await
        .unwrap()
        .group_id
        .unwrap();

    // [Global] ElbSecurityGroup: the rules go there, not on the Nodes' group.
    let cfg = AwsConfig { elb_security_group: shared.clone(), ..config() };
    let elb_sg = Arc::new(AwsProvider::new(cfg, CLUSTER, options_for(&moto.url)));
    elb_sg.ensure_load_balancer(CLUSTER, &svc, &refs).await.unwrap();
    assert_eq!(rules_by_group(&c).await, [(shared.clone(), 30080, "0.0.0.0/0".to_string())].into());
    elb_sg.ensure_load_balancer_deleted(CLUSTER, &svc).await.unwrap();
    assert!(rules_by_group(&c).await.is_empty());

    // [Global] DisableSecurityGroupIngress: the load balancer, no rule anywhere.
    let cfg = AwsConfig { disable_security_group_ingress: true, ..config() };
    let off = Arc::new(AwsProvider::new(cfg, CLUSTER, options_for(&moto.url)));
    off.ensure_load_balancer(CLUSTER, &svc, &refs).await.unwrap();
    assert_eq!(lb_state(&c).await.lbs.len(), 1);
    assert!(rules_by_group(&c).await.is_empty());
    off.ensure_load_balancer_deleted(CLUSTER, &svc).await.unwrap();
    assert_eq!(lb_state(&c).await, LbState::default());
    let _ = w.sg;
}

#[tokio::test]
async fn managed_nlb_security_groups_switch_modes_and_survive_a_kill_at_every_request_with_nothing_orphaned() {
    use annotations as a;
    let Some(moto) = Moto::start("managed_security_groups").await else { return };
    let direct = Arc::new(AwsProvider::new(managed_config(), CLUSTER, options_for(&moto.url)));
    let c = direct.clients().await.unwrap().clone();
    let w = seed(&c).await;
    let inst = launch(&c, &w, 1).await;
    let nodes: Vec<Node> = inst.iter().map(|(id, dns)| node(dns, Some(&pid(id)), Some("True"), vec![])).collect();
    let refs: Vec<&Node> = nodes.iter().collect();
    let mut svc = with_uid(lb_service("web", &[(80, 30080)]), "00000000-0000-0000-0000-0000000000cc");
    svc.spec.as_mut().unwrap().load_balancer_source_ranges = Some(vec!["203.0.113.0/24".into()]);

    // Managed: a group made for the NLB, attached to it, letting the source range in on the
    // listener port.
    direct.ensure_load_balancer(CLUSTER, &svc, &refs).await.unwrap();
    let managed = managed_sgs(&c).await;
    assert_eq!(managed.len(), 1);
    let (arn, _, sgs, _) = lb_shape(&c).await;
    assert_eq!(sgs, managed);
    let m = managed.iter().next().unwrap().clone();
    let g = c.ec2.describe_security_groups().group_ids(&m).send().await.unwrap();
    let perms = g.security_groups()[0].ip_permissions();
    assert!(
        perms
            .iter()
            .any(|p| p.from_port() == Some(80) && p.ip_ranges().iter().any(|r| r.cidr_ip() == Some("203.0.113.0/24"))),
        "{perms:?}"
    );
    // The Nodes admit the NLB's group on the nodePort, as upstream's managed mode does, and no
    // client CIDR any more.
    assert_eq!(group_sourced_rules(&c, &w.sg).await, [(30080, m.clone())].into());
    assert!(!rules_by_group(&c).await.iter().any(|r| r.0 == w.sg), "{:?}", rules_by_group(&c).await);

    // Bring your own: the NLB gets it in place and the managed group goes.
    let byo = c
        .ec2
        .create_security_group()
        .group_name("byo")
        .description("byo")
        .vpc_id(&w.vpc)
        .send()
        .await
        .unwrap()
        .group_id
        .unwrap();
    let with_byo = annotated(svc.clone(), &[(a::SECURITY_GROUPS, &byo)]);
    direct.ensure_load_balancer(CLUSTER, &with_byo, &refs).await.unwrap();
    let (arn2, _, sgs, _) = lb_shape(&c).await;
    assert_eq!(arn2, arn, "switched in place");
    assert_eq!(sgs, [byo.clone()].into());
    assert!(managed_sgs(&c).await.is_empty(), "the managed group is removed");
    assert!(group_sourced_rules(&c, &w.sg).await.is_empty(), "no rule refers to the removed group");
    assert!(rules_by_group(&c).await.contains(&(w.sg.clone(), 30080, "203.0.113.0/24".to_string())));
    // Back to managed: a new managed group, the user's group left as it is.
    direct.ensure_load_balancer(CLUSTER, &svc, &refs).await.unwrap();
    let managed = managed_sgs(&c).await;
    assert_eq!(managed.len(), 1);
    assert_eq!(lb_shape(&c).await.2, managed);
    let m2 = managed.iter().next().unwrap().clone();
    assert_eq!(group_sourced_rules(&c, &w.sg).await, [(30080, m2)].into());
    direct.ensure_load_balancer_deleted(CLUSTER, &svc).await.unwrap();
    assert_eq!(lb_state(&c).await, LbState::default());
    assert!(managed_sgs(&c).await.is_empty());
    assert!(group_sourced_rules(&c, &w.sg).await.is_empty());
    assert_eq!(c.ec2.describe_security_groups().group_ids(&byo).send().await.unwrap().security_groups().len(), 1);

    // A kill after every request of an ensure and of a delete: a restarted manager ends with one
    // of each, then nothing.
    let proxy = Proxy::start(moto.port).await;
    let before = proxy.faults.lock().unwrap().requests;
    proxied_with(&proxy.url, 1, managed_config()).ensure_load_balancer(CLUSTER, &svc, &refs).await.unwrap();
    let per_ensure = proxy.faults.lock().unwrap().requests - before;
    let before = proxy.faults.lock().unwrap().requests;
    proxied_with(&proxy.url, 1, managed_config()).ensure_load_balancer_deleted(CLUSTER, &svc).await.unwrap();
    let per_delete = proxy.faults.lock().unwrap().requests - before;
    let mut counts = Vec::new();
    for kill_at in 1..=per_ensure {
        let s = with_uid(svc.clone(), &format!("00000000-0000-0000-0001-{kill_at:012}"));
        for deleting in [false, true] {
            let start = proxy.faults.lock().unwrap().requests;
            let at = if deleting { kill_at.min(per_delete) } else { kill_at };
            proxy.set(|f| f.hold_at = Some(start + at));
            let victim = proxied_with(&proxy.url, 1, managed_config());
            let (s2, n2) = (s.clone(), nodes.clone());
            let task = tokio::spawn(async move {
                let refs: Vec<&Node> = n2.iter().collect();
                if deleting {
                    victim.ensure_load_balancer_deleted(CLUSTER, &s2).await
                } else {
                    victim.ensure_load_balancer(CLUSTER, &s2, &refs).await.map(|_| ())
                }
            });
            let held = proxy.held_count.load(Ordering::SeqCst);
            let _ = tokio::time::timeout(Duration::from_secs(10), async {
                while proxy.held_count.load(Ordering::SeqCst) == held {
                    proxy.held.notified().await;
                }
            })
            .await;
            task.abort();
            proxy.set(|f| f.hold_at = None);
            if !deleting {
                direct.ensure_load_balancer(CLUSTER, &s, &refs).await.unwrap();
                let st = lb_state(&c).await;
                let sgs = managed_sgs(&c).await;
                assert_eq!((st.lbs.len(), st.tgs.len(), sgs.len()), (1, 1, 1), "killed at ensure request {kill_at}");
                assert_eq!(lb_shape(&c).await.2, sgs, "killed at ensure request {kill_at}");
            } else {
                direct.ensure_load_balancer_deleted(CLUSTER, &s).await.unwrap();
                let st = lb_state(&c).await;
                let sgs = managed_sgs(&c).await.len();
                counts.push((kill_at, st.lbs.len(), st.tgs.len(), sgs));
                assert_eq!((st.lbs.len(), st.tgs.len(), sgs), (0, 0, 0), "killed at request {kill_at}");
                assert_eq!(st, LbState::default(), "killed at request {kill_at}");
            }
        }
    }
    println!(
        "managed security groups, kill at each of {per_ensure} ensure requests (a delete: {per_delete}): (request, load balancers, target groups, security groups) left after restart and delete: {counts:?}"
    );
}

e2e_apiserver::backend_tests! {
    async fn throttling_bursts_end_converged_with_nothing_duplicated_and_show_in_health(backend) {
        let Some(moto) = Moto::start("throttling_bursts").await else { return };
        let direct = provider(&moto.url);
        let c = direct.clients().await.unwrap().clone();
        let w = seed(&c).await;
        let inst = launch(&c, &w, 2).await;
        let proxy = Proxy::start(moto.port).await;
        let p = proxied(&proxy.url, 2);

        // More throttling answers than the SDK retries: the caller sees Throttled with a delay.
        proxy.set(|f| {
            f.throttle.insert("DescribeInstances".into(), 3);
        });
        let n = node(&inst[0].1, Some(&pid(&inst[0].0)), Some("True"), vec![]);
        match p.instance_metadata(&n).await {
            Err(CloudError::Throttled { retry_after: Some(d), .. }) => assert!(d >= Duration::from_secs(1)),
            other => panic!("expected Throttled, got {other:?}"),
        }
        assert!(matches!(p.health().await, Health::Unhealthy { ref reason, .. } if reason == "Throttled"));

        // Bursts on every step of an ensure, through the service controller: it converges.
        proxy.set(|f| {
            for a in [
                "DescribeLoadBalancers",
                "CreateLoadBalancer",
                "CreateTargetGroup",
                "RegisterTargets",
                "CreateListener",
                "DescribeTags",
            ] {
                f.throttle.insert(a.into(), 3);
            }
            f.throttle.insert("DescribeInstances".into(), 2);
            f.throttle.insert("AuthorizeSecurityGroupIngress".into(), 2);
        });
        let env = Env::start(backend, p.clone(), options()).await;
        for (id, dns) in &inst {
            env.create_node(node(dns, Some(&pid(id)), Some("True"), vec![])).await;
        }
        env.run(Box::new(ServiceController::new()));
        env.services().create(&PostParams::default(), &lb_service("web", &[(80, 30080), (443, 30443)])).await.unwrap();
        eventually(|| async {
            env.services().get("web").await.ok().filter(|s| {
                s.status.as_ref().and_then(|st| st.load_balancer.as_ref()).and_then(|lb| lb.ingress.as_ref()).is_some()
            })
        })
        .await;
        let st = lb_state(&c).await;
        assert_eq!(st.lbs.len(), 1, "{st:?}");
        assert_eq!(st.tgs.len(), 2, "{st:?}");
        assert_eq!(st.listeners, BTreeSet::from([(80, 30080), (443, 30443)]));
        let all: BTreeSet<String> = inst.iter().map(|i| i.0.clone()).collect();
        assert_eq!(targets(&st), vec![all.clone(), all]);
        assert_eq!(st.rules.len(), 2, "{:?}", st.rules);
        let f = proxy.faults.lock().unwrap();
        assert!(f.throttled >= 10, "the proxy throttled {} requests", f.throttled);
    }
}

// ---------------------------------------------------------------------------------------------
// Routes

e2e_apiserver::backend_tests! {
    async fn routes_for_pod_cidrs_are_created_and_removed_and_blackholes_cleaned_up(backend) {
        let Some(moto) = Moto::start("routes").await else { return };
        let p = provider(&moto.url);
        let c = p.clients().await.unwrap().clone();
        let w = seed(&c).await;
        let inst = launch(&c, &w, 2).await;
        let opts = ControllerOptions {
            cluster_cidrs: vec!["10.244.0.0/16".parse().unwrap()],
            route_reconciliation_period: Duration::from_millis(500),
            ..options()
        };
        let env = Env::start(backend, p.clone(), opts).await;
        for (i, (id, dns)) in inst.iter().enumerate() {
            let mut n = node(dns, Some(&pid(id)), Some("True"), vec![]);
            n.spec.as_mut().unwrap().pod_cidr = Some(format!("10.244.{i}.0/24"));
            n.spec.as_mut().unwrap().pod_cidrs = Some(vec![format!("10.244.{i}.0/24")]);
            env.create_node(n).await;
        }
        env.run(Box::new(RouteController::new()));
        let routes = || async {
            let t = c.ec2.describe_route_tables().route_table_ids(&w.rtb).send().await.unwrap();
            t.route_tables()[0]
                .routes()
                .iter()
                .filter(|r| r.instance_id().is_some())
                .map(|r| (r.destination_cidr_block().unwrap().to_string(), r.instance_id().unwrap().to_string()))
                .collect::<BTreeSet<_>>()
        };
        let want: BTreeSet<(String, String)> =
            inst.iter().enumerate().map(|(i, (id, _))| (format!("10.244.{i}.0/24"), id.clone())).collect();
        eventually(|| async { Some(routes().await).filter(|r| *r == want) }).await;
        let d = c.ec2.describe_instances().instance_ids(&inst[0].0).send().await.unwrap();
        let i0 = &d.reservations()[0].instances()[0];
        assert_eq!(i0.source_dest_check(), Some(false), "source/destination check is off on route targets");

        // The Node goes: its route is removed.
        env.nodes().delete(&inst[1].1, &DeleteParams::default()).await.unwrap();
        let one: BTreeSet<(String, String)> = [("10.244.0.0/24".to_string(), inst[0].0.clone())].into();
        eventually(|| async { Some(routes().await).filter(|r| *r == one) }).await;

        // A route to an instance that is then terminated is reported as a blackhole. It lives in a
        // table the running controller does not manage (named by RouteTableID), so nothing
        // removes it before it is listed.
        let other = c.ec2.create_route_table().vpc_id(&w.vpc).send().await.unwrap();
        let other = other.route_table.unwrap().route_table_id.unwrap();
        c.ec2
            .create_route()
            .route_table_id(&other)
            .destination_cidr_block("10.245.0.0/24")
            .instance_id(&inst[0].0)
            .send()
            .await
            .unwrap();
        c.ec2.terminate_instances().instance_ids(&inst[0].0).send().await.unwrap();
        let by_id = AwsProvider::new(
            AwsConfig { route_table_id: other.clone(), ..config() },
            CLUSTER,
            options_for(&moto.url),
        );
        let listed = ccm_framework::provider::Routes::list_routes(&by_id, CLUSTER).await.unwrap();
        assert_eq!(listed.len(), 1, "{listed:?}");
        assert!(listed[0].blackhole && listed[0].destination_cidr == "10.245.0.0/24", "{listed:?}");
        assert!(listed[0].target_node.is_empty(), "a blackhole has no target Node: {listed:?}");

        // In the managed table, the terminated instance's route goes (the route controller removes
        // blackholes, as upstream does) and is not recreated while no instance backs the Node.
        eventually(|| async { Some(routes().await).filter(|r| r.is_empty()) }).await;
        tokio::time::sleep(Duration::from_millis(1200)).await;
        assert!(routes().await.is_empty(), "a route to a terminated instance is never recreated");
        eventually(|| async { Some(routes().await).filter(|r| r.is_empty()) }).await;
    }
}

/// `[Global] RoleARN`, `VPC`, `SubnetID` and `RouteTableID` acting on moto: the role is
/// assumed through STS and its credentials sign every EC2 and ELBv2 call; the load balancer's
/// subnets come from the given VPC, or are the given subnet when that VPC has none; routes go
/// into the given table only.
#[tokio::test]
async fn role_arn_vpc_subnet_id_and_route_table_id_act_on_moto() {
    use ccm_framework::provider::{Route, Routes};
    let Some(moto) = Moto::start("global_keys_on_moto").await else { return };
    let direct = provider(&moto.url);
    let c = direct.clients().await.unwrap().clone();
    let w = seed(&c).await;
    let inst = launch(&c, &w, 1).await;
    let nodes = [node(&inst[0].1, Some(&pid(&inst[0].0)), Some("True"), vec![])];
    let refs: Vec<&Node> = nodes.iter().collect();
    let svc = with_uid(lb_service("web", &[(80, 30080)]), "00000000-0000-0000-0000-0000000000ee");

    // RoleARN: STS AssumeRole (through a [ServiceOverride]) signed with the manager's own key,
    // then every EC2 and ELBv2 call signed with the role's.
    let proxy = Proxy::start(moto.port).await;
    let ini = format!(
        "[Global]\nZone = {ZONE}\nKubernetesClusterID = {CLUSTER}\nRoleARN = arn:aws:iam::123456789012:role/ccm\n\
         [ServiceOverride \"1\"]\nService = sts\nRegion = us-east-1\nURL = {}\nSigningRegion = us-east-1\n",
        proxy.url
    );
    let cfg = ccm_provider_aws::config::parse(ini.as_bytes()).unwrap();
    let role = Arc::new(AwsProvider::new(cfg, CLUSTER, options_for(&proxy.url)));
    let meta = role.instance_metadata(&nodes[0]).await.unwrap().expect("the instance is found with the role");
    assert_eq!(meta.provider_id, pid(&inst[0].0));
    role.ensure_load_balancer(CLUSTER, &svc, &refs).await.unwrap();
    role.ensure_load_balancer_deleted(CLUSTER, &svc).await.unwrap();
    let signed = proxy.faults.lock().unwrap().signed_by.clone();
    let (sts, calls): (Vec<_>, Vec<_>) = signed.iter().partition(|(a, _)| a == "AssumeRole");
    assert_eq!(sts.len(), 1, "the role is assumed once: {signed:?}");
    assert_eq!(sts[0].1, "testing", "AssumeRole is signed with the manager's own credentials");
    let keys: BTreeSet<&str> = calls.iter().map(|(_, k)| k.as_str()).collect();
    assert_eq!(keys.len(), 1, "{signed:?}");
    assert!(!keys.contains("testing") && !keys.contains(""), "EC2 and ELBv2 calls use the role's key: {keys:?}");
    assert!(
        calls.iter().any(|(a, _)| a == "DescribeInstances") && calls.iter().any(|(a, _)| a == "CreateLoadBalancer")
    );
    assert_eq!(lb_state(&c).await, LbState::default());

    // VPC: a Service without Nodes gets its load balancer in the given VPC; without the key the
    // VPC is the Nodes' and such a Service waits.
    let err = direct.ensure_load_balancer(CLUSTER, &svc, &[]).await.unwrap_err();
    assert!(err.to_string().contains("VPC"), "{err}");
    let in_vpc = AwsProvider::new(AwsConfig { vpc: w.vpc.clone(), ..config() }, CLUSTER, options_for(&moto.url));
    in_vpc.ensure_load_balancer(CLUSTER, &svc, &[]).await.unwrap();
    assert_eq!(lb_shape(&c).await.1, w.subnets.iter().cloned().collect());
    in_vpc.ensure_load_balancer_deleted(CLUSTER, &svc).await.unwrap();
    // The subnets are discovered in the given VPC, not in the Nodes' one. (Ingress rules off: a
    // VPC other than the Nodes' is a test setup, and rules are kept in the VPC's groups.)
    let elsewhere =
        |vpc: String, subnet_id: String| AwsConfig { vpc, subnet_id, disable_security_group_ingress: true, ..config() };
    let v2 = c.ec2.create_vpc().cidr_block("10.1.0.0/16").send().await.unwrap().vpc.unwrap().vpc_id.unwrap();
    let s2 = c.ec2.create_subnet().vpc_id(&v2).cidr_block("10.1.1.0/24").availability_zone("us-east-1b").send().await;
    let s2 = s2.unwrap().subnet.unwrap().subnet_id.unwrap();
    let in_v2 = AwsProvider::new(elsewhere(v2.clone(), String::new()), CLUSTER, options_for(&moto.url));
    in_v2.ensure_load_balancer(CLUSTER, &svc, &refs).await.unwrap();
    let lbs = c.elb.describe_load_balancers().send().await.unwrap();
    assert_eq!(lbs.load_balancers()[0].vpc_id(), Some(v2.as_str()));
    assert_eq!(lb_shape(&c).await.1, [s2.clone()].into());
    in_v2.ensure_load_balancer_deleted(CLUSTER, &svc).await.unwrap();

    // SubnetID: the subnet used when the VPC offers none.
    let v3 = c.ec2.create_vpc().cidr_block("10.2.0.0/16").send().await.unwrap().vpc.unwrap().vpc_id.unwrap();
    let by_subnet = AwsProvider::new(elsewhere(v3, s2.clone()), CLUSTER, options_for(&moto.url));
    by_subnet.ensure_load_balancer(CLUSTER, &svc, &refs).await.unwrap();
    assert_eq!(lb_shape(&c).await.1, [s2.clone()].into());
    by_subnet.ensure_load_balancer_deleted(CLUSTER, &svc).await.unwrap();
    assert_eq!(lb_state(&c).await, LbState::default());

    // RouteTableID: routes go into that table only, not into the cluster-tagged one.
    let rtb2 = c.ec2.create_route_table().vpc_id(&w.vpc).send().await.unwrap();
    let rtb2 = rtb2.route_table.unwrap().route_table_id.unwrap();
    let by_table =
        AwsProvider::new(AwsConfig { route_table_id: rtb2.clone(), ..config() }, CLUSTER, options_for(&moto.url));
    let route =
        Route { target_node: inst[0].1.clone(), destination_cidr: "10.244.7.0/24".into(), ..Default::default() };
    by_table.create_route(CLUSTER, "uid", &route).await.unwrap();
    let routes_in = |table: String| {
        let c = c.clone();
        async move {
            let t = c.ec2.describe_route_tables().route_table_ids(table).send().await.unwrap();
            t.route_tables()[0]
                .routes()
                .iter()
                .filter_map(|r| Some((r.destination_cidr_block()?.to_string(), r.instance_id()?.to_string())))
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(routes_in(rtb2.clone()).await, vec![("10.244.7.0/24".to_string(), inst[0].0.clone())]);
    assert!(routes_in(w.rtb.clone()).await.is_empty(), "the tagged table is left alone");
    let listed = by_table.list_routes(CLUSTER).await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(
        (listed[0].target_node.as_str(), listed[0].destination_cidr.as_str()),
        (inst[0].1.as_str(), "10.244.7.0/24")
    );
    by_table.delete_route(CLUSTER, &listed[0]).await.unwrap();
    assert!(routes_in(rtb2).await.is_empty());
}

// ---------------------------------------------------------------------------------------------
// Benchmark (ignored: run by hand, see docs/aws.md)

/// 1,000 instances in moto, 1,000 Nodes registered at once: how many `DescribeInstances` calls
/// and how long until every Node is initialized. On the genuine kube-apiserver when
/// `CCM_TEST_ASSETS` is set, else on the local one. Asserts only that all Nodes are
/// initialized with batched lookups (fewer calls than Nodes / 10); prints the numbers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: cargo test --workspace --test aws -- --ignored --nocapture bench_"]
async fn bench_thousand_nodes_initialized_with_batched_describe_calls() {
    const N: usize = 1000;
    let Some(moto) = Moto::start("bench_thousand_nodes").await else { return };
    let p = provider(&moto.url);
    let c = p.clients().await.unwrap().clone();
    let mut w = seed(&c).await;
    // A /20 for the instances: a /24 holds fewer than 256.
    let big = c.ec2.create_subnet().vpc_id(&w.vpc).cidr_block("10.0.16.0/20").availability_zone(ZONE).send().await;
    w.subnets[0] = big.unwrap().subnet.unwrap().subnet_id.unwrap();
    let mut instances = Vec::new();
    while instances.len() < N {
        instances.extend(launch(&c, &w, 250.min((N - instances.len()) as i32)).await);
    }
    let backend = if Backend::genuine_available() { Backend::Genuine } else { Backend::Local };
    let env =
        Env::start(backend, p.clone(), ControllerOptions { cluster_name: CLUSTER.into(), ..Default::default() }).await;
    env.run(Box::new(NodeController::new()));
    let started = std::time::Instant::now();
    let env = Arc::new(env);
    let mut tasks = tokio::task::JoinSet::new();
    for chunk in instances.chunks(N / 16) {
        let (env, chunk) = (env.clone(), chunk.to_vec());
        tasks.spawn(async move {
            for (_, dns) in chunk {
                env.create_node(node(&dns, None, None, uninitialized())).await;
            }
        });
    }
    tasks.join_all().await;
    let created = started.elapsed();
    let lp = kube::api::ListParams::default();
    tokio::time::timeout(Duration::from_secs(600), async {
        loop {
            let nodes = env.nodes().list(&lp).await.unwrap();
            if nodes.items.iter().filter(|n| !has_taint(n, TAINT_UNINITIALIZED)).count() >= N {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await
    .expect("all Nodes initialized within 10 minutes");
    let elapsed = started.elapsed();
    let calls = p.cache().counters.describe_calls.get();
    println!(
        "bench aws ({}): {N} Nodes created in {created:?}, all initialized after {elapsed:?}; \
         {calls} DescribeInstances calls ({:.2}% of the Node count)",
        backend.name(),
        calls as f64 * 100.0 / N as f64
    );
    assert!((calls as usize) < N / 10, "{calls} DescribeInstances calls for {N} Nodes: not batched");
}

/// Requests by action since `from` (the proxy logs every request).
fn actions_since(proxy: &Proxy, from: usize) -> BTreeMap<String, usize> {
    let f = proxy.faults.lock().unwrap();
    let mut out = BTreeMap::new();
    for a in &f.actions[from..] {
        *out.entry(a.clone()).or_insert(0) += 1;
    }
    out
}

#[tokio::test]
async fn a_sync_makes_as_many_calls_beside_thirty_load_balancers_as_beside_none_after_one_scan() {
    let Some(Seeded { moto: _moto, direct, c, nodes, proxy }) = seeded("sync_calls_flat", 2).await else { return };
    let refs: Vec<&Node> = nodes.iter().collect();
    let p = proxied(&proxy.url, 3);
    let web = with_uid(lb_service("web", &[(80, 30080)]), "00000000-0000-0000-0002-000000000000");
    p.ensure_load_balancer(CLUSTER, &web, &refs).await.unwrap();

    let steady = |label: &'static str| {
        let (p, web, refs) = (p.clone(), web.clone(), refs.clone());
        let proxy = &proxy;
        async move {
            let from = proxy.faults.lock().unwrap().actions.len();
            p.update_load_balancer(CLUSTER, &web, &refs).await.unwrap();
            let mut calls = actions_since(proxy, from);
            // The instance cache refreshes on its own clock, whatever the load balancers.
            calls.remove("DescribeInstances");
            println!("{label}: {calls:?}");
            calls
        }
    };
    let alone = steady("one load balancer").await;
    for i in 0..30 {
        let other = with_uid(
            lb_service(&format!("other-{i}"), &[(80, 31000 + i)]),
            &format!("{i:08x}-0000-0000-0003-000000000000"),
        );
        direct.ensure_load_balancer(CLUSTER, &other, &refs).await.unwrap();
    }
    assert_eq!(lb_state(&c).await.lbs.len(), 31);
    let crowded = steady("beside thirty").await;
    assert_eq!(crowded, alone, "a sync's calls do not depend on how many other load balancers exist");
    assert!(!alone.contains_key("DescribeTags") || alone["DescribeTags"] <= 1, "{alone:?}");

    // A new process scans once (pages of 400, tags 20 at a time), then syncs as cheaply.
    let fresh = proxied(&proxy.url, 3);
    let from = proxy.faults.lock().unwrap().actions.len();
    fresh.update_load_balancer(CLUSTER, &web, &refs).await.unwrap();
    let first = actions_since(&proxy, from);
    println!("new process, first sync: {first:?}");
    assert_eq!(
        first.get("DescribeTags"),
        Some(&(2 + 2 + 1)),
        "31 load balancers and 31 target groups, 20 a call, then its own"
    );
    let from = proxy.faults.lock().unwrap().actions.len();
    fresh.update_load_balancer(CLUSTER, &web, &refs).await.unwrap();
    let mut second = actions_since(&proxy, from);
    second.remove("DescribeInstances");
    assert_eq!(second, alone);
}
