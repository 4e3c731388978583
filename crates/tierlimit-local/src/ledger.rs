//! The outage ledger: what the local tier admitted while Redis could not be asked.

use std::sync::atomic::{AtomicU64, Ordering};

use tierlimit_core::{LedgerEntry, Rule, RuleSet, owed_after_us, owed_since_us, window_index};

use crate::bounded::{BoundedMap, ValueBytes};

#[derive(Debug, Clone)]
struct Units {
    rule: Rule,
    /// The stripes the key is spread over (1: not striped), as last recorded.
    stripes: u32,
    /// Everything owed, the units being sent included.
    units: u64,
    first_us: u64,
    last_us: u64,
    /// The write-back under way, if any: sent (or about to be) under `id`.
    sending: Option<Sending>,
    /// [`Ledger::claim`] passes the entry by until then (µs, on the clock
    /// `claim` and `hold` are given): its write-back failed, see
    /// [`Ledger::hold`].
    held_until_us: u64,
    /// The wall clock the latest units' times are on, as its offset from
    /// the monotonic clock (wrapping).
    frame_us: u64,
}

impl ValueBytes for Units {}

#[derive(Debug, Clone, Copy)]
struct Sending {
    id: u64,
    units: u64,
    first_us: u64,
    last_us: u64,
    /// The stripes the units were spread over: the reconcile script marks
    /// each stripe with the id, so a re-send must spread them the same way
    /// (over more stripes, the new ones would apply their shares again).
    stripes: u32,
    /// The wall clock `first_us` and `last_us` are on (see `Units::frame_us`).
    frame_us: u64,
}

/// One entry's units on their way to Redis, under an id that makes sending
/// them twice harmless: the reconcile script remembers, per key, the ids it
/// applied. A claim that failed (its outcome unknown) is claimed again with
/// the same id, by whoever gets to it first: the drain, or the next check of
/// the key.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Claim {
    /// The write-back's id (also the reconcile script's marker).
    pub id: String,
    /// What is written back.
    pub entry: LedgerEntry,
    raw_id: u64,
    window: u64,
    /// True when these units had been claimed before under the same id.
    pub resent: bool,
}

/// Per Redis key (and per window, for the window algorithms), the units admitted
/// locally while the breaker was not Closed, waiting to be written back.
///
/// Bounded: once `max_entries` entries exist (or their keys take `max_bytes`),
/// units for a new entry are counted
/// in [`overflow_units`](Ledger::overflow_units) (and the metric
/// `tierlimit_ledger_dropped_units_total{reason="overflow"}`), never silently
/// dropped. Units for an existing entry always add up (saturating at
/// `u64::MAX`, counted as overflow beyond it).
///
/// Units leave the ledger only when [`ack`](Ledger::ack) says Redis applied
/// their [`Claim`], when [`drop_expired`](Ledger::drop_expired) finds their
/// window passed, or when [`park`](Ledger::park) sets aside an entry Redis
/// refuses on its own.
#[derive(Debug)]
pub struct Ledger {
    entries: BoundedMap<(String, u64), Units>,
    /// Units held over all entries, kept as they change so reading it is
    /// free. Each entry saturates at `u64::MAX`, and their sum can pass it.
    units: Total,
    overflow_units: Total,
    expired_units: Total,
    parked_units: Total,
    /// Wall clock minus monotonic clock (µs, wrapping) as the local tier
    /// last measured it: the frame of the `now` given to
    /// [`drop_expired`](Ledger::drop_expired), and of times recorded without
    /// one of their own.
    frame_us: AtomicU64,
}

/// Wall-clock time `us`, read in frame `from` (the wall clock's offset from
/// the monotonic clock then, wrapping), as the wall clock of frame `to` reads
/// the same instant: a clock stepped between the two moves it by the step.
pub(crate) fn reframe(us: u64, from: u64, to: u64) -> u64 {
    us.saturating_add_signed(to.wrapping_sub(from) as i64)
}

/// A count of units that may pass `u64::MAX` (8,192 entries of 2^51 units,
/// the largest cost, do), read as `u64::MAX` then: 128 bits, as two words.
/// Each add or subtraction that carries past the low word moves the high
/// one by its own exact result, so the count is exact once no update is in
/// flight; a read during one may see the low word moved and the high not.
/// (A plain `u64` wrapped: past 2^64 units owed, the ledger read 0 owed, and
/// a limiter dropped with them owed gave no warning.)
#[derive(Debug, Default)]
struct Total {
    low: AtomicU64,
    high: AtomicU64,
}

