//! A pool's advertisement policy (`advertisement` on a cloud-config pool or a
//! `LoadBalancerIPPool`): which nodes may announce its addresses, which node should answer
//! ARP/NDP for them, and the BGP attributes of their routes. Parsed and checked here; applied
//! by the announcer ([`crate::announce::policy`]).

use std::fmt;

use serde::Deserialize;

use crate::announce::l2;
use crate::selector::LabelSelectorConfig;
use ccm_framework::safe_yaml::FieldPath;

/// The most standard or large communities a list may hold.
pub const MAX_COMMUNITIES: usize = 16;
/// The most nodes `l2PreferredNodes` may name.
pub const MAX_PREFERRED_NODES: usize = 16;
/// The longest node name (an object name's limit).
pub const MAX_NODE_NAME: usize = 253;

/// The message of a malformed community.
pub const BAD_COMMUNITY: &str = "must be a BGP community written as two numbers from 0 to 65535, such as 65000:100";
/// The message of a malformed large community.
pub const BAD_LARGE_COMMUNITY: &str =
    "must be a BGP large community written as three numbers from 0 to 4294967295, such as 65000:1:2";
/// The message of a community list beyond [`MAX_COMMUNITIES`].
pub const TOO_MANY_COMMUNITIES: &str = "lists more than 16 communities";
/// The message of a preferred node list beyond [`MAX_PREFERRED_NODES`].
pub const TOO_MANY_NODES: &str = "lists more than 16 nodes";
/// The message of a preferred node name that is not one.
pub const BAD_NODE_NAME: &str = "must be a node name: 1 to 253 characters, none of them a comma or whitespace";
/// The message of a node named twice.
pub const DUPLICATE_NODE: &str = "names a node listed before it";

/// `advertisement` as written in the cloud-config.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PolicyConfig {
    /// Only announcers on Nodes whose labels match answer for or advertise the pool's
    /// addresses; unset: every announcer.
    #[serde(default)]
    pub node_selector: Option<LabelSelectorConfig>,
    /// The nodes that should answer ARP/NDP for the pool's addresses, in order (a Service's
    /// `ccm.rs/l2-preferred-nodes` comes first).
    #[serde(default)]
    pub l2_preferred_nodes: Vec<String>,
    /// The interfaces ARP/NDP for the pool's addresses is answered on, of those the announcers
    /// answer on (`announcement.l2.interfaces`); empty: all of them.
    #[serde(default)]
    pub l2_interfaces: Vec<String>,
    /// BGP attributes of the pool's routes.
    #[serde(default)]
    pub bgp: Option<BgpPolicyConfig>,
}

/// `advertisement.bgp` as written.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BgpPolicyConfig {
    /// Standard communities (`65000:100`), added to the global ones.
    #[serde(default)]
    pub communities: Vec<String>,
    /// Large communities (`65000:1:2`, RFC 8092).
    #[serde(default)]
    pub large_communities: Vec<String>,
    /// `LOCAL_PREF` of the pool's routes, in place of the global one (iBGP peers only).
    #[serde(default)]
    pub local_pref: Option<u32>,
}

/// A pool's policy, checked. The default is no policy: every announcer, no preference, the
/// global attributes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolPolicy {
    /// The Nodes that may announce (by label); `None`: every Node.
    pub node_selector: Option<LabelSelectorConfig>,
    /// The preferred nodes for L2, in order.
    pub preferred: Vec<String>,
    /// The interfaces its addresses are answered on; empty: every L2 interface.
    pub l2_interfaces: Vec<String>,
    /// What the pool's routes carry beyond the global attributes.
    pub route: RouteAttributes,
}

/// BGP attributes of one route beyond the global ones.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RouteAttributes {
    /// Standard communities.
    pub communities: Vec<(u16, u16)>,
    /// Large communities.
    pub large_communities: Vec<(u32, u32, u32)>,
    /// `LOCAL_PREF`, in place of the global one.
    pub local_pref: Option<u32>,
}

impl RouteAttributes {
    /// Whether the route carries nothing beyond the global attributes.
    pub fn is_empty(&self) -> bool {
        self.communities.is_empty() && self.large_communities.is_empty() && self.local_pref.is_none()
    }
}

/// A field of `advertisement` that is wrong, and why (texts of this module only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyProblem {
    /// The field, under the path given to [`PolicyConfig::check`].
    pub field: FieldPath,
    /// What is wrong.
    pub message: &'static str,
}

