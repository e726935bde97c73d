//! The `CloudControllerManager` custom resource (`ccm.rs/v1alpha1`): its Rust types, the
//! `--controllers` list semantics, plain-Rust spec validation, status-condition helpers, and
//! CRD generation.

pub mod announcement;
pub mod conditions;
pub mod controllers;
pub mod defaults;
pub mod pool;
pub mod reasons;
pub mod v1alpha1;
pub mod validation;

pub use announcement::{ServiceAnnouncement, ServiceAnnouncementSpec};
pub use pool::{LoadBalancerIPPool, LoadBalancerIPPoolSpec, LoadBalancerIPPoolStatus};
pub use v1alpha1::{CloudControllerManager, CloudControllerManagerSpec, CloudControllerManagerStatus, Mode};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

/// The label a Secret must carry, with value [`CLOUD_CONFIG_LABEL_VALUE`], for a resource's
/// `spec.cloudConfig.secretRef` to use it: the operator watches and reads no other Secret, so a
/// resource cannot point it at a Secret not meant for a cloud-controller-manager.
pub const CLOUD_CONFIG_LABEL: &str = "ccm.rs/cloud-config";
/// The value of [`CLOUD_CONFIG_LABEL`].
pub const CLOUD_CONFIG_LABEL_VALUE: &str = "true";

/// Where the committed CRD lives, relative to the workspace root.
pub const CRD_PATH: &str = "charts/ccm-operator/crds/cloudcontrollermanagers.ccm.rs.yaml";

/// The command that regenerates the committed CRD.
pub const REGENERATE_COMMAND: &str =
    "cargo run -p crds --bin crdgen > charts/ccm-operator/crds/cloudcontrollermanagers.ccm.rs.yaml";

/// Where the committed `LoadBalancerIPPool` CRD lives, relative to the workspace root.
pub const POOL_CRD_PATH: &str = "charts/ccm-operator/crds/loadbalancerippools.ccm.rs.yaml";

/// The command that regenerates the committed `LoadBalancerIPPool` CRD.
pub const REGENERATE_POOL_COMMAND: &str =
    "cargo run -p crds --bin crdgen -- pool > charts/ccm-operator/crds/loadbalancerippools.ccm.rs.yaml";

/// Where the committed `ServiceAnnouncement` CRD lives, relative to the workspace root.
pub const ANNOUNCEMENT_CRD_PATH: &str = "charts/ccm-operator/crds/serviceannouncements.ccm.rs.yaml";

/// The command that regenerates the committed `ServiceAnnouncement` CRD.
pub const REGENERATE_ANNOUNCEMENT_COMMAND: &str =
    "cargo run -p crds --bin crdgen -- announcement > charts/ccm-operator/crds/serviceannouncements.ccm.rs.yaml";

/// Errors of this crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The CRD could not be rendered as YAML.
    #[error("rendering the CRD as YAML: {0}")]
    Yaml(#[from] serde_yaml::Error),
}

/// The CustomResourceDefinition of every resource in this crate.
pub fn crd() -> CustomResourceDefinition {
    CloudControllerManager::crd()
}

/// The CRD as the YAML document that is committed to the chart.
pub fn crd_yaml() -> Result<String, Error> {
    let body = serde_yaml::to_string(&crd())?;
    Ok(format!("# Generated from the Rust types in crds/ by `cargo run -p crds --bin crdgen`. Do not edit.\n{body}"))
}

/// The `LoadBalancerIPPool` CRD (the `baremetal` provider's address pools).
pub fn pool_crd() -> CustomResourceDefinition {
    LoadBalancerIPPool::crd()
}

/// The `LoadBalancerIPPool` CRD as the YAML document that is committed to the chart.
pub fn pool_crd_yaml() -> Result<String, Error> {
    let body = serde_yaml::to_string(&pool_crd())?;
    Ok(format!(
        "# Generated from the Rust types in crds/ by `cargo run -p crds --bin crdgen -- pool`. Do not edit.\n{body}"
    ))
}

/// The `ServiceAnnouncement` CRD (which node answers for a Service's addresses).
pub fn announcement_crd() -> CustomResourceDefinition {
    ServiceAnnouncement::crd()
}

/// The `ServiceAnnouncement` CRD as the YAML document that is committed to the chart.
pub fn announcement_crd_yaml() -> Result<String, Error> {
    let body = serde_yaml::to_string(&announcement_crd())?;
    Ok(format!(
        "# Generated from the Rust types in crds/ by `cargo run -p crds --bin crdgen -- announcement`. Do not edit.\n{body}"
    ))
}
