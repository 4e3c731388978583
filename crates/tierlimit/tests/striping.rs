//! A striped rule set (issue 14, hot keys) through an outage: the local tier
//! limits the hot key as a whole, and the write-back afterwards charges what
//! it admitted to the key's stripes on Redis, so nothing is lost.

mod support;

use std::time::Duration;

use support::{builder, drained, healthy, trip};
use tierlimit::{Algorithm, Policy, Rule, RuleSet, Tier};
use tierlimit_core::{escape_key, stripe_key, stripe_share};
use tierlimit_test::RedisServer;

const DAY: u64 = 86_400;
const LIMIT: u64 = 40;
const STRIPES: u32 = 4;
const HOT: &str = "tenant:{acme}";

/// A period of whole days whose current window is well inside (10% to 90%), so
/// the window cannot roll over while the test runs.
fn mid_window_days() -> u64 {
    let now_s = support::unix_ms() / 1_000;
    (1..=7u64)
        .find(|d| {
            let p = d * DAY;
            let into = now_s % p;
            into > p / 10 && into < p * 9 / 10
        })
        .unwrap_or(7)
}

fn pinger() -> RuleSet {
    RuleSet::new("ping", [Rule::per_second(1_000).expect("valid")])
        .expect("valid")
        .with_reconcile(false)
}

/// Units each stripe's fixed window counted.
async fn stripe_counts(server: &RedisServer, set: &RuleSet) -> Vec<u64> {
    let mut conn = server.conn().await;
    let mut counts = Vec::new();
    for stripe in 0..STRIPES {
        let key = set.storage_key(&stripe_key(&escape_key(HOT), stripe), 0);
        let c: Option<u64> = redis::cmd("HGET")
            .arg(&key)
            .arg("c")
            .query_async(&mut conn)
            .await
            .expect("HGET");
        counts.push(c.unwrap_or(0));
    }
    counts
}

/// A quarter of the limit admitted on Redis (spread over the stripes), then
/// an outage in which the local tier admits the key by the whole limit, then
/// the heal: the stripes together count what Redis admitted plus what was
/// written back, up to the limit, and no stripe beyond its share.
///
/// A quarter, not half: the local tier starts the key from what its last
/// Redis check reported, one stripe's remaining times the stripes. Each
/// check asks a stripe at random, so after half the limit the last check's
/// stripe was full in about one run of fifty (CI saw it), and the local tier
/// rightly had nothing to admit. After a quarter that takes all ten checks
/// on one stripe: about four runs in a million.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_striped_key_writes_back_over_its_stripes() {
    let _serial = tierlimit_test::serial().await;
    let server = RedisServer::start();
    let limiter = healthy(builder(&server.url())).await;
    let rule = Rule::with_period(LIMIT, Duration::from_secs(mid_window_days() * DAY))
        .and_then(|r| r.with_algorithm(Algorithm::FixedWindow))
        .expect("valid");
    let set = RuleSet::new("tenant", [rule])
        .and_then(|s| s.with_stripes(STRIPES))
        .expect("valid")
        .with_policy(Policy::LocalFallback);

    let mut on_redis = 0;
    for _ in 0..LIMIT / 4 {
        let d = limiter.check(HOT, &set, 1).await.expect("valid");
        assert_eq!((d.tier, d.limit), (Tier::Redis, LIMIT), "{d:?}");
        on_redis += u64::from(d.allowed);
    }
    assert_eq!(on_redis, LIMIT / 4, "room on every stripe");
    assert_eq!(
        stripe_counts(&server, &set).await.iter().sum::<u64>(),
        on_redis
    );

    server.pause();
    trip(&limiter, &pinger()).await;
    let mut local = 0;
    for _ in 0..2 * LIMIT {
        let d = limiter.check(HOT, &set, 1).await.expect("valid");
        assert_eq!(d.tier, Tier::Local, "{d:?}");
        local += u64::from(d.allowed);
    }
    assert!(
        local > 0,
        "the local tier admitted nothing: the test proves nothing"
    );
    assert!(
        local <= LIMIT,
        "the local bucket holds the whole limit at most"
    );
    server.resume();
    drained(&limiter, Duration::from_secs(10)).await;

    let stats = limiter.reconcile_stats();
    assert_eq!(stats.reconciled_units, local, "{stats:?}");
    let counts = stripe_counts(&server, &set).await;
    println!(
        "{on_redis} admitted on Redis, {local} locally; stripes after the write-back: {counts:?}; {stats:?}"
    );
    assert_eq!(
        counts.iter().sum::<u64>(),
        (on_redis + local).min(LIMIT),
        "{on_redis} on Redis + {local} written back, over stripes {counts:?}"
    );
    for (stripe, &c) in (0..STRIPES).zip(&counts) {
        assert!(
            c <= stripe_share(LIMIT, STRIPES, stripe),
            "stripe {stripe} beyond its share: {counts:?}"
        );
    }
}

/// A saturated striped key costs up to one call per stripe once, then the
/// denial cache keeps it off Redis until the earliest stripe's retry-after:
/// the round trips a denial of a striped key takes are paid once per
/// retry-after, not once per request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saturated_striped_key_is_denied_from_the_cache() {
    let _serial = tierlimit_test::serial().await;
    let server = RedisServer::start();
    let limiter = healthy(builder(&server.url())).await;
    let rule = Rule::with_period(8, Duration::from_secs(mid_window_days() * DAY))
        .and_then(|r| r.with_algorithm(Algorithm::FixedWindow))
        .expect("valid");
    let set = RuleSet::new("saturated", [rule])
        .and_then(|s| s.with_stripes(STRIPES))
        .expect("valid");
    for _ in 0..8 {
        let d = limiter.check(HOT, &set, 1).await.expect("valid");
        assert!(d.allowed && d.tier == Tier::Redis, "{d:?}");
    }
    let before = server.script_calls().await;
    let d = limiter.check(HOT, &set, 1).await.expect("valid");
    assert!(!d.allowed && d.tier == Tier::Redis, "{d:?}");
    assert!(d.retry_after.is_some_and(|r| r > Duration::ZERO));
    let denial = server.script_calls().await - before;
    assert_eq!(denial, u64::from(STRIPES), "every stripe asked once");
    for _ in 0..20 {
        let d = limiter.check(HOT, &set, 1).await.expect("valid");
        assert!(!d.allowed && d.tier == Tier::DenyCache, "{d:?}");
    }
    assert_eq!(
        server.script_calls().await - before,
        denial,
        "no Redis call while the denial is cached"
    );
}
