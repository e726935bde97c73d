//! The per-node announcer loop (I/O): holds this node's announcer Lease, watches the other
//! announcers' Leases, the Services and the Nodes, and publishes the addresses this node owns to
//! the responders ([`super::responder`]), with an event on each Service whose address it starts
//! announcing. Only addresses [`super::guard`] allows are ever owned or advertised: a pool's,
//! never a node's, a gateway or a special address; a refused one is reported (log, and an event
//! on the Service from the node that would have announced it), rate-limited. The decisions are
//! [`super::assign`]'s, [`super::elect`]'s and [`super::guard`]'s.
//!
//! A Lease per node rather than one leader: every announcer runs the same election over the
//! same live set, so a node that stops moves only its own addresses, and a graceful stop deletes
//! the Lease so the others take over at once instead of after the Lease expires.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, ObjectReference, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use ring::digest::{SHA256, digest};
use serde_json::json;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::assign::{self, Announced, LeaseView, Liveness, ServiceName, Stranded};
use super::bgp::Advertisement;
use super::bgp_sessions::{self, Change, Session, Tracker};
use super::guard::{self, Facts, Guard, Reports};
use super::health::{Health, UNHEALTHY_ANNOTATION};
use super::policy::{self, AddressPolicies};
use super::records::{self, RecordsView};
use super::reflect::reflect;
use super::remind::Reminder;
use ccm_framework::events::EventSink;

/// Label on every announcer Lease; the announcers watch Leases with it.
pub const LEASE_LABEL: &str = "ccm.rs/announcer";
/// Value of [`LEASE_LABEL`] for L2 announcers.
pub const LEASE_LABEL_L2: &str = "l2";
/// Field manager of the announcer's Lease writes.
pub const FIELD_MANAGER: &str = "ccm-l2-announcer";
/// The component named in the announcer's events.
pub const COMPONENT: &str = "ccm-l2-announcer";

/// The shortest time between two passes over the caches when they keep changing: a burst of
/// Service writes (a thousand created at once) costs one election pass per interval instead of
/// one per write, while a lone change (a failover) is acted on at once.
pub const MIN_PASS_INTERVAL: Duration = Duration::from_millis(50);

/// Timings and identity of one announcer.
#[derive(Debug, Clone)]
pub struct AnnouncerSettings {
    /// This node's name (the Pod's `spec.nodeName`, from the downward API).
    pub node: String,
    /// Where the announcer Leases live (the announcer's own namespace).
    pub namespace: String,
    /// The `loadBalancerClass` whose Services are announced (`None`: Services without one).
    pub class: Option<String>,
    /// How long a Lease counts without renewal: how long a crashed node's addresses stay
    /// unanswered at most.
    pub lease_duration: Duration,
    /// How often this node renews its Lease.
    pub renew_interval: Duration,
    /// How long an announcer (this one too) must have been alive before it takes part in
    /// elections, so that announcers see each other's Leases before claiming anything.
    pub settle: Duration,
    /// Where to publish what this node advertises by BGP ([`super::bgp::advertised`], and the
    /// pools' prefixes); `None` without BGP.
    pub bgp: Option<watch::Sender<Advertisement>>,
    /// What this announcer may announce: the pools, the inventory, this host's network
    /// ([`super::sources`] keeps it current). Nothing is announced while it is `None`.
    pub facts: watch::Receiver<Option<Arc<Facts>>>,
    /// Whether this node can deliver its addresses' traffic ([`super::health_probe::spawn`]);
    /// while it cannot, it owns and advertises nothing and its Lease says why.
    pub health: watch::Receiver<Health>,
    /// Whether to keep a `ServiceAnnouncement` per Service this node answers for
    /// ([`super::records`]): which node answers, for which addresses, since when.
    pub record: bool,
    /// The interfaces the responders answer on, named in the records.
    pub interfaces: Vec<String>,
    /// Where to publish, per owned address whose pool answers on some interfaces only, those
    /// interfaces ([`super::policy::answered_on`] filters each responder's addresses by it).
    pub l2_interfaces: Option<watch::Sender<BTreeMap<IpAddr, BTreeSet<String>>>>,
    /// This node's BGP sessions ([`super::bgp::bird::run`] publishes them): written into its
    /// Lease ([`super::bgp_sessions::SESSIONS_ANNOTATION`]), a lost one an event on the Node.
    pub bgp_sessions: watch::Receiver<Vec<Session>>,
}

