//! The local tier on governor (issue 10): which engine decides each rule,
//! that a GCRA rule's local decisions are governor's, and that a set of
//! several rules stays all or nothing although governor has no undo.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use governor::clock::FakeRelativeClock;
use governor::{Quota, RateLimiter};
use tierlimit_core::{Algorithm, FakeClock, Rule, RuleSet};
use tierlimit_local::{Engine, LocalAnswer, LocalConfig, LocalTier};

fn tier() -> (LocalTier, FakeClock) {
    let clock = FakeClock::default();
    let tier =
        LocalTier::new(LocalConfig::default(), Arc::new(clock.clone())).expect("valid config");
    (tier, clock)
}

fn decided(answer: LocalAnswer) -> tierlimit_core::Decision {
    match answer {
        LocalAnswer::Decided(d) => d,
        other => panic!("expected a decision, got {other:?}"),
    }
}

#[test]
fn each_algorithm_runs_on_its_documented_engine() {
    let gcra = Rule::per_second(10).expect("valid");
    let bucket = gcra
        .clone()
        .with_algorithm(Algorithm::TokenBucket)
        .expect("valid");
    let fixed = gcra
        .clone()
        .with_algorithm(Algorithm::FixedWindow)
        .expect("valid");
    let log = gcra
        .clone()
        .with_algorithm(Algorithm::SlidingLog)
        .expect("valid");
    assert_eq!(Engine::of(&gcra, 1), Engine::Governor);
    assert_eq!(Engine::of(&bucket, 3), Engine::Governor);
    assert_eq!(Engine::of(&fixed, 1), Engine::Window);
    assert_eq!(Engine::of(&log, 1), Engine::Window);
    // Beyond governor: a per-instance burst above u32::MAX.
    let huge = Rule::per_day(5_000_000_000).expect("valid");
    assert_eq!(Engine::of(&huge, 1), Engine::Gcra);
    assert_eq!(Engine::of(&huge, 2), Engine::Governor, "half of it fits");
}

/// Differential: the local tier and a bare governor limiter with the share's
/// quota, driven through the same times and costs, admit the same requests and
/// report the same remaining burst and retry-after.
#[test]
fn a_local_gcra_check_decides_as_a_bare_governor_limiter_does() {
    let (local, clock) = tier();
    // 90/min over 3 instances: a share of 30/min, burst 30.
    let rule = Rule::per_minute(90).expect("valid");
    let set = RuleSet::new("g", [rule]).expect("valid");
    let quota = Quota::with_period(Duration::from_secs(2))
        .expect("non-zero")
        .allow_burst(NonZeroU32::new(30).expect("non-zero"));
    let gov_clock = FakeRelativeClock::default();
    let bare = RateLimiter::direct_with_clock(quota, gov_clock.clone());
    let mut rng = fastrand::Rng::with_seed(10);
    let (mut both, mut admitted) = (0, 0);
    for _ in 0..2_000 {
        let step = Duration::from_millis(rng.u64(0..400));
        clock.advance(step);
        gov_clock.advance(step);
        let cost = rng.u32(1..=3);
        let d = decided(local.check("k", &set, u64::from(cost), 3, false));
        let g = bare
            .check_n(NonZeroU32::new(cost).expect("non-zero"))
            .expect("within burst");
        assert_eq!(d.allowed, g.is_ok(), "after {both} agreeing decisions");
        if let Err(not_until) = g {
            let wait = not_until.wait_time_from(governor::clock::Clock::now(&gov_clock));
            let retry = d.retry_after.expect("a denial has a retry-after");
            assert!(
                retry.abs_diff(wait) <= Duration::from_micros(1),
                "retry {retry:?} vs governor's {wait:?}"
            );
        } else {
            admitted += 1;
        }
        both += 1;
    }
    assert!(
        (100..1_900).contains(&admitted),
        "both admit and deny: {admitted}"
    );
}

/// An exact all-or-nothing model of a set of GCRA rules, in integer µs: what
/// Redis' script decides, and what the local tier must match.
struct Exact {
    /// Per rule: emission interval, burst window (µs) and theoretical arrival.
    rules: Vec<(u64, u64, u64)>,
}

impl Exact {
    fn new(rules: &[(u64, u64)]) -> Self {
        Exact {
            rules: rules
                .iter()
                .map(|&(limit, period_us)| (period_us / limit, period_us, 0))
                .collect(),
        }
    }

    fn check(&mut self, now: u64, cost: u64) -> bool {
        let admits = self
            .rules
            .iter()
            .all(|&(t, burst, tat)| tat.max(now) + cost * t - now <= burst);
        if admits {
            for (t, _, tat) in &mut self.rules {
                *tat = (*tat).max(now) + cost * *t;
            }
        }
        admits
    }
}

#[test]
fn ten_per_second_and_a_hundred_per_minute_are_all_or_nothing_like_the_exact_model() {
    let (local, clock) = tier();
    let set = RuleSet::new(
        "pair",
        [
            Rule::per_second(10).expect("valid"),
            Rule::per_minute(100).expect("valid"),
        ],
    )
    .expect("valid");
    assert!(
        set.rules()
            .iter()
            .all(|r| Engine::of(r, 1) == Engine::Governor)
    );
    let mut model = Exact::new(&[(10, 1_000_000), (100, 60_000_000)]);
    let mut rng = fastrand::Rng::with_seed(7);
    let mut now = tierlimit_core::Clock::unix_micros(&clock);
    let (mut admitted, mut denied_by_second) = (0u64, 0u64);
    // Three minutes of bursts and lulls, costs 1 to 3.
    for i in 0..6_000 {
        let step = if i % 500 < 400 {
            rng.u64(0..20_000)
        } else {
            rng.u64(0..400_000)
        };
        clock.advance(Duration::from_micros(step));
        now += step;
        let cost = rng.u64(1..=3);
        let d = decided(local.check("k", &set, cost, 1, true));
        let expected = model.check(now, cost);
        assert_eq!(
            d.allowed, expected,
            "request {i} at +{step} µs, cost {cost}"
        );
        admitted += u64::from(d.allowed);
        denied_by_second += u64::from(!d.allowed && d.rule == 0);
    }
    assert!(admitted > 100, "the minute rule refills: {admitted}");
    assert!(denied_by_second > 0, "the second rule also denies");
    // Only what was admitted is owed, to each rule alike.
    let owed: Vec<u64> = local
        .ledger()
        .claim(10, u64::MAX)
        .iter()
        .map(|c| c.entry.units)
        .collect();
    assert_eq!(owed.len(), 2);
    assert_eq!(owed[0], owed[1]);
}

/// `check_rules` reports each rule of the share; a denied request consumed
/// nothing, so a rule that had room shows it as it stands.
#[test]
fn each_rule_is_reported_after_an_admission_and_as_it_stands_after_a_denial() {
    let (local, _) = tier();
    let set = RuleSet::new(
        "pair",
        [
            Rule::per_minute(10).expect("valid"),
            Rule::per_hour(3).expect("valid"),
        ],
    )
    .expect("valid");
    let mut rules = Vec::new();
    for n in 1..=3u64 {
        let d = decided(local.check_rules("k", &set, 1, 1, false, &mut rules));
        assert!(d.allowed);
        let remaining: Vec<u64> = rules.iter().map(|r| r.remaining).collect();
        assert_eq!(remaining, [10 - n, 3 - n]);
    }
    let d = decided(local.check_rules("k", &set, 1, 1, false, &mut rules));
    assert!(!d.allowed);
    assert_eq!(
        rules.iter().map(|r| r.remaining).collect::<Vec<_>>(),
        [7, 0]
    );
}
