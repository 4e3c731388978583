//! The global tier on a real Redis Cluster (3 masters + 3 replicas,
//! `tierlimit_test::RedisCluster`), through a `redis+cluster://` URL:
//!
//! * the exactness tests of the tier (`exact_bounds.rs`, `check_atomicity.rs`,
//!   `check_accuracy.rs`: the same bodies, from `support/`) pass on keys of
//!   every master;
//! * nothing ever fails with `CROSSSLOT`: multi-rule sets, user keys with
//!   `{` and `}`, batches of concurrent checks over many keys, `check_many`,
//!   reconciliation of keys on every master, `check_after`, the heartbeat;
//! * a master that lost its scripts (`SCRIPT FLUSH` there) is reloaded by the
//!   next check;
//! * a master killed under load: keys on the other masters stay served,
//!   every check within the deadline + 15 ms (less what a stall of the whole
//!   machine at its end explains: `tierlimit_test::StallWatch`); the killed
//!   master's keys fail within that bound and are served again once its
//!   replica is promoted;
//! * a master hung: the other masters' keys are served all along, and its
//!   own once its replica is promoted, while it is still hung;
//! * a manual failover, told only by the old master's `MOVED`: every check
//!   decided, the count carried over, and the slot map follows;
//! * a master hung and failed over while the tier sent it nothing: left
//!   before its key's next check, once anything has the map read.
//!
//! Each test starts a cluster of its own (about 3 s) and takes the binary's
//! serial lock: six servers per test, and the accuracy and latency bounds
//! hold only without other clusters starting beside them on 2 cores.

#[path = "support/accuracy.rs"]
mod accuracy;
#[path = "support/atomicity.rs"]
mod atomicity;
#[path = "support/bounds.rs"]
mod bounds;
mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tierlimit_core::{Clock, FakeClock, LedgerEntry, RedisFailure, Rule, RuleSet, SystemClock};
use tierlimit_redis::{CheckKey, CheckRequest, RedisTier, RedisTierConfig, WriteBack, Written};
use tierlimit_test::{RedisCluster, StallWatch, Timings, query_node};
use tokio::task::JoinSet;

use support::{client_time_tier, set, storage_key, tier};

/// `per_master` user keys `<prefix><n>` on each of the three masters, by
/// the slot of their real storage keys for `set`.
fn keys_on_every_master(
    cluster: &RedisCluster,
    set: &RuleSet,
    prefix: &str,
    per_master: usize,
) -> BTreeMap<usize, Vec<String>> {
    cluster.keys_on_every_master(prefix, per_master, |key| storage_key(set, key, 0))
}

/// One key on each master.
fn one_key_per_master(cluster: &RedisCluster, set: &RuleSet, prefix: &str) -> Vec<String> {
    keys_on_every_master(cluster, set, prefix, 1)
        .into_values()
        .flatten()
        .collect()
}

/// A Cluster connection of redis-rs, for reading keys where they live.
async fn reader(cluster: &RedisCluster) -> redis::cluster_async::ClusterConnection {
    redis::cluster::ClusterClient::new(cluster.urls())
        .expect("cluster client")
        .get_async_connection()
        .await
        .expect("cluster connection")
}

/// Calls of `commands` together (e.g. `evalsha` and `fcall`) on every node
/// of `cluster`, by index.
async fn calls_by_node(cluster: &RedisCluster, commands: &[&str]) -> Vec<u64> {
    let mut calls = Vec::new();
    for node in cluster.nodes() {
        let mut n = 0;
        if node.is_running() {
            for command in commands {
                n += node.command_calls(command).await;
            }
        }
        calls.push(n);
    }
    calls
}

/// Script calls, by `EVALSHA` or `FCALL`.
const SCRIPT_CALLS: &[&str] = &["evalsha", "fcall"];
/// Loads of Lua code, scripts or the library.
const CODE_LOADS: &[&str] = &["script|load", "function|load"];

/// The exactness bodies of `exact_bounds.rs` and `check_atomicity.rs`, on a
/// key of each master (asserted to be three different masters).
#[tokio::test]
async fn exact_bounds_and_atomicity_hold_on_every_master() {
    let _serial = tierlimit_test::serial().await;
    let cluster = RedisCluster::start();
    let url = cluster.cluster_url();
    let probe_set = set("k", [Rule::per_second(1).expect("valid")]);
    let keys = one_key_per_master(&cluster, &probe_set, "exact");
    let conn = reader(&cluster).await;
    for key in &keys {
        bounds::the_largest_limits_count_exactly(&url, key).await;
        bounds::the_longest_refill_is_exact(&url, key).await;
        atomicity::a_denial_by_either_rule_changes_nothing(&url, key, conn.clone()).await;
    }
}

/// The accuracy bodies of `check_accuracy.rs`: the three masters' keys
/// hammered at once, each replayed through the exact model of its algorithm.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accuracy_holds_on_every_master() {
    let _serial = tierlimit_test::serial().await;
    let cluster = RedisCluster::start();
    let url = cluster.cluster_url();
    let probe_set = set("k", [Rule::per_second(1).expect("valid")]);
    let keys = one_key_per_master(&cluster, &probe_set, "hammered");
    accuracy::gcra_admits_exactly_its_rate(&url, &keys).await;
    accuracy::token_bucket_admits_exactly_its_rate(&url, &keys).await;
    accuracy::sliding_log_admits_exactly_its_window(&url, &keys).await;
    accuracy::fixed_window_admits_exactly_its_limit_per_window(&url, &keys).await;
    accuracy::sliding_window_stays_within_its_error_bound(&url, &keys).await;
}

