//! Regression (issue 9, items 12 and 19): extreme configuration values
//! panicked (`heartbeat_every` near `Duration::MAX` overflowed `* 2`,
//! `wait_closed(Duration::MAX)` overflowed an `Instant`) or were accepted
//! although they could never work (`instance_ttl(Duration::MAX)`, or a
//! heartbeat every nanosecond with a TTL of two: every beat was refused by the
//! Redis tier, the instance count was never learned). Every field is swept
//! with its extremes: each value is either refused by `build()` with an
//! `InvalidConfig` naming the field, or accepted and then works.

use std::time::Duration;

use tierlimit::{
    BreakerConfig, BreakerState, Error, HybridLimiter, HybridLimiterBuilder, Instances,
    LocalConfig, Policy, ReconcileConfig, Rule, RuleSet,
};
use tierlimit_test::{Fault, FaultProxy, RedisServer};

/// Polls an async condition each millisecond for up to 10 s.
async fn wait_until<F, Fut>(mut cond: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let end = std::time::Instant::now() + Duration::from_secs(10);
    while std::time::Instant::now() < end {
        if cond().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    false
}

const EXTREME_DURATIONS: [Duration; 4] = [
    Duration::ZERO,
    Duration::from_nanos(1),
    Duration::from_secs(u64::MAX / 2),
    Duration::MAX,
];

const EXTREME_FLOATS: [f64; 8] = [
    0.0,
    -1.0,
    1e-300,
    1.0,
    1.5,
    f64::MAX,
    f64::INFINITY,
    f64::NAN,
];

fn base(url: &str) -> HybridLimiterBuilder {
    HybridLimiter::builder().redis_url(url)
}

/// One extreme value of one field.
struct Case {
    field: &'static str,
    value: String,
    builder: HybridLimiterBuilder,
}

fn cases(url: &str) -> Vec<Case> {
    let mut cases = Vec::new();
    let mut add = |field: &'static str, value: String, builder: HybridLimiterBuilder| {
        cases.push(Case {
            field,
            value,
            builder,
        })
    };
    for d in EXTREME_DURATIONS {
        add("deadline", format!("{d:?}"), base(url).deadline(d));
        add(
            "heartbeat_every",
            format!("{d:?}"),
            base(url).heartbeat_every(d),
        );
        add("instance_ttl", format!("{d:?}"), base(url).instance_ttl(d));
        add("prune_every", format!("{d:?}"), base(url).prune_every(d));
        let breaker = |f: &dyn Fn(&mut BreakerConfig)| {
            let mut b = BreakerConfig::default();
            f(&mut b);
            base(url).breaker(b)
        };
        add(
            "slow_call_threshold",
            format!("{d:?}"),
            breaker(&|b| b.slow_call_threshold = d),
        );
        add("cool_down", format!("{d:?}"), breaker(&|b| b.cool_down = d));
        add(
            "max_cool_down",
            format!("{d:?}"),
            breaker(&|b| b.max_cool_down = d),
        );
        let mut r = ReconcileConfig::default();
        r.idle_poll = d;
        add("idle_poll", format!("{d:?}"), base(url).reconcile(r));
    }
    // A heartbeat far more often than Redis can answer, with a TTL to match.
    add(
        "heartbeat_every",
        "1ns with instance_ttl 2ns".into(),
        base(url)
            .heartbeat_every(Duration::from_nanos(1))
            .instance_ttl(Duration::from_nanos(2)),
    );
    for x in EXTREME_FLOATS {
        let breaker = |f: &dyn Fn(&mut BreakerConfig)| {
            let mut b = BreakerConfig::default();
            f(&mut b);
            base(url).breaker(b)
        };
        add(
            "failure_rate_threshold",
            format!("{x:e}"),
            breaker(&|b| b.failure_rate_threshold = x),
        );
        add(
            "slow_call_rate_threshold",
            format!("{x:e}"),
            breaker(&|b| b.slow_call_rate_threshold = x),
        );
        add(
            "backoff_multiplier",
            format!("{x:e}"),
            breaker(&|b| b.backoff_multiplier = x),
        );
        add("jitter", format!("{x:e}"), breaker(&|b| b.jitter = x));
        let mut r = ReconcileConfig::default();
        r.duty_cycle = x;
        add("duty_cycle", format!("{x:e}"), base(url).reconcile(r));
    }
    for n in [0u32, 1, u32::MAX] {
        let breaker = |f: &dyn Fn(&mut BreakerConfig)| {
            let mut b = BreakerConfig::default();
            f(&mut b);
            base(url).breaker(b)
        };
        add(
            "consecutive_failures",
            n.to_string(),
            breaker(&|b| b.consecutive_failures = n),
        );
        add(
            "window_size",
            n.to_string(),
            breaker(&|b| b.window_size = n),
        );
        add(
            "minimum_calls",
            n.to_string(),
            breaker(&|b| b.minimum_calls = n),
        );
        add(
            "replace_connection_after",
            n.to_string(),
            breaker(&|b| b.replace_connection_after = n),
        );
    }
    for n in [0usize, 1, usize::MAX] {
        let local = |f: &dyn Fn(&mut LocalConfig)| {
            let mut l = LocalConfig::default();
            f(&mut l);
            base(url).local(l)
        };
        add("max_keys", n.to_string(), local(&|l| l.max_keys = n));
        add("max_denials", n.to_string(), local(&|l| l.max_denials = n));
        add(
            "max_warm_keys",
            n.to_string(),
            local(&|l| l.max_warm_keys = n),
        );
        add(
            "max_ledger_entries",
            n.to_string(),
            local(&|l| l.max_ledger_entries = n),
        );
        let mut r = ReconcileConfig::default();
        r.batch_size = n;
        add("batch_size", n.to_string(), base(url).reconcile(r));
    }
    for n in [0u64, 1, u64::MAX] {
        add(
            "instances",
            format!("Fixed({n})"),
            base(url).instances(Instances::Fixed(n)),
        );
        add(
            "instances",
            format!("Learned(Some({n}))"),
            base(url).instances(Instances::Learned { assume: Some(n) }),
        );
    }
    for group in ["", "a b", "ünïcode", &"g".repeat(65), &"g".repeat(64)] {
        add("group", format!("{group:?}"), base(url).group(group));
    }
    add(
        "overflow_policy",
        "LocalFallback".into(),
        base(url).overflow_policy(Policy::LocalFallback),
    );
    for bad in ["", "http://x/", "redis://", "not a url"] {
        add(
            "url",
            format!("{bad:?}"),
            HybridLimiter::builder().redis_url(bad),
        );
    }
    add(
        "redis_url",
        "missing".into(),
        HybridLimiter::builder().deadline(Duration::from_millis(50)),
    );
    cases
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_extreme_value_is_refused_by_name_or_works() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    let set = RuleSet::new("sweep", [Rule::per_minute(1_000).expect("valid")])
        .expect("valid")
        .with_policy(Policy::FailOpen)
        .with_reconcile(true);
    let (mut refused, mut accepted) = (0, 0);
    for case in cases(&proxy.url()) {
        let what = format!("{} = {}", case.field, case.value);
        match case.builder.build() {
            Err(Error::InvalidConfig { what: message }) => {
                assert!(
                    message.contains(case.field),
                    "{what}: refused, but the error does not name the field: {message}"
                );
                refused += 1;
            }
            Err(other) => panic!("{what}: refused with the wrong error: {other:?}"),
            Ok(limiter) => {
                // Accepted: it must work through a whole outage, background
                // tasks included (a panic there would be silent): checks on
                // Redis, a trip, fallback admissions, recovery, the drain.
                let d = limiter.check("k", &set, 1).await;
                assert!(d.is_ok(), "{what}: accepted, then a check failed: {d:?}");
                // Twice: a task that panicked in the first drain would be
                // gone for the second.
                for round in 1..=2 {
                    let what = format!("{what} (outage {round})");
                    proxy.set(Fault::Refuse);
                    let tripped = wait_until(|| async {
                        let _ = limiter.check("k", &set, 1).await;
                        limiter.breaker_state() != BreakerState::Closed
                    })
                    .await;
                    assert!(tripped, "{what}: accepted, but the breaker never tripped");
                    let d = limiter.check("k", &set, 1).await;
                    assert!(d.is_ok_and(|d| d.allowed), "{what}: no fail-open admission");
                    proxy.set(Fault::None);
                    assert!(
                        limiter.wait_closed(Duration::MAX).await,
                        "{what}: accepted, but never reached Redis again"
                    );
                    let drained =
                        wait_until(|| async { limiter.reconcile_stats().pending_units == 0 }).await;
                    assert!(
                        drained,
                        "{what}: the ledger never drained: {:?}",
                        limiter.reconcile_stats()
                    );
                }
                accepted += 1;
            }
        }
    }
    assert!(
        refused > 50 && accepted > 20,
        "{refused} refused, {accepted} accepted"
    );
}

