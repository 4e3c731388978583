//! The state of one rule for one key in the local tier, and its math.
//!
//! The local tier mirrors each rule's family at this instance's share of the
//! limit: GCRA for GCRA and the token bucket (the same semantics), a fixed window
//! with the same alignment for fixed windows (so the fleet admits at most
//! `limit + instances` per window), and a two-counter sliding window for the
//! sliding log and the sliding window counter (the log's exactness would cost
//! one timestamp per admitted unit per key).

use tierlimit_core::{Algorithm, Rule, window_index, window_start};

/// One rule's local state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Slot {
    /// GCRA: theoretical arrival time in µs since the epoch, times the share's
    /// limit, so the emission interval (`period / limit`) is the whole number
    /// `period_us` and no rounding accumulates over a burst.
    Tat(u128),
    /// Fixed or sliding window: the current window's index and counts.
    Window {
        index: u64,
        current: u64,
        previous: u64,
    },
}

/// A rule scaled to this instance's share.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Share {
    pub(crate) limit: u64,
    pub(crate) capacity: u64,
}

impl Share {
    /// `ceil(x / instances)`, at least 1, for the limit and the capacity.
    pub(crate) fn of(rule: &Rule, instances: u64) -> Share {
        let n = instances.max(1);
        Share {
            limit: rule.limit().div_ceil(n).max(1),
            capacity: rule.capacity().div_ceil(n).max(1),
        }
    }
}

/// What one rule says about a request, before anything is committed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Eval {
    pub(crate) ok: bool,
    pub(crate) remaining: u64,
    pub(crate) reset_after_us: u64,
    pub(crate) retry_after_us: u64,
}

impl Eval {
    /// Stands in where no rule exists (never for a valid rule set).
    pub(crate) const EMPTY: Eval = Eval {
        ok: false,
        remaining: 0,
        reset_after_us: 0,
        retry_after_us: 0,
    };
}

fn is_gcra(rule: &Rule) -> bool {
    matches!(rule.algorithm(), Algorithm::Gcra | Algorithm::TokenBucket)
}

fn local_window_offset(rule: &Rule) -> i32 {
    if rule.algorithm() == Algorithm::FixedWindow {
        rule.utc_offset_secs()
    } else {
        0
    }
}

/// `now`, or the start of window `stored` when the wall clock stepped back
/// before it: a window's counts hold until its end, whatever the clock says
/// meanwhile (judged at the window's start, a sliding window's estimate
/// weighs the window before it whole).
fn not_before(rule: &Rule, stored: u64, now: u64) -> u64 {
    if local_window_index(rule, now) >= stored {
        return now;
    }
    let offset_us = i128::from(local_window_offset(rule)) * 1_000_000;
    let start = i128::from(stored) * i128::from(rule.period_micros()) - offset_us;
    u64::try_from(start).map_or(now, |start| start.max(now))
}

fn local_window_index(rule: &Rule, now: u64) -> u64 {
    if rule.algorithm() == Algorithm::FixedWindow {
        window_index(rule, now)
    } else {
        now / rule.period_micros()
    }
}

/// What a share has used when Redis reported `remaining` for the whole rule:
/// each of `instances` instances takes `ceil(remaining / instances)` of it.
pub(crate) fn used_at_seed(share: Share, remaining: u64, instances: u64) -> u64 {
    share.capacity - remaining.div_ceil(instances.max(1)).min(share.capacity)
}

/// A slot for a key never seen locally, seeded from the `remaining` Redis last
/// reported at `seen_at` (µs), scaled to the share, or full when nothing is
/// known. A window seed counts in the window it was taken in, and a sliding
/// window's seed of the window before as that window's count.
pub(crate) fn fresh(
    rule: &Rule,
    share: Share,
    now: u64,
    seed: Option<(u64, u64)>,
    instances: u64,
) -> Slot {
    let local_remaining = |remaining: u64, cap: u64| remaining.div_ceil(instances.max(1)).min(cap);
    if is_gcra(rule) {
        let Some((remaining, seen_at)) = seed else {
            return Slot::Tat(0);
        };
        let used = used_at_seed(share, remaining, instances);
        // Refill since `seen_at` accrues through the usual max(tat, now).
        Slot::Tat(
            u128::from(seen_at) * u128::from(share.limit)
                + u128::from(used) * u128::from(rule.period_micros()),
        )
    } else {
        let index = local_window_index(rule, now);
        let used = |remaining| share.limit - local_remaining(remaining, share.limit);
        // What was used when the seed was taken counts in its window; a
        // sliding window's estimate still weighs the window before.
        let (current, previous) = match seed {
            Some((remaining, at)) => match index.checked_sub(local_window_index(rule, at)) {
                Some(0) => (used(remaining), 0),
                Some(1) if rule.algorithm() != Algorithm::FixedWindow => (0, used(remaining)),
                _ => (0, 0),
            },
            None => (0, 0),
        };
        Slot::Window {
            index,
            current,
            previous,
        }
    }
}

