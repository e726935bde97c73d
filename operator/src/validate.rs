//! Validation (pure): is a CloudControllerManager usable as specified? Produces the
//! `ConfigValid` verdict and, when valid, what the build step needs.
//!
//! Inputs are already dereferenced (the Secret's state, the other CRs); the only thing this
//! module calls is the provider's factory, which the registry contract makes cheap and free of
//! side effects.

use std::fmt;

use ccm_framework::config::{LeaderElectionSettings, LeaderMigrationSource, ManagerConfig, workers};
use ccm_framework::leader_migration::{self, ControllerLeader, LeaderMigrationConfiguration, Placement};
use ccm_framework::registry::{ClusterSettings, Registry, RegistryError};
use crds::controllers::{Controller, ControllerSelection, route_controller_runs};
use crds::validation::{parse_cluster_cidrs, validate_spec};
use crds::{CloudControllerManager, Mode};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{Resource, ResourceExt};

use crate::hash;
use crds::reasons::config_valid as reason;

/// What the dereference step found for the cloud-config Secret.
#[derive(Clone)]
pub enum SecretState {
    /// The spec references no Secret.
    NotReferenced,
    /// The Secret does not exist.
    NotFound {
        /// Secret name.
        name: String,
    },
    /// The Secret exists but lacks the key.
    KeyNotFound {
        /// Secret name.
        name: String,
        /// The missing key.
        key: String,
    },
    /// The cloud-config was read.
    Found {
        /// Secret name.
        name: String,
        /// The key.
        key: String,
        /// The value; never logged or copied into messages.
        data: Vec<u8>,
    },
    /// Reading the Secret failed with an API error (transient).
    Unreadable {
        /// Secret name.
        name: String,
        /// The API error, which never carries the Secret's content.
        error: String,
    },
}

impl fmt::Debug for SecretState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SecretState::NotReferenced => f.write_str("NotReferenced"),
            SecretState::NotFound { name } => f.debug_struct("NotFound").field("name", name).finish(),
            SecretState::KeyNotFound { name, key } => {
                f.debug_struct("KeyNotFound").field("name", name).field("key", key).finish()
            }
            // The content stays out of debug output.
            SecretState::Found { name, key, data } => {
                f.debug_struct("Found").field("name", name).field("key", key).field("bytes", &data.len()).finish()
            }
            SecretState::Unreadable { name, error } => {
                f.debug_struct("Unreadable").field("name", name).field("error", error).finish()
            }
        }
    }
}

/// The controllers a CloudControllerManager would run, as far as conflicts go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    /// Namespace of the CR.
    pub namespace: String,
    /// Name of the CR.
    pub name: String,
    /// UID of the CR.
    pub uid: String,
    /// Creation time; older CRs win conflicts.
    pub created: Option<Time>,
    /// Enabled node controllers (cloud-node, cloud-node-lifecycle).
    pub node_controllers: Vec<&'static str>,
    /// Whether it would run the route controller (enabled and `configureCloudRoutes`).
    pub routes: bool,
    /// When it runs the service controller, the `loadBalancerClass`es it takes (`None`: Services
    /// without one): its class, and no class too with `handleUnclassedServices`.
    pub services: Option<Vec<Option<String>>>,
    /// With leader migration: the migration Lease (namespace, name) and the controllers it runs
    /// under it. Two resources that migrate a controller under the same Lease never run it at
    /// once, so it is no conflict.
    pub migration: Option<((String, String), Vec<&'static str>)>,
}

impl Peer {
    /// The conflict view of a CR, or `None` when it cannot run at all (being deleted, invalid
    /// spec, unknown provider): such a CR blocks no one.
    pub fn from_cr(cr: &CloudControllerManager, registry: &Registry) -> Option<Peer> {
        if cr.meta().deletion_timestamp.is_some()
            || validate_spec(&cr.spec).is_err()
            || !registry.contains(&cr.spec.provider)
        {
            return None;
        }
        let selection = ControllerSelection::parse(&cr.spec.controllers).ok()?;
        Some(Peer {
            namespace: cr.namespace().unwrap_or_default(),
            name: cr.name_any(),
            uid: cr.uid().unwrap_or_default(),
            created: cr.meta().creation_timestamp.clone(),
            node_controllers: [Controller::CloudNode, Controller::CloudNodeLifecycle]
                .into_iter()
                .filter(|c| selection.is_enabled(*c))
                .map(Controller::name)
                .collect(),
            // Whether the provider programs routes is not asked: a peer that might run the
            // route controller blocks the same ones.
            routes: route_controller_runs(&selection, cr.spec.configure_cloud_routes, true),
            services: selection.is_enabled(Controller::ServiceLb).then(|| {
                let class = cr.spec.load_balancer_class.clone();
                let unclassed = cr.spec.handle_unclassed_services && class.is_some();
                std::iter::once(class).chain(unclassed.then_some(None)).collect()
            }),
            migration: effective_leader_migration(&cr.spec).map(|m| {
                let migrated = Controller::ALL
                    .into_iter()
                    .filter(|c| m.placement(c.name()) == Placement::Migrated)
                    .map(Controller::name)
                    .collect();
                let namespace = migration_lease_namespace(cr).unwrap_or_default();
                ((namespace, m.leader_name), migrated)
            }),
        })
    }

    /// Whether `self` and `other` both run `controller` under the same migration Lease.
    fn both_migrate(&self, other: &Peer, controller: &str) -> bool {
        match (&self.migration, &other.migration) {
            (Some((a, ca)), Some((b, cb))) => a == b && ca.contains(&controller) && cb.contains(&controller),
            _ => false,
        }
    }

    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// Whether `self` was created before `other` (ties broken by namespace, then name).
    fn precedes(&self, other: &Peer) -> bool {
        let a = (self.created.as_ref().map(|t| t.0), &self.namespace, &self.name);
        let b = (other.created.as_ref().map(|t| t.0), &other.namespace, &other.name);
        a < b
    }

    /// What `self` and `other` would both do, described for a message; empty when nothing.
    fn overlap(&self, other: &Peer) -> Vec<String> {
        let mut out = Vec::new();
        let nodes: Vec<&str> = self
            .node_controllers
            .iter()
            .filter(|c| other.node_controllers.contains(c) && !self.both_migrate(other, c))
            .copied()
            .collect();
        if !nodes.is_empty() {
            out.push(format!("both run {}", nodes.join(" and ")));
        }
        if self.routes && other.routes && !self.both_migrate(other, Controller::NodeRoute.name()) {
            out.push(format!("both run {}", Controller::NodeRoute));
        }
        if let (Some(a), Some(b)) = (&self.services, &other.services)
            && !self.both_migrate(other, Controller::ServiceLb.name())
        {
            out.extend(a.iter().filter(|class| b.contains(class)).map(|class| match class {
                None => "both handle LoadBalancer Services without a loadBalancerClass".to_string(),
                Some(class) => format!("both handle LoadBalancer Services of class {class:?}"),
            }));
        }
        out
    }
}

/// The older CRs that `me` conflicts with, sorted, each with what overlaps.
pub fn conflicts_of(me: &Peer, peers: &[Peer]) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = peers
        .iter()
        .filter(|p| p.uid != me.uid && p.precedes(me))
        .filter_map(|p| {
            let overlap = me.overlap(p);
            (!overlap.is_empty()).then(|| (p.key(), overlap))
        })
        .collect();
    out.sort();
    out
}

/// The usable configuration of a valid CR.
#[derive(Debug, Clone, PartialEq)]
pub struct Validated {
    /// What the manager runs: rendered as the pod's arguments, or run by the embedded engine.
    pub config: ManagerConfig,
    /// The cloud-config key and the hash of its value, when a Secret is referenced.
    pub cloud_config: Option<CloudConfigRef>,
    /// Whether the provider programs routes.
    pub provider_has_routes: bool,
}

/// The referenced cloud-config, by key and content hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloudConfigRef {
    /// Secret name.
    pub secret: String,
    /// Key in the Secret.
    pub key: String,
    /// Hash of the key and value (see [`hash::cloud_config`]).
    pub hash: String,
    /// Hash of the part whose change needs a restart (the provider's
    /// `restart_fingerprint`; the whole value when it reloads nothing in place): the pods roll,
    /// or the embedded engine restarts, only when this changes.
    pub restart_hash: String,
}

/// One reason the configuration cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// `ConfigValid` reason.
    pub reason: &'static str,
    /// Human-readable, deterministic, free of Secret content.
    pub message: String,
}

/// The verdict.
// One verdict per reconcile: the valid variant's size (its ManagerConfig) costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Validation {
    /// Usable.
    Valid(Validated),
    /// Not usable; the first failure gives the reason, the message lists all.
    Invalid {
        /// Every failure, most fundamental first.
        failures: Vec<Failure>,
        /// `namespace/name` of the older CRs this one conflicts with.
        conflicts_with: Vec<String>,
    },
    /// Cannot tell now (the Secret could not be read); the previous verdict stands.
    Unknown(Failure),
}

