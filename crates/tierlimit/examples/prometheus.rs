//! Prometheus metrics from a program that uses tierlimit: install the
//! `metrics-exporter-prometheus` recorder *before* building the limiter, check
//! a few keys, and render what a scrape of `/metrics` would return.
//!
//! The limiter describes every metric (help text and unit) when it is built,
//! and takes its decision counters from the recorder installed at its first
//! checks, which is why the recorder goes first. Serve `handle.render()` from
//! your HTTP server's `/metrics` route (the `tierlimit` command line serves
//! it with `tierlimit demo --metrics 127.0.0.1:9000`), and call
//! `handle.run_upkeep()` every few seconds.
//!
//! Uses `REDIS_URL` when set; otherwise starts its own `redis-server` on a
//! free loopback port. Run it with
//! `cargo run -p tierlimit --example prometheus`.

use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use tierlimit::{HybridLimiter, Rule, RuleSet};
use tierlimit_test::RedisServer;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // 1. The recorder, before any limiter. Buckets make the Redis latency a
    //    Prometheus histogram, so quantiles aggregate across instances.
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full("tierlimit_redis_call_seconds".into()),
            &[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1],
        )?
        .install_recorder()?;

    let (url, _server) = match std::env::var("REDIS_URL") {
        Ok(url) => (url, None),
        Err(_) => {
            let server = RedisServer::start();
            (server.url(), Some(server))
        }
    };

    // 2. The limiter: its series carry `limiter="api-1"`.
    let limiter = HybridLimiter::builder()
        .redis_url(url)
        .name("api-1")
        .prune_every(Duration::from_millis(100))
        .build()?;
    if !limiter.wait_closed(Duration::from_secs(5)).await {
        return Err("Redis did not answer within 5 s".into());
    }
    let api = RuleSet::new("api", [Rule::per_second(5)?])?;
    for i in 0..20 {
        limiter.check(&format!("user:{}", i % 2), &api, 1).await?;
    }
    // The gauges (ledger, local keys, instances) are published by the
    // limiter's pruning round.
    tokio::time::sleep(Duration::from_millis(250)).await;

    // 3. What a scrape returns.
    handle.run_upkeep();
    print!("{}", handle.render());
    limiter.shutdown(Duration::from_secs(1)).await;
    Ok(())
}
