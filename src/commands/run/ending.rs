//! How a `pipeprof run` ends: one way out, whatever ends it.
//!
//! The waiter looks at the run every few milliseconds and hands what it sees to
//! [`Ending::step`], which says what to do: pass the interrupt on, signal the program's group,
//! or finish. Every ending goes through the same last step ([`Act::Finish`]): the caller then
//! closes the trace, writes the summary, removes the socket and the start-up hook's folder, and
//! exits with the program's code (or the signal's). Pure: time comes in the [`Look`].
//!
//! ```text
//!  running ──first interrupt──► passed on ──stop timeout──► TERM to group ──KILL_AFTER──► KILL
//!     │                            │                           ▲
//!     │ second interrupt, hang-up ─┴───────────────────────────┘   (a third interrupt: KILL now)
//!     ▼
//!  program ended ──► drain (its processes' last frames; skipped when hurried)
//!                ──► leftovers of its group: TERM, KILL after KILL_AFTER ──► Finish
//! ```

use pipeprof_core::signal::KILL_AFTER;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

/// How long, after the program exited, its processes' last frames may take to arrive: while
/// a process of the run is still connected and sent something in the last [`QUIET`], up to
/// [`DRAIN`] (a pool worker ended by SIGTERM sends its last spans from its handler).
pub const DRAIN: Duration = Duration::from_secs(10);
pub const QUIET: Duration = Duration::from_secs(1);

/// What the waiter sees at one look. Times are since the run started.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Look {
    pub now: Duration,
    /// Interrupts taken so far (a repeat within the grace period is the same one).
    pub interrupts: u32,
    /// The first interrupt was SIGTERM (passed on as SIGTERM; otherwise SIGINT).
    pub terminated: bool,
    /// The terminal hung up (SIGHUP).
    pub hangup: bool,
    /// The program pipeprof started has ended.
    pub exited: bool,
    /// A process of the program's group is still alive (the program, or what it left).
    pub group_alive: bool,
    /// A process of the run is still connected.
    pub connected: bool,
    /// How long since any process of the run last sent something.
    pub quiet_for: Duration,
}

/// Why the program's group is signalled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// `--stop-timeout` passed after the interrupt was passed on.
    StopTimeout,
    /// A second interrupt: end now.
    Again,
    /// The terminal hung up.
    Hangup,
    /// The program ended, and processes of its group did not.
    Leftovers,
    /// SIGTERM did not end the group in [`KILL_AFTER`] (or a third interrupt came).
    StillRunning,
}

/// What to do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Act {
    /// Pass the interrupt to the program itself (its own shutdown stops its workers).
    PassOn(libc::c_int),
    /// Signal the program's whole process group.
    Group { sig: libc::c_int, why: Why },
    /// The run is over: close the trace, write the summary, remove the files.
    Finish,
}

/// The signal's name, for messages.
pub fn sig_name(sig: libc::c_int) -> &'static str {
    match sig {
        libc::SIGTERM => "SIGTERM",
        libc::SIGKILL => "SIGKILL",
        libc::SIGINT => "SIGINT",
        libc::SIGHUP => "SIGHUP",
        _ => "a signal",
    }
}

/// The state of the run's end.
#[derive(Debug, Clone, Default)]
pub struct Ending {
    stop_timeout: Duration,
    /// When the first interrupt was passed on.
    passed_on: Option<Duration>,
    /// When the run was told to end now (second interrupt, hang-up).
    hurried: Option<Duration>,
    /// When SIGTERM went to the group.
    termed: Option<Duration>,
    /// SIGKILL went to the group.
    killed: bool,
    /// When the program ended.
    exited: Option<Duration>,
    finished: bool,
}

impl Ending {
    pub fn new(stop_timeout: Duration) -> Ending {
        Ending { stop_timeout, ..Ending::default() }
    }

    /// Whether pipeprof passed an interrupt on (the program's exit code 1 is then Python's
    /// KeyboardInterrupt, an interruption).
    pub fn interrupted(&self) -> bool {
        self.passed_on.is_some() || self.hurried.is_some()
    }

    /// Whether pipeprof sent the group SIGKILL (dying of it is what was asked for).
    pub fn killed(&self) -> bool {
        self.killed
    }

