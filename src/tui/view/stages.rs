//! Stage table: per stage count, mean, p95, its share (of the step for the training loop's
//! stages, of worker time for the loader's), on-CPU / waiting for a core / blocked, and rate.

use super::{bold, dim, fmt_ms, fmt_rate, fmt_share, section};
use crate::tui::state::{Focus, State};
use pipeprof_core::aggregate::ranks::RankLine;
use pipeprof_core::aggregate::{LoaderThread, StageSummary, Summary};
use pipeprof_core::diagnose::ranks::RanksVerdict;
use probes::Stage;
use ratatui::layout::{Constraint, Rect};
use ratatui::style::{Color, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Cell, Paragraph, Row, Table};
use ratatui::Frame;

/// Stages drawn indented: they run inside `compute`.
const SUB_STAGES: [Stage; 3] = [Stage::Forward, Stage::Backward, Stage::Optimizer];
/// Screens this wide also get p50 and max.
const WIDE: u16 = 110;

/// Loader threads drawn under the stages (the busiest), when there are several.
const THREADS_SHOWN: usize = 8;

/// Ranks of a distributed run drawn under the stages (the first ones), one row each.
const RANKS_SHOWN: usize = 8;

/// Rows the table wants: title rule, column header, one per stage, one per loader thread, one
/// per rank of a distributed run.
pub(super) fn rows(st: &State) -> u16 {
    let s = &st.snap.summary;
    2 + s.stages.len().max(1) as u16 + thread_rows(s).len() as u16 + s.ranks.len().min(RANKS_SHOWN) as u16
}

/// The loader threads worth a row: one thread is the whole loader, the stages say it all.
fn thread_rows(s: &Summary) -> &[LoaderThread] {
    if s.loader_threads.len() < 2 {
        return &[];
    }
    &s.loader_threads[..s.loader_threads.len().min(THREADS_SHOWN)]
}

/// The stage's share: of worker time for loader stages, of the training loop for the others.
fn share(s: &Summary, x: &StageSummary) -> f64 {
    if x.stage.is_loader() {
        let worker_ms = s.settings.workers.max(1) as f64 * s.elapsed_s * 1000.0;
        if worker_ms > 0.0 {
            x.total_ms / worker_ms
        } else {
            0.0
        }
    } else {
        let loop_ms: f64 = s
            .stages
            .iter()
            .filter(|y| matches!(y.stage, Stage::Wait | Stage::Transfer | Stage::Compute))
            .map(|y| y.total_ms)
            .sum();
        if loop_ms > 0.0 {
            x.total_ms / loop_ms
        } else {
            0.0
        }
    }
}

/// `█` for on-CPU, `▒` for waiting for a core (other threads held them), `░` for blocked
/// (storage, locks, sleeping), then the on-CPU %. Without a run-queue reading the whole
/// off-CPU part is `░`.
fn cpu_bar(x: &StageSummary, width: usize) -> Line<'static> {
    split_bar(x.on_cpu, x.core_wait, width)
}

/// [`cpu_bar`] from the shares themselves (a loader thread has no core-wait reading).
fn split_bar(on_cpu: Option<f64>, core_wait: Option<f64>, width: usize) -> Line<'static> {
    let Some(on) = on_cpu.filter(|v| v.is_finite()) else {
        return Line::styled("-", dim());
    };
    let on = on.clamp(0.0, 1.0);
    let waiting = core_wait.filter(|v| v.is_finite()).unwrap_or(0.0).clamp(0.0, 1.0 - on);
    let bar = width.saturating_sub(5).max(1);
    let full = (on * bar as f64).round() as usize;
    let queued = ((waiting * bar as f64).round() as usize).min(bar - full);
    Line::from(vec![
        Span::styled("█".repeat(full), Style::default().fg(Color::Green)),
        Span::styled("▒".repeat(queued), Style::default().fg(Color::Yellow)),
        Span::styled("░".repeat(bar - full - queued), Style::default().fg(Color::Red)),
        Span::raw(format!("{:>5}", fmt_share(on))),
    ])
}

pub fn render_stages(f: &mut Frame, area: Rect, st: &State) {
    if area.height == 0 {
        return;
    }
    let s = &st.snap.summary;
    let title = if area.width >= 72 {
        " stages · share = of step time (loop) / of worker time (loader) "
    } else {
        " stages · share of step / of worker time "
    };
    let block = section(Line::from(title), st.focus == Focus::Stages);
    if s.stages.is_empty() {
        let p = Paragraph::new(Line::styled("no stage timings yet: waiting for the first spans", dim())).block(block);
        f.render_widget(p, area);
        return;
    }
    let cols = Columns::for_width(area.width);
    let rows = s.stages.iter().map(|x| stage_row(s, x, &cols));
    let run_ms = s.elapsed_s * 1000.0;
    let threads = thread_rows(s).iter().map(|t| thread_row(t, run_ms, &cols));
    let ranks = s.ranks.iter().take(RANKS_SHOWN).map(|l| rank_row(l, st.straggler.as_ref(), &cols));
    let rows = rows.chain(threads).chain(ranks);
    let table = Table::new(rows, cols.widths.iter().copied().map(Constraint::Length))
        .header(Row::new(header(&cols)).style(bold()))
        .column_spacing(1)
        .block(block);
    f.render_widget(table, area);
}

/// The table's columns for a screen width: p50 and max on wide screens, the CPU bar taking
/// what is left.
struct Columns {
    wide: bool,
    widths: Vec<u16>,
    head: Vec<&'static str>,
    bar_w: u16,
}

