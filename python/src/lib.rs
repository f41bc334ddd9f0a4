//! `pipeprof._native`: the probes crate seen from Python.
//!
//! Everything that measures, batches, encodes and serves is the probes crate: Python spans
//! are real `tracing` spans timed by [`probes::ProbeLayer`] (thread CPU time included), the
//! server is [`probes::attach`], and a worker process sends through
//! [`probes::attach::producer`]. This file only holds the process-wide state and the
//! Python-facing types; `pipeprof/__init__.py` adds the Pythonic surface (fork hooks,
//! decorators, exit handlers).
//!
//! The layer is wrapped in a `reload` layer because a forked worker inherits the parent's
//! global subscriber (it cannot be installed twice) but must send to its own producer.
//!
//! Span and step calls keep the GIL: each is a few hundred nanoseconds, less than releasing
//! and retaking it, and holding it means no span callback is ever in flight while Python
//! forks (fork runs with the GIL held), so a child never inherits a half-taken lock.

use probes::attach::{self, producer, wire, Options, Session};
use probes::sampler::SamplerConfig;
use probes::{clock, Event, Probe, ProbeLayer, Stage, StepRecord, ThreadRole};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use std::cell::Cell;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::{reload, Registry};

mod fetch;
mod term;
mod torch_loop;

type LayerHandle = reload::Handle<ProbeLayer, Registry>;

/// What this process is to pipeprof.
enum Role {
    /// Not initialised: spans are created but go nowhere.
    Off,
    /// The profiled program: serves `pipeprof attach`.
    Parent(Box<Session>),
    /// A worker process: sends to its parent's server.
    Worker(producer::Producer),
}

struct State {
    role: Role,
    layer: Option<LayerHandle>,
    probe: Option<Probe>,
}

static STATE: Mutex<State> = Mutex::new(State { role: Role::Off, layer: None, probe: None });

thread_local! {
    /// Whether this thread has given the Layer its Python name.
    static NAMED: Cell<bool> = const { Cell::new(false) };
}

fn state() -> PyResult<std::sync::MutexGuard<'static, State>> {
    STATE.lock().map_err(|_| PyRuntimeError::new_err("pipeprof: internal state poisoned by an earlier panic"))
}

/// Points the Layer at `probe`, installing the global subscriber the first time.
fn route_to(st: &mut State, probe: Probe) -> PyResult<()> {
    match &st.layer {
        Some(handle) => handle
            .modify(|l| {
                // The old layer's probe may be a forked parent's: never dropped here (see
                // `probes::layer::forget_inherited_after_fork`).
                std::mem::forget(std::mem::replace(l, ProbeLayer::new(probe.clone())));
            })
            .map_err(|e| PyRuntimeError::new_err(format!("pipeprof: cannot switch the span layer: {e}")))?,
        None => {
            let (layer, handle) = reload::Layer::new(ProbeLayer::new(probe.clone()));
            let sub = tracing_subscriber::registry().with(layer);
            tracing::subscriber::set_global_default(sub).map_err(|_| {
                PyRuntimeError::new_err(
                    "pipeprof: another Rust extension in this process installed a global tracing subscriber; \
                     pipeprof cannot time spans next to it",
                )
            })?;
            st.layer = Some(handle);
        }
    }
    if let Some(old) = st.probe.replace(probe) {
        std::mem::forget(old);
    }
    Ok(())
}

