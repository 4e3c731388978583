//! How many instances share the global limit, as this instance believes.
//!
//! The heartbeat set in Redis says how many instances beat within the TTL, but
//! right after Redis comes back empty (a restart, a crash loop, an OOM kill) the
//! set holds only the instances that beat first: 1, then 2, for a second or so.
//! An instance that believed that would widen its local share to the whole
//! limit or half of it if Redis failed again in that second. Instances cannot
//! really leave faster than the heartbeat TTL, so the count used is never
//! below the largest count heard within the last TTL.
//!
//! Nor is the first count heard believed at once: in a fleet started
//! together the first instance to beat sees 1, the next 2, and an outage
//! before their next beats gave them the whole limit and half of it. A count
//! is learned once a beat has answered a while after the first one (the
//! builder's choice: when every instance started with this one has beaten
//! too); until then a count heard above the one assumed narrows the shares
//! (that is always safe), and nothing widens them. So it is after nothing
//! was heard for a TTL (an outage longer than it: Redis dropped every
//! instance meanwhile, and the first back hear 1, 2...): the count in force
//! stays until one is learned again, and so it is after any gap in the
//! beats (an outage shorter than the TTL): Redis may have come back empty
//! near the end of it, and the counts heard before it would expire while the
//! others are still on their way back.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Not learned yet: the heartbeat has not answered since the limiter started.
const UNKNOWN: u64 = 0;

/// The instance count local shares are sized for.
#[derive(Debug)]
pub(crate) struct InstanceCount {
    /// The count in force; [`UNKNOWN`] until learned (when not fixed).
    current: AtomicU64,
    heard: Mutex<Heard>,
    ttl_us: u64,
    /// How long after the first count heard a count is believed.
    learn_after_us: u64,
    /// A longer time between two counts heard is a gap in the beats.
    gap_us: u64,
}

#[derive(Debug, Default)]
struct Heard {
    /// When the first count was heard (monotonic clock µs).
    first_us: Option<u64>,
    /// Counts heard within the TTL, oldest first: (monotonic clock µs, count).
    counts: VecDeque<(u64, u64)>,
}

impl InstanceCount {
    /// A count that is known from the start and never changes by heartbeat.
    pub(crate) fn fixed(n: u64) -> Self {
        Self::with(n, Duration::ZERO, Duration::ZERO, Duration::ZERO)
    }

    /// A count learned from heartbeats, one answered at least every `beat`
    /// while Redis answers (the interval between two, plus a call's
    /// deadline), `assumed` until one answers `learn_after` after the first
    /// (`None`: unknown), and learned again that way after a gap in the
    /// beats.
    pub(crate) fn learned(
        assumed: Option<u64>,
        ttl: Duration,
        learn_after: Duration,
        beat: Duration,
    ) -> Self {
        Self::with(assumed.unwrap_or(UNKNOWN), ttl, learn_after, beat)
    }

    fn with(n: u64, ttl: Duration, learn_after: Duration, beat: Duration) -> Self {
        let us = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        InstanceCount {
            current: AtomicU64::new(n),
            heard: Mutex::new(Heard::default()),
            ttl_us: us(ttl),
            learn_after_us: us(learn_after),
            // One beat missed (its call timed out), or late, is not yet a
            // gap.
            gap_us: us(beat).saturating_mul(2),
        }
    }

    /// The count local shares are sized for, or `None` while it has never been
    /// learned (nor assumed).
    #[inline]
    pub(crate) fn get(&self) -> Option<u64> {
        match self.current.load(Ordering::Relaxed) {
            UNKNOWN => None,
            n => Some(n),
        }
    }

