//! The flags, validated, as the [`Settings`] the program runs with. Each flag group is read by
//! a function of its own, in a fixed order, so that of several bad values the same one is
//! reported first every time.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use super::features::{self, FeatureGates};
use super::flags::Flags;
use super::{invalid, non_zero};
use crate::client::ClientSource;
use crate::config::{ManagerConfig, workers};
use crate::error::Error;
use crate::http::{HttpConfig, Tls, TlsFiles};
use crate::leader::LeaderElectionConfig;
use crate::leader_migration::LeaderMigrationConfiguration;
use crate::options::ControllerOptions;
use crate::process::LogSettings;
use crate::serving::tls::{SERVING_FLAGS, WEBHOOK_FLAGS};
use crate::serving::{AuthConfig, AuthSettings, TlsOptions};
use crate::status::StatusTarget;
use crate::webhook::WebhookSettings;

/// Everything the binary needs, validated.
#[derive(Debug, Clone)]
pub struct Settings {
    /// `--cloud-provider`.
    pub provider: String,
    /// `--cloud-config`, if given.
    pub cloud_config: Option<PathBuf>,
    /// The engine and controller options.
    pub options: ControllerOptions,
    /// Leader election, unless `--leader-elect=false`.
    pub leader_election: Option<LeaderElectionConfig>,
    /// Leader migration (`--enable-leader-migration`), read and validated.
    pub leader_migration: Option<LeaderMigrationConfiguration>,
    /// The migration Lease's namespace (`--leader-migration-lease-namespace`, else the main
    /// Lease's).
    pub leader_migration_namespace: String,
    /// `--exit-on-lost-lease`.
    pub exit_on_lost_lease: bool,
    /// `--kubeconfig` and `--master`.
    pub client: ClientSource,
    /// `--kube-api-qps` (0: no limit).
    pub qps: f32,
    /// `--kube-api-burst`.
    pub burst: u32,
    /// The endpoint, unless `--secure-port=0`.
    pub http: Option<HttpConfig>,
    /// The admission webhook server, when `CloudControllerManagerWebhook` is on and
    /// `--webhook-secure-port` is not 0 (it serves only if `--webhooks` selects a webhook).
    pub webhook: Option<WebhookSettings>,
    /// `--feature-gates`, resolved.
    pub features: FeatureGates,
    /// `--ccm-resource`.
    pub ccm_resource: Option<StatusTarget>,
    /// `--ccm-resource-interval`.
    pub ccm_resource_interval: Duration,
    /// `--allow-untagged-cloud`.
    pub allow_untagged_cloud: bool,
    /// Logging.
    pub log: LogSettings,
    /// One line per accepted flag that has no effect or is deprecated.
    pub warnings: Vec<String>,
}

impl Flags {
    /// Validate and convert to [`Settings`].
    pub fn settings(&self) -> Result<Settings, Error> {
        let warnings = self.warnings()?;
        let features = features::parse(&self.feature_gates)?.gates;
        let config = self.manager_config()?;
        let leader_migration = config.leader_migration_config()?;
        let leader_migration_namespace = config.migration_lease_namespace().to_string();
        let options = controller_options(self, &config, features)?;
        let leader_election = leader_election(self, &config)?;
        let (qps, burst) = rate_limit(self)?;
        let http = serving(self)?;
        let webhook = webhook_serving(self, features)?;
        let log = log_settings(self)?;
        Ok(Settings {
            provider: config.provider,
            cloud_config: config.cloud_config,
            options,
            leader_election,
            leader_migration,
            leader_migration_namespace,
            exit_on_lost_lease: self.exit_on_lost_lease,
            client: ClientSource {
                kubeconfig: Some(self.kubeconfig.clone()).filter(|s| !s.is_empty()),
                master: Some(self.master.clone()).filter(|s| !s.is_empty()),
            },
            qps,
            burst,
            http,
            webhook,
            features,
            ccm_resource: config.ccm_resource,
            ccm_resource_interval: non_zero("--ccm-resource-interval", self.ccm_resource_interval)?,
            allow_untagged_cloud: self.allow_untagged_cloud,
            log,
            warnings,
        })
    }
}

