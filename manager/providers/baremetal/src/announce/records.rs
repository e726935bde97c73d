//! What an L2 announcer records of its announcements (pure): one `ServiceAnnouncement` per
//! Service and answering node, naming the node, the addresses and since when, and the writes
//! that bring the records in the announcers' namespace there. The writes are
//! [`super::records_writer`]'s.
//!
//! Each node writes and deletes its own records; a node that stopped without deleting its
//! records (a crash, a power loss) leaves them to the first live announcer by name, which
//! deletes every record of a node whose Lease is gone, so the records name only answering nodes.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use crds::announcement::{AnnouncedAddress, AnnouncedService, AnnouncementProtocol, ServiceAnnouncementSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use ring::digest::{SHA256, digest};

use super::assign::{Announced, ServiceName};

/// The longest object name.
const MAX_NAME: usize = 253;

/// An address this node answers for: the Services listing it and since when.
#[derive(Debug, Clone, PartialEq)]
pub struct Held {
    /// Every announced Service whose status lists the address (several when they share it).
    pub services: Vec<ServiceName>,
    /// When this node started answering for it.
    pub since: MicroTime,
}

/// What the record writer works from: this node's records as they should be, and the
/// announcers alive now (records of any other node are stale).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RecordsView {
    /// Record name to record.
    pub desired: BTreeMap<String, ServiceAnnouncementSpec>,
    /// The announcers whose Leases are alive (this one included while it is healthy).
    pub live: BTreeSet<String>,
}

/// One write to the records.
#[derive(Debug, Clone, PartialEq)]
pub enum Write {
    /// Create or replace a record of this node.
    Apply(String, ServiceAnnouncementSpec),
    /// Delete a record: this node's, no longer answering, or a gone node's.
    Delete(String),
}

