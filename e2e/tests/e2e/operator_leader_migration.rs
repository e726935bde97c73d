//! Operator scenario M7, ours to ours: a CloudControllerManager moved to a new name in the same
//! namespace (create the new one with leader migration on, delete the old one) hands its migrated
//! controllers over through the migration Lease, without a gap longer than the lease duration and
//! without both managers running them at once; and moved to a new namespace, both naming one
//! `spec.leaderElection.migration.leaseNamespace`, the same way, the operator granting each
//! manager that one Lease there and removing the grant with the resource. The emulated kubelet
//! runs each resource's Deployment as real `cloud-controller-manager` processes; which
//! controllers each runs is read from their `/metrics` (`running_managed_controllers`), the
//! Lease's holder from the API.

use std::time::{Duration, Instant};

use crate::kit::{Env, HARNESS_AGENT};
use crds::CloudControllerManager;
use e2e::kubelet::{self, Kubelet, KubeletConfig, PodInfo};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use operator::names;
use serde_json::{Value, json};
use testkit::poll_within;

/// The resources' lease duration.
const LEASE: Duration = Duration::from_secs(4);
/// Upstream's default migration Lease, which both resources use.
const MIGRATION_LEASE: &str = "cloud-provider-extraction-migration";
/// Upstream's default migrated controllers this provider runs (routes are off), by metric name.
const MIGRATED: [&str; 2] = ["cloud-node-lifecycle", "service"];
const WAIT: Duration = Duration::from_secs(90);

/// cloud-node-controller is not in upstream's default migration set, so both resources leave it
/// out (it would otherwise run under each one's own Lease, which the operator refuses as a
/// conflict).
fn spec() -> Value {
    json!({
        "provider": "fake",
        "controllers": ["*", "-cloud-node"],
        "configureCloudRoutes": false,
        "cloudConfig": {"secretRef": {"name": "cfg"}},
        "deployment": {"replicas": 1},
        "leaderElection": {"leaseDuration": "4s", "renewDeadline": "3s", "retryPeriod": "1s", "migration": {"enabled": true}},
    })
}

/// Whether any running pod of `deployment` runs every migrated controller, by its `/metrics`.
async fn runs_migrated(kubelet: &Kubelet, ns: &str, deployment: &str) -> bool {
    for pod in kubelet.pods_of(ns, deployment) {
        if runs(&pod).await {
            return true;
        }
    }
    false
}

async fn runs(pod: &PodInfo) -> bool {
    let Some(r) = ccm_framework::serving::probe::get(pod.address(), "/metrics", None, Duration::from_secs(1)).await
    else {
        return false;
    };
    MIGRATED.iter().all(|c| {
        r.body.lines().any(|l| {
            l.starts_with("running_managed_controllers{") && l.contains(&format!("name=\"{c}\"")) && l.ends_with(" 1")
        })
    })
}

async fn holder(env: &Env, lease: &str) -> Option<String> {
    env.api::<Lease>().get_opt(lease).await.ok().flatten()?.spec?.holder_identity
}

/// One observation of both resources' managers.
struct Sample {
    at: Instant,
    old: bool,
    new: bool,
    holder: Option<String>,
}

async fn sample(env: &Env, kubelet: &Kubelet) -> Sample {
    let (old, new) =
        (runs_migrated(kubelet, &env.ns, "ccm-old").await, runs_migrated(kubelet, &env.ns, "ccm-new").await);
    Sample { at: Instant::now(), old, new, holder: holder(env, MIGRATION_LEASE).await }
}

