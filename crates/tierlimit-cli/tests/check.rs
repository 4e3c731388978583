//! `tierlimit check` against a real redis-server (the test harness's, on a
//! free loopback port): decisions shared through Redis across processes,
//! rules parsed by the library's grammar, and Redis down said plainly.

mod support;

use serde_json::Value;
use support::tierlimit;
use tierlimit_test::RedisServer;

fn check(url: &str, extra: &[&str]) -> (Option<i32>, Value, String) {
    let out = tierlimit()
        .args(["check", "--redis", url, "--json"])
        .args(extra)
        .output()
        .expect("run tierlimit check");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let value = serde_json::from_str(stdout.trim()).unwrap_or(Value::Null);
    (out.status.code(), value, stderr)
}

#[test]
fn checks_count_on_redis_across_processes_until_denied() {
    let server = RedisServer::start();
    let url = server.url();
    let args = ["--key", "user:42", "--rule", "2/min", "--rule", "100/h"];
    for remaining in [1, 0] {
        let (code, d, stderr) = check(&url, &args);
        assert_eq!(code, Some(0), "{d} {stderr}");
        assert_eq!(d["allowed"], true);
        assert_eq!(d["tier"], "redis");
        assert_eq!(d["limit"], 2);
        assert_eq!(d["remaining"], remaining);
        assert_eq!(d["rules"][1]["rule"], "100/h");
        assert_eq!(d["rules"][1]["remaining"], 100 - (2 - remaining));
    }
    let (code, d, _) = check(&url, &args);
    assert_eq!(code, Some(2), "denied exits 2: {d}");
    assert_eq!(d["allowed"], false);
    assert_eq!(d["tier"], "redis");
    assert_eq!(d["rule"], "2/min");
    assert!(
        d["retry_after_ms"]
            .as_f64()
            .is_some_and(|ms| ms > 0.0 && ms <= 60_000.0),
        "{d}"
    );
    // Another key has its own quota; --cost takes several units.
    let (code, d, _) = check(
        &url,
        &["--key", "user:43", "--rule", "2/min", "--cost", "2"],
    );
    assert_eq!((code, &d["remaining"]), (Some(0), &Value::from(0)));
}

/// A deadline shorter than the breaker's default slow-call threshold
/// (40 ms) works: the command lowers the threshold below it, which the
/// library requires and the command line cannot set otherwise.
#[test]
fn a_deadline_below_the_default_slow_call_threshold_works() {
    let server = RedisServer::start();
    let (code, d, stderr) = check(
        &server.url(),
        &["--key", "k", "--rule", "10/s", "--deadline", "20ms"],
    );
    assert_eq!(
        (code, &d["tier"]),
        (Some(0), &Value::from("redis")),
        "{d} {stderr}"
    );
}

#[test]
fn the_human_form_names_the_decision_and_every_rule() {
    let server = RedisServer::start();
    let out = tierlimit()
        .args([
            "check",
            "--redis",
            &server.url(),
            "--key",
            "k",
            "--rule",
            "10/s",
        ])
        .args(["--rule", "1000/day@+08:00"])
        .output()
        .expect("run");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.starts_with("ALLOWED k (cost 1) by redis"), "{text}");
    assert!(text.contains("rule 10/s"), "{text}");
    assert!(text.contains("rule 1000/day@+08:00"), "{text}");
}

#[test]
fn a_malformed_rule_is_refused_with_the_grammar_s_reason() {
    let out = tierlimit()
        .args(["check", "--redis", "redis://127.0.0.1:1/", "--key", "k"])
        .args(["--rule", "10/fortnight"])
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(64),
        "a usage error, not a denial (2): {stderr}"
    );
    assert!(
        stderr.contains("10/fortnight") && stderr.contains("--rule"),
        "{stderr}"
    );
    let out = tierlimit()
        .args([
            "check",
            "--redis",
            "redis://127.0.0.1:1/",
            "--key",
            "bad\nkey",
        ])
        .args(["--rule", "10/s"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).starts_with("error: "));
}

#[test]
fn redis_down_prints_the_policy_s_answer_and_why() {
    // A port nothing listens on: the harness's server, stopped.
    let mut server = RedisServer::start();
    let url = server.url();
    server.kill9();
    let (code, d, stderr) = check(&url, &["--key", "k", "--rule", "10/s"]);
    assert_eq!(code, Some(1), "{d} {stderr}");
    assert_eq!(d["tier"], "fail_closed");
    assert_eq!(d["allowed"], false);
    assert!(d["redis_failure"].is_string(), "{d}");
    assert!(stderr.contains("Redis did not decide"), "{stderr}");
    let (code, d, _) = check(
        &url,
        &["--key", "k", "--rule", "10/s", "--policy", "fail-open"],
    );
    assert_eq!(
        (code, &d["tier"], &d["allowed"]),
        (Some(1), &Value::from("fail_open"), &Value::from(true))
    );
}

/// Every command exits 64 on a usage error, as the README says: an unknown
/// flag, a missing value or a malformed one, whichever the command.
#[test]
fn every_command_exits_64_on_a_usage_error() {
    let redis = "redis://127.0.0.1:1/";
    let cases: &[&[&str]] = &[
        &[
            "check", "--redis", redis, "--key", "k", "--rule", "10/s", "--bogus",
        ],
        &["check", "--redis", redis, "--key", "k"],
        &["demo", "--duration", "soon"],
        &["demo", "--bogus"],
        &["load", "--redis", redis, "--concurrency", "many"],
        &["config", "check"],
        &["config", "frobnicate", "x.toml"],
        &["frobnicate"],
    ];
    for args in cases {
        let out = tierlimit().args(*args).output().expect("run");
        assert_eq!(
            out.status.code(),
            Some(64),
            "tierlimit {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