impl AnnouncerSettings {
    /// Defaults: a 6 s Lease renewed every 2 s (a crashed node's addresses move within 6 s; a
    /// graceful stop moves them at once), and 2 s to settle; no facts, so nothing is announced
    /// until [`Self::facts`] is given a source ([`Self::with_facts`]).
    pub fn new(node: impl Into<String>, namespace: impl Into<String>) -> Self {
        Self {
            node: node.into(),
            namespace: namespace.into(),
            class: None,
            lease_duration: Duration::from_secs(6),
            renew_interval: Duration::from_secs(2),
            settle: Duration::from_secs(2),
            bgp: None,
            facts: watch::channel(None).1,
            health: watch::channel(Health::Healthy).1,
            record: false,
            interfaces: Vec::new(),
            l2_interfaces: None,
            bgp_sessions: watch::channel(Vec::new()).1,
        }
    }

    /// These settings announcing within fixed `facts` (tests, and callers that know the pools).
    pub fn with_facts(mut self, facts: Facts) -> Self {
        let (tx, rx) = watch::channel(Some(Arc::new(facts)));
        // The receiver keeps the value; a sender dropped only means it never changes.
        drop(tx);
        self.facts = rx;
        self
    }
}

/// Why the announcer stopped.
#[derive(Debug, thiserror::Error)]
pub enum AnnounceError {
    /// The settings cannot work.
    #[error("announcer settings: {0}")]
    Settings(&'static str),
    /// A watch the announcer needs ended before its first list.
    #[error("the {0} watch ended before its first list")]
    WatchEnded(&'static str),
}

/// The name of `node`'s announcer Lease: `l2-announcer-<node>`, or a digest of the node's name
/// when that would pass the 253-character limit of object names.
pub fn lease_name(node: &str) -> String {
    let name = format!("l2-announcer-{node}");
    if name.len() <= 253 {
        return name;
    }
    let hash = digest(&SHA256, node.as_bytes());
    let hex: String = hash.as_ref()[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!("l2-announcer-{hex}")
}

/// Run the announcer until `cancel`: on return this node's Lease is deleted (best effort) and
/// `owned` was last set to the empty set.
pub async fn run(
    client: kube::Client,
    settings: AnnouncerSettings,
    owned: watch::Sender<BTreeSet<IpAddr>>,
    events: Option<EventSink>,
    cancel: CancellationToken,
) -> Result<(), AnnounceError> {
    if settings.renew_interval.is_zero() || settings.renew_interval >= settings.lease_duration {
        return Err(AnnounceError::Settings("renew interval must be above zero and below the lease duration"));
    }
    let leases: Api<Lease> = Api::namespaced(client.clone(), &settings.namespace);
    let services: Api<Service> = Api::all(client.clone());
    let nodes: Api<Node> = Api::all(client.clone());
    let slices: Api<EndpointSlice> = Api::all(client.clone());
    let changed = Arc::new(Notify::new());
    forward_changes(settings.facts.clone(), changed.clone(), cancel.clone());
    forward_changes(settings.health.clone(), changed.clone(), cancel.clone());
    forward_changes(settings.bgp_sessions.clone(), changed.clone(), cancel.clone());
    let selector = format!("{LEASE_LABEL}={LEASE_LABEL_L2}");
    let lease_config = watcher::Config::default().labels(&selector);
    let lease_store = reflect(leases.clone(), lease_config, trim_lease, changed.clone(), &cancel);
    let service_store = reflect(services, watcher::Config::default(), trim_service, changed.clone(), &cancel);
    // Only Services with `externalTrafficPolicy: Local` need their endpoints' nodes.
    let slice_config = watcher::Config::default().labels(assign::SERVICE_NAME_LABEL);
    let slice_store = reflect(slices, slice_config, trim_slice, changed.clone(), &cancel);
    // Nodes' addresses are never announced, whatever a Service's status says.
    let node_store = reflect(nodes, watcher::Config::default(), trim_node, changed.clone(), &cancel);

    // Nothing is claimed from empty caches: that would answer for every address at start.
    let synced = async {
        lease_store.wait_until_ready().await.map_err(|_| AnnounceError::WatchEnded("Lease"))?;
        service_store.wait_until_ready().await.map_err(|_| AnnounceError::WatchEnded("Service"))?;
        node_store.wait_until_ready().await.map_err(|_| AnnounceError::WatchEnded("Node"))?;
        slice_store.wait_until_ready().await.map_err(|_| AnnounceError::WatchEnded("EndpointSlice"))
    };
    tokio::select! {
        _ = cancel.cancelled() => {
            owned.send_replace(BTreeSet::new());
            return Ok(());
        }
        result = synced => if let Err(e) = result {
            owned.send_replace(BTreeSet::new());
            return Err(e);
        },
    }
    let name = lease_name(&settings.node);
    // The records are written beside the loop, so a slow write never delays a failover.
    let records_stop = CancellationToken::new();
    let (records_tx, records_rx) = watch::channel(None);
    let records_task = settings.record.then(|| {
        let writer = super::records_writer::run(
            FIELD_MANAGER,
            client.clone(),
            settings.namespace.clone(),
            settings.node.clone(),
            records_rx,
            records_stop.clone(),
        );
        tokio::spawn(writer)
    });
    // Since when this node answers for each address it owns.
    let mut since: BTreeMap<IpAddr, MicroTime> = BTreeMap::new();
    let mut liveness = Liveness::default();
    let mut current: BTreeMap<IpAddr, ServiceName> = BTreeMap::new();
    let mut reports = Reports::default();
    let mut stranded_reports: Reminder<ServiceName, Stranded> = Reminder::default();
    let mut renew = tokio::time::interval(settings.renew_interval);
    renew.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_pass: Option<Instant> = None;
    // What the Lease says beyond its holder, as last written: why this node is unhealthy
    // (`None`: healthy) and its BGP sessions (`None`: no BGP).
    let mut written = LeaseNotes::default();
    let mut sessions = Tracker::default();
    loop {
        let expiry = liveness.next_change(Instant::now(), settings.settle);
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = renew.tick() => {
                if let Err(error) = renew_lease(&leases, &name, &settings, &written).await {
                    tracing::warn!(node = %settings.node, %error, "renewing the announcer Lease failed; retrying");
                }
            }
            _ = changed.notified() => {
                // Changes arriving meanwhile leave one permit: the next pass sees them all.
                if let Some(at) = last_pass.map(|t| t + MIN_PASS_INTERVAL).filter(|at| *at > Instant::now()) {
                    tokio::select! {
                        _ = cancel.cancelled() => break,
                        _ = tokio::time::sleep_until(at) => {}
                    }
                }
            }
            _ = sleep_until(expiry) => {}
        }
        // A change of health is written at once, so the others elect without this node (or
        // with it again) without waiting for the next renewal; so is a change of BGP sessions.
        let reason = settings.health.borrow().reason();
        let now_sessions = settings.bgp_sessions.borrow().clone();
        let notes = LeaseNotes { unhealthy: reason.clone(), bgp_sessions: bgp_sessions::annotation(&now_sessions) };
        if notes != written {
            match renew_lease(&leases, &name, &settings, &notes).await {
                Ok(_) => {
                    if notes.unhealthy != written.unhealthy {
                        report_health(&settings, reason.as_deref(), current.len(), &node_store, events.as_ref());
                    }
                    if notes.bgp_sessions != written.bgp_sessions {
                        report_sessions(&settings, &sessions.update(&now_sessions), &node_store, events.as_ref());
                    }
                    written = notes;
                }
                Err(error) => {
                    tracing::warn!(node = %settings.node, %error, "writing the announcer's health or BGP sessions into its Lease failed; retrying")
                }
            }
        }
        let now = Instant::now();
        last_pass = Some(now);
        let views: Vec<LeaseView> = lease_store.state().iter().filter_map(|l| LeaseView::of(l)).collect();
        liveness.observe(&views, now);
        let live = liveness.settled(now, settings.settle);
        let read: BTreeMap<ServiceName, Announced> = service_store
            .state()
            .iter()
            .filter_map(|s| {
                let name = format!("{}/{}", s.namespace().unwrap_or_default(), s.name_any());
                Some((name, Announced::of(s, settings.class.as_deref())?))
            })
            .collect();
        let facts = settings.facts.borrow().clone();
        let guard = facts.as_deref().map(|f| Guard::new(f, node_addresses(&node_store))).unwrap_or_default();
        let (announced, refused) = guard::screen(read, &guard);
        if facts.as_deref().is_some_and(|f| f.complete) {
            let due = reports.due(&refused, now, guard::REPORT_EVERY);
            report_refusals(&due, &refused, &settings, &live, &service_store, events.as_ref());
        }
        let ready = assign::ready_nodes(slice_store.state().iter().map(|s| s.as_ref()));
        let policies = match facts.as_deref() {
            Some(f) if !f.policies.is_empty() => policy::resolve(
                &f.policies,
                announced.values().flat_map(|a| a.addresses.iter().copied()),
                &node_labels(&node_store),
            ),
            _ => AddressPolicies::default(),
        };
        // Unhealthy: nothing owned, nothing advertised, whatever the Leases say.
        let healthy = reason.is_none();
        // One node per cluster (the first live by name) tells of addresses nobody may answer.
        if healthy && live.first() == Some(&settings.node) && facts.as_deref().is_some_and(|f| f.complete) {
            let found = assign::stranded(&announced, &ready, &live, &policies);
            let due = stranded_reports.due(
                found.into_iter().map(|s| (s.service.clone(), s)).collect(),
                now,
                guard::REPORT_EVERY,
            );
            report_stranded(&due, &settings, &service_store, events.as_ref());
        }
        let next =
            if healthy { assign::owned(&settings.node, &announced, &ready, &live, &policies) } else { BTreeMap::new() };
        if let Some(bgp) = &settings.bgp {
            let addresses = if healthy {
                super::bgp::advertised(&settings.node, &announced, &ready, &policies)
            } else {
                Default::default()
            };
            let set = Advertisement { addresses, prefixes: guard.prefixes(), routes: policies.routes() };
            crate::announce::publish::if_changed(bgp, set);
        }
        // Before the owned set: a responder never answers on an interface the pool leaves out.
        let only_on = policies.l2_interfaces();
        if let Some(tx) = &settings.l2_interfaces {
            crate::announce::publish::if_changed(tx, only_on.clone());
        }
        if next != current {
            // One event per Service naming every address gained (the sink folds repeats of a
            // Service's reason into one series, so one event per address would keep only the last).
            let mut gained: BTreeMap<&ServiceName, Vec<String>> = BTreeMap::new();
            for (address, service) in &next {
                if !current.contains_key(address) {
                    let how = if address.is_ipv4() { "ARP" } else { "NDP" };
                    gained.entry(service).or_default().push(format!("{address} ({how})"));
                }
            }
            for (service, addresses) in gained {
                let addresses = addresses.join(", ");
                tracing::info!(node = %settings.node, %service, %addresses, "announcing");
                if let Some(events) = &events
                    && let Some(reference) = service_reference(&service_store, service)
                {
                    events.publish(
                        COMPONENT,
                        reference,
                        EventType::Normal,
                        super::announce_reasons::L2_ANNOUNCING,
                        format!("node {} announces {addresses}", settings.node),
                        "Announce",
                    );
                }
            }
            let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
            since.retain(|address, _| next.contains_key(address));
            for address in next.keys() {
                since.entry(*address).or_insert_with(|| now.clone());
            }
            owned.send_replace(next.keys().copied().collect());
            current = next;
        }
        if settings.record {
            let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
            let held = records::held(&current, &announced, &since, &now);
            let view = RecordsView {
                desired: records::desired(&settings.node, &held, &settings.interfaces, &only_on),
                live: liveness.live(Instant::now()),
            };
            crate::announce::publish::if_changed(&records_tx, Some(view));
        }
    }
    owned.send_replace(BTreeSet::new());
    // Graceful stop: the others see the Lease go and take over at once.
    if let Err(error) = leases.delete(&name, &DeleteParams::default()).await {
        tracing::warn!(node = %settings.node, %error, "deleting the announcer Lease failed; it expires instead");
    }
    // Then this node's records (the writer deletes them within its stop budget).
    records_stop.cancel();
    if let Some(task) = records_task {
        let _ = task.await;
    }
    Ok(())
}

/// Log each `due` refusal and, for each Service with one, publish a Warning event naming every
/// address of it that is refused (`all`: the sink folds repeats of a Service's reason into one
/// series, so one event per address would keep only the last), from the node its first
/// refused address would be elected to (one node per cluster reports it).
fn report_refusals(
    due: &[guard::Refused],
    all: &[guard::Refused],
    settings: &AnnouncerSettings,
    live: &BTreeSet<String>,
    services: &Store<Service>,
    events: Option<&EventSink>,
) {
    let mut to_report: BTreeSet<&ServiceName> = BTreeSet::new();
    for refused in due {
        let (service, address, why) = (&refused.service, refused.address, refused.refusal);
        tracing::warn!(node = %settings.node, %service, %address, reason = why.as_str(), "not announcing an address of the Service's status: {why}");
        to_report.insert(service);
    }
    let Some(events) = events else { return };
    for service in to_report {
        let mine: Vec<&guard::Refused> = all.iter().filter(|r| &r.service == service).collect();
        let Some(first) = mine.first() else { continue };
        let reporter = super::elect::elect(first.address, live.iter().map(String::as_str));
        if reporter.unwrap_or(settings.node.as_str()) != settings.node {
            continue;
        }
        let Some(reference) = service_reference(services, service) else { continue };
        let each: Vec<String> = mine.iter().map(|r| format!("{} is not announced: {}", r.address, r.refusal)).collect();
        events.publish(
            COMPONENT,
            reference,
            EventType::Warning,
            super::announce_reasons::ANNOUNCEMENT_REFUSED,
            format!("{} (never answered by ARP or NDP, never advertised over BGP)", each.join("; ")),
            "Announce",
        );
    }
}

/// Log and publish a change of this node's health: a Warning `AnnouncerUnhealthy` naming why
/// it gives its `owned` addresses up, or a Normal `AnnouncerHealthy`, on its Node (none when
/// the Node is not in the cache).
fn report_health(
    settings: &AnnouncerSettings,
    reason: Option<&str>,
    owned: usize,
    nodes: &Store<Node>,
    events: Option<&EventSink>,
) {
    let (type_, why, note) = match reason {
        Some(reason) => {
            tracing::warn!(node = %settings.node, %reason, owned, "unhealthy: giving every address up until healthy again");
            let note = format!(
                "node {} gives up {owned} announced address(es) and takes part in no election: {reason}",
                settings.node
            );
            (EventType::Warning, super::announce_reasons::ANNOUNCER_UNHEALTHY, note)
        }
        None => {
            tracing::info!(node = %settings.node, "healthy again: taking part in elections");
            let note = format!("node {} is healthy again and takes part in elections", settings.node);
            (EventType::Normal, super::announce_reasons::ANNOUNCER_HEALTHY, note)
        }
    };
    let Some(events) = events else { return };
    let Some(node) = nodes.get(&reflector::ObjectRef::new(&settings.node)) else { return };
    events.publish(COMPONENT, node.object_ref(&()), type_, why, note, "Announce");
}

/// The most node names an event note lists.
const MAX_NAMED_NODES: usize = 10;

/// Log each `due` stranded Service and publish a Warning on it naming its addresses and the
/// nodes its ready endpoints run on.
fn report_stranded(
    due: &[Stranded],
    settings: &AnnouncerSettings,
    services: &Store<Service>,
    events: Option<&EventSink>,
) {
    for s in due {
        let addresses: Vec<String> = s.addresses.iter().map(ToString::to_string).collect();
        // Sorted already (a set's order).
        let nodes: Vec<&str> = s.endpoint_nodes.iter().take(MAX_NAMED_NODES).map(String::as_str).collect();
        let more = s.endpoint_nodes.len().saturating_sub(MAX_NAMED_NODES);
        let more = if more > 0 { format!(" and {more} more") } else { String::new() };
        let nodes = nodes.join(", ");
        tracing::warn!(node = %settings.node, service = %s.service, addresses = %addresses.join(", "), endpoint_nodes = %nodes, "no live announcer may answer for the Service's addresses");
        let Some(events) = events else { continue };
        let Some(reference) = service_reference(services, &s.service) else { continue };
        events.publish(
            COMPONENT,
            reference,
            EventType::Warning,
            super::announce_reasons::NO_ELIGIBLE_ANNOUNCER,
            format!(
                "{} not announced: externalTrafficPolicy is Local and the ready endpoints run on {nodes}{more}, where no live announcer may answer for them (spec.announcer.nodeSelector, the pool's advertisement.nodeSelector, or an unhealthy announcer)",
                addresses.join(", ")
            ),
            "Announce",
        );
    }
}

/// Log each lost or returned BGP session and publish it as an event on this node's Node.
fn report_sessions(settings: &AnnouncerSettings, changes: &[Change], nodes: &Store<Node>, events: Option<&EventSink>) {
    for change in changes {
        let (type_, why, note) = match change {
            Change::Lost(s) => {
                tracing::warn!(node = %settings.node, peer = %s.peer, state = %s.state, detail = %s.detail, "BGP session lost");
                let detail = if s.detail.is_empty() { String::new() } else { format!(": {}", s.detail) };
                let note = format!(
                    "node {}'s BGP session with {} is {} (was Established){detail}",
                    settings.node, s.peer, s.state
                );
                (EventType::Warning, super::announce_reasons::BGP_SESSION_LOST, note)
            }
            Change::Back(s) => {
                tracing::info!(node = %settings.node, peer = %s.peer, "BGP session established again");
                let note = format!("node {}'s BGP session with {} is Established again", settings.node, s.peer);
                (EventType::Normal, super::announce_reasons::BGP_SESSION_ESTABLISHED, note)
            }
        };
        let Some(events) = events else { continue };
        let Some(node) = nodes.get(&reflector::ObjectRef::new(&settings.node)) else { continue };
        events.publish(COMPONENT, node.object_ref(&()), type_, why, note, "Announce");
    }
}

/// Every Node's labels, for pools' node selectors.
fn node_labels(nodes: &Store<Node>) -> BTreeMap<String, BTreeMap<String, String>> {
    nodes.state().iter().map(|n| (n.name_any(), n.metadata.labels.clone().unwrap_or_default())).collect()
}

/// Every address the Nodes report.
fn node_addresses(nodes: &Store<Node>) -> Vec<IpAddr> {
    nodes
        .state()
        .iter()
        .filter_map(|n| n.status.as_ref()?.addresses.clone())
        .flatten()
        .filter_map(|a| a.address.parse().ok())
        .collect()
}

/// Notify `changed` whenever `facts` change, until `cancel` or their sender goes.
fn forward_changes<T: Send + Sync + 'static>(
    mut facts: watch::Receiver<T>,
    changed: Arc<Notify>,
    cancel: CancellationToken,
) {
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                result = facts.changed() => match result {
                    Ok(()) => changed.notify_one(),
                    Err(_) => return,
                },
            }
        }
    });
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at + Duration::from_millis(1)).await,
        None => std::future::pending().await,
    }
}

