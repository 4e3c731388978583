//! Adaptive batching (issue 11): checks that arrive while a call is in flight
//! go together in one call of the batch script, each decided as if sent alone.
//!
//! The tests that bound a check's time, and the one that loads the machine,
//! take `tierlimit_test::serial()` (for `cargo test`, which runs a binary's
//! tests side by side).

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use support::{ALGORITHMS, rule, set, storage_key};
use tierlimit_core::{Clock, FakeClock, RedisFailure, Rule, RuleSet};
use tierlimit_redis::{CheckKey, Checked, RedisTier, RedisTierConfig, ScriptMode, TimeSource};
use tierlimit_test::{Fault, FaultProxy, RedisServer};

fn tier_batching(url: &str, max_batch: usize, time: TimeSource, deadline: Duration) -> RedisTier {
    RedisTier::new(
        RedisTierConfig::new(url)
            .deadline(deadline)
            .time_source(time)
            .max_batch(max_batch),
    )
    .expect("valid tier config")
}

fn fake_time() -> TimeSource {
    let clock: Arc<dyn Clock> = Arc::new(FakeClock::default());
    TimeSource::Client(clock)
}

/// Starts every check at once, in this order (spawned tasks of a
/// current-thread runtime are first polled in spawn order, so this is their
/// arrival order), and returns each one's outcome and time taken, in order.
async fn all_at_once(
    tier: &RedisTier,
    checks: &[(String, RuleSet, u64)],
) -> Vec<(Checked, Duration)> {
    let handles: Vec<_> = checks
        .iter()
        .cloned()
        .map(|(key, set, cost)| {
            let tier = tier.clone();
            tokio::spawn(async move {
                let started = Instant::now();
                let key = CheckKey::new(&key).expect("a valid key");
                let checked = tier.check_key(&key, &set, cost).await;
                (checked, started.elapsed())
            })
        })
        .collect();
    let mut out = Vec::with_capacity(handles.len());
    for handle in handles {
        out.push(handle.await.expect("a check task"));
    }
    out
}

/// Loads the check script and the batch script on the server (a lone check,
/// then a burst), so the calls counted afterwards meet no NOSCRIPT.
async fn warm(tier: &RedisTier) {
    let set = set("warm", [Rule::per_second(1000).expect("valid")]);
    tier.check("warm", &set, 1).await.expect("a healthy check");
    let burst: Vec<_> = (0..8)
        .map(|_| ("warm".to_string(), set.clone(), 1))
        .collect();
    for (checked, _) in all_at_once(tier, &burst).await {
        checked.result.expect("a healthy check");
    }
}

/// N concurrent checks on one key with limit L admit exactly L, whatever the
/// algorithm, and they went in far fewer script calls than checks.
#[tokio::test(flavor = "current_thread")]
async fn concurrent_checks_on_one_key_admit_exactly_the_limit() {
    let server = RedisServer::start();
    let tier = tier_batching(&server.url(), 32, fake_time(), Duration::from_secs(5));
    warm(&tier).await;
    const N: usize = 120;
    const LIMIT: u64 = 37;
    for algorithm in ALGORITHMS {
        let set = set(
            &format!("exact-{algorithm:?}"),
            [rule(algorithm, LIMIT, Duration::from_secs(3600))],
        );
        let checks: Vec<_> = (0..N)
            .map(|_| ("one-key".to_string(), set.clone(), 1))
            .collect();
        let before = server.script_calls().await;
        let outcomes = all_at_once(&tier, &checks).await;
        let calls = server.script_calls().await - before;
        let admitted = outcomes
            .iter()
            .filter(|(c, _)| c.result.as_ref().expect("a healthy check").decision.allowed)
            .count();
        assert_eq!(admitted as u64, LIMIT, "{algorithm:?}");
        assert!(
            calls <= (N / 4) as u64,
            "{algorithm:?}: {calls} script calls for {N} concurrent checks"
        );
        let reporting = outcomes.iter().filter(|(c, _)| c.counts_call).count() as u64;
        assert_eq!(
            reporting, calls,
            "{algorithm:?}: one check speaks for each call"
        );
    }
}

