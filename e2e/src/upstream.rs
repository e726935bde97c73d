//! The upstream Go cloud-controller-manager with its `bench` provider, beside ours on a genuine
//! test cluster: the binary found (`CCM_UPSTREAM`, else `../shared/upstream/` next to the
//! repository), unpacked once with Python's `lzma` and checked against `SHA256SUMS`, and run
//! as a child process that is always killed on drop. Nothing requires it: a scenario asks
//! [`skip_reason`] first and prints [`skip_line`] when it is absent.
//!
//! The same [`Process`] runs our `cloud-controller-manager` binary, so a scenario stops either
//! one the same way (SIGTERM, or SIGKILL as a crash).

use std::net::{SocketAddr, TcpListener};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::Error;

/// The environment variable naming the upstream binary: its `.xz` or an unpacked executable.
pub const ENV: &str = "CCM_UPSTREAM";
/// The packed binary's file name in `../shared/upstream/`.
pub const PACKED: &str = "upstream-ccm-bench.xz";
/// The unpacked binary's file name (as in `SHA256SUMS`).
pub const UNPACKED: &str = "upstream-ccm-bench";
/// The checksum file beside the packed binary.
pub const SUMS: &str = "SHA256SUMS";
/// Upstream's provider name.
pub const PROVIDER: &str = "bench";

/// `../shared/upstream` seen from the repository's root.
pub fn shared_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/upstream")
}

/// The packed or unpacked binary to use: `CCM_UPSTREAM`, else the shared folder's `.xz`.
pub fn source() -> Result<PathBuf, String> {
    match std::env::var_os(ENV).filter(|v| !v.is_empty()) {
        Some(p) => {
            let p = PathBuf::from(p);
            if p.is_file() { Ok(p) } else { Err(format!("{ENV} names {}, which is not a file", p.display())) }
        }
        None => {
            let p = shared_dir().join(PACKED);
            if p.is_file() { Ok(p) } else { Err(format!("{} is absent", p.display())) }
        }
    }
}

/// The unpacked, checked upstream binary (unpacked once per process; a copy already checked by
/// an earlier run is reused).
pub fn binary() -> Result<PathBuf, String> {
    static BINARY: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BINARY.get_or_init(|| prepare(&source()?, UNPACKED)).clone()
}

/// Upstream cloud-provider-aws's packed binary in `../shared/upstream-aws/`.
pub const AWS_PACKED: &str = "aws-cloud-controller-manager.xz";
/// Its unpacked name (as in that folder's `SHA256SUMS`).
pub const AWS_UNPACKED: &str = "aws-cloud-controller-manager";

/// Upstream cloud-provider-aws v1.36.1 (`../shared/upstream-aws`, see its README), unpacked and
/// checked as [`binary`] is.
pub fn aws_binary() -> Result<PathBuf, String> {
    static BINARY: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BINARY
        .get_or_init(|| {
            let packed = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/upstream-aws").join(AWS_PACKED);
            if !packed.is_file() {
                return Err(format!("{} is absent", packed.display()));
            }
            prepare(&packed, AWS_UNPACKED)
        })
        .clone()
}

/// Why an upstream scenario cannot run here (`None` when it can): the binary or the genuine
/// control plane's assets are missing.
pub fn skip_reason() -> Option<String> {
    if testkit::genuine::assets_dir().is_none() {
        return Some(format!("{} is unset or lacks kube-apiserver and etcd", testkit::genuine::ASSETS_ENV));
    }
    binary().err()
}

/// The one line an upstream scenario prints when it skips.
pub fn skip_line(reason: &str) -> String {
    format!("SKIPPED: needs ../shared/upstream (or {ENV}) and CCM_TEST_ASSETS: {reason}")
}

fn prepare(source: &Path, unpacked: &str) -> Result<PathBuf, String> {
    let sums = source.parent().map(|d| d.join(SUMS)).filter(|p| p.is_file());
    let expected = match &sums {
        Some(path) => Some(expected_sum(path, unpacked)?),
        None => None,
    };
    if source.extension().and_then(|e| e.to_str()) != Some("xz") {
        // An unpacked binary: checked when a SHA256SUMS sits beside it.
        if let Some(want) = &expected {
            check_sum(source, want)?;
        }
        return Ok(source.to_path_buf());
    }
    let want = expected.ok_or_else(|| format!("no {SUMS} beside {}", source.display()))?;
    let dir = std::env::temp_dir().join(format!("ccm-upstream-{}", &want[..16]));
    let target = dir.join(unpacked);
    if target.is_file() && check_sum(&target, &want).is_ok() {
        return Ok(target);
    }
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    // Unpack beside the target and rename, so a concurrent run never sees half a file.
    let partial = dir.join(format!("{unpacked}.{}.partial", std::process::id()));
    let script = "import lzma, shutil, sys, os\n\
                  shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))\n\
                  os.chmod(sys.argv[2], 0o755)\n";
    let out = Command::new("python3")
        .args(["-c", script])
        .arg(source)
        .arg(&partial)
        .output()
        .map_err(|e| format!("python3 could not run to unpack {}: {e}", source.display()))?;
    if !out.status.success() {
        let _ = std::fs::remove_file(&partial);
        return Err(format!("unpacking {} failed: {}", source.display(), String::from_utf8_lossy(&out.stderr).trim()));
    }
    if let Err(e) = check_sum(&partial, &want) {
        let _ = std::fs::remove_file(&partial);
        return Err(e);
    }
    std::fs::rename(&partial, &target).map_err(|e| format!("moving the unpacked binary: {e}"))?;
    Ok(target)
}

