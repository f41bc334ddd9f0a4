//! Drawing: one function per panel, each `fn(&mut Frame, Rect, &State)`, so any panel renders
//! alone in tests. This file lays them out and holds the formatting they share.

mod charts;
mod header;
mod help;
mod stages;
mod verdict;

pub use charts::render_charts;
pub use header::render_header;
pub use help::render_help;
pub use stages::render_stages;
pub use verdict::render_verdict;

use super::state::{Focus, State};
use ratatui::layout::Rect;
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, BorderType, Borders, Paragraph};
use ratatui::Frame;

/// Below this the panels cannot say anything useful; a notice is drawn instead.
pub const MIN_WIDTH: u16 = 40;
pub const MIN_HEIGHT: u16 = 12;

/// Rows the header takes.
pub const HEADER_ROWS: u16 = 3;
/// Rows the charts need to be worth drawing (title + 4 rows of data... + legend).
pub const CHART_MIN_ROWS: u16 = 6;

/// Where each panel goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Areas {
    pub header: Rect,
    pub verdict: Rect,
    pub stages: Rect,
    pub charts: Rect,
}

/// Splits the screen: header, verdict, stage table, charts, top to bottom. The verdict and
/// table take what their content needs (the focused one first); the charts get the rest.
pub fn layout(area: Rect, st: &State) -> Areas {
    let w = area.width;
    let rest = area.height.saturating_sub(HEADER_ROWS);
    let verdict_want = verdict::rows(st, w);
    let stages_want = stages::rows(st);
    let (verdict_h, stages_h) = match st.focus {
        Focus::Charts => {
            // Zoom on the charts: they get at least half of what the verdict leaves.
            let v = verdict_want.min(4).min(rest / 4);
            let s = stages_want.min(rest.saturating_sub(v) / 2);
            (v, s)
        }
        Focus::Verdict => {
            let v = verdict_want.min(rest.saturating_sub(CHART_MIN_ROWS + 4));
            let s = stages_want.min(rest.saturating_sub(v + CHART_MIN_ROWS));
            (v, s)
        }
        Focus::Stages => {
            let v = verdict_want.min(rest.saturating_sub(CHART_MIN_ROWS + 6).max(2));
            let s = stages_want.min(rest.saturating_sub(v + CHART_MIN_ROWS));
            (v, s)
        }
    };
    let charts_h = rest.saturating_sub(verdict_h + stages_h);
    let row = |y: u16, h: u16| Rect { x: area.x, y, width: w, height: h };
    let header = row(area.y, HEADER_ROWS.min(area.height));
    let verdict = row(header.bottom(), verdict_h);
    let stages = row(verdict.bottom(), stages_h);
    let charts = row(stages.bottom(), charts_h);
    Areas { header, verdict, stages, charts }
}

/// The whole screen.
pub fn render(f: &mut Frame, st: &State) {
    let area = f.area();
    if area.width < MIN_WIDTH || area.height < MIN_HEIGHT {
        let msg = format!(
            "pipeprof: the terminal is {}×{}; the live view needs {MIN_WIDTH}×{MIN_HEIGHT}. q stops the run.",
            area.width, area.height
        );
        f.render_widget(Paragraph::new(msg).wrap(ratatui::widgets::Wrap { trim: true }), area);
        return;
    }
    let a = layout(area, st);
    render_header(f, a.header, st);
    render_verdict(f, a.verdict, st);
    render_stages(f, a.stages, st);
    render_charts(f, a.charts, st);
    if st.help {
        render_help(f, area, st);
    }
}

/// A section: a top rule carrying the title; thick when the section has the focus, so the
/// focus shows without colour too.
fn section<'a>(title: Line<'a>, focused: bool) -> Block<'a> {
    let b = Block::default().borders(Borders::TOP).title(title);
    if focused {
        b.border_type(BorderType::Thick).border_style(Style::default().add_modifier(Modifier::BOLD))
    } else {
        b.border_style(Style::default().add_modifier(Modifier::DIM))
    }
}

fn dim() -> Style {
    Style::default().add_modifier(Modifier::DIM)
}

fn bold() -> Style {
    Style::default().add_modifier(Modifier::BOLD)
}

/// "label value" with the label dimmed.
fn kv<'a>(label: &'a str, value: String) -> [Span<'a>; 2] {
    [Span::styled(label, dim()), Span::styled(value, bold())]
}

pub use pipeprof_core::units::ms as fmt_ms;

/// A 0–1 share as a whole percentage.
pub fn fmt_share(v: f64) -> String {
    if v.is_finite() {
        format!("{:.0}%", (v * 100.0).max(0.0))
    } else {
        "-".into()
    }
}

/// A rate: one decimal while small.
pub fn fmt_rate(v: f64) -> String {
    if !v.is_finite() || v <= 0.0 {
        "0".into()
    } else if v >= 10_000.0 {
        format!("{:.0}k", v / 1000.0)
    } else if v >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

/// Bytes with a binary unit, short.
pub fn fmt_bytes(b: u64) -> String {
    const G: f64 = (1u64 << 30) as f64;
    const M: f64 = (1u64 << 20) as f64;
    let b = b as f64;
    if b >= G {
        format!("{:.1}G", b / G)
    } else if b >= M {
        format!("{:.0}M", b / M)
    } else {
        format!("{:.0}K", b / 1024.0)
    }
}

/// Seconds as m:ss (h:mm:ss past an hour).
pub fn fmt_elapsed(s: f64) -> String {
    let t = if s.is_finite() && s > 0.0 { s as u64 } else { 0 };
    if t >= 3600 {
        format!("{}:{:02}:{:02}", t / 3600, t / 60 % 60, t % 60)
    } else {
        format!("{}:{:02}", t / 60, t % 60)
    }
}

/// Keeps the end of `s` (a path's file and parent folders say most) within `max` columns.
pub fn truncate_start(s: &str, max: usize) -> String {
    let n = s.chars().count();
    if n <= max {
        return s.to_string();
    }
    if max == 0 {
        return String::new();
    }
    let tail: String = s.chars().skip(n - (max - 1)).collect();
    format!("…{tail}")
}

/// Keeps the start of `s` within `max` columns.
pub fn truncate_end(s: &str, max: usize) -> String {
    let n = s.chars().count();
    if n <= max {
        return s.to_string();
    }
    if max == 0 {
        return String::new();
    }
    let head: String = s.chars().take(max - 1).collect();
    format!("{head}…")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_keep_their_end() {
        assert_eq!(truncate_start("/a/b/c", 10), "/a/b/c");
        assert_eq!(truncate_start("/very/long/path/to/data", 8), "…to/data");
        assert_eq!(truncate_start("abc", 0), "");
        assert_eq!(truncate_end("abcdef", 4), "abc…");
    }

    #[test]
    fn numbers_format_like_the_report() {
        assert_eq!(fmt_ms(242.6), "242.6ms");
        assert_eq!(fmt_ms(0.0092), "9.2µs");
        assert_eq!(fmt_ms(4850.0), "4.85s");
        assert_eq!(fmt_ms(0.0), "0ms");
        assert_eq!(fmt_elapsed(75.9), "1:15");
        assert_eq!(fmt_elapsed(3725.0), "1:02:05");
        assert_eq!(fmt_bytes(5 << 30), "5.0G");
        assert_eq!(fmt_rate(131.8), "132");
        assert_eq!(fmt_rate(f64::NAN), "0");
    }
}
