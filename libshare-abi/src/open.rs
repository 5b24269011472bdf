//! Opening the state file: creating, validating and mapping it (by path, descriptor or sealed
//! memfd), and the mapping's accessors.

use crate::*;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::*};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Mode {
    /// A shared read-write mapping of the file: slots can be claimed.
    Shared,
    /// A private mapping of the file, read-only descriptor (follows the file, writes stay local).
    View,
    /// A copy of the file taken once (never faults, never follows).
    Snapshot,
    /// A process-private state with no file.
    Anonymous,
}

/// A descriptor of a state file that is never closed while this process holds slot locks on
/// its inode (closing it would drop them): it is leaked instead.
pub(crate) struct HeldFile {
    pub(crate) file: std::mem::ManuallyDrop<File>,
    pub(crate) key: (u64, u64),
}

impl HeldFile {
    pub(crate) fn new(file: File, path: &Path) -> Result<HeldFile, StateError> {
        let st = fsafe::fstat(file.as_raw_fd(), path)?;
        Ok(HeldFile {
            file: std::mem::ManuallyDrop::new(file),
            key: (st.st_dev, st.st_ino),
        })
    }
    pub(crate) fn fd(&self) -> libc::c_int {
        self.file.as_raw_fd()
    }
}

impl Drop for HeldFile {
    fn drop(&mut self) {
        if lock::own_count(self.key) == 0 {
            // SAFETY: dropped once, here; never used again.
            unsafe { std::mem::ManuallyDrop::drop(&mut self.file) };
        }
    }
}

/// A mapped container state. Dropping it unmaps it but does not release the slots claimed
/// through it (call [`SlotTable::release_slot`]); while this process owns slots of the file, the
/// descriptor is leaked rather than closed, so their locks stay.
pub struct State {
    pub(crate) base: *mut u8,
    pub(crate) file: Option<HeldFile>,
    pub(crate) path: PathBuf,
    pub(crate) key: (u64, u64),
    pub(crate) mode: Mode,
    /// The header epoch this State last saw.
    pub(crate) epoch: AtomicU64,
    /// The quotas, class and flags this State last saw (restored after a loss).
    pub(crate) quota_seen: [AtomicU64; MAX_DEVICES],
    pub(crate) class_seen: AtomicU32,
    pub(crate) flags_seen: AtomicU32,
    /// Slots claimed through this State.
    pub(crate) mine: Box<[AtomicBool]>,
    /// Process-local copy of the nets of `mine` slots ([slot * MAX_DEVICES + dev]).
    pub(crate) mirror: Box<[AtomicU64]>,
    /// Process-local copy of the compute limits of `mine` slots.
    pub(crate) limit_mirror: Box<[AtomicU32]>,
    /// Process-local copy of the managed bytes of `mine` slots ([slot * MAX_DEVICES + dev]).
    pub(crate) managed_mirror: Box<[AtomicU64]>,
    /// The thread lock of this State's pin lock (`pin.rs`): the pid of its holder.
    pub(crate) pin_holder: AtomicU32,
}

// SAFETY: `base` is a mapping owned by this State (unmapped only in Drop), not tied to the thread
// that created it; the other fields are Send.
unsafe impl Send for State {}
// SAFETY: shared access goes only through `&Header`/`&DeviceState`/`&ProcSlot`, whose fields
// are all atomics (or padding), and through the State's own atomics.
unsafe impl Sync for State {}

pub(crate) fn map(
    len: usize,
    prot_flags: libc::c_int,
    fd: libc::c_int,
    path: &Path,
) -> Result<*mut u8, StateError> {
    // SAFETY: a new mapping (null hint) of `len` bytes: of `fd` (which the callers sized or
    // checked to be at least `len` long; a later truncation is handled by `sigbus`) or anonymous
    // (fd -1 with MAP_ANONYMOUS). The result is checked against MAP_FAILED before use.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            prot_flags,
            fd,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(StateError::io("map", path, std::io::Error::last_os_error()));
    }
    Ok(p as *mut u8)
}

