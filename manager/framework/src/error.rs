//! The framework's error type.

use std::time::Duration;

use crate::provider::CloudError;

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

/// Registry errors.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// A provider of that name is already registered.
    #[error("cloud provider {0:?} was registered twice")]
    Duplicate(String),
    /// No provider of that name is registered.
    #[error("unknown cloud provider {name:?}; known providers: {}", known.join(", "))]
    Unknown {
        /// The requested name.
        name: String,
        /// Every registered name, sorted.
        known: Vec<String>,
    },
    /// The name `external`: that is what kubelet and kube-controller-manager are given, not a
    /// cloud-controller-manager.
    #[error(
        "--cloud-provider=external tells kubelet and kube-controller-manager that a cloud-controller-manager runs; give this manager the name of a real provider ({})",
        known.join(", ")
    )]
    External {
        /// Every registered name, sorted.
        known: Vec<String>,
    },
    /// No name was given.
    #[error("--cloud-provider cannot be empty; known providers: {}", known.join(", "))]
    Empty {
        /// Every registered name, sorted.
        known: Vec<String>,
    },
    /// The factory did not finish within the time limit; its cloud-config is treated as invalid.
    #[error(
        "cloud provider {name:?} did not finish reading its cloud-config within the limit of {}s; the cloud-config is refused",
        limit.as_secs()
    )]
    TimedOut {
        /// The provider.
        name: String,
        /// The limit.
        limit: Duration,
    },
    /// The factory failed (for example, the cloud-config is invalid).
    #[error("could not init cloud provider {name:?}: {source}")]
    Init {
        /// The provider.
        name: String,
        /// Why.
        #[source]
        source: CloudError,
    },
}
