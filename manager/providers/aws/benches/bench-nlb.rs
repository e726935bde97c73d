//! bench-nlb: the aws provider's Network Load Balancers at scale, on moto.
//!
//! For each throttling rate it starts a fresh moto, seeds a VPC with two subnets and a few
//! instances, and asks the provider for N NLB Services at once, at most `--concurrency` at a
//! time (the service controller's `concurrent_service_syncs`), retrying a Service after the
//! delay a throttled or pending call asks for, as the controller requeues. It measures the time
//! until every Service has its ingress (its ensure returned the hostname) and the AWS API calls
//! per Service by operation, counted by a proxy in front of moto that also answers a share of
//! the requests with throttling errors (EC2 `RequestLimitExceeded`, ELBv2 `Throttling`), like
//! the moto tests' fault proxy. The API server is not involved: the numbers are the provider's
//! and moto's.
//!
//! ```sh
//! cargo bench -p ccm-provider-aws --bench bench-nlb -- --services 100 --throttle 0,10
//! # debug build: cargo test -p ccm-provider-aws --bench bench-nlb -- --services 100
//! ```
//!
//! Security-group ingress is off (`DisableSecurityGroupIngress`): with it on, N Services put N
//! rules on the Nodes' group, past EC2's 60-rule default (moto enforces it too), as with
//! upstream; the rules' calls are per Service and do not grow with N.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ccm_framework::provider::{CloudError, LoadBalancer};
use ccm_provider_aws::config::AwsConfig;
use ccm_provider_aws::sdk::ec2;
use ccm_provider_aws::{AwsOptions, AwsProvider, Clients};
use k8s_openapi::api::core::v1::{Node, NodeSpec, Service, ServicePort, ServiceSpec};
use kube::api::ObjectMeta;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

#[path = "../tests/support/moto.rs"]
mod moto;
#[path = "../tests/support/wire.rs"]
mod wire;

const CLUSTER: &str = "bench";
const ZONE: &str = "us-east-1a";

struct Args {
    services: usize,
    concurrency: usize,
    nodes: i32,
    throttle: Vec<u32>,
    /// The SDK's adaptive retry mode (the provider's default) or its standard mode.
    adaptive: bool,
}

fn args() -> Args {
    let mut a = Args {
        services: 100,
        concurrency: ccm_framework::options::ControllerOptions::default().concurrent_service_syncs.max(1),
        nodes: 3,
        throttle: vec![0, 10],
        adaptive: true,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut it = argv.iter();
    while let Some(k) = it.next() {
        let mut v = || it.next().cloned().unwrap_or_default();
        match k.as_str() {
            "--services" => a.services = v().parse().expect("--services: a number"),
            "--concurrency" => a.concurrency = v().parse().expect("--concurrency: a number"),
            "--nodes" => a.nodes = v().parse().expect("--nodes: a number"),
            "--throttle" => {
                a.throttle = v().split(',').map(|p| p.parse().expect("--throttle: percentages, as 0,10")).collect()
            }
            "--retry" => {
                a.adaptive = match v().as_str() {
                    "adaptive" => true,
                    "standard" => false,
                    _ => panic!("--retry: adaptive or standard"),
                }
            }
            // `cargo bench` passes `--bench`.
            "--bench" => {}
            other => panic!(
                "unknown argument {other}; known: --services N --concurrency N --nodes N --throttle 0,10 --retry adaptive|standard"
            ),
        }
    }
    a
}

/// Requests by action, and a throttling share.
#[derive(Default)]
struct Counts {
    by_action: BTreeMap<String, u64>,
    throttled: u64,
}

struct Proxy {
    url: String,
    counts: Arc<Mutex<Counts>>,
}

async fn proxy(moto_port: u16, percent: u32) -> Proxy {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let counts = Arc::new(Mutex::new(Counts::default()));
    let seq = Arc::new(AtomicU64::new(0));
    let c = counts.clone();
    tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            tokio::spawn(serve(conn, moto_port, percent, c.clone(), seq.clone()));
        }
    });
    Proxy { url, counts }
}

/// Whether request `n` is throttled: an even spread of `percent` in every 100 requests.
fn throttled(n: u64, percent: u32) -> bool {
    (n * u64::from(percent)) % 100 < u64::from(percent)
}

