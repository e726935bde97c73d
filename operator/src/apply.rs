//! Apply: server-side apply of desired children with field manager `ccm-operator`, skipped
//! when nothing changed, and pruning of children (by the owner-UID label) that are no longer
//! wanted, for example after a mode switch.
//!
//! "Nothing changed" is decided without a request: every applied object carries a hash of
//! itself (`ccm.rs/applied-hash`); the operator remembers the hash and the `generation` the
//! server answered. An object is applied again when the desired hash differs, or when its
//! generation moved past the remembered one (someone else edited its spec).

use std::collections::HashMap;
use std::sync::Mutex;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, Role, RoleBinding};
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, ObjectMeta, PartialObjectMeta, Patch, PatchParams, Preconditions,
};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client, Resource};

use crate::desired::{Desired, Kind};
use crate::names;

/// Identifies one child object.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChildKey {
    /// Its kind.
    pub kind: Kind,
    /// Its namespace (`None` for the ClusterRoleBinding).
    pub namespace: Option<String>,
    /// Its name.
    pub name: String,
}

impl std::fmt::Display for ChildKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.kind, self.name)
    }
}

impl ChildKey {
    /// The key of a desired object.
    pub fn of(d: &Desired) -> Self {
        Self { kind: d.kind(), namespace: d.meta().namespace.clone(), name: d.name().to_string() }
    }

    /// The key of an observed object.
    pub fn from_meta(kind: Kind, meta: &ObjectMeta) -> Self {
        Self { kind, namespace: meta.namespace.clone(), name: meta.name.clone().unwrap_or_default() }
    }
}

/// Reflector stores of every child kind the operator manages (label-selected).
#[derive(Clone)]
pub struct ChildStores {
    /// ServiceAccounts (metadata only).
    pub service_accounts: Store<PartialObjectMeta<ServiceAccount>>,
    /// ClusterRoleBindings (metadata only).
    pub cluster_role_bindings: Store<PartialObjectMeta<ClusterRoleBinding>>,
    /// RoleBindings (metadata only).
    pub role_bindings: Store<PartialObjectMeta<RoleBinding>>,
    /// Roles (metadata only).
    pub roles: Store<PartialObjectMeta<Role>>,
    /// Deployments (pod spec stripped).
    pub deployments: Store<Deployment>,
    /// DaemonSets (pod spec stripped).
    pub daemon_sets: Store<DaemonSet>,
    /// PodDisruptionBudgets (metadata only).
    pub pdbs: Store<PartialObjectMeta<PodDisruptionBudget>>,
}

fn get_meta<K: Resource + Clone>(store: &Store<K>, namespace: Option<&str>, name: &str) -> Option<ObjectMeta>
where
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let mut key = ObjectRef::<K>::new(name);
    if let Some(ns) = namespace {
        key = key.within(ns);
    }
    store.get(&key).map(|o| o.meta().clone())
}

fn owned<K: Resource + Clone>(store: &Store<K>, kind: Kind, uid: &str) -> Vec<ChildKey>
where
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    store
        .state()
        .iter()
        .filter(|o| o.meta().labels.as_ref().and_then(|l| l.get(names::LABEL_OWNER_UID)).is_some_and(|u| u == uid))
        .map(|o| ChildKey::from_meta(kind, o.meta()))
        .collect()
}

impl ChildStores {
    /// The observed metadata of a child, if it exists.
    pub fn meta(&self, key: &ChildKey) -> Option<ObjectMeta> {
        let (ns, name) = (key.namespace.as_deref(), key.name.as_str());
        match key.kind {
            Kind::ServiceAccount => get_meta(&self.service_accounts, ns, name),
            Kind::ClusterRoleBinding => get_meta(&self.cluster_role_bindings, None, name),
            Kind::RoleBinding => get_meta(&self.role_bindings, ns, name),
            Kind::Role => get_meta(&self.roles, ns, name),
            Kind::Deployment => get_meta(&self.deployments, ns, name),
            Kind::DaemonSet => get_meta(&self.daemon_sets, ns, name),
            Kind::PodDisruptionBudget => get_meta(&self.pdbs, ns, name),
        }
    }

