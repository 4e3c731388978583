//! Nothing is left behind: after a mixed workload (every algorithm, single and
//! multi-rule sets, costs above 1, denials) every key has a TTL no longer than
//! its rule needs, and once the longest window has passed the database is empty.

mod support;

use std::time::{Duration, Instant};

use tierlimit_core::{Algorithm, Rule, RuleSet};
use tierlimit_test::RedisServer;

use support::{ALGORITHMS, rule, set, storage_key, tier};

/// The longest a rule's key may live after a check, in ms: until the rule is
/// back to full (GCRA, token bucket: capacity / rate; sliding log, fixed
/// window: one period) or its current window stops mattering (sliding window:
/// two periods). One more ms for rounding up.
fn ttl_bound_ms(rule: &Rule) -> i64 {
    let period_ms = (rule.period_micros() / 1000) as i64;
    let bound = match rule.algorithm() {
        Algorithm::Gcra | Algorithm::TokenBucket => {
            period_ms * rule.capacity() as i64 / rule.limit() as i64
        }
        Algorithm::SlidingWindow => 2 * period_ms,
        _ => period_ms,
    };
    bound + 1
}

#[tokio::test]
async fn every_key_expires() {
    let server = RedisServer::start();
    let tier = tier(&server.url());
    let mut sets: Vec<RuleSet> = ALGORITHMS
        .iter()
        .map(|&a| {
            set(
                &format!("single{}", a.code()),
                [rule(a, 5, Duration::from_millis(200))],
            )
        })
        .collect();
    sets.push(set(
        "mixed",
        ALGORITHMS.map(|a| rule(a, 8, Duration::from_millis(300))),
    ));
    sets.push(set(
        "bursty",
        [
            rule(Algorithm::Gcra, 10, Duration::from_millis(500))
                .with_burst(4)
                .expect("valid"),
            rule(Algorithm::TokenBucket, 10, Duration::from_millis(400))
                .with_burst(3)
                .expect("valid"),
        ],
    ));
    let mut denials = 0;
    for set in &sets {
        for key in ["a", "b{c}", "%7Bd"] {
            for cost in [1, 2, 1, 3, 1, 1] {
                let v = tier.check(key, set, cost).await.expect("check");
                denials += u32::from(!v.decision.allowed);
            }
        }
    }
    assert!(denials > 0, "the workload should include denials");
    let beats = tier
        .heartbeat("tl:{instances}:ttl", "me", Duration::from_millis(300))
        .await
        .expect("heartbeat");
    assert_eq!(beats, 1);

    assert_eq!(server.keys_without_ttl().await, Vec::<String>::new());
    let mut conn = server.conn().await;
    let mut expected = vec!["tl:{instances}:ttl".to_string()];
    for set in &sets {
        for (i, rule) in set.rules().iter().enumerate() {
            for key in ["a", "b{c}", "%7Bd"] {
                let name = storage_key(set, key, i);
                let pttl: i64 = redis::cmd("PTTL")
                    .arg(&name)
                    .query_async(&mut conn)
                    .await
                    .expect("PTTL");
                // -1 is a key without a TTL. 0: under a millisecond left
                // (PTTL rounds down); -2: gone already (a 300 ms fixed window
                // may have just ended).
                assert!(pttl != -1, "{name} has no TTL");
                assert!(
                    pttl <= ttl_bound_ms(rule),
                    "{name}: {pttl} ms > {} ms",
                    ttl_bound_ms(rule)
                );
                expected.push(name);
            }
        }
    }
    let present: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut conn)
        .await
        .expect("KEYS");
    let unknown: Vec<_> = present.iter().filter(|k| !expected.contains(k)).collect();
    assert!(unknown.is_empty(), "keys nobody asked for: {unknown:?}");

    // The longest window here is the sliding window's 2 x 300 ms.
    tokio::time::sleep(Duration::from_millis(600)).await;
    // Redis reclaims expired keys lazily and in a background sweep: wait for it.
    let started = Instant::now();
    while server.dbsize().await > 0 {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "keys left after their TTLs: {}",
            server.dbsize().await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!(
        "{} keys expired; the database was empty {:?} after the longest TTL",
        expected.len(),
        started.elapsed()
    );
}
