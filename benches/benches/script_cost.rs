//! Script cost: server time per check (`usec_per_call` of EVALSHA in `INFO commandstats`, after `CONFIG RESETSTAT`) of the check script for each algorithm, with one rule and with three rules of that algorithm.
//!
//! Each measurement is 2,000 `RedisTier::check` calls on a private
//! `redis-server`: 200 fresh keys, 10 checks each, all admitted (one rule: 1,000
//! per minute; three rules: 100 per second, 500 per minute, 1,000 per hour, the
//! sliding log's limit being at most 1,000). The number is Redis' own time in
//! the command, not a ratio: it does not depend on this process. Rounds go
//! through every case in turn, and each case's median over the rounds is
//! reported with its spread.

use redis::aio::MultiplexedConnection;
use tierlimit::{Algorithm, Rule, RuleSet};
use tierlimit_benches::{Harness, Spread, runtime};
use tierlimit_redis::{RedisTier, RedisTierConfig};
use tierlimit_test::RedisServer;

const ALGORITHMS: [Algorithm; 5] = [
    Algorithm::Gcra,
    Algorithm::TokenBucket,
    Algorithm::SlidingLog,
    Algorithm::SlidingWindow,
    Algorithm::FixedWindow,
];

fn main() {
    let mut harness = Harness::from_args("script_cost");
    let (rounds, keys, per_key) = if harness.quick() {
        (1, 5, 2)
    } else {
        (5, 200, 10)
    };
    let server = RedisServer::start();
    let rt = runtime();
    let tier = {
        let _entered = rt.enter();
        RedisTier::new(RedisTierConfig::new(server.url())).expect("a valid config")
    };
    let cases: Vec<(Algorithm, usize, RuleSet)> = ALGORITHMS
        .iter()
        .flat_map(|&alg| [(alg, 1), (alg, 3)])
        .map(|(alg, rules)| (alg, rules, rule_set(alg, rules)))
        .collect();
    let mut admin = rt.block_on(server.conn());
    // Load the script, so no measured call meets NOSCRIPT.
    rt.block_on(tier.check("warm", &cases[0].2, 1))
        .expect("Redis answers");

    let mut usec: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    for round in 0..rounds {
        for (i, (alg, rules, set)) in cases.iter().enumerate() {
            let (calls, per_call) = rt.block_on(async {
                query(&mut admin, redis::cmd("CONFIG").arg("RESETSTAT")).await;
                for k in 0..keys {
                    let key = format!("r{round}:k{k}");
                    for _ in 0..per_key {
                        let v = tier.check(&key, set, 1).await.expect("Redis answers");
                        assert!(v.decision.allowed, "{alg:?} x{rules} denied: {v:?}");
                    }
                }
                evalsha_stats(&mut admin).await
            });
            let expected = (keys * per_key) as u64;
            assert_eq!(
                calls, expected,
                "EVALSHA calls counted: a reload or a retry would skew usec_per_call"
            );
            usec[i].push(per_call);
        }
    }
    for ((alg, rules, _), samples) in cases.iter().zip(&usec) {
        let s = Spread::of(samples).expect("at least one round");
        println!(
            "script_cost/{alg:?}/{rules}: {:.2} us per call [{:.2}-{:.2}] over {rounds} rounds",
            s.median, s.min, s.max
        );
        harness.record(serde_json::json!({
            "kind": "script_cost",
            "algorithm": format!("{alg:?}"),
            "rules": rules,
            "rounds": rounds,
            "calls_per_round": keys * per_key,
            "usec_per_call": { "median": s.median, "min": s.min, "max": s.max },
        }));
    }
}

fn rule_set(alg: Algorithm, rules: usize) -> RuleSet {
    let with =
        |r: tierlimit::Result<Rule>| r.and_then(|r| r.with_algorithm(alg)).expect("a valid rule");
    let set: Vec<Rule> = if rules == 1 {
        vec![with(Rule::per_minute(1_000))]
    } else {
        vec![
            with(Rule::per_second(100)),
            with(Rule::per_minute(500)),
            with(Rule::per_hour(1_000)),
        ]
    };
    let name = format!("cost-{}-{rules}", alg.code());
    RuleSet::new(name, set).expect("a valid rule set")
}

async fn query(conn: &mut MultiplexedConnection, cmd: &redis::Cmd) {
    let () = cmd
        .query_async(conn)
        .await
        .unwrap_or_else(|e| panic!("{cmd:?} failed: {e}"));
}

/// EVALSHA's calls and microseconds per call since the last reset, from
/// `INFO commandstats` (per call computed from the total, for more digits).
async fn evalsha_stats(conn: &mut MultiplexedConnection) -> (u64, f64) {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .expect("INFO commandstats failed");
    let line = info
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:"))
        .expect("INFO commandstats has an evalsha line after the checks");
    let field = |name: &str| -> f64 {
        line.split(',')
            .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {line}"))
    };
    let calls = field("calls");
    (calls as u64, field("usec") / calls.max(1.0))
}
