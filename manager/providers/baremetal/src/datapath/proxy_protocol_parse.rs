//! Test-only: a PROXY protocol reader written from HAProxy's proxy-protocol.txt, apart from the
//! encoder (it shares no code or constant with it), so the encoder is checked against the spec
//! rather than against itself.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// What the start of a backend's stream holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parsed {
    /// Too few bytes yet to tell.
    Incomplete,
    /// A header: the client's address, the address it connected to, and the header's length.
    Header { source: SocketAddr, destination: SocketAddr, len: usize },
    /// Not a valid PROXY header (what is wrong).
    Invalid(String),
}

const SIGNATURE: &[u8] = b"\x0D\x0A\x0D\x0A\x00\x0D\x0A\x51\x55\x49\x54\x0A";

/// Parse the header at the start of `buf` (either version, detected as the spec says).
pub fn parse(buf: &[u8]) -> Parsed {
    if buf.len() >= 5 && buf.starts_with(b"PROXY") {
        return v1(buf);
    }
    if buf.len() >= SIGNATURE.len() && buf.starts_with(SIGNATURE) {
        return v2(buf);
    }
    let prefix = buf.len().min(SIGNATURE.len());
    if b"PROXY".starts_with(&buf[..buf.len().min(5)]) || SIGNATURE.starts_with(&buf[..prefix]) {
        return Parsed::Incomplete;
    }
    Parsed::Invalid("neither a v1 nor a v2 signature".into())
}

fn v1(buf: &[u8]) -> Parsed {
    // "a receiver must wait for up to 107 characters" including the CRLF.
    let Some(end) = buf.windows(2).position(|w| w == b"\r\n") else {
        return if buf.len() >= 107 { Parsed::Invalid("no CRLF in 107 bytes".into()) } else { Parsed::Incomplete };
    };
    if end + 2 > 107 {
        return Parsed::Invalid("line longer than 107 bytes".into());
    }
    let Ok(line) = std::str::from_utf8(&buf[..end]) else { return Parsed::Invalid("not ASCII".into()) };
    let fields: Vec<&str> = line.split(' ').collect();
    let [_, family, src, dst, sport, dport] = fields[..] else {
        return Parsed::Invalid(format!("expected 6 fields: {line:?}"));
    };
    let ip = |text: &str| -> Option<IpAddr> {
        match family {
            "TCP4" => text.parse::<Ipv4Addr>().ok().map(IpAddr::V4),
            "TCP6" => text.parse::<Ipv6Addr>().ok().map(IpAddr::V6),
            _ => None,
        }
    };
    // Ports are decimal without leading zeros.
    let port = |text: &str| (!text.starts_with('0') || text == "0").then(|| text.parse::<u16>().ok()).flatten();
    match (ip(src), ip(dst), port(sport), port(dport)) {
        (Some(s), Some(d), Some(sp), Some(dp)) => {
            Parsed::Header { source: SocketAddr::new(s, sp), destination: SocketAddr::new(d, dp), len: end + 2 }
        }
        _ => Parsed::Invalid(format!("bad address or port: {line:?}")),
    }
}

fn v2(buf: &[u8]) -> Parsed {
    if buf.len() < 16 {
        return Parsed::Incomplete;
    }
    let (version, command) = (buf[12] >> 4, buf[12] & 0x0F);
    if version != 2 || command != 1 {
        return Parsed::Invalid(format!("version {version} command {command}, expected 2 and PROXY (1)"));
    }
    let length = usize::from(u16::from_be_bytes([buf[14], buf[15]]));
    if buf.len() < 16 + length {
        return Parsed::Incomplete;
    }
    let body = &buf[16..16 + length];
    let (source, destination) = match buf[13] {
        // AF_INET, STREAM: 4 + 4 + 2 + 2 bytes.
        0x11 if length >= 12 => {
            let a = |i: usize| IpAddr::V4(Ipv4Addr::new(body[i], body[i + 1], body[i + 2], body[i + 3]));
            let p = |i: usize| u16::from_be_bytes([body[i], body[i + 1]]);
            (SocketAddr::new(a(0), p(8)), SocketAddr::new(a(4), p(10)))
        }
        // AF_INET6, STREAM: 16 + 16 + 2 + 2 bytes.
        0x21 if length >= 36 => {
            let a = |i: usize| {
                let mut octets = [0u8; 16];
                octets.copy_from_slice(&body[i..i + 16]);
                IpAddr::V6(Ipv6Addr::from(octets))
            };
            let p = |i: usize| u16::from_be_bytes([body[i], body[i + 1]]);
            (SocketAddr::new(a(0), p(32)), SocketAddr::new(a(16), p(34)))
        }
        other => return Parsed::Invalid(format!("family and transport {other:#04x} with length {length}")),
    };
    Parsed::Header { source, destination, len: 16 + length }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reader_waits_for_a_whole_header_and_refuses_what_is_not_one() {
        assert_eq!(parse(b"PRO"), Parsed::Incomplete);
        assert_eq!(parse(b"PROXY TCP4 1.2.3.4"), Parsed::Incomplete);
        assert_eq!(parse(&SIGNATURE[..7]), Parsed::Incomplete);
        assert!(matches!(parse(b"GET / HTTP/1.1\r\n"), Parsed::Invalid(_)));
        assert!(matches!(parse(b"PROXY TCP4 1.2.3.4 5.6.7.8 01 2\r\n"), Parsed::Invalid(_)));
        assert!(matches!(parse(b"PROXY TCP6 1.2.3.4 5.6.7.8 1 2\r\n"), Parsed::Invalid(_)));
    }
}