/// The checksum `SHA256SUMS` gives the unpacked binary.
fn expected_sum(path: &Path, unpacked: &str) -> Result<String, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    parse_sums_for(&text, unpacked).ok_or_else(|| format!("{} has no line for {unpacked}", path.display()))
}

/// The hex digest of [`UNPACKED`] in a `sha256sum` listing (pure).
pub fn parse_sums(text: &str) -> Option<String> {
    parse_sums_for(text, UNPACKED)
}

/// The hex digest of `file` in a `sha256sum` listing (pure).
pub fn parse_sums_for(text: &str, file: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let (sum, name) = line.split_once(char::is_whitespace)?;
        let name = name.trim().trim_start_matches('*');
        (name == file && sum.len() == 64 && sum.bytes().all(|b| b.is_ascii_hexdigit()))
            .then(|| sum.to_ascii_lowercase())
    })
}

fn check_sum(path: &Path, want: &str) -> Result<(), String> {
    let out = Command::new("python3")
        .args(["-c", "import hashlib, sys; print(hashlib.file_digest(open(sys.argv[1], 'rb'), 'sha256').hexdigest())"])
        .arg(path)
        .output()
        .map_err(|e| format!("python3 could not run to check {}: {e}", path.display()))?;
    let got = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if out.status.success() && got == want {
        Ok(())
    } else {
        Err(format!("{} does not match {SUMS} (sha256 {got})", path.display()))
    }
}

/// A free loopback port (bound, then released for the child to take).
pub fn free_port() -> Result<u16, Error> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| Error::io("finding a free port", e))?;
    Ok(listener.local_addr().map_err(|e| Error::io("finding a free port", e))?.port())
}

/// A manager process (upstream's or ours): output in a log file, killed on drop, and dying
/// with the thread that started it if the test binary is killed.
pub struct Process {
    name: String,
    child: Child,
    log: PathBuf,
    exit: Option<ExitStatus>,
}

impl std::fmt::Debug for Process {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Process").field("name", &self.name).field("pid", &self.child.id()).finish()
    }
}

impl Process {
    /// Start `program` with `args` and extra `env`, its output to `log`.
    pub fn spawn(
        name: &str,
        program: &Path,
        args: &[String],
        env: &[(String, String)],
        log: &Path,
    ) -> Result<Self, Error> {
        let out = std::fs::File::create(log).map_err(|e| Error::io(format!("creating {}", log.display()), e))?;
        let err = out.try_clone().map_err(|e| Error::io("duplicating the log file", e))?;
        let mut cmd = Command::new(program);
        cmd.args(args).envs(env.iter().map(|(k, v)| (k, v))).stdin(Stdio::null()).stdout(out).stderr(err);
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(|e| Error::io(format!("starting {}", program.display()), e))?;
        Ok(Self { name: name.to_string(), child, log: log.to_path_buf(), exit: None })
    }

