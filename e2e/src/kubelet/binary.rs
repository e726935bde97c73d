//! Where the `cloud-controller-manager` binary is, and the command that builds it.

use std::path::{Path, PathBuf};

use crate::Error;

/// The command that builds the `cloud-controller-manager` binary next to the sandbox's, with the
/// same features as the README's commands (so it rebuilds nothing they built).
pub const BUILD_MANAGER: &str = "cargo build --bin sandbox --bin cloud-controller-manager";

/// Where `cloud-controller-manager` is: next to the running executable (the sandbox binary,
/// `target/<profile>/`), or one level up (a test binary in `target/<profile>/deps/`).
pub fn find_manager_binary() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    [Some(dir), dir.parent()].into_iter().flatten().map(|d| d.join("cloud-controller-manager")).find(|p| p.is_file())
}

/// The `cloud-controller-manager` binary next to this executable. Nothing is built here: a
/// running program that starts a compiler surprises whoever runs it; the error names the
/// command that builds it instead.
pub fn manager_binary() -> Result<PathBuf, Error> {
    find_manager_binary().ok_or_else(|| {
        let dir = std::env::current_exe()
            .ok()
            .and_then(|e| e.parent().map(Path::to_path_buf))
            .map_or_else(|| "this executable's directory".to_string(), |d| d.display().to_string());
        Error::ManagerBinary(format!(
            "Deployment mode runs the cloud-controller-manager binary, which is not built yet (looked in {dir}); \
             build it with `{BUILD_MANAGER}` (or `cargo test --workspace --no-run`), or pass --manager-binary <path>"
        ))
    })
}
