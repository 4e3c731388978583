//! Runs one scenario with a driver: start Redis and the apps, make the fault on
//! time, heal it, collect the logs and read Redis back.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use tierlimit_core::escape_key;
use tierlimit_test::{MemoryFiller, StallWatch};

use crate::analyze::{AppLog, Context, ReturnBetween, ScenarioResult, Timeline, judge};
use crate::driver::{Action, ClusterTarget, Driver, restarted_log};
use crate::plan::{AppPlan, EDGE_WINDOW_S, Sabotage, day_rule, key, mid_day_offset, rule_sets};
use crate::scenario::Scenario;
use crate::unix_us;

/// How a suite runs.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// Shorter phases.
    pub quick: bool,
    /// App instances.
    pub apps: usize,
    /// The deadline, ms.
    pub deadline_ms: u64,
    /// Where run directories (logs, plans) go.
    pub work_dir: PathBuf,
    /// Time between starting the apps and the load, ms (containers need more).
    pub lead_ms: u64,
    /// Run broken apps, to show the suite catches them.
    pub sabotage: Sabotage,
}

impl RunConfig {
    /// Warm-up, fault and after-fault phases, ms.
    pub fn phases(&self) -> (u64, u64, u64) {
        if self.quick {
            (1_500, 2_500, 2_000)
        } else {
            (3_000, 5_000, 3_000)
        }
    }
}

fn sleep_until(start_us: u64, at_us: u64) {
    let now = unix_us();
    if start_us + at_us > now {
        std::thread::sleep(Duration::from_micros(start_us + at_us - now));
    }
}

/// A cluster scenario's cluster, as the controller follows it.
#[derive(Debug)]
struct ClusterRun {
    target: ClusterTarget,
    /// The slot of the victim's first key.
    victim_slot: u16,
    /// (stream, key index) of every key the victim master served at the start.
    victim_keys: HashSet<(usize, usize)>,
    /// The slot of each local-fallback key (all its rules share it).
    fallback_slots: Vec<u16>,
    /// When the victim's replica was first seen serving `victim_slot`, µs
    /// since the run's start.
    promoted_at: Option<u64>,
}

impl ClusterRun {
    /// Finds which keys the victim serves (by the slot of each key's storage
    /// key) and checks every stream has keys on it and on the other masters.
    fn new(
        target: ClusterTarget,
        storage: &dyn Fn(usize, usize) -> String,
        keys: usize,
    ) -> Result<Self, String> {
        let node = &target.nodes[target.replica];
        let masters =
            tierlimit_test::slot_masters(node).map_err(|e| format!("CLUSTER SLOTS: {e}"))?;
        let victim_addr = &target.nodes[target.victim];
        let slot_of = |key: &str| -> Result<u16, String> {
            tierlimit_test::query_node(node, redis::cmd("CLUSTER").arg("KEYSLOT").arg(key))
                .map_err(|e| format!("CLUSTER KEYSLOT: {e}"))
        };
        let mut victim_keys = HashSet::new();
        let mut fallback_slots = Vec::new();
        for stream in 0..crate::plan::STREAMS.len() {
            for k in 0..keys {
                let slot = slot_of(&storage(stream, k))?;
                if stream == 2 {
                    fallback_slots.push(slot);
                }
                if masters
                    .iter()
                    .any(|(range, addr)| range.contains(&slot) && addr == victim_addr)
                {
                    victim_keys.insert((stream, k));
                }
            }
            let on_victim = victim_keys.iter().filter(|(s, _)| *s == stream).count();
            if on_victim == 0 || on_victim == keys {
                return Err(format!(
                    "stream {stream} has {on_victim} of its {keys} keys on the victim master: a cluster scenario needs some on it and some elsewhere"
                ));
            }
        }
        Ok(ClusterRun {
            victim_slot: fallback_slots[0],
            target,
            victim_keys,
            fallback_slots,
            promoted_at: None,
        })
    }

