//! No single script call may hold Redis' one thread for long, and every number
//! the scripts add up stays exact: the largest accepted rules, costs and
//! write-backs, measured in server time (`INFO commandstats`).

mod support;

use std::sync::Arc;
use std::time::Duration;

use support::{ALGORITHMS, client_time_tier, rule, set, storage_key, tier};
use tierlimit_core::{
    Algorithm, Error, FakeClock, LedgerEntry, MAX_LIMIT, MAX_SLIDING_LOG_LIMIT, Rule,
};
use tierlimit_redis::{WriteBack, Written};
use tierlimit_test::RedisServer;

/// Server time of the slowest script call so far, from `INFO commandstats`
/// (evalsha's total µs over its calls would hide one slow call among fast ones,
/// so each test resets the stats and makes one heavy call at a time).
async fn server_us_of_evalsha(server: &RedisServer) -> u64 {
    let mut conn = server.conn().await;
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .expect("info");
    info.lines()
        .find(|l| l.starts_with("cmdstat_evalsha:"))
        .and_then(|l| l.split(',').find(|f| f.starts_with("usec=")))
        .and_then(|f| f["usec=".len()..].parse().ok())
        .unwrap_or(0)
}

async fn reset_stats(server: &RedisServer) {
    let mut conn = server.conn().await;
    let () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut conn)
        .await
        .expect("resetstat");
}

/// The bound on one call's server time: half the checks' default deadline
/// (Redis runs one script at a time, so a longer call would make other
/// clients' checks time out), with room for a slow, noisy machine. The issue
/// measured 4.6-6.2 s for the unbounded log.
const MAX_CALL: Duration = Duration::from_millis(25);

/// Regression (issue 9, item 9): the sliding log added one member per unit
/// with no bound, so `per_hour(1_000_000)` with one check of cost 1,000,000
/// blocked Redis for seconds. The largest accepted log, with its largest cost,
/// runs in milliseconds; a larger one is refused when the rule is built.
#[tokio::test]
async fn the_largest_sliding_log_check_takes_milliseconds_of_server_time() {
    assert!(matches!(
        Rule::per_hour(MAX_SLIDING_LOG_LIMIT + 1).and_then(|r| r.with_algorithm(Algorithm::SlidingLog)),
        Err(Error::SlidingLogTooLarge { limit, max }) if limit == MAX_SLIDING_LOG_LIMIT + 1 && max == MAX_SLIDING_LOG_LIMIT
    ));
    assert!(matches!(
        Rule::per_hour(1_000_000_000).and_then(|r| r.with_algorithm(Algorithm::SlidingLog)),
        Err(Error::SlidingLogTooLarge { .. })
    ));
    let server = RedisServer::start();
    let tier = tier(&server.url());
    let log = set(
        "log",
        [rule(
            Algorithm::SlidingLog,
            MAX_SLIDING_LOG_LIMIT,
            Duration::from_secs(3600),
        )],
    );
    reset_stats(&server).await;
    let v = tier
        .check("k", &log, MAX_SLIDING_LOG_LIMIT)
        .await
        .expect("check");
    assert!(v.decision.allowed);
    let took = Duration::from_micros(server_us_of_evalsha(&server).await);
    eprintln!("sliding log, cost {MAX_SLIDING_LOG_LIMIT}: {took:?} of server time");
    assert!(took < MAX_CALL, "one check held Redis for {took:?}");
    // And a full log denies in milliseconds too.
    reset_stats(&server).await;
    assert!(
        !tier
            .check("k", &log, 1)
            .await
            .expect("check")
            .decision
            .allowed
    );
    let took = Duration::from_micros(server_us_of_evalsha(&server).await);
    assert!(took < MAX_CALL, "a denial held Redis for {took:?}");
}

