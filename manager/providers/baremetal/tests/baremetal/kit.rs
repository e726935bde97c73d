//! What the modules of this test binary share beyond the test kit (`testkit`): stand-ins for
//! what listens on a Node (a backend behind a nodePort, kube-proxy's health endpoint), and an
//! announcer's settings for tests on the API server.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use ccm_provider_baremetal::announce::announcer::AnnouncerSettings;
use ccm_provider_baremetal::announce::guard::Facts;
use ccm_provider_baremetal::ipam::IpBlock;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// A stand-in for a Node's nodePort: greets with the Node name, then echoes.
pub async fn greeting_backend(name: &str, addr: SocketAddr) {
    let listener = TcpListener::bind(addr).await.expect("bind backend");
    let name = name.to_string();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let name = name.clone();
            tokio::spawn(async move {
                let _ = stream.write_all(format!("{name}\n").as_bytes()).await;
                let mut buf = [0u8; 1024];
                while let Ok(n) = stream.read(&mut buf).await {
                    if n == 0 || stream.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
}

/// A stand-in for kube-proxy's health endpoint, always healthy.
pub async fn healthz(addr: SocketAddr) {
    let listener = TcpListener::bind(addr).await.expect("bind healthz");
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 512];
                let _ = stream.read(&mut buf).await;
                let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok").await;
            });
        }
    });
}

/// An announcer of `node` for Services of `class`, announcing within the pools
/// 192.0.2.0/24 and 2001:db8::/64, with short timings: a 2 s Lease renewed every 0.5 s, 1 s to
/// settle.
pub fn fast_announcer(node: &str, namespace: &str, class: &str) -> AnnouncerSettings {
    let pools = ["192.0.2.0/24", "2001:db8::/64"].map(|p| IpBlock::parse_cidr(p).expect("pool")).to_vec();
    let mut settings = AnnouncerSettings::new(node, namespace).with_facts(Facts::of_pools(pools));
    settings.class = Some(class.into());
    settings.lease_duration = Duration::from_secs(2);
    settings.renew_interval = Duration::from_millis(500);
    settings.settle = Duration::from_secs(1);
    settings
}

/// An IPv4 address of 192.0.2.0/24 and an IPv6 one of 2001:db8::/64 that the same one of
/// `nodes` wins, so one stop of that node moves both.
pub fn pair_one_node_wins(nodes: [&str; 2]) -> (IpAddr, IpAddr) {
    use ccm_provider_baremetal::announce::elect;
    (1u8..250)
        .map(|n| (IpAddr::from([192, 0, 2, n]), format!("2001:db8::{n}").parse::<IpAddr>().expect("an address")))
        .find(|(a, b)| elect::elect(*a, nodes) == elect::elect(*b, nodes))
        .expect("a pair with one owner")
}