    /// What to do after this look; [`Act::Finish`] once, last.
    pub fn step(&mut self, l: &Look) -> Vec<Act> {
        let mut acts = Vec::new();
        if self.finished {
            return acts;
        }
        // Interrupts count while the program runs and while its processes drain.
        if l.interrupts >= 1 && self.passed_on.is_none() && !l.hangup && !l.exited {
            acts.push(Act::PassOn(if l.terminated { libc::SIGTERM } else { libc::SIGINT }));
            self.passed_on = Some(l.now);
        }
        if (l.interrupts >= 2 || l.hangup) && self.hurried.is_none() {
            self.hurried = Some(l.now);
            if l.group_alive && self.termed.is_none() {
                let why = if l.hangup { Why::Hangup } else { Why::Again };
                acts.push(self.term(l.now, why));
            }
        }
        if !l.exited {
            let timed_out = self.passed_on.is_some_and(|t| l.now >= t + self.stop_timeout);
            if self.termed.is_none() && timed_out {
                acts.push(self.term(l.now, Why::StopTimeout));
            }
            acts.extend(self.kill_if_due(l));
            return acts;
        }
        let exited = *self.exited.get_or_insert(l.now);
        // Its processes' last frames: at least QUIET after the end while any is connected, and
        // up to DRAIN while they still send. Not when the user asked to end now.
        let since = l.now.saturating_sub(exited);
        let draining = l.connected && since < DRAIN && (since < QUIET || l.quiet_for < QUIET);
        if draining && self.hurried.is_none() {
            return acts;
        }
        if l.group_alive {
            if self.termed.is_none() {
                acts.push(self.term(l.now, Why::Leftovers));
            }
            acts.extend(self.kill_if_due(l));
            if !self.killed {
                return acts;
            }
        }
        // The group is gone, or got SIGKILL (a zombie nobody reaps still counts as alive).
        self.finished = true;
        acts.push(Act::Finish);
        acts
    }

    fn term(&mut self, now: Duration, why: Why) -> Act {
        self.termed = Some(now);
        Act::Group { sig: libc::SIGTERM, why }
    }

    /// SIGKILL once SIGTERM has had [`KILL_AFTER`], or at a third interrupt.
    fn kill_if_due(&mut self, l: &Look) -> Option<Act> {
        let termed = self.termed?;
        let due = l.now >= termed + KILL_AFTER || (l.interrupts >= 3 && self.hurried.is_some());
        if self.killed || !due || !l.group_alive {
            return None;
        }
        self.killed = true;
        Some(Act::Group { sig: libc::SIGKILL, why: Why::StillRunning })
    }
}

/// How the program ended, in the run's terms.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Exit code 0.
    Ok,
    /// Stopped by an interrupt (SIGINT/SIGTERM/SIGHUP, or exit codes 130/143 after one).
    Interrupted(i32),
    /// Anything else: a failure, with this exit code.
    Failed { code: i32, why: String },
}

/// Reads an exit status: the code pipeprof exits with, and what it means. `interrupted` says
/// whether an interrupt was passed on to the program (then exit code 1 from Python's
/// KeyboardInterrupt traceback is an interruption too); `killed`, whether pipeprof then sent
/// its group SIGKILL (dying of it is the interruption the user asked for, not a failure).
pub fn outcome(status: ExitStatus, program: &str, interrupted: bool, killed: bool) -> Outcome {
    match (status.code(), status.signal()) {
        (Some(0), _) => Outcome::Ok,
        (None, Some(libc::SIGKILL)) if killed => Outcome::Interrupted(128 + libc::SIGKILL),
        (Some(c @ (129 | 130 | 143)), _) => Outcome::Interrupted(c),
        (Some(1), _) if interrupted => Outcome::Interrupted(1),
        (Some(c), _) => Outcome::Failed { code: c, why: format!("{program} exited with status {c}") },
        (None, Some(s @ (libc::SIGINT | libc::SIGTERM | libc::SIGHUP))) => Outcome::Interrupted(128 + s),
        (None, Some(s)) => Outcome::Failed { code: 128 + s, why: format!("{program} was killed by signal {s}") },
        (None, None) => Outcome::Failed { code: 1, why: format!("{program} ended without an exit status") },
    }
}

