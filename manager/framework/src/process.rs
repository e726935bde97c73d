//! Process helpers shared by the `cloud-controller-manager` and `ccm-operator` binaries and the
//! baremetal announcer: the log settings, filter and set-up, the open-file limit, glibc's malloc
//! arenas, and the shutdown signal. Below the manager's program module, so those processes
//! borrow nothing from the manager's command line.

use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

/// How a process logs (the manager: `-v` and `--logging-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogSettings {
    /// The `tracing` level.
    pub level: tracing::Level,
    /// JSON lines instead of text.
    pub json: bool,
}

/// The log filter for `level` shared by the manager and the operator binaries.
///
/// Below `debug`, two kinds of kube-client lines are dropped because the caller already reports
/// the same event with context: the ERROR for a failed request ("failed with error client error
/// (Connect)", logged again by the watch or Lease renewal that retries it) and the WARNs for a
/// watch stream cut short ("eof in poll", "timeout in poll"), which kube-client treats as a normal
/// end and the watcher resumes. They made an API server that stops or restarts look like a
/// failure. kube-client's TLS warnings keep the chosen level.
pub fn default_directives(level: &str) -> String {
    match level.trim().to_ascii_lowercase().as_str() {
        "debug" | "trace" => level.to_string(),
        "error" | "off" => format!("{level},kube_client::client::builder=off"),
        _ => {
            format!("{level},kube_client::client=error,kube_client::client::tls=warn,kube_client::client::builder=off")
        }
    }
}

/// Set up `tracing` from `-v` and `--logging-format`; `RUST_LOG` wins when set.
pub fn init_logging(log: LogSettings) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_directives(log.level.as_str())));
    // Colours only on a terminal: `kubectl logs` and log files get plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    // A second initialization (tests, embedding) keeps the first subscriber.
    let _ = if log.json { builder.json().try_init() } else { builder.try_init() };
}

/// The process's open-file limit (`RLIMIT_NOFILE`) as (soft, hard); `None` where it cannot be
/// read (not Unix, or the call failed). `u64::MAX` stands for unlimited.
pub fn open_file_limits() -> Option<(u64, u64)> {
    #[cfg(unix)]
    {
        let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit writes one rlimit into the struct we own and reads nothing else.
        let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
        (rc == 0).then(|| (rlim_to_u64(limit.rlim_cur), rlim_to_u64(limit.rlim_max)))
    }
    #[cfg(not(unix))]
    {
        None
    }
}

#[cfg(unix)]
// rlim_t is u64 on Linux and macOS but signed on some BSDs.
#[allow(clippy::useless_conversion)]
fn rlim_to_u64(value: libc::rlim_t) -> u64 {
    if value == libc::RLIM_INFINITY { u64::MAX } else { u64::try_from(value).unwrap_or(u64::MAX) }
}

/// The soft open-file limit to ask for, given (soft, hard): the hard limit, except that an
/// unlimited hard limit is capped at `ceiling` (some kernels refuse "unlimited" for
/// `RLIMIT_NOFILE`, and `fs.nr_open` bounds it anyway). `None` when the soft limit already
/// is that high (pure).
pub fn wanted_soft_limit(soft: u64, hard: u64, ceiling: u64) -> Option<u64> {
    let target = if hard == u64::MAX { ceiling } else { hard };
    (target > soft).then_some(target)
}

/// The soft open-file limit asked for when the hard limit is unlimited (Linux's default
/// `fs.nr_open`).
pub const UNLIMITED_NOFILE_CEILING: u64 = 1 << 20;

