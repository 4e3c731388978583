//! Allocations and bytes per check, counted by a global allocator wrapper, for each path of `HybridLimiter::check` against the layer under it where there is one (`RedisTier::check`, governor's `check_key`), so the facade's own share shows.
//!
//! Paths: the local tier with the breaker Open (LocalFallback on a key that has
//! a bucket, on a new key each check; FailOpen; FailClosed), the denial cache
//! (a key Redis denied, answered locally while Redis is healthy) and the
//! healthy Redis path with 1 and 3 rules, each on a private `redis-server`.
//! Everything runs on one current-thread runtime, so the counter (which counts
//! every thread) sees the check, redis-rs's connection driver and nothing else
//! of note; each figure is a total over many checks divided by their number.
//! "Allocations" counts `alloc` and `realloc` calls; "bytes" the bytes they
//! asked for (a `realloc` counts what it grew by).

use std::alloc::System;
use std::hint::black_box;

use governor::RateLimiter;
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use tierlimit::{HybridLimiter, LocalConfig, Policy, Rule, RuleSet, Tier};
use tierlimit_benches::{
    Harness, generous_quota, generous_set, healthy_limiter, poll_ready, runtime, tripped_limiter,
};
use tierlimit_redis::{RedisTier, RedisTierConfig};
use tierlimit_test::RedisServer;
use tokio::runtime::Runtime;

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Allocations and bytes per operation.
#[derive(Debug, Clone, Copy)]
struct PerOp {
    allocs: f64,
    bytes: f64,
}

impl PerOp {
    fn json(self) -> serde_json::Value {
        serde_json::json!({ "allocs": self.allocs, "bytes": self.bytes })
    }
}

/// What a region allocated, per operation of `n`. stats_alloc adds what a
/// `realloc` grew by to `bytes_allocated` itself (`bytes_reallocated` is
/// the same growth again, net of shrinks): counting both counted it twice.
fn per_op(region: &Region<'_, System>, n: u64) -> PerOp {
    let s = region.change();
    PerOp {
        allocs: (s.allocations + s.reallocations) as f64 / n as f64,
        bytes: s.bytes_allocated as f64 / n as f64,
    }
}

/// Runs `op` for `0..n` and counts what it allocated, per operation.
fn count(n: u64, mut op: impl FnMut(u64)) -> PerOp {
    let region = Region::new(GLOBAL);
    for i in 0..n {
        op(i);
    }
    per_op(&region, n)
}

/// Counts `op` on the runtime, all `n` in one `block_on`.
fn count_async<F: Future>(rt: &Runtime, n: u64, mut op: impl FnMut(u64) -> F) -> PerOp {
    let region = Region::new(GLOBAL);
    rt.block_on(async {
        for i in 0..n {
            op(i).await;
        }
    });
    per_op(&region, n)
}

/// The counter counts what it should, before anything is reported from it:
/// one allocation of 8 bytes grown to 1,008 is 2 allocations of 1,008 bytes.
fn check_the_counter() {
    let got = count(1, |_| {
        let mut v = vec![0u8; 8];
        v.reserve_exact(1_000);
        black_box(v);
    });
    assert!(
        got.allocs == 2.0 && got.bytes == 1_008.0,
        "the allocation counter is off: {got:?} for one allocation of 8 bytes grown to 1,008"
    );
}

struct Out<'h> {
    harness: &'h mut Harness,
}

impl Out<'_> {
    fn path(&mut self, id: &str, title: &str, facade: PerOp, under: Option<(&str, PerOp)>) {
        let under_text = under.map_or(String::new(), |(what, u)| {
            format!(
                "; {what}: {:.1} allocs, {:.0} B; facade's share: {:.1} allocs, {:.0} B",
                u.allocs,
                u.bytes,
                facade.allocs - u.allocs,
                facade.bytes - u.bytes
            )
        });
        println!(
            "allocations/{id}: HybridLimiter::check: {:.1} allocs, {:.0} B per check{under_text}",
            facade.allocs, facade.bytes
        );
        self.harness.record(serde_json::json!({
            "kind": "allocations",
            "id": id,
            "title": title,
            "facade": facade.json(),
            "under": under.map(|(what, u)| {
                let mut v = u.json();
                v["what"] = what.into();
                v
            }),
        }));
    }
}

