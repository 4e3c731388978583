//! Adaptive batching: checks that arrive while a script call is in flight
//! wait, and go together in one call of the batch script.
//!
//! * A check that finds fewer than [`EAGER_CALLS`] calls in flight sends its
//!   own call at once: an idle connection adds no wait.
//! * Checks that arrive meanwhile queue, in arrival order. When a call in
//!   flight ends (or its future is dropped), whoever ended it hands the queue
//!   (up to the batch bound) to a new task, which sends it as one call.
//! * A queue that holds as many checks as the calls in flight together (and
//!   at least [`EXTRA_CALL_MIN`]), or the batch bound, is sent at once,
//!   beside them: waiting longer would not make its call much cheaper per
//!   check, while the server may run out of work before the calls in flight
//!   come back.
//! * A queue waits for a call in flight to end at most the deadline ÷
//!   [`QUEUE_WAIT_SHARE`] (a tenth) from its first check's arrival; then that
//!   check sends it beside the calls in flight. Calls that take a
//!   large part of the deadline (a distant or slow server) would otherwise
//!   leave a queued check less than half of it for its own call.
//! * A queued check waits at most until its own deadline (counted from its
//!   arrival, as a lone call's); a batch call's deadline is the earliest of its
//!   checks', so a failed batch answers every check before any of their
//!   deadlines, and checks whose caller gave up are left out of the call.
//! * One call, one vote: of the checks of one call, exactly one has
//!   [`Checked::counts_call`] set, so a circuit breaker counts calls, not
//!   checks.

use std::borrow::Cow;
use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use tierlimit_core::{Result, RuleSet, validate_and_escape_key};
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::Verdict;

/// A user key validated ([`validate_key`](tierlimit_core::validate_key)) and escaped ([`escape_key`](tierlimit_core::escape_key)) once,
/// for every tier of one check: see [`RedisTier::check_key`](crate::RedisTier::check_key).
///
/// # Examples
///
/// ```
/// use tierlimit_redis::CheckKey;
///
/// let key = CheckKey::new("user:{42}")?;
/// assert_eq!(key.escaped(), "user:%7B42%7D");
/// assert!(CheckKey::new("bad\nkey").is_err());
/// # Ok::<(), tierlimit_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckKey<'a> {
    escaped: Cow<'a, str>,
}

impl<'a> CheckKey<'a> {
    /// Validates `key` and escapes it, in one pass over the key
    /// ([`validate_and_escape_key`]); the error is [`validate_key`](tierlimit_core::validate_key)'s.
    #[inline]
    pub fn new(key: &'a str) -> Result<CheckKey<'a>> {
        Ok(CheckKey {
            escaped: validate_and_escape_key(key)?,
        })
    }

    /// The escaped key: what goes inside the storage keys' hash tag.
    #[inline]
    pub fn escaped(&self) -> &str {
        &self.escaped
    }

    /// The key of stripe `stripe` (see [`stripe_key`](tierlimit_core::stripe_key)).
    pub(crate) fn striped(&self, stripe: u32) -> CheckKey<'_> {
        CheckKey {
            escaped: tierlimit_core::stripe_key(&self.escaped, stripe),
        }
    }
}

/// One check's outcome from [`RedisTier::check_key`](crate::RedisTier::check_key)
/// (`T` a [`Verdict`]), or from
/// [`RedisTier::check_after_key`](crate::RedisTier::check_after_key) (the
/// verdict and the write-backs' outcomes).
///
/// # Examples
///
/// ```no_run
/// # async fn run(tier: &tierlimit_redis::RedisTier, set: &tierlimit_core::RuleSet) -> tierlimit_core::Result<()> {
/// let key = tierlimit_redis::CheckKey::new("user:42")?;
/// let checked = tier.check_key(&key, set, 1).await;
/// if checked.counts_call {
///     // record checked.result's success or failure in a breaker, once per call
/// }
/// let verdict = checked.result?;
/// # let _ = verdict; Ok(()) }
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub struct Checked<T = Verdict> {
    /// The verdict, or the error a lone call would have met.
    pub result: Result<T>,
    /// True for exactly one check of each script call: the first whose result
    /// is a Redis fault if any is (a key's fault, `WRONGTYPE`, is not one:
    /// see [`Error::is_key_fault`](tierlimit_core::Error::is_key_fault)),
    /// else the first. A circuit breaker that
    /// records only these counts a batch of N checks as the one call it was,
    /// failed or not. False for a check that gave up while queued (its
    /// deadline passed before its batch was sent): the call it waited behind
    /// reports itself. False for every check of a call that failed on one
    /// Cluster master while another answers: that master's fault, not the
    /// deployment's. False for bad input and for a check answered unsent
    /// ([`NodeDown`](tierlimit_core::RedisFailure::NodeDown)): no call. A
    /// call whose reporting check its caller dropped goes to the hook of
    /// [`RedisTier::on_unheard`](crate::RedisTier::on_unheard) instead.
    pub counts_call: bool,
}

