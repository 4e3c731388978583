//! Every fault of the hybrid limiter issue, during concurrent load, under the three
//! policies at once (one rule set per policy), against a real redis-server.
//!
//! Bounds asserted for each fault: no check errs; none takes longer than the
//! deadline + 15 ms (less what a stall of the whole machine at its end
//! explains: `tierlimit_test::StallWatch`); once Open, p99 latency is under
//! 1 ms; the breaker trips within 500 ms of a hang (200 ms of a refused
//! connection) and closes within the cool-down + one probe after Redis
//! returns; FailClosed admits nothing while Open and FailOpen admits
//! everything; a decision the policy made because its own Redis call failed
//! says how the call failed, and one made while Open (no call) says nothing.
//!
//! Checks their callers drop before the deadline (an outer timeout) still
//! tell the breaker of a hung Redis, alone or batched.
//!
//! A scenario that fails while the machine itself stopped for
//! [`DISTURBING`] or more is run once more ([`run`]): no limiter can keep a
//! bound through that, and the second run must pass on its own.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use support::{DEADLINE, StateLog, builder, healthy, wait_for};
use tierlimit::{Algorithm, BreakerState, Policy, RedisFailure, Rule, RuleSet, Tier};
use tierlimit_test::{Fault, FaultProxy, Load, MemoryFiller, RedisServer, StallWatch, quantile};

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Kill9,
    Hang,
    RestartEmpty,
    ScriptFlush,
    Oom,
    LatencyBelow,
    LatencyAbove,
    Blackhole,
    Refuse,
    Reset,
}

impl Kind {
    /// Whether this fault makes Redis unusable, so the breaker must trip, and the
    /// trip-time bound that applies.
    fn trip_bound(self) -> Option<Duration> {
        match self {
            Kind::Kill9 | Kind::Refuse | Kind::Reset => Some(Duration::from_millis(200)),
            Kind::Hang | Kind::Blackhole | Kind::LatencyAbove | Kind::Oom => {
                Some(Duration::from_millis(500))
            }
            Kind::RestartEmpty | Kind::ScriptFlush | Kind::LatencyBelow => None,
        }
    }

    /// How the checks this fault fails may say their Redis call failed.
    fn failures(self) -> &'static [RedisFailure] {
        use RedisFailure::*;
        match self {
            // The socket closes under the call; reconnecting is then refused.
            Kind::Kill9 | Kind::Refuse => &[ConnectionLost, ConnectionRefused],
            Kind::Reset => &[ConnectionLost],
            Kind::Hang | Kind::Blackhole | Kind::LatencyAbove => &[Timeout],
            Kind::Oom => &[OutOfMemory],
            // A restart may break the connection under a call, which then
            // reconnects; a flushed script is reloaded.
            Kind::RestartEmpty => &[ConnectionLost, ConnectionRefused],
            Kind::ScriptFlush | Kind::LatencyBelow => &[],
        }
    }

    fn via_proxy(self) -> bool {
        // Kill9 too: Redis is restarted while the proxy refuses, so the moment
        // it "returns" is one switch of the proxy, not a slow process start.
        matches!(
            self,
            Kind::Kill9
                | Kind::LatencyBelow
                | Kind::LatencyAbove
                | Kind::Blackhole
                | Kind::Refuse
                | Kind::Reset
        )
    }
}

fn sets() -> [RuleSet; 3] {
    // Fail-open and fail-closed sets never deny in Redis, so every denial while
    // Open is the policy's, and every admission too.
    let roomy = || [Rule::per_second(100_000).expect("valid")];
    let local = [
        Rule::per_second(200).expect("valid"),
        Rule::per_minute(5_000)
            .and_then(|r| r.with_algorithm(Algorithm::SlidingWindow))
            .expect("valid"),
    ];
    [
        RuleSet::new("open", roomy())
            .expect("valid")
            .with_policy(Policy::FailOpen),
        RuleSet::new("closed", roomy())
            .expect("valid")
            .with_policy(Policy::FailClosed),
        RuleSet::new("local", local)
            .expect("valid")
            .with_policy(Policy::LocalFallback),
    ]
}

