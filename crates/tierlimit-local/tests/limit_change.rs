//! Issue 13: a rule whose limit or burst changes keeps what was used in the
//! local tier, as it does on Redis. Before, a limit or burst was part of the
//! rule set's identity, so a raised limit handed every key a fresh quota and a
//! lowered one forgot the usage; now the bucket converts its state to the new
//! limits (GCRA: the units still draining; windows: the counts), engines and
//! cached denials are told apart by limits, and warm seeds and the ledger
//! follow. Changing the algorithm or the period still starts afresh.

use std::sync::Arc;
use std::time::Duration;

use tierlimit_core::{Algorithm, Decision, FakeClock, Policy, Rule, RuleSet, Tier};
use tierlimit_local::{Engine, LocalAnswer, LocalConfig, LocalTier};

fn tier() -> (LocalTier, FakeClock) {
    // The default fake clock is 20 s into a minute and 800 s into an hour:
    // minute windows hold still for the checks below that do not advance it.
    let clock = FakeClock::default();
    let tier =
        LocalTier::new(LocalConfig::default(), Arc::new(clock.clone())).expect("valid config");
    (tier, clock)
}

fn decided(answer: LocalAnswer) -> Decision {
    match answer {
        LocalAnswer::Decided(d) => d,
        other => panic!("expected a decision, got {other:?}"),
    }
}

/// How many of `n` checks of cost 1 `set` admits for `key` (one instance).
fn admitted(local: &LocalTier, key: &str, set: &RuleSet, n: usize) -> usize {
    (0..n)
        .filter(|_| decided(local.check(key, set, 1, 1, false)).allowed)
        .count()
}

fn rule(algorithm: Algorithm, limit: u64, period: Duration) -> Rule {
    Rule::with_period(limit, period)
        .and_then(|r| r.with_algorithm(algorithm))
        .expect("valid rule")
}

fn set(rules: impl IntoIterator<Item = Rule>) -> RuleSet {
    RuleSet::new("api", rules).expect("valid set")
}

const ALGORITHMS: [Algorithm; 5] = [
    Algorithm::Gcra,
    Algorithm::TokenBucket,
    Algorithm::SlidingLog,
    Algorithm::SlidingWindow,
    Algorithm::FixedWindow,
];

/// 80 of 100 per minute used; the same key at 200 admits the 120 left, at 50
/// nothing (every algorithm, the clock standing still).
#[test]
fn a_changed_limit_keeps_the_units_used() {
    let (local, _) = tier();
    for algorithm in ALGORITHMS {
        let minute = Duration::from_secs(60);
        let old = set([rule(algorithm, 100, minute)]);
        let raised = set([rule(algorithm, 200, minute)]);
        let lowered = set([rule(algorithm, 50, minute)]);
        assert_eq!(old.identity(), raised.identity());

        let up = format!("up-{algorithm:?}");
        assert_eq!(admitted(&local, &up, &old, 80), 80, "{algorithm:?}");
        assert_eq!(admitted(&local, &up, &raised, 300), 120, "{algorithm:?}");

        let down = format!("down-{algorithm:?}");
        assert_eq!(admitted(&local, &down, &old, 80), 80, "{algorithm:?}");
        let d = decided(local.check(&down, &lowered, 1, 1, false));
        assert!(!d.allowed, "{algorithm:?}: 80 used is above 50");
        assert_eq!(d.remaining, 0, "{algorithm:?}");
        // Back to the old limit: still 80 used, 20 left.
        assert_eq!(admitted(&local, &down, &old, 100), 20, "{algorithm:?}");
    }
}

