#![allow(clippy::unwrap_used, clippy::expect_used)]
//! docs/prometheus/ holds together, checked by Debian's `promtool` (in the `prometheus`
//! package; the tests fail without it, they never skip): the scrape config is valid and finds
//! its rules (rule_files are read from the config's folder) and, with the example targets in
//! place, its file-based targets; the rules are valid, and their unit tests (rules.test.yml)
//! pass: the cross-node input straggler of core/src/diagnose/ranks.rs is found on the rank that
//! waits longest for data, and not claimed where the ranks wait alike, step apart, have too few
//! steps or differ too little. The Grafana dashboard parses, every query of it is valid PromQL
//! and names only series that pipeprof serves or rules.yml records, and every panel reads the
//! templated Prometheus data source.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Every series `--metrics-listen` serves (src/metrics/), as Prometheus names them (counters
/// with their `_total`).
const SERVED: &[&str] = &[
    "pipeprof_step_seconds",
    "pipeprof_wait_share",
    "pipeprof_images_per_second",
    "pipeprof_loader_busy_share",
    "pipeprof_queue_batches_ready",
    "pipeprof_data_wait_seconds",
    "pipeprof_backward_seconds",
    "pipeprof_stage_p50_seconds",
    "pipeprof_stage_p95_seconds",
    "pipeprof_stage_on_cpu_share",
    "pipeprof_gpu_utilization_ratio",
    "pipeprof_gpu_memory_used_bytes",
    "pipeprof_program_resident_memory_bytes",
    "pipeprof_limiter",
    "pipeprof_straggler",
    "pipeprof_allreduce_wait_seconds",
    "pipeprof_steps_total",
    "pipeprof_images_total",
    "pipeprof_events_dropped_total",
];

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn docs() -> PathBuf {
    root().join("docs/prometheus")
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(docs().join(rel)).unwrap_or_else(|e| panic!("docs/prometheus/{rel}: {e}"))
}

/// Runs `promtool args` in `cwd` and asserts that it succeeded, printing what it said when
/// not; its stdout and stderr together.
fn promtool(args: &[&str], cwd: &Path) -> String {
    let out = match Command::new("promtool").args(args).current_dir(cwd).output() {
        Ok(o) => o,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
            "no `promtool` on PATH: apt-get install prometheus (Debian's package ships promtool; scripts/test.sh installs it)"
        ),
        Err(e) => panic!("promtool {args:?}: {e}"),
    };
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success(),
        "`promtool {}` failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        args.join(" "),
        out.status
    );
    format!("{stdout}{stderr}")
}

/// The names after `- key:` on the lines of a rules file (`- record: NAME`, `- alert: NAME`;
/// not `record:` inside an expression's text): a line scan, there being no YAML parser among
/// the dev-dependencies.
fn rule_names(rules: &str, key: &str) -> Vec<String> {
    rules
        .lines()
        .filter_map(|l| {
            let v = l.trim_start().strip_prefix("- ")?.strip_prefix(key)?.strip_prefix(':')?;
            Some(v.trim().trim_matches(['"', '\'']).to_string())
        })
        .collect()
}

/// PromQL's words that are not series: aggregations, operators, modifiers, constants.
const KEYWORDS: &[&str] = &[
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "and",
    "or",
    "unless",
    "atan2",
    "bool",
    "offset",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "inf",
    "nan",
];

/// Words followed by a list of label names in parentheses.
const LABEL_LISTS: &[&str] = &["by", "without", "on", "ignoring", "group_left", "group_right"];

