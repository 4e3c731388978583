//! The scenarios: what is done to Redis or to an app, and when.

use crate::driver::Action;

/// When an action happens, in ms after the fault starts.
pub type Step = (u64, Action);

/// One fault scenario.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Its name on the command line and in the report.
    pub name: &'static str,
    /// What it shows.
    pub about: &'static str,
    /// Actions from the start of the fault (times are ms after it).
    pub fault: Vec<Step>,
    /// Actions that end the fault (at the end of the fault phase).
    pub heal: Vec<Action>,
    /// Whether Redis must become unusable, so every app's breaker must trip.
    pub outage: bool,
    /// Redis started with this `maxmemory` (noeviction) and filled at the fault.
    pub oom: Option<u64>,
    /// Keys per stream (more keys make a longer drain).
    pub keys: usize,
    /// An app killed after the heal, once its breaker has closed (mid-drain).
    pub kill_app_after_close: Option<usize>,
    /// Whether the trip must happen within 200 ms (refused or reset
    /// connections) rather than 500 ms (hangs). An app that saw its calls time
    /// out before it tripped saw a hang whatever the fault was, and is judged
    /// by the hang bound (the report says so).
    pub fast_trip: bool,
    /// Warm-up, fault and after-fault phases, ms, when this scenario needs
    /// its own, quick or not (the edge scenarios: two outages, or three
    /// restarts, timed against the hour rule's limit).
    pub phases: Option<(u64, u64, u64)>,
    /// The local-fallback stream uses the edge rules (61 per 2 s and 300 per
    /// hour, see [`crate::plan::EDGE_WINDOW_LIMIT`]), and every window of each
    /// rule is judged, not only windows wholly inside an outage.
    pub edge: bool,
    /// Runs against a Redis Cluster of 3 masters and 3 replicas instead of one
    /// Redis; the fault hits one master (the victim: the one serving the
    /// local-fallback stream's first key). Judged by the cluster bounds: the
    /// keys of the other masters stay on Redis, the victim's keys follow their
    /// policy until its replica is promoted and return to Redis after.
    pub cluster: bool,
}

impl Scenario {
    /// A cluster scenario: no outage, [`CLUSTER_KEYS`] keys per stream,
    /// warm-up 1.5 s, then fault and recovery phases of `(fault, after)` ms.
    fn on_cluster(
        name: &'static str,
        about: &'static str,
        (fault_ms, after_ms): (u64, u64),
        fault: Vec<Step>,
        heal: Vec<Action>,
    ) -> Self {
        Scenario {
            outage: false,
            cluster: true,
            keys: CLUSTER_KEYS,
            phases: Some((1_500, fault_ms, after_ms)),
            ..Scenario::new(name, about, fault, heal)
        }
    }

    fn new(name: &'static str, about: &'static str, fault: Vec<Step>, heal: Vec<Action>) -> Self {
        Scenario {
            name,
            about,
            fault,
            heal,
            outage: true,
            oom: None,
            keys: 4,
            kill_app_after_close: None,
            fast_trip: false,
            phases: None,
            edge: false,
            cluster: false,
        }
    }
}

