//! Charts over the chosen window (←/→): step time stacked as wait / transfer / compute, CPU
//! (this process and the machine), GPU utilisation and memory per device (or why GPU sampling
//! is off) and prefetch-queue occupancy. All share one time axis, oldest left.

use super::{dim, fmt_bytes, fmt_ms, fmt_share, section, truncate_end};
use crate::tui::state::{Focus, State, Windowed};
use pipeprof_core::aggregate::machine::gpu::DeviceSummary;
use pipeprof_core::aggregate::StepPoint;
use probes::sampler::GpuStatus;
use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Paragraph, Sparkline, Wrap};
use ratatui::Frame;

const WAIT: (&str, Color) = ("░", Color::Yellow);
const TRANSFER: (&str, Color) = ("▒", Color::Magenta);
const COMPUTE: (&str, Color) = ("█", Color::Green);

fn fmt_window(s: u64) -> String {
    if s > 60 && s % 60 == 0 {
        format!("{}min", s / 60)
    } else {
        format!("{s}s")
    }
}

/// The time axis: the window, or only the part with data while the run is younger than it
/// (a fresh run fills the chart instead of a sliver at its right edge).
fn axis(w: &Windowed) -> (u64, u64) {
    let firsts = [
        w.steps.first().map(|p| p.end_ns.saturating_sub(p.wait_ns + p.transfer_ns + p.compute_ns)),
        w.records.first().map(|r| r.end_ns),
        w.host.first().map(|p| p.t_ns),
        w.gpu.first().map(|p| p.t_ns),
    ];
    let start = firsts.into_iter().flatten().min().map_or(w.from_ns, |t| t.max(w.from_ns));
    (start, w.to_ns.max(start))
}

/// Bucket of time `t` among `n` equal buckets over [start, end].
fn bucket(t: u64, start: u64, end: u64, n: usize) -> usize {
    let span = end.saturating_sub(start) as u128 + 1;
    let i = (t.saturating_sub(start) as u128 * n as u128 / span) as usize;
    i.min(n.saturating_sub(1))
}

/// Periodic samples onto `n` buckets: the mean of the samples in a bucket; a bucket without
/// one holds the previous value (it stands until the next sample), none before the first.
pub fn resample(points: &[(u64, f64)], start: u64, end: u64, n: usize) -> Vec<Option<f64>> {
    let mut sum = vec![0.0; n];
    let mut cnt = vec![0u32; n];
    for &(t, v) in points {
        if n == 0 || t < start || t > end || !v.is_finite() {
            continue;
        }
        let i = bucket(t, start, end, n);
        sum[i] += v;
        cnt[i] += 1;
    }
    let mut last = None;
    (0..n)
        .map(|i| {
            if cnt[i] > 0 {
                last = Some(sum[i] / cnt[i] as f64);
            }
            last
        })
        .collect()
}

/// A labelled sparkline filling `area`: `label` left, the series scaled to `max`.
fn spark(f: &mut Frame, area: Rect, label: &str, points: &[(u64, f64)], axis: (u64, u64), max: f64, color: Color) {
    if area.is_empty() {
        return;
    }
    let lw = (label.chars().count() as u16).min(area.width);
    f.render_widget(Paragraph::new(Line::styled(label.to_string(), dim())), Rect { width: lw, height: 1, ..area });
    let plot = Rect { x: area.x + lw, width: area.width - lw, ..area };
    let vals = resample(points, axis.0, axis.1, plot.width as usize);
    // Sparkline takes integers: hundredths keep the resolution of percentages and counts.
    let data: Vec<Option<u64>> = vals.iter().map(|v| v.map(|v| (v.max(0.0) * 100.0).round() as u64)).collect();
    let top = (max.max(f64::MIN_POSITIVE) * 100.0).round().max(1.0) as u64;
    f.render_widget(Sparkline::default().data(data).max(top).style(Style::default().fg(color)), plot);
}

pub fn render_charts(f: &mut Frame, area: Rect, st: &State) {
    if area.height < 2 || area.width < 8 {
        return;
    }
    let w = st.windowed();
    let ax = axis(&w);
    let cells: Vec<Rect> = if area.width >= 100 && area.height >= 14 {
        let rows = Layout::vertical([Constraint::Fill(1); 2]).split(area);
        rows.iter().flat_map(|r| Layout::horizontal([Constraint::Fill(1); 2]).spacing(2).split(*r).to_vec()).collect()
    } else {
        Layout::horizontal([Constraint::Fill(1); 4]).spacing(1).split(area).to_vec()
    };
    let [a, b, c, d] = [cells[0], cells[1], cells[2], cells[3]];
    render_step_chart(f, a, st, &w, ax);
    render_cpu_chart(f, b, st, &w, ax);
    render_gpu_chart(f, c, st, &w, ax);
    render_queue_chart(f, d, st, &w, ax);
}

