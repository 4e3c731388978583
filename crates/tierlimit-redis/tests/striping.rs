//! Striping a hot key (issue 14, acceptance 4): with K = 4 stripes, many
//! concurrent tasks hammering one key are admitted within the bound
//! documented on `RuleSet::with_stripes` (never above the limit; exactly the
//! limit for checks of cost 1 once demand exceeds it; at least `L - K·(c-1)`
//! for cost `c`), the stripes' keys hold their shares, and a write-back
//! spreads its units over the stripes.
//!
//! Time comes from a fake clock held still in the middle of an hour, so an
//! hourly rule neither rolls over nor refills while the test runs, whatever
//! the machine's speed: every count below is exact.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tierlimit_core::{
    Algorithm, Clock, FakeClock, LedgerEntry, Rule, RuleSet, escape_key, stripe_key, stripe_share,
};
use tierlimit_redis::{CheckRequest, RedisTier, WriteBack, Written};
use tierlimit_test::RedisServer;
use tokio::task::JoinSet;

use support::{client_time_tier, rule, set};

/// Half past some hour.
const NOW_US: u64 = 1_700_000_000_000_000 + 30 * 60_000_000;
const STRIPES: u32 = 4;
const TASKS: usize = 32;
const CONNECTIONS: usize = 4;
/// Not a multiple of 4: the stripes hold 26, 26, 26 and 25.
const LIMIT: u64 = 103;
const HOUR: Duration = Duration::from_secs(3600);
const HOT: &str = "tenant:{hot}";

fn striped(name: &str, r: Rule) -> RuleSet {
    set(name, [r]).with_stripes(STRIPES).expect("4 stripes fit")
}

struct Hammer {
    /// Units admitted.
    admitted: u64,
    /// Checks denied.
    denied: u64,
    /// Every decision's limit (the whole rule's, striped or not).
    limits: Vec<u64>,
}

/// `TASKS` tasks on `CONNECTIONS` connections check `HOT` against `set` at
/// `cost` until `demand` units have been asked for in all.
async fn hammer(tiers: &[RedisTier], set: &RuleSet, cost: u64, demand: u64) -> Hammer {
    let asked = Arc::new(AtomicU64::new(0));
    let mut tasks = JoinSet::new();
    for i in 0..TASKS {
        let (tier, set, asked) = (tiers[i % CONNECTIONS].clone(), set.clone(), asked.clone());
        tasks.spawn(async move {
            let (mut admitted, mut denied, mut limits) = (0, 0, Vec::new());
            while asked.fetch_add(cost, Ordering::Relaxed) < demand {
                let v = tier.check(HOT, &set, cost).await.expect("check");
                limits.push(v.decision.limit);
                if v.decision.allowed {
                    admitted += cost;
                } else {
                    assert!(v.decision.retry_after.is_some());
                    denied += 1;
                }
            }
            (admitted, denied, limits)
        });
    }
    let mut run = Hammer {
        admitted: 0,
        denied: 0,
        limits: Vec::new(),
    };
    while let Some(done) = tasks.join_next().await {
        let (a, d, l) = done.expect("task");
        run.admitted += a;
        run.denied += d;
        run.limits.extend(l);
    }
    run
}

async fn tiers(server: &RedisServer) -> Vec<RedisTier> {
    let clock: Arc<dyn Clock> = Arc::new(FakeClock::new(NOW_US));
    let tiers: Vec<RedisTier> = (0..CONNECTIONS)
        .map(|_| client_time_tier(&server.url(), clock.clone()))
        .collect();
    for t in &tiers {
        t.ping().await.expect("connect");
    }
    tiers
}

/// The storage key of stripe `stripe` of `HOT` under `set`'s only rule.
fn stripe_storage_key(set: &RuleSet, stripe: u32) -> String {
    set.storage_key(&stripe_key(&escape_key(HOT), stripe), 0)
}

