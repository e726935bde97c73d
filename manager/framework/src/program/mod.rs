//! The `cloud-controller-manager` program: its command line, the settings read from it, and
//! [`run_main`](app::run_main). It stands above the engine: it builds the provider and an
//! engine from the settings, and nothing below it (the engine, the controllers, the
//! providers, the operator's Embedded mode) imports it.
//!
//! - [`flags`]: the command line, with upstream's names and defaults.
//! - [`features`]: `--feature-gates`, upstream's gates resolved.
//! - [`warnings`]: flags accepted for compatibility that have no effect or are deprecated.
//! - [`manager_config`]: the flags as a [`crate::config::ManagerConfig`], the operator's round trip.
//! - [`settings`]: the flags, validated, as the [`settings::Settings`] the program runs with.
//! - [`app`]: `run_main`: parse, set up logging, build the provider and the engine, run.

pub mod app;
pub mod features;
pub mod flags;
pub mod manager_config;
pub mod settings;
pub mod warnings;

use std::time::Duration;

use crate::error::Error;

/// The error for an unusable value of `flag`.
fn invalid(flag: &'static str, message: impl Into<String>) -> Error {
    Error::InvalidFlag { flag, message: message.into() }
}

/// `d`, unless it is zero (a period that would spin).
fn non_zero(flag: &'static str, d: Duration) -> Result<Duration, Error> {
    if d.is_zero() {
        return Err(invalid(flag, "must be greater than 0"));
    }
    Ok(d)
}
