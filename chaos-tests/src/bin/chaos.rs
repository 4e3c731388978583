//! The chaos controller:
//! `chaos [--driver process|docker] [--scenario NAME[,NAME..]] [--quick] [--topology single|cluster] [--report-dir DIR] [--name STEM] [--sabotage NAME]`.
//!
//! Runs the scenarios, shows progress, writes `<report-dir>/<STEM>.{json,md,svg}`
//! and exits non-zero when a bound broke, printing one `FAIL` line per bound.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use chaos_tests::driver::{DockerDriver, Driver, ProcessDriver};
use chaos_tests::plan::Sabotage;
use chaos_tests::report::Report;
use chaos_tests::run::{RunConfig, run_scenario};
use chaos_tests::scenario;

struct Args {
    driver: String,
    scenarios: Vec<String>,
    quick: bool,
    report_dir: PathBuf,
    name: String,
    sabotage: Sabotage,
    /// Only the scenarios on one Redis (`single`) or on a cluster (`cluster`).
    topology: Option<bool>,
}

fn parse() -> Result<Args, String> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut a = Args {
        driver: "process".into(),
        scenarios: Vec::new(),
        quick: false,
        report_dir: root.join("report"),
        name: "latest".into(),
        sabotage: Sabotage::None,
        topology: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |what: &str| it.next().ok_or_else(|| format!("{arg} needs {what}"));
        match arg.as_str() {
            "--driver" => a.driver = value("process or docker")?,
            "--scenario" => a
                .scenarios
                .extend(value("a name")?.split(',').map(str::to_string)),
            "--quick" => a.quick = true,
            "--topology" => match value("single or cluster")?.as_str() {
                "single" => a.topology = Some(false),
                "cluster" => a.topology = Some(true),
                other => return Err(format!("unknown topology {other:?} (single or cluster)")),
            },
            "--report-dir" => a.report_dir = PathBuf::from(value("a directory")?),
            "--name" => a.name = value("a file stem")?,
            "--sabotage" => {
                let name = value("a sabotage")?;
                a.sabotage = Sabotage::ALL
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, s)| *s)
                    .ok_or_else(|| {
                        let known: Vec<&str> = Sabotage::ALL.iter().map(|(n, _)| *n).collect();
                        format!("unknown sabotage {name:?} (known: {})", known.join(", "))
                    })?;
            }
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if !matches!(a.driver.as_str(), "process" | "docker") {
        return Err(format!("unknown driver {:?} (process or docker)", a.driver));
    }
    Ok(a)
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("chaos: {e}");
            }
            let sabotages: Vec<&str> = Sabotage::ALL.iter().map(|(n, _)| *n).collect();
            eprintln!(
                "usage: chaos [--driver process|docker] [--scenario NAME[,NAME..]] [--quick] [--topology single|cluster] [--report-dir DIR] [--name STEM] [--sabotage {}]",
                sabotages.join("|")
            );
            eprintln!(
                "scenarios: {}",
                scenario::all(0, 0)
                    .iter()
                    .map(|s| s.name)
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            return ExitCode::from(2);
        }
    };
    let app_bin = std::env::var_os("CHAOS_APP_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            std::env::current_exe()
                .ok()
                .and_then(|p| p.parent().map(|d| d.join("chaos-app")))
                .unwrap_or_else(|| PathBuf::from("chaos-app"))
        });
    let mut driver: Box<dyn Driver> = match args.driver.as_str() {
        "docker" => Box::new(DockerDriver::default()),
        _ => match ProcessDriver::new(app_bin) {
            Ok(d) => Box::new(d),
            Err(e) => {
                eprintln!("chaos: {e}");
                return ExitCode::from(2);
            }
        },
    };
    let cfg = RunConfig {
        quick: args.quick,
        apps: 3,
        deadline_ms: 50,
        work_dir: args.report_dir.join("runs").join(&args.driver),
        lead_ms: if args.driver == "docker" {
            4_000
        } else {
            1_500
        },
        sabotage: args.sabotage,
    };
    let all = scenario::all(cfg.phases().1, cfg.deadline_ms);
    let known: Vec<&str> = all.iter().map(|s| s.name).collect();
    if let Some(bad) = args.scenarios.iter().find(|n| !known.contains(&n.as_str())) {
        eprintln!(
            "chaos: unknown scenario {bad:?}; known: {}",
            known.join(", ")
        );
        return ExitCode::from(2);
    }
    let chosen: Vec<_> = all
        .into_iter()
        .filter(|s| args.scenarios.is_empty() || args.scenarios.iter().any(|n| n == s.name))
        .filter(|s| args.topology.is_none_or(|cluster| s.cluster == cluster))
        .collect();
    if chosen.is_empty() {
        // A run of nothing would report PASS.
        eprintln!("chaos: no scenario is both named and of the topology asked for");
        return ExitCode::from(2);
    }
    let mut report = Report {
        driver: args.driver.clone(),
        quick: args.quick,
        deadline_ms: cfg.deadline_ms,
        unix_time: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        scenarios: Vec::new(),
    };
    let started = Instant::now();
    let n = chosen.len();
    for (i, sc) in chosen.iter().enumerate() {
        println!(
            "[{}/{n}] {:<26} {} ({:.0}s elapsed)",
            i + 1,
            sc.name,
            sc.about,
            started.elapsed().as_secs_f64()
        );
        match run_scenario(driver.as_mut(), sc, &cfg, &mut |line| println!("{line}")) {
            Ok(result) => {
                let verdict = if result.passed() { "PASS" } else { "FAIL" };
                println!("  => {verdict}");
                report.scenarios.push(result);
            }
            Err(e) => {
                eprintln!("chaos: scenario {} could not run: {e}", sc.name);
                return ExitCode::from(2);
            }
        }
    }
    if let Err(e) = report.write(&args.report_dir, &args.name) {
        eprintln!("chaos: writing the report: {e}");
        return ExitCode::from(2);
    }
    let md = args.report_dir.join(format!("{}.md", args.name));
    println!("\nreport: {}", md.display());
    let failures = report.failures();
    for f in &failures {
        println!("{f}");
    }
    let passed = report.scenarios.iter().filter(|s| s.passed()).count();
    println!(
        "{passed} passed, {} failed",
        report.scenarios.len() - passed
    );
    if failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
