//! Functions or scripts (issue 11, "Lean scripts"): a tier runs its Lua as a
//! Redis Functions library (`FCALL`) when the server has Functions and the
//! user may load (or at least call) the library, and as scripts (`EVALSHA`)
//! otherwise; either way it decides correctly. What it chose is
//! `RedisTier::script_mode`.

mod support;

use std::time::Duration;

use tierlimit_core::{Algorithm, LedgerEntry, Rule};
use tierlimit_redis::{ScriptMode, WriteBack, Written};
use tierlimit_test::RedisServer;

use support::{ALGORITHMS, rule, set, storage_key, tier};

/// Adds ACL user `name` (password `pw`) allowed every key and command but
/// `denied`, and answers its URL.
async fn user_without(server: &RedisServer, name: &str, denied: &[&str]) -> String {
    let mut admin = server.conn().await;
    let mut cmd = redis::cmd("ACL");
    cmd.arg("SETUSER")
        .arg(name)
        .arg("on")
        .arg(">pw")
        .arg("~*")
        .arg("&*")
        .arg("+@all");
    for d in denied {
        cmd.arg(format!("-{d}"));
    }
    let () = cmd.query_async(&mut admin).await.expect("ACL SETUSER");
    server.url_as(name, "pw")
}

/// The libraries the server holds (`FUNCTION LIST`): how many.
async fn libraries(server: &RedisServer) -> usize {
    let list: Vec<redis::Value> = redis::cmd("FUNCTION")
        .arg("LIST")
        .query_async(&mut server.conn().await)
        .await
        .expect("FUNCTION LIST");
    list.len()
}

/// Three checks of every algorithm against a limit of 3, then a fourth:
/// admitted, admitted, admitted, denied.
async fn decides_a_limit_of_three(tier: &tierlimit_redis::RedisTier, label: &str) {
    for algorithm in ALGORITHMS {
        let set = set(
            &format!("three-{algorithm:?}"),
            [rule(algorithm, 3, Duration::from_secs(3600))],
        );
        for n in 1..=4u64 {
            let v = tier.check("k", &set, 1).await.expect("a healthy check");
            assert_eq!(
                v.decision.allowed,
                n <= 3,
                "{label} {algorithm:?}: check {n}: {v:?}"
            );
            assert_eq!(v.decision.remaining, 3u64.saturating_sub(n), "{label}");
        }
    }
}

/// A fresh Redis 7: the first check loads the library and every check is an
/// `FCALL`; no `EVALSHA` at all.
#[tokio::test]
async fn redis_7_runs_functions() {
    let server = RedisServer::start();
    let tier = tier(&server.url());
    assert_eq!(tier.script_mode(), None, "chosen by the first call");
    decides_a_limit_of_three(&tier, "functions").await;
    assert_eq!(tier.script_mode(), Some(ScriptMode::Functions));
    assert_eq!(libraries(&server).await, 1);
    assert_eq!(server.command_calls("function|load").await, 1);
    assert_eq!(server.command_calls("evalsha").await, 0);
    assert_eq!(server.command_calls("script|load").await, 0);
    // 20 checks and the first one's try before the load.
    assert_eq!(server.command_calls("fcall").await, 21);
}

/// A user the ACL refuses `FUNCTION` (so no `FUNCTION LOAD`) on a server
/// without the library: the tier falls back to `EVALSHA` and decides the same.
#[tokio::test]
async fn a_user_who_may_not_load_functions_runs_scripts() {
    let server = RedisServer::start();
    let tier = tier(&user_without(&server, "no-function", &["function"]).await);
    decides_a_limit_of_three(&tier, "no FUNCTION").await;
    assert_eq!(tier.script_mode(), Some(ScriptMode::Scripts));
    assert_eq!(libraries(&server).await, 0);
    // One FCALL (Function not found) before the choice, then scripts only.
    assert_eq!(server.command_calls("fcall").await, 1);
    assert_eq!(
        server.command_calls("evalsha").await,
        20 + 1,
        "one NOSCRIPT"
    );
}

