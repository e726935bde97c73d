//! Which pending events wait, which fold into a series and which are dropped: pure, no I/O.
//!
//! Entries are keyed by (object, reason). Rules, in order:
//! 1. An event whose object already has one with the same reason pending folds into it (its
//!    series count grows, the newest payload wins). Nothing is lost.
//! 2. Otherwise it takes a new slot while fewer than `capacity` are pending.
//! 3. When full, it takes the place of its own object's newest pending event (that older
//!    event of the same object is dropped as superseded; the object keeps its latest).
//! 4. Else it takes the slot of the oldest pending event that is not its object's latest.
//! 5. Only when every pending event is the latest of its object is the new one dropped.
//!
//! So an object's latest event is never dropped for another object's older one, and with
//! `capacity` at least the number of objects that have events pending, every object's final
//! event is written.
//!
//! Memory: at most `capacity` entries in place (slots freed again once the queue empties), one
//! map entry per object with events pending (its newest; its older ones are chained from
//! there), and two id queues compacted to at most `2 * capacity + COMPACT_SLACK` ids each.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::time::Duration;

/// Stale ids tolerated in the id queues before they are compacted.
const COMPACT_SLACK: usize = 64;

/// How deep [`PendingQueue::pop_distinct`] looks, per event it may take.
pub const LOOKAHEAD: usize = 8;

/// What happened to an event offered to the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Queued in a free slot.
    Queued,
    /// Folded into a pending event of the same object and reason (a series).
    Aggregated,
    /// Queued in place of an older pending event, which is dropped with the given number of
    /// occurrences.
    Superseded(u32),
    /// Not queued (this many occurrences): every pending event is the latest of its object.
    Dropped(u32),
}

/// A payload that can take in an older occurrence of the same event when the two fold into
/// one series (for example to keep the first occurrence's time).
pub trait Occurrence {
    /// `self` is the newer occurrence; keep from `older` what the series needs.
    fn absorb_older(&mut self, older: Self);
}

/// An event handed out for writing: the payload and how many occurrences it stands for.
#[derive(Debug, PartialEq, Eq)]
pub struct Popped<T> {
    /// The newest payload of the folded occurrences.
    pub item: T,
    /// Occurrences folded together (at least 1).
    pub count: u32,
}

/// Slot bits of an id: the low bits say where its entry is, the rest is a sequence number
/// that makes ids unique across a slot's reuse.
const SLOT_BITS: u32 = 24;
const SLOT_MASK: u64 = (1 << SLOT_BITS) - 1;
/// Largest capacity: every slot index fits in [`SLOT_BITS`] (and none makes [`NONE`]).
const MAX_CAPACITY: usize = (1 << SLOT_BITS) - 1;
/// No id: the end of an object's chain.
const NONE: u64 = u64::MAX;
/// Slots kept allocated once the queue is empty again (more are freed).
const IDLE_SLOTS: usize = 1024;

struct Entry<O, T> {
    id: u64,
    object: O,
    /// The reason's hash: a copy of the text per pending event is not needed to compare.
    reason: u64,
    /// The object's pending event before this one, or [`NONE`]: an object's pending events
    /// are a chain from its newest (in `objects`), so an object costs one map entry and no
    /// list of its own.
    older: u64,
    item: T,
    count: u32,
}

/// A reason's 64-bit hash (fixed keys): two reasons of one object collide with probability
/// ~2^-64, and would then fold into one series.
fn reason_key(reason: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::hash::DefaultHasher::new();
    reason.hash(&mut hasher);
    hasher.finish()
}

/// Bounded pending events; see the module documentation for the rules.
pub struct PendingQueue<O, T> {
    capacity: usize,
    /// The next id's sequence number.
    next: u64,
    /// Entries in place, addressed by their id's slot bits: no allocation or map entry per
    /// event (a boxed entry in a map cost about 0.2 KiB more per pending event).
    slots: Vec<Option<Entry<O, T>>>,
    /// Slots free for reuse.
    free: Vec<u32>,
    len: usize,
    /// Arrival order; ids no longer pending are skipped.
    order: VecDeque<u64>,
    /// Each object's newest pending id (the head of its chain).
    objects: HashMap<O, u64>,
    /// Ids that were not their object's newest when a newer one arrived: eviction candidates.
    evictable: VecDeque<u64>,
}

