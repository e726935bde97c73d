//! What the build step produces (pure): the child objects a resource should have, their kinds
//! in apply order, the operator-wide settings they are built from, and the pieces shared by the
//! manager's and the announcer's pods. Below [`crate::build`] and [`crate::announcer`], which
//! both fill it, and [`crate::apply`], which writes it.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{
    DaemonSet, DaemonSetSpec, DaemonSetUpdateStrategy, Deployment, RollingUpdateDaemonSet,
};
use k8s_openapi::api::core::v1::{
    EnvVar, KeyToPath, PodTemplateSpec, SecretVolumeSource, ServiceAccount, Volume, VolumeMount,
};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Resource;

use crate::hash;
use crate::names;

/// Operator-wide inputs of the build step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildSettings {
    /// Default manager image (`--manager-image`); `spec.deployment.image` overrides it.
    pub manager_image: String,
    /// The ClusterRole the Helm chart installs for managers, bound cluster-wide per CR.
    pub manager_cluster_role: String,
    /// The ClusterRole bound in the CR's namespace (Lease and CR status), per CR.
    pub manager_namespace_role: String,
    /// The read-only ClusterRole the chart installs for managers in shadow mode (`spec.shadow`),
    /// bound cluster-wide instead of [`Self::manager_cluster_role`].
    pub manager_shadow_cluster_role: String,
    /// The ClusterRole the chart installs for upstream CCM images (`spec.upstream`), bound
    /// cluster-wide instead of [`Self::manager_cluster_role`] (docs/profiles/README.md).
    pub manager_upstream_cluster_role: String,
    /// The ClusterRole the chart installs for announcers (Services, EndpointSlices, events),
    /// bound cluster-wide per CR with `spec.announcer`.
    pub announcer_cluster_role: String,
    /// The ClusterRole bound in the CR's namespace for announcers (their Leases).
    pub announcer_namespace_role: String,
    /// The ClusterRole the chart installs for upstream profiles' node managers (Nodes and their
    /// status), bound cluster-wide per CR that runs one (`spec.upstream.nodeManager`).
    pub node_manager_cluster_role: String,
    /// What resource authors may ask for (images, `extraArgs`, replicas, priority classes):
    /// checked at validation, before anything is built.
    pub policy: crate::validate::Policy,
    /// Set when the operator itself runs with `DISABLE_HTTP2`: the managers it deploys get it
    /// too, since what breaks HTTP/2 to the API server (a proxy, a middlebox) is the cluster's.
    pub manager_disable_http2: bool,
}

impl Default for BuildSettings {
    fn default() -> Self {
        Self {
            manager_image: "ghcr.io/ccm-rs/cloud-controller-manager:latest".to_string(),
            manager_cluster_role: "ccm-manager".to_string(),
            manager_namespace_role: "ccm-manager-namespace".to_string(),
            manager_shadow_cluster_role: "ccm-manager-shadow".to_string(),
            manager_upstream_cluster_role: "ccm-manager-upstream".to_string(),
            announcer_cluster_role: "ccm-announcer".to_string(),
            announcer_namespace_role: "ccm-announcer-namespace".to_string(),
            node_manager_cluster_role: "ccm-node-manager".to_string(),
            policy: crate::validate::Policy::default(),
            manager_disable_http2: false,
        }
    }
}

/// A child object the operator wants to exist.
#[derive(Debug, Clone, PartialEq)]
pub enum Desired {
    /// The manager's ServiceAccount.
    ServiceAccount(ServiceAccount),
    /// Binds the manager ClusterRole to the ServiceAccount (cluster-scoped, removed by finalizer).
    ClusterRoleBinding(ClusterRoleBinding),
    /// Binds a role to the ServiceAccount in the CR's namespace: the chart's namespace role
    /// (Lease create), or the CR's own [`Desired::Role`].
    RoleBinding(RoleBinding),
    /// The manager's rights on its own Lease and CloudControllerManager, by name.
    Role(Role),
    /// Deployment mode's workload.
    Deployment(Deployment),
    /// DaemonSet mode's workload.
    DaemonSet(DaemonSet),
    /// Deployment mode with more than one replica.
    PodDisruptionBudget(PodDisruptionBudget),
}

