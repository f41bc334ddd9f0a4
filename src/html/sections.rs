//! The report's text parts: the verdict banner, the run line, the stage and epoch tables.
//! Their words are the text report's and the diagnosis's own.

use super::escape::escape;
use crate::report;
use pipeprof_core::aggregate::Summary;
use pipeprof_core::diagnose::{Limiter, Severity, Verdict};
use std::fmt::Write;

/// The banner's colour class: how much the limiter costs.
fn severity_class(v: &Verdict) -> &'static str {
    match (&v.limiter, v.severity) {
        (Limiter::NotEnoughData { .. }, _) => "pp-sev-none",
        (_, Severity::High) => "pp-sev-high",
        (_, Severity::Moderate) => "pp-sev-moderate",
        (_, Severity::Low) => "pp-sev-low",
    }
}

/// A list of escaped lines, or nothing for none.
fn list(o: &mut String, tag: &str, class: &str, heading: &str, lines: &[String]) {
    if lines.is_empty() {
        return;
    }
    let _ = write!(o, "<h3>{heading}</h3><{tag} class=\"{class}\">");
    for l in lines {
        let _ = writeln!(o, "<li>{}</li>", escape(l));
    }
    let _ = write!(o, "</{tag}>");
}

/// What limits the run, the numbers that decided it, the flags and each piece of advice with
/// its predicted gain.
pub fn verdict(o: &mut String, s: &Summary, v: &Verdict) {
    let _ = write!(o, "<section class=\"pp-verdict {}\" aria-label=\"verdict\">", severity_class(v));
    if let Some(why) = &s.failed {
        let _ = write!(o, "<p class=\"pp-failed\"><strong>RUN FAILED:</strong> {}</p>", escape(why));
    }
    let _ = write!(
        o,
        "<p class=\"pp-eyebrow\">What limits this run</p><h2 class=\"pp-limiter\">{}",
        escape(v.limiter.label())
    );
    if let Some(words) = report::severity_words(v) {
        let _ = write!(o, " <span class=\"pp-badge\">{}</span>", escape(&words));
    }
    let _ = write!(o, "</h2><p class=\"pp-headline\">{}</p>", escape(&v.headline));
    list(o, "ul", "pp-evidence", "Evidence", &v.evidence);
    list(o, "ul", "pp-flags", "Flags", &v.flags.iter().map(|f| f.describe()).collect::<Vec<_>>());
    if !v.advice.is_empty() {
        o.push_str("<h3>Advice</h3><ol class=\"pp-advice\">");
        for a in &v.advice {
            let t = report::advice_text(a);
            // A command is what the reader copies: set as code; plain advice as words.
            let what = if t.action.is_some() {
                format!("<code>{}</code>", escape(&t.what))
            } else {
                format!("<strong>{}</strong>", escape(&t.what))
            };
            let gain = t.gain.map(|g| format!("<span class=\"pp-gain\">{}</span>", escape(&g))).unwrap_or_default();
            let _ = write!(o, "<li><div class=\"pp-advice-head\">{what}{gain}</div>");
            if let Some(action) = t.action {
                let _ = write!(o, "<p class=\"pp-action\">{}</p>", escape(&action));
            }
            let _ = writeln!(o, "<p class=\"pp-reason\">{}</p></li>", escape(&t.reason));
        }
        o.push_str("</ol>");
    }
    o.push_str("</section>\n");
}

/// One figure of the run line.
fn stat(o: &mut String, value: &str, label: &str) {
    let _ = write!(o, "<div class=\"pp-stat\"><dd>{}</dd><dt>{}</dt></div>", escape(value), escape(label));
}

