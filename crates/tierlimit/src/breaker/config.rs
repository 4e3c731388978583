//! The breaker's settings.

use std::fmt;
use std::time::Duration;

use tierlimit_core::Error;

/// The largest window: a ring of one byte per call. Larger windows react too slowly
/// to an outage to be useful in front of a rate limiter.
pub(super) const MAX_WINDOW: u32 = 65_536;
/// The longest cool-down: a longer wait would keep the limiter on the local tier long
/// after Redis came back.
pub(super) const MAX_COOL_DOWN: Duration = Duration::from_secs(24 * 60 * 60);

/// Settings of the limiter's circuit breaker.
///
/// The defaults suit a Redis tier whose calls have a deadline of tens of
/// milliseconds. Change fields on a default value, then [`validate`](Self::validate)
/// (or let [`HybridLimiterBuilder::build`](crate::HybridLimiterBuilder::build) do it).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tierlimit::BreakerConfig;
///
/// let mut config = BreakerConfig::default();
/// config.cool_down = Duration::from_millis(100);
/// config.validate()?;
///
/// config.minimum_calls = config.window_size + 1;
/// assert!(config.validate().unwrap_err().to_string().contains("minimum_calls"));
/// # Ok::<(), tierlimit_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct BreakerConfig {
    /// Trip after this many consecutive failed or timed-out calls, whatever the
    /// window says. At least 1; default 5.
    pub consecutive_failures: u32,
    /// How many of the most recent calls the failure and slow-call rates are
    /// computed over. 1 to 65 536; default 50.
    pub window_size: u32,
    /// Rates are not judged until the window holds this many calls, so low traffic
    /// never trips on a handful of failures. 1 to `window_size`; default 20.
    pub minimum_calls: u32,
    /// Trip when at least this fraction of the window failed. In (0, 1]; default 0.5.
    pub failure_rate_threshold: f64,
    /// A call, successful or not, taking at least this long is slow. Not zero,
    /// below the Redis deadline; default 40 ms.
    pub slow_call_threshold: Duration,
    /// Trip when at least this fraction of the window was slow. In (0, 1]; default 0.8.
    pub slow_call_rate_threshold: f64,
    /// The wait after tripping before the first probe. Not zero, at most
    /// `max_cool_down`; default 250 ms.
    pub cool_down: Duration,
    /// No cool-down, after backoff and jitter, is longer than this. At most one day;
    /// default 5 s.
    pub max_cool_down: Duration,
    /// Each failed probe multiplies the cool-down by this. At least 1 (1: no
    /// backoff); default 2.
    pub backoff_multiplier: f64,
    /// Each cool-down is multiplied by a uniform random factor in
    /// `[1 - jitter, 1]`, so instances that tripped together do not probe together,
    /// and jitter never pushes a cool-down above `max_cool_down`. In [0, 1);
    /// default 0.2.
    pub jitter: f64,
    /// Ask for a new connection after this many consecutive timeouts: a timeout
    /// never makes redis' `ConnectionManager` reconnect, so on a hung server it
    /// would keep the dead socket. At least 1; default 3.
    pub replace_connection_after: u32,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig {
            consecutive_failures: 5,
            window_size: 50,
            minimum_calls: 20,
            failure_rate_threshold: 0.5,
            slow_call_threshold: Duration::from_millis(40),
            slow_call_rate_threshold: 0.8,
            cool_down: Duration::from_millis(250),
            max_cool_down: Duration::from_secs(5),
            backoff_multiplier: 2.0,
            jitter: 0.2,
            replace_connection_after: 3,
        }
    }
}