pub(crate) fn new_epoch() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out pointer to a live local.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    let mut x = (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_007)
        .wrapping_add(ts.tv_nsec as u64)
        ^ ((lock::getpid() as u64) << 32)
        ^ COUNTER.fetch_add(0x9e37_79b9_7f4a_7c15, Relaxed);
    // splitmix64
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^= x >> 31;
    x.max(1)
}

/// Reads the first `buf.len()` bytes of `f` without mapping it.
pub(crate) fn pread_all(f: &File, buf: &mut [u8], path: &Path) -> Result<usize, StateError> {
    use std::os::unix::fs::FileExt;
    let mut n = 0;
    while n < buf.len() {
        match f.read_at(&mut buf[n..], n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(StateError::io("read", path, e)),
        }
    }
    Ok(n)
}

/// Validates a header read from a file (plain bytes, before mapping).
pub(crate) fn validate_header_bytes(b: &[u8], path: &Path) -> Result<(), StateError> {
    let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
    let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
    let corrupt = |why| StateError::Corrupt {
        path: path.into(),
        why,
        version: VERSION,
    };
    if u64_at(0) != MAGIC {
        return Err(corrupt("bad magic"));
    }
    if u32_at(8) != VERSION {
        return Err(corrupt("another layout version"));
    }
    let sizes = [
        u32_at(12) as usize == HEADER_SIZE,
        u32_at(16) as usize == std::mem::size_of::<DeviceState>(),
        u32_at(20) as usize == std::mem::size_of::<ProcSlot>(),
        u32_at(24) as usize == MAX_DEVICES,
        u32_at(28) as usize == MAX_PROCS,
        u64_at(32) as usize == FILE_SIZE,
    ];
    if sizes.iter().any(|ok| !ok) {
        return Err(corrupt("layout sizes differ"));
    }
    if Class::from_word(u32_at(40)).is_none() {
        return Err(corrupt("unknown class"));
    }
    if u32_at(44) & !KNOWN_FLAGS != 0 {
        return Err(corrupt("unknown flags"));
    }
    Ok(())
}

impl State {
    pub(crate) fn new(base: *mut u8, file: Option<HeldFile>, path: PathBuf, mode: Mode) -> State {
        let key = file.as_ref().map_or((0, base as u64), |f: &HeldFile| f.key);
        let owner = matches!(mode, Mode::Shared | Mode::Anonymous);
        let n = if owner { MAX_PROCS } else { 0 };
        State {
            base,
            file,
            path,
            key,
            mode,
            epoch: AtomicU64::new(0),
            quota_seen: Default::default(),
            class_seen: AtomicU32::new(0),
            flags_seen: AtomicU32::new(0),
            mine: (0..n).map(|_| AtomicBool::new(false)).collect(),
            mirror: (0..n * MAX_DEVICES).map(|_| AtomicU64::new(0)).collect(),
            limit_mirror: (0..n).map(|_| AtomicU32::new(0)).collect(),
            managed_mirror: (0..n * MAX_DEVICES).map(|_| AtomicU64::new(0)).collect(),
            pin_holder: AtomicU32::new(0),
        }
    }

    /// Maps `<dir>/state.shm`, creating `dir` (0700) and the file (0600) if they do not exist,
    /// after checking every directory on the way and the file itself (see the module doc). A
    /// short file with a valid header is restored to its size (its processes re-publish their
    /// part); a corrupt file, one of another version, of another owner, open to other users or
    /// not a regular file is an error.
    pub fn open_or_create(dir: &Path) -> Result<State, StateError> {
        let dirfd = fsafe::open_dir(dir, true)?;
        let path = dir.join(STATE_FILE);
        Self::relink_if_removed(&dirfd);
        let (f, created) = fsafe::open_file_rw(&dirfd, STATE_FILE, &path, true)?;
        let f = HeldFile::new(f, &path)?;
        if created {
            // The second name (see the module doc); best effort.
            let (from, to) = (c"state.shm", c".state.shm.keep");
            // SAFETY: `dirfd` is an open directory; both names are NUL-terminated.
            unsafe {
                libc::unlinkat(dirfd.as_raw_fd(), to.as_ptr(), 0);
                libc::linkat(
                    dirfd.as_raw_fd(),
                    from.as_ptr(),
                    dirfd.as_raw_fd(),
                    to.as_ptr(),
                    0,
                );
            }
        }
        // SAFETY: `f` is open; flock only takes an advisory lock on it (serialising
        // initialisation between processes; it does not interact with POSIX record locks).
        unsafe { libc::flock(f.fd(), libc::LOCK_EX) };
        let r = Self::init_locked(f, path);
        if let Ok(st) = &r {
            let fd = st.file.as_ref().expect("a file state").fd();
            // SAFETY: `fd` is held open by `st`; this releases the flock taken above (on an
            // error the descriptor was closed with the HeldFile, releasing it).
            unsafe { libc::flock(fd, libc::LOCK_UN) };
        }
        r
    }

