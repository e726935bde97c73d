//! The announcer's health probes (I/O): each L2 interface's flags, each responder's task and
//! pulse, and kube-proxy's health endpoint, every interval; [`super::health::Judge`] decides, and the
//! verdict is published on a watch channel the announcer reads.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Empty;
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::health::{Health, HealthzTarget, Judge, LinkState, Observation};
use super::pulse::Pulse;
use super::responder::{L2Error, ifreq};

/// How long kube-proxy has to answer one health check.
pub const KUBE_PROXY_TIMEOUT: Duration = Duration::from_secs(1);

/// Reads one interface's flags through a datagram socket opened in the calling thread's network
/// namespace (a socket keeps its namespace, as the responder's do).
#[derive(Debug)]
pub struct LinkProbe {
    interface: String,
    socket: OwnedFd,
}

impl LinkProbe {
    /// A probe of `interface` in the calling thread's network namespace.
    pub fn open(interface: &str) -> Result<Self, L2Error> {
        ifreq(interface)?;
        // SAFETY: plain socket(2); the result is checked before use.
        let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            return Err(L2Error::Io {
                interface: interface.to_string(),
                what: "opening a socket to read the interface's flags",
                source: std::io::Error::last_os_error(),
            });
        }
        // SAFETY: raw is a fresh descriptor we own.
        let socket = unsafe { OwnedFd::from_raw_fd(raw) };
        Ok(Self { interface: interface.to_string(), socket })
    }

    /// The interface this probe reads.
    pub fn interface(&self) -> &str {
        &self.interface
    }

    /// The interface's state now: `IFF_UP` and `IFF_RUNNING` (the carrier) from SIOCGIFFLAGS.
    pub fn state(&self) -> LinkState {
        let Ok(mut req) = ifreq(&self.interface) else { return LinkState::Missing };
        // SAFETY: SIOCGIFFLAGS fills the flags of the ifreq we own; the descriptor is open.
        let rc = unsafe { libc::ioctl(self.socket.as_raw_fd(), libc::SIOCGIFFLAGS as _, &mut req) };
        if rc < 0 {
            return LinkState::Missing;
        }
        // SAFETY: after a successful SIOCGIFFLAGS the union holds the flags.
        let flags = i32::from(unsafe { req.ifr_ifru.ifru_flags });
        if flags & libc::IFF_UP == 0 {
            LinkState::AdminDown
        } else if flags & libc::IFF_RUNNING == 0 {
            LinkState::NoCarrier
        } else {
            LinkState::Up
        }
    }
}

/// One GET of kube-proxy's health endpoint: `Ok` on a 2xx answer within `timeout`, else what
/// went wrong in words (no body is read: kube-proxy says 503 when it is unhealthy).
pub async fn kube_proxy(target: &HealthzTarget, timeout: Duration) -> Result<(), String> {
    let attempt = async {
        let stream = TcpStream::connect(target.address).await.map_err(|e| format!("cannot connect: {e}"))?;
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(|e| format!("HTTP: {e}"))?;
        let driver = tokio::spawn(connection);
        let request = hyper::Request::get(target.path.as_str())
            .header(hyper::header::HOST, target.address.to_string())
            .header(hyper::header::CONNECTION, "close")
            .body(Empty::<Bytes>::new())
            .map_err(|e| format!("building the request: {e}"))?;
        let response = sender.send_request(request).await;
        driver.abort();
        let status = response.map_err(|e| format!("HTTP: {e}"))?.status();
        if status.is_success() { Ok(()) } else { Err(format!("answered HTTP {}", status.as_u16())) }
    };
    match tokio::time::timeout(timeout, attempt).await {
        Ok(outcome) => outcome,
        Err(_) => Err(format!("no answer within {} ms", timeout.as_millis())),
    }
}

