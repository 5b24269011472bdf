//! Framing of the daemon's Unix-socket protocols (registration, admin), the client side.
//!
//! One request per connection: the client sends one frame, the daemon answers with one frame
//! (and, for registration, the container's state file as an `SCM_RIGHTS` descriptor) and closes.
//! A frame is a little-endian `u32` body length then the body; a body is at most
//! [`MAX_FRAME`] bytes. What a body holds is the protocol's business (`register`, `admin`).

use nix::sys::socket::{
    connect, recvmsg, send, setsockopt, socket, sockopt, AddressFamily, ControlMessageOwned,
    MsgFlags, SockFlag, SockType, UnixAddr,
};
use nix::sys::time::{TimeVal, TimeValLike};
use std::io::{IoSliceMut, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

/// The largest body either side accepts (an admin status of a full node fits easily).
pub const MAX_FRAME: usize = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("no daemon at {path} ({err}); start it with `sharectl daemon`")]
    Connect { path: String, err: std::io::Error },
    #[error("the daemon did not answer in time")]
    Timeout,
    /// The daemon closed the connection before a whole answer (it died, or is restarting).
    #[error("the daemon closed the connection without a whole answer")]
    Closed,
    #[error("talking to the daemon: {0}")]
    Io(#[from] std::io::Error),
    #[error("the daemon's answer is malformed: {0}")]
    Malformed(&'static str),
}

/// `len || body` for one message.
pub fn frame(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + body.len());
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(body);
    out
}

/// What the first bytes of a stream say about a frame: complete (body range), still short, or
/// longer than `max`.
#[derive(Debug, PartialEq, Eq)]
pub enum Framed {
    Complete(std::ops::Range<usize>),
    Short,
    TooLong(u64),
}

pub fn parse_frame(buf: &[u8], max: usize) -> Framed {
    let Some(len) = buf.get(..4) else {
        return Framed::Short;
    };
    let len = u32::from_le_bytes(len.try_into().expect("4 bytes")) as usize;
    if len > max {
        return Framed::TooLong(len as u64);
    }
    if buf.len() < 4 + len {
        return Framed::Short;
    }
    Framed::Complete(4..4 + len)
}

/// Sends `body` to the daemon at `path` and returns its answer and the descriptor it passed,
/// if any. `timeout` bounds each read and write.
pub fn call(
    path: &Path,
    body: &[u8],
    timeout: Duration,
) -> Result<(Vec<u8>, Option<OwnedFd>), WireError> {
    ask(path, body, timeout).map(|a| (a.body, a.fd))
}

/// An answer, with who sent it.
pub struct Answer {
    pub body: Vec<u8>,
    /// The descriptor passed with it, if any.
    pub fd: Option<OwnedFd>,
    /// The uid of the process that listens on the socket (`SO_PEERCRED`, as this process's
    /// user namespace sees it).
    pub peer_uid: u32,
}

