//! TCP liveness probing of the instances.
//!
//! A background task (started from `initialize`) connects to each instance's probe address
//! every interval, a bounded number at a time, and records the outcome. Controllers only read
//! the recorded state, so no lookup ever waits on the network.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures::StreamExt;
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use super::config::{InstanceConfig, InstanceState, ProbeConfig};

/// One instance to probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeTarget {
    /// The instance's index in the inventory.
    pub index: usize,
    /// The instance's name, for logs.
    pub name: String,
    /// The address to connect to (an IP or a DNS name).
    pub host: String,
}

/// The probe targets: each running instance's first address of a preferred type. Instances
/// declared shut down, or with no such address, are not probed.
pub fn targets(instances: &[InstanceConfig], probe: &ProbeConfig) -> Vec<ProbeTarget> {
    instances
        .iter()
        .enumerate()
        .filter(|(_, i)| i.state == InstanceState::Running)
        .filter_map(|(index, instance)| {
            let host = probe
                .address_types
                .iter()
                .find_map(|t| instance.addresses.iter().find(|a| a.type_ == *t))?
                .address
                .clone();
            Some(ProbeTarget { index, name: instance.name.clone(), host })
        })
        .collect()
}

/// The probe state of one instance.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProbeStatus {
    /// Whether at least one probe has finished.
    pub probed: bool,
    /// Whether the instance is currently reported shut down.
    pub down: bool,
    /// Consecutive failures.
    pub failures: u32,
    /// Consecutive successes.
    pub successes: u32,
}

impl ProbeStatus {
    /// Record one outcome; returns the new `down` value when it changed.
    pub fn record(&mut self, ok: bool, failure_threshold: u32, success_threshold: u32) -> Option<bool> {
        self.probed = true;
        if ok {
            self.successes = self.successes.saturating_add(1);
            self.failures = 0;
            if self.down && self.successes >= success_threshold {
                self.down = false;
                return Some(false);
            }
        } else {
            self.failures = self.failures.saturating_add(1);
            self.successes = 0;
            if !self.down && self.failures >= failure_threshold {
                self.down = true;
                return Some(true);
            }
        }
        None
    }
}

/// Counts for health messages.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProbeSummary {
    /// Instances probed at least once.
    pub probed: usize,
    /// Instances currently failing (reported shut down).
    pub down: usize,
    /// Names of up to five failing instances.
    pub down_names: Vec<String>,
}

/// Probe states of every instance, shared between the probe task and the lookups.
#[derive(Debug, Default)]
pub struct ProbeStates {
    statuses: RwLock<Vec<ProbeStatus>>,
    names: Vec<String>,
}

impl ProbeStates {
    /// All instances up and not yet probed.
    pub fn new(names: Vec<String>) -> Self {
        Self { statuses: RwLock::new(vec![ProbeStatus::default(); names.len()]), names }
    }

    /// Forget every outcome (a new probe task starts from scratch).
    pub fn reset(&self) {
        let mut statuses = self.statuses.write().unwrap_or_else(|e| e.into_inner());
        statuses.iter_mut().for_each(|s| *s = ProbeStatus::default());
    }

    /// Whether the instance at `index` is failing its probe.
    pub fn is_down(&self, index: usize) -> bool {
        self.statuses.read().unwrap_or_else(|e| e.into_inner()).get(index).is_some_and(|s| s.down)
    }

    /// The state of the instance at `index`.
    pub fn status(&self, index: usize) -> Option<ProbeStatus> {
        self.statuses.read().unwrap_or_else(|e| e.into_inner()).get(index).copied()
    }

    pub(crate) fn record(&self, index: usize, ok: bool, probe: &ProbeConfig) -> Option<bool> {
        let mut statuses = self.statuses.write().unwrap_or_else(|e| e.into_inner());
        statuses.get_mut(index)?.record(ok, probe.failure_threshold, probe.success_threshold)
    }

    /// Counts of probed and failing instances.
    pub fn summary(&self) -> ProbeSummary {
        let statuses = self.statuses.read().unwrap_or_else(|e| e.into_inner());
        let mut summary = ProbeSummary::default();
        for (i, s) in statuses.iter().enumerate() {
            summary.probed += usize::from(s.probed);
            if s.down {
                summary.down += 1;
                if summary.down_names.len() < 5
                    && let Some(name) = self.names.get(i)
                {
                    summary.down_names.push(name.clone());
                }
            }
        }
        summary
    }
}

/// Try one TCP connection within `timeout`.
pub async fn probe_once(host: &str, port: u16, timeout: Duration) -> Result<(), String> {
    match tokio::time::timeout(timeout, TcpStream::connect((host, port))).await {
        Ok(Ok(_stream)) => Ok(()),
        Ok(Err(error)) => Err(error.to_string()),
        Err(_) => Err(format!("no answer within {timeout:?}")),
    }
}

/// Probe every target each interval until `shutdown` fires.
pub async fn run(targets: Vec<ProbeTarget>, probe: ProbeConfig, states: Arc<ProbeStates>, shutdown: CancellationToken) {
    let (port, timeout) = (probe.port, probe.timeout);
    run_with(targets, probe, states, shutdown, move |host| async move { probe_once(&host, port, timeout).await }).await
}

