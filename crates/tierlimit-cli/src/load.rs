//! `tierlimit load`: sustained load from a config file's rule sets, with a
//! progress line, then throughput and latency percentiles.

use std::fmt::Write as _;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Args;
use serde::Serialize;
use tierlimit::{BreakerState, Config};

use crate::stats::{ByTier, Histogram, Outcomes, TIERS, tier_index};
use crate::{Failure, args};

#[derive(Debug, Args)]
#[command(after_help = "\
Each worker checks as fast as its answers come back (a closed loop), cycling
through the file's rule sets and --keys keys (load:0, load:1, ...). The config
file sets the limiter (deadline, breaker, policies, instances); --redis
replaces its redis.url. Ctrl-C stops early and still prints the results.

Examples:
  tierlimit load --redis redis://127.0.0.1:6380/ --config tierlimit.toml
  tierlimit load --config tierlimit.toml --duration 2m --concurrency 200 --keys 10000 --json")]
pub(crate) struct LoadArgs {
    /// Redis URL, in place of the config file's redis.url.
    #[arg(long, value_name = "URL")]
    redis: Option<String>,
    /// The config file (TOML) with the limiter's settings and rule sets.
    #[arg(long, value_name = "FILE")]
    config: PathBuf,
    /// How long the load runs.
    #[arg(long, default_value = "30s", value_parser = args::duration)]
    duration: Duration,
    /// Checks in flight at once.
    #[arg(long, default_value_t = 50)]
    concurrency: u32,
    /// Distinct keys the load cycles through.
    #[arg(long, default_value_t = 100)]
    keys: u64,
    /// Only this rule set of the file (default: all of them in turn).
    #[arg(long, value_name = "NAME")]
    set: Option<String>,
    /// Print the result as one JSON object (no progress line).
    #[arg(long)]
    json: bool,
}

/// What the workers count as they go, for the progress line.
#[derive(Debug, Default)]
struct Live {
    decisions: [[AtomicU64; 2]; TIERS.len()],
    errors: AtomicU64,
}

impl Live {
    fn snapshot(&self) -> ByTier {
        let mut by = ByTier::default();
        for (i, [a, d]) in self.decisions.iter().enumerate() {
            by.0[i] = Outcomes {
                allowed: a.load(Ordering::Relaxed),
                denied: d.load(Ordering::Relaxed),
            };
        }
        by
    }
}

#[derive(Debug, Serialize)]
struct LoadSummary {
    duration_s: f64,
    concurrency: u32,
    keys: u64,
    rule_sets: Vec<String>,
    checks: u64,
    checks_per_second: f64,
    allowed: u64,
    denied: u64,
    errors: u64,
    decisions: ByTier,
    latency_us: Latency,
    breaker: &'static str,
}

#[derive(Debug, Serialize)]
struct Latency {
    p50: Option<u64>,
    p90: Option<u64>,
    p99: Option<u64>,
    p999: Option<u64>,
    max: Option<u64>,
}

fn breaker_name(s: BreakerState) -> &'static str {
    match s {
        BreakerState::Closed => "closed",
        BreakerState::Open => "open",
        BreakerState::HalfOpen => "half-open",
        _ => "other",
    }
}

fn ms(us: Option<u64>) -> String {
    match us {
        None => "-".to_owned(),
        Some(us) if us < 1_000 => format!("{us}µs"),
        Some(us) => format!("{:.2}ms", us as f64 / 1e3),
    }
}

