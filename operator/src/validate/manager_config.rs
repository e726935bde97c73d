//! Spec to [`ManagerConfig`] (pure): the manager configuration a resource asks for, checked as
//! the binary checks it at start, and the leader-migration settings read from the spec.

use ccm_framework::config::{LeaderElectionSettings, LeaderMigrationSource, ManagerConfig, workers};
use ccm_framework::leader_migration::{self, ControllerLeader, LeaderMigrationConfiguration};
use crds::controllers::{ControllerSelection, UnknownController};
use crds::{CloudControllerManager, Mode};
use kube::{Resource, ResourceExt};

use super::verdict::Failure;
use crds::reasons::config_valid as reason;

/// `spec.controllers` resolved: a reconcile resolves it once and hands it to every step.
pub type Controllers = Result<ControllerSelection, UnknownController>;

/// The manager configuration `cr` asks for, with the cloud-config (Secret key `cloud_config_key`)
/// at its path in the manager pod, checked as the binary checks it at start. A failure's
/// message names the spec field.
pub fn manager_config(cr: &CloudControllerManager, cloud_config_key: Option<&str>) -> Result<ManagerConfig, Failure> {
    manager_config_with(cr, cloud_config_key, &ControllerSelection::parse(&cr.spec.controllers))
}

/// [`manager_config`] with `spec.controllers` already resolved.
pub fn manager_config_with(
    cr: &CloudControllerManager,
    cloud_config_key: Option<&str>,
    controllers: &Controllers,
) -> Result<ManagerConfig, Failure> {
    let spec = &cr.spec;
    let failure =
        |field: &str, message: String| Failure { reason: reason::INVALID_SPEC, message: format!("{field}: {message}") };
    let controllers = controllers.clone().map_err(|e| failure("spec.controllers", e.to_string()))?;
    let concurrency = |field: &'static str, flag: &'static str, n: i32| {
        workers(flag, i64::from(n)).map_err(|e| failure(field, e.to_string()))
    };
    let namespace = cr.namespace().unwrap_or_default();
    let name = cr.name_any();
    let le = &spec.leader_election;
    let migration_failure = |message: String| failure("spec.leaderElection.migration", message);
    let leader_migration = match leader_migration_of(spec).map_err(|e| migration_failure(e.to_string()))? {
        None if le.migration.as_ref().is_some_and(|m| m.enabled) => Some(LeaderMigrationSource::Default),
        None => None,
        // Checked below as the binary checks a file; a pod then reads it from its file.
        Some(m) => Some(LeaderMigrationSource::Inline(m)),
    };
    let mut config = ManagerConfig {
        provider: spec.provider.clone(),
        cloud_config: cloud_config_key.map(|key| crate::names::cloud_config_path(key).into()),
        controllers,
        cluster_name: spec.cluster_name.clone(),
        cluster_cidr: spec.cluster_cidr.clone().filter(|c| !c.trim().is_empty()),
        configure_cloud_routes: spec.configure_cloud_routes,
        concurrent_node_syncs: concurrency(
            "spec.concurrency.nodeSyncs",
            "--concurrent-node-syncs",
            spec.concurrency.node_syncs,
        )?,
        concurrent_service_syncs: concurrency(
            "spec.concurrency.serviceSyncs",
            "--concurrent-service-syncs",
            spec.concurrency.service_syncs,
        )?,
        concurrent_route_syncs: concurrency(
            "spec.concurrency.routeSyncs",
            "--concurrent-route-syncs",
            spec.concurrency.route_syncs,
        )?,
        leader_election: LeaderElectionSettings {
            enabled: true,
            namespace: namespace.clone(),
            name: name.clone(),
            lease_duration: le.lease_duration.into(),
            renew_deadline: le.renew_deadline.into(),
            retry_period: le.retry_period.into(),
        },
        leader_migration,
        // Rendered only when it differs: a resource that names its own namespace keeps its args.
        leader_migration_namespace: migration_lease_namespace(cr).filter(|l| *l != namespace),
        load_balancer_class: spec.load_balancer_class.clone(),
        handle_unclassed_services: spec.handle_unclassed_services,
        secure_port: crds::defaults::SECURE_PORT,
        // An upstream manager has no --ccm-resource: the operator alone writes its status.
        ccm_resource: spec.upstream.is_none().then_some(ccm_framework::status::StatusTarget { namespace, name }),
        extra_args: spec.extra_args.clone(),
        shadow: spec.shadow,
        orphan_sweep: spec.orphans.sweep,
        node_ownership: ccm_framework::ownership::NodeOwnership::of(&spec.node_platforms)
            .map_err(|m| failure("spec.nodePlatforms", m))?,
    };
    config.check().map_err(|e| match e {
        ccm_framework::Error::InvalidFlag {
            flag: "--leader-migration-config" | "--enable-leader-migration",
            message,
        } => migration_failure(message),
        ccm_framework::Error::InvalidFlag { flag: "--shadow", message } => failure("spec.shadow", message),
        ccm_framework::Error::InvalidFlag { flag: "--orphan-sweep", message } => failure("spec.orphans.sweep", message),
        ccm_framework::Error::InvalidFlag { message, .. } => failure("spec.leaderElection", message),
        other => failure("spec", other.to_string()),
    })?;
    if spec.mode != Mode::Embedded && matches!(config.leader_migration, Some(LeaderMigrationSource::Inline(_))) {
        // The pod reads it from the file projected from its template's annotation (build.rs).
        config.leader_migration = Some(LeaderMigrationSource::File(crate::names::leader_migration_path().into()));
    }
    Ok(config)
}

