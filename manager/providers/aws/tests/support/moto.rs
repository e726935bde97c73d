//! moto, the AWS emulator, on a free loopback port for the moto tests and the `bench-nlb`
//! benchmark; and a minimal HTTP client for moto's own API.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::process::{Child, Command};

/// A moto server on a free loopback port, stopped on drop.
pub struct Moto {
    _child: Child,
    /// `http://127.0.0.1:<port>`.
    pub url: String,
    /// The loopback port.
    pub port: u16,
}

/// A loopback port nothing listens on right now.
pub async fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    l.local_addr().expect("addr").port()
}

impl Moto {
    /// Start moto, or `None` (after one printed line) when it is not installed.
    pub async fn start(test: &str) -> Option<Moto> {
        for _ in 0..3 {
            let port = free_port().await;
            let child = match Command::new("moto_server")
                .args(["-H", "127.0.0.1", "-p", &port.to_string()])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .kill_on_drop(true)
                .spawn()
            {
                Ok(c) => c,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    println!("skipping {test}: moto_server is not installed (pip install 'moto[server]==5.2.5')");
                    return None;
                }
                Err(e) => panic!("starting moto_server: {e}"),
            };
            let mut moto = Moto { _child: child, url: format!("http://127.0.0.1:{port}"), port };
            for _ in 0..100 {
                if http(port, "GET", "/moto-api/", "").await.is_some_and(|(status, _)| status == 200) {
                    return Some(moto);
                }
                if let Ok(Some(_)) = moto._child.try_wait() {
                    break; // the port was taken in between; try another
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        panic!("moto_server did not start");
    }
}

/// A minimal HTTP/1.1 request (for moto's own API); `None` if the server is not there.
pub async fn http(port: u16, method: &str, path: &str, body: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.ok()?;
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.ok()?;
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.ok()?;
    let text = String::from_utf8_lossy(&out).to_string();
    let status = text.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, text))
}
