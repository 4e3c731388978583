//! `tierlimit demo`: what tierlimit is for, in one command.
//!
//! Several [`HybridLimiter`]s in this process (one per simulated instance, all
//! in one group, so the heartbeat teaches each that they are N) check one key
//! under steady load. Redis is taken away and given back on a timeline; the
//! view shows each second's decisions by tier, the breakers, latency and what
//! was admitted against the global limit, and the summary says what the
//! outage cost.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Args;
use serde::Serialize;
use tierlimit::{
    Algorithm, BreakerState, HybridLimiter, Instances, Policy, ReconcileStats, Rule, RuleSet,
    RuleState,
};
use tokio::task::JoinHandle;

use crate::Failure;
use crate::redis_child::{Forwarder, RedisChild, UserUrl, redact};
use crate::stats::{ByTier, Histogram, Stats, TIERS};
use crate::{args, metrics_http};

/// Load workers per instance.
const WORKERS_PER_INSTANCE: u64 = 4;
/// The per-second report waits this long past each window's end (plus the
/// deadline), so checks still in flight at the boundary are counted.
const REPORT_GRACE: Duration = Duration::from_millis(100);
/// How long the instances may take to learn their count from the heartbeat.
const LEARN_TIMEOUT: Duration = Duration::from_secs(15);
/// How long the reconcilers may take to write the outage back after the load.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Args)]
#[command(after_help = "\
Timeline (defaults): load for 20 s; Redis is stopped at 5 s and back at 12 s.

Redis: with REDIS_URL unset, the demo starts its own redis-server on a free
loopback port (never 6379), kills it (SIGKILL) at --outage-at and restarts it
empty on the same port at --heal-at, as a crashed Redis without persistence
comes back. With REDIS_URL=redis://... it cannot stop your Redis: it puts a TCP
forwarder of its own in front of it and cuts every connection through it
instead (your data stays). Everything it started is stopped on every exit,
Ctrl-C included.

