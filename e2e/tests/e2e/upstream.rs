//! Beside the upstream Go cloud-controller-manager (`../shared/upstream`, or `CCM_UPSTREAM`),
//! on the genuine kube-apiserver: ours with the fake provider's `bench` profile against
//! upstream's `bench` provider.
//!
//! - equivalence: each initializes its own Nodes and Services; they come out the same, field by
//!   field (names aside), and ours leaves what upstream made as it is;
//! - hand-over with leader migration (upstream stopped by SIGTERM, and in a separate run by
//!   SIGKILL), then the roll-back to upstream: measured from the audit log and the migration
//!   Lease;
//! - shadow mode: upstream leads with 200 Nodes and 200 LoadBalancer Services, ours in shadow
//!   mode reports no difference, and exactly the expected ones with a deliberately different
//!   configuration; it writes nothing and makes no mutating cloud call.
//!
//! Managers are told apart in the audit log by user: each runs as its own cluster-admin
//! ServiceAccount.
//!
//! Every scenario needs both the binary and `CCM_TEST_ASSETS`; without them it prints one
//! `SKIPPED:` line and passes. The numbers are printed past the output capture.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use e2e::upstream::{self, Process, Upstream};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Service, ServiceAccount, Taint};
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use testkit::{
    Backend, HOSTNAME_LABEL, Meta, NodeFixture, RequestRecord, TestCluster, UNINITIALIZED, eventually_within,
    kubelet_node, lb_service, poll_within,
};

use crate::kit::HARNESS_AGENT;

/// How long a scenario waits for managers to converge.
const CONVERGE: Duration = Duration::from_secs(60);
/// The fake's cloud-config for the `bench` profile (bench's default latencies).
const BENCH_PROFILE: &str = "profile: bench\n";

static NEXT: AtomicUsize = AtomicUsize::new(0);

/// Prints past libtest's output capture (which takes `eprintln!`), so that CI shows the numbers
/// (and the skip line) for a passing run too.
macro_rules! report {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// Whether the scenario must skip (and the line is printed).
fn skipped() -> bool {
    match upstream::skip_reason() {
        Some(reason) => {
            report!("{}", upstream::skip_line(&reason));
            true
        }
        None => false,
    }
}

/// A working directory for logs and configuration files, kept for a failing run.
fn work_dir(name: &str) -> PathBuf {
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("ccm-upstream-e2e-{}-{name}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a work directory");
    dir
}

/// A client with the harness's user agent, so its writes are told apart in the audit log.
fn harness(cluster: &TestCluster) -> Client {
    let mut config = cluster.kube_config();
    config.headers.push(("user-agent".parse().expect("a header name"), HARNESS_AGENT.parse().expect("a value")));
    Client::try_from(config).expect("a client")
}

/// A cluster-admin ServiceAccount of its own for one manager, so the audit log tells the two
/// managers apart by user: its kubeconfig and its user name.
async fn identity(cluster: &TestCluster, client: &Client, namespace: &str, name: &str) -> (PathBuf, String) {
    let account: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": name, "namespace": namespace}})).expect("a ServiceAccount");
    Api::<ServiceAccount>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &account)
        .await
        .expect("creating the ServiceAccount");
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": format!("e2e-upstream-{namespace}-{name}")},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
    }))
    .expect("a ClusterRoleBinding");
    Api::<ClusterRoleBinding>::all(client.clone())
        .create(&PostParams::default(), &binding)
        .await
        .expect("binding the ServiceAccount");
    let (_, kubeconfig) = cluster.service_account(namespace, name).await.expect("a ServiceAccount kubeconfig");
    (kubeconfig, format!("system:serviceaccount:{namespace}:{name}"))
}

/// Our manager running against the cluster, its HTTPS endpoints on a loopback port.
struct Ours {
    process: Process,
    addr: SocketAddr,
}

impl Ours {
    fn start(dir: &Path, label: &str, kubeconfig: &Path, cloud_config: &str, args: &[String]) -> Ours {
        let binary = e2e::kubelet::manager_binary().expect("the cloud-controller-manager binary");
        let config = dir.join(format!("{label}-cloud.yaml"));
        std::fs::write(&config, cloud_config).expect("writing the cloud-config");
        let port = upstream::free_port().expect("a free port");
        let mut all = vec![
            "--cloud-provider=fake".to_string(),
            format!("--cloud-config={}", config.display()),
            format!("--kubeconfig={}", kubeconfig.display()),
            "--bind-address=127.0.0.1".to_string(),
            format!("--secure-port={port}"),
            "--authorization-always-allow-paths=/healthz,/metrics".to_string(),
        ];
        all.extend_from_slice(args);
        let process =
            Process::spawn(label, &binary, &all, &[], &dir.join(format!("{label}.log"))).expect("ours starts");
        Ours { process, addr: SocketAddr::from(([127, 0, 0, 1], port)) }
    }

    async fn metrics(&self) -> String {
        e2e::probe::get(self.addr, "/metrics", Duration::from_secs(5)).await.map(|r| r.body).unwrap_or_default()
    }

    async fn wait_healthy(&mut self) {
        let addr = self.addr;
        let ok = poll_within(CONVERGE, || async move {
            e2e::probe::get(addr, "/healthz", Duration::from_secs(2)).await.filter(|r| r.status == 200)
        })
        .await;
        assert!(ok.is_some(), "ours never became healthy:\n{}", self.process.log_tail(30));
    }

