//! Operator security scenarios (issue 13): Secrets read only in the allowed namespaces (with the
//! chart's own RBAC on the genuine API server), a resource elsewhere refused with a reason that
//! says how to allow it, no cloud-config content in status, events or the operator's logs, a
//! hostile cloud-config never delaying a valid neighbour, and the manager pod admitted by the
//! `restricted` Pod Security admission of the genuine API server.

use std::time::{Duration, Instant};

use crate::kit::{Env, HARNESS_AGENT, LogCapture, condition, render_chart};
use crds::conditions::types;
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use operator::build::{BuildSettings, Desired};
use operator::reasons::config_valid;
use operator::{OperatorConfig, Scope};
use serde_json::{Value, json};
use testkit::{Backend, TestCluster, eventually, poll_within};

/// The recognizable value planted in cloud-configs.
const TOKEN: &str = "SECRET-TOKEN-12345";

/// A Secret with one key, in `namespace`.
async fn put_secret(client: &Client, namespace: &str, name: &str, value: &[u8]) {
    let secret = testkit::cloud_config_secret(namespace, name, "cloud.conf", value);
    Api::<Secret>::namespaced(client.clone(), namespace)
        .patch(name, &PatchParams::apply(HARNESS_AGENT).force(), &Patch::Apply(&secret))
        .await
        .unwrap_or_else(|e| panic!("Secret {namespace}/{name}: {e}"));
}

/// A CloudControllerManager in `namespace`, applied by the harness.
async fn put_cr(client: &Client, namespace: &str, name: &str, spec: Value) {
    let body = json!({"apiVersion": "ccm.rs/v1alpha1", "kind": "CloudControllerManager",
        "metadata": {"name": name, "namespace": namespace}, "spec": spec});
    Api::<crds::CloudControllerManager>::namespaced(client.clone(), namespace)
        .patch(name, &PatchParams::apply(HARNESS_AGENT).force(), &Patch::Apply(&body))
        .await
        .unwrap_or_else(|e| panic!("CloudControllerManager {namespace}/{name}: {e}"));
}

/// Whether `namespace/name`'s `ConfigValid` has this status and reason now.
async fn config_valid_is(client: &Client, namespace: &str, name: &str, status: &str, reason: &str) -> bool {
    let api = Api::<crds::CloudControllerManager>::namespaced(client.clone(), namespace);
    api.get_opt(name)
        .await
        .ok()
        .flatten()
        .and_then(|cr| condition(&cr, types::CONFIG_VALID))
        .is_some_and(|c| c.status == status && c.reason == reason)
}

