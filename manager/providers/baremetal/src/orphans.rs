//! The orphan report for the baremetal provider (S34, S35), pure: the cloud objects it owns are
//! the addresses its allocator holds, each for a Service. The allocator is rebuilt from the
//! Services at start, so an address outlives its Service only when a deletion was missed while
//! this manager ran (a finalizer removed by hand, a Service deleted while the controller was
//! off); the scan finds it and a sweep gives it back to its pool.

use std::net::IpAddr;

use ccm_framework::provider::OwnedObject;

use crate::ipam::ServiceKey;

/// The kind of object listed: an address held for a Service.
pub const ADDRESS: &str = "address";

/// One [`OwnedObject`] per held address, naming the Service (and UID) it is held for.
pub fn owned(assignments: &[(ServiceKey, Option<String>, Vec<IpAddr>)]) -> Vec<OwnedObject> {
    let mut out = Vec::new();
    for (key, uid, ips) in assignments {
        for ip in ips {
            let mut object = OwnedObject::new(ADDRESS, &ip.to_string(), Some(key.to_string()));
            object.service_uid = uid.clone();
            out.push(object);
        }
    }
    out
}

/// The holder to release for `object`: its Service's key when that key still holds the address
/// for the same object (UID) the scan saw; `None` when it is gone already or now held for
/// another Service of that name, which is not this orphan's to give back.
pub fn holder_to_release(
    assignments: &[(ServiceKey, Option<String>, Vec<IpAddr>)],
    object: &OwnedObject,
) -> Option<(ServiceKey, Option<String>)> {
    if object.kind != ADDRESS {
        return None;
    }
    let ip: IpAddr = object.id.parse().ok()?;
    let (namespace, name) = object.service.as_deref()?.split_once('/')?;
    assignments
        .iter()
        .find(|(key, uid, ips)| {
            key.namespace == namespace && key.name == name && *uid == object.service_uid && ips.contains(&ip)
        })
        .map(|(key, uid, _)| (key.clone(), uid.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> ServiceKey {
        ServiceKey { namespace: "web".into(), name: name.into() }
    }

    fn held() -> Vec<(ServiceKey, Option<String>, Vec<IpAddr>)> {
        vec![
            (key("a"), Some("uid-a".into()), vec!["192.0.2.1".parse().unwrap(), "2001:db8::1".parse().unwrap()]),
            (key("b"), None, vec!["192.0.2.2".parse().unwrap()]),
        ]
    }

    #[test]
    fn s34_every_held_address_is_listed_with_the_service_and_uid_it_is_held_for() {
        let listed = owned(&held());
        let ids: Vec<(&str, Option<&str>, Option<&str>)> =
            listed.iter().map(|o| (o.id.as_str(), o.service.as_deref(), o.service_uid.as_deref())).collect();
        assert_eq!(
            ids,
            [
                ("192.0.2.1", Some("web/a"), Some("uid-a")),
                ("2001:db8::1", Some("web/a"), Some("uid-a")),
                ("192.0.2.2", Some("web/b"), None)
            ]
        );
        assert!(listed.iter().all(|o| o.kind == ADDRESS));
    }

    #[test]
    fn s35_an_address_is_given_back_only_while_the_same_service_object_still_holds_it() {
        let listed = owned(&held());
        assert_eq!(holder_to_release(&held(), &listed[0]), Some((key("a"), Some("uid-a".into()))));
        // A Service of that name made again (another UID) holds it now: not this orphan's.
        let again = vec![(key("a"), Some("uid-new".into()), vec!["192.0.2.1".parse().unwrap()])];
        assert_eq!(holder_to_release(&again, &listed[0]), None);
        // Given back already, or held for another address now.
        assert_eq!(holder_to_release(&[], &listed[0]), None);
        let moved = vec![(key("a"), Some("uid-a".into()), vec!["192.0.2.9".parse().unwrap()])];
        assert_eq!(holder_to_release(&moved, &listed[0]), None);
        let mut other_kind = listed[0].clone();
        other_kind.kind = "load-balancer".into();
        assert_eq!(holder_to_release(&held(), &other_kind), None);
    }
}