    /// `fake_load_balancer_changes_total{change}`.
    async fn changes(&self, change: &str) -> f64 {
        upstream::counter_sum(&self.metrics().await, "fake_load_balancer_changes_total", "change", change)
    }
}

/// A Node as a kubelet registers it: tainted uninitialized, with its host name label,
/// `addresses`, and when asked a second taint.
fn node(name: &str, addresses: &[(&str, &str)], extra_taint: bool) -> Node {
    let mut node = kubelet_node(name).with_labels(&[(HOSTNAME_LABEL, name)]);
    for (type_, address) in addresses {
        node = node.with_address(type_, address);
    }
    if extra_taint {
        let dedicated = Taint {
            key: "example.com/dedicated".into(),
            value: Some("db".into()),
            effect: "NoExecute".into(),
            time_added: None,
        };
        node = node.with_taint(dedicated);
    }
    node
}

/// The Node variants of the equivalence run, by suffix.
fn node_variants(prefix: &str) -> Vec<Node> {
    vec![
        node(&format!("{prefix}-bare"), &[], false),
        node(
            &format!("{prefix}-addressed"),
            &[("InternalIP", "192.168.7.10"), ("ExternalIP", "203.0.113.10"), ("Hostname", "host-a")],
            false,
        ),
        node(&format!("{prefix}-tainted"), &[("InternalIP", "192.168.7.11")], true),
    ]
}

async fn create_nodes(client: &Client, nodes: &[Node]) {
    let api: Api<Node> = Api::all(client.clone());
    for n in nodes {
        api.create(&PostParams::default(), n).await.unwrap_or_else(|e| panic!("creating Node {}: {e}", n.name_any()));
    }
}

async fn create_services(client: &Client, namespace: &str, names: &[String]) {
    let api: Api<Service> = Api::namespaced(client.clone(), namespace);
    for name in names {
        api.create(&PostParams::default(), &lb_service(namespace, name))
            .await
            .unwrap_or_else(|e| panic!("creating Service {name}: {e}"));
    }
}

fn initialized(n: &Node) -> bool {
    let pid = n.spec.as_ref().and_then(|s| s.provider_id.as_deref()).unwrap_or_default();
    let tainted = n.spec.as_ref().and_then(|s| s.taints.as_ref()).into_iter().flatten().any(|t| t.key == UNINITIALIZED);
    !pid.is_empty() && !tainted
}

fn ingress_ips(s: &Service) -> Vec<String> {
    let ingress = s.status.as_ref().and_then(|s| s.load_balancer.as_ref()).and_then(|l| l.ingress.as_ref());
    ingress.into_iter().flatten().filter_map(|i| i.ip.clone()).collect()
}

/// Wait until every named Node is initialized; returns them.
async fn wait_nodes(client: &Client, names: &[String], who: &str) -> Vec<Node> {
    wait_nodes_with(client, names, who, false).await
}

/// [`wait_nodes`], and with `internal_ip` until each also has its derived InternalIP (upstream
/// writes the Node, then its status: initialized is not yet done).
async fn wait_nodes_with(client: &Client, names: &[String], who: &str, internal_ip: bool) -> Vec<Node> {
    let api: Api<Node> = Api::all(client.clone());
    let got = poll_within(CONVERGE, || {
        let api = api.clone();
        async move {
            let mut out = Vec::new();
            for name in names {
                let n = api.get_opt(name).await.ok().flatten()?;
                let derived = derived_ip(name);
                let addresses = n.status.as_ref().and_then(|s| s.addresses.as_ref());
                let has_derived = addresses.into_iter().flatten().any(|a| a.address == derived);
                if !initialized(&n) || (internal_ip && !has_derived) {
                    return None;
                }
                out.push(n);
            }
            Some(out)
        }
    })
    .await;
    got.unwrap_or_else(|| panic!("{who} did not initialize every Node of {names:?}"))
}

/// Wait until every named Service of `namespace` has an ingress address; returns them.
async fn wait_services(client: &Client, namespace: &str, names: &[String], who: &str) -> Vec<Service> {
    let api: Api<Service> = Api::namespaced(client.clone(), namespace);
    let got = poll_within(CONVERGE, || {
        let api = api.clone();
        async move {
            let mut out = Vec::new();
            for name in names {
                let s = api.get_opt(name).await.ok().flatten()?;
                if ingress_ips(&s).is_empty() {
                    return None;
                }
                out.push(s);
            }
            Some(out)
        }
    })
    .await;
    got.unwrap_or_else(|| panic!("{who} did not give every Service of {namespace} an address"))
}

/// The InternalIP bench derives from a Node name (`BENCH_INTERNAL_IP=1`), computed here as
/// upstream's main.go does (32-bit FNV-1a), independently of the fake's copy.
fn derived_ip(name: &str) -> String {
    let h = name.bytes().fold(0x811c_9dc5u32, |h, b| (h ^ b as u32).wrapping_mul(0x0100_0193));
    format!("10.{}.{}.{}", (h >> 8) as u8, (h >> 16) as u8, 1 + (h >> 24) % 254)
}