/// [`call`], also saying which user answered.
pub fn ask(path: &Path, body: &[u8], timeout: Duration) -> Result<Answer, WireError> {
    let s = connect_within(path, timeout)?;
    let peer_uid = nix::sys::socket::getsockopt(&s, sockopt::PeerCredentials)
        .map_err(std::io::Error::from)?
        .uid();
    s.set_read_timeout(Some(timeout))?;
    match send_all(&s, &frame(body)) {
        // The daemon answered and closed before reading (a refusal at accept, e.g. busy): its
        // answer is still there to read.
        Err(WireError::Io(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        r => r?,
    }
    let mut buf = vec![0u8; 4096];
    let mut have = 0usize;
    let mut fd = None;
    loop {
        if let Framed::Complete(r) = parse_frame(&buf[..have], MAX_FRAME) {
            return Ok(Answer {
                body: buf[r].to_vec(),
                fd,
                peer_uid,
            });
        }
        if let Framed::TooLong(_) = parse_frame(&buf[..have], MAX_FRAME) {
            return Err(WireError::Malformed("frame too long"));
        }
        if have == buf.len() {
            buf.resize(buf.len() * 2, 0);
        }
        let (n, got) = recv_with_fd(&s, &mut buf[have..])?;
        if got.is_some() {
            fd = got;
        }
        if n == 0 {
            return Err(WireError::Closed);
        }
        have += n;
    }
}

/// A connection to `path`, waiting at most `timeout` for room in the daemon's backlog (a
/// daemon that does not accept, e.g. a stopped one, fills it; a plain `connect` would then
/// wait forever). The send timeout, set before `connect`, bounds the wait and stays set for
/// the request (`EAGAIN` after it: [`WireError::Timeout`]).
fn connect_within(path: &Path, timeout: Duration) -> Result<UnixStream, WireError> {
    let connect_err = |err: std::io::Error| WireError::Connect {
        path: path.display().to_string(),
        err,
    };
    let addr = UnixAddr::new(path).map_err(|e| connect_err(e.into()))?;
    let fd = socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(std::io::Error::from)?;
    // A zero timeout means "forever" to the kernel: at least a microsecond.
    let tv = TimeVal::microseconds(timeout.as_micros().clamp(1, i64::MAX as u128) as i64);
    setsockopt(&fd, sockopt::SendTimeout, &tv).map_err(std::io::Error::from)?;
    match connect(fd.as_raw_fd(), &addr) {
        Ok(()) => Ok(UnixStream::from(fd)),
        Err(nix::errno::Errno::EAGAIN) => Err(WireError::Timeout),
        Err(e) => Err(connect_err(e.into())),
    }
}

/// Writes all of `buf`; `MSG_NOSIGNAL`: a daemon that closed its side (a refusal sent at
/// accept) is an error here, not a SIGPIPE that kills the process the shim lives in.
fn send_all(s: &UnixStream, mut buf: &[u8]) -> Result<(), WireError> {
    while !buf.is_empty() {
        match send(s.as_raw_fd(), buf, MsgFlags::MSG_NOSIGNAL) {
            Ok(0) => return Err(WireError::Closed),
            Ok(n) => buf = &buf[n..],
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(timeout_of(e.into())),
        }
    }
    Ok(())
}

fn timeout_of(e: std::io::Error) -> WireError {
    match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => WireError::Timeout,
        _ => WireError::Io(e),
    }
}

/// One `recvmsg`: bytes read and a descriptor passed with them (extra descriptors are closed).
fn recv_with_fd(s: &UnixStream, buf: &mut [u8]) -> Result<(usize, Option<OwnedFd>), WireError> {
    let mut iov = [IoSliceMut::new(buf)];
    let mut cmsg = nix::cmsg_space!([std::os::fd::RawFd; 4]);
    let msg = loop {
        match recvmsg::<()>(
            s.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(timeout_of(std::io::Error::from(e))),
            Ok(m) => break m,
        }
    };
    let mut fd = None;
    for c in msg
        .cmsgs()
        .map_err(|_| WireError::Malformed("control message"))?
    {
        if let ControlMessageOwned::ScmRights(fds) = c {
            for raw in fds {
                // SAFETY: the kernel installed `raw` in this process for this message (with
                // CLOEXEC); nothing else owns it.
                let owned = unsafe { OwnedFd::from_raw_fd(raw) };
                if fd.is_none() {
                    fd = Some(owned);
                }
            }
        }
    }
    Ok((msg.bytes, fd))
}

/// Reads a whole frame from a blocking stream (the server side uses its own poll loop; this
/// is for tests and simple peers).
pub fn read_frame(s: &mut impl Read, max: usize) -> Result<Vec<u8>, WireError> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).map_err(timeout_of)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > max {
        return Err(WireError::Malformed("frame too long"));
    }
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).map_err(timeout_of)?;
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_parse_back_and_bound_their_length() {
        let f = frame(b"hello");
        assert_eq!(parse_frame(&f, 16), Framed::Complete(4..9));
        assert_eq!(&f[4..9], b"hello");
        assert_eq!(parse_frame(&f[..3], 16), Framed::Short);
        assert_eq!(parse_frame(&f[..8], 16), Framed::Short);
        assert_eq!(parse_frame(&f, 4), Framed::TooLong(5));
        assert_eq!(parse_frame(&frame(b""), 0), Framed::Complete(4..4));
    }
}
