#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The Prometheus view: `--metrics-listen` serves `/metrics` while the real binary trains
//! (`profile`, `run`), and a real Prometheus scrapes it.

mod common;

use common::{demo, pipeprof, text, write_tiny_model};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};

/// `GET path` over a plain TCP connection: status line, headers and body as one string, or
/// None when nothing listens (yet, or any more).
fn get(addr: &str, path: &str) -> Option<String> {
    let mut s = TcpStream::connect(addr).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

/// The value of the sample whose name and labels start with `prefix`.
fn sample(body: &str, prefix: &str) -> Option<f64> {
    body.lines().find(|l| l.starts_with(prefix))?.rsplit(' ').next()?.parse().ok()
}

/// The address `pipeprof … --metrics-listen 127.0.0.1:0` prints on stderr once bound.
fn metrics_address(lines: &mut impl Iterator<Item = std::io::Result<String>>) -> String {
    lines
        .map_while(Result::ok)
        .find_map(|l| {
            l.strip_prefix("pipeprof: metrics on http://").and_then(|r| r.strip_suffix("/metrics")).map(String::from)
        })
        .expect("the bound address is printed on stderr")
}

#[test]
fn profile_serves_openmetrics_with_steps_stages_and_the_limiter_while_it_trains() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    demo(&data, 2, 16, 5);
    let model = write_tiny_model(dir.path());
    let child = Command::new(env!("CARGO_BIN_EXE_pipeprof"))
        .args(["profile", "--no-tui", "--no-gpu", "--model", &model, "--data"])
        .arg(&data)
        // Far more steps than the test waits for: it kills the run once it has its scrape.
        .args(["--steps", "1000000", "--metrics-listen", "127.0.0.1:0"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut run = common::KillOnDrop(child);
    let mut lines = BufReader::new(run.0.stderr.take().unwrap()).lines();
    // The address is printed once bound, before training starts.
    let mut addr = None;
    for line in lines.by_ref() {
        let line = line.unwrap();
        if let Some(rest) = line.strip_prefix("pipeprof: metrics on http://") {
            addr = rest.strip_suffix("/metrics").map(str::to_string);
            break;
        }
    }
    let addr = addr.expect("the bound address is printed on stderr");
    // The rest of stderr is drained, so that a full pipe never holds the run up.
    std::thread::spawn(move || lines.for_each(drop));
    assert!(addr.starts_with("127.0.0.1:") && !addr.ends_with(":0"), "{addr}");
    // Scrape until the first steps are in the published snapshot (the run is far from done).
    let body = loop {
        assert!(run.0.try_wait().unwrap().is_none(), "the run ended before its first steps were scraped");
        match get(&addr, "/metrics") {
            Some(r) if sample(&r, "pipeprof_steps_total{").is_some_and(|n| n >= 2.0) => break r,
            _ => std::thread::yield_now(),
        }
    };
    let head = body.split("\r\n\r\n").next().unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("Content-Type: application/openmetrics-text; version=1.0.0"), "{head}");
    assert!(body.trim_end().ends_with("# EOF"), "{body}");
    let l = "{program=\"tiny.toml\",rank=\"0\"";
    let step = sample(&body, &format!("pipeprof_step_seconds{l}}}")).expect("step time");
    assert!(step > 0.0 && step < 60.0, "step {step} s");
    let ips = sample(&body, &format!("pipeprof_images_per_second{l}}}")).expect("images/s");
    assert!(ips > 0.0, "{ips}");
    let wait = sample(&body, &format!("pipeprof_wait_share{l}}}")).expect("wait share");
    assert!((0.0..=1.0).contains(&wait), "{wait}");
    assert_eq!(sample(&body, &format!("pipeprof_events_dropped_total{l}}}")), Some(0.0));
    let p95 = sample(&body, &format!("pipeprof_stage_p95_seconds{l},stage=\"compute\"}}")).expect("compute p95");
    assert!(p95 > 0.0, "{p95}");
    assert!(body.contains(&format!("pipeprof_stage_p50_seconds{l},stage=\"decode\"}}")), "{body}");
    // One limiter at 1, the fixed others at 0.
    let limiters: Vec<f64> =
        body.lines().filter(|x| x.starts_with("pipeprof_limiter{")).map(|x| sample(x, "").unwrap()).collect();
    assert_eq!(limiters.len(), 8, "{body}");
    assert_eq!(limiters.iter().sum::<f64>(), 1.0, "{body}");
    // Nothing but /metrics.
    let other = get(&addr, "/").expect("still serving");
    assert!(other.starts_with("HTTP/1.1 404"), "{other}");
}

#[test]
fn metrics_listen_refuses_a_non_loopback_address_unless_allowed() {
    let out = pipeprof(&["profile", "--no-tui", "--metrics-listen", "0.0.0.0:0"]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("--metrics-allow-remote"), "{err}");
    let bad = pipeprof(&["profile", "--no-tui", "--metrics-listen", "nonsense"]);
    assert!(!bad.status.success());
    assert!(text(&bad.stderr).contains("--metrics-listen nonsense"), "{}", text(&bad.stderr));
}

#[test]
fn run_serves_metrics_labelled_with_its_program_while_the_program_runs() {
    // `cat` runs until its stdin closes: the endpoint is up as long as the test holds it open.
    let child = Command::new(env!("CARGO_BIN_EXE_pipeprof"))
        .args([
            "run",
            "--once",
            "--no-gpu",
            "--node",
            "n1",
            "--job",
            "j1",
            "--metrics-listen",
            "127.0.0.1:0",
            "--",
            "cat",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut run = common::KillOnDrop(child);
    let mut lines = BufReader::new(run.0.stderr.take().unwrap()).lines();
    let addr = metrics_address(&mut lines);
    std::thread::spawn(move || lines.for_each(drop));
    let body = get(&addr, "/metrics").expect("the endpoint answers while the program runs");
    // Under `run`, every series names the job and the node (here from --job and --node).
    assert!(body.contains("pipeprof_steps_total{program=\"cat\",job=\"j1\",node=\"n1\",rank=\"0\"} 0"), "{body}");
    assert!(
        body.contains(
            "pipeprof_limiter{program=\"cat\",job=\"j1\",node=\"n1\",rank=\"0\",limiter=\"not_enough_data\"} 1"
        ),
        "{body}"
    );
    drop(run.0.stdin.take());
    assert!(run.0.wait().unwrap().success());
}

#[test]
fn a_scraper_that_pipelines_and_never_reads_neither_blocks_scrapes_nor_keeps_the_run_alive() {
    let dir = tempfile::tempdir().unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_pipeprof"))
        .env("XDG_RUNTIME_DIR", dir.path())
        .args(["run", "--once", "--no-gpu", "--metrics-listen", "127.0.0.1:0", "--", "cat"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut child = child;
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let addr = metrics_address(&mut lines);
    // Twenty thousand requests in one go, and not one reply read. Written from a clone of the
    // connection on a thread of its own: the write itself may block or be cut off.
    let greedy = TcpStream::connect(&addr).unwrap();
    let mut writer = greedy.try_clone().unwrap();
    std::thread::spawn(move || {
        let _ = writer.write_all("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n".repeat(20_000).as_bytes());
    });
    // Another scraper is still answered (before, the one serving thread was stuck writing
    // replies nobody read, and every later scrape timed out).
    let mut s = TcpStream::connect(&addr).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(30))).unwrap();
    write!(s, "GET /metrics HTTP/1.1\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut reply = String::new();
    let _ = s.read_to_string(&mut reply);
    if !reply.starts_with("HTTP/1.1 200") {
        let _ = child.kill();
        panic!("a second scraper is not answered: {reply:?}");
    }
    // The program ends; pipeprof exits although the greedy client is still connected (before,
    // dropping the server joined its stuck thread, and pipeprof never exited).
    drop(child.stdin.take());
    let stderr = std::thread::spawn(move || lines.map_while(Result::ok).collect::<Vec<_>>());
    let out = common::output_within(child, std::time::Duration::from_secs(60), "pipeprof run");
    assert_eq!(out.status.code(), Some(0), "{:?}", stderr.join());
    drop(greedy);
}

#[test]
fn run_reports_the_programs_memory_not_its_own() {
    // A program holding 500 MiB of written pages until its stdin closes.
    let dir = tempfile::tempdir().unwrap();
    let summary = dir.path().join("s.json");
    let hold = "import sys\nb = b'\\x01' * (500 << 20)\nprint('holding', flush=True)\nsys.stdin.read()\n";
    let child = Command::new(env!("CARGO_BIN_EXE_pipeprof"))
        .env("XDG_RUNTIME_DIR", dir.path())
        // No job id to find: the job label is "none" (whatever allocation the tests run in).
        .env_remove("SLURM_JOB_ID")
        .env_remove("TORCHELASTIC_RUN_ID")
        .args(["run", "--once", "--no-gpu", "--node", "n1", "--metrics-listen", "127.0.0.1:0", "--summary"])
        .arg(&summary)
        .args(["--", "python3", "-c", hold])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut run = common::KillOnDrop(child);
    let mut lines = BufReader::new(run.0.stderr.take().unwrap()).lines();
    let addr = metrics_address(&mut lines);
    let stderr = std::thread::spawn(move || lines.map_while(Result::ok).collect::<Vec<_>>());
    // The endpoint shows the program's memory once a sample has seen it: polled until then
    // (a hang guard bounds it, not a timing).
    let mib = (1u64 << 20) as f64;
    let key = "pipeprof_program_resident_memory_bytes{program=\"python3\",job=\"none\",node=\"n1\",rank=\"0\"}";
    let mut seen = 0.0;
    for _ in 0..6000 {
        seen = get(&addr, "/metrics").and_then(|b| sample(&b, key)).unwrap_or(0.0);
        if seen >= 500.0 * mib {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(seen >= 500.0 * mib, "the program's 500 MiB never showed: last {:.0} MiB", seen / mib);
    drop(run.0.stdin.take());
    let mut out = String::new();
    run.0.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    assert!(run.0.wait().unwrap().success(), "{:?}", stderr.join());

    let s: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&summary).unwrap()).unwrap();
    let m = &s["machine"];
    let peak = m["rss_peak_bytes"].as_f64().unwrap();
    let host = m["host_rss_peak_bytes"].as_f64().expect("pipeprof's own memory apart");
    assert!(peak >= 500.0 * mib, "summary: the program's peak {:.0} MiB", peak / mib);
    assert!(host < 200.0 * mib, "pipeprof itself {:.0} MiB is not the program's 500", host / mib);
    // The report's memory line says the program's peak and pipeprof's own apart.
    let line = out.lines().find(|l| l.trim_start().starts_with("memory")).expect("a memory line");
    let shown_mb: f64 = line
        .split("RSS peak ")
        .nth(1)
        .and_then(|r| r.split(" MB").next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no RSS peak in MB: {line}"));
    assert!(shown_mb * 1e6 >= 500.0 * mib, "{line}");
    assert!(line.contains("pipeprof itself"), "{line}");
}

/// Debian's `prometheus` on a private port and storage folder scrapes `profile
/// --metrics-listen`; its HTTP API says which series arrived, with which labels and values.
/// Fails where `prometheus` is not installed (`scripts/test.sh` installs it).
mod prometheus {

    use super::common::{demo, write_tiny_model};
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
        let mut run = super::common::KillOnDrop(
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
        let mut prom = super::common::KillOnDrop(
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
}
