//! Read-only views of the limiter's parts, for inspection and tests.
//!
//! The breaker and the local tier change only through checks and the
//! limiter's own background tasks: a user call that opened the breaker, left
//! it half-open or wrote a ledger entry would change what the limiter admits
//! or what it writes to Redis. These views expose what can be read and
//! nothing else.

use std::fmt;
use std::time::Duration;

use tierlimit_local::{Ledger, LocalTier};

use crate::breaker::{Breaker, BreakerConfig, BreakerState};

/// The circuit breaker, read only; see [`HybridLimiter::breaker`](crate::HybridLimiter::breaker).
///
/// Nothing here changes the breaker: before issue 9 a user call could open it
/// or leave it half-open forever, which no longer compiles.
///
/// ```compile_fail
/// # async fn f(limiter: tierlimit::HybridLimiter) {
/// limiter.breaker().try_start_probe();
/// # }
/// ```
///
/// ```compile_fail
/// # async fn f(limiter: tierlimit::HybridLimiter) {
/// limiter.breaker().force_open();
/// # }
/// ```
#[derive(Clone, Copy)]
pub struct BreakerView<'a> {
    breaker: &'a Breaker,
}

impl<'a> BreakerView<'a> {
    pub(crate) fn new(breaker: &'a Breaker) -> Self {
        BreakerView { breaker }
    }

    /// The current state.
    pub fn state(&self) -> BreakerState {
        self.breaker.state()
    }

    /// The settings the breaker was built with.
    pub fn config(&self) -> &'a BreakerConfig {
        self.breaker.config()
    }

    /// How many transitions the breaker has made.
    pub fn transitions(&self) -> u64 {
        self.breaker.transitions()
    }

    /// The cool-down of the latest opening, jitter included.
    pub fn current_cool_down(&self) -> Duration {
        self.breaker.current_cool_down()
    }

    /// When Open: how long until a probe may start (zero once it may). `None`
    /// when Closed, or HalfOpen with a probe in flight.
    pub fn time_until_probe(&self) -> Option<Duration> {
        self.breaker.time_until_probe()
    }
}

impl fmt::Debug for BreakerView<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.breaker.fmt(f)
    }
}

/// The local tier, read only; see [`HybridLimiter::local`](crate::HybridLimiter::local).
///
/// Nothing here writes: before issue 9 a user call could record fake ledger
/// entries (written to Redis afterwards) or cache denials, which no longer
/// compiles.
///
/// ```compile_fail
/// # async fn f(limiter: tierlimit::HybridLimiter, set: tierlimit::RuleSet) {
/// limiter.local().record("user-1", &set, 1_000);
/// # }
/// ```
///
/// ```compile_fail
/// # async fn f(limiter: tierlimit::HybridLimiter) {
/// limiter.local().ledger().ack(todo!());
/// # }
/// ```
///
/// What can be read:
///
/// ```no_run
/// # async fn f(limiter: tierlimit::HybridLimiter) {
/// let local = limiter.local();
/// println!("{} buckets, {} units owed to Redis", local.len(), local.ledger().units());
/// # }
/// ```
#[derive(Clone, Copy)]
pub struct LocalView<'a> {
    local: &'a LocalTier,
}

impl<'a> LocalView<'a> {
    pub(crate) fn new(local: &'a LocalTier) -> Self {
        LocalView { local }
    }

    /// Number of local buckets.
    pub fn len(&self) -> usize {
        self.local.len()
    }

    /// True when no local bucket exists.
    pub fn is_empty(&self) -> bool {
        self.local.is_empty()
    }

    /// Number of cached Redis denials.
    pub fn denial_count(&self) -> usize {
        self.local.denial_count()
    }

    /// Checks refused because the bucket map was full.
    pub fn refused(&self) -> u64 {
        self.local.refused()
    }

    /// The outage ledger, read only.
    pub fn ledger(&self) -> LedgerView<'a> {
        LedgerView {
            ledger: self.local.ledger(),
        }
    }
}

impl fmt::Debug for LocalView<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.local.fmt(f)
    }
}

/// The outage ledger, read only: what was admitted without Redis and waits to
/// be written back.
#[derive(Clone, Copy)]
pub struct LedgerView<'a> {
    ledger: &'a Ledger,
}

impl LedgerView<'_> {
    /// Entries waiting (one per Redis key and window).
    pub fn len(&self) -> usize {
        self.ledger.len()
    }

    /// True when nothing waits.
    pub fn is_empty(&self) -> bool {
        self.ledger.is_empty()
    }

    /// Units waiting, over all entries.
    pub fn units(&self) -> u64 {
        self.ledger.units()
    }

    /// Units refused because the ledger was full.
    pub fn overflow_units(&self) -> u64 {
        self.ledger.overflow_units()
    }

    /// Units dropped because their window passed before they were written.
    pub fn expired_units(&self) -> u64 {
        self.ledger.expired_units()
    }
}

impl fmt::Debug for LedgerView<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LedgerView")
            .field("entries", &self.len())
            .field("units", &self.units())
            .finish_non_exhaustive()
    }
}
