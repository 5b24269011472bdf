//! JIT linking (`cuLink*`). simgpu runs no machine code, so linking only has to carry what a module
//! needs: kernel names, parameter layouts and globals. Every input (PTX, cubin, fatbin) is parsed;
//! `cuLinkComplete` returns a synthesized PTX image declaring all of them, which the module loader
//! reads like any other image.

use parking_lot::Mutex;
use std::ffi::{c_char, c_void};
use std::fmt::Write as _;
use std::sync::{Arc, OnceLock};

use super::{cstr, out, R};
use crate::driver;
use crate::image::{GlobalInfo, KernelInfo};
use crate::sim::{sim, Registry};
use crate::types::*;

const CU_JIT_INPUT_CUBIN: u32 = 0;
const CU_JIT_INPUT_PTX: u32 = 1;
const CU_JIT_INPUT_FATBINARY: u32 = 2;

#[derive(Default)]
pub struct LinkState {
    kernels: Vec<KernelInfo>,
    globals: Vec<GlobalInfo>,
    image: Vec<u8>,
    /// cuLinkCreate's options, filled by cuLinkComplete (and the error log by a failing input).
    opts: JitOutputs,
    /// Wall-clock time spent in this link's calls so far.
    wall: std::time::Duration,
}

const CU_JIT_WALL_TIME: u32 = 2;
const CU_JIT_INFO_LOG_BUFFER: u32 = 3;
const CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES: u32 = 4;
const CU_JIT_ERROR_LOG_BUFFER: u32 = 5;
const CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES: u32 = 6;

/// The output options of one JIT call (`CUjit_option`s with an OUT meaning), as addresses of the
/// application's option-value slots: `CU_JIT_WALL_TIME` (a float, milliseconds, written into its
/// slot), the info and error log buffers (a NUL-terminated log, capped at the size given in the
/// `*_SIZE_BYTES` slot including the NUL; that slot is then overwritten with the bytes written).
/// Other options are accepted and have no effect: simgpu compiles nothing.
#[derive(Default, Clone, Copy)]
pub struct JitOutputs {
    wall: Option<usize>,
    info: Log,
    error: Log,
}

/// A log buffer's pointer and the address of its size slot.
#[derive(Default, Clone, Copy)]
struct Log {
    buf: usize,
    size_slot: Option<usize>,
}

impl JitOutputs {
    /// Reads `n` options and their value slots.
    ///
    /// # Safety
    /// When `n > 0`, `opts` and `vals` are NULL
    /// or point to `n` options and `n` value slots that stay valid (and writable) for as long as
    /// the outputs are written: the call, or for cuLinkCreate until cuLinkDestroy, as CUDA
    /// requires.
    pub unsafe fn read(
        n: u32,
        opts: *const u32,
        vals: *mut *mut c_void,
    ) -> Result<JitOutputs, CUresult> {
        let mut o = JitOutputs::default();
        if n == 0 {
            return Ok(o);
        }
        if opts.is_null() || vals.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        for i in 0..n as usize {
            // SAFETY: i < n, within both arrays (this fn's contract).
            let (opt, slot) = unsafe { (*opts.add(i), vals.add(i)) };
            // SAFETY: as above; a log buffer option's value is the buffer's address.
            let value = unsafe { *slot } as usize;
            match opt {
                CU_JIT_WALL_TIME => o.wall = Some(slot as usize),
                CU_JIT_INFO_LOG_BUFFER => o.info.buf = value,
                CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES => o.info.size_slot = Some(slot as usize),
                CU_JIT_ERROR_LOG_BUFFER => o.error.buf = value,
                CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES => o.error.size_slot = Some(slot as usize),
                _ => {}
            }
        }
        Ok(o)
    }