/// A slow-call threshold at or past the deadline is refused at `build()`,
/// naming both: no call could be slow (none ends after the deadline), and
/// the slow-call rate, like a check its caller drops, would say nothing.
#[tokio::test]
async fn a_slow_call_threshold_past_the_deadline_is_refused_at_build() {
    let url = "redis://127.0.0.1:1/";
    for (threshold, deadline) in [(40, 20), (40, 40), (100, 50)] {
        let mut breaker = BreakerConfig::default();
        breaker.slow_call_threshold = Duration::from_millis(threshold);
        let err = base(url)
            .deadline(Duration::from_millis(deadline))
            .breaker(breaker)
            .build()
            .expect_err("a threshold no call reaches");
        let text = err.to_string();
        assert!(
            matches!(err, Error::InvalidConfig { .. })
                && text.contains("slow_call_threshold")
                && text.contains("deadline"),
            "{threshold} ms, deadline {deadline} ms: {text}"
        );
    }
}

/// Item 19: the heartbeat's settings are validated at `build()`, so an
/// instance that could never learn the count is never started.
#[tokio::test]
async fn heartbeat_settings_that_could_never_work_are_refused_at_build() {
    let url = "redis://127.0.0.1:1/";
    for (every, ttl) in [
        (Duration::from_secs(1), Duration::MAX),
        (Duration::from_nanos(1), Duration::from_nanos(2)),
        (Duration::from_secs(1), Duration::from_millis(1_999)),
        (
            Duration::from_secs(2 * 60 * 60),
            Duration::from_secs(5 * 60 * 60),
        ),
    ] {
        let err = base(url)
            .heartbeat_every(every)
            .instance_ttl(ttl)
            .build()
            .expect_err("a heartbeat that cannot work");
        let text = err.to_string();
        assert!(
            text.contains("heartbeat_every") || text.contains("instance_ttl"),
            "every {every:?}, ttl {ttl:?}: {text}"
        );
    }
}