/// What an announcer's Lease says beyond its holder.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct LeaseNotes {
    /// Why the node is unhealthy ([`UNHEALTHY_ANNOTATION`]); `None` while healthy.
    unhealthy: Option<String>,
    /// Its BGP sessions ([`bgp_sessions::SESSIONS_ANNOTATION`]); `None` without BGP.
    bgp_sessions: Option<String>,
}

/// Apply this node's Lease, renewed now, with the annotations `notes` gives (applying without
/// one removes it: this field manager owns them).
async fn renew_lease(
    leases: &Api<Lease>,
    name: &str,
    settings: &AnnouncerSettings,
    notes: &LeaseNotes,
) -> Result<Lease, kube::Error> {
    let seconds = i32::try_from(settings.lease_duration.as_secs()).unwrap_or(i32::MAX);
    let mut metadata = json!({"name": name, "labels": {LEASE_LABEL: LEASE_LABEL_L2}});
    let mut annotations = serde_json::Map::new();
    if let Some(reason) = &notes.unhealthy {
        annotations.insert(UNHEALTHY_ANNOTATION.into(), json!(reason));
    }
    if let Some(text) = &notes.bgp_sessions {
        annotations.insert(bgp_sessions::SESSIONS_ANNOTATION.into(), json!(text));
    }
    if !annotations.is_empty() {
        metadata["annotations"] = serde_json::Value::Object(annotations);
    }
    let lease = json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": metadata,
        "spec": {
            "holderIdentity": settings.node,
            "leaseDurationSeconds": seconds,
            "renewTime": MicroTime(k8s_openapi::jiff::Timestamp::now()),
        },
    });
    leases.patch(name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&lease)).await
}

