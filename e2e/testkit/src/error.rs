//! The kit's error type.

/// Errors from starting or using a test's API server.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The in-memory API server failed.
    #[error("in-memory API server: {0}")]
    Server(#[from] memory_apiserver::Error),
    /// A file or socket operation failed.
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    /// Building a `kube::Client` or an API call failed.
    #[error("kube client error: {0}")]
    Kube(#[from] kube::Error),
    /// The genuine control plane (kube-apiserver and etcd) could not be started or used.
    #[error("genuine control plane: {0}")]
    Genuine(String),
}
