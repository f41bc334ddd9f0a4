//! Honest simulations of the classic slow cases, for reproducing a verdict on any machine:
//! `--throttle-read 2MB/s+20ms` (a slow or network disk) and `--slow decode=+5ms` (heavier
//! work in one stage). Every report says when they are on.

use probes::Stage;
use std::time::{Duration, Instant};

/// A slow disk: a bandwidth limit and/or a fixed latency per file.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Throttle {
    pub bytes_per_s: Option<f64>,
    pub per_file: Duration,
}

impl Throttle {
    /// The extra time reading `bytes` should take.
    pub fn delay(&self, bytes: usize) -> Duration {
        let bw = self.bytes_per_s.map(|r| secs(bytes as f64 / r)).unwrap_or_default();
        bw.saturating_add(self.per_file)
    }

    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(r) = self.bytes_per_s {
            parts.push(format!("{:.2} MB/s", r / 1e6));
        }
        if !self.per_file.is_zero() {
            parts.push(format!("+{} ms per file", self.per_file.as_secs_f64() * 1e3));
        }
        format!("reads throttled to {} (--throttle-read)", parts.join(" "))
    }

    /// The `--throttle-read` value that parses back to this throttle ([`parse_throttle`]).
    pub fn spec(&self) -> String {
        let rate = self.bytes_per_s.map(rate_spec).unwrap_or_default();
        if self.per_file.is_zero() && !rate.is_empty() {
            rate
        } else {
            format!("{rate}{}", delay_spec(self.per_file))
        }
    }
}

/// `+N` in the largest unit that parses back to `d` exactly (a whole number of ms or µs
/// where `d` is one, else seconds).
fn delay_spec(d: Duration) -> String {
    let ns = d.as_nanos();
    let near = |unit: u128| (ns + unit / 2) / unit;
    [format!("+{}ms", near(1_000_000)), format!("+{}us", near(1_000))]
        .into_iter()
        .find(|c| parse_ms(c) == Some(d))
        .unwrap_or_else(|| format!("+{}s", d.as_secs_f64()))
}

/// `N{GB,MB,KB,B}/s` in the largest unit of at least one that parses back to `r` exactly.
fn rate_spec(r: f64) -> String {
    [("GB", 1e9), ("MB", 1e6), ("KB", 1e3)]
        .into_iter()
        .filter(|(_, k)| r >= *k)
        .map(|(unit, k)| format!("{}{unit}/s", r / k))
        .find(|c| matches!(parse_rate(c), Some(Ok(x)) if x == r))
        .unwrap_or_else(|| format!("{r}B/s"))
}

/// Slowest accepted `--throttle-read` rate: 1 byte per second.
pub const MIN_RATE: f64 = 1.0;
/// Fastest accepted rate: 1 TB/s, past any disk or network.
pub const MAX_RATE: f64 = 1e12;
/// Longest accepted per-file latency or `--slow` delay (exclusive).
pub const MAX_DELAY_S: f64 = 3600.0;

/// `x` seconds as a Duration, saturating instead of panicking on a huge or invalid value (the
/// parsers keep rates in range; this keeps a bug from becoming a dead loader worker).
fn secs(x: f64) -> Duration {
    Duration::try_from_secs_f64(x).unwrap_or(if x > 0.0 { Duration::MAX } else { Duration::ZERO })
}

fn parse_ms(s: &str) -> Option<Duration> {
    let v = s.trim().strip_prefix('+')?.trim();
    let (num, scale) = if let Some(n) = v.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = v.strip_suffix("us").or_else(|| v.strip_suffix("µs")) {
        (n, 1e-6)
    } else if let Some(n) = v.strip_suffix('s') {
        (n, 1.0)
    } else {
        (v, 1e-3)
    };
    let x: f64 = num.trim().parse().ok()?;
    (x.is_finite() && (0.0..MAX_DELAY_S).contains(&(x * scale))).then(|| secs(x * scale))
}

