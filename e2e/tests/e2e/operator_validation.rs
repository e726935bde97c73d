//! Operator scenarios: every `ConfigValid` failure, conflicts between CRs, malformed CRs.

use crate::kit::{Env, HARNESS_AGENT};
use crds::conditions::{reasons as ready_reasons, types};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::runtime::wait::await_condition;
use operator::reasons::{config_valid, degraded};
use serde_json::json;
use testkit::{WAIT, eventually};

/// The CRD with a spec schema that takes anything (as an old release's might have).
fn loose_crd() -> k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaProps;
    let mut crd = crds::crd();
    for version in &mut crd.spec.versions {
        let root = version.schema.as_mut().and_then(|s| s.open_api_v3_schema.as_mut()).expect("a schema");
        root.x_kubernetes_validations = None;
        let spec = JSONSchemaProps {
            type_: Some("object".into()),
            x_kubernetes_preserve_unknown_fields: Some(true),
            ..Default::default()
        };
        root.properties.get_or_insert_default().insert("spec".into(), spec);
    }
    crd
}

async fn assert_not_deployed(env: &Env, cr: &str) {
    assert!(
        env.api::<Deployment>().get_opt(&format!("ccm-{cr}")).await.unwrap().is_none(),
        "{cr} must not be deployed"
    );
}

testkit::backend_tests! {
    async fn every_config_failure_has_its_reason_and_degrades_at_once(backend) {
        let env = Env::start(backend, "invalid").await;
        let op = env.operator().await;
        env.secret("nokey", "other", "x").await;
        env.secret("bad", "cloud.conf", "bogusField: hunter2-secret\n").await;
        let cases = [
            ("unknown", json!({"provider": "nimbus"}), config_valid::UNKNOWN_PROVIDER, "known providers:"),
            (
                "missing",
                json!({"provider": "fake", "cloudConfig": {"secretRef": {"name": "absent"}}, "configureCloudRoutes": false}),
                config_valid::SECRET_NOT_FOUND,
                "\"absent\"",
            ),
            (
                "nokey",
                json!({"provider": "fake", "cloudConfig": {"secretRef": {"name": "nokey"}}, "configureCloudRoutes": false}),
                config_valid::SECRET_KEY_NOT_FOUND,
                "no key \"cloud.conf\"",
            ),
            (
                "rejected",
                json!({"provider": "fake", "cloudConfig": {"secretRef": {"name": "bad"}}, "configureCloudRoutes": false}),
                config_valid::CLOUD_CONFIG_REJECTED,
                "unknown field",
            ),
            ("nocidr", json!({"provider": "fake"}), config_valid::CLUSTER_CIDR_REQUIRED, "clusterCIDR"),
        ];
        // Disjoint controllers so that the cases do not conflict with one another.
        for (i, (name, spec, _, _)) in cases.iter().enumerate() {
            let mut spec = spec.clone();
            let controllers = [
                json!(["cloud-node"]),
                json!(["cloud-node-lifecycle"]),
                json!(["service"]),
                json!(["route"]),
                json!(["route"]),
            ];
            spec["controllers"] = controllers[i].clone();
            env.apply_cr(name, spec).await;
        }
        for (name, _, reason, needle) in &cases {
            let c = env.wait_condition(name, types::CONFIG_VALID, |c| c.status == "False").await;
            assert_eq!(c.reason, *reason, "{name}: {}", c.message);
            assert!(c.message.contains(needle), "{name}: {:?} lacks {needle:?}", c.message);
            assert!(!c.message.contains("hunter2"), "{name}: the Secret's content leaked: {}", c.message);
            env.wait_status(name, types::DEGRADED, "True", degraded::CONFIG_INVALID).await;
            env.wait_status(name, types::READY, "False", ready_reasons::CONFIG_INVALID).await;
            assert_not_deployed(&env, name).await;
        }
        // A Warning event says why.
        let events: Api<Event> = env.api();
        eventually("a ConfigInvalid event on the CR", || async {
            let list = events.list(&ListParams::default()).await.unwrap();
            list.items.iter().any(|e| {
                e.reason.as_deref() == Some("ConfigInvalid")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("unknown")
            })
        })
        .await;
        // Fixing the input (creating the Secret) makes it valid without touching the CR.
        env.secret("absent", "cloud.conf", "autoInstances: true\n").await;
        env.wait_status("missing", types::CONFIG_VALID, "True", config_valid::VALID).await;
        eventually("the fixed CR to be deployed", || async {
            env.api::<Deployment>().get_opt("ccm-missing").await.unwrap().is_some()
        })
        .await;

        // Out-of-range values: the API server rejects them where it enforces the CRD's schema
        // (the genuine one); where one is stored anyway, the operator refuses it.
        let body = json!({
            "apiVersion": "ccm.rs/v1alpha1", "kind": "CloudControllerManager",
            "metadata": {"name": "cel", "namespace": env.ns},
            "spec": {"provider": "fake", "controllers": ["cloud-node"], "concurrency": {"nodeSyncs": 0}, "loadBalancerClass": "y"},
        });
        match env.crs().patch("cel", &PatchParams::apply(HARNESS_AGENT).force(), &Patch::Apply(&body)).await {
            Err(kube::Error::Api(e)) => {
                assert_eq!(e.code, 422, "{e:?}");
                assert!(e.message.contains("spec.concurrency.nodeSyncs"), "{}", e.message);
            }
            Err(e) => panic!("applying the out-of-range CR: {e}"),
            Ok(_) => {
                assert!(!env.is_genuine(), "kube-apiserver stored an out-of-range CR");
                let c = env.wait_condition("cel", types::CONFIG_VALID, |c| c.status == "False").await;
                assert_eq!(c.reason, config_valid::INVALID_SPEC);
                assert!(c.message.contains("spec.concurrency.nodeSyncs"), "{}", c.message);
            }
        }
        op.stop().await.unwrap();
        env.finish().await;
    }
}

