//! retry_after is honest for GCRA and the token bucket: retrying exactly
//! retry_after later is admitted, retrying 10 ms (or even 1 µs) earlier is
//! denied. Exact with a fake client clock; with server time and real sleeps,
//! the "admitted after sleeping retry_after" half always holds, and the "10 ms
//! early" half is asserted whenever the server saw the retry early.

mod support;

use std::sync::Arc;
use std::time::Duration;

use tierlimit_core::{Algorithm, Clock, FakeClock, Rule};
use tierlimit_test::RedisServer;

use support::{client_time_tier, set, tier};

/// `limit` per `period` with bursts of 2, for GCRA and the token bucket.
fn rules(limit: u64, period: Duration) -> [(Algorithm, Rule); 2] {
    [Algorithm::Gcra, Algorithm::TokenBucket].map(|a| {
        let r = Rule::with_period(limit, period)
            .and_then(|r| r.with_algorithm(a))
            .and_then(|r| r.with_burst(2))
            .expect("valid");
        (a, r)
    })
}

#[tokio::test]
async fn exactly_retry_after_is_admitted_and_earlier_is_not() {
    let server = RedisServer::start();
    // 10 per minute: 6 s per unit in fake time, and TTLs (real time) of
    // seconds, so no key expires while the test runs.
    for (algorithm, rule) in rules(10, Duration::from_secs(60)) {
        for cost in [1, 2] {
            let label = format!("{algorithm:?} cost {cost}");
            let clock = FakeClock::new(1_700_000_000_000_000);
            let tier = client_time_tier(&server.url(), Arc::new(clock.clone()));
            let set = set(&format!("retry{}c{cost}", algorithm.code()), [rule.clone()]);
            // Use up the burst, then ask for `cost` again.
            assert!(
                tier.check("k", &set, 2)
                    .await
                    .expect("check")
                    .decision
                    .allowed
            );
            clock.advance(Duration::from_millis(1_500));
            let denied = tier.check("k", &set, cost).await.expect("check");
            assert!(!denied.decision.allowed, "{label}");
            let wait = denied.decision.retry_after.expect("denied");
            // 6 s per unit, 1.5 s of which already refilled.
            assert_eq!(wait, Duration::from_millis(6_000 * cost - 1_500), "{label}");

            for early in [Duration::from_millis(10), Duration::from_micros(1)] {
                let probe = FakeClock::new(clock.unix_micros());
                probe.advance(wait - early);
                let early_tier = client_time_tier(&server.url(), Arc::new(probe));
                let v = early_tier.check("k", &set, cost).await.expect("check");
                assert!(!v.decision.allowed, "{label}: admitted {early:?} early");
            }
            clock.advance(wait);
            let v = tier.check("k", &set, cost).await.expect("check");
            assert!(
                v.decision.allowed,
                "{label}: denied after exactly retry_after"
            );
        }
    }
}

#[tokio::test]
async fn sleeping_retry_after_is_enough_with_server_time() {
    let server = RedisServer::start();
    let tier = tier(&server.url());
    // 10 per second: 100 ms per unit.
    for (algorithm, rule) in rules(10, Duration::from_secs(1)) {
        let set = set(&format!("sleep{}", algorithm.code()), [rule]);
        assert!(
            tier.check("k", &set, 2)
                .await
                .expect("check")
                .decision
                .allowed
        );
        let denied = tier.check("k", &set, 1).await.expect("check");
        let wait = denied.decision.retry_after.expect("denied");
        assert!(wait > Duration::from_millis(50), "{algorithm:?}: {wait:?}");

        tokio::time::sleep(wait - Duration::from_millis(10)).await;
        let early = tier.check("k", &set, 1).await.expect("check");
        let seen_after = Duration::from_micros(early.server_time_us - denied.server_time_us);
        if seen_after >= wait {
            // A slow machine delivered the "early" retry late: then it must pass.
            eprintln!("{algorithm:?}: the early retry reached the server after {seen_after:?}");
            assert!(
                early.decision.allowed,
                "{algorithm:?}: denied after retry_after"
            );
            continue;
        }
        assert!(
            !early.decision.allowed,
            "{algorithm:?}: admitted {seen_after:?} after a {wait:?} wait"
        );
        // Sleep out the rest of retry_after, counted from the denial.
        tokio::time::sleep(wait - seen_after).await;
        let v = tier.check("k", &set, 1).await.expect("check");
        assert!(
            v.decision.allowed,
            "{algorithm:?}: denied after retry_after"
        );
    }
}