/// A rate in bytes per second; `Err` says what is wrong with a well-formed one.
fn parse_rate(s: &str) -> Option<Result<f64, String>> {
    let v = s.trim();
    let v = v.strip_suffix("/s")?;
    let lower = v.to_ascii_lowercase();
    let (num, scale) = [("gb", 1e9), ("mb", 1e6), ("kb", 1e3), ("b", 1.0)]
        .iter()
        .find_map(|(u, k)| lower.strip_suffix(u).map(|n| (n.to_string(), *k)))?;
    let x: f64 = num.trim().parse().ok()?;
    let r = x * scale;
    if !(r.is_finite() && (MIN_RATE..=MAX_RATE).contains(&r)) {
        return Some(Err(format!(
            "--throttle-read rate must be between 1 B/s and 1000 GB/s (1e12 bytes per second), got {s:?}"
        )));
    }
    Some(Ok(r))
}

/// Parses `2MB/s`, `+20ms`, or both: `2MB/s+20ms`.
pub fn parse_throttle(s: &str) -> Result<Throttle, String> {
    let bad = || {
        format!(
            "--throttle-read takes RATE (e.g. 2MB/s, 500KB/s), +LATENCY (e.g. +20ms) or both (2MB/s+20ms), got {s:?}"
        )
    };
    let s = s.trim();
    let (rate, lat) = match s.find('+') {
        Some(0) => ("", s),
        Some(i) => (&s[..i], &s[i..]),
        None => (s, ""),
    };
    let bytes_per_s = if rate.is_empty() { None } else { Some(parse_rate(rate).ok_or_else(bad)??) };
    let per_file = if lat.is_empty() { Duration::ZERO } else { parse_ms(lat).ok_or_else(bad)? };
    if bytes_per_s.is_none() && per_file.is_zero() {
        return Err(bad());
    }
    Ok(Throttle { bytes_per_s, per_file })
}

/// The slow link shared by every loader worker: bandwidth is shared like a real disk's or
/// network's (each read reserves its slot), latency is paid per file, in parallel.
#[derive(Debug)]
pub struct SlowLink {
    throttle: Throttle,
    next_free: std::sync::Mutex<Instant>,
}

impl SlowLink {
    pub fn new(throttle: Throttle) -> SlowLink {
        SlowLink { throttle, next_free: std::sync::Mutex::new(Instant::now()) }
    }

    /// Waits as long as reading `bytes` over the link takes, from now.
    pub fn read(&self, bytes: usize) {
        let now = Instant::now();
        let done = match (self.throttle.bytes_per_s, self.next_free.lock()) {
            (Some(r), Ok(mut next)) => {
                let start = (*next).max(now);
                // Saturating: a far-future slot must not panic the worker that reserves it.
                *next = start.checked_add(secs(bytes as f64 / r)).unwrap_or(start);
                *next
            }
            _ => now,
        };
        let until = done.max(now).checked_add(self.throttle.per_file).unwrap_or(done);
        std::thread::sleep(until.saturating_duration_since(Instant::now()));
    }
}

/// `--slow STAGE=+MS`: extra time in one stage.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Slow {
    pub stage: Stage,
    pub extra: Duration,
}

impl Slow {
    /// The `--slow` value that parses back to this one ([`parse_slow`]).
    pub fn spec(&self) -> String {
        format!("{}={}", self.stage.name(), delay_spec(self.extra))
    }

    pub fn describe(&self) -> String {
        let how = if self.on_cpu() { "CPU work" } else { "waiting" };
        format!("{} slowed by {:.1} ms of {how} (--slow)", self.stage, self.extra.as_secs_f64() * 1e3)
    }

    /// Reads are slowed by waiting (like a slow disk); the other stages by spinning the CPU
    /// (like heavier decoding, resizing or a bigger model).
    pub fn on_cpu(&self) -> bool {
        !matches!(self.stage, Stage::Read | Stage::Wait)
    }

    /// Spends the extra time, the way the stage would.
    pub fn apply(&self) {
        if self.on_cpu() {
            let end = Instant::now() + self.extra;
            while Instant::now() < end {
                std::hint::spin_loop();
            }
        } else {
            std::thread::sleep(self.extra);
        }
    }
}

pub fn parse_slow(s: &str) -> Result<Slow, String> {
    let stages: Vec<&str> = Stage::ALL.iter().map(|s| s.name()).collect();
    let bad = || {
        format!(
            "--slow takes STAGE=+MS, e.g. decode=+5ms, with STAGE one of {} and MS from 0 to under 3600 s; got {s:?}",
            stages.join(", ")
        )
    };
    let (name, extra) = s.split_once('=').ok_or_else(bad)?;
    let stage = Stage::from_name(name.trim()).ok_or_else(bad)?;
    let extra = parse_ms(extra).ok_or_else(bad)?;
    Ok(Slow { stage, extra })
}