impl fmt::Display for PolicyProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

impl PolicyConfig {
    /// The checked policy; `path` is where `advertisement` sits. The node selector is checked
    /// by the caller, which knows its own selector rules, and taken as it is.
    pub fn check(&self, path: &FieldPath) -> Result<PoolPolicy, PolicyProblem> {
        let preferred = check_nodes(&self.l2_preferred_nodes, &path.field("l2PreferredNodes"))?;
        let l2_interfaces = check_interfaces(&self.l2_interfaces, &path.field("l2Interfaces"))?;
        let mut route = RouteAttributes::default();
        if let Some(bgp) = &self.bgp {
            let at = path.field("bgp");
            route.communities = check_list(&bgp.communities, &at.field("communities"), parse_community, BAD_COMMUNITY)?;
            route.large_communities = check_list(
                &bgp.large_communities,
                &at.field("largeCommunities"),
                parse_large_community,
                BAD_LARGE_COMMUNITY,
            )?;
            route.local_pref = bgp.local_pref;
        }
        Ok(PoolPolicy { node_selector: self.node_selector.clone(), preferred, l2_interfaces, route })
    }
}

/// Each entry parsed, at most [`MAX_COMMUNITIES`].
fn check_list<T>(
    entries: &[String],
    path: &FieldPath,
    parse: fn(&str) -> Option<T>,
    bad: &'static str,
) -> Result<Vec<T>, PolicyProblem> {
    if entries.len() > MAX_COMMUNITIES {
        return Err(PolicyProblem { field: path.clone(), message: TOO_MANY_COMMUNITIES });
    }
    entries
        .iter()
        .enumerate()
        .map(|(i, text)| parse(text).ok_or_else(|| PolicyProblem { field: path.index(i), message: bad }))
        .collect()
}

/// Node names: at most [`MAX_PREFERRED_NODES`], each a name and listed once.
fn check_nodes(names: &[String], path: &FieldPath) -> Result<Vec<String>, PolicyProblem> {
    if names.len() > MAX_PREFERRED_NODES {
        return Err(PolicyProblem { field: path.clone(), message: TOO_MANY_NODES });
    }
    let mut out: Vec<String> = Vec::with_capacity(names.len());
    for (i, name) in names.iter().enumerate() {
        let bad = name.is_empty() || name.len() > MAX_NODE_NAME || name.chars().any(|c| c == ',' || c.is_whitespace());
        if bad {
            return Err(PolicyProblem { field: path.index(i), message: BAD_NODE_NAME });
        }
        if out.contains(name) {
            return Err(PolicyProblem { field: path.index(i), message: DUPLICATE_NODE });
        }
        out.push(name.clone());
    }
    Ok(out)
}

/// Interface names Linux accepts, at most [`l2::MAX_INTERFACES`], none twice.
fn check_interfaces(names: &[String], path: &FieldPath) -> Result<Vec<String>, PolicyProblem> {
    if names.len() > l2::MAX_INTERFACES {
        return Err(PolicyProblem { field: path.clone(), message: l2::TOO_MANY_INTERFACES });
    }
    for (i, name) in names.iter().enumerate() {
        if !l2::valid_interface_name(name) {
            return Err(PolicyProblem { field: path.index(i), message: l2::BAD_INTERFACE });
        }
        if names[..i].contains(name) {
            return Err(PolicyProblem { field: path.index(i), message: l2::DUPLICATE_INTERFACE });
        }
    }
    Ok(names.to_vec())
}

/// Decimal digits only, parsed as `T`.
fn number<T: std::str::FromStr>(part: &str) -> Option<T> {
    if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    part.parse().ok()
}

/// `65000:100` as its two halves.
pub fn parse_community(text: &str) -> Option<(u16, u16)> {
    let (high, low) = text.split_once(':')?;
    Some((number(high)?, number(low)?))
}

