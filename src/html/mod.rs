//! The report of a finished run as one self-contained HTML page: inline CSS and SVG, no
//! script, nothing fetched. A view: it reads a summary and its verdict, like [`crate::report`]
//! for text, and uses that report's words and cells. In order: the verdict with its evidence
//! and advice, the run line, the stage table, the charts (step split over the run, each
//! stage's share, each loader worker's busy time, CPU and GPU over the run), the epoch table,
//! then the text report itself, folded.
//!
//! [`fragment`] is the page's body: one `<div class="pipeprof">` carrying its own style
//! (every rule under `.pipeprof`), to show inside another page (a notebook cell).

mod charts;
mod escape;
mod sections;
mod svg;
#[cfg(test)]
mod tests;

pub use charts::NO_TIMELINE;
pub use escape::escape;

use anyhow::Context;
use pipeprof_core::diagnose::Diagnosed;
use std::fmt::Write;
use std::path::Path;

/// The page's style, every rule scoped to `.pipeprof`.
const STYLE: &str = include_str!("style.css");

/// The report as a `<div class="pipeprof">` with its style inside: for a notebook cell or
/// any page.
pub fn fragment(d: &Diagnosed) -> String {
    let s = &d.summary;
    let v = d.verdict();
    let mut o = String::with_capacity(64 * 1024);
    let _ = write!(o, "<div class=\"pipeprof\"><style>{STYLE}</style>");
    let _ = write!(
        o,
        "<header class=\"pp-head\"><span class=\"pp-brand\">pipeprof</span><span class=\"pp-title\">{}</span></header>",
        escape(&title(d))
    );
    sections::verdict(&mut o, s, &v);
    sections::run_line(&mut o, s);
    sections::stage_table(&mut o, s);
    o.push_str("<section aria-label=\"charts\"><h2>Charts</h2><div class=\"pp-charts\">");
    // The two charts over the run side by side, their time axes level; then the bars.
    charts::step_split(&mut o, s);
    charts::utilisation(&mut o, s);
    charts::stage_shares(&mut o, s);
    charts::workers(&mut o, s);
    o.push_str("</div></section>");
    sections::epochs(&mut o, s);
    let text = crate::report::render(d);
    let _ = write!(
        o,
        "<details><summary>The text report</summary><pre>{}</pre></details><footer>pipeprof {} · summary schema {}</footer></div>",
        escape(&text),
        env!("CARGO_PKG_VERSION"),
        s.schema_version
    );
    o
}

/// What the report is of: the program (or model) and the rank.
fn title(d: &Diagnosed) -> String {
    let st = &d.summary.settings;
    let name = crate::report::or_dash(&st.model.name()).to_string();
    match d.summary.rank {
        Some(r) => format!("{name} · rank {}", r.rank),
        None => name,
    }
}

/// The report as a whole page: the fragment in a document of its own.
pub fn page(d: &Diagnosed) -> String {
    let v = d.verdict();
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>pipeprof · {} · {}</title><style>body{{margin:0;background:#eef1f5}}@media (min-width:1080px){{body{{padding:24px 0}}.pipeprof{{border-radius:12px;box-shadow:0 1px 3px rgba(20,30,50,.12)}}}}</style></head><body>\n{}\n</body></html>\n",
        escape(&title(d)),
        escape(v.limiter.label()),
        fragment(d)
    )
}

/// Which HTML to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// A whole page (`--html`).
    Page,
    /// The page's body alone (`--html-fragment`).
    Fragment,
}

/// Writes the report to `target`, replaced whole through a temporary file (never left half
/// written); `-` writes it to stdout.
pub fn write(target: &Path, d: &Diagnosed, form: Form) -> anyhow::Result<()> {
    let html = match form {
        Form::Page => page(d),
        Form::Fragment => fragment(d),
    };
    if target == Path::new("-") {
        pipeprof_trainer::progress::out(&html);
        return Ok(());
    }
    crate::export::replace_file(target, html.as_bytes())
        .with_context(|| format!("cannot write the HTML report to {}", target.display()))?;
    Ok(())
}

/// Says on stderr where the report was written (nothing for stdout).
pub fn say_written(target: &Path) {
    if target != Path::new("-") {
        pipeprof_trainer::progress::say(&format!("pipeprof: HTML report written to {}", target.display()));
    }
}

/// [`write`], then [`say_written`].
pub fn save(target: &Path, d: &Diagnosed, form: Form) -> anyhow::Result<()> {
    write(target, d, form)?;
    say_written(target);
    Ok(())
}
