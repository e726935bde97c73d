//! RBAC proof: what the chart grants is enough for what the code does, and every rule of the
//! operator's is needed.
//!
//! On the genuine backend (`CCM_TEST_ASSETS`) the chart's ServiceAccounts, roles and bindings are
//! applied as rendered and the operator and the manager run with their ServiceAccounts' tokens,
//! so kube-apiserver's RBAC authorizer decides (and its OwnerReferencesPermissionEnforcement
//! admission plugin, which the harness enables); a ServiceAccount the chart binds to its
//! metrics-reader ClusterRole scrapes each component's `/metrics`, which the component lets in
//! only after a TokenReview and a SubjectAccessReview made with its own token. Two tests then
//! remove each rule the chart grants the operator and the manager in turn and name the scenario
//! step that breaks. On both backends every request the component made (request log or audit
//! log) is also checked against the rules, as follows.
//!
//! The local API server does not authorize requests, so this test does: it renders the chart
//! with real Helm (`charts/ccm-operator/tests/render.py`), runs a component through a scenario
//! with the request log on, and checks every request the component made against the rules its
//! ServiceAccount would be bound to (verbs, API groups, resources, subresources,
//! resourceNames, and the namespace of a RoleBinding). Rules never exercised are printed.
//!
//! On the genuine backend the operator scenarios (Deployment, DaemonSet and Embedded modes) and
//! the announcer also run with the chart's admission policies in force, so they show that the
//! policies admit everything the operator and the announcer do.
//!
//! Covered: the manager (the `cloud-controller-manager` program, in-process, with the `fake`
//! provider) against the `ccm-manager` ClusterRole (cluster-wide) and `ccm-manager-namespace`
//! (bound in its resource's namespace), as the operator binds them; and the operator, in
//! Deployment and DaemonSet modes and in Embedded mode, against every binding the chart gives its
//! ServiceAccount with the matching values; the `baremetal` manager against the optional rules of
//! `manager.rbac.poolResources` and `manager.rbac.importPools`; and the L2 announcer against the
//! announcer ClusterRoles of `announcer.enabled`, bound as the operator binds them. Skipped, with
//! the reason printed, when Helm (helm-sdkpy) is missing outside CI.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use ccm_framework::serving::{AuthConfig, AuthSettings, HttpConfig};
use clap::Parser;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Node, Secret, Service, ServiceAccount};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::Client;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use serde_json::{Value, json};
use testkit::{RequestRecord, TestCluster, eventually_within};

/// The user agent of this test's own requests, so they are left out of the proof.
const HARNESS_AGENT: &str = "rbac-proof-harness";
/// The namespace and name of the CloudControllerManager the manager runs for.
const CR_NAMESPACE: &str = "cloud";
const CR_NAME: &str = "proof";
/// Where the chart (and so the operator) is installed.
const RELEASE_NAMESPACE: &str = "ccm-system";
/// The ServiceAccount (in [`RELEASE_NAMESPACE`]) that scrapes `/metrics`, bound by the chart to
/// its metrics-reader ClusterRole (`metricsReader.subjects`).
const SCRAPER: &str = "metrics-scraper";
/// Whether a rule is one that no request of the component's own names, so that only the genuine
/// run can show it needed: kube-apiserver checks `bind` while a binding is created and
/// `*/finalizers` in admission when an ownerReference blocks deletion; and the local server does
/// not serve TokenReview or SubjectAccessReview, which `/metrics` scrapes need.
fn genuine_only(rule: &Value) -> bool {
    let mut resources = rule["resources"].as_array().into_iter().flatten().filter_map(Value::as_str);
    rule["verbs"] == json!(["bind"])
        || resources.any(|r| r.ends_with("/finalizers") || r == "tokenreviews" || r == "subjectaccessreviews")
}

/// The chart's objects rendered by Helm as release `ccm-operator` in [`RELEASE_NAMESPACE`], or
/// `None` when Helm is unavailable outside CI.
fn render_chart(kubeconfig: &std::path::Path, values: &Value) -> Option<Vec<Value>> {
    crate::kit::render_chart(kubeconfig, values, "ccm-operator", RELEASE_NAMESPACE)
}

/// A set of rules and where they apply: everywhere (ClusterRoleBinding) or in one namespace.
struct Grant {
    source: String,
    namespace: Option<String>,
    rules: Vec<PolicyRule>,
}

/// What RBAC sees of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Attributes {
    verb: String,
    group: String,
    resource: String,
    subresource: Option<String>,
    name: Option<String>,
    namespace: Option<String>,
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Some(b) = std::str::from_utf8(&bytes[i + 1..i + 3]).ok().and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(b);
            i += 3;
        } else {
            out.push(if bytes[i] == b'+' { b' ' } else { bytes[i] });
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// RBAC attributes of a logged request; `None` for non-resource paths (discovery, `/version`),
/// which every authenticated user may read.
fn attributes(r: &RequestRecord) -> Option<Attributes> {
    let resource = r.resource.as_deref()?;
    let (resource, group) = resource.split_once('.').unwrap_or((resource, ""));
    let mut name = r.name.clone();
    // A list or watch narrowed to one name counts as that name (how kubectl and reflectors
    // watch a single object); RBAC's resourceNames then apply.
    if name.is_none() && matches!(r.verb.as_str(), "list" | "watch") {
        for pair in r.query.split('&') {
            if let Some(v) = pair.strip_prefix("fieldSelector=") {
                let selector = percent_decode(v);
                if let Some(n) = selector.strip_prefix("metadata.name=").filter(|n| !n.contains(',')) {
                    name = Some(n.to_string());
                }
            }
        }
    }
    Some(Attributes {
        verb: r.verb.clone(),
        group: group.to_string(),
        resource: resource.to_string(),
        subresource: r.subresource.clone(),
        name,
        namespace: r.namespace.clone(),
    })
}

fn matches_any(list: &[String], value: &str) -> bool {
    list.iter().any(|v| v == "*" || v == value)
}

/// Whether one rule allows a request (Kubernetes RBAC semantics for resource requests).
fn rule_allows(rule: &PolicyRule, a: &Attributes) -> bool {
    let groups = rule.api_groups.clone().unwrap_or_default();
    let resources = rule.resources.clone().unwrap_or_default();
    let combined = match &a.subresource {
        Some(sub) => format!("{}/{sub}", a.resource),
        None => a.resource.clone(),
    };
    let resource_ok = resources
        .iter()
        .any(|r| r == "*" || *r == combined || a.subresource.as_ref().is_some_and(|sub| *r == format!("*/{sub}")));
    let names = rule.resource_names.clone().unwrap_or_default();
    let name_ok = names.is_empty() || a.name.as_ref().is_some_and(|n| names.contains(n));
    matches_any(&rule.verbs, &a.verb) && matches_any(&groups, &a.group) && resource_ok && name_ok
}

/// The grant and rule index that allow `a`, if any.
fn allowed_by(grants: &[Grant], a: &Attributes) -> Option<(usize, usize)> {
    for (g, grant) in grants.iter().enumerate() {
        if let Some(ns) = &grant.namespace
            && a.namespace.as_ref() != Some(ns)
        {
            continue;
        }
        if let Some(r) = grant.rules.iter().position(|rule| rule_allows(rule, a)) {
            return Some((g, r));
        }
    }
    None
}

/// Checks `requests` against `grants`: panics listing every denied request, and prints the
/// `(rule, verb)` pairs that no request used.
fn prove(component: &str, grants: &[Grant], requests: &[RequestRecord]) {
    let mut denied = BTreeSet::new();
    let mut used = BTreeSet::new();
    let mut checked = 0;
    for r in requests {
        let Some(a) = attributes(r) else { continue };
        checked += 1;
        match allowed_by(grants, &a) {
            Some(_) => {
                // Credit every rule that allows it, so overlapping rules are not reported unused.
                for (g, grant) in grants.iter().enumerate() {
                    if grant.namespace.as_ref().is_some_and(|ns| a.namespace.as_ref() != Some(ns)) {
                        continue;
                    }
                    for (i, rule) in grant.rules.iter().enumerate() {
                        if rule_allows(rule, &a) {
                            used.insert((g, i, a.verb.clone()));
                        }
                    }
                }
            }
            None => {
                denied.insert(format!(
                    "{} {}{}{} {:?} in {:?} ({} {})",
                    a.verb,
                    if a.group.is_empty() { String::new() } else { format!("{}/", a.group) },
                    a.resource,
                    a.subresource.as_ref().map(|s| format!("/{s}")).unwrap_or_default(),
                    a.name,
                    a.namespace,
                    r.method,
                    r.path
                ));
            }
        }
    }
    assert!(checked > 0, "{component}: no resource request was logged; the scenario did not run");
    let mut unused = Vec::new();
    for (g, grant) in grants.iter().enumerate() {
        for (i, rule) in grant.rules.iter().enumerate() {
            for verb in &rule.verbs {
                if !used.contains(&(g, i, verb.clone())) {
                    unused.push(format!("{}: {verb} {:?}", grant.source, rule.resources.clone().unwrap_or_default()));
                }
            }
        }
    }
    eprintln!("{component}: {checked} requests checked, {} denied", denied.len());
    if !unused.is_empty() {
        eprintln!("{component}: granted but not used in this scenario:\n  {}", unused.join("\n  "));
    }
    assert!(
        denied.is_empty(),
        "{component} made requests its RBAC does not allow:\n  {}",
        denied.into_iter().collect::<Vec<_>>().join("\n  ")
    );
}

fn cluster_role(objects: &[Value], name: &str) -> ClusterRole {
    let found = objects
        .iter()
        .find(|o| o["kind"] == "ClusterRole" && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("the chart renders no ClusterRole {name}"));
    serde_json::from_value(found.clone()).expect("a ClusterRole")
}

/// Every grant the chart gives the ServiceAccount `namespace/name`, through its bindings.
fn grants_for_service_account(objects: &[Value], namespace: &str, name: &str) -> Vec<Grant> {
    // The account directly, or the group of its namespace's accounts (the kube-vip import Role).
    let group = format!("system:serviceaccounts:{namespace}");
    let binds_sa = |subjects: &Option<Vec<k8s_openapi::api::rbac::v1::Subject>>| {
        subjects.iter().flatten().any(|s| {
            (s.kind == "ServiceAccount" && s.name == name && s.namespace.as_deref() == Some(namespace))
                || (s.kind == "Group" && s.name == group)
        })
    };
    let role_rules = |kind: &str, role: &str, role_namespace: &str| -> Vec<PolicyRule> {
        let found = objects
            .iter()
            .find(|o| {
                o["kind"] == kind
                    && o["metadata"]["name"] == role
                    && (kind == "ClusterRole" || o["metadata"]["namespace"] == role_namespace)
            })
            .unwrap_or_else(|| panic!("a binding names {kind} {role}, which the chart does not render"));
        if kind == "Role" {
            serde_json::from_value::<Role>(found.clone()).expect("a Role").rules.unwrap_or_default()
        } else {
            serde_json::from_value::<ClusterRole>(found.clone()).expect("a ClusterRole").rules.unwrap_or_default()
        }
    };
    let mut grants = Vec::new();
    for o in objects {
        match o["kind"].as_str() {
            Some("ClusterRoleBinding") => {
                let b: ClusterRoleBinding = serde_json::from_value(o.clone()).expect("a ClusterRoleBinding");
                if binds_sa(&b.subjects) {
                    grants.push(Grant {
                        source: format!(
                            "ClusterRole {} (ClusterRoleBinding {})",
                            b.role_ref.name,
                            b.metadata.name.unwrap_or_default()
                        ),
                        namespace: None,
                        rules: role_rules("ClusterRole", &b.role_ref.name, ""),
                    });
                }
            }
            Some("RoleBinding") => {
                let b: RoleBinding = serde_json::from_value(o.clone()).expect("a RoleBinding");
                let ns = b.metadata.namespace.clone().unwrap_or_default();
                if binds_sa(&b.subjects) {
                    grants.push(Grant {
                        source: format!("{} {} (RoleBinding in {ns})", b.role_ref.kind, b.role_ref.name),
                        namespace: Some(ns.clone()),
                        rules: role_rules(&b.role_ref.kind, &b.role_ref.name, &ns),
                    });
                }
            }
            _ => {}
        }
    }
    assert!(!grants.is_empty(), "the chart binds nothing to {namespace}/{name}");
    grants
}

fn node(name: &str, tainted: bool, pod_cidr: &str) -> Node {
    let taints = if tainted {
        json!([{"key": "node.cloudprovider.kubernetes.io/uninitialized", "value": "true", "effect": "NoSchedule"}])
    } else {
        json!([])
    };
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name},
        "spec": {"podCIDR": pod_cidr, "podCIDRs": [pod_cidr], "taints": taints},
    }))
    .expect("a Node")
}

