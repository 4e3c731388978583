//! A [tower](https://docs.rs/tower) layer that rate-limits HTTP and gRPC
//! services (axum, tonic, hyper: any `http::Request` body) with a shared
//! [`tierlimit::HybridLimiter`].
//!
//! ```no_run
//! use std::net::SocketAddr;
//! use std::sync::Arc;
//! use axum::{Router, routing::get};
//! use tierlimit::{HybridLimiter, Rule, RuleSet};
//! use tierlimit_tower::{ClientIp, HeaderKey, KeyExtractor, RateLimitLayer};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let limiter = Arc::new(HybridLimiter::builder().redis_url("redis://127.0.0.1:6380/").build()?);
//! let api = RuleSet::new("api", [Rule::per_second(10)?, Rule::per_hour(1000)?])?;
//! let layer = RateLimitLayer::builder(limiter)
//!     .key(HeaderKey::api_key("x-api-key")?.or(HeaderKey::user_id("x-user-id")?).or(ClientIp::peer()))
//!     .default_route(api, 1)
//!     .build()?;
//! let app = Router::new().route("/", get(|| async { "hello" })).layer(layer);
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//! // ConnectInfo gives ClientIp the peer address (the `axum` feature).
//! axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
//! # Ok(()) }
//! ```
//!
//! A runnable service with three routes is `examples/axum.rs`:
//!
//! ```sh
//! REDIS_URL=redis://127.0.0.1:6380/ cargo run -p tierlimit-tower --features axum --example axum
//! ```
//!
//! # What a request goes through
//!
//! 1. **Route** ([`Match`]): the first route whose method and path pattern
//!    match gives the rule set and cost; an exempt route, or no match and no
//!    default, passes the request on unchecked and without headers. A
//!    route given a rule set's name
//!    ([`route_named`](RateLimitLayerBuilder::route_named)) checks against
//!    the set the limiter holds under it at that moment, so a config reload
//!    reaches it; one given a [`RuleSet`](tierlimit::RuleSet) keeps it.
//! 2. **Key** ([`KeyExtractor`]): API key header, user id header, client IP
//!    ([`ClientIp`]: the peer address; from trusted proxies only, the one
//!    forwarding header they write, [`ForwardingHeader`]),
//!    a [`GlobalKey`], or the first of several ([`FirstOf`]). No
//!    key: 400 or a fallback key ([`MissingKey`]).
//! 3. **Check**: `HybridLimiter::check(key, set, cost)`.
//! 4. **Answer**:
//!
//! | outcome | HTTP | gRPC (`content-type: application/grpc*`) |
//! |---|---|---|
//! | admitted | the service's response, plus the rate-limit headers | same |
//! | denied | `429`, `Retry-After` (seconds, rounded up, at least 1), headers, `{"error":"rate_limited",…}` | HTTP 200 trailers-only, `grpc-status: 8` (`RESOURCE_EXHAUSTED`), `grpc-message`, same headers as metadata |
//! | denied by [`Policy::FailClosed`](tierlimit::Policy) (Redis unavailable) | `503` by default ([`RateLimitLayerBuilder::fail_closed_status`]), `Retry-After`, headers, `{"error":"limiter_unavailable",…}` | `grpc-status: 14` (`UNAVAILABLE`) |
//! | key missing (with [`MissingKey::Reject`]) or unusable (too long, control characters, a key header sent twice) | `400`, `{"error":"missing_key"` / `"invalid_key",…}` | `grpc-status: 3` (`INVALID_ARGUMENT`) |
//! | the route's cost above its rule set's capacity (a reload shrank a named route's set) | `500`, `{"error":"rate_limit_misconfigured",…}` | `grpc-status: 13` (`INTERNAL`) |
//!
//! The rate-limit headers are set by [`HeaderMode`]: the legacy
//! `X-RateLimit-*`, the IETF draft's `RateLimit-Policy` / `RateLimit`
//! (draft-ietf-httpapi-ratelimit-headers-10), or both.
//!
//! The layer holds the limiter in an `Arc`; to shut it down at exit (writing
//! back what was admitted locally), keep a clone of the `Arc` and call
//! `Arc::into_inner(limiter)` once the server has stopped.
//!
//! # gRPC
//!
//! gRPC services built with tonic sit behind the same layer (their requests
//! are `http::Request`s); a denial never reaches them. This crate has no
//! tonic dependency: the denial is written at the HTTP level, as tonic
//! would write a `Status` before any message.
#![warn(missing_docs, unreachable_pub, missing_debug_implementations)]

mod headers;
mod key;
mod layer;
mod route;
mod service;

pub use headers::HeaderMode;
pub use key::{
    ClientIp, FirstOf, ForwardingHeader, GlobalKey, HeaderKey, InvalidKey, KeyExtractor, KeyResult,
    PeerAddr,
};
pub use layer::{MissingKey, RateLimitLayer, RateLimitLayerBuilder};
pub use route::Match;
pub use service::{RateLimit, ResponseBody, ResponseFuture};