impl Validation {
    /// Whether the CR may be deployed.
    pub fn is_valid(&self) -> bool {
        matches!(self, Validation::Valid(_))
    }

    /// `(reason, message)` of the `ConfigValid` condition for a non-valid verdict.
    pub fn summary(&self) -> Option<(&'static str, String)> {
        match self {
            Validation::Valid(_) => None,
            Validation::Invalid { failures, .. } => Some((
                failures.first().map(|f| f.reason).unwrap_or(reason::INVALID_SPEC),
                failures.iter().map(|f| f.message.as_str()).collect::<Vec<_>>().join("; "),
            )),
            Validation::Unknown(f) => Some((f.reason, f.message.clone())),
        }
    }
}

/// The namespaces where the operator reads cloud-config Secrets and runs managers (the chart
/// renders its namespaced Roles there). A CloudControllerManager elsewhere is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowedNamespaces(Vec<String>);

impl AllowedNamespaces {
    /// The namespaces of `list`, trimmed, empty entries dropped, sorted and deduplicated.
    pub fn new<S: AsRef<str>>(list: &[S]) -> Self {
        let mut v: Vec<String> = list.iter().map(|s| s.as_ref().trim().to_string()).filter(|s| !s.is_empty()).collect();
        v.sort();
        v.dedup();
        Self(v)
    }

    /// Whether `namespace` is allowed.
    pub fn contains(&self, namespace: &str) -> bool {
        self.0.iter().any(|n| n == namespace)
    }

    /// The namespaces, sorted.
    pub fn as_slice(&self) -> &[String] {
        &self.0
    }
}

/// The verdict for a CloudControllerManager whose namespace is not allowed, naming the setting
/// that allows it.
pub fn namespace_not_allowed(namespace: &str, allowed: &AllowedNamespaces) -> Validation {
    let list = if allowed.0.is_empty() { "none".to_string() } else { allowed.0.join(", ") };
    Validation::Invalid {
        failures: vec![Failure {
            reason: reason::NAMESPACE_NOT_ALLOWED,
            message: format!(
                "the operator does not read Secrets or run managers in namespace {namespace} (allowed: {list}); add it to the Helm value cloudConfig.namespaces (the operator's --cloud-config-namespaces), or create the CloudControllerManager in an allowed namespace"
            ),
        }],
        conflicts_with: Vec::new(),
    }
}

