//! One limit over one period, checked by one algorithm.

use std::fmt;
use std::time::Duration;

use crate::error::{Error, Result};

/// A day in µs: calendar windows divide it.
pub(crate) const DAY_US: u64 = 86_400_000_000;

/// Largest integer a Lua number (an IEEE double) holds exactly.
pub const MAX_EXACT: u64 = 1 << 53;

/// The largest limit, burst or cost a rule accepts: 2^51.
///
/// The scripts add counts in doubles. The largest sum any of them forms is the
/// sliding window counter's `previous + current + cost`, at most three times the
/// limit; with every term at most 2^51 that sum stays below 2^53 (`MAX_EXACT`),
/// so every count, and `c + cost` of the fixed window, stays exact.
pub const MAX_LIMIT: u64 = 1 << 51;

/// The largest limit a [`SlidingLog`](Algorithm::SlidingLog) rule accepts.
///
/// The log keeps one sorted-set member per admitted unit, so one admitted
/// request of cost `n` adds `n` members in one script call, and writing an
/// outage back adds up to `limit` members. Redis runs scripts one at a time,
/// so this bounds how long one call can block the server: adding 1,000
/// members in one script took 2 to 10 ms of server time (`INFO commandstats`,
/// Redis 7.0 on a 2-vCPU machine under load), 10,000 took 36 ms. For larger
/// limits use [`SlidingWindow`](Algorithm::SlidingWindow) or GCRA, whose
/// state is a fixed size.
pub const MAX_SLIDING_LOG_LIMIT: u64 = 1_000;

/// The longest time GCRA's arrival time and the token bucket's refill may run
/// ahead of now: 2^52 µs (about 142 years).
///
/// The scripts store the arrival time as µs since the Unix epoch, `now +
/// capacity * period / limit`; keeping the second term under 2^52 keeps the sum
/// under 2^53 (`MAX_EXACT`) until the year 2112.
pub const MAX_REFILL_US: u64 = 1 << 52;

/// The algorithm a rule is checked with.
///
/// | algorithm | state per key | exact |
/// |---|---|---|
/// | [`Gcra`](Algorithm::Gcra) (default) | one value (theoretical arrival time and the limit it was written under) | yes |
/// | [`TokenBucket`](Algorithm::TokenBucket) | hash `{used, ts, limit}` (units used at a time, and the limit they were written under) | yes |
/// | [`SlidingLog`](Algorithm::SlidingLog) | sorted set of events | yes |
/// | [`SlidingWindow`](Algorithm::SlidingWindow) | two counters | approximate |
/// | [`FixedWindow`](Algorithm::FixedWindow) | one counter | yes, per window |
///
/// # Examples
///
/// ```
/// use tierlimit_core::{Algorithm, Rule};
///
/// let rule = Rule::per_minute(10)?.with_algorithm(Algorithm::SlidingLog)?;
/// assert_eq!(rule.algorithm(), Algorithm::SlidingLog);
/// assert_eq!(Algorithm::default(), Algorithm::Gcra);
/// # Ok::<(), tierlimit_core::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Algorithm {
    /// Generic cell rate algorithm: a smooth rate with a burst, one integer per key.
    #[default]
    Gcra,
    /// Token bucket: `capacity` tokens refilled at `limit / period`.
    TokenBucket,
    /// Sliding log: every admitted unit is a sorted-set member; exact over any
    /// trailing `period`, memory grows with the limit. Its limit is at most
    /// [`MAX_SLIDING_LOG_LIMIT`], which bounds the server time of any one
    /// script call (see there).
    SlidingLog,
    /// Sliding window counter: the current and previous fixed windows' counts,
    /// the previous weighted by how much of it still overlaps the trailing
    /// period. Approximate: it assumes the previous window's requests were spread
    /// evenly.
    SlidingWindow,
    /// Fixed window: one counter per window aligned to the Unix epoch shifted by
    /// the rule's UTC offset (so `per_day` with an offset is the natural day).
    FixedWindow,
}

