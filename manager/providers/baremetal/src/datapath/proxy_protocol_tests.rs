//! The PROXY protocol on real loopback sockets: what a backend receives from the data path,
//! read by the test-only parser, and what HAProxy, a real consumer, makes of it. Each test owns
//! a `127.<n>.0.0/16` block as in `tests.rs`; clients connect from `127.<n>.0.2`, so the
//! address a backend learns is not the proxy's own.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::proxy_protocol_parse::{Parsed, parse};
use super::*;

const NODE_PORT: u16 = 30080;
const SERVICE_PORT: u16 = 80;
const WAIT: Duration = Duration::from_secs(10);
const CLIENT_HOST: u8 = 2;
const BACKEND_HOST: u8 = 1;
const LB_HOST: u8 = 100;
const HELLO: &[u8] = b"hello\n";

fn ip(block: u8, host: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, block, 0, host))
}

fn lb(block: u8) -> SocketAddr {
    SocketAddr::new(ip(block, LB_HOST), SERVICE_PORT)
}

fn spec(block: u8) -> ServiceSpec {
    ServiceSpec {
        key: format!("default/pp-{block}"),
        addresses: vec![ip(block, LB_HOST)],
        ports: vec![PortSpec { protocol: Protocol::Tcp, port: SERVICE_PORT, target_port: NODE_PORT }],
        backends: vec![Backend { name: "node-a".into(), ip: ip(block, BACKEND_HOST) }],
        health_check: HealthCheck::None,
        affinity: Affinity::None,
        balance: Balance::RoundRobin,
        source_ranges: Vec::new(),
    }
}

/// A data path serving [`spec`] with `proxy_protocol`, moving bytes `how`.
fn serve(block: u8, how: TcpForwarding, proxy_protocol: Option<ProxyProtocol>) -> DataPath {
    let metrics = Arc::new(Metrics::new());
    let settings = Settings { connect_timeout: Duration::from_millis(500), ..Settings::default() };
    let dp = DataPath::with_tcp_forwarding(settings, how, &metrics, CancellationToken::new());
    dp.apply_with(spec(block), ServiceOptions { proxy_protocol }).expect("listen");
    dp
}

/// A connection to the load balancer from the block's client address.
async fn connect_as_client(block: u8) -> TcpStream {
    let socket = TcpSocket::new_v4().expect("socket");
    socket.bind(SocketAddr::new(ip(block, CLIENT_HOST), 0)).expect("bind the client's address");
    tokio::time::timeout(WAIT, socket.connect(lb(block))).await.expect("connect in time").expect("connect")
}

/// A backend taking one connection and returning every byte received up to the client's
/// [`HELLO`].
async fn recording_backend(block: u8) -> JoinHandle<Vec<u8>> {
    let listener = TcpListener::bind(SocketAddr::new(ip(block, BACKEND_HOST), NODE_PORT)).await.expect("bind backend");
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.expect("accept");
        let mut got = Vec::new();
        let mut buf = [0u8; 512];
        while !got.ends_with(HELLO) {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
        got
    })
}

/// What the backend receives when the block's client connects and says [`HELLO`], and the
/// client's own address.
async fn what_the_backend_receives(
    block: u8,
    how: TcpForwarding,
    proxy_protocol: Option<ProxyProtocol>,
) -> (Vec<u8>, SocketAddr) {
    let backend = recording_backend(block).await;
    let _dp = serve(block, how, proxy_protocol);
    let mut client = connect_as_client(block).await;
    let client_addr = client.local_addr().expect("client address");
    client.write_all(HELLO).await.expect("send");
    let got = tokio::time::timeout(WAIT, backend).await.expect("the backend receives in time").expect("backend");
    (got, client_addr)
}

/// The backend got a header naming the client and the load balancer, then the client's bytes.
async fn assert_the_backend_learns_the_client(block: u8, how: TcpForwarding, version: ProxyProtocol) {
    let (got, client) = what_the_backend_receives(block, how, Some(version)).await;
    assert_eq!(client.ip(), ip(block, CLIENT_HOST));
    let Parsed::Header { source, destination, len } = parse(&got) else {
        panic!("{version:?} {how:?}: no PROXY header in {got:?}");
    };
    assert_eq!(source, client, "{version:?} {how:?}: the client's address and port");
    assert_eq!(destination, lb(block), "{version:?} {how:?}: the address the client connected to");
    assert_eq!(&got[len..], HELLO, "{version:?} {how:?}: the client's bytes follow the header untouched");
    let first = match version {
        ProxyProtocol::V1 => format!("PROXY TCP4 {} ", client.ip()).into_bytes(),
        ProxyProtocol::V2 => b"\r\n\r\n\0\r\nQUIT\n\x21\x11".to_vec(),
    };
    assert!(got.starts_with(&first), "{version:?} {how:?}: {got:?}");
}

#[tokio::test]
async fn proxy_protocol_v1_tells_the_backend_the_clients_address_before_its_first_byte_copied_or_spliced() {
    assert_the_backend_learns_the_client(40, TcpForwarding::Copy, ProxyProtocol::V1).await;
    assert_the_backend_learns_the_client(41, TcpForwarding::Splice, ProxyProtocol::V1).await;
}

#[tokio::test]
async fn proxy_protocol_v2_tells_the_backend_the_clients_address_before_its_first_byte_copied_or_spliced() {
    assert_the_backend_learns_the_client(42, TcpForwarding::Copy, ProxyProtocol::V2).await;
    assert_the_backend_learns_the_client(43, TcpForwarding::Splice, ProxyProtocol::V2).await;
}

