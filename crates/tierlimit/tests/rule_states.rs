//! `check_with_rules`: every rule's state when the deciding tier counts every
//! rule (Redis, the local bucket), none when it knows the deciding rule only.

mod support;

use std::time::Duration;

use support::{builder, healthy, trip};
use tierlimit::{Policy, Rule, RuleSet, Tier};
use tierlimit_test::RedisServer;

fn pair(policy: Policy) -> RuleSet {
    RuleSet::new(
        format!("pair-{policy:?}"),
        [
            Rule::per_minute(10).expect("valid"),
            Rule::per_hour(3).expect("valid"),
        ],
    )
    .expect("valid")
    .with_policy(policy)
}

#[tokio::test]
async fn each_rule_is_reported_by_redis_and_by_the_local_bucket_only() {
    let mut server = RedisServer::start();
    let limiter = healthy(builder(&server.url())).await;
    let local = pair(Policy::LocalFallback);
    let closed = pair(Policy::FailClosed);
    let mut rules = Vec::new();

    // Redis: each rule after the request, in the set's order.
    for n in 1..=3u64 {
        let d = limiter
            .check_with_rules("k", &local, 1, &mut rules)
            .await
            .expect("valid input");
        assert_eq!((d.tier, d.allowed), (Tier::Redis, true));
        let remaining: Vec<u64> = rules.iter().map(|r| r.remaining).collect();
        assert_eq!(remaining, [10 - n, 3 - n]);
        assert_eq!(d.remaining, 3 - n, "the hourly rule binds");
    }
    // Denied by the hourly rule: nothing consumed, each rule as it stands.
    let d = limiter
        .check_with_rules("k", &local, 1, &mut rules)
        .await
        .expect("valid input");
    assert!(!d.allowed);
    assert_eq!(
        rules.iter().map(|r| r.remaining).collect::<Vec<_>>(),
        [7, 0]
    );
    // The denial cache knows the deciding rule only: nothing reported.
    let d = limiter
        .check_with_rules("k", &local, 1, &mut rules)
        .await
        .expect("valid input");
    assert_eq!(d.tier, Tier::DenyCache);
    assert!(rules.is_empty(), "{rules:?}");

    // Redis gone: the local bucket reports each rule of its share.
    server.kill9();
    trip(&limiter, &closed).await;
    let d = limiter
        .check_with_rules("fresh", &local, 1, &mut rules)
        .await
        .expect("valid input");
    assert_eq!((d.tier, d.allowed), (Tier::Local, true));
    assert_eq!(rules.len(), 2);
    assert_eq!(
        rules.iter().map(|r| r.remaining).collect::<Vec<_>>(),
        [9, 2]
    );
    assert!(rules[1].reset_after > Duration::ZERO);
    // FailClosed counts nothing: nothing reported.
    let d = limiter
        .check_with_rules("fresh", &closed, 1, &mut rules)
        .await
        .expect("valid input");
    assert_eq!(d.tier, Tier::FailClosed);
    assert!(rules.is_empty(), "{rules:?}");
}
