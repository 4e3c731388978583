//! Rules and durations written as text: `"10/s"`, `"1000/day@+08:00"`, `"50ms"`.
//!
//! One grammar for the config file, the command line and code; it is
//! documented where users meet it: on `Rule`'s `FromStr` and on
//! [`parse_duration`].

use std::str::FromStr;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::rule::DAY_US;
use crate::{Algorithm, Rule};

/// The units every period and duration may be written in, with their length in µs.
const UNITS: &[(&str, u64)] = &[
    ("us", 1),
    ("ms", 1_000),
    ("s", 1_000_000),
    ("sec", 1_000_000),
    ("second", 1_000_000),
    ("seconds", 1_000_000),
    ("m", 60_000_000),
    ("min", 60_000_000),
    ("minute", 60_000_000),
    ("minutes", 60_000_000),
    ("h", 3_600_000_000),
    ("hour", 3_600_000_000),
    ("hours", 3_600_000_000),
    ("d", DAY_US),
    ("day", DAY_US),
    ("days", DAY_US),
];

const UNIT_LIST: &str = "us, ms, s, sec, second(s), m, min, minute(s), h, hour(s), d, day(s)";

impl FromStr for Rule {
    type Err = Error;

    /// Parses `"<limit>/<period>[@<offset>]"`:
    ///
    /// ```text
    /// rule      = limit "/" period [ "@" offset ]
    /// limit     = digits                       1 to 2^51 (MAX_LIMIT)
    /// period    = [ digits ] unit              "s" is one second, "30s" thirty
    /// offset    = "UTC" | ("+" | "-") hh [ ":" mm ]
    /// unit      = "us" | "ms"
    ///           | "s" | "sec" | "second" | "seconds"
    ///           | "m" | "min" | "minute" | "minutes"
    ///           | "h" | "hour" | "hours"
    ///           | "d" | "day" | "days"
    /// ```
    ///
    /// * Whitespace around the text is ignored; inside it is an error.
    /// * `m` is a minute (`m` never means a month; `ms` is a millisecond).
    /// * Numbers are plain ASCII digits: no sign, no fraction, no `_`.
    /// * Without `@` the rule is GCRA with a burst equal to its limit, as
    ///   [`Rule::with_period`] makes it: the algorithm and the burst are not
    ///   part of the text (the config file's table form sets them).
    /// * `@offset` makes a **calendar window**: a fixed window whose
    ///   boundaries fall on the local clock of that UTC offset.
    ///   `"1000/day@+08:00"` resets at midnight in UTC+8 (as
    ///   [`Rule::per_natural_day`]), `"100/hour@-05:00"` at every full hour in
    ///   UTC-5 ([`Rule::per_natural_hour`]), `"1000/day@UTC"` at midnight UTC.
    ///   The period must divide a day evenly (`15m`, `1h`, `6h`, `1d`...), so
    ///   every window starts a whole number of periods after local midnight.
    ///
    /// # Errors
    ///
    /// Text outside the grammar is [`Error::InvalidRuleSpec`] with a reason
    /// saying what to write instead. Text inside it that makes a rule the
    /// constructors refuse is their own error: `"0/s"` is
    /// [`Error::ZeroLimit`], `"1/500us"` [`Error::PeriodTooShort`].
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tierlimit_core::{Algorithm, Error, Rule};
    ///
    /// let r: Rule = "100/min".parse()?;
    /// assert_eq!((r.limit(), r.period()), (100, Duration::from_secs(60)));
    /// assert_eq!(r, Rule::per_minute(100)?);
    ///
    /// let r: Rule = "20/30s".parse()?;
    /// assert_eq!(r.period(), Duration::from_secs(30));
    ///
    /// let daily: Rule = "1000/day@+08:00".parse()?;
    /// assert_eq!(daily, Rule::per_natural_day(1000, 8 * 3600)?);
    /// assert_eq!(daily.algorithm(), Algorithm::FixedWindow);
    ///
    /// assert!(matches!("10/fortnight".parse::<Rule>(), Err(Error::InvalidRuleSpec { .. })));
    /// assert!(matches!("0/s".parse::<Rule>(), Err(Error::ZeroLimit)));
    /// # Ok::<(), Error>(())
    /// ```
    fn from_str(text: &str) -> Result<Rule> {
        parse_rule_as(text, None)
    }
}

