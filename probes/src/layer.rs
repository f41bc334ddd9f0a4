//! The tracing Layer: times stage spans and sends one small record per span.
//!
//! The lean path: no span extensions (a lock and a map per span), no allocation. Open stage
//! spans live in a small per-thread table keyed by span id; `enter` stamps the start, `exit`
//! computes the duration and `try_send`s one [`SpanRecord`].

use crate::clock;
use crate::event::{Event, SpanRecord, NONE};
use crate::probe::Probe;
use crate::stage::Stage;
use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use tracing_core::field::{Field, Visit};
use tracing_core::span::{Attributes, Id, Record};
use tracing_core::Subscriber;
use tracing_subscriber::layer::{Context, Layer};

/// Open stage spans a thread can hold at once (nesting depth plus created-not-entered).
const SLOTS: usize = 16;

static NEXT_THREAD: AtomicU32 = AtomicU32::new(1);
static THREAD_NAMES: Mutex<Vec<(u32, String)>> = Mutex::new(Vec::new());

/// Every thread that has sent a span so far: (probes thread id, name). The same names also
/// travel as [`Event::Thread`]; this registry is for readers that missed one (a full channel,
/// a client that attached late).
pub fn thread_names() -> Vec<(u32, String)> {
    THREAD_NAMES.lock().map(|v| v.clone()).unwrap_or_default()
}

#[derive(Clone, Copy)]
struct Open {
    id: u64,
    stage: Stage,
    start_ns: u64,
    cpu_start: u64,
    step: u64,
    sample: u64,
    bytes: u64,
}

struct Local {
    open: [Option<Open>; SLOTS],
    next_victim: usize,
}

thread_local! {
    static LOCAL: RefCell<Local> = const { RefCell::new(Local { open: [None; SLOTS], next_victim: 0 }) };
    static THREAD_ID: Cell<u32> = const { Cell::new(0) };
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

    fn thread_id(&self) -> u32 {
        THREAD_ID.with(|t| {
            let id = t.get();
            if id != 0 {
                return id;
            }
            let id = NEXT_THREAD.fetch_add(1, Ordering::Relaxed);
            t.set(id);
            let name = match std::thread::current().name() {
                Some(n) => n.to_string(),
                None => format!("thread-{id}"),
            };
            if let Ok(mut names) = THREAD_NAMES.lock() {
                names.push((id, name.clone()));
            }
            // Never blocks, like every send from here: a lost name is still in the registry.
            self.probe.send(Event::Thread { id, name: name.into_boxed_str() });
            id
        })
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

fn with_open<R>(id: &Id, f: impl FnOnce(&mut Open) -> R) -> Option<R> {
    let key = id.into_u64();
    LOCAL.with(|l| {
        let mut l = l.borrow_mut();
        l.open.iter_mut().flatten().find(|o| o.id == key).map(f)
    })
}

impl<S: Subscriber> Layer<S> for ProbeLayer {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, _ctx: Context<'_, S>) {
        let Some(stage) = Stage::from_name(attrs.metadata().name()) else {
            return;
        };
        let mut open =
            Open { id: id.into_u64(), stage, start_ns: 0, cpu_start: NONE, step: NONE, sample: NONE, bytes: NONE };
        attrs.record(&mut Fields(&mut open));
        LOCAL.with(|l| {
            let mut l = l.borrow_mut();
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
        with_open(id, |o| values.record(&mut Fields(o)));
    }

    fn on_enter(&self, id: &Id, _ctx: Context<'_, S>) {
        with_open(id, |o| {
            if o.stage.takes_cpu_time() {
                o.cpu_start = clock::thread_cpu_ns();
            }
            o.start_ns = clock::now_ns();
        });
    }

    fn on_exit(&self, id: &Id, _ctx: Context<'_, S>) {
        let end = clock::now_ns();
        let Some(open) = with_open(id, |o| *o) else {
            return;
        };
        let cpu_ns = if open.cpu_start == NONE { NONE } else { clock::thread_cpu_ns().saturating_sub(open.cpu_start) };
        let thread = self.thread_id();
        self.probe.send(Event::Span(SpanRecord {
            stage: open.stage,
            thread,
            start_ns: open.start_ns,
            dur_ns: end.saturating_sub(open.start_ns),
            cpu_ns,
            step: open.step,
            sample: open.sample,
            bytes: open.bytes,
        }));
    }

    fn on_close(&self, id: Id, _ctx: Context<'_, S>) {
        let key = id.into_u64();
        LOCAL.with(|l| {
            let mut l = l.borrow_mut();
            if let Some(slot) = l.open.iter_mut().find(|o| matches!(o, Some(o) if o.id == key)) {
                *slot = None;
            }
        });
    }
}
