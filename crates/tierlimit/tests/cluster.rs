//! The hybrid limiter on a real Redis Cluster (3 masters + 3 replicas): a
//! master killed or hung under load costs only its own keys, and only until
//! its replica is promoted.
//!
//! * Keys on the other masters stay on Redis, each decision within the
//!   deadline + 15 ms (less what a stall of the whole machine at its end
//!   explains: `tierlimit_test::StallWatch`), and the breaker never opens:
//!   the failed master's calls, batches included, are its own fault, not the
//!   deployment's.
//! * The failed master's keys get their policy's answer within the same bound:
//!   after a few failed calls in a row the master is marked down and its keys
//!   are answered at once (`NodeDown`), unsent.
//! * Once the replica is promoted they are decided by Redis again, and what
//!   the local tier admitted meanwhile is written back.
//!
//! And the whole cluster hung is an outage like one server's: the breaker
//! opens, every decision by policy within the bound, and after it every key
//! is back on Redis and every local admission written back.

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use support::{breaker, healthy};
use tierlimit::{
    BreakerState, HybridLimiter, Instances, Policy, ReconcileConfig, Rule, RuleSet, Tier,
};
use tierlimit_test::{RedisCluster, StallWatch, Timings};
use tokio::task::JoinSet;

const DEADLINE: Duration = Duration::from_millis(100);

/// A fixed window of a million per natural day, its day starting 12 hours
/// before now, so a test of seconds never crosses a window's end.
fn daily() -> RuleSet {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs() as i64;
    let mut offset = (43_200 - now.rem_euclid(86_400)).rem_euclid(86_400);
    if offset >= 43_200 {
        offset -= 86_400;
    }
    RuleSet::new(
        "fo",
        [Rule::per_natural_day(1_000_000, offset).expect("valid")],
    )
    .expect("valid")
    .with_policy(Policy::LocalFallback)
}

/// What a run of checks of one key saw.
#[derive(Debug, Default)]
struct Seen {
    by_tier: BTreeMap<String, u64>,
    failures: BTreeMap<String, u64>,
    local_admitted: u64,
    timings: Timings,
}

impl Seen {
    fn add(&mut self, d: &tierlimit::Decision) {
        *self.by_tier.entry(format!("{:?}", d.tier)).or_default() += 1;
        if let Some(f) = d.redis_failure {
            *self.failures.entry(format!("{f:?}")).or_default() += 1;
        }
        if d.tier == Tier::Local && d.allowed {
            self.local_admitted += 1;
        }
    }

    fn merge(&mut self, other: Seen) {
        for (tier, n) in other.by_tier {
            *self.by_tier.entry(tier).or_default() += n;
        }
        for (failure, n) in other.failures {
            *self.failures.entry(failure).or_default() += n;
        }
        self.local_admitted += other.local_admitted;
        self.timings.merge(other.timings);
    }

    fn count(&self, tier: &str) -> u64 {
        self.by_tier.get(tier).copied().unwrap_or(0)
    }
}

async fn checked(limiter: &HybridLimiter, set: &RuleSet, key: &str, seen: &mut Seen) -> Tier {
    let d = seen
        .timings
        .time(limiter.check(key, set, 1))
        .await
        .expect("valid input");
    seen.add(&d);
    d.tier
}

