//! Flags accepted for compatibility that have no effect here or are deprecated: one warning
//! line each, logged at start (pure).

use super::flags::Flags;
use super::invalid;
use crate::error::Error;
use crate::go_values::parse_bool;

/// Upstream's feature gates this manager knows of (none of them changes anything here).
pub const KNOWN_FEATURE_GATES: [&str; 3] = [
    "CloudControllerManagerWatchBasedRoutesReconciliation",
    "CloudControllerManagerWebhook",
    "ControllerManagerReleaseLeaderElectionLockOnExit",
];

impl Flags {
    /// One line per accepted flag that has no effect or is deprecated. A `--feature-gates`
    /// value that is not `Name=bool` is refused.
    pub fn warnings(&self) -> Result<Vec<String>, Error> {
        let defaults = Flags::try_parse_args(["cloud-controller-manager"])
            .map_err(|e| invalid("--help", format!("flag defaults do not parse: {e}")))?;
        let mut warnings = Vec::new();
        generic(self, &defaults, &mut warnings);
        feature_gates(&self.feature_gates, &mut warnings)?;
        leader_migration(self, &mut warnings);
        serving_and_logging(self, &mut warnings);
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

/// `--feature-gates`: each `Name=bool` is checked; no gate changes anything.
fn feature_gates(gates: &str, warnings: &mut Vec<String>) -> Result<(), Error> {
    if gates.is_empty() {
        return Ok(());
    }
    for gate in gates.split(',').filter(|g| !g.trim().is_empty()) {
        let (name, value) = gate.split_once('=').unwrap_or((gate, "true"));
        parse_bool(value.trim()).map_err(|e| invalid("--feature-gates", format!("{}: {e}", name.trim())))?;
        if !KNOWN_FEATURE_GATES.contains(&name.trim()) {
            warnings.push(format!("--feature-gates: {} is not a feature gate of this manager", name.trim()));
        }
    }
    warnings.push("--feature-gates is accepted for compatibility but no gate changes behaviour".into());
    Ok(())
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

/// Profiling, serving, authentication, webhook and logging flags with no effect here.
fn serving_and_logging(flags: &Flags, warnings: &mut Vec<String>) {
    if !flags.profiling || flags.contention_profiling {
        accepted(warnings, "--profiling", "has no effect: there are no profiling endpoints");
    }
    for (flag, set) in [
        ("--cert-dir", !flags.cert_dir.is_empty()),
        ("--tls-curve-preferences", !flags.tls_curve_preferences.is_empty()),
        ("--tls-sni-cert-key", !flags.tls_sni_cert_key.is_empty()),
        ("--http2-max-streams-per-connection", flags.http2_max_streams_per_connection != 0),
        ("--disable-http2-serving", flags.disable_http2_serving),
        ("--permit-port-sharing", flags.permit_port_sharing),
        ("--permit-address-sharing", flags.permit_address_sharing),
        ("--authentication-skip-lookup", flags.authentication_skip_lookup),
        ("--authentication-tolerate-lookup-failure", flags.authentication_tolerate_lookup_failure),
        ("--client-ca-file", !flags.client_ca_file.is_empty()),
        ("--requestheader-client-ca-file", !flags.requestheader_client_ca_file.is_empty()),
        ("--requestheader-allowed-names", !flags.requestheader_allowed_names.is_empty()),
        ("--webhooks", !flags.webhooks.is_empty()),
        ("--webhook-cert-dir", !flags.webhook_cert_dir.is_empty()),
        ("--vmodule", !flags.vmodule.is_empty()),
    ] {
        if set {
            accepted(warnings, flag, "has no effect here");
        }
    }
}
