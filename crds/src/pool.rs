//! `LoadBalancerIPPool`, API group `ccm.rs`, version `v1alpha1`: a cluster-scoped pool of
//! load-balancer addresses for the `baremetal` provider, beside (and after) the pools of its
//! cloud-config (docs/datapath.md, "Pools").

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// The most address entries (`cidrs` plus `ranges`) a pool may list.
pub const MAX_POOL_ENTRIES: usize = 64;
/// The most namespaces a pool may name.
pub const MAX_POOL_NAMESPACES: usize = 64;
/// The longest address entry, in bytes (an IPv6 range is at most 79 characters).
pub const MAX_ENTRY_LENGTH: usize = 100;

/// The rule each `ranges` entry must pass: two addresses of one family, separated by `-`.
const RANGE_RULE: &str = "self.all(r, r.split('-').size() == 2 && isIP(r.split('-')[0].trim()) \
    && isIP(r.split('-')[1].trim()) \
    && ip(r.split('-')[0].trim()).family() == ip(r.split('-')[1].trim()).family())";

/// Addresses the `baremetal` provider hands to `type: LoadBalancer` Services.
// Clippy reads printcolumns of the same `type_` as one attribute repeated.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "ccm.rs",
    version = "v1alpha1",
    kind = "LoadBalancerIPPool",
    plural = "loadbalancerippools",
    shortname = "lbpool",
    category = "cloud",
    status = "LoadBalancerIPPoolStatus",
    derive = "PartialEq",
    doc = "A pool of load-balancer addresses for the baremetal provider: CIDRs and ranges, which Services may use it, and its usage per IP family.",
    printcolumn(name = "Auto", type_ = "boolean", json_path = ".spec.autoAssign"),
    printcolumn(name = "IPv4 Assigned", type_ = "integer", json_path = ".status.ipv4.assigned"),
    printcolumn(name = "IPv4 Available", type_ = "integer", json_path = ".status.ipv4.available"),
    printcolumn(name = "IPv6 Assigned", type_ = "integer", json_path = ".status.ipv6.assigned"),
    printcolumn(name = "IPv6 Available", type_ = "integer", json_path = ".status.ipv6.available"),
    printcolumn(name = "Valid", type_ = "string", json_path = ".status.conditions[?(@.type==\"Valid\")].status"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[cfg_attr(test, kube(cel))]
#[x_kube(validation = kube::core::Rule::new("size(self.cidrs) + size(self.ranges) >= 1").message("a pool needs at least one entry in cidrs or ranges"))]
#[x_kube(validation = kube::core::Rule::new("size(self.cidrs) + size(self.ranges) <= 64").message("a pool lists at most 64 entries in cidrs and ranges together"))]
#[serde(rename_all = "camelCase")]
pub struct LoadBalancerIPPoolSpec {
    /// CIDRs whose every address belongs to the pool (`192.0.2.0/28`, `2001:db8::/120`).
    #[serde(default)]
    #[schemars(length(max = 64), inner(length(max = 100)))]
    #[x_kube(validation = kube::core::Rule::new("self.all(c, isCIDR(c))").message("every cidrs entry must be a CIDR such as 192.0.2.0/28 or 2001:db8::/120"))]
    pub cidrs: Vec<String>,

    /// Inclusive ranges `first-last` of one family (`192.0.2.10-192.0.2.20`).
    #[serde(default)]
    #[schemars(length(max = 64), inner(length(max = 100)))]
    #[x_kube(validation = kube::core::Rule::new(RANGE_RULE).message("every ranges entry must be first-last, two addresses of one family such as 192.0.2.10-192.0.2.20"))]
    pub ranges: Vec<String>,

    /// Hand addresses out to Services that do not ask for one of this pool (default true);
    /// false keeps the pool for Services that request its addresses.
    #[serde(default = "default_true")]
    pub auto_assign: bool,

    /// Skip IPv4 addresses ending in `.0` or `.255`, which some clients mishandle.
    #[serde(default, rename = "avoidBuggyIPs")]
    pub avoid_buggy_ips: bool,

    /// Let Services with the same `ccm.rs/allow-shared-ip` key and distinct ports share an
    /// address (default true, as MetalLB does).
    #[serde(default = "default_true")]
    pub allow_sharing: bool,

    /// Only Services in these namespaces may use the pool; empty means every namespace.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(max = 63)))]
    pub namespaces: Vec<String>,

    /// Only Services in namespaces whose labels match may use the pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,

    /// Only Services whose labels match may use the pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_selector: Option<LabelSelector>,

    /// How the announcers announce the pool's addresses: which Nodes, which Node first for
    /// L2, and the BGP attributes of its routes; unset: every announcer, global attributes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advertisement: Option<PoolAdvertisement>,
}

/// The CEL rule of a standard community: `65000:100`, two numbers from 0 to 65535.
const COMMUNITY_RULE: &str = "self.all(c, c.matches('^[0-9]{1,5}:[0-9]{1,5}$') \
    && int(c.split(':')[0]) <= 65535 && int(c.split(':')[1]) <= 65535)";
/// The CEL rule of a large community: `65000:1:2`, three numbers from 0 to 4294967295.
const LARGE_COMMUNITY_RULE: &str = "self.all(c, c.matches('^[0-9]{1,10}:[0-9]{1,10}:[0-9]{1,10}$') \
    && c.split(':').all(n, int(n) <= 4294967295))";

/// `spec.advertisement`: how a pool's addresses are announced.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolAdvertisement {
    /// Only announcers on Nodes whose labels match answer ARP/NDP for or advertise the pool's
    /// addresses; unset: every announcer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<LabelSelector>,

    /// The Nodes that should answer ARP/NDP for the pool's addresses, in order; the first
    /// live eligible one does (a Service's `ccm.rs/l2-preferred-nodes` comes first).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(length(min = 1, max = 253)))]
    pub l2_preferred_nodes: Vec<String>,

    /// The interfaces ARP/NDP for the pool's addresses is answered on, of those the
    /// announcers answer on (`loadBalancer.announcement.l2.interfaces`); unset: all of them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(length(min = 1, max = 15)))]
    pub l2_interfaces: Vec<String>,

    /// BGP attributes of the pool's routes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bgp: Option<PoolBgpAdvertisement>,
}

