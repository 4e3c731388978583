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

/// Checks three times in a window and once in the next one, with `algorithm`;
/// returns the `PEXPIRE` calls and the key's PTTL after the first window's
/// checks and after the next window's.
async fn two_windows(algorithm: Algorithm) -> ((u64, i64), (u64, i64)) {
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
    let first = (
        server.command_calls("pexpire").await,
        pttl_ms(&server, &key).await,
    );
    clock.advance(Duration::from_secs(2));
    let v = tier.check("k", &set, 1).await.expect("check");
    assert!(v.decision.allowed);
    let next = (
        server.command_calls("pexpire").await,
        pttl_ms(&server, &key).await,
    );
    (first, next)
}

#[tokio::test]
async fn a_fixed_window_sets_its_ttl_once_per_window() {
    let ((pexpires, ttl), (pexpires_next, ttl_next)) = two_windows(Algorithm::FixedWindow).await;
    assert_eq!(
        pexpires, 1,
        "one PEXPIRE for three admissions in one window"
    );
    // 1 s left in the window (client time; the bounds leave real time room to pass).
    assert!((500..=1_000).contains(&ttl), "PTTL {ttl} ms");
    assert_eq!(pexpires_next, 2, "the next window sets the TTL again");
    // 9 s left in the next window.
    assert!((8_000..=9_000).contains(&ttl_next), "PTTL {ttl_next} ms");
}

#[tokio::test]
async fn a_sliding_window_sets_its_ttl_once_per_window() {
    let ((pexpires, ttl), (pexpires_next, ttl_next)) = two_windows(Algorithm::SlidingWindow).await;
    assert_eq!(
        pexpires, 1,
        "one PEXPIRE for three admissions in one window"
    );
    // The window's count matters until a period after its end: 1 s + 10 s.
    assert!((10_000..=11_000).contains(&ttl), "PTTL {ttl} ms");
    assert_eq!(pexpires_next, 2, "the next window sets the TTL again");
    assert!((18_000..=19_000).contains(&ttl_next), "PTTL {ttl_next} ms");
}
