//! Verdict banner: what limits the run, how badly, the numbers that decided it and the best
//! thing to do about it. Focused (Tab), it lists every piece of evidence and advice.

use super::{bold, dim, section, truncate_end};
use crate::tui::state::{Focus, State};
use pipeprof_core::diagnose::{Advice, Flag, Limiter, Severity, Verdict, MIN_STEPS};
use ratatui::layout::Rect;
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;
use ratatui::Frame;

/// Content lines shown when the banner does not have the focus.
const SHORT_LINES: usize = 3;

pub fn limiter_label(l: &Limiter) -> String {
    match l {
        Limiter::Io => "I/O-bound".into(),
        Limiter::Contention => "CPU contention".into(),
        Limiter::Preprocess => "preprocessing-bound".into(),
        Limiter::Transfer => "transfer-bound".into(),
        Limiter::Compute => "compute-bound".into(),
        Limiter::Overhead => "per-step overhead".into(),
        Limiter::Balanced => "balanced".into(),
        Limiter::NotEnoughData { .. } => "collecting".into(),
    }
}

fn severity_label(s: Severity) -> &'static str {
    match s {
        Severity::High => "high",
        Severity::Moderate => "moderate",
        Severity::Low => "low",
    }
}

fn severity_color(s: Severity) -> Color {
    match s {
        Severity::High => Color::Red,
        Severity::Moderate => Color::Yellow,
        Severity::Low => Color::Green,
    }
}

fn flag_label(f: &Flag) -> String {
    match f {
        Flag::GpuUnused => "a GPU is present but unused".into(),
        Flag::NetworkStorage { fs_type } => format!("data on network storage ({fs_type})"),
        Flag::CpuSaturated => "CPU saturated".into(),
        Flag::TooFewWorkers { workers, cores } => format!("{workers} workers on {cores} cores"),
        Flag::TinyModel => "tiny model: per-step overhead dominates".into(),
        Flag::ComputeCompetesWithLoader => "CPU training shares cores with the loader".into(),
        Flag::Simulated { what } => format!("simulated: {what}"),
        Flag::Diverged { first_nan, first_inf } => {
            format!(
                "{}: training diverged, lower the learning rate",
                pipeprof_core::diagnose::loss_words(*first_nan, *first_inf)
            )
        }
        Flag::Stalled(s) => pipeprof_core::diagnose::stall_words(s),
        Flag::ValidationHeavy { share } => format!("validation takes {:.0}% of the run", share * 100.0),
        Flag::CoreContention { share, others, external } => {
            let who = if *external && !others.is_empty() { format!(" ({})", others.join(", ")) } else { String::new() };
            format!("waiting for a core {:.0}% of loader time{who}", share * 100.0)
        }
    }
}

/// "now X → Y images/s (×g)", as the report says it, compact enough for one line.
fn gain(a: &Advice) -> Option<String> {
    a.gain_short()
}

/// Word-wraps to `width` columns (long words are cut); never returns an empty list.
fn wrap(s: &str, width: usize) -> Vec<String> {
    let width = width.max(1);
    let mut out = Vec::new();
    let mut cur = String::new();
    for word in s.split_whitespace() {
        let wl = word.chars().count();
        let cl = cur.chars().count();
        if cl > 0 && cl + 1 + wl > width {
            out.push(std::mem::take(&mut cur));
        }
        if !cur.is_empty() {
            cur.push(' ');
        }
        cur.push_str(word);
        while cur.chars().count() > width {
            let head: String = cur.chars().take(width).collect();
            cur = cur.chars().skip(width).collect();
            out.push(head);
        }
    }
    if !cur.is_empty() || out.is_empty() {
        out.push(cur);
    }
    out
}

/// A verdict to show, or the steps still needed before there is one.
fn current(st: &State) -> Result<&Verdict, u64> {
    match &st.verdict {
        Some(v) => match v.limiter {
            Limiter::NotEnoughData { steps_needed } => Err(steps_needed),
            _ => Ok(v),
        },
        None => Err(MIN_STEPS.saturating_sub(st.snap.summary.split.steps.max(st.snap.summary.steps))),
    }
}

