//! Every command block of the user documentation, run as written or checked, each registered
//! here: README.md, docs/quickstart.md, docs/provider-guide.md, docs/troubleshooting.md and
//! docs/real-cluster.md.
//!
//! A block is a fenced block with an info string (`sh`, `toml`, `rust`, `yaml`) right after a
//! `<!-- block: NAME -->` comment. [`BLOCKS`] names every block with a hash of its text and how
//! it is tested; a block without a marker, without an entry, or whose text no longer matches
//! its hash fails [`every_documented_block_is_registered_and_unchanged`], so a block cannot
//! change without its test being looked at.
//!
//! The blocks marked [`Check::Run`] run in bash from the repository root exactly as written:
//! nothing is substituted. The quick start uses `helm` when one is installed and otherwise the
//! `helm_cli.py` command the page itself gives; without kubectl, or without both helm and
//! helm-sdkpy, the runs are skipped with the reason printed (a failure in CI). They use the
//! documented port 8080, so they run one at a time.

use crate::kit::in_ci;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, mpsc};
use std::time::{Duration, Instant};
use testkit::workspace_root;

/// How a block is tested.
#[derive(Debug, Clone, Copy)]
enum Check {
    /// Run as written by the named test of this file.
    Run(&'static str),
    /// Needs a real cluster (or is the test suite itself): every repository path it names must
    /// exist, and the reason says what covers it instead.
    Paths(&'static str),
    /// The same text as a file of the repository (a manifest shown inline).
    SameAs(&'static str),
}

/// Every documented block: file, name, FNV-1a hash of its text, how it is tested.
const BLOCKS: &[(&str, &str, &str, Check)] = &[
    ("README.md", "readme-sandbox", "d0073f964e5ea0d1", Check::Run("readme_sandbox_and_reading_state_run_as_written")),
    ("README.md", "readme-test", "83dd88fcd62db702", Check::Paths("the test suite itself (this test runs inside it)")),
    (
        "README.md",
        "readme-sandbox-curl",
        "6d4cdde56280b836",
        Check::Run("readme_sandbox_and_reading_state_run_as_written"),
    ),
    (
        "README.md",
        "readme-genuine-tests",
        "41177e090147d27b",
        Check::Paths("CI runs exactly this (.ci/run); the suite itself runs inside it"),
    ),
    (
        "README.md",
        "readme-sandbox-deployment",
        "c5af975bacb68e1e",
        Check::Run("readme_deployment_mode_runs_as_written"),
    ),
    (
        "README.md",
        "readme-install-chart",
        "803415680865295f",
        Check::Paths("needs a cluster with pushed images; the quick start installs the same chart into the sandbox"),
    ),
    (
        "README.md",
        "readme-install-resource",
        "de769297835ff468",
        Check::Paths("needs a cluster; the quick start applies a resource the same way"),
    ),
    (
        "README.md",
        "readme-minimal-yaml",
        "52aec938735b6e8b",
        Check::SameAs("charts/ccm-operator/examples/minimal.yaml"),
    ),
    (
        "README.md",
        "readme-reading-state",
        "20756e0fbe9f41f0",
        Check::Run("readme_sandbox_and_reading_state_run_as_written"),
    ),
    (
        "README.md",
        "readme-crdgen",
        "9cccf286c64a1f09",
        Check::Paths("rewrites a tracked file; the CRD test compares the same output"),
    ),
    ("README.md", "readme-images", "83a963895770f683", Check::Paths("needs a container builder and a registry")),
    (
        "docs/quickstart.md",
        "quickstart-helm-sdkpy",
        "eb83768faa3d2b72",
        Check::Paths("installs a Python package; CI's .ci/run does the same"),
    ),
    (
        "docs/quickstart.md",
        "quickstart",
        "01b58bc7ac8271d9",
        Check::Run("quick_start_reaches_ready_and_stops_quietly_as_documented"),
    ),
    (
        "docs/provider-guide.md",
        "provider-dependency",
        "cb6fdccf4064adc5",
        Check::Paths(
            "a vendor's Cargo.toml; manager/out-of-tree-provider depends on the framework by path the same way",
        ),
    ),
    (
        "docs/provider-guide.md",
        "provider-implementation",
        "9f7921999008ce1b",
        Check::Paths(
            "a sketch with the vendor's own client; manager/out-of-tree-provider is the compiled, tested version",
        ),
    ),
    (
        "docs/provider-guide.md",
        "provider-main",
        "9bfadda4dbbd153a",
        Check::Paths("manager/out-of-tree-provider/src/main.rs is the compiled version"),
    ),
    (
        "docs/provider-guide.md",
        "provider-node-deletion",
        "eca4bfa2a908453c",
        Check::Paths("needs a cluster; the flag and field exist (manager flags test, CRD reference)"),
    ),
    (
        "README.md",
        "readme-realcluster-tests",
        "241c8ec008b9d281",
        Check::Paths("CI runs exactly this (.ci/run); the suite itself runs inside it"),
    ),
    (
        "docs/real-cluster.md",
        "real-cluster-images",
        "73c15dd93f9a315c",
        Check::Paths("needs kind; tests/realcluster.rs builds the images with mkimage.py and imports them with ctr"),
    ),
    (
        "docs/real-cluster.md",
        "real-cluster-install",
        "0478e03bc0fd16c3",
        Check::Paths("tests/realcluster.rs installs the chart with these values on its real cluster (helm_cli.py)"),
    ),
    (
        "docs/real-cluster.md",
        "real-cluster-cloud-config",
        "40c5cea2f51d6a7e",
        Check::Paths("names a kind Node's address; tests/realcluster.rs applies the same shape for its Node"),
    ),
    (
        "docs/real-cluster.md",
        "real-cluster-resource",
        "8159b0ad0e89e329",
        Check::Paths("tests/realcluster.rs applies the Secret and a resource like the minimal example"),
    ),
    (
        "docs/real-cluster.md",
        "real-cluster-look",
        "09d8e6558e2975b2",
        Check::Paths("tests/realcluster.rs checks each of these facts on its real cluster"),
    ),
    (
        "docs/real-cluster.md",
        "real-cluster-vip-cloud-config",
        "2a19d651da2bbe94",
        Check::Paths("tests/realcluster.rs adds the same pool and announcement to its cloud-config (vip_by_l2)"),
    ),
    (
        "docs/real-cluster.md",
        "real-cluster-vip",
        "3acabbe9d79b2c58",
        Check::Paths("tests/realcluster.rs sets spec.announcer and annotates its Service the same way (vip_by_l2)"),
    ),
    (
        "docs/troubleshooting.md",
        "troubleshooting-first-look",
        "9cf34479dc0bf3d8",
        Check::Run("readme_sandbox_and_reading_state_run_as_written"),
    ),
];

/// The documents whose blocks are registered.
const DOCUMENTS: [&str; 5] =
    ["README.md", "docs/quickstart.md", "docs/provider-guide.md", "docs/troubleshooting.md", "docs/real-cluster.md"];
/// Fence info strings that make a block a documented block.
const LANGUAGES: [&str; 5] = ["sh", "bash", "toml", "rust", "yaml"];
const MARKER: &str = "<!-- block: ";

/// The documented port: runs that use it take turns.
static PORT_8080: Mutex<()> = Mutex::new(());

/// A documented block: its name (from the marker, if any), fence language and text.
#[derive(Debug, Clone)]
struct Block {
    name: Option<String>,
    line: usize,
    text: String,
}

/// The fenced blocks with one of [`LANGUAGES`], each with the marker on the line before, if
/// any (indented blocks in lists included).
fn blocks(markdown: &str) -> Vec<Block> {
    let lines: Vec<&str> = markdown.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let trimmed = lines[i].trim_start();
        let indent = lines[i].len() - trimmed.len();
        if let Some(info) = trimmed.strip_prefix("```") {
            let mut j = i + 1;
            while j < lines.len() && !lines[j].trim_start().starts_with("```") {
                j += 1;
            }
            if LANGUAGES.contains(&info.trim()) {
                let name = i
                    .checked_sub(1)
                    .and_then(|p| lines[p].trim().strip_prefix(MARKER))
                    .and_then(|rest| rest.strip_suffix("-->"))
                    .map(|n| n.trim().to_string());
                let text: Vec<&str> = lines[i + 1..j.min(lines.len())]
                    .iter()
                    .map(|l| l.get(indent..).unwrap_or(l.trim_start()))
                    .collect();
                out.push(Block { name, line: i + 1, text: text.join("\n") });
            }
            i = j + 1;
            continue;
        }
        i += 1;
    }
    out
}

/// FNV-1a, 64 bits, as hex: stable across Rust versions, unlike `DefaultHasher`.
fn fnv(text: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

fn document(file: &str) -> String {
    std::fs::read_to_string(workspace_root().join(file)).unwrap_or_else(|e| panic!("{file}: {e}"))
}

/// The text of the registered block `name` of `file`.
fn block(file: &str, name: &str) -> String {
    blocks(&document(file))
        .into_iter()
        .find(|b| b.name.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("{file} has no block {name}"))
        .text
}

/// Repository paths a block names (words with a `/` and a dot-extension or a known directory
/// that exist relative to the root are checked; URLs and absolute paths are not).
fn named_paths(text: &str) -> Vec<String> {
    text.split(|c: char| c.is_whitespace() || c == '=' || c == '"' || c == '\'' || c == '(' || c == ')')
        .filter(|w| {
            w.contains('/')
                && !w.contains("://")
                && !w.starts_with('/')
                && !w.starts_with('$')
                && !w.starts_with("--")
                && (w.starts_with("charts/")
                    || w.starts_with("manager/")
                    || w.starts_with("docs/")
                    || w.starts_with("operator/")
                    || w.starts_with("e2e/"))
        })
        .map(|w| w.trim_end_matches([',', ';', '`']).to_string())
        .collect()
}

#[test]
fn every_documented_block_is_registered_and_unchanged() {
    let mut problems = Vec::new();
    let mut seen = Vec::new();
    let source = document("e2e/tests/e2e/walkthrough.rs");
    for file in DOCUMENTS {
        for b in blocks(&document(file)) {
            let Some(name) = &b.name else {
                problems.push(format!("{file}:{}: a block without a `{MARKER}NAME -->` marker", b.line));
                continue;
            };
            seen.push((file, name.clone()));
            let Some((_, _, hash, check)) = BLOCKS.iter().find(|(f, n, _, _)| *f == file && n == name) else {
                problems.push(format!(
                    "{file}:{}: block {name} is not registered in e2e/tests/e2e/walkthrough.rs BLOCKS (hash {})",
                    b.line,
                    fnv(&b.text)
                ));
                continue;
            };
            if *hash != fnv(&b.text) {
                problems.push(format!(
                    "{file}:{}: block {name} changed: check its test ({check:?}), then set its hash to {}",
                    b.line,
                    fnv(&b.text)
                ));
            }
            match check {
                Check::Run(test) if !source.contains(&format!("fn {test}()")) => {
                    problems.push(format!("{file}:{}: block {name} names a test {test} that does not exist", b.line));
                }
                Check::Paths(reason) if reason.trim().is_empty() => {
                    problems.push(format!("{file}:{}: block {name} is not run and says no reason", b.line));
                }
                _ => {}
            }
            match check {
                Check::Paths(_) | Check::Run(_) => {
                    for p in named_paths(&b.text) {
                        if !workspace_root().join(&p).exists() {
                            problems.push(format!("{file}:{}: block {name} names {p}, which does not exist", b.line));
                        }
                    }
                }
                Check::SameAs(path) => {
                    let body: String =
                        document(path).lines().filter(|l| !l.starts_with('#')).collect::<Vec<_>>().join("\n");
                    if body.trim() != b.text.trim() {
                        problems.push(format!("{file}:{}: block {name} differs from {path}", b.line));
                    }
                }
            }
        }
    }
    for (file, name, _, _) in BLOCKS {
        if !seen.iter().any(|(f, n)| f == file && n == name) {
            problems.push(format!("{file}: registered block {name} is not in the document any more"));
        }
    }
    assert!(problems.is_empty(), "documented blocks:\n  {}", problems.join("\n  "));
}

#[test]
fn block_scanner_finds_marked_indented_and_unmarked_blocks() {
    let md =
        "text\n<!-- block: one -->\n```sh\necho 1\n```\n\n1. item\n\n   ```toml\n   a = 1\n   ```\n```\noutput\n```\n";
    let found = blocks(md);
    assert_eq!(found.len(), 2, "{found:?}");
    assert_eq!((found[0].name.as_deref(), found[0].text.as_str()), (Some("one"), "echo 1"));
    assert_eq!((found[1].name.as_deref(), found[1].text.as_str()), (None, "a = 1"));
    assert_ne!(fnv("a"), fnv("b"));
    assert!(set_by_cargo_for_tests("CARGO_PKG_NAME") && set_by_cargo_for_tests("CARGO_MANIFEST_DIR"));
    assert!(!set_by_cargo_for_tests("CARGO_HOME") && !set_by_cargo_for_tests("CARGO_TARGET_DIR"));
    assert_eq!(
        named_paths("kubectl apply -f charts/x.yaml --from-file=k=manager/y.yaml"),
        ["charts/x.yaml", "manager/y.yaml"]
    );
}

/// GET / on `addr` (`ip:port`); the body.
fn http_get(addr: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).expect("the external IP accepts");
    stream.set_read_timeout(Some(Duration::from_secs(5))).expect("a timeout");
    stream.write_all(b"GET / HTTP/1.1\r\nHost: sandbox\r\nConnection: close\r\n\r\n").expect("the request is sent");
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    response.split_once("\r\n\r\n").map(|(_, body)| body.to_string()).unwrap_or(response)
}

/// Why the runs cannot happen here, if they cannot.
fn missing_tool(needs_helm: bool) -> Option<String> {
    if Command::new("kubectl").args(["version", "--client"]).output().is_err() {
        return Some("kubectl is not installed".into());
    }
    if !needs_helm || Command::new("helm").arg("version").output().is_ok_and(|o| o.status.success()) {
        return None;
    }
    match Command::new("python3").args(["-c", "import helm_sdkpy, yaml; helm_sdkpy.get_version()"]).output() {
        Ok(o) if o.status.success() => None,
        Ok(o) => Some(format!(
            "neither helm nor helm-sdkpy with PyYAML is installed: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => Some(format!("no helm, and python3 could not run: {e}")),
    }
}

/// Skip (outside CI) when a tool is missing.
fn skip(needs_helm: bool) -> bool {
    if let Some(reason) = missing_tool(needs_helm) {
        assert!(!in_ci(), "{reason}, and CI=true makes that a failure");
        eprintln!("SKIPPED: {reason}");
        return true;
    }
    false
}

/// `bash` running `script` from the repository root in its own process group, with strict
/// error handling. A script with background jobs also gets job control (as an interactive
/// shell has) and a cleanup of those jobs if it fails half-way; one without keeps its
/// foreground command in the group, so a Ctrl-C to the group reaches it as a terminal's would.
fn bash(script: &str) -> Command {
    let background = script.lines().any(|l| l.split('#').next().unwrap_or("").trim_end().ends_with('&'));
    let prelude = if background {
        "set -euo pipefail\nset -m\n\
         cleanup() { for p in $(jobs -p); do kill -TERM -- \"-$p\" 2>/dev/null || true; done; }\n\
         trap cleanup EXIT\n"
    } else {
        "set -euo pipefail\n"
    };
    let mut cmd = Command::new("bash");
    cmd.arg("-c")
        .arg(format!("{prelude}{script}\n"))
        .current_dir(workspace_root())
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("CARGO_TERM_COLOR", "never")
        .process_group(0);
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(set_by_cargo_for_tests) {
            cmd.env_remove(name);
        }
    }
    cmd
}

/// Variables `cargo test` sets for this test process that a reader's shell does not have.
/// The blocks run `cargo`, and build scripts that watch such variables (ring's watches
/// `CARGO_PKG_NAME` and `CARGO_MANIFEST_DIR`) would see them change, so the reader's next
/// `cargo run` rebuilt ring, rustls and kube-client and everything above them.
fn set_by_cargo_for_tests(name: &str) -> bool {
    name == "CARGO"
        || name == "OUT_DIR"
        || name == "CARGO_PRIMARY_PACKAGE"
        || name == "CARGO_TARGET_TMPDIR"
        || name == "CARGO_RUSTC_CURRENT_DIR"
        || ["CARGO_PKG_", "CARGO_MANIFEST_", "CARGO_BIN_", "CARGO_CRATE_"].iter().any(|p| name.starts_with(p))
}

/// A block running in the background, its stdout lines on a channel, its stderr in a file.
struct Running {
    child: Child,
    lines: mpsc::Receiver<String>,
    stderr: PathBuf,
}

impl Running {
    fn start(script: &str, name: &str) -> Running {
        let stderr = std::env::temp_dir().join(format!("walkthrough-{name}-{}.stderr", std::process::id()));
        let mut child = bash(script)
            .stdout(Stdio::piped())
            .stderr(Stdio::from(std::fs::File::create(&stderr).expect("a log file")))
            .spawn()
            .expect("bash runs");
        let stdout = child.stdout.take().unwrap();
        let rx = crate::kit::line_channel(stdout);
        Running { child, lines: rx, stderr }
    }

    /// Lines until one matches, or the timeout.
    fn until(&self, timeout: Duration, done: impl Fn(&str) -> bool) -> (Vec<String>, bool) {
        crate::kit::read_until(&self.lines, None, timeout, done)
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Ctrl-C to the whole group, then the exit status within `grace`.
    fn interrupt(&mut self, grace: Duration) -> Option<std::process::ExitStatus> {
        let group = format!("-{}", self.child.id());
        let _ = Command::new("kill").args(["-s", "INT", "--", &group]).status();
        let deadline = Instant::now() + grace;
        loop {
            if let Some(s) = self.child.try_wait().expect("the block can be waited for") {
                return Some(s);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let group = format!("-{}", self.child.id());
        let _ = Command::new("kill").args(["-s", "KILL", "--", &group]).status();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.stderr);
    }
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Log lines at WARN or ERROR (tracing's format, plain or coloured).
fn warnings(stderr: &str) -> Vec<&str> {
    stderr.lines().filter(|l| l.contains(" WARN") || l.contains("ERROR")).collect()
}

#[test]
fn quick_start_reaches_ready_and_stops_quietly_as_documented() {
    if skip(true) {
        return;
    }
    let _port = PORT_8080.lock().unwrap_or_else(|e| e.into_inner());
    let script = block("docs/quickstart.md", "quickstart");
    let started = Instant::now();
    let mut run = Running::start(&script, "quickstart");
    // The build inside the block may take minutes on a cold target directory.
    let (out, _) = run.until(Duration::from_secs(20 * 60), |_| false);
    let status = run.interrupt(Duration::from_secs(1));
    let err = run.stderr();
    let log = format!("--- stdout\n{}\n--- stderr (last 80 lines)\n{}", out.join("\n"), tail(&err, 80));
    let status = status.unwrap_or_else(|| panic!("the quick start did not finish within 20 minutes\n{log}"));
    assert!(status.success(), "the quick start failed ({status})\n{log}");
    let out = out.join("\n");
    assert!(out.contains("baremetal-embedded"), "kubectl get ccm did not list the resource\n{log}");
    assert!(out.contains("Ready=True AsExpected"), "the resource is not Ready\n{log}");
    // `kill %1 %2` stops both without an error or a warning, and the kubeconfig is gone.
    assert!(warnings(&err).is_empty(), "warnings or errors:\n  {}\n{log}", warnings(&err).join("\n  "));
    // One INFO line per component after the signal: the embedded engine's and the operator's.
    let stop =
        err.split_once("received SIGTERM").map(|(_, after)| after).unwrap_or_else(|| panic!("no signal logged\n{log}"));
    let infos: Vec<&str> = stop.lines().filter(|l| l.contains(" INFO")).collect();
    assert_eq!(infos.len(), 2, "after the signal:\n  {}\n{log}", infos.join("\n  "));
    assert!(infos.iter().any(|l| l.contains("engine stopped") && l.contains("baremetal-embedded")), "{log}");
    assert!(infos.iter().any(|l| l.contains("ccm-operator stopped")), "{log}");
    assert!(!workspace_root().join(".sandbox/kubeconfig").exists(), "the sandbox removed its kubeconfig");
    eprintln!("quick start finished in {:?}", started.elapsed());
}

#[test]
fn readme_sandbox_and_reading_state_run_as_written() {
    if skip(false) {
        return;
    }
    let _port = PORT_8080.lock().unwrap_or_else(|e| e.into_inner());
    let mut run = Running::start(&block("README.md", "readme-sandbox"), "readme-sandbox");
    let (out, live) = run.until(Duration::from_secs(20 * 60), |l| l.contains("] live log:"));
    assert!(live, "the sandbox never reached its live log:\n{}\n{}", out.join("\n"), tail(&run.stderr(), 40));
    // The sandbox prints the `export KUBECONFIG=...` line the reader then types.
    let export = out.iter().find_map(|l| l.trim().strip_prefix("export KUBECONFIG=")).expect("the export line");
    for (file, name) in
        [("README.md", "readme-reading-state"), ("docs/troubleshooting.md", "troubleshooting-first-look")]
    {
        let reading = bash(&block(file, name)).env("KUBECONFIG", export).output().expect("bash runs");
        let text = String::from_utf8_lossy(&reading.stdout);
        assert!(
            reading.status.success(),
            "{file} block {name} failed:\n{text}\n{}",
            String::from_utf8_lossy(&reading.stderr)
        );
        assert!(text.contains("Ready=True"), "{file} block {name} shows no Ready=True:\n{text}");
    }
    // The printed curl line is the README's, and it gets an emulated Node's answer.
    let curl = block("README.md", "readme-sandbox-curl");
    assert!(out.iter().any(|l| l.trim() == curl.trim()), "the sandbox does not print `{curl}`:\n{}", out.join("\n"));
    let body = if Command::new("curl").arg("--version").output().is_ok() {
        let o = bash(&curl).output().expect("bash runs");
        assert!(o.status.success(), "`{curl}` failed: {}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).to_string()
    } else {
        eprintln!("no curl on this machine: the block's GET made by the test instead");
        http_get(curl.trim().trim_start_matches("curl http://").trim_end_matches('/'))
    };
    assert!(
        body.starts_with("node=bm-node-") && body.trim_end().ends_with("service=default/web"),
        "`{curl}` printed {body:?}"
    );
    let status = run.interrupt(Duration::from_secs(30));
    assert!(status.is_some_and(|s| s.success()), "the sandbox did not stop on Ctrl-C: {status:?}");
}

#[test]
fn readme_deployment_mode_runs_as_written() {
    if skip(false) {
        return;
    }
    let _port = PORT_8080.lock().unwrap_or_else(|e| e.into_inner());
    let mut run = Running::start(&block("README.md", "readme-sandbox-deployment"), "readme-deployment");
    let (out, live) = run.until(Duration::from_secs(20 * 60), |l| l.contains("] live log:"));
    assert!(live, "Deployment mode never reached its live log:\n{}\n{}", out.join("\n"), tail(&run.stderr(), 40));
    let out = out.join("\n");
    assert!(out.contains("deployment.apps/ccm-baremetal") && out.contains("PROCESS (POD)"), "{out}");
    let status = run.interrupt(Duration::from_secs(30));
    assert!(status.is_some_and(|s| s.success()), "the sandbox did not stop on Ctrl-C: {status:?}");
}
