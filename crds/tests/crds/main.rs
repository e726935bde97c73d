//! The CRD crate's integration tests, one module per former test file: the generated CRD
//! (`crd`) and every limit it states enforced by the Rust validation (`validation_limits`).
//! One test binary; run one module with `cargo test -p crds --test crds crd::`.

mod crd;
mod validation_limits;