/// The same sequence of requests (several keys, a rule set of every
/// algorithm and a mixed one, costs 1 to 3, many denials) sent all at once
/// with batching and one by one without: identical verdicts, in order.
#[tokio::test(flavor = "current_thread")]
async fn batched_and_lone_checks_decide_the_same() {
    let hour = Duration::from_secs(3600);
    let mut sets: Vec<RuleSet> = ALGORITHMS
        .iter()
        .map(|&a| set(&format!("same-{a:?}"), [rule(a, 7, hour)]))
        .collect();
    sets.push(set(
        "same-mixed",
        [
            rule(ALGORITHMS[0], 5, Duration::from_secs(60)),
            rule(ALGORITHMS[1], 9, hour),
            rule(ALGORITHMS[4], 12, hour),
        ],
    ));
    sets.push(
        RuleSet::new(
            "same-burst",
            [Rule::per_minute(6)
                .and_then(|r| r.with_burst(3))
                .expect("valid")],
        )
        .expect("valid"),
    );
    let mut rng = fastrand::Rng::with_seed(11);
    let checks: Vec<(String, RuleSet, u64)> = (0..150)
        .map(|_| {
            (
                format!("user-{}", rng.usize(..4)),
                sets[rng.usize(..sets.len())].clone(),
                1 + rng.u64(..3),
            )
        })
        .collect();

    let server = RedisServer::start();
    let batched = tier_batching(&server.url(), 32, fake_time(), Duration::from_secs(5));
    warm(&batched).await;
    let before = server.script_calls().await;
    let together = all_at_once(&batched, &checks).await;
    let calls = server.script_calls().await - before;
    assert!(
        calls <= 150 / 4,
        "{calls} calls: the checks were not batched"
    );

    server.flushall().await;
    let alone = tier_batching(&server.url(), 1, fake_time(), Duration::from_secs(5));
    let mut denied = 0;
    for (i, ((key, set, cost), (batched, _))) in checks.iter().zip(together).enumerate() {
        let lone = alone.check(key, set, *cost).await.expect("a healthy check");
        let batched = batched.result.expect("a healthy batched check");
        assert_eq!(
            batched,
            lone,
            "request {i}: {key} {} cost {cost}",
            set.name()
        );
        denied += usize::from(!lone.decision.allowed);
    }
    assert!(denied > 30, "the sequence must exercise denials ({denied})");
}

/// The server lost its Lua code (`SCRIPT FLUSH` and `FUNCTION FLUSH`)
/// before a burst: the lone call reloads the check script (or the library),
/// the batch call the batch script, and every check counts exactly once;
/// with Functions and with scripts alike.
#[tokio::test(flavor = "current_thread")]
async fn noscript_in_a_batch_reloads_and_counts_each_check_once() {
    let server = RedisServer::start();
    for (url, mode) in [
        (server.url(), ScriptMode::Functions),
        (
            support::scripts_only_url(&server).await,
            ScriptMode::Scripts,
        ),
    ] {
        server.flushall().await;
        let tier = tier_batching(&url, 32, TimeSource::Server, Duration::from_secs(5));
        let set = set("flush", [Rule::per_hour(1000).expect("valid")]);
        warm(&tier).await;
        assert_eq!(tier.script_mode(), Some(mode));
        server.lua_flush().await;
        let loads = server.code_loads().await;

        let checks: Vec<_> = (0..40).map(|_| ("k".to_string(), set.clone(), 1)).collect();
        let outcomes = all_at_once(&tier, &checks).await;
        for (checked, _) in &outcomes {
            assert!(
                checked
                    .result
                    .as_ref()
                    .expect("reloaded and ran")
                    .decision
                    .allowed
            );
        }
        let reloads = server.code_loads().await - loads;
        // Each call that met the loss loads what it lacked (calls in flight
        // together each load: the later loads find it there).
        match mode {
            ScriptMode::Scripts => assert!(reloads >= 2, "both scripts were reloaded"),
            _ => assert!(reloads >= 1, "the library was reloaded"),
        }
        assert_eq!(tier.script_mode(), Some(mode), "the mode is kept");
        let last = tier.check("k", &set, 1).await.expect("a healthy check");
        assert_eq!(
            last.decision.remaining,
            1000 - 41,
            "{mode:?}: each check counted once"
        );
    }
}