    /// The label given at start.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The log file.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The last `n` lines of the log.
    pub fn log_tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// The exit status, once it has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        if self.exit.is_none() {
            self.exit = self.child.try_wait().ok().flatten();
        }
        self.exit
    }

    fn signal(&mut self, signal: libc::c_int) {
        if self.exited().is_none() {
            // SAFETY: kill(2) on our own child's pid, which we have not reaped yet.
            unsafe {
                libc::kill(self.child.id() as libc::pid_t, signal);
            }
        }
    }

    /// Send SIGTERM (a graceful stop) and wait up to `timeout` for the exit.
    pub async fn terminate(&mut self, timeout: Duration) -> Result<ExitStatus, Error> {
        self.signal(libc::SIGTERM);
        self.wait_exit(timeout).await
    }

    /// Send SIGKILL (a crash: nothing released) and reap it.
    pub async fn kill(&mut self) -> Result<ExitStatus, Error> {
        self.signal(libc::SIGKILL);
        self.wait_exit(Duration::from_secs(10)).await
    }

    /// Wait up to `timeout` for the process to exit.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Result<ExitStatus, Error> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.exited() {
                return Ok(status);
            }
            if Instant::now() >= deadline {
                return Err(Error::Timeout(format!("{} (pid {}) to exit", self.name, self.child.id())));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if self.exited().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// How upstream is started: the checked binary, `--cloud-provider=bench --kubeconfig=...
/// --secure-port=0` before the caller's arguments, and `BENCH_HTTP_ADDR` on a free loopback port
/// before the caller's environment.
#[derive(Debug, Clone)]
pub struct Launch {
    /// The unpacked, checked binary.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
    /// Its extra environment.
    pub env: Vec<(String, String)>,
    /// Where it serves `/healthz` and `/metrics` over plain HTTP.
    pub http: SocketAddr,
}

impl Launch {
    /// The launch against `kubeconfig` with `args` and `env` added.
    pub fn new(kubeconfig: &Path, args: &[String], env: &[(String, String)]) -> Result<Self, Error> {
        let program = binary().map_err(Error::Other)?;
        let http = SocketAddr::from(([127, 0, 0, 1], free_port()?));
        let mut all = vec![
            format!("--cloud-provider={PROVIDER}"),
            format!("--kubeconfig={}", kubeconfig.display()),
            "--secure-port=0".to_string(),
        ];
        all.extend_from_slice(args);
        let mut vars = vec![("BENCH_HTTP_ADDR".to_string(), http.to_string())];
        vars.extend_from_slice(env);
        Ok(Self { program, args: all, env: vars, http })
    }
}

/// The upstream binary running against a cluster, its plain-HTTP `/healthz` and `/metrics` on
/// a loopback port (`BENCH_HTTP_ADDR`).
#[derive(Debug)]
pub struct Upstream {
    /// The process.
    pub process: Process,
    /// Where `/healthz` and `/metrics` are served.
    pub http: SocketAddr,
}

impl Upstream {
    /// Start upstream with `--cloud-provider=bench --kubeconfig=<kubeconfig> --secure-port=0`,
    /// then `args`; `env` adds to its environment (e.g. `BENCH_INTERNAL_IP=1`).
    pub fn start(kubeconfig: &Path, args: &[String], env: &[(String, String)], log: &Path) -> Result<Self, Error> {
        let l = Launch::new(kubeconfig, args, env)?;
        let process = Process::spawn("upstream", &l.program, &l.args, &l.env, log)?;
        Ok(Self { process, http: l.http })
    }

    /// Wait until `/healthz` answers 200 (the provider is initialized).
    pub async fn wait_healthy(&mut self, timeout: Duration) -> Result<(), Error> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.process.exited() {
                return Err(Error::Other(format!("upstream exited with {status}: {}", self.process.log_tail(20))));
            }
            if http_get(self.http, "/healthz").await.is_some_and(|r| r.status == 200) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(Error::Timeout("upstream's /healthz".into()));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Its `/metrics` now (empty when unreachable).
    pub async fn metrics(&self) -> String {
        http_get(self.http, "/metrics").await.map(|r| r.body).unwrap_or_default()
    }
}

/// `GET path` over plain HTTP; `None` when the connection fails or the answer is not HTTP.
pub async fn http_get(addr: SocketAddr, path: &str) -> Option<crate::probe::Response> {
    let r = ccm_framework::serving::probe::get_plain(addr, path, None, Duration::from_secs(5)).await?;
    Some(crate::probe::Response { status: r.status, body: r.body })
}

/// The sum of a counter's samples whose labels include `label="value"` (pure; Prometheus text).
pub fn counter_sum(exposition: &str, name: &str, label: &str, value: &str) -> f64 {
    let want = format!("{label}=\"{value}\"");
    exposition
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|line| {
            let rest = line.strip_prefix(name)?;
            let (labels, v) = rest.strip_prefix('{')?.split_once('}')?;
            labels.split(',').any(|kv| kv == want).then(|| v.trim().parse::<f64>().ok()).flatten()
        })
        .fold(0.0, |a, b| a + b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_checksum_line_of_the_unpacked_binary_is_found() {
        let sum = "bfd319a3254b21c324d9d3af76a5addc456bbdc9331d9c583dc94af3a6f609d7";
        assert_eq!(parse_sums(&format!("{sum}  upstream-ccm-bench\n")), Some(sum.to_string()));
        assert_eq!(parse_sums(&format!("{sum} *upstream-ccm-bench\n")), Some(sum.to_string()));
        assert_eq!(parse_sums(&format!("{sum}  other\n")), None);
        assert_eq!(parse_sums("xyz  upstream-ccm-bench\n"), None);
    }

    #[test]
    fn counter_samples_are_summed_over_the_other_labels() {
        let text = "# TYPE c counter\nc_total{provider=\"fake\",method=\"ensure\",result=\"success\"} 2\n\
                    c_total{provider=\"fake\",method=\"ensure\",result=\"throttled\"} 1\nc_total{method=\"get\"} 5\n";
        assert_eq!(counter_sum(text, "c_total", "method", "ensure"), 3.0);
        assert_eq!(counter_sum(text, "c_total", "method", "delete"), 0.0);
    }

    #[test]
    fn the_skip_line_names_what_is_needed() {
        assert!(
            skip_line("x is absent")
                .starts_with("SKIPPED: needs ../shared/upstream (or CCM_UPSTREAM) and CCM_TEST_ASSETS: x")
        );
    }
}
