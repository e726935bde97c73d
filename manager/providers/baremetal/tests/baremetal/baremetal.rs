//! The baremetal provider end to end: the built-in controllers against both API server backends,
//! with the provider built from a cloud-config exactly as the manager builds it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ccm_framework::controllers::lifecycle::LifecycleController;
use ccm_framework::controllers::node::NodeController;
use ccm_framework::controllers::service::ServiceController;
use ccm_framework::engine::testing::{RunningController, run_controller};
use ccm_framework::options::ControllerOptions;
use ccm_framework::provider::CloudProvider;
use ccm_provider_baremetal::BaremetalProvider;
use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeSpec, NodeStatus, Service, ServiceStatus};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;
use testkit::{Backend, TestCluster, eventually, eventually_within, ingress, ingress_ips, kubelet_node, lb_service};
use tokio::net::TcpListener;

const UNINITIALIZED: &str = "node.cloudprovider.kubernetes.io/uninitialized";
const SHUTDOWN: &str = "node.cloudprovider.kubernetes.io/shutdown";

fn provider(config: &str) -> Arc<BaremetalProvider> {
    Arc::new(BaremetalProvider::from_cloud_config(Some(config.as_bytes())).expect("valid cloud-config"))
}

fn taints(node: &Node) -> Vec<String> {
    node.spec.as_ref().and_then(|s| s.taints.as_ref()).into_iter().flatten().map(|t| t.key.clone()).collect()
}

/// An initialized Node whose kubelet has not reported Ready (so the lifecycle controller
/// checks its instance, L2).
fn initialized_node(name: &str, provider_id: Option<&str>) -> Node {
    Node {
        metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
        spec: Some(NodeSpec { provider_id: provider_id.map(Into::into), ..Default::default() }),
        status: Some(NodeStatus::default()),
    }
}

async fn create_node(nodes: &Api<Node>, node: &Node) {
    nodes.create(&PostParams::default(), node).await.expect("create node");
}

async fn set_ready(nodes: &Api<Node>, name: &str, status: &str) {
    let condition = NodeCondition { type_: "Ready".into(), status: status.into(), ..Default::default() };
    let patch = json!({ "status": { "conditions": [condition] } });
    nodes.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("patch Ready");
}

async fn wait_for_ip(services: &Api<Service>, name: &str) -> String {
    eventually(&format!("{name} gets an address"), || async {
        let svc = services.get(name).await.ok()?;
        ingress_ips(&svc).first().cloned()
    })
    .await
}

fn service_options(workers: usize) -> ControllerOptions {
    ControllerOptions { concurrent_service_syncs: workers, ..Default::default() }
}

fn lifecycle_options() -> ControllerOptions {
    ControllerOptions { node_monitor_period: Duration::from_millis(100), ..Default::default() }
}

async fn start(
    cluster: &TestCluster,
    provider: Arc<BaremetalProvider>,
    options: ControllerOptions,
    controller: Box<dyn ccm_framework::controller::Controller>,
) -> RunningController {
    run_controller(cluster.client(), provider as Arc<dyn CloudProvider>, options, controller).await
}

const INVENTORY: &str = "\
instances:
  - name: node-1
    addresses:
      - {type: InternalIP, address: 10.0.0.11}
      - {type: Hostname, address: node-1.lan}
    instanceType: mini-pc
    zone: shelf-1
    region: home
    labels: {example.com/disk: nvme}
  - name: node-2
    providerID: baremetal://serial-42
    addresses:
      - {type: InternalIP, address: 10.0.0.12}
      - {type: Hostname, address: WORKER-2.lan}
";

