//! What the Python side calls on the [`Loop`]: the DataLoader's `next()` ([`Loop::begin`],
//! [`Loop::took`], [`Loop::failed`]), a training pass's start and length, the hooks put in
//! place, the loss `backward()` sees, the optimizer's clocks.

use super::*;

#[pymethods]
impl Loop {
    /// The loop over `torch` (its `is_grad_enabled` and `Tensor` read here, `sys.modules` too)
    /// with the Python side's callbacks.
    #[new]
    #[pyo3(signature = (*, torch, on_first_batch, on_device, distributed))]
    fn new(
        torch: &Bound<'_, PyAny>,
        on_first_batch: Py<PyAny>,
        on_device: Py<PyAny>,
        distributed: Py<PyAny>,
    ) -> PyResult<Self> {
        let py = torch.py();
        Ok(Loop {
            is_grad_enabled: torch.getattr(intern!(py, "is_grad_enabled"))?.unbind(),
            tensor: torch.getattr(intern!(py, "Tensor"))?.unbind(),
            on_first_batch,
            on_device,
            distributed,
            modules: py.import(intern!(py, "sys"))?.getattr(intern!(py, "modules"))?.cast_into::<PyDict>()?.unbind(),
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
        })
    }

    /// `_BaseDataLoaderIter.__next__` is about to call torch's own on `it` (the Python hook
    /// calls it itself: a call from here into Python would enter the interpreter anew, dearer
    /// than the whole bookkeeping). False when `it` is timed elsewhere (wrapped with
    /// `pipeprof.torch.profile`); else [`Loop::took`] or [`Loop::failed`] follows.
    pub(super) fn begin(&self, py: Python<'_>, it: &Bound<'_, PyAny>) -> bool {
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
    pub(super) fn took<'py>(
        &self,
        py: Python<'py>,
        it: &Bound<'py, PyAny>,
        batch: Bound<'py, PyAny>,
    ) -> Bound<'py, PyAny> {
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
    pub(super) fn failed(&self, py: Python<'_>, it: &Bound<'_, PyAny>, error: &Bound<'_, PyAny>) {
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