/// Starts the attach server in this process; returns the address `pipeprof attach` uses.
/// `gpu=False` leaves the GPU unsampled (`--no-gpu`); `gpu_tree=True` counts the GPU use of
/// the processes started below this one as the run's, as `pipeprof run` does (a notebook
/// kernel's DataLoader workers). After [`finish`] it may be called again: a new run.
#[pyfunction]
#[pyo3(signature = (program, settings_json, listen=None, sample=true, hz=5.0, capacity=probes::DEFAULT_CAPACITY, gpu=true, gpu_tree=false))]
#[allow(clippy::too_many_arguments)]
fn init(
    py: Python<'_>,
    program: &str,
    settings_json: &str,
    listen: Option<String>,
    sample: bool,
    hz: f64,
    capacity: usize,
    gpu: bool,
    gpu_tree: bool,
) -> PyResult<String> {
    let settings: serde_json::Value = serde_json::from_str(settings_json)
        .map_err(|e| PyValueError::new_err(format!("pipeprof.init: settings are not JSON: {e}")))?;
    let mut st = state()?;
    match &st.role {
        Role::Parent(s) => return Ok(s.address().to_string()),
        Role::Worker(_) => {
            return Err(PyRuntimeError::new_err(
                "pipeprof.init: this process is a worker of an instrumented run; its spans already go to the parent",
            ))
        }
        Role::Off => {}
    }
    let (probe, rx) = Probe::new(capacity.max(1));
    route_to(&mut st, probe.clone())?;
    let mut opts = Options::new(program);
    opts.settings = settings;
    if listen.is_some() {
        opts.listen = listen;
    }
    opts.sampler = sample.then(|| SamplerConfig { hz, gpu, gpu_tree, ..SamplerConfig::default() });
    // Started with the GIL held: releasing it while holding the state lock would deadlock
    // against a thread that holds the GIL and calls `step` or opens its first span. Binding
    // a socket and starting threads is quick.
    let _ = py;
    let session = attach::start(opts, probe, rx).map_err(|e| PyRuntimeError::new_err(format!("pipeprof.init: {e}")))?;
    let address = session.address().to_string();
    st.role = Role::Parent(Box::new(session));
    Ok(address)
}

/// In a worker process (right after fork, or at start in a spawned one): send this
/// process's spans to the server at `address`. Whatever was inherited from a forked parent
/// is forgotten, never shut down: its threads do not exist in the child.
#[pyfunction]
#[pyo3(signature = (address, program, capacity=probes::DEFAULT_CAPACITY))]
fn connect_worker(py: Python<'_>, address: String, program: String, capacity: usize) -> PyResult<()> {
    let mut st = state()?;
    match std::mem::replace(&mut st.role, Role::Off) {
        Role::Parent(s) => std::mem::forget(s),
        Role::Worker(p) => std::mem::forget(p),
        Role::Off => {}
    }
    probes::layer::forget_inherited_after_fork();
    NAMED.with(|n| n.set(false));
    LOADER_WORKER.store(NO_WORKER, Ordering::Relaxed);
    let hello = wire::Hello::this_process(program, serde_json::Value::Null);
    // The connect may wait on the network: without the GIL, and without the state lock
    // (held across a GIL release it deadlocks against a thread calling `step`).
    drop(st);
    let connected = py.detach(move || producer::connect(&address, hello, capacity));
    let mut st = state()?;
    let prod = match connected {
        Ok(p) => p,
        Err(e) => {
            // Spans made from now on are dropped at once instead of filling the parent's
            // channel, which nobody reads in this process.
            let (nowhere, _) = Probe::new(1);
            route_to(&mut st, nowhere)?;
            return Err(PyRuntimeError::new_err(format!("pipeprof worker: {e}")));
        }
    };
    route_to(&mut st, prod.probe())?;
    st.role = Role::Worker(prod);
    Ok(())
}

