//! Watch wiring: what the controller watches and which CR each event wakes.
//!
//! Watches (each label- or field-selected, with `managedFields` stripped): the CRs in every
//! served namespace (through a deserialization guard, so one malformed object cannot stall the
//! others); and only in the allowed namespaces (`--cloud-config-namespaces`, where the chart
//! grants namespaced Roles), one watcher per namespace merged into one store: the children
//! (owned Deployments, DaemonSets, ServiceAccounts, Roles, RoleBindings, PDBs), Secret metadata
//! (mapped to the CRs referencing the Secret), and Leases (mapped to the CR of the same name
//! when the holder changes). The ClusterRoleBinding is watched cluster-wide by label and mapped
//! through its owner annotation. A reconcile reads only these caches, except a referenced
//! Secret's data after it changed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use ccm_provider_baremetal::announce::bgp_sessions::SESSIONS_ANNOTATION;
use ccm_provider_baremetal::announce::health::UNHEALTHY_ANNOTATION;
use crds::CloudControllerManager;
use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, Secret, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, Role, RoleBinding};
use kube::api::{ObjectMeta, PartialObjectMeta};
use kube::runtime::controller::{Config as ControllerConfig, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{PredicateConfig, WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::context::{Ctx, Guarded, Shared};
use super::memory::Memory;
use super::pipeline::{error_policy, reconcile};
use crate::apply::{Applier, ChildKey, ChildStores};
use crate::build::Kind;
use crate::dereference::{self, PeerCache, SecretReader};
use crate::names;
use crate::validate;
use crate::watch;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn strip<K: Resource>(o: &mut K) {
    let meta = o.meta_mut();
    meta.managed_fields = None;
    if let Some(a) = meta.annotations.as_mut() {
        a.remove("kubectl.kubernetes.io/last-applied-configuration");
    }
}

/// A label-selected, merged, stripped watch of children of kind `K`, feeding `writer`;
/// deletions make the applier forget the object.
fn child_stream<K>(
    apis: Vec<Api<K>>,
    kind: Kind,
    applier: Arc<Applier>,
    extra_strip: fn(&mut K),
) -> (Store<K>, Watched<K>)
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
{
    let (reader, writer) = reflector::store();
    let config = watcher::Config::default().labels(&names::managed_selector());
    let stream = watch::merged(apis, config, reader.clone())
        .modify(move |o| {
            strip(o);
            extra_strip(o);
        })
        .inspect(move |e| {
            if let Ok(watcher::Event::Delete(o)) = e {
                applier.forget(&ChildKey::from_meta(kind, o.meta()));
            }
        })
        .reflect(writer)
        .touched_objects()
        .boxed();
    (reader, stream)
}

fn no_extra<K>(_: &mut K) {}

fn strip_deployment(d: &mut Deployment) {
    if let Some(spec) = d.spec.as_mut() {
        spec.template.spec = None;
    }
}

fn strip_daemon_set(d: &mut DaemonSet) {
    if let Some(spec) = d.spec.as_mut() {
        spec.template.spec = None;
    }
}

/// One `Api` per namespace of `namespaces`.
fn namespaced_apis<K>(client: &Client, namespaces: &[String]) -> Vec<Api<K>>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    K::DynamicType: Default,
{
    namespaces.iter().map(|ns| Api::namespaced(client.clone(), ns)).collect()
}

/// A stream of watched objects of kind `K`.
type Watched<K> = BoxStream<'static, Result<K, watcher::Error>>;

/// The watches of every kind of child, by kind.
struct ChildStreams {
    deployments: Watched<Deployment>,
    daemon_sets: Watched<DaemonSet>,
    service_accounts: Watched<PartialObjectMeta<ServiceAccount>>,
    role_bindings: Watched<PartialObjectMeta<RoleBinding>>,
    roles: Watched<PartialObjectMeta<Role>>,
    pdbs: Watched<PartialObjectMeta<PodDisruptionBudget>>,
    cluster_role_bindings: Watched<PartialObjectMeta<ClusterRoleBinding>>,
}

/// The children in `namespaces` (ClusterRoleBindings cluster-wide), labelled as the operator's.
fn child_watches(client: &Client, namespaces: &[String], applier: &Arc<Applier>) -> (ChildStores, ChildStreams) {
    let (deployments, deployment_stream) = child_stream(
        namespaced_apis::<Deployment>(client, namespaces),
        Kind::Deployment,
        applier.clone(),
        strip_deployment,
    );
    let (daemon_sets, daemon_set_stream) = child_stream(
        namespaced_apis::<DaemonSet>(client, namespaces),
        Kind::DaemonSet,
        applier.clone(),
        strip_daemon_set,
    );
    let (service_accounts, sa_stream) = child_stream(
        namespaced_apis::<PartialObjectMeta<ServiceAccount>>(client, namespaces),
        Kind::ServiceAccount,
        applier.clone(),
        no_extra,
    );
    let (role_bindings, rb_stream) = child_stream(
        namespaced_apis::<PartialObjectMeta<RoleBinding>>(client, namespaces),
        Kind::RoleBinding,
        applier.clone(),
        no_extra,
    );
    let (roles, role_stream) = child_stream(
        namespaced_apis::<PartialObjectMeta<Role>>(client, namespaces),
        Kind::Role,
        applier.clone(),
        no_extra,
    );
    let (pdbs, pdb_stream) = child_stream(
        namespaced_apis::<PartialObjectMeta<PodDisruptionBudget>>(client, namespaces),
        Kind::PodDisruptionBudget,
        applier.clone(),
        no_extra,
    );
    let (cluster_role_bindings, crb_stream) = child_stream(
        vec![Api::<PartialObjectMeta<ClusterRoleBinding>>::all(client.clone())],
        Kind::ClusterRoleBinding,
        applier.clone(),
        no_extra,
    );
    let stores =
        ChildStores { service_accounts, cluster_role_bindings, role_bindings, roles, deployments, daemon_sets, pdbs };
    let streams = ChildStreams {
        deployments: deployment_stream,
        daemon_sets: daemon_set_stream,
        service_accounts: sa_stream,
        role_bindings: rb_stream,
        roles: role_stream,
        pdbs: pdb_stream,
        cluster_role_bindings: crb_stream,
    };
    (stores, streams)
}

/// The metadata of the Secrets in `namespaces` labelled as cloud-configs: a resource cannot
/// point the operator at any other Secret of the namespace (bootstrap tokens, other
/// components' credentials).
fn secret_watch(
    client: &Client,
    namespaces: &[String],
) -> (Store<PartialObjectMeta<Secret>>, Watched<PartialObjectMeta<Secret>>) {
    let (secrets, secrets_writer) = reflector::store::<PartialObjectMeta<Secret>>();
    let stream = watch::merged(
        namespaced_apis::<PartialObjectMeta<Secret>>(client, namespaces),
        watcher::Config::default().labels(&names::cloud_config_selector()),
        secrets.clone(),
    )
    .modify(|s| {
        // Only the name and resourceVersion are needed.
        let m = &mut s.metadata;
        *m = ObjectMeta {
            name: m.name.take(),
            namespace: m.namespace.take(),
            resource_version: m.resource_version.take(),
            uid: m.uid.take(),
            ..Default::default()
        };
    })
    .reflect(secrets_writer)
    .touched_objects()
    .boxed();
    (secrets, stream)
}

/// The Leases in `namespaces`; only a change of holder is news, or of what an announcer's
/// Lease says of it (its health mark, its BGP sessions).
fn lease_watch(client: &Client, namespaces: &[String]) -> (Store<Lease>, Watched<Lease>) {
    let (leases, leases_writer) = reflector::store::<Lease>();
    let stream =
        watch::merged(namespaced_apis::<Lease>(client, namespaces), watcher::Config::default(), leases.clone())
            .modify(strip)
            .reflect(leases_writer)
            .touched_objects()
            // Renewals are not news; a new holder is.
            .predicate_filter(
                |l: &Lease| {
                    use std::hash::{Hash, Hasher};
                    let mut h = std::collections::hash_map::DefaultHasher::new();
                    l.spec.as_ref().and_then(|s| s.holder_identity.clone()).hash(&mut h);
                    let annotations = l.metadata.annotations.as_ref();
                    for key in [UNHEALTHY_ANNOTATION, SESSIONS_ANNOTATION] {
                        annotations.and_then(|a| a.get(key)).hash(&mut h);
                    }
                    Some(h.finish())
                },
                PredicateConfig::default(),
            )
            .boxed();
    (leases, stream)
}

/// The manager Pods in `namespaces`, stripped to what status and teardown read.
fn pod_watch(client: &Client, namespaces: &[String]) -> (Store<Pod>, Watched<Pod>) {
    let (pods, pods_writer) = reflector::store::<Pod>();
    let seen_pods: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
    let stream = watch::merged(
        namespaced_apis::<Pod>(client, namespaces),
        watcher::Config::default().labels(&names::managed_selector()),
        pods.clone(),
    )
    .modify(dereference::strip_pod)
    .reflect(pods_writer)
    // Only what status and teardown read is news (not every kubelet heartbeat); a deletion
    // always is.
    .filter_map(move |event| {
        let seen = seen_pods.clone();
        async move {
            match event {
                Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => {
                    let summary = pod_summary(&p);
                    let before = lock(&seen).insert(p.uid().unwrap_or_default(), summary);
                    (before != Some(summary)).then_some(Ok(p))
                }
                Ok(watcher::Event::Delete(p)) => {
                    lock(&seen).remove(&p.uid().unwrap_or_default());
                    Some(Ok(p))
                }
                Ok(_) => None,
                Err(e) => Some(Err(e)),
            }
        }
    })
    .boxed();
    (pods, stream)
}

/// Run the controller until `stop` fires.
pub async fn run(shared: Shared, trigger_rx: mpsc::UnboundedReceiver<ObjectRef<Guarded>>, stop: CancellationToken) {
    let client = shared.client.clone();
    let scope = shared.scope.clone();
    let applier = Arc::new(Applier::new(client.clone()));
    // Everything but the CRs and the ClusterRoleBindings is watched only where the operator may
    // work: RBAC grants it Secrets, Leases and the manager's objects there and nowhere else.
    let workload_namespaces = scope.within(shared.allowed.as_slice());
    tracing::info!(namespaces = ?workload_namespaces, "watching Secrets, Leases and manager objects");

    let (cr_reader, cr_writer) = reflector::store::<Guarded>();
    let cr_stream = watch::merged(scope.apis::<Guarded>(&client), watcher::Config::default(), cr_reader.clone())
        .modify(strip)
        .reflect(cr_writer)
        .applied_objects();
    let (children, child_streams) = child_watches(&client, &workload_namespaces, &applier);
    let (secrets, secret_stream) = secret_watch(&client, &workload_namespaces);
    let (leases, lease_stream) = lease_watch(&client, &workload_namespaces);
    let (pods, pod_stream) = pod_watch(&client, &workload_namespaces);

    let (ready_tx, ready) = tokio::sync::watch::channel(false);
    let ctx = Arc::new(Ctx {
        shared: shared.clone(),
        crs: cr_reader.clone(),
        children,
        secrets,
        leases,
        pods,
        secret_reader: SecretReader::default(),
        peers: PeerCache::default(),
        applier,
        memory: Memory::default(),
        ready,
    });
    let gate = ctx.clone();
    tokio::spawn(async move {
        gate.children.wait_ready().await;
        let _ = gate.secrets.wait_until_ready().await;
        let _ = gate.leases.wait_until_ready().await;
        let _ = gate.pods.wait_until_ready().await;
        let _ = ready_tx.send(true);
    });

    let (crs_for_secrets, crs_for_leases, crs_for_pods) = (cr_reader.clone(), cr_reader.clone(), cr_reader.clone());
    let triggers = futures::stream::unfold(trigger_rx, |mut rx| async move { rx.recv().await.map(|r| (r, rx)) });
    let config = ControllerConfig::default().debounce(shared.timings.debounce).concurrency(shared.timings.concurrency);
    let stopped = stop.clone();
    let ChildStreams { deployments, daemon_sets, service_accounts, role_bindings, roles, pdbs, cluster_role_bindings } =
        child_streams;
    Controller::for_stream(cr_stream, cr_reader)
        .with_config(config)
        .owns_stream(deployments)
        .owns_stream(daemon_sets)
        .owns_stream(service_accounts)
        // A migration Lease's Role and RoleBindings in another namespace carry no ownerReference.
        .watches_stream(role_bindings, |rb: PartialObjectMeta<RoleBinding>| owner_of_child(rb.meta()))
        .watches_stream(roles, |role: PartialObjectMeta<Role>| owner_of_child(role.meta()))
        .owns_stream(pdbs)
        .watches_stream(cluster_role_bindings, |crb: PartialObjectMeta<ClusterRoleBinding>| {
            owner_annotation(crb.annotations().get(names::ANNOTATION_OWNER).map(String::as_str))
        })
        .watches_stream(secret_stream, move |secret: PartialObjectMeta<Secret>| {
            referencing(&crs_for_secrets, &secret.namespace().unwrap_or_default(), &secret.name_any())
        })
        .watches_stream(lease_stream, move |lease: Lease| {
            let (namespace, name) = (lease.namespace().unwrap_or_default(), lease.name_any());
            // A foreign CCM's Lease changed hands: every resource's verdict may change.
            if validate::is_foreign_lease(&namespace, &name) {
                return crs_for_leases.state().iter().map(|o| ObjectRef::from_obj(&**o)).collect();
            }
            // An announcer's: the resources with announcers in its namespace (`Announcing`).
            if crate::announcing::is_announcers(&lease) {
                return with_announcers_in(&crs_for_leases, &namespace);
            }
            // Its own resource, and those whose migration Lease it is (status.migrationLease).
            let mut crs = migrating_under(&crs_for_leases, &namespace, &name);
            crs.push(ObjectRef::<Guarded>::new(&name).within(&namespace));
            crs
        })
        .watches_stream(pod_stream, move |pod: Pod| {
            owner_of_pod(&crs_for_pods, pod.labels().get(names::LABEL_OWNER_UID).map(String::as_str))
        })
        .reconcile_on(triggers)
        .graceful_shutdown_on(async move { stopped.cancelled().await })
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::debug!(%error, "reconcile trigger failed");
            }
        })
        .await;
}

