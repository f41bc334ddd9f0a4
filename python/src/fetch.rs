//! How a DataLoader batch is made, timed: a [`Batch`] follows one from its fetch through its
//! collate to its end and sends their spans ([`batch_spans`], or the training thread's step
//! holds it: `torch_loop::fetched`); torch's `_MapDatasetFetcher.fetch` replaced by the
//! extension's own method ([`fetch_method`]), which decides which batches are timed.

use crate::{name_this_thread, span, state};
use probes::{clock, Probe, Stage};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyType;
use pyo3::{ffi, intern};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, RwLock};

/// The calling thread's clocks at one point of a batch: its CPU time and its run-queue wait
/// (`None` where the kernel does not say, or where they were not read).
#[derive(Clone, Copy, Default)]
pub(crate) struct Reading {
    cpu: Option<u64>,
    queue: Option<u64>,
}

impl Reading {
    /// Now, when `read` (the clocks are system calls: the training thread reads them on a
    /// sample of batches); nothing otherwise.
    fn now(read: bool) -> Self {
        if read {
            Reading { cpu: Some(clock::thread_cpu_ns()), queue: clock::thread_queue_ns() }
        } else {
            Reading::default()
        }
    }

    /// The CPU time and the run-queue wait from `self` to `later`.
    fn until(self, later: Reading) -> (Option<u64>, Option<u64>) {
        let since = |a: Option<u64>, b: Option<u64>| Some(b?.saturating_sub(a?));
        (since(self.cpu, later.cpu), since(self.queue, later.queue))
    }
}

/// A batch made by a DataLoader's fetcher, on the [`crate::now_ns`] clock. `fetch` runs from
/// `fetch_start` to `collate_start` (to `end` when there is no collate: a data set's
/// `__getitems__`), `collate` from `collate_start` to `end`, each with the thread's clocks read
/// at those points.
#[derive(Clone, Copy)]
pub(crate) struct BatchTimes {
    /// `None` when spans inside the samples (PIL, torchvision) timed them instead.
    fetch_start: Option<u64>,
    collate_start: Option<u64>,
    end: u64,
    at_fetch: Reading,
    at_collate: Reading,
    at_end: Reading,
}

/// The `fetch` and `collate` spans of a batch.
pub(crate) fn record_batch(p: &Probe, b: BatchTimes) {
    if let Some(start) = b.fetch_start {
        let (stop, (c, q)) = match b.collate_start {
            Some(t1) => (t1, b.at_fetch.until(b.at_collate)),
            None => (b.end, b.at_fetch.until(b.at_end)),
        };
        probes::layer::record(p, span(Stage::Fetch, start, stop.saturating_sub(start), None, c, q));
    }
    if let Some(start) = b.collate_start {
        let (c, q) = b.at_collate.until(b.at_end);
        probes::layer::record(p, span(Stage::Collate, start, b.end.saturating_sub(start), None, c, q));
    }
}

/// A batch being made by a DataLoader's fetcher (`_torch_fetch._fetch_clocked`), timed as it
/// goes: made as the fetch starts, told where the collate starts ([`Batch::collate`]) and where
/// it ends ([`Batch::end`]), then sent ([`batch_spans`], or [`crate::torch_loop::fetched`] on the
/// training thread). At each point the thread's CPU and run-queue clocks are read too when
/// `clocks` (the training thread reads them on a sample of batches), before the wall clock at
/// the start and after it at the other two, so that neither span counts the other's reads.
#[pyclass(module = "pipeprof._native")]
pub struct Batch {
    times: BatchTimes,
    clocks: bool,
    ended: bool,
}

#[pymethods]
impl Batch {
    #[new]
    fn new(clocks: bool) -> Self {
        let at_fetch = Reading::now(clocks);
        let start = clock::now_ns();
        let times = BatchTimes {
            fetch_start: Some(start),
            collate_start: None,
            end: start,
            at_fetch,
            at_collate: Reading::default(),
            at_end: Reading::default(),
        };
        Batch { times, clocks, ended: false }
    }