/// The index just past the bracket that closes the one at `open` (`(`, `{` or `[`), skipping
/// quoted strings; the end of `b` when it is never closed.
fn skip_group(b: &[u8], open: usize) -> usize {
    let (o, c) = match b[open] {
        b'(' => (b'(', b')'),
        b'{' => (b'{', b'}'),
        _ => (b'[', b']'),
    };
    let (mut depth, mut i) = (0usize, open);
    while i < b.len() {
        match b[i] {
            q @ (b'"' | b'\'' | b'`') => i = skip_string(b, i, q) - 1,
            x if x == o => depth += 1,
            x if x == c => {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    b.len()
}

/// The index just past the string quoted by `q` that starts at `start`.
fn skip_string(b: &[u8], start: usize, q: u8) -> usize {
    let mut i = start + 1;
    while i < b.len() && b[i] != q {
        i += if b[i] == b'\\' && q != b'`' { 2 } else { 1 };
    }
    i + 1
}

fn word_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b':'
}

/// The series names a PromQL expression selects: every word outside strings, label matchers
/// (`{…}`), ranges (`[…]`) and label lists (`by (…)`), that is not a function (a word before
/// `(`), a PromQL keyword, a number or a Grafana variable (`$job`, `${job}`).
fn metric_names(expr: &str) -> Vec<String> {
    let b = expr.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'"' || c == b'\'' || c == b'`' {
            i = skip_string(b, i, c);
        } else if c == b'{' || c == b'[' {
            i = skip_group(b, i);
        } else if c == b'#' {
            i = b[i..].iter().position(|&x| x == b'\n').map_or(b.len(), |n| i + n);
        } else if c == b'$' {
            i += 1;
            if b.get(i) == Some(&b'{') {
                i = skip_group(b, i);
            }
            while i < b.len() && word_char(b[i]) {
                i += 1;
            }
        } else if c.is_ascii_digit() || c == b'.' {
            // A number or a duration: 0.10, 1e-3, 0x1f, 5m.
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'.' || b[i] == b'_') {
                i += 1;
                if matches!(b[i - 1], b'e' | b'E') && matches!(b.get(i), Some(b'+' | b'-')) {
                    i += 1;
                }
            }
        } else if c.is_ascii_alphabetic() || c == b'_' || c == b':' {
            let start = i;
            while i < b.len() && word_char(b[i]) {
                i += 1;
            }
            let word = &expr[start..i];
            let next = b[i..].iter().position(|x| !x.is_ascii_whitespace()).map(|n| i + n);
            let before_paren = next.is_some_and(|n| b[n] == b'(');
            if LABEL_LISTS.contains(&word) {
                if let Some(n) = next.filter(|_| before_paren) {
                    i = skip_group(b, n);
                }
            } else if !before_paren && !KEYWORDS.contains(&word.to_ascii_lowercase().as_str()) {
                out.push(word.to_string());
            }
        } else {
            i += 1;
        }
    }
    out
}

/// The dashboard, parsed.
fn dashboard() -> serde_json::Value {
    serde_json::from_str(&read("dashboard.json")).unwrap_or_else(|e| panic!("dashboard.json: {e}"))
}

/// Every panel, those inside collapsed rows too.
fn panels(dash: &serde_json::Value) -> Vec<&serde_json::Value> {
    let mut out = Vec::new();
    for p in dash["panels"].as_array().expect("dashboard.json: a `panels` list") {
        out.push(p);
        out.extend(p["panels"].as_array().into_iter().flatten());
    }
    out
}

/// Every query of the dashboard: (where, PromQL), the panels' targets and the template
/// variables' `label_values(SELECTOR, LABEL)` (as its selector).
fn queries(dash: &serde_json::Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for p in panels(dash) {
        for t in p["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"].as_str().unwrap_or_else(|| panic!("panel {:?}: a target without `expr`", p["title"]));
            out.push((format!("panel {} {}", p["title"], t["refId"]), expr.to_string()));
        }
    }
    for v in dash["templating"]["list"].as_array().into_iter().flatten().filter(|v| v["type"] == "query") {
        let q = v["query"]["query"].as_str().or(v["query"].as_str()).expect("a query variable's query");
        let selector = q
            .strip_prefix("label_values(")
            .and_then(|r| r.strip_suffix(')'))
            .and_then(|r| r.rsplit_once(','))
            .map(|(s, _)| s.trim())
            .unwrap_or_else(|| panic!("variable {}: {q:?} is not label_values(SELECTOR, LABEL)", v["name"]));
        out.push((format!("variable {}", v["name"]), selector.to_string()));
    }
    out
}

#[test]
fn promtool_accepts_the_scrape_config_and_finds_its_rules_beside_it() {
    // Run from the repository, as a user would: rules.yml is found beside scrape.yml.
    let out = promtool(&["check", "config", "docs/prometheus/scrape.yml"], root());
    assert!(out.contains("SUCCESS: 1 rule files found"), "{out}");
    assert!(out.contains("SUCCESS: docs/prometheus/scrape.yml is valid prometheus config file syntax"), "{out}");
    assert!(out.contains("Checking docs/prometheus/rules.yml"), "{out}");
    let config = read("scrape.yml");
    assert!(config.lines().any(|l| l.trim() == "honor_labels: true"), "pipeprof's own `job` label must win");
}

