//! What the real cluster changes on the host, read before it starts and checked after it
//! stops: kernel settings, iptables chains, mounts, network links, the kubelets' cgroups and
//! processes.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

/// Kernel settings the harness, the kubelet or kube-proxy write. The kubelet's container
/// manager rewrites the `vm`/`kernel` ones at start and never checks them again.
pub const SYSCTLS: &[&str] = &[
    "net/ipv4/ip_forward",
    "net/bridge/bridge-nf-call-iptables",
    "net/ipv4/conf/all/route_localnet",
    "net/netfilter/nf_conntrack_max",
    "net/netfilter/nf_conntrack_tcp_timeout_established",
    "net/netfilter/nf_conntrack_tcp_timeout_close_wait",
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
];

/// The host's state in the respects the cluster touches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// `key value` for each of [`SYSCTLS`] that exists.
    pub sysctls: BTreeSet<String>,
    /// `table chain` for every iptables chain (IPv4 and IPv6).
    pub chains: BTreeSet<String>,
    /// Rules of the filter table's FORWARD chain.
    pub forward_rules: BTreeSet<String>,
    /// Mount points.
    pub mounts: BTreeSet<String>,
    /// Network link names.
    pub links: BTreeSet<String>,
    /// Top-level cgroups of the kubelets (`kubepods`, the added Nodes' roots), as
    /// `hierarchy/name`.
    pub cgroups: BTreeSet<String>,
}

/// Reads one kernel setting (`/proc/sys/<key>`).
pub fn sysctl(key: &str) -> Option<String> {
    std::fs::read_to_string(Path::new("/proc/sys").join(key)).ok().map(|v| v.trim().to_string())
}

/// Writes one kernel setting; errors are returned for the caller to report.
pub fn set_sysctl(key: &str, value: &str) -> std::io::Result<()> {
    std::fs::write(Path::new("/proc/sys").join(key), value)
}

fn output(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

impl Snapshot {
    /// Reads the host now.
    pub fn take() -> Snapshot {
        let sysctls = SYSCTLS.iter().filter_map(|k| sysctl(k).map(|v| format!("{k} {v}"))).collect();
        let chains =
            ["iptables-save", "ip6tables-save"].into_iter().flat_map(|t| chains_of(t, &output(t, &[]))).collect();
        let forward_rules = output("iptables", &["-w", "-S", "FORWARD"]).lines().map(str::to_string).collect();
        let mounts = std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split_whitespace().nth(4).map(str::to_string))
            .collect();
        let links = std::fs::read_dir("/sys/class/net")
            .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        Snapshot { sysctls, chains, forward_rules, mounts, links, cgroups: kubelet_cgroups() }
    }

    /// What differs from `before`, one line per difference (empty when the host is as it was).
    pub fn differences(&self, before: &Snapshot) -> Vec<String> {
        let mut out = Vec::new();
        let mut diff = |what: &str, now: &BTreeSet<String>, then: &BTreeSet<String>| {
            out.extend(now.difference(then).map(|x| format!("{what} added: {x}")));
            out.extend(then.difference(now).map(|x| format!("{what} gone: {x}")));
        };
        diff("sysctl", &self.sysctls, &before.sysctls);
        diff("iptables chain", &self.chains, &before.chains);
        diff("FORWARD rule", &self.forward_rules, &before.forward_rules);
        diff("mount", &self.mounts, &before.mounts);
        diff("link", &self.links, &before.links);
        diff("cgroup", &self.cgroups, &before.cgroups);
        out
    }
}

/// The chains in `tool`'s output (`iptables-save` format) as `tool table chain`. A built-in
/// chain counts only with a policy other than ACCEPT: a table the kernel created on first use
/// (a fresh host has none until something touches it) holds only built-in chains at ACCEPT,
/// which is the same as no table, and a table cannot be unloaded. User chains always count, and
/// a built-in chain's changed policy shows as `chain POLICY`.
pub fn chains_of(tool: &str, save: &str) -> BTreeSet<String> {
    let mut chains = BTreeSet::new();
    let mut table = "";
    for line in save.lines() {
        if let Some(t) = line.strip_prefix('*') {
            table = t;
        } else if let Some(chain) = line.strip_prefix(':') {
            let mut parts = chain.split_whitespace();
            let name = parts.next().unwrap_or_default();
            match parts.next().unwrap_or("-") {
                "-" => chains.insert(format!("{tool} {table} {name}")),
                "ACCEPT" => false,
                policy => chains.insert(format!("{tool} {table} {name} {policy}")),
            };
        }
    }
    chains
}

