//! A Kubernetes API server that keeps everything in memory, for tests and the sandbox.
//!
//! Test and demo infrastructure, not a product: JSON over plain HTTP on loopback, no
//! authentication, RBAC, admission, protobuf or aggregation.
//! See `e2e/README.md` for what it implements. Tests reach it through the test kit
//! (`e2e/testkit`), which also runs the same scenarios on a genuine kube-apiserver.
//!
//! ```no_run
//! # async fn demo() -> Result<(), memory_apiserver::Error> {
//! let server = memory_apiserver::TestApiServer::start().await?;
//! let client = server.client();
//! // ... drive `client`, or point a child process at `server.kubeconfig_path()` ...
//! server.shutdown().await;
//! # Ok(()) }
//! ```

mod control;
mod convert;
mod core;
mod discovery;
mod error;
mod fault_proxy;
mod faults;
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
mod watch;

pub use control::{RemoteControl, RequestFilter, Stats};
pub use error::Error;
pub use fault_proxy::FaultProxy;
pub use faults::{FaultConfig, FaultRule, Faults};
pub use local::{TestApiServer, TestApiServerBuilder, kubeconfig_yaml};
pub use managed::default_manager;
pub use request_log::{LogData, LogSource, RequestLog, RequestRecord};
pub use sandbox::{Sandbox, SandboxBuilder, SandboxContext};
pub use util::{random_suffix, rss_bytes};