/// Parses a duration: digits followed by a unit, `"250us"`, `"50ms"`, `"2s"`,
/// `"1m"` (a minute), `"1h"`, `"1d"`. One count and one unit: write `"90m"`,
/// not `"1h30m"`; no fractions (`"1500ms"`, not `"1.5s"`). Whitespace around
/// the text is ignored. Zero (`"0s"`) parses: whether it is allowed is up to
/// the setting it is for.
///
/// The units are those of rule periods (`"20/30s"`), so one text means one
/// length everywhere: `us`, `ms`, `s`/`sec`/`second(s)`, `m`/`min`/`minute(s)`,
/// `h`/`hour(s)`, `d`/`day(s)`.
///
/// # Errors
///
/// [`Error::InvalidDuration`] with a reason: empty, no count, an unknown unit,
/// a sign or fraction, or a length past `u64::MAX` µs.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tierlimit_core::parse_duration;
///
/// assert_eq!(parse_duration("50ms")?, Duration::from_millis(50));
/// assert_eq!(parse_duration(" 1m ")?, Duration::from_secs(60));
/// assert!(parse_duration("1.5s").is_err());
/// assert!(parse_duration("s").is_err());
/// # Ok::<(), tierlimit_core::Error>(())
/// ```
pub fn parse_duration(text: &str) -> Result<Duration> {
    let fail = |reason: String| Error::InvalidDuration {
        text: text.to_owned(),
        reason,
    };
    let t = text.trim();
    if t.is_empty() {
        return Err(fail(
            "empty: write a count and a unit, like \"50ms\" or \"2s\"".into(),
        ));
    }
    let digits_end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (count, unit) = t.split_at(digits_end);
    if count.is_empty() {
        return Err(fail(match unit.as_bytes().first() {
            Some(b'-' | b'+') => "a duration has no sign: write e.g. \"1s\"".into(),
            _ => format!("expected a count before the unit, like \"1{unit}\""),
        }));
    }
    let count: u64 = count
        .parse()
        .map_err(|_| fail("the count is too large".into()))?;
    if unit.is_empty() {
        return Err(fail(format!(
            "missing unit after {count}: write e.g. \"{count}ms\" or \"{count}s\" (units: {UNIT_LIST})"
        )));
    }
    let unit_us = unit_micros(unit).map_err(fail)?;
    count
        .checked_mul(unit_us)
        .map(Duration::from_micros)
        .ok_or_else(|| fail("too long: past u64::MAX microseconds".into()))
}

/// The length of `unit` in µs, or a reason naming what went wrong.
fn unit_micros(unit: &str) -> std::result::Result<u64, String> {
    if let Some((_, us)) = UNITS.iter().find(|(name, _)| *name == unit) {
        return Ok(*us);
    }
    Err(match unit.chars().next() {
        Some('.' | ',') => {
            "fractions are not allowed: use a smaller unit (\"1500ms\", not \"1.5s\")".into()
        }
        Some(c) if c.is_whitespace() => "no spaces inside: write \"10s\", not \"10 s\"".into(),
        _ if unit.chars().any(|c| c.is_ascii_digit()) => {
            format!("one count and one unit only (\"90m\", not \"1h30m\"); got unit {unit:?}")
        }
        _ => format!("unknown unit {unit:?}: use one of {UNIT_LIST}"),
    })
}