/// Runs the load until `--duration` passes or `stop` resolves.
pub(crate) async fn run(
    args: LoadArgs,
    stop: impl std::future::Future<Output = ()>,
) -> Result<ExitCode, Failure> {
    if args.concurrency == 0 || args.concurrency > 10_000 {
        return Err(Failure::new(format!(
            "--concurrency must be 1 to 10000 (got {})",
            args.concurrency
        )));
    }
    if args.keys == 0 {
        return Err(Failure::new("--keys must be at least 1"));
    }
    if args.duration.is_zero() {
        return Err(Failure::new("--duration must be more than 0s"));
    }
    let config = Config::load(&args.config).map_err(|e| {
        Failure::new(format!(
            "{} is not a valid config (`tierlimit config check {}` lists the problems):\n{e}",
            args.config.display(),
            args.config.display()
        ))
    })?;
    let sets: Vec<tierlimit::RuleSet> = match &args.set {
        Some(name) => vec![config.rule_set(name).cloned().ok_or_else(|| {
            Failure::new(format!(
                "{} has no rule set `{name}` (it has: {})",
                args.config.display(),
                config
                    .rule_sets()
                    .iter()
                    .map(|s| s.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })?],
        None => config.rule_sets().to_vec(),
    };
    if sets.is_empty() {
        return Err(Failure::new(format!(
            "{} has no [rule_sets.<name>]: the load needs at least one",
            args.config.display()
        )));
    }
    let mut builder = config.builder();
    if let Some(url) = &args.redis {
        builder = builder.redis_url(url.clone());
    }
    let limiter = Arc::new(builder.build()?);
    let sets = Arc::new(sets);
    let live = Arc::new(Live::default());
    let running = Arc::new(AtomicBool::new(true));
    let started = Instant::now();
    // One counter for all workers: checks go round the keys and the sets.
    let next = Arc::new(AtomicU64::new(0));
    let mut workers = Vec::new();
    for _ in 0..args.concurrency {
        let (limiter, sets, live, running, next) = (
            limiter.clone(),
            sets.clone(),
            live.clone(),
            running.clone(),
            next.clone(),
        );
        let keys = args.keys;
        workers.push(tokio::spawn(async move {
            let mut hist = Histogram::new();
            let mut key = String::with_capacity(32);
            while running.load(Ordering::Relaxed) {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let set = &sets[(i % sets.len() as u64) as usize];
                key.clear();
                let _ = write!(key, "load:{}", (i / sets.len() as u64) % keys);
                let t = Instant::now();
                let decided = limiter.check(&key, set, 1).await;
                hist.record(t.elapsed());
                match decided {
                    Ok(d) => {
                        live.decisions[tier_index(d.tier)][usize::from(!d.allowed)]
                            .fetch_add(1, Ordering::Relaxed);
                    }
                    Err(_) => {
                        live.errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            hist
        }));
    }

    let progress = !args.json;
    let tty = std::io::stderr().is_terminal();
    let mut ticks = tokio::time::interval(Duration::from_secs(1));
    ticks.tick().await;
    let end = tokio::time::sleep(args.duration);
    tokio::pin!(end, stop);
    let mut last = 0u64;
    let mut interrupted = false;
    loop {
        tokio::select! {
            () = &mut end => break,
            () = &mut stop => { interrupted = true; break }
            _ = ticks.tick() => {
                if progress {
                    let by = live.snapshot();
                    let total = by.total();
                    let line = format!(
                        "{:>5.0}s / {:.0}s  {} checks ({}/s)  allowed {}  redis {} local {} cache {} fail {}  breaker {}",
                        started.elapsed().as_secs_f64(),
                        args.duration.as_secs_f64(),
                        total,
                        total - last,
                        by.0.iter().map(|o| o.allowed).sum::<u64>(),
                        by.tier("redis").total(),
                        by.tier("local").total(),
                        by.tier("deny_cache").total(),
                        by.tier("fail_open").total() + by.tier("fail_closed").total(),
                        breaker_name(limiter.breaker_state()),
                    );
                    last = total;
                    let mut err = std::io::stderr().lock();
                    if tty {
                        let _ = write!(err, "\r\x1b[2K{line}");
                    } else {
                        let _ = writeln!(err, "{line}");
                    }
                    let _ = err.flush();
                }
            }
        }
    }
    running.store(false, Ordering::Relaxed);
    let elapsed = started.elapsed();
    let mut hist = Histogram::new();
    for w in workers {
        if let Ok(h) = w.await {
            hist.merge(&h);
        }
    }
    if progress && tty {
        eprintln!();
    }
    let breaker = breaker_name(limiter.breaker_state());
    if let Ok(limiter) = Arc::try_unwrap(limiter) {
        let report = limiter.shutdown(Duration::from_secs(5)).await;
        if report.undrained_units > 0 {
            eprintln!(
                "warning: {} units admitted without Redis could not be written back",
                report.undrained_units
            );
        }
    }
    let by = live.snapshot();
    let checks = hist.count();
    let summary = LoadSummary {
        duration_s: elapsed.as_secs_f64(),
        concurrency: args.concurrency,
        keys: args.keys,
        rule_sets: sets.iter().map(|s| s.name().to_owned()).collect(),
        checks,
        checks_per_second: checks as f64 / elapsed.as_secs_f64().max(1e-9),
        allowed: by.0.iter().map(|o| o.allowed).sum(),
        denied: by.0.iter().map(|o| o.denied).sum(),
        errors: live.errors.load(Ordering::Relaxed),
        decisions: by,
        latency_us: Latency {
            p50: hist.quantile(0.5),
            p90: hist.quantile(0.9),
            p99: hist.quantile(0.99),
            p999: hist.quantile(0.999),
            max: hist.max(),
        },
        breaker,
    };
    if args.json {
        let line = serde_json::to_string(&summary)
            .map_err(|e| Failure::new(format!("cannot encode the result: {e}")))?;
        crate::outln!("{line}");
    } else {
        let s = &summary;
        let l = &s.latency_us;
        crate::outln!(
            "{} checks in {:.1} s: {:.0} checks/s with {} in flight ({} keys, rule sets {})",
            s.checks,
            s.duration_s,
            s.checks_per_second,
            s.concurrency,
            s.keys,
            s.rule_sets.join(", ")
        );
        crate::outln!(
            "  allowed {}, denied {}, errors {}; by tier: {}",
            s.allowed,
            s.denied,
            s.errors,
            TIERS
                .iter()
                .map(|t| (t, s.decisions.tier(t).total()))
                .filter(|(_, n)| *n > 0)
                .map(|(t, n)| format!("{t} {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        crate::outln!(
            "  latency p50 {}, p90 {}, p99 {}, p99.9 {}, max {}",
            ms(l.p50),
            ms(l.p90),
            ms(l.p99),
            ms(l.p999),
            ms(l.max)
        );
        crate::outln!("  breaker {} at the end", s.breaker);
    }
    if interrupted {
        eprintln!("interrupted: stopped early");
    }
    Ok(if summary.errors > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}
