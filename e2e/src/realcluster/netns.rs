//! Network namespaces on the segment: a host bridge that the added Nodes, the client and the
//! router join with a veth pair each (the shape kind gives with containers), routes between
//! the Nodes' Pod ranges, and running code or commands inside a namespace.

use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::process::Command;

use super::run;
use crate::Error;

/// The prefix of every namespace, host-side veth and Node cgroup root the harness makes, so
/// that teardown (also of a killed run) finds exactly its own.
pub const PREFIX: &str = "ccmrc-";

/// The file `ip netns` binds a namespace to.
pub fn path(netns: &str) -> PathBuf {
    PathBuf::from("/run/netns").join(netns)
}

/// Namespaces the harness made (named with [`PREFIX`]) that exist now.
pub(crate) fn ours() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir("/run/netns")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(PREFIX))
        .collect();
    names.sort();
    names
}

/// A namespace joined to a host bridge by a veth pair.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Attachment {
    /// The namespace (and the veth's host end: both `ccmrc-…`, at most 15 bytes).
    pub netns: String,
    /// The host bridge the host end joins.
    pub bridge: String,
    /// The veth's name inside the namespace.
    pub inside: String,
    /// The address inside.
    pub address: Ipv4Addr,
    /// The segment's prefix length.
    pub prefix: u8,
    /// The default route inside, if any.
    pub gateway: Option<Ipv4Addr>,
}

impl Attachment {
    /// The `ip` argument lists that make the namespace and its link, in order.
    pub(crate) fn commands(&self) -> Vec<Vec<String>> {
        let ns = self.netns.as_str();
        let mut out: Vec<Vec<&str>> = vec![
            vec!["netns", "add", ns],
            vec!["link", "add", ns, "type", "veth", "peer", "name", &self.inside, "netns", ns],
            vec!["link", "set", ns, "master", &self.bridge, "up"],
        ];
        let address = format!("{}/{}", self.address, self.prefix);
        out.push(vec!["-n", ns, "addr", "add", &address, "dev", &self.inside]);
        out.push(vec!["-n", ns, "link", "set", &self.inside, "up"]);
        out.push(vec!["-n", ns, "link", "set", "lo", "up"]);
        let gateway = self.gateway.map(|g| g.to_string());
        if let Some(g) = &gateway {
            out.push(vec!["-n", ns, "route", "add", "default", "via", g]);
        }
        out.into_iter().map(|c| c.into_iter().map(str::to_string).collect()).collect()
    }

    /// Makes the namespace and its link, then writes `sysctls` (`net/...` keys) inside it.
    pub(crate) fn create(&self, sysctls: &[(&str, &str)]) -> Result<(), Error> {
        for args in self.commands() {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            run("ip", &args)?;
        }
        let pairs: Vec<(String, String)> = sysctls.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        run_in(&self.netns, move || {
            for (key, value) in &pairs {
                // The thread is in the namespace: /proc/sys/net is the namespace's.
                std::fs::write(std::path::Path::new("/proc/sys").join(key), value)
                    .map_err(|e| Error::io(format!("setting {key} in the namespace"), e))?;
            }
            Ok(())
        })?
    }
}

/// Kills every process in the namespace, deletes its host-side veth (at once: the namespace
/// itself goes asynchronously, and its link with it) and the namespace.
pub(crate) fn delete(netns: &str) {
    super::process::kill_all(|| pids_in(netns), std::time::Duration::from_secs(10));
    let _ = run("ip", &["link", "del", netns]);
    let _ = run("ip", &["netns", "del", netns]);
}

/// Pids of the processes whose network namespace is `netns`.
pub(crate) fn pids_in(netns: &str) -> Vec<u32> {
    let Ok(ns) = std::fs::metadata(path(netns)) else { return Vec::new() };
    let (dev, ino) = (ns.dev(), ns.ino());
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    let me = std::process::id();
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| *pid != me)
        .filter(|pid| std::fs::metadata(format!("/proc/{pid}/ns/net")).is_ok_and(|m| m.dev() == dev && m.ino() == ino))
        .collect()
}

/// Runs `f` on a new thread inside `netns`: its sockets, routes and `/proc/sys/net` are the
/// namespace's.
pub fn run_in<T: Send + 'static>(netns: &str, f: impl FnOnce() -> T + Send + 'static) -> Result<T, Error> {
    let file = path(netns);
    let file = std::fs::File::open(&file).map_err(|e| Error::io(format!("opening {}", file.display()), e))?;
    std::thread::spawn(move || {
        // SAFETY: setns(2) on this new thread only, with the namespace file held open.
        if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(Error::io("entering the namespace", std::io::Error::last_os_error()));
        }
        Ok(f())
    })
    .join()
    .map_err(|_| Error::Other(format!("the thread in {netns} panicked")))?
}

/// Starts `f` on a new thread inside `netns` and returns at once; the thread's result is the
/// handle's (an error if the namespace could not be entered).
pub fn spawn_in<T: Send + 'static>(
    netns: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<std::thread::JoinHandle<Result<T, Error>>, Error> {
    let file = path(netns);
    let file = std::fs::File::open(&file).map_err(|e| Error::io(format!("opening {}", file.display()), e))?;
    std::thread::Builder::new()
        .name(format!("in-{netns}"))
        .spawn(move || {
            // SAFETY: setns(2) on this new thread only, with the namespace file held open.
            if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(Error::io("entering the namespace", std::io::Error::last_os_error()));
            }
            Ok(f())
        })
        .map_err(|e| Error::io(format!("starting a thread in {netns}"), e))
}

