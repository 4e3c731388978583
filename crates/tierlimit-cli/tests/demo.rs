//! `tierlimit demo` end to end: the real binary, its own redis-server, a
//! shortened timeline, and the numbers of its JSON summary held to the
//! bounds the demo claims.

mod support;

use std::time::Duration;

use serde_json::Value;
use support::{Running, gone_within, process_alive, tierlimit};

const LIMIT: u64 = 200;
const INSTANCES: u64 = 3;
const DEADLINE_MS: u64 = 50;
/// Scheduling on a shared 2-core machine, on top of the deadline.
const MARGIN_MS: u64 = 100;

fn pid_in(text: &str) -> Option<u32> {
    let at = text.find("pid ")? + 4;
    text[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

fn u(v: &Value, path: &str) -> u64 {
    v.pointer(path)
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("{path} is missing or not a number in {v}"))
}

/// The acceptance run: 8 s of load, Redis killed at 2 s and restarted at
/// 5 s. Decisions go on through the outage, the fleet admits at most its
/// shares per second, what was admitted is written back, no decision waits
/// much past the deadline, and both redis-server processes are gone after.
#[test]
fn demo_summary_holds_its_bounds_and_the_deadline() {
    let mut demo = tierlimit();
    demo.args(["demo", "--json", "--duration", "8s", "--outage-at", "2s"])
        .args(["--heal-at", "5s", "--deadline", &format!("{DEADLINE_MS}ms")])
        .args(["--limit", &LIMIT.to_string(), "--rate", "600"])
        .args(["--instances", &INSTANCES.to_string()]);
    let mut run = Running::start(demo);
    let code = run.wait(Duration::from_secs(60));
    let stdout = run.rest_of_stdout();
    let stderr = run.rest_of_stderr().join("\n");
    assert_eq!(code, Some(0), "demo failed; stderr:\n{stderr}");

    let lines: Vec<Value> = stdout
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let of_type = |t: &str| -> Vec<&Value> { lines.iter().filter(|v| v["type"] == t).collect() };
    let seconds = of_type("second");
    assert_eq!(seconds.len(), 8, "one line per second: {stdout:#?}");
    let events = of_type("event");
    assert_eq!(events.len(), 2, "the stop and the heal: {events:?}");
    let summaries = of_type("summary");
    assert_eq!(summaries.len(), 1);
    let s = summaries[0];
    println!("{}", serde_json::to_string_pretty(s).expect("JSON"));

    // Every instance learned there are three of them.
    assert_eq!(
        s["instances_learned"],
        serde_json::json!([INSTANCES, INSTANCES, INSTANCES])
    );
    assert_eq!(u(s, "/errors"), 0);

    // Decisions went on during the outage, from the local tier, none failed closed.
    let windows = u(s, "/outage/windows");
    assert!(
        windows >= 2,
        "Redis down for whole seconds 3 and 4 at least: {windows}"
    );
    let outage_decisions = u(s, "/outage/total_decisions");
    assert!(
        u(s, "/outage/decisions/local/allowed") > 0,
        "the local tier admitted nothing while Redis was down"
    );
    assert_eq!(u(s, "/outage/decisions/fail_closed/denied"), 0);
    assert_eq!(u(s, "/outage/decisions/redis/allowed"), 0);

    // The fleet admitted at most its shares: limit + instances per second.
    let bound = u(s, "/outage/bound_per_window");
    assert_eq!(bound, LIMIT + INSTANCES);
    // The load was heavy enough that instances each with the whole limit
    // would have gone far past the bound (3 x 200 offered per 200 allowed).
    assert!(
        outage_decisions / windows > 2 * bound,
        "too little load to show anything: {outage_decisions} decisions in {windows} s"
    );
    let max = u(s, "/outage/max_admitted_per_window");
    assert!(
        max <= bound,
        "{max} admitted in one second of the outage, bound {bound}"
    );
    // Within that, what the README says: each instance its share (67 of
    // 200, 201 together) in a second wholly without Redis.
    let shares = INSTANCES * LIMIT.div_ceil(INSTANCES);
    assert!(
        max <= shares,
        "{max} admitted in one second of the outage, shares {shares}"
    );
    assert!(u(s, "/outage/admitted") <= bound * windows);
    for second in seconds.iter().filter(|v| v["redis"] == "down") {
        assert!(u(second, "/admitted") <= bound, "{second}");
        assert!(
            second["breakers"]
                .as_array()
                .is_some_and(|b| b.iter().all(|s| s != "closed")),
            "a breaker stayed closed through a second with Redis down: {second}"
        );
    }
    // And Redis alone held the limit while healthy.
    assert!(u(s, "/healthy_max_admitted_per_window") <= LIMIT);

    // What was admitted locally reached Redis after it came back.
    assert!(u(s, "/reconcile/reconciled_units") > 0);
    assert_eq!(u(s, "/reconcile/undrained_units"), 0);
    assert!(
        s.pointer("/outage/breakers_closed_after_ms")
            .is_some_and(Value::is_number),
        "the breakers never closed after the heal"
    );

    // No decision waited much past the Redis call deadline.
    assert_eq!(u(s, "/latency/deadline_us"), DEADLINE_MS * 1_000);
    let slowest = u(s, "/latency/max_us");
    assert!(
        slowest <= (DEADLINE_MS + MARGIN_MS) * 1_000,
        "slowest decision {slowest} µs, deadline {DEADLINE_MS} ms + {MARGIN_MS} ms"
    );

    // Both redis-server processes (the killed one and its restart) are gone.
    let first = events
        .iter()
        .find_map(|e| e["event"].as_str().and_then(pid_in))
        .expect("the stop event names the pid");
    let second = u64::from(pid_in(&s["redis"].to_string()).expect("the summary names the pid"));
    assert_eq!(u(s, "/redis_child_pid"), second);
    for pid in [first, second as u32] {
        assert!(
            gone_within(pid, Duration::from_secs(2)),
            "redis-server {pid} still runs"
        );
    }
}

/// One RESP command over a plain TCP connection; the raw reply.
fn redis_raw(addr: std::net::SocketAddr, command: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).expect("connect to redis-server");
    stream
        .set_read_timeout(Some(Duration::from_secs(2)))
        .expect("timeout");
    stream.write_all(command.as_bytes()).expect("send");
    let mut reply = [0u8; 256];
    let n = stream.read(&mut reply).expect("reply");
    String::from_utf8_lossy(&reply[..n]).into_owned()
}

