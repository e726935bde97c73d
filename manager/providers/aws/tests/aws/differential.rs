//! The differential suite: every case of `cases.rs` run through upstream cloud-provider-aws
//! v1.36.1's own binary and through ours, each on its own genuine kube-apiserver and its own
//! moto seeded alike (so the world's IDs are the same on both sides); what each leaves in AWS
//! and in the API server is read by `snapshot.rs`, normalised, and compared field by field,
//! after phase one (everything created) and after phase two (Services edited and deleted, a
//! Node added, one removed, one whose instance was terminated).
//!
//! Every difference must be one of [`DIVERGENCES`], the deliberate ones, each with its reason
//! (docs/aws.md shows the same table); the test fails on any other difference, and on a listed
//! one that no longer occurs. Skipped, with one line on stderr, without upstream's binary
//! (`upstream.rs`), `CCM_TEST_ASSETS` or moto.

use std::io::Write as _;
use std::time::Instant;

use crate::cases::{self, Case, Config, Kind, NodePhase, Then};
use crate::kit::*;
use crate::proxy::Proxy;
use crate::snapshot::{self, Fields};
use crate::upstream::{self, Upstream};
use crate::world::{self, CLUSTER_NAME, Seeded};
use ccm_framework::engine::{EngineBuilder, RunningEngine};
use testkit::genuine::ControlPlane;

/// A difference the suite expects: ours differs from upstream on purpose.
pub(crate) struct Divergence {
    /// The case it shows in.
    pub(crate) case: &'static str,
    /// The field (as `snapshot.rs` names it, after the phase: `1: ...`, `2: ...`).
    pub(crate) field: &'static str,
    /// Upstream's value (`-` when absent).
    pub(crate) upstream: &'static str,
    /// Ours (`-` when absent).
    pub(crate) ours: &'static str,
    /// Why.
    pub(crate) reason: &'static str,
}

/// The deliberate divergences, each shown by the suite. docs/aws.md lists the same rows; `#n`
/// is the entry of its list of deliberate divergences.
pub(crate) static DIVERGENCES: &[Divergence] = &[
    Divergence {
        case: "classic-edit-internal",
        field: "sync.failure",
        upstream: "-",
        ours: "*",
        reason: "#11: a scheme change AWS cannot make in place is refused, naming the annotation; upstream ignores it silently",
    },
    Divergence {
        case: "nlb-edit-internal",
        field: "sync.failure",
        upstream: "-",
        ours: "*",
        reason: "#11: a scheme change AWS cannot make in place is refused, naming the annotation; upstream ignores it silently",
    },
    Divergence {
        case: "classic-hc-lower-case",
        field: "*",
        upstream: "*",
        ours: "*",
        reason: "#14: the health-check protocol is upper-cased; upstream sends `http:` and AWS refuses the health check, leaving the ELB half made",
    },
    Divergence {
        case: "modes-nlb-tls",
        field: "*",
        upstream: "*",
        ours: "*",
        reason: "#24: a TLS listener's rule on the managed group has IP protocol tcp; upstream sends `tls`, which EC2 refuses, and the sync fails",
    },
    Divergence {
        case: "nlb-hc-timeout",
        field: "tg k8s-default-nlbhctim-*",
        upstream: "*",
        ours: "*",
        reason: "#21: an annotated healthcheck-timeout is sent; upstream parses it and never sends it",
    },
    Divergence {
        case: "nlb-deleted",
        field: "sg {sg workers}.ingress[*",
        upstream: "*",
        ours: "-",
        reason: "#17: deletion revokes the rules naming the load balancer wherever they are; upstream cleans only cluster-tagged groups and leaks the client rule it put on an instance's only, untagged group",
    },
    Divergence {
        case: "nlb-to-cluster-ip",
        field: "sg {sg workers}.ingress[*",
        upstream: "*",
        ours: "-",
        reason: "#17: deletion revokes the rules naming the load balancer wherever they are; upstream cleans only cluster-tagged groups and leaks the client rule it put on an instance's only, untagged group",
    },
];

/// Names a directory to write both sides' fields to (`<config>-upstream.txt`, `-ours.txt`).
const DUMP_ENV: &str = "CCM_DIFFERENTIAL_DUMP";

/// How long without a mutating call counts as settled.
const QUIET: Duration = Duration::from_secs(6);
/// The longest a phase may take to settle.
const SETTLE_WITHIN: Duration = Duration::from_secs(180);

/// Whose manager runs.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Who {
    Upstream,
    Ours,
}

