#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The user's documentation holds together: README.md stays a page read in five minutes (at
//! most 300 lines, the two set-up commands first, every `docs/` page linked from it), and every
//! relative link in README.md and docs/*.md leads to a file that exists and, with a
//! `#fragment`, to a heading of that file.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

/// The README is the page a user reads first: longer than this, it is a manual again.
const README_MAX_LINES: usize = 300;

/// The lines of `text` outside fenced code blocks, numbered from 1.
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            out.push((i + 1, line));
        }
    }
    out
}

/// `line` without its inline code spans (a `](` inside code is not a link).
fn without_code_spans(line: &str) -> String {
    line.split('`').step_by(2).collect()
}

/// The target of every `[text](target)` in a line of prose.
fn link_targets(line: &str) -> Vec<String> {
    let line = without_code_spans(line);
    let mut out = Vec::new();
    let mut rest = line.as_str();
    while let Some(i) = rest.find("](") {
        rest = &rest[i + 2..];
        let Some(end) = rest.find(')') else { break };
        out.push(rest[..end].to_string());
        rest = &rest[end..];
    }
    out
}

/// GitHub's anchor for a heading: lower case; letters, digits, `-` and `_` kept; each space a
/// `-`; everything else (backticks, `:`, `'`, `/`, `→`) dropped.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a markdown file's headings (outside code blocks); a repeated heading gets
/// `-1`, `-2`, … as on GitHub.
fn anchors(text: &str) -> Vec<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = Vec::new();
    for (_, line) in prose_lines(text) {
        let hashes = line.chars().take_while(|c| *c == '#').count();
        let Some(heading) = line[hashes..].strip_prefix(' ').filter(|_| (1..=6).contains(&hashes)) else {
            continue;
        };
        let s = slug(heading);
        let n = seen.entry(s.clone()).or_insert(0);
        out.push(if *n == 0 { s.clone() } else { format!("{s}-{n}") });
        *n += 1;
    }
    out
}

