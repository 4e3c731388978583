//! Reconciliation against real redis-server processes: after an outage Redis
//! learns every unit admitted locally, nothing is lost and nothing counted twice.

mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use support::{builder, drained, healthy, trip, wait_for};
use tierlimit::{
    Algorithm, BreakerState, Instances, LocalConfig, Policy, RedisFailure, Rule, RuleSet, Tier,
};
use tierlimit_core::{Clock, MAX_SLIDING_LOG_LIMIT, SystemClock};
use tierlimit_test::{Fault, FaultProxy, Load, RedisServer, quantile};

const DAY: u64 = 86_400;

/// A period of whole days whose current window is well inside (10% to 90%), so
/// window counters cannot roll over while a test runs.
fn mid_window_days(now_s: u64) -> u64 {
    (1..=7u64)
        .find(|d| {
            let p = d * DAY;
            let into = now_s % p;
            into > p / 10 && into < p * 9 / 10
        })
        .unwrap_or(7)
}

/// Units a rule's Redis state holds for one key, as its algorithm counts them.
async fn used(conn: &mut redis::aio::MultiplexedConnection, key: &str, rule: &Rule) -> f64 {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(conn).await.expect("TIME");
    let now = (secs * 1_000_000 + micros) as f64;
    let t = rule.period_micros() as f64 / rule.limit() as f64;
    match rule.algorithm() {
        Algorithm::Gcra => {
            let v: Option<String> = redis::cmd("GET")
                .arg(key)
                .query_async(conn)
                .await
                .expect("GET");
            // "<TAT>@<limit it was written under>" (lua/gcra.lua).
            v.map_or(0.0, |v| {
                let (tat, written) = v.split_once('@').expect("TAT@limit");
                let written_t =
                    rule.period_micros() as f64 / written.parse::<f64>().expect("limit");
                ((tat.parse::<f64>().expect("TAT") - now) / written_t).max(0.0)
            })
        }
        Algorithm::TokenBucket => {
            // {used, ts, limit}: used units at ts, draining at the limit
            // they were written under (lua/token_bucket.lua).
            let (used, ts, written): (Option<f64>, Option<f64>, Option<f64>) = redis::cmd("HMGET")
                .arg(key)
                .arg("used")
                .arg("ts")
                .arg("limit")
                .query_async(conn)
                .await
                .expect("HMGET");
            let t = written.map_or(t, |limit| rule.period_micros() as f64 / limit);
            match (used, ts) {
                (Some(used), Some(ts)) => (used - (now - ts) / t).max(0.0),
                _ => 0.0,
            }
        }
        Algorithm::SlidingLog => {
            let since = format!("({}", now as u64 - rule.period_micros());
            let n: u64 = redis::cmd("ZCOUNT")
                .arg(key)
                .arg(since)
                .arg("+inf")
                .query_async(conn)
                .await
                .expect("ZCOUNT");
            n as f64
        }
        _ => {
            let c: Option<u64> = redis::cmd("HGET")
                .arg(key)
                .arg("c")
                .query_async(conn)
                .await
                .expect("HGET");
            c.unwrap_or(0) as f64
        }
    }
}