/// Every path that carries keys of many users, on keys of every master with
/// braces in them: no call fails (a `CROSSSLOT` would be an error), and every
/// check is decided as it would be alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_crosses_slots() {
    let _serial = tierlimit_test::serial().await;
    let cluster = RedisCluster::start();
    let url = cluster.cluster_url();
    // Three rules of three algorithms: one script call, three keys, one slot.
    let limit = 40;
    let multi = set(
        "multi",
        [
            Rule::per_hour(limit).expect("valid"),
            Rule::per_hour(1_000)
                .and_then(|r| r.with_algorithm(tierlimit_core::Algorithm::SlidingLog))
                .expect("valid"),
            Rule::per_natural_day(5_000, -8 * 3600).expect("valid"),
        ],
    );
    let by_master = keys_on_every_master(&cluster, &multi, "u{x}}{", 3);
    let keys: Vec<String> = by_master.values().flatten().cloned().collect();
    assert!(keys.iter().all(|k| k.contains('{') && k.contains('}')));

    // Batches: 50 checks per key at once through one tier, so checks queue
    // behind the calls in flight and leave in batches that span keys of all
    // masters. Exactly `limit` of each key's checks are admitted.
    let tier = tier(&url);
    tier.ping().await.expect("a master answers");
    let before = calls_by_node(&cluster, SCRIPT_CALLS).await;
    let per_key = 50;
    let mut tasks = JoinSet::new();
    for _ in 0..per_key {
        for key in &keys {
            let (tier, set, key) = (tier.clone(), multi.clone(), key.clone());
            tasks.spawn(async move {
                let v = tier.check(&key, &set, 1).await;
                (key, v)
            });
        }
    }
    let mut admitted: BTreeMap<String, u64> = BTreeMap::new();
    while let Some(done) = tasks.join_next().await {
        let (key, verdict) = done.expect("task");
        let verdict = verdict.unwrap_or_else(|e| panic!("check of {key}: {e}"));
        *admitted.entry(key).or_default() += u64::from(verdict.decision.allowed);
    }
    for key in &keys {
        assert_eq!(admitted.get(key), Some(&limit), "{key}: {admitted:?}");
    }
    let after = calls_by_node(&cluster, SCRIPT_CALLS).await;
    let calls: u64 = after.iter().zip(&before).map(|(a, b)| a - b).sum();
    let checks = (per_key * keys.len()) as u64;
    eprintln!("{checks} checks in {calls} script calls");
    // Fewer calls than checks: some calls carried several checks (each
    // batch split into one call per slot).
    assert!(
        calls < checks * 3 / 4,
        "checks went in batches: {calls} calls for {checks} checks"
    );
    for master in by_master.keys() {
        assert!(after[*master] > before[*master], "master {master} checked");
    }

    // check_many across every key: one pipeline per slot.
    let other = set("many", [Rule::per_minute(5).expect("valid")]);
    let requests: Vec<CheckRequest<'_>> = keys
        .iter()
        .map(|k| CheckRequest::new(k, &other, 2))
        .collect();
    for round in 0..3 {
        let results = tier.check_many(&requests).await.expect("check_many");
        assert_eq!(results.len(), keys.len());
        for (key, r) in keys.iter().zip(results) {
            let v = r.unwrap_or_else(|e| panic!("check_many of {key}: {e}"));
            assert_eq!(v.decision.allowed, round < 2, "{key} round {round}");
        }
    }

    // Reconciliation of every rule of every key, on all masters at once.
    let at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after the epoch")
        .as_micros() as u64;
    let fresh = set("rc", multi.rules().iter().cloned());
    let entries: Vec<LedgerEntry> = keys
        .iter()
        .flat_map(|k| {
            (0..fresh.rules().len()).map(|i| {
                LedgerEntry::new(
                    storage_key(&fresh, k, i),
                    fresh.rules()[i].clone(),
                    3,
                    at - 1_000,
                    at,
                )
            })
        })
        .collect();
    let writes: Vec<WriteBack<'_>> = entries.iter().map(|e| WriteBack::new("wb-1", e)).collect();
    let outcomes = tier.reconcile(&writes).await.expect("reconcile");
    assert_eq!(outcomes.len(), writes.len());
    for (w, outcome) in writes.iter().zip(outcomes) {
        assert_eq!(
            outcome.unwrap_or_else(|e| panic!("{}: {e}", w.entry.storage_key)),
            Written::Applied(3),
            "{}",
            w.entry.storage_key
        );
    }
    for key in &keys {
        let v = tier.check(key, &fresh, 1).await.expect("check");
        assert_eq!(v.decision.remaining, limit - 4, "{key}: 3 written back + 1");
    }

    // check_after: write-backs of keys on every master, then a check.
    let again: Vec<WriteBack<'_>> = entries.iter().map(|e| WriteBack::new("wb-2", e)).collect();
    let (v, written) = tier
        .check_after(&keys[0], &fresh, 1, &again)
        .await
        .expect("check_after");
    assert_eq!(v.decision.remaining, limit - 8, "3 more written back + 1");
    assert!(
        written.iter().all(|w| matches!(w, Ok(Written::Applied(3)))),
        "{written:?}"
    );

    // The heartbeat: its set is one key, braces or not.
    for zset in ["tl:{instances}:default", "hb{a}{b}", "plain"] {
        let ttl = Duration::from_secs(5);
        assert_eq!(tier.heartbeat(zset, "me", ttl).await.expect("heartbeat"), 1);
        assert_eq!(
            tier.heartbeat(zset, "you", ttl).await.expect("heartbeat"),
            2
        );
        tier.leave(zset, "you").await.expect("leave");
        assert_eq!(tier.heartbeat(zset, "me", ttl).await.expect("heartbeat"), 1);
    }
}