/// The name of `node`'s record for `service`: `<node>.<namespace>.<name>` (Service and
/// namespace names hold no dot, so names never collide), or `l2-` and a digest when that would
/// pass the 253-character limit of object names.
pub fn record_name(node: &str, service: &AnnouncedService) -> String {
    let name = format!("{node}.{}.{}", service.namespace, service.name);
    if name.len() <= MAX_NAME {
        return name;
    }
    let key = format!("{node}/{}/{}", service.namespace, service.name);
    let hash = digest(&SHA256, key.as_bytes());
    let hex: String = hash.as_ref()[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!("l2-{hex}")
}

/// The Services listing each of `owned`'s addresses, with since when this node answers for it
/// (`since`; an address missing there counts from `now`).
pub fn held(
    owned: &BTreeMap<IpAddr, ServiceName>,
    announced: &BTreeMap<ServiceName, Announced>,
    since: &BTreeMap<IpAddr, MicroTime>,
    now: &MicroTime,
) -> BTreeMap<IpAddr, Held> {
    let mut out: BTreeMap<IpAddr, Held> = owned
        .iter()
        .map(|(address, first)| {
            let since = since.get(address).cloned().unwrap_or_else(|| now.clone());
            (*address, Held { services: vec![first.clone()], since })
        })
        .collect();
    for (service, a) in announced {
        for address in &a.addresses {
            if let Some(h) = out.get_mut(address)
                && !h.services.contains(service)
            {
                h.services.push(service.clone());
            }
        }
    }
    out
}

/// This node's records: one per Service, listing the addresses of it this node answers for.
pub fn desired(
    node: &str,
    held: &BTreeMap<IpAddr, Held>,
    interfaces: &[String],
    only_on: &BTreeMap<IpAddr, BTreeSet<String>>,
) -> BTreeMap<String, ServiceAnnouncementSpec> {
    let mut per_service: BTreeMap<&ServiceName, Vec<(IpAddr, AnnouncedAddress)>> = BTreeMap::new();
    for (address, h) in held {
        let protocol = if address.is_ipv4() { AnnouncementProtocol::Arp } else { AnnouncementProtocol::Ndp };
        for service in &h.services {
            let announced = AnnouncedAddress { address: address.to_string(), protocol, since: h.since.clone() };
            per_service.entry(service).or_default().push((*address, announced));
        }
    }
    per_service
        .into_iter()
        .filter_map(|(service, held)| {
            let (namespace, name) = service.split_once('/')?;
            let service = AnnouncedService { namespace: namespace.to_string(), name: name.to_string() };
            let since = held.iter().map(|(_, a)| a.since.clone()).min()?;
            // The interfaces some address of the Service is answered on (its pool's, if it
            // names some).
            let answered =
                |i: &&String| held.iter().any(|(ip, _)| only_on.get(ip).is_none_or(|names| names.contains(i.as_str())));
            let interfaces = interfaces.iter().filter(answered).cloned().collect();
            let addresses = held.into_iter().map(|(_, a)| a).collect();
            let spec = ServiceAnnouncementSpec { node: node.to_string(), service, since, addresses, interfaces };
            Some((record_name(node, &spec.service), spec))
        })
        .collect()
}

/// The writes that bring `existing` (record name to record) to `view` for `node`: its own
/// records applied where missing or different and deleted where no longer desired; and, when
/// `node` is the first live announcer by name, every record of a node that is not live.
pub fn plan(node: &str, view: &RecordsView, existing: &BTreeMap<String, ServiceAnnouncementSpec>) -> Vec<Write> {
    let mut writes: Vec<Write> = view
        .desired
        .iter()
        .filter(|(name, spec)| existing.get(*name) != Some(spec))
        .map(|(name, spec)| Write::Apply(name.clone(), spec.clone()))
        .collect();
    let janitor = view.live.first().is_some_and(|first| first == node);
    for (name, spec) in existing {
        let stale = if spec.node == node {
            !view.desired.contains_key(name)
        } else {
            janitor && !view.live.contains(&spec.node)
        };
        if stale {
            writes.push(Write::Delete(name.clone()));
        }
    }
    writes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> MicroTime {
        MicroTime(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap())
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn announced(addresses: &[&str]) -> Announced {
        Announced { addresses: addresses.iter().map(|a| ip(a)).collect(), local: false, ..Default::default() }
    }

    fn view(node: &str, owned: &[(&str, &str, i64)], live: &[&str]) -> RecordsView {
        let held =
            owned.iter().map(|(a, s, t)| (ip(a), Held { services: vec![s.to_string()], since: at(*t) })).collect();
        RecordsView {
            desired: desired(node, &held, &["eth0".into()], &BTreeMap::new()),
            live: live.iter().map(|n| n.to_string()).collect(),
        }
    }

    #[test]
    fn a_record_per_service_names_the_node_each_address_its_protocol_and_since_when() {
        let v = view(
            "w1",
            &[
                ("192.0.2.10", "default/web", 100),
                ("2001:db8::10", "default/web", 160),
                ("192.0.2.11", "shop/api", 120),
            ],
            &["w1"],
        );
        assert_eq!(v.desired.keys().collect::<Vec<_>>(), ["w1.default.web", "w1.shop.api"]);
        let web = &v.desired["w1.default.web"];
        assert_eq!(web.node, "w1");
        assert_eq!(web.service, AnnouncedService { namespace: "default".into(), name: "web".into() });
        assert_eq!(web.since, at(100), "the earliest address");
        let got: Vec<(&str, AnnouncementProtocol, &MicroTime)> =
            web.addresses.iter().map(|a| (a.address.as_str(), a.protocol, &a.since)).collect();
        assert_eq!(
            got,
            [
                ("192.0.2.10", AnnouncementProtocol::Arp, &at(100)),
                ("2001:db8::10", AnnouncementProtocol::Ndp, &at(160))
            ]
        );
        assert_eq!(web.interfaces, ["eth0"]);
    }

    #[test]
    fn services_sharing_an_address_each_get_a_record() {
        let owned = BTreeMap::from([(ip("192.0.2.10"), "a/dns-tcp".to_string())]);
        let services = BTreeMap::from([
            ("a/dns-tcp".to_string(), announced(&["192.0.2.10"])),
            ("a/dns-udp".to_string(), announced(&["192.0.2.10"])),
            ("a/other".to_string(), announced(&["192.0.2.99"])),
        ]);
        let since = BTreeMap::from([(ip("192.0.2.10"), at(5))]);
        let held = held(&owned, &services, &since, &at(50));
        assert_eq!(held[&ip("192.0.2.10")].services, ["a/dns-tcp", "a/dns-udp"]);
        assert_eq!(held[&ip("192.0.2.10")].since, at(5));
        let records = desired("n", &held, &[], &BTreeMap::new());
        assert_eq!(records.keys().collect::<Vec<_>>(), ["n.a.dns-tcp", "n.a.dns-udp"]);
        // An address without a recorded start counts from now.
        let held = super::held(&owned, &services, &BTreeMap::new(), &at(50));
        assert_eq!(held[&ip("192.0.2.10")].since, at(50));
    }

    #[test]
    fn a_record_names_only_the_interfaces_its_addresses_are_answered_on() {
        let owned =
            BTreeMap::from([(ip("192.0.2.10"), "a/web".to_string()), (ip("198.51.100.1"), "a/api".to_string())]);
        let services = BTreeMap::from([
            ("a/web".to_string(), announced(&["192.0.2.10"])),
            ("a/api".to_string(), announced(&["198.51.100.1"])),
        ]);
        let held = held(&owned, &services, &BTreeMap::new(), &at(1));
        let only_on = BTreeMap::from([(ip("192.0.2.10"), BTreeSet::from(["eth1".to_string()]))]);
        let records = desired("n", &held, &["eth0".into(), "eth1".into()], &only_on);
        assert_eq!(records["n.a.web"].interfaces, ["eth1"], "its pool answers on eth1 only");
        assert_eq!(records["n.a.api"].interfaces, ["eth0", "eth1"], "no pool interfaces: every one");
    }

    #[test]
    fn names_stay_within_the_object_name_limit_and_differ_per_node_and_service() {
        let svc = AnnouncedService { namespace: "default".into(), name: "web".into() };
        assert_eq!(record_name("worker-1", &svc), "worker-1.default.web");
        let long = "n".repeat(250);
        let a = record_name(&long, &svc);
        assert!(a.len() <= 253 && a.starts_with("l2-"), "{a}");
        let other = AnnouncedService { namespace: "default".into(), name: "api".into() };
        assert_ne!(a, record_name(&long, &other));
        assert_ne!(a, record_name(&"m".repeat(250), &svc));
    }

    #[test]
    fn only_missing_or_changed_records_are_written_and_unwanted_own_ones_deleted() {
        let v = view("w1", &[("192.0.2.10", "default/web", 100), ("192.0.2.11", "shop/api", 120)], &["w1", "w2"]);
        // Nothing there yet: both applied.
        let writes = plan("w1", &v, &BTreeMap::new());
        assert_eq!(writes.len(), 2);
        assert!(writes.iter().all(|w| matches!(w, Write::Apply(..))));
        // Both there as desired: nothing to do (no write loop on the watch of its own writes).
        assert_eq!(plan("w1", &v, &v.desired), []);
        // One changed (the address moved in later), one gone from the desired set.
        let mut existing = v.desired.clone();
        existing.get_mut("w1.default.web").unwrap().since = at(1);
        existing.insert(
            "w1.default.old".into(),
            view("w1", &[("192.0.2.12", "default/old", 90)], &[]).desired["w1.default.old"].clone(),
        );
        let writes = plan("w1", &v, &existing);
        assert_eq!(
            writes,
            [
                Write::Apply("w1.default.web".into(), v.desired["w1.default.web"].clone()),
                Write::Delete("w1.default.old".into())
            ]
        );
    }

    #[test]
    fn a_gone_nodes_records_are_deleted_by_the_first_live_announcer_only() {
        let gone = view("w9", &[("192.0.2.10", "default/web", 100)], &[]).desired;
        let live_other = view("w2", &[("192.0.2.11", "default/api", 100)], &[]).desired;
        let existing: BTreeMap<_, _> = gone.clone().into_iter().chain(live_other).collect();
        // w1 is first by name among the live: it deletes w9's record, never w2's.
        let writes = plan("w1", &view("w1", &[], &["w1", "w2"]), &existing);
        assert_eq!(writes, [Write::Delete("w9.default.web".into())]);
        // w2 is not first: it leaves others' records alone.
        assert_eq!(plan("w2", &view("w2", &[("192.0.2.11", "default/api", 100)], &["w1", "w2"]), &existing), []);
        // An unhealthy node is not live and owns nothing: its own records go.
        let writes = plan("w2", &view("w2", &[], &["w1"]), &existing);
        assert_eq!(writes, [Write::Delete("w2.default.api".into())]);
    }
}
