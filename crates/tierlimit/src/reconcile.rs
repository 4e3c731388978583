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
//! * Each write-back is claimed under an id the script remembers (with a TTL)
//!   per key, so one re-sent after a timeout (whose outcome is unknown: it may
//!   have run) is not applied twice. A failed write-back keeps its claim and is
//!   re-sent under the same id.
//! * A key's next check on Redis carries its pending write-backs in the same
//!   pipeline, ahead of the check script, so Redis counts what the key used
//!   locally before it decides: a hot key cannot use its local quota and then
//!   its Redis quota while the drain has not reached it. The drain and the
//!   check may send the same claim; its id makes that harmless.
//! * An entry Redis refuses on its own (`WRONGTYPE`: something else wrote
//!   under a `tl:` key) is parked: set aside, counted
//!   (`tierlimit_reconcile_parked_total`), and named in a warning, so it
//!   neither stalls the drain nor counts against the breaker.
//! * Entries whose window has passed are dropped and counted: they can no longer
//!   change a decision.
//! * A batch that fails feeds the breaker like any Redis call; once it opens, the
//!   drain stops, the rest stays in the ledger, and draining resumes after the
//!   next close.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use tierlimit_core::{Error, Result};
use tierlimit_local::Claim;
use tierlimit_redis::{WriteBack, Written};

use crate::breaker::BreakerState;
use crate::limiter::{Inner, failed};
use crate::metrics;

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
    parked_entries: AtomicU64,
}

/// A snapshot of what the reconciler has done since the limiter started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct ReconcileStats {
    /// Units Redis acknowledged: written back, or found no longer to count
    /// (their window had passed on Redis' clock by the time they reached it).
    pub reconciled_units: u64,
    /// Batches Redis acknowledged (a check's own write-backs count as one).
    pub batches: u64,
    /// Write-backs re-sent under their id after an unknown outcome.
    pub batches_retried: u64,
    /// Units dropped because their window passed before they could be written.
    pub expired_units: u64,
    /// Units refused because the ledger was full.
    pub overflow_units: u64,
    /// Entries Redis refused on their own (e.g. `WRONGTYPE`: something else
    /// wrote under a `tl:` key), set aside so the rest drains.
    pub parked_entries: u64,
    /// Units of those entries.
    pub parked_units: u64,
    /// Units still waiting in the ledger.
    pub pending_units: u64,
}

/// The reconciler's settings and counters.
#[derive(Debug, Default)]
pub(crate) struct Reconciler {
    pub(crate) config: ReconcileConfig,
    counters: Counters,
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
        let c = &self.counters;
        ReconcileStats {
            reconciled_units: c.reconciled_units.load(Ordering::Relaxed),
            batches: c.batches.load(Ordering::Relaxed),
            batches_retried: c.batches_retried.load(Ordering::Relaxed),
            expired_units: ledger.expired_units(),
            overflow_units: ledger.overflow_units(),
            parked_entries: c.parked_entries.load(Ordering::Relaxed),
            parked_units: ledger.parked_units(),
            pending_units: ledger.units(),
        }
    }
}

/// What became of a set of write-backs.
#[derive(Debug, Default)]
pub(crate) struct Settled {
    /// Units acknowledged (written now, before, or expired on the server).
    pub(crate) units: u64,
    /// The first entry that failed in a way that may pass (`-OOM`, say): the
    /// call counts as failed for the breaker, and the entry is re-sent under
    /// its id.
    pub(crate) transient: Option<Error>,
}

/// The write-backs of `claims` sent together, as [`WriteBack`]s.
pub(crate) fn writes(claims: &[Claim]) -> Vec<WriteBack<'_>> {
    claims
        .iter()
        .map(|c| WriteBack::new(&c.id, &c.entry))
        .collect()
}

