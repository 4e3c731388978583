//! The server time of one script call is bounded by the rule, never by a
//! request's cost or by the units an outage owes: measured by Redis itself
//! (`SLOWLOG`, µs per command), not by the client's clock.

mod support;

use std::sync::Arc;
use std::time::Duration;

use tierlimit_core::{Algorithm, FakeClock, LedgerEntry, MAX_SLIDING_LOG_LIMIT};
use tierlimit_redis::{WriteBack, Written};
use tierlimit_test::RedisServer;

use support::{client_time_tier, rule, set, slowest_script_us, slowlog_reset, storage_key, tier};

/// "Milliseconds of server time" (issue 9, items 9 and 18). The calls below
/// measured 1.5 to 10 ms here (2 vCPUs shared with builds); the bound leaves
/// room for that noise and is still two orders below the seconds the old
/// scripts took.
const SERVER_BOUND_US: u64 = 50_000;

const HOUR: Duration = Duration::from_secs(3600);

/// Half past some hour.
const NOW_US: u64 = 1_700_000_000_000_000 + 30 * 60_000_000;

async fn zcard(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> u64 {
    redis::cmd("ZCARD")
        .arg(key)
        .query_async(conn)
        .await
        .expect("ZCARD")
}

/// Regression (issue 9, item 9): the sliding log adds one member per unit, and
/// `per_hour(1_000_000)` with one check of cost 1,000,000 ran 4.6 to 6.2 s on
/// the server. Now the largest sliding log the API accepts, with the largest
/// cost it accepts, runs in milliseconds; `bad_input.rs` shows one more refused.
#[tokio::test]
async fn the_largest_sliding_log_check_takes_milliseconds_of_server_time() {
    let server = RedisServer::start();
    let tier = tier(&server.url());
    let mut conn = server.conn().await;
    let max = MAX_SLIDING_LOG_LIMIT;
    let set = set("log", [rule(Algorithm::SlidingLog, max, HOUR)]);
    tier.ping().await.expect("connect");
    // Loads the script, so its compilation is not measured below.
    let warm = tier.check("warm", &set, 1).await.expect("check");
    assert!(warm.decision.allowed);

    slowlog_reset(&mut conn).await;
    let v = tier.check("k", &set, max).await.expect("check");
    assert!(v.decision.allowed);
    assert_eq!(v.decision.remaining, 0);
    let v = tier.check("k", &set, max).await.expect("check");
    assert!(!v.decision.allowed);
    let key = storage_key(&set, "k", 0);
    assert_eq!(zcard(&mut conn, &key).await, max);
    let slowest = slowest_script_us(&mut conn).await;
    eprintln!("cost {max} on a sliding log of {max}: slowest call {slowest} µs of server time");
    assert!(
        slowest <= SERVER_BOUND_US,
        "a check took {slowest} µs of server time"
    );
}

/// Regression (issue 9, item 18): `reconcile.lua` walked `for j = 1, units`,
/// so an entry owing 25 M units stalled Redis 4.4 to 5.2 s, though at most
/// `limit` of them could still count. Now the units already out of the window
/// are skipped by bisection and at most `limit` are written.
#[tokio::test]
async fn writing_back_25_million_sliding_log_units_takes_milliseconds() {
    let server = RedisServer::start();
    let clock = FakeClock::new(NOW_US);
    let tier = client_time_tier(&server.url(), Arc::new(clock.clone()));
    let mut conn = server.conn().await;
    let max = MAX_SLIDING_LOG_LIMIT;
    let r = rule(Algorithm::SlidingLog, max, HOUR);
    let set = set("log", [r.clone()]);
    let window_start = NOW_US - 3_600_000_000;
    let units = 25_000_000u64;
    // Over the last two hours: the older half lies outside the window, and
    // far more than `limit` of the newer half inside it.
    let spread = LedgerEntry::new(
        storage_key(&set, "spread", 0),
        r.clone(),
        units,
        NOW_US - 7_200_000_000,
        NOW_US - 1_000_000,
    );
    // One unit per µs, all but the newest 9 before the window: unit j (from 1)
    // is at first + j - 1, inside iff first + j - 1 > window_start.
    let first = window_start - (units - 10);
    let tail = LedgerEntry::new(
        storage_key(&set, "tail", 0),
        r,
        units,
        first,
        first + units - 1,
    );
    // Loads the script, so its compilation is not measured below.
    tier.check("warm", &set, 1).await.expect("check");

    slowlog_reset(&mut conn).await;
    let report = tier
        .reconcile(&[
            WriteBack::new("big-0", &spread),
            WriteBack::new("big-1", &tail),
        ])
        .await
        .expect("reconcile");
    let applied: u64 = report
        .iter()
        .map(|r| match r {
            Ok(Written::Applied(units)) => *units,
            other => panic!("{other:?}"),
        })
        .sum();
    assert_eq!(applied, max + 9, "{report:?}");
    assert_eq!(zcard(&mut conn, &spread.storage_key).await, max);
    // (The tail's 9 members leave the window within 9 µs, and the key with
    // them: the report is what shows they were written.)
    let outside: u64 = redis::cmd("ZCOUNT")
        .arg(&spread.storage_key)
        .arg("-inf")
        .arg(window_start)
        .query_async(&mut conn)
        .await
        .expect("ZCOUNT");
    assert_eq!(outside, 0, "every member lies inside the window");
    let slowest = slowest_script_us(&mut conn).await;
    eprintln!("{units} owed units per entry: slowest write-back {slowest} µs of server time");
    assert!(
        slowest <= SERVER_BOUND_US,
        "a write-back took {slowest} µs of server time"
    );
}