testkit::backend_tests! {
    /// A resource in a namespace outside --cloud-config-namespaces gets ConfigValid=False
    /// NamespaceNotAllowed with a message naming the setting; its Secret there is never read,
    /// while a resource in an allowed namespace is served.
    async fn resource_outside_the_allowed_namespaces_is_refused_and_its_secret_never_read(backend) {
        let _capture = LogCapture::start();
        let env = Env::start(backend, "nsallow").await;
        let other = env.cluster.fresh_namespace("e2e-tenant").await.expect("a second namespace");
        put_secret(&env.harness, &env.ns, "cfg", b"autoInstances: true\n").await;
        put_secret(&env.harness, &other, "cfg", b"autoInstances: true\n").await;
        let mut config = env.operator_config();
        config.scope = Scope::Namespaces(vec![env.ns.clone(), other.clone()]);
        config.cloud_config_namespaces = Some(vec![env.ns.clone()]);
        let op = operator::start(config).await.expect("the operator starts");
        let spec = json!({"provider": "fake", "clusterCIDR": "10.244.0.0/16", "cloudConfig": {"secretRef": {"name": "cfg"}}});
        put_cr(&env.harness, &other, "tenant", spec.clone()).await;
        put_cr(&env.harness, &env.ns, "allowed", spec).await;

        eventually("the resource outside the allowed namespaces is refused", || async {
            config_valid_is(&env.harness, &other, "tenant", "False", config_valid::NAMESPACE_NOT_ALLOWED).await
        })
        .await;
        eventually("the resource in the allowed namespace is valid", || async {
            config_valid_is(&env.harness, &env.ns, "allowed", "True", config_valid::VALID).await
        })
        .await;
        let cr = Api::<crds::CloudControllerManager>::namespaced(env.harness.clone(), &other).get("tenant").await.unwrap();
        let message = condition(&cr, types::CONFIG_VALID).unwrap().message;
        assert!(message.contains("cloudConfig.namespaces") && message.contains("--cloud-config-namespaces"), "{message}");
        assert!(message.contains(&other) && message.contains(&env.ns), "{message}");
        // Nothing was deployed there, and no Secret request went to that namespace.
        let deployments: Api<k8s_openapi::api::apps::v1::Deployment> = Api::namespaced(env.harness.clone(), &other);
        assert!(deployments.list(&ListParams::default()).await.unwrap().items.is_empty());
        let secret_reads: Vec<_> = env
            .request_log()
            .filter(|r| r.user_agent != HARNESS_AGENT && r.resource.as_deref() == Some("secrets"))
            .into_iter()
            .filter(|r| r.namespace.as_deref() != Some(env.ns.as_str()))
            .map(|r| format!("{} {:?} {:?}", r.verb, r.namespace, r.name))
            .collect();
        assert!(secret_reads.is_empty(), "Secret requests outside the allowed namespace: {secret_reads:?}");
        let _ = tokio::time::timeout(Duration::from_secs(20), op.stop()).await;
        env.finish().await;
    }

    /// A recognizable token planted in every field of every built-in provider's cloud-config
    /// format (as values, keys, tags, anchors, malformed documents) never shows in any
    /// resource's status, in any event, or in the operator's logs at trace level.
    async fn a_token_in_every_cloud_config_field_never_reaches_status_events_or_logs(backend) {
        let _capture = LogCapture::start();
        let env = Env::start(backend, "token").await;
        let op = env.operator().await;
        let docs = token_documents();
        for (i, (provider, doc)) in docs.iter().enumerate() {
            let name = format!("t{i}");
            put_secret(&env.harness, &env.ns, &name, doc.as_bytes()).await;
            // Each with a LoadBalancer class of its own and nothing else, so none conflicts.
            let spec = json!({"provider": provider, "controllers": ["service-lb-controller"],
                "loadBalancerClass": format!("example.com/{name}"), "cloudConfig": {"secretRef": {"name": name}}});
            put_cr(&env.harness, &env.ns, &name, spec).await;
        }
        eventually("every resource has a ConfigValid verdict", || async {
            let list = env.crs().list(&ListParams::default()).await.unwrap();
            list.items.len() == docs.len()
                && list.items.iter().all(|cr| condition(cr, types::CONFIG_VALID).is_some_and(|c| c.status != "Unknown"))
        })
        .await;
        let crs = env.crs().list(&ListParams::default()).await.unwrap();
        let refused = crs
            .items
            .iter()
            .filter(|cr| condition(cr, types::CONFIG_VALID).is_some_and(|c| c.reason == config_valid::CLOUD_CONFIG_REJECTED))
            .count();
        let verdicts: Vec<String> = crs
            .items
            .iter()
            .filter_map(|cr| condition(cr, types::CONFIG_VALID).map(|c| format!("{}: {}", cr.name_any(), c.reason)))
            .collect();
        assert!(refused * 10 >= docs.len() * 9, "only {refused} of {} documents were refused: {verdicts:?}", docs.len());
        // Events are written in the background: wait until every refusal has one.
        let events: Api<k8s_openapi::api::events::v1::Event> = env.api();
        let all_events = poll_within(Duration::from_secs(30), || async {
            let list = events.list(&ListParams::default()).await.ok()?;
            (list.items.len() >= refused).then_some(list)
        })
        .await
        .expect("events are written");
        let core_events: Api<k8s_openapi::api::core::v1::Event> = env.api();
        let core = core_events.list(&ListParams::default()).await.unwrap();
        let outputs = [
            ("status", serde_json::to_string(&crs).unwrap()),
            ("events", serde_json::to_string(&all_events).unwrap()),
            ("core events", serde_json::to_string(&core).unwrap()),
            ("operator logs", crate::kit::captured_logs()),
        ];
        // Where it leaked, with the token masked: the ConfigValid message of each resource.
        let leaks: Vec<String> = crs
            .items
            .iter()
            .filter(|cr| serde_json::to_string(&cr.status).unwrap().contains("SECRET-TOKEN"))
            .map(|cr| {
                let message = condition(cr, types::CONFIG_VALID).map(|c| c.message).unwrap_or_default();
                format!("{}: {}", cr.name_any(), message.replace(TOKEN, "<TOKEN>"))
            })
            .collect();
        let mut leaks: Vec<String> = leaks.into_iter().map(|l| format!("status of {l}")).collect();
        for (what, text) in outputs {
            if text.contains("SECRET-TOKEN") {
                let lines = text.lines().filter(|l| l.contains("SECRET-TOKEN")).count();
                leaks.push(format!("{what} ({lines} lines)"));
            }
        }
        assert!(leaks.is_empty(), "cloud-config content leaked:\n  {}", leaks.join("\n  "));
        let _ = tokio::time::timeout(Duration::from_secs(20), op.stop()).await;
        env.finish().await;
    }

    /// A 100,000-level YAML document and a YAML alias bomb beside a valid resource: the valid one
    /// becomes Ready within twice its time alone, and the hostile ones are refused.
    async fn hostile_cloud_configs_never_delay_a_valid_neighbour(backend) {
        let _capture = LogCapture::start();
        let env = Env::start(backend, "hostile").await;
        let op = env.operator().await;
        env.secret("calm", "cloud.conf", "autoInstances: true\n").await;
        let calm = json!({"provider": "fake", "mode": "Embedded", "clusterCIDR": "10.244.0.0/16",
            "cloudConfig": {"secretRef": {"name": "calm"}}});

        let started = Instant::now();
        env.apply_cr("calm-a", calm.clone()).await;
        env.wait_condition("calm-a", types::READY, |c| c.status == "True").await;
        let alone = started.elapsed();
        env.crs().delete("calm-a", &DeleteParams::default()).await.unwrap();
        eventually("calm-a is gone", || async { env.crs().get_opt("calm-a").await.ok().flatten().is_none() }).await;

        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        let mut bomb = String::from("a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n");
        for (name, p) in ["b", "c", "d", "e", "f", "g", "h", "i"].into_iter().zip(["a", "b", "c", "d", "e", "f", "g", "h"]) {
            bomb.push_str(&format!("{name}: &{name} [*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p}]\n"));
        }
        put_secret(&env.harness, &env.ns, "deep", deep.as_bytes()).await;
        put_secret(&env.harness, &env.ns, "bomb", bomb.as_bytes()).await;
        for name in ["deep", "bomb"] {
            // Only a LoadBalancer class of its own, so a refused one never conflicts with calm-b.
            let spec = json!({"provider": "fake", "controllers": ["service-lb-controller"],
                "loadBalancerClass": format!("example.com/{name}"), "cloudConfig": {"secretRef": {"name": name}}});
            env.apply_cr(name, spec).await;
        }
        let started = Instant::now();
        env.apply_cr("calm-b", calm).await;
        env.wait_condition("calm-b", types::READY, |c| c.status == "True").await;
        let beside = started.elapsed();
        eprintln!("time to Ready alone: {alone:?}; beside the hostile documents: {beside:?} ({})", backend.name());
        // Twice the time alone; below one second the floor absorbs scheduling noise.
        let bound = alone.max(Duration::from_secs(1)) * 2;
        assert!(beside <= bound, "Ready took {beside:?} beside hostile documents, {alone:?} alone");
        for name in ["deep", "bomb"] {
            let c = env.wait_condition(name, types::CONFIG_VALID, |c| c.status == "False").await;
            assert_eq!(c.reason, config_valid::CLOUD_CONFIG_REJECTED, "{name}: {}", c.message);
        }
        let _ = tokio::time::timeout(Duration::from_secs(20), op.stop()).await;
        env.finish().await;
    }
}

/// Only a LoadBalancer class of its own, so resources of one scenario never conflict.
fn lb_only(class: &str) -> Value {
    json!({"provider": "fake", "controllers": ["service-lb-controller"], "loadBalancerClass": format!("example.com/{class}")})
}

/// The resourceVersion of a namespaced object of the scenario, `None` when it does not exist.
async fn version_of<K>(env: &Env, name: &str) -> Option<String>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    env.api::<K>().get_opt(name).await.expect("reading the object").and_then(|o| o.meta().resource_version.clone())
}

