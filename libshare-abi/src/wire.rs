//! Framing of the daemon's Unix-socket protocols (registration, admin), the client side.
//!
//! One request per connection: the client sends one frame, the daemon answers with one frame
//! (and, for registration, the container's state file as an `SCM_RIGHTS` descriptor) and closes.
//! A frame is a little-endian `u32` body length then the body; a body is at most
//! [`MAX_FRAME`] bytes. What a body holds is the protocol's business (`register`, `admin`).

use nix::sys::socket::{recvmsg, send, ControlMessageOwned, MsgFlags};
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
    let s = UnixStream::connect(path).map_err(|err| WireError::Connect {
        path: path.display().to_string(),
        err,
    })?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    send_all(&s, &frame(body))?;
    let mut buf = vec![0u8; 4096];
    let mut have = 0usize;
    let mut fd = None;
    loop {
        if let Framed::Complete(r) = parse_frame(&buf[..have], MAX_FRAME) {
            return Ok((buf[r].to_vec(), fd));
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
            return Err(WireError::Malformed(
                "the daemon closed the connection mid-answer",
            ));
        }
        have += n;
    }
}

/// Writes all of `buf` with `MSG_NOSIGNAL`: a daemon that closed the connection is an error,
/// never a SIGPIPE (a CUDA process the shim lives in, or `sharectl`, may not ignore it).
fn send_all(s: &UnixStream, mut buf: &[u8]) -> Result<(), WireError> {
    while !buf.is_empty() {
        match send(s.as_raw_fd(), buf, MsgFlags::MSG_NOSIGNAL) {
            Ok(0) => return Err(WireError::Io(std::io::ErrorKind::WriteZero.into())),
            Ok(n) => buf = &buf[n..],
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(timeout_of(std::io::Error::from(e))),
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
