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
//! Pace: one write in flight while few events wait, at most [`DEFAULT_RATE`] per second,
//! backing off on 429/5xx. The event client is the same user as the controllers' client, so
//! API Priority and Fairness puts its requests in the same flow, and one writer holds one of
//! the flow's seats. When many objects change at once that seat is too small: with 10,000
//! Services converging on a genuine kube-apiserver, one writer landed 1,812 of 20,000 events
//! during the 52 s of convergence and the full queue superseded 4,617. So a backlog opens up
//! to [`MAX_IN_FLIGHT`] writes (one per [`BACKLOG_PER_WRITE`] pending), each for a different
//! object, so that no object's events are reordered; the controllers keep the other seats.

pub mod components;
pub mod queue;

use std::collections::hash_map::RandomState;
use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;

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
/// about 0.3 KiB with the queue's bookkeeping: a 120-byte slot, its strings in one allocation
/// (about 0.14 KiB for a Service), an index entry per object and two id queues. It was 0.4 KiB
/// with each entry boxed in a map (heaptrack, 10,000-Service benchmark: 5.9 MiB at 15,700
/// pending) and 0.9 KiB before the strings were packed. The queue only fills while the API
/// server takes events slower than they come.
pub const DEFAULT_QUEUE: usize = 16_384;
/// Largest queue [`EventSink::spawn_with`] accepts (bounds memory whatever is configured).
pub const MAX_QUEUE: usize = 65_536;
/// Events written per second at most. The server's latency paces writes first (about 2.4 ms
/// per write on a genuine kube-apiserver here: ~420/s with one in flight); the cap only bounds
/// the rate against a faster server.
pub const DEFAULT_RATE: u32 = 1000;
/// Event writes in flight at most. One while few events wait; more only as a backlog
/// builds (one more per [`BACKLOG_PER_WRITE`] pending), so that when many objects change at
/// once the events still get a share of the API server next to the controllers' writes. Four
/// was enough while a service sync held its worker through its writes; with four syncs per
/// cloud slot (S29, 128 in flight by default) four event writes were starved: 10,000 Services
/// converged with 1,056–2,583 of their 20,000 events written and the full queue dropped
/// 1,059–2,590 (genuine kube-apiserver).
pub const MAX_IN_FLIGHT: usize = 16;
/// Pending events per write in flight (see [`MAX_IN_FLIGHT`]).
pub const BACKLOG_PER_WRITE: usize = 256;
/// How long a written event is remembered so a repeat becomes a series update.
pub const SERIES_WINDOW: Duration = Duration::from_secs(6 * 60);
/// How many written events are remembered for series updates (bounds memory).
pub const SERIES_MEMORY: usize = 1024;
/// Writes of one event tried before it is dropped (`reason="write_failed"`).
pub const MAX_ATTEMPTS: u8 = 3;
/// How long a stopping sink keeps writing its pending events, at its usual pace, before
/// counting the rest as dropped (`reason="shutdown"`). Bounds how much a stop can be delayed.
pub const DRAIN_GRACE: Duration = Duration::from_secs(2);

/// How long a write in flight when [`DRAIN_GRACE`] runs out may still take. One cut off after
/// that is counted as dropped, though the server may have taken it.
const IN_FLIGHT_SLACK: Duration = Duration::from_millis(500);

/// Longest `note` the events.k8s.io API accepts (bytes); longer notes are cut to fit.
pub const NOTE_LIMIT: usize = 1024;

/// Fields of a pending event kept in [`Text`], by index.
const REASON: usize = 0;
const ACTION: usize = 1;
const NOTE: usize = 2;
const API_VERSION: usize = 3;
const KIND: usize = 4;
const NAMESPACE: usize = 5;
const NAME: usize = 6;
const UID: usize = 7;
const RESOURCE_VERSION: usize = 8;
const FIELD_PATH: usize = 9;
const FIELDS: usize = 10;

/// A pending event's strings in one allocation. Ten separate strings cost ten allocations
/// with their headers, about 0.5 KiB per event; at [`DEFAULT_QUEUE`] pending events that
/// was most of the sink's memory.
struct Text {
    buf: Box<str>,
    /// Where each field ends in `buf` (fields are cut to [`FIELD_LIMIT`], so this fits).
    ends: [u16; FIELDS],
    /// Bit i set: field i was `None`.
    absent: u16,
}

