//! A responder's pulse: when its loop last ran, and how many requests the kernel dropped
//! because the responder had not read them in time. The responder writes it; the health
//! monitor reads it, so a responder that still runs but no longer gets to its frames (a loop
//! held up by a blocking call, a starved thread) is seen, without a probe frame on the segment.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Shared between one responder and the health monitor.
#[derive(Debug)]
pub struct Pulse {
    start: Instant,
    /// Milliseconds from `start` to the loop's last pass.
    last_beat_ms: AtomicU64,
    dropped: AtomicU64,
}

impl Default for Pulse {
    fn default() -> Self {
        Self::new()
    }
}

impl Pulse {
    /// A pulse that beat just now.
    pub fn new() -> Self {
        Self { start: Instant::now(), last_beat_ms: AtomicU64::new(0), dropped: AtomicU64::new(0) }
    }

    /// The responder's loop ran.
    pub fn beat(&self) {
        self.last_beat_ms.store(millis(self.start.elapsed()), Ordering::Relaxed);
    }

    /// How long since the loop last ran (millisecond precision).
    pub fn silent_for(&self) -> Duration {
        let last = Duration::from_millis(self.last_beat_ms.load(Ordering::Relaxed));
        self.start.elapsed().saturating_sub(last)
    }

    /// Count requests the kernel dropped before the responder read them.
    pub fn add_dropped(&self, frames: u64) {
        self.dropped.fetch_add(frames, Ordering::Relaxed);
    }

    /// Requests dropped so far.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silence_grows_until_the_loop_beats_and_drops_add_up() {
        let pulse = Pulse::new();
        std::thread::sleep(Duration::from_millis(30));
        assert!(pulse.silent_for() >= Duration::from_millis(29), "{:?}", pulse.silent_for());
        pulse.beat();
        assert!(pulse.silent_for() < Duration::from_millis(5), "{:?}", pulse.silent_for());
        assert_eq!(pulse.dropped(), 0);
        pulse.add_dropped(3);
        pulse.add_dropped(4);
        assert_eq!(pulse.dropped(), 7);
    }
}