impl Who {
    fn name(self) -> &'static str {
        match self {
            Who::Upstream => "upstream",
            Who::Ours => "ours",
        }
    }
}

/// The API server of one side: a turn on the shared genuine control plane, or a control plane
/// of its own (both sides run at once, and each manager watches the whole cluster).
enum Server {
    Turn(TestCluster),
    /// The plane runs until `_keep` is dropped.
    Own {
        plane: ControlPlane,
        _keep: std::sync::mpsc::Sender<()>,
    },
}

impl Server {
    async fn start(who: Who) -> Server {
        match who {
            Who::Upstream => Server::Turn(TestCluster::start(Backend::Genuine).await.expect("a genuine turn")),
            Who::Ours => {
                let assets = testkit::genuine::assets_dir().expect("CCM_TEST_ASSETS");
                let (plane, keep) = tokio::task::spawn_blocking(move || ControlPlane::start_on_own_thread(assets))
                    .await
                    .expect("no panic")
                    .expect("a second genuine control plane");
                Server::Own { plane, _keep: keep }
            }
        }
    }

    async fn client(&self) -> kube::Client {
        match self {
            Server::Turn(c) => c.client(),
            Server::Own { plane, .. } => plane.admin_client().await.expect("admin client"),
        }
    }

    fn kubeconfig(&self) -> std::path::PathBuf {
        match self {
            Server::Turn(c) => c.kubeconfig_path(),
            Server::Own { plane, .. } => plane.admin_kubeconfig_path(),
        }
    }
}

/// A running manager.
enum Manager {
    Upstream(Upstream),
    Ours(RunningEngine),
}

impl Manager {
    async fn stop(self) {
        match self {
            Manager::Upstream(u) => u.terminate().await,
            Manager::Ours(e) => {
                let _ = e.stop().await;
            }
        }
    }
}

/// What one side leaves, and the calls it made.
struct SideResult {
    fields: Fields,
    calls: BTreeMap<String, usize>,
    notes: Vec<String>,
}

/// Ours as the binary would build it from `conf`: upstream's cloud-config text, parsed.
pub(crate) fn our_provider(conf: &str) -> Arc<AwsProvider> {
    let config = ccm_provider_aws::config::parse(conf.as_bytes()).expect("upstream's cloud.conf parses");
    let options = AwsOptions {
        credentials: Some(ec2::config::Credentials::new("testing", "testing", None, None, "test")),
        ..Default::default()
    };
    Arc::new(AwsProvider::new(config, CLUSTER_NAME, options))
}

pub(crate) fn node_object(def: &cases::NodeDef, w: &Seeded) -> Node {
    let i = w.instance(def.instance);
    let name = if def.provider_id { i.name.clone() } else { i.private_dns.clone() };
    let mut labels = vec![(testkit::HOSTNAME_LABEL, name.as_str())];
    labels.extend(def.labels.iter().copied());
    use testkit::{Meta as _, NodeFixture as _};
    let mut n = testkit::kubelet_node(&name).with_labels(&labels).ready();
    if def.provider_id {
        n = n.with_provider_id(&i.provider_id());
    }
    n
}

fn node_name(def: &cases::NodeDef, w: &Seeded) -> String {
    let i = w.instance(def.instance);
    if def.provider_id { i.name.clone() } else { i.private_dns.clone() }
}

/// Mutating calls seen by the proxy (every action but `Describe*`).
fn mutating_count(proxy: &Proxy) -> usize {
    proxy.faults.lock().unwrap().actions.iter().filter(|a| !a.is_empty() && !a.starts_with("Describe")).count()
}

/// Whether every handled Service shows an outcome: a hostname, or a failed sync.
async fn outcomes_pending(client: &kube::Client, services: &[Service]) -> Vec<String> {
    use k8s_openapi::api::core::v1::Event as CoreEvent;
    let events =
        Api::<CoreEvent>::all(client.clone()).list(&Default::default()).await.map(|l| l.items).unwrap_or_default();
    let mut pending = Vec::new();
    for s in services {
        let ns = s.metadata.namespace.as_deref().unwrap_or_default();
        let name = s.metadata.name.as_deref().unwrap_or_default();
        let Ok(Some(now)) = Api::<Service>::namespaced(client.clone(), ns).get_opt(name).await else { continue };
        let hostname = now
            .status
            .as_ref()
            .and_then(|st| st.load_balancer.as_ref())
            .and_then(|lb| lb.ingress.as_ref())
            .is_some_and(|i| !i.is_empty());
        let failed = events.iter().any(|e| {
            e.involved_object.uid == now.metadata.uid && e.reason.as_deref() == Some("SyncLoadBalancerFailed")
        });
        if !hostname && !failed {
            pending.push(format!("{ns}/{name}"));
        }
    }
    pending
}

