//! Chart geometry and SVG pieces: axes with round ticks, bars, lines. Pure; every text
//! handed in is escaped here.

use super::escape::escape;
use std::fmt::Write;

/// A chart's plot area inside its SVG, in the SVG's own units.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Frame {
    pub width: f64,
    pub height: f64,
    pub left: f64,
    pub right: f64,
    pub top: f64,
    pub bottom: f64,
}

impl Frame {
    pub fn plot_w(&self) -> f64 {
        (self.width - self.left - self.right).max(1.0)
    }
    fn plot_h(&self) -> f64 {
        (self.height - self.top - self.bottom).max(1.0)
    }
    /// The x of `v` on a scale from 0 to `max`.
    pub fn x(&self, v: f64, max: f64) -> f64 {
        self.left + self.plot_w() * ratio(v, max)
    }
    /// The y of `v` on a scale from 0 (bottom) to `max` (top).
    pub fn y(&self, v: f64, max: f64) -> f64 {
        self.top + self.plot_h() * (1.0 - ratio(v, max))
    }
}

/// `v / max` held to 0..=1 (0 for a scale without length or a value that is not a number).
fn ratio(v: f64, max: f64) -> f64 {
    if max > 0.0 && v.is_finite() {
        (v / max).clamp(0.0, 1.0)
    } else {
        0.0
    }
}

/// Round tick values from 0 up to the first at or over `max` (steps of 1, 2, 2.5 or 5 × 10ⁿ),
/// about `target` of them. Pure.
pub fn ticks(max: f64, target: usize) -> Vec<f64> {
    if !(max.is_finite() && max > 0.0) {
        return vec![0.0, 1.0];
    }
    let raw = max / target.max(1) as f64;
    let exp = raw.log10().floor() as i32;
    let mag = 10f64.powi(exp);
    let m = [1.0, 2.0, 2.5, 5.0, 10.0].into_iter().find(|m| m * mag >= raw).unwrap_or(10.0);
    let n = (max / (m * mag) - 1e-9).ceil().max(1.0) as usize;
    // i × m × 10ⁿ computed so that 0.6 is 0.6, not 0.6000000000000001.
    let at = |i: usize| if exp < 0 { i as f64 * m / 10f64.powi(-exp) } else { i as f64 * m * mag };
    (0..=n).map(at).collect()
}

/// The top of a bar chart's scale: the tallest bar, unless a few bars (a start-up step
/// compiling kernels) stand over twice the 90th percentile: then that, and the taller
/// bars are drawn cut with a mark. Returns the top and whether bars are cut. Pure.
pub fn y_cap(values: &[f64]) -> (f64, bool) {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite() && *x > 0.0).collect();
    if v.is_empty() {
        return (0.0, false);
    }
    v.sort_by(f64::total_cmp);
    let max = v[v.len() - 1];
    let p90 = v[((v.len() - 1) as f64 * 0.9).round() as usize];
    let cap = 2.0 * p90;
    if max > cap {
        (cap, true)
    } else {
        (max, false)
    }
}

/// A number for an axis or a label: `0`, `0.25`, `2.5`, `40`, `1.2k`. Pure.
pub fn num(v: f64) -> String {
    let a = v.abs();
    if !v.is_finite() {
        "-".into()
    } else if a >= 10_000.0 {
        format!("{:.0}k", v / 1000.0)
    } else if a >= 1000.0 {
        format!("{:.1}k", v / 1000.0).replace(".0k", "k")
    } else if a >= 10.0 || a == 0.0 {
        format!("{v:.0}")
    } else if a >= 1.0 {
        trim(format!("{v:.1}"))
    } else {
        trim(format!("{v:.2}"))
    }
}

