//! Advice in the user's terms, made last and once for every piece of advice
//! ([`in_user_terms`]): for a PyTorch or Keras program (`pipeprof run`, `attach`), each typed
//! change is said with that framework's knob — `DataLoader(num_workers=6)`, never a pipeprof
//! flag the script does not have — from one [`knobs`], which `run --check-advice` sets too;
//! for pipeprof's own loop, its flags. The change stays typed, the prediction is the model's,
//! and the reason is its [`Why`]'s words.

use super::why::{Proposal, Why};
use super::{Advice, Change, LoaderKnobs};
use crate::aggregate::{Framework, RunSettings, Summary};

/// The action and the code for `change` in the terms of the run's framework, or None where
/// it has none (pipeprof's own loop, another framework, a change with no knob of its own);
/// `predicted`: the advice has a number (without one, more workers are something to try, not
/// a promise).
fn say(change: &Change, s: &Summary, predicted: bool) -> Option<(String, String)> {
    match s.settings.framework {
        Framework::PyTorch => say_torch(change, &s.settings, predicted),
        Framework::Keras => say_keras(change, &s.settings, predicted),
        Framework::Own | Framework::Other(_) => None,
    }
}

/// [`say`] for PyTorch: the `DataLoader`'s arguments ([`knobs`], written as code by
/// [`torch_code`]), the device moves.
fn say_torch(change: &Change, st: &RunSettings, predicted: bool) -> Option<(String, String)> {
    let w = st.workers;
    let knobs = knobs_torch(change, st);
    let code = || knobs.as_ref().map(torch_code);
    Some(match change {
        Change::Workers(n) => {
            (format!("{} the DataLoader's workers {w} → {n}", if predicted { "raise" } else { "try" }), code()?)
        }
        Change::BatchSize(n) => {
            (format!("raise the batch size {} → {n} (and the learning rate with it)", st.batch_size), code()?)
        }
        // Without workers nothing loads ahead: workers first.
        Change::Prefetch(_) if w == 0 => ("load batches ahead in worker processes".into(), code()?),
        Change::Prefetch(_) => {
            let factor = knobs.as_ref()?.prefetch_factor?;
            let now = st.prefetch_factor.unwrap_or(2);
            (format!("queue more batches per worker: prefetch_factor {now} → {factor}"), code()?)
        }
        Change::PersistentWorkers => ("keep the DataLoader's workers between epochs".into(), code()?),
        Change::UseDevice(d) if d == "cpu" => {
            ("or train on the CPU".into(), "device = \"cpu\"  # model.to(device), batch.to(device)".into())
        }
        Change::UseDevice(_) => (
            "train on the GPU".into(),
            "model.to(\"cuda\"); xs = xs.to(\"cuda\", non_blocking=True)  # DataLoader(..., pin_memory=True)".into(),
        ),
        Change::U8Batches => (
            "hand out uint8 batches and convert to float on the device".into(),
            "transforms.PILToTensor() in the dataset; xs.to(device, non_blocking=True).float().div_(255)".into(),
        ),
        _ => return None,
    })
}

/// The `DataLoader` arguments `k` sets, as code: `DataLoader(..., num_workers=2,
/// persistent_workers=True)`. Pure.
fn torch_code(k: &LoaderKnobs) -> String {
    let py = |b: bool| if b { "True" } else { "False" };
    let args: Vec<String> = [
        k.num_workers.map(|n| format!("num_workers={n}")),
        k.batch_size.map(|n| format!("batch_size={n}")),
        k.persistent_workers.map(|b| format!("persistent_workers={}", py(b))),
        k.prefetch_factor.map(|n| format!("prefetch_factor={n}")),
        k.pin_memory.map(|b| format!("pin_memory={}", py(b))),
    ]
    .into_iter()
    .flatten()
    .collect();
    format!("DataLoader(..., {})", args.join(", "))
}

