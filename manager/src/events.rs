//! Kubernetes Events, kept off the controllers' critical path.
//!
//! Controllers hand an event to [`EventSink::publish`], which never waits: a background task
//! writes events from a bounded pending queue ([`queue::PendingQueue`], pure). A repeat of a
//! pending event (same component, object and reason) folds into it and is written as one
//! events.k8s.io series (`series.count`), as Kubernetes aggregates repeats. When the queue is
//! full, a newer event of an object takes the place of that object's older pending one, or of
//! another object's superseded one; an object's latest event is never dropped for another
//! object's older event. Whatever is dropped is counted in `ccm_events_dropped_total{reason}`.
//!
//! Pace: one write in flight at a time, at most [`DEFAULT_RATE`] per second, backing off on
//! 429/5xx. The event client is the same user as the controllers' client, so API Priority and
//! Fairness puts its requests in the same flow: a single writer holds at most one of the
//! flow's seats and cannot crowd out the controllers' own writes, while the server's latency
//! (not a fixed 50/s) sets the drain rate. The rate cap only bounds the write rate against a
//! very fast server.

pub mod queue;

use std::collections::hash_map::RandomState;
use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event as K8sEvent, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::events::EventType;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use queue::{Admission, Pace, PendingQueue};

/// Events waiting to be written before older ones are superseded or new ones dropped: one
/// per object for 10,000 Services and 5,000 Nodes with room to spare. A pending event costs
/// about 0.9 KiB (measured: 14 MiB of RSS for 16,384 distinct pending Service events), and
/// the queue is only full while the API server takes events slower than they come.
pub const DEFAULT_QUEUE: usize = 16_384;
/// Largest queue [`EventSink::spawn_with`] accepts (bounds memory whatever is configured).
pub const MAX_QUEUE: usize = 65_536;
/// Events written per second at most. Writes go one at a time, so the server's latency paces
/// them first (about 2.4 ms per write on a genuine kube-apiserver here: ~420/s); the cap only
/// bounds the rate against a faster server.
pub const DEFAULT_RATE: u32 = 1000;
/// How long a written event is remembered so a repeat becomes a series update.
pub const SERIES_WINDOW: Duration = Duration::from_secs(6 * 60);
/// How many written events are remembered for series updates (bounds memory).
pub const SERIES_MEMORY: usize = 1024;
/// Writes of one event tried before it is dropped (`reason="write_failed"`).
pub const MAX_ATTEMPTS: u8 = 3;

/// The event as published (kube's `Event` minus its `secondary` reference, which is never set
/// here and would cost an inline ObjectReference per pending event).
struct Published {
    type_: EventType,
    reason: String,
    note: Option<String>,
    action: String,
}

struct Queued {
    component: &'static str,
    event: Published,
    reference: ObjectReference,
    /// When the first and the newest occurrence folded into this one were published.
    first: Timestamp,
    last: Timestamp,
    attempts: u8,
}

impl queue::Occurrence for Queued {
    /// The series starts at the older occurrence; everything else is the newer one's.
    fn absorb_older(&mut self, older: Self) {
        self.first = self.first.min(older.first);
        self.last = self.last.max(older.last);
    }
}

/// The involved object as the queue sees it: a 64-bit keyed hash of component, namespace,
/// name and uid. Eight bytes instead of three more string copies per pending event; two
/// objects share one only with probability ~2^-64 per pair (they would then supersede each
/// other's events, nothing worse).
type Object = u64;
/// Identifies "the same event again": component, object and reason.
type Key = (&'static str, Option<String>, Option<String>, Option<String>, String);

fn key_of(item: &Queued) -> Key {
    let r = &item.reference;
    (item.component, r.namespace.clone(), r.name.clone(), r.uid.clone(), item.event.reason.clone())
}

/// Why an event was not written.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct DropLabels {
    reason: &'static str,
}

/// A newer event of the same object (or of another object, taking the slot of an event that
/// was not its object's latest) replaced it in the full queue.
const SUPERSEDED: &str = "superseded";
/// The queue was full of events that are each the latest of their object.
const QUEUE_FULL: &str = "queue_full";
/// The API server refused it, or failed [`MAX_ATTEMPTS`] times.
const WRITE_FAILED: &str = "write_failed";

