//! What a flood may take: connection and session caps, the UDP session table that evicts the
//! least recently active session, and TCP idle detection. Decisions here are pure (no sockets,
//! no clocks of their own); the TCP and UDP proxies act on them.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Which cap refused a new connection or session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Full {
    /// The listener holds its cap.
    Listener,
    /// The whole data path holds its cap.
    DataPath,
}

impl Full {
    /// The `reason` label of the refused-connections metric.
    pub fn reason(self) -> &'static str {
        match self {
            Full::Listener => "listener_limit",
            Full::DataPath => "total_limit",
        }
    }
}

/// Pure: whether one more fits, given what the listener and the data path hold.
pub fn admit(listener_held: usize, listener_cap: usize, total_held: usize, total_cap: usize) -> Result<(), Full> {
    if listener_held >= listener_cap {
        Err(Full::Listener)
    } else if total_held >= total_cap {
        Err(Full::DataPath)
    } else {
        Ok(())
    }
}

/// What a datagram from a new UDP client leads to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionAdmission {
    /// Open a session.
    Open,
    /// Evict the listener's least recently active session, then open one.
    EvictOldest,
    /// Drop the datagram: the data path is full and this listener has nothing to give back.
    Refuse,
}

/// Pure: a full listener recycles its own oldest session rather than refusing new clients
/// (a flood of spoofed sources then costs its own listener's idle sessions, never another
/// Service's); when the whole data path is full, a listener with sessions recycles one of its
/// own and one without is refused.
pub fn session_admission(
    listener_sessions: usize,
    listener_cap: usize,
    total_sessions: usize,
    total_cap: usize,
) -> SessionAdmission {
    match admit(listener_sessions, listener_cap, total_sessions, total_cap) {
        Ok(()) => SessionAdmission::Open,
        Err(_) if listener_sessions > 0 => SessionAdmission::EvictOldest,
        Err(_) => SessionAdmission::Refuse,
    }
}

/// A place taken in a listener's and the data path's counts, given back when dropped.
#[derive(Debug)]
pub struct Slot {
    listener: Arc<AtomicUsize>,
    total: Arc<AtomicUsize>,
}

impl Slot {
    /// Take a place if both caps allow. Safe against concurrent takers, and a count never reads
    /// above its cap, not even for an instant: each is raised only while below its cap, so a
    /// taker that will be refused never makes another listener (or a reader) see a full count.
    pub fn take(
        listener: &Arc<AtomicUsize>,
        listener_cap: usize,
        total: &Arc<AtomicUsize>,
        total_cap: usize,
    ) -> Result<Slot, Full> {
        raise_below(listener, listener_cap).map_err(|_| Full::Listener)?;
        if raise_below(total, total_cap).is_err() {
            listener.fetch_sub(1, Ordering::AcqRel);
            return Err(Full::DataPath);
        }
        Ok(Slot { listener: listener.clone(), total: total.clone() })
    }
}

/// Add one to `count` if it is below `cap` (the same rule as [`admit`]), atomically.
fn raise_below(count: &AtomicUsize, cap: usize) -> Result<usize, usize> {
    count.fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| (held < cap).then_some(held + 1))
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.listener.fetch_sub(1, Ordering::AcqRel);
        self.total.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Position in the eviction order: (last activity as last indexed, insertion sequence).
type Stamp = (u64, u64);

/// A listener's UDP sessions by client address, ordered by last activity so that the least
/// recently active one is found without a scan.
///
/// Activity is recorded outside the table (an atomic the reply task also writes), so the order
/// is refreshed lazily: [`SessionTable::evict_oldest`] re-files a candidate whose activity moved
/// since it was filed and looks again.
#[derive(Debug)]
pub struct SessionTable<V> {
    entries: HashMap<SocketAddr, (V, Stamp)>,
    order: BTreeMap<Stamp, SocketAddr>,
    sequence: u64,
}

impl<V> Default for SessionTable<V> {
    fn default() -> Self {
        Self { entries: HashMap::new(), order: BTreeMap::new(), sequence: 0 }
    }
}

impl<V> SessionTable<V> {
    /// Sessions held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The session of `client`.
    pub fn get(&self, client: &SocketAddr) -> Option<&V> {
        self.entries.get(client).map(|(v, _)| v)
    }

    fn stamp(&mut self, active: u64) -> Stamp {
        self.sequence += 1;
        (active, self.sequence)
    }

    /// Add (or replace) the session of `client`, last active at `active`; returns a replaced one.
    pub fn insert(&mut self, client: SocketAddr, session: V, active: u64) -> Option<V> {
        let old = self.remove(&client);
        let stamp = self.stamp(active);
        self.order.insert(stamp, client);
        self.entries.insert(client, (session, stamp));
        old
    }

