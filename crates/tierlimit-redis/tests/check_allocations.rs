//! Heap allocations per healthy check (issue 10), split into redis-rs's share
//! and this crate's.
//!
//! A counting global allocator sees every allocation of the process, so this
//! binary has one test function, on a current-thread runtime: the connection's
//! driver task and the checks run on one thread and nothing else allocates
//! meanwhile. redis-rs's share is what a bare `ConnectionManager` costs to send
//! the same `EVALSHA`, prebuilt, and read its reply into a `Value` (connection,
//! encoding, reply parsing); this crate's share is the rest of a
//! `RedisTier::check`: the key, the command, the deadline, the verdict.
//!
//! Run with `--nocapture` to see the numbers.

use std::alloc::System;
use std::future::Future;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Cmd, RedisWrite, Value};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use tierlimit_core::{LedgerEntry, Rule, RuleSet, escape_key};
use tierlimit_redis::{CHECK, RECONCILE, RedisTier, RedisTierConfig, WriteBack};
use tierlimit_test::RedisServer;

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

const WARM_UP: usize = 200;
const CHECKS: usize = 2_000;
const DEADLINE: Duration = Duration::from_secs(2);

/// Allocations and bytes per call, averaged over [`CHECKS`] calls.
#[derive(Debug, Clone, Copy)]
struct PerCall {
    /// `alloc` and `realloc` calls: each one asks the allocator for memory.
    allocs: f64,
    bytes: f64,
}

impl std::ops::Sub for PerCall {
    type Output = PerCall;
    fn sub(self, other: PerCall) -> PerCall {
        PerCall {
            allocs: self.allocs - other.allocs,
            bytes: self.bytes - other.bytes,
        }
    }
}

impl std::fmt::Display for PerCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:6.2} allocs {:7.1} bytes", self.allocs, self.bytes)
    }
}

/// Runs `call` [`WARM_UP`] times, then counts what [`CHECKS`] more calls allocate.
async fn per_call<F, Fut>(mut call: F) -> PerCall
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    for _ in 0..WARM_UP {
        call().await;
    }
    let region = Region::new(GLOBAL);
    for _ in 0..CHECKS {
        call().await;
    }
    let stats = region.change();
    let n = CHECKS as f64;
    PerCall {
        allocs: (stats.allocations + stats.reallocations) as f64 / n,
        bytes: (stats.bytes_allocated as f64 + stats.bytes_reallocated as f64) / n,
    }
}

/// The check script's `EVALSHA` for `key` and `set`, cost 1, server time,
/// built the way `lua/check.lua` states its protocol.
fn evalsha(key: &str, set: &RuleSet) -> Cmd {
    let rules = set.rules();
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(CHECK.get_hash()).arg(rules.len());
    for i in 0..rules.len() {
        cmd.arg(set.storage_key(&escape_key(key), i));
    }
    cmd.arg("0").arg(1).arg(12_345u64);
    for rule in rules {
        cmd.write_arg_fmt(rule.script_arg());
    }
    cmd
}

fn rule(limit: u64, period: Duration) -> Rule {
    Rule::with_period(limit, period).expect("valid rule")
}

/// This crate's allocations per healthy `check`, whatever the number of rules
/// (issue 10; redis-rs 1.8, tokio 1.54, averaged over 2,000 checks):
///
/// | | 1 rule | 3 rules |
/// |---|---|---|
/// | before: total, redis-rs, ours | 31, 4, 27 | 57, 4, 53 |
/// | after: total, redis-rs, ours | 7, 4, 3 | 7, 4, 3 |
///
/// Before, every key and number was a `String` of its own, copied again into
/// redis-rs's `ScriptInvocation` (a `Vec<u8>` each), whose `Cmd` was built
/// from those, and the reply went through a `Vec<i64>`. What remains is what
/// the key and the reply need: the command's buffer and redis-rs's list of
/// where each argument ends in it (one `Cmd`, sized up front, keys formatted
/// into it, the rules' numbers copied from the `RuleSet`), and the verdict's
/// `rules` vector (public API). redis-rs's own 4 include its packed copy of
/// the command, the request's reply channel and the reply's `Value` array.
///
/// The margin of half an allocation absorbs redis-rs's rare buffer growth,
/// which need not fall the same in the two loops subtracted; one more
/// allocation per check fails the test.
const CHECK_BUDGET: f64 = 3.5;

