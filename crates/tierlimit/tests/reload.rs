//! Hot reload of the named rule sets: under load no check is lost or counted
//! twice, a changed limit keeps what was used (raised or lowered, on Redis and
//! in the local tier), and a rejected reload keeps the sets in force.

mod support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use support::{builder, healthy, trip};
use tierlimit::{Algorithm, Error, HybridLimiter, Policy, Rule, RuleSet, Tier};
use tierlimit_test::{Fault, FaultProxy, RedisServer};

const KEYS: usize = 4;
const TASKS: usize = 2_000;

/// A UTC offset that puts the test's start in the middle of a natural day,
/// so a test of a few seconds never crosses the window's end. Taken once:
/// another offset is another rule (another key).
fn mid_day_offset() -> i64 {
    static OFFSET: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
    *OFFSET.get_or_init(mid_day_offset_now)
}

fn mid_day_offset_now() -> i64 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs() as i64;
    let offset = (43_200 - now.rem_euclid(86_400)).rem_euclid(86_400);
    if offset >= 43_200 {
        offset - 86_400
    } else {
        offset
    }
}

/// A fixed window of `limit` per natural day, mid-window now.
fn daily(limit: u64, policy: Policy) -> RuleSet {
    RuleSet::new(
        "api",
        [Rule::per_natural_day(limit, mid_day_offset()).expect("valid")],
    )
    .expect("valid")
    .with_policy(policy)
}

/// GCRA of `limit` per hour: refills one unit per 3600/limit s, so within a
/// test of seconds what was used stays used (at most one unit comes back).
fn hourly(limit: u64, policy: Policy) -> RuleSet {
    RuleSet::new(
        "api",
        [Rule::per_hour(limit)
            .and_then(|r| r.with_algorithm(Algorithm::Gcra))
            .expect("valid")],
    )
    .expect("valid")
    .with_policy(policy)
}

/// The count Redis holds for a fixed-window key.
async fn redis_count(server: &RedisServer, set: &RuleSet, key: &str) -> u64 {
    let mut conn = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .expect("connect to the test server");
    let count: Option<u64> = redis::cmd("HGET")
        .arg(set.storage_key(key, 0))
        .arg("c")
        .query_async(&mut conn)
        .await
        .expect("HGET");
    count.unwrap_or(0)
}

