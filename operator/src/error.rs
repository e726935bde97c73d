//! The operator crate's error type.

/// Errors of the operator. Messages never quote a Secret or a cloud-config.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Kubernetes API call failed.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// The manager framework failed (engine start, leader election, HTTP endpoint).
    #[error(transparent)]
    Manager(#[from] ccm_framework::Error),
    /// The object has no name or namespace (cannot happen for objects read from the server).
    #[error("object without {0}")]
    MissingField(&'static str),
    /// The CloudControllerManager CRD did not become Established in time.
    #[error(
        "the CustomResourceDefinition {0} is not established; install it first (`ccm-operator crd | kubectl apply -f -`)"
    )]
    CrdNotEstablished(String),
    /// Waiting on the API server failed.
    #[error("waiting for {what}: {message}")]
    Wait {
        /// What was awaited.
        what: String,
        /// Why it failed.
        message: String,
    },
    /// The configuration is unusable.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// Deleting a resource's children on its deletion failed (retried; the finalizer stays).
    #[error("cleanup: {0}")]
    Cleanup(String),
}

impl Error {
    /// A short stable label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube(kube::Error::Api(s)) if s.is_conflict() => "conflict",
            Error::Kube(kube::Error::Api(s)) if s.is_not_found() => "not_found",
            Error::Kube(kube::Error::Api(_)) => "api",
            Error::Kube(_) => "transport",
            Error::Manager(_) => "manager",
            Error::MissingField(_) => "missing_field",
            Error::CrdNotEstablished(_) => "crd_not_established",
            Error::Wait { .. } => "wait",
            Error::Config(_) => "config",
            Error::Cleanup(_) => "cleanup",
        }
    }
}