testkit::backend_tests! {
    /// A ServiceAccount, Deployment, RoleBinding or ClusterRoleBinding that exists under a
    /// child's name and was not created by the operator for this resource (unlabelled, or
    /// labelled for another resource) stops the resource with ConfigValid=False NameConflict
    /// naming the object; the object keeps its resourceVersion, nothing else is created for the
    /// resource, and deleting the resource does not delete the ClusterRoleBinding. A resource
    /// named `operator` cannot adopt a ServiceAccount `ccm-operator` (the operator's own, where
    /// it runs in the same namespace).
    async fn objects_not_owned_by_the_resource_stop_it_with_name_conflict_and_stay_unchanged(backend) {
        use k8s_openapi::api::apps::v1::Deployment;
        let _capture = LogCapture::start();
        let env = Env::start(backend, "takeover").await;
        let op = env.operator().await;
        let params = PostParams::default();
        let sa: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": "ccm-operator"}})).unwrap();
        env.api::<ServiceAccount>().create(&params, &sa).await.unwrap();
        let dep: Deployment = serde_json::from_value(json!({"metadata": {"name": "ccm-dep"}, "spec": {
            "selector": {"matchLabels": {"app": "mine"}},
            "template": {"metadata": {"labels": {"app": "mine"}},
                         "spec": {"containers": [{"name": "c", "image": "example.test/mine:1"}]}}}}))
        .unwrap();
        env.api::<Deployment>().create(&params, &dep).await.unwrap();
        let rb: RoleBinding = serde_json::from_value(json!({"metadata": {"name": "ccm-rb"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
            "subjects": [{"kind": "User", "name": "someone"}]}))
        .unwrap();
        env.api::<RoleBinding>().create(&params, &rb).await.unwrap();
        // Labelled as the operator's, but for another resource's UID: not this one's either.
        let crb_name = format!("ccm-operator:{}:crb", env.ns);
        let crb: ClusterRoleBinding = serde_json::from_value(json!({"metadata": {"name": crb_name,
                "labels": {"app.kubernetes.io/managed-by": "ccm-operator", "ccm.rs/owner-uid": "another-uid"}},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
            "subjects": [{"kind": "User", "name": "someone"}]}))
        .unwrap();
        let crbs = Api::<ClusterRoleBinding>::all(env.harness.clone());
        crbs.create(&params, &crb).await.unwrap();
        let before = (
            version_of::<ServiceAccount>(&env, "ccm-operator").await,
            version_of::<Deployment>(&env, "ccm-dep").await,
            version_of::<RoleBinding>(&env, "ccm-rb").await,
            crbs.get(&crb_name).await.unwrap().resource_version(),
        );

        let taken = [
            ("operator", format!("ServiceAccount {}/ccm-operator", env.ns)),
            ("dep", format!("Deployment {}/ccm-dep", env.ns)),
            ("rb", format!("RoleBinding {}/ccm-rb", env.ns)),
            ("crb", format!("ClusterRoleBinding {crb_name}")),
        ];
        for (name, _) in &taken {
            env.apply_cr(name, lb_only(name)).await;
        }
        for (name, object) in &taken {
            let c = env.wait_status(name, types::CONFIG_VALID, "False", config_valid::NAME_CONFLICT).await;
            assert!(c.message.starts_with(&format!("{object} already exists and is not owned by this")), "{name}: {}", c.message);
            assert!(!c.message.contains("someone") && !c.message.contains("example.test/mine"), "no content: {}", c.message);
        }
        // A neighbour without a taken name is served meanwhile.
        env.apply_cr("free", lb_only("free")).await;
        env.wait_status("free", types::CONFIG_VALID, "True", config_valid::VALID).await;
        eventually("the free resource's Deployment exists", || async { crate::kit::exists::<Deployment>(&env, "ccm-free").await }).await;
        // Another reconcile of each (a spec edit) still leaves everything as it was.
        for (name, _) in &taken {
            let mut spec = lb_only(name);
            spec["clusterName"] = json!("edited");
            env.apply_cr(name, spec).await;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        let after = (
            version_of::<ServiceAccount>(&env, "ccm-operator").await,
            version_of::<Deployment>(&env, "ccm-dep").await,
            version_of::<RoleBinding>(&env, "ccm-rb").await,
            crbs.get(&crb_name).await.unwrap().resource_version(),
        );
        assert_eq!(before, after, "an object the resources do not own was modified");
        // Nothing was created for the refused resources: no binding of the manager role to the
        // taken ServiceAccount, no workload.
        assert!(!crate::kit::crb_exists(&env, "operator").await, "the manager role was bound to ccm-operator");
        assert!(!crate::kit::exists::<Deployment>(&env, "ccm-operator").await);
        assert!(!crate::kit::exists::<ServiceAccount>(&env, "ccm-dep").await);
        let sa = env.api::<ServiceAccount>().get("ccm-operator").await.unwrap();
        assert!(sa.owner_references().is_empty(), "the ServiceAccount was adopted: {:?}", sa.owner_references());

        // Deleting the resource leaves the ClusterRoleBinding it did not create.
        env.crs().delete("crb", &DeleteParams::default()).await.unwrap();
        eventually("the resource is gone", || async { env.crs().get_opt("crb").await.ok().flatten().is_none() }).await;
        let still = crbs.get_opt(&crb_name).await.unwrap().expect("the ClusterRoleBinding not owned survives");
        assert_eq!(still.resource_version(), before.3);
        let _ = crbs.delete(&crb_name, &DeleteParams::default()).await;
        let _ = tokio::time::timeout(Duration::from_secs(20), op.stop()).await;
        env.finish().await;
    }

    /// A resource named like a core component's leader-election Lease (`kube-controller-manager`
    /// in Deployment mode, `kube-scheduler` in Embedded mode, where the operator itself would
    /// compete) is refused with ConfigValid=False ReservedName naming metadata.name: the Lease
    /// keeps its holder and resourceVersion, and no Role granting update on it is created.
    async fn a_resource_named_like_a_core_components_lease_cannot_touch_that_lease(backend) {
        use k8s_openapi::api::coordination::v1::Lease;
        let _capture = LogCapture::start();
        let env = Env::start(backend, "reserved").await;
        let op = env.operator().await;
        let leases = env.api::<Lease>();
        for name in ["kube-controller-manager", "kube-scheduler"] {
            let lease: Lease = serde_json::from_value(json!({"metadata": {"name": name},
                // Expired a second from now: an engine competing for it would take it over.
                "spec": {"holderIdentity": format!("{name}-node-1"), "leaseDurationSeconds": 1,
                         "renewTime": crate::kit::micro_now(), "acquireTime": crate::kit::micro_now()}}))
            .unwrap();
            leases.create(&PostParams::default(), &lease).await.unwrap();
        }
        let before: Vec<_> = [
            leases.get("kube-controller-manager").await.unwrap(),
            leases.get("kube-scheduler").await.unwrap(),
        ]
        .into_iter()
        .map(|l| (l.resource_version(), l.spec.and_then(|s| s.holder_identity)))
        .collect();
        env.apply_cr("kube-controller-manager", lb_only("kcm")).await;
        let mut embedded = lb_only("sched");
        embedded["mode"] = json!("Embedded");
        env.apply_cr("kube-scheduler", embedded).await;
        for name in ["kube-controller-manager", "kube-scheduler"] {
            let c = env.wait_status(name, types::CONFIG_VALID, "False", config_valid::RESERVED_NAME).await;
            assert!(c.message.starts_with(&format!("metadata.name \"{name}\" is reserved")), "{}", c.message);
        }
        // Longer than an embedded engine's first try at a Lease (retry period 2 s by default).
        tokio::time::sleep(Duration::from_secs(4)).await;
        let after: Vec<_> = [
            leases.get("kube-controller-manager").await.unwrap(),
            leases.get("kube-scheduler").await.unwrap(),
        ]
        .into_iter()
        .map(|l| (l.resource_version(), l.spec.and_then(|s| s.holder_identity)))
        .collect();
        assert_eq!(before, after, "a core component's Lease was written");
        assert!(!crate::kit::exists::<Role>(&env, "ccm:kube-controller-manager:own").await, "a Role on the Lease was created");
        assert!(!crate::kit::exists::<ServiceAccount>(&env, "ccm-kube-controller-manager").await);
        let writes: Vec<String> = env
            .request_log()
            .filter(|r| {
                r.user_agent != HARNESS_AGENT
                    && r.namespace.as_deref() == Some(env.ns.as_str())
                    && r.resource.as_deref() == Some("leases")
                    && !matches!(r.verb.as_str(), "get" | "list" | "watch")
            })
            .into_iter()
            .map(|r| format!("{} {:?}", r.verb, r.name))
            .collect();
        assert!(writes.is_empty(), "Lease writes: {writes:?}");
        let _ = tokio::time::timeout(Duration::from_secs(20), op.stop()).await;
        env.finish().await;
    }
}

testkit::backend_tests! {
    /// A resource asking for more than the installation allows (an image outside the allow-list,
    /// `--kubeconfig` and `--authorization-*` in extraArgs, `--v=5` where the AWS SDK logs
    /// credentials, `--bind-address`, more replicas than the maximum, a priority class not on the
    /// list, resources above the maximum or of a kind not allowed) gets ConfigValid=False
    /// NotAllowedByPolicy with a message naming each field, and nothing is deployed; within the policy it is deployed with the
    /// default memory limit, and a later edit outside the policy leaves the running manager as it
    /// was.
    async fn a_resource_asking_for_more_than_the_policy_allows_is_refused_naming_each_field(backend) {
        use k8s_openapi::api::apps::v1::Deployment;
        let _capture = LogCapture::start();
        let env = Env::start(backend, "policy").await;
        let op = env.operator().await;
        let mut greedy = lb_only("greedy");
        greedy["extraArgs"] = json!(["--v=2", "--kubeconfig=/etc/kubernetes/admin.conf", "--authorization-always-allow-paths=/metrics", "--v=5", "--bind-address=0.0.0.0"]);
        greedy["deployment"] = json!({"image": "evil.example/miner:1", "replicas": 6, "priorityClassName": "system-node-critical",
            "resources": {"requests": {"cpu": "64", "nvidia.com/gpu": "1"}, "limits": {"memory": "64Gi"}}});
        env.apply_cr("greedy", greedy).await;
        let c = env.wait_status("greedy", types::CONFIG_VALID, "False", config_valid::NOT_ALLOWED_BY_POLICY).await;
        for field in ["spec.deployment.image", "spec.deployment.replicas", "spec.deployment.priorityClassName", "spec.extraArgs[1]", "spec.extraArgs[2]",
                      "spec.extraArgs[3]", "spec.extraArgs[4]", "spec.deployment.resources.requests.cpu",
                      "spec.deployment.resources.requests.nvidia.com/gpu", "spec.deployment.resources.limits.memory"] {
            assert!(c.message.contains(field), "{field} not named: {}", c.message);
        }
        assert!(!c.message.contains("spec.extraArgs[0]"), "--v is allowed: {}", c.message);
        assert!(!c.message.contains("admin.conf"), "flag values stay out: {}", c.message);
        assert!(!crate::kit::exists::<Deployment>(&env, "ccm-greedy").await, "nothing is deployed");
        assert!(!crate::kit::exists::<ServiceAccount>(&env, "ccm-greedy").await);

        // Within the policy: deployed, with a memory limit it did not ask for.
        let mut modest = lb_only("greedy");
        modest["extraArgs"] = json!(["--v=2"]);
        modest["deployment"] = json!({"replicas": 5});
        env.apply_cr("greedy", modest).await;
        env.wait_status("greedy", types::CONFIG_VALID, "True", config_valid::VALID).await;
        let deployments = env.api::<Deployment>();
        let deployed = testkit::poll_within(Duration::from_secs(30), || async {
            deployments.get_opt("ccm-greedy").await.ok().flatten()
        })
        .await
        .expect("the manager Deployment");
        let template = deployed.spec.clone().unwrap().template;
        let container = &template.spec.as_ref().unwrap().containers[0];
        let limits = container.resources.as_ref().and_then(|r| r.limits.clone()).unwrap_or_default();
        assert_eq!(limits.get("memory").map(|q| q.0.as_str()), Some(operator::build::DEFAULT_MEMORY_LIMIT));
        assert_eq!(container.image.as_deref(), Some("example.test/cloud-controller-manager:e2e"));

        // A later edit outside the policy is refused and the manager stays as it was.
        let mut again = lb_only("greedy");
        again["deployment"] = json!({"image": "evil.example/miner:1", "replicas": 5});
        env.apply_cr("greedy", again).await;
        let c = env.wait_status("greedy", types::CONFIG_VALID, "False", config_valid::NOT_ALLOWED_BY_POLICY).await;
        assert!(c.message.starts_with("spec.deployment.image is not an allowed image"), "{}", c.message);
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = deployments.get("ccm-greedy").await.unwrap();
        assert_eq!(now.spec.unwrap().template, template, "the running manager was changed");
        let _ = tokio::time::timeout(Duration::from_secs(20), op.stop()).await;
        env.finish().await;
    }
}

/// Cloud-configs of the fake, baremetal and aws providers with the token in every field, each
/// wrong in some way, plus malformed documents.
fn token_documents() -> Vec<(&'static str, String)> {
    let t = TOKEN;
    let mut out = Vec::new();
    let fake = [
        format!("{t}\n"),
        format!("{t}: 1\n"),
        format!("\"{t}\": [\n"),
        format!("instances: [{{name: a, {t}: 1}}]\n"),
        format!("instances: [{{name: \"\", providerID: {t}}}]\n"),
        format!("instances: [{{name: a, addresses: [{{type: {t}, address: {t}}}]}}]\n"),
        format!("instances: [{{name: a, labels: {{{t}: [{t}]}}}}]\n"),
        format!("instances: [{{name: a, labels: {{{t}: {t}, {t}: b}}}}]\n"),
        format!("health: {{healthy: {t}, reason: {t}, message: {t}}}\n"),
        format!("failures: [{{method: {t}, error: other, message: {t}}}]\n"),
        format!("failures: [{{method: health, error: {t}}}]\n"),
        format!("failures: [{{method: health, error: other, rate: {t}}}]\n"),
        format!("latency: {t}\n"),
        format!("batchSize: {t}\n"),
        format!("autoInstances: {t}\n"),
        format!("loadBalancerIPRange: {t}\n"),
        format!("loadBalancerIPRange: 10.0.0.0/{t}\n"),
        format!("instances: &{t} [{{name: a}}]\nfailures: *{t}\n"),
        format!("instances: []\n---\n{t}: 1\n"),
        format!("{t}: a: b\n"),
        format!("instances:\n\t- name: {t}\n"),
        format!("disableRoutes: {t}\n"),
        format!("instances: [{{name: a, zone: {{{t}: {t}}}}}]\n"),
    ];
    out.extend(fake.into_iter().map(|d| ("fake", d)));
    let baremetal = [
        format!("{t}: 1\n"),
        format!("instances: [{{name: a, addresses: [{{type: InternalIP, address: {t}}}]}}]\n"),
        format!("instances: [{{name: a, addresses: [{{type: {t}, address: 10.0.0.1}}]}}]\n"),
        format!("instances: [{{name: a, providerID: [{t}], instanceType: {{{t}: 1}}}}]\n"),
        format!("instances: [{{name: a, state: {t}}}]\n"),
        format!("instances: [{{name: {{{t}: 1}}}}]\n"),
        format!("loadBalancer: {{pools: [{{name: p, cidrs: [{t}]}}]}}\n"),
        format!("loadBalancer: {{pools: [{{name: p, ranges: [{t}]}}]}}\n"),
        format!("loadBalancer: {{pools: [{{name: p, cidrs: [10.0.0.0/28], {t}: true}}]}}\n"),
        format!("loadBalancer: {{pools: [{{name: p, cidrs: [10.0.0.0/28], avoidBuggyIPs: {t}}}]}}\n"),
        format!(
            "loadBalancer: {{pools: [{{name: p, cidrs: [10.0.0.0/28], serviceSelector: {{matchExpressions: [{{key: a, operator: {t}}}]}}}}]}}\n"
        ),
        format!("loadBalancer: {{retryAfter: {t}}}\n"),
        format!("loadBalancer: {{mode: {t}}}\n"),
        format!("loadBalancer: {{kubeVip: {t}}}\n"),
        format!("lifecycle: {{deleteAbsentNodes: {t}}}\n"),
        format!("instances: {t}\n"),
    ];
    out.extend(baremetal.into_iter().map(|d| ("baremetal", d)));
    let aws = [
        format!("[Global]\nZone = {t}\n"),
        format!("[Global]\nVPC = {t}\n"),
        format!("[Global]\nSubnetID = {t}\n"),
        format!("[Global]\nRouteTableID = {t}\n"),
        format!("[Global]\nKubernetesClusterID = {t} {t}\n"),
        format!("[Global]\nRoleARN = {t}\n"),
        format!("[Global]\nElbSecurityGroup = {t}\n"),
        format!("[Global]\nDisableSecurityGroupIngress = {t}\n"),
        // An unknown key or section is only warned about (the manager logs it), so each of
        // these also carries a value that is refused: the token must not leak through that
        // refusal either.
        format!("[Global]\n{t} = 1\nZone = {t}\n"),
        format!("[Global]\n{t}\nVPC = {t}\n"),
        format!("[{t}]\nZone = us-east-1a\n[Global]\nZone = {t}\n"),
        format!("[ServiceOverride \"{t}\"]\nService = {t}\nRegion = {t}\nURL = {t}\nSigningRegion = {t}\n"),
        format!("[ServiceOverride \"1\"]\nService = ec2\nRegion = us-east-1\nURL = {t}\nSigningRegion = us-east-1\n"),
    ];
    out.extend(aws.into_iter().map(|d| ("aws", d)));
    out
}

/// Server-side apply `obj` (any kind) as the admin.
async fn apply_object(client: &Client, obj: &Value) {
    let kind = obj["kind"].as_str().unwrap_or_default();
    let name = obj["metadata"]["name"].as_str().unwrap_or_default().to_string();
    let ns = obj["metadata"]["namespace"].as_str().map(str::to_string);
    let params = PatchParams::apply(HARNESS_AGENT).force();
    macro_rules! put {
        ($t:ty, $api:expr) => {{
            let typed: $t = serde_json::from_value(obj.clone()).expect(kind);
            let api: Api<$t> = $api;
            api.patch(&name, &params, &Patch::Apply(&typed)).await.unwrap_or_else(|e| panic!("{kind} {name}: {e}"));
        }};
    }
    match kind {
        "ClusterRole" => put!(ClusterRole, Api::all(client.clone())),
        "ClusterRoleBinding" => put!(ClusterRoleBinding, Api::all(client.clone())),
        "Role" => put!(Role, Api::namespaced(client.clone(), ns.as_deref().unwrap())),
        "RoleBinding" => put!(RoleBinding, Api::namespaced(client.clone(), ns.as_deref().unwrap())),
        "ServiceAccount" => put!(ServiceAccount, Api::namespaced(client.clone(), ns.as_deref().unwrap())),
        _ => {}
    }
}

fn forbidden<T: std::fmt::Debug>(result: Result<T, kube::Error>) -> bool {
    matches!(result, Err(kube::Error::Api(ref s)) if s.code == 403)
}

/// On the genuine API server, with exactly the RBAC the chart renders (cloudConfig.namespaces
/// set to one namespace): the operator's ServiceAccount can read a Secret there but not in any
/// other namespace nor cluster-wide; and the operator itself, running as that ServiceAccount,
/// serves a resource in the allowed namespace and refuses one elsewhere (NamespaceNotAllowed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chart_rbac_lets_the_operator_read_secrets_only_in_the_allowed_namespaces() {
    if !Backend::genuine_available() {
        eprintln!("SKIPPED: needs the genuine API server (CCM_TEST_ASSETS)");
        return;
    }
    let _capture = LogCapture::start();
    let cluster = TestCluster::start(Backend::Genuine).await.expect("the API server starts");
    cluster.install_crd(&crds::crd()).await.expect("the CRD installs");
    let admin = cluster.client();
    let allowed = cluster.fresh_namespace("e2e-cloud").await.unwrap();
    let other = cluster.fresh_namespace("e2e-tenant").await.unwrap();
    let release_ns = cluster.fresh_namespace("e2e-ccm-system").await.unwrap();
    let release = format!("sec{}", std::process::id());
    let values = json!({"cloudConfig": {"namespaces": [allowed]}, "replicas": 1});
    let Some(objects) = render_chart(&cluster.kubeconfig_path(), &values, &release, &release_ns) else { return };
    for o in &objects {
        apply_object(&admin, o).await;
    }
    let sa = objects
        .iter()
        .find(|o| o["kind"] == "ServiceAccount")
        .and_then(|o| o["metadata"]["name"].as_str())
        .expect("the chart renders the operator's ServiceAccount")
        .to_string();
    let (config, _) = cluster.service_account(&release_ns, &sa).await.expect("a ServiceAccount token");
    let operator_client = Client::try_from(config).unwrap();
    for ns in [&allowed, &other] {
        put_secret(&admin, ns, "cfg", b"autoInstances: true\n").await;
    }

    let secrets_in = |ns: &str| Api::<Secret>::namespaced(operator_client.clone(), ns);
    assert!(secrets_in(&allowed).get("cfg").await.is_ok(), "the Secret in the allowed namespace is readable");
    assert!(forbidden(secrets_in(&other).get("cfg").await), "a Secret elsewhere must be forbidden");
    assert!(forbidden(secrets_in(&other).list(&ListParams::default()).await));
    assert!(forbidden(Api::<Secret>::all(operator_client.clone()).list(&ListParams::default()).await));
    assert!(forbidden(secrets_in("kube-system").list(&ListParams::default()).await));

    // The operator itself, with those rights only.
    let mut config = OperatorConfig::new(operator_client.clone());
    config.scope = Scope::All;
    config.cloud_config_namespaces = Some(vec![allowed.clone()]);
    config.leader_election = None;
    config.manage_crd = false;
    config.build.manager_cluster_role = "ccm-manager".into();
    config.timings.debounce = Duration::from_millis(50);
    let op = operator::start(config).await.expect("the operator starts as its ServiceAccount");
    let spec =
        json!({"provider": "fake", "clusterCIDR": "10.244.0.0/16", "cloudConfig": {"secretRef": {"name": "cfg"}}});
    put_cr(&admin, &other, "tenant", spec.clone()).await;
    put_cr(&admin, &allowed, "cloud", spec).await;
    eventually("the resource in the allowed namespace is valid", || async {
        config_valid_is(&admin, &allowed, "cloud", "True", config_valid::VALID).await
    })
    .await;
    eventually("the resource elsewhere is refused", || async {
        config_valid_is(&admin, &other, "tenant", "False", config_valid::NAMESPACE_NOT_ALLOWED).await
    })
    .await;
    // The chart's rights are enough to deploy the manager (ServiceAccount, its Role and
    // bindings, which the API server lets the operator grant only if it holds them).
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> = Api::namespaced(admin.clone(), &allowed);
    eventually("the manager Deployment exists in the allowed namespace", || async {
        deployments.list(&ListParams::default()).await.is_ok_and(|l| !l.items.is_empty())
    })
    .await;
    let _ = tokio::time::timeout(Duration::from_secs(20), op.stop()).await;
    // Cluster-scoped objects of this release; the namespaces' contents stay (no GC there).
    for o in objects.iter().filter(|o| o["kind"] == "ClusterRole" || o["kind"] == "ClusterRoleBinding") {
        let name = o["metadata"]["name"].as_str().unwrap_or_default();
        let _ = match o["kind"].as_str() {
            Some("ClusterRole") => {
                Api::<ClusterRole>::all(admin.clone()).delete(name, &DeleteParams::default()).await.map(|_| ())
            }
            _ => Api::<ClusterRoleBinding>::all(admin.clone()).delete(name, &DeleteParams::default()).await.map(|_| ()),
        };
    }
    let leftover = crate::kit::captured_logs();
    assert!(!leftover.contains("SECRET-TOKEN"));
}

/// The manager pod the operator builds is admitted by the genuine API server's Pod Security
/// admission in a namespace enforcing `restricted`, in Deployment and DaemonSet modes, when it
/// is off the host network; on the host network (the default) only hostNetwork is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manager_pods_pass_restricted_pod_security_admission_except_host_network() {
    if !Backend::genuine_available() {
        eprintln!("SKIPPED: needs the genuine API server (CCM_TEST_ASSETS): Pod Security admission");
        return;
    }
    let cluster = TestCluster::start(Backend::Genuine).await.expect("the API server starts");
    let admin = cluster.client();
    let ns = format!("e2e-restricted-{}", std::process::id());
    let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": ns,
        "labels": {"pod-security.kubernetes.io/enforce": "restricted",
                   "pod-security.kubernetes.io/enforce-version": "latest"}}}))
    .unwrap();
    let _ = Api::<Namespace>::all(admin.clone()).create(&PostParams::default(), &namespace).await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &ns);
    for (mode, host_network) in [("Deployment", false), ("DaemonSet", false), ("Deployment", true)] {
        let cr = json!({
            "apiVersion": "ccm.rs/v1alpha1", "kind": "CloudControllerManager",
            "metadata": {"name": "psa", "namespace": ns, "uid": "u1"},
            "spec": {"provider": "fake", "mode": mode, "clusterCIDR": "10.244.0.0/16", "cloudConfig": {"secretRef": {"name": "cfg"}},
                     "deployment": {"hostNetwork": host_network}},
        });
        let template = crate::kit::operator_children(cr, &BuildSettings::default())
            .into_iter()
            .find_map(|o| match o {
                Desired::Deployment(d) => d.spec.map(|s| s.template),
                Desired::DaemonSet(d) => d.spec.map(|s| s.template),
                _ => None,
            })
            .expect("a workload");
        let pod = Pod {
            metadata: ObjectMeta { generate_name: Some("psa-".into()), ..Default::default() },
            spec: template.spec,
            ..Default::default()
        };
        let result = pods.create(&PostParams::default(), &pod).await;
        if host_network {
            let Err(kube::Error::Api(status)) = &result else { panic!("a host-network pod was admitted") };
            assert_eq!(status.code, 403, "{status:?}");
            assert!(status.message.contains("hostNetwork"), "{}", status.message);
            let others = status.message.replace("host namespaces (hostNetwork=true)", "");
            assert!(
                !others.contains("allowPrivilegeEscalation")
                    && !others.contains("runAsNonRoot")
                    && !others.contains("seccompProfile")
                    && !others.contains("capabilities"),
                "{}",
                status.message
            );
        } else {
            let created = result.unwrap_or_else(|e| panic!("{mode}: the restricted profile refused the pod: {e}"));
            assert!(created.name_any().starts_with("psa-"));
        }
    }
}