/// Checks `key` once by name; true when admitted.
async fn admit(limiter: &tierlimit::HybridLimiter, key: &str) -> bool {
    limiter
        .check_by_name("api", key, 1)
        .await
        .expect("valid input")
        .allowed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_under_load_loses_no_check_and_counts_none_twice() {
    let server = RedisServer::start();
    // 4,000 checks queued on one connection at once take longer than the
    // usual 50 ms deadline (and count as slow calls) on a slow machine, and
    // far longer when CI runs other suites beside it; this test is about
    // reloads, so Redis gets the time to decide every one.
    let patience = Duration::from_secs(30);
    let mut patient = support::breaker();
    // Just under the deadline: no answer in time is slow.
    patient.slow_call_threshold = patience - Duration::from_millis(1);
    let limiter = healthy(
        builder(&server.url())
            .deadline(patience)
            .breaker(patient)
            .rule_sets([daily(300, Policy::FailClosed)]),
    )
    .await;
    // Reloads flip the limit between 300 and 600 while the checks run, one
    // every RELOAD_EVERY decisions, made by the check that reaches the count:
    // they follow the load's progress, not the clock or a task's turn, so
    // every run makes as many (a reloader task of its own, starved beside
    // 2,000 check tasks when `cargo test` runs this binary's tests side by
    // side, once made fewer than the 20 asked for below). A lock keeps them
    // in order, so each one flips the limit.
    const RELOAD_EVERY: u64 = 100;
    let progress = Arc::new(AtomicU64::new(0));
    // (the limit in force is 600, what each reload changed)
    let reloads = Arc::new(Mutex::new((false, Vec::new())));

    // Thousands of checks in flight at once: 2,000 tasks of 2 checks each.
    // Each task returns what it saw; every assertion is made below, with the
    // whole picture in its message.
    let started = std::time::Instant::now();
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let (limiter, progress, reloads) = (limiter.clone(), progress.clone(), reloads.clone());
            tokio::spawn(async move {
                let mut seen = Vec::with_capacity(2);
                for i in 0..2 {
                    let k = (t + i) % KEYS;
                    let d = limiter.check_by_name("api", &format!("k{k}"), 1).await;
                    if (progress.fetch_add(1, Ordering::Relaxed) + 1) % RELOAD_EVERY == 0 {
                        let (high, changed) = &mut *reloads.lock().expect("reloads lock");
                        *high = !*high;
                        let limit = if *high { 600 } else { 300 };
                        let report = limiter
                            .replace_rule_sets([daily(limit, Policy::FailClosed)])
                            .expect("one set, one name");
                        changed.push(report.changed);
                    }
                    seen.push((k, d));
                }
                seen
            })
        })
        .collect();
    let mut decided = 0u64;
    let mut admitted = [0u64; KEYS];
    let mut tiers = std::collections::BTreeMap::<String, u64>::new();
    let mut odd = Vec::new();
    for task in tasks {
        for (k, d) in task.await.expect("check task") {
            match d {
                Ok(d) => {
                    decided += 1;
                    *tiers.entry(format!("{:?}", d.tier)).or_default() += 1;
                    admitted[k] += u64::from(d.allowed);
                    if !matches!(d.tier, Tier::Redis | Tier::DenyCache) && odd.len() < 5 {
                        odd.push(format!("{d:?}"));
                    }
                }
                Err(e) => odd.push(format!("error: {e}")),
            }
        }
    }
    let elapsed = started.elapsed();
    let reports = std::mem::take(&mut reloads.lock().expect("reloads lock").1);
    let reloads = reports.len();
    let picture = format!(
        "{decided} decided in {elapsed:?} by {tiers:?}, admitted {admitted:?}, \
         {reloads} reloads, breaker {:?}; first odd decisions: {odd:?}",
        limiter.breaker_state()
    );
    assert_eq!(
        decided,
        2 * TASKS as u64,
        "every check returned a decision: {picture}"
    );
    assert!(
        odd.is_empty(),
        "healthy Redis decides every check: {picture}"
    );
    assert!(
        reports.iter().all(|changed| changed == &["api"]),
        "every reload changed the set: {picture}"
    );

    let set = limiter.rule_set("api").expect("named set");
    for (k, &admitted) in admitted.iter().enumerate() {
        let key = format!("k{k}");
        let held = redis_count(&server, &set, &key).await;
        // Every admission counted once: what Redis holds is what was admitted.
        assert_eq!(
            held, admitted,
            "key {key}: Redis holds {held}, admitted {admitted}: {picture}"
        );
        // 1,000 tries per key against 300 or 600: never above the larger limit,
        // and at least the smaller one (usage carried, never reset).
        assert!(
            (300..=600).contains(&admitted),
            "key {key}: admitted {admitted} with limits flipping 300/600: {picture}"
        );
    }

    // Usage is not forgotten: at 300 every key is full, at 600 exactly the
    // rest is left.
    limiter
        .replace_rule_sets([daily(300, Policy::FailClosed)])
        .expect("valid");
    assert!(
        !admit(&limiter, "k0").await,
        "k0 used {} of 300",
        admitted[0]
    );
    limiter
        .replace_rule_sets([daily(600, Policy::FailClosed)])
        .expect("valid");
    let mut more = 0;
    while admit(&limiter, "k0").await {
        more += 1;
        assert!(more <= 600, "k0 admits without end");
    }
    assert_eq!(
        admitted[0] + more,
        600,
        "k0: {} before, {more} after raising to 600",
        admitted[0]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raising_and_lowering_under_load_never_exceeds_the_larger_limit() {
    let server = RedisServer::start();
    let limiter =
        healthy(builder(&server.url()).rule_sets([hourly(100, Policy::FailClosed)])).await;
    let admitted = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let load: Vec<_> = (0..4)
        .map(|_| {
            let (limiter, admitted, stop) = (limiter.clone(), admitted.clone(), stop.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    if admit(&limiter, "hot").await {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                    tokio::task::yield_now().await;
                }
            })
        })
        .collect();
    let wait_for = |target: u64| {
        let admitted = admitted.clone();
        async move {
            let started = std::time::Instant::now();
            while admitted.load(Ordering::Relaxed) < target {
                assert!(
                    started.elapsed() < Duration::from_secs(20),
                    "admitted {} of the {target} awaited",
                    admitted.load(Ordering::Relaxed)
                );
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
    };
    // 100 used; raising to 200 admits the other 100, no more.
    wait_for(100).await;
    limiter
        .replace_rule_sets([hourly(200, Policy::FailClosed)])
        .expect("valid");
    wait_for(200).await;
    // Lowered to 50 with 200 used: nothing more.
    limiter
        .replace_rule_sets([hourly(50, Policy::FailClosed)])
        .expect("valid");
    let at_lower = admitted.load(Ordering::Relaxed);
    // Let the load run a while against the lowered limit (a few hundred checks).
    let checks_before = limiter.rule_set("api").map(|s| s.rules()[0].limit());
    assert_eq!(checks_before, Some(50));
    for _ in 0..200 {
        admit(&limiter, "hot").await;
    }
    stop.store(true, Ordering::Relaxed);
    for task in load {
        task.await.expect("load task");
    }
    let total = admitted.load(Ordering::Relaxed);
    // GCRA at 200/h refills one unit per 18 s: within the test at most one
    // more unit (plus one for a check racing the swap).
    assert!(
        total <= 200 + 2,
        "admitted {total}: more than the larger limit (200)"
    );
    assert!(
        total - at_lower <= 2,
        "lowered to 50 with 200 used, yet {} more were admitted",
        total - at_lower
    );
}

#[tokio::test]
async fn the_local_tier_keeps_usage_across_a_reload_during_an_outage() {
    let mut server = RedisServer::start();
    let limiter =
        healthy(builder(&server.url()).rule_sets([hourly(10, Policy::LocalFallback)])).await;
    server.kill9();
    trip(&limiter, &hourly(10, Policy::LocalFallback)).await;
    // Local bucket (1 instance): 10 of 10 used.
    let mut local = 0;
    for _ in 0..20 {
        let d = limiter.check_by_name("api", "u", 1).await.expect("valid");
        assert_eq!(d.tier, Tier::Local, "{d:?}");
        local += u64::from(d.allowed);
    }
    assert_eq!(local, 10);
    // Raised to 25: 15 more, not a fresh 25.
    limiter
        .replace_rule_sets([hourly(25, Policy::LocalFallback)])
        .expect("valid");
    let mut more = 0;
    for _ in 0..40 {
        more += u64::from(admit(&limiter, "u").await);
    }
    assert!(
        (15..=16).contains(&more),
        "raised 10 -> 25 after 10 used: admitted {more} more"
    );
    // Lowered to 5 with 25 used: none.
    limiter
        .replace_rule_sets([hourly(5, Policy::LocalFallback)])
        .expect("valid");
    let mut after_lower = 0;
    for _ in 0..10 {
        after_lower += u64::from(admit(&limiter, "u").await);
    }
    assert_eq!(after_lower, 0, "lowered to 5 with 25 used");
}

/// Limiter `a` (behind the proxy) owes 50 units of `daily(100)` on key `k`
/// from an outage; `raise` reloads it to `daily(1_000)` its own way, and `b`
/// (straight to Redis) is raised too and admits 500 more on Redis. Once the
/// proxy heals and `a` has drained, what Redis holds for `k`.
async fn owed_across_a_raise<F>(raise: F) -> u64
where
    F: FnOnce(&HybridLimiter, RuleSet),
{
    let _serial = tierlimit_test::serial().await;
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    let old = || daily(100, Policy::LocalFallback);
    let new = || daily(1_000, Policy::LocalFallback);
    let a = healthy(builder(&proxy.url()).rule_sets([old()])).await;
    let b = healthy(builder(&server.url()).rule_sets([old()])).await;
    proxy.set(Fault::Refuse);
    let ping = RuleSet::new("ping", [Rule::per_second(1_000).expect("valid")])
        .expect("valid")
        .with_reconcile(false);
    trip(&a, &ping).await;
    for _ in 0..50 {
        let d = a.check_by_name("api", "k", 1).await.expect("valid");
        assert!(d.allowed && d.tier == Tier::Local, "{d:?}");
    }
    // Into the ledger, under the old rule, as the pruner moves them.
    assert_eq!(a.local().ledger().units(), 50);
    raise(&a, new());
    b.replace_rule_sets([new()]).expect("valid");
    for _ in 0..500 {
        assert!(admit(&b, "k").await, "b on Redis, under 1,000");
    }
    proxy.set(Fault::None);
    support::drained(&a, Duration::from_secs(10)).await;
    redis_count(&server, &new(), "k").await
}

/// A limit raised by reload while units are owed: they are written back
/// under the new limit. Under the old one (the entry's until its key admitted
/// again), the window's write-back stopped at it, and once another instance
/// had pushed the count past it the units were lost: Redis held 500, not 550.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn units_owed_across_a_raised_limit_are_written_back_under_it() {
    let held = owed_across_a_raise(|a, new| {
        a.replace_rule_sets([new]).expect("valid");
    })
    .await;
    assert_eq!(held, 550);
}

/// The same, when the set is dropped by one reload and comes back raised in
/// the next (a bad edit, then its fix): a set added was never retargeted,
/// only a set changed, so its owed units were written back under the old
/// limit and lost past it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn units_owed_by_a_set_removed_then_re_added_raised_are_written_back_under_it() {
    let held = owed_across_a_raise(|a, new| {
        let report = a.replace_rule_sets([]).expect("valid");
        assert_eq!(report.removed, ["api"]);
        let report = a.replace_rule_sets([new]).expect("valid");
        assert_eq!(report.added, ["api"]);
    })
    .await;
    assert_eq!(held, 550);
}

#[tokio::test]
async fn unknown_names_and_duplicate_names_are_typed_errors() {
    let server = RedisServer::start();
    let limiter = healthy(builder(&server.url()).rule_sets([daily(5, Policy::FailClosed)])).await;
    assert!(matches!(
        limiter.check_by_name("nope", "k", 1).await,
        Err(Error::UnknownRuleSet { name }) if name == "nope"
    ));
    let err = limiter
        .replace_rule_sets([daily(5, Policy::FailClosed), daily(6, Policy::FailOpen)])
        .expect_err("two sets named api");
    assert!(matches!(err, Error::DuplicateRuleSet { name } if name == "api"));
    assert_eq!(
        limiter.rule_set("api").map(|s| s.rules()[0].limit()),
        Some(5),
        "a rejected reload keeps the sets in force"
    );
    let build = builder(&server.url())
        .rule_sets([daily(5, Policy::FailClosed)])
        .rule_sets([daily(7, Policy::FailClosed)])
        .build();
    assert!(matches!(build, Err(Error::DuplicateRuleSet { .. })));
}
