//! The edges of a limiter's life: its first checks after `build()`, the
//! instance count across a Redis that comes back empty, and what every tier
//! puts in a `Decision`.

mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use support::{DEADLINE, unix_ms, wait_for};
use tierlimit::{
    Algorithm, BreakerState, HybridLimiter, HybridLimiterBuilder, Instances, Policy, RedisFailure,
    Rule, RuleSet, Tier,
};
use tierlimit_test::{FaultProxy, RedisServer, StallWatch, Timings, judged};

/// A builder like production's: learned instance count (unknown until the
/// first heartbeat), short cool-downs so the tests recover fast.
fn production(url: &str) -> HybridLimiterBuilder {
    support::builder(url).instances(Instances::Learned { assume: None })
}

fn hourly(limit: u64) -> RuleSet {
    support::hourly("start", limit)
}

/// Regression (issue 9, item 2): `build()` forced the breaker Open and assumed
/// one instance, so for the first cool-down every new instance answered from a
/// local bucket of the whole limit: three instances started against a healthy
/// Redis admitted 3 x 61 of one key. The first check must be Redis'.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_checks_after_build_are_decided_by_a_healthy_redis() {
    let _serial = tierlimit_test::serial().await;
    const LIMIT: u64 = 61;
    let server = RedisServer::start();
    let set = hourly(LIMIT);
    let limiters: Vec<HybridLimiter> = (0..3)
        .map(|_| production(&server.url()).build().expect("valid config"))
        .collect();
    let mut admitted = 0;
    let watch = StallWatch::start(Instant::now()).expect("the stall watch starts");
    let mut timings = Timings::default();
    for round in 0..LIMIT {
        for (i, limiter) in limiters.iter().enumerate() {
            let d = timings
                .time(limiter.check("k", &set, 1))
                .await
                .expect("valid input");
            assert!(
                matches!(d.tier, Tier::Redis | Tier::DenyCache),
                "round {round}, instance {i}: decided by {:?}, not Redis",
                d.tier
            );
            admitted += u64::from(d.allowed);
        }
    }
    assert_eq!(admitted, LIMIT, "the fleet admitted more than the limit");
    if let Err(why) = watch
        .stop()
        .judge(&timings, DEADLINE + Duration::from_millis(15))
    {
        panic!("a first check: {why}");
    }
}

/// Item 2, Redis dead at start: `build()` does no I/O and succeeds; the first
/// check fails fast and is answered by the policy. With the instance count
/// unknown, local fallback does not guess one instance (the whole limit): it
/// answers by the overflow policy until the count is learned or assumed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limiter_started_while_redis_is_dead_does_not_assume_one_instance() {
    let _serial = tierlimit_test::serial().await;
    const LIMIT: u64 = 61;
    let mut server = RedisServer::start();
    let url = server.url();
    server.kill9();
    let set = hourly(LIMIT);

    let unknown = production(&url).build().expect("build does no I/O");
    assert_eq!(unknown.instances(), None);
    let (first, took) = judged(
        unknown.check("k", &set, 1),
        DEADLINE + Duration::from_millis(15),
    )
    .await;
    let first = first.expect("valid input");
    if let Err(why) = took {
        panic!("the first check: {why}");
    }
    assert_eq!(first.tier, Tier::FailClosed, "{first:?}");
    assert!(!first.allowed);
    assert_eq!(first.redis_failure, Some(RedisFailure::ConnectionRefused));
    let mut admitted = 0;
    for _ in 0..LIMIT {
        admitted += u64::from(unknown.check("k", &set, 1).await.expect("valid").allowed);
    }
    assert_eq!(
        admitted, 0,
        "an instance that cannot know its share admitted locally"
    );

    // An explicit assumption is honoured: ceil(61 / 3) = 21 locally.
    let assumed = production(&url)
        .instances(Instances::Learned { assume: Some(3) })
        .build()
        .expect("build does no I/O");
    let mut admitted = 0;
    for _ in 0..LIMIT {
        let d = assumed.check("k", &set, 1).await.expect("valid");
        assert!(d.tier.is_fallback(), "{d:?}");
        admitted += u64::from(d.allowed);
    }
    assert_eq!(admitted, LIMIT.div_ceil(3));

    // Redis comes back: the count is learned and checks return to Redis.
    server.restart();
    assert!(unknown.wait_closed(Duration::from_secs(10)).await);
    assert!(wait_for(Duration::from_secs(5), || unknown.instances().is_some()).await);
    assert_eq!(
        unknown.check("k", &set, 1).await.expect("valid").tier,
        Tier::Redis
    );
}

