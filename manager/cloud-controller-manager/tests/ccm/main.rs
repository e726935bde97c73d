//! The cloud-controller-manager's integration tests, one module per former test file: the
//! controllers with the fake provider on both API server backends, events, the engine and the
//! binary, and serving. One test binary links the dependency tree once; what the modules share
//! is the test kit (`testkit`) and `kit`. Run one module with
//! `cargo test -p cloud-controller-manager --test ccm node_controller::`.
//!
//! - `api_outage`: recovery after an API-server outage (measured, `--ignored`; issue 49 item 7).
//! - `events`: the event sink under bursts: final events written, series, drops counted.
//! - `framework`: leader election, the HTTP endpoints, the ProviderHealthy reporter, the binary.
//! - `kit`: a controller's test world (`Engine`), a test alone in a process, the fake's resource.
//! - `leader_migration`: leader migration (M7) between two binaries sharing a migration Lease.
//! - `lifecycle_controller`: cloud-node-lifecycle-controller, L1–L5 and our additions.
//! - `node_controller`: cloud-node-controller, N1–N18 and our additions.
//! - `route_controller`: node-route-controller, R1–R13, retries and the 200-operation cap.
//! - `service_controller`: service-lb-controller, S1–S24 and our additions, the crash test.
//! - `serving`: the endpoint server over real sockets: TLS, delegated auth, timeouts, exhaustion.
//! - `shadow`: shadow mode writes nothing and reports exactly the expected differences.
//! - `upstream_flags`: every flag of upstream v1.36's `--help` parses (M8), against a snapshot.
//! - `webhook`: the genuine API server calls the manager's webhook listener (KEP-2699 hosting).

mod api_outage;
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
mod upstream_flags;
mod webhook;
