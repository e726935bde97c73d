//! Load-balancer traffic as a client sees it: one HTTP request at a time, from a place of the
//! segment (or the host), every interval, each recorded with when it started and whether it
//! was answered; and what a user waits for, computed from those records (pure): the longest
//! time nothing was answered, and when failures began and ended.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::{Place, RealCluster};
use crate::Error;

/// How long a request may take to connect; a Node that lost power answers nothing, so this
/// bounds how late a failure is recorded.
pub const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
/// How long the answer may take once connected.
pub const READ_TIMEOUT: Duration = Duration::from_secs(2);

/// One `GET /` over HTTP/1.0 with [`CONNECT_TIMEOUT`] and [`READ_TIMEOUT`]; the whole answer,
/// or why not.
pub fn http_get(addr: SocketAddr) -> Result<String, String> {
    let mut stream = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT).map_err(|e| e.to_string())?;
    stream.set_read_timeout(Some(READ_TIMEOUT)).map_err(|e| e.to_string())?;
    stream.write_all(b"GET / HTTP/1.0\r\nHost: e2e\r\n\r\n").map_err(|e| e.to_string())?;
    let mut body = String::new();
    stream.read_to_string(&mut body).map_err(|e| e.to_string())?;
    Ok(body)
}

/// One request: when it started (since the poller's start) and what answered (the body's last
/// line, say `pod=web-...`), or `None` when nothing did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    /// When the request started, from the poller's start.
    pub at: Duration,
    /// The answer's last non-empty line, or `None` for a failed request.
    pub answer: Option<String>,
}

/// Every request a poller made, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Traffic {
    /// The requests, in the order they started.
    pub samples: Vec<Sample>,
}

/// A stretch with no answer: from the start of its first failed request to the start of the
/// next answered one (or the last request, when none was answered after it).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Outage {
    /// When its first failed request started.
    pub from: Duration,
    /// When the next answered request started (or the last request, if none followed).
    pub to: Duration,
    /// Failed requests in it.
    pub failures: usize,
}

impl Outage {
    /// Its length in seconds.
    pub fn seconds(&self) -> f64 {
        (self.to - self.from).as_secs_f64()
    }
}

impl Traffic {
    /// Requests made.
    pub fn requests(&self) -> usize {
        self.samples.len()
    }

    /// Requests nothing answered.
    pub fn failures(&self) -> usize {
        self.samples.iter().filter(|s| s.answer.is_none()).count()
    }

    /// Every stretch without an answer, in order.
    pub fn outages(&self) -> Vec<Outage> {
        let mut out = Vec::new();
        let mut current: Option<Outage> = None;
        for s in &self.samples {
            match (&s.answer, current.as_mut()) {
                (None, Some(o)) => {
                    o.failures += 1;
                    o.to = s.at;
                }
                (None, None) => current = Some(Outage { from: s.at, to: s.at, failures: 1 }),
                (Some(_), Some(o)) => {
                    o.to = s.at;
                    out.extend(current.take());
                }
                (Some(_), None) => {}
            }
        }
        out.extend(current);
        out
    }

    /// The longest stretch without an answer, if any request failed.
    pub fn longest_outage(&self) -> Option<Outage> {
        self.outages().into_iter().max_by(|a, b| (a.to - a.from).cmp(&(b.to - b.from)))
    }

    /// The first and the last failed request's start, if any failed.
    pub fn failure_window(&self) -> Option<(Duration, Duration)> {
        let mut failed = self.samples.iter().filter(|s| s.answer.is_none()).map(|s| s.at);
        let first = failed.next()?;
        Some((first, failed.last().unwrap_or(first)))
    }

    /// Whether a request started at or after `since` was answered.
    pub fn answered_since(&self, since: Duration) -> bool {
        self.samples.iter().any(|s| s.at >= since && s.answer.is_some())
    }

    /// One line for a report: requests, failures, the longest stretch without an answer.
    pub fn summary(&self) -> String {
        let longest = self.longest_outage().map(|o| o.seconds()).unwrap_or(0.0);
        format!("{} of {} requests failed, longest gap {longest:.2} s", self.failures(), self.requests())
    }
}

/// The last non-empty line of an answer (the web Pods answer `pod=NAME`).
fn last_line(body: &str) -> String {
    body.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or_default().trim().to_string()
}