async fn serve(mut conn: TcpStream, moto_port: u16, percent: u32, counts: Arc<Mutex<Counts>>, seq: Arc<AtomicU64>) {
    while let Some((head, body)) = wire::read_request(&mut conn).await {
        let action = Some(wire::action(&body)).filter(|a| !a.is_empty()).unwrap_or_else(|| "?".into());
        let throttle = throttled(seq.fetch_add(1, Ordering::SeqCst), percent);
        {
            let mut c = counts.lock().unwrap_or_else(|e| e.into_inner());
            *c.by_action.entry(action).or_default() += 1;
            if throttle {
                c.throttled += 1;
            }
        }
        if throttle {
            if conn.write_all(wire::throttled_response(wire::is_ec2(&head)).as_bytes()).await.is_err() {
                return;
            }
            continue;
        }
        if let Some(resp) = wire::forward(moto_port, &head, &body).await {
            let _ = conn.write_all(&resp).await;
        }
        return;
    }
}

fn options(url: &str, adaptive: bool) -> AwsOptions {
    AwsOptions {
        credentials: Some(ec2::config::Credentials::new("testing", "testing", None, None, "bench")),
        endpoint_url: Some(url.to_string()),
        adaptive_retry: adaptive,
        ..Default::default()
    }
}

fn config() -> AwsConfig {
    AwsConfig {
        zone: ZONE.into(),
        cluster_id: CLUSTER.into(),
        disable_security_group_ingress: true,
        ..Default::default()
    }
}

/// A VPC with two cluster-tagged subnets and `n` instances; their (ID, private DNS name).
async fn seed(c: &Clients, n: i32) -> Vec<(String, String)> {
    let tag = |k: &str, v: &str| ec2::types::Tag::builder().key(k).value(v).build();
    let vpc = c.ec2.create_vpc().cidr_block("10.0.0.0/16").send().await.expect("vpc");
    let vpc = vpc.vpc.and_then(|v| v.vpc_id).expect("vpc id");
    let mut first = String::new();
    for (i, zone) in ["us-east-1a", "us-east-1b"].iter().enumerate() {
        let spec = ec2::types::TagSpecification::builder()
            .resource_type(ec2::types::ResourceType::Subnet)
            .tags(tag(&format!("kubernetes.io/cluster/{CLUSTER}"), "shared"))
            .tags(tag("kubernetes.io/role/elb", "1"))
            .build();
        let s = c
            .ec2
            .create_subnet()
            .vpc_id(&vpc)
            .cidr_block(format!("10.0.{}.0/24", i + 1))
            .availability_zone(*zone)
            .tag_specifications(spec)
            .send()
            .await
            .expect("subnet");
        if i == 0 {
            first = s.subnet.and_then(|s| s.subnet_id).expect("subnet id");
        }
    }
    // Public subnets: the main route table goes to an internet gateway.
    let igw = c.ec2.create_internet_gateway().send().await.expect("igw");
    let igw = igw.internet_gateway.and_then(|g| g.internet_gateway_id).expect("igw id");
    c.ec2.attach_internet_gateway().internet_gateway_id(&igw).vpc_id(&vpc).send().await.expect("attach igw");
    let main = c
        .ec2
        .describe_route_tables()
        .filters(ec2::types::Filter::builder().name("vpc-id").values(&vpc).build())
        .send()
        .await
        .expect("route tables");
    let main = main.route_tables().first().and_then(|t| t.route_table_id()).expect("main table").to_string();
    c.ec2
        .create_route()
        .route_table_id(&main)
        .destination_cidr_block("0.0.0.0/0")
        .gateway_id(&igw)
        .send()
        .await
        .expect("route to the internet");
    let r = c
        .ec2
        .run_instances()
        .image_id("ami-12345678")
        .instance_type(ec2::types::InstanceType::M5Large)
        .min_count(n)
        .max_count(n)
        .subnet_id(&first)
        .send()
        .await
        .expect("instances");
    r.instances()
        .iter()
        .filter_map(|i| Some((i.instance_id()?.to_string(), i.private_dns_name()?.to_string())))
        .collect()
}

