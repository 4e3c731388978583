//! Reads the apps' logs and judges a scenario against the bounds.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::time::Duration;

use serde::Serialize;
use tierlimit::{RedisFailure, Tier};
use tierlimit_test::{Stall, held_at_end};

use crate::plan::{STREAMS, judged_rules, tier_of};

/// One decision from an app's log.
#[derive(Debug, Clone, Copy)]
pub struct Decision {
    /// µs since the run's start.
    pub t: u64,
    /// Latency, µs.
    pub lat: u64,
    /// Stream (policy) index.
    pub stream: usize,
    /// Who decided.
    pub tier: Tier,
    /// Admitted?
    pub allowed: bool,
    /// Key index.
    pub key: usize,
    /// The policy answered because this check's Redis call failed in a way
    /// that may have run the script anyway: its unit may or may not be in Redis.
    pub maybe_ran: bool,
    /// The failure of this check's own Redis call, when it failed (logs from
    /// before this column say nothing).
    pub failure: Option<RedisFailure>,
}

/// A failure from its name in the log (the variant's name).
fn failure_of(name: &str) -> Option<RedisFailure> {
    Some(match name {
        "Timeout" => RedisFailure::Timeout,
        "ConnectionRefused" => RedisFailure::ConnectionRefused,
        "ConnectionLost" => RedisFailure::ConnectionLost,
        "NoScript" => RedisFailure::NoScript,
        "OutOfMemory" => RedisFailure::OutOfMemory,
        "ReadOnly" => RedisFailure::ReadOnly,
        "Loading" => RedisFailure::Loading,
        "MalformedReply" => RedisFailure::MalformedReply,
        "ClusterUnavailable" => RedisFailure::ClusterUnavailable,
        "NodeDown" => RedisFailure::NodeDown,
        "WrongType" => RedisFailure::WrongType,
        "Other" => RedisFailure::Other,
        _ => return None,
    })
}

/// One app's log, parsed.
#[derive(Debug, Default, Clone)]
pub struct AppLog {
    /// Decisions.
    pub decisions: Vec<Decision>,
    /// Checks that returned an error: (t, message).
    pub errors: Vec<(u64, String)>,
    /// Breaker states, as the app logged them.
    pub states: Vec<StateLine>,
    /// The final counters: reconciled, expired, overflow, pending, batches retried, instances.
    pub last: Option<[u64; 6]>,
    /// What the ledger owed, (t, units), at each change while the breaker
    /// was Closed.
    pub pending: Vec<(u64, u64)>,
}

/// A breaker state an app logged. The app polls its breaker, so the
/// transition happened after `since`, its previous poll, and by `at`: 1 ms
/// apart, or more when the app stalled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateLine {
    /// When the app saw the state, µs since the run's start.
    pub at: u64,
    /// The state: `closed`, `open` or `half_open`.
    pub state: String,
    /// When Open, when its probe is due, µs.
    pub due: Option<u64>,
    /// The app's previous poll, µs.
    pub since: u64,
}

impl AppLog {
    /// Parses a log file (a missing file is an empty log).
    pub fn read(path: &Path) -> AppLog {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let mut log = AppLog::default();
        for line in text.lines() {
            let f: Vec<&str> = line.split(',').collect();
            let n = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok());
            match f.first().copied() {
                Some("d") if f.len() == 8 || f.len() == 9 => {
                    if let (
                        Some(t),
                        Some(lat),
                        Some(stream),
                        Some(tier),
                        Some(allowed),
                        Some(key),
                        Some(maybe_ran),
                    ) = (
                        n(1),
                        n(2),
                        n(3),
                        f[4].chars().next().and_then(tier_of),
                        n(5),
                        n(6),
                        n(7),
                    ) {
                        log.decisions.push(Decision {
                            t,
                            lat,
                            stream: stream as usize,
                            tier,
                            allowed: allowed == 1,
                            key: key as usize,
                            maybe_ran: maybe_ran == 1,
                            failure: f.get(8).and_then(|n| failure_of(n)),
                        });
                    }
                }
                Some("e") if f.len() >= 5 => log.errors.push((n(1).unwrap_or(0), f[4..].join(","))),
                Some("s") if f.len() == 4 || f.len() == 5 => {
                    let at = n(1).unwrap_or(0);
                    log.states.push(StateLine {
                        at,
                        state: f[2].to_string(),
                        due: n(3),
                        since: n(4).unwrap_or(at),
                    })
                }
                Some("p") if f.len() == 3 => {
                    if let (Some(t), Some(units)) = (n(1), n(2)) {
                        log.pending.push((t, units));
                    }
                }
                Some("f") if f.len() == 7 => {
                    let mut v = [0; 6];
                    for (i, slot) in v.iter_mut().enumerate() {
                        *slot = n(i + 1).unwrap_or(0);
                    }
                    log.last = Some(v);
                }
                _ => {}
            }
        }
        log
    }

    /// The breaker state at `t` (µs), from the log.
    pub fn state_at(&self, t: u64) -> &str {
        self.states
            .iter()
            .take_while(|l| l.at <= t)
            .last()
            .map_or("closed", |l| l.state.as_str())
    }

    /// True when the breaker was surely not closed (open or half-open:
    /// either way no check touches Redis) over all of `[t - margin, t +
    /// margin]`: it left Closed by then, as logged, and no close may have
    /// happened in it (a close logged later, but after a poll that came late,
    /// may have happened earlier, from that poll's previous one on).
    pub fn open_around(&self, t: u64, margin: u64) -> bool {
        let from = t.saturating_sub(margin);
        self.state_at(from) != "closed"
            && !self
                .states
                .iter()
                .any(|l| l.at > from && l.since <= t + margin && l.state == "closed")
    }

    /// Whether a probe may have been in flight at `t`: begun less than
    /// `deadline` before it, so sent into a fault that ended at `t`, and
    /// able to fail still. A probe logged at `at` began after the poll
    /// before (`since`), however late the app logged it.
    pub fn probe_in_flight(&self, t: u64, deadline: u64) -> bool {
        self.states
            .iter()
            .any(|l| l.state == "half_open" && l.since < t && l.at + deadline > t)
    }

    /// The first time at or after `from` the breaker entered `state`.
    pub fn first(&self, state: &str, from: u64) -> Option<u64> {
        self.states
            .iter()
            .find(|l| l.at >= from && l.state == state)
            .map(|l| l.at)
    }
}

/// What the controller saw of one scenario run.
#[derive(Debug, Clone, Default)]
pub struct Timeline {
    /// When the fault started, µs since the run's start.
    pub fault_at: u64,
    /// When the heal actions completed (Redis is back), µs.
    pub healed_at: u64,
    /// When Redis last lost its data, if it did, µs (the kill had surely landed).
    pub data_lost_at: Option<u64>,
    /// Every time Redis lost its data (was killed): when the controller asked,
    /// and when the kill had surely landed, µs.
    pub redis_losses: Vec<(u64, u64)>,
    /// Processes killed (their log's index), with when.
    pub killed: Vec<(usize, u64)>,
    /// Wall-clock start of the run, µs since the epoch.
    pub start_unix_us: u64,
    /// A cluster's victim master was killed or hung: when the controller
    /// asked, and when the action had surely landed, µs. Its replica may lack
    /// the writes of the moments before (replication is asynchronous).
    pub master_lost: Option<(u64, u64)>,
    /// When the controller first saw the victim's replica serve the victim's
    /// slots as their master, µs.
    pub promoted_at: Option<u64>,
    /// The machine's stalls since the run's start, as the controller's
    /// [`StallWatch`](tierlimit_test::StallWatch) saw them.
    pub stalls: Vec<Stall>,
    /// Redis returned during the fault phase and broke again (a second
    /// outage, a crash loop): when each return was done, and when the break
    /// after it landed and its own return was done, µs. The first break
    /// (`fault_at`) and the last return (`healed_at`) are judged apart.
    pub returns_between: Vec<ReturnBetween>,
    /// For a scenario that kills an app once it closed after the heal: the
    /// app's log showed the close before the kill (`false`: the controller
    /// gave up waiting and killed it anyway).
    pub killed_after_close: Option<bool>,
    /// The delay a `Latency` fault put on each packet each way, ms.
    pub latency_ms: Option<u64>,
    /// When Redis was surely unreachable, µs: from a kill, pause or cut
    /// having landed to the next return (or the heal) being asked for. No
    /// probe sent in such a stretch can succeed, so no breaker that opened
    /// in it may close before it ends.
    pub down: Vec<(u64, u64)>,
}

/// One return of Redis within a fault phase, and the break after it: see
/// [`Timeline::returns_between`].
#[derive(Debug, Clone, Copy, Default)]
pub struct ReturnBetween {
    /// When Redis was back, µs.
    pub returned_at: u64,
    /// When it broke again (the action done), µs.
    pub broke_at: u64,
    /// When that break ended (the next return, or the heal), µs.
    pub ended_at: u64,
}

/// `d`'s latency less what a stall of the whole machine at its end explains
/// ([`held_at_end`]), µs.
fn own_latency(d: &Decision, stalls: &[Stall]) -> u64 {
    let (start, lat) = (Duration::from_micros(d.t), Duration::from_micros(d.lat));
    d.lat
        .saturating_sub(held_at_end(stalls, start, lat).as_micros() as u64)
}

/// How far behind its master a replica may be when the master dies, µs: the
/// writes of this last stretch before a kill or hang may be missing from the
/// promoted replica. Replication on one machine lags by well under a
/// millisecond; a second leaves room for a loaded 2-core machine, and a
/// write older than that and still missing counts as lost.
const REPLICATION_LAG_US: u64 = 1_000_000;

