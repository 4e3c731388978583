//! Healthy path: `HybridLimiter::check` (breaker Closed) against `RedisTier::check` alone, on the same rule set, script and redis-server.
//!
//! The server is a private `redis-server` on a free loopback port, started by
//! `tierlimit-test`. Both sides check the same key on one current-thread
//! runtime, one call at a time, with rule sets no check reaches (1 rule and 3
//! rules), so the ratio is what the facade adds to a Redis round trip: the
//! denial-cache and settling look-ups, the breaker's bookkeeping, remembering
//! what Redis reported, metrics and the span.

use std::hint::black_box;
use std::time::Instant;

use tierlimit::{BreakerState, Tier};
use tierlimit_benches::{Case, Harness, generous_set, healthy_limiter, runtime};
use tierlimit_redis::{RedisTier, RedisTierConfig};
use tierlimit_test::RedisServer;

const KEY: &str = "user:42";

fn main() {
    let mut harness = Harness::from_args("breaker");
    let server = RedisServer::start();
    let rt = runtime();
    let limiter = healthy_limiter(&rt, &server.url());
    let tier = {
        let _entered = rt.enter();
        RedisTier::new(RedisTierConfig::new(server.url())).expect("a valid Redis tier config")
    };
    for rules in [1, 3] {
        let set = generous_set(&format!("healthy{rules}"), rules);
        // Connect both and load the script before the first sample.
        let d = rt
            .block_on(limiter.check(KEY, &set, 1))
            .expect("a valid check");
        assert!(d.tier == Tier::Redis && d.allowed, "Redis admits: {d:?}");
        let v = rt
            .block_on(tier.check(KEY, &set, 1))
            .expect("Redis answers");
        assert!(v.decision.allowed, "Redis admits: {v:?}");
        harness.compare(
            Case::new(
                &format!("healthy/{rules}-rule"),
                &format!(
                    "healthy Redis path, {rules} rule{}, 1 key, 1 thread",
                    if rules == 1 { "" } else { "s" }
                ),
                "HybridLimiter::check (Closed)",
                "RedisTier::check",
            )
            // A loopback round trip here varies by ±20 % from sample to sample,
            // far more than the microsecond the facade adds: more pairs steady
            // the median (15 take about 3 s).
            .pairs(15),
            |ops| {
                rt.block_on(async {
                    let started = Instant::now();
                    for _ in 0..ops {
                        black_box(limiter.check(KEY, &set, 1).await.ok());
                    }
                    started.elapsed()
                })
            },
            |ops| {
                rt.block_on(async {
                    let started = Instant::now();
                    for _ in 0..ops {
                        black_box(tier.check(KEY, &set, 1).await.ok());
                    }
                    started.elapsed()
                })
            },
        );
        assert_eq!(
            limiter.breaker_state(),
            BreakerState::Closed,
            "the breaker left Closed during the bench: its numbers measured something else"
        );
    }
}