    /// Take out the session of `client`.
    pub fn remove(&mut self, client: &SocketAddr) -> Option<V> {
        let (session, stamp) = self.entries.remove(client)?;
        self.order.remove(&stamp);
        Some(session)
    }

    /// Take out the least recently active session, reading each candidate's current activity
    /// with `active` (a session active since it was filed is re-filed, not evicted).
    pub fn evict_oldest(&mut self, active: impl Fn(&V) -> u64) -> Option<(SocketAddr, V)> {
        // Each session is re-filed at most once per call: its new stamp is its real activity.
        for _ in 0..=self.entries.len() {
            let (&stamp, &client) = self.order.first_key_value()?;
            let now = self.entries.get(&client).map(|(v, _)| active(v)).unwrap_or(stamp.0);
            if now > stamp.0 {
                let fresh = self.stamp(now);
                self.order.remove(&stamp);
                self.order.insert(fresh, client);
                if let Some(entry) = self.entries.get_mut(&client) {
                    entry.1 = fresh;
                }
                continue;
            }
            return self.remove(&client).map(|s| (client, s));
        }
        // Activity kept moving under us: evict the front as filed.
        let (_, client) = self.order.first_key_value().map(|(s, c)| (*s, *c))?;
        self.remove(&client).map(|s| (client, s))
    }

    /// Keep only the sessions `keep` accepts.
    pub fn retain(&mut self, mut keep: impl FnMut(&V) -> bool) {
        let order = &mut self.order;
        self.entries.retain(|_, (session, stamp)| {
            let kept = keep(session);
            if !kept {
                order.remove(stamp);
            }
            kept
        });
    }
}

/// Watches one TCP connection's byte count: idle once it has not moved for the timeout.
#[derive(Debug, Clone, Copy)]
pub struct IdleClock {
    seen: u64,
    since: Instant,
}

impl IdleClock {
    /// A clock that has seen `bytes` at `now`.
    pub fn new(bytes: u64, now: Instant) -> Self {
        Self { seen: bytes, since: now }
    }

    /// Pure: whether no byte moved for `idle`, given the count at `now`.
    pub fn expired(&mut self, bytes: u64, now: Instant, idle: Duration) -> bool {
        if bytes != self.seen {
            self.seen = bytes;
            self.since = now;
            return false;
        }
        now.saturating_duration_since(self.since) >= idle
    }
}

