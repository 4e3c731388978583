//! The circuit breaker in front of the Redis tier.
//!
//! * **Closed**: checks go to Redis; every call's outcome and latency is recorded.
//! * **Open**: checks never touch Redis. Once the cool-down has passed, exactly one
//!   background probe (not a user request) may start.
//! * **HalfOpen**: that probe is in flight; checks still stay away from Redis.
//!
//! The semantics follow Resilience4j's count-based `CircuitBreaker`, with two changes
//! that suit a rate limiter: HalfOpen admits no user calls (only the probe), and the
//! cool-down backs off exponentially, with jitter, while probes keep failing.
//!
//! Everything lives in atomics. State and the end of the cool-down share one
//! `AtomicU64`, so no reader can see `Open` next to a stale deadline and every
//! transition is a single compare-and-swap. The sliding window is a ring of atomic
//! slots with running counts. The healthy path (`allows_request` and `record_success`
//! while Closed) takes no lock and never waits.

mod config;
mod window;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use tierlimit_core::{Clock, Error};

use crate::metrics::Labels;

pub use self::config::BreakerConfig;
use self::window::{FAILED, RECORDED, SLOW, Window};

/// Where the breaker stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BreakerState {
    /// Redis is healthy: checks go to it.
    Closed,
    /// Redis is considered down: checks do not touch it until a probe succeeds.
    Open,
    /// The one background probe is in flight; checks still do not touch Redis.
    HalfOpen,
}

impl BreakerState {
    /// A short lowercase name, used as a metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half_open",
        }
    }

    /// The value of the `tierlimit_breaker_state` gauge: 0 closed, 1 open, 2 half-open.
    pub fn gauge_value(self) -> f64 {
        match self {
            BreakerState::Closed => 0.0,
            BreakerState::Open => 1.0,
            BreakerState::HalfOpen => 2.0,
        }
    }
}

impl fmt::Display for BreakerState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why the breaker changed state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub(crate) enum TransitionReason {
    /// [`BreakerConfig::consecutive_failures`] calls in a row failed or timed out.
    ConsecutiveFailures,
    /// The window's failure rate reached [`BreakerConfig::failure_rate_threshold`].
    FailureRate,
    /// The window's slow-call rate reached [`BreakerConfig::slow_call_rate_threshold`].
    SlowCallRate,
    /// The cool-down passed and a probe started.
    CoolDownElapsed,
    /// The probe succeeded.
    ProbeSucceeded,
    /// The probe failed.
    ProbeFailed,
}

impl TransitionReason {
    /// A short lowercase name, used in events.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            TransitionReason::ConsecutiveFailures => "consecutive_failures",
            TransitionReason::FailureRate => "failure_rate",
            TransitionReason::SlowCallRate => "slow_call_rate",
            TransitionReason::CoolDownElapsed => "cool_down_elapsed",
            TransitionReason::ProbeSucceeded => "probe_succeeded",
            TransitionReason::ProbeFailed => "probe_failed",
        }
    }
}

/// One change of state, returned by the call that caused it (exactly one caller
/// sees each transition).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub(crate) struct Transition {
    /// The state left.
    pub(crate) from: BreakerState,
    /// The state entered.
    pub(crate) to: BreakerState,
    /// Why.
    pub(crate) reason: TransitionReason,
}

/// What recording a failure led to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
#[must_use]
pub(crate) struct FailureOutcome {
    /// The transition this failure caused, if any.
    pub(crate) transition: Option<Transition>,
    /// [`BreakerConfig::replace_connection_after`] consecutive timeouts have been
    /// seen since the last time this was true: build a new connection. Exactly one
    /// caller sees it per run of timeouts.
    pub(crate) replace_connection: bool,
}

// The state word: the state in the low two bits, the end of the cool-down (clock
// nanoseconds, 62 bits, about 146 years) above them.
const CLOSED: u64 = 0;
const OPEN: u64 = 1;
const HALF_OPEN: u64 = 2;
const STATE_BITS: u32 = 2;
const STATE_MASK: u64 = (1 << STATE_BITS) - 1;