/// Acceptance 1: three instances under load, Redis blackholed for seconds while
/// its data survives; afterwards every key holds its Redis usage from before the
/// outage plus every unit admitted locally.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_lost_across_three_instances() {
    let _serial = tierlimit_test::serial().await;
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    let now_s = SystemClock.unix_micros() / 1_000_000;
    let days = mid_window_days(now_s);
    let fixed_offset = {
        // Put "now" in the middle of a natural day.
        let into = (now_s % DAY) as i64;
        (DAY as i64 / 2 - into) % DAY as i64
    };
    // A sliding log takes at most 1,000; 40 keys keep every key well under it.
    let limit = MAX_SLIDING_LOG_LIMIT;
    let rules = vec![
        Rule::per_day(limit).expect("valid"),
        Rule::per_day(limit)
            .and_then(|r| r.with_algorithm(Algorithm::TokenBucket))
            .expect("valid"),
        Rule::per_day(limit)
            .and_then(|r| r.with_algorithm(Algorithm::SlidingLog))
            .expect("valid"),
        Rule::with_period(limit, Duration::from_secs(days * DAY))
            .and_then(|r| r.with_algorithm(Algorithm::SlidingWindow))
            .expect("valid"),
        Rule::per_natural_day(limit, fixed_offset).expect("valid"),
    ];
    let set = Arc::new(
        RuleSet::new("ledger", rules.clone())
            .expect("valid")
            .with_policy(Policy::LocalFallback),
    );
    let mut limiters = Vec::new();
    for _ in 0..3 {
        limiters.push(healthy(builder(&proxy.url()).instances(Instances::Fixed(3))).await);
    }
    let started = Instant::now();

    // Per key: units Redis admitted, units admitted without Redis, and checks
    // whose Redis call failed in a way that may have run the script anyway.
    let counts = Arc::new(Mutex::new(HashMap::<String, (u64, u64, u64)>::new()));
    let (ls, s, c) = (Arc::new(limiters.clone()), set.clone(), counts.clone());
    let load = Load::start(12, Duration::from_millis(4), move |t, i| {
        let (ls, s, c) = (ls.clone(), s.clone(), c.clone());
        async move {
            let key = format!("k{}", (t as u64 * 7 + i) % 40);
            let d = ls[t % 3].check(&key, &s, 1).await;
            if let Ok(d) = &d {
                let mut c = c.lock().expect("lock");
                let e = c.entry(key).or_default();
                match d.tier {
                    Tier::Redis => e.0 += u64::from(d.allowed),
                    _ => {
                        e.1 += u64::from(d.allowed);
                        e.2 += u64::from(d.redis_failure.is_some_and(RedisFailure::may_have_run));
                    }
                }
            }
            (t % 3, d)
        }
    });
    tokio::time::sleep(Duration::from_millis(800)).await;
    proxy.set(Fault::Blackhole);
    assert!(
        wait_for(Duration::from_secs(2), || limiters
            .iter()
            .all(|l| l.breaker_state() != BreakerState::Closed))
        .await
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let samples = load.stop().await;
    assert!(samples.errors().is_empty());
    proxy.set(Fault::None);
    for l in &limiters {
        drained(l, Duration::from_secs(10)).await;
    }
    let counts = counts.lock().expect("lock").clone();
    let mut conn = server.conn().await;
    let (mut total_local, mut total_unknown) = (0, 0);
    for (key, (redis_units, local_units, unknown)) in &counts {
        total_local += local_units;
        total_unknown += unknown;
        let expected = (redis_units + local_units) as f64;
        for (i, rule) in rules.iter().enumerate() {
            let got = used(&mut conn, &set.storage_key(key, i), rule).await;
            // Refill since the first check, for the rules that refill.
            let refill = match rule.algorithm() {
                Algorithm::Gcra | Algorithm::TokenBucket => {
                    started.elapsed().as_secs_f64() * rule.limit() as f64
                        / rule.period().as_secs_f64()
                }
                _ => 0.0,
            };
            let (lo, hi) = (expected - refill - 1e-6, expected + *unknown as f64 + 1e-6);
            assert!(
                got >= lo && got <= hi,
                "{key} rule {i} ({:?}): Redis holds {got:.3} units; expected {expected} ({redis_units} via Redis + {local_units} local), allowing {refill:.3} refilled and {unknown} unknown-outcome calls",
                rule.algorithm()
            );
        }
    }
    let reconciled: u64 = limiters
        .iter()
        .map(|l| l.reconcile_stats().reconciled_units)
        .sum();
    println!(
        "nothing lost: {} keys, {total_local} units admitted locally, {reconciled} unit-rules reconciled over {} rules, {total_unknown} calls of unknown outcome",
        counts.len(),
        rules.len()
    );
    assert!(
        total_local > 300,
        "too little was admitted locally to show anything: {total_local}"
    );
    assert_eq!(reconciled, total_local * rules.len() as u64);
}

/// A rule set for tripping the breaker: its 1 s window is not reconciled, so it
/// adds nothing to the ledger.
/// The rule set that trips the breaker. Its own checks are not what these
/// tests count, so it is not written back (every rule is, by default).
fn pinger() -> RuleSet {
    RuleSet::new("ping", [Rule::per_second(1_000).expect("valid")])
        .expect("valid")
        .with_reconcile(false)
}

fn hourly(name: &str, limit: u64) -> RuleSet {
    RuleSet::new(name, [Rule::per_hour(limit).expect("valid")]).expect("valid")
}

/// Acceptance 5: a client that used its whole hourly quota locally during the
/// outage is denied by Redis afterwards: it does not get a second quota.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quota_used_locally_is_not_handed_out_again() {
    let _serial = tierlimit_test::serial().await;
    let server = RedisServer::start();
    let limiter = healthy(builder(&server.url())).await;
    let set = hourly("quota", 20);
    server.pause();
    trip(&limiter, &pinger()).await;
    let mut admitted = 0;
    for _ in 0..40 {
        let d = limiter
            .check("spender", &set, 1)
            .await
            .expect("valid input");
        assert_eq!(d.tier, Tier::Local);
        admitted += u64::from(d.allowed);
    }
    assert_eq!(admitted, 20, "the whole quota, once, locally");
    server.resume();
    drained(&limiter, Duration::from_secs(5)).await;
    // For the breaker's longest cool-down plus a deadline after the heal, the
    // outage's own bucket still bounds the key (other instances may still be
    // on their way back): only after that does Redis alone decide.
    tokio::time::sleep(support::breaker().max_cool_down + support::DEADLINE).await;
    let d = limiter
        .check("spender", &set, 1)
        .await
        .expect("valid input");
    println!(
        "after reconciliation: allowed={} tier={:?} retry_after={:?}",
        d.allowed, d.tier, d.retry_after
    );
    assert_eq!(d.tier, Tier::Redis);
    assert!(!d.allowed, "Redis handed out a second quota");
}

