//! BGP session state as data (pure): each peer's session read from BIRD's `show protocols`,
//! the annotation on the announcer's Lease that carries it, and the changes worth an event
//! (a session lost, a lost one back). The reading is [`super::bgp::bird::run`]'s, the writing the
//! announcer loop's.

use std::collections::BTreeSet;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use super::bgp::bird::Reply;
use super::bgp::protocol_name;

/// The annotation on the announcer's Lease listing its BGP sessions (JSON).
pub const SESSIONS_ANNOTATION: &str = "ccm.rs/bgp-sessions";
/// BIRD's reply code of one row of `show protocols`.
const PROTOCOL_ROW: u16 = 1002;
/// The BGP state of an established session.
pub const ESTABLISHED: &str = "Established";
/// The longest detail kept from BIRD's info column (its last error), in characters.
pub const MAX_DETAIL: usize = 200;
/// BGP's session states as BIRD names them in the info column.
const BGP_STATES: [&str; 7] = ["Idle", "Connect", "Active", "OpenSent", "OpenConfirm", "Established", "Close"];

/// One peer's session as this node's BIRD reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Session {
    /// The peer's address (`peers[].address`).
    pub peer: IpAddr,
    /// The BGP state: `Established`, `Active`, `Connect`, ...; `Down` when BIRD runs the protocol
    /// not at all, `Unknown` when its row is missing.
    pub state: String,
    /// Since when, as BIRD prints it (its `timeformat protocol`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub since: String,
    /// BIRD's last error for the session (`Socket: Connection refused`, `Received: Hold timer
    /// expired`), at most [`MAX_DETAIL`] characters.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
}

impl Session {
    /// Whether the session is up.
    pub fn established(&self) -> bool {
        self.state == ESTABLISHED
    }
}

/// A change worth telling: a session that was established is not any more, or is again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// The session was established and is not now.
    Lost(Session),
    /// The session was lost and is established again.
    Back(Session),
}

/// Each of `peers`' sessions from BIRD's answer to `show protocols` (rows
/// `name proto table state since info...`); a peer without a row is `Unknown`.
pub fn parse(reply: &Reply, peers: &[IpAddr]) -> Vec<Session> {
    peers
        .iter()
        .map(|peer| {
            let name = protocol_name(*peer);
            let row = reply.lines.iter().filter(|(code, _)| *code == PROTOCOL_ROW).find_map(|(_, line)| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                (fields.first() == Some(&name.as_str())).then_some(fields)
            });
            match row {
                Some(fields) => of_row(*peer, &fields),
                None => Session { peer: *peer, state: "Unknown".into(), since: String::new(), detail: String::new() },
            }
        })
        .collect()
}

fn of_row(peer: IpAddr, fields: &[&str]) -> Session {
    let protocol_state = fields.get(3).copied().unwrap_or_default();
    let rest = fields.get(4..).unwrap_or_default();
    // The since column is one token or two (a date and a time, with `iso long`): the BGP
    // state is the first known state word after the protocol state.
    let at = rest.iter().position(|f| BGP_STATES.contains(f));
    let (since, state, detail) = match at {
        Some(at) => (rest[..at].join(" "), rest[at].to_string(), rest[at + 1..].join(" ")),
        // A protocol BIRD has shut down (`down`) has no BGP state word.
        None => {
            (rest.join(" "), if protocol_state == "down" { "Down".into() } else { "Unknown".into() }, String::new())
        }
    };
    Session { peer, state, since, detail: detail.chars().take(MAX_DETAIL).collect() }
}

/// The Lease annotation for `sessions` (`None` without sessions: no BGP).
pub fn annotation(sessions: &[Session]) -> Option<String> {
    if sessions.is_empty() {
        return None;
    }
    serde_json::to_string(sessions).ok()
}

/// Tells lost sessions and their return from one reading to the next.
#[derive(Debug, Default)]
pub struct Tracker {
    /// The last reading.
    seen: Vec<Session>,
    /// Peers whose session was reported lost and is not back yet.
    lost: BTreeSet<IpAddr>,
}

