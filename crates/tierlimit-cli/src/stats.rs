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
    pub(crate) latencies_us: Vec<u32>,
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
        let us = u32::try_from(latency.as_micros()).unwrap_or(u32::MAX);
        let mut windows = lock(&self.windows);
        let w = windows.entry(started).or_default();
        let outcomes = &mut w.decisions.0[tier_index(tier)];
        if allowed {
            outcomes.allowed += 1;
        } else {
            outcomes.denied += 1;
        }
        w.latencies_us.push(us);
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

/// The `p` quantile (0 to 1) of sorted samples, nearest rank.
pub(crate) fn quantile(sorted: &[u32], p: f64) -> Option<u32> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_by_nearest_rank() {
        let samples: Vec<u32> = (1..=100).collect();
        assert_eq!(quantile(&samples, 0.5), Some(50));
        assert_eq!(quantile(&samples, 0.99), Some(99));
        assert_eq!(quantile(&samples, 1.0), Some(100));
        assert_eq!(quantile(&samples, 0.0), Some(1));
        assert_eq!(quantile(&[], 0.5), None);
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
        assert_eq!(w.latencies_us.len(), 3);
        assert_eq!(w.admitted, 1);
        assert_eq!(stats.take(7).decisions.total(), 0, "taken once");
        let next = stats.take(8);
        assert_eq!((next.admitted, next.decisions.total()), (1, 0));
    }
}