/// `SCRIPT FLUSH` and `FUNCTION FLUSH` on one master: the next check of a
/// key there, a batch there, a `check_many` and a reconcile all load the
/// library (or script) on that master and succeed.
#[tokio::test]
async fn noscript_on_one_master_is_recovered() {
    let _serial = tierlimit_test::serial().await;
    let cluster = RedisCluster::start();
    let url = cluster.cluster_url();
    let clock = FakeClock::new(1_700_000_000_000_000);
    let tier = client_time_tier(&url, Arc::new(clock.clone()));
    let s = set("ns", [Rule::per_hour(100).expect("valid")]);
    let by_master = keys_on_every_master(&cluster, &s, "ns", 2);
    for key in by_master.values().flatten() {
        tier.check(key, &s, 1).await.expect("loads the script");
    }
    assert_eq!(
        tier.script_mode(),
        Some(tierlimit_redis::ScriptMode::Functions)
    );
    let (&flushed, keys) = by_master.iter().next().expect("a master");
    cluster.nodes()[flushed].lua_flush().await;
    let loads_before = calls_by_node(&cluster, CODE_LOADS).await;

    let v = tier.check(&keys[0], &s, 1).await.expect("recovered");
    assert_eq!(v.decision.remaining, 98);
    let loads = calls_by_node(&cluster, CODE_LOADS).await;
    assert_eq!(
        loads[flushed],
        loads_before[flushed] + 1,
        "loaded on the master that lost it"
    );
    // The other masters did not need it. (The flushed master's replica runs
    // the FUNCTION LOAD it replicates, so replicas are not counted.)
    for &i in by_master.keys() {
        if i != flushed {
            assert_eq!(loads[i], loads_before[i], "master {i} did not need it");
        }
    }

    // Pipelines and the reconcile script: flushed again, then recovered.
    cluster.nodes()[flushed].lua_flush().await;
    let requests: Vec<CheckRequest<'_>> = by_master
        .values()
        .flatten()
        .map(|k| CheckRequest::new(k, &s, 1))
        .collect();
    for r in tier.check_many(&requests).await.expect("check_many") {
        r.expect("every check recovered");
    }
    let at = clock.unix_micros();
    let entry = LedgerEntry::new(
        storage_key(&s, &keys[1], 0),
        s.rules()[0].clone(),
        2,
        at,
        at,
    );
    let written = tier
        .reconcile(&[WriteBack::new("ns-1", &entry)])
        .await
        .expect("reconcile");
    assert!(
        matches!(written.as_slice(), [Ok(Written::Applied(2))]),
        "{written:?}"
    );
    cluster.nodes()[flushed].lua_flush().await;
    let v = tier.check(&keys[1], &s, 1).await.expect("recovered");
    assert_eq!(v.decision.remaining, 100 - 1 - 1 - 2 - 1);
}

