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
    // `cloud-controller-manager announce ...`: the baremetal provider's per-node L2 announcer,
    // run by its DaemonSet from the same image.
    #[cfg(feature = "baremetal")]
    {
        use ccm_provider_baremetal::announce::node;
        let args: Vec<String> = std::env::args().skip(1).collect();
        if args.first().map(String::as_str) == Some(node::SUBCOMMAND) {
            return node::main(&args[1..]);
        }
    }
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
