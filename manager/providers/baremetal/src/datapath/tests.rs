//! The data path with real sockets on loopback. Every test owns a `127.<n>.0.0/16` block, so
//! tests run in parallel with fixed ports.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use testkit::eventually_within;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpSocket, TcpStream, UdpSocket};
use tokio_util::sync::CancellationToken;

use super::*;

const NODE_PORT: u16 = 30080;
const HEALTH_PORT: u16 = 10256;
const WAIT: Duration = Duration::from_secs(10);

fn ip(block: u8, host: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, block, 0, host))
}

/// Fast health checks so that tests take milliseconds, not seconds.
fn settings() -> Settings {
    Settings {
        health: HealthSettings {
            interval: Duration::from_millis(100),
            timeout: Duration::from_millis(100),
            unhealthy_threshold: 2,
            healthy_threshold: 1,
        },
        cluster_health_port: HEALTH_PORT,
        drain_timeout: Duration::from_millis(300),
        udp_idle_timeout: Duration::from_millis(500),
        connect_timeout: Duration::from_millis(500),
        ..Settings::default()
    }
}

fn data_path(settings: Settings) -> (DataPath, Arc<Metrics>) {
    let metrics = Arc::new(Metrics::new());
    (DataPath::new(settings, &metrics, CancellationToken::new()), metrics)
}

