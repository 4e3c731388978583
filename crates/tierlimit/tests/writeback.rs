//! Writing back what was admitted without Redis: before a key's next Redis
//! check, for short windows too, at shutdown, and past an entry Redis refuses.

mod support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::AsyncCommands;
use support::{drained, hourly, trip, unix_ms, wait_for};
use tierlimit::{
    Algorithm, BreakerState, HybridLimiter, HybridLimiterBuilder, Instances, Policy,
    ReconcileConfig, Rule, RuleSet, Tier,
};
use tierlimit_test::{Fault, FaultProxy, RedisServer};

fn builder(url: &str, instances: Instances) -> HybridLimiterBuilder {
    support::builder(url).instances(instances)
}

/// The rule set that trips the breaker; its own checks are not counted here.
fn trip_set() -> RuleSet {
    RuleSet::new("trip", [Rule::per_second(1_000).expect("valid")])
        .expect("valid")
        .with_reconcile(false)
}

/// Regression (issue 9, item 4): after recovery, checks went to Redis at once
/// while the ledger drained in small batches in any order, so until a hot
/// key's entry was written back Redis did not know what the key had used
/// locally, and granted its whole quota again. Three instances each use their
/// share of an hourly 60 locally; each also has 3,000 cold keys to write back
/// behind a slow drain. After the heal, checks of the hot key go round the
/// three instances: the fleet's admissions over the hour stay within 60 + 3.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_key_gets_no_second_quota_while_the_drain_lags() {
    let _serial = tierlimit_test::serial().await;
    const LIMIT: u64 = 60;
    const INSTANCES: u64 = 3;
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    let mut slow = ReconcileConfig::default();
    slow.batch_size = 1;
    slow.duty_cycle = 0.01;
    let limiters: Vec<HybridLimiter> = (0..INSTANCES)
        .map(|_| {
            builder(&proxy.url(), Instances::Fixed(INSTANCES))
                .reconcile(slow.clone())
                .build()
                .expect("valid config")
        })
        .collect();
    let set = hourly("hot", LIMIT);
    let cold = hourly("cold", 10);

    proxy.set(Fault::Refuse);
    let mut fleet = 0;
    for l in &limiters {
        trip(l, &trip_set()).await;
        for i in 0..3_000 {
            l.check(&format!("c{i}"), &cold, 1).await.expect("valid");
        }
        for _ in 0..LIMIT {
            fleet += u64::from(l.check("hot", &set, 1).await.expect("valid").allowed);
        }
    }
    assert_eq!(fleet, LIMIT, "each instance admits its share of 20 locally");
    proxy.set(Fault::None);
    for l in &limiters {
        assert!(l.wait_closed(Duration::from_secs(5)).await);
    }
    // Past the settling period (the breaker's longest cool-down, 800 ms, plus
    // the deadline), in which the outage's own buckets still bound the key:
    // from here Redis alone decides.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut after = 0;
    for _ in 0..LIMIT {
        for l in &limiters {
            let d = l.check("hot", &set, 1).await.expect("valid");
            assert!(matches!(d.tier, Tier::Redis | Tier::DenyCache), "{d:?}");
            after += u64::from(d.allowed);
        }
    }
    assert!(
        limiters
            .iter()
            .any(|l| l.reconcile_stats().pending_units > 1_000),
        "the drain was not lagging: the test proves nothing"
    );
    assert!(
        fleet + after <= LIMIT + INSTANCES,
        "the fleet admitted {fleet} locally and {after} on Redis after the heal"
    );
}

