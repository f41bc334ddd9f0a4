//! `--workers auto`: the loader's worker count chosen from measurements during the first
//! steps. Pure: it is fed the training loop's own wait and step times.
//!
//! Start with one worker. After each change, skip the steps the new workers need for their
//! first batches (one batch's time: as many steps as workers), then measure a window of steps.
//! A window is used only when it is steady: its first and second halves agree to within
//! [`STEADY`]; otherwise it still holds start-up costs (workers starting, a queue filled before
//! the first step and emptying) and the oldest half is dropped (at most [`MAX_EXTEND`] times).
//!
//! Then: if the loop hardly waits, settle. If the last change gave less than
//! [`BACK_BELOW`] of the gain it could give (more workers can cut the step by at most
//! new/old workers, and never below the step without its wait), go back and settle; if it gave
//! less than [`GROW_FROM`], keep it and settle (something else limits the workers now: the main
//! process receiving batches, shared cores, memory bandwidth). If every core has a worker,
//! settle — unless the workers are mostly blocked (waiting on storage, which needs no core):
//! then double, up to [`io_cap`] (tf.data's AUTOTUNE also grows past the cores when its stages
//! wait). Otherwise grow: double while the loop waits at least half of each step, else to the
//! workers that would hide the wait (step / (step − wait) times today's), at least one more.
//!
//! (The step time judges a change, not the wait share: with a tiny model the loop waits nearly
//! all the time whatever the workers, yet two workers halve the step. And a gain is judged
//! against what the added workers could give: one worker added to N gives at most 1/N, so a
//! fixed "a fifth faster" rule could never pass past 5 workers.)

use pipeprof_core::units::pct;

/// Steps measured per decision (after the warm-up following each change).
pub const WINDOW: usize = 6;
/// Below this share of step time spent waiting, the loader keeps up.
pub const ENOUGH: f64 = 0.05;
/// The loop waits at least this share of each step: double the workers.
pub const DOUBLE_FROM: f64 = 0.5;
/// A change that gave less than this share of its possible gain did not help: go back.
pub const BACK_BELOW: f64 = 0.15;
/// A change that gave at least this share of its possible gain may be followed by another.
pub const GROW_FROM: f64 = 0.5;
/// A window's halves whose mean steps differ by more than this factor are not steady.
pub const STEADY: f64 = 1.25;
/// Times a window that is not steady is extended before it is used as it is.
pub const MAX_EXTEND: u32 = 4;
/// Share of the workers' batch-making time blocked (off-CPU, not waiting for a core) from
/// which more workers than cores are tried.
pub const IO_BLOCKED: f64 = 0.5;
/// Workers per core at most for I/O…
pub const IO_WORKERS_PER_CORE: usize = 4;
/// …and never more than this many.
pub const IO_MAX_WORKERS: usize = 32;

