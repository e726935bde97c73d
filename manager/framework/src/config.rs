//! [`ManagerConfig`]: what a manager is asked to run, typed and validated once.
//!
//! The operator makes one from a CloudControllerManager and either renders it as the manager
//! pod's arguments ([`ManagerConfig::to_args`]) or runs it in Embedded mode
//! ([`ManagerConfig::controller_options`], [`ManagerConfig::leader_election_config`]); the
//! binary reads it back from those arguments (the program's `Flags::manager_config`). Both
//! roads run [`ManagerConfig::check`], the binary's start-up checks, so a configuration one
//! road refuses the other refuses too.

use std::path::PathBuf;
use std::time::Duration;

use crds::controllers::ControllerSelection;
use crds::defaults;
use crds::validation::parse_cluster_cidrs;

use crate::error::Error;
use crate::leader::LeaderElectionConfig;
use crate::leader_migration::LeaderMigrationConfiguration;
use crate::options::ControllerOptions;
use crate::ownership::NodeOwnership;
use crate::status::StatusTarget;

/// Leader election as configured (`--leader-elect*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderElectionSettings {
    /// `--leader-elect`.
    pub enabled: bool,
    /// `--leader-elect-resource-namespace`.
    pub namespace: String,
    /// `--leader-elect-resource-name`.
    pub name: String,
    /// `--leader-elect-lease-duration`.
    pub lease_duration: Duration,
    /// `--leader-elect-renew-deadline`.
    pub renew_deadline: Duration,
    /// `--leader-elect-retry-period`.
    pub retry_period: Duration,
}

impl Default for LeaderElectionSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            namespace: defaults::LEASE_NAMESPACE.to_string(),
            name: defaults::LEASE_NAME.to_string(),
            lease_duration: defaults::LEASE_DURATION,
            renew_deadline: defaults::RENEW_DEADLINE,
            retry_period: defaults::RETRY_PERIOD,
        }
    }
}

/// Where a manager's leader-migration configuration comes from (`--enable-leader-migration`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaderMigrationSource {
    /// Upstream's default configuration (no `--leader-migration-config`).
    Default,
    /// `--leader-migration-config`: a `LeaderMigrationConfiguration` file.
    File(PathBuf),
    /// The configuration itself (Embedded mode, which has no files). [`ManagerConfig::to_args`]
    /// cannot render it: a pod gets it as a [`LeaderMigrationSource::File`].
    Inline(LeaderMigrationConfiguration),
}

/// One manager's configuration: every setting the operator derives from a resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManagerConfig {
    /// `--cloud-provider`.
    pub provider: String,
    /// `--cloud-config`: the file the provider reads (Embedded mode hands it the bytes instead).
    pub cloud_config: Option<PathBuf>,
    /// `--controllers`, resolved once.
    pub controllers: ControllerSelection,
    /// `--cluster-name`.
    pub cluster_name: String,
    /// `--cluster-cidr` as given; `None` when empty. An unusable value is the route
    /// controller's to report, not a reason to refuse the configuration.
    pub cluster_cidr: Option<String>,
    /// `--configure-cloud-routes`.
    pub configure_cloud_routes: bool,
    /// `--concurrent-node-syncs` (at least 1).
    pub concurrent_node_syncs: usize,
    /// `--concurrent-service-syncs` (at least 1).
    pub concurrent_service_syncs: usize,
    /// `--concurrent-route-syncs` (at least 1).
    pub concurrent_route_syncs: usize,
    /// `--leader-elect*`.
    pub leader_election: LeaderElectionSettings,
    /// `--enable-leader-migration` (and `--leader-migration-config`); `None`: off.
    pub leader_migration: Option<LeaderMigrationSource>,
    /// `--leader-migration-lease-namespace` (addition): the migration Lease's namespace; `None`:
    /// the main Lease's, as upstream.
    pub leader_migration_namespace: Option<String>,
    /// `--load-balancer-class`; `None` when empty.
    pub load_balancer_class: Option<String>,
    /// `--handle-unclassed-services` (addition): with a class, also Services without one (S28).
    pub handle_unclassed_services: bool,
    /// `--secure-port` (0: no endpoint).
    pub secure_port: u16,
    /// `--ccm-resource`: the resource the leader reports provider health on.
    pub ccm_resource: Option<StatusTarget>,
    /// Arguments appended after the rendered ones (`spec.extraArgs`); they are not read back.
    pub extra_args: Vec<String>,
    /// `--shadow` (addition): every controller decides without acting (docs/shadow.md).
    pub shadow: bool,
    /// `--orphan-sweep` (addition, `spec.orphans.sweep`): delete orphaned cloud objects (S35).
    pub orphan_sweep: bool,
    /// `--cloud-provider-platforms` (addition, `spec.nodePlatforms`): the Nodes this manager owns.
    pub node_ownership: NodeOwnership,
}

