//! The `cloud-controller-manager` binary, with the built-in providers.

fn main() -> std::process::ExitCode {
    manager::run_main(manager::registry::Registry::builtin())
}
