//! Zero-copy TCP forwarding on Linux: splice(2) moves each direction's bytes socket → pipe →
//! socket inside the kernel, so the proxy neither copies them through user space nor keeps a
//! buffer per connection. Tokio supplies readiness (`readable()`/`writable()` + `try_io`); the
//! sockets stay Tokio's. A direction whose pipe cannot be made, or whose first splice the kernel
//! refuses, continues with an ordinary read/write copy.

use std::io;
use std::net::Shutdown;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};

use tokio::io::Interest;
use tokio::net::TcpStream;

use super::meter::Meter;

/// A pipe's default capacity (16 pages).
const PIPE_CHUNK: usize = 64 * 1024;
/// The buffer of the read/write fallback.
const COPY_BUFFER: usize = 32 * 1024;
/// A direction is copied until one read fills this many bytes, then spliced.
const PROBE: usize = 4 * 1024;

/// Forward both directions until both have ended (each end's write side is shut down when the
/// other end has nothing more to send); an error in either ends both. `rx` counts bytes
/// delivered to `upstream`, `tx` bytes delivered to `client`.
pub(super) async fn relay(client: &TcpStream, upstream: &TcpStream, rx: &Meter<'_>, tx: &Meter<'_>) -> io::Result<()> {
    tokio::try_join!(one_way(client, upstream, rx), one_way(upstream, client, tx))?;
    Ok(())
}

/// What a spliced direction ended with.
#[derive(Debug, PartialEq, Eq)]
enum Spliced {
    /// The source ended and everything read was delivered.
    Ended,
    /// The kernel refused to splice these descriptors before any byte moved.
    Unsupported,
}

/// What to do with an error of the splice that fills an empty pipe.
#[derive(Debug, PartialEq, Eq)]
enum OnFillError {
    /// The socket has nothing to read yet: wait for readiness again.
    Wait,
    /// Splice cannot be used here: copy instead (nothing was lost, the pipe is empty).
    Copy,
    /// A real error of the connection.
    Fail,
}

/// Pure: classify an error of `splice(socket → empty pipe)`. EINVAL and ENOSYS mean a socket
/// type or kernel without splice support; the pipe is empty, so EAGAIN can only be the socket's.
fn on_fill_error(error: &io::Error) -> OnFillError {
    if error.kind() == io::ErrorKind::WouldBlock {
        return OnFillError::Wait;
    }
    match error.raw_os_error() {
        Some(libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP) => OnFillError::Copy,
        _ => OnFillError::Fail,
    }
}

async fn one_way(from: &TcpStream, to: &TcpStream, delivered: &Meter<'_>) -> io::Result<()> {
    if copy_until_bulk(from, to, delivered).await? == Flow::Bulk {
        splice_rest(from, to, delivered).await?;
    }
    // Half-close: the other side learns that no more bytes come this way.
    match socket2::SockRef::from(to).shutdown(Shutdown::Write) {
        Err(error) if error.kind() != io::ErrorKind::NotConnected => Err(error),
        _ => Ok(()),
    }
}

/// How a direction's first bytes went.
#[derive(Debug, PartialEq, Eq)]
enum Flow {
    /// The source ended and everything read was delivered.
    Ended,
    /// A read filled the probe buffer: bulk data is flowing.
    Bulk,
}

/// Copy through a small buffer until the source ends or a read fills the buffer. Many
/// directions carry a few bytes (a reply's status, a request), for which a pipe (created,
/// sized and closed per direction: four system calls) costs more than the copy; only a
/// direction that fills [`PROBE`] in one read gets one.
async fn copy_until_bulk(from: &TcpStream, to: &TcpStream, delivered: &Meter<'_>) -> io::Result<Flow> {
    let mut buf = [0u8; PROBE];
    loop {
        from.readable().await?;
        let read = match from.try_read(&mut buf) {
            Ok(0) => return Ok(Flow::Ended),
            Ok(n) => n,
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => continue,
            Err(error) => return Err(error),
        };
        write_all(to, &buf[..read], delivered).await?;
        if read == PROBE {
            return Ok(Flow::Bulk);
        }
    }
}

/// Write all of `bytes` to `to`, counting them as delivered.
async fn write_all(to: &TcpStream, bytes: &[u8], delivered: &Meter<'_>) -> io::Result<()> {
    let mut written = 0;
    while written < bytes.len() {
        to.writable().await?;
        match to.try_write(&bytes[written..]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                written += n;
                delivered.inc_by(n as u64);
            }
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
            Err(error) => return Err(error),
        }
    }
    Ok(())
}

