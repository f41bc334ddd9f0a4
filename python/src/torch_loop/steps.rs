//! The step's bookkeeping on the training thread: a step opened when a batch is taken, joined
//! by a loader read ahead, closed with its loss (read on a sample of steps), marked evaluation
//! or training, sent.

use super::*;

impl Loop {
    pub(super) fn counters(&self) -> std::sync::MutexGuard<'_, Counters> {
        // Only ever held without a call into Python in between: a panic cannot poison it
        // half-way through a Python callback.
        self.counters.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `it` is the training loader's current iterator.
    pub(super) fn is_train_iter(&self, py: Python<'_>, it: &Bound<'_, PyAny>) -> bool {
        let c = self.counters();
        c.train_iter.as_ref().is_some_and(|ti| ti.weak.bind(py).upgrade().is_some_and(|o| o.is(it)))
    }

    /// The step's loss, when the `backward()` hook saw it (a sampled step) and it is cheap to
    /// read.
    pub(super) fn loss_of(&self, py: Python<'_>, st: &Open, end: u64) -> Option<f64> {
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
    pub(super) fn end_step(&self, py: Python<'_>, end: Option<u64>) {
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
    pub(super) fn finish(&self, py: Python<'_>, mut st: Open, end: u64) {
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
    pub(super) fn send(&self, py: Python<'_>, st: Open, end: u64) {
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
    pub(super) fn mark_as(no_grad: bool) {
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

    pub(super) fn mark() {
        Self::mark_as(false);
    }

    /// Whether this `next()` on `it` draws another loader's batch for the open step (as in
    /// `zip(a, b)`): `it` was made before the step began and gave it no batch yet (a second
    /// one is a loop of its own).
    pub(super) fn joins(&self, py: Python<'_>, it: &Bound<'_, PyAny>, t_call: u64, validation: bool) -> bool {
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
    pub(super) fn opened(
        &self,
        py: Python<'_>,
        it: &Bound<'_, PyAny>,
        batch: &Bound<'_, PyAny>,
        t_call: u64,
        validation: bool,
    ) {
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
    pub(super) fn open(
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
    pub(super) fn open_carried(&self, py: Python<'_>, it: &Bound<'_, PyAny>, t_call: u64) {
        let leader = it.as_ptr() as usize;
        let Some(a) = AHEAD.get().filter(|a| a.it == leader) else { return };
        AHEAD.set(None);
        let mut st = self.open(py, leader, None, false, t_call);
        st.images = a.carry;
        OPEN.with(|o| *o.borrow_mut() = Some(st));
    }

    /// Another loader's batch for the open step (`it`'s): its wait is the step's.
    pub(super) fn joined(&self, py: Python<'_>, it: &Bound<'_, PyAny>, t_call: u64, validation: bool) {
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