/// The first instance back must not hand out a quota the others used
/// locally, on a key it did not see in the outage either. Regression: with
/// no bucket of its own for the key, it asked Redis, which had counted none
/// of the others' admissions yet, and admitted the whole limit: 90 of an
/// hourly 60 over two instances. Now, while its outage settles, such a key
/// gets this instance's share: B spends its 30 locally, A comes back first
/// and admits at most its own 30, and B's write-back brings Redis to 60.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_instance_back_takes_only_its_share_of_a_key_it_did_not_see() {
    let _serial = tierlimit_test::serial().await;
    const LIMIT: u64 = 60;
    let server = RedisServer::start();
    let (proxy_a, proxy_b) = (
        FaultProxy::start(server.addr()).await,
        FaultProxy::start(server.addr()).await,
    );
    // A settle of 3 s (the longest cool-down plus the deadline), so the
    // checks below fit in it on a slow machine.
    let mut breaker = support::breaker();
    breaker.max_cool_down = Duration::from_secs(3);
    let a = builder(&proxy_a.url(), Instances::Fixed(2))
        .breaker(breaker.clone())
        .build()
        .expect("valid config");
    let b = builder(&proxy_b.url(), Instances::Fixed(2))
        .breaker(breaker)
        .build()
        .expect("valid config");
    let set = hourly("unseen", LIMIT);
    proxy_a.set(Fault::Refuse);
    proxy_b.set(Fault::Refuse);
    // A decides nothing locally in its outage (its trips fail closed): the
    // settle must bound it all the same.
    trip(&a, &trip_set().with_policy(Policy::FailClosed)).await;
    trip(&b, &trip_set()).await;
    let mut fleet = 0;
    for _ in 0..LIMIT {
        fleet += u64::from(b.check("u", &set, 1).await.expect("valid").allowed);
    }
    assert_eq!(fleet, LIMIT / 2, "B admits its share locally");
    // A comes back first; B is still cut off, its 30 not written back.
    proxy_a.set(Fault::None);
    assert!(a.wait_closed(Duration::from_secs(5)).await);
    let mut back = 0;
    for _ in 0..LIMIT {
        let d = a.check("u", &set, 1).await.expect("valid");
        back += u64::from(d.allowed);
    }
    assert!(
        back <= LIMIT / 2,
        "A admitted {back} of the hour's {LIMIT} while B's {fleet} were not written back"
    );
    // Its denials came from that bucket, which counts every rule.
    let mut rules = Vec::new();
    let d = a
        .check_with_rules("u", &set, 1, &mut rules)
        .await
        .expect("valid");
    assert_eq!(
        (d.tier, d.allowed, rules.len()),
        (Tier::Local, false, 1),
        "{d:?}"
    );
    proxy_b.set(Fault::None);
    drained(&b, Duration::from_secs(10)).await;
    // And for the rest of the hour, on either: Redis counts all of it.
    let mut later = 0;
    for _ in 0..LIMIT {
        for l in [&a, &b] {
            later += u64::from(l.check("u", &set, 1).await.expect("valid").allowed);
        }
    }
    assert!(
        fleet + back + later <= LIMIT + 2,
        "the fleet admitted {fleet} locally, then {back} on A alone and {later} after"
    );
}

