//! Pools from `LoadBalancerIPPool` resources (pure): conversion into allocator pools, their
//! precedence against the cloud-config's pools, and each resource's status. The watch and the
//! status writes are in [`crate::pool_watch`].
//!
//! Precedence: the cloud-config's pools come first, in their order; then the resources, oldest
//! first (by creation time, then name). A resource is left out, with `Valid=False`, when an
//! entry is unusable (`InvalidEntry`), a cloud-config pool has its name (`NameTaken`), or an
//! entry overlaps a pool before it (`Overlap`). Addresses already held keep their Services
//! whatever happens to the pool (see [`crate::ipam::Allocator::replace_pools`]).

use std::collections::{BTreeMap, BTreeSet};

use ccm_framework::safe_yaml::FieldPath;
use crds::pool::{
    FamilyUsage, LoadBalancerIPPool, LoadBalancerIPPoolStatus, MAX_POOL_ENTRIES, MAX_POOL_NAMESPACES, PoolAdvertisement,
};
use crds::reasons::ip_pool;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, Time};
use kube::ResourceExt;

use crate::advertisement::{BgpPolicyConfig, PolicyConfig, PoolPolicy};
use crate::ipam::{Family, IpBlock, Pool};
use crate::selector::{LabelSelectorConfig, SelectorOperator, SelectorRequirement};

/// Why a resource's pool is not used, or that it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// One of [`crds::reasons::ip_pool`].
    pub reason: &'static str,
    /// What is wrong, naming fields by index (never more than a few addresses of the pool).
    pub message: String,
}

impl Verdict {
    fn valid() -> Self {
        Self { reason: ip_pool::AS_EXPECTED, message: "every entry is in use".to_string() }
    }

    /// Whether the pool is handed out.
    pub fn is_valid(&self) -> bool {
        self.reason == ip_pool::AS_EXPECTED
    }
}

fn invalid(message: String) -> Verdict {
    Verdict { reason: ip_pool::INVALID_ENTRY, message }
}

fn selector(selector: &LabelSelector, field: &str) -> Result<LabelSelectorConfig, Verdict> {
    let mut out = LabelSelectorConfig {
        match_labels: selector.match_labels.clone().unwrap_or_default(),
        match_expressions: Vec::new(),
    };
    for (i, r) in selector.match_expressions.iter().flatten().enumerate() {
        let operator = match r.operator.as_str() {
            "In" => SelectorOperator::In,
            "NotIn" => SelectorOperator::NotIn,
            "Exists" => SelectorOperator::Exists,
            "DoesNotExist" => SelectorOperator::DoesNotExist,
            _ => {
                return Err(invalid(format!(
                    "spec.{field}.matchExpressions[{i}].operator must be In, NotIn, Exists or DoesNotExist"
                )));
            }
        };
        out.match_expressions.push(SelectorRequirement {
            key: r.key.clone(),
            operator,
            values: r.values.clone().unwrap_or_default(),
        });
    }
    Ok(out)
}

