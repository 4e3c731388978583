//! The layer over real HTTP on a loopback port, against a real redis-server:
//! denials, headers in each mode, per-rule policy items, key extraction, gRPC.

mod support;

use std::net::IpAddr;
use std::sync::Arc;

use http::Method;
use support::{DEADLINE, base64, get, limiter, pk_of, send, serve};
use tierlimit::{HybridLimiter, Instances, Rule, RuleSet};
use tierlimit_test::RedisServer;
use tierlimit_tower::{
    ClientIp, ForwardingHeader, HeaderKey, HeaderMode, KeyExtractor, Match, MissingKey,
    RateLimitLayer,
};

/// A burst of 2 that refills at one a half minute: the third request is
/// denied however slowly a busy machine sends the three (at 2 per second it
/// was admitted once half a second passed between the first and third).
fn two_per_minute() -> RuleSet {
    let rule = Rule::per_minute(2)
        .and_then(|r| r.with_burst(2))
        .expect("a valid rule");
    RuleSet::new("burst", [rule]).expect("a valid rule set")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn third_request_within_the_burst_gets_429_in_both_header_modes() {
    let server = RedisServer::start();
    let limiter = limiter(&server.url());
    for (mode, key) in [(HeaderMode::Legacy, "legacy"), (HeaderMode::Draft, "draft")] {
        let layer = RateLimitLayer::builder(limiter.clone())
            .key(HeaderKey::api_key("x-api-key").expect("a valid header"))
            .default_route(two_per_minute(), 1)
            .headers(mode)
            .build()
            .expect("a valid layer");
        let addr = serve(layer).await;
        let h = [("x-api-key", key)];
        let replies = [
            get(addr, "/", &h).await,
            get(addr, "/", &h).await,
            get(addr, "/", &h).await,
        ];
        assert_eq!(
            replies.iter().map(|r| r.status).collect::<Vec<_>>(),
            [200, 200, 429],
            "{mode:?}: {replies:#?}"
        );
        let denied = &replies[2];
        let retry: u64 = denied.header("retry-after").parse().expect("whole seconds");
        assert!(retry >= 1, "{denied:?}");
        assert_eq!(denied.header("content-type"), "application/json");
        assert!(
            denied.body.contains(r#""error":"rate_limited""#),
            "{}",
            denied.body
        );
        assert!(
            denied.body.contains(r#""policy":"burst""#),
            "{}",
            denied.body
        );
        match mode {
            HeaderMode::Legacy => {
                for (reply, remaining) in replies.iter().zip(["1", "0", "0"]) {
                    assert_eq!(reply.header("x-ratelimit-limit"), "2");
                    assert_eq!(reply.header("x-ratelimit-remaining"), remaining);
                    let reset: u64 = reply.header("x-ratelimit-reset").parse().expect("seconds");
                    assert!((1..=60).contains(&reset), "{reply:?}");
                    assert!(
                        reply.get("ratelimit").is_none() && reply.get("ratelimit-policy").is_none()
                    );
                }
            }
            _ => {
                for (reply, remaining) in replies.iter().zip(["1", "0", "0"]) {
                    assert_eq!(reply.header("ratelimit-policy"), r#""burst.0";q=2;w=60"#);
                    let field = reply.header("ratelimit");
                    assert!(
                        field.starts_with(&format!(r#""burst.0";r={remaining};t="#)),
                        "{field}"
                    );
                    assert!(reply.get("x-ratelimit-limit").is_none());
                }
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_rule_set_has_one_policy_item_per_rule() {
    let server = RedisServer::start();
    let set = RuleSet::new(
        "multi",
        [
            Rule::per_second(5).expect("valid"),
            Rule::per_minute(3).expect("valid"),
            Rule::per_hour(100).expect("valid"),
        ],
    )
    .expect("a valid rule set");
    let layer = RateLimitLayer::builder(limiter(&server.url()))
        .key(HeaderKey::user_id("x-user-id").expect("a valid header"))
        .default_route(set, 1)
        .headers(HeaderMode::Both)
        .build()
        .expect("a valid layer");
    let addr = serve(layer).await;
    let h = [("x-user-id", "u1")];
    // Every rule has its item in RateLimit, with its own remaining; the
    // per-minute rule binds, so the legacy headers describe it.
    for n in 1..=3u64 {
        let reply = get(addr, "/", &h).await;
        assert_eq!(reply.status, 200, "{reply:?}");
        assert_eq!(
            reply.header("ratelimit-policy"),
            r#""multi.0";q=5;w=1, "multi.1";q=3;w=60, "multi.2";q=100;w=3600"#
        );
        let remaining = remaining_per_item(reply.header("ratelimit"));
        // The per-second rule refills between requests: at least 5 - n left.
        assert!(remaining[0] >= 5 - n && remaining[0] <= 4, "{remaining:?}");
        assert_eq!(&remaining[1..], &[3 - n, 100 - n], "{reply:?}");
        assert_eq!(reply.header("x-ratelimit-limit"), "3");
        assert_eq!(reply.header("x-ratelimit-remaining"), (3 - n).to_string());
    }
    // Denied: nothing was consumed, each rule as it stands.
    let denied = get(addr, "/", &h).await;
    assert_eq!(denied.status, 429);
    let remaining = remaining_per_item(denied.header("ratelimit"));
    assert_eq!(&remaining[1..], &[0, 97], "{denied:?}");
    let retry: u64 = denied.header("retry-after").parse().expect("seconds");
    assert!((1..=60).contains(&retry), "{denied:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_pick_rule_sets_and_exempt_paths_pass_unchecked() {
    let server = RedisServer::start();
    let one =
        |name: &str| RuleSet::new(name, [Rule::per_minute(1).expect("valid")]).expect("valid");
    let layer = RateLimitLayer::builder(limiter(&server.url()))
        .key(HeaderKey::api_key("x-api-key").expect("a valid header"))
        .route(Match::method(Method::POST, "/login"), one("login"), 1)
        .exempt(Match::any("/health"))
        .route(Match::any("/api/*"), one("api"), 1)
        .build()
        .expect("a valid layer");
    let addr = serve(layer).await;
    let h = [("x-api-key", "k")];
    for _ in 0..3 {
        let health = get(addr, "/health", &h).await;
        assert_eq!(health.status, 200);
        assert!(
            health.get("ratelimit").is_none(),
            "exempt: no headers {health:?}"
        );
        // No route and no default: unchecked too.
        assert_eq!(get(addr, "/elsewhere", &h).await.status, 200);
        // GET /login matches no route (the route is POST only).
        assert_eq!(get(addr, "/login", &h).await.status, 200);
    }
    assert_eq!(send(addr, "POST", "/login", &h).await.status, 200);
    assert_eq!(send(addr, "POST", "/login", &h).await.status, 429);
    // Another rule set: its own budget.
    let api = get(addr, "/api/v1/items?x=1", &h).await;
    assert_eq!(api.status, 200);
    assert!(api.header("ratelimit-policy").starts_with(r#""api.0""#));
    assert_eq!(get(addr, "/api", &h).await.status, 429);
}

/// `n` per minute (burst `n`) under `name`.
fn per_minute(name: &str, n: u64) -> RuleSet {
    let rule = Rule::per_minute(n)
        .and_then(|r| r.with_burst(n))
        .expect("a valid rule");
    RuleSet::new(name, [rule]).expect("a valid rule set")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_route_follows_reloads_and_keeps_its_last_set_when_the_name_goes() {
    let server = RedisServer::start();
    let limiter = Arc::new(
        HybridLimiter::builder()
            .redis_url(server.url())
            .instances(Instances::Fixed(1))
            .deadline(DEADLINE)
            .rule_sets([per_minute("named", 2)])
            .build()
            .expect("a valid limiter config"),
    );
    let layer = RateLimitLayer::builder(limiter.clone())
        .key(HeaderKey::api_key("x-api-key").expect("a valid header"))
        .route_named(Match::any("/named"), "named", 1)
        .route_named(Match::any("/heavy"), "named", 2)
        // By value: a reload does not reach it.
        .route(Match::any("/fixed"), per_minute("named", 2), 1)
        .build()
        .expect("a valid layer");
    let addr = serve(layer).await;
    let statuses = |path: &'static str, key: &'static str, n: usize| async move {
        let mut replies = Vec::new();
        for _ in 0..n {
            replies.push(get(addr, path, &[("x-api-key", key)]).await);
        }
        replies
    };
    let codes = |replies: &[support::Reply]| replies.iter().map(|r| r.status).collect::<Vec<_>>();

    let before = statuses("/named", "a", 3).await;
    assert_eq!(codes(&before), [200, 200, 429], "{before:#?}");
    assert_eq!(before[0].header("x-ratelimit-limit"), "2");

    // Raised to 5: the route checks against it at once, and what "a" used
    // under the old limit counts against the new one (3 left, not 5).
    limiter
        .replace_rule_sets([per_minute("named", 5)])
        .expect("a valid reload");
    let after = statuses("/named", "a", 4).await;
    assert_eq!(codes(&after), [200, 200, 200, 429], "{after:#?}");
    assert_eq!(after[0].header("x-ratelimit-limit"), "5");
    assert_eq!(after[0].header("ratelimit-policy"), r#""named.0";q=5;w=60"#);
    // The by-value route still has its own set of 2.
    let fixed = statuses("/fixed", "b", 3).await;
    assert_eq!(codes(&fixed), [200, 200, 429], "{fixed:#?}");
    assert_eq!(fixed[0].header("x-ratelimit-limit"), "2");

    // A reload without the name: the route keeps limiting by the set it
    // last used (5 per minute), neither failing nor letting requests through.
    limiter
        .replace_rule_sets([per_minute("other", 1)])
        .expect("a valid reload");
    let dropped = statuses("/named", "a", 1).await;
    assert_eq!(codes(&dropped), [429], "{dropped:#?}");
    assert_eq!(dropped[0].header("x-ratelimit-limit"), "5");
    let fresh = statuses("/named", "c", 6).await;
    assert_eq!(codes(&fresh), [200, 200, 200, 200, 200, 429], "{fresh:#?}");

    // Back with a capacity below /heavy's cost of 2: no request could pass
    // there, which is the server's fault, not the client's.
    limiter
        .replace_rule_sets([per_minute("named", 1)])
        .expect("a valid reload");
    let heavy = statuses("/heavy", "d", 1).await;
    assert_eq!(codes(&heavy), [500], "{heavy:#?}");
    assert!(
        heavy[0]
            .body
            .contains(r#""error":"rate_limit_misconfigured""#),
        "{}",
        heavy[0].body
    );
    // Over gRPC: INTERNAL (13), in grpc-status as gRPC errors travel.
    let grpc = send(
        addr,
        "POST",
        "/heavy",
        &[("x-api-key", "e"), ("content-type", "application/grpc")],
    )
    .await;
    assert_eq!(
        (grpc.status, grpc.header("grpc-status")),
        (200, "13"),
        "{grpc:?}"
    );
    assert_eq!(codes(&statuses("/named", "d", 2).await), [200, 429]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_key_beats_user_id_beats_ip() {
    let server = RedisServer::start();
    let layer = RateLimitLayer::builder(limiter(&server.url()))
        .key(
            HeaderKey::api_key("x-api-key")
                .expect("a valid header")
                .or(HeaderKey::user_id("x-user-id").expect("a valid header"))
                .or(ClientIp::peer()),
        )
        .default_route(
            RuleSet::new("keys", [Rule::per_minute(100).expect("valid")]).expect("valid"),
            1,
        )
        .partition_key(true)
        .build()
        .expect("a valid layer");
    let addr = serve(layer).await;
    let both = get(addr, "/", &[("x-api-key", "k1"), ("x-user-id", "u1")]).await;
    assert_eq!(pk_of(&both), base64(b"api:k1"));
    let user = get(addr, "/", &[("x-user-id", "u1")]).await;
    assert_eq!(pk_of(&user), base64(b"user:u1"));
    let ip = get(addr, "/", &[]).await;
    assert_eq!(pk_of(&ip), base64(b"ip:127.0.0.1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forwarded_header_counts_only_from_a_trusted_proxy() {
    let server = RedisServer::start();
    let limiter = limiter(&server.url());
    let set = RuleSet::new("fwd", [Rule::per_minute(100).expect("valid")]).expect("valid");
    let build = |key: ClientIp| {
        RateLimitLayer::builder(limiter.clone())
            .key(key)
            .default_route(set.clone(), 1)
            .partition_key(true)
            .build()
            .expect("a valid layer")
    };
    let spoofed = [
        ("x-forwarded-for", "203.0.113.5"),
        ("forwarded", "for=198.51.100.1"),
    ];
    // Not trusting anyone, or trusting some other proxy: the peer is the key.
    let other: IpAddr = "192.0.2.1".parse().expect("an address");
    for key in [ClientIp::peer(), ClientIp::behind_proxies([other])] {
        let addr = serve(build(key)).await;
        assert_eq!(
            pk_of(&get(addr, "/", &spoofed).await),
            base64(b"ip:127.0.0.1")
        );
    }
    // The peer (127.0.0.1) is a trusted proxy: the forwarded client is the key.
    let loopback: IpAddr = "127.0.0.1".parse().expect("an address");
    let addr = serve(build(ClientIp::behind_proxies([loopback]))).await;
    let xff = get(addr, "/", &[("x-forwarded-for", "1.1.1.1, 203.0.113.5")]).await;
    assert_eq!(pk_of(&xff), base64(b"ip:203.0.113.5"));
    // Behind proxies that write X-Forwarded-For, a client's own Forwarded
    // is not read: it named any address it liked, a fresh key per request.
    let fwd = get(addr, "/", &spoofed).await;
    assert_eq!(pk_of(&fwd), base64(b"ip:203.0.113.5"));
    let alone = get(addr, "/", &[("forwarded", "for=198.51.100.1")]).await;
    assert_eq!(pk_of(&alone), base64(b"ip:127.0.0.1"));
    // Behind proxies that write Forwarded, only that one is read.
    let addr = serve(build(
        ClientIp::behind_proxies([loopback]).reading(ForwardingHeader::Forwarded),
    ))
    .await;
    let fwd = get(addr, "/", &spoofed).await;
    assert_eq!(pk_of(&fwd), base64(b"ip:198.51.100.1"));
    let alone = get(addr, "/", &[("x-forwarded-for", "203.0.113.5")]).await;
    assert_eq!(pk_of(&alone), base64(b"ip:127.0.0.1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_key_gets_the_configured_answer_and_a_huge_key_is_400() {
    let server = RedisServer::start();
    let limiter = limiter(&server.url());
    let set = RuleSet::new("missing", [Rule::per_minute(100).expect("valid")]).expect("valid");
    let reject = serve(
        RateLimitLayer::builder(limiter.clone())
            .key(HeaderKey::api_key("x-api-key").expect("a valid header"))
            .default_route(set.clone(), 1)
            .build()
            .expect("a valid layer"),
    )
    .await;
    let missing = get(reject, "/", &[]).await;
    assert_eq!(missing.status, 400, "{missing:?}");
    assert!(
        missing.body.contains(r#""error":"missing_key""#),
        "{}",
        missing.body
    );
    let huge = "k".repeat(10 * 1024);
    let too_long = get(reject, "/", &[("x-api-key", &huge)]).await;
    assert_eq!(too_long.status, 400, "{too_long:?}");
    assert!(
        too_long.body.contains(r#""error":"invalid_key""#),
        "{}",
        too_long.body
    );
    let tab = get(reject, "/", &[("x-api-key", "a\tb")]).await;
    assert_eq!(tab.status, 400, "{tab:?}");

    let fallback = serve(
        RateLimitLayer::builder(limiter.clone())
            .key(HeaderKey::api_key("x-api-key").expect("a valid header"))
            .default_route(set, 1)
            .missing_key(MissingKey::Fallback("anonymous".into()))
            .partition_key(true)
            .build()
            .expect("a valid layer"),
    )
    .await;
    let anonymous = get(fallback, "/", &[]).await;
    assert_eq!(anonymous.status, 200);
    assert_eq!(pk_of(&anonymous), base64(b"anonymous"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_denial_is_resource_exhausted_with_the_headers_as_metadata() {
    let server = RedisServer::start();
    let set = RuleSet::new("grpc", [Rule::per_minute(1).expect("valid")]).expect("valid");
    let addr = serve(
        RateLimitLayer::builder(limiter(&server.url()))
            .key(HeaderKey::api_key("x-api-key").expect("a valid header"))
            .default_route(set, 1)
            .build()
            .expect("a valid layer"),
    )
    .await;
    let h = [
        ("x-api-key", "g"),
        ("content-type", "application/grpc+proto"),
        ("te", "trailers"),
    ];
    let first = send(addr, "POST", "/pkg.Service/Method", &h).await;
    assert_eq!(first.status, 200);
    assert!(
        first.get("grpc-status").is_none(),
        "admitted: the service answers {first:?}"
    );
    let denied = send(addr, "POST", "/pkg.Service/Method", &h).await;
    assert_eq!(
        denied.status, 200,
        "gRPC errors travel in grpc-status {denied:?}"
    );
    assert_eq!(denied.header("content-type"), "application/grpc");
    assert_eq!(denied.header("grpc-status"), "8");
    assert!(
        denied
            .header("grpc-message")
            .starts_with("rate limit exceeded")
    );
    assert!(
        denied
            .header("retry-after")
            .parse::<u64>()
            .expect("seconds")
            >= 1
    );
    assert_eq!(denied.header("x-ratelimit-remaining"), "0");
    assert_eq!(denied.header("ratelimit-policy"), r#""grpc.0";q=1;w=60"#);
    assert!(denied.body.is_empty(), "trailers-only: no body {denied:?}");

    let bad = send(
        addr,
        "POST",
        "/pkg.Service/Method",
        &[("content-type", "application/grpc")],
    )
    .await;
    assert_eq!(
        (bad.status, bad.header("grpc-status")),
        (200, "3"),
        "{bad:?}"
    );
}

/// The `r` of each item of a `RateLimit` field, in order, checking the items
/// are named `"multi.<i>"` in order.
fn remaining_per_item(field: &str) -> Vec<u64> {
    field
        .split(", ")
        .enumerate()
        .map(|(i, item)| {
            let rest = item
                .strip_prefix(&format!(r#""multi.{i}";r="#))
                .unwrap_or_else(|| panic!("item {i} of {field}"));
            rest.split(';')
                .next()
                .and_then(|r| r.parse().ok())
                .unwrap_or_else(|| panic!("r of item {i} of {field}"))
        })
        .collect()
}
