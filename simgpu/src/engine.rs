//! The process's execution engine: stream queues executed on the modelled clock.
//!
//! Host threads enqueue operations; one engine thread per process starts each stream's head
//! operation once its dependencies are done, reserves the device engine it needs (compute, or
//! one of the two copy engines) on the machine-wide timeline in shared memory, applies its effect
//! (bytes are moved for real), and completes it when the real clock reaches its modelled end.
//!
//! Start times are *modelled*: an operation starts at max(enqueue time, end of the previous
//! operation of its stream, end of its dependencies, time its engine is free), even if the engine
//! thread got to it a little later. So wake-up latency never adds up, while operations of different
//! processes still interleave in the order they asked for the device and never overlap.

use parking_lot::{Condvar, Mutex};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering::*;
use std::sync::Arc;
use std::time::{Duration, Instant};

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

struct State {
    streams: HashMap<StreamId, StreamQ>,
    next_id: StreamId,
    thread: bool,
}

pub struct Engine {
    st: Mutex<State>,
    work: Condvar,
    done: Condvar,
    stall_after: Option<u64>,
}

impl Engine {
    pub fn new(stall_after: Option<u64>) -> Engine {
        Engine {
            st: Mutex::new(State {
                streams: HashMap::new(),
                next_id: 1,
                thread: false,
            }),
            work: Condvar::new(),
            done: Condvar::new(),
            stall_after,
        }
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
        self.work.notify_one();
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
        let sim = crate::sim::get();
        let mut st = self.st.lock();
        loop {
            // 1. Complete what has ended by now.
            let now = now_ns();
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

            // 2. Pick every stream head that may start.
            let mut starts = Vec::new();
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
                let q = st.streams.get_mut(&id).unwrap();
                let p = q.ops.pop_front().unwrap();
                q.running = Some((p.seq, u64::MAX, None));
                starts.push((id, p, earliest));
            }

            if starts.is_empty() {
                let next = st
                    .streams
                    .values()
                    .filter_map(|q| q.running.as_ref().map(|r| r.1))
                    .min();
                match next {
                    None => self.work.wait(&mut st),
                    Some(t) => {
                        let d = t.saturating_sub(now_ns());
                        if d > 0 {
                            self.work
                                .wait_until(&mut st, Instant::now() + Duration::from_nanos(d));
                        }
                    }
                }
                continue;
            }

            // 3. Start them, outside the lock: reserve time, move bytes.
            drop(st);
            let mut started = Vec::with_capacity(starts.len());
            for (id, mut p, earliest) in starts {
                let extra = p.op.extra.take().map_or(0, |f| f(earliest));
                let dur = p.op.dur_ns + extra;
                let (start, end) = match (p.op.resource, sim) {
                    (Resource::None, _) | (_, None) => (earliest, earliest + dur),
                    (Resource::Compute(d), Some(s)) => {
                        let dev = s.shared.dev(d);
                        let (a, b) = Shared::reserve(&dev.compute_busy_until, earliest, dur);
                        if p.op.is_kernel {
                            dev.kernels.fetch_add(1, AcqRel);
                            s.shared.slot(s.slot).dev[d].kernels.fetch_add(1, AcqRel);
                        }
                        dev.busy_ns.fetch_add(dur, AcqRel);
                        dev.window.add(a, b);
                        let pd = &s.shared.slot(s.slot).dev[d];
                        pd.busy_ns.fetch_add(dur, AcqRel);
                        pd.window.add(a, b);
                        (a, b)
                    }
                    (Resource::H2D(d), Some(s)) => {
                        Shared::reserve(&s.shared.dev(d).h2d_busy_until, earliest, dur)
                    }
                    (Resource::D2H(d), Some(s)) => {
                        Shared::reserve(&s.shared.dev(d).d2h_busy_until, earliest, dur)
                    }
                };
                let _ = start;
                if let Some(f) = p.op.effect.take() {
                    f();
                }
                started.push((id, p.seq, end, p.op.event.take()));
            }
            st = self.st.lock();
            for (id, seq, end, ev) in started {
                if let Some(q) = st.streams.get_mut(&id) {
                    q.running = Some((seq, end, ev));
                }
            }
        }
    }
}
