//! What the engine and its controllers are configured with.
//!
//! The binary fills this from upstream-compatible flags; the operator's Embedded mode fills it
//! from a CloudControllerManager spec. Defaults are upstream's unless a field says otherwise.

use std::time::Duration;

use crds::controllers::ControllerSelection;
use ipnet::IpNet;

use crate::ownership::NodeOwnership;

/// Upstream's `--min-resync-period` default: the lower bound of the watch-based route
/// controller's safety period.
pub const DEFAULT_ROUTE_RESYNC_PERIOD: Duration = Duration::from_secs(12 * 3600);

/// KEP-5237's shortest time between two route passes triggered by Node changes.
pub const ROUTE_MIN_SYNC_INTERVAL: Duration = Duration::from_secs(10);

/// Settings shared by the engine and every controller.
#[derive(Debug, Clone)]
pub struct ControllerOptions {
    /// `--cluster-name`: passed to every load-balancer and route call.
    pub cluster_name: String,
    /// `--cluster-cidr`, parsed; empty when not given.
    pub cluster_cidrs: Vec<IpNet>,
    /// Why `--cluster-cidr` could not be used, if it was given but invalid. The route controller
    /// reports this on its health check instead of the manager failing to start.
    pub cluster_cidr_error: Option<String>,
    /// `--configure-cloud-routes`.
    pub configure_cloud_routes: bool,
    /// `--controllers`, validated.
    pub controllers: ControllerSelection,
    /// `--route-reconciliation-period`: full route pass interval, when `watch_based_routes` is
    /// off.
    pub route_reconciliation_period: Duration,
    /// `--feature-gates=CloudControllerManagerWatchBasedRoutesReconciliation` (KEP-5237, alpha,
    /// off by default): routes are reconciled on Node changes, at most once per
    /// `route_min_sync_interval`, and by a safety pass every `route_resync_period` to twice that.
    pub watch_based_routes: bool,
    /// `--min-resync-period`: lower bound of the watch-based safety period (12 h).
    pub route_resync_period: Duration,
    /// Shortest time between two watch-based passes ([`ROUTE_MIN_SYNC_INTERVAL`], upstream's
    /// constant; shorter only in tests).
    pub route_min_sync_interval: Duration,
    /// `--cloud-provider-platforms` (KEP-5778): the Nodes this manager initializes, deletes,
    /// taints and routes; by default every Node.
    pub node_ownership: NodeOwnership,
    /// `--node-monitor-period`: lifecycle controller pass interval.
    pub node_monitor_period: Duration,
    /// `--node-status-update-frequency`: node address refresh interval.
    pub node_status_update_frequency: Duration,
    /// `--concurrent-node-syncs`: cloud-node workers (at least 1). Defaults to
    /// [`crds::defaults::CONCURRENT_NODE_SYNCS`], not upstream's 1; 1 is the upstream-equivalent setting.
    pub concurrent_node_syncs: usize,
    /// `--concurrent-node-status-updates`: address refresh workers; 0 means `concurrent_node_syncs`.
    pub concurrent_node_status_updates: usize,
    /// `--concurrent-service-syncs`: provider calls of queued service syncs in flight (S29:
    /// up to four syncs per slot, writing to the API while others call the cloud) and node-pass
    /// parallelism (at least 1). Defaults to [`crds::defaults::CONCURRENT_SERVICE_SYNCS`], not
    /// upstream's 1; 1 gives upstream's one load-balancer call at a time.
    pub concurrent_service_syncs: usize,
    /// `--concurrent-route-syncs` (addition): route operations in flight are still capped at 200.
    pub concurrent_route_syncs: usize,
    /// `--node-batch-size` (addition): most Nodes per batched instance lookup; the provider's
    /// own `batch_size` caps it too. 1 reproduces upstream's one-call-per-node behaviour.
    pub node_batch_size: usize,
    /// `--node-batch-window` (addition): while a lookup is under way, how long new Nodes are
    /// collected before the next batched lookup; an idle controller looks a Node up at once.
    pub node_batch_window: Duration,
    /// `--node-deletion-grace-period` (addition): how long an instance must be reported absent
    /// before its Node is deleted. Zero is upstream's immediate deletion.
    pub node_deletion_grace_period: Duration,
    /// `--load-balancer-class` (addition): handle Services of exactly this class instead of
    /// unclassed ones.
    pub load_balancer_class: Option<String>,
    /// `--handle-unclassed-services` (addition): with a class, also take Services without one.
    pub handle_unclassed_services: bool,
    /// `--load-balancer-resync-period` (addition): periodic re-ensure of every load balancer to
    /// repair cloud-side drift; `None` (upstream) never re-ensures.
    pub load_balancer_resync_period: Option<Duration>,
    /// `--shadow` (addition): every controller compares instead of acting, into the record the
    /// engine keeps for the run; false (the default) acts. See docs/shadow.md.
    pub shadow: bool,
    /// `--orphan-sweep` (addition, `spec.orphans.sweep`): delete cloud objects that carry this
    /// cluster's ownership and belong to no Service (S35); off, they are only reported (S34).
    /// Never in shadow mode.
    pub orphan_sweep: bool,
    /// `--orphan-scan-period` (addition): time between two orphan scans (10 minutes); zero
    /// turns the scan off.
    pub orphan_scan_period: Duration,
}

