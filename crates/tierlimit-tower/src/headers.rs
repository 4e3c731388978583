//! Rate-limit response headers, rendered from a [`Decision`].

use std::fmt::Write as _;
use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue};
use tierlimit::{Decision, Rule, RuleSet, RuleState};

/// Which rate-limit headers every checked response carries (allowed or not).
///
/// * [`Legacy`](Self::Legacy): `X-RateLimit-Limit`, `X-RateLimit-Remaining`
///   and `X-RateLimit-Reset` (seconds until the deciding rule is full again,
///   rounded up; not a timestamp), for the rule that decided.
/// * [`Draft`](Self::Draft): the structured fields of
///   [draft-ietf-httpapi-ratelimit-headers-10](https://datatracker.ietf.org/doc/draft-ietf-httpapi-ratelimit-headers/10/):
///   `RateLimit-Policy` with one item per rule of the set, named
///   `"<set>.<rule index>"`, with `q` (the rule's limit) and `w` (its period
///   in seconds; a period that is not whole seconds is advertised over the
///   shortest whole-second window holding it, `q` then being what the rule
///   admits in that window, rounded down: 5 per 100 ms is `q=50;w=1`, a
///   rate: `RateLimit`'s `r` still counts against the rule's own capacity,
///   5 there), e.g.
///   `RateLimit-Policy: "api.0";q=10;w=60, "api.1";q=100;w=3600`; and
///   `RateLimit` with one item per rule, `r` (remaining) and `t` (seconds
///   until it is full again, rounded up), e.g.
///   `RateLimit: "api.0";r=7;t=42, "api.1";r=93;t=251`, each with `pk` (the
///   partition key as a byte sequence) when
///   [`partition_key`](crate::RateLimitLayerBuilder::partition_key) is on.
///   (-11 of May 2026 is the latest revision known; this follows -10.)
/// * [`Both`](Self::Both) (the default) and [`None`](Self::None).
///
/// # When `RateLimit` has one item
///
/// Redis and the local bucket count every rule, so their answers carry an
/// item per rule. The denial cache, `FailOpen` and `FailClosed` know the
/// deciding rule only (see [`Decision`]): their `RateLimit` carries that
/// rule's item, the binding one, and the other rules appear in
/// `RateLimit-Policy` only. The legacy headers always describe the deciding
/// rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum HeaderMode {
    /// `X-RateLimit-Limit`, `-Remaining`, `-Reset`.
    Legacy,
    /// `RateLimit-Policy` and `RateLimit` (draft -10).
    Draft,
    /// Both sets.
    #[default]
    Both,
    /// No rate-limit headers (a denial still carries `Retry-After`).
    None,
}

impl HeaderMode {
    pub(crate) fn legacy(self) -> bool {
        matches!(self, HeaderMode::Legacy | HeaderMode::Both)
    }

    pub(crate) fn draft(self) -> bool {
        matches!(self, HeaderMode::Draft | HeaderMode::Both)
    }
}

static X_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
static X_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
static X_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
static POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// Whole seconds, rounded up.
pub(crate) fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// A rule's quota over a window of whole seconds, as the draft's `w` must
/// be: its own limit and period when the period is whole seconds; else the
/// shortest whole-second window holding a period, and the units admitted in
/// it at the rule's rate, rounded down (5 per 100 ms is 50 per second, and
/// 20 per 1.5 s is 26 per 2 s: a client pacing itself by it stays within the
/// rule). Never 0: the window is at least a period long.
fn quota_per_whole_seconds(rule: &Rule) -> (u64, u64) {
    let period_us = rule.period_micros();
    let window = ceil_secs(rule.period()).max(1);
    if period_us == window * 1_000_000 {
        return (rule.limit(), window);
    }
    let quota = u128::from(rule.limit()) * u128::from(window) * 1_000_000 / u128::from(period_us);
    (u64::try_from(quota).unwrap_or(u64::MAX), window)
}

/// `Retry-After`: whole seconds, rounded up, at least 1 (a client told 0
/// retries at once and is denied again).
pub(crate) fn retry_after_secs(d: &Decision) -> u64 {
    ceil_secs(d.retry_after.unwrap_or(d.reset_after)).max(1)
}

/// `"<set>.<i>";q=<quota>;w=<window>` per rule: fixed per rule set, so
/// rendered once when the layer is built.
pub(crate) fn policy_value(set: &RuleSet) -> HeaderValue {
    let mut out = String::new();
    for (i, rule) in set.rules().iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        let (quota, window) = quota_per_whole_seconds(rule);
        let _ = write!(out, "\"{}.{i}\";q={quota};w={window}", set.name());
    }
    // A rule set's name is [A-Za-z0-9_.-]: always a valid header value.
    HeaderValue::try_from(out).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// Adds the headers of `mode` for `decision` on `set` to `headers`. `rules`
