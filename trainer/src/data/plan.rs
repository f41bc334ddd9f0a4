//! What the loader is asked for ([`LoaderConfig`]) and which samples make up each step
//! ([`Plan`]): deterministic for a seed, whatever the thread timing.

use super::rng::shuffle;

/// What the loader produces. `Default` is a small, valid configuration (64×64 RGB, batch 32,
/// one worker, one epoch) for tests and benches to change a field or two of.
#[derive(Debug, Clone)]
pub struct LoaderConfig {
    pub height: u32,
    pub width: u32,
    pub channels: usize,
    pub batch_size: usize,
    pub workers: usize,
    /// Batches waiting in the queue, over all workers.
    pub prefetch: usize,
    pub shuffle: bool,
    pub seed: u64,
    pub epochs: usize,
    /// Stop after this many steps (over all epochs).
    pub max_steps: Option<u64>,
    /// Simulated slow storage (--throttle-read).
    pub throttle: Option<super::simulate::Throttle>,
    /// Simulated extra work per stage (--slow).
    pub slow: Vec<super::simulate::Slow>,
    /// Random augmentations (off by default; never on for validation).
    pub augment: pipeprof_core::config::Augment,
}

impl Default for LoaderConfig {
    fn default() -> LoaderConfig {
        LoaderConfig {
            height: 64,
            width: 64,
            channels: 3,
            batch_size: 32,
            workers: 1,
            prefetch: 2,
            shuffle: true,
            seed: 0,
            epochs: 1,
            max_steps: None,
            throttle: None,
            slow: Vec::new(),
            augment: pipeprof_core::config::Augment::default(),
        }
    }
}

/// Which samples (dataset indices) make up each step: deterministic for a seed. Orders are
/// computed per epoch on demand, so memory does not grow with the number of epochs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub n: usize,
    pub batch_size: usize,
    pub shuffle: bool,
    pub seed: u64,
    pub total_steps: u64,
}

/// One epoch's sample order, cached by whoever walks the plan.
#[derive(Debug, Default)]
pub struct EpochOrder {
    epoch: Option<u32>,
    order: Vec<u32>,
}

impl Plan {
    pub fn new(n: usize, cfg: &LoaderConfig) -> Plan {
        let batch_size = cfg.batch_size.max(1);
        let per_epoch = n.div_ceil(batch_size) as u64;
        // --steps wins over epochs: the run goes over the data as often as the budget needs.
        let total_steps = match cfg.max_steps {
            Some(s) if per_epoch > 0 => s,
            _ => per_epoch * cfg.epochs as u64,
        };
        Plan { n, batch_size, shuffle: cfg.shuffle, seed: cfg.seed, total_steps }
    }

    pub fn steps_per_epoch(&self) -> u64 {
        self.n.div_ceil(self.batch_size) as u64
    }

    /// The epoch of `step` and its sample indices (the last batch of an epoch may be short).
    pub fn step<'a>(&self, step: u64, cache: &'a mut EpochOrder) -> (u32, &'a [u32]) {
        let spe = self.steps_per_epoch().max(1);
        let epoch = (step / spe) as u32;
        if cache.epoch != Some(epoch) {
            cache.order.clear();
            cache.order.extend(0..self.n as u32);
            if self.shuffle {
                shuffle(&mut cache.order, self.seed ^ (epoch as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
            }
            cache.epoch = Some(epoch);
        }
        let start = ((step % spe) as usize) * self.batch_size;
        let end = (start + self.batch_size).min(self.n);
        (epoch, &cache.order[start..end])
    }

    /// Every step's (epoch, samples): for tests and small plans.
    pub fn all(&self) -> Vec<(u32, Vec<u32>)> {
        let mut cache = EpochOrder::default();
        (0..self.total_steps)
            .map(|k| {
                let (e, s) = self.step(k, &mut cache);
                (e, s.to_vec())
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(batch: usize, epochs: usize, steps: Option<u64>, shuffle: bool) -> LoaderConfig {
        LoaderConfig {
            height: 8,
            width: 8,
            batch_size: batch,
            workers: 2,
            shuffle,
            seed: 7,
            epochs,
            max_steps: steps,
            ..LoaderConfig::default()
        }
    }

    #[test]
    fn plan_covers_every_sample_once_per_epoch_keeping_the_last_partial_batch() {
        let p = Plan::new(10, &cfg(4, 2, None, true)).all();
        assert_eq!(p.len(), 6);
        assert_eq!(p[2].1.len(), 2);
        for e in 0..2 {
            let mut all: Vec<u32> = p.iter().filter(|s| s.0 == e).flat_map(|s| s.1.clone()).collect();
            all.sort();
            assert_eq!(all, (0..10).collect::<Vec<_>>());
        }
        assert_ne!(p[0].1, p[3].1, "each epoch has its own order");
    }

    #[test]
    fn plan_is_deterministic_per_seed_and_steps_override_epochs() {
        let a = Plan::new(50, &cfg(8, 1, None, true)).all();
        assert_eq!(a, Plan::new(50, &cfg(8, 1, None, true)).all());
        let mut other = cfg(8, 1, None, true);
        other.seed = 8;
        assert_ne!(a, Plan::new(50, &other).all());
        let s = Plan::new(10, &cfg(4, 1, Some(7), false)).all();
        assert_eq!(s.len(), 7);
        assert_eq!(s[3], (1, vec![0, 1, 2, 3]));
    }
}
