//! Losing the Lua code or the whole server mid-run: `SCRIPT FLUSH` and
//! `FUNCTION FLUSH` under load surface no error at all; after `kill -9` and a
//! restart on the same port (empty data, empty script cache, no library)
//! only calls made while the server was down fail, and every call made once
//! it answers PING again succeeds; a pipelined batch after a flush reloads
//! the script or library and re-sends only what failed with NOSCRIPT or
//! `Function not found`. Tiers running Functions and tiers running scripts
//! alike.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tierlimit_core::{Algorithm, Error, LedgerEntry, RedisFailure, Rule, RuleSet};
use tierlimit_redis::{
    CheckRequest, RedisTier, ScriptMode, TimeSource, Verdict, WriteBack, Written,
};
use tierlimit_test::RedisServer;
use tokio::task::JoinSet;

use support::{rule, set, storage_key, tier, tier_with};

struct Outcome {
    started: Instant,
    result: Result<Verdict, Error>,
}

/// Checks from `tasks` tasks spread over `tiers` until `stop` is set.
fn load(tiers: &[RedisTier], tasks: usize, stop: &Arc<AtomicBool>) -> JoinSet<Vec<Outcome>> {
    let set = set(
        "load",
        [
            rule(Algorithm::Gcra, 1_000, Duration::from_secs(1)),
            rule(Algorithm::SlidingLog, 100, Duration::from_secs(1)),
        ],
    );
    let mut set_of_tasks = JoinSet::new();
    for i in 0..tasks {
        let tier = tiers[i % tiers.len()].clone();
        let (set, stop) = (set.clone(), Arc::clone(stop));
        set_of_tasks.spawn(async move {
            let mut outcomes = Vec::new();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let started = Instant::now();
                let result = tier.check(&format!("user{}", n % 50), &set, 1).await;
                let failed = result.is_err();
                outcomes.push(Outcome { started, result });
                if failed {
                    // Do not spin while the server is down.
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
            outcomes
        });
    }
    set_of_tasks
}

async fn finish(mut tasks: JoinSet<Vec<Outcome>>) -> Vec<Outcome> {
    let mut all = Vec::new();
    while let Some(done) = tasks.join_next().await {
        all.extend(done.expect("load task"));
    }
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_under_load_surfaces_no_error() {
    let server = RedisServer::start();
    let tiers = [
        tier(&server.url()),
        tier(&support::scripts_only_url(&server).await),
    ];
    let stop = Arc::new(AtomicBool::new(false));
    let tasks = load(&tiers, 8, &stop);
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        server.lua_flush().await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::Relaxed);
    let outcomes = finish(tasks).await;
    let errors: Vec<_> = outcomes
        .iter()
        .filter_map(|o| o.result.as_ref().err())
        .collect();
    let loads = server.command_calls("script|load").await;
    let library_loads = server.command_calls("function|load").await;
    eprintln!(
        "{} checks across 3 SCRIPT FLUSHes and FUNCTION FLUSHes, {} errors, \
         {loads} SCRIPT LOADs, {library_loads} FUNCTION LOADs",
        outcomes.len(),
        errors.len()
    );
    assert!(errors.is_empty(), "{errors:?}");
    assert!(
        loads >= 3,
        "the script was reloaded after each flush ({loads} loads)"
    );
    assert!(
        library_loads >= 3,
        "the library was reloaded after each flush ({library_loads} loads)"
    );
    assert_eq!(tiers[0].script_mode(), Some(ScriptMode::Functions));
    assert_eq!(tiers[1].script_mode(), Some(ScriptMode::Scripts));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_fails_only_calls_made_while_down() {
    let mut server = RedisServer::start();
    // A deadline that a slow machine's reconnect cannot overrun: this test is
    // about errors, not latency (tests/fault_hung.rs measures the deadline).
    let deadline = Duration::from_millis(500);
    let tiers = [
        tier_with(&server.url(), deadline, TimeSource::Server),
        tier_with(&server.url(), deadline, TimeSource::Server),
    ];
    let stop = Arc::new(AtomicBool::new(false));
    let tasks = load(&tiers, 8, &stop);
    tokio::time::sleep(Duration::from_millis(300)).await;

    let killed = Instant::now();
    server.kill9();
    tokio::time::sleep(Duration::from_millis(200)).await;
    // restart() blocks until the new process answers PING.
    tokio::task::block_in_place(|| server.restart());
    let up = Instant::now();
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    let outcomes = finish(tasks).await;

    let failed: Vec<_> = outcomes.iter().filter(|o| o.result.is_err()).collect();
    let after_up = outcomes.iter().filter(|o| o.started >= up).count();
    eprintln!(
        "{} checks, {} failed (all started within {:?} of the kill; down for {:?}), {after_up} started after the restart",
        outcomes.len(),
        failed.len(),
        failed
            .iter()
            .map(|o| o.started.saturating_duration_since(killed))
            .max(),
        up - killed,
    );
    for o in &failed {
        let err = o.result.as_ref().expect_err("failed");
        assert!(
            o.started < up,
            "a check started {:?} after the server was back failed: {err:?}",
            o.started - up
        );
        assert!(
            matches!(
                err.redis_failure(),
                Some(
                    RedisFailure::ConnectionLost
                        | RedisFailure::ConnectionRefused
                        | RedisFailure::Timeout
                )
            ),
            "{err:?}"
        );
    }
    assert!(!failed.is_empty(), "the kill should have failed some calls");
    assert!(
        after_up > 50,
        "too few checks after the restart: {after_up}"
    );
}

/// 5 per hour: nothing refills while the test runs.
fn per_hour() -> RuleSet {
    set("batch", [Rule::per_hour(5).expect("valid")])
}

#[tokio::test]
async fn batch_after_script_flush_resends_only_what_failed() {
    let server = RedisServer::start();
    let scripts_url = support::scripts_only_url(&server).await;
    for (url, calls) in [(server.url(), "fcall"), (scripts_url, "evalsha")] {
        server.flushall().await;
        batch_after_flush(&server, &tier(&url), calls).await;
    }
}

/// One tier's part of the test above; `calls` is the command it sends.
async fn batch_after_flush(server: &RedisServer, tier: &RedisTier, calls: &str) {
    let set = per_hour();
    // The first call chooses Functions or scripts.
    tier.check("warm", &set, 1).await.expect("a healthy check");
    let keys: Vec<String> = (0..20).map(|i| format!("user{i}")).collect();
    let batch: Vec<_> = keys.iter().map(|k| CheckRequest::new(k, &set, 1)).collect();

    // A key holding the wrong type (a hash where GCRA keeps a string) makes
    // its script call fail on its own.
    let mut conn = server.conn().await;
    let broken = CheckRequest::new("broken", &set, 1);
    let _: () = redis::cmd("HSET")
        .arg(support::storage_key(&set, "broken", 0))
        .arg("field")
        .arg("value")
        .query_async(&mut conn)
        .await
        .expect("HSET");
    let mut with_broken = batch.clone();
    with_broken.push(broken);

    for round in 1..=3u64 {
        server.lua_flush().await;
        let before = server.command_calls(calls).await;
        let results = tier.check_many(&with_broken).await.expect("batch");
        let sent = server.command_calls(calls).await - before;
        // Every call was refused (NOSCRIPT, Function not found) once, then
        // sent again once.
        assert_eq!(sent, 2 * with_broken.len() as u64, "{calls} round {round}");
        for (i, r) in results[..keys.len()].iter().enumerate() {
            let v = r
                .as_ref()
                .unwrap_or_else(|e| panic!("round {round}, item {i}: {e:?}"));
            assert!(v.decision.allowed);
            assert_eq!(v.decision.remaining, 5 - round, "each check consumed once");
        }
        let err = results[keys.len()].as_ref().expect_err("wrong type");
        assert_eq!(
            err.redis_failure(),
            Some(RedisFailure::WrongType),
            "{err:?}"
        );
    }

    // With the code loaded, one call per check, failures not re-sent.
    let before = server.command_calls(calls).await;
    let results = tier.check_many(&with_broken).await.expect("batch");
    assert_eq!(
        server.command_calls(calls).await - before,
        with_broken.len() as u64
    );
    assert!(
        results[..keys.len()]
            .iter()
            .all(|r| r.as_ref().is_ok_and(|v| v.decision.remaining == 1))
    );
}

/// A function's file-level state is the library's, kept between calls:
/// decide.lua's server time (read once per call) must be read again by every
/// call, or a check would be decided at an earlier call's time.
#[tokio::test]
async fn every_function_call_reads_the_server_time_again() {
    let server = RedisServer::start();
    let tier = tier(&server.url());
    let set = set("time", [Rule::per_hour(1000).expect("valid")]);
    let mut admin = server.conn().await;
    let mut last = 0;
    for _ in 0..5 {
        let (secs, micros): (u64, u64) = redis::cmd("TIME")
            .query_async(&mut admin)
            .await
            .expect("TIME");
        let before = secs * 1_000_000 + micros;
        let v = tier.check("k", &set, 1).await.expect("a healthy check");
        assert_eq!(tier.script_mode(), Some(ScriptMode::Functions));
        assert!(
            v.server_time_us >= before && v.server_time_us > last,
            "decided at {} after TIME said {before} (previous check: {last})",
            v.server_time_us
        );
        last = v.server_time_us;
    }
}

/// After `SCRIPT FLUSH` (or a restart) a tier running scripts reloads the
/// check script at the next check's `NOSCRIPT`, and the reconcile script
/// before a check next carries write-backs. It kept its note that the
/// reconcile script was loaded, so that pipeline's write-backs met
/// `NOSCRIPT`, the check ran without them, and the key got its quota before
/// what it used locally was counted.
#[tokio::test]
async fn a_check_after_a_script_flush_counts_its_write_backs_first() {
    let server = RedisServer::start();
    let tier = tier(&support::scripts_only_url(&server).await);
    let r = Rule::per_hour(10).expect("valid");
    let set = set("after", [r.clone()]);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64);
    let write =
        |key: &str, units| LedgerEntry::new(storage_key(&set, key, 0), r.clone(), units, now, now);
    // A first check finds the tier runs scripts; one with a write-back then
    // loads the reconcile script.
    tier.check("first", &set, 1).await.expect("a healthy check");
    let warm = write("warm", 1);
    tier.check_after("warm", &set, 1, &[WriteBack::new("w-0", &warm)])
        .await
        .expect("a healthy check");
    assert_eq!(tier.script_mode(), Some(ScriptMode::Scripts));
    server.lua_flush().await;
    // Another key's check meets NOSCRIPT and reloads the check script.
    tier.check("other", &set, 1).await.expect("a healthy check");
    let owed = write("k", 5);
    let (verdict, written) = tier
        .check_after("k", &set, 1, &[WriteBack::new("w-1", &owed)])
        .await
        .expect("a healthy check");
    assert_eq!(written[0].as_ref().expect("written"), &Written::Applied(5));
    assert_eq!(
        verdict.decision.remaining, 4,
        "10 - 5 written back - 1: the check ran before its write-backs"
    );
}

/// The same after a restart that another instance noticed first: it met
/// `NOSCRIPT` and reloaded the check script, so this tier's next check
/// found its script and only the write-backs beside it did not. The tier
/// now forgets that the reconcile script was loaded whenever its
/// connection fails (a restart always breaks it), not only on `NOSCRIPT`.
#[tokio::test]
async fn a_check_after_a_restart_another_instance_saw_first_counts_its_write_backs_first() {
    let mut args = RedisServer::acl_user("scripts-only", "pw");
    args.extend(["-function", "-fcall", "-fcall_ro"].map(String::from));
    let mut server = RedisServer::start_with(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let url = server.url_as("scripts-only", "pw");
    let (this, other) = (tier(&url), tier(&url));
    let r = Rule::per_hour(10).expect("valid");
    let set = set("restart", [r.clone()]);
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64)
    };
    let write = |key: &str, units| {
        let at = now();
        LedgerEntry::new(storage_key(&set, key, 0), r.clone(), units, at, at)
    };
    // A first check finds the tier runs scripts; one with a write-back then
    // loads the reconcile script.
    this.check("first", &set, 1).await.expect("a healthy check");
    let warm = write("warm", 1);
    this.check_after("warm", &set, 1, &[WriteBack::new("w-0", &warm)])
        .await
        .expect("a healthy check");
    assert_eq!(this.script_mode(), Some(ScriptMode::Scripts));
    server.restart();
    // The other instance's check meets NOSCRIPT and reloads the check script.
    let end = Instant::now() + Duration::from_secs(5);
    while other.check("other", &set, 1).await.is_err() {
        assert!(
            Instant::now() < end,
            "the other tier did not reach the restarted server in 5 s"
        );
    }
    // This tier's calls fail until its connection is made again (the checks
    // a limiter would decide locally, hence the write-back).
    let owed = write("k", 5);
    let end = Instant::now() + Duration::from_secs(5);
    let (verdict, written) = loop {
        match this
            .check_after("k", &set, 1, &[WriteBack::new("w-1", &owed)])
            .await
        {
            Ok(answer) => break answer,
            Err(e) => {
                assert!(
                    Instant::now() < end,
                    "no answer in 5 s after the restart: {e}"
                )
            }
        }
    };
    assert_eq!(written[0].as_ref().expect("written"), &Written::Applied(5));
    assert_eq!(
        verdict.decision.remaining, 4,
        "10 - 5 written back - 1: the check ran before its write-backs"
    );
}
