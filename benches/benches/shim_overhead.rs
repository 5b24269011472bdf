//! M1/M2 (design §7): what `libshare.so` adds to `cuLaunchKernel` and to `cuMemAlloc_v2` +
//! `cuMemFree_v2`, against direct calls to a driver that answers instantly
//! (`benches/instant-driver`, `libinstantcuda.so`).
//!
//! In one process: the instant driver is `dlopen`ed by path and its functions are called through
//! the pointers `dlsym` returns (the baseline, `*/direct`). The shipped cdylib `libshare.so` is
//! `dlopen`ed too, configured to use that same driver (`LIBSHARE_REAL_LIBCUDA`) with a 64 GiB
//! quota in a fresh `LIBSHARE_STATE_DIR`, initialised through its `cuInit`, and its hooks are
//! called through the pointers its `cuGetProcAddress_v2` hands out — how every CUDA ≥ 11.3 runtime
//! reaches the driver under `LD_PRELOAD` (`*/shim`). Loaded this way rather than preloaded, the
//! shim's `dlsym` override does not apply; the benchmarked paths do not go through it.
//!
//! Before timing, the setup checks that the shim really is in the path: it reports the quota as
//! the device's memory and refuses an allocation over it, which the instant driver would accept.
//! After timing (with `--bench`), it prints one JSON line with the medians and what the shim adds,
//! against the targets (M1 ≤ 20 ns, M2 ≤ 200 ns).
//!
//! `cargo bench -p libshare-benches --bench shim_overhead` (builds `libshare.so` and the instant
//! driver first, unless `SHARE_TESTS_SKIP_BUILD=1`).

use std::ffi::{c_char, c_int, c_uint, c_void, CString};
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use criterion::Criterion;
use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};

type CUresult = u32;
type Launch = unsafe extern "C" fn(
    *mut c_void,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    *mut c_void,
    *mut *mut c_void,
    *mut *mut c_void,
) -> CUresult;
type Alloc = unsafe extern "C" fn(*mut u64, usize) -> CUresult;
type Free = unsafe extern "C" fn(u64) -> CUresult;
type Init = unsafe extern "C" fn(c_uint) -> CUresult;
type SetCurrent = unsafe extern "C" fn(*mut c_void) -> CUresult;
type GetInfo = unsafe extern "C" fn(*mut usize, *mut usize) -> CUresult;
type GetProcV2 =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> CUresult;

const GIB: usize = 1 << 30;
/// The quota the shim enforces in this benchmark (the instant device has 80 GiB).
const QUOTA: usize = 64 * GIB;
/// The shim's container in its state directory.
const CONTAINER: &str = "shim-overhead";
/// Size of each allocation timed (any size costs the same to the instant driver and the shim).
const ALLOC_SIZE: usize = 1 << 20;

/// The functions timed, resolved from one library.
struct Api {
    launch: Launch,
    alloc: Alloc,
    free: Free,
}

