//! A vendor's crate built on the framework compiles no built-in provider and no AWS SDK: the
//! example's normal dependency tree, as `cargo tree` resolves it from the lock graph, holds
//! neither.

use std::collections::BTreeSet;

/// Package names in the normal (non-dev, non-build) dependency tree of `package`.
fn normal_dependencies(package: &str) -> BTreeSet<String> {
    let out = std::process::Command::new(env!("CARGO"))
        .args(["tree", "-p", package, "-e", "normal", "--prefix", "none", "--format", "{p}"])
        .current_dir(testkit::workspace_root())
        .output()
        .expect("cargo tree runs");
    assert!(out.status.success(), "cargo tree failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().next().map(str::to_string))
        .collect()
}

/// The names that a framework-only crate must not pull in.
fn forbidden(names: &BTreeSet<String>) -> Vec<&String> {
    names.iter().filter(|n| n.starts_with("ccm-provider-") || n.starts_with("aws-")).collect()
}

#[test]
fn the_out_of_tree_example_depends_on_no_built_in_provider_and_no_aws_sdk() {
    let names = normal_dependencies("out-of-tree-provider");
    assert!(names.contains("ccm-framework"), "the example builds on the framework: {names:?}");
    let found = forbidden(&names);
    assert!(found.is_empty(), "the out-of-tree example depends on {found:?}");
}

#[test]
fn the_check_sees_the_providers_where_they_are() {
    // The same reading of the binary crate finds them, so an empty result above is meaningful.
    let names = normal_dependencies("cloud-controller-manager");
    for expected in ["ccm-provider-fake", "ccm-provider-baremetal", "ccm-provider-aws", "aws-sdk-ec2"] {
        assert!(names.contains(expected), "{expected} missing from {names:?}");
    }
}
