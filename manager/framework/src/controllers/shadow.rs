//! What a controller in shadow mode shares: when to compare ([`Trigger`]) and where a
//! comparison goes ([`Comparer`]: the record, the metrics, one event per change).

use std::collections::BTreeSet;
use std::fmt::Debug;
use std::time::Duration;

use futures::FutureExt;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Resource;
use kube::runtime::events::EventType;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::cache::{Change, Subscription};
use crate::controller::Context;
use crate::events::EventSink;
use crate::shadow::{Difference, EVENT_REASON, ObjectKey, REPORT_LIMIT, Shadow, ShadowMetrics};

/// How long changes are collected before the objects they touch are compared again.
pub const DEBOUNCE: Duration = Duration::from_millis(200);

/// Where one controller's comparisons go.
#[derive(Clone)]
pub struct Comparer {
    controller: &'static str,
    shadow: Shadow,
    metrics: ShadowMetrics,
    events: EventSink,
}

impl std::fmt::Debug for Comparer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Comparer").field("controller", &self.controller).finish_non_exhaustive()
    }
}

impl Comparer {
    /// The comparer of `controller` when the manager runs in shadow mode, else `None`.
    pub fn from_context(ctx: &Context, controller: &'static str) -> Option<Self> {
        let shadow = ctx.shadow.clone()?;
        shadow.register(controller);
        let metrics = ShadowMetrics::register(&ctx.metrics);
        metrics.observe(controller, &shadow.summary(0));
        Some(Self { controller, shadow, metrics, events: ctx.events.clone() })
    }

    /// The controller's canonical name.
    pub fn controller(&self) -> &'static str {
        self.controller
    }

    /// Record the latest evaluation of `object`; when its differences changed and are not
    /// empty, publish one event on `reference` (repeats fold into a series).
    pub fn record(&self, object: ObjectKey, reference: Option<ObjectReference>, differences: Vec<Difference>) {
        let line = match differences.as_slice() {
            [] => None,
            [one] => Some(one.summary()),
            [first, rest @ ..] => Some(format!("{} (and {} more)", first.summary(), rest.len())),
        };
        let changed = self.shadow.set(self.controller, object.clone(), differences);
        if let (true, Some(line), Some(reference)) = (changed, line, reference) {
            // Debug only: the event and the report carry it, and thousands of objects may differ.
            tracing::debug!(controller = self.controller, object = %object, difference = %line, "shadow: decision differs");
            self.events.publish(
                self.controller,
                reference,
                EventType::Normal,
                EVENT_REASON,
                format!("Shadow mode: {line}"),
                "Compare",
            );
        }
    }

    /// Close a full pass: forget objects `keep` rejects, count the pass, update the gauges.
    pub fn finish_pass(&self, keep: impl FnMut(&ObjectKey) -> bool) {
        self.shadow.finish_pass(self.controller, keep);
        self.metrics.pass(self.controller);
        self.observe();
    }

    /// Update the gauges from the record.
    pub fn observe(&self) {
        self.metrics.observe(self.controller, &self.shadow.summary(0));
    }

    /// The record's summary (for tests and logs).
    pub fn summary(&self) -> crate::shadow::Summary {
        self.shadow.summary(REPORT_LIMIT)
    }
}

/// The reference of an object for events.
pub fn reference<K: Resource<DynamicType = ()>>(object: &K) -> ObjectReference {
    object.object_ref(&())
}

/// What to compare next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pass {
    /// Every object.
    Full,
    /// Only these keys (a Node's name, a Service's `namespace/name`).
    Objects(BTreeSet<String>),
}

/// Decides when to compare: a full pass at once and every `period`, and in between the
/// objects that changed (by the `relevant` filter), collected for [`DEBOUNCE`].
pub struct Trigger<K> {
    changes: Option<Subscription<K>>,
    relevant: fn(&Change<K>) -> Option<String>,
    period: Duration,
    next_full: Instant,
    dirty: BTreeSet<String>,
    dirty_since: Option<Instant>,
}

impl<K: Clone + Debug> Trigger<K> {
    /// Full passes every `period`, and partial ones for the changes `relevant` keys.
    pub fn new(changes: Subscription<K>, relevant: fn(&Change<K>) -> Option<String>, period: Duration) -> Self {
        Self {
            changes: Some(changes),
            relevant,
            period: period.max(Duration::from_millis(100)),
            next_full: Instant::now(),
            dirty: BTreeSet::new(),
            dirty_since: None,
        }
    }

