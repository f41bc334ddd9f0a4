//! The ranges pipeprof accepts for a run's numbers, in one place: `cnn.toml` and the command
//! line (`config`, the commands) and the settings a program or a file sends (`aggregate`) check
//! against the same limits, with the same message.

/// Largest batch: 65,536 images (a 224×224 RGB batch of that size is already 39 GB).
pub const MAX_BATCH_SIZE: usize = 1 << 16;
/// Most loader workers: far past the cores of any one machine.
pub const MAX_WORKERS: usize = 1024;
/// Deepest prefetch queue, in batches (and PyTorch's `prefetch_factor`).
pub const MAX_PREFETCH: usize = 4096;
/// Most epochs.
pub const MAX_EPOCHS: usize = 1_000_000;
/// Most images per class `demo-data` writes: past a million it writes for hours.
pub const MAX_PER_CLASS: usize = 1_000_000;

/// `v` in `lo..=hi`, or a message naming `what` and the range.
pub fn in_range(what: &str, v: usize, lo: usize, hi: usize) -> Result<(), String> {
    if (lo..=hi).contains(&v) {
        Ok(())
    } else {
        Err(format!("{what} must be between {lo} and {hi}, got {v}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_out_of_range_is_named_with_the_range() {
        assert_eq!(in_range("--workers", 4, 1, MAX_WORKERS), Ok(()));
        assert_eq!(in_range("--workers", 1, 1, MAX_WORKERS), Ok(()));
        assert_eq!(in_range("--workers", MAX_WORKERS, 1, MAX_WORKERS), Ok(()));
        assert_eq!(
            in_range("--workers", 0, 1, MAX_WORKERS),
            Err("--workers must be between 1 and 1024, got 0".to_string())
        );
        assert_eq!(
            in_range("settings.prefetch", MAX_PREFETCH + 1, 0, MAX_PREFETCH),
            Err("settings.prefetch must be between 0 and 4096, got 4097".to_string())
        );
    }
}
