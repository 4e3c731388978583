//! Clock skew between app servers cannot change a decision in server-time
//! mode: two tiers whose clocks are 30 s apart, taking turns on one key, decide
//! like one limiter. The same two clocks in client-time mode do disagree,
//! which shows the test would catch a tier that trusted its own clock.

mod support;

use std::sync::Arc;
use std::time::Duration;

use tierlimit_core::{Algorithm, Clock, FakeClock, Rule, RuleSet, SystemClock};
use tierlimit_redis::{RedisTier, TimeSource};
use tierlimit_test::RedisServer;

use support::{set, slowlog_reset, slowlog_script_calls, tier_with};

const SKEW: Duration = Duration::from_secs(30);

/// A clock reading real time plus `ahead`.
fn skewed(ahead: Duration) -> Arc<dyn Clock> {
    let clock = FakeClock::new(SystemClock.unix_micros());
    clock.advance(ahead);
    Arc::new(clock)
}

/// 5 per minute, burst 5: without skew the 6th request of a quick run is denied.
fn per_minute() -> RuleSet {
    set("skew", [Rule::per_minute(5).expect("valid")])
}

/// Ten requests, alternating between the two tiers; who admitted what.
async fn take_turns(a: &RedisTier, b: &RedisTier, key: &str) -> Vec<bool> {
    let set = per_minute();
    let mut decisions = Vec::new();
    for i in 0..10 {
        let tier = if i % 2 == 0 { a } else { b };
        decisions.push(
            tier.check(key, &set, 1)
                .await
                .expect("check")
                .decision
                .allowed,
        );
    }
    decisions
}

const ONE_LIMITER: [bool; 10] = [
    true, true, true, true, true, false, false, false, false, false,
];

/// How many arguments of the script calls in the slow log since
/// [`slowlog_reset`] are a time in µs within an hour of this host's clock:
/// a client's clock sent to the script.
async fn host_times_sent(conn: &mut redis::aio::MultiplexedConnection) -> usize {
    let now = SystemClock.unix_micros();
    let hour = 3_600_000_000;
    slowlog_script_calls(conn)
        .await
        .iter()
        .flat_map(|(_, args)| args)
        .filter_map(|a| a.parse::<u64>().ok())
        .filter(|us| us.abs_diff(now) < hour)
        .count()
}

#[tokio::test]
async fn server_time_ignores_skewed_clocks() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let deadline = Duration::from_secs(2);
    // In server mode the tiers are given no clock at all: nothing they could
    // read from their hosts reaches the script, whatever those clocks say.
    let a = tier_with(&server.url(), deadline, TimeSource::Server);
    let b = tier_with(&server.url(), deadline, TimeSource::Server);
    slowlog_reset(&mut conn).await;
    assert_eq!(take_turns(&a, &b, "server").await, ONE_LIMITER);
    // Two tiers on one host agree on the time whatever they send: what
    // shows the script read Redis' own is that no call carried the host's.
    assert_eq!(
        host_times_sent(&mut conn).await,
        0,
        "a server-time tier sent the script a time"
    );

    let a = tier_with(
        &server.url(),
        deadline,
        TimeSource::Client(skewed(Duration::ZERO)),
    );
    let b = tier_with(&server.url(), deadline, TimeSource::Client(skewed(SKEW)));
    slowlog_reset(&mut conn).await;
    let skewed_run = take_turns(&a, &b, "client").await;
    assert!(
        host_times_sent(&mut conn).await >= 10,
        "the client-time tiers' times are not seen in their calls' arguments"
    );
    eprintln!("client time, 30 s apart: {skewed_run:?}");
    assert_ne!(
        skewed_run, ONE_LIMITER,
        "client time should expose the skew"
    );
    // B, 30 s ahead, finds refilled the units A has only just spent.
    let admitted = skewed_run.iter().filter(|a| **a).count();
    assert!(admitted > 5, "{skewed_run:?}");
}

/// A token bucket last written by a clock ahead of this one refills from
/// that clock's time: a denial's retry-after and reset-after count the lag,
/// as an admission's reset-after does. They left it out, so a client of the
/// lagging instance was told to retry into another denial.
#[tokio::test]
async fn a_token_bucket_behind_its_writer_counts_the_lag_in_its_denial() {
    let server = RedisServer::start();
    let deadline = Duration::from_secs(2);
    let ahead = tier_with(&server.url(), deadline, TimeSource::Client(skewed(SKEW)));
    let behind = tier_with(
        &server.url(),
        deadline,
        TimeSource::Client(skewed(Duration::ZERO)),
    );
    let rule = Rule::per_minute(1)
        .and_then(|r| r.with_algorithm(Algorithm::TokenBucket))
        .expect("valid");
    let set = set("lag", [rule]);
    let first = ahead.check("k", &set, 1).await.expect("a check").decision;
    assert!(first.allowed);
    let d = behind.check("k", &set, 1).await.expect("a check").decision;
    assert!(!d.allowed);
    // A minute's refill, from 30 s ahead of this clock (less the run's few
    // milliseconds).
    let at_least = Duration::from_secs(89);
    assert!(
        d.retry_after.is_some_and(|r| r >= at_least) && d.reset_after >= at_least,
        "{d:?}"
    );
}
