//! The `cloud-controller-manager` binary: the framework with the built-in providers its cargo
//! features select (all by default; the production image builds without `fake`).

use std::process::ExitCode;

use ccm_framework::registry::{Registry, RegistryError};

/// Adds one built-in provider to the registry.
type Register = fn(&mut Registry) -> Result<(), RegistryError>;

/// The built-in providers: one cargo feature each, all on by default; the production image
/// leaves out `fake`.
const BUILTIN: &[Register] = &[
    #[cfg(feature = "fake")]
    ccm_provider_fake::register,
    #[cfg(feature = "baremetal")]
    ccm_provider_baremetal::register,
    #[cfg(feature = "aws")]
    ccm_provider_aws::register,
];

fn main() -> ExitCode {
    let mut registry = Registry::new();
    for register in BUILTIN {
        // Only a name registered twice fails, which no release can ship.
        if let Err(error) = register(&mut registry) {
            eprintln!("{error}");
            return ExitCode::FAILURE;
        }
    }
    ccm_framework::run_main(registry)
}