/// How often an idle timeout is checked: a quarter of it (so a connection closes at most a
/// quarter late), at least every 10 ms.
pub fn idle_check_period(idle: Duration) -> Duration {
    (idle / 4).max(Duration::from_millis(10))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    #[test]
    fn the_listener_cap_is_checked_before_the_total() {
        assert_eq!(admit(0, 1, 0, 1), Ok(()));
        assert_eq!(admit(1, 1, 0, 10), Err(Full::Listener));
        assert_eq!(admit(1, 2, 10, 10), Err(Full::DataPath));
        assert_eq!(admit(5, 5, 10, 10), Err(Full::Listener));
        assert_eq!(Full::Listener.reason(), "listener_limit");
        assert_eq!(Full::DataPath.reason(), "total_limit");
    }

    #[test]
    fn a_full_listener_evicts_its_oldest_session_and_an_empty_one_is_refused_when_the_total_is_full() {
        assert_eq!(session_admission(3, 4, 3, 100), SessionAdmission::Open);
        assert_eq!(session_admission(4, 4, 4, 100), SessionAdmission::EvictOldest);
        assert_eq!(session_admission(2, 4, 100, 100), SessionAdmission::EvictOldest, "total full: recycle its own");
        assert_eq!(session_admission(0, 4, 100, 100), SessionAdmission::Refuse, "nothing of its own to give back");
    }

    #[test]
    fn slots_hold_both_counts_and_give_them_back_when_dropped() {
        let listener = Arc::new(AtomicUsize::new(0));
        let other = Arc::new(AtomicUsize::new(0));
        let total = Arc::new(AtomicUsize::new(0));
        let a = Slot::take(&listener, 2, &total, 3).expect("room");
        let b = Slot::take(&listener, 2, &total, 3).expect("room");
        assert_eq!(Slot::take(&listener, 2, &total, 3).unwrap_err(), Full::Listener);
        let c = Slot::take(&other, 2, &total, 3).expect("another listener still fits");
        assert_eq!(Slot::take(&other, 2, &total, 3).unwrap_err(), Full::DataPath);
        assert_eq!((listener.load(Ordering::SeqCst), total.load(Ordering::SeqCst)), (2, 3), "refusals take nothing");
        drop((a, b, c));
        assert_eq!((listener.load(Ordering::SeqCst), other.load(Ordering::SeqCst)), (0, 0));
        assert_eq!(total.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn concurrent_takers_never_push_a_count_above_its_cap() {
        let (listener, total) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (cap, total_cap) = (8, 12);
        let max_seen = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let watcher = {
            let (listener, max_seen, stop) = (listener.clone(), max_seen.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Acquire) {
                    max_seen.fetch_max(listener.load(Ordering::Acquire), Ordering::AcqRel);
                }
            })
        };
        let takers: Vec<_> = (0..4)
            .map(|_| {
                let (listener, total) = (listener.clone(), total.clone());
                std::thread::spawn(move || {
                    let (mut held, mut refused) = (Vec::new(), 0);
                    for round in 0..20_000 {
                        match Slot::take(&listener, cap, &total, total_cap) {
                            Ok(slot) => held.push(slot),
                            Err(_) => refused += 1,
                        }
                        if round % 3 == 0 {
                            held.pop();
                        }
                    }
                    refused
                })
            })
            .collect();
        let refused: usize = takers.into_iter().map(|t| t.join().expect("taker")).sum();
        stop.store(true, Ordering::Release);
        watcher.join().expect("watcher");
        assert!(refused > 0, "the takers pressed against the cap");
        assert!(max_seen.load(Ordering::Acquire) <= cap, "read {} above cap {cap}", max_seen.load(Ordering::Acquire));
        assert_eq!((listener.load(Ordering::Acquire), total.load(Ordering::Acquire)), (0, 0), "every place given back");
    }

    #[test]
    fn the_least_recently_active_session_is_evicted_first() {
        // Each value is its current activity, which may move after filing (reply traffic).
        let mut table: SessionTable<Cell<u64>> = SessionTable::default();
        for (port, active) in [(1, 10), (2, 20), (3, 30)] {
            table.insert(addr(port), Cell::new(active), active);
        }
        // Client 1 got a reply since it was filed: client 2 is now the least recently active.
        table.get(&addr(1)).unwrap().set(40);
        let (evicted, _) = table.evict_oldest(Cell::get).unwrap();
        assert_eq!(evicted, addr(2));
        let (evicted, _) = table.evict_oldest(Cell::get).unwrap();
        assert_eq!(evicted, addr(3));
        let (evicted, _) = table.evict_oldest(Cell::get).unwrap();
        assert_eq!(evicted, addr(1));
        assert!(table.evict_oldest(Cell::get).is_none());
        assert!(table.is_empty());
    }

    #[test]
    fn replacing_removing_and_sweeping_keep_the_order_consistent() {
        let mut table: SessionTable<u64> = SessionTable::default();
        for port in 1..=5u16 {
            table.insert(addr(port), u64::from(port), u64::from(port));
        }
        assert_eq!(table.insert(addr(1), 100, 100), Some(1), "a client's new session replaces its old one");
        assert_eq!(table.remove(&addr(2)), Some(2));
        table.retain(|active| *active != 3);
        assert_eq!(table.len(), 3);
        let order: Vec<SocketAddr> = std::iter::from_fn(|| table.evict_oldest(|v| *v).map(|(a, _)| a)).collect();
        assert_eq!(order, [addr(4), addr(5), addr(1)]);
    }

    #[test]
    fn eviction_ends_even_when_every_session_keeps_moving() {
        let mut table: SessionTable<Cell<u64>> = SessionTable::default();
        for port in 1..=3u16 {
            table.insert(addr(port), Cell::new(0), 0);
        }
        let tick = Cell::new(0u64);
        // Every read reports newer activity than the last: re-filing alone would never end.
        let evicted = table.evict_oldest(|_| {
            tick.set(tick.get() + 1);
            tick.get()
        });
        assert!(evicted.is_some());
        assert_eq!(table.len(), 2);
    }

    #[test]
    fn a_connection_is_idle_only_when_no_byte_moved_for_the_whole_timeout() {
        let start = Instant::now();
        let idle = Duration::from_secs(10);
        let mut clock = IdleClock::new(0, start);
        assert!(!clock.expired(0, start + Duration::from_secs(9), idle));
        assert!(!clock.expired(5, start + Duration::from_secs(11), idle), "bytes moved: the clock restarts");
        assert!(!clock.expired(5, start + Duration::from_secs(20), idle));
        assert!(clock.expired(5, start + Duration::from_secs(21), idle));
        assert_eq!(idle_check_period(idle), Duration::from_millis(2500));
        assert_eq!(idle_check_period(Duration::from_millis(1)), Duration::from_millis(10));
    }
}
