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
    /// The Service (all its listeners together) holds its share of the data path.
    Service,
    /// The whole data path holds its cap.
    DataPath,
}

impl Full {
    /// The `reason` label of the refused-connections metric.
    pub fn reason(self) -> &'static str {
        match self {
            Full::Listener => "listener_limit",
            Full::Service => "service_limit",
            Full::DataPath => "total_limit",
        }
    }
}

/// What one listener, its Service and the whole data path hold, and their caps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    /// Held by the listener, and its cap.
    pub listener: (usize, usize),
    /// Held by the listener's Service (every listener of it), and its share.
    pub service: (usize, usize),
    /// Held by the data path, and its cap.
    pub total: (usize, usize),
}

/// Pure: whether one more fits, given what the listener, its Service and the data path hold.
pub fn admit(counts: Counts) -> Result<(), Full> {
    let full = |(held, cap): (usize, usize)| held >= cap;
    if full(counts.listener) {
        Err(Full::Listener)
    } else if full(counts.service) {
        Err(Full::Service)
    } else if full(counts.total) {
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
/// Service's); when its Service's share or the whole data path is full, a listener with
/// sessions recycles one of its own and one without is refused.
pub fn session_admission(counts: Counts) -> SessionAdmission {
    match admit(counts) {
        Ok(()) => SessionAdmission::Open,
        Err(_) if counts.listener.0 > 0 => SessionAdmission::EvictOldest,
        Err(_) => SessionAdmission::Refuse,
    }
}

/// One level of the caps a [`Slot`] is taken in: a shared count and its cap.
#[derive(Debug, Clone, Copy)]
pub struct Level<'a> {
    /// The count.
    pub held: &'a Arc<AtomicUsize>,
    /// Its cap.
    pub cap: usize,
}

/// A place taken in a listener's, its Service's and the data path's counts, given back when
/// dropped.
#[derive(Debug)]
pub struct Slot {
    listener: Arc<AtomicUsize>,
    service: Arc<AtomicUsize>,
    total: Arc<AtomicUsize>,
}

impl Slot {
    /// Take a place if every cap allows. Safe against concurrent takers, and a count never
    /// reads above its cap, not even for an instant: each is raised only while below its cap,
    /// so a taker that will be refused never makes another listener (or a reader) see a full
    /// count.
    pub fn take(listener: Level<'_>, service: Level<'_>, total: Level<'_>) -> Result<Slot, Full> {
        raise_below(listener.held, listener.cap).map_err(|_| Full::Listener)?;
        if raise_below(service.held, service.cap).is_err() {
            listener.held.fetch_sub(1, Ordering::AcqRel);
            return Err(Full::Service);
        }
        if raise_below(total.held, total.cap).is_err() {
            service.held.fetch_sub(1, Ordering::AcqRel);
            listener.held.fetch_sub(1, Ordering::AcqRel);
            return Err(Full::DataPath);
        }
        Ok(Slot { listener: listener.held.clone(), service: service.held.clone(), total: total.held.clone() })
    }
}

/// Add one to `count` if it is below `cap` (the same rule as [`admit`]), atomically.
fn raise_below(count: &AtomicUsize, cap: usize) -> Result<usize, usize> {
    count.fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| (held < cap).then_some(held + 1))
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.listener.fetch_sub(1, Ordering::AcqRel);
        self.service.fetch_sub(1, Ordering::AcqRel);
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

    fn counts(listener: (usize, usize), service: (usize, usize), total: (usize, usize)) -> Counts {
        Counts { listener, service, total }
    }

    #[test]
    fn the_listener_cap_is_checked_before_the_services_share_and_the_total() {
        assert_eq!(admit(counts((0, 1), (0, 1), (0, 1))), Ok(()));
        assert_eq!(admit(counts((1, 1), (1, 10), (1, 10))), Err(Full::Listener));
        assert_eq!(admit(counts((1, 2), (3, 3), (3, 10))), Err(Full::Service), "the Service's listeners together");
        assert_eq!(admit(counts((1, 2), (1, 5), (10, 10))), Err(Full::DataPath));
        assert_eq!(admit(counts((5, 5), (5, 5), (10, 10))), Err(Full::Listener));
        assert_eq!(Full::Listener.reason(), "listener_limit");
        assert_eq!(Full::Service.reason(), "service_limit");
        assert_eq!(Full::DataPath.reason(), "total_limit");
    }

    #[test]
    fn a_full_listener_evicts_its_oldest_session_and_an_empty_one_is_refused_when_the_total_is_full() {
        assert_eq!(session_admission(counts((3, 4), (3, 50), (3, 100))), SessionAdmission::Open);
        assert_eq!(session_admission(counts((4, 4), (4, 50), (4, 100))), SessionAdmission::EvictOldest);
        let total_full = counts((2, 4), (2, 50), (100, 100));
        assert_eq!(session_admission(total_full), SessionAdmission::EvictOldest, "total full: recycle its own");
        let nothing = counts((0, 4), (0, 50), (100, 100));
        assert_eq!(session_admission(nothing), SessionAdmission::Refuse, "nothing of its own to give back");
        let share_full = counts((0, 4), (50, 50), (60, 100));
        assert_eq!(session_admission(share_full), SessionAdmission::Refuse, "its Service's share is taken");
        assert_eq!(session_admission(counts((1, 4), (50, 50), (60, 100))), SessionAdmission::EvictOldest);
    }

    fn level(held: &Arc<AtomicUsize>, cap: usize) -> Level<'_> {
        Level { held, cap }
    }

    #[test]
    fn slots_hold_every_count_and_give_them_back_when_dropped() {
        let listener = Arc::new(AtomicUsize::new(0));
        let other = Arc::new(AtomicUsize::new(0));
        let third = Arc::new(AtomicUsize::new(0));
        let service = Arc::new(AtomicUsize::new(0));
        let neighbour = Arc::new(AtomicUsize::new(0));
        let total = Arc::new(AtomicUsize::new(0));
        let take = |l: &Arc<AtomicUsize>, s: &Arc<AtomicUsize>| Slot::take(level(l, 2), level(s, 3), level(&total, 4));
        let a = take(&listener, &service).expect("room");
        let b = take(&listener, &service).expect("room");
        assert_eq!(take(&listener, &service).unwrap_err(), Full::Listener);
        let c = take(&other, &service).expect("another listener of the Service still fits");
        assert_eq!(take(&other, &service).unwrap_err(), Full::Service, "the Service holds its share");
        let d = take(&third, &neighbour).expect("another Service still fits");
        assert_eq!(take(&third, &neighbour).unwrap_err(), Full::DataPath);
        let held = |c: &Arc<AtomicUsize>| c.load(Ordering::SeqCst);
        assert_eq!(
            (held(&listener), held(&other), held(&service), held(&total)),
            (2, 1, 3, 4),
            "refusals take nothing"
        );
        assert_eq!((held(&third), held(&neighbour)), (1, 1));
        drop((a, b, c, d));
        for count in [&listener, &other, &third, &service, &neighbour, &total] {
            assert_eq!(held(count), 0);
        }
    }

    #[test]
    fn concurrent_takers_never_push_a_count_above_its_cap() {
        let (listener, total) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let service = Arc::new(AtomicUsize::new(0));
        let (cap, service_cap, total_cap) = (8, 10, 12);
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
                let (listener, service, total) = (listener.clone(), service.clone(), total.clone());
                std::thread::spawn(move || {
                    let (mut held, mut refused) = (Vec::new(), 0);
                    for round in 0..20_000 {
                        match Slot::take(level(&listener, cap), level(&service, service_cap), level(&total, total_cap))
                        {
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
