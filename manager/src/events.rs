//! Kubernetes Events, kept off the controllers' critical path.
//!
//! Controllers hand an event to [`EventSink::publish`], which never waits: a background task
//! writes events at its own pace (its own budget, separate from the controllers' API budget),
//! and when the queue is full the event is dropped and counted rather than delaying work.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Events waiting to be written before new ones are dropped.
pub const DEFAULT_QUEUE: usize = 1024;
/// Events written per second at most.
pub const DEFAULT_RATE: u32 = 50;

struct Queued {
    component: &'static str,
    event: Event,
    reference: ObjectReference,
}

/// A non-blocking event publisher; cheap to clone.
#[derive(Clone)]
pub struct EventSink {
    tx: mpsc::Sender<Queued>,
    dropped: Arc<AtomicU64>,
    published: Arc<AtomicU64>,
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
        let (tx, mut rx) = mpsc::channel::<Queued>(queue.max(1));
        let published = Arc::new(AtomicU64::new(0));
        let written = published.clone();
        let pause = Duration::from_secs(1) / per_second.max(1);
        tokio::spawn(async move {
            let mut recorders: HashMap<&'static str, Recorder> = HashMap::new();
            loop {
                let item = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    item = rx.recv() => match item { Some(i) => i, None => return },
                };
                let recorder = recorders.entry(item.component).or_insert_with(|| {
                    Recorder::new(
                        client.clone(),
                        Reporter { controller: item.component.to_string(), instance: instance.clone() },
                    )
                });
                match recorder.publish(&item.event, &item.reference).await {
                    Ok(()) => {
                        written.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(error) => {
                        tracing::debug!(%error, reason = %item.event.reason, "could not write event");
                    }
                }
                tokio::time::sleep(pause).await;
            }
        });
        Self { tx, dropped: Arc::new(AtomicU64::new(0)), published }
    }

    /// Queue an event on `reference`, written by `component` (for example
    /// `cloud-node-controller`). Never waits; drops the event when the queue is full.
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
        if self.tx.try_send(Queued { component, event, reference }).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Events dropped because the queue was full (or the writer stopped).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Events written successfully.
    pub fn published(&self) -> u64 {
        self.published.load(Ordering::Relaxed)
    }
}
