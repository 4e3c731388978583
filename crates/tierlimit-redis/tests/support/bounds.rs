//! The bodies of `exact_bounds.rs`'s tests, on any server or Cluster and
//! any key (the Cluster tests run them on keys of every master).
//!
//! Regression (issue 9, item 22): counters stopped at 2^53. A rule of
//! `with_period(2^53, 2^53 µs)` was accepted, and in the scripts' doubles
//! `c + 1` rounded back to `c`: a sliding window admitted everything and a
//! fixed window answered `remaining = -1`. Rules now stop at `MAX_LIMIT`
//! (2^51) and `MAX_REFILL_US` (2^52; `bad_input.rs` shows one more refused);
//! here the largest accepted values count exactly on Redis, to the last unit.

use std::sync::Arc;
use std::time::Duration;

use tierlimit_core::{Algorithm, FakeClock, MAX_LIMIT, MAX_REFILL_US, Rule, RuleSet};
use tierlimit_redis::RedisTier;

use crate::support::{client_time_tier, set};

/// Half past some hour.
const NOW_US: u64 = 1_700_000_000_000_000 + 30 * 60_000_000;

/// `MAX_LIMIT - 1`, then 1, then 1 more: admitted with 1 and 0 left, then
/// denied; every count is exact.
async fn count_to_the_limit(tier: &RedisTier, key: &str, set: &RuleSet, label: &str) {
    let v = tier.check(key, set, MAX_LIMIT - 1).await.expect("check");
    assert!(v.decision.allowed, "{label}");
    assert_eq!(v.decision.remaining, 1, "{label}");
    let v = tier.check(key, set, 1).await.expect("check");
    assert!(v.decision.allowed, "{label}");
    assert_eq!(v.decision.remaining, 0, "{label}");
    let v = tier.check(key, set, 1).await.expect("check");
    assert!(!v.decision.allowed, "{label}: one over the limit");
    assert_eq!(v.decision.remaining, 0, "{label}");
}

/// The body of the test of this name, on `key` at `url`.
pub(crate) async fn the_largest_limits_count_exactly(url: &str, key: &str) {
    let clock = FakeClock::new(NOW_US);
    let tier = client_time_tier(url, Arc::new(clock.clone()));
    // A rule starts as GCRA, which needs period >= limit µs: 2^51 µs, so the
    // arrival time is now + 2^51, exact. Windows of 2^51 µs are all the same
    // to the window algorithms.
    let period = Duration::from_micros(MAX_LIMIT);
    let largest = |algorithm| {
        Rule::with_period(MAX_LIMIT, period)
            .and_then(|r| r.with_algorithm(algorithm))
            .expect("the largest limit is accepted")
    };
    for algorithm in [
        Algorithm::Gcra,
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
    ] {
        let set = set(&format!("r{}", algorithm.code()), [largest(algorithm)]);
        count_to_the_limit(&tier, key, &set, &format!("{algorithm:?}")).await;
    }

    // The sliding window's largest sum: a full previous window weighted by a
    // half, plus a cost: 2^50 + 2^50 fits exactly, one more does not.
    let set = set("r4", [largest(Algorithm::SlidingWindow)]);
    let window_start = NOW_US - NOW_US % MAX_LIMIT;
    clock.advance(Duration::from_micros(
        window_start + MAX_LIMIT + MAX_LIMIT / 2 - NOW_US,
    ));
    let v = tier.check(key, &set, MAX_LIMIT / 2).await.expect("check");
    assert!(
        v.decision.allowed,
        "half the previous window's weight is left"
    );
    assert_eq!(v.decision.remaining, 0);
    let v = tier.check(key, &set, 1).await.expect("check");
    assert!(!v.decision.allowed, "2^50 + 2^50 + 1 is over 2^51");
}

/// The body of the test of this name, on `key` at `url`.
pub(crate) async fn the_longest_refill_is_exact(url: &str, key: &str) {
    let clock = FakeClock::new(NOW_US);
    let tier = client_time_tier(url, Arc::new(clock.clone()));
    let longest = Duration::from_micros(MAX_REFILL_US);
    for algorithm in [Algorithm::Gcra, Algorithm::TokenBucket] {
        let r = Rule::with_period(1, longest)
            .and_then(|r| r.with_algorithm(algorithm))
            .expect("the longest refill is accepted");
        let set = set(&format!("l{}", algorithm.code()), [r]);
        let v = tier.check(key, &set, 1).await.expect("check");
        assert!(v.decision.allowed, "{algorithm:?}");
        assert_eq!(v.decision.reset_after, longest, "{algorithm:?}");
        let v = tier.check(key, &set, 1).await.expect("check");
        assert!(!v.decision.allowed, "{algorithm:?}");
        let retry = v.decision.retry_after.expect("denied");
        if algorithm == Algorithm::Gcra {
            assert_eq!(retry, longest);
        } else {
            // The token bucket compares with a slack of 1e-9 tokens
            // (lua/token_bucket.lua), which at one unit per 2^52 µs is 4.5 s:
            // retry-after may be that much early, one part in 10^9.
            let early = longest - retry.min(longest);
            assert!(
                retry <= longest && early.as_secs_f64() <= longest.as_secs_f64() * 1e-9,
                "{retry:?}"
            );
        }
    }
}
