//! What a stolen token can reach (issue 45, items 1 and 2), on the genuine kube-apiserver with
//! the chart's RBAC and admission policies applied as rendered, each request made with the
//! principal's own ServiceAccount token: the operator's token cannot delete or take over what
//! it does not own (`kube-proxy`, another ClusterRoleBinding, a Secret), cannot run a shell in
//! the `bird` container or a root, unconfined or pinned Pod, and cannot bind a manager role to
//! a ServiceAccount outside the managed namespaces; an announcer's token reaches only announcer
//! Leases. The local server enforces no admission, so these run on the genuine backend only.

use crate::kit::{
    BAREMETAL_ANNOUNCING, ChartWorld, announcing_settings, apply_as_operator, apply_dynamic, chart_world,
    dynamic_target, edited, install_chart_rbac_and_policies, operator_children_with,
};
use kube::Client;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use operator::build::{self, BuildSettings};
use serde_json::{Value, json};
use std::time::Duration;
use testkit::{Backend, TestCluster};

/// How a request ended, for the assertions: admitted, refused by an admission policy (its
/// message), refused by RBAC (its message), or another error.
enum Outcome {
    Admitted,
    Admission(String),
    Rbac(String),
    Other(String),
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outcome::Admitted => write!(f, "admitted"),
            Outcome::Admission(m) => write!(f, "refused by an admission policy: {m}"),
            Outcome::Rbac(m) => write!(f, "refused by RBAC: {m}"),
            Outcome::Other(m) => write!(f, "failed otherwise: {m}"),
        }
    }
}

fn outcome<T>(result: Result<T, kube::Error>) -> Outcome {
    match result {
        Ok(_) => Outcome::Admitted,
        Err(kube::Error::Api(status)) if status.message.contains("ValidatingAdmissionPolicy") => {
            Outcome::Admission(status.message)
        }
        Err(kube::Error::Api(status)) if status.code == 403 => Outcome::Rbac(status.message),
        Err(e) => Outcome::Other(e.to_string()),
    }
}

/// A dry-run delete of `object` as `client`: admission runs, nothing is deleted.
async fn delete_dry_run(client: &Client, object: &Value) -> Outcome {
    let (ar, namespace, name) = match dynamic_target(client, object).await {
        Ok(target) => target,
        Err(e) => return outcome::<()>(Err(e)),
    };
    let api: Api<DynamicObject> = match &namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    };
    outcome(api.delete(&name, &DeleteParams { dry_run: true, ..DeleteParams::default() }).await)
}

/// A dry-run server-side apply of `object` as the operator's field manager.
async fn apply_dry_run(client: &Client, object: &Value) -> Outcome {
    outcome(apply_as_operator(client, object, true).await)
}

/// The admission refusal of `request`, retried while it is admitted: the API server loads each
/// new policy and binding on its own, and under load that takes a while. Panics naming `what`
/// when it is still admitted after 60 s, or refused by something else.
async fn refused_by_admission<F, Fut>(what: &str, mut request: F) -> String
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Outcome>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        match request().await {
            Outcome::Admission(message) => return message,
            Outcome::Admitted if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(250)).await
            }
            other => panic!("{what}: expected a refusal by the chart's admission policies, got {other}"),
        }
    }
}

/// `object`'s JSON with its namespace and name, as the harness stores it.
async fn put(admin: &Client, object: &Value) {
    apply_dynamic(admin, object)
        .await
        .unwrap_or_else(|e| panic!("storing {} {}: {e}", object["kind"], object["metadata"]["name"]));
}

/// A stand-in for kube-proxy: a DaemonSet in kube-system whose pods never schedule.
fn kube_proxy() -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": "kube-proxy", "namespace": "kube-system", "labels": {"k8s-app": "kube-proxy"}},
        "spec": {"selector": {"matchLabels": {"k8s-app": "kube-proxy"}},
            "template": {"metadata": {"labels": {"k8s-app": "kube-proxy"}},
                "spec": {"nodeSelector": {"e2e.ccm.rs/never": "true"},
                         "containers": [{"name": "kube-proxy", "image": "registry.k8s.io/kube-proxy:v1.33.0"}]}}},
    })
}