impl Algorithm {
    /// The code the Lua scripts know this algorithm by.
    pub fn code(self) -> u8 {
        match self {
            Algorithm::Gcra => 1,
            Algorithm::TokenBucket => 2,
            Algorithm::SlidingLog => 3,
            Algorithm::SlidingWindow => 4,
            Algorithm::FixedWindow => 5,
        }
    }

    /// The one-letter tag used in storage keys.
    fn tag(self) -> char {
        match self {
            Algorithm::Gcra => 'g',
            Algorithm::TokenBucket => 't',
            Algorithm::SlidingLog => 'l',
            Algorithm::SlidingWindow => 's',
            Algorithm::FixedWindow => 'f',
        }
    }

    /// True for the algorithms that have a burst separate from the limit.
    pub fn has_burst(self) -> bool {
        matches!(self, Algorithm::Gcra | Algorithm::TokenBucket)
    }
}

/// One limit over one period, checked by one [`Algorithm`].
///
/// Built in governor's style and validated at construction: every way to write
/// a rule that cannot work returns its own [`Error`].
///
/// Bounds, each chosen so the Lua scripts stay exact and quick:
/// * limit and burst at most [`MAX_LIMIT`] (2^51), so every sum the scripts
///   form in doubles stays below 2^53;
/// * a [`SlidingLog`](Algorithm::SlidingLog) limit at most
///   [`MAX_SLIDING_LOG_LIMIT`], so no check or write-back blocks Redis for
///   more than milliseconds;
/// * for GCRA and the token bucket, `burst * period / limit` at most
///   [`MAX_REFILL_US`];
/// * a period from 1 ms to 2^53 µs, in whole microseconds.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tierlimit_core::{Algorithm, Rule};
///
/// // 10 per minute, smooth (GCRA), bursts of up to 3.
/// let smooth = Rule::per_minute(10)?.with_burst(3)?;
/// assert_eq!(smooth.capacity(), 3);
///
/// // 1000 per natural day in UTC+8, counted in calendar days.
/// let daily = Rule::per_natural_day(1000, 8 * 3600)?;
/// assert_eq!(daily.algorithm(), Algorithm::FixedWindow);
///
/// // Bad input is an error, never a panic.
/// assert!(Rule::with_period(5, Duration::from_micros(10)).is_err());
/// # Ok::<(), tierlimit_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Rule {
    limit: u64,
    period_us: u64,
    algorithm: Algorithm,
    burst: Option<u64>,
    utc_offset_s: i32,
    /// Set by [`with_utc_offset`](Rule::with_utc_offset), UTC itself
    /// included: the rule asked for calendar windows, which only the fixed
    /// window has (an offset of 0 alone could not tell).
    calendar: bool,
}

impl Rule {
    /// `limit` per second.
    pub fn per_second(limit: u64) -> Result<Rule> {
        Rule::with_period(limit, Duration::from_secs(1))
    }

    /// `limit` per minute.
    pub fn per_minute(limit: u64) -> Result<Rule> {
        Rule::with_period(limit, Duration::from_secs(60))
    }

    /// `limit` per hour.
    pub fn per_hour(limit: u64) -> Result<Rule> {
        Rule::with_period(limit, Duration::from_secs(3600))
    }

    /// `limit` per day.
    pub fn per_day(limit: u64) -> Result<Rule> {
        Rule::with_period(limit, Duration::from_secs(86_400))
    }

    /// `limit` per natural (calendar) hour at the given UTC offset in seconds:
    /// a fixed window that resets when the local clock reaches `hh:00`.
    pub fn per_natural_hour(limit: u64, utc_offset_secs: i64) -> Result<Rule> {
        Rule::new(limit, Duration::from_secs(3600), Algorithm::FixedWindow)?
            .with_utc_offset(utc_offset_secs)
    }

