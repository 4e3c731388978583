//! `tierlimit config check` and `tierlimit load`: a config file validated
//! with every problem listed, and load driven from its rule sets against
//! the harness's redis-server.

mod support;

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;
use support::tierlimit;
use tierlimit_test::RedisServer;

/// A config file in a fresh temporary directory, removed on drop.
struct TempFile(PathBuf);

impl TempFile {
    fn new(name: &str, text: &str) -> TempFile {
        let dir = std::env::temp_dir().join(format!(
            "tierlimit-cli-test-{}-{}",
            std::process::id(),
            name.replace('.', "-")
        ));
        std::fs::create_dir_all(&dir).expect("mkdir");
        let path = dir.join(name);
        std::fs::write(&path, text).expect("write config");
        TempFile(path)
    }

    fn path(&self) -> &str {
        self.0.to_str().expect("utf-8 temp path")
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if let Some(dir) = self.0.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

#[test]
fn config_check_lists_every_problem_with_its_path_and_line() {
    let file = TempFile::new(
        "bad.toml",
        "[redis]\nurl = 5\ndeadlin = \"50ms\"\n[rule_sets.login]\nrules = [\"10/fortnight\", { limit = 0, per = \"1h\" }]\n",
    );
    let out = tierlimit()
        .args(["config", "check", file.path()])
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let p = file.path();
    for expected in [
        format!("{p}:2:7: redis.url: expected a string"),
        format!("{p}:3:1: redis.deadlin: unknown field"),
        format!("{p}:5:10: rule_sets.login.rules[0]: \"10/fortnight\" is not a rule"),
        format!("{p}:5:36: rule_sets.login.rules[1].limit: must be at least 1"),
        format!("{p}: 4 problems"),
    ] {
        assert!(
            stderr.contains(&expected),
            "missing `{expected}` in:\n{stderr}"
        );
    }
}

#[test]
fn config_check_describes_a_valid_file() {
    let file = TempFile::new(
        "good.toml",
        "[redis]\nurl = \"redis://127.0.0.1:1/\"\n[rule_sets.api]\nrules = [\"100/s\", { limit = 20, per = \"1m\", algorithm = \"token-bucket\", burst = 5 }, \"1000/day@+08:00\", \"50/h@UTC\"]\n[rule_sets.login]\npolicy = \"fail-closed\"\nrules = [\"5/min\"]\n",
    );
    let out = tierlimit()
        .args(["config", "check", file.path()])
        .output()
        .expect("run");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("valid; 2 rule sets"), "{stdout}");
    assert!(
        stdout
            .contains("100/s (gcra), 20/min (token-bucket, burst 5), 1000/d@+08:00 (fixed-window), 50/h@UTC (fixed-window)"),
        "{stdout}"
    );
    assert!(stdout.contains("policy fail-closed"), "{stdout}");
    let missing = tierlimit()
        .args(["config", "check", "/nonexistent/tierlimit.toml"])
        .output()
        .expect("run");
    assert_eq!(missing.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("cannot read"));
}

/// One instance, one set of 50/s; its URL unreachable (`--redis` replaces it).
const ONE_KEY_AT_50: &str = "[redis]\nurl = \"redis://127.0.0.1:1/\"\n[limiter]\ninstances = 1\n[rule_sets.api]\nrules = [\"50/s\"]\n";

/// The load checks the file's rule set against Redis (through `--redis`,
/// which replaces the file's unreachable URL) and the limit holds: one key
/// at 50/s admits at most its burst plus 50 per second of load.
#[test]
fn load_runs_the_file_s_rule_sets_against_redis_and_the_limit_holds() {
    let server = RedisServer::start();
    let file = TempFile::new("load.toml", ONE_KEY_AT_50);
    let out = tierlimit()
        .args(["load", "--redis", &server.url(), "--config", file.path()])
        .args([
            "--duration",
            "2s",
            "--concurrency",
            "4",
            "--keys",
            "1",
            "--json",
        ])
        .output()
        .expect("run");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s: Value = serde_json::from_str(stdout.trim()).expect("one JSON object");
    let n = |p: &str| {
        s.pointer(p)
            .and_then(Value::as_u64)
            .unwrap_or_else(|| panic!("{p} in {s}"))
    };
    assert!(n("/checks") > 100, "{s}");
    assert_eq!(n("/errors"), 0);
    assert!(
        n("/decisions/redis/allowed") > 0,
        "Redis decided nothing: {s}"
    );
    assert_eq!(n("/checks"), n("/allowed") + n("/denied"));
    let seconds = s["duration_s"].as_f64().expect("duration_s");
    let bound = 50 + (50.0 * seconds).ceil() as u64;
    assert!(
        n("/allowed") <= bound,
        "admitted {} > {bound}: {s}",
        n("/allowed")
    );
    assert!(n("/denied") > 0, "the load never reached the limit: {s}");
    for q in ["p50", "p99", "max"] {
        assert!(s["latency_us"][q].is_u64(), "{q}: {s}");
    }
    assert!(
        n("/latency_us/p50") <= n("/latency_us/p99")
            && n("/latency_us/p99") <= n("/latency_us/max")
    );
}

#[test]
fn load_refuses_a_bad_config_and_an_unknown_set() {
    let bad = TempFile::new("bad-load.toml", "[redis]\nurl = 5\n");
    let out = tierlimit()
        .args(["load", "--config", bad.path(), "--duration", "1s"])
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr.contains("redis.url: expected a string"), "{stderr}");
    let good = TempFile::new(
        "good-load.toml",
        "[redis]\nurl = \"redis://127.0.0.1:1/\"\n[rule_sets.api]\nrules = [\"5/s\"]\n",
    );
    let out = tierlimit()
        .args([
            "load",
            "--config",
            good.path(),
            "--set",
            "nope",
            "--duration",
            "1s",
        ])
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr.contains("no rule set `nope` (it has: api)"),
        "{stderr}"
    );
}

/// Ctrl-C stops a load early and it still reports, as its help says.
/// Regression: `main` raced the load against a Ctrl-C listener of its own;
/// the signal woke both, and that one dropped the load, report and all,
/// while it waited for its last checks: exit 130 and nothing on stdout.
#[test]
fn ctrl_c_stops_a_load_which_still_reports() {
    let server = RedisServer::start();
    let file = TempFile::new("interrupted.toml", ONE_KEY_AT_50);
    let mut load = tierlimit();
    load.args(["load", "--redis", &server.url(), "--config", file.path()])
        .args(["--duration", "60s", "--concurrency", "4", "--keys", "1"]);
    let mut run = support::Running::start(load);
    // Once it has run a second (its first progress line).
    run.stderr_until(Duration::from_secs(30), |l| l.contains("checks ("));
    run.signal("INT");
    let code = run.wait(Duration::from_secs(20));
    let (stdout, stderr) = (run.rest_of_stdout(), run.rest_of_stderr());
    assert_eq!(code, Some(0), "stdout: {stdout:?} stderr: {stderr:?}");
    assert!(
        stdout.iter().any(|l| l.contains("checks in")),
        "no report: {stdout:?}"
    );
    assert!(
        stderr
            .iter()
            .any(|l| l.contains("interrupted: stopped early")),
        "{stderr:?}"
    );
}