fn main() {
    check_the_counter();
    let mut harness = Harness::from_args("allocations");
    let quick = harness.quick();
    let local_n: u64 = if quick { 100 } else { 20_000 };
    let redis_n: u64 = if quick { 50 } else { 2_000 };
    let rt = runtime();
    let _entered = rt.enter();
    let mut out = Out {
        harness: &mut harness,
    };

    // The local tier, breaker Open.
    {
        let local = LocalConfig {
            max_keys: 2 * local_n as usize + 10,
            ..LocalConfig::default()
        };
        let limiter = tripped_limiter(&rt, local);
        let set = generous_set("fallback", 1).with_policy(Policy::LocalFallback);
        let gov = RateLimiter::keyed(generous_quota());
        let hot = "user:hot".to_string();
        expect(&limiter, &hot, &set, Tier::Local, true);
        assert!(gov.check_key(&hot).is_ok());
        let facade = count(local_n, |_| {
            let d = poll_ready(limiter.check(&hot, &set, 1)).expect("a valid check");
            assert_eq!(d.tier, Tier::Local);
            black_box(d);
        });
        let under = count(local_n, |_| drop(black_box(gov.check_key(&hot))));
        out.path(
            "local/existing-key",
            "LocalFallback (Open), a key that has a bucket",
            facade,
            Some(("governor check_key", under)),
        );

        let fresh: Vec<String> = (0..local_n).map(|i| format!("new:{i:07}")).collect();
        let facade = count(local_n, |i| {
            let d = poll_ready(limiter.check(&fresh[i as usize], &set, 1)).expect("a valid check");
            assert_eq!(d.tier, Tier::Local);
            black_box(d);
        });
        let under = count(local_n, |i| {
            drop(black_box(gov.check_key(&fresh[i as usize])))
        });
        out.path(
            "local/new-key",
            "LocalFallback (Open), a new key each check",
            facade,
            Some(("governor check_key", under)),
        );

        for (policy, tier, allowed) in [
            (Policy::FailOpen, Tier::FailOpen, true),
            (Policy::FailClosed, Tier::FailClosed, false),
        ] {
            let set = generous_set("policy", 1).with_policy(policy);
            expect(&limiter, &hot, &set, tier, allowed);
            let facade = count(local_n, |_| {
                let d = poll_ready(limiter.check(&hot, &set, 1)).expect("a valid check");
                assert_eq!(d.tier, tier);
                black_box(d);
            });
            out.path(
                &format!("local/{}", policy.as_str()),
                &format!("{policy:?} (Open), one key"),
                facade,
                None,
            );
        }
    }

    // Healthy Redis.
    let server = RedisServer::start();
    let limiter = healthy_limiter(&rt, &server.url());
    let tier = RedisTier::new(RedisTierConfig::new(server.url())).expect("a valid config");
    {
        let set = RuleSet::new("spent", [Rule::per_hour(1).expect("a valid rule")])
            .expect("a valid rule set");
        let key = "user:denied";
        let first = rt.block_on(limiter.check(key, &set, 1)).expect("valid");
        assert!(first.allowed && first.tier == Tier::Redis, "{first:?}");
        let second = rt.block_on(limiter.check(key, &set, 1)).expect("valid");
        assert!(!second.allowed && second.tier == Tier::Redis, "{second:?}");
        expect(&limiter, key, &set, Tier::DenyCache, false);
        let facade = count(local_n, |_| {
            let d = poll_ready(limiter.check(key, &set, 1)).expect("a valid check");
            assert_eq!(d.tier, Tier::DenyCache);
            black_box(d);
        });
        out.path(
            "deny-cache",
            "denial cache (Closed, a key Redis denied)",
            facade,
            None,
        );
    }
    for rules in [1, 3] {
        let set = generous_set(&format!("healthy{rules}"), rules);
        let key = "user:42";
        // Connect both and load the script first.
        let d = rt.block_on(limiter.check(key, &set, 1)).expect("valid");
        assert!(d.allowed && d.tier == Tier::Redis, "{d:?}");
        let v = rt
            .block_on(tier.check(key, &set, 1))
            .expect("Redis answers");
        assert!(v.decision.allowed, "{v:?}");
        let facade = count_async(&rt, redis_n, |_| async {
            let d = limiter.check(key, &set, 1).await.expect("a valid check");
            assert_eq!(d.tier, Tier::Redis);
            black_box(d);
        });
        let under = count_async(&rt, redis_n, |_| async {
            let v = tier.check(key, &set, 1).await.expect("Redis answers");
            black_box(v);
        });
        out.path(
            &format!("redis/{rules}-rule"),
            &format!(
                "healthy Redis (Closed), {rules} rule{}, one key",
                if rules == 1 { "" } else { "s" }
            ),
            facade,
            Some(("RedisTier::check", under)),
        );
    }
}

/// Checks once and panics unless `tier` decided with `allowed`.
fn expect(limiter: &HybridLimiter, key: &str, set: &RuleSet, tier: Tier, allowed: bool) {
    let d = poll_ready(limiter.check(key, set, 1)).expect("a valid check");
    assert!(
        d.tier == tier && d.allowed == allowed,
        "expected {tier:?} allowed={allowed}, got {d:?}"
    );
}
