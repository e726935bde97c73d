//! `run_main`: the `cloud-controller-manager` program from its arguments to its exit code, for
//! any registry of providers.
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

use super::flags::Flags;
use super::settings::Settings;
use crate::client::{self, RateLimitLayer};
use crate::engine::startup::start_up_checks;
use crate::engine::{EngineBuilder, LeaderLoss};
use crate::error::Error;
use crate::metrics::Metrics;
use crate::process::{init_logging, shutdown_on_signal};
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
            // --help ends up here too, with exit code 0.
            let _ = e.print();
            return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
        }
    };
    // Upstream's --version and --version=raw print and exit; =false and =vX.Y.Z go on.
    if let Some(line) = version_line(flags.version.as_deref()) {
        println!("{line}");
        return ExitCode::SUCCESS;
    }
    let settings = match flags.settings() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(1);
        }
    };
    init_logging(settings.log);
    tracing::info!(version = env!("CARGO_PKG_VERSION"), "starting cloud-controller-manager");
    // Before the runtime's threads open anything: the proxy data path and the API client share it.
    crate::process::raise_open_file_limit();
    crate::process::limit_malloc_arenas();
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

/// What `--version=<value>` prints before exiting, or `None` to run.
pub fn version_line(value: Option<&str>) -> Option<String> {
    let version = env!("CARGO_PKG_VERSION");
    match value? {
        "true" => Some(format!("cloud-controller-manager v{version}")),
        "raw" => Some(format!(
            "{{major:0 minor:1 gitVersion:v{version} platform:{}/{}}}",
            std::env::consts::OS,
            std::env::consts::ARCH
        )),
        _ => None,
    }
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
    let built =
        registry.build_bounded(&settings.provider, cloud_config, &cluster, crate::registry::FACTORY_TIME_LIMIT).await?;
    let provider = built.provider;
    start_up_checks(&mut settings.options, provider.as_ref(), settings.allow_untagged_cloud)?;
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
    let [client, event_client] = client::build_clients(config, [&layer, &RateLimitLayer::disabled()])?;
    start_webhooks(settings.webhook.as_ref(), &built.webhooks, &settings.options, &metrics, &shutdown).await?;

    let on_loss = if settings.exit_on_lost_lease { LeaderLoss::Exit } else { LeaderLoss::StandBy };
    let engine = EngineBuilder::new(client, provider, settings.options)
        .event_client(event_client)
        .leader_election(settings.leader_election)
        .leader_migration(settings.leader_migration)
        .leader_migration_namespace(Some(settings.leader_migration_namespace))
        .http(http)
        .metrics(metrics)
        .on_leader_loss(on_loss)
        .report_status(settings.ccm_resource, settings.ccm_resource_interval)
        .build()?;
    engine.run(shutdown).await
}

/// Serve the webhooks `--webhooks` selects among the provider's, on their own listener, until
/// `shutdown` (every replica serves, leading or not). Nothing is bound when the gate or the
/// port is off or nothing is selected; an unknown name in `--webhooks` fails the start.
async fn start_webhooks(
    settings: Option<&crate::webhook::WebhookSettings>,
    webhooks: &[Arc<dyn crate::webhook::AdmissionWebhook>],
    options: &crate::options::ControllerOptions,
    metrics: &Metrics,
    shutdown: &CancellationToken,
) -> Result<(), Error> {
    use crate::webhook::{AdmissionContext, select, server};
    let Some(settings) = settings else { return Ok(()) };
    let selected = select(&settings.selection, webhooks)?;
    if selected.is_empty() {
        tracing::info!("no admission webhook selected by --webhooks; the webhook server stays off");
        return Ok(());
    }
    let ctx = AdmissionContext {
        load_balancer_class: options.load_balancer_class.clone(),
        handle_unclassed_services: options.handle_unclassed_services,
    };
    let server = server::WebhookServer::new(selected, ctx, metrics);
    let listener = server::bind(settings, &server).await?;
    tokio::spawn(server::serve(listener, server, shutdown.child_token()));
    Ok(())
}
