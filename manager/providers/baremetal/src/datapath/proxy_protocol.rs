//! The PROXY protocol header (HAProxy's proxy-protocol.txt, versions 1 and 2) the TCP proxy
//! writes to a backend before the client's first byte, so the backend learns the client's
//! address and port. Pure: bytes from two socket addresses.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

/// Which PROXY protocol header a Service's backends get.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProxyProtocol {
    /// Version 1: one text line, `PROXY TCP4 <src> <dst> <sport> <dport>\r\n`.
    V1,
    /// Version 2: a binary header, cheaper to parse and what most current consumers prefer.
    V2,
}

impl ProxyProtocol {
    /// The spelling of the `ccm.rs/proxy-protocol` annotation.
    pub fn as_str(self) -> &'static str {
        match self {
            ProxyProtocol::V1 => "v1",
            ProxyProtocol::V2 => "v2",
        }
    }
}

/// The 12 bytes a version 2 header starts with (section 2.2).
pub const V2_SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";

/// Version 2 (high nibble), command PROXY (low nibble): a relayed connection.
const V2_VERSION_PROXY: u8 = 0x21;
/// AF_INET over STREAM.
const V2_TCP4: u8 = 0x11;
/// AF_INET6 over STREAM.
const V2_TCP6: u8 = 0x21;

/// The header for a connection accepted from `client` on `local` (the address and port the
/// client connected to).
pub fn header(version: ProxyProtocol, client: SocketAddr, local: SocketAddr) -> Vec<u8> {
    let (source, destination) = same_family(client.ip(), local.ip());
    match version {
        ProxyProtocol::V1 => v1(source, destination, client.port(), local.port()),
        ProxyProtocol::V2 => v2(source, destination, client.port(), local.port()),
    }
}

/// Both addresses in one family, as both versions need: IPv4 when both are IPv4 (an
/// IPv4-mapped IPv6 address counts as IPv4), otherwise IPv6 with IPv4 mapped.
fn same_family(source: IpAddr, destination: IpAddr) -> (IpAddr, IpAddr) {
    match (source.to_canonical(), destination.to_canonical()) {
        (s @ IpAddr::V4(_), d @ IpAddr::V4(_)) => (s, d),
        (s, d) => (IpAddr::V6(as_v6(s)), IpAddr::V6(as_v6(d))),
    }
}

fn as_v6(ip: IpAddr) -> Ipv6Addr {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    }
}

/// Section 2.1; at most 104 bytes for TCP6, under the 107 the spec allows.
fn v1(source: IpAddr, destination: IpAddr, source_port: u16, destination_port: u16) -> Vec<u8> {
    let family = if source.is_ipv4() { "TCP4" } else { "TCP6" };
    format!("PROXY {family} {source} {destination} {source_port} {destination_port}\r\n").into_bytes()
}