/// A master killed (SIGKILL) under load, at the tier: keys on the two other
/// masters keep being decided by Redis within the deadline; the killed
/// master's key fails within the deadline + 15 ms while its replica takes
/// over, and is decided by Redis again once it has.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_master_fails_over_under_load() {
    let _serial = tierlimit_test::serial().await;
    let mut cluster = RedisCluster::start();
    // Redis's default (`yes`) stops every master answering (`CLUSTERDOWN`)
    // while any slot is unserved; a rate limiter's cluster wants the other
    // masters to go on (the setting the crate docs recommend).
    cluster.serve_partial_coverage().await;
    let url = cluster.cluster_url();
    let deadline = Duration::from_millis(100);
    let tier = RedisTier::new(RedisTierConfig::new(&url).deadline(deadline)).expect("valid");
    let s = set("fo", [Rule::per_second(1_000_000).expect("valid")]);
    let by_master = keys_on_every_master(&cluster, &s, "fo", 1);
    let (&victim, victim_keys) = by_master.iter().next().expect("a master");
    let victim_key = victim_keys[0].clone();
    let replica = cluster
        .replica_of(victim)
        .expect("the victim has a replica");
    let healthy: Vec<String> = by_master
        .iter()
        .filter(|(m, _)| **m != victim)
        .flat_map(|(_, k)| k.clone())
        .collect();
    for key in by_master.values().flatten() {
        tier.check(key, &s, 1).await.expect("warm");
    }

    let stop = Arc::new(AtomicBool::new(false));
    let bound = deadline + Duration::from_millis(15);
    let watch = StallWatch::start(Instant::now()).expect("the stall watch starts");
    let mut load = JoinSet::new();
    for key in healthy.iter().cloned().cycle().take(4) {
        let (tier, s, stop) = (tier.clone(), s.clone(), Arc::clone(&stop));
        load.spawn(async move {
            let (mut ok, mut timings) = (0u64, Timings::default());
            let mut errors = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                match timings.time(tier.check(&key, &s, 1)).await {
                    Ok(_) => ok += 1,
                    Err(e) => errors.push(e.to_string()),
                }
            }
            (key, ok, timings, errors)
        });
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    cluster.node_mut(victim).kill9();

    // The victim's key: errors (within the bound) until its replica serves.
    let give_up = Instant::now() + Duration::from_secs(30);
    let (mut failed, mut victim_timings) = (0u64, Timings::default());
    let mut kinds: BTreeMap<String, u64> = BTreeMap::new();
    loop {
        match victim_timings.time(tier.check(&victim_key, &s, 1)).await {
            Ok(_) => break,
            Err(e) => {
                failed += 1;
                let kind = e.redis_failure().unwrap_or(RedisFailure::Other);
                *kinds.entry(format!("{kind:?}")).or_default() += 1;
                assert!(e.is_transient(), "{e}");
            }
        }
        assert!(
            Instant::now() < give_up,
            "the victim's key was not served again within 30 s ({failed} failures: {kinds:?})"
        );
        // Not a sleep in place of a condition: a pace for the polling loop.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    eprintln!("victim key: {failed} failures {kinds:?}, {victim_timings:?}");
    assert!(failed > 0, "the kill was seen");
    // A few failed calls in a row marked the dead master down: from then on
    // its keys were answered at once, unsent, until its replica served.
    assert!(
        kinds.get("NodeDown").is_some_and(|&n| n > 0),
        "the dead master was never marked down: {kinds:?}"
    );
    // The node this test asks may learn of the promotion a little after the
    // client did (gossip): wait for it, bounded.
    let give_up = Instant::now() + Duration::from_secs(10);
    while cluster.master_of(&storage_key(&s, &victim_key, 0)) != replica {
        assert!(
            Instant::now() < give_up,
            "the replica does not serve the victim's slot"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Served again, and stays so.
    for _ in 0..20 {
        tier.check(&victim_key, &s, 1)
            .await
            .expect("served by the promoted replica");
    }

    stop.store(true, Ordering::Relaxed);
    let mut done = Vec::new();
    while let Some(task) = load.join_next().await {
        done.push(task.expect("task"));
    }
    let stalls = watch.stop();
    if let Err(why) = stalls.judge(&victim_timings, bound) {
        panic!("the victim's key: {why}");
    }
    for (key, ok, timings, errors) in done {
        eprintln!("{key}: {ok} ok, {} errors, {timings:?}", errors.len());
        // Each master has its own connection: nothing waits on the dead one.
        assert!(
            errors.is_empty(),
            "{key} on a healthy master failed {} times: {errors:?}",
            errors.len()
        );
        assert!(ok > 0, "{key}");
        if let Err(why) = stalls.judge(&timings, bound) {
            panic!("{key}: {why}");
        }
    }
}

/// Script calls `node` refused before running them, its `MOVED` replies
/// among them.
async fn rejected_script_calls(node: &tierlimit_test::RedisServer) -> u64 {
    node.rejected_calls("fcall").await + node.rejected_calls("evalsha").await
}

/// A manual failover (`CLUSTER FAILOVER`): the old master goes on answering,
/// as a replica, so only its `MOVED` tells of the change (no call fails).
/// Every check of its key is decided, the count carries over exactly, and
/// the tier's slot map follows the `MOVED`: checks stop going to the old
/// master. (A slot map read from a node goes to a master that answers only
/// on that master's `MOVED`; without that, the tier would be redirected on
/// every check forever.)
#[tokio::test]
async fn a_manual_failover_is_followed_through_moved() {
    let _serial = tierlimit_test::serial().await;
    let cluster = RedisCluster::start();
    let tier = tier(&cluster.cluster_url());
    let s = set("mf", [Rule::per_minute(10).expect("valid")]);
    let by_master = keys_on_every_master(&cluster, &s, "mf", 1);
    let (&old, keys) = by_master.iter().next().expect("a master");
    let key = keys[0].clone();
    for n in 0..4 {
        let v = tier.check(&key, &s, 1).await.expect("served");
        assert!(v.decision.allowed, "check {n}");
    }
    let replica = cluster.replica_of(old).expect("the master has a replica");
    let moved_before = rejected_script_calls(&cluster.nodes()[old]).await;
    cluster.failover(replica);

    // The count carried over: 6 more admitted, then denied, none failed.
    for n in 4..12 {
        let v = tier
            .check(&key, &s, 1)
            .await
            .expect("served through the failover");
        assert_eq!(v.decision.allowed, n < 10, "check {n}");
    }
    let moved = rejected_script_calls(&cluster.nodes()[old]).await - moved_before;
    assert!(moved > 0, "the old master never answered MOVED");
    // The map follows: soon a check no longer goes to the old master.
    let give_up = Instant::now() + Duration::from_secs(10);
    loop {
        let before = rejected_script_calls(&cluster.nodes()[old]).await;
        tier.check(&key, &s, 1).await.expect("served");
        if rejected_script_calls(&cluster.nodes()[old]).await == before {
            break;
        }
        assert!(
            Instant::now() < give_up,
            "checks still go to the old master 10 s after the failover"
        );
        // Not a sleep in place of a condition: a pace for the polling loop.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // And stay on the new one.
    let settled = rejected_script_calls(&cluster.nodes()[old]).await;
    for _ in 0..20 {
        tier.check(&key, &s, 1).await.expect("served");
    }
    assert_eq!(rejected_script_calls(&cluster.nodes()[old]).await, settled);
}

/// A slot being migrated: its source answers `ASK` for a key it does not
/// hold, and the tier follows it once, to the target, asking first
/// (`ASKING`), for one check and for a batch of them alike, as the README
/// says. Every check is decided by Redis and the count is the target's; a
/// write-back of the key meanwhile is a fault that passes.
#[tokio::test]
async fn a_migrating_slot_is_followed_through_ask() {
    let _serial = tierlimit_test::serial().await;
    let cluster = RedisCluster::start();
    let tier = tier(&cluster.cluster_url());
    let s = set("ask", [Rule::per_minute(10).expect("valid")]);
    // Every master has served a check (and so holds the scripts).
    let by_master = keys_on_every_master(&cluster, &s, "warm", 1);
    for key in by_master.values().flatten() {
        tier.check(key, &s, 1).await.expect("served");
    }
    let key = "never-checked";
    let storage = storage_key(&s, key, 0);
    let source = cluster.master_of(&storage);
    let target = *by_master
        .keys()
        .find(|&&m| m != source)
        .expect("another master");
    let nodes = cluster.topology();
    let (source_node, target_node) = (&nodes[&source], &nodes[&target]);
    let slot = cluster.slot(&storage);
    let setslot = |state: &str, id: &str| {
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("SETSLOT").arg(slot).arg(state).arg(id);
        cmd
    };
    let _: () = query_node(&target_node.addr, &setslot("IMPORTING", &source_node.id))
        .expect("CLUSTER SETSLOT IMPORTING");
    let _: () = query_node(&source_node.addr, &setslot("MIGRATING", &target_node.id))
        .expect("CLUSTER SETSLOT MIGRATING");
    let asked = rejected_script_calls(&cluster.nodes()[source]).await;
    let served = calls_by_node(&cluster, SCRIPT_CALLS).await[target];

    let v = tier.check(key, &s, 1).await.expect("served through ASK");
    assert!(v.decision.allowed && v.decision.remaining == 9, "{v:?}");
    // Five at once: batched into a call or more, each followed the same way.
    let check = || tier.check(key, &s, 1);
    let (a, b, c, d, e) = tokio::join!(check(), check(), check(), check(), check());
    let mut remaining: Vec<u64> = [a, b, c, d, e]
        .into_iter()
        .map(|v| v.expect("served through ASK").decision.remaining)
        .collect();
    remaining.sort_unstable();
    assert_eq!(remaining, [4, 5, 6, 7, 8]);
    // A write-back takes two keys (the count and its id's marker), and Redis
    // answers a call of several keys, not all of them on the target yet,
    // TRYAGAIN while their slot moves: a fault that passes, so the entry is
    // kept to be sent again (not set aside as refused).
    let now_us = SystemClock.unix_micros();
    let entry = LedgerEntry::new(storage.clone(), s.rules()[0].clone(), 1, now_us, now_us);
    let written = tier
        .reconcile(&[WriteBack::new("ask-1", &entry)])
        .await
        .map(|mut w| w.remove(0));
    assert!(
        matches!(&written, Err(e) | Ok(Err(e)) if e.redis_failure() == Some(RedisFailure::ClusterUnavailable)),
        "{written:?}"
    );
    let asked = rejected_script_calls(&cluster.nodes()[source]).await - asked;
    let served = calls_by_node(&cluster, SCRIPT_CALLS).await[target] - served;
    assert!(asked >= 2, "the source answered ASK {asked} times");
    assert!(served >= 2, "the target ran {served} script calls");
}

/// Script calls refused (`MOVED` among them) by all of `cluster`'s running
/// nodes together.
async fn rejected_everywhere(cluster: &RedisCluster) -> u64 {
    let mut n = 0;
    for node in cluster
        .nodes()
        .iter()
        .filter(|n| n.is_running() && !n.is_paused())
    {
        n += rejected_script_calls(node).await;
    }
    n
}

/// Checks `keys` until a round of them reaches their masters without a
/// redirect (`rejected_everywhere` did not grow); panics after
/// `within`.
async fn until_checked_without_redirect(
    cluster: &RedisCluster,
    tier: &RedisTier,
    set: &RuleSet,
    keys: &[&str],
    within: Duration,
) {
    let give_up = Instant::now() + within;
    loop {
        let before = rejected_everywhere(cluster).await;
        for key in keys {
            tier.check(key, set, 1).await.expect("served");
        }
        if rejected_everywhere(cluster).await == before {
            return;
        }
        assert!(
            Instant::now() < give_up,
            "checks of {keys:?} were still redirected after {within:?}"
        );
        // Not a sleep in place of a condition: a pace for the polling loop.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A master hung, and its replica promoted, while the tier sent it nothing:
/// no call of its failed, so when another event (here another master's
/// manual failover, told by its `MOVED`) has the map read, that master
/// still looks like one that answers, and the fresh map's word alone does
/// not move its slots. The tier asks it for its own map, the call fails,
/// and its slots move with that map: the next check of its key is served
/// by the promoted replica instead of waiting out the deadline on the hung
/// master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_that_failed_over_unasked_is_left_before_its_next_check() {
    let _serial = tierlimit_test::serial().await;
    let cluster = RedisCluster::start();
    let deadline = Duration::from_millis(300);
    let tier = RedisTier::new(RedisTierConfig::new(cluster.cluster_url()).deadline(deadline))
        .expect("valid");
    let s = set("idle", [Rule::per_minute(1_000).expect("valid")]);
    let by_master = keys_on_every_master(&cluster, &s, "idle", 1);
    let mut masters = by_master.iter();
    let (&idle, idle_keys) = masters.next().expect("a master");
    let (&other, other_keys) = masters.next().expect("another master");
    let (idle_key, other_key) = (idle_keys[0].as_str(), other_keys[0].as_str());
    let all: Vec<&str> = by_master.values().flatten().map(String::as_str).collect();
    // The tier's map is read: every check goes straight to its master.
    until_checked_without_redirect(&cluster, &tier, &s, &all, Duration::from_secs(10)).await;

    cluster.nodes()[idle].pause();
    assert!(
        cluster.wait_serving(Duration::from_secs(30)),
        "the hung master's replica was not promoted within 30 s"
    );
    let promoted = cluster.master_of(&storage_key(&s, idle_key, 0));
    assert_ne!(promoted, idle);
    cluster.failover(cluster.replica_of(other).expect("a replica"));
    // The other master's MOVED has the map read until its key's checks go
    // straight to the new master.
    until_checked_without_redirect(&cluster, &tier, &s, &[other_key], Duration::from_secs(15))
        .await;

    let started = Instant::now();
    let first = tier.check(idle_key, &s, 1).await;
    let took = started.elapsed();
    let verdict = first.unwrap_or_else(|e| {
        panic!("the first check of the hung master's key went to it ({took:?}): {e}")
    });
    assert!(verdict.decision.allowed);
    assert!(
        cluster.nodes()[idle].is_paused(),
        "the old master is still hung"
    );
    cluster.nodes()[idle].resume();
}

/// A master hung (SIGSTOP): its sockets stay open, so no refused connection
/// and no `MOVED` tells of it. The other masters' keys are served all along,
/// each check within the deadline + 15 ms, even while concurrent checks of
/// the hung master's key keep calls to it in flight (batching queues per
/// master: a check never waits behind another master's calls); once its replica is promoted, the
/// tier's slot map names the new master and the hung master's keys are
/// served again while it is still hung, within `BACK_WITHIN` of the
/// promotion, and stay so. Meanwhile a failed check of the hung master's key
/// with write-backs first (`check_after_key`) is no call for a circuit
/// breaker ([`Checked::counts_call`](tierlimit_redis::Checked)): one
/// master's fault while the others answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_master_is_left_once_its_replica_is_promoted() {
    const BACK_WITHIN: Duration = Duration::from_millis(1_500);
    let _serial = tierlimit_test::serial().await;
    let mut cluster = RedisCluster::start();
    cluster.serve_partial_coverage().await;
    let deadline = Duration::from_millis(50);
    let tier = RedisTier::new(RedisTierConfig::new(cluster.cluster_url()).deadline(deadline))
        .expect("valid");
    let s = set("hung", [Rule::per_second(1_000_000).expect("valid")]);
    let by_master = keys_on_every_master(&cluster, &s, "hung", 1);
    let (&victim, victim_keys) = by_master.iter().next().expect("a master");
    let victim_key = victim_keys[0].clone();
    let healthy_keys: Vec<String> = by_master
        .iter()
        .filter(|(master, _)| **master != victim)
        .flat_map(|(_, keys)| keys.clone())
        .collect();
    assert_eq!(healthy_keys.len(), 2, "a key on each other master");
    let bound = deadline + Duration::from_millis(15);
    let replica = cluster
        .replica_of(victim)
        .expect("the victim has a replica");
    for key in by_master.values().flatten() {
        tier.check(key, &s, 1).await.expect("warm");
    }
    // Concurrent checks of the victim's key, so calls to it are in flight
    // (and batching's queue full) whenever its down mark lapses.
    let stop = Arc::new(AtomicBool::new(false));
    let watch = StallWatch::start(Instant::now()).expect("the stall watch starts");
    let mut hammer = JoinSet::new();
    // The other masters' keys, checked all along by a task of their own:
    // (checks, failures, timings).
    let healthy = {
        let (tier, s, stop) = (tier.clone(), s.clone(), stop.clone());
        tokio::spawn(async move {
            let (mut checks, mut failures, mut timings) = (0u64, Vec::new(), Timings::default());
            while !stop.load(Ordering::Relaxed) {
                for key in &healthy_keys {
                    if let Err(e) = timings.time(tier.check(key, &s, 1)).await {
                        failures.push(format!("{key}: {e}"));
                    }
                    checks += 1;
                }
                // A pace for the loop, not a wait for a condition.
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            (checks, failures, timings)
        })
    };
    for _ in 0..4 {
        let (tier, s, key, stop) = (tier.clone(), s.clone(), victim_key.clone(), stop.clone());
        hammer.spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let _ = tier.check(&key, &s, 1).await;
                // A pace for the loop, not a wait for a condition.
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        });
    }
    cluster.node_mut(victim).pause();

    // Checks of the hung master's key until its replica serves its slot.
    let give_up = Instant::now() + Duration::from_secs(30);
    let mut kinds: BTreeMap<String, u64> = BTreeMap::new();
    let key = CheckKey::new(&victim_key).expect("valid key");
    let at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after the epoch")
        .as_micros() as u64;
    let owed = LedgerEntry::new(
        storage_key(&s, &victim_key, 0),
        s.rules()[0].clone(),
        1,
        at - 1_000,
        at,
    );
    let (mut after_failed, mut after_voted) = (0u64, 0u64);
    let promoted = loop {
        if let Err(e) = tier.check(&victim_key, &s, 1).await {
            let kind = e.redis_failure().unwrap_or(RedisFailure::Other);
            *kinds.entry(format!("{kind:?}")).or_default() += 1;
        }
        let checked = tier
            .check_after_key(&key, &s, 1, &[WriteBack::new("hung-wb", &owed)])
            .await;
        if checked.result.is_err() {
            after_failed += 1;
            after_voted += u64::from(checked.counts_call);
        }
        if cluster.wait_serving(Duration::ZERO) {
            break Instant::now();
        }
        assert!(
            Instant::now() < give_up,
            "the replica was not promoted within 30 s"
        );
        // A pace for the polling loop, not a sleep in place of a condition.
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert_eq!(cluster.master_of(&storage_key(&s, &victim_key, 0)), replica);
    assert!(
        kinds.values().sum::<u64>() > 0,
        "the hang was seen: {kinds:?}"
    );
    assert!(after_failed > 0, "no check_after_key failed in the hang");
    assert_eq!(
        after_voted, 0,
        "{after_voted} of {after_failed} failed check_after_key calls of the hung master's key \
         would count for a breaker"
    );
    // Still hung: served by the promoted replica within the bound.
    let mut victim_timings = Timings::default();
    let back = loop {
        if victim_timings
            .time(tier.check(&victim_key, &s, 1))
            .await
            .is_ok()
        {
            break promoted.elapsed();
        }
        assert!(
            promoted.elapsed() < Duration::from_secs(10),
            "the hung master's key was not served by its promoted replica within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    eprintln!("hung master's key: {kinds:?} before the promotion, served again {back:?} after it");
    assert!(
        cluster.nodes()[victim].is_paused(),
        "the old master is still hung"
    );
    assert!(
        back <= BACK_WITHIN,
        "served again only {back:?} after the promotion (bound {BACK_WITHIN:?})"
    );
    // And stays so for longer than any call sent to the hung master before
    // the promotion can take to end: its failure is the old master's, not
    // the new one's.
    let served = Instant::now();
    while served.elapsed() < 3 * deadline {
        if let Err(e) = tier.check(&victim_key, &s, 1).await {
            panic!(
                "{:?} after it was first served by the promoted replica: {e}",
                served.elapsed()
            );
        }
        // A pace for the loop, not a wait for a condition.
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    stop.store(true, Ordering::Relaxed);
    while hammer.join_next().await.is_some() {}
    let (healthy_checks, failures, timings) = healthy.await.expect("healthy task");
    let stalls = watch.stop();
    eprintln!("{healthy_checks} checks of the other masters' keys, {timings:?}; {stalls}");
    if let Err(why) = stalls.judge(&victim_timings, bound) {
        panic!("the hung master's key after the promotion: {why}");
    }
    assert!(healthy_checks > 0);
    assert!(
        failures.is_empty(),
        "{} of {healthy_checks} checks of the other masters' keys failed: {failures:?}",
        failures.len()
    );
    if let Err(why) = stalls.judge(&timings, bound) {
        panic!("a healthy master's check: {why}");
    }
    cluster.node_mut(victim).resume();
}

/// TLS to a Cluster (`rediss+cluster://`): the tier reads the slot map over
/// TLS, and reaches every master over TLS with the same CA (the URL names
/// only the nodes' TLS ports, which speak nothing else). Without the CA the
/// nodes' certificates are refused and no check is decided.
#[cfg(feature = "tls")]
#[tokio::test]
async fn a_tls_cluster_is_checked_over_tls_on_every_master() {
    let _serial = tierlimit_test::serial().await;
    let cluster = RedisCluster::start_tls();
    let url = cluster.tls_cluster_url();
    let ca = cluster.tls_ca_pem().expect("a TLS cluster").to_vec();
    let s = set("tls", [Rule::per_hour(2).expect("valid")]);
    let keys = one_key_per_master(&cluster, &s, "tls");

    // Refused for its certificate, not for being late: the deadline is long.
    let untrusted =
        RedisTier::new(RedisTierConfig::new(&url).deadline(Duration::from_secs(2))).expect("valid");
    let refused = untrusted
        .check(&keys[0], &s, 1)
        .await
        .expect_err("an unknown CA must be refused");
    assert!(
        refused.redis_failure().is_some() && !refused.is_timeout(),
        "a connection refused over its certificate, not a timeout: {refused}"
    );

    // What is checked here is TLS, not latency: each node's first call
    // makes a TLS connection, which a loaded machine may take longer than
    // the default deadline to set up.
    let tier = RedisTier::new(
        RedisTierConfig::new(&url)
            .tls_root_certificates(ca)
            .deadline(Duration::from_secs(2)),
    )
    .expect("valid");
    for key in &keys {
        for round in 0..3 {
            let v = tier.check(key, &s, 1).await.expect("checked over TLS");
            assert_eq!(v.decision.allowed, round < 2, "{key} round {round}");
        }
    }
    // Each key's state is on its own master (read over its plain port).
    for key in &keys {
        let storage = storage_key(&s, key, 0);
        let master = cluster.master_of(&storage);
        let addr = format!("127.0.0.1:{}", cluster.nodes()[master].port());
        let exists: u64 =
            tierlimit_test::query_node(&addr, redis::cmd("EXISTS").arg(&storage)).expect("EXISTS");
        assert_eq!(exists, 1, "{key}: its state is on its master");
    }
}

/// The README's least-privilege ACL user on a Cluster: with the Cluster's own
/// commands added (`+cluster|slots +asking`, as the README says), it checks
/// on every master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_least_privilege_acl_user_checks_on_every_master() {
    let _serial = tierlimit_test::serial().await;
    let cluster = RedisCluster::start();
    let rules = "on >pw-9f2 resetkeys ~tl:* ~{tl:* resetchannels -@all +ping +evalsha +eval \
                 +script|load +time +@read +@write -@dangerous +cluster|slots +asking";
    for node in cluster.nodes() {
        let mut setuser = redis::cmd("ACL");
        setuser
            .arg("SETUSER")
            .arg("app")
            .arg(rules.split_whitespace().collect::<Vec<_>>());
        let _: () =
            query_node(&format!("127.0.0.1:{}", node.port()), &setuser).expect("ACL SETUSER");
    }
    let url = cluster.cluster_url().replacen("://", "://app:pw-9f2@", 1);
    let tier =
        RedisTier::new(RedisTierConfig::new(&url).deadline(Duration::from_secs(2))).expect("valid");
    let s = set("least-cluster", [Rule::per_hour(2).expect("valid")]);
    for key in one_key_per_master(&cluster, &s, "least") {
        for round in 0..3 {
            let v = tier
                .check(&key, &s, 1)
                .await
                .unwrap_or_else(|e| panic!("{key} round {round}: {e}"));
            assert_eq!(v.decision.allowed, round < 2, "{key} round {round}");
        }
    }
}

/// An error reply (here `WRONGTYPE`) is an answer: the master is there. It
/// speaks for the deployment to a circuit breaker, as a batch's does, and
/// its failures in a row start again. Regression: a lone call's error reply
/// neither reset its master's streak nor counted as an answer, so a master
/// that had timed out once was "failing alone" through every answer after,
/// and two more timeouts, however far apart, marked it down.
#[tokio::test]
async fn an_error_reply_is_an_answer_of_its_master() {
    let _serial = tierlimit_test::serial().await;
    let cluster = RedisCluster::start();
    // Long enough for a master just resumed to answer within it on a slow
    // machine; short of the cluster's node timeout (1 s), so no failover.
    let deadline = Duration::from_millis(200);
    let tier = RedisTier::new(RedisTierConfig::new(cluster.cluster_url()).deadline(deadline))
        .expect("valid");
    let s = set("answers", [Rule::per_second(1_000_000).expect("valid")]);
    let by_master = keys_on_every_master(&cluster, &s, "answers", 2);
    let (&victim, keys) = by_master.iter().next().expect("a master");
    let (wrong, timed) = (keys[0].clone(), keys[1].clone());
    for key in by_master.values().flatten() {
        tier.check(key, &s, 1).await.expect("warm");
    }
    // GCRA reads its key with GET: a hash there is a WRONGTYPE reply.
    let node = cluster.nodes()[victim].addr().to_string();
    let mut hset = redis::cmd("HSET");
    hset.arg(storage_key(&s, &wrong, 0)).arg("f").arg("v");
    let _: i64 = query_node(&node, &hset).expect("HSET");
    let times_out = || async {
        cluster.nodes()[victim].pause();
        let checked = tier
            .check_key(&CheckKey::new(&timed).expect("valid"), &s, 1)
            .await;
        cluster.nodes()[victim].resume();
        let failure = checked.result.expect_err("a paused master").redis_failure();
        assert_eq!(failure, Some(RedisFailure::Timeout));
    };
    times_out().await;
    let checked = tier
        .check_key(&CheckKey::new(&wrong).expect("valid"), &s, 1)
        .await;
    let failure = checked
        .result
        .expect_err("a hash where GCRA reads a string");
    assert_eq!(failure.redis_failure(), Some(RedisFailure::WrongType));
    assert!(
        checked.counts_call,
        "an error reply speaks for the deployment"
    );
    // The streak started again at the answer: two timeouts do not mark the
    // master down (three in a row do).
    times_out().await;
    times_out().await;
    let checked = tier
        .check_key(&CheckKey::new(&timed).expect("valid"), &s, 1)
        .await;
    assert!(
        checked.result.is_ok(),
        "the master was marked down: {:?}",
        checked.result
    );
}