impl Text {
    fn new(fields: [Option<&str>; FIELDS]) -> Self {
        let mut buf = String::with_capacity(fields.iter().flatten().map(|f| f.len()).sum());
        let mut ends = [0; FIELDS];
        let mut absent = 0;
        for (i, field) in fields.iter().enumerate() {
            match field {
                Some(f) => buf.push_str(cut(f, FIELD_LIMIT)),
                None => absent |= 1 << i,
            }
            // At most FIELDS × FIELD_LIMIT bytes in all, below u16::MAX.
            ends[i] = u16::try_from(buf.len()).unwrap_or(u16::MAX);
        }
        Self { buf: buf.into_boxed_str(), ends, absent }
    }

    fn get(&self, i: usize) -> Option<&str> {
        if self.absent & (1 << i) != 0 {
            return None;
        }
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        self.buf.get(start..self.ends[i] as usize)
    }

    fn owned(&self, i: usize) -> Option<String> {
        self.get(i).map(str::to_string)
    }
}

/// `text` cut to at most `limit` bytes, on a character boundary.
fn cut(text: &str, limit: usize) -> &str {
    if text.len() <= limit {
        return text;
    }
    let mut end = limit;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// `note` cut to at most [`NOTE_LIMIT`] bytes, on a character boundary.
fn fit_note(note: &str) -> &str {
    cut(note, NOTE_LIMIT)
}

/// Longest field a pending event keeps (bytes). The API's own limits are far lower (a name
/// 253, a reason 128); this only bounds what a caller can make the queue hold.
const FIELD_LIMIT: usize = 4096;

/// A time to the microsecond (all a `MicroTime` keeps) in 8 bytes, where jiff's takes 16.
type Micros = i64;

fn micros_now() -> Micros {
    Timestamp::now().as_microsecond()
}

fn micro_time(us: Micros) -> MicroTime {
    MicroTime(Timestamp::from_microsecond(us).unwrap_or(Timestamp::UNIX_EPOCH))
}

/// A pending event: kube's `Event` and its `regarding` reference (without `secondary`, never
/// set here), with every string in one [`Text`].
struct Queued {
    component: &'static str,
    type_: EventType,
    text: Text,
    /// When the first and the newest occurrence folded into this one were published.
    first: Micros,
    last: Micros,
    attempts: u8,
}

impl Queued {
    fn new(
        component: &'static str,
        type_: EventType,
        reason: &str,
        note: &str,
        action: &str,
        r: &ObjectReference,
    ) -> Self {
        let text = Text::new([
            Some(reason),
            Some(action),
            Some(fit_note(note)),
            r.api_version.as_deref(),
            r.kind.as_deref(),
            r.namespace.as_deref(),
            r.name.as_deref(),
            r.uid.as_deref(),
            r.resource_version.as_deref(),
            r.field_path.as_deref(),
        ]);
        let now = micros_now();
        Self { component, type_, text, first: now, last: now, attempts: 0 }
    }

    fn reason(&self) -> &str {
        self.text.get(REASON).unwrap_or_default()
    }

    fn note(&self) -> Option<&str> {
        self.text.get(NOTE)
    }

    fn namespace(&self) -> Option<&str> {
        self.text.get(NAMESPACE)
    }

    fn name(&self) -> Option<&str> {
        self.text.get(NAME)
    }

    fn reference(&self) -> ObjectReference {
        ObjectReference {
            api_version: self.text.owned(API_VERSION),
            kind: self.text.owned(KIND),
            namespace: self.text.owned(NAMESPACE),
            name: self.text.owned(NAME),
            uid: self.text.owned(UID),
            resource_version: self.text.owned(RESOURCE_VERSION),
            field_path: self.text.owned(FIELD_PATH),
        }
    }
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
    let t = &item.text;
    (item.component, t.owned(NAMESPACE), t.owned(NAME), t.owned(UID), item.reason().to_string())
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
/// Still pending when the sink stopped and [`DRAIN_GRACE`] ran out.
const SHUTDOWN: &str = "shutdown";

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
                "Events not written, by reason (superseded, queue_full, write_failed, shutdown)",
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

    fn drop_some(&self, reason: &'static str, occurrences: impl Into<u64>) {
        self.dropped.get_or_create(&DropLabels { reason }).inc_by(occurrences.into());
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
    /// Set by the writer when it has finished: the occurrences it could not write.
    closed: tokio::sync::watch::Sender<Option<u64>>,
}

impl Shared {
    fn new(queue: usize, metrics: EventMetrics) -> Arc<Self> {
        Arc::new(Shared {
            pending: Mutex::new(PendingQueue::new(queue.clamp(1, MAX_QUEUE))),
            wake: Notify::new(),
            metrics,
            objects: RandomState::new(),
            closed: tokio::sync::watch::channel(None).0,
        })
    }

    fn object_of(&self, item: &Queued) -> Object {
        self.objects.hash_one((item.component, item.namespace(), item.name(), item.text.get(UID)))
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

    /// The next events to write together: one while the queue is short, up to
    /// [`MAX_IN_FLIGHT`] (of different objects) when a backlog builds.
    fn pop_batch(&self) -> Vec<queue::Popped<Queued>> {
        self.with_queue(|q| {
            let writes = (q.len() / BACKLOG_PER_WRITE).clamp(1, MAX_IN_FLIGHT);
            q.pop_distinct(writes)
        })
    }

    /// Book the outcome of one write: a retryable failure puts the event back, any other
    /// failure is counted as dropped.
    fn settle(&self, recent: &mut Recent, pace: &mut Pace, planned: Planned, result: Result<Landed, kube::Error>) {
        match result {
            Ok(landed) => {
                recent.record(planned, landed);
                pace.succeeded();
                self.metrics.written.inc();
            }
            Err(error) if retryable(&error) && planned.popped.item.attempts + 1 < MAX_ATTEMPTS => {
                let queue::Popped { mut item, count } = planned.popped;
                tracing::debug!(%error, reason = %item.reason(), "could not write event; will retry");
                pace.failed();
                item.attempts += 1;
                let object = self.object_of(&item);
                let reason = item.reason().to_string();
                let admission = self.with_queue(|q| q.retry(object, &reason, item, count));
                self.metrics.count(admission);
            }
            Err(error) => {
                tracing::debug!(%error, reason = %planned.popped.item.reason(), "could not write event");
                pace.failed();
                self.metrics.drop_some(WRITE_FAILED, planned.popped.count);
            }
        }
    }

    /// The writer has stopped: count what is still pending, plus `in_flight` occurrences cut
    /// off mid-write, as dropped (`reason="shutdown"`) and return the total.
    fn give_up(&self, in_flight: u32) -> u64 {
        let mut left = u64::from(in_flight);
        self.with_queue(|q| {
            while let Some(popped) = q.pop() {
                left += u64::from(popped.count);
            }
        });
        if left > 0 {
            self.metrics.drop_some(SHUTDOWN, left);
            tracing::debug!(unwritten = left, "events left unwritten at shutdown");
        }
        left
    }
}

/// Remembers written events so that a repeat within [`SERIES_WINDOW`] becomes a series
/// update of the event already written. Unlike kube's `Recorder`, whose cache keeps every
/// event it ever wrote for the window, this remembers at most [`SERIES_MEMORY`] events.
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

/// One write, decided from [`Recent`] before its request is sent.
struct Planned {
    popped: queue::Popped<Queued>,
    key: Key,
    /// Occurrences this write stands for.
    count: i32,
    /// The event already written for this key (namespace, name) and the series' new total.
    series: Option<(String, String, i32)>,
    /// The name a newly created event gets.
    name: String,
}

/// What a successful write did.
enum Landed {
    /// The series of the event already written grew.
    Series,
    /// A new event was created.
    Created,
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

    /// Decide how `popped` is written: a series update or a new event, and its name.
    fn plan(&mut self, popped: queue::Popped<Queued>) -> Planned {
        let now = Timestamp::now();
        self.forget_old(now);
        let count = i32::try_from(popped.count.max(1)).unwrap_or(i32::MAX);
        let key = key_of(&popped.item);
        let series =
            self.written.get(&key).map(|w| (w.namespace.clone(), w.name.clone(), w.count.saturating_add(count)));
        self.sequence += 1;
        let suffix = self.names.hash_one((self.sequence, now.as_nanosecond()));
        let name = format!("{}.{suffix:016x}", popped.item.name().unwrap_or("object"));
        Planned { popped, key, count, series, name }
    }

    /// Send the request `planned` describes. Takes `&self`, so several can be in flight.
    async fn send(&self, planned: &Planned) -> Result<Landed, kube::Error> {
        let item = &planned.popped.item;
        if let Some((namespace, name, total)) = &planned.series {
            let api: kube::Api<K8sEvent> = kube::Api::namespaced(self.client.clone(), namespace);
            let series = EventSeries { count: *total, last_observed_time: micro_time(item.last) };
            let patch = serde_json::json!({"series": series, "note": item.note()});
            match api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                Ok(_) => return Ok(Landed::Series),
                // The event expired on the server: write a new one below.
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        let count = planned.count;
        let namespace = item.namespace().unwrap_or("default");
        let event = K8sEvent {
            metadata: ObjectMeta {
                name: Some(planned.name.clone()),
                namespace: Some(namespace.to_string()),
                ..Default::default()
            },
            action: item.text.owned(ACTION),
            reason: Some(item.reason().to_string()),
            note: item.text.owned(NOTE),
            type_: Some(match item.type_ {
                EventType::Normal => "Normal".to_string(),
                EventType::Warning => "Warning".to_string(),
            }),
            event_time: Some(micro_time(item.first)),
            // Repeats folded while waiting are one series, as the API defines it (count >= 2).
            series: (count >= 2).then_some(EventSeries { count, last_observed_time: micro_time(item.last) }),
            regarding: Some(item.reference()),
            reporting_controller: Some(item.component.to_string()),
            reporting_instance: Some(self.instance.clone().unwrap_or_else(|| item.component.to_string())),
            ..Default::default()
        };
        let api: kube::Api<K8sEvent> = kube::Api::namespaced(self.client.clone(), namespace);
        api.create(&PostParams::default(), &event).await?;
        Ok(Landed::Created)
    }

    /// Remember a write that succeeded, for later repeats.
    fn record(&mut self, planned: Planned, landed: Landed) {
        let now = Timestamp::now();
        match landed {
            Landed::Series => {
                if let (Some(w), Some((_, _, total))) = (self.written.get_mut(&planned.key), planned.series) {
                    w.count = total;
                    w.last = now;
                }
            }
            Landed::Created => {
                let namespace = planned.popped.item.namespace().unwrap_or("default").to_string();
                if !self.written.contains_key(&planned.key) {
                    self.order.push_back(planned.key.clone());
                }
                let written = Written { namespace, name: planned.name, count: planned.count, last: now };
                self.written.insert(planned.key, written);
            }
        }
    }
}

/// Send every planned write at once. When `grace_over` resolves meanwhile, writes still in
/// flight get [`IN_FLIGHT_SLACK`] more; those cut off after that come back as `None`.
/// Returns the results in `planned`'s order and whether the grace ran out.
async fn send_all(
    recent: &Recent,
    planned: &[Planned],
    grace_over: &mut std::pin::Pin<&mut impl Future<Output = ()>>,
) -> (Vec<Option<Result<Landed, kube::Error>>>, bool) {
    let mut results: Vec<Option<Result<Landed, kube::Error>>> = planned.iter().map(|_| None).collect();
    let mut sending: FuturesUnordered<_> =
        planned.iter().enumerate().map(|(i, p)| async move { (i, recent.send(p).await) }).collect();
    let mut grace_ran_out = false;
    loop {
        tokio::select! {
            next = sending.next() => match next {
                Some((i, result)) => results[i] = Some(result),
                None => break,
            },
            // A write already sent may have landed: let it finish briefly, so it is counted
            // for what it was; only one the server holds longer is a guess.
            _ = grace_over.as_mut() => {
                grace_ran_out = true;
                let _ = tokio::time::timeout(IN_FLIGHT_SLACK, async {
                    while let Some((i, result)) = sending.next().await {
                        results[i] = Some(result);
                    }
                })
                .await;
                break;
            }
        }
    }
    (results, grace_ran_out)
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
        let shared = Shared::new(queue, metrics);
        let writer = shared.clone();
        tokio::spawn(async move {
            let mut recent = Recent::new(client, instance);
            let mut pace = Pace::new(per_second);
            // Resolves DRAIN_GRACE after shutdown: whatever is still pending then is given up.
            let grace_over = async {
                shutdown.cancelled().await;
                tokio::time::sleep(DRAIN_GRACE).await;
            };
            tokio::pin!(grace_over);
            // Occurrences being written when the grace ran out.
            let mut in_flight = 0;
            loop {
                let batch = writer.pop_batch();
                if batch.is_empty() {
                    if shutdown.is_cancelled() {
                        break;
                    }
                    tokio::select! {
                        // Look at the queue once more, then stop.
                        _ = shutdown.cancelled() => continue,
                        _ = writer.wake.notified() => continue,
                    }
                }
                let started = tokio::time::Instant::now();
                let writes = batch.len();
                let planned: Vec<Planned> = batch.into_iter().map(|popped| recent.plan(popped)).collect();
                let (results, grace_ran_out) = send_all(&recent, &planned, &mut grace_over).await;
                for (planned, result) in planned.into_iter().zip(results) {
                    match result {
                        Some(result) => writer.settle(&mut recent, &mut pace, planned, result),
                        None => in_flight += planned.popped.count,
                    }
                }
                if grace_ran_out {
                    break;
                }
                tokio::select! {
                    _ = tokio::time::sleep_until(started + pace.pause_after(writes)) => {}
                    _ = &mut grace_over => break,
                }
            }
            let unwritten = writer.give_up(in_flight);
            writer.closed.send_replace(Some(unwritten));
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
        let item = Queued::new(component, type_, reason, &note.into(), action, &reference);
        let object = self.shared.object_of(&item);
        let admission = self.shared.with_queue(|q| q.push(object, reason, item, 1));
        self.shared.metrics.count(admission);
        if matches!(admission, Admission::Queued | Admission::Superseded(_)) {
            self.shared.wake.notify_one();
        }
    }

    /// Event occurrences not written: superseded in a full queue, dropped, refused by the
    /// server, or left at shutdown.
    pub fn dropped(&self) -> u64 {
        [SUPERSEDED, QUEUE_FULL, WRITE_FAILED, SHUTDOWN]
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

    /// Call after shutdown: wait for the writer, which writes what is pending for at most
    /// [`DRAIN_GRACE`] (plus [`IN_FLIGHT_SLACK`] for a write already sent), and return the occurrences it left unwritten (also counted as dropped
    /// with `reason="shutdown"`). `None` if it has not finished a second after the grace.
    pub async fn closed(&self) -> Option<u64> {
        let mut rx = self.shared.closed.subscribe();
        let finished = rx.wait_for(Option::is_some);
        match tokio::time::timeout(DRAIN_GRACE + IN_FLIGHT_SLACK + Duration::from_secs(1), finished).await {
            Ok(Ok(left)) => *left,
            // The sender lives as long as `self`, so only the timeout gets here.
            _ => None,
        }
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

    /// A sink without a writer, so the queue can be inspected.
    fn idle_sink(queue: usize) -> EventSink {
        EventSink { shared: Shared::new(queue, EventMetrics::default()) }
    }

    #[test]
    fn a_pending_event_gives_back_its_reference_and_strings_as_published() {
        let r = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Service".into()),
            namespace: Some("ns".into()),
            name: Some("web".into()),
            uid: Some("0d1c".into()),
            resource_version: Some("42".into()),
            field_path: None,
        };
        let item = Queued::new("service-controller", EventType::Warning, "SyncLoadBalancerFailed", "", "Sync", &r);
        assert_eq!(item.reference(), r, "absent fields stay absent, empty ones empty");
        assert_eq!(
            (item.reason(), item.note(), item.text.get(ACTION)),
            ("SyncLoadBalancerFailed", Some(""), Some("Sync"))
        );
        let bare = Queued::new("c", EventType::Normal, "R", "n", "A", &ObjectReference::default());
        assert_eq!(bare.reference(), ObjectReference::default());
        assert_eq!((bare.namespace(), bare.name()), (None, None));
    }

    #[test]
    fn a_pending_events_fields_read_back_as_given_and_an_oversized_one_is_cut() {
        let long = "é".repeat(FIELD_LIMIT); // two bytes each
        let t = Text::new([
            Some("Reason"),
            None,
            Some(""),
            Some("v1"),
            Some(long.as_str()),
            Some("ns"),
            Some(long.as_str()),
            Some("uid"),
            None,
            Some("spec"),
        ]);
        let fields: Vec<_> = (0..FIELDS).map(|i| t.get(i)).collect();
        let cut_long = &long[..FIELD_LIMIT];
        let want = [
            Some("Reason"),
            None,
            Some(""),
            Some("v1"),
            Some(cut_long),
            Some("ns"),
            Some(cut_long),
            Some("uid"),
            None,
            Some("spec"),
        ];
        assert_eq!(fields, want);
        assert!(
            std::mem::size_of::<Queued>() <= 80,
            "a pending event stays compact: {}",
            std::mem::size_of::<Queued>()
        );
    }

    #[test]
    fn a_note_longer_than_the_api_accepts_is_cut_on_a_character_boundary() {
        let long = "é".repeat(NOTE_LIMIT); // two bytes each
        let item = Queued::new("c", EventType::Normal, "R", &long, "A", &reference("a"));
        let note = item.note().unwrap();
        assert_eq!(note.len(), NOTE_LIMIT);
        assert!(note.chars().all(|c| c == 'é'));
        let odd = format!("x{long}");
        assert_eq!(fit_note(&odd).len(), NOTE_LIMIT - 1, "never half a character");
        assert_eq!(fit_note("short"), "short");
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
        let popped = sink.shared.with_queue(|q| q.pop()).unwrap();
        assert_eq!(popped.item.note(), Some("try 99"), "the newest note is kept");
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
        let popped: Vec<_> = std::iter::from_fn(|| sink.shared.with_queue(|q| q.pop())).collect();
        let last = popped.last().unwrap();
        assert_eq!((last.item.reason(), last.count), ("EnsuringLoadBalancer", 2));
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
        let order: Vec<_> = std::iter::from_fn(|| sink.shared.with_queue(|q| q.pop()))
            .map(|p| (p.item.name().unwrap().to_string(), p.item.reason().to_string(), p.count))
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

    /// A server that accepts connections and never answers: every write hangs.
    async fn silent_server() -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((conn, _)) = listener.accept().await {
                held.push(conn);
            }
        });
        (addr, task)
    }

    /// What [`slow_server`] saw: writes in flight at most, overall and for one object at once,
    /// and the reasons each object's events arrived with, in order.
    #[derive(Default)]
    struct Seen {
        in_flight: usize,
        max_in_flight: usize,
        per_object: HashMap<String, usize>,
        max_per_object: usize,
        reasons: HashMap<String, Vec<String>>,
    }

    /// A server that answers every event creation after `delay`, echoing it back.
    async fn slow_server(delay: Duration) -> (std::net::SocketAddr, Arc<Mutex<Seen>>) {
        use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Seen::default()));
        let state = seen.clone();
        tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                let seen = state.clone();
                tokio::spawn(async move {
                    let mut conn = BufReader::new(conn);
                    loop {
                        let mut length = 0;
                        loop {
                            let mut line = String::new();
                            if conn.read_line(&mut line).await.unwrap_or(0) == 0 {
                                return;
                            }
                            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                                length = v.trim().parse().unwrap();
                            }
                            if line == "\r\n" {
                                break;
                            }
                        }
                        let mut body = vec![0; length];
                        conn.read_exact(&mut body).await.unwrap();
                        let event: serde_json::Value = serde_json::from_slice(&body).unwrap();
                        let object = event["regarding"]["name"].as_str().unwrap().to_string();
                        {
                            let mut s = seen.lock().unwrap();
                            s.in_flight += 1;
                            s.max_in_flight = s.max_in_flight.max(s.in_flight);
                            let n = s.per_object.entry(object.clone()).or_default();
                            *n += 1;
                            let n = *n;
                            s.max_per_object = s.max_per_object.max(n);
                            let reason = event["reason"].as_str().unwrap().to_string();
                            s.reasons.entry(object.clone()).or_default().push(reason);
                        }
                        tokio::time::sleep(delay).await;
                        {
                            let mut s = seen.lock().unwrap();
                            s.in_flight -= 1;
                            *s.per_object.entry(object).or_default() -= 1;
                        }
                        let head = format!(
                            "HTTP/1.1 201 Created\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                            body.len()
                        );
                        // One write: a head and body sent apart would wait on a delayed ACK.
                        let reply = [head.as_bytes(), &body].concat();
                        if conn.get_mut().write_all(&reply).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (addr, seen)
    }

    async fn written(sink: &EventSink, total: u64) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while sink.published() < total {
            assert!(tokio::time::Instant::now() < deadline, "{} of {total} written", sink.published());
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn a_few_pending_events_are_written_one_at_a_time() {
        let (addr, seen) = slow_server(Duration::from_millis(20)).await;
        let client = kube::Client::try_from(kube::Config::new(format!("http://{addr}").parse().unwrap())).unwrap();
        let sink = EventSink::spawn_with(client, None, 100, 100_000, None, CancellationToken::new());
        for i in 0..20 {
            let name = format!("svc-{i}");
            sink.publish("service-controller", reference(&name), EventType::Normal, "EnsuredLoadBalancer", "x", "Sync");
        }
        written(&sink, 20).await;
        assert_eq!(seen.lock().unwrap().max_in_flight, 1, "fewer pending than BACKLOG_PER_WRITE: one seat");
    }

    #[tokio::test]
    async fn a_backlog_is_written_several_at_a_time_each_object_in_order() {
        let (addr, seen) = slow_server(Duration::from_millis(5)).await;
        let client = kube::Client::try_from(kube::Config::new(format!("http://{addr}").parse().unwrap())).unwrap();
        let objects = BACKLOG_PER_WRITE * MAX_IN_FLIGHT;
        // Room for every event, so none is superseded and each object's two are both written.
        let sink = EventSink::spawn_with(client, None, 2 * objects, 100_000, None, CancellationToken::new());
        for i in 0..objects {
            let name = format!("svc-{i}");
            for reason in ["EnsuringLoadBalancer", "EnsuredLoadBalancer"] {
                sink.publish("service-controller", reference(&name), EventType::Normal, reason, "x", "Sync");
            }
        }
        written(&sink, 2 * objects as u64).await;
        let seen = seen.lock().unwrap();
        assert_eq!(seen.max_in_flight, MAX_IN_FLIGHT, "a backlog takes every seat, and no more");
        assert_eq!(seen.max_per_object, 1, "one object's events are never in flight together");
        assert_eq!(seen.reasons.len(), objects);
        for (object, reasons) in &seen.reasons {
            assert_eq!(reasons, &["EnsuringLoadBalancer", "EnsuredLoadBalancer"], "{object}'s events in order");
        }
        assert_eq!(sink.dropped(), 0);
    }

    #[tokio::test]
    async fn events_still_pending_when_the_grace_runs_out_are_counted_as_dropped_at_shutdown() {
        let (addr, server) = silent_server().await;
        let client = kube::Client::try_from(kube::Config::new(format!("http://{addr}").parse().unwrap())).unwrap();
        let metrics = Metrics::new();
        let token = CancellationToken::new();
        let sink = EventSink::spawn_with(client, None, 10, 100, Some(&metrics), token.clone());
        for name in ["a", "b", "c"] {
            sink.publish("service-controller", reference(name), EventType::Normal, "EnsuredLoadBalancer", "x", "Sync");
        }
        sink.publish("service-controller", reference("c"), EventType::Normal, "EnsuredLoadBalancer", "y", "Sync");
        tokio::time::sleep(Duration::from_millis(50)).await;
        let stopped = tokio::time::Instant::now();
        token.cancel();
        let unwritten = sink.closed().await.expect("the writer finished");
        let waited = stopped.elapsed();
        assert_eq!(unwritten, 4, "a and b once, c's series of two (one of them was in flight)");
        assert!(waited >= DRAIN_GRACE && waited < DRAIN_GRACE * 2, "stopped after the grace, took {waited:?}");
        let text = metrics.encode();
        assert!(text.contains("ccm_events_dropped_total{reason=\"shutdown\"} 4"), "{text}");
        assert!(text.contains("ccm_events_pending 0"), "{text}");
        assert_eq!(sink.dropped(), 4);
        server.abort();
    }

    #[tokio::test]
    async fn closed_reports_nothing_unwritten_when_the_queue_was_empty() {
        let (addr, server) = silent_server().await;
        let client = kube::Client::try_from(kube::Config::new(format!("http://{addr}").parse().unwrap())).unwrap();
        let token = CancellationToken::new();
        let sink = EventSink::spawn_with(client, None, 10, 100, None, token.clone());
        token.cancel();
        let unwritten = tokio::time::timeout(Duration::from_millis(500), sink.closed()).await;
        assert_eq!(unwritten, Ok(Some(0)), "an empty queue stops at once");
        server.abort();
    }

    #[tokio::test]
    async fn dropped_events_are_counted_by_reason_on_metrics() {
        let metrics = Metrics::new();
        let sink = EventSink { shared: Shared::new(2, EventMetrics::registered(&metrics)) };
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
