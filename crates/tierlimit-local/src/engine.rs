//! Which engine decides each rule locally, and governor's part of it.
//!
//! GCRA and token-bucket rules run on [governor]'s GCRA: one keyed
//! `RateLimiter` per (rule set, rule, instance count) holds the rule's quota,
//! and the state it decides on is the key's own cell in this crate's bucket
//! map. governor is generic over its state store; [`CellStore`] is a store
//! whose "key" is the cell itself, so a check does one map lookup (ours) and
//! governor's GCRA tests and updates the cell it is handed. That also answers
//! what governor cannot do by itself:
//!
//! - **Warm start**: a cell holds a theoretical arrival time on the clock
//!   (not one relative to its limiter), so a bucket starts from what Redis
//!   last reported by writing that time into the cell, exactly, rather than pre-consuming
//!   units with `check_key_n` (which would forget the refill since Redis said
//!   it and cannot express a fraction of a unit).
//! - **All or nothing**: a set of several rules is checked under the bucket's
//!   write lock; when a later rule denies, the cells the earlier rules charged
//!   are put back. Every check holds its bucket exclusively (the shard's
//!   write lock costs the same two atomic operations as a read lock), so
//!   [`CellStore`] writes the cell with a plain store, not a compare-and-swap.
//! - **One clock read**: governor's clock here is [`PinnedClock`], which
//!   answers the time the local tier read from its injected [`Clock`] for this
//!   check, so every rule of a set decides at the same instant and tests drive
//!   governor with the same fake clock as everything else.
//!
//! The other rules keep a small counter of their own ([`crate::slot`]): fixed
//! and calendar windows (governor has no windows aligned to the clock), and
//! the local stand-in for the sliding log and the sliding window counter (a
//! two-window estimate). So do the rare GCRA rules whose per-instance burst
//! is above governor's `u32::MAX`.
//!
//! [`Clock`]: tierlimit_core::Clock

use std::cell::Cell;
use std::hash::{Hash, Hasher};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use governor::clock::Clock as GovernorClock;
use governor::middleware::StateInformationMiddleware;
use governor::nanos::Nanos;
use governor::state::StateStore;
use governor::{Quota, RateLimiter};
use tierlimit_core::{Algorithm, Rule};

use crate::slot::{Eval, Share};

/// What decides a rule locally; see the crate docs for why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Engine {
    /// governor's GCRA (GCRA and token-bucket rules).
    Governor,
    /// This crate's exact integer GCRA, for the GCRA rules governor cannot
    /// express: a per-instance burst above `u32::MAX`.
    Gcra,
    /// This crate's window counter (fixed windows; sliding windows as a
    /// two-window estimate).
    Window,
}

impl Engine {
    /// The engine that decides `rule` locally when `instances` instances share it.
    pub fn of(rule: &Rule, instances: u64) -> Engine {
        if !matches!(rule.algorithm(), Algorithm::Gcra | Algorithm::TokenBucket) {
            Engine::Window
        } else if governor_quota(rule, Share::of(rule, instances)).is_some() {
            Engine::Governor
        } else {
            Engine::Gcra
        }
    }
}

/// For a GCRA or token-bucket rule, the share's quota in governor's terms,
/// when governor can hold it: the emission interval in ns, rounded up (the
/// share refills at most as fast as the rule, so rounding never admits more;
/// rules are at most one unit per µs, so it is at least 1,000 ns), and the
/// burst, when it fits governor's `u32`.
fn governor_quota(rule: &Rule, share: Share) -> Option<Quota> {
    if !matches!(rule.algorithm(), Algorithm::Gcra | Algorithm::TokenBucket) {
        return None;
    }
    let period_ns = u128::from(rule.period_micros()) * 1_000;
    let t_ns = u64::try_from(period_ns.div_ceil(u128::from(share.limit))).ok()?;
    let burst = NonZeroU32::new(u32::try_from(share.capacity).ok()?)?;
    Some(Quota::with_period(Duration::from_nanos(t_ns))?.allow_burst(burst))
}

thread_local! {
    /// The time (ns since the Unix epoch) the current check decides at; see
    /// [`PinnedClock`].
    static NOW_NS: Cell<u64> = const { Cell::new(0) };
}

/// governor's clock: the instant this thread's current check pinned, read
/// once from the local tier's injected clock (its monotonic time). A limiter
/// is built at 0: its reference instant is the clock's origin, and every cell
/// holds a time on that clock.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct PinnedClock;

impl GovernorClock for PinnedClock {
    type Instant = Nanos;

    fn now(&self) -> Nanos {
        Nanos::from(NOW_NS.with(Cell::get))
    }
}

/// Runs `f` with governor's clock reading `now_ns` (it keeps reading it
/// until the next call: only calls through here read it).
fn at<T>(now_ns: u64, f: impl FnOnce() -> T) -> T {
    NOW_NS.with(|c| c.set(now_ns));
    f()
}