testkit::backend_tests! {
    async fn nodes_are_initialized_from_the_inventory(backend) {
        let cluster = TestCluster::start(backend).await.unwrap();
        let nodes: Api<Node> = Api::all(cluster.client());
        let running =
            start(&cluster, provider(INVENTORY), ControllerOptions::default(), Box::new(NodeController::new())).await;
        create_node(&nodes, &kubelet_node("node-1")).await;
        // Matched on its Hostname address, case-insensitively.
        create_node(&nodes, &kubelet_node("worker-2.lan")).await;

        let node1 = eventually("node-1 initialized", || async {
            nodes.get("node-1").await.ok().filter(|n| !taints(n).contains(&UNINITIALIZED.to_string()))
        })
        .await;
        let spec = node1.spec.clone().unwrap();
        assert_eq!(spec.provider_id.as_deref(), Some("baremetal://node-1"));
        let labels = node1.metadata.labels.clone().unwrap_or_default();
        assert_eq!(labels.get("node.kubernetes.io/instance-type").map(String::as_str), Some("mini-pc"));
        assert_eq!(labels.get("topology.kubernetes.io/zone").map(String::as_str), Some("shelf-1"));
        assert_eq!(labels.get("topology.kubernetes.io/region").map(String::as_str), Some("home"));
        assert_eq!(labels.get("example.com/disk").map(String::as_str), Some("nvme"));
        let addresses: Vec<(String, String)> =
            node1.status.and_then(|s| s.addresses).unwrap_or_default().into_iter().map(|a| (a.type_, a.address)).collect();
        assert_eq!(
            addresses,
            [("InternalIP".to_string(), "10.0.0.11".to_string()), ("Hostname".to_string(), "node-1.lan".to_string())]
        );

        let node2 = eventually("worker-2.lan initialized", || async {
            nodes.get("worker-2.lan").await.ok().filter(|n| !taints(n).contains(&UNINITIALIZED.to_string()))
        })
        .await;
        assert_eq!(node2.spec.unwrap().provider_id.as_deref(), Some("baremetal://serial-42"));
        running.stop().await.unwrap();
    }

    async fn a_node_missing_from_the_inventory_stays_uninitialized(backend) {
        let cluster = TestCluster::start(backend).await.unwrap();
        let nodes: Api<Node> = Api::all(cluster.client());
        let running =
            start(&cluster, provider(INVENTORY), ControllerOptions::default(), Box::new(NodeController::new())).await;
        create_node(&nodes, &kubelet_node("stranger")).await;
        create_node(&nodes, &kubelet_node("node-1")).await;
        // Once node-1 (created after it) is done, stranger has been looked at too.
        eventually("node-1 initialized", || async {
            nodes.get("node-1").await.ok().filter(|n| !taints(n).contains(&UNINITIALIZED.to_string()))
        })
        .await;
        let stranger = nodes.get("stranger").await.unwrap();
        assert!(taints(&stranger).contains(&UNINITIALIZED.to_string()));
        assert!(stranger.spec.unwrap().provider_id.is_none());
        running.stop().await.unwrap();
    }

    async fn a_failing_probe_taints_the_node_shut_down_and_recovery_clears_it(backend) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let config = format!(
            "instances:\n  - name: node-1\n    addresses: [{{type: InternalIP, address: 127.0.0.1}}]\nlifecycle:\n  probe: {{port: {port}, interval: 100ms, timeout: 100ms, failureThreshold: 2}}\n"
        );
        let cluster = TestCluster::start(backend).await.unwrap();
        let nodes: Api<Node> = Api::all(cluster.client());
        let provider = provider(&config);
        let running = start(&cluster, provider.clone(), lifecycle_options(), Box::new(LifecycleController::new())).await;
        create_node(&nodes, &initialized_node("node-1", Some("baremetal://node-1"))).await;
        set_ready(&nodes, "node-1", "True").await;

        // The machine goes away: kubelet stops reporting, the probe fails.
        drop(listener);
        set_ready(&nodes, "node-1", "Unknown").await;
        eventually("shutdown taint added", || async {
            nodes.get("node-1").await.ok().filter(|n| taints(n).contains(&SHUTDOWN.to_string()))
        })
        .await;
        assert!(nodes.get("node-1").await.is_ok(), "a shut-down instance is not deleted");
        let health = provider.health().await;
        assert_eq!(health.reason(), "ProbeFailing", "{health:?}");

        // It comes back: the probe passes, then kubelet reports Ready and the taint goes (L1).
        let _listener = TcpListener::bind(("127.0.0.1", port)).await.unwrap();
        eventually("probe passes again", || async { provider.probe_states().status(0).filter(|s| !s.down).map(|_| ()) })
            .await;
        assert!(provider.health().await.is_healthy());
        set_ready(&nodes, "node-1", "True").await;
        eventually("shutdown taint removed", || async {
            nodes.get("node-1").await.ok().filter(|n| !taints(n).contains(&SHUTDOWN.to_string()))
        })
        .await;
        running.stop().await.unwrap();
    }
}

