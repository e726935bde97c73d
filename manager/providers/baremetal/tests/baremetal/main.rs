//! The baremetal provider's integration tests, one module per former test file: the built-in
//! controllers with the provider (`baremetal`), its proxy-mode data path (`baremetal_proxy`) and
//! proxy mode under a flood (`baremetal_flood`), on both API server backends. One test binary
//! links the dependency tree once; shared helpers live in `kit`. Run one module with `cargo test -p ccm-provider-baremetal --test baremetal baremetal_proxy::`.

mod announce_guard;
mod baremetal;
mod baremetal_flood;
mod baremetal_proxy;
mod bgp_bird;
mod kit;
mod l2_announce;
mod pool_import;
mod pools;
mod service_features;
