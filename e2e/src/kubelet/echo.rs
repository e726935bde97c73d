//! Serving one port of an emulated Node: an echo that names the Node and the Service (HTTP,
//! raw TCP or UDP), or a health endpoint that always answers 200.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::node_port_plan::NodePortRole;

/// Largest HTTP request head the node-port echo reads (bounds what a client can make it hold).
const MAX_REQUEST_HEAD: usize = 8 * 1024;

/// How long a node-port connection may stay idle.
const NODE_PORT_IDLE: Duration = Duration::from_secs(60);

/// The line the echo answers with.
pub fn echo_line(node: &str, service: &str) -> String {
    format!("node={node} service={service}\n")
}

/// Serve one TCP node port (an echo or a health endpoint) until `stop` fires.
pub async fn serve_node_port(listener: tokio::net::TcpListener, role: NodePortRole, stop: CancellationToken) {
    let role = Arc::new(role);
    loop {
        let (stream, _) = tokio::select! {
            _ = stop.cancelled() => return,
            r = listener.accept() => match r {
                Ok(s) => s,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let (role, stop) = (role.clone(), stop.clone());
        tokio::spawn(async move {
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = tokio::time::timeout(NODE_PORT_IDLE, answer(stream, &role)) => {}
            }
        });
    }
}

/// Whether the bytes start like an HTTP request line (`GET /`, `HEAD /`, ...).
fn looks_like_http(head: &[u8]) -> bool {
    let method_len = head.iter().take_while(|b| b.is_ascii_uppercase()).count();
    method_len > 0 && head.get(method_len) == Some(&b' ')
}

/// Answer one connection: HTTP (and every health check) with the echo line or the health
/// body; a raw client with the echo line, then its own bytes back.
async fn answer(mut stream: tokio::net::TcpStream, role: &NodePortRole) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut head = Vec::new();
    let mut buf = [0u8; 2048];
    // HTTP clients speak first; a raw client (nc) may wait for us: greet it after a moment.
    let first = tokio::time::timeout(Duration::from_millis(300), stream.read(&mut buf)).await;
    match first {
        Ok(Ok(0)) | Ok(Err(_)) => return,
        Ok(Ok(n)) => head.extend_from_slice(&buf[..n]),
        Err(_) => {}
    }
    let http = matches!(role, NodePortRole::Health { .. }) || looks_like_http(&head);
    if http {
        while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_REQUEST_HEAD {
            match tokio::time::timeout(Duration::from_secs(2), stream.read(&mut buf)).await {
                Ok(Ok(n)) if n > 0 => head.extend_from_slice(&buf[..n]),
                _ => break,
            }
        }
        let body = match role {
            NodePortRole::Echo { node, service } => echo_line(node, service),
            NodePortRole::Health { node } => format!("{{\"node\":\"{node}\",\"localEndpoints\":1}}\n"),
        };
        let response = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        let _ = stream.write_all(response.as_bytes()).await;
        let _ = stream.shutdown().await;
        return;
    }
    let NodePortRole::Echo { node, service } = role else { return };
    if stream.write_all(echo_line(node, service).as_bytes()).await.is_err() || stream.write_all(&head).await.is_err() {
        return;
    }
    loop {
        match stream.read(&mut buf).await {
            Ok(n) if n > 0 => {
                if stream.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
            _ => return,
        }
    }
}

/// Serve one UDP node port: each datagram is answered with the echo line and the payload.
pub async fn serve_udp_echo(socket: tokio::net::UdpSocket, role: NodePortRole, stop: CancellationToken) {
    let NodePortRole::Echo { node, service } = role else { return };
    let line = echo_line(&node, &service);
    let mut buf = vec![0u8; 65_535];
    loop {
        let (n, peer) = tokio::select! {
            _ = stop.cancelled() => return,
            r = socket.recv_from(&mut buf) => match r { Ok(r) => r, Err(_) => continue },
        };
        let mut reply = line.clone().into_bytes();
        reply.extend_from_slice(&buf[..n]);
        let _ = socket.send_to(&reply, peer).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn the_echo_names_node_and_service_to_http_and_raw_clients() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        let role = NodePortRole::Echo { node: "n1".into(), service: "demo/web".into() };
        tokio::spawn(serve_node_port(listener, role, stop.clone()));

        let mut http = tokio::net::TcpStream::connect(addr).await.unwrap();
        http.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
        let mut response = String::new();
        http.read_to_string(&mut response).await.unwrap();
        assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
        assert!(response.ends_with("\r\n\r\nnode=n1 service=demo/web\n"), "{response}");

        let mut raw = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut greeting = [0u8; 25];
        raw.read_exact(&mut greeting).await.unwrap();
        assert_eq!(&greeting, b"node=n1 service=demo/web\n");
        raw.write_all(b"ping").await.unwrap();
        let mut echo = [0u8; 4];
        raw.read_exact(&mut echo).await.unwrap();
        assert_eq!(&echo, b"ping");
        stop.cancel();
    }
}