/// A responder as the monitor sees it.
#[derive(Debug, Clone)]
pub struct WatchedResponder {
    /// Its interface.
    pub interface: String,
    /// Cancelled when its task ends ([`watched`]).
    pub stopped: CancellationToken,
    /// Its loop's pulse ([`super::responder::L2Socket::pulse`]).
    pub pulse: Arc<Pulse>,
}

/// What the monitor probes.
#[derive(Debug)]
pub struct Monitor {
    /// The L2 interfaces to check (none when `checkInterfaces: false` or without L2).
    pub links: Vec<LinkProbe>,
    /// Each responder.
    pub responders: Vec<WatchedResponder>,
    /// kube-proxy's health endpoint, when configured.
    pub kube_proxy: Option<HealthzTarget>,
    /// How long to wait between rounds.
    pub interval: Duration,
}

impl Monitor {
    /// One round of probes.
    pub async fn observe(&self) -> Observation {
        let links = self.links.iter().map(|probe| (probe.interface.clone(), probe.state())).collect();
        let (stopped, running): (Vec<_>, Vec<_>) = self.responders.iter().partition(|r| r.stopped.is_cancelled());
        let stopped_responders = stopped.into_iter().map(|r| r.interface.clone()).collect();
        let responder_silence = running.into_iter().map(|r| (r.interface.clone(), r.pulse.silent_for())).collect();
        let kube_proxy = match &self.kube_proxy {
            Some(target) => Some(kube_proxy(target, KUBE_PROXY_TIMEOUT).await),
            None => None,
        };
        Observation { links, stopped_responders, responder_silence, kube_proxy }
    }
}

/// Probe every interval until `cancel`; the verdict starts healthy and changes are logged.
pub fn spawn(monitor: Monitor, cancel: CancellationToken) -> watch::Receiver<Health> {
    let (tx, rx) = watch::channel(Health::Healthy);
    tokio::spawn(async move {
        let mut judge = Judge::default();
        loop {
            let health = judge.judge(&monitor.observe().await);
            tx.send_if_modified(|current| {
                if *current == health {
                    return false;
                }
                match health.reason() {
                    Some(reason) => tracing::warn!(%reason, "announcer unhealthy: giving its addresses up"),
                    None => tracing::info!("announcer healthy again"),
                }
                *current = health;
                true
            });
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(monitor.interval) => {}
            }
        }
    });
    rx
}

/// Wrap a responder task so that `stopped` is cancelled when it ends, however it ends.
pub async fn watched<T>(task: impl Future<Output = T>, stopped: CancellationToken) -> T {
    let _cancel_on_exit = stopped.drop_guard();
    task.await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_interface_reads_as_gone() {
        let probe = LinkProbe::open("ccm-nonexist0").expect("a socket");
        assert_eq!(probe.state(), LinkState::Missing);
        assert_eq!(probe.interface(), "ccm-nonexist0");
        assert_eq!(LinkProbe::open("lo").expect("a socket").state(), LinkState::Up, "loopback is up here");
    }

    #[tokio::test]
    async fn a_responder_that_ends_is_reported_stopped_by_the_monitor() {
        let stopped = CancellationToken::new();
        let (finish, finished) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(watched(async move { finished.await.ok() }, stopped.clone()));
        let pulse = Arc::new(Pulse::new());
        let responder = WatchedResponder { interface: "eth9".into(), stopped, pulse };
        let monitor = Monitor {
            links: Vec::new(),
            responders: vec![responder],
            kube_proxy: None,
            interval: Duration::from_millis(10),
        };
        let seen = monitor.observe().await;
        assert!(seen.stopped_responders.is_empty(), "running");
        assert_eq!(seen.responder_silence.len(), 1, "a running responder's silence is observed");
        let _ = finish.send(());
        task.await.expect("the wrapped task");
        let seen = monitor.observe().await;
        assert_eq!(seen.stopped_responders, ["eth9"]);
        assert!(seen.responder_silence.is_empty(), "a stopped responder is stopped, not silent");
    }
}
