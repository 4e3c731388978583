//! No single script call may hold Redis' one thread for long, and every number
//! the scripts add up stays exact: the largest accepted rules, costs and
//! write-backs, measured in server time (`INFO commandstats`).

mod support;

use std::sync::Arc;
use std::time::Duration;

use support::{client_time_tier, rule, set, storage_key};
use tierlimit_core::{Algorithm, FakeClock, LedgerEntry, MAX_SLIDING_LOG_LIMIT};
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

/// Issue 9, items 18 and 22 together: a ledger entry saturated at u64::MAX
/// units (a hot key under FailOpen) is written back like any other: at most
/// the limit applied, in milliseconds, every member distinct (past 2^53 a
/// unit counter in a double stops changing).
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
