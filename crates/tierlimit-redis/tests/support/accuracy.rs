//! The bodies of the accuracy tests (`check_accuracy.rs`), on any server or
//! Cluster and any keys: the Cluster tests (`cluster.rs`) run them on keys of
//! every master.
//!
//! Accuracy under contention: 64 tasks on 4 connections hammer the keys for
//! about 2 s per algorithm. The admitted count is compared with what the
//! algorithm allows over the elapsed server time (the replies' `now_us`;
//! for the buckets, [`check_rate_count`]), and every decision is replayed,
//! in server-time order, through an exact model of the algorithm (integer
//! arithmetic; the sliding window counter's model uses the script's own
//! floating-point formula).
//!
//! Replay order: within one microsecond a denial cannot come before an
//! admission of the same cost (a denial changes nothing, and the time is the
//! same), so calls sharing a microsecond are replayed admissions first.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use tierlimit_core::{Algorithm, RuleSet};
use tokio::task::JoinSet;

use crate::support::{rule, set, tier};

const TASKS: usize = 64;
const CONNECTIONS: usize = 4;
const RUN_FOR: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, Copy)]
struct Call {
    now: u64,
    allowed: bool,
}

/// Hammers each of `keys` of `set` at once with cost 1 (the tasks and
/// connections shared among the keys), on the server or Cluster at `url`;
/// every key's calls, sorted for replay.
async fn hammer(url: &str, keys: &[String], set: &RuleSet) -> Vec<Run> {
    let tiers: Vec<_> = (0..CONNECTIONS).map(|_| tier(url)).collect();
    for t in &tiers {
        t.ping().await.expect("connect");
    }
    let stop = Instant::now() + RUN_FOR;
    let mut tasks = JoinSet::new();
    for i in 0..TASKS.max(keys.len()) {
        let tier = tiers[i % CONNECTIONS].clone();
        let set = set.clone();
        let (k, key) = (i % keys.len(), keys[i % keys.len()].clone());
        tasks.spawn(async move {
            let mut calls = Vec::new();
            while Instant::now() < stop {
                let v = tier.check(&key, &set, 1).await.expect("check");
                calls.push(Call {
                    now: v.server_time_us,
                    allowed: v.decision.allowed,
                });
            }
            (k, calls)
        });
    }
    let mut calls = vec![Vec::new(); keys.len()];
    while let Some(done) = tasks.join_next().await {
        let (k, some) = done.expect("task");
        calls[k].extend(some);
    }
    calls
        .into_iter()
        .map(|mut calls| {
            calls.sort_by_key(|c: &Call| (c.now, !c.allowed));
            Run::new(calls)
        })
        .collect()
}

struct Run {
    calls: Vec<Call>,
    admitted: u64,
    first: u64,
    last: u64,
}

impl Run {
    fn new(calls: Vec<Call>) -> Run {
        let admitted = calls.iter().filter(|c| c.allowed).count() as u64;
        let first = calls.first().expect("some calls").now;
        let last = calls.last().expect("some calls").now;
        Run {
            calls,
            admitted,
            first,
            last,
        }
    }

    fn elapsed(&self) -> u64 {
        self.last - self.first
    }

    /// Replays the calls through `model` (true = admit); panics on the first
    /// disagreement, showing it.
    fn replay(&self, name: &str, mut model: impl FnMut(u64) -> bool) {
        for (i, call) in self.calls.iter().enumerate() {
            let expected = model(call.now);
            assert_eq!(
                call.allowed,
                expected,
                "{name}: call {i} at +{} µs was {} but the model {} it",
                call.now - self.first,
                if call.allowed { "admitted" } else { "denied" },
                if expected { "admits" } else { "denies" },
            );
        }
    }

    fn report(&self, name: &str, expected: &str) {
        eprintln!(
            "{name}: {} calls over {} µs of server time, {} admitted (expected {expected})",
            self.calls.len(),
            self.elapsed(),
            self.admitted
        );
    }
}

