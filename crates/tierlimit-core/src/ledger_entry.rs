//! Units admitted locally during an outage, owed to Redis.

use crate::{Algorithm, Rule};

/// Units one rule admitted locally for one storage key while Redis could not be
/// asked, with the span of wall-clock time they were admitted in.
///
/// The local tier keeps these in its outage ledger; the reconciler writes them
/// back to Redis once it is healthy, as if the requests had gone there. For the
/// window algorithms an entry never spans two windows (the ledger keeps one
/// entry per window), so it can be added to the counter of the window it fell in.
///
/// # Examples
///
/// ```
/// use tierlimit_core::{LedgerEntry, Rule};
///
/// let rule = Rule::per_minute(10)?;
/// let entry = LedgerEntry::new("tl:{u}:api:g60000000".into(), rule, 3, 1_000_000, 2_000_000);
/// assert_eq!(entry.expires_at_us(), 62_000_000);
/// # Ok::<(), tierlimit_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LedgerEntry {
    /// The Redis key of the rule (`tl:{<key>}:<set>:<rule id>`).
    pub storage_key: String,
    /// The rule, so the reconcile script knows how to apply the units.
    pub rule: Rule,
    /// Units admitted locally.
    pub units: u64,
    /// Wall-clock time of the first unit, µs since the Unix epoch. For GCRA
    /// and the token bucket, when the units' debt begins (see
    /// [`owed_since_us`]): later than the first unit when the bucket
    /// refilled whole between two of them.
    pub first_us: u64,
    /// Wall-clock time of the last unit, µs since the Unix epoch.
    pub last_us: u64,
    /// The number of stripes the key is spread over (1: not striped). A
    /// striped entry is written back over its stripes, each its
    /// [share](crate::stripe_share) of the units under its share of the rule
    /// (see [`RuleSet::with_stripes`](crate::RuleSet::with_stripes));
    /// `storage_key` is then stripe 0's.
    pub stripes: u32,
}

impl LedgerEntry {
    /// A ledger entry.
    pub fn new(storage_key: String, rule: Rule, units: u64, first_us: u64, last_us: u64) -> Self {
        LedgerEntry {
            storage_key,
            rule,
            units,
            first_us,
            last_us,
            stripes: 1,
        }
    }

    /// The same entry for a key spread over `stripes` stripes (see
    /// [`stripes`](Self::stripes)).
    pub fn with_stripes(self, stripes: u32) -> Self {
        LedgerEntry { stripes, ..self }
    }

    /// The wall-clock time (µs) after which these units can no longer change any
    /// decision, so writing them back would only cost Redis work: see
    /// [`units_matter_until_us`].
    pub fn expires_at_us(&self) -> u64 {
        units_matter_until_us(&self.rule, self.last_us)
    }

    /// The index of the window the units fell in (fixed and sliding window
    /// counters; 0 for the other algorithms).
    pub fn window_index(&self) -> u64 {
        window_index(&self.rule, self.last_us)
    }
}

/// The wall-clock time (µs) after which units counted under `rule`, the
/// last of them at `last_us`, can no longer change any decision.
///
/// Fixed window: the end of the window they fell in. Sliding window counter:
/// one period after that window ends (it still weighs as the previous window).
/// GCRA and token bucket: once a full bucket would have refilled after the
/// last unit (capacity × period ÷ limit: with a burst above the limit, more
/// than a period). Sliding log: one period after the last unit.
pub fn units_matter_until_us(rule: &Rule, last_us: u64) -> u64 {
    let period = rule.period_micros();
    match rule.algorithm() {
        Algorithm::FixedWindow => {
            let start = window_start(last_us, period, rule.utc_offset_secs());
            start.saturating_add(period)
        }
        Algorithm::SlidingWindow => {
            let start = window_start(last_us, period, 0);
            start.saturating_add(2 * period)
        }
        Algorithm::Gcra | Algorithm::TokenBucket => {
            let refill = (u128::from(rule.capacity()) * u128::from(period))
                .div_ceil(u128::from(rule.limit().max(1)));
            last_us.saturating_add(u64::try_from(refill).unwrap_or(u64::MAX))
        }
        _ => last_us.saturating_add(period),
    }
}