    /// `limit` per natural (calendar) day at the given UTC offset in seconds:
    /// a fixed window that resets at local midnight.
    pub fn per_natural_day(limit: u64, utc_offset_secs: i64) -> Result<Rule> {
        Rule::new(limit, Duration::from_secs(86_400), Algorithm::FixedWindow)?
            .with_utc_offset(utc_offset_secs)
    }

    /// `limit` per `period`, with the default algorithm (GCRA) and a burst equal to
    /// the limit.
    pub fn with_period(limit: u64, period: Duration) -> Result<Rule> {
        Rule::new(limit, period, Algorithm::Gcra)
    }

    /// `limit` per `period` checked by `algorithm`, with a burst equal to the
    /// limit where it has one.
    ///
    /// Validated for that algorithm from the start: a window may count more
    /// than one unit per microsecond of its period (100 billion bytes a day,
    /// say), which GCRA and the token bucket refuse ([`Error::RateTooFine`]),
    /// so `Rule::per_day(n)?.with_algorithm(..)` cannot reach such a window.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tierlimit_core::{Algorithm, Error, Rule};
    ///
    /// let day = Duration::from_secs(86_400);
    /// let bytes = Rule::new(100_000_000_000, day, Algorithm::FixedWindow)?;
    /// assert_eq!(bytes.limit(), 100_000_000_000);
    /// assert!(matches!(
    ///     Rule::new(100_000_000_000, day, Algorithm::Gcra),
    ///     Err(Error::RateTooFine { .. })
    /// ));
    /// # Ok::<(), Error>(())
    /// ```
    pub fn new(limit: u64, period: Duration, algorithm: Algorithm) -> Result<Rule> {
        if limit == 0 {
            return Err(Error::ZeroLimit);
        }
        if limit > MAX_LIMIT {
            return Err(Error::LimitTooLarge {
                value: limit,
                max: MAX_LIMIT,
            });
        }
        if period < Duration::from_millis(1) {
            return Err(Error::PeriodTooShort { period });
        }
        if !period.subsec_nanos().is_multiple_of(1_000) {
            return Err(Error::PeriodPrecision { period });
        }
        let period_us = u64::try_from(period.as_micros())
            .ok()
            .filter(|us| *us <= MAX_EXACT)
            .ok_or(Error::PeriodTooLong {
                period,
                // The bound that holds for this rule: a bursting algorithm's
                // refill is held to less (see `validated`).
                max: Duration::from_micros(if algorithm.has_burst() {
                    MAX_REFILL_US
                } else {
                    MAX_EXACT
                }),
            })?;
        Rule {
            limit,
            period_us,
            algorithm,
            burst: None,
            utc_offset_s: 0,
            calendar: false,
        }
        .validated()
    }

    /// The same rule checked by another algorithm.
    pub fn with_algorithm(self, algorithm: Algorithm) -> Result<Rule> {
        Rule { algorithm, ..self }.validated()
    }

    /// Allows bursts of up to `burst` units (GCRA and token bucket only; the
    /// default burst is the limit).
    pub fn with_burst(self, burst: u64) -> Result<Rule> {
        Rule {
            burst: Some(burst),
            ..self
        }
        .validated()
    }

    /// Aligns fixed windows to a UTC offset in seconds (fixed window only), so a
    /// day-long window is the natural day of that time zone. The period must
    /// divide a day evenly ([`Error::CalendarPeriod`]), so every window
    /// starts at local midnight or a fraction of a day after it.
    pub fn with_utc_offset(self, utc_offset_secs: i64) -> Result<Rule> {
        let utc_offset_s = i32::try_from(utc_offset_secs)
            .ok()
            .filter(|s| s.unsigned_abs() < 86_400)
            .ok_or(Error::InvalidUtcOffset {
                seconds: utc_offset_secs,
            })?;
        Rule {
            utc_offset_s,
            calendar: true,
            ..self
        }
        .validated()
    }