/// What the local tier admitted (`local_admitted` units, some) reaches
/// Redis: the ledger drains (bounded wait) and every unit is acknowledged.
async fn written_back(limiter: &HybridLimiter, local_admitted: u64) {
    let give_up = Instant::now() + Duration::from_secs(10);
    while limiter.local().ledger().units() > 0 {
        assert!(
            Instant::now() < give_up,
            "{} units still owed to Redis",
            limiter.local().ledger().units()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(local_admitted > 0, "nothing was admitted locally");
    assert_eq!(
        limiter.reconcile_stats().reconciled_units,
        local_admitted,
        "every unit admitted locally was written back"
    );
}

/// A killed master's keys are decided locally until its replica serves, and
/// meanwhile the reconciler's write-backs of them fail on it: one master's
/// fault, as its keys' checks are. The reconciler counted every failed batch
/// against the breaker, so with no check of the other masters in between (a
/// quiet service) two in a row opened it for every key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_masters_write_backs_leave_the_breaker_closed() {
    let _serial = tierlimit_test::serial().await;
    let mut cluster = RedisCluster::start();
    cluster.serve_partial_coverage().await;
    let set = daily();
    let by_master = cluster.keys_on_every_master("wb", 1, |key| set.storage_key(key, 0));
    let (&victim, victim_keys) = by_master.iter().next().expect("a master");
    let victim_key = victim_keys[0].clone();
    let mut sensitive = breaker();
    sensitive.consecutive_failures = 2;
    // A reconciler that looks at its ledger at once, so it meets the dead
    // master before the replica serves.
    let mut reconcile = ReconcileConfig::default();
    reconcile.idle_poll = Duration::from_millis(20);
    let limiter = healthy(
        HybridLimiter::builder()
            .redis_url(cluster.cluster_url())
            .deadline(DEADLINE)
            .breaker(sensitive)
            .reconcile(reconcile)
            .instances(Instances::Fixed(1)),
    )
    .await;
    for key in by_master.values().flatten() {
        let d = limiter.check(key, &set, 1).await.expect("valid input");
        assert_eq!(d.tier, Tier::Redis, "{key} before the fault: {d:?}");
    }
    cluster.node_mut(victim).kill9();
    let origin = Instant::now();
    let log = support::StateLog::start(Arc::clone(&limiter), origin);
    // The victim's key is admitted locally: owed to Redis.
    loop {
        assert!(origin.elapsed() < Duration::from_secs(5), "never local");
        let d = limiter
            .check(&victim_key, &set, 1)
            .await
            .expect("valid input");
        if d.tier == Tier::Local && d.allowed {
            break;
        }
    }
    // Only the reconciler calls Redis now, until the replica serves and the
    // unit is written back (bounded).
    let drained = support::wait_for(Duration::from_secs(15), || {
        limiter.local().ledger().units() == 0
    })
    .await;
    let stats = limiter.reconcile_stats();
    assert!(
        !log.left_closed(Duration::ZERO),
        "the breaker opened: {:?}, {stats:?}",
        log.events.lock().expect("log lock")
    );
    assert!(drained, "never written back: {stats:?}");
    assert!(
        stats.batches_retried > 0,
        "no write-back met the dead master: {stats:?}"
    );
}

/// A shutdown beside a dead master writes back what the live masters are
/// owed and counts it: an entry whose write-back failed waits a cool-down
/// while the entries after it go, instead of being re-sent first and
/// holding every batch (the whole shutdown spent on the dead master's
/// entries), and the units of a batch that failed in part count as written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_beside_a_dead_master_writes_back_the_others() {
    let _serial = tierlimit_test::serial().await;
    let mut cluster = RedisCluster::start();
    cluster.serve_partial_coverage().await;
    let set = daily();
    let by_master = cluster.keys_on_every_master("down", 3, |key| set.storage_key(key, 0));
    // Open for longer than the test: nothing drains before the shutdown.
    let mut slow_probe = breaker();
    slow_probe.cool_down = Duration::from_secs(60);
    slow_probe.max_cool_down = Duration::from_secs(60);
    // One entry a batch: a failed entry re-sent first fills it.
    let mut one_by_one = ReconcileConfig::default();
    one_by_one.batch_size = 1;
    let limiter = healthy(
        HybridLimiter::builder()
            .redis_url(cluster.cluster_url())
            .deadline(DEADLINE)
            .breaker(slow_probe)
            .reconcile(one_by_one)
            .instances(Instances::Fixed(1)),
    )
    .await;
    for key in by_master.values().flatten() {
        let d = limiter.check(key, &set, 1).await.expect("valid input");
        assert_eq!(d.tier, Tier::Redis, "{key} before the hang: {d:?}");
    }
    // Every node hung (no failover meanwhile): the breaker opens and each
    // key is admitted locally, owed to its master.
    for node in 0..cluster.nodes().len() {
        cluster.node_mut(node).pause();
    }
    let mut owed = BTreeMap::<usize, u64>::new();
    let give_up = Instant::now() + Duration::from_secs(5);
    let mut rounds_open = 0;
    while rounds_open < 3 {
        assert!(Instant::now() < give_up, "the breaker stayed closed");
        if limiter.breaker_state() == BreakerState::Open {
            rounds_open += 1;
        }
        for (&master, keys) in &by_master {
            for key in keys {
                let d = limiter.check(key, &set, 1).await.expect("valid input");
                if d.tier == Tier::Local && d.allowed {
                    *owed.entry(master).or_default() += 1;
                }
            }
        }
    }
    let total: u64 = owed.values().sum();
    assert_eq!(limiter.local().ledger().units(), total, "owed to Redis");
    // One master dies; the rest go on. Its replica takes over only after
    // the node timeout (1 s), later than the shutdown's half second ends.
    // Entries are claimed in the ledger map's order, which its hasher's
    // random keys shuffle: unless all 6 of the others' come before all 3 of
    // the victim's (1 run in 84), one of the victim's comes before one of
    // theirs.
    let victim = *by_master.keys().next().expect("a master");
    cluster.node_mut(victim).kill9();
    for node in (0..cluster.nodes().len()).filter(|&n| n != victim) {
        cluster.node_mut(node).resume();
    }
    let limiter = Arc::try_unwrap(limiter).expect("the test holds the only limiter");
    let report = limiter.shutdown(Duration::from_millis(500)).await;
    assert_eq!(
        report.written_back_units + report.undrained_units,
        total,
        "every owed unit is either written back or reported lost: {report:?}, owed {owed:?}"
    );
    assert!(
        report.written_back_units >= total - owed[&victim],
        "the live masters' units are written back: {report:?}, owed {owed:?}"
    );
}