impl Default for ManagerConfig {
    /// The binary's defaults.
    fn default() -> Self {
        Self {
            provider: String::new(),
            cloud_config: None,
            controllers: ControllerSelection::all(),
            cluster_name: defaults::CLUSTER_NAME.to_string(),
            cluster_cidr: None,
            configure_cloud_routes: true,
            concurrent_node_syncs: defaults::CONCURRENT_NODE_SYNCS as usize,
            concurrent_service_syncs: defaults::CONCURRENT_SERVICE_SYNCS as usize,
            concurrent_route_syncs: defaults::CONCURRENT_ROUTE_SYNCS as usize,
            leader_election: LeaderElectionSettings::default(),
            leader_migration: None,
            leader_migration_namespace: None,
            load_balancer_class: None,
            handle_unclassed_services: false,
            secure_port: defaults::SECURE_PORT,
            ccm_resource: None,
            extra_args: Vec::new(),
            shadow: false,
            orphan_sweep: false,
            node_ownership: NodeOwnership::all(),
        }
    }
}

/// A worker count as configured, checked: the one place "at least 1" is decided.
pub fn workers(flag: &'static str, value: i64) -> Result<usize, Error> {
    if value < i64::from(defaults::MIN_WORKERS) {
        return Err(Error::InvalidFlag {
            flag,
            message: format!("must be at least {}, got {value}", defaults::MIN_WORKERS),
        });
    }
    usize::try_from(value).map_err(|_| Error::InvalidFlag { flag, message: "is too large".into() })
}

/// A Go duration string (`15s`, `1500ms`) for a flag, read back exactly by
/// [`crate::go_values::parse_duration`].
pub fn go_duration(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{}s", d.as_secs())
    } else if d.subsec_nanos().is_multiple_of(1_000_000) {
        format!("{}ms", d.as_millis())
    } else {
        format!("{}ns", d.as_nanos())
    }
}

impl ManagerConfig {
    /// The binary's start-up checks of these settings (the flag parser and Embedded mode both
    /// call this): worker counts and, with leader election, its timing rule.
    pub fn check(&self) -> Result<(), Error> {
        for (flag, n) in [
            ("--concurrent-node-syncs", self.concurrent_node_syncs),
            ("--concurrent-service-syncs", self.concurrent_service_syncs),
            ("--concurrent-route-syncs", self.concurrent_route_syncs),
        ] {
            workers(flag, i64::try_from(n).unwrap_or(i64::MAX))?;
        }
        if self.leader_election.enabled {
            let le = &self.leader_election;
            crds::validation::leader_election_timings(le.lease_duration, le.renew_deadline, le.retry_period)
                .map_err(|message| Error::InvalidFlag { flag: "--leader-elect", message })?;
        }
        self.leader_migration_config()?;
        self.check_shadow()?;
        if self.handle_unclassed_services && self.load_balancer_class.is_none() {
            return Err(Error::InvalidFlag {
                flag: "--handle-unclassed-services",
                message:
                    "needs --load-balancer-class (without a class the manager already handles Services without one)"
                        .into(),
            });
        }
        Ok(())
    }

    /// A shadow manager never joins the election of the manager it shadows (docs/shadow.md).
    fn check_shadow(&self) -> Result<(), Error> {
        if !self.shadow {
            return Ok(());
        }
        if self.orphan_sweep {
            return Err(Error::InvalidFlag {
                flag: "--orphan-sweep",
                message: "a shadow manager deletes nothing; turn off --shadow or --orphan-sweep".into(),
            });
        }
        if self.leader_migration.is_some() {
            return Err(Error::InvalidFlag {
                flag: "--shadow",
                message: "a shadow manager takes no part in leader migration; turn off --enable-leader-migration"
                    .into(),
            });
        }
        if self.leader_election.name == defaults::LEASE_NAME {
            return Err(Error::InvalidFlag {
                flag: "--leader-elect-resource-name",
                message: format!(
                    "a shadow manager must not use the Lease {:?} of the manager it shadows; give it its own",
                    defaults::LEASE_NAME
                ),
            });
        }
        Ok(())
    }