/// The same sequence of requests (several keys, a rule set of every
/// algorithm and a mixed one, costs 1 to 3, many denials) through Functions
/// and through scripts, batching on and off: identical verdicts, in order.
#[tokio::test(flavor = "current_thread")]
async fn functions_and_scripts_decide_the_same() {
    let day = Duration::from_secs(86_400);
    let mut sets: Vec<RuleSet> = ALGORITHMS
        .iter()
        .map(|&a| set(&format!("fs-{a:?}"), [rule(a, 6, day)]))
        .collect();
    sets.push(set(
        "fs-mixed",
        [
            rule(ALGORITHMS[0], 5, Duration::from_secs(60)),
            rule(ALGORITHMS[2], 8, day),
            rule(ALGORITHMS[3], 9, day),
        ],
    ));
    sets.push(set(
        "fs-three",
        [
            rule(ALGORITHMS[1], 4, Duration::from_secs(60)),
            rule(ALGORITHMS[4], 10, day),
            rule(ALGORITHMS[0], 11, day),
        ],
    ));
    let mut rng = fastrand::Rng::with_seed(29);
    let checks: Vec<(String, RuleSet, u64)> = (0..160)
        .map(|_| {
            (
                format!("user-{}", rng.usize(..4)),
                sets[rng.usize(..sets.len())].clone(),
                1 + rng.u64(..3),
            )
        })
        .collect();

    let server = RedisServer::start();
    let scripts_url = support::scripts_only_url(&server).await;
    let mut runs = Vec::new();
    for (url, mode) in [
        (&scripts_url, ScriptMode::Scripts),
        (&server.url(), ScriptMode::Functions),
    ] {
        for max_batch in [1, 32] {
            server.flushall().await;
            let tier = tier_batching(url, max_batch, fake_time(), Duration::from_secs(5));
            let verdicts: Vec<_> = if max_batch == 1 {
                let mut out = Vec::new();
                for (key, set, cost) in &checks {
                    out.push(tier.check(key, set, *cost).await.expect("a healthy check"));
                }
                out
            } else {
                warm(&tier).await;
                server.flushall().await;
                let before = server.script_calls().await;
                let outcomes = all_at_once(&tier, &checks).await;
                let calls = server.script_calls().await - before;
                assert!(calls <= 160 / 4, "{mode:?}: {calls} calls, not batched");
                outcomes
                    .into_iter()
                    .map(|(c, _)| c.result.expect("a healthy batched check"))
                    .collect()
            };
            assert_eq!(tier.script_mode(), Some(mode), "max_batch {max_batch}");
            runs.push((mode, max_batch, verdicts));
        }
    }
    let (_, _, reference) = &runs[0];
    let denied = reference.iter().filter(|v| !v.decision.allowed).count();
    assert!(denied > 40, "the sequence must exercise denials ({denied})");
    for (mode, max_batch, verdicts) in &runs[1..] {
        for (i, (got, want)) in verdicts.iter().zip(reference).enumerate() {
            let (key, set, cost) = &checks[i];
            assert_eq!(
                got,
                want,
                "{mode:?} max_batch {max_batch}, request {i}: {key} {} cost {cost}",
                set.name()
            );
        }
    }
}

