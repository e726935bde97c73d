//! What this process knows of the cluster's ELBv2 objects, by owning Service.
//!
//! Filled by a tag scan of every load balancer and target group (once per process, then again
//! every [`RESCAN`]) and kept current by the process's own creates, finds and deletes. An ensure
//! then looks its objects up by name, by attachment and by ARN (a few calls) instead of scanning
//! every object of the account on every sync, which made the calls per Service grow with the
//! number of Services. The scan still finds what a crashed process left half-made, because a
//! new process scans before its first lookup.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often the tag scan is repeated, to learn objects made by someone else meanwhile.
pub const RESCAN: Duration = Duration::from_secs(3600);

/// The kind of an ELBv2 object in the ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A load balancer.
    LoadBalancer,
    /// A target group.
    TargetGroup,
}

/// The owner of an object: the cluster ID and the Service (`namespace/name`) its tags name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Owner {
    /// The cluster ID (`kubernetes.io/cluster/<id>`).
    pub cluster: String,
    /// The Service key (`kubernetes.io/service-name`).
    pub service: String,
}

impl Owner {
    /// The owner of an object with these tags, for every cluster tag among them.
    pub fn from_tags<'a>(
        tags: &'a BTreeMap<String, String>,
        cluster_prefix: &'a str,
        service_tag: &'a str,
    ) -> impl Iterator<Item = Owner> + 'a {
        let service = tags.get(service_tag);
        tags.keys().filter_map(move |k| {
            let cluster = k.strip_prefix(cluster_prefix)?;
            Some(Owner { cluster: cluster.to_string(), service: service?.clone() })
        })
    }
}

#[derive(Debug, Default)]
struct Inner {
    objects: HashMap<(Kind, Owner), BTreeSet<String>>,
    scanned_at: Option<Instant>,
}

/// ARNs of this cluster's ELBv2 objects by owner; shared by concurrent syncs.
#[derive(Debug, Default)]
pub struct Ledger {
    inner: Mutex<Inner>,
}

impl Ledger {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a tag scan is due at `now`: never done, or older than `every`.
    pub fn scan_due(&self, now: Instant, every: Duration) -> bool {
        self.lock().scanned_at.is_none_or(|at| now.saturating_duration_since(at) >= every)
    }

    /// Record a finished scan started at `started`. Its finds are [`Ledger::add`]ed: a scan adds,
    /// never removes, so an object created while it ran is not forgotten.
    pub fn scanned(&self, started: Instant) {
        self.lock().scanned_at = Some(started);
    }

    /// Remember `arn` as `owner`'s.
    pub fn add(&self, kind: Kind, owner: &Owner, arn: &str) {
        self.lock().objects.entry((kind, owner.clone())).or_default().insert(arn.to_string());
    }

    /// Forget `arn` (deleted, gone, or found not to be owned).
    pub fn remove(&self, kind: Kind, owner: &Owner, arn: &str) {
        let mut inner = self.lock();
        let key = (kind, owner.clone());
        if let Some(set) = inner.objects.get_mut(&key) {
            set.remove(arn);
            if set.is_empty() {
                inner.objects.remove(&key);
            }
        }
    }

    /// Forget `arn` for every owner (deleted, or found gone).
    pub fn forget(&self, kind: Kind, arn: &str) {
        self.lock().objects.retain(|(k, _), set| {
            if *k == kind {
                set.remove(arn);
            }
            !set.is_empty()
        });
    }

    /// The ARNs known as `owner`'s.
    pub fn get(&self, kind: Kind, owner: &Owner) -> BTreeSet<String> {
        self.lock().objects.get(&(kind, owner.clone())).cloned().unwrap_or_default()
    }

    /// How many objects are remembered, for every owner.
    pub fn len(&self) -> usize {
        self.lock().objects.values().map(BTreeSet::len).sum()
    }

    /// Whether nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(s: &str) -> Owner {
        Owner { cluster: "c1".into(), service: s.into() }
    }

    #[test]
    fn a_scan_is_due_first_and_again_after_the_period() {
        let l = Ledger::default();
        let t0 = Instant::now();
        assert!(l.scan_due(t0, RESCAN));
        l.scanned(t0);
        assert!(!l.scan_due(t0 + Duration::from_secs(10), RESCAN));
        assert!(l.scan_due(t0 + RESCAN, RESCAN));
    }

    #[test]
    fn objects_are_kept_per_kind_and_owner_and_forgotten_on_remove() {
        let l = Ledger::default();
        l.add(Kind::LoadBalancer, &owner("ns/a"), "lb-a");
        l.add(Kind::TargetGroup, &owner("ns/a"), "tg-a1");
        l.add(Kind::TargetGroup, &owner("ns/a"), "tg-a2");
        l.add(Kind::TargetGroup, &owner("ns/b"), "tg-b");
        assert_eq!(l.get(Kind::TargetGroup, &owner("ns/a")), BTreeSet::from(["tg-a1".into(), "tg-a2".into()]));
        assert_eq!(l.get(Kind::LoadBalancer, &owner("ns/b")), BTreeSet::new());
        l.remove(Kind::TargetGroup, &owner("ns/a"), "tg-a1");
        l.remove(Kind::LoadBalancer, &owner("ns/a"), "lb-a");
        assert_eq!(l.get(Kind::TargetGroup, &owner("ns/a")), BTreeSet::from(["tg-a2".into()]));
        assert_eq!(l.len(), 2, "emptied owners are dropped, the rest kept");
        l.add(Kind::TargetGroup, &Owner { cluster: "c2".into(), service: "ns/b".into() }, "tg-b");
        l.forget(Kind::TargetGroup, "tg-b");
        assert_eq!(l.len(), 1, "forgotten for every owner: {l:?}");
    }

    #[test]
    fn tags_name_one_owner_per_cluster_tag_and_none_without_a_service_tag() {
        let p = "kubernetes.io/cluster/";
        let s = "kubernetes.io/service-name";
        let tags = BTreeMap::from([
            (format!("{p}c1"), "owned".to_string()),
            (format!("{p}c2"), "shared".to_string()),
            (s.to_string(), "ns/web".to_string()),
            ("team".to_string(), "x".to_string()),
        ]);
        let owners: Vec<Owner> = Owner::from_tags(&tags, p, s).collect();
        assert_eq!(
            owners,
            vec![
                Owner { cluster: "c1".into(), service: "ns/web".into() },
                Owner { cluster: "c2".into(), service: "ns/web".into() },
            ]
        );
        let untagged = BTreeMap::from([(format!("{p}c1"), "owned".to_string())]);
        assert_eq!(Owner::from_tags(&untagged, p, s).count(), 0);
    }
}
