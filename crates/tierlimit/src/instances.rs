//! How many instances share the global limit, as this instance believes.
//!
//! The heartbeat set in Redis says how many instances beat within the TTL, but
//! right after Redis comes back empty (a restart, a crash loop, an OOM kill) the
//! set holds only the instances that beat first: 1, then 2, for a second or so.
//! An instance that believed that would widen its local share to the whole
//! limit or half of it if Redis failed again in that second. Instances cannot
//! really leave faster than the heartbeat TTL, so the count used is never
//! below the largest count heard within the last TTL.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Not learned yet: the heartbeat has not answered since the limiter started.
const UNKNOWN: u64 = 0;

/// The instance count local shares are sized for.
#[derive(Debug)]
pub(crate) struct InstanceCount {
    /// The count in force; [`UNKNOWN`] until learned (when not fixed).
    current: AtomicU64,
    /// Counts heard within the TTL, oldest first: (monotonic clock µs, count).
    heard: Mutex<VecDeque<(u64, u64)>>,
    ttl_us: u64,
}

impl InstanceCount {
    /// A count that is known from the start and never changes by heartbeat.
    pub(crate) fn fixed(n: u64) -> Self {
        Self::with(n, Duration::ZERO)
    }

    /// A count learned from heartbeats, `assumed` until the first one answers
    /// (`None`: unknown).
    pub(crate) fn learned(assumed: Option<u64>, ttl: Duration) -> Self {
        Self::with(assumed.unwrap_or(UNKNOWN), ttl)
    }

    fn with(n: u64, ttl: Duration) -> Self {
        InstanceCount {
            current: AtomicU64::new(n),
            heard: Mutex::new(VecDeque::new()),
            ttl_us: u64::try_from(ttl.as_micros()).unwrap_or(u64::MAX),
        }
    }

    /// The count local shares are sized for, or `None` while it has never been
    /// learned (nor assumed).
    #[inline]
    pub(crate) fn get(&self) -> Option<u64> {
        match self.current.load(Ordering::Relaxed) {
            UNKNOWN => None,
            n => Some(n),
        }
    }

    /// A heartbeat answered `count` live instances at `now_us`: the count in
    /// force becomes the largest heard within the TTL (this one included).
    /// Returns it.
    pub(crate) fn heard(&self, count: u64, now_us: u64) -> u64 {
        let count = count.max(1);
        let mut heard = match self.heard.lock() {
            Ok(h) => h,
            Err(poisoned) => poisoned.into_inner(),
        };
        let horizon = now_us.saturating_sub(self.ttl_us);
        while heard.front().is_some_and(|&(at, _)| at < horizon) {
            heard.pop_front();
        }
        // Keep only what could still be the maximum: a later, larger count makes
        // an earlier, smaller one irrelevant. The deque stays decreasing in count.
        while heard.back().is_some_and(|&(_, n)| n <= count) {
            heard.pop_back();
        }
        heard.push_back((now_us, count));
        let max = heard.front().map_or(count, |&(_, n)| n);
        self.current.store(max, Ordering::Relaxed);
        max
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000;

    // Regression: after Redis restarted empty, the heartbeat answered 1, then 2,
    // and the instance used those as its count, so a second outage in that
    // second gave it the whole limit or half of it as its local share.
    #[test]
    fn the_count_never_falls_faster_than_the_ttl() {
        let count = InstanceCount::learned(None, Duration::from_secs(30));
        assert_eq!(count.get(), None, "unknown until learned");
        assert_eq!(count.heard(3, 0), 3);
        // Redis came back empty: the first beats see 1, then 2.
        assert_eq!(count.heard(1, S), 3);
        assert_eq!(count.heard(2, 2 * S), 3);
        assert_eq!(count.get(), Some(3));
        // Only once the 3 is older than the TTL does the count fall, and then
        // only to the largest count heard since.
        assert_eq!(count.heard(2, 30 * S), 3, "3 was heard exactly a TTL ago");
        assert_eq!(count.heard(1, 31 * S), 2);
        // The 2 was heard at 30 s: it holds until 60 s.
        assert_eq!(count.heard(1, 60 * S), 2);
        assert_eq!(count.heard(1, 61 * S), 1);
    }

    #[test]
    fn a_larger_count_is_used_at_once() {
        let count = InstanceCount::learned(Some(2), Duration::from_secs(30));
        assert_eq!(count.get(), Some(2), "assumed until learned");
        assert_eq!(count.heard(5, 10), 5);
        assert_eq!(count.heard(0, 20), 5, "zero is read as this instance alone");
    }

    #[test]
    fn the_history_stays_small() {
        let count = InstanceCount::learned(None, Duration::from_secs(30));
        for i in 0..10_000u64 {
            count.heard(i % 7 + 1, i * 1_000);
        }
        let heard = count.heard.lock().map(|h| h.len()).unwrap_or(usize::MAX);
        assert!(
            heard <= 7,
            "a decreasing deque holds one entry per distinct count at most: {heard}"
        );
    }
}
