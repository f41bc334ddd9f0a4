#![allow(clippy::unwrap_used, clippy::expect_used)]
//! A real Prometheus scrapes `profile --metrics-listen` (issue 24, item 5): Debian's
//! `prometheus` on a private port and storage folder, then its HTTP API says which series
//! arrived, with which labels and values. Fails where `prometheus` is not installed
//! (`scripts/test.sh` installs it).

mod common;

use common::{demo, write_tiny_model};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};

/// The first `prefix…` of the child's stderr, cut at the next space or quote; the rest is
/// drained on a thread so that a full pipe never holds the child up.
fn stderr_word(c: &mut Child, prefix: &str) -> String {
    let mut lines = BufReader::new(c.stderr.take().unwrap()).lines();
    let found = lines
        .by_ref()
        .map_while(Result::ok)
        .find_map(|l| {
            let i = l.find(prefix)?;
            Some(l[i + prefix.len()..].split([' ', '"', '/']).next()?.to_string())
        })
        .unwrap_or_else(|| panic!("no {prefix:?} on stderr"));
    std::thread::spawn(move || lines.for_each(drop));
    found
}

/// Prometheus's instant query `q`: the result vector.
fn query(prom: &str, q: &str) -> Vec<serde_json::Value> {
    try_query(prom, q).unwrap_or_else(|| panic!("{q}: prometheus is not ready"))
}

/// [`query`], or None while Prometheus is starting (503).
fn try_query(prom: &str, q: &str) -> Option<Vec<serde_json::Value>> {
    let enc: String = q
        .bytes()
        .map(|b| if b.is_ascii_alphanumeric() || b == b'_' { (b as char).to_string() } else { format!("%{b:02X}") })
        .collect();
    let mut s = TcpStream::connect(prom).unwrap();
    write!(s, "GET /api/v1/query?query={enc} HTTP/1.1\r\nHost: {prom}\r\nConnection: close\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    if out.starts_with("HTTP/1.1 503") {
        return None;
    }
    let body = out.split("\r\n\r\n").nth(1).unwrap_or("");
    let v: serde_json::Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(v["status"], "success", "{q}: {v}");
    Some(v["data"]["result"].as_array().cloned().unwrap_or_default())
}

fn value(sample: &serde_json::Value) -> f64 {
    sample["value"][1].as_str().unwrap().parse().unwrap()
}

#[test]
fn a_real_prometheus_scrapes_the_series_with_their_labels() {
    if Command::new("prometheus").arg("--version").output().is_err() {
        panic!("no `prometheus` on PATH: apt-get install prometheus (scripts/test.sh does)");
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    demo(&data, 2, 16, 5);
    let model = write_tiny_model(dir.path());
    let mut run = common::KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_pipeprof"))
            .args(["profile", "--no-tui", "--no-gpu", "--model", &model, "--data"])
            .arg(&data)
            // Far more steps than the test waits for: it is killed at the end.
            .args(["--steps", "1000000", "--metrics-listen", "127.0.0.1:0"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let target = stderr_word(&mut run.0, "metrics on http://");
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: pipeprof\n    static_configs:\n      - targets: [\"{target}\"]\n"
        ),
    )
    .unwrap();
    let mut prom = common::KillOnDrop(
        Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("tsdb").display()))
            .arg("--web.listen-address=127.0.0.1:0")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let api = stderr_word(&mut prom.0, "msg=\"Listening on\" address=");
    // Two scrapes with steps in them: ask until Prometheus has them (no clock in the test).
    loop {
        assert!(run.0.try_wait().unwrap().is_none(), "the profiled run ended early");
        assert!(prom.0.try_wait().unwrap().is_none(), "prometheus ended early");
        let got = try_query(&api, "count_over_time(pipeprof_steps_total[10m]) >= 2 and pipeprof_steps_total > 0");
        if got.is_some_and(|g| !g.is_empty()) {
            break;
        }
        std::thread::yield_now();
    }
    let step = query(&api, "pipeprof_step_seconds");
    assert_eq!(step.len(), 1, "{step:?}");
    let m = &step[0]["metric"];
    assert_eq!(
        (m["program"].as_str(), m["rank"].as_str(), m["job"].as_str()),
        (Some("tiny.toml"), Some("0"), Some("pipeprof"))
    );
    assert!(value(&step[0]) > 0.0, "{step:?}");
    let limiter = query(&api, "sum(pipeprof_limiter)");
    assert_eq!(value(&limiter[0]), 1.0, "{limiter:?}");
    assert_eq!(query(&api, "count(pipeprof_limiter)").first().map(value), Some(8.0));
    let p95 = query(&api, "pipeprof_stage_p95_seconds{stage=\"compute\"}");
    assert!(p95.first().map(value).is_some_and(|v| v > 0.0), "{p95:?}");
    let rate = query(&api, "rate(pipeprof_images_total[1m])");
    assert!(rate.first().map(value).is_some_and(|v| v > 0.0), "{rate:?}");
}
