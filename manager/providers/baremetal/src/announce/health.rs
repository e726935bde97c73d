//! Self-healing announcers (pure): whether this node can deliver the traffic of the addresses
//! it announces. An announcer whose L2 interface is down, whose responder stopped or is held
//! up ([`RESPONDER_STALL`]), or whose node's kube-proxy fails its health check gives its
//! addresses up and marks its Lease with why ([`UNHEALTHY_ANNOTATION`]); the other announcers
//! elect without it until it is healthy again. A Lease alone says only that the process runs,
//! not that it can answer (cilium#35507).
//!
//! The probes are I/O ([`super::health_probe`]); this module judges what they saw.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use serde::Deserialize;

use ccm_framework::safe_yaml::{DocumentError, FieldPath};

/// Annotation on an announcer's Lease while it is unhealthy: why, in words. Announcers do not
/// elect a node whose Lease carries it.
pub const UNHEALTHY_ANNOTATION: &str = "ccm.rs/announcer-unhealthy";

/// Longest reason written into the annotation and events (characters).
pub const MAX_REASON: usize = 1024;

/// How often the probes run unless `health.interval` says otherwise.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(1);

/// How long a running responder's loop may go without a pass before its node counts as
/// unhealthy: the loop passes at least every 250 ms, idle or not, so this is twelve missed
/// passes, and longer than any pause a busy node's scheduler makes.
pub const RESPONDER_STALL: Duration = Duration::from_secs(3);

/// Failed kube-proxy health checks in a row before the node counts as unhealthy (one slow
/// answer on a busy node must not move every address).
pub const KUBE_PROXY_FAILURES: u32 = 2;

/// The message of an interval out of bounds.
pub const BAD_INTERVAL: &str = "must be between 100ms and 60s";
/// The message of a kube-proxy health URL this announcer cannot probe.
pub const BAD_KUBE_PROXY_URL: &str = "must be http://<IP>:<port>/<path> with an IP literal or $(NODE_IP) (no DNS name) and a path of printable characters, at most 256 characters in all, for example http://127.0.0.1:10256/healthz";

/// Every fixed message [`HealthConfig::validate`] may raise, for the cloud-config's schema.
pub const MESSAGES: &[&str] = &[BAD_INTERVAL, BAD_KUBE_PROXY_URL];

/// `loadBalancer.announcement.health`: what an announcer checks before it answers for
/// addresses. Absent: interfaces and responders are checked every second, kube-proxy is not.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HealthConfig {
    /// How often the checks run (default 1s, 100ms to 60s).
    #[serde(default, deserialize_with = "crate::duration::optional")]
    pub interval: Option<Duration>,
    /// Whether an L2 interface that is down or has no carrier makes the node give its
    /// addresses up (default true).
    #[serde(default = "yes")]
    pub check_interfaces: bool,
    /// kube-proxy's health endpoint on this node (`http://127.0.0.1:10256/healthz` for
    /// kube-proxy's default, `http://$(NODE_IP):10256/healthz` when it listens on the node
    /// address); off when absent, as a cluster may run without kube-proxy.
    #[serde(default)]
    pub kube_proxy_healthz: Option<String>,
}

impl Default for HealthConfig {
    fn default() -> Self {
        Self { interval: None, check_interfaces: true, kube_proxy_healthz: None }
    }
}

fn yes() -> bool {
    true
}

/// `kubeProxyHealthz` uses [`NODE_IP_PLACEHOLDER`] and the announcer knows no node address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("loadBalancer.announcement.health.kubeProxyHealthz uses $(NODE_IP) but $NODE_IP holds no address")]
pub struct NeedsNodeIp;

/// A parsed kube-proxy health endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthzTarget {
    /// Where to connect.
    pub address: SocketAddr,
    /// The request path (starts with `/`).
    pub path: String,
}

impl fmt::Display for HealthzTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "http://{}{}", self.address, self.path)
    }
}

