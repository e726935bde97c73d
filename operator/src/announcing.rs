//! The `Announcing` condition (pure): what the announcers' own Leases say of them, their health
//! mark (`ccm.rs/announcer-unhealthy`) and their BGP sessions (`ccm.rs/bgp-sessions`), summed up
//! for `kubectl describe ccm`. Only fresh Leases count: a stopped Node's announcer stops counting
//! once its Lease runs out.

use ccm_provider_baremetal::announce::announcer::{LEASE_LABEL, LEASE_LABEL_L2};
use ccm_provider_baremetal::announce::bgp_sessions::{SESSIONS_ANNOTATION, Session};
use ccm_provider_baremetal::announce::health::UNHEALTHY_ANNOTATION;
use crds::conditions::{DesiredCondition, Status, types};
use crds::reasons::announcing;
use k8s_openapi::api::coordination::v1::Lease;

/// The most Nodes (or sessions) a message names; the rest are counted.
pub const MAX_NAMED: usize = 10;
/// The longest part of a Lease annotation read into a message, in characters.
const MAX_TEXT: usize = 200;
/// The longest sessions annotation read, in bytes (16 peers with their errors fit in a quarter).
const MAX_SESSIONS_BYTES: usize = 16 * 1024;
/// The prefix of an announcer Lease's name, before the Node's.
const LEASE_PREFIX: &str = "l2-announcer-";

/// What one announcer's Lease says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnnouncerLease {
    /// Its Node.
    pub node: String,
    /// Renewed within its duration.
    pub fresh: bool,
    /// Why it gives its addresses up, when it does.
    pub unhealthy: Option<String>,
    /// Its BGP sessions (empty without BGP, or when the annotation does not parse).
    pub sessions: Vec<Session>,
}

impl AnnouncerLease {
    /// The announcer Lease `lease`, renewed in time or not (`fresh`), or `None` for any other.
    pub fn of(lease: &Lease, fresh: bool) -> Option<Self> {
        if !is_announcers(lease) {
            return None;
        }
        let name = lease.metadata.name.as_deref()?;
        let node = lease.spec.as_ref().and_then(|s| s.holder_identity.clone());
        let node = node.unwrap_or_else(|| name.strip_prefix(LEASE_PREFIX).unwrap_or(name).to_string());
        let annotations = lease.metadata.annotations.as_ref();
        let text = |key: &str| annotations.and_then(|a| a.get(key));
        let unhealthy = text(UNHEALTHY_ANNOTATION).map(|t| t.chars().take(MAX_TEXT).collect());
        // Whoever may write Leases here could write any size: bounded before parsing.
        let sessions = text(SESSIONS_ANNOTATION)
            .filter(|t| t.len() <= MAX_SESSIONS_BYTES)
            .and_then(|t| serde_json::from_str::<Vec<Session>>(t).ok())
            .unwrap_or_default();
        Some(Self { node, fresh, unhealthy, sessions })
    }
}

/// Whether `lease` is an announcer's (label `ccm.rs/announcer=l2`).
pub fn is_announcers(lease: &Lease) -> bool {
    let labels = lease.metadata.labels.as_ref();
    labels.and_then(|l| l.get(LEASE_LABEL)).map(String::as_str) == Some(LEASE_LABEL_L2)
}

/// `Announcing` for the announcers' Leases: False naming the unhealthy Nodes first, then the
/// sessions down; Unknown while no announcer is live; True otherwise, with the counts.
pub fn condition(leases: &[AnnouncerLease]) -> DesiredCondition {
    let mut live: Vec<&AnnouncerLease> = leases.iter().filter(|l| l.fresh).collect();
    live.sort_by(|a, b| a.node.cmp(&b.node));
    if live.is_empty() {
        return DesiredCondition::new(
            types::ANNOUNCING,
            Status::Unknown,
            announcing::AWAITING_ANNOUNCERS,
            "no announcer has a live Lease yet",
        );
    }
    let unhealthy: Vec<String> =
        live.iter().filter_map(|l| Some(format!("{}: {}", l.node, l.unhealthy.as_deref()?))).collect();
    if !unhealthy.is_empty() {
        let message =
            format!("{} of {} announcers give their addresses up: {}", unhealthy.len(), live.len(), named(&unhealthy));
        return DesiredCondition::new(types::ANNOUNCING, Status::False, announcing::ANNOUNCER_UNHEALTHY, message);
    }
    let sessions: Vec<(&str, &Session)> =
        live.iter().flat_map(|l| l.sessions.iter().map(|s| (l.node.as_str(), s))).collect();
    let down: Vec<String> = sessions
        .iter()
        .filter(|(_, s)| !s.established())
        .map(|(node, s)| {
            let detail: String = s.detail.chars().take(MAX_TEXT).collect();
            let state: String = s.state.chars().take(MAX_TEXT).collect();
            if detail.is_empty() {
                format!("{node} to {}: {state}", s.peer)
            } else {
                format!("{node} to {}: {state} ({detail})", s.peer)
            }
        })
        .collect();
    if !down.is_empty() {
        let message =
            format!("{} of {} BGP sessions are not established: {}", down.len(), sessions.len(), named(&down));
        return DesiredCondition::new(types::ANNOUNCING, Status::False, announcing::BGP_SESSION_DOWN, message);
    }
    let bgp =
        if sessions.is_empty() { String::new() } else { format!(", {} BGP sessions established", sessions.len()) };
    let message = format!("{} announcers live and healthy{bgp}", live.len());
    DesiredCondition::new(types::ANNOUNCING, Status::True, announcing::AS_EXPECTED, message)
}

