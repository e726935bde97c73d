//! A minimal HTTPS GET for probing local endpoints (`/readyz`, `/healthz`, `/metrics`) of
//! manager processes (through `ccm_framework::serving::probe`), and the parsing of what they answer.

use std::net::SocketAddr;
use std::time::Duration;

/// An HTTP response: status code and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// The body, lossily decoded as UTF-8.
    pub body: String,
}

/// `GET path` on `addr` over HTTPS, not verifying the (self-signed) certificate, as a
/// kubelet's HTTPS probe; `None` when the connection fails, times out or the answer is not HTTP.
pub async fn get(addr: SocketAddr, path: &str, timeout: Duration) -> Option<Response> {
    let r = ccm_framework::serving::probe::get(addr, path, None, timeout).await?;
    Some(Response { status: r.status, body: r.body })
}

/// Parse a close-delimited HTTP/1.x response (pure).
pub fn parse(raw: &[u8]) -> Option<Response> {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status_line = head.lines().next()?;
    let mut parts = status_line.split_whitespace();
    if !parts.next()?.starts_with("HTTP/") {
        return None;
    }
    let status = parts.next()?.parse().ok()?;
    Some(Response { status, body: body.to_string() })
}

/// The value of the sample `name{labels}` in a Prometheus text exposition (pure). `labels` is
/// the exact label set as exposed, e.g. `name="baremetal"`; empty matches a sample without labels.
pub fn metric(exposition: &str, name: &str, labels: &str) -> Option<f64> {
    let key = if labels.is_empty() { name.to_string() } else { format!("{name}{{{labels}}}") };
    exposition.lines().filter(|l| !l.starts_with('#')).find_map(|line| {
        let (k, v) = line.rsplit_once(' ')?;
        (k == key).then(|| v.parse().ok()).flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_status_and_body() {
        let r =
            parse(b"HTTP/1.0 500 Internal Server Error\r\ncontent-type: text/plain\r\n\r\n[-]informer-sync failed\n");
        assert_eq!(r, Some(Response { status: 500, body: "[-]informer-sync failed\n".into() }));
        assert_eq!(parse(b"garbage"), None);
        assert_eq!(parse(b"SSH-2.0\r\n\r\n"), None);
    }

    #[test]
    fn finds_a_labelled_sample() {
        let text = "# HELP leader_election_master_status x\n# TYPE leader_election_master_status gauge\n\
                    leader_election_master_status{name=\"bm\"} 1\nleader_election_master_status{name=\"other\"} 0\nup 1\n";
        assert_eq!(metric(text, "leader_election_master_status", "name=\"bm\""), Some(1.0));
        assert_eq!(metric(text, "leader_election_master_status", "name=\"other\""), Some(0.0));
        assert_eq!(metric(text, "up", ""), Some(1.0));
        assert_eq!(metric(text, "missing", ""), None);
    }
}