The rule set: one key, LIMIT per second (fixed window, so each row's
\"admitted\" is exactly one window) AND LIMIT x 100 per hour (GCRA), policy
LocalFallback. During the outage each instance admits its share,
ceil(LIMIT / instances), so the fleet admits at most LIMIT + instances per
window; what it admitted is written back to Redis once it is healthy.

Examples:
  tierlimit demo
  tierlimit demo --json > run.jsonl
  tierlimit demo --duration 8s --outage-at 2s --heal-at 5s
  REDIS_URL=redis://127.0.0.1:6380/ tierlimit demo --metrics 127.0.0.1:9000")]
pub(crate) struct DemoArgs {
    /// How long the load runs (whole seconds shown).
    #[arg(long, default_value = "20s", value_parser = args::duration)]
    duration: Duration,
    /// When Redis is stopped, from the start of the load.
    #[arg(long, default_value = "5s", value_parser = args::duration)]
    outage_at: Duration,
    /// When Redis comes back, from the start of the load.
    #[arg(long, default_value = "12s", value_parser = args::duration)]
    heal_at: Duration,
    /// The global limit per second of the demo's key.
    #[arg(long, default_value_t = 200)]
    limit: u64,
    /// Checks per second offered, over all instances.
    #[arg(long, default_value_t = 600)]
    rate: u64,
    /// Limiter instances sharing the limit.
    #[arg(long, default_value_t = 3)]
    instances: u64,
    /// Deadline of every Redis call.
    #[arg(long, default_value = "50ms", value_parser = args::duration)]
    deadline: Duration,
    /// Machine-readable output: one JSON object per line (events, seconds, summary).
    #[arg(long)]
    json: bool,
    /// Serve Prometheus metrics at http://ADDR/metrics while the demo runs.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<SocketAddr>,
}

impl DemoArgs {
    fn validate(&self) -> Result<(), Failure> {
        let bad = |what: String| Err(Failure::new(what));
        if self.duration < Duration::from_secs(1) || self.duration > Duration::from_secs(3_600) {
            return bad(format!(
                "--duration must be 1s to 1h (got {:?})",
                self.duration
            ));
        }
        if self.outage_at.is_zero() || self.outage_at >= self.heal_at {
            return bad(format!(
                "--outage-at must be after the start and before --heal-at (got {:?} and {:?})",
                self.outage_at, self.heal_at
            ));
        }
        if self.heal_at >= self.duration {
            return bad(format!(
                "--heal-at must be before the end (--duration {:?}), so the view shows the recovery (got {:?})",
                self.duration, self.heal_at
            ));
        }
        if !(1..=1_000_000).contains(&self.limit) {
            return bad(format!("--limit must be 1 to 1000000 (got {})", self.limit));
        }
        if !(1..=100_000).contains(&self.rate) {
            return bad(format!("--rate must be 1 to 100000 (got {})", self.rate));
        }
        if !(1..=16).contains(&self.instances) {
            return bad(format!(
                "--instances must be 1 to 16 (got {})",
                self.instances
            ));
        }
        if self.deadline < Duration::from_millis(1) || self.deadline > Duration::from_secs(10) {
            return bad(format!(
                "--deadline must be 1ms to 10s (got {:?})",
                self.deadline
            ));
        }
        Ok(())
    }
}

/// Where the demo's Redis comes from, and how it is taken away.
#[derive(Debug)]
enum DemoRedis {
    Child(RedisChild),
    Forwarded {
        forwarder: Forwarder,
        user_url: String,
        url: String,
    },
}

impl DemoRedis {
    async fn start() -> Result<DemoRedis, Failure> {
        match std::env::var("REDIS_URL") {
            Ok(url) if !url.trim().is_empty() => {
                let parsed = UserUrl::parse(url.trim())?;
                let forwarder = Forwarder::start(parsed.upstream.clone()).await?;
                Ok(DemoRedis::Forwarded {
                    url: parsed.through(forwarder.addr()),
                    forwarder,
                    user_url: redact(url.trim()),
                })
            }
            _ => Ok(DemoRedis::Child(RedisChild::start().await?)),
        }
    }

    fn url(&self) -> String {
        match self {
            DemoRedis::Child(child) => child.url(),
            DemoRedis::Forwarded { url, .. } => url.clone(),
        }
    }

    fn describe(&self) -> String {
        match self {
            DemoRedis::Child(child) => format!(
                "redis-server pid {} on 127.0.0.1:{}, started for this demo",
                child.pid().unwrap_or(0),
                child.port()
            ),
            DemoRedis::Forwarded {
                forwarder,
                user_url,
                ..
            } => format!(
                "REDIS_URL {user_url} through a forwarder on {}",
                forwarder.addr()
            ),
        }
    }

    /// How the outage is made, for the timeline line.
    fn outage(&self) -> &'static str {
        match self {
            DemoRedis::Child(_) => {
                "killed (SIGKILL) at {stop}, restarted empty on its port at {heal}"
            }
            DemoRedis::Forwarded { .. } => {
                "cut off at {stop} (every connection through the forwarder closed; your Redis and its data stay), let through again at {heal}"
            }
        }
    }

    fn child_pid(&self) -> Option<u32> {
        match self {
            DemoRedis::Child(child) => child.pid(),
            DemoRedis::Forwarded { .. } => None,
        }
    }

    fn stop(&mut self) -> String {
        match self {
            DemoRedis::Child(child) => {
                let pid = child.pid().unwrap_or(0);
                child.kill();
                format!("Redis stopped: redis-server (pid {pid}) killed with SIGKILL")
            }
            DemoRedis::Forwarded { forwarder, .. } => {
                forwarder.cut();
                "Redis cut off: every connection through the forwarder closed".to_owned()
            }
        }
    }

    async fn heal(&mut self) -> Result<String, Failure> {
        match self {
            DemoRedis::Child(child) => {
                child.restart().await?;
                Ok(format!(
                    "Redis back: redis-server restarted empty (pid {}, same port)",
                    child.pid().unwrap_or(0)
                ))
            }
            DemoRedis::Forwarded { forwarder, .. } => {
                forwarder.heal();
                Ok("Redis back: the forwarder lets connections through again".to_owned())
            }
        }
    }
}

/// Aborts a task when dropped, so an early return or Ctrl-C leaves none behind.
#[derive(Debug)]
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl AbortOnDrop {
    /// Aborts the task and waits until it is gone, with what it held.
    async fn stop(mut self) {
        self.0.abort();
        let _ = (&mut self.0).await;
    }
}

/// Output: a view for people, or JSON lines for machines (progress notes
/// then go to stderr, so stdout holds JSON only).
#[derive(Debug, Clone, Copy)]
struct Out {
    json: bool,
}

impl Out {
    fn note(&self, text: &str) {
        if self.json {
            eprintln!("{text}");
        } else {
            crate::outln!("{text}");
        }
    }

    fn event(&self, t: f64, text: &str) {
        if self.json {
            self.json_line(&serde_json::json!({"type": "event", "t": round3(t), "event": text}));
        } else {
            crate::outln!("  -- {t:6.2}s  {text}");
        }
    }

    fn json_line(&self, value: &impl Serialize) {
        match serde_json::to_string(value) {
            Ok(line) => crate::print_line(&line),
            Err(e) => eprintln!("cannot encode a JSON line: {e}"),
        }
    }
}