/// The resource `cloud` of `namespace`, stored, as JSON with its UID: what the operator builds
/// must have a live owner (the garbage collector beside the genuine server removes the rest).
async fn stored_resource(admin: &Client, namespace: &str, spec: Value) -> Value {
    let resource = json!({"apiVersion": "ccm.rs/v1alpha1", "kind": "CloudControllerManager",
        "metadata": {"name": "cloud", "namespace": namespace}, "spec": spec});
    put(admin, &resource).await;
    let stored = Api::<crds::CloudControllerManager>::namespaced(admin.clone(), namespace)
        .get("cloud")
        .await
        .expect("the stored resource");
    serde_json::to_value(stored).expect("JSON")
}

/// What the operator builds for the stored `owner` given `spec` and `cloud_config`, as JSON.
fn built(owner: &Value, spec: Value, settings: &BuildSettings, cloud_config: &[u8]) -> Vec<Value> {
    let cr = json!({"apiVersion": "ccm.rs/v1alpha1", "kind": "CloudControllerManager",
        "metadata": {"name": owner["metadata"]["name"], "namespace": owner["metadata"]["namespace"],
                     "uid": owner["metadata"]["uid"]},
        "spec": spec});
    operator_children_with(cr, settings, cloud_config).iter().map(build::Desired::to_json).collect()
}

/// The operator's `--manager-image` as the chart renders it.
fn chart_manager_image(objects: &[Value]) -> String {
    objects
        .iter()
        .filter(|o| o["kind"] == "Deployment")
        .flat_map(|o| o["spec"]["template"]["spec"]["containers"][0]["args"].as_array().cloned().unwrap_or_default())
        .find_map(|a| a.as_str()?.strip_prefix("--manager-image=").map(str::to_string))
        .expect("the chart passes --manager-image")
}

