//! Regression: the byte bound did not charge the rule set each local key
//! keeps. A caller that builds its `RuleSet` per request (limits from the
//! user's plan, say) gave every key a copy of its own: up to several KB for a
//! set of 16 rules, none of it charged, so the process outgrew `max_bytes`
//! many times over. Keys now share one copy per distinct set, charged once.
//!
//! One test in its own binary, so the resident-memory reading is its alone.

use std::time::Duration;

use tierlimit_core::{Decision, MAX_RULES, Rule, RuleSet, Tier};
use tierlimit_local::LocalAnswer;

mod support;

use support::{assert_within, bounded_tier, resident_bytes};

/// The largest set there is: a name of 64 characters and 16 rules.
fn big_set(name: &str) -> RuleSet {
    let rules = (1..=MAX_RULES as u64)
        .map(|i| Rule::with_period(1_000 * i, Duration::from_secs(60 * i)).expect("valid rule"));
    RuleSet::new(name, rules).expect("valid set")
}

#[test]
fn a_rule_set_built_per_request_stays_within_the_byte_bound() {
    const BUDGET: usize = 4 << 20;
    let local = bounded_tier(BUDGET);
    let name = "n".repeat(64);
    let before = resident_bytes();
    let (mut decided, mut full) = (0u64, 0u64);
    for i in 0..50_000u64 {
        // Short keys: inline in the map, so only the set could take memory.
        let key = format!("u{i}");
        let set = big_set(&name);
        match local.check(&key, &set, 1, 1, false) {
            LocalAnswer::Decided(_) => decided += 1,
            _ => full += 1,
        }
        let denied = Decision::denied(
            1_000,
            Duration::from_secs(60),
            Duration::from_secs(60),
            0,
            Tier::Redis,
        );
        local.cache_denial(&key, &set, 1, &denied);
        local.remember(
            &key,
            &set,
            (0..MAX_RULES).map(|_| (5, Duration::from_secs(60))),
            local.outage(),
        );
    }
    let grown = resident_bytes().saturating_sub(before);
    eprintln!(
        "{decided} keys decided locally, {full} refused; {} bytes charged, resident memory grew {grown} bytes (budget {BUDGET})",
        local.bytes()
    );
    assert_within(BUDGET, local.bytes(), full, grown);
}
