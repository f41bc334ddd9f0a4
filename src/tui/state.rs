//! The live view's state: plain data updated from aggregator snapshots, plus what the user
//! chose (pause, help, focus, chart window). No terminal here: key handling and windowing are
//! pure and unit-tested, and views render it in tests from hand-built values.

use crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use pipeprof_core::aggregate::machine::{GpuPoint, HostPoint};
use pipeprof_core::aggregate::{Snapshot, StepPoint};
use pipeprof_core::diagnose::ranks::RanksVerdict;
use pipeprof_core::diagnose::Verdict;
use probes::StepRecord;

/// Chart windows ←/→ choose from, seconds.
pub const WINDOWS_S: [u64; 3] = [15, 60, 300];
/// The window shown first (60 s).
pub const DEFAULT_WINDOW: usize = 1;

/// The panel Tab moves to; the focused panel is highlighted and gets the spare room.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Focus {
    Verdict,
    #[default]
    Stages,
    Charts,
}

impl Focus {
    fn next(self) -> Focus {
        match self {
            Focus::Verdict => Focus::Stages,
            Focus::Stages => Focus::Charts,
            Focus::Charts => Focus::Verdict,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Focus::Verdict => "verdict",
            Focus::Stages => "stages",
            Focus::Charts => "charts",
        }
    }
}

/// What the event loop should do after a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Nothing changed.
    None,
    /// The display changed: draw now rather than at the next tick.
    Redraw,
    /// Ask the run to stop cleanly (the report and trace are still written).
    Stop,
    /// Ctrl-C: an interrupt, exactly as SIGINT is outside the live view (raw mode makes it a
    /// key): the first stops the run, a repeat within the grace period is the same one, a
    /// later one exits at once. The caller hands it to `signal::interrupt`.
    Interrupt,
}

/// What the collector publishes for the live view: the aggregate's snapshot and the verdict
/// over it, once there are steps to judge.
#[derive(Debug, Clone, Default)]
pub struct Live {
    pub snap: Snapshot,
    pub verdict: Option<Verdict>,
    /// A distributed run's straggler verdict over `snap`'s ranks.
    pub straggler: Option<RanksVerdict>,
}

/// Everything the views draw.
#[derive(Debug, Clone, Default)]
pub struct State {
    /// What is displayed (frozen while paused).
    pub snap: Snapshot,
    /// The verdict shown with `snap`.
    pub verdict: Option<Verdict>,
    /// The straggler verdict shown with `snap`'s ranks.
    pub straggler: Option<RanksVerdict>,
    /// The newest publication received while paused, shown on resume.
    pending: Option<Live>,
    pub paused: bool,
    pub help: bool,
    pub focus: Focus,
    /// Index into [`WINDOWS_S`].
    pub window: usize,
    /// q / Esc / Ctrl-C was pressed: the run is finishing its current step.
    pub stop_requested: bool,
}

/// The part of each series inside the chart window, oldest first.
#[derive(Debug, Clone, Copy)]
pub struct Windowed<'a> {
    /// Window start, monotonic ns (may be before the first event).
    pub from_ns: u64,
    /// Window end: the newest time seen.
    pub to_ns: u64,
    pub steps: &'a [StepPoint],
    pub records: &'a [StepRecord],
    pub host: &'a [HostPoint],
    pub gpu: &'a [GpuPoint],
}

impl State {
    pub fn new(snap: Snapshot) -> State {
        State { snap, window: DEFAULT_WINDOW, ..State::default() }
    }

    /// A state showing `snap` with `verdict`.
    pub fn with_verdict(snap: Snapshot, verdict: Verdict) -> State {
        State { verdict: Some(verdict), ..State::new(snap) }
    }

    /// Takes a new publication: shown at once, or kept for later while paused (training goes on).
    pub fn update(&mut self, live: Live) {
        if self.paused {
            self.pending = Some(live);
        } else {
            self.snap = live.snap;
            self.verdict = live.verdict;
            self.straggler = live.straggler;
        }
    }