/// A server that stops answering (SIGSTOP) mid-burst: every check of the
/// burst fails with a timeout within its deadline, and the calls, not the
/// checks, are what a breaker would count.
#[tokio::test(flavor = "current_thread")]
async fn a_hung_server_fails_every_check_of_a_batch_within_the_deadline() {
    let _serial = tierlimit_test::serial().await;
    let server = RedisServer::start();
    let deadline = Duration::from_millis(300);
    let tier = tier_batching(&server.url(), 32, TimeSource::Server, deadline);
    let set = set("hung", [Rule::per_hour(1000).expect("valid")]);
    warm(&tier).await;
    server.pause();
    let checks: Vec<_> = (0..30).map(|i| (format!("k{i}"), set.clone(), 1)).collect();
    let outcomes = all_at_once(&tier, &checks).await;
    server.resume();
    for (checked, took) in &outcomes {
        let err = checked
            .result
            .as_ref()
            .expect_err("no answer from a hung server");
        assert!(err.is_timeout(), "{err}");
        assert!(
            *took < deadline + Duration::from_millis(250),
            "waited {took:?}, deadline {deadline:?}"
        );
    }
    let reporting = outcomes.iter().filter(|(c, _)| c.counts_call).count();
    // The burst goes as two lone calls, then batches as large as the calls
    // in flight (4, 6, 12), and the last 6 once they have waited a tenth of
    // the deadline (or, on a slow machine, once a call times out, their
    // deadlines then almost spent). Every call that timed out speaks for
    // itself, the batches too (a batch's call ends just before its checks'
    // own timers fire): not only the lone calls, whose callers wait for them.
    assert!(
        (5..=6).contains(&reporting),
        "{reporting} of 30 failed checks report a call: two lone calls and three or four batches"
    );
}

/// A killed server mid-burst: every check fails (refused or lost) within its
/// deadline; one report per call made, far fewer than checks.
#[tokio::test(flavor = "current_thread")]
async fn a_killed_server_fails_every_check_of_a_batch_within_the_deadline() {
    let _serial = tierlimit_test::serial().await;
    let mut server = RedisServer::start();
    let deadline = Duration::from_millis(300);
    let tier = tier_batching(&server.url(), 32, TimeSource::Server, deadline);
    let set = set("killed", [Rule::per_hour(1000).expect("valid")]);
    warm(&tier).await;
    server.kill9();
    let checks: Vec<_> = (0..30).map(|i| (format!("k{i}"), set.clone(), 1)).collect();
    let outcomes = all_at_once(&tier, &checks).await;
    for (checked, took) in &outcomes {
        let err = checked.result.as_ref().expect_err("the server is gone");
        assert!(err.redis_failure().is_some(), "a Redis fault: {err}");
        assert!(
            *took < deadline + Duration::from_millis(250),
            "waited {took:?}, deadline {deadline:?}"
        );
    }
    let reporting = outcomes.iter().filter(|(c, _)| c.counts_call).count();
    // Two lone calls, batches as large as the calls in flight (4, 6, 12),
    // and the rest once a call has failed: six calls, and one more lone call
    // when both lone calls fail before the burst has queued.
    assert!(
        (1..=7).contains(&reporting),
        "{reporting} of 30 failed checks report a call: at most seven calls"
    );
}

/// The deadline of the tiers [`far`] makes.
const FAR_DEADLINE: Duration = Duration::from_millis(200);

/// A batching tier with a 200 ms deadline, warmed, behind a proxy that
/// delays each way by 60 ms: a round trip takes 120 ms, 60 % of the deadline.
async fn far() -> (RedisServer, FaultProxy, RedisTier) {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    let tier = tier_batching(&proxy.url(), 32, TimeSource::Server, FAR_DEADLINE);
    warm(&tier).await;
    tokio::task::block_in_place(|| proxy.set(Fault::Latency(Duration::from_millis(60))));
    (server, proxy, tier)
}

/// Calls that take most of half the deadline (a distant server, here a
/// proxy's delay): a queued check waits a tenth of its deadline for a call
/// to end, then goes beside the calls in flight. Waiting for one to end, it
/// then spent as long again on its own call and ran out of deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_check_waits_a_tenth_of_its_deadline_for_a_call_to_end() {
    let _serial = tierlimit_test::serial().await;
    let (server, proxy, tier) = far().await;
    let set = set("far", [Rule::per_hour(1000).expect("valid")]);
    // Two lone calls, a batch as large as they are (4), and the last two
    // queue behind those three calls.
    let checks: Vec<_> = (0..8).map(|i| (format!("k{i}"), set.clone(), 1)).collect();
    let before = server.script_calls().await;
    let outcomes = all_at_once(&tier, &checks).await;
    for (i, (checked, took)) in outcomes.iter().enumerate() {
        assert!(
            checked.result.is_ok(),
            "check {i} after {took:?} (deadline {FAR_DEADLINE:?}): {:?}",
            checked.result
        );
    }
    tokio::task::block_in_place(|| proxy.set(Fault::None));
    assert_eq!(
        server.script_calls().await - before,
        4,
        "two lone calls, the batch that went at once, the queue sent beside them"
    );
}

