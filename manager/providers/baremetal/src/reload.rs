//! Cloud-config edits while running (pure): the pools reload in place, everything else is
//! read only at start.
//!
//! Whether there are pools at all is part of the start-only configuration: without pools the
//! service controller stays off, and it is started (or not) with the manager.

use super::config::CloudConfig;

/// The configuration minus what reloads in place (the pools' contents).
#[derive(Debug, PartialEq)]
struct StartOnly {
    has_pools: bool,
    rest: CloudConfig,
}

fn start_only(config: &CloudConfig) -> StartOnly {
    let mut rest = config.clone();
    let has_pools = !rest.load_balancer.pools.is_empty();
    rest.load_balancer.pools.clear();
    StartOnly { has_pools, rest }
}

/// Bytes that change exactly when a restart is needed (see [`needs_restart`]). They hold
/// config values: they only ever go into a hash.
pub fn restart_fingerprint(config: &CloudConfig) -> Vec<u8> {
    // Debug output of plain data (Vec, BTreeMap, no HashMap) is deterministic.
    format!("baremetal/1 {:?}", start_only(config)).into_bytes()
}

/// The fields whose change from `old` to `new` needs a restart; empty when the edit can be
/// applied in place (only pools changed, or nothing). Paths only, never values.
pub fn needs_restart(old: &CloudConfig, new: &CloudConfig) -> Vec<&'static str> {
    let (a, b) = (start_only(old), start_only(new));
    if a == b {
        return Vec::new();
    }
    let (la, lb) = (&a.rest.load_balancer, &b.rest.load_balancer);
    let checks = [
        (a.rest.instances != b.rest.instances, "instances"),
        (a.rest.lifecycle != b.rest.lifecycle, "lifecycle"),
        (la.retry_after != lb.retry_after, "loadBalancer.retryAfter"),
        (la.mode != lb.mode, "loadBalancer.mode"),
        (la.proxy != lb.proxy, "loadBalancer.proxy"),
        (la.kube_vip != lb.kube_vip, "loadBalancer.kubeVip"),
        (la.pool_resources != lb.pool_resources, "loadBalancer.poolResources"),
        (la.resource_pool_ports != lb.resource_pool_ports, "loadBalancer.resourcePoolPorts"),
        (la.import_pools != lb.import_pools, "loadBalancer.importPools"),
        (a.has_pools != b.has_pools, "loadBalancer.pools (from none to some or back)"),
    ];
    let changed: Vec<&'static str> = checks.into_iter().filter(|(c, _)| *c).map(|(_, path)| path).collect();
    // A field added to the config later and missing above still asks for a restart.
    if changed.is_empty() { vec!["the cloud-config"] } else { changed }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config;

    const BASE: &str = "\
instances:
  - name: node-1
    addresses: [{type: InternalIP, address: 10.0.0.11}]
loadBalancer:
  pools:
    - {name: lan, cidrs: [192.168.50.0/29]}
lifecycle:
  deleteAbsentNodes: false
";

    fn parse(text: &str) -> CloudConfig {
        config::parse(text.as_bytes()).unwrap()
    }

    /// `needs_restart` and the fingerprint agree on every edit.
    fn verdict(old: &str, new: &str) -> Vec<&'static str> {
        let (a, b) = (parse(old), parse(new));
        let changed = needs_restart(&a, &b);
        assert_eq!(changed.is_empty(), restart_fingerprint(&a) == restart_fingerprint(&b), "{old}\n---\n{new}");
        changed
    }

    #[test]
    fn pool_edits_apply_in_place() {
        let added = BASE.replace(
            "    - {name: lan, cidrs: [192.168.50.0/29]}\n",
            "    - {name: lan, cidrs: [192.168.50.0/29]}\n    - {name: extra, ranges: [192.168.60.1-192.168.60.9]}\n",
        );
        assert!(verdict(BASE, &added).is_empty());
        let resized = BASE.replace("192.168.50.0/29", "192.168.50.0/28");
        assert!(verdict(BASE, &resized).is_empty());
        let restricted = BASE.replace("cidrs: [192.168.50.0/29]}", "cidrs: [192.168.50.0/29], namespaces: [web]}");
        assert!(verdict(BASE, &restricted).is_empty());
    }

    #[test]
    fn formatting_comments_and_defaults_change_nothing() {
        let reformatted = format!(
            "# edited by hand\n{}",
            BASE.replace(
                "    addresses: [{type: InternalIP, address: 10.0.0.11}]\n",
                "    addresses:\n      - type: InternalIP   # the LAN\n        address: 10.0.0.11\n",
            )
            .replace("  deleteAbsentNodes: false\n", "  deleteAbsentNodes: false  # the default\n")
        );
        assert!(verdict(BASE, &reformatted).is_empty());
        let defaults_spelled_out =
            BASE.replace("loadBalancer:\n", "loadBalancer:\n  retryAfter: 30s\n  mode: addresses\n");
        assert!(verdict(BASE, &defaults_spelled_out).is_empty());
    }

    #[test]
    fn anything_but_the_pools_needs_a_restart_and_is_named_by_path() {
        let inventory = BASE.replace("10.0.0.11", "10.0.0.12");
        assert_eq!(verdict(BASE, &inventory), ["instances"]);
        let lifecycle = BASE.replace("deleteAbsentNodes: false", "deleteAbsentNodes: true");
        assert_eq!(verdict(BASE, &lifecycle), ["lifecycle"]);
        let both = lifecycle.replace("loadBalancer:\n", "loadBalancer:\n  retryAfter: 5s\n  kubeVip: true\n");
        assert_eq!(verdict(BASE, &both), ["lifecycle", "loadBalancer.retryAfter", "loadBalancer.kubeVip"]);
        let proxy = BASE.replace("loadBalancer:\n", "loadBalancer:\n  mode: proxy\n");
        assert_eq!(verdict(BASE, &proxy), ["loadBalancer.mode"]);
    }

    #[test]
    fn pools_appearing_or_disappearing_needs_a_restart() {
        let none = BASE.replace("  pools:\n    - {name: lan, cidrs: [192.168.50.0/29]}\n", "  pools: []\n");
        assert_eq!(verdict(BASE, &none), ["loadBalancer.pools (from none to some or back)"]);
        assert_eq!(verdict(&none, BASE), ["loadBalancer.pools (from none to some or back)"]);
    }
}
