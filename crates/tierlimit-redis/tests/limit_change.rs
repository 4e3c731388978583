//! Issue 13: a rule whose limit or burst changes keeps its storage key and
//! what was used there, on a real redis-server, for every algorithm. Before,
//! the limit and the burst were part of the key, so a raised limit handed
//! every key a fresh quota and a lowered one forgot the usage.
//!
//! Time is the client's (a fake clock standing 20 s into a minute), so every
//! count below is exact.

mod support;

use std::sync::Arc;
use std::time::Duration;

use tierlimit_core::{Algorithm, Clock, FakeClock, LedgerEntry, Rule, RuleSet};
use tierlimit_redis::{RedisTier, WriteBack, Written};
use tierlimit_test::RedisServer;

use support::{ALGORITHMS, client_time_tier, rule, storage_key, tier};

/// Half past some hour, 20 s into its minute: minute windows hold still.
const NOW_US: u64 = 1_700_000_000_000_000 + 30 * 60_000_000;
const MINUTE: Duration = Duration::from_secs(60);

fn set(rules: impl IntoIterator<Item = Rule>) -> RuleSet {
    RuleSet::new("api", rules).expect("valid set")
}

fn start() -> (RedisServer, FakeClock, RedisTier) {
    let server = RedisServer::start();
    let clock = FakeClock::new(NOW_US);
    let tier = client_time_tier(&server.url(), Arc::new(clock.clone()));
    (server, clock, tier)
}

async fn allowed(tier: &RedisTier, key: &str, set: &RuleSet, cost: u64) -> bool {
    tier.check(key, set, cost)
        .await
        .expect("check")
        .decision
        .allowed
}

/// Exactly `n` more units fit: `n + 1` at once is denied, `n` admitted, then
/// one more denied. Each denial writes nothing, so the probes change nothing.
async fn assert_room(tier: &RedisTier, key: &str, set: &RuleSet, n: u64, label: &str) {
    assert!(
        !allowed(tier, key, set, n + 1).await,
        "{label}: {} fit, expected {n}",
        n + 1
    );
    if n > 0 {
        assert!(allowed(tier, key, set, n).await, "{label}: {n} did not fit");
    }
    assert!(
        !allowed(tier, key, set, 1).await,
        "{label}: more than {n} fit"
    );
}

/// 80 of 100 per minute used: raised to 200, 120 more fit in that window;
/// lowered to 50, none, and back at 100 the same 80 are still used.
#[tokio::test]
async fn every_algorithm_keeps_the_units_used_when_the_limit_changes() {
    let (server, _clock, tier) = start();
    let mut conn = server.conn().await;
    for algorithm in ALGORITHMS {
        let label = format!("{algorithm:?}");
        let old = set([rule(algorithm, 100, MINUTE)]);
        let raised = set([rule(algorithm, 200, MINUTE)]);
        let lowered = set([rule(algorithm, 50, MINUTE)]);
        assert_eq!(old.storage_key("k", 0), raised.storage_key("k", 0));

        let up = format!("up-{label}");
        assert!(allowed(&tier, &up, &old, 80).await, "{label}");
        assert_room(&tier, &up, &raised, 120, &format!("{label} raised")).await;

        let down = format!("down-{label}");
        assert!(allowed(&tier, &down, &old, 80).await, "{label}");
        let v = tier.check(&down, &lowered, 1).await.expect("check");
        assert!(!v.decision.allowed, "{label}: 80 used is above 50");
        assert_eq!(v.decision.remaining, 0, "{label}");
        let retry = v.decision.retry_after.expect("a denial says when");
        match algorithm {
            // Every unit was logged at once: the 31st oldest leaves with all of them.
            Algorithm::SlidingLog => assert_eq!(retry, MINUTE, "{label}"),
            // The window ends 40 s from now.
            Algorithm::FixedWindow => assert_eq!(retry, Duration::from_secs(40), "{label}"),
            _ => {}
        }
        assert_room(&tier, &down, &old, 20, &format!("{label} back at 100")).await;
    }
    // GCRA keeps the limit its arrival time was written under beside it.
    let gcra = set([rule(Algorithm::Gcra, 200, MINUTE)]);
    let stored: String = redis::cmd("GET")
        .arg(storage_key(&gcra, "up-Gcra", 0))
        .query_async(&mut conn)
        .await
        .expect("GET");
    assert!(stored.ends_with("@200"), "{stored}");
}

