//! Built-in providers.

use crate::registry::Registry;

/// Register every built-in provider into `registry`.
pub fn register_builtin(registry: &mut Registry) {
    let _ = registry;
}
