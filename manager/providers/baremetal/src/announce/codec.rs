//! ARP and NDP frames, bytes in and bytes out: an ARP request or ICMPv6 Neighbor Solicitation
//! read from the wire, and the frames that answer it or announce an address (gratuitous ARP,
//! unsolicited Neighbor Advertisement). Parsing and checksums are `etherparse`'s; this module
//! only decides which frames count and what goes in the answers. Everything read is bounded:
//! frames longer than [`MAX_FRAME`] are refused before parsing.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use etherparse::{
    ArpHardwareId, ArpOperation, ArpPacket, EtherType, Ethernet2Header, Icmpv6Type, LinkSlice, NetSlice, PacketBuilder,
    SlicedPacket, TransportSlice, icmpv6::NeighborAdvertisementHeader,
};

/// An Ethernet hardware address.
pub type Mac = [u8; 6];

/// The longest frame parsed; ARP requests and Neighbor Solicitations are far shorter.
pub const MAX_FRAME: usize = 1514;

/// The shortest Ethernet frame (without its checksum); shorter ARP frames are padded to it.
const MIN_FRAME: usize = 60;

/// The Ethernet broadcast address.
const BROADCAST: Mac = [0xff; 6];

/// All-nodes multicast, where unsolicited Neighbor Advertisements go (RFC 4861 7.2.6).
const ALL_NODES: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);

/// NDP requires hop limit 255 both ways, proving a frame was not routed (RFC 4861 7.1.1).
const NDP_HOP_LIMIT: u8 = 255;

/// NDP option type of a Source Link-Layer Address.
const OPTION_SOURCE_LL: u8 = 1;
/// NDP option type of a Target Link-Layer Address.
const OPTION_TARGET_LL: u8 = 2;

/// A request to resolve an address, as read from the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    /// An ARP request (Ethernet, IPv4).
    Arp {
        /// Who asks (their hardware address, from the ARP body).
        sender_mac: Mac,
        /// Their IPv4 address.
        sender_ip: Ipv4Addr,
        /// The address asked about.
        target: Ipv4Addr,
    },
    /// An ICMPv6 Neighbor Solicitation with a source address (not duplicate address detection).
    Neighbor {
        /// Who asks: the Source Link-Layer Address option, else the Ethernet source.
        source_mac: Mac,
        /// Their IPv6 address.
        source_ip: Ipv6Addr,
        /// The address asked about.
        target: Ipv6Addr,
    },
}

impl Request {
    /// The address the request asks about.
    pub fn target(&self) -> IpAddr {
        match self {
            Self::Arp { target, .. } => IpAddr::V4(*target),
            Self::Neighbor { target, .. } => IpAddr::V6(*target),
        }
    }
}

/// Read `frame` as an ARP request or Neighbor Solicitation; `None` for anything else,
/// including malformed, oversized, routed (hop limit below 255) or badly checksummed frames and
/// duplicate address detection probes (unspecified source).
pub fn parse(frame: &[u8]) -> Option<Request> {
    if frame.len() > MAX_FRAME {
        return None;
    }
    let packet = SlicedPacket::from_ethernet(frame).ok()?;
    let Some(LinkSlice::Ethernet2(ethernet)) = &packet.link else { return None };
    match packet.net.as_ref()? {
        NetSlice::Arp(arp) => {
            if arp.hw_addr_type() != ArpHardwareId::ETHERNET
                || arp.proto_addr_type() != EtherType::IPV4
                || arp.operation() != ArpOperation::REQUEST
            {
                return None;
            }
            let sender_mac: Mac = arp.sender_hw_addr().try_into().ok()?;
            let sender_ip: [u8; 4] = arp.sender_protocol_addr().try_into().ok()?;
            let target: [u8; 4] = arp.target_protocol_addr().try_into().ok()?;
            Some(Request::Arp { sender_mac, sender_ip: sender_ip.into(), target: target.into() })
        }
        NetSlice::Ipv6(ipv6) => {
            let header = ipv6.header();
            if header.hop_limit() != NDP_HOP_LIMIT {
                return None;
            }
            let Some(TransportSlice::Icmpv6(icmp)) = &packet.transport else { return None };
            if !matches!(icmp.icmp_type(), Icmpv6Type::NeighborSolicitation) || icmp.code_u8() != 0 {
                return None;
            }
            let source_ip = header.source_addr();
            if source_ip.is_unspecified() || !icmp.is_checksum_valid(header.source(), header.destination()) {
                return None;
            }
            // The body after the 8-byte ICMPv6 header: the target, then options.
            let body = icmp.payload();
            let target: [u8; 16] = body.get(..16)?.try_into().ok()?;
            let target = Ipv6Addr::from(target);
            if target.is_multicast() {
                return None;
            }
            let source_mac = source_link_layer(body.get(16..)?).unwrap_or(ethernet.source());
            Some(Request::Neighbor { source_mac, source_ip, target })
        }
        _ => None,
    }
}

