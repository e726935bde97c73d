//! Validation (pure): is a CloudControllerManager usable as specified? Produces the
//! `ConfigValid` verdict and, when valid, what the build step and an embedded engine need.
//!
//! One job per file: [`pipeline`] runs the checks in order and gives the verdict ([`verdict`]);
//! [`conflicts`] between resources, [`manager_config`] (spec to `ManagerConfig`), installation
//! [`policy`] (with [`quantity`] for resources), [`upstream`] (what an upstream image cannot do), [`foreign`] (a CCM this operator does not run) and [`environment`] are its parts; [`bounded`] runs it off the async runtime
//! within a time limit. [`secret`] is its input from the dereference step.

pub mod bounded;
pub mod conflicts;
pub mod credentials;
pub mod environment;
pub mod foreign;
pub mod manager_config;
pub mod pipeline;
pub mod policy;
pub mod quantity;
pub mod secret;
pub mod upstream;
pub mod verdict;

#[cfg(test)]
mod testing;

pub use bounded::{PARSE_TIME_LIMIT, Subject, parse_timed_out, validate_bounded};
pub use conflicts::{
    Peer, RESERVED_LEASE_NAMES, RESERVED_LEASE_PREFIXES, RESERVED_NAME_SUFFIXES, conflicts_of, name_conflicts,
    reserved_lease_name,
};
pub use credentials::{credentials_file_env, credentials_refused};
pub use environment::{
    AllowedNamespaces, Environment, check_environment, lease_namespace_not_allowed, namespace_not_allowed,
    runs_proxy_data_path,
};
pub use foreign::{
    FOREIGN_LEASE_NAMESPACE, FOREIGN_LEASES, ForeignHolder, check_foreign, foreign_holders, is_foreign_lease,
};
pub use manager_config::{
    Controllers, effective_leader_migration, foreign_lease_namespace, leader_migration_of, manager_config,
    manager_config_with, migration_lease_name, migration_lease_namespace,
};
pub use pipeline::{check, validate};
pub use policy::{
    ALLOWED_EXTRA_ARGS, DEFAULT_MAX_CONTAINER_RESOURCES, DEFAULT_MAX_REPLICAS, DEFAULT_PRIORITY_CLASS, MAX_VERBOSITY,
    Policy, PolicyError, ResourceMaximum, announcer_refused, check_policy, default_max_container_resources,
    every_node_refused, extra_arg_refused, image_allowed, image_entry_allows, image_reference_refused,
    parse_max_container_resources, reserved_by_installation, resources_refused,
};
pub use secret::SecretState;
pub use upstream::upstream_refused;
pub use verdict::{Checked, CloudConfigRef, Failure, Validated, Validation};
