//! The steps of a PyTorch training thread under `pipeprof run`, kept here rather than in
//! Python: on a 1 ms step every Python frame, attribute and call the hooks add is paid with
//! caches that torch's kernels left cold (`python/benches/hook_cost.py` measures it). What the
//! hooks mean is written in `pipeprof/_torch_loop.py`; this file holds its state and its hot
//! path: `DataLoader` iterators' `next()` ([`Loop::begin`], [`Loop::took`]), the loss seen by
//! `torch.autograd.backward` ([`Loop::backward`]), the optimizer step's clocks and the batches
//! made on the training thread ([`fetched`]).
//!
//! State: the step open on each thread (the batch it holds now) is thread-local, as the
//! Python thread state was; the run's counters (step, epoch, the training iterator, the loss
//! sampling) are one [`Loop`] behind a mutex taken only with the GIL held and never across a
//! call into Python, so a hook that runs Python code re-entering another hook finds it free.
//!
//! Here: that state, the hooks' types and the thread's batch held for its step; what Python
//! calls on the loop in [`methods`], the step's bookkeeping in [`steps`], the DataLoader's
//! `next()` as the extension's own method in [`next`].

mod methods;
pub mod next;
mod steps;
use crate::fetch::{method, record_batch, Batch, BatchTimes};
use crate::{name_this_thread, span, state};
use probes::{clock, Probe, Stage, StepRecord};
use pyo3::exceptions::{PyRuntimeError, PyStopIteration};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple, PyType, PyWeakrefReference};
use pyo3::{ffi, intern};
use std::cell::RefCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Mutex, RwLock};

/// Nanoseconds between two reads of a loss that lives on a GPU (each read waits for it).
const GPU_LOSS_EVERY_NS: u64 = 1_000_000_000;
/// The sampled steps: each pass's first training step, every `LOSS_EVERY`-th after it, and
/// its last where the iterator says its length. Only on those are the `backward()` and optimizer hooks in place (armed, see
/// [`Loop::opened`]): their loss is read (on the CPU; on a GPU at most once a second, each read
/// waits for the device) and their optimizer step timed. On the others the program calls
/// torch's own functions, and pays nothing: a hook costs microseconds on a 1 ms step.
pub const LOSS_EVERY: u64 = 8;
/// Training steps between two checks that the program started a process group (DDP): a
/// check is a Python call; the group is made before the loop (and each training pass checks
/// too), so at most a few steps miss it.
const DIST_CHECK_EVERY: u64 = 64;
/// Other loaders' iterators that can join one step (`zip(a, b, c, d)`): one more is a loop
/// of its own.
const JOINS: usize = 3;

/// The step whose batch a thread holds now.
struct Open {
    step: u64,
    epoch: i64,
    t_call: u64,
    t_body: u64,
    images: u32,
    validation: bool,
    /// `backward()` ran or the optimizer stepped while the step was open: a training step.
    marked: bool,
    /// `no_grad()` or `inference_mode()` was entered while the step was open (and no mark):
    /// an evaluation step.
    no_grad: bool,
    /// Its batch was its iterator's first: a step without a mark may be a loader reading one
    /// batch ahead (held until the next step says, see [`Loop::finish`]).
    first_of_iter: bool,
    /// A sampled step: its loss is read.
    sampled: bool,
    /// The iterator that opened the step, by address: holding it would delay its workers' end.
    leader: usize,
    /// Other iterators that gave the step a batch (as in `zip(a, b)`), by address.
    joined: [usize; JOINS],
    loss: Option<Py<PyAny>>,
    opt_t0: Option<u64>,
    opt: Option<(u64, u64)>,
    /// The batch's fetch and collate when this thread made it: sent with the step.
    batch: Option<BatchTimes>,
}

/// A thread's fetcher state: inside the loop's `next()` a batch made is held for the step.
#[derive(Default)]
struct Fetch {
    defer: bool,
    held: Option<BatchTimes>,
}

/// A `next()` in progress on a thread: torch's own is running (nested ones, when a data set
/// iterates a DataLoader of its own, stack).
struct Call {
    t_call: u64,
    validation: bool,
    joins: bool,
}

/// A loader that reads one batch ahead (accelerate's `DataLoaderShard`, Lightning's fetcher, a
/// prefetcher): the iterator (by address) and the images of the batch it drew ahead, which the
/// training thread trains on in the step after the one that drew it.
#[derive(Clone, Copy)]
struct Ahead {
    it: usize,
    carry: u32,
}