impl Columns {
    fn for_width(width: u16) -> Columns {
        let wide = width >= WIDE;
        let (mut widths, mut head) = if wide {
            (vec![11u16, 7, 8, 8, 8, 8], vec!["stage", "count", "mean", "p50", "p95", "max"])
        } else {
            (vec![11u16, 7, 8, 8], vec!["stage", "count", "mean", "p95"])
        };
        widths.push(6);
        head.push("share");
        let fixed: u16 = widths.iter().sum::<u16>() + 8 + widths.len() as u16 + 1;
        let bar_w = width.saturating_sub(fixed).clamp(8, 40);
        widths.push(bar_w);
        widths.push(8);
        Columns { wide, widths, head, bar_w }
    }

    /// Empty cells where a stage row has p50/p95/max (or p95 alone).
    fn blanks(&self) -> impl Iterator<Item = Cell<'static>> {
        let blanks = if self.wide { 3 } else { 1 };
        (0..blanks).map(|_| Cell::from(""))
    }
}

/// A right-aligned cell.
fn right(t: String) -> Cell<'static> {
    Cell::from(Line::from(t).right_aligned())
}

/// The column header, the CPU bar's legend in full where the bar is wide enough,
/// abbreviated otherwise.
fn header(cols: &Columns) -> Vec<Cell<'static>> {
    let mut header: Vec<Cell> =
        cols.head.iter().enumerate().map(|(i, h)| if i == 0 { Cell::from(*h) } else { right(h.to_string()) }).collect();
    let (on, queue) = if cols.bar_w >= 27 { ("on-CPU ", "core wait ") } else { ("CPU ", "core ") };
    header.push(Cell::from(Line::from(vec![
        Span::styled("█", Style::default().fg(Color::Green)),
        Span::raw(on),
        Span::styled("▒", Style::default().fg(Color::Yellow)),
        Span::raw(queue),
        Span::styled("░", Style::default().fg(Color::Red)),
        Span::raw("blocked"),
    ])));
    header.push(right("per s".into()));
    header
}

/// One stage: count, mean, (p50,) p95, (max,) its share, its CPU bar, its rate.
fn stage_row(s: &Summary, x: &StageSummary, cols: &Columns) -> Row<'static> {
    let sub = SUB_STAGES.contains(&x.stage);
    let name = if sub { format!("  {}", x.stage) } else { x.stage.to_string() };
    let name_style = if x.stage.is_loader() { Style::default().fg(Color::Blue) } else { Style::default() };
    let mut cells =
        vec![Cell::from(Span::styled(name, name_style)), right(x.count.to_string()), right(fmt_ms(x.mean_ms))];
    if cols.wide {
        cells.push(right(fmt_ms(x.p50_ms)));
    }
    cells.push(right(fmt_ms(x.p95_ms)));
    if cols.wide {
        cells.push(right(fmt_ms(x.max_ms)));
    }
    let sh = share(s, x);
    // "0%" would read as "never": say it was measured but small.
    let sh = if sh > 0.0 && sh < 0.005 { "<1%".to_string() } else { fmt_share(sh) };
    cells.push(Cell::from(Line::styled(sh, bold()).right_aligned()));
    cells.push(Cell::from(cpu_bar(x, cols.bar_w as usize)));
    cells.push(right(fmt_rate(x.per_second)));
    Row::new(cells)
}

/// One loader thread (a worker process's included): its share of worker time and its
/// on/off-CPU split, so one slow or I/O-bound worker stands out.
fn thread_row(t: &LoaderThread, run_ms: f64, cols: &Columns) -> Row<'static> {
    let mut cells = vec![
        Cell::from(Span::styled(super::truncate_end(&format!("↳ {}", t.name), 11), dim())),
        right(t.spans.to_string()),
        right(fmt_ms(if t.spans > 0 { t.busy_ms / t.spans as f64 } else { 0.0 })),
    ];
    cells.extend(cols.blanks());
    // Of the run's time: how busy this one thread was.
    let sh = if run_ms > 0.0 { t.busy_ms / run_ms } else { 0.0 };
    cells.push(Cell::from(Line::styled(fmt_share(sh.min(1.0)), dim()).right_aligned()));
    cells.push(Cell::from(split_bar(t.on_cpu, None, cols.bar_w as usize)));
    // A worker started again each epoch is one row: how often it started.
    cells.push(if t.starts > 1 {
        Cell::from(Line::styled(format!("{}× start", t.starts), dim()).right_aligned())
    } else {
        Cell::from("")
    });
    Row::new(cells)
}

/// One rank of a distributed run: its steps, mean step, share waiting for data, its
/// all-reduce wait and the straggler mark, images/s.
fn rank_row(l: &RankLine, verdict: Option<&RanksVerdict>, cols: &Columns) -> Row<'static> {
    let straggler = verdict.is_some_and(|v| v.straggler == Some(l.rank));
    let sync = verdict.and_then(|v| v.sync_wait_ms.iter().find(|(r, _)| *r == l.rank)).map(|x| x.1);
    let name = format!("⇉ rank {}", l.rank);
    let style = if straggler { Style::default().fg(Color::Red) } else { Style::default() };
    let mut cells = vec![Cell::from(Span::styled(name, style)), right(l.steps.to_string()), right(fmt_ms(l.step_ms))];
    cells.extend(cols.blanks());
    cells.push(Cell::from(Line::styled(fmt_share(l.wait_share), bold()).right_aligned()));
    // The mark first: the column may cut the end.
    let mut what = if straggler { "straggler · ".to_string() } else { String::new() };
    what.push_str(&format!("wait for data {}", fmt_ms(l.wait_ms)));
    if let Some(w) = sync {
        what.push_str(&format!(" · all-reduce {}", fmt_ms(w)));
    }
    cells.push(Cell::from(Span::styled(what, style)));
    cells.push(right(fmt_rate(l.images_per_s)));
    Row::new(cells)
}
