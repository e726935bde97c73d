//! The test kit every crate's tests share.
//!
//! - An API server per test ([`TestCluster`]): the in-memory one (crate `memory-apiserver`), or
//!   a turn on a genuine etcd + kube-apiserver ([`genuine`], when `CCM_TEST_ASSETS` is set);
//!   [`backend_tests!`] writes a scenario once and runs it on both.
//! - Waiting: [`eventually`], [`eventually_within`] and [`poll_within`].
//! - Fixtures ([`fixtures`]): a LoadBalancer Service, a Node as kubelet registers it, a
//!   CloudControllerManager resource, Secrets, Namespaces.
//! - Logs of the code under test in the test's output ([`init_tracing`]); the repository's
//!   root ([`workspace_root`]).
//!
//! The in-memory server's own types are re-exported, so a crate's tests need this crate only.
//!
//! ```ignore
//! testkit::backend_tests! {
//!     /// A Node gets its provider ID.
//!     async fn n1_sets_provider_id(backend) {
//!         let cluster = testkit::TestCluster::start(backend).await.expect("cluster");
//!         let nodes: kube::Api<Node> = kube::Api::all(cluster.client());
//!         nodes.create(&Default::default(), &testkit::kubelet_node("n1")).await.expect("create");
//!         testkit::eventually("n1's provider ID", || async { nodes.get("n1").await.ok()?.spec?.provider_id }).await;
//!     }
//! }
//! ```

pub mod backend;
mod error;
pub mod fixtures;
pub mod genuine;
mod logs;
pub mod moto;
mod repo;
pub mod tls;
pub mod wait;
mod waiting;

pub use backend::{Backend, TestCluster};
pub use error::Error;
pub use fixtures::{
    HOSTNAME_LABEL, Meta, NodeFixture, ServiceFixture, UNINITIALIZED, cloud_config_labels, cloud_config_secret,
    config_map, cr, ingress, ingress_ips, kubelet_node, lb_service, namespace, node, secret, uninitialized_taint,
};
pub use logs::init_tracing;
pub use memory_apiserver::{
    FaultConfig, FaultRule, Faults, RemoteControl, RequestFilter, RequestLog, RequestRecord, Sandbox, TestApiServer,
};
pub use repo::workspace_root;
pub use waiting::{POLL, Settled, WAIT, eventually, eventually_within, poll_within};
