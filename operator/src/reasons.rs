//! The operator's condition and event reasons, defined in the API crate ([`crds::reasons`]);
//! re-exported here for the tests that name them through the operator.

pub use crds::reasons::{available, config_valid, degraded, events, progressing, provider_healthy};