/// With REDIS_URL the demo cannot stop the user's Redis: it cuts a forwarder
/// of its own instead. The outage is handled all the same, and the user's
/// server runs on with its data.
#[test]
fn with_redis_url_the_demo_cuts_a_forwarder_and_leaves_the_server_alone() {
    let server = tierlimit_test::RedisServer::start();
    assert_eq!(redis_raw(server.addr(), "SET canary alive\r\n"), "+OK\r\n");
    let out = tierlimit()
        .env("REDIS_URL", server.url())
        .args(["demo", "--json", "--duration", "6s", "--outage-at", "2s"])
        .args(["--heal-at", "4s"])
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect();
    let events: Vec<&str> = lines.iter().filter_map(|v| v["event"].as_str()).collect();
    assert!(events[0].contains("forwarder"), "{events:?}");
    let s = lines.last().expect("a summary");
    assert_eq!(s["type"], "summary");
    assert!(
        s["redis_child_pid"].is_null(),
        "no redis-server of its own: {s}"
    );
    assert!(u(s, "/outage/windows") >= 1, "{s}");
    assert!(u(s, "/outage/decisions/local/allowed") > 0, "{s}");
    assert!(u(s, "/outage/max_admitted_per_window") <= u(s, "/outage/bound_per_window"));
    assert!(u(s, "/reconcile/reconciled_units") > 0, "{s}");
    assert!(server.is_running() && process_alive(server.pid()));
    assert_eq!(
        redis_raw(server.addr(), "GET canary\r\n"),
        "$5\r\nalive\r\n",
        "the user's data is gone"
    );
}

/// The redis-server the tests run: `TIERLIMIT_REDIS_SERVER`'s, else the one
/// on `PATH`.
fn redis_server_binary() -> std::path::PathBuf {
    if let Some(named) = std::env::var_os("TIERLIMIT_REDIS_SERVER") {
        return named.into();
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join("redis-server"))
        .find(|p| p.is_file())
        .expect("redis-server on PATH or named by TIERLIMIT_REDIS_SERVER (scripts/ensure-redis installs it)")
}