fn title(st: &State, hidden: bool) -> Line<'static> {
    let mut t = vec![Span::raw(" verdict")];
    match current(st) {
        Ok(v) => {
            let c = Style::default().fg(severity_color(v.severity)).add_modifier(Modifier::BOLD);
            t.push(Span::raw(": "));
            t.push(Span::styled(limiter_label(&v.limiter), c));
            t.push(Span::raw(" · "));
            t.push(Span::styled(severity_label(v.severity), c));
        }
        Err(_) => t.push(Span::styled(": collecting", dim())),
    }
    t.push(Span::raw(" "));
    if hidden {
        t.push(Span::styled("(Tab: more) ", dim()));
    }
    Line::from(t)
}

fn advice_line(a: &Advice, width: usize, with_command: bool) -> Line<'static> {
    let mut s = vec![Span::styled("→ ", bold().fg(Color::Cyan)), Span::styled(a.action.clone(), bold())];
    // The gain before the command: a narrow screen cuts the command, not the prediction.
    if let Some(g) = gain(a) {
        s.push(Span::raw("  "));
        s.push(Span::styled(g, bold().fg(Color::Green)));
    }
    if let Some(c) = a.command.clone().filter(|_| with_command) {
        s.push(Span::raw("  "));
        s.push(Span::styled(c, Style::default().fg(Color::Cyan)));
    }
    clip(Line::from(s), width)
}

/// Cuts a line to `width` columns, marking the cut.
fn clip(line: Line<'static>, width: usize) -> Line<'static> {
    if line.width() <= width {
        return line;
    }
    let mut left = width.saturating_sub(1);
    let mut spans = Vec::new();
    for sp in line.spans {
        let n = sp.content.chars().count();
        if n <= left {
            left -= n;
            spans.push(sp);
        } else {
            spans.push(Span::styled(sp.content.chars().take(left).collect::<String>(), sp.style));
            break;
        }
    }
    spans.push(Span::raw("…"));
    Line::from(spans)
}

/// The content lines (not the title) and whether some were left out.
fn lines(st: &State, width: usize) -> (Vec<Line<'static>>, bool) {
    let v = match current(st) {
        Ok(v) => v,
        Err(n) => {
            let steps = st.snap.summary.steps;
            // Zero to go yet no verdict: the rules want more than a step count (say, a full
            // window); do not promise a count that is not coming.
            let what =
                if n > 0 { format!("collecting… {n} steps to go") } else { "collecting… no verdict yet".into() };
            let l = Line::from(vec![
                Span::styled(what, bold()),
                Span::styled(format!("  ({steps} steps measured; a verdict needs at least {MIN_STEPS})"), dim()),
            ]);
            return (vec![clip(l, width)], false);
        }
    };
    let flags: Vec<String> = v.flags.iter().map(flag_label).collect();
    if st.focus != Focus::Verdict {
        return short_lines(v, &flags, width);
    }
    (full_lines(v, &flags, width), false)
}

/// Unfocused: the headline, the evidence and flags on one line, the first advice; whether
/// some were left out.
fn short_lines(v: &Verdict, flags: &[String], width: usize) -> (Vec<Line<'static>>, bool) {
    let mut out = vec![clip(Line::styled(v.headline.clone(), bold()), width)];
    let mut ev: Vec<Span> = Vec::new();
    for (i, e) in v.evidence.iter().enumerate() {
        if i > 0 {
            ev.push(Span::styled(" · ", dim()));
        }
        ev.push(Span::raw(e.clone()));
    }
    for fl in flags {
        ev.push(Span::styled(format!("  ⚑ {fl}"), Style::default().fg(Color::Yellow)));
    }
    if !ev.is_empty() {
        out.push(clip(Line::from(ev), width));
    }
    if let Some(a) = v.advice.first() {
        out.push(advice_line(a, width, true));
    }
    let full = 1 + v.evidence.len() + flags.len() + v.advice.len() * 2;
    out.truncate(SHORT_LINES);
    let hidden = full > out.len();
    (out, hidden)
}

/// Focused: everything, wrapped to `width`, each advice's command on a line of its own.
fn full_lines(v: &Verdict, flags: &[String], width: usize) -> Vec<Line<'static>> {
    let mut out = Vec::new();
    for l in wrap(&v.headline, width) {
        out.push(Line::styled(l, bold()));
    }
    for e in &v.evidence {
        for (i, l) in wrap(e, width.saturating_sub(2)).into_iter().enumerate() {
            out.push(Line::raw(format!("{}{l}", if i == 0 { "• " } else { "  " })));
        }
    }
    for fl in flags {
        out.push(Line::styled(truncate_end(&format!("⚑ {fl}"), width), Style::default().fg(Color::Yellow)));
    }
    for a in &v.advice {
        // Focused, the command gets a line of its own: it is meant to be copied whole.
        out.push(advice_line(a, width, false));
        if let Some(c) = &a.command {
            let c = truncate_end(c, width.saturating_sub(2));
            out.push(Line::styled(format!("  {c}"), Style::default().fg(Color::Cyan)));
        }
        for l in wrap(&a.reason, width.saturating_sub(2)) {
            out.push(Line::styled(format!("  {l}"), dim()));
        }
    }
    out
}

