//! Pool usage as Prometheus gauges: addresses assigned and available per pool and IP family,
//! refreshed after every assignment, release and rebuild.

use std::collections::HashSet;
use std::sync::{Mutex, OnceLock};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family as MetricFamily;
use prometheus_client::metrics::gauge::Gauge;
use std::sync::atomic::AtomicU64;

use super::ipam::{Allocator, Family};
use ccm_framework::metrics::Metrics;

/// Labels of the pool gauges.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct PoolLabels {
    /// The pool's name.
    pub pool: String,
    /// `IPv4` or `IPv6`.
    pub family: String,
}

/// A float gauge: an IPv6 pool holds far more addresses than an `i64`.
type Count = Gauge<f64, AtomicU64>;

/// The gauge families, once the manager's registry is known.
#[derive(Debug, Default)]
pub struct PoolGauges {
    families: OnceLock<(MetricFamily<PoolLabels, Count>, MetricFamily<PoolLabels, Count>)>,
    /// The series set last time, so a pool removed by a reload loses its series.
    shown: Mutex<HashSet<PoolLabels>>,
}

/// One pool's usage in one family.
#[derive(Debug, Clone, PartialEq)]
pub struct FamilyUsage {
    /// The pool.
    pub pool: String,
    /// `IPv4` or `IPv6`.
    pub family: &'static str,
    /// Addresses assigned (a shared address counts once).
    pub assigned: usize,
    /// Addresses still free.
    pub available: u128,
}

/// Usage per pool and family, for the families each pool has blocks in.
pub fn usage_by_family(allocator: &Allocator) -> Vec<FamilyUsage> {
    let mut out = Vec::new();
    for pool in allocator.pools().iter() {
        for (family, label) in [(Family::V4, "IPv4"), (Family::V6, "IPv6")] {
            let blocks: Vec<_> = pool.blocks.iter().filter(|b| b.family() == family).collect();
            if blocks.is_empty() {
                continue;
            }
            let assigned: usize = blocks.iter().map(|b| allocator.in_use_in(b)).sum();
            let usable = blocks.iter().fold(0u128, |sum, b| sum.saturating_add(b.usable(pool.avoid_buggy_ips)));
            out.push(FamilyUsage {
                pool: pool.name.clone(),
                family: label,
                assigned,
                available: usable.saturating_sub(assigned as u128),
            });
        }
    }
    out
}

/// Most pools [`describe`] names; the rest are counted (condition messages stay short).
const DESCRIBED_POOLS: usize = 16;

/// Per-pool usage for the `ProviderHealthy` message, so `kubectl` shows it:
/// `: lan IPv4 3 assigned 251 free, lan IPv6 ...`; empty without pools.
pub fn describe(usage: &[FamilyUsage]) -> String {
    if usage.is_empty() {
        return String::new();
    }
    let parts: Vec<String> = usage
        .iter()
        .take(DESCRIBED_POOLS)
        .map(|u| format!("{} {} {} assigned {} free", u.pool, u.family, u.assigned, u.available))
        .collect();
    let mut text = format!(": {}", parts.join(", "));
    if usage.len() > DESCRIBED_POOLS {
        text.push_str(&format!(" and {} more", usage.len() - DESCRIBED_POOLS));
    }
    text
}

impl PoolGauges {
    /// Register the families in `registry` (idempotent: once per process).
    pub fn register(&self, registry: &Metrics) {
        self.families.get_or_init(|| {
            (
                registry.get_or_register(
                    "ccm_baremetal_pool_addresses_assigned",
                    "Load-balancer addresses assigned, per pool and IP family",
                    MetricFamily::default,
                ),
                registry.get_or_register(
                    "ccm_baremetal_pool_addresses_available",
                    "Load-balancer addresses still free, per pool and IP family",
                    MetricFamily::default,
                ),
            )
        });
    }