/// Only what the election and the event read is kept: the cache of every Service in the
/// cluster would otherwise hold their ports, selectors, annotations and managed fields.
pub fn trim_service(service: &mut Service) {
    let meta = &mut service.metadata;
    meta.managed_fields = None;
    // Of the annotations only the preferred nodes are read.
    meta.annotations = meta
        .annotations
        .take()
        .and_then(|mut a| a.remove(assign::PREFERRED_NODES_ANNOTATION))
        .map(|p| std::iter::once((assign::PREFERRED_NODES_ANNOTATION.to_string(), p)).collect());
    meta.labels = None;
    meta.owner_references = None;
    meta.finalizers = None;
    if let Some(spec) = service.spec.as_mut() {
        *spec = k8s_openapi::api::core::v1::ServiceSpec {
            type_: spec.type_.take(),
            load_balancer_class: spec.load_balancer_class.take(),
            external_traffic_policy: spec.external_traffic_policy.take(),
            ..Default::default()
        };
    }
    if let Some(status) = service.status.as_mut() {
        status.conditions = None;
    }
}

/// Nodes: their name, labels (pools' node selectors) and addresses.
pub fn trim_node(node: &mut Node) {
    node.metadata.managed_fields = None;
    node.metadata.annotations = None;
    node.metadata.owner_references = None;
    node.spec = None;
    if let Some(status) = node.status.as_mut() {
        *status = k8s_openapi::api::core::v1::NodeStatus { addresses: status.addresses.take(), ..Default::default() };
    }
}

