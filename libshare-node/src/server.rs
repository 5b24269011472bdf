//! The daemon's Unix-socket services (registration, admin): one thread per socket polls the
//! listener and every open connection, so a client that connects and never speaks, or sends
//! half a message, holds nothing but its own slot until its deadline.
//!
//! One request per connection, framed by `libshare_abi::wire` (length, body ≤ `max_len`). The
//! peer's credentials come from the kernel (`SO_PEERCRED`) at accept, never from the message;
//! with `pin_identity`, so does its cgroup, read at accept with its process pinned
//! ([`crate::peer`]): a peer whose cgroup cannot be read that way is refused.
//!
//! A request that is there at accept (a shim sends with its connect) is answered at once.
//! A connection that must be held waits within limits an unprivileged flood cannot exhaust for
//! others: at most `max_per_uid` held per non-root user, `max_per_group` per group (the
//! service's [`Service::group`]: the registration socket's is the container), `max_connections`
//! in all (kept below the descriptor limit); past them it is answered [`Refusal::Busy`]. One
//! that has sent nothing after `first_byte` is closed, one without a whole request after
//! `deadline` too. At the descriptor limit (`EMFILE`), queued connections are accepted on a
//! reserved descriptor and closed at once, so the listener drains instead of waking the loop
//! for ever, and the condition is logged at most once per 10 s.
//! What a request means, and who may send it, is the [`Service`]'s business.

use libshare_abi::wire::{frame, parse_frame, Framed};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{getsockopt, sendmsg, sockopt::PeerCredentials, ControlMessage, MsgFlags};
use std::collections::HashMap;
use std::io::{ErrorKind, IoSlice, Read};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering::Acquire};
use std::time::{Duration, Instant};

/// Who is on the other end, as the kernel says (host pid, uid and gid at `connect`; with
/// `pin_identity`, the text of its `/proc/<pid>/cgroup` read at accept).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    pub pid: u32,
    pub uid: u32,
    pub gid: u32,
    pub cgroups: Option<String>,
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
    /// Too many connections held at once (for this peer, its group, or in all): retry.
    Busy,
    /// The peer's process could not be pinned and its cgroup read (it exited, or `/proc` is
    /// hidden from the daemon).
    Unidentified,
}

impl Refusal {
    pub fn message(self) -> &'static str {
        match self {
            Refusal::NotAllowed => "not allowed: this socket is for root (the daemon's user) only",
            Refusal::TooLong => "the request is too long",
            Refusal::Truncated => "the request is truncated",
            Refusal::Timeout => "no whole request within the deadline",
            Refusal::Busy => "the daemon is busy; retry",
            Refusal::Unidentified => {
                "the daemon cannot tell which container the connecting process is in (it exited before its request was read, or its /proc/<pid>/cgroup is unreadable): connect from the process that registers"
            }
        }
    }
}

pub trait Service: Send {
    /// Whether `peer` may talk to this socket at all (checked at accept).
    fn admit(&self, peer: &Peer) -> bool;
    /// The group a held connection of `peer` counts in for `max_per_group` (with
    /// `pin_identity`; e.g. its container).
    fn group(&self, peer: &Peer) -> String {
        peer.cgroups.clone().unwrap_or_default()
    }
    /// The answer to one whole request.
    fn handle(&mut self, peer: &Peer, request: &[u8]) -> Reply;
    /// The body sent when a connection is refused (best effort: the peer may be gone).
    fn refusal(&self, why: Refusal) -> Vec<u8>;
    /// Called at every turn of the serving loop (at least every 100 ms), between requests.
    fn tick(&mut self) {}
}

#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub path: PathBuf,
    /// Permission bits of the socket file (0o600: root only; 0o666: any local process).
    pub mode: u32,
    pub max_len: usize,
    /// From accept to a whole request.
    pub deadline: Duration,
    /// From accept to the first byte.
    pub first_byte: Duration,
    /// Connections held (waiting for their request) at once, in all.
    pub max_connections: usize,
    /// ... by one non-root user.
    pub max_per_uid: usize,
    /// ... in one [`Service::group`].
    pub max_per_group: usize,
    /// Read the peer's cgroup at accept with its process pinned; refuse when that fails.
    pub pin_identity: bool,
}

impl ServerConfig {
    pub fn new(path: PathBuf, mode: u32) -> Self {
        ServerConfig {
            path,
            mode,
            max_len: 64 * 1024,
            deadline: Duration::from_secs(1),
            first_byte: Duration::from_millis(200),
            max_connections: 1024,
            max_per_uid: 32,
            max_per_group: 64,
            pin_identity: false,
        }
    }