/// `65000:1:2` as its three parts.
pub fn parse_large_community(text: &str) -> Option<(u32, u32, u32)> {
    let mut parts = text.split(':');
    let out = (number(parts.next()?)?, number(parts.next()?)?, number(parts.next()?)?);
    parts.next().is_none().then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at() -> FieldPath {
        FieldPath::root().field("advertisement")
    }

    #[test]
    fn a_policy_is_parsed_into_nodes_preferences_and_route_attributes() {
        let config: PolicyConfig = serde_json::from_value(serde_json::json!({
            "nodeSelector": {"matchLabels": {"edge": "true"}},
            "l2PreferredNodes": ["w2", "w1"],
            "l2Interfaces": ["eth1", "bond0.20"],
            "bgp": {"communities": ["65000:7"], "largeCommunities": ["65000:1:4294967295"], "localPref": 300},
        }))
        .unwrap();
        let policy = config.check(&at()).unwrap();
        assert_eq!(policy.preferred, ["w2", "w1"]);
        assert_eq!(policy.l2_interfaces, ["eth1", "bond0.20"]);
        assert_eq!(policy.route.communities, [(65000, 7)]);
        assert_eq!(policy.route.large_communities, [(65000, 1, u32::MAX)]);
        assert_eq!(policy.route.local_pref, Some(300));
        assert!(policy.node_selector.unwrap().match_labels.contains_key("edge"));
        assert!(PolicyConfig::default().check(&at()).unwrap() == PoolPolicy::default());
        assert!(PoolPolicy::default().route.is_empty());
    }

    #[test]
    fn a_wrong_policy_names_the_field() {
        let many: Vec<String> = (0..17).map(|i| format!("65000:{i}")).collect();
        let nodes: Vec<String> = (0..17).map(|i| format!("w{i}")).collect();
        let bgp = |communities: Vec<String>, large: Vec<String>| PolicyConfig {
            bgp: Some(BgpPolicyConfig { communities, large_communities: large, local_pref: None }),
            ..Default::default()
        };
        let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        for (config, field, message) in [
            (bgp(s(&["65000:70000"]), vec![]), "advertisement.bgp.communities[0]", BAD_COMMUNITY),
            (bgp(s(&["65000:1", "x"]), vec![]), "advertisement.bgp.communities[1]", BAD_COMMUNITY),
            (bgp(many, vec![]), "advertisement.bgp.communities", TOO_MANY_COMMUNITIES),
            (bgp(vec![], s(&["1:2"])), "advertisement.bgp.largeCommunities[0]", BAD_LARGE_COMMUNITY),
            (bgp(vec![], s(&["1:2:3:4"])), "advertisement.bgp.largeCommunities[0]", BAD_LARGE_COMMUNITY),
            (bgp(vec![], s(&["1:2:4294967296"])), "advertisement.bgp.largeCommunities[0]", BAD_LARGE_COMMUNITY),
            (
                PolicyConfig { l2_preferred_nodes: nodes, ..Default::default() },
                "advertisement.l2PreferredNodes",
                TOO_MANY_NODES,
            ),
            (
                PolicyConfig { l2_preferred_nodes: s(&["a b"]), ..Default::default() },
                "advertisement.l2PreferredNodes[0]",
                BAD_NODE_NAME,
            ),
            (
                PolicyConfig { l2_preferred_nodes: s(&[""]), ..Default::default() },
                "advertisement.l2PreferredNodes[0]",
                BAD_NODE_NAME,
            ),
            (
                PolicyConfig { l2_preferred_nodes: s(&["w1", "w1"]), ..Default::default() },
                "advertisement.l2PreferredNodes[1]",
                DUPLICATE_NODE,
            ),
            (
                PolicyConfig { l2_interfaces: s(&["eth0", "eth1:0"]), ..Default::default() },
                "advertisement.l2Interfaces[1]",
                l2::BAD_INTERFACE,
            ),
            (
                PolicyConfig { l2_interfaces: s(&["a-very-long-name"]), ..Default::default() },
                "advertisement.l2Interfaces[0]",
                l2::BAD_INTERFACE,
            ),
            (
                PolicyConfig { l2_interfaces: s(&["eth0", "eth0"]), ..Default::default() },
                "advertisement.l2Interfaces[1]",
                l2::DUPLICATE_INTERFACE,
            ),
            (
                PolicyConfig { l2_interfaces: (0..17).map(|i| format!("eth{i}")).collect(), ..Default::default() },
                "advertisement.l2Interfaces",
                l2::TOO_MANY_INTERFACES,
            ),
        ] {
            let problem = config.check(&at()).expect_err(field);
            assert_eq!(problem.field.to_string(), field);
            assert_eq!(problem.message, message);
            assert_eq!(problem.to_string(), format!("{field}: {message}"));
        }
    }
}