/// Ends this process's part: a parent tells every viewer the run ended; a worker sends what
/// it buffered and says it is done. Safe to call twice.
///
/// A parent first gives connected workers up to `workers_timeout` seconds to finish
/// sending (a worker that exited a moment ago may still have spans in flight); one that
/// is alive and silent, or stopped, costs at most that, never a hang.
#[pyfunction]
#[pyo3(signature = (workers_timeout=1.0))]
fn finish(py: Python<'_>, workers_timeout: f64) -> PyResult<()> {
    let role = std::mem::replace(&mut state()?.role, Role::Off);
    probes::flush_thread();
    py.detach(move || match role {
        Role::Parent(s) => {
            let t = if workers_timeout.is_finite() { workers_timeout.clamp(0.0, 3600.0) } else { 0.0 };
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs_f64(t);
            // Connected workers get the time to deliver what they sent; ones that are alive
            // but quiet (persistent DataLoader workers idle at exit) end the wait once
            // nothing has arrived for a while, instead of holding the exit for the timeout.
            let quiet = std::time::Duration::from_millis(100);
            while s.producers() > 0 && std::time::Instant::now() < deadline && s.producers_quiet_for() < quiet {
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            s.finish()
        }
        Role::Worker(p) => p.finish(),
        Role::Off => {}
    });
    Ok(())
}

/// In a worker process: SIGTERM sends what this process buffered before it ends the
/// process as `SIG_DFL` would (see `term`). False where the program handles SIGTERM itself.
#[pyfunction]
fn flush_on_term() -> bool {
    term::flush_on_term(finish_worker_now)
}

/// A worker's producer finished from any thread, without the GIL: the state lock is only
/// tried (a thread of the program may hold it at the signal), for at most a second.
fn finish_worker_now() {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
    let role = loop {
        if let Ok(mut st) = STATE.try_lock() {
            break std::mem::replace(&mut st.role, Role::Off);
        }
        if std::time::Instant::now() >= deadline {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    };
    match role {
        Role::Worker(p) => p.finish(),
        // Not a worker's to end: put back as it was.
        other => {
            if let Ok(mut st) = STATE.try_lock() {
                st.role = other;
            } else {
                std::mem::forget(other);
            }
        }
    }
}

/// "parent", "worker" or "off".
#[pyfunction]
fn role() -> PyResult<&'static str> {
    Ok(match state()?.role {
        Role::Off => "off",
        Role::Parent(_) => "parent",
        Role::Worker(_) => "worker",
    })
}

/// The attach address (parent only).
#[pyfunction]
fn address() -> PyResult<Option<String>> {
    Ok(match &state()?.role {
        Role::Parent(s) => Some(s.address().to_string()),
        _ => None,
    })
}

/// Viewers attached now (parent only; 0 elsewhere).
#[pyfunction]
fn clients() -> PyResult<usize> {
    Ok(match &state()?.role {
        Role::Parent(s) => s.clients(),
        _ => 0,
    })
}

/// Waits (without the GIL) until `n` viewers are attached or `timeout` seconds pass;
/// returns whether they are. Parent only.
#[pyfunction]
#[pyo3(signature = (n=1, timeout=None))]
fn wait_for_clients(py: Python<'_>, n: usize, timeout: Option<f64>) -> PyResult<bool> {
    // inf (or a timeout past what a clock can hold) waits without a deadline; NaN or a
    // negative one does not wait.
    let deadline = match timeout {
        Some(t) if t.is_nan() => Some(std::time::Instant::now()),
        Some(t) => std::time::Duration::try_from_secs_f64(t.max(0.0))
            .ok()
            .and_then(|d| std::time::Instant::now().checked_add(d)),
        None => None,
    };
    loop {
        let enough = match &state()?.role {
            Role::Parent(s) => s.clients() >= n,
            _ => return Err(PyRuntimeError::new_err("pipeprof.wait_for_clients: call pipeprof.init() first")),
        };
        if enough {
            return Ok(true);
        }
        if deadline.is_some_and(|d| std::time::Instant::now() >= d) {
            return Ok(false);
        }
        py.check_signals()?;
        py.detach(|| std::thread::sleep(std::time::Duration::from_millis(5)));
    }
}

/// Worker processes connected now (parent only; 0 elsewhere).
#[pyfunction]
fn workers() -> PyResult<usize> {
    Ok(match &state()?.role {
        Role::Parent(s) => s.producers(),
        _ => 0,
    })
}

/// Events dropped so far because the channel was full.
#[pyfunction]
fn dropped() -> PyResult<u64> {
    Ok(state()?.probe.as_ref().map_or(0, Probe::dropped))
}

/// Sends the calling thread's batched spans now.
#[pyfunction]
fn flush() {
    probes::flush_thread();
}

/// Monotonic nanoseconds, the clock every event uses.
#[pyfunction]
fn now_ns() -> u64 {
    clock::now_ns()
}

/// Names the calling thread in every view; `worker`: it is that loader worker of a thread pool
/// (its role, [`ThreadRole::Loader`]).
#[pyfunction]
#[pyo3(signature = (name, worker=None))]
fn name_thread(name: &str, worker: Option<u32>) {
    if let Some(w) = worker {
        probes::set_thread_role(ThreadRole::loader(w));
    }
    probes::layer::name_thread(name);
    NAMED.with(|n| n.set(true));
}

/// No loader worker: [`LOADER_WORKER`] unset.
const NO_WORKER: u32 = u32::MAX;
/// The loader worker this process is (a DataLoader's, a Keras pool's), set by
/// [`loader_process`]: each of its threads announces itself with that role.
static LOADER_WORKER: AtomicU32 = AtomicU32::new(NO_WORKER);

/// This process is loader worker `worker` of its program: its threads' role, given before
/// their first span.
#[pyfunction]
fn loader_process(worker: u32) {
    LOADER_WORKER.store(worker.min(NO_WORKER - 1), Ordering::Relaxed);
}

/// Reports one finished training step.
#[pyfunction]
#[pyo3(signature = (step, epoch=0, images=0, loss=Some(0.0), correct=0, queued=0, validation=false, end_ns=None))]
#[allow(clippy::too_many_arguments)]
fn step(
    step: u64,
    epoch: u32,
    images: u32,
    loss: Option<f64>,
    correct: u32,
    queued: u32,
    validation: bool,
    end_ns: Option<u64>,
) -> PyResult<()> {
    // A NaN or infinite loss (a diverged run; 1e39 becomes inf in f32) is data: the wire
    // carries it as a word, and the report flags where training diverged. `None`: the loss
    // was not measured (left out of every mean, shown as `-`).
    let no_loss = loss.is_none();
    let loss = loss.unwrap_or(0.0) as f32;
    let rec = StepRecord {
        no_loss,
        step,
        epoch,
        images,
        loss,
        correct,
        end_ns: end_ns.unwrap_or_else(clock::now_ns),
        queued,
        validation,
    };
    // Sent with the thread's batch of spans: a step of its own would wake the reader.
    if let Some(p) = state()?.probe.clone() {
        probes::layer::record_step(&p, rec);
    }
    Ok(())
}

/// Sends a span timed by the caller: `stage` from `start_ns` (the [`now_ns`] clock) for
/// `dur_ns`, as the calling thread's. For spans cut after the fact (a loop body less the
/// device copies inside it, a sample's transforms summed by stage); `cpu_ns` is the thread's
/// CPU time over it when the caller measured it, `queue_ns` the thread's run-queue wait over
/// it ([`thread_queue_ns`] at both ends), so the span's off-CPU time splits into waiting for a
/// core and blocked.
#[pyfunction]
#[pyo3(signature = (stage, start_ns, dur_ns, step=None, cpu_ns=None, queue_ns=None))]
fn record(
    py: Python<'_>,
    stage: &str,
    start_ns: u64,
    dur_ns: u64,
    step: Option<u64>,
    cpu_ns: Option<u64>,
    queue_ns: Option<u64>,
) -> PyResult<()> {
    let stage = Stage::from_name(stage)
        .ok_or_else(|| PyValueError::new_err(format!("pipeprof.record: unknown stage {stage:?}")))?;
    // A thread whose only spans are recorded ones (a DataLoader worker timing whole samples)
    // is named like one that opens spans, not `thread-N`.
    name_this_thread(py);
    // A span longer than a day is a clock mix-up, not a measurement.
    if dur_ns > 86_400 * 1_000_000_000 {
        return Err(PyValueError::new_err(format!("pipeprof.record: duration {dur_ns} ns is over a day")));
    }
    let probe = state()?.probe.clone();
    if let Some(p) = probe {
        probes::layer::record(&p, span(stage, start_ns, dur_ns, step, cpu_ns, queue_ns));
    }
    Ok(())
}

/// A span timed by the caller, its clocks bounded by its wall time.
fn span(
    stage: Stage,
    start_ns: u64,
    dur_ns: u64,
    step: Option<u64>,
    cpu_ns: Option<u64>,
    queue_ns: Option<u64>,
) -> probes::SpanRecord {
    probes::SpanRecord {
        stage,
        thread: 0,
        start_ns,
        dur_ns,
        // On-CPU time cannot exceed the wall time it was measured in.
        cpu_ns: cpu_ns.map_or(probes::NONE, |c| c.min(dur_ns)),
        // Waiting for a core is off-CPU time: at most what the CPU clock left of the wall.
        queue_ns: match (queue_ns, cpu_ns) {
            (Some(q), Some(c)) => q.min(dur_ns.saturating_sub(c.min(dur_ns))),
            _ => probes::NONE,
        },
        step: step.unwrap_or(probes::NONE),
        sample: probes::NONE,
        bytes: probes::NONE,
    }
}

/// The calling thread's run-queue wait so far (ns: time runnable without a core, from
/// `/proc/thread-self/schedstat`), or `None` where the kernel does not say. Read at both ends of
/// a span timed by the caller and pass the difference to [`record`] as `queue_ns`.
#[pyfunction]
fn thread_queue_ns() -> Option<u64> {
    clock::thread_queue_ns()
}

/// Sends run settings learned while the program runs (a JSON object; later keys win).
#[pyfunction]
fn settings(settings_json: &str) -> PyResult<()> {
    let v: serde_json::Value = serde_json::from_str(settings_json)
        .map_err(|e| PyValueError::new_err(format!("pipeprof.settings: not JSON: {e}")))?;
    let probe = state()?.probe.clone();
    if let Some(p) = probe {
        p.send(Event::Settings(Box::new(v)));
    }
    Ok(())
}

/// Says the program failed, and why (an uncaught exception): the run's summary is marked failed.
#[pyfunction]
fn failed(why: &str) -> PyResult<()> {
    let probe = state()?.probe.clone();
    if let Some(p) = probe {
        probes::flush_thread();
        p.send_blocking(Event::Failed(why.into()));
    }
    Ok(())
}

/// The stage names a span may have.
#[pyfunction]
fn stages() -> Vec<&'static str> {
    Stage::ALL.iter().map(|s| s.name()).collect()
}

