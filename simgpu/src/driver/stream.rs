//! Streams: creation, ordering, synchronisation, host callbacks, stream-ordered waits.

use std::ffi::c_void;
use std::sync::Arc;

use super::{current_ctx, out, stream_ref, submit, R};
use crate::engine::Op;
use crate::sim::{sim, Stream};
use crate::types::*;
use crate::{driver, driver_ptds};

/// Safety: `ph` is NULL or writable (cuStreamCreate's out-argument).
unsafe fn create(ph: *mut CUstream, flags: u32, priority: i32) -> R {
    if ph.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let s = sim()?;
    let ctx = current_ctx()?;
    let id = s.engine.create_stream();
    ctx.streams.lock().push((id, flags));
    let h = s.streams.insert(Arc::new(Stream {
        id,
        ctx,
        flags,
        priority,
    }));
    // SAFETY: not NULL (checked above), so writable (this fn's contract).
    unsafe { *ph = h as CUstream };
    Ok(())
}

unsafe fn destroy(h: CUstream) -> R {
    let s = sim()?;
    let st = s
        .streams
        .remove(h as usize)
        .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    st.ctx.streams.lock().retain(|(id, _)| *id != st.id);
    s.engine.destroy_stream(st.id);
    Ok(())
}

#[derive(Clone, Copy)]
struct HostFn(usize, usize);
// SAFETY: the application hands us a function and its argument to call from a driver thread.
unsafe impl Send for HostFn {}
// SAFETY: only copied and called, never dereferenced by simgpu.
unsafe impl Sync for HostFn {}

driver! {
    fn cuStreamCreate(ph: *mut CUstream, flags: u32) {
        create(ph, flags, 0)
    }
    fn cuStreamCreateWithPriority(ph: *mut CUstream, flags: u32, priority: i32) {
        create(ph, flags, priority)
    }
    fn cuStreamDestroy(h: CUstream) {
        destroy(h)
    }
    fn cuStreamDestroy_v2(h: CUstream) {
        destroy(h)
    }
    fn cuStreamGetGreenCtx(h: CUstream, green: *mut *mut c_void) {
        // Green contexts are not simulated: every stream belongs to an ordinary context.
        stream_ref(h, false)?;
        out(green, std::ptr::null_mut())
    }
}