/// In a fleet whose Redis was down at its start each instance beats only
/// after its own probe, and those spread over the breaker's longest
/// cool-down: the first through hears 1. It believes a count only that long
/// (plus a deadline) after its first beat; believed a heartbeat later, an
/// outage then gave it the whole limit as its share.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_count_is_believed_only_after_the_slowest_probe() {
    let _serial = tierlimit_test::serial().await;
    let server = RedisServer::start();
    let built = Instant::now();
    let limiter = support::builder(&server.url())
        .instances(Instances::Learned { assume: None })
        .build()
        .expect("valid config");
    assert!(wait_for(Duration::from_secs(5), || limiter.instances().is_some()).await);
    let learned_after = built.elapsed();
    let slowest_probe = support::breaker().max_cool_down + DEADLINE;
    assert!(
        learned_after >= slowest_probe,
        "believed {learned_after:?} after the first beat, before {slowest_probe:?}"
    );
    assert_eq!(limiter.instances(), Some(1));
}

/// Regression (issue 9, item 5): after Redis restarted empty the heartbeat set
/// was gone, the first instances to beat learned 1, then 2, and a second
/// outage within that second gave each the whole limit or half of it: with
/// three instances and a fixed window of 61 per 2 s, kill -> 2 s healthy ->
/// kill admitted 83-113 per window of the second outage against a bound of 63.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_loop_does_not_widen_local_shares() {
    let _serial = tierlimit_test::serial().await;
    const LIMIT: u64 = 61;
    const INSTANCES: u64 = 3;
    const PERIOD_MS: u64 = 2_000;
    let mut server = RedisServer::start();
    let limiters: Arc<Vec<HybridLimiter>> = Arc::new(
        (0..INSTANCES)
            .map(|_| production(&server.url()).build().expect("valid config"))
            .collect(),
    );
    assert!(
        wait_for(Duration::from_secs(5), || limiters
            .iter()
            .all(|l| l.instances() == Some(INSTANCES)))
        .await,
        "the heartbeat did not teach every limiter there are 3"
    );
    let set = Arc::new(
        RuleSet::new(
            "loop",
            [Rule::with_period(LIMIT, Duration::from_millis(PERIOD_MS))
                .and_then(|r| r.with_algorithm(Algorithm::FixedWindow))
                .expect("valid")],
        )
        .expect("valid")
        .with_policy(Policy::LocalFallback),
    );

    // Load on one key from every instance; admissions counted per fixed window
    // (wall clock: the window is aligned to the Unix epoch), with the window's
    // share of checks answered locally.
    let per_window = Arc::new(Mutex::new(BTreeMap::<u64, (u64, u64)>::new()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut tasks = Vec::new();
    for i in 0..INSTANCES as usize {
        let (limiters, set, per_window, stop) = (
            limiters.clone(),
            set.clone(),
            per_window.clone(),
            stop.clone(),
        );
        tasks.push(tokio::spawn(async move {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let d = limiters[i].check("hot", &set, 1).await.expect("valid");
                let window = unix_ms() / PERIOD_MS;
                {
                    let mut w = per_window.lock().expect("lock");
                    let e = w.entry(window).or_default();
                    e.0 += u64::from(d.allowed);
                    e.1 += u64::from(d.tier == Tier::Local);
                }
                tokio::time::sleep(Duration::from_micros(500)).await;
            }
        }));
    }

    tokio::time::sleep(Duration::from_secs(1)).await;
    server.kill9();
    assert!(
        wait_for(Duration::from_secs(3), || limiters
            .iter()
            .all(|l| l.breaker_state() != BreakerState::Closed))
        .await
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    server.restart();
    assert!(
        wait_for(Duration::from_secs(5), || limiters
            .iter()
            .all(|l| l.breaker_state() == BreakerState::Closed))
        .await,
        "the limiters did not return to Redis"
    );
    // About 2 s healthy on an empty Redis: the count must never fall.
    let healthy_until = Instant::now() + Duration::from_secs(2);
    let mut lowest = INSTANCES;
    while Instant::now() < healthy_until {
        for l in limiters.iter() {
            lowest = lowest.min(l.instances().unwrap_or(0));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    server.kill9();
    let second_outage = unix_ms();
    tokio::time::sleep(Duration::from_millis(3 * PERIOD_MS + 500)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for t in tasks {
        t.await.expect("load task");
    }

    assert_eq!(
        lowest, INSTANCES,
        "an instance used a smaller count while Redis came back empty"
    );
    // Windows wholly inside the second outage, with local decisions in them.
    let first_window = second_outage / PERIOD_MS + 1;
    let w = per_window.lock().expect("lock");
    let judged: Vec<(u64, (u64, u64))> = w
        .range(first_window..first_window + 3)
        .map(|(k, v)| (*k, *v))
        .collect();
    assert!(
        judged.len() >= 2 && judged.iter().all(|(_, (_, local))| *local > 0),
        "the second outage's windows were not decided locally: {judged:?}"
    );
    for (window, (admitted, _)) in &judged {
        assert!(
            *admitted <= LIMIT + INSTANCES,
            "window {window} of the second outage admitted {admitted} > {}",
            LIMIT + INSTANCES
        );
    }
}

/// Regression (issue 9, item 16): FailOpen admitted with `remaining = 0` (as
/// if the next request would be denied), so the fields meant different things
/// in different tiers. Each tier is held to the one meaning documented on
/// `Decision`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_tier_fills_the_decision_fields_with_one_meaning() {
    let _serial = tierlimit_test::serial().await;
    const LIMIT: u64 = 6;
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    let limiter = production(&proxy.url())
        .instances(Instances::Fixed(2))
        .build()
        .expect("valid config");
    let rule = || Rule::per_minute(LIMIT).expect("valid");
    let set = |name: &str, policy| {
        RuleSet::new(name, [rule()])
            .expect("valid")
            .with_policy(policy)
    };
    let (local, open, closed) = (
        set("local", Policy::LocalFallback),
        set("open", Policy::FailOpen),
        set("closed", Policy::FailClosed),
    );

    // Redis: the global count.
    let d = limiter.check("a", &local, 1).await.expect("valid");
    assert_eq!(
        (d.tier, d.allowed, d.limit, d.remaining),
        (Tier::Redis, true, LIMIT, LIMIT - 1)
    );
    assert!(d.reset_after > Duration::ZERO && d.retry_after.is_none());
    for _ in 1..LIMIT {
        limiter.check("a", &local, 1).await.expect("valid");
    }
    let denied = limiter.check("a", &local, 1).await.expect("valid");
    assert_eq!(
        (denied.tier, denied.allowed, denied.remaining),
        (Tier::Redis, false, 0)
    );
    assert!(denied.retry_after.is_some_and(|r| r > Duration::ZERO));
    // DenyCache: Redis' denial, with what is left of its wait.
    let cached = limiter.check("a", &local, 1).await.expect("valid");
    assert_eq!(
        (cached.tier, cached.limit, cached.remaining),
        (Tier::DenyCache, LIMIT, 0)
    );
    assert!(cached.retry_after <= denied.retry_after);

    proxy.set(tierlimit_test::Fault::Refuse);
    support::trip(&limiter, &local).await;
    // Local: the global limit, this instance's remaining (ceil(6 / 2) = 3 share).
    let d = limiter.check("b", &local, 1).await.expect("valid");
    assert_eq!(
        (d.tier, d.allowed, d.limit, d.remaining),
        (Tier::Local, true, LIMIT, 2)
    );
    assert!(d.reset_after > Duration::ZERO && d.retry_after.is_none());
    // FailOpen: nothing enforced, nothing counted against the key.
    let d = limiter.check("b", &open, 1).await.expect("valid");
    assert_eq!(
        (
            d.tier,
            d.allowed,
            d.limit,
            d.remaining,
            d.reset_after,
            d.retry_after
        ),
        (Tier::FailOpen, true, LIMIT, LIMIT, Duration::ZERO, None)
    );
    // FailClosed: nothing left; a retry may pass after the next probe.
    let d = limiter.check("b", &closed, 1).await.expect("valid");
    assert_eq!(
        (d.tier, d.allowed, d.limit, d.remaining),
        (Tier::FailClosed, false, LIMIT, 0)
    );
    let retry = d.retry_after.expect("a denial has a retry-after");
    assert!(retry >= Duration::from_millis(1));
    assert_eq!(d.reset_after, retry);
    proxy.set(tierlimit_test::Fault::None);
}

/// Regression (chaos `crash-loop`, stop 28): Redis came back briefly and
/// went again before the key was asked of it. The second outage started the
/// key from the seed of before the first (here none: full), and the fleet
/// admitted a second round of shares in the same hour.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_outage_before_redis_hears_of_the_key_goes_on_from_the_first() {
    let _serial = tierlimit_test::serial().await;
    const LIMIT: u64 = 60;
    const INSTANCES: u64 = 3;
    let (_server, proxy, limiters) = fleet_behind_a_proxy(INSTANCES).await;
    let set = hourly(LIMIT);
    let mut fleet = 0;
    for outage in 1..=2 {
        cut_off(&proxy, &limiters).await;
        for l in &limiters {
            let (admitted, tiers) = hammer(l, &set, 30).await;
            assert_eq!(tiers, vec![Tier::Local], "outage {outage}");
            fleet += admitted;
        }
        // Back, and what was admitted written back, but no check of the key.
        heal(&proxy, &limiters).await;
    }
    assert!(
        fleet <= LIMIT + INSTANCES,
        "the fleet admitted {fleet} in two outages of one hour, bound {}",
        LIMIT + INSTANCES
    );
}

/// A breaker tripped by slow answers wakes its prober as one tripped by
/// failures does: the probe comes after the cool-down. Only a failure woke
/// it, so after a trip by slow answers the prober slept on to its
/// half-second safety timeout, and `FailClosed` sets were denied, and told
/// to retry in 1 ms, for that long. Tripped right after a close, when the
/// prober has just begun that wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trip_by_slow_answers_is_probed_after_its_cool_down() {
    let _serial = tierlimit_test::serial().await;
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    let mut breaker = support::breaker();
    breaker.cool_down = Duration::from_millis(50);
    breaker.minimum_calls = 2;
    breaker.slow_call_threshold = Duration::from_millis(10);
    let limiter = Arc::new(
        support::builder(&proxy.url())
            .breaker(breaker)
            .build()
            .expect("valid config"),
    );
    let set = hourly(1_000);
    // An outage of failures, probed and closed.
    proxy.set(tierlimit_test::Fault::Refuse);
    support::trip(&limiter, &set).await;
    proxy.set(tierlimit_test::Fault::None);
    assert!(limiter.wait_closed(Duration::from_secs(5)).await);
    // Answers of about 20 ms, slow but within the deadline, trip it again.
    proxy.set(tierlimit_test::Fault::Latency(Duration::from_millis(10)));
    let origin = Instant::now();
    let log = support::StateLog::start(limiter.clone(), origin);
    let mut answers = 0;
    while limiter.breaker_state() == BreakerState::Closed {
        assert!(origin.elapsed() < Duration::from_secs(2), "no trip");
        let d = limiter.check("k", &set, 1).await.expect("valid");
        answers += usize::from(d.tier == Tier::Redis);
    }
    assert!(answers >= 1, "tripped by failures, not slow answers");
    let tripped = log.first(BreakerState::Open, Duration::ZERO);
    let tripped = tripped.unwrap_or_else(|| origin.elapsed());
    assert!(
        wait_for(Duration::from_secs(2), || log
            .first(BreakerState::HalfOpen, tripped)
            .is_some())
        .await,
        "no probe"
    );
    let probed = log
        .first(BreakerState::HalfOpen, tripped)
        .unwrap_or_default()
        - tripped;
    assert!(
        probed < Duration::from_millis(200),
        "the first probe came {probed:?} after the trip, the cool-down is 50 ms"
    );
}

/// `n` limiters of a fixed instance count `n`, reaching a fresh Redis
/// through one fault proxy.
async fn fleet_behind_a_proxy(n: u64) -> (RedisServer, FaultProxy, Vec<HybridLimiter>) {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    let limiters = (0..n)
        .map(|_| {
            production(&proxy.url())
                .instances(Instances::Fixed(n))
                .build()
                .expect("valid config")
        })
        .collect();
    (server, proxy, limiters)
}

/// Starts an outage: the proxy refuses, and every limiter's breaker trips.
async fn cut_off(proxy: &FaultProxy, limiters: &[HybridLimiter]) {
    proxy.set(tierlimit_test::Fault::Refuse);
    let trip = RuleSet::new("trip", [Rule::per_second(1_000).expect("valid")]).expect("valid");
    for l in limiters {
        support::trip(l, &trip).await;
    }
}

/// Ends an outage: the proxy passes, and every limiter is back and has
/// written back what it admitted locally.
async fn heal(proxy: &FaultProxy, limiters: &[HybridLimiter]) {
    proxy.set(tierlimit_test::Fault::None);
    for l in limiters {
        support::drained(l, Duration::from_secs(10)).await;
    }
}

/// An outage in which every limiter tries 30 checks of the hot key: what
/// they admit, on top of the `fleet` admitted before in the hour, stays
/// within the limit and one unit per instance.
async fn outage_within_the_hours_bound(
    proxy: &FaultProxy,
    limiters: &[HybridLimiter],
    set: &RuleSet,
    limit: u64,
    mut fleet: u64,
) {
    cut_off(proxy, limiters).await;
    for l in limiters {
        let (admitted, _) = hammer(l, set, 30).await;
        fleet += admitted;
    }
    proxy.set(tierlimit_test::Fault::None);
    let bound = limit + limiters.len() as u64;
    assert!(
        fleet <= bound,
        "the fleet admitted {fleet} over the hour, bound {bound}"
    );
}

/// Admits through `limiter` until `tries` checks were made; returns how many
/// were admitted and by which tiers.
async fn hammer(limiter: &HybridLimiter, set: &RuleSet, tries: usize) -> (u64, Vec<Tier>) {
    let mut admitted = 0;
    let mut tiers = Vec::new();
    for _ in 0..tries {
        let d = limiter.check("hot", set, 1).await.expect("valid");
        admitted += u64::from(d.allowed);
        if !tiers.contains(&d.tier) {
            tiers.push(d.tier);
        }
    }
    (admitted, tiers)
}

/// A call that fails while the breaker stays Closed is decided locally, by a
/// bucket of its own: Redis' next report on the key (which counts what the
/// bucket admitted, written back with the key's next check) supersedes it.
/// Before, no probe ended such a one-call outage, so the bucket stayed
/// current, and the next real outage went on from its leftover instead of
/// from Redis' last word: about twice the limit over the hour.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_failed_call_leaves_no_bucket_for_the_next_outage() {
    let _serial = tierlimit_test::serial().await;
    const LIMIT: u64 = 60;
    const INSTANCES: u64 = 3;
    let (_server, proxy, limiters) = fleet_behind_a_proxy(INSTANCES).await;
    let set = hourly(LIMIT);
    let mut fleet = 0;

    // One refused call per instance: admitted by a local bucket of the share
    // (20), the breaker still Closed.
    proxy.set(tierlimit_test::Fault::Refuse);
    for l in &limiters {
        let (admitted, tiers) = hammer(l, &set, 1).await;
        assert_eq!((admitted, tiers), (1, vec![Tier::Local]));
        assert_eq!(l.breaker_state(), BreakerState::Closed);
        fleet += admitted;
    }
    proxy.set(tierlimit_test::Fault::None);
    // Healthy: each instance's next check carries its write-back, and Redis
    // admits until 3 are left (no denial, which would be cached).
    for _ in 0..18 {
        for l in &limiters {
            let (admitted, tiers) = hammer(l, &set, 1).await;
            assert_eq!((admitted, tiers), (1, vec![Tier::Redis]));
            fleet += admitted;
        }
    }
    for l in &limiters {
        assert_eq!(l.reconcile_stats().pending_units, 0, "a write-back waits");
    }
    assert_eq!(fleet, LIMIT - 3);

    // A real outage: every instance starts from Redis' last word (3 left).
    outage_within_the_hours_bound(&proxy, &limiters, &set, LIMIT, fleet).await;
}