#[test]
fn the_example_targets_are_what_the_scrape_config_reads() {
    let targets: serde_json::Value = serde_json::from_str(&read("targets.example.json")).unwrap();
    let hosts: Vec<&str> = targets
        .as_array()
        .expect("a file_sd file is a list of target groups")
        .iter()
        .flat_map(|g| g["targets"].as_array().expect("each group has `targets`"))
        .map(|t| t.as_str().expect("a target is a string"))
        .collect();
    assert_eq!(hosts.len(), 2, "two nodes: {hosts:?}");
    for h in &hosts {
        let port = h.rsplit_once(':').and_then(|(_, p)| p.parse::<u16>().ok());
        assert!(port.is_some_and(|p| p > 0), "{h}: not host:port");
    }
    // The config where it is deployed: targets/*.json beside it, read by promtool like
    // Prometheus reads it (a target that is not host:port, or a file that is not a list of
    // groups, fails; no matching file is only a warning).
    let dir = tempfile::tempdir().unwrap();
    for f in ["scrape.yml", "rules.yml"] {
        std::fs::copy(docs().join(f), dir.path().join(f)).unwrap();
    }
    std::fs::create_dir(dir.path().join("targets")).unwrap();
    std::fs::copy(docs().join("targets.example.json"), dir.path().join("targets/nodes.json")).unwrap();
    let out = promtool(&["check", "config", "scrape.yml"], dir.path());
    assert!(!out.contains("WARNING"), "the targets file was not read:\n{out}");
    assert!(out.contains("SUCCESS: scrape.yml is valid prometheus config file syntax"), "{out}");
}

#[test]
fn promtool_accepts_every_rule() {
    let rules = read("rules.yml");
    let (records, alerts) = (rule_names(&rules, "record"), rule_names(&rules, "alert"));
    for want in [
        "pipeprof:rank_data_wait_seconds",
        "pipeprof:job_data_wait_spread_seconds",
        "pipeprof:job_step_spread_ratio",
        "pipeprof:job_straggler",
        "pipeprof:job_wait_share",
    ] {
        assert!(records.iter().any(|r| r == want), "rules.yml records no {want}: {records:?}");
    }
    assert_eq!(alerts, ["PipeprofInputStraggler"]);
    let out = promtool(&["check", "rules", "docs/prometheus/rules.yml"], root());
    // Every rule the line scan found, and no other: the scan reads the file as promtool does.
    let n = records.len() + alerts.len();
    assert!(out.contains(&format!("SUCCESS: {n} rules found")), "the line scan found {n} rules:\n{out}");
}

#[test]
fn the_rules_unit_tests_pass() {
    let out = promtool(&["test", "rules", "docs/prometheus/rules.test.yml"], root());
    assert!(out.contains("SUCCESS"), "{out}");
    assert!(!out.contains("FAILED"), "{out}");
}

#[test]
fn every_dashboard_query_names_only_served_series_or_recorded_rules() {
    let recorded = rule_names(&read("rules.yml"), "record");
    let known: BTreeSet<&str> = SERVED.iter().copied().chain(recorded.iter().map(String::as_str)).collect();
    let dash = dashboard();
    let qs = queries(&dash);
    assert!(qs.len() >= 7, "the panels and the job variable: {qs:#?}");
    let mut named = BTreeSet::new();
    for (at, expr) in &qs {
        let names = metric_names(expr);
        assert!(!names.is_empty(), "{at}: {expr:?} names no series");
        let unknown: Vec<&String> = names.iter().filter(|n| !known.contains(n.as_str())).collect();
        assert!(unknown.is_empty(), "{at}: {expr:?} names {unknown:?}, neither served nor recorded");
        named.extend(names);
    }
    // The panels the dashboard is for.
    for want in [
        "pipeprof:job_straggler",
        "pipeprof:job_wait_share",
        "pipeprof_data_wait_seconds",
        "pipeprof_stage_p95_seconds",
        "pipeprof_images_per_second",
        "pipeprof_gpu_utilization_ratio",
    ] {
        assert!(named.contains(want), "no panel shows {want}: {named:?}");
    }
}