/// GCRA and the token bucket drain what was used at the new rate: 80 units of
/// 100/min used, lowered to 50/min (T = 1.2 s), the first unit is free once 31
/// have drained: after 37.2 s.
#[test]
fn a_lowered_gcra_limit_drains_the_old_usage_at_the_new_rate() {
    for algorithm in [Algorithm::Gcra, Algorithm::TokenBucket] {
        let (local, clock) = tier();
        let minute = Duration::from_secs(60);
        let old = set([rule(algorithm, 100, minute)]);
        let lowered = set([rule(algorithm, 50, minute)]);
        assert_eq!(admitted(&local, "k", &old, 80), 80);
        let d = decided(local.check("k", &lowered, 1, 1, false));
        assert!(!d.allowed);
        let retry = d.retry_after.expect("a denial says when");
        assert!(
            retry.abs_diff(Duration::from_millis(37_200)) <= Duration::from_micros(1),
            "{algorithm:?}: retry after {retry:?}"
        );
        clock.advance(Duration::from_millis(37_000));
        assert_eq!(admitted(&local, "k", &lowered, 5), 0, "{algorithm:?}");
        clock.advance(Duration::from_millis(200));
        assert_eq!(admitted(&local, "k", &lowered, 5), 1, "{algorithm:?}");
    }
}

/// A burst change alone (same limit) keeps the units used too: 80 of a
/// burst of 100 used leaves 70 of a burst of 150 and 10 of a burst of 90.
#[test]
fn a_changed_burst_keeps_the_units_used() {
    let (local, _) = tier();
    for algorithm in [Algorithm::Gcra, Algorithm::TokenBucket] {
        let with_burst = |burst| {
            set([rule(algorithm, 100, Duration::from_secs(60))
                .with_burst(burst)
                .expect("valid burst")])
        };
        let up = format!("up-{algorithm:?}");
        assert_eq!(admitted(&local, &up, &with_burst(100), 80), 80);
        assert_eq!(admitted(&local, &up, &with_burst(150), 200), 70);
        let down = format!("down-{algorithm:?}");
        assert_eq!(admitted(&local, &down, &with_burst(100), 80), 80);
        assert_eq!(admitted(&local, &down, &with_burst(90), 200), 10);
    }
}

/// A GCRA rule moves between governor and this crate's own GCRA when its
/// per-instance burst crosses u32::MAX: the units used carry over both ways.
#[test]
fn usage_carries_between_governor_and_the_own_gcra() {
    let (local, _) = tier();
    let day = Duration::from_secs(86_400);
    let small = set([rule(Algorithm::Gcra, 4_000_000_000, day)]);
    let large = set([rule(Algorithm::Gcra, 5_000_000_000, day)]);
    assert_eq!(Engine::of(&small.rules()[0], 1), Engine::Governor);
    assert_eq!(Engine::of(&large.rules()[0], 1), Engine::Gcra);

    assert!(decided(local.check("k", &small, 1_000, 1, false)).allowed);
    let d = decided(local.check("k", &large, 1, 1, false));
    assert!(d.allowed);
    assert_eq!(d.remaining, 5_000_000_000 - 1_001);
    let d = decided(local.check("k", &small, 1, 1, false));
    assert!(d.allowed);
    assert_eq!(d.remaining, 4_000_000_000 - 1_002);
}

/// A set of several rules converts every rule and stays all or nothing: the
/// minute rule's denial under the new limits charges the second rule nothing.
#[test]
fn several_rules_carry_over_all_or_nothing() {
    let (local, _) = tier();
    let a = set([
        Rule::per_second(5).expect("valid"),
        Rule::per_minute(100).expect("valid"),
    ]);
    let b = set([
        Rule::per_second(10).expect("valid"),
        Rule::per_minute(7).expect("valid"),
    ]);
    let c = set([
        Rule::per_second(10).expect("valid"),
        Rule::per_minute(100).expect("valid"),
    ]);
    assert_eq!(admitted(&local, "k", &a, 10), 5);
    // 5 of 7 per minute used: 2 more, then the minute rule denies.
    assert_eq!(admitted(&local, "k", &b, 10), 2);
    let d = decided(local.check("k", &b, 1, 1, false));
    assert_eq!((d.allowed, d.rule), (false, 1));
    // 7 of 10 per second used (the denials above charged nothing): 3 more.
    assert_eq!(admitted(&local, "k", &c, 10), 3);
}

