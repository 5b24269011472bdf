//! The process-wide simulator state, created by `cuInit`.

use libshare_abi::SlotTable;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering::*};
use std::sync::{Arc, OnceLock};

use crate::config::SimConfig;
use crate::engine::{Engine, Machine, StreamId};
pub use crate::model::Registry;
use crate::shared::Shared;
use crate::types::*;

pub struct Sim {
    pub cfg: SimConfig,
    /// The machine-wide state (leaked with the `Sim`; the engine holds it too).
    pub shared: &'static Shared,
    pub slot: usize,
    pub generation: u32,
    pub pid: u32,
    pub engine: Engine,
    pub primary: OnceLock<Vec<Arc<Context>>>,
    pub contexts: Registry<Context>,
    pub streams: Registry<Stream>,
    pub events: Registry<Event>,
    pub modules: Registry<crate::model::module::Module>,
    pub functions: Registry<crate::model::module::Function>,
    pub mem: Mutex<crate::model::memory::MemTable>,
    /// Per-process counters (also used by fault injection).
    pub alloc_count: AtomicU64,
    pub launch_count: AtomicU64,
    /// Allocations requested through the API (cuMemAlloc*, managed, async, cuMemCreate), not the
    /// driver's own (module globals).
    pub api_allocs: AtomicU64,
    /// Physical device of each ordinal, from CUDA_VISIBLE_DEVICES (all devices if unset).
    pub visible: Vec<usize>,
}

/// This process's simulator (leaked; a forked child builds its own and ignores the parent's).
static SIM: AtomicPtr<Sim> = AtomicPtr::new(std::ptr::null_mut());
static INIT: Mutex<()> = Mutex::new(());
/// Pid for which initialisation failed (invalid configuration): later cuInit calls fail too.
static FAILED_PID: AtomicU32 = AtomicU32::new(0);

/// The simulator, if `cuInit` succeeded in this process. A forked child sees None until it calls
/// `cuInit` itself: like with the real driver, the parent's contexts and memory are not its own.
pub fn get() -> Option<&'static Sim> {
    // SAFETY: SIM is null or a leaked Sim that is never freed.
    let s = unsafe { SIM.load(Acquire).as_ref()? };
    (s.pid == std::process::id()).then_some(s)
}

/// The identity of the current simulator (contexts remember which one made them).
pub fn current_id() -> usize {
    SIM.load(Acquire) as usize
}

/// `Ok(sim)` or the CUresult a driver call must return when not initialised.
pub fn sim() -> Result<&'static Sim, CUresult> {
    get().ok_or(CUDA_ERROR_NOT_INITIALIZED)
}

/// What the exports do at the two edges of a process's simulator. `cuInit` hands them in, so
/// the simulator never names an export module.
pub struct Edges {
    /// A forked child's first `cuInit`: forget what the parent had in flight.
    pub forked: fn(),
    /// At exit, before the process's slot is released.
    pub exit: fn(&Sim),
}

/// `Edges::exit`, for the `atexit` handler.
static EXIT: OnceLock<fn(&Sim)> = OnceLock::new();

/// cuInit: loads the configuration and maps the shared state (once per process).
pub fn init(edges: &Edges) -> CUresult {
    let _g = INIT.lock();
    if let Some(s) = get() {
        s.ensure_primaries();
        return if s.ndev() == 0 {
            CUDA_ERROR_NO_DEVICE
        } else {
            CUDA_SUCCESS
        };
    }
    let pid = std::process::id();
    if FAILED_PID.load(Acquire) == pid {
        return CUDA_ERROR_INVALID_VALUE;
    }
    match build(pid, edges) {
        Ok(sim) => {
            if !SIM.load(Acquire).is_null() {
                // A forked child: what the parent had in flight is not ours.
                (edges.forked)();
            }
            SIM.store(Box::into_raw(Box::new(sim)), Release);
            let s = get().expect("just stored");
            s.ensure_primaries();
            if s.ndev() == 0 {
                return CUDA_ERROR_NO_DEVICE; // CUDA_VISIBLE_DEVICES hides every device
            }
            CUDA_SUCCESS
        }
        Err(()) => {
            FAILED_PID.store(pid, Release);
            CUDA_ERROR_INVALID_VALUE
        }
    }
}

fn build(pid: u32, edges: &Edges) -> Result<Sim, ()> {
    let cfg = SimConfig::from_env().map_err(|e| eprintln!("{e}"))?;
    crate::log::LEVEL.store(cfg.log_level, Relaxed);
    let mem: Vec<u64> = cfg.devices.iter().map(|d| d.memory).collect();
    let shared = Shared::open(&cfg.state_dir, &mem)
        .map_err(|e| eprintln!("simgpu: {e} (set SIMGPU_STATE_DIR to a writable directory)"))?;
    let (slot, generation) = shared.register(pid).ok_or_else(|| {
        eprintln!(
            "simgpu: more than {} processes use the simulated GPU",
            crate::shared::MAX_PROCS
        )
    })?;
    let ndev = cfg.devices.len().min(shared.ndev);
    let visible = visible_devices(
        std::env::var("CUDA_VISIBLE_DEVICES").ok().as_deref(),
        &cfg.devices[..ndev],
    );
    let shared: &'static Shared = Box::leak(Box::new(shared));
    let machine = Machine {
        shared,
        slot,
        sched: crate::engine::sched_params(&cfg.cost),
        pid,
    };
    let engine = Engine::new(cfg.faults.stall_stream_after, Some(machine));
    static AT_EXIT: std::sync::Once = std::sync::Once::new();
    AT_EXIT.call_once(|| {
        EXIT.get_or_init(|| edges.exit);
        // SAFETY: registering a plain extern "C" function (once: it serves forked children too).
        unsafe {
            libc::atexit(at_exit);
        }
    });
    Ok(Sim {
        primary: OnceLock::new(),
        contexts: Registry::default(),
        streams: Registry::default(),
        events: Registry::default(),
        modules: Registry::default(),
        functions: Registry::default(),
        mem: Mutex::new(Default::default()),
        alloc_count: AtomicU64::new(0),
        launch_count: AtomicU64::new(0),
        api_allocs: AtomicU64::new(0),
        visible,
        cfg,
        shared,
        slot,
        generation,
        pid,
        engine,
    })
}

