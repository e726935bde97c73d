//! The `cloud-controller-manager` binary: the framework with every built-in provider.

use std::process::ExitCode;

use ccm_framework::registry::{Registry, RegistryError};

fn main() -> ExitCode {
    let mut registry = Registry::new();
    let builtin: [fn(&mut Registry) -> Result<(), RegistryError>; 3] =
        [ccm_provider_fake::register, ccm_provider_baremetal::register, ccm_provider_aws::register];
    for register in builtin {
        // Only a name registered twice fails, which no release can ship.
        if let Err(error) = register(&mut registry) {
            eprintln!("{error}");
            return ExitCode::FAILURE;
        }
    }
    ccm_framework::run_main(registry)
}