    /// The leader-migration configuration to run, read and validated (a file is read here);
    /// `None` when migration is off. Migration needs leader election, as upstream's does.
    pub fn leader_migration_config(&self) -> Result<Option<LeaderMigrationConfiguration>, Error> {
        let Some(source) = &self.leader_migration else { return Ok(None) };
        if !self.leader_election.enabled {
            return Err(Error::InvalidFlag {
                flag: "--enable-leader-migration",
                message: "leader migration needs leader election; set --leader-elect=true or turn migration off".into(),
            });
        }
        let config = match source {
            LeaderMigrationSource::Default => LeaderMigrationConfiguration::upstream_default(),
            LeaderMigrationSource::File(path) => LeaderMigrationConfiguration::read_file(path)
                .map_err(|message| Error::InvalidFlag { flag: "--leader-migration-config", message })?,
            LeaderMigrationSource::Inline(config) => {
                config
                    .validate()
                    .map_err(|e| Error::InvalidFlag { flag: "--leader-migration-config", message: e.to_string() })?;
                config.clone()
            }
        };
        if let Some(ns) = &self.leader_migration_namespace
            && !crds::validation::is_dns_label(ns)
        {
            return Err(Error::InvalidFlag {
                flag: "--leader-migration-lease-namespace",
                message: "must be a namespace name: lowercase letters, digits and '-', at most 63 characters".into(),
            });
        }
        if config.leader_name == self.leader_election.name
            && self.migration_lease_namespace() == self.leader_election.namespace
        {
            return Err(Error::InvalidFlag {
                flag: "--leader-migration-config",
                message:
                    "leaderName must differ from --leader-elect-resource-name: the migration Lease is a second Lease"
                        .into(),
            });
        }
        Ok(Some(config))
    }

    /// The migration Lease's namespace: `--leader-migration-lease-namespace`, else the main
    /// Lease's (upstream keeps both in `--leader-elect-resource-namespace`).
    pub fn migration_lease_namespace(&self) -> &str {
        self.leader_migration_namespace.as_deref().unwrap_or(&self.leader_election.namespace)
    }

    /// The manager's command-line arguments: every field, then [`ManagerConfig::extra_args`].
    pub fn to_args(&self) -> Vec<String> {
        let le = &self.leader_election;
        let mut args = vec![format!("--cloud-provider={}", self.provider)];
        if let Some(path) = &self.cloud_config {
            args.push(format!("--cloud-config={}", path.display()));
        }
        args.push(format!("--controllers={}", self.controllers));
        args.push(format!("--cluster-name={}", self.cluster_name));
        if let Some(cidr) = &self.cluster_cidr {
            args.push(format!("--cluster-cidr={cidr}"));
        }
        args.push(format!("--configure-cloud-routes={}", self.configure_cloud_routes));
        args.extend([
            format!("--leader-elect={}", le.enabled),
            format!("--leader-elect-resource-name={}", le.name),
            format!("--leader-elect-resource-namespace={}", le.namespace),
            format!("--leader-elect-lease-duration={}", go_duration(le.lease_duration)),
            format!("--leader-elect-renew-deadline={}", go_duration(le.renew_deadline)),
            format!("--leader-elect-retry-period={}", go_duration(le.retry_period)),
            format!("--concurrent-node-syncs={}", self.concurrent_node_syncs),
            format!("--concurrent-service-syncs={}", self.concurrent_service_syncs),
            format!("--concurrent-route-syncs={}", self.concurrent_route_syncs),
        ]);
        match &self.leader_migration {
            None => {}
            Some(LeaderMigrationSource::File(path)) => {
                args.push("--enable-leader-migration=true".into());
                args.push(format!("--leader-migration-config={}", path.display()));
            }
            Some(LeaderMigrationSource::Default | LeaderMigrationSource::Inline(_)) => {
                args.push("--enable-leader-migration=true".into())
            }
        }
        if let Some(ns) = &self.leader_migration_namespace {
            args.push(format!("--leader-migration-lease-namespace={ns}"));
        }
        if let Some(class) = &self.load_balancer_class {
            args.push(format!("--load-balancer-class={class}"));
        }
        if self.handle_unclassed_services {
            args.push("--handle-unclassed-services=true".into());
        }
        args.push(format!("--secure-port={}", self.secure_port));
        if let Some(target) = &self.ccm_resource {
            args.push(format!("--ccm-resource={target}"));
        }
        if self.shadow {
            args.push("--shadow=true".into());
        }
        if self.orphan_sweep {
            args.push("--orphan-sweep=true".into());
        }
        if self.node_ownership.is_restricted() {
            args.push(format!("--cloud-provider-platforms={}", self.node_ownership.platforms().join(",")));
        }
        args.extend(self.extra_args.iter().cloned());
        args
    }