/// The Source Link-Layer Address option among NDP `options`, if present and well formed. An
/// option of length 0 is invalid and ends the walk (RFC 4861 4.6), as does running off the end.
fn source_link_layer(mut options: &[u8]) -> Option<Mac> {
    while options.len() >= 2 {
        let len = usize::from(options[1]) * 8;
        if len == 0 || len > options.len() {
            return None;
        }
        if options[0] == OPTION_SOURCE_LL && len == 8 {
            return options[2..8].try_into().ok();
        }
        options = &options[len..];
    }
    None
}

/// The frame answering `request` from `mac`: an ARP reply, or a solicited Neighbor
/// Advertisement with the override flag and a Target Link-Layer Address option.
pub fn reply(request: &Request, mac: Mac) -> Vec<u8> {
    match *request {
        Request::Arp { sender_mac, sender_ip, target } => {
            arp_frame(mac, sender_mac, ArpOperation::REPLY, target, sender_mac, sender_ip)
        }
        Request::Neighbor { source_mac, source_ip, target } => advertisement(mac, source_mac, target, source_ip, true),
    }
}

/// The frame announcing that `address` is at `mac`: a gratuitous ARP request (sender and
/// target both the address, broadcast; RFC 5227's announcement), or an unsolicited Neighbor
/// Advertisement to all nodes with the override flag (RFC 4861 7.2.6).
pub fn announcement(address: IpAddr, mac: Mac) -> Vec<u8> {
    match address {
        IpAddr::V4(v4) => arp_frame(mac, BROADCAST, ArpOperation::REQUEST, v4, [0; 6], v4),
        IpAddr::V6(v6) => advertisement(mac, multicast_mac(ALL_NODES), v6, ALL_NODES, false),
    }
}

/// The Ethernet address of an IPv6 multicast group (RFC 2464 7).
fn multicast_mac(group: Ipv6Addr) -> Mac {
    let o = group.octets();
    [0x33, 0x33, o[12], o[13], o[14], o[15]]
}

fn arp_frame(
    mac: Mac,
    destination: Mac,
    operation: ArpOperation,
    sender_ip: Ipv4Addr,
    target_mac: Mac,
    target_ip: Ipv4Addr,
) -> Vec<u8> {
    let ethernet = Ethernet2Header { source: mac, destination, ether_type: EtherType::ARP };
    let mut frame = Vec::with_capacity(MIN_FRAME);
    frame.extend_from_slice(&ethernet.to_bytes());
    // Both address pairs are 6 and 4 bytes, the only way `new` fails.
    if let Ok(arp) = ArpPacket::new(
        ArpHardwareId::ETHERNET,
        EtherType::IPV4,
        operation,
        &mac,
        &sender_ip.octets(),
        &target_mac,
        &target_ip.octets(),
    ) {
        frame.extend_from_slice(&arp.to_bytes());
    }
    frame.resize(MIN_FRAME, 0);
    frame
}

