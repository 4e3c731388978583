//! The reconciler: after an outage, writes what was admitted locally back to Redis.
//!
//! While the breaker is not Closed, the local tier records in its outage ledger
//! every unit it admitted, per Redis key (and per window). Once the breaker
//! closes, this task drains the ledger in pipelined batches through
//! `lua/reconcile.lua`, which debits each key as if the requests had gone to
//! Redis. Without it every client would get a fresh bucket when Redis returns,
//! which for hourly and daily quotas is a second quota.
//!
//! * An entry leaves the ledger only after Redis acknowledged it.
//! * A batch carries an id the script remembers (with a TTL) per key, so a batch
//!   re-sent after a timeout (whose outcome is unknown: it may have run) is not
//!   applied twice. A failed batch is kept and re-sent with the same id.
//! * Entries whose window has passed are dropped and counted: they can no longer
//!   change a decision.
//! * A batch that fails feeds the breaker like any Redis call; once it opens, the
//!   drain stops, the rest stays in the ledger, and draining resumes after the
//!   next close.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tierlimit_core::LedgerEntry;

use crate::breaker::BreakerState;
use crate::limiter::Inner;

/// Settings of the reconciler.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ReconcileConfig {
    /// Entries per pipelined batch (default 4: one batch holds Redis for well
    /// under 100 µs, so a check that arrives behind it keeps its latency; on a
    /// 2-core machine batches of 16 doubled the checks' p99 during a drain).
    pub batch_size: usize,
    /// The share of wall time a drain may spend on batches, in [0.01, 1]
    /// (default 0.5): the drain rests as long as its batches took, in rests of
    /// at least 2 ms, leaving Redis and the CPU to checks. Below 1 % a drain
    /// would rest a hundred times as long as it works, and a tiny share's rest
    /// would not fit a `Duration`.
    pub duty_cycle: f64,
    /// How often the reconciler looks for work when nothing woke it (default 1 s).
    pub idle_poll: Duration,
}

impl Default for ReconcileConfig {
    fn default() -> Self {
        ReconcileConfig {
            batch_size: 4,
            duty_cycle: 0.5,
            idle_poll: Duration::from_secs(1),
        }
    }
}

/// The smallest duty cycle; see [`ReconcileConfig::duty_cycle`].
const MIN_DUTY_CYCLE: f64 = 0.01;

impl ReconcileConfig {
    pub(crate) fn validate(&self) -> tierlimit_core::Result<()> {
        if self.batch_size == 0 || self.batch_size > 10_000 {
            return Err(tierlimit_core::Error::InvalidConfig {
                what: format!(
                    "reconcile.batch_size must be 1 to 10000 (got {})",
                    self.batch_size
                ),
            });
        }
        if !(MIN_DUTY_CYCLE..=1.0).contains(&self.duty_cycle) {
            return Err(tierlimit_core::Error::InvalidConfig {
                what: format!(
                    "reconcile.duty_cycle must be in [{MIN_DUTY_CYCLE}, 1] (got {})",
                    self.duty_cycle
                ),
            });
        }
        if self.idle_poll.is_zero() {
            return Err(tierlimit_core::Error::InvalidConfig {
                what: "reconcile.idle_poll must not be zero".into(),
            });
        }
        Ok(())
    }
}

/// Counters of the reconciler, readable from [`HybridLimiter::reconcile_stats`](crate::HybridLimiter::reconcile_stats).
#[derive(Debug, Default)]
pub(crate) struct Counters {
    reconciled_units: AtomicU64,
    batches: AtomicU64,
    batches_retried: AtomicU64,
}

/// A snapshot of what the reconciler has done since the limiter started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct ReconcileStats {
    /// Units Redis acknowledged.
    pub reconciled_units: u64,
    /// Batches Redis acknowledged.
    pub batches: u64,
    /// Batches re-sent after a failure.
    pub batches_retried: u64,
    /// Units dropped because their window passed before they could be written.
    pub expired_units: u64,
    /// Units refused because the ledger was full.
    pub overflow_units: u64,
    /// Units still waiting in the ledger.
    pub pending_units: u64,
}

/// The reconciler's state: counters and the batch in flight.
#[derive(Debug, Default)]
pub(crate) struct Reconciler {
    pub(crate) config: ReconcileConfig,
    counters: Counters,
    /// A batch sent but not acknowledged: re-sent as is, with the same id.
    pending: Mutex<Option<(String, Vec<LedgerEntry>)>>,
}

impl Reconciler {
    pub(crate) fn new(config: ReconcileConfig) -> Self {
        Reconciler {
            config,
            ..Reconciler::default()
        }
    }

