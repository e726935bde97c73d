//! The UDP proxy: a session per client address, each with its own connected upstream socket,
//! so replies find their client; sessions expire when idle. A listener keeps at most
//! `max_udp_sessions_per_listener` sessions and, when full, evicts its least recently active
//! one for a new client (a spoofed flood recycles the flooded listener's sessions, nothing
//! else); a Service keeps at most `max_udp_sessions_per_service` over all its listeners, and
//! the data path as a whole at most `max_udp_sessions`.
//!
//! Memory per session is a task and a socket, not a buffer: replies are read into a buffer
//! per worker thread and sent on at once without waiting (see [`relay_replies`]).

use std::cell::RefCell;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter;
use tokio::net::UdpSocket;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::config::Protocol;
use super::limits::{Counts, Full, Level, SessionAdmission, SessionTable, Slot, admit, session_admission};
use super::{ActiveGuard, BackendRt, PortShared};

/// The largest datagram forwarded (the UDP maximum).
const MAX_DATAGRAM: usize = 65_535;

thread_local! {
    /// The receive buffer of every reply read on this worker thread: a datagram is read and
    /// sent on without an `.await` in between, so one buffer per thread serves every session.
    static REPLY_BUFFER: RefCell<Vec<u8>> = RefCell::new(vec![0u8; MAX_DATAGRAM]);
}

struct Session {
    upstream: Arc<UdpSocket>,
    backend: Arc<BackendRt>,
    target_port: u16,
    /// Microseconds since the listener started, at the last datagram either way (fine enough
    /// that sessions active one after the other rarely tie for eviction).
    last: Arc<AtomicU64>,
    /// Set when the reply task ended (backend drained, socket error).
    ended: Arc<AtomicBool>,
    _stop: DropGuard,
    _active: ActiveGuard,
    /// The session's place in the listener's and the data path's caps.
    _slot: Slot,
}

pub(super) async fn serve(socket: Arc<UdpSocket>, port: Arc<PortShared>, stop: CancellationToken) {
    let settings = &port.service.settings;
    let idle = settings.udp_idle_timeout.max(Duration::from_millis(10));
    let (listener_cap, service_cap, total_cap) =
        (settings.max_udp_sessions_per_listener, settings.max_udp_sessions_per_service, settings.max_udp_sessions);
    let started = Instant::now();
    let now_us = move || started.elapsed().as_micros() as u64;
    let mut sessions: SessionTable<Session> = SessionTable::default();
    let mut sweep = tokio::time::interval((idle / 2).max(Duration::from_millis(5)));
    // One buffer per listener for what clients send.
    let mut buf = vec![0u8; MAX_DATAGRAM];
    loop {
        let received = tokio::select! {
            _ = stop.cancelled() => return,
            _ = sweep.tick() => {
                let cutoff = now_us().saturating_sub(idle.as_micros() as u64);
                sessions.retain(|s| !s.ended.load(Ordering::Relaxed) && s.last.load(Ordering::Relaxed) >= cutoff);
                continue;
            }
            r = socket.recv_from(&mut buf) => r,
        };
        let (len, client) = match received {
            Ok(r) => r,
            Err(error) => {
                // ICMP errors from earlier sends surface here on some systems; keep serving.
                tracing::trace!(service = %port.service.key, %error, "receive failed");
                continue;
            }
        };
        let target_port = port.target_port.load(Ordering::Relaxed);
        let reusable =
            sessions.get(&client).is_some_and(|s| !s.ended.load(Ordering::Relaxed) && s.target_port == target_port);
        if !reusable {
            sessions.remove(&client);
            let counts = Counts {
                listener: (sessions.len(), listener_cap),
                service: (port.service.service_udp.load(Ordering::Acquire), service_cap),
                total: (port.service.held_udp.load(Ordering::Acquire), total_cap),
            };
            match session_admission(counts) {
                SessionAdmission::Open => {}
                SessionAdmission::EvictOldest => {
                    if sessions.evict_oldest(|s| s.last.load(Ordering::Relaxed)).is_some() {
                        port.service.evicted.inc();
                    }
                }
                SessionAdmission::Refuse => {
                    port.service.full(admit(counts).err().unwrap_or(Full::DataPath)).inc();
                    continue;
                }
            }
            let slot = match Slot::take(
                Level { held: &port.held, cap: listener_cap },
                Level { held: &port.service.service_udp, cap: service_cap },
                Level { held: &port.service.held_udp, cap: total_cap },
            ) {
                Ok(slot) => slot,
                // Another listener took the place freed above.
                Err(full) => {
                    port.service.full(full).inc();
                    continue;
                }
            };
            match open(&socket, &port, client, target_port, now_us(), slot).await {
                Some(session) => {
                    sessions.insert(client, session, now_us());
                }
                None => continue,
            }
        }
        let Some(session) = sessions.get(&client) else { continue };
        session.last.store(now_us(), Ordering::Relaxed);
        if session.upstream.send(&buf[..len]).await.is_ok() {
            session.backend.counters(Protocol::Udp).rx.inc_by(len as u64);
        }
    }
}

