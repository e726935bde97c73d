//! A cloud-controller-manager framework: the Rust counterpart of `k8s.io/cloud-provider`.
//!
//! A cloud vendor implements [`provider::CloudProvider`], registers it in a
//! [`registry::Registry`], and runs the manager. The engine runs the enabled controllers on
//! shared watch caches while this replica holds the leader-election Lease.

pub mod cache;
pub mod capabilities;
pub mod client;
pub mod config;
pub mod config_watch;
pub mod controller;
pub mod controllers;
pub mod engine;
pub mod error;
pub mod events;
pub mod go_values;
pub mod health;
pub mod http;
pub mod leader;
pub mod leader_migration;
pub mod metrics;
pub mod options;
pub mod orphans;
pub mod ownership;
pub mod process;
pub mod program;
pub mod provider;
pub mod registry;
pub mod safe_yaml;
pub mod serving;
pub mod shadow;
pub mod status;
#[cfg(test)]
mod test_log;
pub mod webhook;

pub use async_trait::async_trait;
pub use error::Error;
pub use program::app::run_main;
