//! The chaos suite with the process driver, as `cargo test` runs it: two
//! scenarios pass their bounds, and a deliberately broken limiter fails them
//! with a line that names the broken bound (so the suite can be trusted to catch
//! a regression). `chaos-tests/run.sh --driver process` runs every scenario.

use std::path::PathBuf;

use chaos_tests::driver::ProcessDriver;
use chaos_tests::plan::Sabotage;
use chaos_tests::report::Report;
use chaos_tests::run::{RunConfig, run_scenario};
use chaos_tests::scenario;

fn config(sabotage: Sabotage, tag: &str) -> RunConfig {
    RunConfig {
        quick: true,
        apps: 3,
        deadline_ms: 50,
        work_dir: std::env::temp_dir()
            .join(format!("tierlimit-chaos-{tag}-{}", std::process::id())),
        lead_ms: 1_500,
        sabotage,
    }
}

/// Runs the named scenarios; each must run to a verdict.
fn suite(names: &[&str], sabotage: Sabotage, tag: &str) -> Report {
    let cfg = config(sabotage, tag);
    let mut driver = ProcessDriver::new(PathBuf::from(env!("CARGO_BIN_EXE_chaos-app")))
        .expect("chaos-app is built by cargo test");
    let mut report = Report {
        driver: "process".into(),
        quick: true,
        deadline_ms: cfg.deadline_ms,
        unix_time: 0,
        scenarios: Vec::new(),
    };
    for sc in scenario::all(cfg.phases().1, cfg.deadline_ms)
        .into_iter()
        .filter(|s| names.contains(&s.name))
    {
        let result = run_scenario(&mut driver, &sc, &cfg, &mut |line| println!("{line}"))
            .expect("the scenario runs");
        report.scenarios.push(result);
    }
    let _ = std::fs::remove_dir_all(&cfg.work_dir);
    assert_eq!(report.scenarios.len(), names.len());
    report
}

/// Runs `hang-redis` with `sabotage`, which must stop it with an error that
/// names how an app ended.
fn broken_run(sabotage: Sabotage, tag: &str) -> String {
    let cfg = config(sabotage, tag);
    let mut driver = ProcessDriver::new(PathBuf::from(env!("CARGO_BIN_EXE_chaos-app")))
        .expect("chaos-app is built by cargo test");
    let sc = scenario::all(cfg.phases().1, cfg.deadline_ms)
        .into_iter()
        .find(|s| s.name == "hang-redis")
        .expect("hang-redis");
    let outcome = run_scenario(&mut driver, &sc, &cfg, &mut |line| println!("{line}"));
    let _ = std::fs::remove_dir_all(&cfg.work_dir);
    match outcome {
        Ok(result) => panic!(
            "{sabotage:?} ran to a verdict (passed: {}): the suite did not see the app break",
            result.passed()
        ),
        Err(e) => e,
    }
}

#[test]
fn hang_and_app_loss_keep_every_bound() {
    let _serial = tierlimit_test::serial_blocking();
    let report = suite(
        &["hang-redis", "app-killed-in-reconcile"],
        Sabotage::None,
        "ok",
    );
    println!("{}", report.markdown("none.svg"));
    assert!(
        report.passed(),
        "broken bounds:\n{}",
        report.failures().join("\n")
    );
}

/// Regression guard for the guard: a limiter whose Redis calls have no deadline
/// (60 s instead of 50 ms) must fail the hang scenario on the latency bound.
#[test]
fn a_limiter_without_a_deadline_fails_the_suite() {
    let _serial = tierlimit_test::serial_blocking();
    let report = suite(&["hang-redis"], Sabotage::NoDeadline, "sabotage");
    let failures = report.failures();
    for f in &failures {
        println!("{f}");
    }
    assert!(
        !report.passed(),
        "a limiter without a deadline passed the suite"
    );
    assert!(
        failures
            .iter()
            .any(|f| f
                .starts_with("FAIL hang-redis: every decision within deadline + 15 ms = 65 ms")),
        "no failure names the latency bound: {failures:?}"
    );
}

/// A check that panics stops its load task, which then logs nothing more:
/// the app went on, exited 0, and the decisions it never made were never
/// judged. The app now ends with an error, and the scenario with it.
#[test]
fn a_check_that_panics_fails_the_suite() {
    let _serial = tierlimit_test::serial_blocking();
    let e = broken_run(Sabotage::PanicWithoutRedis, "panic");
    assert!(e.contains("exit status: 1"), "{e}");
}

/// An app that dies by a signal no scenario sent (an abort, the OOM killer)
/// fails the scenario: the process driver took every death by signal for
/// one of its own kills.
#[test]
fn an_app_that_aborts_fails_the_suite() {
    let _serial = tierlimit_test::serial_blocking();
    let e = broken_run(Sabotage::AbortWithoutRedis, "abort");
    assert!(e.contains("signal: 6"), "{e}");
}

/// A selection of no scenario is refused (exit 2), before anything runs or
/// any report is written: it ran nothing and reported PASS, 0 passed and 0
/// failed, with exit 0.
#[test]
fn a_selection_of_no_scenario_is_refused() {
    let name = format!("nothing-{}", std::process::id());
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_chaos"))
        .args(["--driver", "process", "--quick", "--scenario", "kill-redis"])
        .args(["--topology", "cluster", "--name", &name])
        .output()
        .expect("the chaos binary runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("no scenario"), "{stderr}");
    let report = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("report/{name}.md"));
    assert!(!report.exists(), "{} was written", report.display());
}

/// A check that never returns is logged as an error when it passes 10 s,
/// and the errors bound fails the scenario: unlogged, it was judged by no
/// bound, and its app never ended.
#[test]
fn a_check_that_never_returns_fails_the_suite() {
    let _serial = tierlimit_test::serial_blocking();
    let report = suite(&["hang-redis"], Sabotage::HangWithoutRedis, "hang");
    let failures = report.failures();
    assert!(
        !report.passed(),
        "a check that never returned passed the suite"
    );
    assert!(
        failures.iter().any(|f| f.contains("errors")),
        "no failure names the errors: {failures:?}"
    );
}

/// An app whose only runtime thread is blocked never exits: the run gives up
/// on it once its plan's worst case has passed, instead of waiting for ever
/// (CI would hang until its own limit and report nothing).
#[test]
fn an_app_that_never_exits_fails_the_suite_in_bounded_time() {
    let started = std::time::Instant::now();
    let e = broken_run(Sabotage::BlockWithoutRedis, "block");
    assert!(e.contains("did not exit by itself in time"), "{e}");
    // hang-redis quick: 1.5 s lead, a 6 s load, then HUNG_CHECK (10 s), the
    // drain (10 s) and EXIT_GRACE (15 s): about 43 s, then the kill.
    let took = started.elapsed();
    assert!(
        took < std::time::Duration::from_secs(120),
        "gave up after {took:?}"
    );
}
