//! The quick start in `docs/quickstart.md`, run as written: the sandbox, `helm install` of the
//! chart, the operator binary against it, the example CloudControllerManager, and `kubectl wait`
//! until it is Ready.
//!
//! The block after the `walkthrough` marker runs in bash from the repository root with only
//! these changes, each checked so the document cannot drift from the test silently: free ports
//! instead of 8080 and 8081, a temporary kubeconfig path instead of `.sandbox/`, and `helm`
//! provided by `charts/ccm-operator/tests/helm_cli.py` (the same Helm, through helm-sdkpy) since
//! CI has no Helm CLI. The two binaries are built first, so the documented `kubectl wait
//! --timeout=120s` measures the operator, not the compiler. Skipped, with the reason printed, when
//! kubectl or helm-sdkpy is missing outside CI.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const MARKER: &str = "<!-- walkthrough:";
/// The whole walk-through, builds included, must finish within this.
const DEADLINE: Duration = Duration::from_secs(20 * 60);

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn in_ci() -> bool {
    std::env::var("CI").as_deref() == Ok("true")
}

/// The fenced `sh` block right after the marker comment.
fn walkthrough_block(markdown: &str) -> String {
    let start = markdown.find(MARKER).expect("docs/quickstart.md has the walkthrough marker");
    let after = &markdown[start..];
    let open = after.find("```sh\n").expect("a ```sh block follows the marker") + "```sh\n".len();
    let close = after[open..].find("\n```").expect("the block is closed");
    after[open..open + close].to_string()
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

/// Replace `from` by `to`, insisting that `from` is there.
fn substitute(script: String, from: &str, to: &str) -> String {
    assert!(script.contains(from), "docs/quickstart.md no longer contains {from:?}; update e2e/tests/walkthrough.rs");
    script.replace(from, to)
}

/// Why the walk-through cannot run here, if it cannot.
fn missing_tool() -> Option<String> {
    if Command::new("kubectl").args(["version", "--client"]).output().is_err() {
        return Some("kubectl is not installed".into());
    }
    match Command::new("python3").args(["-c", "import helm_sdkpy, yaml; helm_sdkpy.get_version()"]).output() {
        Ok(o) if o.status.success() => None,
        Ok(o) => Some(format!("helm-sdkpy or PyYAML is missing: {}", String::from_utf8_lossy(&o.stderr).trim())),
        Err(e) => Some(format!("python3 could not run: {e}")),
    }
}

#[test]
fn quick_start_reaches_ready_as_documented() {
    if let Some(reason) = missing_tool() {
        assert!(!in_ci(), "{reason}, and CI=true makes that a failure");
        eprintln!("SKIPPED walk-through: {reason}");
        return;
    }
    let doc = std::fs::read_to_string(root().join("docs/quickstart.md")).expect("docs/quickstart.md exists");
    let dir = std::env::temp_dir().join(format!("walkthrough-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let kubeconfig = dir.join("kubeconfig");

    let mut script = walkthrough_block(&doc);
    script = substitute(script, "$PWD/.sandbox/kubeconfig", &kubeconfig.display().to_string());
    script = substitute(script, ".sandbox/kubeconfig", &kubeconfig.display().to_string());
    script = substitute(script, "--bin sandbox -- ", &format!("--bin sandbox -- --port {} ", free_port()));
    script = substitute(script, "127.0.0.1:8081", &format!("127.0.0.1:{}", free_port()));
    assert!(script.contains("helm install"), "the walk-through installs the chart with helm");
    // Exactly as the block's `cargo run`s select packages, so they find everything built.
    for (package, bin) in [("e2e", "sandbox"), ("operator", "ccm-operator")] {
        let built = Command::new(env!("CARGO"))
            .args(["build", "-p", package, "--bin", bin])
            .current_dir(root())
            .env("CARGO_TERM_COLOR", "never")
            .status()
            .expect("cargo runs");
        assert!(built.success(), "building {bin} failed");
    }

    // Background jobs get their own process groups (set -m), so cleanup reaches `cargo run`'s
    // child too.
    let prelude = r#"set -euo pipefail
set -m
cleanup() { for p in $(jobs -p); do kill -TERM -- "-$p" 2>/dev/null || true; done; }
trap cleanup EXIT
cargo() { "$WALKTHROUGH_CARGO" "$@"; }
helm() { python3 charts/ccm-operator/tests/helm_cli.py "$@"; }
"#;
    let mut child = Command::new("bash")
        .arg("-c")
        .arg(format!("{prelude}{script}\n"))
        .current_dir(root())
        .env("WALKTHROUGH_CARGO", env!("CARGO"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("CARGO_TERM_COLOR", "never")
        // Files, not pipes: the servers log continuously and a full pipe would stall them.
        .stdout(Stdio::from(std::fs::File::create(dir.join("stdout")).expect("a log file")))
        .stderr(Stdio::from(std::fs::File::create(dir.join("stderr")).expect("a log file")))
        .spawn()
        .expect("bash runs");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("the walk-through can be waited for") {
            break Some(status);
        }
        if started.elapsed() > DEADLINE {
            let _ = child.kill();
            break None;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    let out = std::fs::read_to_string(dir.join("stdout")).unwrap_or_default();
    let err = std::fs::read_to_string(dir.join("stderr")).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    let log = format!("--- stdout\n{out}\n--- stderr (last 80 lines)\n{}", tail(&err, 80));
    let Some(status) = status else { panic!("the walk-through did not finish within {DEADLINE:?}\n{log}") };
    assert!(status.success(), "the walk-through failed ({status})\n{log}");
    assert!(out.contains("baremetal-embedded"), "kubectl get ccm did not list the resource\n{log}");
    assert!(out.contains("Ready=True AsExpected"), "the resource is not Ready\n{log}");
    eprintln!("walk-through finished in {:?}", started.elapsed());
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[test]
fn the_walkthrough_block_is_found_and_complete() {
    let doc = std::fs::read_to_string(root().join("docs/quickstart.md")).expect("docs/quickstart.md exists");
    let block = walkthrough_block(&doc);
    for step in
        ["--bin sandbox", "helm install", "--bin ccm-operator", "examples/embedded.yaml", "kubectl -n kube-system wait"]
    {
        assert!(block.contains(step), "the walk-through lost its step {step:?}");
    }
}
