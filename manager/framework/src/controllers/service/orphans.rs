//! The orphan scan's pure decisions (S34, S35): which cloud objects the provider owns belong to
//! no existing Service, and which have been orphans long enough to be deleted. No I/O here.

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;

use crate::provider::OwnedObject;

/// Consecutive scans an object must be found orphaned in before a sweep deletes it: an object
/// caught between its load balancer's creation and its Service reaching the cache, or half-way
/// through a deletion, is never swept on one sighting.
pub const SWEEP_AFTER_SCANS: u32 = 2;

/// The most deletions one scan asks for; the rest wait for the next scan.
pub const MAX_DELETIONS_PER_SCAN: usize = 50;

/// Period between scans unless `--orphan-scan-period` says otherwise.
pub const DEFAULT_SCAN_PERIOD: Duration = Duration::from_secs(600);

/// Whether `object` belongs to no existing Service. `owner` is the Service its ownership names
/// (`None`: no such Service exists, or the object names none); `name_of` gives the provider's
/// load-balancer name for a Service. An object of an existing Service is an orphan only when it
/// belongs to an earlier object of that name: another UID, or another load-balancer name. A
/// Service that exists but wants no load balancer of this manager is not judged (another
/// manager may serve it), so its objects are never orphans here.
pub fn is_orphan(object: &OwnedObject, owner: Option<&Service>, name_of: impl Fn(&Service) -> String) -> bool {
    let Some(svc) = owner else { return true };
    if let Some(uid) = &object.service_uid
        && svc.metadata.uid.as_ref() != Some(uid)
    {
        return true;
    }
    object.load_balancer.as_ref().is_some_and(|name| *name != name_of(svc))
}

/// `namespace` and `name` of an object's Service, when it names one as `namespace/name`.
pub fn owner_key(object: &OwnedObject) -> Option<(&str, &str)> {
    object.service.as_deref().and_then(|k| k.split_once('/'))
}

/// How many scans in a row found each orphan.
#[derive(Debug, Default)]
pub struct Tracker {
    seen: HashMap<(String, String), u32>,
}

impl Tracker {
    /// Record one scan's orphans; returns those found in at least [`SWEEP_AFTER_SCANS`] scans in
    /// a row, at most [`MAX_DELETIONS_PER_SCAN`], sorted. Objects missing from this scan start
    /// over.
    pub fn observe(&mut self, orphans: &[OwnedObject]) -> Vec<OwnedObject> {
        let mut next = HashMap::with_capacity(orphans.len());
        let mut due = Vec::new();
        for o in orphans {
            let key = (o.kind.clone(), o.id.clone());
            let n = self.seen.get(&key).copied().unwrap_or(0).saturating_add(1);
            if n >= SWEEP_AFTER_SCANS {
                due.push(o.clone());
            }
            next.insert(key, n);
        }
        self.seen = next;
        due.sort();
        due.truncate(MAX_DELETIONS_PER_SCAN);
        due
    }

    /// Forget an object (deleted).
    pub fn forget(&mut self, object: &OwnedObject) {
        self.seen.remove(&(object.kind.clone(), object.id.clone()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::ObjectMeta;

    fn svc(uid: &str) -> Service {
        Service {
            metadata: ObjectMeta {
                namespace: Some("ns".into()),
                name: Some("web".into()),
                uid: Some(uid.into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn name_of(s: &Service) -> String {
        format!("lb-{}", s.metadata.uid.as_deref().unwrap_or_default())
    }

    #[test]
    fn s34_an_object_is_an_orphan_when_its_service_is_gone_or_is_another_object() {
        let plain = OwnedObject::new("target-group", "tg-1", Some("ns/web".into()));
        assert!(is_orphan(&plain, None, name_of), "no such Service");
        assert!(!is_orphan(&plain, Some(&svc("u1")), name_of), "its Service exists");
        let by_uid = OwnedObject { service_uid: Some("u0".into()), ..plain.clone() };
        assert!(is_orphan(&by_uid, Some(&svc("u1")), name_of), "an earlier Service of that name");
        assert!(!is_orphan(&by_uid, Some(&svc("u0")), name_of));
        let by_name = OwnedObject { load_balancer: Some("lb-u0".into()), ..plain.clone() };
        assert!(is_orphan(&by_name, Some(&svc("u1")), name_of), "the load balancer of an earlier UID");
        assert!(!is_orphan(&by_name, Some(&svc("u0")), name_of));
        let unnamed = OwnedObject::new("security-group", "sg-1", None);
        assert!(is_orphan(&unnamed, None, name_of), "owned, and no Service named at all");
        assert_eq!(owner_key(&plain), Some(("ns", "web")));
        assert_eq!(owner_key(&unnamed), None);
    }

    #[test]
    fn s35_an_orphan_is_due_for_deletion_only_after_two_scans_in_a_row() {
        let a = OwnedObject::new("load-balancer", "a", Some("ns/a".into()));
        let b = OwnedObject::new("load-balancer", "b", Some("ns/b".into()));
        let mut t = Tracker::default();
        assert!(t.observe(&[a.clone()]).is_empty(), "first sighting");
        assert_eq!(t.observe(&[a.clone(), b.clone()]), vec![a.clone()]);
        assert!(t.observe(&[b.clone()]).contains(&b), "b twice in a row");
        assert!(t.observe(&[a.clone()]).is_empty(), "a missed a scan: it starts over");
        t.forget(&a);
        assert!(t.observe(&[a.clone()]).is_empty(), "forgotten after its deletion");
        let many: Vec<OwnedObject> =
            (0..80).map(|i| OwnedObject::new("address", &format!("192.0.2.{i}"), None)).collect();
        t.observe(&many);
        assert_eq!(t.observe(&many).len(), MAX_DELETIONS_PER_SCAN);
    }
}