testkit::backend_tests! {
    async fn later_cr_running_the_same_controllers_is_not_deployed_until_the_older_goes(backend) {
        let env = Env::start(backend, "conflict").await;
        let op = env.operator().await;
        let spec = json!({"provider": "fake", "configureCloudRoutes": false});
        env.apply_cr("first", spec.clone()).await;
        env.wait_status("first", types::CONFIG_VALID, "True", config_valid::VALID).await;
        env.apply_cr("second", spec.clone()).await;
        let c = env.wait_status("second", types::CONFIG_VALID, "False", config_valid::CONFLICT).await;
        assert!(c.message.contains(&format!("{}/first", env.ns)), "{}", c.message);
        assert!(c.message.contains("cloud-node-controller"), "{}", c.message);
        assert!(c.message.contains("without a loadBalancerClass"), "{}", c.message);
        assert_not_deployed(&env, "second").await;
        assert!(env.api::<Deployment>().get_opt("ccm-first").await.unwrap().is_some());

        // The older one goes: the later one takes over.
        env.crs().delete("first", &DeleteParams::default()).await.unwrap();
        env.wait_status("second", types::CONFIG_VALID, "True", config_valid::VALID).await;
        eventually("the second CR to be deployed", || async {
            env.api::<Deployment>().get_opt("ccm-second").await.unwrap().is_some()
        })
        .await;
        op.stop().await.unwrap();
        env.finish().await;
    }
}

testkit::backend_tests! {
    async fn malformed_cr_is_reported_and_does_not_stop_the_others(backend) {
        let env = Env::start(backend, "malformed").await;
        // How a malformed object gets stored on a real cluster: written under an older, looser
        // schema; a CRD upgrade does not revalidate stored objects.
        env.cluster.install_crd(&loose_crd()).await.expect("the loose CRD installs");
        let ar = ApiResource::erase::<crds::CloudControllerManager>(&());
        let raw: Api<DynamicObject> = Api::namespaced_with(env.harness.clone(), &env.ns, &ar);
        let broken = json!({
            "apiVersion": "ccm.rs/v1alpha1", "kind": "CloudControllerManager",
            "metadata": {"name": "broken", "namespace": env.ns},
            // A type the schema no longer allows. (A value a CEL rule of the current schema
            // evaluates, like `nodeSyncs: "lots"`, would make a genuine server refuse every write
            // to the object, status included: CEL evaluation errors are not ratcheted.)
            "spec": {"provider": "fake", "mode": 7},
        });
        raw.patch("broken", &PatchParams::apply(HARNESS_AGENT).force(), &Patch::Apply(&broken)).await.unwrap();
        env.cluster.install_crd(&crds::crd()).await.expect("the current CRD installs");
        let op = env.operator().await;
        env.apply_cr("good", json!({"provider": "fake", "configureCloudRoutes": false})).await;
        eventually("the good CR to be deployed", || async {
            env.api::<Deployment>().get_opt("ccm-good").await.unwrap().is_some()
        })
        .await;
        // The broken one carries its reason.
        let status = tokio::time::timeout(
            WAIT,
            await_condition(raw.clone(), "broken", |o: Option<&DynamicObject>| {
                o.and_then(|o| o.data.pointer("/status/conditions"))
                    .and_then(|c| c.as_array())
                    .is_some_and(|c| c.iter().any(|c| c["type"] == "ConfigValid" && c["reason"] == "MalformedSpec"))
            }),
        )
        .await
        .expect("the malformed CR is reported in time")
        .unwrap()
        .unwrap();
        let conditions = status.data["status"]["conditions"].as_array().unwrap().clone();
        let ready = conditions.iter().find(|c| c["type"] == "Ready").unwrap();
        assert_eq!(ready["status"], "False");
        op.stop().await.unwrap();
        env.finish().await;
    }
}

