//! Today's measured rate: what every predicted gain is a ratio to, and what `--check-advice`
//! reads its re-runs by. Its own module so the capacity model ([`super::model`]) and the rules
//! ([`super::classify`]) both read it, neither through the other.

use crate::aggregate::Summary;

/// Today's rate as measured: images per step over the steady state's mean step time, and the
/// steps that steady state covers. The rate the report shows and every predicted gain is a
/// ratio to; in a summary's verdict as `now` (`images_per_s` there: the summary's own
/// `images_per_s` is the whole run's, its one-off first step and validation included).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct Now {
    #[serde(rename = "images_per_s")]
    pub rate: f64,
    pub from_step: u64,
    pub to_step: u64,
}

/// The measured rate of a summary's steady state, or `None` before a step is measured. Pure.
///
/// After a change of workers (`from_step`): images per step over that pipeline's mean step
/// (wait + transfer + compute). Otherwise the whole run's images over its time, from the first
/// wait, less a one-off first compute's excess over a typical one (a compile, a warm-up) and
/// the validation passes inside it (an eval loop between epochs trains nothing). The
/// first wait stays in: the loader was working to fill the queue, and leaving it out would
/// credit the run with batches made before its clock started (with 8 workers, 8 batches).
pub fn measured_now(s: &Summary) -> Option<Now> {
    let sp = &s.split;
    if s.steps == 0 {
        return None;
    }
    let ok = |x: f64| x.is_finite() && x > 0.0;
    if let Some(k) = sp.from_step {
        let per_step =
            if s.images > 0 { s.images as f64 / s.steps as f64 } else { s.settings.batch_size.max(1) as f64 };
        return ok(sp.mean_step_ms).then(|| Now {
            rate: per_step * 1000.0 / sp.mean_step_ms,
            from_step: (k + 1).min(s.steps),
            to_step: s.steps,
        });
    }
    if !ok(s.images_per_s) {
        return None;
    }
    if s.images == 0 {
        return Some(Now { rate: s.images_per_s, from_step: 1, to_step: s.steps });
    }
    let run_ms = s.images as f64 / s.images_per_s * 1000.0;
    let one_off = sp.startup_compute_ms.map_or(0.0, |f| (f - sp.compute_ms).max(0.0));
    // Validation between epochs trains nothing: the training rate leaves its time out.
    let left_out = one_off + sp.validate_ms.max(0.0);
    let ms = if run_ms - left_out > 0.0 { run_ms - left_out } else { run_ms };
    Some(Now { rate: s.images as f64 * 1000.0 / ms, from_step: 1, to_step: s.steps })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_leaves_out_a_one_off_first_compute_and_the_validation_inside_the_run() {
        // 8 steps, 32 images over 120 ms of run clock; (one-off compute excess, validation ms,
        // expected images/s).
        for (startup, validate, want) in
            [(None, 0.0, 32.0 / 0.120), (None, 40.0, 32.0 / 0.080), (Some(30.0), 40.0, 32.0 / 0.050)]
        {
            let mut s = Summary { steps: 8, images: 32, images_per_s: 32.0 / 0.120, ..Default::default() };
            s.split.compute_ms = 10.0;
            s.split.startup_compute_ms = startup.map(|x: f64| x + 10.0);
            s.split.validate_ms = validate;
            let now = measured_now(&s).map(|n| n.rate).unwrap_or_default();
            assert!((now - want).abs() < 1e-6, "{startup:?} {validate}: {now}");
        }
        assert_eq!(measured_now(&Summary::default()), None, "no step, no rate");
    }
}