/// Section 2.2: signature, version and command, family, length of what follows, then source
/// and destination addresses and ports in network byte order. No TLVs.
fn v2(source: IpAddr, destination: IpAddr, source_port: u16, destination_port: u16) -> Vec<u8> {
    let mut out = Vec::with_capacity(V2_SIGNATURE.len() + 4 + 36);
    out.extend_from_slice(&V2_SIGNATURE);
    out.push(V2_VERSION_PROXY);
    let (family, length): (u8, u16) = if source.is_ipv4() { (V2_TCP4, 12) } else { (V2_TCP6, 36) };
    out.push(family);
    out.extend_from_slice(&length.to_be_bytes());
    for ip in [source, destination] {
        match ip {
            IpAddr::V4(v4) => out.extend_from_slice(&v4.octets()),
            IpAddr::V6(v6) => out.extend_from_slice(&v6.octets()),
        }
    }
    out.extend_from_slice(&source_port.to_be_bytes());
    out.extend_from_slice(&destination_port.to_be_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::super::proxy_protocol_parse::{Parsed, parse};
    use super::*;

    fn addr(text: &str) -> SocketAddr {
        text.parse().unwrap()
    }

    #[test]
    fn v1_over_ipv4_is_the_specs_example_line() {
        // proxy-protocol.txt, section 2.1's example.
        let bytes = header(ProxyProtocol::V1, addr("192.168.0.1:56324"), addr("192.168.0.11:443"));
        assert_eq!(bytes, b"PROXY TCP4 192.168.0.1 192.168.0.11 56324 443\r\n");
        assert_eq!(
            parse(&bytes),
            Parsed::Header { source: addr("192.168.0.1:56324"), destination: addr("192.168.0.11:443"), len: 47 }
        );
    }

    #[test]
    fn v1_over_ipv6_names_tcp6_and_stays_under_the_length_limit() {
        let bytes = header(ProxyProtocol::V1, addr("[2001:db8::1]:40000"), addr("[2001:db8::10]:80"));
        assert_eq!(bytes, b"PROXY TCP6 2001:db8::1 2001:db8::10 40000 80\r\n");
        let longest = header(
            ProxyProtocol::V1,
            addr("[ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff]:65535"),
            addr("[ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff]:65535"),
        );
        assert_eq!(longest.len(), 104);
        assert!(longest.len() <= 107, "the spec's upper bound for a v1 line");
        assert!(matches!(parse(&longest), Parsed::Header { len: 104, .. }));
    }

    #[test]
    fn v2_over_ipv4_is_signature_command_family_length_addresses_ports() {
        let bytes = header(ProxyProtocol::V2, addr("192.168.0.1:56324"), addr("192.168.0.11:443"));
        let mut expected = vec![0x0D, 0x0A, 0x0D, 0x0A, 0x00, 0x0D, 0x0A, 0x51, 0x55, 0x49, 0x54, 0x0A];
        expected.extend_from_slice(&[0x21, 0x11, 0x00, 0x0C]);
        expected.extend_from_slice(&[192, 168, 0, 1, 192, 168, 0, 11]);
        expected.extend_from_slice(&[0xDC, 0x04, 0x01, 0xBB]); // 56324, 443
        assert_eq!(bytes, expected);
        assert_eq!(
            parse(&bytes),
            Parsed::Header { source: addr("192.168.0.1:56324"), destination: addr("192.168.0.11:443"), len: 28 }
        );
    }

    #[test]
    fn v2_over_ipv6_carries_sixteen_byte_addresses() {
        let bytes = header(ProxyProtocol::V2, addr("[2001:db8::1]:40000"), addr("[2001:db8::10]:80"));
        let mut expected = V2_SIGNATURE.to_vec();
        expected.extend_from_slice(&[0x21, 0x21, 0x00, 0x24]);
        expected.extend_from_slice(&[0x20, 0x01, 0x0D, 0xB8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x01]);
        expected.extend_from_slice(&[0x20, 0x01, 0x0D, 0xB8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10]);
        expected.extend_from_slice(&[0x9C, 0x40, 0x00, 0x50]); // 40000, 80
        assert_eq!(bytes, expected);
        assert_eq!(
            parse(&bytes),
            Parsed::Header { source: addr("[2001:db8::1]:40000"), destination: addr("[2001:db8::10]:80"), len: 52 }
        );
    }

    #[test]
    fn mixed_families_are_sent_as_ipv6_and_mapped_ipv4_as_ipv4() {
        let mapped = header(ProxyProtocol::V1, addr("[::ffff:192.0.2.7]:1234"), addr("[::ffff:192.0.2.1]:80"));
        assert_eq!(mapped, b"PROXY TCP4 192.0.2.7 192.0.2.1 1234 80\r\n");
        for version in [ProxyProtocol::V1, ProxyProtocol::V2] {
            let bytes = header(version, addr("192.0.2.7:1234"), addr("[2001:db8::10]:80"));
            assert_eq!(
                parse(&bytes),
                Parsed::Header {
                    source: addr("[::ffff:192.0.2.7]:1234"),
                    destination: addr("[2001:db8::10]:80"),
                    len: bytes.len()
                },
                "{version:?}"
            );
        }
    }

    #[test]
    fn the_annotation_spellings() {
        assert_eq!((ProxyProtocol::V1.as_str(), ProxyProtocol::V2.as_str()), ("v1", "v2"));
    }
}