/// [`say`] for Keras: Keras 3 puts the workers on the PyDataset, tf.keras 2 (tf_keras) on fit
/// for a Sequence; tf.data has no workers but its map's parallel calls, on the pipeline's own
/// threads.
fn say_keras(change: &Change, st: &RunSettings, predicted: bool) -> Option<(String, String)> {
    Some(match change {
        Change::Workers(_) if st.tf_data => (
            "let tf.data run the map in parallel and prefetch, if it does not already".into(),
            "dataset.map(f, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)".into(),
        ),
        Change::Workers(n) => (
            format!("{} batches in {n} worker processes", if predicted { "load" } else { "try loading" }),
            format!(
                "PyDataset(..., workers={n}, use_multiprocessing=True)  # tf.keras 2: model.fit(..., workers={n}, use_multiprocessing=True); tf.data: .map(f, num_parallel_calls=tf.data.AUTOTUNE)"
            ),
        ),
        Change::Prefetch(depth) => (
            format!("queue {depth} batches ahead"),
            format!("PyDataset(..., max_queue_size={depth})  # tf.data: .prefetch(tf.data.AUTOTUNE)"),
        ),
        Change::BatchSize(n) => (
            format!("raise the batch size {} → {n} (and the learning rate with it)", st.batch_size),
            format!("model.fit(..., batch_size={n})  # a PyDataset: {n} samples per __getitem__; tf.data: .batch({n})"),
        ),
        Change::UseDevice(d) if d == "cpu" => {
            ("or train on the CPU".into(), "CUDA_VISIBLE_DEVICES=\"\" python train.py".into())
        }
        Change::UseDevice(_) => (
            "train on the GPU".into(),
            "pip install \"jax[cuda12]\" (or tensorflow[and-cuda], or torch with CUDA) for your Keras backend".into(),
        ),
        _ => return None,
    })
}

/// The loader arguments that make `change` in the framework a run's settings name (what
/// [`say`]'s code sets), where the start-up hook can set them without an edit: `pipeprof run
/// --check-advice` re-runs the program with them. None for pipeprof's own loop (its flags are
/// `profile --check-advice`'s). Pure.
pub fn knobs(change: &Change, st: &RunSettings) -> Option<LoaderKnobs> {
    match (&st.framework, change) {
        (Framework::PyTorch, _) => knobs_torch(change, st),
        (Framework::Keras, Change::Workers(n)) if !st.tf_data => {
            Some(LoaderKnobs { num_workers: Some(*n), ..LoaderKnobs::default() })
        }
        _ => None,
    }
}

/// [`knobs`] for PyTorch's `DataLoader`: workers (persisting, where it had none and they did
/// not), the batch size, batches queued per worker (two workers first, where it had none).
fn knobs_torch(change: &Change, st: &RunSettings) -> Option<LoaderKnobs> {
    let w = st.workers;
    let none = LoaderKnobs::default;
    Some(match change {
        Change::Workers(n) => LoaderKnobs {
            num_workers: Some(*n),
            persistent_workers: (w == 0 && st.persistent_workers != Some(true)).then_some(true),
            ..none()
        },
        Change::BatchSize(n) => LoaderKnobs { batch_size: Some(*n), ..none() },
        Change::Prefetch(_) if w == 0 => LoaderKnobs { num_workers: Some(2), prefetch_factor: Some(2), ..none() },
        Change::Prefetch(depth) => LoaderKnobs { prefetch_factor: Some(depth.div_ceil(w).max(2)), ..none() },
        Change::PersistentWorkers => LoaderKnobs { persistent_workers: Some(true), ..none() },
        _ => return None,
    })
}

/// The advice's words, made last and once for each piece the rules decided: the action and
/// what to type or edit for its typed change ([`Advice::command`]) in a framework's program's
/// terms where it has them (PyTorch's also gets its own advice, [`persistent_workers`]), else
/// pipeprof's ([`super::words::action`], [`Change::command`]); the reason from its [`Why`].
/// The change stays as it is.
pub fn in_user_terms(mut decided: Vec<Proposal>, s: &Summary) -> Vec<Advice> {
    let fw = &s.settings.framework;
    if *fw == Framework::PyTorch {
        decided.extend(persistent_workers(s));
    }
    decided
        .into_iter()
        .map(|mut p| {
            // A count of workers is no knob of a tf.data pipeline: its gain is not this one's.
            if fw.has_knobs() && s.settings.tf_data && matches!(p.change, Change::Workers(_)) {
                (p.predicted_speedup, p.basis) = (None, None);
            }
            let (action, command) = match say(&p.change, s, p.predicted_speedup.is_some()) {
                Some((action, code)) => (action, Some(code)),
                None => (super::words::action(&p.change, &p.why, s), p.change.command()),
            };
            Advice {
                action,
                command,
                reason: p.why.words(),
                change: p.change,
                predicted_speedup: p.predicted_speedup,
                basis: p.basis,
            }
        })
        .collect()
}

