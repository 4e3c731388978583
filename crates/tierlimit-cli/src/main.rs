//! `tierlimit`: the hybrid rate limiter from the command line.
//!
//! * `tierlimit demo` shows the point of the library in one command: three
//!   limiter instances under load while Redis is stopped and brought back, a
//!   live per-second view, then a summary of what the outage cost.
//!
//! Run `tierlimit --help` for every subcommand and its examples.

mod args;
mod check;
mod config_cmd;
mod demo;
mod load;
mod metrics_http;
mod redis_child;
mod stats;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Set once a write to stdout failed (a closed pipe: `tierlimit demo | head`).
static STDOUT_GONE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Writes one line to stdout. A failed write (the reader went away) is not a
/// panic, as `println!` would make it: it is remembered, and long runs stop
/// at their next step (see [`stdout_gone`]).
pub(crate) fn print_line(line: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if writeln!(out, "{line}").and_then(|()| out.flush()).is_err() {
        STDOUT_GONE.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// True once a write to stdout has failed.
pub(crate) fn stdout_gone() -> bool {
    STDOUT_GONE.load(std::sync::atomic::Ordering::Relaxed)
}

/// `println!` through [`print_line`]: never panics on a closed stdout.
macro_rules! outln {
    () => {
        $crate::print_line("")
    };
    ($($arg:tt)*) => {
        $crate::print_line(&format!($($arg)*))
    };
}
pub(crate) use outln;

/// What went wrong, in words for the person at the terminal.
#[derive(Debug)]
pub(crate) struct Failure(String);

impl Failure {
    pub(crate) fn new(message: impl Into<String>) -> Self {
        Failure(message.into())
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<tierlimit::Error> for Failure {
    fn from(e: tierlimit::Error) -> Self {
        Failure(e.to_string())
    }
}

/// The exit code of a command line that does not parse (sysexits'
/// `EX_USAGE`).
const USAGE: u8 = 64;

/// The exit code of a run stopped by Ctrl-C or SIGTERM (128 + SIGINT).
const INTERRUPTED: u8 = 130;

#[derive(Debug, Parser)]
#[command(
    name = "tierlimit",
    version,
    about = "Distributed rate limiting that stays correct while Redis is healthy and useful when it is not",
    after_help = "Examples:\n  \
        tierlimit demo                         # the failover demo (starts its own redis-server)\n  \
        REDIS_URL=redis://127.0.0.1:6380/ tierlimit demo --metrics 127.0.0.1:9000\n  \
        tierlimit demo --help                  # the demo's timeline and flags\n  \
        tierlimit check --redis redis://127.0.0.1:6380/ --key user:42 --rule 10/s --rule 100/h\n  \
        tierlimit load --redis redis://127.0.0.1:6380/ --config tierlimit.toml --duration 30s\n  \
        tierlimit config check tierlimit.toml"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Three limiter instances under load while Redis is stopped and comes back, watched live.
    Demo(demo::DemoArgs),
    /// One check against Redis, printed (exit 0 admitted, 2 denied).
    Check(check::CheckArgs),
    /// Sustained load from a config file's rule sets: progress, then checks/s and latency.
    Load(load::LoadArgs),
    /// Config file tools.
    Config(config_cmd::ConfigArgs),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            // Not clap's 2: `check` says "denied" with it.
            return if e.use_stderr() {
                ExitCode::from(USAGE)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the Tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let load = matches!(cli.command, Command::Load(_));
    let outcome = runtime.block_on(async move {
        let work = async move {
            match cli.command {
                Command::Demo(args) => demo::run(args).await.map(|()| ExitCode::SUCCESS),
                Command::Check(args) => check::run(args).await,
                Command::Load(args) => load::run(args, interrupted()).await,
                Command::Config(args) => config_cmd::run(args),
            }
        };
        // The load handles Ctrl-C itself: it stops, shuts its limiter down
        // and still reports. Raced against a listener of its own here, the
        // signal woke both, and this one dropped the load (and its report)
        // while it waited for its last checks; a second Ctrl-C stops it.
        let signals = if load { 2 } else { 1 };
        tokio::select! {
            result = work => Some(result),
            () = interrupted_times(signals) => None,
        }
    });
    // Whatever `work` started (a redis-server child, listeners) was dropped
    // with it above, and Drop cleaned it up; the runtime stops its tasks here.
    runtime.shutdown_timeout(std::time::Duration::from_secs(2));
    match outcome {
        Some(Ok(code)) => code,
        Some(Err(e)) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
        None => {
            eprintln!("interrupted: stopped what this run started");
            ExitCode::from(INTERRUPTED)
        }
    }
}

/// Resolves on the `n`th Ctrl-C (SIGINT) or SIGTERM from now.
async fn interrupted_times(n: u32) {
    for _ in 0..n {
        interrupted().await;
    }
}

/// Resolves on Ctrl-C (SIGINT) or SIGTERM.
async fn interrupted() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    () = ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => ctrl_c().await,
        }
    }
    #[cfg(not(unix))]
    ctrl_c().await;
}

/// Resolves on Ctrl-C; never, when the handler cannot be installed (a run
/// that cannot be interrupted is better than one that stops at once).
async fn ctrl_c() {
    if tokio::signal::ctrl_c().await.is_err() {
        std::future::pending::<()>().await;
    }
}
