//! The Helm chart, checked with real Helm (the PyPI package `helm-sdkpy`, which bundles Helm as a
//! library): lint with default values and every `ci/` overlay, schema rejections, rendering, and
//! install, upgrade and uninstall into an API server (the local one, and the genuine one when
//! `CCM_TEST_ASSETS` is set).
//!
//! The checks themselves are the Python suite in `charts/ccm-operator/tests/`; this test starts
//! the API server and runs it. Without python3, helm-sdkpy or PyYAML the test is skipped with the
//! reason printed, except when `CI=true`, where that is a failure (`.ci/run` installs them).

use crate::kit::in_ci;
use std::path::PathBuf;
use std::process::Command;

use testkit::TestCluster;

/// `run.py`'s exit code for "a tool is missing, skipped".
const SKIPPED: i32 = 77;

fn chart_tests() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../charts/ccm-operator/tests/run.py")
}

testkit::backend_tests! {
    async fn chart_lints_renders_and_installs_with_real_helm(backend) {
        if Command::new("python3").arg("--version").output().is_err() {
            assert!(!in_ci(), "python3 is missing, and CI=true makes that a failure");
            eprintln!("SKIPPED chart tests: python3 is not installed");
            return;
        }
        let server = TestCluster::start(backend).await.expect("the API server starts");
        let kubeconfig = server.kubeconfig_path();
        // Blocking: the server keeps serving on the runtime's other threads meanwhile.
        let output = tokio::task::spawn_blocking(move || {
            Command::new("python3")
                .arg(chart_tests())
                .arg("--kubeconfig")
                .arg(&kubeconfig)
                // Helm stores releases as protobuf Secrets, which the local JSON-only server cannot
                // take; the same driver on both backends keeps the runs alike.
                .env("HELM_DRIVER", "memory")
                .env("PYTHONDONTWRITEBYTECODE", "1")
                .output()
        })
        .await
        .expect("the chart test process is joined")
        .expect("python3 runs");
        drop(server);

        let log = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        match output.status.code() {
            Some(0) => eprintln!("{log}"),
            Some(SKIPPED) if !in_ci() => eprintln!("{log}SKIPPED chart tests (reason above)"),
            code => panic!("chart tests failed (exit {code:?}):\n{log}"),
        }
    }
}
