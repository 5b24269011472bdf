//! The daemon's Unix-socket services (registration, admin): one thread per socket polls the
//! listener and every open connection, so a client that connects and never speaks, or sends
//! half a message, holds nothing but its own slot until its deadline.
//!
//! One request per connection, framed by `libshare_abi::wire` (length, body ≤ `max_len`). The
//! peer's credentials come from the kernel (`SO_PEERCRED`) at accept, never from the message.
//! What a request means, and who may send it, is the [`Service`]'s business.

use libshare_abi::wire::{frame, parse_frame, Framed};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{getsockopt, sendmsg, sockopt::PeerCredentials, ControlMessage, MsgFlags};
use std::io::{ErrorKind, IoSlice, Read};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering::Acquire};
use std::time::{Duration, Instant};

/// Who is on the other end, as the kernel says (host pid, uid and gid at `connect`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Peer {
    pub pid: u32,
    pub uid: u32,
    pub gid: u32,
}

/// A service's answer: the body, and a descriptor to pass with it.
pub struct Reply {
    pub body: Vec<u8>,
    pub fd: Option<OwnedFd>,
}

impl Reply {
    pub fn body(body: Vec<u8>) -> Self {
        Reply { body, fd: None }
    }
}

/// Why a connection ended without a request reaching the service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The peer may not use this socket (see [`Service::admit`]).
    NotAllowed,
    /// The announced body is longer than the service accepts.
    TooLong,
    /// The peer closed its side before a whole frame arrived.
    Truncated,
    /// No whole frame before the deadline.
    Timeout,
    /// Too many connections open at once.
    Busy,
}

impl Refusal {
    pub fn message(self) -> &'static str {
        match self {
            Refusal::NotAllowed => "not allowed: this socket is for root (the daemon's user) only",
            Refusal::TooLong => "the request is too long",
            Refusal::Truncated => "the request is truncated",
            Refusal::Timeout => "no whole request within the deadline",
            Refusal::Busy => "the daemon is busy; retry",
        }
    }
}

pub trait Service: Send {
    /// Whether `peer` may talk to this socket at all (checked at accept).
    fn admit(&self, peer: &Peer) -> bool;
    /// The answer to one whole request.
    fn handle(&mut self, peer: &Peer, request: &[u8]) -> Reply;
    /// The body sent when a connection is refused (best effort: the peer may be gone).
    fn refusal(&self, why: Refusal) -> Vec<u8>;
}

#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub path: PathBuf,
    /// Permission bits of the socket file (0o600: root only; 0o666: any local process).
    pub mode: u32,
    pub max_len: usize,
    /// From accept to a whole request.
    pub deadline: Duration,
    pub max_connections: usize,
}

impl ServerConfig {
    pub fn new(path: PathBuf, mode: u32) -> Self {
        ServerConfig {
            path,
            mode,
            max_len: 64 * 1024,
            deadline: Duration::from_secs(1),
            max_connections: 1024,
        }
    }
}

struct Conn {
    stream: UnixStream,
    peer: Peer,
    buf: Vec<u8>,
    deadline: Instant,
}

/// A bound socket, ready to [`Server::serve`].
pub struct Server {
    cfg: ServerConfig,
    listener: UnixListener,
}

