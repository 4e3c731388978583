//! Calendar windows reset at the natural hour and day of their UTC offset
//! (UTC+5:30 and UTC-8), and not at UTC's: requests are placed with a fake
//! client clock just before and at the boundaries.

mod support;

use std::sync::Arc;
use std::time::Duration;

use tierlimit_core::{FakeClock, Rule};
use tierlimit_test::RedisServer;

use support::{client_time_tier, set};

const HOUR_US: u64 = 3_600_000_000;
const DAY_US: u64 = 24 * HOUR_US;
/// Somewhere in November 2023.
const AROUND_US: u64 = 1_700_000_000_000_000;

/// The first instant after `AROUND_US` at which the local clock (UTC +
/// `offset_s`) reads a whole `period`.
fn next_boundary(period_us: u64, offset_s: i64) -> u64 {
    let offset_us = offset_s * 1_000_000;
    let local = i64::try_from(AROUND_US).expect("fits") + offset_us;
    let period = i64::try_from(period_us).expect("fits");
    let next_local = (local / period + 1) * period;
    u64::try_from(next_local - offset_us).expect("after the epoch")
}

/// Fills the window 10 s before `boundary`, checks it stays full until 1 µs
/// before, and whether it is fresh at `boundary`. (In client-time mode TTLs
/// still run in real time: 10 s leaves the key alive however slow the machine.)
async fn resets_at(url: &str, rule: Rule, boundary: u64, expect_reset: bool, label: &str) {
    let clock = FakeClock::new(boundary - 10_000_000);
    let tier = client_time_tier(url, Arc::new(clock.clone()));
    let set = set(label, [rule]);
    for _ in 0..3 {
        assert!(
            tier.check("k", &set, 1)
                .await
                .expect("check")
                .decision
                .allowed,
            "{label}"
        );
    }
    let denied = tier.check("k", &set, 1).await.expect("check");
    assert!(!denied.decision.allowed, "{label}");
    if expect_reset {
        assert_eq!(
            denied.decision.retry_after,
            Some(Duration::from_secs(10)),
            "{label}"
        );
        assert_eq!(
            denied.decision.reset_after,
            Duration::from_secs(10),
            "{label}"
        );
    }
    clock.advance(Duration::from_micros(9_999_999));
    let v = tier.check("k", &set, 1).await.expect("check");
    assert!(
        !v.decision.allowed,
        "{label}: admitted 1 µs before the boundary"
    );
    if expect_reset {
        assert_eq!(
            v.decision.retry_after,
            Some(Duration::from_micros(1)),
            "{label}"
        );
    }
    clock.advance(Duration::from_micros(1));
    let v = tier.check("k", &set, 1).await.expect("check");
    assert_eq!(v.decision.allowed, expect_reset, "{label}: at the boundary");
    if expect_reset {
        assert_eq!(v.decision.remaining, 2, "{label}: a fresh window");
    }
}

#[tokio::test]
async fn natural_hours_and_days_follow_the_utc_offset() {
    let server = RedisServer::start();
    let url = server.url();
    for (zone, offset_s) in [("ist", 5 * 3600 + 1800), ("pst", -8 * 3600)] {
        let hourly = Rule::per_natural_hour(3, offset_s).expect("valid");
        let daily = Rule::per_natural_day(3, offset_s).expect("valid");

        let local_hour = next_boundary(HOUR_US, offset_s);
        let local_day = next_boundary(DAY_US, offset_s);
        resets_at(
            &url,
            hourly.clone(),
            local_hour,
            true,
            &format!("{zone}-hour"),
        )
        .await;
        resets_at(&url, daily.clone(), local_day, true, &format!("{zone}-day")).await;

        // UTC's midnight is not local midnight for either zone.
        let utc_day = next_boundary(DAY_US, 0);
        resets_at(&url, daily, utc_day, false, &format!("{zone}-utc-day")).await;
        // UTC's whole hours are local half hours in UTC+5:30 (and whole hours in UTC-8).
        let utc_hour = next_boundary(HOUR_US, 0);
        let expect = offset_s % 3600 == 0;
        resets_at(&url, hourly, utc_hour, expect, &format!("{zone}-utc-hour")).await;
    }
}

#[test]
fn boundaries_are_local() {
    // 18:30 UTC is midnight in UTC+5:30; 08:00 UTC is midnight in UTC-8.
    assert_eq!(
        next_boundary(DAY_US, 5 * 3600 + 1800) % DAY_US,
        18 * HOUR_US + 30 * 60_000_000
    );
    assert_eq!(next_boundary(DAY_US, -8 * 3600) % DAY_US, 8 * HOUR_US);
    assert_eq!(
        next_boundary(HOUR_US, 5 * 3600 + 1800) % HOUR_US,
        30 * 60_000_000
    );
}
