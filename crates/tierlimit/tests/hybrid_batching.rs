//! Batched Redis calls and the breaker (issue 11): a batch of checks is one
//! Redis call, so a failed batch is one failure for the breaker, not one per
//! check, while every check of it still gets its policy's answer in time.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use support::{breaker, builder, healthy};
use tierlimit::{BreakerState, HybridLimiter, Policy, RedisFailure, Rule, RuleSet, Tier};
use tierlimit_test::RedisServer;

/// Starts `n` checks at once on distinct keys and returns each decision with
/// the time it took.
async fn burst(
    limiter: &Arc<HybridLimiter>,
    set: &RuleSet,
    n: usize,
) -> Vec<(tierlimit::Decision, Duration)> {
    let handles: Vec<_> = (0..n)
        .map(|i| {
            let (limiter, set) = (limiter.clone(), set.clone());
            tokio::spawn(async move {
                let started = Instant::now();
                let d = limiter
                    .check(&format!("user-{i}"), &set, 1)
                    .await
                    .expect("a valid check");
                (d, started.elapsed())
            })
        })
        .collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.expect("a check task"));
    }
    out
}

/// Each check's deadline.
const DEADLINE: Duration = Duration::from_millis(200);

/// A server, a limiter on it whose breaker four failures in a row open (and
/// keep open for a minute), and a `FailOpen` set both of whose scripts (a
/// lone call's, a batch's) the server has loaded.
async fn warm_limiter() -> (RedisServer, Arc<HybridLimiter>, RuleSet) {
    let server = RedisServer::start();
    let mut config = breaker();
    config.consecutive_failures = 4;
    config.cool_down = Duration::from_secs(60);
    config.max_cool_down = Duration::from_secs(60);
    let limiter = healthy(builder(&server.url()).deadline(DEADLINE).breaker(config)).await;
    let set = RuleSet::new("batched", [Rule::per_hour(1000).expect("valid")])
        .expect("valid")
        .with_policy(Policy::FailOpen);
    for (d, _) in burst(&limiter, &set, 20).await {
        assert_eq!(d.tier, Tier::Redis);
    }
    (server, limiter, set)
}

#[tokio::test(flavor = "current_thread")]
async fn a_failed_batch_is_one_failure_for_the_breaker() {
    // Timed against the deadline: alone in this binary.
    let _serial = tierlimit_test::serial().await;
    let (server, limiter, set) = warm_limiter().await;

    server.pause();
    let decisions = burst(&limiter, &set, 6).await;
    let state_after_burst = limiter.breaker_state();
    server.resume();
    for (d, took) in &decisions {
        assert_eq!(d.tier, Tier::FailOpen, "{d:?}");
        assert_eq!(d.redis_failure, Some(RedisFailure::Timeout), "{d:?}");
        assert!(
            *took < DEADLINE + Duration::from_millis(250),
            "took {took:?}, deadline {DEADLINE:?}"
        );
    }
    // 6 failed checks in three calls (two lone, then one batch of 4: as
    // large as the calls in flight, at least 4), one report each: counted
    // per check, four consecutive failures would have opened the breaker.
    assert_eq!(state_after_burst, BreakerState::Closed);

    // A success ends the run of failures; then lone calls still count one
    // each: four failed calls in a row open it.
    let healthy_again = limiter
        .check("after", &set, 1)
        .await
        .expect("a valid check");
    assert_eq!(healthy_again.tier, Tier::Redis, "{healthy_again:?}");
    server.pause();
    for i in 0..4 {
        let d = limiter
            .check(&format!("lone-{i}"), &set, 1)
            .await
            .expect("a valid check");
        assert_eq!(
            d.redis_failure,
            Some(RedisFailure::Timeout),
            "lone check {i}: {d:?}"
        );
    }
    let state_after_lone = limiter.breaker_state();
    server.resume();
    assert_eq!(state_after_lone, BreakerState::Open);
}

/// A batch that timed out is a call the breaker hears of, like a lone one:
/// on a hung server, 12 checks are four calls (two lone, then batches of 4
/// and 6), four failures in a row.
#[tokio::test(flavor = "current_thread")]
async fn timed_out_batches_count_for_the_breaker() {
    // Timed against the deadline: alone in this binary.
    let _serial = tierlimit_test::serial().await;
    let (server, limiter, set) = warm_limiter().await;

    server.pause();
    let decisions = burst(&limiter, &set, 12).await;
    let state_after_burst = limiter.breaker_state();
    server.resume();
    for (d, _) in &decisions {
        assert_eq!(d.redis_failure, Some(RedisFailure::Timeout), "{d:?}");
    }
    assert_eq!(
        state_after_burst,
        BreakerState::Open,
        "four timed-out calls, two of them batches, open a breaker of four"
    );
}
