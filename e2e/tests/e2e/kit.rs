//! What the modules of this test binary share beyond the test kit (`testkit`, which waits and
//! builds fixtures): the operator scenarios' cluster and namespace ([`Env`]), the one tracing
//! subscriber and its log capture, request-log filters, the chart rendered by Helm, and what the
//! operator builds for a resource.
//!
//! Each scenario runs on both backends (`testkit::backend_tests!`): the local API server,
//! and a genuine etcd + kube-apiserver when `CCM_TEST_ASSETS` is set. It installs the CRD and
//! works in a namespace of its own. The genuine backend runs no kube-controller-manager, so the
//! harness may play the Deployment and DaemonSet controllers (write workload status) on both.
#![allow(dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, Once};
use std::time::Duration;

use crds::CloudControllerManager;
use crds::conditions::{self, types};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, Resource};
use operator::{OperatorConfig, OperatorHandle, Scope, Timings};
use serde_json::{Value, json};
use testkit::{Backend, RequestLog, RequestRecord, TestCluster, WAIT, poll_within};
use tracing_subscriber::filter::{EnvFilter, FilterExt, filter_fn};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{Layer, fmt};

/// The user agent of the harness's own requests, so request-log checks can leave them out.
pub const HARNESS_AGENT: &str = "ccm-operator-e2e-harness";

static NEXT: AtomicUsize = AtomicUsize::new(0);

/// One scenario's cluster and namespace.
pub struct Env {
    /// The API server (local or genuine).
    pub cluster: TestCluster,
    /// The client the operator uses.
    pub client: Client,
    /// The harness's client (its own user agent).
    pub harness: Client,
    /// The scenario's namespace.
    pub ns: String,
}

/// Whether a [`LogCapture`] is held, and what was captured meanwhile.
static CAPTURING: AtomicUsize = AtomicUsize::new(0);
static CAPTURED: Mutex<Vec<u8>> = Mutex::new(Vec::new());

/// Installs the process's one tracing subscriber (the first call does; later ones keep it): the
/// test's captured output filtered by `RUST_LOG` (default `warn,operator=info`), and, while a
/// [`LogCapture`] is held, everything at the most verbose level into the capture. One
/// subscriber, because every module of this test binary shares the process.
pub fn init_logging() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let output = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn,operator=info"));
        let capture = EnvFilter::new("info,operator=trace,ccm_framework=trace")
            .and(filter_fn(|_| CAPTURING.load(Ordering::SeqCst) > 0));
        let _ = tracing_subscriber::registry()
            .with(fmt::layer().with_test_writer().with_filter(output))
            .with(fmt::layer().with_ansi(false).with_writer(|| CaptureWriter).with_filter(capture))
            .try_init();
    });
}

/// While held, the operator's (and its embedded engines') logs at trace level are captured.
pub struct LogCapture(());

impl LogCapture {
    /// Starts capturing (installing the subscriber first if needed).
    pub fn start() -> LogCapture {
        init_logging();
        CAPTURING.fetch_add(1, Ordering::SeqCst);
        LogCapture(())
    }
}