/// Regression (issue 9, item 6): rules under a minute were not reconciled, so
/// the window still live at the heal counted Redis' whole limit on top of
/// what was admitted locally: with a 2 s window of 61 the windows around a
/// heal reached 68-124. Three instances under load, an outage of about 3 s:
/// every window stays within 61 + 3.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_window_live_at_the_heal_stays_within_its_limit() {
    let _serial = tierlimit_test::serial().await;
    const LIMIT: u64 = 61;
    const INSTANCES: u64 = 3;
    const PERIOD_MS: u64 = 2_000;
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    let limiters: Arc<Vec<HybridLimiter>> = Arc::new(
        (0..INSTANCES)
            .map(|_| {
                builder(&proxy.url(), Instances::Fixed(INSTANCES))
                    .build()
                    .expect("valid config")
            })
            .collect(),
    );
    let set = Arc::new(
        RuleSet::new(
            "window",
            [Rule::with_period(LIMIT, Duration::from_millis(PERIOD_MS))
                .and_then(|r| r.with_algorithm(Algorithm::FixedWindow))
                .expect("valid")],
        )
        .expect("valid")
        .with_policy(Policy::LocalFallback),
    );
    let per_window = Arc::new(Mutex::new(BTreeMap::<u64, u64>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for i in 0..INSTANCES as usize {
        let (limiters, set, per_window, stop) = (
            limiters.clone(),
            set.clone(),
            per_window.clone(),
            stop.clone(),
        );
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let d = limiters[i].check("hot", &set, 1).await.expect("valid");
                if d.allowed {
                    *per_window
                        .lock()
                        .expect("lock")
                        .entry(unix_ms() / PERIOD_MS)
                        .or_default() += 1;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    proxy.set(Fault::Refuse);
    let outage = unix_ms();
    tokio::time::sleep(Duration::from_millis(3_000)).await;
    proxy.set(Fault::None);
    let heal = unix_ms();
    assert!(
        wait_for(Duration::from_secs(5), || limiters
            .iter()
            .all(|l| l.breaker_state() == BreakerState::Closed))
        .await
    );
    tokio::time::sleep(Duration::from_millis(2 * PERIOD_MS)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.expect("load task");
    }
    let windows = per_window.lock().expect("lock").clone();
    let around_heal: Vec<(u64, u64)> = windows
        .range(outage / PERIOD_MS..=heal / PERIOD_MS + 1)
        .map(|(w, n)| (*w, *n))
        .collect();
    assert!(around_heal.len() >= 3, "{around_heal:?}");
    for (window, admitted) in &around_heal {
        assert!(
            *admitted <= LIMIT + INSTANCES,
            "window {window} admitted {admitted} > {} (outage from window {}, heal in window {}): {around_heal:?}",
            LIMIT + INSTANCES,
            outage / PERIOD_MS,
            heal / PERIOD_MS
        );
    }
}

/// Regression (issue 9, item 7): dropping the limiter aborted its tasks and
/// lost what the ledger still owed Redis. An outage, the heal, and at once a
/// shutdown: Redis holds every unit, and the instance left the heartbeat set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_right_after_the_heal_writes_every_unit_back() {
    let _serial = tierlimit_test::serial().await;
    const KEYS: u64 = 300;
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    let limiter = builder(&proxy.url(), Instances::Learned { assume: Some(1) })
        .group("shut")
        .build()
        .expect("valid config");
    assert!(wait_for(Duration::from_secs(5), || limiter.instances() == Some(1)).await);
    let set = hourly("shut", 10);
    proxy.set(Fault::Refuse);
    trip(&limiter, &trip_set()).await;
    for i in 0..KEYS {
        let d = limiter
            .check(&format!("u{i}"), &set, 1)
            .await
            .expect("valid");
        assert_eq!(d.tier, Tier::Local);
    }
    proxy.set(Fault::None);
    let report = limiter.shutdown(Duration::from_secs(10)).await;
    assert_eq!(
        (
            report.written_back_units,
            report.undrained_units,
            report.left_group
        ),
        (KEYS, 0, true),
        "{report:?}"
    );
    let mut conn = server.conn().await;
    let members: u64 = conn.zcard("tl:{instances}:shut").await.expect("zcard");
    assert_eq!(members, 0, "the instance is still counted by the others");
    // Redis holds every unit: each key has 9 left after one more check.
    let check = builder(&server.url(), Instances::Fixed(1))
        .build()
        .expect("valid config");
    for i in 0..KEYS {
        let d = check.check(&format!("u{i}"), &set, 1).await.expect("valid");
        assert_eq!((d.tier, d.remaining), (Tier::Redis, 8), "key u{i}");
    }
}

/// Item 7: with Redis still down, shutdown gives up at its timeout and says
/// what it could not write back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_while_redis_is_down_reports_what_is_lost() {
    let _serial = tierlimit_test::serial().await;
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    let limiter = builder(&proxy.url(), Instances::Fixed(1))
        .build()
        .expect("valid config");
    let set = hourly("lost", 10);
    proxy.set(Fault::Refuse);
    trip(&limiter, &trip_set()).await;
    for i in 0..7 {
        limiter
            .check(&format!("u{i}"), &set, 1)
            .await
            .expect("valid");
    }
    let started = std::time::Instant::now();
    let report = limiter.shutdown(Duration::from_millis(300)).await;
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(
        (report.written_back_units, report.undrained_units),
        (0, 7),
        "{report:?}"
    );
}

/// Keys a limiter owes in [`drain_under_way`]: more than its slow drain
/// writes back before the tests below break Redis.
const OWED_KEYS: u64 = 50;

/// A limiter (through `proxy`, with `builder`'s other settings) that owes
/// Redis one unit for each of [`OWED_KEYS`] keys from an outage, and whose
/// slow drain (one entry per batch, mostly asleep) has written back some of
/// them since Redis returned: its drain has a connection, and most is left.
async fn drain_under_way(proxy: &FaultProxy, builder: HybridLimiterBuilder) -> HybridLimiter {
    let mut slow = ReconcileConfig::default();
    slow.batch_size = 1;
    slow.duty_cycle = 0.01;
    let limiter = builder.reconcile(slow).build().expect("valid config");
    let set = hourly("owed", 10);
    proxy.set(Fault::Refuse);
    trip(&limiter, &trip_set()).await;
    for i in 0..OWED_KEYS {
        limiter
            .check(&format!("u{i}"), &set, 1)
            .await
            .expect("valid");
    }
    proxy.set(Fault::None);
    assert!(limiter.wait_closed(Duration::from_secs(5)).await);
    assert!(
        wait_for(Duration::from_secs(5), || {
            limiter.reconcile_stats().pending_units < OWED_KEYS
        })
        .await,
        "the drain did not start"
    );
    limiter
}

/// A shutdown ends at its timeout against a hung Redis too: a write-back
/// call on the drain's connection, sent just before Redis hung, ran for a
/// whole deadline (2 s here) past a timeout of 200 ms, and leaving the
/// heartbeat set for another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_against_a_hung_redis_ends_at_its_timeout() {
    let _serial = tierlimit_test::serial().await;
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    let limiter = drain_under_way(
        &proxy,
        builder(&proxy.url(), Instances::Learned { assume: Some(1) })
            .deadline(Duration::from_secs(2)),
    )
    .await;
    server.pause();
    let pending = limiter.reconcile_stats().pending_units;
    assert!(pending > 0, "the drain ended before Redis hung");
    let started = std::time::Instant::now();
    let report = limiter.shutdown(Duration::from_millis(200)).await;
    let took = started.elapsed();
    server.resume();
    assert!(
        took < Duration::from_secs(1),
        "a shutdown of 200 ms took {took:?} against a hung Redis (deadline 2 s): {report:?}"
    );
    assert_eq!(report.written_back_units, 0, "{report:?}");
    assert!(report.undrained_units > 0, "{report:?}");
    assert!(!report.left_group, "{report:?}");
}