/// The CR owning a namespaced child: its controller ownerReference, else (a child in another
/// namespace, which none can carry) its owner annotation.
fn owner_of_child(meta: &ObjectMeta) -> Option<ObjectRef<Guarded>> {
    let namespace = meta.namespace.as_deref()?;
    let kind = CloudControllerManager::kind(&());
    meta.owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true) && o.kind == kind)
        .map(|o| ObjectRef::new(&o.name).within(namespace))
        .or_else(|| owner_annotation(meta.annotations.as_ref()?.get(names::ANNOTATION_OWNER).map(String::as_str)))
}

/// The CRs whose leader-migration Lease is `namespace/name`.
fn migrating_under(crs: &Store<Guarded>, namespace: &str, name: &str) -> Vec<ObjectRef<Guarded>> {
    crs.state()
        .iter()
        .filter(|o| {
            o.0.as_ref().ok().is_some_and(|cr| {
                validate::migration_lease_name(&cr.spec).as_deref() == Some(name)
                    && validate::migration_lease_namespace(cr).as_deref() == Some(namespace)
            })
        })
        .map(|o| ObjectRef::from_obj(&**o))
        .collect()
}

/// The CRs in `namespace` that run announcers.
fn with_announcers_in(crs: &Store<Guarded>, namespace: &str) -> Vec<ObjectRef<Guarded>> {
    crs.state()
        .iter()
        .filter(|o| {
            o.0.as_ref()
                .ok()
                .is_some_and(|cr| cr.spec.announcer.is_some() && cr.namespace().as_deref() == Some(namespace))
        })
        .map(|o| ObjectRef::from_obj(&**o))
        .collect()
}