/// What a cloud-controller-manager decides for a Node, with its own name replaced by `NAME` and
/// the InternalIP derived from it by `DERIVED`.
fn node_view(n: &Node) -> BTreeMap<String, String> {
    let name = n.name_any();
    let derived = derived_ip(&name);
    let norm = |s: &str| if s == derived { "DERIVED".to_string() } else { s.replace(&name, "NAME") };
    let mut view = BTreeMap::new();
    let spec = n.spec.clone().unwrap_or_default();
    view.insert("spec.providerID".into(), norm(spec.provider_id.as_deref().unwrap_or_default()));
    for (k, v) in n.labels() {
        view.insert(format!("metadata.labels[{k}]"), norm(v));
    }
    let taints: Vec<String> = spec
        .taints
        .unwrap_or_default()
        .iter()
        .map(|t| format!("{}={}:{}", t.key, t.value.as_deref().unwrap_or_default(), t.effect))
        .collect();
    view.insert("spec.taints".into(), taints.join(","));
    let addresses = n.status.as_ref().and_then(|s| s.addresses.clone()).unwrap_or_default();
    let addresses: Vec<String> = addresses.iter().map(|a| format!("{}={}", a.type_, norm(&a.address))).collect();
    view.insert("status.addresses".into(), addresses.join(","));
    view
}

/// What a cloud-controller-manager decides for a LoadBalancer Service, the address aside
/// (checked separately: each process allocates its own).
fn service_view(s: &Service) -> BTreeMap<String, String> {
    let mut view = BTreeMap::new();
    view.insert("metadata.finalizers".into(), s.finalizers().join(","));
    let ingress = s.status.as_ref().and_then(|s| s.load_balancer.as_ref()).and_then(|l| l.ingress.clone());
    let shapes: Vec<String> = ingress
        .unwrap_or_default()
        .iter()
        .map(|i| {
            format!(
                "ip:{} hostname:{} ipMode:{} ports:{}",
                i.ip.is_some(),
                i.hostname.as_deref().unwrap_or_default(),
                i.ip_mode.as_deref().unwrap_or_default(),
                i.ports.as_ref().map_or(0, Vec::len)
            )
        })
        .collect();
    view.insert("status.loadBalancer.ingress".into(), shapes.join(";"));
    view
}

/// Field-by-field differences of two views, as `path: upstream != ours` lines.
fn differences(upstream: &BTreeMap<String, String>, ours: &BTreeMap<String, String>) -> Vec<String> {
    let keys: BTreeSet<&String> = upstream.keys().chain(ours.keys()).collect();
    keys.into_iter()
        .filter_map(|k| {
            let (a, b) = (upstream.get(k), ours.get(k));
            (a != b).then(|| format!("{k}: upstream {a:?} != ours {b:?}"))
        })
        .collect()
}

/// Whether `ip` is one bench hands out: `198.18.x.y`, `y` in 1..=250 (e2e does not link the fake).
fn is_bench_ip(ip: &str) -> bool {
    ip.parse::<std::net::Ipv4Addr>().is_ok_and(|v4| {
        let o = v4.octets();
        o[0] == 198 && o[1] == 18 && (1..=250).contains(&o[3])
    })
}

/// Successful writes to Nodes and Services (and their status) by `user`.
fn manager_writes<'a>(records: &'a [RequestRecord], user: &str) -> Vec<&'a RequestRecord> {
    records
        .iter()
        .filter(|r| r.is_write() && r.user.as_deref() == Some(user) && (200..300).contains(&r.status))
        .filter(|r| matches!(r.resource.as_deref(), Some("nodes") | Some("services")))
        .collect()
}

/// `nodes` or `services/status`: the kind of object a write changes.
fn kind(r: &RequestRecord) -> String {
    match &r.subresource {
        Some(sub) => format!("{}/{sub}", r.resource.as_deref().unwrap_or_default()),
        None => r.resource.clone().unwrap_or_default(),
    }
}