/// The entry `id` names, if it is still pending.
fn slot_of<O, T>(slots: &[Option<Entry<O, T>>], id: u64) -> Option<&Entry<O, T>> {
    slots.get((id & SLOT_MASK) as usize)?.as_ref().filter(|e| e.id == id)
}

fn slot_of_mut<O, T>(slots: &mut [Option<Entry<O, T>>], id: u64) -> Option<&mut Entry<O, T>> {
    slots.get_mut((id & SLOT_MASK) as usize)?.as_mut().filter(|e| e.id == id)
}

impl<O: Clone + Eq + Hash, T: Occurrence> PendingQueue<O, T> {
    /// An empty queue holding at most `capacity` (at least 1) events.
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.clamp(1, MAX_CAPACITY),
            next: 0,
            slots: Vec::new(),
            free: Vec::new(),
            len: 0,
            order: VecDeque::new(),
            objects: HashMap::new(),
            evictable: VecDeque::new(),
        }
    }

    /// Events pending.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is pending.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn get(&self, id: u64) -> Option<&Entry<O, T>> {
        slot_of(&self.slots, id)
    }

    fn get_mut(&mut self, id: u64) -> Option<&mut Entry<O, T>> {
        slot_of_mut(&mut self.slots, id)
    }

    /// The pending event of `object` with reason hash `key`, searching from the newest.
    fn find(&self, object: &O, key: u64) -> Option<u64> {
        let mut id = self.objects.get(object).copied().unwrap_or(NONE);
        while let Some(e) = self.get(id) {
            if e.reason == key {
                return Some(id);
            }
            id = e.older;
        }
        None
    }

    /// Offer one event (standing for `count` occurrences) of `object` with `reason`.
    pub fn push(&mut self, object: O, reason: &str, item: T, count: u32) -> Admission {
        let count = count.max(1);
        let key = reason_key(reason);
        if let Some(&newest) = self.objects.get(&object) {
            if let Some(id) = self.find(&object, key) {
                if id == newest {
                    if let Some(e) = self.get_mut(id) {
                        e.count = e.count.saturating_add(count);
                        let older = std::mem::replace(&mut e.item, item);
                        e.item.absorb_older(older);
                    }
                } else {
                    // The same reason is pending behind other events of this object: move it
                    // after them so the object's events stay in the order they happened.
                    let mut item = item;
                    let mut count = count;
                    if let Some(older) = self.remove(id) {
                        item.absorb_older(older.item);
                        count = count.saturating_add(older.count);
                    }
                    self.append(object, key, item, count);
                }
                return Admission::Aggregated;
            }
            if self.len >= self.capacity
                && let Some(e) = self.get_mut(newest)
            {
                // Takes the newest's place: same id, place in the arrival order and chain.
                let lost = e.count;
                e.reason = key;
                e.item = item;
                e.count = count;
                return Admission::Superseded(lost);
            }
        }
        if self.len < self.capacity {
            self.append(object, key, item, count);
            return Admission::Queued;
        }
        match self.next_evictable() {
            Some(victim) => {
                let lost = self.remove(victim).map_or(0, |e| e.count);
                self.append(object, key, item, count);
                Admission::Superseded(lost)
            }
            None => Admission::Dropped(count),
        }
    }

    /// Offer again an event whose write failed. A pending repeat of it (newer) absorbs its
    /// count; a different pending event of its object is that object's latest, so this one is
    /// dropped as superseded.
    pub fn retry(&mut self, object: O, reason: &str, item: T, count: u32) -> Admission {
        if self.objects.contains_key(&object) {
            let same = self.find(&object, reason_key(reason));
            return match same.and_then(|id| self.get_mut(id)) {
                Some(e) => {
                    e.count = e.count.saturating_add(count.max(1));
                    e.item.absorb_older(item);
                    Admission::Aggregated
                }
                None => Admission::Superseded(count.max(1)),
            };
        }
        self.push(object, reason, item, count)
    }

    /// The oldest pending event.
    pub fn pop(&mut self) -> Option<Popped<T>> {
        while let Some(id) = self.order.pop_front() {
            if let Some(e) = self.remove(id) {
                return Some(Popped { item: e.item, count: e.count });
            }
        }
        None
    }

    /// The oldest pending events, up to `max`, each the oldest of a different object: they
    /// can be written at the same time without reordering any object's events. Looks at most
    /// [`LOOKAHEAD`] × `max` pending events deep.
    pub fn pop_distinct(&mut self, max: usize) -> Vec<Popped<T>> {
        let mut objects: Vec<&O> = Vec::new();
        let mut ids = Vec::new();
        let mut looked = 0;
        for id in &self.order {
            if ids.len() >= max || looked >= LOOKAHEAD * max {
                break;
            }
            let Some(e) = slot_of(&self.slots, *id) else { continue };
            looked += 1;
            if !objects.contains(&&e.object) {
                objects.push(&e.object);
                ids.push(*id);
            }
        }
        let popped = ids.into_iter().filter_map(|id| self.remove(id)).map(|e| Popped { item: e.item, count: e.count });
        let popped = popped.collect();
        while self.order.front().is_some_and(|&id| self.get(id).is_none()) {
            self.order.pop_front();
        }
        popped
    }

    fn append(&mut self, object: O, reason: u64, item: T, count: u32) {
        let slot = match self.free.pop() {
            Some(slot) => slot as usize,
            None => {
                self.slots.push(None);
                self.slots.len() - 1
            }
        };
        let id = (self.next << SLOT_BITS) | slot as u64;
        self.next = self.next.wrapping_add(1);
        let older = self.objects.insert(object.clone(), id).unwrap_or(NONE);
        if older != NONE {
            self.evictable.push_back(older);
        }
        self.order.push_back(id);
        self.slots[slot] = Some(Entry { id, object, reason, older, item, count });
        self.len += 1;
        self.compact();
    }

    fn remove(&mut self, id: u64) -> Option<Entry<O, T>> {
        let slot = (id & SLOT_MASK) as usize;
        let e = self.slots.get_mut(slot)?.take_if(|e| e.id == id)?;
        self.free.push(slot as u32);
        self.len -= 1;
        // Unlink it from its object's chain.
        if let Some(newest) = self.objects.get_mut(&e.object) {
            if *newest == id {
                if e.older == NONE {
                    self.objects.remove(&e.object);
                } else {
                    *newest = e.older;
                }
            } else {
                let mut at = *newest;
                while let Some(next) = slot_of_mut(&mut self.slots, at) {
                    if next.older == id {
                        next.older = e.older;
                        break;
                    }
                    at = next.older;
                }
            }
        }
        if self.len == 0 && self.slots.len() > IDLE_SLOTS {
            // Back to idle after a burst: give the slots back (ids stay unique by sequence).
            self.slots = Vec::new();
            self.free = Vec::new();
        }
        Some(e)
    }

    fn next_evictable(&mut self) -> Option<u64> {
        while let Some(id) = self.evictable.pop_front() {
            let Some(e) = self.get(id) else { continue };
            if self.objects.get(&e.object) != Some(&id) {
                return Some(id);
            }
        }
        None
    }

    fn compact(&mut self) {
        let limit = 2 * self.capacity + COMPACT_SLACK;
        if self.order.len() > limit {
            let slots = &self.slots;
            self.order.retain(|&id| slot_of(slots, id).is_some());
        }
        if self.evictable.len() > limit {
            let (slots, objects) = (&self.slots, &self.objects);
            self.evictable.retain(|&id| slot_of(slots, id).is_some_and(|e| objects.get(&e.object) != Some(&id)));
        }
    }
}