impl Default for ControllerOptions {
    fn default() -> Self {
        Self {
            cluster_name: crds::defaults::CLUSTER_NAME.to_string(),
            cluster_cidrs: Vec::new(),
            cluster_cidr_error: None,
            configure_cloud_routes: true,
            controllers: ControllerSelection::all(),
            route_reconciliation_period: Duration::from_secs(10),
            watch_based_routes: false,
            route_resync_period: DEFAULT_ROUTE_RESYNC_PERIOD,
            route_min_sync_interval: ROUTE_MIN_SYNC_INTERVAL,
            node_ownership: NodeOwnership::all(),
            node_monitor_period: Duration::from_secs(5),
            node_status_update_frequency: Duration::from_secs(5 * 60),
            concurrent_node_syncs: crds::defaults::CONCURRENT_NODE_SYNCS as usize,
            concurrent_node_status_updates: 0,
            concurrent_service_syncs: crds::defaults::CONCURRENT_SERVICE_SYNCS as usize,
            concurrent_route_syncs: crds::defaults::CONCURRENT_ROUTE_SYNCS as usize,
            node_batch_size: 500,
            node_batch_window: Duration::from_millis(100),
            node_deletion_grace_period: Duration::ZERO,
            load_balancer_class: None,
            handle_unclassed_services: false,
            load_balancer_resync_period: None,
            shadow: false,
            orphan_sweep: false,
            orphan_scan_period: Duration::from_secs(600),
        }
    }
}

impl ControllerOptions {
    /// Address refresh workers, resolving 0 to `concurrent_node_syncs`.
    pub fn node_status_workers(&self) -> usize {
        if self.concurrent_node_status_updates == 0 {
            self.concurrent_node_syncs.max(1)
        } else {
            self.concurrent_node_status_updates
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_upstream() {
        let o = ControllerOptions::default();
        assert_eq!(o.cluster_name, "kubernetes");
        assert!(o.configure_cloud_routes);
        assert_eq!(o.route_reconciliation_period, Duration::from_secs(10));
        assert_eq!(o.node_monitor_period, Duration::from_secs(5));
        assert_eq!(o.node_status_update_frequency, Duration::from_secs(300));
        // Deliberately not upstream's 1 (docs/migrating.md), and the resource's defaults.
        assert_eq!(o.concurrent_node_syncs, 5);
        assert_eq!(o.concurrent_service_syncs, 32);
        let crd = crds::v1alpha1::Concurrency::default();
        assert_eq!(
            (crd.node_syncs as usize, crd.service_syncs as usize),
            (o.concurrent_node_syncs, o.concurrent_service_syncs)
        );
        assert_eq!(o.node_deletion_grace_period, Duration::ZERO);
        assert!(o.load_balancer_resync_period.is_none());
        assert_eq!(o.controllers.enabled().len(), 4);
    }

    #[test]
    fn zero_status_workers_means_node_sync_workers() {
        let o = ControllerOptions { concurrent_node_syncs: 7, ..Default::default() };
        assert_eq!(o.node_status_workers(), 7);
        let o = ControllerOptions { concurrent_node_status_updates: 3, ..o };
        assert_eq!(o.node_status_workers(), 3);
    }
}