/// The `first_us` of a [`LedgerEntry`] holding `units` owed since `first_us`
/// and then more from `more_us` on (the first of those, or their own
/// `first_us`), µs since the epoch.
///
/// For GCRA and the token bucket the write-back charges the units back to
/// back from `first_us` at the rule's emission interval (period ÷ limit), so
/// `first_us` is where that run must start to end where the admissions left
/// the bucket: a bucket that refilled whole before `more_us` starts over
/// there, and the earlier units, already refilled, owe nothing. Counted from
/// the very first unit instead, the later units would be charged as if they
/// had been refilling since, and a key used, left to refill, then used
/// again in one outage got the second burst back from Redis. For the other
/// algorithms, the earlier of the two.
///
/// ```
/// use tierlimit_core::{Rule, owed_since_us};
///
/// let rule = Rule::per_second(10)?; // one unit each 0.1 s
/// // 10 units at 0 s, then more at 2 s: the bucket was full again by then.
/// assert_eq!(owed_since_us(&rule, 0, 10, 2_000_000), 1_000_000);
/// // 10 units at 0 s, then more at 0.5 s: it was not.
/// assert_eq!(owed_since_us(&rule, 0, 10, 500_000), 0);
/// # Ok::<(), tierlimit_core::Error>(())
/// ```
pub fn owed_since_us(rule: &Rule, first_us: u64, units: u64, more_us: u64) -> u64 {
    if units == 0 {
        return more_us;
    }
    match rule.algorithm() {
        // Rounded down: the start is then never earlier than exact, which
        // would charge less.
        Algorithm::Gcra | Algorithm::TokenBucket => {
            first_us.max(more_us.saturating_sub(run_us(rule, units, false)))
        }
        _ => first_us.min(more_us),
    }
}

/// Where the run of a GCRA or token-bucket entry owed from `first_us` goes
/// on once its first `units` are counted (written back, or left out as too
/// old to matter): where those end, as [`owed_since_us`] charges them,
/// rounded up, so what stays is charged no less than exact. `first_us` for
/// the other algorithms, whose units keep their span.
pub fn owed_after_us(rule: &Rule, first_us: u64, units: u64) -> u64 {
    match rule.algorithm() {
        Algorithm::Gcra | Algorithm::TokenBucket => {
            first_us.saturating_add(run_us(rule, units, true))
        }
        _ => first_us,
    }
}

/// `units` back to back at the rule's emission interval (period ÷ limit),
/// in µs, rounded `up` or down. Multiplied in u64 when that is exact (a
/// local admission counts on every check), else in u128.
fn run_us(rule: &Rule, units: u64, up: bool) -> u64 {
    let (period, limit) = (rule.period_micros(), rule.limit().max(1));
    match units.checked_mul(period) {
        Some(product) if up => product.div_ceil(limit),
        Some(product) => product / limit,
        None => {
            let product = u128::from(units) * u128::from(period);
            let run = if up {
                product.div_ceil(u128::from(limit))
            } else {
                product / u128::from(limit)
            };
            u64::try_from(run).unwrap_or(u64::MAX)
        }
    }
}

/// The index of the window `now_us` falls in for a window algorithm (the
/// epoch shifted by the rule's UTC offset), 0 for the other algorithms.
pub fn window_index(rule: &Rule, now_us: u64) -> u64 {
    let offset = match rule.algorithm() {
        Algorithm::FixedWindow => rule.utc_offset_secs(),
        Algorithm::SlidingWindow => 0,
        _ => return 0,
    };
    let shifted = i128::from(now_us) + i128::from(offset) * 1_000_000;
    u64::try_from(shifted.max(0) / i128::from(rule.period_micros())).unwrap_or(0)
}

/// Start (µs since the epoch) of the window holding `now_us`, for windows of
/// `period_us` aligned to the epoch shifted by `utc_offset_s`. A period of 0
/// (no rule has one) is taken as 1 µs.
pub fn window_start(now_us: u64, period_us: u64, utc_offset_s: i32) -> u64 {
    let off = i128::from(utc_offset_s) * 1_000_000;
    let shifted = (i128::from(now_us) + off).max(0);
    let start = shifted - shifted % i128::from(period_us.max(1)) - off;
    u64::try_from(start.max(0)).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Public, so total: a period of 0 panicked with a remainder by zero.
    #[test]
    fn a_window_of_no_length_does_not_panic() {
        assert_eq!(window_start(5, 0, 0), 5);
    }

    /// A bucket whose burst is above its limit takes longer than a period
    /// to refill, and units admitted into it matter for as long; one below
    /// refills sooner.
    #[test]
    fn bucket_units_matter_until_a_full_bucket_refills() {
        let hour = 3_600_000_000u64;
        let last = 1_700_000_000_000_000u64;
        for algorithm in [Algorithm::Gcra, Algorithm::TokenBucket] {
            for (burst, lasts) in [(10, hour), (20, 2 * hour), (5, hour / 2)] {
                let rule = Rule::per_hour(10)
                    .and_then(|r| r.with_algorithm(algorithm))
                    .and_then(|r| r.with_burst(burst))
                    .expect("valid");
                let entry = LedgerEntry::new("k".into(), rule, 3, last, last);
                assert_eq!(
                    entry.expires_at_us(),
                    last + lasts,
                    "{algorithm:?}, burst {burst}"
                );
            }
        }
    }

    #[test]
    fn natural_day_windows_follow_the_offset() {
        let day = 86_400_000_000u64;
        // 2023-11-14T22:13:20Z is 2023-11-15T06:13:20 in UTC+8: the local day began at 16:00Z.
        let now = 1_700_000_000_000_000u64;
        let start = window_start(now, day, 8 * 3600);
        assert_eq!(start % day, 16 * 3_600_000_000);
        assert!(start <= now && now < start + day);
    }
}