/// Applies `objects` as the operator for real, each retried while RBAC's cache lacks a Role a
/// binding names; panics naming one not admitted within 30 s.
async fn admitted(client: &Client, objects: &[Value]) {
    let mut in_order = objects.to_vec();
    in_order.sort_by_key(|o| o["kind"] != "ServiceAccount" && o["kind"] != "Role");
    for object in &in_order {
        let started = tokio::time::Instant::now();
        while let Err(e) = apply_as_operator(client, object, false).await {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "the operator's own {} {} was not admitted: {e}",
                object["kind"],
                object["metadata"]["name"]
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

/// With the chart installed for kube-system (which stays possible), the operator's token is
/// refused, by admission, the DELETE of `kube-proxy` and of a ClusterRoleBinding it does not
/// own, and the takeover of `kube-proxy` by a patch; RBAC refuses it the DELETE of a Secret, and,
/// with the chart's defaults (a dedicated namespace), any Secret of kube-system. What it owns it
/// still deletes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operators_token_cannot_delete_or_take_over_what_it_does_not_own() {
    if !Backend::genuine_available() {
        eprintln!("SKIPPED: needs the genuine API server (CCM_TEST_ASSETS): admission policies");
        return;
    }
    let cluster = TestCluster::start(Backend::Genuine).await.expect("the API server starts");
    cluster.install_crd(&crds::crd()).await.expect("the CRD installs");
    let admin = cluster.client();
    let managers = cluster.fresh_namespace("e2e-bounds-cloud").await.unwrap();
    let release_ns = cluster.fresh_namespace("e2e-bounds-system").await.unwrap();
    let release = format!("bounds{}", std::process::id());
    put(&admin, &kube_proxy()).await;
    let foreign_binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": format!("e2e-not-the-operators-{}", std::process::id())},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
        "subjects": [{"kind": "ServiceAccount", "name": "someone", "namespace": "default"}]});
    put(&admin, &foreign_binding).await;
    let bootstrap_token = json!({"apiVersion": "v1", "kind": "Secret", "type": "bootstrap.kubernetes.io/token",
        "metadata": {"name": "bootstrap-token-e2e0ab", "namespace": "kube-system"},
        "stringData": {"token-id": "e2e0ab", "token-secret": "0123456789abcdef", "usage-bootstrap-authentication": "true"}});
    put(&admin, &bootstrap_token).await;
    let plain_secret = json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "not-a-cloud-config", "namespace": managers}, "stringData": {"k": "v"}});
    put(&admin, &plain_secret).await;

    let values = json!({"cloudConfig": {"namespaces": ["kube-system", managers]}});
    let Some((objects, operator)) = install_chart_rbac_and_policies(&cluster, &values, &release, &release_ns).await
    else {
        return;
    };
    let proxy = kube_proxy();
    let message = refused_by_admission("DELETE of kube-proxy", || delete_dry_run(&operator, &proxy)).await;
    assert!(message.contains("updates and deletes only its own objects"), "{message}");
    let message = refused_by_admission("DELETE of a ClusterRoleBinding it does not own", || {
        delete_dry_run(&operator, &foreign_binding)
    })
    .await;
    assert!(message.contains("updates and deletes only its own objects"), "{message}");
    // A takeover: kube-proxy patched into something labelled as the operator's.
    let taken = edited(&proxy, |d| {
        d["metadata"]["labels"]["app.kubernetes.io/managed-by"] = json!("ccm-operator");
        d["metadata"]["labels"]["ccm.rs/owner-uid"] = json!("made-up");
    });
    refused_by_admission("a patch taking kube-proxy over", || apply_dry_run(&operator, &taken)).await;
    // A takeover that every other rule admits: a ServiceAccount named like a manager's, which the
    // operator did not create, labelled as its own by a patch.
    let foreign_account = json!({"apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": "ccm-not-the-operators", "namespace": managers}});
    put(&admin, &foreign_account).await;
    let labelled = edited(&foreign_account, |a| {
        a["metadata"]["labels"] =
            json!({"app.kubernetes.io/managed-by": "ccm-operator", "ccm.rs/owner-uid": "made-up"});
    });
    let message =
        refused_by_admission("a patch taking a ServiceAccount over", || apply_dry_run(&operator, &labelled)).await;
    assert!(message.contains("updates and deletes only its own objects"), "{message}");
    // Nor a core component's Lease, which its Lease rights in kube-system would allow.
    let scheduler = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "kube-scheduler", "namespace": "kube-system"},
        "spec": {"holderIdentity": "control-plane-1_abc", "leaseDurationSeconds": 15}});
    put(&admin, &scheduler).await;
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(operator.clone(), "kube-system");
    let message = refused_by_admission("the operator's patch of the kube-scheduler Lease", || async {
        let params = PatchParams { dry_run: true, ..PatchParams::default() };
        outcome(
            leases.patch("kube-scheduler", &params, &Patch::Merge(json!({"spec": {"holderIdentity": "ccm"}}))).await,
        )
    })
    .await;
    assert!(message.contains("kube-scheduler is reserved"), "{message}");
    match delete_dry_run(&operator, &plain_secret).await {
        Outcome::Rbac(message) => assert!(message.contains("cannot delete resource \"secrets\""), "{message}"),
        other => panic!("DELETE of a Secret outside the operator's label: expected RBAC's refusal, got {other}"),
    }

    // What it owns it still deletes: a manager's ServiceAccount it created.
    let settings = BuildSettings { manager_image: chart_manager_image(&objects), ..BuildSettings::default() };
    let owner = stored_resource(
        &admin,
        &managers,
        json!({"provider": "fake", "clusterCIDR": "10.244.0.0/16", "cloudConfig": {"secretRef": {"name": "cfg"}}}),
    )
    .await;
    let spec = owner["spec"].clone();
    let children = built(&owner, spec, &settings, b"autoInstances: true\n");
    let account = children.iter().find(|o| o["kind"] == "ServiceAccount").expect("a ServiceAccount").clone();
    admitted(&operator, std::slice::from_ref(&account)).await;
    match delete_dry_run(&operator, &account).await {
        Outcome::Admitted => {}
        other => panic!("the operator's own ServiceAccount: expected its DELETE admitted, got {other}"),
    }

    // The chart's defaults: a dedicated managed namespace, so no Secret of kube-system is readable.
    let default_release = format!("boundsd{}", std::process::id());
    let default_ns = cluster.fresh_namespace("e2e-bounds-default").await.unwrap();
    let _ = put_namespace(&admin, "ccm-system").await;
    // Only the cluster-scoped names differ from the first release's: both are installed at once.
    let defaults = json!({"manager": {"rbac": {"clusterRoleName": "ccm-manager-defaults",
        "namespaceRoleName": "ccm-manager-namespace-defaults", "shadowClusterRoleName": "ccm-manager-shadow-defaults",
        "upstreamClusterRoleName": "ccm-manager-upstream-defaults",
        "nodeManagerClusterRoleName": "ccm-node-manager-defaults"}}});
    let Some((_, default_operator)) =
        install_chart_rbac_and_policies(&cluster, &defaults, &default_release, &default_ns).await
    else {
        return;
    };
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(default_operator, "kube-system");
    match outcome(secrets.get("bootstrap-token-e2e0ab").await) {
        Outcome::Rbac(message) => assert!(message.contains("cannot get resource \"secrets\""), "{message}"),
        other => panic!("reading a bootstrap token in kube-system with the chart's defaults: got {other}"),
    }
    for cleanup in [&foreign_binding, &bootstrap_token, &scheduler] {
        let _ = delete(&admin, cleanup).await;
    }
}

