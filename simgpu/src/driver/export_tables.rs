//! The undocumented driver export tables that cudart, cuBLAS, cuBLASLt, cuFFT and CUPTI fetch with
//! `cuGetExportTable` (facts in `shared/reference/cuda-export-tables.md` and `simgpu/README.md`).
//! Each table is an array of pointers; for most, slot 0 holds the table size in bytes. Slots whose
//! meaning is unknown are logging stubs (returning 0 in the older tables, an error in
//! TOOLS_MODULE), so drift between CUDA releases shows up in the log and the trace file.

use std::ffi::c_void;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::OnceLock;

use crate::driver::{ctx_from, current_ctx_opt};
use crate::sim::sim;
use crate::types::*;

const CUDART_INTERFACE: [u8; 16] = uuid(
    0x6bd5fb6c,
    0x5bf4,
    0xe74a,
    [0x89, 0x87, 0xd9, 0x39, 0x12, 0xfd, 0x9d, 0xf9],
);
const TOOLS_RUNTIME_CALLBACK_HOOKS: [u8; 16] = uuid(
    0xa094798c,
    0x2e74,
    0x2e74,
    [0x93, 0xf2, 0x08, 0x00, 0x20, 0x0c, 0x0a, 0x66],
);
const TOOLS_TLS: [u8; 16] = uuid(
    0x42d85a81,
    0x23f6,
    0xcb47,
    [0x82, 0x98, 0xf6, 0xe7, 0x8a, 0x3a, 0xec, 0xdc],
);
const CONTEXT_LOCAL_STORAGE: [u8; 16] = uuid(
    0xc693336e,
    0x1121,
    0xdf11,
    [0xa8, 0xc3, 0x68, 0xf3, 0x55, 0xd8, 0x95, 0x93],
);
const UNKNOWN_CHECKS: [u8; 16] = uuid(
    0x263e8860,
    0x7cd2,
    0x6143,
    [0x92, 0xf6, 0xbb, 0xd5, 0x00, 0x6d, 0xfa, 0x7e],
);
const INTEGRITY_CHECK: [u8; 16] = uuid(
    0xd4082055,
    0xbde6,
    0x704b,
    [0x8d, 0x34, 0xba, 0x12, 0x3c, 0x66, 0xe1, 0xf2],
);
const TOOLS_CONTEXT: [u8; 16] = uuid(
    0x21318c60,
    0x9714,
    0x3248,
    [0x8c, 0xa6, 0x41, 0xff, 0x73, 0x24, 0xc8, 0xf2],
);

/// CU_ETID_ToolsModule. cuFFT (12.2) fetches it and calls slot 7 to get the one kernel of each
/// module it loads; it checks first that slot 0 (the size in bytes) is more than 55.
const TOOLS_MODULE: [u8; 16] = uuid(
    0x6e163fbe,
    0xb958,
    0x444d,
    [0x83, 0x5c, 0xe1, 0x82, 0xaf, 0xf1, 0x99, 0x1e],
);

/// The table libcupti (13.x) fetches before anything else: every public CUPTI function goes
/// through a dispatcher that needs it, and when it is refused the dispatcher's error path calls
/// itself until the stack overflows. The dispatcher calls the slot at byte offset 0x218 only when
/// slot 0 (the size) is larger, and otherwise runs CUPTI's own implementation. Served with 64
/// slots (size 512): every slot but the size is a logging stub, and none is called by CUPTI 13.2.
/// CUPTI then finds the driver's tools interface refused, so activity tracing stays unavailable.
const CUPTI: [u8; 16] = uuid(
    0x7cb63f9b,
    0x9ca4,
    0x8e42,
    [0xa4, 0x84, 0xbe, 0xb6, 0x6e, 0x6a, 0xed, 0x7f],
);

/// Builds the memory-order bytes of a UUID written as in the reference (first three groups are
/// listed in memory order already).
const fn uuid(a: u32, b: u16, c: u16, d: [u8; 8]) -> [u8; 16] {
    let a = a.to_be_bytes();
    let b = b.to_be_bytes();
    let c = c.to_be_bytes();
    [
        a[0], a[1], a[2], a[3], b[0], b[1], c[0], c[1], d[0], d[1], d[2], d[3], d[4], d[5], d[6],
        d[7],
    ]
}

struct Tables {
    cudart_interface: Box<[usize]>,
    callback_hooks: Box<[usize]>,
    tools_tls: Box<[usize]>,
    local_storage: Box<[usize]>,
    unknown_checks: Box<[usize]>,
    integrity: Box<[usize]>,
    tools_context: Box<[usize]>,
    tools_module: Box<[usize]>,
    cupti: Box<[usize]>,
}

