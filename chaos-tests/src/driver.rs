//! Where Redis and the apps run, and how faults are made: one trait, two drivers.

use std::path::Path;

use crate::plan::AppPlan;

mod docker;
mod process;

pub use docker::DockerDriver;
pub use process::ProcessDriver;

/// One thing a driver does to Redis or to an app.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Action {
    /// SIGKILL Redis (`docker kill`).
    KillRedis,
    /// Start Redis again, with empty data and an empty script cache.
    StartRedis,
    /// Hang Redis with its sockets open (SIGSTOP, `docker pause`).
    PauseRedis,
    /// Let a hung Redis go on (SIGCONT, `docker unpause`).
    ResumeRedis,
    /// Cut the network between the apps and Redis: packets vanish (the fault
    /// proxy's blackhole; `docker network disconnect` of Redis).
    CutNetwork,
    /// Restore the network.
    RestoreNetwork,
    /// Reset every connection to Redis, and every new one, until restored
    /// (by the fault proxy, in both drivers).
    ResetConnections,
    /// Delay every packet between the apps and Redis by this many ms each way
    /// (by the fault proxy, in both drivers).
    Latency(u64),
    /// Undo `ResetConnections` or `Latency`.
    ClearNetworkFault,
    /// SIGKILL one app.
    KillApp(usize),
    /// Start a new process of an app (killed before) with the same plan, at
    /// once (its load starts without a lead and ends with the others'),
    /// logging to [`restarted_log`]: a rolling restart's new process.
    StartApp(usize),
}

/// The log of the `generation`-th new process of the app whose first log is
/// `first` (`app0.log` -> `app0-r1.log`).
pub fn restarted_log(first: &Path, generation: usize) -> std::path::PathBuf {
    let stem = first
        .file_stem()
        .map_or_else(|| "app".into(), |s| s.to_string_lossy().into_owned());
    first.with_file_name(format!("{stem}-r{generation}.log"))
}

/// Hosts Redis and the apps, and makes faults.
pub trait Driver {
    /// A short name for reports.
    fn name(&self) -> &'static str;
    /// Starts a fresh Redis (`maxmemory` in bytes, `noeviction`, when given)
    /// and returns the URL the apps must use.
    fn start_redis(&mut self, maxmemory: Option<u64>) -> Result<String, String>;
    /// A URL the controller (this process) reaches Redis at, for filling memory
    /// and reading keys back. Fresh after every action: it may change.
    fn controller_url(&mut self) -> Result<String, String>;
    /// Starts one app per plan; their logs go to each plan's `out`, which must
    /// be under `dir`.
    fn start_apps(&mut self, dir: &Path, plans: &[AppPlan]) -> Result<(), String>;
    /// Performs an action.
    fn act(&mut self, action: Action) -> Result<(), String>;
    /// Waits for every app still running to exit by itself.
    fn wait_apps(&mut self) -> Result<(), String>;
    /// Stops and removes everything this scenario started.
    fn teardown(&mut self);
}