    /// Fills the outputs: the wall time, the info log and the error log.
    ///
    /// # Safety
    /// The slots and buffers named by `read` are still valid (its contract).
    pub unsafe fn write(&self, wall: std::time::Duration, info: &str, error: &str) {
        if let Some(slot) = self.wall {
            // A float in the value slot, as the JIT writes it (read back as `*(float *)&vals[i]`);
            // the slot's other bytes are cleared.
            // SAFETY: a writable, pointer-sized and aligned option-value slot (`read`'s contract).
            unsafe { *(slot as *mut u64) = ((wall.as_secs_f64() * 1e3) as f32).to_bits() as u64 };
        }
        // SAFETY: `read`'s contract.
        unsafe {
            self.info.write(info);
            self.error.write(error);
        }
    }

    /// Writes only the error log (an input that failed).
    ///
    /// # Safety
    /// As for `write`.
    pub unsafe fn write_error(&self, error: &str) {
        // SAFETY: `read`'s contract.
        unsafe { self.error.write(error) }
    }
}

impl Log {
    /// Safety: `buf` (if not 0) holds the size its slot gives; the slot is writable.
    unsafe fn write(&self, text: &str) {
        let Some(slot) = self.size_slot else { return };
        // SAFETY: a readable, pointer-sized option-value slot (the caller's contract); the size
        // is passed as an unsigned int in it.
        let cap = unsafe { *(slot as *const usize) } as u32 as usize;
        let written = if self.buf == 0 || cap == 0 {
            0
        } else {
            let n = text.len().min(cap - 1);
            // SAFETY: `buf` holds `cap` bytes (the caller's contract); n + 1 <= cap.
            unsafe {
                std::ptr::copy_nonoverlapping(text.as_ptr(), self.buf as *mut u8, n);
                *(self.buf as *mut u8).add(n) = 0;
            }
            if n == 0 {
                0
            } else {
                n + 1
            }
        };
        // SAFETY: writable slot (the caller's contract).
        unsafe { *(slot as *mut usize) = written };
    }
}

fn links() -> &'static Registry<Mutex<LinkState>> {
    static R: OnceLock<Registry<Mutex<LinkState>>> = OnceLock::new();
    R.get_or_init(Registry::default)
}

fn state(h: *mut c_void) -> Result<Arc<Mutex<LinkState>>, CUresult> {
    links().get(h as usize).ok_or(CUDA_ERROR_INVALID_HANDLE)
}

/// Adds one input to link `h`; `input` are the call's own options (filled here), and a failure
/// also goes to the error log of the link's options.
fn add(h: *mut c_void, kind: u32, data: &[u8], name: &str, input: JitOutputs) -> R {
    let start = std::time::Instant::now();
    let st = state(h)?;
    let parsed = parse(kind, data, name);
    let wall = start.elapsed();
    let mut st = st.lock();
    st.wall += wall;
    match parsed {
        Ok(info) => {
            let log = format!(
                "info    : {name}: {} kernel(s), {} global(s)\n",
                info.kernels.len(),
                info.globals.len()
            );
            for k in info.kernels {
                if !st.kernels.iter().any(|x| x.name == k.name) {
                    st.kernels.push(k);
                }
            }
            for g in info.globals {
                if !st.globals.iter().any(|x| x.name == g.name) {
                    st.globals.push(g);
                }
            }
            // SAFETY: the options of this call (cuLinkAddData's contract).
            unsafe { input.write(wall, &log, "") };
            Ok(())
        }
        Err((code, msg)) => {
            // SAFETY: this call's options, and the link's, valid until cuLinkDestroy (CUDA's
            // contract for cuLinkCreate).
            unsafe {
                input.write(wall, "", &msg);
                st.opts.write_error(&msg);
            }
            Err(code)
        }
    }
}