/// Stands for this node's address in `kubeProxyHealthz` (for a kube-proxy whose
/// `healthzBindAddress` is the node address): the announcer reads it from `$NODE_IP`.
pub const NODE_IP_PLACEHOLDER: &str = "$(NODE_IP)";

/// Parse `http://<IP>:<port>/<path>`, the IP possibly [`NODE_IP_PLACEHOLDER`] replaced by
/// `node_ip`; `None` for anything else, or for the placeholder without a node address (no
/// DNS: a name would make the check depend on the resolver it is meant to be independent of).
pub fn parse_healthz(url: &str, node_ip: Option<IpAddr>) -> Option<HealthzTarget> {
    if url.len() > 256 {
        return None;
    }
    let rest = url.strip_prefix("http://")?;
    let (authority, path) = match rest.find('/') {
        Some(at) => rest.split_at(at),
        None => (rest, "/"),
    };
    let address: SocketAddr = match authority.strip_prefix(NODE_IP_PLACEHOLDER) {
        Some(port) => SocketAddr::new(node_ip?, port.strip_prefix(':')?.parse().ok()?),
        None => authority.parse().ok()?,
    };
    if address.port() == 0 || !path.bytes().all(|b| b.is_ascii_graphic()) {
        return None;
    }
    Some(HealthzTarget { address, path: path.to_string() })
}

impl HealthConfig {
    /// The probe interval.
    pub fn interval(&self) -> Duration {
        self.interval.unwrap_or(DEFAULT_INTERVAL)
    }

    /// The kube-proxy endpoint, when configured, with [`NODE_IP_PLACEHOLDER`] replaced by
    /// `node_ip` (the URL was validated, so only a missing node address can fail).
    pub fn kube_proxy(&self, node_ip: Option<IpAddr>) -> Result<Option<HealthzTarget>, NeedsNodeIp> {
        match &self.kube_proxy_healthz {
            None => Ok(None),
            Some(url) => parse_healthz(url, node_ip).map(Some).ok_or(NeedsNodeIp),
        }
    }

    /// Check the section; `path` is `loadBalancer.announcement.health`.
    pub fn validate(&self, path: &FieldPath) -> Result<(), DocumentError> {
        if !(Duration::from_millis(100)..=Duration::from_secs(60)).contains(&self.interval()) {
            return Err(DocumentError::invalid(path.field("interval"), BAD_INTERVAL));
        }
        // Any address checks the placeholder's syntax; the node's own is known only at run time.
        let any = IpAddr::from([192, 0, 2, 1]);
        if let Some(url) = &self.kube_proxy_healthz
            && parse_healthz(url, Some(any)).is_none()
        {
            return Err(DocumentError::invalid(path.field("kubeProxyHealthz"), BAD_KUBE_PROXY_URL));
        }
        Ok(())
    }
}

/// An interface's state as the kernel reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkState {
    /// Administratively up with a carrier.
    Up,
    /// Administratively down (`ip link set ... down`).
    AdminDown,
    /// Up, but without a carrier (cable, switch port or peer down).
    NoCarrier,
    /// No such interface (any more).
    Missing,
}

impl LinkState {
    fn describe(self) -> &'static str {
        match self {
            LinkState::Up => "up",
            LinkState::AdminDown => "down",
            LinkState::NoCarrier => "up without a carrier",
            LinkState::Missing => "gone",
        }
    }
}

/// What one round of probes saw.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observation {
    /// Each checked L2 interface and its state.
    pub links: Vec<(String, LinkState)>,
    /// The interfaces whose responder has stopped.
    pub stopped_responders: Vec<String>,
    /// Each running responder's interface and how long since its loop last ran.
    pub responder_silence: Vec<(String, Duration)>,
    /// kube-proxy's health check: `None` when not configured, else its outcome (the error in
    /// words: "answered HTTP 503", "no answer within 1s").
    pub kube_proxy: Option<Result<(), String>>,
}

