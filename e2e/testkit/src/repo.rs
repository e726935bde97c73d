//! Where the repository is, for tests that read its files (docs, charts, examples).

use std::path::PathBuf;

/// The repository's root directory (this crate lives in `e2e/testkit`).
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}