    pub(crate) fn stats(&self, inner: &Inner) -> ReconcileStats {
        let ledger = inner.local.ledger();
        ReconcileStats {
            reconciled_units: self.counters.reconciled_units.load(Ordering::Relaxed),
            batches: self.counters.batches.load(Ordering::Relaxed),
            batches_retried: self.counters.batches_retried.load(Ordering::Relaxed),
            expired_units: ledger.expired_units(),
            overflow_units: ledger.overflow_units(),
            pending_units: ledger.units(),
        }
    }
}

/// The shortest rest a drain takes between batches: the timer rounds shorter
/// sleeps up to its millisecond, which would throw the duty cycle off.
const MIN_REST: Duration = Duration::from_millis(2);

/// Drains the ledger whenever the breaker is Closed and there is something to drain.
pub(crate) async fn run(inner: Weak<Inner>) {
    loop {
        let Some(this) = inner.upgrade() else { return };
        let has_work = !this.local.ledger().is_empty()
            || this
                .reconciler
                .pending
                .lock()
                .map(|p| p.is_some())
                .unwrap_or(true);
        let wait = if this.breaker.state() == BreakerState::Closed && has_work {
            drain(&this).await;
            // A drain stops early only on a failure: try again soon if still Closed.
            Duration::from_millis(20)
        } else {
            this.reconciler.config.idle_poll
        };
        let woken = this.drain_wake.clone();
        drop(this);
        let _ = tokio::time::timeout(wait, woken.notified()).await;
    }
}

/// One drain: batches until the ledger is empty or the breaker leaves Closed.
async fn drain(inner: &Arc<Inner>) {
    let started = Instant::now();
    let (mut units, mut batches) = (0u64, 0u64);
    // Rest owed to keep the duty cycle, paid in sleeps of at least MIN_REST.
    let mut owed = Duration::ZERO;
    let expired = inner.local.ledger().drop_expired(inner.clock.unix_micros());
    loop {
        if inner.breaker.state() != BreakerState::Closed {
            tracing::warn!(
                units,
                batches,
                "reconcile paused: Redis failed again; the rest stays in the ledger"
            );
            return;
        }
        let batch = {
            let mut pending = match inner.reconciler.pending.lock() {
                Ok(p) => p,
                Err(poisoned) => poisoned.into_inner(),
            };
            match pending.as_ref() {
                Some(b) => {
                    inner
                        .reconciler
                        .counters
                        .batches_retried
                        .fetch_add(1, Ordering::Relaxed);
                    metrics::counter!("tierlimit_reconcile_batches_retried_total").increment(1);
                    b.clone()
                }
                None => {
                    let entries = inner
                        .local
                        .ledger()
                        .batch(inner.reconciler.config.batch_size);
                    if entries.is_empty() {
                        break;
                    }
                    let b = (format!("{:016x}", fastrand::u64(..)), entries);
                    *pending = Some(b.clone());
                    b
                }
            }
        };
        let (id, entries) = batch;
        let begun = Instant::now();
        // Under the Redis tier's deadline, like every call.
        let result = inner.redis.reconcile(&id, &entries).await;
        let latency = begun.elapsed();
        match result {
            Ok(_) => {
                inner.breaker.record_success(latency);
                for e in &entries {
                    inner.local.ledger().ack(e);
                }
                let n: u64 = entries.iter().map(|e| e.units).sum();
                units += n;
                batches += 1;
                let c = &inner.reconciler.counters;
                c.reconciled_units.fetch_add(n, Ordering::Relaxed);
                c.batches.fetch_add(1, Ordering::Relaxed);
                metrics::counter!("tierlimit_reconciled_units_total").increment(n);
                if let Ok(mut p) = inner.reconciler.pending.lock() {
                    *p = None;
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, batch = %id, "reconcile batch failed; it will be re-sent");
                let outcome = inner.breaker.record_failure(latency, e.is_timeout());
                inner.after_failure(outcome);
                return;
            }
        }
        // Rest so the drain keeps to its duty cycle, leaving Redis to checks.
        let duty = inner.reconciler.config.duty_cycle;
        owed += begun.elapsed().mul_f64((1.0 - duty) / duty);
        if owed >= MIN_REST {
            let resting = Instant::now();
            tokio::time::sleep(owed).await;
            owed = owed.saturating_sub(resting.elapsed());
        } else {
            tokio::task::yield_now().await;
        }
    }
    if units > 0 || expired > 0 {
        tracing::info!(
            units,
            batches,
            expired_units = expired,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "reconciled the outage ledger"
        );
    }
    crate::tasks::publish_gauges(inner);
}