    /// The samples are made, `collate_fn` starts. `covered`: spans inside the samples (PIL,
    /// torchvision) timed them, and the batch has no `fetch` span of its own.
    fn collate(&mut self, covered: bool) {
        self.times.collate_start = Some(clock::now_ns());
        self.times.at_collate = Reading::now(self.clocks);
        if covered {
            self.times.fetch_start = None;
        }
    }

    /// The batch is made.
    fn end(&mut self) {
        self.times.end = clock::now_ns();
        self.times.at_end = Reading::now(self.clocks);
        self.ended = true;
    }
}

impl Batch {
    /// Its times, ended now if [`Batch::end`] was not called.
    pub(crate) fn times(&mut self) -> BatchTimes {
        if !self.ended {
            self.end();
        }
        self.times
    }
}

/// Sends the `fetch` and `collate` spans of a batch made by a DataLoader's fetcher (see
/// [`crate::torch_loop::fetched`] for the training thread's batches): one call for both.
#[pyfunction]
pub fn batch_spans(py: Python<'_>, mut batch: PyRefMut<'_, Batch>) -> PyResult<()> {
    let times = batch.times();
    name_this_thread(py);
    if let Some(p) = state()?.probe.clone() {
        record_batch(&p, times);
    }
    Ok(())
}

/// torch's own `_MapDatasetFetcher.fetch`, the Python function that times a batch
/// (`_torch_fetch._fetch_clocked`), the one that says whether this process is a DataLoader
/// worker (and names it), and 1 batch in how many the training thread times (and reads the
/// clocks of), for [`hooked_fetch`].
struct FetchHook {
    orig: Py<PyAny>,
    clocked: Py<PyAny>,
    is_worker: Py<PyAny>,
    timed_every: u64,
    clocks_every: u64,
}

/// Replaced by each [`fetch_method`], as `torch_loop`'s `NEXT` is.
static FETCH_HOOK: RwLock<Option<Arc<FetchHook>>> = RwLock::new(None);
/// Whether this process is a DataLoader worker: 0 not asked yet, 1 yes, 2 no; and the batches
/// the process made on its training thread so far. A forked worker starts both anew
/// ([`forget_process`], from `torch_loop::forget_thread_state`).
static WORKER: AtomicU8 = AtomicU8::new(0);
static BATCHES: AtomicU64 = AtomicU64::new(0);
/// Whether a hook that times inside a sample (PIL, torchvision) is installed: then every batch
/// is timed, its samples' spans inside it.
static INNER: AtomicBool = AtomicBool::new(false);

/// `_MapDatasetFetcher.fetch(index)` under `pipeprof run`, as the extension's own method (as
/// `torch_loop`'s `hooked_next` is): torch's own `fetch` for a batch that is not timed (3 in 4 on the
/// training thread), called with no frame of ours; else `_fetch_clocked`, in its place.
unsafe extern "C" fn hooked_fetch(slf: *mut ffi::PyObject, index: *mut ffi::PyObject) -> *mut ffi::PyObject {
    Python::attach(|py| {
        let hook = FETCH_HOOK.read().unwrap_or_else(|e| e.into_inner()).clone();
        let Some(h) = hook.as_deref() else {
            PyRuntimeError::new_err("pipeprof: the fetch hook was called before it was made").restore(py);
            return std::ptr::null_mut();
        };
        // SAFETY: CPython calls a method with a live `self` and argument.
        let (fetcher, index) = unsafe { (Bound::from_borrowed_ptr(py, slf), Bound::from_borrowed_ptr(py, index)) };
        let plan = catch_unwind(AssertUnwindSafe(|| fetch_plan(py, h, &fetcher))).unwrap_or(None);
        let out = match plan {
            None => h.orig.bind(py).call1((&fetcher, &index)),
            Some(Timed { worker, clocks }) => {
                let inner = INNER.load(Ordering::Relaxed);
                h.clocked.bind(py).call1((&h.orig, &fetcher, &index, worker, clocks, inner))
            }
        };
        match out {
            Ok(batch) => batch.into_ptr(),
            Err(e) => {
                e.restore(py);
                std::ptr::null_mut()
            }
        }
    })
}