/// Two new, tainted, Ready Nodes (as their kubelets would register them).
async fn create_ready_nodes(nodes: &Api<Node>) {
    let ready = json!({"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
        "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}});
    for (name, cidr) in [("node-a", "10.244.1.0/24"), ("node-b", "10.244.2.0/24")] {
        nodes.create(&PostParams::default(), &node(name, true, cidr)).await.expect("node");
        nodes.patch_status(name, &PatchParams::default(), &Patch::Merge(&ready)).await.expect("node status");
    }
}

/// The harness's client, with its own user agent so its requests stay out of the proof.
fn harness_client(cluster: &TestCluster) -> Client {
    let mut config = cluster.kube_config();
    config.headers.push(("user-agent".parse().expect("a header name"), HARNESS_AGENT.parse().expect("a value")));
    Client::try_from(config).expect("a client")
}

/// Poll `check` until it holds or `timeout` passes; the error names the step.
async fn step<F, Fut>(what: &str, timeout: Duration, check: F) -> Result<(), String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    testkit::poll_within(timeout, check).await.ok_or_else(|| what.to_string())
}

/// How long a scenario that must pass waits for one step.
const RBAC_WAIT: Duration = Duration::from_secs(60);

/// The kinds of the chart's RBAC objects, applied on the genuine backend as rendered.
const RBAC_KINDS: &[(&str, &str, &str, &str)] = &[
    ("", "v1", "ServiceAccount", "serviceaccounts"),
    ("rbac.authorization.k8s.io", "v1", "ClusterRole", "clusterroles"),
    ("rbac.authorization.k8s.io", "v1", "Role", "roles"),
    ("rbac.authorization.k8s.io", "v1", "ClusterRoleBinding", "clusterrolebindings"),
    ("rbac.authorization.k8s.io", "v1", "RoleBinding", "rolebindings"),
];

/// Server-side applies the chart's ServiceAccounts, roles and bindings as rendered, leaving out
/// rule `without.1` of object `without.0` when given.
async fn apply_chart_rbac(client: &Client, objects: &[Value], without: Option<(usize, usize)>) {
    for (i, object) in objects.iter().enumerate() {
        let Some(&(group, version, kind, plural)) = RBAC_KINDS.iter().find(|(_, _, k, _)| object["kind"] == *k) else {
            continue;
        };
        let mut object = object.clone();
        if let Some((o, r)) = without
            && o == i
        {
            object["rules"].as_array_mut().expect("a role has rules").remove(r);
        }
        let ar = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural);
        let name = object["metadata"]["name"].as_str().expect("a name").to_string();
        let api: Api<DynamicObject> = if kind.starts_with("Cluster") {
            Api::all_with(client.clone(), &ar)
        } else {
            let ns = object["metadata"]["namespace"].as_str().unwrap_or(RELEASE_NAMESPACE).to_string();
            object["metadata"]["namespace"] = json!(ns);
            Api::namespaced_with(client.clone(), &ns, &ar)
        };
        api.patch(&name, &PatchParams::apply(HARNESS_AGENT).force(), &Patch::Apply(&object))
            .await
            .unwrap_or_else(|e| panic!("applying the chart's {kind} {name}: {e}"));
    }
}

/// Server-side applies the chart's admission policies and their bindings as rendered: the
/// scenarios then also show that the policies admit everything the operator does (issue 45).
async fn apply_chart_policies(client: &Client, objects: &[Value]) {
    for policy in
        objects.iter().filter(|o| o["kind"].as_str().is_some_and(|k| k.starts_with("ValidatingAdmissionPolicy")))
    {
        crate::kit::apply_dynamic(client, policy)
            .await
            .unwrap_or_else(|e| panic!("applying the chart's {} {}: {e}", policy["kind"], policy["metadata"]["name"]));
    }
}

/// The chart's objects with namespace `from` moved to `to` (its per-namespace Roles).
fn retarget(objects: &[Value], from: &str, to: &str) -> Vec<Value> {
    objects
        .iter()
        .cloned()
        .map(|mut o| {
            if o["metadata"]["namespace"] == from {
                o["metadata"]["namespace"] = json!(to);
            }
            o
        })
        .collect()
}

/// The ServiceAccount the chart runs the operator as, and its `--cloud-config-namespaces`.
fn operator_identity(objects: &[Value]) -> (String, Vec<String>) {
    let deployment = objects
        .iter()
        .find(|o| o["kind"] == "Deployment" && o["spec"]["template"]["spec"]["serviceAccountName"].is_string())
        .expect("the chart renders the operator Deployment");
    let pod = &deployment["spec"]["template"]["spec"];
    let account = pod["serviceAccountName"].as_str().unwrap_or_default().to_string();
    let namespaces = pod["containers"][0]["args"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| a.as_str()?.strip_prefix("--cloud-config-namespaces="))
        .flat_map(|v| v.split(','))
        .map(String::from)
        .collect();
    (account, namespaces)
}

/// Every rule the chart grants the operator's ServiceAccount: (object index, rule index, label).
fn operator_rule_sites(objects: &[Value]) -> Vec<(usize, usize, String)> {
    let (account, _) = operator_identity(objects);
    let mut sites = Vec::new();
    for binding in objects.iter().filter(|o| o["kind"] == "ClusterRoleBinding" || o["kind"] == "RoleBinding") {
        let binds = binding["subjects"].as_array().into_iter().flatten().any(|s| {
            s["kind"] == "ServiceAccount" && s["name"] == account.as_str() && s["namespace"] == RELEASE_NAMESPACE
        });
        if !binds {
            continue;
        }
        let role_kind = binding["roleRef"]["kind"].as_str().unwrap_or_default();
        let role = objects.iter().position(|o| {
            o["kind"] == role_kind
                && o["metadata"]["name"] == binding["roleRef"]["name"]
                && (role_kind == "ClusterRole" || o["metadata"]["namespace"] == binding["metadata"]["namespace"])
        });
        let Some(role) = role else { continue };
        for (r, rule) in objects[role]["rules"].as_array().into_iter().flatten().enumerate() {
            if sites.iter().any(|(o, i, _)| (*o, *i) == (role, r)) {
                continue;
            }
            let label = format!(
                "{} {}: {} {}/{}{}",
                role_kind,
                objects[role]["metadata"]["name"].as_str().unwrap_or_default(),
                rule["verbs"],
                rule["apiGroups"],
                rule["resources"],
                if rule["resourceNames"].is_array() {
                    format!(" names {}", rule["resourceNames"])
                } else {
                    String::new()
                },
            );
            sites.push((role, r, label));
        }
    }
    sites
}

/// The value of `flag` among the arguments the chart passes to the operator.
fn chart_arg(objects: &[Value], flag: &str) -> Option<String> {
    let prefix = format!("{flag}=");
    objects
        .iter()
        .filter(|o| o["kind"] == "Deployment")
        .flat_map(|o| o["spec"]["template"]["spec"]["containers"][0]["args"].as_array().cloned().unwrap_or_default())
        .find_map(|a| a.as_str()?.strip_prefix(&prefix).map(str::to_string))
}

/// The chart's operator's client configuration: its ServiceAccount's token on the genuine
/// backend, the admin on the local one (which authorizes nothing; there `prove` checks the
/// requests).
async fn operator_config(cluster: &TestCluster, objects: &[Value]) -> kube::Config {
    let (account, _) = operator_identity(objects);
    cluster.service_account(RELEASE_NAMESPACE, &account).await.expect("the operator's token").0
}

/// The token of [`SCRAPER`] (created on first use); `None` on the local backend, which serves
/// no TokenReview or SubjectAccessReview, so no endpoint there can check a token.
async fn scraper_token(cluster: &TestCluster) -> Option<String> {
    let plane = cluster.control_plane()?;
    let accounts: Api<ServiceAccount> = Api::namespaced(cluster.client(), RELEASE_NAMESPACE);
    let account: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": SCRAPER}})).expect("a ServiceAccount");
    // Already there after the first scenario of this binary: 409, fine.
    let _ = accounts.create(&PostParams::default(), &account).await;
    Some(plane.service_account_token(RELEASE_NAMESPACE, SCRAPER).await.expect("the scraper's token"))
}

