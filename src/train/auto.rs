//! `--workers auto`: the loader's worker count chosen from measurements during the first
//! steps. Pure: it is fed the training loop's own wait and step times.
//!
//! Start with one worker. After each window of steps: if the loop hardly waits, settle; if
//! the last change did not cut the step time by a fifth, it did not help: go back and settle;
//! if every core has a worker, settle — unless the workers are mostly blocked (waiting on
//! storage, which needs no core): then double the workers, up to [`io_cap`] (tf.data's
//! AUTOTUNE also grows past the cores when its stages wait); otherwise add a worker. (The step
//! time, not the wait share, judges a change: with a tiny model the loop waits nearly all the
//! time whatever the workers, yet two workers halve the step.)

/// Steps measured per decision (after one step of warm-up following each change).
pub const WINDOW: u32 = 6;
/// Below this share of step time spent waiting, the loader keeps up.
pub const ENOUGH: f64 = 0.05;
/// An added worker must cut the mean step time to below this fraction of what it was.
pub const MUST_CUT_TO: f64 = 0.8;
/// Share of the workers' batch-making time blocked (off-CPU, not waiting for a core) from
/// which more workers than cores are tried.
pub const IO_BLOCKED: f64 = 0.5;
/// Workers per core at most for I/O…
pub const IO_WORKERS_PER_CORE: usize = 4;
/// …and never more than this many.
pub const IO_MAX_WORKERS: usize = 32;

/// The most workers tried for I/O on `cores` cores.
pub fn io_cap(cores: usize) -> usize {
    (cores.max(1) * IO_WORKERS_PER_CORE).min(IO_MAX_WORKERS).max(cores.max(1))
}

/// What to do after a step.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Keep measuring.
    Keep,
    /// Try this many workers.
    Set { workers: usize, reason: String },
    /// Final choice.
    Settle { workers: usize, reason: String },
}

#[derive(Debug, Clone)]
pub struct AutoWorkers {
    max: usize,
    current: usize,
    warmup: bool,
    wait_ns: u64,
    step_ns: u64,
    n: u32,
    prev_step_ns: Option<f64>,
    /// Workers before the last change (to go back to).
    prev_workers: usize,
    /// The workers' batch-making time in this window: blocked, and in all.
    blocked_ns: u64,
    busy_ns: u64,
    settled: bool,
}

fn pct(x: f64) -> String {
    format!("{:.0}%", x * 100.0)
}

impl AutoWorkers {
    /// Chooses between 1 and `max` workers (the cores).
    pub fn new(max: usize) -> AutoWorkers {
        AutoWorkers {
            max: max.max(1),
            current: 1,
            warmup: true,
            wait_ns: 0,
            step_ns: 0,
            n: 0,
            prev_step_ns: None,
            prev_workers: 1,
            blocked_ns: 0,
            busy_ns: 0,
            settled: false,
        }
    }

    /// Feeds the loader workers' batch-making time since the previous call: how much of
    /// `busy_ns` was blocked (off-CPU and not waiting for a core).
    pub fn observe_loader(&mut self, blocked_ns: u64, busy_ns: u64) {
        if !self.settled && !self.warmup {
            self.blocked_ns += blocked_ns.min(busy_ns);
            self.busy_ns += busy_ns;
        }
    }

    /// Workers to start with.
    pub fn initial(&self) -> usize {
        self.current
    }

    pub fn settled(&self) -> bool {
        self.settled
    }

