//! `tierlimit config check`: validates a config file and prints every error.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};
use tierlimit::{Config, Rule};

use crate::Failure;

#[derive(Debug, Args)]
pub(crate) struct ConfigArgs {
    #[command(subcommand)]
    command: ConfigCommand,
}

#[derive(Debug, Subcommand)]
enum ConfigCommand {
    /// Validates a config file: prints every problem with its field path
    /// and line, or what the file sets up (exit 0 valid, 1 not).
    #[command(after_help = "\
The file format is documented with tierlimit::Config (crates/tierlimit/examples/tierlimit.toml
holds every setting). Nothing is sent to Redis: TLS files named by the config are read,
the URL is only parsed.

Examples:
  tierlimit config check tierlimit.toml
  tierlimit config check /etc/myapp/tierlimit.toml && systemctl reload myapp")]
    Check {
        /// The config file (TOML).
        file: PathBuf,
    },
}

/// Runs `tierlimit config ...`.
pub(crate) fn run(args: ConfigArgs) -> Result<ExitCode, Failure> {
    match args.command {
        ConfigCommand::Check { file } => Ok(check(&file)),
    }
}

fn check(file: &std::path::Path) -> ExitCode {
    match Config::load(file) {
        Ok(config) => {
            let sets = config.rule_sets();
            crate::outln!(
                "{}: valid; {} rule set{}",
                file.display(),
                sets.len(),
                if sets.len() == 1 { "" } else { "s" }
            );
            for set in sets {
                let rules: Vec<String> = set.rules().iter().map(describe_rule).collect();
                let policy = set
                    .policy()
                    .map_or("(default)".to_owned(), |p| p.as_str().replace('_', "-"));
                crate::outln!(
                    "  {:<16} policy {:<15} {}",
                    set.name(),
                    policy,
                    rules.join(", ")
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            for p in e.problems() {
                let at = match (p.line(), p.column()) {
                    (Some(l), Some(c)) => format!("{}:{l}:{c}: ", file.display()),
                    (Some(l), None) => format!("{}:{l}: ", file.display()),
                    _ => format!("{}: ", file.display()),
                };
                let path = if p.path().is_empty() {
                    String::new()
                } else {
                    format!("{}: ", p.path())
                };
                eprintln!("{at}{path}{}", p.message());
            }
            let n = e.problems().len();
            eprintln!(
                "{}: {n} problem{}",
                file.display(),
                if n == 1 { "" } else { "s" }
            );
            ExitCode::FAILURE
        }
    }
}

/// A rule as the file could have written it, with its algorithm:
/// `100/s (gcra)`, `1000/d@+08:00 (fixed-window)`; a calendar rule at UTC
/// shows `@UTC`.
fn describe_rule(rule: &Rule) -> String {
    let us = rule.period_micros();
    let period = [
        (86_400_000_000, "d"),
        (3_600_000_000, "h"),
        (60_000_000, "min"),
        (1_000_000, "s"),
        (1_000, "ms"),
        (1, "us"),
    ]
    .iter()
    .find(|(unit, _)| us.is_multiple_of(*unit))
    .map_or_else(
        || format!("{us}us"),
        |(unit, name)| match us / unit {
            1 => (*name).to_owned(),
            n => format!("{n}{name}"),
        },
    );
    let offset = match rule.utc_offset_secs() {
        0 if rule.is_calendar() => "@UTC".to_owned(),
        0 => String::new(),
        s => format!(
            "@{}{:02}:{:02}",
            if s < 0 { '-' } else { '+' },
            s.abs() / 3600,
            s.abs() % 3600 / 60
        ),
    };
    // `TokenBucket` as the file writes it: `token-bucket`.
    let mut algorithm = String::new();
    for (i, c) in format!("{:?}", rule.algorithm()).chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            algorithm.push('-');
        }
        algorithm.push(c.to_ascii_lowercase());
    }
    let burst = rule
        .burst()
        .filter(|b| *b != rule.limit())
        .map_or_else(String::new, |b| format!(", burst {b}"));
    format!("{}/{period}{offset} ({algorithm}{burst})", rule.limit())
}
