//! The tracing Layer: times stage spans and sends small records in per-thread batches.
//!
//! The lean path: no span extensions (a lock and a map per span) and one thread-local access
//! per callback. Open stage spans live in a small per-thread table keyed by span id; `enter`
//! stamps the start, `exit` computes the duration and appends one [`SpanRecord`] to a
//! per-thread batch. The batch is sent with one `try_send` when it holds [`BATCH`] records,
//! [`FLUSH_NS`] after the thread's previous send, or when the thread exits: the channel's
//! cross-core traffic is paid once per batch, not per span. A training loop's step records
//! ([`record_step`]) wait in the same batch, after the spans they follow: sent one by one,
//! each would wake the channel's reader (a system call, and an interrupt to its core) on
//! every step.

use crate::clock;
use crate::event::{Event, SpanRecord, StepRecord, NONE};
use crate::probe::Probe;
use crate::role::ThreadRole;
use crate::stage::Stage;
use std::cell::RefCell;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use tracing_core::field::{Field, Visit};
use tracing_core::span::{Attributes, Id, Record};
use tracing_core::Subscriber;
use tracing_subscriber::layer::{Context, Layer};

/// Open stage spans a thread can hold at once (nesting depth plus created-not-entered).
const SLOTS: usize = 16;
/// Records per batch.
pub const BATCH: usize = 64;
/// A thread's records wait at most this long after its previous send (checked at span exit).
pub const FLUSH_NS: u64 = 5_000_000;

static NEXT_THREAD: AtomicU32 = AtomicU32::new(1);
static THREAD_NAMES: Mutex<Vec<(u32, String, ThreadRole)>> = Mutex::new(Vec::new());

/// Every thread that has sent a span so far: (probes thread id, name). The same names also
/// travel as [`Event::Thread`]; this registry is for readers that missed one (a full channel,
/// a client that attached late).
pub fn thread_names() -> Vec<(u32, String)> {
    THREAD_NAMES.lock().map(|v| v.iter().map(|(id, name, _)| (*id, name.clone())).collect()).unwrap_or_default()
}

/// The roles of the threads in [`thread_names`] that have one (not [`ThreadRole::Other`]).
pub fn thread_roles() -> Vec<(u32, ThreadRole)> {
    THREAD_NAMES
        .lock()
        .map(|v| v.iter().filter(|(_, _, role)| !role.is_other()).map(|(id, _, role)| (*id, *role)).collect())
        .unwrap_or_default()
}

/// Every thread that has sent a span so far, with its role: (probes thread id, name, role).
pub fn threads() -> Vec<(u32, String, ThreadRole)> {
    THREAD_NAMES.lock().map(|v| v.clone()).unwrap_or_default()
}

#[derive(Clone, Copy)]
struct Open {
    id: u64,
    stage: Stage,
    start_ns: u64,
    cpu_start: u64,
    queue_start: u64,
    step: u64,
    sample: u64,
    bytes: u64,
}

/// Everything the Layer keeps per thread.
struct Local {
    open: [Option<Open>; SLOTS],
    next_victim: usize,
    thread: u32,
    buf: Vec<SpanRecord>,
    /// Step records sent after `buf`'s spans.
    steps: Vec<StepRecord>,
    probe: Option<Probe>,
    last_send_ns: u64,
    /// Wall clock, CPU clock and run-queue wait at the last exit of a CPU-timed span.
    last_exit: (u64, u64, u64),
}

/// A CPU-timed span entered within this long of the previous one's exit reuses that CPU
/// clock and run-queue reading: back-to-back stages (read → decode → resize) then cost one
/// reading per boundary instead of two.
const REUSE_CPU_READING_NS: u64 = 2_000;

impl Local {
    fn find(&mut self, id: u64) -> Option<&mut Open> {
        self.open.iter_mut().flatten().find(|o| o.id == id)
    }

    fn flush(&mut self) {
        if let Some(p) = &self.probe {
            if !self.buf.is_empty() {
                p.send_spans(std::mem::replace(&mut self.buf, p.spare_batch()));
            }
            for step in self.steps.drain(..) {
                p.send(Event::Step(step));
            }
        }
    }

    /// Switches the thread to `probe` (its batch so far goes to the old one first).
    fn route(&mut self, probe: &Probe, now: u64) {
        if !self.probe.as_ref().is_some_and(|q| q.same_channel(probe)) {
            self.flush();
            self.probe = Some(probe.clone());
            self.last_send_ns = now;
        }
    }

    /// Sends the batch when it is full or [`FLUSH_NS`] old at `now`.
    fn send_if_due(&mut self, now: u64) {
        if self.buf.len() + self.steps.len() >= BATCH || now.saturating_sub(self.last_send_ns) >= FLUSH_NS {
            self.last_send_ns = now;
            self.flush();
        }
    }

    /// Buffers `rec` as this thread's (its id filled in) for `probe`, and sends the batch when
    /// it is full or a few milliseconds old. A thread that now reports to another probe hands
    /// its old batch to the old one first.
    fn push(&mut self, probe: &Probe, mut rec: SpanRecord) {
        let end = rec.end_ns();
        self.route(probe, end);
        rec.thread = self.thread_id(probe);
        if self.buf.capacity() == 0 {
            self.buf.reserve_exact(BATCH);
        }
        self.buf.push(rec);
        self.send_if_due(end);
    }

