//! Built-in providers.

#[cfg(feature = "aws")]
pub mod aws;
pub mod baremetal;
pub mod fake;
pub mod safe_yaml;

use crate::registry::Registry;

/// Register every built-in provider into `registry`.
pub fn register_builtin(registry: &mut Registry) {
    // A name clash means the caller registered its own provider under a built-in name first.
    if let Err(error) = fake::register(registry) {
        tracing::warn!(%error, "built-in provider not registered");
    }
    if let Err(error) = baremetal::register(registry) {
        tracing::warn!(%error, "built-in provider not registered");
    }
    #[cfg(feature = "aws")]
    if let Err(error) = aws::register(registry) {
        tracing::warn!(%error, "built-in provider not registered");
    }
}
