//! What the load saw: decisions by tier and outcome, latencies, and what was
//! admitted in each one-second window.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::Serialize;
use tierlimit::Tier;

/// The tiers in the order the views show them; anything a later version adds
/// is counted as `other`.
pub(crate) const TIERS: [&str; 6] = [
    "redis",
    "local",
    "deny_cache",
    "fail_open",
    "fail_closed",
    "other",
];

pub(crate) fn tier_index(tier: Tier) -> usize {
    match tier {
        Tier::Redis => 0,
        Tier::Local => 1,
        Tier::DenyCache => 2,
        Tier::FailOpen => 3,
        Tier::FailClosed => 4,
        _ => 5,
    }
}

/// Decisions of one tier.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub(crate) struct Outcomes {
    pub(crate) allowed: u64,
    pub(crate) denied: u64,
}

impl Outcomes {
    pub(crate) fn total(self) -> u64 {
        self.allowed + self.denied
    }
}

/// Decisions by tier.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ByTier(pub(crate) [Outcomes; TIERS.len()]);

impl ByTier {
    pub(crate) fn total(&self) -> u64 {
        self.0.iter().map(|o| o.total()).sum()
    }

    pub(crate) fn tier(&self, name: &str) -> Outcomes {
        TIERS
            .iter()
            .position(|t| *t == name)
            .map_or_else(Outcomes::default, |i| self.0[i])
    }

    pub(crate) fn add(&mut self, other: &ByTier) {
        for (mine, theirs) in self.0.iter_mut().zip(other.0) {
            mine.allowed += theirs.allowed;
            mine.denied += theirs.denied;
        }
    }
}

impl Serialize for ByTier {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(Some(TIERS.len()))?;
        for (name, outcomes) in TIERS.iter().zip(self.0) {
            map.serialize_entry(name, &outcomes)?;
        }
        map.end()
    }
}

/// What the load's workers record, per one-second window (unix seconds of
/// its start); the reporter takes each window once it is over.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    windows: Mutex<BTreeMap<u64, Window>>,
    errors: AtomicU64,
}

/// One window's decisions (by the second their check started in), their
/// latencies, and the units admitted in it (by the window the deciding tier
/// counted them in).
#[derive(Debug, Default)]
pub(crate) struct Window {
    pub(crate) decisions: ByTier,
    pub(crate) latencies: Histogram,
    pub(crate) admitted: u64,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Stats {
    /// One check's outcome: it started in window `started`, and when
    /// admitted, its unit counts in window `admitted_in`.
    pub(crate) fn record(
        &self,
        started: u64,
        tier: Tier,
        allowed: bool,
        latency: Duration,
        admitted_in: Option<u64>,
    ) {
        let mut windows = lock(&self.windows);
        let w = windows.entry(started).or_default();
        let outcomes = &mut w.decisions.0[tier_index(tier)];
        if allowed {
            outcomes.allowed += 1;
        } else {
            outcomes.denied += 1;
        }
        w.latencies.record(latency);
        if let Some(a) = admitted_in {
            windows.entry(a).or_default().admitted += 1;
        }
    }

    /// A check that returned an error (bad input: never expected here).
    pub(crate) fn error(&self) {
        self.errors.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }

    /// Takes window `window` (and forgets any older one left behind).
    pub(crate) fn take(&self, window: u64) -> Window {
        let mut windows = lock(&self.windows);
        let taken = windows.remove(&window).unwrap_or_default();
        windows.retain(|w, _| *w > window);
        taken
    }
}

/// A latency histogram in microseconds: exact below 64 µs, then 64 buckets
/// per power of two (at most 1/64 = 1.6 % above the true value). It grows
/// only to the largest latency seen, so hours of checks cost a few
/// kilobytes, however many there were.
#[derive(Debug, Clone, Default)]
pub(crate) struct Histogram {
    counts: Vec<u64>,
    max: u64,
}

const SUB: u32 = 6;
const SUB_BUCKETS: u64 = 1 << SUB;

impl Histogram {
    pub(crate) fn new() -> Histogram {
        Histogram::default()
    }

    fn index(us: u64) -> usize {
        if us < SUB_BUCKETS {
            return us as usize;
        }
        let exp = 63 - us.leading_zeros();
        let mantissa = (us >> (exp - SUB)) & (SUB_BUCKETS - 1);
        ((exp - SUB + 1) as u64 * SUB_BUCKETS + mantissa) as usize
    }