/// Splice the rest of a bulk direction, or copy it where splice cannot be used.
async fn splice_rest(from: &TcpStream, to: &TcpStream, delivered: &Meter<'_>) -> io::Result<()> {
    let spliced = match std::io::pipe() {
        Ok((pipe_out, pipe_in)) => {
            let capacity = pipe_capacity(pipe_in.as_fd());
            if worth_splicing(capacity) {
                splice_until_end(from, to, pipe_in.as_fd(), pipe_out.as_fd(), capacity, delivered).await?
            } else {
                // Unprivileged users past fs.pipe-user-pages-soft get two-page pipes.
                tracing::debug!(capacity, "pipe too small to be worth splicing; copying");
                Spliced::Unsupported
            }
        }
        Err(error) => {
            // Usually out of descriptors: this connection still works without a pipe.
            tracing::debug!(%error, "no pipe for splice; copying through user space");
            Spliced::Unsupported
        }
    };
    if spliced == Spliced::Unsupported {
        copy_until_end(from, to, delivered).await?;
    }
    Ok(())
}

/// Socket → pipe → socket until `from` ends. Fills the pipe only when it is empty, so that a
/// would-block always belongs to the socket whose readiness was awaited.
async fn splice_until_end(
    from: &TcpStream,
    to: &TcpStream,
    pipe_in: BorrowedFd<'_>,
    pipe_out: BorrowedFd<'_>,
    chunk: usize,
    delivered: &Meter<'_>,
) -> io::Result<Spliced> {
    let mut moved_any = false;
    loop {
        from.readable().await?;
        let filled = match from.try_io(Interest::READABLE, || splice(from.as_fd(), pipe_in, chunk)) {
            Ok(0) => return Ok(Spliced::Ended),
            Ok(n) => n,
            Err(error) => match on_fill_error(&error) {
                OnFillError::Wait => continue,
                OnFillError::Copy if !moved_any => {
                    tracing::debug!(%error, "splice refused; copying through user space");
                    return Ok(Spliced::Unsupported);
                }
                OnFillError::Copy | OnFillError::Fail => return Err(error),
            },
        };
        moved_any = true;
        let mut left = filled;
        while left > 0 {
            to.writable().await?;
            match to.try_io(Interest::WRITABLE, || splice(pipe_out, to.as_fd(), left)) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    left -= n;
                    delivered.inc_by(n as u64);
                }
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
                Err(error) => return Err(error),
            }
        }
    }
}

/// The fallback: read into a buffer, write it out, until `from` ends.
async fn copy_until_end(from: &TcpStream, to: &TcpStream, delivered: &Meter<'_>) -> io::Result<()> {
    let mut buf = vec![0u8; COPY_BUFFER];
    loop {
        from.readable().await?;
        let read = match from.try_read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => continue,
            Err(error) => return Err(error),
        };
        write_all(to, &buf[..read], delivered).await?;
    }
}

/// The pipe's capacity in bytes (the default when the kernel will not say).
fn pipe_capacity(pipe: BorrowedFd<'_>) -> usize {
    // SAFETY: F_GETPIPE_SZ takes no argument and touches no memory of this process; the
    // descriptor is borrowed from its live owner.
    let capacity = unsafe { libc::fcntl(pipe.as_raw_fd(), libc::F_GETPIPE_SZ) };
    usize::try_from(capacity).unwrap_or(PIPE_CHUNK)
}

/// Pure: a pipe smaller than the copy buffer would move fewer bytes per system call than
/// copying does.
fn worth_splicing(pipe_capacity: usize) -> bool {
    pipe_capacity >= COPY_BUFFER
}

