//! A hung or unreachable server never makes a call wait past its deadline:
//! against a server paused with SIGSTOP every call (check, batch, ping,
//! heartbeat, and a first call that still has to connect) fails with a Timeout
//! within deadline + 20 ms (less what a stall of the whole machine at its end
//! explains: `tierlimit_test::StallWatch`). Also: a tier made while Redis
//! refuses connections works on the very next call once it accepts them,
//! `replace_connection` recovers from a socket that will never answer again,
//! and a check carrying write-backs keeps its deadline over every round trip
//! it makes.

mod support;

use std::time::{Duration, Instant};

use tierlimit_core::{Error, LedgerEntry, RedisFailure, Rule, RuleSet};
use tierlimit_redis::{CheckRequest, RedisTier, TimeSource, WriteBack, Written};
use tierlimit_test::{Fault, FaultProxy, RedisServer, judged};

use support::{set, tier_with};

const DEADLINE: Duration = Duration::from_millis(50);
const SLACK: Duration = Duration::from_millis(20);

fn fast_tier(url: &str) -> RedisTier {
    tier_with(url, DEADLINE, TimeSource::Server)
}

fn per_second() -> RuleSet {
    set("hung", [Rule::per_second(1_000).expect("valid")])
}

/// Runs `call`, asserting it fails with a Timeout no later than deadline + 20 ms.
async fn times_out<T: std::fmt::Debug>(
    what: &str,
    call: impl std::future::Future<Output = Result<T, Error>>,
) -> Duration {
    let (result, took) = judged(call, DEADLINE + SLACK).await;
    let err = result.expect_err(what);
    assert!(err.is_timeout(), "{what}: {err:?}");
    took.unwrap_or_else(|why| panic!("{what}: {why}"))
}