/// A table with `n` slots, slot 0 = `size_slots * 8` bytes (if Some), others `fill`, then overrides.
fn table(n: usize, size_slots: Option<usize>, fill: usize, set: &[(usize, usize)]) -> Box<[usize]> {
    let mut t = vec![fill; n];
    if let Some(s) = size_slots {
        t[0] = s * std::mem::size_of::<usize>();
    }
    for &(i, v) in set {
        t[i] = v;
    }
    t.into_boxed_slice()
}

fn tables() -> &'static Tables {
    static T: OnceLock<Tables> = OnceLock::new();
    T.get_or_init(|| Tables {
        cudart_interface: {
            let mut v: Vec<(usize, usize)> = (1..16)
                .map(|i| (i, unknown_slot as *const () as usize))
                .collect();
            v.extend([
                (1, not_supported as *const () as usize),
                (2, cudart_get_primary_ctx as *const () as usize),
                (6, not_supported as *const () as usize),
                (7, zero as *const () as usize),
                (8, not_supported as *const () as usize),
                (12, zero as *const () as usize),
            ]);
            table(16, Some(10), 0, &v)
        },
        callback_hooks: table(
            7,
            Some(7),
            unknown_slot as *const () as usize,
            &[
                (2, callback_hooks_buf_1024 as *const () as usize),
                (6, callback_hooks_buf_14 as *const () as usize),
            ],
        ),
        tools_tls: table(
            4,
            Some(4),
            unknown_slot as *const () as usize,
            &[(2, zero as *const () as usize)],
        ),
        local_storage: table(
            4,
            None,
            unknown_slot as *const () as usize,
            &[
                (0, cls_put as *const () as usize),
                (1, cls_delete as *const () as usize),
                (2, cls_get as *const () as usize),
            ],
        ),
        unknown_checks: table(
            4,
            Some(4),
            unknown_slot as *const () as usize,
            &[
                (2, unknown_check_ctx as *const () as usize),
                (3, zero as *const () as usize),
            ],
        ),
        integrity: table(
            3,
            Some(3),
            unknown_slot as *const () as usize,
            &[(1, integrity_check as *const () as usize)],
        ),
        tools_context: table(96, Some(95), zero as *const () as usize, &[]),
        tools_module: {
            let mut t: Vec<usize> = TOOLS_MODULE_STUBS.iter().map(|&f| f as usize).collect();
            t[0] = t.len() * std::mem::size_of::<usize>();
            t[7] = tools_module_functions as *const () as usize;
            t.into_boxed_slice()
        },
        cupti: {
            let mut t: Vec<usize> = CUPTI_STUBS.iter().map(|&f| f as usize).collect();
            t[0] = t.len() * std::mem::size_of::<usize>();
            t.into_boxed_slice()
        },
    })
}