/// Creates namespace `name` unless it exists.
async fn put_namespace(admin: &Client, name: &str) -> Result<(), kube::Error> {
    apply_dynamic(admin, &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})).await
}

/// Deletes `object` as `client` (the harness's clean-up).
async fn delete(client: &Client, object: &Value) -> Result<(), kube::Error> {
    let (ar, namespace, name) = dynamic_target(client, object).await?;
    let api: Api<DynamicObject> = match &namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    };
    api.delete(&name, &DeleteParams::default()).await.map(drop)
}

/// With announcers allowed, everything the operator builds for an L2 and BGP announcer (with
/// BFD and graceful restart: BIRD as root with `NET_RAW`, its `preStop` hook and `-R`) is
/// admitted as its ServiceAccount, and the chart's policies refuse, naming the field: a shell
/// command in the `bird` container, BIRD as root without `NET_RAW` or with `NET_ADMIN`, another
/// hook or a hook elsewhere, an exec probe, a manager container running as root, a pod pinned to
/// a node by `nodeName`, an unconfined seccomp profile, capabilities not dropped, and a
/// ClusterRoleBinding of the manager role to a ServiceAccount outside the managed namespaces.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operators_token_cannot_run_a_shell_in_bird_or_an_unhardened_pod() {
    let bird = "example.test/bird:2";
    let Some(ChartWorld { cluster: _cluster, admin, managers, objects, operator }) =
        chart_world("e2e-bounds-pods", "boundsp", json!({"announcer": {"enabled": true, "birdImage": bird}})).await
    else {
        return;
    };
    let settings = announcing_settings(&chart_manager_image(&objects));
    let spec = json!({"provider": "baremetal", "cloudConfig": {"secretRef": {"name": "cfg"}},
                      "announcer": {"l2": true, "bgp": true, "metricsPort": 7473, "bfd": true, "gracefulRestart": true}});
    let owner = stored_resource(&admin, &managers, spec.clone()).await;
    let children = built(&owner, spec, &settings, BAREMETAL_ANNOUNCING.as_bytes());
    let announcer = children
        .iter()
        .find(|o| o["kind"] == "DaemonSet" && o["metadata"]["name"].as_str().is_some_and(|n| n.ends_with("-announcer")))
        .expect("the announcer DaemonSet")
        .clone();
    let manager = children.iter().find(|o| o["kind"] == "Deployment").expect("the manager Deployment").clone();
    let binding = children
        .iter()
        .find(|o| {
            o["kind"] == "ClusterRoleBinding"
                && !o["metadata"]["name"].as_str().unwrap_or_default().ends_with(":announcer")
        })
        .expect("the manager's ClusterRoleBinding")
        .clone();
    let bird_index = announcer["spec"]["template"]["spec"]["containers"]
        .as_array()
        .and_then(|c| c.iter().position(|c| c["name"] == "bird"))
        .expect("a bird container");

    let shell = edited(&announcer, |d| {
        d["spec"]["template"]["spec"]["containers"][bird_index]["command"] =
            json!(["sh", "-c", "cat /var/run/secrets/kubernetes.io/serviceaccount/token"]);
    });
    let message =
        refused_by_admission("a shell command in the bird container", || apply_dry_run(&operator, &shell)).await;
    assert!(message.contains("command"), "{message}");
    // The operator's own objects pass the same policies.
    admitted(&operator, &children).await;

    let crafted: Vec<(&str, Value, &str)> = vec![
        (
            "the bird container with extra arguments",
            edited(&announcer, |d| {
                d["spec"]["template"]["spec"]["containers"][bird_index]["args"] = json!(["-R"]);
            }),
            "command",
        ),
        (
            "a manager container running as root",
            edited(&manager, |d| {
                let sc = &mut d["spec"]["template"]["spec"]["containers"][0]["securityContext"];
                sc["runAsUser"] = json!(0);
                sc["runAsNonRoot"] = json!(false);
            }),
            "runAsNonRoot",
        ),
        (
            "the bird container running as root without NET_RAW",
            edited(&announcer, |d| {
                let sc = &mut d["spec"]["template"]["spec"]["containers"][bird_index]["securityContext"];
                assert_eq!(sc["runAsUser"], json!(0), "with bfd BIRD runs as root: {sc}");
                sc["capabilities"]["add"] = json!(null);
            }),
            "runAsNonRoot",
        ),
        (
            "NET_ADMIN in the bird container",
            edited(&announcer, |d| {
                d["spec"]["template"]["spec"]["containers"][bird_index]["securityContext"]["capabilities"]["add"] =
                    json!(["NET_ADMIN"]);
            }),
            "capabilities.add",
        ),
        (
            "another preStop command in the bird container",
            edited(&announcer, |d| {
                let hook = &mut d["spec"]["template"]["spec"]["containers"][bird_index]["lifecycle"]["preStop"];
                assert!(hook["exec"]["command"].is_array(), "with gracefulRestart BIRD has a preStop hook: {hook}");
                hook["exec"]["command"] =
                    json!(["sh", "-c", "cat /var/run/secrets/kubernetes.io/serviceaccount/token"]);
            }),
            "lifecycle",
        ),
        (
            "a postStart hook beside BIRD's preStop",
            edited(&announcer, |d| {
                d["spec"]["template"]["spec"]["containers"][bird_index]["lifecycle"]["postStart"] =
                    json!({"exec": {"command": ["birdc", "-s", "/run/bird/bird.ctl", "graceful", "restart"]}});
            }),
            "lifecycle",
        ),
        (
            "BIRD's preStop hook in the announcer container",
            edited(&announcer, |d| {
                let bird_hook = d["spec"]["template"]["spec"]["containers"][bird_index]["lifecycle"].clone();
                d["spec"]["template"]["spec"]["containers"][0]["lifecycle"] = bird_hook;
            }),
            "lifecycle",
        ),
        (
            "an exec probe in a manager container",
            edited(&manager, |d| {
                d["spec"]["template"]["spec"]["containers"][0]["livenessProbe"] =
                    json!({"exec": {"command": ["sh", "-c", "id"]}});
            }),
            "livenessProbe",
        ),
        (
            "a manager pod pinned to a node",
            edited(&manager, |d| d["spec"]["template"]["spec"]["nodeName"] = json!("control-plane-1")),
            "nodeName",
        ),
        (
            "an unconfined seccomp profile",
            edited(&manager, |d| {
                d["spec"]["template"]["spec"]["containers"][0]["securityContext"]["seccompProfile"] =
                    json!({"type": "Unconfined"});
            }),
            "seccompProfile",
        ),
        (
            "capabilities not dropped",
            edited(&manager, |d| {
                d["spec"]["template"]["spec"]["containers"][0]["securityContext"]["capabilities"]["drop"] = json!([]);
            }),
            "capabilities.drop",
        ),
        (
            "a manager started with another kubeconfig",
            edited(&manager, |d| with_arg(d, "--kubeconfig=/var/run/secrets/other/kubeconfig")),
            "args",
        ),
        (
            "a manager logging at trace level (the AWS SDK's signed requests)",
            edited(&manager, |d| with_arg(d, "--v=9")),
            "args",
        ),
        (
            "a manager serving on every address of the host",
            edited(&manager, |d| {
                for arg in d["spec"]["template"]["spec"]["containers"][0]["args"].as_array_mut().into_iter().flatten() {
                    if arg.as_str().is_some_and(|a| a.starts_with("--bind-address")) {
                        *arg = json!("--bind-address=0.0.0.0");
                    }
                }
            }),
            "args",
        ),
        (
            "a manager whose POD_IP is written by hand",
            edited(&manager, |d| {
                for env in d["spec"]["template"]["spec"]["containers"][0]["env"].as_array_mut().into_iter().flatten() {
                    if env["name"] == "POD_IP" {
                        *env = json!({"name": "POD_IP", "value": "0.0.0.0"});
                    }
                }
            }),
            "env",
        ),
        (
            "the manager role bound to a ServiceAccount outside the managed namespaces",
            edited(&binding, |b| b["subjects"][0]["namespace"] = json!("kube-system")),
            "subjects",
        ),
    ];
    for (what, object, field) in &crafted {
        let message = refused_by_admission(what, || apply_dry_run(&operator, object)).await;
        assert!(message.contains(field), "{what}: the refusal should name {field}: {message}");
    }
}