/// Run the lifecycle controller over a known, a declared-shutdown and an unknown NotReady
/// Node; return whether the unknown one survived.
async fn unknown_node_survives(backend: Backend, delete_absent_nodes: bool) -> bool {
    let config = format!(
        "instances:\n  - name: known\n  - name: parked\n    state: shutdown\nlifecycle:\n  deleteAbsentNodes: {delete_absent_nodes}\n"
    );
    let cluster = TestCluster::start(backend).await.unwrap();
    let nodes: Api<Node> = Api::all(cluster.client());
    let running = start(&cluster, provider(&config), lifecycle_options(), Box::new(LifecycleController::new())).await;
    for name in ["known", "stranger", "parked"] {
        create_node(&nodes, &initialized_node(name, None)).await;
    }
    // The parked Node's taint proves the controller has made passes over every Node.
    eventually("parked Node tainted", || async {
        nodes.get("parked").await.ok().filter(|n| taints(n).contains(&SHUTDOWN.to_string()))
    })
    .await;
    if delete_absent_nodes {
        eventually("stranger deleted", || async { nodes.get_opt("stranger").await.ok().filter(Option::is_none) }).await;
    } else {
        // Several more passes (period 100 ms).
        tokio::time::sleep(Duration::from_millis(600)).await;
    }
    assert!(nodes.get("known").await.is_ok(), "an inventory Node is never deleted");
    let survived = nodes.get_opt("stranger").await.unwrap().is_some();
    running.stop().await.unwrap();
    survived
}

testkit::backend_tests! {
    async fn delete_absent_nodes_off_keeps_nodes_missing_from_the_inventory(backend) {
        assert!(unknown_node_survives(backend, false).await);
    }

    async fn delete_absent_nodes_on_deletes_nodes_missing_from_the_inventory(backend) {
        assert!(!unknown_node_survives(backend, true).await);
    }
}

const POOL: &str = "loadBalancer:\n  retryAfter: 1s\n  pools:\n    - {name: lan, cidrs: [192.168.50.0/29]}\n";

