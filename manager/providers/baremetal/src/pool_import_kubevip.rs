//! kube-vip-cloud-provider's pools (`loadBalancer.importPools: [kubevip]`), read in place from
//! its ConfigMap (`kubevip` in `kube-system` unless named) for a migration in which no Service
//! changes address (pure; the reading is in [`crate::pool_import_watch`]).
//!
//! The ConfigMap's data keys `cidr-<namespace>`, `range-<namespace>`, `cidr-global` and
//! `range-global` hold comma-separated CIDRs or `first-last` ranges. kube-vip-cloud-provider
//! gives a Service of namespace N the first of `cidr-N`, `cidr-global`, `range-N`,
//! `range-global` that exists; each key here becomes one imported pool, ranked in that order
//! (a namespace's pool admitting that namespace only), so a Service is offered the pool
//! kube-vip would have used first. Each pool holds exactly the addresses kube-vip hands out:
//! every address of a CIDR (the first and last left out with `skip-end-ips-in-cidr: "true"`,
//! except in a /31 or /32), and never an IPv4 address ending in `.0` or `.255`
//! (`avoidBuggyIPs`). Other keys are warnings naming the key; a malformed value keeps that key's
//! pool out with an error naming the key.

use std::collections::BTreeMap;
use std::net::IpAddr;

use crds::pool::{MAX_ENTRY_LENGTH, MAX_POOL_ENTRIES};
use kube::api::ObjectMeta;

use crate::pool_import::{
    self, ImportError, Imported, Source, Warning, from_u128, inexpressible, malformed, to_u128, warn,
};

pub use crate::ipam::{
    KUBE_VIP_IMPLEMENTATION_LABEL as IMPLEMENTATION_LABEL, KUBE_VIP_IMPLEMENTATION_VALUE as IMPLEMENTATION_VALUE,
};
pub use crate::pool_import::{KUBE_VIP_DEFAULT_NAME as DEFAULT_NAME, KUBE_VIP_DEFAULT_NAMESPACE as DEFAULT_NAMESPACE};
/// The most data keys read from the ConfigMap; more refuse the whole ConfigMap.
pub const MAX_KEYS: usize = 1024;
/// The longest value read (every entry at its longest, with commas).
pub const MAX_VALUE_LENGTH: usize = MAX_POOL_ENTRIES * (MAX_ENTRY_LENGTH + 1);
/// How much of an unknown key a warning quotes.
const QUOTED_KEY: usize = 64;
/// The suffix kube-vip reads for every namespace.
const GLOBAL: &str = "global";

/// One pool key of the ConfigMap, converted.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyPool {
    /// The data key (`cidr-default`).
    pub key: String,
    /// The imported pool's name ([`Source::pool_name`]).
    pub pool_name: String,
    /// The converted pool, or why there is none.
    pub result: Result<Imported, ImportError>,
}

/// The ConfigMap converted: one pool per address key, and what no pool can say.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Converted {
    /// One entry per `cidr-*` / `range-*` key, in kube-vip's search order.
    pub pools: Vec<KeyPool>,
    /// Keys the pools cannot express or this importer does not know, naming the key.
    pub warnings: Vec<Warning>,
}

/// Which kind of address key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Cidr,
    Range,
}

/// Where a key applies.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Scope {
    Namespace(String),
    Global,
}

/// The rank of a key in kube-vip's search order (lower is read first).
fn rank(kind: Kind, scope: &Scope) -> i64 {
    match (kind, scope) {
        (Kind::Cidr, Scope::Namespace(_)) => 1,
        (Kind::Cidr, Scope::Global) => 2,
        (Kind::Range, Scope::Namespace(_)) => 3,
        (Kind::Range, Scope::Global) => 4,
    }
}

fn field(key: &str) -> String {
    format!("data.{}", key.chars().take(QUOTED_KEY).collect::<String>())
}