/// Appends `arg` to the first container's arguments of a workload.
fn with_arg(workload: &mut Value, arg: &str) {
    let args = &mut workload["spec"]["template"]["spec"]["containers"][0]["args"];
    if let Some(list) = args.as_array_mut() {
        list.push(json!(arg));
    } else {
        *args = json!([arg]);
    }
}

/// An announcer's token (bound as the operator binds it, with the chart's announcer roles and
/// admission policies) writes its own kind of Lease, `l2-announcer-<node>`, and nothing else of
/// its namespace: its patch of a `kube-scheduler` Lease there is refused, and so are a create and
/// a delete under other names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_announcers_token_reaches_only_announcer_leases() {
    use k8s_openapi::api::coordination::v1::Lease;
    let Some(ChartWorld { cluster, admin, managers, objects, operator }) =
        chart_world("e2e-bounds-leases", "boundsl", json!({"announcer": {"enabled": true}})).await
    else {
        return;
    };
    let settings = announcing_settings(&chart_manager_image(&objects));
    let spec = json!({"provider": "baremetal", "cloudConfig": {"secretRef": {"name": "cfg"}}, "announcer": {}});
    let owner = stored_resource(&admin, &managers, spec.clone()).await;
    let bindings: Vec<Value> = built(&owner, spec, &settings, BAREMETAL_ANNOUNCING.as_bytes())
        .into_iter()
        .filter(|o| {
            o["metadata"]["name"].as_str().is_some_and(|n| n.contains("announcer"))
                && ["ServiceAccount", "RoleBinding", "ClusterRoleBinding"].iter().any(|k| o["kind"] == *k)
        })
        .collect();
    assert_eq!(bindings.len(), 3, "a ServiceAccount and two bindings: {bindings:?}");
    admitted(&operator, &bindings).await;
    let account = operator::names::announcer_name("cloud");
    let (config, _) = cluster.service_account(&managers, &account).await.expect("the announcer's token");
    let announcer = Client::try_from(config).expect("a client");

    let scheduler = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "kube-scheduler", "namespace": managers},
        "spec": {"holderIdentity": "control-plane-1_abc", "leaseDurationSeconds": 15}});
    put(&admin, &scheduler).await;
    let leases: Api<Lease> = Api::namespaced(announcer.clone(), &managers);
    let take_over = json!({"spec": {"holderIdentity": "worker-7"}});
    let message = refused_by_admission("an announcer's patch of the kube-scheduler Lease", || async {
        let params = PatchParams { dry_run: true, ..PatchParams::default() };
        outcome(leases.patch("kube-scheduler", &params, &Patch::Merge(&take_over)).await)
    })
    .await;
    assert!(message.contains("l2-announcer-"), "{message}");
    let holder = Api::<Lease>::namespaced(admin.clone(), &managers).get("kube-scheduler").await.expect("the Lease");
    assert_eq!(holder.spec.and_then(|s| s.holder_identity).as_deref(), Some("control-plane-1_abc"));

    // Its own kind of Lease: created, renewed and deleted as the announcer does (apply, delete).
    let own = ccm_provider_baremetal::announce::announcer::lease_name("worker-7");
    let lease = |name: &str| {
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": name, "namespace": managers,
                         "labels": {(ccm_provider_baremetal::announce::announcer::LEASE_LABEL):
                                    ccm_provider_baremetal::announce::announcer::LEASE_LABEL_L2}},
            "spec": {"holderIdentity": "worker-7", "leaseDurationSeconds": 6}})
    };
    let apply = |name: &str| {
        let body = lease(name);
        let leases = leases.clone();
        let name = name.to_string();
        async move {
            let params = PatchParams::apply(ccm_provider_baremetal::announce::announcer::FIELD_MANAGER).force();
            outcome(leases.patch(&name, &params, &Patch::Apply(&body)).await)
        }
    };
    match apply(&own).await {
        Outcome::Admitted => {}
        other => panic!("the announcer's own Lease: expected it admitted, got {other}"),
    }
    let message = refused_by_admission("an announcer creating a Lease under another name", || apply("cloud")).await;
    assert!(message.contains("l2-announcer-"), "{message}");
    match outcome(leases.delete(&own, &DeleteParams::default()).await) {
        Outcome::Admitted => {}
        other => panic!("deleting its own Lease: got {other}"),
    }
    let message = refused_by_admission("an announcer deleting the kube-scheduler Lease", || async {
        outcome(leases.delete("kube-scheduler", &DeleteParams { dry_run: true, ..DeleteParams::default() }).await)
    })
    .await;
    assert!(message.contains("l2-announcer-"), "{message}");

    // Its ServiceAnnouncement records: under the announcer's own naming and label only (this
    // token names no node; the real cluster's Pod-bound token proves the node check).
    cluster.install_crd(&crds::announcement_crd()).await.expect("the announcement CRD");
    let records: Api<crds::ServiceAnnouncement> = Api::namespaced(announcer.clone(), &managers);
    let record = |name: &str, labelled: bool| {
        let labels = if labelled { json!({"ccm.rs/announcer": "l2"}) } else { json!({}) };
        json!({"apiVersion": "ccm.rs/v1alpha1", "kind": "ServiceAnnouncement",
            "metadata": {"name": name, "namespace": managers, "labels": labels},
            "spec": {"node": "worker-7", "service": {"namespace": "shop", "name": "web"}, "since": "2026-01-01T00:00:00.000000Z",
                     "addresses": [{"address": "192.0.2.7", "protocol": "ARP", "since": "2026-01-01T00:00:00.000000Z"}]}})
    };
    let write = |name: &str, labelled: bool| {
        let body = record(name, labelled);
        let (records, name) = (records.clone(), name.to_string());
        async move {
            let mut params = PatchParams::apply(ccm_provider_baremetal::announce::announcer::FIELD_MANAGER).force();
            params.dry_run = true;
            outcome(records.patch(&name, &params, &Patch::Apply(&body)).await)
        }
    };
    match write("worker-7.shop.web", true).await {
        Outcome::Admitted => {}
        other => panic!("the announcer's own record: expected it admitted, got {other}"),
    }
    let message =
        refused_by_admission("an announcer's record under another name", || write("worker-8.shop.web", true)).await;
    assert!(message.contains("metadata.name"), "{message}");
    let message =
        refused_by_admission("an announcer's record without its label", || write("worker-7.shop.web", false)).await;
    assert!(message.contains("ccm.rs/announcer=l2"), "{message}");
}

