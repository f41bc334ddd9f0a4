//! The model's parts that no one span measures, estimated from those that are: the compute's
//! hot step from its threads' CPU, the CPU of tf.data's traced stages within the process's,
//! the training process's serial work per batch from its wait for data, a worker's start from
//! the run's first wait. Pure; [`super::readings`] applies them to a summary.

use super::model::StageCost;

/// Below this share of the pool's reading of a step, the training thread's CPU is its
/// dispatch and waiting, not a reading of the step's work (see [`hot_compute_ms`](super::readings::hot_compute_ms)).
pub const TRAIN_CARRIES: f64 = 0.5;

/// The lesser of the pool's estimate of a hot step (`pool_ms`, already over its overlap) and
/// the training thread's CPU per step less its transfer (`train_ms`), where that is measured,
/// positive, and at least [`TRAIN_CARRIES`] of the pool's. Pure.
pub fn hot_step_ms(pool_ms: f64, train_ms: Option<f64>) -> f64 {
    match train_ms.filter(|t| t.is_finite() && *t > 0.0 && *t >= TRAIN_CARRIES * pool_ms) {
        Some(t) => pool_ms.min(t),
        None => pool_ms,
    }
}

/// Training on the CPU beside tf.data, whose stages come from TensorFlow's trace: wall time
/// with no on-CPU clock, and on the cores the step shares part of that wall is waiting for a
/// core (measured: a blur map's spans 7.5 ms an image where its CPU was 3.8 ms). The process's
/// own CPU per image (`tree_ms`) is what the loader and the compute used together: where
/// their figures add up to more, both are scaled into it (the loader's rest is off-CPU,
/// its run-queue wait unmeasured). The compute's CPU per image, as scaled. Pure.
pub fn traced_cpu_within_tree(loader: &mut [StageCost], compute_cpu_ms: f64, tree_ms: f64) -> f64 {
    let l: f64 = loader.iter().map(|x| x.on_cpu_ms).sum();
    let k = tree_ms / (l + compute_cpu_ms);
    if !(k.is_finite() && k > 0.0 && k < 1.0) || loader.iter().any(|x| x.measured) {
        return compute_cpu_ms;
    }
    for x in loader.iter_mut() {
        x.on_cpu_ms *= k;
    }
    compute_cpu_ms * k
}

/// The training process's serial work per batch beside its compute, ms, from the run's wait
/// for data (`loader_ms_per_image`: the loader stages' wall time per image, `workers`: the
/// run's):
/// - without workers the wait is the batch's loading in the process: what its loader stages
///   do not cover (`wait − B·L`) is the DataLoader's own work per batch (its iterator, the
///   sampler, what no stage times), which stays in the training process when workers load.
///   It also holds per-sample work no stage times, which would move to the workers: an
///   over-estimate of the serial part (`docs/calibration-notes.md`);
/// - with workers, the typical (median) wait less what the workers' pace explains
///   (`B·L/workers − transfer − compute`, when positive): receiving a ready batch (unpickling
///   it out of shared memory) and the iteration. A loop that waits on slow workers has a
///   long median wait that is the loader's, not its own.
///
/// Pure; 0 where nothing is left or the figures are not finite.
pub fn main_per_batch_ms(
    workers: usize,
    wait_ms: f64,
    wait_p50_ms: f64,
    loader_ms_per_image: f64,
    batch: f64,
    busy_ms: f64,
) -> f64 {
    let loading = loader_ms_per_image * batch;
    let m = if workers == 0 {
        wait_ms - loading
    } else {
        let paced = (loading / workers as f64 - busy_ms).max(0.0);
        wait_p50_ms.min(wait_ms.max(0.0)) - paced
    };
    if m.is_finite() {
        m.max(0.0)
    } else {
        0.0
    }
}

/// Starting one worker, ms: the run's first wait (`startup_wait_ms`) less loading its first
/// batch (`batch × loader_ms_per_image`, slower by `workers / cpu_cores` when the workers
/// share fewer cores), over the workers. 0 without workers or where nothing is left. Pure.
pub fn worker_start_ms(
    workers: usize,
    startup_wait_ms: f64,
    loader_ms_per_image: f64,
    batch: f64,
    cpu_cores: f64,
) -> f64 {
    if workers == 0 || cpu_cores.is_nan() || cpu_cores <= 0.0 {
        return 0.0;
    }
    let n = workers as f64;
    let first = loader_ms_per_image * batch * (n / cpu_cores).max(1.0);
    let w = (startup_wait_ms - first) / n;
    if w.is_finite() {
        w.max(0.0)
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_serial_cost_is_read_from_the_wait_that_the_loader_does_not_explain() {
        // (workers, wait mean, wait p50, loader ms per image, batch, step's busy ms) → ms.
        let table = [
            // No workers: the wait is loading 32 × 0.9 ms in turn; 3.2 ms of it no stage timed.
            (0, 32.0, 31.0, 0.9, 32.0, 34.0, 3.2),
            // 2 workers well ahead of a 35 ms step: the median wait is receiving the batch.
            (2, 1.8, 1.1, 0.9, 32.0, 35.0, 1.1),
            // A spike moves the mean, not the median.
            (2, 9.0, 1.1, 0.9, 32.0, 35.0, 1.1),
            // 1 worker at 10 ms per image behind a 1 ms step: its pace explains the wait.
            (1, 319.0, 319.0, 10.0, 32.0, 1.0, 0.0),
            // Not finite: nothing.
            (2, f64::NAN, f64::NAN, 0.9, 32.0, 35.0, 0.0),
        ];
        for (w, mean, p50, l, b, busy, want) in table {
            let got = main_per_batch_ms(w, mean, p50, l, b, busy);
            assert!((got - want).abs() < 1e-9, "{w} workers, wait {mean}/{p50}: {got} vs {want}");
        }
    }

    #[test]
    fn a_workers_start_is_the_first_wait_less_its_first_batch() {
        // (workers, first wait, loader ms per image, batch, cores) → ms per worker.
        let table = [
            (2, 58.0, 0.9, 32.0, 2.0, (58.0 - 28.8) / 2.0),
            // 4 workers on 2 cores load their first batches at half speed.
            (4, 145.0, 0.9, 32.0, 2.0, (145.0 - 57.6) / 4.0),
            (0, 40.0, 0.9, 32.0, 2.0, 0.0),
            (2, 10.0, 0.9, 32.0, 2.0, 0.0),
        ];
        for (w, first, l, b, k, want) in table {
            let got = worker_start_ms(w, first, l, b, k);
            assert!((got - want).abs() < 1e-9, "{w}: {got} vs {want}");
        }
    }
}
