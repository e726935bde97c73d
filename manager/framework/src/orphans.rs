//! The orphan report shared by the service controller, which scans (S34), and the status
//! reporter, which writes it to the CloudControllerManager's `status.orphans`: cloud objects
//! that carry this cluster's ownership and belong to no existing Service.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use crate::provider::OwnedObject;

/// The most orphans listed by name in the status; the counts cover every one.
pub const REPORT_LIMIT: usize = 20;

/// One scan's findings, as reported.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OrphanSummary {
    /// Whether the provider lists what it owns; `false`: nothing can be reported.
    pub supported: bool,
    /// Whether orphans are deleted (`--orphan-sweep`, never in shadow mode).
    pub sweep: bool,
    /// Orphans found by the last scan.
    pub total: usize,
    /// Orphans by kind (`load-balancer`, `target-group`, ...).
    pub counts: BTreeMap<String, usize>,
    /// The first orphans, sorted by kind and identity (at most [`REPORT_LIMIT`]).
    pub first: Vec<OwnedObject>,
    /// Orphans deleted since this manager started leading.
    pub deleted: u64,
    /// Deletions that failed since this manager started leading (retried on the next scan).
    pub failed: u64,
}

impl OrphanSummary {
    /// The summary of `orphans`, which need not be sorted.
    pub fn of(orphans: &[OwnedObject], supported: bool, sweep: bool) -> Self {
        let mut sorted: Vec<&OwnedObject> = orphans.iter().collect();
        sorted.sort();
        let mut counts = BTreeMap::new();
        for o in &sorted {
            *counts.entry(o.kind.clone()).or_insert(0) += 1;
        }
        Self {
            supported,
            sweep,
            total: orphans.len(),
            counts,
            first: sorted.into_iter().take(REPORT_LIMIT).cloned().collect(),
            deleted: 0,
            failed: 0,
        }
    }
}

/// The latest summary, shared; empty until the first scan.
#[derive(Debug, Clone, Default)]
pub struct OrphanRecord {
    latest: Arc<Mutex<Option<OrphanSummary>>>,
}

impl OrphanRecord {
    /// An empty record.
    pub fn new() -> Self {
        Self::default()
    }

    /// Replace the summary.
    pub fn set(&self, summary: OrphanSummary) {
        *self.latest.lock().unwrap_or_else(|e| e.into_inner()) = Some(summary);
    }

    /// Forget the summary (the scanning controller stopped).
    pub fn clear(&self) {
        *self.latest.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// The latest summary, `None` before the first scan.
    pub fn get(&self) -> Option<OrphanSummary> {
        self.latest.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// `status.orphans` for a summary.
pub fn report(summary: &OrphanSummary) -> crds::v1alpha1::OrphanReport {
    use crds::v1alpha1::{OrphanCount, OrphanObject, OrphanReport};
    let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
    OrphanReport {
        supported: summary.supported,
        sweep: summary.sweep,
        total: count(summary.total),
        counts: summary.counts.iter().map(|(kind, n)| OrphanCount { kind: kind.clone(), count: count(*n) }).collect(),
        objects: summary
            .first
            .iter()
            .map(|o| OrphanObject { kind: o.kind.clone(), id: o.id.clone(), service: o.service.clone() })
            .collect(),
        deleted: i64::try_from(summary.deleted).unwrap_or(i64::MAX),
        failed: i64::try_from(summary.failed).unwrap_or(i64::MAX),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(kind: &str, id: &str) -> OwnedObject {
        OwnedObject::new(kind, id, Some("ns/web".to_string()))
    }

    #[test]
    fn the_summary_counts_every_orphan_by_kind_and_lists_the_first_twenty_sorted() {
        let mut orphans: Vec<OwnedObject> =
            (0..30).rev().map(|i| object("target-group", &format!("tg-{i:02}"))).collect();
        orphans.push(object("load-balancer", "lb-1"));
        let s = OrphanSummary::of(&orphans, true, false);
        assert_eq!(s.total, 31);
        assert_eq!(s.counts["target-group"], 30);
        assert_eq!(s.counts["load-balancer"], 1);
        assert_eq!(s.first.len(), REPORT_LIMIT);
        assert_eq!(s.first[0].id, "lb-1", "sorted by kind, then identity");
        assert_eq!(s.first[1].id, "tg-00");
        let r = report(&s);
        assert_eq!((r.total, r.objects.len(), r.counts.len()), (31, REPORT_LIMIT, 2));
        assert_eq!(r.objects[0].service.as_deref(), Some("ns/web"));
    }

    #[test]
    fn the_record_is_empty_until_set_and_after_clear() {
        let r = OrphanRecord::new();
        assert_eq!(r.get(), None);
        r.set(OrphanSummary::of(&[], false, false));
        assert_eq!(r.clone().get().map(|s| s.supported), Some(false), "clones share the record");
        r.clear();
        assert_eq!(r.get(), None);
    }
}
