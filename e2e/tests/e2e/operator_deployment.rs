//! Operator scenarios: Deployment and DaemonSet modes, rollout conditions, Secret rotation.

use crate::kit::{Env, HARNESS_AGENT, condition, micro_now};
use crds::conditions::{reasons as ready_reasons, types};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleBinding};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use operator::reasons::{available, config_valid, progressing, provider_healthy};
use serde_json::json;
use testkit::{eventually, poll_within};

/// Play the manager: hold the CR's Lease and report provider health.
async fn play_manager(env: &Env, cr: &str, holder: &str) {
    let lease = json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": cr, "namespace": env.ns},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15,
                 "renewTime": micro_now(), "acquireTime": micro_now()},
    });
    env.api::<Lease>()
        .patch(cr, &PatchParams::apply(HARNESS_AGENT).force(), &Patch::Apply(&lease))
        .await
        .expect("lease");
    let status = json!({
        "apiVersion": "ccm.rs/v1alpha1", "kind": "CloudControllerManager",
        "status": {"conditions": [{"type": "ProviderHealthy", "status": "True", "reason": "Healthy",
            "message": "ok", "lastTransitionTime": Timestamp::now().to_string()}], "leader": holder},
    });
    env.crs()
        .patch_status(cr, &PatchParams::apply("cloud-controller-manager").force(), &Patch::Apply(&status))
        .await
        .expect("provider health");
}

async fn deployment(env: &Env, name: &str) -> Deployment {
    poll_within(testkit::WAIT, || async { env.api::<Deployment>().get_opt(name).await.ok().flatten() })
        .await
        .unwrap_or_else(|| panic!("Deployment {name} never appeared"))
}

fn template_hash(d: &Deployment) -> String {
    d.spec.as_ref().unwrap().template.metadata.as_ref().unwrap().annotations.as_ref().unwrap()
        ["ccm.rs/cloud-config-hash"]
        .clone()
}

/// Play the deployment controller: everything of the current generation rolled out.
async fn roll_out(env: &Env, name: &str, replicas: i32) {
    let d = env.api::<Deployment>().get(name).await.unwrap();
    env.write_status::<Deployment>(
        name,
        json!({"observedGeneration": d.metadata.generation, "replicas": replicas, "updatedReplicas": replicas,
               "readyReplicas": replicas, "availableReplicas": replicas}),
    )
    .await;
}

