//! What the three-Node scenarios share: the chart installed again with announcers and the BIRD
//! image, an inventory naming every Node, the resource's spec, the web backends, who leads, and
//! how each number is reported (one line on stderr, also kept for the closing table).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use e2e::realcluster::traffic::http_get;
use e2e::realcluster::{Place, images};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use kube::api::Api;
use serde_json::json;

use crate::{CCM_NAME, CCM_NS, Ctx, OPERATOR_NS, SERVICE_PORT, apply, deployment_available, helm, helm_args, is_ready};

/// The three-Node scenarios' application namespace.
pub const NS: &str = "mn-lb";
/// The label that puts manager Pods on a Node (`spec.deployment.nodeSelector`).
pub const MANAGER_LABEL: &str = "ccm-e2e/manager";
/// The proxied pool of the failover scenario: off the segment, so the client reaches it through
/// the router, whose route follows the leader; bound on the manager Nodes' loopback.
pub const PROXIED_ADDRESS: Ipv4Addr = Ipv4Addr::new(198, 19, 8, 1);
/// The L2 pool: free addresses of the segment, configured nowhere.
pub const L2_POOL: (Ipv4Addr, Ipv4Addr) = (Ipv4Addr::new(198, 19, 0, 201), Ipv4Addr::new(198, 19, 0, 206));
/// The BGP pool: off the segment, reached through the router's routes.
pub const BGP_ADDRESS: Ipv4Addr = Ipv4Addr::new(198, 19, 16, 1);
/// This cluster's AS and the router's (eBGP).
pub const NODE_ASN: u32 = 64512;
/// The router's AS.
pub const ROUTER_ASN: u32 = 64513;
/// The managers' extra arguments from the DaemonSet rollout on (kept, so that later spec
/// changes roll nothing but what they change).
pub const ROLLED_ARGS: &[&str] = &["--node-status-update-frequency=1m"];
/// How often the client polls a Service.
pub const POLL: Duration = Duration::from_millis(100);