/// A user refused every scripting command but `EVALSHA` and `SCRIPT`
/// (`-@scripting` then those added back): `FCALL` itself is refused, so the
/// tier runs scripts, even though the library is on the server.
#[tokio::test]
async fn a_user_refused_fcall_runs_scripts_even_with_the_library_loaded() {
    let server = RedisServer::start();
    let loader = tier(&server.url());
    decides_a_limit_of_three(&loader, "loader").await;
    assert_eq!(libraries(&server).await, 1);
    server.flushall().await;

    let mut admin = server.conn().await;
    let () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("scripts")
        .arg("on")
        .arg(">pw")
        .arg("~*")
        .arg("&*")
        .arg("+@all")
        .arg("-@scripting")
        .arg("+evalsha")
        .arg("+script|load")
        .query_async(&mut admin)
        .await
        .expect("ACL SETUSER");
    let tier = tier(&server.url_as("scripts", "pw"));
    let fcalls = server.command_calls("fcall").await;
    decides_a_limit_of_three(&tier, "no FCALL").await;
    assert_eq!(tier.script_mode(), Some(ScriptMode::Scripts));
    assert_eq!(
        server.command_calls("fcall").await,
        fcalls,
        "refused by the ACL, never run"
    );
    assert!(server.command_calls("evalsha").await >= 20);
}

/// A user who may call but not load functions, on a server another client
/// loaded the library on: it uses the library.
#[tokio::test]
async fn a_user_who_may_not_load_uses_a_library_already_loaded() {
    let server = RedisServer::start();
    let loader = tier(&server.url());
    decides_a_limit_of_three(&loader, "loader").await;
    server.flushall().await;
    let tier = tier(&user_without(&server, "caller", &["function"]).await);
    decides_a_limit_of_three(&tier, "caller").await;
    assert_eq!(tier.script_mode(), Some(ScriptMode::Functions));
    assert_eq!(server.command_calls("evalsha").await, 0);
}

/// The same user, on a server where an administrator loaded the library by
/// hand (`FUNCTION LOAD` of `library_source()`, as its docs say): it uses it.
#[tokio::test]
async fn a_library_an_administrator_loaded_by_hand_serves_a_user_who_may_not_load() {
    let server = RedisServer::start();
    let name: String = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg(tierlimit_redis::library_source())
        .query_async(&mut server.conn().await)
        .await
        .expect("the library loads by hand");
    assert!(name.starts_with("tierlimit_"), "{name}");
    let tier = tier(&user_without(&server, "caller", &["function"]).await);
    decides_a_limit_of_three(&tier, "caller").await;
    assert_eq!(tier.script_mode(), Some(ScriptMode::Functions));
    assert_eq!(server.command_calls("evalsha").await, 0);
    assert_eq!(libraries(&server).await, 1, "no second library was loaded");
}

/// Dropping the connections makes the next call choose again (a server may
/// have been upgraded, or the user's rights changed).
#[tokio::test]
async fn dropping_the_connection_chooses_again() {
    let server = RedisServer::start();
    let url = user_without(&server, "changing", &["function", "fcall"]).await;
    let tier = tier(&url);
    let set = set("again", [Rule::per_hour(10).expect("valid")]);
    tier.check("k", &set, 1).await.expect("a healthy check");
    assert_eq!(tier.script_mode(), Some(ScriptMode::Scripts));
    let () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("changing")
        .arg("+@all")
        .query_async(&mut server.conn().await)
        .await
        .expect("ACL SETUSER");
    tier.drop_connection();
    assert_eq!(tier.script_mode(), None);
    let v = tier.check("k", &set, 1).await.expect("a healthy check");
    assert_eq!(v.decision.remaining, 8, "both checks counted once");
    assert_eq!(tier.script_mode(), Some(ScriptMode::Functions));
}