/// PyTorch starts a loader's workers anew at every epoch unless they persist: when the run's
/// first wait (workers starting, the queue filling) is long against a step, every epoch after
/// the first pays it again.
fn persistent_workers(s: &Summary) -> Option<Proposal> {
    let st = &s.settings;
    let sp = &s.split;
    let epochs = s.epochs.len() as f64;
    if st.workers == 0 || st.persistent_workers != Some(false) || epochs < 2.0 || s.elapsed_s <= 0.0 {
        return None;
    }
    if sp.startup_wait_ms < 2.0 * sp.mean_step_ms.max(1.0) {
        return None;
    }
    // Against the steady rate every prediction and re-run is read at (its waits, the restarts
    // among them, in; evaluation and a one-off first compute out): the restarts of epochs
    // 2 on are what persistent workers save of its time.
    let n = super::now::measured_now(s).filter(|n| n.rate.is_finite() && n.rate > 0.0)?;
    let now = n.rate;
    let run_s = s.images as f64 / now;
    let saved_s = sp.startup_wait_ms / 1000.0 * (epochs - 1.0);
    let gain = run_s / (run_s - saved_s).max(f64::MIN_POSITIVE);
    let basis = (s.steps > 0 && run_s > 0.0).then_some(super::Basis {
        now,
        from_step: n.from_step,
        to_step: n.to_step,
        predicted: now * gain,
        model_now: now,
        range: None,
        slow_steps: false,
        compute_split_unknown: false,
        floor: false,
    });
    Some(Proposal {
        change: Change::PersistentWorkers,
        predicted_speedup: (gain >= super::thresholds::MIN_GAIN).then_some(gain),
        basis,
        why: Why::PersistentWorkers { startup_wait_ms: sp.startup_wait_ms, workers: st.workers, epochs },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::{EpochSummary, RunSettings};

    fn summary(framework: &str, workers: usize, persistent: Option<bool>) -> Summary {
        Summary {
            settings: RunSettings {
                framework: framework.into(),
                workers,
                batch_size: 32,
                persistent_workers: persistent,
                prefetch_factor: (workers > 0).then_some(2),
                ..RunSettings::default()
            },
            ..Summary::default()
        }
    }

    fn advice(change: Change) -> Proposal {
        Proposal {
            change,
            predicted_speedup: Some(2.0),
            basis: None,
            why: Why::U8Batches { transfer_ms: 4.0, after_ms: 1.0 },
        }
    }

    #[test]
    fn advice_names_the_frameworks_knobs_never_pipeprof_flags() {
        let k = LoaderKnobs::default;
        // (framework, workers, change, expected code, the arguments the hook sets to apply it)
        let table: Vec<(&str, usize, Change, &str, Option<LoaderKnobs>)> = vec![
            ("pytorch", 2, Change::Workers(6), "DataLoader(..., num_workers=6)", Some(LoaderKnobs { num_workers: Some(6), ..k() })),
            ("pytorch", 0, Change::Workers(2), "DataLoader(..., num_workers=2, persistent_workers=True)", Some(LoaderKnobs { num_workers: Some(2), persistent_workers: Some(true), ..k() })),
            ("pytorch", 2, Change::BatchSize(64), "DataLoader(..., batch_size=64)", Some(LoaderKnobs { batch_size: Some(64), ..k() })),
            ("pytorch", 4, Change::Prefetch(13), "DataLoader(..., prefetch_factor=4)", Some(LoaderKnobs { prefetch_factor: Some(4), ..k() })),
            ("pytorch", 0, Change::Prefetch(13), "DataLoader(..., num_workers=2, prefetch_factor=2)", Some(LoaderKnobs { num_workers: Some(2), prefetch_factor: Some(2), ..k() })),
            ("pytorch", 2, Change::UseDevice("cpu".into()), "device = \"cpu\"  # model.to(device), batch.to(device)", None),
            (
                "keras",
                0,
                Change::Workers(4),
                "PyDataset(..., workers=4, use_multiprocessing=True)  # tf.keras 2: model.fit(..., workers=4, use_multiprocessing=True); tf.data: .map(f, num_parallel_calls=tf.data.AUTOTUNE)",
                Some(LoaderKnobs { num_workers: Some(4), ..k() }),
            ),
            ("keras", 0, Change::BatchSize(128), "model.fit(..., batch_size=128)  # a PyDataset: 128 samples per __getitem__; tf.data: .batch(128)", None),
            ("keras", 0, Change::Prefetch(8), "PyDataset(..., max_queue_size=8)  # tf.data: .prefetch(tf.data.AUTOTUNE)", None),
        ];
        for (fw, workers, change, code, set) in table {
            // A loader without workers has none to keep: PyTorch says persistent_workers=False.
            let s = summary(fw, workers, Some(workers > 0));
            let out = in_user_terms(vec![advice(change.clone())], &s);
            assert_eq!(out.len(), 1, "{fw} {change:?}");
            assert_eq!(out[0].change, change, "the change stays typed: {fw} {change:?}");
            assert_eq!(knobs(&change, &s.settings), set, "{fw} {change:?}");
            assert_eq!(out[0].command.as_deref(), Some(code), "{fw} {change:?}");
            let p = advice(change.clone());
            assert_ne!(out[0].action, crate::diagnose::words::action(&change, &p.why, &s), "{fw} {change:?}");
            assert_eq!(out[0].reason, p.why.words(), "the reason is the rule's: {fw} {change:?}");
            assert_eq!(out[0].predicted_speedup, Some(2.0), "the prediction is the model's");
        }
        // A change with no framework form keeps its words (a cache of its own, contention).
        let s = summary("pytorch", 2, Some(true));
        let out = in_user_terms(vec![advice(Change::PackOwnLoader)], &s);
        assert_eq!(
            (out[0].change.clone(), out[0].action.as_str()),
            (Change::PackOwnLoader, "decode and resize every image once into one local memory-mapped file (e.g. a numpy memmap) and have your loader read from it")
        );
        assert_eq!(out[0].command, None, "nothing to copy");
        // A tf.data pipeline has no workers to set: its parallel map, no number, nothing re-run.
        let mut tf = summary("keras", 0, None);
        tf.settings.tf_data = true;
        let out = in_user_terms(vec![advice(Change::Workers(2))], &tf);
        assert_eq!(
            (out[0].command.as_deref(), out[0].predicted_speedup, knobs(&Change::Workers(2), &tf.settings)),
            (Some("dataset.map(f, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)"), None, None)
        );
        // pipeprof's own runs keep their words, with their flag to copy; nothing for the hook.
        let own = summary("", 2, None);
        let out = in_user_terms(vec![advice(Change::Workers(6))], &own);
        assert_eq!(
            (out[0].action.as_str(), out[0].command.as_deref()),
            ("raise loader workers 2 → 6", Some("--workers 6"))
        );
        assert_eq!(knobs(&Change::Workers(6), &own.settings), None);
    }

    #[test]
    fn persistent_workers_advised_when_worker_start_up_repeats_each_epoch() {
        let mut s = summary("pytorch", 4, Some(false));
        s.epochs = vec![EpochSummary::default(), EpochSummary::default(), EpochSummary::default()];
        s.elapsed_s = 10.0;
        (s.steps, s.images, s.images_per_s) = (100, 3200, 320.0);
        // A second of the 10 evaluates: no training in it, as the re-runs' rates leave it out.
        s.split.validate_ms = 1000.0;
        s.split.mean_step_ms = 50.0;
        s.split.startup_wait_ms = 1500.0;
        let out = in_user_terms(Vec::new(), &s);
        assert_eq!(out.len(), 1);
        let set = LoaderKnobs { persistent_workers: Some(true), ..LoaderKnobs::default() };
        assert_eq!(out[0].change, Change::PersistentWorkers);
        assert_eq!(out[0].command.as_deref(), Some("DataLoader(..., persistent_workers=True)"));
        assert_eq!(out[0].action, "keep the DataLoader's workers between epochs");
        assert_eq!(knobs(&out[0].change, &s.settings), Some(set));
        // 1.5 s saved in each of 2 later epochs of 9 s of training: 9 / 6, against its rate.
        let g = out[0].predicted_speedup.unwrap_or_default();
        assert!((g - 9.0 / 6.0).abs() < 1e-9, "{g}");
        let now = out[0].basis.map(|b| b.now).unwrap_or_default();
        assert!((now - 3200.0 / 9.0).abs() < 1e-9, "{now}");
        // Not when workers already persist, there are none, one epoch, or start-up is short.
        for (workers, persistent, epochs, startup) in [
            (4, Some(true), 3, 1500.0),
            (0, Some(false), 3, 1500.0),
            (4, Some(false), 1, 1500.0),
            (4, Some(false), 3, 60.0),
        ] {
            let mut s = summary("pytorch", workers, persistent);
            s.epochs = vec![EpochSummary::default(); epochs];
            s.elapsed_s = 10.0;
            (s.steps, s.images, s.images_per_s) = (100, 3200, 320.0);
            s.split.mean_step_ms = 50.0;
            s.split.startup_wait_ms = startup;
            assert!(in_user_terms(Vec::new(), &s).is_empty(), "{workers} {persistent:?} {epochs} {startup}");
        }
    }
}
