//! The test kit's own tests, on both API server backends (`genuine` runs when `CCM_TEST_ASSETS`
//! is set). Run one with `cargo test -p testkit --test testkit backend::`.
//!
//! - `backend`: both backends serve the same client API; the genuine one enforces RBAC for
//!   ServiceAccount tokens, reads its audit log as the request log, starts each test without
//!   earlier tests' objects, and injects faults through its proxy.

mod backend;
