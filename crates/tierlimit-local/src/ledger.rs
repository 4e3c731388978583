//! The outage ledger: what the local tier admitted while Redis could not be asked.

use std::sync::atomic::{AtomicU64, Ordering};

use tierlimit_core::{LedgerEntry, Rule, window_index};

use crate::bounded::BoundedMap;

#[derive(Debug, Clone)]
struct Units {
    rule: Rule,
    units: u64,
    first_us: u64,
    last_us: u64,
}

/// Per Redis key (and per window, for the window algorithms), the units admitted
/// locally while the breaker was not Closed, waiting to be written back.
///
/// Bounded: once `max_entries` entries exist, units for a new entry are counted
/// in [`overflow_units`](Ledger::overflow_units) (and the metric
/// `tierlimit_ledger_dropped_units_total{reason="overflow"}`), never silently
/// dropped. Units for an existing entry always add up.
///
/// An entry leaves the ledger only when [`ack`](Ledger::ack) says Redis applied
/// it, or when [`drop_expired`](Ledger::drop_expired) finds its window passed.
#[derive(Debug)]
pub struct Ledger {
    entries: BoundedMap<(String, u64), Units>,
    /// Units held over all entries, kept as they change so reading it is free.
    units: AtomicU64,
    overflow_units: AtomicU64,
    expired_units: AtomicU64,
}

impl Ledger {
    /// An empty ledger holding at most `max_entries` entries.
    pub fn new(max_entries: usize) -> Self {
        Ledger {
            entries: BoundedMap::new(max_entries),
            units: AtomicU64::new(0),
            overflow_units: AtomicU64::new(0),
            expired_units: AtomicU64::new(0),
        }
    }

    /// Records `units` admitted locally for `storage_key` under `rule` at `now_us`.
    pub fn record(&self, storage_key: String, rule: &Rule, units: u64, now_us: u64) {
        let window = window_index(rule, now_us);
        let entry = self
            .entries
            .get_or_try_insert((storage_key, window), |_| Units {
                rule: rule.clone(),
                units: 0,
                first_us: now_us,
                last_us: now_us,
            });
        match entry {
            Some(mut e) => {
                e.units += units;
                self.units.fetch_add(units, Ordering::Relaxed);
                e.first_us = e.first_us.min(now_us);
                e.last_us = e.last_us.max(now_us);
            }
            None => {
                self.overflow_units.fetch_add(units, Ordering::Relaxed);
                metrics::counter!("tierlimit_ledger_dropped_units_total", "reason" => "overflow")
                    .increment(units);
            }
        }
    }

    /// Copies up to `n` entries, leaving them in the ledger until acknowledged.
    pub fn batch(&self, n: usize) -> Vec<LedgerEntry> {
        self.entries
            .snapshot(n)
            .into_iter()
            .map(|((key, _), u)| LedgerEntry::new(key, u.rule, u.units, u.first_us, u.last_us))
            .collect()
    }

    /// Removes what `entry` holds (Redis acknowledged it). Units recorded for the
    /// same key after the batch was taken stay in the ledger.
    pub fn ack(&self, entry: &LedgerEntry) {
        let key = (entry.storage_key.clone(), entry.window_index());
        let empty = match self.entries.get_mut(&key) {
            Some(mut u) => {
                let taken = u.units.min(entry.units);
                u.units -= taken;
                self.units.fetch_sub(taken, Ordering::Relaxed);
                u.units == 0
            }
            None => false,
        };
        if empty {
            self.entries.remove_if(&key, |u| u.units == 0);
        }
    }

    /// Drops the entries that can no longer change any decision at `now_us` and
    /// returns how many units they held (also counted in
    /// [`expired_units`](Ledger::expired_units) and the metric
    /// `tierlimit_ledger_dropped_units_total{reason="expired"}`).
    pub fn drop_expired(&self, now_us: u64) -> u64 {
        let mut dropped = 0;
        self.entries.retain(|(key, _), u| {
            let e = LedgerEntry::new(key.clone(), u.rule.clone(), u.units, u.first_us, u.last_us);
            let live = e.expires_at_us() > now_us;
            if !live {
                dropped += u.units;
            }
            live
        });
        if dropped > 0 {
            self.units.fetch_sub(dropped, Ordering::Relaxed);
            self.expired_units.fetch_add(dropped, Ordering::Relaxed);
            metrics::counter!("tierlimit_ledger_dropped_units_total", "reason" => "expired")
                .increment(dropped);
        }
        dropped
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when nothing is owed to Redis.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Units held, over all entries.
    pub fn units(&self) -> u64 {
        self.units.load(Ordering::Relaxed)
    }

    /// Units refused because the ledger was full.
    pub fn overflow_units(&self) -> u64 {
        self.overflow_units.load(Ordering::Relaxed)
    }

    /// Units dropped because their window passed before they were written back.
    pub fn expired_units(&self) -> u64 {
        self.expired_units.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000;

    #[test]
    fn units_add_up_per_key_and_ack_removes_only_what_was_sent() {
        let ledger = Ledger::new(10);
        let rule = Rule::per_hour(100).expect("valid");
        ledger.record("k".into(), &rule, 2, 100 * S);
        ledger.record("k".into(), &rule, 3, 101 * S);
        let batch = ledger.batch(10);
        assert_eq!(batch.len(), 1);
        assert_eq!(batch[0].units, 5);
        assert_eq!((batch[0].first_us, batch[0].last_us), (100 * S, 101 * S));
        ledger.record("k".into(), &rule, 1, 102 * S);
        ledger.ack(&batch[0]);
        assert_eq!(ledger.units(), 1);
        ledger.ack(&ledger.batch(10)[0]);
        assert!(ledger.is_empty());
    }

    #[test]
    fn overflow_is_counted_not_lost() {
        let ledger = Ledger::new(2);
        let rule = Rule::per_hour(100).expect("valid");
        for (i, key) in ["a", "b", "c", "d"].into_iter().enumerate() {
            ledger.record(key.into(), &rule, 1 + i as u64, S);
        }
        assert_eq!(ledger.len(), 2);
        assert_eq!(ledger.units() + ledger.overflow_units(), 1 + 2 + 3 + 4);
    }

    #[test]
    fn expired_entries_are_dropped_and_counted_daily_ones_survive_minutes() {
        let ledger = Ledger::new(10);
        let minute = Rule::per_minute(10).expect("valid");
        let day = Rule::per_day(1000).expect("valid");
        ledger.record("m".into(), &minute, 4, 1_000 * S);
        ledger.record("d".into(), &day, 7, 1_000 * S);
        assert_eq!(ledger.drop_expired(1_000 * S + 10 * 60 * S), 4);
        assert_eq!(ledger.expired_units(), 4);
        assert_eq!(ledger.units(), 7);
    }
}
