//! What the modules of this test binary share beyond the test kit (`testkit`): stand-ins for
//! what listens on a Node (a backend behind a nodePort, kube-proxy's health endpoint).

use std::net::SocketAddr;

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