    fn thread_id(&mut self, probe: &Probe) -> u32 {
        if self.thread != 0 {
            return self.thread;
        }
        let id = NEXT_THREAD.fetch_add(1, Ordering::Relaxed);
        self.thread = id;
        let given = NAME.try_with(|n| n.borrow_mut().take()).ok().flatten();
        let name = match given.as_deref().or(std::thread::current().name()) {
            Some(n) => n.to_string(),
            None => format!("thread-{id}"),
        };
        let role = thread_role();
        remember_name(id, &name, role);
        // Never blocks, like every send from here: a lost name is still in the registry.
        probe.send(Event::Thread { id, name: name.into_boxed_str(), role });
        id
    }
}

impl Drop for Local {
    fn drop(&mut self) {
        self.flush();
    }
}

thread_local! {
    static LOCAL: RefCell<Local> = const {
        RefCell::new(Local {
            open: [None; SLOTS],
            next_victim: 0,
            thread: 0,
            buf: Vec::new(),
            steps: Vec::new(),
            probe: None,
            last_send_ns: 0,
            last_exit: (0, 0, 0),
        })
    };
}

thread_local! {
    /// A name given with [`name_thread`], used when the thread announces itself.
    static NAME: RefCell<Option<String>> = const { RefCell::new(None) };
    /// The role given with [`set_thread_role`], announced with the name.
    static ROLE: std::cell::Cell<ThreadRole> = const { std::cell::Cell::new(ThreadRole::Other) };
}

/// Gives the calling thread its role, before its first span: its announcement
/// ([`Event::Thread`]) carries it, and this process's host sampler reads it. A thread that has
/// already sent spans gets a new id under the new role, as with [`name_thread`].
pub fn set_thread_role(role: ThreadRole) {
    let _ = ROLE.try_with(|r| r.set(role));
    crate::role::remember_os_role(role);
    announce_again();
}

/// The calling thread's role ([`ThreadRole::Other`] unless [`set_thread_role`] gave one).
fn thread_role() -> ThreadRole {
    ROLE.try_with(std::cell::Cell::get).unwrap_or_default()
}

/// A new probes thread id for a thread called `name` with `role`, in the registry
/// [`thread_names`] reads. The Layer calls it for each thread's first span; the attach server
/// calls it for the threads of the worker processes it relays, so their ids never collide with
/// ours.
pub fn register_thread(name: &str, role: ThreadRole) -> u32 {
    let id = NEXT_THREAD.fetch_add(1, Ordering::Relaxed);
    remember_name(id, name, role);
    id
}

/// Set in a forked child: there the registry's lock may have been held by a parent thread
/// at the moment of the fork, so it is only ever tried, never waited for.
static FORKED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn remember_name(id: u32, name: &str, role: ThreadRole) {
    let names = if FORKED.load(Ordering::Relaxed) { THREAD_NAMES.try_lock().ok() } else { THREAD_NAMES.lock().ok() };
    if let Some(mut names) = names {
        names.push((id, name.to_string(), role));
    }
}

/// Names the calling thread in every view. Threads that Rust's std did not start (a Python
/// thread, a C library's) have no name std knows. A thread that has already sent spans
/// gets a new id under the new name; its earlier spans keep the old one.
pub fn name_thread(name: &str) {
    let _ = NAME.try_with(|n| *n.borrow_mut() = Some(name.to_string()));
    announce_again();
}

/// The calling thread announces itself again at its next span (a new name or role).
fn announce_again() {
    with_local(|l| l.thread = 0);
}

/// In a child process right after `fork`: forget what the calling thread inherited from the
/// parent. Its buffered spans are the parent's (the parent sends them), and its id and the
/// thread registry are the parent's; nothing is sent to the parent's channel, whose reader
/// does not exist in the child.
pub fn forget_inherited_after_fork() {
    with_local(|l| {
        l.buf.clear();
        l.steps.clear();
        // The parent's channel: never sent to again, never dropped here either (dropping a
        // sender can wake a receiver through a lock another parent thread may have held).
        if let Some(p) = l.probe.take() {
            std::mem::forget(p);
        }
        l.thread = 0;
        l.open = [None; SLOTS];
    });
    FORKED.store(true, Ordering::Relaxed);
    // The calling thread is a new one here, with no role yet.
    let _ = ROLE.try_with(|r| r.set(ThreadRole::Other));
    crate::role::forget_after_fork();
    if let Ok(mut names) = THREAD_NAMES.try_lock() {
        names.clear();
    }
}

fn with_local<R>(f: impl FnOnce(&mut Local) -> R) -> Option<R> {
    LOCAL.try_with(|l| l.try_borrow_mut().ok().map(|mut l| f(&mut l))).ok().flatten()
}

/// Sends the calling thread's batched span records now. Threads flush on their own when a
/// batch fills, a few milliseconds pass, or the thread exits; call this before reading the
/// channel from the same thread, or before a long idle period.
pub fn flush_thread() {
    with_local(Local::flush);
}