/// The delays of one stage, summed.
pub fn extra_for(slow: &[Slow], stage: Stage) -> Option<Slow> {
    let total = slow.iter().filter(|s| s.stage == stage).fold(Duration::ZERO, |t, s| t.saturating_add(s.extra));
    (!total.is_zero()).then_some(Slow { stage, extra: total })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn throttle_specs_parse() {
        let ms = Duration::from_millis;
        let table: [(&str, Option<f64>, Duration); 5] = [
            ("2MB/s", Some(2e6), Duration::ZERO),
            ("500KB/s", Some(5e5), Duration::ZERO),
            ("+20ms", None, ms(20)),
            ("1.5GB/s+3ms", Some(1.5e9), ms(3)),
            ("100b/s+1s", Some(100.0), ms(1000)),
        ];
        for (spec, rate, lat) in table {
            assert_eq!(parse_throttle(spec), Ok(Throttle { bytes_per_s: rate, per_file: lat }), "{spec}");
        }
        for bad in ["", "fast", "2MB", "-5MB/s", "2MB/s+", "+-3ms", "0MB/s"] {
            assert!(parse_throttle(bad).is_err(), "{bad}");
        }
        // Well-formed but out of range: the message gives the accepted range.
        for bad in ["1e-20B/s", "0.5B/s", "1e300GB/s", "infB/s", "NaNMB/s", "2000GB/s"] {
            let e = parse_throttle(bad).expect_err(bad);
            assert!(e.contains("between 1 B/s and 1000 GB/s"), "{bad}: {e}");
        }
        for bad in ["+1e300s", "+infms", "+NaNms", "+3600s", "+4000000ms"] {
            assert!(parse_throttle(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn specs_parse_back_to_what_they_spell() {
        for spec in
            ["2MB/s", "500KB/s", "+20ms", "1.5GB/s+3ms", "100B/s+1s", "7B/s+250us", "+0.5us", "1234.5B/s+2.25ms"]
        {
            let t = parse_throttle(spec).unwrap();
            assert_eq!(parse_throttle(&t.spec()), Ok(t), "{spec} → {}", t.spec());
        }
        assert_eq!(parse_throttle("2MB/s+20ms").unwrap().spec(), "2MB/s+20ms");
        for spec in ["decode=+1ms", "read=+30ms", "read=+2", "resize=+0.3ms", "wait=+1.5s", "decode=+0.0001ms"] {
            let s = parse_slow(spec).unwrap();
            assert_eq!(parse_slow(&s.spec()), Ok(s), "{spec} → {}", s.spec());
        }
        assert_eq!(parse_slow("read=+30ms").unwrap().spec(), "read=+30ms");
    }

    #[test]
    fn throttle_delay_is_size_over_rate_plus_latency() {
        let t = Throttle { bytes_per_s: Some(1e6), per_file: Duration::from_millis(5) };
        assert_eq!(t.delay(500_000), Duration::from_millis(505));
        // A rate no parser would accept still gives a (saturated) delay, not a panic.
        let t = Throttle { bytes_per_s: Some(1e-300), per_file: Duration::MAX };
        assert_eq!(t.delay(usize::MAX), Duration::MAX);
    }

    #[test]
    fn slow_specs_parse_and_say_how_they_slow() {
        let s = parse_slow("decode=+5ms").unwrap();
        assert_eq!((s.stage, s.extra), (Stage::Decode, Duration::from_millis(5)));
        assert!(s.on_cpu());
        assert!(!parse_slow("read=+2").unwrap().on_cpu());
        assert!(parse_slow("unzip=+5ms").unwrap_err().contains("decode"));
        assert!(parse_slow("decode").is_err());
        let both = [parse_slow("resize=+1ms").unwrap(), parse_slow("resize=+2ms").unwrap()];
        assert_eq!(extra_for(&both, Stage::Resize).unwrap().extra, Duration::from_millis(3));
        assert!(extra_for(&both, Stage::Decode).is_none());
    }
}