/// One key's GCRA state for one rule: its theoretical arrival time in ns on
/// the injected clock's monotonic time, 0 for a key governor has not seen (a
/// full bucket).
///
/// It is the "key" governor's keyed limiter is handed; governor asks keys to
/// be `Clone + Eq + Hash` but never clones, compares nor hashes them here
/// ([`CellStore`] does no lookup), so those impls only read the value.
#[derive(Debug, Default)]
pub(crate) struct Tat(AtomicU64);

impl Tat {
    pub(crate) fn new(ns: u64) -> Self {
        Tat(AtomicU64::new(ns))
    }

    pub(crate) fn get(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }

    pub(crate) fn set(&self, ns: u64) {
        self.0.store(ns, Ordering::Release);
    }
}

impl Clone for Tat {
    fn clone(&self) -> Self {
        Tat::new(self.get())
    }
}

impl PartialEq for Tat {
    fn eq(&self, other: &Self) -> bool {
        self.get() == other.get()
    }
}

impl Eq for Tat {}

impl Hash for Tat {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.get().hash(state);
    }
}

/// governor's state store for [`Tat`] cells: the key is the state.
#[derive(Debug, Default)]
pub(crate) struct CellStore;

impl StateStore for CellStore {
    type Key = Tat;

    fn measure_and_replace<T, F, E>(&self, key: &Tat, f: F) -> Result<T, E>
    where
        F: Fn(Option<Nanos>) -> Result<(T, Nanos), E>,
    {
        // A plain load and store, no compare-and-swap: the only way here is
        // `governor_check`, which takes the cell `&mut`, so its bucket is
        // held exclusively and no other check can write it meanwhile. The
        // locked compare-and-swap was a tenth of a local check's time (perf,
        // `fallback/1000-keys`).
        let cell = &key.0;
        let prev = cell.load(Ordering::Acquire);
        let (out, next) = f((prev != 0).then(|| Nanos::from(prev)))?;
        cell.store(next.into(), Ordering::Release);
        Ok(out)
    }
}

type Limiter = RateLimiter<Tat, CellStore, PinnedClock, StateInformationMiddleware>;

/// How one rule of a set is decided for a given instance count.
#[derive(Debug)]
pub(crate) enum RuleEngine {
    Governor {
        limiter: Limiter,
        /// The share's emission interval and burst in ns (`t` and `t + tau`).
        t_ns: u64,
        burst_ns: u64,
    },
    Own(Share),
}

impl RuleEngine {
    pub(crate) fn new(rule: &Rule, instances: u64) -> Self {
        let share = Share::of(rule, instances);
        match governor_quota(rule, share) {
            Some(quota) => {
                let t_ns = duration_ns(quota.replenish_interval());
                // Built outside any check: the reference instant is the epoch.
                let limiter = at(0, || RateLimiter::new(quota, CellStore, PinnedClock));
                RuleEngine::Governor {
                    limiter,
                    t_ns,
                    burst_ns: t_ns.saturating_mul(share.capacity),
                }
            }
            None => RuleEngine::Own(share),
        }
    }
}

/// governor's answer for `cost` units on `tat` at `now_ns` (the injected
/// clock's monotonic time): the cell is charged when admitted. `&mut`: the
/// caller holds the cell's bucket exclusively, which [`CellStore`] relies on.
pub(crate) fn governor_check(
    limiter: &Limiter,
    t_ns: u64,
    burst_ns: u64,
    tat: &mut Tat,
    now_ns: u64,
    cost: u64,
) -> Eval {
    // governor multiplies and adds these without checking: past u64 they
    // wrapped, to an admission (release) or a panic (debug). A cost above
    // the share's burst is never admitted here, and neither is one that
    // would carry a cell past u64 (which only a carry that saturated makes).
    let fits = t_ns
        .checked_mul(cost)
        .is_some_and(|w| w <= burst_ns && tat.get().checked_add(w).is_some());
    let outcome = u32::try_from(cost)
        .ok()
        .filter(|_| fits)
        .and_then(NonZeroU32::new)
        .map(|n| at(now_ns, || limiter.check_key_n(&*tat, n)));
    let ceil_us = |ns: u64| ns.div_ceil(1_000);
    let ahead = |tat_ns: u64| tat_ns.saturating_sub(now_ns);
    match outcome {
        Some(Ok(Ok(snapshot))) => Eval {
            ok: true,
            remaining: u64::from(snapshot.remaining_burst_capacity()),
            reset_after_us: ceil_us(ahead(tat.get())),
            retry_after_us: 0,
        },
        Some(Ok(Err(not_until))) => Eval {
            ok: false,
            remaining: 0,
            reset_after_us: ceil_us(ahead(tat.get())),
            retry_after_us: ceil_us(duration_ns(not_until.wait_time_from(Nanos::from(now_ns))))
                .max(1),
        },
        // More than the share's burst: never admitted here. Say when a
        // bucket that size would have had room, as the exact GCRA does.
        _ => {
            let tat_ns = tat.get().max(now_ns);
            let wait = (tat_ns - now_ns)
                .saturating_add(t_ns.saturating_mul(cost))
                .saturating_sub(burst_ns);
            Eval {
                ok: false,
                remaining: 0,
                reset_after_us: ceil_us(ahead(tat.get())),
                retry_after_us: ceil_us(wait).max(1),
            }
        }
    }
}

fn duration_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}