    fn validated(self) -> Result<Rule> {
        if let Some(burst) = self.burst {
            if !self.algorithm.has_burst() {
                return Err(Error::BurstNotSupported {
                    algorithm: self.algorithm,
                });
            }
            if burst == 0 {
                return Err(Error::ZeroBurst);
            }
            if burst > MAX_LIMIT {
                return Err(Error::LimitTooLarge {
                    value: burst,
                    max: MAX_LIMIT,
                });
            }
        }
        if self.algorithm == Algorithm::SlidingLog && self.limit > MAX_SLIDING_LOG_LIMIT {
            return Err(Error::SlidingLogTooLarge {
                limit: self.limit,
                max: MAX_SLIDING_LOG_LIMIT,
            });
        }
        if self.calendar && self.algorithm != Algorithm::FixedWindow {
            return Err(Error::CalendarNeedsFixedWindow {
                algorithm: self.algorithm,
            });
        }
        if self.calendar && !DAY_US.is_multiple_of(self.period_us) {
            return Err(Error::CalendarPeriod {
                period: self.period(),
            });
        }
        if self.algorithm.has_burst() && self.limit > self.period_us {
            return Err(Error::RateTooFine {
                limit: self.limit,
                period: self.period(),
            });
        }
        // GCRA's arrival time and the token bucket's refill run up to
        // capacity * period / limit µs ahead of now: keep now + that exact in a double.
        // Compared without dividing, as lua/common.lua's rule_args does.
        let refill_exceeds = u128::from(self.capacity()) * u128::from(self.period_us)
            > u128::from(MAX_REFILL_US) * u128::from(self.limit);
        if self.algorithm.has_burst() && refill_exceeds && self.burst.is_none() {
            // A full bucket refills in one period: the period itself is what
            // is too long, not a burst the rule was never given.
            return Err(Error::PeriodTooLong {
                period: self.period(),
                max: Duration::from_micros(MAX_REFILL_US),
            });
        }
        if self.algorithm.has_burst() && refill_exceeds {
            return Err(Error::BurstWindowTooLong {
                capacity: self.capacity(),
                limit: self.limit,
                period: self.period(),
            });
        }
        Ok(self)
    }

    /// Units admitted per period.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The period.
    pub fn period(&self) -> Duration {
        Duration::from_micros(self.period_us)
    }

    /// The period in microseconds, the scripts' unit of time.
    pub fn period_micros(&self) -> u64 {
        self.period_us
    }

    /// The algorithm.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// The burst, when one was set.
    pub fn burst(&self) -> Option<u64> {
        self.burst
    }

    /// The UTC offset of fixed windows, in seconds.
    pub fn utc_offset_secs(&self) -> i32 {
        self.utc_offset_s
    }

    /// Whether the rule counts calendar windows: a UTC offset was given
    /// ([`with_utc_offset`](Self::with_utc_offset), `"10/day@UTC"`), UTC
    /// itself included.
    pub fn is_calendar(&self) -> bool {
        self.calendar
    }

    /// The most units one request can ever take: the burst for GCRA and the token
    /// bucket, the limit for the window algorithms.
    pub fn capacity(&self) -> u64 {
        self.burst.unwrap_or(self.limit)
    }

    /// A short id, stable across processes, naming what shapes the rule's
    /// stored state: the algorithm, the period and the UTC offset (`g60000000`
    /// is GCRA over a minute, `f86400000000o28800` a natural day at UTC+8).
    ///
    /// The limit and the burst are not part of it: a rule whose limit or
    /// burst changes keeps its storage key, and the state there carries over
    /// (see [`RuleSet::identity`](crate::RuleSet::identity)). Changing the
    /// algorithm or the period changes the id, so state written under another
    /// meaning is never read.
    ///
    /// # Examples
    ///
    /// ```
    /// use tierlimit_core::Rule;
    ///
    /// let before = Rule::per_minute(100)?;
    /// let after = Rule::per_minute(200)?.with_burst(50)?;
    /// assert_eq!(before.id(), "g60000000");
    /// assert_eq!(before.id(), after.id());
    /// assert_ne!(before.id(), Rule::per_hour(100)?.id());
    /// # Ok::<(), tierlimit_core::Error>(())
    /// ```
    pub fn id(&self) -> String {
        let mut id = format!("{}{}", self.algorithm.tag(), self.period_us);
        if self.utc_offset_s != 0 {
            id.push_str(&format!("o{}", self.utc_offset_s));
        }
        id
    }

