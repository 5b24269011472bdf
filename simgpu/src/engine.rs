//! The process's execution engine: stream queues executed on the modelled clock.
//!
//! Host threads enqueue operations; one engine thread per process starts each stream's head
//! operation once its dependencies are done, applies its effect (bytes are moved for real), gets
//! time on the device engine it needs, and completes it when the real clock reaches its modelled
//! end. A copy reserves its copy engine on the machine-wide timeline in shared memory; a compute
//! operation (kernel, device copy, memset) asks the device's scheduler between processes
//! (`crate::sched`), one per device at a time, and may run in several grants when it is
//! preempted at the end of a time slice.
//!
//! Start times are *modelled*: an operation is ready at max(enqueue time, end of the previous
//! operation of its stream, end of its dependencies) and starts when its engine is free (or, for
//! compute, when the scheduler gives it the engine), even if the engine thread got to it a little
//! later. So wake-up latency never adds up. The thread sleeps to the next deadline on a futex word
//! in the process's slot of the shared state, which host threads and other processes' scheduling
//! decisions bump to wake it.

use parking_lot::{Condvar, Mutex};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering::*;
use std::sync::Arc;

use crate::shared::{now_ns, Shared};

pub type StreamId = u64;

thread_local! {
    /// Set on the engine thread: operation effects run there and must never wait for the engine.
    static ON_ENGINE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Which engine of which device an operation occupies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resource {
    None,
    Compute(usize),
    H2D(usize),
    D2H(usize),
}

pub type Effect = Box<dyn FnOnce() + Send>;
/// Computes extra modelled time at the moment the operation starts (managed-memory faults).
pub type Extra = Box<dyn FnOnce(u64) -> u64 + Send>;

pub struct Op {
    pub resource: Resource,
    pub dur_ns: u64,
    pub extra: Option<Extra>,
    pub effect: Option<Effect>,
    /// (stream, sequence number) that must complete first.
    pub deps: Vec<(StreamId, u64)>,
    pub event: Option<Arc<EventState>>,
    pub is_kernel: bool,
    /// The kernel's name, kept only while `SIMGPU_KERNEL_TRACE` is set (for its lines).
    pub name: Option<Arc<str>>,
    /// Bytes a copy moves over PCIe (host-to-device and device-to-host copies), counted for
    /// NVML's PCIe throughput over the interval the copy engine moves them in.
    pub pcie_bytes: u64,
}

impl Op {
    pub fn new(resource: Resource, dur_ns: u64) -> Op {
        Op {
            resource,
            dur_ns,
            extra: None,
            effect: None,
            deps: Vec::new(),
            event: None,
            is_kernel: false,
            name: None,
            pcie_bytes: 0,
        }
    }
    pub fn marker() -> Op {
        Op::new(Resource::None, 0)
    }
    pub fn with_effect(mut self, f: impl FnOnce() + Send + 'static) -> Op {
        self.effect = Some(Box::new(f));
        self
    }
}

/// What an event knows: where it was last recorded and, once that completed, when.
#[derive(Default)]
pub struct EventState {
    pub inner: Mutex<EventRec>,
}

#[derive(Default, Clone, Copy)]
pub struct EventRec {
    pub stream: StreamId,
    pub seq: u64,
    /// Modelled time the record completed; 0 = not yet.
    pub ts: u64,
    pub recorded: bool,
}

struct Pending {
    seq: u64,
    enqueued: u64,
    op: Op,
}

#[derive(Default)]
struct StreamQ {
    ops: VecDeque<Pending>,
    submitted: u64,
    completed: u64,
    /// Modelled end of the last completed operation.
    completed_end: u64,
    /// Started and not yet completed: (seq, end, event).
    running: Option<(u64, u64, Option<Arc<EventState>>)>,
    executed: u64,
    destroy_when_idle: bool,
}

/// A compute operation served by its device's scheduler (`crate::sched`); at most one per device
/// at a time, so each grant starts where the previous one of this process ended.
struct Service {
    stream: StreamId,
    seq: u64,
    /// Modelled time from which it (or the rest of it, after a preemption) is ready.
    ready: u64,
    remaining: u64,
    /// Granted up to this time; None = waiting for the engine.
    grant_end: Option<u64>,
    /// While waiting: ask again at this time at the latest, or once the wake word moves from
    /// `word` (someone gave this process the engine, or there is new work).
    wait_until: u64,
    word: u32,
    event: Option<Arc<EventState>>,
    is_kernel: bool,
    name: Option<Arc<str>>,
    counted: bool,
    /// When it first became ready, and the intervals it ran in (for the kernel trace).
    queued: u64,
    /// When the host enqueued it (for the kernel trace).
    enqueued: u64,
    slices: Vec<(u64, u64)>,
}

struct State {
    streams: HashMap<StreamId, StreamQ>,
    next_id: StreamId,
    thread: bool,
    /// Per device: the compute operation being served.
    service: HashMap<usize, Service>,
    /// Devices whose compute engine this process was granted and has not given up: (device,
    /// end of its last grant).
    holding: HashMap<usize, u64>,
}

/// What the engine thread does outside its lock: start an operation, or ask the scheduler.
enum Step {
    Start(StreamId, Pending, u64),
    Serve(usize, Service),
    Idle(usize, u64),
}

/// What the engine needs of the machine, handed to it when it is built: the shared state, this
/// process's slot in it and the compute schedulers' parameters.
pub struct Machine {
    pub shared: &'static Shared,
    pub slot: usize,
    pub sched: crate::sched::Params,
    /// The process the slot belongs to: a forked child does not use its parent's slot.
    pub pid: u32,
}

pub struct Engine {
    st: Mutex<State>,
    done: Condvar,
    stall_after: Option<u64>,
    /// Wake word when no shared state is mapped (the process's slot word otherwise).
    local_wake: std::sync::atomic::AtomicU32,
    machine: Option<Machine>,
}

impl Engine {
    pub fn new(stall_after: Option<u64>, machine: Option<Machine>) -> Engine {
        Engine {
            machine,
            st: Mutex::new(State {
                streams: HashMap::new(),
                next_id: 1,
                thread: false,
                service: HashMap::new(),
                holding: HashMap::new(),
            }),
            done: Condvar::new(),
            stall_after,
            local_wake: std::sync::atomic::AtomicU32::new(0),
        }
    }

    /// The machine, in the process that built the engine.
    fn machine(&self) -> Option<&Machine> {
        self.machine
            .as_ref()
            .filter(|m| m.pid == std::process::id())
    }

    /// The futex word the engine thread sleeps on.
    fn wake_word(&'static self) -> &'static std::sync::atomic::AtomicU32 {
        match self.machine() {
            Some(s) => &s.shared.slot(s.slot).wake,
            None => &self.local_wake,
        }
    }

    fn notify(&'static self) {
        let w = self.wake_word();
        w.fetch_add(1, AcqRel);
        crate::shared::futex_wake(w);
    }

    pub fn create_stream(&self) -> StreamId {
        let mut st = self.st.lock();
        let id = st.next_id;
        st.next_id += 1;
        st.streams.insert(id, StreamQ::default());
        id
    }

    /// Forgets the stream once its queued work has completed.
    pub fn destroy_stream(&self, id: StreamId) {
        let mut st = self.st.lock();
        if let Some(q) = st.streams.get_mut(&id) {
            if q.ops.is_empty() && q.running.is_none() {
                st.streams.remove(&id);
            } else {
                q.destroy_when_idle = true;
            }
        }
    }

    /// Enqueues `op`; returns its sequence number in the stream.
    pub fn enqueue(&'static self, id: StreamId, op: Op) -> u64 {
        let mut st = self.st.lock();
        if !st.thread {
            st.thread = true;
            std::thread::Builder::new()
                .name("simgpu-engine".into())
                .spawn(move || self.run())
                .expect("simgpu: cannot start engine thread");
        }
        let Some(q) = st.streams.get_mut(&id) else {
            return 0;
        };
        if let (Resource::Compute(d), Some(s)) = (op.resource, self.machine()) {
            // Before the operation is queued: a slice-end decision seeing 0 may not wait for us.
            s.shared.slot(s.slot).dev[d].queued.fetch_add(1, SeqCst);
        }
        q.submitted += 1;
        let seq = q.submitted;
        if let Some(ev) = &op.event {
            *ev.inner.lock() = EventRec {
                stream: id,
                seq,
                ts: 0,
                recorded: true,
            };
        }
        q.ops.push_back(Pending {
            seq,
            enqueued: now_ns(),
            op,
        });
        drop(st);
        self.notify();
        seq
    }

    /// Last sequence number submitted to the stream.
    pub fn tail(&self, id: StreamId) -> u64 {
        self.st.lock().streams.get(&id).map_or(0, |q| q.submitted)
    }

    pub fn is_done(&self, id: StreamId, seq: u64) -> bool {
        self.st
            .lock()
            .streams
            .get(&id)
            .is_none_or(|q| q.completed >= seq)
    }

    /// Blocks until operation `seq` of the stream has completed.
    pub fn wait(&self, id: StreamId, seq: u64) {
        let mut st = self.st.lock();
        while st.streams.get(&id).is_some_and(|q| q.completed < seq) {
            self.done.wait(&mut st);
        }
    }

    /// Blocks until every operation submitted so far to any of `ids` has completed.
    pub fn wait_all(&self, ids: &[StreamId]) {
        let targets: Vec<_> = {
            let st = self.st.lock();
            ids.iter()
                .filter_map(|id| st.streams.get(id).map(|q| (*id, q.submitted)))
                .collect()
        };
        for (id, seq) in targets {
            self.wait(id, seq);
        }
    }

    /// Blocks until every operation submitted so far to any stream of the process has completed
    /// (what `cuMemFree` and the other freeing calls wait for before memory goes away). Returns
    /// at once on the engine thread itself, where the caller is an operation that is running.
    pub fn drain(&self) {
        if ON_ENGINE.with(|e| e.get()) {
            return;
        }
        let targets: Vec<_> = {
            let st = self.st.lock();
            st.streams
                .iter()
                .map(|(id, q)| (*id, q.submitted))
                .collect()
        };
        for (id, seq) in targets {
            self.wait(id, seq);
        }
    }

    /// The engine thread.
    fn run(&'static self) {
        ON_ENGINE.with(|e| e.set(true));
        let sim = self.machine();
        let wake = self.wake_word();
        let mut st = self.st.lock();
        loop {
            let woken = wake.load(Acquire);
            let now = now_ns();

            // 1. Compute operations whose last grant has ended are complete; those preempted
            //    (or cut at a slice end) ask for the engine again from where they stopped.
            let mut finished = Vec::new();
            for (d, sv) in st.service.iter_mut() {
                match sv.grant_end {
                    Some(end) if end <= now && sv.remaining == 0 => finished.push(*d),
                    Some(end) if end <= now => {
                        sv.ready = end;
                        sv.grant_end = None;
                        sv.wait_until = 0;
                    }
                    _ => {}
                }
            }
            for d in finished {
                let sv = st.service.remove(&d).expect("listed above");
                if let Some(s) = sim {
                    let q = &s.shared.slot(s.slot).dev[d].queued;
                    let _ = q.fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1));
                }
                let end = sv.grant_end.unwrap_or(sv.ready);
                if sv.is_kernel || trace_file().is_some() {
                    trace_kernel(d, &sv);
                }
                if let Some(q) = st.streams.get_mut(&sv.stream) {
                    q.running = Some((sv.seq, end, sv.event));
                }
            }

            // 2. Complete what has ended by now.
            let mut completed_any = false;
            let mut gone = Vec::new();
            for (id, q) in st.streams.iter_mut() {
                if let Some((seq, end, ev)) = q.running.take() {
                    if end <= now {
                        q.completed = seq;
                        q.completed_end = end;
                        q.executed += 1;
                        if let Some(ev) = ev {
                            let mut r = ev.inner.lock();
                            if r.stream == *id && r.seq == seq {
                                r.ts = end;
                            }
                        }
                        completed_any = true;
                        if q.destroy_when_idle && q.ops.is_empty() {
                            gone.push(*id);
                        }
                    } else {
                        q.running = Some((seq, end, ev));
                    }
                }
            }
            for id in gone {
                st.streams.remove(&id);
            }
            if completed_any {
                self.done.notify_all();
            }

            // 3. Pick every stream head that may start. A compute operation goes to its
            //    device's scheduler, one per device at a time: the one ready first.
            let mut steps = Vec::new();
            let mut compute: HashMap<usize, (u64, StreamId)> = HashMap::new();
            let ids: Vec<StreamId> = st.streams.keys().copied().collect();
            for id in ids {
                let q = &st.streams[&id];
                if q.running.is_some()
                    || q.ops.is_empty()
                    || self.stall_after.is_some_and(|n| q.executed >= n)
                {
                    continue;
                }
                let head = &q.ops[0];
                let mut earliest = head.enqueued.max(q.completed_end);
                let mut ready = true;
                for (dep, dseq) in &head.op.deps {
                    match st.streams.get(dep) {
                        Some(d) if d.completed < *dseq => ready = false,
                        Some(d) => earliest = earliest.max(d.completed_end),
                        None => {}
                    }
                }
                if !ready {
                    continue;
                }
                if let (Resource::Compute(d), Some(_)) = (head.op.resource, sim) {
                    if !st.service.contains_key(&d) {
                        let e = compute.entry(d).or_insert((earliest, id));
                        if (earliest, id) < *e {
                            *e = (earliest, id);
                        }
                    }
                    continue;
                }
                let q = st.streams.get_mut(&id).unwrap();
                let p = q.ops.pop_front().unwrap();
                q.running = Some((p.seq, u64::MAX, None));
                steps.push(Step::Start(id, p, earliest));
            }
            for (d, (earliest, id)) in compute {
                let q = st.streams.get_mut(&id).unwrap();
                let p = q.ops.pop_front().unwrap();
                q.running = Some((p.seq, u64::MAX, None));
                steps.push(Step::Start(id, p, earliest));
                // Reserve the device's service slot until the op is installed below.
                st.service.insert(d, placeholder());
            }
            // Operations waiting for the engine, or for the rest of it, ask (again).
            for (d, sv) in st.service.iter_mut() {
                if sv.grant_end.is_none()
                    && sv.stream != 0
                    && (sv.wait_until <= now || sv.word != woken)
                {
                    let sv = std::mem::replace(sv, placeholder());
                    steps.push(Step::Serve(*d, sv));
                }
            }
            // A device this process holds, with no compute work ready: give it up. Not while
            // other operations start (an event record between two kernels is work too).
            let starting = steps.iter().any(|s| matches!(s, Step::Start(..)));
            let idle: Vec<(usize, u64)> = st
                .holding
                .iter()
                .filter(|(d, end)| !starting && **end <= now && !st.service.contains_key(d))
                .map(|(d, end)| (*d, *end))
                .collect();
            for (d, end) in idle {
                st.holding.remove(&d);
                steps.push(Step::Idle(d, end));
            }

            if steps.is_empty() {
                let next = st
                    .streams
                    .values()
                    .filter_map(|q| q.running.as_ref().map(|r| r.1))
                    .chain(
                        st.service
                            .values()
                            .map(|sv| sv.grant_end.unwrap_or(sv.wait_until)),
                    )
                    .filter(|t| *t != u64::MAX)
                    .min();
                drop(st);
                crate::shared::futex_wait(wake, woken, next);
                st = self.st.lock();
                continue;
            }

            // 4. Outside the lock: start operations (move bytes, reserve copy engines) and ask
            //    the schedulers.
            drop(st);
            let mut started = Vec::new();
            let mut served = Vec::new();
            for step in steps {
                match step {
                    Step::Start(id, mut p, earliest) => {
                        let extra = p.op.extra.take().map_or(0, |f| f(earliest));
                        let dur = p.op.dur_ns + extra;
                        if let Some(f) = p.op.effect.take() {
                            f();
                        }
                        let end = match (p.op.resource, sim) {
                            (Resource::Compute(d), Some(s)) => {
                                let sv = Service {
                                    stream: id,
                                    seq: p.seq,
                                    ready: earliest,
                                    remaining: dur,
                                    grant_end: None,
                                    wait_until: 0,
                                    word: 0,
                                    event: p.op.event.take(),
                                    is_kernel: p.op.is_kernel,
                                    name: p.op.name.take(),
                                    counted: false,
                                    queued: earliest,
                                    enqueued: p.enqueued,
                                    slices: Vec::new(),
                                };
                                served.push((d, serve(s, d, sv)));
                                continue;
                            }
                            (Resource::None, _) | (_, None) => earliest + dur,
                            (Resource::H2D(d), Some(s)) => {
                                let dv = s.shared.dev(d);
                                let (t0, t1) = Shared::reserve(&dv.h2d_busy_until, earliest, dur);
                                dv.pcie_rx.add_spread(t0, t1, p.op.pcie_bytes);
                                trace_copy(
                                    "h2d",
                                    d,
                                    id,
                                    p.seq,
                                    earliest,
                                    (t0, t1),
                                    p.op.pcie_bytes,
                                );
                                t1
                            }
                            (Resource::D2H(d), Some(s)) => {
                                let dv = s.shared.dev(d);
                                let (t0, t1) = Shared::reserve(&dv.d2h_busy_until, earliest, dur);
                                dv.pcie_tx.add_spread(t0, t1, p.op.pcie_bytes);
                                trace_copy(
                                    "d2h",
                                    d,
                                    id,
                                    p.seq,
                                    earliest,
                                    (t0, t1),
                                    p.op.pcie_bytes,
                                );
                                t1
                            }
                        };
                        started.push((id, p.seq, end, p.op.event.take()));
                    }
                    Step::Serve(d, sv) => {
                        if let Some(s) = sim {
                            served.push((d, serve(s, d, sv)));
                        }
                    }
                    Step::Idle(d, end) => {
                        if let Some(s) = sim {
                            let mut g = s.shared.lock_sched(d);
                            crate::sched::idle(&mut g, s.sched, s.slot, end, now_ns());
                        }
                    }
                }
            }
            st = self.st.lock();
            for (id, seq, end, ev) in started {
                if let Some(q) = st.streams.get_mut(&id) {
                    q.running = Some((seq, end, ev));
                }
            }
            for (d, mut sv) in served {
                sv.word = woken;
                if let Some(end) = sv.grant_end {
                    st.holding.insert(d, end);
                }
                st.service.insert(d, sv);
            }
        }
    }
}