/// GCRA and the token bucket keep 80 units of 100/min used when lowered to
/// 50/min (one unit per 1.2 s): the first unit fits once 31 have drained.
/// Both drain at the rate they were written under until a request is
/// admitted under the new one (a denial writes nothing, and the key's expiry
/// was set by that rate): 31 units at 100/min drain in 18.6 s. Each denial's
/// retry-after says exactly that.
#[tokio::test]
async fn a_lowered_rate_keeps_the_usage_and_says_when_it_has_drained() {
    let (_server, clock, tier) = start();
    for (algorithm, wait) in [
        (Algorithm::Gcra, Duration::from_millis(18_600)),
        (Algorithm::TokenBucket, Duration::from_millis(18_600)),
    ] {
        let label = format!("{algorithm:?}");
        let old = set([rule(algorithm, 100, MINUTE)]);
        let lowered = set([rule(algorithm, 50, MINUTE)]);
        let key = format!("k-{label}");
        assert!(allowed(&tier, &key, &old, 80).await);
        let v = tier.check(&key, &lowered, 1).await.expect("check");
        assert_eq!(v.decision.retry_after, Some(wait), "{label}");
        clock.advance(wait - Duration::from_millis(1));
        assert!(!allowed(&tier, &key, &lowered, 1).await, "{label}");
        clock.advance(Duration::from_millis(1));
        assert!(allowed(&tier, &key, &lowered, 1).await, "{label}");
        // Written under 50 now: the next unit is 1.2 s away.
        let v = tier.check(&key, &lowered, 1).await.expect("check");
        assert_eq!(
            v.decision.retry_after,
            Some(Duration::from_millis(1_200)),
            "{label}"
        );
    }
}

/// A burst change alone keeps the units used: 80 of a burst of 100 used
/// leaves 70 of a burst of 150, and 10 of a burst of 90.
#[tokio::test]
async fn a_changed_burst_keeps_the_units_used() {
    let (_server, _clock, tier) = start();
    for algorithm in [Algorithm::Gcra, Algorithm::TokenBucket] {
        let label = format!("{algorithm:?}");
        let with_burst = |burst| {
            set([rule(algorithm, 100, MINUTE)
                .with_burst(burst)
                .expect("valid burst")])
        };
        let up = format!("up-{label}");
        assert!(allowed(&tier, &up, &with_burst(100), 80).await);
        assert_room(&tier, &up, &with_burst(150), 70, &label).await;
        let down = format!("down-{label}");
        assert!(allowed(&tier, &down, &with_burst(100), 80).await);
        assert_room(&tier, &down, &with_burst(90), 10, &label).await;
    }
}

/// A rolling deploy: instances with the old limit and instances with the new
/// one check the same key alternately. Usage is shared, so within the window
/// the key never takes more than the larger limit, raised or lowered.
#[tokio::test]
async fn old_and_new_limits_side_by_side_never_exceed_the_larger() {
    let (_server, _clock, tier) = start();
    for algorithm in ALGORITHMS {
        for (a, b) in [(100, 150), (100, 60)] {
            let label = format!("{algorithm:?} {a}/{b}");
            let first = set([rule(algorithm, a, MINUTE)]);
            let second = set([rule(algorithm, b, MINUTE)]);
            let key = format!("k-{label}");
            let mut admitted = 0;
            for _ in 0..200 {
                for s in [&first, &second] {
                    admitted += u64::from(allowed(&tier, &key, s, 1).await);
                }
            }
            assert!(admitted <= a.max(b), "{label}: {admitted} admitted");
            // And the larger limit is reached: nothing was lost either.
            assert_eq!(admitted, a.max(b), "{label}");
        }
    }
}

async fn write_back(tier: &RedisTier, id: &str, entry: &LedgerEntry) -> Written {
    let writes = [WriteBack::new(id, entry)];
    let mut outcomes = tier.reconcile(&writes).await.expect("reconcile");
    outcomes.remove(0).expect("the entry's outcome")
}

/// A write-back reads the key's state as the check does: units owed under a
/// new limit land on the usage written under the old one (and the other way
/// round), so no unit is lost or counted twice across the change.
#[tokio::test]
async fn reconcile_after_a_limit_change_adds_to_the_kept_usage() {
    let (_server, clock, tier) = start();
    let hour = Duration::from_secs(3600);
    for algorithm in ALGORITHMS {
        let label = format!("{algorithm:?}");
        let old_rule = rule(algorithm, 10, hour);
        let new_rule = rule(algorithm, 20, hour);
        let (old, new) = (set([old_rule.clone()]), set([new_rule.clone()]));
        let key = storage_key(&new, "k", 0);
        assert!(allowed(&tier, "k", &old, 4).await);
        let at = clock.unix_micros() - 1_000;

        let owed = LedgerEntry::new(key.clone(), new_rule, 3, at, at);
        let written = write_back(&tier, &format!("new-{label}"), &owed).await;
        assert_eq!(written, Written::Applied(3), "{label}");
        // 4 + 3 of 20 used: 13 fit.
        assert_room(&tier, "k", &new, 13, &format!("{label} after 3 owed")).await;

        // Now 20 used, written under 20; 1 more owed under the old 10 finds
        // the usage (read under 10) above that rule's full bucket: the
        // write-back keeps it as it is, neither cut to 10 nor raised (a log
        // or window counter adds nothing to a count at its limit).
        let owed = LedgerEntry::new(key, old_rule, 1, at, at);
        let written = write_back(&tier, &format!("old-{label}"), &owed).await;
        assert!(
            matches!(written, Written::Applied(_) | Written::Expired),
            "{label}: {written:?}"
        );
        assert_room(&tier, "k", &new, 0, &format!("{label} after the old write")).await;
    }
}