/// How a timed batch is timed.
struct Timed {
    /// Made in a DataLoader worker process (sent at once), not on the training thread.
    worker: bool,
    /// The thread's CPU and run-queue clocks are read around it.
    clocks: bool,
}

/// Whether the fetcher's next batch is timed: None for torch's own `fetch`.
fn fetch_plan(py: Python<'_>, h: &FetchHook, fetcher: &Bound<'_, PyAny>) -> Option<Timed> {
    // A data set sampled one index at a time (no batch): torch's own path, untimed.
    if !fetcher.getattr(intern!(py, "auto_collation")).and_then(|a| a.is_truthy()).unwrap_or(false) {
        return None;
    }
    let worker = match WORKER.load(Ordering::Relaxed) {
        1 => true,
        2 => false,
        _ => {
            let w = h.is_worker.bind(py).call0().and_then(|w| w.is_truthy()).unwrap_or(false);
            WORKER.store(if w { 1 } else { 2 }, Ordering::Relaxed);
            w
        }
    };
    if worker {
        return Some(Timed { worker: true, clocks: true });
    }
    let n = BATCHES.fetch_add(1, Ordering::Relaxed);
    if !n.is_multiple_of(h.timed_every) && !INNER.load(Ordering::Relaxed) {
        return None;
    }
    Some(Timed { worker: false, clocks: n.is_multiple_of(h.clocks_every) })
}

/// Makes `fetch` for `base` (`_MapDatasetFetcher`, whose `fetch` is `orig`): a method of the
/// extension ([`hooked_fetch`]); made again, the new one's hook replaces the old one's.
#[pyfunction]
#[pyo3(signature = (*, base, orig, clocked, is_worker, timed_every, clocks_every))]
pub fn fetch_method<'py>(
    py: Python<'py>,
    base: &Bound<'py, PyType>,
    orig: Py<PyAny>,
    clocked: Py<PyAny>,
    is_worker: Py<PyAny>,
    timed_every: u64,
    clocks_every: u64,
) -> PyResult<Bound<'py, PyAny>> {
    let hook =
        FetchHook { orig, clocked, is_worker, timed_every: timed_every.max(1), clocks_every: clocks_every.max(1) };
    *FETCH_HOOK.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(hook));
    method(py, base, c"fetch", hooked_fetch, ffi::METH_O, c"torch's fetcher fetch, timed by pipeprof run")
}

/// A hook that times inside a sample (PIL, torchvision) is installed: every batch the training
/// thread makes is timed from now on.
#[pyfunction]
pub fn fetch_inner() {
    INNER.store(true, Ordering::Relaxed);
}

/// A method descriptor of `base` named `name` that runs `f` (`flags`: its calling convention).
pub(crate) fn method<'py>(
    py: Python<'py>,
    base: &Bound<'py, PyType>,
    name: &'static std::ffi::CStr,
    f: ffi::PyCFunction,
    flags: std::os::raw::c_int,
    doc: &'static std::ffi::CStr,
) -> PyResult<Bound<'py, PyAny>> {
    // A method descriptor holds its definition for good: made once a process, never freed.
    let def = Box::leak(Box::new(ffi::PyMethodDef {
        ml_name: name.as_ptr(),
        ml_meth: ffi::PyMethodDefPointer { PyCFunction: f },
        ml_flags: flags,
        ml_doc: doc.as_ptr(),
    }));
    // SAFETY: `base` is a live type, `def` lives for the rest of the process.
    unsafe { Bound::from_owned_ptr_or_err(py, ffi::PyDescr_NewMethod(base.as_type_ptr(), def)) }
}

/// A forked DataLoader worker is a new process: whether it is a worker is asked again, its
/// batches counted anew.
pub(crate) fn forget_process() {
    WORKER.store(0, Ordering::Relaxed);
    BATCHES.store(0, Ordering::Relaxed);
}
