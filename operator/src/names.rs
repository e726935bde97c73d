//! Names, labels and annotations of the objects the operator creates.

use std::collections::BTreeMap;

/// The operator's field manager for server-side apply, and its event reporter name.
pub const FIELD_MANAGER: &str = "ccm-operator";
/// The finalizer that removes cluster-scoped objects and stops an embedded engine on deletion.
pub const FINALIZER: &str = "ccm.rs/operator-cleanup";
/// The operator's own leader-election Lease.
pub const OPERATOR_LEASE: &str = "ccm-operator";

/// `app.kubernetes.io/name` of every child object.
pub const LABEL_NAME: &str = "app.kubernetes.io/name";
/// Value of [`LABEL_NAME`].
pub const APP_NAME: &str = "cloud-controller-manager";
/// `app.kubernetes.io/managed-by`: the operator selects (and prunes) only what carries it.
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// Value of [`LABEL_MANAGED_BY`].
pub const MANAGED_BY: &str = "ccm-operator";
/// `app.kubernetes.io/instance`: the CloudControllerManager's name (when it fits a label).
pub const LABEL_INSTANCE: &str = "app.kubernetes.io/instance";
/// The owning CloudControllerManager's UID: the pod selector and the pruning key.
pub const LABEL_OWNER_UID: &str = "ccm.rs/owner-uid";
/// The owning CloudControllerManager's namespace (for cluster-scoped children).
pub const LABEL_OWNER_NAMESPACE: &str = "ccm.rs/owner-namespace";
/// The mode that created the object (`Deployment` or `DaemonSet`).
pub const LABEL_MODE: &str = "ccm.rs/mode";
/// On an upstream image's manager Pods (only): its profile, so the status can say which
/// manager the Lease holder runs while a switch rolls.
pub const LABEL_UPSTREAM_PROFILE: &str = "ccm.rs/upstream-profile";

/// `namespace/name` of the owning CloudControllerManager, on the cluster-scoped ClusterRoleBinding
/// (which cannot carry an ownerReference to a namespaced object).
pub const ANNOTATION_OWNER: &str = "ccm.rs/owner";
/// Hash of the applied object (before this annotation was added); equal hash means no apply.
pub const ANNOTATION_APPLIED_HASH: &str = "ccm.rs/applied-hash";
/// Hash of the pod template, on the workload: a change means a new rollout.
pub const ANNOTATION_TEMPLATE_HASH: &str = "ccm.rs/template-hash";
/// Hash of the referenced cloud-config's restart-only part, on the pod template: rotating the
/// Secret rolls the pods, unless only what the provider reloads in place changed.
pub const ANNOTATION_CLOUD_CONFIG_HASH: &str = "ccm.rs/cloud-config-hash";

/// The manager container's name.
pub const CONTAINER_NAME: &str = "cloud-controller-manager";
/// Where the cloud-config Secret is mounted in the manager container.
pub const CLOUD_CONFIG_DIR: &str = "/etc/kubernetes/cloud-config";
/// The volume holding the cloud-config.
pub const CLOUD_CONFIG_VOLUME: &str = "cloud-config";
/// The pod-template annotation holding the manager's `LeaderMigrationConfiguration` (projected
/// into the pod as a file by the downward API, so no ConfigMap is needed).
pub const ANNOTATION_LEADER_MIGRATION: &str = "ccm.rs/leader-migration";
/// Where the leader-migration file is mounted in the manager pod.
pub const LEADER_MIGRATION_DIR: &str = "/etc/kubernetes/leader-migration";
/// The leader-migration file's name in [`LEADER_MIGRATION_DIR`].
pub const LEADER_MIGRATION_FILE: &str = "config.yaml";
/// The projected volume of the leader-migration file.
pub const LEADER_MIGRATION_VOLUME: &str = "leader-migration";
/// The manager binary in the manager image, the only command of manager and announcer
/// containers (the chart's admission policy admits no other).
pub const MANAGER_COMMAND: &str = "cloud-controller-manager";
/// The environment variable holding the Pod's own address (downward API `status.podIP`), which
/// the manager's `--bind-address` names.
pub const POD_IP_ENV: &str = "POD_IP";
/// The manager's secure port (upstream default), also its probe port.
pub const MANAGER_PORT: i32 = crds::defaults::SECURE_PORT as i32;

