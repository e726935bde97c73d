//! Flags accepted for compatibility that have no effect here or are deprecated: one warning
//! line each, logged at start (pure).

use super::features;
use super::flags::Flags;
use super::invalid;
use crate::error::Error;
use crate::serving::tls::{SERVING_FLAGS, WEBHOOK_FLAGS, parse_curve_preferences};

impl Flags {
    /// One line per accepted flag that has no effect or is deprecated. A `--feature-gates`
    /// value that is not `Name=bool` is refused.
    pub fn warnings(&self) -> Result<Vec<String>, Error> {
        let defaults = Flags::try_parse_args(["cloud-controller-manager"])
            .map_err(|e| invalid("--help", format!("flag defaults do not parse: {e}")))?;
        let mut warnings = Vec::new();
        generic(self, &defaults, &mut warnings);
        let gates = features::parse(&self.feature_gates)?;
        warnings.extend(gates.warnings);
        gated(self, &defaults, gates.gates, &mut warnings);
        leader_migration(self, &mut warnings);
        serving_and_logging(self, &defaults, &mut warnings)?;
        Ok(warnings)
    }
}

fn accepted(warnings: &mut Vec<String>, flag: &str, why: &str) {
    warnings.push(format!("{flag} is accepted for compatibility but {why}"));
}

/// The cloud-provider and generic flags.
fn generic(flags: &Flags, defaults: &Flags, warnings: &mut Vec<String>) {
    if flags.allow_untagged_cloud {
        accepted(warnings, "--allow-untagged-cloud", "is deprecated");
    }
    if !flags.external_cloud_volume_plugin.is_empty() {
        accepted(warnings, "--external-cloud-volume-plugin", "has no effect");
    }
    if !flags.controller_start_interval.is_zero() {
        accepted(warnings, "--controller-start-interval", "has no effect: controllers start together");
    }
    if flags.min_resync_period != defaults.min_resync_period {
        accepted(warnings, "--min-resync-period", "has no effect: the shared caches never resync");
    }
    if flags.kube_api_content_type != defaults.kube_api_content_type {
        accepted(warnings, "--kube-api-content-type", "has no effect: requests use JSON");
    }
    if flags.allocate_node_cidrs {
        accepted(warnings, "--allocate-node-cidrs", "has no effect: there is no node IPAM controller");
    }
    if flags.cidr_allocator_type != defaults.cidr_allocator_type {
        accepted(warnings, "--cidr-allocator-type", "has no effect");
    }
    if flags.node_sync_period.is_some() {
        accepted(warnings, "--node-sync-period", "is deprecated and has no effect");
    }
    if flags.use_service_account_credentials {
        accepted(
            warnings,
            "--use-service-account-credentials",
            "has no effect: controllers use the manager's credentials",
        );
    }
}

/// Flags that a feature gate turns on or off.
fn gated(flags: &Flags, defaults: &Flags, gates: features::FeatureGates, warnings: &mut Vec<String>) {
    if gates.watch_based_routes && flags.route_reconciliation_period != defaults.route_reconciliation_period {
        warnings.push(format!(
            "--route-reconciliation-period has no effect with watch-based routes (as upstream); set --feature-gates={}=false to reconcile on a fixed period",
            features::WATCH_BASED_ROUTES
        ));
    }
    if !gates.webhook && !flags.webhooks.iter().all(|w| w.trim().is_empty()) {
        warnings.push(format!(
            "--webhooks has no effect without --feature-gates={}=true (as upstream): no webhook is served",
            features::WEBHOOK
        ));
    }
}

/// The leader-migration flags given without `--enable-leader-migration`.
fn leader_migration(flags: &Flags, warnings: &mut Vec<String>) {
    if !flags.enable_leader_migration && !flags.leader_migration_config.is_empty() {
        warnings.push("--leader-migration-config has no effect without --enable-leader-migration (as upstream)".into());
    }
    if !flags.enable_leader_migration && !flags.leader_migration_lease_namespace.is_empty() {
        warnings.push("--leader-migration-lease-namespace has no effect without --enable-leader-migration".into());
    }
}

/// Profiling, serving, authentication, webhook and logging flags with no effect here, and
/// key-exchange groups listed that this build cannot offer.
fn serving_and_logging(flags: &Flags, defaults: &Flags, warnings: &mut Vec<String>) -> Result<(), Error> {
    if !flags.profiling || flags.contention_profiling {
        accepted(warnings, "--profiling", "has no effect: there are no profiling endpoints");
    }
    for (flag, value) in [
        (SERVING_FLAGS.curve_preferences, &flags.tls_curve_preferences),
        (WEBHOOK_FLAGS.curve_preferences, &flags.webhook_tls_curve_preferences),
    ] {
        let unavailable = parse_curve_preferences(flag, value)?.unavailable;
        if !unavailable.is_empty() {
            warnings.push(format!(
                "{flag}: {} left out: rustls (ring) does not implement them; the others are offered",
                unavailable.join(", ")
            ));
        }
    }
    match flags.version.as_deref() {
        None | Some("true" | "raw" | "false") => {}
        Some(other) => warnings
            .push(format!("--version={other} is accepted for compatibility but does not change the reported version")),
    }
    for (flag, set) in [
        ("--cert-dir", !flags.cert_dir.is_empty()),
        ("--tls-sni-cert-key", !flags.tls_sni_cert_key.is_empty()),
        ("--webhook-cert-dir", !flags.webhook_cert_dir.is_empty()),
        ("--webhook-tls-sni-cert-key", !flags.webhook_tls_sni_cert_key.is_empty()),
        ("--webhook-disable-http2-serving", flags.webhook_disable_http2_serving),
        ("--log-flush-frequency", flags.log_flush_frequency != defaults.log_flush_frequency),
        ("--log-text-info-buffer-size", !flags.log_text_info_buffer_size.is_empty()),
        ("--log-text-split-stream", flags.log_text_split_stream),
        ("--http2-max-streams-per-connection", flags.http2_max_streams_per_connection != 0),
        ("--disable-http2-serving", flags.disable_http2_serving),
        ("--permit-port-sharing", flags.permit_port_sharing),
        ("--permit-address-sharing", flags.permit_address_sharing),
        ("--authentication-skip-lookup", flags.authentication_skip_lookup),
        ("--authentication-tolerate-lookup-failure", flags.authentication_tolerate_lookup_failure),
        ("--client-ca-file", !flags.client_ca_file.is_empty()),
        ("--requestheader-client-ca-file", !flags.requestheader_client_ca_file.is_empty()),
        ("--requestheader-allowed-names", !flags.requestheader_allowed_names.is_empty()),
        ("--vmodule", !flags.vmodule.is_empty()),
    ] {
        if set {
            accepted(warnings, flag, "has no effect here");
        }
    }
    Ok(())
}