fn seconds(ts: &str) -> f64 {
    let t: k8s_openapi::jiff::Timestamp = ts.parse().unwrap_or_else(|e| panic!("timestamp {ts}: {e}"));
    t.as_microsecond() as f64 / 1e6
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ours_with_the_bench_profile_initializes_nodes_and_load_balancers_as_upstream_does() {
    equivalence(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ours_with_bench_internal_ips_changes_node_addresses_as_upstream_does() {
    equivalence(true).await;
}

/// Upstream initializes its Nodes and Services, then ours its own copies; both come out the
/// same. With `internal_ip`, both derive an InternalIP from the Node name (upstream's
/// `BENCH_INTERNAL_IP=1`, the fake's `benchInternalIP: true`), so both change the addresses.
async fn equivalence(internal_ip: bool) {
    if skipped() {
        return;
    }
    let cluster = TestCluster::start(Backend::Genuine).await.expect("the genuine API server");
    let client = harness(&cluster);
    let dir = work_dir(if internal_ip { "equivalence-ip" } else { "equivalence" });
    let (up_env, profile) = match internal_ip {
        true => (
            vec![("BENCH_INTERNAL_IP".to_string(), "1".to_string())],
            format!("{BENCH_PROFILE}benchInternalIP: true\n"),
        ),
        false => (vec![], BENCH_PROFILE.to_string()),
    };
    let log = cluster.request_log();
    let (ns_up, ns_ours) = (
        cluster.fresh_namespace("up").await.expect("a namespace"),
        cluster.fresh_namespace("ours").await.expect("a namespace"),
    );
    let (up_kubeconfig, _) = identity(&cluster, &client, &ns_up, "upstream").await;
    let (ours_kubeconfig, ours_user) = identity(&cluster, &client, &ns_ours, "ours").await;
    let services: Vec<String> = (0..3).map(|i| format!("web-{i}")).collect();
    let controllers = "--controllers=cloud-node-controller,service-lb-controller".to_string();

    // Upstream first, on its own Nodes and Services.
    let up_nodes = node_variants("up");
    create_nodes(&client, &up_nodes).await;
    create_services(&client, &ns_up, &services).await;
    let mut up = Upstream::start(
        &up_kubeconfig,
        &["--leader-elect=false".into(), controllers.clone()],
        &up_env,
        &dir.join("upstream.log"),
    )
    .expect("upstream starts");
    up.wait_healthy(CONVERGE).await.expect("upstream is healthy");
    let up_names: Vec<String> = up_nodes.iter().map(ResourceExt::name_any).collect();
    let up_done = wait_nodes_with(&client, &up_names, "upstream", internal_ip).await;
    let up_svcs = wait_services(&client, &ns_up, &services, "upstream").await;
    let up_calls = upstream::counter_sum(
        &up.metrics().await,
        "cloudprovider_api_requests_total",
        "method",
        "ensure_load_balancer",
    );
    up.process.terminate(Duration::from_secs(10)).await.expect("upstream stops on SIGTERM");

    // Ours next: it first meets what upstream made (and adopts those load balancers), then
    // initializes its own copies.
    let mark = log.mark();
    let mut ours = Ours::start(&dir, "ours", &ours_kubeconfig, &profile, &["--leader-elect=false".into(), controllers]);
    ours.wait_healthy().await;
    eventually_within("ours adopts upstream's load balancers", CONVERGE, || async {
        ours.changes("update").await >= services.len() as f64
    })
    .await;
    let ours_nodes = node_variants("ours");
    create_nodes(&client, &ours_nodes).await;
    create_services(&client, &ns_ours, &services).await;
    let ours_names: Vec<String> = ours_nodes.iter().map(ResourceExt::name_any).collect();
    let ours_done = wait_nodes_with(&client, &ours_names, "ours", internal_ip).await;
    let ours_svcs = wait_services(&client, &ns_ours, &services, "ours").await;

    let mut diffs = Vec::new();
    for (a, b) in up_done.iter().zip(&ours_done) {
        for d in differences(&node_view(a), &node_view(b)) {
            diffs.push(format!("Node {} / {}: {d}", a.name_any(), b.name_any()));
        }
    }
    for (a, b) in up_svcs.iter().zip(&ours_svcs) {
        for d in differences(&service_view(a), &service_view(b)) {
            diffs.push(format!("Service {}: {d}", a.name_any()));
        }
    }
    let up_ips: BTreeSet<String> = up_svcs.iter().flat_map(ingress_ips).collect();
    let ours_ips: BTreeSet<String> = ours_svcs.iter().flat_map(ingress_ips).collect();
    report!(
        "equivalence (internal IPs: {internal_ip}): {} Nodes and {} Services compared field by field, {} differences; upstream's addresses {up_ips:?} \
         ({up_calls} ensure calls), ours {ours_ips:?}",
        up_done.len(),
        up_svcs.len(),
        diffs.len()
    );
    assert!(diffs.is_empty(), "ours and upstream differ:\n{}", diffs.join("\n"));
    assert!(up_ips.iter().chain(&ours_ips).all(|ip| is_bench_ip(ip)), "bench addresses only");
    assert_eq!(up_ips.len() + ours_ips.len(), 2 * services.len(), "one address per Service");
    assert!(up_ips.is_disjoint(&ours_ips), "ours never hands out an address upstream's load balancers hold");

    // Ours left upstream's objects as they were. The one write it may make to each of
    // upstream's Services is its load-balancer conditions (S31), and the addresses stay.
    let records = log.since(mark);
    let upstreams: Vec<&RequestRecord> = manager_writes(&records, &ours_user)
        .into_iter()
        .filter(|r| {
            r.name.as_deref().is_some_and(|n| n.starts_with("up-")) || r.namespace.as_deref() == Some(ns_up.as_str())
        })
        .collect();
    let conditions = |r: &RequestRecord| r.verb == "patch" && kind(r) == "services/status";
    let touched: Vec<String> = upstreams
        .iter()
        .filter(|r| !conditions(r))
        .map(|r| format!("{} {} {:?}/{:?}", r.verb, kind(r), r.namespace, r.name))
        .collect();
    assert!(touched.is_empty(), "ours rewrote what upstream made: {touched:?}");
    for svc in &up_svcs {
        let name = svc.name_any();
        let writes = upstreams.iter().filter(|r| conditions(r) && r.name.as_deref() == Some(name.as_str())).count();
        assert!(writes <= 1, "{name}: {writes} status writes by ours; its conditions are written once");
    }
    let up_after = wait_services(&client, &ns_up, &services, "upstream's, after ours ran").await;
    for (before, after) in up_svcs.iter().zip(&up_after) {
        assert_eq!(ingress_ips(before), ingress_ips(after), "{}: ours changed upstream's address", before.name_any());
    }
    assert_eq!(ours.changes("create").await, services.len() as f64, "ours created only its own load balancers");
    assert_eq!(ours.changes("delete").await, 0.0);
    ours.process.terminate(Duration::from_secs(10)).await.expect("ours stops on SIGTERM");
}

/// How upstream is stopped in a hand-over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    Term,
    Kill,
}

async fn stop(process: &mut Process, how: Stop) {
    match how {
        Stop::Term => {
            process.terminate(Duration::from_secs(20)).await.expect("stops on SIGTERM");
        }
        Stop::Kill => {
            process.kill().await.expect("dies on SIGKILL");
        }
    }
}

/// The migration Lease's holder, renewal and acquisition as observed over time.
#[derive(Debug, Clone, Default)]
struct LeaseSample {
    holder: String,
    renew: Option<f64>,
    acquire: Option<f64>,
    duration: f64,
}

fn sample(lease: &Lease) -> LeaseSample {
    let spec = lease.spec.clone().unwrap_or_default();
    let micro = |t: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime>| {
        t.map(|t| t.0.as_microsecond() as f64 / 1e6)
    };
    LeaseSample {
        holder: spec.holder_identity.unwrap_or_default(),
        renew: micro(spec.renew_time),
        acquire: micro(spec.acquire_time),
        duration: spec.lease_duration_seconds.unwrap_or_default() as f64,
    }
}

/// Polls a Lease every 100 ms until dropped, keeping each distinct sample.
struct LeaseWatch {
    samples: Arc<Mutex<Vec<LeaseSample>>>,
    task: tokio::task::JoinHandle<()>,
}

impl LeaseWatch {
    fn start(client: &Client, namespace: &str, name: &str) -> LeaseWatch {
        let api: Api<Lease> = Api::namespaced(client.clone(), namespace);
        let (name, samples) = (name.to_string(), Arc::new(Mutex::new(Vec::<LeaseSample>::new())));
        let out = samples.clone();
        let task = tokio::spawn(async move {
            loop {
                if let Ok(Some(lease)) = api.get_opt(&name).await {
                    let s = sample(&lease);
                    let mut all = out.lock().unwrap();
                    if all.last().is_none_or(|l| l.holder != s.holder || l.renew != s.renew) {
                        all.push(s);
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        LeaseWatch { samples, task }
    }

    fn holder(&self) -> Option<String> {
        self.samples.lock().unwrap().last().map(|s| s.holder.clone()).filter(|h| !h.is_empty())
    }

    /// Seconds the Lease had no valid holder when `from` stopped and `to` took over: from the
    /// end of `from`'s last term (last renewal + duration) to `to`'s acquisition, or 0 when `to`
    /// acquired earlier (a released Lease).
    fn unowned(&self, from: &str, to: &str) -> Option<f64> {
        let all = self.samples.lock().unwrap();
        let last = all.iter().rev().find(|s| s.holder == from)?;
        let next = all.iter().find(|s| s.holder == to)?;
        Some((next.acquire? - (last.renew? + last.duration)).max(0.0))
    }
}

impl Drop for LeaseWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The managers' writes to `nodes`, `services` and `services/status` around a hand-over from
/// `old` to `new`, from the audit log: per kind, the longest gap between `old`'s last and
/// `new`'s first write, and the writes that interleave (a write by one while the other has
/// written the same kind before and after it).
struct WriteReport {
    gaps: BTreeMap<String, f64>,
    overlapping: usize,
}

fn write_report(records: &[RequestRecord], old: &str, new: &str) -> WriteReport {
    let (mut gaps, mut overlapping) = (BTreeMap::new(), 0);
    let olds = manager_writes(records, old);
    let news = manager_writes(records, new);
    let kinds: BTreeSet<String> = olds.iter().chain(&news).map(|r| kind(r)).collect();
    for k in kinds {
        let o: Vec<f64> = olds.iter().filter(|r| kind(r) == k).map(|r| seconds(&r.time)).collect();
        let n: Vec<f64> = news.iter().filter(|r| kind(r) == k).map(|r| seconds(&r.time)).collect();
        let (Some(o_last), Some(n_first)) = (o.iter().copied().reduce(f64::max), n.iter().copied().reduce(f64::min))
        else {
            continue;
        };
        gaps.insert(k.clone(), (n_first - o_last).max(0.0));
        // Writes of the new owner before the old one's last, and of the old after the new's first.
        overlapping += n.iter().filter(|t| **t < o_last).count() + o.iter().filter(|t| **t > n_first).count();
    }
    WriteReport { gaps, overlapping }
}

/// One line per controller: how long it had no owner (the migration Lease, which carries all
/// four) and the gap between the old and the new manager's writes of the kinds it writes.
fn per_controller(step: &str, lease_unowned: Option<f64>, report: &WriteReport) -> String {
    let mut out = format!("{step}: longest unowned interval per controller (lease duration {LEASE_DURATION} s):");
    for (controller, kinds) in [
        ("cloud-node-controller", &["nodes", "nodes/status"][..]),
        ("cloud-node-lifecycle-controller", &[][..]),
        ("service-lb-controller", &["services", "services/status"][..]),
        ("node-route-controller", &[][..]),
    ] {
        let gaps: Vec<String> =
            kinds.iter().filter_map(|k| report.gaps.get(*k).map(|g| format!("{k} writes {g:.2} s apart"))).collect();
        let lease = lease_unowned.map_or("-".to_string(), |u| format!("{u:.2} s"));
        let note = match controller {
            "node-route-controller" => " (runs in neither: bench has no routes)".to_string(),
            _ if gaps.is_empty() => " (no writes to compare)".to_string(),
            _ => format!("; {}", gaps.join(", ")),
        };
        out.push_str(&format!("\n  {controller}: migration Lease unowned {lease}{note}"));
    }
    out.push_str(&format!("\n  overlapping writes: {}", report.overlapping));
    out
}

/// The Lease timings of both managers: short, so a hand-over takes seconds.
const LEASE_DURATION: u64 = 4;
fn lease_flags(main_lease: &str, migration_config: &Path) -> Vec<String> {
    vec![
        "--leader-elect=true".into(),
        format!("--leader-elect-lease-duration={LEASE_DURATION}s"),
        "--leader-elect-renew-deadline=3s".into(),
        "--leader-elect-retry-period=1s".into(),
        format!("--leader-elect-resource-name={main_lease}"),
        "--leader-elect-resource-namespace=kube-system".into(),
        "--enable-leader-migration".into(),
        format!("--leader-migration-config={}", migration_config.display()),
    ]
}

/// Every controller to component `*`, on upstream's default migration Lease.
const MIGRATION_CONFIG: &str = "apiVersion: controllermanager.config.k8s.io/v1alpha1
kind: LeaderMigrationConfiguration
leaderName: cloud-provider-extraction-migration
resourceLock: leases
controllerLeaders:
  - name: cloud-node-controller
    component: \"*\"
  - name: cloud-node-lifecycle-controller
    component: \"*\"
  - name: service-lb-controller
    component: \"*\"
  - name: node-route-controller
    component: \"*\"
";
const MIGRATION_LEASE: &str = "cloud-provider-extraction-migration";

/// Addresses of Nodes (providerID and addresses) and Services (ingress) by name.
async fn addresses(client: &Client, namespace: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for n in Api::<Node>::all(client.clone()).list(&Default::default()).await.expect("listing Nodes") {
        let v = node_view(&n);
        out.insert(format!("node/{}", n.name_any()), format!("{} {}", v["spec.providerID"], v["status.addresses"]));
    }
    for s in Api::<Service>::namespaced(client.clone(), namespace).list(&Default::default()).await.expect("listing") {
        out.insert(format!("service/{}", s.name_any()), ingress_ips(&s).join(","));
    }
    out
}

/// Creates one tainted Node every 250 ms until stopped; the names created.
struct NodeChurn {
    names: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl NodeChurn {
    fn start(client: &Client, prefix: &str) -> NodeChurn {
        let (api, prefix) = (Api::<Node>::all(client.clone()), prefix.to_string());
        let names = Arc::new(Mutex::new(Vec::new()));
        let out = names.clone();
        let task = tokio::spawn(async move {
            for i in 0.. {
                let name = format!("{prefix}-{i}");
                if api
                    .create(&PostParams::default(), &node(&name, &[("InternalIP", "192.168.9.9")], false))
                    .await
                    .is_ok()
                {
                    out.lock().unwrap().push(name);
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        });
        NodeChurn { names, task }
    }

    fn stop(self) -> Vec<String> {
        self.task.abort();
        self.names.lock().unwrap().clone()
    }
}

/// Upstream leads; ours joins; upstream is stopped `how`; ours takes every controller over.
/// Then the roll-back: upstream starts again, ours is stopped the same way, upstream takes over.
async fn hand_over_and_back(how: Stop) {
    if skipped() {
        return;
    }
    let cluster = TestCluster::start(Backend::Genuine).await.expect("the genuine API server");
    let client = harness(&cluster);
    let dir = work_dir(&format!("handover-{how:?}").to_lowercase());
    let config = dir.join("migration.yaml");
    std::fs::write(&config, MIGRATION_CONFIG).expect("writing the migration configuration");
    let log = cluster.request_log();
    let ns = cluster.fresh_namespace("handover").await.expect("a namespace");
    let (up_kubeconfig, up_user) = identity(&cluster, &client, &ns, "upstream").await;
    let (ours_kubeconfig, ours_user) = identity(&cluster, &client, &ns, "ours").await;
    let lease = LeaseWatch::start(&client, "kube-system", MIGRATION_LEASE);

    // Upstream leads, with Nodes and Services it initialized.
    let mut up = Upstream::start(&up_kubeconfig, &lease_flags("upstream-ccm", &config), &[], &dir.join("upstream.log"))
        .expect("upstream starts");
    up.wait_healthy(CONVERGE).await.expect("upstream is healthy");
    let first: Vec<Node> = (0..10).map(|i| node(&format!("ho-{i}"), &[("InternalIP", "192.168.8.1")], false)).collect();
    create_nodes(&client, &first).await;
    let services: Vec<String> = (0..10).map(|i| format!("svc-{i}")).collect();
    create_services(&client, &ns, &services).await;
    let first_names: Vec<String> = first.iter().map(ResourceExt::name_any).collect();
    wait_nodes(&client, &first_names, "upstream").await;
    wait_services(&client, &ns, &services, "upstream").await;
    let up_id = lease.holder().expect("upstream holds the migration Lease");

    // Ours joins and waits: upstream holds the migration Lease.
    let mut ours = Ours::start(&dir, "ours", &ours_kubeconfig, BENCH_PROFILE, &lease_flags("ccm-ours", &config));
    ours.wait_healthy().await;
    let before = addresses(&client, &ns).await;
    let churn = NodeChurn::start(&client, "churn");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(lease.holder().as_deref(), Some(up_id.as_str()), "upstream still leads while ours waits");

    // Hand-over.
    stop(&mut up.process, how).await;
    // From here on, the first upstream process writes nothing more.
    let handed_over = log.mark();
    let ours_id = poll_within(CONVERGE, || async { lease.holder().filter(|h| *h != up_id) })
        .await
        .unwrap_or_else(|| panic!("ours never took the migration Lease:\n{}", ours.process.log_tail(30)));
    tokio::time::sleep(Duration::from_secs(3)).await;
    let churned = churn.stop();
    wait_nodes(&client, &churned, "the new leader").await;
    // New Services after the hand-over: ours creates exactly these load balancers.
    let later: Vec<String> = (0..3).map(|i| format!("later-{i}")).collect();
    create_services(&client, &ns, &later).await;
    wait_services(&client, &ns, &later, "ours").await;

    // From the start of the turn: upstream's writes before the stop count too.
    let report = write_report(&log.entries(), &up_user, &ours_user);
    let unowned = lease.unowned(&up_id, &ours_id);
    report!("{}", per_controller(&format!("hand-over to ours ({how:?})"), unowned, &report));
    let after = addresses(&client, &ns).await;
    let changed: Vec<String> = before
        .iter()
        .filter(|(k, v)| after.get(*k) != Some(v))
        .map(|(k, v)| format!("{k}: {v} -> {:?}", after.get(k)))
        .collect();
    assert_eq!(report.overlapping, 0, "both wrote the same kind at once");
    let unowned = unowned.expect("the Lease went from upstream to ours");
    assert!(unowned <= LEASE_DURATION as f64, "the migration Lease was unowned for {unowned} s");
    assert!(changed.is_empty(), "addresses changed in the hand-over: {changed:?}");
    assert_eq!(ours.changes("create").await, later.len() as f64, "no load balancer recreated");
    assert_eq!(ours.changes("delete").await, 0.0, "no load balancer deleted");

    // Roll back: upstream starts again and waits; ours is stopped the same way.
    let mut up =
        Upstream::start(&up_kubeconfig, &lease_flags("upstream-ccm", &config), &[], &dir.join("upstream-2.log"))
            .expect("upstream starts again");
    up.wait_healthy(CONVERGE).await.expect("upstream is healthy");
    let before = addresses(&client, &ns).await;
    let churn = NodeChurn::start(&client, "back");
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop(&mut ours.process, how).await;
    let up2_id = poll_within(CONVERGE, || async { lease.holder().filter(|h| *h != ours_id) })
        .await
        .unwrap_or_else(|| panic!("upstream never took the migration Lease back:\n{}", up.process.log_tail(30)));
    // Upstream re-ensures every Service on its first sync; give it time to write what it decides.
    let all: Vec<String> = services.iter().chain(&later).cloned().collect();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let churned = churn.stop();
    wait_nodes(&client, &churned, "upstream again").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    wait_services(&client, &ns, &all, "upstream").await;
    let back = write_report(&log.since(handed_over), &ours_user, &up_user);
    let after = addresses(&client, &ns).await;
    let moved: Vec<String> = before
        .iter()
        .filter(|(k, v)| after.get(*k) != Some(v))
        .map(|(k, v)| format!("{k}: {v} -> {}", after.get(k).map_or("-", String::as_str)))
        .collect();
    let ips: Vec<String> = after.iter().filter(|(k, _)| k.starts_with("service/")).map(|(_, v)| v.clone()).collect();
    let distinct: BTreeSet<&String> = ips.iter().collect();
    report!("{}", per_controller(&format!("roll-back to upstream ({how:?})"), lease.unowned(&ours_id, &up2_id), &back));
    report!(
        "roll-back ({how:?}): {} of {} objects changed address (upstream's bench allocates from its own \
         per-process counter): {moved:?}; {} distinct addresses for {} Services",
        moved.len(),
        before.len(),
        distinct.len(),
        ips.len()
    );
    assert_eq!(back.overlapping, 0, "both wrote the same kind at once in the roll-back");
    assert!(moved.iter().all(|m| m.starts_with("service/")), "Nodes keep their addresses: {moved:?}");
    up.process.terminate(Duration::from_secs(20)).await.expect("upstream stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ours_takes_over_every_controller_when_upstream_is_terminated_and_hands_back() {
    hand_over_and_back(Stop::Term).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ours_takes_over_every_controller_when_upstream_is_killed_and_hands_back() {
    hand_over_and_back(Stop::Kill).await;
}

/// How many Nodes and LoadBalancer Services the shadow scenario has upstream set up.
const SHADOW_OBJECTS: usize = 200;

/// Ours in shadow mode, beside the cluster upstream set up: its passes and differences from
/// `/metrics`, once both the node and the service controller finished a pass.
async fn shadow_differences(ours: &Ours) -> BTreeMap<String, f64> {
    let passed = |text: &str, controller: &str| {
        upstream::counter_sum(text, "ccm_shadow_passes_total", "controller", controller) >= 1.0
    };
    let text = poll_within(CONVERGE, || async {
        let text = ours.metrics().await;
        (passed(&text, "cloud-node-controller") && passed(&text, "service-lb-controller")).then_some(text)
    })
    .await
    .unwrap_or_else(|| panic!("ours never finished a shadow pass:\n{}", ours.process.log_tail(30)));
    let mut out = BTreeMap::new();
    for line in text.lines().filter(|l| l.starts_with("ccm_shadow_differences{")) {
        let Some((labels, value)) = line.rsplit_once(' ') else { continue };
        let value: f64 = value.parse().unwrap_or_default();
        if value != 0.0 {
            out.insert(labels.trim_start_matches("ccm_shadow_differences").to_string(), value);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ours_in_shadow_mode_beside_upstream_agrees_and_shows_exactly_a_deliberate_difference() {
    if skipped() {
        return;
    }
    let cluster = TestCluster::start(Backend::Genuine).await.expect("the genuine API server");
    let client = harness(&cluster);
    let dir = work_dir("shadow");
    let log = cluster.request_log();
    let ns = cluster.fresh_namespace("shadow").await.expect("a namespace");
    let (up_kubeconfig, _) = identity(&cluster, &client, &ns, "upstream").await;
    let (ours_kubeconfig, ours_user) = identity(&cluster, &client, &ns, "ours").await;

    // Upstream leads and sets up 200 Nodes and 200 LoadBalancer Services.
    let controllers = "--controllers=cloud-node-controller,service-lb-controller".to_string();
    let up_args = ["--leader-elect=false".into(), controllers.clone(), "--concurrent-service-syncs=8".into()];
    let mut up = Upstream::start(&up_kubeconfig, &up_args, &[], &dir.join("upstream.log")).expect("upstream starts");
    up.wait_healthy(CONVERGE).await.expect("upstream is healthy");
    let nodes: Vec<Node> =
        (0..SHADOW_OBJECTS).map(|i| node(&format!("sh-{i}"), &[("InternalIP", "192.168.10.1")], false)).collect();
    create_nodes(&client, &nodes).await;
    let services: Vec<String> = (0..SHADOW_OBJECTS).map(|i| format!("sh-{i}")).collect();
    create_services(&client, &ns, &services).await;
    let names: Vec<String> = nodes.iter().map(ResourceExt::name_any).collect();
    wait_nodes(&client, &names, "upstream").await;
    wait_services(&client, &ns, &services, "upstream").await;

    // Ours joins in shadow mode, configured as upstream is: no difference.
    let shadow_args = ["--shadow".into(), "--leader-elect=false".into(), controllers.clone()];
    let mark = log.mark();
    let mut ours = Ours::start(&dir, "ours-shadow", &ours_kubeconfig, BENCH_PROFILE, &shadow_args);
    ours.wait_healthy().await;
    let same = shadow_differences(&ours).await;
    let metrics = ours.metrics().await;
    let mutating: f64 = ["ensure_load_balancer", "update_load_balancer", "ensure_load_balancer_deleted"]
        .iter()
        .map(|m| upstream::counter_sum(&metrics, "cloudprovider_api_requests_total", "method", m))
        .fold(0.0, |a, b| a + b);
    ours.process.terminate(Duration::from_secs(10)).await.expect("ours stops");

    // Then with a deliberately different configuration: an InternalIP derived from each Node's
    // name, which upstream (without BENCH_INTERNAL_IP) does not report: every Node's addresses.
    let mut other = Ours::start(
        &dir,
        "ours-shadow-ip",
        &ours_kubeconfig,
        &format!("{BENCH_PROFILE}benchInternalIP: true\n"),
        &shadow_args,
    );
    other.wait_healthy().await;
    let differ = shadow_differences(&other).await;
    other.process.terminate(Duration::from_secs(10)).await.expect("ours stops");
    let writes: Vec<String> = manager_writes(&log.since(mark), &ours_user)
        .iter()
        .map(|r| format!("{} {} {:?}", r.verb, kind(r), r.name))
        .collect();
    report!(
        "shadow beside upstream: {SHADOW_OBJECTS} Nodes and {SHADOW_OBJECTS} LoadBalancer Services; same configuration: \
         differences {same:?}; with benchInternalIP: {differ:?}; writes to Nodes and Services: {}; mutating cloud calls: {mutating}",
        writes.len()
    );
    assert!(same.is_empty(), "differences with the same configuration: {same:?}");
    let want: BTreeMap<String, f64> =
        [(r#"{controller="cloud-node-controller",kind="would-patch"}"#.to_string(), SHADOW_OBJECTS as f64)].into();
    assert_eq!(differ, want, "exactly one would-patch (status.addresses) per Node");
    assert!(writes.is_empty(), "shadow mode wrote: {writes:?}");
    assert_eq!(mutating, 0.0, "shadow mode made a mutating cloud call");
    up.process.terminate(Duration::from_secs(10)).await.expect("upstream stops");
}
