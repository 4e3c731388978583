//! Where Redis and the apps run, and how faults are made: one trait, two drivers.

use std::path::Path;
use std::time::{Duration, Instant};

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
    /// SIGKILL the victim master of a cluster (`docker kill`); it stays down,
    /// so its replica is promoted.
    KillMaster,
    /// Hang the victim master (SIGSTOP, `docker pause`): long enough, and its
    /// replica is promoted; resumed, it rejoins as a replica.
    PauseMaster,
    /// Let a hung victim master go on (SIGCONT, `docker unpause`).
    ResumeMaster,
    /// `CLUSTER FAILOVER` on the victim's replica: a manual failover that
    /// loses no write.
    FailoverMaster,
}

impl Action {
    /// Whether it leaves the apps without Redis (one Redis; a cluster's
    /// faults are judged apart).
    pub fn breaks_redis(self) -> bool {
        matches!(
            self,
            Action::KillRedis
                | Action::PauseRedis
                | Action::CutNetwork
                | Action::ResetConnections
                | Action::Latency(_)
        )
    }

    /// Whether Redis surely answers nothing once it landed (not a reset,
    /// after which the apps reconnect, nor a latency, which may stay under
    /// the deadline).
    pub fn silences_redis(self) -> bool {
        matches!(
            self,
            Action::KillRedis | Action::PauseRedis | Action::CutNetwork
        )
    }

    /// Whether it gives the apps their Redis back.
    pub fn returns_redis(self) -> bool {
        matches!(
            self,
            Action::StartRedis
                | Action::ResumeRedis
                | Action::RestoreNetwork
                | Action::ClearNetworkFault
        )
    }
}

/// A cluster as the controller reaches it: where its nodes are, and which
/// master the cluster faults hit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterTarget {
    /// Every node's `host:port`, reachable from the controller, by index.
    pub nodes: Vec<String>,
    /// The index of the victim master.
    pub victim: usize,
    /// The index of its replica, which a failover promotes.
    pub replica: usize,
}

/// The cluster whose nodes are at `nodes` (by index), aimed at the master
/// serving `victim_key` and its replica.
pub(crate) fn aim(nodes: Vec<String>, victim_key: &str) -> Result<ClusterTarget, String> {
    let first = nodes.first().ok_or("a cluster without nodes")?;
    let slot: u16 =
        tierlimit_test::query_node(first, redis::cmd("CLUSTER").arg("KEYSLOT").arg(victim_key))
            .map_err(|e| format!("CLUSTER KEYSLOT on {first}: {e}"))?;
    let view = tierlimit_test::cluster_nodes(first)
        .map_err(|e| format!("CLUSTER NODES on {first}: {e}"))?;
    let owner = tierlimit_test::slot_masters(first)
        .map_err(|e| format!("CLUSTER SLOTS on {first}: {e}"))?
        .into_iter()
        .find(|(range, _)| range.contains(&slot))
        .map(|(_, addr)| addr)
        .ok_or_else(|| format!("no master serves slot {slot}"))?;
    let index = |addr: &str| nodes.iter().position(|n| n == addr);
    let victim = index(&owner).ok_or_else(|| format!("the master {owner} is none of {nodes:?}"))?;
    let victim_id = view
        .iter()
        .find(|n| n.addr == owner)
        .map(|n| n.id.clone())
        .ok_or_else(|| format!("CLUSTER NODES does not list {owner}"))?;
    let replica = view
        .iter()
        .find(|n| n.master_id.as_deref() == Some(victim_id.as_str()))
        .and_then(|n| index(&n.addr))
        .ok_or_else(|| format!("the master {owner} has no replica among {nodes:?}"))?;
    Ok(ClusterTarget {
        nodes,
        victim,
        replica,
    })
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
    /// Starts a fresh Redis Cluster of 3 masters and 3 replicas that serves
    /// every slot, with `cluster-require-full-coverage no` (the README asks it
    /// of users: the other masters go on serving while one master's slots
    /// have none), makes the master serving `victim_key` the target of the
    /// cluster actions, and returns the apps' `redis+cluster://` URL with the
    /// controller's view of the cluster.
    fn start_cluster(&mut self, victim_key: &str) -> Result<(String, ClusterTarget), String>;
    /// Starts one app per plan; their logs go to each plan's `out`, which must
    /// be under `dir`.
    fn start_apps(&mut self, dir: &Path, plans: &[AppPlan]) -> Result<(), String>;
    /// Performs an action.
    fn act(&mut self, action: Action) -> Result<(), String>;
    /// Waits for every app still running to exit by itself, until `by`: an
    /// app still running then is an error (teardown kills it).
    fn wait_apps(&mut self, by: Instant) -> Result<(), String>;
    /// Stops and removes everything this scenario started.
    fn teardown(&mut self);
}

/// Polls `exited` (which answers `Some` once the app has exited) every
/// `every` until `by`; an app still running then is an error naming `app`.
pub(crate) fn wait_until<T>(
    app: &str,
    by: Instant,
    every: Duration,
    mut exited: impl FnMut() -> Result<Option<T>, String>,
) -> Result<T, String> {
    loop {
        if let Some(done) = exited()? {
            return Ok(done);
        }
        if Instant::now() >= by {
            return Err(format!(
                "{app} did not exit by itself in time: it is stuck (a blocked \
                 runtime or a check that never ends), and is killed"
            ));
        }
        std::thread::sleep(every);
    }
}
