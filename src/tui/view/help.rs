//! Help overlay (`?`): the keys, and how to read each panel.

use super::{bold, dim};
use crate::tui::state::{State, WINDOWS_S};
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Clear, Paragraph, Wrap};
use ratatui::Frame;

pub fn render_help(f: &mut Frame, area: Rect, st: &State) {
    let windows: Vec<String> = WINDOWS_S.iter().map(|s| format!("{s}s")).collect();
    let key =
        |k: &'static str, what: String| Line::from(vec![Span::styled(format!("{k:<9}"), bold()), Span::raw(what)]);
    let lines = vec![
        key("q Esc", "stop the run cleanly: the report and trace are still written".into()),
        key("Ctrl-C", "same as q; a second Ctrl-C quits at once".into()),
        key("p space", format!("pause the display (training goes on){}", if st.paused { " [paused]" } else { "" })),
        key("Tab", format!("focus the next panel: it gets more room [{}]", st.focus.label())),
        key("← →", format!("chart window {} [{}s]", windows.join(" / "), st.window_s())),
        key("? Esc", "close this help".into()),
        Line::raw(""),
        Line::styled("reading it", bold()),
        Line::styled("share: loop stages, of step time; loader stages, of worker time.", dim()),
        Line::styled("on-CPU █ vs off-CPU ░: off-CPU time in read is waiting on storage.", dim()),
        Line::styled("step chart: ░ wait for data, ▒ host→device transfer, █ compute.", dim()),
        Line::styled("CPU proc: this process (100% = one core), scaled to all cores.", dim()),
        Line::styled("queue: batches ready when a step asked; empty = the loader is behind.", dim()),
    ];
    let w = area.width.saturating_sub(4).min(84);
    let h = (lines.len() as u16 + 2).min(area.height);
    let r = Rect { x: area.x + (area.width - w) / 2, y: area.y + (area.height - h) / 2, width: w, height: h };
    f.render_widget(Clear, r);
    let block = Block::default().borders(Borders::ALL).title(Line::styled(" help · ? closes ", bold()));
    f.render_widget(Paragraph::new(lines).wrap(Wrap { trim: false }).block(block), r);
}
