//! The HTTP plumbing of the proxies in front of moto, shared by the moto tests and the
//! `bench-nlb` benchmark: read one request, name its action, answer it as throttled, forward it.

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One request off `conn`: its head (up to the blank line) and body (per Content-Length);
/// `None` when the client closed.
pub async fn read_request(conn: &mut TcpStream) -> Option<(String, Vec<u8>)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = conn.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let len: usize = head
        .lines()
        .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse().unwrap_or(0)))
        .unwrap_or(0);
    let mut body = buf[head_end..].to_vec();
    while body.len() < len {
        let n = conn.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    Some((head, body))
}

/// The query API's `Action` of a request body (empty when there is none).
pub fn action(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    text.split('&').find_map(|kv| kv.strip_prefix("Action=")).unwrap_or("").to_string()
}

/// Whether the request is signed for EC2 (else ELBv2 or STS).
pub fn is_ec2(head: &str) -> bool {
    head.contains("/ec2/aws4_request")
}

/// The throttling answer each API gives: EC2's `RequestLimitExceeded`, ELBv2's `Throttling`.
pub fn throttled_response(ec2: bool) -> String {
    let (status, xml) = if ec2 {
        (
            "503 Service Unavailable",
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Response><Errors><Error><Code>RequestLimitExceeded</Code><Message>Request limit exceeded.</Message></Error></Errors><RequestID>throttle</RequestID></Response>",
        )
    } else {
        (
            "400 Bad Request",
            "<ErrorResponse xmlns=\"http://elasticloadbalancing.amazonaws.com/doc/2015-12-01/\"><Error><Type>Sender</Type><Code>Throttling</Code><Message>Rate exceeded</Message></Error><RequestId>throttle</RequestId></ErrorResponse>",
        )
    };
    format!("HTTP/1.1 {status}\r\nContent-Type: text/xml\r\nContent-Length: {}\r\n\r\n{xml}", xml.len())
}

/// Forward one request to moto on a fresh connection (asked to close) and return its whole
/// answer; `None` when moto could not be reached or answered incompletely.
pub async fn forward(moto_port: u16, head: &str, body: &[u8]) -> Option<Vec<u8>> {
    let mut upstream = TcpStream::connect(("127.0.0.1", moto_port)).await.ok()?;
    let mut new_head: String = head
        .split("\r\n")
        .filter(|l| !l.to_ascii_lowercase().starts_with("connection:") && !l.is_empty())
        .map(|l| format!("{l}\r\n"))
        .collect();
    new_head.push_str("Connection: close\r\n\r\n");
    upstream.write_all(new_head.as_bytes()).await.ok()?;
    upstream.write_all(body).await.ok()?;
    let mut resp = Vec::new();
    upstream.read_to_end(&mut resp).await.ok()?;
    Some(resp)
}