impl Drop for LogCapture {
    fn drop(&mut self) {
        CAPTURING.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Everything captured so far in this process, by any holder of a [`LogCapture`].
pub fn captured_logs() -> String {
    String::from_utf8_lossy(&CAPTURED.lock().unwrap_or_else(|e| e.into_inner())).into_owned()
}

struct CaptureWriter;

impl std::io::Write for CaptureWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        CAPTURED.lock().unwrap_or_else(|e| e.into_inner()).extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn with_agent(mut config: kube::Config) -> Client {
    config.headers.push(("user-agent".parse().expect("a header name"), HARNESS_AGENT.parse().expect("a value")));
    Client::try_from(config).expect("a client")
}

impl Env {
    /// Start (or take a turn on) an API server, install the CRD, and create a namespace for the
    /// scenario.
    pub async fn start(backend: Backend, name: &str) -> Env {
        init_logging();
        let cluster = TestCluster::start(backend).await.expect("the API server starts");
        Env::on(cluster, name).await
    }

    /// Like [`Env::start`], with fault injection (`env.cluster.faults()`) on both backends.
    pub async fn start_with_faults(backend: Backend, name: &str) -> Env {
        init_logging();
        let cluster = TestCluster::start_with_faults(backend).await.expect("the API server starts");
        Env::on(cluster, name).await
    }

    async fn on(cluster: TestCluster, name: &str) -> Env {
        let (client, harness) = (cluster.client(), with_agent(cluster.kube_config()));
        cluster.install_crd(&crds::crd()).await.expect("the CRD installs");
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let ns = format!("e2e-{name}-{}-{n}", std::process::id());
        let namespaces: Api<Namespace> = Api::all(harness.clone());
        namespaces.create(&PostParams::default(), &testkit::namespace(&ns)).await.expect("the namespace is created");
        Env { cluster, client, harness, ns }
    }

    /// Whether this runs on the genuine kube-apiserver.
    pub fn is_genuine(&self) -> bool {
        self.cluster.is_genuine()
    }

    /// Whether a garbage collector removes owned objects after their owner goes.
    pub fn garbage_collects(&self) -> bool {
        self.cluster.garbage_collects()
    }

    /// The request log: the local server's, or the genuine server's audit log, from the start
    /// of this scenario.
    pub fn request_log(&self) -> RequestLog {
        self.cluster.request_log()
    }

    /// An operator configuration for this scenario: its namespace only, fast timings.
    pub fn operator_config(&self) -> OperatorConfig {
        let mut config = OperatorConfig::new(self.client.clone());
        config.scope = Scope::Namespaces(vec![self.ns.clone()]);
        config.build.manager_image = "example.test/cloud-controller-manager:e2e".into();
        config.timings = Timings {
            debounce: Duration::from_millis(50),
            degraded_window: Duration::from_secs(3),
            ..Timings::default()
        };
        config
    }

    /// Start an operator with the scenario's defaults.
    pub async fn operator(&self) -> OperatorHandle {
        operator::start(self.operator_config()).await.expect("the operator starts")
    }

    /// The CR API of the scenario's namespace (harness client).
    pub fn crs(&self) -> Api<CloudControllerManager> {
        Api::namespaced(self.harness.clone(), &self.ns)
    }

    /// Any namespaced API with the harness client.
    pub fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.harness.clone(), &self.ns)
    }

    /// Create or update a CR from a spec (server-side apply by the harness).
    pub async fn apply_cr(&self, name: &str, spec: Value) {
        let body = json!({
            "apiVersion": "ccm.rs/v1alpha1",
            "kind": "CloudControllerManager",
            "metadata": {"name": name, "namespace": self.ns},
            "spec": spec,
        });
        self.crs()
            .patch(name, &PatchParams::apply(HARNESS_AGENT).force(), &Patch::Apply(&body))
            .await
            .unwrap_or_else(|e| panic!("applying CloudControllerManager {name}: {e}"));
    }

    /// Create or replace a cloud-config Secret (labelled for the operator) with one key.
    pub async fn secret(&self, name: &str, key: &str, value: &str) {
        let secret = testkit::cloud_config_secret(&self.ns, name, key, value.as_bytes());
        self.api::<Secret>()
            .patch(name, &PatchParams::apply(HARNESS_AGENT).force(), &Patch::Apply(&secret))
            .await
            .expect("the Secret is applied");
    }

    /// The CR now.
    pub async fn cr(&self, name: &str) -> CloudControllerManager {
        self.crs().get(name).await.unwrap_or_else(|e| panic!("reading CloudControllerManager {name}: {e}"))
    }

    /// Wait until the CR's condition `type_` satisfies `check`; returns it.
    pub async fn wait_condition(&self, name: &str, type_: &str, check: impl Fn(&Condition) -> bool) -> Condition {
        let last = std::sync::Mutex::new(None);
        let found = poll_within(WAIT, || async {
            let cr = self.crs().get_opt(name).await.ok().flatten()?;
            let c = condition(&cr, type_)?;
            *last.lock().unwrap() = Some(c.clone());
            check(&c).then_some(c)
        })
        .await;
        found.unwrap_or_else(|| panic!("{type_} of {name} never matched; last seen: {:?}", last.lock().unwrap()))
    }

    /// Wait until the condition has this status and reason.
    pub async fn wait_status(&self, name: &str, type_: &str, status: &str, reason: &str) -> Condition {
        self.wait_condition(name, type_, |c| c.status == status && c.reason == reason).await
    }

