//! Proxy mode under a flood (issue 25 item 4), with the whole manager: leader election on a
//! Lease, the `/livez` endpoint, the service controller and the baremetal provider's data path,
//! all in this process. From loopback, 10,000 TCP connections and 100,000 UDP sources (distinct
//! address and port pairs in the test's own `127.<block>.1.x` addresses) hit one Service's
//! listeners while another Service is probed. The caps come from the cloud-config.
//!
//! What it shows: the flooded listeners hold at most their caps (every refused connection is
//! counted, a full UDP listener evicts rather than refuses); the other Service keeps forwarding
//! TCP and UDP; `/livez` keeps answering; the Lease keeps being renewed; the connections the
//! flood leaves idle are closed by the idle timeout. What it does not show: a flood from other
//! hosts (the sources share the test's own CPU), or a flood larger than the open-file limit of
//! this process allows (10,000 client sockets plus the proxy's fit in it).
//!
//! It prints its numbers past the output capture, so a passing run in CI shows them too.

#![cfg(feature = "datapath")]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Prints past libtest's output capture (which takes `eprintln!`), so that CI shows the flood's
/// numbers for a passing run too.
macro_rules! report {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

use crate::kit::healthz;
use ccm_framework::controller::Controller;
use ccm_framework::controllers::service::ServiceController;
use ccm_framework::engine::{EngineBuilder, RunningEngine};
use ccm_framework::http::HttpConfig;
use ccm_framework::leader::LeaderElectionConfig;
use ccm_framework::options::ControllerOptions;
use ccm_provider_baremetal::BaremetalProvider;
use ccm_provider_baremetal::datapath::{ListenerKey, Protocol};
use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeSpec, NodeStatus, Service, ServicePort, ServiceSpec};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;
use testkit::{TestCluster, eventually, eventually_within, ingress};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio_util::sync::CancellationToken;

const HEALTH_PORT: u16 = 31256;
const TCP_CLIENTS: usize = 10_000;
const UDP_SOURCES: usize = 100_000;
const TCP_PER_LISTENER: usize = 1000;
const TCP_TOTAL: usize = 2000;
const UDP_PER_LISTENER: usize = 500;
const UDP_TOTAL: usize = 2000;
const TCP_IDLE: Duration = Duration::from_secs(3);
/// The leader steps down when it cannot renew within this (shorter than upstream's 10 s, so
/// that the flood spans several renewals).
const RENEW_DEADLINE: Duration = Duration::from_secs(4);
/// How long one probe of the other Service or of `/livez` may take before it counts as failed.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// The flood takes most of the process's open files: one variant at a time.
static ONE_FLOOD_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn ip(block: u8, third: u8, host: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, block, third, host))
}