/// Applies Redis' answers to `claims`: acknowledged ones leave the ledger,
/// refused ones are parked (with a metric and a warning saying why), and the
/// rest stay claimed under their ids.
pub(crate) fn settle(inner: &Inner, claims: &[Claim], outcomes: Vec<Result<Written>>) -> Settled {
    let c = &inner.reconciler.counters;
    let mut settled = Settled::default();
    let retried = claims.iter().filter(|c| c.resent).count() as u64;
    if retried > 0 {
        c.batches_retried.fetch_add(retried, Ordering::Relaxed);
        inner.labels.counter(metrics::BATCHES_RETRIED, retried);
    }
    for (claim, outcome) in claims.iter().zip(outcomes) {
        match outcome {
            Ok(Written::Refused(why)) => {
                let units = inner.local.ledger().park(claim);
                c.parked_entries.fetch_add(1, Ordering::Relaxed);
                inner.labels.counter(metrics::PARKED, 1);
                tracing::warn!(
                    key = %claim.entry.storage_key,
                    units,
                    reason = %why,
                    "Redis refuses this ledger entry on its own; it is set aside so the rest drains"
                );
            }
            // Saturating, here and below: an entry holds up to u64::MAX units.
            Ok(_) => {
                settled.units = settled
                    .units
                    .saturating_add(inner.local.ledger().ack(claim))
            }
            Err(e) => {
                tracing::debug!(error = %e, "write-back failed on the server; it will be re-sent");
                settled.transient.get_or_insert(e);
                hold(inner, std::slice::from_ref(claim));
            }
        }
    }
    if settled.units > 0 {
        c.reconciled_units
            .fetch_add(settled.units, Ordering::Relaxed);
        inner
            .labels
            .counter(metrics::RECONCILED_UNITS, settled.units);
    }
    c.batches.fetch_add(1, Ordering::Relaxed);
    settled
}

/// The shortest rest a drain takes between batches: the timer rounds shorter
/// sleeps up to its millisecond, which would throw the duty cycle off.
const MIN_REST: Duration = Duration::from_millis(2);

/// Drains the ledger whenever the breaker is Closed and there is something to drain.
pub(crate) async fn run(inner: Weak<Inner>) {
    loop {
        let Some(this) = inner.upgrade() else { return };
        let wait =
            if this.breaker.state() == BreakerState::Closed && !this.local.ledger().is_empty() {
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

/// What became of one batch of write-backs sent.
pub(crate) struct Sent {
    /// Units acknowledged, those of a batch that failed in part included.
    pub(crate) units: u64,
    /// Why the call failed as a whole, or the first entry that failed in a
    /// way that may pass (those entries stay claimed, to be re-sent).
    pub(crate) failed: Option<Error>,
    /// Whether the breaker should hear of the call (not of one Cluster
    /// master's fault: see
    /// [`RedisTier::reconcile_counted`](tierlimit_redis::RedisTier::reconcile_counted)).
    pub(crate) counts_call: bool,
}

/// Sends one batch of write-backs and settles it.
pub(crate) async fn send_batch(inner: &Inner, claims: &[Claim]) -> Sent {
    let sent = inner.redis.reconcile_counted(&writes(claims)).await;
    let (units, failed) = match sent.result {
        Ok(outcomes) => {
            let settled = settle(inner, claims, outcomes);
            (settled.units, settled.transient)
        }
        Err(e) => {
            hold(inner, claims);
            (0, Some(e))
        }
    };
    Sent {
        units,
        failed,
        counts_call: sent.counts_call,
    }
}

/// Holds back `claims`, whose write-back failed, for a deadline: the
/// entries after them go first meanwhile (see
/// [`Ledger::hold`](tierlimit_local::Ledger::hold)).
fn hold(inner: &Inner, claims: &[Claim]) {
    let until = hold_clock_us(inner).saturating_add(micros(inner.redis.deadline()));
    let ledger = inner.local.ledger();
    for claim in claims {
        ledger.hold(claim, until);
    }
}

/// The clock holds are timed on: the monotonic one, so a wall clock stepped
/// back does not hold failed entries that much longer.
pub(crate) fn hold_clock_us(inner: &Inner) -> u64 {
    micros(inner.clock.now())
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// One drain: batches until the ledger is empty or the breaker leaves Closed.
async fn drain(inner: &Arc<Inner>) {
    let started = Instant::now();
    let (mut units, mut batches) = (0u64, 0u64);
    // Rest owed to keep the duty cycle, paid in sleeps of at least MIN_REST.
    let mut owed = Duration::ZERO;
    let expired = inner.local.drop_expired();
    loop {
        if inner.breaker.state() != BreakerState::Closed {
            tracing::warn!(
                units,
                batches,
                "reconcile paused: Redis failed again; the rest stays in the ledger"
            );
            return;
        }
        let claims = inner
            .local
            .claim(inner.reconciler.config.batch_size, hold_clock_us(inner));
        if claims.is_empty() {
            break;
        }
        let epoch = inner.breaker.epoch();
        let begun = Instant::now();
        // Under the Redis tier's deadline, like every call.
        let sent = send_batch(inner, &claims).await;
        let latency = begun.elapsed();
        units = units.saturating_add(sent.units);
        batches += 1;
        if sent.counts_call {
            inner.record_call(epoch, latency, sent.failed.as_ref().and_then(failed));
        }
        if let Some(e) = sent.failed {
            tracing::debug!(error = %e, "reconcile batch failed; it will be re-sent");
            return;
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
