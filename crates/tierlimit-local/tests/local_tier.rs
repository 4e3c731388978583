//! The local tier's bounds, denial cache and warm start, with a fake clock.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use tierlimit_core::{Algorithm, Clock, Decision, FakeClock, Rule, RuleSet, RuleState, Tier};
use tierlimit_local::{LocalAnswer, LocalConfig, LocalTier};

fn tier(config: LocalConfig) -> (LocalTier, FakeClock) {
    let clock = FakeClock::default();
    let tier = LocalTier::new(config, Arc::new(clock.clone())).expect("valid config");
    (tier, clock)
}

fn allowed(answer: LocalAnswer) -> bool {
    matches!(answer, LocalAnswer::Decided(d) if d.allowed)
}

#[test]
fn a_full_map_refuses_new_keys_but_serves_existing_ones() {
    let (local, _) = tier(LocalConfig {
        max_keys: 100,
        ..LocalConfig::default()
    });
    let set = RuleSet::new("s", [Rule::per_minute(10).expect("valid")]).expect("valid");
    for i in 0..1_000 {
        local.check(&format!("k{i}"), &set, 1, 1, false);
    }
    assert_eq!(local.len(), 100);
    assert_eq!(local.refused(), 900);
    assert_eq!(local.check("k999", &set, 1, 1, false), LocalAnswer::Full);
    assert!(allowed(local.check("k0", &set, 1, 1, false)));
}