macro_rules! stage_span {
    ($name:literal, $f:expr) => {
        tracing::info_span!($name, step = $f.step, sample = $f.sample, bytes = $f.bytes)
    };
}

#[derive(Clone, Copy)]
struct Fields {
    step: Option<u64>,
    sample: Option<u64>,
    bytes: Option<u64>,
}

/// A real tracing span, one call site per stage (tracing needs static names).
fn new_span(stage: Stage, f: Fields) -> tracing::Span {
    match stage {
        Stage::Read => stage_span!("read", f),
        Stage::Fetch => stage_span!("fetch", f),
        Stage::Decode => stage_span!("decode", f),
        Stage::Resize => stage_span!("resize", f),
        Stage::Augment => stage_span!("augment", f),
        Stage::Convert => stage_span!("convert", f),
        Stage::Transform => stage_span!("transform", f),
        Stage::Collate => stage_span!("collate", f),
        Stage::Wait => stage_span!("wait", f),
        Stage::Transfer => stage_span!("transfer", f),
        Stage::Compute => stage_span!("compute", f),
        Stage::Forward => stage_span!("forward", f),
        Stage::Backward => stage_span!("backward", f),
        Stage::Optimizer => stage_span!("optimizer", f),
        Stage::Validate => stage_span!("validate", f),
    }
}