fn is_namespace(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

/// Go's `strconv.ParseBool`, which kube-vip reads `allow-share-*` with.
fn go_bool(text: &str) -> Option<bool> {
    match text {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Some(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Some(false),
        _ => None,
    }
}

fn scope_of(suffix: &str) -> Option<Scope> {
    if suffix == GLOBAL {
        Some(Scope::Global)
    } else if is_namespace(suffix) {
        Some(Scope::Namespace(suffix.to_string()))
    } else {
        None
    }
}

/// Convert kube-vip-cloud-provider's ConfigMap (`metadata` and `data`).
pub fn from_configmap(metadata: &ObjectMeta, data: &BTreeMap<String, String>) -> Result<Converted, ImportError> {
    if data.len() > MAX_KEYS {
        return Err(ImportError::TooLarge { field: "data".to_string(), max: MAX_KEYS, what: "keys" });
    }
    let mut warnings = Vec::new();
    let skip_end = data.get("skip-end-ips-in-cidr").is_some_and(|v| v.trim() == "true");
    let mut sharing: BTreeMap<Scope, bool> = BTreeMap::new();
    let mut addresses: Vec<(Kind, Scope, &str, &str)> = Vec::new();
    for (key, value) in data {
        if let Some((kind, suffix)) = key
            .strip_prefix("cidr-")
            .map(|s| (Kind::Cidr, s))
            .or_else(|| key.strip_prefix("range-").map(|s| (Kind::Range, s)))
        {
            match scope_of(suffix) {
                Some(scope) => addresses.push((kind, scope, key, value)),
                None => warnings.push(warn(field(key), "not a namespace name, so no Service is ever in it; ignored")),
            }
        } else if let Some(suffix) = key.strip_prefix("allow-share-") {
            let Some(scope) = scope_of(suffix) else {
                warnings.push(warn(field(key), "not a namespace name, so no Service is ever in it; ignored"));
                continue;
            };
            let allowed = go_bool(value.trim()).unwrap_or_else(|| {
                warnings.push(warn(field(key), "not true or false; read as false, as kube-vip-cloud-provider does"));
                false
            });
            sharing.insert(scope, allowed);
        } else if key == "skip-end-ips-in-cidr" {
            // Applied to every CIDR below.
        } else if key == "search-order" {
            if value.trim() == "desc" {
                warnings.push(warn(
                    field(key),
                    "desc is lost: new addresses are handed out lowest first (addresses already given are kept)",
                ));
            }
        } else if key.starts_with("interface-") {
            warnings.push(warn(
                field(key),
                "the interface kube-vip announces a namespace's addresses on is lost; set the announcer's interfaces in loadBalancer.announcement",
            ));
        } else {
            warnings.push(warn(field(key), "not understood by this importer; ignored"));
        }
    }
    addresses.sort_by(|a, b| (rank(a.0, &a.1), a.2).cmp(&(rank(b.0, &b.1), b.2)));
    let namespace = metadata.namespace.clone().unwrap_or_else(|| DEFAULT_NAMESPACE.to_string());
    let mut pools = Vec::new();
    for &(kind, ref scope, key, value) in &addresses {
        let pool_name = Source::Kubevip.pool_name(Some(&namespace), key);
        let sharing_allowed = match scope {
            Scope::Namespace(n) => sharing.get(&Scope::Namespace(n.clone())).or(sharing.get(&Scope::Global)),
            Scope::Global => sharing.get(&Scope::Global),
        }
        .copied()
        .unwrap_or(false);
        let result = convert_key(kind, key, value, skip_end).map(|ranges| {
            let mut spec = pool_import::spec_with(Vec::new(), ranges);
            // kube-vip never hands out an IPv4 address ending in .0 or .255, in CIDRs and ranges.
            spec.avoid_buggy_ips = true;
            spec.allow_sharing = sharing_allowed;
            if let Scope::Namespace(n) = scope {
                spec.namespaces = vec![n.clone()];
            }
            let mut key_warnings = Vec::new();
            if kind == Kind::Range {
                let earlier: Vec<&str> = addresses
                    .iter()
                    .filter(|(k, s, _, _)| *k == Kind::Cidr && (*s == Scope::Global || s == scope))
                    .map(|(_, _, k, _)| *k)
                    .take(4)
                    .collect();
                if !earlier.is_empty() {
                    key_warnings.push(warn(
                        field(key),
                        format!(
                            "kube-vip-cloud-provider reads cidr keys before range keys, so while {} exists it gives this range's Services none of its addresses; imported after them, its addresses are handed out once they are full",
                            earlier.join(", ")
                        ),
                    ));
                }
            }
            if sharing_allowed {
                key_warnings.push(warn(
                    field(key),
                    "allow-share: kube-vip shares an IPv4 address between Services with distinct ports unasked; here the pool allows sharing, and Services share only when they carry the same ccm.rs/allow-shared-ip key (give Services that share an address today one key before switching, or all but the oldest get a new address)",
                ));
            }
            let meta = ObjectMeta {
                name: Some(key.to_string()),
                namespace: Some(namespace.clone()),
                creation_timestamp: metadata.creation_timestamp.clone(),
                ..Default::default()
            };
            pool_import::imported(Source::Kubevip, &meta, spec, Some(rank(kind, scope)), key_warnings)
        });
        pools.push(KeyPool { key: key.to_string(), pool_name, result });
    }
    for (scope, allowed) in &sharing {
        if let Scope::Namespace(n) = scope
            && *allowed != sharing.get(&Scope::Global).copied().unwrap_or(false)
            && !addresses.iter().any(|(_, s, _, _)| s == scope)
        {
            warnings.push(warn(
                field(&format!("allow-share-{n}")),
                "namespace has no pool of its own: its Services use the global pools, whose sharing follows allow-share-global",
            ));
        }
    }
    Ok(Converted { pools, warnings })
}

/// The ranges kube-vip hands out from one key's value, merged (kube-vip joins its entries into
/// one set, so overlapping entries are allowed).
fn convert_key(kind: Kind, key: &str, value: &str, skip_end: bool) -> Result<Vec<String>, ImportError> {
    let base = field(key);
    if value.len() > MAX_VALUE_LENGTH {
        return Err(ImportError::TooLarge { field: base, max: MAX_VALUE_LENGTH, what: "characters" });
    }
    let value = value.trim();
    if value == "0.0.0.0/32" {
        return Err(inexpressible(base, "kube-vip's DHCP pool (0.0.0.0/32) has no addresses to import"));
    }
    let entries: Vec<&str> = value.split(',').collect();
    if entries.len() > MAX_POOL_ENTRIES {
        return Err(ImportError::TooLarge { field: base, max: MAX_POOL_ENTRIES, what: "entries" });
    }
    let mut blocks: Vec<(bool, u128, u128)> = Vec::new();
    for (i, entry) in entries.iter().enumerate() {
        let at = format!("{base}[{i}]");
        let entry = entry.trim();
        if entry.len() > MAX_ENTRY_LENGTH {
            return Err(ImportError::TooLarge { field: at, max: MAX_ENTRY_LENGTH, what: "characters" });
        }
        let (first, last) = match kind {
            Kind::Cidr => {
                let net: ipnet::IpNet =
                    entry.parse().map_err(|_| malformed(at.clone(), "a CIDR such as 192.0.2.0/28"))?;
                let net = net.trunc();
                let (mut first, mut last) = (to_u128(net.network()), to_u128(net.broadcast()));
                // kube-vip skips the ends only of IPv4 prefixes wider than /31.
                if skip_end && matches!(net, ipnet::IpNet::V4(_)) && net.prefix_len() < 31 {
                    first += 1;
                    last -= 1;
                }
                (from_u128(net.network(), first), from_u128(net.network(), last))
            }
            Kind::Range => {
                let bad =
                    || malformed(at.clone(), "a range first-last of two addresses of one family, first not after last");
                let (a, b) = entry.split_once('-').ok_or_else(bad)?;
                let first: IpAddr = a.trim().parse().map_err(|_| bad())?;
                let last: IpAddr = b.trim().parse().map_err(|_| bad())?;
                if first.is_ipv4() != last.is_ipv4() || to_u128(first) > to_u128(last) {
                    return Err(bad());
                }
                (first, last)
            }
        };
        blocks.push((first.is_ipv6(), to_u128(first), to_u128(last)));
    }
    blocks.sort();
    let mut merged: Vec<(bool, u128, u128)> = Vec::new();
    for block in blocks {
        match merged.last_mut() {
            Some(prev) if prev.0 == block.0 && block.1 <= prev.2.saturating_add(1) => prev.2 = prev.2.max(block.2),
            _ => merged.push(block),
        }
    }
    // IPv4 first (false sorts first), as kube-vip lists them.
    let like = |v6: bool| -> IpAddr {
        if v6 { IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED) } else { IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED) }
    };
    Ok(merged.into_iter().map(|(v6, a, b)| format!("{}-{}", from_u128(like(v6), a), from_u128(like(v6), b))).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool_resources::Merged;

    fn data(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn meta() -> ObjectMeta {
        ObjectMeta { name: Some("kubevip".into()), namespace: Some("kube-system".into()), ..Default::default() }
    }

    fn convert(pairs: &[(&str, &str)]) -> Converted {
        from_configmap(&meta(), &data(pairs)).unwrap()
    }

    fn pool<'a>(c: &'a Converted, key: &str) -> &'a Imported {
        c.pools.iter().find(|p| p.key == key).and_then(|p| p.result.as_ref().ok()).unwrap()
    }

    #[test]
    fn kube_vip_cidrs_and_ranges_become_the_addresses_kube_vip_hands_out() {
        let c = convert(&[
            ("cidr-default", "192.168.0.200/29,2001:db8::10/127"),
            ("range-global", "192.168.1.10-192.168.1.11, 192.168.1.10-192.168.1.13,2001:db8::20-2001:db8::24"),
        ]);
        let d = pool(&c, "cidr-default");
        assert_eq!(d.resource.spec.ranges, ["192.168.0.200-192.168.0.207", "2001:db8::10-2001:db8::11"]);
        assert!(d.resource.spec.cidrs.is_empty());
        assert_eq!(d.resource.spec.namespaces, ["default"]);
        assert!(d.resource.spec.avoid_buggy_ips, "kube-vip never hands out x.x.x.0 or x.x.x.255");
        assert!(!d.resource.spec.allow_sharing, "kube-vip shares only with allow-share");
        assert_eq!(d.resource.metadata.name.as_deref(), Some("kubevip:kube-system/cidr-default"));
        let g = pool(&c, "range-global");
        assert_eq!(g.resource.spec.ranges, ["192.168.1.10-192.168.1.13", "2001:db8::20-2001:db8::24"]);
        assert!(g.resource.spec.namespaces.is_empty(), "the global pool admits every namespace");
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
        assert!(d.warnings.is_empty() && g.warnings.is_empty());
    }

    #[test]
    fn kube_vip_skip_end_ips_leaves_out_the_ends_of_ipv4_cidrs_wider_than_a_31() {
        let c = convert(&[
            ("cidr-a", "192.168.0.200/29,192.168.0.220/31,192.168.0.230/32,2001:db8::/126"),
            ("skip-end-ips-in-cidr", "true"),
        ]);
        assert_eq!(
            pool(&c, "cidr-a").resource.spec.ranges,
            [
                "192.168.0.201-192.168.0.206",
                "192.168.0.220-192.168.0.221",
                "192.168.0.230-192.168.0.230",
                "2001:db8::-2001:db8::3"
            ]
        );
        assert!(c.warnings.is_empty(), "the key is expressed: {:?}", c.warnings);
    }

    #[test]
    fn kube_vip_namespace_pools_come_before_global_in_its_search_order() {
        let c = convert(&[
            ("range-global", "10.0.3.1-10.0.3.9"),
            ("range-b", "10.0.2.1-10.0.2.9"),
            ("cidr-global", "10.0.1.0/28"),
            ("cidr-b", "10.0.0.0/28"),
            ("cidr-a", "10.0.0.16/28"),
        ]);
        let keys: Vec<&str> = c.pools.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(keys, ["cidr-a", "cidr-b", "cidr-global", "range-b", "range-global"]);
        let imports: Vec<Imported> = c.pools.iter().filter_map(|p| p.result.clone().ok()).collect();
        let mut merged = Merged::default();
        let outcomes = pool_import::append(&mut merged, &imports, &[Source::Kubevip]);
        let names: Vec<&str> = merged.pools.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "kubevip:kube-system/cidr-a",
                "kubevip:kube-system/cidr-b",
                "kubevip:kube-system/cidr-global",
                "kubevip:kube-system/range-b",
                "kubevip:kube-system/range-global",
            ]
        );
        assert!(outcomes.values().all(|o| o.used));
        // kube-vip never reaches range-b while cidr-b or cidr-global exists: said, not hidden.
        let range_b = pool(&c, "range-b");
        assert_eq!(range_b.warnings.len(), 1);
        assert!(range_b.warnings[0].lost.contains("cidr-b, cidr-global"), "{}", range_b.warnings[0]);
    }

    #[test]
    fn kube_vip_overlapping_namespace_and_global_pools_leave_the_overlap_to_the_namespace() {
        let c = convert(&[("cidr-global", "10.0.0.0/24"), ("cidr-a", "10.0.0.8/29")]);
        let imports: Vec<Imported> = c.pools.iter().filter_map(|p| p.result.clone().ok()).collect();
        let mut merged = Merged::default();
        let outcomes = pool_import::append(&mut merged, &imports, &[Source::Kubevip]);
        assert_eq!(merged.pools[0].namespaces.iter().collect::<Vec<_>>(), ["a"]);
        let global = &outcomes["kubevip:kube-system/cidr-global"];
        assert!(
            global.used && global.notes[0].contains("10.0.0.8-10.0.0.15 also belongs to the earlier pool"),
            "{global:?}"
        );
    }

    #[test]
    fn kube_vip_malformed_values_keep_that_key_out_naming_it() {
        let c = convert(&[
            ("cidr-a", "10.0.0.0/28,lab"),
            ("range-b", "10.0.0.9-10.0.0.1"),
            ("range-c", "10.0.0.1-2001:db8::1"),
            ("range-d", "10.0.0.1"),
            ("cidr-global", "0.0.0.0/32"),
            ("range-global", "10.0.9.1-10.0.9.2"),
        ]);
        let error = |key: &str| c.pools.iter().find(|p| p.key == key).unwrap().result.clone().unwrap_err();
        let a = error("cidr-a");
        assert!(matches!(&a, ImportError::Malformed { field, .. } if field == "data.cidr-a[1]"), "{a}");
        assert!(a.to_string().contains("data.cidr-a[1] must be a CIDR"), "{a}");
        for key in ["range-b", "range-c", "range-d"] {
            let e = error(key);
            assert!(e.to_string().starts_with(&format!("data.{key}[0] must be a range")), "{e}");
        }
        assert!(
            matches!(error("cidr-global"), ImportError::Inexpressible { field, .. } if field == "data.cidr-global")
        );
        assert!(pool(&c, "range-global").resource.spec.ranges == ["10.0.9.1-10.0.9.2"], "the other keys still import");
    }

    #[test]
    fn kube_vip_unknown_and_inexpressible_keys_are_warnings_naming_the_key() {
        let c = convert(&[
            ("cidr-default", "10.0.0.0/28"),
            ("search-order", "desc"),
            ("interface-default", "eth3"),
            ("kubevip-services", "{}"),
            ("cidr-Not_A_Namespace", "10.0.1.0/28"),
            ("allow-share-default", "maybe"),
        ]);
        let fields: Vec<&str> = c.warnings.iter().map(|w| w.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "data.allow-share-default",
                "data.cidr-Not_A_Namespace",
                "data.interface-default",
                "data.kubevip-services",
                "data.search-order",
            ]
        );
        assert_eq!(c.pools.len(), 1);
        assert!(!pool(&c, "cidr-default").resource.spec.allow_sharing, "a malformed allow-share reads as false");
    }

    #[test]
    fn kube_vip_allow_share_maps_to_pool_sharing_by_namespace_then_global() {
        let c = convert(&[
            ("allow-share-global", "true"),
            ("allow-share-plunder", "false"),
            ("allow-share-lonely", "false"),
            ("cidr-default", "192.168.0.200/29"),
            ("cidr-plunder", "192.168.0.210/29"),
            ("cidr-global", "192.168.0.220/29"),
        ]);
        assert!(pool(&c, "cidr-default").resource.spec.allow_sharing);
        assert!(!pool(&c, "cidr-plunder").resource.spec.allow_sharing);
        assert!(pool(&c, "cidr-global").resource.spec.allow_sharing);
        let shared = &pool(&c, "cidr-default").warnings;
        assert!(shared.iter().any(|w| w.lost.contains("ccm.rs/allow-shared-ip")), "{shared:?}");
        assert!(pool(&c, "cidr-plunder").warnings.is_empty());
        let fields: Vec<&str> = c.warnings.iter().map(|w| w.field.as_str()).collect();
        assert_eq!(fields, ["data.allow-share-lonely"], "its Services use the global pools");
    }

    #[test]
    fn kube_vip_configmaps_and_values_are_bounded() {
        let many: Vec<(String, String)> =
            (0..=MAX_KEYS).map(|i| (format!("cidr-n{i}"), "10.0.0.0/30".into())).collect();
        let err = from_configmap(&meta(), &many.into_iter().collect()).unwrap_err();
        assert!(matches!(err, ImportError::TooLarge { max: MAX_KEYS, .. }), "{err}");
        let entries: Vec<String> = (0..=MAX_POOL_ENTRIES).map(|i| format!("10.0.{i}.0/30")).collect();
        let c = convert(&[("cidr-a", &entries.join(","))]);
        let e = c.pools[0].result.clone().unwrap_err();
        assert!(matches!(&e, ImportError::TooLarge { field, max: 64, .. } if field == "data.cidr-a"), "{e}");
        let long = format!("{}/24", "1".repeat(MAX_ENTRY_LENGTH));
        let e = convert(&[("cidr-a", &long)]).pools[0].result.clone().unwrap_err();
        assert!(matches!(&e, ImportError::TooLarge { field, .. } if field == "data.cidr-a[0]"), "{e}");
        let huge = "1".repeat(MAX_VALUE_LENGTH + 1);
        let e = convert(&[("range-a", &huge)]).pools[0].result.clone().unwrap_err();
        assert!(matches!(&e, ImportError::TooLarge { field, .. } if field == "data.range-a"), "{e}");
        let key = format!("x{}", "k".repeat(300));
        let w = convert(&[(key.as_str(), "1")]).warnings;
        assert_eq!(w[0].field.len(), "data.".len() + QUOTED_KEY, "a warning quotes a bounded key");
    }
}