impl Server {
    /// Binds `cfg.path` (a stale socket file there is replaced) with `cfg.mode`.
    pub fn bind(cfg: ServerConfig) -> std::io::Result<Server> {
        match std::fs::symlink_metadata(&cfg.path) {
            Ok(m) if std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()) => {
                std::fs::remove_file(&cfg.path)?
            }
            Ok(_) => {
                return Err(std::io::Error::new(
                    ErrorKind::AlreadyExists,
                    format!("{} exists and is not a socket", cfg.path.display()),
                ))
            }
            Err(_) => {}
        }
        let listener = UnixListener::bind(&cfg.path)?;
        std::fs::set_permissions(&cfg.path, std::fs::Permissions::from_mode(cfg.mode))?;
        listener.set_nonblocking(true)?;
        Ok(Server { cfg, listener })
    }

    pub fn path(&self) -> &Path {
        &self.cfg.path
    }

    /// Serves until `stop` is set (checked at least every 100 ms); removes the socket file.
    pub fn serve(self, service: &mut dyn Service, stop: &AtomicBool) {
        let mut conns: Vec<Conn> = Vec::new();
        while !stop.load(Acquire) {
            let now = Instant::now();
            let wait = conns
                .iter()
                .map(|c| c.deadline.saturating_duration_since(now))
                .min()
                .unwrap_or(Duration::from_millis(100))
                .min(Duration::from_millis(100));
            let ready: Vec<bool> = {
                let mut fds = Vec::with_capacity(conns.len() + 1);
                fds.push(PollFd::new(self.listener.as_fd(), PollFlags::POLLIN));
                for c in &conns {
                    fds.push(PollFd::new(c.stream.as_fd(), PollFlags::POLLIN));
                }
                let ms = PollTimeout::try_from(wait.as_millis().max(1) as i32)
                    .unwrap_or(PollTimeout::MAX);
                match poll(&mut fds, ms) {
                    Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                    Err(e) => {
                        tracing::warn!("{}: poll: {e}", self.cfg.path.display());
                        std::thread::sleep(Duration::from_millis(10));
                    }
                }
                fds.iter()
                    .map(|f| f.revents().is_some_and(|r| !r.is_empty()))
                    .collect()
            };
            // Connections first (indices shift once accepts push).
            let mut i = conns.len();
            while i > 0 {
                i -= 1;
                if ready[i + 1] || conns[i].deadline <= Instant::now() {
                    if let Some(done) = self.progress(&mut conns[i], service) {
                        let c = conns.swap_remove(i);
                        finish(&c.stream, done);
                    }
                }
            }
            if ready[0] {
                self.accept_all(&mut conns, service);
            }
        }
        let _ = std::fs::remove_file(&self.cfg.path);
    }

    fn accept_all(&self, conns: &mut Vec<Conn>, service: &mut dyn Service) {
        loop {
            let stream = match self.listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::warn!("{}: accept: {e}", self.cfg.path.display());
                    return;
                }
            };
            let peer = match getsockopt(&stream, PeerCredentials) {
                Ok(c) => Peer {
                    pid: c.pid() as u32,
                    uid: c.uid(),
                    gid: c.gid(),
                },
                Err(e) => {
                    tracing::warn!("{}: SO_PEERCRED: {e}", self.cfg.path.display());
                    continue;
                }
            };
            let refused = if !service.admit(&peer) {
                Some(Refusal::NotAllowed)
            } else if conns.len() >= self.cfg.max_connections {
                Some(Refusal::Busy)
            } else {
                None
            };
            if let Some(why) = refused {
                tracing::debug!(?peer, "{}: {}", self.cfg.path.display(), why.message());
                finish(&stream, Reply::body(service.refusal(why)));
                continue;
            }
            if stream.set_nonblocking(true).is_err() {
                continue;
            }
            let mut c = Conn {
                stream,
                peer,
                buf: Vec::new(),
                deadline: Instant::now() + self.cfg.deadline,
            };
            // A client usually sends with its connect: served now, without a poll round.
            match self.progress(&mut c, service) {
                Some(done) => finish(&c.stream, done),
                None => conns.push(c),
            }
        }
    }

    /// Reads what is there; `Some(reply)` when the connection is done.
    fn progress(&self, c: &mut Conn, service: &mut dyn Service) -> Option<Reply> {
        let mut chunk = [0u8; 4096];
        loop {
            match (&c.stream).read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => {
                    c.buf.extend_from_slice(&chunk[..n]);
                    match parse_frame(&c.buf, self.cfg.max_len) {
                        Framed::Complete(r) => {
                            let peer = c.peer;
                            return Some(service.handle(&peer, &c.buf[r]));
                        }
                        Framed::TooLong(_) => {
                            return Some(Reply::body(service.refusal(Refusal::TooLong)))
                        }
                        Framed::Short => continue,
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    return (c.deadline <= Instant::now())
                        .then(|| Reply::body(service.refusal(Refusal::Timeout)));
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
        }
        // End of stream (or a reset) before a whole frame.
        Some(Reply::body(service.refusal(Refusal::Truncated)))
    }
}

/// Sends the reply (and its descriptor) without blocking for long, then closes.
fn finish(stream: &UnixStream, reply: Reply) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_write_timeout(Some(Duration::from_millis(200)));
    let bytes = frame(&reply.body);
    let fds: Vec<i32> = reply.fd.iter().map(|f| f.as_raw_fd()).collect();
    let iov = [IoSlice::new(&bytes)];
    let cmsg = [ControlMessage::ScmRights(&fds)];
    let cmsgs: &[ControlMessage] = if fds.is_empty() { &[] } else { &cmsg };
    // The descriptor goes with the first bytes; a reply larger than the socket buffer is
    // finished with plain writes.
    match sendmsg::<()>(
        stream.as_raw_fd(),
        &iov,
        cmsgs,
        MsgFlags::MSG_NOSIGNAL,
        None,
    ) {
        Ok(n) if n < bytes.len() => {
            let _ = std::io::Write::write_all(&mut &*stream, &bytes[n..]);
        }
        _ => {}
    }
    let _ = stream.shutdown(std::net::Shutdown::Both);
}

