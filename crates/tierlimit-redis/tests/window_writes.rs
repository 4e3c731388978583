//! A window's key expires at an instant fixed by its window (the end, or a
//! period after it for the sliding window), so only the write that starts a
//! window sets its TTL: later admissions in that window write the count alone,
//! without `PEXPIRE`. The first admission of the next window must set the TTL
//! again, or the key would expire with the old window and forget the new
//! window's count (over-admitting).
//!
//! The tier runs on a fake client clock, so the windows are where the test
//! puts them: 9 s into a 10 s window, then 2 s later, 1 s into the next.

mod support;

use std::sync::Arc;
use std::time::Duration;

use tierlimit_core::{Algorithm, Clock, FakeClock, SystemClock};
use tierlimit_test::RedisServer;

use support::{client_time_tier, rule, set, storage_key};

const PERIOD: Duration = Duration::from_secs(10);

async fn pttl_ms(server: &RedisServer, key: &str) -> i64 {
    redis::cmd("PTTL")
        .arg(key)
        .query_async(&mut server.conn().await)
        .await
        .expect("PTTL")
}

/// Checks three times in a window, then once in the next one, with
/// `algorithm`; asserts one `PEXPIRE` per window, and the key's PTTL (ms)
/// after each window's checks within `first` and `next`.
async fn ttl_once_per_window(
    algorithm: Algorithm,
    first: std::ops::RangeInclusive<i64>,
    next: std::ops::RangeInclusive<i64>,
) {
    let server = RedisServer::start();
    let period_us = PERIOD.as_micros() as u64;
    let now = SystemClock.unix_micros();
    let clock = Arc::new(FakeClock::new(now - now % period_us + period_us * 9 / 10));
    let tier = client_time_tier(&server.url(), clock.clone());
    let set = set("win", [rule(algorithm, 100, PERIOD)]);
    let key = storage_key(&set, "k", 0);

    for _ in 0..3 {
        let v = tier.check("k", &set, 1).await.expect("check");
        assert!(v.decision.allowed);
    }
    assert_eq!(
        server.command_calls("pexpire").await,
        1,
        "one PEXPIRE for three admissions in one window"
    );
    // The bounds leave real time room to pass (a few ms here).
    let ttl = pttl_ms(&server, &key).await;
    assert!(first.contains(&ttl), "PTTL {ttl} ms, expected {first:?}");

    clock.advance(Duration::from_secs(2));
    let v = tier.check("k", &set, 1).await.expect("check");
    assert!(v.decision.allowed);
    assert_eq!(
        server.command_calls("pexpire").await,
        2,
        "the next window sets the TTL again"
    );
    let ttl = pttl_ms(&server, &key).await;
    assert!(next.contains(&ttl), "PTTL {ttl} ms, expected {next:?}");
}

#[tokio::test]
async fn a_fixed_window_sets_its_ttl_once_per_window() {
    // 1 s left in the first window, then 9 s in the next.
    ttl_once_per_window(Algorithm::FixedWindow, 500..=1_000, 8_000..=9_000).await;
}

#[tokio::test]
async fn a_sliding_window_sets_its_ttl_once_per_window() {
    // A window's count matters until a period after its end: 1 s + 10 s,
    // then 9 s + 10 s.
    ttl_once_per_window(Algorithm::SlidingWindow, 10_000..=11_000, 18_000..=19_000).await;
}