/// The sink's counters; registered on `/metrics` by [`EventSink::spawn_observed`].
#[derive(Clone, Default)]
struct EventMetrics {
    dropped: Family<DropLabels, Counter>,
    aggregated: Counter,
    written: Counter,
    pending: Gauge,
}

impl EventMetrics {
    fn registered(metrics: &Metrics) -> Self {
        Self {
            dropped: metrics.get_or_register(
                "ccm_events_dropped",
                "Events not written, by reason (superseded, queue_full, write_failed)",
                Family::default,
            ),
            aggregated: metrics.get_or_register(
                "ccm_events_aggregated",
                "Repeats of a pending event folded into its series count",
                Counter::default,
            ),
            written: metrics.get_or_register(
                "ccm_events_written",
                "Event creations and series updates written",
                Counter::default,
            ),
            pending: metrics.get_or_register("ccm_events_pending", "Events waiting to be written", Gauge::default),
        }
    }

    fn drop_some(&self, reason: &'static str, occurrences: u32) {
        self.dropped.get_or_create(&DropLabels { reason }).inc_by(u64::from(occurrences));
    }

    fn count(&self, admission: Admission) {
        match admission {
            Admission::Queued => {}
            Admission::Aggregated => {
                self.aggregated.inc();
            }
            Admission::Superseded(n) => self.drop_some(SUPERSEDED, n),
            Admission::Dropped(n) => self.drop_some(QUEUE_FULL, n),
        }
    }
}

struct Shared {
    pending: Mutex<PendingQueue<Object, Queued>>,
    wake: Notify,
    metrics: EventMetrics,
    objects: RandomState,
}