thread_local! {
    static OPEN: RefCell<Option<Open>> = const { RefCell::new(None) };
    /// A step with no mark that was its iterator's first, and its end: the next step says
    /// whether its iterator reads ahead (that step marked) or it was evaluation.
    static HELD: RefCell<Option<(Open, u64)>> = const { RefCell::new(None) };
    static AHEAD: std::cell::Cell<Option<Ahead>> = const { std::cell::Cell::new(None) };
    static CALLS: RefCell<Vec<Call>> = const { RefCell::new(Vec::new()) };
    static FETCH: RefCell<Fetch> = RefCell::new(Fetch::default());
}

/// The training loader's current iterator (one pass over it).
struct TrainIter {
    /// A weak reference (holding it would delay its workers' end), and its address.
    weak: Py<PyWeakrefReference>,
    addr: usize,
    ran_out: bool,
    /// Batches it gave, and its length where it says (`len()`): its last batch's step is
    /// sampled.
    batches: u64,
    len: Option<u64>,
}

/// The run's counters, shared by its threads.
struct Counters {
    step: u64,
    epoch: i64,
    /// The training loader's current iterator.
    train_iter: Option<TrainIter>,
    /// The training loader's length, and the index sampler it was read from.
    len_read: Option<(Py<PyWeakrefReference>, Option<u64>)>,
    input_sent: bool,
    /// A training step was marked (`backward()` or the optimizer): from then on a step without
    /// one is evaluation.
    trains: bool,
    device_seen: bool,
    params_sent: bool,
    /// The next sampled step, and the epoch of the last one.
    sample_step: u64,
    sample_epoch: Option<i64>,
    /// Whether the `backward()` and optimizer hooks are in place now, and whether they stay
    /// (torch.compile is in use, see [`Loop::put_hooks`]).
    armed: bool,
    keep: bool,
    last_gpu_loss_ns: u64,
    /// Whether the program trains as one rank of several (None: not known yet), and the
    /// training steps left before it is asked again.
    distributed: Option<bool>,
    dist_countdown: u64,
}

/// A new step, counted when its batch is taken: its number and epoch, whether it is the first
/// training batch, the training pass's last, and whether to ask now if the program is
/// distributed.
struct NewStep {
    step: u64,
    epoch: i64,
    first: bool,
    last: bool,
    ask: bool,
}

impl Counters {
    /// A batch taken from the iterator at address `it` for a new step.
    fn new_step(&mut self, it: usize, validation: bool) -> NewStep {
        let step = self.step;
        self.step += 1;
        let first = !validation && !self.input_sent;
        self.input_sent |= first;
        // The training iterator's batches (by address: it is alive, it gave this batch).
        let mut last = false;
        if let Some(ti) = self.train_iter.as_mut().filter(|ti| !validation && ti.addr == it) {
            ti.batches += 1;
            last = ti.len == Some(ti.batches);
        }
        let mut ask = false;
        if !validation && self.distributed.is_none() {
            ask = self.dist_countdown == 0;
            self.dist_countdown = if ask { DIST_CHECK_EVERY } else { self.dist_countdown - 1 };
        }
        NewStep { step, epoch: self.epoch, first, last, ask }
    }

    /// Whether training step `step` of `epoch` is sampled (`last`: its pass's last step), and
    /// whether the hooks go in (`Some(true)`) or out (`Some(false)`) for it.
    fn sample(&mut self, step: u64, epoch: i64, last: bool) -> (bool, Option<bool>) {
        let due = self.sample_epoch != Some(epoch) || step >= self.sample_step;
        if due {
            self.sample_step = step + LOSS_EVERY;
            self.sample_epoch = Some(epoch);
        }
        // A pass's last step too: the loss the program ends its pass with.
        let sample = due || last;
        // Under DDP every step's backward is timed: its all-reduce is where a rank waits.
        let want = sample || self.distributed == Some(true) || self.keep;
        let flip = (want != self.armed).then(|| {
            self.armed = want;
            want
        });
        (sample, flip)
    }
}

