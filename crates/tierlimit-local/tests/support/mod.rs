//! What the memory tests share: each runs alone in its own binary, so the
//! process's resident memory is its own.

use std::sync::Arc;

use tierlimit_core::SystemClock;
use tierlimit_local::{LocalConfig, LocalTier};

/// A local tier on the system clock whose maps may take `max_bytes`.
pub(crate) fn bounded_tier(max_bytes: usize) -> LocalTier {
    LocalTier::new(
        LocalConfig {
            max_bytes,
            ..LocalConfig::default()
        },
        Arc::new(SystemClock),
    )
    .expect("valid config")
}

/// Resident memory of this process, from `/proc/self/statm` (Linux).
pub(crate) fn resident_bytes() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("/proc/self/statm (Linux)");
    let pages: usize = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("resident pages");
    pages * 4096
}

/// Asserts what the local tier took stayed within `budget`: no more charged,
/// the bound refused some keys (`refused`), and the process grew by at most
/// twice the budget (the maps' own allocations, with the allocator's and
/// DashMap's spare room).
pub(crate) fn assert_within(budget: usize, charged: usize, refused: u64, grown: usize) {
    assert!(charged <= budget, "{charged} bytes charged");
    assert!(
        refused > 0,
        "the byte bound never refused a key: the test proves nothing"
    );
    assert!(
        grown <= 2 * budget,
        "resident memory grew {grown} bytes for a budget of {budget}"
    );
}