/// Gives the calling thread its Python name (once per thread): Python threads are not
/// started by Rust, so the Layer would only know them as `thread-N`.
fn name_this_thread(py: Python<'_>) {
    if NAMED.with(|n| n.replace(true)) {
        return;
    }
    let name = py
        .import("pipeprof")
        .and_then(|m| m.getattr("_thread_name"))
        .and_then(|f| f.call0())
        .and_then(|n| n.extract::<String>());
    let worker = LOADER_WORKER.load(Ordering::Relaxed);
    if worker != NO_WORKER {
        probes::set_thread_role(ThreadRole::loader(worker));
    }
    if let Ok(n) = name {
        probes::layer::name_thread(&n);
    }
}

/// A timed stage: `with pipeprof.span("decode", sample=i): ...`, or as a decorator.
#[pyclass(module = "pipeprof._native")]
struct Span {
    stage: Stage,
    fields: Fields,
    open: Option<tracing::Span>,
}

#[pymethods]
impl Span {
    #[new]
    #[pyo3(signature = (stage, *, step=None, sample=None, bytes=None))]
    fn new(stage: &str, step: Option<u64>, sample: Option<u64>, bytes: Option<u64>) -> PyResult<Self> {
        let stage = Stage::from_name(stage).ok_or_else(|| {
            let names: Vec<&str> = Stage::ALL.iter().map(|s| s.name()).collect();
            PyValueError::new_err(format!("pipeprof.span: unknown stage {stage:?}; stages are {}", names.join(", ")))
        })?;
        Ok(Span { stage, fields: Fields { step, sample, bytes }, open: None })
    }

    fn __enter__(mut slf: PyRefMut<'_, Self>) -> PyResult<PyRefMut<'_, Self>> {
        if slf.open.is_some() {
            return Err(PyRuntimeError::new_err("pipeprof.span: this span is already open; make a new one"));
        }
        name_this_thread(slf.py());
        let span = new_span(slf.stage, slf.fields);
        span.with_subscriber(|(id, d)| d.enter(id));
        slf.open = Some(span);
        Ok(slf)
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&mut self, _exc: &Bound<'_, PyTuple>) -> bool {
        if let Some(span) = self.open.take() {
            span.with_subscriber(|(id, d)| d.exit(id));
        }
        false
    }

    /// As a decorator: every call of the function is one span of this stage.
    fn __call__(slf: &Bound<'_, Self>, func: Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        let py = slf.py();
        Ok(py.import("pipeprof")?.getattr("_decorate")?.call1((slf, func))?.unbind())
    }

    /// The stage name.
    #[getter]
    fn stage(&self) -> &'static str {
        self.stage.name()
    }

