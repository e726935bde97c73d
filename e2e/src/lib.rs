//! End-to-end helpers: the emulated kubelet that runs manager Deployments as local processes
//! ([`kubelet`]), the sandbox demo ([`demo`]), a tiny HTTP probe ([`probe`]), a real
//! kubelet-backed cluster for the scenarios that need one ([`realcluster`]), and what the
//! benchmark drivers share ([`bench`]).

pub mod bench;
pub mod demo;
pub mod kubelet;
pub mod probe;
pub mod realcluster;
pub mod realistic;
pub mod upstream;

/// Errors of the e2e helpers.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Kubernetes API call failed.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// The local API server failed.
    #[error("local API server: {0}")]
    ApiServer(#[from] memory_apiserver::Error),
    /// The operator failed to start.
    #[error("operator: {0}")]
    Operator(#[from] operator::Error),
    /// A file or process operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The `cloud-controller-manager` binary is missing and could not be built.
    #[error("{0}")]
    ManagerBinary(String),
    /// Something did not happen in time.
    #[error("timed out waiting for {0}")]
    Timeout(String),
    /// A building block was misused or a value did not serialize.
    #[error("{0}")]
    Other(String),
}

impl Error {
    /// An I/O error with what was being done.
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io { what: what.into(), source }
    }
}