/// A check's call that no check's [`Checked::counts_call`] reported,
/// because the check was dropped first (by its caller: an outer timeout, a
/// client gone; or by the deadline of a striped check or of one carrying
/// write-backs, over the call): handed to the hook set with
/// [`RedisTier::on_unheard`](crate::RedisTier::on_unheard), so a circuit
/// breaker still hears of every call. Without it, callers that give up
/// sooner than the deadline would hide a hung server from the breaker.
#[derive(Debug)]
#[non_exhaustive]
pub enum Unheard {
    /// A batch's call ended after `latency`, and the check that was to
    /// report it had been dropped: `Ok` when the server answered, else the
    /// error every check of it met.
    Ended {
        /// How long the call took.
        latency: Duration,
        /// How it ended.
        result: Result<()>,
    },
    /// A check's own call was dropped `after` this long, unanswered so
    /// far: how it would have ended is unknown.
    Abandoned {
        /// How long the call had been under way.
        after: Duration,
    },
}

/// Calls of checks that may be in flight before checks start to queue. Two,
/// not one: while one call is on the server the next is on its way (or the
/// client is reading the last replies), so neither side waits for the other;
/// with one, a server on its own core idled while the client woke the
/// batch's callers (measured: at c = 8, 0.76× the checks/s of no batching).
pub(crate) const EAGER_CALLS: usize = 2;

/// The fewest checks a batch holds that goes beside [`EAGER_CALLS`] or more
/// calls in flight before one of them ends (see [`Batcher::enter`]). Below
/// it, the call's own cost on the server (a few µs, about one check's) would
/// weigh too much on each check. Measured on `redis-load`'s A side (GCRA,
/// 100,000 keys) against the rule before, where a queue waited for a call to
/// end unless it reached the bound: checks/s about 1.35× at c = 8 and 1.3× at
/// c = 50, the same at c = 200, where queues reach the bound anyway; a floor
/// of 8 or 16 did no better at c = 50 and worse at c = 8.
pub(crate) const EXTRA_CALL_MIN: usize = 4;

/// A queue goes beside the calls in flight once its first check has waited a
/// deadline divided by this for one of them to end. On a near server under
/// load calls end within a millisecond, far sooner (the default deadline is
/// 50 ms), so this changes nothing there; when a call takes half the
/// deadline, a queued check waited up to half of it for a call to end and
/// then spent as long on its own, and a little noise pushed it past the
/// deadline (the chaos scenario `latency-below-deadline`: checks answered
/// by their policy while Redis answered every call in time).
pub(crate) const QUEUE_WAIT_SHARE: u32 = 10;

/// A check waiting for a batch.
pub(crate) struct Queued {
    pub(crate) escaped: String,
    pub(crate) set: RuleSet,
    pub(crate) cost: u64,
    pub(crate) now: u64,
    pub(crate) nonce: u64,
    pub(crate) deadline: Instant,
    pub(crate) tx: oneshot::Sender<Checked>,
}

#[derive(Default)]
struct State {
    /// Script calls of checks under way (a lone one or batches).
    in_flight: usize,
    /// The checks of those calls.
    in_flight_checks: usize,
    queue: VecDeque<Queued>,
    /// Bumped each time the queue is taken: a check that started a queue
    /// sends only that queue (see [`Batcher::flush`]).
    generation: u64,
}

