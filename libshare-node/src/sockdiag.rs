//! Who is at the other end of a loopback TCP connection: the owner (uid) of the client's socket,
//! from the kernel's socket table by one exact lookup over `NETLINK_SOCK_DIAG` (the interface
//! `ss` uses; `SOCK_DIAG_BY_FAMILY` with the connection's four-tuple, no dump). TCP has no
//! `SO_PEERCRED`, and reading `/proc/net/tcp` costs a pass over every socket of the host per
//! connection, which a flood of connections would turn into work for the daemon; the lookup is
//! one hash lookup in the kernel. The request and the reply are the kernel's fixed C structs
//! (`linux/inet_diag.h`), written here rather than through a netlink crate for one message.

use std::net::{IpAddr, SocketAddr};

const SOCK_DIAG_BY_FAMILY: u16 = 20;
const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 1;
/// Matches any socket cookie (`INET_DIAG_NOCOOKIE`).
const NO_COOKIE: [u32; 2] = [!0, !0];

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct NlMsgHdr {
    len: u32,
    ty: u16,
    flags: u16,
    seq: u32,
    pid: u32,
}

/// `struct inet_diag_sockid`: ports and addresses in network byte order.
#[repr(C)]
#[derive(Clone, Copy, Default, PartialEq, Eq)]
struct SockId {
    sport: [u8; 2],
    dport: [u8; 2],
    src: [u8; 16],
    dst: [u8; 16],
    ifindex: u32,
    cookie: [u32; 2],
}

/// `struct inet_diag_req_v2`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct ReqV2 {
    family: u8,
    protocol: u8,
    ext: u8,
    pad: u8,
    states: u32,
    id: SockId,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Request {
    nlh: NlMsgHdr,
    req: ReqV2,
}

/// `struct inet_diag_msg`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct DiagMsg {
    family: u8,
    state: u8,
    timer: u8,
    retrans: u8,
    id: SockId,
    expires: u32,
    rqueue: u32,
    wqueue: u32,
    uid: u32,
    inode: u32,
}

fn addr_bytes(ip: IpAddr) -> [u8; 16] {
    let mut b = [0u8; 16];
    match ip {
        IpAddr::V4(a) => b[..4].copy_from_slice(&a.octets()),
        IpAddr::V6(a) => b = a.octets(),
    }
    b
}

/// The socket whose local end is `src` and remote end `dst`.
fn sock_id(src: SocketAddr, dst: SocketAddr) -> SockId {
    SockId {
        sport: src.port().to_be_bytes(),
        dport: dst.port().to_be_bytes(),
        src: addr_bytes(src.ip()),
        dst: addr_bytes(dst.ip()),
        ifindex: 0,
        cookie: NO_COOKIE,
    }
}

/// The uid owning the client socket of a TCP connection this process accepted, `peer` being
/// the client's address and `local` ours. None: the kernel has no such socket (the client is
/// gone) or cannot be asked.
pub fn tcp_peer_uid(peer: SocketAddr, local: SocketAddr) -> Option<u32> {
    if peer.is_ipv4() != local.is_ipv4() {
        return None;
    }
    let family = if peer.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    let want = sock_id(peer, local);
    let req = Request {
        nlh: NlMsgHdr {
            len: std::mem::size_of::<Request>() as u32,
            ty: SOCK_DIAG_BY_FAMILY,
            flags: NLM_F_REQUEST,
            seq: 1,
            pid: 0,
        },
        req: ReqV2 {
            family: family as u8,
            protocol: libc::IPPROTO_TCP as u8,
            states: !0,
            id: want,
            ..ReqV2::default()
        },
    };
    // SAFETY: plain socket(2); the descriptor is owned below and closed on every path.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            libc::NETLINK_SOCK_DIAG,
        )
    };
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` was just opened by us and is not used elsewhere.
    let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    let raw = std::os::fd::AsRawFd::as_raw_fd(&fd);
    let timeout = libc::timeval {
        tv_sec: 0,
        tv_usec: 200_000,
    };
    // SAFETY: SO_RCVTIMEO takes a timeval; `timeout` is a live local of that type.
    unsafe {
        libc::setsockopt(
            raw,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            &timeout as *const libc::timeval as *const libc::c_void,
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    // SAFETY: an all-zero sockaddr_nl is valid; its family says netlink, pid 0 the kernel.
    let mut kernel: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    kernel.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    // SAFETY: `req` is a live #[repr(C)] value of the size passed; `kernel` a valid address.
    let sent = unsafe {
        libc::sendto(
            raw,
            &req as *const Request as *const libc::c_void,
            std::mem::size_of::<Request>(),
            0,
            &kernel as *const libc::sockaddr_nl as *const libc::sockaddr,
            std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
        )
    };
    if sent != std::mem::size_of::<Request>() as isize {
        return None;
    }
    let mut buf = [0u8; 1024];
    // SAFETY: recv(2) into a live local buffer of the length passed.
    let n = unsafe { libc::recv(raw, buf.as_mut_ptr() as *mut libc::c_void, buf.len(), 0) };
    let reply = buf.get(..usize::try_from(n).ok()?)?;
    parse_reply(reply, &want)
}

/// The uid in a reply to the lookup of `want` (None: an error, or another socket).
fn parse_reply(reply: &[u8], want: &SockId) -> Option<u32> {
    let h = std::mem::size_of::<NlMsgHdr>();
    let m = std::mem::size_of::<DiagMsg>();
    if reply.len() < h + m {
        return None;
    }
    // SAFETY: `reply` holds at least size_of::<NlMsgHdr>() bytes; read_unaligned copies them
    // into a plain-integer struct (any bit pattern is valid).
    let nlh: NlMsgHdr = unsafe { std::ptr::read_unaligned(reply.as_ptr() as *const NlMsgHdr) };
    if nlh.ty == NLMSG_ERROR || nlh.ty != SOCK_DIAG_BY_FAMILY || (nlh.len as usize) < h + m {
        return None;
    }
    // SAFETY: `reply` holds at least h + m bytes (checked); as above.
    let msg: DiagMsg = unsafe { std::ptr::read_unaligned(reply[h..].as_ptr() as *const DiagMsg) };
    let same = |a: &SockId| {
        (a.sport, a.dport, a.src, a.dst) == (want.sport, want.dport, want.src, want.dst)
    };
    same(&msg.id).then_some(msg.uid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};

    #[test]
    fn structs_have_the_kernels_sizes() {
        assert_eq!(std::mem::size_of::<SockId>(), 48);
        assert_eq!(std::mem::size_of::<ReqV2>(), 56);
        assert_eq!(std::mem::size_of::<Request>(), 72);
        assert_eq!(std::mem::size_of::<DiagMsg>(), 72);
    }

    #[test]
    fn the_client_of_a_loopback_connection_is_this_process_uid() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, peer) = l.accept().unwrap();
        // SAFETY: geteuid cannot fail.
        let me = unsafe { libc::geteuid() };
        assert_eq!(tcp_peer_uid(peer, s.local_addr().unwrap()), Some(me));
        let gone = c.local_addr().unwrap();
        drop(c);
        drop(s);
        let nowhere: SocketAddr = "127.0.0.1:1".parse().unwrap();
        assert_eq!(tcp_peer_uid(nowhere, gone), None, "no such socket");
        assert_eq!(parse_reply(&[0u8; 8], &SockId::default()), None);
    }
}