    /// Limits that fit `nofile` descriptors (the process's soft limit): a quarter of them for
    /// held connections (at most 1024), the rest for state files, listeners and the accept
    /// that sheds load.
    pub fn fit_descriptors(mut self, nofile: u64) -> Self {
        self.max_connections = ((nofile / 4) as usize).clamp(8, 1024);
        self.max_per_group = self.max_per_group.min(self.max_connections / 2).max(1);
        self.max_per_uid = self.max_per_uid.min(self.max_connections / 4).max(1);
        self
    }
}

struct Conn {
    stream: UnixStream,
    peer: Peer,
    group: String,
    buf: Vec<u8>,
    accepted: Instant,
    deadline: Instant,
}

/// How many connections are held, per non-root uid and per group.
#[derive(Default)]
struct Held {
    per_uid: HashMap<u32, usize>,
    per_group: HashMap<String, usize>,
}

impl Held {
    fn add(&mut self, c: &Conn) {
        if c.peer.uid != 0 {
            *self.per_uid.entry(c.peer.uid).or_default() += 1;
        }
        *self.per_group.entry(c.group.clone()).or_default() += 1;
    }

    fn remove(&mut self, c: &Conn) {
        fn dec<K: std::hash::Hash + Eq>(m: &mut HashMap<K, usize>, k: &K) {
            if let Some(n) = m.get_mut(k) {
                *n -= 1;
                if *n == 0 {
                    m.remove(k);
                }
            }
        }
        if c.peer.uid != 0 {
            dec(&mut self.per_uid, &c.peer.uid);
        }
        dec(&mut self.per_group, &c.group);
    }

    fn uid(&self, uid: u32) -> usize {
        if uid == 0 {
            0
        } else {
            self.per_uid.get(&uid).copied().unwrap_or(0)
        }
    }

    fn group(&self, g: &str) -> usize {
        self.per_group.get(g).copied().unwrap_or(0)
    }
}

/// A warning printed at most once per [`Self::EVERY`], with the number of times it was due.
struct Throttled {
    last: Option<Instant>,
    due: u64,
}

impl Throttled {
    const EVERY: Duration = Duration::from_secs(10);

    fn new() -> Self {
        Throttled { last: None, due: 0 }
    }

    /// Counts one occurrence; Some(count since the last line) when a line is due now.
    fn due(&mut self) -> Option<u64> {
        self.due += 1;
        let now = Instant::now();
        if self
            .last
            .is_some_and(|t| now.duration_since(t) < Self::EVERY)
        {
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.due))
    }
}