/// Regression (issue 9, item 20): the builder's `Debug` printed the Redis
/// password (`redis://user:secret@host/` verbatim). No URL is printed with its
/// password anywhere: builder, limiter, errors.
#[tokio::test]
async fn the_redis_password_is_never_printed() {
    const SECRET: &str = "s3cr3t-pa55";
    for url in [
        format!("redis://alice:{SECRET}@127.0.0.1:1/"),
        format!("redis://:{SECRET}@127.0.0.1:1/0"),
        format!("redis://alice:{SECRET}@127.0.0.1:notaport/"),
        format!("redis://alice:{SECRET}@/"),
    ] {
        let builder = base(&url).deadline(Duration::from_millis(50));
        let printed = format!("{builder:?}");
        assert!(!printed.contains(SECRET), "builder: {printed}");
        match builder.build() {
            Ok(limiter) => {
                let printed = format!("{limiter:?}");
                assert!(!printed.contains(SECRET), "limiter: {printed}");
                let set = RuleSet::new("s", [Rule::per_second(1).expect("valid")]).expect("valid");
                let d = limiter.check("k", &set, 1).await.expect("valid");
                assert!(!format!("{d:?}").contains(SECRET));
            }
            Err(e) => {
                let printed = format!("{e} / {e:?}");
                assert!(!printed.contains(SECRET), "error: {printed}");
            }
        }
    }
}

/// An empty name is refused by the builder as by the config file
/// (`limiter.name`). Before, the builder took it and labelled every series
/// `limiter=""`, which Prometheus reads as no label at all.
#[tokio::test]
async fn an_empty_limiter_name_is_refused() {
    let built = HybridLimiter::builder()
        .redis_url("redis://127.0.0.1:1/")
        .name("")
        .build();
    assert!(
        matches!(&built, Err(Error::InvalidConfig { what }) if what.contains("name")),
        "{:?}",
        built.err()
    );
}
