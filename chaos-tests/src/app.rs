//! One app instance: an embedded [`HybridLimiter`] under steady load, logging
//! every decision and every breaker transition. The process driver runs it as a
//! child process, the docker driver as a container (`chaos-app <plan.json>`).
//!
//! The log is plain text, one record per line, written as it happens so a killed
//! app loses only the checks in flight when it died:
//!
//! * `d,<t_us>,<latency_us>,<stream>,<tier>,<allowed 0|1>,<key>,<maybe_ran 0|1>,<failure|->`:
//!   a decision; `maybe_ran` is 1 when the policy answered because the check's
//!   own Redis call failed in a way that may have run the script anyway
//!   ([`tierlimit::RedisFailure::may_have_run`]); `failure` names that
//!   failure (`Timeout`, `ConnectionRefused`, `ConnectionLost`, ..., the
//!   [`RedisFailure`] variant), `-` when the check's own call did not fail
//! * `e,<t_us>,<latency_us>,<stream>,<message>`: a check that returned an error
//! * `s,<t_us>,<state>,<probe_due_t_us|->,<since_us>`: the breaker changed state
//!   after `since_us` (the previous poll) and by `t_us`
//! * `f,<reconciled>,<expired>,<overflow>,<pending>,<batches_retried>,<instances>`:
//!   the final reconcile counters
//!
//! Times are µs since the plan's wall-clock start, shared by every app.

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tierlimit::{BreakerConfig, BreakerState, HybridLimiter, Instances, RedisFailure, Tier};
use tokio::sync::mpsc;

use crate::plan::{AppPlan, HUNG_CHECK, Sabotage, key, rule_sets, tier_code};
use crate::unix_us;

/// The breaker settings every chaos app uses: production thresholds with short
/// cool-downs, so a quick run sees several probes.
pub fn breaker() -> BreakerConfig {
    let mut b = BreakerConfig::default();
    b.cool_down = Duration::from_millis(200);
    b.max_cool_down = Duration::from_secs(1);
    b
}