    /// A heartbeat answered `count` live instances at `now_us`: the count in
    /// force becomes the largest heard within the TTL (this one included),
    /// once learned (see the module's docs). Returns the count in force
    /// ([`UNKNOWN`] while there is none).
    pub(crate) fn heard(&self, count: u64, now_us: u64) -> u64 {
        let count = count.max(1);
        let mut heard = match self.heard.lock() {
            Ok(h) => h,
            Err(poisoned) => poisoned.into_inner(),
        };
        let horizon = now_us.saturating_sub(self.ttl_us);
        while heard.counts.front().is_some_and(|&(at, _)| at < horizon) {
            heard.counts.pop_front();
        }
        // The back is the last count heard (the deque's order, below).
        let last = heard.counts.back().map(|&(at, _)| at);
        if last.is_none_or(|at| now_us.saturating_sub(at) > self.gap_us) {
            // Nothing heard within the TTL (an outage longer than it), or a
            // gap in the beats (a shorter one): Redis may have dropped every
            // instance meanwhile, and the first beats after it see 1, 2...
            // Learned again, as at the start: the count in force holds until
            // every instance had the time to beat again, though what was
            // heard before the gap expires sooner.
            heard.first_us = Some(now_us);
        }
        let first = heard.first_us.unwrap_or(now_us);
        let counts = &mut heard.counts;
        // Keep only what could still be the maximum: a later, larger count makes
        // an earlier, smaller one irrelevant. The deque stays decreasing in count.
        while counts.back().is_some_and(|&(_, n)| n <= count) {
            counts.pop_back();
        }
        counts.push_back((now_us, count));
        let max = counts.front().map_or(count, |&(_, n)| n);
        let current = self.current.load(Ordering::Relaxed);
        let used = if now_us.saturating_sub(first) >= self.learn_after_us {
            max
        } else if current == UNKNOWN {
            UNKNOWN
        } else {
            current.max(max)
        };
        self.current.store(used, Ordering::Relaxed);
        used
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000;
    /// The longest time between two beats answered: the interval plus a
    /// call's deadline.
    const BEAT: Duration = Duration::from_secs(1);
    const TTL: Duration = Duration::from_secs(30);

    /// Learned from the first count heard.
    fn learned(assumed: Option<u64>) -> InstanceCount {
        InstanceCount::learned(assumed, Duration::from_secs(30), Duration::ZERO, BEAT)
    }

    // Regression: after Redis restarted empty, the heartbeat answered 1, then 2,
    // and the instance used those as its count, so a second outage in that
    // second gave it the whole limit or half of it as its local share.
    #[test]
    fn the_count_never_falls_faster_than_the_ttl() {
        let count = learned(None);
        assert_eq!(count.get(), None, "unknown until learned");
        assert_eq!(count.heard(3, 0), 3);
        // Redis came back empty: the first beats see 1, then 2.
        assert_eq!(count.heard(1, S), 3);
        assert_eq!(count.heard(2, 2 * S), 3);
        assert_eq!(count.get(), Some(3));
        // Only once the 3 is older than the TTL does the count fall, and then
        // only to the largest count heard since.
        assert_eq!(count.heard(2, 30 * S), 3, "3 was heard exactly a TTL ago");
        assert_eq!(count.heard(1, 31 * S), 2);
        // The 2 was heard at 30 s: it holds until 60 s.
        assert_eq!(count.heard(1, 60 * S), 2);
        assert_eq!(count.heard(1, 61 * S), 1);
    }

    #[test]
    fn a_larger_count_is_used_at_once() {
        let count = learned(Some(2));
        assert_eq!(count.get(), Some(2), "assumed until learned");
        assert_eq!(count.heard(5, 10), 5);
        assert_eq!(count.heard(0, 20), 5, "zero is read as this instance alone");
    }

    // Regression: in a fleet started together the first instance to beat
    // heard 1 and believed it, so an outage before its next beat gave it the
    // whole limit as its local share.
    #[test]
    fn the_first_count_is_believed_only_a_beat_later() {
        let count =
            InstanceCount::learned(None, Duration::from_secs(30), Duration::from_secs(1), BEAT);
        assert_eq!(
            count.heard(1, 0),
            UNKNOWN,
            "the others may not have beaten yet"
        );
        assert_eq!(count.get(), None);
        assert_eq!(count.heard(2, S / 2), UNKNOWN, "nor half a beat later");
        assert_eq!(count.heard(3, S), 3, "a beat later, every one has");
        assert_eq!(count.get(), Some(3));
        // Assumed: a larger count narrows the shares at once, a smaller one
        // waits its beat.
        let count = InstanceCount::learned(
            Some(2),
            Duration::from_secs(30),
            Duration::from_secs(1),
            BEAT,
        );
        assert_eq!(count.heard(1, 0), 2);
        assert_eq!(count.heard(4, S / 2), 4);
        let count = InstanceCount::learned(
            Some(4),
            Duration::from_secs(30),
            Duration::from_secs(1),
            BEAT,
        );
        assert_eq!(count.heard(1, 0), 4);
        assert_eq!(count.heard(2, S), 2, "learned: the largest within the TTL");
    }

    /// Beats once a second from `from` to `to` seconds (both included), each
    /// hearing `n`; the count in force after the last.
    fn each_second(count: &InstanceCount, n: u64, from: u64, to: u64) -> u64 {
        (from..=to).fold(UNKNOWN, |_, s| count.heard(n, s * S))
    }

    // Regression: after an outage longer than the TTL every count heard had
    // expired, and the first instance back heard 1 and believed it at once:
    // a second outage in the seconds the others took to come back gave it
    // the whole limit as its local share.
    #[test]
    fn after_nothing_was_heard_for_a_ttl_the_count_is_learned_again() {
        let count = InstanceCount::learned(None, TTL, Duration::from_secs(5), BEAT);
        assert_eq!(each_second(&count, 10, 0, 4), UNKNOWN);
        assert_eq!(each_second(&count, 10, 5, 6), 10);
        // A 60 s outage; Redis comes back empty and this instance beats first.
        assert_eq!(count.heard(1, 66 * S), 10, "the others are on their way");
        assert_eq!(each_second(&count, 2, 67, 70), 10);
        // Learned again a while after: the largest heard within the TTL.
        assert_eq!(each_second(&count, 3, 71, 71), 3);
        assert_eq!(count.get(), Some(3));
    }

    // Regression: Redis restarted empty near the end of an outage shorter
    // than the TTL. The first instance back heard 1, then 2, 3 while the
    // others came back (up to the longest cool-down later); the 10 heard
    // before the outage still counted, so nothing was learned again, and
    // once it expired the largest count since the heal (3) was in force: a
    // second outage then gave this instance a third of the limit, where a
    // tenth was its share.
    #[test]
    fn after_a_gap_in_the_beats_the_count_is_learned_again() {
        let count = InstanceCount::learned(None, TTL, Duration::from_secs(5), BEAT);
        assert_eq!(each_second(&count, 10, 0, 7), 10);
        // Out from 7 s to 35 s; Redis came back empty at 34 s.
        assert_eq!(count.heard(1, 35 * S), 10);
        assert_eq!(count.heard(2, 36 * S), 10);
        // The 10 heard at 7 s has expired; the others are not all back.
        assert_eq!(
            count.heard(3, 37_100_000),
            10,
            "the others are on their way"
        );
        assert_eq!(each_second(&count, 7, 38, 39), 10);
        // Learned again, 5 s after the first beat back: the largest since.
        assert_eq!(count.heard(9, 40 * S), 9);
    }

    /// Beats answered at most a beat apart (here a second: the interval and
    /// the call's deadline), or two beats apart when one between them timed
    /// out, are no gap: a count falls as the TTL says, without learning
    /// again.
    #[test]
    fn a_missed_beat_is_no_gap() {
        let count =
            InstanceCount::learned(None, Duration::from_secs(3), Duration::from_secs(5), BEAT);
        assert_eq!(each_second(&count, 4, 0, 5), 4);
        assert_eq!(count.heard(2, 7 * S), 4, "one beat missed: 4 heard 2 s ago");
        assert_eq!(
            count.heard(2, 9 * S),
            2,
            "the 4 expired; no gap, nothing to learn"
        );
        // A beat three seconds late is a gap: the count in force holds.
        assert_eq!(count.heard(1, 12 * S), 2);
        assert_eq!(each_second(&count, 1, 13, 16), 2);
        assert_eq!(
            count.heard(1, 17 * S),
            1,
            "learned again, 5 s after the gap"
        );
    }

    #[test]
    fn the_history_stays_small() {
        let count = learned(None);
        for i in 0..10_000u64 {
            count.heard(i % 7 + 1, i * 1_000);
        }
        let heard = count
            .heard
            .lock()
            .map(|h| h.counts.len())
            .unwrap_or(usize::MAX);
        assert!(
            heard <= 7,
            "a decreasing deque holds one entry per distinct count at most: {heard}"
        );
    }
}
