//! What a deployer of this provider needs (the ccm-operator renders the announcer and checks
//! where the provider may run): the announcer's subcommand, environment and BIRD paths, and
//! what a cloud-config asks of the process that runs the provider. A deployer needs nothing
//! else of this crate.

use crate::{announce, config, proxy};

/// The name the provider is registered under.
pub use crate::name::NAME;

/// The manager binary's subcommand that runs the per-node announcer
/// (`cloud-controller-manager announce ...`).
pub const ANNOUNCER_SUBCOMMAND: &str = announce::SUBCOMMAND;

/// The environment variable the announcer reads its Node's IPv4 address from (the default BGP
/// router ID); a DaemonSet sets it from the downward API's `status.hostIP`.
pub const NODE_IP_ENV: &str = announce::bgp::NODE_IP_ENV;

/// Where the announcer writes BIRD's config by default: a BIRD sidecar runs with `-c` on it.
pub const BIRD_CONFIG_PATH: &str = announce::bgp::bird::DEFAULT_CONFIG_PATH;

/// BIRD's control socket the announcer talks to by default: a BIRD sidecar runs with `-s` on it.
pub const BIRD_SOCKET_PATH: &str = announce::bgp::bird::DEFAULT_SOCKET_PATH;

/// What a cloud-config asks of the process that runs the provider.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Needs {
    /// `loadBalancer.mode: proxy`: with the service controller, the leader opens listeners for
    /// the Services' addresses in its own network namespace, so they are reachable only when
    /// that is the Node's (the host network).
    pub proxy_data_path: bool,
}

/// What `cloud_config` asks of the process that runs the provider. An invalid cloud-config is
/// an error (the factory refuses it too, naming the culprit).
pub fn needs(cloud_config: &[u8]) -> Result<Needs, config::ConfigError> {
    let config = config::parse(cloud_config)?;
    Ok(Needs { proxy_data_path: config.load_balancer.mode == proxy::Mode::Proxy })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cloud_config_in_proxy_mode_needs_the_proxy_data_path_and_one_in_addresses_mode_does_not() {
        let addresses = b"instances: [{name: n1}]\nloadBalancer:\n  pools: [{name: lan, cidrs: [10.0.0.0/30]}]\n";
        let proxy =
            b"instances: [{name: n1}]\nloadBalancer:\n  mode: proxy\n  pools: [{name: lan, cidrs: [10.0.0.0/30]}]\n";
        assert_eq!(needs(addresses).unwrap(), Needs { proxy_data_path: false });
        assert_eq!(needs(proxy).unwrap(), Needs { proxy_data_path: true });
        assert!(needs(b"instances: [").is_err());
    }
}