/// promtool parses each query, written as a recording rule (`$job` set to a value).
#[test]
fn every_dashboard_query_is_valid_promql() {
    let qs = queries(&dashboard());
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (n, (at, expr)) in qs.iter().enumerate() {
        let expr = expr.replace("$job", "4242");
        assert!(!expr.contains('$'), "{at}: a variable this test gives no value: {expr:?}");
        // A JSON string is a YAML double-quoted string.
        rules +=
            &format!("      - record: dashboard_query_{n}\n        expr: {}\n", serde_json::to_string(&expr).unwrap());
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("dashboard_rules.yml"), &rules).unwrap();
    let out = promtool(&["check", "rules", "dashboard_rules.yml"], dir.path());
    assert!(out.contains(&format!("SUCCESS: {} rules found", qs.len())), "{out}");
}

#[test]
fn every_panel_reads_the_templated_prometheus() {
    let dash = dashboard();
    let vars = dash["templating"]["list"].as_array().expect("template variables");
    let ds = vars.iter().find(|v| v["name"] == "DS_PROMETHEUS").expect("a DS_PROMETHEUS variable");
    assert_eq!((ds["type"].as_str(), ds["query"].as_str()), (Some("datasource"), Some("prometheus")));
    let job = vars.iter().find(|v| v["name"] == "job").expect("a job variable");
    assert_eq!(job["definition"], "label_values(pipeprof_step_seconds, job)");
    let mut ids = BTreeSet::new();
    for p in panels(&dash) {
        assert!(ids.insert(p["id"].as_u64().expect("a panel id")), "panel id {} twice", p["id"]);
        for d in std::iter::once(&p["datasource"])
            .chain(p["targets"].as_array().into_iter().flatten().map(|t| &t["datasource"]))
        {
            assert_eq!(d["uid"], "${DS_PROMETHEUS}", "panel {}: {d}", p["title"]);
        }
    }
}

/// The series names in [`SERVED`] are registered by the exporter: each (less `pipeprof_` and
/// a counter's `_total`) is a string in src/metrics/.
#[test]
fn the_served_series_are_the_exporters() {
    let mut src = String::new();
    for e in std::fs::read_dir(root().join("src/metrics")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "rs") {
            src += &std::fs::read_to_string(&p).unwrap();
        }
    }
    let missing: Vec<&str> = SERVED
        .iter()
        .copied()
        .filter(|s| {
            let base = s.strip_prefix("pipeprof_").unwrap();
            let base = base.strip_suffix("_total").unwrap_or(base);
            !src.contains(&format!("\"{base}\""))
        })
        .collect();
    assert!(missing.is_empty(), "not registered in src/metrics/: {missing:?}");
}

#[test]
fn metric_names_finds_the_series_an_expression_selects() {
    let table: &[(&str, &[&str])] = &[
        ("pipeprof_step_seconds", &["pipeprof_step_seconds"]),
        ("pipeprof:job_straggler{job=\"$job\"}", &["pipeprof:job_straggler"]),
        // Aggregations, label lists, matchers with names in their strings, numbers.
        (
            "max by (node, rank) (pipeprof_data_wait_seconds{job=\"$job\", rank!=\"all\", x=\"up\"}) > 0.10 * 1e-3",
            &["pipeprof_data_wait_seconds"],
        ),
        (
            "sum without (instance) (rate(pipeprof_images_total[$__rate_interval] offset 5m)) / on (job) group_left () up",
            &["pipeprof_images_total", "up"],
        ),
        ("a and on (job) (b <= 1.25 * min by (job) (c)) or Inf < +Inf unless bool NaN", &["a", "b", "c"]),
        ("topk(1, node_cpu_seconds_total) # a comment naming pipeprof_x\n", &["node_cpu_seconds_total"]),
        ("label_replace(x, \"dst\", \"$1\", \"src\", \"(.*)\") + ${var} + 0x1F", &["x"]),
        ("vector(1)", &[]),
    ];
    for (expr, want) in table {
        assert_eq!(metric_names(expr), *want, "{expr:?}");
    }
}

#[test]
fn rule_names_reads_records_and_alerts() {
    let rules = "groups:\n  - name: g\n    rules:\n      - record: a:b\n        expr: x\n      - record: \"c\"\n        expr: |\n          record: not a rule\n      - alert: A\n        expr: y\n";
    assert_eq!(rule_names(rules, "record"), ["a:b", "c"]);
    assert_eq!(rule_names(rules, "alert"), ["A"]);
}
