//! The report's four charts, from the summary: the step split over the run, each stage's
//! share, each loader worker's busy time, CPU and GPU utilisation over the run.

use super::escape::escape;
use super::svg::{self, Frame};
use pipeprof_core::aggregate::timeline::TimelineBucket;
use pipeprof_core::aggregate::Summary;
use pipeprof_core::units::{ms, pct};
use probes::Stage;
use std::fmt::Write;

/// A time chart: as wide as a half page on a laptop, a whole one on a phone.
const TIME: Frame = Frame { width: 480.0, height: 230.0, left: 44.0, right: 14.0, top: 26.0, bottom: 40.0 };

/// Said where a chart over time would be, for a summary written before the timeline was kept.
pub const NO_TIMELINE: &str =
    "no timeline in this summary (written by an older pipeprof): the charts over time are left out";

/// A chart's box: its title, what it shows, then `body`.
fn card(o: &mut String, class: &str, title: &str, about: &str, body: &str) {
    let _ = writeln!(
        o,
        "<figure class=\"pp-card {class}\"><figcaption><h3>{}</h3><p>{}</p></figcaption>{body}</figure>",
        escape(title),
        escape(about)
    );
}

/// A legend: one swatch of class `class` per entry.
fn legend(entries: &[(&str, String)]) -> String {
    let items: String = entries
        .iter()
        .map(|(class, words)| format!("<li><i class=\"pp-sw {class}\"></i>{}</li>\n", escape(words)))
        .collect();
    format!("<ul class=\"pp-legend\">{items}</ul>")
}

fn note(words: &str) -> String {
    format!("<p class=\"pp-note\">{}</p>", escape(words))
}

/// The x scale of a timeline: from 0 to its last bucket's end, and the round ticks inside.
fn time_scale(t: &[TimelineBucket]) -> (f64, Vec<f64>) {
    let end = t.iter().map(|b| b.t_s + b.width_s).filter(|x| x.is_finite()).fold(0.0, f64::max);
    let ticks: Vec<f64> = svg::ticks(end, 5).into_iter().filter(|x| *x <= end * (1.0 + 1e-9)).collect();
    (if end > 0.0 { end } else { 1.0 }, ticks)
}

/// Wait, transfer and compute per step over the run, stacked (wait at the bottom, where it
/// is read against the axis).
pub fn step_split(o: &mut String, s: &Summary) {
    let title = "Step time over the run";
    let about = "Each bar is a slice of the run: the mean step in it, split into waiting for data, copying to the device and computing.";
    if s.timeline.is_empty() {
        return card(o, "pp-time", title, about, &note(NO_TIMELINE));
    }
    let t = &s.timeline;
    let f = TIME;
    let (x_max, xt) = time_scale(t);
    let totals: Vec<f64> = t.iter().map(|b| b.wait_ms + b.transfer_ms + b.compute_ms).collect();
    let (cap, cut) = svg::y_cap(&totals);
    let yt = svg::ticks(cap, 4);
    let y_max = yt.last().copied().unwrap_or(1.0);
    let mut g = svg::open(&f, "step time over the run: wait for data, transfer and compute per step");
    svg::y_axis(&mut g, &f, &yt, "ms per step");
    for (b, total) in t.iter().zip(&totals) {
        let (x0, x1) = (f.x(b.t_s, x_max), f.x(b.t_s + b.width_s, x_max));
        let w = if x1 - x0 > 3.0 { x1 - x0 - 1.0 } else { x1 - x0 };
        let tip = format!(
            "{}–{} s: {} steps · wait {} · transfer {} · compute {}",
            svg::num(b.t_s),
            svg::num(b.t_s + b.width_s),
            b.steps,
            ms(b.wait_ms),
            ms(b.transfer_ms),
            ms(b.compute_ms)
        );
        let mut low = 0.0f64;
        for (class, v) in [("pp-wait", b.wait_ms), ("pp-transfer", b.transfer_ms), ("pp-compute", b.compute_ms)] {
            let high = (low + v.max(0.0)).min(y_max);
            let (top, bottom) = (f.y(high, y_max), f.y(low, y_max));
            svg::rect(&mut g, class, x0, top, w, bottom - top, &tip);
            low = high;
        }
        if *total > y_max {
            let (cx, y) = (x0 + w / 2.0, f.top);
            let _ = writeln!(
                g,
                "<path class=\"pp-cut\" d=\"M{:.1},{:.1}L{cx:.1},{:.1}L{:.1},{:.1}Z\"><title>{}</title></path>",
                cx - 4.0,
                y + 2.0,
                y - 5.0,
                cx + 4.0,
                y + 2.0,
                escape(&tip)
            );
        }
    }
    svg::x_axis(&mut g, &f, &xt, x_max, "s into the run");
    g.push_str("</svg>\n");
    g.push_str(&split_legend(s));
    if cut {
        g.push_str(&note(&format!(
            "Bars over {} per step are cut (▲): a slice with a start-up step (filling the queue, compiling) would flatten the rest.",
            ms(y_max)
        )));
    }
    card(o, "pp-time", title, about, &g);
}

