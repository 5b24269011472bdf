//! Events: recorded on streams; their timestamps are modelled device time.

use std::sync::Arc;

use super::{out, stream_ref, submit, R};
use crate::engine::{EventState, Op};
use crate::sim::{sim, Event};
use crate::types::*;
use crate::{driver, driver_ptds};

fn get(h: CUevent) -> Result<Arc<Event>, CUresult> {
    sim()?
        .events
        .get(h as usize)
        .ok_or(CUDA_ERROR_INVALID_HANDLE)
}

/// Is the event's last record complete (or was it never recorded)?
fn done(e: &Event) -> Result<bool, CUresult> {
    let r = *e.state.inner.lock();
    Ok(!r.recorded || sim()?.engine.is_done(r.stream, r.seq))
}

unsafe fn record(ev: CUevent, h: CUstream, ptds: bool) -> R {
    let s = sim()?;
    let e = get(ev)?;
    let r = stream_ref(h, ptds)?;
    if crate::model::capture::note_event_record(r.id, &e.state) {
        return Ok(()); // inside a capture: only marks a fork/join point
    }
    let mut op = Op::marker();
    op.event = Some(e.state.clone());
    submit(s, &r, op);
    Ok(())
}

driver! {
    fn cuEventCreate(ph: *mut CUevent, flags: u32) {
        let s = sim()?;
        super::current_ctx()?;
        let h = s.events.insert(Arc::new(Event { flags, state: Arc::new(EventState::default()) }));
        out(ph, h as CUevent)
    }
    fn cuEventDestroy(h: CUevent) {
        sim()?.events.remove(h as usize).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        Ok(())
    }
    fn cuEventDestroy_v2(h: CUevent) {
        sim()?.events.remove(h as usize).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        Ok(())
    }
    fn cuEventQuery(h: CUevent) {
        if done(&*get(h)?)? { Ok(()) } else { Err(CUDA_ERROR_NOT_READY) }
    }
    fn cuEventSynchronize(h: CUevent) {
        let e = get(h)?;
        let r = *e.state.inner.lock();
        if r.recorded {
            sim()?.engine.wait(r.stream, r.seq);
        }
        Ok(())
    }
    fn cuEventElapsedTime(ms: *mut f32, start: CUevent, end: CUevent) {
        elapsed(ms, start, end)
    }
    fn cuEventElapsedTime_v2(ms: *mut f32, start: CUevent, end: CUevent) {
        elapsed(ms, start, end)
    }
}

/// Safety: `ms` is NULL or writable (cuEventElapsedTime's out-argument).
unsafe fn elapsed(ms: *mut f32, start: CUevent, end: CUevent) -> R {
    let (a, b) = (get(start)?, get(end)?);
    if (a.flags | b.flags) & CU_EVENT_DISABLE_TIMING != 0 {
        return Err(CUDA_ERROR_INVALID_HANDLE);
    }
    let (ra, rb) = (*a.state.inner.lock(), *b.state.inner.lock());
    if !ra.recorded || !rb.recorded {
        return Err(CUDA_ERROR_INVALID_HANDLE);
    }
    if !done(&a)? || !done(&b)? {
        return Err(CUDA_ERROR_NOT_READY);
    }
    // Re-read: the timestamps are written when the records complete.
    let (ta, tb) = (a.state.inner.lock().ts, b.state.inner.lock().ts);
    // SAFETY: `ms` is NULL or writable (this fn's contract).
    unsafe { out(ms, ((tb as f64 - ta as f64) / 1e6) as f32) }
}

driver_ptds! {
    fn cuEventRecord / cuEventRecord_ptsz(ev: CUevent, h: CUstream) |ptds| {
        record(ev, h, ptds)
    }
    fn cuEventRecordWithFlags / cuEventRecordWithFlags_ptsz(ev: CUevent, h: CUstream, _flags: u32) |ptds| {
        record(ev, h, ptds)
    }
}