    /// Write a workload's status as its controller would (merge patch on `/status`).
    pub async fn write_status<K>(&self, name: &str, status: Value)
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
    {
        self.api::<K>()
            .patch_status(name, &PatchParams::default(), &Patch::Merge(json!({ "status": status })))
            .await
            .unwrap_or_else(|e| panic!("writing status of {name}: {e}"));
    }

    /// End the scenario: the local server stops (on drop); on the genuine backend the turn ends
    /// and the next scenario's turn deletes what this one left (a deleted namespace would only
    /// stay Terminating there: no namespace controller).
    pub async fn finish(self) {
        drop(self);
    }
}

/// The condition `type_` of a CR.
pub fn condition(cr: &CloudControllerManager, type_: &str) -> Option<Condition> {
    conditions::find(&cr.status.as_ref()?.conditions, type_).cloned()
}

/// `(status, reason)` of a condition, for assertions.
pub fn status_reason(cr: &CloudControllerManager, type_: &str) -> (String, String) {
    condition(cr, type_).map(|c| (c.status, c.reason)).unwrap_or_default()
}

/// Whether a request came from the code under test: neither the harness nor the genuine
/// kube-apiserver's own controllers (`system:apiserver`, absent on the local server).
pub fn by_code_under_test(r: &RequestRecord) -> bool {
    r.user_agent != HARNESS_AGENT && r.user.as_deref() != Some("system:apiserver")
}

/// Writes the operator made (not the harness, nor a manager it runs), from a request-log slice.
pub fn operator_writes(records: &[RequestRecord]) -> Vec<&RequestRecord> {
    records
        .iter()
        .filter(|r| {
            r.is_write() && by_code_under_test(r) && r.field_manager.as_deref() != Some("cloud-controller-manager")
        })
        .collect()
}

/// Now as a Lease's `renewTime`/`acquireTime` (kube-apiserver takes exactly six fractional digits).
pub fn micro_now() -> Value {
    serde_json::to_value(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(k8s_openapi::jiff::Timestamp::now()))
        .expect("a MicroTime serializes")
}

/// The Ready condition is published and kstatus-readable.
pub fn ready(cr: &CloudControllerManager) -> Option<Condition> {
    condition(cr, types::READY)
}

/// Whether this runs in CI (`CI=true`), where a missing tool is a failure rather than a skip.
pub fn in_ci() -> bool {
    std::env::var("CI").as_deref() == Ok("true")
}

/// Whether the namespaced object `name` of kind `K` exists in the scenario's namespace.
pub async fn exists<K>(env: &Env, name: &str) -> bool
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    env.api::<K>().get_opt(name).await.expect("reading the object").is_some()
}

/// Whether the operator's ClusterRoleBinding for the resource `cr` of the scenario exists.
pub async fn crb_exists(env: &Env, cr: &str) -> bool {
    Api::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>::all(env.harness.clone())
        .get_opt(&format!("ccm-operator:{}:{cr}", env.ns))
        .await
        .expect("reading the ClusterRoleBinding")
        .is_some()
}

/// The lines a child process writes to `stdout`, on a channel a thread fills.
pub fn line_channel(stdout: impl std::io::Read + Send + 'static) -> std::sync::mpsc::Receiver<String> {
    use std::io::BufRead;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Lines from `rx` until `until` matches one or `timeout` passes: every line read, and whether
/// one matched. With `echo`, each line is also printed with that label (kept by libtest for a
/// failing test).
pub fn read_until(
    rx: &std::sync::mpsc::Receiver<String>,
    echo: Option<&str>,
    timeout: Duration,
    until: impl Fn(&str) -> bool,
) -> (Vec<String>, bool) {
    let deadline = std::time::Instant::now() + timeout;
    let mut lines = Vec::new();
    while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
        match rx.recv_timeout(left) {
            Ok(line) => {
                if let Some(label) = echo {
                    eprintln!("{label}| {line}");
                }
                let done = until(&line);
                lines.push(line);
                if done {
                    return (lines, true);
                }
            }
            Err(_) => break,
        }
    }
    (lines, false)
}

/// `render.py`'s exit code for "a tool is missing, skipped".
const RENDER_SKIPPED: i32 = 77;