fn advertisement(mac: Mac, destination_mac: Mac, target: Ipv6Addr, destination: Ipv6Addr, solicited: bool) -> Vec<u8> {
    let flags = NeighborAdvertisementHeader { router: false, solicited, r#override: true };
    let builder = PacketBuilder::ethernet2(mac, destination_mac)
        .ipv6(target.octets(), destination.octets(), NDP_HOP_LIMIT)
        .icmpv6(Icmpv6Type::NeighborAdvertisement(flags));
    let mut body = [0u8; 24];
    body[..16].copy_from_slice(&target.octets());
    body[16] = OPTION_TARGET_LL;
    body[17] = 1; // length in units of 8 bytes
    body[18..].copy_from_slice(&mac);
    let mut frame = Vec::with_capacity(builder.size(body.len()));
    // Writing to a Vec fails only on a payload too large for IPv6, and this one is 24 bytes.
    let _ = builder.write(&mut frame, &body);
    frame
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
    }

    // Captured from Linux 6.x on a veth: 02:00:00:00:00:0a (192.0.2.1, 2001:db8::1) resolving
    // 192.0.2.100 and 2001:db8::100.
    const ARP_REQUEST: &str = "ffffffffffff02000000000a0806000108000604000102000000000ac0000201000000000000c0000264";
    const NEIGHBOR_SOLICITATION: &str = "3333ff00010002000000000a86dd6000000000203aff20010db8000000000000000000000001ff0200000000000000000001ff00010087001a220000000020010db8000000000000000000000100010102000000000a";

    const ASKER: Mac = [2, 0, 0, 0, 0, 0x0a];
    const US: Mac = [2, 0, 0, 0, 0, 0x0b];

    #[test]
    fn a_real_arp_request_is_read() {
        let request = parse(&hex(ARP_REQUEST)).unwrap();
        assert_eq!(
            request,
            Request::Arp {
                sender_mac: ASKER,
                sender_ip: "192.0.2.1".parse().unwrap(),
                target: "192.0.2.100".parse().unwrap()
            }
        );
    }

    #[test]
    fn the_arp_reply_carries_our_address_back_to_the_asker() {
        let frame = reply(&parse(&hex(ARP_REQUEST)).unwrap(), US);
        assert_eq!(frame.len(), MIN_FRAME);
        let expected = hex(concat!(
            "02000000000a",
            "02000000000b",
            "0806", // to the asker, from us, ARP
            "0001",
            "0800",
            "06",
            "04",
            "0002", // Ethernet, IPv4, sizes, reply
            "02000000000b",
            "c0000264", // we are 192.0.2.100
            "02000000000a",
            "c0000201", // to 192.0.2.1
        ));
        assert_eq!(frame[..42], expected[..]);
        assert!(frame[42..].iter().all(|b| *b == 0), "padding is zeroes");
        // A reply is not itself a request.
        assert_eq!(parse(&frame), None);
    }

    #[test]
    fn a_real_neighbor_solicitation_is_read() {
        let request = parse(&hex(NEIGHBOR_SOLICITATION)).unwrap();
        assert_eq!(
            request,
            Request::Neighbor {
                source_mac: ASKER,
                source_ip: "2001:db8::1".parse().unwrap(),
                target: "2001:db8::100".parse().unwrap()
            }
        );
    }

    #[test]
    fn the_neighbor_advertisement_is_solicited_overriding_and_checksummed() {
        let frame = reply(&parse(&hex(NEIGHBOR_SOLICITATION)).unwrap(), US);
        assert_eq!(frame.len(), 14 + 40 + 32);
        assert_eq!(frame[..6], ASKER, "to the asker");
        assert_eq!(frame[6..12], US);
        assert_eq!(frame[12..14], [0x86, 0xdd]);
        assert_eq!(frame[20], 58, "ICMPv6");
        assert_eq!(frame[21], 255, "hop limit");
        assert_eq!(frame[22..38], "2001:db8::100".parse::<Ipv6Addr>().unwrap().octets(), "from the target");
        assert_eq!(frame[38..54], "2001:db8::1".parse::<Ipv6Addr>().unwrap().octets(), "to the asker");
        assert_eq!(frame[54], 136, "Neighbor Advertisement");
        assert_eq!(frame[58], 0b0110_0000, "solicited and override, not router");
        assert_eq!(frame[62..78], "2001:db8::100".parse::<Ipv6Addr>().unwrap().octets());
        assert_eq!(frame[78..86], [2, 1, 2, 0, 0, 0, 0, 0x0b], "target link-layer address option");
        assert_eq!(checksum_v6(&frame), 0, "the ICMPv6 checksum verifies");
    }

    /// RFC 4443 2.3 checksum over the pseudo-header and message; 0 when the stored one is right.
    fn checksum_v6(frame: &[u8]) -> u16 {
        let icmp = &frame[54..];
        let mut sum: u32 = 0;
        let mut add = |bytes: &[u8]| {
            for pair in bytes.chunks(2) {
                let word = u16::from_be_bytes([pair[0], *pair.get(1).unwrap_or(&0)]);
                sum += u32::from(word);
            }
        };
        add(&frame[22..54]);
        add(&(icmp.len() as u32).to_be_bytes());
        add(&[0, 0, 0, 58]);
        add(icmp);
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        !(sum as u16)
    }

    #[test]
    fn announcements_are_gratuitous_arp_and_unsolicited_na() {
        let garp = announcement("192.0.2.100".parse().unwrap(), US);
        assert_eq!(garp[..6], BROADCAST);
        assert_eq!(garp[20..22], [0, 1], "a request (RFC 5227 announcement)");
        assert_eq!(garp[28..32], [192, 0, 2, 100], "sender address");
        assert_eq!(garp[38..42], [192, 0, 2, 100], "target address, the same");
        let request = parse(&garp).unwrap();
        assert_eq!(request.target(), "192.0.2.100".parse::<IpAddr>().unwrap());

        let na = announcement("2001:db8::100".parse().unwrap(), US);
        assert_eq!(na[..6], [0x33, 0x33, 0, 0, 0, 1], "all-nodes multicast");
        assert_eq!(na[38..54], ALL_NODES.octets());
        assert_eq!(na[58], 0b0010_0000, "override, not solicited");
        assert_eq!(checksum_v6(&na), 0);
    }

    #[test]
    fn malformed_and_foreign_frames_are_ignored() {
        let ns = hex(NEIGHBOR_SOLICITATION);
        // Truncated anywhere.
        for len in 0..ns.len() {
            assert_eq!(parse(&ns[..len]), None, "truncated to {len}");
        }
        let arp = hex(ARP_REQUEST);
        for len in 0..arp.len() {
            assert_eq!(parse(&arp[..len]), None, "truncated to {len}");
        }
        // Routed: hop limit below 255.
        let mut routed = ns.clone();
        routed[21] = 254;
        assert_eq!(parse(&routed), None);
        // Bad checksum.
        let mut corrupt = ns.clone();
        corrupt[85] ^= 1;
        assert_eq!(parse(&corrupt), None);
        // Oversized.
        let mut big = arp.clone();
        big.resize(MAX_FRAME + 1, 0);
        assert_eq!(parse(&big), None);
        // Padding after an ARP request is fine.
        let mut padded = arp.clone();
        padded.resize(60, 0);
        assert!(parse(&padded).is_some());
        // An IPv4 packet is not a request.
        let mut ipv4 = arp;
        ipv4[12..14].copy_from_slice(&[0x08, 0x00]);
        assert_eq!(parse(&ipv4), None);
    }

    #[test]
    fn link_layer_options_are_walked_with_bounds() {
        assert_eq!(source_link_layer(&[1, 1, 1, 2, 3, 4, 5, 6]), Some([1, 2, 3, 4, 5, 6]));
        // A nonce option (14) first, then the address.
        assert_eq!(source_link_layer(&[14, 1, 0, 0, 0, 0, 0, 0, 1, 1, 9, 9, 9, 9, 9, 9]), Some([9; 6]));
        assert_eq!(source_link_layer(&[1, 0, 1, 2, 3, 4, 5, 6]), None, "length 0 is invalid");
        assert_eq!(source_link_layer(&[1, 2, 1, 2, 3, 4, 5, 6]), None, "runs past the end");
        assert_eq!(source_link_layer(&[]), None);
    }
}