fn service(i: usize) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(format!("svc-{i}")),
            namespace: Some("default".into()),
            // Distinct in the first 31 hex digits: the load balancer's name keeps only those.
            uid: Some(format!("{i:08x}-0000-0000-0000-000000000000")),
            annotations: Some([(ccm_provider_aws::annotations::TYPE.to_string(), "nlb".to_string())].into()),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("LoadBalancer".into()),
            ports: Some(vec![ServicePort {
                name: Some("http".into()),
                port: 80,
                protocol: Some("TCP".into()),
                node_port: Some(30000 + i32::try_from(i % 2700).unwrap_or(0)),
                ..Default::default()
            }]),
            external_traffic_policy: Some("Cluster".into()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

struct Outcome {
    elapsed: Duration,
    attempts: u64,
    counts: Counts,
}

async fn run(a: &Args, percent: u32) -> Option<Outcome> {
    let m = moto::Moto::start("bench-nlb").await?;
    let direct = AwsProvider::new(config(), CLUSTER, options(&m.url, true));
    let c = direct.clients().await.expect("clients").clone();
    let instances = seed(&c, a.nodes).await;
    let nodes: Arc<Vec<Node>> = Arc::new(
        instances
            .iter()
            .map(|(id, dns)| Node {
                metadata: ObjectMeta { name: Some(dns.clone()), ..Default::default() },
                spec: Some(NodeSpec { provider_id: Some(format!("aws:///{ZONE}/{id}")), ..Default::default() }),
                ..Default::default()
            })
            .collect(),
    );
    let p = proxy(m.port, percent).await;
    let provider = Arc::new(AwsProvider::new(config(), CLUSTER, options(&p.url, a.adaptive)));
    let attempts = Arc::new(AtomicU64::new(0));
    let gate = Arc::new(tokio::sync::Semaphore::new(a.concurrency));
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..a.services {
        let (provider, nodes, attempts, gate) = (provider.clone(), nodes.clone(), attempts.clone(), gate.clone());
        tasks.spawn(async move {
            let svc = service(i);
            let mut backoff = Duration::from_millis(5);
            loop {
                let outcome = {
                    let _slot = gate.acquire().await.expect("semaphore");
                    attempts.fetch_add(1, Ordering::Relaxed);
                    let refs: Vec<&Node> = nodes.iter().collect();
                    provider.ensure_load_balancer(CLUSTER, &svc, &refs).await
                };
                match outcome {
                    Ok(status) if status.ingress.as_ref().is_some_and(|i| !i.is_empty()) => return,
                    Ok(_) => panic!("svc-{i}: no ingress"),
                    // As the controller requeues: the asked delay, else exponential from 5 ms.
                    Err(e) => {
                        let delay = e.requested_delay().unwrap_or(backoff);
                        backoff = (backoff * 2).min(Duration::from_secs(60));
                        if !matches!(e, CloudError::Throttled { .. } | CloudError::RetryAfter { .. }) {
                            eprintln!("svc-{i}: {e}; retrying in {delay:?}");
                        }
                        tokio::time::sleep(delay).await;
                    }
                }
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.expect("a Service task panicked");
    }
    let elapsed = start.elapsed();
    let counts = std::mem::take(&mut *p.counts.lock().unwrap_or_else(|e| e.into_inner()));
    Some(Outcome { elapsed, attempts: attempts.load(Ordering::Relaxed), counts })
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let a = args();
    println!(
        "bench-nlb: {} NLB Services, {} Nodes, concurrency {}, {} retry mode, moto 5.2.5 on this machine, {} build",
        a.services,
        a.nodes,
        a.concurrency,
        if a.adaptive { "adaptive" } else { "standard" },
        if cfg!(debug_assertions) { "debug" } else { "release" }
    );
    let mut outcomes = Vec::new();
    for &percent in &a.throttle {
        let Some(o) = run(&a, percent).await else { return };
        println!(
            "throttling {percent}%: all {} ingresses after {:.1} s; {} syncs; {} requests ({} throttled)",
            a.services,
            o.elapsed.as_secs_f64(),
            o.attempts,
            o.counts.by_action.values().sum::<u64>(),
            o.counts.throttled
        );
        outcomes.push((percent, o));
    }
    // API calls per Service by operation, one column per throttling rate.
    let mut actions: Vec<&String> = outcomes.iter().flat_map(|(_, o)| o.counts.by_action.keys()).collect();
    actions.sort();
    actions.dedup();
    let n = a.services as f64;
    print!("\n| operation |");
    for (p, _) in &outcomes {
        print!(" per Service, {p}% throttled |");
    }
    print!("\n|---|");
    for _ in &outcomes {
        print!("---|");
    }
    println!();
    for action in actions {
        print!("| {action} |");
        for (_, o) in &outcomes {
            print!(" {:.2} |", o.counts.by_action.get(action).copied().unwrap_or(0) as f64 / n);
        }
        println!();
    }
    print!("| all |");
    for (_, o) in &outcomes {
        print!(" {:.2} |", o.counts.by_action.values().sum::<u64>() as f64 / n);
    }
    println!();
}