    /// Feeds one step: how long the loop waited for its batch, and the whole step.
    pub fn observe(&mut self, wait_ns: u64, step_ns: u64) -> Decision {
        if self.settled {
            return Decision::Keep;
        }
        if self.warmup {
            // The first step after a change refills the queue: not steady state.
            self.warmup = false;
            return Decision::Keep;
        }
        self.wait_ns += wait_ns;
        self.step_ns += step_ns.max(wait_ns);
        self.n += 1;
        if self.n < WINDOW {
            return Decision::Keep;
        }
        let share = if self.step_ns > 0 { self.wait_ns as f64 / self.step_ns as f64 } else { 0.0 };
        let step_mean = self.step_ns as f64 / self.n as f64;
        let cur = self.current;
        let decision = if share < ENOUGH {
            self.settled = true;
            Decision::Settle {
                workers: cur,
                reason: format!(
                    "with {cur} the training loop waits {} of each step (< {}): enough",
                    pct(share),
                    pct(ENOUGH)
                ),
            }
        } else if let Some(prev) = self.prev_step_ns.filter(|p| step_mean > p * MUST_CUT_TO) {
            self.settled = true;
            let back = self.prev_workers;
            self.current = back;
            let why = if cur > self.max { "the storage serves no more in parallel" } else { "the CPU is the limit" };
            Decision::Settle {
                workers: back,
                reason: format!(
                    "going from {back} to {cur} workers only moved the step time from {:.1} to {:.1} ms: {why}, back to {back}",
                    prev / 1e6,
                    step_mean / 1e6,
                ),
            }
        } else if cur >= self.max {
            let cap = io_cap(self.max);
            match self.blocked_share() {
                Some(b) if b >= IO_BLOCKED && cur < cap => {
                    let next = (cur * 2).min(cap);
                    self.grow(next, step_mean);
                    Decision::Set {
                        workers: next,
                        reason: format!(
                            "every core has a worker ({cur}) but they are blocked {} of their time (waiting on storage needs no core) and the loop waits {} of each step: trying {next} (at most {cap})",
                            pct(b),
                            pct(share)
                        ),
                    }
                }
                b => {
                    self.settled = true;
                    let why = match b {
                        Some(b) if b >= IO_BLOCKED => format!("; at the cap of {cap} for I/O"),
                        Some(b) => format!(
                            "; the workers are blocked only {} of their time: more would wait for a core",
                            pct(b)
                        ),
                        None => String::new(),
                    };
                    Decision::Settle {
                        workers: cur,
                        reason: format!(
                            "every core has a worker ({cur}); the loop still waits {} of each step{why}",
                            pct(share)
                        ),
                    }
                }
            }
        } else {
            self.grow(cur + 1, step_mean);
            Decision::Set {
                workers: cur + 1,
                reason: format!("with {cur} the training loop waited {} of each step: trying {}", pct(share), cur + 1),
            }
        };
        self.blocked_ns = 0;
        self.busy_ns = 0;
        self.wait_ns = 0;
        self.step_ns = 0;
        self.n = 0;
        self.warmup = true;
        decision
    }
}

impl AutoWorkers {
    fn grow(&mut self, next: usize, step_mean: f64) {
        self.prev_workers = self.current;
        self.current = next;
        self.prev_step_ns = Some(step_mean);
    }