#[tokio::test]
async fn without_proxy_protocol_the_backend_gets_only_the_clients_bytes() {
    for (block, how) in [(44, TcpForwarding::Copy), (45, TcpForwarding::Splice)] {
        let (got, _) = what_the_backend_receives(block, how, None).await;
        assert_eq!(got, HELLO, "{how:?}");
    }
}

#[tokio::test]
async fn a_changed_proxy_protocol_applies_to_new_connections_and_keeps_the_listener() {
    let block = 46;
    let backend = recording_backend(block).await;
    let dp = serve(block, TcpForwarding::Copy, Some(ProxyProtocol::V2));
    dp.apply_with(spec(block), ServiceOptions { proxy_protocol: Some(ProxyProtocol::V1) }).expect("reconfigure");
    let mut client = connect_as_client(block).await;
    client.write_all(HELLO).await.expect("send");
    let got = tokio::time::timeout(WAIT, backend).await.expect("in time").expect("backend");
    assert!(got.starts_with(b"PROXY TCP4 "), "the new version: {got:?}");
    assert_eq!(dp.listeners(&spec(block).key).len(), 1);
}

// ----- A real consumer: HAProxy with `accept-proxy` answers with the address it was told.

const HAPROXY_MISSING: &str = "haproxy not found: install haproxy to run the PROXY protocol consumer test";

/// `haproxy` on `PATH`, if any.
fn haproxy_binary() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|dir| dir.join("haproxy")).find(|p| p.is_file())
}

/// An HAProxy in the foreground, killed and reaped when dropped, with its config and log in a
/// directory of its own that goes with it.
struct HaProxy {
    child: std::process::Child,
    dir: PathBuf,
}

impl HaProxy {
    /// Start `binary` answering every request on `bind`, which requires a PROXY header (v1 or
    /// v2: `accept-proxy` takes both), with `<src>:<src_port>` as HAProxy sees them.
    async fn start(binary: &Path, bind: SocketAddr) -> Self {
        let dir = std::env::temp_dir().join(format!("ccm-haproxy-{}-{}", std::process::id(), bind.ip()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let config = dir.join("haproxy.cfg");
        std::fs::write(
            &config,
            format!(
                "global\n    maxconn 64\n    nbthread 1\n\
                 defaults\n    mode http\n    timeout connect 2s\n    timeout client 5s\n    timeout server 5s\n\
                 frontend client_echo\n    bind {bind} accept-proxy\n    \
                 http-request return status 200 content-type text/plain lf-string \"%[src]:%[src_port]\"\n"
            ),
        )
        .expect("write the config");
        let log = std::fs::File::create(dir.join("haproxy.log")).expect("log file");
        let child = std::process::Command::new(binary)
            .arg("-db")
            .arg("-f")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start haproxy");
        let mut haproxy = Self { child, dir };
        haproxy.wait_listening(bind).await;
        haproxy
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("haproxy.log")).unwrap_or_default()
    }

    async fn wait_listening(&mut self, bind: SocketAddr) {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            // A probe without a header: HAProxy drops it, which is all it has to do here.
            if TcpStream::connect(bind).await.is_ok() {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("haproxy exited with {status}: {}", self.log());
            }
            assert!(tokio::time::Instant::now() < deadline, "haproxy does not listen on {bind}: {}", self.log());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for HaProxy {
    fn drop(&mut self) {
        // SIGKILL, then reap at once: no HAProxy outlives its test, not even as a zombie.
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Send an HTTP request through the data path to HAProxy from the block's client address and
/// check that HAProxy answers with that address and port.
async fn haproxy_sees_the_client(block: u8, how: TcpForwarding, version: ProxyProtocol) {
    let Some(binary) = haproxy_binary() else {
        println!("{HAPROXY_MISSING}");
        return;
    };
    let haproxy = HaProxy::start(&binary, SocketAddr::new(ip(block, BACKEND_HOST), NODE_PORT)).await;
    let _dp = serve(block, how, Some(version));
    let mut client = connect_as_client(block).await;
    let client_addr = client.local_addr().expect("client address");
    client.write_all(b"GET / HTTP/1.1\r\nHost: lb\r\nConnection: close\r\n\r\n").await.expect("send the request");
    let mut response = Vec::new();
    tokio::time::timeout(WAIT, client.read_to_end(&mut response)).await.expect("an answer in time").expect("read");
    let response = String::from_utf8_lossy(&response);
    let body = response.split_once("\r\n\r\n").map(|(_, body)| body).unwrap_or_default();
    assert!(response.starts_with("HTTP/1.1 200"), "{version:?}: {response}\nhaproxy: {}", haproxy.log());
    assert_eq!(body, format!("{}:{}", client_addr.ip(), client_addr.port()), "{version:?}: {response}");
    assert_eq!(client_addr.ip(), ip(block, CLIENT_HOST), "the client is not the proxy");
}

#[tokio::test]
async fn proxy_protocol_v1_lets_haproxy_see_the_clients_address() {
    haproxy_sees_the_client(47, TcpForwarding::Copy, ProxyProtocol::V1).await;
}

#[tokio::test]
async fn proxy_protocol_v2_lets_haproxy_see_the_clients_address() {
    // Spliced, so that a real consumer also reads the header on the zero-copy path.
    haproxy_sees_the_client(48, TcpForwarding::Splice, ProxyProtocol::V2).await;
}