/// Runs one app to completion. Errors are set-up errors (bad plan, unwritable log).
pub async fn run(plan: AppPlan) -> Result<(), Box<dyn std::error::Error>> {
    let sets = Arc::new(rule_sets(plan.day_offset_s, plan.edge)?);
    let limiter = Arc::new(
        HybridLimiter::builder()
            .redis_url(plan.redis_url.clone())
            .deadline(if plan.sabotage == Sabotage::NoDeadline {
                Duration::from_secs(60)
            } else {
                plan.deadline()
            })
            .breaker(breaker())
            .instances(Instances::Learned { assume: None })
            .heartbeat_every(Duration::from_millis(if plan.heartbeat_ms == 0 {
                200
            } else {
                plan.heartbeat_ms
            }))
            .group("chaos")
            .build()?,
    );
    let file = std::fs::File::create(&plan.out)?;
    let (tx, mut rx) = mpsc::unbounded_channel::<String>();
    // A thread of its own: file writes must never hold up the runtime's one
    // worker, whose stalls would show up as decision latency.
    let writer = std::thread::spawn(move || {
        let mut out = std::io::BufWriter::new(file);
        while let Some(line) = rx.blocking_recv() {
            let _ = writeln!(out, "{line}");
            // Everything queued goes out in one write; nothing waits for a timer.
            while let Ok(line) = rx.try_recv() {
                let _ = writeln!(out, "{line}");
            }
            let _ = out.flush();
        }
    });

    let start_us = plan.start_unix_ms * 1_000;
    let rel = move || unix_us().saturating_sub(start_us);
    // Reach Redis before the load starts.
    let lead = Duration::from_micros(start_us.saturating_sub(unix_us()));
    limiter.wait_closed(lead).await;
    tokio::time::sleep(Duration::from_micros(start_us.saturating_sub(unix_us()))).await;

    let states = {
        let (limiter, tx) = (limiter.clone(), tx.clone());
        tokio::spawn(async move {
            // Every transition counts, even a probe that fails within one poll
            // (open -> half-open -> open): its new probe time must be logged.
            let mut last = None;
            // When this task last looked: a transition it sees happened since.
            let mut polled = rel();
            let mut last_pending = None;
            let mut pending_read = 0;
            loop {
                let looking = rel();
                let seen = limiter.breaker().transitions();
                let state = limiter.breaker_state();
                if Some(seen) != last {
                    let due = limiter
                        .breaker()
                        .time_until_probe()
                        .map_or("-".to_string(), |d| {
                            (rel() + d.as_micros() as u64).to_string()
                        });
                    let _ = tx.send(format!("s,{},{},{},{polled}", rel(), state.as_str(), due));
                    last = Some(seen);
                    // Read at once after any transition, and logged.
                    (last_pending, pending_read) = (None, 0);
                }
                // What the ledger still owes, while Closed (the drain), at
                // each change, read every 10 ms (reading it moves what the
                // buckets owe into the ledger, which a limiter does far less
                // often): the judge reads from it whether an app killed
                // after the heal died mid-drain.
                if state == BreakerState::Closed && looking >= pending_read + 10_000 {
                    pending_read = looking;
                    let pending = limiter.reconcile_stats().pending_units;
                    if Some(pending) != last_pending {
                        let _ = tx.send(format!("p,{},{pending}", rel()));
                        last_pending = Some(pending);
                    }
                }
                polled = looking;
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
    };

    // The load ends at the same wall-clock time in every app, including one
    // started again mid-run (a rolling restart), which starts at once.
    let end = Instant::now()
        + Duration::from_micros((start_us + plan.run_ms * 1_000).saturating_sub(unix_us()));
    let tasks: Vec<_> = (0..plan.tasks)
        .map(|t| {
            let (limiter, sets, tx, plan) =
                (limiter.clone(), sets.clone(), tx.clone(), plan.clone());
            tokio::spawn(async move {
                let mut i = t;
                while Instant::now() < end {
                    let stream = i % 3;
                    let k = (i / 3 + plan.app) % plan.keys;
                    let at = rel();
                    let begun = Instant::now();
                    // A check that never returns (a future that waits for
                    // nothing) is logged as an error, which fails the run:
                    // unlogged, no bound would ever see it.
                    let check = async {
                        let r = limiter.check(&key(stream, k), &sets[stream], 1).await;
                        if matches!(&r, Ok(d) if d.tier != Tier::Redis) {
                            match plan.sabotage {
                                Sabotage::HangWithoutRedis => std::future::pending::<()>().await,
                                // Blocks the runtime's only worker: no timer
                                // fires again and the app never exits.
                                Sabotage::BlockWithoutRedis => {
                                    std::thread::sleep(Duration::from_secs(3_600))
                                }
                                _ => {}
                            }
                        }
                        r
                    };
                    let result = tokio::time::timeout(HUNG_CHECK, check)
                        .await
                        .map_err(|_| format!("the check did not return within {HUNG_CHECK:?}"))
                        .and_then(|r| r.map_err(|e| e.to_string()));
                    let lat = begun.elapsed().as_micros();
                    let without_redis = matches!(&result, Ok(d) if d.tier != Tier::Redis);
                    match plan.sabotage {
                        Sabotage::PanicWithoutRedis if without_redis => {
                            panic!("sabotage: a check made without Redis panics")
                        }
                        Sabotage::AbortWithoutRedis if without_redis => std::process::abort(),
                        _ => {}
                    }
                    let line = match result {
                        Ok(d) => format!(
                            "d,{at},{lat},{stream},{},{},{k},{},{}",
                            tier_code(d.tier),
                            u8::from(d.allowed),
                            u8::from(d.redis_failure.is_some_and(RedisFailure::may_have_run)),
                            d.redis_failure
                                .map_or_else(|| "-".to_string(), |f| format!("{f:?}"))
                        ),
                        Err(e) => format!("e,{at},{lat},{stream},{}", e.replace(',', ";")),
                    };
                    let _ = tx.send(line);
                    i += plan.tasks;
                    tokio::time::sleep(Duration::from_millis(plan.pace_ms)).await;
                }
            })
        })
        .collect();
    for t in tasks {
        // A check that panicked stopped its task, which logs no decision
        // again: the run's judge would never see what it skipped.
        t.await
            .map_err(|e| format!("a load task ended abnormally: {e}"))?;
    }

    // Let the breaker close and the ledger drain, then report.
    let drain_end = Instant::now() + Duration::from_millis(plan.drain_ms);
    while Instant::now() < drain_end
        && (limiter.breaker_state() != BreakerState::Closed
            || limiter.reconcile_stats().pending_units > 0)
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // One more look at the state, then stop watching it.
    tokio::time::sleep(Duration::from_millis(5)).await;
    states.abort();
    let r = limiter.reconcile_stats();
    let _ = tx.send(format!(
        "f,{},{},{},{},{},{}",
        r.reconciled_units,
        r.expired_units,
        r.overflow_units,
        r.pending_units,
        r.batches_retried,
        limiter.instances().unwrap_or(0)
    ));
    drop(tx);
    let _ = tokio::task::spawn_blocking(move || writer.join()).await;
    Ok(())
}