fn pack(state: u64, until_nanos: u64) -> u64 {
    (until_nanos.min(u64::MAX >> STATE_BITS) << STATE_BITS) | state
}

fn state_of(word: u64) -> BreakerState {
    match word & STATE_MASK {
        CLOSED => BreakerState::Closed,
        OPEN => BreakerState::Open,
        _ => BreakerState::HalfOpen,
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Stores 0 only when needed, so the healthy path leaves the cache line shared.
fn reset(counter: &AtomicU32) {
    if counter.load(Ordering::Relaxed) != 0 {
        counter.store(0, Ordering::Relaxed);
    }
}

/// A lock-free circuit breaker over the Redis tier.
///
/// The limiter asks [`allows_request`](Self::allows_request) before any network
/// I/O, reports each Redis call with [`record_success`](Self::record_success) or
/// [`record_failure`](Self::record_failure), and runs the background probe when
/// [`try_start_probe`](Self::try_start_probe) says so, reporting it with
/// [`probe_succeeded`](Self::probe_succeeded) or [`probe_failed`](Self::probe_failed).
pub(crate) struct Breaker {
    config: BreakerConfig,
    clock: Arc<dyn Clock>,
    /// State and end of the cool-down in one word (see [`pack`]).
    word: AtomicU64,
    window: Window,
    consecutive_failures: AtomicU32,
    consecutive_timeouts: AtomicU32,
    failed_probes: AtomicU32,
    cool_down_nanos: AtomicU64,
    transitions: AtomicU64,
    labels: Labels,
}

impl Breaker {
    /// A closed breaker, after validating `config`.
    pub(crate) fn new(
        config: BreakerConfig,
        clock: Arc<dyn Clock>,
        labels: Labels,
    ) -> Result<Self, Error> {
        config.validate()?;
        labels.breaker_state(BreakerState::Closed);
        Ok(Breaker {
            labels,
            window: Window::new(config.window_size),
            cool_down_nanos: AtomicU64::new(nanos(config.cool_down)),
            config,
            clock,
            word: AtomicU64::new(CLOSED),
            consecutive_failures: AtomicU32::new(0),
            consecutive_timeouts: AtomicU32::new(0),
            failed_probes: AtomicU32::new(0),
            transitions: AtomicU64::new(0),
        })
    }

    /// The settings this breaker was built with.
    pub(crate) fn config(&self) -> &BreakerConfig {
        &self.config
    }

    /// The current state.
    pub(crate) fn state(&self) -> BreakerState {
        state_of(self.word.load(Ordering::Acquire))
    }

    /// How long a call must take to count as slow.
    pub(crate) fn slow_call_threshold(&self) -> Duration {
        self.config.slow_call_threshold
    }

    /// True only when Closed: whether a check may call Redis. Ask before any I/O.
    #[inline]
    pub(crate) fn allows_request(&self) -> bool {
        self.word.load(Ordering::Acquire) & STATE_MASK == CLOSED
    }

    /// Which stretch of the breaker's life this is, for a call about to be
    /// made: its outcome is recorded only in the same one (see
    /// [`record_success`](Self::record_success)).
    pub(crate) fn epoch(&self) -> u64 {
        self.transitions.load(Ordering::Acquire)
    }

    /// Whether a call made in `epoch` may count: the breaker is Closed and
    /// has not left that Closed stretch since.
    fn counts_in(&self, epoch: u64) -> bool {
        self.allows_request() && self.epoch() == epoch
    }

    /// Records a Redis call that answered, taking `latency`, made in `epoch`
    /// (read before the call). A slow success can trip the breaker
    /// (slow-call rate), so this returns the transition it caused.
    ///
    /// Outside the Closed stretch the call was made in, it only ends a run of
    /// timeouts: calls that were in flight when the breaker opened do not
    /// count, not even once it closed again (a call slower than the
    /// cool-down would otherwise count against Redis after its recovery).
    #[must_use = "a trip to Open must wake the prober"]
    pub(crate) fn record_success(&self, latency: Duration, epoch: u64) -> Option<Transition> {
        reset(&self.consecutive_timeouts);
        if !self.counts_in(epoch) {
            return None;
        }
        reset(&self.consecutive_failures);
        self.window.push(RECORDED | self.slow_bit(latency));
        self.trip(self.rate_exceeded()?)
    }

    /// Records a Redis call that failed after `latency`, made in `epoch`;
    /// `timeout` when it was our deadline that ended it (outcome unknown,
    /// socket possibly hung).
    ///
    /// Timeouts count towards [`FailureOutcome::replace_connection`] in every state;
    /// outside the Closed stretch the call was made in nothing else is recorded.
    pub(crate) fn record_failure(
        &self,
        latency: Duration,
        timeout: bool,
        epoch: u64,
    ) -> FailureOutcome {
        let replace_connection = self.count_timeout(timeout);
        if !self.counts_in(epoch) {
            return FailureOutcome {
                transition: None,
                replace_connection,
            };
        }
        self.window.push(RECORDED | FAILED | self.slow_bit(latency));
        let run = self
            .consecutive_failures
            .fetch_add(1, Ordering::AcqRel)
            .wrapping_add(1);
        let reason = if run >= self.config.consecutive_failures {
            Some(TransitionReason::ConsecutiveFailures)
        } else {
            self.rate_exceeded()
        };
        FailureOutcome {
            transition: reason.and_then(|reason| self.trip(reason)),
            replace_connection,
        }
    }

    /// Open → HalfOpen once the cool-down has passed. True for exactly one caller,
    /// which then runs the probe and reports it with [`probe_succeeded`] or
    /// [`probe_failed`]; false for everyone else.
    ///
    /// [`probe_succeeded`]: Self::probe_succeeded
    /// [`probe_failed`]: Self::probe_failed
    pub(crate) fn try_start_probe(&self) -> bool {
        let word = self.word.load(Ordering::Acquire);
        let until = word >> STATE_BITS;
        if word & STATE_MASK != OPEN || nanos(self.clock.now()) < until {
            return false;
        }
        let half_open = pack(HALF_OPEN, until);
        if self
            .word
            .compare_exchange(word, half_open, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return false;
        }
        self.announce(
            BreakerState::Open,
            BreakerState::HalfOpen,
            TransitionReason::CoolDownElapsed,
        );
        true
    }

    /// HalfOpen → Closed: the window and the consecutive counts start afresh and the
    /// cool-down returns to its base. Only the probe's owner calls this; `None` when
    /// no probe was in flight.
    pub(crate) fn probe_succeeded(&self) -> Option<Transition> {
        let word = self.word.load(Ordering::Acquire);
        if word & STATE_MASK != HALF_OPEN {
            return None;
        }
        // Reset before closing, while only the probe's owner touches the breaker, so
        // the first calls of the new Closed period are judged on their own.
        self.window.clear();
        self.consecutive_failures.store(0, Ordering::Relaxed);
        self.consecutive_timeouts.store(0, Ordering::Relaxed);
        self.failed_probes.store(0, Ordering::Relaxed);
        self.cool_down_nanos
            .store(nanos(self.config.cool_down), Ordering::Relaxed);
        self.word
            .compare_exchange(word, CLOSED, Ordering::AcqRel, Ordering::Acquire)
            .ok()?;
        Some(self.announce(
            BreakerState::HalfOpen,
            BreakerState::Closed,
            TransitionReason::ProbeSucceeded,
        ))
    }

    /// HalfOpen → Open with the next, longer cool-down (`cool_down *
    /// backoff_multiplier ^ failed probes`, capped at `max_cool_down`, then jittered
    /// downwards). A probe that timed out counts towards
    /// [`FailureOutcome::replace_connection`]. Only the probe's owner calls this.
    pub(crate) fn probe_failed(&self, timeout: bool) -> FailureOutcome {
        let replace_connection = self.count_timeout(timeout);
        let word = self.word.load(Ordering::Acquire);
        let transition = if word & STATE_MASK == HALF_OPEN {
            let failed = self.failed_probes.load(Ordering::Relaxed).saturating_add(1);
            self.failed_probes.store(failed, Ordering::Relaxed);
            self.open(word, TransitionReason::ProbeFailed)
        } else {
            None
        };
        FailureOutcome {
            transition,
            replace_connection,
        }
    }

    /// The cool-down of the latest opening, jitter included; the base cool-down
    /// when the breaker has not opened since it last closed.
    pub(crate) fn current_cool_down(&self) -> Duration {
        Duration::from_nanos(self.cool_down_nanos.load(Ordering::Relaxed))
    }

    /// When Open: the clock time ([`Clock::now`]) from which a probe may start.
    pub(crate) fn open_until(&self) -> Option<Duration> {
        let word = self.word.load(Ordering::Acquire);
        (word & STATE_MASK == OPEN).then(|| Duration::from_nanos(word >> STATE_BITS))
    }

    /// When Open: how long until a probe may start (zero once it may). `None` when
    /// Closed, or HalfOpen with a probe in flight.
    pub(crate) fn time_until_probe(&self) -> Option<Duration> {
        self.open_until()
            .map(|until| until.saturating_sub(self.clock.now()))
    }

    /// How many transitions this breaker has made.
    pub(crate) fn transitions(&self) -> u64 {
        self.transitions.load(Ordering::Relaxed)
    }

    fn slow_bit(&self, latency: Duration) -> u8 {
        if latency >= self.config.slow_call_threshold {
            SLOW
        } else {
            0
        }
    }

    /// Counts a failure towards the run of timeouts; true when that run reaches
    /// `replace_connection_after`, which also starts a new run.
    fn count_timeout(&self, timeout: bool) -> bool {
        if !timeout {
            reset(&self.consecutive_timeouts);
            return false;
        }
        let limit = self.config.replace_connection_after;
        let mut replace = false;
        let _ =
            self.consecutive_timeouts
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |run| {
                    let run = run.saturating_add(1);
                    replace = run >= limit;
                    Some(if replace { 0 } else { run })
                });
        replace
    }

    fn rate_exceeded(&self) -> Option<TransitionReason> {
        let (calls, failures, slow) = self.window.counts();
        if calls < self.config.minimum_calls {
            return None;
        }
        let calls = f64::from(calls);
        if f64::from(failures) / calls >= self.config.failure_rate_threshold {
            Some(TransitionReason::FailureRate)
        } else if f64::from(slow) / calls >= self.config.slow_call_rate_threshold {
            Some(TransitionReason::SlowCallRate)
        } else {
            None
        }
    }

    fn trip(&self, reason: TransitionReason) -> Option<Transition> {
        self.open(CLOSED, reason)
    }

    /// Moves from the state word `from` to Open with a freshly drawn cool-down; only
    /// the caller whose compare-and-swap wins gets the transition.
    fn open(&self, from: u64, reason: TransitionReason) -> Option<Transition> {
        let cool_down = self.draw_cool_down();
        let until = nanos(self.clock.now()).saturating_add(nanos(cool_down));
        self.word
            .compare_exchange(from, pack(OPEN, until), Ordering::AcqRel, Ordering::Acquire)
            .ok()?;
        self.cool_down_nanos
            .store(nanos(cool_down), Ordering::Relaxed);
        Some(self.announce(state_of(from), BreakerState::Open, reason))
    }

    /// `cool_down * multiplier ^ failed_probes`, capped, times a factor in
    /// `(1 - jitter, 1]`: jitter only shortens, so the cap holds.
    fn draw_cool_down(&self) -> Duration {
        let c = &self.config;
        let exponent =
            i32::try_from(self.failed_probes.load(Ordering::Relaxed)).unwrap_or(i32::MAX);
        let nominal = (c.cool_down.as_secs_f64() * c.backoff_multiplier.powi(exponent))
            .min(c.max_cool_down.as_secs_f64());
        let factor = 1.0 - c.jitter * fastrand::f64();
        Duration::try_from_secs_f64(nominal * factor)
            .unwrap_or(c.max_cool_down)
            .min(c.max_cool_down)
    }

    fn announce(
        &self,
        from: BreakerState,
        to: BreakerState,
        reason: TransitionReason,
    ) -> Transition {
        self.transitions.fetch_add(1, Ordering::AcqRel);
        self.labels.transition(from, to);
        // The state now, not `to`: two transitions racing must not leave a stale gauge.
        self.labels.breaker_state(self.state());
        let (from_name, reason_name) = (from.as_str(), reason.as_str());
        match to {
            BreakerState::Open => {
                let (calls, failures, slow) = self.window.counts();
                tracing::warn!(
                    from = from_name,
                    reason = reason_name,
                    cool_down = ?self.current_cool_down(),
                    window_calls = calls,
                    window_failures = failures,
                    window_slow = slow,
                    "circuit breaker opened: checks stay off Redis until a probe succeeds"
                );
            }
            BreakerState::HalfOpen => {
                tracing::info!(
                    from = from_name,
                    reason = reason_name,
                    "circuit breaker probing Redis"
                )
            }
            BreakerState::Closed => {
                tracing::info!(
                    from = from_name,
                    reason = reason_name,
                    "circuit breaker closed: checks go to Redis again"
                )
            }
        }
        Transition { from, to, reason }
    }
}

impl fmt::Debug for Breaker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (calls, failures, slow) = self.window.counts();
        f.debug_struct("Breaker")
            .field("state", &self.state())
            .field("open_until", &self.open_until())
            .field("cool_down", &self.current_cool_down())
            .field("window_calls", &calls)
            .field("window_failures", &failures)
            .field("window_slow", &slow)
            .field("transitions", &self.transitions())
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Barrier;
    use std::thread;

    use tierlimit_core::FakeClock;

    use super::*;

    const FAST: Duration = Duration::from_millis(1);
    const SLOW: Duration = Duration::from_millis(40);

    /// The defaults without jitter, so cool-downs are exact.
    fn exact() -> BreakerConfig {
        BreakerConfig {
            jitter: 0.0,
            ..BreakerConfig::default()
        }
    }

    fn breaker(config: BreakerConfig) -> (Breaker, FakeClock) {
        let clock = FakeClock::default();
        let breaker = Breaker::new(config, Arc::new(clock.clone()), Labels::new("test"))
            .expect("valid config");
        (breaker, clock)
    }

    fn fail(breaker: &Breaker) -> Option<Transition> {
        breaker
            .record_failure(FAST, false, breaker.epoch())
            .transition
    }

    fn opened(reason: TransitionReason) -> Option<Transition> {
        Some(Transition {
            from: BreakerState::Closed,
            to: BreakerState::Open,
            reason,
        })
    }

    /// Trips with consecutive failures and lets the cool-down pass.
    fn trip_and_start_probe(breaker: &Breaker, clock: &FakeClock) {
        while breaker.state() == BreakerState::Closed {
            let _ = fail(breaker);
        }
        clock.advance(breaker.time_until_probe().expect("open"));
        assert!(breaker.try_start_probe());
    }

    #[test]
    fn consecutive_failures_trip() {
        let (breaker, _) = breaker(exact());
        for _ in 0..4 {
            assert_eq!(fail(&breaker), None);
        }
        assert!(breaker.allows_request());
        assert_eq!(
            breaker
                .record_failure(FAST, true, breaker.epoch())
                .transition,
            opened(TransitionReason::ConsecutiveFailures)
        );
        assert_eq!(breaker.state(), BreakerState::Open);
        assert!(!breaker.allows_request());
        assert_eq!(breaker.transitions(), 1);
        assert_eq!(breaker.state().gauge_value(), 1.0);
    }

    /// A call made before a trip and ended after the breaker closed again
    /// (a deadline longer than the cool-down and its probe) counts for
    /// nothing: five such timeouts tripped the breaker over a Redis that
    /// had just recovered.
    #[test]
    fn a_call_made_before_a_trip_does_not_count_after_the_close() {
        let (breaker, clock) = breaker(exact());
        let before = breaker.epoch();
        trip_and_start_probe(&breaker, &clock);
        assert!(breaker.probe_succeeded().is_some());
        assert_eq!(breaker.state(), BreakerState::Closed);
        for _ in 0..5 {
            assert_eq!(breaker.record_failure(SLOW, true, before).transition, None);
        }
        assert_eq!(breaker.record_success(SLOW, before), None);
        assert_eq!(breaker.window.counts(), (0, 0, 0));
        assert_eq!(breaker.state(), BreakerState::Closed);
        // Calls made since count.
        for _ in 0..4 {
            assert_eq!(fail(&breaker), None);
        }
        assert_eq!(
            fail(&breaker),
            opened(TransitionReason::ConsecutiveFailures)
        );
    }

    #[test]
    fn a_success_ends_the_run_of_failures() {
        let (breaker, _) = breaker(exact());
        for _ in 0..4 {
            assert_eq!(fail(&breaker), None);
        }
        assert_eq!(breaker.record_success(FAST, breaker.epoch()), None);
        for _ in 0..4 {
            assert_eq!(fail(&breaker), None);
        }
        assert_eq!(breaker.state(), BreakerState::Closed);
    }

    #[test]
    fn failure_rate_is_judged_only_from_minimum_calls() {
        let (breaker, _) = breaker(exact());
        // 19 calls alternating success and failure: 9 failures, a rate of 47 %, and
        // below 20 calls even 100 % would not count. Never 5 failures in a row.
        for i in 0..19 {
            let transition = if i % 2 == 0 {
                breaker.record_success(FAST, breaker.epoch())
            } else {
                fail(&breaker)
            };
            assert_eq!(transition, None, "call {i}");
        }
        assert_eq!(breaker.window.counts(), (19, 9, 0));
        // The 20th call brings the window to minimum_calls at 10/20 = 50 %.
        assert_eq!(fail(&breaker), opened(TransitionReason::FailureRate));
    }

    #[test]
    fn low_volume_never_trips_below_consecutive_failures() {
        let config = BreakerConfig {
            window_size: 10,
            minimum_calls: 10,
            ..exact()
        };
        let (breaker, _) = breaker(config);
        // 4 failures, all failed, then quiet: under minimum_calls and under K.
        for _ in 0..4 {
            assert_eq!(fail(&breaker), None);
        }
        assert_eq!(breaker.state(), BreakerState::Closed);
    }

    #[test]
    fn slow_call_rate_trips() {
        let (breaker, _) = breaker(exact());
        for _ in 0..4 {
            assert_eq!(breaker.record_success(FAST, breaker.epoch()), None);
        }
        for _ in 0..15 {
            // Exactly the threshold counts as slow.
            assert_eq!(breaker.record_success(SLOW, breaker.epoch()), None);
        }
        assert_eq!(breaker.window.counts(), (19, 0, 15));
        // 16 slow calls out of 20 = 80 %.
        assert_eq!(
            breaker.record_success(SLOW, breaker.epoch()),
            opened(TransitionReason::SlowCallRate)
        );
    }

    #[test]
    fn slow_failures_count_as_slow() {
        let config = BreakerConfig {
            consecutive_failures: 100,
            failure_rate_threshold: 1.0,
            slow_call_rate_threshold: 0.5,
            ..exact()
        };
        let (breaker, _) = breaker(config);
        for _ in 0..10 {
            assert_eq!(breaker.record_success(FAST, breaker.epoch()), None);
        }
        for _ in 0..9 {
            assert_eq!(
                breaker
                    .record_failure(SLOW, false, breaker.epoch())
                    .transition,
                None
            );
        }
        assert_eq!(
            breaker
                .record_failure(SLOW, false, breaker.epoch())
                .transition,
            opened(TransitionReason::SlowCallRate)
        );
    }

    #[test]
    fn the_window_forgets_old_calls() {
        let config = BreakerConfig {
            window_size: 20,
            consecutive_failures: 100,
            ..exact()
        };
        let (breaker, _) = breaker(config);
        for _ in 0..9 {
            assert_eq!(fail(&breaker), None);
        }
        for _ in 0..11 {
            assert_eq!(breaker.record_success(FAST, breaker.epoch()), None);
        }
        // 9 more failures: 18 of the 29 calls so far failed, but the last 20 hold
        // only the newest 9 of them (45 %).
        for _ in 0..9 {
            assert_eq!(fail(&breaker), None);
        }
        assert_eq!(breaker.window.counts(), (20, 9, 0));
        // The 10th pushes out a success and reaches 50 %.
        assert_eq!(fail(&breaker), opened(TransitionReason::FailureRate));
    }

    #[test]
    fn calls_finishing_while_open_do_not_count() {
        let (breaker, clock) = breaker(exact());
        trip_and_start_probe(&breaker, &clock);
        let _ = breaker.probe_failed(false);
        let before = breaker.window.counts();
        assert_eq!(breaker.record_success(SLOW, breaker.epoch()), None);
        assert_eq!(fail(&breaker), None);
        assert_eq!(breaker.window.counts(), before);
        assert_eq!(breaker.state(), BreakerState::Open);
    }

    #[test]
    fn one_probe_after_the_cool_down() {
        let (breaker, clock) = breaker(exact());
        for _ in 0..5 {
            let _ = fail(&breaker);
        }
        let cool_down = Duration::from_millis(250);
        assert_eq!(breaker.current_cool_down(), cool_down);
        assert_eq!(breaker.open_until(), Some(clock.now() + cool_down));
        assert_eq!(breaker.time_until_probe(), Some(cool_down));
        assert!(!breaker.try_start_probe());

        clock.advance(cool_down - Duration::from_nanos(1));
        assert_eq!(breaker.time_until_probe(), Some(Duration::from_nanos(1)));
        assert!(!breaker.try_start_probe());

        clock.advance(Duration::from_nanos(1));
        assert!(breaker.try_start_probe());
        assert_eq!(breaker.state(), BreakerState::HalfOpen);
        assert_eq!(breaker.state().gauge_value(), 2.0);
        assert!(!breaker.allows_request());
        assert_eq!(breaker.time_until_probe(), None);
        assert!(!breaker.try_start_probe());
        assert_eq!(breaker.transitions(), 2);
    }

    #[test]
    fn racing_threads_start_exactly_one_probe() {
        let (breaker, clock) = breaker(exact());
        let breaker = Arc::new(breaker);
        for _ in 0..5 {
            let _ = fail(&breaker);
        }
        for round in 0..50 {
            clock.advance(breaker.time_until_probe().expect("open"));
            let barrier = Arc::new(Barrier::new(8));
            let threads: Vec<_> = (0..8)
                .map(|_| {
                    let (breaker, barrier) = (Arc::clone(&breaker), Arc::clone(&barrier));
                    thread::spawn(move || {
                        barrier.wait();
                        breaker.try_start_probe()
                    })
                })
                .collect();
            let winners = threads
                .into_iter()
                .map(|t| t.join().expect("thread"))
                .filter(|&won| won)
                .count();
            assert_eq!(winners, 1, "round {round}");
            assert!(breaker.probe_failed(false).transition.is_some());
        }
    }

    #[test]
    fn probe_success_closes_and_resets() {
        let (breaker, clock) = breaker(exact());
        trip_and_start_probe(&breaker, &clock);
        let _ = breaker.probe_failed(false);
        clock.advance(breaker.time_until_probe().expect("open"));
        assert!(breaker.try_start_probe());
        assert_eq!(breaker.current_cool_down(), Duration::from_millis(500));

        assert_eq!(
            breaker.probe_succeeded(),
            Some(Transition {
                from: BreakerState::HalfOpen,
                to: BreakerState::Closed,
                reason: TransitionReason::ProbeSucceeded,
            })
        );
        assert!(breaker.allows_request());
        assert_eq!(breaker.state().gauge_value(), 0.0);
        assert_eq!(breaker.transitions(), 5);
        assert_eq!(breaker.current_cool_down(), Duration::from_millis(250));
        assert_eq!(breaker.window.counts(), (0, 0, 0));
        assert_eq!(breaker.probe_succeeded(), None);

        // The run of failures starts afresh, and the next trip waits the base again.
        for _ in 0..4 {
            assert_eq!(fail(&breaker), None);
        }
        assert!(fail(&breaker).is_some());
        assert_eq!(breaker.time_until_probe(), Some(Duration::from_millis(250)));
    }

    #[test]
    fn failed_probes_back_off_up_to_the_cap() {
        let (breaker, clock) = breaker(exact());
        trip_and_start_probe(&breaker, &clock);
        for expected_ms in [500, 1000, 2000, 4000, 5000, 5000] {
            let outcome = breaker.probe_failed(false);
            assert_eq!(
                outcome.transition,
                Some(Transition {
                    from: BreakerState::HalfOpen,
                    to: BreakerState::Open,
                    reason: TransitionReason::ProbeFailed,
                })
            );
            let expected = Duration::from_millis(expected_ms);
            assert_eq!(breaker.current_cool_down(), expected);
            assert_eq!(breaker.time_until_probe(), Some(expected));
            assert!(!breaker.try_start_probe());
            clock.advance(expected);
            assert!(breaker.try_start_probe());
        }
        // Not in flight: nothing to fail.
        assert!(breaker.probe_succeeded().is_some());
        assert_eq!(breaker.probe_failed(false).transition, None);
    }

    #[test]
    fn jitter_only_shortens_and_respects_the_cap() {
        let config = BreakerConfig {
            cool_down: Duration::from_millis(100),
            max_cool_down: Duration::from_millis(1000),
            jitter: 0.2,
            ..BreakerConfig::default()
        };
        let (breaker, clock) = breaker(config);
        trip_and_start_probe(&breaker, &clock);
        let mut at_cap = Vec::new();
        for probe in 1..=1000 {
            let _ = breaker.probe_failed(false);
            let nominal = Duration::from_millis(100 * 2u64.pow(probe.min(4)))
                .min(Duration::from_millis(1000));
            let drawn = breaker.current_cool_down();
            assert!(drawn <= nominal, "{drawn:?} above {nominal:?}");
            assert!(
                drawn >= nominal.mul_f64(0.8),
                "{drawn:?} below 80 % of {nominal:?}"
            );
            if nominal == Duration::from_millis(1000) {
                at_cap.push(drawn);
            }
            clock.advance(drawn);
            assert!(breaker.try_start_probe());
        }
        // The draws spread over the band rather than sitting at one end.
        let (min, max) = (at_cap.iter().min(), at_cap.iter().max());
        assert!(min < Some(&Duration::from_millis(850)), "{min:?}");
        assert!(max > Some(&Duration::from_millis(950)), "{max:?}");
    }

    #[test]
    fn replace_the_connection_after_consecutive_timeouts() {
        // Keep the breaker closed throughout: too few calls to judge rates.
        let config = BreakerConfig {
            consecutive_failures: 100,
            minimum_calls: 50,
            ..exact()
        };
        let (breaker, clock) = breaker(config);
        let timeout = |breaker: &Breaker| {
            breaker
                .record_failure(SLOW, true, breaker.epoch())
                .replace_connection
        };

        assert!(!timeout(&breaker));
        assert!(!timeout(&breaker));
        assert!(timeout(&breaker));
        // Counted afresh after each signal.
        assert!(!timeout(&breaker));
        assert!(!timeout(&breaker));
        assert!(timeout(&breaker));

        // Other failures never signal, and end a run of timeouts, as successes do.
        for _ in 0..10 {
            assert!(
                !breaker
                    .record_failure(FAST, false, breaker.epoch())
                    .replace_connection
            );
        }
        assert!(!timeout(&breaker));
        assert!(!timeout(&breaker));
        assert!(
            !breaker
                .record_failure(FAST, false, breaker.epoch())
                .replace_connection
        );
        assert!(!timeout(&breaker));
        assert!(!timeout(&breaker));
        assert_eq!(breaker.record_success(FAST, breaker.epoch()), None);
        assert!(!timeout(&breaker));
        assert!(!timeout(&breaker));

        // Probes that time out count too: with the breaker open they are the only
        // calls left, and a hung socket must still be replaced.
        assert!(
            breaker
                .trip(TransitionReason::ConsecutiveFailures)
                .is_some()
        );
        clock.advance(Duration::from_millis(250));
        assert!(breaker.try_start_probe());
        assert!(breaker.probe_failed(true).replace_connection);
    }

    #[test]
    fn new_rejects_an_invalid_config() {
        let config = BreakerConfig {
            window_size: 0,
            ..BreakerConfig::default()
        };
        let err = Breaker::new(config, Arc::new(FakeClock::default()), Labels::new("test"))
            .expect_err("window_size 0");
        assert!(matches!(err, Error::InvalidConfig { .. }), "{err:?}");
    }
}
