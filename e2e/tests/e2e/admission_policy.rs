//! The chart's ValidatingAdmissionPolicies (issue 25, item 1) on the genuine kube-apiserver,
//! whose admission enforces them (the local server stores them and enforces nothing): with the
//! chart's RBAC and policies applied as rendered, everything the operator builds is admitted when
//! its ServiceAccount creates it, and crafted objects the operator's RBAC would allow but a
//! manager never needs are refused, each naming the field.

use crate::kit::{
    BAREMETAL_ANNOUNCING, ChartWorld, announcing_settings, apply_as_operator, apply_dynamic, chart_world, edited,
    operator_children, operator_children_with,
};
use kube::Client;
use kube::api::Api;
use operator::build::{self, BuildSettings};
use serde_json::{Value, json};
use std::time::Duration;

/// A server-side apply of `object` as `client` with the operator's field manager.
async fn apply_as(client: &Client, object: &Value) -> Result<(), kube::Error> {
    apply_as_operator(client, object, false).await
}

/// The same as a dry run: admission runs, nothing is stored.
async fn dry_run(client: &Client, object: &Value) -> Result<(), kube::Error> {
    apply_as_operator(client, object, true).await
}

/// The message of a refusal by a policy, or a panic naming what was admitted or how it failed.
fn refusal(what: &str, result: Result<(), kube::Error>) -> String {
    match result {
        Err(kube::Error::Api(status)) if status.code == 422 || status.code == 403 => status.message,
        other => panic!("{what}: expected a refusal by the admission policy, got {other:?}"),
    }
}

/// The refusal of `object` (a dry run as `client`), retried while it is admitted: the API
/// server loads each new policy and binding on its own, and under load that takes a while.
async fn refused_once_loaded(client: &Client, object: &Value, what: &str) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        match dry_run(client, object).await {
            Ok(()) if tokio::time::Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(250)).await,
            result => return refusal(what, result),
        }
    }
}

/// RBAC's answer when its cache lacks the Role a new RoleBinding names: a 404 naming the binding,
/// returned before admission runs.
/// The resource the operator builds for, in `namespace` in `mode`.
fn resource(namespace: &str, mode: &str) -> Value {
    json!({
        "apiVersion": "ccm.rs/v1alpha1", "kind": "CloudControllerManager",
        "metadata": {"name": "cloud", "namespace": namespace},
        "spec": {"provider": "fake", "mode": mode, "clusterCIDR": "10.244.0.0/16",
                 "cloudConfig": {"secretRef": {"name": "cfg"}}, "deployment": {"replicas": 2}},
    })
}

/// The stored resource `cloud` of `namespace`, as JSON (with its UID).
async fn stored_resource(admin: &Client, namespace: &str) -> Value {
    let stored = Api::<crds::CloudControllerManager>::namespaced(admin.clone(), namespace)
        .get("cloud")
        .await
        .expect("the stored resource");
    serde_json::to_value(stored).expect("JSON")
}

