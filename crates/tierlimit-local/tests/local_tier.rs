//! The local tier's bounds, denial cache and warm start, with a fake clock.

use std::sync::Arc;
use std::time::Duration;

use tierlimit_core::{Decision, FakeClock, Rule, RuleSet, Tier};
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
    assert_eq!(
        local
            .cached_denial("k", &set, 3)
            .and_then(|d| d.retry_after),
        Some(Duration::from_millis(40))
    );
    clock.advance(Duration::from_millis(40));
    assert!(local.cached_denial("k", &set, 2).is_none());
    assert_eq!(local.denial_count(), 0);
}

#[test]
fn warm_start_gives_each_instance_its_share_of_what_remained() {
    let (local, _) = tier(LocalConfig::default());
    let set = RuleSet::new("s", [Rule::per_hour(100).expect("valid")]).expect("valid");
    local.remember("k", &set, [(10, Duration::from_secs(3600))].into_iter());
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
    // The minute rule was charged only for the admitted three.
    let minute_units: u64 = local.ledger().batch(10).iter().map(|e| e.units).sum();
    assert_eq!(
        minute_units, 3,
        "only the minute rule reconciles by default"
    );
}
