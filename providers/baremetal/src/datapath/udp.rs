//! The UDP proxy: a session per client address, each with its own connected upstream socket,
//! so replies find their client; sessions expire when idle.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::net::UdpSocket;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::config::Protocol;
use super::{ActiveGuard, BackendRt, PortShared};

/// The largest datagram forwarded (the UDP maximum).
const MAX_DATAGRAM: usize = 65_535;

/// Most sessions one listener keeps; new clients beyond it are refused until some expire.
const MAX_SESSIONS: usize = 65_536;

struct Session {
    upstream: Arc<UdpSocket>,
    backend: Arc<BackendRt>,
    target_port: u16,
    /// Milliseconds since the listener started, at the last datagram either way.
    last: Arc<AtomicU64>,
    /// Set when the reply task ended (backend drained, socket error).
    ended: Arc<AtomicBool>,
    _stop: DropGuard,
    _active: ActiveGuard,
}

pub(super) async fn serve(socket: Arc<UdpSocket>, port: Arc<PortShared>, stop: CancellationToken) {
    let idle = port.service.settings.udp_idle_timeout.max(Duration::from_millis(10));
    let started = Instant::now();
    let now_ms = move || started.elapsed().as_millis() as u64;
    let mut sessions: HashMap<SocketAddr, Session> = HashMap::new();
    let mut sweep = tokio::time::interval((idle / 2).max(Duration::from_millis(5)));
    let mut buf = vec![0u8; MAX_DATAGRAM];
    loop {
        let received = tokio::select! {
            _ = stop.cancelled() => return,
            _ = sweep.tick() => {
                let cutoff = now_ms().saturating_sub(idle.as_millis() as u64);
                sessions.retain(|_, s| !s.ended.load(Ordering::Relaxed) && s.last.load(Ordering::Relaxed) >= cutoff);
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
            if sessions.len() >= MAX_SESSIONS {
                port.service.no_backend.inc();
                continue;
            }
            match open(&socket, &port, client, target_port, now_ms()).await {
                Some(session) => {
                    sessions.insert(client, session);
                }
                None => continue,
            }
        }
        let Some(session) = sessions.get(&client) else { continue };
        session.last.store(now_ms(), Ordering::Relaxed);
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
    };
    let listener = socket.clone();
    let drain = backend.drain.clone();
    let tx = backend.counters(Protocol::Udp).tx.clone();
    let started_ms = now;
    let opened = Instant::now();
    tokio::spawn(async move {
        let mut buf = vec![0u8; MAX_DATAGRAM];
        loop {
            let received = tokio::select! {
                _ = stop.cancelled() => break,
                _ = drain.cancelled() => break,
                r = upstream.recv(&mut buf) => r,
            };
            match received {
                Ok(len) => {
                    last.store(started_ms + opened.elapsed().as_millis() as u64, Ordering::Relaxed);
                    if listener.send_to(&buf[..len], client).await.is_ok() {
                        tx.inc_by(len as u64);
                    }
                }
                // A refused port (ICMP) on a connected socket: the backend is not listening.
                Err(_) => break,
            }
        }
        ended.store(true, Ordering::Relaxed);
    });
    Some(session)
}
