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
    fn counters(&self) -> std::sync::MutexGuard<'_, Counters> {
        // Only ever held without a call into Python in between: a panic cannot poison it
        // half-way through a Python callback.
        self.counters.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `it` is the training loader's current iterator.
    fn is_train_iter(&self, py: Python<'_>, it: &Bound<'_, PyAny>) -> bool {
        let c = self.counters();
        c.train_iter.as_ref().is_some_and(|ti| ti.weak.bind(py).upgrade().is_some_and(|o| o.is(it)))
    }

    /// The step's loss, when the `backward()` hook saw it (a sampled step) and it is cheap to
    /// read.
    fn loss_of(&self, py: Python<'_>, st: &Open, end: u64) -> Option<f64> {
        if !st.sampled {
            return None;
        }
        let t = st.loss.as_ref()?.bind(py);
        if !t.get_type().is(self.tensor.bind(py)) {
            return None;
        }
        if t.call_method0(intern!(py, "numel")).and_then(|n| n.extract::<u64>()).ok()? != 1 {
            return None;
        }
        let cpu = t.getattr(intern!(py, "is_cpu")).and_then(|b| b.is_truthy()).ok()?;
        if !cpu {
            let mut c = self.counters();
            if end.saturating_sub(c.last_gpu_loss_ns) < GPU_LOSS_EVERY_NS {
                return None;
            }
            c.last_gpu_loss_ns = end;
        }
        t.call_method0(intern!(py, "item")).and_then(|v| v.extract::<f64>()).ok()
    }

    /// Ends this thread's open step at `end` (now when None); with none open, a held step is
    /// sent as it is.
    fn end_step(&self, py: Python<'_>, end: Option<u64>) {
        match OPEN.with(|o| o.borrow_mut().take()) {
            Some(st) => self.finish(py, st, end.unwrap_or_else(now)),
            None => {
                if let Some((h, h_end)) = HELD.with(|h| h.borrow_mut().take()) {
                    self.send(py, h, h_end);
                }
            }
        }
    }

    /// A step ended at `end`. The step held before it is settled first: when this one is a
    /// training step of the same iterator, that iterator reads one batch ahead (its first two
    /// `next()` came with no training in between): the two are one step, whose wait is both
    /// draws (what the training thread waited for its first batch), whose images are the first
    /// batch's; the second batch's images go to the step that trains on it. Else the held one
    /// is sent as it was. Then a step without a mark that was its iterator's first is held.
    fn finish(&self, py: Python<'_>, mut st: Open, end: u64) {
        if let Some((h, h_end)) = HELD.with(|h| h.borrow_mut().take()) {
            if st.marked && !st.validation && h.leader == st.leader {
                AHEAD.set(Some(Ahead { it: st.leader, carry: st.images }));
                (st.images, st.t_call, st.step) = (h.images, h.t_call, h.step);
                if let Some(b) = h.batch {
                    name_this_thread(py);
                    if let Some(p) = probe() {
                        record_batch(&p, b);
                    }
                }
            } else {
                // A pass read one ahead or not: its first batch is evaluated in the step after.
                let mut h = h;
                h.no_grad |= h.leader == st.leader && !st.marked && st.no_grad;
                self.send(py, h, h_end);
            }
        }
        if !st.marked && !st.validation && st.first_of_iter {
            HELD.with(|h| *h.borrow_mut() = Some((st, end)));
            return;
        }
        self.send(py, st, end);
    }

    /// Sends a step: evaluation when its batch was drawn with autograd off, or when it was
    /// consumed under `no_grad`/`inference_mode` with no `backward()` or optimizer step in a
    /// program that trains; else a training step (a batch taken and left by `break`, or
    /// collected to train on later, is one, as a loop with no `backward()` at all is).
    fn send(&self, py: Python<'_>, st: Open, end: u64) {
        let validation = st.validation || {
            let mut c = self.counters();
            c.trains |= st.marked;
            !st.marked && st.no_grad && c.trains
        };
        let loss = if validation { None } else { self.loss_of(py, &st, end) };
        name_this_thread(py);
        if let Some(p) = probe() {
            let epoch = st.epoch.max(0) as u32;
            send_step(&p, st.step, epoch, st.images, loss, validation, st.t_call, st.t_body, end, st.opt, st.batch);
        }
    }

    /// Marks this thread's open step (else the one held: the batch a loader read ahead is
    /// used after the loader ran out) as a training step (`backward()` ran, or the optimizer
    /// stepped) or, with `no_grad`, as one that entered `no_grad()`/`inference_mode()`.
    fn mark_as(no_grad: bool) {
        let set = |st: &mut Open| {
            if no_grad {
                st.no_grad = true;
            } else {
                st.marked = true;
            }
        };
        let open = OPEN.with(|o| match o.borrow_mut().as_mut() {
            Some(st) => {
                set(st);
                true
            }
            None => false,
        });
        if !open {
            HELD.with(|h| {
                if let Some((st, _)) = h.borrow_mut().as_mut() {
                    set(st);
                }
            });
        }
    }

    fn mark() {
        Self::mark_as(false);
    }

    /// Whether this `next()` on `it` draws another loader's batch for the open step (as in
    /// `zip(a, b)`): `it` was made before the step began and gave it no batch yet (a second
    /// one is a loop of its own).
    fn joins(&self, py: Python<'_>, it: &Bound<'_, PyAny>, t_call: u64, validation: bool) -> bool {
        let at = it.as_ptr() as usize;
        let open = OPEN.with(|o| {
            o.borrow().as_ref().and_then(|st| {
                let room = st.joined.contains(&0);
                let other = st.leader != at && room && !st.joined.contains(&at) && st.validation == validation;
                other.then_some(st.t_call)
            })
        });
        let Some(step_call) = open else { return false };
        let made = it.getattr(intern!(py, "_pipeprof_t")).and_then(|t| t.extract::<u64>()).unwrap_or(t_call);
        made < step_call
    }

    /// A batch taken for a new step: the step's counters, the hooks armed for a sampled
    /// training step (and disarmed after one), and the step opened.
    fn opened(&self, py: Python<'_>, it: &Bound<'_, PyAny>, batch: &Bound<'_, PyAny>, t_call: u64, validation: bool) {
        let made = FETCH.with(|f| f.borrow_mut().held.take());
        let mut images = batch_size(batch, self.tensor.bind(py));
        let leader = it.as_ptr() as usize;
        let first_of_iter =
            it.getattr(intern!(py, "_num_yielded")).and_then(|n| n.extract::<u64>()).is_ok_and(|n| n == 1);
        if let Some(a) = AHEAD.get().filter(|a| a.it == leader && !validation) {
            if first_of_iter {
                // A new iterator where a left one was (a `break`): it reads ahead or not anew.
                AHEAD.set(None);
            } else {
                // This batch is trained on in the next step; this one on the one drawn before.
                AHEAD.set(Some(Ahead { it: leader, carry: images }));
                images = a.carry;
            }
        }
        let mut st = self.open(py, leader, Some(batch), validation, t_call);
        (st.images, st.first_of_iter, st.batch) = (images, first_of_iter, made);
        OPEN.with(|o| *o.borrow_mut() = Some(st));
    }

    /// A new step of iterator `leader` drawn at `t_call` (`batch`: the one it drew, None for a
    /// batch drawn ahead before): counted, the hooks armed for a sampled training step (and
    /// disarmed after one).
    fn open(
        &self,
        py: Python<'_>,
        leader: usize,
        batch: Option<&Bound<'_, PyAny>>,
        validation: bool,
        t_call: u64,
    ) -> Open {
        let t_body = now();
        let NewStep { step, epoch, first, last, ask } = self.counters().new_step(leader, validation);
        if ask {
            self.check_distributed(py);
        }
        let (sampled, flip) = if validation { (false, None) } else { self.counters().sample(step, epoch, last) };
        if let Some(on) = flip {
            self.put_hooks(py, on);
        }
        if let Some(batch) = batch.filter(|_| first) {
            if let Err(e) = self.on_first_batch.bind(py).call1((batch,)) {
                warn(py, "the input shape", &e);
            }
        }
        Open {
            step,
            epoch,
            t_call,
            t_body,
            images: 0,
            validation,
            marked: false,
            no_grad: false,
            first_of_iter: false,
            sampled,
            leader,
            joined: [0; JOINS],
            loss: None,
            opt_t0: None,
            opt: None,
            batch: None,
        }
    }

    /// A loader that reads ahead ran out: the batch it drew ahead is trained on now, a step of
    /// its own from this `next()` on.
    fn open_carried(&self, py: Python<'_>, it: &Bound<'_, PyAny>, t_call: u64) {
        let leader = it.as_ptr() as usize;
        let Some(a) = AHEAD.get().filter(|a| a.it == leader) else { return };
        AHEAD.set(None);
        let mut st = self.open(py, leader, None, false, t_call);
        st.images = a.carry;
        OPEN.with(|o| *o.borrow_mut() = Some(st));
    }

    /// Another loader's batch for the open step (`it`'s): its wait is the step's.
    fn joined(&self, py: Python<'_>, it: &Bound<'_, PyAny>, t_call: u64, validation: bool) {
        let t_body = now();
        let made = FETCH.with(|f| f.borrow_mut().held.take());
        let step = OPEN.with(|o| {
            o.borrow_mut().as_mut().map(|st| {
                st.t_body = t_body;
                if let Some(slot) = st.joined.iter_mut().find(|a| **a == 0) {
                    *slot = it.as_ptr() as usize;
                }
                st.step
            })
        });
        name_this_thread(py);
        if let Some(p) = probe() {
            if !validation {
                probes::layer::record(&p, span(Stage::Wait, t_call, t_body - t_call, step, None, None));
            }
            if let Some(b) = made {
                record_batch(&p, b);
            }
        }
    }
}