/// Raise the soft open-file limit to the hard limit, once at start, before any thread opens
/// descriptors: the default soft limit (often 1024) is far below what the proxy data path and
/// the API client need together, and running out breaks the API client, the Lease renewal and
/// the health endpoint at once. Logs the limits before and after at info; returns them
/// (soft before, soft after), or `None` where the limit cannot be read. Never fails: a refused
/// raise is logged and the old limit stays.
pub fn raise_open_file_limit() -> Option<(u64, u64)> {
    let (soft, hard) = open_file_limits()?;
    let Some(target) = wanted_soft_limit(soft, hard, UNLIMITED_NOFILE_CEILING) else {
        tracing::info!(soft, hard, "open-file limit already at the hard limit");
        return Some((soft, soft));
    };
    match set_soft_open_file_limit(target, hard) {
        Ok(()) => {
            let after = open_file_limits().map(|(s, _)| s).unwrap_or(soft);
            tracing::info!(before = soft, after, hard, "raised the open-file soft limit to the hard limit");
            Some((soft, after))
        }
        Err(error) => {
            tracing::warn!(soft, hard, %error, "could not raise the open-file soft limit; keeping it");
            Some((soft, soft))
        }
    }
}

#[cfg(unix)]
#[allow(clippy::useless_conversion)]
fn set_soft_open_file_limit(soft: u64, hard: u64) -> std::io::Result<()> {
    let to_rlim = |v: u64| {
        if v == u64::MAX { libc::RLIM_INFINITY } else { libc::rlim_t::try_from(v).unwrap_or(libc::RLIM_INFINITY) }
    };
    let limit = libc::rlimit { rlim_cur: to_rlim(soft), rlim_max: to_rlim(hard) };
    // SAFETY: setrlimit reads the struct we pass and touches no other memory of this process.
    let rc = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) };
    if rc == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
}

#[cfg(not(unix))]
fn set_soft_open_file_limit(_soft: u64, _hard: u64) -> std::io::Result<()> {
    Err(std::io::ErrorKind::Unsupported.into())
}

/// How many malloc arenas the manager asks glibc for.
pub const MALLOC_ARENAS: i32 = 2;

/// The arena limit to set, given `MALLOC_ARENA_MAX` and `GLIBC_TUNABLES` from the environment:
/// none when either already says how many (the operator of the process wins), else
/// [`MALLOC_ARENAS`] (pure).
pub fn wanted_arena_limit(arena_max_env: Option<&str>, tunables_env: Option<&str>) -> Option<i32> {
    let tuned = tunables_env.is_some_and(|t| t.contains("glibc.malloc.arena_max"));
    (arena_max_env.is_none() && !tuned).then_some(MALLOC_ARENAS)
}

/// Cap glibc's malloc arenas, once at start, before the runtime's threads exist. glibc gives a
/// thread that finds the heap busy its own arena, up to eight per core, and each keeps its own
/// free memory; the manager's threads mostly wait on I/O, and two arenas held peak RSS at
/// 10,000 Services 2.4 MiB lower at the same speed (docs/benchmarks.md). A no-op on other libcs.
pub fn limit_malloc_arenas() {
    let arena_max = std::env::var("MALLOC_ARENA_MAX").ok();
    let tunables = std::env::var("GLIBC_TUNABLES").ok();
    let Some(limit) = wanted_arena_limit(arena_max.as_deref(), tunables.as_deref()) else { return };
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt changes a malloc parameter; called before other threads allocate.
        let ok = unsafe { libc::mallopt(libc::M_ARENA_MAX, limit) } == 1;
        tracing::debug!(arenas = limit, ok, "capped glibc malloc arenas");
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = limit;
}