/// Every number the three-Node scenarios printed, for the closing table.
static MEASURED: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Reports one number: a line on stderr now (CI's log shows it as it happens), kept for the
/// closing table.
pub fn measured(line: String) {
    eprintln!("    measured: {line}");
    if let Ok(mut all) = MEASURED.lock() {
        all.push(line);
    }
}

/// Everything [`measured`] reported so far.
pub fn all_measured() -> Vec<String> {
    MEASURED.lock().map(|m| m.clone()).unwrap_or_default()
}

/// What the inventory says of the Nodes.
#[derive(Debug, Clone, Default)]
pub struct Inventory {
    /// Nodes left out of `instances` (machines removed).
    pub absent: Vec<String>,
    /// Nodes marked `state: shutdown`.
    pub shut_down: Vec<String>,
    /// Whether `loadBalancer.announcement.bgp` peers with the router.
    pub bgp: bool,
    /// Whether the announcers check their Node's kube-proxy (`announcement.health`).
    pub kube_proxy_health: bool,
    /// A label the `l2` pool's `advertisement.nodeSelector` asks for (`"true"`).
    pub l2_node_selector: Option<&'static str>,
    /// More of the router peer's fields (YAML at the peer's indentation), with `bgp`.
    pub bgp_peer_extra: &'static str,
}

/// The cloud-config of the three-Node scenarios: every Node (its real address, so the API
/// server reaches its kubelet), four pools, L2 on the segment's interface, optionally BGP to the
/// router, and Nodes of machines gone from the inventory deleted once NotReady.
pub fn cloud_config(ctx: &Ctx, inventory: &Inventory) -> String {
    let mut out = String::from("instances:\n");
    for (i, name) in ctx.cluster.node_names().iter().enumerate() {
        if inventory.absent.contains(name) {
            continue;
        }
        let ip = ctx.cluster.node(name).map(|n| n.ip.to_string()).unwrap_or_default();
        let zone = ["zone-a", "zone-b", "zone-c"][i % 3];
        out.push_str(&format!(
            "  - name: {name}\n    addresses:\n      - {{type: InternalIP, address: {ip}}}\n      - {{type: Hostname, address: {name}}}\n    instanceType: e2e-small\n    zone: {zone}\n    region: region-1\n"
        ));
        if inventory.shut_down.contains(name) {
            out.push_str("    state: shutdown\n");
        }
    }
    let segment = &ctx.cluster.network.segment_bridge;
    out.push_str(&format!(
        "loadBalancer:\n  mode: proxy\n  proxy:\n    healthCheckInterval: 1s\n    drainTimeout: 5s\n  pools:\n    - name: loopback\n      cidrs: [\"{pool}\"]\n      allowedPorts: [\"{port}\"]\n      allowLoopback: true\n    - name: proxied\n      ranges: [\"{proxied}-{proxied}\"]\n    - name: l2\n      ranges: [\"{l2a}-{l2b}\"]\n{l2_advertisement}    - name: bgp\n      ranges: [\"{bgp}-{bgp}\"]\n  announcement:\n    l2:\n      interfaces: [{segment}]\n",
        pool = crate::POOL,
        port = SERVICE_PORT,
        proxied = PROXIED_ADDRESS,
        l2a = L2_POOL.0,
        l2b = L2_POOL.1,
        bgp = BGP_ADDRESS,
        l2_advertisement = inventory
            .l2_node_selector
            .map(|label| format!("      advertisement:\n        nodeSelector: {{matchLabels: {{{label}: \"true\"}}}}\n"))
            .unwrap_or_default(),
    ));
    if inventory.bgp {
        out.push_str(&format!(
            "    bgp:\n      localAsn: {NODE_ASN}\n      peers:\n        - address: {}\n          asn: {ROUTER_ASN}\n          holdTime: {}s\n",
            ctx.cluster.network.router_address(),
            crate::bgp::HOLD_SECONDS
        ));
        out.push_str(inventory.bgp_peer_extra);
    }
    if inventory.kube_proxy_health {
        // kube-proxy listens on the node address here (healthzBindAddress), not on loopback.
        out.push_str(&format!(
            "    health:\n      interval: 500ms\n      kubeProxyHealthz: \"http://$(NODE_IP):{}/healthz\"\n",
            e2e::realcluster::node::PROXY_HEALTH_PORT
        ));
    }
    out.push_str("lifecycle:\n  deleteAbsentNodes: true\n");
    out
}

/// The resource's spec in `mode` (managers on the Nodes labelled [`MANAGER_LABEL`]), with an
/// announcer when given and extra arguments.
pub fn spec(mode: &str, replicas: i32, announcer: Option<serde_json::Value>, extra_args: &[&str]) -> serde_json::Value {
    let mut spec = json!({"apiVersion": "ccm.rs/v1alpha1", "kind": "CloudControllerManager",
        "metadata": {"name": CCM_NAME, "namespace": CCM_NS},
        "spec": {"provider": "baremetal", "mode": mode,
            "cloudConfig": {"secretRef": {"name": crate::SECRET}},
            "deployment": {"replicas": replicas, "nodeSelector": {MANAGER_LABEL: "true"}}}});
    if let Some(a) = announcer {
        spec["spec"]["announcer"] = a;
    }
    if !extra_args.is_empty() {
        spec["spec"]["extraArgs"] = json!(extra_args);
    }
    spec
}

/// Installs the chart again (the one-Node scenarios ended with `helm uninstall`), now also
/// allowing announcers with the BIRD image the project's image builder made.
pub async fn install_chart(ctx: &Ctx) -> f64 {
    let t = Instant::now();
    let mut args = vec!["install", "ccm-operator", "charts/ccm-operator", "--create-namespace"];
    let mut rest = helm_args(images::TAG, false);
    rest.extend(["--set".to_string(), format!("announcer.birdImage={}", images::BIRD)]);
    args.extend(rest.iter().map(String::as_str));
    helm(ctx, &args);
    crate::wait("the operator Deployment available", Duration::from_secs(120), || {
        deployment_available(&ctx.client, OPERATOR_NS, "ccm-operator")
    })
    .await;
    t.elapsed().as_secs_f64()
}

/// Labels (or, with `false`, unlabels) a Node for the managers.
pub fn label_for_managers(ctx: &Ctx, node: &str, on: bool) {
    let label = if on { format!("{MANAGER_LABEL}=true") } else { format!("{MANAGER_LABEL}-") };
    ctx.cluster.kubectl_raw(&["label", "node", node, &label, "--overwrite"]).expect("labelling a Node");
}

/// The Node whose manager holds the Lease: a host-network manager's identity is its Node's host
/// name and a UUID (`node-2_<uuid>`).
pub fn holder_node(ctx: &Ctx, holder: &str) -> Option<String> {
    let host = holder.rsplit_once('_').map(|(h, _)| h)?.to_lowercase();
    ctx.cluster.node_names().into_iter().find(|n| *n == host)
}

/// The Node the manager leading now runs on.
pub async fn leader_node(ctx: &Ctx) -> Option<String> {
    holder_node(ctx, &crate::lease_holder(ctx).await?)
}

/// The manager Pods by the Node they run on (Ready or not, not being deleted).
pub async fn managers_by_node(ctx: &Ctx) -> Vec<(String, Pod)> {
    crate::manager_pods(ctx)
        .await
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| Some((p.spec.as_ref()?.node_name.clone()?, p)))
        .collect()
}