/// The training loop's hooks, made once by `_torch_loop.install` with what they call.
#[pyclass(module = "pipeprof._native", frozen)]
pub struct Loop {
    is_grad_enabled: Py<PyAny>,
    /// `torch.Tensor`: the loss is read only from a plain tensor (a subclass would run its
    /// `__torch_function__`, which the program never asked for).
    tensor: Py<PyAny>,
    /// Python callbacks: the first training batch (its input shape), the loss's device, and
    /// whether the program is one rank of several (`None` until a process group exists).
    on_first_batch: Py<PyAny>,
    on_device: Py<PyAny>,
    distributed: Py<PyAny>,
    /// `sys.modules`: whether torch.compile is loaded (see [`Loop::put_hooks`]).
    modules: Py<PyDict>,
    hooks: Mutex<Hooks>,
    counters: Mutex<Counters>,
}

/// The `backward()` hook the sampled steps put in place: `module.backward` (`torch.autograd`'s)
/// is set to `hook`, and back to `orig`, torch's own.
#[pyclass(module = "pipeprof._native", frozen)]
pub struct BackwardHook {
    module: Py<PyAny>,
    orig: Py<PyAny>,
    hook: Py<PyAny>,
}

#[pymethods]
impl BackwardHook {
    #[new]
    #[pyo3(signature = (*, module, orig, hook))]
    fn new(module: Py<PyAny>, orig: Py<PyAny>, hook: Py<PyAny>) -> Self {
        BackwardHook { module, orig, hook }
    }
}

/// `torch.autograd.backward` between the sampled steps: torch's own, called with the program's
/// arguments as they are, after marking the open step as a training step (a step whose
/// `backward()` ran is training; one without is evaluation). No Python frame: one call into the
/// extension per `backward()`.
#[pyclass(module = "pipeprof._native", frozen)]
pub struct BackwardMark {
    orig: Py<PyAny>,
}

#[pymethods]
impl BackwardMark {
    #[new]
    fn new(orig: Py<PyAny>) -> Self {
        BackwardMark { orig }
    }

    #[pyo3(signature = (*args, **kwargs))]
    fn __call__<'py>(
        &self,
        py: Python<'py>,
        args: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        Loop::mark();
        self.orig.bind(py).call(args, kwargs)
    }
}

/// One of the optimizer's global step hooks the sampled steps put in place: `hooks[key] =
/// hook`, deleted after. `hooks` is torch's hook dict, an `OrderedDict`: changed through its
/// own methods (`PyDict_SetItem` would skip its order list, and its next iteration would fail).
#[pyclass(module = "pipeprof._native", frozen)]
pub struct OptimizerHook {
    hooks: Py<PyAny>,
    key: Py<PyAny>,
    hook: Py<PyAny>,
}

#[pymethods]
impl OptimizerHook {
    #[new]
    #[pyo3(signature = (*, hooks, key, hook))]
    fn new(hooks: Py<PyAny>, key: Py<PyAny>, hook: Py<PyAny>) -> Self {
        OptimizerHook { hooks, key, hook }
    }
}

/// What [`Loop::put_hooks`] puts in place on the sampled steps and takes out after them.
#[derive(Default)]
struct Hooks {
    backward: Option<Py<BackwardHook>>,
    optimizer: Vec<Py<OptimizerHook>>,
    /// Which of the two may be put in (`python/benches/hook_cost.py` turns them off).
    backward_off: bool,
    optimizer_off: bool,
}

fn now() -> u64 {
    clock::now_ns()
}

fn probe() -> Option<Probe> {
    state().ok().and_then(|s| s.probe.clone())
}

/// Says once per process that a part of the bookkeeping failed (never raised into the program).
fn warn(py: Python<'_>, what: &str, e: &PyErr) {
    let warned =
        py.import("pipeprof._hooks").and_then(|m| m.getattr("warn")).and_then(|f| f.call1((what, e.value(py))));
    if warned.is_err() {
        eprintln!("pipeprof: {what} is not profiled ({e}); the program goes on");
    }
}

/// The first tensor (or value) of a batch: through tuples, lists and dicts.
fn first_leaf<'py>(batch: &Bound<'py, PyAny>) -> Bound<'py, PyAny> {
    let mut first = batch.clone();
    loop {
        let next = if let Ok(t) = first.cast::<PyTuple>() {
            t.get_item(0).ok()
        } else if let Ok(l) = first.cast::<PyList>() {
            l.get_item(0).ok()
        } else {
            None
        };
        match next {
            Some(n) => first = n,
            None => break,
        }
    }
    if let Ok(d) = first.cast::<PyDict>() {
        if let Some(v) = d.values().iter().next() {
            first = v;
        }
    }
    first
}