/// The chart rendered by real Helm for `values`, as `release` in `namespace`; `None` (with the
/// reason printed) when Helm is unavailable outside CI.
pub fn render_chart(
    kubeconfig: &std::path::Path,
    values: &Value,
    release: &str,
    namespace: &str,
) -> Option<Vec<Value>> {
    let script = testkit::workspace_root().join("charts/ccm-operator/tests/render.py");
    let output = std::process::Command::new("python3")
        .arg(script)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["--values", &values.to_string(), "--release", release, "--namespace", namespace])
        .env("HELM_DRIVER", "memory")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output();
    let output = match output {
        Ok(o) => o,
        Err(e) => {
            assert!(!in_ci(), "python3 could not run ({e}), and CI=true makes that a failure");
            eprintln!("SKIPPED: python3 could not run: {e}");
            return None;
        }
    };
    let stderr = String::from_utf8_lossy(&output.stderr);
    match output.status.code() {
        Some(0) => Some(serde_json::from_slice(&output.stdout).expect("render.py prints JSON")),
        Some(RENDER_SKIPPED) if !in_ci() => {
            eprintln!("SKIPPED: {stderr}");
            None
        }
        code => panic!("rendering the chart failed (exit {code:?}): {stderr}"),
    }
}

/// Server-side applies `object` (any kind the API server serves) as `client`, with the
/// harness's field manager.
pub async fn apply_dynamic(client: &Client, object: &Value) -> Result<(), kube::Error> {
    let (ar, namespace, name) = dynamic_target(client, object).await?;
    let api: Api<kube::api::DynamicObject> = match &namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    };
    api.patch(&name, &PatchParams::apply(HARNESS_AGENT).force(), &Patch::Apply(object)).await.map(drop)
}

/// The API resource, namespace and name of `object`, found through discovery.
pub async fn dynamic_target(
    client: &Client,
    object: &Value,
) -> Result<(kube::api::ApiResource, Option<String>, String), kube::Error> {
    let api_version = object["apiVersion"].as_str().unwrap_or_default();
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let gvk = kube::api::GroupVersionKind::gvk(group, version, object["kind"].as_str().unwrap_or_default());
    let (ar, caps) = kube::discovery::pinned_kind(client, &gvk).await?;
    let namespace = match caps.scope {
        kube::discovery::Scope::Namespaced => object["metadata"]["namespace"].as_str().map(str::to_string),
        kube::discovery::Scope::Cluster => None,
    };
    Ok((ar, namespace, object["metadata"]["name"].as_str().unwrap_or_default().to_string()))
}

/// The kinds of the chart applied by the admission-policy tests: its RBAC and its policies.
const CHART_RBAC_AND_POLICY_KINDS: &[&str] = &[
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
];

/// The chart rendered by real Helm for `values` as `release` in `release_ns`, its RBAC and
/// admission policies applied to the genuine `cluster` as rendered, and a client acting as the
/// operator's ServiceAccount; `None` when Helm is unavailable (reason printed).
pub async fn install_chart_rbac_and_policies(
    cluster: &TestCluster,
    values: &Value,
    release: &str,
    release_ns: &str,
) -> Option<(Vec<Value>, Client)> {
    let objects = render_chart(&cluster.kubeconfig_path(), values, release, release_ns)?;
    let admin = cluster.client();
    for o in objects.iter().filter(|o| CHART_RBAC_AND_POLICY_KINDS.iter().any(|k| o["kind"] == *k)) {
        let mut o = o.clone();
        if o["metadata"]["namespace"].is_null()
            && ["ServiceAccount", "Role", "RoleBinding"].iter().any(|k| o["kind"] == *k)
        {
            o["metadata"]["namespace"] = json!(release_ns);
        }
        apply_dynamic(&admin, &o)
            .await
            .unwrap_or_else(|e| panic!("applying {} {}: {e}", o["kind"], o["metadata"]["name"]));
    }
    let account = objects
        .iter()
        .find(|o| o["kind"] == "ServiceAccount")
        .and_then(|o| o["metadata"]["name"].as_str())
        .expect("the chart renders the operator's ServiceAccount")
        .to_string();
    let (config, _) = cluster.service_account(release_ns, &account).await.expect("a ServiceAccount token");
    Some((objects, Client::try_from(config).expect("a client")))
}

/// What the admission and RBAC tests share: a genuine API server with the CRD, a managed
/// namespace, and the chart's RBAC and admission policies installed in a release namespace of
/// their own, with the operator's client (its ServiceAccount's token).
pub struct ChartWorld {
    /// The API server: keep it bound (`cluster: _cluster`), it stops when it drops.
    pub cluster: TestCluster,
    /// Its admin client.
    pub admin: Client,
    /// The managed namespace (first in `cloudConfig.namespaces`).
    pub managers: String,
    /// Everything the chart rendered.
    pub objects: Vec<Value>,
    /// The operator's client.
    pub operator: Client,
}

