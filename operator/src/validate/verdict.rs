//! The verdict (pure): what validation says of a resource, and, when it is valid, what the
//! build step and an embedded engine need.

use std::sync::Arc;

use ccm_framework::config::ManagerConfig;
use ccm_framework::provider::CloudProvider;
use crds::reasons::config_valid as reason;

/// The usable configuration of a valid CR.
#[derive(Debug, Clone, PartialEq)]
pub struct Validated {
    /// What the manager runs: rendered as the pod's arguments, or run by the embedded engine.
    pub config: ManagerConfig,
    /// The cloud-config key and the hash of its value, when a Secret is referenced.
    pub cloud_config: Option<CloudConfigRef>,
    /// Whether the provider programs routes.
    pub provider_has_routes: bool,
}

/// The referenced cloud-config, by key and content hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloudConfigRef {
    /// Secret name.
    pub secret: String,
    /// Key in the Secret.
    pub key: String,
    /// Keys of the same Secret mounted beside it (`credentialsKey`, `caBundleKey`).
    pub extra_keys: Vec<String>,
    /// Hash of the key and value (see [`crate::hash::cloud_config`]).
    pub hash: String,
    /// Hash of the part whose change needs a restart (the provider's
    /// `restart_fingerprint`; the whole value when it reloads nothing in place): the pods roll,
    /// or the embedded engine restarts, only when this changes.
    pub restart_hash: String,
}

/// One reason the configuration cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// `ConfigValid` reason.
    pub reason: &'static str,
    /// Human-readable, deterministic, free of Secret content.
    pub message: String,
}

/// The verdict.
// One verdict per reconcile: the valid variant's size (its ManagerConfig) costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Validation {
    /// Usable.
    Valid(Validated),
    /// Not usable; the first failure gives the reason, the message lists all.
    Invalid {
        /// Every failure, most fundamental first.
        failures: Vec<Failure>,
        /// `namespace/name` of the older CRs this one conflicts with.
        conflicts_with: Vec<String>,
    },
    /// Cannot tell now (the Secret could not be read); the previous verdict stands.
    Unknown(Failure),
}

impl Validation {
    /// Whether the CR may be deployed.
    pub fn is_valid(&self) -> bool {
        matches!(self, Validation::Valid(_))
    }

    /// The verdict of `failures` that name no other resource.
    pub fn refused(failures: Vec<Failure>) -> Self {
        Validation::Invalid { failures, conflicts_with: Vec::new() }
    }

    /// `(reason, message)` of the `ConfigValid` condition for a non-valid verdict.
    pub fn summary(&self) -> Option<(&'static str, String)> {
        match self {
            Validation::Valid(_) => None,
            Validation::Invalid { failures, .. } => Some((
                failures.first().map(|f| f.reason).unwrap_or(reason::INVALID_SPEC),
                failures.iter().map(|f| f.message.as_str()).collect::<Vec<_>>().join("; "),
            )),
            Validation::Unknown(f) => Some((f.reason, f.message.clone())),
        }
    }
}

/// What one validation produces: the verdict and the provider the factory built on the way,
/// which an embedded engine runs, so the factory runs once per reconcile.
#[derive(Clone)]
pub struct Checked {
    /// The verdict.
    pub validation: Validation,
    /// The provider built from this cloud-config; `None` unless the verdict is valid.
    pub provider: Option<Arc<dyn CloudProvider>>,
}

impl Checked {
    /// A verdict that built no provider.
    pub fn without_provider(validation: Validation) -> Self {
        Self { validation, provider: None }
    }
}

impl std::fmt::Debug for Checked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checked")
            .field("validation", &self.validation)
            .field("provider", &self.provider.as_ref().map(|p| p.name().to_string()))
            .finish()
    }
}