/// Applies `objects` in order as the operator, each retried as the operator's reconciles are:
/// RBAC checks a binding against its Role through the API server's informer cache, which may
/// not hold the Role created a moment ago. Panics naming an object not admitted within 30 s.
async fn admitted(client: &Client, objects: &[Value]) {
    for object in objects {
        let started = tokio::time::Instant::now();
        while let Err(e) = apply_as(client, object).await {
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

/// What the operator builds for the stored resource `owner` in `mode`, as JSON objects.
///
/// The owner must exist: kube-controller-manager's garbage collector, which runs beside the
/// genuine server, deletes children whose owner's UID is gone (with a made-up UID it deleted the
/// Role as soon as it was created, and the binding's escalation check then failed with 404).
fn operator_objects(owner: &Value, mode: &str, settings: &BuildSettings) -> Vec<Value> {
    let mut cr = resource(owner["metadata"]["namespace"].as_str().unwrap_or_default(), mode);
    cr["metadata"]["uid"] = owner["metadata"]["uid"].clone();
    operator_children(cr, settings).iter().map(build::Desired::to_json).collect()
}

/// What the operator builds for a `baremetal` resource with `spec.announcer` (L2 and BGP) under
/// the stored resource `owner`'s name and UID: its announcer objects only.
fn announcer_objects(owner: &Value, settings: &BuildSettings) -> Vec<Value> {
    let cr = json!({
        "apiVersion": "ccm.rs/v1alpha1", "kind": "CloudControllerManager",
        "metadata": {"name": owner["metadata"]["name"], "namespace": owner["metadata"]["namespace"],
                     "uid": owner["metadata"]["uid"]},
        "spec": {"provider": "baremetal", "cloudConfig": {"secretRef": {"name": "cfg"}},
                 "announcer": {"l2": true, "bgp": true, "metricsPort": 7473}},
    });
    operator_children_with(cr, settings, BAREMETAL_ANNOUNCING.as_bytes())
        .iter()
        .filter(|d| d.name().contains("announcer"))
        .map(build::Desired::to_json)
        .collect()
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chart_admission_policy_admits_what_the_operator_builds_and_refuses_what_a_manager_never_needs() {
    let Some(ChartWorld { cluster: _cluster, admin, managers, objects, operator: operator_client }) =
        chart_world("e2e-vap-cloud", "vap", json!({})).await
    else {
        return;
    };
    let settings = BuildSettings { manager_image: chart_manager_image(&objects), ..BuildSettings::default() };

    // The resource itself, stored, so that what the operator builds has a live owner.
    apply_dynamic(&admin, &resource(&managers, "Deployment")).await.expect("the resource is stored");
    let owner = stored_resource(&admin, &managers).await;
    let deployment_mode = operator_objects(&owner, "Deployment", &settings);
    let deployment = deployment_mode.iter().find(|o| o["kind"] == "Deployment").expect("a Deployment").clone();
    let role = deployment_mode.iter().find(|o| o["kind"] == "Role").expect("a Role").clone();
    let binding = deployment_mode.iter().find(|o| o["kind"] == "RoleBinding").expect("a RoleBinding").clone();

    // Wait until the workloads policy is loaded (bounded).
    let privileged = edited(&deployment, |d| {
        let sc = &mut d["spec"]["template"]["spec"]["containers"][0]["securityContext"];
        // The API server's own validation refuses privileged without privilege escalation.
        sc["privileged"] = json!(true);
        sc["allowPrivilegeEscalation"] = json!(true);
    });
    let message = refused_once_loaded(&operator_client, &privileged, "a privileged manager container").await;
    assert!(message.contains("securityContext.privileged"), "{message}");

    // Everything the operator builds is admitted as its ServiceAccount: Deployment mode applied
    // for real (the Role first, as a binding's role must exist for RBAC to check it), DaemonSet
    // mode as a dry run over it.
    let mut in_order = deployment_mode.clone();
    in_order.sort_by_key(|o| o["kind"] != "Role");
    admitted(&operator_client, &in_order).await;
    for object in &operator_objects(&owner, "DaemonSet", &settings) {
        if let Err(e) = dry_run(&operator_client, object).await {
            panic!("the policy refused the operator's own {} {}: {e}", object["kind"], object["metadata"]["name"]);
        }
    }

    let crafted: Vec<(&str, Value, &str)> = vec![
        (
            "an image outside the allow-list",
            edited(&deployment, |d| {
                d["spec"]["template"]["spec"]["containers"][0]["image"] = json!("docker.io/evil/miner:1")
            }),
            "image",
        ),
        (
            "an added capability",
            edited(&deployment, |d| {
                d["spec"]["template"]["spec"]["containers"][0]["securityContext"]["capabilities"]["add"] =
                    json!(["SYS_ADMIN"]);
            }),
            "capabilities.add",
        ),
        (
            "a hostPath volume",
            edited(&deployment, |d| {
                d["spec"]["template"]["spec"]["volumes"]
                    .as_array_mut()
                    .expect("volumes")
                    .push(json!({"name": "root", "hostPath": {"path": "/"}}));
            }),
            "spec.template.spec.volumes",
        ),
        ("host PID", edited(&deployment, |d| d["spec"]["template"]["spec"]["hostPID"] = json!(true)), "hostPID"),
        (
            "a pod that is not a manager's",
            edited(&deployment, |d| {
                // A new workload: the applied one's selector cannot change.
                d["metadata"]["name"] = json!("ccm-other");
                d["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"] = json!("something-else");
                d["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"] = json!("something-else");
            }),
            "spec.template.metadata.labels",
        ),
        (
            "another ServiceAccount",
            edited(&deployment, |d| d["spec"]["template"]["spec"]["serviceAccountName"] = json!("default")),
            "serviceAccountName",
        ),
        (
            "a workload without the operator's label",
            edited(&deployment, |d| {
                d["metadata"]["labels"].as_object_mut().expect("labels").remove("app.kubernetes.io/managed-by");
            }),
            "app.kubernetes.io/managed-by",
        ),
        (
            "a Role reading Secrets",
            edited(&role, |r| {
                r["rules"].as_array_mut().expect("rules").push(json!({"apiGroups": [""], "resources": ["secrets"],
                    "verbs": ["get"], "resourceNames": ["cfg"]}));
            }),
            "rules",
        ),
        (
            "a binding of the manager's Role to a user",
            edited(&binding, |b| {
                b["subjects"] = json!([{"kind": "User", "name": "mallory", "apiGroup": "rbac.authorization.k8s.io"}])
            }),
            "subjects",
        ),
    ];
    for (what, object, field) in &crafted {
        let message = refused_once_loaded(&operator_client, object, what).await;
        assert!(message.contains(field), "{what}: the refusal should name {field}: {message}");
    }
    // Without announcer.enabled an announcer DaemonSet (host network, NET_RAW) is refused.
    let announcer = announcer_objects(&owner, &announcing_settings(&settings.manager_image));
    let daemon_set = announcer.iter().find(|o| o["kind"] == "DaemonSet").expect("an announcer DaemonSet");
    let message = refused_once_loaded(&operator_client, daemon_set, "an announcer without announcer.enabled").await;
    assert!(message.contains("spec.template.metadata.labels"), "{message}");
    // The policies bind the operator's requests only: the cluster admin is not bound by them.
    dry_run(&admin, &privileged).await.expect("the admin's own request is not the operator's");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_announcer_enabled_the_policy_admits_the_announcer_and_net_raw_only_in_its_announcer_and_bird_containers()
{
    let bird = "example.test/bird:2";
    let Some(ChartWorld { cluster: _cluster, admin, managers, objects, operator: operator_client }) =
        chart_world("e2e-vap-announce", "vapa", json!({"announcer": {"enabled": true, "birdImage": bird}})).await
    else {
        return;
    };
    let settings = announcing_settings(&chart_manager_image(&objects));
    apply_dynamic(&admin, &resource(&managers, "Deployment")).await.expect("the resource is stored");
    let owner = stored_resource(&admin, &managers).await;
    let announcer = announcer_objects(&owner, &settings);
    let daemon_set = announcer.iter().find(|o| o["kind"] == "DaemonSet").expect("a DaemonSet").clone();
    let manager = operator_objects(&owner, "Deployment", &settings)
        .into_iter()
        .find(|o| o["kind"] == "Deployment")
        .expect("the manager Deployment");

    // Wait until the workloads policy is loaded (bounded), then everything built is admitted.
    let raw_manager = edited(&manager, |d| {
        d["spec"]["template"]["spec"]["containers"][0]["securityContext"]["capabilities"]["add"] = json!(["NET_RAW"]);
    });
    let message = refused_once_loaded(&operator_client, &raw_manager, "NET_RAW in a manager pod").await;
    assert!(message.contains("capabilities.add"), "{message}");
    admitted(&operator_client, &announcer).await;
    let binding = announcer.iter().find(|o| o["kind"] == "ClusterRoleBinding").expect("a ClusterRoleBinding").clone();
    let crafted: Vec<(&str, Value, &str)> = vec![
        (
            "NET_ADMIN in the BIRD container",
            edited(&daemon_set, |d| {
                d["spec"]["template"]["spec"]["containers"][1]["securityContext"]["capabilities"]["add"] =
                    json!(["NET_ADMIN"]);
            }),
            "capabilities.add",
        ),
        (
            "BIRD as root with a capability beside NET_RAW",
            edited(&daemon_set, |d| {
                d["spec"]["template"]["spec"]["containers"][1]["securityContext"]["capabilities"]["add"] =
                    json!(["NET_RAW", "NET_BIND_SERVICE"]);
                d["spec"]["template"]["spec"]["containers"][1]["securityContext"]["runAsUser"] = json!(0);
                d["spec"]["template"]["spec"]["containers"][1]["securityContext"]["runAsNonRoot"] = json!(false);
            }),
            "runAsNonRoot",
        ),
        (
            "NET_ADMIN in the announcer container",
            edited(&daemon_set, |d| {
                d["spec"]["template"]["spec"]["containers"][0]["securityContext"]["capabilities"]["add"] =
                    json!(["NET_ADMIN"]);
            }),
            "capabilities.add",
        ),
        (
            "the BIRD image in the announcer container",
            edited(&daemon_set, |d| d["spec"]["template"]["spec"]["containers"][0]["image"] = json!(bird)),
            "image",
        ),
        (
            "another image as BIRD",
            edited(&daemon_set, |d| {
                d["spec"]["template"]["spec"]["containers"][1]["image"] = json!("docker.io/evil/bird:1")
            }),
            "image",
        ),
        (
            "the announcer role bound to the manager's ServiceAccount",
            edited(&binding, |b| b["subjects"][0]["name"] = json!("ccm-cloud")),
            "subjects",
        ),
    ];
    for (what, object, field) in &crafted {
        let message = refused_once_loaded(&operator_client, object, what).await;
        assert!(message.contains(field), "{what}: the refusal should name {field}: {message}");
    }
}

/// Issue 48: what the operator builds for every upstream profile that can run (`spec.upstream`)
/// passes the chart's policies and RBAC as the operator's ServiceAccount (its workload, its
/// binding to the upstream ClusterRole, its Role with a profile's lock Lease), on the genuine
/// API server; a command no profile runs, or another `--authentication-*` argument, is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_upstream_profiles_objects_are_admitted_and_a_command_no_profile_runs_is_refused() {
    use crds::v1alpha1::UpstreamProfile;
    use operator::profiles;
    let runnable: Vec<&profiles::Profile> =
        UpstreamProfile::ALL.iter().map(|p| profiles::profile(*p)).filter(|p| p.refused.is_none()).collect();
    let generic_image = "registry.example/mycloud-ccm:v1.36.0";
    // Every profile's repository, and the generic one's, on the allow-list.
    let mut allowed: Vec<String> = runnable
        .iter()
        .filter(|p| !p.image.is_empty())
        .map(|p| p.image.rsplit_once(':').map(|(repo, _)| repo.to_string()).unwrap_or_default())
        .collect();
    allowed.push("registry.example/mycloud-ccm".into());
    // ... and the node managers' (Azure's cloud-node-manager).
    allowed.extend(
        runnable
            .iter()
            .filter_map(|p| p.node_manager)
            .filter_map(|n| n.image.rsplit_once(':').map(|(r, _)| r.to_string())),
    );
    // kube-system is where Azure's lock Lease is; the chart manages it besides the test's own.
    let Some(ChartWorld { cluster: _cluster, admin, managers, objects, operator: operator_client }) = chart_world(
        "e2e-vap-upstream",
        "vapup",
        json!({"admissionPolicy": {"allowedImages": allowed}, "cloudConfig": {"namespaces": ["kube-system"]}}),
    )
    .await
    else {
        return;
    };
    let mut settings = BuildSettings { manager_image: chart_manager_image(&objects), ..BuildSettings::default() };
    settings.policy.allowed_images = allowed.clone();

    let mut first_deployment = None;
    let mut node_manager = None;
    let mut created = Vec::new();
    for p in &runnable {
        let namespace = p.namespace.map(str::to_string).unwrap_or_else(|| managers.clone());
        // One resource per profile: a deleted owner's children go only when the collector runs.
        let name = format!("cloud-{}", p.profile.as_str());
        let provider = if p.cloud_provider.is_empty() { "mycloud" } else { p.cloud_provider };
        let mut cr = json!({
            "apiVersion": "ccm.rs/v1alpha1", "kind": "CloudControllerManager",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"provider": provider, "upstream": {"profile": p.profile.as_str()},
                     "cloudConfig": {"secretRef": {"name": "cfg"}}, "deployment": {"replicas": 2}},
        });
        if p.image.is_empty() {
            cr["spec"]["deployment"]["image"] = json!(generic_image);
        }
        apply_dynamic(&admin, &cr).await.expect("the resource is stored");
        let owner = Api::<crds::CloudControllerManager>::namespaced(admin.clone(), &namespace)
            .get(&name)
            .await
            .expect("the stored resource");
        cr["metadata"]["uid"] = json!(owner.metadata.uid);
        let mut built: Vec<Value> = operator_children(cr, &settings).iter().map(build::Desired::to_json).collect();
        built.sort_by_key(|o| o["kind"] != "Role");
        let deployment = built.iter().find(|o| o["kind"] == "Deployment").expect("a Deployment").clone();
        let command = deployment["spec"]["template"]["spec"]["containers"][0]["command"].clone();
        assert_eq!(command, if p.command.is_empty() { Value::Null } else { json!(p.command) }, "{:?}", p.profile);
        // A profile with a node manager runs it: its DaemonSet and binding are admitted too.
        let node_manager_ds = built.iter().find(|o| {
            o["kind"] == "DaemonSet" && o["metadata"]["name"].as_str().is_some_and(|n| n.ends_with("-node-manager"))
        });
        assert_eq!(node_manager_ds.is_some(), p.node_manager.is_some(), "{:?}", p.profile);
        if let Some(ds) = node_manager_ds {
            let binding = built
                .iter()
                .find(|o| {
                    o["kind"] == "ClusterRoleBinding"
                        && o["metadata"]["name"].as_str().is_some_and(|n| n.ends_with(":node-manager"))
                })
                .expect("the node manager's binding");
            node_manager = Some((
                ds.clone(),
                binding.clone(),
                deployment["spec"]["template"]["spec"]["serviceAccountName"].clone(),
            ));
        }
        // Applied for real: the bindings' escalation check needs the Roles to exist.
        admitted(&operator_client, &built).await;
        first_deployment.get_or_insert(deployment);
        created.push((namespace, name));
    }
    let deployment = first_deployment.expect("at least one profile");
    for (what, edit, field) in [
        ("a command no profile runs", json!({"command": ["/bin/sh", "-c", "id"]}), "command"),
        ("another --authentication-* argument", json!({"args": ["--authentication-kubeconfig=/tmp/k"]}), "args"),
    ] {
        let crafted = edited(&deployment, |d| {
            for (k, v) in edit.as_object().expect("an object") {
                d["spec"]["template"]["spec"]["containers"][0][k] = v.clone();
            }
        });
        let message = refused_once_loaded(&operator_client, &crafted, what).await;
        assert!(message.contains(field), "{what}: {message}");
    }
    // A node-manager pod runs a profile's node-manager command only, and the node managers'
    // role goes to a node manager's account only.
    let (ds, binding, manager_account) = node_manager.expect("a profile with a node manager");
    let crafted = edited(&ds, |d| {
        d["metadata"]["name"] = json!("ccm-crafted-node-manager");
        d["spec"]["template"]["spec"]["containers"][0]["command"] = json!(["cloud-controller-manager"]);
    });
    let message = refused_once_loaded(&operator_client, &crafted, "a node-manager pod running the manager").await;
    assert!(message.contains("command"), "{message}");
    let crafted = edited(&binding, |b| {
        b["metadata"]["name"] = json!("ccm-operator:crafted:node-manager");
        b["subjects"][0]["name"] = manager_account.clone();
    });
    let message = refused_once_loaded(&operator_client, &crafted, "the node managers' role bound to a manager").await;
    assert!(message.contains("node-manager ServiceAccounts"), "{message}");
    // kube-system outlives the test: leave no resource there.
    for (namespace, name) in created {
        let _ = Api::<crds::CloudControllerManager>::namespaced(admin.clone(), &namespace)
            .delete(&name, &Default::default())
            .await;
    }
}
