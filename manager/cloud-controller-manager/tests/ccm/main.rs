//! The cloud-controller-manager's integration tests, one module per former test file: the
//! controllers with the fake provider on both API server backends, events, the engine and the
//! binary, and serving. One test binary links the dependency tree once; shared helpers live in
//! `kit`. Run one module with `cargo test -p cloud-controller-manager --test ccm node_controller::`.

mod events;
mod framework;
mod kit;
mod leader_migration;
mod lifecycle_controller;
mod node_controller;
mod route_controller;
mod service_controller;
mod serving;
mod shadow;