/// Starts a [`ChartWorld`]: namespaces `<namespace>` and `<namespace>-system`, release
/// `<release><pid>`, `values` with the managed namespace put first in `cloudConfig.namespaces`.
/// `None`, saying why, without the genuine API server or helm.
pub async fn chart_world(namespace: &str, release: &str, mut values: Value) -> Option<ChartWorld> {
    if !Backend::genuine_available() {
        eprintln!("SKIPPED: needs the genuine API server (CCM_TEST_ASSETS): admission policies and RBAC");
        return None;
    }
    let cluster = TestCluster::start(Backend::Genuine).await.expect("the API server starts");
    cluster.install_crd(&crds::crd()).await.expect("the CRD installs");
    let managers = cluster.fresh_namespace(namespace).await.expect("the managed namespace");
    let release_ns = cluster.fresh_namespace(&format!("{namespace}-system")).await.expect("the release namespace");
    let mut namespaces = vec![json!(managers)];
    namespaces.extend(values["cloudConfig"]["namespaces"].as_array().cloned().unwrap_or_default());
    values["cloudConfig"]["namespaces"] = json!(namespaces);
    let release = format!("{release}{}", std::process::id());
    let (objects, operator) = install_chart_rbac_and_policies(&cluster, &values, &release, &release_ns).await?;
    Some(ChartWorld { admin: cluster.client(), cluster, managers, objects, operator })
}

/// A server-side apply of `object` as `client` with the operator's field manager (a dry run
/// when asked: admission runs, nothing is stored).
pub async fn apply_as_operator(client: &Client, object: &Value, dry_run: bool) -> Result<(), kube::Error> {
    let (ar, namespace, name) = dynamic_target(client, object).await?;
    let api: Api<kube::api::DynamicObject> = match &namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    };
    let mut params = PatchParams::apply(operator::names::FIELD_MANAGER).force();
    params.dry_run = dry_run;
    api.patch(&name, &params, &Patch::Apply(object)).await.map(drop)
}

/// `object` changed by `edit`, for crafting requests.
pub fn edited(object: &Value, edit: impl FnOnce(&mut Value)) -> Value {
    let mut object = object.clone();
    edit(&mut object);
    object
}

/// What the operator builds for the resource `cr` (its JSON) when its Secret holds a valid
/// `fake` cloud-config: the validate and build steps, without an API server.
pub fn operator_children(cr: Value, settings: &operator::build::BuildSettings) -> Vec<operator::build::Desired> {
    operator_children_with(cr, settings, b"autoInstances: true\n")
}

/// The same with `cloud_config` as the Secret's `cloud.conf` (for providers other than `fake`).
pub fn operator_children_with(
    cr: Value,
    settings: &operator::build::BuildSettings,
    cloud_config: &[u8],
) -> Vec<operator::build::Desired> {
    let cr: CloudControllerManager = serde_json::from_value(cr).expect("a resource");
    let secret = operator::validate::SecretState::Found {
        name: "cfg".into(),
        key: "cloud.conf".into(),
        data: cloud_config.to_vec(),
        extra: Vec::new(),
    };
    let validation = operator::validate::validate(&cr, &secret, &ccm_builtin::registry(), &[]);
    let validation = operator::validate::check_policy(&cr, validation, &settings.policy, &settings.manager_image);
    let operator::validate::Validation::Valid(validated) = validation else { panic!("{validation:?}") };
    operator::build::build(&cr, &validated, settings)
}

/// A `baremetal` cloud-config with one pool and L2 announcement on `eth0`.
pub const BAREMETAL_ANNOUNCING: &str = "loadBalancer:\n  pools:\n    - name: edge\n      cidrs: [192.0.2.64/27]\n  announcement:\n    l2:\n      interfaces: [eth0]\n";

/// Build settings that allow announcers, with a BIRD image.
pub fn announcing_settings(manager_image: &str) -> operator::build::BuildSettings {
    let mut settings = operator::build::BuildSettings { manager_image: manager_image.into(), ..Default::default() };
    settings.policy.allow_announcers = true;
    settings.policy.bird_image = Some("example.test/bird:2".into());
    settings
}
