//! What an app instance is told to do, what it writes, and the rule sets all
//! sides agree on.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tierlimit::{Algorithm, Policy, Rule, RuleSet, Tier};

/// A deliberately broken app (`chaos --sabotage NAME`): each must fail the
/// suite, which the process driver's tests show.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum Sabotage {
    /// None: the real limiter and load.
    #[default]
    None,
    /// Every Redis call waits up to 60 s instead of the deadline.
    NoDeadline,
    /// A load task panics at its first decision made without Redis: it
    /// stops logging, and the rest of the app goes on.
    PanicWithoutRedis,
    /// The app aborts (SIGABRT) at its first decision made without Redis.
    AbortWithoutRedis,
    /// A check made without Redis never returns (its future waits for
    /// nothing, forever).
    HangWithoutRedis,
    /// A check made without Redis blocks the app's only runtime thread for
    /// an hour: the app never exits by itself.
    BlockWithoutRedis,
}

impl Sabotage {
    /// Every sabotage, by its command-line name.
    pub const ALL: [(&str, Sabotage); 5] = [
        ("no-deadline", Sabotage::NoDeadline),
        ("panic-without-redis", Sabotage::PanicWithoutRedis),
        ("abort-without-redis", Sabotage::AbortWithoutRedis),
        ("hang-without-redis", Sabotage::HangWithoutRedis),
        ("block-without-redis", Sabotage::BlockWithoutRedis),
    ];
}

/// How long a check may take before the app logs it as an error: far past
/// any deadline and any stall of a busy machine.
pub const HUNG_CHECK: Duration = Duration::from_secs(10);

/// How long past its plan's worst case (the load, a last check hung for
/// [`HUNG_CHECK`], the whole drain) an app may take to exit before the
/// controller gives up on it: its runtime, flush and exit on a loaded machine.
pub const EXIT_GRACE: Duration = Duration::from_secs(15);

/// The global limit of the local-fallback stream's binding rule, per key per
/// second (a fixed window, so "per window" is exact).
pub const WINDOW_LIMIT: u64 = 40;

/// The edge scenarios' local-fallback stream (the rules a new user tried in
/// issue 9): a fixed window of [`EDGE_WINDOW_LIMIT`] per [`EDGE_WINDOW_S`]
/// seconds, an hourly fixed window of [`EDGE_HOUR_LIMIT`] (low enough that
/// the hour binds within a run, so over-admission across outages shows in it),
/// and the reconciled natural-day counter.
pub const EDGE_WINDOW_LIMIT: u64 = 61;
/// The edge window's period, seconds.
pub const EDGE_WINDOW_S: u64 = 2;
/// The edge hourly limit per key: about what a key is admitted in the first
/// 9 to 10 s of an edge run (61 per 2 s), so the hour is spent late in the
/// second outage or soon after, and is still open when it starts.
pub const EDGE_HOUR_LIMIT: u64 = 300;

/// One fixed-window rule of the local-fallback stream, as the judge sees it.
#[derive(Debug, Clone, Copy)]
pub struct JudgedRule {
    /// A name for the report.
    pub name: &'static str,
    /// The global limit per key per window.
    pub limit: u64,
    /// The window, µs (aligned to the Unix epoch: UTC offset 0).
    pub period_us: u64,
}

/// The fixed-window rules of the local-fallback stream (the natural-day
/// counter aside: it never binds).
pub fn judged_rules(edge: bool) -> Vec<JudgedRule> {
    if edge {
        vec![
            JudgedRule {
                name: "61 per 2 s",
                limit: EDGE_WINDOW_LIMIT,
                period_us: EDGE_WINDOW_S * 1_000_000,
            },
            JudgedRule {
                name: "300 per hour",
                limit: EDGE_HOUR_LIMIT,
                period_us: 3_600_000_000,
            },
        ]
    } else {
        vec![JudgedRule {
            name: "40 per second",
            limit: WINDOW_LIMIT,
            period_us: 1_000_000,
        }]
    }
}

/// The index of the natural-day rule in the local-fallback set.
pub fn day_rule(edge: bool) -> usize {
    if edge { 2 } else { 1 }
}

/// The streams of every app: one rule set per policy.
pub const STREAMS: [&str; 3] = ["fail-open", "fail-closed", "local-fallback"];