    /// The rule as the Redis scripts (`lua/check.lua`) read it: its five
    /// numbers joined by `:`, in the scripts' order: algorithm
    /// [code](Algorithm::code), limit, period in µs, capacity, UTC offset in
    /// µs. One argument rather than five, because Redis pays for every
    /// argument of a call; a [`RuleSet`](crate::RuleSet) formats it once
    /// ([`RuleSet::script_arg`](crate::RuleSet::script_arg)). Returned as a
    /// `Display`, so it can be written where it goes without a `String`.
    ///
    /// # Examples
    ///
    /// ```
    /// use tierlimit_core::Rule;
    ///
    /// let rule = Rule::per_natural_day(1000, -8 * 3600)?;
    /// assert_eq!(rule.script_arg().to_string(), "5:1000:86400000000:1000:-28800000000");
    /// # Ok::<(), tierlimit_core::Error>(())
    /// ```
    pub fn script_arg(&self) -> impl fmt::Display + '_ {
        ScriptArg(self)
    }
}

/// [`Rule::script_arg`].
struct ScriptArg<'a>(&'a Rule);

impl fmt::Display for ScriptArg<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = self.0;
        write!(
            f,
            "{}:{}:{}:{}:{}",
            r.algorithm.code(),
            r.limit,
            r.period_us,
            r.capacity(),
            i64::from(r.utc_offset_s) * 1_000_000
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_is_burst_or_limit() {
        let r = Rule::per_second(10).expect("valid");
        assert_eq!(r.capacity(), 10);
        let r = r.with_burst(4).expect("valid");
        assert_eq!(r.capacity(), 4);
    }

    #[test]
    fn ids_differ_when_state_shape_differs() {
        let a = Rule::per_minute(10).expect("valid");
        let b = a
            .clone()
            .with_algorithm(Algorithm::TokenBucket)
            .expect("valid");
        let c = Rule::per_hour(10).expect("valid");
        let d = Rule::per_natural_day(10, 3600).expect("valid");
        let e = Rule::per_natural_day(10, 7200).expect("valid");
        let ids = [a.id(), b.id(), c.id(), d.id(), e.id()];
        for (i, x) in ids.iter().enumerate() {
            for y in &ids[i + 1..] {
                assert_ne!(x, y);
            }
        }
    }

    /// Issue 13: a changed limit or burst kept no state, since both were part
    /// of the id (and so of the storage key).
    #[test]
    fn ids_ignore_limit_and_burst() {
        let a = Rule::per_minute(10).expect("valid");
        let b = Rule::per_minute(11).expect("valid");
        let c = a.clone().with_burst(2).expect("valid");
        assert_eq!(a.id(), "g60000000");
        assert_eq!((a.id(), a.id()), (b.id(), c.id()));
        let day = Rule::per_natural_day(1000, -8 * 3600).expect("valid");
        assert_eq!(day.id(), "f86400000000o-28800");
    }

    #[test]
    fn a_burst_that_refills_beyond_exact_doubles_is_refused() {
        let r = Rule::per_day(1).and_then(|r| r.with_burst(1 << 40));
        assert!(matches!(r, Err(Error::BurstWindowTooLong { .. })));
        assert!(Rule::per_day(1).and_then(|r| r.with_burst(1_000)).is_ok());
    }

    #[test]
    fn calendar_rules_are_fixed_windows_with_offset() {
        let r = Rule::per_natural_hour(5, -5 * 3600).expect("valid");
        assert_eq!(r.algorithm(), Algorithm::FixedWindow);
        assert_eq!(r.utc_offset_secs(), -5 * 3600);
        assert_eq!(r.period(), Duration::from_secs(3600));
    }
}