/// The controllers' periods, workers and additions, over what the operator also renders.
fn controller_options(
    flags: &Flags,
    config: &ManagerConfig,
    features: FeatureGates,
) -> Result<ControllerOptions, Error> {
    Ok(ControllerOptions {
        route_reconciliation_period: non_zero("--route-reconciliation-period", flags.route_reconciliation_period)?,
        watch_based_routes: features.watch_based_routes,
        route_resync_period: non_zero("--min-resync-period", flags.min_resync_period)?,
        node_monitor_period: non_zero("--node-monitor-period", flags.node_monitor_period)?,
        node_status_update_frequency: non_zero("--node-status-update-frequency", flags.node_status_update_frequency)?,
        concurrent_node_status_updates: match flags.concurrent_node_status_updates {
            0 => 0,
            n => workers("--concurrent-node-status-updates", n)?,
        },
        node_batch_size: workers("--node-batch-size", flags.node_batch_size)?,
        node_batch_window: flags.node_batch_window,
        node_deletion_grace_period: flags.node_deletion_grace_period,
        load_balancer_resync_period: Some(flags.load_balancer_resync_period).filter(|d| !d.is_zero()),
        orphan_scan_period: flags.orphan_scan_period,
        ..config.controller_options()
    })
}

/// Leader election, unless `--leader-elect=false`: only Leases, released on shutdown unless
/// `--leader-elect-release-on-shutdown=false`.
fn leader_election(flags: &Flags, config: &ManagerConfig) -> Result<Option<LeaderElectionConfig>, Error> {
    if !flags.leader_elect {
        return Ok(None);
    }
    if flags.leader_elect_resource_lock != "leases" {
        return Err(invalid(
            "--leader-elect-resource-lock",
            format!("{:?} is not supported; use leases", flags.leader_elect_resource_lock),
        ));
    }
    Ok(config
        .leader_election_config(&crate::leader::default_identity())
        .map(|le| LeaderElectionConfig { release_on_cancel: flags.leader_elect_release_on_shutdown, ..le }))
}

/// `--kube-api-qps` and `--kube-api-burst`: (requests per second, 0 for no limit; burst).
fn rate_limit(flags: &Flags) -> Result<(f32, u32), Error> {
    if !(flags.kube_api_qps.is_finite() && flags.kube_api_qps >= 0.0) {
        return Err(invalid("--kube-api-qps", "must be 0 (no limit) or positive"));
    }
    if flags.kube_api_qps > 0.0 && flags.kube_api_burst < 1 {
        return Err(invalid("--kube-api-burst", "must be at least 1 when --kube-api-qps is positive"));
    }
    let burst = u32::try_from(flags.kube_api_burst.max(0)).map_err(|_| invalid("--kube-api-burst", "is too large"))?;
    Ok((flags.kube_api_qps, burst))
}

/// `flag`'s IP address; empty: 0.0.0.0.
fn bind_ip(flag: &'static str, value: &str) -> Result<IpAddr, Error> {
    if value.is_empty() {
        return Ok(IpAddr::from([0, 0, 0, 0]));
    }
    value.parse().map_err(|_| invalid(flag, format!("{value:?} is not an IP address")))
}

/// The `--secure-port` endpoint, unless the port is 0.
fn serving(flags: &Flags) -> Result<Option<HttpConfig>, Error> {
    // Checked even with the endpoint off: a refused value is never silently ignored.
    let tls_options = TlsOptions::parse(
        SERVING_FLAGS,
        &flags.tls_min_version,
        &flags.tls_cipher_suites,
        &flags.tls_curve_preferences,
    )?;
    if flags.secure_port == 0 {
        return Ok(None);
    }
    let ip = bind_ip("--bind-address", &flags.bind_address)?;
    let tls = certificate_pair("--tls-cert-file", &flags.tls_cert_file, &flags.tls_private_key_file)?;
    let auth = delegated_auth(flags)?;
    Ok(Some(
        HttpConfig::new(SocketAddr::new(ip, flags.secure_port))
            .with_tls(tls)
            .with_tls_options(tls_options)
            .with_auth(auth),
    ))
}