/// The step split's legend, with the run's means (the text report's figures).
fn split_legend(s: &Summary) -> String {
    let sp = &s.split;
    let transfer = if s.settings.transfer_unmeasured {
        "transfer: not timed apart (inside compute)".to_string()
    } else {
        format!("transfer {} ({})", ms(sp.transfer_ms), pct(sp.transfer_share))
    };
    legend(&[
        ("pp-wait", format!("wait for data {} ({})", ms(sp.wait_ms), pct(sp.wait_share))),
        ("pp-transfer", transfer),
        ("pp-compute", format!("compute {} ({})", ms(sp.compute_ms), pct(sp.compute_share))),
    ])
}

/// One row of a horizontal bar chart: a group heading has no bars.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub label: String,
    /// (length on the scale, class, tooltip).
    pub bars: Vec<(f64, &'static str, String)>,
    pub value: String,
    pub heading: bool,
}

impl Row {
    fn heading(label: &str) -> Row {
        Row { label: label.into(), bars: Vec::new(), value: String::new(), heading: true }
    }
    fn bar(label: &str, share: f64, class: &'static str, value: String) -> Row {
        let tip = format!("{label}: {value}");
        Row { label: label.into(), bars: vec![(share, class, tip)], value, heading: false }
    }
}

/// Each stage's share of what it is part of: the step's parts of a step (the text report's
/// split), forward / backward / optimizer of compute, the loader stages of the loader's work,
/// validation of the run's wall time. Pure.
fn stage_rows(s: &Summary) -> Vec<Row> {
    let mut rows = Vec::new();
    let stage = |st: Stage| s.stages.iter().find(|x| x.is(st) && x.count > 0);
    let sp = &s.split;
    if sp.mean_step_ms > 0.0 {
        rows.push(Row::heading("training step: share of a step"));
        let value = |share: f64, v: f64| format!("{} · {}", pct(share), ms(v));
        rows.push(Row::bar("wait", sp.wait_share, "pp-wait", value(sp.wait_share, sp.wait_ms)));
        if !s.settings.transfer_unmeasured {
            rows.push(Row::bar("transfer", sp.transfer_share, "pp-transfer", value(sp.transfer_share, sp.transfer_ms)));
        }
        rows.push(Row::bar("compute", sp.compute_share, "pp-compute", value(sp.compute_share, sp.compute_ms)));
    }
    let compute = stage(Stage::Compute).map(|c| c.mean_ms).filter(|c| *c > 0.0);
    let inner: Vec<_> = [Stage::Forward, Stage::Backward, Stage::Optimizer].into_iter().filter_map(stage).collect();
    if let (Some(c), false) = (compute, inner.is_empty()) {
        rows.push(Row::heading("inside compute: share of compute"));
        for x in inner {
            let share = (x.mean_ms / c).min(1.0);
            rows.push(Row::bar(x.stage.name(), share, "pp-inner", format!("{} · {}", pct(share), ms(x.mean_ms))));
        }
    }
    let loader: Vec<_> = Stage::ALL.iter().filter(|st| st.is_loader()).filter_map(|st| stage(*st)).collect();
    let loader_ms: f64 = loader.iter().map(|x| x.total_ms).sum();
    if loader_ms > 0.0 {
        rows.push(Row::heading("loader: share of the loader's work"));
        for x in loader {
            let share = x.total_ms / loader_ms;
            rows.push(Row::bar(x.stage.name(), share, "pp-loader", format!("{} · {}", pct(share), ms(x.mean_ms))));
        }
    }
    if let Some(v) = s.validation_share() {
        rows.push(Row::heading("validation: share of the run's wall time"));
        rows.push(Row::bar("validate", v, "pp-validate", pct(v)));
    }
    rows
}