/// With only `dir` on `PATH` and `TIERLIMIT_REDIS_SERVER` naming `server`,
/// the demo starts its redis-server, and Ctrl-C stops both.
fn starts_and_stops_with_only_on_path(dir: &std::path::Path, server: &std::path::Path) {
    let mut demo = tierlimit();
    demo.env("PATH", dir).env("TIERLIMIT_REDIS_SERVER", server);
    let (mut run, pid) = long_demo(demo);
    assert!(process_alive(pid));
    run.signal("INT");
    assert_eq!(run.wait(Duration::from_secs(10)), Some(130));
    assert!(
        gone_within(pid, Duration::from_secs(2)),
        "redis-server {pid} outlived the demo"
    );
}

/// Starts `demo` on a timeline whose outage is far off, for the tests that
/// stop it mid-run, once it names its redis-server: the run and that pid.
fn long_demo(mut demo: std::process::Command) -> (Running, u32) {
    demo.args([
        "demo",
        "--duration",
        "60s",
        "--outage-at",
        "30s",
        "--heal-at",
        "40s",
    ]);
    let run = Running::start(demo);
    let head = run.stdout_until(Duration::from_secs(20), |l| {
        l.contains("started for this demo")
    });
    let pid = head
        .last()
        .and_then(|l| pid_in(l))
        .expect("the Redis line names the pid");
    (run, pid)
}