/// The batch's size: its first tensor's first dimension, else its first value's length.
/// `tensor` is `torch.Tensor`.
fn batch_size(batch: &Bound<'_, PyAny>, tensor: &Bound<'_, PyAny>) -> u32 {
    let first = first_leaf(batch);
    let py = batch.py();
    // A plain tensor's shape is a C getter (its `len()` is a Python method of torch's, dearer
    // than the rest of the step's bookkeeping on a cold cache); a 0-d tensor's is empty.
    if first.get_type().is(tensor) {
        if let Ok(shape) = first.getattr(intern!(py, "shape")) {
            if let Ok(dims) = shape.cast::<PyTuple>() {
                return dims.get_item(0).and_then(|n| n.extract::<u32>()).unwrap_or(0);
            }
        }
    }
    if let Ok(n) = first.len() {
        return n as u32;
    }
    if let Ok(shape) = first.getattr(intern!(py, "shape")) {
        if !shape.is_none() && shape.len().is_ok_and(|n| n > 0) {
            return shape.get_item(0).and_then(|n| n.extract::<u32>()).unwrap_or(0);
        }
    }
    0
}

/// Sends a step: its spans (`wait` and `compute`, or one `validate`), the optimizer step,
/// the batch made on this thread, then its record.
#[allow(clippy::too_many_arguments)]
fn send_step(
    p: &Probe,
    step: u64,
    epoch: u32,
    images: u32,
    loss: Option<f64>,
    validation: bool,
    call_ns: u64,
    body_ns: u64,
    end_ns: u64,
    optimizer: Option<(u64, u64)>,
    batch: Option<BatchTimes>,
) {
    let body_ns = body_ns.clamp(call_ns, end_ns.max(call_ns));
    let at = Some(step);
    if validation {
        probes::layer::record(p, span(Stage::Validate, call_ns, end_ns.saturating_sub(call_ns), at, None, None));
    } else {
        probes::layer::record(p, span(Stage::Wait, call_ns, body_ns - call_ns, at, None, None));
        probes::layer::record(p, span(Stage::Compute, body_ns, end_ns.saturating_sub(body_ns), at, None, None));
        if let Some((start, dur)) = optimizer {
            probes::layer::record(p, span(Stage::Optimizer, start, dur, at, None, None));
        }
    }
    if let Some(b) = batch {
        record_batch(p, b);
    }
    probes::layer::record_step(
        p,
        StepRecord {
            no_loss: loss.is_none(),
            step,
            epoch,
            images,
            loss: loss.unwrap_or(0.0) as f32,
            correct: 0,
            end_ns,
            queued: 0,
            validation,
        },
    );
}

/// Sends the batch a thread holds for a step that did not take it.
fn flush_held(py: Python<'_>) {
    if let Some(b) = FETCH.with(|f| f.borrow_mut().held.take()) {
        name_this_thread(py);
        if let Some(p) = probe() {
            record_batch(&p, b);
        }
    }
}

fn set_defer(on: bool) {
    FETCH.with(|f| f.borrow_mut().defer = on);
}