/// Waits until `services` show outcomes, `extra` holds, and no mutating call came for
/// [`QUIET`] (at least `min` after the start). Returns what was still pending at the deadline.
pub(crate) async fn settle<F, Fut>(
    proxy: &Proxy,
    client: &kube::Client,
    services: &[Service],
    min: Duration,
    extra: F,
) -> Vec<String>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    let mut last = (mutating_count(proxy), Instant::now());
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = mutating_count(proxy);
        if now != last.0 {
            last = (now, Instant::now());
        }
        let pending = outcomes_pending(client, services).await;
        let extra_ok = extra().await;
        if pending.is_empty() && extra_ok && last.1.elapsed() >= QUIET && start.elapsed() >= min {
            return Vec::new();
        }
        if start.elapsed() > SETTLE_WITHIN {
            let mut p = pending;
            if !extra_ok {
                p.push("the phase's Node changes".into());
            }
            if last.1.elapsed() < QUIET {
                p.push("mutating calls still coming".into());
            }
            return p;
        }
    }
}

/// One side of one config: its API server and moto, the Nodes and Services, its manager,
/// phase one, phase two, and what it left after each.
async fn run_side(who: Who, config: Config, all: &[Case], binary: Option<&std::path::Path>) -> SideResult {
    let server = Server::start(who).await;
    let client = server.client().await;
    let moto = Moto::start("differential").await.expect("moto (checked before)");
    let direct = world::direct_clients(&moto.url).await;
    let w = world::seed(&moto, &direct).await;
    let proxy = Proxy::start(moto.port).await;
    let conf = world::cloud_conf(&w, &proxy.url, config.extra());
    let mut notes = Vec::new();

    for ns in ["team-a"] {
        let _ = Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
            .create(&PostParams::default(), &testkit::namespace(ns))
            .await;
    }
    let node_defs = cases::nodes(config);
    let nodes: Api<Node> = Api::all(client.clone());
    for def in node_defs.iter().filter(|d| d.phase != NodePhase::Added) {
        nodes.create(&PostParams::default(), &node_object(def, &w)).await.expect("create Node");
    }
    let mut services = Vec::new();
    for (index, case) in all.iter().enumerate() {
        if case.config != config {
            continue;
        }
        let Some(svc) = case.build(index, |v| w.fill(v)) else { continue };
        let api: Api<Service> = Api::namespaced(client.clone(), svc.metadata.namespace.as_deref().unwrap());
        let made = api.create(&PostParams::default(), &svc).await.unwrap_or_else(|e| panic!("create {}: {e}", case.id));
        if matches!(&case.kind, Kind::Service(s) if s.handled) {
            services.push(made);
        }
    }

    let dir = std::env::temp_dir().join(format!("ccm-differential-{}-{}", std::process::id(), who.name()));
    std::fs::create_dir_all(&dir).unwrap();
    let conf_path = dir.join("cloud.conf");
    std::fs::write(&conf_path, &conf).unwrap();
    let manager = match who {
        Who::Upstream => {
            let log = dir.join(format!("upstream-{config:?}.log"));
            Manager::Upstream(Upstream::start(
                binary.expect("upstream's binary"),
                &server.kubeconfig(),
                &conf_path,
                &log,
                &["--leader-elect=false"],
            ))
        }
        Who::Ours => {
            let options = ControllerOptions { configure_cloud_routes: false, ..Default::default() };
            let engine = EngineBuilder::new(client.clone(), our_provider(&conf), options).build().expect("engine");
            Manager::Ours(engine.start(CancellationToken::new()).await.expect("engine starts"))
        }
    };

    // Phase one: everything created.
    let pending = settle(&proxy, &client, &services, Duration::from_secs(5), || async { true }).await;
    if !pending.is_empty() {
        notes.push(format!("{} phase 1 unsettled: {pending:?}", who.name()));
    }
    let mut fields = Fields::new();
    for ((owner, field), value) in snapshot::read(&direct, &client, &w, &services).await {
        fields.insert((owner, format!("1: {field}")), value);
    }

    // Phase two, first: an instance terminated and its Node NotReady; both managers delete the
    // Node. Before the other changes, so no sync races the termination.
    let mut gone = Vec::new();
    for def in node_defs.iter().filter(|d| d.phase == NodePhase::Terminated) {
        let name = node_name(def, &w);
        direct.ec2.terminate_instances().instance_ids(&w.instance(def.instance).id).send().await.unwrap();
        let patch =
            json!({"status": {"conditions": [{"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown"}]}});
        nodes.patch_status(&name, &PatchParams::default(), &Patch::Strategic(&patch)).await.expect("NotReady");
        gone.push(name);
    }
    let node_gone = || {
        let nodes = nodes.clone();
        let gone = gone.clone();
        async move {
            for g in &gone {
                if nodes.get_opt(g).await.ok().flatten().is_some() {
                    return false;
                }
            }
            true
        }
    };
    let pending = settle(&proxy, &client, &[], Duration::from_secs(2), node_gone).await;
    if !pending.is_empty() {
        notes.push(format!("{} phase 2 (termination) unsettled: {pending:?}", who.name()));
    }

    // Then Services edited and deleted; once they settled, a Node added and one removed.
    for case in all.iter().filter(|c| c.config == config) {
        let Kind::Service(s) = &case.kind else { continue };
        let api: Api<Service> = Api::namespaced(client.clone(), s.namespace);
        match s.then {
            Then::Keep => {}
            Then::Delete => {
                api.delete(case.id, &DeleteParams::default()).await.expect("delete");
            }
            Then::Edit(edit) => {
                let mut svc = api.get(case.id).await.expect("get");
                edit(&mut svc);
                svc.status = None;
                api.replace(case.id, &PostParams::default(), &svc)
                    .await
                    .unwrap_or_else(|e| panic!("edit {}: {e}", case.id));
            }
        }
    }
    // The Node changes once the edits settled: a node pass racing an edit would see either the
    // old Service or the new one (upstream's does; `nlb-edit-untyped` showed both).
    let pending = settle(&proxy, &client, &[], Duration::from_secs(2), || async { true }).await;
    if !pending.is_empty() {
        notes.push(format!("{} phase 2 (edits) unsettled: {pending:?}", who.name()));
    }
    for def in &node_defs {
        match def.phase {
            NodePhase::Added => {
                nodes.create(&PostParams::default(), &node_object(def, &w)).await.expect("create Node");
            }
            NodePhase::Removed => {
                nodes.delete(&node_name(def, &w), &DeleteParams::default()).await.expect("delete Node");
            }
            NodePhase::Always | NodePhase::Terminated => {}
        }
    }
    let pending = settle(&proxy, &client, &[], Duration::from_secs(10), || async { true }).await;
    if !pending.is_empty() {
        notes.push(format!("{} phase 2 unsettled: {pending:?}", who.name()));
    }
    for ((owner, field), value) in snapshot::read(&direct, &client, &w, &services).await {
        fields.insert((owner, format!("2: {field}")), value);
    }
    if let (Manager::Upstream(u), Some(dump)) = (&manager, std::env::var_os(DUMP_ENV)) {
        let _ = std::fs::copy(&u.log, std::path::Path::new(&dump).join(format!("{config:?}-upstream.log")));
    }
    if let Manager::Upstream(u) = &manager {
        let tail = u.log_tail(4000);
        let errors: Vec<&str> = tail.lines().filter(|l| l.starts_with('E') && !l.contains("topology")).collect();
        if !errors.is_empty() {
            notes.push(format!("upstream logged {} errors, the last: {}", errors.len(), errors.last().unwrap()));
        }
    }
    manager.stop().await;
    let calls = {
        let f = proxy.faults.lock().unwrap();
        let mut out = BTreeMap::new();
        for a in &f.actions {
            *out.entry(a.clone()).or_insert(0) += 1;
        }
        out
    };
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
    SideResult { fields, calls, notes }
}