    /// Every child labelled with owner `uid`, sorted.
    pub fn owned_by(&self, uid: &str) -> Vec<ChildKey> {
        let mut out = owned(&self.service_accounts, Kind::ServiceAccount, uid);
        out.extend(owned(&self.cluster_role_bindings, Kind::ClusterRoleBinding, uid));
        out.extend(owned(&self.role_bindings, Kind::RoleBinding, uid));
        out.extend(owned(&self.roles, Kind::Role, uid));
        out.extend(owned(&self.deployments, Kind::Deployment, uid));
        out.extend(owned(&self.daemon_sets, Kind::DaemonSet, uid));
        out.extend(owned(&self.pdbs, Kind::PodDisruptionBudget, uid));
        out.sort();
        out
    }

    /// Wait until every store has listed once.
    pub async fn wait_ready(&self) {
        // A dropped writer means the operator is stopping; the reconcile then fails on I/O.
        let _ = self.service_accounts.wait_until_ready().await;
        let _ = self.cluster_role_bindings.wait_until_ready().await;
        let _ = self.role_bindings.wait_until_ready().await;
        let _ = self.roles.wait_until_ready().await;
        let _ = self.deployments.wait_until_ready().await;
        let _ = self.daemon_sets.wait_until_ready().await;
        let _ = self.pdbs.wait_until_ready().await;
    }
}

/// What the operator remembers of its last apply of one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// The applied-hash it wrote.
    pub hash: String,
    /// The `metadata.generation` the server answered (0 when the kind has none).
    pub generation: i64,
}

/// Whether `desired_hash` must be applied, given the memory of the last apply and the object
/// as observed (`(applied-hash annotation, generation)`).
pub fn needs_apply(desired_hash: &str, memo: Option<&Applied>, observed: Option<(Option<&str>, i64)>) -> bool {
    match (memo, observed) {
        (Some(m), Some((_, generation))) => m.hash != desired_hash || generation > m.generation,
        // Just created and not yet seen by the watch; a deletion clears the memory.
        (Some(m), None) => m.hash != desired_hash,
        // After a restart: trust the annotation.
        (None, Some((hash, _))) => hash != Some(desired_hash),
        (None, None) => true,
    }
}

/// Applies and deletes children.
pub struct Applier {
    client: Client,
    memo: Mutex<HashMap<ChildKey, Applied>>,
}

impl std::fmt::Debug for Applier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Applier").finish_non_exhaustive()
    }
}

fn api_resource(kind: Kind) -> ApiResource {
    match kind {
        Kind::ServiceAccount => ApiResource::erase::<ServiceAccount>(&()),
        Kind::ClusterRoleBinding => ApiResource::erase::<ClusterRoleBinding>(&()),
        Kind::RoleBinding => ApiResource::erase::<RoleBinding>(&()),
        Kind::Role => ApiResource::erase::<Role>(&()),
        Kind::Deployment => ApiResource::erase::<Deployment>(&()),
        Kind::DaemonSet => ApiResource::erase::<DaemonSet>(&()),
        Kind::PodDisruptionBudget => ApiResource::erase::<PodDisruptionBudget>(&()),
    }
}

impl Applier {
    /// An applier using `client`.
    pub fn new(client: Client) -> Self {
        Self { client, memo: Mutex::new(HashMap::new()) }
    }