fn config(block: u8) -> String {
    format!(
        "loadBalancer:
  retryAfter: 1s
  mode: proxy
  proxy:
    clusterHealthPort: {HEALTH_PORT}
    healthCheckInterval: 500ms
    healthCheckTimeout: 500ms
    drainTimeout: 1s
    maxTcpConnectionsPerListener: {TCP_PER_LISTENER}
    maxTcpConnections: {TCP_TOTAL}
    maxUdpSessionsPerListener: {UDP_PER_LISTENER}
    maxUdpSessions: {UDP_TOTAL}
    tcpIdleTimeout: {}s
  pools:
    - name: loopback
      cidrs: [127.{block}.0.240/29]
      allowLoopback: true
      allowedPorts: [\"1024-65535\"]
",
        TCP_IDLE.as_secs()
    )
}

fn service(name: &str, protocol: &str, port: i32, node_port: u16) -> Service {
    Service {
        metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
        spec: Some(ServiceSpec {
            type_: Some("LoadBalancer".into()),
            ports: Some(vec![ServicePort {
                name: Some("p".into()),
                port,
                node_port: Some(i32::from(node_port)),
                protocol: Some(protocol.into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

async fn create_node(nodes: &Api<Node>, name: &str, address: IpAddr) {
    let node = Node {
        metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
        spec: Some(NodeSpec { provider_id: Some(format!("baremetal://{name}")), ..Default::default() }),
        status: Some(NodeStatus {
            addresses: Some(vec![NodeAddress { type_: "InternalIP".into(), address: address.to_string() }]),
            ..Default::default()
        }),
    };
    nodes.create(&PostParams::default(), &node).await.expect("create node");
    let patch = json!({ "status": node.status });
    nodes.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("node status");
}

/// A nodePort stand-in that holds every connection until the peer closes it.
async fn holding_backend(addr: SocketAddr) {
    let listener = TcpListener::bind(addr).await.expect("bind backend");
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 256];
                while matches!(stream.read(&mut buf).await, Ok(n) if n > 0) {}
            });
        }
    });
}

async fn udp_echo(addr: SocketAddr) {
    let socket = UdpSocket::bind(addr).await.expect("bind udp backend");
    tokio::spawn(async move {
        let mut buf = vec![0u8; 2048];
        while let Ok((n, peer)) = socket.recv_from(&mut buf).await {
            let _ = socket.send_to(&buf[..n], peer).await;
        }
    });
}

/// One round trip through the other Service: connect, greeting, echo.
async fn tcp_round_trip(to: SocketAddr) -> Option<Duration> {
    let start = Instant::now();
    tokio::time::timeout(PROBE_TIMEOUT, async {
        let mut reader = BufReader::new(TcpStream::connect(to).await.ok()?);
        let mut line = String::new();
        reader.read_line(&mut line).await.ok()?;
        reader.get_mut().write_all(b"ping\n").await.ok()?;
        line.clear();
        reader.read_line(&mut line).await.ok()?;
        (line.trim() == "ping").then_some(())
    })
    .await
    .ok()??;
    Some(start.elapsed())
}

async fn udp_round_trip(client: &UdpSocket, to: SocketAddr) -> Option<Duration> {
    let start = Instant::now();
    client.send_to(b"ping", to).await.ok()?;
    let mut buf = [0u8; 64];
    let (n, _) = tokio::time::timeout(PROBE_TIMEOUT, client.recv_from(&mut buf)).await.ok()?.ok()?;
    (&buf[..n] == b"ping").then(|| start.elapsed())
}

async fn livez(addr: SocketAddr) -> Option<Duration> {
    let start = Instant::now();
    let status = tokio::time::timeout(PROBE_TIMEOUT, async {
        let mut stream = TcpStream::connect(addr).await.ok()?;
        stream.write_all(b"GET /livez HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").await.ok()?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await.ok()?;
        Some(String::from_utf8_lossy(&raw).starts_with("HTTP/1.1 200"))
    })
    .await
    .ok()??;
    status.then(|| start.elapsed())
}

/// The value of one series in the Prometheus text, 0 when absent.
fn metric(text: &str, series: &str) -> u64 {
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok()).unwrap_or(0)
}

/// Median and maximum of latencies.
fn spread(mut samples: Vec<Duration>) -> (Duration, Duration) {
    samples.sort();
    (samples.get(samples.len() / 2).copied().unwrap_or_default(), samples.last().copied().unwrap_or_default())
}

/// What the watchers saw while the flood ran.
#[derive(Debug, Default)]
struct Seen {
    max_tcp_listener: usize,
    max_udp_listener: usize,
    max_tcp_total: usize,
    max_udp_total: usize,
    tcp_probes: Vec<Option<Duration>>,
    udp_probes: Vec<Option<Duration>>,
    livez: Vec<Option<Duration>>,
    renewals: Vec<tokio::time::Instant>,
    always_leading: bool,
}

/// 10,000 connections to `to`, held open; returns them and how many failed to connect.
fn tcp_flood(to: SocketAddr) -> (Vec<std::net::TcpStream>, usize) {
    let mut held = Vec::with_capacity(TCP_CLIENTS);
    let mut failed = 0;
    for _ in 0..TCP_CLIENTS {
        match std::net::TcpStream::connect_timeout(&to, Duration::from_secs(5)) {
            Ok(stream) => held.push(stream),
            Err(_) => failed += 1,
        }
    }
    (held, failed)
}

/// One datagram from each of 100,000 distinct sources: 250 addresses `127.<block>.1.1-250`
/// times 400 ports from 20000 (a port another socket holds is skipped for the next one).
fn udp_flood(block: u8, to: SocketAddr) -> usize {
    let mut sent = 0;
    let mut candidate = 0usize;
    while sent < UDP_SOURCES && candidate < UDP_SOURCES * 2 {
        let (address, port) = (candidate / 400, candidate % 400);
        candidate += 1;
        let source =
            SocketAddr::new(ip(block, 1 + (address / 250) as u8, 1 + (address % 250) as u8), 20_000 + port as u16);
        let Ok(socket) = std::net::UdpSocket::bind(source) else { continue };
        if socket.send_to(b"flood", to).is_ok() {
            sent += 1;
        }
    }
    sent
}

testkit::backend_tests! {
    /// Issue 25 item 4: 10,000 TCP connections and 100,000 UDP sources at one Service hold at most
    /// the caps, while another Service keeps forwarding, `/livez` answers and the Lease is renewed.
    async fn a_flood_at_one_service_holds_the_caps_while_another_service_livez_and_the_lease_carry_on(backend) {
        let _one = ONE_FLOOD_AT_A_TIME.lock().await;
        // 10,000 client sockets and the proxy's own need more than a default soft limit of 1024.
        let limits = ccm_framework::process::raise_open_file_limit();
        report!("open-file limit of the test process (soft before, after): {limits:?}");
        let cluster = TestCluster::start(backend).await.unwrap();
        let b = if cluster.is_genuine() { 145 } else { 45 };
        let node_port = |i: u16| 30000 + u16::from(b) * 10 + i;
        let ns = cluster.fresh_namespace("bm-flood").await.unwrap();
        let services: Api<Service> = Api::namespaced(cluster.client(), &ns);
        let node_ip = ip(b, 0, 1);
        holding_backend(SocketAddr::new(node_ip, node_port(0))).await;
        udp_echo(SocketAddr::new(node_ip, node_port(1))).await;
        crate::kit::greeting_backend("other", SocketAddr::new(node_ip, node_port(2))).await;
        udp_echo(SocketAddr::new(node_ip, node_port(3))).await;
        healthz(SocketAddr::new(node_ip, HEALTH_PORT)).await;
        create_node(&Api::all(cluster.client()), &format!("n{b}-a"), node_ip).await;

        let provider = Arc::new(BaremetalProvider::from_cloud_config(Some(config(b).as_bytes())).unwrap());
        let election = LeaderElectionConfig {
            identity: "flood".into(),
            lease_duration: Duration::from_secs(6),
            renew_deadline: RENEW_DEADLINE,
            retry_period: Duration::from_secs(1),
            ..LeaderElectionConfig::new("kube-system", format!("ccm-flood-{b}"))
        };
        let options = ControllerOptions { concurrent_service_syncs: 2, ..Default::default() };
        let engine: RunningEngine = EngineBuilder::new(cluster.client(), provider.clone(), options)
            .without_builtin_controllers()
            .controller("service", Arc::new(|| Box::new(ServiceController::new()) as Box<dyn Controller>))
            .leader_election(Some(election))
            .http(Some(HttpConfig::plain("127.0.0.1:0".parse().unwrap())))
            .build()
            .unwrap()
            .start(CancellationToken::new())
            .await
            .unwrap();
        let health = engine.local_addr().expect("the health endpoint listens");

        for (name, protocol, port, np) in [
            ("flood-tcp", "TCP", 8000, node_port(0)),
            ("flood-udp", "UDP", 8053, node_port(1)),
            ("other-tcp", "TCP", 8080, node_port(2)),
            ("other-udp", "UDP", 5353, node_port(3)),
        ] {
            services.create(&PostParams::default(), &service(name, protocol, port, np)).await.unwrap();
        }
        let address = |name: &'static str| {
            let services = services.clone();
            async move {
                let found = eventually(&format!("{name} gets an address"), || async {
                    ingress(&services.get(name).await.ok()?).into_iter().next()
                })
                .await;
                found.0.parse::<IpAddr>().unwrap()
            }
        };
        let flood_tcp = SocketAddr::new(address("flood-tcp").await, 8000);
        let flood_udp = SocketAddr::new(address("flood-udp").await, 8053);
        let other_tcp = SocketAddr::new(address("other-tcp").await, 8080);
        let other_udp = SocketAddr::new(address("other-udp").await, 5353);
        eventually("the other Service answers", || tcp_round_trip(other_tcp)).await;
        let udp_client = UdpSocket::bind(SocketAddr::new(ip(b, 0, 50), 0)).await.unwrap();
        eventually("the other UDP Service answers", || udp_round_trip(&udp_client, other_udp)).await;
        eventually("/livez answers", || livez(health)).await;
        let data_path = provider.data_path().expect("the leader runs the data path");
        let tcp_key = format!("{ns}/flood-tcp");
        let udp_key = format!("{ns}/flood-udp");
        let tcp_listener = ListenerKey { address: flood_tcp.ip(), port: 8000, protocol: Protocol::Tcp };
        let udp_listener = ListenerKey { address: flood_udp.ip(), port: 8053, protocol: Protocol::Udp };

        // Watchers: the data path's counts every 10 ms, probes and the Lease every 100 ms.
        let flooding = Arc::new(AtomicBool::new(true));
        let watch = {
            let (flooding, data_path, engine_status) = (flooding.clone(), data_path.clone(), engine.leading());
            let (tcp_key, udp_key, udp_client) = (tcp_key.clone(), udp_key.clone(), &udp_client);
            async move {
                let mut seen = Seen { always_leading: true, ..Seen::default() };
                let mut last_probe = Instant::now() - Duration::from_secs(1);
                while flooding.load(Ordering::SeqCst) {
                    seen.max_tcp_listener =
                        seen.max_tcp_listener.max(data_path.listener_held(&tcp_key, &tcp_listener).unwrap_or(0));
                    seen.max_udp_listener =
                        seen.max_udp_listener.max(data_path.listener_held(&udp_key, &udp_listener).unwrap_or(0));
                    let held = data_path.held();
                    seen.max_tcp_total = seen.max_tcp_total.max(held.tcp_connections);
                    seen.max_udp_total = seen.max_udp_total.max(held.udp_sessions);
                    seen.always_leading &= *engine_status.borrow();
                    if last_probe.elapsed() >= Duration::from_millis(100) {
                        last_probe = Instant::now();
                        let (tcp, udp, live) = tokio::join!(
                            tcp_round_trip(other_tcp),
                            udp_round_trip(udp_client, other_udp),
                            livez(health)
                        );
                        seen.tcp_probes.push(tcp);
                        seen.udp_probes.push(udp);
                        seen.livez.push(live);
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                seen
            }
        };
        let lease = {
            let (flooding, engine) = (flooding.clone(), &engine);
            async move {
                let mut renewals = Vec::new();
                while flooding.load(Ordering::SeqCst) {
                    if let Some(at) = engine.leader_status().and_then(|s| s.last_renewed)
                        && renewals.last() != Some(&at)
                    {
                        renewals.push(at);
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                renewals
            }
        };

        let started = Instant::now();
        let tcp = tokio::task::spawn_blocking(move || tcp_flood(flood_tcp));
        let udp = tokio::task::spawn_blocking(move || udp_flood(b, flood_udp));
        let flood = async {
            let (tcp, udp) = (tcp.await.unwrap(), udp.await.unwrap());
            let flood_time = started.elapsed();
            // Let the proxy work through what is queued (accept backlog, datagrams).
            let text = || engine.metrics().encode();
            let refused_series = |reason: &str| {
                format!(r#"ccm_datapath_refused_connections_total{{service="{tcp_key}",reason="{reason}"}}"#)
            };
            let opened_series =
                format!(r#"ccm_datapath_connections_total{{service="{tcp_key}",backend="n{b}-a",protocol="TCP"}}"#);
            let connected = tcp.0.len();
            // Bounded, and no panic here: the assertions below say what went wrong, with numbers.
            let deadline = Instant::now() + Duration::from_secs(20);
            while Instant::now() < deadline {
                let t = text();
                let refused =
                    metric(&t, &refused_series("listener_limit")) + metric(&t, &refused_series("total_limit"));
                if refused + metric(&t, &opened_series) >= connected as u64 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            flooding.store(false, Ordering::SeqCst);
            (tcp, udp, flood_time)
        };
        let (mut seen, renewals, ((tcp_streams, tcp_failed), udp_sent, flood_time)) =
            tokio::join!(watch, lease, flood);
        seen.renewals = renewals;

        let text = engine.metrics().encode();
        let refused = |key: &str, reason: &str| {
            metric(&text, &format!(r#"ccm_datapath_refused_connections_total{{service="{key}",reason="{reason}"}}"#))
        };
        let opened = |key: &str, protocol: &str| {
            let labels = format!(r#"service="{key}",backend="n{b}-a",protocol="{protocol}""#);
            metric(&text, &format!("ccm_datapath_connections_total{{{labels}}}"))
        };
        let (refused_tcp, refused_tcp_total) = (refused(&tcp_key, "listener_limit"), refused(&tcp_key, "total_limit"));
        let (opened_tcp, opened_udp) = (opened(&tcp_key, "TCP"), opened(&udp_key, "UDP"));
        let evicted = metric(&text, &format!(r#"ccm_datapath_udp_sessions_evicted_total{{service="{udp_key}"}}"#));
        let refused_udp = refused(&udp_key, "total_limit");
        let ok = |probes: &[Option<Duration>]| probes.iter().flatten().copied().collect::<Vec<_>>();
        let (tcp_p50, tcp_max) = spread(ok(&seen.tcp_probes));
        let (udp_p50, udp_max) = spread(ok(&seen.udp_probes));
        let (livez_p50, livez_max) = spread(ok(&seen.livez));
        let max_gap = seen.renewals.windows(2).map(|w| w[1] - w[0]).max().unwrap_or_default();
        report!(
            "flood ({}): {} TCP connections ({tcp_failed} failed to connect) and {udp_sent} UDP sources in {flood_time:?}",
            if cluster.is_genuine() { "genuine" } else { "local" },
            tcp_streams.len()
        );
        report!(
            "TCP: held at most {} on the listener (cap {TCP_PER_LISTENER}), {} in the data path (cap {TCP_TOTAL}); {opened_tcp} forwarded, {refused_tcp} refused at the listener cap, {refused_tcp_total} at the total",
            seen.max_tcp_listener, seen.max_tcp_total
        );
        report!(
            "UDP: at most {} sessions on the listener (cap {UDP_PER_LISTENER}), {} in the data path (cap {UDP_TOTAL}); {opened_udp} sessions opened, {evicted} evicted, {refused_udp} refused",
            seen.max_udp_listener, seen.max_udp_total
        );
        report!(
            "other Service during the flood: TCP round trip median {tcp_p50:?} max {tcp_max:?} ({} of {} ok), UDP median {udp_p50:?} max {udp_max:?} ({} of {} ok)",
            ok(&seen.tcp_probes).len(), seen.tcp_probes.len(), ok(&seen.udp_probes).len(), seen.udp_probes.len()
        );
        report!(
            "/livez during the flood: median {livez_p50:?} max {livez_max:?} ({} of {} ok); Lease renewed {} times, longest gap {max_gap:?}, leading throughout: {}",
            ok(&seen.livez).len(), seen.livez.len(), seen.renewals.len(), seen.always_leading
        );

        assert_eq!(tcp_streams.len() + tcp_failed, TCP_CLIENTS);
        assert_eq!(udp_sent, UDP_SOURCES, "every source sent");
        assert!(seen.max_tcp_listener <= TCP_PER_LISTENER, "the TCP listener held {}", seen.max_tcp_listener);
        assert_eq!(seen.max_tcp_listener, TCP_PER_LISTENER, "the flood filled the listener");
        assert!(seen.max_tcp_total <= TCP_TOTAL);
        // A client that gave up connecting (backlog full) may still have been accepted later.
        let accepted = refused_tcp + refused_tcp_total + opened_tcp;
        assert!(
            (tcp_streams.len() as u64..=TCP_CLIENTS as u64).contains(&accepted),
            "every accepted connection was forwarded or refused and counted: {accepted}"
        );
        assert!(refused_tcp > 0);
        assert!(seen.max_udp_listener <= UDP_PER_LISTENER, "the UDP listener held {}", seen.max_udp_listener);
        assert!(seen.max_udp_total <= UDP_TOTAL);
        assert!(opened_udp > UDP_PER_LISTENER as u64 && evicted > 0, "new sources were served by eviction");
        assert_eq!(refused_udp, 0, "a full listener evicts, it never refuses");
        assert!(
            !seen.tcp_probes.is_empty() && seen.tcp_probes.iter().all(Option::is_some),
            "the other Service forwarded TCP throughout"
        );
        assert!(seen.udp_probes.iter().all(Option::is_some), "the other Service forwarded UDP throughout");
        assert!(seen.livez.iter().all(Option::is_some), "/livez answered throughout");
        assert!(seen.always_leading, "the Lease was never lost");
        assert!(
            seen.renewals.len() >= 2 && max_gap < RENEW_DEADLINE,
            "renewals {:?}, longest gap {max_gap:?}",
            seen.renewals.len()
        );

        // The flood's connections send nothing: the idle timeout gives their slots back.
        let idle_series = format!(r#"ccm_datapath_idle_closed_connections_total{{service="{tcp_key}"}}"#);
        eventually_within("idle flood connections closed", TCP_IDLE * 3, || async {
            (data_path.listener_held(&tcp_key, &tcp_listener) == Some(0)).then_some(())
        })
        .await;
        let idle_closed = metric(&engine.metrics().encode(), &idle_series);
        report!("idle timeout ({TCP_IDLE:?}): {idle_closed} flood connections closed, listener holds 0");
        assert!(idle_closed >= TCP_PER_LISTENER as u64);
        drop(tcp_streams);
        engine.stop().await.unwrap();
    }
}