/// One app instance's orders, written by the controller as JSON.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AppPlan {
    /// Index of this app (0-based).
    pub app: usize,
    /// Redis as this app reaches it.
    pub redis_url: String,
    /// Wall-clock start of the load, ms since the Unix epoch (all apps alike).
    pub start_unix_ms: u64,
    /// How long the load runs, ms.
    pub run_ms: u64,
    /// After the load, how long the app waits at most for its breaker to close
    /// and its ledger to drain before writing its final line, ms.
    pub drain_ms: u64,
    /// Concurrent tasks.
    pub tasks: usize,
    /// Pause between one task's checks, ms.
    pub pace_ms: u64,
    /// Keys per stream.
    pub keys: usize,
    /// The deadline every Redis call gets, ms.
    pub deadline_ms: u64,
    /// The UTC offset of the natural-day rule, chosen so the run sits mid-day.
    pub day_offset_s: i64,
    /// Where to write the decision log.
    pub out: PathBuf,
    /// A deliberately broken app, so the suite can show it catches it.
    #[serde(default)]
    pub sabotage: Sabotage,
    /// The local-fallback stream uses the edge rules ([`EDGE_WINDOW_LIMIT`]
    /// per 2 s and [`EDGE_HOUR_LIMIT`] per hour) instead of 40 per second.
    #[serde(default)]
    pub edge: bool,
    /// The heartbeat period, ms (0: 200 ms, which the classic scenarios use
    /// so the apps learn their count within the warm-up).
    #[serde(default)]
    pub heartbeat_ms: u64,
}

impl AppPlan {
    /// How long after the load's start the app has surely exited, unless it
    /// is stuck: the load, a last check hung for [`HUNG_CHECK`], the whole
    /// drain and [`EXIT_GRACE`].
    pub fn exits_within(&self) -> Duration {
        Duration::from_millis(self.run_ms + self.drain_ms) + HUNG_CHECK + EXIT_GRACE
    }

    /// The deadline.
    pub fn deadline(&self) -> Duration {
        Duration::from_millis(self.deadline_ms)
    }
}

/// The three rule sets, by stream index. The local-fallback one binds at
/// [`WINDOW_LIMIT`] per second (or, with `edge`, at the edge rules) and
/// counts every unit in a natural-day window (reconciled after an outage: the
/// controller reads it back).
pub fn rule_sets(day_offset_s: i64, edge: bool) -> tierlimit::Result<[RuleSet; 3]> {
    let roomy = || Rule::per_second(100_000);
    if edge {
        return Ok([
            RuleSet::new("chaos-open", [roomy()?])?.with_policy(Policy::FailOpen),
            RuleSet::new("chaos-closed", [roomy()?])?.with_policy(Policy::FailClosed),
            RuleSet::new(
                "chaos-edge",
                [
                    Rule::with_period(EDGE_WINDOW_LIMIT, Duration::from_secs(EDGE_WINDOW_S))?
                        .with_algorithm(Algorithm::FixedWindow)?,
                    Rule::with_period(EDGE_HOUR_LIMIT, Duration::from_secs(3_600))?
                        .with_algorithm(Algorithm::FixedWindow)?,
                    Rule::per_natural_day(100_000_000, day_offset_s)?,
                ],
            )?
            .with_policy(Policy::LocalFallback),
        ]);
    }
    Ok([
        RuleSet::new("chaos-open", [roomy()?])?.with_policy(Policy::FailOpen),
        RuleSet::new("chaos-closed", [roomy()?])?.with_policy(Policy::FailClosed),
        RuleSet::new(
            "chaos-local",
            [
                Rule::with_period(WINDOW_LIMIT, Duration::from_secs(1))?
                    .with_algorithm(Algorithm::FixedWindow)?,
                Rule::per_natural_day(100_000_000, day_offset_s)?,
            ],
        )?
        .with_policy(Policy::LocalFallback),
    ])
}

/// The key names of a stream.
pub fn key(stream: usize, index: usize) -> String {
    format!("s{stream}-k{index}")
}

/// A UTC offset that puts `unix_s` in the middle of a natural day.
pub fn mid_day_offset(unix_s: u64) -> i64 {
    let into = (unix_s % 86_400) as i64;
    (43_200 - into) % 86_400
}

/// One-letter codes of tiers in the decision log.
pub fn tier_code(tier: Tier) -> char {
    match tier {
        Tier::Redis => 'R',
        Tier::Local => 'L',
        Tier::DenyCache => 'D',
        Tier::FailOpen => 'O',
        Tier::FailClosed => 'C',
        _ => '?',
    }
}

/// The tier of a one-letter code.
pub fn tier_of(code: char) -> Option<Tier> {
    Some(match code {
        'R' => Tier::Redis,
        'L' => Tier::Local,
        'D' => Tier::DenyCache,
        'O' => Tier::FailOpen,
        'C' => Tier::FailClosed,
        _ => return None,
    })
}