fn render_step_chart(f: &mut Frame, area: Rect, st: &State, w: &Windowed, ax: (u64, u64)) {
    let (mut sw, mut stt, mut sc) = (0u64, 0u64, 0u64);
    for p in w.steps {
        sw += p.wait_ns;
        stt += p.transfer_ns;
        sc += p.compute_ns;
    }
    let total = sw + stt + sc;
    let mean_ms = if w.steps.is_empty() { 0.0 } else { total as f64 / w.steps.len() as f64 / 1e6 };
    let title = format!(" step {} · {} ", fmt_ms(mean_ms), fmt_window(st.window_s()));
    let block = section(Line::from(title), st.focus == Focus::Charts);
    let inner = block.inner(area);
    f.render_widget(block, area);
    if inner.is_empty() {
        return;
    }
    let legend_rows = u16::from(inner.height >= 3);
    let plot = Rect { height: inner.height - legend_rows, ..inner };
    let means = step_means(w.steps, ax, plot.width as usize);
    let top = means.iter().flatten().map(|m| m.0 + m.1 + m.2).fold(0.0, f64::max);
    if w.steps.is_empty() {
        f.render_widget(Paragraph::new(Line::styled("no steps in the window yet", dim())), plot);
    } else if top > 0.0 {
        draw_step_bars(f.buffer_mut(), plot, &means, top);
    }
    if legend_rows > 0 {
        let legend = step_legend([sw, stt, sc], top, inner.width as usize);
        let row = Rect { y: inner.bottom() - 1, height: 1, ..inner };
        f.render_widget(Paragraph::new(Line::from(legend)), row);
    }
}

/// The mean (wait, transfer, compute) ns of the steps in each of `n` buckets over `ax`, `None`
/// for a bucket no step touched. Each step covers [end − its time, end]: every bucket it
/// overlaps gets its split, so steps longer than a bucket leave no false gaps.
fn step_means(steps: &[StepPoint], ax: (u64, u64), n: usize) -> Vec<Option<(f64, f64, f64)>> {
    let mut acc = vec![(0.0f64, 0.0f64, 0.0f64, 0u32); n];
    for p in steps {
        let dur = p.wait_ns + p.transfer_ns + p.compute_ns;
        let (b0, b1) = (bucket(p.end_ns.saturating_sub(dur).max(ax.0), ax.0, ax.1, n), bucket(p.end_ns, ax.0, ax.1, n));
        for a in acc.iter_mut().take(b1 + 1).skip(b0) {
            a.0 += p.wait_ns as f64;
            a.1 += p.transfer_ns as f64;
            a.2 += p.compute_ns as f64;
            a.3 += 1;
        }
    }
    acc.iter().map(|a| (a.3 > 0).then(|| (a.0 / a.3 as f64, a.1 / a.3 as f64, a.2 / a.3 as f64))).collect()
}

/// One stacked column per bucket (compute at the bottom, then transfer, then wait), scaled
/// to `top`; a bucket too small to show next to the tallest gets a sliver.
fn draw_step_bars(buf: &mut Buffer, plot: Rect, means: &[Option<(f64, f64, f64)>], top: f64) {
    let h = plot.height as f64;
    for (i, m) in means.iter().enumerate() {
        let Some((mw, mt, mc)) = *m else { continue };
        let rows = |v: f64| (v / top * h).round() as u16;
        let (c_top, t_top) = (rows(mc), rows(mc + mt));
        let mut w_top = rows(mc + mt + mw);
        // Something happened here, however small next to the tallest step: show a sliver.
        let sliver = w_top == 0;
        if sliver {
            w_top = 1;
        }
        for r in 0..w_top.min(plot.height) {
            let (sym, color) = if sliver {
                ("▁", COMPUTE.1)
            } else if r < c_top {
                COMPUTE
            } else if r < t_top {
                TRANSFER
            } else {
                WAIT
            };
            let (x, y) = (plot.x + i as u16, plot.bottom() - 1 - r);
            buf[(x, y)].set_symbol(sym).set_style(Style::default().fg(color));
        }
    }
}

