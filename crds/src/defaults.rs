//! Defaults shared by the resource (CRD), the operator and the manager binary: one value per
//! knob. Each was chosen from runs on a genuine kube-apiserver (docs/benchmarks.md, "Choosing
//! the worker defaults"); docs/migrating.md lists where they differ from upstream.

/// `--concurrent-node-syncs` / `spec.concurrency.nodeSyncs` (upstream 1). With batched
/// lookups, 5 workers initialized 5,000 Nodes in 15.5–15.6 s against 15.6–20.9 s for 1.
pub const CONCURRENT_NODE_SYNCS: i32 = 5;

/// `--concurrent-service-syncs` / `spec.concurrency.serviceSyncs` (upstream 1). At 1 s per
/// load-balancer call and the default 20 QPS, 100 Services took 101 s with 1 worker, 13.2 s
/// with 8 and 8.7 s with 32 (the QPS ceiling; 96 gave nothing more).
pub const CONCURRENT_SERVICE_SYNCS: i32 = 32;

/// `--concurrent-route-syncs` / `spec.concurrency.routeSyncs`, as upstream.
pub const CONCURRENT_ROUTE_SYNCS: i32 = 1;