/// Parses one input: its kernels and globals, or the error and the error log's line.
fn parse(
    kind: u32,
    data: &[u8],
    name: &str,
) -> Result<crate::image::ImageInfo, (CUresult, String)> {
    if !matches!(
        kind,
        CU_JIT_INPUT_CUBIN | CU_JIT_INPUT_PTX | CU_JIT_INPUT_FATBINARY
    ) {
        // Host objects, archives, NVVM IR: not simulated.
        let msg = format!("error   : {name}: input type {kind} is not supported by simgpu\n");
        return Err((CUDA_ERROR_NOT_SUPPORTED, msg));
    }
    let s = sim().map_err(|e| (e, String::new()))?;
    let dev = super::current_ctx_opt().map_or(0, |c| c.device);
    let (major, minor) = s.cfg.devices[dev].compute_capability;
    crate::image::parse_bytes_for_arch(data, major * 10 + minor).map_err(|e| {
        let msg = format!("error   : {name}: not a valid PTX, cubin or fatbin image: {e}\n");
        (CUDA_ERROR_INVALID_IMAGE, msg)
    })
}

/// Creates a link whose options are `(n, o, v)`. Safety: JitOutputs::read's.
unsafe fn create(n: u32, o: *mut u32, v: *mut *mut c_void, out_state: *mut *mut c_void) -> R {
    sim()?;
    // SAFETY: this fn's contract.
    let opts = unsafe { JitOutputs::read(n, o, v)? };
    let st = LinkState {
        opts,
        ..Default::default()
    };
    // SAFETY: `out_state` is cuLinkCreate's out-argument (NULL-checked by `out`).
    unsafe {
        out(
            out_state,
            links().insert(Arc::new(Mutex::new(st))) as *mut c_void,
        )
    }
}

/// cuLinkAddData. Safety: `data` is NULL or holds `size` bytes; `name` is NULL or a
/// NUL-terminated string.
unsafe fn add_data(
    h: *mut c_void,
    kind: u32,
    data: *mut c_void,
    size: usize,
    name: *const c_char,
    input: JitOutputs,
) -> R {
    if data.is_null() || size == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: this fn's contract.
    let (bytes, name) = unsafe {
        (
            std::slice::from_raw_parts(data as *const u8, size),
            cstr(name).unwrap_or("input"),
        )
    };
    add(h, kind, bytes, name, input)
}

/// cuLinkAddFile. Safety: `path` is NULL or a NUL-terminated string.
unsafe fn add_file(h: *mut c_void, kind: u32, path: *const c_char, input: JitOutputs) -> R {
    // SAFETY: this fn's contract.
    let name = unsafe { cstr(path)? };
    let data = std::fs::read(name).map_err(|_| CUDA_ERROR_FILE_NOT_FOUND)?;
    add(h, kind, &data, name, input)
}

/// PTX declaring every linked kernel (with its parameter layout) and global. Parameter `i` gets
/// the largest alignment dividing its offset, so natural PTX layout reproduces the offsets.
pub fn synthesize(kernels: &[KernelInfo], globals: &[GlobalInfo]) -> String {
    let mut p = String::from("// Synthesized by simgpu's cuLinkComplete: names and layouts only.\n.version 8.0\n.target sm_80\n.address_size 64\n\n");
    for g in globals {
        let _ = write!(
            p,
            ".visible .global .align 8 .b8 {}[{}]",
            g.name,
            g.size.max(1)
        );
        if let Some(init) = g.init.as_ref().filter(|i| !i.is_empty()) {
            let bytes: Vec<String> = init.iter().map(|b| b.to_string()).collect();
            let _ = write!(p, " = {{{}}}", bytes.join(", "));
        }
        p.push_str(";\n");
    }
    for k in kernels {
        let params: Vec<String> = k
            .params
            .iter()
            .flatten()
            .enumerate()
            .map(|(i, prm)| {
                let align = if prm.offset == 0 {
                    8
                } else {
                    (1u32 << prm.offset.trailing_zeros()).min(128)
                };
                format!(
                    "\t.param .align {align} .b8 {}_param_{i}[{}]",
                    k.name,
                    prm.size.max(1)
                )
            })
            .collect();
        let _ = write!(
            p,
            "\n.visible .entry {}(\n{}\n)\n{{\n\tret;\n}}\n",
            k.name,
            params.join(",\n")
        );
    }
    p
}