#[pymethods]
impl Loop {
    #[new]
    #[pyo3(signature = (*, is_grad_enabled, tensor, on_first_batch, on_device, distributed, modules))]
    fn new(
        is_grad_enabled: Py<PyAny>,
        tensor: Py<PyAny>,
        on_first_batch: Py<PyAny>,
        on_device: Py<PyAny>,
        distributed: Py<PyAny>,
        modules: Py<PyDict>,
    ) -> Self {
        Loop {
            is_grad_enabled,
            tensor,
            on_first_batch,
            on_device,
            distributed,
            modules,
            hooks: Mutex::new(Hooks::default()),
            counters: Mutex::new(Counters {
                step: 0,
                epoch: -1,
                train_iter: None,
                len_read: None,
                input_sent: false,
                trains: false,
                device_seen: false,
                params_sent: false,
                sample_step: 0,
                sample_epoch: None,
                // `_torch_loop` installs the hooks in place: the first step keeps them.
                armed: true,
                keep: false,
                last_gpu_loss_ns: 0,
                distributed: None,
                dist_countdown: 0,
            }),
        }
    }

    /// `_BaseDataLoaderIter.__next__` is about to call torch's own on `it` (the Python hook
    /// calls it itself: a call from here into Python would enter the interpreter anew, dearer
    /// than the whole bookkeeping). False when `it` is timed elsewhere (wrapped with
    /// `pipeprof.torch.profile`); else [`Loop::took`] or [`Loop::failed`] follows.
    fn begin(&self, py: Python<'_>, it: &Bound<'_, PyAny>) -> bool {
        if it.getattr(intern!(py, "_pipeprof_manual")).and_then(|m| m.is_truthy()).unwrap_or(false) {
            return false;
        }
        let t_call = now();
        let validation = !self.is_grad_enabled.bind(py).call0().and_then(|g| g.is_truthy()).unwrap_or(true);
        let joins = self.joins(py, it, t_call, validation);
        CALLS.with(|c| c.borrow_mut().push(Call { t_call, validation, joins }));
        set_defer(true);
        true
    }

