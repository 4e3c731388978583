//! Regression (issue 9, item 21): local memory was bounded by entry count, not
//! by bytes. With Redis down and FailOpen, 200,000 keys of 512 bytes (1,536
//! once escaped) took 321 MB, projecting to about 1.7 GB at the default 1 M
//! ledger entries. The local tier's maps are now bounded by bytes too, and the
//! process's resident memory follows the bound.
//!
//! One test in its own binary, so the resident-memory reading is its alone.

use tierlimit_core::{Rule, RuleSet, escape_key};
use tierlimit_local::LocalAnswer;

mod support;

use support::{assert_within, bounded_tier, resident_bytes};

#[test]
fn memory_is_bounded_by_bytes() {
    const BUDGET: usize = 32 << 20;
    let local = bounded_tier(BUDGET);
    let set = RuleSet::new("api", [Rule::per_hour(100).expect("valid")]).expect("valid");
    let before = resident_bytes();
    let (mut decided, mut full) = (0u64, 0u64);
    // The longest keys there are: 512 characters, each escaped to 3.
    for i in 0..200_000u64 {
        let raw = format!("{i:0>12}{}", "{".repeat(500));
        let key = escape_key(&raw);
        assert_eq!(key.len(), 12 + 3 * 500);
        match local.check(&key, &set, 1, 1, true) {
            LocalAnswer::Decided(_) => decided += 1,
            _ => full += 1,
        }
        local.cache_denial(
            &key,
            &set,
            1,
            &tierlimit_core::Decision::denied(
                100,
                std::time::Duration::from_secs(60),
                std::time::Duration::from_secs(60),
                0,
                tierlimit_core::Tier::Redis,
            ),
        );
        local.remember(
            &key,
            &set,
            [(5, std::time::Duration::from_secs(60))].into_iter(),
            local.outage(),
        );
    }
    let grown = resident_bytes().saturating_sub(before);
    eprintln!(
        "{decided} keys decided locally, {full} refused; {} bytes charged, resident memory grew {grown} bytes (budget {BUDGET})",
        local.bytes()
    );
    assert!(
        decided < 200_000 / 10,
        "{decided} long keys fit in {BUDGET} bytes: the entry bound, not bytes, held"
    );
    assert_within(BUDGET, local.bytes(), full, grown);
}