/// Parses `text` as [`Rule::from_str`] does, checked by `algorithm` from the
/// start (`None`: GCRA, or the fixed window for a calendar `@offset`), as
/// [`Rule::new`] makes it: a window may count more than one unit per
/// microsecond, which GCRA refuses, so parsing as GCRA first and changing
/// the algorithm after cannot reach it. (The config file's table form
/// names the algorithm beside the rate.)
///
/// # Errors
///
/// As [`Rule::from_str`]; an `@offset` with an algorithm other than the
/// fixed window is [`Error::CalendarNeedsFixedWindow`].
///
/// # Examples
///
/// ```
/// use tierlimit_core::{Algorithm, Error, Rule, parse_rule_as};
///
/// let bytes = parse_rule_as("100000000000/day", Some(Algorithm::SlidingWindow))?;
/// assert_eq!(bytes.algorithm(), Algorithm::SlidingWindow);
/// assert!(matches!("100000000000/day".parse::<Rule>(), Err(Error::RateTooFine { .. })));
/// # Ok::<(), Error>(())
/// ```
pub fn parse_rule_as(text: &str, algorithm: Option<Algorithm>) -> Result<Rule> {
    let fail = |reason: String| Error::InvalidRuleSpec {
        spec: text.to_owned(),
        reason,
    };
    let t = text.trim();
    if t.is_empty() {
        return Err(fail(
            "empty: write \"<limit>/<period>\", like \"10/s\" or \"100/min\"".into(),
        ));
    }
    if let Some(c) = t.chars().find(|c| c.is_whitespace()) {
        return Err(fail(format!(
            "no spaces inside a rule (found {c:?}): write \"10/s\", not \"10 / s\""
        )));
    }
    let (rate, offset) = match t.split_once('@') {
        Some((rate, offset)) => (rate, Some(offset)),
        None => (t, None),
    };
    let Some((limit, period)) = rate.split_once('/') else {
        return Err(fail(format!(
            "missing \"/<period>\": write e.g. \"{rate}/s\" or \"{rate}/min\""
        )));
    };
    let limit = parse_limit(limit).map_err(fail)?;
    let period_us = parse_period(period).map_err(fail)?;
    let length = Duration::from_micros(period_us);
    let Some(offset) = offset else {
        return Rule::new(limit, length, algorithm.unwrap_or(Algorithm::Gcra));
    };
    let offset_s = parse_offset(offset).map_err(fail)?;
    if !DAY_US.is_multiple_of(period_us) {
        return Err(fail(format!(
            "a calendar window (@offset) needs a period that divides a day evenly \
             (like 15m, 1h, 6h or 1d), so its windows start at local midnight; got {period:?}"
        )));
    }
    Rule::new(limit, length, algorithm.unwrap_or(Algorithm::FixedWindow))?.with_utc_offset(offset_s)
}

fn parse_limit(limit: &str) -> std::result::Result<u64, String> {
    if limit.is_empty() {
        return Err("missing limit before \"/\": write e.g. \"10/s\"".into());
    }
    if !limit.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "the limit must be a whole number of digits, got {limit:?} (no sign, fraction or \"_\")"
        ));
    }
    limit.parse().map_err(|_| {
        format!(
            "the limit {limit} is too large (at most {})",
            crate::MAX_LIMIT
        )
    })
}

/// A period in µs: a unit alone ("s") or a count and a unit ("30s").
fn parse_period(period: &str) -> std::result::Result<u64, String> {
    if period.is_empty() {
        return Err(format!(
            "missing period after \"/\": write a unit like \"s\", \"min\", \"h\" or \"day\", or a count and a unit like \"30s\" (units: {UNIT_LIST})"
        ));
    }
    if period.contains('/') {
        return Err("one \"/\" only: \"<limit>/<period>\"".into());
    }
    let digits_end = period
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(period.len());
    let (count, unit) = period.split_at(digits_end);
    let count: u64 = if count.is_empty() {
        1
    } else {
        count
            .parse()
            .map_err(|_| format!("the period's count {count} is too large"))?
    };
    if count == 0 {
        return Err("the period's count must be at least 1 (\"30s\", not \"0s\")".into());
    }
    if unit.is_empty() {
        return Err(format!(
            "missing unit in the period {period:?}: write e.g. \"{count}s\" (units: {UNIT_LIST})"
        ));
    }
    let unit_us = unit_micros(unit)?;
    count
        .checked_mul(unit_us)
        .ok_or_else(|| format!("the period {period:?} is too long"))
}

