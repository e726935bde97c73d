//! The built-in controllers, one module each.

pub mod lifecycle;
pub mod node;

use crate::controller::Controller;

pub mod route;
pub mod service;

/// The built-in controller with canonical name `name`, if it exists.
pub fn builtin(name: &str) -> Option<Box<dyn Controller>> {
    match name {
        node::NAME => Some(Box::new(node::NodeController::new())),
        lifecycle::NAME => Some(Box::new(lifecycle::LifecycleController::new())),
        service::NAME => Some(Box::new(service::ServiceController::new())),
        route::NAME => Some(Box::new(route::RouteController::new())),
        _ => None,
    }
}