    /// The engine's options for these settings; every other option keeps its default (the
    /// binary's flags set them).
    pub fn controller_options(&self) -> ControllerOptions {
        let (cluster_cidrs, cluster_cidr_error) = match self.cluster_cidr.as_deref().filter(|c| !c.trim().is_empty()) {
            None => (Vec::new(), None),
            Some(c) => match parse_cluster_cidrs(c) {
                Ok(nets) => (nets, None),
                Err(e) => (Vec::new(), Some(format!("--cluster-cidr: {e}"))),
            },
        };
        ControllerOptions {
            cluster_name: self.cluster_name.clone(),
            cluster_cidrs,
            cluster_cidr_error,
            configure_cloud_routes: self.configure_cloud_routes,
            controllers: self.controllers.clone(),
            concurrent_node_syncs: self.concurrent_node_syncs,
            concurrent_service_syncs: self.concurrent_service_syncs,
            concurrent_route_syncs: self.concurrent_route_syncs,
            load_balancer_class: self.load_balancer_class.clone(),
            handle_unclassed_services: self.handle_unclassed_services,
            shadow: self.shadow,
            orphan_sweep: self.orphan_sweep,
            node_ownership: self.node_ownership.clone(),
            ..ControllerOptions::default()
        }
    }

    /// The leader election to run as `identity`, unless it is off. The Lease is released on
    /// graceful shutdown.
    pub fn leader_election_config(&self, identity: &str) -> Option<LeaderElectionConfig> {
        let le = &self.leader_election;
        le.enabled.then(|| LeaderElectionConfig {
            namespace: le.namespace.clone(),
            name: le.name.clone(),
            identity: identity.to_string(),
            lease_duration: le.lease_duration,
            renew_deadline: le.renew_deadline,
            retry_period: le.retry_period,
            release_on_cancel: true,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_refuses_zero_workers_and_bad_timings_only_with_leader_election() {
        let zero = ManagerConfig { concurrent_route_syncs: 0, ..ManagerConfig::default() };
        assert!(matches!(zero.check(), Err(Error::InvalidFlag { flag: "--concurrent-route-syncs", .. })));
        let mut bad = ManagerConfig::default();
        bad.leader_election.renew_deadline = Duration::from_secs(20);
        assert!(matches!(bad.check(), Err(Error::InvalidFlag { flag: "--leader-elect", .. })));
        bad.leader_election.enabled = false;
        assert!(bad.check().is_ok());
    }

    #[test]
    fn m7_leader_migration_needs_leader_election_and_a_valid_file_naming_the_flag() {
        let mut config =
            ManagerConfig { leader_migration: Some(LeaderMigrationSource::Default), ..ManagerConfig::default() };
        assert_eq!(config.leader_migration_config().unwrap(), Some(LeaderMigrationConfiguration::upstream_default()));
        config.leader_election.enabled = false;
        assert!(matches!(config.check(), Err(Error::InvalidFlag { flag: "--enable-leader-migration", .. })));
        config.leader_election.enabled = true;
        config.leader_migration = Some(LeaderMigrationSource::File("/nonexistent/migration.yaml".into()));
        assert!(matches!(config.check(), Err(Error::InvalidFlag { flag: "--leader-migration-config", .. })));
        let same = LeaderMigrationConfiguration {
            leader_name: config.leader_election.name.clone(),
            controller_leaders: Vec::new(),
        };
        config.leader_migration = Some(LeaderMigrationSource::Inline(same));
        assert!(matches!(config.check(), Err(Error::InvalidFlag { flag: "--leader-migration-config", .. })));
        // The same name in another namespace is another Lease.
        config.leader_migration_namespace = Some("ccm-moving".into());
        assert!(config.check().is_ok());
        assert_eq!(config.migration_lease_namespace(), "ccm-moving");
        config.leader_migration_namespace = Some("Not_A_Namespace".into());
        assert!(matches!(config.check(), Err(Error::InvalidFlag { flag: "--leader-migration-lease-namespace", .. })));
    }

    #[test]
    fn go_durations_read_back_exactly() {
        for d in [Duration::from_secs(15), Duration::from_millis(1500), Duration::from_nanos(7)] {
            assert_eq!(crate::go_values::parse_duration(&go_duration(d)), Ok(d));
        }
    }
}
