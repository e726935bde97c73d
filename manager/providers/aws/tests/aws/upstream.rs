//! Upstream cloud-provider-aws v1.36.1's own binary (`../shared/upstream-aws`, see its
//! README): unpacked into `target/upstream-aws/` on first use and checked against
//! `SHA256SUMS`, then run as a process against a genuine kube-apiserver and moto.
//!
//! Without the shared copy the runs against it are skipped, with one line on stderr saying how
//! to enable them.

use std::path::{Path, PathBuf};
use std::sync::{Once, OnceLock};
use std::time::Duration;

use tokio::process::{Child, Command};

/// Names the directory holding `aws-cloud-controller-manager.xz` and `SHA256SUMS`; default
/// `../shared/upstream-aws` beside the repository.
pub(crate) const DIR_ENV: &str = "CCM_UPSTREAM_AWS";
const PACKED: &str = "aws-cloud-controller-manager.xz";
const BINARY: &str = "aws-cloud-controller-manager";

fn shared_dir() -> PathBuf {
    match std::env::var_os(DIR_ENV).filter(|v| !v.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => testkit::workspace_root().join("../shared/upstream-aws"),
    }
}

static SKIP: Once = Once::new();
static UNPACKED: OnceLock<Option<PathBuf>> = OnceLock::new();

fn sha256_hex(bytes: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, bytes).as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// The checksum `SHA256SUMS` gives `file`.
fn expected_sum(dir: &Path, file: &str) -> String {
    let sums = std::fs::read_to_string(dir.join("SHA256SUMS")).expect("SHA256SUMS beside the binary");
    sums.lines()
        .find_map(|l| {
            let (sum, name) = l.split_once(char::is_whitespace)?;
            (name.trim().trim_start_matches('*') == file).then(|| sum.to_string())
        })
        .unwrap_or_else(|| panic!("SHA256SUMS names no {file}"))
}

fn unpack(dir: &Path) -> PathBuf {
    let packed = dir.join(PACKED);
    let bytes = std::fs::read(&packed).expect("read the packed binary");
    assert_eq!(sha256_hex(&bytes), expected_sum(dir, PACKED), "{} does not match SHA256SUMS", packed.display());
    let out_dir = testkit::workspace_root().join("target/upstream-aws");
    std::fs::create_dir_all(&out_dir).expect("target/upstream-aws");
    let out = out_dir.join(BINARY);
    let want = expected_sum(dir, BINARY);
    if std::fs::read(&out).is_ok_and(|b| sha256_hex(&b) == want) {
        return out;
    }
    // Python's lzma (the CI machine has Python, not necessarily xz); into a private file first,
    // so a concurrent run never sees half a binary.
    let partial = out_dir.join(format!("{BINARY}.{}", std::process::id()));
    let status = std::process::Command::new("python3")
        .args(["-c", "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))"])
        .arg(&packed)
        .arg(&partial)
        .status()
        .expect("python3 unpacks the binary");
    assert!(status.success(), "unpacking {}: {status}", packed.display());
    let unpacked = std::fs::read(&partial).expect("the unpacked binary");
    assert_eq!(sha256_hex(&unpacked), want, "the unpacked binary does not match SHA256SUMS");
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&partial, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    std::fs::rename(&partial, &out).expect("rename into place");
    out
}

/// The binary, unpacked and checked; `None` (after one line on stderr per process) when the
/// shared copy is not there.
pub(crate) fn binary() -> Option<PathBuf> {
    UNPACKED
        .get_or_init(|| {
            let dir = shared_dir();
            if !dir.join(PACKED).is_file() {
                SKIP.call_once(|| {
                    use std::io::Write as _;
                    let _ = writeln!(
                        std::io::stderr(),
                        "runs against upstream cloud-provider-aws skipped: no {} (put upstream's binary there, or set {DIR_ENV}; docs/aws.md#testing)",
                        dir.join(PACKED).display()
                    );
                });
                return None;
            }
            Some(unpack(&dir))
        })
        .clone()
}

/// [`binary`] off the async runtime (unpacking takes a few seconds the first time).
pub(crate) async fn binary_async() -> Option<PathBuf> {
    tokio::task::spawn_blocking(binary).await.expect("unpacking does not panic")
}

/// One running upstream manager; killed when dropped.
pub(crate) struct Upstream {
    child: Child,
    /// Its stderr (klog).
    pub(crate) log: PathBuf,
}

impl Upstream {
    /// Starts the binary with upstream's recipe flags (`README`: every controller, no routes, no
    /// serving) plus `flags`, logging to `log`.
    pub(crate) fn start(binary: &Path, kubeconfig: &Path, cloud_conf: &Path, log: &Path, flags: &[&str]) -> Upstream {
        let out = std::fs::File::create(log).expect("upstream's log");
        let mut cmd = Command::new(binary);
        cmd.arg("--cloud-provider=aws")
            .arg(format!("--cloud-config={}", cloud_conf.display()))
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .args(["--use-service-account-credentials=false", "--configure-cloud-routes=false", "--secure-port=0"])
            .args(["--controllers=*", "--v=2"])
            .args(flags)
            .env("AWS_ACCESS_KEY_ID", "testing")
            .env("AWS_SECRET_ACCESS_KEY", "testing")
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .stdin(std::process::Stdio::null())
            .stdout(out.try_clone().expect("log"))
            .stderr(out)
            .kill_on_drop(true);
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec. The binary
        // dies with the test's thread that started it, even when the test process is killed.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().expect("start upstream's binary");
        Upstream { child, log: log.to_path_buf() }
    }

    fn signal(&self, signal: i32) {
        if let Some(pid) = self.child.id() {
            // SAFETY: signalling a child this test started.
            unsafe {
                libc::kill(pid as libc::pid_t, signal);
            }
        }
    }

    /// SIGTERM, then waits for it to exit.
    pub(crate) async fn terminate(mut self) {
        self.signal(libc::SIGTERM);
        if tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await.is_err() {
            self.signal(libc::SIGKILL);
            let _ = self.child.wait().await;
        }
    }

    /// SIGKILL, then waits for it to be gone.
    pub(crate) async fn kill(mut self) {
        self.signal(libc::SIGKILL);
        let _ = self.child.wait().await;
    }

    /// The last `lines` lines of its log.
    pub(crate) fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}