/// A TCP backend that greets every connection with its name, then echoes.
async fn tcp_backend(name: &str, addr: SocketAddr) -> CancellationToken {
    let listener = TcpListener::bind(addr).await.expect("bind backend");
    let stop = CancellationToken::new();
    let name = name.to_string();
    let token = stop.clone();
    tokio::spawn(async move {
        loop {
            let (mut stream, _) = tokio::select! {
                _ = token.cancelled() => return,
                r = listener.accept() => match r { Ok(s) => s, Err(_) => continue },
            };
            let name = name.clone();
            let token = token.clone();
            tokio::spawn(async move {
                if stream.write_all(format!("{name}\n").as_bytes()).await.is_err() {
                    return;
                }
                let mut buf = [0u8; 4096];
                loop {
                    let n = tokio::select! {
                        _ = token.cancelled() => return,
                        r = stream.read(&mut buf) => match r { Ok(0) | Err(_) => return, Ok(n) => n },
                    };
                    if stream.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    stop
}

/// A UDP backend answering `<name>:<payload>`.
async fn udp_backend(name: &str, addr: SocketAddr) {
    let socket = UdpSocket::bind(addr).await.expect("bind udp backend");
    let name = name.to_string();
    tokio::spawn(async move {
        let mut buf = [0u8; 2048];
        while let Ok((n, peer)) = socket.recv_from(&mut buf).await {
            let mut reply = format!("{name}:").into_bytes();
            reply.extend_from_slice(&buf[..n]);
            let _ = socket.send_to(&reply, peer).await;
        }
    });
}

/// An HTTP health endpoint answering 200 while `ok` is set, 503 otherwise.
async fn health_server(addr: SocketAddr, ok: Arc<AtomicBool>) {
    let listener = TcpListener::bind(addr).await.expect("bind health");
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let ok = ok.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                let _ = stream.read(&mut buf).await;
                let status = if ok.load(Ordering::SeqCst) { "200 OK" } else { "503 Service Unavailable" };
                let _ = stream.write_all(format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\n\r\n").as_bytes()).await;
            });
        }
    });
}

/// Connect from `source` (any loopback address) and return the backend's greeting and stream.
async fn connect_from(source: Option<IpAddr>, to: SocketAddr) -> Option<(String, BufReader<TcpStream>)> {
    let socket = TcpSocket::new_v4().ok()?;
    if let Some(source) = source {
        socket.bind(SocketAddr::new(source, 0)).ok()?;
    }
    let stream = tokio::time::timeout(WAIT, socket.connect(to)).await.ok()?.ok()?;
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    let n = tokio::time::timeout(Duration::from_secs(2), reader.read_line(&mut line)).await.ok()?.ok()?;
    (n > 0).then(|| (line.trim().to_string(), reader))
}

async fn greeting(to: SocketAddr) -> Option<String> {
    connect_from(None, to).await.map(|(name, _)| name)
}

/// Send a line on an open connection and expect it echoed.
async fn echoes(reader: &mut BufReader<TcpStream>, text: &str) -> bool {
    if reader.get_mut().write_all(format!("{text}\n").as_bytes()).await.is_err() {
        return false;
    }
    let mut line = String::new();
    matches!(tokio::time::timeout(Duration::from_secs(2), reader.read_line(&mut line)).await, Ok(Ok(n)) if n > 0)
        && line.trim() == text
}

fn spec(block: u8, ports: &[(Protocol, u16)], backends: &[(&str, u8)], health_check: HealthCheck) -> ServiceSpec {
    ServiceSpec {
        key: format!("default/svc-{block}"),
        addresses: vec![ip(block, 100)],
        ports: ports
            .iter()
            .map(|(protocol, port)| PortSpec { protocol: *protocol, port: *port, target_port: NODE_PORT })
            .collect(),
        backends: backends
            .iter()
            .map(|(name, host)| Backend { name: name.to_string(), ip: ip(block, *host) })
            .collect(),
        health_check,
        affinity: Affinity::None,
        balance: Balance::RoundRobin,
        source_ranges: Vec::new(),
    }
}

fn http_check(port: u16) -> HealthCheck {
    HealthCheck::Http { port, path: "/healthz".into() }
}

#[tokio::test]
async fn tcp_traffic_reaches_a_backend_and_is_counted() {
    let b = 10;
    tcp_backend("node-a", SocketAddr::new(ip(b, 1), NODE_PORT)).await;
    let (dp, metrics) = data_path(settings());
    dp.apply(spec(b, &[(Protocol::Tcp, 80)], &[("node-a", 1)], HealthCheck::None)).unwrap();
    let (name, mut stream) = connect_from(None, SocketAddr::new(ip(b, 100), 80)).await.expect("connect via the proxy");
    assert_eq!(name, "node-a");
    assert!(echoes(&mut stream, "hello").await);
    drop(stream);
    let text = metrics.encode();
    assert!(
        text.contains(r#"ccm_datapath_connections_total{service="default/svc-10",backend="node-a",protocol="TCP"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(
            r#"ccm_datapath_bytes_total{service="default/svc-10",backend="node-a",protocol="TCP",direction="rx"} 6"#
        ),
        "{text}"
    );
    assert!(text.contains(r#"ccm_datapath_backend_healthy{service="default/svc-10",backend="node-a"} 1"#), "{text}");
}

#[tokio::test]
async fn udp_traffic_reaches_a_backend_and_replies_find_their_client() {
    let b = 11;
    udp_backend("node-a", SocketAddr::new(ip(b, 1), NODE_PORT)).await;
    let (dp, _) = data_path(settings());
    dp.apply(spec(b, &[(Protocol::Udp, 53)], &[("node-a", 1)], HealthCheck::None)).unwrap();
    let lb = SocketAddr::new(ip(b, 100), 53);
    for client_host in [50, 51] {
        let client = UdpSocket::bind(SocketAddr::new(ip(b, client_host), 0)).await.unwrap();
        for i in 0..3 {
            client.send_to(format!("ping{i}").as_bytes(), lb).await.unwrap();
            let mut buf = [0u8; 64];
            let (n, from) = tokio::time::timeout(WAIT, client.recv_from(&mut buf)).await.expect("a reply").unwrap();
            assert_eq!(from, lb, "the reply comes from the load-balancer address");
            assert_eq!(&buf[..n], format!("node-a:ping{i}").as_bytes());
        }
    }
}

#[tokio::test]
async fn udp_sessions_expire_when_idle() {
    let b = 12;
    udp_backend("node-a", SocketAddr::new(ip(b, 1), NODE_PORT)).await;
    let (dp, metrics) = data_path(settings());
    dp.apply(spec(b, &[(Protocol::Udp, 53)], &[("node-a", 1)], HealthCheck::None)).unwrap();
    let client = UdpSocket::bind(SocketAddr::new(ip(b, 50), 0)).await.unwrap();
    client.send_to(b"x", SocketAddr::new(ip(b, 100), 53)).await.unwrap();
    let mut buf = [0u8; 64];
    tokio::time::timeout(WAIT, client.recv_from(&mut buf)).await.expect("a reply").unwrap();
    let active = r#"ccm_datapath_active_connections{service="default/svc-12",backend="node-a",protocol="UDP"}"#;
    assert!(metrics.encode().contains(&format!("{active} 1")));
    // Idle timeout 500 ms, swept every 250 ms.
    eventually_within("the idle session is gone", WAIT, || async { metrics.encode().contains(&format!("{active} 0")) })
        .await;
}

#[tokio::test]
async fn a_failing_health_check_removes_a_backend_within_the_detection_bound_and_traffic_continues() {
    let b = 13;
    let lb = SocketAddr::new(ip(b, 100), 80);
    let mut up = Vec::new();
    for (name, host) in [("node-a", 1), ("node-b", 2)] {
        tcp_backend(name, SocketAddr::new(ip(b, host), NODE_PORT)).await;
        let ok = Arc::new(AtomicBool::new(true));
        health_server(SocketAddr::new(ip(b, host), HEALTH_PORT), ok.clone()).await;
        up.push(ok);
    }
    let settings = settings();
    let bound = settings.health.detection_bound();
    let (dp, metrics) = data_path(settings);
    dp.apply(spec(b, &[(Protocol::Tcp, 80)], &[("node-a", 1), ("node-b", 2)], http_check(HEALTH_PORT))).unwrap();
    eventually_within("both backends healthy", WAIT, || async {
        dp.backend_health("default/svc-13").values().all(|h| *h == select::Health::Healthy)
    })
    .await;
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..4 {
        seen.insert(greeting(lb).await.expect("traffic flows"));
    }
    assert_eq!(seen.len(), 2, "round robin uses both backends: {seen:?}");

    up[0].store(false, Ordering::SeqCst);
    let failed_at = Instant::now();
    eventually_within("node-a marked unhealthy", bound + Duration::from_millis(200), || async {
        dp.backend_health("default/svc-13").get("node-a") == Some(&select::Health::Unhealthy)
    })
    .await;
    assert!(failed_at.elapsed() <= bound + Duration::from_millis(200));
    for _ in 0..6 {
        assert_eq!(greeting(lb).await.as_deref(), Some("node-b"), "traffic continues on the healthy backend");
    }
    let text = metrics.encode();
    assert!(text.contains(r#"ccm_datapath_backend_healthy{service="default/svc-13",backend="node-a"} 0"#), "{text}");

    // One success brings it back.
    up[0].store(true, Ordering::SeqCst);
    eventually_within("node-a healthy again", bound, || async {
        dp.backend_health("default/svc-13").get("node-a") == Some(&select::Health::Healthy)
    })
    .await;
}

#[tokio::test]
async fn local_traffic_policy_checks_the_health_check_node_port() {
    use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeStatus, Service, ServicePort};
    let b = 14;
    let hcnp = 32100;
    // Both Nodes pass kube-proxy's check, but only node-a has a local endpoint.
    for (name, host, local_endpoint) in [("node-a", 1, true), ("node-b", 2, false)] {
        tcp_backend(name, SocketAddr::new(ip(b, host), NODE_PORT)).await;
        health_server(SocketAddr::new(ip(b, host), HEALTH_PORT), Arc::new(AtomicBool::new(true))).await;
        health_server(SocketAddr::new(ip(b, host), hcnp), Arc::new(AtomicBool::new(local_endpoint))).await;
    }
    let node = |name: &str, host: u8| Node {
        metadata: kube::api::ObjectMeta { name: Some(name.into()), ..Default::default() },
        status: Some(NodeStatus {
            addresses: Some(vec![NodeAddress { type_: "InternalIP".into(), address: ip(b, host).to_string() }]),
            ..Default::default()
        }),
        ..Default::default()
    };
    let nodes = [node("node-a", 1), node("node-b", 2)];
    let service = Service {
        metadata: kube::api::ObjectMeta {
            name: Some("local".into()),
            namespace: Some("default".into()),
            ..Default::default()
        },
        spec: Some(k8s_openapi::api::core::v1::ServiceSpec {
            type_: Some("LoadBalancer".into()),
            external_traffic_policy: Some("Local".into()),
            health_check_node_port: Some(i32::from(hcnp)),
            ports: Some(vec![ServicePort { port: 80, node_port: Some(i32::from(NODE_PORT)), ..Default::default() }]),
            ..Default::default()
        }),
        ..Default::default()
    };
    let settings = settings();
    let spec = config::service_spec(&service, &[&nodes[0], &nodes[1]], &[ip(b, 100)], &settings).unwrap();
    assert_eq!(spec.health_check, http_check(hcnp));
    let (dp, _) = data_path(settings);
    dp.apply(spec).unwrap();
    eventually_within("node-b fails its healthCheckNodePort", WAIT, || async {
        dp.backend_health("default/local").get("node-b") == Some(&select::Health::Unhealthy)
    })
    .await;
    for _ in 0..6 {
        assert_eq!(greeting(SocketAddr::new(ip(b, 100), 80)).await.as_deref(), Some("node-a"));
    }
}

#[tokio::test]
async fn adding_and_removing_ports_keeps_connections_on_the_other_ports() {
    let b = 15;
    tcp_backend("node-a", SocketAddr::new(ip(b, 1), NODE_PORT)).await;
    let (dp, _) = data_path(settings());
    let one = spec(b, &[(Protocol::Tcp, 80)], &[("node-a", 1)], HealthCheck::None);
    dp.apply(one.clone()).unwrap();
    let (_, mut on_80) = connect_from(None, SocketAddr::new(ip(b, 100), 80)).await.expect("port 80");

    // Add 443: the connection on 80 carries on, 443 serves.
    let two = spec(b, &[(Protocol::Tcp, 80), (Protocol::Tcp, 443)], &[("node-a", 1)], HealthCheck::None);
    dp.apply(two.clone()).unwrap();
    assert!(echoes(&mut on_80, "still here").await, "port 80 connection survived adding 443");
    let (_, mut on_443) = connect_from(None, SocketAddr::new(ip(b, 100), 443)).await.expect("port 443");

    // Remove 80: the connection on 443 carries on; 80 accepts nothing new.
    let only_443 = spec(b, &[(Protocol::Tcp, 443)], &[("node-a", 1)], HealthCheck::None);
    dp.apply(only_443).unwrap();
    assert!(echoes(&mut on_443, "443 lives").await, "port 443 connection survived removing 80");
    eventually_within("port 80 accepts nothing new", WAIT, || async {
        TcpStream::connect(SocketAddr::new(ip(b, 100), 80)).await.is_err()
    })
    .await;
    // The removed port's connection drains: it works now and is closed after the drain time.
    assert!(echoes(&mut on_80, "draining").await);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!echoes(&mut on_80, "gone").await, "port 80 connection closed after draining");
    assert!(echoes(&mut on_443, "443 still lives").await);
    assert_eq!(dp.listeners("default/svc-15").len(), 1);
}

#[tokio::test]
async fn a_removed_backend_drains_its_connections_and_gets_no_new_ones() {
    let b = 16;
    let lb = SocketAddr::new(ip(b, 100), 80);
    tcp_backend("node-a", SocketAddr::new(ip(b, 1), NODE_PORT)).await;
    tcp_backend("node-b", SocketAddr::new(ip(b, 2), NODE_PORT)).await;
    let (dp, _) = data_path(settings());
    dp.apply(spec(b, &[(Protocol::Tcp, 80)], &[("node-a", 1)], HealthCheck::None)).unwrap();
    let (name, mut old) = connect_from(None, lb).await.unwrap();
    assert_eq!(name, "node-a");
    dp.apply(spec(b, &[(Protocol::Tcp, 80)], &[("node-b", 2)], HealthCheck::None)).unwrap();
    assert_eq!(greeting(lb).await.as_deref(), Some("node-b"));
    assert!(echoes(&mut old, "in flight").await, "the old connection drains instead of dropping");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!echoes(&mut old, "late").await, "closed once the drain time is over");
}

#[tokio::test]
async fn source_ranges_block_and_allow() {
    let b = 17;
    let lb = SocketAddr::new(ip(b, 100), 80);
    tcp_backend("node-a", SocketAddr::new(ip(b, 1), NODE_PORT)).await;
    let (dp, metrics) = data_path(settings());
    let mut s = spec(b, &[(Protocol::Tcp, 80)], &[("node-a", 1)], HealthCheck::None);
    s.source_ranges = vec![IpNet::new(ip(b, 64), 26).unwrap().trunc()];
    dp.apply(s.clone()).unwrap();
    assert_eq!(connect_from(Some(ip(b, 70)), lb).await.map(|c| c.0).as_deref(), Some("node-a"), "inside the range");
    assert!(connect_from(Some(ip(b, 200)), lb).await.is_none(), "outside the range is refused");
    assert!(
        metrics
            .encode()
            .contains(r#"ccm_datapath_refused_connections_total{service="default/svc-17",reason="source_range"} 1"#)
    );
    // Ranges change live.
    s.source_ranges = vec![IpNet::new(ip(b, 200), 32).unwrap()];
    dp.apply(s).unwrap();
    assert!(connect_from(Some(ip(b, 200)), lb).await.is_some());
    assert!(connect_from(Some(ip(b, 70)), lb).await.is_none());
}

#[tokio::test]
async fn client_ip_affinity_pins_a_client() {
    let b = 18;
    let lb = SocketAddr::new(ip(b, 100), 80);
    for (name, host) in [("node-a", 1), ("node-b", 2), ("node-c", 3)] {
        tcp_backend(name, SocketAddr::new(ip(b, host), NODE_PORT)).await;
    }
    let (dp, _) = data_path(settings());
    let mut s = spec(b, &[(Protocol::Tcp, 80)], &[("node-a", 1), ("node-b", 2), ("node-c", 3)], HealthCheck::None);
    s.affinity = Affinity::ClientIp;
    dp.apply(s).unwrap();
    let mut per_client = Vec::new();
    for client in 150..170 {
        let mut names = std::collections::BTreeSet::new();
        for _ in 0..5 {
            names.insert(connect_from(Some(ip(b, client)), lb).await.expect("connect").0);
        }
        assert_eq!(names.len(), 1, "client {client} was pinned to one backend: {names:?}");
        per_client.extend(names);
    }
    let spread: std::collections::BTreeSet<_> = per_client.iter().collect();
    assert!(spread.len() >= 2, "different clients use different backends: {spread:?}");
}

#[tokio::test]
async fn a_failed_connect_moves_on_to_another_backend() {
    let b = 19;
    // node-a has nothing listening on the nodePort.
    tcp_backend("node-b", SocketAddr::new(ip(b, 2), NODE_PORT)).await;
    let (dp, _) = data_path(settings());
    dp.apply(spec(b, &[(Protocol::Tcp, 80)], &[("node-a", 1), ("node-b", 2)], HealthCheck::None)).unwrap();
    for _ in 0..4 {
        assert_eq!(greeting(SocketAddr::new(ip(b, 100), 80)).await.as_deref(), Some("node-b"));
    }
}

#[tokio::test]
async fn health_checks_are_shared_between_services_and_stop_with_the_last() {
    let b = 20;
    let (dp, _) = data_path(settings());
    let mut first = spec(b, &[(Protocol::Tcp, 80)], &[("node-a", 1), ("node-b", 2)], http_check(HEALTH_PORT));
    dp.apply(first.clone()).unwrap();
    first.key = "default/other".into();
    first.addresses = vec![ip(b, 101)];
    dp.apply(first).unwrap();
    assert_eq!(dp.health_checkers(), 2, "one checker per Node, not per Service");
    dp.remove("default/svc-20");
    assert_eq!(dp.health_checkers(), 2);
    dp.remove("default/other");
    assert_eq!(dp.health_checkers(), 0);
    assert!(dp.keys().is_empty());
}

#[tokio::test]
async fn a_listener_that_cannot_bind_is_reported_and_the_others_serve() {
    let b = 21;
    tcp_backend("node-a", SocketAddr::new(ip(b, 1), NODE_PORT)).await;
    let _taken = TcpListener::bind(SocketAddr::new(ip(b, 100), 81)).await.unwrap();
    let (dp, _) = data_path(settings());
    let error = dp
        .apply(spec(b, &[(Protocol::Tcp, 80), (Protocol::Tcp, 81)], &[("node-a", 1)], HealthCheck::None))
        .unwrap_err();
    assert!(matches!(&error, DataPathError::Bind { failed } if failed.len() == 1 && failed[0].0.port == 81), "{error}");
    assert_eq!(greeting(SocketAddr::new(ip(b, 100), 80)).await.as_deref(), Some("node-a"));
}

#[tokio::test]
async fn shutdown_closes_listeners() {
    let b = 22;
    tcp_backend("node-a", SocketAddr::new(ip(b, 1), NODE_PORT)).await;
    let (dp, _) = data_path(settings());
    dp.apply(spec(b, &[(Protocol::Tcp, 80)], &[("node-a", 1)], HealthCheck::None)).unwrap();
    dp.shutdown();
    eventually_within("the listener is closed", WAIT, || async {
        TcpStream::connect(SocketAddr::new(ip(b, 100), 80)).await.is_err()
    })
    .await;
    assert!(matches!(dp.apply(spec(b, &[], &[], HealthCheck::None)), Err(DataPathError::ShutDown)));
}

/// Deterministic pseudo-random bytes (xorshift), so corruption or reordering shows.
fn payload(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

fn sha256(data: &[u8]) -> Vec<u8> {
    ring::digest::digest(&ring::digest::SHA256, data).as_ref().to_vec()
}

fn byte_counter(metrics: &Metrics, block: u8, direction: &str) -> Option<u64> {
    let prefix = format!(
        r#"ccm_datapath_bytes_total{{service="default/svc-{block}",backend="node-a",protocol="TCP",direction="{direction}"}} "#
    );
    metrics.encode().lines().find_map(|l| l.strip_prefix(prefix.as_str()).and_then(|v| v.trim().parse().ok()))
}

const LARGE: usize = 8 * 1024 * 1024;

/// The backend reads the client's payload to its end (the client's half-close), answers with
/// its SHA-256, then sends its own payload and closes. Client and backend payloads cross the
/// proxy in full, each way after the other side has half-closed.
async fn large_payloads_cross_intact(block: u8, how: TcpForwarding) {
    let listener = TcpListener::bind(SocketAddr::new(ip(block, 1), NODE_PORT)).await.expect("bind backend");
    let backend = tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.expect("accept");
        let mut got = Vec::new();
        stream.read_to_end(&mut got).await.expect("read the client's payload");
        stream.write_all(&sha256(&got)).await.expect("write digest");
        stream.write_all(&payload(2, LARGE)).await.expect("write payload");
        stream.shutdown().await.expect("close");
    });
    let metrics = Arc::new(Metrics::new());
    let dp = DataPath::with_tcp_forwarding(settings(), how, &metrics, CancellationToken::new());
    dp.apply(spec(block, &[(Protocol::Tcp, 80)], &[("node-a", 1)], HealthCheck::None)).unwrap();
    let mut client = TcpStream::connect(SocketAddr::new(ip(block, 100), 80)).await.expect("connect via the proxy");
    let sent = payload(1, LARGE);
    let (mut read_half, mut write_half) = client.split();
    let (written, answer) = tokio::join!(
        async {
            write_half.write_all(&sent).await?;
            write_half.shutdown().await
        },
        async {
            let mut answer = Vec::new();
            read_half.read_to_end(&mut answer).await.map(|_| answer)
        }
    );
    written.expect("send the payload and half-close");
    let answer = answer.expect("read the answer to its end");
    backend.await.expect("backend");
    assert_eq!(answer.len(), 32 + LARGE, "the backend's bytes arrive in full");
    assert_eq!(answer[..32], sha256(&sent)[..], "the client's payload reaches the backend intact");
    assert!(answer[32..] == payload(2, LARGE)[..], "the backend's payload reaches the client intact");
    assert_eq!(byte_counter(&metrics, block, "rx"), Some(LARGE as u64));
    assert_eq!(byte_counter(&metrics, block, "tx"), Some(32 + LARGE as u64));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spliced_tcp_moves_8_mib_each_way_intact_across_half_closes_and_counts_every_byte() {
    large_payloads_cross_intact(23, TcpForwarding::Splice).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copied_tcp_moves_8_mib_each_way_intact_across_half_closes_and_counts_every_byte() {
    large_payloads_cross_intact(24, TcpForwarding::Copy).await;
}

/// The backend says goodbye and half-closes first; the client sees the end of the stream yet
/// can still send, and every byte it sends reaches the backend.
async fn a_backend_that_finishes_first_still_receives(block: u8, how: TcpForwarding) {
    let listener = TcpListener::bind(SocketAddr::new(ip(block, 1), NODE_PORT)).await.expect("bind backend");
    let backend = tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.expect("accept");
        stream.write_all(b"bye").await.expect("write");
        stream.shutdown().await.expect("half-close");
        let mut got = Vec::new();
        stream.read_to_end(&mut got).await.expect("read the client's bytes");
        got
    });
    let metrics = Arc::new(Metrics::new());
    let dp = DataPath::with_tcp_forwarding(settings(), how, &metrics, CancellationToken::new());
    dp.apply(spec(block, &[(Protocol::Tcp, 80)], &[("node-a", 1)], HealthCheck::None)).unwrap();
    let mut client = TcpStream::connect(SocketAddr::new(ip(block, 100), 80)).await.expect("connect via the proxy");
    let mut first = Vec::new();
    tokio::time::timeout(WAIT, client.read_to_end(&mut first)).await.expect("end of stream").expect("read");
    assert_eq!(first, b"bye");
    let sent = payload(3, 1024 * 1024);
    client.write_all(&sent).await.expect("the client can still send after the backend's half-close");
    client.shutdown().await.expect("close");
    let got = tokio::time::timeout(WAIT, backend).await.expect("backend finishes").expect("backend");
    assert!(got == sent, "the backend receives the client's bytes intact");
    assert_eq!(byte_counter(&metrics, block, "rx"), Some(sent.len() as u64));
    assert_eq!(byte_counter(&metrics, block, "tx"), Some(3));
}

#[tokio::test]
async fn spliced_tcp_keeps_the_client_s_direction_open_after_the_backend_half_closes() {
    a_backend_that_finishes_first_still_receives(25, TcpForwarding::Splice).await;
}

#[tokio::test]
async fn copied_tcp_keeps_the_client_s_direction_open_after_the_backend_half_closes() {
    a_backend_that_finishes_first_still_receives(26, TcpForwarding::Copy).await;
}

// ----- What a flood may take (issue 25 item 4): caps, idle timeout, eviction.

/// Whether the proxy reset or closed a connection (no greeting, or end of stream).
async fn is_refused(to: SocketAddr) -> bool {
    let Ok(Ok(mut stream)) = tokio::time::timeout(WAIT, TcpStream::connect(to)).await else { return true };
    let mut buf = [0u8; 64];
    matches!(tokio::time::timeout(WAIT, stream.read(&mut buf)).await, Ok(Ok(0) | Err(_)))
}

fn refused_count(metrics: &Metrics, block: u8, reason: &str) -> u64 {
    let prefix =
        format!(r#"ccm_datapath_refused_connections_total{{service="default/svc-{block}",reason="{reason}"}} "#);
    metrics.encode().lines().find_map(|l| l.strip_prefix(&prefix)?.parse().ok()).unwrap_or(0)
}

#[tokio::test]
async fn a_listener_at_its_tcp_cap_resets_new_connections_counts_them_and_admits_again_once_one_closes() {
    let b = 27;
    tcp_backend("node-a", SocketAddr::new(ip(b, 1), NODE_PORT)).await;
    let limited = Settings { max_tcp_connections_per_listener: 2, max_tcp_connections: 10, ..settings() };
    let (dp, metrics) = data_path(limited);
    dp.apply(spec(b, &[(Protocol::Tcp, 80)], &[("node-a", 1)], HealthCheck::None)).unwrap();
    let lb = SocketAddr::new(ip(b, 100), 80);
    let (_, mut first) = connect_from(None, lb).await.expect("first connection");
    let (_, _second) = connect_from(None, lb).await.expect("second connection");
    assert!(is_refused(lb).await, "a third connection is reset");
    assert_eq!(refused_count(&metrics, b, "listener_limit"), 1);
    let listener = ListenerKey { address: ip(b, 100), port: 80, protocol: Protocol::Tcp };
    assert_eq!(dp.listener_held("default/svc-27", &listener), Some(2));
    assert_eq!(dp.held().tcp_connections, 2);
    assert!(echoes(&mut first, "held connections still forward").await);
    drop(first);
    eventually_within("a slot opens once a connection closes", WAIT, || async {
        connect_from(None, lb).await.is_some()
    })
    .await;
}

#[tokio::test]
async fn the_data_path_total_caps_every_listener_together() {
    let b = 28;
    tcp_backend("node-a", SocketAddr::new(ip(b, 1), NODE_PORT)).await;
    let limited = Settings { max_tcp_connections_per_listener: 2, max_tcp_connections: 3, ..settings() };
    let (dp, metrics) = data_path(limited);
    dp.apply(spec(b, &[(Protocol::Tcp, 80), (Protocol::Tcp, 81)], &[("node-a", 1)], HealthCheck::None)).unwrap();
    let (on80, on81) = (SocketAddr::new(ip(b, 100), 80), SocketAddr::new(ip(b, 100), 81));
    let _held = [
        connect_from(None, on80).await.expect("80 #1"),
        connect_from(None, on80).await.expect("80 #2"),
        connect_from(None, on81).await.expect("81 #1"),
    ];
    assert!(is_refused(on81).await, "port 81 is below its own cap but the data path is full");
    assert_eq!(refused_count(&metrics, b, "total_limit"), 1);
    assert_eq!(refused_count(&metrics, b, "listener_limit"), 0);
    assert_eq!(dp.held().tcp_connections, 3);
}

#[tokio::test]
async fn one_service_holds_at_most_its_share_over_all_its_listeners_and_leaves_the_rest_to_others() {
    let b = 32;
    tcp_backend("node-a", SocketAddr::new(ip(b, 1), NODE_PORT)).await;
    let limited = Settings {
        max_tcp_connections_per_listener: 2,
        max_tcp_connections_per_service: 3,
        max_tcp_connections: 10,
        ..settings()
    };
    let (dp, metrics) = data_path(limited);
    // A Service with two ports: each listener below its own cap, together at the share.
    dp.apply(spec(b, &[(Protocol::Tcp, 80), (Protocol::Tcp, 81)], &[("node-a", 1)], HealthCheck::None)).unwrap();
    let (on80, on81) = (SocketAddr::new(ip(b, 100), 80), SocketAddr::new(ip(b, 100), 81));
    let _held = [
        connect_from(None, on80).await.expect("80 #1"),
        connect_from(None, on80).await.expect("80 #2"),
        connect_from(None, on81).await.expect("81 #1"),
    ];
    assert!(is_refused(on81).await, "port 81 is below its own cap but the Service holds its share");
    assert_eq!(refused_count(&metrics, b, "service_limit"), 1);
    assert_eq!(refused_count(&metrics, b, "total_limit"), 0);
    assert_eq!(dp.held().tcp_connections, 3);
    // Another Service still gets connections: the rest of the total is not this one's.
    let mut other = spec(b, &[(Protocol::Tcp, 90)], &[("node-a", 1)], HealthCheck::None);
    other.key = "default/other-32".into();
    other.addresses = vec![ip(b, 101)];
    dp.apply(other).unwrap();
    let (_, mut stream) = connect_from(None, SocketAddr::new(ip(b, 101), 90)).await.expect("the other Service");
    assert!(echoes(&mut stream, "another Service forwards").await);
}

#[tokio::test]
async fn a_tcp_connection_moving_no_byte_either_way_is_closed_after_the_idle_timeout() {
    let b = 29;
    tcp_backend("node-a", SocketAddr::new(ip(b, 1), NODE_PORT)).await;
    let idle = Duration::from_millis(400);
    let (dp, metrics) = data_path(Settings { tcp_idle_timeout: idle, ..settings() });
    dp.apply(spec(b, &[(Protocol::Tcp, 80)], &[("node-a", 1)], HealthCheck::None)).unwrap();
    let (_, mut stream) = connect_from(None, SocketAddr::new(ip(b, 100), 80)).await.expect("connect");
    // Traffic every 150 ms for twice the timeout keeps it open.
    for i in 0..6 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert!(echoes(&mut stream, &format!("busy {i}")).await, "closed while busy");
    }
    let quiet = Instant::now();
    let mut buf = [0u8; 16];
    let end = tokio::time::timeout(WAIT, stream.read(&mut buf)).await.expect("closed by the proxy");
    assert!(matches!(end, Ok(0) | Err(_)), "{end:?}");
    let after = quiet.elapsed();
    assert!(after >= idle && after < idle * 2, "closed after {after:?} of silence (timeout {idle:?})");
    assert!(metrics.encode().contains(r#"ccm_datapath_idle_closed_connections_total{service="default/svc-29"} 1"#));
    eventually_within("its slot is given back", WAIT, || async { dp.held().tcp_connections == 0 }).await;
}

/// A UDP backend answering every datagram with the source port it came from (which session).
async fn udp_port_backend(addr: SocketAddr) {
    let socket = UdpSocket::bind(addr).await.expect("bind udp backend");
    tokio::spawn(async move {
        let mut buf = [0u8; 64];
        while let Ok((_, peer)) = socket.recv_from(&mut buf).await {
            let _ = socket.send_to(peer.port().to_string().as_bytes(), peer).await;
        }
    });
}

/// Send from `client` to `to` and return the upstream port the backend saw.
async fn session_port(client: &UdpSocket, to: SocketAddr) -> Option<u16> {
    client.send_to(b"x", to).await.ok()?;
    let mut buf = [0u8; 64];
    let (n, _) = tokio::time::timeout(Duration::from_secs(2), client.recv_from(&mut buf)).await.ok()?.ok()?;
    std::str::from_utf8(&buf[..n]).ok()?.parse().ok()
}

#[tokio::test]
async fn a_full_udp_listener_evicts_its_least_recently_active_session_and_an_empty_one_is_refused_when_the_total_is_full()
 {
    let b = 30;
    udp_port_backend(SocketAddr::new(ip(b, 1), NODE_PORT)).await;
    let limited = Settings { max_udp_sessions_per_listener: 2, max_udp_sessions: 2, ..settings() };
    let limited = Settings { udp_idle_timeout: Duration::from_secs(60), ..limited };
    let (dp, metrics) = data_path(limited);
    dp.apply(spec(b, &[(Protocol::Udp, 53), (Protocol::Udp, 54)], &[("node-a", 1)], HealthCheck::None)).unwrap();
    let lb = SocketAddr::new(ip(b, 100), 53);
    let client = |host| UdpSocket::bind(SocketAddr::new(ip(b, host), 0));
    let (a, bb, c) = (client(50).await.unwrap(), client(51).await.unwrap(), client(52).await.unwrap());
    // A pause between steps so that activity times differ.
    let step = || tokio::time::sleep(Duration::from_millis(5));
    let a_port = session_port(&a, lb).await.expect("a answered");
    step().await;
    let b_port = session_port(&bb, lb).await.expect("b answered");
    step().await;
    // A is active again: B is now the least recently active.
    assert_eq!(session_port(&a, lb).await, Some(a_port));
    step().await;
    let _ = session_port(&c, lb).await.expect("a third client is served, not refused");
    step().await;
    assert!(metrics.encode().contains(r#"ccm_datapath_udp_sessions_evicted_total{service="default/svc-30"} 1"#));
    assert_eq!(session_port(&a, lb).await, Some(a_port), "the recently active session stayed");
    assert_ne!(session_port(&bb, lb).await, Some(b_port), "the least recently active one was evicted");
    let listener = ListenerKey { address: ip(b, 100), port: 53, protocol: Protocol::Udp };
    assert_eq!(dp.listener_held("default/svc-30", &listener), Some(2));
    assert_eq!(dp.held().udp_sessions, 2);
    // The other listener holds nothing to give back while the data path is full.
    let other = SocketAddr::new(ip(b, 100), 54);
    assert_eq!(session_port(&client(53).await.unwrap(), other).await, None);
    assert_eq!(refused_count(&metrics, b, "total_limit"), 1);
}

#[tokio::test]
async fn the_largest_udp_datagrams_cross_both_ways_intact_without_a_buffer_per_session() {
    let b = 31;
    let backend = UdpSocket::bind(SocketAddr::new(ip(b, 1), NODE_PORT)).await.unwrap();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 65_535];
        while let Ok((n, peer)) = backend.recv_from(&mut buf).await {
            let _ = backend.send_to(&buf[..n], peer).await;
        }
    });
    let (dp, _) = data_path(settings());
    dp.apply(spec(b, &[(Protocol::Udp, 53)], &[("node-a", 1)], HealthCheck::None)).unwrap();
    let lb = SocketAddr::new(ip(b, 100), 53);
    // The largest UDP payload over IPv4: 65,535 minus the IP and UDP headers.
    for len in [1, 1472, 65_507] {
        let client = UdpSocket::bind(SocketAddr::new(ip(b, 50), 0)).await.unwrap();
        let sent = payload(len as u64, len);
        client.send_to(&sent, lb).await.unwrap();
        let mut buf = vec![0u8; 65_535];
        let (n, _) = tokio::time::timeout(WAIT, client.recv_from(&mut buf)).await.expect("an echo").unwrap();
        assert_eq!(n, len);
        assert!(buf[..n] == sent[..], "{len} bytes came back intact");
    }
}
