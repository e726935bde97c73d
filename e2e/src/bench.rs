//! What the benchmark drivers (`src/bin/bench-*.rs`) share: the backend choice, process
//! measurements and guards, and the API server's write limit measured the same way for every
//! kind. Results and commands: `docs/benchmarks.md`.

use std::future::Future;
use std::process::Child;
use std::time::Instant;

use tokio::task::JoinSet;

/// The drivers' error: anything, with its message.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Which API server a driver starts when it is given no kubeconfig.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendArg {
    /// The in-memory local API server.
    Local,
    /// A genuine etcd + kube-apiserver (`CCM_TEST_ASSETS`).
    Genuine,
}

/// A field of `/proc/<pid>/status` in KiB (`VmRSS:`, `VmHWM:`); Linux only.
pub fn proc_status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find(|l| l.starts_with(field))?.split_whitespace().nth(1)?.parse().ok()
}

/// Kills and reaps a child process when dropped, so a driver that fails leaves none behind.
pub struct ChildGuard(pub Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The API server's own write limit for `count` objects: `write(round, i)` makes object `i`'s
/// two patches, run at concurrency 8, 32 and 96 (one round each); returns the best time in
/// seconds and its concurrency. `what` names the objects in the progress lines.
pub async fn measure_limit<F, Fut>(what: &str, count: usize, write: F) -> Result<(f64, usize), BoxError>
where
    F: Fn(usize, usize) -> Fut,
    Fut: Future<Output = Result<(), kube::Error>> + Send + 'static,
{
    let mut best: Option<(f64, usize)> = None;
    for (round, concurrency) in [8usize, 32, 96].into_iter().enumerate() {
        let started = Instant::now();
        let mut tasks = JoinSet::new();
        for i in 0..count {
            if tasks.len() >= concurrency
                && let Some(done) = tasks.join_next().await
            {
                done??;
            }
            tasks.spawn(write(round, i));
        }
        while let Some(done) = tasks.join_next().await {
            done??;
        }
        let seconds = started.elapsed().as_secs_f64();
        eprintln!("   limit: {count} {what} x 2 patches at concurrency {concurrency}: {seconds:.2} s");
        if best.is_none_or(|(b, _)| seconds < b) {
            best = Some((seconds, concurrency));
        }
    }
    best.ok_or_else(|| "no limit measured".into())
}

/// Sum of the samples of Prometheus `metric` in `text`, grouped by the value of `label` (""
/// when a sample has none).
pub fn metric_by(text: &str, metric: &str, label: &str) -> std::collections::BTreeMap<String, u64> {
    let mut out = std::collections::BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some(rest) = line.strip_prefix(metric) else { continue };
        if !(rest.starts_with('{') || rest.starts_with(' ')) {
            continue;
        }
        let (labels, value) = match rest.split_once('}') {
            Some((l, v)) => (l.trim_start_matches('{'), v),
            None => ("", rest),
        };
        let Some(value) = value.split_whitespace().next().and_then(|v| v.parse::<f64>().ok()) else { continue };
        let key = labels
            .split(',')
            .find_map(|kv| {
                kv.split_once('=').filter(|(k, _)| *k == label).map(|(_, v)| v.trim_matches('"').to_string())
            })
            .unwrap_or_default();
        *out.entry(key).or_insert(0) += value as u64;
    }
    out
}

/// SIGTERM `child`, wait up to `grace` for it to exit, then kill it and reap it.
pub fn terminate(child: &mut std::process::Child, grace: std::time::Duration) {
    let _ = std::process::Command::new("kill").arg("-TERM").arg(child.id().to_string()).status();
    let deadline = std::time::Instant::now() + grace;
    while std::time::Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}