/// Regression (issue 9, item 18): writing back a sliding log looped once per
/// owed unit; 25 M owed units stalled Redis 4.4-5.2 s. The work is bounded by
/// the window: a write-back owing u64::MAX units (a ledger saturated under
/// FailOpen) applies at most the limit, in milliseconds.
#[tokio::test]
async fn writing_back_millions_of_sliding_log_units_takes_milliseconds() {
    const NOW_US: u64 = 1_800_000_000_000_000;
    let server = RedisServer::start();
    let clock = FakeClock::new(NOW_US);
    let tier = client_time_tier(&server.url(), Arc::new(clock.clone()));
    let r = rule(
        Algorithm::SlidingLog,
        MAX_SLIDING_LOG_LIMIT,
        Duration::from_secs(3600),
    );
    let log = set("log", [r.clone()]);
    for (id, units) in [("a", 25_000_000), ("b", u64::MAX)] {
        let key = format!("k{id}");
        let entry = LedgerEntry::new(
            storage_key(&log, &key, 0),
            r.clone(),
            units,
            NOW_US - 60_000_000,
            NOW_US - 1_000,
        );
        reset_stats(&server).await;
        let outcome = tier
            .reconcile(&[WriteBack::new(id, &entry)])
            .await
            .expect("reconcile");
        let outcome: Vec<Written> = outcome.into_iter().map(|o| o.expect("applied")).collect();
        assert_eq!(
            outcome,
            vec![Written::Applied(MAX_SLIDING_LOG_LIMIT)],
            "{units} units"
        );
        let took = Duration::from_micros(server_us_of_evalsha(&server).await);
        eprintln!("sliding log write-back of {units} units: {took:?} of server time");
        assert!(took < MAX_CALL, "{units} units held Redis for {took:?}");
        assert!(
            !tier
                .check(&key, &log, 1)
                .await
                .expect("check")
                .decision
                .allowed
        );
    }
}

/// Regression (issue 9, item 22): `with_period(2^53, 2^53 µs)` was accepted;
/// in the scripts' doubles `c + 1` rounded back, so a sliding window admitted
/// everything and a fixed window answered `remaining = -1`. The largest
/// accepted limit and period (2^52) count exactly in every algorithm; one more
/// is refused.
#[tokio::test]
async fn counters_stay_exact_at_the_largest_accepted_limit() {
    assert!(matches!(
        Rule::with_period(MAX_LIMIT + 1, Duration::from_secs(3600)),
        Err(Error::LimitTooLarge { .. })
    ));
    assert!(matches!(
        Rule::with_period(1, Duration::from_micros(MAX_LIMIT + 1)),
        Err(Error::PeriodTooLong { .. })
    ));
    assert!(matches!(
        Rule::with_period(1 << 53, Duration::from_micros(1 << 53)),
        Err(Error::LimitTooLarge { .. })
    ));
    let server = RedisServer::start();
    // Time stands still: at one unit per µs, GCRA and the token bucket would
    // otherwise refill between calls.
    let tier = client_time_tier(
        &server.url(),
        Arc::new(FakeClock::new(1_800_000_000_000_000)),
    );
    for algorithm in ALGORITHMS {
        if algorithm == Algorithm::SlidingLog {
            continue; // bounded far lower, above
        }
        let r = Rule::with_period(MAX_LIMIT, Duration::from_micros(MAX_LIMIT))
            .and_then(|r| r.with_algorithm(algorithm))
            .expect("the largest accepted rule");
        let s = set("max", [r]);
        let key = format!("{algorithm:?}");
        let v = tier.check(&key, &s, MAX_LIMIT - 1).await.expect("check");
        assert!(v.decision.allowed, "{algorithm:?}");
        assert_eq!(v.decision.remaining, 1, "{algorithm:?}");
        let v = tier.check(&key, &s, 1).await.expect("check");
        assert!(v.decision.allowed, "{algorithm:?}: the last unit");
        assert_eq!(v.decision.remaining, 0, "{algorithm:?}");
        let v = tier.check(&key, &s, 1).await.expect("a well-formed reply");
        assert!(!v.decision.allowed, "{algorithm:?}: one past the limit");
        assert_eq!(v.decision.remaining, 0, "{algorithm:?}");
    }
}