testkit::backend_tests! {
    async fn load_balancer_addresses_are_assigned_and_released(backend) {
        let cluster = TestCluster::start(backend).await.unwrap();
        let services: Api<Service> = Api::namespaced(cluster.client(), "default");
        let running = start(&cluster, provider(POOL), service_options(2), Box::new(ServiceController::new())).await;

        services.create(&PostParams::default(), &lb_service("default", "web")).await.unwrap();
        services.create(&PostParams::default(), &lb_service("default", "api")).await.unwrap();
        let web = wait_for_ip(&services, "web").await;
        let api = wait_for_ip(&services, "api").await;
        assert_ne!(web, api);
        let both: BTreeSet<String> = [web.clone(), api.clone()].into();
        assert_eq!(both, BTreeSet::from(["192.168.50.0".to_string(), "192.168.50.1".to_string()]));
        let svc = services.get("web").await.unwrap();
        assert_eq!(ingress(&svc), [(web.clone(), Some("VIP".to_string()))]);

        // Deleting the Service releases its address: the next Service gets it.
        services.delete("web", &DeleteParams::default()).await.unwrap();
        eventually("web gone", || async { services.get_opt("web").await.ok().filter(Option::is_none) }).await;
        services.create(&PostParams::default(), &lb_service("default", "next")).await.unwrap();
        assert_eq!(wait_for_ip(&services, "next").await, web);

        // A requested address is honoured.
        let mut pinned = lb_service("default", "pinned");
        pinned.metadata.annotations =
            Some(BTreeMap::from([("ccm.rs/load-balancer-ips".to_string(), "192.168.50.7".to_string())]));
        services.create(&PostParams::default(), &pinned).await.unwrap();
        assert_eq!(wait_for_ip(&services, "pinned").await, "192.168.50.7");
        running.stop().await.unwrap();
    }

    async fn a_restart_keeps_every_address_and_repairs_duplicates(backend) {
        let cluster = TestCluster::start(backend).await.unwrap();
        let services: Api<Service> = Api::namespaced(cluster.client(), "default");

        let first = start(&cluster, provider(POOL), service_options(4), Box::new(ServiceController::new())).await;
        for i in 0..5 {
            services.create(&PostParams::default(), &lb_service("default", &format!("s{i}"))).await.unwrap();
        }
        let mut before = BTreeMap::new();
        for i in 0..5 {
            let name = format!("s{i}");
            before.insert(name.clone(), wait_for_ip(&services, &name).await);
        }
        first.stop().await.unwrap();

        // While no manager runs: one Service goes away, and a stateless allocator hands the
        // address of s1 to a new Service too.
        let gone = before.remove("s2").unwrap();
        services.delete("s2", &DeleteParams::default()).await.unwrap();
        // No controller removes the finalizer now: do what the last cleanup would have done.
        services
            .patch("s2", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"finalizers": null}})))
            .await
            .unwrap();
        // Creation timestamps have one-second resolution: make dup clearly younger than s1.
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let dup = services.create(&PostParams::default(), &lb_service("default", "dup")).await.unwrap();
        let mut status: ServiceStatus = dup.status.clone().unwrap_or_default();
        status.load_balancer =
            Some(serde_json::from_value(json!({"ingress": [{"ip": before["s1"], "ipMode": "VIP"}]})).unwrap());
        services.patch_status("dup", &PatchParams::default(), &Patch::Merge(json!({ "status": status }))).await.unwrap();

        // A fresh provider from the same config, as after a process restart.
        let second = start(&cluster, provider(POOL), service_options(4), Box::new(ServiceController::new())).await;
        let dup_ip = eventually("dup moved off the duplicate", || async {
            let svc = services.get("dup").await.ok()?;
            ingress_ips(&svc).first().filter(|ip| **ip != before["s1"]).cloned()
        })
        .await;
        services.create(&PostParams::default(), &lb_service("default", "late")).await.unwrap();
        let late = wait_for_ip(&services, "late").await;
        for (name, ip) in &before {
            let svc = services.get(name).await.unwrap();
            assert_eq!(ingress_ips(&svc), std::slice::from_ref(ip), "{name} kept its address");
        }
        let mut all: Vec<String> = before.values().cloned().chain([dup_ip.clone(), late.clone()]).collect();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 6, "no address is shared");
        assert!([dup_ip, late].contains(&gone), "the freed address is reused");
        second.stop().await.unwrap();
    }

    /// 500 LoadBalancer Services against a pool of exactly 256 addresses with 16 service workers:
    /// 256 get distinct addresses, every other one gets a `SyncLoadBalancerFailed` event, and
    /// deleting 10 lets 10 waiting Services get the freed addresses.
    async fn stress_500_services_16_workers_256_addresses(backend) {
        let cluster = TestCluster::start(backend).await.unwrap();
        let client = cluster.client();
        let services: Api<Service> = Api::namespaced(client.clone(), "default");
        let config = "loadBalancer:\n  retryAfter: 10s\n  pools:\n    - {name: exact, cidrs: [10.77.0.0/24]}\n";
        // One host, so each sync emits two events rather than three (no UnAvailableLoadBalancer)
        // and the first round's events fit the event queue.
        create_node(&Api::all(client.clone()), &initialized_node("host-1", Some("baremetal://host-1"))).await;
        let running = start(&cluster, provider(config), service_options(16), Box::new(ServiceController::new())).await;

        let names: Vec<String> = (0..500).map(|i| format!("svc-{i:03}")).collect();
        futures::future::join_all(names.iter().map(|name| {
            let services = services.clone();
            async move { services.create(&PostParams::default(), &lb_service("default", name)).await.unwrap() }
        }))
        .await;

        let assigned = |list: Vec<Service>| -> BTreeMap<String, String> {
            list.into_iter().filter_map(|s| Some((s.metadata.name.clone()?, ingress_ips(&s).first()?.clone()))).collect()
        };
        let holders = eventually_within("256 Services get addresses", Duration::from_secs(120), || async {
            let got = assigned(services.list(&ListParams::default()).await.ok()?.items);
            (got.len() == 256).then_some(got)
        })
        .await;
        let distinct: BTreeSet<&String> = holders.values().collect();
        assert_eq!(distinct.len(), 256, "no address handed out twice");

        let events: Api<Event> = Api::namespaced(client.clone(), "default");
        let waiting: BTreeSet<String> = names.iter().filter(|n| !holders.contains_key(*n)).cloned().collect();
        assert_eq!(waiting.len(), 244);
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let list = events.list(&ListParams::default()).await.unwrap();
            let failed: BTreeSet<String> = list
                .items
                .iter()
                .filter(|e| e.reason.as_deref() == Some("SyncLoadBalancerFailed"))
                .filter_map(|e| e.regarding.as_ref()?.name.clone())
                .collect();
            if waiting.is_subset(&failed) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "SyncLoadBalancerFailed events for {} of {} waiting Services ({} events in all, {} failed-event subjects hold addresses)",
                waiting.intersection(&failed).count(),
                waiting.len(),
                list.items.len(),
                failed.difference(&waiting).count(),
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        // Another retry round changes nothing while the pool is full.
        tokio::time::sleep(Duration::from_secs(11)).await;
        assert_eq!(assigned(services.list(&ListParams::default()).await.unwrap().items), holders);

        let deleted: Vec<String> = holders.keys().take(10).cloned().collect();
        let freed: BTreeSet<String> = deleted.iter().map(|n| holders[n].clone()).collect();
        for name in &deleted {
            services.delete(name, &DeleteParams::default()).await.unwrap();
        }
        let after = eventually_within("10 waiting Services get the freed addresses", Duration::from_secs(120), || async {
            let got = assigned(services.list(&ListParams::default()).await.ok()?.items);
            let newcomers: BTreeMap<String, String> = got.into_iter().filter(|(n, _)| waiting.contains(n)).collect();
            (newcomers.len() == 10).then_some(newcomers)
        })
        .await;
        let reused: BTreeSet<String> = after.values().cloned().collect();
        assert_eq!(reused, freed);
        let total = assigned(services.list(&ListParams::default()).await.unwrap().items);
        assert_eq!(total.len(), 256);
        assert_eq!(total.values().collect::<BTreeSet<_>>().len(), 256);
        running.stop().await.unwrap();
    }
}