    fn blocked_share(&self) -> Option<f64> {
        (self.busy_ns > 0).then(|| self.blocked_ns as f64 / self.busy_ns as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds a window of steps of `step_ms` with the given wait share until a decision.
    fn window(a: &mut AutoWorkers, share: f64, step_ms: f64) -> Decision {
        for _ in 0..=WINDOW {
            let d = a.observe((share * step_ms * 1e6) as u64, (step_ms * 1e6) as u64);
            if d != Decision::Keep {
                return d;
            }
        }
        Decision::Keep
    }

    fn workers(d: &Decision) -> (usize, bool) {
        match d {
            Decision::Set { workers, .. } => (*workers, false),
            Decision::Settle { workers, .. } => (*workers, true),
            Decision::Keep => (0, false),
        }
    }

    #[test]
    fn grows_while_waiting_and_settles_when_the_wait_is_gone() {
        let mut a = AutoWorkers::new(4);
        assert_eq!(a.initial(), 1);
        assert_eq!(workers(&window(&mut a, 0.6, 100.0)), (2, false));
        assert_eq!(workers(&window(&mut a, 0.3, 60.0)), (3, false));
        let d = window(&mut a, 0.01, 40.0);
        assert_eq!(workers(&d), (3, true));
        assert!(matches!(d, Decision::Settle { reason, .. } if reason.contains("enough")));
        assert!(a.settled());
        assert_eq!(a.observe(50_000_000, 100_000_000), Decision::Keep);
    }

    #[test]
    fn a_worker_that_does_not_help_is_taken_back() {
        let mut a = AutoWorkers::new(4);
        assert_eq!(workers(&window(&mut a, 0.6, 100.0)), (2, false));
        // The CPU is shared with compute: the step got no faster.
        let d = window(&mut a, 0.55, 95.0);
        assert_eq!(workers(&d), (1, true));
        assert!(matches!(d, Decision::Settle { reason, .. } if reason.contains("CPU is the limit")));
    }

    #[test]
    fn stops_at_the_core_count() {
        let mut a = AutoWorkers::new(2);
        assert_eq!(workers(&window(&mut a, 0.9, 100.0)), (2, false));
        let d = window(&mut a, 0.5, 50.0);
        assert_eq!(workers(&d), (2, true));
        assert!(matches!(d, Decision::Settle { reason, .. } if reason.contains("every core")));
    }

    /// A window of steps whose loader workers were blocked `blocked` of their time.
    fn io_window(a: &mut AutoWorkers, blocked: f64, share: f64, step_ms: f64) -> Decision {
        for _ in 0..=WINDOW {
            a.observe_loader((blocked * 1e9) as u64, 1_000_000_000);
            let d = a.observe((share * step_ms * 1e6) as u64, (step_ms * 1e6) as u64);
            if d != Decision::Keep {
                return d;
            }
        }
        Decision::Keep
    }

    #[test]
    fn blocked_workers_grow_past_the_cores_by_doubling_up_to_the_cap() {
        let mut a = AutoWorkers::new(2);
        assert_eq!(workers(&io_window(&mut a, 0.9, 0.9, 100.0)), (2, false));
        let d = io_window(&mut a, 0.9, 0.9, 50.0);
        assert_eq!(workers(&d), (4, false));
        assert!(
            matches!(&d, Decision::Set { reason, .. } if reason.contains("blocked 90%") && reason.contains("at most 8")),
            "{d:?}"
        );
        assert_eq!(workers(&io_window(&mut a, 0.9, 0.8, 25.0)), (8, false));
        let d = io_window(&mut a, 0.9, 0.6, 12.0);
        assert_eq!(workers(&d), (8, true), "{d:?}");
        assert!(matches!(&d, Decision::Settle { reason, .. } if reason.contains("cap of 8")), "{d:?}");
        assert_eq!(io_cap(2), 8);
        assert_eq!(io_cap(16), IO_MAX_WORKERS);
    }

    #[test]
    fn doubling_that_does_not_help_goes_back_to_the_previous_count() {
        let mut a = AutoWorkers::new(2);
        assert_eq!(workers(&io_window(&mut a, 0.9, 0.9, 100.0)), (2, false));
        assert_eq!(workers(&io_window(&mut a, 0.9, 0.9, 50.0)), (4, false));
        let d = io_window(&mut a, 0.9, 0.9, 48.0);
        assert_eq!(workers(&d), (2, true), "{d:?}");
        assert!(matches!(&d, Decision::Settle { reason, .. } if reason.contains("storage serves no more")), "{d:?}");
    }

    #[test]
    fn cpu_bound_workers_stop_at_the_cores() {
        let mut a = AutoWorkers::new(2);
        assert_eq!(workers(&io_window(&mut a, 0.1, 0.9, 100.0)), (2, false));
        let d = io_window(&mut a, 0.1, 0.5, 50.0);
        assert_eq!(workers(&d), (2, true));
        assert!(matches!(&d, Decision::Settle { reason, .. } if reason.contains("blocked only 10%")), "{d:?}");
    }

    #[test]
    fn a_loader_that_keeps_up_stays_at_one() {
        let mut a = AutoWorkers::new(8);
        assert_eq!(workers(&window(&mut a, 0.0, 10.0)), (1, true));
    }

    #[test]
    fn a_tiny_model_waits_always_but_more_workers_still_halve_the_step() {
        let mut a = AutoWorkers::new(2);
        assert_eq!(workers(&window(&mut a, 0.99, 100.0)), (2, false));
        let d = window(&mut a, 0.98, 51.0);
        assert_eq!(workers(&d), (2, true));
    }
}