/// The writer's pause before its next write: at least `interval` (the rate cap), longer after
/// failures (doubling from `MIN_BACKOFF` to `MAX_BACKOFF`), back to `interval` after a success.
#[derive(Debug, Clone)]
pub struct Pace {
    interval: Duration,
    backoff: Duration,
}

/// First pause after a failed write.
pub const MIN_BACKOFF: Duration = Duration::from_millis(100);
/// Longest pause after repeated failures.
pub const MAX_BACKOFF: Duration = Duration::from_secs(5);

impl Pace {
    /// A pace of at most `per_second` writes (at least 1).
    pub fn new(per_second: u32) -> Self {
        Self { interval: Duration::from_secs(1) / per_second.max(1), backoff: Duration::ZERO }
    }

    /// A write succeeded.
    pub fn succeeded(&mut self) {
        self.backoff = Duration::ZERO;
    }

    /// A write failed because the server was overloaded or unreachable.
    pub fn failed(&mut self) {
        self.backoff = (self.backoff * 2).clamp(MIN_BACKOFF, MAX_BACKOFF);
    }

    /// Time from the start of `writes` writes sent together to the start of the next ones:
    /// the rate cap for all of them, or the backoff after a failure.
    pub fn pause_after(&self, writes: usize) -> Duration {
        let writes = u32::try_from(writes.max(1)).unwrap_or(u32::MAX);
        self.interval.saturating_mul(writes).max(self.backoff)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Q = PendingQueue<String, String>;

    /// Test payloads: the newest text wins.
    impl Occurrence for String {
        fn absorb_older(&mut self, _older: Self) {}
    }

    fn drain(q: &mut Q) -> Vec<(String, u32)> {
        std::iter::from_fn(|| q.pop()).map(|p| (p.item, p.count)).collect()
    }

    #[test]
    fn a_batch_takes_the_oldest_event_of_distinct_objects_and_leaves_their_later_ones_in_order() {
        let mut q = Q::new(10);
        for (object, reason) in [("a", "r1"), ("a", "r2"), ("b", "r1"), ("a", "r3"), ("c", "r1")] {
            q.push(object.to_string(), reason, format!("{object}/{reason}"), 1);
        }
        let first: Vec<_> = q.pop_distinct(4).into_iter().map(|p| p.item).collect();
        assert_eq!(first, ["a/r1", "b/r1", "c/r1"], "a's later events wait for its first");
        let second: Vec<_> = q.pop_distinct(4).into_iter().map(|p| p.item).collect();
        assert_eq!(second, ["a/r2"]);
        assert_eq!(drain(&mut q), [("a/r3".to_string(), 1)]);
        for object in ["x", "y", "z"] {
            q.push(object.to_string(), "r", object.to_string(), 1);
        }
        let capped: Vec<_> = q.pop_distinct(2).into_iter().map(|p| p.item).collect();
        assert_eq!(capped, ["x", "y"], "at most max");
    }

    #[test]
    fn a_batch_looks_only_a_bounded_depth_into_the_queue() {
        let mut q = Q::new(100);
        for i in 0..LOOKAHEAD {
            q.push("a".to_string(), &format!("r{i}"), format!("a/{i}"), 1);
        }
        q.push("b".to_string(), "r", "b".to_string(), 1);
        let batch: Vec<_> = q.pop_distinct(1).into_iter().map(|p| p.item).collect();
        assert_eq!(batch, ["a/0"]);
        let batch: Vec<_> = q.pop_distinct(1).into_iter().map(|p| p.item).collect();
        assert_eq!(batch, ["a/1"], "b lies beyond the first LOOKAHEAD events: not reached");
    }

    #[test]
    fn writes_sent_together_pause_for_all_of_them_or_for_the_backoff() {
        let mut pace = Pace::new(500);
        assert_eq!(pace.pause_after(4), Duration::from_millis(8));
        assert_eq!(pace.pause_after(0), Duration::from_millis(2), "counted as one");
        pace.failed();
        assert_eq!(pace.pause_after(4), MIN_BACKOFF);
    }

    #[test]
    fn under_overload_every_object_keeps_its_final_event() {
        // 1,000 objects, three events each, interleaved as 1,000 parallel reconciles emit
        // them, into a queue that holds half of the 3,000 events.
        let mut q = Q::new(1_500);
        let reasons = ["EnsuringLoadBalancer", "SyncLoadBalancerFailed", "EnsuredLoadBalancer"];
        let mut admissions = Vec::new();
        for reason in reasons {
            for object in 0..1_000 {
                admissions.push(q.push(format!("svc-{object}"), reason, format!("svc-{object}/{reason}"), 1));
            }
        }
        assert_eq!(q.len(), 1_500);
        let written = drain(&mut q);
        let finals: Vec<_> = written.iter().filter(|(item, _)| item.ends_with("/EnsuredLoadBalancer")).collect();
        assert_eq!(finals.len(), 1_000, "every object's final event is kept");
        let dropped: u32 = admissions
            .iter()
            .map(|a| match a {
                Admission::Superseded(n) | Admission::Dropped(n) => *n,
                _ => 0,
            })
            .sum();
        let written: u32 = written.iter().map(|(_, count)| count).sum();
        assert_eq!(written + dropped, 3_000, "each event is either written or counted as dropped");
        assert!(!admissions.iter().any(|a| matches!(a, Admission::Dropped(_))), "nothing dropped while objects fit");
    }

    #[test]
    fn an_objects_latest_event_is_not_dropped_for_another_objects_older_one() {
        let mut q = Q::new(3);
        assert_eq!(q.push("a".into(), "Ensuring", "a1".into(), 1), Admission::Queued);
        assert_eq!(q.push("b".into(), "Ensuring", "b1".into(), 1), Admission::Queued);
        assert_eq!(q.push("a".into(), "Ensured", "a2".into(), 1), Admission::Queued);
        // Full. A new object takes the slot of "a"'s superseded first event, not "b"'s only one.
        assert_eq!(q.push("c".into(), "Ensuring", "c1".into(), 1), Admission::Superseded(1));
        // Full of latest events: "b"'s newer event replaces its own older one.
        assert_eq!(q.push("b".into(), "Ensured", "b2".into(), 1), Admission::Superseded(1));
        // A fourth object cannot take anyone's latest event: it is the one dropped.
        assert_eq!(q.push("d".into(), "Ensuring", "d1".into(), 1), Admission::Dropped(1));
        assert_eq!(drain(&mut q), [("b2".to_string(), 1), ("a2".to_string(), 1), ("c1".to_string(), 1)]);
    }

    #[test]
    fn repeats_fold_into_a_series_count_with_the_newest_payload() {
        let mut q = Q::new(10);
        for attempt in 1..=5 {
            let a = q.push("a".into(), "SyncLoadBalancerFailed", format!("try {attempt}"), 1);
            assert_eq!(a, if attempt == 1 { Admission::Queued } else { Admission::Aggregated });
        }
        assert_eq!(q.len(), 1);
        assert_eq!(drain(&mut q), [("try 5".to_string(), 5)]);
    }

    #[test]
    fn a_repeat_behind_other_events_of_its_object_moves_after_them() {
        let mut q = Q::new(10);
        q.push("a".into(), "Ensuring", "ensuring 1".into(), 1);
        q.push("a".into(), "Ensured", "ensured".into(), 1);
        q.push("b".into(), "Ensuring", "b".into(), 1);
        assert_eq!(q.push("a".into(), "Ensuring", "ensuring 2".into(), 1), Admission::Aggregated);
        assert_eq!(
            drain(&mut q),
            [("ensured".to_string(), 1), ("b".to_string(), 1), ("ensuring 2".to_string(), 2)],
            "the object's last event is the newest one"
        );
    }

    #[test]
    fn a_failed_write_is_not_retried_over_a_newer_event_of_its_object() {
        let mut q = Q::new(10);
        q.push("a".into(), "Ensured", "ensured".into(), 1);
        assert_eq!(q.retry("a".into(), "Ensuring", "ensuring".into(), 4), Admission::Superseded(4));
        assert_eq!(q.retry("a".into(), "Ensured", "ensured earlier".into(), 2), Admission::Aggregated);
        assert_eq!(q.retry("b".into(), "Ensuring", "b".into(), 1), Admission::Queued);
        assert_eq!(
            drain(&mut q),
            [("ensured".to_string(), 3), ("b".to_string(), 1)],
            "the pending (newer) note is kept, the failed occurrences counted"
        );
    }

    #[test]
    fn repeats_from_the_middle_of_an_objects_events_keep_them_in_the_order_they_last_happened() {
        let mut q = Q::new(10);
        for reason in ["A", "B", "C", "D"] {
            q.push("o".into(), reason, reason.into(), 1);
        }
        // B leaves the middle, then A must still be found behind it, then C and D.
        for reason in ["B", "A", "C", "D"] {
            assert_eq!(q.push("o".into(), reason, reason.into(), 1), Admission::Aggregated, "{reason}");
        }
        assert_eq!(q.len(), 4);
        let order: Vec<_> = drain(&mut q).into_iter().collect();
        let want = [("B", 2), ("A", 2), ("C", 2), ("D", 2)].map(|(r, c)| (r.to_string(), c));
        assert_eq!(order, want);
        assert!(q.objects.is_empty(), "a drained object leaves no index entry");
    }

    #[test]
    fn a_drained_burst_gives_its_slots_back_and_reused_slots_never_answer_for_old_events() {
        let mut q = Q::new(4 * IDLE_SLOTS);
        for round in 0..3 {
            for i in 0..2 * IDLE_SLOTS {
                q.push(format!("o{i}"), "A", format!("{round}/o{i}/A"), 1);
                q.push(format!("o{i}"), "B", format!("{round}/o{i}/B"), 1);
            }
            let mut written = Vec::new();
            while !q.is_empty() {
                written.extend(q.pop_distinct(16).into_iter().map(|p| p.item));
            }
            assert_eq!(written.len(), 4 * IDLE_SLOTS, "every event once, none twice (round {round})");
            assert!(written.iter().all(|w| w.starts_with(&format!("{round}/"))), "no event of an earlier round");
            let a = written.iter().position(|w| w == &format!("{round}/o7/A"));
            let b = written.iter().position(|w| w == &format!("{round}/o7/B"));
            assert!(a < b, "an object's events in order");
            assert!(q.slots.is_empty() && q.objects.is_empty(), "idle again: slots released");
        }
    }

    #[test]
    fn sustained_overload_keeps_memory_bounded() {
        let mut q = Q::new(8);
        for round in 0..10_000 {
            q.push(format!("o{}", round % 5), if round % 2 == 0 { "A" } else { "B" }, String::new(), 1);
            q.push(format!("n{round}"), "A", String::new(), 1);
            if round % 3 == 0 {
                q.pop();
            }
        }
        assert!(q.len() <= 8);
        assert!(q.order.len() <= 2 * 8 + COMPACT_SLACK, "{}", q.order.len());
        assert!(q.evictable.len() <= 2 * 8 + COMPACT_SLACK, "{}", q.evictable.len());
        assert!(q.objects.len() <= 8);
    }

    #[test]
    fn pace_backs_off_on_failures_and_recovers_on_success() {
        let mut pace = Pace::new(500);
        assert_eq!(pace.pause_after(1), Duration::from_millis(2));
        pace.failed();
        assert_eq!(pace.pause_after(1), MIN_BACKOFF);
        pace.failed();
        assert_eq!(pace.pause_after(1), MIN_BACKOFF * 2);
        for _ in 0..20 {
            pace.failed();
        }
        assert_eq!(pace.pause_after(1), MAX_BACKOFF);
        pace.succeeded();
        assert_eq!(pace.pause_after(1), Duration::from_millis(2));
    }
}