testkit::backend_tests! {
    async fn deployment_mode_renders_children_and_args_and_tracks_a_rollout(backend) {
        let env = Env::start(backend, "deploy").await;
        env.secret("cfg", "cloud.conf", "autoInstances: true\n").await;
        let op = env.operator().await;
        env.apply_cr(
            "aws",
            json!({"provider": "fake", "cloudConfig": {"secretRef": {"name": "cfg"}}, "clusterCIDR": "10.244.0.0/16",
                   "clusterName": "prod", "extraArgs": ["--node-monitor-period=7s"]}),
        )
        .await;

        let d = deployment(&env, "ccm-aws").await;
        let spec = d.spec.clone().unwrap();
        assert_eq!(spec.replicas, Some(2));
        let pod = spec.template.spec.clone().unwrap();
        let c = &pod.containers[0];
        assert_eq!(c.image.as_deref(), Some("example.test/cloud-controller-manager:e2e"));
        let args = c.args.clone().unwrap();
        for expected in [
            "--cloud-provider=fake",
            "--cloud-config=/etc/kubernetes/cloud-config/cloud.conf",
            "--controllers=*",
            "--cluster-name=prod",
            "--cluster-cidr=10.244.0.0/16",
            "--configure-cloud-routes=true",
            "--leader-elect=true",
            "--leader-elect-resource-name=aws",
            &format!("--leader-elect-resource-namespace={}", env.ns),
            &format!("--ccm-resource={}/aws", env.ns),
        ] {
            assert!(args.iter().any(|a| a == expected), "{expected} missing from {args:?}");
        }
        assert_eq!(args.last().map(String::as_str), Some("--node-monitor-period=7s"), "extraArgs come last");
        assert_eq!(pod.service_account_name.as_deref(), Some("ccm-aws"));
        assert_eq!(pod.host_network, Some(true));
        assert_eq!(pod.priority_class_name.as_deref(), Some("system-cluster-critical"));
        assert!(
            pod.tolerations
                .unwrap()
                .iter()
                .any(|t| t.key.as_deref() == Some("node.cloudprovider.kubernetes.io/uninitialized"))
        );
        assert!(env.api::<ServiceAccount>().get_opt("ccm-aws").await.unwrap().is_some());
        let rb = env.api::<RoleBinding>().get("ccm-aws").await.unwrap();
        assert_eq!(rb.role_ref.name, "ccm-manager-namespace");
        let crb =
            Api::<ClusterRoleBinding>::all(env.harness.clone()).get(&format!("ccm-operator:{}:aws", env.ns)).await.unwrap();
        assert_eq!(crb.role_ref.name, "ccm-manager");
        // Children are applied one after another: under load the PDB may come after the Deployment.
        let pdbs = env.api::<PodDisruptionBudget>();
        let pdb = testkit::poll_within(std::time::Duration::from_secs(30), || async { pdbs.get_opt("ccm-aws").await.ok().flatten() })
            .await
            .expect("the PodDisruptionBudget");
        assert_eq!(pdb.spec.unwrap().unhealthy_pod_eviction_policy.as_deref(), Some("AlwaysAllow"));

        // Before any replica runs.
        env.wait_status("aws", types::CONFIG_VALID, "True", config_valid::VALID).await;
        env.wait_status("aws", types::PROGRESSING, "True", progressing::ROLLING_OUT).await;
        env.wait_status("aws", types::PROVIDER_HEALTHY, "Unknown", provider_healthy::AWAITING_MANAGER).await;
        let cr = env.cr("aws").await;
        assert_eq!(cr.status.as_ref().unwrap().observed_generation, cr.metadata.generation);
        assert_eq!(condition(&cr, types::READY).unwrap().status, "False");

        roll_out(&env, "ccm-aws", 2).await;
        env.wait_status("aws", types::PROGRESSING, "False", progressing::AS_EXPECTED).await;
        env.wait_status("aws", types::AVAILABLE, "False", available::NO_LEADER).await;
        play_manager(&env, "aws", "node-a_1").await;
        env.wait_status("aws", types::AVAILABLE, "True", available::AS_EXPECTED).await;
        env.wait_status("aws", types::READY, "True", ready_reasons::AS_EXPECTED).await;
        let cr = env.cr("aws").await;
        let s = cr.status.unwrap();
        assert_eq!((s.replicas, s.ready_replicas, s.leader.as_deref()), (Some(2), Some(2), Some("node-a_1")));
        assert_eq!(condition(&env.cr("aws").await, types::PROVIDER_HEALTHY).unwrap().reason, "Healthy");

        // Scaling is not a rollout.
        env.apply_cr(
            "aws",
            json!({"provider": "fake", "cloudConfig": {"secretRef": {"name": "cfg"}}, "clusterCIDR": "10.244.0.0/16",
                   "clusterName": "prod", "extraArgs": ["--node-monitor-period=7s"], "deployment": {"replicas": 1}}),
        )
        .await;
        eventually("the PDB to go with one replica", || async {
            env.api::<PodDisruptionBudget>().get_opt("ccm-aws").await.unwrap().is_none()
        })
        .await;
        let cr = env.cr("aws").await;
        assert_eq!(condition(&cr, types::PROGRESSING).unwrap().status, "False", "scaling must not flip Progressing");
        op.stop().await.unwrap();
        env.finish().await;
    }
}

testkit::backend_tests! {
    async fn secret_rotation_changes_the_hash_and_rolls_out(backend) {
        let env = Env::start(backend, "rotate").await;
        env.secret("cfg", "cloud.conf", "autoInstances: true\n").await;
        let op = env.operator().await;
        env.apply_cr(
            "rot",
            json!({"provider": "fake", "cloudConfig": {"secretRef": {"name": "cfg"}}, "configureCloudRoutes": false}),
        )
        .await;
        let before = template_hash(&deployment(&env, "ccm-rot").await);
        roll_out(&env, "ccm-rot", 2).await;
        env.wait_status("rot", types::PROGRESSING, "False", progressing::AS_EXPECTED).await;
        env.secret("cfg", "cloud.conf", "autoInstances: true\nbatchSize: 7\n").await;
        let after = poll_within(testkit::WAIT, || async {
            let h = template_hash(&env.api::<Deployment>().get("ccm-rot").await.ok()?);
            (h != before).then_some(h)
        })
        .await
        .expect("the pod-template hash changes after rotation");
        assert_ne!(before, after);
        env.wait_status("rot", types::PROGRESSING, "True", progressing::ROLLING_OUT).await;
        roll_out(&env, "ccm-rot", 2).await;
        env.wait_status("rot", types::PROGRESSING, "False", progressing::AS_EXPECTED).await;
        op.stop().await.unwrap();
        env.finish().await;
    }
}

