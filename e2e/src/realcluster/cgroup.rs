//! The kubelets' cgroups. The host's Node keeps the kubelet's default `/kubepods`; each added
//! Node gets a cgroup root of its own (`cgroupRoot`), so two kubelets on one cgroupfs host
//! never take each other's Pod cgroups for orphans, and its processes can be found and
//! killed all at once.

use std::path::{Path, PathBuf};

use crate::Error;

const CGROUP_FS: &str = "/sys/fs/cgroup";

/// Every mounted hierarchy: the v1 controllers (and named ones) under `/sys/fs/cgroup`, the
/// unified v2 mount of a hybrid host, or `/sys/fs/cgroup` itself on a v2-only host.
fn hierarchies() -> Vec<PathBuf> {
    let base = Path::new(CGROUP_FS);
    if base.join("cgroup.procs").is_file() {
        return vec![base.to_path_buf()];
    }
    let Ok(entries) = std::fs::read_dir(base) else { return Vec::new() };
    let mut all: Vec<PathBuf> =
        entries.flatten().map(|e| e.path()).filter(|p| p.join("cgroup.procs").is_file()).collect();
    all.sort();
    all
}

/// The cgroup name of a Node's root: `/` and the name (e.g. `/ccmrc-node-2`).
pub(crate) fn root_of(name: &str) -> String {
    format!("/{name}")
}

/// Creates `root` (a top-level cgroup name without the slash) in every hierarchy: the kubelet
/// refuses a `cgroupRoot` that does not exist. On a v2 hierarchy the root's controllers are
/// delegated to it, as they are to the top level.
pub(crate) fn create(root: &str) -> Result<(), Error> {
    for h in hierarchies() {
        let dir = h.join(root);
        std::fs::create_dir_all(&dir).map_err(|e| Error::io(format!("creating cgroup {}", dir.display()), e))?;
        let controllers = std::fs::read_to_string(h.join("cgroup.subtree_control")).unwrap_or_default();
        let enable: Vec<String> = controllers.split_whitespace().map(|c| format!("+{c}")).collect();
        if !enable.is_empty() {
            let _ = std::fs::write(dir.join("cgroup.subtree_control"), enable.join(" "));
        }
    }
    Ok(())
}

/// Pids of every process in `root` or below it, in any hierarchy.
pub(crate) fn pids(root: &str) -> Vec<u32> {
    let mut out = std::collections::BTreeSet::new();
    for h in hierarchies() {
        let mut dirs = Vec::new();
        collect_dirs(&h.join(root), &mut dirs);
        for dir in dirs {
            let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
            out.extend(procs.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
        }
    }
    out.into_iter().collect()
}

/// Removes the (empty) cgroups `root` and below in every hierarchy, deepest first.
pub(crate) fn remove(root: &str) {
    for h in hierarchies() {
        let top = h.join(root);
        if !top.is_dir() {
            continue;
        }
        let mut dirs = Vec::new();
        collect_dirs(&top, &mut dirs);
        dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
        for dir in dirs {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// Top-level cgroups whose name starts with `prefix`, across the hierarchies (deduplicated).
pub(crate) fn roots_with_prefix(prefix: &str) -> Vec<String> {
    let mut out = std::collections::BTreeSet::new();
    for h in hierarchies() {
        for entry in std::fs::read_dir(&h).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with(prefix) && entry.path().is_dir() {
                out.insert(name);
            }
        }
    }
    out.into_iter().collect()
}

fn collect_dirs(dir: &Path, out: &mut Vec<PathBuf>) {
    if !dir.is_dir() {
        return;
    }
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                collect_dirs(&entry.path(), out);
            }
        }
    }
    out.push(dir.to_path_buf());
}