/// The heartbeat and write-backs run as functions too, and decide as the
/// scripts do: the same outcomes through either.
#[tokio::test]
async fn heartbeat_and_write_backs_run_as_functions() {
    let server = RedisServer::start();
    let scripts = tier(&user_without(&server, "scripts", &["function", "fcall"]).await);
    let functions = tier(&server.url());
    let ttl = Duration::from_secs(30);
    assert_eq!(
        functions
            .heartbeat("tl:{inst}", "a", ttl)
            .await
            .expect("hb"),
        1
    );
    assert_eq!(
        scripts.heartbeat("tl:{inst}", "b", ttl).await.expect("hb"),
        2
    );
    assert_eq!(functions.script_mode(), Some(ScriptMode::Functions));
    assert_eq!(scripts.script_mode(), Some(ScriptMode::Scripts));

    let r = rule(Algorithm::Gcra, 10, Duration::from_secs(60));
    let set = set("wb", [r.clone()]);
    let now_us = u64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_micros(),
    )
    .expect("fits");
    for (label, tier, key) in [("functions", &functions, "f"), ("scripts", &scripts, "s")] {
        let entry = LedgerEntry::new(storage_key(&set, key, 0), r.clone(), 4, now_us, now_us);
        let fcalls = server.command_calls("fcall").await;
        let written = tier
            .reconcile(&[WriteBack::new("wb-1", &entry)])
            .await
            .expect("reconcile");
        assert!(
            matches!(written.as_slice(), [Ok(Written::Applied(4))]),
            "{label}: {written:?}"
        );
        let again = tier
            .reconcile(&[WriteBack::new("wb-1", &entry)])
            .await
            .expect("reconcile");
        assert!(
            matches!(again.as_slice(), [Ok(Written::AlreadyApplied)]),
            "{label}: {again:?}"
        );
        let fcalls = server.command_calls("fcall").await - fcalls;
        assert_eq!(fcalls, if label == "functions" { 2 } else { 0 }, "{label}");
        let v = tier.check(key, &set, 1).await.expect("check");
        assert_eq!(
            v.decision.remaining, 5,
            "{label}: 4 written back, 1 checked"
        );
    }
}

/// A server without Functions, as Redis 6 is (here a Redis 7 whose `FCALL`
/// and `FUNCTION` are renamed away, so both answer `unknown command`): the
/// tier runs scripts and decides the same, each check counted once.
#[tokio::test]
async fn a_server_without_functions_runs_scripts() {
    let server = RedisServer::start_with(&[
        "--rename-command",
        "FCALL",
        "",
        "--rename-command",
        "FUNCTION",
        "",
    ]);
    let tier = tier(&server.url());
    decides_a_limit_of_three(&tier, "no Functions").await;
    assert_eq!(tier.script_mode(), Some(ScriptMode::Scripts));
    // One NOSCRIPT on the first EVALSHA, then one call per check.
    assert_eq!(server.command_calls("evalsha").await, 20 + 1);
    assert_eq!(server.command_calls("script|load").await, 1);
}

/// Out of memory (`maxmemory` reached, `noeviction`): Redis refuses a whole
/// `FCALL` of a function that may write, where a script runs until its first
/// write. The tier then sends the check as a script, so a denial (which
/// writes nothing) is still decided, and an admission fails with `-OOM`, as
/// with scripts alone.
#[tokio::test]
async fn out_of_memory_denials_are_still_decided() {
    let server = RedisServer::start_with(&["--maxmemory-policy", "noeviction"]);
    let tier = tier(&server.url());
    let set = set(
        "oom",
        ALGORITHMS.map(|a| rule(a, 1, Duration::from_secs(3600))),
    );
    let v = tier.check("full", &set, 1).await.expect("fits in memory");
    assert!(v.decision.allowed);
    assert_eq!(tier.script_mode(), Some(ScriptMode::Functions));
    server.config_set("maxmemory", "1").await;

    let v = tier
        .check("full", &set, 1)
        .await
        .expect("a denial writes nothing");
    assert!(!v.decision.allowed, "{v:?}");
    let err = tier
        .check("fresh", &set, 1)
        .await
        .expect_err("an admission writes");
    assert_eq!(
        err.redis_failure(),
        Some(tierlimit_core::RedisFailure::OutOfMemory),
        "{err:?}"
    );
    assert_eq!(tier.script_mode(), Some(ScriptMode::Functions), "kept");
}