#[test]
fn the_bound_holds_under_concurrent_inserts() {
    let (local, _) = tier(LocalConfig {
        max_keys: 1_000,
        ..LocalConfig::default()
    });
    let local = Arc::new(local);
    let set = RuleSet::new("s", [Rule::per_minute(10).expect("valid")]).expect("valid");
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let (local, set) = (local.clone(), set.clone());
            std::thread::spawn(move || {
                for i in 0..5_000 {
                    local.check(&format!("t{t}-{i}"), &set, 1, 1, false);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("no panic");
    }
    assert_eq!(local.len(), 1_000);
    assert_eq!(local.refused(), 19_000);
}

#[test]
fn prune_forgets_idle_keys_only() {
    let (local, clock) = tier(LocalConfig::default());
    let set = RuleSet::new("s", [Rule::per_second(10).expect("valid")]).expect("valid");
    local.check("idle", &set, 1, 1, false);
    clock.advance(Duration::from_millis(500));
    for _ in 0..10 {
        local.check("busy", &set, 1, 1, false);
    }
    clock.advance(Duration::from_millis(600));
    local.prune();
    assert_eq!(
        local.len(),
        1,
        "the idle key is full again and forgotten; the busy one still owes"
    );
}

#[test]
fn a_cached_denial_answers_until_its_retry_after() {
    let (local, clock) = tier(LocalConfig::default());
    let set = RuleSet::new("s", [Rule::per_second(10).expect("valid")]).expect("valid");
    let denial = Decision::denied(
        10,
        Duration::from_secs(1),
        Duration::from_millis(100),
        0,
        Tier::Redis,
    );
    local.cache_denial("k", &set, 2, &denial);
    let hit = local.cached_denial("k", &set, 2).expect("cached");
    assert_eq!(hit.tier, Tier::DenyCache);
    assert_eq!(hit.retry_after, Some(Duration::from_millis(100)));
    assert!(
        local.cached_denial("k", &set, 1).is_none(),
        "a smaller cost may still pass"
    );
    assert!(local.cached_denial("other", &set, 2).is_none());
    clock.advance(Duration::from_millis(60));
    let later = local.cached_denial("k", &set, 3).expect("cached");
    assert_eq!(
        (later.retry_after, later.reset_after),
        (Some(Duration::from_millis(40)), Duration::from_millis(940)),
        "both count down from Redis' denial"
    );
    clock.advance(Duration::from_millis(40));
    assert!(local.cached_denial("k", &set, 2).is_none());
    assert_eq!(local.denial_count(), 0);
}

#[test]
fn warm_start_gives_each_instance_its_share_of_what_remained() {
    let (local, _) = tier(LocalConfig::default());
    let set = RuleSet::new("s", [Rule::per_hour(100).expect("valid")]).expect("valid");
    local.remember(
        "k",
        &set,
        [(10, Duration::from_secs(3600))].into_iter(),
        local.outage(),
    );
    let admitted = (0..100)
        .filter(|_| allowed(local.check("k", &set, 1, 3, true)))
        .count();
    assert_eq!(admitted, 4, "ceil(10 / 3)");
    assert_eq!(local.ledger().units(), 4);
}

#[test]
fn a_rule_set_is_all_or_nothing_locally() {
    let (local, _) = tier(LocalConfig::default());
    let set = RuleSet::new(
        "s",
        [
            Rule::per_second(3).expect("valid"),
            Rule::per_minute(100).expect("valid"),
        ],
    )
    .expect("valid");
    let admitted = (0..10)
        .filter(|_| allowed(local.check("k", &set, 1, 1, true)))
        .count();
    assert_eq!(admitted, 3);
    // Each rule was charged only for the admitted three (every rule reconciles
    // by default: a window still live at the heal changes decisions).
    let claims = local.ledger().claim(10, u64::MAX);
    assert_eq!(claims.len(), 2, "one entry per rule: {claims:?}");
    assert!(claims.iter().all(|c| c.entry.units == 3), "{claims:?}");
}

fn admitted(local: &LocalTier, key: &str, set: &RuleSet, instances: u64, tries: usize) -> usize {
    (0..tries)
        .filter(|_| allowed(local.check(key, set, 1, instances, true)))
        .count()
}

/// Regression (issue 9, item 1): a bucket outlived its outage. A key that
/// used part of its share in one outage, then Redis for a while, met the next
/// outage with the first one's leftover instead of what Redis last said.
#[test]
fn each_outage_starts_from_the_warm_seed_not_an_older_bucket() {
    let (local, clock) = tier(LocalConfig::default());
    let set = RuleSet::new("h", [Rule::per_hour(60).expect("valid")]).expect("valid");
    // Outage 1: three instances, a share of 20; this one admits 5 of them.
    assert_eq!(admitted(&local, "k", &set, 3, 5), 5);
    local.end_outage(local.outage(), Duration::ZERO);
    // Healthy: Redis takes the rest of the hour's quota down to 3.
    clock.advance(Duration::from_secs(1));
    local.remember(
        "k",
        &set,
        [(3, Duration::from_secs(3600))].into_iter(),
        local.outage(),
    );
    // Outage 2: ceil(3 / 3) = 1 from the seed, not the 15 left from outage 1.
    assert_eq!(admitted(&local, "k", &set, 3, 30), 1);
    // Pruning drops what an ended outage left.
    local.end_outage(local.outage(), Duration::ZERO);
    local.prune();
    assert!(local.is_empty());
}

/// Regression (chaos `crash-loop`, stop 28): Redis answered again for half a
/// second, then went again before this key was asked of it. The second
/// outage started the key afresh from its seed of before the first, so it got
/// a second share in the same window. A bucket carries on into the next
/// outage until Redis has reported on its key since its outage ended.
#[test]
fn a_second_outage_before_redis_reports_on_the_key_carries_on_its_bucket() {
    let (local, clock) = tier(LocalConfig::default());
    let hourly = RuleSet::new("h", [Rule::per_hour(300).expect("valid")]).expect("valid");
    let window = Rule::with_period(61, Duration::from_secs(2))
        .and_then(|r| r.with_algorithm(Algorithm::FixedWindow))
        .expect("valid");
    let both = RuleSet::new("b", [window, Rule::per_hour(300).expect("valid")]).expect("valid");
    // Healthy: Redis last said 290 of the hour's 300 were left.
    local.remember(
        "k",
        &hourly,
        [(290, Duration::from_secs(3_600))].into_iter(),
        local.outage(),
    );
    // What each set admits of 200 tries, with `instances` instances.
    let admits = |instances| {
        (
            admitted(&local, "k", &hourly, instances, 200),
            admitted(&local, "k", &both, instances, 200),
        )
    };
    // Outage 1, four instances: ceil(290 / 4) = 73 of the hourly share, and
    // 16 of the window's (with the hour's 75 behind it).
    assert_eq!(admits(4), (73, 16));
    local.end_outage(local.outage(), Duration::from_millis(100));
    // Outage 2, half a second later (settled), in the same window: nothing
    // is left.
    clock.advance(Duration::from_millis(500));
    assert_eq!(admits(4), (0, 0));
    // An instance count learned between the outages (one instance fewer):
    // what this instance used is kept, judged by its new share, 100 of the
    // hour with 75 used and 21 of the window with 16 used.
    local.end_outage(local.outage(), Duration::ZERO);
    assert_eq!(admits(3), (25, 5));
    // Ended, settled and pruned with no report on the key in between: the
    // buckets go, and what they used stays as the keys' seeds.
    local.end_outage(local.outage(), Duration::ZERO);
    local.prune();
    assert!(local.is_empty());
    assert_eq!(admits(3), (0, 0));
    local.end_outage(local.outage(), Duration::ZERO);
    // Once Redis has reported on a key after the outage, its report seeds the
    // next one, here more room than the bucket had: ceil(100 / 4) = 25. The
    // other set's key was not reported on: still nothing left.
    local.remember(
        "k",
        &hourly,
        [(100, Duration::from_secs(3_600))].into_iter(),
        local.outage(),
    );
    assert_eq!(admits(4), (25, 0));
}

/// A bucket pruned before Redis reported on its key leaves its usage as the
/// key's warm seed; when the warm map is full, the bucket stays instead:
/// dropped with nowhere to keep its usage, its key would start the next
/// outage from full.
#[test]
fn a_bucket_whose_seed_finds_no_room_is_kept_not_forgotten() {
    let (local, clock) = tier(LocalConfig {
        max_warm_keys: 1,
        ..LocalConfig::default()
    });
    let hourly = RuleSet::new("h", [Rule::per_hour(100).expect("valid")]).expect("valid");
    // Outage 1: both keys spend their whole share.
    assert_eq!(admitted(&local, "a", &hourly, 1, 200), 100);
    assert_eq!(admitted(&local, "b", &hourly, 1, 200), 100);
    local.end_outage(local.outage(), Duration::ZERO);
    clock.advance(Duration::from_millis(1));
    local.prune();
    // One seed fits; the other key's bucket is kept.
    assert_eq!((local.warm_count(), local.len()), (1, 1));
    // Outage 2, in the same hour: neither key has anything left.
    assert_eq!(
        (
            admitted(&local, "a", &hourly, 1, 200),
            admitted(&local, "b", &hourly, 1, 200)
        ),
        (0, 0)
    );
    // Once the hour has passed, the kept bucket is idle and goes.
    local.end_outage(local.outage(), Duration::ZERO);
    clock.advance(Duration::from_secs(3_601));
    local.prune();
    assert!(local.is_empty());
}

/// A sliding window's estimate weighs the window before the current one, and
/// so do its seeds: a report taken late in one window, or a bucket pruned
/// early in the next, still bounds the key in the next window. Seeds that
/// kept only the current window's count let a key start a window from
/// nothing right after spending a whole limit.
#[test]
fn a_sliding_window_seed_keeps_weighing_the_window_before() {
    // A minute boundary.
    let clock = FakeClock::new(1_699_999_980_000_000);
    let local = LocalTier::new(LocalConfig::default(), Arc::new(clock.clone())).expect("valid");
    let rule = Rule::per_minute(100)
        .and_then(|r| r.with_algorithm(Algorithm::SlidingWindow))
        .expect("valid");
    let reported = RuleSet::new("r", [rule.clone()]).expect("valid");
    let pruned = RuleSet::new("p", [rule]).expect("valid");
    // 50 s into the minute Redis says nothing is left of one set's key, and
    // an outage spends the other set's whole share.
    clock.advance(Duration::from_secs(50));
    local.remember(
        "k",
        &reported,
        [(0, Duration::from_secs(70))].into_iter(),
        local.outage(),
    );
    assert_eq!(admitted(&local, "k", &pruned, 1, 200), 100);
    // 1 s into the next minute the outage goes on: 100 * 59/60 of the
    // minute before still weigh, room for 1 more.
    clock.advance(Duration::from_secs(11));
    assert_eq!(admitted(&local, "k", &pruned, 1, 200), 1);
    // The bucket is pruned with no report on its key: its estimate (1 +
    // ceil(98.3)) is its seed.
    local.end_outage(local.outage(), Duration::ZERO);
    local.prune();
    assert!(local.is_empty());
    // Outage 2, 2 s into the minute: the report weighs 100 * 58/60, room
    // for 3; the pruned bucket's seed leaves nothing.
    clock.advance(Duration::from_secs(1));
    assert_eq!(
        (
            admitted(&local, "k", &reported, 1, 200),
            admitted(&local, "k", &pruned, 1, 200)
        ),
        (3, 0)
    );
}

/// A clock that counts its wall-clock reads.
#[derive(Debug, Default)]
struct CountingClock {
    inner: FakeClock,
    wall_reads: AtomicU64,
}

impl Clock for CountingClock {
    fn now(&self) -> Duration {
        self.inner.now()
    }

    fn unix_micros(&self) -> u64 {
        self.wall_reads.fetch_add(1, Ordering::Relaxed);
        self.inner.unix_micros()
    }
}

/// `settling` is on every healthy check's path: it bounds keys while the
/// outage that just ended settles, then costs no clock read until the next
/// outage ends.
#[test]
fn settling_reads_no_clock_once_settled() {
    let clock = Arc::new(CountingClock::default());
    let local = LocalTier::new(LocalConfig::default(), clock.clone()).expect("valid");
    let set = RuleSet::new("s", [Rule::per_hour(10).expect("valid")]).expect("valid");
    let reads = || clock.wall_reads.load(Ordering::Relaxed);
    // Before any outage: no read.
    let before = reads();
    assert!(local.settling("k", &set, 1, || None, None).is_none());
    assert_eq!(reads(), before);
    // An outage spends the key's share; while it settles the bucket answers.
    assert_eq!(admitted(&local, "k", &set, 1, 20), 10);
    local.end_outage(local.outage(), Duration::from_secs(5));
    assert!(
        local
            .settling("k", &set, 1, || None, None)
            .is_some_and(|d| !d.allowed)
    );
    // Settled: one read finds it so, the checks after it read nothing.
    clock.inner.advance(Duration::from_secs(5));
    assert!(local.settling("k", &set, 1, || None, None).is_none());
    let settled = reads();
    for _ in 0..100 {
        assert!(local.settling("k", &set, 1, || None, None).is_none());
    }
    assert_eq!(reads(), settled);
    // The next outage (the hour's share still spent) ends: it bounds the
    // key again.
    assert_eq!(admitted(&local, "k", &set, 1, 20), 0);
    local.end_outage(local.outage(), Duration::from_secs(5));
    assert!(
        local
            .settling("k", &set, 1, || None, None)
            .is_some_and(|d| !d.allowed)
    );
}

/// Regression (issue 9, item 3): local state was keyed by the rule set's name,
/// and a bucket was rebuilt whenever the stored set differed, so two sets with
/// one name (or a rule's period edited during a rolling deploy) reset each
/// other on every alternation and applied each other's denials. (Sets that
/// differ only in limits share their state since issue 13: see
/// tests/limit_change.rs.)
#[test]
fn two_sets_with_one_name_keep_their_own_local_state() {
    let (local, _) = tier(LocalConfig::default());
    let five = RuleSet::new("same", [Rule::per_hour(5).expect("valid")]).expect("valid");
    let seven = RuleSet::new(
        "same",
        [Rule::with_period(7, Duration::from_secs(7_200)).expect("valid")],
    )
    .expect("valid");
    assert_ne!(five.identity(), seven.identity());
    let (mut a, mut b) = (0, 0);
    for _ in 0..20 {
        a += usize::from(allowed(local.check("k", &five, 1, 1, false)));
        b += usize::from(allowed(local.check("k", &seven, 1, 1, false)));
    }
    assert_eq!((a, b), (5, 7));

    let denial = Decision::denied(
        5,
        Duration::from_secs(60),
        Duration::from_secs(60),
        0,
        Tier::Redis,
    );
    local.cache_denial("u", &five, 1, &denial);
    assert!(local.cached_denial("u", &five, 1).is_some());
    assert!(
        local.cached_denial("u", &seven, 1).is_none(),
        "a denial of one set answered for the other"
    );
    // Policy and reconcile setting are not part of the identity: state is shared.
    let five_closed = five.clone().with_policy(tierlimit_core::Policy::FailClosed);
    assert!(local.cached_denial("u", &five_closed, 1).is_some());
}

/// Regression (issue 9, item 17): denials cached at a window boundary all
/// expired at the same instant, so the whole fleet returned to Redis at once.
/// 2,000 keys denied together with a retry-after of 1 s leave the cache spread
/// over its last fifth, never after the retry-after, and while cached still
/// answer with Redis' own retry-after.
#[test]
fn cached_denials_expire_spread_and_never_late() {
    let (local, clock) = tier(LocalConfig::default());
    let set = RuleSet::new("s", [Rule::per_second(10).expect("valid")]).expect("valid");
    let denial = Decision::denied(
        10,
        Duration::from_secs(1),
        Duration::from_secs(1),
        0,
        Tier::Redis,
    );
    const KEYS: usize = 2_000;
    for i in 0..KEYS {
        local.cache_denial(&format!("k{i}"), &set, 1, &denial);
    }
    let mut cached: Vec<bool> = vec![true; KEYS];
    let mut most_in_one_ms = 0;
    for ms in 1..=1_000u64 {
        clock.advance(Duration::from_millis(1));
        let mut left = 0;
        for (i, c) in cached.iter_mut().enumerate().filter(|(_, c)| **c) {
            match local.cached_denial(&format!("k{i}"), &set, 1) {
                Some(d) => {
                    assert_eq!(d.retry_after, Some(Duration::from_millis(1_000 - ms)));
                }
                None => {
                    *c = false;
                    left += 1;
                    assert!(
                        ms > 800,
                        "k{i} left the cache {ms} ms into a 1,000 ms retry-after"
                    );
                }
            }
        }
        most_in_one_ms = most_in_one_ms.max(left);
    }
    assert!(
        cached.iter().all(|c| !c),
        "a denial outlived its retry-after"
    );
    // Uniform over 200 ms: about 10 a millisecond; all 2,000 at once without the spread.
    assert!(
        most_in_one_ms <= 60,
        "{most_in_one_ms} keys returned to Redis in one millisecond"
    );
}

/// An outage is the checks decided locally until Redis answers a call sent
/// in it, however short: one failed call while the breaker stays Closed is
/// one. A report from a call sent after its end supersedes its bucket; one
/// from a call sent before (in flight while the bucket admitted) does not,
/// and the next outage goes on from the bucket.
#[test]
fn a_report_supersedes_the_buckets_of_outages_ended_before_its_call() {
    let (local, clock) = tier(LocalConfig::default());
    let set = RuleSet::new("h", [Rule::per_hour(60).expect("valid")]).expect("valid");
    let hour = Duration::from_secs(3_600);
    // Nothing decided locally: there is nothing to end.
    let first = local.outage();
    local.end_outage(first, Duration::ZERO);
    assert_eq!(local.outage(), first);
    // Two calls fail, one for each key: each admits from a fresh bucket.
    let in_flight = local.outage();
    assert_eq!(admitted(&local, "a", &set, 1, 1), 1);
    assert_eq!(admitted(&local, "b", &set, 1, 1), 1);
    // A call sent before the failures answers: the outage is over.
    local.end_outage(in_flight, Duration::ZERO);
    assert_eq!(local.outage(), first + 1);
    // Both keys' reports say 3 are left; "a"'s call was sent after the end,
    // "b"'s was the one in flight, whose answer cannot count the bucket's unit.
    clock.advance(Duration::from_secs(1));
    local.remember("a", &set, [(3, hour)].into_iter(), local.outage());
    local.remember("b", &set, [(3, hour)].into_iter(), in_flight);
    // A report of "a" from a call sent before the end, answering after the
    // one above: older news, which neither revives "a"'s bucket nor stands
    // for its use.
    local.remember("a", &set, [(40, hour)].into_iter(), in_flight);
    // The next outage: "a" starts from its report, "b" from its bucket.
    assert_eq!(
        (
            admitted(&local, "a", &set, 1, 100),
            admitted(&local, "b", &set, 1, 100)
        ),
        (3, 59)
    );
}

/// Two outages end within one settle: the first's buckets still bound their
/// keys until the settle ends, though the second ended after them. Only the
/// last outage's buckets did before: a key not checked in the second outage
/// could take Redis' whole quota while the fleet's write-backs of the first
/// were still coming in.
#[test]
fn back_to_back_outages_settle_the_buckets_of_both() {
    let (local, clock) = tier(LocalConfig::default());
    let set = RuleSet::new("h", [Rule::per_hour(10).expect("valid")]).expect("valid");
    let settle = Duration::from_secs(5);
    // Outage 1 spends "a"'s share, outage 2 "b"'s.
    assert_eq!(admitted(&local, "a", &set, 1, 20), 10);
    local.end_outage(local.outage(), settle);
    clock.advance(Duration::from_secs(1));
    assert_eq!(admitted(&local, "b", &set, 1, 20), 10);
    local.end_outage(local.outage(), settle);
    for key in ["a", "b"] {
        assert!(
            local
                .settling(key, &set, 1, || None, None)
                .is_some_and(|d| !d.allowed),
            "{key} is not bounded while settling"
        );
    }
    // Pruning keeps both while they settle, and lets both go after.
    local.prune();
    assert_eq!(local.len(), 2);
    clock.advance(settle);
    assert!(local.settling("a", &set, 1, || None, None).is_none());
    local.prune();
    assert!(local.is_empty());
}

/// While an outage settles, a key this instance did not bound in it gets its
/// share now, from its seed: the other instances may have spent theirs of it
/// locally, and Redis does not know until they are back and have written
/// them back. Regression: such a key went to Redis, which had counted none of
/// it, so the first instance back could hand out the whole limit on top of
/// what the others had admitted (90 of an hourly 60 with two instances).
#[test]
fn a_key_unseen_in_the_outage_takes_only_its_share_while_it_settles() {
    let (local, clock) = tier(LocalConfig::default());
    let set = RuleSet::new("h", [Rule::per_hour(10).expect("valid")]).expect("valid");
    let settle = Duration::from_secs(5);
    assert_eq!(admitted(&local, "seen", &set, 2, 20), 5);
    local.end_outage(local.outage(), settle);
    // Without an instance count (a set that does not fall back locally, or
    // a count not learned yet) Redis is asked, and no bucket is made.
    assert!(local.settling("unseen", &set, 1, || None, None).is_none());
    assert_eq!(local.len(), 1);
    // With it: this instance's share of 2, then denials answered here.
    let through = (0..10)
        .filter(|_| {
            local
                .settling("unseen", &set, 1, || Some(2), None)
                .is_none()
        })
        .count();
    assert_eq!(through, 5, "the share of 10 over 2 instances");
    let mut rules = vec![RuleState::new(7, Duration::ZERO); 3];
    let d = local
        .settling("unseen", &set, 1, || Some(2), Some(&mut rules))
        .expect("a denial while settling");
    assert!(!d.allowed);
    assert_eq!(rules.len(), 1, "every rule's state, and only those");
    assert_eq!(rules[0].remaining, 0);
    // What went through was asked of Redis, which counted it: nothing is owed.
    assert_eq!(
        local.ledger().units(),
        5,
        "only the outage's own admissions"
    );
    // Settled: Redis alone decides again.
    clock.advance(settle);
    assert!(
        local
            .settling("unseen", &set, 1, || Some(2), None)
            .is_none()
    );
}

/// The same when this instance decided nothing locally in the outage (its
/// sets fail closed, say): the settle still bounds every key it is asked
/// for. Regression (review): the outage was not over for the local tier then,
/// the first key's settle bucket was taken for the next outage's, and every
/// later check went to Redis unbounded. With one instance there are no
/// others to leave room for: Redis decides.
#[test]
fn a_settle_bounds_keys_after_an_outage_that_decided_nothing_here() {
    let (local, _) = tier(LocalConfig::default());
    let set = RuleSet::new("h", [Rule::per_hour(10).expect("valid")]).expect("valid");
    local.end_outage(local.outage(), Duration::from_secs(5));
    let through = |n: u64, key: &str| {
        (0..10)
            .filter(|_| local.settling(key, &set, 1, || Some(n), None).is_none())
            .count()
    };
    assert_eq!(through(2, "k"), 5, "this instance's share of 2");
    assert_eq!(through(1, "alone"), 10, "one instance: Redis decides");
}

/// A cost no rule could ever admit is denied, and counts nothing. Regression:
/// in a fixed window, `current + cost` wrapped: a debug build panicked, a
/// release build admitted it and reset the window's count to 0.
#[test]
fn a_cost_near_u64_max_is_denied_in_a_fixed_window() {
    let (local, _) = tier(LocalConfig::default());
    let set = RuleSet::new(
        "w",
        [Rule::per_minute(10)
            .and_then(|r| r.with_algorithm(Algorithm::FixedWindow))
            .expect("valid")],
    )
    .expect("valid");
    assert!(allowed(local.check("k", &set, 1, 1, false)));
    assert!(!allowed(local.check("k", &set, u64::MAX, 1, false)));
    match local.check("k", &set, 1, 1, false) {
        LocalAnswer::Decided(d) => assert_eq!((d.allowed, d.remaining), (true, 8)),
        other => panic!("{other:?}"),
    }
}

/// A wall clock that can step back or forward on its own, as NTP steps it
/// or a VM resumes.
#[derive(Debug)]
struct SteppingClock {
    inner: FakeClock,
    step_us: AtomicI64,
}

impl Clock for SteppingClock {
    fn now(&self) -> Duration {
        self.inner.now()
    }

    fn unix_micros(&self) -> u64 {
        self.inner
            .unix_micros()
            .wrapping_add_signed(self.step_us.load(Ordering::Relaxed))
    }
}

/// A local tier on a [`SteppingClock`] standing at `clock`, not stepped yet.
fn stepping(clock: FakeClock) -> (LocalTier, Arc<SteppingClock>) {
    let clock = Arc::new(SteppingClock {
        inner: clock,
        step_us: AtomicI64::new(0),
    });
    let local = LocalTier::new(LocalConfig::default(), clock.clone()).expect("valid config");
    (local, clock)
}

/// An outage settles for its time on the monotonic clock, whatever the wall
/// clock does meanwhile. Regression: the end was a wall-clock time, so a
/// clock stepped forward right after a heal (NTP, a VM resumed) ended the
/// settling at once, and the first instance back could take the key's whole
/// Redis quota on top of what the fleet admitted locally; one stepped back
/// an hour held the key to this instance's share for that hour more.
#[test]
fn a_stepped_wall_clock_does_not_change_how_long_an_outage_settles() {
    for step_us in [3_600_000_000, -3_600_000_000] {
        let (local, clock) = stepping(FakeClock::new(1_700_000_000_000_000));
        let set = RuleSet::new("h", [Rule::per_hour(10).expect("valid")]).expect("valid");
        let settle = Duration::from_secs(5);
        assert_eq!(admitted(&local, "k", &set, 1, 20), 10);
        local.end_outage(local.outage(), settle);
        clock.step_us.store(step_us, Ordering::Relaxed);
        clock.inner.advance(Duration::from_secs(1));
        assert!(
            local
                .settling("k", &set, 1, || None, None)
                .is_some_and(|d| !d.allowed),
            "stepped {step_us} µs: no longer bounded 1 s into a 5 s settle"
        );
        local.prune();
        assert_eq!(
            local.len(),
            1,
            "stepped {step_us} µs: pruned while settling"
        );
        clock.inner.advance(settle);
        assert!(
            local.settling("k", &set, 1, || None, None).is_none(),
            "stepped {step_us} µs: still bounded 6 s into a 5 s settle"
        );
    }
}

/// A cached Redis denial lasts its retry-after on the monotonic clock: it
/// kept its times on the wall clock, so a wall clock stepped back an hour
/// kept the key off Redis for that hour more (Redis would have admitted it
/// after 200 ms), and told its client to wait an hour.
#[test]
fn a_stepped_wall_clock_does_not_change_how_long_a_denial_is_cached() {
    for step_us in [3_600_000_000, -3_600_000_000] {
        let (local, clock) = stepping(FakeClock::new(1_700_000_000_000_000));
        let set = RuleSet::new("h", [Rule::per_hour(10).expect("valid")]).expect("valid");
        let retry = Duration::from_millis(200);
        let denied = Decision::denied(10, Duration::from_secs(60), retry, 0, Tier::Redis);
        local.cache_denial("k", &set, 1, &denied);
        clock.step_us.store(step_us, Ordering::Relaxed);
        clock.inner.advance(Duration::from_millis(50));
        let cached = local.cached_denial("k", &set, 1);
        let left = cached.and_then(|d| d.retry_after);
        assert!(
            left.is_some_and(|left| left <= Duration::from_millis(150)),
            "stepped {step_us} µs: 50 ms into a 200 ms retry-after, {cached:?}"
        );
        local.prune();
        assert_eq!(
            local.denial_count(),
            1,
            "stepped {step_us} µs: pruned while in force"
        );
        clock.inner.advance(retry);
        assert!(
            local.cached_denial("k", &set, 1).is_none(),
            "stepped {step_us} µs: still cached 250 ms into a 200 ms retry-after"
        );
        local.prune();
        assert_eq!(
            local.denial_count(),
            0,
            "stepped {step_us} µs: kept past its retry-after"
        );
    }
}

/// What Redis last reported starts an outage's bucket, aged on the
/// monotonic clock: the report kept its time on the wall clock, so a wall
/// clock stepped forward 6 h between the report and the outage aged it 6 h,
/// and a daily rule Redis had spent got a quarter of its limit again (a
/// fixed window's report fell in a window past, and the key started full).
#[test]
fn a_wall_clock_stepped_forward_does_not_refill_a_warm_seed() {
    for algorithm in [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::Gcra,
    ] {
        // 08:00 UTC on 14 November 2023.
        let (local, clock) = stepping(FakeClock::new(1_699_948_800_000_000));
        // A process up for half a day (its monotonic clock is past the
        // step): Redis reports at 20:00, and the step goes on to 02:00, the
        // next day's window.
        clock.inner.advance(Duration::from_secs(12 * 3_600));
        let rule = Rule::new(1_000, Duration::from_secs(86_400), algorithm).expect("valid");
        let set = RuleSet::new("d", [rule]).expect("valid");
        // Redis: nothing left, full again in 20 h.
        local.remember(
            "k",
            &set,
            [(0, Duration::from_secs(20 * 3_600))].into_iter(),
            local.outage(),
        );
        clock.step_us.store(6 * 3_600_000_000, Ordering::Relaxed);
        clock.inner.advance(Duration::from_secs(1));
        let admitted = admitted(&local, "k", &set, 1, 300);
        assert!(
            admitted <= 1,
            "{algorithm:?}: {admitted} admitted 1 s after Redis said none were left"
        );
    }
}

/// A window's counts stay when the wall clock steps back across its start:
/// they were reset to none, so the key got the window before's limit again,
/// and once the clock was back in the window, that limit a third time. (And
/// a window admitted in after a step back counted as the earlier window.)
/// Judged as at the window's start, a sliding window still weighs the
/// window before whole: judged at the stepped-back time, it weighed it as
/// all but gone.
#[test]
fn a_wall_clock_stepped_back_keeps_the_windows_counts() {
    // 0.2 s into a minute.
    let (local, clock) = stepping(FakeClock::new(1_699_999_980_200_000));
    let rule = |algorithm| {
        Rule::per_minute(100)
            .and_then(|r| r.with_algorithm(algorithm))
            .expect("valid")
    };
    let fixed = RuleSet::new("fixed", [rule(Algorithm::FixedWindow)]).expect("valid");
    let sliding = RuleSet::new("sliding", [rule(Algorithm::SlidingWindow)]).expect("valid");
    for set in [&fixed, &sliding] {
        assert_eq!(admitted(&local, "k", set, 1, 60), 60, "{}", set.name());
    }
    // Back 0.5 s, into the minute before, where the 40 left are all there
    // is; then forward again.
    clock.step_us.store(-500_000, Ordering::Relaxed);
    for set in [&fixed, &sliding] {
        assert_eq!(admitted(&local, "k", set, 1, 200), 40, "{}", set.name());
    }
    clock.step_us.store(0, Ordering::Relaxed);
    for set in [&fixed, &sliding] {
        assert_eq!(admitted(&local, "k", set, 1, 200), 0, "{}", set.name());
    }
    // Another key uses 60 of a minute, then 0.2 s into the next the 40 the
    // minute before leaves it; stepped back across the boundary, its 100
    // still weigh whole.
    assert_eq!(admitted(&local, "j", &sliding, 1, 60), 60);
    clock.inner.advance(Duration::from_secs(60));
    assert_eq!(admitted(&local, "j", &sliding, 1, 200), 40);
    clock.step_us.store(-500_000, Ordering::Relaxed);
    assert_eq!(admitted(&local, "j", &sliding, 1, 200), 0);
}

/// What a bucket owes saturates, as the ledger's count does: wrapped, it
/// read as nothing owed, and the units were never written back.
#[test]
fn owed_units_saturate_instead_of_wrapping() {
    let (local, _) = tier(LocalConfig::default());
    // The largest limit, at one unit per µs (the finest rate).
    let rule = Rule::with_period(1 << 51, Duration::from_micros(1 << 51)).expect("valid");
    let set = RuleSet::new("big", [rule]).expect("valid");
    // 2^13 admissions of 2^51 units: 2^64, which wraps to exactly 0.
    for _ in 0..1 << 13 {
        local.record("k", &set, 1 << 51);
    }
    assert!(local.ledger().units() > 0, "the owed units were lost");
}

/// What a bucket owes is charged to Redis from where its last full refill
/// left it: a GCRA key spent at once, left to refill, then spent again in the
/// same outage owes the second burst whole. Owed from its very first unit,
/// the second burst read as refilled too, and Redis handed it out again.
#[test]
fn a_bucket_spent_again_after_a_refill_owes_the_second_burst() {
    let (local, clock) = tier(LocalConfig::default());
    let set = RuleSet::new("again", [Rule::per_second(10).expect("valid")]).expect("valid");
    let start = clock.unix_micros();
    assert_eq!(admitted(&local, "k", &set, 1, 20), 10, "a full bucket");
    clock.advance(Duration::from_secs(2));
    assert_eq!(admitted(&local, "k", &set, 1, 20), 10, "refilled whole");
    let claims = local.claim_pending("k", &set);
    let entry = &claims.first().expect("owed").entry;
    assert_eq!(entry.units, 20);
    // The write-back charges 0.1 s a unit from `first_us`: 2 s of units end
    // at 3 s, where the second burst left the bucket.
    assert_eq!(entry.first_us, start + 1_000_000);
    assert_eq!(entry.last_us, start + 2_000_000);
}

/// Redis fails again while an outage settles: the instance goes on from its
/// bucket of the first outage, not from what Redis reported in between. That
/// report did not count what the instances still on their way back had
/// admitted, and started from it, the instance took a second share of what
/// they had spent: 3 instances, 60 an hour, the fleet admitted 74.
#[test]
fn a_second_outage_while_the_first_settles_goes_on_from_its_bucket() {
    let (local, _) = tier(LocalConfig::default());
    let set = RuleSet::new("h", [Rule::per_hour(60).expect("valid")]).expect("valid");
    // Outage 1: 19 of this instance's share of 20.
    assert_eq!(admitted(&local, "k", &set, 3, 19), 19);
    // Its probe ends it; the others are still out.
    local.end_outage(local.outage(), Duration::from_secs(5));
    // One check goes to Redis (the bucket has room), which has this
    // instance's 19 and that check, and none of the others' 40.
    assert!(local.settling("k", &set, 1, || None, None).is_none());
    let sent_in = local.outage();
    local.remember(
        "k",
        &set,
        [(40, Duration::from_secs(3_600))].into_iter(),
        sent_in,
    );
    // Redis fails again before the others are back.
    assert_eq!(
        admitted(&local, "k", &set, 3, 20),
        0,
        "its share is spent: a report that undercounts the fleet gave it 14 more"
    );
}

#[test]
fn a_wall_clock_stepped_forward_during_an_outage_drops_no_owed_units() {
    let (local, clock) = stepping(FakeClock::default());
    // A minute's bucket: its units matter for a minute after the last.
    let set = RuleSet::new("api", [Rule::per_minute(60).expect("valid")]).expect("valid");
    for _ in 0..5 {
        assert!(allowed(local.check("k", &set, 1, 1, true)));
    }
    local.prune();
    assert_eq!(
        local.ledger().units(),
        5,
        "the bucket's debt reached the ledger"
    );

    // One second later on the monotonic clock, the wall clock jumps 2 minutes.
    clock.inner.advance(Duration::from_secs(1));
    clock.step_us.store(120_000_000, Ordering::Relaxed);
    local.prune();
    let dropped = local.ledger().drop_expired(clock.unix_micros());
    assert_eq!(
        (dropped, local.ledger().units()),
        (0, 5),
        "units admitted a second ago were dropped as expired after the wall clock stepped"
    );

    // A minute on, they have expired by any clock.
    clock.inner.advance(Duration::from_secs(60));
    local.prune();
    assert_eq!(local.ledger().drop_expired(clock.unix_micros()), 5);
    assert_eq!(local.ledger().units(), 0);
}

/// The same for a wall clock stepped back, and for units decided on the
/// slow path (every window rule; here a fixed window), whose times are the
/// wall clock read at the check: they were taken for the frame of the last
/// prune, so after a step back of 2 minutes, units of a minute's window
/// admitted just before were dropped as expired.
#[test]
fn a_wall_clock_stepped_back_drops_no_owed_units() {
    let (local, clock) = stepping(FakeClock::default());
    let set = RuleSet::new(
        "api",
        [Rule::per_minute(60)
            .and_then(|r| r.with_algorithm(Algorithm::FixedWindow))
            .expect("valid")],
    )
    .expect("valid");
    clock.step_us.store(-120_000_000, Ordering::Relaxed);
    for _ in 0..5 {
        assert!(allowed(local.check("k", &set, 1, 1, true)));
    }
    local.prune();
    assert_eq!(
        (
            local.ledger().drop_expired(clock.unix_micros()),
            local.ledger().units()
        ),
        (0, 5),
        "units admitted just now were dropped as expired"
    );
    // A minute and more on, the window has passed by any clock.
    clock.inner.advance(Duration::from_secs(61));
    local.prune();
    assert_eq!(local.ledger().drop_expired(clock.unix_micros()), 5);
}

/// A write-back's times are on the wall clock as last measured, which it
/// tells Redis as its now: units recorded before the clock was stepped are
/// moved by the step. Regression (review): they were sent as recorded, so
/// with a clock stepped forward 5 s during an outage Redis took them for 5 s
/// older than they were, and found units of a live second-long window passed.
#[test]
fn a_claim_is_on_the_wall_clock_as_last_measured() {
    let (local, clock) = stepping(FakeClock::default());
    let set = RuleSet::new("s", [Rule::per_second(10).expect("valid")]).expect("valid");
    assert!(allowed(local.check("k", &set, 1, 1, true)));
    let recorded = clock.unix_micros();
    clock.step_us.store(5_000_000, Ordering::Relaxed);
    // A drain's claim measures the clocks first, as does a check's.
    let claims = local.claim(10, clock.unix_micros());
    let last = claims.first().map(|c| c.entry.last_us);
    assert_eq!(last, Some(recorded + 5_000_000), "a drain's claim");
    let set_b = RuleSet::new("t", [Rule::per_second(10).expect("valid")]).expect("valid");
    assert!(allowed(local.check("j", &set_b, 1, 1, true)));
    let recorded = clock.unix_micros();
    clock.step_us.store(9_000_000, Ordering::Relaxed);
    let claims = local.claim_pending("j", &set_b);
    let last = claims.first().map(|c| c.entry.last_us);
    assert_eq!(last, Some(recorded + 4_000_000), "a check's claim");
}

/// Units counted on both sides of a clock step go out on one clock: the
/// earlier ones are moved by the step. Regression (review): one entry kept
/// the first units' times on the old clock and the frame of the latest, so
/// a GCRA debt began 20 s late and a third of it was never charged.
#[test]
fn units_counted_across_a_clock_step_go_out_on_one_clock() {
    // Measured by a prune (the ledger's entry holds the earlier units), or
    // by another key's check (the bucket's count still holds them).
    for by_prune in [true, false] {
        let (local, clock) = stepping(FakeClock::default());
        let set = RuleSet::new("m", [Rule::per_minute(60).expect("valid")]).expect("valid");
        let first = clock.unix_micros();
        assert!(allowed(local.check("other", &set, 1, 1, true)));
        for _ in 0..30 {
            assert!(allowed(local.check("k", &set, 1, 1, true)));
        }
        clock.step_us.store(20_000_000, Ordering::Relaxed);
        if by_prune {
            local.prune();
        } else {
            assert_eq!(local.claim_pending("other", &set).len(), 1);
        }
        assert!(allowed(local.check("k", &set, 1, 1, true)));
        let claims = local.claim(10, clock.unix_micros());
        let first_sent = claims
            .iter()
            .find(|c| c.entry.units == 31)
            .map(|c| c.entry.first_us);
        assert!(
            first_sent.is_some_and(|f| f >= first + 20_000_000),
            "measured by a prune: {by_prune}: the debt begins at {first_sent:?}, before the step's {}",
            first + 20_000_000
        );
    }
}

/// A cost above this instance's share of a rule, though within the whole
/// rule's capacity (which is all a cost is validated against), is denied:
/// governor multiplied it by the share's emission interval unchecked, and
/// past u64 the product wrapped to an admission (a panic in debug builds).
#[test]
fn a_cost_above_the_share_is_denied_however_large() {
    let (local, _) = tier(LocalConfig::default());
    // 5 a day with a burst of 260,000, over 5 instances: a share of 52,000,
    // one unit every 17.28 hours.
    let set = RuleSet::new(
        "api",
        [Rule::per_day(5)
            .and_then(|r| r.with_burst(260_000))
            .expect("valid")],
    )
    .expect("valid");
    set.validate_cost(213_505)
        .expect("within the rule's capacity");
    assert!(!allowed(local.check("k", &set, 213_505, 5, true)));
    assert!(!allowed(local.check("k", &set, 52_001, 5, true)));
    assert!(allowed(local.check("k", &set, 52_000, 5, true)));
}

/// The window algorithms' local slots, given a cost above the share (but
/// within the rule): denied, with a retry-after no later than when the
/// window is empty. The sliding window's wait grew with the cost over the
/// count (a billion a day over 4 instances, one unit counted, a cost of half
/// a billion: 250,000,001 days), and its sum overflowed: a panic in debug
/// builds, a wrapped retry-after in release.
#[test]
fn a_window_cost_above_the_share_waits_at_most_until_the_window_is_empty() {
    let (local, _) = tier(LocalConfig::default());
    for algorithm in [
        Algorithm::SlidingWindow,
        Algorithm::FixedWindow,
        Algorithm::SlidingLog,
    ] {
        let limit = if algorithm == Algorithm::SlidingLog {
            1_000
        } else {
            1_000_000_000
        };
        let rule = Rule::new(limit, Duration::from_secs(86_400), algorithm).expect("valid");
        let set = RuleSet::new("w", [rule]).expect("valid");
        let key = format!("{algorithm:?}");
        assert!(
            allowed(local.check(&key, &set, 1, 4, true)),
            "{algorithm:?}"
        );
        let cost = limit / 2;
        set.validate_cost(cost).expect("within the rule's capacity");
        let LocalAnswer::Decided(d) = local.check(&key, &set, cost, 4, true) else {
            panic!("{algorithm:?}: the bucket decides");
        };
        assert!(!d.allowed, "{algorithm:?}: {d:?}");
        let retry = d.retry_after.expect("a denial says when");
        assert!(
            retry <= Duration::from_secs(2 * 86_400),
            "{algorithm:?}: retry after {retry:?}"
        );
    }
}

/// A limit cut from a million a day to 2 with the million used carries the
/// cell to far beyond u64's nanoseconds (saturated): the next check's add
/// wrapped there, and it was admitted.
#[test]
fn a_limit_cut_far_below_what_was_used_denies() {
    let (local, _) = tier(LocalConfig::default());
    let day = |limit| RuleSet::new("api", [Rule::per_day(limit).expect("valid")]).expect("valid");
    assert!(allowed(local.check(
        "k",
        &day(1_000_000),
        1_000_000,
        1,
        false
    )));
    assert!(!allowed(local.check("k", &day(2), 2, 1, false)));
    assert!(!allowed(local.check("k", &day(2), 1, 1, false)));
}

/// What an ended outage's bucket used, kept as its key's seed, lasts as long
/// as it can matter, not one period: with a burst of 100 over 10 an hour the
/// bucket takes ten hours to refill, yet an hour on the seed was gone and the
/// next outage started the key full (100 more, where 10 had refilled).
#[test]
fn an_ended_outages_seed_lasts_until_its_bucket_could_refill() {
    let (local, clock) = tier(LocalConfig::default());
    let set = RuleSet::new(
        "api",
        [Rule::per_hour(10)
            .and_then(|r| r.with_burst(100))
            .expect("valid")],
    )
    .expect("valid");
    assert_eq!(admitted(&local, "k", &set, 1, 100), 100);
    local.end_outage(local.outage(), Duration::ZERO);
    clock.advance(Duration::from_secs(1));
    local.prune();
    assert_eq!(
        (local.len(), local.warm_count()),
        (0, 1),
        "the bucket left a seed"
    );
    clock.advance(Duration::from_secs(3_601));
    let again = admitted(&local, "k", &set, 1, 100);
    assert!(
        again <= 11,
        "{again} admitted an hour on, where about 10 refilled"
    );
}

/// The same when the units are judged before the next prune (the drain and
/// shutdown do that): the ledger's frame was the last prune's, so units
/// recorded on a wall clock stepped since were judged that far older, and
/// an hour's step dropped a minute window's units admitted just before.
#[test]
fn units_judged_before_the_next_prune_after_a_step_are_kept() {
    let (local, clock) = stepping(FakeClock::default());
    // Two rules: the slow path, which stamps the wall clock it reads.
    let set = RuleSet::new(
        "api",
        [
            Rule::per_minute(60)
                .and_then(|r| r.with_algorithm(Algorithm::FixedWindow))
                .expect("valid"),
            Rule::per_hour(1_000).expect("valid"),
        ],
    )
    .expect("valid");
    clock.step_us.store(3_600_000_000, Ordering::Relaxed);
    for _ in 0..5 {
        assert!(allowed(local.check("k", &set, 1, 1, true)));
    }
    assert_eq!(
        (local.drop_expired(), local.ledger().units()),
        (0, 10),
        "units admitted just now were dropped as expired"
    );
}

/// A window of more than one unit per microsecond of its period (100
/// billion a day, see `Rule::new`) is counted locally too: each of 4
/// instances admits its share, a quarter, and not a unit more.
#[test]
fn a_window_of_more_than_one_unit_per_microsecond_is_counted_by_its_share() {
    let (local, _) = tier(LocalConfig::default());
    let day = Duration::from_secs(86_400);
    for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindow] {
        let rule = Rule::new(100_000_000_000, day, algorithm).expect("valid");
        let set = RuleSet::new(format!("{algorithm:?}"), [rule]).expect("valid");
        let share = 25_000_000_000;
        assert!(
            allowed(local.check("k", &set, share - 1, 4, true)),
            "{algorithm:?}"
        );
        assert!(allowed(local.check("k", &set, 1, 4, true)), "{algorithm:?}");
        assert!(
            !allowed(local.check("k", &set, 1, 4, true)),
            "{algorithm:?}"
        );
    }
}