    /// Notes the promotion once the replica serves the victim's slot.
    fn watch(&mut self, start_us: u64) {
        if self.promoted_at.is_some() {
            return;
        }
        let replica = &self.target.nodes[self.target.replica];
        let serves = tierlimit_test::slot_masters(replica).is_ok_and(|masters| {
            masters
                .iter()
                .any(|(range, addr)| range.contains(&self.victim_slot) && addr == replica)
        });
        if serves {
            self.promoted_at = Some(unix_us() - start_us);
        }
    }

    /// The natural-day counter of each local-fallback key (`storage(k)` its
    /// storage key), read from its slot's master as the cluster has it now.
    fn counts(&self, storage: &dyn Fn(usize) -> String) -> Result<HashMap<usize, u64>, String> {
        let node = &self.target.nodes[self.target.replica];
        let masters =
            tierlimit_test::slot_masters(node).map_err(|e| format!("CLUSTER SLOTS: {e}"))?;
        let mut counts = HashMap::new();
        for (k, slot) in self.fallback_slots.iter().enumerate() {
            let owner = masters
                .iter()
                .find(|(range, _)| range.contains(slot))
                .map(|(_, addr)| addr)
                .ok_or_else(|| format!("no master serves slot {slot} at the end"))?;
            let key = storage(k);
            let c: Option<u64> =
                tierlimit_test::query_node(owner, redis::cmd("HGET").arg(&key).arg("c"))
                    .map_err(|e| format!("reading {key} back from {owner}: {e}"))?;
            counts.insert(k, c.unwrap_or(0));
        }
        Ok(counts)
    }
}

/// Sleeps until `at_us` after the run's start; meanwhile, in a cluster
/// scenario, watches for the replica's promotion every 10 ms.
fn pause_until(start_us: u64, at_us: u64, cluster: &mut Option<ClusterRun>) {
    let Some(cluster) = cluster.as_mut() else {
        return sleep_until(start_us, at_us);
    };
    loop {
        cluster.watch(start_us);
        let now = unix_us();
        if now >= start_us + at_us {
            return;
        }
        std::thread::sleep(Duration::from_micros((start_us + at_us - now).min(10_000)));
    }
}

/// Follows an app's log as it grows, reading only what is new (the apps share
/// the CPU with this process: re-reading whole logs would slow them).
#[derive(Debug)]
struct Tail {
    path: PathBuf,
    offset: u64,
    partial: String,
    admitted: u64,
    denied: u64,
    /// (t, state) of every breaker line seen.
    states: Vec<(u64, String)>,
    /// What the ledger owed at the last `p` line seen since the last state line.
    pending: Option<u64>,
}

impl Tail {
    fn new(path: PathBuf) -> Self {
        Tail {
            path,
            offset: 0,
            partial: String::new(),
            admitted: 0,
            denied: 0,
            states: Vec::new(),
            pending: None,
        }
    }

    fn poll(&mut self) {
        use std::io::{Read, Seek, SeekFrom};
        let Ok(mut f) = std::fs::File::open(&self.path) else {
            return;
        };
        if f.seek(SeekFrom::Start(self.offset)).is_err() {
            return;
        }
        let mut new = String::new();
        let Ok(n) = f.read_to_string(&mut new) else {
            return;
        };
        self.offset += n as u64;
        self.partial.push_str(&new);
        let complete = self.partial.rfind('\n').map_or(0, |i| i + 1);
        let lines: String = self.partial.drain(..complete).collect();
        for line in lines.lines() {
            let f: Vec<&str> = line.split(',').collect();
            match f.first().copied() {
                Some("d") if f.get(5) == Some(&"1") => self.admitted += 1,
                Some("d") => self.denied += 1,
                Some("s") if f.len() >= 4 => {
                    self.states
                        .push((f[1].parse().unwrap_or(0), f[2].to_string()));
                    // What was owed before this transition says nothing of after it.
                    self.pending = None;
                }
                Some("p") if f.len() == 3 => self.pending = f[2].parse().ok(),
                _ => {}
            }
        }
    }