/// This crate's allocations per `check_after` with one write-back:
/// before 40 (1 rule) and 54 (3 rules), after 8 for both (redis-rs: 6). Each
/// of the two commands is one `Cmd` (2); the pipeline's list of commands,
/// the replies as they land (kept outside the deadline so what came back
/// survives it), the write-backs' outcomes and the verdict's rules (1 each).
const CHECK_AFTER_BUDGET: f64 = 8.5;

#[tokio::test]
async fn a_healthy_check_allocates_only_what_its_key_and_reply_need() {
    let server = RedisServer::start();
    let tier = RedisTier::new(RedisTierConfig::new(server.url()).deadline(DEADLINE))
        .expect("valid config");
    let bare: ConnectionManager = server
        .client()
        .get_connection_manager_with_config(
            ConnectionManagerConfig::new().set_response_timeout(Some(DEADLINE)),
        )
        .await
        .expect("bare connection");

    // The tier runs its Lua as functions (FCALL); the baseline sends the
    // same keys and arguments by EVALSHA, which redis-rs encodes and parses
    // alike (two leading arguments of another text, the same reply), so the
    // scripts are loaded for it.
    let mut loader = bare.clone();
    CHECK.load_async(&mut loader).await.expect("SCRIPT LOAD");
    RECONCILE
        .load_async(&mut loader)
        .await
        .expect("SCRIPT LOAD");

    let sets = [
        RuleSet::new("one", [rule(10_000_000, Duration::from_secs(3600))]).expect("valid"),
        RuleSet::new(
            "three",
            [
                rule(1_000_000, Duration::from_secs(1)),
                rule(10_000_000, Duration::from_secs(60)),
                rule(100_000_000, Duration::from_secs(3600)),
            ],
        )
        .expect("valid"),
    ];
    let key = "user:42";
    let mut report = String::new();
    let mut over = Vec::new();
    for set in &sets {
        let rules = set.rules().len();
        let total = per_call(|| async {
            let verdict = tier.check(key, set, 1).await.expect("healthy check");
            assert!(verdict.decision.allowed);
        })
        .await;
        let cmd = evalsha(key, set);
        let redis_rs = per_call(|| {
            let mut conn = bare.clone();
            let cmd = &cmd;
            async move {
                let reply = conn.send_packed_command(cmd).await.expect("bare EVALSHA");
                assert!(matches!(reply, Value::Array(_)), "{reply:?}");
            }
        })
        .await;
        let ours = total - redis_rs;
        report.push_str(&format!(
            "check, {rules} rule(s): total {total} | redis-rs {redis_rs} | tierlimit-redis {ours}\n"
        ));
        if ours.allocs > CHECK_BUDGET {
            over.push(format!("check, {rules} rule(s): {ours}"));
        }

        // check_after with one write-back pipelined before the check.
        let storage_key = set.storage_key(&escape_key(key), 0);
        let now_us = 1_700_000_000_000_000;
        let entry = LedgerEntry::new(
            storage_key.clone(),
            set.rules()[0].clone(),
            1,
            now_us,
            now_us,
        );
        let writes = [WriteBack::new("wb-1", &entry)];
        let after = per_call(|| async {
            let (verdict, written) = tier
                .check_after(key, set, 1, &writes)
                .await
                .expect("healthy check_after");
            assert!(verdict.decision.allowed);
            assert_eq!(written.len(), 1);
        })
        .await;
        let mut pipe = redis::pipe();
        let mut reconcile = redis::cmd("EVALSHA");
        reconcile
            .arg(RECONCILE.get_hash())
            .arg(2)
            .arg(&storage_key)
            .arg(format!("{storage_key}:rc:wb-1"))
            .arg("0")
            .arg(set.script_arg(0))
            .arg(1)
            .arg(now_us)
            .arg(now_us)
            .arg(120_000)
            .arg("wb-1");
        pipe.add_command(reconcile).add_command(cmd.clone());
        let redis_rs_after = per_call(|| {
            let mut conn = bare.clone();
            let pipe = &pipe;
            async move {
                let replies = conn
                    .send_packed_commands(pipe, 0, 2)
                    .await
                    .expect("bare pipeline");
                assert_eq!(replies.len(), 2);
            }
        })
        .await;
        let ours = after - redis_rs_after;
        report.push_str(&format!(
            "check_after + 1 write-back, {rules} rule(s): total {after} | redis-rs {redis_rs_after} | tierlimit-redis {ours}\n"
        ));
        if ours.allocs > CHECK_AFTER_BUDGET {
            over.push(format!("check_after, {rules} rule(s): {ours}"));
        }
    }
    println!("{report}");
    assert!(over.is_empty(), "over budget: {over:?}\n{report}");
}
