//! Injected time.

use std::fmt;
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of time: monotonic for the breaker and the local tier, wall-clock for
/// the scripts' client-time mode and the outage ledger.
///
/// [`SystemClock`] is the real one; [`FakeClock`] moves only when told, so state
/// machines are tested without sleeping.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// Monotonic time since an arbitrary origin fixed for the process.
    fn now(&self) -> Duration;
    /// Wall-clock time in microseconds since the Unix epoch.
    fn unix_micros(&self) -> u64;
}

/// The real clock: the wall clock from the system, monotonic time from the
/// CPU's time-stamp counter where it is stable (through `quanta`, which falls
/// back to the system's monotonic clock otherwise): a check reads monotonic
/// time on its hot path, and the counter costs a third of a system call here.
///
/// # Examples
///
/// ```
/// use tierlimit_core::{Clock, SystemClock};
///
/// let a = SystemClock.now();
/// assert!(SystemClock.now() >= a);
/// assert!(SystemClock.unix_micros() > 1_600_000_000_000_000);
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Duration {
        // A clock of our own: `quanta::Instant::now` goes through quanta's
        // global clock and its per-thread override, twice the cost here.
        static CLOCK: OnceLock<(quanta::Clock, quanta::Instant)> = OnceLock::new();
        let (clock, origin) = CLOCK.get_or_init(|| {
            let clock = quanta::Clock::new();
            let origin = clock.now();
            (clock, origin)
        });
        clock.now().duration_since(*origin)
    }

    fn unix_micros(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
            .unwrap_or(0)
    }
}

/// A clock that moves only when [`advance`](FakeClock::advance)d. Clones share
/// the same time.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tierlimit_core::{Clock, FakeClock};
///
/// let clock = FakeClock::new(1_700_000_000_000_000);
/// let t0 = clock.now();
/// clock.advance(Duration::from_millis(5));
/// assert_eq!(clock.now() - t0, Duration::from_millis(5));
/// assert_eq!(clock.unix_micros(), 1_700_000_000_005_000);
/// ```
#[derive(Debug, Clone)]
pub struct FakeClock {
    nanos: Arc<AtomicU64>,
    unix_base_us: u64,
}

impl FakeClock {
    /// A fake clock whose wall clock starts at `unix_micros`.
    pub fn new(unix_micros: u64) -> Self {
        FakeClock {
            nanos: Arc::new(AtomicU64::new(0)),
            unix_base_us: unix_micros,
        }
    }

    /// Moves time forward.
    pub fn advance(&self, by: Duration) {
        let by = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        // Saturating: a wrapped add would run the monotonic clock backwards.
        let _ = self
            .nanos
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                Some(n.saturating_add(by))
            });
    }
}

impl Default for FakeClock {
    fn default() -> Self {
        FakeClock::new(1_700_000_000_000_000)
    }
}

impl Clock for FakeClock {
    fn now(&self) -> Duration {
        Duration::from_nanos(self.nanos.load(Ordering::SeqCst))
    }

    fn unix_micros(&self) -> u64 {
        self.unix_base_us
            .saturating_add(self.nanos.load(Ordering::SeqCst) / 1_000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake clock stops at its end instead of wrapping: time never runs back.
    #[test]
    fn a_fake_clock_advanced_past_its_end_stays_there() {
        let clock = FakeClock::new(u64::MAX - 1);
        clock.advance(Duration::MAX);
        let end = clock.now();
        clock.advance(Duration::MAX);
        assert!(clock.now() >= end);
        assert_eq!(clock.unix_micros(), u64::MAX);
    }
}
