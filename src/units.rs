//! Numbers as every view writes them.

/// Milliseconds in the unit that reads best (µs under 10 µs, s over 1 s).
pub fn ms(v: f64) -> String {
    if !v.is_finite() || v <= 0.0 {
        "0ms".into()
    } else if v >= 1000.0 {
        format!("{:.2}s", v / 1000.0)
    } else if v >= 10.0 {
        format!("{v:.1}ms")
    } else if v >= 0.01 {
        format!("{v:.2}ms")
    } else {
        format!("{:.1}µs", v * 1000.0)
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
}