/// GCRA and the token bucket from a full state: by their last call they may
/// have admitted at most `capacity + floor(elapsed * limit / period)`. Load
/// that keeps the bucket drained makes them admit that many, or one less
/// for rounding, by their last admission: calls after it (a straggler after
/// the rest) find the bucket empty. Refill that comes while
/// the bucket is full is lost by definition; at the start, until the burst
/// is spent, any pause between calls loses it. So the least count is judged
/// against what the calls, as decided, left room for: a bucket of this rate
/// and capacity is followed through them, an admission with less than one
/// unit in it is an over-admission, and the refill it could not hold is
/// taken off. (A denial with a unit in it is the replay's to catch.)
fn check_rate_count(run: &Run, name: &str, limit: u64, period_us: u64, capacity: u64) {
    let rate_count = |until: u64| {
        let refilled = u128::from(until - run.first) * u128::from(limit) / u128::from(period_us);
        capacity + u64::try_from(refilled).expect("fits")
    };
    // In units of 1/period: `limit` come per µs, one admission takes `period`.
    let (unit, full) = (u128::from(period_us), u128::from(capacity * period_us));
    let (mut credit, mut lost, mut at, mut last_admitted) = (full, 0u128, run.first, run.first);
    for (i, call) in run.calls.iter().enumerate() {
        credit += u128::from(call.now - at) * u128::from(limit);
        at = call.now;
        lost += credit.saturating_sub(full);
        credit = credit.min(full);
        if call.allowed {
            assert!(
                credit >= unit,
                "{name} over-admitted: call {i} at +{} µs was admitted with {credit}/{unit} of a unit left",
                call.now - run.first
            );
            credit -= unit;
            last_admitted = call.now;
        }
    }
    let lost = u64::try_from(lost / unit).expect("fits");
    let most = rate_count(run.last);
    let least = rate_count(last_admitted).saturating_sub(lost + 1);
    run.report(
        name,
        &format!(
            "at most {most}; at least {least}: the rate to the last admission, less {lost} lost to a full bucket and one to rounding"
        ),
    );
    assert!(
        run.admitted <= most,
        "{name} over-admitted: {} > {most}",
        run.admitted
    );
    assert!(
        run.admitted >= least,
        "{name} under-admitted: {} < {least}, with {lost} lost to a full bucket",
        run.admitted,
    );
}

/// The body of the test of this name, on every key of `keys` at once.
pub(crate) async fn gcra_admits_exactly_its_rate(url: &str, keys: &[String]) {
    // T = 3333.33 µs, not a whole microsecond; the burst absorbs pauses of the
    // test process of up to half a second.
    let (limit, period, burst) = (300u64, 1_000_000u64, 150u64);
    let r = rule(Algorithm::Gcra, limit, Duration::from_micros(period))
        .with_burst(burst)
        .expect("valid");
    for run in hammer(url, keys, &set("gcra", [r])).await {
        check_rate_count(&run, "gcra", limit, period, burst);
        // Exact model, in units of 1/limit µs so the emission interval is `period`.
        let mut tat: u128 = 0;
        let (t, tau) = (u128::from(period), u128::from(burst * period));
        run.replay("gcra", |now| {
            let now = u128::from(now) * u128::from(limit);
            let next = tat.max(now) + t;
            let ok = next - now <= tau;
            if ok {
                tat = next;
            }
            ok
        });
    }
}