/// Which physical devices an application sees, in ordinal order: CUDA_VISIBLE_DEVICES lists
/// indices or (prefixes of) UUIDs as NVML prints them; like the real driver, the list stops at the
/// first entry that names no device, and an empty value hides every device.
pub fn visible_devices(var: Option<&str>, devices: &[crate::config::DeviceConfig]) -> Vec<usize> {
    let Some(var) = var else {
        return (0..devices.len()).collect();
    };
    let mut out = Vec::new();
    for item in var.split(',').map(str::trim) {
        let found = match item.parse::<usize>() {
            Ok(i) => (i < devices.len()).then_some(i),
            Err(_) if item.starts_with("GPU-") => {
                let m: Vec<usize> = (0..devices.len())
                    .filter(|&i| crate::config::format_uuid(&devices[i].uuid).starts_with(item))
                    .collect();
                (m.len() == 1).then(|| m[0])
            }
            Err(_) => None,
        };
        match found {
            Some(i) if !out.contains(&i) => out.push(i),
            Some(_) => {}
            None => break,
        }
    }
    out
}

/// Set once this process's slot is released at exit: frees made by exit handlers that run after
/// ours must not be subtracted from the shared state a second time.
pub static EXITED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn at_exit() {
    if EXITED.swap(true, AcqRel) {
        return;
    }
    if let Some(s) = get() {
        if let Some(exit) = EXIT.get() {
            exit(s);
        }
        s.shared.release_slot(s.slot, s.pid);
    }
}

impl Sim {
    /// Number of devices this process sees (after CUDA_VISIBLE_DEVICES).
    pub fn ndev(&self) -> usize {
        self.visible.len()
    }

    /// The ordinal (what the application calls the device) of physical device `physical`.
    pub fn ordinal(&self, physical: usize) -> CUdevice {
        self.visible
            .iter()
            .position(|&p| p == physical)
            .map_or(-1, |o| o as CUdevice)
    }

    /// Validates an ordinal (a `CUdevice`) and returns it as an index into `visible`.
    pub fn check_ordinal(&self, dev: CUdevice) -> Result<usize, CUresult> {
        if dev >= 0 && (dev as usize) < self.ndev() {
            Ok(dev as usize)
        } else {
            Err(CUDA_ERROR_INVALID_DEVICE)
        }
    }

    fn ensure_primaries(&self) {
        self.primary.get_or_init(|| {
            self.visible
                .iter()
                .map(|&d| Context::new(self, d, true))
                .collect()
        });
    }

    /// The primary context of the device with ordinal `ordinal`.
    pub fn primary(&self, ordinal: usize) -> Option<&Arc<Context>> {
        self.primary.get().and_then(|p| p.get(ordinal))
    }

    /// The physical device (index into the configuration and the shared state) of an ordinal.
    pub fn device(&self, dev: CUdevice) -> Result<usize, CUresult> {
        Ok(self.visible[self.check_ordinal(dev)?])
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
    /// Ids of the peer contexts whose memory this context may access (cuCtxEnablePeerAccess).
    pub peers: Mutex<Vec<u64>>,
    pub id: u64,
    /// The simulator that made it (`current_id()`): stale after fork.
    pub sim_id: usize,
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
            peers: Mutex::new(Vec::new()),
            id: NEXT_CTX_ID.fetch_add(1, Relaxed),
            sim_id: sim as *const Sim as usize,
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

#[cfg(test)]
mod tests {
    use super::visible_devices;
    use crate::config::{format_uuid, DeviceConfig};

    #[test]
    fn cuda_visible_devices_selects_and_orders() {
        let mut devs: Vec<DeviceConfig> = (0..4).map(DeviceConfig::a100).collect();
        devs[2].uuid[0] = 0xab; // distinct from the first byte on, so a short prefix is unique
        assert_eq!(visible_devices(None, &devs), vec![0, 1, 2, 3]);
        assert_eq!(visible_devices(Some("2,0"), &devs), vec![2, 0]);
        assert_eq!(visible_devices(Some(""), &devs), Vec::<usize>::new());
        assert_eq!(
            visible_devices(Some("1,7,2"), &devs),
            vec![1],
            "stops at the first invalid entry"
        );
        assert_eq!(visible_devices(Some("3,3,1"), &devs), vec![3, 1]);
        let uuid = format_uuid(&devs[2].uuid);
        assert_eq!(visible_devices(Some(&uuid), &devs), vec![2]);
        assert_eq!(
            visible_devices(Some(&uuid[..8]), &devs),
            vec![2],
            "unique prefix"
        );
        assert_eq!(
            visible_devices(Some("GPU-"), &devs),
            Vec::<usize>::new(),
            "ambiguous prefix"
        );
    }
}