async fn open(
    socket: &Arc<UdpSocket>,
    port: &Arc<PortShared>,
    client: SocketAddr,
    target_port: u16,
    now: u64,
    slot: Slot,
) -> Option<Session> {
    let service = &port.service;
    let routing = service.routing();
    if !super::select::source_allowed(&routing.ranges, client.ip()) {
        service.source_refused.inc();
        return None;
    }
    let Some(index) = service.choose(&routing, client.ip(), &[]) else {
        service.no_backend.inc();
        return None;
    };
    let backend = routing.backends[index].clone();
    let local: IpAddr = if backend.ip.is_ipv4() { Ipv4Addr::UNSPECIFIED.into() } else { Ipv6Addr::UNSPECIFIED.into() };
    let upstream = match UdpSocket::bind((local, 0)).await {
        Ok(s) => s,
        Err(error) => {
            tracing::warn!(service = %service.key, %error, "cannot open an upstream UDP socket");
            return None;
        }
    };
    if let Err(error) = upstream.connect((backend.ip, target_port)).await {
        tracing::debug!(service = %service.key, backend = %backend.name, %error, "cannot reach backend");
        return None;
    }
    let upstream = Arc::new(upstream);
    let stop = port.drain.child_token();
    let last = Arc::new(AtomicU64::new(now));
    let ended = Arc::new(AtomicBool::new(false));
    let session = Session {
        upstream: upstream.clone(),
        backend: backend.clone(),
        target_port,
        last: last.clone(),
        ended: ended.clone(),
        _stop: stop.clone().drop_guard(),
        _active: ActiveGuard::new(backend.clone(), Protocol::Udp),
        _slot: slot,
    };
    let reply = Reply {
        upstream,
        listener: socket.clone(),
        client,
        tx: backend.counters(Protocol::Udp).tx.clone(),
        last,
        started_us: now,
        opened: Instant::now(),
    };
    let drain = backend.drain.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = drain.cancelled() => {}
            _ = relay_replies(&reply) => {}
        }
        ended.store(true, Ordering::Relaxed);
    });
    Some(session)
}

/// One session's way back: backend → listener socket → client.
struct Reply {
    upstream: Arc<UdpSocket>,
    listener: Arc<UdpSocket>,
    client: SocketAddr,
    tx: Counter,
    last: Arc<AtomicU64>,
    started_us: u64,
    opened: Instant,
}

/// Forward replies until the upstream socket fails (a refused port, as ICMP, on a connected
/// socket: the backend is not listening). Each ready datagram is read into the thread's
/// buffer and sent on with a non-blocking send, without an `.await` in between, so no session
/// owns a 64 KiB buffer; a datagram the listener socket cannot take at once (its send buffer
/// full) is copied out at its own size and sent with a wait, as the per-session buffer did.
async fn relay_replies(reply: &Reply) {
    loop {
        if reply.upstream.readable().await.is_err() {
            return;
        }
        loop {
            let forwarded: io::Result<Forwarded> = REPLY_BUFFER.with(|cell| {
                let mut buf = cell.borrow_mut();
                let len = reply.upstream.try_recv(&mut buf)?;
                match reply.listener.try_send_to(&buf[..len], reply.client) {
                    Ok(_) => Ok(Forwarded::Sent(len)),
                    Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                        Ok(Forwarded::Pending(buf[..len].to_vec()))
                    }
                    // The client is unreachable for now (ICMP on the listener): drop the datagram.
                    Err(_) => Ok(Forwarded::Dropped),
                }
            });
            match forwarded {
                Ok(Forwarded::Sent(len)) => reply.delivered(len),
                Ok(Forwarded::Pending(datagram)) => {
                    if reply.listener.send_to(&datagram, reply.client).await.is_ok() {
                        reply.delivered(datagram.len());
                    }
                }
                Ok(Forwarded::Dropped) => {}
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => break,
                Err(_) => return,
            }
        }
    }
}

/// What became of one reply datagram.
enum Forwarded {
    /// Sent on, this many bytes.
    Sent(usize),
    /// Read, but the listener socket would block: send this copy with a wait.
    Pending(Vec<u8>),
    /// The send failed for another reason.
    Dropped,
}

impl Reply {
    fn delivered(&self, len: usize) {
        self.last.store(self.started_us + self.opened.elapsed().as_micros() as u64, Ordering::Relaxed);
        self.tx.inc_by(len as u64);
    }
}
