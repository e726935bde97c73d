//! What the benchmark drivers (`src/bin/bench-*.rs`) share: the backend choice, process
//! measurements and guards, the manager as a child process, creating objects at a bounded
//! concurrency, and the API server's write limit measured the same way for every kind.
//! Results and commands: `docs/benchmarks.md`.

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ccm_framework::cache::{CacheWriter, run_watch};
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, PostParams};
use kube::runtime::watcher;
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

impl BackendArg {
    /// The backend a driver's rows name: `external` with a kubeconfig, else this one.
    pub fn label(self, kubeconfig: Option<&std::path::Path>) -> &'static str {
        match (kubeconfig, self) {
            (Some(_), _) => "external",
            (None, BackendArg::Genuine) => "genuine",
            (None, BackendArg::Local) => "local",
        }
    }
}

/// A field of `/proc/<pid>/status` in KiB (`VmRSS:`, `VmHWM:`); Linux only.
pub fn proc_status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find(|l| l.starts_with(field))?.split_whitespace().nth(1)?.parse().ok()
}

/// CPU time (user + system, every thread) of process `pid` in seconds, from
/// `/proc/<pid>/stat` in USER_HZ ticks (100 per second on Linux); Linux only.
pub fn proc_cpu_secs(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command name (which may hold spaces), field 3 is the state; utime and stime
    // are fields 14 and 15.
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace().skip(11);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    Some((user + system) as f64 / 100.0)
}