/// A bound socket, ready to [`Server::serve`].
pub struct Server {
    cfg: ServerConfig,
    listener: UnixListener,
    /// Given up to accept (and close) one connection at the descriptor limit.
    reserve: Option<std::fs::File>,
    held: Held,
    accept_errors: Throttled,
    unidentified: Throttled,
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
        Ok(Server {
            cfg,
            listener,
            reserve: std::fs::File::open("/dev/null").ok(),
            held: Held::default(),
            accept_errors: Throttled::new(),
            unidentified: Throttled::new(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.cfg.path
    }

    /// Serves until `stop` is set (checked at least every 100 ms); removes the socket file.
    pub fn serve(mut self, service: &mut dyn Service, stop: &AtomicBool) {
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
                        self.held.remove(&c);
                        finish(&c.stream, done);
                    }
                }
            }
            if ready[0] {
                self.accept_all(&mut conns, service);
            }
            service.tick();
        }
        let _ = std::fs::remove_file(&self.cfg.path);
    }

    fn accept_all(&mut self, conns: &mut Vec<Conn>, service: &mut dyn Service) {
        loop {
            let stream = match self.listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                    if !self.shed(&e) {
                        return;
                    }
                    continue;
                }
                Err(e) => {
                    if let Some(n) = self.accept_errors.due() {
                        tracing::warn!("{}: accept: {e} ({n} times)", self.cfg.path.display());
                    }
                    return;
                }
            };
            let peer = match getsockopt(&stream, PeerCredentials) {
                Ok(c) => Peer {
                    pid: c.pid() as u32,
                    uid: c.uid(),
                    gid: c.gid(),
                    cgroups: None,
                },
                Err(e) => {
                    tracing::warn!("{}: SO_PEERCRED: {e}", self.cfg.path.display());
                    continue;
                }
            };
            if !service.admit(&peer) {
                self.refuse(&stream, &peer, Refusal::NotAllowed, service);
                continue;
            }
            if stream.set_nonblocking(true).is_err() {
                continue;
            }
            let now = Instant::now();
            let mut c = Conn {
                stream,
                peer,
                group: String::new(),
                buf: Vec::new(),
                accepted: now,
                deadline: now + self.cfg.first_byte,
            };
            // A client usually sends with its connect: read what is there first, so the limits
            // below only ever apply to connections that must be held.
            let partial = self.read_available(&mut c);
            if partial.is_none() && self.held.uid(c.peer.uid) >= self.cfg.max_per_uid {
                self.refuse(&c.stream, &c.peer, Refusal::Busy, service);
                continue;
            }
            if self.cfg.pin_identity {
                match crate::peer::cgroups(&c.stream, c.peer.pid) {
                    Ok(text) => c.peer.cgroups = Some(text),
                    Err(e) => {
                        // One line per 10 s: a process that queues connections and exits
                        // must not be able to fill the log.
                        if let Some(n) = self.unidentified.due() {
                            tracing::info!(
                                pid = c.peer.pid,
                                uid = c.peer.uid,
                                "refused: {e} ({n} such refusal(s) in 10 s)"
                            );
                        }
                        self.refuse(&c.stream, &c.peer, Refusal::Unidentified, service);
                        continue;
                    }
                }
            }
            if let Some(read) = partial {
                let done = self.answer(&mut c, read, service);
                finish(&c.stream, done);
                continue;
            }
            c.group = service.group(&c.peer);
            if conns.len() >= self.cfg.max_connections
                || self.held.group(&c.group) >= self.cfg.max_per_group
            {
                self.refuse(&c.stream, &c.peer, Refusal::Busy, service);
                continue;
            }
            if !c.buf.is_empty() {
                c.deadline = c.accepted + self.cfg.deadline;
            }
            self.held.add(&c);
            conns.push(c);
        }
    }

    /// At the descriptor limit: accepts one connection on the reserved descriptor and closes
    /// it (the peer sees its connection closed: a shim retries). False when even that fails
    /// (the loop backs off instead of spinning on a readable listener).
    fn shed(&mut self, e: &std::io::Error) -> bool {
        if let Some(n) = self.accept_errors.due() {
            tracing::warn!(
                "{}: at the descriptor limit ({e}): {n} connection(s) closed unanswered; raise the daemon's LimitNOFILE",
                self.cfg.path.display()
            );
        }
        let shed = self.reserve.take().is_some() && {
            let ok = self.listener.accept().is_ok();
            self.reserve = std::fs::File::open("/dev/null").ok();
            ok
        };
        if !shed {
            std::thread::sleep(Duration::from_millis(10));
        }
        shed
    }

    fn refuse(&self, stream: &UnixStream, peer: &Peer, why: Refusal, service: &dyn Service) {
        tracing::debug!(?peer, "{}: {}", self.cfg.path.display(), why.message());
        finish(stream, Reply::body(service.refusal(why)));
    }

    /// Reads what is there: None while the request is incomplete (and the deadline not
    /// passed), else what ended the read.
    fn read_available(&self, c: &mut Conn) -> Option<Ended> {
        let mut chunk = [0u8; 4096];
        loop {
            match (&c.stream).read(&mut chunk) {
                Ok(0) => return Some(Ended::Truncated),
                Ok(n) => {
                    if c.buf.is_empty() {
                        c.deadline = c.accepted + self.cfg.deadline;
                    }
                    c.buf.extend_from_slice(&chunk[..n]);
                    match parse_frame(&c.buf, self.cfg.max_len) {
                        Framed::Complete(r) => return Some(Ended::Request(r)),
                        Framed::TooLong(_) => return Some(Ended::TooLong),
                        Framed::Short => continue,
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    return (c.deadline <= Instant::now()).then_some(Ended::Timeout);
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => return Some(Ended::Truncated),
            }
        }
    }

    fn answer(&self, c: &mut Conn, read: Ended, service: &mut dyn Service) -> Reply {
        match read {
            Ended::Request(r) => service.handle(&c.peer, &c.buf[r]),
            Ended::TooLong => Reply::body(service.refusal(Refusal::TooLong)),
            Ended::Timeout => Reply::body(service.refusal(Refusal::Timeout)),
            Ended::Truncated => Reply::body(service.refusal(Refusal::Truncated)),
        }
    }

    /// Reads what is there; `Some(reply)` when the connection is done.
    fn progress(&self, c: &mut Conn, service: &mut dyn Service) -> Option<Reply> {
        let read = self.read_available(c)?;
        Some(self.answer(c, read, service))
    }
}

/// How reading a connection ended.
enum Ended {
    /// A whole request, at this range of the buffer.
    Request(std::ops::Range<usize>),
    TooLong,
    Timeout,
    /// End of stream (or a reset) before a whole frame.
    Truncated,
}

/// Raises this process's soft descriptor limit to its hard limit (systemd's default soft limit
/// is 1024); returns the soft limit now in force.
pub fn raise_nofile() -> u64 {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => hard,
            Err(_) => soft,
        },
        Ok((soft, _)) => soft,
        Err(_) => 1024,
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
        start_with(cfg)
    }

    fn start_with(cfg: ServerConfig) -> (PathBuf, Arc<AtomicBool>, std::thread::JoinHandle<()>) {
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

    #[test]
    fn held_connections_are_limited_per_group_and_a_whole_request_is_still_served() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = ServerConfig::new(dir.path().join("s.sock"), 0o600);
        cfg.max_per_group = 3;
        cfg.first_byte = Duration::from_secs(5);
        cfg.pin_identity = true;
        let (path, stop, h) = start_with(cfg);
        let silent: Vec<UnixStream> = (0..3)
            .map(|_| UnixStream::connect(&path).unwrap())
            .collect();
        // The server takes connections in order: the fourth is over the limit.
        let mut fourth = UnixStream::connect(&path).unwrap();
        let got = libshare_abi::wire::read_frame(&mut fourth, 1024).unwrap();
        assert_eq!(
            got,
            Refusal::Busy.message().as_bytes(),
            "over the group's limit"
        );
        // A client that sends with its connect is not held, so it is served all the same (it
        // may still be accepted before its bytes arrive, and then be told busy: as a shim does,
        // it asks again).
        let served = format!("{}:hi", std::process::id()).into_bytes();
        let asked = (1..=50).find(|_| {
            call(&path, b"hi", Duration::from_secs(2)).is_ok_and(|(body, _)| body == served)
        });
        assert!(asked.is_some(), "never served while the group was full");
        drop(silent);
        stop.store(true, Release);
        h.join().unwrap();
    }

    #[test]
    fn at_the_descriptor_limit_connections_are_shed_without_spinning() {
        use nix::sys::resource::{getrlimit, setrlimit, Resource};
        // It lowers its process's descriptor limit, which would starve the tests that
        // `cargo test` runs beside it in one process: it runs itself again, alone.
        const ALONE: &str = "LIBSHARE_TEST_ALONE";
        if std::env::var_os(ALONE).is_none() {
            let name =
                "server::tests::at_the_descriptor_limit_connections_are_shed_without_spinning";
            let st = std::process::Command::new(std::env::current_exe().unwrap())
                .args([name, "--exact", "--test-threads=1", "--nocapture"])
                .env(ALONE, "1")
                .status()
                .unwrap();
            assert!(st.success(), "the test, run alone, failed: {st}");
            return;
        }
        let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        setrlimit(Resource::RLIMIT_NOFILE, 48, hard).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = ServerConfig::new(dir.path().join("s.sock"), 0o600);
        cfg.first_byte = Duration::from_secs(30);
        cfg.deadline = Duration::from_secs(30);
        let (path, stop, h) = start_with(cfg);
        // Another process holds 200 idle connections: the server runs out of descriptors.
        struct Reaped(std::process::Child);
        impl Drop for Reaped {
            fn drop(&mut self) {
                let _ = self.0.kill();
                let _ = self.0.wait();
            }
        }
        let mut flood = std::process::Command::new("python3")
            .args([
                "-c",
                "import resource,socket,sys,time\n\
                 h=resource.getrlimit(resource.RLIMIT_NOFILE)[1]\n\
                 resource.setrlimit(resource.RLIMIT_NOFILE,(h,h))\n\
                 s=[]\n\
                 for _ in range(200):\n\
                 \x20   c=socket.socket(socket.AF_UNIX); c.connect(sys.argv[1]); s.append(c)\n\
                 print('ready', flush=True)\n\
                 time.sleep(30)",
            ])
            .arg(&path)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .map(Reaped)
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(flood.0.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        assert_eq!(
            line.trim(),
            "ready",
            "every connection was accepted or shed"
        );
        let cpu = || {
            // SAFETY: an all-zero rusage is valid to be overwritten.
            let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
            // SAFETY: `ru` is a live, writable rusage; RUSAGE_SELF is valid.
            unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
            let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
            tv(ru.ru_utime) + tv(ru.ru_stime)
        };
        let (c0, t0) = (cpu(), Instant::now());
        std::thread::sleep(Duration::from_secs(1));
        let share = (cpu() - c0) / t0.elapsed().as_secs_f64();
        assert!(
            share < 0.05,
            "the server spins at the limit: {:.1} % of a core",
            share * 100.0
        );
        drop(flood);
        // Once the flood is gone, the server answers again.
        let answered = (0..100).any(|_| {
            std::thread::sleep(Duration::from_millis(50));
            call(&path, b"hi", Duration::from_secs(1)).is_ok()
        });
        assert!(answered, "the server never recovered");
        stop.store(true, Release);
        h.join().unwrap();
    }
}