/// Acceptance 3: Redis hangs again halfway through a drain; no entry is lost,
/// none applied twice, and the drain completes after the next recovery. A
/// batch in flight at the hang, when there is one (the drain sends in bursts,
/// so not in every run), runs when Redis resumes and is then re-sent under
/// its id: the exact count per key below holds either way. That a batch
/// re-sent under its id applies nothing is `tierlimit-redis`'s
/// `reconcile.rs ledger_units_count_once`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_interrupted_by_a_second_outage_completes_exactly() {
    let _serial = tierlimit_test::serial().await;
    const KEYS: u64 = 20_000;
    let server = RedisServer::start();
    let limiter = healthy(builder(&server.url()).local(LocalConfig {
        max_keys: 100_000,
        ..LocalConfig::default()
    }))
    .await;
    let set = hourly("drain", 100);
    let pinger = pinger();

    server.pause();
    trip(&limiter, &pinger).await;
    let admitted_at = Instant::now();
    for i in 0..KEYS {
        let d = limiter
            .check(&format!("u{i}"), &set, 1)
            .await
            .expect("valid input");
        assert!(d.allowed && d.tier == Tier::Local);
    }
    assert_eq!(limiter.local().ledger().units(), KEYS);
    server.resume();
    assert!(limiter.wait_closed(Duration::from_secs(5)).await);
    assert!(
        wait_for(Duration::from_secs(10), || limiter
            .reconcile_stats()
            .reconciled_units
            >= KEYS / 3)
        .await,
        "the drain did not start"
    );
    server.pause();
    // Checks notice the hang and trip the breaker; the drain stops with it.
    trip(&limiter, &pinger).await;
    let halfway = limiter.reconcile_stats();
    println!(
        "second outage after {} of {KEYS} units",
        halfway.reconciled_units
    );
    assert!(
        halfway.pending_units > 0,
        "the drain finished before the second outage"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.resume();
    drained(&limiter, Duration::from_secs(20)).await;
    let stats = limiter.reconcile_stats();
    println!("{stats:?}");

    // Every key holds exactly one unit, less what refilled since it was
    // admitted (100/hour: one unit per 36 s): none lost, none twice.
    let mut conn = server.conn().await;
    let rule = &set.rules()[0];
    let mut wrong = Vec::new();
    for i in 0..KEYS {
        let u = used(&mut conn, &set.storage_key(&format!("u{i}"), 0), rule).await;
        let refill = admitted_at.elapsed().as_secs_f64() / 36.0;
        if u < 1.0 - refill - 1e-6 || u > 1.0 + 1e-6 {
            wrong.push((i, u));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} keys not at one unit, e.g. {:?}",
        wrong.len(),
        &wrong[..wrong.len().min(5)]
    );
    assert_eq!(stats.reconciled_units, KEYS);
}

/// Acceptance 4: entries whose window passed during the outage are dropped and
/// counted, not written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_entries_are_dropped_and_counted() {
    let _serial = tierlimit_test::serial().await;
    let server = RedisServer::start();
    let limiter = healthy(builder(&server.url())).await;
    let short = RuleSet::new(
        "short",
        [Rule::with_period(50, Duration::from_millis(500)).expect("valid")],
    )
    .expect("valid")
    .with_reconcile(true);
    server.pause();
    trip(&limiter, &pinger()).await;
    let mut local = 0;
    for i in 0..40 {
        local += u64::from(
            limiter
                .check(&format!("s{}", i % 4), &short, 1)
                .await
                .expect("valid")
                .allowed,
        );
    }
    assert_eq!(limiter.local().ledger().units(), local);
    tokio::time::sleep(Duration::from_millis(700)).await;
    server.resume();
    drained(&limiter, Duration::from_secs(5)).await;
    let stats = limiter.reconcile_stats();
    println!("expired: {stats:?}");
    assert_eq!(stats.expired_units, local);
    assert_eq!(stats.reconciled_units, 0);
    let mut conn = server.conn().await;
    let written: Vec<String> = redis::cmd("KEYS")
        .arg("*:short:*")
        .query_async(&mut conn)
        .await
        .expect("KEYS");
    assert!(
        written.is_empty(),
        "keys written for expired entries: {written:?}"
    );
}