testkit::backend_tests! {
    /// Issue 48 item 4: a CCM this operator does not run holds `kube-system/cloud-controller-manager`
    /// (upstream's default leader Lease): a new resource is refused with `ForeignManager` naming
    /// the Lease and its holder and deploys nothing; one that takes over by leader migration
    /// deploys; once the foreign CCM releases its Lease, the refused one deploys untouched.
    async fn a_foreign_ccm_holding_the_upstream_lease_keeps_a_new_resource_from_starting_unless_it_migrates(backend) {
        use k8s_openapi::api::coordination::v1::Lease;
        let env = Env::start(backend, "foreign").await;
        let leases: Api<Lease> = Api::namespaced(env.client.clone(), "kube-system");
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        // Typed, so the times carry the microseconds the API server insists on.
        let mut lease = serde_json::to_value(Lease {
            metadata: kube::api::ObjectMeta {
                name: Some("cloud-controller-manager".into()),
                namespace: Some("kube-system".into()),
                ..Default::default()
            },
            spec: Some(k8s_openapi::api::coordination::v1::LeaseSpec {
                holder_identity: Some("ip-10-0-1-5_0b9f".into()),
                lease_duration_seconds: Some(3600),
                acquire_time: Some(now.clone()),
                renew_time: Some(now),
                ..Default::default()
            }),
        })
        .expect("JSON");
        lease["apiVersion"] = json!("coordination.k8s.io/v1");
        lease["kind"] = json!("Lease");
        leases
            .patch("cloud-controller-manager", &PatchParams::apply(crate::kit::HARNESS_AGENT).force(), &Patch::Apply(&lease))
            .await
            .expect("the foreign CCM's Lease");
        let mut config = env.operator_config();
        config.scope = operator::Scope::Namespaces(vec![env.ns.clone(), "kube-system".into()]);
        let op = operator::start(config).await.expect("the operator starts");
        env.secret("cfg", "cloud.conf", "autoInstances: true\n").await;
        let base = json!({"provider": "fake", "cloudConfig": {"secretRef": {"name": "cfg"}}, "configureCloudRoutes": false});
        let mut fresh = base.clone();
        fresh["controllers"] = json!(["cloud-node"]);
        env.apply_cr("fresh", fresh).await;
        let mut migrating = base.clone();
        migrating["controllers"] = json!(["service"]);
        migrating["leaderElection"] = json!({"migration": {"enabled": true}});
        env.apply_cr("migrating", migrating).await;

        let c = env.wait_condition("fresh", types::CONFIG_VALID, |c| c.status == "False").await;
        assert_eq!(c.reason, config_valid::FOREIGN_MANAGER, "{}", c.message);
        assert!(c.message.contains("kube-system/cloud-controller-manager is held by \"ip-10-0-1-5_0b9f\""), "{}", c.message);
        assert_not_deployed(&env, "fresh").await;
        env.wait_status("migrating", types::CONFIG_VALID, "True", config_valid::VALID).await;
        eventually("the migrating resource deployed", || async {
            env.api::<Deployment>().get_opt("ccm-migrating").await.unwrap().is_some()
        })
        .await;
        assert_not_deployed(&env, "fresh").await;

        // The foreign CCM stops and releases its Lease (client-go's ReleaseOnCancel empties the
        // holder): the refused resource deploys, untouched.
        lease["spec"]["holderIdentity"] = json!("");
        leases
            .patch("cloud-controller-manager", &PatchParams::apply(crate::kit::HARNESS_AGENT).force(), &Patch::Apply(&lease))
            .await
            .expect("the Lease released");
        env.wait_status("fresh", types::CONFIG_VALID, "True", config_valid::VALID).await;
        eventually("the fresh resource deployed", || async {
            env.api::<Deployment>().get_opt("ccm-fresh").await.unwrap().is_some()
        })
        .await;
        op.stop().await.unwrap();
        let _ = leases.delete("cloud-controller-manager", &DeleteParams::default()).await;
        env.finish().await;
    }
}