    fn api(&self, key: &ChildKey) -> Api<DynamicObject> {
        let ar = api_resource(key.kind);
        match &key.namespace {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, &ar),
            None => Api::all_with(self.client.clone(), &ar),
        }
    }

    fn memo(&self) -> std::sync::MutexGuard<'_, HashMap<ChildKey, Applied>> {
        self.memo.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Apply `desired` unless nothing changed; `observed` is its current metadata. Returns
    /// whether a request was made.
    pub async fn apply(&self, desired: &Desired, observed: Option<&ObjectMeta>) -> Result<bool, kube::Error> {
        let key = ChildKey::of(desired);
        let hash = desired.applied_hash().unwrap_or_default().to_string();
        let seen = observed.map(|m| {
            let h = m.annotations.as_ref().and_then(|a| a.get(names::ANNOTATION_APPLIED_HASH)).map(String::as_str);
            (h, m.generation.unwrap_or(0))
        });
        let memo = self.memo().get(&key).cloned();
        if !needs_apply(&hash, memo.as_ref(), seen) {
            if memo.is_none()
                && let Some((_, generation)) = seen
            {
                self.memo().insert(key, Applied { hash, generation });
            }
            return Ok(false);
        }
        let params = PatchParams::apply(names::FIELD_MANAGER).force();
        let answer = self.api(&key).patch(&key.name, &params, &Patch::Apply(desired.to_json())).await?;
        let generation = answer.metadata.generation.unwrap_or(0);
        self.memo().insert(key, Applied { hash, generation });
        Ok(true)
    }

    /// The metadata of the object named like `key`, read from the server: the label-selected
    /// stores do not show an object someone else created under a child's name.
    pub async fn read_meta(&self, key: &ChildKey) -> Result<Option<ObjectMeta>, kube::Error> {
        Ok(self.api(key).get_metadata_opt(&key.name).await?.map(|o| o.metadata))
    }

    /// Whether this operator applied `key` and its watch has not reported it deleted since.
    pub fn remembers(&self, key: &ChildKey) -> bool {
        self.memo().contains_key(key)
    }

    /// Delete a child only if it is this operator's object for the CR `owner_uid`: it is read
    /// fresh, its labels are checked ([`is_owned_by`]), and the delete carries a UID
    /// precondition, so an object someone else made (or re-made) under the same name is never
    /// touched. RBAC cannot restrict `delete` by label; this is what does. Returns whether it
    /// was deleted.
    pub async fn delete_owned(&self, key: &ChildKey, owner_uid: &str) -> Result<bool, kube::Error> {
        let api = self.api(key);
        let Some(current) = api.get_opt(&key.name).await? else {
            self.forget(key);
            return Ok(false);
        };
        if !is_owned_by(&current.metadata, owner_uid) {
            tracing::warn!(object = %key, "not deleting an object the operator did not create");
            return Ok(false);
        }
        let params = DeleteParams {
            preconditions: Some(Preconditions { uid: current.metadata.uid.clone(), resource_version: None }),
            ..DeleteParams::background()
        };
        self.forget(key);
        match api.delete(&key.name, &params).await {
            Ok(_) => Ok(true),
            // Gone meanwhile, or replaced by another object of that name (precondition failed).
            Err(kube::Error::Api(s)) if s.is_not_found() || s.is_conflict() => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Forget the last apply of `key` (the object was deleted).
    pub fn forget(&self, key: &ChildKey) {
        self.memo().remove(key);
    }
}

/// An existing object under a child's name that the resource does not own: the operator
/// neither applies over it nor deletes it, and the resource's reconciliation stops.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NameConflict {
    /// The child whose name is taken.
    pub key: ChildKey,
}

impl NameConflict {
    /// The `NameConflict` message: kind, namespace and name only, never the object's content.
    pub fn message(&self) -> String {
        let k = &self.key;
        let at = match &k.namespace {
            Some(ns) => format!("{} {ns}/{}", k.kind, k.name),
            None => format!("{} {}", k.kind, k.name),
        };
        format!(
            "{at} already exists and is not owned by this CloudControllerManager (it lacks the labels {}={} and {} with this resource's UID); the operator does not modify it: rename the resource, or delete that object if it is a leftover",
            names::LABEL_MANAGED_BY,
            names::MANAGED_BY,
            names::LABEL_OWNER_UID
        )
    }
}

/// Whether the object observed under a child's name (if any) may be applied over for the CR with
/// UID `owner_uid` (pure): only when there is none or it is this resource's own.
pub fn may_apply_over(observed: Option<&ObjectMeta>, owner_uid: &str) -> bool {
    observed.is_none_or(|m| is_owned_by(m, owner_uid))
}