/// The allocator pool a resource describes, or why it cannot be used. Bounds are checked
/// again here: the API server may not have enforced the CRD's rules (an older CRD).
pub fn to_pool(resource: &LoadBalancerIPPool) -> Result<Pool, Verdict> {
    let spec = &resource.spec;
    if spec.cidrs.len() + spec.ranges.len() > MAX_POOL_ENTRIES {
        return Err(invalid(format!("spec.cidrs and spec.ranges list more than {MAX_POOL_ENTRIES} entries together")));
    }
    if spec.namespaces.len() > MAX_POOL_NAMESPACES {
        return Err(invalid(format!("spec.namespaces lists more than {MAX_POOL_NAMESPACES} namespaces")));
    }
    let cidrs = spec.cidrs.iter().enumerate().map(|(i, t)| (format!("spec.cidrs[{i}]"), IpBlock::parse_cidr(t)));
    let ranges = spec.ranges.iter().enumerate().map(|(i, t)| (format!("spec.ranges[{i}]"), IpBlock::parse_range(t)));
    let mut blocks = Vec::new();
    for (field, parsed) in cidrs.chain(ranges) {
        let block = parsed.map_err(|m| invalid(format!("{field} {m}")))?;
        if let Some(class) = block.wholly_reserved(false) {
            return Err(invalid(format!("{field} {}", class.refusal())));
        }
        let parts = block.usable_parts(false);
        if parts.is_empty() {
            return Err(invalid(format!("{field} has no address left once reserved addresses are left out")));
        }
        blocks.extend(parts);
    }
    if blocks.is_empty() {
        return Err(invalid("the pool needs at least one entry in spec.cidrs or spec.ranges".to_string()));
    }
    let policy = spec.advertisement.as_ref().map(policy).transpose()?.unwrap_or_default();
    Ok(Pool {
        name: resource.name_any(),
        blocks,
        namespaces: spec.namespaces.iter().cloned().collect(),
        selector: spec.service_selector.as_ref().map(|s| selector(s, "serviceSelector")).transpose()?,
        namespace_selector: spec.namespace_selector.as_ref().map(|s| selector(s, "namespaceSelector")).transpose()?,
        auto_assign: spec.auto_assign,
        avoid_buggy_ips: spec.avoid_buggy_ips,
        allow_sharing: spec.allow_sharing,
        ports: Default::default(),
        disabled: false,
        policy,
    })
}

/// `spec.advertisement`, checked as a cloud-config pool's is.
fn policy(advertisement: &PoolAdvertisement) -> Result<PoolPolicy, Verdict> {
    let at = FieldPath::root().field("spec").field("advertisement");
    let bgp = advertisement.bgp.as_ref();
    let local_pref = match bgp.and_then(|b| b.local_pref) {
        None => None,
        Some(pref) => Some(u32::try_from(pref).map_err(|_| {
            invalid("spec.advertisement.bgp.localPref must be a number from 0 to 4294967295".to_string())
        })?),
    };
    let config = PolicyConfig {
        node_selector: (advertisement.node_selector.as_ref())
            .map(|s| selector(s, "advertisement.nodeSelector"))
            .transpose()?,
        l2_preferred_nodes: advertisement.l2_preferred_nodes.clone(),
        l2_interfaces: advertisement.l2_interfaces.clone(),
        bgp: bgp.map(|b| BgpPolicyConfig {
            communities: b.communities.clone(),
            large_communities: b.large_communities.clone(),
            local_pref,
        }),
    };
    config.check(&at).map_err(|p| invalid(format!("{} {}", p.field, p.message)))
}

/// The pools to hand out and the verdict on every resource.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Merged {
    /// The cloud-config's pools, then the valid resources' pools.
    pub pools: Vec<Pool>,
    /// Each resource's verdict, by name.
    pub verdicts: BTreeMap<String, Verdict>,
}

/// Merge the cloud-config's pools with the resources' (see the module's precedence).
pub fn merge(config: &[Pool], resources: &[&LoadBalancerIPPool]) -> Merged {
    let mut ordered: Vec<&LoadBalancerIPPool> = resources.to_vec();
    ordered.sort_by(|a, b| {
        (&a.metadata.creation_timestamp, a.name_any()).cmp(&(&b.metadata.creation_timestamp, b.name_any()))
    });
    let config_names: BTreeSet<&str> = config.iter().map(|p| p.name.as_str()).collect();
    let mut merged = Merged { pools: config.to_vec(), verdicts: BTreeMap::new() };
    for resource in ordered {
        let name = resource.name_any();
        let verdict = match to_pool(resource) {
            Err(verdict) => verdict,
            Ok(_) if config_names.contains(name.as_str()) => Verdict {
                reason: ip_pool::NAME_TAKEN,
                message: format!("the cloud-config has a pool named {name}, which is used instead"),
            },
            Ok(pool) => match overlap(&merged.pools, config.len(), &pool) {
                Some(message) => Verdict { reason: ip_pool::OVERLAP, message },
                None => {
                    merged.pools.push(pool);
                    Verdict::valid()
                }
            },
        };
        merged.verdicts.insert(name, verdict);
    }
    merged
}

