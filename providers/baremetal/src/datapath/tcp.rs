//! The TCP proxy: accept, filter, pick a backend (trying the next one when a connect fails),
//! then forward both ways (splice on Linux under load, see `splice.rs`; a buffer copy otherwise) until
//! both sides have closed, either fails, or the connection's drain ends.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use super::config::Protocol;
use super::{ActiveGuard, PortShared};

/// Copy buffer per direction: larger than Tokio's 8 KiB default for loopback-class links,
/// small enough for thousands of connections.
const COPY_BUFFER: usize = 32 * 1024;

pub(super) async fn serve(listener: TcpListener, port: Arc<PortShared>, stop: CancellationToken) {
    loop {
        let accepted = tokio::select! {
            _ = stop.cancelled() => return,
            r = listener.accept() => r,
        };
        match accepted {
            Ok((stream, peer)) => {
                tokio::spawn(handle(stream, peer, port.clone()));
            }
            Err(error) => {
                // Usually out of file descriptors: pause instead of spinning.
                tracing::warn!(service = %port.service.key, %error, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

async fn handle(mut client: TcpStream, peer: SocketAddr, port: Arc<PortShared>) {
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
    let _active = ActiveGuard::new(backend.clone(), Protocol::Tcp);
    let counters = backend.counters(Protocol::Tcp);
    let open = OpenGuard::new(&service.open_tcp);
    let splice = service.tcp_forwarding.splices(open.others);
    tokio::select! {
        r = forward(&mut client, &mut upstream, splice, &counters.rx, &counters.tx) => {
            if let Err(error) = r {
                tracing::trace!(service = %service.key, %error, "connection ended with an error");
            }
        }
        _ = port.drain.cancelled() => {}
        _ = backend.drain.cancelled() => {}
    }
}

/// Move bytes both ways until both directions have ended; `rx` counts client → backend, `tx`
/// backend → client.
async fn forward(
    client: &mut TcpStream,
    upstream: &mut TcpStream,
    splice: bool,
    rx: &Counter,
    tx: &Counter,
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
    read: &'a Counter,
    written: &'a Counter,
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