/// Regression (issue 9, item 1): a local bucket outlived its outage. Three
/// instances, an hourly rule: a first outage in which each instance uses part
/// of its share, healthy traffic through Redis, a second outage. The second
/// outage started from the first one's leftover buckets, so the fleet admitted
/// about twice the limit over the hour.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_outage_starts_from_what_redis_last_said() {
    let _serial = tierlimit_test::serial().await;
    const LIMIT: u64 = 60;
    const INSTANCES: u64 = 3;
    let (_server, proxy, limiters) = fleet_behind_a_proxy(INSTANCES).await;
    let set = hourly(LIMIT);
    let mut fleet = 0;

    // Outage 1: each instance admits 10 of its share of 20.
    cut_off(&proxy, &limiters).await;
    for l in &limiters {
        let (admitted, tiers) = hammer(l, &set, 10).await;
        assert_eq!((admitted, tiers), (10, vec![Tier::Local]));
        fleet += admitted;
    }
    heal(&proxy, &limiters).await;
    // Healthy, traffic from every instance in turn: Redis (which now holds
    // the 30 written back) admits 27 more, and each instance hears what is
    // left (no denial yet: a cached denial would answer the next outage by
    // itself and hide its buckets).
    for _ in 0..9 {
        for l in &limiters {
            let (admitted, tiers) = hammer(l, &set, 1).await;
            assert!(
                tiers
                    .iter()
                    .all(|t| matches!(t, Tier::Redis | Tier::DenyCache))
            );
            fleet += admitted;
        }
    }
    assert_eq!(
        fleet,
        LIMIT - 3,
        "Redis did not hold what was admitted locally"
    );

    // Outage 2: every instance starts from Redis' last word (nothing left).
    outage_within_the_hours_bound(&proxy, &limiters, &set, LIMIT, fleet).await;
}