/// Whether every one of `names` reports Ready.
pub async fn all_ready(ctx: &Ctx, names: &[String]) -> bool {
    for n in names {
        if crate::node_ready(ctx, n).await != Some(true) {
            return false;
        }
    }
    true
}

/// Whether the Node is initialized (providerID set, the uninitialized taint gone).
pub async fn initialized(ctx: &Ctx, name: &str) -> Option<Node> {
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    let n = nodes.get_opt(name).await.ok()??;
    let taints = n.spec.as_ref()?.taints.clone().unwrap_or_default();
    (n.spec.as_ref()?.provider_id.is_some()
        && !taints.iter().any(|t| t.key == "node.cloudprovider.kubernetes.io/uninitialized"))
    .then_some(n)
}

/// The web backends of the three-Node scenarios: two Pods on the host's Node, which is never
/// stopped, so a gap in traffic is the announcement's or the proxy's, never a dead backend's
/// (kube-proxy keeps a stopped Node's Pods as endpoints until that Node is NotReady).
pub async fn web_backends(ctx: &Ctx) {
    apply(&ctx.client, json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})).await;
    web_deployment(ctx, "web", 2, &ctx.cluster.node_name).await;
}

/// A web Deployment of `replicas` Pods on Node `node` (label `app=<name>`), Ready.
pub async fn web_deployment(ctx: &Ctx, name: &str, replicas: i32, node: &str) {
    apply(
        &ctx.client,
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": NS},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                "template": {"metadata": {"labels": {"app": name}},
                    "spec": {"nodeSelector": {"kubernetes.io/hostname": node},
                        "containers": [{"name": "web", "image": images::WEB, "imagePullPolicy": "Never",
                        "command": ["/bin/sh", "-c", "mkdir -p /www && echo \"pod=$POD_NAME\" > /www/index.html && exec httpd -f -p 8080 -h /www"],
                        "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                        "ports": [{"containerPort": 8080}],
                        "readinessProbe": {"httpGet": {"path": "/", "port": 8080}, "periodSeconds": 1}}]}}}}),
    )
    .await;
    crate::wait(&format!("the {name} Deployment available"), Duration::from_secs(120), || {
        deployment_available(&ctx.client, NS, name)
    })
    .await;
}

/// A `type: LoadBalancer` Service of [`NS`] selecting `app`, with annotations and policy.
pub async fn lb_service(ctx: &Ctx, name: &str, app: &str, annotations: serde_json::Value, local: bool) -> Ipv4Addr {
    apply(
        &ctx.client,
        json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": NS, "annotations": annotations},
            "spec": {"type": "LoadBalancer", "selector": {"app": app},
                "externalTrafficPolicy": if local { "Local" } else { "Cluster" },
                "ports": [{"name": "http", "port": SERVICE_PORT, "targetPort": 8080, "protocol": "TCP"}]}}),
    )
    .await;
    let services: Api<Service> = Api::namespaced(ctx.client.clone(), NS);
    crate::wait(&format!("{name}'s address"), Duration::from_secs(60), || async {
        let s = services.get(name).await.ok()?;
        s.status?.load_balancer?.ingress?.first()?.ip.as_deref()?.parse().ok()
    })
    .await
}

/// Waits until a request from `place` (`None`: the host) to `addr` is answered by a Pod of
/// `app`; returns the answer.
pub async fn first_answer(ctx: &Ctx, place: Option<Place<'_>>, addr: SocketAddr, app: &str) -> String {
    let expect = format!("pod={app}-");
    crate::wait(&format!("an answer from {app} through {addr}"), Duration::from_secs(90), || {
        let answer = match place {
            Some(p) => ctx.cluster.run_in(p, move || http_get(addr)).ok().and_then(Result::ok),
            None => http_get(addr).ok(),
        };
        let expect = expect.clone();
        async move { answer.filter(|b| b.contains(&expect)) }
    })
    .await
}

/// `ADDRESS:SERVICE_PORT`.
pub fn service_addr(ip: Ipv4Addr) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(ip), SERVICE_PORT)
}

/// Runs a blocking harness call off the runtime's workers.
pub async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.expect("a blocking task")
}

