//! The process-wide simulator state, created by `cuInit`.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::*};
use std::sync::{Arc, OnceLock};

use crate::config::SimConfig;
use crate::engine::{Engine, StreamId};
use crate::shared::Shared;
use crate::types::*;

pub struct Sim {
    pub cfg: SimConfig,
    pub shared: Shared,
    pub slot: usize,
    pub generation: u32,
    pub pid: u32,
    pub engine: Engine,
    pub primary: Vec<Arc<Context>>,
    pub contexts: Registry<Context>,
    pub streams: Registry<Stream>,
    pub events: Registry<Event>,
    pub modules: Registry<crate::driver::module::Module>,
    pub functions: Registry<crate::driver::module::Function>,
    pub mem: Mutex<crate::driver::memory::MemTable>,
    /// Per-process counters (also used by fault injection).
    pub alloc_count: AtomicU64,
    pub launch_count: AtomicU64,
}

static SIM: OnceLock<Result<Sim, String>> = OnceLock::new();

/// The simulator, if `cuInit` succeeded in this process (a forked child must initialise anew,
/// and like with the real driver it cannot: CUDA state does not survive fork).
pub fn get() -> Option<&'static Sim> {
    match SIM.get() {
        Some(Ok(s)) if s.pid == std::process::id() => Some(s),
        _ => None,
    }
}

/// `Ok(sim)` or the CUresult a driver call must return when not initialised.
pub fn sim() -> Result<&'static Sim, CUresult> {
    get().ok_or(CUDA_ERROR_NOT_INITIALIZED)
}

/// cuInit: loads the configuration and maps the shared state (once per process).
pub fn init() -> CUresult {
    let r = SIM.get_or_init(|| {
        let cfg = match SimConfig::from_env() {
            Ok(c) => c,
            Err(e) => {
                eprintln!("{e}");
                return Err(e.0);
            }
        };
        crate::log::LEVEL.store(cfg.log_level, Relaxed);
        let mem: Vec<u64> = cfg.devices.iter().map(|d| d.memory).collect();
        let shared = match Shared::open(&cfg.state_dir, &mem) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("simgpu: {e} (set SIMGPU_STATE_DIR to a writable directory)");
                return Err(e);
            }
        };
        let pid = std::process::id();
        let Some((slot, generation)) = shared.register(pid) else {
            eprintln!(
                "simgpu: more than {} processes use the simulated GPU",
                crate::shared::MAX_PROCS
            );
            return Err("no process slot".into());
        };
        let engine = Engine::new(cfg.faults.stall_stream_after);
        let ndev = cfg.devices.len().min(shared.ndev);
        let sim = Sim {
            primary: Vec::new(),
            contexts: Registry::default(),
            streams: Registry::default(),
            events: Registry::default(),
            modules: Registry::default(),
            functions: Registry::default(),
            mem: Mutex::new(Default::default()),
            alloc_count: AtomicU64::new(0),
            launch_count: AtomicU64::new(0),
            cfg,
            shared,
            slot,
            generation,
            pid,
            engine,
        };
        let _ = ndev;
        // SAFETY: registering a plain extern "C" function.
        unsafe { libc::atexit(at_exit) };
        Ok(sim)
    });
    match r {
        Ok(s) if s.pid == std::process::id() => {
            s.ensure_primaries();
            CUDA_SUCCESS
        }
        Ok(_) => CUDA_ERROR_NOT_INITIALIZED,
        Err(_) => CUDA_ERROR_INVALID_VALUE,
    }
}

extern "C" fn at_exit() {
    if let Some(s) = get() {
        crate::driver::stats::write_stats_file(s);
        s.shared.release_slot(s.slot, s.pid);
    }
}

impl Sim {
    pub fn ndev(&self) -> usize {
        self.cfg.devices.len().min(self.shared.ndev)
    }

    fn ensure_primaries(&self) {
        PRIMARY.get_or_init(|| {
            (0..self.ndev())
                .map(|d| Context::new(self, d, true))
                .collect()
        });
    }

    pub fn primary(&self, dev: usize) -> Option<&Arc<Context>> {
        PRIMARY.get().and_then(|p| p.get(dev))
    }

    pub fn device(&self, dev: CUdevice) -> Result<usize, CUresult> {
        if dev >= 0 && (dev as usize) < self.ndev() {
            Ok(dev as usize)
        } else {
            Err(CUDA_ERROR_INVALID_DEVICE)
        }
    }
}

static PRIMARY: OnceLock<Vec<Arc<Context>>> = OnceLock::new();

/// Live objects by handle value, so a stale or made-up handle is an error, not a crash.
pub struct Registry<T> {
    map: Mutex<HashMap<usize, Arc<T>>>,
}

impl<T> Default for Registry<T> {
    fn default() -> Self {
        Registry {
            map: Mutex::new(HashMap::new()),
        }
    }
}

impl<T> Registry<T> {
    /// Registers `obj`; its handle is its address.
    pub fn insert(&self, obj: Arc<T>) -> usize {
        let h = Arc::as_ptr(&obj) as usize;
        self.map.lock().insert(h, obj);
        h
    }
    pub fn get(&self, h: usize) -> Option<Arc<T>> {
        self.map.lock().get(&h).cloned()
    }
    pub fn remove(&self, h: usize) -> Option<Arc<T>> {
        self.map.lock().remove(&h)
    }
    pub fn values(&self) -> Vec<Arc<T>> {
        self.map.lock().values().cloned().collect()
    }
}

/// A context (primary or created).
pub struct Context {
    pub device: usize,
    pub primary: bool,
    pub flags: AtomicU32,
    /// Primary contexts: retain count.
    pub refs: AtomicU32,
    pub null_stream: StreamId,
    /// Streams of this context (ids) with their flags, for legacy-stream ordering and ctx sync.
    pub streams: Mutex<Vec<(StreamId, u32)>>,
    /// CONTEXT_LOCAL_STORAGE export table: key -> (value, destructor).
    pub local_storage: Mutex<HashMap<usize, (usize, usize)>>,
    pub limits: Mutex<HashMap<u32, usize>>,
    pub id: u64,
}

static NEXT_CTX_ID: AtomicU64 = AtomicU64::new(1);

impl Context {
    pub fn new(sim: &Sim, device: usize, primary: bool) -> Arc<Context> {
        let null_stream = sim.engine.create_stream();
        let ctx = Arc::new(Context {
            device,
            primary,
            flags: AtomicU32::new(0),
            refs: AtomicU32::new(0),
            null_stream,
            streams: Mutex::new(Vec::new()),
            local_storage: Mutex::new(HashMap::new()),
            limits: Mutex::new(HashMap::new()),
            id: NEXT_CTX_ID.fetch_add(1, Relaxed),
        });
        sim.contexts.insert(ctx.clone());
        ctx
    }

    pub fn handle(self: &Arc<Self>) -> CUcontext {
        Arc::as_ptr(self) as CUcontext
    }

    /// Every stream of the context, the legacy one included.
    pub fn all_streams(&self) -> Vec<StreamId> {
        let mut v: Vec<StreamId> = self.streams.lock().iter().map(|s| s.0).collect();
        v.push(self.null_stream);
        v
    }
}

/// A stream handle object.
pub struct Stream {
    pub id: StreamId,
    pub ctx: Arc<Context>,
    pub flags: u32,
    pub priority: i32,
}

/// An event handle object.
pub struct Event {
    pub flags: u32,
    pub state: Arc<crate::engine::EventState>,
}