/// `link` as a path from the folder of `from`, with `.` and `..` resolved by text.
fn resolve(from: &Path, link: &str) -> PathBuf {
    let mut out = PathBuf::new();
    for c in from.parent().unwrap_or(Path::new("")).join(link).components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

/// What a link leads to.
enum Target {
    Missing,
    File,
    /// A markdown file, with its text (for its anchors).
    Markdown(String),
}

/// Every relative link of `text` (the file `from`) that leads nowhere: a missing file, or a
/// `#fragment` that is no heading of its markdown file. `look` finds a path (relative to the
/// repository) on disk, or in a table test.
fn broken_links(from: &Path, text: &str, look: &dyn Fn(&Path) -> Target) -> Vec<String> {
    let mut out = Vec::new();
    for (n, line) in prose_lines(text) {
        for link in link_targets(line) {
            if link.contains("://") || link.starts_with("mailto:") {
                continue;
            }
            let (path, fragment) = link.split_once('#').unwrap_or((&link, ""));
            let target = if path.is_empty() { Target::Markdown(text.to_string()) } else { look(&resolve(from, path)) };
            let problem = match target {
                Target::Missing => Some("no such file"),
                Target::Markdown(t) if !fragment.is_empty() && !anchors(&t).iter().any(|a| a == fragment) => {
                    Some("no such heading")
                }
                _ => None,
            };
            if let Some(p) = problem {
                out.push(format!("{}:{n}: {link} ({p})", from.display()));
            }
        }
    }
    out
}

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// docs/*.md, as paths relative to the repository, sorted.
fn docs_pages() -> Vec<String> {
    let mut pages: Vec<String> = std::fs::read_dir(root().join("docs"))
        .expect("docs/")
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    pages.sort();
    pages
}

fn look_on_disk(rel: &Path) -> Target {
    let p = root().join(rel);
    if !p.exists() {
        Target::Missing
    } else if p.extension().is_some_and(|e| e == "md") {
        Target::Markdown(std::fs::read_to_string(&p).unwrap())
    } else {
        Target::File
    }
}

#[test]
fn readme_is_a_five_minute_page() {
    let lines = read("README.md").lines().count();
    assert!(
        lines <= README_MAX_LINES,
        "README.md has {lines} lines, more than {README_MAX_LINES}: move the detail to docs/"
    );
}

/// The README opens with the two commands for a fresh machine, and the second is the test
/// command `.ci/run` runs (the line after its "README's test command" comment).
#[test]
fn readme_starts_with_the_setup_commands_ci_runs() {
    let ci = read(".ci/run");
    let mut after_comment = ci.lines().skip_while(|l| !l.starts_with("# README's test command")).skip(1);
    let test_cmd =
        after_comment.find(|l| !l.trim().is_empty() && !l.starts_with('#')).expect("the test command in .ci/run");
    let readme = read("README.md");
    let open = readme.lines().position(|l| l.starts_with("```")).expect("a code block in README.md");
    assert!(open < 10, "README.md's first code block starts at line {}: the set-up commands come first", open + 1);
    let block: Vec<&str> = readme.lines().skip(open + 1).take_while(|l| !l.starts_with("```")).collect();
    assert!(block.iter().any(|l| l.starts_with("cargo run --release -- profile ")), "first block: {block:#?}");
    assert!(block.iter().any(|l| l.starts_with(&format!("{test_cmd} "))), "first block lacks `{test_cmd}`: {block:#?}");
}

#[test]
fn every_docs_page_is_linked_from_the_readme() {
    let readme = read("README.md");
    let linked: Vec<PathBuf> = prose_lines(&readme)
        .into_iter()
        .flat_map(|(_, l)| link_targets(l))
        .map(|t| resolve(Path::new("README.md"), t.split('#').next().unwrap_or("")))
        .collect();
    let pages = docs_pages();
    assert!(!pages.is_empty(), "no docs/*.md");
    let orphans: Vec<&String> = pages.iter().filter(|p| !linked.contains(&PathBuf::from(p))).collect();
    assert!(orphans.is_empty(), "docs pages no README link leads to: {orphans:?}");
}

#[test]
fn every_relative_link_resolves() {
    let mut broken = Vec::new();
    for rel in std::iter::once("README.md".to_string()).chain(docs_pages()) {
        broken.extend(broken_links(Path::new(&rel), &read(&rel), &look_on_disk));
    }
    assert!(broken.is_empty(), "links that lead nowhere:\n{}", broken.join("\n"));
}

#[test]
fn slugs_are_githubs() {
    let table = [
        ("Set up and run", "set-up-and-run"),
        ("`cnn.toml`: the model file", "cnntoml-the-model-file"),
        ("`pipeprof run`: the program's fate is the run's", "pipeprof-run-the-programs-fate-is-the-runs"),
        ("Metrics into Prometheus/Grafana", "metrics-into-prometheusgrafana"),
        ("Checking the advice: `--check-advice`", "checking-the-advice---check-advice"),
        ("Python rows → 2026", "python-rows--2026"),
    ];
    for (heading, want) in table {
        assert_eq!(slug(heading), want, "{heading}");
    }
}

#[test]
fn broken_links_finds_what_leads_nowhere() {
    let files: BTreeMap<&str, &str> = [
        ("docs/a.md", "# A\n\n## Two words\n\n## Two words\n\n```sh\n# not a heading\n```\n"),
        ("examples/cnn.toml", ""),
        ("README.md", "# pipeprof\n"),
    ]
    .into_iter()
    .collect();
    let look = |p: &Path| match files.get(p.to_str().unwrap()) {
        None => Target::Missing,
        Some(t) if p.extension().is_some_and(|e| e == "md") => Target::Markdown(t.to_string()),
        Some(_) => Target::File,
    };
    // (a line of docs/b.md, the broken link it should report, if any)
    let table: &[(&str, Option<&str>)] = &[
        ("[a](a.md)", None),
        ("[toml](../examples/cnn.toml)", None),
        ("[readme](../README.md#pipeprof)", None),
        ("[second](a.md#two-words-1)", None),
        ("[web](https://example.com/x.md)", None),
        ("[here](#b)", None),
        ("in code: `[x](nowhere.md)`", None),
        ("[gone](gone.md)", Some("gone.md (no such file)")),
        ("[toml](examples/cnn.toml)", Some("examples/cnn.toml (no such file)")),
        ("[fenced](a.md#not-a-heading)", Some("a.md#not-a-heading (no such heading)")),
        ("[third](a.md#two-words-2)", Some("a.md#two-words-2 (no such heading)")),
        ("[here](#nowhere)", Some("#nowhere (no such heading)")),
    ];
    for (line, want) in table {
        let text = format!("# B\n\n{line}\n");
        let got = broken_links(Path::new("docs/b.md"), &text, &look);
        let want: Vec<String> = want.iter().map(|w| format!("docs/b.md:3: {w}")).collect();
        assert_eq!(got, want, "{line}");
    }
    // A link inside a fenced block is code, not a link.
    assert!(broken_links(Path::new("docs/b.md"), "```\n[gone](gone.md)\n```\n", &look).is_empty());
}