/// Lowered so far that the usage is above a full bucket: a write-back keeps
/// that usage, it does not cut it to the cap (GCRA and token bucket, whose
/// write-back caps the debt at one full bucket).
#[tokio::test]
async fn reconcile_keeps_a_debt_above_a_lowered_cap() {
    let (_server, clock, tier) = start();
    let hour = Duration::from_secs(3600);
    for algorithm in [Algorithm::Gcra, Algorithm::TokenBucket] {
        let label = format!("{algorithm:?}");
        let old = set([rule(algorithm, 100, hour)]);
        let lowered_rule = rule(algorithm, 50, hour);
        assert!(allowed(&tier, "k", &old, 80).await);
        let at = clock.unix_micros() - 1_000;
        let owed = LedgerEntry::new(storage_key(&old, "k", 0), lowered_rule, 5, at, at);
        let written = write_back(&tier, &format!("low-{label}"), &owed).await;
        assert!(
            matches!(written, Written::Applied(_)),
            "{label}: {written:?}"
        );
        // Still 80 used (not cut to 50): 20 fit under the old limit.
        assert_room(&tier, "k", &old, 20, &label).await;
    }
}

/// Changing the algorithm or the period is a new key, so fresh state; the
/// old key is left to expire by its TTL.
#[tokio::test]
async fn a_changed_algorithm_or_period_is_a_new_key() {
    let (server, _clock, tier) = start();
    let mut conn = server.conn().await;
    let gcra = set([rule(Algorithm::Gcra, 10, MINUTE)]);
    let window = set([rule(Algorithm::FixedWindow, 10, MINUTE)]);
    let hourly = set([rule(Algorithm::Gcra, 10, Duration::from_secs(3600))]);
    assert!(allowed(&tier, "k", &gcra, 10).await);
    assert!(!allowed(&tier, "k", &gcra, 1).await);
    for other in [&window, &hourly] {
        assert_ne!(storage_key(other, "k", 0), storage_key(&gcra, "k", 0));
        assert!(allowed(&tier, "k", other, 10).await, "{}", other.identity());
        assert!(!allowed(&tier, "k", other, 1).await, "{}", other.identity());
    }
    let ttl_ms: i64 = redis::cmd("PTTL")
        .arg(storage_key(&gcra, "k", 0))
        .query_async(&mut conn)
        .await
        .expect("PTTL");
    assert!(
        ttl_ms > 0 && ttl_ms <= 60_000,
        "the old key expires by its TTL: {ttl_ms}"
    );
}

/// A lowered limit's denial is kept to on Redis' own clock, where keys
/// expire: the key outlives the retry-after it answered, and a check before
/// then is denied. Regression: the token bucket drained what was used at the
/// lowered rate, but its key expired at the rate it was written under: 10
/// used at 10/s, lowered to 1/s, answered "retry in 9 s" and its key expired
/// after 1 s, when the bucket came back full.
#[tokio::test]
async fn a_lowered_limit_is_kept_until_the_retry_after_it_answered() {
    let server = RedisServer::start();
    let tier = tier(&server.url());
    let mut conn = server.conn().await;
    for algorithm in ALGORITHMS {
        let label = format!("{algorithm:?}");
        let old = set([rule(algorithm, 10, Duration::from_secs(1))]);
        let lowered = set([rule(algorithm, 1, Duration::from_secs(1))]);
        // A fixed window's retry-after is what is left of its second: one
        // that began too near the second's end (the two checks astride it,
        // or too little left to check halfway) starts again on a new key.
        let mut attempts = 0;
        let (key, retry) = loop {
            attempts += 1;
            let key = format!("k-{label}-{attempts}");
            assert!(allowed(&tier, &key, &old, 10).await, "{label}");
            let v = tier.check(&key, &lowered, 1).await.expect("check");
            let retry = v.decision.retry_after;
            let near_the_end = retry.is_none_or(|r| r < Duration::from_millis(200));
            if algorithm == Algorithm::FixedWindow && near_the_end && attempts < 10 {
                continue;
            }
            assert!(!v.decision.allowed, "{label}: 10 used is above 1");
            break (key, retry.expect("a denial says when"));
        };
        let ttl_ms: i64 = redis::cmd("PTTL")
            .arg(storage_key(&lowered, &key, 0))
            .query_async(&mut conn)
            .await
            .expect("PTTL");
        // PTTL was read after the check: what passed since is its slack.
        assert!(
            u128::try_from(ttl_ms).unwrap_or(0) + 250 >= retry.as_millis(),
            "{label}: the key expires in {ttl_ms} ms, its denial says retry in {retry:?}"
        );
        tokio::time::sleep(retry / 2).await;
        assert!(
            !allowed(&tier, &key, &lowered, 1).await,
            "{label}: admitted halfway to the retry-after of {retry:?}"
        );
    }
}