impl State {
    /// Takes up to `max` queued checks for one more call in flight.
    fn take(&mut self, max: usize) -> Vec<Queued> {
        let take = self.queue.len().min(max);
        self.in_flight += 1;
        self.in_flight_checks += take;
        self.generation += 1;
        self.queue.drain(..take).collect()
    }
}

/// The queue of one connection's checks.
pub(crate) struct Batcher {
    state: Mutex<State>,
    max: usize,
}

impl std::fmt::Debug for Batcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batcher").field("max", &self.max).finish()
    }
}

/// What a check arriving at the batcher does.
pub(crate) enum Entry {
    /// Few calls are in flight: send a lone call now (and end it with
    /// [`Batcher::done`]).
    Send,
    /// Queued: wait on `rx`.
    Wait {
        /// Where the check's answer comes.
        rx: oneshot::Receiver<Checked>,
        /// The queue, when this check made it large enough to go at once:
        /// the caller sends it (and ends it with `done`).
        full: Option<Vec<Queued>>,
        /// The queue's generation, when this check started it: the caller
        /// [`flush`](Batcher::flush)es it if no call has taken it within the
        /// deadline ÷ [`QUEUE_WAIT_SHARE`].
        first: Option<u64>,
    },
}

impl Batcher {
    /// Batches of at most `max` checks; 1 turns batching off.
    pub(crate) fn new(max: usize) -> Batcher {
        Batcher {
            state: Mutex::new(State::default()),
            max: max.max(1),
        }
    }

    pub(crate) fn enabled(&self) -> bool {
        self.max > 1
    }

    /// The most checks one batch holds.
    pub(crate) fn max(&self) -> usize {
        self.max
    }

    /// A check arrives; `make` builds its queue entry, only if it must wait.
    ///
    /// The queue goes at once (the caller sends it) when it holds the batch
    /// bound, or as many checks as the calls in flight and at least
    /// [`EXTRA_CALL_MIN`]: by then it is as large a call as those, and
    /// holding it back until one of them ends could leave the server idle
    /// meanwhile. So under steady load batches stay about a third to a half
    /// of the checks waiting, and calls in flight grow with the load rather
    /// than stopping at two.
    pub(crate) fn enter(&self, make: impl FnOnce(oneshot::Sender<Checked>) -> Queued) -> Entry {
        let mut state = self.lock();
        if state.in_flight < EAGER_CALLS {
            state.in_flight += 1;
            state.in_flight_checks += 1;
            return Entry::Send;
        }
        let (tx, rx) = oneshot::channel();
        state.queue.push_back(make(tx));
        let queued = state.queue.len();
        if queued >= self.max.min(state.in_flight_checks.max(EXTRA_CALL_MIN)) {
            let full = state.take(self.max);
            return Entry::Wait {
                rx,
                full: Some(full),
                first: None,
            };
        }
        Entry::Wait {
            rx,
            full: None,
            first: (queued == 1).then_some(state.generation),
        }
    }

    /// The queue of `generation`, if no call has taken it yet, to send beside
    /// the calls in flight (ended with [`done`](Self::done) like any call).
    pub(crate) fn flush(&self, generation: u64) -> Option<Vec<Queued>> {
        let mut state = self.lock();
        (state.generation == generation && !state.queue.is_empty()).then(|| state.take(self.max))
    }

    /// A call of `checks` checks ended: the next batch for its sender to
    /// send, or None when the queue is empty (one call fewer in flight then).
    pub(crate) fn done(&self, checks: usize) -> Option<Vec<Queued>> {
        let mut state = self.lock();
        state.in_flight_checks = state.in_flight_checks.saturating_sub(checks);
        // This call's slot goes to the next batch, if any.
        state.in_flight = state.in_flight.saturating_sub(1);
        if state.queue.is_empty() {
            return None;
        }
        Some(state.take(self.max))
    }

