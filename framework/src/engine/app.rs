//! The `cloud-controller-manager` program, for any registry of providers.
//!
//! A vendor's whole `main.rs`:
//!
//! ```no_run
//! fn main() -> std::process::ExitCode {
//!     let mut registry = ccm_framework::registry::Registry::new();
//!     // registry.register("mycloud", mycloud::factory).expect("a unique name");
//!     ccm_framework::run_main(registry)
//! }
//! ```

use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

use crate::Error;
use crate::client::{self, RateLimitLayer};
use crate::engine::{EngineBuilder, LeaderLoss};
use crate::flags::{self, Flags, LogSettings, Settings};
use crate::metrics::Metrics;
use crate::registry::{ClusterSettings, Registry};

/// Parse the process arguments and run the manager until SIGTERM or SIGINT. Exits 0 after a
/// clean shutdown, 1 on any error (including a lost Lease, like upstream), 2 on bad usage.
pub fn run_main(registry: Registry) -> ExitCode {
    run_main_from(registry, std::env::args_os())
}

/// [`run_main`] with explicit arguments (the first is the program name).
pub fn run_main_from<I, T>(registry: Registry, args: I) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let flags = match Flags::try_parse_from(args) {
        Ok(f) => f,
        Err(e) => {
            // --help and --version end up here too, with exit code 0.
            let _ = e.print();
            return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
        }
    };
    let settings = match flags.settings() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(1);
        }
    };
    init_logging(settings.log);
    tracing::info!(version = env!("CARGO_PKG_VERSION"), "starting cloud-controller-manager");
    for warning in &settings.warnings {
        tracing::warn!("{warning}");
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            tracing::error!(error = %e, "could not start the async runtime");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(async { run(registry, settings, shutdown_on_signal()).await }) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(%error, "cloud-controller-manager failed");
            ExitCode::from(1)
        }
    }
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

/// Build the provider, the clients and the engine from `settings`, and run until `shutdown`.
pub async fn run(registry: Registry, mut settings: Settings, shutdown: CancellationToken) -> Result<(), Error> {
    let cloud_config = match &settings.cloud_config {
        // Read once at start-up; the bytes go to the factory and are then dropped.
        Some(path) => Some(
            crate::registry::read_cloud_config_file(path)
                .map_err(|source| Error::Io { path: path.display().to_string(), source })?,
        ),
        None => None,
    };
    let cluster = ClusterSettings {
        cluster_name: settings.options.cluster_name.clone(),
        cluster_cidrs: settings.options.cluster_cidrs.clone(),
    };
    // Only a digest stays, to tell an edit of the file from the content read here.
    let initial = cloud_config.as_deref().map(crate::config_watch::digest);
    // Parsed on a blocking thread with a time limit, like the operator does.
    let provider = registry
        .create_bounded(&settings.provider, cloud_config, &cluster, crate::registry::FACTORY_TIME_LIMIT)
        .await?;
    if !provider.has_cluster_id() {
        if settings.allow_untagged_cloud {
            tracing::warn!("detected a cluster without a ClusterID; a ClusterID will be required in the future");
        } else {
            return Err(Error::InvalidFlag {
                flag: "--allow-untagged-cloud",
                message: "no ClusterID found; a ClusterID is required for the cloud provider to function properly"
                    .into(),
            });
        }
    }
    flags::check_with_provider(&mut settings.options, provider.as_ref())?;
    if let Some(path) = settings.cloud_config.clone() {
        // Edits reach the provider without a restart where it can take them (see config_watch).
        tokio::spawn(crate::config_watch::watch(
            path,
            provider.clone(),
            initial,
            crate::config_watch::POLL_INTERVAL,
            shutdown.child_token(),
        ));
    }

    let config = client::load_config(&settings.client).await?;
    let metrics = Arc::new(Metrics::new());
    let wait = metrics.get_or_register(
        "rest_client_rate_limiter_duration_seconds",
        "Client side rate limiter latency in seconds.",
        || {
            prometheus_client::metrics::histogram::Histogram::new(
                prometheus_client::metrics::histogram::exponential_buckets(0.001, 2.0, 15),
            )
        },
    );
    let layer = RateLimitLayer::new(settings.qps, settings.burst)
        .with_observer(Arc::new(move |d: std::time::Duration| wait.observe(d.as_secs_f64())));
    // The endpoint's TokenReviews and SubjectAccessReviews use this configuration unless
    // --authentication-kubeconfig / --authorization-kubeconfig say otherwise.
    let http = match settings.http {
        Some(http) => Some(http.resolve_auth(&config).await?),
        None => None,
    };
    let client = client::build_client(config.clone(), &layer)?;
    let event_client = client::build_client(config, &RateLimitLayer::disabled())?;

    let on_loss = if settings.exit_on_lost_lease { LeaderLoss::Exit } else { LeaderLoss::StandBy };
    let engine = EngineBuilder::new(client, provider, settings.options)
        .event_client(event_client)
        .leader_election(settings.leader_election)
        .http(http)
        .metrics(metrics)
        .on_leader_loss(on_loss)
        .report_status(settings.ccm_resource, settings.ccm_resource_interval)
        .build()?;
    engine.run(shutdown).await
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