impl Shared {
    fn object_of(&self, component: &'static str, r: &ObjectReference) -> Object {
        self.objects.hash_one((component, &r.namespace, &r.name, &r.uid))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PendingQueue<Object, Queued>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Run `f` on the queue, keeping the pending gauge in step (by difference, so sinks
    /// sharing one registry add up).
    fn with_queue<R>(&self, f: impl FnOnce(&mut PendingQueue<Object, Queued>) -> R) -> R {
        let mut q = self.lock();
        let before = q.len() as i64;
        let result = f(&mut q);
        let after = q.len() as i64;
        drop(q);
        if after != before {
            self.metrics.pending.inc_by(after - before);
        }
        result
    }

    fn pop(&self) -> Option<queue::Popped<Queued>> {
        self.with_queue(|q| q.pop())
    }
}

/// Writes events, turning a repeat within [`SERIES_WINDOW`] into a series update of the
/// event already written. Unlike kube's `Recorder`, whose cache keeps every event it ever
/// wrote for the window, this remembers at most [`SERIES_MEMORY`] events.
struct Recent {
    client: kube::Client,
    instance: Option<String>,
    written: HashMap<Key, Written>,
    order: VecDeque<Key>,
    names: RandomState,
    sequence: u64,
}

struct Written {
    namespace: String,
    name: String,
    count: i32,
    last: Timestamp,
}

impl Recent {
    fn new(client: kube::Client, instance: Option<String>) -> Self {
        Self {
            client,
            instance,
            written: HashMap::new(),
            order: VecDeque::new(),
            names: RandomState::new(),
            sequence: 0,
        }
    }

    fn forget_old(&mut self, now: Timestamp) {
        let window = SignedDuration::try_from(SERIES_WINDOW).unwrap_or(SignedDuration::ZERO);
        while let Some(front) = self.order.front() {
            let expired = self.written.get(front).is_none_or(|w| w.last + window < now);
            if !expired && self.order.len() <= SERIES_MEMORY {
                break;
            }
            if let Some(key) = self.order.pop_front() {
                self.written.remove(&key);
            }
        }
    }

    /// Write `item`, which stands for `count` occurrences.
    async fn write(&mut self, item: &Queued, count: u32) -> Result<(), kube::Error> {
        let now = Timestamp::now();
        self.forget_old(now);
        let count = i32::try_from(count.max(1)).unwrap_or(i32::MAX);
        let key = key_of(item);
        if let Some(w) = self.written.get_mut(&key) {
            let api: kube::Api<K8sEvent> = kube::Api::namespaced(self.client.clone(), &w.namespace);
            let total = w.count.saturating_add(count);
            let series = EventSeries { count: total, last_observed_time: MicroTime(item.last) };
            let patch = serde_json::json!({"series": series, "note": item.event.note});
            match api.patch(&w.name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                Ok(_) => {
                    w.count = total;
                    w.last = now;
                    return Ok(());
                }
                // The event expired on the server: write a new one below.
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        let namespace = item.reference.namespace.clone().unwrap_or_else(|| "default".to_string());
        self.sequence += 1;
        let suffix = self.names.hash_one((self.sequence, now.as_nanosecond()));
        let name = format!("{}.{suffix:016x}", item.reference.name.as_deref().unwrap_or("object"));
        let event = K8sEvent {
            metadata: ObjectMeta { name: Some(name.clone()), namespace: Some(namespace.clone()), ..Default::default() },
            action: Some(item.event.action.clone()),
            reason: Some(item.event.reason.clone()),
            note: item.event.note.clone(),
            type_: Some(match item.event.type_ {
                EventType::Normal => "Normal".to_string(),
                EventType::Warning => "Warning".to_string(),
            }),
            event_time: Some(MicroTime(item.first)),
            // Repeats folded while waiting are one series, as the API defines it (count >= 2).
            series: (count >= 2).then_some(EventSeries { count, last_observed_time: MicroTime(item.last) }),
            regarding: Some(item.reference.clone()),
            reporting_controller: Some(item.component.to_string()),
            reporting_instance: Some(self.instance.clone().unwrap_or_else(|| item.component.to_string())),
            ..Default::default()
        };
        let api: kube::Api<K8sEvent> = kube::Api::namespaced(self.client.clone(), &namespace);
        api.create(&PostParams::default(), &event).await?;
        if !self.written.contains_key(&key) {
            self.order.push_back(key.clone());
        }
        self.written.insert(key, Written { namespace, name, count, last: now });
        Ok(())
    }
}

/// Whether a failed write may succeed later: the server was overloaded or unreachable.
fn retryable(error: &kube::Error) -> bool {
    match error {
        kube::Error::Api(e) => e.code == 429 || e.code >= 500,
        _ => true,
    }
}

/// A non-blocking event publisher; cheap to clone.
#[derive(Clone)]
pub struct EventSink {
    shared: Arc<Shared>,
}

impl EventSink {
    /// Start the writer task. `instance` identifies this manager (pod name) in events.
    pub fn spawn(client: kube::Client, instance: Option<String>, shutdown: CancellationToken) -> Self {
        Self::start(client, instance, DEFAULT_QUEUE, DEFAULT_RATE, EventMetrics::default(), shutdown)
    }

    /// Start the writer task, counting written, aggregated, dropped and pending events in
    /// `metrics` (`ccm_events_*`; sinks sharing a registry share the series).
    pub fn spawn_observed(
        client: kube::Client,
        instance: Option<String>,
        metrics: &Metrics,
        shutdown: CancellationToken,
    ) -> Self {
        Self::start(client, instance, DEFAULT_QUEUE, DEFAULT_RATE, EventMetrics::registered(metrics), shutdown)
    }

    /// Start the writer task with an explicit queue size (at most [`MAX_QUEUE`]) and rate,
    /// counting in `metrics` when given.
    pub fn spawn_with(
        client: kube::Client,
        instance: Option<String>,
        queue: usize,
        per_second: u32,
        metrics: Option<&Metrics>,
        shutdown: CancellationToken,
    ) -> Self {
        let metrics = metrics.map(EventMetrics::registered).unwrap_or_default();
        Self::start(client, instance, queue, per_second, metrics, shutdown)
    }

    fn start(
        client: kube::Client,
        instance: Option<String>,
        queue: usize,
        per_second: u32,
        metrics: EventMetrics,
        shutdown: CancellationToken,
    ) -> Self {
        let shared = Arc::new(Shared {
            pending: Mutex::new(PendingQueue::new(queue.clamp(1, MAX_QUEUE))),
            wake: Notify::new(),
            metrics,
            objects: RandomState::new(),
        });
        let writer = shared.clone();
        tokio::spawn(async move {
            let mut recent = Recent::new(client, instance);
            let mut pace = Pace::new(per_second);
            loop {
                // Checked before taking work: after shutdown nothing more is written.
                if shutdown.is_cancelled() {
                    return;
                }
                let Some(popped) = writer.pop() else {
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = writer.wake.notified() => continue,
                    }
                };
                let started = tokio::time::Instant::now();
                let mut item = popped.item;
                match recent.write(&item, popped.count).await {
                    Ok(()) => {
                        pace.succeeded();
                        writer.metrics.written.inc();
                    }
                    Err(error) if retryable(&error) && item.attempts + 1 < MAX_ATTEMPTS => {
                        tracing::debug!(%error, reason = %item.event.reason, "could not write event; will retry");
                        pace.failed();
                        item.attempts += 1;
                        let object = writer.object_of(item.component, &item.reference);
                        let reason = item.event.reason.clone();
                        let admission = writer.with_queue(|q| q.retry(object, &reason, item, popped.count));
                        writer.metrics.count(admission);
                    }
                    Err(error) => {
                        tracing::debug!(%error, reason = %item.event.reason, "could not write event");
                        pace.failed();
                        writer.metrics.drop_some(WRITE_FAILED, popped.count);
                    }
                }
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep_until(started + pace.pause()) => {}
                }
            }
        });
        Self { shared }
    }

    /// Queue an event on `reference`, written by `component` (for example
    /// `cloud-node-controller`). Never waits. A repeat of a pending event folds into it (a
    /// series); when the queue is full, an older event is superseded or this one dropped, as
    /// [`queue`] describes, and counted.
    pub fn publish(
        &self,
        component: &'static str,
        reference: ObjectReference,
        type_: EventType,
        reason: &str,
        note: impl Into<String>,
        action: &str,
    ) {
        let event =
            Published { type_, reason: reason.to_string(), note: Some(note.into()), action: action.to_string() };
        let object = self.shared.object_of(component, &reference);
        let now = Timestamp::now();
        let item = Queued { component, event, reference, first: now, last: now, attempts: 0 };
        let admission = self.shared.with_queue(|q| q.push(object, reason, item, 1));
        self.shared.metrics.count(admission);
        if matches!(admission, Admission::Queued | Admission::Superseded(_)) {
            self.shared.wake.notify_one();
        }
    }

    /// Event occurrences not written: superseded in a full queue, dropped, or refused by the
    /// server.
    pub fn dropped(&self) -> u64 {
        [SUPERSEDED, QUEUE_FULL, WRITE_FAILED]
            .iter()
            .map(|&reason| self.shared.metrics.dropped.get_or_create(&DropLabels { reason }).get())
            .sum()
    }

    /// Event occurrences folded into a pending repeat of themselves (written as a series).
    pub fn coalesced(&self) -> u64 {
        self.shared.metrics.aggregated.get()
    }

    /// Event creations and series updates written successfully.
    pub fn published(&self) -> u64 {
        self.shared.metrics.written.get()
    }

    /// Events waiting to be written.
    pub fn pending(&self) -> usize {
        self.shared.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(name: &str) -> ObjectReference {
        ObjectReference {
            kind: Some("Service".into()),
            namespace: Some("ns".into()),
            name: Some(name.into()),
            ..Default::default()
        }
    }

    /// A sink whose writer never runs (its client points nowhere and it is cancelled at once),
    /// so the queue can be inspected.
    fn idle_sink(queue: usize) -> EventSink {
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let client = kube::Client::try_from(config).unwrap();
        let token = CancellationToken::new();
        token.cancel();
        EventSink::spawn_with(client, None, queue, 1, None, token)
    }

    #[tokio::test]
    async fn repeats_of_a_pending_event_are_coalesced_not_queued() {
        let sink = idle_sink(10);
        for attempt in 0..100 {
            sink.publish(
                "service-controller",
                reference("a"),
                EventType::Warning,
                "SyncLoadBalancerFailed",
                format!("try {attempt}"),
                "Sync",
            );
        }
        assert_eq!(sink.pending(), 1);
        assert_eq!(sink.coalesced(), 99);
        assert_eq!(sink.dropped(), 0);
        let popped = sink.shared.pop().unwrap();
        assert_eq!(popped.item.event.note.as_deref(), Some("try 99"), "the newest note is kept");
        assert_eq!(popped.count, 100, "written as one series of 100");
    }

    #[tokio::test]
    async fn a_folded_series_spans_its_first_and_last_occurrence() {
        let sink = idle_sink(10);
        let publish = || {
            sink.publish("service-controller", reference("a"), EventType::Normal, "EnsuringLoadBalancer", "x", "Sync")
        };
        publish();
        tokio::time::sleep(Duration::from_millis(5)).await;
        sink.publish("service-controller", reference("b"), EventType::Normal, "EnsuringLoadBalancer", "x", "Sync");
        sink.publish("service-controller", reference("a"), EventType::Normal, "EnsuredLoadBalancer", "x", "Sync");
        tokio::time::sleep(Duration::from_millis(5)).await;
        // Behind a's Ensured: moves after it, keeping when the series began.
        publish();
        let popped: Vec<_> = std::iter::from_fn(|| sink.shared.pop()).collect();
        let last = popped.last().unwrap();
        assert_eq!((last.item.event.reason.as_str(), last.count), ("EnsuringLoadBalancer", 2));
        assert!(last.item.first < popped[0].item.first, "the series began before b's event");
        assert!(last.item.last > popped[1].item.last, "and was last seen after a's Ensured");
    }

    #[tokio::test]
    async fn a_retry_storm_on_one_object_does_not_crowd_out_others() {
        let sink = idle_sink(3);
        for _ in 0..50 {
            sink.publish(
                "service-controller",
                reference("hot"),
                EventType::Warning,
                "SyncLoadBalancerFailed",
                "x",
                "Sync",
            );
        }
        sink.publish("service-controller", reference("b"), EventType::Warning, "SyncLoadBalancerFailed", "x", "Sync");
        sink.publish("service-controller", reference("b"), EventType::Normal, "EnsuringLoadBalancer", "x", "Sync");
        assert_eq!(sink.pending(), 3);
        assert_eq!(sink.dropped(), 0);
        sink.publish("service-controller", reference("c"), EventType::Normal, "EnsuringLoadBalancer", "x", "Sync");
        assert_eq!(sink.dropped(), 1, "a fourth object's event takes the slot of b's superseded one");
        sink.publish("service-controller", reference("d"), EventType::Normal, "EnsuringLoadBalancer", "x", "Sync");
        assert_eq!(sink.dropped(), 2, "every pending event is its object's latest: the new one is dropped");
        let order: Vec<_> = std::iter::from_fn(|| sink.shared.pop())
            .map(|p| (p.item.reference.name.unwrap(), p.item.event.reason, p.count))
            .collect();
        assert_eq!(
            order,
            [
                ("hot".to_string(), "SyncLoadBalancerFailed".to_string(), 50),
                ("b".to_string(), "EnsuringLoadBalancer".to_string(), 1),
                ("c".to_string(), "EnsuringLoadBalancer".to_string(), 1)
            ]
        );
    }

    #[tokio::test]
    async fn dropped_events_are_counted_by_reason_on_metrics() {
        let client = kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap();
        let token = CancellationToken::new();
        token.cancel();
        let metrics = Metrics::new();
        let sink = EventSink::spawn_with(client, None, 2, 1, Some(&metrics), token);
        let publish = |name: &str, reason: &str| {
            sink.publish("service-controller", reference(name), EventType::Normal, reason, "x", "Sync")
        };
        publish("a", "EnsuringLoadBalancer");
        publish("a", "EnsuringLoadBalancer");
        publish("b", "EnsuringLoadBalancer");
        publish("b", "EnsuredLoadBalancer");
        publish("c", "EnsuringLoadBalancer");
        let text = metrics.encode();
        for line in [
            "ccm_events_aggregated_total 1",
            "ccm_events_dropped_total{reason=\"superseded\"} 1",
            "ccm_events_dropped_total{reason=\"queue_full\"} 1",
            "ccm_events_pending 2",
        ] {
            assert!(text.contains(line), "{line} in\n{text}");
        }
        assert_eq!(sink.dropped(), 2);
    }
}
