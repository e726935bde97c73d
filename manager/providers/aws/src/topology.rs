//! Upstream's network-topology labels (`topology.k8s.aws/network-node-layer-N`) from
//! `DescribeInstanceTopology`, where the API answers.
//!
//! The decisions are pure and live here: which instances to ask about, what an answer or an
//! error means, and the labels. What is learnt not to answer (a region without the API, a
//! manager without the permission, an instance type without topology) is remembered for a day,
//! as upstream does, so it costs one call, not one per lookup.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

/// The label prefix; layer 1 is the top of the hierarchy, the last one the network node the
/// instance is attached to.
pub const LABEL_LAYER_PREFIX: &str = "topology.k8s.aws/network-node-layer-";
/// Layers labelled at most (AWS reports up to 4 today); bounds what an answer can add.
pub const MAX_LAYERS: usize = 8;
/// Instance IDs per `DescribeInstanceTopology` call (the API's limit).
pub const IDS_PER_CALL: usize = 100;
/// How long "does not answer" is remembered (upstream: 24 h).
pub const REMEMBER_UNSUPPORTED: Duration = Duration::from_secs(24 * 60 * 60);
/// How long a failed call (not a definite "unsupported") stops further calls for instance
/// types that need no answer.
pub const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(10 * 60);
/// Entries remembered at most (bounds memory whatever the cluster does).
pub const MAX_REMEMBERED: usize = 10_000;

/// The longest `SupportedTopologyInstanceTypePattern` accepted.
pub const MAX_PATTERN_BYTES: usize = 1024;

/// Which instance types must have a topology: upstream's default pattern, or the cloud-config's
/// `SupportedTopologyInstanceTypePattern` (a regular expression matched anywhere in the type, as
/// Go's `MatchString` does upstream).
#[derive(Debug, Clone, Default)]
pub enum TopologyTypes {
    /// Upstream's default, [`requires_topology`].
    #[default]
    Upstream,
    /// The configured pattern.
    Pattern(regex_lite::Regex),
}

impl TopologyTypes {
    /// Compile a configured pattern, bounded in length and compiled size (`regex-lite` matches
    /// in linear time, so no pattern can stall a lookup).
    pub fn parse(pattern: &str) -> Result<Self, &'static str> {
        if pattern.len() > MAX_PATTERN_BYTES {
            return Err("longer than 1024 bytes");
        }
        regex_lite::RegexBuilder::new(pattern)
            .size_limit(1 << 20)
            .nest_limit(64)
            .build()
            .map(Self::Pattern)
            .map_err(|_| "not a regular expression")
    }

    /// Whether instances of `instance_type` must have a topology.
    pub fn requires(&self, instance_type: &str) -> bool {
        match self {
            Self::Upstream => requires_topology(instance_type),
            Self::Pattern(re) => re.is_match(instance_type),
        }
    }
}

impl PartialEq for TopologyTypes {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::Upstream, Self::Upstream) => true,
            (Self::Pattern(a), Self::Pattern(b)) => a.as_str() == b.as_str(),
            _ => false,
        }
    }
}

impl Eq for TopologyTypes {}

/// Upstream's default `SupportedTopologyInstanceTypePattern`, `^(hpc|trn|p)[0-9]+[a-z]*(-[a-z0-9]+)?(\.[0-9a-z]*)$`:
/// instance types that must have a topology, so a failure to read it is an error for them (the
/// Node waits) instead of labels quietly left out.
pub fn requires_topology(instance_type: &str) -> bool {
    let Some((family, size)) = instance_type.split_once('.') else { return false };
    if !size.chars().all(|c| c.is_ascii_digit() || c.is_ascii_lowercase()) {
        return false;
    }
    let rest = ["hpc", "trn", "p"].iter().find_map(|p| family.strip_prefix(p));
    let Some(rest) = rest else { return false };
    let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
    if digits == 0 {
        return false;
    }
    let rest = &rest[digits..];
    let letters = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_lowercase()).len();
    let rest = &rest[letters..];
    match rest.strip_prefix('-') {
        None => rest.is_empty(),
        Some(tail) => !tail.is_empty() && tail.chars().all(|c| c.is_ascii_digit() || c.is_ascii_lowercase()),
    }
}