/// Regression: the engine cache was keyed by identity, so a set with new
/// limits got the engine (the quota) of the first set of its identity.
#[test]
fn sets_with_other_limits_get_their_own_engines() {
    let (local, _) = tier();
    let ten = set([Rule::per_minute(10).expect("valid")]);
    let twenty = set([Rule::per_minute(20).expect("valid")]);
    let two_rules = |limit| {
        set([
            Rule::per_minute(limit).expect("valid"),
            Rule::per_hour(1_000).expect("valid"),
        ])
    };
    assert_eq!(admitted(&local, "a", &ten, 50), 10);
    assert_eq!(admitted(&local, "b", &twenty, 50), 20);
    assert_eq!(admitted(&local, "c", &ten, 50), 10);
    assert_eq!(admitted(&local, "d", &two_rules(10), 50), 10);
    assert_eq!(admitted(&local, "e", &two_rules(20), 50), 20);
}

/// A denial Redis gave under the old limit does not deny under a raised one;
/// the same limits under another policy still share it.
#[test]
fn a_denial_cached_under_other_limits_is_not_applied() {
    let (local, clock) = tier();
    let old = set([Rule::per_minute(100).expect("valid")]);
    let raised = set([Rule::per_minute(200).expect("valid")]);
    let denial = Decision::denied(
        100,
        Duration::from_secs(30),
        Duration::from_secs(30),
        0,
        Tier::Redis,
    );
    local.cache_denial("u", &old, 1, &denial);
    assert!(local.cached_denial("u", &old, 1).is_some());
    let old_closed = old.clone().with_policy(Policy::FailClosed);
    assert!(local.cached_denial("u", &old_closed, 1).is_some());
    assert!(
        local.cached_denial("u", &raised, 1).is_none(),
        "a raised limit kept denying until the old retry-after"
    );
    // Redis denies under the new limit too: that denial replaces the old one.
    let later = Decision::denied(
        200,
        Duration::from_secs(5),
        Duration::from_secs(5),
        0,
        Tier::Redis,
    );
    local.cache_denial("u", &raised, 1, &later);
    let d = local.cached_denial("u", &raised, 1).expect("cached");
    assert_eq!((d.tier, d.limit), (Tier::DenyCache, 200));
    assert!(local.cached_denial("u", &old, 1).is_none());
    clock.advance(Duration::from_secs(6));
    assert!(local.cached_denial("u", &raised, 1).is_none());
}

/// A warm seed Redis reported under the old limit starts an outage's bucket
/// with the units used then, not with the old remaining: 20 of 100 left means
/// 80 used, so 120 of 200 (and none of 50).
#[test]
fn a_warm_seed_under_the_old_limit_keeps_the_units_used() {
    for algorithm in ALGORITHMS {
        let (local, _) = tier();
        let minute = Duration::from_secs(60);
        let old = set([rule(algorithm, 100, minute)]);
        let raised = set([rule(algorithm, 200, minute)]);
        let lowered = set([rule(algorithm, 50, minute)]);
        for key in ["up", "down"] {
            local.remember(
                key,
                &old,
                [(20, Duration::from_secs(60))].into_iter(),
                local.outage(),
            );
        }
        assert_eq!(admitted(&local, "up", &raised, 300), 120, "{algorithm:?}");
        assert_eq!(admitted(&local, "down", &lowered, 300), 0, "{algorithm:?}");
    }
}

/// What is owed to Redis across a limit change is one entry under the one
/// storage key, written back with the latest limit.
#[test]
fn the_ledger_writes_back_under_the_latest_limit() {
    let (local, _) = tier();
    let old = set([Rule::per_minute(100).expect("valid")]);
    let raised = set([Rule::per_minute(200).expect("valid")]);
    for _ in 0..3 {
        assert!(decided(local.check("k", &old, 1, 1, true)).allowed);
    }
    // Into the ledger under the old limit (as a drain's look would move them).
    assert_eq!(local.ledger().units(), 3);
    for _ in 0..2 {
        assert!(decided(local.check("k", &raised, 1, 1, true)).allowed);
    }
    let claims = local.claim_pending("k", &raised);
    assert_eq!(claims.len(), 1);
    let entry = &claims[0].entry;
    assert_eq!(entry.storage_key, raised.storage_key("k", 0));
    assert_eq!((entry.units, entry.rule.limit()), (5, 200));
}

