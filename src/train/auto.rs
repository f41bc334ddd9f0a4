//! `--workers auto`: the loader's worker count chosen from measurements during the first
//! steps. Pure: it is fed the training loop's own wait and step times.
//!
//! Start with one worker. After each window of steps: if the loop hardly waits, settle; if
//! the last worker added did not cut the step time by a fifth, the CPU is the limit: go back
//! one and settle; if every core has a worker, settle; otherwise add a worker. (The step time,
//! not the wait share, judges a change: with a tiny model the loop waits nearly all the time
//! whatever the workers, yet two workers halve the step.)

/// Steps measured per decision (after one step of warm-up following each change).
pub const WINDOW: u32 = 6;
/// Below this share of step time spent waiting, the loader keeps up.
pub const ENOUGH: f64 = 0.05;
/// An added worker must cut the mean step time to below this fraction of what it was.
pub const MUST_CUT_TO: f64 = 0.8;

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
            settled: false,
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
            self.current = cur - 1;
            Decision::Settle {
                workers: cur - 1,
                reason: format!(
                    "going from {} to {cur} workers only moved the step time from {:.1} to {:.1} ms: the CPU is the limit, back to {}",
                    cur - 1,
                    prev / 1e6,
                    step_mean / 1e6,
                    cur - 1
                ),
            }
        } else if cur >= self.max {
            self.settled = true;
            Decision::Settle {
                workers: cur,
                reason: format!("every core has a worker ({cur}); the loop still waits {} of each step", pct(share)),
            }
        } else {
            self.current = cur + 1;
            self.prev_step_ns = Some(step_mean);
            Decision::Set {
                workers: cur + 1,
                reason: format!("with {cur} the training loop waited {} of each step: trying {}", pct(share), cur + 1),
            }
        };
        self.wait_ns = 0;
        self.step_ns = 0;
        self.n = 0;
        self.warmup = true;
        decision
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
