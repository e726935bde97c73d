//! Benchmark (ignored: run by hand, see docs/aws.md).

use crate::kit::*;

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
