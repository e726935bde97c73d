//! The baremetal provider's integration tests, one module per former test file. One test
//! binary links the dependency tree once; what the modules share is the test kit (`testkit`) and
//! `kit`. Run one module with `cargo test -p ccm-provider-baremetal --test baremetal baremetal_proxy::`.
//!
//! - `announce_guard`: an address written by hand outside the pools is never announced (ARP,
//!   NDP, BGP) while a pool address beside it is; needs root and BIRD 2.
//! - `baremetal`: the built-in controllers with the provider, on both API server backends.
//! - `baremetal_flood`: proxy mode under a flood of TCP connections and UDP sources, with the
//!   whole manager in this process.
//! - `baremetal_proxy`: proxy mode's data path carries real traffic to stand-in nodePorts.
//! - `bgp_bird`: BGP announcement through BIRD between namespaces; needs root and BIRD 2.
//! - `kit`: stand-ins for what listens on a Node (a nodePort backend, kube-proxy's health check).
//! - `l2_announce`: L2 announcement (ARP, NDP) on a namespaced Ethernet segment; needs root.
//! - `l2_health`: self-healing announcers: an interface down gives the addresses up and back
//!   (namespaces: root), kube-proxy's health check.
//! - `l2_records`: which node answers, as `ServiceAnnouncement` records, on both API server backends.
//! - `pool_import`: MetalLB and Cilium LB-IPAM pools read in place, no Service changes address.
//! - `pool_policy`: a pool's `advertisement` (nodes, preferred node, BGP attributes) through
//!   the announcers' sources, on both API server backends.
//! - `pools`: `LoadBalancerIPPool` resources: addresses, status, `autoAssign`, `namespaceSelector`.
//! - `service_features`: the `LoadBalancerProvisioned` reasons, MetalLB's annotations, dual stack.

mod announce_guard;
mod baremetal;
mod baremetal_flood;
mod baremetal_proxy;
mod bgp_bird;
mod kit;
mod l2_announce;
mod l2_health;
mod l2_interfaces;
mod l2_records;
mod pool_import;
mod pool_policy;
mod pools;
mod service_features;
