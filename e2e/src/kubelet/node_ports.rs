//! [`NodePorts`]: emulated Nodes' listeners, kept to [`node_port_plan`] as Nodes and Services
//! change, each served by [`echo`](super::echo).

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Service};
use kube::Client;
use kube::api::Api;
use kube::runtime::reflector;
use kube::runtime::{WatchStreamExt, watcher};
use tokio_util::sync::CancellationToken;

use super::echo::{serve_node_port, serve_udp_echo};
use super::node_port_plan::{NodePortKey, NodePortRole, node_port_plan};

/// A listener being served and how to stop it.
struct Served {
    role: NodePortRole,
    stop: CancellationToken,
}

/// The listeners served, and those that could not be opened.
#[derive(Default)]
struct NodePortState {
    served: BTreeMap<NodePortKey, Served>,
    /// Listeners that could not be opened (an address not on this host), logged once.
    failed: BTreeSet<NodePortKey>,
}

/// Emulated Nodes' ports: for every Node whose InternalIP is an address of this host (for
/// example on loopback, `127.0.1.<n>`), an echo on each Service's nodePorts that says which Node
/// and Service answered, and 200 on kube-proxy's health port and on `healthCheckNodePort`s.
/// Follows Nodes and Services as they change; everything stops when it is dropped.
pub struct NodePorts {
    state: Arc<Mutex<NodePortState>>,
    stop: CancellationToken,
}

impl std::fmt::Debug for NodePorts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodePorts").finish_non_exhaustive()
    }
}

impl NodePorts {
    /// Start following Nodes and Services (needs a Tokio runtime).
    pub fn start(client: Client) -> NodePorts {
        let state = Arc::new(Mutex::new(NodePortState::default()));
        let stop = CancellationToken::new();
        tokio::spawn(run_node_ports(client, state.clone(), stop.clone()));
        NodePorts { state, stop }
    }

    /// What is served now, sorted.
    pub fn served(&self) -> Vec<(NodePortKey, NodePortRole)> {
        let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.served.iter().map(|(k, s)| (*k, s.role.clone())).collect()
    }
}