/// Rows the banner wants, title rule included.
pub(super) fn rows(st: &State, width: u16) -> u16 {
    let (l, _) = lines(st, width as usize);
    (l.len() + 1).min(u16::MAX as usize) as u16
}

pub fn render_verdict(f: &mut Frame, area: Rect, st: &State) {
    if area.height == 0 {
        return;
    }
    let (mut l, hidden) = lines(st, area.width as usize);
    let room = area.height.saturating_sub(1) as usize;
    let cut = l.len() > room;
    l.truncate(room);
    let block = section(title(st, hidden || cut), st.focus == Focus::Verdict);
    f.render_widget(Paragraph::new(l).block(block), area);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_advice_line_says_now_and_after_like_the_report() {
        let a = Advice {
            action: "raise loader workers 1 → 2".into(),
            change: pipeprof_core::diagnose::Change::Workers(2),
            command: Some("--workers 2".into()),
            predicted_speedup: Some(2399.0 / 1220.0),
            reason: String::new(),
            basis: Some(pipeprof_core::diagnose::Basis {
                now: 1220.0,
                from_step: 1,
                to_step: 30,
                predicted: 2399.0,
                model_now: 1220.0,
                range: None,
                slow_steps: false,
                compute_split_unknown: false,
                floor: false,
            }),
        };
        let text: String = advice_line(&a, 200, true).spans.iter().map(|s| s.content.to_string()).collect();
        assert!(text.contains("now 1220 → ≈2399 images/s (×2.0)  --workers 2"), "{text}");
        // Without a basis (advice whose gain is not the capacity model's): the bare gain.
        let bare = Advice { basis: None, ..a };
        let text: String = advice_line(&bare, 200, false).spans.iter().map(|s| s.content.to_string()).collect();
        assert!(text.ends_with("≈2.0× images/s"), "{text}");
    }

    #[test]
    fn wrap_breaks_on_words_and_cuts_long_ones() {
        assert_eq!(wrap("aa bb cc", 5), vec!["aa bb", "cc"]);
        assert_eq!(wrap("abcdefgh", 3), vec!["abc", "def", "gh"]);
        assert_eq!(wrap("", 3), vec![""]);
    }

    #[test]
    fn the_live_view_names_a_diverged_loss_and_a_stall() {
        let stall = pipeprof_core::aggregate::Stall {
            thread: "loader-0".into(),
            stage: "read".into(),
            file: "a/zz_pipe.png".into(),
            open_s: 45.0,
            abandoned: false,
        };
        let table = [
            (
                Flag::Diverged { first_nan: Some(412), first_inf: Some(410) },
                "loss is NaN from step 412 (inf at 410): training diverged",
            ),
            (Flag::Stalled(stall), "loader-0 has been reading a/zz_pipe.png for 45 s"),
        ];
        for (flag, words) in table {
            assert!(flag_label(&flag).starts_with(words), "{}", flag_label(&flag));
        }
    }
}