/// Builds `libshare.so` and the instant driver (release), unless `SHARE_TESTS_SKIP_BUILD=1`, and
/// returns their paths.
fn artifacts() -> (PathBuf, PathBuf) {
    if std::env::var("SHARE_TESTS_SKIP_BUILD").as_deref() != Ok("1") {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let out = Command::new(cargo)
            .current_dir(libshare_tests::workspace_root())
            .args(["build", "--release", "--quiet", "-p", "libshare"])
            .args(["-p", "instant-driver"])
            .stdin(Stdio::null())
            .output()
            .expect("cannot run cargo");
        assert!(
            out.status.success(),
            "cargo build --release -p libshare -p instant-driver failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let release = libshare_tests::target_dir().join("release");
    let (shim, driver) = (
        release.join("libshare.so"),
        release.join("libinstantcuda.so"),
    );
    for p in [&shim, &driver] {
        assert!(p.exists(), "{} is missing", p.display());
    }
    (shim, driver)
}

fn open(path: &Path) -> Library {
    // SAFETY: both libraries are ours; their initialisers do nothing.
    unsafe { Library::open(Some(path), RTLD_NOW | RTLD_LOCAL) }
        .unwrap_or_else(|e| panic!("dlopen {}: {e}", path.display()))
}

/// `dlsym(lib, name)` as a function pointer of type `T`.
fn sym<T: Copy>(lib: &Library, name: &str) -> T {
    // SAFETY: the caller names a driver function with prototype `T`.
    let f = unsafe { lib.get::<T>(name.as_bytes()) };
    *f.unwrap_or_else(|e| panic!("dlsym {name}: {e}"))
}

/// What a CUDA 12 runtime gets from `cuGetProcAddress_v2(name, 12000, default stream)`.
fn proc_address(get: GetProcV2, name: &str) -> *mut c_void {
    let c = CString::new(name).unwrap();
    let (mut p, mut status) = (std::ptr::null_mut(), -1);
    // SAFETY: valid C string and out-pointers.
    let r = unsafe { get(c.as_ptr(), &mut p, 12000, 0, &mut status) };
    assert!(
        r == 0 && status == 0 && !p.is_null(),
        "cuGetProcAddress_v2({name}) = {r}"
    );
    p
}

struct Setup {
    direct: Api,
    shim: Api,
    /// The shim's state directory (removed at the end).
    state: tempfile::TempDir,
    _libs: (Library, Library),
}

fn setup() -> Setup {
    let (shim_path, driver_path) = artifacts();
    let state = tempfile::tempdir().expect("tempdir");
    // Read by the shim at its first call (no other thread runs yet).
    std::env::set_var("LIBSHARE_REAL_LIBCUDA", &driver_path);
    std::env::set_var("LIBSHARE_STATE_DIR", state.path());
    std::env::set_var("LIBSHARE_MEMORY_LIMIT", "64GiB");
    std::env::set_var("LIBSHARE_CONTAINER", CONTAINER);
    std::env::remove_var("LIBSHARE_CONTAINER_DIR");
    std::env::remove_var("LIBSHARE_CLASS");
    std::env::remove_var("LIBSHARE_LOG");

    let driver = open(&driver_path);
    let direct = Api {
        launch: sym(&driver, "cuLaunchKernel"),
        alloc: sym(&driver, "cuMemAlloc_v2"),
        free: sym(&driver, "cuMemFree_v2"),
    };

    let shim = open(&shim_path);
    // SAFETY: the shim's exports have the driver's prototypes; the out-pointers are valid.
    unsafe {
        assert_eq!(
            sym::<Init>(&shim, "cuInit")(0),
            0,
            "cuInit through the shim"
        );
        let ctx = 0x1000 as *mut c_void; // the instant driver takes any context
        assert_eq!(sym::<SetCurrent>(&shim, "cuCtxSetCurrent")(ctx), 0);
    }
    let get: GetProcV2 = sym(&shim, "cuGetProcAddress_v2");
    let resolved = |name: &str, export: &str| {
        let p = proc_address(get, name);
        let exported: *mut c_void = sym(&shim, export);
        assert_eq!(
            p, exported,
            "cuGetProcAddress_v2({name}) is not the shim's hook"
        );
        p
    };
    // SAFETY: the shim returned its hooks for these names; they have these prototypes.
    let shim_api = unsafe {
        Api {
            launch: std::mem::transmute::<*mut c_void, Launch>(resolved(
                "cuLaunchKernel",
                "cuLaunchKernel",
            )),
            alloc: std::mem::transmute::<*mut c_void, Alloc>(resolved(
                "cuMemAlloc",
                "cuMemAlloc_v2",
            )),
            free: std::mem::transmute::<*mut c_void, Free>(resolved("cuMemFree", "cuMemFree_v2")),
        }
    };

    // The shim is really in the path, with the quota: it reports 64 GiB of 80 and refuses 65 GiB.
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: valid out-pointers; hooks with the driver's prototypes.
    unsafe {
        assert_eq!(
            sym::<GetInfo>(&shim, "cuMemGetInfo_v2")(&mut free, &mut total),
            0
        );
        assert_eq!(
            (free, total),
            (QUOTA, QUOTA),
            "the shim's quota is not in force"
        );
        let mut p = 0u64;
        assert_eq!((direct.alloc)(&mut p, QUOTA + GIB), 0);
        assert_eq!((direct.free)(p), 0);
        assert_eq!(
            (shim_api.alloc)(&mut p, QUOTA + GIB),
            2,
            "the shim let an allocation over its quota through"
        );
    }
    Setup {
        direct,
        shim: shim_api,
        state,
        _libs: (driver, shim),
    }
}

/// One `cuLaunchKernel` as a runtime issues it (1 block of 1 thread on the default stream).
#[inline(always)]
fn launch(f: Launch) -> CUresult {
    // SAFETY: the instant driver ignores its arguments; the shim passes them on.
    unsafe {
        f(
            black_box(0x2000 as *mut c_void),
            black_box(1),
            1,
            1,
            black_box(1),
            1,
            1,
            0,
            black_box(std::ptr::null_mut()),
            black_box(std::ptr::null_mut()),
            std::ptr::null_mut(),
        )
    }
}

/// One `cuMemAlloc_v2` followed by the `cuMemFree_v2` of the same pointer.
#[inline(always)]
fn alloc_free(api: &Api) -> CUresult {
    let mut p = 0u64;
    // SAFETY: valid out-pointer; the pointer freed is the one just allocated.
    unsafe {
        let a = (api.alloc)(&mut p, black_box(ALLOC_SIZE));
        a | (api.free)(black_box(p))
    }
}

fn bench(c: &mut Criterion, s: &Setup) {
    let mut g = c.benchmark_group("launch");
    g.bench_function("direct", |b| b.iter(|| launch(s.direct.launch)));
    g.bench_function("shim", |b| b.iter(|| launch(s.shim.launch)));
    g.finish();

    let mut g = c.benchmark_group("alloc_free");
    g.bench_function("direct", |b| b.iter(|| alloc_free(&s.direct)));
    g.bench_function("shim", |b| b.iter(|| alloc_free(&s.shim)));
    g.finish();

    check_accounting(s);
}

/// The timed calls did what they do in a job: the shim counted every launch and allocation in its
/// shared state, and every free returned its charge (a whole-quota allocation fits again).
fn check_accounting(s: &Setup) {
    let path = s.state.path().join("containers").join(CONTAINER);
    let state = libshare_abi::State::open_existing(&path.join(libshare_abi::STATE_FILE))
        .unwrap_or_else(|e| panic!("the shim's state: {e}"));
    // The shim in this process holds its slot's lock, which this process cannot see (F_GETLK
    // never reports one's own locks): find the slot by pid. And never close this descriptor of
    // the file while the shim holds the lock (closing any descriptor drops it): leaked below.
    let pid = std::process::id();
    let slot = (0..libshare_abi::MAX_PROCS)
        .find(|&i| state.slot(i).pid.load(std::sync::atomic::Ordering::Acquire) == pid)
        .expect("this process is registered with the shim");
    let state: &'static libshare_abi::State = Box::leak(Box::new(state));
    let slot = state.slot(slot);
    let counts = || {
        use std::sync::atomic::Ordering::Acquire;
        (slot.launches[0].load(Acquire), slot.allocs[0].load(Acquire))
    };
    let before = counts();
    for _ in 0..1000 {
        assert_eq!(launch(s.shim.launch) | alloc_free(&s.shim), 0);
    }
    let after = counts();
    assert_eq!(
        (after.0 - before.0, after.1 - before.1),
        (1000, 1000),
        "the shim did not count every launch and allocation"
    );
    assert_eq!(
        state
            .device(0)
            .used
            .load(std::sync::atomic::Ordering::Acquire),
        0
    );
    let mut p = 0u64;
    // SAFETY: valid out-pointer.
    unsafe {
        assert_eq!(
            (s.shim.alloc)(&mut p, QUOTA),
            0,
            "quota not returned by frees"
        );
        assert_eq!((s.shim.free)(p), 0);
    }
}

/// Criterion's median (ns) of `group/function` in this run.
fn median_ns(dir: &Path, group: &str, function: &str) -> Option<f64> {
    let path = dir.join(group).join(function).join("new/estimates.json");
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
    v["median"]["point_estimate"].as_f64()
}

fn main() {
    let dir = libshare_tests::target_dir().join("criterion");
    let mut c = Criterion::default()
        .output_directory(&dir)
        .without_plots()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args();
    let s = setup();
    bench(&mut c, &s);
    c.final_summary();

    // `cargo bench` passes --bench; a test run (`cargo test --benches`) measures nothing.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let m = |g, f| median_ns(&dir, g, f);
    let (Some(ld), Some(ls), Some(ad), Some(as_)) = (
        m("launch", "direct"),
        m("launch", "shim"),
        m("alloc_free", "direct"),
        m("alloc_free", "shim"),
    ) else {
        // Filtered to a subset of the benchmarks: no summary.
        return;
    };
    let r = |x: f64| (x * 100.0).round() / 100.0;
    println!(
        "{}",
        serde_json::json!({
            "scenario": "shim_overhead",
            "launch": {
                "direct_ns": r(ld), "shim_ns": r(ls), "added_ns": r(ls - ld),
                "target_added_ns": 20, "met": ls - ld <= 20.0,
            },
            "alloc_free": {
                "direct_ns": r(ad), "shim_ns": r(as_), "added_ns": r(as_ - ad),
                "target_added_ns": 200, "met": as_ - ad <= 200.0,
            },
        })
    );
}