    /// The largest value in bucket `i`.
    fn upper(i: usize) -> u64 {
        let i = i as u64;
        if i < SUB_BUCKETS {
            return i;
        }
        let exp = i / SUB_BUCKETS + u64::from(SUB) - 1;
        let mantissa = i % SUB_BUCKETS;
        let low = (SUB_BUCKETS + mantissa) << (exp - u64::from(SUB));
        low + (1 << (exp - u64::from(SUB))) - 1
    }

    pub(crate) fn record(&mut self, d: Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        let i = Self::index(us);
        if self.counts.len() <= i {
            self.counts.resize(i + 1, 0);
        }
        self.counts[i] += 1;
        self.max = self.max.max(us);
    }

    pub(crate) fn merge(&mut self, other: &Histogram) {
        if self.counts.len() < other.counts.len() {
            self.counts.resize(other.counts.len(), 0);
        }
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.max = self.max.max(other.max);
    }

    pub(crate) fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// The largest latency recorded, exactly; `None` when none was.
    pub(crate) fn max(&self) -> Option<u64> {
        (self.count() > 0).then_some(self.max)
    }

    /// The `p` quantile's bucket upper bound (never above the maximum seen),
    /// nearest rank; `None` when nothing was recorded.
    pub(crate) fn quantile(&self, p: f64) -> Option<u64> {
        let n = self.count();
        if n == 0 {
            return None;
        }
        let rank = ((p * n as f64).ceil() as u64).clamp(1, n);
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Some(Self::upper(i).min(self.max));
            }
        }
        Some(self.max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_quantiles_are_within_a_bucket() {
        let mut h = Histogram::new();
        for us in 1..=10_000u64 {
            h.record(Duration::from_micros(us));
        }
        let p50 = h.quantile(0.5).expect("samples");
        assert!((5_000..=5_000 + 5_000 / 64 + 1).contains(&p50), "{p50}");
        let p99 = h.quantile(0.99).expect("samples");
        assert!((9_900..=9_900 + 9_900 / 64 + 1).contains(&p99), "{p99}");
        assert_eq!(h.quantile(1.0), Some(10_000));
        assert_eq!(h.max(), Some(10_000));
        assert_eq!(
            (Histogram::new().quantile(0.5), Histogram::new().max()),
            (None, None)
        );
        // Every value lands in a bucket whose upper bound is not below it.
        for us in [0u64, 63, 64, 65, 127, 128, 1_000_003, u64::from(u32::MAX)] {
            let i = Histogram::index(us);
            assert!(Histogram::upper(i) >= us, "{us}");
            assert!(i == 0 || Histogram::upper(i - 1) < us, "{us}");
        }
    }

    /// The demo records every check of a run: its memory is the range of
    /// the latencies, not their number (it kept every latency, 4 bytes a
    /// check, until stop 49: about 1.4 GB for an hour at 100,000 a second).
    #[test]
    fn a_histogram_does_not_grow_with_its_checks() {
        let mut h = Histogram::new();
        h.record(Duration::from_millis(50));
        let buckets = h.counts.len();
        for i in 0..1_000_000u64 {
            h.record(Duration::from_micros(i % 50_000));
        }
        assert_eq!(
            h.counts.len(),
            buckets,
            "no bucket beyond the largest latency"
        );
        assert!(
            buckets < 1_000,
            "{buckets} buckets for latencies up to 50 ms"
        );
        assert_eq!(h.count(), 1_000_001);
        // Merged histograms of different ranges count both.
        let mut short = Histogram::new();
        short.record(Duration::from_micros(3));
        short.merge(&h);
        assert_eq!((short.count(), short.max()), (1_000_002, Some(50_000)));
        assert_eq!(short.quantile(0.0), Some(0));
    }

    #[test]
    fn a_window_is_taken_once_with_what_it_admitted() {
        let stats = Stats::default();
        stats.record(7, Tier::Redis, true, Duration::from_micros(300), Some(7));
        // Started at the end of 7, admitted by Redis in 8.
        stats.record(7, Tier::Redis, true, Duration::from_micros(900), Some(8));
        stats.record(7, Tier::Local, false, Duration::from_micros(20), None);
        let w = stats.take(7);
        assert_eq!(w.decisions.tier("redis").allowed, 2);
        assert_eq!(w.decisions.tier("local").denied, 1);
        assert_eq!(w.latencies.count(), 3);
        assert_eq!(w.latencies.max(), Some(900));
        assert_eq!(w.admitted, 1);
        assert_eq!(stats.take(7).decisions.total(), 0, "taken once");
        let next = stats.take(8);
        assert_eq!((next.admitted, next.decisions.total()), (1, 0));
    }
}