#[cfg(test)]
mod tests {
    use super::*;
    use libshare_abi::wire::call;
    use std::io::Write;
    use std::sync::atomic::{AtomicBool, Ordering::Release};
    use std::sync::Arc;

    struct Echo;
    impl Service for Echo {
        fn admit(&self, _: &Peer) -> bool {
            true
        }
        fn handle(&mut self, peer: &Peer, req: &[u8]) -> Reply {
            let mut b = format!("{}:", peer.pid).into_bytes();
            b.extend_from_slice(req);
            let f = std::fs::File::open("/dev/null").unwrap();
            Reply {
                body: b,
                fd: Some(f.into()),
            }
        }
        fn refusal(&self, why: Refusal) -> Vec<u8> {
            why.message().as_bytes().to_vec()
        }
    }

    fn start(dir: &Path) -> (PathBuf, Arc<AtomicBool>, std::thread::JoinHandle<()>) {
        let mut cfg = ServerConfig::new(dir.join("s.sock"), 0o600);
        cfg.deadline = Duration::from_millis(300);
        cfg.max_len = 1024;
        let server = Server::bind(cfg).unwrap();
        let path = server.path().to_path_buf();
        let stop = Arc::new(AtomicBool::new(false));
        let s2 = stop.clone();
        let h = std::thread::spawn(move || server.serve(&mut Echo, &s2));
        (path, stop, h)
    }

    #[test]
    fn answers_with_the_kernels_pid_and_a_descriptor_and_survives_bad_clients() {
        let dir = tempfile::tempdir().unwrap();
        let (path, stop, h) = start(dir.path());
        // A client that connects and never speaks does not hold up the others.
        let silent = UnixStream::connect(&path).unwrap();
        let t0 = Instant::now();
        let (body, fd) = call(&path, b"hi", Duration::from_secs(2)).unwrap();
        assert!(
            t0.elapsed() < Duration::from_millis(200),
            "{:?}",
            t0.elapsed()
        );
        assert_eq!(body, format!("{}:hi", std::process::id()).into_bytes());
        assert!(fd.is_some());
        // Oversized, truncated and silent connections get their refusal and are closed.
        let mut big = UnixStream::connect(&path).unwrap();
        big.write_all(&(1u32 << 30).to_le_bytes()).unwrap();
        let got = libshare_abi::wire::read_frame(&mut big, 1024).unwrap();
        assert_eq!(got, Refusal::TooLong.message().as_bytes());
        let mut half = UnixStream::connect(&path).unwrap();
        half.write_all(&[10, 0, 0, 0, b'x']).unwrap();
        half.shutdown(std::net::Shutdown::Write).unwrap();
        let got = libshare_abi::wire::read_frame(&mut half, 1024).unwrap();
        assert_eq!(got, Refusal::Truncated.message().as_bytes());
        let mut silent = silent;
        let got = libshare_abi::wire::read_frame(&mut silent, 1024).unwrap();
        assert_eq!(got, Refusal::Timeout.message().as_bytes());
        stop.store(true, Release);
        h.join().unwrap();
        assert!(!path.exists());
    }
}