/// A certificate file and its key (`flag` and its `-private-key-file` twin), together, or a
/// self-signed certificate.
fn certificate_pair(flag: &'static str, cert: &str, key: &str) -> Result<Tls, Error> {
    match (cert.is_empty(), key.is_empty()) {
        (true, true) => Ok(Tls::SelfSigned),
        (false, false) => Ok(Tls::Files(TlsFiles { cert: PathBuf::from(cert), key: PathBuf::from(key) })),
        _ => Err(invalid(flag, format!("{flag} and its private key file must be given together"))),
    }
}

/// The admission webhook server (KEP-2699): with `CloudControllerManagerWebhook` on and
/// `--webhook-secure-port` not 0. Its flags are checked either way, and its port must differ
/// from `--secure-port` (upstream's rule).
fn webhook_serving(flags: &Flags, features: FeatureGates) -> Result<Option<WebhookSettings>, Error> {
    let tls_options = TlsOptions::parse(
        WEBHOOK_FLAGS,
        &flags.webhook_tls_min_version,
        &flags.webhook_tls_cipher_suites,
        &flags.webhook_tls_curve_preferences,
    )?;
    let ip = bind_ip("--webhook-bind-address", &flags.webhook_bind_address)?;
    let tls =
        certificate_pair("--webhook-tls-cert-file", &flags.webhook_tls_cert_file, &flags.webhook_tls_private_key_file)?;
    if flags.webhook_secure_port != 0 && flags.webhook_secure_port == flags.secure_port {
        return Err(invalid("--webhook-secure-port", "cannot be the same value as --secure-port"));
    }
    if !features.webhook || flags.webhook_secure_port == 0 {
        return Ok(None);
    }
    let http =
        HttpConfig::new(SocketAddr::new(ip, flags.webhook_secure_port)).with_tls(tls).with_tls_options(tls_options);
    Ok(Some(WebhookSettings { selection: flags.webhooks.clone(), http }))
}

/// The endpoint's delegated authentication and authorization flags.
fn delegated_auth(flags: &Flags) -> Result<AuthConfig, Error> {
    let always_allow_paths: Vec<String> =
        flags.authorization_always_allow_paths.iter().filter(|p| !p.is_empty()).cloned().collect();
    crate::serving::logic::validate_always_allow_paths(&always_allow_paths)
        .map_err(|m| invalid("--authorization-always-allow-paths", m))?;
    Ok(AuthConfig {
        authentication_kubeconfig: Some(flags.authentication_kubeconfig.clone()).filter(|s| !s.is_empty()),
        authorization_kubeconfig: Some(flags.authorization_kubeconfig.clone()).filter(|s| !s.is_empty()),
        ..AuthConfig::new(AuthSettings {
            always_allow_paths,
            token_ttl: flags.authentication_token_webhook_cache_ttl,
            allowed_ttl: flags.authorization_webhook_cache_authorized_ttl,
            denied_ttl: flags.authorization_webhook_cache_unauthorized_ttl,
            ..AuthSettings::default()
        })
    })
}

