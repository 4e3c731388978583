//! Local tier: `HybridLimiter::check` with the breaker Open (LocalFallback, FailOpen, FailClosed) against a bare governor keyed limiter on the same `String` keys.
//!
//! The limiter is built against a dead loopback port with a fixed instance
//! count of 1 (so LocalFallback's share is the whole limit) and tripped before
//! measuring; its cool-down is an hour, so no probe runs meanwhile. Its rule is
//! 1e6 per second with a burst of `u32::MAX`, and governor's quota the same,
//! so both measure the admit path; one case measures the deny path (1 per
//! hour, spent). Every key has a bucket on both sides before the first sample.
//! Checks are polled directly (they do no I/O while Open), not through an
//! executor.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use governor::{Quota, RateLimiter};
use tierlimit::{
    BreakerState, HybridLimiter, LocalConfig, Policy, Rule, RuleSet, SystemClock, Tier,
};
use tierlimit_benches::{
    Case, Harness, generous_quota, generous_set, poll_ready, runtime, tripped_limiter,
};
use tierlimit_local::{LocalAnswer, LocalTier};
use tokio::runtime::Runtime;

/// The target of issue 10: a local check costs at most 10 % more than governor's.
const TARGET: f64 = 1.10;

fn main() {
    let mut harness = Harness::from_args("local");
    let rt = runtime();
    let _entered = rt.enter();
    let big = if harness.quick() { 10_000 } else { 1_000_000 };

    for n in [1, 1_000, big] {
        let id = format!("fallback/{}", keys_id(n));
        if !harness.wants(&id) {
            continue;
        }
        let keys = keys(n);
        let limiter = limiter(&rt, n);
        let set = generous_set("fallback", 1).with_policy(Policy::LocalFallback);
        let gov = RateLimiter::keyed(generous_quota());
        for key in &keys {
            expect(&limiter, key, &set, Tier::Local, true);
            assert!(gov.check_key(key).is_ok(), "governor admits a fresh key");
        }
        let mut case = Case::new(
            &id,
            &format!("LocalFallback, {}, 1 thread", keys_text(n)),
            "HybridLimiter::check (Open, LocalFallback)",
            "governor check_key",
        )
        .target(TARGET);
        if n >= 100_000 {
            // One pass over every key per sample.
            case = case.ops(n as u64);
        }
        harness.compare(
            case,
            |ops| {
                timed(&keys, ops, |key| {
                    black_box(poll_ready(limiter.check(key, &set, 1)).ok());
                })
            },
            |ops| timed(&keys, ops, |key| drop(black_box(gov.check_key(key)))),
        );
        still_open(&limiter);
    }

    // The local tier alone, without the facade: what the bucket map and
    // governor cost, apart from key validation, the breaker and metrics.
    if harness.wants("tier-only/1000-keys") {
        let keys = keys(1_000);
        let local = LocalTier::new(LocalConfig::default(), Arc::new(SystemClock))
            .expect("a valid local config");
        let set = generous_set("tier", 1);
        let gov = RateLimiter::keyed(generous_quota());
        for key in &keys {
            let admitted =
                matches!(local.check(key, &set, 1, 1, true), LocalAnswer::Decided(d) if d.allowed);
            assert!(admitted, "the local tier admits a fresh key");
            assert!(gov.check_key(key).is_ok(), "governor admits a fresh key");
        }
        harness.compare(
            Case::new(
                "tier-only/1000-keys",
                "the local tier alone, 1,000 keys, 1 thread",
                "LocalTier::check (recording)",
                "governor check_key",
            ),
            |ops| {
                timed(&keys, ops, |key| {
                    black_box(local.check(key, &set, 1, 1, true));
                })
            },
            |ops| timed(&keys, ops, |key| drop(black_box(gov.check_key(key)))),
        );
    }

    for (policy, tier, allowed) in [
        (Policy::FailOpen, Tier::FailOpen, true),
        (Policy::FailClosed, Tier::FailClosed, false),
    ] {
        for n in [1, 1_000] {
            let id = format!("{}/{}", policy.as_str(), keys_id(n));
            if !harness.wants(&id) {
                continue;
            }
            let keys = keys(n);
            let limiter = limiter(&rt, n);
            let set = generous_set("policy", 1).with_policy(policy);
            let gov = RateLimiter::keyed(generous_quota());
            for key in &keys {
                expect(&limiter, key, &set, tier, allowed);
                assert!(gov.check_key(key).is_ok(), "governor admits a fresh key");
            }
            harness.compare(
                Case::new(
                    &id,
                    &format!("{policy:?}, {}, 1 thread", keys_text(n)),
                    &format!("HybridLimiter::check (Open, {policy:?})"),
                    "governor check_key",
                ),
                |ops| {
                    timed(&keys, ops, |key| {
                        black_box(poll_ready(limiter.check(key, &set, 1)).ok());
                    })
                },
                |ops| timed(&keys, ops, |key| drop(black_box(gov.check_key(key)))),
            );
            still_open(&limiter);
        }
    }

    // The deny path: one key whose only unit (1 per hour) is spent on both sides.
    if harness.wants("fallback-deny/1-key") {
        let keys = keys(1);
        let limiter = limiter(&rt, 1);
        let set = RuleSet::new("spent", [Rule::per_hour(1).expect("a valid rule")])
            .expect("a valid rule set")
            .with_policy(Policy::LocalFallback);
        let gov = RateLimiter::keyed(Quota::per_hour(nonzero(1)));
        expect(&limiter, &keys[0], &set, Tier::Local, true);
        expect(&limiter, &keys[0], &set, Tier::Local, false);
        assert!(gov.check_key(&keys[0]).is_ok(), "governor admits the first");
        assert!(
            gov.check_key(&keys[0]).is_err(),
            "governor denies the second"
        );
        harness.compare(
            Case::new(
                "fallback-deny/1-key",
                "LocalFallback deny path (1 per hour, spent), 1 key, 1 thread",
                "HybridLimiter::check (Open, LocalFallback, denied)",
                "governor check_key (denied)",
            ),
            |ops| {
                timed(&keys, ops, |key| {
                    black_box(poll_ready(limiter.check(key, &set, 1)).ok());
                })
            },
            |ops| timed(&keys, ops, |key| drop(black_box(gov.check_key(key)))),
        );
        still_open(&limiter);
    }

    // One hot key, two threads at once on each side.
    if harness.wants("fallback/1-key-2-threads") {
        let keys = keys(1);
        let key = &keys[0];
        let limiter = limiter(&rt, 1);
        let set = generous_set("fallback", 1).with_policy(Policy::LocalFallback);
        let gov = RateLimiter::keyed(generous_quota());
        expect(&limiter, key, &set, Tier::Local, true);
        assert!(gov.check_key(key).is_ok(), "governor admits a fresh key");
        harness.compare(
            Case::new(
                "fallback/1-key-2-threads",
                "LocalFallback, 1 hot key, 2 threads (ns per check on each thread)",
                "HybridLimiter::check (Open, LocalFallback)",
                "governor check_key",
            ),
            |ops| {
                on_threads(2, || {
                    for _ in 0..ops {
                        black_box(poll_ready(limiter.check(key, &set, 1)).ok());
                    }
                })
            },
            |ops| {
                on_threads(2, || {
                    for _ in 0..ops {
                        drop(black_box(gov.check_key(key)));
                    }
                })
            },
        );
        still_open(&limiter);
    }
}