/// A UTC offset in seconds: `UTC`, `+hh`, `+hh:mm`, `-hh:mm`.
fn parse_offset(offset: &str) -> std::result::Result<i64, String> {
    const HINT: &str = "write \"UTC\" or a sign, hours and minutes, like \"+08:00\" or \"-05:30\"";
    if offset == "UTC" {
        return Ok(0);
    }
    let (sign, rest) = match offset.as_bytes().first() {
        Some(b'+') => (1, &offset[1..]),
        Some(b'-') => (-1, &offset[1..]),
        _ => return Err(format!("bad UTC offset {offset:?}: {HINT}")),
    };
    let (hours, minutes) = rest.split_once(':').unwrap_or((rest, "00"));
    let two_digits = |s: &str| s.len() == 2 && s.bytes().all(|b| b.is_ascii_digit());
    if !two_digits(hours) || !two_digits(minutes) {
        return Err(format!("bad UTC offset {offset:?}: {HINT}"));
    }
    let (h, m): (i64, i64) = match (hours.parse(), minutes.parse()) {
        (Ok(h), Ok(m)) => (h, m),
        _ => return Err(format!("bad UTC offset {offset:?}: {HINT}")),
    };
    if h > 23 {
        return Err(format!("bad UTC offset {offset:?}: hours must be 00 to 23"));
    }
    if m > 59 {
        return Err(format!(
            "bad UTC offset {offset:?}: minutes must be 00 to 59"
        ));
    }
    Ok(sign * (h * 3600 + m * 60))
}

