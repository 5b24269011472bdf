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
}

fn links() -> &'static Registry<Mutex<LinkState>> {
    static R: OnceLock<Registry<Mutex<LinkState>>> = OnceLock::new();
    R.get_or_init(Registry::default)
}

fn state(h: *mut c_void) -> Result<Arc<Mutex<LinkState>>, CUresult> {
    links().get(h as usize).ok_or(CUDA_ERROR_INVALID_HANDLE)
}

fn add(h: *mut c_void, kind: u32, data: &[u8]) -> R {
    if !matches!(
        kind,
        CU_JIT_INPUT_CUBIN | CU_JIT_INPUT_PTX | CU_JIT_INPUT_FATBINARY
    ) {
        return Err(CUDA_ERROR_NOT_SUPPORTED); // host objects, archives, NVVM IR: not simulated
    }
    let st = state(h)?;
    let s = sim()?;
    let dev = super::current_ctx_opt().map_or(0, |c| c.device);
    let (major, minor) = s.cfg.devices[dev].compute_capability;
    let info = crate::image::parse_bytes_for_arch(data, major * 10 + minor)
        .map_err(|_| CUDA_ERROR_INVALID_IMAGE)?;
    let mut st = st.lock();
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
    Ok(())
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
    fn cuLinkCreate(_n: u32, _o: *mut u32, _v: *mut *mut c_void, out_state: *mut *mut c_void) {
        sim()?;
        out(out_state, links().insert(Arc::new(Mutex::new(LinkState::default()))) as *mut c_void)
    }
    fn cuLinkCreate_v2(_n: u32, _o: *mut u32, _v: *mut *mut c_void, out_state: *mut *mut c_void) {
        sim()?;
        out(out_state, links().insert(Arc::new(Mutex::new(LinkState::default()))) as *mut c_void)
    }
    fn cuLinkAddData(h: *mut c_void, kind: u32, data: *mut c_void, size: usize, _name: *const c_char,
                     _n: u32, _o: *mut u32, _v: *mut *mut c_void) {
        if data.is_null() || size == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        add(h, kind, std::slice::from_raw_parts(data as *const u8, size))
    }
    fn cuLinkAddData_v2(h: *mut c_void, kind: u32, data: *mut c_void, size: usize, _name: *const c_char,
                        _n: u32, _o: *mut u32, _v: *mut *mut c_void) {
        if data.is_null() || size == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        add(h, kind, std::slice::from_raw_parts(data as *const u8, size))
    }
    fn cuLinkAddFile(h: *mut c_void, kind: u32, path: *const c_char, _n: u32, _o: *mut u32, _v: *mut *mut c_void) {
        let data = std::fs::read(cstr(path)?).map_err(|_| CUDA_ERROR_FILE_NOT_FOUND)?;
        add(h, kind, &data)
    }
    fn cuLinkAddFile_v2(h: *mut c_void, kind: u32, path: *const c_char, _n: u32, _o: *mut u32, _v: *mut *mut c_void) {
        let data = std::fs::read(cstr(path)?).map_err(|_| CUDA_ERROR_FILE_NOT_FOUND)?;
        add(h, kind, &data)
    }
    fn cuLinkComplete(h: *mut c_void, image: *mut *mut c_void, size: *mut usize) {
        let st = state(h)?;
        let mut st = st.lock();
        let mut text = synthesize(&st.kernels, &st.globals).into_bytes();
        text.push(0); // a PTX image is NUL-terminated text
        st.image = text;
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
