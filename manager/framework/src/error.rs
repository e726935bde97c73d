//! The framework's error type.

use crate::provider::CloudError;
use crate::registry::RegistryError;

/// Errors of the manager framework. Variants are matchable; messages never quote a Secret or
/// cloud-config.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Kubernetes API call failed.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// A cloud call failed.
    #[error(transparent)]
    Cloud(#[from] CloudError),
    /// The provider could not be found or built.
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// A flag value is unusable.
    #[error("invalid value for {flag}: {message}")]
    InvalidFlag {
        /// The flag, with its dashes.
        flag: &'static str,
        /// What is wrong.
        message: String,
    },
    /// Reading the kubeconfig or in-cluster config failed.
    #[error("kubernetes client configuration: {0}")]
    ClientConfig(String),
    /// Reading a file (cloud-config, TLS material) failed.
    #[error("reading {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// This replica lost the leader-election Lease and is configured to exit, like upstream.
    #[error("leader election lost")]
    LeadershipLost,
    /// Controllers did not stop within the grace period after leadership ended; running on
    /// could duplicate their work under the next leader.
    #[error("controllers did not stop within {grace:?}: {}", names.join(", "))]
    ControllersDidNotStop {
        /// The controllers still running.
        names: Vec<String>,
        /// How long the engine waited.
        grace: std::time::Duration,
    },
    /// The health and metrics endpoint could not be served.
    #[error("serving on {address}: {message}")]
    Serve {
        /// The address.
        address: String,
        /// Why.
        message: String,
    },
}