/// A shutdown that meets a blackhole which heals before its timeout still
/// writes everything back. The drain's socket lived through the blackhole:
/// its lost request left redis-rs pairing each later reply with the request
/// before it, so every retry on it timed out and the shutdown gave up with
/// Redis healthy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_through_a_healed_blackhole_writes_everything_back() {
    let _serial = tierlimit_test::serial().await;
    let server = RedisServer::start();
    let proxy = Arc::new(FaultProxy::start(server.addr()).await);
    let limiter = drain_under_way(
        &proxy,
        builder(&proxy.url(), Instances::Fixed(1)).deadline(Duration::from_millis(200)),
    )
    .await;
    // The drain's socket loses what it sends for 600 ms, then works again.
    proxy.set(Fault::Blackhole);
    let healer = {
        let proxy = Arc::clone(&proxy);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(600)).await;
            proxy.set(Fault::None);
        })
    };
    let report = limiter.shutdown(Duration::from_secs(5)).await;
    healer.await.expect("the healer");
    assert_eq!(report.undrained_units, 0, "{report:?}");
}

/// A shutdown accounts for every unit the ledger held: written back,
/// expired (their window passed: nothing to write), parked (Redis refuses the
/// entry on its own) or undrained. The expired and parked ones were missing
/// from its report, which then read as if everything had been written back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_reports_the_units_it_did_not_write_and_why() {
    let _serial = tierlimit_test::serial().await;
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    // Open until the shutdown: nothing drains before it.
    let mut slow_probe = support::breaker();
    slow_probe.cool_down = Duration::from_secs(60);
    slow_probe.max_cool_down = Duration::from_secs(60);
    let limiter = builder(&proxy.url(), Instances::Fixed(1))
        .breaker(slow_probe)
        .build()
        .expect("valid config");
    let (hourly, brief) = (hourly("kept", 10), {
        RuleSet::new("brief", [Rule::per_second(5).expect("valid")]).expect("valid")
    });
    // Something else holds a list where the poisoned key's count goes.
    let poisoned = hourly.storage_key("poisoned", 0);
    let mut conn = server.conn().await;
    let _: () = conn.rpush(&poisoned, "x").await.expect("RPUSH");
    proxy.set(Fault::Refuse);
    trip(&limiter, &trip_set()).await;
    for (key, set, times) in [
        ("a", &hourly, 2),
        ("b", &hourly, 1),
        ("poisoned", &hourly, 1),
        ("c", &brief, 3),
    ] {
        for _ in 0..times {
            let d = limiter.check(key, set, 1).await.expect("valid");
            assert!(d.tier == Tier::Local && d.allowed, "{key}: {d:?}");
        }
    }
    // A per-second bucket's units count for a second after the last.
    let admitted = unix_ms();
    assert!(wait_for(Duration::from_secs(5), || unix_ms() > admitted + 1_100).await);
    proxy.set(Fault::None);
    let report = limiter.shutdown(Duration::from_secs(5)).await;
    assert_eq!(
        (
            report.written_back_units,
            report.expired_units,
            report.parked_units,
            report.undrained_units
        ),
        (3, 3, 1, 0),
        "{report:?}"
    );
}