/// How soon after the replica's promotion the failed master's keys must be
/// decided by Redis again, µs: the tier's down mark (500 ms) runs out and its
/// next call finds the new master (the tier re-reads the slot map every
/// 100 ms while a master is down), plus one deadline and room for a loaded
/// machine.
const BACK_ON_REDIS_US: u64 = 1_000_000;

/// A bound and whether the run kept it.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// The bound, in words.
    pub bound: String,
    /// PASS or FAIL or N/A.
    pub verdict: &'static str,
    /// What was measured.
    pub measured: String,
}

/// Per policy (stream) measures.
#[derive(Debug, Clone, Serialize, Default)]
pub struct PolicyRow {
    /// The policy.
    pub policy: String,
    /// Admitted, by tier.
    pub admitted: BTreeMap<String, u64>,
    /// Denied, by tier.
    pub denied: BTreeMap<String, u64>,
    /// Admitted during the outage as a ratio of the global limit over it
    /// (local fallback only: fleet admissions / (limit x keys x seconds)).
    pub outage_ratio: Option<f64>,
    /// Slowest decision, ms.
    pub max_latency_ms: f64,
    /// p99 decision latency, ms.
    pub p99_latency_ms: f64,
}

/// Everything measured in one scenario.
#[derive(Debug, Clone, Serialize)]
pub struct ScenarioResult {
    /// Scenario name.
    pub scenario: String,
    /// What it does.
    pub about: String,
    /// Driver name.
    pub driver: String,
    /// Per policy.
    pub policies: Vec<PolicyRow>,
    /// Slowest trip over the apps, ms (outage scenarios).
    pub trip_ms: Option<f64>,
    /// Slowest recovery over the apps, ms after Redis returned.
    pub recover_ms: Option<f64>,
    /// Units the apps wrote back to Redis.
    pub reconciled_units: u64,
    /// Units dropped (expired or ledger overflow).
    pub dropped_units: u64,
    /// The bounds.
    pub checks: Vec<Check>,
    /// Decisions per 250 ms by tier, for the chart: (bucket start s, tier, count).
    pub series: Vec<(f64, String, u64)>,
    /// Fault window, s since the run's start.
    pub fault_window: (f64, f64),
    /// What the apps saw of the fault: per app, the failures their checks
    /// met between the fault and the trip, and how the trip was judged.
    pub notes: Vec<String>,
}

impl ScenarioResult {
    /// PASS when every bound held.
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.verdict != "FAIL")
    }
}

/// Checks each local-fallback key's natural-day counter in Redis against what
/// the decisions logged account for: `Ok` with how many units of slack the
/// run used, and how many of those went to killed apps' unlogged checks; or
/// `Err` describing the first key that is off.
///
/// Exact for every admission the logs saw. When Redis lost its data (in a
/// crash loop, more than once), what was admitted locally before the last loss may
/// have been written back before it, and lost, or after it: those admissions
/// widen the range like a killed app's. Three things widen the range
/// upward only: a check whose call failed after it may have been sent
/// (`maybe_ran`: it passed its deadline, and a hung server runs what it
/// buffered when it resumes; or its reply was lost to a reset) may have run on
/// Redis whatever the fallback answered; a killed app's local admissions may
/// have died in its ledger; and the checks a killed app had in flight, which it
/// never logged, may have run: at most its tasks, over all keys together.
fn reconcile_counts(ctx: &Context<'_>, all: &[(usize, &Decision)]) -> Result<(u64, u64), String> {
    let tl = &ctx.timeline;
    let max_unlogged = ctx.in_flight * tl.killed.len() as u64;
    let mut unlogged = max_unlogged;
    let mut used = 0;
    for key in 0..ctx.keys {
        let (mut sure, mut unknown, mut at_risk) = (0u64, 0u64, 0u64);
        for (a, d) in all.iter().filter(|(_, d)| d.stream == 2 && d.key == key) {
            unknown += u64::from(d.maybe_ran);
            if !d.allowed
                || (d.tier == Tier::Redis && tl.data_lost_at.is_some_and(|lost| d.t < lost))
            {
                continue;
            }
            // Admitted locally before Redis last lost its data (an earlier
            // outage of a crash loop): written back before that loss (and
            // lost with it) or after it; either may be.
            let before_last_loss = tl
                .redis_losses
                .last()
                .is_some_and(|(asked, _)| d.t < *asked);
            // Admitted by a cluster master moments before it was killed or
            // hung: its promoted replica may lack it.
            let replica_may_lack = d.tier == Tier::Redis
                && ctx.victim_keys.contains(&(2, key))
                && tl
                    .master_lost
                    .is_some_and(|(asked, done)| d.t + REPLICATION_LAG_US >= asked && d.t <= done);
            if replica_may_lack
                || (d.tier != Tier::Redis
                    && (before_last_loss || tl.killed.iter().any(|(k, _)| k == a)))
            {
                at_risk += 1;
            } else {
                sure += 1;
            }
        }
        let got = ctx.redis_counts.get(&key).copied().unwrap_or(0);
        let beyond = got.saturating_sub(sure + at_risk + unknown);
        if got < sure || beyond > unlogged {
            return Err(format!(
                "key {key}: Redis holds {got}, expected {sure} (+ up to {at_risk} from killed apps, + up to {unknown} of unknown outcome, + up to {unlogged} unlogged in flight)"
            ));
        }
        unlogged -= beyond;
        used += got - sure;
    }
    Ok((used, max_unlogged - unlogged))
}

fn check(bound: impl Into<String>, ok: bool, measured: impl Into<String>) -> Check {
    Check {
        bound: bound.into(),
        verdict: if ok { "PASS" } else { "FAIL" },
        measured: measured.into(),
    }
}

fn na(bound: impl Into<String>, why: impl Into<String>) -> Check {
    Check {
        bound: bound.into(),
        verdict: "N/A",
        measured: why.into(),
    }
}

fn p99(mut v: Vec<u64>) -> u64 {
    if v.is_empty() {
        return 0;
    }
    v.sort_unstable();
    v[((v.len() as f64 * 0.99).ceil() as usize).clamp(1, v.len()) - 1]
}

/// Inputs of [`judge`] beyond the logs.
#[derive(Debug, Clone)]
pub struct Context<'a> {
    /// The scenario.
    pub scenario: &'a crate::scenario::Scenario,
    /// The driver's name.
    pub driver: &'a str,
    /// The deadline the bounds are judged against, ms (the nominal one, even for
    /// a sabotaged limiter).
    pub deadline_ms: u64,
    /// The breaker's longest cool-down, ms.
    pub max_cool_down_ms: u64,
    /// Keys per stream.
    pub keys: usize,
    /// App instances sharing the limit at any one time (a restarted app's
    /// new process replaces the old one).
    pub apps: u64,
    /// The controller's timeline.
    pub timeline: Timeline,
    /// Checks one app has in flight at most (its tasks): what a killed app may
    /// have sent to Redis without living to log it.
    pub in_flight: u64,
    /// Per local-fallback key: the natural-day counter Redis holds at the end.
    pub redis_counts: HashMap<usize, u64>,
    /// In a cluster scenario, the keys (stream, key index) whose slot the
    /// victim master served when the run began.
    pub victim_keys: HashSet<(usize, usize)>,
}