/// A token cancelled on SIGTERM or SIGINT. Call it inside the runtime.
pub fn shutdown_on_signal() -> CancellationToken {
    let token = CancellationToken::new();
    let fire = token.clone();
    tokio::spawn(async move {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            match signal(SignalKind::terminate()) {
                Ok(mut term) => {
                    tokio::select! {
                        _ = tokio::signal::ctrl_c() => tracing::info!("received SIGINT; shutting down"),
                        _ = term.recv() => tracing::info!("received SIGTERM; shutting down"),
                    }
                }
                Err(_) => {
                    let _ = tokio::signal::ctrl_c().await;
                }
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
        fire.cancel();
    });
    token
}

#[cfg(test)]
mod tests {
    use super::{
        MALLOC_ARENAS, default_directives, open_file_limits, raise_open_file_limit, wanted_arena_limit,
        wanted_soft_limit,
    };
    use crate::test_log::Captured;
    use tracing_subscriber::EnvFilter;

    #[test]
    fn malloc_arenas_are_capped_unless_the_environment_already_sets_them() {
        assert_eq!(wanted_arena_limit(None, None), Some(MALLOC_ARENAS));
        assert_eq!(wanted_arena_limit(None, Some("glibc.malloc.tcache_count=0")), Some(MALLOC_ARENAS));
        assert_eq!(wanted_arena_limit(Some("8"), None), None);
        assert_eq!(wanted_arena_limit(None, Some("glibc.malloc.arena_max=4")), None);
    }

    /// Emits the kube-client lines in question under `level` and returns what was printed.
    fn printed_at(level: &str) -> String {
        let out = Captured::default();
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(EnvFilter::new(default_directives(level)))
            .with_writer(out.clone())
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::warn!(target: "kube_client::client", "eof in poll: cut short");
            tracing::error!(target: "kube_client::client::builder", "failed with error client error (Connect)");
            tracing::warn!(target: "kube_client::client::tls", "failed to reload CA bundle");
            tracing::error!(target: "kube_client::client", "response could not be parsed");
            tracing::warn!(target: "ccm_framework::leader", "renewal failed");
        });
        out.text()
    }

    #[test]
    fn a_watch_cut_short_and_a_repeated_request_error_stay_quiet_below_debug() {
        let info = printed_at("info");
        assert!(!info.contains("eof in poll"), "{info}");
        assert!(!info.contains("client error (Connect)"), "{info}");
        assert!(info.contains("failed to reload CA bundle"), "TLS warnings keep the level: {info}");
        assert!(info.contains("response could not be parsed"), "kube-client errors still show: {info}");
        assert!(info.contains("renewal failed"), "our own warnings show: {info}");
    }

    #[test]
    fn debug_shows_every_kube_client_line() {
        let debug = printed_at("debug");
        for line in ["eof in poll", "client error (Connect)", "failed to reload CA bundle"] {
            assert!(debug.contains(line), "{line} missing at debug: {debug}");
        }
    }

    #[test]
    fn error_level_hides_warnings_from_kube_client_tls_too() {
        let error = printed_at("error");
        assert!(!error.contains("failed to reload CA bundle"), "{error}");
        assert!(!error.contains("renewal failed"), "{error}");
        assert!(error.contains("response could not be parsed"), "{error}");
    }

    #[test]
    fn the_soft_limit_is_raised_to_the_hard_limit_and_never_lowered() {
        assert_eq!(wanted_soft_limit(1024, 524_288, 1 << 20), Some(524_288));
        assert_eq!(wanted_soft_limit(524_288, 524_288, 1 << 20), None, "already there");
        assert_eq!(wanted_soft_limit(u64::MAX, u64::MAX, 1 << 20), None, "unlimited stays");
        assert_eq!(wanted_soft_limit(1024, u64::MAX, 1 << 20), Some(1 << 20), "unlimited hard is capped");
        assert_eq!(wanted_soft_limit(2 << 20, u64::MAX, 1 << 20), None, "never lowered");
    }

    #[cfg(unix)]
    #[test]
    fn raising_leaves_the_soft_limit_at_the_hard_limit() {
        let (_, hard) = open_file_limits().expect("readable on Unix");
        let (before, after) = raise_open_file_limit().expect("readable on Unix");
        assert!(after >= before);
        let (soft, hard_after) = open_file_limits().expect("readable on Unix");
        assert_eq!(hard_after, hard, "the hard limit is untouched");
        assert_eq!(soft, after);
        if hard != u64::MAX {
            assert_eq!(soft, hard);
        }
    }
}