/// Holds a device's service slot while its operation is outside the lock (stream 0 is never a
/// stream id).
fn placeholder() -> Service {
    Service {
        stream: 0,
        seq: 0,
        ready: 0,
        remaining: 0,
        grant_end: Some(u64::MAX),
        wait_until: u64::MAX,
        word: 0,
        event: None,
        is_kernel: false,
        name: None,
        counted: false,
        queued: 0,
        enqueued: 0,
        slices: Vec::new(),
    }
}

/// Real time after a slice end at which its decision is made: longer than an engine thread's
/// usual wake-up latency (timer slack is 50 µs), so work that became ready before the slice end
/// is seen (`crate::sched::Params::decide_after`).
const DECIDE_AFTER_NS: u64 = 250_000;

pub fn sched_params(cost: &crate::config::CostModel) -> crate::sched::Params {
    crate::sched::Params {
        slice: cost.timeslice_ns,
        switch: cost.ctx_switch_ns,
        decide_after: DECIDE_AFTER_NS,
        lease: cost.timeslice_ns,
    }
}

/// Asks device `d`'s scheduler for the engine for `sv`; on a grant, accounts the busy time.
fn serve(s: &Machine, d: usize, mut sv: Service) -> Service {
    let decision = {
        let mut g = s.shared.lock_sched(d);
        crate::sched::request(&mut g, s.sched, s.slot, sv.ready, sv.remaining, now_ns())
    };
    match decision {
        crate::sched::Decision::Wait { until } => {
            sv.grant_end = None;
            sv.wait_until = until;
        }
        crate::sched::Decision::Run { start, end } => {
            let dev = s.shared.dev(d);
            let pd = &s.shared.slot(s.slot).dev[d];
            if sv.is_kernel && !sv.counted {
                dev.kernels.fetch_add(1, AcqRel);
                pd.kernels.fetch_add(1, AcqRel);
            }
            sv.counted = true;
            let ran = end - start;
            dev.busy_ns.fetch_add(ran, AcqRel);
            pd.busy_ns.fetch_add(ran, AcqRel);
            if ran > 0 {
                dev.window.add(start, end);
                pd.window.add(start, end);
            }
            sv.remaining -= ran.min(sv.remaining);
            sv.grant_end = Some(end);
            if trace_file().is_some() {
                sv.slices.push((start, end));
            }
        }
    }
    sv
}

