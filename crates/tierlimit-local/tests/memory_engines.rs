//! Regression: a check refused a bucket (the maps full) still left the
//! engine made for its rule set in the engine map until the next prune.
//! Sets built per request, each with limits of its own (a user's plan), took
//! memory without bound between prunes: a 4 MiB local tier grew by hundreds
//! of MB. An engine no bucket holds now goes with the refusal.
//!
//! One test in its own binary, so the resident-memory reading is its alone.

use std::time::Duration;

use tierlimit_core::{MAX_RULES, Rule, RuleSet};
use tierlimit_local::LocalAnswer;

mod support;

use support::{assert_within, bounded_tier, resident_bytes};

#[test]
fn sets_with_limits_of_their_own_stay_within_the_byte_bound() {
    const BUDGET: usize = 4 << 20;
    let local = bounded_tier(BUDGET);
    let name = "n".repeat(64);
    let before = resident_bytes();
    let (mut decided, mut full) = (0u64, 0u64);
    for i in 0..50_000u64 {
        // Every request its own limits: a set, and an engine, of its own.
        let rules = (1..=MAX_RULES as u64).map(|r| {
            Rule::with_period(1_000 * r + i, Duration::from_secs(60 * r)).expect("valid rule")
        });
        let set = RuleSet::new(name.as_str(), rules).expect("valid set");
        match local.check(&format!("u{i}"), &set, 1, 1, false) {
            LocalAnswer::Decided(_) => decided += 1,
            _ => full += 1,
        }
    }
    let grown = resident_bytes().saturating_sub(before);
    eprintln!(
        "{decided} keys decided locally, {full} refused; {} bytes charged, resident memory grew {grown} bytes (budget {BUDGET})",
        local.bytes()
    );
    assert_within(BUDGET, local.bytes(), full, grown);
}
