//! `tierlimit check`: one decision, printed.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, ValueEnum};
use serde::Serialize;
use tierlimit::{HybridLimiter, Instances, Policy, Rule, RuleSet, RuleState, Tier};

use crate::{Failure, args};

/// Exit code of a check that was decided and denied.
pub(crate) const DENIED: u8 = 2;

#[derive(Debug, Args)]
#[command(after_help = "\
Rules are written as in the config file: LIMIT/PERIOD, e.g. 10/s, 100/min,
20/30s, 1000/day@+08:00 (a calendar day in UTC+8; any @offset makes a fixed
window aligned to that clock). Without @ a rule is GCRA. The Redis state is
tl:{KEY}:SET:RULE-ID (the rule id names its algorithm, period and offset), so a
check here shares it with an application's checks of the same key in a rule set
of the same name (--set) under the same rule, and consumes --cost units of it.

Exit status: 0 admitted, 2 denied, 1 error or Redis did not decide (the
--policy answer is then printed, with why Redis failed).

Examples:
  tierlimit check --redis redis://127.0.0.1:6380/ --key user:42 --rule 10/s --rule 100/h
  tierlimit check --redis redis://127.0.0.1:6380/ --key user:42 --rule 1000/day@+08:00 --cost 5 --json")]
pub(crate) struct CheckArgs {
    /// Redis URL: redis://host:port/db, redis://user:password@host:port/db (ACL user), or rediss://... (TLS).
    #[arg(long, value_name = "URL")]
    redis: String,
    /// The key to check (a user id, an API key, an IP...).
    #[arg(long)]
    key: String,
    /// A rule of the rule set; repeat for several (all must admit).
    #[arg(long = "rule", value_name = "RULE", required = true, value_parser = parse_rule)]
    rules: Vec<(String, Rule)>,
    /// Units this request costs.
    #[arg(long, default_value_t = 1)]
    cost: u64,
    /// The rule set's name: part of every Redis key of the check (and its metric label).
    #[arg(long, default_value = "cli")]
    set: String,
    /// What answers when Redis cannot be asked.
    #[arg(long, value_enum, default_value_t = PolicyArg::FailClosed)]
    policy: PolicyArg,
    /// Deadline of the Redis call.
    #[arg(long, default_value = "200ms", value_parser = args::duration)]
    deadline: Duration,
    /// Print the decision as one JSON object.
    #[arg(long)]
    json: bool,
}

/// A [`Policy`] on the command line.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum PolicyArg {
    /// Deny while Redis cannot be asked.
    FailClosed,
    /// Admit while Redis cannot be asked.
    FailOpen,
    /// Decide with a local bucket (this one process holds the whole limit).
    LocalFallback,
}

impl From<PolicyArg> for Policy {
    fn from(p: PolicyArg) -> Policy {
        match p {
            PolicyArg::FailClosed => Policy::FailClosed,
            PolicyArg::FailOpen => Policy::FailOpen,
            PolicyArg::LocalFallback => Policy::LocalFallback,
        }
    }
}

fn parse_rule(text: &str) -> Result<(String, Rule), String> {
    text.parse::<Rule>()
        .map(|rule| (text.trim().to_owned(), rule))
        .map_err(|e| e.to_string())
}

#[derive(Debug, Serialize)]
struct Printed<'a> {
    key: &'a str,
    cost: u64,
    allowed: bool,
    tier: &'static str,
    limit: u64,
    remaining: u64,
    reset_after_ms: f64,
    retry_after_ms: Option<f64>,
    /// The deciding rule, as written.
    rule: &'a str,
    rule_index: usize,
    /// Every rule's state, when the deciding tier counts them all.
    rules: Vec<PrintedRule<'a>>,
    /// Why Redis did not decide, when it did not.
    redis_failure: Option<String>,
}

#[derive(Debug, Serialize)]
struct PrintedRule<'a> {
    rule: &'a str,
    remaining: u64,
    reset_after_ms: f64,
}

fn millis(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

/// Runs one check and prints it.
pub(crate) async fn run(args: CheckArgs) -> Result<ExitCode, Failure> {
    let policy = Policy::from(args.policy);
    let set = RuleSet::new(args.set.clone(), args.rules.iter().map(|(_, r)| r.clone()))?
        .with_policy(policy);
    let limiter = HybridLimiter::builder()
        .redis_url(args.redis.clone())
        .deadline(args.deadline)
        .breaker(args::breaker_for(args.deadline))
        .default_policy(policy)
        // One process, one check: no heartbeat, and a local fallback (when
        // asked for) holds the whole limit.
        .instances(Instances::Fixed(1))
        .build()?;
    let mut states: Vec<RuleState> = Vec::new();
    let decision = limiter
        .check_with_rules(&args.key, &set, args.cost, &mut states)
        .await;
    let report = limiter.shutdown(Duration::from_secs(1)).await;
    let d = decision?;
    let printed = Printed {
        key: &args.key,
        cost: args.cost,
        allowed: d.allowed,
        tier: d.tier.as_str(),
        limit: d.limit,
        remaining: d.remaining,
        reset_after_ms: millis(d.reset_after),
        retry_after_ms: d.retry_after.map(millis),
        rule: args.rules.get(d.rule).map_or("?", |(text, _)| text),
        rule_index: d.rule,
        rules: args
            .rules
            .iter()
            .zip(&states)
            .map(|((text, _), s)| PrintedRule {
                rule: text,
                remaining: s.remaining,
                reset_after_ms: millis(s.reset_after),
            })
            .collect(),
        redis_failure: d.redis_failure.map(|f| format!("{f:?}")),
    };
    if args.json {
        let line = serde_json::to_string(&printed)
            .map_err(|e| Failure::new(format!("cannot encode the decision: {e}")))?;
        crate::outln!("{line}");
    } else {
        print_human(&printed);
    }
    if report.undrained_units > 0 {
        eprintln!(
            "warning: {} units admitted without Redis could not be written back",
            report.undrained_units
        );
    }
    let decided_by_redis = matches!(d.tier, Tier::Redis | Tier::DenyCache);
    if !decided_by_redis {
        eprintln!(
            "Redis did not decide ({}): this is the {} policy's answer",
            printed.redis_failure.as_deref().unwrap_or("breaker open"),
            policy.as_str()
        );
        return Ok(ExitCode::FAILURE);
    }
    Ok(if d.allowed {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(DENIED)
    })
}

fn print_human(p: &Printed<'_>) {
    crate::outln!(
        "{} {} (cost {}) by {}",
        if p.allowed { "ALLOWED" } else { "DENIED" },
        p.key,
        p.cost,
        p.tier
    );
    crate::outln!("  deciding rule  {} (#{})", p.rule, p.rule_index);
    crate::outln!("  limit          {}", p.limit);
    crate::outln!("  remaining      {}", p.remaining);
    crate::outln!("  reset after    {} ms", p.reset_after_ms);
    if let Some(retry) = p.retry_after_ms {
        crate::outln!("  retry after    {retry} ms");
    }
    for r in &p.rules {
        crate::outln!(
            "  rule {:<12} {} left, full again in {} ms",
            r.rule,
            r.remaining,
            r.reset_after_ms
        );
    }
}