async fn scenario(kind: Kind) {
    let oom_args: &[&str] = &["--maxmemory", "4mb", "--maxmemory-policy", "noeviction"];
    let mut server = RedisServer::start_with(if kind == Kind::Oom { oom_args } else { &[] });
    let proxy = FaultProxy::start(server.addr()).await;
    let url = if kind.via_proxy() {
        proxy.url()
    } else {
        server.url()
    };
    let limiter = healthy(builder(&url)).await;
    let sets = Arc::new(sets());

    let l = limiter.clone();
    let s = sets.clone();
    let load = Load::start(32, Duration::from_millis(2), move |t, i| {
        let (l, s) = (l.clone(), s.clone());
        async move {
            let stream = t % 3;
            let key = format!("user-{}", (t + i as usize) % 5);
            (stream, l.check(&key, &s[stream], 1).await)
        }
    });
    let log = StateLog::start(limiter.clone(), load.started());
    tokio::time::sleep(Duration::from_millis(400)).await;

    let fault_at = load.elapsed();
    let mut filler = None;
    match kind {
        Kind::Kill9 => server.kill9(),
        Kind::Hang => server.pause(),
        Kind::RestartEmpty => server.restart(),
        Kind::ScriptFlush => server.lua_flush().await,
        Kind::Oom => filler = Some(MemoryFiller::start(&server.url()).expect("fill memory")),
        Kind::LatencyBelow => proxy.set(Fault::Latency(Duration::from_millis(8))),
        Kind::LatencyAbove => proxy.set(Fault::Latency(DEADLINE)),
        Kind::Blackhole => proxy.set(Fault::Blackhole),
        Kind::Refuse => proxy.set(Fault::Refuse),
        Kind::Reset => proxy.set(Fault::Reset),
    }
    if kind.trip_bound().is_some() {
        assert!(
            wait_for(Duration::from_secs(2), || limiter.breaker_state()
                != BreakerState::Closed)
            .await,
            "{kind:?}: the breaker never tripped"
        );
    }
    tokio::time::sleep(Duration::from_millis(1_200)).await;

    if kind == Kind::Kill9 {
        proxy.set(Fault::Refuse);
        server.restart();
    }
    // Heal while no probe is in flight, so "the cool-down in force" is defined.
    if kind.trip_bound().is_some() {
        assert!(
            wait_for(Duration::from_secs(2), || limiter.breaker_state()
                == BreakerState::Open)
            .await,
            "{kind:?}: the breaker is not Open before healing"
        );
    }
    let heal_at = load.elapsed();
    let until_probe = limiter.breaker().time_until_probe().unwrap_or_default();
    match kind {
        Kind::Hang => server.resume(),
        Kind::Oom => filler.take().expect("filling").stop().expect("free memory"),
        Kind::RestartEmpty | Kind::ScriptFlush => {}
        _ => proxy.set(Fault::None),
    }
    assert!(
        limiter.wait_closed(Duration::from_secs(5)).await,
        "{kind:?}: the breaker did not close after Redis returned"
    );
    let closed_at = load.elapsed();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let samples = load.stop().await;

    // 1. No errors, no check slower than the deadline + 15 ms.
    let errors = samples.errors();
    assert!(
        errors.is_empty(),
        "{kind:?}: {} checks erred, e.g. {:?}",
        errors.len(),
        errors[0]
    );
    // A decision says how its own Redis call failed, and only a fallback does.
    let failed: Vec<_> = samples
        .all
        .iter()
        .filter_map(|s| Some((s, s.redis_failure()?)))
        .collect();
    println!(
        "{kind:?}: {} decisions after a failed call: {:?}",
        failed.len(),
        failed
            .iter()
            .map(|(_, f)| *f)
            .collect::<std::collections::HashSet<_>>()
    );
    for (s, f) in &failed {
        assert!(
            kind.failures().contains(f) && s.tier().is_some_and(Tier::is_fallback),
            "{kind:?}: a {:?} decision says its call failed with {f:?}",
            s.tier()
        );
    }
    if kind.trip_bound().is_some() {
        assert!(
            !failed.is_empty(),
            "{kind:?}: no decision says its call failed"
        );
    }
    let slowest = samples.judge_latency(DEADLINE + Duration::from_millis(15));
    println!(
        "{kind:?}: {} checks, slowest {slowest:?}; {}",
        samples.all.len(),
        samples.stalls
    );
    if let Err(why) = slowest {
        panic!("{kind:?}: {why}");
    }

    let Some(bound) = kind.trip_bound() else {
        // Faults Redis absorbs: it keeps deciding; the breaker may only blink on a restart.
        if kind != Kind::RestartEmpty {
            assert!(
                !log.left_closed(Duration::ZERO),
                "{kind:?}: the breaker tripped"
            );
            let fallback = samples
                .all
                .iter()
                .filter(|s| s.tier().is_some_and(Tier::is_fallback))
                .count();
            assert_eq!(
                fallback, 0,
                "{kind:?}: {fallback} decisions did not come from Redis"
            );
        }
        let after = samples.between(closed_at, closed_at + Duration::from_secs(1));
        assert!(
            after
                .into_iter()
                .all(|s| !s.tier().is_some_and(Tier::is_fallback))
        );
        return;
    };

    // 3. Trip time and recovery time.
    let open_at = log.first(BreakerState::Open, fault_at).expect("tripped");
    let trip = open_at - fault_at;
    let recovery = closed_at.saturating_sub(heal_at);
    println!(
        "{kind:?}: tripped after {trip:?}, closed {recovery:?} after Redis returned (probe was due in {until_probe:?})"
    );
    assert!(
        trip < bound,
        "{kind:?}: tripped after {trip:?}, bound {bound:?}"
    );
    // One probe takes at most the deadline; 25 ms covers the 1 ms state polling and scheduling.
    let recovery_bound = until_probe + DEADLINE + Duration::from_millis(25);
    assert!(
        recovery <= recovery_bound,
        "{kind:?}: closed {recovery:?} after Redis returned, bound {recovery_bound:?}"
    );

    // 2. Once Open, no Redis I/O: p99 under 1 ms. Only checks made while the
    // breaker was Open count (under -OOM it may close again when expiring keys
    // free room, and Redis decides again).
    let margin = Duration::from_millis(5);
    let open: Vec<_> = samples
        .between(open_at, heal_at)
        .filter(|s| log.open_throughout(s.at, margin))
        .collect();
    assert!(
        open.len() > 100,
        "{kind:?}: only {} checks while Open",
        open.len()
    );
    let p99 = quantile(open.iter().map(|s| s.latency), 0.99);
    println!(
        "{kind:?}: p99 while Open {p99:?} over {} checks",
        open.len()
    );
    assert!(
        p99 < Duration::from_millis(1),
        "{kind:?}: p99 while Open {p99:?}"
    );
    assert!(
        open.iter().all(|s| s.tier() != Some(Tier::Redis)),
        "{kind:?}: Redis decided while Open"
    );
    assert!(
        open.iter().all(|s| s.redis_failure().is_none()),
        "{kind:?}: a decision made while Open (no call) says its call failed"
    );

    // 4. FailClosed admits nothing while Open; FailOpen admits everything.
    let by = |stream: usize| open.iter().filter(move |s| s.stream == stream);
    assert_eq!(
        by(1).filter(|s| s.allowed()).count(),
        0,
        "{kind:?}: FailClosed admitted"
    );
    assert!(
        by(0).all(|s| s.allowed() && s.tier() == Some(Tier::FailOpen)),
        "{kind:?}: FailOpen denied"
    );
    assert!(
        by(2).all(|s| s.tier() == Some(Tier::Local)),
        "{kind:?}: LocalFallback not local"
    );
    assert!(
        by(2).any(|s| s.allowed()),
        "{kind:?}: LocalFallback admitted nothing"
    );
}