impl Drop for NodePorts {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Follow Nodes and Services and keep the listeners to the plan until `stop` fires.
async fn run_node_ports(client: Client, state: Arc<Mutex<NodePortState>>, stop: CancellationToken) {
    let (nodes, node_writer) = reflector::store::<Node>();
    let (services, service_writer) = reflector::store::<Service>();
    let mut node_events = watcher(Api::<Node>::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .reflect(node_writer)
        .boxed();
    let mut service_events = watcher(Api::<Service>::all(client), watcher::Config::default())
        .default_backoff()
        .reflect(service_writer)
        .boxed();
    let (mut nodes_listed, mut services_listed) = (false, false);
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            e = node_events.next() => match e {
                None => break,
                Some(Err(error)) => tracing::debug!(%error, "sandbox node ports: Node watch failed; retrying"),
                Some(Ok(watcher::Event::InitDone)) => nodes_listed = true,
                Some(Ok(_)) => {}
            },
            e = service_events.next() => match e {
                None => break,
                Some(Err(error)) => tracing::debug!(%error, "sandbox node ports: Service watch failed; retrying"),
                Some(Ok(watcher::Event::InitDone)) => services_listed = true,
                Some(Ok(_)) => {}
            },
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
        if nodes_listed && services_listed {
            let plan = node_port_plan(&nodes.state(), &services.state());
            sync_node_ports(&state, plan, &stop).await;
        }
    }
    let mut st = state.lock().unwrap_or_else(|e| e.into_inner());
    for served in st.served.values() {
        served.stop.cancel();
    }
    st.served.clear();
}

/// Stop the listeners the plan no longer has (or gives another role) and open the new ones.
async fn sync_node_ports(
    state: &Arc<Mutex<NodePortState>>,
    plan: BTreeMap<NodePortKey, NodePortRole>,
    stop: &CancellationToken,
) {
    let wanted: Vec<(NodePortKey, NodePortRole)> = {
        let mut st = state.lock().unwrap_or_else(|e| e.into_inner());
        st.served.retain(|key, served| {
            let keep = plan.get(key) == Some(&served.role);
            if !keep {
                served.stop.cancel();
            }
            keep
        });
        st.failed.retain(|key| plan.contains_key(key));
        plan.into_iter().filter(|(key, _)| !st.served.contains_key(key)).collect()
    };
    for (key, role) in wanted {
        let addr = SocketAddr::new(key.ip, key.port);
        let token = stop.child_token();
        let started = if key.udp {
            tokio::net::UdpSocket::bind(addr).await.map(|s| {
                tokio::spawn(serve_udp_echo(s, role.clone(), token.clone()));
            })
        } else {
            tokio::net::TcpListener::bind(addr).await.map(|l| {
                tokio::spawn(serve_node_port(l, role.clone(), token.clone()));
            })
        };
        let mut st = state.lock().unwrap_or_else(|e| e.into_inner());
        match started {
            Ok(()) => {
                tracing::debug!(listener = %key, ?role, "sandbox node port serving");
                st.failed.remove(&key);
                st.served.insert(key, Served { role, stop: token });
            }
            Err(error) => {
                if st.failed.insert(key) {
                    tracing::debug!(listener = %key, %error, "sandbox node port cannot listen (address not on this host?)");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;
    use crate::kubelet::fixtures::{node, service};
    use kube::api::{Patch, PatchParams};
    use testkit::eventually;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// GET `/` on `addr`; the response body.
    async fn http_get(addr: SocketAddr) -> Option<String> {
        let connect = tokio::net::TcpStream::connect(addr);
        let mut stream = tokio::time::timeout(Duration::from_secs(2), connect).await.ok()?.ok()?;
        stream.write_all(b"GET / HTTP/1.1\r\nHost: lb\r\nConnection: close\r\n\r\n").await.ok()?;
        let mut response = String::new();
        tokio::time::timeout(Duration::from_secs(2), stream.read_to_string(&mut response)).await.ok()?.ok()?;
        response.split_once("\r\n\r\n").map(|(_, body)| body.to_string())
    }

    testkit::backend_tests! {
        /// The sandbox's picture end to end: emulated Nodes on loopback answer on the nodePorts,
        /// the baremetal provider in proxy mode serves the Service's address, and a GET on
        /// `<EXTERNAL-IP>:<port>` (TCP) and a datagram (UDP) come back naming Node and Service;
        /// a deleted Node stops answering.
        async fn an_http_get_and_a_datagram_on_the_external_ip_reach_an_emulated_node(backend) {
            use kube::api::{DeleteParams, PostParams};
            use ccm_framework::provider::CloudProvider;
            use ccm_provider_baremetal::BaremetalProvider;

            let cluster = testkit::TestCluster::start(backend).await.unwrap();
            let b: u8 = if cluster.is_genuine() { 160 } else { 60 };
            let ns = cluster.fresh_namespace("node-ports").await.unwrap();
            let nodes: Api<Node> = Api::all(cluster.client());
            for (suffix, host) in [("a", 1), ("b", 2)] {
                let name = format!("np{b}-{suffix}");
                let node = (*node(&name, &format!("127.{b}.0.{host}"))).clone();
                nodes.create(&PostParams::default(), &node).await.unwrap();
                let status = serde_json::json!({ "status": node.status });
                nodes.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();
            }
            let node_ports = NodePorts::start(cluster.client());
            let np = 30000 + u16::from(b) * 10;
            let mut web = (*service("web", &[("TCP", i32::from(np)), ("UDP", i32::from(np) + 1)], None)).clone();
            web.metadata.namespace = Some(ns.clone());
            if let Some(ports) = web.spec.as_mut().and_then(|s| s.ports.as_mut()) {
                ports[0].name = Some("http".into());
                ports[0].port = 8080;
                ports[1].name = Some("dns".into());
                ports[1].port = 5353;
            }
            let services: Api<Service> = Api::namespaced(cluster.client(), &ns);
            services.create(&PostParams::default(), &web).await.unwrap();

            let config = format!(
                "loadBalancer:\n  mode: proxy\n  proxy:\n    healthCheckInterval: 100ms\n    healthCheckTimeout: 100ms\n    drainTimeout: 1s\n  pools:\n    - name: sandbox\n      cidrs: [127.{b}.0.240/29]\n      allowedPorts: [\"1024-65535\"]\n      allowLoopback: true\n"
            );
            let provider = std::sync::Arc::new(BaremetalProvider::from_cloud_config(Some(config.as_bytes())).unwrap());
            let options = ccm_framework::options::ControllerOptions { concurrent_service_syncs: 2, ..Default::default() };
            let running = ccm_framework::engine::testing::run_controller(
                cluster.client(),
                provider as std::sync::Arc<dyn CloudProvider>,
                options,
                Box::new(ccm_framework::controllers::service::ServiceController::new()),
            )
            .await;
            let ip: IpAddr = eventually("an external IP", || async {
                let svc = services.get("web").await.ok()?;
                let ingress = svc.status?.load_balancer?.ingress?;
                ingress.first()?.ip.as_deref()?.parse().ok()
            })
            .await;

            let expected = |node: &str| format!("node={node} service={ns}/web\n");
            let mut answered = BTreeSet::new();
            for _ in 0..6 {
                let body = eventually("GET / answers", || http_get(SocketAddr::new(ip, 8080))).await;
                answered.insert(body);
            }
            assert_eq!(answered, BTreeSet::from([expected(&format!("np{b}-a")), expected(&format!("np{b}-b"))]));

            let client = tokio::net::UdpSocket::bind(SocketAddr::new(ip, 0)).await.unwrap();
            client.send_to(b"hi", SocketAddr::new(ip, 5353)).await.unwrap();
            let mut buf = [0u8; 256];
            let (n, _) = tokio::time::timeout(Duration::from_secs(5), client.recv_from(&mut buf)).await.unwrap().unwrap();
            let reply = String::from_utf8_lossy(&buf[..n]).to_string();
            assert!(reply.starts_with(&format!("node=np{b}-")) && reply.ends_with(&format!("service={ns}/web\nhi")), "{reply}");

            // Deleting a Node takes it out of the load balancer (no GC on the genuine backend,
            // but nothing holds a Node back).
            nodes.delete(&format!("np{b}-b"), &DeleteParams::default()).await.unwrap();
            let only_a = expected(&format!("np{b}-a"));
            eventually("only the remaining Node answers", || async {
                for _ in 0..4 {
                    if http_get(SocketAddr::new(ip, 8080)).await.as_deref() != Some(only_a.as_str()) {
                        return None;
                    }
                }
                Some(())
            })
            .await;
            running.stop().await.unwrap();
            drop(node_ports);
        }
    }
}