/// A `setpriv` without `--pdeathsig` (util-linux before 2.33) is passed
/// over: the demo starts its redis-server without it. Regression: it was
/// used whenever found, refused the option, and the server never started.
#[test]
fn a_setpriv_without_pdeathsig_is_passed_over() {
    let server = redis_server_binary();
    let dir = std::env::temp_dir().join(format!("tierlimit-old-setpriv-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("mkdir");
    let fake = dir.join("setpriv");
    std::fs::write(
        &fake,
        "#!/bin/sh\necho \"setpriv: unrecognized option '--pdeathsig'\" >&2\nexit 1\n",
    )
    .expect("write the fake setpriv");
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    starts_and_stops_with_only_on_path(&dir, &server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// At a low rate every limiter is still shut down at the end (it writes
/// back what it owes and leaves the heartbeat group). Regression: the load's
/// tasks were only aborted, and one asleep between two checks (240 ms apart
/// at 50 checks/s) still held its limiter when the demo took them back, so
/// each was dropped without `shutdown`.
#[test]
fn a_low_rate_demo_shuts_every_limiter_down() {
    let out = tierlimit()
        .args(["demo", "--json", "--duration", "4s", "--outage-at", "1s"])
        .args(["--heal-at", "2s", "--rate", "50"])
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("still shared"), "{stderr}");
}

/// Ctrl-C mid-run: the demo stops, says so, exits 130, and its
/// redis-server is gone.
#[test]
fn ctrl_c_stops_the_demo_and_its_redis_server() {
    let (mut run, pid) = long_demo(tierlimit());
    assert!(process_alive(pid));
    // Once the load runs (a first second reported).
    run.stdout_until(Duration::from_secs(20), |l| l.contains("0-1s"));
    run.signal("INT");
    let code = run.wait(Duration::from_secs(10));
    assert_eq!(code, Some(130), "stderr: {:?}", run.rest_of_stderr());
    assert!(
        run.rest_of_stderr()
            .iter()
            .any(|l| l.contains("interrupted")),
        "the demo did not say it was interrupted"
    );
    assert!(
        gone_within(pid, Duration::from_secs(2)),
        "redis-server {pid} outlived the demo"
    );
}

/// SIGKILL, which no cleanup code sees: the kernel kills the redis-server
/// child with the demo (it runs under `setpriv --pdeathsig KILL`).
#[test]
fn a_killed_demo_takes_its_redis_server_with_it() {
    let (mut run, pid) = long_demo(tierlimit());
    run.stdout_until(Duration::from_secs(20), |l| l.contains("0-1s"));
    run.signal("KILL");
    run.wait(Duration::from_secs(5));
    assert!(
        gone_within(pid, Duration::from_secs(5)),
        "redis-server {pid} outlived a killed demo"
    );
    // A killed demo cannot remove its scratch directory: this test does.
    let prefix = format!("tierlimit-demo-{}-", run.child.id());
    if let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) {
        for entry in entries.flatten() {
            if entry.file_name().to_string_lossy().starts_with(&prefix) {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
}

// Regression: `tierlimit demo | head -3` panicked ("failed printing to
// stdout: Broken pipe") at the next line it printed. It now stops, cleans up
// and says why.
#[test]
fn a_closed_stdout_stops_the_demo_without_a_panic() {
    use std::io::{BufRead, BufReader};
    let mut child = tierlimit()
        .args([
            "demo",
            "--duration",
            "30s",
            "--outage-at",
            "10s",
            "--heal-at",
            "20s",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start");
    let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
    let pid = (0..5)
        .filter_map(|_| lines.next().and_then(Result::ok))
        .find_map(|l| {
            l.contains("started for this demo")
                .then(|| pid_in(&l))
                .flatten()
        })
        .expect("the Redis line names the pid");
    drop(lines);
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the demo kept running"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().expect("piped"), &mut stderr)
        .expect("stderr");
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("stdout was closed"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        gone_within(pid, Duration::from_secs(2)),
        "redis-server {pid} outlived the demo"
    );
}

/// Without redis-server on PATH the demo fails at once and says how to
/// install it.
#[test]
fn a_missing_redis_server_is_named_with_how_to_install_it() {
    let empty = std::env::temp_dir().join(format!("tierlimit-empty-path-{}", std::process::id()));
    std::fs::create_dir_all(&empty).expect("mkdir");
    let out = tierlimit()
        .args(["demo", "--json"])
        .env("PATH", &empty)
        .env_remove("TIERLIMIT_REDIS_SERVER")
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    assert!(stderr.contains("redis-server is not on PATH"), "{stderr}");
    assert!(stderr.contains("apt-get install"), "{stderr}");
    // A path that names no program is named back.
    let out = tierlimit()
        .args(["demo", "--json"])
        .env("PATH", &empty)
        .env("TIERLIMIT_REDIS_SERVER", empty.join("redis-server"))
        .output()
        .expect("run");
    let _ = std::fs::remove_dir(&empty);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    assert!(
        stderr.contains("TIERLIMIT_REDIS_SERVER=") && stderr.contains("not an executable"),
        "{stderr}"
    );
}

/// `TIERLIMIT_REDIS_SERVER` names the redis-server to start, as for the
/// tests and `scripts/ensure-redis`, which lets the demo through with it
/// set and none on `PATH`. Regression: the demo looked on `PATH` only, and
/// failed where the script had just said all was well.
#[test]
fn the_demo_starts_the_redis_server_tierlimit_redis_server_names() {
    let server = redis_server_binary();
    let empty = std::env::temp_dir().join(format!("tierlimit-named-server-{}", std::process::id()));
    std::fs::create_dir_all(&empty).expect("mkdir");
    starts_and_stops_with_only_on_path(&empty, &server);
    let _ = std::fs::remove_dir(&empty);
}

/// A timeline that cannot show an outage and a recovery is refused before
/// anything starts.
#[test]
fn a_timeline_out_of_order_is_refused() {
    for (args, says) in [
        (["--outage-at", "5s", "--heal-at", "3s"], "--outage-at"),
        (["--outage-at", "2s", "--heal-at", "30s"], "--heal-at"),
        (["--outage-at", "2", "--heal-at", "5s"], "missing unit"),
    ] {
        let out = tierlimit()
            .arg("demo")
            .args(args)
            .env("PATH", "/nonexistent")
            .output()
            .expect("run");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} accepted");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        assert!(
            !stderr.contains("redis-server is not on PATH"),
            "validated after starting Redis: {stderr}"
        );
    }
}

/// Every subcommand answers --help with examples.
#[test]
fn help_shows_examples() {
    for args in [
        vec!["--help"],
        vec!["demo", "--help"],
        vec!["check", "--help"],
        vec!["load", "--help"],
        vec!["config", "check", "--help"],
    ] {
        let out = tierlimit().args(&args).output().expect("run");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{args:?}");
        assert!(text.contains("Examples:"), "{args:?}: {text}");
    }
}