/// Every scenario, in the order the suite runs them. `fault_ms` is the length
/// of the fault phase.
pub fn all(fault_ms: u64, deadline_ms: u64) -> Vec<Scenario> {
    use Action::*;
    vec![
        Scenario {
            fast_trip: true,
            ..Scenario::new(
                "kill-redis",
                "SIGKILL Redis under load; start it again empty",
                vec![(0, KillRedis)],
                vec![StartRedis],
            )
        },
        Scenario::new(
            "hang-redis",
            "SIGSTOP Redis: sockets stay open, nothing answers",
            vec![(0, PauseRedis)],
            vec![ResumeRedis],
        ),
        Scenario {
            outage: false,
            ..Scenario::new(
                "restart-redis",
                "restart Redis at once with empty data and an empty script cache",
                vec![(0, KillRedis), (0, StartRedis)],
                vec![],
            )
        },
        Scenario::new(
            "network-cut",
            "packets between apps and Redis vanish",
            vec![(0, CutNetwork)],
            vec![RestoreNetwork],
        ),
        Scenario {
            fast_trip: true,
            ..Scenario::new(
                "connection-reset",
                "every connection to Redis is reset",
                vec![(0, ResetConnections)],
                vec![ClearNetworkFault],
            )
        },
        Scenario {
            outage: false,
            ..Scenario::new(
                "latency-below-deadline",
                "each packet delayed so a call takes about half the deadline",
                vec![(0, Latency(deadline_ms / 4))],
                vec![ClearNetworkFault],
            )
        },
        Scenario::new(
            "latency-above-deadline",
            "each packet delayed so every call passes the deadline",
            vec![(0, Latency(deadline_ms))],
            vec![ClearNetworkFault],
        ),
        Scenario {
            oom: Some(8 * 1024 * 1024),
            ..Scenario::new(
                "oom",
                "Redis full under noeviction: every write answers -OOM",
                vec![],
                vec![],
            )
        },
        // Judged as the edge scenarios are, every window of the run, with
        // phases of its own: in quick mode its hangs (a sixth of the fault
        // phase each) held no whole window of the outage bound, which was
        // N/A in every CI run, and were too short for their trips to be
        // judged.
        Scenario {
            edge: true,
            phases: Some((1_500, 6_500, 2_000)),
            ..Scenario::new(
                "flapping",
                "three hangs of 1.5 s, 1 s apart",
                vec![
                    (0, PauseRedis),
                    (1_500, ResumeRedis),
                    (2_500, PauseRedis),
                    (4_000, ResumeRedis),
                    (5_000, PauseRedis),
                ],
                vec![ResumeRedis],
            )
        },
        Scenario::new(
            "app-killed-in-outage",
            "Redis hangs; one app is killed before Redis returns",
            vec![(0, PauseRedis), (fault_ms / 2, KillApp(2))],
            vec![ResumeRedis],
        ),
        Scenario {
            keys: 1_500,
            kill_app_after_close: Some(2),
            ..Scenario::new(
                "app-killed-in-reconcile",
                "Redis hangs; after it returns one app is killed while it drains its ledger",
                vec![(0, PauseRedis)],
                vec![ResumeRedis],
            )
        },
        // The edge scenarios of issue 9. Their phases are their own, the same in
        // quick and full runs.
        Scenario {
            edge: true,
            phases: Some((1_500, 7_000, 2_000)),
            ..Scenario::new(
                "second-outage-in-hour",
                "Redis hangs 1 s, is healthy 4 s, hangs 2 s: the second outage falls within the hour rule's period",
                vec![(0, PauseRedis), (1_000, ResumeRedis), (5_000, PauseRedis)],
                vec![ResumeRedis],
            )
        },
        Scenario {
            edge: true,
            fast_trip: true,
            phases: Some((1_500, 8_000, 2_000)),
            ..Scenario::new(
                "crash-loop",
                "SIGKILL Redis, start it empty, 2 s later SIGKILL it again (the heartbeat set is gone each time)",
                vec![(0, KillRedis), (1_500, StartRedis), (3_500, KillRedis)],
                vec![StartRedis],
            )
        },
        Scenario {
            edge: true,
            outage: false,
            phases: Some((1_500, 6_000, 2_000)),
            ..Scenario::new(
                "rolling-restart",
                "Redis healthy; app 0, then 1, then 2 is killed and a new process started at once, 2 s apart",
                vec![
                    (0, KillApp(0)),
                    (0, StartApp(0)),
                    (2_000, KillApp(1)),
                    (2_000, StartApp(1)),
                    (4_000, KillApp(2)),
                    (4_000, StartApp(2)),
                ],
                vec![],
            )
        },
        // The cluster scenarios of issue 14: the fault hits one master of
        // three. A cluster fails a master over after its node timeout (1 s)
        // and an election, so their fault phases are their own.
        Scenario::on_cluster(
            "cluster-master-killed",
            "Redis Cluster: SIGKILL one master under load; its replica is promoted",
            (4_000, 2_500),
            vec![(0, KillMaster)],
            vec![],
        ),
        Scenario::on_cluster(
            "cluster-master-paused",
            "Redis Cluster: SIGSTOP one master for 4 s; its replica is promoted, and the old master rejoins as a replica",
            (4_000, 2_500),
            vec![(0, PauseMaster)],
            vec![ResumeMaster],
        ),
        Scenario::on_cluster(
            "cluster-failover",
            "Redis Cluster: CLUSTER FAILOVER of one master to its replica under load",
            (2_500, 2_000),
            vec![(0, FailoverMaster)],
            vec![],
        ),
    ]
}

/// Keys per stream in the cluster scenarios: enough that every stream has
/// keys on the victim master and on the others (the controller checks).
const CLUSTER_KEYS: usize = 6;
