//! moto, the AWS emulator, on a free loopback port for the moto tests and the `bench-nlb`
//! benchmark; and a minimal HTTP client for moto's own API.
//!
//! moto is started through Python with [`testkit::moto::CORRECTIONS`] applied, where moto 5.2.5 answers
//! differently from AWS in ways the provider relies on; without a Python that has moto, the
//! plain `moto_server` is started (and the tests that need the corrections say so).

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
    /// Whether [`testkit::moto::CORRECTIONS`] are applied (read by the moto tests, not the benchmark).
    #[allow(dead_code)]
    pub corrected: bool,
}

/// A loopback port nothing listens on right now.
pub async fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    l.local_addr().expect("addr").port()
}

/// Whether `python3` can import moto's server.
async fn python_has_moto() -> bool {
    Command::new("python3")
        .args(["-c", "import moto.server, moto.elb.models, moto.elbv2.models"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .await
        .is_ok_and(|s| s.success())
}

impl Moto {
    /// Start moto, or `None` (after one printed line) when it is not installed.
    pub async fn start(test: &str) -> Option<Moto> {
        let corrected = python_has_moto().await;
        for _ in 0..3 {
            let port = free_port().await;
            let port_s = port.to_string();
            let mut command = if corrected {
                let mut c = Command::new("python3");
                c.args(["-c", testkit::moto::CORRECTIONS, "-H", "127.0.0.1", "-p", &port_s]);
                c
            } else {
                let mut c = Command::new("moto_server");
                c.args(["-H", "127.0.0.1", "-p", &port_s]);
                c
            };
            let child = match command
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .kill_on_drop(true)
                .spawn()
            {
                Ok(c) => c,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    // Straight to stderr (libtest captures `println!`): the CI log shows the skip.
                    use std::io::Write as _;
                    let _ = writeln!(
                        std::io::stderr(),
                        "skipping {test}: moto_server is not installed (pip install 'moto[server]==5.2.5')"
                    );
                    return None;
                }
                Err(e) => panic!("starting moto: {e}"),
            };
            let mut moto = Moto { _child: child, url: format!("http://127.0.0.1:{port}"), port, corrected };
            for _ in 0..150 {
                if http(port, "GET", "/moto-api/", "").await.is_some_and(|(status, _)| status == 200) {
                    return Some(moto);
                }
                if let Ok(Some(_)) = moto._child.try_wait() {
                    break; // the port was taken in between; try another
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        panic!("moto did not start");
    }

    /// Seeds moto's random numbers (IDs, DNS names): two servers seeded alike and then asked the
    /// same calls in the same order make the same IDs (the differential suite's two clouds).
    #[allow(dead_code)]
    pub async fn seed(&self, seed: u64) {
        let answer = http(self.port, "POST", &format!("/moto-api/seed?a={seed}"), "").await;
        assert!(answer.as_ref().is_some_and(|(status, _)| *status == 200), "seeding moto: {answer:?}");
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