/// The kinds of child objects, in apply order (RBAC before the workload that needs it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// `v1/ServiceAccount`.
    ServiceAccount,
    /// `rbac.authorization.k8s.io/v1/ClusterRoleBinding`.
    ClusterRoleBinding,
    /// `rbac.authorization.k8s.io/v1/RoleBinding`.
    RoleBinding,
    /// `rbac.authorization.k8s.io/v1/Role`.
    Role,
    /// `apps/v1/Deployment`.
    Deployment,
    /// `apps/v1/DaemonSet`.
    DaemonSet,
    /// `policy/v1/PodDisruptionBudget`.
    PodDisruptionBudget,
}

impl Kind {
    /// Every kind, in apply order.
    pub const ALL: [Kind; 7] = [
        Kind::ServiceAccount,
        Kind::ClusterRoleBinding,
        Kind::RoleBinding,
        Kind::Role,
        Kind::Deployment,
        Kind::DaemonSet,
        Kind::PodDisruptionBudget,
    ];

    /// The Kubernetes kind.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::ServiceAccount => "ServiceAccount",
            Kind::ClusterRoleBinding => "ClusterRoleBinding",
            Kind::RoleBinding => "RoleBinding",
            Kind::Role => "Role",
            Kind::Deployment => "Deployment",
            Kind::DaemonSet => "DaemonSet",
            Kind::PodDisruptionBudget => "PodDisruptionBudget",
        }
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Desired {
    /// The object's kind.
    pub fn kind(&self) -> Kind {
        match self {
            Desired::ServiceAccount(_) => Kind::ServiceAccount,
            Desired::ClusterRoleBinding(_) => Kind::ClusterRoleBinding,
            Desired::RoleBinding(_) => Kind::RoleBinding,
            Desired::Role(_) => Kind::Role,
            Desired::Deployment(_) => Kind::Deployment,
            Desired::DaemonSet(_) => Kind::DaemonSet,
            Desired::PodDisruptionBudget(_) => Kind::PodDisruptionBudget,
        }
    }

    /// The object's metadata.
    pub fn meta(&self) -> &ObjectMeta {
        match self {
            Desired::ServiceAccount(o) => o.meta(),
            Desired::ClusterRoleBinding(o) => o.meta(),
            Desired::RoleBinding(o) => o.meta(),
            Desired::Role(o) => o.meta(),
            Desired::Deployment(o) => o.meta(),
            Desired::DaemonSet(o) => o.meta(),
            Desired::PodDisruptionBudget(o) => o.meta(),
        }
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        match self {
            Desired::ServiceAccount(o) => o.meta_mut(),
            Desired::ClusterRoleBinding(o) => o.meta_mut(),
            Desired::RoleBinding(o) => o.meta_mut(),
            Desired::Role(o) => o.meta_mut(),
            Desired::Deployment(o) => o.meta_mut(),
            Desired::DaemonSet(o) => o.meta_mut(),
            Desired::PodDisruptionBudget(o) => o.meta_mut(),
        }
    }

    /// The object's name.
    pub fn name(&self) -> &str {
        self.meta().name.as_deref().unwrap_or_default()
    }

    /// The `ccm.rs/applied-hash` annotation: what the operator last applied.
    pub fn applied_hash(&self) -> Option<&str> {
        self.meta().annotations.as_ref()?.get(names::ANNOTATION_APPLIED_HASH).map(String::as_str)
    }

    /// The object as JSON for server-side apply.
    pub fn to_json(&self) -> serde_json::Value {
        let value = match self {
            Desired::ServiceAccount(o) => serde_json::to_value(o),
            Desired::ClusterRoleBinding(o) => serde_json::to_value(o),
            Desired::RoleBinding(o) => serde_json::to_value(o),
            Desired::Role(o) => serde_json::to_value(o),
            Desired::Deployment(o) => serde_json::to_value(o),
            Desired::DaemonSet(o) => serde_json::to_value(o),
            Desired::PodDisruptionBudget(o) => serde_json::to_value(o),
        };
        value.unwrap_or(serde_json::Value::Null)
    }

    /// Stamp the applied-hash annotation: the hash of everything else in the object.
    pub(crate) fn stamped(mut self) -> Self {
        let digest = hash::of_json(&self.to_json());
        self.meta_mut()
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(names::ANNOTATION_APPLIED_HASH.to_string(), digest);
        self
    }
}