/// One field that differs.
#[derive(Debug, Clone)]
pub(crate) struct Difference {
    pub(crate) case: String,
    pub(crate) field: String,
    pub(crate) upstream: String,
    pub(crate) ours: String,
}

/// The differences between two sides' fields, by case (`?owner` for fields no case owns).
fn compare(up: &Fields, ours: &Fields, cases: &[&Case]) -> Vec<Difference> {
    let by_owner: BTreeMap<String, &str> = cases.iter().map(|c| (c.owner(), c.id)).collect();
    let keys: BTreeSet<&(String, String)> = up.keys().chain(ours.keys()).collect();
    let mut out = Vec::new();
    for key in keys {
        let (u, o) = (up.get(key), ours.get(key));
        if u == o {
            continue;
        }
        let case = by_owner.get(&key.0).map(|c| c.to_string()).unwrap_or_else(|| format!("?{}", key.0));
        out.push(Difference {
            case,
            field: key.1.clone(),
            upstream: u.cloned().unwrap_or_else(|| "-".into()),
            ours: o.cloned().unwrap_or_else(|| "-".into()),
        });
    }
    out
}

/// The field without its phase (`1: `, `2: `).
fn unphased(field: &str) -> &str {
    field.split_once(": ").map_or(field, |(_, f)| f)
}