/// The most workers tried for I/O on `cores` cores.
fn io_cap(cores: usize) -> usize {
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

/// The window before the last change: its workers and mean step and wait (ns).
#[derive(Debug, Clone, Copy)]
struct Before {
    workers: usize,
    step: f64,
    wait: f64,
}

#[derive(Debug, Clone)]
pub struct AutoWorkers {
    max: usize,
    current: usize,
    /// Steps still skipped after the last change.
    warmup: usize,
    /// This window's steps: (wait, step) in ns.
    steps: Vec<(f64, f64)>,
    extended: u32,
    before: Option<Before>,
    /// The workers' batch-making time in this window: blocked, and in all.
    blocked_ns: u64,
    busy_ns: u64,
    settled: bool,
}

fn mean(xs: &[(f64, f64)]) -> (f64, f64) {
    let n = xs.len().max(1) as f64;
    (xs.iter().map(|s| s.0).sum::<f64>() / n, xs.iter().map(|s| s.1).sum::<f64>() / n)
}

/// The most a change from `before` to `workers` can speed the step up: by the workers'
/// ratio, and never past the step without its wait. Pure.
fn possible_gain(before_workers: usize, before_step: f64, before_wait: f64, workers: usize) -> f64 {
    let by_workers = workers as f64 / before_workers.max(1) as f64;
    let floor = (before_step - before_wait).max(before_step * 0.01);
    by_workers.min(before_step / floor).max(1.0)
}

impl AutoWorkers {
    /// Chooses between 1 and `max` workers (the cores).
    pub fn new(max: usize) -> AutoWorkers {
        AutoWorkers {
            max: max.max(1),
            current: 1,
            warmup: 1,
            steps: Vec::with_capacity(2 * WINDOW),
            extended: 0,
            before: None,
            blocked_ns: 0,
            busy_ns: 0,
            settled: false,
        }
    }

    /// Feeds the loader workers' batch-making time since the previous call: how much of
    /// `busy_ns` was blocked (off-CPU and not waiting for a core).
    pub fn observe_loader(&mut self, blocked_ns: u64, busy_ns: u64) {
        if !self.settled && self.warmup == 0 {
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
        if self.warmup > 0 {
            self.warmup -= 1;
            return Decision::Keep;
        }
        self.steps.push((wait_ns as f64, step_ns.max(wait_ns) as f64));
        if self.steps.len() < WINDOW {
            return Decision::Keep;
        }
        let (first, second) = self.steps.split_at(WINDOW / 2);
        let (a, b) = (mean(first).1, mean(second).1);
        if (a > b * STEADY || b > a * STEADY) && self.extended < MAX_EXTEND {
            // Start-up costs in the window: measure on from its newer half.
            self.steps.drain(..WINDOW / 2);
            self.extended += 1;
            return Decision::Keep;
        }
        let (wait, step) = mean(&self.steps);
        let decision = self.decide(wait, step);
        self.steps.clear();
        self.extended = 0;
        self.blocked_ns = 0;
        self.busy_ns = 0;
        self.warmup = self.current;
        decision
    }

    fn decide(&mut self, wait: f64, step: f64) -> Decision {
        let share = if step > 0.0 { wait / step } else { 0.0 };
        let cur = self.current;
        if share < ENOUGH {
            return self.settle(
                cur,
                format!("with {cur} the training loop waits {} of each step (< {}): enough", pct(share), pct(ENOUGH)),
            );
        }
        if let Some(settled) = self.judge_last_change(step) {
            return settled;
        }
        if cur >= self.max {
            return self.at_every_core(share, step, wait);
        }
        let next = if share >= DOUBLE_FROM {
            cur * 2
        } else {
            // Workers that would hide the wait, if they scale: the loader's batch interval
            // (the step) must come down to the step without its wait.
            (cur as f64 * step / (step - wait).max(1.0)).ceil() as usize
        };
        let next = next.clamp(cur + 1, cur * 2).min(self.max);
        self.grow(next, step, wait);
        Decision::Set {
            workers: next,
            reason: format!("with {cur} the training loop waited {} of each step: trying {next}", pct(share)),
        }
    }

    /// After a change: settles when it helped too little of what it could (back to the workers
    /// before when it did not help at all); `None` when growing may go on.
    fn judge_last_change(&mut self, step: f64) -> Option<Decision> {
        let b = self.before?;
        let cur = self.current;
        let gain = b.step / step;
        let possible = possible_gain(b.workers, b.step, b.wait, cur);
        let helped = (gain - 1.0) / (possible - 1.0).max(f64::MIN_POSITIVE);
        let moved = format!(
            "going from {} to {cur} workers moved the step time from {:.1} to {:.1} ms (×{gain:.2} of a possible ×{possible:.2})",
            b.workers,
            b.step / 1e6,
            step / 1e6
        );
        if helped < BACK_BELOW {
            let why = if cur > self.max {
                "the storage serves no more in parallel"
            } else {
                "the limit is elsewhere (the CPU, or the main process taking batches in)"
            };
            self.current = b.workers;
            return Some(self.settle(b.workers, format!("{moved}: no faster, {why}, back to {}", b.workers)));
        }
        if helped < GROW_FROM {
            return Some(self.settle(
                cur,
                format!("{moved}: more workers give less and less (the main process, shared cores or memory limit them), staying at {cur}"),
            ));
        }
        None
    }

    /// Every core has a worker: more only when they are blocked on I/O (waiting on storage
    /// needs no core), up to the I/O cap; settle otherwise.
    fn at_every_core(&mut self, share: f64, step: f64, wait: f64) -> Decision {
        let cur = self.current;
        let cap = io_cap(self.max);
        match self.blocked_share() {
            Some(bl) if bl >= IO_BLOCKED && cur < cap => {
                let next = (cur * 2).min(cap);
                self.grow(next, step, wait);
                Decision::Set {
                    workers: next,
                    reason: format!(
                        "every core has a worker ({cur}) but they are blocked {} of their time (waiting on storage needs no core) and the loop waits {} of each step: trying {next} (at most {cap})",
                        pct(bl),
                        pct(share)
                    ),
                }
            }
            bl => {
                let why = match bl {
                    Some(bl) if bl >= IO_BLOCKED => format!("; at the cap of {cap} for I/O"),
                    Some(bl) => {
                        format!("; the workers are blocked only {} of their time: more would wait for a core", pct(bl))
                    }
                    None => String::new(),
                };
                self.settle(
                    cur,
                    format!("every core has a worker ({cur}); the loop still waits {} of each step{why}", pct(share)),
                )
            }
        }
    }

    fn settle(&mut self, workers: usize, reason: String) -> Decision {
        self.settled = true;
        Decision::Settle { workers, reason }
    }

    fn grow(&mut self, next: usize, step: f64, wait: f64) {
        self.before = Some(Before { workers: self.current, step, wait });
        self.current = next;
    }

    fn blocked_share(&self) -> Option<f64> {
        (self.busy_ns > 0).then(|| self.blocked_ns as f64 / self.busy_ns as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds steps of `step_ms` with the given wait share until a decision.
    fn window(a: &mut AutoWorkers, share: f64, step_ms: f64) -> Decision {
        io_window(a, 0.0, share, step_ms)
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
        assert_eq!(workers(&window(&mut a, 0.6, 100.0)), (2, false), "waits over half: doubled");
        // Waits 30% of 60 ms: 2 × 60 / 42 workers would hide it.
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
        assert!(
            matches!(&d, Decision::Settle { reason, .. } if reason.contains("the CPU") && reason.contains("of a possible ×2.00")),
            "{d:?}"
        );
    }

    #[test]
    fn a_gain_is_judged_against_what_the_added_workers_could_give() {
        // 8 → 16 can give ×2; ×1.8 is most of it: keep growing (a fixed "a fifth faster" rule
        // judges 1 added worker to 8 the same as 8 added).
        assert!((possible_gain(8, 100.0, 90.0, 16) - 2.0).abs() < 1e-9);
        // The step cannot go below its part without the wait.
        assert!((possible_gain(1, 100.0, 20.0, 4) - 1.25).abs() < 1e-9);
        assert!((possible_gain(4, 10.0, 0.0, 8) - 1.0).abs() < 1e-9);
    }

    #[test]
    fn stops_at_the_core_count() {
        let mut a = AutoWorkers::new(2);
        assert_eq!(workers(&window(&mut a, 0.9, 100.0)), (2, false));
        let d = window(&mut a, 0.5, 50.0);
        assert_eq!(workers(&d), (2, true));
        assert!(matches!(d, Decision::Settle { reason, .. } if reason.contains("every core")));
    }

    /// Steps whose loader workers were blocked `blocked` of their time, until a decision.
    fn io_window(a: &mut AutoWorkers, blocked: f64, share: f64, step_ms: f64) -> Decision {
        for _ in 0..200 {
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

    #[test]
    fn an_unsteady_window_is_not_decided_on() {
        // A queue filled before the first step: 3 quick steps, then the loader's real pace.
        let mut a = AutoWorkers::new(4);
        let mut decisions = Vec::new();
        for k in 0..40 {
            let (wait, step) = if k <= 3 { (0, 10_000_000) } else { (90_000_000, 100_000_000) };
            match a.observe(wait, step) {
                Decision::Keep => {}
                d => decisions.push((k, d)),
            }
        }
        let (k, d) = &decisions[0];
        assert_eq!(workers(d), (2, false), "the loader's pace, not the queue's: {d:?}");
        assert!(*k > 3 + WINDOW / 2, "decided at step {k}, on the quick steps");
    }

    /// A simulated loader: `cores` cores, each batch `batch_ms` of one worker's time (blocked
    /// `blocked` of it), the loop's own `compute_ms` per step, `main_ms` per batch in the main
    /// process (receive, collate: no worker can take it), logical cores past `physical` worth
    /// `ht` of a core; after each change, `startup` steps slowed ×3 (workers starting), and the
    /// first `prefilled` steps served from a queue filled before the run.
    #[derive(Clone, Copy)]
    struct Sim {
        cores: usize,
        physical: usize,
        ht: f64,
        batch_ms: f64,
        blocked: f64,
        compute_ms: f64,
        main_ms: f64,
        startup: bool,
        prefilled: usize,
    }

    impl Sim {
        fn decode(cores: usize) -> Sim {
            Sim {
                cores,
                physical: cores,
                ht: 1.0,
                batch_ms: 200.0,
                blocked: 0.0,
                compute_ms: 2.0,
                main_ms: 0.0,
                startup: false,
                prefilled: 0,
            }
        }

        /// (wait, step) in ms with `n` workers in steady state.
        fn steady(&self, n: usize) -> (f64, f64) {
            let running = n.min(((self.cores as f64) / (1.0 - self.blocked).max(0.05)) as usize).max(1);
            let on_cores = running.min(self.cores);
            let past_cores = (running - on_cores) as f64;
            let parallel = on_cores.min(self.physical) as f64
                + on_cores.saturating_sub(self.physical) as f64 * self.ht
                + past_cores;
            let step = (self.batch_ms / parallel).max(self.main_ms).max(self.compute_ms);
            (step - self.compute_ms, step)
        }

        /// Runs `--workers auto` on it: the choice and why.
        fn drive(&self) -> (usize, String) {
            let mut a = AutoWorkers::new(self.cores);
            let mut n = a.initial();
            let mut since_change = 0;
            for k in 0..2_000 {
                let (mut wait, mut step) = self.steady(n);
                if self.startup && since_change < n + 4 {
                    step *= 3.0;
                    wait = step - self.compute_ms;
                }
                if k < self.prefilled {
                    (wait, step) = (0.0, self.compute_ms);
                }
                a.observe_loader((self.blocked * step * 1e6) as u64, (step * 1e6) as u64);
                since_change += 1;
                match a.observe((wait * 1e6) as u64, (step * 1e6) as u64) {
                    Decision::Keep => {}
                    Decision::Set { workers, .. } => {
                        n = workers;
                        since_change = 0;
                    }
                    Decision::Settle { workers, reason } => return (workers, reason),
                }
            }
            panic!("no decision in 2000 steps");
        }
    }

    #[test]
    fn simulated_loaders_of_1_to_32_cores_settle_where_they_should_with_or_without_start_up_costs() {
        let ht16 = Sim { physical: 8, ht: 0.25, ..Sim::decode(16) };
        let main_bound = Sim { main_ms: 30.0, ..Sim::decode(16) };
        let compute_bound = Sim { batch_ms: 20.0, compute_ms: 30.0, ..Sim::decode(8) };
        let half_hidden = Sim { batch_ms: 60.0, compute_ms: 20.0, ..Sim::decode(8) };
        let storage = Sim { blocked: 0.9, ..Sim::decode(2) };
        #[rustfmt::skip]
        let table: &[(&str, Sim, usize, &str)] = &[
            ("1 core, decode-bound", Sim::decode(1), 1, "every core"),
            ("2 cores, decode-bound", Sim::decode(2), 2, "every core"),
            ("4 cores, decode-bound", Sim::decode(4), 4, "every core"),
            ("8 cores, decode-bound", Sim::decode(8), 8, "every core"),
            ("16 cores, decode-bound that scales", Sim::decode(16), 16, "every core"),
            ("32 cores, decode-bound that scales", Sim::decode(32), 32, "every core"),
            ("16 logical on 8 physical cores", ht16, 16, "less and less"),
            ("16 cores, the main process takes 30 ms a batch", main_bound, 8, "back to 8"),
            ("8 cores, compute-bound", compute_bound, 1, "enough"),
            ("8 cores, 3 workers hide the wait", half_hidden, 3, "enough"),
            ("2 cores, workers blocked on storage", storage, 8, "cap of 8"),
        ];
        for (name, sim, want, why) in table {
            for (startup, prefilled) in [(false, 0), (true, 0), (false, 4), (true, 4)] {
                let s = Sim { startup, prefilled, ..*sim };
                let (got, reason) = s.drive();
                assert_eq!(got, *want, "{name} (start-up {startup}, prefilled {prefilled}): {reason}");
                assert!(reason.contains(why), "{name} (start-up {startup}, prefilled {prefilled}): {reason}");
            }
        }
        // The case: 16 cores, a decode-bound run that scales: at least 8 workers.
        assert!(Sim::decode(16).drive().0 >= 8);
    }
}