    /// torch's `__next__` on `it` returned `batch`: the open step ends at the call (sent now,
    /// so that a loader that runs out makes its step the pass's last) and `batch` opens the
    /// next one. Returns `batch`.
    fn took<'py>(&self, py: Python<'py>, it: &Bound<'py, PyAny>, batch: Bound<'py, PyAny>) -> Bound<'py, PyAny> {
        set_defer(false);
        let Some(call) = CALLS.with(|c| c.borrow_mut().pop()) else { return batch };
        if call.joins {
            self.joined(py, it, call.t_call, call.validation);
        } else {
            self.end_step(py, Some(call.t_call));
            self.opened(py, it, &batch, call.t_call, call.validation);
        }
        batch
    }

    /// torch's `__next__` on `it` raised `error` (which the hook raises on, unchanged): a
    /// `StopIteration` ends the pass's last step; any other error sends the batch made
    /// before it.
    fn failed(&self, py: Python<'_>, it: &Bound<'_, PyAny>, error: &Bound<'_, PyAny>) {
        set_defer(false);
        let Some(call) = CALLS.with(|c| c.borrow_mut().pop()) else { return };
        if !call.joins {
            self.end_step(py, Some(call.t_call));
        }
        if error.is_instance_of::<PyStopIteration>() {
            if !call.joins && !call.validation {
                self.open_carried(py, it, call.t_call);
            }
            if self.is_train_iter(py, it) {
                if let Some(ti) = self.counters().train_iter.as_mut() {
                    ti.ran_out = true;
                }
            }
        } else {
            // The batch made before the failure is sent, not lost.
            flush_held(py);
        }
    }

    /// `DataLoader.__iter__` made `it` for the training loader: a new pass when the last
    /// iterator ran out or was left after several batches (a `break`); one batch taken from a
    /// fresh iterator every step is not an epoch. `begun`: when the loader was asked for `it`
    /// (before its workers started): a new pass's epoch starts there, a mark on its clock (a
    /// validation record with no images, as Keras's hook sends), so that the epoch's time
    /// holds its loader's start and its first batch, as the program's own clock does.
    #[pyo3(signature = (it, begun=None))]
    fn train_pass(&self, py: Python<'_>, it: &Bound<'_, PyAny>, begun: Option<u64>) -> PyResult<()> {
        // First, so that an iterator without weak references changes nothing.
        let weak = PyWeakrefReference::new(it)?.unbind();
        let len = self.pass_len(py, it);
        let new_pass = match &self.counters().train_iter {
            None => true,
            Some(ti) => ti.ran_out || ti.batches > 1,
        };
        if new_pass {
            self.end_step(py, None);
            let (step, epoch) = {
                let mut c = self.counters();
                c.epoch += 1;
                (c.step, c.epoch.max(0) as u32)
            };
            if let (Some(end_ns), Some(p)) = (begun, probe()) {
                let (images, loss, correct, queued, validation) = (0, 0.0, 0, 0, true);
                let mark = StepRecord { no_loss: true, step, epoch, images, loss, correct, end_ns, queued, validation };
                probes::layer::record_step(&p, mark);
            }
        }
        let addr = it.as_ptr() as usize;
        self.counters().train_iter = Some(TrainIter { weak, addr, ran_out: false, batches: 0, len });
        // A process group is made before the loop: a pass is a good time to look again.
        if self.counters().distributed.is_none() {
            self.check_distributed(py);
        }
        Ok(())
    }

    /// `len(it)`: torch's iterator asks its index sampler, which asks the program's Dataset
    /// (`__len__`, the program's code). Read once per loader: a later pass over the same
    /// loader (the same index sampler object) reuses it, so the Dataset is asked no more
    /// often than torch itself asks it. An iterator without a length (an IterableDataset's)
    /// or one whose `__len__` raises says none.
    fn pass_len(&self, py: Python<'_>, it: &Bound<'_, PyAny>) -> Option<u64> {
        let sampler = it.getattr(intern!(py, "_index_sampler")).ok();
        if let (Some(s), Some((read_from, n))) = (&sampler, &self.counters().len_read) {
            if read_from.bind(py).upgrade().is_some_and(|o| o.is(s)) {
                return *n;
            }
        }
        let n = it.len().ok().map(|n| n as u64);
        if let Some(weak) = sampler.and_then(|s| PyWeakrefReference::new(&s).ok()) {
            self.counters().len_read = Some((weak.unbind(), n));
        }
        n
    }

    /// What the sampled steps put in place (`_torch_loop` gives each as its module is
    /// imported): the `backward()` hook, and the optimizer's step hooks. Both are in place now,
    /// as the first step wants them.
    #[pyo3(signature = (backward=None, optimizer=None))]
    fn set_hooks(&self, backward: Option<Py<BackwardHook>>, optimizer: Option<Vec<Py<OptimizerHook>>>) {
        let mut h = self.hooks.lock().unwrap_or_else(|e| e.into_inner());
        if backward.is_some() {
            h.backward = backward;
        }
        if let Some(o) = optimizer {
            h.optimizer = o;
        }
    }

    /// The program called `torch.compile`: the `backward()` and optimizer hooks go in place now
    /// and stay there (see [`Loop::put_hooks`]), before anything is compiled.
    fn keep_hooks(&self, py: Python<'_>) {
        let put = {
            let mut c = self.counters();
            c.keep = true;
            !std::mem::replace(&mut c.armed, true)
        };
        if put {
            self.put_hooks(py, true);
        }
    }

    /// Which of the `backward()` and optimizer hooks the sampled steps may put in place
    /// (`python/benches/hook_cost.py` measures the loop without them), applied now.
    fn enable_hooks(&self, py: Python<'_>, backward: bool, optimizer: bool) {
        {
            let mut h = self.hooks.lock().unwrap_or_else(|e| e.into_inner());
            h.backward_off = !backward;
            h.optimizer_off = !optimizer;
        }
        let armed = self.counters().armed;
        self.put_hooks(py, armed);
    }

    /// Ends this thread's open step (the program's exit), and sends a step still held.
    fn close(&self, py: Python<'_>) {
        self.end_step(py, None);
        // With none open now, the one the first call held (or held before) is sent.
        self.end_step(py, None);
    }

    /// Ends this thread's open step if iterator `it` opened it (its `__del__`: a `break`).
    fn close_if_leader(&self, py: Python<'_>, it: &Bound<'_, PyAny>) {
        let at = it.as_ptr() as usize;
        if AHEAD.get().is_some_and(|a| a.it == at) {
            AHEAD.set(None);
        }
        let leads = OPEN.with(|o| o.borrow().as_ref().is_some_and(|st| st.leader == at));
        if leads {
            self.end_step(py, None);
        }
    }

    /// `torch.autograd.backward(tensors, ...)` on a sampled step: the step's loss (the first
    /// tensor its first backward ran on) and its device. Returns the open step's number when
    /// the program is one rank of several (the caller times backward: the gradients'
    /// all-reduce), else None.
    fn backward(&self, py: Python<'_>, tensors: &Bound<'_, PyAny>) -> Option<u64> {
        Self::mark();
        let seen = OPEN.with(|o| {
            let o = o.borrow();
            let st = o.as_ref().filter(|st| !st.validation)?;
            Some((st.step, st.loss.is_none()))
        });
        let (step, first) = seen?;
        if first {
            let t = match tensors.cast::<PyTuple>() {
                Ok(t) if !t.is_empty() => t.get_item(0).ok(),
                _ => match tensors.cast::<PyList>() {
                    Ok(l) if !l.is_empty() => l.get_item(0).ok(),
                    _ => Some(tensors.clone()),
                },
            };
            if let Some(t) = t {
                let device_seen = self.counters().device_seen;
                if !device_seen {
                    if let Ok(dev) = t.getattr(intern!(py, "device")) {
                        if !dev.is_none() {
                            self.counters().device_seen = true;
                            if let Err(e) = dev.str().and_then(|s| self.on_device.bind(py).call1((s,))) {
                                warn(py, "the device", &e);
                            }
                        }
                    }
                }
                let t = t.unbind();
                OPEN.with(|o| {
                    if let Some(st) = o.borrow_mut().as_mut() {
                        st.loss = Some(t);
                    }
                });
            }
        }
        (self.counters().distributed == Some(true)).then_some(step)
    }

    /// The optimizer step begins (torch's global pre-hook).
    fn optimizer_pre(&self) {
        Self::mark();
        OPEN.with(|o| {
            if let Some(st) = o.borrow_mut().as_mut().filter(|st| !st.validation) {
                st.opt_t0 = Some(now());
            }
        });
    }

    /// The optimizer step ends (torch's global post-hook). True the first time a step was
    /// timed: the caller counts the model's parameters then.
    fn optimizer_post(&self) -> bool {
        let timed = OPEN.with(|o| {
            let mut o = o.borrow_mut();
            let st = o.as_mut()?;
            let t0 = st.opt_t0.take()?;
            let dur = now().saturating_sub(t0);
            // Two optimizers in one step (a GAN's): one span from the first's start, their sum.
            st.opt = Some(st.opt.map_or((t0, dur), |(start, sum)| (start, sum + dur)));
            Some(())
        });
        if timed.is_none() {
            return false;
        }
        let mut c = self.counters();
        !std::mem::replace(&mut c.params_sent, true)
    }
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

