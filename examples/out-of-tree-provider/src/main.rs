//! The example cloud's cloud-controller-manager: every built-in provider plus `example`.

fn main() -> std::process::ExitCode {
    let mut registry = manager::registry::Registry::builtin();
    if let Err(error) = registry.register(example_cloud::NAME, example_cloud::factory) {
        eprintln!("{error}");
        return std::process::ExitCode::FAILURE;
    }
    manager::run_main(registry)
}