    /// A batch of `checks` could not be sent (no runtime to send it on): one
    /// call fewer in flight, and every queued check is dropped (its waiter
    /// sees a timeout).
    pub(crate) fn abandon(&self, checks: usize) {
        let mut state = self.lock();
        state.in_flight = state.in_flight.saturating_sub(1);
        state.in_flight_checks = state.in_flight_checks.saturating_sub(checks);
        state.queue.clear();
        state.generation += 1;
    }

    /// Script calls of checks under way.
    #[cfg(test)]
    pub(crate) fn in_flight(&self) -> usize {
        self.lock().in_flight
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock leaves a consistent state (every
        // change above is one step), so a poisoned lock is used as is.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Which check of one call's results reports the call: the first Redis
/// fault (not a key's: [`Error::is_key_fault`](tierlimit_core::Error::is_key_fault)),
/// else the first.
pub(crate) fn reporter(results: &[Result<Verdict>]) -> usize {
    results
        .iter()
        .position(|r| matches!(r, Err(e) if !e.is_bad_input() && !e.is_key_fault()))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tierlimit_core::Rule;

    /// A call's report goes to its first check that met a fault of Redis,
    /// past any key's fault: a key of another type first in a batch hid an
    /// `-OOM` after it (the facade counts a key's fault as an answer).
    #[test]
    fn the_reporter_is_the_first_fault_of_redis() {
        use tierlimit_core::{Error, RedisFailure};
        let fault = |kind| Err(Error::redis(kind, None));
        let results = [
            fault(RedisFailure::WrongType),
            fault(RedisFailure::OutOfMemory),
            fault(RedisFailure::OutOfMemory),
        ];
        assert_eq!(reporter(&results), 1);
        let results = [
            fault(RedisFailure::WrongType),
            fault(RedisFailure::WrongType),
        ];
        assert_eq!(reporter(&results), 0, "none of Redis: the first");
    }

    fn queued(tx: oneshot::Sender<Checked>) -> Queued {
        Queued {
            escaped: "k".into(),
            set: RuleSet::new("s", [Rule::per_second(1).expect("valid")]).expect("valid"),
            cost: 1,
            now: 0,
            nonce: 1,
            deadline: Instant::now(),
            tx,
        }
    }

    fn wait(entry: Entry) -> (oneshot::Receiver<Checked>, Option<Vec<Queued>>) {
        match entry {
            Entry::Wait { rx, full, .. } => (rx, full),
            Entry::Send => panic!("expected to queue"),
        }
    }

    /// Checks go at once while fewer than EAGER_CALLS calls are in flight,
    /// queue after that, and a full queue leaves as one batch.
    #[tokio::test]
    async fn sends_eagerly_then_queues_then_sends_full_batches() {
        let batcher = Batcher::new(3);
        for _ in 0..EAGER_CALLS {
            assert!(matches!(batcher.enter(queued), Entry::Send));
        }
        let (_a, full) = wait(batcher.enter(queued));
        assert!(full.is_none());
        let (_b, full) = wait(batcher.enter(queued));
        assert!(full.is_none());
        let (_c, full) = wait(batcher.enter(queued));
        assert_eq!(
            full.map(|f| f.len()),
            Some(3),
            "the third queued check fills the batch"
        );
        // EAGER_CALLS lone calls + one batch in flight; the queue is empty.
        for _ in 0..EAGER_CALLS {
            assert!(batcher.done(1).is_none());
        }
        assert!(batcher.done(3).is_none());
        assert!(matches!(batcher.enter(queued), Entry::Send), "idle again");
    }

    /// A call that ends while checks queue hands them on (at most the bound
    /// at a time) instead of going idle.
    #[tokio::test]
    async fn an_ended_call_hands_the_queue_on_in_bounded_batches() {
        let batcher = Batcher::new(2);
        for _ in 0..EAGER_CALLS {
            assert!(matches!(batcher.enter(queued), Entry::Send));
        }
        let (_a, _) = wait(batcher.enter(queued));
        let (_b, full) = wait(batcher.enter(queued));
        let full = full.expect("two queued fill a batch of 2");
        assert_eq!(full.len(), 2);
        let (_c, _) = wait(batcher.enter(queued));
        let next = batcher.done(1).expect("one check still queued");
        assert_eq!(next.len(), 1);
        // Still EAGER_CALLS + 1 calls in flight (the hand-off keeps its slot).
        assert!(matches!(batcher.enter(queued), Entry::Wait { .. }));
        batcher.abandon(1);
        for _ in 0..EAGER_CALLS {
            assert!(batcher.done(1).is_none());
        }
        assert!(matches!(batcher.enter(queued), Entry::Send));
    }

    /// Below the bound, a queue goes beside the calls in flight once it holds
    /// as many checks as they do, and at least EXTRA_CALL_MIN; not before.
    #[tokio::test]
    async fn a_queue_as_large_as_the_calls_in_flight_goes_at_once() {
        let batcher = Batcher::new(32);
        for _ in 0..EAGER_CALLS {
            assert!(matches!(batcher.enter(queued), Entry::Send));
        }
        let queue = |n: usize| {
            let mut rxs = Vec::new();
            for i in 1..=n {
                let (rx, full) = wait(batcher.enter(queued));
                rxs.push(rx);
                if i < n {
                    assert!(full.is_none(), "{i} of {n} queued went early");
                } else {
                    assert_eq!(full.map(|f| f.len()), Some(n), "{n} queued stayed");
                }
            }
            rxs
        };
        // 2 checks in flight: the queue waits for EXTRA_CALL_MIN.
        let _a = queue(EXTRA_CALL_MIN.max(EAGER_CALLS));
        // 2 + 4 in flight: 6; then 12, 24; then the bound.
        let _b = queue(6);
        let _c = queue(12);
        let _d = queue(24);
        let _e = queue(32);
        // A call of 12 ends: 68 checks in flight, so the bound sends the next.
        assert!(batcher.done(12).is_none());
        let _f = queue(32);
    }

    /// The check that starts a queue may send it beside the calls in flight
    /// (once), and only that queue: not one a call has taken since, nor the
    /// next one.
    #[tokio::test]
    async fn the_first_queued_check_flushes_its_own_queue_only() {
        let batcher = Batcher::new(32);
        for _ in 0..EAGER_CALLS {
            assert!(matches!(batcher.enter(queued), Entry::Send));
        }
        let first = |entry: Entry| match entry {
            Entry::Wait {
                rx,
                full: None,
                first,
            } => (rx, first),
            _ => panic!("expected to queue below the bound"),
        };
        let (_a, generation) = first(batcher.enter(queued));
        let generation = generation.expect("the first queued check starts the queue");
        let (_b, second) = first(batcher.enter(queued));
        assert_eq!(second, None, "only the first check flushes");
        let flushed = batcher
            .flush(generation)
            .expect("the queue is still waiting");
        assert_eq!(flushed.len(), 2);
        assert!(batcher.flush(generation).is_none(), "taken already");
        // The flushed call is one more in flight: the next queue forms at
        // once, and a call that ends hands it on before its starter flushes.
        let (_c, next) = first(batcher.enter(queued));
        let next = next.expect("a new queue");
        assert_ne!(next, generation);
        assert_eq!(batcher.done(1).map(|q| q.len()), Some(1));
        assert!(batcher.flush(next).is_none(), "a call took it");
        let (_d, later) = first(batcher.enter(queued));
        assert!(
            batcher.flush(next).is_none(),
            "not the starter of this queue"
        );
        assert_eq!(
            batcher.flush(later.expect("a new queue")).map(|q| q.len()),
            Some(1)
        );
    }

    /// Bad input is not a fault of the call: the first Redis fault reports it.
    #[test]
    fn the_first_fault_reports_the_call() {
        let fault = || {
            Err(tierlimit_core::Error::redis(
                tierlimit_core::RedisFailure::Timeout,
                None,
            ))
        };
        let bad =
            || Err(tierlimit_core::validate_key("bad\nkey").expect_err("a control character"));
        assert_eq!(reporter(&[fault(), fault()]), 0);
        assert_eq!(reporter(&[bad(), fault()]), 1);
        assert_eq!(reporter(&[bad(), bad()]), 0);
    }
}
