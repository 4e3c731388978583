//! Script cost: server time per check (`usec_per_call` of EVALSHA in `INFO commandstats`, after `CONFIG RESETSTAT`) of the check script for each algorithm, one rule and three, against an empty script's on the same server.
//!
//! Each measurement is 2,000 `RedisTier::check` calls on a private
//! `redis-server`: 200 fresh keys, 10 checks each, all admitted (one rule: 1,000
//! per minute; three rules: 100 per second, 500 per minute, 1,000 per hour, the
//! sliding log's limit being at most 1,000). The number is Redis' own time in
//! the command, so it does not depend on this process; to make it comparable
//! across machines each round also measures an empty script (`return 1`, the
//! floor of any EVALSHA) on the same server, and the report divides by it.
//! Rounds go through every case in turn, and each case's median over the
//! rounds is reported with its spread.

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

    let empty: String = rt.block_on(async {
        redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg("return 1")
            .query_async(&mut admin)
            .await
            .expect("SCRIPT LOAD failed")
    });
    let calls = keys * per_key;

    let mut usec: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    let mut floor = Vec::new();
    for round in 0..rounds {
        let (n, per_call) = rt.block_on(async {
            query(&mut admin, redis::cmd("CONFIG").arg("RESETSTAT")).await;
            for _ in 0..calls {
                let one: i64 = redis::cmd("EVALSHA")
                    .arg(&empty)
                    .arg(0)
                    .query_async(&mut admin)
                    .await
                    .expect("EVALSHA of the empty script failed");
                assert_eq!(one, 1);
            }
            evalsha_stats(&mut admin).await
        });
        assert_eq!(n, calls as u64, "EVALSHA calls counted");
        floor.push(per_call);
        for (i, (alg, rules, set)) in cases.iter().enumerate() {
            let (counted, per_call) = rt.block_on(async {
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
            assert_eq!(
                counted, calls as u64,
                "EVALSHA calls counted: a reload or a retry would skew usec_per_call"
            );
            usec[i].push(per_call);
        }
    }
    let floor_rounds = floor;
    let floor = Spread::of(&floor_rounds).expect("at least one round");
    println!(
        "script_cost/empty: {:.2} us per call [{:.2}-{:.2}] over {rounds} rounds",
        floor.median, floor.min, floor.max
    );
    harness.record(serde_json::json!({
        "kind": "script_floor",
        "script": "return 1",
        "rounds": rounds,
        "calls_per_round": calls,
        "usec_per_call": { "median": floor.median, "min": floor.min, "max": floor.max },
    }));
    for ((alg, rules, _), samples) in cases.iter().zip(&usec) {
        let s = Spread::of(samples).expect("at least one round");
        // Each round's cost over the same round's floor: a ratio of two things
        // measured on the same server moments apart.
        let per_floor: Vec<f64> = samples
            .iter()
            .zip(&floor_rounds)
            .map(|(u, f)| u / f)
            .collect();
        let r = Spread::of(&per_floor).expect("at least one round");
        println!(
            "script_cost/{alg:?}/{rules}: {:.2} us per call [{:.2}-{:.2}] over {rounds} rounds, {:.1}x the empty script [{:.1}-{:.1}]",
            s.median, s.min, s.max, r.median, r.min, r.max
        );
        harness.record(serde_json::json!({
            "kind": "script_cost",
            "algorithm": format!("{alg:?}"),
            "rules": rules,
            "rounds": rounds,
            "calls_per_round": calls,
            "usec_per_call": { "median": s.median, "min": s.min, "max": s.max },
            "per_empty_script": { "median": r.median, "min": r.min, "max": r.max },
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