/// How the victim master fails.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Fault {
    /// SIGKILL: its calls are refused or lost at once.
    Kill,
    /// SIGSTOP: its calls hang until their deadline (and batches of them
    /// form, since each waits that long).
    Pause,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_master_costs_only_its_own_keys_until_its_replica_serves() {
    one_master_fails(Fault::Kill).await;
}

/// The docker chaos scenario `cluster-master-paused` found what this guards:
/// a hung master's timed-out batches, each speaking for its call, once
/// opened the whole limiter's breaker. One master's faults are its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_master_costs_only_its_own_keys_until_its_replica_serves() {
    one_master_fails(Fault::Pause).await;
}

/// Copies of each victim key checked at once, so its master's checks batch.
const VICTIM_COPIES: usize = 4;

async fn one_master_fails(fault: Fault) {
    let _serial = tierlimit_test::serial().await;
    let mut cluster = RedisCluster::start();
    // The other masters go on serving while one slot range has no master
    // (Redis's default stops them all: see the README, "On a Redis Cluster").
    cluster.serve_partial_coverage().await;
    let set = daily();
    // Keys need no escaping, so a key is its own hash tag.
    let by_master = cluster.keys_on_every_master("fo", 2, |key| set.storage_key(key, 0));
    let (&victim, victim_keys) = by_master.iter().next().expect("a master");
    let victim_keys = victim_keys.clone();
    let healthy_keys: Vec<String> = by_master
        .iter()
        .filter(|(m, _)| **m != victim)
        .flat_map(|(_, k)| k.clone())
        .collect();
    // A breaker that two failures in a row open: the failed master's calls
    // fail together (its first two checks go at once as lone calls, and
    // time out or are refused together), so it opens at once if they count.
    let mut sensitive = breaker();
    sensitive.consecutive_failures = 2;
    let limiter = healthy(
        HybridLimiter::builder()
            .redis_url(cluster.cluster_url())
            .deadline(DEADLINE)
            .breaker(sensitive)
            .instances(Instances::Fixed(1))
            .heartbeat_every(Duration::from_millis(100)),
    )
    .await;
    for key in by_master.values().flatten() {
        let d = limiter.check(key, &set, 1).await.expect("valid input");
        assert_eq!(d.tier, Tier::Redis, "{key} before the fault: {d:?}");
    }

    let stop = Arc::new(AtomicBool::new(false));
    let bound = DEADLINE + Duration::from_millis(15);
    let watch = StallWatch::start(Instant::now()).expect("the stall watch starts");
    let mut load = JoinSet::new();
    for key in healthy_keys.iter().cloned() {
        let (limiter, set, stop) = (Arc::clone(&limiter), set.clone(), Arc::clone(&stop));
        load.spawn(async move {
            let mut seen = Seen::default();
            while !stop.load(Ordering::Relaxed) {
                checked(&limiter, &set, &key, &mut seen).await;
                // A pace for the load, not a wait for a condition: it leaves
                // room between the healthy masters' successes for failures
                // in a row.
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            (key, seen)
        });
    }
    // The victim's keys in tasks of their own, checked all along, several
    // at once.
    let mut victim_load = JoinSet::new();
    for key in victim_keys
        .iter()
        .flat_map(|k| std::iter::repeat_n(k, VICTIM_COPIES))
    {
        let (limiter, set, stop) = (Arc::clone(&limiter), set.clone(), Arc::clone(&stop));
        let key = key.clone();
        victim_load.spawn(async move {
            let mut seen = Seen::default();
            let mut breaker_opened = false;
            while !stop.load(Ordering::Relaxed) {
                checked(&limiter, &set, &key, &mut seen).await;
                breaker_opened |= limiter.breaker_state() != BreakerState::Closed;
                // A pace for the loop, not a wait for a condition.
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            (seen, breaker_opened)
        });
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    match fault {
        Fault::Kill => cluster.node_mut(victim).kill9(),
        Fault::Pause => cluster.node_mut(victim).pause(),
    }

    // Until the victim's keys are decided by Redis again (its replica
    // promoted), bounded.
    let give_up = Instant::now() + Duration::from_secs(30);
    let probe = &victim_keys[0];
    let mut probe_seen = Seen::default();
    let mut local_since_kill = false;
    loop {
        let tier = checked(&limiter, &set, probe, &mut probe_seen).await;
        local_since_kill |= tier != Tier::Redis;
        if local_since_kill && tier == Tier::Redis {
            break;
        }
        assert!(
            Instant::now() < give_up,
            "the victim's key was not decided by Redis again within 30 s: {probe_seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Decided by Redis again, and stays so under load for longer than any
    // call sent to the failed master before its replica took over can take
    // to end: such a call's failure is the old master's, not the new one's.
    let back = Instant::now();
    while back.elapsed() < 3 * DEADLINE {
        assert_eq!(
            checked(&limiter, &set, probe, &mut probe_seen).await,
            Tier::Redis,
            "{:?} after the replica first decided: {probe_seen:?}",
            back.elapsed()
        );
        // A pace for the loop, not a wait for a condition.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let mut victim_seen = Seen::default();
    let mut breaker_opened = false;
    while let Some(done) = victim_load.join_next().await {
        let (seen, opened) = done.expect("victim task");
        victim_seen.merge(seen);
        breaker_opened |= opened;
    }
    let mut healthy_seen = Vec::new();
    while let Some(done) = load.join_next().await {
        healthy_seen.push(done.expect("load task"));
    }
    let stalls = watch.stop();
    if fault == Fault::Pause {
        cluster.node_mut(victim).resume();
    }
    eprintln!("{fault:?}: victim keys: {victim_seen:?}; probe: {probe_seen:?}; {stalls}");

    // The dead master's keys: the policy's answer (LocalFallback) within the
    // bound, at once once their master was marked down.
    assert!(victim_seen.count("Local") > 0, "{victim_seen:?}");
    assert!(
        victim_seen.failures.get("NodeDown").is_some_and(|&n| n > 0),
        "the dead master was never marked down: {victim_seen:?}"
    );
    for seen in [&victim_seen, &probe_seen] {
        if let Err(why) = stalls.judge(&seen.timings, bound) {
            panic!("a decision of the victim's keys: {why}: {seen:?}");
        }
    }
    assert!(!breaker_opened, "one master {fault:?} opened the breaker");

    let mut local_admitted = victim_seen.local_admitted + probe_seen.local_admitted;
    for (key, seen) in healthy_seen {
        eprintln!("{key}: {seen:?}");
        let redis = seen.count("Redis");
        let other: u64 = seen.by_tier.values().sum::<u64>() - redis;
        // Each master has its own connection: nothing on a healthy master
        // waits on the dead one.
        assert_eq!(
            other, 0,
            "{key} on a healthy master was not decided by Redis {other} times: {seen:?}"
        );
        if let Err(why) = stalls.judge(&seen.timings, bound) {
            panic!("{key}: {why}: {seen:?}");
        }
        assert!(redis > 0, "{key}: {seen:?}");
        local_admitted += seen.local_admitted;
    }

    written_back(&limiter, local_admitted).await;
}

/// The whole cluster hung (every node SIGSTOPped) is an outage like one
/// server's: each decision within the deadline + 15 ms, by policy, the
/// breaker opens; once the nodes go on, every key is decided by Redis again,
/// the breaker closes, and what was admitted locally is written back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_whole_cluster_hung_is_an_outage_and_ends_like_one() {
    let _serial = tierlimit_test::serial().await;
    let mut cluster = RedisCluster::start();
    cluster.serve_partial_coverage().await;
    let set = daily();
    let keys: Vec<String> = cluster
        .keys_on_every_master("all", 2, |key| set.storage_key(key, 0))
        .into_values()
        .flatten()
        .collect();
    let limiter = healthy(
        HybridLimiter::builder()
            .redis_url(cluster.cluster_url())
            .deadline(DEADLINE)
            .breaker(breaker())
            .instances(Instances::Fixed(1))
            .heartbeat_every(Duration::from_millis(100)),
    )
    .await;
    for key in &keys {
        let d = limiter.check(key, &set, 1).await.expect("valid input");
        assert_eq!(d.tier, Tier::Redis, "{key} before the hang: {d:?}");
    }

    let stop = Arc::new(AtomicBool::new(false));
    let watch = StallWatch::start(Instant::now()).expect("the stall watch starts");
    let mut load = JoinSet::new();
    for key in keys.iter().cloned() {
        let (limiter, set, stop) = (Arc::clone(&limiter), set.clone(), Arc::clone(&stop));
        load.spawn(async move {
            let mut seen = Seen::default();
            while !stop.load(Ordering::Relaxed) {
                checked(&limiter, &set, &key, &mut seen).await;
                // A pace for the load, not a wait for a condition.
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            (key, seen)
        });
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    for node in 0..cluster.nodes().len() {
        cluster.node_mut(node).pause();
    }
    // The breaker opens, bounded.
    let give_up = Instant::now() + Duration::from_secs(5);
    while limiter.breaker_state() == BreakerState::Closed {
        assert!(
            Instant::now() < give_up,
            "the breaker stayed closed with every node hung"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // A second of outage under load.
    tokio::time::sleep(Duration::from_secs(1)).await;
    for node in 0..cluster.nodes().len() {
        cluster.node_mut(node).resume();
    }
    // Every key decided by Redis again, bounded.
    let give_up = Instant::now() + Duration::from_secs(30);
    let mut after = Seen::default();
    for key in &keys {
        while checked(&limiter, &set, key, &mut after).await != Tier::Redis {
            assert!(
                Instant::now() < give_up,
                "{key} was not decided by Redis again within 30 s of the resume: {after:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let bound = DEADLINE + Duration::from_millis(15);
    let mut all = after;
    while let Some(done) = load.join_next().await {
        let (key, seen) = done.expect("load task");
        eprintln!("{key}: {seen:?}");
        assert!(seen.count("Local") > 0, "{key} never fell back: {seen:?}");
        all.merge(seen);
    }
    let stalls = watch.stop();
    if let Err(why) = stalls.judge(&all.timings, bound) {
        panic!("a decision: {why}");
    }
    assert_eq!(limiter.breaker_state(), BreakerState::Closed);
    written_back(&limiter, all.local_admitted).await;
}