impl Loop {
    /// Puts the `backward()` and optimizer hooks in place (`on`: a sampled step begins) or
    /// takes them out: `torch.autograd.backward` set to the hook or back to torch's, the
    /// optimizer hooks' entries put in or deleted from torch's hook dicts (no handle made or
    /// Python frame run: this is on the training thread every few steps). Once the program
    /// uses torch.compile they stay in place: it guards what it traced (the optimizer's hook
    /// dicts, the function `backward()` calls), and hooks that come and go would compile the
    /// program's step again. `torch.compile` says so when called ([`Loop::keep_hooks`]);
    /// dynamo's own frame count catches its other entry points, after their first compile.
    fn put_hooks(&self, py: Python<'_>, on: bool) {
        let on = on || {
            let compiled = self.dynamo_compiled(py);
            if compiled {
                let mut c = self.counters();
                c.keep = true;
                c.armed = true;
            }
            compiled
        };
        // Taken out of the lock: setting them runs no code of ours, but nothing says so.
        let (backward, optimizer) = {
            let h = self.hooks.lock().unwrap_or_else(|e| e.into_inner());
            let backward = h.backward.as_ref().map(|b| {
                let b = b.get();
                let f = if on && !h.backward_off { &b.hook } else { &b.orig };
                (b.module.clone_ref(py), f.clone_ref(py))
            });
            let optimizer: Vec<_> = h
                .optimizer
                .iter()
                .map(|o| {
                    let o = o.get();
                    (o.hooks.clone_ref(py), o.key.clone_ref(py), (on && !h.optimizer_off).then(|| o.hook.clone_ref(py)))
                })
                .collect();
            (backward, optimizer)
        };
        if let Some((m, f)) = backward {
            if let Err(e) = m.bind(py).setattr(intern!(py, "backward"), f) {
                warn(py, "the loss hook", &e);
            }
        }
        for (d, k, f) in optimizer {
            let (d, k) = (d.bind(py), k.bind(py));
            let done = match f {
                Some(f) => d.set_item(k, f),
                // Taken out already: nothing to do.
                None if !d.contains(k).unwrap_or(false) => Ok(()),
                None => d.del_item(k),
            };
            if let Err(e) = done {
                warn(py, "the optimizer hooks", &e);
            }
        }
    }

    /// Whether dynamo (torch.compile's tracer) has compiled a frame in this process: its
    /// `counters["frames"]["total"]`, read without running Python code (a `defaultdict`'s
    /// missing key would). A torch that keeps no such count says yes once dynamo is loaded.
    fn dynamo_compiled(&self, py: Python<'_>) -> bool {
        let Ok(Some(utils)) = self.modules.bind(py).get_item(intern!(py, "torch._dynamo.utils")) else {
            return false;
        };
        let Some(counters) = utils.getattr(intern!(py, "counters")).ok().and_then(|c| c.cast_into::<PyDict>().ok())
        else {
            return true;
        };
        let frames = counters.get_item(intern!(py, "frames")).ok().flatten();
        let total = frames.and_then(|f| f.cast_into::<PyDict>().ok()?.get_item(intern!(py, "total")).ok().flatten());
        total.and_then(|t| t.extract::<u64>().ok()).is_some_and(|t| t > 0)
    }

    /// Asks the program (a Python callback) whether it is one rank of several; remembered
    /// once it says (`None`: no process group yet).
    fn check_distributed(&self, py: Python<'_>) {
        let d = match self.distributed.bind(py).call0() {
            Ok(d) if d.is_none() => return,
            Ok(d) => d.is_truthy().unwrap_or(false),
            Err(_) => false,
        };
        self.counters().distributed = Some(d);
    }
}

/// A batch made by a DataLoader's fetcher on a thread that is no worker process: inside the
/// loop's `next()` it is held for the step (sent with it, see [`Loop::took`]), else sent now;
/// a batch held before and never taken is sent first.
#[pyfunction]
pub fn fetched(py: Python<'_>, mut batch: PyRefMut<'_, Batch>) {
    let batch = batch.times();
    let send = FETCH.with(|f| {
        let mut f = f.borrow_mut();
        if f.defer {
            f.held.replace(batch)
        } else {
            Some(batch)
        }
    });
    if let Some(b) = send {
        name_this_thread(py);
        if let Some(p) = probe() {
            record_batch(&p, b);
        }
    }
}

/// `torch.no_grad()` or `torch.inference_mode()` was entered on this thread: a step with no
/// `backward()` or optimizer step that entered one is evaluation.
#[pyfunction]
pub fn saw_no_grad() {
    Loop::mark_as(true);
}

/// Sends the batch this thread holds for a step that did not take it (the program's exit).
#[pyfunction]
pub fn flush_fetched(py: Python<'_>) {
    flush_held(py);
}

/// Forgets this thread's step and batch: a forked DataLoader worker starts from the forking
/// thread's state, and it is not that thread.
#[pyfunction]
pub fn forget_thread_state() {
    OPEN.with(|o| {
        // The loss tensor is the parent's object: dropped with the GIL this call holds.
        o.borrow_mut().take();
    });
    FETCH.with(|f| *f.borrow_mut() = Fetch::default());
    CALLS.with(|c| c.borrow_mut().clear());
    HELD.with(|h| h.borrow_mut().take());
    AHEAD.set(None);
    // The process is a new one: whether it is a worker is asked again, its batches counted anew.
    crate::fetch::forget_process();
}