/// One reason an announcer cannot deliver its addresses' traffic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// An L2 interface is not up with a carrier.
    InterfaceDown {
        /// The interface.
        interface: String,
        /// What the kernel says.
        state: LinkState,
    },
    /// The responder on an interface has stopped: nobody answers ARP or NDP there.
    ResponderStopped {
        /// The interface.
        interface: String,
    },
    /// The responder on an interface runs but its loop has not run for [`RESPONDER_STALL`] or
    /// more: requests queue unread, and nobody answers them.
    ResponderStalled {
        /// The interface.
        interface: String,
        /// How long since the loop last ran.
        silent_for: Duration,
    },
    /// kube-proxy's health check failed [`KUBE_PROXY_FAILURES`] times in a row.
    KubeProxy {
        /// The last failure, in words.
        detail: String,
    },
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::InterfaceDown { interface, state } => write!(f, "interface {interface} is {}", state.describe()),
            Problem::ResponderStopped { interface } => write!(f, "the ARP/NDP responder on {interface} has stopped"),
            Problem::ResponderStalled { interface, silent_for } => write!(
                f,
                "the ARP/NDP responder on {interface} has not read a request for {:.1} s",
                silent_for.as_secs_f64()
            ),
            Problem::KubeProxy { detail } => {
                write!(f, "kube-proxy's health check failed {KUBE_PROXY_FAILURES} times in a row: {detail}")
            }
        }
    }
}

/// The verdict: healthy, or the problems (never empty).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Health {
    /// The node can deliver its addresses' traffic.
    #[default]
    Healthy,
    /// It cannot, for these reasons.
    Unhealthy(Vec<Problem>),
}

impl Health {
    /// Why the node is unhealthy, in one line of at most [`MAX_REASON`] characters; `None`
    /// when healthy.
    pub fn reason(&self) -> Option<String> {
        let Health::Unhealthy(problems) = self else { return None };
        let text = problems.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ");
        Some(bounded(&text))
    }

    /// Whether the node may announce.
    pub fn is_healthy(&self) -> bool {
        matches!(self, Health::Healthy)
    }
}

fn bounded(text: &str) -> String {
    if text.chars().count() <= MAX_REASON {
        return text.to_string();
    }
    let mut out: String = text.chars().take(MAX_REASON - 3).collect();
    out.push_str("...");
    out
}

/// Judges observations in turn; it remembers kube-proxy's failures in a row.
#[derive(Debug, Clone, Default)]
pub struct Judge {
    kube_proxy_failures: u32,
}