testkit::backend_tests! {
    /// A resource cannot point the operator at a Secret not meant for a manager: an unlabelled
    /// Secret is never read (no request names it), looks exactly like a missing one, and its
    /// content reaches nothing; labelled, the same Secret is used; unlabelled again, dropped.
    async fn a_secret_not_labelled_as_a_cloud_config_is_never_read_and_looks_missing(backend) {
        let env = Env::start(backend, "secret-label").await;
        let plain = testkit::secret(&env.ns, "plain", "cloud.conf", format!("# {TOKEN}\nautoInstances: true\n").as_bytes());
        env.api::<Secret>().create(&PostParams::default(), &plain).await.expect("the unlabelled Secret");
        let op = env.operator().await;
        // Disjoint controllers, so that the two resources do not conflict.
        let spec = |name: &str, controller: &str| json!({"provider": "fake", "configureCloudRoutes": false,
            "controllers": [controller], "cloudConfig": {"secretRef": {"name": name}}});
        env.apply_cr("unlabelled", spec("plain", "service")).await;
        env.apply_cr("missing", spec("absent", "cloud-node")).await;
        let unlabelled = env.wait_status("unlabelled", types::CONFIG_VALID, "False", config_valid::SECRET_NOT_FOUND).await;
        let missing = env.wait_status("missing", types::CONFIG_VALID, "False", config_valid::SECRET_NOT_FOUND).await;
        assert!(unlabelled.message.contains("ccm.rs/cloud-config=true"), "{}", unlabelled.message);
        assert_eq!(unlabelled.message.replace("plain", "absent"), missing.message, "unlabelled and missing look alike");
        let reads = |name: &'static str| {
            env.request_log().count(move |r| {
                crate::kit::by_code_under_test(r)
                    && r.resource.as_deref() == Some("secrets")
                    && r.name.as_deref() == Some(name)
            })
        };
        assert_eq!(reads("plain"), 0, "the operator requested the unlabelled Secret by name");

        // Labelled for the operator: used.
        let label = json!({"metadata": {"labels": {(crds::CLOUD_CONFIG_LABEL): crds::CLOUD_CONFIG_LABEL_VALUE}}});
        env.api::<Secret>().patch("plain", &PatchParams::default(), &Patch::Merge(&label)).await.expect("labelled");
        env.wait_status("unlabelled", types::CONFIG_VALID, "True", config_valid::VALID).await;
        assert!(reads("plain") >= 1);
        // The label taken away again: dropped, as if deleted.
        let unlabel = json!({"metadata": {"labels": {(crds::CLOUD_CONFIG_LABEL): null}}});
        env.api::<Secret>().patch("plain", &PatchParams::default(), &Patch::Merge(&unlabel)).await.expect("unlabelled");
        env.wait_status("unlabelled", types::CONFIG_VALID, "False", config_valid::SECRET_NOT_FOUND).await;
        let cr = env.cr("unlabelled").await;
        assert!(!serde_json::to_string(&cr.status).unwrap().contains(TOKEN));
        let _ = tokio::time::timeout(Duration::from_secs(20), op.stop()).await;
        env.finish().await;
    }
}

