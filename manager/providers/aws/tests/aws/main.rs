//! The `aws` provider against moto (an AWS emulator started by each test on a free loopback
//! port) and the controllers against an API server (the local one, and a genuine kube-apiserver
//! when `CCM_TEST_ASSETS` is set). Every AWS outcome is checked through the emulator's own API.
//!
//! Skips (one printed line per test) when `moto_server` is not installed. moto runs with the
//! corrections of `support/moto.rs`, each making it answer as AWS does. The modules:
//!
//! - `kit`: the world seeded in moto, the API-server side (`Env`), fixtures, readers of AWS state.
//! - `proxy`: a proxy in front of moto that counts requests, throttles, and "kills" the caller.
//! - `nodes`, `nlb`, `classic`, `routes`, `config`: the provider area by area.
//! - `faults`: kills at every request, throttling, security-group modes.
//! - `adoption`: load balancers made by hand as upstream makes them, adopted quietly.
//! - `orphans`: the orphan scan's listing and deletion of what the cluster owns (S34, S35).
//! - `bench`: benchmarks, ignored unless asked for.
//!
//! Against upstream cloud-provider-aws v1.36.1's own binary (skipped without it, see `upstream`):
//!
//! - `upstream`: the binary, unpacked from `../shared/upstream-aws` (or `CCM_UPSTREAM_AWS`) and run.
//! - `world`: the VPC both managers share (subnets, groups, instances), seeded alike.
//! - `cases`: the differential suite's cases; `snapshot`: what a side left, normalised.
//! - `differential`: every case through both managers, compared field by field.
//! - `takeover`: upstream's load balancers taken over by ours with no mutating call, and handed back.
//! - `beside`: ours beside a running upstream: in shadow mode, and taking over by leader migration.

#[path = "../support/moto.rs"]
mod moto;
#[path = "../support/wire.rs"]
mod wire;

mod kit;
mod proxy;
mod snapshot;
mod upstream;
mod world;

mod adoption;
mod bench;
mod beside;
mod cases;
mod classic;
mod config;
mod differential;
mod faults;
mod nlb;
mod nodes;
mod orphans;
mod routes;
mod takeover;