#[tokio::test]
async fn paused_server_times_out_within_the_deadline() {
    let _serial = tierlimit_test::serial().await;
    let server = RedisServer::start();
    let warm = fast_tier(&server.url());
    let cold = fast_tier(&server.url());
    let set = per_second();
    warm.check("k", &set, 1).await.expect("healthy check");

    server.pause();
    let mut took = Vec::new();
    for i in 0..10 {
        took.push(times_out("check", warm.check(&format!("k{i}"), &set, 1)).await);
    }
    let batch = [
        CheckRequest::new("a", &set, 1),
        CheckRequest::new("b", &set, 1),
    ];
    took.push(times_out("check_many", warm.check_many(&batch)).await);
    took.push(times_out("ping", warm.ping()).await);
    took.push(
        times_out(
            "heartbeat",
            warm.heartbeat("tl:{i}:g", "me", Duration::from_secs(1)),
        )
        .await,
    );
    // The kernel completes the TCP handshake for a stopped process: the
    // connection setup is what hangs.
    took.push(times_out("first call of a new tier", cold.check("k", &set, 1)).await);
    took.sort();
    eprintln!(
        "paused server, deadline {DEADLINE:?}: {} calls, min {:?}, median {:?}, max {:?}",
        took.len(),
        took[0],
        took[took.len() / 2],
        took[took.len() - 1]
    );

    server.resume();
    // The socket was never broken: once the server runs again it answers.
    let started = Instant::now();
    loop {
        match warm.check("k", &set, 1).await {
            Ok(_) => break,
            Err(e) => assert!(
                started.elapsed() < Duration::from_secs(5),
                "no recovery after resume: {e:?}"
            ),
        }
    }
    cold.check("k", &set, 1)
        .await
        .expect("the new tier works too");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tier_made_while_redis_refuses_works_once_it_accepts() {
    let _serial = tierlimit_test::serial().await;
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    tokio::task::block_in_place(|| proxy.set(Fault::Refuse));
    let tier = fast_tier(&proxy.url());
    let set = per_second();
    for _ in 0..3 {
        let (result, took) = judged(tier.check("k", &set, 1), DEADLINE + SLACK).await;
        let err = result.expect_err("refused");
        assert_eq!(
            err.redis_failure(),
            Some(RedisFailure::ConnectionRefused),
            "{err:?}"
        );
        let took = took.unwrap_or_else(|why| panic!("a refusal: {why}"));
        eprintln!("refused in {took:?}");
    }
    tokio::task::block_in_place(|| proxy.set(Fault::None));
    for i in 0..10 {
        let v = tier.check("k", &set, 1).await;
        assert!(v.is_ok(), "check {i} after Redis accepted again: {v:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replace_connection_recovers_a_dead_socket() {
    let _serial = tierlimit_test::serial().await;
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    let tier = fast_tier(&proxy.url());
    let set = per_second();
    tier.check("k", &set, 1).await.expect("healthy check");

    // The proxy swallows everything: requests sent now are lost for good, so
    // this socket can never answer in order again, even once traffic flows.
    tokio::task::block_in_place(|| proxy.set(Fault::Blackhole));
    for _ in 0..3 {
        times_out("blackholed check", tier.check("k", &set, 1)).await;
    }
    // While the fault lasts a replacement cannot connect, and the old one stays.
    assert!(tier.replace_connection());
    assert!(!tier.replace_connection(), "one replacement at a time");
    let started = Instant::now();
    while !tier.replace_connection() {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "replacement never gave up"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(tier.connections_replaced(), 0);

    tokio::task::block_in_place(|| proxy.set(Fault::None));
    let started = Instant::now();
    loop {
        if tier.connections_replaced() == 1 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "no replacement after the fault"
        );
        // The replacement started last may have connected into the blackhole
        // before it lifted: it gives up, and the next one succeeds.
        tier.replace_connection();
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    eprintln!("replaced {:?} after the fault lifted", started.elapsed());
    for i in 0..20 {
        let v = tier.check("k", &set, 1).await;
        assert!(v.is_ok(), "check {i} on the fresh connection: {v:?}");
    }
}

/// Each round trip through the proxy of [`spilling_write_back`]: 60 ms each
/// way, of a 200 ms deadline.
const SPILL_DEADLINE: Duration = Duration::from_millis(200);

/// A tier behind a proxy holding each direction 60 ms, and a write-back of
/// 40 units over 4 stripes of 100 per hour, whose stripe 0 is full at its
/// share (25): it refuses its 10, which spill over the other three in a
/// round trip of their own.
async fn spilling_write_back() -> (RedisServer, FaultProxy, RedisTier, RuleSet, LedgerEntry) {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    let tier = tier_with(&proxy.url(), SPILL_DEADLINE, TimeSource::Server);
    let whole = Rule::per_hour(100)
        .expect("valid")
        .with_algorithm(tierlimit_core::Algorithm::FixedWindow)
        .expect("valid");
    let set = set("spill", [whole.clone()])
        .with_stripes(4)
        .expect("4 stripes fit");
    let stripe0 = set.stripe(0).expect("stripe 0");
    for _ in 0..25 {
        let v = tier.check("hot", stripe0, 1).await.expect("healthy check");
        assert!(v.decision.allowed);
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64);
    let entry = LedgerEntry::new(
        support::storage_key(&set, "hot", 0),
        whole.clone(),
        40,
        now,
        now,
    )
    .with_stripes(4);
    // Both calls' connections made and their routines loaded beforehand.
    let warm = LedgerEntry::new(support::storage_key(&set, "warm", 0), whole, 1, now, now);
    let warming = [WriteBack::new("warm", &warm)];
    tier.reconcile(&warming).await.expect("healthy write-back");
    tier.check_after("warm", &set, 1, &warming)
        .await
        .expect("healthy check");
    tokio::task::block_in_place(|| proxy.set(Fault::Latency(Duration::from_millis(60))));
    (server, proxy, tier, set, entry)
}

/// What a spilling write-back's call answered: within the deadline, the
/// first round's outcome (the three stripes with room took their 10 each),
/// the spill cut at the deadline.
fn assert_spill_cut(
    what: &str,
    written: &[Result<Written, Error>],
    took: Result<Duration, String>,
) {
    took.unwrap_or_else(|why| panic!("{what}: {why}"));
    assert!(
        matches!(written, [Ok(Written::Applied(30))]),
        "{what}: the first round's outcome stands, the spill was cut: {written:?}"
    );
}

/// A check that carries write-backs answers within its deadline too when a
/// striped write-back spills what a full stripe refused. Regression: the
/// spill's round trip came on top of the pipeline's, under a deadline of its
/// own, and the check answered after both. Each round trip takes 120 ms of
/// a 200 ms deadline: the pipeline is answered, the spill cut at the
/// deadline, and the check's verdict stands. (The check is of another key,
/// with room on every stripe: it asks a stripe at random, and one that
/// denied it would send it to the next after the deadline.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_after_whose_write_back_spills_keeps_its_deadline() {
    let _serial = tierlimit_test::serial().await;
    let (_server, _proxy, tier, set, entry) = spilling_write_back().await;
    let (result, took) = judged(
        tier.check_after("cold", &set, 1, &[WriteBack::new("wb", &entry)]),
        SPILL_DEADLINE + SLACK,
    )
    .await;
    let (verdict, written) = result.expect("the pipeline was answered");
    assert!(verdict.decision.allowed, "{verdict:?}");
    assert_spill_cut("a check after a spilling write-back", &written, took);
}

/// The same for a write-back sent alone: its spill rounds are part of the
/// call. Regression: each round had a deadline of its own, so a write-back
/// over 64 stripes could take 63 deadlines.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_back_whose_stripe_spills_keeps_its_deadline() {
    let _serial = tierlimit_test::serial().await;
    let (_server, _proxy, tier, _set, entry) = spilling_write_back().await;
    let (result, took) = judged(
        tier.reconcile(&[WriteBack::new("wb", &entry)]),
        SPILL_DEADLINE + SLACK,
    )
    .await;
    let written = result.expect("the first round was answered");
    assert_spill_cut("a spilling write-back", &written, took);
}
