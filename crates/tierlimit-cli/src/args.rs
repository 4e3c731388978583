//! Argument forms shared by the subcommands.

use std::time::Duration;

use tierlimit::BreakerConfig;

/// Parses a duration as the config file does (`500ms`, `30s`, `2m`, `1h`:
/// one count, one unit, no fraction), so one text means one length
/// everywhere.
pub(crate) fn duration(text: &str) -> Result<Duration, String> {
    tierlimit_core::parse_duration(text).map_err(|e| e.to_string())
}

/// The breaker for a command line's `--deadline`: the defaults, with the
/// slow-call threshold below a deadline shorter than it (four fifths of the
/// deadline), which the library refuses to leave at or past the deadline.
pub(crate) fn breaker_for(deadline: Duration) -> BreakerConfig {
    let mut b = BreakerConfig::default();
    if b.slow_call_threshold >= deadline {
        b.slow_call_threshold = deadline.mul_f64(0.8);
    }
    b
}