/// A queue's first check waits a tenth of its deadline, then sends the
/// queue; dropped before that (its caller gave up: a client gone, an outer
/// timeout), it still sends it. Nobody did, and the checks queued behind it
/// waited for a call in flight to end: on a distant server, most of their
/// deadline, then as long again for their own call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_whose_first_check_is_dropped_is_still_sent() {
    let _serial = tierlimit_test::serial().await;
    let (_server, proxy, tier) = far().await;
    let set = set("dropped", [Rule::per_hour(1000).expect("valid")]);
    // On a runtime of one thread, so the checks arrive in the order spawned:
    // two lone calls, the queue's first check (given up after 1 ms), one
    // check behind it.
    let behind = tokio::task::spawn_blocking(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        rt.block_on(async move {
            let check = |key: &'static str| {
                let (tier, set) = (tier.clone(), set.clone());
                async move {
                    let key = CheckKey::new(key).expect("a valid key");
                    tier.check_key(&key, &set, 1).await
                }
            };
            let lone = [tokio::spawn(check("k0")), tokio::spawn(check("k1"))];
            let first = check("k2");
            let given_up = tokio::spawn(async move {
                tokio::time::timeout(Duration::from_millis(1), first)
                    .await
                    .is_err()
            });
            let behind = tokio::spawn(check("k3"));
            assert!(given_up.await.expect("a task"), "answered within 1 ms");
            for call in lone {
                call.await.expect("a task").result.expect("a lone call");
            }
            behind.await.expect("a task")
        })
    })
    .await
    .expect("the checks' thread");
    tokio::task::block_in_place(|| proxy.set(Fault::None));
    assert!(
        behind.result.is_ok(),
        "the check behind it: {:?} (deadline {FAR_DEADLINE:?})",
        behind.result
    );
}

/// Under load, script calls per check fall far below one.
#[tokio::test(flavor = "current_thread")]
async fn script_calls_per_check_fall_under_load() {
    let _serial = tierlimit_test::serial().await;
    let server = RedisServer::start();
    let tier = tier_batching(
        &server.url(),
        32,
        TimeSource::Server,
        Duration::from_secs(5),
    );
    warm(&tier).await;
    let set = set("load", [Rule::per_second(1000).expect("valid")]);
    let checks: Vec<_> = (0..400)
        .map(|i| (format!("k{i}"), set.clone(), 1))
        .collect();
    let before = server.script_calls().await;
    let outcomes = all_at_once(&tier, &checks).await;
    let calls = server.script_calls().await - before;
    assert!(outcomes.iter().all(|(c, _)| c.result.is_ok()));
    assert!(
        calls * 4 <= 400,
        "{calls} script calls for 400 concurrent checks (want ≤ 0.25 per check)"
    );
}

/// Without batching (max_batch 1) every check is its own call, even when
/// they arrive together.
#[tokio::test(flavor = "current_thread")]
async fn max_batch_one_sends_every_check_alone() {
    let server = RedisServer::start();
    let tier = tier_batching(&server.url(), 1, TimeSource::Server, Duration::from_secs(5));
    warm(&tier).await;
    let set = set("alone", [Rule::per_second(1000).expect("valid")]);
    let checks: Vec<_> = (0..50).map(|i| (format!("k{i}"), set.clone(), 1)).collect();
    let before = server.script_calls().await;
    let outcomes = all_at_once(&tier, &checks).await;
    assert_eq!(server.script_calls().await - before, 50);
    assert!(
        outcomes
            .iter()
            .all(|(c, _)| c.counts_call && c.result.is_ok())
    );
}

/// max_batch outside 1 to 1000 is refused at construction.
#[test]
fn max_batch_is_bounded() {
    for bad in [0, 1001] {
        let err = RedisTier::new(RedisTierConfig::new("redis://127.0.0.1:1/").max_batch(bad))
            .expect_err("out of range");
        assert!(err.to_string().contains("max_batch"), "{err}");
    }
}