/// Each loader worker's busy time as a share of the run, on-CPU and off-CPU apart; the
/// workers past the text report's list summed in one row. Pure.
fn worker_rows(s: &Summary) -> Vec<Row> {
    let run_ms = s.elapsed_s * 1000.0;
    let scale = if run_ms > 0.0 { run_ms } else { s.loader_threads.iter().map(|t| t.busy_ms).fold(0.0, f64::max) };
    let listed = crate::report::LOADER_THREADS_LISTED;
    let mut rows: Vec<Row> = s
        .loader_threads
        .iter()
        .take(listed)
        .map(|t| {
            let busy = (t.busy_ms / scale.max(f64::MIN_POSITIVE)).clamp(0.0, 1.0);
            let starts = if t.starts > 1 { format!(" · started {}×", t.starts) } else { String::new() };
            let tip = format!("{}: busy {} in {} spans{starts}", t.name, ms(t.busy_ms), t.spans);
            let (bars, value) = match t.on_cpu {
                Some(on) => (
                    vec![(busy * on, "pp-oncpu", tip.clone()), (busy * (1.0 - on), "pp-offcpu", tip)],
                    format!("{} · {} on-CPU", pct(busy), pct(on)),
                ),
                None => (vec![(busy, "pp-oncpu", tip)], pct(busy)),
            };
            Row { label: t.name.clone(), bars, value, heading: false }
        })
        .collect();
    let rest = &s.loader_threads[s.loader_threads.len().min(listed)..];
    if !rest.is_empty() {
        let busy: f64 = rest.iter().map(|t| t.busy_ms).sum();
        let label = format!("… and {} more", rest.len());
        let share = (busy / scale.max(f64::MIN_POSITIVE) / rest.len() as f64).clamp(0.0, 1.0);
        rows.push(Row::bar(&label, share, "pp-offcpu", format!("{} each, on average", pct(share))));
    }
    rows
}

/// Characters of a bar's label shown (the whole one is its tooltip).
const LABEL_CHARS: usize = 16;

/// Rows as horizontal bars on a 0–100% scale.
fn bars(rows: &[Row], label: &str) -> String {
    // Columns as wide as their longest text at the largest font the style gives them (a
    // phone's): ≈ 0.55 em a character.
    let chars = |f: fn(&Row) -> usize| rows.iter().filter(|r| !r.heading).map(f).max().unwrap_or(0) as f64;
    let left = 14.0 + 8.0 * chars(|r| r.label.chars().count().min(LABEL_CHARS)).max(6.0);
    let right_text = 10.0 + 7.5 * chars(|r| r.value.chars().count());
    let row_h = 24.0;
    let height = 16.0 + rows.len() as f64 * row_h;
    let f = Frame { width: 480.0, height, left, right: right_text, top: 10.0, bottom: 6.0 };
    let mut g = svg::open(&f, label);
    for t in [0.25, 0.5, 0.75, 1.0] {
        let x = f.x(t, 1.0);
        let _ = writeln!(
            g,
            "<line class=\"pp-grid\" x1=\"{x:.1}\" x2=\"{x:.1}\" y1=\"{:.1}\" y2=\"{:.1}\"/>",
            f.top,
            height - f.bottom
        );
    }
    for (i, r) in rows.iter().enumerate() {
        let y = f.top + i as f64 * row_h;
        if r.heading {
            svg::text(&mut g, "pp-group", 0.0, y + 17.0, "start", &r.label);
            continue;
        }
        let shown: String = if r.label.chars().count() > LABEL_CHARS {
            r.label.chars().take(LABEL_CHARS - 1).chain(['…']).collect()
        } else {
            r.label.clone()
        };
        let _ = writeln!(
            g,
            "<text class=\"pp-label\" x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}<title>{}</title></text>",
            left - 8.0,
            y + 16.0,
            escape(&shown),
            escape(&r.label)
        );
        let mut x = left;
        for (share, class, tip) in &r.bars {
            let w = f.plot_w() * share.clamp(0.0, 1.0);
            svg::rect(&mut g, class, x, y + 5.0, w, row_h - 10.0, tip);
            x += w;
        }
        svg::text(&mut g, "pp-value", f.width - 2.0, y + 16.0, "end", &r.value);
    }
    g.push_str("</svg>\n");
    g
}