    /// Handles one key; pure (no terminal, no flags): the caller acts on the result.
    pub fn on_key(&mut self, key: KeyEvent) -> Action {
        // Terminals that report releases would otherwise toggle twice.
        if key.kind == KeyEventKind::Release {
            return Action::None;
        }
        let ctrl_c = key.modifiers.contains(KeyModifiers::CONTROL) && matches!(key.code, KeyCode::Char('c' | 'C'));
        if ctrl_c {
            self.stop_requested = true;
            return Action::Interrupt;
        }
        match key.code {
            // Esc first closes the overlay it is natural to dismiss with Esc.
            KeyCode::Esc if self.help => {
                self.help = false;
                Action::Redraw
            }
            KeyCode::Char('q' | 'Q') | KeyCode::Esc => {
                if self.stop_requested {
                    return Action::None;
                }
                self.stop_requested = true;
                Action::Stop
            }
            KeyCode::Char('p' | 'P' | ' ') => {
                self.paused = !self.paused;
                if !self.paused {
                    if let Some(l) = self.pending.take() {
                        self.snap = l.snap;
                        self.verdict = l.verdict;
                        self.straggler = l.straggler;
                    }
                }
                Action::Redraw
            }
            KeyCode::Char('?' | 'h' | 'H') | KeyCode::F(1) => {
                self.help = !self.help;
                Action::Redraw
            }
            KeyCode::Tab => {
                self.focus = self.focus.next();
                Action::Redraw
            }
            KeyCode::BackTab => {
                self.focus = self.focus.next().next();
                Action::Redraw
            }
            KeyCode::Left | KeyCode::Char('-') => {
                self.window = self.window.saturating_sub(1);
                Action::Redraw
            }
            KeyCode::Right | KeyCode::Char('+' | '=') => {
                self.window = (self.window + 1).min(WINDOWS_S.len() - 1);
                Action::Redraw
            }
            _ => Action::None,
        }
    }

    /// The chart window, seconds.
    pub fn window_s(&self) -> u64 {
        WINDOWS_S[self.window.min(WINDOWS_S.len() - 1)]
    }

    /// Whether a newer snapshot is waiting behind the pause.
    pub fn has_pending(&self) -> bool {
        self.pending.is_some()
    }

    /// The newest time in the displayed snapshot: events and samples share the monotonic clock.
    pub fn now_ns(&self) -> u64 {
        let s = &self.snap;
        let host = s.host.last().map_or(0, |p| p.t_ns);
        let gpu = s.gpu.last().map_or(0, |p| p.t_ns);
        s.now_ns.max(host).max(gpu)
    }

    /// Each series trimmed to the chart window ending at [`State::now_ns`].
    pub fn windowed(&self) -> Windowed<'_> {
        let to_ns = self.now_ns();
        let from_ns = to_ns.saturating_sub(self.window_s() * 1_000_000_000);
        let s = &self.snap;
        // Series are oldest first, so the window is a suffix.
        fn suffix<T>(xs: &[T], from: u64, t: impl Fn(&T) -> u64) -> &[T] {
            &xs[xs.partition_point(|x| t(x) < from)..]
        }
        Windowed {
            from_ns,
            to_ns,
            steps: suffix(&s.steps, from_ns, |p| p.end_ns),
            records: suffix(&s.records, from_ns, |r| r.end_ns),
            host: suffix(&s.host, from_ns, |p| p.t_ns),
            gpu: suffix(&s.gpu, from_ns, |p| p.t_ns),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: u64 = 1_000_000_000;

    fn key(code: KeyCode) -> KeyEvent {
        KeyEvent::new(code, KeyModifiers::NONE)
    }

    fn snap_at(now_s: u64, steps: u64) -> Snapshot {
        let mut s = Snapshot { now_ns: now_s * SEC, ..Default::default() };
        s.summary.steps = steps;
        s
    }

    #[test]
    fn q_and_esc_request_a_stop_once() {
        for k in [key(KeyCode::Char('q')), key(KeyCode::Esc)] {
            let mut st = State::new(Snapshot::default());
            assert_eq!(st.on_key(k), Action::Stop, "{k:?}");
            assert!(st.stop_requested);
        }
        let mut st = State::new(Snapshot::default());
        assert_eq!(st.on_key(key(KeyCode::Char('q'))), Action::Stop);
        assert_eq!(st.on_key(key(KeyCode::Char('q'))), Action::None, "a second q changes nothing");
    }

    #[test]
    fn every_ctrl_c_is_an_interrupt_for_the_one_signal_path() {
        let mut st = State::new(Snapshot::default());
        let cc = KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL);
        assert_eq!(st.on_key(cc), Action::Interrupt);
        assert!(st.stop_requested);
        assert_eq!(st.on_key(cc), Action::Interrupt, "the grace period is decided in signal, not here");
        let mut st = State::new(Snapshot::default());
        assert_eq!(st.on_key(key(KeyCode::Char('q'))), Action::Stop);
        assert_eq!(st.on_key(cc), Action::Interrupt);
    }

    #[test]
    fn plain_c_is_not_ctrl_c() {
        let mut st = State::new(Snapshot::default());
        assert_eq!(st.on_key(key(KeyCode::Char('c'))), Action::None);
        assert!(!st.stop_requested);
    }

    #[test]
    fn key_releases_are_ignored() {
        let mut st = State::new(Snapshot::default());
        let mut k = key(KeyCode::Char('p'));
        k.kind = KeyEventKind::Release;
        assert_eq!(st.on_key(k), Action::None);
        assert!(!st.paused);
    }

