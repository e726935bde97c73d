//! Takeover from upstream cloud-provider-aws v1.36.1's own binary: upstream makes the load
//! balancers of a set of Services on moto and a genuine kube-apiserver, then is stopped
//! (gracefully, or killed), and ours starts on the same API server and moto. During ours' first
//! full sync (every Service ensured, then quiet) it must make no mutating AWS call and change no
//! hostname. In the graceful run upstream is first restarted once over its own load balancers
//! (what it writes on every start: listeners, attributes, policies and tags, see docs/aws.md,
//! deliberate divergences 20, 23 and 29); after ours' takeover a Service is edited (ours
//! converges it in place) and the controllers are handed back to upstream, which must make no
//! call its own restart did not make, replace nothing and change no hostname.
//!
//! Managers are stopped before the next starts, as docs/aws.md#migrating-from-cloud-provider-aws
//! says. The counts go to stderr, so the CI log shows them. Skipped, with one line on stderr,
//! without upstream's binary, `CCM_TEST_ASSETS` or moto.

use std::io::Write as _;
use std::time::Instant;

use crate::cases::{self, Kind, NodeDef, NodePhase};
use crate::differential::{node_object, our_provider, settle};
use crate::kit::*;
use crate::proxy::Proxy;
use crate::upstream::{self, Upstream};
use crate::world;
use annotations as a;
use ccm_framework::engine::{EngineBuilder, RunningEngine};

/// The differential cases whose Services upstream makes load balancers for: both kinds, the
/// annotations that set attributes, listeners, rules and health checks; none where ours
/// differs on purpose.
pub(crate) const SERVICES: &[&str] = &[
    "nlb-basic",
    "nlb-two-ports",
    "nlb-udp",
    "nlb-local",
    "nlb-ranges-spec",
    "nlb-hc-http",
    "nlb-hc-numbers",
    "nlb-cross-zone",
    "nlb-tg-attributes",
    "nlb-extra-tags",
    "classic-basic",
    "classic-two-ports",
    "classic-ranges",
    "classic-proxy-protocol",
    "classic-draining",
    "classic-idle",
    "classic-cross-zone",
    "classic-hc",
    "classic-local",
    "classic-extra-tags",
];

/// The Service edited after the takeover, and the annotation it gets.
const EDITED: (&str, &str, &str) = ("classic-idle", a::CONNECTION_IDLE_TIMEOUT, "90");

/// How upstream is stopped before ours starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stop {
    /// SIGTERM.
    Graceful,
    /// SIGKILL.
    Killed,
}

/// The mutating calls (every action but `Describe*`) from the `from`-th request on, by action.
pub(crate) fn mutating_since(proxy: &Proxy, from: usize) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for a in &proxy.faults.lock().unwrap().actions[from..] {
        if !a.is_empty() && !a.starts_with("Describe") {
            *out.entry(a.clone()).or_insert(0) += 1;
        }
    }
    out
}

/// The requests so far.
pub(crate) fn requests(proxy: &Proxy) -> usize {
    proxy.faults.lock().unwrap().actions.len()
}

/// Each Service's status hostname.
pub(crate) async fn hostnames(client: &kube::Client, services: &[Service]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for s in services {
        let ns = s.metadata.namespace.as_deref().unwrap_or_default();
        let name = s.metadata.name.as_deref().unwrap_or_default();
        let now = Api::<Service>::namespaced(client.clone(), ns).get(name).await.expect("get Service");
        let hostname = now
            .status
            .and_then(|st| st.load_balancer)
            .and_then(|lb| lb.ingress)
            .and_then(|i| i.into_iter().next())
            .and_then(|i| i.hostname)
            .unwrap_or_default();
        out.insert(format!("{ns}/{name}"), hostname);
    }
    out
}

/// The Services whose hostname differs between `before` and `after`.
pub(crate) fn changed(before: &BTreeMap<String, String>, after: &BTreeMap<String, String>) -> Vec<String> {
    before
        .iter()
        .filter(|(k, v)| after.get(*k) != Some(*v))
        .map(|(k, v)| format!("{k}: {v} -> {:?}", after.get(k)))
        .collect()
}