driver_ptds! {
    fn cuStreamSynchronize / cuStreamSynchronize_ptsz(h: CUstream) |ptds| {
        let s = sim()?;
        let r = stream_ref(h, ptds)?;
        if r.legacy {
            // The legacy stream also waits for the blocking streams it is ordered after.
            let seq = submit(s, &r, Op::marker());
            s.engine.wait(r.id, seq);
        } else {
            s.engine.wait(r.id, s.engine.tail(r.id));
        }
        Ok(())
    }
    fn cuStreamQuery / cuStreamQuery_ptsz(h: CUstream) |ptds| {
        let s = sim()?;
        let r = stream_ref(h, ptds)?;
        if s.engine.is_done(r.id, s.engine.tail(r.id)) { Ok(()) } else { Err(CUDA_ERROR_NOT_READY) }
    }
    fn cuStreamGetPriority / cuStreamGetPriority_ptsz(h: CUstream, p: *mut i32) |ptds| {
        let s = sim()?;
        let r = stream_ref(h, ptds)?;
        let prio = s.streams.get(h as usize).map_or(0, |st| st.priority);
        let _ = r;
        out(p, prio)
    }
    fn cuStreamGetFlags / cuStreamGetFlags_ptsz(h: CUstream, f: *mut u32) |ptds| {
        let s = sim()?;
        stream_ref(h, ptds)?;
        out(f, s.streams.get(h as usize).map_or(0, |st| st.flags))
    }
    fn cuStreamGetId / cuStreamGetId_ptsz(h: CUstream, id: *mut u64) |ptds| {
        out(id, stream_ref(h, ptds)?.id)
    }
    fn cuStreamGetCtx / cuStreamGetCtx_ptsz(h: CUstream, ctx: *mut CUcontext) |ptds| {
        out(ctx, stream_ref(h, ptds)?.ctx.handle())
    }
    fn cuStreamGetCtx_v2 / cuStreamGetCtx_v2_ptsz(h: CUstream, ctx: *mut CUcontext, green: *mut *mut c_void) |ptds| {
        out(ctx, stream_ref(h, ptds)?.ctx.handle())?;
        if !green.is_null() {
            *green = std::ptr::null_mut();
        }
        Ok(())
    }
    fn cuStreamGetDevice / cuStreamGetDevice_ptsz(h: CUstream, dev: *mut CUdevice) |ptds| {
        out(dev, sim()?.ordinal(stream_ref(h, ptds)?.ctx.device))
    }
    fn cuStreamWaitEvent / cuStreamWaitEvent_ptsz(h: CUstream, ev: CUevent, _flags: u32) |ptds| {
        let s = sim()?;
        let r = stream_ref(h, ptds)?;
        let e = s.events.get(ev as usize).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        if crate::model::capture::join_if_captured(r.id, &e.state)
            || crate::model::capture::capturing(r.id).is_some()
        {
            return Ok(()); // the stream joins (or already is in) the capture
        }
        let rec = *e.state.inner.lock();
        let mut op = Op::marker();
        if rec.recorded {
            op.deps.push((rec.stream, rec.seq));
        }
        submit(s, &r, op);
        Ok(())
    }
    fn cuLaunchHostFunc / cuLaunchHostFunc_ptsz(h: CUstream, f: *mut c_void, user: *mut c_void) |ptds| {
        if f.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let s = sim()?;
        let r = stream_ref(h, ptds)?;
        let hf = HostFn(f as usize, user as usize);
        let node = crate::model::capture::NODE_HOST;
        super::submit_or_capture(s, &r, node, move || {
            Ok(Op::marker().with_effect(move || {
                let hf = hf;
                // SAFETY: `hf.0` is the application's non-NULL CUhostFn, `void (*)(void
                // *userData)`, given to us to call once with its userData; the API contract
                // keeps both valid until the call has run.
                unsafe {
                    let f: unsafe extern "C" fn(*mut c_void) = std::mem::transmute(hf.0);
                    f(hf.1 as *mut c_void)
                }
            }))
        })
    }
    fn cuStreamAddCallback / cuStreamAddCallback_ptsz(h: CUstream, f: *mut c_void, user: *mut c_void, _flags: u32) |ptds| {
        if f.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let s = sim()?;
        let r = stream_ref(h, ptds)?;
        let hf = HostFn(f as usize, user as usize);
        let handle = h as usize;
        submit(s, &r, Op::marker().with_effect(move || {
            let hf = hf;
            // SAFETY: `hf.0` is the application's non-NULL CUstreamCallback, `void (*)(CUstream,
            // CUresult, void *userData)`, to be called once with its userData (the API contract
            // keeps both valid until then).
            unsafe {
                let f: unsafe extern "C" fn(CUstream, CUresult, *mut c_void) = std::mem::transmute(hf.0);
                f(handle as CUstream, CUDA_SUCCESS, hf.1 as *mut c_void)
            }
        }));
        Ok(())
    }
    fn cuStreamAttachMemAsync / cuStreamAttachMemAsync_ptsz(h: CUstream, _p: CUdeviceptr, _len: usize, _flags: u32) |ptds| {
        stream_ref(h, ptds)?;
        Ok(())
    }
    fn cuStreamGetAttribute / cuStreamGetAttribute_ptsz(h: CUstream, _attr: u32, value: *mut u8) |ptds| {
        stream_ref(h, ptds)?;
        if value.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // CUlaunchAttributeValue is a 64-byte union; zero = defaults.
        std::ptr::write_bytes(value, 0, 64);
        Ok(())
    }
    fn cuStreamSetAttribute / cuStreamSetAttribute_ptsz(h: CUstream, _attr: u32, _value: *const u8) |ptds| {
        stream_ref(h, ptds)?;
        Ok(())
    }
    fn cuStreamCopyAttributes / cuStreamCopyAttributes_ptsz(dst: CUstream, src: CUstream) |ptds| {
        stream_ref(dst, ptds)?;
        stream_ref(src, ptds)?;
        Ok(())
    }
    fn cuStreamWaitValue32_v2 / cuStreamWaitValue32_v2_ptsz(h: CUstream, _addr: CUdeviceptr, _value: u32, _flags: u32) |ptds| {
        stream_ref(h, ptds)?;
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }
    fn cuStreamWriteValue32_v2 / cuStreamWriteValue32_v2_ptsz(h: CUstream, addr: CUdeviceptr, value: u32, _flags: u32) |ptds| {
        write_value(h, ptds, addr, value as u64, 4)
    }
    fn cuStreamWriteValue64_v2 / cuStreamWriteValue64_v2_ptsz(h: CUstream, addr: CUdeviceptr, value: u64, _flags: u32) |ptds| {
        write_value(h, ptds, addr, value, 8)
    }
}

unsafe fn write_value(h: CUstream, ptds: bool, addr: CUdeviceptr, value: u64, size: u64) -> R {
    let s = sim()?;
    let r = stream_ref(h, ptds)?;
    super::memory::writable_device_range(s, addr, size).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let a = addr;
    submit(
        s,
        &r,
        Op::marker().with_effect(move || {
            // SAFETY: address range validated against the allocation table.
            unsafe {
                if size == 4 {
                    (a as *mut u32).write_volatile(value as u32)
                } else {
                    (a as *mut u64).write_volatile(value)
                }
            }
        }),
    );
    Ok(())
}