fn round3(x: f64) -> f64 {
    (x * 1_000.0).round() / 1_000.0
}

fn unix_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// When Redis was taken away and given back, as both clocks see it.
#[derive(Debug, Default, Clone, Copy)]
struct Marks {
    /// Unix µs once the stop was done (Redis unreachable from then on).
    stopped_us: Option<u64>,
    stopped: Option<Instant>,
    /// Unix µs when the heal began (Redis unreachable until at least then).
    healing_us: Option<u64>,
    /// Once the restarted Redis answered.
    healed: Option<Instant>,
    /// First time an instance's breaker left Closed after the stop.
    first_open: Option<Instant>,
    /// First time every breaker was Closed again after the heal.
    all_closed: Option<Instant>,
}

/// Whether Redis was reachable during a window `[start, end)` (unix µs).
fn redis_during(marks: &Marks, start: u64, end: u64) -> &'static str {
    let down_from = marks.stopped_us.unwrap_or(u64::MAX);
    let down_until = marks.healing_us.unwrap_or(u64::MAX);
    if start >= down_from && end <= down_until {
        "down"
    } else if end <= down_from || (marks.healing_us.is_some() && start >= down_until) {
        "up"
    } else {
        "partial"
    }
}

fn state_letter(state: BreakerState) -> &'static str {
    match state {
        BreakerState::Closed => "closed",
        BreakerState::Open => "open",
        BreakerState::HalfOpen => "half_open",
        _ => "other",
    }
}

/// The limiters as they stand at a window's end.
#[derive(Debug, Default)]
struct Snapshot {
    breakers: Vec<&'static str>,
    instances: Vec<Option<u64>>,
    ledger_units: u64,
    reconciled_units: u64,
}

impl Snapshot {
    fn of(limiters: &[Arc<HybridLimiter>]) -> Snapshot {
        let mut s = Snapshot::default();
        for l in limiters {
            s.breakers.push(state_letter(l.breaker_state()));
            s.instances.push(l.instances());
            let r: ReconcileStats = l.reconcile_stats();
            s.ledger_units += r.pending_units;
            s.reconciled_units += r.reconciled_units;
        }
        s
    }
}

/// One second of the live view.
#[derive(Debug, Serialize)]
struct SecondRow {
    r#type: &'static str,
    /// Seconds since the load started, at the start of this window.
    t: u64,
    /// The window's start, unix seconds.
    window: u64,
    /// Redis during this window: up, down (all of it) or partial.
    redis: &'static str,
    decisions: ByTier,
    total: u64,
    /// Each instance's breaker at the window's end.
    breakers: Vec<&'static str>,
    /// Each instance's count of instances at the window's end.
    instances: Vec<Option<u64>>,
    p99_us: Option<u64>,
    max_us: Option<u64>,
    /// Units admitted in this window, by every instance together.
    admitted: u64,
    limit: u64,
    /// At the window's end: units admitted without Redis, not yet written
    /// back (all instances).
    ledger_units: u64,
    /// At the window's end: units written back to Redis so far (all instances).
    reconciled_units: u64,
}

/// What the demo shows at the end.
#[derive(Debug, Serialize)]
struct Summary {
    r#type: &'static str,
    redis: String,
    /// The pid of the redis-server this run started (gone when the demo exits).
    redis_child_pid: Option<u32>,
    instances: u64,
    instances_learned: Vec<Option<u64>>,
    limit_per_second: u64,
    limit_per_hour: u64,
    duration_s: f64,
    outage_at_s: f64,
    heal_at_s: f64,
    decisions: ByTier,
    total_decisions: u64,
    errors: u64,
    outage: OutageSummary,
    /// The most admitted in one window while Redis was up all through it.
    healthy_max_admitted_per_window: u64,
    reconcile: ReconcileSummary,
    latency: LatencySummary,
}

#[derive(Debug, Serialize)]
struct OutageSummary {
    /// Whole windows during which Redis was down all along.
    windows: u64,
    /// Decisions in those windows, by tier.
    decisions: ByTier,
    total_decisions: u64,
    /// Units admitted in those windows.
    admitted: u64,
    /// The limit over those windows (`limit_per_second` x `windows`).
    limit_total: u64,
    max_admitted_per_window: u64,
    /// What the shares promise per window: `limit + instances`.
    bound_per_window: u64,
    /// Windows Redis was down for part of: t and admitted.
    partial_windows: Vec<(u64, u64)>,
    /// From the stop to the first breaker leaving Closed.
    breaker_opened_after_ms: Option<f64>,
    /// From Redis answering again to every breaker Closed.
    breakers_closed_after_ms: Option<f64>,
}

