//! Kubernetes Events, kept off the controllers' critical path.
//!
//! Controllers hand an event to [`EventSink::publish`], which never waits: a background task
//! writes events at its own pace (its own budget, separate from the controllers' API budget).
//! Pending events are keyed by (component, object, reason): a repeat of one that is still
//! waiting replaces it instead of taking a new slot, so a retry storm on a few objects cannot
//! crowd out every other object's events. Only when the number of distinct pending events
//! exceeds the queue size is a new one dropped (and counted) rather than delaying work.

use std::collections::hash_map::RandomState;
use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event as K8sEvent, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// Distinct events waiting to be written before new ones are dropped.
pub const DEFAULT_QUEUE: usize = 1024;
/// Events written per second at most.
pub const DEFAULT_RATE: u32 = 50;
/// How long a written event is remembered so a repeat becomes a series update.
pub const SERIES_WINDOW: Duration = Duration::from_secs(6 * 60);
/// How many written events are remembered for series updates (bounds memory).
pub const SERIES_MEMORY: usize = 1024;

struct Queued {
    component: &'static str,
    event: Event,
    reference: ObjectReference,
}

/// Identifies "the same event again": component, object and reason.
type Key = (&'static str, Option<String>, Option<String>, Option<String>, String);

fn key_of(item: &Queued) -> Key {
    let r = &item.reference;
    (item.component, r.namespace.clone(), r.name.clone(), r.uid.clone(), item.event.reason.clone())
}

/// Pending events in arrival order, one entry per key.
#[derive(Default)]
struct Pending {
    order: VecDeque<Key>,
    items: HashMap<Key, Queued>,
}

struct Shared {
    pending: Mutex<Pending>,
    wake: Notify,
    capacity: usize,
    dropped: AtomicU64,
    coalesced: AtomicU64,
    published: AtomicU64,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn pop(&self) -> Option<Queued> {
        let mut p = self.lock();
        let key = p.order.pop_front()?;
        p.items.remove(&key)
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

    async fn write(&mut self, item: &Queued) -> Result<(), kube::Error> {
        let now = Timestamp::now();
        self.forget_old(now);
        let key = key_of(item);
        if let Some(w) = self.written.get_mut(&key) {
            let api: kube::Api<K8sEvent> = kube::Api::namespaced(self.client.clone(), &w.namespace);
            let series = EventSeries { count: w.count + 1, last_observed_time: MicroTime(now) };
            let patch = serde_json::json!({"series": series, "note": item.event.note});
            match api.patch(&w.name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                Ok(_) => {
                    w.count += 1;
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
            event_time: Some(MicroTime(now)),
            regarding: Some(item.reference.clone()),
            related: item.event.secondary.clone(),
            reporting_controller: Some(item.component.to_string()),
            reporting_instance: Some(self.instance.clone().unwrap_or_else(|| item.component.to_string())),
            ..Default::default()
        };
        let api: kube::Api<K8sEvent> = kube::Api::namespaced(self.client.clone(), &namespace);
        api.create(&PostParams::default(), &event).await?;
        if !self.written.contains_key(&key) {
            self.order.push_back(key.clone());
        }
        self.written.insert(key, Written { namespace, name, count: 1, last: now });
        Ok(())
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
        Self::spawn_with(client, instance, DEFAULT_QUEUE, DEFAULT_RATE, shutdown)
    }

    /// Start the writer task with an explicit queue size and rate.
    pub fn spawn_with(
        client: kube::Client,
        instance: Option<String>,
        queue: usize,
        per_second: u32,
        shutdown: CancellationToken,
    ) -> Self {
        let shared = Arc::new(Shared {
            pending: Mutex::new(Pending::default()),
            wake: Notify::new(),
            capacity: queue.max(1),
            dropped: AtomicU64::new(0),
            coalesced: AtomicU64::new(0),
            published: AtomicU64::new(0),
        });
        let writer = shared.clone();
        let pause = Duration::from_secs(1) / per_second.max(1);
        tokio::spawn(async move {
            let mut recent = Recent::new(client, instance);
            loop {
                let Some(item) = writer.pop() else {
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = writer.wake.notified() => continue,
                    }
                };
                match recent.write(&item).await {
                    Ok(()) => {
                        writer.published.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(error) => {
                        tracing::debug!(%error, reason = %item.event.reason, "could not write event");
                    }
                }
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(pause) => {}
                }
            }
        });
        Self { shared }
    }

    /// Queue an event on `reference`, written by `component` (for example
    /// `cloud-node-controller`). Never waits. A repeat of a pending event replaces it; a new
    /// event is dropped when the queue is full.
    pub fn publish(
        &self,
        component: &'static str,
        reference: ObjectReference,
        type_: EventType,
        reason: &str,
        note: impl Into<String>,
        action: &str,
    ) {
        let event = Event {
            type_,
            reason: reason.to_string(),
            note: Some(note.into()),
            action: action.to_string(),
            secondary: None,
        };
        let item = Queued { component, event, reference };
        let key = key_of(&item);
        {
            let mut p = self.shared.lock();
            if let Some(slot) = p.items.get_mut(&key) {
                // Same object and reason still waiting: keep its place, send the newest note.
                *slot = item;
                self.shared.coalesced.fetch_add(1, Ordering::Relaxed);
                return;
            }
            if p.items.len() >= self.shared.capacity {
                self.shared.dropped.fetch_add(1, Ordering::Relaxed);
                return;
            }
            p.order.push_back(key.clone());
            p.items.insert(key, item);
        }
        self.shared.wake.notify_one();
    }

    /// Events dropped because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.shared.dropped.load(Ordering::Relaxed)
    }

    /// Events that replaced a pending repeat of themselves.
    pub fn coalesced(&self) -> u64 {
        self.shared.coalesced.load(Ordering::Relaxed)
    }

    /// Events written successfully.
    pub fn published(&self) -> u64 {
        self.shared.published.load(Ordering::Relaxed)
    }

    /// Events waiting to be written.
    pub fn pending(&self) -> usize {
        self.shared.lock().items.len()
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
        EventSink::spawn_with(client, None, queue, 1, token)
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
        let item = sink.shared.pop().unwrap();
        assert_eq!(item.event.note.as_deref(), Some("try 99"), "the newest note is kept");
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
        assert_eq!(sink.dropped(), 1, "a fourth distinct event does not fit");
        let order: Vec<_> =
            std::iter::from_fn(|| sink.shared.pop()).map(|q| (q.reference.name.unwrap(), q.event.reason)).collect();
        assert_eq!(
            order,
            [
                ("hot".to_string(), "SyncLoadBalancerFailed".to_string()),
                ("b".to_string(), "SyncLoadBalancerFailed".to_string()),
                ("b".to_string(), "EnsuringLoadBalancer".to_string())
            ]
        );
    }
}