    /// Bring the gauges to the allocator's usage (nothing before [`Self::register`]); series
    /// of pools (or families) that are gone are removed.
    pub fn update(&self, allocator: &Allocator) {
        let Some((assigned, available)) = self.families.get() else { return };
        // Held throughout, so concurrent updates do not interleave their removals.
        let mut shown = self.shown.lock().unwrap_or_else(|e| e.into_inner());
        let mut now = HashSet::new();
        for usage in usage_by_family(allocator) {
            let labels = PoolLabels { pool: usage.pool, family: usage.family.to_string() };
            assigned.get_or_create(&labels).set(usage.assigned as f64);
            available.get_or_create(&labels).set(usage.available as f64);
            now.insert(labels);
        }
        for gone in shown.difference(&now) {
            assigned.remove(gone);
            available.remove(gone);
        }
        *shown = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BaremetalProvider, ipam};
    use k8s_openapi::api::core::v1::{Service, ServiceSpec};
    use kube::api::ObjectMeta;

    fn v6_service() -> Service {
        Service {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("default".into()),
                uid: Some("u1".into()),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                type_: Some("LoadBalancer".into()),
                ip_families: Some(vec!["IPv6".into()]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn usage_is_split_by_family_and_exported_as_gauges() {
        let config = "loadBalancer:\n  pools:\n    - name: dual\n      cidrs: [10.0.0.0/30, fd00::/126]\n";
        let provider = BaremetalProvider::from_cloud_config(Some(config.as_bytes())).unwrap();
        let allocator = provider.allocator();
        allocator.restore(&[]);
        let metrics = Metrics::new();
        let gauges = PoolGauges::default();
        gauges.register(&metrics);
        gauges.update(allocator);
        let text = metrics.encode();
        assert!(text.contains(r#"ccm_baremetal_pool_addresses_assigned{pool="dual",family="IPv6"} 0"#), "{text}");

        allocator.ensure(&ipam::request_for(&v6_service()).unwrap()).unwrap();
        gauges.update(allocator);
        let usage = usage_by_family(allocator);
        let v4 = usage.iter().find(|u| u.family == "IPv4").unwrap();
        let v6 = usage.iter().find(|u| u.family == "IPv6").unwrap();
        // fd00::/126 hands out three: fd00:: is its subnet-router anycast address.
        assert_eq!((v6.assigned, v6.available), (1, 2));
        assert_eq!(v4.assigned, 0);
        assert!(v4.available > 0 && v4.available <= 4, "{v4:?}");
        let text = metrics.encode();
        assert!(text.contains(r#"ccm_baremetal_pool_addresses_assigned{pool="dual",family="IPv6"} 1"#), "{text}");
        assert!(text.contains(r#"ccm_baremetal_pool_addresses_available{pool="dual",family="IPv6"} 2"#), "{text}");
        assert!(describe(&usage).contains("dual IPv6 1 assigned 2 free"), "{}", describe(&usage));
    }

    #[test]
    fn a_removed_pool_loses_its_series_and_an_added_one_gains_them() {
        let config = "loadBalancer:\n  pools:\n    - {name: old, cidrs: [10.0.0.0/30]}\n";
        let provider = BaremetalProvider::from_cloud_config(Some(config.as_bytes())).unwrap();
        let allocator = provider.allocator();
        allocator.restore(&[]);
        let metrics = Metrics::new();
        let gauges = PoolGauges::default();
        gauges.register(&metrics);
        gauges.update(allocator);
        assert!(metrics.encode().contains(r#"pool="old""#));

        let new = crate::config::build_pools(
            &crate::config::parse(b"loadBalancer:\n  pools:\n    - {name: new, cidrs: [10.1.0.0/30]}\n")
                .unwrap()
                .load_balancer,
        )
        .unwrap();
        allocator.replace_pools(new);
        gauges.update(allocator);
        let text = metrics.encode();
        assert!(!text.contains(r#"pool="old""#), "{text}");
        assert!(text.contains(r#"ccm_baremetal_pool_addresses_available{pool="new",family="IPv4"} 4"#), "{text}");
    }
}