    /// If `state.shm` is missing but its second name exists and is a valid file of ours, gives
    /// it its name back (so live processes and new ones keep one quota).
    pub(crate) fn relink_if_removed(dirfd: &OwnedFd) {
        let (name, keep) = (c"state.shm", c".state.shm.keep");
        // SAFETY: an all-zero stat is valid; `dirfd` is an open directory, names NUL-terminated.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above; `st` is a live local.
        let missing = unsafe {
            libc::fstatat(
                dirfd.as_raw_fd(),
                name.as_ptr(),
                &mut st,
                libc::AT_SYMLINK_NOFOLLOW,
            )
        } != 0
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOENT);
        if !missing {
            return;
        }
        // SAFETY: as above.
        let r = unsafe {
            libc::fstatat(
                dirfd.as_raw_fd(),
                keep.as_ptr(),
                &mut st,
                libc::AT_SYMLINK_NOFOLLOW,
            )
        };
        if r == 0 && fsafe::check_file(&st, Path::new(KEEP_FILE)).is_ok() {
            // SAFETY: as above; linkat does not follow (flags 0) and fails if the name exists.
            unsafe {
                libc::linkat(
                    dirfd.as_raw_fd(),
                    keep.as_ptr(),
                    dirfd.as_raw_fd(),
                    name.as_ptr(),
                    0,
                )
            };
        }
    }

    pub(crate) fn init_locked(f: HeldFile, path: PathBuf) -> Result<State, StateError> {
        let len = fsafe::fstat(f.fd(), &path)?.st_size as u64;
        let fresh = len == 0;
        let mut restored = false;
        if fresh {
            f.file
                .set_len(FILE_SIZE as u64)
                .map_err(|e| StateError::io("size", &path, e))?;
        } else {
            let mut hdr = [0u8; HEADER_SIZE];
            let n = pread_all(&f.file, &mut hdr, &path)?;
            if n < HEADER_SIZE {
                return Err(StateError::Truncated {
                    path,
                    len,
                    expected: FILE_SIZE as u64,
                });
            }
            validate_header_bytes(&hdr, &path)?;
            if len > FILE_SIZE as u64 {
                return Err(StateError::Corrupt {
                    path,
                    why: "longer than its layout",
                    version: VERSION,
                });
            }
            if len < FILE_SIZE as u64 {
                f.file
                    .set_len(FILE_SIZE as u64)
                    .map_err(|e| StateError::io("restore the size of", &path, e))?;
                restored = true;
            }
        }
        let base = map(FILE_SIZE, libc::MAP_SHARED, f.fd(), &path)?;
        let fd = f.fd();
        let st = State::new(base, Some(f), path, Mode::Shared);
        sigbus::register(base as usize, FILE_SIZE, fd);
        let h = st.header();
        if fresh {
            st.write_layout();
            st.publish_epoch(new_epoch());
            h.magic.store(MAGIC, Release);
        } else if restored || st.trailer().epoch.load(Acquire) != h.epoch.load(Acquire) {
            st.publish_epoch(new_epoch()); // tells live processes to re-publish
        } else {
            st.epoch.store(h.epoch.load(Acquire), Release);
        }
        st.remember_config();
        Ok(st)
    }

    pub(crate) fn write_layout(&self) {
        let h = self.header();
        h.version.store(VERSION, Release);
        h.header_size.store(HEADER_SIZE as u32, Release);
        h.device_size
            .store(std::mem::size_of::<DeviceState>() as u32, Release);
        h.proc_size
            .store(std::mem::size_of::<ProcSlot>() as u32, Release);
        h.max_devices.store(MAX_DEVICES as u32, Release);
        h.max_procs.store(MAX_PROCS as u32, Release);
        h.file_size.store(FILE_SIZE as u64, Release);
    }

    pub(crate) fn layout_ok(&self) -> bool {
        let h = self.header();
        h.magic.load(Acquire) == MAGIC
            && h.version.load(Acquire) == VERSION
            && h.header_size.load(Acquire) as usize == HEADER_SIZE
            && h.device_size.load(Acquire) as usize == std::mem::size_of::<DeviceState>()
            && h.proc_size.load(Acquire) as usize == std::mem::size_of::<ProcSlot>()
            && h.max_devices.load(Acquire) as usize == MAX_DEVICES
            && h.max_procs.load(Acquire) as usize == MAX_PROCS
            && h.file_size.load(Acquire) as usize == FILE_SIZE
    }

    /// Records the quotas, class and flags now in the file (restored after a loss).
    pub(crate) fn remember_config(&self) {
        for d in 0..MAX_DEVICES {
            self.quota_seen[d].store(self.device(d).quota.load(Acquire), Release);
        }
        let h = self.header();
        self.class_seen.store(h.class.load(Acquire), Release);
        self.flags_seen.store(h.flags.load(Acquire), Release);
    }

    /// A private, process-local state (no file): quotas then apply to this process alone.
    /// Deprecated: a container's quota must not silently become per-process (the shim should
    /// refuse instead); kept until the shim stops using it.
    pub fn anonymous() -> Result<State, StateError> {
        let base = map(
            FILE_SIZE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            Path::new("(anonymous state)"),
        )?;
        let st = State::new(base, None, PathBuf::new(), Mode::Anonymous);
        st.write_layout();
        st.publish_epoch(1);
        st.header().magic.store(MAGIC, Release);
        Ok(st)
    }

    /// A state in a new memfd sealed against shrinking and growing (for the daemon: it hands
    /// the descriptor to the container's processes, who map it with [`State::from_fd`]; nobody
    /// can truncate it). Returns the State and a descriptor to pass on.
    pub fn create_sealed_memfd() -> Result<(State, OwnedFd), StateError> {
        let what = Path::new("(memfd)");
        // SAFETY: the raw memfd_create system call (the glibc wrapper is newer than the shim's
        // 2.17 baseline) with a NUL-terminated name and flags; the result is checked.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_memfd_create,
                c"libshare-state".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        } as libc::c_int;
        if fd < 0 {
            return Err(StateError::io(
                "create",
                what,
                std::io::Error::last_os_error(),
            ));
        }
        // SAFETY: a fresh descriptor owned by nobody else.
        let f = unsafe { File::from_raw_fd(fd) };
        f.set_len(FILE_SIZE as u64)
            .map_err(|e| StateError::io("size", what, e))?;
        // SAFETY: fcntl on our open descriptor with an int argument.
        let r = unsafe {
            libc::fcntl(
                f.as_raw_fd(),
                libc::F_ADD_SEALS,
                libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL,
            )
        };
        if r != 0 {
            return Err(StateError::io(
                "seal",
                what,
                std::io::Error::last_os_error(),
            ));
        }
        let dup = f
            .try_clone()
            .map_err(|e| StateError::io("duplicate", what, e))?;
        let st = Self::from_fd(f)?;
        Ok((st, OwnedFd::from(dup)))
    }

    /// Maps a state handed over as a descriptor (a daemon's sealed memfd, or an initialised
    /// file): it must be at least FILE_SIZE long; a zero header is initialised.
    /// [`State::from_fd`] for a file the daemon passed at registration, which must be what the
    /// daemon makes (`fsafe`): a regular file owned by `daemon_uid` (the registration socket's
    /// peer, as the kernel gave it), mode 0600; a fake daemon cannot hand over a file of the
    /// real one's.
    pub fn from_daemon(f: File, daemon_uid: u32) -> Result<State, StateError> {
        let st = fsafe::fstat(
            std::os::fd::AsRawFd::as_raw_fd(&f),
            Path::new(DESCRIPTOR_PATH),
        )?;
        let why = if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            Some("is not a regular file".to_string())
        } else if st.st_uid != daemon_uid {
            Some(format!(
                "belongs to uid {}, not to the daemon's uid {daemon_uid}",
                st.st_uid
            ))
        } else if st.st_mode & 0o7777 != 0o600 {
            Some(format!("has mode {:o}, not 600", st.st_mode & 0o7777))
        } else {
            None
        };
        match why {
            Some(why) => Err(StateError::NotTheDaemons { why }),
            None => State::from_fd(f),
        }
    }

    pub fn from_fd(f: File) -> Result<State, StateError> {
        let path = PathBuf::from(DESCRIPTOR_PATH);
        let f = HeldFile::new(f, &path)?;
        let len = fsafe::fstat(f.fd(), &path)?.st_size as u64;
        if len != FILE_SIZE as u64 {
            return Err(StateError::Truncated {
                path,
                len,
                expected: FILE_SIZE as u64,
            });
        }
        let base = map(FILE_SIZE, libc::MAP_SHARED, f.fd(), &path)?;
        let fd = f.fd();
        let st = State::new(base, Some(f), path, Mode::Shared);
        sigbus::register(base as usize, FILE_SIZE, fd);
        let h = st.header();
        if h.magic.load(Acquire) == 0 {
            st.write_layout();
            st.publish_epoch(new_epoch());
            h.magic.store(MAGIC, Release);
        } else if !st.layout_ok() {
            return Err(StateError::Corrupt {
                path: st.path.clone(),
                why: "bad header",
                version: VERSION,
            });
        }
        st.epoch.store(h.epoch.load(Acquire), Release);
        st.remember_config();
        Ok(st)
    }

    /// Maps an existing state file read-write (the daemon, tests); errors if it is not valid.
    /// Same checks as [`State::open_or_create`], nothing created or repaired.
    pub fn open_existing(path: &Path) -> Result<State, StateError> {
        let dir = path.parent().unwrap_or(Path::new("."));
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| StateError::io("open", path, std::io::ErrorKind::InvalidInput.into()))?;
        let dirfd = fsafe::open_dir(dir, false)?;
        let (f, _) = fsafe::open_file_rw(&dirfd, name, path, false)?;
        let f = HeldFile::new(f, path)?;
        let len = fsafe::fstat(f.fd(), path)?.st_size as u64;
        if len != FILE_SIZE as u64 {
            return Err(StateError::Truncated {
                path: path.into(),
                len,
                expected: FILE_SIZE as u64,
            });
        }
        let mut hdr = [0u8; HEADER_SIZE];
        pread_all(&f.file, &mut hdr, path)?;
        validate_header_bytes(&hdr, path)?;
        let base = map(FILE_SIZE, libc::MAP_SHARED, f.fd(), path)?;
        let fd = f.fd();
        let st = State::new(base, Some(f), path.into(), Mode::Shared);
        sigbus::register(base as usize, FILE_SIZE, fd);
        st.epoch.store(st.header().epoch.load(Acquire), Release);
        st.remember_config();
        Ok(st)
    }

    /// A view of an existing state file that needs only read permission (a monitoring agent,
    /// an NVML-only process). The mapping is private: it follows the file as the shim and daemon
    /// update it, and anything written through it stays in this process. Never follows a
    /// symlink, never blocks (FIFO), must be a regular file; the owner is not checked (a view
    /// never writes). A truncation while mapped shows zeros instead of raising SIGBUS.
    pub fn open_view(path: &Path) -> Result<State, StateError> {
        let f = fsafe::open_file_ro(path)?;
        let f = HeldFile::new(f, path)?;
        Self::check_len_and_header(&f, path)?;
        let base = map(FILE_SIZE, libc::MAP_PRIVATE, f.fd(), path)?;
        let st = State::new(base, Some(f), path.into(), Mode::View);
        sigbus::register(base as usize, FILE_SIZE, -1);
        Ok(st)
    }

    /// A copy of a state file taken now (`sharectl status`): like [`State::open_view`] but
    /// read once into private memory, so nothing done to the file later can fault. Liveness of
    /// slots still asks the file's locks.
    pub fn snapshot(path: &Path) -> Result<State, StateError> {
        let f = fsafe::open_file_ro(path)?;
        let f = HeldFile::new(f, path)?;
        Self::check_len_and_header(&f, path)?;
        let base = map(FILE_SIZE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, path)?;
        // SAFETY: `base` is a fresh private FILE_SIZE mapping nobody else references yet.
        let buf = unsafe { std::slice::from_raw_parts_mut(base, FILE_SIZE) };
        let n = pread_all(&f.file, buf, path);
        let st = State::new(base, Some(f), path.into(), Mode::Snapshot);
        let n = n?;
        if n < FILE_SIZE {
            return Err(StateError::Truncated {
                path: path.into(),
                len: n as u64,
                expected: FILE_SIZE as u64,
            });
        }
        if !st.layout_ok() {
            return Err(StateError::Corrupt {
                path: path.into(),
                why: "bad header",
                version: VERSION,
            });
        }
        Ok(st)
    }

    pub(crate) fn check_len_and_header(f: &HeldFile, path: &Path) -> Result<(), StateError> {
        let len = fsafe::fstat(f.fd(), path)?.st_size as u64;
        let mut hdr = [0u8; HEADER_SIZE];
        let n = pread_all(&f.file, &mut hdr, path)?;
        if n < HEADER_SIZE || len < FILE_SIZE as u64 {
            return Err(StateError::Truncated {
                path: path.into(),
                len,
                expected: FILE_SIZE as u64,
            });
        }
        validate_header_bytes(&hdr, path)
    }

    #[inline]
    pub fn header(&self) -> &Header {
        // SAFETY: `base` is a live, page-aligned FILE_SIZE mapping owned by `self` (unmapped only
        // in Drop, so it outlives the borrow) and HEADER_SIZE <= FILE_SIZE; every field is an
        // atomic.
        unsafe { &*(self.base as *const Header) }
    }

    #[inline]
    pub fn device(&self, i: usize) -> &DeviceState {
        assert!(i < MAX_DEVICES);
        // SAFETY: `i < MAX_DEVICES` (asserted), so the element lies inside the FILE_SIZE mapping
        // owned by `self`; DEVICES_OFFSET is a multiple of 64 from a page-aligned base, so it is
        // aligned; all fields are atomics (any bit pattern is valid, shared mutation is fine).
        unsafe { &*(self.base.add(DEVICES_OFFSET) as *const DeviceState).add(i) }
    }

    #[inline]
    pub fn slot(&self, i: usize) -> &ProcSlot {
        assert!(i < MAX_PROCS);
        // SAFETY: as for `device()`: `i < MAX_PROCS` (asserted) keeps it inside the mapping,
        // PROCS_OFFSET is 64-aligned, and every field is an atomic or padding.
        unsafe { &*(self.base.add(PROCS_OFFSET) as *const ProcSlot).add(i) }
    }

    pub fn trailer(&self) -> &Trailer {
        // SAFETY: TRAILER_OFFSET + size_of::<Trailer>() == FILE_SIZE, inside the mapping owned
        // by `self`; 64-aligned; every field is an atomic.
        unsafe { &*(self.base.add(TRAILER_OFFSET) as *const Trailer) }
    }

    /// Publishes a new epoch in the header and the trailer.
    pub(crate) fn publish_epoch(&self, e: u64) {
        self.trailer().epoch.store(e, Release);
        self.header().epoch.store(e, Release);
        self.epoch.store(e, Release);
    }

    /// The path this State was opened from (empty for an anonymous one).
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for State {
    fn drop(&mut self) {
        sigbus::unregister(self.base as usize);
        // SAFETY: `base` is the FILE_SIZE mapping this State created and owns; `&mut self` means
        // no reference borrowed from it (header/device/slot) is still alive.
        unsafe { libc::munmap(self.base as *mut _, FILE_SIZE) };
        // `file` (a HeldFile) is closed after, unless this process holds slots on it.
    }
}