/// Judges one scenario run.
pub fn judge(ctx: &Context<'_>, logs: &[AppLog]) -> ScenarioResult {
    let sc = ctx.scenario;
    let tl = &ctx.timeline;
    let deadline_us = ctx.deadline_ms * 1_000;
    let margin = 5_000;
    let mut checks = Vec::new();
    let all: Vec<(usize, &Decision)> = logs
        .iter()
        .enumerate()
        .flat_map(|(a, l)| l.decisions.iter().map(move |d| (a, d)))
        .collect();

    // Latency and errors. A decision is judged by its latency less what a
    // stall of the whole machine at its end explains.
    let max_lat = all.iter().map(|(_, d)| d.lat).max().unwrap_or(0);
    let longest_stall = tl.stalls.iter().map(Stall::length).max();
    let max_own = all
        .iter()
        .map(|(_, d)| own_latency(d, &tl.stalls))
        .max()
        .unwrap_or(0);
    let bound = deadline_us + 15_000;
    let mut measured = format!(
        "max {:.1} ms over {} decisions",
        max_own as f64 / 1e3,
        all.len()
    );
    if max_own < max_lat {
        measured.push_str(&format!(
            " less the machine's stalls at their ends ({:.1} ms as logged; see the notes)",
            max_lat as f64 / 1e3
        ));
    }
    if max_own > bound {
        // Said on the FAIL line itself, which is what a CI log shows.
        measured.push_str(&match longest_stall {
            Some(longest) => format!(
                "; the longest stall of the machine: {:.1} ms",
                longest.as_secs_f64() * 1e3
            ),
            None => "; the machine never stalled".to_string(),
        });
    }
    checks.push(check(
        format!(
            "every decision within deadline + 15 ms = {} ms",
            bound / 1_000
        ),
        max_own <= bound,
        measured,
    ));
    let errors: usize = logs.iter().map(|l| l.errors.len()).sum();
    checks.push(check(
        "no check returns an error",
        errors == 0,
        format!("{errors} errors"),
    ));

    // Per policy rows; fail-open / fail-closed while Open.
    let mut policies = Vec::new();
    let outage_s = (tl.healed_at.saturating_sub(tl.fault_at)) as f64 / 1e6;
    for (stream, name) in STREAMS.iter().enumerate() {
        let mut row = PolicyRow {
            policy: name.to_string(),
            ..PolicyRow::default()
        };
        let mine: Vec<&(usize, &Decision)> =
            all.iter().filter(|(_, d)| d.stream == stream).collect();
        for (_, d) in &mine {
            let map = if d.allowed {
                &mut row.admitted
            } else {
                &mut row.denied
            };
            *map.entry(d.tier.as_str().to_string()).or_default() += 1;
        }
        let lats: Vec<u64> = mine.iter().map(|(_, d)| d.lat).collect();
        row.max_latency_ms = lats.iter().copied().max().unwrap_or(0) as f64 / 1e3;
        row.p99_latency_ms = p99(lats) as f64 / 1e3;
        let while_open: Vec<&&(usize, &Decision)> = mine
            .iter()
            .filter(|(a, d)| logs[*a].open_around(d.t, margin))
            .collect();
        match stream {
            0 if !while_open.is_empty() => {
                let denied = while_open.iter().filter(|(_, d)| !d.allowed).count();
                checks.push(check(
                    "fail-open admits everything while Open",
                    denied == 0,
                    format!("{denied} of {} denied", while_open.len()),
                ));
            }
            1 if !while_open.is_empty() => {
                let admitted = while_open.iter().filter(|(_, d)| d.allowed).count();
                checks.push(check(
                    "fail-closed admits nothing while Open",
                    admitted == 0,
                    format!("{admitted} of {} admitted", while_open.len()),
                ));
            }
            2 if outage_s > 0.0 && sc.outage => {
                let admitted = while_open
                    .iter()
                    .filter(|(_, d)| d.allowed && d.t >= tl.fault_at && d.t < tl.healed_at)
                    .count() as f64;
                let r = judged_rules(sc.edge)[0];
                let per_s = r.limit as f64 * 1e6 / r.period_us as f64;
                row.outage_ratio = Some(admitted / (per_s * ctx.keys as f64 * outage_s));
            }
            _ => {}
        }
        policies.push(row);
    }

    // Local fallback shares the limit: per key, per 1 s window wholly inside an
    // interval where every live app was Open.
    if sc.edge {
        edge_windows(ctx, &all, &mut checks);
    } else if sc.outage {
        let window_limit = judged_rules(false)[0].limit;
        let mut per: HashMap<(usize, u64), u64> = HashMap::new();
        let mut windows_ok: HashMap<u64, bool> = HashMap::new();
        for (a, d) in all.iter().filter(|(_, d)| d.stream == 2) {
            let w = (tl.start_unix_us + d.t) / 1_000_000;
            if d.allowed {
                *per.entry((d.key, w)).or_default() += 1;
            }
            let open = logs[*a].open_around(d.t, margin) && d.tier != Tier::Redis;
            let e = windows_ok.entry(w).or_insert(true);
            *e = *e && open;
        }
        // Every decision of such a window was local and made while Open.
        let full: Vec<u64> = windows_ok
            .iter()
            .filter(|(_, ok)| **ok)
            .map(|(w, _)| *w)
            .collect();
        let apps = ctx.apps;
        let worst = per
            .iter()
            .filter(|((_, w), _)| full.contains(w))
            .map(|(_, n)| *n)
            .max();
        let bound = format!(
            "local fallback: at most limit + instances = {} per key per window across the apps",
            window_limit + apps
        );
        match worst {
            Some(n) => checks.push(check(
                bound,
                n <= window_limit + apps,
                format!(
                    "worst window {n} (a naive fallback could admit {})",
                    window_limit * apps
                ),
            )),
            None => checks.push(na(bound, "no whole window inside the outage")),
        }
    }

    if sc.cluster {
        cluster_checks(ctx, logs, &all, &mut checks);
    }

    // Trip and recovery per app that was alive at the fault.
    let (mut trip_ms, mut recover_ms) = (None::<f64>, None::<f64>);
    let mut notes = Vec::new();
    let mut judged_as_hang = false;
    if sc.outage {
        for (a, log) in logs.iter().enumerate() {
            let killed_at = tl.killed.iter().find(|(k, _)| *k == a).map(|(_, t)| *t);
            if killed_at.is_some_and(|k| k <= tl.fault_at) {
                continue;
            }
            // What this app's own calls met before it tripped (item 15: in
            // docker a killed Redis may send no reset, and the apps then see
            // a hang, not a refusal).
            let opened = log.first("open", tl.fault_at);
            let mut seen: BTreeMap<String, u64> = BTreeMap::new();
            for d in log
                .decisions
                .iter()
                .filter(|d| d.t + d.lat >= tl.fault_at && opened.is_none_or(|o| d.t <= o))
            {
                if let Some(f) = d.failure {
                    *seen.entry(format!("{f:?}")).or_default() += 1;
                }
            }
            let timed_out = seen.contains_key("Timeout");
            let trip_bound = if sc.fast_trip && !timed_out {
                200_000
            } else {
                500_000
            };
            let seen_text = if seen.is_empty() {
                "no failed call".to_string()
            } else {
                seen.iter()
                    .map(|(k, v)| format!("{v} {k}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            match opened {
                Some(t) => {
                    let trip = trip_after(&all, tl.fault_at, t);
                    trip_ms = Some(trip_ms.unwrap_or(0.0).max(trip as f64 / 1e3));
                    let as_hang = sc.fast_trip && timed_out;
                    judged_as_hang |= as_hang;
                    notes.push(format!(
                        "app {a}: open {:.1} ms after the fault was asked for, {:.1} ms after Redis last answered; its calls met {seen_text}{}",
                        (t - tl.fault_at) as f64 / 1e3,
                        trip as f64 / 1e3,
                        if as_hang {
                            "; timeouts: judged as a hang (500 ms), not as a refusal (200 ms)"
                        } else {
                            ""
                        }
                    ));
                    if trip > trip_bound {
                        checks.push(check(
                            format!("app {a} trips within {} ms", trip_bound / 1_000),
                            false,
                            format!("{:.1} ms ({seen_text})", trip as f64 / 1e3),
                        ));
                    }
                }
                None => checks.push(check(
                    format!("app {a} trips within {} ms", trip_bound / 1_000),
                    false,
                    format!("never tripped ({seen_text})"),
                )),
            }
            if killed_at.is_some() {
                continue;
            }
            // The cool-down in force when Redis returned, plus one probe.
            let Some(last) = log
                .states
                .iter()
                .take_while(|l| l.at <= tl.healed_at)
                .last()
                .filter(|l| l.state != "closed")
            else {
                // Closed again before the heal was recorded: a docker action
                // lands before its command returns, so Redis was back earlier.
                recover_ms = Some(recover_ms.unwrap_or(0.0));
                continue;
            };
            let limit = recovery_bound(
                last,
                log.probe_in_flight(tl.healed_at, deadline_us),
                tl.healed_at,
                deadline_us,
                ctx.max_cool_down_ms * 1_000,
            );
            match log.first("closed", tl.healed_at.saturating_sub(1)) {
                Some(t) => {
                    recover_ms = Some(
                        recover_ms
                            .unwrap_or(0.0)
                            .max(t.saturating_sub(tl.healed_at) as f64 / 1e3),
                    );
                    if t > limit {
                        checks.push(check(
                            format!("app {a} closes within its cool-down + one probe"),
                            false,
                            format!(
                                "closed {:.1} ms after Redis returned, bound {:.1} ms; {}",
                                (t - tl.healed_at) as f64 / 1e3,
                                (limit - tl.healed_at) as f64 / 1e3,
                                after_heal(log, tl.healed_at, t)
                            ),
                        ));
                    }
                }
                None => checks.push(check(
                    format!("app {a} closes after Redis returns"),
                    false,
                    "never closed",
                )),
            }
        }
        if let (Some(t), Some(r)) = (trip_ms, recover_ms) {
            let trip_bound = match (sc.fast_trip, judged_as_hang) {
                (false, _) => "500 ms".to_string(),
                (true, false) => "200 ms".to_string(),
                (true, true) => {
                    "200 ms (500 ms for an app whose calls timed out: it saw a hang, see the notes)"
                        .to_string()
                }
            };
            checks.push(check(
                format!(
                    "every app trips within {trip_bound} of the fault landing and recovers within cool-down + one probe"
                ),
                !checks
                    .iter()
                    .any(|c| c.bound.starts_with("app ") && c.verdict == "FAIL"),
                format!("slowest trip {t:.1} ms, slowest recovery {r:.1} ms"),
            ));
        }
    }

    if sc.outage {
        judge_returns_between(ctx, logs, &all, &mut checks);
    }
    judge_open_while_down(ctx, logs, &mut checks);
    if !sc.cluster {
        judge_redis_again(ctx, logs, &mut checks);
    }

    // Reconciliation: Redis holds every unit admitted for the natural-day rule.
    let reconciled: u64 = logs.iter().filter_map(|l| l.last).map(|f| f[0]).sum();
    let dropped: u64 = logs
        .iter()
        .filter_map(|l| l.last)
        .map(|f| f[1] + f[2])
        .sum();
    let pending: u64 = logs.iter().filter_map(|l| l.last).map(|f| f[3]).sum();
    let counts = reconcile_counts(ctx, &all);
    let lost_note = if tl.killed.is_empty() {
        ""
    } else {
        "; a killed app's undrained ledger dies with it"
    };
    checks.push(check(
        "after recovery Redis holds every unit admitted (live windows), none twice",
        counts.is_ok() && pending == 0,
        match counts {
            Ok((slack, unlogged)) => format!(
                "{} keys match ({slack} units of slack used, {unlogged} by killed apps' unlogged checks), {reconciled} units reconciled, {pending} pending{lost_note}",
                ctx.keys
            ),
            Err(off) => off,
        },
    ));

    if let Some(longest) = longest_stall {
        let first: Vec<String> = tl
            .stalls
            .iter()
            .take(5)
            .map(|s| {
                format!(
                    "{:.2} s for {:.1} ms",
                    s.from.as_secs_f64(),
                    s.length().as_secs_f64() * 1e3
                )
            })
            .collect();
        notes.push(format!(
            "stalls of the machine the controller's clock saw: {} (longest {:.1} ms): {}{}",
            tl.stalls.len(),
            longest.as_secs_f64() * 1e3,
            first.join(", "),
            if tl.stalls.len() > first.len() {
                ", ..."
            } else {
                ""
            }
        ));
    }

    // Chart series: decisions per 250 ms by tier.
    let mut buckets: BTreeMap<(u64, &'static str), u64> = BTreeMap::new();
    for (_, d) in &all {
        *buckets.entry((d.t / 250_000, d.tier.as_str())).or_default() += 1;
    }
    let series = buckets
        .into_iter()
        .map(|((b, tier), n)| (b as f64 * 0.25, tier.to_string(), n * 4))
        .collect();

    ScenarioResult {
        scenario: sc.name.to_string(),
        about: sc.about.to_string(),
        driver: ctx.driver.to_string(),
        policies,
        trip_ms,
        recover_ms,
        reconciled_units: reconciled,
        dropped_units: dropped,
        checks,
        series,
        fault_window: (tl.fault_at as f64 / 1e6, tl.healed_at as f64 / 1e6),
        notes,
    }
}

/// The edge scenarios' bound: for each fixed-window rule of the local-fallback
/// stream, every window of the run (not only those wholly inside an outage:
/// over-admission at an outage's start or end, or at an app's start, shows in
/// the windows that straddle it) admits at most `limit + instances` per key
/// across the apps. The one exception: a window in which Redis lost its data
/// (a kill) and then answered again (a check begun after the kill surely
/// landed) has forgotten what it admitted before, which no limiter can make
/// up for; it is left out and counted.
fn edge_windows(ctx: &Context<'_>, all: &[(usize, &Decision)], checks: &mut Vec<Check>) {
    let tl = &ctx.timeline;
    for rule in judged_rules(true) {
        let win = |t: u64| (tl.start_unix_us + t) / rule.period_us;
        let bound_n = rule.limit + ctx.apps;
        let mut forgot = std::collections::HashSet::new();
        for (_, done) in &tl.redis_losses {
            // A check begun after `done` is in `asked`'s window only if
            // `done` is too.
            let w = win(*done);
            if all.iter().any(|(_, d)| {
                d.stream == 2 && d.tier == Tier::Redis && d.t >= *done && win(d.t) == w
            }) {
                forgot.insert(w);
            }
        }
        let mut per: BTreeMap<(u64, usize), u64> = BTreeMap::new();
        for (_, d) in all.iter().filter(|(_, d)| d.stream == 2) {
            let e = per.entry((win(d.t), d.key)).or_default();
            *e += u64::from(d.allowed);
        }
        let judged: Vec<(&(u64, usize), &u64)> = per
            .iter()
            .filter(|((w, _), _)| !forgot.contains(w))
            .collect();
        let bound = format!(
            "local fallback, {}: at most limit + instances = {bound_n} per key in every window across the apps",
            rule.name
        );
        let window_s = |w: u64| (w * rule.period_us).saturating_sub(tl.start_unix_us) as f64 / 1e6;
        let over: Vec<String> = judged
            .iter()
            .filter(|(_, n)| **n > bound_n)
            .map(|((w, k), n)| format!("{n} (key {k}, window from {:.1} s)", window_s(*w)))
            .collect();
        let left_out = if forgot.is_empty() {
            String::new()
        } else {
            format!(
                "; {} window(s) left out: Redis lost its data in them and answered again",
                forgot.len()
            )
        };
        match judged.iter().max_by_key(|(_, n)| **n) {
            Some(((w, k), n)) => checks.push(check(
                bound,
                over.is_empty(),
                if over.is_empty() {
                    format!(
                        "worst window {n} (key {k}, from {:.1} s) of {} key-windows{left_out}",
                        window_s(*w),
                        judged.len()
                    )
                } else {
                    format!(
                        "{} of {} key-windows over: {}{left_out}",
                        over.len(),
                        judged.len(),
                        over.join(", ")
                    )
                },
            )),
            None => checks.push(na(bound, format!("no window to judge{left_out}"))),
        }
    }
}

/// What one app's breaker and calls did from Redis' return (`healed`) to
/// its close at `closed` (µs), for a recovery that took too long: each state
/// with its time from the return, and the failures of its calls meanwhile.
fn after_heal(log: &AppLog, healed: u64, closed: u64) -> String {
    let states: Vec<String> = log
        .states
        .iter()
        .filter(|l| l.at + 1 >= healed && l.at <= closed)
        .map(|l| {
            format!(
                "{} at +{:.1} ms",
                l.state,
                l.at.saturating_sub(healed) as f64 / 1e3
            )
        })
        .collect();
    let mut failures: BTreeMap<String, u64> = BTreeMap::new();
    for d in log
        .decisions
        .iter()
        .filter(|d| d.t >= healed && d.t <= closed)
    {
        if let Some(f) = d.failure {
            *failures.entry(format!("{f:?}")).or_default() += 1;
        }
    }
    let failures: Vec<String> = failures.iter().map(|(k, n)| format!("{n} {k}")).collect();
    format!(
        "breaker {}; calls begun meanwhile failed: {}",
        if states.is_empty() {
            "unchanged".to_string()
        } else {
            states.join(", ")
        },
        if failures.is_empty() {
            "none".to_string()
        } else {
            failures.join(", ")
        }
    )
}

/// The cluster scenarios' bounds (issue 14): a fault on one master of three
/// leaves the other masters' keys on Redis and the breakers closed; the
/// victim's keys follow their policy while no master serves them and are back
/// on Redis soon after the replica is promoted; the local fallback shares the
/// limit for them as in a whole outage.
fn cluster_checks(
    ctx: &Context<'_>,
    logs: &[AppLog],
    all: &[(usize, &Decision)],
    checks: &mut Vec<Check>,
) {
    let tl = &ctx.timeline;
    let victim = |d: &Decision| ctx.victim_keys.contains(&(d.stream, d.key));

    let opened: Vec<String> = logs
        .iter()
        .enumerate()
        .filter_map(|(a, l)| {
            l.first("open", 0)
                .map(|t| format!("app {a} at {:.2} s", t as f64 / 1e6))
        })
        .collect();
    checks.push(check(
        "no app's breaker opens: one master's fault is not an outage",
        opened.is_empty(),
        if opened.is_empty() {
            format!("{} apps stayed closed", logs.len())
        } else {
            format!("opened: {}", opened.join(", "))
        },
    ));

    // Each master has its own connections in the tier: a check of another
    // master's key never waits on the failed one, so it never falls back.
    let healthy: Vec<&(usize, &Decision)> = all.iter().filter(|(_, d)| !victim(d)).collect();
    let off: Vec<&&(usize, &Decision)> = healthy
        .iter()
        .filter(|(_, d)| d.tier.is_fallback())
        .collect();
    checks.push(check(
        "keys on the other masters stay on Redis: every decision by Redis or its denial cache",
        !healthy.is_empty() && off.is_empty(),
        format!(
            "{} of {} decisions fell back ({} keys on the other masters, {} on the failed one)",
            off.len(),
            healthy.len(),
            STREAMS.len() * ctx.keys - ctx.victim_keys.len(),
            ctx.victim_keys.len()
        ),
    ));

    let fallen: Vec<&(usize, &Decision)> = all
        .iter()
        .filter(|(_, d)| victim(d) && d.tier.is_fallback())
        .collect();
    let wrong = fallen
        .iter()
        .filter(|(_, d)| {
            !matches!(
                (d.stream, d.tier, d.allowed),
                (0, Tier::FailOpen, true) | (1, Tier::FailClosed, false) | (2, Tier::Local, _)
            )
        })
        .count();
    let by_stream = |s: usize| fallen.iter().filter(|(_, d)| d.stream == s).count();
    let bound = "keys on the failed master follow their policy while it fails over (fail-open admits, fail-closed denies, local-fallback decides locally)";
    if fallen.is_empty() {
        checks.push(na(bound, "no decision of theirs fell back"));
    } else {
        checks.push(check(
            bound,
            wrong == 0,
            format!(
                "{wrong} of {} fallback decisions off policy ({} fail-open, {} fail-closed, {} local-fallback)",
                fallen.len(),
                by_stream(0),
                by_stream(1),
                by_stream(2)
            ),
        ));
    }
    // Decided before the fault: a check in flight when the master was hit
    // (its call lost with the master's connection) falls back by right.
    let early = fallen
        .iter()
        .filter(|(_, d)| d.t + d.lat < tl.fault_at)
        .count();
    if early > 0 {
        checks.push(check(
            "no decision falls back before the fault",
            false,
            format!("{early} did"),
        ));
    }

    match tl.promoted_at {
        None => checks.push(check(
            "the victim's replica is promoted",
            false,
            "the controller never saw it serve the victim's slots",
        )),
        Some(promoted) => {
            checks.push(check(
                "the victim's replica is promoted",
                true,
                format!(
                    "serving {:.2} s after the fault",
                    promoted.saturating_sub(tl.fault_at) as f64 / 1e6
                ),
            ));
            let last_fallback = fallen.iter().map(|(_, d)| d.t).max();
            let back = all
                .iter()
                .filter(|(_, d)| victim(d) && !d.tier.is_fallback() && d.t > promoted)
                .count();
            let late = last_fallback.is_some_and(|t| t > promoted + BACK_ON_REDIS_US);
            checks.push(check(
                format!(
                    "the failed master's keys are back on Redis within {} ms of the promotion",
                    BACK_ON_REDIS_US / 1_000
                ),
                !late && back > 0,
                format!(
                    "last fallback {}, then {back} decisions by Redis",
                    last_fallback.map_or("none".to_string(), |t| format!(
                        "{:+.0} ms from the promotion",
                        (t as f64 - promoted as f64) / 1e3
                    ))
                ),
            ));
        }
    }

    // The local fallback shares the limit for the victim's keys: per key and
    // window in which every local-fallback decision of the key fell back.
    let rule = judged_rules(false)[0];
    let mut per: BTreeMap<(usize, u64), (u64, bool)> = BTreeMap::new();
    for (_, d) in all.iter().filter(|(_, d)| d.stream == 2 && victim(d)) {
        let w = (tl.start_unix_us + d.t) / rule.period_us;
        let e = per.entry((d.key, w)).or_insert((0, true));
        e.0 += u64::from(d.allowed);
        e.1 &= d.tier.is_fallback();
    }
    let bound_n = rule.limit + ctx.apps;
    let judged: Vec<u64> = per
        .values()
        .filter(|(_, local)| *local)
        .map(|(n, _)| *n)
        .collect();
    let bound = format!(
        "local fallback on the failed master's keys: at most limit + instances = {bound_n} per key per window decided wholly locally"
    );
    match judged.iter().max() {
        Some(worst) => checks.push(check(
            bound,
            *worst <= bound_n,
            format!("worst window {worst} of {} judged", judged.len()),
        )),
        None => checks.push(na(bound, "no key had a whole window decided locally")),
    }
}

/// No breaker that opened while Redis was surely down closes before Redis
/// was asked back: such a close is a probe that succeeded against nothing
/// (a probe that only connects, say, to a paused server whose kernel still
/// accepts), and the breaker then cycles through timeouts for the whole
/// outage while every other bound passes. (A close that an answer sent
/// before the break explains comes before any open in the stretch.)
fn judge_open_while_down(ctx: &Context<'_>, logs: &[AppLog], checks: &mut Vec<Check>) {
    const BOUND: &str = "no app closes while Redis is down";
    let down = &ctx.timeline.down;
    if down.is_empty() {
        return;
    }
    let mut opened = 0;
    let mut closed = Vec::new();
    for (a, log) in logs.iter().enumerate() {
        for &(from, to) in down {
            let in_stretch = |l: &&StateLine| l.at >= from && l.at < to;
            let Some(open) = log
                .states
                .iter()
                .filter(in_stretch)
                .find(|l| l.state == "open")
            else {
                continue;
            };
            opened += 1;
            if let Some(c) = log
                .states
                .iter()
                .filter(in_stretch)
                .find(|l| l.at > open.at && l.state == "closed")
            {
                closed.push(format!(
                    "app {a} closed at +{:.1} ms, Redis down from +{:.1} to +{:.1} ms",
                    c.at as f64 / 1e3,
                    from as f64 / 1e3,
                    to as f64 / 1e3
                ));
            }
        }
    }
    checks.push(match (opened, closed.is_empty()) {
        (0, _) => na(BOUND, "no app opened while Redis was down"),
        (_, true) => check(
            BOUND,
            true,
            format!("{opened} open breaker(s) stayed open until Redis was asked back"),
        ),
        (_, false) => check(BOUND, false, closed.join("; ")),
    });
}

/// What shows that the fault did what it says and that every app came back
/// to Redis: with no admission bound of their own, a run in which a limiter
/// stayed on its fallback after a restart, or in which the latency was never
/// applied, passed.
///
/// * Every app still running at the end has Redis (or its denial cache)
///   decide again after the heal: a limiter stuck on its fallback fails.
/// * A `Latency` fault below the deadline slowed Redis' decisions made
///   under it: their median is at least the round trip it adds.
/// * An app killed once it closed after the heal closed before its kill.
fn judge_redis_again(ctx: &Context<'_>, logs: &[AppLog], checks: &mut Vec<Check>) {
    let tl = &ctx.timeline;
    let mut stuck = Vec::new();
    for (a, log) in logs.iter().enumerate() {
        if tl.killed.iter().any(|(k, _)| *k == a) || log.last.is_none() {
            continue;
        }
        let again = log
            .decisions
            .iter()
            .any(|d| d.t >= tl.healed_at && matches!(d.tier, Tier::Redis | Tier::DenyCache));
        if !again {
            stuck.push(a.to_string());
        }
    }
    checks.push(check(
        "every app decides on Redis again after the heal",
        stuck.is_empty(),
        if stuck.is_empty() {
            "every app still running did".to_string()
        } else {
            format!("app(s) {} never did", stuck.join(", "))
        },
    ));
    // Past the deadline, no call is answered under it: the trip is judged.
    if let Some(ms) = tl.latency_ms.filter(|ms| 2 * ms < ctx.deadline_ms) {
        let mut lat: Vec<u64> = logs
            .iter()
            .flat_map(|l| &l.decisions)
            .filter(|d| d.tier == Tier::Redis && d.t >= tl.fault_at && d.t + d.lat < tl.healed_at)
            .map(|d| d.lat)
            .collect();
        lat.sort_unstable();
        let round_trip = 2 * ms * 1_000;
        let bound = format!(
            "the latency fault applied: Redis' decisions take {} ms or more (median)",
            2 * ms
        );
        match lat.get(lat.len() / 2) {
            Some(&median) => checks.push(check(
                bound,
                median >= round_trip,
                format!(
                    "median {:.1} ms over {} decisions",
                    median as f64 / 1e3,
                    lat.len()
                ),
            )),
            None => checks.push(check(bound, false, "no decision by Redis under the fault")),
        }
        // Answered within the deadline and under the slow-call threshold,
        // Redis decides throughout: a breaker that opened on such answers
        // (a threshold below the round trip) put the fleet on its fallback
        // while Redis was healthy, and every other bound passed.
        let decided: Vec<&Decision> = logs
            .iter()
            .flat_map(|l| &l.decisions)
            .filter(|d| d.t >= tl.fault_at && d.t < tl.healed_at)
            .collect();
        let fell_back = decided.iter().filter(|d| d.tier.is_fallback()).count();
        checks.push(check(
            "a latency under the deadline keeps every decision on Redis (no fallback)",
            !decided.is_empty() && fell_back == 0,
            format!(
                "{fell_back} of {} decisions under the fault fell back",
                decided.len()
            ),
        ));
    }
    if let Some(closed) = tl.killed_after_close {
        checks.push(check(
            "the app killed mid-drain closed after the heal before its kill",
            closed,
            if closed {
                "it closed first"
            } else {
                "it never closed: killed after 5 s of waiting"
            },
        ));
        // Its log ends where it died: what it last said it owed since its
        // last close is what the kill took from it, so the kill did land
        // mid-drain. (A line from before the outage says nothing.)
        let owed = tl
            .killed
            .last()
            .and_then(|(i, _)| logs.get(*i))
            .and_then(|log| {
                let closed = log.states.iter().rev().find(|l| l.state == "closed")?.at;
                log.pending.last().copied().filter(|(t, _)| *t >= closed)
            });
        checks.push(check(
            "the app killed mid-drain still owed units when it died",
            owed.is_some_and(|(_, units)| units > 0),
            match owed {
                Some((t, units)) => format!(
                    "its last report, at {:.3} s: {units} units owed",
                    t as f64 / 1e6
                ),
                None => "it reported nothing owed after the heal".to_string(),
            },
        ));
    }
}

/// How long (µs) a breaker seen Open at `opened` took to trip after a fault
/// asked for at `fault_at`: counted from Redis' last answer to any check in
/// between. The fault cannot have landed before that answer (a `docker kill`
/// or `pause` lands 50-300 ms after it is asked for); never less than the
/// true trip.
fn trip_after(all: &[(usize, &Decision)], fault_at: u64, opened: u64) -> u64 {
    let last_answer = all
        .iter()
        .filter(|(_, d)| d.tier == Tier::Redis && d.t >= fault_at && d.t < opened)
        .map(|(_, d)| d.t)
        .max()
        .unwrap_or(fault_at);
    opened - last_answer
}

/// The breaker across each return of Redis within the fault phase and the
/// break after it (a second outage, a crash loop), where only the first
/// break and the last return were judged: a breaker that never tripped again
/// after its first close passed. Each app that was Open when Redis returned
/// closes within its cool-down and one probe (when the return lasted that
/// long), and each app Closed when Redis broke again trips within 500 ms of
/// Redis' last answer (200 ms for a fast-trip fault its calls did not time
/// out on), when the break lasted a second or more.
fn judge_returns_between(
    ctx: &Context<'_>,
    logs: &[AppLog],
    all: &[(usize, &Decision)],
    checks: &mut Vec<Check>,
) {
    let tl = &ctx.timeline;
    let deadline_us = ctx.deadline_ms * 1_000;
    for (n, rb) in tl.returns_between.iter().enumerate() {
        let n = n + 1;
        for (a, log) in logs.iter().enumerate() {
            if tl.killed.iter().any(|(k, t)| *k == a && *t <= rb.ended_at) {
                continue;
            }
            // Closed within the return.
            let open_at_return = log
                .states
                .iter()
                .take_while(|l| l.at <= rb.returned_at)
                .last()
                .filter(|l| l.state != "closed");
            if let Some(last) = open_at_return {
                let limit = recovery_bound(
                    last,
                    log.probe_in_flight(rb.returned_at, deadline_us),
                    rb.returned_at,
                    deadline_us,
                    ctx.max_cool_down_ms * 1_000,
                );
                let closed = log.first("closed", rb.returned_at);
                if limit <= rb.broke_at && closed.is_none_or(|t| t > limit) {
                    checks.push(check(
                        format!("app {a} closes within its cool-down + one probe after return {n}"),
                        false,
                        format!(
                            "{}, bound {:.1} ms",
                            closed.map_or(
                                "never closed before Redis broke again".to_string(),
                                |t| {
                                    format!(
                                        "closed {:.1} ms after",
                                        (t - rb.returned_at) as f64 / 1e3
                                    )
                                }
                            ),
                            (limit - rb.returned_at) as f64 / 1e3
                        ),
                    ));
                }
            }
            // Tripped in the break after it.
            if rb.ended_at.saturating_sub(rb.broke_at) < 1_000_000
                || log.state_at(rb.broke_at) != "closed"
            {
                continue;
            }
            let opened = log.first("open", rb.broke_at).filter(|t| *t < rb.ended_at);
            let timed_out = log.decisions.iter().any(|d| {
                d.t + d.lat >= rb.broke_at
                    && opened.is_none_or(|o| d.t <= o)
                    && d.failure == Some(RedisFailure::Timeout)
            });
            let bound = if ctx.scenario.fast_trip && !timed_out {
                200_000
            } else {
                500_000
            };
            let name = format!(
                "app {a} trips within {} ms of break {}",
                bound / 1_000,
                n + 1
            );
            match opened {
                Some(t) => {
                    let trip = trip_after(all, rb.broke_at, t);
                    if trip > bound {
                        checks.push(check(name, false, format!("{:.1} ms", trip as f64 / 1e3)));
                    }
                }
                None => checks.push(check(name, false, "never tripped")),
            }
        }
    }
    if !tl.returns_between.is_empty() {
        let broken = checks.iter().any(|c| {
            c.verdict == "FAIL"
                && (c.bound.contains("after return") || c.bound.contains("of break"))
        });
        checks.push(check(
            "every app closes after each return of Redis and trips again at each break after it",
            !broken,
            format!("{} return(s) within the fault", tl.returns_between.len()),
        ));
    }
}

/// By when (µs) an app whose breaker was last seen as `last` (not closed)
/// when Redis returned at `healed_at` must close: the probe then due, or
/// once a probe in flight failed, one more cool-down and probe; 100 ms of
/// slack. The probe's due time is the app's own word, so it is held to the
/// longest cool-down after the app saw it open: a breaker whose cool-down
/// outgrew its cap moved the bound with it, and passed.
fn recovery_bound(
    last: &StateLine,
    probe_in_flight: bool,
    healed_at: u64,
    deadline_us: u64,
    max_cool_down_us: u64,
) -> u64 {
    let slack = 100_000;
    if last.state == "open" && !probe_in_flight {
        let due = last
            .due
            .unwrap_or(healed_at)
            .min(last.at + max_cool_down_us);
        due.max(healed_at) + deadline_us + slack
    } else {
        healed_at + 2 * deadline_us + max_cool_down_us + slack
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decision(tier: Tier, allowed: bool, maybe_ran: bool) -> Decision {
        Decision {
            t: 1,
            lat: 100,
            stream: 2,
            tier,
            allowed,
            key: 0,
            maybe_ran,
            failure: None,
        }
    }

    /// Judges one run's counts: `killed` apps with 4 checks in flight each.
    fn counts(
        decisions: &[Decision],
        killed: usize,
        redis_holds: &[u64],
    ) -> Result<(u64, u64), String> {
        let scenario = &crate::scenario::all(1_000, 50)[0];
        let ctx = Context {
            scenario,
            driver: "test",
            deadline_ms: 50,
            max_cool_down_ms: 500,
            keys: redis_holds.len(),
            apps: 3,
            timeline: Timeline {
                killed: (0..killed).map(|a| (a + 10, 1)).collect(),
                ..Timeline::default()
            },
            in_flight: 4,
            redis_counts: redis_holds.iter().copied().enumerate().collect(),
            victim_keys: HashSet::new(),
        };
        let all: Vec<_> = decisions.iter().map(|d| (0, d)).collect();
        reconcile_counts(&ctx, &all)
    }

    fn mismatch(decisions: &[Decision], redis_holds: u64) -> Option<String> {
        counts(decisions, 0, &[redis_holds]).err()
    }

    /// Whether a check whose bound names `bound` failed.
    fn fails(checks: &[Check], bound: &str) -> bool {
        checks
            .iter()
            .any(|c| c.verdict == "FAIL" && c.bound.contains(bound))
    }

    fn scenario_named(name: &str) -> crate::scenario::Scenario {
        crate::scenario::all(2_500, 50)
            .into_iter()
            .find(|s| s.name == name)
            .expect("the scenario")
    }

    /// A state line seen at `at`, polled 1 ms before; an open one's probe
    /// due 200 ms on.
    fn state_line(at: u64, state: &str) -> StateLine {
        StateLine {
            at,
            state: state.into(),
            due: (state == "open").then_some(at + 200_000),
            since: at - 1_000,
        }
    }

    /// One app of one key, 50 ms deadline, cool-downs up to 1 s.
    fn one_app<'a>(scenario: &'a crate::scenario::Scenario, timeline: Timeline) -> Context<'a> {
        Context {
            scenario,
            driver: "test",
            deadline_ms: 50,
            max_cool_down_ms: 1_000,
            keys: 1,
            apps: 1,
            timeline,
            in_flight: 4,
            redis_counts: HashMap::new(),
            victim_keys: HashSet::new(),
        }
    }

    /// An app that logged only `states`.
    fn states_only(states: Vec<StateLine>) -> [AppLog; 1] {
        [AppLog {
            states,
            ..AppLog::default()
        }]
    }

    /// The app killed after the heal must have died owing units: a kill that
    /// landed once its drain was done (a slow `docker kill`) tested nothing,
    /// and passed before.
    #[test]
    fn a_kill_after_the_drain_is_no_kill_mid_drain() {
        let scenario = scenario_named("app-killed-in-reconcile");
        let timeline = Timeline {
            killed: vec![(0, 5_000_000)],
            killed_after_close: Some(true),
            ..Timeline::default()
        };
        let ctx = one_app(&scenario, timeline);
        // Closed again at 3.9 s; (t, units owed) lines; whether it fails.
        for (owed, fails_it) in [
            (vec![(4_000_000, 300), (4_900_000, 12)], false),
            (vec![(4_000_000, 300), (4_900_000, 0)], true),
            (vec![], true),
            // Owed before the outage, nothing said since the close.
            (vec![(1_000_000, 300)], true),
        ] {
            let logs = [AppLog {
                pending: owed.clone(),
                states: vec![
                    state_line(2_000_000, "open"),
                    state_line(3_900_000, "closed"),
                ],
                ..AppLog::default()
            }];
            let mut checks = Vec::new();
            judge_redis_again(&ctx, &logs, &mut checks);
            assert_eq!(
                fails(&checks, "still owed units when it died"),
                fails_it,
                "{owed:?}: {checks:#?}"
            );
        }
    }

    /// A breaker that closed after Redis' first return but never tripped at
    /// its second break fails the run (before, only the first break and the
    /// last return were judged); one that trips in time passes.
    #[test]
    fn a_second_break_is_judged_too() {
        let scenario = scenario_named("second-outage-in-hour");
        let line = state_line;
        // Open at 0.3 s (its probe due at 0.5 s), closed at 1.1 s (Redis
        // back at 1 s: within 50 ms + 100 ms of slack), broken again at 5 s
        // until 7 s.
        let mut states = vec![line(300_000, "open"), line(1_100_000, "closed")];
        let judged = |states: &[StateLine]| {
            let ctx = one_app(
                &scenario,
                Timeline {
                    returns_between: vec![ReturnBetween {
                        returned_at: 1_000_000,
                        broke_at: 5_000_000,
                        ended_at: 7_000_000,
                    }],
                    ..Timeline::default()
                },
            );
            let mut checks = Vec::new();
            judge_returns_between(&ctx, &states_only(states.to_vec()), &[], &mut checks);
            checks
        };
        let never = judged(&states);
        assert!(
            never
                .iter()
                .any(|c| c.verdict == "FAIL" && c.measured == "never tripped"),
            "{never:?}"
        );
        states.push(line(5_300_000, "open"));
        let tripped = judged(&states);
        assert!(tripped.iter().all(|c| c.verdict == "PASS"), "{tripped:?}");
        // Closed only after that bound.
        states[1] = line(2_000_000, "closed");
        let late = judged(&states);
        assert!(fails(&late, "after return 1"), "{late:?}");
    }

    /// A breaker that closes while Redis is surely down fails the run: a
    /// probe that succeeded against nothing (and every other bound could
    /// pass while it cycled through timeouts). A close after Redis was asked
    /// back, or one before any open in the stretch, is no such close.
    #[test]
    fn a_breaker_that_closes_while_redis_is_down_fails() {
        let scenario = scenario_named("hang-redis");
        let line = state_line;
        let judged = |states: Vec<StateLine>| {
            let ctx = one_app(
                &scenario,
                Timeline {
                    down: vec![(1_000_000, 3_000_000)],
                    ..Timeline::default()
                },
            );
            let mut checks = Vec::new();
            judge_open_while_down(&ctx, &states_only(states), &mut checks);
            checks.remove(0).verdict
        };
        let early_close = vec![line(1_200_000, "open"), line(2_000_000, "closed")];
        assert_eq!(judged(early_close), "FAIL");
        let after = vec![line(1_200_000, "open"), line(3_100_000, "closed")];
        assert_eq!(judged(after), "PASS");
        // Closed by an answer to a call sent before the break, then opened.
        let before_open = vec![line(1_050_000, "closed"), line(1_200_000, "open")];
        assert_eq!(judged(before_open), "PASS");
        assert_eq!(judged(Vec::new()), "N/A");
    }

    /// An app that never decides on Redis after the heal fails the run, and
    /// so does a latency fault whose decisions were not slowed by it.
    #[test]
    fn a_limiter_left_on_its_fallback_and_a_latency_never_applied_fail() {
        let scenario = scenario_named("latency-below-deadline");
        let at = |t: u64, lat: u64, tier: Tier| Decision {
            t,
            lat,
            tier,
            ..decision(tier, true, false)
        };
        let judged = |decisions: Vec<Decision>| {
            let ctx = one_app(
                &scenario,
                Timeline {
                    fault_at: 1_000_000,
                    healed_at: 3_000_000,
                    latency_ms: Some(12),
                    ..Timeline::default()
                },
            );
            let logs = [AppLog {
                decisions,
                errors: Vec::new(),
                states: Vec::new(),
                last: Some([0; 6]),
                ..AppLog::default()
            }];
            let mut checks = Vec::new();
            judge_redis_again(&ctx, &logs, &mut checks);
            checks
        };
        let slowed = vec![
            at(1_500_000, 26_000, Tier::Redis),
            at(3_500_000, 1_000, Tier::Redis),
        ];
        assert!(judged(slowed).iter().all(|c| c.verdict == "PASS"));
        // A breaker that opened on answers under the deadline.
        let opened = vec![
            at(1_500_000, 26_000, Tier::Redis),
            at(1_600_000, 0, Tier::Local),
            at(3_500_000, 1_000, Tier::Redis),
        ];
        let checks = judged(opened);
        assert!(fails(&checks, "no fallback"), "{checks:?}");
        let unslowed = vec![
            at(1_500_000, 1_000, Tier::Redis),
            at(3_500_000, 1_000, Tier::Redis),
        ];
        let checks = judged(unslowed);
        assert!(fails(&checks, "latency"), "{checks:?}");
        let stuck = vec![
            at(1_500_000, 26_000, Tier::Redis),
            at(3_500_000, 10, Tier::Local),
        ];
        let checks = judged(stuck);
        assert!(fails(&checks, "Redis again"), "{checks:?}");
    }

    /// The probe's due time an app reports is held to its longest
    /// cool-down: reported 3 s after it saw the breaker open (max 1 s), the
    /// bound is that second, not the 3 s.
    #[test]
    fn a_probe_due_past_the_longest_cool_down_is_not_believed() {
        let open = |due| StateLine {
            at: 10_000_000,
            state: "open".into(),
            due: Some(due),
            since: 9_990_000,
        };
        let (healed, deadline, max) = (10_500_000, 50_000, 1_000_000);
        assert_eq!(
            recovery_bound(&open(10_800_000), false, healed, deadline, max),
            10_800_000 + 50_000 + 100_000
        );
        assert_eq!(
            recovery_bound(&open(13_000_000), false, healed, deadline, max),
            11_000_000 + 50_000 + 100_000
        );
    }

    #[test]
    fn every_admission_is_counted_exactly_once() {
        let log = [
            decision(Tier::Redis, true, false),
            decision(Tier::Local, true, false),
            decision(Tier::Local, false, false),
        ];
        assert_eq!(mismatch(&log, 2), None);
        let low = mismatch(&log, 1).expect("a lost unit is caught");
        assert!(low.contains("Redis holds 1, expected 2"), "{low}");
        assert!(
            mismatch(&log, 3).is_some(),
            "a unit counted twice is caught"
        );
    }

    #[test]
    fn a_call_that_may_have_run_allows_one_more_unit() {
        // A fail-closed denial after a reset: the script may have run.
        let denied = [
            decision(Tier::Redis, true, false),
            decision(Tier::FailClosed, false, true),
        ];
        assert_eq!(mismatch(&denied, 1), None);
        assert_eq!(mismatch(&denied, 2), None);
        assert!(mismatch(&denied, 3).is_some());
        // A local admission after a reset, reconciled too: counted twice at most.
        let admitted = [decision(Tier::Local, true, true)];
        assert_eq!(mismatch(&admitted, 2), None);
        assert!(
            mismatch(&admitted, 0).is_some(),
            "the admission itself is owed"
        );
    }

    /// The latency bound's check for one decision from 1 s taking `lat_ms`
    /// (deadline 50 ms, so the bound is 65 ms), with the machine stalled over
    /// `stalls` (ms since the run's start).
    fn latency_check(lat_ms: f64, stalls: &[(f64, f64)]) -> Check {
        let scenario = &crate::scenario::all(1_000, 50)[0];
        let ms = |v: f64| (v * 1e3) as u64;
        let ctx = Context {
            scenario,
            driver: "test",
            deadline_ms: 50,
            max_cool_down_ms: 500,
            keys: 1,
            apps: 1,
            timeline: Timeline {
                stalls: stalls
                    .iter()
                    .map(|&(from, to)| Stall {
                        from: Duration::from_micros(ms(from)),
                        to: Duration::from_micros(ms(to)),
                    })
                    .collect(),
                ..Timeline::default()
            },
            in_flight: 4,
            redis_counts: HashMap::new(),
            victim_keys: HashSet::new(),
        };
        let log = AppLog {
            decisions: vec![Decision {
                t: 1_000_000,
                lat: ms(lat_ms),
                stream: 0,
                ..decision(Tier::FailOpen, true, false)
            }],
            ..AppLog::default()
        };
        judge(&ctx, &[log])
            .checks
            .into_iter()
            .find(|c| c.bound.starts_with("every decision within deadline"))
            .expect("the latency bound is judged")
    }

    #[test]
    fn a_machine_stall_excuses_only_a_decision_that_ended_in_it() {
        // 67.5 ms with no stall: over the bound.
        let alone = latency_check(67.5, &[]);
        assert_eq!(alone.verdict, "FAIL", "{alone:?}");
        assert_eq!(
            alone.measured,
            "max 67.5 ms over 1 decisions; the machine never stalled"
        );
        // The machine stopped from 1,050 to 1,066 ms and the decision came
        // back 1.5 ms later: 51.5 ms of it are the limiter's.
        let stalled = latency_check(67.5, &[(1_050.0, 1_066.0)]);
        assert_eq!(stalled.verdict, "PASS", "{stalled:?}");
        assert!(
            stalled
                .measured
                .starts_with("max 51.5 ms over 1 decisions less the machine's stalls")
                && stalled.measured.contains("67.5 ms as logged"),
            "{stalled:?}"
        );
        // The same stall in the middle of a wait held nothing up: the
        // decision's own timers ran on through it.
        let earlier = latency_check(67.5, &[(1_020.0, 1_036.0)]);
        assert_eq!(earlier.verdict, "FAIL", "{earlier:?}");
        assert!(
            earlier
                .measured
                .ends_with("; the longest stall of the machine: 16.0 ms"),
            "{earlier:?}"
        );
        // A stall too short to explain the excess leaves it over the bound.
        let short = latency_check(90.0, &[(1_080.0, 1_087.0)]);
        assert_eq!(short.verdict, "FAIL", "{short:?}");
        assert!(short.measured.starts_with("max 83.0 ms"), "{short:?}");
    }

    /// Judges `decisions` (local-fallback stream, key 0) with the edge bound.
    fn edge(decisions: &[Decision], losses: Vec<(u64, u64)>) -> Vec<Check> {
        let scenario = crate::scenario::all(1_000, 50)
            .into_iter()
            .find(|s| s.name == "crash-loop")
            .expect("the crash loop exists");
        let ctx = Context {
            scenario: &scenario,
            driver: "test",
            deadline_ms: 50,
            max_cool_down_ms: 500,
            keys: 1,
            apps: 3,
            timeline: Timeline {
                redis_losses: losses,
                ..Timeline::default()
            },
            in_flight: 4,
            redis_counts: HashMap::new(),
            victim_keys: HashSet::new(),
        };
        let all: Vec<_> = decisions.iter().map(|d| (0, d)).collect();
        let mut checks = Vec::new();
        edge_windows(&ctx, &all, &mut checks);
        checks
    }

    fn at(t: u64, tier: Tier) -> Decision {
        Decision {
            t,
            ..decision(tier, true, false)
        }
    }

    #[test]
    fn a_window_straddling_an_outage_is_held_to_limit_plus_instances() {
        // 61 by Redis and 4 locally in one 2 s window: 65 > 61 + 3.
        let mut log: Vec<Decision> = (0..61).map(|i| at(i * 1_000, Tier::Redis)).collect();
        log.extend((0..4).map(|i| at(1_000_000 + i, Tier::Local)));
        let checks = edge(&log, vec![]);
        assert_eq!(checks[0].verdict, "FAIL", "{:?}", checks[0]);
        assert!(checks[0].measured.contains("65 (key 0"), "{:?}", checks[0]);
        log.pop();
        assert_eq!(edge(&log, vec![])[0].verdict, "PASS");
    }

    #[test]
    fn a_window_in_which_redis_forgot_its_count_is_left_out() {
        // Redis admits 61, is killed, comes back empty and admits 61 again in
        // the same window: no limiter could know.
        let mut log: Vec<Decision> = (0..61).map(|i| at(i * 1_000, Tier::Redis)).collect();
        log.extend((0..61).map(|i| at(1_000_000 + i * 1_000, Tier::Redis)));
        let checks = edge(&log, vec![(500_000, 600_000)]);
        assert_eq!(checks[0].verdict, "N/A", "{:?}", checks[0]);
        assert!(checks[0].measured.contains("1 window(s) left out"));
        // Without the kill the same log over-admits.
        assert_eq!(edge(&log, vec![])[0].verdict, "FAIL");
        // Answers begun before the kill surely landed came from the Redis
        // that was killed: they do not leave the window out (they did).
        let mut before_kill: Vec<Decision> = (0..61).map(|i| at(i * 1_000, Tier::Redis)).collect();
        before_kill.extend((0..61).map(|i| at(520_000 + i * 1_000, Tier::Redis)));
        assert_eq!(
            edge(&before_kill, vec![(500_000, 600_000)])[0].verdict,
            "FAIL"
        );
    }

    #[test]
    fn the_log_names_each_checks_failure() {
        let path = std::env::temp_dir().join(format!("chaos-log-{}.log", std::process::id()));
        std::fs::write(
            &path,
            "d,1,2,2,L,1,0,1,Timeout\nd,3,4,2,L,1,0,1,ConnectionLost\nd,5,6,2,R,1,0,0,-\nd,7,8,2,R,1,0,0\n",
        )
        .expect("temp file");
        let log = AppLog::read(&path);
        let _ = std::fs::remove_file(&path);
        let failures: Vec<_> = log.decisions.iter().map(|d| d.failure).collect();
        assert_eq!(
            failures,
            [
                Some(RedisFailure::Timeout),
                Some(RedisFailure::ConnectionLost),
                None,
                None
            ]
        );
    }

    #[test]
    fn a_killed_apps_unlogged_checks_are_slack_over_all_keys_together() {
        // No decisions logged; one killed app had 4 checks in flight.
        assert_eq!(counts(&[], 1, &[4, 0]), Ok((4, 4)));
        assert_eq!(counts(&[], 1, &[2, 2]), Ok((4, 4)));
        assert!(counts(&[], 1, &[3, 2]).is_err(), "5 units from 4 checks");
        assert!(counts(&[], 0, &[1, 0]).is_err(), "nobody was killed");
    }

    /// Judges a cluster scenario's decisions: key 0 of every stream is on
    /// the victim master, key 1 elsewhere; the replica was promoted at 2 s.
    fn cluster(decisions: &[Decision], promoted_at: Option<u64>) -> Vec<Check> {
        let scenario = crate::scenario::all(1_000, 50)
            .into_iter()
            .find(|s| s.name == "cluster-master-killed")
            .expect("the cluster scenario exists");
        let ctx = Context {
            scenario: &scenario,
            driver: "test",
            deadline_ms: 50,
            max_cool_down_ms: 500,
            keys: 2,
            apps: 3,
            timeline: Timeline {
                fault_at: 1_000_000,
                promoted_at,
                ..Timeline::default()
            },
            in_flight: 4,
            redis_counts: HashMap::new(),
            victim_keys: (0..3).map(|stream| (stream, 0)).collect(),
        };
        let logs = [AppLog {
            decisions: decisions.to_vec(),
            ..AppLog::default()
        }];
        let all: Vec<_> = decisions.iter().map(|d| (0, d)).collect();
        let mut checks = Vec::new();
        cluster_checks(&ctx, &logs, &all, &mut checks);
        checks
    }

    fn verdict<'a>(checks: &'a [Check], starts: &str) -> &'a str {
        checks
            .iter()
            .find(|c| c.bound.starts_with(starts))
            .map_or("missing", |c| c.verdict)
    }

    /// `n` decisions of `key` in `stream` from `t` on, 1 ms apart.
    fn run_of(n: u64, t: u64, stream: usize, key: usize, tier: Tier) -> Vec<Decision> {
        (0..n)
            .map(|i| Decision {
                t: t + i * 1_000,
                stream,
                key,
                allowed: tier != Tier::FailClosed,
                failure: tier.is_fallback().then_some(RedisFailure::NodeDown),
                ..decision(tier, true, false)
            })
            .collect()
    }

    #[test]
    fn a_cluster_run_that_keeps_its_bounds_passes() {
        let mut log = run_of(1_000, 0, 0, 1, Tier::Redis);
        log.extend(run_of(1_000, 0, 0, 0, Tier::Redis));
        log.extend(run_of(500, 1_000_000, 0, 0, Tier::FailOpen));
        log.extend(run_of(500, 1_000_000, 1, 0, Tier::FailClosed));
        log.extend(run_of(100, 2_100_000, 1, 0, Tier::Redis));
        let checks = cluster(&log, Some(2_000_000));
        assert!(checks.iter().all(|c| c.verdict != "FAIL"), "{checks:#?}");
    }

    fn line(at: u64, state: &str, due: Option<u64>, since: u64) -> StateLine {
        StateLine {
            at,
            state: state.into(),
            due,
            since,
        }
    }

    /// A check is judged as made while Open only when no close may have
    /// come before its end: a close logged by a poll that came late (the
    /// app stalled) may have happened as early as the poll before it.
    #[test]
    fn a_close_logged_late_may_have_come_early() {
        let log = |closed_since: u64| AppLog {
            states: vec![
                line(1_000, "open", Some(2_000), 999),
                line(2_000, "half_open", None, 1_999),
                line(30_000, "closed", None, closed_since),
            ],
            ..AppLog::default()
        };
        // Polled on time: the close came after 29 ms, so 4 ms ± 0.5 was open.
        assert!(log(29_000).open_around(4_000, 500));
        // The poll before the close came at 3 ms, then the app stalled.
        assert!(!log(3_000).open_around(4_000, 500));
        assert!(log(3_000).open_around(2_400, 500), "before that poll");
    }

    /// A probe begun less than a deadline before the heal may fail still,
    /// and one logged late after the heal may have begun before it: from
    /// the poll before, on.
    #[test]
    fn a_probe_logged_late_may_have_been_sent_into_the_fault() {
        let (heal, deadline) = (5_000_000, 50_000);
        let probe = |at: u64, since: u64| AppLog {
            states: vec![
                line(heal - 900_000, "open", Some(heal - 1_000), heal - 901_000),
                line(at, "half_open", None, since),
            ],
            ..AppLog::default()
        };
        assert!(probe(heal - 1_000, heal - 2_000).probe_in_flight(heal, deadline));
        // Begun a whole deadline before the heal: it has failed by then.
        let early = probe(heal - deadline, heal - deadline - 1_000);
        assert!(!early.probe_in_flight(heal, deadline));
        // Polled on time after the heal: begun after it.
        assert!(!probe(heal + 2_000, heal + 1_000).probe_in_flight(heal, deadline));
        // Logged 30 ms after the heal, the poll before 1 ms before it.
        assert!(probe(heal + 30_000, heal - 1_000).probe_in_flight(heal, deadline));
    }

    /// A late recovery names the breaker's path after the heal and what its
    /// calls met: a failed probe reads differently from no probe.
    #[test]
    fn a_late_recovery_says_what_the_breaker_did() {
        let heal = 5_000_000;
        let log = AppLog {
            states: vec![
                line(heal - 300_000, "open", Some(heal + 200_000), heal - 301_000),
                line(heal + 200_000, "half_open", None, heal + 199_000),
                line(
                    heal + 250_000,
                    "open",
                    Some(heal + 1_000_000),
                    heal + 249_000,
                ),
                line(heal + 1_000_000, "half_open", None, heal + 999_000),
                line(heal + 1_004_000, "closed", None, heal + 1_003_000),
            ],
            decisions: vec![Decision {
                t: heal + 200_000,
                failure: Some(RedisFailure::Timeout),
                ..decision(Tier::FailOpen, true, true)
            }],
            ..AppLog::default()
        };
        assert_eq!(
            after_heal(&log, heal, heal + 1_004_000),
            "breaker half_open at +200.0 ms, open at +250.0 ms, half_open at +1000.0 ms, \
             closed at +1004.0 ms; calls begun meanwhile failed: 1 Timeout"
        );
        assert_eq!(
            after_heal(&AppLog::default(), heal, heal + 10),
            "breaker unchanged; calls begun meanwhile failed: none"
        );
    }

    /// A fallback decided before the fault fails the run; one begun before
    /// it and ended after it (its call lost as the master was killed) does
    /// not.
    #[test]
    fn only_a_fallback_decided_before_the_fault_is_early() {
        let mut log = run_of(1_000, 0, 0, 1, Tier::Redis);
        log.extend(run_of(100, 2_100_000, 1, 0, Tier::Redis));
        let mut in_flight = run_of(1, 990_000, 1, 0, Tier::FailClosed);
        in_flight[0].lat = 17_000;
        in_flight[0].failure = Some(RedisFailure::ConnectionLost);
        log.extend(in_flight);
        let checks = cluster(&log, Some(2_000_000));
        assert_eq!(verdict(&checks, "no decision falls back before"), "missing");
        let last = log.len() - 1;
        log[last].lat = 5_000;
        let checks = cluster(&log, Some(2_000_000));
        assert_eq!(verdict(&checks, "no decision falls back before"), "FAIL");
    }

    #[test]
    fn a_healthy_masters_key_falling_back_fails_the_run() {
        let mut log = run_of(1_000, 0, 0, 1, Tier::Redis);
        log.extend(run_of(100, 2_100_000, 0, 0, Tier::Redis));
        // Not a deadline miss: a down mark on a healthy master's key.
        log.extend(run_of(1, 1_500_000, 2, 1, Tier::Local));
        let checks = cluster(&log, Some(2_000_000));
        assert_eq!(verdict(&checks, "keys on the other masters"), "FAIL");
        // Nor a deadline miss.
        let last = log.len() - 1;
        log[last].failure = Some(RedisFailure::Timeout);
        assert_eq!(
            verdict(&cluster(&log, Some(2_000_000)), "keys on the other masters"),
            "FAIL"
        );
    }

    #[test]
    fn a_victim_key_off_its_policy_or_late_back_on_redis_fails_the_run() {
        let mut log = run_of(1_000, 0, 0, 1, Tier::Redis);
        // Fail-closed admitting while its master fails over.
        let mut admitted = run_of(1, 1_500_000, 1, 0, Tier::FailClosed);
        admitted[0].allowed = true;
        log.extend(admitted);
        log.extend(run_of(100, 2_100_000, 1, 0, Tier::Redis));
        let checks = cluster(&log, Some(2_000_000));
        assert_eq!(verdict(&checks, "keys on the failed master follow"), "FAIL");
        // Still falling back 1.5 s after the promotion.
        let mut log = run_of(1_000, 0, 0, 1, Tier::Redis);
        log.extend(run_of(1, 3_500_000, 0, 0, Tier::FailOpen));
        log.extend(run_of(100, 3_600_000, 0, 0, Tier::Redis));
        let checks = cluster(&log, Some(2_000_000));
        assert_eq!(
            verdict(&checks, "the failed master's keys are back"),
            "FAIL"
        );
        assert_eq!(
            verdict(&cluster(&log, None), "the victim's replica"),
            "FAIL"
        );
    }
}