/// [`run`] with the connection attempt supplied by the caller (tests count or script it).
pub async fn run_with<F, Fut>(
    targets: Vec<ProbeTarget>,
    probe: ProbeConfig,
    states: Arc<ProbeStates>,
    shutdown: CancellationToken,
    attempt: F,
) where
    F: Fn(String) -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    tracing::info!(instances = targets.len(), port = probe.port, interval = ?probe.interval, "starting instance probes");
    let mut ticks = tokio::time::interval(probe.interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = ticks.tick() => {}
        }
        // Owned targets: borrowed ones trip the higher-ranked lifetime check in a spawned task.
        let round = futures::stream::iter(targets.iter().cloned())
            .map(|target| {
                let outcome = attempt(target.host.clone());
                async move { (target, outcome.await) }
            })
            .buffer_unordered(probe.concurrency.max(1))
            .for_each(|(target, outcome)| {
                match (states.record(target.index, outcome.is_ok(), &probe), &outcome) {
                    (Some(true), Err(error)) => tracing::warn!(
                        instance = %target.name, port = probe.port, %error, failures = probe.failure_threshold,
                        "instance fails its TCP probe; reporting it shut down"
                    ),
                    (Some(false), _) => {
                        tracing::info!(instance = %target.name, port = probe.port, "instance passes its TCP probe again")
                    }
                    (_, Err(error)) => tracing::debug!(instance = %target.name, %error, "TCP probe failed"),
                    _ => {}
                }
                std::future::ready(())
            });
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = round => {}
        }
    }
    tracing::info!("instance probes stopped");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config;

    fn probe_config(extra: &str) -> ProbeConfig {
        let doc = format!("lifecycle:\n  probe:\n    port: 1\n{extra}");
        config::parse(doc.as_bytes()).unwrap().lifecycle.probe.unwrap()
    }

    #[test]
    fn down_after_the_failure_threshold_and_up_after_the_success_threshold() {
        let mut s = ProbeStatus::default();
        assert_eq!(s.record(false, 3, 2), None);
        assert_eq!(s.record(false, 3, 2), None);
        assert_eq!(s.record(true, 3, 2), None, "a success resets the failure count");
        assert_eq!(s.record(false, 3, 2), None);
        assert_eq!(s.record(false, 3, 2), None);
        assert_eq!(s.record(false, 3, 2), Some(true));
        assert_eq!(s.record(false, 3, 2), None, "already down");
        assert_eq!(s.record(true, 3, 2), None);
        assert_eq!(s.record(true, 3, 2), Some(false));
        assert!(!s.down && s.probed);
    }

    #[test]
    fn targets_use_the_preferred_address_type_and_skip_declared_shutdowns() {
        let doc = "instances:\n  - name: a\n    addresses: [{type: Hostname, address: a.lan}, {type: ExternalIP, address: 1.2.3.4}, {type: InternalIP, address: 10.0.0.1}]\n  - name: b\n    addresses: [{type: ExternalIP, address: 1.2.3.5}]\n  - name: c\n    addresses: [{type: Hostname, address: c.lan}]\n  - name: d\n    state: shutdown\n    addresses: [{type: InternalIP, address: 10.0.0.4}]\nlifecycle:\n  probe: {port: 22}\n";
        let config = config::parse(doc.as_bytes()).unwrap();
        let got = targets(&config.instances, config.lifecycle.probe.as_ref().unwrap());
        let got: Vec<(usize, &str)> = got.iter().map(|t| (t.index, t.host.as_str())).collect();
        assert_eq!(got, [(0, "10.0.0.1"), (1, "1.2.3.5")]);
    }

    #[tokio::test]
    async fn the_task_marks_a_closed_port_down_and_recovers_when_it_listens_again() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let mut probe = probe_config("    interval: 20ms\n    timeout: 20ms\n    failureThreshold: 2\n");
        probe.port = port;
        let states = Arc::new(ProbeStates::new(vec!["a".into()]));
        let shutdown = CancellationToken::new();
        let target = ProbeTarget { index: 0, name: "a".into(), host: "127.0.0.1".into() };
        let task = tokio::spawn(run(vec![target], probe, states.clone(), shutdown.clone()));
        let wait_for = |down: bool| {
            let states = states.clone();
            async move {
                for _ in 0..500 {
                    if states.status(0).is_some_and(|s| s.probed && s.down == down) {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                panic!("instance never became down={down}");
            }
        };
        wait_for(false).await;
        drop(listener);
        wait_for(true).await;
        assert_eq!(states.summary().down_names, ["a"]);
        let _listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await.unwrap();
        wait_for(false).await;
        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(5), task).await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn probes_run_with_bounded_concurrency() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let probe = probe_config("    interval: 10s\n    concurrency: 2\n");
        let targets: Vec<ProbeTarget> =
            (0..6).map(|i| ProbeTarget { index: i, name: format!("n{i}"), host: format!("10.0.0.{i}") }).collect();
        let states = Arc::new(ProbeStates::new((0..6).map(|i| format!("n{i}")).collect()));
        let (in_flight, peak, calls) =
            (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let attempt = {
            let (in_flight, peak, calls) = (in_flight.clone(), peak.clone(), calls.clone());
            move |host: String| {
                let (in_flight, peak, calls) = (in_flight.clone(), peak.clone(), calls.clone());
                async move {
                    let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                    peak.fetch_max(now, Ordering::SeqCst);
                    calls.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    in_flight.fetch_sub(1, Ordering::SeqCst);
                    // Odd hosts refuse.
                    if host.ends_with(['1', '3', '5']) { Err("refused".to_string()) } else { Ok(()) }
                }
            }
        };
        let shutdown = CancellationToken::new();
        let task = tokio::spawn({
            let (states, shutdown) = (states.clone(), shutdown.clone());
            async move { run_with(targets, probe, states, shutdown, attempt).await }
        });
        while states.summary().probed < 6 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        shutdown.cancel();
        task.await.unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 6, "one round, every target once");
        assert_eq!(peak.load(Ordering::SeqCst), 2, "at most `concurrency` probes in flight");
        // One failure is below the default threshold of 3: nobody is down yet.
        assert_eq!(states.summary().down, 0);
        assert_eq!(states.status(1).unwrap().failures, 1);
    }
}
