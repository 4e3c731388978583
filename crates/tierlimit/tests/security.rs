//! The limiter over TLS and as an ACL user, and what its builder prints.
//!
//! Regression tests for issue 9, items 10 and 20: `rediss://` failed with "TLS
//! feature is not enabled", and the builder's `Debug` printed the password.

mod support;

use std::time::Duration;

use tierlimit::{Error, HybridLimiter, Policy, Rule, RuleSet, Tier};
use tierlimit_test::RedisServer;

const USER: &str = "app";
const PASSWORD: &str = "pw-s3cret-9f2";

fn set(policy: Policy) -> RuleSet {
    RuleSet::new("security", [Rule::per_minute(100).expect("valid rule")])
        .expect("valid set")
        .with_policy(policy)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_limiter_decides_on_redis_over_tls_as_an_acl_user() {
    let args = RedisServer::acl_user(USER, PASSWORD);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let server = RedisServer::start_tls(&args);
    let builder = support::builder(&server.url_as(USER, PASSWORD))
        .deadline(Duration::from_secs(1))
        .tls_root_certificates(server.tls_ca_pem().expect("a TLS server"));
    let limiter = support::healthy(builder).await;
    let decision = limiter
        .check("user:1", &set(Policy::FailClosed), 1)
        .await
        .expect("valid check");
    assert_eq!(decision.tier, Tier::Redis, "{decision:?}");
    assert!(decision.allowed);
    assert!(server.script_calls().await >= 1);
}

/// Mutual TLS, as the README promises: a server that asks every client for
/// a certificate serves a limiter that presents one its CA signed, and a
/// limiter without one gets its policy's answer, never Redis'.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_serves_a_client_certificate_and_only_that() {
    let server = RedisServer::start_tls(&["--tls-auth-clients", "yes"]);
    let ca = server.tls_ca_pem().expect("a TLS server");
    let (chain, key) = server.tls_client_identity().expect("a TLS server");
    let tls = |builder: tierlimit::HybridLimiterBuilder| {
        builder
            .deadline(Duration::from_secs(1))
            .tls_root_certificates(ca)
    };
    let limiter =
        support::healthy(tls(support::builder(&server.url())).tls_client_certificate(chain, key))
            .await;
    let decision = limiter
        .check("user:1", &set(Policy::FailClosed), 1)
        .await
        .expect("valid check");
    assert_eq!(decision.tier, Tier::Redis, "{decision:?}");
    assert!(decision.allowed);

    let calls = server.script_calls().await;
    let anonymous = tls(support::builder(&server.url()))
        .build()
        .expect("valid limiter config");
    let decision = anonymous
        .check("user:1", &set(Policy::FailClosed), 1)
        .await
        .expect("valid check");
    assert!(
        decision.tier != Tier::Redis && !decision.allowed && decision.redis_failure.is_some(),
        "{decision:?}"
    );
    assert_eq!(server.script_calls().await, calls, "its check never ran");
}

