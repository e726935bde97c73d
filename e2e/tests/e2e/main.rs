//! The end-to-end scenarios, one module per area (see `e2e/tests/README.md`): the operator on
//! both API server backends (`operator_*`, `rbac`, `chart`), the sandbox (`sandbox_*`), the
//! images (`images`), the dependency policy (`dependencies`) and the documentation (`docs`,
//! `walkthrough`). One test binary links the dependency tree once and shares one genuine control
//! plane (its tests take turns on it); what the modules share is the test kit (`testkit`) and
//! `kit`. Run one module with `cargo test -p e2e --test e2e rbac::`.
//!
//! The real-cluster scenarios are the one other test binary (`tests/realcluster.rs`): they need
//! their own runner (one cluster per run, scenarios in order, the host checked at the end).

mod admission_bounds;
mod admission_policy;
mod chart;
mod dependencies;
mod docs;
mod images;
mod kit;
mod operator_crd;
mod operator_deployment;
mod operator_embedded;
mod operator_failover;
mod operator_installation;
mod operator_leader_migration;
mod operator_lifecycle;
mod operator_manager_pods;
mod operator_node_manager;
mod operator_restart;
mod operator_security;
mod operator_validation;
mod rbac;
mod sandbox_console;
mod sandbox_deployment;
mod sandbox_embedded;
mod upstream;
mod walkthrough;