/// A manager in shadow mode is bound, as the operator binds it, to the chart's read-only
/// ClusterRole: its token reads Nodes and Services and may patch neither, nor a Service's
/// status; the operator's token may bind that role (and the policies admit it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_managers_token_reads_nodes_and_services_and_writes_none() {
    use k8s_openapi::api::core::v1::{Node, Service};
    let Some(ChartWorld { cluster, admin, managers, objects, operator }) =
        chart_world("e2e-bounds-shadow", "boundss", json!({})).await
    else {
        return;
    };
    let settings = BuildSettings { manager_image: chart_manager_image(&objects), ..BuildSettings::default() };
    let spec = json!({"provider": "fake", "shadow": true, "clusterCIDR": "10.244.0.0/16",
                      "cloudConfig": {"secretRef": {"name": "cfg"}}});
    let owner = stored_resource(&admin, &managers, spec.clone()).await;
    let children = built(&owner, spec, &settings, b"autoInstances: true\n");
    let rbac: Vec<Value> = children
        .into_iter()
        .filter(|o| ["ServiceAccount", "ClusterRoleBinding"].iter().any(|k| o["kind"] == *k))
        .collect();
    assert!(rbac.iter().any(|o| o["roleRef"]["name"] == "ccm-manager-shadow"), "{rbac:?}");
    admitted(&operator, &rbac).await;
    let (config, _) = cluster.service_account(&managers, "ccm-cloud").await.expect("the manager's token");
    let shadow = Client::try_from(config).expect("a client");

    let node_name = format!("shadow-proof-{}", std::process::id());
    put(&admin, &json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node_name}})).await;
    let service = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": managers},
        "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}});
    put(&admin, &service).await;
    let nodes: Api<Node> = Api::all(shadow.clone());
    let services: Api<Service> = Api::namespaced(shadow.clone(), &managers);
    // RBAC's cache may lag the binding a moment: wait until the reads pass.
    let mut read = false;
    for _ in 0..60 {
        if nodes.get(&node_name).await.is_ok() && services.list(&Default::default()).await.is_ok() {
            read = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(read, "the shadow manager reads Nodes and Services");
    let params = PatchParams { dry_run: true, ..PatchParams::default() };
    let label = json!({"metadata": {"labels": {"shadow": "wrote"}}});
    for (what, result) in [
        ("patch a Node", outcome(nodes.patch(&node_name, &params, &Patch::Merge(&label)).await)),
        (
            "delete a Node",
            outcome(nodes.delete(&node_name, &DeleteParams { dry_run: true, ..DeleteParams::default() }).await),
        ),
        ("patch a Service", outcome(services.patch("web", &params, &Patch::Merge(&label)).await)),
        (
            "patch a Service's status",
            outcome(
                services
                    .patch_status(
                        "web",
                        &params,
                        &Patch::Merge(json!({"status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.9"}]}}})),
                    )
                    .await,
            ),
        ),
    ] {
        match result {
            Outcome::Rbac(_) => {}
            other => panic!("a shadow manager's token may not {what}: got {other}"),
        }
    }
    let _ = delete(&admin, &json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node_name}})).await;
}