/// Changing the algorithm or the period is a new identity: a new bucket,
/// full, whatever the old one had used.
#[test]
fn a_changed_algorithm_or_period_starts_afresh() {
    let (local, _) = tier();
    let minute = Duration::from_secs(60);
    let gcra = set([rule(Algorithm::Gcra, 10, minute)]);
    let bucket = set([rule(Algorithm::TokenBucket, 10, minute)]);
    let hourly = set([rule(Algorithm::Gcra, 10, Duration::from_secs(3600))]);
    assert_ne!(gcra.identity(), bucket.identity());
    assert_ne!(gcra.identity(), hourly.identity());
    assert_eq!(admitted(&local, "k", &gcra, 20), 10);
    assert_eq!(admitted(&local, "k", &bucket, 20), 10);
    assert_eq!(admitted(&local, "k", &hourly, 20), 10);
    assert_eq!(local.len(), 3);
}

/// While an ended outage settles, its bucket still bounds the key: a set with
/// other limits is charged against the same usage there, by its own limits.
#[test]
fn a_settling_bucket_judges_the_kept_usage_by_the_new_limits() {
    let (local, _) = tier();
    let minute = |limit| set([Rule::per_minute(limit).expect("valid")]);
    assert_eq!(admitted(&local, "up", &minute(100), 100), 100);
    assert_eq!(admitted(&local, "down", &minute(100), 80), 80);
    local.end_outage(local.outage(), Duration::from_secs(10));
    assert!(
        local
            .settling("up", &minute(100), 1, || None, None)
            .is_some(),
        "100 of 100"
    );
    assert!(
        local
            .settling("up", &minute(200), 1, || None, None)
            .is_none(),
        "100 of 200"
    );
    assert!(
        local
            .settling("down", &minute(50), 1, || None, None)
            .is_some(),
        "80 of 50"
    );
    assert!(
        local
            .settling("down", &minute(100), 1, || None, None)
            .is_none(),
        "80 of 100"
    );
}

/// A reload's retarget of the ledger (raised limits) stands however the
/// buckets' debts move into it: a `ledger()` that found another caller
/// already moving them went on at once, retargeted the entries moved so
/// far, and the mover then wrote the rest under the old rule.
#[test]
fn a_retarget_during_a_move_of_the_debts_holds_for_every_entry() {
    const KEYS: usize = 100_000;
    let local = Arc::new(
        LocalTier::new(
            LocalConfig {
                max_keys: KEYS,
                max_bytes: 1 << 30,
                ..LocalConfig::default()
            },
            Arc::new(FakeClock::default()),
        )
        .expect("valid config"),
    );
    let old = set([Rule::per_hour(100).expect("valid")]);
    let raised = set([Rule::per_hour(1_000).expect("valid")]);
    for i in 0..KEYS {
        assert!(decided(local.check(&format!("k{i}"), &old, 1, 1, true)).allowed);
    }
    // The bytes the tier charges grow as the ledger gains entries: a sign
    // the mover is under way that moves nothing itself.
    let before = local.bytes();
    let mover = {
        let local = Arc::clone(&local);
        std::thread::spawn(move || local.ledger().len())
    };
    while local.bytes() == before {
        std::hint::spin_loop();
    }
    // As a reload does: the ledger, retargeted.
    local.ledger().retarget(&raised);
    mover.join().expect("the mover");
    let claims = local.ledger().claim(usize::MAX, 0);
    assert_eq!(claims.len(), KEYS);
    let old_rule = claims
        .iter()
        .filter(|c| c.entry.rule.limit() != 1_000)
        .count();
    assert_eq!(
        old_rule, 0,
        "{old_rule} of {KEYS} entries kept the old limit"
    );
}