/// Each stage's share, as bars.
pub fn stage_shares(o: &mut String, s: &Summary) {
    let title = "Where the time goes, stage by stage";
    let about = "Each stage's share of what it is part of, and the mean time it takes each time it runs.";
    let rows = stage_rows(s);
    let body = if rows.is_empty() { note("no stage was timed") } else { bars(&rows, "each stage's share") };
    card(o, "pp-bars", title, about, &body);
}

/// Each loader worker's busy time, as bars.
pub fn workers(o: &mut String, s: &Summary) {
    let title = "Loader workers";
    let about = "How much of the run each worker spent making samples: on a CPU, or off it (waiting on storage, a lock or a core).";
    let rows = worker_rows(s);
    let body = if rows.is_empty() {
        note("no loader worker was seen: the training thread made every batch itself, inside its wait")
    } else {
        let mut b = bars(&rows, "each loader worker's busy share of the run");
        b.push_str(&legend(&[
            ("pp-oncpu", "on a CPU".into()),
            ("pp-offcpu", "off CPU: storage, a lock or a core".into()),
        ]));
        b
    };
    card(o, "pp-bars", title, about, &body);
}

/// The profiled process's CPU and the run's GPUs over the run: two panels, one time axis.
pub fn utilisation(o: &mut String, s: &Summary) {
    let title = "CPU and GPU over the run";
    let about = "The profiled process's CPU (100% = one core) and the run's GPU utilisation, sampled.";
    if s.timeline.is_empty() {
        return card(o, "pp-time", title, about, &note(NO_TIMELINE));
    }
    let t = &s.timeline;
    let (x_max, xt) = time_scale(t);
    let mid = |b: &TimelineBucket| b.t_s + b.width_s / 2.0;
    let cpu: Vec<(f64, Option<f64>)> = t.iter().map(|b| (mid(b), b.cpu_pct)).collect();
    let gpu: Vec<(f64, Option<f64>)> = t.iter().map(|b| (mid(b), b.gpu_util_pct)).collect();
    let cpu_top = cpu.iter().filter_map(|p| p.1).fold(100.0, f64::max);
    let cpu_ticks = svg::ticks(cpu_top, 2);
    let has_gpu = gpu.iter().any(|p| p.1.is_some());
    // One panel each, one time axis under the last.
    let full = Frame { height: if has_gpu { 270.0 } else { 160.0 }, ..TIME };
    let cpu_frame = if has_gpu { Frame { height: 135.0, bottom: 22.0, ..full } } else { full };
    let mut g = svg::open(&full, "CPU and GPU utilisation over the run");
    svg::y_axis(&mut g, &cpu_frame, &cpu_ticks, "process CPU %");
    svg::line(&mut g, &cpu_frame, "pp-cpu", &cpu, x_max, cpu_ticks.last().copied().unwrap_or(100.0));
    if has_gpu {
        let gpu_frame = Frame { top: 135.0 + 26.0, ..full };
        svg::y_axis(&mut g, &gpu_frame, &[0.0, 50.0, 100.0], "GPU utilisation %");
        svg::line(&mut g, &gpu_frame, "pp-gpu", &gpu, x_max, 100.0);
        svg::x_axis(&mut g, &gpu_frame, &xt, x_max, "s into the run");
    } else {
        svg::x_axis(&mut g, &cpu_frame, &xt, x_max, "s into the run");
    }
    g.push_str("</svg>\n");
    if has_gpu {
        g.push_str(&legend(&[("pp-cpu", "process CPU".into()), ("pp-gpu", "GPU utilisation".into())]));
    } else {
        g.push_str(&legend(&[("pp-cpu", "process CPU".into())]));
        g.push_str(&note(&format!("No GPU line: {}.", no_gpu_words(s))));
    }
    card(o, "pp-time", title, about, &g);
}

/// Why there is no GPU line, in the text report's words.
fn no_gpu_words(s: &Summary) -> String {
    match &s.machine.gpu_status {
        None => "GPU not sampled (--no-gpu)".into(),
        Some(probes::sampler::GpuStatus::Off(reason)) => format!("GPU off: {reason}"),
        Some(probes::sampler::GpuStatus::Ok) => "no GPU found".into(),
    }
}