    #[test]
    fn help_toggles_and_esc_closes_it_without_stopping() {
        let mut st = State::new(Snapshot::default());
        assert_eq!(st.on_key(key(KeyCode::Char('?'))), Action::Redraw);
        assert!(st.help);
        assert_eq!(st.on_key(key(KeyCode::Esc)), Action::Redraw);
        assert!(!st.help && !st.stop_requested);
        st.on_key(key(KeyCode::Char('?')));
        st.on_key(key(KeyCode::Char('?')));
        assert!(!st.help);
    }

    #[test]
    fn tab_cycles_focus_and_backtab_reverses() {
        let mut st = State::new(Snapshot::default());
        assert_eq!(st.focus, Focus::Stages);
        st.on_key(key(KeyCode::Tab));
        assert_eq!(st.focus, Focus::Charts);
        st.on_key(key(KeyCode::Tab));
        assert_eq!(st.focus, Focus::Verdict);
        st.on_key(key(KeyCode::Tab));
        assert_eq!(st.focus, Focus::Stages);
        st.on_key(key(KeyCode::BackTab));
        assert_eq!(st.focus, Focus::Verdict);
    }

    #[test]
    fn arrows_step_through_windows_and_stop_at_the_ends() {
        let mut st = State::new(Snapshot::default());
        assert_eq!(st.window_s(), 60);
        st.on_key(key(KeyCode::Left));
        assert_eq!(st.window_s(), 15);
        st.on_key(key(KeyCode::Left));
        assert_eq!(st.window_s(), 15);
        st.on_key(key(KeyCode::Right));
        st.on_key(key(KeyCode::Right));
        st.on_key(key(KeyCode::Right));
        assert_eq!(st.window_s(), 300);
    }

    #[test]
    fn pause_freezes_the_display_while_updates_keep_arriving() {
        let mut st = State::new(snap_at(1, 1));
        st.on_key(key(KeyCode::Char('p')));
        assert!(st.paused);
        st.update(Live { snap: snap_at(2, 2), verdict: None, straggler: None });
        st.update(Live { snap: snap_at(3, 3), verdict: None, straggler: None });
        assert_eq!(st.snap.summary.steps, 1, "frozen while paused");
        assert!(st.has_pending());
        st.on_key(key(KeyCode::Char('p')));
        assert!(!st.paused);
        assert_eq!(st.snap.summary.steps, 3, "resume shows the newest");
        assert!(!st.has_pending());
        st.update(Live { snap: snap_at(4, 4), verdict: None, straggler: None });
        assert_eq!(st.snap.summary.steps, 4, "live again");
    }

    #[test]
    fn window_selection_trims_series_by_time() {
        let mut s = Snapshot { now_ns: 100 * SEC, ..Default::default() };
        s.steps = (0..=100).map(|t| StepPoint { step: t, end_ns: t * SEC, ..Default::default() }).collect();
        s.records = (0..=100)
            .map(|t| StepRecord {
                no_loss: false,
                step: t,
                epoch: 0,
                images: 4,
                loss: 1.0,
                correct: 2,
                end_ns: t * SEC,
                queued: 1,
                validation: false,
            })
            .collect();
        s.host = (0..=50).map(|t| HostPoint { t_ns: 2 * t * SEC, ..Default::default() }).collect();
        s.gpu = (0..=100).map(|t| GpuPoint { t_ns: t * SEC, ..Default::default() }).collect();
        let mut st = State::new(s);
        let w = st.windowed();
        assert_eq!((w.from_ns, w.to_ns), (40 * SEC, 100 * SEC));
        assert_eq!(w.steps.len(), 61, "40 s..=100 s");
        assert_eq!(w.steps[0].end_ns, 40 * SEC);
        assert_eq!(w.records.len(), 61);
        assert_eq!(w.host.len(), 31);
        assert_eq!(w.gpu.len(), 61);
        st.on_key(key(KeyCode::Left));
        let w = st.windowed();
        assert_eq!(w.steps.len(), 16);
        assert_eq!(w.host.len(), 8, "86..=100 s in 2 s steps");
        st.on_key(key(KeyCode::Right));
        st.on_key(key(KeyCode::Right));
        assert_eq!(st.windowed().steps.len(), 101, "300 s holds everything");
    }

    #[test]
    fn now_follows_the_newest_sample_when_events_lag() {
        let mut s = Snapshot { now_ns: 5 * SEC, ..Default::default() };
        s.host.push(HostPoint { t_ns: 9 * SEC, ..Default::default() });
        assert_eq!(State::new(s).now_ns(), 9 * SEC);
        assert_eq!(State::new(Snapshot::default()).windowed().steps.len(), 0);
    }
}