impl Total {
    fn add(&self, n: u64) {
        let before = self.low.fetch_add(n, Ordering::Relaxed);
        if before.checked_add(n).is_none() {
            self.high.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn sub(&self, n: u64) {
        let before = self.low.fetch_sub(n, Ordering::Relaxed);
        if before < n {
            self.high.fetch_sub(1, Ordering::Relaxed);
        }
    }

    fn get(&self) -> u64 {
        match self.high.load(Ordering::Relaxed) {
            0 => self.low.load(Ordering::Relaxed),
            _ => u64::MAX,
        }
    }
}

impl Ledger {
    /// An empty ledger holding at most `max_entries` entries and `max_bytes`
    /// (each entry charged its key's bytes and its slot).
    pub fn new(max_entries: usize, max_bytes: usize) -> Self {
        Ledger {
            entries: BoundedMap::new(max_entries, max_bytes),
            units: Total::default(),
            overflow_units: Total::default(),
            expired_units: Total::default(),
            parked_units: Total::default(),
            frame_us: AtomicU64::new(0),
        }
    }

    /// The local tier measured the wall clock at `offset_us` (wrapping) from
    /// its monotonic clock: times recorded from now on are in that frame.
    pub(crate) fn set_frame(&self, offset_us: u64) {
        self.frame_us.store(offset_us, Ordering::Relaxed);
    }

    /// Records `units` admitted locally for `storage_key` under `rule` at `now_us`.
    pub fn record(&self, storage_key: String, rule: &Rule, units: u64, now_us: u64) {
        self.record_span(storage_key, rule, 1, units, now_us, now_us);
    }

    /// Records `units` admitted locally for `storage_key` under `rule` between
    /// `first_us` and `last_us` (one window: the window is `last_us`'s).
    ///
    /// A storage key names its rule's algorithm, period and UTC offset, not
    /// its limit or burst: when those changed since the entry was made, the
    /// entry is written back under the latest `rule` recorded.
    ///
    /// `stripes` is the number of stripes the key is spread over (1: not
    /// striped; see `RuleSet::with_stripes`), `storage_key` then stripe 0's:
    /// the write-back spreads the units over the stripes. The latest recorded
    /// counts, as for the rule.
    pub fn record_span(
        &self,
        storage_key: String,
        rule: &Rule,
        stripes: u32,
        units: u64,
        first_us: u64,
        last_us: u64,
    ) {
        let frame_us = self.frame_us.load(Ordering::Relaxed);
        self.record_in_frame(
            frame_us,
            storage_key,
            rule,
            stripes,
            units,
            (first_us, last_us),
        );
    }

    /// As [`record_span`](Self::record_span), with the span's times on the
    /// wall clock whose offset from the monotonic clock was `frame_us`
    /// (wrapping): see [`drop_expired`](Self::drop_expired).
    pub(crate) fn record_in_frame(
        &self,
        frame_us: u64,
        storage_key: String,
        rule: &Rule,
        stripes: u32,
        units: u64,
        (first_us, last_us): (u64, u64),
    ) {
        let window = window_index(rule, last_us);
        let entry = self
            .entries
            .get_or_try_insert((storage_key, window), |_| Units {
                rule: rule.clone(),
                stripes,
                units: 0,
                first_us,
                last_us,
                sending: None,
                held_until_us: 0,
                frame_us,
            });
        let overflow = match entry {
            Some(mut e) => {
                if e.rule != *rule {
                    e.rule = rule.clone();
                }
                // The times so far onto the new units' clock, if it was
                // stepped since: one entry holds one clock's times.
                if e.frame_us != frame_us && e.units > 0 {
                    e.first_us = reframe(e.first_us, e.frame_us, frame_us);
                    e.last_us = reframe(e.last_us, e.frame_us, frame_us);
                }
                e.stripes = stripes;
                let added = units.min(u64::MAX - e.units);
                e.first_us = owed_since_us(rule, e.first_us, e.units, first_us);
                e.units += added;
                self.units.add(added);
                e.last_us = e.last_us.max(last_us);
                e.frame_us = frame_us;
                units - added
            }
            None => units,
        };
        if overflow > 0 {
            self.overflow_units.add(overflow);
            metrics::counter!("tierlimit_ledger_dropped_units_total", "reason" => "overflow")
                .increment(overflow);
        }
    }

    /// Claims up to `n` entries for writing back, passing by those
    /// [held](Self::hold) past `now_us` (on the clock holds are given in; a
    /// monotonic one, so a wall clock stepped back does not lengthen them):
    /// each keeps its claim's id until acknowledged, so one that failed is
    /// sent again under the same id.
    pub fn claim(&self, n: usize, now_us: u64) -> Vec<Claim> {
        self.entries
            .keys_where(n, |u| u.held_until_us <= now_us)
            .into_iter()
            .filter_map(|key| self.claim_one(key))
            .collect()
    }

    /// Holds `claim`'s entry back from [`claim`](Self::claim) until
    /// `until_us`: its write-back failed in a way that may pass (its Cluster
    /// master is down, say), and the entries after it go first meanwhile.
    /// Retried at once and first, a few such entries held every batch, and
    /// what the healthy masters were owed waited behind them. A check of the
    /// entry's key still carries it ([`claim_key`](Self::claim_key)); its
    /// acknowledgement ends the hold.
    pub fn hold(&self, claim: &Claim, until_us: u64) {
        let key = (claim.entry.storage_key.clone(), claim.window);
        if let Some(mut u) = self.entries.get_mut(&key)
            && u.sending.is_some_and(|s| s.id == claim.raw_id)
        {
            u.held_until_us = until_us;
        }
    }

    /// Claims what is owed for `storage_key` under `rule` at `now_us` (the
    /// current window, and for the window algorithms the one before).
    pub fn claim_key(&self, storage_key: &str, rule: &Rule, now_us: u64) -> Vec<Claim> {
        let current = window_index(rule, now_us);
        [Some(current), current.checked_sub(1)]
            .into_iter()
            .flatten()
            .filter_map(|w| self.claim_one((storage_key.to_owned(), w)))
            .collect()
    }

    fn claim_one(&self, key: (String, u64)) -> Option<Claim> {
        let mut u = self.entries.get_mut(&key)?;
        let resent = u.sending.is_some();
        let fresh = Sending {
            id: fastrand::u64(..),
            units: u.units,
            first_us: u.first_us,
            last_us: u.last_us,
            stripes: u.stripes,
            frame_us: u.frame_us,
        };
        let sending = *u.sending.get_or_insert(fresh);
        let rule = u.rule.clone();
        // The times onto the wall clock as last measured: the write-back
        // tells Redis that clock's now, and Redis moves the times by how far
        // it is from its own (lua/reconcile.lua). A clock stepped since they
        // were recorded would otherwise move them by the step too.
        let current = self.frame_us.load(Ordering::Relaxed);
        drop(u);
        let (storage_key, window) = key;
        let moved = |us: u64| reframe(us, sending.frame_us, current);
        Some(Claim {
            id: format!("{:016x}", sending.id),
            entry: LedgerEntry::new(
                storage_key,
                rule,
                sending.units,
                moved(sending.first_us),
                moved(sending.last_us),
            )
            .with_stripes(sending.stripes),
            raw_id: sending.id,
            window,
            resent,
        })
    }

    /// Writes back what the rules of `set` owe under its rules from now on:
    /// every entry of a key of `set` (its storage key's set and rule id) takes
    /// the rule of that id in `set`, and `set`'s stripes. A storage key names
    /// a rule's algorithm, period and UTC offset, not its limit or burst, so
    /// an entry made before a reload changed those went on with the old ones
    /// until its key admitted again; with a raised limit, its window's
    /// write-back stopped at the old limit, and the units other instances had
    /// pushed past it were lost.
    pub fn retarget(&self, set: &RuleSet) {
        self.entries.for_each_mut(|(storage_key, _), u| {
            // What follows the key's hash tag: `:<set>:<rule id>`.
            let Some(suffix) = storage_key.find('}').map(|end| &storage_key[end + 1..]) else {
                return;
            };
            let mut rules = set.rules().iter().enumerate();
            if let Some((_, rule)) = rules.find(|(i, _)| set.storage_key_suffix(*i) == suffix) {
                if u.rule != *rule {
                    u.rule = rule.clone();
                }
                u.stripes = set.stripes();
            }
        });
    }

    /// Redis applied `claim` (now or before): its units leave the ledger. Units
    /// recorded for the key since the claim stay. A stale claim (already
    /// acknowledged, or its entry dropped) changes nothing. Returns the units
    /// removed.
    pub fn ack(&self, claim: &Claim) -> u64 {
        self.settle(claim, |u, sending| sending.units.min(u.units))
    }

    /// Redis refused `claim` on its own (a wrong type under its key, say):
    /// nothing retried will change that, so the whole entry is set aside and
    /// counted in [`parked_units`](Ledger::parked_units) rather than blocking
    /// the drain. Returns the units set aside.
    pub fn park(&self, claim: &Claim) -> u64 {
        let parked = self.settle(claim, |u, _| u.units);
        self.parked_units.add(parked);
        parked
    }

    fn settle(&self, claim: &Claim, take: impl FnOnce(&Units, &Sending) -> u64) -> u64 {
        let key = (claim.entry.storage_key.clone(), claim.window);
        let (taken, empty) = match self.entries.get_mut(&key) {
            Some(mut u) => match u.sending {
                Some(sending) if sending.id == claim.raw_id => {
                    let taken = take(&u, &sending);
                    // What stays is owed from where the units taken end,
                    // which may be after the last unit (the span must hold it).
                    u.first_us = owed_after_us(&u.rule, u.first_us, taken);
                    u.last_us = u.last_us.max(u.first_us);
                    u.units -= taken;
                    u.sending = None;
                    u.held_until_us = 0;
                    (taken, u.units == 0)
                }
                _ => (0, false),
            },
            None => (0, false),
        };
        self.units.sub(taken);
        if empty {
            self.entries
                .remove_if(&key, |u| u.units == 0 && u.sending.is_none());
        }
        taken
    }

    /// Drops the entries that can no longer change any decision at `now_us` and
    /// returns how many units they held (at most `u64::MAX`) (also counted in
    /// [`expired_units`](Ledger::expired_units) and the metric
    /// `tierlimit_ledger_dropped_units_total{reason="expired"}`).
    ///
    /// Each entry is judged on the wall clock its times were recorded on:
    /// `now_us` moved by however far the local tier has since measured the
    /// wall clock step from the monotonic one. A wall clock stepped forward
    /// during an outage (a VM resumed, NTP correcting a slow clock) made
    /// every unit admitted before the step look that much older, and units
    /// Redis still counted were dropped unwritten.
    pub fn drop_expired(&self, now_us: u64) -> u64 {
        let mut dropped = 0;
        let current = self.frame_us.load(Ordering::Relaxed);
        self.entries.retain(|(key, _), u| {
            let e = LedgerEntry::new(key.clone(), u.rule.clone(), u.units, u.first_us, u.last_us);
            let now_then = reframe(now_us, current, u.frame_us);
            let live = e.expires_at_us() > now_then;
            if !live {
                // Counted entry by entry: their sum may pass u64::MAX (the
                // sum panicked there in debug builds).
                self.units.sub(u.units);
                self.expired_units.add(u.units);
                dropped = u.units.saturating_add(dropped);
            }
            live
        });
        if dropped > 0 {
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

    /// Units held, over all entries (at most `u64::MAX`).
    pub fn units(&self) -> u64 {
        self.units.get()
    }

    /// Units refused because the ledger was full.
    pub fn overflow_units(&self) -> u64 {
        self.overflow_units.get()
    }

    /// Units dropped because their window passed before they were written back.
    pub fn expired_units(&self) -> u64 {
        self.expired_units.get()
    }

    /// Bytes charged to the entries held.
    pub fn bytes(&self) -> usize {
        self.entries.bytes()
    }

    /// Units set aside because Redis refused their entry on its own.
    pub fn parked_units(&self) -> u64 {
        self.parked_units.get()
    }

    /// When the oldest unit waiting was admitted (µs since the epoch, this
    /// instance's clock; for a GCRA or token-bucket entry, when its debt
    /// began, later than its first unit when its bucket refilled whole in
    /// between); `None` when nothing waits. Scans every entry: for gauges,
    /// not for checks.
    pub fn oldest_us(&self) -> Option<u64> {
        self.entries.fold(None, |oldest: Option<u64>, _, u| {
            Some(oldest.map_or(u.first_us, |o| o.min(u.first_us)))
        })
    }
}

#[cfg(test)]
mod tests {
    use tierlimit_core::Algorithm;

    use super::*;

    const S: u64 = 1_000_000;

    /// What the entries hold together passes `u64::MAX` and comes back
    /// exactly; read as `u64::MAX` meanwhile, never as the wrapped rest (two
    /// saturated entries and one of 2 units read 0 owed).
    #[test]
    fn the_units_owed_over_all_entries_do_not_wrap() {
        let ledger = Ledger::new(10, 1 << 20);
        let rule = Rule::per_hour(10).expect("valid");
        ledger.record("a".into(), &rule, u64::MAX, 100 * S);
        ledger.record("b".into(), &rule, u64::MAX, 100 * S);
        ledger.record("c".into(), &rule, 2, 100 * S);
        assert_eq!(ledger.units(), u64::MAX);
        let claims = ledger.claim(10, 0);
        let c = claims
            .iter()
            .find(|c| c.entry.units == 2)
            .expect("c's claim");
        ledger.ack(c);
        assert_eq!(ledger.units(), u64::MAX);
        for claim in claims.iter().filter(|c| c.entry.units != 2) {
            ledger.ack(claim);
        }
        assert_eq!((ledger.units(), ledger.len()), (0, 0));
        ledger.record("d".into(), &rule, 5, 100 * S);
        assert_eq!(ledger.units(), 5, "exact again");
        // The cumulative counts too.
        ledger.record("e".into(), &rule, u64::MAX, 100 * S);
        ledger.record("f".into(), &rule, u64::MAX, 100 * S);
        assert_eq!(ledger.drop_expired(200 * 3_600 * S), u64::MAX);
        assert_eq!((ledger.units(), ledger.expired_units()), (0, u64::MAX));
    }

    /// A bucket rule's units are charged back to back from `first_us`: the
    /// entry starts its run where the last full refill left the bucket, and
    /// once part is written back, what stays goes on from where that ends.
    #[test]
    fn a_bucket_rules_entry_owes_from_its_last_refill() {
        let ledger = Ledger::new(10, 1 << 20);
        let gcra = Rule::per_second(10).expect("valid"); // 0.1 s a unit
        // Full at 100 s, refilled whole by 102 s, full again.
        ledger.record("k".into(), &gcra, 10, 100 * S);
        ledger.record("k".into(), &gcra, 10, 102 * S);
        let sent = ledger.claim(10, 0);
        assert_eq!(
            (
                sent[0].entry.units,
                sent[0].entry.first_us,
                sent[0].entry.last_us
            ),
            (20, 101 * S, 102 * S),
            "the second burst owes a whole bucket from 102 s"
        );
        // Not refilled yet: the run goes on.
        ledger.record("k".into(), &gcra, 5, 102 * S + S / 2);
        ledger.ack(&sent[0]);
        let rest = ledger.claim(10, 0);
        assert_eq!(
            (
                rest[0].entry.units,
                rest[0].entry.first_us,
                rest[0].entry.last_us
            ),
            (5, 103 * S, 103 * S),
            "the 5 left owe from where the 20 written back end"
        );
        // A window rule's entry spans its units.
        let window = Rule::per_hour(100)
            .and_then(|r| r.with_algorithm(Algorithm::FixedWindow))
            .expect("valid");
        ledger.record("w".into(), &window, 1, 100 * S);
        ledger.record("w".into(), &window, 1, 3_000 * S);
        let w = ledger.claim_key("w", &window, 3_000 * S);
        assert_eq!(
            (w[0].entry.first_us, w[0].entry.last_us),
            (100 * S, 3_000 * S)
        );
    }

    #[test]
    fn units_add_up_per_key_and_ack_removes_only_what_was_sent() {
        let ledger = Ledger::new(10, 1 << 20);
        let rule = Rule::per_hour(100).expect("valid");
        ledger.record("k".into(), &rule, 2, 100 * S);
        ledger.record("k".into(), &rule, 3, 101 * S);
        let batch = ledger.claim(10, 0);
        assert_eq!(batch.len(), 1);
        assert_eq!(batch[0].entry.units, 5);
        assert_eq!(
            (batch[0].entry.first_us, batch[0].entry.last_us),
            (100 * S, 101 * S)
        );
        ledger.record("k".into(), &rule, 1, 102 * S);
        assert_eq!(ledger.ack(&batch[0]), 5);
        assert_eq!(ledger.ack(&batch[0]), 0, "a claim is acknowledged once");
        assert_eq!(ledger.units(), 1);
        let rest = ledger.claim_key("k", &rule, 103 * S);
        assert_eq!(rest.len(), 1);
        assert_ne!(rest[0].id, batch[0].id, "new units, new id");
        ledger.ack(&rest[0]);
        assert!(ledger.is_empty());
    }

    /// An unacknowledged claim keeps its id: whoever sends it next (the drain
    /// or the key's next check) sends the same write-back, which Redis applies
    /// once.
    #[test]
    fn a_claim_is_resent_under_its_id_until_acknowledged() {
        let ledger = Ledger::new(10, 1 << 20);
        let rule = Rule::per_hour(100).expect("valid");
        ledger.record("k".into(), &rule, 4, S);
        let first = ledger.claim(10, 0);
        ledger.record("k".into(), &rule, 1, 2 * S);
        let again = ledger.claim_key("k", &rule, 3 * S);
        assert_eq!(again.len(), 1);
        assert_eq!((&again[0].id, again[0].entry.units), (&first[0].id, 4));
        assert!(again[0].resent && !first[0].resent);
        assert_eq!(
            ledger.park(&again[0]),
            5,
            "parking sets the whole entry aside"
        );
        assert_eq!((ledger.units(), ledger.parked_units()), (0, 5));
        assert!(ledger.is_empty());
    }

    /// Regression (issue 9, item 22): units added up in a u64 without a check,
    /// so 2,048 FailOpen checks of cost 2^53 wrapped the ledger's count to 0.
    #[test]
    fn units_saturate_instead_of_wrapping() {
        let ledger = Ledger::new(10, 1 << 20);
        let rule = Rule::per_hour(100).expect("valid");
        for _ in 0..2_048 {
            ledger.record("k".into(), &rule, 1 << 53, S);
        }
        assert_eq!(ledger.units(), u64::MAX);
        assert_eq!(
            ledger.units() as u128 + ledger.overflow_units() as u128,
            2_048u128 << 53
        );
    }

    /// A striped key's entry says how many stripes to spread it over: the
    /// latest recorded, like its rule.
    #[test]
    fn claims_carry_the_stripes_last_recorded() {
        let ledger = Ledger::new(10, 1 << 20);
        let rule = Rule::per_hour(100).expect("valid");
        ledger.record_span("k".into(), &rule, 4, 2, S, S);
        ledger.record_span("k".into(), &rule, 8, 1, 2 * S, 2 * S);
        ledger.record("u".into(), &rule, 1, S);
        let mut claims = ledger.claim(10, 0);
        claims.sort_by(|a, b| a.entry.storage_key.cmp(&b.entry.storage_key));
        let got: Vec<(u32, u64)> = claims
            .iter()
            .map(|c| (c.entry.stripes, c.entry.units))
            .collect();
        assert_eq!(got, [(8, 3), (1, 1)]);
        // Restriped while a claim is out: its re-send keeps its stripes (the
        // script marked those with its id), the next claim takes the new.
        ledger.record_span("k".into(), &rule, 16, 1, 3 * S, 3 * S);
        let resent = ledger.claim_key("k", &rule, 3 * S);
        assert_eq!((resent[0].entry.stripes, resent[0].entry.units), (8, 3));
        assert!(resent[0].resent);
        ledger.ack(&resent[0]);
        let next = ledger.claim_key("k", &rule, 3 * S);
        assert_eq!((next[0].entry.stripes, next[0].entry.units), (16, 1));
    }

    #[test]
    fn overflow_is_counted_not_lost() {
        let ledger = Ledger::new(2, 1 << 20);
        let rule = Rule::per_hour(100).expect("valid");
        for (i, key) in ["a", "b", "c", "d"].into_iter().enumerate() {
            ledger.record(key.into(), &rule, 1 + i as u64, S);
        }
        assert_eq!(ledger.len(), 2);
        assert_eq!(ledger.units() + ledger.overflow_units(), 1 + 2 + 3 + 4);
    }

    #[test]
    fn expired_entries_are_dropped_and_counted_daily_ones_survive_minutes() {
        let ledger = Ledger::new(10, 1 << 20);
        let minute = Rule::per_minute(10).expect("valid");
        let day = Rule::per_day(1000).expect("valid");
        ledger.record("m".into(), &minute, 4, 1_000 * S);
        ledger.record("d".into(), &day, 7, 1_000 * S);
        assert_eq!(ledger.drop_expired(1_000 * S + 10 * 60 * S), 4);
        assert_eq!(ledger.expired_units(), 4);
        assert_eq!(ledger.units(), 7);
    }
}