/// The manager configuration `cr` asks for, with the cloud-config (Secret key `cloud_config_key`)
/// at its path in the manager pod, checked as the binary checks it at start. A failure's
/// message names the spec field.
pub fn manager_config(cr: &CloudControllerManager, cloud_config_key: Option<&str>) -> Result<ManagerConfig, Failure> {
    let spec = &cr.spec;
    let failure =
        |field: &str, message: String| Failure { reason: reason::INVALID_SPEC, message: format!("{field}: {message}") };
    let controllers =
        ControllerSelection::parse(&spec.controllers).map_err(|e| failure("spec.controllers", e.to_string()))?;
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
        ccm_resource: Some(ccm_framework::status::StatusTarget { namespace, name }),
        extra_args: spec.extra_args.clone(),
        shadow: spec.shadow,
    };
    config.check().map_err(|e| match e {
        ccm_framework::Error::InvalidFlag {
            flag: "--leader-migration-config" | "--enable-leader-migration",
            message,
        } => migration_failure(message),
        ccm_framework::Error::InvalidFlag { flag: "--shadow", message } => failure("spec.shadow", message),
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

/// The `NamespaceNotAllowed` verdict when `spec.leaderElection.migration.leaseNamespace` names a
/// namespace the operator does not serve (it has no rights there to grant the Lease), else
/// `None` (pure).
pub fn lease_namespace_not_allowed(cr: &CloudControllerManager, allowed: &AllowedNamespaces) -> Option<Validation> {
    let lease_namespace = foreign_lease_namespace(cr)?;
    if allowed.contains(&lease_namespace) {
        return None;
    }
    let list = if allowed.0.is_empty() { "none".to_string() } else { allowed.0.join(", ") };
    Some(Validation::Invalid {
        failures: vec![Failure {
            reason: reason::NAMESPACE_NOT_ALLOWED,
            message: format!(
                "spec.leaderElection.migration.leaseNamespace: the operator does not serve namespace {lease_namespace} (allowed: {list}), so it cannot grant the manager the migration Lease there; choose an allowed namespace, or add it to the Helm value cloudConfig.namespaces (the operator's --cloud-config-namespaces)"
            ),
        }],
        conflicts_with: Vec::new(),
    })
}

/// Lease names of core components (and of this operator) that no resource may take: the
/// manager's Lease is named after its resource, and its own Role grants update on that name.
pub const RESERVED_LEASE_NAMES: [&str; 4] =
    ["kube-controller-manager", "kube-scheduler", "cloud-controller-manager", crate::names::OPERATOR_LEASE];
/// Prefixes of reserved Lease names: kube-apiserver's identity Leases (`apiserver-<hash>`,
/// formerly `kube-apiserver-<hash>`) and every other `kube-` component.
pub const RESERVED_LEASE_PREFIXES: [&str; 2] = ["kube-", "apiserver-"];

/// The `ReservedName` failure when `name` (the resource's, and so its Lease's) is one a core
/// component's leader-election Lease uses (pure).
pub fn reserved_lease_name(name: &str) -> Option<Failure> {
    let reserved = RESERVED_LEASE_NAMES.contains(&name) || RESERVED_LEASE_PREFIXES.iter().any(|p| name.starts_with(p));
    reserved.then(|| Failure {
        reason: reason::RESERVED_NAME,
        message: format!(
            "metadata.name {name:?} is reserved: the manager's leader-election Lease is named after the resource, and this name belongs (or may belong) to a core component's Lease ({}, or a name starting with {}); recreate the resource under another name",
            RESERVED_LEASE_NAMES.join(", "),
            RESERVED_LEASE_PREFIXES.join(" or ")
        ),
    })
}

/// The verdict for a resource whose children's names are taken by objects it does not own, one
/// failure per conflict's message.
pub fn name_conflicts(messages: impl IntoIterator<Item = String>) -> Validation {
    Validation::Invalid {
        failures: messages.into_iter().map(|message| Failure { reason: reason::NAME_CONFLICT, message }).collect(),
        conflicts_with: Vec::new(),
    }
}

/// Validate `cr` given its Secret and the other CRs in scope.
pub fn validate(cr: &CloudControllerManager, secret: &SecretState, registry: &Registry, peers: &[Peer]) -> Validation {
    let spec = &cr.spec;
    let invalid = |failures: Vec<Failure>| Validation::Invalid { failures, conflicts_with: Vec::new() };

    if let Err(e) = validate_spec(spec) {
        return invalid(vec![Failure { reason: reason::INVALID_SPEC, message: e.to_string() }]);
    }
    if let Some(failure) = reserved_lease_name(&cr.name_any()) {
        return invalid(vec![failure]);
    }
    if let Some(lease) = migration_lease_name(spec) {
        // The default name exists for this purpose; any other must not be a core component's
        // Lease, nor another resource's main Lease in the Lease's namespace (its Role would then
        // allow renewing that Lease).
        let namespace = migration_lease_namespace(cr).unwrap_or_default();
        let taken = peers.iter().any(|p| p.namespace == namespace && p.name == lease);
        if lease != leader_migration::DEFAULT_LEADER_NAME && (reserved_lease_name(&lease).is_some() || taken) {
            return invalid(vec![Failure {
                reason: reason::RESERVED_NAME,
                message: format!(
                    "spec.leaderElection.migration.leaderName {lease:?} is reserved: it is a core component's Lease ({}, or a name starting with {}) or another CloudControllerManager's Lease in namespace {namespace}; choose another name",
                    RESERVED_LEASE_NAMES.join(", "),
                    RESERVED_LEASE_PREFIXES.join(" or ")
                ),
            }]);
        }
    }
    if let Some(why) = announcer_refused(spec) {
        return invalid(vec![Failure { reason: reason::INVALID_SPEC, message: why.into() }]);
    }
    if spec.mode == Mode::Embedded && !spec.extra_args.is_empty() {
        return invalid(vec![Failure {
            reason: reason::EXTRA_ARGS_NOT_SUPPORTED,
            message: "spec.extraArgs is not supported in Embedded mode: the embedded engine takes no command line, so the arguments would be ignored; remove spec.extraArgs, or use mode Deployment or DaemonSet".into(),
        }]);
    }
    let cloud_config_key = cr.spec.cloud_config.as_ref().map(|c| c.secret_ref.key.as_str());
    // The binary's own checks, which refuse timings the CRD accepts (renewDeadline must exceed
    // 1.2 x retryPeriod).
    let config = match manager_config(cr, cloud_config_key) {
        Ok(config) => config,
        Err(failure) => return invalid(vec![failure]),
    };
    if !registry.contains(&spec.provider) {
        return invalid(vec![Failure {
            reason: reason::UNKNOWN_PROVIDER,
            message: format!(
                "unknown cloud provider {:?}; known providers: {}",
                spec.provider,
                registry.names().join(", ")
            ),
        }]);
    }

    let mut failures = Vec::new();
    let mut conflicts_with = Vec::new();
    if let Some(me) = Peer::from_cr(cr, registry) {
        for (other, overlap) in conflicts_of(&me, peers) {
            failures.push(Failure {
                reason: reason::CONFLICT,
                message: format!(
                    "conflicts with CloudControllerManager {other}, which was created earlier: {}; this one is not deployed",
                    overlap.join(", ")
                ),
            });
            conflicts_with.push(other);
        }
    }

    let cloud_config: Option<(&str, &str, &[u8])> = match secret {
        SecretState::NotReferenced => None,
        SecretState::NotFound { name } => {
            failures.push(Failure {
                reason: reason::SECRET_NOT_FOUND,
                message: format!(
                    "Secret {name:?} (spec.cloudConfig.secretRef) does not exist or is not labelled {}={}",
                    crds::CLOUD_CONFIG_LABEL,
                    crds::CLOUD_CONFIG_LABEL_VALUE
                ),
            });
            return Validation::Invalid { failures, conflicts_with };
        }
        SecretState::KeyNotFound { name, key } => {
            failures.push(Failure {
                reason: reason::SECRET_KEY_NOT_FOUND,
                message: format!("Secret {name:?} has no key {key:?}"),
            });
            return Validation::Invalid { failures, conflicts_with };
        }
        SecretState::Unreadable { name, error } => {
            if !failures.is_empty() {
                return Validation::Invalid { failures, conflicts_with };
            }
            return Validation::Unknown(Failure {
                reason: reason::SECRET_UNREADABLE,
                message: format!("reading Secret {name:?}: {error}"),
            });
        }
        SecretState::Found { name, key, data } => Some((name, key, data)),
    };

    let settings = ClusterSettings {
        cluster_name: spec.cluster_name.clone(),
        cluster_cidrs: spec.cluster_cidr.as_deref().and_then(|c| parse_cluster_cidrs(c).ok()).unwrap_or_default(),
    };
    let provider = match registry.create(&spec.provider, cloud_config.map(|(_, _, data)| data), &settings) {
        Ok(p) => p,
        Err(e) => {
            let message = match e {
                // Parsers report a field path and the kind of problem, never a value (the
                // provider contract), so the message is passed on as it is.
                RegistryError::Init { source, .. } => {
                    format!("provider {:?} rejected the cloud-config: {source}", spec.provider)
                }
                other => other.to_string(),
            };
            failures.push(Failure { reason: reason::CLOUD_CONFIG_REJECTED, message });
            return Validation::Invalid { failures, conflicts_with };
        }
    };
    let provider_has_routes = provider.routes().is_some();
    let restart_fingerprint = provider.restart_fingerprint();
    if route_controller_runs(&config.controllers, config.configure_cloud_routes, provider_has_routes)
        && config.cluster_cidr.is_none()
    {
        failures.push(Failure {
            reason: reason::CLUSTER_CIDR_REQUIRED,
            message: format!(
                "provider {:?} programs routes and the route controller is enabled, but spec.clusterCIDR is empty; set it, or set configureCloudRoutes: false, or disable the route controller",
                spec.provider
            ),
        });
    }
    if !failures.is_empty() {
        return Validation::Invalid { failures, conflicts_with };
    }
    Validation::Valid(Validated {
        config,
        cloud_config: cloud_config.map(|(name, key, data)| {
            let salt = cr.metadata.uid.as_deref().unwrap_or_default();
            let hash = hash::cloud_config(salt, key, data);
            let restart_hash = match &restart_fingerprint {
                Some(fingerprint) => hash::cloud_config_restart(salt, key, fingerprint),
                None => hash.clone(),
            };
            CloudConfigRef { secret: name.to_string(), key: key.to_string(), hash, restart_hash }
        }),
        provider_has_routes,
    })
}

/// The verdict for a cloud-config the provider did not finish checking within `limit`: refused,
/// so a document that is slow to parse (deeply nested, huge) never holds anything up.
pub fn parse_timed_out(provider: &str, limit: std::time::Duration) -> Validation {
    Validation::Invalid {
        failures: vec![Failure {
            reason: reason::CLOUD_CONFIG_REJECTED,
            message: format!(
                "provider {provider:?} did not finish checking the cloud-config within the limit of {limit:?}; it is refused (very large or deeply nested documents are the usual cause)"
            ),
        }],
        conflicts_with: Vec::new(),
    }
}

/// What the operator's own installation allows, for the checks the spec alone cannot make.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Environment {
    /// Embedded mode may run: the operator's ServiceAccount holds the manager's rights
    /// (`--embedded-enabled`, the chart's `embedded.enabled`).
    pub embedded_enabled: bool,
    /// The operator process shares its Node's network namespace (`--embedded-host-network`), so
    /// an embedded engine's proxy listeners are reachable from outside (the sandbox, a binary on
    /// a host). The chart's operator Pod is on the pod network.
    pub host_network: bool,
}

impl Default for Environment {
    fn default() -> Self {
        Self { embedded_enabled: true, host_network: true }
    }
}

/// Whether `cr` would run a proxy data path: the baremetal provider with
/// `loadBalancer.mode: proxy` and the service controller enabled. Its listeners open in the
/// network namespace of the process that runs the provider.
pub fn runs_proxy_data_path(cr: &CloudControllerManager, secret: &SecretState) -> bool {
    use ccm_provider_baremetal::{config, proxy};
    let SecretState::Found { data, .. } = secret else { return false };
    let service_controller =
        ControllerSelection::parse(&cr.spec.controllers).is_ok_and(|s| s.is_enabled(Controller::ServiceLb));
    cr.spec.provider == "baremetal"
        && service_controller
        && config::parse(data).is_ok_and(|c| c.load_balancer.mode == proxy::Mode::Proxy)
}

/// Refuse what this installation cannot run as specified, before anything is applied or torn
/// down: Embedded mode when it was not enabled (the engine would stall on 403s while holding the
/// Lease, after the working manager was removed), and a proxy data path whose listeners would
/// open in a Pod's own network namespace (the Service would get an address nothing answers on).
/// Only a valid verdict changes.
pub fn check_environment(
    cr: &CloudControllerManager,
    verdict: Validation,
    secret: &SecretState,
    env: &Environment,
) -> Validation {
    if !verdict.is_valid() {
        return verdict;
    }
    let embedded = cr.spec.mode == crds::Mode::Embedded;
    let mut failures = Vec::new();
    if embedded && !env.embedded_enabled {
        failures.push(Failure {
            reason: reason::EMBEDDED_NOT_ENABLED,
            message: "spec.mode is Embedded, but this operator was installed without Embedded mode, so it lacks the manager's permissions; install the chart with embedded.enabled=true (the operator's --embedded-enabled), or set spec.mode to Deployment or DaemonSet. Whatever runs now is left running".to_string(),
        });
    } else if runs_proxy_data_path(cr, secret) {
        let where_ = if embedded && !env.host_network {
            Some("spec.mode is Embedded and the operator's Pod is not on the host network")
        } else if !embedded && !cr.spec.deployment.host_network {
            Some("spec.deployment.hostNetwork is false")
        } else {
            None
        };
        if let Some(where_) = where_ {
            failures.push(Failure {
                reason: reason::PROXY_NEEDS_HOST_NETWORK,
                message: format!(
                    "the cloud-config sets loadBalancer.mode: proxy, whose listeners must open on the Node, but {where_}: they would open in the Pod's own network namespace, where no traffic reaches them; run on the host network (spec.mode Deployment or DaemonSet with spec.deployment.hostNetwork: true) or use loadBalancer.mode: addresses"
                ),
            });
        }
    }
    if failures.is_empty() { verdict } else { Validation::Invalid { failures, conflicts_with: Vec::new() } }
}

/// What a resource author may ask for beyond the manager's own configuration, set by whoever
/// installs the operator (flags, chart values). A resource asking for more is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// Images `spec.deployment.image` may name (`--allowed-images`): an entry allows the image
    /// equal to it or starting with it (`registry/repo:` any tag, `registry/repo@` any digest,
    /// `registry/` any repository there). Empty: only the operator's `--manager-image`.
    pub allowed_images: Vec<String>,
    /// The most replicas `spec.deployment.replicas` may ask for (`--max-replicas`).
    pub max_replicas: i32,
    /// Priority classes `spec.deployment.priorityClassName` may name
    /// (`--allowed-priority-classes`); an empty name (none) is always allowed.
    pub allowed_priority_classes: Vec<String>,
    /// Whether `spec.announcer` may be set (`--allow-announcers`, the chart's
    /// `announcer.enabled`): announcers run on the host network of every selected node, with
    /// `NET_RAW` for L2.
    pub allow_announcers: bool,
    /// The BIRD image of `spec.announcer.bgp` (`--bird-image`); none refuses `bgp`.
    pub bird_image: Option<String>,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            allowed_images: Vec::new(),
            max_replicas: DEFAULT_MAX_REPLICAS,
            allowed_priority_classes: vec![DEFAULT_PRIORITY_CLASS.to_string()],
            allow_announcers: false,
            bird_image: None,
        }
    }
}

