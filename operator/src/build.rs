//! Build (pure): the objects a valid CloudControllerManager should have, for its mode.
//!
//! Deployment mode: ServiceAccount, ClusterRoleBinding, RoleBinding (the chart's namespace
//! role: Lease create), Role and RoleBinding (its own Lease and resource, by name), with a
//! leader-migration Lease in another namespace a Role, RoleBinding and create RoleBinding there
//! (that one Lease), Deployment, and a PodDisruptionBudget when replicas > 1. DaemonSet mode: the same without the PDB, with
//! a DaemonSet. Embedded mode: nothing (the operator runs the engine itself). With
//! `spec.announcer`, the announcer's objects too ([`crate::announcer`]); with an upstream
//! profile's node manager, its objects ([`crate::node_manager`]).
//!
//! The manager pod passes the `restricted` Pod Security profile except for `hostNetwork`
//! (`spec.deployment.hostNetwork`, on by default); [`restricted_violations`] checks it.

use std::collections::BTreeMap;

use crds::v1alpha1::DeploymentSettings;
use crds::{CloudControllerManager, Mode};
use k8s_openapi::api::apps::v1::{
    DaemonSet, DaemonSetSpec, DaemonSetUpdateStrategy, Deployment, DeploymentSpec, DeploymentStrategy,
    RollingUpdateDaemonSet, RollingUpdateDeployment,
};
use k8s_openapi::api::core::v1::{
    Affinity, Capabilities, Container, ContainerPort, DownwardAPIProjection, DownwardAPIVolumeFile, EnvVar,
    EnvVarSource, HTTPGetAction, ObjectFieldSelector, PodAffinityTerm, PodAntiAffinity, PodSecurityContext, PodSpec,
    PodTemplateSpec, Probe, ProjectedVolumeSource, ResourceRequirements, SeccompProfile, SecretKeySelector,
    SecurityContext, ServiceAccount, Toleration, Volume, VolumeMount, VolumeProjection, WeightedPodAffinityTerm,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{Resource, ResourceExt};

pub use crate::desired::{BuildSettings, Desired, Kind, cloud_config_volume};
use crate::hash;
use crate::names;
use crate::profiles::CloudConfigUse;
use crate::validate::Validated;

/// The objects `cr` should have in its current mode. Empty for Embedded mode.
pub fn build(cr: &CloudControllerManager, validated: &Validated, settings: &BuildSettings) -> Vec<Desired> {
    let mode = cr.spec.mode;
    if mode == Mode::Embedded {
        return Vec::new();
    }
    let ns = cr.namespace().unwrap_or_default();
    let name = cr.name_any();
    let uid = cr.uid().unwrap_or_default();
    let labels = names::child_labels(&ns, &name, &uid, mode);
    let owner = owner_reference(cr);
    let namespaced_meta = |object_name: String| ObjectMeta {
        name: Some(object_name),
        namespace: Some(ns.clone()),
        labels: Some(labels.clone()),
        owner_references: Some(vec![owner.clone()]),
        ..Default::default()
    };
    let sa_name = names::workload_name(&name);
    let subject =
        Subject { kind: "ServiceAccount".into(), name: sa_name.clone(), namespace: Some(ns.clone()), api_group: None };
    let foreign_lease_namespace = crate::validate::foreign_lease_namespace(cr);

    let mut out = vec![
        Desired::ServiceAccount(ServiceAccount { metadata: namespaced_meta(sa_name.clone()), ..Default::default() }),
        // A manager in shadow mode writes nothing to Nodes and Services: it gets the read-only
        // ClusterRole, under a binding name of its own (a binding's role cannot change).
        Desired::ClusterRoleBinding(ClusterRoleBinding {
            metadata: ObjectMeta {
                name: Some(if cr.spec.shadow {
                    names::shadow_cluster_role_binding_name(&ns, &name)
                } else if cr.spec.upstream.is_some() {
                    names::upstream_cluster_role_binding_name(&ns, &name)
                } else {
                    names::cluster_role_binding_name(&ns, &name)
                }),
                labels: Some(labels.clone()),
                annotations: Some(BTreeMap::from([(names::ANNOTATION_OWNER.to_string(), format!("{ns}/{name}"))])),
                ..Default::default()
            },
            role_ref: cluster_role_ref(if cr.spec.shadow {
                &settings.manager_shadow_cluster_role
            } else if cr.spec.upstream.is_some() {
                &settings.manager_upstream_cluster_role
            } else {
                &settings.manager_cluster_role
            }),
            subjects: Some(vec![subject.clone()]),
        }),
        Desired::RoleBinding(RoleBinding {
            metadata: namespaced_meta(names::role_binding_name(&name)),
            role_ref: cluster_role_ref(&settings.manager_namespace_role),
            subjects: Some(vec![subject.clone()]),
        }),
        Desired::Role(Role {
            metadata: namespaced_meta(names::own_role_name(&name)),
            // The migration Lease is named here only when it is in this namespace.
            rules: Some(own_rules(
                &name,
                crate::validate::migration_lease_name(&cr.spec)
                    .filter(|_| foreign_lease_namespace.is_none())
                    .as_deref(),
                cr.spec.upstream.as_ref().map(|u| crate::profiles::profile(u.profile).leases).unwrap_or_default(),
            )),
        }),
        Desired::RoleBinding(RoleBinding {
            metadata: namespaced_meta(names::own_role_name(&name)),
            role_ref: RoleRef {
                api_group: "rbac.authorization.k8s.io".into(),
                kind: "Role".into(),
                name: names::own_role_name(&name),
            },
            subjects: Some(vec![subject.clone()]),
        }),
    ];
    if let (Some(lease_ns), Some(lease)) = (&foreign_lease_namespace, crate::validate::migration_lease_name(&cr.spec)) {
        // No ownerReference can point across namespaces: the owner labels select these for
        // pruning, the owner annotation maps their watch events, and the finalizer deletes them.
        let foreign_meta = |object_name: String| ObjectMeta {
            name: Some(object_name),
            namespace: Some(lease_ns.clone()),
            labels: Some(labels.clone()),
            annotations: Some(BTreeMap::from([(names::ANNOTATION_OWNER.to_string(), format!("{ns}/{name}"))])),
            ..Default::default()
        };
        let role_name = names::migration_role_name(&ns, &name);
        out.extend([
            Desired::Role(Role { metadata: foreign_meta(role_name.clone()), rules: Some(migration_rules(&lease)) }),
            Desired::RoleBinding(RoleBinding {
                metadata: foreign_meta(role_name.clone()),
                role_ref: RoleRef {
                    api_group: "rbac.authorization.k8s.io".into(),
                    kind: "Role".into(),
                    name: role_name,
                },
                subjects: Some(vec![subject.clone()]),
            }),
            Desired::RoleBinding(RoleBinding {
                metadata: foreign_meta(names::migration_create_binding_name(&ns, &name)),
                role_ref: cluster_role_ref(&settings.manager_namespace_role),
                subjects: Some(vec![subject]),
            }),
        ]);
    }

    let mut pod_labels = labels.clone();
    if let Some(u) = &cr.spec.upstream {
        pod_labels.insert(names::LABEL_UPSTREAM_PROFILE.to_string(), u.profile.as_str().to_string());
    }
    let template = pod_template(cr, validated, settings, &pod_labels, &sa_name);
    let mut workload_meta = namespaced_meta(names::workload_name(&name));
    workload_meta.annotations =
        Some(BTreeMap::from([(names::ANNOTATION_TEMPLATE_HASH.to_string(), hash::of_json(&template))]));
    let selector = LabelSelector { match_labels: Some(names::selector_labels(&uid)), ..Default::default() };
    let replicas = cr.spec.deployment.replicas;
    match mode {
        Mode::Deployment => {
            out.push(Desired::Deployment(Deployment {
                metadata: workload_meta,
                spec: Some(DeploymentSpec {
                    replicas: Some(replicas),
                    selector: selector.clone(),
                    template,
                    strategy: Some(deployment_strategy(cr.spec.deployment.host_network)),
                    revision_history_limit: Some(3),
                    ..Default::default()
                }),
                status: None,
            }));
            if replicas > 1 {
                out.push(Desired::PodDisruptionBudget(PodDisruptionBudget {
                    metadata: namespaced_meta(names::workload_name(&name)),
                    spec: Some(PodDisruptionBudgetSpec {
                        min_available: Some(IntOrString::Int(1)),
                        selector: Some(selector),
                        // A crash-looping replica must not block node drains.
                        unhealthy_pod_eviction_policy: Some("AlwaysAllow".into()),
                        ..Default::default()
                    }),
                    status: None,
                }));
            }
        }
        Mode::DaemonSet => out.push(Desired::DaemonSet(DaemonSet {
            metadata: workload_meta,
            spec: Some(DaemonSetSpec {
                selector,
                template,
                update_strategy: Some(DaemonSetUpdateStrategy {
                    type_: Some("RollingUpdate".into()),
                    rolling_update: Some(RollingUpdateDaemonSet {
                        max_unavailable: Some(IntOrString::Int(1)),
                        max_surge: Some(IntOrString::Int(0)),
                    }),
                }),
                revision_history_limit: Some(3),
                ..Default::default()
            }),
            status: None,
        })),
        Mode::Embedded => {}
    }
    out.extend(crate::announcer::build(cr, validated, settings, &labels, &owner));
    out.extend(crate::node_manager::build(cr, validated, settings, &labels, &owner));
    out.into_iter().map(Desired::stamped).collect()
}

/// How a manager Deployment rolls. Never a surge: with `hostNetwork` a surge pod could not bind
/// the port beside an old one. On the host network every replica may go at once (`100%`):
/// with more replicas than Nodes that can run one (the default two on a one-node cluster) the
/// extra replica stays Pending, and with `maxUnavailable: 1` the Deployment controller then
/// never removes the one running old pod whose port the new pod waits for. The Lease hands over
/// anyway; the gap is one pod start. On the pod network pods roll one at a time.
pub fn deployment_strategy(host_network: bool) -> DeploymentStrategy {
    let max_unavailable = if host_network { IntOrString::String("100%".into()) } else { IntOrString::Int(1) };
    DeploymentStrategy {
        type_: Some("RollingUpdate".into()),
        rolling_update: Some(RollingUpdateDeployment {
            max_surge: Some(IntOrString::Int(0)),
            max_unavailable: Some(max_unavailable),
        }),
    }
}

/// The controller ownerReference to `cr`, so namespaced children are garbage-collected with it.
pub fn owner_reference(cr: &CloudControllerManager) -> OwnerReference {
    OwnerReference {
        api_version: CloudControllerManager::api_version(&()).into_owned(),
        kind: CloudControllerManager::kind(&()).into_owned(),
        name: cr.name_any(),
        uid: cr.uid().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// The rules of a manager's own Role: what RBAC can narrow to the resource's own objects by
/// name. (Creating the Lease cannot be narrowed by name; the chart's namespace ClusterRole
/// grants that.) The operator may create this Role because it holds the same rights in the
/// namespace (the API server refuses to grant what the granter lacks).
///
/// With leader migration, the Lease rule also names the migration Lease (`migration_lease`).
pub fn own_rules(cr_name: &str, migration_lease: Option<&str>, profile_leases: &[&str]) -> Vec<PolicyRule> {
    let rule = |group: &str, resource: &str, verbs: &[&str]| PolicyRule {
        api_groups: Some(vec![group.into()]),
        resources: Some(vec![resource.into()]),
        resource_names: Some(vec![cr_name.into()]),
        verbs: verbs.iter().map(|v| (*v).to_string()).collect(),
        non_resource_urls: None,
    };
    let mut leases = rule("coordination.k8s.io", "leases", &["get", "update", "patch"]);
    let names = leases.resource_names.get_or_insert_with(Vec::new);
    names.extend(migration_lease.map(String::from));
    // An upstream profile's own lock Leases in this namespace (Azure's load-balancer lock).
    names.extend(profile_leases.iter().map(|l| l.to_string()));
    vec![
        // Leader election on the Lease named after the resource (and, with leader migration,
        // on the migration Lease): read, renew, take over.
        leases,
        // Reading the CloudControllerManager it runs for (--ccm-resource).
        rule(crds::v1alpha1::GROUP, "cloudcontrollermanagers", &["get"]),
        // ProviderHealthy, leader and controllers in its status (server-side apply).
        rule(crds::v1alpha1::GROUP, "cloudcontrollermanagers/status", &["patch"]),
    ]
}

/// The rules of the Role in another namespace for a manager's leader-migration Lease
/// (`spec.leaderElection.migration.leaseNamespace`): that one Lease, the verbs the elector uses.
/// Creating it, when no manager has yet, comes from the chart's namespace ClusterRole, bound
/// beside it.
pub fn migration_rules(lease: &str) -> Vec<PolicyRule> {
    vec![
        // Leader election on the migration Lease: read it, renew it and take it over (update);
        // the elector never patches or deletes it.
        PolicyRule {
            api_groups: Some(vec!["coordination.k8s.io".into()]),
            resources: Some(vec!["leases".into()]),
            resource_names: Some(vec![lease.into()]),
            verbs: vec!["get".into(), "update".into()],
            non_resource_urls: None,
        },
    ]
}

/// A role a binding may name: its kind, its name, and the one ServiceAccount it may bind.
type AllowedRole<'a> = (&'static str, String, &'a str);

/// Why a desired binding would grant more than its resource's own manager should have, or
/// `None` (pure). RBAC lets the operator bind the manager roles to any subject and create any
/// ClusterRoleBinding name; this is what confines each binding to the resource's own
/// ServiceAccount and to the manager roles, checked before every apply. In `lease_namespace`
/// (the migration Lease's, when not the resource's own) only the migration Role and the
/// namespace manager ClusterRole may be bound. The announcer roles (`spec.announcer`) only
/// where the installation allows announcers, and only to the announcer's ServiceAccount.
pub fn binding_overreach(
    desired: &Desired,
    cr_namespace: &str,
    cr_name: &str,
    lease_namespace: Option<&str>,
    settings: &BuildSettings,
) -> Option<String> {
    let manager = names::workload_name(cr_name);
    let announcer = names::announcer_name(cr_name);
    let node_manager = names::node_manager_name(cr_name);
    let subject_is = |subjects: &Option<Vec<Subject>>, account: &str| {
        matches!(subjects.as_deref(), Some([s]) if s.kind == "ServiceAccount"
            && s.name == account
            && s.namespace.as_deref() == Some(cr_namespace)
            && s.api_group.as_deref().unwrap_or_default().is_empty())
    };
    // (role kind, role name, the one ServiceAccount it may be bound to). The announcer roles
    // only where the installation allows announcers, and only to the announcer's account.
    let announcers = settings.policy.allow_announcers;
    let (what, role_ref, subjects, allowed): (String, &RoleRef, &Option<Vec<Subject>>, Vec<AllowedRole<'_>>) =
        match desired {
            Desired::ClusterRoleBinding(b) => {
                let mut allowed = vec![
                    ("ClusterRole", settings.manager_cluster_role.clone(), manager.as_str()),
                    ("ClusterRole", settings.manager_shadow_cluster_role.clone(), manager.as_str()),
                    ("ClusterRole", settings.manager_upstream_cluster_role.clone(), manager.as_str()),
                    ("ClusterRole", settings.node_manager_cluster_role.clone(), node_manager.as_str()),
                ];
                if announcers {
                    allowed.push(("ClusterRole", settings.announcer_cluster_role.clone(), announcer.as_str()));
                }
                (format!("ClusterRoleBinding {}", desired.name()), &b.role_ref, &b.subjects, allowed)
            }
            Desired::RoleBinding(b) => {
                let namespace = desired.meta().namespace.as_deref().unwrap_or(cr_namespace);
                let own = if namespace == cr_namespace {
                    names::own_role_name(cr_name)
                } else {
                    names::migration_role_name(cr_namespace, cr_name)
                };
                let mut allowed = vec![
                    ("ClusterRole", settings.manager_namespace_role.clone(), manager.as_str()),
                    ("Role", own, manager.as_str()),
                ];
                if announcers && namespace == cr_namespace {
                    allowed.push(("ClusterRole", settings.announcer_namespace_role.clone(), announcer.as_str()));
                }
                (format!("RoleBinding {namespace}/{}", desired.name()), &b.role_ref, &b.subjects, allowed)
            }
            _ => return None,
        };
    if desired.meta().namespace.as_deref().is_some_and(|ns| ns != cr_namespace && Some(ns) != lease_namespace) {
        return Some(format!("{what} is outside namespace {cr_namespace}"));
    }
    let Some((_, _, account)) = allowed.iter().find(|(kind, name, _)| role_ref.kind == *kind && role_ref.name == *name)
    else {
        return Some(format!("{what} refers to {} {}, not a manager role", role_ref.kind, role_ref.name));
    };
    if !subject_is(subjects, account) {
        return Some(format!("{what} has subjects other than ServiceAccount {cr_namespace}/{account}"));
    }
    None
}

/// The `restricted` Pod Security Standard checks (Kubernetes' pod-security admission,
/// `restricted` level, which includes `baseline`) that `pod` fails, one line each. Empty means
/// the pod would be admitted in a namespace labelled `pod-security.kubernetes.io/enforce:
/// restricted`.
pub fn restricted_violations(pod: &PodSpec) -> Vec<String> {
    let mut out = Vec::new();
    if pod.host_network == Some(true) {
        out.push("hostNetwork=true".to_string());
    }
    if pod.host_pid == Some(true) || pod.host_ipc == Some(true) {
        out.push("hostPID or hostIPC".to_string());
    }
    for v in pod.volumes.iter().flatten() {
        let allowed = v.config_map.is_some()
            || v.csi.is_some()
            || v.downward_api.is_some()
            || v.empty_dir.is_some()
            || v.ephemeral.is_some()
            || v.persistent_volume_claim.is_some()
            || v.projected.is_some()
            || v.secret.is_some();
        if !allowed {
            out.push(format!("volume {} has a restricted type", v.name));
        }
    }
    let pod_sc = pod.security_context.clone().unwrap_or_default();
    if pod_sc.run_as_user == Some(0) {
        out.push("pod runAsUser=0".to_string());
    }
    if pod_sc.sysctls.as_ref().is_some_and(|s| !s.is_empty()) {
        out.push("pod sysctls".to_string());
    }
    let pod_seccomp = pod_sc.seccomp_profile.as_ref().map(|p| p.type_.clone());
    let containers = pod.init_containers.iter().flatten().chain(&pod.containers);
    for c in containers {
        let sc = c.security_context.clone().unwrap_or_default();
        let name = &c.name;
        if sc.privileged == Some(true) {
            out.push(format!("container {name}: privileged"));
        }
        if sc.allow_privilege_escalation != Some(false) {
            out.push(format!("container {name}: allowPrivilegeEscalation != false"));
        }
        let non_root = sc.run_as_non_root.or(pod_sc.run_as_non_root);
        if non_root != Some(true) {
            out.push(format!("container {name}: runAsNonRoot != true"));
        }
        if sc.run_as_user == Some(0) {
            out.push(format!("container {name}: runAsUser=0"));
        }
        let seccomp = sc.seccomp_profile.as_ref().map(|p| p.type_.clone()).or(pod_seccomp.clone());
        if !matches!(seccomp.as_deref(), Some("RuntimeDefault" | "Localhost")) {
            out.push(format!("container {name}: seccompProfile is not RuntimeDefault or Localhost"));
        }
        let caps = sc.capabilities.clone().unwrap_or_default();
        if !caps.drop.iter().flatten().any(|d| d == "ALL") {
            out.push(format!("container {name}: capabilities do not drop ALL"));
        }
        if caps.add.iter().flatten().any(|a| a != "NET_BIND_SERVICE") {
            out.push(format!("container {name}: adds capabilities other than NET_BIND_SERVICE"));
        }
        if c.ports.iter().flatten().any(|p| p.host_port.is_some_and(|h| h != 0)) {
            out.push(format!("container {name}: hostPort"));
        }
        if sc.proc_mount.as_deref().is_some_and(|m| m != "Default") {
            out.push(format!("container {name}: procMount"));
        }
    }
    out
}

/// The environment variable `var` from the cloud-config Secret's key (an upstream profile that
/// reads its credentials from the environment).
fn secret_key_env(var: &str, cc: &crate::validate::CloudConfigRef) -> EnvVar {
    EnvVar {
        name: var.into(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector { name: cc.secret.clone(), key: cc.key.clone(), optional: None }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn cluster_role_ref(name: &str) -> RoleRef {
    RoleRef { api_group: "rbac.authorization.k8s.io".into(), kind: "ClusterRole".into(), name: name.into() }
}

/// The manager's command-line arguments: the validated [`ccm_framework::config::ManagerConfig`]
/// rendered (then `extraArgs`).
pub fn manager_args(validated: &Validated) -> Vec<String> {
    validated.config.to_args()
}

/// Tolerations every manager pod gets: it must run on nodes the CCM has not initialized yet,
/// on not-ready nodes (no CNI before the CCM), and on control-plane nodes.
pub fn default_tolerations() -> Vec<Toleration> {
    let t = |key: &str, effect: &str, seconds: Option<i64>| Toleration {
        key: Some(key.into()),
        operator: Some("Exists".into()),
        effect: Some(effect.into()),
        toleration_seconds: seconds,
        ..Default::default()
    };
    vec![
        t("node.cloudprovider.kubernetes.io/uninitialized", "NoSchedule", None),
        t("node.kubernetes.io/not-ready", "NoSchedule", None),
        t("node.kubernetes.io/not-ready", "NoExecute", Some(120)),
        t("node.kubernetes.io/unreachable", "NoExecute", Some(120)),
        t("node-role.kubernetes.io/control-plane", "NoSchedule", None),
        t("node-role.kubernetes.io/master", "NoSchedule", None),
    ]
}

/// The control-plane node selector DaemonSet mode uses by default.
pub fn control_plane_selector() -> BTreeMap<String, String> {
    BTreeMap::from([("node-role.kubernetes.io/control-plane".to_string(), String::new())])
}

/// The manager container's memory limit when the resource sets no `resources`: its caches of
/// Nodes and Services plus, in proxy mode, connections and UDP sessions that the data path caps
/// per listener and in total, so memory stays bounded well below this; a leak or flood ends in
/// an OOM kill and a restart of this one pod instead of pressure on a control-plane Node.
pub const DEFAULT_MEMORY_LIMIT: &str = "512Mi";
/// The manager container's memory request when the resource sets no `resources`.
pub const DEFAULT_MEMORY_REQUEST: &str = "64Mi";

/// Requests and a memory limit for a resource that sets no `resources` (no CPU limit: a
/// throttled manager misses Lease renewals).
pub fn default_resources() -> ResourceRequirements {
    ResourceRequirements {
        requests: Some(BTreeMap::from([
            ("cpu".to_string(), Quantity("50m".into())),
            ("memory".to_string(), Quantity(DEFAULT_MEMORY_REQUEST.into())),
        ])),
        limits: Some(BTreeMap::from([("memory".to_string(), Quantity(DEFAULT_MEMORY_LIMIT.into()))])),
        ..Default::default()
    }
}

fn pod_template(
    cr: &CloudControllerManager,
    validated: &Validated,
    settings: &BuildSettings,
    labels: &BTreeMap<String, String>,
    service_account: &str,
) -> PodTemplateSpec {
    let d: &DeploymentSettings = &cr.spec.deployment;
    let uid = cr.uid().unwrap_or_default();
    let mut annotations = BTreeMap::new();
    let mut volumes = Vec::new();
    let mut mounts = Vec::new();
    let upstream = cr.spec.upstream.as_ref().map(|u| crate::profiles::profile(u.profile));
    let mut secret_env = Vec::new();
    if let Some(cc) = &validated.cloud_config {
        // Only edits that need a restart roll the pods; the manager reloads the rest in place
        // from the mounted file, which kubelet updates.
        annotations.insert(names::ANNOTATION_CLOUD_CONFIG_HASH.to_string(), cc.restart_hash.clone());
        let with_config = match upstream.map(|p| p.cloud_config) {
            Some(CloudConfigUse::Env { var }) => {
                secret_env.push(secret_key_env(var, cc));
                false
            }
            _ => true,
        };
        if with_config || !cc.extra_keys.is_empty() {
            let (volume, mount) = cloud_config_volume(cc, with_config);
            volumes.push(volume);
            mounts.push(mount);
        }
        // The SDKs and TLS stacks find the mounted files through their variables.
        let source = cr.spec.cloud_config.as_ref();
        let file_env = |var: &str, key: &str| EnvVar {
            name: var.into(),
            value: Some(names::cloud_config_path(key)),
            value_from: None,
        };
        if let (Some(key), Some(var)) =
            (source.and_then(|s| s.credentials_key.as_deref()), crate::validate::credentials_file_env(&cr.spec))
        {
            secret_env.push(file_env(var, key));
        }
        if let Some(key) = source.and_then(|s| s.ca_bundle_key.as_deref()) {
            secret_env.push(file_env(names::CA_BUNDLE_ENV, key));
        }
    }
    if let (Some(ccm_framework::config::LeaderMigrationSource::File(_)), Some(migration)) =
        (&validated.config.leader_migration, crate::validate::leader_migration_of(&cr.spec).ok().flatten())
    {
        // The file comes from this annotation through the downward API: no ConfigMap, so the
        // operator needs no rights on ConfigMaps, and an edit rolls the pods like any template change.
        annotations.insert(names::ANNOTATION_LEADER_MIGRATION.to_string(), migration.to_yaml());
        volumes.push(Volume {
            name: names::LEADER_MIGRATION_VOLUME.into(),
            projected: Some(ProjectedVolumeSource {
                sources: Some(vec![VolumeProjection {
                    downward_api: Some(DownwardAPIProjection {
                        items: Some(vec![DownwardAPIVolumeFile {
                            path: names::LEADER_MIGRATION_FILE.into(),
                            field_ref: Some(ObjectFieldSelector {
                                api_version: Some("v1".into()),
                                field_path: format!("metadata.annotations['{}']", names::ANNOTATION_LEADER_MIGRATION),
                            }),
                            ..Default::default()
                        }]),
                    }),
                    ..Default::default()
                }]),
                default_mode: Some(0o440),
            }),
            ..Default::default()
        });
        mounts.push(VolumeMount {
            name: names::LEADER_MIGRATION_VOLUME.into(),
            mount_path: names::LEADER_MIGRATION_DIR.into(),
            read_only: Some(true),
            ..Default::default()
        });
    }
    let node_selector = match (cr.spec.mode, &d.node_selector) {
        (_, Some(sel)) => Some(sel.clone()),
        (Mode::DaemonSet, None) => Some(control_plane_selector()),
        _ => None,
    };
    let mut tolerations = default_tolerations();
    tolerations.extend(d.tolerations.iter().flatten().cloned());
    let probe = |path: &str, initial: i32| Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::Int(names::MANAGER_PORT),
            // The manager serves HTTPS (self-signed unless given a certificate); kubelet
            // probes do not verify it, and health paths need no token.
            scheme: Some("HTTPS".into()),
            ..Default::default()
        }),
        initial_delay_seconds: Some(initial),
        period_seconds: Some(10),
        timeout_seconds: Some(5),
        failure_threshold: Some(3),
        ..Default::default()
    };
    // The endpoint listens on the Pod's own address only: on the host network 0.0.0.0 would be
    // every address of the Node (Kubernetes expands `$(POD_IP)` from the environment below).
    // Before `extraArgs`, which come last.
    let bind = format!("--bind-address=$({})", names::POD_IP_ENV);
    let args = match upstream {
        Some(profile) => {
            let node_manager = crate::profiles::node_manager_of(cr).is_some();
            crate::profiles::upstream_args(&validated.config, profile, &bind, node_manager)
        }
        None => {
            let mut args = manager_args(validated);
            let extra = validated.config.extra_args.len().min(args.len());
            args.insert(args.len() - extra, bind);
            args
        }
    };
    let mut env = vec![EnvVar {
        name: names::POD_IP_ENV.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector { api_version: Some("v1".into()), field_path: "status.podIP".into() }),
            ..Default::default()
        }),
        ..Default::default()
    }];
    env.extend(secret_env);
    // DISABLE_HTTP2 is read by this project's client only.
    if upstream.is_none() {
        env.extend(crate::desired::http2_env(settings));
    }
    let (image, command) = match upstream {
        // An empty command runs the image's entrypoint (the generic profile).
        Some(profile) => (
            d.image.clone().unwrap_or_else(|| profile.image.to_string()),
            (!profile.command.is_empty()).then(|| profile.command.iter().map(|c| c.to_string()).collect()),
        ),
        None => (
            d.image.clone().unwrap_or_else(|| settings.manager_image.clone()),
            Some(vec![names::MANAGER_COMMAND.into()]),
        ),
    };
    // Upstream's secure port serves /healthz only (no /readyz or /livez).
    let (ready_path, live_path) = if upstream.is_some() { ("/healthz", "/healthz") } else { ("/readyz", "/livez") };
    let container = Container {
        name: names::CONTAINER_NAME.into(),
        image: Some(image),
        image_pull_policy: d.image_pull_policy.map(|p| p.as_str().to_string()),
        command,
        args: Some(args),
        ports: Some(vec![ContainerPort {
            name: Some("metrics".into()),
            container_port: names::MANAGER_PORT,
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
        readiness_probe: Some(probe(ready_path, 5)),
        liveness_probe: Some(probe(live_path, 15)),
        resources: Some(d.resources.clone().unwrap_or_else(default_resources)),
        // The `restricted` Pod Security profile, declared on the container as well as the pod so
        // it holds whatever the pod level says; the root filesystem is read-only (the manager
        // writes nothing; a self-signed serving certificate is kept in memory).
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            run_as_non_root: Some(true),
            privileged: Some(false),
            capabilities: Some(Capabilities { drop: Some(vec!["ALL".into()]), add: None }),
            seccomp_profile: Some(SeccompProfile { type_: "RuntimeDefault".into(), localhost_profile: None }),
            ..Default::default()
        }),
        volume_mounts: (!mounts.is_empty()).then_some(mounts),
        env: Some(env),
        ..Default::default()
    };
    PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(labels.clone()),
            annotations: (!annotations.is_empty()).then_some(annotations),
            ..Default::default()
        }),
        spec: Some(PodSpec {
            service_account_name: Some(service_account.into()),
            // The manager talks to the API server with its ServiceAccount token.
            automount_service_account_token: Some(true),
            // It reads no Service environment variables; without them the pod carries nothing
            // it does not need.
            enable_service_links: Some(false),
            // On by default: the manager must run before the pod network does (docs/security.md).
            host_network: Some(d.host_network),
            dns_policy: Some(if d.host_network { "ClusterFirstWithHostNet" } else { "ClusterFirst" }.into()),
            priority_class_name: (!d.priority_class_name.is_empty()).then(|| d.priority_class_name.clone()),
            node_selector,
            tolerations: Some(tolerations),
            affinity: Some(Affinity {
                // Preferred, not required: a one-node cluster can still run two replicas when
                // not on the host network, while larger clusters spread them.
                pod_anti_affinity: Some(PodAntiAffinity {
                    preferred_during_scheduling_ignored_during_execution: Some(vec![WeightedPodAffinityTerm {
                        weight: 100,
                        pod_affinity_term: PodAffinityTerm {
                            label_selector: Some(LabelSelector {
                                match_labels: Some(names::selector_labels(&uid)),
                                ..Default::default()
                            }),
                            topology_key: "kubernetes.io/hostname".into(),
                            ..Default::default()
                        },
                    }]),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            security_context: Some(PodSecurityContext {
                run_as_non_root: Some(true),
                run_as_user: Some(65532),
                run_as_group: Some(65532),
                // The kubelet gives the Secret volume's files this group, so the 0440 cloud-config
                // is readable by the manager (uid/gid 65532) and no one else; without it they are
                // root:root and the manager crash-loops on `Permission denied`.
                fs_group: Some(65532),
                seccomp_profile: Some(SeccompProfile { type_: "RuntimeDefault".into(), localhost_profile: None }),
                ..Default::default()
            }),
            containers: vec![container],
            volumes: (!volumes.is_empty()).then_some(volumes),
            ..Default::default()
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::CloudConfigRef;
    use ccm_framework::leader_migration::LeaderMigrationConfiguration;
    use serde_json::json;
    use testkit::Meta;

    /// The resource these tests build from: `kube-system/aws`, uid `uid-1`.
    fn cr(spec: serde_json::Value) -> CloudControllerManager {
        testkit::cr("kube-system", "aws", spec).with_uid("uid-1")
    }

    fn validated(cr: &CloudControllerManager, hash: Option<&str>) -> Validated {
        Validated {
            config: crate::validate::manager_config(cr, hash.map(|_| "cloud.conf")).unwrap(),
            cloud_config: hash.map(|h| CloudConfigRef {
                secret: "cfg".into(),
                key: "cloud.conf".into(),
                extra_keys: cr
                    .spec
                    .cloud_config
                    .as_ref()
                    .map(|c| c.extra_keys().into_iter().map(String::from).collect())
                    .unwrap_or_default(),
                hash: h.into(),
                restart_hash: h.into(),
            }),
            provider_has_routes: false,
        }
    }

    fn kinds(objs: &[Desired]) -> Vec<Kind> {
        objs.iter().map(Desired::kind).collect()
    }

    fn deployment(objs: &[Desired]) -> &Deployment {
        objs.iter()
            .find_map(|o| match o {
                Desired::Deployment(d) => Some(d),
                _ => None,
            })
            .unwrap()
    }

    fn pod_spec(objs: &[Desired]) -> PodSpec {
        deployment(objs).spec.clone().unwrap().template.spec.unwrap()
    }

    #[test]
    fn deployment_mode_with_two_replicas_has_a_pdb_that_allows_unhealthy_eviction() {
        let c = cr(json!({"provider": "fake"}));
        let objs = build(&c, &validated(&c, None), &BuildSettings::default());
        assert_eq!(
            kinds(&objs),
            [
                Kind::ServiceAccount,
                Kind::ClusterRoleBinding,
                Kind::RoleBinding,
                Kind::Role,
                Kind::RoleBinding,
                Kind::Deployment,
                Kind::PodDisruptionBudget
            ]
        );
        let Desired::PodDisruptionBudget(pdb) = &objs[6] else { panic!() };
        let spec = pdb.spec.as_ref().unwrap();
        assert_eq!(spec.min_available, Some(IntOrString::Int(1)));
        assert_eq!(spec.unhealthy_pod_eviction_policy.as_deref(), Some("AlwaysAllow"));
    }

    #[test]
    fn one_replica_has_no_pdb() {
        let c = cr(json!({"provider": "fake", "deployment": {"replicas": 1}}));
        let objs = build(&c, &validated(&c, None), &BuildSettings::default());
        assert!(!kinds(&objs).contains(&Kind::PodDisruptionBudget));
    }

    #[test]
    fn daemonset_mode_runs_on_control_plane_nodes_without_pdb() {
        let c = cr(json!({"provider": "fake", "mode": "DaemonSet"}));
        let objs = build(&c, &validated(&c, None), &BuildSettings::default());
        assert_eq!(
            kinds(&objs),
            [
                Kind::ServiceAccount,
                Kind::ClusterRoleBinding,
                Kind::RoleBinding,
                Kind::Role,
                Kind::RoleBinding,
                Kind::DaemonSet
            ]
        );
        let Desired::DaemonSet(ds) = &objs[5] else { panic!() };
        let spec = ds.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
        assert_eq!(spec.node_selector, Some(control_plane_selector()));
        let c = cr(json!({"provider": "fake", "mode": "DaemonSet", "deployment": {"nodeSelector": {"pool": "infra"}}}));
        let objs = build(&c, &validated(&c, None), &BuildSettings::default());
        let Desired::DaemonSet(ds) = &objs[5] else { panic!() };
        let sel = ds.spec.as_ref().unwrap().template.spec.as_ref().unwrap().node_selector.clone().unwrap();
        assert_eq!(sel, BTreeMap::from([("pool".to_string(), "infra".to_string())]));
    }

    #[test]
    fn embedded_mode_has_no_children() {
        let c = cr(json!({"provider": "fake", "mode": "Embedded"}));
        assert!(build(&c, &validated(&c, None), &BuildSettings::default()).is_empty());
    }

    #[test]
    fn args_are_derived_from_the_spec_then_extra_args() {
        let c = cr(json!({
            "provider": "fake",
            "cloudConfig": {"secretRef": {"name": "cfg"}},
            "controllers": ["*", "-route"],
            "clusterName": "prod",
            "clusterCIDR": "10.244.0.0/16",
            "configureCloudRoutes": false,
            "loadBalancerClass": "example.com/lb",
            "leaderElection": {"leaseDuration": "137s", "renewDeadline": "107s", "retryPeriod": "26s"},
            "concurrency": {"nodeSyncs": 3, "serviceSyncs": 4, "routeSyncs": 2},
            "extraArgs": ["-v=4"]
        }));
        let args = manager_args(&validated(&c, Some("h")));
        assert_eq!(
            args,
            [
                "--cloud-provider=fake",
                "--cloud-config=/etc/kubernetes/cloud-config/cloud.conf",
                "--controllers=*,-node-route-controller",
                "--cluster-name=prod",
                "--cluster-cidr=10.244.0.0/16",
                "--configure-cloud-routes=false",
                "--leader-elect=true",
                "--leader-elect-resource-name=aws",
                "--leader-elect-resource-namespace=kube-system",
                "--leader-elect-lease-duration=137s",
                "--leader-elect-renew-deadline=107s",
                "--leader-elect-retry-period=26s",
                "--concurrent-node-syncs=3",
                "--concurrent-service-syncs=4",
                "--concurrent-route-syncs=2",
                "--load-balancer-class=example.com/lb",
                "--secure-port=10258",
                "--ccm-resource=kube-system/aws",
                "-v=4",
            ]
        );
    }

    fn container(objs: &[Desired]) -> Container {
        pod_spec(objs).containers[0].clone()
    }

    #[test]
    fn an_upstream_profile_runs_its_image_and_command_with_upstream_flags_only() {
        let c = cr(json!({
            "provider": "aws",
            "upstream": {"profile": "aws"},
            "cloudConfig": {"secretRef": {"name": "cfg"}},
            "controllers": ["*", "-route"],
            "clusterName": "prod",
            "extraArgs": ["--v=2"]
        }));
        let objs = build(&c, &validated(&c, Some("h")), &BuildSettings::default());
        let c0 = container(&objs);
        assert_eq!(c0.image.as_deref(), Some(crate::profiles::profile(crds::v1alpha1::UpstreamProfile::Aws).image));
        assert_eq!(c0.command, Some(vec!["/bin/aws-cloud-controller-manager".to_string()]));
        let args = c0.args.unwrap();
        assert_eq!(
            args,
            [
                "--cloud-provider=aws",
                "--cloud-config=/etc/kubernetes/cloud-config/cloud.conf",
                "--controllers=*,-node-route-controller",
                "--cluster-name=prod",
                "--configure-cloud-routes=true",
                "--leader-elect=true",
                "--leader-elect-resource-name=aws",
                "--leader-elect-resource-namespace=kube-system",
                "--leader-elect-lease-duration=15s",
                "--leader-elect-renew-deadline=10s",
                "--leader-elect-retry-period=2s",
                "--concurrent-node-syncs=5",
                "--concurrent-service-syncs=32",
                "--secure-port=10258",
                "--bind-address=$(POD_IP)",
                "--authentication-skip-lookup=true",
                "--v=2",
            ],
            "no --ccm-resource: the operator alone writes an upstream manager's status"
        );
        for probe in [c0.readiness_probe.unwrap(), c0.liveness_probe.unwrap()] {
            assert_eq!(probe.http_get.unwrap().path.as_deref(), Some("/healthz"));
        }
        let binding = objs
            .iter()
            .find_map(|o| match o {
                Desired::ClusterRoleBinding(b) => Some(b.clone()),
                _ => None,
            })
            .unwrap();
        assert_eq!(binding.role_ref.name, BuildSettings::default().manager_upstream_cluster_role);
        assert_eq!(binding.metadata.name.as_deref(), Some("ccm-operator:kube-system:aws:upstream"));
        // The Pods say which manager they run; the selector does not, so a switch is a rollout.
        let spec = deployment(&objs).spec.clone().unwrap();
        let pod_labels = spec.template.metadata.unwrap().labels.unwrap();
        assert_eq!(pod_labels.get(names::LABEL_UPSTREAM_PROFILE).map(String::as_str), Some("aws"));
        assert!(!spec.selector.match_labels.unwrap().contains_key(names::LABEL_UPSTREAM_PROFILE));
        assert!(restricted_violations(&pod_spec(&objs)).iter().all(|v| v.contains("hostNetwork")));
    }

    #[test]
    fn an_env_profile_gets_the_secret_key_as_its_variable_and_no_cloud_config_file() {
        let c = cr(
            json!({"provider": "hcloud", "upstream": {"profile": "hetzner"}, "cloudConfig": {"secretRef": {"name": "cfg"}}}),
        );
        let objs = build(&c, &validated(&c, Some("h")), &BuildSettings::default());
        let c0 = container(&objs);
        let token = c0.env.iter().flatten().find(|e| e.name == "HCLOUD_TOKEN").expect("HCLOUD_TOKEN");
        let from = token.value_from.clone().unwrap().secret_key_ref.unwrap();
        assert_eq!((from.name.as_str(), from.key.as_str()), ("cfg", "cloud.conf"));
        assert!(token.value.is_none());
        assert!(!c0.args.unwrap().iter().any(|a| a.starts_with("--cloud-config")));
        assert!(pod_spec(&objs).volumes.unwrap_or_default().is_empty() && c0.volume_mounts.is_none());
        // The Secret's hash still rolls the pods when the token changes.
        let annotations = deployment(&objs).spec.clone().unwrap().template.metadata.unwrap().annotations.unwrap();
        assert_eq!(annotations.get(names::ANNOTATION_CLOUD_CONFIG_HASH).map(String::as_str), Some("h"));
    }

    #[test]
    fn a_credentials_key_is_mounted_beside_the_cloud_config_and_named_by_the_sdks_variable() {
        let cloud_config = json!({"secretRef": {"name": "cfg"}, "credentialsKey": "credentials"});
        for spec in [
            json!({"provider": "aws", "cloudConfig": cloud_config}),
            json!({"provider": "aws", "upstream": {"profile": "aws"}, "cloudConfig": cloud_config}),
        ] {
            let c = cr(spec);
            let objs = build(&c, &validated(&c, Some("h")), &BuildSettings::default());
            let c0 = container(&objs);
            let var = c0.env.iter().flatten().find(|e| e.name == "AWS_SHARED_CREDENTIALS_FILE").expect("the variable");
            assert_eq!(var.value.as_deref(), Some("/etc/kubernetes/cloud-config/credentials"));
            let volumes = pod_spec(&objs).volumes.unwrap();
            let items = volumes[0].secret.clone().unwrap().items.unwrap();
            let keys: Vec<&str> = items.iter().map(|i| i.key.as_str()).collect();
            assert_eq!(keys, ["cloud.conf", "credentials"], "only the two named keys of the Secret");
        }
        // Without the key, neither the item nor the variable.
        let c = cr(json!({"provider": "aws", "cloudConfig": {"secretRef": {"name": "cfg"}}}));
        let c0 = container(&build(&c, &validated(&c, Some("h")), &BuildSettings::default()));
        assert!(!c0.env.iter().flatten().any(|e| e.name == "AWS_SHARED_CREDENTIALS_FILE"));
    }

    #[test]
    fn a_ca_bundle_key_is_mounted_and_named_by_ssl_cert_file_for_every_manager() {
        let cloud_config = json!({"secretRef": {"name": "cfg"}, "caBundleKey": "ca.crt"});
        // A file profile (and the Rust manager) get both keys; an env profile only the bundle.
        for (spec, keys) in [
            (json!({"provider": "openstack", "upstream": {"profile": "openstack"}}), vec!["cloud.conf", "ca.crt"]),
            (json!({"provider": "aws"}), vec!["cloud.conf", "ca.crt"]),
            (json!({"provider": "hcloud", "upstream": {"profile": "hetzner"}}), vec!["ca.crt"]),
        ] {
            let mut spec = spec;
            spec["cloudConfig"] = cloud_config.clone();
            let c = cr(spec.clone());
            let objs = build(&c, &validated(&c, Some("h")), &BuildSettings::default());
            let c0 = container(&objs);
            let var = c0.env.iter().flatten().find(|e| e.name == "SSL_CERT_FILE").expect("SSL_CERT_FILE");
            assert_eq!(var.value.as_deref(), Some("/etc/kubernetes/cloud-config/ca.crt"), "{spec}");
            let items = pod_spec(&objs).volumes.unwrap()[0].secret.clone().unwrap().items.unwrap();
            assert_eq!(items.iter().map(|i| i.key.as_str()).collect::<Vec<_>>(), keys, "{spec}");
        }
    }

    #[test]
    fn the_generic_profile_runs_the_named_image_with_its_own_entrypoint() {
        let c = cr(
            json!({"provider": "bench", "upstream": {"profile": "generic"}, "deployment": {"image": "example.com/ccm:v1"}}),
        );
        let c0 = container(&build(&c, &validated(&c, None), &BuildSettings::default()));
        assert_eq!(c0.image.as_deref(), Some("example.com/ccm:v1"));
        assert_eq!(c0.command, None, "the image's entrypoint");
        assert_eq!(c0.args.unwrap()[0], "--cloud-provider=bench");
    }

    #[test]
    fn pod_shape_follows_the_spec_and_is_restricted() {
        let c = cr(json!({
            "provider": "fake",
            "cloudConfig": {"secretRef": {"name": "cfg"}},
            "deployment": {"image": "example/ccm:1", "hostNetwork": false, "priorityClassName": "high",
                           "tolerations": [{"key": "dedicated", "operator": "Exists"}]}
        }));
        let objs = build(&c, &validated(&c, Some("h")), &BuildSettings::default());
        let pod = pod_spec(&objs);
        assert_eq!(pod.host_network, Some(false));
        assert_eq!(pod.priority_class_name.as_deref(), Some("high"));
        assert_eq!(pod.service_account_name.as_deref(), Some("ccm-aws"));
        let keys: Vec<_> = pod.tolerations.unwrap().into_iter().filter_map(|t| t.key).collect();
        for k in
            ["node.cloudprovider.kubernetes.io/uninitialized", "node-role.kubernetes.io/control-plane", "dedicated"]
        {
            assert!(keys.iter().any(|x| x == k), "{k} missing from {keys:?}");
        }
        assert!(pod.affinity.unwrap().pod_anti_affinity.is_some());
        assert_eq!(pod.security_context.unwrap().run_as_non_root, Some(true));
        let container = &pod.containers[0];
        assert_eq!(container.image.as_deref(), Some("example/ccm:1"));
        let sc = container.security_context.clone().unwrap();
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        assert_eq!(sc.capabilities.unwrap().drop.unwrap(), ["ALL"]);
        let vol = &pod.volumes.unwrap()[0];
        assert_eq!(vol.secret.as_ref().unwrap().secret_name.as_deref(), Some("cfg"));
    }

    #[test]
    fn manager_pod_can_read_its_cloud_config_as_uid_65532_in_every_mode() {
        for mode in ["Deployment", "DaemonSet"] {
            let c = cr(json!({"provider": "fake", "mode": mode, "cloudConfig": {"secretRef": {"name": "cfg"}}}));
            let pod = pod_of(&build(&c, &validated(&c, Some("h")), &BuildSettings::default()));
            let sc = pod.security_context.clone().unwrap();
            let (uid, gid) = (sc.run_as_user.unwrap(), sc.run_as_group.unwrap());
            assert_eq!((uid, gid), (65532, 65532), "{mode}");
            // The kubelet makes Secret files root:<fsGroup>; a 0440 file is readable by that group only.
            assert_eq!(sc.fs_group, Some(gid), "{mode}: the cloud-config would stay root:root");
            let secret = pod.volumes.unwrap()[0].secret.clone().unwrap();
            let mode_bits = secret.default_mode.unwrap();
            assert_eq!(mode_bits & 0o040, 0o040, "{mode}: group cannot read");
            assert_eq!(mode_bits & 0o007, 0, "{mode}: the cloud-config must not be world-readable");
            assert!(secret.items.unwrap().iter().all(|i| i.mode.is_none()), "{mode}: an item overrides the mode");
        }
    }

    /// Rolls a Deployment from one pod template to another the way kube-controller-manager's
    /// Deployment controller does (`rolling.go`: scale the new ReplicaSet up to
    /// `replicas + maxSurge`, scale old ones down while at least `replicas - maxUnavailable` pods
    /// stay available, unhealthy old pods first), with a scheduler that puts at most one
    /// host-network pod on each of `nodes` Nodes (the port). Pods start and stop at once.
    /// Returns whether every replica runs the new template (as far as Nodes allow).
    fn rollout_completes(replicas: i32, nodes: i32, host_network: bool, strategy: &DeploymentStrategy) -> bool {
        let ru = strategy.rolling_update.clone().unwrap();
        let resolve = |v: Option<IntOrString>, round_up: bool| match v.unwrap() {
            IntOrString::Int(i) => i,
            IntOrString::String(p) => {
                let pct: i32 = p.trim_end_matches('%').parse().unwrap();
                if round_up { (replicas * pct + 99) / 100 } else { replicas * pct / 100 }
            }
        };
        let surge = resolve(ru.max_surge, true);
        let mut unavailable = resolve(ru.max_unavailable, false);
        if surge == 0 && unavailable == 0 {
            unavailable = 1;
        }
        let capacity = if host_network { nodes } else { i32::MAX };
        // (desired replicas, running pods) of the old and the new ReplicaSet, from a steady
        // state of the old template.
        let (mut old, mut new) = ((replicas, replicas.min(capacity)), (0, 0));
        for _ in 0..100 {
            // Scheduler: pending pods take free Nodes, the old ReplicaSet's first (created first).
            let free = |old: (i32, i32), new: (i32, i32)| capacity.saturating_sub(old.1 + new.1);
            old.1 += (old.0 - old.1).min(free(old, new)).max(0);
            new.1 += (new.0 - new.1).min(free(old, new)).max(0);
            // reconcileNewReplicaSet.
            let total = old.0 + new.0;
            if total < replicas + surge && new.0 < replicas {
                new.0 += (replicas + surge - total).min(replicas - new.0);
            }
            // reconcileOldReplicaSets.
            let min_available = replicas - unavailable;
            let mut max_down = old.0 + new.0 - min_available - (new.0 - new.1);
            if max_down > 0 && old.0 > 0 {
                let unhealthy = (old.0 - old.1).min(max_down);
                old.0 -= unhealthy;
                max_down -= unhealthy;
                let available = old.1 + new.1;
                let down = (available - min_available).min(old.0).min(max_down.max(0));
                if down > 0 {
                    old.0 -= down;
                    old.1 = old.1.min(old.0);
                }
            }
            old.1 = old.1.min(old.0);
            if old.0 == 0 && new.0 == replicas && new.1 == replicas.min(capacity) {
                return true;
            }
        }
        false
    }

    #[test]
    fn a_host_network_rollout_finishes_on_one_node_with_the_default_two_replicas() {
        let c = cr(json!({"provider": "fake"}));
        let d = deployment(&build(&c, &validated(&c, Some("h")), &BuildSettings::default())).clone();
        let spec = d.spec.unwrap();
        assert_eq!(spec.template.spec.unwrap().host_network, Some(true));
        let strategy = spec.strategy.unwrap();
        let surge = strategy.rolling_update.as_ref().unwrap().max_surge.clone();
        assert_eq!(surge, Some(IntOrString::Int(0)), "a surge pod cannot bind the host port");
        assert!(rollout_completes(spec.replicas.unwrap(), 1, true, &strategy), "deadlocks on one Node");
        for (replicas, nodes) in [(1, 1), (2, 1), (3, 1), (3, 2), (2, 3), (3, 5)] {
            assert!(rollout_completes(replicas, nodes, true, &strategy), "{replicas} replicas on {nodes} Nodes");
        }
        // What it was: one at a time deadlocks as soon as replicas outnumber the Nodes.
        let one_at_a_time = deployment_strategy(false);
        assert!(!rollout_completes(2, 1, true, &one_at_a_time));
        assert!(rollout_completes(2, 2, true, &one_at_a_time));
    }

    #[test]
    fn a_pod_network_rollout_replaces_one_pod_at_a_time() {
        let c = cr(json!({"provider": "fake", "deployment": {"hostNetwork": false, "replicas": 3}}));
        let d = deployment(&build(&c, &validated(&c, Some("h")), &BuildSettings::default())).clone();
        let strategy = d.spec.unwrap().strategy.unwrap();
        let ru = strategy.rolling_update.clone().unwrap();
        assert_eq!((ru.max_surge, ru.max_unavailable), (Some(IntOrString::Int(0)), Some(IntOrString::Int(1))));
        assert!(rollout_completes(3, 1, false, &strategy));
    }

    #[test]
    fn m7_migration_renders_the_file_from_an_annotation_through_a_projected_volume_and_allows_its_lease() {
        let c =
            cr(json!({"provider": "fake", "leaderElection": {"migration": {"enabled": true, "leaderName": "moving",
            "controllerLeaders": [{"name": "cloud-node", "component": "*"}, {"name": "service", "component": "*"}]}}}));
        let objs = build(&c, &validated(&c, None), &BuildSettings::default());
        let pod = pod_spec(&objs);
        let args = pod.containers[0].args.clone().unwrap();
        assert!(args.contains(&"--enable-leader-migration=true".to_string()), "{args:?}");
        assert!(args.contains(&format!("--leader-migration-config={}", names::leader_migration_path())), "{args:?}");
        let vol = pod.volumes.clone().unwrap().into_iter().find(|v| v.name == names::LEADER_MIGRATION_VOLUME).unwrap();
        let item = &vol.projected.unwrap().sources.unwrap()[0].downward_api.clone().unwrap().items.unwrap()[0];
        assert_eq!(item.path, names::LEADER_MIGRATION_FILE);
        assert!(restricted_violations(&pod).iter().all(|v| !v.contains("volume")), "{:?}", restricted_violations(&pod));
        let annotations = deployment(&objs).spec.clone().unwrap().template.metadata.unwrap().annotations.unwrap();
        let file =
            LeaderMigrationConfiguration::parse(annotations[names::ANNOTATION_LEADER_MIGRATION].as_bytes()).unwrap();
        assert_eq!(file.leader_name, "moving");
        assert_eq!(file.controller_leaders.len(), 2);
        let role = objs.iter().find_map(|o| if let Desired::Role(r) = o { Some(r.clone()) } else { None }).unwrap();
        let lease_rule = &role.rules.unwrap()[0];
        assert_eq!(lease_rule.resource_names.clone().unwrap(), ["aws", "moving"]);

        // Upstream's default: the flag alone, no file, and the default Lease in the Role.
        let c = cr(json!({"provider": "fake", "leaderElection": {"migration": {"enabled": true}}}));
        let objs = build(&c, &validated(&c, None), &BuildSettings::default());
        let args = pod_spec(&objs).containers[0].args.clone().unwrap();
        assert!(args.contains(&"--enable-leader-migration=true".to_string()));
        assert!(!args.iter().any(|a| a.starts_with("--leader-migration-config")), "{args:?}");
        assert!(pod_spec(&objs).volumes.is_none());
        let role = objs.iter().find_map(|o| if let Desired::Role(r) = o { Some(r.clone()) } else { None }).unwrap();
        assert_eq!(
            role.rules.unwrap()[0].resource_names.clone().unwrap(),
            ["aws", "cloud-provider-extraction-migration"]
        );
    }

    #[test]
    fn m7_a_migration_lease_in_another_namespace_gets_a_role_for_that_lease_and_bindings_there_only() {
        let c =
            cr(json!({"provider": "fake", "leaderElection": {"migration": {"enabled": true, "leaderName": "moving",
            "leaseNamespace": "ccm-moving"}}}));
        let settings = BuildSettings::default();
        let objs = build(&c, &validated(&c, None), &settings);
        let args = pod_spec(&objs).containers[0].args.clone().unwrap();
        assert!(args.contains(&"--leader-migration-lease-namespace=ccm-moving".to_string()), "{args:?}");
        // The own Role no longer names the migration Lease: it is not in this namespace.
        let own = objs
            .iter()
            .find_map(|o| match o {
                Desired::Role(r) if r.metadata.namespace.as_deref() == Some("kube-system") => Some(r.clone()),
                _ => None,
            })
            .unwrap();
        assert_eq!(own.rules.unwrap()[0].resource_names.clone().unwrap(), ["aws"]);
        let there: Vec<&Desired> =
            objs.iter().filter(|o| o.meta().namespace.as_deref() == Some("ccm-moving")).collect();
        assert_eq!(
            there.iter().map(|o| (o.kind(), o.name().to_string())).collect::<Vec<_>>(),
            [
                (Kind::Role, "ccm:kube-system:aws:migration".to_string()),
                (Kind::RoleBinding, "ccm:kube-system:aws:migration".to_string()),
                (Kind::RoleBinding, "ccm:kube-system:aws:migration-create".to_string()),
            ]
        );
        for o in &there {
            let meta = o.meta();
            assert!(meta.owner_references.is_none(), "no ownerReference across namespaces");
            assert_eq!(meta.labels.as_ref().unwrap()[names::LABEL_OWNER_UID], "uid-1");
            assert_eq!(meta.annotations.as_ref().unwrap()[names::ANNOTATION_OWNER], "kube-system/aws");
            assert_eq!(binding_overreach(o, "kube-system", "aws", Some("ccm-moving"), &settings), None);
            // Without the resource naming that namespace, a binding there is refused.
            if o.kind() == Kind::RoleBinding {
                assert!(binding_overreach(o, "kube-system", "aws", None, &settings).is_some());
            }
        }
        let Desired::Role(role) = there[0] else { panic!() };
        let rules = role.rules.clone().unwrap();
        assert_eq!(rules.len(), 1);
        assert_eq!(rules[0].resources.clone().unwrap(), ["leases"]);
        assert_eq!(rules[0].resource_names.clone().unwrap(), ["moving"]);
        assert_eq!(rules[0].verbs, ["get", "update"]);
        let Desired::RoleBinding(create) = there[2] else { panic!() };
        assert_eq!(
            (create.role_ref.kind.as_str(), create.role_ref.name.as_str()),
            ("ClusterRole", "ccm-manager-namespace")
        );
        // In the lease namespace, only the migration Role and the namespace ClusterRole may be
        // bound: not the own Role of a resource there.
        let Desired::RoleBinding(mut b) = there[1].clone() else { panic!() };
        b.role_ref.name = names::own_role_name("aws");
        assert!(
            binding_overreach(&Desired::RoleBinding(b), "kube-system", "aws", Some("ccm-moving"), &settings).is_some()
        );
        // leaseNamespace naming the resource's own namespace is the default: nothing elsewhere.
        let c = cr(
            json!({"provider": "fake", "leaderElection": {"migration": {"enabled": true, "leaseNamespace": "kube-system"}}}),
        );
        let objs = build(&c, &validated(&c, None), &settings);
        assert!(objs.iter().all(|o| o.meta().namespace.as_deref() != Some("ccm-moving")));
        let args = pod_spec(&objs).containers[0].args.clone().unwrap();
        assert!(!args.iter().any(|a| a.starts_with("--leader-migration-lease-namespace")), "{args:?}");
    }

    #[test]
    fn operator_image_is_the_default() {
        let c = cr(json!({"provider": "fake"}));
        let settings = BuildSettings { manager_image: "registry/ccm:v9".into(), ..Default::default() };
        let pod = pod_spec(&build(&c, &validated(&c, None), &settings));
        assert_eq!(pod.containers[0].image.as_deref(), Some("registry/ccm:v9"));
    }

    #[test]
    fn managers_get_disable_http2_only_when_the_operator_runs_with_it() {
        let c = cr(json!({"provider": "fake"}));
        let plain = pod_spec(&build(&c, &validated(&c, None), &BuildSettings::default()));
        let names = |env: &[EnvVar]| env.iter().map(|e| e.name.clone()).collect::<Vec<_>>();
        assert_eq!(names(plain.containers[0].env.as_deref().unwrap()), [names::POD_IP_ENV]);
        let settings = BuildSettings { manager_disable_http2: true, ..Default::default() };
        let env = pod_spec(&build(&c, &validated(&c, None), &settings)).containers[0].env.clone().unwrap();
        assert_eq!(names(&env), [names::POD_IP_ENV, "DISABLE_HTTP2"]);
        assert_eq!(env[1].value.as_deref(), Some("true"));
    }

    #[test]
    fn cloud_config_hash_changes_the_template_and_applied_hashes() {
        let c = cr(json!({"provider": "fake", "cloudConfig": {"secretRef": {"name": "cfg"}}}));
        let a = build(&c, &validated(&c, Some("one")), &BuildSettings::default());
        let b = build(&c, &validated(&c, Some("two")), &BuildSettings::default());
        let template_hash = |objs: &[Desired]| {
            deployment(objs).metadata.annotations.as_ref().unwrap()[names::ANNOTATION_TEMPLATE_HASH].clone()
        };
        assert_ne!(template_hash(&a), template_hash(&b));
        assert_ne!(deployment(&a).metadata.annotations, deployment(&b).metadata.annotations);
        let pod_annotations = deployment(&b).spec.clone().unwrap().template.metadata.unwrap().annotations.unwrap();
        assert_eq!(pod_annotations[names::ANNOTATION_CLOUD_CONFIG_HASH], "two");
        // Objects without the template are unaffected.
        assert_eq!(a[0], b[0]);
    }

    #[test]
    fn an_edit_the_manager_reloads_in_place_does_not_roll_the_pods() {
        let c = cr(json!({"provider": "fake", "cloudConfig": {"secretRef": {"name": "cfg"}}}));
        let before = validated(&c, Some("one"));
        let mut pools_edited = before.clone();
        pools_edited.cloud_config.as_mut().unwrap().hash = "one-with-another-pool".into();
        assert_eq!(build(&c, &before, &BuildSettings::default()), build(&c, &pools_edited, &BuildSettings::default()));
        let mut restart = before.clone();
        restart.cloud_config.as_mut().unwrap().restart_hash = "inventory-edited".into();
        assert_ne!(build(&c, &before, &BuildSettings::default()), build(&c, &restart, &BuildSettings::default()));
    }

    #[test]
    fn scaling_keeps_the_template_hash() {
        let c1 = cr(json!({"provider": "fake", "deployment": {"replicas": 2}}));
        let c3 = cr(json!({"provider": "fake", "deployment": {"replicas": 3}}));
        let h = |c: &CloudControllerManager| {
            deployment(&build(c, &validated(c, None), &BuildSettings::default())).metadata.annotations.as_ref().unwrap()
                [names::ANNOTATION_TEMPLATE_HASH]
                .clone()
        };
        assert_eq!(h(&c1), h(&c3));
    }

    #[test]
    fn every_child_is_labelled_and_namespaced_children_are_owned() {
        let c = cr(json!({"provider": "fake"}));
        for o in build(&c, &validated(&c, None), &BuildSettings::default()) {
            let labels = o.meta().labels.clone().unwrap();
            assert_eq!(labels[names::LABEL_MANAGED_BY], names::MANAGED_BY, "{:?}", o.kind());
            assert_eq!(labels[names::LABEL_OWNER_UID], "uid-1");
            assert!(o.applied_hash().is_some());
            if o.kind() == Kind::ClusterRoleBinding {
                assert!(o.meta().owner_references.is_none());
                assert_eq!(o.name(), "ccm-operator:kube-system:aws");
            } else {
                assert_eq!(o.meta().owner_references.clone().unwrap()[0].uid, "uid-1");
            }
        }
    }

    fn pod_of(objs: &[Desired]) -> PodSpec {
        objs.iter()
            .find_map(|o| match o {
                Desired::Deployment(d) => d.spec.clone().unwrap().template.spec,
                Desired::DaemonSet(d) => d.spec.clone().unwrap().template.spec,
                _ => None,
            })
            .unwrap()
    }

    #[test]
    fn manager_pod_passes_the_restricted_profile_in_every_mode_but_host_network() {
        for mode in ["Deployment", "DaemonSet"] {
            let on_pod_network = cr(json!({"provider": "fake", "mode": mode,
                "cloudConfig": {"secretRef": {"name": "cfg"}}, "deployment": {"hostNetwork": false}}));
            let pod =
                pod_of(&build(&on_pod_network, &validated(&on_pod_network, Some("h")), &BuildSettings::default()));
            assert_eq!(restricted_violations(&pod), Vec::<String>::new(), "{mode}");
            // The default: on the host network, which is the only exception.
            let default = cr(json!({"provider": "fake", "mode": mode, "cloudConfig": {"secretRef": {"name": "cfg"}}}));
            let pod = pod_of(&build(&default, &validated(&default, Some("h")), &BuildSettings::default()));
            assert_eq!(restricted_violations(&pod), ["hostNetwork=true"], "{mode}");
            // Nothing undeclared: no service links, no host ports, only the cloud-config volume.
            assert_eq!(pod.enable_service_links, Some(false));
            assert_eq!(pod.automount_service_account_token, Some(true));
            assert!(pod.containers[0].ports.iter().flatten().all(|p| p.host_port.is_none()));
            assert_eq!(pod.volumes.iter().flatten().count(), 1);
        }
    }

    #[test]
    fn restricted_check_catches_each_rule() {
        let c = cr(json!({"provider": "fake", "deployment": {"hostNetwork": false}}));
        let good = pod_of(&build(&c, &validated(&c, None), &BuildSettings::default()));
        assert!(restricted_violations(&good).is_empty());
        let breakers: Vec<(&str, fn(&mut PodSpec))> = vec![
            ("allowPrivilegeEscalation", |p| {
                p.containers[0].security_context.as_mut().unwrap().allow_privilege_escalation = None
            }),
            ("runAsNonRoot", |p| {
                p.containers[0].security_context.as_mut().unwrap().run_as_non_root = None;
                p.security_context.as_mut().unwrap().run_as_non_root = None;
            }),
            ("seccompProfile", |p| {
                p.containers[0].security_context.as_mut().unwrap().seccomp_profile = None;
                p.security_context.as_mut().unwrap().seccomp_profile = None;
            }),
            ("drop ALL", |p| p.containers[0].security_context.as_mut().unwrap().capabilities = None),
            ("privileged", |p| p.containers[0].security_context.as_mut().unwrap().privileged = Some(true)),
            ("hostPID", |p| p.host_pid = Some(true)),
            ("restricted type", |p| {
                p.volumes =
                    Some(vec![Volume { name: "h".into(), host_path: Some(Default::default()), ..Default::default() }])
            }),
        ];
        for (what, breaker) in breakers {
            let mut pod = good.clone();
            breaker(&mut pod);
            let v = restricted_violations(&pod);
            assert!(v.iter().any(|m| m.contains(what)), "{what}: {v:?}");
        }
    }

    #[test]
    fn own_role_grants_only_the_resources_own_lease_and_object() {
        let c = cr(json!({"provider": "fake"}));
        let objs = build(&c, &validated(&c, None), &BuildSettings::default());
        let Desired::Role(role) = &objs[3] else { panic!() };
        assert_eq!(role.metadata.name.as_deref(), Some("ccm:aws:own"));
        for rule in role.rules.as_ref().unwrap() {
            assert_eq!(rule.resource_names.as_deref(), Some(&["aws".to_string()][..]), "{rule:?}");
            assert!(!rule.verbs.iter().any(|v| v == "create" || v == "delete" || v == "list"), "{rule:?}");
        }
        let Desired::RoleBinding(rb) = &objs[4] else { panic!() };
        assert_eq!((rb.role_ref.kind.as_str(), rb.role_ref.name.as_str()), ("Role", "ccm:aws:own"));
        assert_eq!(rb.subjects.as_ref().unwrap()[0].name, "ccm-aws");
    }

    #[test]
    fn cluster_role_binding_binds_the_configured_role_to_the_service_account() {
        let c = cr(json!({"provider": "fake"}));
        let settings = BuildSettings { manager_cluster_role: "my-ccm".into(), ..Default::default() };
        let objs = build(&c, &validated(&c, None), &settings);
        let Desired::ClusterRoleBinding(crb) = &objs[1] else { panic!() };
        assert_eq!(crb.role_ref.name, "my-ccm");
        let subject = &crb.subjects.as_ref().unwrap()[0];
        assert_eq!((subject.name.as_str(), subject.namespace.as_deref()), ("ccm-aws", Some("kube-system")));
    }

    #[test]
    fn bindings_are_confined_to_the_resources_own_service_account_and_the_manager_roles() {
        let c = cr(json!({"provider": "fake"}));
        let settings = BuildSettings::default();
        let objs = build(&c, &validated(&c, None), &settings);
        for o in &objs {
            assert_eq!(binding_overreach(o, "kube-system", "aws", None, &settings), None, "{:?}", o.kind());
        }
        let crb = objs.iter().find(|o| o.kind() == Kind::ClusterRoleBinding).unwrap().clone();
        let Desired::ClusterRoleBinding(mut b) = crb.clone() else { panic!() };
        b.subjects.as_mut().unwrap()[0].name = "ccm-operator".into();
        assert!(
            binding_overreach(&Desired::ClusterRoleBinding(b.clone()), "kube-system", "aws", None, &settings).is_some()
        );
        b.subjects.as_mut().unwrap()[0].name = "ccm-aws".into();
        b.subjects.as_mut().unwrap().push(Subject {
            kind: "Group".into(),
            name: "system:authenticated".into(),
            ..Default::default()
        });
        assert!(
            binding_overreach(&Desired::ClusterRoleBinding(b.clone()), "kube-system", "aws", None, &settings).is_some()
        );
        b.subjects.as_mut().unwrap().pop();
        b.role_ref.name = "cluster-admin".into();
        let m = binding_overreach(&Desired::ClusterRoleBinding(b), "kube-system", "aws", None, &settings).unwrap();
        assert!(m.contains("cluster-admin"), "{m}");
        // The same binding for another resource's name is not this resource's.
        assert!(binding_overreach(&crb, "kube-system", "operator", None, &settings).is_some());
    }

    #[test]
    fn a_resource_without_resources_gets_a_memory_limit_and_its_own_resources_are_kept() {
        let c = cr(json!({"provider": "fake"}));
        let objs = build(&c, &validated(&c, None), &BuildSettings::default());
        let r = pod_spec(&objs).containers[0].resources.clone().unwrap();
        assert_eq!(r.limits.unwrap()["memory"], Quantity(DEFAULT_MEMORY_LIMIT.into()));
        assert_eq!(r.requests.unwrap()["memory"], Quantity(DEFAULT_MEMORY_REQUEST.into()));
        let c = cr(json!({"provider": "fake", "deployment": {"resources": {"limits": {"memory": "1Gi"}}}}));
        let objs = build(&c, &validated(&c, None), &BuildSettings::default());
        let r = pod_spec(&objs).containers[0].resources.clone().unwrap();
        assert_eq!(r.limits.unwrap()["memory"], Quantity("1Gi".into()));
    }
    #[test]
    fn the_manager_endpoint_listens_on_the_pods_own_address_in_every_mode() {
        for mode in ["Deployment", "DaemonSet"] {
            for host_network in [true, false] {
                let c = cr(json!({"provider": "fake", "mode": mode, "deployment": {"hostNetwork": host_network},
                    "extraArgs": ["--v=2"]}));
                let container =
                    pod_of(&build(&c, &validated(&c, None), &BuildSettings::default())).containers[0].clone();
                let args = container.args.unwrap();
                assert_eq!(args.last().map(String::as_str), Some("--v=2"), "extraArgs come last");
                let bind: Vec<&String> = args.iter().filter(|a| a.starts_with("--bind-address")).collect();
                assert_eq!(bind, [&format!("--bind-address=$({})", names::POD_IP_ENV)], "{mode} {host_network}");
                let env = container.env.unwrap();
                let pod_ip = env.iter().find(|e| e.name == names::POD_IP_ENV).expect("POD_IP");
                let field = pod_ip.value_from.as_ref().and_then(|v| v.field_ref.as_ref()).unwrap();
                assert_eq!(field.field_path, "status.podIP");
                assert_eq!(container.command.as_deref(), Some(&[names::MANAGER_COMMAND.to_string()][..]));
            }
        }
    }

    #[test]
    fn a_shadow_manager_is_bound_to_the_read_only_cluster_role_under_a_binding_of_its_own() {
        let settings = BuildSettings::default();
        let binding = |spec: serde_json::Value| {
            let c = cr(spec);
            let objs = build(&c, &validated(&c, None), &settings);
            for o in &objs {
                assert_eq!(binding_overreach(o, "kube-system", "aws", None, &settings), None, "{:?}", o.kind());
            }
            objs.into_iter()
                .find_map(|o| match o {
                    Desired::ClusterRoleBinding(b) => Some(b),
                    _ => None,
                })
                .unwrap()
        };
        let acting = binding(json!({"provider": "fake"}));
        let shadow = binding(json!({"provider": "fake", "shadow": true}));
        assert_eq!(acting.role_ref.name, settings.manager_cluster_role);
        assert_eq!(shadow.role_ref.name, settings.manager_shadow_cluster_role);
        assert_eq!(shadow.metadata.name.as_deref(), Some("ccm-operator:kube-system:aws:shadow"));
        assert_ne!(acting.metadata.name, shadow.metadata.name, "switching prunes one and creates the other");
        assert_eq!(shadow.subjects, acting.subjects);
    }
}