/// The top-level cgroups a kubelet of the cluster makes, in every hierarchy.
fn kubelet_cgroups() -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let base = Path::new("/sys/fs/cgroup");
    let mut hierarchies = vec![base.to_path_buf()];
    hierarchies.extend(std::fs::read_dir(base).into_iter().flatten().flatten().map(|e| e.path()));
    for h in hierarchies.into_iter().filter(|h| h.join("cgroup.procs").is_file()) {
        for entry in std::fs::read_dir(&h).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if (name == "kubepods" || name.starts_with(super::netns::PREFIX)) && entry.path().is_dir() {
                out.insert(format!("{}/{name}", h.display()));
            }
        }
    }
    out
}

/// Unmounts every mount point below one of `roots` (each ending in `/`), deepest first,
/// lazily where busy; three rounds, as an unmount can uncover another.
pub(crate) fn unmount_under(roots: &[String]) {
    for _ in 0..3 {
        let mut mounts: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split_whitespace().nth(4).map(str::to_string))
            .filter(|m| roots.iter().any(|r| m.starts_with(r.as_str())))
            .collect();
        if mounts.is_empty() {
            break;
        }
        mounts.sort_by(|a, b| b.cmp(a));
        for m in mounts {
            let ok = Command::new("umount").arg(&m).output().is_ok_and(|o| o.status.success());
            if !ok {
                let _ = Command::new("umount").args(["-l", &m]).output();
            }
        }
    }
}

/// Pids of live processes whose command line contains `needle`.
pub fn processes_mentioning(needle: &str) -> Vec<(u32, String)> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    let me = std::process::id();
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| *pid != me)
        .filter_map(|pid| {
            let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let cmd = String::from_utf8_lossy(&raw).replace('\0', " ");
            cmd.contains(needle).then(|| (pid, cmd.trim().to_string()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(items: &[&str]) -> BTreeSet<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_table_created_with_only_its_built_in_chains_at_accept_is_no_change() {
        let fresh = chains_of("iptables-save", "");
        let loaded = "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\nCOMMIT\n";
        assert_eq!(chains_of("iptables-save", loaded), fresh);
        let touched = "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD DROP [0:0]\n:KUBE-FORWARD - [0:0]\nCOMMIT\n";
        assert_eq!(
            chains_of("iptables-save", touched),
            set(&["iptables-save filter FORWARD DROP", "iptables-save filter KUBE-FORWARD"])
        );
    }

    #[test]
    fn differences_name_what_was_added_and_what_went() {
        let before = Snapshot {
            sysctls: set(&["kernel/panic 1"]),
            chains: set(&["iptables-save filter FORWARD"]),
            forward_rules: set(&[]),
            mounts: set(&["/"]),
            links: set(&["lo", "eth0"]),
            cgroups: set(&[]),
        };
        let mut after = before.clone();
        assert!(after.differences(&before).is_empty());
        after.sysctls = set(&["kernel/panic 10"]);
        after.links.insert("ccmrc0".into());
        after.mounts.remove("/");
        after.cgroups.insert("/sys/fs/cgroup/memory/ccmrc-node-2".into());
        let diff = after.differences(&before);
        assert!(diff.contains(&"sysctl added: kernel/panic 10".to_string()), "{diff:?}");
        assert!(diff.contains(&"sysctl gone: kernel/panic 1".to_string()), "{diff:?}");
        assert!(diff.contains(&"link added: ccmrc0".to_string()), "{diff:?}");
        assert!(diff.contains(&"mount gone: /".to_string()), "{diff:?}");
        assert!(diff.contains(&"cgroup added: /sys/fs/cgroup/memory/ccmrc-node-2".to_string()), "{diff:?}");
        assert_eq!(diff.len(), 5);
    }
}
