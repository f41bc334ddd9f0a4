//! Header: what is running (model, device, workers, data folder and its filesystem) and how
//! far it got (epoch, step, images/s, loss, accuracy, elapsed, dropped events).

use super::{bold, dim, fmt_elapsed, fmt_rate, kv, truncate_start};
use crate::tui::state::State;
use pipeprof_core::aggregate::Summary;
use ratatui::layout::Rect;
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;
use ratatui::Frame;

fn width(spans: &[Span]) -> usize {
    spans.iter().map(|s| s.content.chars().count()).sum()
}

pub fn render_header(f: &mut Frame, area: Rect, st: &State) {
    let w = area.width as usize;
    let lines = vec![
        Line::from(title_bar(st, w)),
        Line::from(progress(&st.snap.summary)),
        Line::from(data_line(&st.snap.summary, w)),
    ];
    f.render_widget(Paragraph::new(lines), area);
}

/// Line 1: a title bar; the run's state on the right where the eye looks for it.
fn title_bar(st: &State, w: usize) -> Vec<Span<'static>> {
    let s = &st.snap.summary;
    let set = &s.settings;
    let bar = Style::default().add_modifier(Modifier::REVERSED);
    let mut right = Vec::new();
    if st.stop_requested {
        right.push(Span::styled(" STOPPING… ", bar.fg(Color::Red).add_modifier(Modifier::BOLD)));
    } else if st.paused {
        right.push(Span::styled(" PAUSED ", bar.fg(Color::Yellow).add_modifier(Modifier::BOLD)));
    }
    right.push(Span::styled(format!(" {} ", fmt_elapsed(s.elapsed_s)), bar.add_modifier(Modifier::BOLD)));
    right.push(Span::styled(" ? help ", bar));
    let device = if set.device.is_unseen() { "-" } else { set.device.name() };
    let plural = if set.workers == 1 { "" } else { "s" };
    let mut tail =
        format!(" · {device} · {} worker{plural}/{} cores · batch {} ", set.workers, set.cores, set.batch_size);
    let mut fixed = " pipeprof  ".len() + tail.chars().count() + width(&right);
    if fixed + 12 > w {
        // Narrow, or a status is showing: keep room for the model's name.
        tail = format!(" · {device} · {} workers ", set.workers);
        fixed = " pipeprof  ".len() + tail.chars().count() + width(&right);
    }
    let name = set.model.name();
    let model = if name.is_empty() { "-" } else { &name };
    let model = truncate_start(model, w.saturating_sub(fixed).max(8));
    let mut l1 = vec![
        Span::styled(" pipeprof  ", bar.add_modifier(Modifier::BOLD)),
        Span::styled(model, bar),
        Span::styled(tail, bar),
    ];
    let pad = w.saturating_sub(width(&l1) + width(&right));
    l1.push(Span::styled(" ".repeat(pad), bar));
    l1.extend(right);
    l1
}

/// Line 2: progress, most important first so a narrow terminal cuts the least useful.
fn progress(s: &Summary) -> Vec<Span<'static>> {
    let set = &s.settings;
    let epoch = s.epochs.last().map_or(1, |e| e.epoch);
    let epoch = match set.max_steps {
        None if set.epochs > 0 => format!("{epoch}/{}", set.epochs),
        _ => epoch.to_string(),
    };
    let step = match set.max_steps {
        Some(m) => format!("{}/{m}", s.steps),
        None => s.steps.to_string(),
    };
    let acc = s
        .epochs
        .last()
        .filter(|e| e.images > 0 && !s.settings.no_accuracy)
        .map_or("-".into(), |e| format!("{:.1}%", e.accuracy * 100.0));
    let mut l2 = Vec::new();
    l2.extend(kv("step ", step));
    l2.extend(kv("  epoch ", epoch));
    l2.push(Span::raw("  "));
    l2.push(Span::styled(fmt_rate(s.images_per_s), bold()));
    l2.push(Span::styled(" img/s", dim()));
    l2.extend(kv("  loss ", s.last_loss.map_or("-".into(), |l| format!("{l:.4}"))));
    l2.extend(kv("  acc ", acc));
    l2.push(Span::styled("  dropped ", dim()));
    let dropped = Style::default().add_modifier(Modifier::BOLD);
    l2.push(Span::styled(
        s.events_dropped.to_string(),
        if s.events_dropped > 0 { dropped.fg(Color::Red) } else { dropped },
    ));
    l2
}

/// Line 3: the data folder; its filesystem matters (a network drive pays per file).
fn data_line(s: &Summary, w: usize) -> Vec<Span<'static>> {
    let set = &s.settings;
    let mut suffix = Vec::new();
    match &s.data_fs {
        Some(fs) => {
            let remote = fs.kind.is_remote_or_fuse();
            let style = if remote { bold().fg(Color::Yellow) } else { Style::default() };
            suffix.push(Span::styled(format!(" on {} ({})", fs.fs_type, fs.kind.label()), style));
        }
        None => suffix.push(Span::styled(" on an unknown filesystem", dim())),
    }
    suffix.push(Span::styled(format!(" · {} images, {} classes", set.images, set.classes.len()), dim()));
    if s.skipped_count > 0 {
        suffix.push(Span::styled(format!(" · skipped {}", s.skipped_count), bold().fg(Color::Yellow)));
    }
    let room = w.saturating_sub("data ".len() + width(&suffix)).max(12);
    let data = if set.data.is_empty() { "-" } else { set.data.as_str() };
    let mut l3 = vec![Span::styled("data ", dim()), Span::styled(truncate_start(data, room), bold())];
    l3.extend(suffix);
    l3
}