/// Units a fixed window's stripe counted (0 when its key does not exist).
async fn window_count(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> u64 {
    let c: Option<u64> = redis::cmd("HGET")
        .arg(key)
        .arg("c")
        .query_async(conn)
        .await
        .expect("HGET");
    c.unwrap_or(0)
}

/// Units a GCRA stripe holds at the fake clock's now, and the limit it was
/// written under: its state is `<TAT>@<limit>`, the TAT `used * period /
/// limit` ahead of now.
async fn gcra_used(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> (u64, u64) {
    let state: Option<String> = redis::cmd("GET")
        .arg(key)
        .query_async(conn)
        .await
        .expect("GET");
    let state = state.unwrap_or_else(|| panic!("{key} does not exist"));
    let (tat, limit) = state.split_once('@').expect("<TAT>@<limit>");
    let (tat, limit): (f64, u64) = (tat.parse().expect("TAT"), limit.parse().expect("limit"));
    let ahead = tat - NOW_US as f64;
    let used = (ahead * limit as f64 / HOUR.as_micros() as f64).round() as u64;
    (used, limit)
}

/// Fixed window, cost 1, demand three times the limit: exactly the limit is
/// admitted (the upper bound, and the lower bound for cost 1), and each
/// stripe's counter holds exactly its share.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_fixed_window_admits_exactly_its_limit_over_its_stripes() {
    let server = RedisServer::start();
    let tiers = tiers(&server).await;
    let set = striped("hotfw", rule(Algorithm::FixedWindow, LIMIT, HOUR));
    let run = hammer(&tiers, &set, 1, 3 * LIMIT).await;
    assert_eq!(
        run.admitted, LIMIT,
        "never above L, and L once demand exceeds it"
    );
    assert_eq!(run.denied, 2 * LIMIT);
    assert!(
        run.limits.iter().all(|&l| l == LIMIT),
        "decisions name the whole limit"
    );
    let mut conn = server.conn().await;
    let mut counts = Vec::new();
    for stripe in 0..STRIPES {
        counts.push(window_count(&mut conn, &stripe_storage_key(&set, stripe)).await);
    }
    assert_eq!(counts, [26, 26, 26, 25], "each stripe full at its share");
    // Stripe 0 is the unstriped key itself; the others have hash tags of their own.
    assert_eq!(
        stripe_storage_key(&set, 0),
        set.storage_key(&escape_key(HOT), 0)
    );
    assert_eq!(
        stripe_storage_key(&set, 3),
        "tl:{tenant:%7Bhot%7D%s3}:hotfw:f3600000000"
    );
}

/// Fixed window, cost 3: never above the limit, and at least `L - K·(c-1)`
/// (103 - 4·2 = 95) once demand exceeds it. Each stripe stops within
/// `c - 1` of its share.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn costly_checks_stay_within_the_documented_bound() {
    let cost = 3;
    let server = RedisServer::start();
    let tiers = tiers(&server).await;
    let set = striped("hotcost", rule(Algorithm::FixedWindow, LIMIT, HOUR));
    let run = hammer(&tiers, &set, cost, 3 * LIMIT).await;
    let lower = LIMIT - u64::from(STRIPES) * (cost - 1);
    assert!(
        (lower..=LIMIT).contains(&run.admitted),
        "{} admitted, bound [{lower}, {LIMIT}]",
        run.admitted
    );
    let mut conn = server.conn().await;
    let mut total = 0;
    for stripe in 0..STRIPES {
        let share = stripe_share(LIMIT, STRIPES, stripe);
        let count = window_count(&mut conn, &stripe_storage_key(&set, stripe)).await;
        assert!(
            count <= share && share - count < cost,
            "stripe {stripe}: {count} of {share}"
        );
        total += count;
    }
    assert_eq!(total, run.admitted);
}

/// GCRA (burst = limit, no refill while the clock stands still): exactly the
/// limit admitted, and every stripe's state holds its share, written under
/// its share of the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_gcra_key_admits_exactly_its_burst_over_its_stripes() {
    let server = RedisServer::start();
    let tiers = tiers(&server).await;
    let set = striped("hotgcra", rule(Algorithm::Gcra, LIMIT, HOUR));
    let run = hammer(&tiers, &set, 1, 3 * LIMIT).await;
    assert_eq!(run.admitted, LIMIT);
    let mut conn = server.conn().await;
    for stripe in 0..STRIPES {
        let share = stripe_share(LIMIT, STRIPES, stripe);
        let (used, limit) = gcra_used(&mut conn, &stripe_storage_key(&set, stripe)).await;
        assert_eq!((used, limit), (share, share), "stripe {stripe}");
    }
}