    /// Full passes every `period` only.
    pub fn periodic(period: Duration) -> Self {
        Self {
            changes: None,
            relevant: |_| None,
            period: period.max(Duration::from_millis(100)),
            next_full: Instant::now(),
            dirty: BTreeSet::new(),
            dirty_since: None,
        }
    }

    /// The next pass, or `None` on shutdown or when the cache is gone.
    pub async fn next(&mut self, shutdown: &CancellationToken) -> Option<Pass> {
        loop {
            let now = Instant::now();
            if now >= self.next_full {
                self.next_full = now + self.period;
                self.dirty.clear();
                self.dirty_since = None;
                self.drain();
                return Some(Pass::Full);
            }
            if let Some(since) = self.dirty_since
                && now >= since + DEBOUNCE
            {
                self.dirty_since = None;
                return Some(Pass::Objects(std::mem::take(&mut self.dirty)));
            }
            let wake = self.dirty_since.map_or(self.next_full, |s| (s + DEBOUNCE).min(self.next_full));
            let relevant = self.relevant;
            tokio::select! {
                _ = shutdown.cancelled() => return None,
                _ = tokio::time::sleep_until(wake) => {}
                change = recv(&mut self.changes) => match change {
                    None => return None,
                    Some(Change::Resynced) => self.next_full = Instant::now(),
                    Some(change) => if let Some(key) = relevant(&change) {
                        self.dirty.insert(key);
                        self.dirty_since.get_or_insert_with(Instant::now);
                    },
                },
            }
        }
    }
}

impl<K> Trigger<K> {
    /// Drop the changes already queued: the cache the full pass is about to read holds them
    /// (it is written before it broadcasts). Without this the first list's thousands of adds
    /// made a second, partial pass over every object right after the first full one.
    fn drain(&mut self)
    where
        K: Clone,
    {
        if let Some(changes) = self.changes.as_mut() {
            // Unconstrained: tokio's task budget would otherwise stop the drain after 128.
            while let Some(Some(_)) = tokio::task::unconstrained(changes.recv()).now_or_never() {}
        }
    }
}

async fn recv<K: Clone>(changes: &mut Option<Subscription<K>>) -> Option<Change<K>> {
    match changes {
        Some(c) => c.recv().await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::Cache;
    use k8s_openapi::api::core::v1::Node;

    fn node(name: &str) -> Node {
        Node { metadata: kube::api::ObjectMeta { name: Some(name.into()), ..Default::default() }, ..Default::default() }
    }

    fn name_of(change: &Change<Node>) -> Option<String> {
        match change {
            Change::Applied { new, .. } => new.metadata.name.clone(),
            Change::Deleted(n) => n.metadata.name.clone(),
            Change::Resynced => None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_pass_comes_first_then_changed_objects_then_the_next_period() {
        let (cache, mut writer) = Cache::<Node>::new();
        let mut trigger = Trigger::new(cache.subscribe(), name_of, Duration::from_secs(60));
        let stop = CancellationToken::new();
        assert_eq!(trigger.next(&stop).await, Some(Pass::Full));
        writer.apply(kube::runtime::watcher::Event::Apply(node("a")));
        writer.apply(kube::runtime::watcher::Event::Apply(node("b")));
        let started = Instant::now();
        let pass = trigger.next(&stop).await;
        assert_eq!(pass, Some(Pass::Objects(["a".to_string(), "b".to_string()].into())));
        assert!(started.elapsed() >= DEBOUNCE);
        assert_eq!(trigger.next(&stop).await, Some(Pass::Full));
        assert!(started.elapsed() >= Duration::from_secs(59));
    }

    #[tokio::test(start_paused = true)]
    async fn changes_queued_before_a_full_pass_are_covered_by_it_and_not_compared_again() {
        let (cache, mut writer) = Cache::<Node>::new();
        let mut trigger = Trigger::new(cache.subscribe(), name_of, Duration::from_secs(60));
        // The first list: every object arrives as a change before the first pass.
        for i in 0..1000 {
            writer.apply(kube::runtime::watcher::Event::Apply(node(&format!("n{i}"))));
        }
        let stop = CancellationToken::new();
        let started = Instant::now();
        assert_eq!(trigger.next(&stop).await, Some(Pass::Full));
        // A change after the pass began is still compared on its own.
        writer.apply(kube::runtime::watcher::Event::Apply(node("late")));
        assert_eq!(trigger.next(&stop).await, Some(Pass::Objects(["late".to_string()].into())));
        assert_eq!(trigger.next(&stop).await, Some(Pass::Full));
        assert!(started.elapsed() >= Duration::from_secs(60), "no second pass over the first list");
    }
}