/// Regression (issue 9, item 8): a batch failing for one entry (`WRONGTYPE`,
/// because something else wrote a `tl:` key) was re-sent forever and counted
/// against the breaker. The entry is parked; the rest drains; the breaker
/// stays closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poisoned_entry_is_parked_and_the_rest_drains() {
    let _serial = tierlimit_test::serial().await;
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    let limiter = builder(&proxy.url(), Instances::Fixed(1))
        .build()
        .expect("valid config");
    // A token bucket keeps a hash: a plain string under its key is WRONGTYPE.
    let set = RuleSet::new(
        "poison",
        [Rule::per_hour(10)
            .and_then(|r| r.with_algorithm(Algorithm::TokenBucket))
            .expect("valid")],
    )
    .expect("valid")
    .with_policy(Policy::LocalFallback);
    proxy.set(Fault::Refuse);
    trip(&limiter, &trip_set()).await;
    for i in 0..20 {
        limiter
            .check(&format!("u{i}"), &set, 1)
            .await
            .expect("valid");
    }
    let mut conn = server.conn().await;
    let () = conn
        .set(set.storage_key("u7", 0), "not a rate limit")
        .await
        .expect("set");
    proxy.set(Fault::None);
    assert!(limiter.wait_closed(Duration::from_secs(5)).await);
    let transitions = limiter.breaker().transitions();
    drained(&limiter, Duration::from_secs(10)).await;
    let stats = limiter.reconcile_stats();
    assert_eq!(
        (
            stats.parked_entries,
            stats.parked_units,
            stats.reconciled_units
        ),
        (1, 1, 19),
        "{stats:?}"
    );
    assert_eq!(
        limiter.breaker().transitions(),
        transitions,
        "the poisoned entry moved the breaker"
    );
    assert_eq!(limiter.breaker_state(), BreakerState::Closed);
}