/// Puts a plain string where `set`'s first rule keeps `key`'s state.
async fn spoil(conn: &mut redis::aio::MultiplexedConnection, set: &RuleSet, key: &str) {
    let () = redis::cmd("SET")
        .arg(storage_key(set, key, 0))
        .arg("not a bucket")
        .query_async(conn)
        .await
        .expect("SET");
}

/// One call of the batch script answers one-rule and several-rule checks
/// side by side, and a check that fails there (its key holds another type)
/// gets its own error while the checks before and after it, in the same
/// call, are decided exactly as when each is sent alone.
#[tokio::test(flavor = "current_thread")]
async fn a_check_that_fails_inside_a_batch_fails_alone() {
    let server = RedisServer::start();
    let tier = tier_batching(&server.url(), 32, fake_time(), Duration::from_secs(5));
    warm(&tier).await;
    let hour = Duration::from_secs(3600);
    // The token bucket keeps a hash: a plain string under its key is WRONGTYPE.
    let one = set("fails-one", [rule(ALGORITHMS[1], 3, hour)]);
    let two = set(
        "fails-two",
        [rule(ALGORITHMS[0], 3, hour), rule(ALGORITHMS[4], 8, hour)],
    );
    const BAD: usize = 6;
    let checks: Vec<(String, RuleSet, u64)> = (0..12)
        .map(|i| match i {
            BAD => ("bad".to_string(), one.clone(), 1),
            i if i % 3 == 0 => (format!("good-{}", i % 2), two.clone(), 2),
            i => (format!("good-{}", i % 2), one.clone(), 1),
        })
        .collect();
    let mut conn = server.conn().await;
    spoil(&mut conn, &one, "bad").await;
    let before = server.script_calls().await;
    let outcomes = all_at_once(&tier, &checks).await;
    let calls = server.script_calls().await - before;
    // The first two go alone (fewer than two calls in flight), the rest in
    // batches of at least four: the bad key's check, the seventh, in one.
    assert!(
        calls <= 5,
        "{calls} script calls for 12 checks: not batched"
    );

    // The same checks one by one, from the same start.
    let () = redis::cmd("FLUSHALL")
        .query_async(&mut conn)
        .await
        .expect("FLUSHALL");
    spoil(&mut conn, &one, "bad").await;
    let lone = tier_batching(&server.url(), 1, fake_time(), Duration::from_secs(5));
    let mut denied = 0;
    for (i, ((key, set, cost), (batched, _))) in checks.iter().zip(&outcomes).enumerate() {
        let key = CheckKey::new(key).expect("a valid key");
        let alone = lone.check_key(&key, set, *cost).await;
        match (&batched.result, &alone.result) {
            (Ok(b), Ok(a)) => {
                assert_eq!(b.decision.allowed, a.decision.allowed, "check {i}");
                assert_eq!(b.rules, a.rules, "check {i}");
                denied += usize::from(!b.decision.allowed);
            }
            (Err(b), Err(a)) => {
                assert_eq!(i, BAD, "only the bad key's check fails: {b}");
                assert_eq!(b.redis_failure(), a.redis_failure());
                assert_eq!(format!("{b:?}"), format!("{a:?}"));
                assert!(format!("{b:?}").contains("WRONGTYPE"), "{b:?}");
            }
            (b, a) => panic!("check {i}: batched {b:?}, alone {a:?}"),
        }
    }
    assert!(outcomes[BAD].0.result.is_err(), "the bad key's check fails");
    // Its key's fault, not Redis': a breaker counts the call as answered
    // (see `Error::is_key_fault`). It was an unclassified fault, the call's
    // vote a failure, and a hot key of another type in every batch tripped a
    // breaker for every key.
    let failure = outcomes[BAD]
        .0
        .result
        .as_ref()
        .err()
        .map(|e| e.redis_failure());
    assert_eq!(failure, Some(Some(RedisFailure::WrongType)));
    // Four one-rule checks of each good key against 3 per hour (the clock
    // stands still), and two of good-1's at cost 2 against GCRA's 3.
    assert_eq!(denied, 3, "denials among the admissions");
}
