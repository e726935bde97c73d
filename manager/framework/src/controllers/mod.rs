//! The built-in controllers, one module each.

pub mod lifecycle;
pub mod node;

use crate::controller::Controller;

pub mod route;
pub mod service;
pub mod shadow;

/// The built-in controller for `controller`: every name the `--controllers` flag accepts has one.
pub fn builtin(controller: crds::controllers::Controller) -> Box<dyn Controller> {
    use crds::controllers::Controller as Name;
    match controller {
        Name::CloudNode => Box::new(node::NodeController::new()),
        Name::CloudNodeLifecycle => Box::new(lifecycle::LifecycleController::new()),
        Name::ServiceLb => Box::new(service::ServiceController::new()),
        Name::NodeRoute => Box::new(route::RouteController::new()),
    }
}