/// Acceptance 6: checks keep their latency while a drain of 100,000 entries runs:
/// p99 within 2x of the p99 with no drain, measured in the same test.
///
/// This machine's p99 wanders by 3x between windows seconds apart (the host
/// takes its CPUs away now and then), so a baseline measured before or after
/// the drain compares the drain with another moment's noise. Instead the drain
/// is switched on and off every second and the checks made in the two kinds of
/// second are compared: both see the same spells of noise. The drain belongs
/// to one limiter, reaching Redis through a fault proxy; "off" adds 10 ms each
/// way there, which slows its drain about fifty-fold without a failure or a
/// slow call. The checks measured are a second limiter's in the same process
/// and runtime, on the same Redis, reached directly: everything a drain shares
/// with checks (Redis, the runtime's workers, the machine) is shared, and
/// nothing the switch does touches them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_keep_their_latency_during_a_large_drain() {
    let _serial = tierlimit_test::serial().await;
    const ENTRIES: u64 = 100_000;
    const PHASE: Duration = Duration::from_secs(1);
    // After a switch, what the other phase left in flight settles first.
    const SETTLE: Duration = Duration::from_millis(100);
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    let drainer = healthy(builder(&proxy.url()).local(LocalConfig {
        max_keys: 200_000,
        ..LocalConfig::default()
    }))
    .await;
    let checker = healthy(builder(&server.url())).await;
    let set = hourly("bulk", 100);
    let probe = Arc::new(
        RuleSet::new("probe-load", [Rule::per_second(100_000).expect("valid")]).expect("valid"),
    );

    proxy.set(Fault::Blackhole);
    trip(&drainer, &pinger()).await;
    for i in 0..ENTRIES {
        drainer
            .check(&format!("b{i}"), &set, 1)
            .await
            .expect("valid input");
    }
    assert_eq!(drainer.local().ledger().len() as u64, ENTRIES);
    let off = Fault::Latency(Duration::from_millis(10));
    proxy.set(off);
    assert!(drainer.wait_closed(Duration::from_secs(5)).await);

    let (c, p) = (checker.clone(), probe.clone());
    let load = Load::start(4, Duration::from_millis(1), move |t, i| {
        let (c, p) = (c.clone(), p.clone());
        async move {
            (
                0,
                c.check(&format!("p{}", (t as u64 + i) % 16), &p, 1).await,
            )
        }
    });
    // Phases: (start, end, drain on), and units reconciled in each kind.
    let mut phases = Vec::new();
    let (mut units_on, mut units_off) = (0, 0);
    let mut on = false;
    let end = Instant::now() + Duration::from_secs(120);
    while drainer.reconcile_stats().pending_units > 0 && Instant::now() < end {
        on = !on;
        proxy.set(if on { Fault::None } else { off });
        let (from, before) = (load.elapsed(), drainer.reconcile_stats().reconciled_units);
        tokio::time::sleep(PHASE).await;
        let units = drainer.reconcile_stats().reconciled_units - before;
        *(if on { &mut units_on } else { &mut units_off }) += units;
        phases.push((from + SETTLE, load.elapsed(), on));
    }
    let samples = load.stop().await;
    assert_eq!(
        drainer.reconcile_stats().pending_units,
        0,
        "the drain did not finish within 120 s"
    );
    assert!(samples.errors().is_empty());
    // The switch works: the drain ran in the "on" seconds only.
    assert!(
        units_off * 20 <= units_on,
        "{units_off} units drained while off, {units_on} while on"
    );

    let p99 = |drain: bool| {
        let latencies: Vec<_> = samples
            .all
            .iter()
            .filter(|s| s.tier() == Some(Tier::Redis))
            .filter(|s| {
                phases
                    .iter()
                    .any(|&(from, to, on)| on == drain && s.at >= from && s.at + s.latency <= to)
            })
            .map(|s| s.latency)
            .collect();
        (quantile(latencies.iter().copied(), 0.99), latencies.len())
    };
    let ((drain_p99, drain_n), (idle_p99, idle_n)) = (p99(true), p99(false));
    println!(
        "drain of {ENTRIES} in {} one-second phases on ({units_on} units) and off ({units_off} units): check p99 {drain_p99:?} over {drain_n} checks with the drain on, {idle_p99:?} over {idle_n} with it off",
        phases.len()
    );
    assert!(
        drain_n > 1_000 && idle_n > 1_000,
        "too few checks: {drain_n} on, {idle_n} off"
    );
    assert!(
        drain_p99 <= idle_p99 * 2,
        "p99 with the drain on {drain_p99:?} > 2 x {idle_p99:?} with it off"
    );
}
