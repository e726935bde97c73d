//! The built-in providers: the one list that the `cloud-controller-manager` binary and the
//! operator (validation and Embedded mode) both register, so a resource valid in the operator
//! runs in the manager image built beside it.

use std::process::ExitCode;

use ccm_framework::registry::{Registry, RegistryError};

/// Adds one built-in provider to a registry.
type Register = fn(&mut Registry) -> Result<(), RegistryError>;

/// The built-in providers this build carries: one cargo feature each, all on by default; the
/// production image leaves out `fake`, the in-memory test cloud.
const BUILTIN: &[Register] = &[
    #[cfg(feature = "fake")]
    ccm_provider_fake::register,
    #[cfg(feature = "baremetal")]
    ccm_provider_baremetal::register,
    #[cfg(feature = "aws")]
    ccm_provider_aws::register,
];

/// A registry holding every built-in provider of this build.
///
/// # Panics
/// Only if two built-in providers shared a name, which this crate's test rules out; it is
/// called at start-up.
pub fn registry() -> Registry {
    let mut registry = Registry::new();
    for register in BUILTIN {
        #[allow(clippy::expect_used)]
        register(&mut registry).expect("built-in provider names are distinct");
    }
    registry
}

/// Runs a subcommand a built-in provider adds to the manager binary (`announce`, the
/// baremetal provider's per-node announcer), if `args` (without the program name) names one.
pub fn run_subcommand(args: &[String]) -> Option<ExitCode> {
    #[cfg(feature = "baremetal")]
    {
        use ccm_provider_baremetal::announce::node;
        if args.first().map(String::as_str) == Some(node::SUBCOMMAND) {
            return Some(node::main(&args[1..]));
        }
    }
    let _ = args;
    None
}

#[cfg(test)]
mod tests {
    #[test]
    #[cfg(all(feature = "fake", feature = "baremetal", feature = "aws"))]
    fn the_default_build_registers_the_three_built_in_providers_once() {
        assert_eq!(super::registry().names(), ["aws", "baremetal", "fake"]);
    }

    /// The capability page (docs/provider-capabilities.md); in a module of that name so that
    /// `cargo test -p ccm-builtin capabilities`, the command the page names, selects it.
    #[cfg(all(feature = "fake", feature = "baremetal", feature = "aws"))]
    mod capabilities {
        use ccm_framework::capabilities::{markdown, splice};
        use ccm_framework::registry::ClusterSettings;

        /// A baremetal cloud-config with one pool, in `mode` (`addresses` or `proxy`).
        fn baremetal_config(mode: &str) -> String {
            format!("loadBalancer:\n  mode: {mode}\n  pools:\n    - {{name: v4, cidrs: [192.0.2.0/24]}}\n")
        }

        #[test]
        fn the_capability_page_is_generated_from_the_providers_reports() {
            let registry = crate::registry();
            let cluster = ClusterSettings { cluster_name: "kubernetes".into(), ..Default::default() };
            let report = |name: &str, config: Option<String>| {
                registry.create(name, config.as_deref().map(str::as_bytes), &cluster).unwrap().capabilities()
            };
            // baremetal in both modes; the served report is that of the running mode.
            let mut proxy = report("baremetal", Some(baremetal_config("proxy")));
            proxy.provider = "baremetal, mode: proxy".into();
            let reports = [
                report("baremetal", Some(baremetal_config("addresses"))),
                proxy,
                report("aws", None),
                report("fake", None),
            ];
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/provider-capabilities.md");
            let doc = std::fs::read_to_string(&path).unwrap();
            let generated = splice(&doc, &markdown(&reports)).expect("the page has the generated part's markers");
            if std::env::var("CCM_UPDATE_DOCS").is_ok_and(|v| v == "1") {
                std::fs::write(&path, generated).unwrap();
            } else {
                assert!(
                    doc == generated,
                    "docs/provider-capabilities.md is not the providers' reports: run `CCM_UPDATE_DOCS=1 cargo test -p ccm-builtin capabilities`"
                );
            }
        }
    }

    #[test]
    fn an_argument_list_without_a_provider_subcommand_runs_none() {
        assert!(super::run_subcommand(&["--cloud-provider=fake".to_string()]).is_none());
        assert!(super::run_subcommand(&[]).is_none());
    }
}