testkit::backend_tests! {
    /// Issue 48 item 3, "shadow mode first when asked": beside a resource running upstream's aws
    /// image, a resource running this project's `aws` manager in shadow mode for the same
    /// controllers is deployed read-only (the shadow ClusterRole, `--shadow=true`) without a conflict,
    /// and the upstream resource is left as it was; the same resource acting (no shadow) is a
    /// conflict naming the upstream one.
    async fn a_shadow_resource_runs_read_only_beside_an_upstream_image_and_an_acting_one_conflicts(backend) {
        use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
        let env = Env::start(backend, "shadowup").await;
        env.secret("cfg", "cloud.conf", "[Global]\nKubernetesClusterID = prod\n").await;
        let mut config = env.operator_config();
        config.build.policy.allowed_images = vec![
            config.build.manager_image.clone(),
            "registry.k8s.io/provider-aws/cloud-controller-manager".into(),
        ];
        let op = operator::start(config).await.expect("the operator starts");
        env.apply_cr("upstream", json!({"provider": "aws", "upstream": {"profile": "aws"},
            "clusterCIDR": "10.244.0.0/16", "cloudConfig": {"secretRef": {"name": "cfg"}}})).await;
        env.wait_status("upstream", types::CONFIG_VALID, "True", config_valid::VALID).await;
        let upstream_template = eventually("the upstream Deployment", || async {
            env.api::<Deployment>().get_opt("ccm-upstream").await.unwrap().and_then(|d| d.spec).map(|s| s.template)
        })
        .await;

        env.apply_cr("shadow", json!({"provider": "aws", "shadow": true,
            "clusterCIDR": "10.244.0.0/16", "cloudConfig": {"secretRef": {"name": "cfg"}}})).await;
        env.wait_status("shadow", types::CONFIG_VALID, "True", config_valid::VALID).await;
        let args = eventually("the shadow Deployment", || async {
            let d = env.api::<Deployment>().get_opt("ccm-shadow").await.unwrap()?;
            d.spec?.template.spec?.containers.first()?.args.clone()
        })
        .await;
        assert!(args.iter().any(|a| a == "--shadow=true"), "{args:?}");
        let crbs: Api<ClusterRoleBinding> = Api::all(env.harness.clone());
        let binding = operator::names::shadow_cluster_role_binding_name(&env.ns, "shadow");
        let role = eventually("the shadow binding", || async {
            crbs.get_opt(&binding).await.unwrap().map(|b| b.role_ref.name)
        })
        .await;
        assert_eq!(role, operator::build::BuildSettings::default().manager_shadow_cluster_role);

        // The control: the same resource acting would run the upstream one's controllers. The
        // older resource wins and creation times have whole seconds (a tie goes by name): a
        // second later, so that the upstream one is the older.
        tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
        env.apply_cr("acting", json!({"provider": "aws", "clusterCIDR": "10.244.0.0/16", "cloudConfig": {"secretRef": {"name": "cfg"}}})).await;
        let c = env.wait_status("acting", types::CONFIG_VALID, "False", config_valid::CONFLICT).await;
        assert!(c.message.contains(&format!("{}/upstream", env.ns)), "{}", c.message);
        assert_not_deployed(&env, "acting").await;
        let now = env.api::<Deployment>().get("ccm-upstream").await.unwrap().spec.unwrap().template;
        assert_eq!(now, upstream_template, "the upstream resource is left as it was");
        op.stop().await.unwrap();
        env.finish().await;
    }
}