#[derive(Debug, Serialize)]
struct ReconcileSummary {
    /// Units written back to Redis by the reconcilers after Redis came back.
    reconciled_units: u64,
    /// Units whose window had passed before they could be written (they
    /// can no longer change a decision: the per-second rule's, mostly).
    expired_units: u64,
    /// Units still owed when the drain wait ended.
    pending_units: u64,
    /// How long after the load ended the ledgers were empty.
    drained_after_ms: Option<f64>,
    /// Units written back by `shutdown` (what the drain had not reached).
    written_back_at_shutdown: u64,
    /// Units lost at shutdown (0 when everything was written back).
    undrained_units: u64,
}

#[derive(Debug, Serialize)]
struct LatencySummary {
    checks: u64,
    /// Percentiles within 1.6 % (a [`Histogram`]'s buckets).
    p50_us: Option<u64>,
    p99_us: Option<u64>,
    p999_us: Option<u64>,
    /// The slowest decision, exactly.
    max_us: Option<u64>,
    deadline_us: u64,
}

/// Runs the demo.
pub(crate) async fn run(args: DemoArgs) -> Result<(), Failure> {
    args.validate()?;
    let out = Out { json: args.json };

    // The recorder goes first: the limiters take their counters from the
    // recorder installed when they first count.
    let prometheus = match args.metrics {
        Some(addr) => Some(metrics_http::install()?).map(|h| (addr, h)),
        None => None,
    };
    let _metrics_server = match prometheus {
        Some((addr, handle)) => {
            let (bound, task) = metrics_http::serve(addr, handle).await?;
            out.note(&format!("Prometheus metrics: http://{bound}/metrics"));
            Some(AbortOnDrop(task))
        }
        None => None,
    };

    let n = args.instances;
    let limit = args.limit;
    let hour_limit = limit.saturating_mul(100);
    out.note(&format!(
        "tierlimit demo: {n} limiter instances in one group, one key, policy LocalFallback"
    ));
    out.note(&format!(
        "rule set `demo`: {limit}/s (fixed window) AND {hour_limit}/h (GCRA)"
    ));
    let mut redis = DemoRedis::start().await?;
    out.note(&format!("Redis: {}", redis.describe()));
    out.note(&format!(
        "load: {} checks/s for {:.0} s; Redis call deadline {:?}",
        args.rate,
        args.duration.as_secs_f64().ceil(),
        args.deadline
    ));
    out.note(&format!(
        "outage: Redis {}",
        redis
            .outage()
            .replace("{stop}", &format!("{:.1} s", args.outage_at.as_secs_f64()))
            .replace("{heal}", &format!("{:.1} s", args.heal_at.as_secs_f64()))
    ));

    let run_id = format!("{:08x}", fastrand::u32(..));
    let names: Vec<String> = (1..=n).map(|i| format!("demo-{i}")).collect();
    let breaker = {
        let mut b = args::breaker_for(args.deadline);
        // The default backoff reaches 5 s between probes: a healed Redis would
        // wait up to that long to be used again. The demo shows the recovery.
        b.max_cool_down = Duration::from_secs(1);
        b
    };
    let mut limiters = Vec::new();
    for name in &names {
        let limiter = HybridLimiter::builder()
            .redis_url(redis.url())
            .deadline(args.deadline)
            .default_policy(Policy::LocalFallback)
            .instances(Instances::Learned { assume: None })
            .group(format!("demo-{run_id}"))
            .name(name.clone())
            .heartbeat_every(Duration::from_millis(200))
            .prune_every(Duration::from_secs(1))
            .breaker(breaker.clone())
            .build()?;
        limiters.push(Arc::new(limiter));
    }
    let set = Arc::new(
        RuleSet::new(
            "demo",
            [
                Rule::new(limit, Duration::from_secs(1), Algorithm::FixedWindow)?,
                Rule::per_hour(hour_limit)?,
            ],
        )?
        .with_policy(Policy::LocalFallback),
    );
    let key: Arc<str> = Arc::from(format!("demo:{run_id}"));

    out.note(&format!(
        "waiting for the {n} instances to learn from the heartbeat that they are {n}..."
    ));
    let learn_started = Instant::now();
    loop {
        let learned: Vec<Option<u64>> = limiters.iter().map(|l| l.instances()).collect();
        if learned.iter().all(|c| *c == Some(n))
            && limiters
                .iter()
                .all(|l| l.breaker_state() == BreakerState::Closed)
        {
            out.note(&format!(
                "every instance counts {n} instances ({:.1} s); the load starts on the next second",
                learn_started.elapsed().as_secs_f64()
            ));
            break;
        }
        if learn_started.elapsed() > LEARN_TIMEOUT {
            return Err(Failure::new(format!(
                "the instances did not learn their count within {LEARN_TIMEOUT:?} (they count {learned:?}): is Redis at {} answering?",
                redact(&redis.url())
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The load starts on a whole unix second, so each reported second is
    // exactly one window of the fixed-window rule.
    let now_us = unix_us();
    let now = Instant::now();
    let t0_unix = now_us / 1_000_000 + 1;
    let t0 = now + Duration::from_micros(t0_unix * 1_000_000 - now_us);
    let seconds = args.duration.as_secs_f64().ceil() as u64;

    let stats = Arc::new(Stats::default());
    let running = Arc::new(AtomicBool::new(true));
    let marks = Arc::new(Mutex::new(Marks::default()));
    let workers_total = n * WORKERS_PER_INSTANCE;
    let every = Duration::from_secs_f64(workers_total as f64 / args.rate as f64);
    let mut workers = Vec::new();
    for w in 0..workers_total {
        let limiter = limiters[(w % n) as usize].clone();
        let (set, key, stats, running) = (set.clone(), key.clone(), stats.clone(), running.clone());
        // Spread the workers' ticks over one period.
        let start = t0 + every.mul_f64(w as f64 / workers_total as f64);
        workers.push(AbortOnDrop(tokio::spawn(async move {
            let mut ticks = tokio::time::interval_at(start.into(), every);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut rules: Vec<RuleState> = Vec::with_capacity(2);
            while running.load(Ordering::Relaxed) {
                ticks.tick().await;
                if !running.load(Ordering::Relaxed) {
                    break;
                }
                let started_us = unix_us();
                let started = Instant::now();
                let decided = limiter.check_with_rules(&key, &set, 1, &mut rules).await;
                let latency = started.elapsed();
                match decided {
                    Ok(d) => {
                        let admitted_in = d.allowed.then(|| window_of(started_us, rules.first()));
                        let started_in = started_us / 1_000_000;
                        stats.record(started_in, d.tier, d.allowed, latency, admitted_in);
                    }
                    Err(_) => stats.error(),
                }
            }
        })));
    }

    // Watches the breakers closely, for the summary's open and close times.
    let watcher = {
        let (limiters, marks, running) = (limiters.clone(), marks.clone(), running.clone());
        AbortOnDrop(tokio::spawn(async move {
            while running.load(Ordering::Relaxed) {
                let states: Vec<BreakerState> =
                    limiters.iter().map(|l| l.breaker_state()).collect();
                let now = Instant::now();
                {
                    let mut m = marks.lock().unwrap_or_else(|p| p.into_inner());
                    if m.stopped.is_some()
                        && m.first_open.is_none()
                        && states.iter().any(|s| *s != BreakerState::Closed)
                    {
                        m.first_open = Some(now);
                    }
                    if m.healed.is_some()
                        && m.all_closed.is_none()
                        && states.iter().all(|s| *s == BreakerState::Closed)
                    {
                        m.all_closed = Some(now);
                    }
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }))
    };

    if !out.json {
        show_header(n);
    }

    // The timeline: stop, heal, end, and a report after each window.
    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Step {
        Stop,
        Heal,
        End,
        /// Reads the breakers at a window's end, for its report.
        Snapshot,
        Report(u64),
    }
    // Snapshots first: at the same instant as a stop, the breakers are read
    // before it (the sort below keeps this order).
    let mut steps: Vec<(Duration, Step)> = (1..=seconds)
        .map(|k| (Duration::from_secs(k), Step::Snapshot))
        .collect();
    steps.extend([
        (args.outage_at, Step::Stop),
        (args.heal_at, Step::Heal),
        (Duration::from_secs(seconds), Step::End),
    ]);
    let grace = REPORT_GRACE + args.deadline;
    steps.extend((1..=seconds).map(|k| (Duration::from_secs(k) + grace, Step::Report(k))));
    steps.sort_by_key(|(at, _)| *at);

    let mut rows: Vec<SecondRow> = Vec::new();
    let mut snapshots = std::collections::VecDeque::new();
    let mut all_latencies = Histogram::new();
    for (at, step) in steps {
        tokio::time::sleep_until((t0 + at).into()).await;
        if crate::stdout_gone() {
            // Dropping what this run started (limiters, redis-server) on the way out.
            return Err(Failure::new("stdout was closed: the demo stopped"));
        }
        let t = t0.elapsed().as_secs_f64();
        match step {
            Step::Stop => {
                let what = redis.stop();
                let mut m = marks.lock().unwrap_or_else(|p| p.into_inner());
                m.stopped_us = Some(unix_us());
                m.stopped = Some(Instant::now());
                drop(m);
                out.event(t, &what);
            }
            Step::Heal => {
                marks.lock().unwrap_or_else(|p| p.into_inner()).healing_us = Some(unix_us());
                let what = redis.heal().await?;
                marks.lock().unwrap_or_else(|p| p.into_inner()).healed = Some(Instant::now());
                out.event(t0.elapsed().as_secs_f64(), &what);
            }
            Step::End => running.store(false, Ordering::Relaxed),
            Step::Snapshot => snapshots.push_back(Snapshot::of(&limiters)),
            Step::Report(k) => {
                let window = t0_unix + k - 1;
                let taken = stats.take(window);
                let snapshot = snapshots.pop_front().unwrap_or_default();
                let m = *marks.lock().unwrap_or_else(|p| p.into_inner());
                let row = SecondRow {
                    r#type: "second",
                    t: k - 1,
                    window,
                    redis: redis_during(&m, window * 1_000_000, (window + 1) * 1_000_000),
                    total: taken.decisions.total(),
                    decisions: taken.decisions,
                    breakers: snapshot.breakers,
                    instances: snapshot.instances,
                    p99_us: taken.latencies.quantile(0.99),
                    max_us: taken.latencies.max(),
                    admitted: taken.admitted,
                    limit,
                    ledger_units: snapshot.ledger_units,
                    reconciled_units: snapshot.reconciled_units,
                };
                show_row(&out, &row, limit + n);
                all_latencies.merge(&taken.latencies);
                rows.push(row);
            }
        }
    }
    // Stopped and gone before the limiters shut down, each of which must
    // then be held here alone: an aborted task asleep between two checks
    // (a low --rate) still held its limiter when only dropped.
    for worker in workers {
        worker.stop().await;
    }
    watcher.stop().await;

    // Let the reconcilers finish writing the outage back.
    let load_ended = Instant::now();
    let drained_after = loop {
        let pending: u64 = limiters
            .iter()
            .map(|l| l.reconcile_stats().pending_units)
            .sum();
        if pending == 0 {
            break Some(load_ended.elapsed());
        }
        if load_ended.elapsed() > DRAIN_TIMEOUT {
            out.note(&format!(
                "{pending} units still owed to Redis after {DRAIN_TIMEOUT:?}; shutdown tries once more"
            ));
            break None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let mut reconcile = ReconcileSummary {
        reconciled_units: 0,
        expired_units: 0,
        pending_units: 0,
        drained_after_ms: drained_after.map(|d| round3(d.as_secs_f64() * 1e3)),
        written_back_at_shutdown: 0,
        undrained_units: 0,
    };
    for l in &limiters {
        let s = l.reconcile_stats();
        reconcile.reconciled_units += s.reconciled_units;
        reconcile.expired_units += s.expired_units;
        reconcile.pending_units += s.pending_units;
    }
    let instances_learned: Vec<Option<u64>> = limiters.iter().map(|l| l.instances()).collect();
    for limiter in limiters {
        match Arc::try_unwrap(limiter) {
            Ok(limiter) => {
                let report = limiter.shutdown(Duration::from_secs(2)).await;
                reconcile.written_back_at_shutdown += report.written_back_units;
                reconcile.undrained_units += report.undrained_units;
            }
            Err(_) => out.note("a limiter was still shared at the end; dropped without shutdown"),
        }
    }
    let redis_description = redis.describe();
    let redis_child_pid = redis.child_pid();
    drop(redis);

    let marks = *marks.lock().unwrap_or_else(|p| p.into_inner());
    let mut decisions = ByTier::default();
    let mut outage_decisions = ByTier::default();
    let (mut windows, mut admitted, mut max_admitted, mut healthy_max) = (0, 0, 0, 0);
    let mut partial = Vec::new();
    for row in &rows {
        decisions.add(&row.decisions);
        match row.redis {
            "down" => {
                windows += 1;
                outage_decisions.add(&row.decisions);
                admitted += row.admitted;
                max_admitted = max_admitted.max(row.admitted);
            }
            "partial" => partial.push((row.t, row.admitted)),
            _ => healthy_max = healthy_max.max(row.admitted),
        }
    }
    let ms_between = |from: Option<Instant>, to: Option<Instant>| match (from, to) {
        (Some(a), Some(b)) => Some(round3(b.saturating_duration_since(a).as_secs_f64() * 1e3)),
        _ => None,
    };
    let summary = Summary {
        r#type: "summary",
        redis: redis_description,
        redis_child_pid,
        instances: n,
        instances_learned,
        limit_per_second: limit,
        limit_per_hour: hour_limit,
        duration_s: seconds as f64,
        outage_at_s: args.outage_at.as_secs_f64(),
        heal_at_s: args.heal_at.as_secs_f64(),
        total_decisions: decisions.total(),
        decisions,
        errors: stats.errors(),
        outage: OutageSummary {
            windows,
            total_decisions: outage_decisions.total(),
            decisions: outage_decisions,
            admitted,
            limit_total: limit * windows,
            max_admitted_per_window: max_admitted,
            bound_per_window: limit + n,
            partial_windows: partial,
            breaker_opened_after_ms: ms_between(marks.stopped, marks.first_open),
            breakers_closed_after_ms: ms_between(marks.healed, marks.all_closed),
        },
        healthy_max_admitted_per_window: healthy_max,
        reconcile,
        latency: LatencySummary {
            checks: all_latencies.count(),
            p50_us: all_latencies.quantile(0.5),
            p99_us: all_latencies.quantile(0.99),
            p999_us: all_latencies.quantile(0.999),
            max_us: all_latencies.max(),
            deadline_us: u64::try_from(args.deadline.as_micros()).unwrap_or(u64::MAX),
        },
    };
    if out.json {
        out.json_line(&summary);
    } else {
        show_summary(&summary);
    }
    Ok(())
}

/// The unix second starting the window an admitted unit counts in: the
/// fixed-window rule's state says when its window ends (`reset_after` from
/// the moment the tier decided, which is at most a deadline after `started`),
/// so rounding `started + reset_after` to the second finds the window's end
/// even when the check crossed a boundary. Without a state (a tier that
/// reports none), the second the check started in.
fn window_of(started_us: u64, per_second_rule: Option<&RuleState>) -> u64 {
    match per_second_rule {
        Some(state) => {
            let reset_us = u64::try_from(state.reset_after.as_micros()).unwrap_or(0);
            let end = (started_us + reset_us + 500_000) / 1_000_000;
            end.saturating_sub(1)
        }
        None => started_us / 1_000_000,
    }
}

fn ms(us: Option<u64>) -> String {
    match us {
        Some(us) if us >= 10_000 => format!("{:.0}ms", us as f64 / 1e3),
        Some(us) if us >= 1_000 => format!("{:.2}ms", us as f64 / 1e3),
        Some(us) => format!("{us}µs"),
        None => "-".to_owned(),
    }
}

/// The column widths of the live view; the header and the rows share them.
fn view_line(cells: [&str; 13], instances: usize) -> String {
    let [t, redis, r, l, c, f, b, p99, max, admit, limit, owed, rec] = cells;
    let w = (2 * instances).max(9) + 1;
    format!(
        "{t:>7} {redis:<6}|{r:>7} {l:>6} {c:>6} {f:>5} |{b:<w$}|{p99:>8} {max:>8} |{admit:>6} /{limit:<6}|{owed:>6} {rec:>7}"
    )
}

fn show_header(n: u64) {
    crate::outln!();
    crate::outln!(
        "{}",
        view_line(
            [
                "second",
                "redis",
                "redis",
                "local",
                "cache",
                "fail",
                " breakers",
                "p99",
                "max",
                "admit",
                "limit",
                "owed",
                "reconc."
            ],
            n as usize
        )
    );
}

fn show_row(out: &Out, row: &SecondRow, bound: u64) {
    if out.json {
        out.json_line(row);
        return;
    }
    let d = &row.decisions;
    let fail =
        d.tier("fail_open").total() + d.tier("fail_closed").total() + d.tier("other").total();
    let breakers: String = row
        .breakers
        .iter()
        .map(|b| match *b {
            "closed" => " C",
            "open" => " O",
            "half_open" => " H",
            _ => " ?",
        })
        .collect();
    let redis = match row.redis {
        "up" => " up",
        "down" => " DOWN",
        _ => " part",
    };
    let line = view_line(
        [
            &format!("{}-{}s", row.t, row.t + 1),
            redis,
            &d.tier("redis").total().to_string(),
            &d.tier("local").total().to_string(),
            &d.tier("deny_cache").total().to_string(),
            &fail.to_string(),
            &breakers,
            &ms(row.p99_us),
            &ms(row.max_us),
            &row.admitted.to_string(),
            &row.limit.to_string(),
            &row.ledger_units.to_string(),
            &row.reconciled_units.to_string(),
        ],
        row.breakers.len(),
    );
    let mark = if row.admitted > bound {
        " <- over limit + instances"
    } else {
        ""
    };
    crate::outln!("{line}{mark}");
}

fn show_summary(s: &Summary) {
    let o = &s.outage;
    let r = &s.reconcile;
    let l = &s.latency;
    let legend = [
        "Legend: redis / local / cache / fail: decisions per tier that second (cache: a cached",
        "  Redis denial; fail: fail-open or fail-closed answers). Breakers at the second's end:",
        "  C closed, O open, H half-open. admit: units admitted that second by all instances",
        "  together; while Redis is down each instance admits its share of the limit, rounded up,",
        "  so up to limit + instances. owed: admitted without Redis, not yet written back;",
        "  reconc.: written back so far. Each row prints once its second is over.",
    ];
    crate::outln!();
    for line in legend {
        crate::outln!("{line}");
    }
    let tiers: Vec<String> = TIERS
        .iter()
        .map(|t| (*t, s.decisions.tier(t)))
        .filter(|(_, o)| o.total() > 0)
        .map(|(t, o)| match o.allowed {
            0 => format!("{t} {}", o.total()),
            a => format!("{t} {} ({a} allowed)", o.total()),
        })
        .collect();
    let after = |x: Option<f64>| x.map_or_else(|| "never".to_owned(), |ms| format!("{ms:.0} ms"));
    crate::outln!();
    crate::outln!("Summary");
    crate::outln!(
        "  decisions   {} in {:.0} s: {}",
        s.total_decisions,
        s.duration_s,
        tiers.join(", ")
    );
    if s.errors > 0 {
        crate::outln!("  errors      {} checks returned an error", s.errors);
    }
    crate::outln!(
        "  outage      {} whole seconds with Redis down: {} decisions, {} by the local tier,",
        o.windows,
        o.total_decisions,
        o.decisions.tier("local").total()
    );
    crate::outln!(
        "              {} fail-closed; breakers opened {} after the stop",
        o.decisions.tier("fail_closed").total(),
        after(o.breaker_opened_after_ms)
    );
    crate::outln!(
        "  admitted    {} in those seconds against a limit of {} ({} x {}/s);",
        o.admitted,
        o.limit_total,
        o.windows,
        s.limit_per_second
    );
    crate::outln!(
        "              at most {} in one second (bound: limit + instances = {})",
        o.max_admitted_per_window,
        o.bound_per_window
    );
    if !o.partial_windows.is_empty() {
        let partial: Vec<String> = o
            .partial_windows
            .iter()
            .map(|(t, a)| format!("{t}-{}s {a}", t + 1))
            .collect();
        crate::outln!("              partly down: {}", partial.join(", "));
    }
    crate::outln!(
        "              healthy: at most {} in one second (limit {})",
        s.healthy_max_admitted_per_window,
        s.limit_per_second
    );
    crate::outln!(
        "  recovery    breakers all closed {} after Redis answered again",
        after(o.breakers_closed_after_ms)
    );
    crate::outln!(
        "  reconciled  {} units written back to Redis ({} more at shutdown, {} lost);",
        r.reconciled_units,
        r.written_back_at_shutdown,
        r.undrained_units
    );
    crate::outln!(
        "              {} expired unwritten (their one-second window had passed: they can no",
        r.expired_units
    );
    crate::outln!("              longer change a decision)");
    crate::outln!(
        "  latency     p50 {}, p99 {}, p99.9 {}; slowest decision {} (deadline {})",
        ms(l.p50_us),
        ms(l.p99_us),
        ms(l.p999_us),
        ms(l.max_us),
        ms(Some(l.deadline_us))
    );
    crate::outln!("  redis       {}", s.redis);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_admission_counts_in_the_window_its_rule_reports() {
        let state = |ms| RuleState::new(0, Duration::from_millis(ms));
        // Started 0.2 s into second 10, decided at once: 0.8 s left.
        assert_eq!(window_of(10_200_000, Some(&state(800))), 10);
        // Started at 10.999 s, decided by Redis at 11.002 s: 998 ms left of 11.
        assert_eq!(window_of(10_999_000, Some(&state(998))), 11);
        assert_eq!(window_of(10_999_000, None), 10);
    }

    #[test]
    fn windows_are_down_only_when_redis_was_down_all_through() {
        let m = Marks {
            stopped_us: Some(5_003_000),
            healing_us: Some(12_000_500),
            ..Marks::default()
        };
        assert_eq!(redis_during(&m, 4_000_000, 5_000_000), "up");
        assert_eq!(redis_during(&m, 5_000_000, 6_000_000), "partial");
        assert_eq!(redis_during(&m, 6_000_000, 7_000_000), "down");
        assert_eq!(redis_during(&m, 11_000_000, 12_000_000), "down");
        assert_eq!(redis_during(&m, 12_000_000, 13_000_000), "partial");
        assert_eq!(redis_during(&m, 13_000_000, 14_000_000), "up");
        let before = Marks::default();
        assert_eq!(redis_during(&before, 1_000_000, 2_000_000), "up");
    }
}