impl BreakerConfig {
    /// Checks every setting; the error names the first one out of range.
    pub fn validate(&self) -> Result<(), Error> {
        // Comparisons written so that NaN fails every one of them.
        let fraction = |x: f64| x > 0.0 && x <= 1.0;
        let c = self;
        check(
            "consecutive_failures",
            c.consecutive_failures >= 1,
            "at least 1",
            &c.consecutive_failures,
        )?;
        check(
            "window_size",
            (1..=MAX_WINDOW).contains(&c.window_size),
            format!("1 to {MAX_WINDOW}"),
            &c.window_size,
        )?;
        check(
            "minimum_calls",
            (1..=c.window_size).contains(&c.minimum_calls),
            format!("1 to window_size ({})", c.window_size),
            &c.minimum_calls,
        )?;
        check(
            "failure_rate_threshold",
            fraction(c.failure_rate_threshold),
            "in (0, 1]",
            &c.failure_rate_threshold,
        )?;
        check(
            "slow_call_threshold",
            !c.slow_call_threshold.is_zero(),
            "above zero",
            &c.slow_call_threshold,
        )?;
        check(
            "slow_call_rate_threshold",
            fraction(c.slow_call_rate_threshold),
            "in (0, 1]",
            &c.slow_call_rate_threshold,
        )?;
        check(
            "cool_down",
            !c.cool_down.is_zero(),
            "above zero",
            &c.cool_down,
        )?;
        check(
            "max_cool_down",
            c.cool_down <= c.max_cool_down && c.max_cool_down <= MAX_COOL_DOWN,
            format!(
                "between cool_down ({:?}) and {MAX_COOL_DOWN:?}",
                c.cool_down
            ),
            &c.max_cool_down,
        )?;
        check(
            "backoff_multiplier",
            c.backoff_multiplier >= 1.0 && c.backoff_multiplier.is_finite(),
            "finite and at least 1",
            &c.backoff_multiplier,
        )?;
        check(
            "jitter",
            (0.0..1.0).contains(&c.jitter),
            "in [0, 1)",
            &c.jitter,
        )?;
        check(
            "replace_connection_after",
            c.replace_connection_after >= 1,
            "at least 1",
            &c.replace_connection_after,
        )
    }
}

fn check(
    field: &str,
    ok: bool,
    range: impl fmt::Display,
    got: &dyn fmt::Debug,
) -> Result<(), Error> {
    if ok {
        return Ok(());
    }
    Err(Error::InvalidConfig {
        what: format!("breaker {field} must be {range} (got {got:?})"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_config_names_the_field() {
        type Breakage = fn(&mut BreakerConfig);
        let cases: [(&str, Breakage); 15] = [
            ("consecutive_failures", |c| c.consecutive_failures = 0),
            ("window_size", |c| c.window_size = 0),
            ("window_size", |c| c.window_size = MAX_WINDOW + 1),
            ("minimum_calls", |c| c.minimum_calls = 0),
            ("minimum_calls", |c| c.minimum_calls = c.window_size + 1),
            ("failure_rate_threshold", |c| c.failure_rate_threshold = 0.0),
            ("failure_rate_threshold", |c| {
                c.failure_rate_threshold = f64::NAN
            }),
            ("slow_call_threshold", |c| {
                c.slow_call_threshold = Duration::ZERO
            }),
            ("slow_call_rate_threshold", |c| {
                c.slow_call_rate_threshold = 1.5
            }),
            ("cool_down", |c| c.cool_down = Duration::ZERO),
            ("max_cool_down", |c| c.max_cool_down = c.cool_down / 2),
            ("max_cool_down", |c| {
                c.max_cool_down = MAX_COOL_DOWN + Duration::from_secs(1)
            }),
            ("backoff_multiplier", |c| c.backoff_multiplier = 0.5),
            ("jitter", |c| c.jitter = 1.0),
            ("replace_connection_after", |c| {
                c.replace_connection_after = 0
            }),
        ];
        for (field, breakage) in cases {
            let mut config = BreakerConfig::default();
            breakage(&mut config);
            match config.validate() {
                Err(Error::InvalidConfig { what }) => {
                    assert!(
                        what.starts_with(&format!("breaker {field} must be")),
                        "{field}: {what}"
                    )
                }
                other => panic!("{field}: expected InvalidConfig, got {other:?}"),
            }
        }
    }

    #[test]
    fn defaults_and_edges_are_valid() {
        assert!(BreakerConfig::default().validate().is_ok());
        let edges = BreakerConfig {
            consecutive_failures: 1,
            window_size: 1,
            minimum_calls: 1,
            failure_rate_threshold: 1.0,
            slow_call_rate_threshold: 1.0,
            max_cool_down: Duration::from_millis(250),
            backoff_multiplier: 1.0,
            jitter: 0.0,
            replace_connection_after: 1,
            ..BreakerConfig::default()
        };
        assert!(edges.validate().is_ok());
    }
}