testkit::backend_tests! {
    async fn m7_a_resource_moved_to_a_new_name_hands_its_migrated_controllers_over_without_a_gap_or_an_overlap(backend) {
        let env = Env::start(backend, "migration").await;
        let binary = kubelet::manager_binary().expect("the cloud-controller-manager binary");
        let kubelet = Kubelet::start(KubeletConfig::new(env.client.clone(), env.cluster.kubeconfig_path(), binary))
            .expect("the emulated kubelet starts");
        env.secret("cfg", "cloud.conf", "autoInstances: true\nlatency: 1ms\n").await;
        let op = env.operator().await;
        env.apply_cr("old", spec()).await;
        let mut samples = Vec::new();
        let started = Instant::now();
        loop {
            let s = sample(&env, &kubelet).await;
            let done = s.old;
            samples.push(s);
            if done {
                break;
            }
            assert!(started.elapsed() < WAIT, "the old resource's manager never ran the migrated controllers");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let old_holder = holder(&env, MIGRATION_LEASE).await.expect("the migration Lease is held");
        assert!(old_holder.starts_with("ccm-old-"), "{old_holder}");

        // The new resource is valid beside the old one (no Conflict) and leads its own Lease, but
        // does not run the migrated controllers while the old one holds the migration Lease.
        env.apply_cr("new", spec()).await;
        env.wait_condition("new", "ConfigValid", |c| c.status == "True").await;
        let started = Instant::now();
        while !holder(&env, "new").await.is_some_and(|h| h.starts_with("ccm-new-")) {
            assert!(started.elapsed() < WAIT, "the new resource's manager never led its own Lease");
            samples.push(sample(&env, &kubelet).await);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        for _ in 0..20 {
            samples.push(sample(&env, &kubelet).await);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }

        // Delete the old resource: its manager stops, releases the Lease, the new one takes over.
        env.crs().delete("old", &DeleteParams::default()).await.unwrap();
        let deleted = Instant::now();
        loop {
            let s = sample(&env, &kubelet).await;
            let done = s.new && !s.old;
            samples.push(s);
            if done {
                break;
            }
            assert!(deleted.elapsed() < WAIT, "the new resource's manager never took the migrated controllers over");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        for _ in 0..10 {
            samples.push(sample(&env, &kubelet).await);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }

        let overlaps = samples.iter().filter(|s| s.old && s.new).count();
        let last_old = samples.iter().rev().find(|s| s.old).map(|s| s.at).expect("the old manager ran them");
        let first_new = samples.iter().find(|s| s.new).map(|s| s.at).expect("the new manager ran them");
        let gap = first_new.saturating_duration_since(last_old);
        let mut transitions = Vec::new();
        for s in &samples {
            if transitions.last().map(|(_, h): &(Instant, Option<String>)| h) != Some(&s.holder) {
                transitions.push((s.at, s.holder.clone()));
            }
        }
        let history: Vec<String> = transitions
            .iter()
            .map(|(at, h)| {
                let ms = at.saturating_duration_since(deleted).as_millis() as i128
                    - deleted.saturating_duration_since(*at).as_millis() as i128;
                format!("{ms:+} ms: {}", h.as_deref().unwrap_or("(none)"))
            })
            .collect();
        println!(
            "ours to ours ({}): longest interval with no manager running {:?}: {gap:?} (lease {LEASE:?}); samples with both running them: {overlaps} of {}; {MIGRATION_LEASE} holders relative to the deletion: {history:?}",
            env.cluster.backend().name(),
            MIGRATED,
            samples.len()
        );
        assert_eq!(overlaps, 0, "both managers ran the migrated controllers at once");
        assert!(gap <= LEASE, "the hand-over left them unowned for {gap:?}, longer than the {LEASE:?} lease");
        let new_holder = holder(&env, MIGRATION_LEASE).await.expect("the migration Lease is held");
        assert!(new_holder.starts_with("ccm-new-"), "{new_holder}");
        op.stop().await.unwrap();
        kubelet.shutdown().await;
        env.finish().await;
    }
}

/// The moved resource's name, the same in both namespaces.
const MOVING: &str = "moving";

/// [`spec`] with the migration Lease in `lease_namespace`.
fn spec_in(lease_namespace: &str) -> Value {
    let mut spec = spec();
    spec["leaderElection"]["migration"]["leaseNamespace"] = json!(lease_namespace);
    spec
}

/// Server-side apply CloudControllerManager `namespace/name` (harness client).
async fn apply_cr_in(env: &Env, namespace: &str, name: &str, spec: Value) {
    let body = json!({
        "apiVersion": "ccm.rs/v1alpha1",
        "kind": "CloudControllerManager",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    });
    let crs: Api<CloudControllerManager> = Api::namespaced(env.harness.clone(), namespace);
    crs.patch(name, &PatchParams::apply(HARNESS_AGENT).force(), &Patch::Apply(&body))
        .await
        .unwrap_or_else(|e| panic!("applying CloudControllerManager {namespace}/{name}: {e}"));
}

/// The cloud-config Secret `cfg` in `namespace`.
async fn secret_in(env: &Env, namespace: &str) {
    let secret = testkit::cloud_config_secret(namespace, "cfg", "cloud.conf", b"autoInstances: true\nlatency: 1ms\n");
    Api::<Secret>::namespaced(env.harness.clone(), namespace)
        .patch("cfg", &PatchParams::apply(HARNESS_AGENT).force(), &Patch::Apply(&secret))
        .await
        .expect("the Secret is applied");
}

/// An operator serving `namespaces` (all allowed).
async fn operator_for(env: &Env, namespaces: &[&str]) -> operator::OperatorHandle {
    let mut config = env.operator_config();
    config.scope = operator::Scope::Namespaces(namespaces.iter().map(|n| n.to_string()).collect());
    operator::start(config).await.expect("the operator starts")
}

/// Wait until condition `type_` of `namespace/name` satisfies `check`.
async fn wait_condition_in(
    env: &Env,
    namespace: &str,
    name: &str,
    type_: &str,
    check: impl Fn(&k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition) -> bool,
) {
    let crs: Api<CloudControllerManager> = Api::namespaced(env.harness.clone(), namespace);
    let found = poll_within(WAIT, || async {
        let cr = crs.get_opt(name).await.ok().flatten()?;
        crate::kit::condition(&cr, type_).filter(|c| check(c))
    })
    .await;
    let last = crs.get_opt(name).await.ok().flatten().and_then(|cr| crate::kit::condition(&cr, type_));
    assert!(found.is_some(), "{type_} of {namespace}/{name} never matched; last seen: {last:?}");
}

async fn holder_in(env: &Env, namespace: &str, lease: &str) -> Option<String> {
    Api::<Lease>::namespaced(env.harness.clone(), namespace).get_opt(lease).await.ok().flatten()?.spec?.holder_identity
}

/// The namespace of the pod whose name starts `holder` (a manager's identity is
/// `<pod name>_<random>`), terminating pods included.
fn namespace_of(kubelet: &Kubelet, holder: Option<&str>) -> Option<String> {
    let holder = holder?;
    kubelet.pods().into_iter().find(|p| holder.starts_with(&format!("{}_", p.name))).map(|p| p.namespace)
}

/// The migration Lease's Role and RoleBindings for resource `owner_ns/name` in `lease_ns`:
/// which of (Role, RoleBinding, create RoleBinding) exist.
async fn grants_in(env: &Env, lease_ns: &str, owner_ns: &str, name: &str) -> [bool; 3] {
    let roles: Api<Role> = Api::namespaced(env.harness.clone(), lease_ns);
    let bindings: Api<RoleBinding> = Api::namespaced(env.harness.clone(), lease_ns);
    let role = names::migration_role_name(owner_ns, name);
    let create = names::migration_create_binding_name(owner_ns, name);
    [
        roles.get_opt(&role).await.ok().flatten().is_some(),
        bindings.get_opt(&role).await.ok().flatten().is_some(),
        bindings.get_opt(&create).await.ok().flatten().is_some(),
    ]
}

/// One observation of both namespaces' managers.
struct NsSample {
    at: Instant,
    old: bool,
    new: bool,
    /// The namespace of the migration Lease holder's pod (`None`: no holder), read at once: the
    /// old pods are gone by the end.
    holder: Option<String>,
}

testkit::backend_tests! {
    async fn m7_a_resource_moved_to_a_new_namespace_hands_its_migrated_controllers_over_through_the_lease_namespace_without_a_gap_or_an_overlap(backend) {
        let env = Env::start(backend, "migration-ns").await;
        let binary = kubelet::manager_binary().expect("the cloud-controller-manager binary");
        let kubelet = Kubelet::start(KubeletConfig::new(env.client.clone(), env.cluster.kubeconfig_path(), binary))
            .expect("the emulated kubelet starts");
        let old_ns = env.ns.clone();
        let new_ns = env.cluster.fresh_namespace("e2e-migration-new").await.expect("a namespace");
        let lease_ns = env.cluster.fresh_namespace("e2e-migration-lease").await.expect("a namespace");
        secret_in(&env, &old_ns).await;
        secret_in(&env, &new_ns).await;
        let op = operator_for(&env, &[&old_ns, &new_ns, &lease_ns]).await;
        let sample = || async {
            let old = runs_migrated(&kubelet, &old_ns, "ccm-moving").await;
            let new = runs_migrated(&kubelet, &new_ns, "ccm-moving").await;
            let holder = holder_in(&env, &lease_ns, MIGRATION_LEASE).await;
            let holder = holder.map(|h| namespace_of(&kubelet, Some(&h)).unwrap_or_else(|| format!("unknown pod {h}")));
            NsSample { at: Instant::now(), old, new, holder }
        };

        apply_cr_in(&env, &old_ns, MOVING, spec_in(&lease_ns)).await;
        let mut samples = Vec::new();
        let started = Instant::now();
        loop {
            let s = sample().await;
            let done = s.old;
            samples.push(s);
            if done {
                break;
            }
            assert!(started.elapsed() < WAIT, "the old namespace's manager never ran the migrated controllers");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let old_holder = holder_in(&env, &lease_ns, MIGRATION_LEASE).await;
        assert_eq!(namespace_of(&kubelet, old_holder.as_deref()).as_deref(), Some(old_ns.as_str()), "{old_holder:?}");
        assert!(holder_in(&env, &old_ns, MIGRATION_LEASE).await.is_none(), "no migration Lease in the resource's own namespace");
        assert_eq!(grants_in(&env, &lease_ns, &old_ns, MOVING).await, [true; 3]);

        // The same name in the new namespace: valid beside the old one (no Conflict), leading
        // its own Lease there, not running the migrated controllers while the old one holds the
        // migration Lease.
        apply_cr_in(&env, &new_ns, MOVING, spec_in(&lease_ns)).await;
        wait_condition_in(&env, &new_ns, MOVING, "ConfigValid", |c| c.status == "True").await;
        let started = Instant::now();
        loop {
            let own = holder_in(&env, &new_ns, MOVING).await;
            if namespace_of(&kubelet, own.as_deref()).as_deref() == Some(new_ns.as_str()) {
                break;
            }
            assert!(started.elapsed() < WAIT, "the new namespace's manager never led its own Lease");
            samples.push(sample().await);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        for _ in 0..20 {
            samples.push(sample().await);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(grants_in(&env, &lease_ns, &new_ns, MOVING).await, [true; 3]);

        // Delete the old resource: its manager stops, releases the Lease, the new one takes over.
        let old_crs: Api<CloudControllerManager> = Api::namespaced(env.harness.clone(), &old_ns);
        old_crs.delete(MOVING, &DeleteParams::default()).await.unwrap();
        let deleted = Instant::now();
        loop {
            let s = sample().await;
            let done = s.new && !s.old;
            samples.push(s);
            if done {
                break;
            }
            assert!(deleted.elapsed() < WAIT, "the new namespace's manager never took the migrated controllers over");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        for _ in 0..10 {
            samples.push(sample().await);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }

        let overlaps = samples.iter().filter(|s| s.old && s.new).count();
        let last_old = samples.iter().rev().find(|s| s.old).map(|s| s.at).expect("the old manager ran them");
        let first_new = samples.iter().find(|s| s.new).map(|s| s.at).expect("the new manager ran them");
        let gap = first_new.saturating_duration_since(last_old);
        let mut transitions: Vec<(Instant, Option<String>)> = Vec::new();
        for s in &samples {
            if transitions.last().map(|(_, h)| h) != Some(&s.holder) {
                transitions.push((s.at, s.holder.clone()));
            }
        }
        let history: Vec<String> = transitions
            .iter()
            .map(|(at, h)| {
                let ms = at.saturating_duration_since(deleted).as_millis() as i128
                    - deleted.saturating_duration_since(*at).as_millis() as i128;
                let from = match h.as_deref() {
                    None => "(none)",
                    Some(ns) if ns == old_ns => "old namespace",
                    Some(ns) if ns == new_ns => "new namespace",
                    Some(other) => other,
                };
                format!("{ms:+} ms: {from}")
            })
            .collect();
        println!(
            "ours to ours, new namespace ({}): longest interval with no manager running {:?}: {gap:?} (lease {LEASE:?}); samples with both running them: {overlaps} of {}; {lease_ns}/{MIGRATION_LEASE} holders relative to the deletion: {history:?}",
            env.cluster.backend().name(),
            MIGRATED,
            samples.len()
        );
        assert_eq!(overlaps, 0, "both managers ran the migrated controllers at once");
        assert!(gap <= LEASE, "the hand-over left them unowned for {gap:?}, longer than the {LEASE:?} lease");
        let new_holder = holder_in(&env, &lease_ns, MIGRATION_LEASE).await;
        assert_eq!(namespace_of(&kubelet, new_holder.as_deref()).as_deref(), Some(new_ns.as_str()), "{new_holder:?}");
        // The new resource's status names the Lease and its holder.
        let new_crs: Api<CloudControllerManager> = Api::namespaced(env.harness.clone(), &new_ns);
        let want = crds::v1alpha1::MigrationLeaseStatus {
            namespace: lease_ns.clone(),
            name: MIGRATION_LEASE.into(),
            holder: new_holder.clone(),
        };
        let shown = poll_within(WAIT, || async {
            let status = new_crs.get(MOVING).await.ok()?.status?;
            (status.migration_lease.as_ref() == Some(&want)).then_some(())
        })
        .await;
        assert!(shown.is_some(), "status.migrationLease never showed {want:?}");

        // The finalizer removed the old resource's grant in the lease namespace (no
        // ownerReference can, across namespaces), and left the new one's.
        let gone = poll_within(WAIT, || async {
            (grants_in(&env, &lease_ns, &old_ns, MOVING).await == [false; 3]).then_some(())
        })
        .await;
        assert!(gone.is_some(), "the old resource's Role and RoleBindings in {lease_ns} remain");
        assert_eq!(grants_in(&env, &lease_ns, &new_ns, MOVING).await, [true; 3]);
        op.stop().await.unwrap();
        kubelet.shutdown().await;
        env.finish().await;
    }

    async fn m7_the_migration_lease_grant_in_another_namespace_follows_the_field_and_is_removed_with_the_resource(backend) {
        let env = Env::start(backend, "migration-grant").await;
        let first = env.cluster.fresh_namespace("e2e-migration-first").await.expect("a namespace");
        let second = env.cluster.fresh_namespace("e2e-migration-second").await.expect("a namespace");
        env.secret("cfg", "cloud.conf", "autoInstances: true\n").await;
        let op = operator_for(&env, &[&env.ns, &first, &second]).await;
        let wait_grants = |lease_ns: String, want: [bool; 3]| {
            let env = &env;
            async move {
                let seen = poll_within(WAIT, || async {
                    (grants_in(env, &lease_ns, &env.ns, MOVING).await == want).then_some(())
                })
                .await;
                let now = grants_in(env, &lease_ns, &env.ns, MOVING).await;
                assert!(seen.is_some(), "(Role, RoleBinding, create RoleBinding) in {lease_ns}: {now:?}, wanted {want:?}");
            }
        };

        env.apply_cr(MOVING, spec_in(&first)).await;
        wait_grants(first.clone(), [true; 3]).await;
        // What is granted there: the one migration Lease (get, update), and creating a Lease;
        // to this resource's ServiceAccount only; no ownerReference, the owner's labels.
        let role = Api::<Role>::namespaced(env.harness.clone(), &first)
            .get(&names::migration_role_name(&env.ns, MOVING))
            .await
            .unwrap();
        let rules = role.rules.clone().unwrap();
        assert_eq!(rules.len(), 1);
        assert_eq!(rules[0].resources.clone().unwrap(), ["leases"]);
        assert_eq!(rules[0].resource_names.clone().unwrap(), [MIGRATION_LEASE]);
        assert_eq!(rules[0].verbs, ["get", "update"]);
        assert!(role.metadata.owner_references.is_none());
        let uid = env.cr(MOVING).await.metadata.uid.unwrap();
        assert_eq!(role.metadata.labels.unwrap()[names::LABEL_OWNER_UID], uid);
        let bindings: Api<RoleBinding> = Api::namespaced(env.harness.clone(), &first);
        for name in [names::migration_role_name(&env.ns, MOVING), names::migration_create_binding_name(&env.ns, MOVING)] {
            let b = bindings.get(&name).await.unwrap();
            let subjects = b.subjects.unwrap();
            assert_eq!(subjects.len(), 1);
            assert_eq!(
                (subjects[0].kind.as_str(), subjects[0].name.as_str(), subjects[0].namespace.as_deref()),
                ("ServiceAccount", names::workload_name(MOVING).as_str(), Some(env.ns.as_str()))
            );
        }
        // The resource's own Role no longer names the migration Lease: it is elsewhere.
        let own = env.api::<Role>().get(&names::own_role_name(MOVING)).await.unwrap();
        assert_eq!(own.rules.unwrap()[0].resource_names.clone().unwrap(), [MOVING]);

        // Moving the Lease to another namespace moves the grant.
        env.apply_cr(MOVING, spec_in(&second)).await;
        wait_grants(second.clone(), [true; 3]).await;
        wait_grants(first.clone(), [false; 3]).await;

        // A namespace the operator does not serve is refused, naming the field; the grant stays.
        env.apply_cr(MOVING, spec_in("not-served")).await;
        env.wait_condition(MOVING, "ConfigValid", |c| {
            c.status == "False"
                && c.reason == "NamespaceNotAllowed"
                && c.message.starts_with("spec.leaderElection.migration.leaseNamespace:")
        })
        .await;
        assert_eq!(grants_in(&env, &second, &env.ns, MOVING).await, [true; 3]);

        // Deleting the resource removes the grant (the finalizer's work; here the field names
        // the namespace it was refused for, where nothing was granted) and then the resource.
        env.crs().delete(MOVING, &DeleteParams::default()).await.unwrap();
        wait_grants(second.clone(), [false; 3]).await;
        let gone = poll_within(WAIT, || async { env.crs().get_opt(MOVING).await.ok()?.is_none().then_some(()) }).await;
        assert!(gone.is_some(), "the resource's finalizer was never removed");
        op.stop().await.unwrap();
        env.finish().await;
    }
}

testkit::backend_tests! {
    async fn m7_an_embedded_engine_takes_its_migration_lease_in_the_lease_namespace_and_status_names_the_holder(backend) {
        let env = Env::start(backend, "migration-embedded").await;
        let lease_ns = env.cluster.fresh_namespace("e2e-migration-elease").await.expect("a namespace");
        env.secret("cfg", "cloud.conf", "autoInstances: true\n").await;
        let op = operator_for(&env, &[&env.ns, &lease_ns]).await;
        let mut spec = spec_in(&lease_ns);
        spec["mode"] = json!("Embedded");
        spec.as_object_mut().unwrap().remove("deployment");
        env.apply_cr(MOVING, spec).await;
        let holder = poll_within(WAIT, || holder_in(&env, &lease_ns, MIGRATION_LEASE)).await;
        let holder = holder.expect("the embedded engine holds the migration Lease in the lease namespace");
        assert!(holder_in(&env, &env.ns, MIGRATION_LEASE).await.is_none(), "none in the resource's namespace");
        let want =
            crds::v1alpha1::MigrationLeaseStatus { namespace: lease_ns.clone(), name: MIGRATION_LEASE.into(), holder: Some(holder) };
        let shown = poll_within(WAIT, || async {
            (env.cr(MOVING).await.status?.migration_lease.as_ref() == Some(&want)).then_some(())
        })
        .await;
        assert!(shown.is_some(), "status.migrationLease never showed {want:?}: {:?}", env.cr(MOVING).await.status);
        // The operator's own rights run an embedded engine: nothing is granted in the lease namespace.
        assert_eq!(grants_in(&env, &lease_ns, &env.ns, MOVING).await, [false; 3]);
        op.stop().await.unwrap();
        env.finish().await;
    }
}

/// The chart's admission policies and RBAC (genuine kube-apiserver) admit the operator's grant of
/// a migration Lease in another namespace, as its ServiceAccount makes it, and refuse the
/// neighbouring grants a manager never needs, naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn m7_the_chart_admits_the_migration_lease_grant_in_another_namespace_and_nothing_broader() {
    use testkit::{Backend, TestCluster};
    if !Backend::genuine_available() {
        eprintln!("SKIPPED: needs the genuine API server (CCM_TEST_ASSETS): admission policies");
        return;
    }
    let cluster = TestCluster::start(Backend::Genuine).await.expect("the API server starts");
    cluster.install_crd(&crds::crd()).await.expect("the CRD installs");
    let admin = cluster.client();
    let managers = cluster.fresh_namespace("e2e-vapm-cloud").await.unwrap();
    let lease_ns = cluster.fresh_namespace("e2e-vapm-lease").await.unwrap();
    let release_ns = cluster.fresh_namespace("e2e-vapm-system").await.unwrap();
    let release = format!("vapm{}", std::process::id());
    let values = json!({"cloudConfig": {"namespaces": [managers, lease_ns]}});
    let Some((_, operator_client)) =
        crate::kit::install_chart_rbac_and_policies(&cluster, &values, &release, &release_ns).await
    else {
        return;
    };

    let resource = json!({
        "apiVersion": "ccm.rs/v1alpha1", "kind": "CloudControllerManager",
        "metadata": {"name": "cloud", "namespace": managers},
        "spec": {"provider": "fake", "cloudConfig": {"secretRef": {"name": "cfg"}}, "clusterCIDR": "10.244.0.0/16",
                 "leaderElection": {"migration": {"enabled": true, "leaseNamespace": lease_ns}}},
    });
    crate::kit::apply_dynamic(&admin, &resource).await.expect("the resource is stored");
    let stored = Api::<CloudControllerManager>::namespaced(admin.clone(), &managers).get("cloud").await.unwrap();
    let mut cr = resource.clone();
    cr["metadata"]["uid"] = json!(stored.metadata.uid);
    let built: Vec<Value> = crate::kit::operator_children(cr, &operator::BuildSettings::default())
        .iter()
        .map(operator::build::Desired::to_json)
        .collect();
    let there: Vec<&Value> = built.iter().filter(|o| o["metadata"]["namespace"] == json!(lease_ns)).collect();
    assert_eq!(there.len(), 3, "a Role and two RoleBindings in the lease namespace");
    let role = there.iter().find(|o| o["kind"] == "Role").copied().expect("the migration Role").clone();
    let binding = there
        .iter()
        .find(|o| o["kind"] == "RoleBinding" && o["roleRef"]["kind"] == "Role")
        .copied()
        .expect("the migration RoleBinding")
        .clone();
    let create = there
        .iter()
        .find(|o| o["kind"] == "RoleBinding" && o["roleRef"]["kind"] == "ClusterRole")
        .copied()
        .expect("the create RoleBinding")
        .clone();

    // Admitted, and allowed by the operator's RBAC there, as its ServiceAccount makes them (the
    // Role first; RBAC's cache may lag behind a Role just made, so bindings are retried).
    for object in [&role, &binding, &create] {
        let started = Instant::now();
        while let Err(e) = crate::kit::apply_as_operator(&operator_client, object, false).await {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "the operator's own {} {} was not admitted: {e}",
                object["kind"],
                object["metadata"]["name"]
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    let crafted: Vec<(&str, Value, &str)> = vec![
        (
            "a migration Role naming two Leases",
            crate::kit::edited(&role, |r| r["rules"][0]["resourceNames"] = json!([MIGRATION_LEASE, "kube-scheduler"])),
            "one Lease",
        ),
        (
            "a migration Role on the resource",
            crate::kit::edited(&role, |r| {
                r["rules"].as_array_mut().unwrap().push(json!({"apiGroups": ["ccm.rs"],
                    "resources": ["cloudcontrollermanagers"], "verbs": ["get"], "resourceNames": ["cloud"]}))
            }),
            "one Lease",
        ),
        (
            "a binding across namespaces under another resource's name",
            crate::kit::edited(&binding, |b| {
                b["metadata"]["name"] = json!(names::migration_role_name("elsewhere", "cloud"))
            }),
            "subjects",
        ),
        (
            "the namespace role bound across namespaces under a plain name",
            crate::kit::edited(&create, |b| b["metadata"]["name"] = json!(names::role_binding_name("cloud"))),
            "subjects",
        ),
    ];
    for (what, object, field) in &crafted {
        // The API server loads the policies on its own: retry while admitted (bounded).
        let started = Instant::now();
        let message = loop {
            match crate::kit::apply_as_operator(&operator_client, object, true).await {
                Ok(()) if started.elapsed() < Duration::from_secs(60) => {
                    tokio::time::sleep(Duration::from_millis(250)).await
                }
                Err(kube::Error::Api(s)) if s.code == 422 || s.code == 403 => break s.message,
                other => panic!("{what}: expected a refusal by the admission policy, got {other:?}"),
            }
        };
        assert!(message.contains(field), "{what}: the refusal should name {field}: {message}");
    }

    // What the manager's ServiceAccount may then do in the lease namespace, as RBAC decides:
    // the elector's three verbs on that one Lease, and nothing else.
    let user = format!("system:serviceaccount:{managers}:{}", names::workload_name("cloud"));
    let groups = vec!["system:serviceaccounts".to_string(), format!("system:serviceaccounts:{managers}")];
    let may = |verb: &'static str, resource: &'static str, name: Option<&'static str>| {
        let (admin, user, groups, lease_ns) = (admin.clone(), user.clone(), groups.clone(), lease_ns.clone());
        async move {
            use k8s_openapi::api::authorization::v1::{
                ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
            };
            let group = if resource == "leases" { "coordination.k8s.io" } else { "" };
            let review = SubjectAccessReview {
                spec: SubjectAccessReviewSpec {
                    user: Some(user),
                    groups: Some(groups),
                    resource_attributes: Some(ResourceAttributes {
                        namespace: Some(lease_ns),
                        verb: Some(verb.into()),
                        group: Some(group.into()),
                        resource: Some(resource.into()),
                        name: name.map(str::to_string),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                ..Default::default()
            };
            let answer = Api::<SubjectAccessReview>::all(admin)
                .create(&kube::api::PostParams::default(), &review)
                .await
                .expect("a SubjectAccessReview");
            answer.status.is_some_and(|s| s.allowed)
        }
    };
    for (verb, name) in [("get", Some(MIGRATION_LEASE)), ("update", Some(MIGRATION_LEASE)), ("create", None)] {
        // RBAC's cache may lag behind the bindings just made.
        let allowed =
            poll_within(Duration::from_secs(60), || async { may(verb, "leases", name).await.then_some(()) }).await;
        assert!(allowed.is_some(), "the manager may not {verb} the migration Lease in {lease_ns}");
    }
    for (verb, resource, name) in [
        ("update", "leases", Some("kube-scheduler")),
        ("get", "leases", Some("kube-scheduler")),
        ("patch", "leases", Some(MIGRATION_LEASE)),
        ("delete", "leases", Some(MIGRATION_LEASE)),
        ("list", "leases", None),
        ("get", "secrets", Some("cfg")),
    ] {
        assert!(!may(verb, resource, name).await, "the manager may {verb} {resource} {name:?} in {lease_ns}");
    }
}