/// `SIMGPU_KERNEL_TRACE`: one JSON line per kernel (and per other compute operation or copy)
/// with every interval it ran in.
pub(crate) fn trace_file() -> Option<&'static std::fs::File> {
    static FILE: std::sync::OnceLock<Option<std::fs::File>> = std::sync::OnceLock::new();
    FILE.get_or_init(|| {
        let path = std::env::var_os("SIMGPU_KERNEL_TRACE")?;
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .ok()
    })
    .as_ref()
}

/// A copy's line in the `SIMGPU_KERNEL_TRACE` file: its copy engine's interval.
fn trace_copy(
    kind: &str,
    d: usize,
    stream: StreamId,
    seq: u64,
    ready: u64,
    (a, b): (u64, u64),
    bytes: u64,
) {
    use std::io::Write;
    let Some(mut f) = trace_file() else { return };
    let line = format!(
        "{{\"pid\":{},\"dev\":{d},\"op\":\"{kind}\",\"bytes\":{bytes},\"stream\":{stream},\"seq\":{seq},\"ready\":{ready},\"slices\":[[{a},{b}]]}}\n",
        std::process::id(),
    );
    let _ = f.write_all(line.as_bytes());
}

fn trace_kernel(d: usize, sv: &Service) {
    use std::io::Write;
    let Some(mut f) = trace_file() else { return };
    let slices: Vec<String> = sv
        .slices
        .iter()
        .map(|(a, b)| format!("[{a},{b}]"))
        .collect();
    // One write(2) per line, so lines of concurrent processes stay whole (O_APPEND).
    // Kernel names are C identifiers (mangled or not); anything else is dropped, not escaped.
    let name: String = sv.name.as_deref().map_or(String::new(), |n| {
        let n: String = n
            .chars()
            .filter(|c| c.is_ascii_graphic() && !matches!(c, '"' | '\\'))
            .collect();
        format!("\"name\":\"{n}\",")
    });
    let line = format!(
        "{{\"pid\":{},\"dev\":{d},{}{name}\"stream\":{},\"seq\":{},\"enqueued\":{},\"ready\":{},\"slices\":[{}]}}\n",
        std::process::id(),
        if sv.is_kernel { "" } else { "\"op\":\"compute\"," },
        sv.stream,
        sv.seq,
        sv.enqueued,
        sv.queued,
        slices.join(",")
    );
    let _ = f.write_all(line.as_bytes());
}