/// The body of the test of this name, on every key of `keys` at once.
pub(crate) async fn token_bucket_admits_exactly_its_rate(url: &str, keys: &[String]) {
    let (limit, period, capacity) = (300u64, 1_000_000u64, 150u64);
    let r = rule(Algorithm::TokenBucket, limit, Duration::from_micros(period))
        .with_burst(capacity)
        .expect("valid");
    for run in hammer(url, keys, &set("tb", [r])).await {
        check_rate_count(&run, "token bucket", limit, period, capacity);
        // Exact model, tokens in units of 1/period: refill `limit` per µs, cost `period`.
        let full = u128::from(capacity * period);
        let (mut tokens, mut ts) = (full, None::<u64>);
        run.replay("token bucket", |now| {
            if let Some(at) = ts {
                tokens = full.min(tokens + u128::from(now - at) * u128::from(limit));
            }
            ts = Some(now);
            let ok = tokens >= u128::from(period);
            if ok {
                tokens -= u128::from(period);
            }
            ok
        });
    }
}

/// The body of the test of this name, on every key of `keys` at once.
pub(crate) async fn sliding_log_admits_exactly_its_window(url: &str, keys: &[String]) {
    let (limit, period) = (50u64, 250_000u64);
    let r = rule(Algorithm::SlidingLog, limit, Duration::from_micros(period));
    for run in hammer(url, keys, &set("log", [r])).await {
        // Any half-open span of one period lies inside some trailing window.
        let spans = run.elapsed() / period + 1;
        run.report("sliding log", &format!("at most {}", limit * spans));
        assert!(run.admitted <= limit * spans);
        assert!(
            run.admitted >= limit * (spans - 1),
            "sliding log under-admitted: {}",
            run.admitted
        );
        let mut log = VecDeque::new();
        run.replay("sliding log", |now| {
            while log.front().is_some_and(|t| t + period <= now) {
                log.pop_front();
            }
            let ok = (log.len() as u64) < limit;
            if ok {
                log.push_back(now);
            }
            ok
        });
    }
}

/// The body of the test of this name, on every key of `keys` at once.
pub(crate) async fn fixed_window_admits_exactly_its_limit_per_window(url: &str, keys: &[String]) {
    let (limit, period) = (50u64, 250_000u64);
    let r = rule(Algorithm::FixedWindow, limit, Duration::from_micros(period));
    for run in hammer(url, keys, &set("fixed", [r])).await {
        let windows = run.last / period - run.first / period + 1;
        run.report(
            "fixed window",
            &format!("{} windows, at most {}", windows, limit * windows),
        );
        // Each window admits exactly min(limit, calls in it).
        let mut per_window: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
        for c in &run.calls {
            let entry = per_window.entry(c.now / period).or_default();
            entry.0 += 1;
            entry.1 += u64::from(c.allowed);
        }
        for (w, (calls, admitted)) in &per_window {
            assert_eq!(*admitted, limit.min(*calls), "window {w}");
        }
        assert!(run.admitted <= limit * windows);
        let mut window = (u64::MAX, 0u64);
        run.replay("fixed window", |now| {
            if window.0 != now / period {
                window = (now / period, 0);
            }
            let ok = window.1 < limit;
            window.1 += u64::from(ok);
            ok
        });
    }
}