/// Whether `pattern` (a field, or a prefix ending in `*`) matches `field`.
fn field_matches(pattern: &str, field: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => field.starts_with(prefix),
        None => pattern == field,
    }
}

/// The divergence that explains `d`: same case, the field in either phase, both values (`*`
/// for any).
fn explained(d: &Difference) -> Option<&'static Divergence> {
    let value = |pattern: &str, v: &str| pattern == "*" || pattern == v;
    DIVERGENCES.iter().find(|v| {
        v.case == d.case
            && field_matches(v.field, unphased(&d.field))
            && value(v.upstream, &d.upstream)
            && value(v.ours, &d.ours)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ours_leaves_in_aws_and_on_nodes_what_upstreams_own_binary_leaves_case_by_case() {
    let Some(binary) = upstream::binary_async().await else { return };
    if !Backend::genuine_available() {
        return;
    }
    let Some(probe) = Moto::start("differential").await else { return };
    assert!(probe.corrected, "the differential needs moto's corrections (python3 with moto)");
    drop(probe);
    testkit::init_tracing();
    let started = Instant::now();
    let all = cases::all();
    let mut differences = Vec::new();
    let mut notes = Vec::new();
    let mut calls = BTreeMap::new();
    for config in [Config::Default, Config::Modes] {
        let cases: Vec<&Case> = all.iter().filter(|c| c.config == config).collect();
        let (up, ours) =
            tokio::join!(run_side(Who::Upstream, config, &all, Some(&binary)), run_side(Who::Ours, config, &all, None));
        differences.extend(compare(&up.fields, &ours.fields, &cases));
        if let Some(dir) = std::env::var_os(DUMP_ENV) {
            for (who, fields) in [("upstream", &up.fields), ("ours", &ours.fields)] {
                let text: String = fields.iter().map(|((o, f), v)| format!("{o} | {f} = {v}\n")).collect();
                let path = std::path::Path::new(&dir).join(format!("{config:?}-{who}.txt"));
                std::fs::write(&path, text).expect("write the fields");
            }
        }
        notes.extend(up.notes);
        notes.extend(ours.notes);
        calls.insert((config.name(), "upstream"), up.calls);
        calls.insert((config.name(), "ours"), ours.calls);
    }
    let unexplained: Vec<&Difference> = differences.iter().filter(|d| explained(d).is_none()).collect();
    let stale: Vec<&Divergence> = DIVERGENCES
        .iter()
        .filter(|v| !differences.iter().any(|d| explained(d).is_some_and(|e| std::ptr::eq(e, *v))))
        .collect();
    let mut err = std::io::stderr();
    let _ = writeln!(
        err,
        "differential against upstream cloud-provider-aws v1.36.1: {} cases, {} differences ({} explained by the deliberate divergences, {} unexplained), {:.0} s",
        all.len(),
        differences.len(),
        differences.len() - unexplained.len(),
        unexplained.len(),
        started.elapsed().as_secs_f64()
    );
    for ((config, who), c) in &calls {
        let mutating: usize = c.iter().filter(|(a, _)| !a.starts_with("Describe")).map(|(_, n)| n).sum();
        let _ = writeln!(err, "  {who} ({config}): {} calls, {mutating} mutating", c.values().sum::<usize>());
    }
    for v in DIVERGENCES {
        let seen = differences.iter().filter(|d| explained(d).is_some_and(|e| std::ptr::eq(e, v))).count();
        if seen > 0 {
            let _ = writeln!(err, "  deliberate: {} ({seen} fields): {}", v.case, v.reason);
        }
    }
    for n in &notes {
        let _ = writeln!(err, "  note: {n}");
    }
    for d in &unexplained {
        let covers = all.iter().find(|c| c.id == d.case).map_or("", |c| c.covers);
        let _ = writeln!(
            err,
            "  unexplained: {} ({covers}) | {} | upstream {:?} | ours {:?}",
            d.case, d.field, d.upstream, d.ours
        );
    }
    for v in &stale {
        let _ = writeln!(err, "  listed but not seen: {} | {}", v.case, v.field);
    }
    assert!(
        unexplained.is_empty() && stale.is_empty(),
        "{} unexplained differences, {} stale divergences",
        unexplained.len(),
        stale.len()
    );
}
