//! Issue 10: a check the local tier answers allocates nothing once its key is
//! known, whatever the policy: the bucket is found by a borrowed key, what it
//! admits is owed in place, and the decision counters are cached handles.
//!
//! A counting allocator sees the whole process, so this binary holds one
//! test, and the checks are polled by hand (they are ready at once while the
//! breaker is open) so no runtime work runs between them.

use std::alloc::System;
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use tierlimit::{
    BreakerConfig, BreakerState, HybridLimiter, Instances, Policy, Rule, RuleSet, Tier,
};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

fn ready<F: Future>(fut: F) -> F::Output {
    match pin!(fut).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("a check the breaker keeps off Redis waited for something"),
    }
}

#[test]
fn a_local_check_of_a_known_key_allocates_nothing() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    // A port nothing listens on: Redis is down for the whole test.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let mut breaker = BreakerConfig::default();
    breaker.cool_down = Duration::from_secs(3_600);
    breaker.max_cool_down = Duration::from_secs(3_600);
    let limiter = rt.block_on(async {
        HybridLimiter::builder()
            .redis_url(format!("redis://127.0.0.1:{port}/"))
            .instances(Instances::Fixed(2))
            .breaker(breaker)
            .build()
            .expect("valid config")
    });
    let sets = [
        (Policy::LocalFallback, Tier::Local),
        (Policy::FailOpen, Tier::FailOpen),
        (Policy::FailClosed, Tier::FailClosed),
    ]
    .map(|(policy, tier)| {
        let set = RuleSet::new(
            format!("{policy:?}"),
            [Rule::per_second(1_000_000).expect("valid")],
        )
        .expect("valid")
        .with_policy(policy);
        (set, tier)
    });
    rt.block_on(async {
        for _ in 0..1_000 {
            if limiter.breaker_state() == BreakerState::Open {
                break;
            }
            let _ = limiter.check("trip", &sets[0].0, 1).await;
        }
    });
    assert_eq!(limiter.breaker_state(), BreakerState::Open);
    // First checks create the buckets and cache the counters.
    for (set, tier) in &sets {
        let d = ready(limiter.check("user-1", set, 1)).expect("valid input");
        assert_eq!(d.tier, *tier);
    }
    let region = Region::new(GLOBAL);
    for _ in 0..1_000 {
        for (set, _) in &sets {
            let d = ready(limiter.check("user-1", set, 1)).expect("valid input");
            std::hint::black_box(d);
        }
    }
    let stats = region.change();
    assert_eq!(
        (stats.allocations, stats.reallocations),
        (0, 0),
        "3,000 checks of a known key: {stats:?}"
    );
    assert_eq!(limiter.breaker_state(), BreakerState::Open);
}