testkit::backend_tests! {
    /// The manager reloads baremetal pools from its mounted file, so a pool-only Secret edit
    /// (once validated) leaves the pod template alone; an inventory edit rolls the pods.
    async fn a_pool_only_secret_edit_does_not_roll_the_pods(backend) {
        let env = Env::start(backend, "pool-edit").await;
        let pools = "instances: [{name: n1}]\nloadBalancer:\n  pools: [{name: lan, cidrs: [192.0.2.0/30]}]\n";
        env.secret("cfg", "cloud.conf", pools).await;
        let op = env.operator().await;
        env.apply_cr(
            "bm",
            json!({"provider": "baremetal", "cloudConfig": {"secretRef": {"name": "cfg"}}, "configureCloudRoutes": false}),
        )
        .await;
        env.wait_status("bm", types::CONFIG_VALID, "True", config_valid::VALID).await;
        let before = deployment(&env, "ccm-bm").await;

        // An invalid edit first, so that ConfigValid turning True again proves the valid pool
        // edit after it was reconciled.
        env.secret("cfg", "cloud.conf", &pools.replace("192.0.2.0/30", "192.0.2.1/30")).await;
        env.wait_status("bm", types::CONFIG_VALID, "False", config_valid::CLOUD_CONFIG_REJECTED).await;
        let more = pools.replace("192.0.2.0/30]", "192.0.2.0/30, 198.51.100.0/29]");
        env.secret("cfg", "cloud.conf", &more).await;
        env.wait_status("bm", types::CONFIG_VALID, "True", config_valid::VALID).await;
        let after = env.api::<Deployment>().get("ccm-bm").await.unwrap();
        assert_eq!(template_hash(&after), template_hash(&before));
        assert_eq!(after.metadata.generation, before.metadata.generation, "the pods are not rolled");

        env.secret("cfg", "cloud.conf", &more.replace("name: n1", "name: n2")).await;
        poll_within(testkit::WAIT, || async {
            let d = env.api::<Deployment>().get("ccm-bm").await.ok()?;
            (template_hash(&d) != template_hash(&before)).then_some(())
        })
        .await
        .expect("an inventory edit rolls the pods");
        op.stop().await.unwrap();
        env.finish().await;
    }
}

testkit::backend_tests! {
    async fn daemonset_mode_renders_on_control_plane_nodes_and_reports_its_rollout(backend) {
        let env = Env::start(backend, "ds").await;
        let op = env.operator().await;
        env.apply_cr("ds", json!({"provider": "fake", "mode": "DaemonSet", "configureCloudRoutes": false})).await;
        let ds = poll_within(testkit::WAIT, || async {
            env.api::<DaemonSet>().get_opt("ccm-ds").await.ok().flatten()
        })
        .await
        .expect("the DaemonSet appears");
        let pod = ds.spec.clone().unwrap().template.spec.unwrap();
        assert_eq!(pod.node_selector.unwrap().get("node-role.kubernetes.io/control-plane").map(String::as_str), Some(""));
        assert!(env.api::<PodDisruptionBudget>().get_opt("ccm-ds").await.unwrap().is_none(), "no PDB in DaemonSet mode");
        assert!(env.api::<Deployment>().get_opt("ccm-ds").await.unwrap().is_none());
        env.wait_status("ds", types::PROGRESSING, "True", progressing::ROLLING_OUT).await;

        let generation = ds.metadata.generation;
        let status = |desired: i32, current: i32, updated: i32, available: i32| {
            json!({"observedGeneration": generation, "desiredNumberScheduled": desired,
                   "currentNumberScheduled": current, "updatedNumberScheduled": updated, "numberReady": available,
                   "numberAvailable": available, "numberMisscheduled": 0})
        };
        env.write_status::<DaemonSet>("ccm-ds", status(3, 3, 1, 1)).await;
        let c = env.wait_condition("ds", types::PROGRESSING, |c| c.message.contains("1 of 3 nodes updated")).await;
        assert_eq!(c.status, "True");
        env.write_status::<DaemonSet>("ccm-ds", status(3, 3, 3, 3)).await;
        env.wait_status("ds", types::PROGRESSING, "False", progressing::AS_EXPECTED).await;
        play_manager(&env, "ds", "cp-1_1").await;
        env.wait_status("ds", types::AVAILABLE, "True", available::AS_EXPECTED).await;
        // A control-plane node joins: node churn is not a rollout.
        env.write_status::<DaemonSet>("ccm-ds", status(4, 4, 4, 3)).await;
        eventually("the new node's pod to be counted", || async {
            env.cr("ds").await.status.and_then(|s| s.replicas) == Some(4)
        })
        .await;
        let cr = env.cr("ds").await;
        assert_eq!(condition(&cr, types::PROGRESSING).unwrap().status, "False", "node churn must not flip Progressing");
        op.stop().await.unwrap();
        env.finish().await;
    }
}