impl Judge {
    /// The verdict on `seen`. Interfaces and responders count at once (the kernel's flags, a
    /// finished task and a loop silent for [`RESPONDER_STALL`] are facts); kube-proxy after
    /// [`KUBE_PROXY_FAILURES`] failures in a row.
    pub fn judge(&mut self, seen: &Observation) -> Health {
        let mut problems: Vec<Problem> = seen
            .links
            .iter()
            .filter(|(_, state)| *state != LinkState::Up)
            .map(|(interface, state)| Problem::InterfaceDown { interface: interface.clone(), state: *state })
            .collect();
        problems.extend(
            seen.stopped_responders.iter().map(|interface| Problem::ResponderStopped { interface: interface.clone() }),
        );
        problems.extend(seen.responder_silence.iter().filter(|(_, silent_for)| *silent_for >= RESPONDER_STALL).map(
            |(interface, silent_for)| Problem::ResponderStalled {
                interface: interface.clone(),
                silent_for: *silent_for,
            },
        ));
        match &seen.kube_proxy {
            None | Some(Ok(())) => self.kube_proxy_failures = 0,
            Some(Err(detail)) => {
                self.kube_proxy_failures = self.kube_proxy_failures.saturating_add(1);
                if self.kube_proxy_failures >= KUBE_PROXY_FAILURES {
                    problems.push(Problem::KubeProxy { detail: detail.clone() });
                }
            }
        }
        if problems.is_empty() { Health::Healthy } else { Health::Unhealthy(problems) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn links(states: &[(&str, LinkState)]) -> Observation {
        Observation { links: states.iter().map(|(i, s)| (i.to_string(), *s)).collect(), ..Default::default() }
    }

    #[test]
    fn an_interface_down_or_without_carrier_or_gone_makes_the_node_unhealthy_at_once_naming_it() {
        let mut judge = Judge::default();
        assert_eq!(judge.judge(&links(&[("eth0", LinkState::Up), ("eth1", LinkState::Up)])), Health::Healthy);
        for (state, words) in [
            (LinkState::AdminDown, "interface eth1 is down"),
            (LinkState::NoCarrier, "interface eth1 is up without a carrier"),
            (LinkState::Missing, "interface eth1 is gone"),
        ] {
            let health = judge.judge(&links(&[("eth0", LinkState::Up), ("eth1", state)]));
            assert!(!health.is_healthy());
            assert_eq!(health.reason().as_deref(), Some(words));
        }
        assert!(judge.judge(&links(&[("eth0", LinkState::Up)])).is_healthy(), "back up: healthy again");
    }

    #[test]
    fn a_stopped_responder_makes_the_node_unhealthy() {
        let seen = Observation { stopped_responders: vec!["bond0".into()], ..Default::default() };
        let reason = Judge::default().judge(&seen).reason().unwrap();
        assert_eq!(reason, "the ARP/NDP responder on bond0 has stopped");
    }

    #[test]
    fn a_responder_whose_loop_has_not_run_for_the_stall_time_makes_the_node_unhealthy_until_it_runs_again() {
        let mut judge = Judge::default();
        let silent = |ms: u64| Observation {
            responder_silence: vec![
                ("eth0".into(), Duration::from_millis(250)),
                ("eth1".into(), Duration::from_millis(ms)),
            ],
            ..Default::default()
        };
        assert!(judge.judge(&silent(2_999)).is_healthy(), "just under the stall time");
        let health = judge.judge(&silent(3_240));
        assert_eq!(health.reason().as_deref(), Some("the ARP/NDP responder on eth1 has not read a request for 3.2 s"));
        assert!(judge.judge(&silent(100)).is_healthy(), "its loop ran again");
    }

    #[test]
    fn kube_proxy_counts_only_after_two_failures_in_a_row_and_a_success_resets_the_count() {
        let mut judge = Judge::default();
        let fail = Observation { kube_proxy: Some(Err("answered HTTP 503".into())), ..Default::default() };
        let ok = Observation { kube_proxy: Some(Ok(())), ..Default::default() };
        assert!(judge.judge(&fail).is_healthy(), "one failure is not enough");
        assert!(judge.judge(&ok).is_healthy());
        assert!(judge.judge(&fail).is_healthy(), "the success reset the count");
        let health = judge.judge(&fail);
        assert_eq!(
            health.reason().as_deref(),
            Some("kube-proxy's health check failed 2 times in a row: answered HTTP 503")
        );
        assert!(!judge.judge(&fail).is_healthy(), "stays unhealthy while it fails");
        assert!(judge.judge(&ok).is_healthy(), "one success makes it healthy");
        let off = Observation::default();
        assert!(judge.judge(&off).is_healthy(), "not configured: never a problem");
    }

    #[test]
    fn every_problem_is_named_and_the_reason_is_bounded() {
        let mut seen = links(&[("eth1", LinkState::AdminDown)]);
        seen.stopped_responders = vec!["eth1".into()];
        let reason = Judge::default().judge(&seen).reason().unwrap();
        assert_eq!(reason, "interface eth1 is down; the ARP/NDP responder on eth1 has stopped");
        let many: Vec<(String, LinkState)> = (0..200).map(|i| (format!("eth{i}"), LinkState::Missing)).collect();
        let reason = Judge::default().judge(&Observation { links: many, ..Default::default() }).reason().unwrap();
        assert_eq!(reason.chars().count(), MAX_REASON);
        assert!(reason.ends_with("..."));
    }

    #[test]
    fn kube_proxy_urls_are_ip_literals_with_a_port() {
        let target = parse_healthz("http://127.0.0.1:10256/healthz", None).unwrap();
        assert_eq!((target.address, target.path.as_str()), ("127.0.0.1:10256".parse().unwrap(), "/healthz"));
        assert_eq!(target.to_string(), "http://127.0.0.1:10256/healthz");
        assert_eq!(parse_healthz("http://[::1]:10256", None).unwrap().path, "/");
        // The node's own address, IPv4 or IPv6, from $NODE_IP; without it, no target.
        let node = "http://$(NODE_IP):10256/healthz";
        let v4 = parse_healthz(node, Some("198.19.0.2".parse().unwrap())).unwrap();
        assert_eq!(v4.to_string(), "http://198.19.0.2:10256/healthz");
        let v6 = parse_healthz(node, Some("fd00::2".parse().unwrap())).unwrap();
        assert_eq!(v6.to_string(), "http://[fd00::2]:10256/healthz");
        assert!(parse_healthz(node, None).is_none());
        assert!(parse_healthz("http://$(NODE_IP)/healthz", Some("198.19.0.2".parse().unwrap())).is_none());
        for bad in [
            "https://127.0.0.1:10256/healthz",
            "http://localhost:10256/healthz",
            "http://127.0.0.1/healthz",
            "http://127.0.0.1:0/healthz",
            "http://127.0.0.1:10256/health z",
            "127.0.0.1:10256",
        ] {
            assert!(parse_healthz(bad, None).is_none(), "{bad}");
        }
        assert!(parse_healthz(&format!("http://127.0.0.1:1/{}", "a".repeat(256)), None).is_none());
    }

    #[test]
    fn the_cloud_config_names_the_field_of_a_health_mistake_and_defaults_are_sensible() {
        let parse = |health: &str| {
            let doc =
                format!("loadBalancer:\n  announcement:\n    l2:\n      interfaces: [eth0]\n    health:\n{health}");
            crate::config::parse(doc.as_bytes()).map_err(|e| e.to_string())
        };
        let error = parse("      interval: 10ms\n").unwrap_err();
        assert!(error.contains("loadBalancer.announcement.health.interval") && error.contains(BAD_INTERVAL), "{error}");
        let error = parse("      kubeProxyHealthz: http://kube-proxy:10256/healthz\n").unwrap_err();
        assert!(error.contains("health.kubeProxyHealthz") && error.contains(BAD_KUBE_PROXY_URL), "{error}");
        let error = parse("      checkInterface: false\n").unwrap_err();
        assert!(error.contains("loadBalancer.announcement.health"), "{error}");
        let config = parse("      interval: 500ms\n      kubeProxyHealthz: http://127.0.0.1:10256/healthz\n").unwrap();
        let health = config.load_balancer.announcement.health.unwrap();
        assert_eq!(health.interval(), Duration::from_millis(500));
        assert!(health.check_interfaces, "interfaces are checked by default");
        assert_eq!(health.kube_proxy(None).unwrap().unwrap().to_string(), "http://127.0.0.1:10256/healthz");
        let default = HealthConfig::default();
        assert_eq!((default.interval(), default.check_interfaces), (DEFAULT_INTERVAL, true));
        assert_eq!(default.kube_proxy(None), Ok(None));
        let node = parse("      kubeProxyHealthz: http://$(NODE_IP):10256/healthz\n").unwrap();
        let node = node.load_balancer.announcement.health.unwrap();
        assert_eq!(node.kube_proxy(None), Err(NeedsNodeIp), "the placeholder needs $NODE_IP at run time");
    }
}