/// EndpointSlices: the Service label, and each endpoint's node and readiness.
pub fn trim_slice(slice: &mut EndpointSlice) {
    slice.metadata.managed_fields = None;
    slice.metadata.annotations = None;
    slice.metadata.owner_references = None;
    slice.ports = None;
    for endpoint in &mut slice.endpoints {
        endpoint.addresses = Vec::new();
        endpoint.target_ref = None;
        endpoint.hints = None;
        endpoint.hostname = None;
        endpoint.zone = None;
        endpoint.deprecated_topology = None;
    }
}

fn trim_lease(lease: &mut Lease) {
    lease.metadata.managed_fields = None;
}

fn service_reference(store: &Store<Service>, service: &str) -> Option<ObjectReference> {
    let (namespace, name) = service.split_once('/')?;
    let found = store.get(&reflector::ObjectRef::new(name).within(namespace))?;
    Some(found.object_ref(&()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trimmed_caches_keep_what_the_election_and_the_event_read() {
        let service: Service = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "app", "uid": "u1", "resourceVersion": "7",
                         "annotations": {"big": "x".repeat(4096), assign::PREFERRED_NODES_ANNOTATION: "n2, n1"}, "labels": {"app": "web"},
                         "managedFields": [{"manager": "kubectl", "operation": "Apply"}]},
            "spec": {"type": "LoadBalancer", "loadBalancerClass": "ccm.rs/metal", "externalTrafficPolicy": "Local",
                     "selector": {"app": "web"}, "ports": [{"port": 80}], "clusterIP": "10.0.0.1"},
            "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.1", "ipMode": "VIP"}, {"ip": "192.0.2.2", "ipMode": "Proxy"}]}},
        }))
        .unwrap();
        let mut trimmed = service.clone();
        trim_service(&mut trimmed);
        assert_eq!(Announced::of(&trimmed, Some("ccm.rs/metal")), Announced::of(&service, Some("ccm.rs/metal")));
        assert!(Announced::of(&trimmed, Some("ccm.rs/metal")).is_some_and(|a| a.local));
        assert_eq!(trimmed.object_ref(&()), service.object_ref(&()), "the event's reference");
        let spec = trimmed.spec.as_ref().unwrap();
        assert!(Announced::of(&trimmed, Some("ccm.rs/metal")).is_some_and(|a| a.preferred == ["n2", "n1"]));
        assert!(spec.ports.is_none() && spec.selector.is_none());
        let kept: Vec<&String> = trimmed.metadata.annotations.iter().flat_map(|a| a.keys()).collect();
        assert_eq!(kept, [assign::PREFERRED_NODES_ANNOTATION], "only the annotation the election reads");
        assert!(trimmed.metadata.managed_fields.is_none());

        let slice: EndpointSlice = serde_json::from_value(json!({
            "metadata": {"name": "web-1", "namespace": "app", "labels": {assign::SERVICE_NAME_LABEL: "web"}},
            "addressType": "IPv4", "ports": [{"port": 8080}],
            "endpoints": [{"addresses": ["10.1.0.5"], "nodeName": "n1", "conditions": {"ready": true}},
                          {"addresses": ["10.1.0.6"], "nodeName": "n2", "conditions": {"ready": false}}],
        }))
        .unwrap();
        let mut small = slice.clone();
        trim_slice(&mut small);
        assert_eq!(assign::ready_nodes([&small]), assign::ready_nodes([&slice]));
        assert!(small.ports.is_none() && small.endpoints.iter().all(|e| e.addresses.is_empty()));
    }

    #[test]
    fn lease_names_stay_within_the_object_name_limit() {
        assert_eq!(lease_name("worker-1"), "l2-announcer-worker-1");
        let long = "n".repeat(253);
        let name = lease_name(&long);
        assert!(name.len() <= 253 && name.starts_with("l2-announcer-"), "{name}");
        assert_ne!(lease_name(&"m".repeat(253)), name);
    }
}
