//! The built-in controllers, one module each.

use crate::controller::Controller;

/// The built-in controller with canonical name `name`, if it exists.
pub fn builtin(name: &str) -> Option<Box<dyn Controller>> {
    match name {
        _ => None,
    }
}