/// The shares of wait, transfer and compute (`[wait, transfer, compute]` ns), in colour with
/// the tallest step where `width` allows, plain, or abbreviated.
fn step_legend([sw, stt, sc]: [u64; 3], top: f64, width: usize) -> Vec<Span<'static>> {
    let total = sw + stt + sc;
    let share = |x: u64| if total > 0 { fmt_share(x as f64 / total as f64) } else { "-".into() };
    let long =
        format!("{}wait {} {}xfer {} {}comp {}", WAIT.0, share(sw), TRANSFER.0, share(stt), COMPUTE.0, share(sc));
    if long.chars().count() + 12 <= width && top > 0.0 {
        vec![
            Span::styled(format!("{}wait {} ", WAIT.0, share(sw)), Style::default().fg(WAIT.1)),
            Span::styled(format!("{}xfer {} ", TRANSFER.0, share(stt)), Style::default().fg(TRANSFER.1)),
            Span::styled(format!("{}comp {}", COMPUTE.0, share(sc)), Style::default().fg(COMPUTE.1)),
            Span::styled(format!("  top {}", fmt_ms(top / 1e6)), dim()),
        ]
    } else if long.chars().count() <= width {
        vec![Span::raw(long)]
    } else {
        vec![
            Span::styled(format!("{}{} ", WAIT.0, share(sw)), Style::default().fg(WAIT.1)),
            Span::styled(format!("{}{} ", TRANSFER.0, share(stt)), Style::default().fg(TRANSFER.1)),
            Span::styled(format!("{}{}", COMPUTE.0, share(sc)), Style::default().fg(COMPUTE.1)),
        ]
    }
}

fn render_cpu_chart(f: &mut Frame, area: Rect, st: &State, w: &Windowed, ax: (u64, u64)) {
    let m = &st.snap.summary.machine;
    let cores = if m.cores > 0 { m.cores } else { st.snap.summary.settings.cores.max(1) };
    let title = match w.host.last() {
        Some(h) if area.width >= 28 => format!(" CPU proc {:.0}% · all {:.0}% ", h.process_cpu_pct, h.global_cpu_pct),
        Some(h) => format!(" CPU {:.0}% · {:.0}% ", h.process_cpu_pct, h.global_cpu_pct),
        None => " CPU ".into(),
    };
    let block = section(Line::from(title), st.focus == Focus::Charts);
    let inner = block.inner(area);
    f.render_widget(block, area);
    if inner.is_empty() {
        return;
    }
    if w.host.is_empty() {
        let p = Paragraph::new(Line::styled("no host samples yet", dim())).wrap(Wrap { trim: true });
        f.render_widget(p, inner);
        return;
    }
    // The spread between the busiest and idlest core tells one hot thread from a busy machine.
    let spread = match (m.idlest_core_mean_pct, m.busiest_core_mean_pct) {
        (Some(lo), Some(hi)) if inner.height >= 3 => Some(format!("cores {lo:.0}–{hi:.0}% ({cores})")),
        _ => None,
    };
    let rows = inner.height - u16::from(spread.is_some());
    let proc_h = rows.div_ceil(2);
    let proc: Vec<(u64, f64)> = w.host.iter().map(|h| (h.t_ns, h.process_cpu_pct as f64)).collect();
    let all: Vec<(u64, f64)> = w.host.iter().map(|h| (h.t_ns, h.global_cpu_pct as f64)).collect();
    // Process CPU is in cores×100%: scale it to the whole machine like the global figure.
    spark(f, Rect { height: proc_h, ..inner }, "proc ", &proc, ax, cores as f64 * 100.0, Color::Cyan);
    let all_area = Rect { y: inner.y + proc_h, height: rows - proc_h, ..inner };
    spark(f, all_area, "all  ", &all, ax, 100.0, Color::Blue);
    if let Some(s) = spread {
        let row = Rect { y: inner.bottom() - 1, height: 1, ..inner };
        f.render_widget(Paragraph::new(Line::styled(s, dim())), row);
    }
}

