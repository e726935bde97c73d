//! The L2 responder's I/O: one `AF_PACKET` socket per interface, answering ARP requests and
//! Neighbor Solicitations for the addresses this node owns and announcing gained ones. Needs
//! `CAP_NET_RAW` only: no address is added to any interface (the node's kernel never owns the
//! addresses; kube-proxy or the data path takes the traffic that arrives for them).
//!
//! Decisions live elsewhere: which addresses are owned ([`super::elect`]), what to send when
//! ([`super::plan`]), the bytes ([`super::codec`]).

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::mem;
use std::net::{IpAddr, Ipv6Addr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::codec::{self, Mac};
use super::elect::OwnershipChange;
use super::plan::{self, AnnouncePlan};
use super::pulse::Pulse;

/// Bytes kept of each frame: an ARP request is 42, a Neighbor Solicitation with options well
/// under 128; the kernel's filter truncates anything longer before it reaches us.
pub const CAPTURE_BYTES: usize = 256;

/// Frames read per wake-up before yielding, so a flood cannot starve the other tasks.
const FRAMES_PER_WAKE: usize = 64;

/// How often a responder checks that its socket is still bound to the interface its name has:
/// below the announcer's settle time, so a re-created interface is followed before the node
/// takes its addresses back.
pub const FOLLOW_INTERVAL: std::time::Duration = std::time::Duration::from_millis(250);

/// Why a responder could not open or run.
#[derive(Debug, thiserror::Error)]
pub enum L2Error {
    /// The interface name is empty, too long (15 bytes) or has a NUL.
    #[error("loadBalancer.announcement.l2.interfaces: {0:?} is not an interface name (1-15 bytes)")]
    InterfaceName(String),
    /// A system call failed on the named interface.
    #[error("L2 announcement on interface {interface}: {what}: {source}")]
    Io {
        /// The interface.
        interface: String,
        /// What was being done.
        what: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The interface is not Ethernet (no 6-byte hardware address).
    #[error("L2 announcement on interface {0}: not an Ethernet interface")]
    NotEthernet(String),
}

/// A packet socket bound to one interface, in the network namespace of the thread that opened
/// it (a socket keeps its namespace, which is what lets a test run nodes in namespaces).
#[derive(Debug)]
pub struct L2Socket {
    interface: String,
    ifindex: u32,
    mac: Mac,
    packet: OwnedFd,
    /// A datagram socket only used to join solicited-node multicast groups: the kernel then
    /// accepts those frames and sends MLD reports so snooping switches forward them to us.
    /// `None` when IPv6 is off on the interface.
    groups: Option<socket2::Socket>,
    /// Beaten by [`run`]'s loop, read by the health monitor.
    pulse: Arc<Pulse>,
}

fn io_err<'a>(interface: &'a str, what: &'static str) -> impl FnOnce(io::Error) -> L2Error + 'a {
    move |source| L2Error::Io { interface: interface.to_string(), what, source }
}

fn last_os(interface: &str, what: &'static str) -> L2Error {
    io_err(interface, what)(io::Error::last_os_error())
}

/// The ifreq for `interface`, name filled in.
pub(crate) fn ifreq(interface: &str) -> Result<libc::ifreq, L2Error> {
    let bytes = interface.as_bytes();
    if bytes.is_empty() || bytes.len() >= libc::IFNAMSIZ || bytes.contains(&0) {
        return Err(L2Error::InterfaceName(interface.to_string()));
    }
    // SAFETY: ifreq is plain old data; all zeroes is a valid value.
    let mut req: libc::ifreq = unsafe { mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(bytes) {
        *dst = *src as libc::c_char;
    }
    Ok(req)
}

/// Classic BPF: keep ARP requests and ICMPv6 Neighbor Solicitations (no extension headers, as
/// RFC 4861 senders send them), truncated to [`CAPTURE_BYTES`]; drop everything else in the
/// kernel, so a busy node's traffic never reaches this process.
fn filter() -> [libc::sock_filter; 11] {
    const LDH: u16 = (libc::BPF_LD | libc::BPF_H | libc::BPF_ABS) as u16;
    const LDB: u16 = (libc::BPF_LD | libc::BPF_B | libc::BPF_ABS) as u16;
    const JEQ: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
    const RET: u16 = (libc::BPF_RET | libc::BPF_K) as u16;
    let op = |code, jt, jf, k| libc::sock_filter { code, jt, jf, k };
    [
        op(LDH, 0, 0, 12),                   // 0: EtherType
        op(JEQ, 0, 2, 0x0806),               // 1: ARP -> 2, else 4
        op(LDH, 0, 0, 20),                   // 2: ARP operation
        op(JEQ, 5, 6, 1),                    // 3: request -> accept, else drop
        op(JEQ, 0, 5, 0x86dd),               // 4: IPv6 -> 5, else drop
        op(LDB, 0, 0, 20),                   // 5: next header
        op(JEQ, 0, 3, 58),                   // 6: ICMPv6 -> 7, else drop
        op(LDB, 0, 0, 54),                   // 7: ICMPv6 type
        op(JEQ, 0, 1, 135),                  // 8: Neighbor Solicitation -> accept, else drop
        op(RET, 0, 0, CAPTURE_BYTES as u32), // 9: accept
        op(RET, 0, 0, 0),                    // 10: drop
    ]
}

impl AsRawFd for L2Socket {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.packet.as_raw_fd()
    }
}

impl L2Socket {
    /// Open a packet socket on `interface` in the calling thread's network namespace.
    pub fn open(interface: &str) -> Result<Self, L2Error> {
        ifreq(interface)?;
        let protocol = (libc::ETH_P_ALL as u16).to_be();
        // SAFETY: plain socket(2); the result is checked before use.
        let raw = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                i32::from(protocol),
            )
        };
        if raw < 0 {
            return Err(last_os(interface, "opening a packet socket (needs CAP_NET_RAW)"));
        }
        // SAFETY: raw is a fresh descriptor we own.
        let packet = unsafe { OwnedFd::from_raw_fd(raw) };
        let fd = packet.as_raw_fd();

        let (index, mac) = lookup(fd, interface)?;
        let ifindex = u32::try_from(index).map_err(|_| L2Error::NotEthernet(interface.to_string()))?;

        let program = filter();
        let fprog = libc::sock_fprog { len: program.len() as u16, filter: program.as_ptr().cast_mut() };
        // SAFETY: fprog points at `program`, alive for the call; the kernel copies it.
        let rc = unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_ATTACH_FILTER,
                (&fprog as *const libc::sock_fprog).cast(),
                mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
            )
        };
        if rc < 0 {
            return Err(last_os(interface, "attaching the ARP/NDP filter"));
        }

        bind_to(fd, interface, index)?;
        // Frames queued between socket() and the filter may be anything; drop them.
        let mut scratch = [0u8; CAPTURE_BYTES];
        // SAFETY: reads into our buffer, non-blocking.
        while unsafe { libc::recv(fd, scratch.as_mut_ptr().cast(), scratch.len(), 0) } > 0 {}

        let groups = socket2::Socket::new(socket2::Domain::IPV6, socket2::Type::DGRAM, None).ok();
        Ok(Self { interface: interface.to_string(), ifindex, mac, packet, groups, pulse: Arc::new(Pulse::new()) })
    }

    /// The interface's name.
    pub fn interface(&self) -> &str {
        &self.interface
    }

    /// The pulse [`run`] beats while it answers on this socket: for the health monitor.
    pub fn pulse(&self) -> Arc<Pulse> {
        Arc::clone(&self.pulse)
    }

    /// Requests the kernel dropped since the last call because the socket's buffer was full
    /// (`PACKET_STATISTICS`, which resets on read).
    fn take_drops(&self) -> io::Result<u32> {
        // SAFETY: tpacket_stats is plain old data; all zeroes is a valid value.
        let mut stats: libc::tpacket_stats = unsafe { mem::zeroed() };
        let mut len = mem::size_of::<libc::tpacket_stats>() as libc::socklen_t;
        // SAFETY: PACKET_STATISTICS writes at most `len` bytes into `stats`, on our socket.
        let rc = unsafe {
            libc::getsockopt(
                self.packet.as_raw_fd(),
                libc::SOL_PACKET,
                libc::PACKET_STATISTICS,
                (&mut stats as *mut libc::tpacket_stats).cast(),
                &mut len,
            )
        };
        if rc < 0 { Err(io::Error::last_os_error()) } else { Ok(stats.tp_drops) }
    }

    /// The interface's hardware address, the one every answer carries.
    pub fn mac(&self) -> Mac {
        self.mac
    }

    /// Bind again when the interface was deleted and created again under the same name (a
    /// bond or VLAN re-created, a veth replaced): the kernel unbinds a packet socket from a
    /// removed interface for good, so without this the responder would stay open and deaf while
    /// the name is up again. Returns the old and new index when it re-bound; `None` when the
    /// socket is bound to the interface the name has now, or the name has none (gone: the link
    /// probe reports that).
    pub fn follow(&mut self) -> Result<Option<(i32, i32)>, L2Error> {
        let fd = self.packet.as_raw_fd();
        let bound = bound_index(fd).map_err(io_err(&self.interface, "reading the bound interface"))?;
        let (index, mac) = match lookup(fd, &self.interface) {
            Ok(found) => found,
            Err(L2Error::Io { source, .. }) if source.raw_os_error() == Some(libc::ENODEV) => return Ok(None),
            Err(error) => return Err(error),
        };
        if bound == index {
            return Ok(None);
        }
        bind_to(fd, &self.interface, index)?;
        // The error the removal left on the socket (ENETDOWN) is about the old interface.
        let _ = pending_error(fd);
        self.ifindex = u32::try_from(index).map_err(|_| L2Error::NotEthernet(self.interface.clone()))?;
        self.mac = mac;
        Ok(Some((bound, index)))
    }

    fn send(&self, frame: &[u8]) -> io::Result<()> {
        // SAFETY: send(2) from our buffer on our bound socket.
        let n = unsafe { libc::send(self.packet.as_raw_fd(), frame.as_ptr().cast(), frame.len(), 0) };
        if n < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
    }

    /// Receive one frame into `buf`: its length, or `None` for a frame this host sent.
    fn recv(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        // SAFETY: sockaddr_ll is plain old data; recvfrom fills at most its size.
        let mut from: libc::sockaddr_ll = unsafe { mem::zeroed() };
        let mut len = mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
        // SAFETY: reads at most buf.len() bytes into buf.
        let n = unsafe {
            libc::recvfrom(
                self.packet.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                0,
                (&mut from as *mut libc::sockaddr_ll).cast(),
                &mut len,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        if from.sll_pkttype == libc::PACKET_OUTGOING {
            return Ok(None);
        }
        Ok(Some(n as usize))
    }

    fn join(&self, group: Ipv6Addr, join: bool) {
        let Some(socket) = &self.groups else { return };
        let result = if join {
            socket.join_multicast_v6(&group, self.ifindex)
        } else {
            socket.leave_multicast_v6(&group, self.ifindex)
        };
        if let Err(error) = result {
            tracing::warn!(interface = %self.interface, %group, join, %error, "solicited-node multicast group");
        }
    }
}

/// `interface`'s index and Ethernet address, asked through `fd` (so in `fd`'s namespace).
fn lookup(fd: std::os::fd::RawFd, interface: &str) -> Result<(i32, Mac), L2Error> {
    let mut req = ifreq(interface)?;
    // SAFETY: ioctls on our socket with an ifreq naming the interface.
    if unsafe { libc::ioctl(fd, libc::SIOCGIFINDEX, &mut req) } < 0 {
        return Err(last_os(interface, "looking up the interface"));
    }
    // SAFETY: SIOCGIFINDEX filled the union's ifindex member.
    let index = unsafe { req.ifr_ifru.ifru_ifindex };
    // SAFETY: as above.
    if unsafe { libc::ioctl(fd, libc::SIOCGIFHWADDR, &mut req) } < 0 {
        return Err(last_os(interface, "reading the hardware address"));
    }
    // SAFETY: SIOCGIFHWADDR filled the union's hwaddr member.
    let hw = unsafe { req.ifr_ifru.ifru_hwaddr };
    if hw.sa_family != libc::ARPHRD_ETHER {
        return Err(L2Error::NotEthernet(interface.to_string()));
    }
    let mut mac = [0u8; 6];
    for (dst, src) in mac.iter_mut().zip(hw.sa_data.iter()) {
        *dst = *src as u8;
    }
    Ok((index, mac))
}

/// Bind the packet socket `fd` to interface `index`, every protocol (the filter picks).
fn bind_to(fd: std::os::fd::RawFd, interface: &str, index: i32) -> Result<(), L2Error> {
    // SAFETY: sockaddr_ll is plain old data.
    let mut addr: libc::sockaddr_ll = unsafe { mem::zeroed() };
    addr.sll_family = libc::AF_PACKET as u16;
    addr.sll_protocol = (libc::ETH_P_ALL as u16).to_be();
    addr.sll_ifindex = index;
    // SAFETY: addr is a valid sockaddr_ll of the given size.
    let rc = unsafe {
        libc::bind(
            fd,
            (&addr as *const libc::sockaddr_ll).cast(),
            mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        return Err(last_os(interface, "binding the packet socket"));
    }
    Ok(())
}

/// The interface index the packet socket `fd` is bound to now (-1 once its interface was
/// removed).
fn bound_index(fd: std::os::fd::RawFd) -> io::Result<i32> {
    // SAFETY: sockaddr_ll is plain old data; getsockname fills at most its size.
    let mut addr: libc::sockaddr_ll = unsafe { mem::zeroed() };
    let mut len = mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
    // SAFETY: as above, on our socket.
    if unsafe { libc::getsockname(fd, (&mut addr as *mut libc::sockaddr_ll).cast(), &mut len) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(addr.sll_ifindex)
}

/// Take (and so clear) the socket's pending error.
fn pending_error(fd: std::os::fd::RawFd) -> io::Result<i32> {
    let mut error: libc::c_int = 0;
    let mut len = mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: SO_ERROR writes one int into `error`.
    let rc = unsafe {
        libc::getsockopt(fd, libc::SOL_SOCKET, libc::SO_ERROR, (&mut error as *mut libc::c_int).cast(), &mut len)
    };
    if rc < 0 { Err(io::Error::last_os_error()) } else { Ok(error) }
}

/// The addresses the responder on `interface` answers for: `owned` less those whose pool
/// answers on other interfaces only (`only_on`, [`super::policy::answered_on`]), kept current
/// by a task until `cancel` or until `owned`'s sender is gone.
pub fn on_interface(
    mut owned: watch::Receiver<BTreeSet<IpAddr>>,
    mut only_on: watch::Receiver<BTreeMap<IpAddr, BTreeSet<String>>>,
    interface: String,
    cancel: CancellationToken,
) -> watch::Receiver<BTreeSet<IpAddr>> {
    let filter = move |owned: &watch::Receiver<BTreeSet<IpAddr>>, only_on: &watch::Receiver<_>| {
        super::policy::answered_on(&owned.borrow(), &only_on.borrow(), &interface)
    };
    let (tx, rx) = watch::channel(filter(&owned, &only_on));
    tokio::spawn(async move {
        let mut only_on_open = true;
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                changed = owned.changed() => if changed.is_err() { return },
                changed = only_on.changed(), if only_on_open => only_on_open = changed.is_ok(),
            }
            let next = filter(&owned, &only_on);
            crate::announce::publish::if_changed(&tx, next);
        }
    });
    rx
}

/// Answer for the addresses in `owned` on `socket` until `cancel`: replies to requests for
/// owned addresses, and gratuitous ARP / unsolicited NA ([`plan`]) for each one gained. Each
/// pass of the loop beats the socket's [`Pulse`] (at least every [`FOLLOW_INTERVAL`], idle or
/// not), and requests the kernel dropped unread are counted there.
pub async fn run(
    socket: L2Socket,
    mut owned: watch::Receiver<BTreeSet<IpAddr>>,
    cancel: CancellationToken,
) -> Result<(), L2Error> {
    let interface = socket.interface.clone();
    // SAFETY: the descriptor is the socket's OwnedFd, open and unchanged while the AsyncFd owns it.
    let mut fd = unsafe { AsyncFd::register_with_interest(socket, Interest::READABLE) }
        .map_err(|e| io_err(&interface, "registering with the runtime")(e.into()))?;
    let mut current: BTreeSet<IpAddr> = BTreeSet::new();
    let mut announcements = AnnouncePlan::default();
    let mut buf = [0u8; CAPTURE_BYTES];
    let mut follow = tokio::time::interval(FOLLOW_INTERVAL);
    follow.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut follow_error: Option<String> = None;
    let mut dropping = false;
    let pulse = fd.get_ref().pulse();
    // The first value counts as a change.
    owned.mark_changed();
    loop {
        pulse.beat();
        let next = announcements.next_due();
        // Biased: an ownership change is taken in before frames are answered, so a request that
        // arrives with the first owned set is not dropped as "not ours".
        tokio::select! {
            biased;
            _ = cancel.cancelled() => break,
            changed = owned.changed() => {
                if changed.is_err() {
                    break;
                }
                let now_owned = owned.borrow_and_update().clone();
                let change = OwnershipChange::between(&current, &now_owned);
                let (before, after) = (plan::groups(&current), plan::groups(&now_owned));
                for group in after.difference(&before) {
                    fd.get_ref().join(*group, true);
                }
                for group in before.difference(&after) {
                    fd.get_ref().join(*group, false);
                }
                if !change.is_empty() {
                    tracing::info!(interface = %interface, gained = ?change.gained, lost = ?change.lost, "L2 announcement: ownership changed");
                }
                announcements.apply(&change, tokio::time::Instant::now());
                current = now_owned;
            }
            _ = sleep_until(next) => {
                let mac = fd.get_ref().mac;
                for address in announcements.due(tokio::time::Instant::now()) {
                    if let Err(error) = fd.get_ref().send(&codec::announcement(address, mac)) {
                        tracing::warn!(interface = %interface, %address, %error, "sending a gratuitous announcement");
                    }
                }
            }
            _ = follow.tick() => {
                match fd.get_ref().take_drops() {
                    Ok(0) => dropping = false,
                    Ok(frames) => {
                        pulse.add_dropped(u64::from(frames));
                        // Once when drops start, not every check while they go on.
                        if !dropping {
                            tracing::warn!(interface = %interface, frames, total = pulse.dropped(), "L2 announcement: the kernel dropped requests the responder had not read in time");
                        }
                        dropping = true;
                    }
                    // Statistics are a diagnosis only; the check below reports a socket in trouble.
                    Err(_) => {}
                }
                match fd.get_mut().follow() {
                    Ok(Some((old, new))) => {
                        follow_error = None;
                        tracing::warn!(interface = %interface, old_index = old, new_index = new, "L2 announcement: the interface was created again; answering on the new one");
                        // Its multicast groups went with the old interface; neighbours may know
                        // another hardware address: join again and announce everything owned.
                        for group in plan::groups(&current) {
                            fd.get_ref().join(group, true);
                        }
                        let everything = OwnershipChange::between(&BTreeSet::new(), &current);
                        announcements.apply(&everything, tokio::time::Instant::now());
                    }
                    Ok(None) => follow_error = None,
                    Err(error) => {
                        // Once per distinct error, not every check.
                        let text = error.to_string();
                        if follow_error.as_deref() != Some(text.as_str()) {
                            tracing::warn!(interface = %interface, error = %text, "L2 announcement: checking the interface");
                            follow_error = Some(text);
                        }
                    }
                }
            }
            guard = fd.readable() => {
                let mut guard = guard.map_err(io_err(&interface, "waiting for frames"))?;
                for _ in 0..FRAMES_PER_WAKE {
                    match guard.try_io(|inner| inner.get_ref().recv(&mut buf)) {
                        Ok(Ok(Some(n))) => answer(fd.get_ref(), &buf[..n], &current),
                        Ok(Ok(None)) => {}
                        Ok(Err(error)) => {
                            tracing::warn!(interface = %interface, %error, "reading a frame");
                            break;
                        }
                        Err(_would_block) => break,
                    }
                }
            }
        }
    }
    Ok(())
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn answer(socket: &L2Socket, frame: &[u8], owned: &BTreeSet<IpAddr>) {
    let Some(request) = codec::parse(frame) else { return };
    if !owned.contains(&request.target()) {
        return;
    }
    if let Err(error) = socket.send(&codec::reply(&request, socket.mac)) {
        tracing::warn!(interface = %socket.interface, address = %request.target(), %error, "answering");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interface_names_are_bounded() {
        assert!(matches!(ifreq(""), Err(L2Error::InterfaceName(_))));
        assert!(matches!(ifreq("a-very-long-name0"), Err(L2Error::InterfaceName(_))));
        assert!(matches!(ifreq("eth\0"), Err(L2Error::InterfaceName(_))));
        assert!(ifreq("eth0").is_ok());
    }

    #[test]
    fn the_filter_jumps_stay_inside_the_program() {
        let program = filter();
        for (i, op) in program.iter().enumerate() {
            if op.code == (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16 {
                assert!(i + 1 + usize::from(op.jt) < program.len());
                assert!(i + 1 + usize::from(op.jf) < program.len());
            }
        }
    }
}