/// An instance that stops beating without leaving (a crash) stays counted
/// for at least one instance TTL and at most two (README), then the others
/// widen their shares: not before (they would over-admit while it may still
/// be admitting its share), and not never or much later (they would stay at
/// a share too small).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_instance_is_counted_for_one_to_two_ttls_then_dropped() {
    let _serial = tierlimit_test::serial().await;
    const TTL: Duration = Duration::from_secs(1);
    let server = RedisServer::start();
    let start = || {
        production(&server.url())
            .instance_ttl(TTL)
            .build()
            .expect("valid config")
    };
    let (a, b) = (start(), start());
    assert!(
        wait_for(Duration::from_secs(5), || a.instances() == Some(2)
            && b.instances() == Some(2))
        .await,
        "the two never counted each other: {:?} {:?}",
        a.instances(),
        b.instances()
    );
    // Dropped without a shutdown: no leave, its tasks stop.
    drop(b);
    let crashed = Instant::now();
    assert!(
        wait_for(TTL * 5, || a.instances() == Some(1)).await,
        "the crashed instance was still counted {:?} after its last beat",
        TTL * 5
    );
    let counted = crashed.elapsed();
    eprintln!("the crashed instance was counted for {counted:?}");
    // Its last beat was at most one heartbeat (100 ms) before the drop.
    assert!(
        counted >= TTL - Duration::from_millis(100),
        "the crashed instance was dropped after {counted:?}, before its TTL of {TTL:?}"
    );
    // The README's bound: up to two TTLs (its entry lives one, the largest
    // count heard is kept for another), seen at the next beat of `a` (100
    // ms), with half a second for a busy machine's scheduling.
    assert!(
        counted <= TTL * 2 + Duration::from_millis(600),
        "the crashed instance was still counted {counted:?} after it stopped, past two TTLs of {TTL:?}"
    );
}

/// `Instances::Fixed(n)` never asks Redis: no heartbeat key appears however
/// long the limiter runs (ten heartbeat periods of checks here), and the
/// count stays `n`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fixed_instance_count_never_writes_a_heartbeat() {
    let server = RedisServer::start();
    let limiter =
        support::healthy(support::builder(&server.url()).instances(Instances::Fixed(3))).await;
    let set = hourly(1_000);
    let until = Instant::now() + Duration::from_secs(1);
    let mut checks = 0;
    while Instant::now() < until {
        let d = limiter
            .check(&format!("k{checks}"), &set, 1)
            .await
            .expect("valid");
        assert_eq!(d.tier, Tier::Redis, "{d:?}");
        checks += 1;
    }
    let mut conn = server.conn().await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("tl:{instances}*")
        .query_async(&mut conn)
        .await
        .expect("KEYS");
    assert!(keys.is_empty(), "after {checks} checks: {keys:?}");
    assert_eq!(limiter.instances(), Some(3));
}