driver! {
    fn cuLinkCreate(n: u32, o: *mut u32, v: *mut *mut c_void, out_state: *mut *mut c_void) {
        create(n, o, v, out_state)
    }
    fn cuLinkCreate_v2(n: u32, o: *mut u32, v: *mut *mut c_void, out_state: *mut *mut c_void) {
        create(n, o, v, out_state)
    }
    fn cuLinkAddData(h: *mut c_void, kind: u32, data: *mut c_void, size: usize, name: *const c_char,
                     n: u32, o: *mut u32, v: *mut *mut c_void) {
        add_data(h, kind, data, size, name, JitOutputs::read(n, o, v)?)
    }
    fn cuLinkAddData_v2(h: *mut c_void, kind: u32, data: *mut c_void, size: usize, name: *const c_char,
                        n: u32, o: *mut u32, v: *mut *mut c_void) {
        add_data(h, kind, data, size, name, JitOutputs::read(n, o, v)?)
    }
    fn cuLinkAddFile(h: *mut c_void, kind: u32, path: *const c_char, n: u32, o: *mut u32, v: *mut *mut c_void) {
        add_file(h, kind, path, JitOutputs::read(n, o, v)?)
    }
    fn cuLinkAddFile_v2(h: *mut c_void, kind: u32, path: *const c_char, n: u32, o: *mut u32, v: *mut *mut c_void) {
        add_file(h, kind, path, JitOutputs::read(n, o, v)?)
    }
    fn cuLinkComplete(h: *mut c_void, image: *mut *mut c_void, size: *mut usize) {
        let start = std::time::Instant::now();
        let st = state(h)?;
        let mut st = st.lock();
        let mut text = synthesize(&st.kernels, &st.globals).into_bytes();
        text.push(0); // a PTX image is NUL-terminated text
        st.image = text;
        st.wall += start.elapsed();
        let log = format!(
            "info    : simgpu: linked {} kernel(s) and {} global(s) into a {}-byte PTX image\n",
            st.kernels.len(),
            st.globals.len(),
            st.image.len()
        );
        // SAFETY: the link's options stay valid until cuLinkDestroy (cuLinkCreate's contract).
        st.opts.write(st.wall, &log, "");
        out(image, st.image.as_ptr() as *mut c_void)?;
        out(size, st.image.len())
    }
    fn cuLinkDestroy(h: *mut c_void) {
        links().remove(h as usize).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::{parse_bytes, ParamInfo};

    #[test]
    fn synthesized_image_reproduces_names_layouts_and_globals() {
        let kernels = vec![KernelInfo {
            name: "_Z3fooPfiS_".into(),
            params: Some(vec![
                ParamInfo { offset: 0, size: 8 },
                ParamInfo { offset: 8, size: 4 },
                ParamInfo {
                    offset: 16,
                    size: 8,
                },
                ParamInfo {
                    offset: 32,
                    size: 24,
                },
            ]),
        }];
        let globals = vec![GlobalInfo {
            name: "g".into(),
            size: 4,
            init: Some(vec![7, 0, 0, 0]),
        }];
        let mut text = synthesize(&kernels, &globals).into_bytes();
        text.push(0);
        let info = parse_bytes(&text).expect("parses");
        assert_eq!(info.kernels.len(), 1);
        let k = &info.kernels[0];
        assert_eq!(k.name, "_Z3fooPfiS_");
        let got: Vec<(u32, u32)> = k
            .params
            .as_ref()
            .unwrap()
            .iter()
            .map(|p| (p.offset, p.size))
            .collect();
        assert_eq!(got, vec![(0, 8), (8, 4), (16, 8), (32, 24)]);
        assert_eq!(info.globals[0].name, "g");
        assert_eq!(info.globals[0].size, 4);
        assert_eq!(info.globals[0].init.as_deref(), Some(&[7u8, 0, 0, 0][..]));
    }
}