/// Whether `meta` marks an object this operator created for the CR with UID `owner_uid`: the
/// managed-by label and the owner-UID label both match.
pub fn is_owned_by(meta: &ObjectMeta, owner_uid: &str) -> bool {
    let label = |k: &str| meta.labels.as_ref().and_then(|l| l.get(k)).map(String::as_str);
    label(names::LABEL_MANAGED_BY) == Some(names::MANAGED_BY) && label(names::LABEL_OWNER_UID) == Some(owner_uid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_objects_labelled_for_the_owner_count_as_owned() {
        let meta = |labels: &[(&str, &str)]| ObjectMeta {
            labels: Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
            ..Default::default()
        };
        let ours = meta(&[(names::LABEL_MANAGED_BY, names::MANAGED_BY), (names::LABEL_OWNER_UID, "u1")]);
        assert!(is_owned_by(&ours, "u1"));
        assert!(!is_owned_by(&ours, "u2"));
        assert!(!is_owned_by(&meta(&[(names::LABEL_OWNER_UID, "u1")]), "u1"));
        assert!(!is_owned_by(&meta(&[(names::LABEL_MANAGED_BY, names::MANAGED_BY)]), "u1"));
        assert!(!is_owned_by(&ObjectMeta::default(), "u1"));
    }

    #[test]
    fn an_object_of_someone_else_under_a_childs_name_is_not_applied_over() {
        let labelled = |uid: &str| ObjectMeta {
            labels: Some(
                [(names::LABEL_MANAGED_BY, names::MANAGED_BY), (names::LABEL_OWNER_UID, uid)]
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..Default::default()
        };
        assert!(may_apply_over(None, "u1"), "nothing there: create it");
        assert!(may_apply_over(Some(&labelled("u1")), "u1"));
        assert!(!may_apply_over(Some(&labelled("u2")), "u1"), "another resource's child");
        let helm = ObjectMeta { name: Some("ccm-operator".into()), ..Default::default() };
        assert!(!may_apply_over(Some(&helm), "u1"), "an object the operator did not create");
    }

    #[test]
    fn the_name_conflict_message_names_kind_namespace_and_name_only() {
        let key =
            ChildKey { kind: Kind::ServiceAccount, namespace: Some("kube-system".into()), name: "ccm-operator".into() };
        let m = NameConflict { key }.message();
        assert!(
            m.starts_with("ServiceAccount kube-system/ccm-operator already exists and is not owned by this"),
            "{m}"
        );
        let key = ChildKey { kind: Kind::ClusterRoleBinding, namespace: None, name: "ccm-operator:a:b".into() };
        assert!(NameConflict { key }.message().starts_with("ClusterRoleBinding ccm-operator:a:b already exists"));
    }

    fn memo(hash: &str, generation: i64) -> Applied {
        Applied { hash: hash.into(), generation }
    }

    #[test]
    fn unchanged_object_is_not_applied() {
        assert!(!needs_apply("h", Some(&memo("h", 3)), Some((Some("h"), 3))));
    }

    #[test]
    fn stale_watch_after_our_apply_does_not_reapply() {
        // The store still shows the previous version of the object.
        assert!(!needs_apply("h", Some(&memo("h", 3)), Some((Some("old"), 2))));
        // Created, not yet in the store.
        assert!(!needs_apply("h", Some(&memo("h", 1)), None));
    }

    #[test]
    fn changed_desired_state_is_applied() {
        assert!(needs_apply("new", Some(&memo("h", 3)), Some((Some("h"), 3))));
        assert!(needs_apply("h", None, None));
    }

    #[test]
    fn someone_elses_spec_edit_is_reverted() {
        assert!(needs_apply("h", Some(&memo("h", 3)), Some((Some("h"), 4))));
    }

    #[test]
    fn after_a_restart_the_annotation_decides() {
        assert!(!needs_apply("h", None, Some((Some("h"), 7))));
        assert!(needs_apply("h", None, Some((Some("other"), 7))));
        assert!(needs_apply("h", None, Some((None, 7))));
    }
}