/// A client sending a request every interval until stopped, on a thread of its own.
pub struct Poller {
    stop: Arc<AtomicBool>,
    started: Instant,
    samples: Arc<std::sync::Mutex<Vec<Sample>>>,
    handle: JoinHandle<Result<(), Error>>,
}

impl Poller {
    /// Starts polling `addr` from `place` (`None`: the host) every `every`. An answer counts only
    /// when it contains `expect`.
    pub fn start(
        cluster: &RealCluster,
        place: Option<Place<'_>>,
        addr: SocketAddr,
        every: Duration,
        expect: &str,
    ) -> Result<Poller, Error> {
        let stop = Arc::new(AtomicBool::new(false));
        let samples = Arc::new(std::sync::Mutex::new(Vec::new()));
        let started = Instant::now();
        let (flag, out, expect) = (stop.clone(), samples.clone(), expect.to_string());
        let work = move || {
            while !flag.load(Ordering::SeqCst) {
                let t = Instant::now();
                let answer = http_get(addr).ok().filter(|b| b.contains(&expect)).map(|b| last_line(&b));
                if let Ok(mut all) = out.lock() {
                    all.push(Sample { at: t - started, answer });
                }
                std::thread::sleep(every.saturating_sub(t.elapsed()));
            }
        };
        let handle = match place {
            Some(place) => {
                let inner = cluster.thread_in(place, work)?;
                std::thread::spawn(move || {
                    inner.join().map_err(|_| Error::Other("the polling thread panicked".into()))?
                })
            }
            None => std::thread::spawn(move || {
                work();
                Ok(())
            }),
        };
        Ok(Poller { stop, started, samples, handle })
    }

    /// When the poller started (its samples' origin).
    pub fn started(&self) -> Instant {
        self.started
    }

    /// The requests so far.
    pub fn traffic(&self) -> Traffic {
        Traffic { samples: self.samples.lock().map(|s| s.clone()).unwrap_or_default() }
    }

    /// Stops it and returns every request it made.
    pub fn stop(self) -> Result<Traffic, Error> {
        self.stop.store(true, Ordering::SeqCst);
        self.handle.join().map_err(|_| Error::Other("the polling thread panicked".into()))??;
        Ok(Traffic { samples: self.samples.lock().map(|s| s.clone()).unwrap_or_default() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn traffic(pattern: &str) -> Traffic {
        // One character per request, 100 ms apart: '.' answered, 'x' failed.
        let samples = pattern
            .chars()
            .enumerate()
            .map(|(i, c)| Sample {
                at: Duration::from_millis(100 * i as u64),
                answer: (c == '.').then(|| "pod=web".to_string()),
            })
            .collect();
        Traffic { samples }
    }

    #[test]
    fn an_outage_lasts_from_the_first_failed_request_to_the_next_answered_one() {
        let t = traffic("..xxx..x.");
        let outages = t.outages();
        assert_eq!(outages.len(), 2);
        assert_eq!(
            (outages[0].from, outages[0].to, outages[0].failures),
            (Duration::from_millis(200), Duration::from_millis(500), 3)
        );
        assert_eq!(t.longest_outage().map(|o| o.seconds()), Some(0.3));
        assert_eq!((t.requests(), t.failures()), (9, 4));
        assert_eq!(t.failure_window(), Some((Duration::from_millis(200), Duration::from_millis(700))));
        assert_eq!(t.summary(), "4 of 9 requests failed, longest gap 0.30 s");
    }

    #[test]
    fn an_outage_still_running_at_the_end_lasts_until_the_last_request() {
        let t = traffic("..xx");
        assert_eq!(
            t.longest_outage().map(|o| (o.from, o.to)),
            Some((Duration::from_millis(200), Duration::from_millis(300)))
        );
        assert!(!t.answered_since(Duration::from_millis(200)));
        assert!(t.answered_since(Duration::from_millis(100)));
    }

    #[test]
    fn traffic_without_failures_has_no_outage() {
        let t = traffic("....");
        assert_eq!(t.longest_outage(), None);
        assert_eq!(t.failure_window(), None);
        assert_eq!(t.summary(), "0 of 4 requests failed, longest gap 0.00 s");
    }

    #[test]
    fn the_answer_recorded_is_the_bodys_last_line() {
        assert_eq!(last_line("HTTP/1.0 200 OK\r\n\r\npod=web-1\n\n"), "pod=web-1");
    }
}
