//! Numbers as every view writes them.

/// Milliseconds in the unit that reads best (µs under 10 µs, s over 1 s).
pub fn ms(v: f64) -> String {
    if !v.is_finite() || v <= 0.0 {
        "0ms".into()
    } else {
        ms_with(v, "")
    }
}

/// Milliseconds with a space before the unit ("2.50 ms"), as the verdict's sentences write
/// them. Unlike [`ms`], zero and negative values are printed as they are (in µs).
pub fn ms_spaced(v: f64) -> String {
    ms_with(v, " ")
}

/// `v` ms in s, ms or µs, with `sep` between the number and the unit.
fn ms_with(v: f64, sep: &str) -> String {
    if v >= 1000.0 {
        format!("{:.2}{sep}s", v / 1000.0)
    } else if v >= 10.0 {
        format!("{v:.1}{sep}ms")
    } else if v >= 0.01 {
        format!("{v:.2}{sep}ms")
    } else {
        format!("{:.1}{sep}µs", v * 1000.0)
    }
}

/// A share (0–1) as a whole percentage: 0.2 → "20%".
pub fn pct(share: f64) -> String {
    format!("{:.0}%", share * 100.0)
}

/// Images per second, approximate: "≈12k images/s", "≈240 images/s", "≈9.5 images/s".
pub fn rate(images_per_s: f64) -> String {
    let v = images_per_s;
    if !v.is_finite() {
        "unlimited".into()
    } else if v >= 10_000.0 {
        format!("≈{:.0}k images/s", v / 1000.0)
    } else if v >= 100.0 {
        format!("≈{v:.0} images/s")
    } else {
        format!("≈{v:.1} images/s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_pick_readable_units() {
        let table =
            [(0.0, "0ms"), (0.005, "5.0µs"), (2.5, "2.50ms"), (25.0, "25.0ms"), (2500.0, "2.50s"), (f64::NAN, "0ms")];
        for (v, want) in table {
            assert_eq!(ms(v), want, "{v}");
        }
    }

    #[test]
    fn spaced_durations_keep_zero_and_pick_readable_units() {
        let table = [(0.0, "0.0 µs"), (0.005, "5.0 µs"), (2.5, "2.50 ms"), (25.0, "25.0 ms"), (2500.0, "2.50 s")];
        for (v, want) in table {
            assert_eq!(ms_spaced(v), want, "{v}");
        }
    }

    #[test]
    fn rates_round_by_magnitude_and_say_unlimited_for_free_work() {
        let table = [
            (f64::INFINITY, "unlimited"),
            (12_345.0, "≈12k images/s"),
            (240.4, "≈240 images/s"),
            (9.54, "≈9.5 images/s"),
        ];
        for (v, want) in table {
            assert_eq!(rate(v), want, "{v}");
        }
        assert_eq!(pct(0.2), "20%");
    }
}