testkit::backend_tests! {
    /// `spec.announcer` (issues 27 and 45): refused with NotAllowedByPolicy naming the field where
    /// the installation does not allow announcers, or not in this namespace; allowed, the operator renders the announcer's
    /// ServiceAccount, bindings and DaemonSet beside the manager (its pods not counted as
    /// manager pods), and removing the field prunes exactly those, the manager untouched.
    async fn an_announcer_is_rendered_only_where_allowed_and_pruned_when_removed(backend) {
        use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
        let env = Env::start(backend, "announce").await;
        env.secret("cfg", "cloud.conf", crate::kit::BAREMETAL_ANNOUNCING).await;
        let spec = json!({"provider": "baremetal", "controllers": ["service-lb-controller"],
                          "cloudConfig": {"secretRef": {"name": "cfg"}}, "announcer": {"nodeSelector": {"edge": "true"}}});

        // Not allowed by this installation: refused, nothing deployed.
        let op = env.operator().await;
        env.apply_cr("metal", spec.clone()).await;
        let c = env.wait_status("metal", types::CONFIG_VALID, "False", config_valid::NOT_ALLOWED_BY_POLICY).await;
        assert!(c.message.starts_with("spec.announcer:") && c.message.contains("announcer.enabled"), "{}", c.message);
        assert!(!crate::kit::exists::<Deployment>(&env, "ccm-metal").await, "nothing is deployed");
        let _ = tokio::time::timeout(Duration::from_secs(20), op.stop()).await;

        // Allowed, but in other namespaces only: refused, naming the field and the setting.
        let mut config = env.operator_config();
        config.build.policy.allow_announcers = true;
        config.build.policy.announcer_namespaces = vec!["elsewhere".into()];
        let op = operator::start(config).await.expect("the operator starts");
        let c = env.wait_condition("metal", types::CONFIG_VALID, |c| c.message.contains("announcer.namespaces")).await;
        assert_eq!(c.reason, config_valid::NOT_ALLOWED_BY_POLICY);
        assert!(c.message.starts_with("spec.announcer:") && c.message.contains(&env.ns), "{}", c.message);
        assert!(!crate::kit::exists::<Deployment>(&env, "ccm-metal").await, "nothing is deployed");
        let _ = tokio::time::timeout(Duration::from_secs(20), op.stop()).await;

        // Allowed: the announcer's objects beside the manager's.
        let mut config = env.operator_config();
        config.build.policy.allow_announcers = true;
        let op = operator::start(config).await.expect("the operator starts");
        env.wait_status("metal", types::CONFIG_VALID, "True", config_valid::VALID).await;
        let name = operator::names::announcer_name("metal");
        let daemon_sets = env.api::<DaemonSet>();
        let ds = testkit::poll_within(Duration::from_secs(30), || async {
            daemon_sets.get_opt(&name).await.ok().flatten()
        })
        .await
        .expect("the announcer DaemonSet");
        let pod = ds.spec.unwrap().template.spec.unwrap();
        assert_eq!(pod.host_network, Some(true));
        assert_eq!(pod.node_selector.unwrap()["edge"], "true");
        let caps = pod.containers[0].security_context.clone().unwrap().capabilities.unwrap();
        assert_eq!(caps.add, Some(vec!["NET_RAW".to_string()]));
        assert!(crate::kit::exists::<Deployment>(&env, "ccm-metal").await, "the manager too");
        assert!(crate::kit::exists::<ServiceAccount>(&env, &name).await);
        assert!(crate::kit::exists::<RoleBinding>(&env, &name).await);
        let crbs: Api<ClusterRoleBinding> = Api::all(env.harness.clone());
        let crb_name = operator::names::announcer_cluster_role_binding_name(&env.ns, "metal");
        assert!(crbs.get_opt(&crb_name).await.unwrap().is_some(), "the announcer's ClusterRoleBinding");
        let manager_template = env.api::<Deployment>().get("ccm-metal").await.unwrap().spec.unwrap().template;
        // Its Pods are counted in status (no kubelet here: none scheduled).
        let counted = testkit::poll_within(Duration::from_secs(30), || async {
            env.cr("metal").await.status?.announcers
        })
        .await;
        assert_eq!(counted.map(|a| (a.desired, a.ready)), Some((0, 0)));

        // What the announcers' own Leases say, summed up in `Announcing` (issue 47 item 1).
        {
            use crds::reasons::announcing;
            use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
            use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
            env.wait_status("metal", types::ANNOUNCING, "Unknown", announcing::AWAITING_ANNOUNCERS).await;
            let leases = env.api::<Lease>();
            let sessions = |state: &str, detail: &str| {
                json!([{"peer": "192.0.2.1", "state": state, "detail": detail}]).to_string()
            };
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some("l2-announcer-w1".into()),
                    labels: Some([("ccm.rs/announcer".to_string(), "l2".to_string())].into()),
                    annotations: Some([("ccm.rs/bgp-sessions".to_string(), sessions("Established", ""))].into()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some("w1".into()),
                    lease_duration_seconds: Some(3600),
                    renew_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
                    ..Default::default()
                }),
            };
            leases.create(&PostParams::default(), &lease).await.expect("an announcer's Lease");
            let c = env.wait_status("metal", types::ANNOUNCING, "True", announcing::AS_EXPECTED).await;
            assert_eq!(c.message, "1 announcers live and healthy, 1 BGP sessions established");
            let lost = json!({"metadata": {"annotations": {"ccm.rs/bgp-sessions": sessions("Active", "Socket: Connection refused")}}});
            leases.patch("l2-announcer-w1", &PatchParams::default(), &Patch::Merge(&lost)).await.expect("session lost");
            let c = env.wait_status("metal", types::ANNOUNCING, "False", announcing::BGP_SESSION_DOWN).await;
            assert!(c.message.contains("w1 to 192.0.2.1: Active (Socket: Connection refused)"), "{}", c.message);
            let mark = json!({"metadata": {"annotations": {"ccm.rs/announcer-unhealthy": "interface eth1 is down"}}});
            leases.patch("l2-announcer-w1", &PatchParams::default(), &Patch::Merge(&mark)).await.expect("unhealthy");
            let c = env.wait_status("metal", types::ANNOUNCING, "False", announcing::ANNOUNCER_UNHEALTHY).await;
            assert!(c.message.ends_with("w1: interface eth1 is down"), "{}", c.message);
        }

        // Removed from the spec: the announcer's objects go, the manager stays as it was.
        let remove = json!({"spec": {"announcer": null}});
        env.crs().patch("metal", &PatchParams::default(), &Patch::Merge(&remove)).await.expect("announcer removed");
        let gone = testkit::poll_within(Duration::from_secs(30), || async {
            let ds = daemon_sets.get_opt(&name).await.ok()?;
            let crb = crbs.get_opt(&crb_name).await.ok()?;
            (ds.is_none() && crb.is_none()).then_some(())
        })
        .await;
        assert!(gone.is_some(), "the announcer DaemonSet and ClusterRoleBinding are pruned");
        assert!(!crate::kit::exists::<ServiceAccount>(&env, &name).await, "and its ServiceAccount");
        let now = env.api::<Deployment>().get("ccm-metal").await.unwrap().spec.unwrap().template;
        assert_eq!(now, manager_template, "the manager was not changed");
        let cleared = testkit::poll_within(Duration::from_secs(30), || async {
            let status = env.cr("metal").await.status?;
            let announcing = status.conditions.iter().any(|c| c.type_ == types::ANNOUNCING);
            (status.announcers.is_none() && !announcing).then_some(())
        })
        .await;
        assert!(cleared.is_some(), "status.announcers goes with spec.announcer");
        // Settled: no more writes of its own (a status it cannot clear would be rewritten forever).
        tokio::time::sleep(Duration::from_secs(2)).await;
        let version = env.cr("metal").await.metadata.resource_version;
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(env.cr("metal").await.metadata.resource_version, version, "the resource is left alone");
        let _ = tokio::time::timeout(Duration::from_secs(20), op.stop()).await;
        env.finish().await;
    }
}