/// Parses a UTC offset as the `@` part of a rule takes it (`"+08:00"`,
/// `"-05:30"`, `"+08"`, `"UTC"`), in seconds east of UTC.
///
/// # Errors
///
/// [`Error::InvalidRuleSpec`] naming the offset and what to write.
///
/// # Examples
///
/// ```
/// use tierlimit_core::parse_utc_offset;
///
/// assert_eq!(parse_utc_offset("+08:00")?, 8 * 3600);
/// assert_eq!(parse_utc_offset("-05:30")?, -(5 * 3600 + 30 * 60));
/// assert!(parse_utc_offset("+25:00").is_err());
/// # Ok::<(), tierlimit_core::Error>(())
/// ```
pub fn parse_utc_offset(text: &str) -> Result<i64> {
    parse_offset(text.trim()).map_err(|reason| Error::InvalidRuleSpec {
        spec: text.to_owned(),
        reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(text: &str) -> Rule {
        match text.parse() {
            Ok(r) => r,
            Err(e) => panic!("{text:?} should parse: {e}"),
        }
    }

    fn reason(text: &str) -> String {
        match text.parse::<Rule>() {
            Err(Error::InvalidRuleSpec { spec, reason }) => {
                assert_eq!(spec, text, "the error names the text as given");
                reason
            }
            other => panic!("{text:?}: expected InvalidRuleSpec, got {other:?}"),
        }
    }

    #[test]
    fn every_unit_parses_to_its_length() {
        let secs = |n| Duration::from_secs(n);
        for (text, period) in [
            ("10/s", secs(1)),
            ("10/sec", secs(1)),
            ("10/second", secs(1)),
            ("10/seconds", secs(1)),
            ("10/m", secs(60)),
            ("10/min", secs(60)),
            ("10/minute", secs(60)),
            ("10/minutes", secs(60)),
            ("10/h", secs(3600)),
            ("10/hour", secs(3600)),
            ("10/hours", secs(3600)),
            ("10/d", secs(86_400)),
            ("10/day", secs(86_400)),
            ("10/days", secs(86_400)),
            ("10/ms", Duration::from_millis(1)),
            ("10/500ms", Duration::from_millis(500)),
            ("20/30s", secs(30)),
            ("5/2h", secs(7200)),
            ("5/7d", secs(7 * 86_400)),
            ("1/1000us", Duration::from_millis(1)),
        ] {
            let r = rule(text);
            assert_eq!(r.period(), period, "{text}");
            assert_eq!(r.algorithm(), Algorithm::Gcra, "{text}");
            assert_eq!(r.burst(), None, "{text}");
            assert_eq!(r.utc_offset_secs(), 0, "{text}");
        }
    }

    #[test]
    fn plain_rules_equal_their_constructors() {
        assert_eq!(rule("10/s"), Rule::per_second(10).expect("valid"));
        assert_eq!(rule("100/min"), Rule::per_minute(100).expect("valid"));
        assert_eq!(rule("1000/h"), Rule::per_hour(1000).expect("valid"));
        assert_eq!(rule("5000/day"), Rule::per_day(5000).expect("valid"));
        assert_eq!(rule("1/s").limit(), 1);
        let max = crate::MAX_LIMIT;
        // The largest limit GCRA takes at a day (not finer than 1 per µs).
        assert_eq!(rule(&format!("{}/day", DAY_US)).limit(), DAY_US);
        assert!(matches!(
            format!("{}/day", max + 1).parse::<Rule>(),
            Err(Error::LimitTooLarge { .. })
        ));
    }

    #[test]
    fn calendar_windows() {
        assert_eq!(
            rule("1000/day@+08:00"),
            Rule::per_natural_day(1000, 8 * 3600).expect("valid")
        );
        assert_eq!(
            rule("100/hour@-05:00"),
            Rule::per_natural_hour(100, -5 * 3600).expect("valid")
        );
        assert_eq!(
            rule("1000/day@UTC"),
            Rule::per_natural_day(1000, 0).expect("valid")
        );
        assert_eq!(
            rule("1000/d@+00:00"),
            Rule::per_natural_day(1000, 0).expect("valid")
        );
        assert_eq!(rule("7/day@+05:30").utc_offset_secs(), 5 * 3600 + 1800);
        assert_eq!(rule("7/day@-09:30").utc_offset_secs(), -(9 * 3600 + 1800));
        assert_eq!(rule("7/day@+08").utc_offset_secs(), 8 * 3600);
        assert_eq!(rule("7/day@+23:59").utc_offset_secs(), 23 * 3600 + 59 * 60);
        let quarter = rule("50/15m@+01:00");
        assert_eq!(quarter.algorithm(), Algorithm::FixedWindow);
        assert_eq!(quarter.period(), Duration::from_secs(900));
        assert_eq!(rule("1000/24h@+08:00"), rule("1000/day@+08:00"));
    }

    #[test]
    fn whitespace_around_is_ignored_inside_is_refused() {
        assert_eq!(rule("  10/s\t"), rule("10/s"));
        assert_eq!(rule("\n1000/day@+08:00 "), rule("1000/day@+08:00"));
        for text in [
            "10 /s",
            "10/ s",
            "10 / s",
            "10/s @+08:00",
            "1 0/s",
            "10/30 s",
        ] {
            assert!(reason(text).contains("no spaces"), "{text}");
        }
    }

    #[test]
    fn malformed_rules_say_what_to_write() {
        for (text, says) in [
            ("", "empty"),
            ("   ", "empty"),
            ("10", "missing \"/<period>\""),
            ("/s", "missing limit"),
            ("10/", "missing period"),
            ("10/fortnight", "unknown unit \"fortnight\""),
            ("10/S", "unknown unit \"S\""),
            ("10/30", "missing unit"),
            ("10/0s", "at least 1"),
            ("-1/s", "whole number of digits"),
            ("+1/s", "whole number of digits"),
            ("1.5/s", "whole number of digits"),
            ("1_000/s", "whole number of digits"),
            ("1e3/s", "whole number of digits"),
            ("ten/s", "whole number of digits"),
            ("10/1.5s", "fractions"),
            ("10/1h30m", "one count and one unit"),
            ("10/s/s", "one \"/\" only"),
            ("99999999999999999999/s", "too large"),
            ("1/99999999999999999999s", "too large"),
            ("1/999999999999999d", "too long"),
            ("10/s@+25:00", "hours must be 00 to 23"),
            ("10/day@+24:00", "hours must be 00 to 23"),
            ("10/day@+08:60", "minutes must be 00 to 59"),
            ("10/day@08:00", "bad UTC offset"),
            ("10/day@+8:00", "bad UTC offset"),
            ("10/day@+08:0", "bad UTC offset"),
            ("10/day@", "bad UTC offset"),
            ("10/day@utc", "bad UTC offset"),
            ("10/day@Europe/Paris", "bad UTC offset"),
            ("10/day@+08:00@+01:00", "bad UTC offset"),
            ("10/7h@+08:00", "divides a day evenly"),
            ("10/2d@+08:00", "divides a day evenly"),
        ] {
            let got = reason(text);
            assert!(got.contains(says), "{text:?}: {got:?} should say {says:?}");
        }
    }

    #[test]
    fn the_constructors_errors_come_through() {
        assert!(matches!("0/s".parse::<Rule>(), Err(Error::ZeroLimit)));
        assert!(matches!(
            "0/day@+08:00".parse::<Rule>(),
            Err(Error::ZeroLimit)
        ));
        assert!(matches!(
            "1/500us".parse::<Rule>(),
            Err(Error::PeriodTooShort { .. })
        ));
        assert!(matches!(
            "1/200000d".parse::<Rule>(),
            Err(Error::PeriodTooLong { .. })
        ));
        // 2000 per ms is finer than one per µs for GCRA.
        assert!(matches!(
            "2000/ms".parse::<Rule>(),
            Err(Error::RateTooFine { .. })
        ));
    }

    #[test]
    fn errors_read_well() {
        let e = "10/fortnight".parse::<Rule>().expect_err("invalid");
        let shown = e.to_string();
        assert!(shown.contains("\"10/fortnight\""), "{shown}");
        assert!(shown.contains("unknown unit"), "{shown}");
        assert!(e.is_bad_input());
    }

    #[test]
    fn durations() {
        for (text, d) in [
            ("250us", Duration::from_micros(250)),
            ("50ms", Duration::from_millis(50)),
            ("2s", Duration::from_secs(2)),
            ("1m", Duration::from_secs(60)),
            ("1min", Duration::from_secs(60)),
            ("1h", Duration::from_secs(3600)),
            ("1d", Duration::from_secs(86_400)),
            ("0s", Duration::ZERO),
            (" 5s ", Duration::from_secs(5)),
        ] {
            assert_eq!(parse_duration(text).expect("valid"), d, "{text}");
        }
        for (text, says) in [
            ("", "empty"),
            ("s", "expected a count"),
            ("10", "missing unit"),
            ("1.5s", "fractions"),
            ("-1s", "no sign"),
            ("1h30m", "one count and one unit"),
            ("10 s", "no spaces"),
            ("10parsecs", "unknown unit"),
            ("99999999999999999999s", "too large"),
            ("999999999999999d", "too long"),
        ] {
            match parse_duration(text) {
                Err(Error::InvalidDuration { text: t, reason }) => {
                    assert_eq!(t, text);
                    assert!(reason.contains(says), "{text:?}: {reason:?}");
                }
                other => panic!("{text:?}: expected InvalidDuration, got {other:?}"),
            }
        }
    }
}
