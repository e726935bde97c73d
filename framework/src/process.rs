//! Process helpers shared by the `cloud-controller-manager` and `ccm-operator` binaries: the
//! log filter and its set-up, and the shutdown signal. Part of the runtime kit, so the operator
//! borrows nothing from the manager program's own module (`engine::app`).

use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

use crate::flags::LogSettings;

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
    use super::default_directives;
    use crate::test_log::Captured;
    use tracing_subscriber::EnvFilter;

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
}