/// The leader-migration configuration `spec.leaderElection.migration` gives when it names a
/// `leaderName` or `controllerLeaders` (the rest from upstream's default); `None` when
/// migration is off or runs upstream's default unchanged (pure).
pub fn leader_migration_of(
    spec: &crds::CloudControllerManagerSpec,
) -> Result<Option<LeaderMigrationConfiguration>, ccm_framework::safe_yaml::DocumentError> {
    let Some(m) = spec.leader_election.migration.as_ref().filter(|m| m.enabled) else { return Ok(None) };
    if m.leader_name.is_none() && m.controller_leaders.is_none() {
        return Ok(None);
    }
    let default = LeaderMigrationConfiguration::upstream_default();
    let config = LeaderMigrationConfiguration {
        leader_name: m.leader_name.clone().unwrap_or(default.leader_name),
        controller_leaders: match &m.controller_leaders {
            Some(list) => list.iter().map(|l| ControllerLeader::new(l.name.clone(), l.component.clone())).collect(),
            None => default.controller_leaders,
        },
    };
    config.validate()?;
    Ok(Some(config))
}

/// The leader-migration configuration a valid spec runs, upstream's default included; `None`
/// when migration is off (pure).
pub fn effective_leader_migration(spec: &crds::CloudControllerManagerSpec) -> Option<LeaderMigrationConfiguration> {
    spec.leader_election.migration.as_ref().filter(|m| m.enabled)?;
    match leader_migration_of(spec) {
        Ok(Some(m)) => Some(m),
        Ok(None) => Some(LeaderMigrationConfiguration::upstream_default()),
        Err(_) => None,
    }
}

/// The migration Lease's name when leader migration is on (pure).
pub fn migration_lease_name(spec: &crds::CloudControllerManagerSpec) -> Option<String> {
    let m = spec.leader_election.migration.as_ref().filter(|m| m.enabled)?;
    Some(m.leader_name.clone().unwrap_or_else(|| leader_migration::DEFAULT_LEADER_NAME.to_string()))
}

/// The migration Lease's namespace when leader migration is on: `leaseNamespace`, else the
/// resource's own (pure).
pub fn migration_lease_namespace(cr: &CloudControllerManager) -> Option<String> {
    let m = cr.spec.leader_election.migration.as_ref().filter(|m| m.enabled)?;
    Some(m.lease_namespace.clone().unwrap_or_else(|| cr.namespace().unwrap_or_default()))
}

/// The migration Lease's namespace when it is not the resource's own, i.e. where the operator
/// grants the manager that one Lease (pure).
pub fn foreign_lease_namespace(cr: &CloudControllerManager) -> Option<String> {
    migration_lease_namespace(cr).filter(|l| Some(l.as_str()) != cr.meta().namespace.as_deref())
}