/// The labels for an instance's network nodes (top first), at most [`MAX_LAYERS`]; a value
/// that is not a valid label value ends the list (a later layer without its parents would
/// mislead a scheduler).
pub fn layer_labels(network_nodes: &[String]) -> BTreeMap<String, String> {
    network_nodes
        .iter()
        .take(MAX_LAYERS)
        .take_while(|n| valid_label_value(n))
        .enumerate()
        .map(|(i, n)| (format!("{LABEL_LAYER_PREFIX}{}", i + 1), n.clone()))
        .collect()
}

fn valid_label_value(v: &str) -> bool {
    let b = v.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// What a failed `DescribeInstanceTopology` means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The region lacks the API, or the manager the permission: do not ask again for a day.
    Unsupported,
    /// Anything else (throttled, unreachable, an emulator without the API): labels left out for
    /// now, asked again after [`RETRY_AFTER_FAILURE`]; instance types that need an answer wait.
    Transient,
}

/// Classify an error by its code (`None` when the service sent none).
pub fn failure_of(code: Option<&str>) -> Failure {
    match code {
        Some("UnsupportedOperation" | "UnauthorizedOperation" | "InvalidAction" | "OptInRequired") => {
            Failure::Unsupported
        }
        _ => Failure::Transient,
    }
}

/// What is known not to answer, with when each fact expires.
#[derive(Debug, Default)]
pub struct TopologyMemory {
    /// The instance types that must have a topology.
    types: TopologyTypes,
    region_until: Option<Instant>,
    /// Only for instance types that need no answer: until then, skip them.
    failed_until: Option<Instant>,
    /// Instance types (and, for types that need an answer, instance IDs) without topology.
    unsupported: HashMap<String, Instant>,
}

impl TopologyMemory {
    /// Nothing known yet; `types` must have a topology.
    pub fn new(types: TopologyTypes) -> Self {
        Self { types, ..Self::default() }
    }