/// `spec.advertisement.bgp`: attributes of the pool's routes.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolBgpAdvertisement {
    /// Standard communities (`65000:100`), added to the cloud-config's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(length(max = 11)))]
    #[x_kube(validation = kube::core::Rule::new(COMMUNITY_RULE).message("every communities entry must be two numbers from 0 to 65535, such as 65000:100"))]
    pub communities: Vec<String>,

    /// Large communities (`65000:1:2`, RFC 8092).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(length(max = 32)))]
    #[x_kube(validation = kube::core::Rule::new(LARGE_COMMUNITY_RULE).message("every largeCommunities entry must be three numbers from 0 to 4294967295, such as 65000:1:2"))]
    pub large_communities: Vec<String>,

    /// `LOCAL_PREF` of the pool's routes, in place of the cloud-config's (iBGP peers only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 4294967295_i64))]
    pub local_pref: Option<i64>,
}

fn default_true() -> bool {
    true
}

/// Addresses of one IP family in a pool.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FamilyUsage {
    /// Addresses assigned to Services (a shared address counts once).
    pub assigned: i64,
    /// Addresses still free; capped at the largest 64-bit integer for very large IPv6 pools.
    pub available: i64,
}

/// What the manager observes of a pool; written by the `baremetal` provider's leader only
/// when it changes.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct LoadBalancerIPPoolStatus {
    /// The `metadata.generation` this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// IPv4 usage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv4: Option<FamilyUsage>,
    /// IPv6 usage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6: Option<FamilyUsage>,
    /// Conditions, one per type: `Valid`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = kube::core::ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
}

#[cfg(test)]
mod cel_tests {
    //! The CRD's CEL rules, evaluated client-side with kube's CEL support.
    use super::*;
    use serde_json::{Value, json};

    fn pool(spec: Value) -> LoadBalancerIPPool {
        serde_json::from_value(json!({
            "apiVersion": "ccm.rs/v1alpha1",
            "kind": "LoadBalancerIPPool",
            "metadata": {"name": "p"},
            "spec": spec,
        }))
        .expect("test spec deserializes")
    }

    #[test]
    fn cidrs_and_ranges_of_either_family_pass() {
        for spec in [
            json!({"cidrs": ["192.0.2.0/28"]}),
            json!({"cidrs": ["2001:db8::/120"], "ranges": ["192.0.2.10-192.0.2.20"]}),
            json!({"ranges": ["2001:db8::10 - 2001:db8::20"], "autoAssign": false}),
            json!({"cidrs": ["192.0.2.0/28"], "advertisement": {
                "nodeSelector": {"matchLabels": {"edge": "true"}},
                "l2PreferredNodes": ["w1"],
                "bgp": {"communities": ["65000:100", "0:65535"], "largeCommunities": ["65000:1:4294967295"], "localPref": 200},
            }}),
        ] {
            pool(spec.clone()).validate_cel().unwrap_or_else(|e| panic!("{spec} rejected: {e:?}"));
        }
        let defaults = pool(json!({"cidrs": ["192.0.2.0/28"]})).spec;
        assert!(defaults.auto_assign && defaults.allow_sharing && !defaults.avoid_buggy_ips);
    }

    #[test]
    fn malformed_or_empty_entries_are_rejected_naming_the_form() {
        for (spec, needle) in [
            (json!({}), "at least one entry"),
            (json!({"cidrs": ["192.0.2.0/33"]}), "must be a CIDR"),
            (json!({"cidrs": ["pool-a"]}), "must be a CIDR"),
            (json!({"ranges": ["192.0.2.10"]}), "first-last"),
            (json!({"ranges": ["192.0.2.10-2001:db8::1"]}), "one family"),
            (json!({"ranges": ["192.0.2.10-192.0.2.300"]}), "first-last"),
            (
                json!({"cidrs": ["192.0.2.0/28"], "advertisement": {"bgp": {"communities": ["65000:70000"]}}}),
                "two numbers",
            ),
            (json!({"cidrs": ["192.0.2.0/28"], "advertisement": {"bgp": {"communities": ["65000"]}}}), "two numbers"),
            (
                json!({"cidrs": ["192.0.2.0/28"], "advertisement": {"bgp": {"largeCommunities": ["1:2"]}}}),
                "three numbers",
            ),
            (
                json!({"cidrs": ["192.0.2.0/28"], "advertisement": {"bgp": {"largeCommunities": ["1:2:4294967296"]}}}),
                "three numbers",
            ),
        ] {
            let err = pool(spec.clone()).validate_cel().expect_err("must be rejected");
            assert!(format!("{err:?}").contains(needle), "{spec}: expected {needle:?} in {err:?}");
        }
    }

    #[test]
    fn at_most_64_entries_together() {
        let cidrs: Vec<String> = (0..40).map(|i| format!("10.0.{i}.0/24")).collect();
        let ranges: Vec<String> = (0..25).map(|i| format!("10.1.{i}.1-10.1.{i}.9")).collect();
        let err = pool(json!({"cidrs": cidrs, "ranges": ranges})).validate_cel().expect_err("65 entries");
        assert!(format!("{err:?}").contains("at most 64"), "{err:?}");
        assert_eq!(MAX_POOL_ENTRIES, 64);
    }
}
