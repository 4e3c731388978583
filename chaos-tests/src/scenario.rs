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
    /// connections) rather than 500 ms (hangs).
    pub fast_trip: bool,
}

impl Scenario {
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
        }
    }
}

/// Every scenario, in the order the suite runs them. `fault_ms` is the length
/// of the fault phase.
pub fn all(fault_ms: u64, deadline_ms: u64) -> Vec<Scenario> {
    use Action::*;
    let flap_every = fault_ms / 3;
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
        Scenario::new(
            "flapping",
            "three short hangs in a row",
            vec![
                (0, PauseRedis),
                (flap_every / 2, ResumeRedis),
                (flap_every, PauseRedis),
                (flap_every * 3 / 2, ResumeRedis),
                (flap_every * 2, PauseRedis),
            ],
            vec![ResumeRedis],
        ),
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
    ]
}
