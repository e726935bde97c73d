//! The example provider's integration tests, one module per former test file: it initializes a
//! Node on both API server backends (`cloud_node`), and its dependency tree holds no built-in
//! provider (`dependencies`). One test binary; run one module with
//! `cargo test -p out-of-tree-provider --test example dependencies::`.

mod cloud_node;
mod dependencies;
