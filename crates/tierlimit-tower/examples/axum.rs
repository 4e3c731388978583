//! An axum service behind the rate-limit layer: three routes with different
//! rule sets and policies.
//!
//! ```sh
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run -p tierlimit-tower --features axum --example axum
//! curl -i -H 'x-api-key: demo' http://127.0.0.1:3000/api/items
//! ```
//!
//! * `POST /login`: 5 a minute per client address, `FailClosed` (no guessing
//!   while Redis is down: 503).
//! * `/api/*`: 10 a second and 1,000 an hour per API key (else user id,
//!   else IP), `LocalFallback` (each instance enforces its share in an outage).
//! * `/search`: 2 a second shared by everyone, cost 1, `FailOpen`.
//! * `/health`: exempt (never checked, no headers).
//!
//! `LISTEN` sets the address (default `127.0.0.1:3000`). Ctrl-C stops the
//! server and shuts the limiter down, writing back what it admitted locally.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::{get, post};
use http::Method;
use tierlimit::{HybridLimiter, Instances, Policy, Rule, RuleSet};
use tierlimit_tower::{ClientIp, GlobalKey, HeaderKey, KeyExtractor, Match, RateLimitLayer};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url =
        std::env::var("REDIS_URL").map_err(|_| "set REDIS_URL, e.g. redis://127.0.0.1:6379/")?;
    let listen = std::env::var("LISTEN").unwrap_or_else(|_| "127.0.0.1:3000".into());
    let limiter = Arc::new(
        HybridLimiter::builder()
            .redis_url(url)
            // One process: its local share is the whole limit.
            .instances(Instances::Learned { assume: Some(1) })
            .build()?,
    );

    let login = RuleSet::new("login", [Rule::per_minute(5)?])?.with_policy(Policy::FailClosed);
    let api = RuleSet::new("api", [Rule::per_second(10)?, Rule::per_hour(1000)?])?
        .with_policy(Policy::LocalFallback);
    let search = RuleSet::new("search", [Rule::per_second(2)?])?.with_policy(Policy::FailOpen);

    // The key depends on the route, one layer per key scheme. Logins count
    // per client address, never per API key: a guesser would send a fresh
    // key with each attempt. Everyone shares /search's budget.
    let per_address = RateLimitLayer::builder(limiter.clone())
        .key(ClientIp::peer())
        .route(Match::method(Method::POST, "/login"), login, 1)
        .build()?;
    let per_client = RateLimitLayer::builder(limiter.clone())
        .key(
            HeaderKey::api_key("x-api-key")?
                .or(HeaderKey::user_id("x-user-id")?)
                .or(ClientIp::peer()),
        )
        .exempt(Match::any("/health"))
        .route(Match::any("/api/*"), api, 1)
        .build()?;
    let global = RateLimitLayer::builder(limiter.clone())
        .key(GlobalKey::new("everyone")?)
        .route(Match::any("/search"), search, 1)
        .build()?;

    let app = Router::new()
        .route("/login", post(|| async { "logged in\n" }))
        .route("/api/{*rest}", get(|| async { "items\n" }))
        .route("/search", get(|| async { "results\n" }))
        .route("/health", get(|| async { "ok\n" }))
        .layer(per_client)
        .layer(per_address)
        .layer(global);

    let listener = tokio::net::TcpListener::bind(&listen).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await?;

    // The server is gone and with it the layers' clones of the limiter.
    if let Some(limiter) = Arc::into_inner(limiter) {
        let report = limiter.shutdown(Duration::from_secs(5)).await;
        println!("shut down: {report:?}");
    }
    Ok(())
}