/// The least a limiter's ACL user needs (the README's Security section quotes
/// it): its own keys, the scripts, PING and the commands the scripts call.
const LEAST_PRIVILEGE: &[&str] = &[
    "--user",
    USER,
    "on",
    ">pw-s3cret-9f2",
    "resetkeys",
    "~tl:*",
    "~{tl:*",
    "resetchannels",
    "-@all",
    "+ping",
    "+evalsha",
    "+eval",
    "+script|load",
    "+time",
    "+@read",
    "+@write",
    "-@dangerous",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_least_privilege_acl_user_can_do_all_a_limiter_does() {
    let server = RedisServer::start_with(LEAST_PRIVILEGE);
    let limiter = support::healthy(
        support::builder(&server.url_as(USER, PASSWORD)).deadline(Duration::from_secs(1)),
    )
    .await;
    for algorithm in [
        tierlimit::Algorithm::Gcra,
        tierlimit::Algorithm::TokenBucket,
        tierlimit::Algorithm::SlidingLog,
        tierlimit::Algorithm::SlidingWindow,
        tierlimit::Algorithm::FixedWindow,
    ] {
        let rule = Rule::per_minute(100)
            .and_then(|r| r.with_algorithm(algorithm))
            .expect("valid rule");
        let set = RuleSet::new("least", [rule])
            .expect("valid set")
            .with_policy(Policy::FailClosed);
        let decision = limiter.check("user:1", &set, 1).await.expect("valid check");
        assert_eq!(decision.tier, Tier::Redis, "{algorithm:?}: {decision:?}");
    }
    // The user cannot touch keys outside tierlimit's.
    let mut conn = redis::Client::open(server.url_as(USER, PASSWORD))
        .expect("valid url")
        .get_multiplexed_async_connection()
        .await
        .expect("app logs in");
    let denied: redis::RedisResult<()> = redis::cmd("SET")
        .arg("other")
        .arg(1)
        .query_async(&mut conn)
        .await;
    assert!(denied.is_err(), "a key outside tl:* must be refused");
    let denied: redis::RedisResult<()> = redis::cmd("FLUSHALL").query_async(&mut conn).await;
    assert!(denied.is_err(), "FLUSHALL must be refused");
}

/// The same user through the rest of a limiter's life: it joins the
/// heartbeat set and learns the count, writes back what an outage admitted
/// locally, and leaves the set at shutdown. (The test above builds with a
/// fixed count of 1, so none of that runs there.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_least_privilege_acl_user_beats_writes_back_and_leaves() {
    let _serial = tierlimit_test::serial().await;
    let server = RedisServer::start_with(LEAST_PRIVILEGE);
    let proxy = tierlimit_test::FaultProxy::start(server.addr()).await;
    let url = format!("redis://{USER}:{PASSWORD}@{}/", proxy.addr());
    let limiter = support::builder(&url)
        .deadline(Duration::from_secs(1))
        .instances(tierlimit::Instances::Learned { assume: None })
        .build()
        .expect("valid config");
    assert!(
        support::wait_for(Duration::from_secs(10), || limiter.instances() == Some(1)).await,
        "the heartbeat never learned the count as {USER}"
    );
    let set = support::hourly("least-life", 100);
    proxy.set(tierlimit_test::Fault::Refuse);
    support::trip(&limiter, &set).await;
    let mut local = 0;
    for _ in 0..10 {
        let d = limiter.check("user:1", &set, 1).await.expect("valid");
        if d.allowed && d.tier == Tier::Local {
            local += 1;
        }
    }
    assert!(local > 0, "the outage admitted nothing locally");
    proxy.set(tierlimit_test::Fault::None);
    support::drained(&limiter, Duration::from_secs(10)).await;
    // Redis counts what the outage admitted (the tripping checks were on a
    // key of their own).
    let d = limiter.check("user:1", &set, 1).await.expect("valid");
    assert_eq!(
        (d.tier, d.remaining),
        (Tier::Redis, 100 - local - 1),
        "{d:?}"
    );
    let report = limiter.shutdown(Duration::from_secs(5)).await;
    assert!(
        report.left_group,
        "{USER} could not leave the heartbeat set: {report:?}"
    );
    assert_eq!(report.undrained_units, 0, "{report:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_a_fault_the_policy_answers() {
    let args = RedisServer::acl_user(USER, PASSWORD);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let server = RedisServer::start_with(&args);
    // No I/O at build: a wrong password cannot be known before Redis answers.
    let limiter = support::builder(&server.url_as(USER, "wrong-password"))
        .deadline(Duration::from_secs(1))
        .build()
        .expect("a wrong password is not a configuration error");
    let closed = set(Policy::FailClosed);
    for _ in 0..20 {
        let decision = limiter
            .check("user:1", &closed, 1)
            .await
            .expect("never Err");
        assert!(!decision.allowed, "{decision:?}");
        assert_eq!(decision.tier, Tier::FailClosed, "{decision:?}");
    }
    assert_eq!(server.script_calls().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_builder_and_its_errors_never_show_the_password() {
    let url = format!("rediss://{USER}:{PASSWORD}@127.0.0.1:6390/0");
    let builder = HybridLimiter::builder()
        .redis_url(&url)
        .tls_root_certificates("pem");
    let shown = format!("{builder:?}");
    assert!(!shown.contains(PASSWORD), "{shown}");
    assert!(shown.contains("rediss://***@127.0.0.1:6390/0"), "{shown}");

    let bad = format!("redis://{USER}:{PASSWORD}@127.0.0.1:6390/not-a-db");
    let err = HybridLimiter::builder()
        .redis_url(&bad)
        .build()
        .expect_err("a bad database number");
    assert!(matches!(err, Error::InvalidConfig { .. }), "{err}");
    let shown = format!("{err} / {err:?}");
    assert!(!shown.contains(PASSWORD), "{shown}");
}
