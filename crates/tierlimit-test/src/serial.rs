//! One test at a time inside a test binary, for tests that measure latency.
//!
//! `cargo test` runs the tests of one binary on parallel threads (nextest's
//! test groups do not apply there), so a latency bound would measure its
//! neighbours' load: a 100,000-key spray or a drain beside it. Every test of a
//! binary that asserts latency takes this lock first. Under nextest each test
//! is a process of its own and the lock is free.

use tokio::sync::{Mutex, MutexGuard};

static LOCK: Mutex<()> = Mutex::const_new(());

/// Waits until no other test of this binary holds the lock; hold the guard for
/// the whole test.
pub async fn serial() -> MutexGuard<'static, ()> {
    LOCK.lock().await
}

/// [`serial`] for tests that run outside a Tokio runtime.
pub fn serial_blocking() -> MutexGuard<'static, ()> {
    LOCK.blocking_lock()
}
