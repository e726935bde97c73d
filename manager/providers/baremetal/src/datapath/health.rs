//! Active health checks: one checker per target (address, port, path) however many Services
//! use it, so 1,000 `externalTrafficPolicy: Cluster` Services cost one check per Node.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use prometheus_client::metrics::gauge::Gauge;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use super::config::HealthSettings;
use super::select::Health;

/// What one checker probes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Target {
    /// The backend address.
    pub ip: IpAddr,
    /// The health port.
    pub port: u16,
    /// The HTTP path.
    pub path: String,
}

/// The consecutive-outcome state machine (pure).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tracker {
    /// The current verdict.
    pub health: Health,
    successes: u32,
    failures: u32,
}

impl Default for Tracker {
    fn default() -> Self {
        Self { health: Health::Unknown, successes: 0, failures: 0 }
    }
}

impl Tracker {
    /// Record one check; returns the verdict afterwards.
    pub fn record(&mut self, ok: bool, settings: &HealthSettings) -> Health {
        if ok {
            self.failures = 0;
            self.successes = self.successes.saturating_add(1);
            if self.successes >= settings.healthy_threshold.max(1) {
                self.health = Health::Healthy;
            }
        } else {
            self.successes = 0;
            self.failures = self.failures.saturating_add(1);
            // Unknown backends fail fast: one failure is enough to never send them traffic.
            if self.failures >= settings.unhealthy_threshold.max(1) || self.health == Health::Unknown {
                self.health = Health::Unhealthy;
            }
        }
        self.health
    }
}

/// A target's shared verdict, read on every new connection.
#[derive(Debug)]
pub struct State {
    health: AtomicU8,
    /// Per-Service `backend_healthy` gauges to keep in step, by Service key.
    gauges: Mutex<HashMap<String, Gauge>>,
}

impl State {
    fn new() -> Self {
        Self { health: AtomicU8::new(0), gauges: Mutex::new(HashMap::new()) }
    }

    /// The current verdict.
    pub fn health(&self) -> Health {
        match self.health.load(Ordering::Relaxed) {
            1 => Health::Healthy,
            2 => Health::Unhealthy,
            _ => Health::Unknown,
        }
    }

    fn set(&self, health: Health) {
        let code = match health {
            Health::Unknown => 0,
            Health::Healthy => 1,
            Health::Unhealthy => 2,
        };
        self.health.store(code, Ordering::Relaxed);
        let value = i64::from(health == Health::Healthy);
        for gauge in self.gauges.lock().unwrap_or_else(|e| e.into_inner()).values() {
            gauge.set(value);
        }
    }

    /// Keep `gauge` (a Service's view of this backend) in step with the verdict.
    pub fn attach_gauge(&self, service: &str, gauge: Gauge) {
        gauge.set(i64::from(self.health() == Health::Healthy));
        self.gauges.lock().unwrap_or_else(|e| e.into_inner()).insert(service.to_string(), gauge);
    }

    /// Stop updating a Service's gauge.
    pub fn detach_gauge(&self, service: &str) {
        self.gauges.lock().unwrap_or_else(|e| e.into_inner()).remove(service);
    }
}

struct Entry {
    state: Arc<State>,
    users: usize,
    stop: CancellationToken,
}

/// Runs the checkers and counts their users.
pub struct Monitor {
    settings: HealthSettings,
    entries: Mutex<HashMap<Target, Entry>>,
    root: CancellationToken,
}

impl std::fmt::Debug for Monitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Monitor").field("settings", &self.settings).finish_non_exhaustive()
    }
}

impl Monitor {
    /// A monitor whose checkers stop when `root` fires.
    pub fn new(settings: HealthSettings, root: CancellationToken) -> Self {
        Self { settings, entries: Mutex::new(HashMap::new()), root }
    }

    /// The target's shared state, starting its checker on first use. Needs a Tokio runtime.
    pub fn subscribe(&self, target: &Target) -> Arc<State> {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(entry) = entries.get_mut(target) {
            entry.users += 1;
            return entry.state.clone();
        }
        let state = Arc::new(State::new());
        let stop = self.root.child_token();
        tokio::spawn(run(target.clone(), self.settings, state.clone(), stop.clone()));
        entries.insert(target.clone(), Entry { state: state.clone(), users: 1, stop });
        state
    }

    /// Drop one use of the target; its checker stops with the last one.
    pub fn unsubscribe(&self, target: &Target) {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(entry) = entries.get_mut(target) {
            entry.users -= 1;
            if entry.users == 0 {
                entry.stop.cancel();
                entries.remove(target);
            }
        }
    }