/// On the genuine backend, the scraper bound to the chart's metrics-reader ClusterRole reads
/// `/metrics` of `whose` endpoint at `addr` within `timeout`: the endpoint lets it in only after
/// a TokenReview and a SubjectAccessReview made with the component's own credentials. The
/// error names the step and the last answer (401: token not reviewed, 403: not authorized,
/// 500: a review was refused).
async fn metrics_step(
    cluster: &TestCluster,
    whose: &str,
    addr: Option<SocketAddr>,
    timeout: Duration,
) -> Result<(), String> {
    let Some(token) = scraper_token(cluster).await else { return Ok(()) };
    let what = format!("the metrics reader scrapes {whose}'s /metrics");
    let addr = addr.ok_or_else(|| format!("{what} (no endpoint)"))?;
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let answer = ccm_framework::serving::probe::get(addr, "/metrics", Some(&token), Duration::from_secs(5)).await;
        if answer.as_ref().is_some_and(|r| r.status == 200 && r.body.contains("# TYPE")) {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            let last = answer.map_or("none".to_string(), |r| r.status.to_string());
            return Err(format!("{what} (last answer: {last})"));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Whether a logged request was made by the operator under test.
fn by_operator(cluster: &TestCluster, objects: &[Value]) -> impl Fn(&RequestRecord) -> bool + use<> {
    let user = format!("system:serviceaccount:{RELEASE_NAMESPACE}:{}", operator_identity(objects).0);
    let genuine = cluster.is_genuine();
    move |r| if genuine { r.user.as_deref() == Some(user.as_str()) } else { r.user_agent != HARNESS_AGENT }
}

/// The operator in-process as the chart runs it (its ServiceAccount, `--cloud-config-namespaces`,
/// its own election), leading within `timeout`.
async fn start_operator(
    cluster: &TestCluster,
    objects: &[Value],
    namespace: &str,
    timeout: Duration,
) -> Result<operator::OperatorHandle, String> {
    // RUST_LOG=operator=debug shows the operator's side when a scenario step times out.
    crate::kit::init_logging();
    let (_, namespaces) = operator_identity(objects);
    assert_eq!(namespaces, [CR_NAMESPACE], "the chart passes its cloudConfig.namespaces to the operator");
    let client_config = operator_config(cluster, objects).await;
    let mut config = operator::OperatorConfig::new(Client::try_from(client_config.clone()).expect("a client"));
    // The endpoint the chart's --http-address opens, on a free port: /metrics behind reviews
    // made with the operator's own token, as in the pod.
    let http = HttpConfig::new(SocketAddr::from(([127, 0, 0, 1], 0)))
        .with_auth(AuthConfig::new(AuthSettings::default()))
        .resolve_auth(&client_config)
        .await
        .map_err(|e| format!("the operator's endpoint is configured ({e})"))?;
    config.http = Some(http);
    config.cloud_config_namespaces = Some(vec![namespace.to_string()]);
    config.leader_election = Some(operator::OperatorConfig::operator_lease(RELEASE_NAMESPACE, &config.identity));
    config.timings.debounce = Duration::from_millis(200);
    // The manager image the chart passes (`--manager-image`), which its admission policies admit.
    if let Some(image) = chart_arg(objects, "--manager-image") {
        config.build.manager_image = image;
    }
    let handle = tokio::time::timeout(timeout, operator::start(config))
        .await
        .map_err(|_| "the operator starts".to_string())?
        .map_err(|e| format!("the operator starts ({e})"))?;
    match tokio::time::timeout(timeout, handle.wait_leading(true)).await {
        Ok(()) => Ok(handle),
        Err(_) => {
            let _ = tokio::time::timeout(Duration::from_secs(20), handle.stop()).await;
            Err("the operator leads".to_string())
        }
    }
}

fn ccm(namespace: &str, name: &str, spec: Value) -> crds::CloudControllerManager {
    serde_json::from_value(json!({
        "apiVersion": "ccm.rs/v1alpha1", "kind": "CloudControllerManager",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }))
    .expect("a CloudControllerManager")
}

fn condition_is(cr: &crds::CloudControllerManager, type_: &str, status: &str) -> bool {
    cr.status.as_ref().is_some_and(|s| s.conditions.iter().any(|c| c.type_ == type_ && c.status == status))
}

/// The namespaces the chart needs before install, and a cloud-config Secret in `namespace`.
async fn operator_world(client: &Client, namespace: &str) {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    for ns in [CR_NAMESPACE, RELEASE_NAMESPACE, namespace] {
        let _ = namespaces
            .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap())
            .await;
    }
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    secrets
        .patch(
            "fake-cloud-config",
            &PatchParams::apply(HARNESS_AGENT).force(),
            &Patch::Apply(&cloud_config_secret(namespace, "autoInstances: true\n")),
        )
        .await
        .expect("secret");
}

/// The fake provider's cloud-config Secret in `namespace`.
fn cloud_config_secret(namespace: &str, config: &str) -> Secret {
    testkit::cloud_config_secret(namespace, "fake-cloud-config", "cloud.conf", config.as_bytes())
}

/// Values the chart is rendered with: the resources live in [`CR_NAMESPACE`].
fn chart_values(embedded: bool) -> Value {
    json!({"replicas": 2, "cloudConfig": {"namespaces": [CR_NAMESPACE]}, "embedded": {"enabled": embedded},
        "metricsReader": {"subjects": [{"kind": "ServiceAccount", "name": SCRAPER, "namespace": RELEASE_NAMESPACE}]}})
}

/// The Deployment- and DaemonSet-mode scenario, in `namespace`, with an operator already
/// leading: each step waits at most `timeout`; the error names the step that did not happen.
async fn deployment_scenario(client: &Client, namespace: &str, timeout: Duration) -> Result<(), String> {
    let ccms: Api<crds::CloudControllerManager> = Api::namespaced(client.clone(), namespace);
    let spec = json!({"provider": "fake", "clusterCIDR": "10.244.0.0/16", "deployment": {"replicas": 2},
        "cloudConfig": {"secretRef": {"name": "fake-cloud-config"}}});
    ccms.create(&PostParams::default(), &ccm(namespace, "dep", spec)).await.expect("the CloudControllerManager");
    // A second resource the operator must refuse: an unknown provider.
    ccms.create(&PostParams::default(), &ccm(namespace, "unknown", json!({"provider": "nope"})))
        .await
        .expect("a second one");

    let deployments: Api<Deployment> = Api::namespaced(client.clone(), namespace);
    step("the finalizer is added", timeout, || async {
        ccms.get("dep").await.ok().is_some_and(|c| c.metadata.finalizers.is_some_and(|f| !f.is_empty()))
    })
    .await?;
    step("the manager Deployment exists", timeout, || async {
        deployments.get_opt("ccm-dep").await.ok().flatten().is_some()
    })
    .await?;
    let workload = operator::names::workload_name("dep");
    step("the manager's ServiceAccount, Role and bindings exist", timeout, || async {
        let sa = Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(client.clone(), namespace);
        let crb = Api::<ClusterRoleBinding>::all(client.clone());
        let roles = Api::<Role>::namespaced(client.clone(), namespace);
        let bindings = Api::<RoleBinding>::namespaced(client.clone(), namespace);
        let own = operator::names::own_role_name("dep");
        sa.get_opt(&workload).await.ok().flatten().is_some()
            && crb.get_opt(&operator::names::cluster_role_binding_name(namespace, "dep")).await.ok().flatten().is_some()
            && roles.get_opt(&own).await.ok().flatten().is_some()
            && bindings.get_opt(&own).await.ok().flatten().is_some()
            && bindings.get_opt(&operator::names::role_binding_name("dep")).await.ok().flatten().is_some()
    })
    .await?;
    step("the PodDisruptionBudget of two replicas exists", timeout, || async {
        Api::<PodDisruptionBudget>::namespaced(client.clone(), namespace)
            .get_opt("ccm-dep")
            .await
            .ok()
            .flatten()
            .is_some()
    })
    .await?;
    // Play the deployment controller and the manager's leader, so the resource becomes Available.
    let generation = deployments.get("ccm-dep").await.unwrap().metadata.generation.unwrap_or(1);
    let status = json!({"status": {"observedGeneration": generation, "replicas": 2, "updatedReplicas": 2,
        "readyReplicas": 2, "availableReplicas": 2, "conditions": [{"type": "Progressing", "status": "True",
        "reason": "NewReplicaSetAvailable"}, {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable"}]}});
    deployments
        .patch_status("ccm-dep", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("deployment status");
    let leases: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let now = serde_json::to_value(MicroTime(k8s_openapi::jiff::Timestamp::now())).unwrap();
    let lease: Lease =
        serde_json::from_value(json!({"metadata": {"name": "dep"}, "spec": {"holderIdentity": "ccm-dep-0",
        "leaseDurationSeconds": 60, "acquireTime": now, "renewTime": now}}))
        .unwrap();
    leases.create(&PostParams::default(), &lease).await.expect("lease");
    step("the resource is Available", timeout, || async {
        ccms.get_status("dep").await.ok().is_some_and(|c| condition_is(&c, "Available", "True"))
    })
    .await?;
    step("the unknown provider is reported", timeout, || async {
        ccms.get_status("unknown").await.ok().is_some_and(|c| condition_is(&c, "ConfigValid", "False"))
    })
    .await?;
    let events: Api<Event> = Api::namespaced(client.clone(), namespace);
    step("a ConfigInvalid event is recorded", timeout, || async {
        events.list(&Default::default()).await.is_ok_and(|l| {
            l.items.iter().any(|e| {
                e.reason.as_deref() == Some("ConfigInvalid")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("unknown")
            })
        })
    })
    .await?;

    // Rotate the cloud-config: a new pod template.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let rotated = serde_json::to_value(cloud_config_secret(namespace, "autoInstances: true\nbatchSize: 50\n")).unwrap();
    secrets.patch("fake-cloud-config", &PatchParams::default(), &Patch::Merge(&rotated)).await.expect("rotate");
    step("the resource rolls out the new cloud-config", timeout, || async {
        ccms.get_status("dep").await.ok().is_some_and(|c| condition_is(&c, "Progressing", "True"))
    })
    .await?;

    // Switch to DaemonSet mode: the Deployment and its budget are pruned.
    let to_daemonset = json!({"spec": {"mode": "DaemonSet"}});
    ccms.patch("dep", &PatchParams::default(), &Patch::Merge(&to_daemonset)).await.expect("mode switch");
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), namespace);
    // The Deployment serves until the DaemonSet can: play its controller, with a Node to run on.
    step("the DaemonSet exists beside the Deployment", timeout, || async {
        daemonsets.get_opt("ccm-dep").await.ok().flatten().is_some()
    })
    .await?;
    let generation = daemonsets.get("ccm-dep").await.unwrap().metadata.generation.unwrap_or(1);
    let status = json!({"status": {"observedGeneration": generation, "desiredNumberScheduled": 1,
        "currentNumberScheduled": 1, "updatedNumberScheduled": 1, "numberReady": 1, "numberAvailable": 1,
        "numberMisscheduled": 0}});
    daemonsets
        .patch_status("ccm-dep", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("daemonset status");
    step("the DaemonSet replaces the Deployment", timeout, || async {
        daemonsets.get_opt("ccm-dep").await.ok().flatten().is_some()
            && deployments.get_opt("ccm-dep").await.ok().flatten().is_none()
    })
    .await?;

    // Delete: the finalizer removes the ClusterRoleBinding, then lets the resource go.
    for name in ["dep", "unknown"] {
        ccms.delete(name, &DeleteParams::default()).await.expect("delete");
    }
    step("both resources are gone with their ClusterRoleBinding", timeout, || async {
        let crb = Api::<ClusterRoleBinding>::all(client.clone());
        ccms.get_opt("dep").await.ok().flatten().is_none()
            && ccms.get_opt("unknown").await.ok().flatten().is_none()
            && crb.get_opt(&operator::names::cluster_role_binding_name(namespace, "dep")).await.ok().flatten().is_none()
    })
    .await?;
    Ok(())
}

/// Removes what a failed scenario left in `namespace` (resources held by their finalizer).
async fn clean_up(client: &Client, namespace: &str) {
    let ccms: Api<crds::CloudControllerManager> = Api::namespaced(client.clone(), namespace);
    for cr in ccms.list(&Default::default()).await.map(|l| l.items).unwrap_or_default() {
        let name = cr.metadata.name.unwrap_or_default();
        let _ =
            ccms.patch(&name, &PatchParams::default(), &Patch::Merge(json!({"metadata": {"finalizers": null}}))).await;
        let _ = ccms.delete(&name, &DeleteParams::default()).await;
    }
}

/// The manager's arguments as the operator renders them (operator/src/build.rs), with fast
/// timings and its endpoint on `port`.
fn manager_args(
    cloud_config: &std::path::Path,
    kubeconfig: &std::path::Path,
    namespace: &str,
    port: u16,
) -> Vec<String> {
    vec![
        "cloud-controller-manager".into(),
        "--cloud-provider=fake".into(),
        format!("--cloud-config={}", cloud_config.display()),
        format!("--kubeconfig={}", kubeconfig.display()),
        "--controllers=*".into(),
        "--cluster-name=proof".into(),
        "--cluster-cidr=10.244.0.0/16".into(),
        "--configure-cloud-routes=true".into(),
        "--leader-elect=true".into(),
        format!("--leader-elect-resource-name={CR_NAME}"),
        format!("--leader-elect-resource-namespace={namespace}"),
        "--leader-elect-lease-duration=4s".into(),
        "--leader-elect-renew-deadline=3s".into(),
        "--leader-elect-retry-period=1s".into(),
        "--concurrent-node-syncs=2".into(),
        "--concurrent-service-syncs=2".into(),
        "--node-monitor-period=1s".into(),
        "--route-reconciliation-period=1s".into(),
        "--bind-address=127.0.0.1".into(),
        format!("--secure-port={port}"),
        format!("--ccm-resource={namespace}/{CR_NAME}"),
        "--ccm-resource-interval=1s".into(),
    ]
}

/// The manager scenario in `namespace`: the operator (as the chart runs it) binds the manager's
/// ServiceAccount for a Deployment-mode resource and stops; then the manager runs with that
/// ServiceAccount's kubeconfig, lets the metrics reader scrape its `/metrics` (genuine backend),
/// initializes two new Nodes, reports routes, deletes a Node
/// whose instance is gone, serves and cleans up a load balancer, and reports health. Returns the
/// manager's logged requests and the operator's Role for the resource, or the step that did not
/// happen within `timeout`.
async fn manager_scenario(
    cluster: &TestCluster,
    client: &Client,
    objects: &[Value],
    namespace: &str,
    timeout: Duration,
    removed: Option<&Value>,
) -> Result<(Vec<RequestRecord>, Role), String> {
    let ccms: Api<crds::CloudControllerManager> = Api::namespaced(client.clone(), namespace);
    let spec = json!({"provider": "fake", "clusterCIDR": "10.244.0.0/16",
        "cloudConfig": {"secretRef": {"name": "fake-cloud-config"}}});
    ccms.create(&PostParams::default(), &ccm(namespace, CR_NAME, spec)).await.expect("the CloudControllerManager");
    // The operator binds the manager's ServiceAccount; then it stops, so that what follows is
    // the manager's alone.
    let operator = start_operator(cluster, objects, namespace, Duration::from_secs(60)).await?;
    let own = operator::names::own_role_name(CR_NAME);
    let roles = Api::<Role>::namespaced(client.clone(), namespace);
    let bound = step("the operator binds the manager's ServiceAccount", Duration::from_secs(60), || async {
        Api::<ClusterRoleBinding>::all(client.clone())
            .get_opt(&operator::names::cluster_role_binding_name(namespace, CR_NAME))
            .await
            .ok()
            .flatten()
            .is_some()
            && roles.get_opt(&own).await.ok().flatten().is_some()
            && Api::<RoleBinding>::namespaced(client.clone(), namespace)
                .get_opt(&operator::names::role_binding_name(CR_NAME))
                .await
                .ok()
                .flatten()
                .is_some()
    })
    .await;
    let _ = tokio::time::timeout(Duration::from_secs(20), operator.stop()).await;
    bound?;
    let own_role = roles.get(&own).await.expect("the resource's own Role");
    let account = operator::names::workload_name(CR_NAME);
    if let Some(rule) = removed {
        let user = format!("system:serviceaccount:{namespace}:{account}");
        if !authorizer_denies(&cluster.client(), &user, namespace, rule).await {
            eprintln!("the authorizer still allows {user} what {rule} granted after 30 s");
        }
    }
    let (_, kubeconfig) = cluster.service_account(namespace, &account).await.expect("the manager's token");

    // Nodes are cluster-wide: named after the namespace, so that runs do not share them.
    let (node_a, node_b, node_gone) = (format!("{namespace}-a"), format!("{namespace}-b"), format!("{namespace}-gone"));
    let nodes: Api<Node> = Api::all(client.clone());
    let ready = json!({"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
        "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}});
    for (name, cidr) in [(&node_a, "10.244.1.0/24"), (&node_b, "10.244.2.0/24")] {
        nodes.create(&PostParams::default(), &node(name, true, cidr)).await.expect("node");
        nodes.patch_status(name, &PatchParams::default(), &Patch::Merge(&ready)).await.expect("node status");
    }
    nodes.create(&PostParams::default(), &node(&node_gone, false, "10.244.3.0/24")).await.expect("node");
    let not_ready = json!({"status": {"conditions": [{"type": "Ready", "status": "False", "reason": "KubeletStopped",
        "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}});
    nodes.patch_status(&node_gone, &PatchParams::default(), &Patch::Merge(&not_ready)).await.expect("node status");

    let dir = std::env::temp_dir().join(format!("rbac-proof-{}-{namespace}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cloud_config = dir.join("cloud.conf");
    std::fs::write(
        &cloud_config,
        format!("autoInstances: true\ninstances:\n  - name: {node_gone}\n    exists: false\n"),
    )
    .unwrap();

    // The manager with the arguments the operator gives it (operator/src/build.rs), fast timings,
    // its endpoint on a free port. A port found free can be taken before the manager binds it
    // (any process's outgoing connection may get it as its source port): a manager that ends
    // before its endpoint answers is started again on another port, its error shown.
    let log = cluster.request_log();
    let mut attempt = 0;
    let (manager, shutdown, mut outcome, mark) = loop {
        attempt += 1;
        let metrics_addr =
            std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port");
        let mark = log.mark();
        let args = manager_args(&cloud_config, &kubeconfig, namespace, metrics_addr.port());
        let settings = ccm_framework::program::flags::Flags::try_parse_from(&args)
            .expect("flags parse")
            .settings()
            .expect("settings");
        let shutdown = tokio_util::sync::CancellationToken::new();
        let mut manager =
            tokio::spawn(ccm_framework::program::app::run(ccm_builtin::registry(), settings, shutdown.clone()));
        tokio::select! {
            outcome = metrics_step(cluster, "the manager", Some(metrics_addr), timeout) => {
                break (manager, shutdown, outcome, mark);
            }
            ended = &mut manager => {
                let why = match ended {
                    Ok(Ok(())) => "it stopped".to_string(),
                    Ok(Err(e)) => e.to_string(),
                    Err(e) => e.to_string(),
                };
                assert!(attempt < 3, "the manager ended before its endpoint answered, {attempt} times: {why}");
                eprintln!("the manager ended before its endpoint answered ({why}); again on another port");
            }
        }
    };
    if outcome.is_ok() {
        outcome = manager_steps(client, &nodes, [&node_a, &node_b, &node_gone], namespace, timeout).await;
    }
    shutdown.cancel();
    if tokio::time::timeout(Duration::from_secs(20), manager).await.is_err() {
        eprintln!("the manager did not stop within 20 s");
    }
    let _ = std::fs::remove_dir_all(&dir);
    outcome?;

    Ok((requests_of(cluster, &log, mark, namespace, &account), own_role))
}

/// The manager's observable work (see [`manager_scenario`]).
async fn manager_steps(
    client: &Client,
    nodes: &Api<Node>,
    [node_a, node_b, node_gone]: [&String; 3],
    namespace: &str,
    timeout: Duration,
) -> Result<(), String> {
    step("the new Nodes are initialized", timeout, || async {
        for name in [node_a, node_b] {
            let initialized = nodes.get(name).await.ok().and_then(|n| n.spec).is_some_and(|s| {
                s.provider_id.is_some()
                    && s.taints.as_ref().is_none_or(|t| t.iter().all(|t| !t.key.ends_with("uninitialized")))
            });
            if !initialized {
                return false;
            }
        }
        true
    })
    .await?;
    step("routes are reported on the Nodes", timeout, || async {
        nodes
            .get(node_a)
            .await
            .ok()
            .and_then(|n| n.status)
            .and_then(|s| s.conditions)
            .is_some_and(|c| c.iter().any(|c| c.type_ == "NetworkUnavailable" && c.status == "False"))
    })
    .await?;
    step("the Node whose instance is gone is deleted", timeout, || async {
        nodes.get_opt(node_gone).await.ok().flatten().is_none()
    })
    .await?;

    // A load balancer, created and deleted.
    let services: Api<Service> = Api::namespaced(client.clone(), namespace);
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"type": "LoadBalancer", "selector": {"app": "web"}, "ports": [{"port": 80, "protocol": "TCP"}]},
    }))
    .unwrap();
    services.create(&PostParams::default(), &svc).await.expect("service");
    step("the Service gets a load-balancer address", timeout, || async {
        services
            .get("web")
            .await
            .ok()
            .and_then(|s| s.status)
            .and_then(|s| s.load_balancer)
            .and_then(|l| l.ingress)
            .is_some_and(|i| !i.is_empty())
    })
    .await?;
    let events: Api<Event> = Api::namespaced(client.clone(), namespace);
    step("an event about the Service's load balancer is recorded", timeout, || async {
        events
            .list(&Default::default())
            .await
            .is_ok_and(|l| l.items.iter().any(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("web")))
    })
    .await?;
    services.delete("web", &DeleteParams::default()).await.expect("delete service");
    step("the Service's load balancer is cleaned up", timeout, || async {
        services.get_opt("web").await.ok().flatten().is_none()
    })
    .await?;

    // Health reported on the resource.
    let ccms: Api<crds::CloudControllerManager> = Api::namespaced(client.clone(), namespace);
    step("ProviderHealthy is reported", timeout, || async {
        ccms.get_status(CR_NAME)
            .await
            .ok()
            .and_then(|c| c.status)
            .is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "ProviderHealthy" && c.status == "True"))
    })
    .await?;
    Ok(())
}

/// Waits (up to 30 s) until the genuine authorizer denies `user` the first verb on the first
/// resource of `rule` in `namespace`: RBAC's cache can lag behind a role just applied, and a
/// scenario run in that gap would still have the removed rule. False if it never does (another
/// rule grants the same, which the scenario then shows).
async fn authorizer_denies(client: &Client, user: &str, namespace: &str, rule: &Value) -> bool {
    use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
    let first =
        |field: &str| rule[field].as_array().and_then(|a| a.first()).and_then(Value::as_str).map(str::to_string);
    let (Some(verb), Some(group), Some(resource)) = (first("verbs"), first("apiGroups"), first("resources")) else {
        return true;
    };
    let (resource, subresource) = match resource.split_once('/') {
        Some((r, sub)) => (r.to_string(), Some(sub.to_string())),
        None => (resource, None),
    };
    let account_namespace = user.split(':').nth(2).unwrap_or_default();
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.to_string()),
            groups: Some(vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{account_namespace}"),
                "system:authenticated".into(),
            ]),
            resource_attributes: Some(ResourceAttributes {
                namespace: Some(namespace.to_string()),
                verb: Some(verb),
                group: Some(group),
                resource: Some(resource),
                subresource,
                name: first("resourceNames"),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let reviews = Api::<SubjectAccessReview>::all(client.clone());
    testkit::poll_within(Duration::from_secs(30), || async {
        reviews
            .create(&PostParams::default(), &review)
            .await
            .is_ok_and(|answer| answer.status.is_some_and(|s| !s.allowed))
    })
    .await
    .is_some()
}

/// The first request of `user` refused (403) since `mark` (genuine backend: the audit log): the
/// removed rule at work, so that a step that broke for another reason (a slow run) is not
/// taken as proof.
fn first_refusal(log: &testkit::RequestLog, mark: u64, user: &str) -> Option<String> {
    log.since(mark)
        .into_iter()
        .find(|r| r.status == 403 && r.user.as_deref() == Some(user))
        .map(|r| format!("{} {}", r.verb, r.path))
}

/// The rules of the chart's ClusterRoles `names`: (object index, rule index, label).
fn cluster_role_rule_sites(objects: &[Value], names: &[&str]) -> Vec<(usize, usize, String)> {
    let mut sites = Vec::new();
    for (o, object) in objects.iter().enumerate() {
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        if object["kind"] != "ClusterRole" || !names.contains(&name) {
            continue;
        }
        for (r, rule) in object["rules"].as_array().into_iter().flatten().enumerate() {
            let label = format!("ClusterRole {name}: {} {}/{}", rule["verbs"], rule["apiGroups"], rule["resources"]);
            sites.push((o, r, label));
        }
    }
    sites
}

testkit::backend_tests! {
    /// The manager, bound as the operator binds it (the operator itself, run as the chart runs
    /// it, creates the ServiceAccount and bindings), does its work: on the genuine backend with
    /// that ServiceAccount's token, and on both every request is checked against the rules.
    async fn manager_requests_are_allowed_by_the_manager_cluster_roles(backend) {
        let cluster = TestCluster::start(backend).await.expect("the API server starts");
        let client = harness_client(&cluster);
        operator_world(&client, CR_NAMESPACE).await;
        let Some(objects) = render_chart(&cluster.kubeconfig_path(), &chart_values(false)) else { return };
        if cluster.is_genuine() {
            apply_chart_rbac(&cluster.client(), &objects, None).await;
        }
        let (requests, own_role) = manager_scenario(&cluster, &client, &objects, CR_NAMESPACE, Duration::from_secs(60), None)
            .await
            .unwrap_or_else(|step| panic!("timed out waiting until {step}"));
        let grants = vec![
            Grant {
                source: "ccm-manager".into(),
                namespace: None,
                rules: cluster_role(&objects, "ccm-manager").rules.unwrap_or_default(),
            },
            Grant {
                source: format!("ccm-manager-namespace (RoleBinding in {CR_NAMESPACE})"),
                namespace: Some(CR_NAMESPACE.into()),
                rules: cluster_role(&objects, "ccm-manager-namespace").rules.unwrap_or_default(),
            },
            // The operator's: a Role on the resource's own Lease and status.
            Grant {
                source: format!("Role {} (by the operator)", own_role.metadata.name.clone().unwrap_or_default()),
                namespace: Some(CR_NAMESPACE.into()),
                rules: own_role.rules.unwrap_or_default(),
            },
        ];
        prove("cloud-controller-manager", &grants, &requests);
    }
}

testkit::backend_tests! {
    /// Every rule of the chart's manager ClusterRoles is needed: with any one removed (on the
    /// genuine backend, applied and enforced), a named step of the manager scenario breaks; on
    /// the local backend one full run's requests are checked against the reduced rules.
    async fn removing_any_rule_of_the_managers_rbac_breaks_a_named_scenario(backend) {
        let cluster = TestCluster::start(backend).await.expect("the API server starts");
        let client = harness_client(&cluster);
        operator_world(&client, CR_NAMESPACE).await;
        let Some(objects) = render_chart(&cluster.kubeconfig_path(), &chart_values(false)) else { return };
        let sites = cluster_role_rule_sites(&objects, &["ccm-manager", "ccm-manager-namespace"]);
        assert!(sites.len() >= 3, "the chart grants the manager {} rules", sites.len());
        let mut broken = Vec::new();
        let mut unbroken = Vec::new();
        if cluster.is_genuine() {
            for (object, rule, label) in &sites {
                let ns = cluster.fresh_namespace("rbac-manager").await.expect("a namespace");
                operator_world(&client, &ns).await;
                let objects = retarget(&objects, CR_NAMESPACE, &ns);
                apply_chart_rbac(&cluster.client(), &objects, Some((*object, *rule))).await;
                let leases: Api<Lease> = Api::namespaced(cluster.client(), RELEASE_NAMESPACE);
                let _ = leases.delete(operator::names::OPERATOR_LEASE, &DeleteParams::default()).await;
                let log = cluster.request_log();
                let mark = log.mark();
                let removed = &objects[*object]["rules"][*rule];
                let outcome =
                    manager_scenario(&cluster, &client, &objects, &ns, Duration::from_secs(10), Some(removed)).await;
                clean_up(&client, &ns).await;
                let manager = format!("system:serviceaccount:{ns}:{}", operator::names::workload_name(CR_NAME));
                match outcome {
                    Err(step) => match first_refusal(&log, mark, &manager) {
                        Some(refused) => broken.push(format!("{label}\n      breaks: {step}\n      first refused: {refused}")),
                        None => unbroken.push(format!("{label} (breaks {step}, but nothing was refused)")),
                    },
                    Ok(_) => unbroken.push(label.clone()),
                }
            }
            apply_chart_rbac(&cluster.client(), &objects, None).await;
        } else {
            let (requests, own_role) = manager_scenario(&cluster, &client, &objects, CR_NAMESPACE, Duration::from_secs(60), None)
                .await
                .unwrap_or_else(|step| panic!("timed out waiting until {step}"));
            for (object, rule, label) in &sites {
                if genuine_only(&objects[*object]["rules"][*rule]) {
                    eprintln!("genuine backend only: {label}");
                    continue;
                }
                let reduced = |name: &str| {
                    let mut role = cluster_role(&objects, name);
                    if objects[*object]["metadata"]["name"] == name {
                        role.rules.get_or_insert_default().remove(*rule);
                    }
                    role.rules.unwrap_or_default()
                };
                let grants = vec![
                    Grant { source: "ccm-manager".into(), namespace: None, rules: reduced("ccm-manager") },
                    Grant {
                        source: "ccm-manager-namespace".into(),
                        namespace: Some(CR_NAMESPACE.into()),
                        rules: reduced("ccm-manager-namespace"),
                    },
                    Grant {
                        source: "the resource's own Role".into(),
                        namespace: Some(CR_NAMESPACE.into()),
                        rules: own_role.rules.clone().unwrap_or_default(),
                    },
                ];
                let denied = requests.iter().find(|r| attributes(r).is_some_and(|a| allowed_by(&grants, &a).is_none()));
                match denied {
                    Some(r) => broken.push(format!("{label}\n      denies: {} {}", r.verb, r.path)),
                    None => unbroken.push(label.clone()),
                }
            }
        }
        eprintln!("{} rules, each removed in turn:\n  {}", sites.len(), broken.join("\n  "));
        assert!(unbroken.is_empty(), "removing these rules broke nothing:\n  {}", unbroken.join("\n  "));
    }
}

testkit::backend_tests! {
    /// The operator, run as the chart runs it, through Deployment and DaemonSet modes, a refused
    /// resource, a cloud-config rotation and deletion: with its ServiceAccount's token on the
    /// genuine backend, and every request checked against the chart's rules on both.
    async fn operator_requests_in_deployment_and_daemonset_modes_are_allowed_by_the_chart(backend) {
        let cluster = TestCluster::start(backend).await.expect("the API server starts");
        let client = harness_client(&cluster);
        operator_world(&client, CR_NAMESPACE).await;
        let Some(objects) = render_chart(&cluster.kubeconfig_path(), &chart_values(false)) else { return };
        let grants = grants_for_service_account(&objects, RELEASE_NAMESPACE, &operator_identity(&objects).0);
        if cluster.is_genuine() {
            apply_chart_rbac(&cluster.client(), &objects, None).await;
            apply_chart_policies(&cluster.client(), &objects).await;
        }
        let log = cluster.request_log();
        let mark = log.mark();
        let operator = start_operator(&cluster, &objects, CR_NAMESPACE, Duration::from_secs(60)).await.unwrap();
        let mut outcome = metrics_step(&cluster, "the operator", operator.local_addr(), Duration::from_secs(60)).await;
        if outcome.is_ok() {
            outcome = deployment_scenario(&client, CR_NAMESPACE, Duration::from_secs(60)).await;
        }
        let _ = tokio::time::timeout(Duration::from_secs(20), operator.stop()).await;
        if let Err(step) = outcome {
            panic!("timed out waiting until {step}");
        }
        let by_operator = by_operator(&cluster, &objects);
        let requests: Vec<RequestRecord> = log.since(mark).into_iter().filter(|r| by_operator(r)).collect();
        prove("ccm-operator (Deployment and DaemonSet modes)", &grants, &requests);
    }
}

testkit::backend_tests! {
    /// Every rule the chart grants the operator is needed: with any one removed, a named step of
    /// the Deployment/DaemonSet scenario breaks. On the genuine backend the scenario runs with
    /// the reduced RBAC applied (the genuine authorizer decides); on the local one the requests
    /// of one full run are checked against the reduced rules.
    async fn removing_any_rule_of_the_operators_rbac_breaks_a_named_scenario(backend) {
        let cluster = TestCluster::start(backend).await.expect("the API server starts");
        let client = harness_client(&cluster);
        operator_world(&client, CR_NAMESPACE).await;
        let Some(objects) = render_chart(&cluster.kubeconfig_path(), &chart_values(false)) else { return };
        let sites = operator_rule_sites(&objects);
        assert!(sites.len() >= 5, "the chart grants the operator {} rules", sites.len());
        let mut broken = Vec::new();
        let mut unbroken = Vec::new();
        if cluster.is_genuine() {
            for (object, rule, label) in &sites {
                let ns = cluster.fresh_namespace("rbac-ablate").await.expect("a namespace");
                operator_world(&client, &ns).await;
                let objects = retarget(&objects, CR_NAMESPACE, &ns);
                apply_chart_rbac(&cluster.client(), &objects, Some((*object, *rule))).await;
                // Each run starts with no operator Lease, so that an earlier run's operator that
                // did not release it in time cannot make this one wait.
                let leases: Api<Lease> = Api::namespaced(cluster.client(), RELEASE_NAMESPACE);
                let _ = leases.delete(operator::names::OPERATOR_LEASE, &DeleteParams::default()).await;
                let operator = format!("system:serviceaccount:{RELEASE_NAMESPACE}:{}", operator_identity(&objects).0);
                let removed = &objects[*object]["rules"][*rule];
                let rule_namespace = objects[*object]["metadata"]["namespace"].as_str().unwrap_or(&ns);
                if !authorizer_denies(&cluster.client(), &operator, rule_namespace, removed).await {
                    eprintln!("the authorizer still allows {operator} what {removed} granted after 30 s");
                }
                let timeout = Duration::from_secs(10);
                let log = cluster.request_log();
                let mark = log.mark();
                let outcome = match start_operator(&cluster, &objects, &ns, Duration::from_secs(30)).await {
                    Ok(operator) => {
                        let mut outcome = metrics_step(&cluster, "the operator", operator.local_addr(), timeout).await;
                        if outcome.is_ok() {
                            outcome = deployment_scenario(&client, &ns, timeout).await;
                        }
                        let _ = tokio::time::timeout(Duration::from_secs(20), operator.stop()).await;
                        outcome
                    }
                    Err(step) => Err(step),
                };
                clean_up(&client, &ns).await;
                match outcome {
                    Err(step) => match first_refusal(&log, mark, &operator) {
                        Some(refused) => broken.push(format!("{label}\n      breaks: {step}\n      first refused: {refused}")),
                        None => unbroken.push(format!("{label} (breaks {step}, but nothing was refused)")),
                    },
                    Ok(()) => unbroken.push(label.clone()),
                }
            }
            apply_chart_rbac(&cluster.client(), &objects, None).await;
        } else {
            let log = cluster.request_log();
            let mark = log.mark();
            let operator = start_operator(&cluster, &objects, CR_NAMESPACE, Duration::from_secs(60)).await.unwrap();
            let outcome = deployment_scenario(&client, CR_NAMESPACE, Duration::from_secs(60)).await;
            let _ = tokio::time::timeout(Duration::from_secs(20), operator.stop()).await;
            outcome.expect("the scenario passes with every rule");
            let by_operator = by_operator(&cluster, &objects);
            let requests: Vec<RequestRecord> = log.since(mark).into_iter().filter(|r| by_operator(r)).collect();
            let (account, _) = operator_identity(&objects);
            for (object, rule, label) in &sites {
                if genuine_only(&objects[*object]["rules"][*rule]) {
                    eprintln!("genuine backend only: {label}");
                    continue;
                }
                let mut reduced = objects.clone();
                reduced[*object]["rules"].as_array_mut().expect("rules").remove(*rule);
                let grants = grants_for_service_account(&reduced, RELEASE_NAMESPACE, &account);
                let denied = requests.iter().find(|r| attributes(r).is_some_and(|a| allowed_by(&grants, &a).is_none()));
                match denied {
                    Some(r) => broken.push(format!("{label}\n      denies: {} {}", r.verb, r.path)),
                    None => unbroken.push(label.clone()),
                }
            }
        }
        eprintln!("{} rules, each removed in turn:\n  {}", sites.len(), broken.join("\n  "));
        assert!(unbroken.is_empty(), "removing these rules broke nothing:\n  {}", unbroken.join("\n  "));
    }
}

testkit::backend_tests! {
    /// The operator in Embedded mode, run as the chart runs it with `embedded.enabled`: its
    /// engine initializes Nodes and the resource becomes Ready, then goes on deletion.
    async fn operator_requests_in_embedded_mode_are_allowed_by_the_chart(backend) {
        let cluster = TestCluster::start(backend).await.expect("the API server starts");
        let client = harness_client(&cluster);
        operator_world(&client, CR_NAMESPACE).await;
        let Some(objects) = render_chart(&cluster.kubeconfig_path(), &chart_values(true)) else { return };
        let grants = grants_for_service_account(&objects, RELEASE_NAMESPACE, &operator_identity(&objects).0);
        if cluster.is_genuine() {
            apply_chart_rbac(&cluster.client(), &objects, None).await;
            apply_chart_policies(&cluster.client(), &objects).await;
        }
        let nodes: Api<Node> = Api::all(client.clone());
        create_ready_nodes(&nodes).await;
        let log = cluster.request_log();
        let mark = log.mark();
        let operator = start_operator(&cluster, &objects, CR_NAMESPACE, Duration::from_secs(60)).await.unwrap();

        let ccms: Api<crds::CloudControllerManager> = Api::namespaced(client.clone(), CR_NAMESPACE);
        let spec = json!({"provider": "fake", "mode": "Embedded", "clusterCIDR": "10.244.0.0/16",
            "cloudConfig": {"secretRef": {"name": "fake-cloud-config"}}});
        ccms.create(&PostParams::default(), &ccm(CR_NAMESPACE, "emb", spec)).await.expect("the CloudControllerManager");
        eventually_within("the embedded engine initializes the Nodes", RBAC_WAIT, || async {
            for name in ["node-a", "node-b"] {
                let initialized = nodes.get(name).await.ok().and_then(|n| n.spec).is_some_and(|s| s.provider_id.is_some());
                if !initialized {
                    return false;
                }
            }
            true
        })
        .await;
        // Written by the engine inside the operator, through the manager's rules.
        eventually_within("the resource is Ready", RBAC_WAIT, || async {
            ccms.get_status("emb").await.ok().is_some_and(|c| condition_is(&c, "Ready", "True"))
        })
        .await;
        ccms.delete("emb", &DeleteParams::default()).await.expect("delete");
        eventually_within("the resource is gone", RBAC_WAIT, || async { ccms.get_opt("emb").await.ok().flatten().is_none() }).await;
        let _ = tokio::time::timeout(Duration::from_secs(20), operator.stop()).await;

        let by_operator = by_operator(&cluster, &objects);
        let requests: Vec<RequestRecord> = log.since(mark).into_iter().filter(|r| by_operator(r)).collect();
        prove("ccm-operator (Embedded mode)", &grants, &requests);
    }
}

#[test]
fn rbac_semantics() {
    let rule = |verbs: &[&str], groups: &[&str], resources: &[&str], names: &[&str]| PolicyRule {
        verbs: verbs.iter().map(|s| s.to_string()).collect(),
        api_groups: Some(groups.iter().map(|s| s.to_string()).collect()),
        resources: Some(resources.iter().map(|s| s.to_string()).collect()),
        resource_names: (!names.is_empty()).then(|| names.iter().map(|s| s.to_string()).collect()),
        non_resource_urls: None,
    };
    let attrs = |verb: &str, group: &str, resource: &str, sub: Option<&str>, name: Option<&str>| Attributes {
        verb: verb.into(),
        group: group.into(),
        resource: resource.into(),
        subresource: sub.map(Into::into),
        name: name.map(Into::into),
        namespace: Some("ns".into()),
    };
    let nodes = rule(&["get", "patch"], &[""], &["nodes"], &[]);
    assert!(rule_allows(&nodes, &attrs("get", "", "nodes", None, Some("n"))));
    assert!(!rule_allows(&nodes, &attrs("delete", "", "nodes", None, Some("n"))));
    // A subresource needs its own entry.
    assert!(!rule_allows(&nodes, &attrs("patch", "", "nodes", Some("status"), Some("n"))));
    assert!(rule_allows(
        &rule(&["patch"], &[""], &["nodes/status"], &[]),
        &attrs("patch", "", "nodes", Some("status"), None)
    ));
    // The group must match.
    assert!(!rule_allows(&rule(&["get"], &["apps"], &["nodes"], &[]), &attrs("get", "", "nodes", None, None)));
    // resourceNames: only that object, and never create or an unnarrowed list.
    let named = rule(&["get", "create", "list"], &["coordination.k8s.io"], &["leases"], &["mine"]);
    assert!(rule_allows(&named, &attrs("get", "coordination.k8s.io", "leases", None, Some("mine"))));
    assert!(!rule_allows(&named, &attrs("get", "coordination.k8s.io", "leases", None, Some("other"))));
    assert!(!rule_allows(&named, &attrs("create", "coordination.k8s.io", "leases", None, None)));
    assert!(!rule_allows(&named, &attrs("list", "coordination.k8s.io", "leases", None, None)));
    // A RoleBinding's grant applies only in its namespace.
    let grant = |ns: &str| Grant { source: "r".into(), namespace: Some(ns.into()), rules: vec![nodes.clone()] };
    assert!(allowed_by(&[grant("ns")], &attrs("get", "", "nodes", None, None)).is_some());
    assert!(allowed_by(&[grant("elsewhere")], &attrs("get", "", "nodes", None, None)).is_none());
    // A watch narrowed by field selector counts as that name.
    let record = RequestRecord {
        seq: 0,
        time: String::new(),
        verb: "watch".into(),
        method: "GET".into(),
        path: "/apis/apiextensions.k8s.io/v1/customresourcedefinitions".into(),
        query: "watch=true&fieldSelector=metadata.name%3Dcloudcontrollermanagers.ccm.rs".into(),
        resource: Some("customresourcedefinitions.apiextensions.k8s.io".into()),
        namespace: None,
        name: None,
        subresource: None,
        content_type: None,
        field_manager: None,
        user_agent: String::new(),
        status: 200,
        duration_ms: 0.0,
        ..Default::default()
    };
    let a = attributes(&record).unwrap();
    assert_eq!(a.group, "apiextensions.k8s.io");
    assert_eq!(a.name.as_deref(), Some("cloudcontrollermanagers.ccm.rs"));
}

/// The requests since `mark` of the component running as ServiceAccount `namespace/account`: on
/// the genuine backend by user (the audit log), on the local one every request but the
/// harness's (that server does not authenticate).
fn requests_of(
    cluster: &TestCluster,
    log: &testkit::RequestLog,
    mark: u64,
    namespace: &str,
    account: &str,
) -> Vec<RequestRecord> {
    let user = format!("system:serviceaccount:{namespace}:{account}");
    let genuine = cluster.is_genuine();
    log.since(mark)
        .into_iter()
        .filter(|r| if genuine { r.user.as_deref() == Some(user.as_str()) } else { r.user_agent != HARNESS_AGENT })
        .collect()
}

/// The announcer ServiceAccount, RoleBinding and ClusterRoleBinding the operator builds for a
/// `baremetal` resource named [`CR_NAME`] with `spec.announcer` in `namespace`, as JSON.
fn announcer_bindings(namespace: &str) -> Vec<Value> {
    let cr = json!({
        "apiVersion": "ccm.rs/v1alpha1", "kind": "CloudControllerManager",
        "metadata": {"name": CR_NAME, "namespace": namespace, "uid": "rbac-proof-announcer"},
        "spec": {"provider": "baremetal", "cloudConfig": {"secretRef": {"name": "cfg"}}, "announcer": {}},
    });
    let settings = crate::kit::announcing_settings("example.test/ccm:proof");
    crate::kit::operator_children_with(cr, &settings, crate::kit::BAREMETAL_ANNOUNCING.as_bytes())
        .iter()
        .filter(|d| {
            d.name().contains("announcer")
                && matches!(
                    d.kind(),
                    operator::build::Kind::ServiceAccount
                        | operator::build::Kind::RoleBinding
                        | operator::build::Kind::ClusterRoleBinding
                )
        })
        .map(|d| {
            let mut o = d.to_json();
            // Owned by a resource that is not stored: the garbage collector would remove them.
            o["metadata"].as_object_mut().expect("metadata").remove("ownerReferences");
            o
        })
        .collect()
}

/// A `LoadBalancer` Service of `class` whose ingress is `ip` (as the manager leaves it).
async fn announced_service(client: &Client, namespace: &str, class: &str, ip: &str) {
    let services: Api<Service> = Api::namespaced(client.clone(), namespace);
    let service: Service = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"type": "LoadBalancer", "loadBalancerClass": class, "ports": [{"port": 80, "protocol": "TCP"}]},
    }))
    .expect("a Service");
    services.create(&PostParams::default(), &service).await.expect("the Service");
    let status = json!({"status": {"loadBalancer": {"ingress": [{"ip": ip, "ipMode": "VIP"}]}}});
    services.patch_status("web", &PatchParams::default(), &Patch::Merge(&status)).await.expect("its ingress");
}

testkit::backend_tests! {
    /// The L2 announcer (issues 27 and 45), bound as the operator binds it (`spec.announcer`) to
    /// the chart's announcer ClusterRoles (`announcer.enabled`, with the pool rules of
    /// `manager.rbac.poolResources` and `importPools`), does its work with its own token: it
    /// reads its pools as it does in a pod (the mounted cloud-config, LoadBalancerIPPools,
    /// MetalLB's and Cilium's pools) and the Nodes, takes part through its Lease, claims the
    /// Service's address (inside its pools), reports `L2Announcing`, and deletes its Lease on a
    /// graceful stop; every request is checked against the rules, and on the genuine backend
    /// kube-apiserver's authorizer decided each, with the chart's admission policies in force
    /// (its Lease writes pass the announcer-leases policy, its records announcer-announcements);
    /// it records that its node answers (ServiceAnnouncement) and deletes the record on stop.
    async fn announcer_requests_are_allowed_by_the_announcer_cluster_roles(backend) {
        use ccm_provider_baremetal::announce::announce_reasons::L2_ANNOUNCING;
        use ccm_provider_baremetal::announce::announcer::{self, AnnouncerSettings, lease_name};
        use ccm_provider_baremetal::announce::{guard::HostFacts, sources};
        use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
        let cluster = TestCluster::start(backend).await.expect("the API server starts");
        let client = harness_client(&cluster);
        let namespace = cluster.fresh_namespace("announce-proof").await.expect("a namespace");
        operator_world(&client, &namespace).await;
        cluster.install_crd(&crds::pool_crd()).await.expect("the pool CRD");
        cluster.install_crd(&crds::announcement_crd()).await.expect("the announcement CRD");
        for crd in [
            stand_in_crd("metallb.io", "IPAddressPool", "ipaddresspools", true, "v1beta1"),
            stand_in_crd("cilium.io", "CiliumLoadBalancerIPPool", "ciliumloadbalancerippools", false, "v2"),
        ] {
            let crd: CustomResourceDefinition = serde_json::from_value(crd).expect("a CRD");
            cluster.install_crd(&crd).await.expect("a stand-in CRD");
        }
        let values = json!({"cloudConfig": {"namespaces": [CR_NAMESPACE]}, "announcer": {"enabled": true},
            "manager": {"rbac": {"poolResources": true, "importPools": true}},
            "metricsReader": {"subjects": [{"kind": "ServiceAccount", "name": SCRAPER, "namespace": RELEASE_NAMESPACE}]}});
        let Some(objects) = render_chart(&cluster.kubeconfig_path(), &values) else { return };
        if cluster.is_genuine() {
            apply_chart_rbac(&cluster.client(), &objects, None).await;
            for policy in objects.iter().filter(|o| o["kind"].as_str().is_some_and(|k| k.starts_with("ValidatingAdmissionPolicy"))) {
                crate::kit::apply_dynamic(&cluster.client(), policy).await.unwrap_or_else(|e| panic!("{}: {e}", policy["metadata"]["name"]));
            }
        }
        let bindings = announcer_bindings(&namespace);
        assert_eq!(bindings.len(), 3, "a ServiceAccount and two bindings: {bindings:?}");
        for o in &bindings {
            crate::kit::apply_dynamic(&client, o).await.unwrap_or_else(|e| panic!("{} {}: {e}", o["kind"], o["metadata"]["name"]));
        }
        let account = operator::names::announcer_name(CR_NAME);
        let (config, _) = cluster.service_account(&namespace, &account).await.expect("the announcer's token");
        let announcer_client = Client::try_from(config.clone()).expect("a client");
        let class = format!("ccm.rs/proof-{namespace}");
        announced_service(&client, &namespace, &class, "192.0.2.77").await;
        // Its pools as a pod mounts them: the cloud-config's (which holds 192.0.2.77), and the
        // pool resources and imports it reads with its own token.
        let dir = std::env::temp_dir().join(format!("rbac-announce-proof-{}-{namespace}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a directory");
        let path = dir.join("cloud.conf");
        let document = format!("{}  poolResources: true\n  importPools: [metallb, cilium]\n", crate::kit::BAREMETAL_ANNOUNCING);
        std::fs::write(&path, &document).expect("the cloud-config");
        let cloud_config = ccm_provider_baremetal::config::parse(document.as_bytes()).expect("a valid cloud-config");

        let log = cluster.request_log();
        let mark = log.mark();
        let node = format!("{namespace}-node");
        let cancel = tokio_util::sync::CancellationToken::new();
        let mut settings = AnnouncerSettings::new(node.clone(), namespace.clone());
        settings.facts = sources::spawn(announcer_client.clone(), cloud_config, sources::SourceSettings::new(&path), HostFacts::default, cancel.clone());
        settings.class = Some(class);
        settings.lease_duration = Duration::from_secs(2);
        settings.renew_interval = Duration::from_millis(500);
        settings.settle = Duration::from_millis(500);
        settings.record = true;
        let (tx, mut owned) = tokio::sync::watch::channel(BTreeSet::new());
        let events = ccm_framework::events::EventSink::spawn(announcer_client.clone(), Some(node.clone()), cancel.clone());
        let task = tokio::spawn(announcer::run(announcer_client, settings, tx, Some(events), cancel.clone()));
        let ip: std::net::IpAddr = "192.0.2.77".parse().expect("an address");
        // A bool, not the `Ref`: holding it would block the announcer's next send.
        let claimed = tokio::time::timeout(RBAC_WAIT, owned.wait_for(|o| o.contains(&ip))).await.is_ok_and(|r| r.is_ok());
        let event_api: Api<Event> = Api::namespaced(client.clone(), &namespace);
        let reported = step("the announcer reports L2Announcing on the Service", RBAC_WAIT, || async {
            event_api.list(&Default::default()).await.is_ok_and(|l| l.items.iter().any(|e| e.reason.as_deref() == Some(L2_ANNOUNCING)))
        })
        .await;
        // Its metrics endpoint (spec.announcer.metricsPort): reviews made with its own token, which
        // the chart's announcer role must allow (genuine backend; the local one reviews nothing).
        let endpoint = ccm_provider_baremetal::announce::node::serve_metrics(SocketAddr::from(([127, 0, 0, 1], 0)), &config, cancel.clone())
            .await
            .expect("the announcer's endpoint");
        {
            use ccm_provider_baremetal::announce::metrics::{self, AnnouncerGauges, Inputs};
            let gauges = AnnouncerGauges::register(&endpoint.1);
            let (_, sessions) = tokio::sync::watch::channel(Vec::new());
            let (_, health) = tokio::sync::watch::channel(Default::default());
            let inputs = Inputs { owned: owned.clone(), l2: true, bgp: None, sessions, health };
            tokio::spawn(metrics::run(gauges, inputs, cancel.clone()));
        }
        let scraped = metrics_step(&cluster, "the announcer", Some(endpoint.0), RBAC_WAIT).await;
        let records: Api<crds::ServiceAnnouncement> = Api::namespaced(client.clone(), &namespace);
        let recorded = step("the announcer records that its node answers (ServiceAnnouncement)", RBAC_WAIT, || async {
            records.list(&Default::default()).await.is_ok_and(|l| l.items.iter().any(|r| r.spec.node == node))
        })
        .await;
        cancel.cancel();
        let ended = tokio::time::timeout(Duration::from_secs(20), task).await;
        let _ = std::fs::remove_dir_all(&dir);
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        for name in ["ipaddresspools.metallb.io", "ciliumloadbalancerippools.cilium.io"] {
            let _ = crds.delete(name, &DeleteParams::default()).await;
        }
        assert!(claimed, "the announcer did not claim 192.0.2.77 within {RBAC_WAIT:?}");
        reported.unwrap_or_else(|step| panic!("timed out waiting until {step}"));
        recorded.unwrap_or_else(|step| panic!("timed out waiting until {step}"));
        scraped.unwrap_or_else(|step| panic!("timed out waiting until {step}"));
        assert!(matches!(ended, Ok(Ok(Ok(())))), "the announcer stopped without error: {ended:?}");
        assert!(records.list(&Default::default()).await.expect("read").items.is_empty(), "its records were deleted on stop");
        let leases: Api<Lease> = Api::namespaced(client.clone(), &namespace);
        assert!(leases.get_opt(&lease_name(&node)).await.expect("read").is_none(), "its Lease was deleted on stop");

        let requests = requests_of(&cluster, &log, mark, &namespace, &account);
        // The new rules were exercised: the Nodes, the pool resources and both imports.
        for resource in ["nodes", "loadbalancerippools", "ipaddresspools", "ciliumloadbalancerippools", "serviceannouncements"] {
            assert!(
                requests.iter().any(|r| {
                    // The request log names a grouped resource `plural.group`.
                    let named = r.resource.as_deref().is_some_and(|x| x == resource || x.starts_with(&format!("{resource}.")));
                    named && matches!(r.verb.as_str(), "list" | "watch")
                }),
                "the announcer never read {resource}: {:?}",
                requests.iter().map(|r| format!("{} {:?}", r.verb, r.resource)).collect::<Vec<_>>()
            );
        }
        let all: Vec<Value> = objects.iter().chain(&bindings).cloned().collect();
        let grants = grants_for_service_account(&all, &namespace, &account);
        prove("announcer", &grants, &requests);
    }
}

/// A stand-in CustomResourceDefinition named as MetalLB's or Cilium's pool (any spec kept).
fn stand_in_crd(group: &str, kind: &str, plural: &str, namespaced: bool, version: &str) -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.{group}")},
        "spec": {"group": group, "scope": if namespaced { "Namespaced" } else { "Cluster" },
            "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase(), "listKind": format!("{kind}List")},
            "versions": [{"name": version, "served": true, "storage": true, "schema": {"openAPIV3Schema": {
                "type": "object", "properties": {"spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}}]},
    })
}

testkit::backend_tests! {
    /// The chart's optional manager rules for the baremetal provider (`manager.rbac.poolResources`
    /// and `manager.rbac.importPools`, issue 27) are enough: a manager bound to the rendered
    /// `ccm-manager` ClusterRole, running with its ServiceAccount's token, reads a
    /// LoadBalancerIPPool and writes its status, reads Namespaces for the selector, imports a
    /// MetalLB pool and kube-vip-cloud-provider's ConfigMap (issue 47, through the chart's Role in
    /// the ConfigMap's namespace) and watches them, and gives a Service an address from each;
    /// every request is checked against the rules, and on the genuine backend kube-apiserver's
    /// authorizer decided. The kube-vip Role reads that one ConfigMap and no other.
    async fn pool_resource_and_import_rules_are_allowed_by_the_manager_cluster_role(backend) {
        use crds::pool::LoadBalancerIPPool;
        use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
        let cluster = TestCluster::start(backend).await.expect("the API server starts");
        let client = harness_client(&cluster);
        let namespace = cluster.fresh_namespace("pool-proof").await.expect("a namespace");
        operator_world(&client, &namespace).await;
        // The manager's namespace is a managed one, whose accounts the kube-vip Role is bound
        // to; kube-vip's ConfigMap is in it too (kube-system is shared between tests).
        let values = json!({"cloudConfig": {"namespaces": [CR_NAMESPACE, namespace]},
            "manager": {"rbac": {"poolResources": true, "importPools": true,
                "importKubeVip": {"namespace": namespace, "name": "kubevip"}}}});
        let Some(objects) = render_chart(&cluster.kubeconfig_path(), &values) else { return };
        if cluster.is_genuine() {
            apply_chart_rbac(&cluster.client(), &objects, None).await;
        }
        cluster.install_crd(&crds::pool_crd()).await.expect("the pool CRD");
        let configmaps: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(client.clone(), &namespace);
        for (name, cidr) in [("kubevip", "198.51.100.24/30"), ("not-kubevip", "198.51.100.28/30")] {
            let map = serde_json::from_value(json!({"metadata": {"name": name}, "data": {format!("cidr-{namespace}"): cidr}}))
                .expect("a ConfigMap");
            configmaps.create(&PostParams::default(), &map).await.expect("a ConfigMap");
        }
        for crd in [
            stand_in_crd("metallb.io", "IPAddressPool", "ipaddresspools", true, "v1beta1"),
            stand_in_crd("cilium.io", "CiliumLoadBalancerIPPool", "ciliumloadbalancerippools", false, "v2"),
        ] {
            let crd: CustomResourceDefinition = serde_json::from_value(crd).expect("a CRD");
            cluster.install_crd(&crd).await.expect("a stand-in CRD");
        }
        // The manager's account, bound as the operator binds a Deployment-mode manager (the
        // cluster-wide role; its Lease is not used here: leader election is off).
        let account = format!("ccm-{namespace}");
        let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": format!("ccm-operator:{namespace}:pool-proof")},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "ccm-manager"},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]});
        let sa = json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account, "namespace": namespace}});
        for o in [&sa, &binding] {
            crate::kit::apply_dynamic(&client, o).await.unwrap_or_else(|e| panic!("{}: {e}", o["kind"]));
        }
        let (_, kubeconfig) = cluster.service_account(&namespace, &account).await.expect("the manager's token");

        // A pool of ours (cluster-wide), a MetalLB pool in this namespace; the class keeps other
        // tests' Services on a shared server out of this manager's way.
        let class = format!("ccm.rs/{namespace}");
        let pools: Api<LoadBalancerIPPool> = Api::all(client.clone());
        let ours = format!("{namespace}-ours");
        let pool: LoadBalancerIPPool = serde_json::from_value(json!({"apiVersion": "ccm.rs/v1alpha1",
            "kind": "LoadBalancerIPPool", "metadata": {"name": ours}, "spec": {"cidrs": ["198.51.100.8/30"]}})).expect("a pool");
        pools.create(&PostParams::default(), &pool).await.expect("our pool");
        let metallb = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("metallb.io", "v1beta1", "IPAddressPool"), "ipaddresspools");
        let metallb_pools: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, &metallb);
        let imported: DynamicObject = serde_json::from_value(json!({"apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool",
            "metadata": {"name": "lan"}, "spec": {"addresses": ["198.51.100.16/30"]}})).expect("a MetalLB pool");
        metallb_pools.create(&PostParams::default(), &imported).await.expect("the MetalLB pool");

        let dir = std::env::temp_dir().join(format!("rbac-pool-proof-{}-{namespace}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a directory");
        let cloud_config = dir.join("cloud.conf");
        // MetalLB's pools are read from one namespace only (issue 45): this test's, here.
        let imports = format!("loadBalancer:\n  poolResources: true\n  importPools: [{{source: metallb, namespace: {namespace}}}, cilium, {{source: kubevip, namespace: {namespace}}}]\n");
        std::fs::write(&cloud_config, imports).expect("the cloud-config");
        let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
        let args: Vec<String> = vec![
            "cloud-controller-manager".into(),
            "--cloud-provider=baremetal".into(),
            format!("--cloud-config={}", cloud_config.display()),
            format!("--kubeconfig={}", kubeconfig.display()),
            "--controllers=service-lb-controller".into(),
            "--leader-elect=false".into(),
            format!("--load-balancer-class={class}"),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={port}"),
        ];
        let log = cluster.request_log();
        let mark = log.mark();
        let settings = ccm_framework::program::flags::Flags::try_parse_from(&args).expect("flags parse").settings().expect("settings");
        let shutdown = tokio_util::sync::CancellationToken::new();
        let manager = tokio::spawn(ccm_framework::program::app::run(ccm_builtin::registry(), settings, shutdown.clone()));

        let services: Api<Service> = Api::namespaced(client.clone(), &namespace);
        let service = |name: &str, annotations: Value| -> Service {
            serde_json::from_value(json!({"metadata": {"name": name, "annotations": annotations},
                "spec": {"type": "LoadBalancer", "loadBalancerClass": class, "ports": [{"port": 80, "protocol": "TCP"}]}}))
            .expect("a Service")
        };
        services.create(&PostParams::default(), &service("from-ours", json!({"ccm.rs/address-pool": ours}))).await.expect("a Service");
        services
            .create(&PostParams::default(), &service("from-metallb", json!({"metallb.io/address-pool": "lan"})))
            .await
            .expect("a Service");
        let kube_vip_pool = format!("kubevip:{namespace}/cidr-{namespace}");
        services
            .create(&PostParams::default(), &service("from-kubevip", json!({"ccm.rs/address-pool": kube_vip_pool})))
            .await
            .expect("a Service");
        let address = |name: &'static str| {
            let services = services.clone();
            async move {
                let s = services.get(name).await.ok()?;
                s.status?.load_balancer?.ingress?.first()?.ip.clone()
            }
        };
        let outcome = async {
            step("from-ours gets an address of the LoadBalancerIPPool", RBAC_WAIT, || async {
                address("from-ours").await.is_some_and(|ip| ip.starts_with("198.51.100.") && ip.rsplit('.').next().and_then(|o| o.parse::<u8>().ok()).is_some_and(|o| (8..12).contains(&o)))
            })
            .await?;
            step("from-metallb gets an address of the imported MetalLB pool", RBAC_WAIT, || async {
                address("from-metallb").await.is_some_and(|ip| ip.rsplit('.').next().and_then(|o| o.parse::<u8>().ok()).is_some_and(|o| (16..20).contains(&o)))
            })
            .await?;
            step("from-kubevip gets an address of kube-vip's ConfigMap", RBAC_WAIT, || async {
                address("from-kubevip").await.is_some_and(|ip| ip.rsplit('.').next().and_then(|o| o.parse::<u8>().ok()).is_some_and(|o| (24..28).contains(&o)))
            })
            .await?;
            step("the LoadBalancerIPPool's status counts the address", RBAC_WAIT, || async {
                pools.get(&ours).await.ok().and_then(|p| p.status).and_then(|s| s.ipv4).is_some_and(|u| u.assigned == 1)
            })
            .await
        }
        .await;
        shutdown.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(20), manager).await;
        let _ = std::fs::remove_dir_all(&dir);
        let _ = pools.delete(&ours, &DeleteParams::default()).await;
        // The harness's own requests (its user agent) stay out of the proof.
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        for name in ["ipaddresspools.metallb.io", "ciliumloadbalancerippools.cilium.io"] {
            let _ = crds.delete(name, &DeleteParams::default()).await;
        }
        outcome.unwrap_or_else(|step| panic!("timed out waiting until {step}"));

        let requests = requests_of(&cluster, &log, mark, &namespace, &account);
        let all: Vec<Value> = objects.iter().cloned().chain([binding]).collect();
        let grants = grants_for_service_account(&all, &namespace, &account);
        // The kube-vip ConfigMap was read and watched by name, as the Role allows.
        let read_kube_vip = |verb: &str| {
            requests.iter().filter_map(attributes).any(|a| {
                a.verb == verb && a.resource == "configmaps" && a.name.as_deref() == Some("kubevip")
            })
        };
        assert!(read_kube_vip("get") && read_kube_vip("watch"), "the manager read and watched kube-vip's ConfigMap");
        prove("cloud-controller-manager (baremetal pools)", &grants, &requests);
        // ... and no other ConfigMap: by the rules, and on the genuine backend by the authorizer.
        let configmap = |verb: &str, name: Option<&str>| Attributes {
            verb: verb.into(),
            group: String::new(),
            resource: "configmaps".into(),
            subresource: None,
            name: name.map(Into::into),
            namespace: Some(namespace.clone()),
        };
        for verb in ["get", "list", "watch"] {
            assert!(allowed_by(&grants, &configmap(verb, Some("kubevip"))).is_some(), "{verb} kubevip");
            assert!(allowed_by(&grants, &configmap(verb, Some("not-kubevip"))).is_none(), "{verb} not-kubevip");
        }
        assert!(allowed_by(&grants, &configmap("list", None)).is_none(), "listing every ConfigMap");
        let elsewhere = Attributes { namespace: Some(CR_NAMESPACE.into()), ..configmap("get", Some("kubevip")) };
        assert!(allowed_by(&grants, &elsewhere).is_none(), "a kubevip ConfigMap in another namespace");
        if cluster.is_genuine() {
            let (config, _) = cluster.service_account(&namespace, &account).await.expect("the manager's token");
            let as_manager: Api<k8s_openapi::api::core::v1::ConfigMap> =
                Api::namespaced(Client::try_from(config).expect("a client"), &namespace);
            as_manager.get("kubevip").await.expect("the manager may read kube-vip's ConfigMap");
            let forbidden = |r: Result<_, kube::Error>| matches!(r, Err(kube::Error::Api(s)) if s.code == 403);
            assert!(forbidden(as_manager.get("not-kubevip").await.map(|_| ())), "another ConfigMap is forbidden");
            assert!(forbidden(as_manager.list(&Default::default()).await.map(|_| ())), "listing ConfigMaps is forbidden");
        }
        let _ = configmaps.delete_collection(&DeleteParams::default(), &Default::default()).await;
    }
}