/// The cloud-config Secret as a volume (the cloud-config's key unless `with_config` is false,
/// and the keys mounted beside it; `0440`: readable by the pod's `fsGroup`) and its read-only
/// mount at [`names::CLOUD_CONFIG_DIR`].
/// The metadata of a per-node agent's objects named `object` in the resource's namespace (with
/// the resource's child `labels` and `owner`), and its ServiceAccount as a binding subject.
pub fn agent_identity(
    namespace: &str,
    object: &str,
    labels: &BTreeMap<String, String>,
    owner: &OwnerReference,
) -> (ObjectMeta, Subject) {
    let meta = ObjectMeta {
        name: Some(object.to_string()),
        namespace: Some(namespace.to_string()),
        labels: Some(labels.clone()),
        owner_references: Some(vec![owner.clone()]),
        ..Default::default()
    };
    let subject = Subject {
        kind: "ServiceAccount".into(),
        name: object.to_string(),
        namespace: Some(namespace.to_string()),
        api_group: None,
    };
    (meta, subject)
}

/// A per-node DaemonSet (announcers, node managers) of `template`, selected by `selector`,
/// rolling `max_unavailable` Nodes at once; its template's hash on `meta`, so a new template is
/// a change the apply sees.
pub fn node_daemon_set(
    mut meta: ObjectMeta,
    selector: BTreeMap<String, String>,
    template: PodTemplateSpec,
    max_unavailable: IntOrString,
) -> Desired {
    meta.annotations = Some(BTreeMap::from([(names::ANNOTATION_TEMPLATE_HASH.to_string(), hash::of_json(&template))]));
    Desired::DaemonSet(DaemonSet {
        metadata: meta,
        spec: Some(DaemonSetSpec {
            selector: LabelSelector { match_labels: Some(selector), ..Default::default() },
            template,
            update_strategy: Some(DaemonSetUpdateStrategy {
                type_: Some("RollingUpdate".into()),
                rolling_update: Some(RollingUpdateDaemonSet {
                    max_unavailable: Some(max_unavailable),
                    max_surge: Some(IntOrString::Int(0)),
                }),
            }),
            revision_history_limit: Some(3),
            ..Default::default()
        }),
        status: None,
    })
}

/// The ClusterRoleBinding `binding` of ClusterRole `role` to `subject`, for the resource
/// `cr_namespace/cr_name`. No ownerReference can point at a namespaced owner: the labels select
/// it for pruning, the owner annotation maps its watch events, and the finalizer deletes it.
pub fn owned_cluster_role_binding(
    binding: String,
    labels: &BTreeMap<String, String>,
    (cr_namespace, cr_name): (&str, &str),
    role: &str,
    subject: Subject,
) -> Desired {
    Desired::ClusterRoleBinding(ClusterRoleBinding {
        metadata: ObjectMeta {
            name: Some(binding),
            labels: Some(labels.clone()),
            annotations: Some(BTreeMap::from([(
                names::ANNOTATION_OWNER.to_string(),
                format!("{cr_namespace}/{cr_name}"),
            )])),
            ..Default::default()
        },
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "ClusterRole".into(),
            name: role.into(),
        },
        subjects: Some(vec![subject]),
    })
}

pub fn cloud_config_volume(cc: &crate::validate::CloudConfigRef, with_config: bool) -> (Volume, VolumeMount) {
    let volume = Volume {
        name: names::CLOUD_CONFIG_VOLUME.into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(cc.secret.clone()),
            items: Some(
                with_config
                    .then_some(&cc.key)
                    .into_iter()
                    .chain(&cc.extra_keys)
                    .map(|key| KeyToPath { key: key.clone(), path: key.clone(), mode: None })
                    .collect(),
            ),
            default_mode: Some(0o440),
            optional: None,
        }),
        ..Default::default()
    };
    let mount = VolumeMount {
        name: names::CLOUD_CONFIG_VOLUME.into(),
        mount_path: names::CLOUD_CONFIG_DIR.into(),
        read_only: Some(true),
        ..Default::default()
    };
    (volume, mount)
}

/// `DISABLE_HTTP2=true` for a manager or announcer container when
/// [`BuildSettings::manager_disable_http2`] is set.
pub fn http2_env(settings: &BuildSettings) -> Option<EnvVar> {
    settings.manager_disable_http2.then(|| EnvVar {
        name: ccm_framework::client::DISABLE_HTTP2_ENV.into(),
        value: Some("true".into()),
        value_from: None,
    })
}