fn render_gpu_chart(f: &mut Frame, area: Rect, st: &State, w: &Windowed, ax: (u64, u64)) {
    let m = &st.snap.summary.machine;
    let focused = st.focus == Focus::Charts;
    let off = |f: &mut Frame, title: &str, why: String| {
        let block = section(Line::from(format!(" {title} ")), focused);
        let p = Paragraph::new(Line::styled(why, dim())).wrap(Wrap { trim: true }).block(block);
        f.render_widget(p, area);
    };
    match &m.gpu_status {
        None => return off(f, "GPU", "not sampled (--no-gpu, or no sample yet)".into()),
        Some(GpuStatus::Off(reason)) => return off(f, "GPU off", reason.clone()),
        Some(GpuStatus::Ok) => {}
    }
    let n = m.devices.len().max(w.gpu.last().map_or(0, |g| g.util_pct.len()));
    if n == 0 {
        return off(f, "GPU", "NVML lists no device".into());
    }
    let latest = w.gpu.last();
    let util_now = |i: usize| latest.and_then(|g| g.util_pct.get(i).copied().flatten());
    let mut title = String::from(" GPU");
    for i in 0..n {
        match util_now(i) {
            Some(u) => title.push_str(&format!(" {i}:{u:.0}%")),
            None => title.push_str(&format!(" {i}:-")),
        }
    }
    title.push(' ');
    let block = section(Line::from(title), focused);
    let inner = block.inner(area);
    f.render_widget(block, area);
    if inner.is_empty() {
        return;
    }
    // Devices share the height; with two rows or more each gets a text line of its numbers.
    let per = (inner.height / n as u16).max(1);
    for i in 0..n {
        let y = inner.y + per * i as u16;
        if y >= inner.bottom() {
            break;
        }
        let cell = Rect { y, height: per.min(inner.bottom() - y), ..inner };
        let d = m.devices.get(i);
        let util: Vec<(u64, f64)> =
            w.gpu.iter().filter_map(|g| g.util_pct.get(i).copied().flatten().map(|u| (g.t_ns, u as f64))).collect();
        let label = format!("{} ", d.map_or(i as u32, |d| d.index));
        if cell.height >= 2 {
            let mem = latest.and_then(|g| g.mem_used_bytes.get(i).copied().flatten());
            let text = device_line(&label, d, mem, inner.width);
            f.render_widget(Paragraph::new(Line::styled(text, dim())), Rect { height: 1, ..cell });
            let plot = Rect { y: cell.y + 1, height: cell.height - 1, ..cell };
            spark(f, plot, "  ", &util, ax, 100.0, Color::Green);
        } else {
            spark(f, cell, &label, &util, ax, 100.0, Color::Green);
        }
    }
}

/// A GPU's text line over its chart: its label, its name where `width` allows, memory used
/// (of its total), PCIe to the device.
fn device_line(label: &str, d: Option<&DeviceSummary>, mem: Option<u64>, width: u16) -> String {
    let mut text = label.to_string();
    if width >= 40 {
        text.push_str(&truncate_end(d.map_or("", |d| d.name.as_str()), width as usize / 2));
        text.push(' ');
    }
    text.push_str(&match (mem, d.and_then(|d| d.mem_total_bytes)) {
        (Some(u), Some(t)) => format!("mem {}/{}", fmt_bytes(u), fmt_bytes(t)),
        (Some(u), None) => format!("mem {}", fmt_bytes(u)),
        _ => "mem -".into(),
    });
    if let Some(rx) = d.and_then(|d| d.pcie_rx_mean_bytes_per_s).filter(|_| width >= 40) {
        text.push_str(&format!(" · pcie↓ {}/s", fmt_bytes(rx as u64)));
    }
    text
}

fn render_queue_chart(f: &mut Frame, area: Rect, st: &State, w: &Windowed, ax: (u64, u64)) {
    let cap = st.snap.summary.settings.prefetch;
    let title = match w.records.last() {
        Some(r) => format!(" queue {}/{cap} ready ", r.queued),
        None => " queue ".into(),
    };
    let block = section(Line::from(title), st.focus == Focus::Charts);
    let inner = block.inner(area);
    f.render_widget(block, area);
    if inner.is_empty() {
        return;
    }
    if w.records.is_empty() {
        f.render_widget(Paragraph::new(Line::styled("no steps in the window yet", dim())), inner);
        return;
    }
    let legend = inner.height >= 3;
    let plot = Rect { height: inner.height - u16::from(legend), ..inner };
    let pts: Vec<(u64, f64)> = w.records.iter().map(|r| (r.end_ns, r.queued as f64)).collect();
    let top = w.records.iter().map(|r| r.queued as usize).max().unwrap_or(0).max(cap).max(1);
    spark(f, plot, "", &pts, ax, top as f64, Color::Cyan);
    if legend {
        let mean = pts.iter().map(|p| p.1).sum::<f64>() / pts.len() as f64;
        let row = Rect { y: inner.bottom() - 1, height: 1, ..inner };
        let text = format!("mean {mean:.1} of {cap}");
        f.render_widget(Paragraph::new(Line::styled(text, dim())), row);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resample_averages_within_buckets_and_holds_between_samples() {
        let pts = [(0, 10.0), (1, 30.0), (5, 50.0)];
        let v = resample(&pts, 0, 9, 5);
        assert_eq!(v, vec![Some(20.0), Some(20.0), Some(50.0), Some(50.0), Some(50.0)]);
        assert_eq!(resample(&[(8, 1.0)], 0, 9, 5), vec![None, None, None, None, Some(1.0)], "nothing before the first");
        assert!(resample(&pts, 0, 9, 0).is_empty());
    }

    #[test]
    fn bucket_maps_the_ends_inside() {
        assert_eq!(bucket(0, 0, 99, 10), 0);
        assert_eq!(bucket(99, 0, 99, 10), 9);
        assert_eq!(bucket(500, 0, 99, 10), 9);
        assert_eq!(bucket(5, 5, 5, 4), 0);
    }
}