/// The aws cloud-config Secret `cfg` with `extra` keys beside `cloud.conf`.
async fn aws_secret(env: &Env, extra: &[(&str, &str)]) {
    let config = "[Global]\nRegion = us-east-1\nZone = us-east-1a\nKubernetesClusterID = prod\n";
    let mut secret = testkit::cloud_config_secret(&env.ns, "cfg", "cloud.conf", config.as_bytes());
    let data = secret.data.get_or_insert_default();
    for (key, value) in extra {
        data.insert(key.to_string(), k8s_openapi::ByteString(value.as_bytes().to_vec()));
    }
    env.api::<k8s_openapi::api::core::v1::Secret>()
        .patch("cfg", &PatchParams::apply(HARNESS_AGENT).force(), &Patch::Apply(&secret))
        .await
        .expect("the Secret is applied");
}

testkit::backend_tests! {
    async fn credentials_and_ca_keys_are_named_when_missing_then_mounted_and_new_ones_roll_the_pods(backend) {
        let env = Env::start(backend, "creds").await;
        let ca = ("ca.crt", "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n");
        aws_secret(&env, &[ca]).await;
        let op = env.operator().await;
        env.apply_cr(
            "aws",
            json!({"provider": "aws", "configureCloudRoutes": false,
                   "cloudConfig": {"secretRef": {"name": "cfg"}, "credentialsKey": "credentials", "caBundleKey": "ca.crt"}}),
        )
        .await;
        let c = env.wait_condition("aws", types::CONFIG_VALID, |c| c.status == "False").await;
        assert_eq!(c.reason, config_valid::SECRET_KEY_NOT_FOUND, "{}", c.message);
        assert!(c.message.contains("no key \"credentials\""), "{}", c.message);

        // The key arrives: the manager gets the three keys and the variables, nothing else of the Secret.
        let one = ("credentials", "[default]\naws_access_key_id = AKIAONE\naws_secret_access_key = hunter2\n");
        aws_secret(&env, &[ca, one]).await;
        let d = deployment(&env, "ccm-aws").await;
        let pod = d.spec.clone().unwrap().template.spec.unwrap();
        let c0 = &pod.containers[0];
        let var = |name: &str| c0.env.iter().flatten().find(|e| e.name == name).and_then(|e| e.value.clone());
        assert_eq!(var("AWS_SHARED_CREDENTIALS_FILE").as_deref(), Some("/etc/kubernetes/cloud-config/credentials"));
        assert_eq!(var("SSL_CERT_FILE").as_deref(), Some("/etc/kubernetes/cloud-config/ca.crt"));
        let items = pod.volumes.unwrap()[0].secret.clone().unwrap().items.unwrap();
        assert_eq!(items.iter().map(|i| i.key.as_str()).collect::<Vec<_>>(), ["cloud.conf", "credentials", "ca.crt"]);
        let first = template_hash(&d);

        // New keys roll the Pods; their content shows nowhere in the status.
        let two = ("credentials", "[default]\naws_access_key_id = AKIATWO\naws_secret_access_key = hunter3\n");
        aws_secret(&env, &[ca, two]).await;
        eventually("a new hash after the credentials changed", || async {
            template_hash(&env.api::<Deployment>().get("ccm-aws").await.unwrap()) != first
        })
        .await;
        let status = serde_json::to_string(&env.cr("aws").await.status).unwrap();
        assert!(!status.contains("hunter") && !status.contains("AKIA"), "{status}");
        op.stop().await.unwrap();
        env.finish().await;
    }
}