impl Outcome {
    pub fn code(&self) -> i32 {
        match self {
            Outcome::Ok => 0,
            Outcome::Interrupted(c) => *c,
            Outcome::Failed { code, .. } => *code,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TERM: libc::c_int = libc::SIGTERM;
    const KILL: libc::c_int = libc::SIGKILL;

    fn s(x: f64) -> Duration {
        Duration::from_secs_f64(x)
    }

    /// A look at `now` s of a program still running alone.
    fn running(now: f64) -> Look {
        Look { now: s(now), group_alive: true, quiet_for: s(100.0), ..Look::default() }
    }

    /// Feeds `looks` in order; returns each look's acts.
    fn play(looks: &[Look]) -> Vec<Vec<Act>> {
        let mut e = Ending::new(s(30.0));
        looks.iter().map(|l| e.step(l)).collect()
    }

    fn group(sig: libc::c_int, why: Why) -> Act {
        Act::Group { sig, why }
    }

    #[test]
    fn a_program_that_ends_alone_finishes_at_once() {
        let gone = Look { exited: true, group_alive: false, ..running(2.0) };
        assert_eq!(play(&[running(1.0), gone]), vec![vec![], vec![Act::Finish]]);
    }

    #[test]
    fn the_first_interrupt_is_passed_on_then_the_stop_timeout_escalates() {
        let int = |now| Look { interrupts: 1, ..running(now) };
        let acts = play(&[int(1.0), int(30.9), int(31.0), int(35.9), int(36.0), int(400.0)]);
        assert_eq!(
            acts,
            vec![
                vec![Act::PassOn(libc::SIGINT)],
                vec![],
                vec![group(TERM, Why::StopTimeout)],
                vec![],
                vec![group(KILL, Why::StillRunning)],
                vec![],
            ]
        );
        // SIGTERM to pipeprof is passed on as SIGTERM.
        assert_eq!(play(&[Look { terminated: true, ..int(1.0) }])[0], vec![Act::PassOn(TERM)]);
    }

    #[test]
    fn a_second_interrupt_ends_the_group_now_and_still_finishes_through_the_same_door() {
        let int = |now, n| Look { interrupts: n, ..running(now) };
        let dead = |now| Look {
            interrupts: 2,
            exited: true,
            group_alive: false,
            connected: true,
            quiet_for: s(0.0),
            ..running(now)
        };
        let acts = play(&[int(1.0, 1), int(2.0, 2), int(6.9, 2), int(7.0, 2), dead(7.1)]);
        assert_eq!(
            acts,
            vec![
                vec![Act::PassOn(libc::SIGINT)],
                vec![group(TERM, Why::Again)],
                vec![],
                vec![group(KILL, Why::StillRunning)],
                // Hurried: no drain of connected processes, straight to the end.
                vec![Act::Finish],
            ]
        );
        // A third interrupt: SIGKILL without waiting.
        let acts = play(&[int(1.0, 1), int(2.0, 2), int(2.5, 3)]);
        assert_eq!(acts[2], vec![group(KILL, Why::StillRunning)]);
    }

    #[test]
    fn a_hangup_ends_the_group_without_passing_an_interrupt_on() {
        let hup = Look { interrupts: 1, hangup: true, ..running(1.0) };
        let acts = play(&[hup, Look { now: s(6.0), ..hup }, Look { exited: true, group_alive: false, ..hup }]);
        assert_eq!(acts, vec![vec![group(TERM, Why::Hangup)], vec![group(KILL, Why::StillRunning)], vec![Act::Finish]]);
    }

    #[test]
    fn after_the_program_its_processes_drain_then_leftovers_get_term_then_kill() {
        let after = |now, connected, quiet, alive| Look {
            exited: true,
            connected,
            quiet_for: s(quiet),
            group_alive: alive,
            ..running(now)
        };
        let acts = play(&[
            after(10.0, true, 0.0, true),
            // Connected and quiet, but QUIET has not passed since the end: wait.
            after(10.5, true, 5.0, true),
            // Still sending at 19 s: wait, up to DRAIN.
            after(19.0, true, 0.1, true),
            // DRAIN passed: a worker of the group still alive gets SIGTERM.
            after(20.0, true, 0.1, true),
            after(24.9, false, 9.0, true),
            after(25.0, false, 9.0, true),
            after(25.1, false, 9.0, true),
        ]);
        assert_eq!(
            acts,
            vec![
                vec![],
                vec![],
                vec![],
                vec![group(TERM, Why::Leftovers)],
                vec![],
                // SIGKILL, and the end: a zombie nobody reaps must not hold the run.
                vec![group(KILL, Why::StillRunning), Act::Finish],
                vec![],
            ]
        );
        // Leftovers that go after SIGTERM: the end, without SIGKILL.
        let acts = play(&[after(1.0, false, 9.0, true), after(1.2, false, 9.0, false)]);
        assert_eq!(acts, vec![vec![group(TERM, Why::Leftovers)], vec![Act::Finish]]);
    }

    #[test]
    fn exit_statuses_read_as_the_run_ended() {
        let code = |c: i32| ExitStatus::from_raw(c << 8);
        let sig = ExitStatus::from_raw;
        assert_eq!(outcome(code(0), "t", false, false), Outcome::Ok);
        assert_eq!(
            outcome(code(3), "t", false, false),
            Outcome::Failed { code: 3, why: "t exited with status 3".into() }
        );
        // Python's KeyboardInterrupt traceback exits 1: an interruption when we passed one on.
        assert_eq!(outcome(code(1), "t", true, false), Outcome::Interrupted(1));
        assert_eq!(outcome(code(1), "t", false, false).code(), 1);
        assert_eq!(outcome(code(130), "t", false, false), Outcome::Interrupted(130));
        assert_eq!(outcome(sig(libc::SIGINT), "t", false, false), Outcome::Interrupted(130));
        assert_eq!(outcome(sig(libc::SIGTERM), "t", false, false).code(), 143);
        assert_eq!(outcome(sig(libc::SIGHUP), "t", true, false).code(), 129);
        assert_eq!(
            outcome(sig(libc::SIGKILL), "t", false, false),
            Outcome::Failed { code: 137, why: "t was killed by signal 9".into() }
        );
        // Our own SIGKILL, sent when the program did not stop after the interrupt: as asked.
        assert_eq!(outcome(sig(libc::SIGKILL), "t", true, true), Outcome::Interrupted(137));
        assert_eq!(outcome(code(3), "t", true, true).code(), 3);
    }
}