/// The label selector of the Secrets the operator may read as cloud-configs.
pub fn cloud_config_selector() -> String {
    format!("{}={}", crds::CLOUD_CONFIG_LABEL, crds::CLOUD_CONFIG_LABEL_VALUE)
}

/// Whether a Secret with these labels may be read as a cloud-config (pure).
pub fn is_cloud_config(labels: Option<&BTreeMap<String, String>>) -> bool {
    labels.and_then(|l| l.get(crds::CLOUD_CONFIG_LABEL)).is_some_and(|v| v == crds::CLOUD_CONFIG_LABEL_VALUE)
}

/// Name of the namespaced children (ServiceAccount, Deployment or DaemonSet, PDB).
pub fn workload_name(cr_name: &str) -> String {
    format!("ccm-{cr_name}")
}

/// Name of the RoleBinding that lets the manager use its Lease (and status) in the CR's namespace.
pub fn role_binding_name(cr_name: &str) -> String {
    format!("ccm-{cr_name}")
}

/// Name of the manager's own Role (its Lease and resource, by name) and of its RoleBinding.
/// The colon, which no CloudControllerManager name holds, keeps it apart from every
/// [`role_binding_name`].
pub fn own_role_name(cr_name: &str) -> String {
    format!("ccm:{cr_name}:own")
}

/// Name of the Role (and its RoleBinding) in another namespace that lets the manager of
/// `cr_namespace/cr_name` use its leader-migration Lease there
/// (`spec.leaderElection.migration.leaseNamespace`). It carries the resource's namespace, so two
/// resources of one name in different namespaces never clash, and ends in `:migration`, which
/// the chart's admission policy allows to name Leases only.
pub fn migration_role_name(cr_namespace: &str, cr_name: &str) -> String {
    format!("ccm:{cr_namespace}:{cr_name}:migration")
}

/// Name of the RoleBinding, beside [`migration_role_name`], of the chart's namespace manager
/// ClusterRole (creating a Lease) to the manager of `cr_namespace/cr_name`.
pub fn migration_create_binding_name(cr_namespace: &str, cr_name: &str) -> String {
    format!("ccm:{cr_namespace}:{cr_name}:migration-create")
}

/// Name of the cluster-scoped ClusterRoleBinding; it carries the namespace so names never clash.
pub fn cluster_role_binding_name(namespace: &str, cr_name: &str) -> String {
    format!("ccm-operator:{namespace}:{cr_name}")
}

/// Name of the ClusterRoleBinding of a manager in shadow mode (to the read-only ClusterRole):
/// another name than [`cluster_role_binding_name`], because a binding's role cannot change.
pub fn shadow_cluster_role_binding_name(namespace: &str, cr_name: &str) -> String {
    format!("ccm-operator:{namespace}:{cr_name}:shadow")
}

/// Name of the ClusterRoleBinding of an upstream CCM image (`spec.upstream`, to the upstream
/// ClusterRole): another name again, so a switch between managers replaces the binding.
pub fn upstream_cluster_role_binding_name(namespace: &str, cr_name: &str) -> String {
    format!("ccm-operator:{namespace}:{cr_name}:upstream")
}

/// `app.kubernetes.io/name` of announcer pods (never counted as manager pods).
pub const ANNOUNCER_APP_NAME: &str = "ccm-announcer";

/// Name of the announcer's ServiceAccount, RoleBinding and DaemonSet.
pub fn announcer_name(cr_name: &str) -> String {
    format!("ccm-{cr_name}-announcer")
}

/// Name of the announcer's ClusterRoleBinding; the colon keeps it apart from the manager's.
pub fn announcer_cluster_role_binding_name(namespace: &str, cr_name: &str) -> String {
    format!("ccm-operator:{namespace}:{cr_name}:announcer")
}

/// Labels of the announcer pods, also the announcer DaemonSet's selector.
pub fn announcer_selector_labels(owner_uid: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_NAME.to_string(), ANNOUNCER_APP_NAME.to_string()),
        (LABEL_OWNER_UID.to_string(), owner_uid.to_string()),
    ])
}