/// Every event (name, resourceVersion) now: a later `EnsuredLoadBalancer` not among them (a
/// new event, or a repeat counted into one) comes from the manager started since.
pub(crate) async fn events_now(client: &kube::Client) -> BTreeSet<(String, String)> {
    Api::<Event>::all(client.clone())
        .list(&Default::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .map(|e| (e.metadata.name.unwrap_or_default(), e.metadata.resource_version.unwrap_or_default()))
        .collect()
}

/// Waits until every Service has an `EnsuredLoadBalancer` event not in `before`, then until no
/// mutating call came for a while. Returns the Services never ensured.
pub(crate) async fn first_full_sync(
    proxy: &Proxy,
    client: &kube::Client,
    services: &[Service],
    before: &BTreeSet<(String, String)>,
) -> Vec<String> {
    let start = Instant::now();
    let mut pending: Vec<String> = Vec::new();
    while start.elapsed() < Duration::from_secs(120) {
        let events =
            Api::<Event>::all(client.clone()).list(&Default::default()).await.map(|l| l.items).unwrap_or_default();
        pending = services
            .iter()
            .filter(|s| {
                !events.iter().any(|e| {
                    e.reason.as_deref() == Some("EnsuredLoadBalancer")
                        && e.regarding.as_ref().and_then(|r| r.uid.as_ref()) == s.metadata.uid.as_ref()
                        && !before.contains(&(
                            e.metadata.name.clone().unwrap_or_default(),
                            e.metadata.resource_version.clone().unwrap_or_default(),
                        ))
                })
            })
            .map(|s| s.metadata.name.clone().unwrap_or_default())
            .collect();
        if pending.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // The node pass and any late write: quiet for a while.
    settle(proxy, client, &[], Duration::from_secs(2), || async { true }).await;
    pending
}

fn start_upstream(
    binary: &std::path::Path,
    cluster: &TestCluster,
    conf: &std::path::Path,
    dir: &std::path::Path,
    n: usize,
) -> Upstream {
    Upstream::start(
        binary,
        &cluster.kubeconfig_path(),
        conf,
        &dir.join(format!("upstream-{n}.log")),
        &["--leader-elect=false"],
    )
}

/// Starts upstream (its `n`-th start) after the last manager stopped, and waits for its first
/// full sync; its mutating calls meanwhile.
async fn upstream_full_sync(
    binary: &std::path::Path,
    cluster: &TestCluster,
    proxy: &Proxy,
    services: &[Service],
    conf: &std::path::Path,
    dir: &std::path::Path,
    n: usize,
) -> (Upstream, BTreeMap<String, usize>) {
    let client = cluster.client();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = events_now(&client).await;
    let from = requests(proxy);
    let up = start_upstream(binary, cluster, conf, dir, n);
    let pending = first_full_sync(proxy, &client, services, &before).await;
    assert!(pending.is_empty(), "upstream's start {n} never ensured {pending:?}\n{}", up.log_tail(40));
    let calls = mutating_since(proxy, from);
    (up, calls)
}

async fn start_ours(client: &kube::Client, conf: &str) -> RunningEngine {
    let options = ControllerOptions { configure_cloud_routes: false, ..Default::default() };
    let engine = EngineBuilder::new(client.clone(), our_provider(conf), options).build().expect("engine");
    engine.start(CancellationToken::new()).await.expect("engine starts")
}

/// What one run found, for the report.
struct Counts {
    upstream_restart: BTreeMap<String, usize>,
    ours_first_sync: BTreeMap<String, usize>,
    ours_hostnames_changed: Vec<String>,
    edit: BTreeMap<String, usize>,
    upstream_again: BTreeMap<String, usize>,
    upstream_hostnames_changed: Vec<String>,
}

/// The world every run starts from: a genuine API server with three Nodes and the
/// [`SERVICES`], moto seeded, upstream's cloud.conf pointing at a counting proxy.
pub(crate) struct Scene {
    pub(crate) cluster: TestCluster,
    pub(crate) client: kube::Client,
    pub(crate) moto: Moto,
    pub(crate) world: world::Seeded,
    pub(crate) proxy: Proxy,
    pub(crate) conf: String,
    pub(crate) conf_path: std::path::PathBuf,
    pub(crate) dir: std::path::PathBuf,
    pub(crate) services: Vec<Service>,
}

/// Sets up a [`Scene`]; `name` names its moto and its directory.
pub(crate) async fn scene(name: &str) -> Scene {
    let cluster = TestCluster::start(Backend::Genuine).await.expect("a genuine turn");
    let client = cluster.client();
    let moto = Moto::start(name).await.expect("moto (checked before)");
    let direct = world::direct_clients(&moto.url).await;
    let w = world::seed(&moto, &direct).await;
    let proxy = Proxy::start(moto.port).await;
    let conf = world::cloud_conf(&w, &proxy.url, &[]);
    let dir = std::env::temp_dir().join(format!("ccm-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let conf_path = dir.join("cloud.conf");
    std::fs::write(&conf_path, &conf).unwrap();

    let nodes: Api<Node> = Api::all(client.clone());
    for instance in ["n0", "n1", "n2"] {
        let def = NodeDef { instance, provider_id: true, labels: &[], phase: NodePhase::Always };
        nodes.create(&PostParams::default(), &node_object(&def, &w)).await.expect("create Node");
    }
    let mut services = Vec::new();
    for (index, case) in cases::all().iter().enumerate() {
        if !SERVICES.contains(&case.id) || !matches!(case.kind, Kind::Service(_)) {
            continue;
        }
        let svc = case.build(index, |v| w.fill(v)).expect("a Service case");
        let api: Api<Service> = Api::namespaced(client.clone(), svc.metadata.namespace.as_deref().unwrap());
        services.push(api.create(&PostParams::default(), &svc).await.expect("create Service"));
    }
    assert_eq!(services.len(), SERVICES.len(), "every listed case exists");
    Scene { cluster, client, moto, world: w, proxy, conf, conf_path, dir, services }
}

async fn run(binary: &std::path::Path, stop: Stop) -> Counts {
    let s = scene(&format!("takeover-{stop:?}")).await;
    let (cluster, client, proxy, conf, conf_path, dir, services) =
        (&s.cluster, &s.client, &s.proxy, &s.conf, &s.conf_path, &s.dir, &s.services);

    // Upstream makes everything.
    let up = start_upstream(binary, &cluster, &conf_path, &dir, 1);
    let pending = settle(&proxy, &client, &services, Duration::from_secs(5), || async { true }).await;
    assert!(pending.is_empty(), "upstream did not settle: {pending:?}\n{}", up.log_tail(40));
    let made = hostnames(&client, &services).await;
    assert!(made.values().all(|h| !h.is_empty()), "upstream gave every Service a hostname: {made:?}");
    // Upstream restarted over its own load balancers: what it writes on every start anyway.
    let mut upstream_restart = BTreeMap::new();
    let up = match stop {
        Stop::Graceful => {
            up.terminate().await;
            let (up, calls) = upstream_full_sync(binary, &cluster, &proxy, &services, &conf_path, &dir, 2).await;
            upstream_restart = calls;
            up
        }
        Stop::Killed => up,
    };
    match stop {
        Stop::Graceful => up.terminate().await,
        Stop::Killed => up.kill().await,
    }

    // Ours takes over.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = events_now(&client).await;
    let from = requests(&proxy);
    let ours = start_ours(&client, &conf).await;
    let pending = first_full_sync(&proxy, &client, &services, &before).await;
    assert!(pending.is_empty(), "ours never ensured {pending:?}");
    let ours_first_sync = mutating_since(&proxy, from);
    let ours_hostnames_changed = changed(&made, &hostnames(&client, &services).await);

    let mut counts = Counts {
        upstream_restart,
        ours_first_sync,
        ours_hostnames_changed,
        edit: BTreeMap::new(),
        upstream_again: BTreeMap::new(),
        upstream_hostnames_changed: Vec::new(),
    };
    if stop == Stop::Killed {
        let _ = ours.stop().await;
        let _ = std::fs::remove_dir_all(&dir);
        return counts;
    }

    // A Service edited: converged in place.
    let (name, key, value) = EDITED;
    let from = requests(&proxy);
    let mut edited = serde_json::Map::new();
    edited.insert(key.to_string(), json!(value));
    let patch = json!({"metadata": {"annotations": edited}});
    Api::<Service>::namespaced(client.clone(), "default")
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("edit");
    let waited = Instant::now();
    while mutating_since(&proxy, from).is_empty() {
        if waited.elapsed() > Duration::from_secs(60) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    settle(&proxy, &client, &[], Duration::from_secs(2), || async { true }).await;
    counts.edit = mutating_since(&proxy, from);
    let _ = ours.stop().await;

    // Handed back to upstream.
    let (up, calls) = upstream_full_sync(binary, &cluster, &proxy, &services, &conf_path, &dir, 3).await;
    counts.upstream_again = calls;
    counts.upstream_hostnames_changed = changed(&made, &hostnames(&client, &services).await);
    up.terminate().await;
    let _ = std::fs::remove_dir_all(&dir);
    counts
}

/// Calls that make, replace or remove a load balancer, listener, target group, target,
/// security group or rule.
const REPLACING: &[&str] = &[
    "CreateLoadBalancer",
    "DeleteLoadBalancer",
    "CreateListener",
    "DeleteListener",
    "CreateLoadBalancerListeners",
    "DeleteLoadBalancerListeners",
    "CreateTargetGroup",
    "DeleteTargetGroup",
    "RegisterTargets",
    "DeregisterTargets",
    "RegisterInstancesWithLoadBalancer",
    "DeregisterInstancesFromLoadBalancer",
    "CreateSecurityGroup",
    "DeleteSecurityGroup",
    "AuthorizeSecurityGroupIngress",
    "RevokeSecurityGroupIngress",
];

/// The calls of `calls` that [`REPLACING`] names, or that `baseline` (upstream restarted over
/// its own load balancers) never made.
fn beyond<'a>(calls: &'a BTreeMap<String, usize>, baseline: &BTreeMap<String, usize>) -> Vec<&'a String> {
    calls.keys().filter(|a| REPLACING.contains(&a.as_str()) || !baseline.contains_key(*a)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ours_takes_over_upstreams_load_balancers_without_a_mutating_call_and_hands_them_back() {
    let Some(binary) = upstream::binary_async().await else { return };
    if !Backend::genuine_available() {
        return;
    }
    let Some(probe) = Moto::start("takeover").await else { return };
    assert!(probe.corrected, "the takeover needs moto's corrections (python3 with moto)");
    drop(probe);
    testkit::init_tracing();
    let mut err = std::io::stderr();
    let mut failures = Vec::new();
    for stop in [Stop::Graceful, Stop::Killed] {
        let started = Instant::now();
        let c = run(&binary, stop).await;
        let total = |m: &BTreeMap<String, usize>| m.values().sum::<usize>();
        let _ = writeln!(
            err,
            "takeover from upstream cloud-provider-aws v1.36.1 ({stop:?} stop, {} Services): ours' first full sync made {} mutating calls {:?}, {} hostnames changed, {:.0} s",
            SERVICES.len(),
            total(&c.ours_first_sync),
            c.ours_first_sync,
            c.ours_hostnames_changed.len(),
            started.elapsed().as_secs_f64()
        );
        if !c.ours_first_sync.is_empty() || !c.ours_hostnames_changed.is_empty() {
            failures.push(format!("{stop:?}: ours {:?}, hostnames {:?}", c.ours_first_sync, c.ours_hostnames_changed));
        }
        if stop == Stop::Graceful {
            let _ = writeln!(
                err,
                "  before it: upstream restarted over its own load balancers made {} mutating calls {:?}",
                total(&c.upstream_restart),
                c.upstream_restart
            );
            let _ = writeln!(
                err,
                "  edit of {} after the takeover: {:?}; handed back, upstream's first full sync made {} mutating calls {:?}, {} hostnames changed",
                EDITED.0,
                c.edit,
                total(&c.upstream_again),
                c.upstream_again,
                c.upstream_hostnames_changed.len()
            );
            if c.edit.keys().collect::<Vec<_>>() != ["ModifyLoadBalancerAttributes"] {
                failures.push(format!("the edit made {:?}, not one attribute change", c.edit));
            }
            let replaced = beyond(&c.upstream_again, &c.upstream_restart);
            if !replaced.is_empty() || !c.upstream_hostnames_changed.is_empty() {
                failures.push(format!(
                    "upstream after the hand-back: {replaced:?}, hostnames {:?}",
                    c.upstream_hostnames_changed
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
