//! torch's `_BaseDataLoaderIter.__next__` replaced by the extension's own method
//! ([`next_method`]): no Python frame of pipeprof's on the way to each batch.

use super::*;

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