/// The default of `--max-replicas`: leader election runs one manager at a time, so more than a
/// few standbys buy nothing.
pub const DEFAULT_MAX_REPLICAS: i32 = 5;
/// The default of `--allowed-priority-classes`: the CRD's default `priorityClassName`.
pub const DEFAULT_PRIORITY_CLASS: &str = "system-cluster-critical";

/// Why `spec.announcer` cannot be built for this spec, if it cannot (pure).
pub fn announcer_refused(spec: &crds::CloudControllerManagerSpec) -> Option<&'static str> {
    spec.announcer.as_ref()?;
    if spec.provider != ccm_provider_baremetal::NAME {
        return Some("spec.announcer: only the baremetal provider announces its addresses; remove spec.announcer");
    }
    if spec.mode == Mode::Embedded {
        return Some(
            "spec.announcer needs mode Deployment or DaemonSet: the announcers are pods on every node, which Embedded mode does not create",
        );
    }
    if spec.cloud_config.is_none() {
        return Some("spec.announcer needs spec.cloudConfig: the announcers read loadBalancer.announcement from it");
    }
    None
}

/// Manager flags `spec.extraArgs` may set: tuning and logging only. Every other flag is refused,
/// among them whatever changes the manager's identity, credentials, kubeconfig or authorization
/// (`--kubeconfig`, `--master`, `--authentication-*`, `--authorization-*`, `--client-ca-file`,
/// `--requestheader-*`, `--use-service-account-credentials`), its serving (`--tls-*`,
/// `--cert-dir`, `--secure-port`, `--permit-*`, `--webhook*`, `--profiling`),
/// its cloud (`--cloud-provider`, `--cloud-config`) or its Lease (`--leader-elect*`,
/// `--leader-migration-config`), and flags the spec already sets (`--controllers`,
/// `--cluster-*`, `--configure-cloud-routes`, `--concurrent-*-syncs`). `--bind-address` is
/// allowed: the default already listens on every address of the pod (or host), so another value
/// narrows what is exposed, never widens it.
pub const ALLOWED_EXTRA_ARGS: [&str; 17] = [
    "v",
    "vmodule",
    "logging-format",
    "kube-api-qps",
    "kube-api-burst",
    "kube-api-content-type",
    "min-resync-period",
    "controller-start-interval",
    "route-reconciliation-period",
    "node-monitor-period",
    "node-sync-period",
    "node-status-update-frequency",
    "concurrent-node-status-updates",
    "node-batch-size",
    "node-batch-window",
    "allow-untagged-cloud",
    "bind-address",
];

/// Why `spec.extraArgs[i]` is refused, or `None` (pure). Only `--flag=value`, `--flag` and
/// `-v=N` forms of [`ALLOWED_EXTRA_ARGS`] pass: a bare value could be taken as another flag's.
pub fn extra_arg_refused(arg: &str) -> Option<String> {
    let name = arg.strip_prefix("--").or_else(|| arg.strip_prefix('-').filter(|r| r.starts_with('v')));
    let Some(name) = name else {
        return Some("is not a flag; give values in the --flag=value form".into());
    };
    let name = name.split_once('=').map_or(name, |(n, _)| n);
    if ALLOWED_EXTRA_ARGS.contains(&name) {
        return None;
    }
    // The flag name only: a value may be anything the author typed.
    let shown: String = name.chars().take(64).collect();
    Some(format!(
        "--{shown} is not allowed; spec.extraArgs may set only tuning and logging flags ({})",
        ALLOWED_EXTRA_ARGS.iter().map(|f| format!("--{f}")).collect::<Vec<_>>().join(", ")
    ))
}

/// Whether `image` is allowed by `allowed` (entries equal to it or prefixes of it), or, with
/// an empty list, equal to `default_image` (pure).
pub fn image_allowed(image: &str, allowed: &[String], default_image: &str) -> bool {
    if allowed.is_empty() {
        return image == default_image;
    }
    allowed.iter().any(|p| !p.is_empty() && (image == p || image.starts_with(p.as_str())))
}

/// Refuse a valid verdict whose spec asks for more than `policy` allows: an image outside the
/// allow-list, a flag outside [`ALLOWED_EXTRA_ARGS`], more replicas than the maximum, a priority
/// class not on the list. Each failure names the field; the reason is `NotAllowedByPolicy`.
pub fn check_policy(
    cr: &CloudControllerManager,
    verdict: Validation,
    policy: &Policy,
    default_image: &str,
) -> Validation {
    if !verdict.is_valid() {
        return verdict;
    }
    let d = &cr.spec.deployment;
    let mut failures = Vec::new();
    let mut refuse = |message: String| failures.push(Failure { reason: reason::NOT_ALLOWED_BY_POLICY, message });
    let runs_a_pod = cr.spec.mode != Mode::Embedded;
    if runs_a_pod {
        if let Some(image) = d.image.as_deref()
            && !image_allowed(image, &policy.allowed_images, default_image)
        {
            let list = if policy.allowed_images.is_empty() {
                default_image.to_string()
            } else {
                policy.allowed_images.join(", ")
            };
            refuse(format!(
                "spec.deployment.image is not an allowed image (allowed: {list}); the operator's --allowed-images, the chart's manager.allowedImages"
            ));
        }
        if cr.spec.mode == Mode::Deployment && d.replicas > policy.max_replicas {
            refuse(format!(
                "spec.deployment.replicas is {}, above the maximum of {} (the operator's --max-replicas, the chart's manager.maxReplicas)",
                d.replicas, policy.max_replicas
            ));
        }
        if !d.priority_class_name.is_empty() && !policy.allowed_priority_classes.contains(&d.priority_class_name) {
            refuse(format!(
                "spec.deployment.priorityClassName {:?} is not allowed (allowed: {}); the operator's --allowed-priority-classes, the chart's manager.allowedPriorityClasses",
                d.priority_class_name,
                if policy.allowed_priority_classes.is_empty() {
                    "none".to_string()
                } else {
                    policy.allowed_priority_classes.join(", ")
                }
            ));
        }
    }
    if let Some(announcer) = &cr.spec.announcer {
        if !policy.allow_announcers {
            refuse(
                "spec.announcer: this installation does not run announcers (the operator's --allow-announcers, the chart's announcer.enabled)"
                    .into(),
            );
        } else if announcer.bgp && policy.bird_image.is_none() {
            refuse(
                "spec.announcer.bgp: no BIRD image is configured (the operator's --bird-image, the chart's announcer.birdImage)"
                    .into(),
            );
        }
    }
    for (i, arg) in cr.spec.extra_args.iter().enumerate() {
        if let Some(why) = extra_arg_refused(arg) {
            refuse(format!("spec.extraArgs[{i}]: {why}"));
        }
    }
    if failures.is_empty() { verdict } else { Validation::Invalid { failures, conflicts_with: Vec::new() } }
}

/// How long a provider may take to check a cloud-config before it is refused.
pub const PARSE_TIME_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

