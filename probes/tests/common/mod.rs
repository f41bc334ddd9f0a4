//! Helpers shared by the probes crate's integration tests.
// Each test crate uses its own subset.
#![allow(dead_code)]

use std::time::{Duration, Instant};

/// Spins until `f` holds; fails the test naming `what` if it does not within 30 s (a hang
/// guard, not a timing assertion).
pub fn until(what: &str, f: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::yield_now();
    }
}