/// Kills and reaps a child process when dropped, so a driver that fails leaves none behind.
pub struct ChildGuard(pub Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Concurrencies of the limit's sweep: one round each, doubling from 8 (below, the client's
/// round trips dominate) to 128, and on while the last round was the best, up to 512.
pub const LIMIT_SWEEP: (usize, usize, usize) = (8, 128, 512);

/// The next concurrency of the sweep after `last`, given the best so far (pure).
pub fn next_concurrency(last: usize, best: usize) -> Option<usize> {
    let (_, always, most) = LIMIT_SWEEP;
    let next = last * 2;
    (next <= always || (best == last && next <= most)).then_some(next)
}

/// The API server's own write limit for `count` objects: `write(round, i)` makes object `i`'s
/// two patches, run at each concurrency of the [`LIMIT_SWEEP`] (one round each); returns the best
/// time in seconds and its concurrency. `what` names the objects in the progress lines. Built
/// with `--release`, the driver makes this a tight limit; a debug driver's is an upper bound.
pub async fn measure_limit<F, Fut>(what: &str, count: usize, write: F) -> Result<(f64, usize), BoxError>
where
    F: Fn(usize, usize) -> Fut,
    Fut: Future<Output = Result<(), kube::Error>> + Send + 'static,
{
    let mut best: Option<(f64, usize)> = None;
    let mut next = Some(LIMIT_SWEEP.0);
    let mut round = 0;
    while let Some(concurrency) = next {
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
        next = next_concurrency(concurrency, best.map_or(concurrency, |(_, c)| c));
        round += 1;
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

/// Whether the Service has at least one load-balancer ingress in its status.
pub fn has_ingress(s: &Service) -> bool {
    s.status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|l| l.ingress.as_ref())
        .is_some_and(|i| !i.is_empty())
}

/// Create `count` objects made by `make(i)` with `in_flight` requests at a time, as
/// `field_manager`; seconds taken.
pub async fn create_all<K, F>(
    api: &Api<K>,
    field_manager: &str,
    count: usize,
    in_flight: usize,
    make: F,
) -> Result<f64, BoxError>
where
    K: kube::Resource
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
    F: Fn(usize) -> K,
{
    let started = Instant::now();
    let post = PostParams { field_manager: Some(field_manager.into()), ..Default::default() };
    let mut tasks = JoinSet::new();
    for i in 0..count {
        if tasks.len() >= in_flight.max(1)
            && let Some(done) = tasks.join_next().await
        {
            done??;
        }
        let (api, object, post) = (api.clone(), make(i), post.clone());
        tasks.spawn(async move { api.create(&post, &object).await.map(|_| ()) });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    Ok(started.elapsed().as_secs_f64())
}

/// Feed `writer` from a watch on `api`; the returned guard stops it when dropped.
pub fn watch(api: Api<Service>, writer: CacheWriter<Service>) -> AbortOnDrop {
    AbortOnDrop(tokio::spawn(run_watch(api, watcher::Config::default(), writer, Default::default())))
}

/// Aborts a task when dropped, so a failed phase leaves no watch behind.
pub struct AbortOnDrop(pub tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A free TCP port on loopback (free when asked; the manager binds it next).
pub fn free_port() -> Result<u16, BoxError> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// GET `path` from the manager's HTTPS endpoint (its self-signed certificate not verified).
pub async fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let r = ccm_framework::serving::probe::get(addr, path, None, Duration::from_secs(5)).await?;
    Some((r.status, r.body))
}

/// The word that, as a driver's program or variant, stands for the upstream Go manager
/// ([`crate::upstream`]) with its `bench` provider.
pub const UPSTREAM: &str = "upstream";

/// The flags after a leading [`UPSTREAM`] word, when `command` names upstream (pure).
pub fn upstream_flags(command: &str) -> Option<&str> {
    let rest = command.trim_start().strip_prefix(UPSTREAM)?;
    (rest.is_empty() || rest.starts_with(char::is_whitespace)).then(|| rest.trim())
}

/// Where a manager serves `/healthz` and `/metrics`.
#[derive(Clone, Copy, Debug)]
enum Serving {
    /// Ours: HTTPS on a loopback port, self-signed.
    Https(u16),
    /// Upstream's `BENCH_HTTP_ADDR`: plain HTTP.
    Plain(SocketAddr),
}

/// The manager process (ours or upstream's), its RSS sampled every 100 ms; dropping it kills
/// the process, so a failed phase leaves none behind.
pub struct ManagerProcess {
    child: Child,
    serving: Serving,
    peak_rss_kib: Arc<AtomicU64>,
    stop_sampling: Arc<AtomicBool>,
    stopped: bool,
}

impl ManagerProcess {
    /// Start `command` plus `extra` (split on whitespace), with `{kubeconfig}`,
    /// `{cloud_config}` and `{port}` (a free port) substituted; stderr goes to `log`.
    pub fn spawn(
        command: &str,
        extra: &str,
        kubeconfig: &Path,
        cloud_config: &Path,
        log: &Path,
    ) -> Result<Self, BoxError> {
        let port = free_port()?;
        let line = command
            .replace("{kubeconfig}", &kubeconfig.display().to_string())
            .replace("{cloud_config}", &cloud_config.display().to_string())
            .replace("{port}", &port.to_string());
        let mut words = line.split_whitespace().chain(extra.split_whitespace());
        let program = words.next().ok_or("empty manager command line")?;
        let child = Command::new(program)
            .args(words)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log)?)
            .spawn()
            .map_err(|e| format!("starting {program}: {e}"))?;
        Ok(Self::sampled(child, Serving::Https(port)))
    }

    /// Start the upstream Go manager with `flags` (split on whitespace) after its launch's own
    /// ([`crate::upstream::Launch`]) and `env` added; its output goes to `log`.
    pub fn spawn_upstream(
        flags: &str,
        kubeconfig: &Path,
        env: &[(String, String)],
        log: &Path,
    ) -> Result<Self, BoxError> {
        let args: Vec<String> = flags.split_whitespace().map(str::to_string).collect();
        let launch = crate::upstream::Launch::new(kubeconfig, &args, env)?;
        let out = std::fs::File::create(log)?;
        let child = Command::new(&launch.program)
            .args(&launch.args)
            .envs(launch.env.iter().map(|(k, v)| (k, v)))
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .map_err(|e| format!("starting {}: {e}", launch.program.display()))?;
        Ok(Self::sampled(child, Serving::Plain(launch.http)))
    }

    fn sampled(child: Child, serving: Serving) -> Self {
        let peak = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (pid, p, s) = (child.id(), peak.clone(), stop.clone());
        tokio::spawn(async move {
            while !s.load(Ordering::Relaxed) {
                if let Some(kib) = proc_status_kib(pid, "VmRSS:") {
                    p.fetch_max(kib, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        Self { child, serving, peak_rss_kib: peak, stop_sampling: stop, stopped: false }
    }

    async fn get(&self, path: &str) -> Option<(u16, String)> {
        match self.serving {
            Serving::Https(port) => http_get(port, path).await,
            Serving::Plain(addr) => crate::upstream::http_get(addr, path).await.map(|r| (r.status, r.body)),
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The manager's `/metrics` text (empty when unreachable).
    pub async fn metrics(&self) -> String {
        self.get("/metrics").await.map(|(_, b)| b).unwrap_or_default()
    }

    /// An error when the manager has exited.
    pub fn check_running(&mut self) -> Result<(), BoxError> {
        match self.child.try_wait()? {
            Some(status) => Err(format!("manager exited with {status}").into()),
            None => Ok(()),
        }
    }

    /// Wait until `/healthz` answers 200, at most `timeout`.
    pub async fn wait_healthy(&mut self, timeout: Duration) -> Result<(), BoxError> {
        let deadline = Instant::now() + timeout;
        loop {
            self.check_running()?;
            if self.get("/healthz").await.is_some_and(|(code, _)| code == 200) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err("manager did not become healthy".into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Stop the manager (SIGTERM, then SIGKILL after 10 s); its peak RSS in MiB.
    pub fn stop(&mut self) -> f64 {
        if !self.stopped {
            self.stopped = true;
            self.stop_sampling.store(true, Ordering::Relaxed);
            // The kernel's high-water mark catches peaks between samples.
            if let Some(hwm) = proc_status_kib(self.child.id(), "VmHWM:") {
                self.peak_rss_kib.fetch_max(hwm, Ordering::Relaxed);
            }
            terminate(&mut self.child, Duration::from_secs(10));
        }
        self.peak_rss_kib.load(Ordering::Relaxed) as f64 / 1024.0
    }
}

impl Drop for ManagerProcess {
    fn drop(&mut self) {
        if !self.stopped {
            self.stop_sampling.store(true, Ordering::Relaxed);
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_sweep_doubles_to_128_and_goes_on_only_while_its_last_round_is_the_best() {
        let mut seen = vec![8];
        while let Some(c) = next_concurrency(*seen.last().unwrap(), 32) {
            seen.push(c);
        }
        assert_eq!(seen, [8, 16, 32, 64, 128]);
        assert_eq!(next_concurrency(128, 128), Some(256));
        assert_eq!(next_concurrency(256, 256), Some(512));
        assert_eq!(next_concurrency(512, 512), None);
        assert_eq!(next_concurrency(256, 128), None);
    }

    #[test]
    fn a_command_naming_upstream_yields_its_flags_and_any_other_command_none() {
        assert_eq!(upstream_flags("upstream --kube-api-qps=1000"), Some("--kube-api-qps=1000"));
        assert_eq!(upstream_flags("  upstream"), Some(""));
        assert_eq!(upstream_flags("upstream-ccm --x"), None);
        assert_eq!(upstream_flags("--concurrent-service-syncs=32"), None);
        assert_eq!(upstream_flags("target/release/cloud-controller-manager upstream"), None);
    }
}