/// `n` distinct keys, built before any measurement.
fn keys(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("user:{i:07}")).collect()
}

/// A tripped limiter whose local tier holds `n` keys with room to spare (the
/// default bounds refuse new keys long before a million).
fn limiter(rt: &Runtime, n: usize) -> HybridLimiter {
    let default = LocalConfig::default();
    let local = LocalConfig {
        max_keys: (2 * n).max(default.max_keys),
        max_ledger_entries: (2 * n).max(default.max_ledger_entries),
        // A bound, not an allocation: 4 KiB a key is far above what one takes.
        max_bytes: default.max_bytes.max(n.saturating_mul(4 << 10)),
        ..default
    };
    tripped_limiter(rt, local)
}

/// Runs `check` on `ops` keys, cycling through `keys`, and times it.
fn timed(keys: &[String], ops: u64, mut check: impl FnMut(&String)) -> Duration {
    let started = Instant::now();
    let mut left = ops;
    while left > 0 {
        for key in keys
            .iter()
            .take(usize::try_from(left).unwrap_or(usize::MAX))
        {
            check(key);
        }
        left = left.saturating_sub(keys.len() as u64);
    }
    started.elapsed()
}

/// Runs `work` on `threads` threads released together; the time from the
/// release until the last one finished.
fn on_threads(threads: usize, work: impl Fn() + Sync) -> Duration {
    let barrier = Barrier::new(threads + 1);
    let started = thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                barrier.wait();
                work();
            });
        }
        barrier.wait();
        Instant::now()
    });
    started.elapsed()
}

/// Checks once and panics unless `tier` decided with `allowed`: a bench that
/// measured another path than it says would be worse than none.
fn expect(limiter: &HybridLimiter, key: &str, set: &RuleSet, tier: Tier, allowed: bool) {
    let d = poll_ready(limiter.check(key, set, 1)).expect("a valid check");
    assert!(
        d.tier == tier && d.allowed == allowed,
        "expected {tier:?} allowed={allowed}, got {d:?}"
    );
}

fn still_open(limiter: &HybridLimiter) {
    assert_eq!(
        limiter.breaker_state(),
        BreakerState::Open,
        "the breaker left Open during the bench: its numbers measured something else"
    );
}

fn nonzero(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).expect("a positive quota")
}

/// `1-key`, `1000-keys`: for ids.
fn keys_id(n: usize) -> String {
    if n == 1 {
        "1-key".into()
    } else {
        format!("{n}-keys")
    }
}

/// `1 key`, `1,000 keys`: for titles.
fn keys_text(n: usize) -> String {
    if n == 1 {
        "1 key".into()
    } else {
        format!("{} keys", thousands(n))
    }
}

fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}
