//! An in-memory Kubernetes API server for tests and the sandbox.
//!
//! Test and demo infrastructure, not a product: JSON over plain HTTP on loopback, no
//! authentication, RBAC, admission, schema validation, CEL, protobuf or aggregation.
//! See `e2e/README.md` for what it implements.
//!
//! ```no_run
//! # async fn demo() -> Result<(), e2e_apiserver::Error> {
//! let server = e2e_apiserver::TestApiServer::start().await?;
//! let client = server.client();
//! // ... drive `client`, or point a child process at `server.kubeconfig_path()` ...
//! server.shutdown().await;
//! # Ok(()) }
//! ```

pub mod backend;
mod control;
mod convert;
mod core;
mod discovery;
mod error;
mod faults;
pub mod genuine;
mod local;
mod managed;
mod patch;
mod request_log;
mod resources;
mod response;
mod sandbox;
mod schema;
mod selectors;
mod server;
mod services;
mod store;
mod strategy;
mod table;
mod util;
pub mod wait;
mod watch;

pub use backend::{Backend, TestCluster};
pub use control::{RemoteControl, RequestFilter, Stats};
pub use error::Error;
pub use faults::{FaultConfig, FaultRule, Faults};
pub use local::{TestApiServer, TestApiServerBuilder, kubeconfig_yaml};
pub use request_log::{RequestLog, RequestRecord};
pub use sandbox::{Sandbox, SandboxBuilder, SandboxContext};
pub use util::rss_bytes;