/// The body of the test of this name, on every key of `keys` at once.
pub(crate) async fn sliding_window_stays_within_its_error_bound(url: &str, keys: &[String]) {
    let (limit, period) = (40u64, 200_000u64);
    let r = rule(
        Algorithm::SlidingWindow,
        limit,
        Duration::from_micros(period),
    );
    for run in hammer(url, keys, &set("sliding", [r])).await {
        let windows = run.last / period - run.first / period + 1;
        let ideal = limit + run.elapsed() * limit / period;
        run.report(
            "sliding window",
            &format!(
                "{windows} windows, at most {}; the exact rate gives {ideal}",
                limit * windows
            ),
        );

        // The documented bounds (lua/sliding_window.lua): no fixed window admits
        // more than the limit, and a trailing period ending `elapsed` into window
        // k holds at most limit + c(k-1) * elapsed / period.
        let mut per_window: BTreeMap<u64, u64> = BTreeMap::new();
        for c in run.calls.iter().filter(|c| c.allowed) {
            *per_window.entry(c.now / period).or_default() += 1;
        }
        assert!(per_window.values().all(|&c| c <= limit), "{per_window:?}");
        let admitted: Vec<u64> = run
            .calls
            .iter()
            .filter(|c| c.allowed)
            .map(|c| c.now)
            .collect();
        for (i, &t) in admitted.iter().enumerate() {
            let in_trailing = admitted[..=i].iter().filter(|&&s| s + period > t).count() as u64;
            let previous = per_window.get(&(t / period - 1)).copied().unwrap_or(0);
            let bound = limit as f64 + previous as f64 * (t % period) as f64 / period as f64;
            assert!(
                in_trailing as f64 <= bound,
                "{in_trailing} units in the period ending at +{} µs (bound {bound})",
                t - run.first
            );
        }
        // Under steady load each window after the first admits limit - 1 (the
        // previous window's weight never quite reaches 0); pauses of the test
        // process can cost a few more.
        assert!(run.admitted <= limit * windows);
        assert!(
            run.admitted + windows + limit >= ideal,
            "sliding window under-admitted: {} vs {ideal}",
            run.admitted
        );

        // The script's own formula, replayed with the same floating-point operations.
        let (mut w, mut c, mut p) = (None::<u64>, 0u64, 0u64);
        run.replay("sliding window", |now| {
            let cur = (now as f64 / period as f64).floor() as u64;
            match w {
                Some(x) if x == cur => {}
                Some(x) if x + 1 == cur => (p, c) = (c, 0),
                _ => (p, c) = (0, 0),
            }
            w = Some(cur);
            let left = (period - (now - cur * period)) as f64;
            let estimate = p as f64 * left / period as f64 + c as f64;
            let ok = estimate + 1.0 <= limit as f64 + 1e-9;
            c += u64::from(ok);
            ok
        });
    }
}

/// Calls of a bucket of 300 per second and capacity 150, decided by the
/// exact model: one at 0, then one every 100 µs from `resume` µs to 1 s.
fn saturating_after(resume: u64) -> Run {
    let (limit, period, capacity) = (300u128, 1_000_000u128, 150u128);
    let (mut credit, mut at) = (capacity * period, 0u64);
    let times = std::iter::once(0).chain((resume..=1_000_000).step_by(100));
    let calls = times
        .map(|now| {
            credit = (credit + u128::from(now - at) * limit).min(capacity * period);
            at = now;
            let allowed = credit >= period;
            if allowed {
                credit -= period;
            }
            Call { now, allowed }
        })
        .collect();
    Run::new(calls)
}

#[test]
fn refill_lost_while_the_bucket_sat_full_is_not_an_under_admission() {
    // 10 ms alone after the first call: 3 units come, and the bucket has
    // room for the one that call took. Two short of the saturated count.
    let run = saturating_after(10_000);
    assert_eq!(run.admitted, 150 + 300 - 2);
    check_rate_count(&run, "late start", 300, 1_000_000, 150);
}

#[test]
#[should_panic(expected = "under-admitted: 447 < 449, with 0 lost to a full bucket")]
fn denials_with_room_in_the_bucket_are_an_under_admission() {
    let mut run = saturating_after(100);
    // Three admissions half way through denied: their units are never spent.
    let middle = run
        .calls
        .iter_mut()
        .filter(|c| c.allowed && c.now > 500_000);
    for call in middle.take(3) {
        call.allowed = false;
    }
    run.admitted -= 3;
    check_rate_count(&run, "denied with room", 300, 1_000_000, 150);
}

#[test]
#[should_panic(expected = "over-admitted: call")]
fn an_admission_with_no_unit_left_is_an_over_admission() {
    let mut run = saturating_after(100);
    let denied = run.calls.iter_mut().find(|c| !c.allowed).expect("a denial");
    denied.allowed = true;
    run.admitted += 1;
    check_rate_count(&run, "admitted with none left", 300, 1_000_000, 150);
}