/// `check_many` asks one stripe in its pipeline and the others after it: a
/// key with room anywhere is admitted, and never beyond the limit.
#[tokio::test]
async fn check_many_spreads_over_the_stripes_too() {
    let server = RedisServer::start();
    let tiers = tiers(&server).await;
    let set = striped("hotmany", rule(Algorithm::FixedWindow, 10, HOUR));
    let plain = set.clone().with_stripes(1).expect("1 stripe");
    let mut admitted = 0;
    for _ in 0..10 {
        let batch = [
            CheckRequest::new(HOT, &set, 1),
            CheckRequest::new(HOT, &set, 1),
            CheckRequest::new("other", &plain, 1),
        ];
        let results = tiers[0].check_many(&batch).await.expect("one round trip");
        for r in &results[..2] {
            if r.as_ref().expect("verdict").decision.allowed {
                admitted += 1;
            }
        }
        assert!(results[2].is_ok());
    }
    assert_eq!(admitted, 10, "20 asked, the limit of 10 admitted");
    let mut conn = server.conn().await;
    let mut counts = Vec::new();
    for stripe in 0..STRIPES {
        counts.push(window_count(&mut conn, &stripe_storage_key(&set, stripe)).await);
    }
    assert_eq!(counts, [3, 3, 2, 2]);
}

/// A striped ledger entry is written back over the stripes by their shares
/// (no stripe beyond its share, every unit counted), once: re-sent under its
/// id, it changes nothing.
#[tokio::test]
async fn a_write_back_spreads_over_the_stripes_once() {
    let server = RedisServer::start();
    let tiers = tiers(&server).await;
    let whole = rule(Algorithm::FixedWindow, LIMIT, HOUR);
    let set = striped("hotrc", whole.clone());
    let at = NOW_US - 1_000;
    let entry =
        LedgerEntry::new(stripe_storage_key(&set, 0), whole, 10, at, at).with_stripes(STRIPES);
    let writes = [WriteBack::new("wb-1", &entry)];
    let first = tiers[0].reconcile(&writes).await.expect("call");
    assert_eq!(first.len(), 1, "one outcome per write-back");
    assert_eq!(first[0].as_ref().expect("written"), &Written::Applied(10));
    let again = tiers[0].reconcile(&writes).await.expect("call");
    assert_eq!(
        again[0].as_ref().expect("written"),
        &Written::AlreadyApplied
    );
    let mut conn = server.conn().await;
    let mut counts = Vec::new();
    for stripe in 0..STRIPES {
        counts.push(window_count(&mut conn, &stripe_storage_key(&set, stripe)).await);
    }
    assert_eq!(counts, [3, 3, 2, 2]);
    // What is left is what a check sees: 103 - 10.
    let run = hammer(&tiers, &set, 1, 2 * LIMIT).await;
    assert_eq!(run.admitted, LIMIT - 10);
}

/// A check after write-backs (`check_after`) spreads both over the stripes.
#[tokio::test]
async fn check_after_writes_back_then_checks_a_stripe() {
    let server = RedisServer::start();
    let tiers = tiers(&server).await;
    let whole = rule(Algorithm::FixedWindow, 8, HOUR);
    let set = striped("hotafter", whole.clone());
    let at = NOW_US - 1_000;
    // 7 of 8 used locally: 2, 2, 2, 1 over the stripes; one unit left, on stripe 3.
    let entry =
        LedgerEntry::new(stripe_storage_key(&set, 0), whole, 7, at, at).with_stripes(STRIPES);
    let (v, written) = tiers[0]
        .check_after(HOT, &set, 1, &[WriteBack::new("wb-a", &entry)])
        .await
        .expect("call");
    assert_eq!(written.len(), 1);
    assert_eq!(written[0].as_ref().expect("written"), &Written::Applied(7));
    assert!(v.decision.allowed, "stripe 3 still had room: {v:?}");
    let v = tiers[0].check(HOT, &set, 1).await.expect("check");
    assert!(!v.decision.allowed, "all 8 used");
    assert_eq!(v.decision.limit, 8);
}

