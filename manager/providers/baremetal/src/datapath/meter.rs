//! Counting the bytes a relay delivers, shared by the copying and the splicing paths.

use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::metrics::counter::Counter;

/// Bytes delivered one way: the backend's byte counter, and the connection's own count of
/// bytes moved either way (what the idle timeout watches).
pub(super) struct Meter<'a> {
    counter: &'a Counter,
    moved: &'a AtomicU64,
}

impl<'a> Meter<'a> {
    /// Count into `counter` and `moved`.
    pub(super) fn new(counter: &'a Counter, moved: &'a AtomicU64) -> Self {
        Self { counter, moved }
    }

    /// Count `n` bytes.
    pub(super) fn inc_by(&self, n: u64) {
        self.counter.inc_by(n);
        self.moved.fetch_add(n, Ordering::Relaxed);
    }
}