/// torch's own `_BaseDataLoaderIter.__next__` and the loop, for [`hooked_next`]: replaced by
/// each [`next_method`] (a notebook cell under `%%pipeprof` hooks a run of its own, with a
/// new loop, and puts torch's `__next__` back after).
static NEXT: RwLock<Option<(Py<PyAny>, Py<Loop>)>> = RwLock::new(None);

/// The hook's current `(torch's __next__, loop)`, taken out of the lock.
fn next_hook(py: Python<'_>) -> Option<(Py<PyAny>, Py<Loop>)> {
    let n = NEXT.read().unwrap_or_else(|e| e.into_inner());
    n.as_ref().map(|(orig, lp)| (orig.clone_ref(py), lp.clone_ref(py)))
}

/// `_BaseDataLoaderIter.__next__` under `pipeprof run`: [`Loop::begin`], torch's own
/// `__next__`, then [`Loop::took`] or [`Loop::failed`], in one C function: no Python frame and
/// one call into the extension instead of two (`python/benches/hook_cost.py`). Nor does a
/// frame of ours sit under torch's: CPython 3.11 and 3.12 give a thread's frames 16 KB chunks
/// and free a chunk as soon as its first frame returns, so a program whose calls cross a
/// chunk's end pays a `mmap` and `munmap` each time (≈ 23 µs on the 2-core machine), and one
/// frame more could move a program's calls across one. The bookkeeping never raises into the
/// program: a panic in it leaves the batch or the error as torch gave them.
unsafe extern "C" fn hooked_next(slf: *mut ffi::PyObject, _args: *mut ffi::PyObject) -> *mut ffi::PyObject {
    Python::attach(|py| {
        let Some((orig, lp)) = next_hook(py) else {
            PyRuntimeError::new_err("pipeprof: the DataLoader hook was called before it was made").restore(py);
            return std::ptr::null_mut();
        };
        // SAFETY: CPython calls a method with a live `self`.
        let it = unsafe { Bound::from_borrowed_ptr(py, slf) };
        let lp = lp.get();
        let timed = catch_unwind(AssertUnwindSafe(|| lp.begin(py, &it))).unwrap_or(false);
        let out = orig.bind(py).call1((&it,));
        match out {
            Ok(batch) if timed => {
                catch_unwind(AssertUnwindSafe(|| lp.took(py, &it, batch.clone()))).unwrap_or(batch).into_ptr()
            }
            Ok(batch) => batch.into_ptr(),
            Err(e) => {
                if timed {
                    let _ = catch_unwind(AssertUnwindSafe(|| lp.failed(py, &it, e.value(py))));
                }
                e.restore(py);
                std::ptr::null_mut()
            }
        }
    })
}

/// Makes `__next__` for `base` (`_BaseDataLoaderIter`, whose `__next__` is `orig`): a method
/// of the extension ([`hooked_next`]) timing into `lp`; made again, it times into the new loop.
#[pyfunction]
pub fn next_method<'py>(
    py: Python<'py>,
    base: &Bound<'py, PyType>,
    orig: Py<PyAny>,
    lp: Py<Loop>,
) -> PyResult<Bound<'py, PyAny>> {
    *NEXT.write().unwrap_or_else(|e| e.into_inner()) = Some((orig, lp));
    method(
        py,
        base,
        c"__next__",
        hooked_next,
        ffi::METH_NOARGS,
        c"torch's DataLoader iterator __next__, timed by pipeprof run",
    )
}
