//! Holding out a validation set: per class, deterministic per seed.

use super::rng::shuffle;
use super::scan::Dataset;

/// Splits `ds` into (training, validation): in each class, `round(n × fraction)` files chosen
/// by a seeded shuffle go to validation, so class proportions are kept (within one file per
/// class) and no file is in both. Both keep the class list and label order; samples keep
/// their scan order.
pub fn split(ds: &Dataset, fraction: f64, seed: u64) -> (Dataset, Dataset) {
    let fraction = if fraction.is_finite() { fraction.clamp(0.0, 1.0) } else { 0.0 };
    let mut held = vec![false; ds.samples.len()];
    for label in 0..ds.classes.len() as u32 {
        let mut idx: Vec<usize> = (0..ds.samples.len()).filter(|i| ds.samples[*i].label == label).collect();
        let k = (idx.len() as f64 * fraction).round() as usize;
        // A different stream from the batch order's (which uses the seed itself per epoch).
        shuffle(&mut idx, seed ^ 0x5A17_0000_0000_0000 ^ (label as u64).wrapping_mul(0xA24B_AED4_963E_E407));
        for i in idx.into_iter().take(k) {
            held[i] = true;
        }
    }
    let part = |keep: bool| Dataset {
        root: ds.root.clone(),
        classes: ds.classes.clone(),
        samples: ds.samples.iter().zip(&held).filter(|(_, h)| **h == keep).map(|(s, _)| s.clone()).collect(),
        ignored: 0,
        ignored_by_ext: Default::default(),
        problems: Vec::new(),
        empty_classes: Vec::new(),
    };
    let mut train = part(false);
    train.ignored = ds.ignored;
    train.ignored_by_ext = ds.ignored_by_ext.clone();
    train.problems = ds.problems.clone();
    (train, part(true))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::scan::Sample;
    use std::collections::HashSet;
    use std::path::PathBuf;

    fn dataset(per_class: &[usize]) -> Dataset {
        let mut samples = Vec::new();
        for (label, n) in per_class.iter().enumerate() {
            for i in 0..*n {
                samples.push(Sample { path: PathBuf::from(format!("c{label}/{i}.png")), label: label as u32 });
            }
        }
        Dataset { classes: (0..per_class.len()).map(|c| format!("c{c}")).collect(), samples, ..Default::default() }
    }

    fn paths(ds: &Dataset) -> Vec<PathBuf> {
        ds.samples.iter().map(|s| s.path.clone()).collect()
    }

    #[test]
    fn each_class_keeps_its_proportion_and_no_file_is_in_both() {
        let ds = dataset(&[50, 13, 7, 100]);
        let (train, val) = split(&ds, 0.2, 42);
        assert_eq!(train.samples.len() + val.samples.len(), ds.samples.len());
        for (c, n) in [50usize, 13, 7, 100].iter().enumerate() {
            let v = val.class_counts()[c] as f64;
            assert!((v - *n as f64 * 0.2).abs() <= 1.0, "class {c}: {v} of {n}");
            assert_eq!(train.class_counts()[c] + val.class_counts()[c], *n);
        }
        let a: HashSet<PathBuf> = paths(&train).into_iter().collect();
        assert!(paths(&val).iter().all(|p| !a.contains(p)), "a file in both sets");
        assert_eq!(val.classes, ds.classes);
    }

    #[test]
    fn split_is_stable_for_a_seed_and_changes_with_it() {
        let ds = dataset(&[40, 40, 40]);
        let (_, a) = split(&ds, 0.25, 7);
        let (_, b) = split(&ds, 0.25, 7);
        let (_, c) = split(&ds, 0.25, 8);
        assert_eq!(paths(&a), paths(&b));
        assert_ne!(paths(&a), paths(&c));
        assert_eq!(a.samples.len(), c.samples.len());
    }

    #[test]
    fn zero_split_holds_nothing_out() {
        let ds = dataset(&[5, 5]);
        let (train, val) = split(&ds, 0.0, 1);
        assert_eq!((train.samples.len(), val.samples.len()), (10, 0));
    }
}