/// `cuGetExportTable`: only the tables above are served; anything else is refused, with a NULL table.
///
/// # Safety
///
/// `out` is NULL or writable; `id` is NULL or points to a readable CUuuid (the contract cudart
/// and NVIDIA's libraries follow for this undocumented call).
#[no_mangle]
pub unsafe extern "C" fn cuGetExportTable(out: *mut *const c_void, id: *const CUuuid) -> CUresult {
    if out.is_null() || id.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: `id` is not NULL (checked) and readable (this fn's contract).
    let id = unsafe { (*id).0 };
    let t = tables();
    let table: Option<&[usize]> = match id {
        CUDART_INTERFACE => Some(&t.cudart_interface),
        TOOLS_RUNTIME_CALLBACK_HOOKS => Some(&t.callback_hooks),
        TOOLS_TLS => Some(&t.tools_tls),
        CONTEXT_LOCAL_STORAGE => Some(&t.local_storage),
        UNKNOWN_CHECKS => Some(&t.unknown_checks),
        INTEGRITY_CHECK => Some(&t.integrity),
        TOOLS_CONTEXT => Some(&t.tools_context),
        TOOLS_MODULE => Some(&t.tools_module),
        CUPTI => Some(&t.cupti),
        _ => None,
    };
    match table {
        Some(t) => {
            // SAFETY: `out` is not NULL (checked) and writable (this fn's contract); the table
            // lives in a static (`tables()`), so the pointer stays valid for the process.
            unsafe { *out = t.as_ptr() as *const c_void };
            CUDA_SUCCESS
        }
        None => {
            crate::debug!("cuGetExportTable: unknown table {:02x?}", id);
            // SAFETY: `out` is not NULL (checked) and writable (this fn's contract).
            unsafe { *out = std::ptr::null() };
            CUDA_ERROR_NOT_SUPPORTED
        }
    }
}

/// Export-table functions are called by NVIDIA's libraries at any time, exit included: a panic
/// must become an error code, never an abort.
fn guarded(name: &str, f: impl FnOnce() -> CUresult) -> CUresult {
    shim_headers::guard(name, CUDA_ERROR_UNKNOWN, f)
}

extern "C" fn unknown_slot() -> usize {
    crate::warn!("an unknown export-table slot was called (returns 0)");
    crate::log::trace_line("stub export-table-slot");
    0
}
extern "C" fn zero() -> usize {
    0
}
extern "C" fn not_supported() -> CUresult {
    CUDA_ERROR_NOT_SUPPORTED
}

unsafe extern "C" fn cudart_get_primary_ctx(out: *mut CUcontext, dev: CUdevice) -> CUresult {
    // SAFETY: cudart passes an out-pointer with cuDevicePrimaryCtxRetain's contract (NULL or
    // writable).
    unsafe { crate::driver::cuDevicePrimaryCtxRetain(out, dev) }
}

static HOOKS_1024: [u32; 1024] = [0; 1024];
static HOOKS_14: [u32; 14] = [0; 14];

unsafe extern "C" fn callback_hooks_buf_1024(buf: *mut *const c_void, n: *mut usize) -> CUresult {
    // SAFETY: the calling library passes `buf` and `n` NULL or writable; the buffer is a static.
    unsafe { callback_hooks_buf(buf, n, HOOKS_1024.as_ptr() as *const c_void, 1024) }
}
unsafe extern "C" fn callback_hooks_buf_14(buf: *mut *const c_void, n: *mut usize) -> CUresult {
    // SAFETY: as above.
    unsafe { callback_hooks_buf(buf, n, HOOKS_14.as_ptr() as *const c_void, 14) }
}
/// Safety: `buf` and `n` are NULL or writable.
unsafe fn callback_hooks_buf(
    buf: *mut *const c_void,
    n: *mut usize,
    p: *const c_void,
    len: usize,
) -> CUresult {
    // SAFETY: each out-pointer is written only when not NULL, and then it is writable (this fn's
    // contract).
    unsafe {
        if !buf.is_null() {
            *buf = p;
        }
        if !n.is_null() {
            *n = len;
        }
    }
    CUDA_SUCCESS
}

unsafe extern "C" fn cls_put(
    ctx: CUcontext,
    key: *mut c_void,
    value: *mut c_void,
    dtor: *mut c_void,
) -> CUresult {
    guarded("cls_put", || match ctx_from(ctx) {
        Ok(c) => {
            c.local_storage
                .lock()
                .insert(key as usize, (value as usize, dtor as usize));
            CUDA_SUCCESS
        }
        Err(e) => e,
    })
}
unsafe extern "C" fn cls_delete(ctx: CUcontext, key: *mut c_void) -> CUresult {
    guarded("cls_delete", || match ctx_from(ctx) {
        Ok(c) => match c.local_storage.lock().remove(&(key as usize)) {
            Some(_) => CUDA_SUCCESS,
            None => CUDA_ERROR_INVALID_HANDLE,
        },
        Err(e) => e,
    })
}
unsafe extern "C" fn cls_get(
    value: *mut *mut c_void,
    ctx: CUcontext,
    key: *mut c_void,
) -> CUresult {
    guarded("cls_get", || {
        let c = if ctx.is_null() {
            current_ctx_opt().ok_or(CUDA_ERROR_INVALID_CONTEXT)
        } else {
            ctx_from(ctx)
        };
        match c {
            Ok(c) => match c.local_storage.lock().get(&(key as usize)) {
                Some((v, _)) => {
                    if !value.is_null() {
                        // SAFETY: not NULL, and the calling library passes a writable slot.
                        unsafe { *value = *v as *mut c_void };
                    }
                    CUDA_SUCCESS
                }
                None => CUDA_ERROR_INVALID_HANDLE,
            },
            Err(e) => e,
        }
    })
}

unsafe extern "C" fn unknown_check_ctx(
    _ctx: CUcontext,
    r1: *mut u32,
    _r2: *mut *const c_void,
) -> CUresult {
    if !r1.is_null() {
        // SAFETY: not NULL, and the calling library passes a writable u32.
        unsafe { *r1 = 0 };
    }
    CUDA_SUCCESS
}

unsafe extern "C" fn integrity_check(
    version: u32,
    unix_seconds: u64,
    out: *mut [u64; 2],
) -> CUresult {
    guarded("integrity_check", || {
        if out.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let Ok(s) = sim() else {
            return CUDA_ERROR_NOT_INITIALIZED;
        };
        let devices: Vec<crate::integrity::DeviceId> = s
            .visible
            .iter()
            .map(|&p| &s.cfg.devices[p])
            .map(|d| crate::integrity::DeviceId {
                uuid: d.uuid,
                pci_domain: d.pci_domain as i32,
                pci_bus: d.pci_bus as i32,
                pci_device: d.pci_device as i32,
            })
            .collect();
        let t = tables();
        let input = crate::integrity::Input {
            driver_version: s.cfg.driver_version as u32,
            version,
            pid: std::process::id(),
            // SAFETY: pthread_self takes no arguments and cannot fail.
            thread: unsafe { libc::pthread_self() } as u32,
            cudart_interface_table: t.cudart_interface.as_ptr() as u64,
            integrity_table: t.integrity.as_ptr() as u64,
            check_fn: integrity_check as *const () as usize as u64,
            unix_seconds,
            devices: &devices,
        };
        // SAFETY: `out` is not NULL (checked) and cudart passes a writable [u64; 2].
        unsafe { *out = crate::integrity::check(&input) };
        let _ = Relaxed;
        CUDA_SUCCESS
    })
}

/// A stub slot of a table whose other slots are unknown: logs its index and the six integer
/// argument registers (a C caller passes up to six arguments there), appends
/// `stub export-table-slot <table>[i]` to the trace file, and returns
/// `CUDA_ERROR_NOT_SUPPORTED`, so a caller that starts to use it fails visibly.
type StubSlot = extern "C" fn(usize, usize, usize, usize, usize, usize) -> usize;

macro_rules! stub_slots {
    ($name:ident, $table:literal, [$($i:literal)*]) => {
        const $name: &[StubSlot] = &[$({
            extern "C" fn stub(a: usize, b: usize, c: usize, d: usize, e: usize, f: usize) -> usize {
                crate::warn!(
                    "export table {}: unknown slot {} called with ({a:#x}, {b:#x}, {c:#x}, {d:#x}, {e:#x}, {f:#x}); returns CUDA_ERROR_NOT_SUPPORTED",
                    $table, $i
                );
                crate::log::trace_line(concat!("stub export-table-slot ", $table, "[", $i, "]"));
                CUDA_ERROR_NOT_SUPPORTED as usize
            }
            stub
        }),*];
    };
}

// Slot 0 (the size) and slot 7 are replaced when the table is built.
stub_slots!(TOOLS_MODULE_STUBS, "tools_module", [0 1 2 3 4 5 6 7]);
// Slot 0 (the size) is replaced when the table is built.
stub_slots!(CUPTI_STUBS, "cupti", [0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31
    32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62 63]);

/// The callback of `tools_module_functions`: called once per function with the caller's opaque
/// pointer and the function's handle.
type FunctionVisitor = unsafe extern "C" fn(opaque: *mut c_void, function: CUfunction);

/// TOOLS_MODULE[7] `(CUcontext ctx, CUmodule module, visitor, void *opaque) -> count`: calls
/// `visitor(opaque, f)` for each function of `module`, in image order, and returns how many it
/// visited (0, visiting nothing, when the context or module is invalid). The handles are the ones
/// `cuModuleGetFunction` returns. `ctx` may be NULL; functions do not depend on the context here.
///
/// How cuFFT 12.2 uses it (seen from its calls and its code): right after each
/// `cuModuleLoadData` of one of its single-kernel modules it calls this slot with its current
/// context, the module and a visitor that stores `f` at `*opaque`, and fails the plan with
/// `CUFFT_INTERNAL_ERROR` unless the count is exactly 1; it then launches the stored function.
extern "C" fn tools_module_functions(
    ctx: CUcontext,
    module: *mut c_void,
    visitor: Option<FunctionVisitor>,
    opaque: *mut c_void,
) -> usize {
    let functions = std::panic::catch_unwind(|| {
        if !ctx.is_null() {
            ctx_from(ctx)?;
        }
        crate::driver::module::all_functions(module as usize)
    });
    let functions = match functions {
        Ok(Ok(f)) => f,
        Ok(Err(e)) => {
            crate::warn!(
                "tools_module[7]: ctx {ctx:?}, module {module:?}: error {e}; visits no function"
            );
            return 0;
        }
        Err(_) => return 0,
    };
    crate::debug!(
        "tools_module[7]: module {module:?} has {} function(s)",
        functions.len()
    );
    if let Some(visit) = visitor {
        for &f in &functions {
            // SAFETY: the caller passes a function with the visitor signature (cuFFT's stores
            // `f` at `opaque`); `opaque` is the caller's own pointer, handed back untouched.
            unsafe { visit(opaque, f as CUfunction) };
        }
    }
    functions.len()
}