    fn closed_since(&self, t: u64) -> bool {
        self.states.iter().any(|(at, s)| *at >= t && s == "closed")
    }
}

/// Runs one scenario; `progress` gets a line about once a second.
pub fn run_scenario(
    driver: &mut dyn Driver,
    sc: &Scenario,
    cfg: &RunConfig,
    progress: &mut dyn FnMut(String),
) -> Result<ScenarioResult, String> {
    let result = run_inner(driver, sc, cfg, progress);
    driver.teardown();
    result
}

fn run_inner(
    driver: &mut dyn Driver,
    sc: &Scenario,
    cfg: &RunConfig,
    progress: &mut dyn FnMut(String),
) -> Result<ScenarioResult, String> {
    let dir = cfg.work_dir.join(sc.name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let (warm, fault_ms, after) = sc.phases.unwrap_or_else(|| cfg.phases());
    let mut cluster = None;
    let redis_url = if sc.cluster {
        // A storage key's slot is its user key's: the UTC offset is not in it.
        let sets = rule_sets(0, sc.edge).map_err(|e| e.to_string())?;
        let storage =
            |stream: usize, k: usize| sets[stream].storage_key(&escape_key(&key(stream, k)), 0);
        let (url, target) = driver.start_cluster(&storage(2, 0))?;
        cluster = Some(ClusterRun::new(target, &storage, sc.keys)?);
        url
    } else {
        driver.start_redis(sc.oom)?
    };
    let mut start_unix_ms = unix_us() / 1_000 + cfg.lead_ms;
    if sc.edge {
        // The load starts at a boundary of the 2 s windows, so every fault
        // lands at the same point of its window in every run: a second outage
        // at 6.5 s starts 0.5 s into a window Redis has mostly spent.
        start_unix_ms = start_unix_ms.div_ceil(EDGE_WINDOW_S * 1_000) * EDGE_WINDOW_S * 1_000;
    }
    let day_offset_s = mid_day_offset(start_unix_ms / 1_000);
    let plans: Vec<AppPlan> = (0..cfg.apps)
        .map(|app| AppPlan {
            app,
            redis_url: redis_url.clone(),
            start_unix_ms,
            run_ms: warm + fault_ms + after,
            drain_ms: 10_000,
            // About 500 checks/s per app: enough that the local-fallback keys
            // are over their limit, light enough that three apps, Redis and
            // this controller share two cores without stretching latencies.
            tasks: 4,
            pace_ms: 8,
            keys: sc.keys,
            deadline_ms: cfg.deadline_ms,
            day_offset_s,
            out: dir.join(format!("app{app}.log")),
            sabotage: cfg.sabotage,
            edge: sc.edge,
            // The edge scenarios beat at the library's default (1 s), as a new
            // user's apps would: how long an instance count takes to recover
            // after Redis comes back empty is part of what they test.
            heartbeat_ms: if sc.edge { 1_000 } else { 200 },
        })
        .collect();
    // Every process's log: one per app, then one per new process (`StartApp`);
    // `current[app]` is the index of the app's newest log.
    let mut log_paths: Vec<PathBuf> = plans.iter().map(|p| p.out.clone()).collect();
    let mut current: Vec<usize> = (0..plans.len()).collect();
    let mut generations = vec![0usize; plans.len()];
    let start_us = start_unix_ms * 1_000;
    // The machine's stalls, timed from the run's start (which may lie ahead)
    // like the apps' decisions.
    let (now_us, now) = (unix_us(), Instant::now());
    let origin = if start_us >= now_us {
        now + Duration::from_micros(start_us - now_us)
    } else {
        now - Duration::from_micros(now_us - start_us)
    };
    let watch = StallWatch::start(origin).map_err(|e| format!("the stall watch: {e}"))?;
    driver.start_apps(&dir, &plans)?;
    // Started after the load's start, the apps would lose warm-up, and the
    // bounds judged on it would blame the limiter for the machine.
    let late_us = unix_us().saturating_sub(start_us);
    if late_us > 0 {
        return Err(format!(
            "the apps were started {} ms after the load's start ({} ms of lead were not enough \
             on this machine): no bound would be fair",
            late_us / 1_000,
            cfg.lead_ms
        ));
    }
    let began = Instant::now();
    // One per log, a restarted app's new process's included.
    let mut tails: Vec<Tail> = plans.iter().map(|p| Tail::new(p.out.clone())).collect();
    let mut tell = |tails: &mut [Tail], phase: &str| {
        let (mut a, mut d) = (0, 0);
        for t in tails {
            t.poll();
            a += t.admitted;
            d += t.denied;
        }
        progress(format!(
            "  {:>5.1}s {phase:<10} admitted {a:>6} denied {d:>6}",
            began.elapsed().as_secs_f64()
        ));
    };

    // Warm-up.
    let mut t = 0;
    while t + 1_000 < warm {
        t += 1_000;
        sleep_until(start_us, t * 1_000);
        tell(&mut tails, "warm-up");
    }
    sleep_until(start_us, warm * 1_000);
    let fault_at = unix_us() - start_us;
    let mut killed = Vec::new();
    let mut redis_losses = Vec::new();
    // Set when the last kill has surely landed: once `act` returns (a `docker kill`
    // lands tens of ms after it is asked for; Redis admits until then).
    let mut data_lost_at = None;
    let filler = match sc.oom {
        Some(_) => Some(MemoryFiller::start(&driver.controller_url()?)?),
        None => None,
    };
    let mut steps = sc.fault.clone();
    steps.sort_by_key(|(at, _)| *at);
    // Redis back within the fault phase, and broken again after it.
    let mut returned_at = None;
    let mut returns_between: Vec<ReturnBetween> = Vec::new();
    // When Redis was surely down: see `Timeline::down`.
    let mut down: Vec<(u64, u64)> = Vec::new();
    let mut next_tick = warm + 1_000;
    let mut master_lost = None;
    for (at, action) in steps {
        while next_tick < warm + at {
            pause_until(start_us, next_tick * 1_000, &mut cluster);
            tell(&mut tails, "fault");
            next_tick += 1_000;
        }
        pause_until(start_us, (warm + at) * 1_000, &mut cluster);
        let asked = unix_us() - start_us;
        driver.act(action)?;
        let done = unix_us() - start_us;
        if action.returns_redis()
            && let Some(d) = down.last_mut().filter(|d| d.1 == 0)
        {
            d.1 = asked;
        } else if action.silences_redis() && down.last().is_none_or(|d| d.1 != 0) {
            down.push((done, 0));
        }
        if action.returns_redis() {
            returned_at = Some(done);
            if let Some(rb) = returns_between.last_mut().filter(|rb| rb.ended_at == 0) {
                rb.ended_at = done;
            }
        } else if action.breaks_redis()
            && let Some(returned_at) = returned_at.take()
        {
            returns_between.push(ReturnBetween {
                returned_at,
                broke_at: done,
                ended_at: 0,
            });
        }
        match action {
            Action::KillApp(i) => killed.push((current.get(i).copied().unwrap_or(i), done)),
            Action::StartApp(i) => {
                let g = generations
                    .get_mut(i)
                    .ok_or_else(|| format!("no app {i}"))?;
                *g += 1;
                let log = restarted_log(&plans[i].out, *g);
                tails.push(Tail::new(log.clone()));
                log_paths.push(log);
                current[i] = log_paths.len() - 1;
            }
            Action::KillRedis => {
                data_lost_at = Some(done);
                redis_losses.push((asked, done));
            }
            Action::KillMaster | Action::PauseMaster => master_lost = Some((asked, done)),
            _ => {}
        }
    }
    while next_tick < warm + fault_ms {
        pause_until(start_us, next_tick * 1_000, &mut cluster);
        tell(&mut tails, "fault");
        next_tick += 1_000;
    }
    pause_until(start_us, (warm + fault_ms) * 1_000, &mut cluster);
    // An app may close on the healed Redis before the driver's heal returns
    // (`docker unpause` takes up to a few hundred ms): a close is judged
    // from when the heal was asked for.
    let heal_asked = unix_us() - start_us;
    if let Some(d) = down.last_mut().filter(|d| d.1 == 0) {
        d.1 = heal_asked;
    }
    for action in &sc.heal {
        let asked = unix_us() - start_us;
        driver.act(*action)?;
        if *action == Action::KillRedis {
            redis_losses.push((asked, unix_us() - start_us));
        }
    }
    if let Some(filler) = filler {
        filler.stop()?;
    }
    let healed_at = unix_us() - start_us;
    let mut killed_after_close = None;
    if let Some(rb) = returns_between.last_mut().filter(|rb| rb.ended_at == 0) {
        rb.ended_at = healed_at;
    }
    if let Some(app) = sc.kill_app_after_close {
        // Kill it once its log shows the breaker closed again and its
        // ledger still owing: mid-drain (the judge checks where it died).
        let mut tail = Tail::new(dir.join(format!("app{app}.log")));
        let end = Instant::now() + Duration::from_secs(5);
        while Instant::now() < end
            && !{
                tail.poll();
                tail.closed_since(heal_asked) && tail.pending.is_some_and(|units| units > 0)
            }
        {
            std::thread::sleep(Duration::from_millis(5));
        }
        killed_after_close = Some(tail.closed_since(heal_asked));
        driver.act(Action::KillApp(app))?;
        killed.push((current[app], unix_us() - start_us));
    }
    while next_tick < warm + fault_ms + after {
        pause_until(start_us, next_tick * 1_000, &mut cluster);
        tell(&mut tails, "recovery");
        next_tick += 1_000;
    }
    // Every app exits by itself, the same time after the start; one that does
    // not is stuck (a blocked runtime), and waiting on would hang the suite.
    let exit_by = origin + plans.first().map_or(Duration::ZERO, AppPlan::exits_within);
    driver.wait_apps(exit_by)?;
    let stalls = watch.stop().into_list();
    tell(&mut tails, "done");

    // Read back the natural-day counter of every local-fallback key.
    let set = &rule_sets(day_offset_s, sc.edge).map_err(|e| e.to_string())?[2];
    let storage = |k: usize| set.storage_key(&escape_key(&key(2, k)), day_rule(sc.edge));
    let redis_counts = if let Some(cluster) = &cluster {
        cluster.counts(&storage)?
    } else {
        let mut redis_counts = HashMap::new();
        let mut conn = redis::Client::open(driver.controller_url()?)
            .and_then(|c| c.get_connection())
            .map_err(|e| format!("reading Redis back: {e}"))?;
        for k in 0..sc.keys {
            let c: Option<u64> = redis::cmd("HGET")
                .arg(storage(k))
                .arg("c")
                .query(&mut conn)
                .map_err(|e| e.to_string())?;
            redis_counts.insert(k, c.unwrap_or(0));
        }
        redis_counts
    };
    let logs: Vec<AppLog> = log_paths.iter().map(|p| AppLog::read(p)).collect();
    let ctx = Context {
        in_flight: plans.first().map_or(0, |p| p.tasks as u64),
        scenario: sc,
        driver: driver.name(),
        deadline_ms: cfg.deadline_ms,
        max_cool_down_ms: crate::app::breaker().max_cool_down.as_millis() as u64,
        keys: sc.keys,
        apps: cfg.apps as u64,
        timeline: Timeline {
            fault_at,
            healed_at,
            data_lost_at,
            redis_losses,
            killed,
            start_unix_us: start_us,
            master_lost,
            promoted_at: cluster.as_ref().and_then(|c| c.promoted_at),
            stalls,
            returns_between,
            killed_after_close,
            latency_ms: sc.fault.iter().find_map(|(_, a)| match a {
                Action::Latency(ms) => Some(*ms),
                _ => None,
            }),
            down,
        },
        redis_counts,
        victim_keys: cluster.map(|c| c.victim_keys).unwrap_or_default(),
    };
    Ok(judge(&ctx, &logs))
}
