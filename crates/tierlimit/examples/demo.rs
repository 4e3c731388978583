//! A burst of checks against two rule sets, printed as a table.
//!
//! Uses `REDIS_URL` when set; otherwise starts its own `redis-server` on a free
//! loopback port (and stops it at the end). Run it with
//! `cargo run -p tierlimit --example demo` (`scripts/demo` runs the failover
//! demo of the `tierlimit` command instead).

use std::time::Duration;

use tierlimit::{Algorithm, HybridLimiter, Policy, Rule, RuleSet};
use tierlimit_test::RedisServer;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Keep the server alive until the end of main when we started it.
    let (url, _server) = match std::env::var("REDIS_URL") {
        Ok(url) => (url, None),
        Err(_) => {
            let server = RedisServer::start();
            println!("started redis-server on {}", server.url());
            (server.url(), Some(server))
        }
    };
    let limiter = HybridLimiter::builder().redis_url(url).build()?;
    if !limiter.wait_closed(Duration::from_secs(5)).await {
        return Err("Redis did not answer within 5 s".into());
    }

    let api = RuleSet::new(
        "api",
        [
            Rule::per_minute(10)?,
            Rule::per_hour(100)?.with_algorithm(Algorithm::SlidingWindow)?,
        ],
    )?
    .with_policy(Policy::LocalFallback);
    let login =
        RuleSet::new(
            "login",
            [Rule::with_period(3, Duration::from_secs(10))?
                .with_algorithm(Algorithm::FixedWindow)?],
        )?
        .with_policy(Policy::FailClosed);

    println!(
        "{:>3}  {:<6} {:<8} {:<7} {:>5} {:>9} {:>12} {:>4}  tier",
        "#", "set", "key", "allowed", "limit", "remaining", "retry_after", "rule"
    );
    let checks = (0..12)
        .map(|_| (&api, "alice"))
        .chain((0..5).map(|_| (&login, "bob")));
    for (i, (set, key)) in checks.enumerate() {
        let d = limiter.check(key, set, 1).await?;
        let retry = d
            .retry_after
            .map(|r| format!("{:.3}s", r.as_secs_f64()))
            .unwrap_or_else(|| "-".into());
        println!(
            "{:>3}  {:<6} {:<8} {:<7} {:>5} {:>9} {:>12} {:>4}  {:?}",
            i + 1,
            set.name(),
            key,
            d.allowed,
            d.limit,
            d.remaining,
            retry,
            d.rule,
            d.tier
        );
    }
    Ok(())
}