/// The CR named by a ClusterRoleBinding's owner annotation.
fn owner_annotation(value: Option<&str>) -> Option<ObjectRef<Guarded>> {
    let (ns, name) = value?.split_once('/')?;
    Some(ObjectRef::new(name).within(ns))
}

/// The CR whose UID a manager Pod's `ccm.rs/owner-uid` label names.
fn owner_of_pod(crs: &Store<Guarded>, uid: Option<&str>) -> Option<ObjectRef<Guarded>> {
    let uid = uid?;
    crs.state().iter().find(|o| o.uid().as_deref() == Some(uid)).map(|o| ObjectRef::from_obj(&**o))
}

/// A hash of what the operator reads from a manager Pod: its deletion and, per container,
/// readiness, restarts and state.
fn pod_summary(pod: &Pod) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    pod.metadata.deletion_timestamp.is_some().hash(&mut h);
    let statuses = pod.status.as_ref().and_then(|s| s.container_statuses.as_ref());
    for c in statuses.into_iter().flatten() {
        (&c.name, c.ready, c.restart_count).hash(&mut h);
        let state = c.state.as_ref();
        state.and_then(|s| s.waiting.as_ref()).and_then(|w| w.reason.as_deref()).hash(&mut h);
        state.is_some_and(|s| s.running.is_some()).hash(&mut h);
    }
    h.finish()
}

