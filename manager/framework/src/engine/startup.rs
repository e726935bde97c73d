//! The start-up checks that need the provider, shared by the binary and the operator's
//! Embedded mode, and the route decision the engine also uses to skip the route
//! controller.

use crate::error::Error;
use crate::options::ControllerOptions;
use crate::provider::CloudProvider;

/// Whether the route controller would run with this provider and these options.
pub fn routes_would_run(options: &ControllerOptions, provider: &dyn CloudProvider) -> bool {
    crds::controllers::route_controller_runs(
        &options.controllers,
        options.configure_cloud_routes,
        provider.routes().is_some(),
    )
}

/// The start-up checks that need the provider, for the binary and Embedded mode alike. A
/// provider that reports no cluster ID is refused unless `allow_untagged_cloud`
/// (`--allow-untagged-cloud`; Embedded mode has no such setting). An empty or unparsable
/// `--cluster-cidr` does not stop the manager (upstream R2 does, deliberately changed): when the
/// route controller would run it keeps the error and reports it on
/// `/healthz/node-route-controller`; otherwise the value is ignored with a warning.
pub fn start_up_checks(
    options: &mut ControllerOptions,
    provider: &dyn CloudProvider,
    allow_untagged_cloud: bool,
) -> Result<(), Error> {
    if !provider.has_cluster_id() {
        if allow_untagged_cloud {
            tracing::warn!("detected a cluster without a ClusterID; a ClusterID will be required in the future");
        } else {
            return Err(Error::InvalidFlag {
                flag: "--allow-untagged-cloud",
                message: "no ClusterID found; a ClusterID is required for the cloud provider to function properly"
                    .into(),
            });
        }
    }
    check_with_provider(options, provider)
}

/// The `--cluster-cidr` part of [`start_up_checks`].
pub fn check_with_provider(options: &mut ControllerOptions, provider: &dyn CloudProvider) -> Result<(), Error> {
    let routes = routes_would_run(options, provider);
    if routes {
        if let Some(message) = &options.cluster_cidr_error {
            tracing::error!(%message, "--cluster-cidr is unusable; the route controller stays disabled");
        } else if options.cluster_cidrs.is_empty() {
            tracing::error!(
                "--cluster-cidr is empty but the provider manages routes; the route controller stays disabled"
            );
        }
    } else if let Some(message) = options.cluster_cidr_error.take() {
        tracing::warn!(%message, "ignoring --cluster-cidr: the route controller does not run");
    }
    Ok(())
}