    /// How many checkers run.
    pub fn checkers(&self) -> usize {
        self.entries.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

async fn run(target: Target, settings: HealthSettings, state: Arc<State>, stop: CancellationToken) {
    let mut tracker = Tracker::default();
    let mut ticks = tokio::time::interval(settings.interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = ticks.tick() => {}
        }
        let ok = tokio::select! {
            _ = stop.cancelled() => return,
            r = tokio::time::timeout(settings.timeout, probe(&target)) => matches!(r, Ok(true)),
        };
        let before = tracker.health;
        let after = tracker.record(ok, &settings);
        if before != after {
            tracing::info!(backend = %target.ip, port = target.port, health = ?after, "backend health changed");
            state.set(after);
        }
    }
}

/// One HTTP/1.0 GET; a 2xx status is a success. kube-proxy answers 200 or 503.
async fn probe(target: &Target) -> bool {
    let addr = SocketAddr::new(target.ip, target.port);
    let Ok(mut stream) = TcpStream::connect(addr).await else { return false };
    let request = format!(
        "GET {} HTTP/1.0\r\nHost: {}\r\nUser-Agent: ccm-datapath\r\nConnection: close\r\n\r\n",
        target.path, addr
    );
    if stream.write_all(request.as_bytes()).await.is_err() {
        return false;
    }
    // The status line is all we need; read at most a few hundred bytes.
    let mut buf = [0u8; 256];
    let mut len = 0;
    while len < buf.len() {
        match stream.read(&mut buf[len..]).await {
            Ok(0) | Err(_) => break,
            Ok(n) => len += n,
        }
        if buf[..len].contains(&b'\n') {
            break;
        }
    }
    status_is_success(&buf[..len])
}

/// Whether an HTTP response starts with a 2xx status line.
pub fn status_is_success(response: &[u8]) -> bool {
    let line = response.split(|b| *b == b'\n').next().unwrap_or_default();
    let mut parts = line.split(|b| *b == b' ');
    let version = parts.next().unwrap_or_default();
    let code = parts.next().unwrap_or_default();
    version.starts_with(b"HTTP/") && code.len() == 3 && code[0] == b'2' && code.iter().all(u8::is_ascii_digit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_failures_mark_unhealthy_and_one_success_heals() {
        let settings = HealthSettings::default();
        let mut t = Tracker::default();
        assert_eq!(t.record(true, &settings), Health::Healthy);
        assert_eq!(t.record(false, &settings), Health::Healthy, "one failure is tolerated");
        assert_eq!(t.record(false, &settings), Health::Unhealthy);
        assert_eq!(t.record(true, &settings), Health::Healthy);
    }

    #[test]
    fn a_never_healthy_backend_is_unhealthy_after_its_first_failure() {
        let mut t = Tracker::default();
        assert_eq!(t.record(false, &HealthSettings::default()), Health::Unhealthy);
    }

    #[test]
    fn thresholds_are_configurable() {
        let settings = HealthSettings { unhealthy_threshold: 3, healthy_threshold: 2, ..Default::default() };
        let mut t = Tracker::default();
        t.record(true, &settings);
        assert_eq!(t.health, Health::Unknown);
        t.record(true, &settings);
        assert_eq!(t.health, Health::Healthy);
        t.record(false, &settings);
        t.record(false, &settings);
        assert_eq!(t.health, Health::Healthy);
        assert_eq!(t.record(false, &settings), Health::Unhealthy);
    }

    #[test]
    fn only_2xx_status_lines_are_successes() {
        assert!(status_is_success(b"HTTP/1.1 200 OK\r\n"));
        assert!(status_is_success(b"HTTP/1.0 204 No Content\r\n"));
        assert!(!status_is_success(b"HTTP/1.1 503 Service Unavailable\r\n"));
        assert!(!status_is_success(b"SSH-2.0-OpenSSH\r\n"));
        assert!(!status_is_success(b""));
    }

    #[tokio::test]
    async fn one_checker_serves_every_subscriber_of_a_target() {
        let monitor = Monitor::new(HealthSettings::default(), CancellationToken::new());
        let target = Target { ip: IpAddr::from([127, 0, 0, 1]), port: 1, path: "/healthz".into() };
        let a = monitor.subscribe(&target);
        let b = monitor.subscribe(&target);
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(monitor.checkers(), 1);
        monitor.unsubscribe(&target);
        assert_eq!(monitor.checkers(), 1);
        monitor.unsubscribe(&target);
        assert_eq!(monitor.checkers(), 0);
    }
}