/// Stops Node `name` as a power cut; returns the seconds it took.
pub async fn power_off(ctx: &std::sync::Arc<Ctx>, name: &str) -> f64 {
    let (c, n) = (ctx.clone(), name.to_string());
    let t = Instant::now();
    blocking(move || c.cluster.stop_node(&n)).await.unwrap_or_else(|e| panic!("stopping {name}: {e}"));
    t.elapsed().as_secs_f64()
}

/// Starts Node `name` again and waits until it is Ready; returns the seconds it took.
pub async fn power_on(ctx: &std::sync::Arc<Ctx>, name: &str) -> f64 {
    let (c, n) = (ctx.clone(), name.to_string());
    let t = Instant::now();
    blocking(move || c.cluster.start_node(&n)).await.unwrap_or_else(|e| panic!("starting {name}: {e}"));
    t.elapsed().as_secs_f64()
}

/// Starts every added Node an earlier scenario's failure left powered off (a running one
/// refuses the start: nothing happens), so one failure does not fail the scenarios after it.
pub async fn power_on_any_stopped(ctx: &std::sync::Arc<Ctx>) {
    for name in ctx.cluster.node_names().into_iter().skip(1) {
        let c = ctx.clone();
        let _ = blocking(move || c.cluster.start_node(&name)).await;
    }
}

/// The client's neighbour entry for `ip` (`ip neigh show`), lower-case.
pub fn client_neighbour(ctx: &Ctx, ip: Ipv4Addr) -> String {
    ctx.cluster.command_in(Place::Client, "ip", &["neigh", "show", &ip.to_string()]).unwrap_or_default().to_lowercase()
}

/// The hardware addresses that answered the client's ARP requests for `ip` (busybox
/// `arping`: three requests on the segment), in the order they came.
pub fn arp_replies(ctx: &Ctx, ip: Ipv4Addr) -> Vec<String> {
    let link = ctx.cluster.network.segment_bridge.clone();
    let out = ctx
        .cluster
        .command_in(Place::Client, "busybox", &["arping", "-c", "3", "-w", "4", "-I", &link, &ip.to_string()])
        .unwrap_or_else(|e| e.to_string());
    out.lines()
        .filter(|l| l.contains("reply from"))
        .filter_map(|l| Some(l.split_once('[')?.1.split_once(']')?.0.to_lowercase()))
        .collect()
}

/// Which Node a hardware address on the segment belongs to.
pub fn node_of_mac(ctx: &Ctx, mac: &str) -> Option<String> {
    ctx.cluster.node_names().into_iter().find(|n| ctx.cluster.segment_mac(n).is_ok_and(|m| m == mac))
}

/// The announcer DaemonSet's generation now (0 when there is none).
pub async fn announcer_generation(ctx: &Ctx) -> i64 {
    let daemon_sets: Api<DaemonSet> = Api::namespaced(ctx.client.clone(), CCM_NS);
    let ds = daemon_sets.get_opt(&format!("ccm-{CCM_NAME}-announcer")).await.ok().flatten();
    ds.and_then(|d| d.metadata.generation).unwrap_or(0)
}

/// Waits until the announcer DaemonSet runs an updated, available Pod on each of `count` Nodes.
pub async fn announcers_rolled(ctx: &Ctx, count: i32, after_generation: i64) {
    let daemon_sets: Api<DaemonSet> = Api::namespaced(ctx.client.clone(), CCM_NS);
    let name = format!("ccm-{CCM_NAME}-announcer");
    crate::wait(&format!("the announcer on {count} Nodes"), Duration::from_secs(240), || async {
        let ds = daemon_sets.get_opt(&name).await.ok()??;
        let generation = ds.metadata.generation?;
        let status = ds.status?;
        (generation > after_generation
            && status.observed_generation == Some(generation)
            && status.desired_number_scheduled == count
            && status.updated_number_scheduled == Some(count)
            && status.number_available == Some(count))
        .then_some(())
    })
    .await;
}

/// Waits until a manager Pod runs Ready on each of `nodes` and one leads.
pub async fn managers_ready_on(ctx: &Ctx, nodes: &[String]) {
    crate::wait(&format!("a Ready manager on each of {nodes:?} and a leader"), Duration::from_secs(180), || async {
        let pods = managers_by_node(ctx).await;
        let all = nodes.iter().all(|n| pods.iter().any(|(on, p)| on == n && is_ready(p)));
        (all && leader_node(ctx).await.is_some()).then_some(())
    })
    .await;
}
