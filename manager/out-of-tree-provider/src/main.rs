//! The example cloud's cloud-controller-manager: the framework with the `example` provider alone.

fn main() -> std::process::ExitCode {
    let mut registry = ccm_framework::registry::Registry::new();
    if let Err(error) = registry.register(example_cloud::NAME, example_cloud::factory) {
        eprintln!("{error}");
        return std::process::ExitCode::FAILURE;
    }
    ccm_framework::run_main(registry)
}