/// `app.kubernetes.io/name` of an upstream profile's node-manager pods (never counted as
/// manager pods).
pub const NODE_MANAGER_APP_NAME: &str = "ccm-node-manager";

/// Name of the node manager's ServiceAccount and DaemonSet (`spec.upstream.nodeManager`).
pub fn node_manager_name(cr_name: &str) -> String {
    format!("ccm-{cr_name}-node-manager")
}

/// Name of the node manager's ClusterRoleBinding; the colon keeps it apart from the manager's.
pub fn node_manager_cluster_role_binding_name(namespace: &str, cr_name: &str) -> String {
    format!("ccm-operator:{namespace}:{cr_name}:node-manager")
}

/// Labels of the node-manager pods, also its DaemonSet's selector.
pub fn node_manager_selector_labels(owner_uid: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_NAME.to_string(), NODE_MANAGER_APP_NAME.to_string()),
        (LABEL_OWNER_UID.to_string(), owner_uid.to_string()),
    ])
}

/// Whether a pod with these labels is a manager pod (not an announcer or a node manager).
pub fn is_manager_pod(labels: &BTreeMap<String, String>) -> bool {
    labels.get(LABEL_NAME).is_none_or(|n| n == APP_NAME)
}

/// The variable naming the CA bundle (`spec.cloudConfig.caBundleKey`) for Go's and rustls's
/// native roots.
pub const CA_BUNDLE_ENV: &str = "SSL_CERT_FILE";

/// Path of the cloud-config file inside the manager container.
pub fn cloud_config_path(key: &str) -> String {
    format!("{CLOUD_CONFIG_DIR}/{key}")
}

/// Labels of the manager pods, also the workload's selector (immutable for the CR's lifetime).
pub fn selector_labels(owner_uid: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_NAME.to_string(), APP_NAME.to_string()),
        (LABEL_OWNER_UID.to_string(), owner_uid.to_string()),
    ])
}

/// Labels of every child object.
pub fn child_labels(cr_namespace: &str, cr_name: &str, owner_uid: &str, mode: crds::Mode) -> BTreeMap<String, String> {
    let mut labels = selector_labels(owner_uid);
    labels.insert(LABEL_MANAGED_BY.to_string(), MANAGED_BY.to_string());
    labels.insert(LABEL_MODE.to_string(), mode.to_string());
    if is_label_value(cr_name) {
        labels.insert(LABEL_INSTANCE.to_string(), cr_name.to_string());
    }
    if is_label_value(cr_namespace) {
        labels.insert(LABEL_OWNER_NAMESPACE.to_string(), cr_namespace.to_string());
    }
    labels
}

/// The label selector of everything the operator manages.
pub fn managed_selector() -> String {
    format!("{LABEL_MANAGED_BY}={MANAGED_BY}")
}

/// Whether `v` is a valid label value (63 characters, alphanumeric ends, `-_.` inside).
pub fn is_label_value(v: &str) -> bool {
    v.len() <= 63
        && (v.is_empty()
            || (v.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
                && v.starts_with(|c: char| c.is_ascii_alphanumeric())
                && v.ends_with(|c: char| c.is_ascii_alphanumeric())))
}

/// The leader-migration file's path in the manager pod (`--leader-migration-config`).
pub fn leader_migration_path() -> String {
    format!("{LEADER_MIGRATION_DIR}/{LEADER_MIGRATION_FILE}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_names_are_left_out_of_labels_but_the_uid_selects() {
        let long = "a".repeat(80);
        let labels = child_labels("kube-system", &long, "uid-1", crds::Mode::Deployment);
        assert!(!labels.contains_key(LABEL_INSTANCE));
        assert_eq!(labels[LABEL_OWNER_UID], "uid-1");
        let labels = child_labels("kube-system", "aws", "uid-1", crds::Mode::DaemonSet);
        assert_eq!(labels[LABEL_INSTANCE], "aws");
        assert_eq!(labels[LABEL_MODE], "DaemonSet");
    }

    #[test]
    fn cluster_role_binding_names_carry_the_namespace() {
        assert_ne!(cluster_role_binding_name("a", "x"), cluster_role_binding_name("b", "x"));
        assert_ne!(shadow_cluster_role_binding_name("a", "x"), cluster_role_binding_name("a", "x"));
    }
}
