//! The `fake` provider: an in-memory cloud for tests and demos, never for production.
//!
//! The counterpart of upstream's `fake/fake.go`. Instances, load balancers and routes live in
//! memory; every call is counted per method; errors and latency can be injected per method.
//! Tests build one with [`FakeProvider::new`], keep an `Arc<FakeProvider>` to steer it, and
//! hand the manager a clone as `Arc<dyn CloudProvider>`. Benchmarks and demos run the real
//! binary with `--cloud-provider=fake --cloud-config=<file>`, where the file is a
//! [`FakeConfig`] in YAML:
//!
//! ```yaml
//! autoInstances: true          # every Node name is a running instance
//! latency: 20ms                # per instance, zone, route and cluster call
//! loadBalancerLatency: 200ms   # per load-balancer call
//! batchSize: 100               # reported batch size; batch calls are chunked by it
//! loadBalancerIPRange: 198.18.0.0/15
//! instances:
//!   - name: node-1
//!     zone: zone-b
//!     exists: true
//!     shutdown: false
//! failures:
//!   - method: instance_metadata
//!     times: 3                 # or rate: 0.1
//!     error: unavailable       # see FakeErrorKind
//! disableRoutes: true
//! health: { healthy: false, reason: CredentialsRejected, message: "401" }
//! ```
//!
//! `profile: bench` answers as the shared upstream Go binary's `bench` provider does (see the
//! crate README): the same cluster can then be driven by either.
//!
//! Five jobs, one module each: [`provider`] (the cloud and the provider traits), [`calls`] (the
//! call log and fault injection), [`addresses`] (load-balancer address allocation),
//! [`config`] (the cloud-config) and [`orphans`] (what it owns and what it honours). The provider builds on the other three, which know nothing of it.

pub mod addresses;
pub mod calls;
pub mod config;
pub mod orphans;
pub mod provider;

pub use addresses::{BENCH_ADDRESSES, DEFAULT_LB_RANGE, bench_address, is_bench_address};
pub use calls::{Call, CallLog, ChangeMetric, Fault, LoadBalancerChange, RECENT_CALLS, methods};
pub use config::{
    FakeAddressConfig, FakeConfig, FakeErrorKind, FakeFailureConfig, FakeHealthConfig, FakeInstanceConfig, FakeProfile,
};
pub use provider::{
    BENCH_INSTANCE_LATENCY, BENCH_INSTANCE_TYPE, BENCH_LB_LATENCY, BENCH_PROVIDER_ID_PREFIX, BENCH_REGION, BENCH_ZONE,
    CHANGES_METRIC, FakeCapabilities, FakeInstance, FakeLoadBalancer, FakeProvider, NAME, PROVIDER_ID_PREFIX,
    bench_internal_ip, register,
};