/// Sends a span the caller timed itself (start and duration known, no CPU reading) as one of
/// the calling thread's, in the same per-thread batch as the Layer's spans: for spans that
/// can only be cut after the fact (a loop body less the copies to the device inside it).
/// `rec.thread` is replaced by the calling thread's id.
pub fn record(probe: &Probe, rec: SpanRecord) {
    with_local(|l| l.push(probe, rec));
}

/// Sends a step record with the calling thread's batch of spans (after the spans recorded
/// before it), as [`record`] does a span: a training loop's step costs no call to the
/// channel's reader of its own. Where the thread has no batch (its thread-local storage is
/// gone), the step is sent at once.
pub fn record_step(probe: &Probe, step: StepRecord) {
    let held = with_local(|l| {
        l.route(probe, step.end_ns);
        l.steps.push(step);
        l.send_if_due(step.end_ns);
    });
    if held.is_none() {
        probe.send(Event::Step(step));
    }
}

/// Times spans whose names are [`Stage`] names and sends them through a [`Probe`].
pub struct ProbeLayer {
    probe: Probe,
}

impl ProbeLayer {
    /// A layer that sends through `probe`.
    pub fn new(probe: Probe) -> Self {
        ProbeLayer { probe }
    }
}

struct Fields<'a>(&'a mut Open);

impl Visit for Fields<'_> {
    fn record_u64(&mut self, field: &Field, value: u64) {
        match field.name() {
            "step" => self.0.step = value,
            "sample" => self.0.sample = value,
            "bytes" => self.0.bytes = value,
            _ => {}
        }
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        if value >= 0 {
            self.record_u64(field, value as u64);
        }
    }
    fn record_debug(&mut self, _field: &Field, _value: &dyn std::fmt::Debug) {}
}

impl<S: Subscriber> Layer<S> for ProbeLayer {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, _ctx: Context<'_, S>) {
        let Some(stage) = Stage::from_name(attrs.metadata().name()) else {
            return;
        };
        let mut open = Open {
            id: id.into_u64(),
            stage,
            start_ns: 0,
            cpu_start: NONE,
            queue_start: NONE,
            step: NONE,
            sample: NONE,
            bytes: NONE,
        };
        attrs.record(&mut Fields(&mut open));
        with_local(|l| {
            let slot = match l.open.iter().position(Option::is_none) {
                Some(i) => i,
                None => {
                    // Spans created and never closed on this thread: reuse the oldest slot.
                    let v = l.next_victim;
                    l.next_victim = (v + 1) % SLOTS;
                    v
                }
            };
            l.open[slot] = Some(open);
        });
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _ctx: Context<'_, S>) {
        with_local(|l| {
            if let Some(o) = l.find(id.into_u64()) {
                values.record(&mut Fields(o));
            }
        });
    }

    fn on_enter(&self, id: &Id, _ctx: Context<'_, S>) {
        with_local(|l| {
            let last = l.last_exit;
            if let Some(o) = l.find(id.into_u64()) {
                o.start_ns = clock::now_ns();
                if o.stage.takes_cpu_time() {
                    let reuse = o.start_ns.saturating_sub(last.0) < REUSE_CPU_READING_NS;
                    o.cpu_start = if reuse { last.1 } else { clock::thread_cpu_ns() };
                    if o.stage.takes_queue_time() {
                        o.queue_start =
                            if reuse && last.2 != NONE { last.2 } else { clock::thread_queue_ns().unwrap_or(NONE) };
                    }
                }
            }
        });
    }

    fn on_exit(&self, id: &Id, _ctx: Context<'_, S>) {
        let end = clock::now_ns();
        with_local(|l| {
            let Some(open) = l.find(id.into_u64()).map(|o| *o) else {
                return;
            };
            let (cpu_ns, queue_ns) = if open.cpu_start == NONE {
                (NONE, NONE)
            } else {
                let now_cpu = clock::thread_cpu_ns();
                let now_queue =
                    if open.stage.takes_queue_time() { clock::thread_queue_ns().unwrap_or(NONE) } else { NONE };
                l.last_exit = (clock::now_ns(), now_cpu, now_queue);
                let queue = if open.queue_start == NONE || now_queue == NONE {
                    NONE
                } else {
                    now_queue.saturating_sub(open.queue_start)
                };
                (now_cpu.saturating_sub(open.cpu_start), queue)
            };
            let rec = SpanRecord {
                stage: open.stage,
                thread: 0,
                start_ns: open.start_ns,
                dur_ns: end.saturating_sub(open.start_ns),
                cpu_ns,
                queue_ns,
                step: open.step,
                sample: open.sample,
                bytes: open.bytes,
            };
            l.push(&self.probe, rec);
        });
    }

    fn on_close(&self, id: Id, _ctx: Context<'_, S>) {
        let key = id.into_u64();
        with_local(|l| {
            if let Some(slot) = l.open.iter_mut().find(|o| matches!(o, Some(o) if o.id == key)) {
                *slot = None;
            }
        });
    }
}