/// One non-blocking splice of up to `len` bytes.
fn splice(from: BorrowedFd<'_>, to: BorrowedFd<'_>, len: usize) -> io::Result<usize> {
    // SAFETY: both descriptors are borrowed from live owners, so they stay open for the call;
    // null offsets are what splice expects for sockets and pipes, and it reads or writes no
    // memory of this process.
    let n = unsafe {
        libc::splice(
            from.as_raw_fd(),
            std::ptr::null_mut(),
            to.as_raw_fd(),
            std::ptr::null_mut(),
            len,
            libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK,
        )
    };
    // A negative return is the only failure signal; any other value fits in usize.
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::counter::Counter;
    use std::sync::atomic::AtomicU64;

    /// A connected pair of loopback sockets.
    async fn pair() -> (TcpStream, TcpStream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let (a, b) = tokio::join!(TcpStream::connect(addr), listener.accept());
        (a.expect("connect"), b.expect("accept").0)
    }

    /// The fallback a direction takes when splice is refused moves every byte in order.
    #[tokio::test]
    async fn the_copy_fallback_delivers_every_byte_and_counts_them() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut source, from) = pair().await;
        let (to, mut sink) = pair().await;
        let sent: Vec<u8> = (0..4 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
        let (counter, moved_bytes) = (Counter::default(), AtomicU64::new(0));
        let meter = Meter::new(&counter, &moved_bytes);
        let expected = sent.clone();
        let writer = tokio::spawn(async move {
            source.write_all(&sent).await.expect("write");
            source.shutdown().await.expect("close")
        });
        let mut got = Vec::new();
        let (copied, read) = tokio::join!(
            async {
                let copied = copy_until_end(&from, &to, &meter).await;
                drop(to);
                copied
            },
            sink.read_to_end(&mut got)
        );
        copied.expect("copy");
        read.expect("read");
        writer.await.expect("writer");
        assert!(got == expected);
        assert_eq!(counter.get(), expected.len() as u64);
    }

    /// Send `bytes` through `one_way` and return what arrived and what the flow probe saw.
    async fn through_one_way(sent: Vec<u8>) -> (Vec<u8>, u64) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut source, from) = pair().await;
        let (to, mut sink) = pair().await;
        let (counter, moved_bytes) = (Counter::default(), AtomicU64::new(0));
        let meter = Meter::new(&counter, &moved_bytes);
        let writer = tokio::spawn(async move {
            source.write_all(&sent).await.expect("write");
            source.shutdown().await.expect("close")
        });
        let mut got = Vec::new();
        let (moved, read) = tokio::join!(one_way(&from, &to, &meter), sink.read_to_end(&mut got));
        moved.expect("forward");
        read.expect("read");
        writer.await.expect("writer");
        (got, counter.get())
    }

    /// A short direction (a request line, a reply's status) is copied to its end without a pipe;
    /// a direction that fills the probe buffer in one read is spliced from then on; both
    /// deliver every byte in order and half-close the other side at the end.
    #[tokio::test]
    async fn short_directions_are_copied_and_bulk_ones_spliced_with_every_byte_delivered() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut source, from) = pair().await;
        let (to, mut sink) = pair().await;
        source.write_all(b"GET / HTTP/1.0\r\n\r\n").await.expect("write");
        source.shutdown().await.expect("close");
        let (counter, moved_bytes) = (Counter::default(), AtomicU64::new(0));
        let meter = Meter::new(&counter, &moved_bytes);
        assert_eq!(copy_until_bulk(&from, &to, &meter).await.expect("copy"), Flow::Ended);
        assert_eq!(counter.get(), 18);
        drop(to);
        let mut got = Vec::new();
        sink.read_to_end(&mut got).await.expect("read");
        assert_eq!(got, b"GET / HTTP/1.0\r\n\r\n");

        let (mut source, from) = pair().await;
        let (to, _sink) = pair().await;
        source.write_all(&[9u8; 4 * PROBE]).await.expect("write");
        // One write on loopback arrives whole; the pause only makes sure it has.
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        let (counter, moved_bytes) = (Counter::default(), AtomicU64::new(0));
        let meter = Meter::new(&counter, &moved_bytes);
        assert_eq!(copy_until_bulk(&from, &to, &meter).await.expect("copy"), Flow::Bulk);
        assert_eq!(counter.get(), PROBE as u64, "stops copying after the first full read");

        for len in [0, 1, PROBE - 1, PROBE, PROBE + 1, 3 * 1024 * 1024 + 7] {
            let sent: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let (got, counted) = through_one_way(sent.clone()).await;
            assert!(got == sent, "{len} bytes arrive intact");
            assert_eq!(counted, len as u64, "{len} bytes counted");
        }
    }

    #[test]
    fn pipes_shrunk_below_the_copy_buffer_are_not_used() {
        assert!(worth_splicing(PIPE_CHUNK));
        assert!(!worth_splicing(2 * 4096));
    }

    #[test]
    fn would_block_waits_for_readiness() {
        assert_eq!(on_fill_error(&io::ErrorKind::WouldBlock.into()), OnFillError::Wait);
        assert_eq!(on_fill_error(&io::Error::from_raw_os_error(libc::EAGAIN)), OnFillError::Wait);
    }

    #[test]
    fn an_unsupported_descriptor_falls_back_to_copying() {
        assert_eq!(on_fill_error(&io::Error::from_raw_os_error(libc::EINVAL)), OnFillError::Copy);
        assert_eq!(on_fill_error(&io::Error::from_raw_os_error(libc::ENOSYS)), OnFillError::Copy);
    }

    #[test]
    fn a_connection_error_ends_the_connection() {
        assert_eq!(on_fill_error(&io::Error::from_raw_os_error(libc::ECONNRESET)), OnFillError::Fail);
        assert_eq!(on_fill_error(&io::Error::from_raw_os_error(libc::EPIPE)), OnFillError::Fail);
    }
}