/// holds every rule's state when the deciding tier counted them all (see
/// [`HybridLimiter::check_with_rules`](tierlimit::HybridLimiter::check_with_rules)),
/// and is empty otherwise.
pub(crate) fn render(
    headers: &mut HeaderMap,
    mode: HeaderMode,
    set: &RuleSet,
    policy: &HeaderValue,
    decision: &Decision,
    rules: &[RuleState],
    partition_key: Option<&str>,
) {
    let reset = ceil_secs(decision.reset_after);
    // One growth of the map instead of several (an inner response often
    // starts with no headers at all).
    headers.reserve(6);
    if mode.legacy() {
        headers.insert(X_LIMIT.clone(), decision.limit.into());
        headers.insert(X_REMAINING.clone(), decision.remaining.into());
        headers.insert(X_RESET.clone(), reset.into());
    }
    if mode.draft() {
        headers.insert(POLICY.clone(), policy.clone());
        let mut field = String::new();
        let mut item = |rule: usize, remaining: u64, reset: u64| {
            if !field.is_empty() {
                field.push_str(", ");
            }
            let _ = write!(field, "\"{}.{rule}\";r={remaining};t={reset}", set.name());
            if let Some(pk) = partition_key {
                field.push_str(";pk=:");
                base64(pk.as_bytes(), &mut field);
                field.push(':');
            }
        };
        if rules.len() == set.rules().len() {
            for (i, state) in rules.iter().enumerate() {
                item(i, state.remaining, ceil_secs(state.reset_after));
            }
        } else {
            item(decision.rule, decision.remaining, reset);
        }
        if let Ok(value) = HeaderValue::try_from(field) {
            headers.insert(RATELIMIT.clone(), value);
        }
    }
}

/// Standard base64 with padding (RFC 4648), as structured fields' byte
/// sequences are written.
fn base64(bytes: &[u8], out: &mut String) {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i)) as usize & 63]));
            } else {
                out.push('=');
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tierlimit::Tier;

    #[test]
    fn base64_matches_rfc4648_vectors() {
        for (input, expected) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            let mut out = String::new();
            base64(input.as_bytes(), &mut out);
            assert_eq!(out, expected, "{input}");
        }
    }

    /// The draft's window is whole seconds: a rule of 5 per 100 ms was
    /// advertised as 5 per second (`w` rounded up, `q` kept), a tenth of
    /// what it admits.
    #[test]
    fn a_period_of_a_fraction_of_a_second_is_advertised_per_whole_seconds() -> tierlimit::Result<()>
    {
        let rule = |limit, ms| Rule::with_period(limit, Duration::from_millis(ms));
        let set = RuleSet::new(
            "fine",
            [
                rule(5, 100)?,
                rule(20, 1_500)?,
                rule(1, 2_500)?,
                rule(7, 2_000)?,
            ],
        )?;
        assert_eq!(
            policy_value(&set),
            "\"fine.0\";q=50;w=1, \"fine.1\";q=26;w=2, \"fine.2\";q=1;w=3, \"fine.3\";q=7;w=2"
        );
        Ok(())
    }

    #[test]
    fn draft_fields() -> tierlimit::Result<()> {
        let set = RuleSet::new("api", [Rule::per_minute(10)?, Rule::per_hour(100)?])?;
        let policy = policy_value(&set);
        assert_eq!(policy, "\"api.0\";q=10;w=60, \"api.1\";q=100;w=3600");
        let d = Decision::allowed(100, 7, Duration::from_millis(41_200), 1, Tier::Redis);
        let mut headers = HeaderMap::new();
        render(
            &mut headers,
            HeaderMode::Both,
            &set,
            &policy,
            &d,
            &[],
            Some("ip:1"),
        );
        assert_eq!(headers["ratelimit"], "\"api.1\";r=7;t=42;pk=:aXA6MQ==:");
        assert_eq!(headers["x-ratelimit-limit"], "100");
        assert_eq!(headers["x-ratelimit-remaining"], "7");
        assert_eq!(headers["x-ratelimit-reset"], "42");
        Ok(())
    }

    #[test]
    fn every_rule_gets_an_item_when_every_rule_was_counted() -> tierlimit::Result<()> {
        let set = RuleSet::new("api", [Rule::per_minute(10)?, Rule::per_hour(100)?])?;
        let policy = policy_value(&set);
        let d = Decision::allowed(10, 7, Duration::from_millis(18_500), 0, Tier::Redis);
        let rules = [
            RuleState::new(7, Duration::from_millis(18_500)),
            RuleState::new(97, Duration::from_secs(108)),
        ];
        let mut headers = HeaderMap::new();
        render(
            &mut headers,
            HeaderMode::Draft,
            &set,
            &policy,
            &d,
            &rules,
            None,
        );
        assert_eq!(
            headers["ratelimit"],
            "\"api.0\";r=7;t=19, \"api.1\";r=97;t=108"
        );
        Ok(())
    }

    #[test]
    fn retry_after_is_whole_seconds_rounded_up_and_at_least_one() {
        let d = |ms| Decision::denied(1, Duration::ZERO, Duration::from_millis(ms), 0, Tier::Redis);
        assert_eq!(retry_after_secs(&d(1)), 1);
        assert_eq!(retry_after_secs(&d(0)), 1);
        assert_eq!(retry_after_secs(&d(1000)), 1);
        assert_eq!(retry_after_secs(&d(1001)), 2);
    }
}