/// A command that runs `program` inside `netns` (`ip netns exec`: its own mount namespace with
/// the namespace's `/sys`; fine for a tool, not for a Node's daemons, which must share the
/// host's mounts).
pub fn command(netns: &str, program: &str) -> Command {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", netns, program]);
    cmd
}

/// `ip route replace CIDR via GATEWAY`, on the host (`netns` None) or inside a namespace.
pub(crate) fn route(netns: Option<&str>, cidr: &str, via: Ipv4Addr) -> Result<(), Error> {
    let via = via.to_string();
    let mut args = Vec::new();
    if let Some(ns) = netns {
        args.extend(["-n", ns]);
    }
    args.extend(["route", "replace", cidr, "via", via.as_str()]);
    run("ip", &args).map(drop)
}

/// Makes the segment's bridge with the host's address and lets the host forward to and from
/// it even where the FORWARD policy is DROP (rules tagged `comment`).
pub(crate) fn create_bridge(bridge: &str, address: Ipv4Addr, prefix: u8, comment: &str) -> Result<(), Error> {
    run("ip", &["link", "add", bridge, "type", "bridge"])?;
    // A bridge without an address of its own takes its lowest port's, so a Node starting or
    // stopping (a veth joining or leaving) changed the gateway's MAC under every Node's ARP
    // entry: their traffic to the host went nowhere until the entry expired (30-50 s stalls in
    // the failover and drain scenarios). A fixed address keeps it.
    run("ip", &["link", "set", "dev", bridge, "address", &bridge_mac(address)])?;
    run("ip", &["addr", "add", &format!("{address}/{prefix}"), "dev", bridge])?;
    run("ip", &["link", "set", bridge, "up"])?;
    for dir in ["-i", "-o"] {
        run(
            "iptables",
            &["-w", "-I", "FORWARD", "1", dir, bridge, "-m", "comment", "--comment", comment, "-j", "ACCEPT"],
        )?;
    }
    Ok(())
}

/// The fixed hardware address of the bridge holding `address`: locally administered, unicast,
/// from the address's four bytes (`02:cc:c6:13:00:01` for 198.19.0.1).
pub(crate) fn bridge_mac(address: Ipv4Addr) -> String {
    let [a, b, c, d] = address.octets();
    format!("02:cc:{a:02x}:{b:02x}:{c:02x}:{d:02x}")
}

/// Removes a bridge and its FORWARD rules (those tagged `comment`).
pub(crate) fn delete_bridge(bridge: &str, comment: &str) {
    for dir in ["-i", "-o"] {
        while run(
            "iptables",
            &["-w", "-D", "FORWARD", dir, bridge, "-m", "comment", "--comment", comment, "-j", "ACCEPT"],
        )
        .is_ok()
        {}
    }
    let _ = run("ip", &["link", "del", bridge]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bridge_gets_a_fixed_locally_administered_unicast_address_from_its_ip() {
        assert_eq!(bridge_mac(Ipv4Addr::new(198, 19, 0, 1)), "02:cc:c6:13:00:01");
        assert_ne!(bridge_mac(Ipv4Addr::new(198, 19, 0, 1)), bridge_mac(Ipv4Addr::new(198, 19, 1, 1)));
    }

    #[test]
    fn an_attachment_makes_the_namespace_a_veth_on_the_bridge_its_address_and_default_route() {
        let a = Attachment {
            netns: "ccmrc-node-2".into(),
            bridge: "ccmnodes0".into(),
            inside: "ccmnodes0".into(),
            address: Ipv4Addr::new(198, 19, 0, 2),
            prefix: 24,
            gateway: Some(Ipv4Addr::new(198, 19, 0, 1)),
        };
        let lines: Vec<String> = a.commands().iter().map(|c| c.join(" ")).collect();
        assert_eq!(
            lines,
            [
                "netns add ccmrc-node-2",
                "link add ccmrc-node-2 type veth peer name ccmnodes0 netns ccmrc-node-2",
                "link set ccmrc-node-2 master ccmnodes0 up",
                "-n ccmrc-node-2 addr add 198.19.0.2/24 dev ccmnodes0",
                "-n ccmrc-node-2 link set ccmnodes0 up",
                "-n ccmrc-node-2 link set lo up",
                "-n ccmrc-node-2 route add default via 198.19.0.1",
            ]
        );
        let without = Attachment { gateway: None, ..a };
        assert!(!without.commands().iter().any(|c| c.contains(&"route".to_string())));
    }

    #[test]
    fn every_name_the_harness_gives_a_link_fits_the_kernels_fifteen_bytes() {
        for name in ["ccmrc-node-2", "ccmrc-node-16", "ccmrc-client", "ccmrc-router"] {
            assert!(name.starts_with(PREFIX) && name.len() <= 15, "{name}");
        }
    }
}
