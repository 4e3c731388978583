//! The limiter's background tasks: the probe, the heartbeat and pruning.
//!
//! Each task holds a `Weak` reference, so a dropped limiter's tasks end by
//! themselves even before they are aborted.

use std::sync::{Arc, Weak};
use std::time::Duration;

use tierlimit_core::{Rule, RuleSet};
use tokio::runtime::Handle;
use tokio::task::JoinHandle;

use crate::breaker::BreakerState;
use crate::limiter::Inner;
use crate::metrics;

/// The gauges of one limiter, published each pruning round.
pub(crate) fn publish_gauges(inner: &Inner) {
    let labels = &inner.labels;
    labels.breaker_state(inner.breaker.state());
    labels.gauge(
        metrics::INSTANCES,
        inner.instances.get().unwrap_or(0) as f64,
    );
    labels.gauge(metrics::LOCAL_KEYS, inner.local.len() as f64);
    labels.gauge(metrics::DENIAL_CACHE, inner.local.denial_count() as f64);
    labels.gauge(metrics::WARM_KEYS, inner.local.warm_count() as f64);
    let ledger = inner.local.ledger();
    labels.gauge(metrics::LEDGER_ENTRIES, ledger.len() as f64);
    labels.gauge(metrics::LEDGER_UNITS, ledger.units() as f64);
    let lag_us = ledger
        .oldest_us()
        .map_or(0, |oldest| inner.clock.unix_micros().saturating_sub(oldest));
    labels.gauge(metrics::LEDGER_OLDEST, lag_us as f64 / 1e6);
}

/// Starts every background task of a limiter.
pub(crate) fn spawn_all(handle: &Handle, inner: &Arc<Inner>) -> Vec<JoinHandle<()>> {
    vec![
        handle.spawn(prober(Arc::downgrade(inner))),
        handle.spawn(heartbeat(Arc::downgrade(inner))),
        handle.spawn(pruner(Arc::downgrade(inner))),
        handle.spawn(crate::reconcile::run(Arc::downgrade(inner))),
    ]
}

/// The rule set of the probe: the real check script, on a key of its own, with a
/// limit the probe never reaches.
fn probe_set() -> Option<RuleSet> {
    RuleSet::new("probe", [Rule::per_second(1_000).ok()?]).ok()
}

/// Waits for each cool-down to pass, then runs the one probe.
async fn prober(inner: Weak<Inner>) {
    let Some(set) = probe_set() else { return };
    loop {
        let Some(this) = inner.upgrade() else { return };
        match this.breaker.state() {
            BreakerState::Closed => {
                // Woken when a check trips the breaker; the timeout is a safety net.
                let _ =
                    tokio::time::timeout(Duration::from_millis(500), this.wake.notified()).await;
            }
            _ => {
                let wait = this.breaker.time_until_probe().unwrap_or(Duration::ZERO);
                if !wait.is_zero() {
                    drop(this);
                    tokio::time::sleep(wait.min(Duration::from_millis(100))).await;
                    continue;
                }
                if this.breaker.try_start_probe() {
                    let key = format!("probe:{}", this.instance_id);
                    this.redis.drop_connection();
                    let sent_in = this.local.outage();
                    match this.redis.check(&key, &set, 1).await {
                        Ok(_) => {
                            this.labels.probe(true);
                            this.breaker.probe_succeeded();
                            // After the close: checks made while the probe was
                            // in flight still belong to the outage that ends.
                            // It settles while the other instances may still
                            // be on their way back.
                            let settle =
                                this.breaker.config().max_cool_down + this.redis.deadline();
                            this.local.end_outage(sent_in, settle);
                            this.drain_wake.notify_one();
                            // The instance count may have changed during the outage.
                            beat(&this).await;
                        }
                        Err(e) => {
                            this.labels.probe(false);
                            tracing::debug!(error = %e, "probe failed");
                            // The next probe drops this connection anyway: no replacement here.
                            let _ = this.breaker.probe_failed(e.is_timeout());
                        }
                    }
                } else {
                    drop(this);
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
        }
    }
}

/// Refreshes this instance in the heartbeat set and reads the live count.
async fn beat(inner: &Inner) {
    if !inner.learn_instances || inner.breaker.state() != BreakerState::Closed {
        return;
    }
    let ttl = inner.instance_ttl;
    match inner
        .redis
        .heartbeat(&inner.heartbeat_key, &inner.instance_id, ttl)
        .await
    {
        Ok(count) => {
            // The monotonic clock: a wall clock stepped forward by more
            // than the TTL would forget every count heard at once.
            let now_us = u64::try_from(inner.clock.now().as_micros()).unwrap_or(u64::MAX);
            let used = inner.instances.heard(count, now_us);
            inner.labels.gauge(metrics::INSTANCES, used as f64);
        }
        // A Redis fault is the breaker's business; anything else means the beat
        // can never work, and the instance count would never be learned.
        Err(e) if e.redis_failure().is_some() => {
            tracing::debug!(error = %e, "heartbeat failed; keeping the last instance count")
        }
        Err(e) => tracing::error!(
            error = %e,
            "heartbeat refused: the instance count cannot be learned with these settings"
        ),
    }
}

async fn heartbeat(inner: Weak<Inner>) {
    loop {
        let Some(this) = inner.upgrade() else { return };
        beat(&this).await;
        let every = this.heartbeat_every;
        drop(this);
        tokio::time::sleep(every).await;
    }
}

async fn pruner(inner: Weak<Inner>) {
    loop {
        let Some(this) = inner.upgrade() else { return };
        let every = this.prune_every;
        drop(this);
        tokio::time::sleep(every).await;
        let Some(this) = inner.upgrade() else { return };
        this.local.prune();
        this.local.drop_expired();
        publish_gauges(&this);
    }
}
