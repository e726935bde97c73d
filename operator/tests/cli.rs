//! The `ccm-operator` program as a user (or the chart) starts it. Being an integration test,
//! it also makes `cargo test --workspace` build the binary, which the real-cluster scenarios
//! put into the operator image.

use std::process::Command;

#[test]
fn help_names_the_flags_the_chart_passes() {
    let out = Command::new(env!("CARGO_BIN_EXE_ccm-operator")).arg("--help").output().expect("running ccm-operator");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let help = String::from_utf8_lossy(&out.stdout);
    // The flags charts/ccm-operator/templates/deployment.yaml passes.
    for flag in ["--manager-image", "--cloud-config-namespaces", "--embedded-enabled", "--embedded-host-network"] {
        assert!(help.contains(flag), "--help does not name {flag}:\n{help}");
    }
}

#[test]
fn an_unknown_flag_is_refused_naming_it() {
    let out =
        Command::new(env!("CARGO_BIN_EXE_ccm-operator")).arg("--no-such-flag").output().expect("running ccm-operator");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--no-such-flag"));
}