/// The CRs in `namespace` whose cloud-config is Secret `name`.
fn referencing(crs: &Store<Guarded>, namespace: &str, name: &str) -> Vec<ObjectRef<Guarded>> {
    crs.state()
        .iter()
        .filter(|o| o.namespace().as_deref() == Some(namespace))
        .filter(|o| {
            o.0.as_ref().ok().and_then(|c| c.spec.cloud_config.as_ref()).is_some_and(|s| s.secret_ref.name == name)
        })
        .map(|o| ObjectRef::from_obj(&**o))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_annotation_names_the_cr() {
        let r = owner_annotation(Some("kube-system/aws")).unwrap();
        assert_eq!((r.namespace.as_deref(), r.name.as_str()), (Some("kube-system"), "aws"));
        assert!(owner_annotation(Some("nonsense")).is_none());
        assert!(owner_annotation(None).is_none());
    }

    #[test]
    fn a_child_maps_to_its_owner_by_reference_or_across_namespaces_by_annotation() {
        let owned = ObjectMeta {
            namespace: Some("kube-system".into()),
            owner_references: Some(vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                kind: "CloudControllerManager".into(),
                name: "aws".into(),
                controller: Some(true),
                ..Default::default()
            }]),
            ..Default::default()
        };
        let r = owner_of_child(&owned).unwrap();
        assert_eq!((r.namespace.as_deref(), r.name.as_str()), (Some("kube-system"), "aws"));
        let foreign = ObjectMeta {
            namespace: Some("ccm-moving".into()),
            annotations: Some([(names::ANNOTATION_OWNER.to_string(), "ccm-a/aws".to_string())].into()),
            ..Default::default()
        };
        let r = owner_of_child(&foreign).unwrap();
        assert_eq!((r.namespace.as_deref(), r.name.as_str()), (Some("ccm-a"), "aws"));
        assert!(owner_of_child(&ObjectMeta { namespace: Some("x".into()), ..Default::default() }).is_none());
    }
}