/// The first [`MAX_NAMED`] entries joined, and how many more.
fn named(entries: &[String]) -> String {
    let shown = entries.iter().take(MAX_NAMED).cloned().collect::<Vec<_>>().join("; ");
    match entries.len().saturating_sub(MAX_NAMED) {
        0 => shown,
        more => format!("{shown}; and {more} more"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// An announcer's Lease; `renewed_secs_ago` past its 6 s makes it stale.
    fn lease(node: &str, renewed_secs_ago: i64, annotations: serde_json::Value) -> (Lease, bool) {
        let lease = serde_json::from_value(json!({
            "metadata": {"name": format!("l2-announcer-{node}"), "labels": {"ccm.rs/announcer": "l2"}, "annotations": annotations},
            "spec": {"holderIdentity": node, "leaseDurationSeconds": 6},
        }))
        .unwrap();
        (lease, renewed_secs_ago < 6)
    }

    fn read(leases: &[(Lease, bool)]) -> Vec<AnnouncerLease> {
        leases.iter().filter_map(|(l, fresh)| AnnouncerLease::of(l, *fresh)).collect()
    }

    fn sessions(states: &[(&str, &str, &str)]) -> String {
        let list: Vec<_> = states
            .iter()
            .map(|(peer, state, detail)| json!({"peer": peer, "state": state, "detail": detail}))
            .collect();
        serde_json::to_string(&list).unwrap()
    }

    #[test]
    fn healthy_announcers_with_established_sessions_are_announcing_and_an_expired_lease_does_not_count() {
        let up = sessions(&[("192.0.2.1", "Established", "")]);
        let leases = [
            lease("w1", 1, json!({SESSIONS_ANNOTATION: up})),
            lease("w2", 1, json!({SESSIONS_ANNOTATION: up})),
            // Powered off a minute ago: its marks no longer count.
            lease("w3", 60, json!({UNHEALTHY_ANNOTATION: "interface eth1 is down"})),
        ];
        let c = condition(&read(&leases));
        assert_eq!((c.status, c.reason.as_str()), (Status::True, announcing::AS_EXPECTED));
        assert_eq!(c.message, "2 announcers live and healthy, 2 BGP sessions established");
        let c = condition(&read(&[lease("w1", 1, json!({}))]));
        assert_eq!(c.message, "1 announcers live and healthy", "L2 only: no sessions");
        let c = condition(&read(&[lease("w3", 60, json!({}))]));
        assert_eq!((c.status, c.reason.as_str()), (Status::Unknown, announcing::AWAITING_ANNOUNCERS));
        let mut other = lease("w1", 1, json!({}));
        other.0.metadata.labels = None;
        assert!(read(&[other]).is_empty(), "a Lease without the announcer label is no announcer's");
    }

    #[test]
    fn an_unhealthy_announcer_comes_first_then_a_session_down_naming_node_peer_state_and_error() {
        let down =
            sessions(&[("192.0.2.1", "Active", "Socket: Connection refused"), ("2001:db8::1", "Established", "")]);
        let up = sessions(&[("192.0.2.1", "Established", ""), ("2001:db8::1", "Established", "")]);
        let both = [
            lease("w2", 1, json!({SESSIONS_ANNOTATION: down, UNHEALTHY_ANNOTATION: "interface eth1 is down"})),
            lease("w1", 1, json!({SESSIONS_ANNOTATION: up})),
        ];
        let c = condition(&read(&both));
        assert_eq!((c.status, c.reason.as_str()), (Status::False, announcing::ANNOUNCER_UNHEALTHY));
        assert_eq!(c.message, "1 of 2 announcers give their addresses up: w2: interface eth1 is down");
        let sessions_only =
            [lease("w2", 1, json!({SESSIONS_ANNOTATION: down})), lease("w1", 1, json!({SESSIONS_ANNOTATION: up}))];
        let c = condition(&read(&sessions_only));
        assert_eq!((c.status, c.reason.as_str()), (Status::False, announcing::BGP_SESSION_DOWN));
        assert_eq!(
            c.message,
            "1 of 4 BGP sessions are not established: w2 to 192.0.2.1: Active (Socket: Connection refused)"
        );
    }

    #[test]
    fn what_a_lease_carries_is_bounded_in_the_message() {
        let many: Vec<(Lease, bool)> =
            (0..15).map(|i| lease(&format!("w{i:02}"), 1, json!({UNHEALTHY_ANNOTATION: "x".repeat(5000)}))).collect();
        let c = condition(&read(&many));
        assert!(c.message.ends_with("; and 5 more"), "{}", c.message);
        assert!(c.message.len() < 15 * 260, "each mark cut to 200 characters: {}", c.message.len());
        let junk = lease("w1", 1, json!({SESSIONS_ANNOTATION: "not json"}));
        assert!(read(&[junk])[0].sessions.is_empty(), "an unreadable annotation is no session");
    }
}