/// The shortest stall of the whole machine that can break a bound here on
/// its own. The least margin any bound leaves is about 24 ms: the slowest
/// call under [`Kind::LatencyBelow`] takes about 26 ms of its 50 ms deadline
/// on a quiet machine (and 28-31 ms beside four busy loops), and the
/// recovery bound allows 25 ms beyond the probe. A stall in CI once timed out
/// 10 such calls at once.
const DISTURBING: Duration = Duration::from_millis(20);

/// Runs `kind`'s scenario alone in this binary. If it fails while a
/// [`StallWatch`] beside it saw the machine stop for [`DISTURBING`] or
/// more, the failure is printed with that stall and the scenario runs once
/// more; a failure with no such stall, or a second failure, fails the test.
async fn run(kind: Kind) {
    let _serial = tierlimit_test::serial().await;
    for attempt in 1.. {
        let watch = StallWatch::start(Instant::now()).expect("the stall watch's thread starts");
        let outcome = tokio::spawn(scenario(kind)).await;
        let stalls = watch.stop();
        match outcome {
            Ok(()) => return,
            Err(failed) if attempt == 1 && stalls.longest() >= DISTURBING => println!(
                "{kind:?}: the first run failed ({failed}) while {stalls}; running it once more"
            ),
            Err(failed) => match failed.try_into_panic() {
                Ok(panic) => std::panic::resume_unwind(panic),
                Err(failed) => panic!("{kind:?}: the scenario did not finish: {failed}"),
            },
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9() {
    run(Kind::Kill9).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hang_with_socket_open() {
    run(Kind::Hang).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_with_empty_script_cache() {
    run(Kind::RestartEmpty).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush() {
    run(Kind::ScriptFlush).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_memory() {
    run(Kind::Oom).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_below_deadline() {
    run(Kind::LatencyBelow).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_above_deadline() {
    run(Kind::LatencyAbove).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blackhole() {
    run(Kind::Blackhole).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_refused() {
    run(Kind::Refuse).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_reset() {
    run(Kind::Reset).await;
}

/// The deadline of the dropped-check tests: long, so that every call these
/// tests drop is still unanswered when it is dropped or ends (redis-rs
/// fails new requests at once for a while after its own response timeout,
/// the deadline, passes on a request to a hung server).
const PATIENT: Duration = Duration::from_secs(1);

/// Callers that give up on their checks sooner than the deadline (a
/// timeout of their own shorter than it) still trip the breaker against a
/// hung Redis. A check's call ran in the dropped future and nothing heard
/// of it: the breaker stayed Closed through the whole outage, and every
/// request kept paying its caller's whole timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_dropped_by_their_callers_trip_the_breaker() {
    let _serial = tierlimit_test::serial().await;
    let server = RedisServer::start();
    let limiter = healthy(builder(&server.url()).deadline(PATIENT)).await;
    let set = support::hourly("dropped", 1_000);
    server.pause();
    // Past the slow-call threshold (40 ms), well short of the deadline: ten
    // of them take 600 ms of the 1 s.
    let gives_up = Duration::from_millis(60);
    for i in 0..10 {
        let key = format!("k{i}");
        let _ = tokio::time::timeout(gives_up, limiter.check(&key, &set, 1)).await;
        if limiter.breaker_state() != BreakerState::Closed {
            break;
        }
    }
    let state = limiter.breaker_state();
    server.resume();
    assert_ne!(
        state,
        BreakerState::Closed,
        "10 checks dropped unanswered after 60 ms did not trip the breaker"
    );
}

/// A batch's call whose checks were all dropped by their callers still
/// reaches the breaker: the check that was to report it was gone, and the
/// call's failure with it. Here only batches can speak: the callers give up
/// (60 ms) before the slow-call threshold (100 ms), so a check dropped
/// during its own call says nothing, and the batches of the 20 checks (at
/// least one: two at most go alone) time out at the deadline with nobody
/// waiting. One failed call trips the breaker here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_whose_checks_were_dropped_still_reaches_the_breaker() {
    let _serial = tierlimit_test::serial().await;
    let server = RedisServer::start();
    let mut breaker = support::breaker();
    breaker.slow_call_threshold = Duration::from_millis(100);
    breaker.consecutive_failures = 1;
    let limiter = healthy(builder(&server.url()).deadline(PATIENT).breaker(breaker)).await;
    let set = support::hourly("dropped-batch", 1_000);
    server.pause();
    let gives_up = Duration::from_millis(60);
    let checks: Vec<_> = (0..20)
        .map(|i| {
            let (limiter, set) = (limiter.clone(), set.clone());
            tokio::spawn(async move {
                let key = format!("k{i}");
                let check = limiter.check(&key, &set, 1);
                tokio::time::timeout(gives_up, check).await.is_err()
            })
        })
        .collect();
    for check in checks {
        assert!(
            check.await.expect("a check task"),
            "a paused server answered"
        );
    }
    // The batches' calls end at their deadline, unheard by any check.
    let tripped = wait_for(PATIENT + Duration::from_millis(500), || {
        limiter.breaker_state() != BreakerState::Closed
    })
    .await;
    server.resume();
    assert!(
        tripped,
        "20 checks dropped after 60 ms did not trip the breaker"
    );
}

/// A key something else wrote under (a value of another type: `WRONGTYPE`)
/// is that key's fault, not Redis': its checks get the policy's answer and
/// say why, and the breaker counts their calls as answered. Ten in a row
/// tripped it (five failures in a row do), for every key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_of_another_type_does_not_trip_the_breaker() {
    let server = RedisServer::start();
    let limiter = healthy(builder(&server.url())).await;
    let set = RuleSet::new(
        "spoilt",
        [Rule::per_hour(10)
            .expect("valid")
            .with_algorithm(Algorithm::FixedWindow)
            .expect("valid")],
    )
    .expect("valid")
    .with_policy(Policy::FailClosed);
    let key = set.storage_key(&tierlimit_core::escape_key("bad"), 0);
    let mut conn = server.conn().await;
    let () = redis::cmd("SET")
        .arg(&key)
        .arg("not a window")
        .query_async(&mut conn)
        .await
        .expect("SET");
    for i in 0..10 {
        let d = limiter.check("bad", &set, 1).await.expect("a valid check");
        assert_eq!(
            (d.tier, d.redis_failure),
            (Tier::FailClosed, Some(RedisFailure::WrongType)),
            "check {i}: {d:?}"
        );
    }
    assert_eq!(limiter.breaker_state(), BreakerState::Closed);
    let d = limiter.check("good", &set, 1).await.expect("a valid check");
    assert_eq!(d.tier, Tier::Redis, "{d:?}");
}

/// While Open, no Redis I/O at all (the README's promise): 500 checks of
/// every policy send the proxy in front of Redis not one byte. Redis is
/// reachable the whole time (a latency past the deadline trips the
/// breaker), so a check that called it would be seen; the cool-down is long
/// enough that no probe runs meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_open_no_check_sends_redis_a_byte() {
    let _serial = tierlimit_test::serial().await;
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    let mut breaker = support::breaker();
    breaker.cool_down = Duration::from_secs(30);
    breaker.max_cool_down = Duration::from_secs(30);
    // Nor a replacement connection: its handshake is not a check's I/O.
    breaker.replace_connection_after = 1_000;
    let limiter = builder(&proxy.url())
        .breaker(breaker)
        .build()
        .expect("valid config");
    let sets = sets();
    assert!(limiter.check("warm", &sets[0], 1).await.is_ok());
    proxy.set(Fault::Latency(DEADLINE * 3));
    support::trip(&limiter, &sets[0]).await;
    assert_eq!(limiter.breaker_state(), BreakerState::Open);
    // What the tripping checks sent may still be on its way: the count is
    // taken once the breaker is Open, and only the checks after it count.
    let before = proxy.bytes_from_clients();
    for i in 0..500 {
        let set = &sets[i % sets.len()];
        let d = limiter
            .check(&format!("k{i}"), set, 1)
            .await
            .expect("valid");
        assert_ne!(
            d.tier,
            Tier::Redis,
            "check {i} was decided by Redis while Open"
        );
    }
    let sent = proxy.bytes_from_clients() - before;
    assert_eq!(limiter.breaker_state(), BreakerState::Open);
    assert_eq!(sent, 0, "500 checks while Open sent Redis {sent} bytes");
}