    /// The instances to ask about now, from (instance ID, instance type) pairs.
    pub fn to_ask(&self, instances: &[(String, String)], now: Instant) -> Vec<String> {
        if self.region_until.is_some_and(|t| now < t) {
            return Vec::new();
        }
        let failed = self.failed_until.is_some_and(|t| now < t);
        let known = |k: &str| self.unsupported.get(k).is_some_and(|t| now < *t);
        let mut out: Vec<String> = instances
            .iter()
            .filter(|(id, ty)| !ty.is_empty() && !known(ty) && !known(id))
            .filter(|(_, ty)| !failed || self.types.requires(ty))
            .map(|(id, _)| id.clone())
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// Learn from an answer: an asked instance without topology marks its type (or, for a type
    /// that needs one, only itself: it may be starting or stopping) as without topology.
    pub fn answered(&mut self, asked: &[(String, String)], answered: &BTreeMap<String, Vec<String>>, now: Instant) {
        for (id, ty) in asked {
            if answered.get(id).is_some_and(|n| !n.is_empty()) {
                continue;
            }
            let key = if self.types.requires(ty) { id } else { ty };
            self.remember(key.clone(), now + REMEMBER_UNSUPPORTED);
        }
    }

    /// Learn from a failure.
    pub fn failed(&mut self, failure: Failure, now: Instant) {
        match failure {
            Failure::Unsupported => self.region_until = Some(now + REMEMBER_UNSUPPORTED),
            Failure::Transient => self.failed_until = Some(now + RETRY_AFTER_FAILURE),
        }
    }

    fn remember(&mut self, key: String, until: Instant) {
        if self.unsupported.len() >= MAX_REMEMBERED {
            let now = Instant::now();
            self.unsupported.retain(|_, t| *t > now);
            if self.unsupported.len() >= MAX_REMEMBERED {
                self.unsupported.clear();
            }
        }
        self.unsupported.insert(key, until);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstreams_pattern_selects_the_instance_types_that_need_a_topology() {
        for t in ["p4d.24xlarge", "p5.48xlarge", "trn1.32xlarge", "trn2.48xlarge", "hpc7g.16xlarge", "p5e-u.48xlarge"] {
            assert!(requires_topology(t), "{t}");
        }
        for t in ["m5.large", "c7gn.16xlarge", "t3.micro", "p.large", "inf2.xlarge", "p4d", ""] {
            assert!(!requires_topology(t), "{t}");
        }
    }

    #[test]
    fn layers_are_labelled_top_first_and_bounded() {
        let nodes: Vec<String> = ["nn-1111", "nn-2222", "nn-3333"].iter().map(|s| s.to_string()).collect();
        let l = layer_labels(&nodes);
        assert_eq!(l.len(), 3);
        assert_eq!(l["topology.k8s.aws/network-node-layer-1"], "nn-1111");
        assert_eq!(l["topology.k8s.aws/network-node-layer-3"], "nn-3333");
        let many: Vec<String> = (0..20).map(|i| format!("nn-{i}")).collect();
        assert_eq!(layer_labels(&many).len(), MAX_LAYERS);
        let bad: Vec<String> = ["nn-1", "not a label", "nn-3"].iter().map(|s| s.to_string()).collect();
        assert_eq!(layer_labels(&bad).len(), 1, "no layer below an unusable one");
    }

    /// A recorded answer (EC2's documented example, trimmed): two instances of which one
    /// type has no topology.
    #[test]
    fn a_recorded_answer_labels_the_instances_and_remembers_types_without_topology() {
        let now = Instant::now();
        let mut m = TopologyMemory::default();
        let asked = vec![
            ("i-1111111111example".to_string(), "p4d.24xlarge".to_string()),
            ("i-2222222222example".to_string(), "m5.large".to_string()),
            ("i-3333333333example".to_string(), "p5.48xlarge".to_string()),
        ];
        assert_eq!(m.to_ask(&asked, now).len(), 3);
        let answer: BTreeMap<String, Vec<String>> = [(
            "i-1111111111example".to_string(),
            vec![
                "nn-1111111111example".to_string(),
                "nn-2222222222example".to_string(),
                "nn-3333333333example".to_string(),
            ],
        )]
        .into();
        m.answered(&asked, &answer, now);
        // m5.large (needs none) is remembered by type; the p5 without an answer only by ID.
        let next =
            m.to_ask(&[asked[0].clone(), asked[1].clone(), ("i-4".into(), "m5.large".into()), asked[2].clone()], now);
        assert_eq!(next, vec!["i-1111111111example".to_string()]);
        assert_eq!(m.to_ask(&[("i-5".into(), "p5.48xlarge".into())], now), vec!["i-5".to_string()]);
        // A day later everything is asked again.
        assert_eq!(m.to_ask(&asked, now + REMEMBER_UNSUPPORTED + Duration::from_secs(1)).len(), 3);
    }

    #[test]
    fn unsupported_regions_stop_the_calls_for_a_day_and_transient_failures_only_for_types_that_need_none() {
        let now = Instant::now();
        let asked = vec![("i-1".to_string(), "m5.large".to_string()), ("i-2".to_string(), "trn1.32xlarge".to_string())];
        assert_eq!(failure_of(Some("UnsupportedOperation")), Failure::Unsupported);
        assert_eq!(failure_of(Some("UnauthorizedOperation")), Failure::Unsupported);
        assert_eq!(failure_of(Some("RequestLimitExceeded")), Failure::Transient);
        assert_eq!(failure_of(None), Failure::Transient, "an emulator's 500 without a code");
        let mut m = TopologyMemory::default();
        m.failed(Failure::Transient, now);
        assert_eq!(m.to_ask(&asked, now), vec!["i-2".to_string()], "a type that needs an answer is still asked");
        assert_eq!(m.to_ask(&asked, now + RETRY_AFTER_FAILURE + Duration::from_secs(1)).len(), 2);
        m.failed(Failure::Unsupported, now);
        assert!(m.to_ask(&asked, now + Duration::from_secs(3600)).is_empty());
    }

    #[test]
    fn a_configured_pattern_replaces_upstreams_and_is_bounded() {
        let types = TopologyTypes::parse("^(g6|p5)\\.").unwrap();
        assert!(types.requires("g6.xlarge") && types.requires("p5.48xlarge"));
        assert!(!types.requires("trn1.32xlarge"), "upstream's default no longer applies");
        assert!(TopologyTypes::default().requires("trn1.32xlarge"));
        assert_eq!(TopologyTypes::parse("(unclosed"), Err("not a regular expression"));
        assert_eq!(TopologyTypes::parse(&"a".repeat(MAX_PATTERN_BYTES + 1)), Err("longer than 1024 bytes"));
        // A failure pauses the calls except for the configured types.
        let now = Instant::now();
        let mut m = TopologyMemory::new(types);
        m.failed(Failure::Transient, now);
        let asked = [("i-1".to_string(), "g6.xlarge".to_string()), ("i-2".to_string(), "trn1.32xlarge".to_string())];
        assert_eq!(m.to_ask(&asked, now), vec!["i-1".to_string()]);
    }
}