/// Put `content` where a Secret volume would show it, the way kubelet updates one: a new
/// directory, then an atomic rename of the `..data` symlink the file points through.
fn publish_secret_file(dir: &std::path::Path, version: u32, content: &str) {
    let target = dir.join(format!("..v{version}"));
    std::fs::create_dir_all(&target).unwrap();
    std::fs::write(target.join("cloud.conf"), content).unwrap();
    let tmp = dir.join("..data_tmp");
    std::os::unix::fs::symlink(format!("..v{version}"), &tmp).unwrap();
    std::fs::rename(&tmp, dir.join("..data")).unwrap();
    let file = dir.join("cloud.conf");
    if std::fs::symlink_metadata(&file).is_err() {
        std::os::unix::fs::symlink("..data/cloud.conf", &file).unwrap();
    }
}

const LAN: &str = "    - {name: lan, cidrs: [192.168.50.0/31]}\n";
const EXTRA: &str = "    - {name: extra, cidrs: [192.168.60.0/30]}\n";

fn pools_config(pools: &[&str]) -> String {
    format!("loadBalancer:\n  retryAfter: 1s\n  pools:\n{}", pools.concat())
}

testkit::backend_tests! {
    /// Pool edits reach the running provider through its cloud-config file, in the same
    /// process: Services keep their addresses through an edit that still contains them, a
    /// waiting Service gets one from an added pool, and removing a pool takes no address from a
    /// live Service (it is kept outside the pools until the Service goes).
    async fn pool_edits_in_the_cloud_config_file_apply_without_a_restart(backend) {
        let dir = std::env::temp_dir().join(format!("ccm-pool-reload-{}-{backend:?}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let first = pools_config(&[LAN]);
        publish_secret_file(&dir, 1, &first);
        let provider = provider(&first);
        let cluster = TestCluster::start(backend).await.unwrap();
        let services: Api<Service> = Api::namespaced(cluster.client(), "default");
        let running = start(&cluster, provider.clone(), service_options(2), Box::new(ServiceController::new())).await;
        let stop_watch = tokio_util::sync::CancellationToken::new();
        let watch = tokio::spawn(ccm_framework::config_watch::watch(
            dir.join("cloud.conf"),
            provider.clone() as Arc<dyn CloudProvider>,
            Some(ccm_framework::config_watch::digest(first.as_bytes())),
            Duration::from_millis(100),
            stop_watch.clone(),
        ));

        services.create(&PostParams::default(), &lb_service("default", "a")).await.unwrap();
        services.create(&PostParams::default(), &lb_service("default", "b")).await.unwrap();
        let a = wait_for_ip(&services, "a").await;
        let b = wait_for_ip(&services, "b").await;
        assert_eq!(BTreeSet::from([a.clone(), b.clone()]), BTreeSet::from(["192.168.50.0".into(), "192.168.50.1".into()]));
        // The pool is full: c waits.
        services.create(&PostParams::default(), &lb_service("default", "c")).await.unwrap();
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(ingress_ips(&services.get("c").await.unwrap()).is_empty(), "no address while the pool is full");

        // A pool is added: c gets an address from it; a and b keep theirs.
        publish_secret_file(&dir, 2, &pools_config(&[LAN, EXTRA]));
        assert_eq!(wait_for_ip(&services, "c").await, "192.168.60.0");
        assert_eq!(ingress_ips(&services.get("a").await.unwrap()), [a.clone()]);
        assert_eq!(ingress_ips(&services.get("b").await.unwrap()), [b.clone()]);

        // The first pool is removed: new Services get addresses from what is left, live ones
        // keep theirs, also when the provider is asked again.
        publish_secret_file(&dir, 3, &pools_config(&[EXTRA]));
        eventually("the pool edit is applied", || async {
            (provider.allocator().pools().iter().map(|p| p.name.as_str()).collect::<Vec<_>>() == ["extra"]).then_some(())
        })
        .await;
        services.create(&PostParams::default(), &lb_service("default", "d")).await.unwrap();
        assert_eq!(wait_for_ip(&services, "d").await, "192.168.60.1");
        let lb = provider.load_balancer().unwrap();
        for (name, ip) in [("a", &a), ("b", &b)] {
            let live = services.get(name).await.unwrap();
            let status = lb.ensure_load_balancer("kubernetes", &live, &[]).await.unwrap();
            assert_eq!(status.ingress.unwrap()[0].ip.as_deref(), Some(ip.as_str()), "{name} keeps its address");
            assert_eq!(ingress_ips(&live), [ip.clone()]);
        }
        let health = provider.health().await;
        assert!(health.message().contains("2 assigned addresses outside the pools"), "{health:?}");

        // Released when the Service goes; never handed to anyone else.
        services.delete("a", &DeleteParams::default()).await.unwrap();
        eventually("a's address released", || async {
            (provider.allocator().outside_pools().len() == 1).then_some(())
        })
        .await;
        services.create(&PostParams::default(), &lb_service("default", "e")).await.unwrap();
        assert_eq!(wait_for_ip(&services, "e").await, "192.168.60.2");

        stop_watch.cancel();
        watch.await.unwrap();
        running.stop().await.unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// The `LoadBalancerProvisioned` condition of a Service, as (status, reason, message).
fn provisioned(service: &Service) -> Option<(String, String, String)> {
    let conditions = service.status.as_ref()?.conditions.as_ref()?;
    let c = conditions.iter().find(|c| c.type_ == "LoadBalancerProvisioned")?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}

const PORT_RULE_POOLS: &str = "\
loadBalancer:
  retryAfter: 1s
  pools:
    - {name: tenants, cidrs: [198.51.100.200/29], allowedPorts: [\"8080\"]}
    - {name: lan, cidrs: [203.0.113.200/29]}
";

testkit::backend_tests! {
    /// Issue 45 item 4: in `ipMode: VIP` kube-proxy forwards whatever a Service's status
    /// reports, so a port the pool refuses must take the address out of the status, not leave
    /// the last good one there: an edit to a refused port clears the ingress (with the
    /// condition naming the port), an edit back brings an address again, and a Node whose
    /// address makes a pool one holding node addresses is re-checked by the host update.
    async fn a_refused_port_in_vip_mode_takes_the_address_out_of_the_status_and_a_node_change_rechecks_it(backend) {
        let cluster = TestCluster::start(backend).await.unwrap();
        let ns = cluster.fresh_namespace("bm-vip-ports").await.unwrap();
        let services: Api<Service> = Api::namespaced(cluster.client(), &ns);
        let running =
            start(&cluster, provider(PORT_RULE_POOLS), service_options(2), Box::new(ServiceController::new())).await;
        let mut web = lb_service("default", "web");
        web.metadata.namespace = Some(ns.clone());
        web.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].port = 8080;
        services.create(&PostParams::default(), &web).await.unwrap();
        let ip = wait_for_ip(&services, "web").await;
        assert_eq!(ip, "198.51.100.200");

        // An edit to a port the pool refuses (6443, the API server's) clears the ingress.
        let to_port = |port: i32| json!({"spec": {"ports": [{"port": port, "protocol": "TCP"}]}});
        services.patch("web", &PatchParams::default(), &Patch::Merge(to_port(6443))).await.unwrap();
        let (status, reason, message) = eventually("web loses its address and says why", || async {
            let svc = services.get("web").await.ok()?;
            ingress_ips(&svc).is_empty().then(|| provisioned(&svc)).flatten()
        })
        .await;
        assert_eq!((status.as_str(), reason.as_str()), ("False", "UnsupportedService"), "{message}");
        assert!(message.contains("spec.ports[0].port: port 6443 is refused by pool tenants"), "{message}");
        services.patch("web", &PatchParams::default(), &Patch::Merge(to_port(8080))).await.unwrap();
        assert_eq!(wait_for_ip(&services, "web").await, ip, "back on an allowed port, the same address");

        // A Node appearing with an address of pool lan makes it a pool of node addresses, where
        // no port is allowed until allowedPorts lists some: the host update takes it out.
        let mut api = lb_service("default", "api");
        api.metadata.namespace = Some(ns.clone());
        api.metadata.annotations = Some(BTreeMap::from([("ccm.rs/address-pool".to_string(), "lan".to_string())]));
        services.create(&PostParams::default(), &api).await.unwrap();
        assert_eq!(wait_for_ip(&services, "api").await, "203.0.113.200");
        let nodes: Api<Node> = Api::all(cluster.client());
        let name = format!("{ns}-node");
        let mut node = initialized_node(&name, None);
        node.status = Some(serde_json::from_value(json!({"addresses": [{"type": "InternalIP", "address": "203.0.113.205"}]})).unwrap());
        create_node(&nodes, &node).await;
        let (_, reason, message) = eventually("api loses its address once the pool holds a node's", || async {
            let svc = services.get("api").await.ok()?;
            ingress_ips(&svc).is_empty().then(|| provisioned(&svc)).flatten()
        })
        .await;
        assert_eq!(reason, "UnsupportedService", "{message}");
        assert!(message.contains("refused by pool lan: the pool holds node addresses"), "{message}");
        assert_eq!(ingress_ips(&services.get("web").await.unwrap()), std::slice::from_ref(&ip), "the other pool's Service keeps its address");
        running.stop().await.unwrap();
        nodes.delete(&name, &DeleteParams::default()).await.unwrap();
    }
}