    #[getter]
    fn step(&self) -> Option<u64> {
        self.fields.step
    }

    #[getter]
    fn sample(&self) -> Option<u64> {
        self.fields.sample
    }

    #[getter]
    fn bytes(&self) -> Option<u64> {
        self.fields.bytes
    }

    fn __repr__(&self) -> String {
        format!("pipeprof.span({:?}, step={:?}, sample={:?})", self.stage.name(), self.fields.step, self.fields.sample)
    }
}

/// Sends its thread's batched spans when it is freed. One lives in a `threading.local` per
/// Python thread: CPython frees it while clearing the ending thread's state, before
/// `Thread.join()` returns, whereas Rust's thread-local destructors (the Layer's own flush)
/// run only after that, when the OS thread exits, and could lose the last batch to a
/// `finish()` that came first.
#[pyclass(module = "pipeprof._native")]
struct ThreadFlusher;

#[pymethods]
impl ThreadFlusher {
    #[new]
    fn new() -> Self {
        ThreadFlusher
    }
}

impl Drop for ThreadFlusher {
    fn drop(&mut self) {
        probes::flush_thread();
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Span>()?;
    m.add_class::<ThreadFlusher>()?;
    m.add_class::<fetch::Batch>()?;
    m.add_class::<torch_loop::Loop>()?;
    m.add_class::<torch_loop::BackwardHook>()?;
    m.add_class::<torch_loop::BackwardMark>()?;
    m.add_class::<torch_loop::OptimizerHook>()?;
    for f in [
        wrap_pyfunction!(init, m)?,
        wrap_pyfunction!(connect_worker, m)?,
        wrap_pyfunction!(finish, m)?,
        wrap_pyfunction!(flush_on_term, m)?,
        wrap_pyfunction!(role, m)?,
        wrap_pyfunction!(address, m)?,
        wrap_pyfunction!(clients, m)?,
        wrap_pyfunction!(workers, m)?,
        wrap_pyfunction!(wait_for_clients, m)?,
        wrap_pyfunction!(dropped, m)?,
        wrap_pyfunction!(flush, m)?,
        wrap_pyfunction!(now_ns, m)?,
        wrap_pyfunction!(name_thread, m)?,
        wrap_pyfunction!(loader_process, m)?,
        wrap_pyfunction!(step, m)?,
        wrap_pyfunction!(stages, m)?,
        wrap_pyfunction!(record, m)?,
        wrap_pyfunction!(fetch::batch_spans, m)?,
        wrap_pyfunction!(torch_loop::fetched, m)?,
        wrap_pyfunction!(torch_loop::next::next_method, m)?,
        wrap_pyfunction!(fetch::fetch_method, m)?,
        wrap_pyfunction!(fetch::fetch_inner, m)?,
        wrap_pyfunction!(torch_loop::flush_fetched, m)?,
        wrap_pyfunction!(torch_loop::saw_no_grad, m)?,
        wrap_pyfunction!(torch_loop::forget_thread_state, m)?,
        wrap_pyfunction!(thread_queue_ns, m)?,
        wrap_pyfunction!(settings, m)?,
        wrap_pyfunction!(failed, m)?,
    ] {
        m.add_function(f)?;
    }
    m.add("PROTOCOL_VERSION", wire::VERSION)?;
    m.add("LOSS_EVERY", torch_loop::LOSS_EVERY)?;
    // The run's environment names, declared once (Python reads them here).
    m.add("LISTEN_ENV", probes::env::LISTEN_ENV)?;
    m.add("PARENT_ENV", probes::env::PARENT_ENV)?;
    m.add("PARENT_PID_ENV", probes::env::PARENT_PID_ENV)?;
    m.add("TOKEN_ENV", probes::env::TOKEN_ENV)?;
    m.add("MAIN_PID_ENV", probes::env::MAIN_PID_ENV)?;
    m.add("RANK_MAIN_ENV", probes::env::RANK_MAIN_ENV)?;
    m.add("CHECK_ENV", probes::env::CHECK_ENV)?;
    Ok(())
}
