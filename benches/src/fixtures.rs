//! Limiters in known states, rule sets and a runtime, shared by the benches.

use std::future::Future;
use std::net::{Ipv4Addr, TcpListener};
use std::num::NonZeroU32;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use governor::Quota;
use tierlimit::{
    BreakerConfig, BreakerState, HybridLimiter, Instances, LocalConfig, Rule, RuleSet,
};
use tokio::runtime::Runtime;

/// How long the breaker may take to trip against a dead port before the bench
/// gives up: each failed call fails at once (connection refused) or at the
/// 50 ms deadline, and five in a row trip it.
const TRIP_TIMEOUT: Duration = Duration::from_secs(10);
/// The limiters' pruning interval and the breaker's cool-down: the longest the
/// builder accepts, so neither a pruning round nor a probe runs during a bench.
const QUIET: Duration = Duration::from_secs(60 * 60);

/// A current-thread Tokio runtime with time and I/O.
///
/// Single-threaded on purpose: the limiter's background tasks and redis-rs's
/// connection driver run only inside `block_on`, on the calling thread, so
/// they never run beside a measurement that polls a check directly, and the
/// allocation counter sees every allocation a check causes.
pub fn runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("cannot build a current-thread Tokio runtime")
}

/// A `redis://` URL of a loopback port nobody listens on: bound, read and
/// released, so connecting to it is refused at once.
pub fn dead_redis_url() -> String {
    let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .expect("cannot bind an ephemeral port on 127.0.0.1")
        .port();
    format!("redis://127.0.0.1:{port}/")
}

/// The first rule of [`generous_set`]: one unit per microsecond (the finest
/// rate a rule may have) with a burst of `u32::MAX` (governor's largest), so a
/// key takes over 400 s of checks at 10 million a second to run dry. The
/// governor baselines use the same quota.
pub const GENEROUS_RATE_PER_SECOND: u32 = 1_000_000;
/// The burst of [`GENEROUS_RATE_PER_SECOND`].
pub const GENEROUS_BURST: u32 = u32::MAX;

/// A rule set named `name` of 1 to 3 GCRA rules that no bench exhausts, so
/// every check measures the admit path: 1e6 per second with a burst of
/// `u32::MAX` (see [`GENEROUS_RATE_PER_SECOND`]), then 6e7 per minute and
/// 3.6e9 per hour with larger bursts.
pub fn generous_set(name: &str, rules: usize) -> RuleSet {
    let all = [
        Rule::per_second(u64::from(GENEROUS_RATE_PER_SECOND))
            .and_then(|r| r.with_burst(u64::from(GENEROUS_BURST))),
        Rule::per_minute(60_000_000).and_then(|r| r.with_burst(1 << 33)),
        Rule::per_hour(3_600_000_000).and_then(|r| r.with_burst(1 << 34)),
    ];
    let rules: Vec<Rule> = all
        .into_iter()
        .take(rules.clamp(1, 3))
        .map(|r| r.expect("the generous rules are valid"))
        .collect();
    RuleSet::new(name, rules).expect("the generous rule set is valid")
}

/// governor's quota equal to [`generous_set`]'s first rule: 1e6 per second,
/// bursts of `u32::MAX`.
pub fn generous_quota() -> Quota {
    let rate = NonZeroU32::new(GENEROUS_RATE_PER_SECOND).expect("a positive rate");
    let burst = NonZeroU32::new(GENEROUS_BURST).expect("a positive burst");
    Quota::per_second(rate).allow_burst(burst)
}

/// A limiter whose breaker is Open, for good: built against
/// [`dead_redis_url`], tripped by checks until [`BreakerState::Open`] (at most
/// 10 s), with a one-hour cool-down so no probe runs during the bench, a fixed
/// instance count of 1 so [`Policy::LocalFallback`](tierlimit::Policy) has a
/// share (the whole limit), and `local` as its local tier's bounds.
///
/// Its checks never await anything: [`poll_ready`] answers them.
pub fn tripped_limiter(rt: &Runtime, local: LocalConfig) -> HybridLimiter {
    let _entered = rt.enter();
    let mut breaker = BreakerConfig::default();
    breaker.cool_down = QUIET;
    breaker.max_cool_down = QUIET;
    let limiter = HybridLimiter::builder()
        .redis_url(dead_redis_url())
        .instances(Instances::Fixed(1))
        .breaker(breaker)
        .local(local)
        .prune_every(QUIET)
        .build()
        .expect("the bench limiter's settings are valid");
    let trip = generous_set("trip", 1);
    let started = Instant::now();
    while limiter.breaker_state() != BreakerState::Open {
        assert!(
            started.elapsed() < TRIP_TIMEOUT,
            "the breaker did not open within {TRIP_TIMEOUT:?} of checks against a dead port"
        );
        rt.block_on(limiter.check("trip", &trip, 1))
            .expect("a valid check");
    }
    limiter
}

/// A limiter on the Redis at `url` with a fixed instance count of 1 (no
/// heartbeat calls beside the bench's) and no pruning during a bench. Build it
/// inside `rt`.
pub fn healthy_limiter(rt: &Runtime, url: &str) -> HybridLimiter {
    let _entered = rt.enter();
    HybridLimiter::builder()
        .redis_url(url)
        .instances(Instances::Fixed(1))
        .prune_every(QUIET)
        .build()
        .expect("the bench limiter's settings are valid")
}

/// Polls `fut` once and returns its output; panics if it is not ready.
///
/// A check whose breaker is Open does no I/O, so it is ready at the first
/// poll. Polling it directly measures the check, not an executor: an
/// application awaits it inside a task that is already running.
pub fn poll_ready<F: Future>(fut: F) -> F::Output {
    let mut fut = pin!(fut);
    match fut.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("a future expected to be ready at once awaited something"),
    }
}

/// The name of the Functions library's function `<prefix><id>` (`<id>` being
/// the library's own, read from its source: the tier keeps its names to
/// itself): `tierlimit_check_` or `tierlimit_check_batch_`.
pub fn library_function(prefix: &str) -> String {
    let source = tierlimit_redis::library_source();
    let id = source
        .lines()
        .next()
        .and_then(|line| line.strip_prefix("#!lua name=tierlimit_"))
        .expect("the library's first line names it tierlimit_<id>");
    let name = format!("{prefix}{id}");
    assert!(
        source.contains(&format!("redis.register_function('{name}'")),
        "the library registers {name}"
    );
    name
}

/// `FCALL <function> 1 <storage key> <now> 1 42 <the rule's numbers>`: what
/// the tier sends for one check of user `key` of `set`'s first rule, cost 1,
/// at `now_us` (µs since the Unix epoch, the caller's clock) or, for 0, at
/// the server's time.
pub fn fcall_args(function: &str, set: &RuleSet, key: &str, now_us: u64) -> Vec<String> {
    let mut args = vec![
        "FCALL".to_string(),
        function.to_string(),
        "1".into(),
        set.storage_key(key, 0),
        now_us.to_string(),
        "1".into(),
        "42".into(),
    ];
    args.push(set.script_arg(0).to_string());
    args
}
