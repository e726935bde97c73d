//! The baremetal provider in `loadBalancer.mode: proxy` against an API server (both backends): the
//! service controller assigns loopback addresses and the provider's data path carries real
//! traffic to backends that stand in for Nodes' nodePorts. Every test owns a `127.<n>.0.0/16`
//! block (offset by 100 on the genuine backend) so that tests run in parallel with fixed ports;
//! Nodes, namespaces and nodePorts are unique per test because the genuine API server is shared.

#![cfg(feature = "datapath")]

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use crate::kit::healthz;
use ccm_framework::controllers::service::ServiceController;
use ccm_framework::engine::testing::{RunningController, run_controller};
use ccm_framework::options::ControllerOptions;
use ccm_framework::provider::CloudProvider;
use ccm_provider_baremetal::BaremetalProvider;
use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeSpec, NodeStatus, Service, ServicePort, ServiceSpec};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;
use testkit::{TestCluster, eventually, ingress};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

const HEALTH_PORT: u16 = 31256;

fn ip(block: u8, host: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, block, 0, host))
}

/// A proxy-mode cloud-config with a loopback pool and fast health checks on `HEALTH_PORT`. A
/// loopback pool holds node addresses, so it lists the ports its Services may take.
fn config(block: u8, extra: &str) -> String {
    format!(
        "loadBalancer:\n  retryAfter: 1s\n  mode: proxy\n{extra}  proxy:\n    clusterHealthPort: {HEALTH_PORT}\n    healthCheckInterval: 100ms\n    healthCheckTimeout: 100ms\n    drainTimeout: 1s\n  pools:\n    - name: loopback\n      cidrs: [127.{block}.0.240/29]\n      allowLoopback: true\n      allowedPorts: [\"1-65535\"]\n"
    )
}

fn provider(config: &str) -> Arc<BaremetalProvider> {
    Arc::new(BaremetalProvider::from_cloud_config(Some(config.as_bytes())).expect("valid cloud-config"))
}

async fn start(cluster: &TestCluster, provider: Arc<BaremetalProvider>) -> RunningController {
    let options = ControllerOptions { concurrent_service_syncs: 2, ..Default::default() };
    run_controller(cluster.client(), provider as Arc<dyn CloudProvider>, options, Box::new(ServiceController::new()))
        .await
}

/// A Node with an InternalIP, as the node controller leaves it.
fn node(name: &str, address: IpAddr) -> Node {
    Node {
        metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
        spec: Some(NodeSpec { provider_id: Some(format!("baremetal://{name}")), ..Default::default() }),
        status: Some(NodeStatus {
            addresses: Some(vec![NodeAddress { type_: "InternalIP".into(), address: address.to_string() }]),
            ..Default::default()
        }),
    }
}