fn trim(s: String) -> String {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// The opening tag of a chart: scales with its box, named for screen readers.
pub fn open(f: &Frame, label: &str) -> String {
    format!(
        "<svg class=\"pp-chart\" viewBox=\"0 0 {} {}\" role=\"img\" aria-label=\"{}\">\n",
        f.width,
        f.height,
        escape(label)
    )
}

/// Horizontal grid lines and their labels from 0 to `max` (the last tick), and the axis title
/// above them.
pub fn y_axis(o: &mut String, f: &Frame, ticks: &[f64], title: &str) {
    let max = ticks.last().copied().unwrap_or(1.0);
    for t in ticks {
        let y = f.y(*t, max);
        let _ = writeln!(
            o,
            "<line class=\"pp-grid\" x1=\"{:.1}\" x2=\"{:.1}\" y1=\"{y:.1}\" y2=\"{y:.1}\"/><text class=\"pp-tick\" x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            f.left,
            f.left + f.plot_w(),
            f.left - 6.0,
            y + 4.0,
            num(*t)
        );
    }
    let _ =
        writeln!(o, "<text class=\"pp-axis\" x=\"{:.1}\" y=\"{:.1}\">{}</text>", f.left, f.top - 12.0, escape(title));
}

/// Tick labels under the plot on a scale from 0 to `max`, and the axis title at its end.
pub fn x_axis(o: &mut String, f: &Frame, ticks: &[f64], max: f64, title: &str) {
    let base = f.top + f.plot_h();
    let _ = writeln!(
        o,
        "<line class=\"pp-base\" x1=\"{:.1}\" x2=\"{:.1}\" y1=\"{base:.1}\" y2=\"{base:.1}\"/>",
        f.left,
        f.left + f.plot_w()
    );
    for t in ticks {
        let x = f.x(*t, max);
        let _ = writeln!(
            o,
            "<text class=\"pp-tick\" x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
            base + 16.0,
            num(*t)
        );
    }
    let _ = writeln!(
        o,
        "<text class=\"pp-axis\" x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
        f.left + f.plot_w(),
        base + 32.0,
        escape(title)
    );
}

/// A rectangle of class `class` with a tooltip; nothing for one without area.
pub fn rect(o: &mut String, class: &str, x: f64, y: f64, w: f64, h: f64, tip: &str) {
    if w <= 0.0 || h <= 0.0 || !(x.is_finite() && y.is_finite() && w.is_finite() && h.is_finite()) {
        return;
    }
    let _ = writeln!(
        o,
        "<rect class=\"{class}\" x=\"{x:.1}\" y=\"{y:.1}\" width=\"{w:.1}\" height=\"{h:.1}\"><title>{}</title></rect>",
        escape(tip)
    );
}

/// A text at (`x`, `y`) of class `class`, anchored `anchor`.
pub fn text(o: &mut String, class: &str, x: f64, y: f64, anchor: &str, words: &str) {
    let _ = writeln!(
        o,
        "<text class=\"{class}\" x=\"{x:.1}\" y=\"{y:.1}\" text-anchor=\"{anchor}\">{}</text>",
        escape(words)
    );
}

/// Lines through the points, broken where a value is missing, each with the area under it.
pub fn line(o: &mut String, f: &Frame, class: &str, points: &[(f64, Option<f64>)], x_max: f64, y_max: f64) {
    let base = f.top + f.plot_h();
    for run in points.split(|(_, v)| v.is_none()).filter(|r| !r.is_empty()) {
        let xy: Vec<(f64, f64)> = run.iter().filter_map(|(x, v)| v.map(|v| (f.x(*x, x_max), f.y(v, y_max)))).collect();
        let path: Vec<String> = xy.iter().map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
        let (first, last) = (xy[0].0, xy[xy.len() - 1].0);
        let _ = writeln!(
            o,
            "<polygon class=\"{class} pp-area\" points=\"{first:.1},{base:.1} {} {last:.1},{base:.1}\"/>",
            path.join(" ")
        );
        if xy.len() == 1 {
            let (x, y) = xy[0];
            let _ = writeln!(o, "<circle class=\"{class} pp-dot\" cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"2.5\"/>");
        } else {
            let _ = writeln!(o, "<polyline class=\"{class} pp-line\" points=\"{}\"/>", path.join(" "));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round_and_reach_the_maximum() {
        // (max, target, ticks)
        let table: [(f64, usize, &[f64]); 7] = [
            (100.0, 4, &[0.0, 25.0, 50.0, 75.0, 100.0]),
            (7.3, 4, &[0.0, 2.0, 4.0, 6.0, 8.0]),
            (0.42, 4, &[0.0, 0.2, 0.4, 0.6]),
            (1234.0, 4, &[0.0, 500.0, 1000.0, 1500.0]),
            (10.0, 5, &[0.0, 2.0, 4.0, 6.0, 8.0, 10.0]),
            (0.0, 4, &[0.0, 1.0]),
            (f64::NAN, 4, &[0.0, 1.0]),
        ];
        for (max, target, want) in table {
            assert_eq!(ticks(max, target), want, "{max}");
        }
    }

    #[test]
    fn a_start_up_spike_is_cut_and_a_real_change_is_not() {
        // (bar heights, top of the scale, cut)
        let table: Vec<(Vec<f64>, f64, bool)> = vec![
            (vec![], 0.0, false),
            (vec![10.0, 12.0, 11.0], 12.0, false),
            // One compile step of 900 ms among 20 of 10 ms.
            ([vec![900.0], vec![10.0; 20]].concat(), 20.0, true),
            // Half the run at 40 ms, half at 10 ms (workers added): drawn whole.
            ([vec![40.0; 10], vec![10.0; 10]].concat(), 40.0, false),
            (vec![f64::NAN, 5.0, f64::INFINITY], 5.0, false),
        ];
        for (values, top, cut) in table {
            assert_eq!(y_cap(&values), (top, cut), "{values:?}");
        }
    }

    #[test]
    fn numbers_are_short() {
        let table = [
            (0.0, "0"),
            (0.25, "0.25"),
            (2.5, "2.5"),
            (2.0, "2"),
            (40.0, "40"),
            (1200.0, "1.2k"),
            (3000.0, "3k"),
            (25_000.0, "25k"),
        ];
        for (v, want) in table {
            assert_eq!(num(v), want, "{v}");
        }
    }

    #[test]
    fn scales_hold_values_inside_the_plot() {
        let f = Frame { width: 100.0, height: 100.0, left: 10.0, right: 10.0, top: 10.0, bottom: 10.0 };
        assert_eq!((f.x(0.0, 10.0), f.x(10.0, 10.0), f.x(50.0, 10.0)), (10.0, 90.0, 90.0));
        assert_eq!((f.y(0.0, 10.0), f.y(10.0, 10.0), f.y(f64::NAN, 10.0)), (90.0, 10.0, 90.0));
        assert_eq!(f.x(5.0, 0.0), 10.0, "a scale without length");
    }
}
