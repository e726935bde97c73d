//! Defaults shared by the resource (CRD), the operator and the manager binary: one value per
//! knob. Each was chosen from runs on a genuine kube-apiserver (docs/benchmarks.md, "Choosing
//! the worker defaults"); docs/migrating.md lists where they differ from upstream.

/// `--concurrent-node-syncs` / `spec.concurrency.nodeSyncs` (upstream 1). With batched
/// lookups, 5 workers initialized 5,000 Nodes in 15.5–15.6 s against 15.6–20.9 s for 1.
pub const CONCURRENT_NODE_SYNCS: i32 = 5;

/// `--concurrent-service-syncs` / `spec.concurrency.serviceSyncs` (upstream 1). At 1 s per
/// load-balancer call and the default 20 QPS, 100 Services took 101 s with 1 worker, 13.2 s
/// with 8 and 8.7 s with 32 (the QPS ceiling; 96 gave nothing more). It bounds provider
/// calls, not syncs: four syncs per slot overlap their API writes with the calls (S29).
pub const CONCURRENT_SERVICE_SYNCS: i32 = 32;

/// `--concurrent-route-syncs` / `spec.concurrency.routeSyncs`, as upstream.
pub const CONCURRENT_ROUTE_SYNCS: i32 = 1;

/// `--concurrent-*-syncs` / `spec.concurrency.*`: the fewest workers a controller may have
/// (upstream takes 0 and then never syncs anything).
pub const MIN_WORKERS: i32 = 1;

/// `--leader-elect-lease-duration` / `spec.leaderElection.leaseDuration`, as upstream.
pub const LEASE_DURATION: std::time::Duration = std::time::Duration::from_secs(15);
/// `--leader-elect-renew-deadline` / `spec.leaderElection.renewDeadline`, as upstream.
pub const RENEW_DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);
/// `--leader-elect-retry-period` / `spec.leaderElection.retryPeriod`, as upstream.
pub const RETRY_PERIOD: std::time::Duration = std::time::Duration::from_secs(2);
/// The most a candidate stretches the retry period by, at random, so standbys do not poll in
/// step (client-go's `JitterFactor`); the renew deadline must exceed the stretched period.
pub const LEADER_ELECTION_JITTER: f64 = 1.2;

/// `--cluster-name` / `spec.clusterName`, as upstream.
pub const CLUSTER_NAME: &str = "kubernetes";
/// `--leader-elect-resource-namespace` of a manager run by hand, as upstream.
pub const LEASE_NAMESPACE: &str = "kube-system";
/// `--leader-elect-resource-name` of a manager run by hand, as upstream.
pub const LEASE_NAME: &str = "cloud-controller-manager";
/// `--secure-port`, as upstream; also the port of the operator's manager pods.
pub const SECURE_PORT: u16 = 10258;