/// The first overlap of `pool` with an accepted pool (the first `from_config` of them are the
/// cloud-config's), as a message naming the range and the other pool.
fn overlap(accepted: &[Pool], from_config: usize, pool: &Pool) -> Option<String> {
    for block in &pool.blocks {
        if let Some(i) = accepted.iter().position(|p| p.blocks.iter().any(|b| b.overlaps(block))) {
            let source = if i < from_config { "the cloud-config's pool" } else { "the older pool" };
            return Some(format!("{}-{} overlaps {source} {}", block.first(), block.last(), accepted[i].name));
        }
    }
    None
}

/// Addresses of one family in a pool: in use and usable.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Addresses assigned (a shared one counts once).
    pub in_use: u128,
    /// Addresses the allocator may hand out.
    pub usable: u128,
}

/// Usage per family of `pool`, given how many addresses are in use in each block.
pub fn counts(pool: &Pool, in_use: impl Fn(&IpBlock) -> usize) -> BTreeMap<Family, Counts> {
    let mut out: BTreeMap<Family, Counts> = BTreeMap::new();
    for block in &pool.blocks {
        let c = out.entry(block.family()).or_default();
        c.in_use = c.in_use.saturating_add(in_use(block) as u128);
        c.usable = c.usable.saturating_add(block.usable(pool.avoid_buggy_ips));
    }
    out
}

fn usage(counts: Option<&Counts>) -> Option<FamilyUsage> {
    let c = counts?;
    let cap = |v: u128| i64::try_from(v).unwrap_or(i64::MAX);
    Some(FamilyUsage { assigned: cap(c.in_use), available: cap(c.usable.saturating_sub(c.in_use)) })
}

/// The status a resource should have: its verdict as the `Valid` condition and, when valid,
/// its usage per family. `lastTransitionTime` is kept unless the condition's status changes.
pub fn desired_status(
    resource: &LoadBalancerIPPool,
    verdict: &Verdict,
    counts: Option<&BTreeMap<Family, Counts>>,
    now: &Time,
) -> LoadBalancerIPPoolStatus {
    let status = if verdict.is_valid() { "True" } else { "False" };
    let current =
        resource.status.as_ref().and_then(|s| s.conditions.iter().find(|c| c.type_ == ip_pool::CONDITION_TYPE));
    let last_transition_time = match current {
        Some(c) if c.status == status => c.last_transition_time.clone(),
        _ => now.clone(),
    };
    let generation = resource.metadata.generation;
    LoadBalancerIPPoolStatus {
        observed_generation: generation,
        ipv4: usage(counts.and_then(|c| c.get(&Family::V4))),
        ipv6: usage(counts.and_then(|c| c.get(&Family::V6))),
        conditions: vec![Condition {
            type_: ip_pool::CONDITION_TYPE.to_string(),
            status: status.to_string(),
            reason: verdict.reason.to_string(),
            message: verdict.message.clone(),
            observed_generation: generation,
            last_transition_time,
        }],
    }
}

