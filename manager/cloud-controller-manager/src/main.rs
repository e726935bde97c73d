//! The `cloud-controller-manager` binary: the framework with the built-in providers
//! (`ccm_builtin`), the same list the operator validates against.

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(code) = ccm_builtin::run_subcommand(&args) {
        return code;
    }
    ccm_framework::run_main(ccm_builtin::registry())
}