/// Evaluates a request of `cost` against one rule's slot at `now` (µs); also
/// returns the state to store if every rule of the set admits.
pub(crate) fn evaluate(rule: &Rule, share: Share, slot: Slot, now: u64, cost: u64) -> (Eval, Slot) {
    let period = rule.period_micros();
    match slot {
        Slot::Tat(stored) => {
            // Everything in µs times the share's limit: exact integers.
            let l = u128::from(share.limit);
            let t = u128::from(period);
            let tau = u128::from(share.capacity) * t;
            let now_s = u128::from(now) * l;
            let tat = stored.max(now_s);
            let new_tat = tat + u128::from(cost) * t;
            let ahead = new_tat - now_s;
            let to_us = |scaled: u128| u64::try_from(scaled.div_ceil(l)).unwrap_or(u64::MAX);
            if ahead <= tau {
                let eval = Eval {
                    ok: true,
                    remaining: u64::try_from((tau - ahead) / t).unwrap_or(u64::MAX),
                    reset_after_us: to_us(ahead),
                    retry_after_us: 0,
                };
                (eval, Slot::Tat(new_tat))
            } else {
                let eval = Eval {
                    ok: false,
                    remaining: 0,
                    reset_after_us: to_us(tat - now_s),
                    retry_after_us: to_us(ahead - tau),
                };
                (eval, slot)
            }
        }
        Slot::Window {
            index: stored,
            current,
            previous,
        } => {
            let now = not_before(rule, stored, now);
            let index = local_window_index(rule, now);
            let (current, previous) = rolled(index, stored, current, previous);
            let start = window_start(now, period, local_window_offset(rule));
            let to_end = start + period - now;
            let next = |current| Slot::Window {
                index,
                current,
                previous,
            };
            if rule.algorithm() == Algorithm::FixedWindow {
                // Not `current + cost`: a cost near u64::MAX (the local
                // tier's callers need not validate it) wrapped to an admission.
                // Saturating: a lowered limit leaves `current` above it.
                let room = share.limit.saturating_sub(current);
                return if cost <= room {
                    let eval = Eval {
                        ok: true,
                        remaining: room - cost,
                        reset_after_us: to_end,
                        retry_after_us: 0,
                    };
                    (eval, next(current + cost))
                } else {
                    let eval = Eval {
                        ok: false,
                        remaining: 0,
                        reset_after_us: to_end,
                        retry_after_us: to_end,
                    };
                    (eval, next(current))
                };
            }
            let elapsed = (now - start) as f64 / period as f64;
            let estimate = previous as f64 * (1.0 - elapsed) + current as f64;
            let limit = share.limit as f64;
            if estimate + cost as f64 <= limit {
                let eval = Eval {
                    ok: true,
                    remaining: (limit - estimate - cost as f64).floor().max(0.0) as u64,
                    reset_after_us: to_end + period,
                    retry_after_us: 0,
                };
                (eval, next(current + cost))
            } else {
                // Find the fraction of a window at which the estimate has decayed
                // enough: this window if the current count leaves room, else the next.
                let room = limit - cost as f64;
                let wait = if (current as f64) <= room && previous > 0 {
                    let f = 1.0 - (room - current as f64) / previous as f64;
                    (f * period as f64).ceil() as u64 - (now - start)
                } else {
                    // At most one window on: the current count has gone by
                    // then, and a cost above the share (`room` < 0) waits no
                    // longer than for an empty window.
                    let f = if current == 0 {
                        0.0
                    } else {
                        (1.0 - room / current as f64).clamp(0.0, 1.0)
                    };
                    to_end + (f * period as f64).ceil() as u64
                };
                let eval = Eval {
                    ok: false,
                    remaining: 0,
                    reset_after_us: to_end + period,
                    retry_after_us: wait.max(1),
                };
                (eval, next(current))
            }
        }
    }
}