impl Tracker {
    /// Take in a reading: a session established before and not now is lost; a lost one
    /// established again is back. A session coming up for the first time (a starting node) is
    /// no change, so nothing is told until something breaks.
    pub fn update(&mut self, now: &[Session]) -> Vec<Change> {
        let mut out = Vec::new();
        for session in now {
            let was_up = self.seen.iter().any(|s| s.peer == session.peer && s.established());
            if was_up && !session.established() {
                self.lost.insert(session.peer);
                out.push(Change::Lost(session.clone()));
            } else if session.established() && self.lost.remove(&session.peer) {
                out.push(Change::Back(session.clone()));
            }
        }
        self.lost.retain(|peer| now.iter().any(|s| s.peer == *peer));
        self.seen = now.to_vec();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `show protocols` as BIRD 2 answers it on the control socket (header 2002, rows 1002).
    fn reply() -> Reply {
        let lines = [
            (2002, "Name       Proto      Table      State  Since         Info"),
            (1002, "device1    Device     ---        up     16:01:02.345  "),
            (1002, "peer_192_0_2_1 BGP        ---        up     16:01:03.456  Established   "),
            (
                1002,
                "peer_2001_db8__1 BGP        ---        start  16:01:09.001  Active        Socket: Connection refused",
            ),
            (1002, "peer_192_0_2_9 BGP        ---        down   2026-12-02 10:00:00  "),
            (0, ""),
        ];
        Reply { code: 0, lines: lines.iter().map(|(c, l)| (*c, l.to_string())).collect() }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn each_peers_state_since_and_last_error_are_read_from_show_protocols() {
        let peers = [ip("192.0.2.1"), ip("2001:db8::1"), ip("192.0.2.9"), ip("192.0.2.77")];
        let sessions = parse(&reply(), &peers);
        let got: Vec<(&str, &str, &str)> =
            sessions.iter().map(|s| (s.state.as_str(), s.since.as_str(), s.detail.as_str())).collect();
        assert_eq!(
            got,
            [
                ("Established", "16:01:03.456", ""),
                ("Active", "16:01:09.001", "Socket: Connection refused"),
                ("Down", "2026-12-02 10:00:00", ""),
                ("Unknown", "", ""),
            ]
        );
        assert!(sessions[0].established() && !sessions[1].established());
    }

    #[test]
    fn the_annotation_is_json_per_peer_and_absent_without_bgp() {
        let sessions = parse(&reply(), &[ip("192.0.2.1"), ip("2001:db8::1")]);
        let text = annotation(&sessions).unwrap();
        assert_eq!(
            text,
            r#"[{"peer":"192.0.2.1","state":"Established","since":"16:01:03.456"},{"peer":"2001:db8::1","state":"Active","since":"16:01:09.001","detail":"Socket: Connection refused"}]"#
        );
        assert_eq!(annotation(&[]), None);
    }

    #[test]
    fn a_long_error_is_cut() {
        let row = format!("peer_192_0_2_1 BGP --- start 16:01:09 Active {}", "x".repeat(1000));
        let reply = Reply { code: 0, lines: vec![(1002, row)] };
        assert_eq!(parse(&reply, &[ip("192.0.2.1")])[0].detail.chars().count(), MAX_DETAIL);
    }

    #[test]
    fn only_a_lost_session_and_its_return_are_changes() {
        let session = |state: &str| Session {
            peer: ip("192.0.2.1"),
            state: state.into(),
            since: String::new(),
            detail: String::new(),
        };
        let mut tracker = Tracker::default();
        // A starting node's sessions coming up: nothing to tell.
        assert_eq!(tracker.update(&[session("Active")]), []);
        assert_eq!(tracker.update(&[session("Connect")]), []);
        assert_eq!(tracker.update(&[session("Established")]), []);
        assert_eq!(tracker.update(&[session("Established")]), []);
        // Lost once (not again while it stays down), then back.
        assert_eq!(tracker.update(&[session("Active")]), [Change::Lost(session("Active"))]);
        assert_eq!(tracker.update(&[session("Connect")]), []);
        assert_eq!(tracker.update(&[session("Established")]), [Change::Back(session("Established"))]);
        assert_eq!(tracker.update(&[session("Established")]), []);
    }
}