/// The program, device, images/s, steps, images and time, then its settings in one line.
pub fn run_line(o: &mut String, s: &Summary) {
    let st = &s.settings;
    o.push_str("<section class=\"pp-run\" aria-label=\"the run\"><dl class=\"pp-stats\">");
    match report::first_step_apart(s) {
        Some((first_ms, rate)) => {
            stat(o, &format!("{rate:.1}"), "images/s");
            stat(o, &format!("{:.1} s", first_ms / 1000.0), "first step (left out of the rate)");
        }
        None => stat(o, &format!("{:.1}", s.images_per_s), "images/s"),
    }
    stat(o, &s.steps.to_string(), "steps");
    stat(o, &s.images.to_string(), "images");
    stat(o, &format!("{:.1} s", s.elapsed_s), "run time");
    stat(o, if st.device.is_unseen() { "not seen" } else { st.device.name() }, "device");
    o.push_str("</dl>");
    let mut facts = vec![];
    let program = if st.framework.is_own() { "model" } else { "program" };
    let framework = if st.framework.is_own() { String::new() } else { format!(" ({})", st.framework) };
    facts.push(format!("{program} {}{framework}", report::or_dash(&st.model.name())));
    facts.push(format!("data {}", report::data_facts(st)));
    facts.push(format!("{} loader worker{}", st.workers, if st.workers == 1 { "" } else { "s" }));
    facts.push(format!("batch {}", report::known(st.batch_size)));
    facts.push(format!("{} cores", st.cores));
    let _ = write!(o, "<p class=\"pp-facts\">{}</p>", escape(&facts.join(" · ")));
    for sim in &st.simulated {
        let _ =
            write!(o, "<p class=\"pp-sim\">SIMULATION: {}: these timings are not your machine's own</p>", escape(sim));
    }
    o.push_str("</section>\n");
}

/// A table of escaped cells, numbers right-aligned; `indent` marks rows shown under the one
/// before.
fn table(o: &mut String, class: &str, head: &[&str], rows: &[(Vec<String>, bool)]) {
    let _ = write!(o, "<div class=\"pp-scroll\"><table class=\"{class}\"><thead><tr>");
    for h in head {
        let _ = write!(o, "<th scope=\"col\">{}</th>", escape(h));
    }
    o.push_str("</tr></thead><tbody>");
    for (cells, indent) in rows {
        o.push_str(if *indent { "<tr class=\"pp-inner-row\">" } else { "<tr>" });
        for (i, c) in cells.iter().enumerate() {
            if i == 0 {
                let _ = write!(o, "<th scope=\"row\">{}</th>", escape(c));
            } else {
                let _ = write!(o, "<td>{}</td>", escape(c));
            }
        }
        o.push_str("</tr>\n");
    }
    o.push_str("</tbody></table></div>");
}

/// The stage table: the text report's columns and cells.
pub fn stage_table(o: &mut String, s: &Summary) {
    o.push_str("<section aria-label=\"stages\"><h2>Stages</h2>");
    if s.stages.is_empty() {
        o.push_str("<p class=\"pp-note\">no stage was timed</p>");
    } else {
        let rows: Vec<(Vec<String>, bool)> =
            s.stages.iter().map(|x| (report::stage_cells(x).to_vec(), report::is_inner_stage(x))).collect();
        table(o, "pp-table", &report::STAGE_COLUMNS, &rows);
        o.push_str("<p class=\"pp-note\">on-CPU: share of the stage's time on a CPU · core-wait: runnable, waiting for a core · blocked: off CPU for anything else (storage, a lock, a queue)</p>");
    }
    o.push_str("</section>\n");
}

/// The epoch table: the text report's columns and cells.
pub fn epochs(o: &mut String, s: &Summary) {
    o.push_str("<section aria-label=\"epochs\"><h2>Epochs</h2>");
    if s.epochs.is_empty() {
        o.push_str("<p class=\"pp-note\">no epoch was recorded</p>");
    } else {
        let rows: Vec<(Vec<String>, bool)> = s.epochs.iter().map(|e| (report::epoch_cells(s, e), false)).collect();
        table(o, "pp-table", &report::epoch_columns(s), &rows);
    }
    o.push_str("</section>\n");
}