/// Whether writing `desired` changes the resource's status (only our condition is compared).
pub fn status_changed(resource: &LoadBalancerIPPool, desired: &LoadBalancerIPPoolStatus) -> bool {
    let Some(current) = resource.status.as_ref() else { return true };
    let ours = |s: &LoadBalancerIPPoolStatus| -> Vec<Condition> {
        s.conditions.iter().filter(|c| c.type_ == ip_pool::CONDITION_TYPE).cloned().collect()
    };
    current.observed_generation != desired.observed_generation
        || current.ipv4 != desired.ipv4
        || current.ipv6 != desired.ipv6
        || ours(current) != ours(desired)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crds::pool::LoadBalancerIPPoolSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;
    use kube::api::ObjectMeta;

    fn at(secs: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap())
    }

    fn resource(name: &str, created: i64, cidrs: &[&str], ranges: &[&str]) -> LoadBalancerIPPool {
        LoadBalancerIPPool {
            metadata: ObjectMeta {
                name: Some(name.into()),
                creation_timestamp: Some(at(created)),
                generation: Some(1),
                ..Default::default()
            },
            spec: LoadBalancerIPPoolSpec {
                cidrs: cidrs.iter().map(|s| s.to_string()).collect(),
                ranges: ranges.iter().map(|s| s.to_string()).collect(),
                auto_assign: true,
                avoid_buggy_ips: false,
                allow_sharing: true,
                namespaces: vec![],
                namespace_selector: None,
                service_selector: None,
                advertisement: None,
            },
            status: None,
        }
    }

    fn config_pool(name: &str, cidr: &str) -> Pool {
        let mut p = to_pool(&resource(name, 0, &[cidr], &[])).unwrap();
        p.auto_assign = true;
        p
    }

    #[test]
    fn a_resources_advertisement_becomes_the_pools_policy_and_a_wrong_one_names_the_field() {
        use crds::pool::{PoolAdvertisement, PoolBgpAdvertisement};
        let mut r = resource("edge", 1, &["192.0.2.0/28"], &[]);
        r.spec.advertisement = Some(PoolAdvertisement {
            node_selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([("edge".to_string(), "true".to_string())])),
                ..Default::default()
            }),
            l2_preferred_nodes: vec!["w3".into()],
            l2_interfaces: vec!["eth1".into()],
            bgp: Some(PoolBgpAdvertisement {
                communities: vec!["65000:7".into()],
                large_communities: vec!["65000:1:2".into()],
                local_pref: Some(250),
            }),
        });
        let policy = to_pool(&r).unwrap().policy;
        assert_eq!(policy.preferred, ["w3"]);
        assert_eq!(policy.l2_interfaces, ["eth1"]);
        assert_eq!(policy.route.local_pref, Some(250));
        assert_eq!(policy.route.large_communities, [(65000, 1, 2)]);
        assert!(policy.node_selector.is_some_and(|s| s.match_labels["edge"] == "true"));
        // An API server without the CRD's rules (an older CRD) lets these through; the pool is
        // then refused, naming the field.
        let bgp = |communities: Vec<String>, local_pref| PoolAdvertisement {
            bgp: Some(PoolBgpAdvertisement { communities, large_communities: vec![], local_pref }),
            ..Default::default()
        };
        for (advertisement, needle) in [
            (bgp(vec!["65000:70000".into()], None), "spec.advertisement.bgp.communities[0] must be a BGP community"),
            (bgp(vec![], Some(1 << 40)), "spec.advertisement.bgp.localPref must be a number"),
            (
                PoolAdvertisement { l2_preferred_nodes: vec!["a,b".into()], ..Default::default() },
                "spec.advertisement.l2PreferredNodes[0] must be a node name",
            ),
            (
                PoolAdvertisement { l2_interfaces: vec!["eth0".into(), "eth0".into()], ..Default::default() },
                "spec.advertisement.l2Interfaces[1] is listed twice",
            ),
            (
                PoolAdvertisement { l2_interfaces: vec!["eth/0".into()], ..Default::default() },
                "spec.advertisement.l2Interfaces[0] must be an interface name",
            ),
        ] {
            r.spec.advertisement = Some(advertisement);
            let verdict = to_pool(&r).expect_err(needle);
            assert!(verdict.message.contains(needle), "{}", verdict.message);
            assert_eq!(verdict.reason, ip_pool::INVALID_ENTRY);
        }
    }

    #[test]
    fn a_resource_becomes_a_pool_with_its_settings_and_selectors() {
        let mut r = resource("lab", 1, &["192.0.2.0/28"], &["2001:db8::10-2001:db8::1f"]);
        r.spec.auto_assign = false;
        r.spec.avoid_buggy_ips = true;
        r.spec.service_selector = Some(LabelSelector {
            match_labels: Some([("team".to_string(), "a".to_string())].into()),
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "tier".into(),
                operator: "In".into(),
                values: Some(vec!["web".into()]),
            }]),
        });
        let pool = to_pool(&r).unwrap();
        assert_eq!(pool.name, "lab");
        assert_eq!(pool.blocks.len(), 2);
        assert!(!pool.auto_assign && pool.avoid_buggy_ips && pool.allow_sharing);
        let sel = pool.selector.unwrap();
        assert!(sel.matches(&[("team".into(), "a".into()), ("tier".into(), "web".into())].into()));
        assert!(!sel.matches(&[("team".into(), "a".into())].into()));
    }

    #[test]
    fn unusable_entries_are_invalid_naming_the_field() {
        for (cidrs, ranges, needle) in [
            (&["192.0.2.1/24"][..], &[][..], "spec.cidrs[0] has host bits set"),
            (&[], &["192.0.2.20-192.0.2.10"], "spec.ranges[0] ends before it starts"),
            (&["127.0.0.0/8"], &[], "spec.cidrs[0]"),
            (&[], &[], "at least one entry"),
        ] {
            let verdict = to_pool(&resource("p", 1, cidrs, ranges)).unwrap_err();
            assert_eq!(verdict.reason, "InvalidEntry");
            assert!(verdict.message.contains(needle), "{needle:?} in {:?}", verdict.message);
        }
        let mut bad = resource("p", 1, &["192.0.2.0/28"], &[]);
        bad.spec.namespace_selector = Some(LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "k".into(),
                operator: "Matches".into(),
                values: None,
            }]),
            ..Default::default()
        });
        assert!(to_pool(&bad).unwrap_err().message.contains("spec.namespaceSelector.matchExpressions[0].operator"));
    }

    #[test]
    fn config_pools_come_first_then_older_resources_and_overlaps_or_names_are_refused() {
        let config = [config_pool("default", "192.0.2.0/28")];
        let newer = resource("b-newer", 20, &["198.51.100.0/28"], &[]);
        let older = resource("z-older", 10, &["198.51.100.8/29"], &[]);
        let over_config = resource("c", 30, &[], &["192.0.2.15-192.0.2.20"]);
        let same_name = resource("default", 5, &["203.0.113.0/28"], &[]);
        let merged = merge(&config, &[&newer, &older, &over_config, &same_name]);
        let names: Vec<&str> = merged.pools.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["default", "z-older"]);
        assert!(merged.verdicts["z-older"].is_valid());
        assert_eq!(merged.verdicts["b-newer"].reason, "Overlap");
        assert!(merged.verdicts["b-newer"].message.contains("z-older"), "{:?}", merged.verdicts["b-newer"]);
        assert_eq!(merged.verdicts["c"].reason, "Overlap");
        assert!(merged.verdicts["c"].message.contains("default"));
        assert_eq!(merged.verdicts["default"].reason, "NameTaken");
    }

    #[test]
    fn status_counts_per_family_and_is_rewritten_only_when_it_changes() {
        let mut r = resource("lab", 1, &["192.0.2.0/30", "2001:db8::/126"], &[]);
        let pool = to_pool(&r).unwrap();
        let c = counts(&pool, |b| if b.family() == Family::V4 { 1 } else { 0 });
        let status = desired_status(&r, &Verdict::valid(), Some(&c), &at(100));
        assert_eq!(status.ipv4, Some(FamilyUsage { assigned: 1, available: 3 }));
        // 2001:db8:: is the /126's subnet-router anycast address, never handed out.
        assert_eq!(status.ipv6, Some(FamilyUsage { assigned: 0, available: 3 }));
        assert_eq!(status.conditions[0].status, "True");
        assert!(status_changed(&r, &status), "no status yet");
        r.status = Some(status.clone());
        let again = desired_status(&r, &Verdict::valid(), Some(&c), &at(200));
        assert!(!status_changed(&r, &again), "same usage and verdict: no write");
        assert_eq!(again.conditions[0].last_transition_time, at(100));
        let overlap = Verdict { reason: ip_pool::OVERLAP, message: "x".into() };
        let refused = desired_status(&r, &overlap, None, &at(300));
        assert!(status_changed(&r, &refused));
        assert_eq!(refused.conditions[0].last_transition_time, at(300));
        assert_eq!(refused.ipv4, None);
    }

    #[test]
    fn huge_ipv6_pools_are_capped_at_the_largest_integer() {
        let r = resource("big", 1, &["2001:db8::/64"], &[]);
        let pool = to_pool(&r).unwrap();
        let status = desired_status(&r, &Verdict::valid(), Some(&counts(&pool, |_| 2)), &at(1));
        assert_eq!(status.ipv6, Some(FamilyUsage { assigned: 2, available: i64::MAX }));
    }
}
