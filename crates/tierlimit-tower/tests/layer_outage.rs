//! The layer with Redis stopped: each policy's answer over real HTTP, with
//! the headers still present.

mod support;

use std::time::{Duration, Instant};

use support::{DEADLINE, limiter, send, serve};
use tierlimit::{Policy, Rule, RuleSet};
use tierlimit_test::RedisServer;
use tierlimit_tower::{HeaderKey, Match, RateLimitLayer};

fn set(name: &str, per_minute: u64, policy: Policy) -> RuleSet {
    RuleSet::new(name, [Rule::per_minute(per_minute).expect("valid")])
        .expect("valid")
        .with_policy(policy)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_stopped_each_policy_answers_with_headers() {
    let mut server = RedisServer::start();
    let layer = RateLimitLayer::builder(limiter(&server.url()))
        .key(HeaderKey::api_key("x-api-key").expect("a valid header"))
        .route(
            Match::any("/closed"),
            set("closed", 100, Policy::FailClosed),
            1,
        )
        .route(
            Match::any("/local"),
            set("local", 3, Policy::LocalFallback),
            1,
        )
        .route(Match::any("/open"), set("open", 1, Policy::FailOpen), 1)
        .build()
        .expect("a valid layer");
    let addr = serve(layer).await;
    let h = [("x-api-key", "k")];
    let grpc = [("x-api-key", "k"), ("content-type", "application/grpc")];

    // Healthy: Redis decides; the fail-open route's one unit is spent.
    assert_eq!(send(addr, "GET", "/closed", &h).await.status, 200);
    assert_eq!(send(addr, "GET", "/open", &h).await.status, 200);
    assert_eq!(send(addr, "GET", "/open", &h).await.status, 429);

    server.kill9();

    // Fail-closed: 503 at once (within the check's deadline, plus the HTTP
    // round trip on a loaded 2-core machine), with Retry-After and headers.
    for _ in 0..3 {
        let started = Instant::now();
        let reply = send(addr, "GET", "/closed", &h).await;
        let took = started.elapsed();
        assert_eq!(reply.status, 503, "{reply:?}");
        assert!(
            took < DEADLINE + Duration::from_millis(250),
            "took {took:?}"
        );
        assert!(
            reply.body.contains(r#""error":"limiter_unavailable""#),
            "{}",
            reply.body
        );
        assert!(reply.header("retry-after").parse::<u64>().expect("seconds") >= 1);
        assert_eq!(reply.header("x-ratelimit-remaining"), "0");
        assert_eq!(reply.header("ratelimit-policy"), r#""closed.0";q=100;w=60"#);
    }
    let grpc_closed = send(addr, "POST", "/closed", &grpc).await;
    assert_eq!(
        (grpc_closed.status, grpc_closed.header("grpc-status")),
        (200, "14")
    );

    // Local fallback: one instance's share is the whole limit, 3 a minute.
    let statuses: Vec<u16> = {
        let mut v = vec![];
        for _ in 0..4 {
            let reply = send(addr, "GET", "/local", &h).await;
            assert!(
                reply.get("ratelimit").is_some() && reply.get("x-ratelimit-limit").is_some(),
                "{reply:?}"
            );
            v.push(reply.status);
        }
        v
    };
    assert_eq!(statuses, [200, 200, 200, 429]);

    // The key Redis denied stays denied until its retry-after: the denial
    // cache answers before any policy (Redis said so; no outage changes it).
    assert_eq!(send(addr, "GET", "/open", &h).await.status, 429);
    // Fail-open: a fresh key passes three times against a limit of 1, with
    // headers that say nothing is enforced (remaining = limit).
    let fresh = [("x-api-key", "fresh")];
    for _ in 0..3 {
        let reply = send(addr, "GET", "/open", &fresh).await;
        assert_eq!(reply.status, 200, "{reply:?}");
        assert_eq!(reply.header("x-ratelimit-limit"), "1");
        assert_eq!(reply.header("x-ratelimit-remaining"), "1");
        assert!(
            reply.header("ratelimit").starts_with(r#""open.0";r=1;t=0"#),
            "{reply:?}"
        );
    }
}
