//! The providers the operator knows: the same built-in set the `cloud-controller-manager`
//! binary assembles, so a resource valid here runs there (and in Embedded mode, here).

use ccm_framework::registry::{Registry, RegistryError};

/// A registry with every built-in provider compiled in: `aws`, `baremetal`, and `fake` with the
/// `fake` feature (the default; the production image leaves it out).
pub fn builtin_registry() -> Registry {
    let mut registry = Registry::new();
    let mut builtin: Vec<fn(&mut Registry) -> Result<(), RegistryError>> = Vec::new();
    #[cfg(feature = "fake")]
    builtin.push(ccm_provider_fake::register);
    builtin.extend([
        ccm_provider_baremetal::register as fn(&mut Registry) -> Result<(), RegistryError>,
        ccm_provider_aws::register,
    ]);
    for register in builtin {
        // Only a name registered twice fails; the registry is fresh, so this never happens.
        if let Err(error) = register(&mut registry) {
            tracing::warn!(%error, "built-in provider not registered");
        }
    }
    registry
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(feature = "fake")]
    fn the_operator_knows_every_provider_the_binary_ships() {
        // cloud-controller-manager/tests/ccm/framework.rs pins the binary to the same list.
        assert_eq!(builtin_registry().names(), ["aws", "baremetal", "fake"]);
    }
}