/// [`validate`] on a blocking thread, off the async runtime, given at most `limit`: a
/// cloud-config that is slow to parse never occupies a runtime thread, so no other resource's
/// reconcile waits for it. Past the limit the thread is abandoned (it cannot be stopped) and
/// `None` is returned (the caller refuses it with [`parse_timed_out`]).
pub async fn validate_bounded(
    cr: CloudControllerManager,
    secret: SecretState,
    registry: Registry,
    peers: Vec<Peer>,
    env: Environment,
    limit: std::time::Duration,
) -> Option<Validation> {
    let provider = cr.spec.provider.clone();
    let task = tokio::task::spawn_blocking(move || {
        let verdict = validate(&cr, &secret, &registry, &peers);
        check_environment(&cr, verdict, &secret, &env)
    });
    match tokio::time::timeout(limit, task).await {
        Ok(Ok(v)) => Some(v),
        Ok(Err(_)) => Some(Validation::Invalid {
            failures: vec![Failure {
                reason: reason::CLOUD_CONFIG_REJECTED,
                message: format!("provider {provider:?} failed while checking the cloud-config (it panicked)"),
            }],
            conflicts_with: Vec::new(),
        }),
        Err(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use ccm_framework::provider::{CloudError, CloudProvider, Route, Routes};
    use ccm_framework::registry::FactoryInput;
    use crds::CloudControllerManagerSpec;
    use k8s_openapi::jiff::Timestamp;
    use serde_json::json;

    struct NoRoutes;
    impl CloudProvider for NoRoutes {
        fn name(&self) -> &str {
            "plain"
        }
    }

    struct WithRoutes;
    #[ccm_framework::async_trait]
    impl Routes for WithRoutes {
        async fn list_routes(&self, _cluster_name: &str) -> ccm_framework::provider::CloudResult<Vec<Route>> {
            Ok(Vec::new())
        }
        async fn create_route(
            &self,
            _cluster_name: &str,
            _name_hint: &str,
            _route: &Route,
        ) -> ccm_framework::provider::CloudResult<()> {
            Ok(())
        }
        async fn delete_route(&self, _cluster_name: &str, _route: &Route) -> ccm_framework::provider::CloudResult<()> {
            Ok(())
        }
    }
    struct Routed(WithRoutes);
    impl CloudProvider for Routed {
        fn name(&self) -> &str {
            "routed"
        }
        fn routes(&self) -> Option<&dyn Routes> {
            Some(&self.0)
        }
    }

    fn registry() -> Registry {
        let mut r = Registry::new();
        r.register("plain", |input: FactoryInput<'_>| -> Result<Arc<dyn CloudProvider>, CloudError> {
            match input.cloud_config {
                Some(b) if b.starts_with(b"bad") => {
                    Err(CloudError::InvalidConfig("line 1: expected key = value".into()))
                }
                Some(b) if b.starts_with(b"slow") => {
                    std::thread::sleep(std::time::Duration::from_millis(500));
                    Ok(Arc::new(NoRoutes))
                }
                _ => Ok(Arc::new(NoRoutes)),
            }
        })
        .unwrap();
        r.register("routed", |_: FactoryInput<'_>| -> Result<Arc<dyn CloudProvider>, CloudError> {
            Ok(Arc::new(Routed(WithRoutes)))
        })
        .unwrap();
        r
    }

    fn cr(name: &str, created: i64, spec: serde_json::Value) -> CloudControllerManager {
        let spec: CloudControllerManagerSpec = serde_json::from_value(spec).unwrap();
        let mut cr = CloudControllerManager::new(name, spec);
        cr.metadata.namespace = Some("kube-system".into());
        cr.metadata.uid = Some(format!("uid-{name}"));
        cr.metadata.creation_timestamp = Some(Time(Timestamp::from_second(created).unwrap()));
        cr
    }

    fn found(data: &[u8]) -> SecretState {
        SecretState::Found { name: "cfg".into(), key: "cloud.conf".into(), data: data.to_vec() }
    }

    fn reason_of(v: &Validation) -> &'static str {
        v.summary().map(|(r, _)| r).unwrap_or(reason::VALID)
    }

    #[test]
    fn a_spec_asking_for_more_than_the_policy_allows_is_refused_naming_each_field() {
        let policy = Policy::default();
        let image = "registry.example/ccm:v1";
        let check = |spec: serde_json::Value, policy: &Policy| {
            let c = cr("a", 1, spec);
            check_policy(&c, validate(&c, &SecretState::NotReferenced, &registry(), &[]), policy, image)
        };
        assert!(check(json!({"provider": "plain"}), &policy).is_valid(), "the defaults pass");
        let ok = json!({"provider": "plain", "extraArgs": ["--v=4", "-v=2", "--node-monitor-period=7s", "--bind-address=10.0.0.1"],
            "deployment": {"image": image, "replicas": 5, "priorityClassName": "system-cluster-critical"}});
        assert!(check(ok, &policy).is_valid());
        let v = check(
            json!({"provider": "plain",
                "extraArgs": ["--v=2", "--kubeconfig=/tmp/k", "--authorization-always-allow-paths=/metrics", "/x", "--tls-min-version=VersionTLS10",
                              "--use-service-account-credentials", "--cloud-config=/etc/passwd", "--leader-elect-resource-name=kube-scheduler", "--", "--master=x"],
                "deployment": {"image": "evil.example/ccm:v1", "replicas": 6, "priorityClassName": "system-node-critical"}}),
            &policy,
        );
        assert_eq!(reason_of(&v), reason::NOT_ALLOWED_BY_POLICY);
        let Validation::Invalid { failures, .. } = &v else { panic!() };
        let messages: Vec<&str> = failures.iter().map(|f| f.message.as_str()).collect();
        let fields: Vec<&str> = messages.iter().map(|m| m.split([' ', ':']).next().unwrap()).collect();
        assert_eq!(
            fields,
            [
                "spec.deployment.image",
                "spec.deployment.replicas",
                "spec.deployment.priorityClassName",
                "spec.extraArgs[1]",
                "spec.extraArgs[2]",
                "spec.extraArgs[3]",
                "spec.extraArgs[4]",
                "spec.extraArgs[5]",
                "spec.extraArgs[6]",
                "spec.extraArgs[7]",
                "spec.extraArgs[8]",
                "spec.extraArgs[9]"
            ],
            "{messages:#?}"
        );
        assert!(
            !messages.iter().any(|m| m.contains("/tmp/k") || m.contains("/etc/passwd")),
            "values stay out: {messages:#?}"
        );
        // Entries are exact references or prefixes; DaemonSet mode ignores replicas.
        let listed = Policy {
            allowed_images: vec!["registry.example/ccm@".into(), "mirror.example/".into()],
            ..Policy::default()
        };
        let with_image = |i: &str| json!({"provider": "plain", "deployment": {"image": i}});
        assert!(check(with_image("registry.example/ccm@sha256:abc"), &listed).is_valid());
        assert!(check(with_image("mirror.example/any:1"), &listed).is_valid());
        assert!(!check(with_image("registry.example/ccm:v1"), &listed).is_valid(), "tags not listed");
        assert!(!check(with_image("registry.example/ccm-evil@sha256:abc"), &listed).is_valid());
        assert!(
            check(json!({"provider": "plain", "mode": "DaemonSet", "deployment": {"replicas": 50}}), &policy)
                .is_valid()
        );
        let none = Policy { allowed_priority_classes: Vec::new(), ..Policy::default() };
        assert!(check(json!({"provider": "plain", "deployment": {"priorityClassName": ""}}), &none).is_valid());
    }

    #[test]
    fn a_resource_named_like_a_core_components_lease_is_refused_naming_metadata_name() {
        for name in [
            "kube-controller-manager",
            "kube-scheduler",
            "cloud-controller-manager",
            "ccm-operator",
            "kube-x",
            "apiserver-abc",
        ] {
            let v = validate(&cr(name, 1, json!({"provider": "plain"})), &SecretState::NotReferenced, &registry(), &[]);
            assert_eq!(reason_of(&v), reason::RESERVED_NAME, "{name}");
            let (_, message) = v.summary().unwrap();
            assert!(message.starts_with(&format!("metadata.name {name:?} is reserved")), "{message}");
        }
        for name in ["aws", "operator", "my-kube-ccm", "controller-manager"] {
            let v = validate(&cr(name, 1, json!({"provider": "plain"})), &SecretState::NotReferenced, &registry(), &[]);
            assert!(v.is_valid(), "{name}: {v:?}");
        }
    }

    #[test]
    fn a_pool_edit_keeps_the_restart_hash_and_other_edits_change_it() {
        let c = cr("a", 1, json!({"provider": "baremetal", "cloudConfig": {"secretRef": {"name": "cfg"}}}));
        let registry = ccm_builtin::registry();
        let refs = |doc: &str| match validate(&c, &found(doc.as_bytes()), &registry, &[]) {
            Validation::Valid(v) => v.cloud_config.unwrap(),
            other => panic!("{other:?}"),
        };
        let base = "instances: [{name: n1}]\nloadBalancer:\n  pools: [{name: lan, cidrs: [10.0.0.0/30]}]\n";
        let a = refs(base);
        let pools = refs(&base.replace("10.0.0.0/30", "10.0.0.0/29"));
        let inventory = refs(&base.replace("n1", "n2"));
        assert_ne!(a.hash, pools.hash);
        assert_eq!(a.restart_hash, pools.restart_hash, "a pool edit is reloaded, not rolled out");
        assert_ne!(a.restart_hash, inventory.restart_hash);
        // An invalid pool edit is refused before anything sees it.
        let bad = validate(&c, &found(base.replace("10.0.0.0/30", "10.0.0.1/30").as_bytes()), &registry, &[]);
        assert_eq!(reason_of(&bad), reason::CLOUD_CONFIG_REJECTED);
    }

    #[test]
    fn embedded_mode_is_refused_naming_spec_mode_when_the_installation_did_not_enable_it() {
        let registry = ccm_builtin::registry();
        let disabled = Environment { embedded_enabled: false, host_network: false };
        let doc = b"instances: [{name: n1}]\n";
        let embedded = cr(
            "a",
            1,
            json!({"provider": "baremetal", "mode": "Embedded",
            "cloudConfig": {"secretRef": {"name": "cfg"}}}),
        );
        let v = check_environment(&embedded, validate(&embedded, &found(doc), &registry, &[]), &found(doc), &disabled);
        assert_eq!(reason_of(&v), reason::EMBEDDED_NOT_ENABLED);
        let (_, message) = v.summary().unwrap();
        assert!(message.contains("spec.mode") && message.contains("embedded.enabled"), "{message}");
        // Not a conflict: the apply step leaves whatever runs for it alone.
        assert!(matches!(&v, Validation::Invalid { conflicts_with, .. } if conflicts_with.is_empty()));
        // Enabled, or another mode: accepted.
        let enabled = Environment { embedded_enabled: true, ..disabled };
        let v = check_environment(&embedded, validate(&embedded, &found(doc), &registry, &[]), &found(doc), &enabled);
        assert!(v.is_valid(), "{v:?}");
        let deployment = cr("a", 1, json!({"provider": "baremetal", "cloudConfig": {"secretRef": {"name": "cfg"}}}));
        let v =
            check_environment(&deployment, validate(&deployment, &found(doc), &registry, &[]), &found(doc), &disabled);
        assert!(v.is_valid(), "{v:?}");
    }

    #[test]
    fn a_proxy_data_path_is_refused_where_its_listeners_would_be_unreachable() {
        let registry = ccm_builtin::registry();
        let proxy =
            b"instances: [{name: n1}]\nloadBalancer:\n  mode: proxy\n  pools: [{name: lan, cidrs: [10.0.0.0/30]}]\n";
        let addresses = b"instances: [{name: n1}]\nloadBalancer:\n  pools: [{name: lan, cidrs: [10.0.0.0/30]}]\n";
        let in_pod = Environment { embedded_enabled: true, host_network: false };
        let check = |spec: serde_json::Value, doc: &[u8], env: &Environment| {
            let mut spec = spec;
            spec["provider"] = json!("baremetal");
            spec["cloudConfig"] = json!({"secretRef": {"name": "cfg"}});
            let c = cr("a", 1, spec);
            check_environment(&c, validate(&c, &found(doc), &registry, &[]), &found(doc), env)
        };
        let refused = [
            (json!({"deployment": {"hostNetwork": false}}), "spec.deployment.hostNetwork"),
            (json!({"mode": "DaemonSet", "deployment": {"hostNetwork": false}}), "spec.deployment.hostNetwork"),
            (json!({"mode": "Embedded"}), "spec.mode"),
        ];
        for (spec, field) in refused {
            let v = check(spec.clone(), proxy, &in_pod);
            assert_eq!(reason_of(&v), reason::PROXY_NEEDS_HOST_NETWORK, "{spec}");
            let (_, message) = v.summary().unwrap();
            assert!(message.contains(field) && message.contains("loadBalancer.mode"), "{message}");
            // Addresses mode listens nowhere: nothing to refuse.
            assert!(check(spec.clone(), addresses, &in_pod).is_valid(), "{spec}");
            // Without the service controller no listener opens either.
            let mut no_lb = spec.clone();
            no_lb["controllers"] = json!(["*", "-service"]);
            assert!(check(no_lb, proxy, &in_pod).is_valid(), "{spec}");
        }
        // On the host network it works: the default pod, and an operator process on a host.
        assert!(check(json!({}), proxy, &in_pod).is_valid());
        assert!(check(json!({"mode": "DaemonSet"}), proxy, &in_pod).is_valid());
        assert!(check(json!({"mode": "Embedded"}), proxy, &Environment::default()).is_valid());
        // An earlier failure stands.
        let c = cr("a", 1, json!({"provider": "baremetal", "mode": "Embedded"}));
        let bad = found(b"instances: [");
        let v = check_environment(&c, validate(&c, &bad, &registry, &[]), &bad, &in_pod);
        assert_eq!(reason_of(&v), reason::CLOUD_CONFIG_REJECTED);
    }

    #[test]
    fn valid_spec_with_secret_yields_the_config_hash() {
        let c = cr("a", 1, json!({"provider": "plain", "cloudConfig": {"secretRef": {"name": "cfg"}}}));
        let Validation::Valid(v) = validate(&c, &found(b"ok"), &registry(), &[]) else { panic!() };
        let refs = v.cloud_config.clone().unwrap();
        assert_eq!(refs.restart_hash, refs.hash, "a provider that reloads nothing restarts on any edit");
        assert_eq!(
            v.cloud_config.unwrap().hash,
            hash::cloud_config(c.metadata.uid.as_deref().unwrap_or_default(), "cloud.conf", b"ok")
        );
        assert!(!v.provider_has_routes);
        assert_eq!(v.config.controllers.enabled().len(), 4);
    }

    #[test]
    fn extra_args_in_embedded_mode_are_refused_naming_the_field() {
        let embedded = cr("a", 1, json!({"provider": "plain", "mode": "Embedded", "extraArgs": ["-v=4"]}));
        let v = validate(&embedded, &SecretState::NotReferenced, &registry(), &[]);
        assert_eq!(reason_of(&v), reason::EXTRA_ARGS_NOT_SUPPORTED);
        assert!(v.summary().unwrap().1.starts_with("spec.extraArgs"), "{v:?}");
        // Without extraArgs, or in a mode with a command line, the same spec is valid.
        let plain = cr("a", 1, json!({"provider": "plain", "mode": "Embedded"}));
        assert!(validate(&plain, &SecretState::NotReferenced, &registry(), &[]).is_valid());
        let deployment = cr("a", 1, json!({"provider": "plain", "mode": "Deployment", "extraArgs": ["-v=4"]}));
        let Validation::Valid(v) = validate(&deployment, &SecretState::NotReferenced, &registry(), &[]) else {
            panic!("extraArgs are a Deployment's")
        };
        assert_eq!(v.config.to_args().last().map(String::as_str), Some("-v=4"));
    }

    #[test]
    fn unknown_provider_lists_the_known_ones() {
        let c = cr("a", 1, json!({"provider": "nimbus"}));
        let v = validate(&c, &SecretState::NotReferenced, &registry(), &[]);
        assert_eq!(reason_of(&v), reason::UNKNOWN_PROVIDER);
        assert!(v.summary().unwrap().1.contains("known providers: plain, routed"), "{v:?}");
    }

    #[test]
    fn missing_secret_and_missing_key_have_their_own_reasons() {
        let c = cr("a", 1, json!({"provider": "plain", "cloudConfig": {"secretRef": {"name": "cfg"}}}));
        let v = validate(&c, &SecretState::NotFound { name: "cfg".into() }, &registry(), &[]);
        assert_eq!(reason_of(&v), reason::SECRET_NOT_FOUND);
        let v =
            validate(&c, &SecretState::KeyNotFound { name: "cfg".into(), key: "cloud.conf".into() }, &registry(), &[]);
        assert_eq!(reason_of(&v), reason::SECRET_KEY_NOT_FOUND);
        assert!(v.summary().unwrap().1.contains("\"cloud.conf\""));
    }

    #[test]
    fn unreadable_secret_is_unknown_not_invalid() {
        let c = cr("a", 1, json!({"provider": "plain", "cloudConfig": {"secretRef": {"name": "cfg"}}}));
        let v = validate(&c, &SecretState::Unreadable { name: "cfg".into(), error: "503".into() }, &registry(), &[]);
        assert!(matches!(v, Validation::Unknown(ref f) if f.reason == reason::SECRET_UNREADABLE));
    }

    #[test]
    fn parser_rejection_carries_the_parser_message() {
        let c = cr("a", 1, json!({"provider": "plain", "cloudConfig": {"secretRef": {"name": "cfg"}}}));
        let v = validate(&c, &found(b"bad config"), &registry(), &[]);
        assert_eq!(reason_of(&v), reason::CLOUD_CONFIG_REJECTED);
        assert!(v.summary().unwrap().1.contains("line 1: expected key = value"));
    }

    #[tokio::test]
    async fn a_cloud_config_slower_than_the_limit_is_refused_and_the_runtime_stays_free() {
        let c = cr("a", 1, json!({"provider": "plain", "cloudConfig": {"secretRef": {"name": "cfg"}}}));
        let limit = std::time::Duration::from_millis(100);
        let slow = validate_bounded(c.clone(), found(b"slow"), registry(), Vec::new(), Environment::default(), limit);
        // The async runtime (one thread here) keeps serving other work meanwhile.
        let other = async {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            std::time::Instant::now()
        };
        let started = std::time::Instant::now();
        let (v, other_done) = tokio::join!(slow, other);
        assert!(other_done - started < std::time::Duration::from_millis(90));
        assert!(v.is_none(), "past the limit there is no verdict");
        let (r, message) = parse_timed_out("plain", limit).summary().unwrap();
        assert_eq!(r, reason::CLOUD_CONFIG_REJECTED);
        assert!(message.contains("within the limit of 100ms"), "{message}");
        // Within the limit, the verdict is validate's own.
        let v = validate_bounded(
            c,
            found(b"fine"),
            registry(),
            Vec::new(),
            Environment::default(),
            std::time::Duration::from_secs(5),
        )
        .await;
        assert!(v.unwrap().is_valid());
    }

    #[test]
    fn routes_capable_provider_needs_a_cluster_cidr() {
        let c = cr("a", 1, json!({"provider": "routed"}));
        let v = validate(&c, &SecretState::NotReferenced, &registry(), &[]);
        assert_eq!(reason_of(&v), reason::CLUSTER_CIDR_REQUIRED);
        for spec in [
            json!({"provider": "routed", "clusterCIDR": "10.244.0.0/16"}),
            json!({"provider": "routed", "configureCloudRoutes": false}),
            json!({"provider": "routed", "controllers": ["*", "-route"]}),
            json!({"provider": "plain"}),
        ] {
            let c = cr("a", 1, spec.clone());
            assert!(validate(&c, &SecretState::NotReferenced, &registry(), &[]).is_valid(), "{spec}");
        }
    }

    #[test]
    fn lease_timings_the_manager_refuses_are_invalid_spec() {
        let c = cr(
            "a",
            1,
            json!({"provider": "plain", "leaderElection": {"leaseDuration": "15s", "renewDeadline": "10s", "retryPeriod": "9s"}}),
        );
        let v = validate(&c, &SecretState::NotReferenced, &registry(), &[]);
        assert_eq!(reason_of(&v), reason::INVALID_SPEC);
        assert!(v.summary().unwrap().1.starts_with("spec.leaderElection"), "{v:?}");
    }

    #[test]
    fn spec_breaking_crd_rules_is_invalid_spec() {
        let c = cr("a", 1, json!({"provider": "plain", "concurrency": {"nodeSyncs": 0}}));
        let v = validate(&c, &SecretState::NotReferenced, &registry(), &[]);
        assert_eq!(reason_of(&v), reason::INVALID_SPEC);
        assert!(v.summary().unwrap().1.contains("spec.concurrency.nodeSyncs"));
    }

    fn peers(crs: &[&CloudControllerManager]) -> Vec<Peer> {
        crs.iter().filter_map(|c| Peer::from_cr(c, &registry())).collect()
    }

    #[test]
    fn later_cr_running_the_node_controller_conflicts_and_names_the_older() {
        let old = cr("old", 1, json!({"provider": "plain"}));
        let new = cr("new", 2, json!({"provider": "plain", "controllers": ["cloud-node"]}));
        let all = peers(&[&old, &new]);
        assert!(validate(&old, &SecretState::NotReferenced, &registry(), &all).is_valid());
        let v = validate(&new, &SecretState::NotReferenced, &registry(), &all);
        assert_eq!(reason_of(&v), reason::CONFLICT);
        let Validation::Invalid { conflicts_with, failures } = &v else { panic!() };
        assert_eq!(conflicts_with, &["kube-system/old"]);
        assert!(failures[0].message.contains("both run cloud-node-controller"), "{}", failures[0].message);
    }

    #[test]
    fn m7_resources_migrating_a_controller_under_one_lease_do_not_conflict_on_it() {
        let all_four = json!({"enabled": true, "leaderName": "moving", "controllerLeaders": [
            {"name": "cloud-node", "component": "*"}, {"name": "cloud-node-lifecycle", "component": "*"},
            {"name": "service", "component": "*"}, {"name": "route", "component": "*"}]});
        let old = cr("old", 1, json!({"provider": "plain", "leaderElection": {"migration": all_four}}));
        let new = cr("new", 2, json!({"provider": "plain", "leaderElection": {"migration": all_four}}));
        let all = peers(&[&old, &new]);
        assert!(validate(&new, &SecretState::NotReferenced, &registry(), &all).is_valid());
        // Upstream's default leaves cloud-node-controller under each main Lease: still a conflict.
        let old = cr("old", 1, json!({"provider": "plain", "leaderElection": {"migration": {"enabled": true}}}));
        let new = cr("new", 2, json!({"provider": "plain", "leaderElection": {"migration": {"enabled": true}}}));
        let v = validate(&new, &SecretState::NotReferenced, &registry(), &peers(&[&old, &new]));
        let Validation::Invalid { failures, .. } = &v else { panic!("{v:?}") };
        assert!(
            failures[0].message.contains("both run cloud-node-controller;")
                || failures[0].message.ends_with("both run cloud-node-controller; this one is not deployed"),
            "{}",
            failures[0].message
        );
        assert!(!failures[0].message.contains("LoadBalancer"), "{}", failures[0].message);
        // Different migration Leases guard nothing between them.
        let other = cr(
            "other",
            3,
            json!({"provider": "plain", "controllers": ["service"], "leaderElection": {"migration": {"enabled": true, "leaderName": "elsewhere"}}}),
        );
        let v = validate(&other, &SecretState::NotReferenced, &registry(), &peers(&[&old, &other]));
        assert_eq!(reason_of(&v), reason::CONFLICT);
    }

    #[test]
    fn m7_resources_in_two_namespaces_sharing_a_migration_lease_namespace_do_not_conflict() {
        let moving = |lease_ns: &str| {
            json!({"enabled": true, "leaderName": "moving", "leaseNamespace": lease_ns, "controllerLeaders": [
            {"name": "cloud-node", "component": "*"}, {"name": "cloud-node-lifecycle", "component": "*"},
            {"name": "service", "component": "*"}, {"name": "route", "component": "*"}]})
        };
        let in_ns = |ns: &str, name: &str, created: i64, migration: serde_json::Value| {
            let mut c = cr(name, created, json!({"provider": "plain", "leaderElection": {"migration": migration}}));
            c.metadata.namespace = Some(ns.into());
            c.metadata.uid = Some(format!("uid-{ns}-{name}"));
            c
        };
        let a = in_ns("ccm-a", "aws", 1, moving("ccm-moving"));
        let b = in_ns("ccm-b", "aws", 2, moving("ccm-moving"));
        assert!(validate(&b, &SecretState::NotReferenced, &registry(), &peers(&[&a, &b])).is_valid());
        let elsewhere = in_ns("ccm-b", "aws", 2, moving("ccm-elsewhere"));
        let v = validate(&elsewhere, &SecretState::NotReferenced, &registry(), &peers(&[&a, &elsewhere]));
        assert_eq!(reason_of(&v), reason::CONFLICT, "another lease namespace is another Lease");
        assert_eq!(foreign_lease_namespace(&b).as_deref(), Some("ccm-moving"));
        let config = manager_config(&b, None).unwrap();
        assert_eq!(config.leader_migration_namespace.as_deref(), Some("ccm-moving"));
        assert_eq!(config.leader_election.namespace, "ccm-b", "the main Lease stays in the resource's namespace");
        // Without leaseNamespace each uses a Lease in its own namespace: two Leases guard nothing.
        let a = in_ns(
            "ccm-a",
            "aws",
            1,
            json!({"enabled": true, "leaderName": "moving", "controllerLeaders": [{"name": "service", "component": "*"}]}),
        );
        let b = in_ns(
            "ccm-b",
            "aws",
            2,
            json!({"enabled": true, "leaderName": "moving", "controllerLeaders": [{"name": "service", "component": "*"}]}),
        );
        let v = validate(&b, &SecretState::NotReferenced, &registry(), &peers(&[&a, &b]));
        assert_eq!(reason_of(&v), reason::CONFLICT);
        // A migration Lease named like another resource's main Lease in the lease namespace.
        let there = in_ns("ccm-moving", "moving", 5, json!({"enabled": false}));
        let v = validate(&a, &SecretState::NotReferenced, &registry(), &peers(&[&there]));
        assert!(v.is_valid(), "{v:?}");
        let a = in_ns("ccm-a", "aws", 1, moving("ccm-moving"));
        let v = validate(&a, &SecretState::NotReferenced, &registry(), &peers(&[&there]));
        assert_eq!(reason_of(&v), reason::RESERVED_NAME);
        assert!(v.summary().unwrap().1.contains("namespace ccm-moving"), "{v:?}");
    }

    #[test]
    fn m7_a_lease_namespace_the_operator_does_not_serve_is_refused_naming_the_field() {
        let mut c = cr(
            "aws",
            1,
            json!({"provider": "plain", "leaderElection": {"migration": {"enabled": true, "leaseNamespace": "elsewhere"}}}),
        );
        let allowed = AllowedNamespaces::new(&["kube-system", "ccm-moving"]);
        let v = lease_namespace_not_allowed(&c, &allowed).expect("refused");
        assert_eq!(reason_of(&v), reason::NAMESPACE_NOT_ALLOWED);
        assert!(v.summary().unwrap().1.starts_with("spec.leaderElection.migration.leaseNamespace:"), "{v:?}");
        c.spec.leader_election.migration.as_mut().unwrap().lease_namespace = Some("ccm-moving".into());
        assert!(lease_namespace_not_allowed(&c, &allowed).is_none());
        // Its own namespace, or migration off, needs nothing more.
        c.spec.leader_election.migration.as_mut().unwrap().lease_namespace = Some("kube-system".into());
        assert!(lease_namespace_not_allowed(&c, &AllowedNamespaces::new(&["kube-system"])).is_none());
        c.spec.leader_election.migration.as_mut().unwrap().lease_namespace = Some("elsewhere".into());
        c.spec.leader_election.migration.as_mut().unwrap().enabled = false;
        assert!(lease_namespace_not_allowed(&c, &allowed).is_none());
    }

    #[test]
    fn m7_a_migration_lease_named_like_a_core_components_or_another_resources_lease_is_refused() {
        for name in ["kube-scheduler", "cloud-controller-manager", "kube-anything", "old"] {
            let old = cr("old", 1, json!({"provider": "plain"}));
            let c = cr(
                "a",
                2,
                json!({"provider": "plain", "leaderElection": {"migration": {"enabled": true, "leaderName": name}}}),
            );
            let v = validate(&c, &SecretState::NotReferenced, &registry(), &peers(&[&old]));
            assert_eq!(reason_of(&v), reason::RESERVED_NAME, "{name}");
            assert!(v.summary().unwrap().1.starts_with("spec.leaderElection.migration.leaderName"), "{v:?}");
        }
        let c = cr(
            "a",
            2,
            json!({"provider": "plain", "leaderElection": {"migration": {"enabled": true, "leaderName": "cloud-provider-extraction-migration"}}}),
        );
        assert!(validate(&c, &SecretState::NotReferenced, &registry(), &[]).is_valid());
        let c = cr(
            "a",
            2,
            json!({"provider": "plain", "leaderElection": {"migration": {"enabled": true, "leaderName": "a"}}}),
        );
        let v = validate(&c, &SecretState::NotReferenced, &registry(), &[]);
        assert!(v.summary().unwrap().1.starts_with("spec.leaderElection.migration"), "{v:?}");
    }

    #[test]
    fn service_controllers_conflict_only_on_the_same_class() {
        let old = cr("old", 1, json!({"provider": "plain", "controllers": ["service"]}));
        let classed =
            cr("classed", 2, json!({"provider": "plain", "controllers": ["service"], "loadBalancerClass": "x"}));
        let unclassed = cr("unclassed", 3, json!({"provider": "plain", "controllers": ["service"]}));
        let all = peers(&[&old, &classed, &unclassed]);
        assert!(validate(&classed, &SecretState::NotReferenced, &registry(), &all).is_valid());
        let v = validate(&unclassed, &SecretState::NotReferenced, &registry(), &all);
        assert_eq!(reason_of(&v), reason::CONFLICT);
        assert!(v.summary().unwrap().1.contains("without a loadBalancerClass"));
    }

    #[test]
    fn s28_a_class_that_also_takes_unclassed_services_conflicts_with_an_unclassed_manager() {
        let old = cr("old", 1, json!({"provider": "plain", "controllers": ["service"]}));
        let both = cr(
            "both",
            2,
            json!({"provider": "plain", "controllers": ["service"], "loadBalancerClass": "x", "handleUnclassedServices": true}),
        );
        let other_class =
            cr("y", 3, json!({"provider": "plain", "controllers": ["service"], "loadBalancerClass": "y"}));
        let all = peers(&[&old, &both, &other_class]);
        let v = validate(&both, &SecretState::NotReferenced, &registry(), &all);
        assert_eq!(reason_of(&v), reason::CONFLICT);
        assert!(v.summary().unwrap().1.contains("without a loadBalancerClass"), "{v:?}");
        assert!(validate(&other_class, &SecretState::NotReferenced, &registry(), &all).is_valid());
        let alone = validate(&both, &SecretState::NotReferenced, &registry(), &peers(&[&both]));
        assert!(alone.is_valid(), "{alone:?}");
        let Validation::Valid(valid) = alone else { panic!("valid") };
        assert!(valid.config.to_args().iter().any(|a| a == "--handle-unclassed-services=true"));
    }

    #[test]
    fn handle_unclassed_services_without_a_class_is_refused_naming_the_field() {
        let c = cr("a", 1, json!({"provider": "plain", "handleUnclassedServices": true}));
        let v = validate(&c, &SecretState::NotReferenced, &registry(), &[]);
        assert!(v.summary().unwrap().1.starts_with("invalid spec: spec.handleUnclassedServices: "), "{v:?}");
    }

    #[test]
    fn route_controllers_conflict_unless_routes_are_off() {
        let old = cr("old", 1, json!({"provider": "plain", "controllers": ["route"]}));
        let off = cr("off", 2, json!({"provider": "plain", "controllers": ["route"], "configureCloudRoutes": false}));
        let on = cr("on", 3, json!({"provider": "plain", "controllers": ["route"]}));
        let all = peers(&[&old, &off, &on]);
        assert!(validate(&off, &SecretState::NotReferenced, &registry(), &all).is_valid());
        assert_eq!(reason_of(&validate(&on, &SecretState::NotReferenced, &registry(), &all)), reason::CONFLICT);
    }

    #[test]
    fn disjoint_controllers_do_not_conflict() {
        let a = cr("a", 1, json!({"provider": "plain", "controllers": ["cloud-node", "cloud-node-lifecycle"]}));
        let b = cr("b", 2, json!({"provider": "plain", "controllers": ["service", "route"]}));
        let all = peers(&[&a, &b]);
        assert!(validate(&b, &SecretState::NotReferenced, &registry(), &all).is_valid());
    }

    #[test]
    fn invalid_or_deleting_crs_block_no_one() {
        let bad = cr("bad", 1, json!({"provider": "nimbus"}));
        let mut deleting = cr("deleting", 1, json!({"provider": "plain"}));
        deleting.metadata.deletion_timestamp = Some(Time(Timestamp::from_second(5).unwrap()));
        let new = cr("new", 2, json!({"provider": "plain"}));
        let all = peers(&[&bad, &deleting, &new]);
        assert!(validate(&new, &SecretState::NotReferenced, &registry(), &all).is_valid());
    }

    #[test]
    fn same_creation_time_is_broken_by_name() {
        let a = cr("a", 1, json!({"provider": "plain"}));
        let b = cr("b", 1, json!({"provider": "plain"}));
        let all = peers(&[&a, &b]);
        assert!(validate(&a, &SecretState::NotReferenced, &registry(), &all).is_valid());
        assert!(!validate(&b, &SecretState::NotReferenced, &registry(), &all).is_valid());
    }

    #[test]
    fn conflict_and_missing_secret_are_both_reported() {
        let old = cr("old", 1, json!({"provider": "plain"}));
        let new = cr("new", 2, json!({"provider": "plain", "cloudConfig": {"secretRef": {"name": "cfg"}}}));
        let all = peers(&[&old, &new]);
        let v = validate(&new, &SecretState::NotFound { name: "cfg".into() }, &registry(), &all);
        let (r, message) = v.summary().unwrap();
        assert_eq!(r, reason::CONFLICT);
        assert!(message.contains("does not exist"), "{message}");
    }

    #[test]
    fn namespace_not_allowed_names_the_setting_that_allows_it() {
        let allowed = AllowedNamespaces::new(&["kube-system", " ", "kube-system", "cloud"]);
        assert_eq!(allowed.as_slice(), ["cloud", "kube-system"]);
        assert!(allowed.contains("cloud") && !allowed.contains("tenant-a"));
        let v = namespace_not_allowed("tenant-a", &allowed);
        let (r, message) = v.summary().unwrap();
        assert_eq!(r, reason::NAMESPACE_NOT_ALLOWED);
        assert!(
            message.contains("cloudConfig.namespaces") && message.contains("--cloud-config-namespaces"),
            "{message}"
        );
        assert!(message.contains("tenant-a") && message.contains("cloud, kube-system"), "{message}");
    }

    #[test]
    fn secret_state_debug_hides_the_content() {
        let s = format!("{:?}", found(b"password=hunter2"));
        assert!(!s.contains("hunter2"), "{s}");
    }
}