/// A window slot's counts (`current`, `previous`) kept for window `stored`,
/// as they stand in window `index`: unchanged in the same window; in the
/// next, the current count is the previous one; later, none.
fn rolled(index: u64, stored: u64, current: u64, previous: u64) -> (u64, u64) {
    match index.checked_sub(stored) {
        Some(0) => (current, previous),
        Some(1) => (0, current),
        _ => (0, 0),
    }
}

/// The units a window slot holds against a request at `now`: a fixed
/// window's count in the window of `now`, a sliding window's estimate (the
/// window before weighted by what of it the trailing period still covers,
/// rounded up, plus the current one's count); 0 for a GCRA slot.
pub(crate) fn in_window(rule: &Rule, slot: Slot, now: u64) -> u64 {
    let Slot::Window {
        index,
        current,
        previous,
    } = slot
    else {
        return 0;
    };
    let now = not_before(rule, index, now);
    let (current, previous) = rolled(local_window_index(rule, now), index, current, previous);
    if rule.algorithm() == Algorithm::FixedWindow {
        return current;
    }
    let period = rule.period_micros();
    let to_end = window_start(now, period, 0) + period - now;
    let weighted = (u128::from(previous) * u128::from(to_end)).div_ceil(u128::from(period));
    current.saturating_add(u64::try_from(weighted).unwrap_or(u64::MAX))
}

/// True when the slot holds nothing a fresh slot would not: it can be forgotten.
pub(crate) fn is_idle(rule: &Rule, share: Share, slot: Slot, now: u64) -> bool {
    match slot {
        Slot::Tat(tat) => tat <= u128::from(now) * u128::from(share.limit),
        Slot::Window { index, .. } => {
            let current = local_window_index(rule, now);
            let horizon = if rule.algorithm() == Algorithm::FixedWindow {
                0
            } else {
                1
            };
            current > index + horizon
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000;

    fn run(rule: &Rule, instances: u64, start: u64, span: u64, step: u64) -> u64 {
        let share = Share::of(rule, instances);
        let mut slot = fresh(rule, share, start, None, instances);
        let mut admitted = 0;
        let mut now = start;
        while now < start + span {
            let (e, next) = evaluate(rule, share, slot, now, 1);
            if e.ok {
                slot = next;
                admitted += 1;
            }
            now += step;
        }
        admitted
    }

    #[test]
    fn gcra_share_admits_burst_plus_rate() {
        let rule = Rule::per_second(30).expect("valid");
        // One instance of three: burst 10, then 10/s. Over 2 s: 10 + 20.
        let n = run(&rule, 3, 1_000 * S, 2 * S, 1_000);
        assert!((29..=31).contains(&n), "admitted {n}");
    }

    #[test]
    fn fixed_window_share_is_ceil_of_limit_over_instances() {
        let rule = Rule::with_period(10, std::time::Duration::from_secs(1))
            .and_then(|r| r.with_algorithm(Algorithm::FixedWindow))
            .expect("valid");
        // Exactly one aligned window: ceil(10/3) = 4.
        assert_eq!(run(&rule, 3, 1_000 * S, S, 1_000), 4);
    }

    #[test]
    fn warm_seed_starts_from_the_reported_remaining() {
        let rule = Rule::per_hour(100).expect("valid");
        let share = Share::of(&rule, 1);
        let now = 1_000 * S;
        let mut slot = fresh(&rule, share, now, Some((10, now)), 1);
        let mut admitted = 0;
        for _ in 0..100 {
            let (e, next) = evaluate(&rule, share, slot, now, 1);
            if e.ok {
                admitted += 1;
                slot = next;
            }
        }
        assert_eq!(admitted, 10);
    }

    #[test]
    fn sliding_window_denies_then_retry_after_admits() {
        let rule = Rule::per_second(5)
            .and_then(|r| r.with_algorithm(Algorithm::SlidingLog))
            .expect("valid");
        let share = Share::of(&rule, 1);
        let mut now = 10 * S + S / 2;
        let mut slot = fresh(&rule, share, now, None, 1);
        for _ in 0..5 {
            let (e, next) = evaluate(&rule, share, slot, now, 1);
            assert!(e.ok);
            slot = next;
        }
        let (denied, _) = evaluate(&rule, share, slot, now, 1);
        assert!(!denied.ok);
        now += denied.retry_after_us;
        assert!(evaluate(&rule, share, slot, now, 1).0.ok);
        assert!(!evaluate(&rule, share, slot, now - 1_000, 1).0.ok);
    }
}