/// `-v` and `--logging-format`.
fn log_settings(flags: &Flags) -> Result<LogSettings, Error> {
    let json = match flags.logging_format.as_str() {
        "text" => false,
        "json" => true,
        other => return Err(invalid("--logging-format", format!("{other:?} is not one of text, json"))),
    };
    let level = match flags.verbosity {
        0..=2 => tracing::Level::INFO,
        3..=4 => tracing::Level::DEBUG,
        _ => tracing::Level::TRACE,
    };
    Ok(LogSettings { level, json })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serving::MinVersion;

    fn parse(args: &[&str]) -> Flags {
        let mut all = vec!["cloud-controller-manager"];
        all.extend_from_slice(args);
        Flags::try_parse_args(all).unwrap()
    }

    fn settings(args: &[&str]) -> Result<Settings, Error> {
        parse(args).settings()
    }

    fn rejected(args: &[&str], flag: &str) -> String {
        match settings(args) {
            Err(Error::InvalidFlag { flag: f, message }) => {
                assert_eq!(f, flag, "{message}");
                message
            }
            other => panic!("{args:?} should be rejected, got {other:?}"),
        }
    }

    #[test]
    fn defaults_match_upstream_section_3_2() {
        let f = parse(&[]);
        assert_eq!(f.cloud_provider, "");
        assert_eq!(f.controllers, ["*"]);
        assert_eq!(f.kube_api_qps, 20.0);
        assert_eq!(f.kube_api_burst, 30);
        assert_eq!(f.cluster_name, "kubernetes");
        assert!(f.configure_cloud_routes);
        assert_eq!(f.route_reconciliation_period, Duration::from_secs(10));
        assert_eq!(f.node_monitor_period, Duration::from_secs(5));
        assert_eq!(f.node_status_update_frequency, Duration::from_secs(300));
        assert_eq!(f.min_resync_period, Duration::from_secs(12 * 3600));
        assert!(f.leader_elect);
        assert_eq!(f.leader_elect_lease_duration, Duration::from_secs(15));
        assert_eq!(f.leader_elect_renew_deadline, Duration::from_secs(10));
        assert_eq!(f.leader_elect_retry_period, Duration::from_secs(2));
        assert_eq!(f.leader_elect_resource_lock, "leases");
        assert_eq!(f.leader_elect_resource_name, "cloud-controller-manager");
        assert_eq!(f.leader_elect_resource_namespace, "kube-system");
        assert_eq!(f.concurrent_node_syncs, 5, "deliberately above upstream's 1");
        assert_eq!(f.concurrent_node_status_updates, 0);
        assert_eq!(f.concurrent_service_syncs, 32, "deliberately above upstream's 1");
        assert_eq!(f.bind_address, "0.0.0.0");
        assert_eq!(f.secure_port, 10258);
        assert_eq!(f.webhook_secure_port, 10260);
        assert_eq!(f.authorization_always_allow_paths, ["/healthz", "/readyz", "/livez"]);
        let s = f.settings().unwrap();
        assert!(s.warnings.is_empty(), "{:?}", s.warnings);
        assert_eq!(s.options.controllers.enabled().len(), 4);
        assert_eq!((s.qps, s.burst), (20.0, 30));
        assert_eq!(s.http.unwrap().address, "0.0.0.0:10258".parse().unwrap());
        let le = s.leader_election.unwrap();
        assert_eq!((le.namespace.as_str(), le.name.as_str()), ("kube-system", "cloud-controller-manager"));
        assert!(s.exit_on_lost_lease, "upstream exits when the lease is lost");
        assert_eq!(s.options.node_batch_size, 500);
        assert_eq!(s.options.load_balancer_resync_period, None);
        assert_eq!(s.log.level, tracing::Level::INFO);
    }

    #[test]
    fn go_style_booleans_and_durations_are_accepted() {
        let s = settings(&[
            "--leader-elect=false",
            "--configure-cloud-routes=false",
            "--node-monitor-period=1m30s",
            "--allow-untagged-cloud",
            "-v=4",
        ])
        .unwrap();
        assert!(s.leader_election.is_none());
        assert!(!s.options.configure_cloud_routes);
        assert_eq!(s.options.node_monitor_period, Duration::from_secs(90));
        assert!(s.allow_untagged_cloud);
        assert_eq!(s.log.level, tracing::Level::DEBUG);
        assert!(s.warnings.iter().any(|w| w.contains("--allow-untagged-cloud")));
        assert!(Flags::try_parse_args(["ccm", "--leader-elect=maybe"]).is_err());
        assert!(Flags::try_parse_args(["ccm", "--node-monitor-period=5"]).is_err(), "a unit is required");
    }

    #[test]
    fn m2_controllers_flag_resolves_aliases_and_rejects_unknown_names() {
        let s = settings(&["--controllers=*,-route,service"]).unwrap();
        assert!(!s.options.controllers.is_enabled(crds::controllers::Controller::NodeRoute));
        assert!(s.options.controllers.is_enabled(crds::controllers::Controller::ServiceLb));
        let msg = rejected(&["--controllers=*,bogus"], "--controllers");
        assert!(msg.contains("not in the list of known controllers"), "{msg}");
    }

    #[test]
    fn values_that_would_break_the_manager_are_rejected() {
        // Upstream accepts 0 and then never initializes a node (section 6, item 7).
        assert!(rejected(&["--concurrent-node-syncs=0"], "--concurrent-node-syncs").contains("at least 1"));
        rejected(&["--concurrent-service-syncs=0"], "--concurrent-service-syncs");
        rejected(&["--concurrent-route-syncs=0"], "--concurrent-route-syncs");
        rejected(&["--concurrent-node-status-updates=-1"], "--concurrent-node-status-updates");
        rejected(&["--node-batch-size=0"], "--node-batch-size");
        rejected(&["--route-reconciliation-period=0s"], "--route-reconciliation-period");
        rejected(&["--leader-elect-resource-lock=endpoints"], "--leader-elect-resource-lock");
        rejected(&["--leader-elect-renew-deadline=20s"], "--leader-elect");
        rejected(&["--kube-api-qps=-1"], "--kube-api-qps");
        rejected(&["--kube-api-burst=0"], "--kube-api-burst");
        rejected(&["--bind-address=not-an-ip"], "--bind-address");
        rejected(&["--tls-cert-file=/tmp/cert.pem"], "--tls-cert-file");
        rejected(&["--ccm-resource=nonamespace"], "--ccm-resource");
        rejected(&["--logging-format=xml"], "--logging-format");
        rejected(&["--feature-gates=Foo=maybe"], "--feature-gates");
        // With leader election off, its timings are not checked.
        assert!(settings(&["--leader-elect=false", "--leader-elect-renew-deadline=20s"]).is_ok());
    }

    #[test]
    fn the_endpoint_is_https_with_delegated_auth_by_default_and_takes_upstreams_auth_flags() {
        let http = settings(&[]).unwrap().http.unwrap();
        assert_eq!(http.tls, Tls::SelfSigned);
        let auth = http.auth.unwrap();
        assert_eq!(auth.settings.always_allow_paths, ["/healthz", "/readyz", "/livez"]);
        assert_eq!(auth.settings.token_ttl, Duration::from_secs(10));
        assert_eq!(auth.settings.allowed_ttl, Duration::from_secs(10));
        assert_eq!(auth.settings.denied_ttl, Duration::from_secs(5));
        assert_eq!((auth.authentication_kubeconfig, auth.authorization_kubeconfig), (None, None));

        let http = settings(&[
            "--tls-cert-file=/etc/tls/tls.crt",
            "--tls-private-key-file=/etc/tls/tls.key",
            "--authentication-kubeconfig=/etc/kubernetes/authn.conf",
            "--authorization-kubeconfig=/etc/kubernetes/authz.conf",
            "--authorization-always-allow-paths=/healthz,/metrics",
            "--authentication-token-webhook-cache-ttl=1m",
            "--authorization-webhook-cache-unauthorized-ttl=0s",
        ])
        .unwrap()
        .http
        .unwrap();
        assert!(matches!(&http.tls, Tls::Files(f) if f.cert == PathBuf::from("/etc/tls/tls.crt")));
        let auth = http.auth.unwrap();
        assert_eq!(auth.settings.always_allow_paths, ["/healthz", "/metrics"]);
        assert_eq!(auth.settings.token_ttl, Duration::from_secs(60));
        assert_eq!(auth.settings.denied_ttl, Duration::ZERO);
        assert_eq!(auth.authentication_kubeconfig.as_deref(), Some("/etc/kubernetes/authn.conf"));
        assert_eq!(auth.authorization_kubeconfig.as_deref(), Some("/etc/kubernetes/authz.conf"));
        // An empty list allows nothing without a token; a malformed entry is refused.
        let none = settings(&["--authorization-always-allow-paths="]).unwrap().http.unwrap().auth.unwrap();
        assert!(none.settings.always_allow_paths.is_empty());
        rejected(&["--authorization-always-allow-paths=healthz"], "--authorization-always-allow-paths");
        rejected(&["--authorization-always-allow-paths=/a*b"], "--authorization-always-allow-paths");
    }

    #[test]
    fn tls_min_version_and_cipher_suites_reach_the_endpoint_or_are_refused_naming_the_flag() {
        let http = settings(&[
            "--tls-min-version=VersionTLS13",
            "--tls-cipher-suites=TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,TLS_AES_128_GCM_SHA256",
        ])
        .unwrap()
        .http
        .unwrap();
        assert_eq!(http.tls_options.min_version, MinVersion::Tls13);
        assert_eq!(http.tls_options.cipher_suites, ["TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256", "TLS_AES_128_GCM_SHA256"]);
        let s = settings(&["--tls-min-version=VersionTLS12"]).unwrap();
        assert!(s.warnings.iter().all(|w| !w.contains("--tls-")), "{:?}", s.warnings);
        assert_eq!(settings(&[]).unwrap().http.unwrap().tls_options, TlsOptions::default());
        assert!(rejected(&["--tls-min-version=VersionTLS10"], "--tls-min-version").contains("VersionTLS10"));
        assert!(rejected(&["--tls-min-version=VersionTLS11"], "--tls-min-version").contains("VersionTLS11"));
        let msg = rejected(&["--tls-cipher-suites=TLS_RSA_WITH_AES_128_CBC_SHA"], "--tls-cipher-suites");
        assert!(msg.contains("TLS_RSA_WITH_AES_128_CBC_SHA"), "{msg}");
        // Refused even with the endpoint off.
        rejected(&["--secure-port=0", "--tls-cipher-suites=TLS_BOGUS"], "--tls-cipher-suites");
    }

    #[test]
    fn zero_qps_disables_the_limit_and_zero_port_disables_serving() {
        let s = settings(&["--kube-api-qps=0", "--kube-api-burst=0", "--secure-port=0"]).unwrap();
        assert_eq!(s.qps, 0.0);
        assert!(s.http.is_none());
    }

    #[test]
    fn r3_no_op_and_deprecated_flags_are_accepted_with_a_warning() {
        let s = settings(&[
            "--allocate-node-cidrs=true",
            "--cidr-allocator-type=CloudAllocator",
            "--node-sync-period=10s",
            "--use-service-account-credentials=true",
            "--profiling=false",
            "--authentication-skip-lookup",
            "--feature-gates=CloudControllerManagerWebhook=true,SomethingElse=false",
            "--leader-migration-config=/etc/migration.yaml",
            "--cert-dir=/var/run/certs",
        ])
        .unwrap();
        for flag in [
            "--allocate-node-cidrs",
            "--cidr-allocator-type",
            "--node-sync-period",
            "--use-service-account-credentials",
            "--profiling",
            "--authentication-skip-lookup",
            "SomethingElse",
            "--leader-migration-config",
            "--cert-dir",
        ] {
            assert!(s.warnings.iter().any(|w| w.contains(flag)), "no warning for {flag}: {:?}", s.warnings);
        }
    }

    #[test]
    fn m7_leader_migration_flags_give_upstreams_default_or_the_file_and_need_leader_election() {
        let s = settings(&["--enable-leader-migration"]).unwrap();
        assert_eq!(s.leader_migration, Some(LeaderMigrationConfiguration::upstream_default()));
        assert!(s.warnings.is_empty(), "{:?}", s.warnings);
        assert!(settings(&[]).unwrap().leader_migration.is_none());
        let msg = rejected(&["--enable-leader-migration", "--leader-elect=false"], "--enable-leader-migration");
        assert!(msg.contains("--leader-elect"), "{msg}");
        rejected(
            &["--enable-leader-migration", "--leader-migration-config=/nonexistent/m.yaml"],
            "--leader-migration-config",
        );
        let path = std::env::temp_dir().join(format!("ccm-flags-migration-{}.yaml", std::process::id()));
        std::fs::write(&path, "apiVersion: controllermanager.config.k8s.io/v1alpha1\nkind: LeaderMigrationConfiguration\nleaderName: moving\nresourceLock: leases\ncontrollerLeaders: [{name: cloud-node, component: '*'}]\n").unwrap();
        let arg = format!("--leader-migration-config={}", path.display());
        let s = settings(&["--enable-leader-migration", &arg]).unwrap();
        let m = s.leader_migration.unwrap();
        assert_eq!(m.leader_name, "moving");
        assert_eq!(m.placement("cloud-node-controller"), crate::leader_migration::Placement::Migrated);
        std::fs::write(&path, "apiVersion: controllermanager.config.k8s.io/v1alpha1\nkind: LeaderMigrationConfiguration\nresourceLock: leases\n").unwrap();
        let msg = rejected(&["--enable-leader-migration", &arg], "--leader-migration-config");
        assert!(msg.contains("leaderName"), "{msg}");
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn m7_the_migration_lease_namespace_defaults_to_the_main_leases_and_is_checked() {
        let s = settings(&["--enable-leader-migration", "--leader-elect-resource-namespace=ccm-a"]).unwrap();
        assert_eq!(s.leader_migration_namespace, "ccm-a");
        let s = settings(&["--enable-leader-migration", "--leader-migration-lease-namespace=ccm-moving"]).unwrap();
        assert_eq!(s.leader_migration_namespace, "ccm-moving");
        assert_eq!(s.leader_election.unwrap().namespace, "kube-system", "the main Lease stays where it was");
        let msg = rejected(
            &["--enable-leader-migration", "--leader-migration-lease-namespace=Not_A_Namespace"],
            "--leader-migration-lease-namespace",
        );
        assert!(!msg.contains("Not_A_Namespace"), "{msg}");
        let s = settings(&["--leader-migration-lease-namespace=ccm-moving"]).unwrap();
        assert!(s.warnings.iter().any(|w| w.contains("--leader-migration-lease-namespace")), "{:?}", s.warnings);
    }

    #[test]
    fn additions_fill_the_controller_options() {
        let s = settings(&[
            "--concurrent-route-syncs=4",
            "--node-batch-size=50",
            "--node-batch-window=250ms",
            "--node-deletion-grace-period=2m",
            "--load-balancer-class=example.com/lb",
            "--load-balancer-resync-period=10m",
            "--ccm-resource=kube-system/mycloud",
            "--exit-on-lost-lease=false",
        ])
        .unwrap();
        let o = &s.options;
        assert_eq!(o.concurrent_route_syncs, 4);
        assert_eq!(o.node_batch_size, 50);
        assert_eq!(o.node_batch_window, Duration::from_millis(250));
        assert_eq!(o.node_deletion_grace_period, Duration::from_secs(120));
        assert_eq!(o.load_balancer_class.as_deref(), Some("example.com/lb"));
        assert_eq!(o.load_balancer_resync_period, Some(Duration::from_secs(600)));
        assert_eq!(s.ccm_resource.unwrap().to_string(), "kube-system/mycloud");
        assert!(!s.exit_on_lost_lease);
    }
}