/// A stripe already full at its share cannot take its even part of a
/// write-back: what it refuses spills over the stripes that took all of
/// theirs, so the key as a whole is charged every unit. For every counting
/// algorithm: a full sliding log answered that the units had expired, so
/// they were neither counted there nor spilled.
#[tokio::test]
async fn what_a_full_stripe_refuses_spills_to_the_others() {
    let server = RedisServer::start();
    let tiers = tiers(&server).await;
    let mut conn = server.conn().await;
    for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingLog] {
        let label = format!("{algorithm:?}");
        let whole = rule(algorithm, 8, HOUR);
        let set = striped(&format!("hotspill{}", algorithm.code()), whole.clone());
        // Stripe 0 (the unstriped key, limit 2) full, stripe 1 one short.
        let stripe0 = set.stripe(0).expect("stripe 0");
        for _ in 0..2 {
            let v = tiers[0].check(HOT, stripe0, 1).await.expect("check");
            assert!(v.decision.allowed, "{label}");
        }
        let at = NOW_US - 1_000;
        // One unit on stripe 1 alone (an unstriped write-back to its key, under its rule).
        let stripe1 = set.stripe(1).expect("stripe 1");
        let one = LedgerEntry::new(
            stripe_storage_key(&set, 1),
            stripe1.rules()[0].clone(),
            1,
            at,
            at,
        );
        let out = tiers[0]
            .reconcile(&[WriteBack::new("wb-1", &one)])
            .await
            .expect("call");
        assert_eq!(
            out[0].as_ref().expect("written"),
            &Written::Applied(1),
            "{label}"
        );
        // 4 units, 1 per stripe: stripe 0 refuses its 1, stripe 1 takes its 1
        // and is full; the spilled unit first goes to stripe 1 (full: refused
        // again), then to another stripe. Regression: a spill whose taker
        // refused was dropped while stripes sent nothing that round had room.
        let entry =
            LedgerEntry::new(stripe_storage_key(&set, 0), whole, 4, at, at).with_stripes(STRIPES);
        let out = tiers[0]
            .reconcile(&[WriteBack::new("wb-s", &entry)])
            .await
            .expect("call");
        assert_eq!(
            out[0].as_ref().expect("written"),
            &Written::Applied(4),
            "{label}"
        );
        let mut counts = Vec::new();
        for stripe in 0..STRIPES {
            let key = stripe_storage_key(&set, stripe);
            counts.push(match algorithm {
                Algorithm::SlidingLog => log_count(&mut conn, &key).await,
                _ => window_count(&mut conn, &key).await,
            });
        }
        assert_eq!(counts.iter().sum::<u64>(), 2 + 1 + 4, "{label}: {counts:?}");
        assert_eq!(counts[..2], [2, 2], "{label}: {counts:?}");
        assert!(counts.iter().all(|&c| c <= 2), "{label}: {counts:?}");
    }
}

/// Units a sliding log holds.
async fn log_count(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> u64 {
    redis::cmd("ZCARD")
        .arg(key)
        .query_async(conn)
        .await
        .expect("ZCARD")
}

/// The README's bound for every algorithm, not only the fixed window's and
/// GCRA's: a striped key never admits above its limit, and with demand past
/// it admits at least `L - K·(c - 1)`, at cost 1 (exactly L) and cost 3.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_algorithm_keeps_the_striped_bound() {
    let server = RedisServer::start();
    let tiers = tiers(&server).await;
    for (i, algorithm) in [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::SlidingLog,
        Algorithm::Gcra,
        Algorithm::TokenBucket,
    ]
    .into_iter()
    .enumerate()
    {
        for cost in [1, 3] {
            let set = striped(&format!("every{i}c{cost}"), rule(algorithm, LIMIT, HOUR));
            let run = hammer(&tiers, &set, cost, 3 * LIMIT).await;
            let lower = LIMIT - u64::from(STRIPES) * (cost - 1);
            assert!(
                (lower..=LIMIT).contains(&run.admitted),
                "{algorithm:?} at cost {cost}: {} admitted, bound [{lower}, {LIMIT}]",
                run.admitted
            );
        }
    }
}
