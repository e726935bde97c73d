//! The TCP proxy: accept (resetting connections beyond the listener's, the Service's or the data
//! path's cap),
//! filter, pick a backend (trying the next one when a connect fails), send the Service's PROXY
//! protocol header if it has one, then forward both ways
//! (splice on Linux under load, see `splice.rs`; a buffer copy otherwise) until both sides have
//! closed, either fails, no byte moves for the idle timeout, or the connection's drain ends.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use super::config::Protocol;
use super::limits::{IdleClock, Level, Slot, idle_check_period};
use super::meter::Meter;
use super::proxy_protocol::{self, ProxyProtocol};
use super::{ActiveGuard, PortShared};

/// At most one "listener full" warning per listener this often (a flood would repeat it for
/// every connection).
const FULL_WARNING_EVERY: Duration = Duration::from_secs(30);

/// Copy buffer per direction: larger than Tokio's 8 KiB default for loopback-class links,
/// small enough for thousands of connections.
const COPY_BUFFER: usize = 32 * 1024;

pub(super) async fn serve(listener: TcpListener, port: Arc<PortShared>, stop: CancellationToken) {
    let service = &port.service;
    let settings = &service.settings;
    let (listener_cap, service_cap, total_cap) = (
        settings.max_tcp_connections_per_listener,
        settings.max_tcp_connections_per_service,
        settings.max_tcp_connections,
    );
    let mut warned: Option<Instant> = None;
    loop {
        let accepted = tokio::select! {
            _ = stop.cancelled() => return,
            r = listener.accept() => r,
        };
        match accepted {
            Ok((stream, peer)) => match Slot::take(
                Level { held: &port.held, cap: listener_cap },
                Level { held: &service.service_tcp, cap: service_cap },
                Level { held: &service.held_tcp, cap: total_cap },
            ) {
                Ok(slot) => {
                    tokio::spawn(handle(stream, peer, port.clone(), slot));
                }
                Err(full) => {
                    service.full(full).inc();
                    // Accepted and reset rather than left in the backlog: the client learns at
                    // once, the backlog stays free for when a slot opens, and the refusal counts.
                    reset(stream);
                    if warned.is_none_or(|at| at.elapsed() >= FULL_WARNING_EVERY) {
                        warned = Some(Instant::now());
                        tracing::warn!(service = %service.key, limit = full.reason(), listener_cap, service_cap, total_cap, "TCP connection cap reached; new connections are reset");
                    }
                }
            },
            Err(error) => {
                // Usually out of file descriptors: pause instead of spinning.
                tracing::warn!(service = %port.service.key, %error, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Close with a reset (linger 0): no FIN handshake or TIME_WAIT for a refused connection.
fn reset(stream: TcpStream) {
    let _ = socket2::SockRef::from(&stream).set_linger(Some(Duration::ZERO));
}

/// `_slot` holds the connection's place in the caps until it ends.
async fn handle(mut client: TcpStream, peer: SocketAddr, port: Arc<PortShared>, _slot: Slot) {
    let service = &port.service;
    let routing = service.routing();
    if !super::select::source_allowed(&routing.ranges, peer.ip()) {
        service.source_refused.inc();
        tracing::debug!(service = %service.key, client = %peer, "client outside loadBalancerSourceRanges");
        return;
    }
    let target_port = port.target_port.load(Ordering::Relaxed);
    let connect_timeout = service.settings.connect_timeout;
    let mut tried = Vec::new();
    let (backend, mut upstream) = loop {
        let Some(index) = service.choose(&routing, peer.ip(), &tried) else {
            service.no_backend.inc();
            tracing::debug!(service = %service.key, client = %peer, "no backend available");
            return;
        };
        tried.push(index);
        let backend = routing.backends[index].clone();
        let target = SocketAddr::new(backend.ip, target_port);
        match tokio::time::timeout(connect_timeout, TcpStream::connect(target)).await {
            Ok(Ok(stream)) => break (backend, stream),
            Ok(Err(error)) => {
                tracing::debug!(service = %service.key, backend = %backend.name, %error, "connect failed; trying another backend")
            }
            Err(_) => {
                tracing::debug!(service = %service.key, backend = %backend.name, "connect timed out; trying another backend")
            }
        }
    };
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    if let Some(version) = routing.proxy_protocol {
        // Before forwarding starts, so the header precedes every client byte whichever way
        // (copy or splice) the bytes then move.
        if let Err(error) = send_proxy_header(&client, &mut upstream, peer, version).await {
            tracing::debug!(service = %service.key, backend = %backend.name, %error, "cannot send the PROXY protocol header; connection closed");
            return;
        }
    }
    let _active = ActiveGuard::new(backend.clone(), Protocol::Tcp);
    let counters = backend.counters(Protocol::Tcp);
    let open = OpenGuard::new(&service.open_tcp);
    let splice = service.tcp_forwarding.splices(open.others);
    let moved = AtomicU64::new(0);
    let (rx, tx) = (Meter::new(&counters.rx, &moved), Meter::new(&counters.tx, &moved));
    tokio::select! {
        r = forward(&mut client, &mut upstream, splice, &rx, &tx) => {
            if let Err(error) = r {
                tracing::trace!(service = %service.key, %error, "connection ended with an error");
            }
        }
        _ = idle(&moved, service.settings.tcp_idle_timeout) => {
            service.idle_closed.inc();
            tracing::trace!(service = %service.key, client = %peer, "idle timeout; connection closed");
        }
        _ = port.drain.cancelled() => {}
        _ = backend.drain.cancelled() => {}
    }
}

/// Write the PROXY protocol header for `client`, accepted from `peer`, to a freshly connected
/// backend. Its send buffer is empty, so the few bytes go out without waiting on the backend.
async fn send_proxy_header(
    client: &TcpStream,
    upstream: &mut TcpStream,
    peer: SocketAddr,
    version: ProxyProtocol,
) -> io::Result<()> {
    // The accepted socket's own address: the one the client dialled, also under IP_FREEBIND.
    let local = client.local_addr()?;
    upstream.write_all(&proxy_protocol::header(version, peer, local)).await
}

/// Returns once `moved` has not changed for `timeout` (checked every quarter of it).
async fn idle(moved: &AtomicU64, timeout: Duration) {
    let mut clock = IdleClock::new(moved.load(Ordering::Relaxed), Instant::now());
    let mut tick = tokio::time::interval(idle_check_period(timeout));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if clock.expired(moved.load(Ordering::Relaxed), Instant::now(), timeout) {
            return;
        }
    }
}

/// Move bytes both ways until both directions have ended; `rx` counts client → backend, `tx`
/// backend → client.
async fn forward(
    client: &mut TcpStream,
    upstream: &mut TcpStream,
    splice: bool,
    rx: &Meter<'_>,
    tx: &Meter<'_>,
) -> io::Result<()> {
    #[cfg(target_os = "linux")]
    if splice {
        return super::splice::relay(client, upstream, rx, tx).await;
    }
    #[cfg(not(target_os = "linux"))]
    let _ = splice;
    let mut counted = Counted { inner: client, read: rx, written: tx };
    tokio::io::copy_bidirectional_with_sizes(&mut counted, upstream, COPY_BUFFER, COPY_BUFFER).await.map(drop)
}

/// Counts a TCP connection in the data path's open total while it lives.
struct OpenGuard<'a> {
    open: &'a AtomicUsize,
    /// Connections that were open before this one.
    others: usize,
}

impl<'a> OpenGuard<'a> {
    fn new(open: &'a AtomicUsize) -> Self {
        Self { open, others: open.fetch_add(1, Ordering::Relaxed) }
    }
}

impl Drop for OpenGuard<'_> {
    fn drop(&mut self) {
        self.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A stream that counts the bytes read from and written to it as they pass.
struct Counted<'a, S> {
    inner: &'a mut S,
    read: &'a Meter<'a>,
    written: &'a Meter<'a>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<'_, S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let poll = Pin::new(&mut *self.inner).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        if n > 0 {
            self.read.inc_by(n as u64);
        }
        poll
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<'_, S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut *self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = poll {
            self.written.inc_by(n as u64);
        }
        poll
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.inner).poll_shutdown(cx)
    }
}