async fn create_node(nodes: &Api<Node>, node: &Node) {
    let created = nodes.create(&PostParams::default(), node).await.expect("create node");
    // The API server may drop status on create: write it as the kubelet would.
    let patch = json!({ "status": node.status });
    nodes
        .patch_status(created.metadata.name.as_deref().unwrap(), &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("node status");
}

fn service(name: &str, ports: &[(i32, u16)]) -> Service {
    Service {
        metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
        spec: Some(ServiceSpec {
            type_: Some("LoadBalancer".into()),
            ports: Some(
                ports
                    .iter()
                    .map(|(port, node_port)| ServicePort {
                        name: Some(format!("p{port}")),
                        port: *port,
                        node_port: Some(i32::from(*node_port)),
                        protocol: Some("TCP".into()),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }),
        ..Default::default()
    }
}

async fn wait_for_ingress(services: &Api<Service>, name: &str) -> (String, Option<String>) {
    eventually(&format!("{name} gets an address"), || async {
        ingress(&services.get(name).await.ok()?).into_iter().next()
    })
    .await
}

async fn greeting(addr: SocketAddr) -> Option<(String, BufReader<TcpStream>)> {
    let stream = tokio::time::timeout(Duration::from_secs(2), TcpStream::connect(addr)).await.ok()?.ok()?;
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    let n = tokio::time::timeout(Duration::from_secs(2), reader.read_line(&mut line)).await.ok()?.ok()?;
    (n > 0).then(|| (line.trim().to_string(), reader))
}

async fn echoes(reader: &mut BufReader<TcpStream>, text: &str) -> bool {
    if reader.get_mut().write_all(format!("{text}\n").as_bytes()).await.is_err() {
        return false;
    }
    let mut line = String::new();
    matches!(tokio::time::timeout(Duration::from_secs(2), reader.read_line(&mut line)).await, Ok(Ok(n)) if n > 0)
        && line.trim() == text
}

/// The test's address block: its own number, plus 100 on the genuine backend (both variants of a
/// test run at the same time).
fn block(cluster: &TestCluster, n: u8) -> u8 {
    if cluster.is_genuine() { n + 100 } else { n }
}

/// The `i`th nodePort of a block's Services (unique in the shared genuine API server).
fn node_port(block: u8, i: u16) -> u16 {
    30000 + u16::from(block) * 10 + i
}

/// Two Nodes (`n<block>-a`, `n<block>-b`) serving `node_ports` and kube-proxy's health port.
async fn two_nodes(cluster: &TestCluster, block: u8, node_ports: &[u16]) {
    let nodes: Api<Node> = Api::all(cluster.client());
    for (suffix, host) in [("a", 1), ("b", 2)] {
        let name = format!("n{block}-{suffix}");
        for port in node_ports {
            crate::kit::greeting_backend(&name, SocketAddr::new(ip(block, host), *port)).await;
        }
        healthz(SocketAddr::new(ip(block, host), HEALTH_PORT)).await;
        create_node(&nodes, &node(&name, ip(block, host))).await;
    }
}

testkit::backend_tests! {
    /// Proxy mode carries traffic and reports `ipMode: Proxy`; a manager restart keeps every
    /// address and traffic resumes on them.
    async fn proxy_mode_carries_traffic_reports_ip_mode_proxy_and_a_restart_keeps_address_and_traffic(backend) {
        let cluster = TestCluster::start(backend).await.unwrap();
        let b = block(&cluster, 40);
        let ns = cluster.fresh_namespace("bm-proxy").await.unwrap();
        let services: Api<Service> = Api::namespaced(cluster.client(), &ns);
        let (web_np, api_np, late_np) = (node_port(b, 0), node_port(b, 1), node_port(b, 2));
        two_nodes(&cluster, b, &[web_np, api_np]).await;
        let first = start(&cluster, provider(&config(b, ""))).await;

        services.create(&PostParams::default(), &service("web", &[(80, web_np)])).await.unwrap();
        services.create(&PostParams::default(), &service("api", &[(8080, api_np)])).await.unwrap();
        let (web_ip, mode) = wait_for_ingress(&services, "web").await;
        assert_eq!(mode.as_deref(), Some("Proxy"));
        let (api_ip, _) = wait_for_ingress(&services, "api").await;
        // Pool usage is exported as gauges (the /29 holds 8 addresses).
        let text = first.context.metrics.encode();
        let labels = r#"{pool="loopback",family="IPv4"}"#;
        assert!(text.contains(&format!("ccm_baremetal_pool_addresses_assigned{labels} 2")), "{text}");
        assert!(text.contains(&format!("ccm_baremetal_pool_addresses_available{labels} 6")), "{text}");
        let web: SocketAddr = SocketAddr::new(web_ip.parse().unwrap(), 80);
        let api: SocketAddr = SocketAddr::new(api_ip.parse().unwrap(), 8080);
        let mut answered = std::collections::BTreeSet::new();
        for _ in 0..4 {
            let (name, _) = eventually("web answers", || greeting(web)).await;
            answered.insert(name);
        }
        assert_eq!(answered.len(), 2, "both Nodes serve: {answered:?}");
        assert!(greeting(api).await.is_some(), "api answers");

        // The manager stops (restart, or leadership lost): its listeners close with it.
        first.stop().await.unwrap();
        eventually("listeners closed with the manager", || async { TcpStream::connect(web).await.is_err().then_some(()) })
            .await;

        // A new process with the same config: same addresses, traffic resumes.
        let second = start(&cluster, provider(&config(b, ""))).await;
        assert_eq!(wait_for_ingress(&services, "web").await.0, web_ip);
        assert_eq!(wait_for_ingress(&services, "api").await.0, api_ip);
        eventually("web answers again", || greeting(web)).await;
        eventually("api answers again", || greeting(api)).await;
        // A new Service gets a new address, not one of the kept ones.
        services.create(&PostParams::default(), &service("late", &[(80, late_np)])).await.unwrap();
        let (late_ip, _) = wait_for_ingress(&services, "late").await;
        assert!(late_ip != web_ip && late_ip != api_ip, "{late_ip} is new");
        second.stop().await.unwrap();
    }

    /// Adding a port to a live Service opens it without dropping connections on the others,
    /// and the address stays.
    async fn a_port_added_to_a_live_service_serves_without_dropping_existing_connections(backend) {
        let cluster = TestCluster::start(backend).await.unwrap();
        let b = block(&cluster, 41);
        let ns = cluster.fresh_namespace("bm-proxy").await.unwrap();
        let services: Api<Service> = Api::namespaced(cluster.client(), &ns);
        let (np80, np443) = (node_port(b, 0), node_port(b, 1));
        two_nodes(&cluster, b, &[np80, np443]).await;
        let running = start(&cluster, provider(&config(b, ""))).await;
        services.create(&PostParams::default(), &service("web", &[(80, np80)])).await.unwrap();
        let (lb_ip, _) = wait_for_ingress(&services, "web").await;
        let lb: IpAddr = lb_ip.parse().unwrap();
        let (_, mut open) = eventually("web answers", || greeting(SocketAddr::new(lb, 80))).await;

        let ports = service("web", &[(80, np80), (443, np443)]).spec.unwrap().ports;
        let patch = json!({ "spec": { "ports": ports } });
        services.patch("web", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
        eventually("443 answers", || greeting(SocketAddr::new(lb, 443))).await;
        assert!(echoes(&mut open, "still connected").await, "the connection on 80 survived the port change");
        assert_eq!(wait_for_ingress(&services, "web").await.0, lb_ip, "the address did not change");
        running.stop().await.unwrap();
    }

    /// `kubeVip: true` writes `kube-vip.io/loadbalancerIPs` with the assigned address, and
    /// removes it when the Service stops being a load balancer.
    async fn the_kube_vip_switch_writes_the_annotation_kube_vip_reads(backend) {
        let cluster = TestCluster::start(backend).await.unwrap();
        let b = block(&cluster, 42);
        let ns = cluster.fresh_namespace("bm-proxy").await.unwrap();
        let services: Api<Service> = Api::namespaced(cluster.client(), &ns);
        // Address mode (the default) paired with kube-vip as the announcer.
        let config = format!(
            "loadBalancer:\n  retryAfter: 1s\n  kubeVip: true\n  pools:\n    - name: lan\n      cidrs: [192.168.{b}.0/29]\n"
        );
        let running = start(&cluster, provider(&config)).await;
        services.create(&PostParams::default(), &service("web", &[(80, node_port(b, 0))])).await.unwrap();
        let (lb_ip, mode) = wait_for_ingress(&services, "web").await;
        assert_eq!(mode.as_deref(), Some("VIP"));
        let annotations: BTreeMap<String, String> = eventually("annotation written", || async {
            let svc = services.get("web").await.ok()?;
            svc.metadata.annotations.filter(|a| a.contains_key("kube-vip.io/loadbalancerIPs"))
        })
        .await;
        assert_eq!(annotations["kube-vip.io/loadbalancerIPs"], lb_ip);

        // Turning the Service into a ClusterIP Service removes the address and the annotation.
        let patch = json!({ "spec": { "type": "ClusterIP", "ports": [{"name": "p80", "port": 80, "protocol": "TCP"}] } });
        services.patch("web", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
        eventually("annotation removed", || async {
            let svc = services.get("web").await.ok()?;
            (!svc.metadata.annotations.unwrap_or_default().contains_key("kube-vip.io/loadbalancerIPs")).then_some(())
        })
        .await;
        running.stop().await.unwrap();
    }

    /// A Node change no host set sees (its InternalIP moved) still reaches the provider: the
    /// Service's next sync hands the data path the Node as it is now, so traffic follows the
    /// address (the service controller computes the Nodes once per Node change, not per sync).
    async fn a_moved_node_address_reaches_the_data_path_at_the_next_sync(backend) {
        let cluster = TestCluster::start(backend).await.unwrap();
        let b = block(&cluster, 43);
        let ns = cluster.fresh_namespace("bm-proxy").await.unwrap();
        let services: Api<Service> = Api::namespaced(cluster.client(), &ns);
        let np = node_port(b, 0);
        two_nodes(&cluster, b, &[np]).await;
        // Where node a's address moves to, greeting with another name.
        let moved = format!("n{b}-a-moved");
        crate::kit::greeting_backend(&moved, SocketAddr::new(ip(b, 3), np)).await;
        healthz(SocketAddr::new(ip(b, 3), HEALTH_PORT)).await;
        let running = start(&cluster, provider(&config(b, ""))).await;
        services.create(&PostParams::default(), &service("web", &[(80, np)])).await.unwrap();
        let lb = SocketAddr::new(wait_for_ingress(&services, "web").await.0.parse().unwrap(), 80);
        eventually("web answers", || greeting(lb)).await;

        let nodes: Api<Node> = Api::all(cluster.client());
        let address = json!({ "status": { "addresses": [{ "type": "InternalIP", "address": ip(b, 3).to_string() }] } });
        nodes.patch_status(&format!("n{b}-a"), &PatchParams::default(), &Patch::Merge(&address)).await.unwrap();
        // Any change that syncs the Service: here an annotation, new on every try, because a sync
        // that ran before the manager's Node cache held the new address hands over the old one,
        // and an address change alone syncs no Service.
        let touches = std::sync::atomic::AtomicU32::new(0);
        eventually("the moved address serves", || {
            let (moved, services) = (moved.clone(), services.clone());
            let n = touches.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            async move {
                let touch = json!({ "metadata": { "annotations": { "example.com/touched": n.to_string() } } });
                services.patch("web", &PatchParams::default(), &Patch::Merge(&touch)).await.ok()?;
                greeting(lb).await.filter(|(name, _)| *name == moved).map(|_| ())
            }
        })
        .await;
        running.stop().await.unwrap();
    }

    /// When every backend fails its health check the Service gets one Warning event (not one per
    /// check), and a Normal one when a backend passes again.
    async fn every_backend_unhealthy_is_a_warning_on_the_service_once_per_transition(backend) {
        use k8s_openapi::api::events::v1::Event;
        let cluster = TestCluster::start(backend).await.unwrap();
        let b = block(&cluster, 44);
        let ns = cluster.fresh_namespace("bm-proxy").await.unwrap();
        let services: Api<Service> = Api::namespaced(cluster.client(), &ns);
        let np = node_port(b, 0);
        // Two Nodes whose kube-proxy health port answers nothing.
        let nodes: Api<Node> = Api::all(cluster.client());
        for (suffix, host) in [("a", 1), ("b", 2)] {
            let name = format!("n{b}-{suffix}");
            crate::kit::greeting_backend(&name, SocketAddr::new(ip(b, host), np)).await;
            create_node(&nodes, &node(&name, ip(b, host))).await;
        }
        let running = start(&cluster, provider(&config(b, ""))).await;
        services.create(&PostParams::default(), &service("web", &[(80, np)])).await.unwrap();
        wait_for_ingress(&services, "web").await;
        let events: Api<Event> = Api::namespaced(cluster.client(), &ns);
        let with_reason = |reason: &'static str| {
            let events = events.clone();
            async move {
                let list = events.list(&Default::default()).await.ok()?;
                let found: Vec<Event> = list
                    .items
                    .into_iter()
                    .filter(|e| e.reason.as_deref() == Some(reason))
                    .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("web"))
                    .collect();
                (!found.is_empty()).then_some(found)
            }
        };
        let warned = eventually("an AllBackendsUnhealthy event", || with_reason("AllBackendsUnhealthy")).await;
        assert_eq!(warned[0].type_.as_deref(), Some("Warning"));
        assert!(warned[0].note.as_deref().unwrap_or_default().contains(&format!("n{b}-a")), "{:?}", warned[0].note);
        // Many more checks fail (every 100 ms); the transition was said once.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let warned = with_reason("AllBackendsUnhealthy").await.unwrap_or_default();
        assert_eq!(warned.len(), 1);
        assert_eq!(warned[0].series.as_ref().map(|s| s.count), None, "repeated: {:?}", warned[0].series);
        // Node b's kube-proxy answers again.
        healthz(SocketAddr::new(ip(b, 2), HEALTH_PORT)).await;
        let healed = eventually("a BackendsHealthy event", || with_reason("BackendsHealthy")).await;
        assert_eq!(healed[0].type_.as_deref(), Some("Normal"));
        running.stop().await.unwrap();
    }

    /// A pool's port rule (issue 25 item 4, host-port squatting): a Service asking for a port
    /// below the pool's `minPort` gets no listener and a Warning naming `spec.ports[i].port` and
    /// the pool; a Service on an allowed port of the same pool is served.
    async fn a_port_the_pool_refuses_gets_no_listener_and_an_event_naming_the_field_and_pool(backend) {
        use k8s_openapi::api::events::v1::Event;
        let cluster = TestCluster::start(backend).await.unwrap();
        let b = block(&cluster, 46);
        let ns = cluster.fresh_namespace("bm-proxy").await.unwrap();
        let services: Api<Service> = Api::namespaced(cluster.client(), &ns);
        let (low_np, high_np, low_high_np) = (node_port(b, 0), node_port(b, 1), node_port(b, 2));
        two_nodes(&cluster, b, &[low_np, high_np, low_high_np]).await;
        let provider = provider(&format!("{}      minPort: 1024\n", config(b, "")));
        let running = start(&cluster, provider.clone()).await;
        services.create(&PostParams::default(), &service("low", &[(8080, low_high_np), (80, low_np)])).await.unwrap();
        services.create(&PostParams::default(), &service("high", &[(8080, high_np)])).await.unwrap();
        let (high_ip, _) = wait_for_ingress(&services, "high").await;
        eventually("high answers", || greeting(SocketAddr::new(high_ip.parse().unwrap(), 8080))).await;

        let events: Api<Event> = Api::namespaced(cluster.client(), &ns);
        let warning = eventually("a SyncLoadBalancerFailed event on low", || async {
            let list = events.list(&Default::default()).await.ok()?;
            list.items.into_iter().find(|e| {
                e.reason.as_deref() == Some("SyncLoadBalancerFailed")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("low")
            })
        })
        .await;
        let note = warning.note.unwrap_or_default();
        assert!(note.contains("spec.ports[1].port: port 80 is refused by pool loopback"), "{note}");
        assert!(note.contains("minPort is 1024"), "{note}");
        assert!(!note.contains("spec.ports[0]"), "the allowed port is not named: {note}");
        let data_path = provider.data_path().expect("the data path runs");
        assert!(data_path.listeners(&format!("{ns}/low")).is_empty(), "no listener for the refused Service");
        assert!(ingress(&services.get("low").await.unwrap()).is_empty(), "no address reported");
        running.stop().await.unwrap();
    }

    /// `ccm.rs/ip-mode` per Service (issue 27 item 4): in proxy mode a Service annotated `VIP`
    /// gets `ipMode: VIP` and no listener (kube-proxy and an announcer carry it), while its
    /// neighbour stays proxied; switching it to `Proxy` opens its listener, back to `VIP` closes
    /// it, and the address stays throughout.
    async fn one_service_may_leave_the_proxy_for_vip_and_come_back_keeping_its_address(backend) {
        use ccm_provider_baremetal::proxy::IP_MODE_ANNOTATION;
        let cluster = TestCluster::start(backend).await.unwrap();
        let b = block(&cluster, 47);
        let ns = cluster.fresh_namespace("bm-proxy").await.unwrap();
        let services: Api<Service> = Api::namespaced(cluster.client(), &ns);
        let (vip_np, proxied_np) = (node_port(b, 0), node_port(b, 1));
        two_nodes(&cluster, b, &[vip_np, proxied_np]).await;
        let provider = provider(&config(b, ""));
        let running = start(&cluster, provider.clone()).await;
        let mut vip = service("vip", &[(8080, vip_np)]);
        vip.metadata.annotations = Some([(IP_MODE_ANNOTATION.to_string(), "VIP".to_string())].into());
        services.create(&PostParams::default(), &vip).await.unwrap();
        services.create(&PostParams::default(), &service("proxied", &[(8080, proxied_np)])).await.unwrap();
        let (vip_ip, mode) = wait_for_ingress(&services, "vip").await;
        assert_eq!(mode.as_deref(), Some("VIP"));
        let (proxied_ip, mode) = wait_for_ingress(&services, "proxied").await;
        assert_eq!(mode.as_deref(), Some("Proxy"));
        eventually("the proxied Service answers", || greeting(SocketAddr::new(proxied_ip.parse().unwrap(), 8080))).await;
        let data_path = provider.data_path().expect("the data path runs");
        let vip_key = format!("{ns}/vip");
        assert!(data_path.listeners(&vip_key).is_empty(), "no listener for a VIP Service");

        let set_mode = |mode: &'static str| {
            let services = services.clone();
            async move {
                let patch = json!({"metadata": {"annotations": {IP_MODE_ANNOTATION: mode}}});
                services.patch("vip", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
            }
        };
        let mode_of = |want: &'static str| {
            let services = services.clone();
            async move {
                let s = services.get("vip").await.ok()?;
                let (ip, mode) = ingress(&s).into_iter().next()?;
                (mode.as_deref() == Some(want)).then_some(ip)
            }
        };
        set_mode("Proxy").await;
        assert_eq!(eventually("vip reports Proxy", || mode_of("Proxy")).await, vip_ip, "the address stays");
        eventually("vip answers through the proxy", || greeting(SocketAddr::new(vip_ip.parse().unwrap(), 8080))).await;
        set_mode("VIP").await;
        assert_eq!(eventually("vip reports VIP again", || mode_of("VIP")).await, vip_ip, "the address stays");
        eventually("the proxy let go of vip", || async { data_path.listeners(&vip_key).is_empty().then_some(()) }).await;
        assert!(greeting(SocketAddr::new(proxied_ip.parse().unwrap(), 8080)).await.is_some(), "the neighbour is untouched");
        running.stop().await.unwrap();
    }
}
