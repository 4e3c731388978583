//! Argument forms shared by the subcommands.

use std::time::Duration;

/// Parses a duration as the config file does (`500ms`, `30s`, `2m`, `1h`:
/// one count, one unit, no fraction), so one text means one length
/// everywhere.
pub(crate) fn duration(text: &str) -> Result<Duration, String> {
    tierlimit_core::parse_duration(text).map_err(|e| e.to_string())
}
