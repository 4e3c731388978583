//! Script cost: server time per check (`usec_per_call` of FCALL or EVALSHA in `INFO commandstats`, after `CONFIG RESETSTAT`) of the check for each algorithm, one rule and three, run as a Redis Functions library (FCALL, the tier's default on Redis 7) and as a script (EVALSHA, the fallback), against a minimal script of the same algorithm and an empty script's on the same server.
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
//!
//! Each case is measured three ways, one after the other in each round: the
//! tier as it runs by default (Functions: `FCALL`), the tier logged in as an
//! ACL user refused Functions (so it runs the same code by `EVALSHA`), and a
//! minimal script of the same algorithm (one read, one write with its expiry
//! per rule, all rules checked before any is written; see `MINIMAL_SCRIPTS`) sent by
//! `EVALSHA` with the same keys and arguments. The report gives FCALL ÷
//! EVALSHA and FCALL ÷ minimal, each per round then the median.

use redis::aio::MultiplexedConnection;
use tierlimit::{Algorithm, Rule, RuleSet};
use tierlimit_benches::{Harness, MINIMAL_SCRIPTS, Spread, runtime};
use tierlimit_redis::{RedisTier, RedisTierConfig, ScriptMode};
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
    let mut admin = rt.block_on(server.conn());
    // A user refused Functions: its tier runs the same code by EVALSHA.
    rt.block_on(query(
        &mut admin,
        redis::cmd("ACL")
            .arg("SETUSER")
            .arg("scripts")
            .arg("on")
            .arg(">pw")
            .arg("~*")
            .arg("&*")
            .arg("+@all")
            .arg("-function")
            .arg("-fcall")
            .arg("-fcall_ro"),
    ));
    let (functions, scripts) = {
        let _entered = rt.enter();
        let tier = |url: String| RedisTier::new(RedisTierConfig::new(url)).expect("a valid config");
        (tier(server.url()), tier(server.url_as("scripts", "pw")))
    };
    let cases: Vec<(Algorithm, usize, RuleSet)> = ALGORITHMS
        .iter()
        .flat_map(|&alg| [(alg, 1), (alg, 3)])
        .map(|(alg, rules)| (alg, rules, rule_set(alg, rules)))
        .collect();
    // Load the library and the script, so no measured call meets a reload.
    for tier in [&functions, &scripts] {
        rt.block_on(tier.check("warm", &cases[0].2, 1))
            .expect("Redis answers");
    }
    assert_eq!(functions.script_mode(), Some(ScriptMode::Functions));
    assert_eq!(scripts.script_mode(), Some(ScriptMode::Scripts));

    let load = |admin: &mut MultiplexedConnection, src: &str| -> String {
        rt.block_on(async {
            redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(src)
                .query_async(admin)
                .await
                .expect("SCRIPT LOAD failed")
        })
    };
    let empty = load(&mut admin, "return 1");
    let minimal: Vec<String> = MINIMAL_SCRIPTS
        .iter()
        .map(|src| load(&mut admin, src))
        .collect();
    let calls = keys * per_key;

    // Per case: the tier by FCALL, by EVALSHA, the minimal script.
    let mut usec: Vec<[Vec<f64>; 3]> = vec![Default::default(); cases.len()];
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
            command_stats(&mut admin, "evalsha").await
        });
        assert_eq!(n, calls as u64, "EVALSHA calls counted");
        floor.push(per_call);
        for (i, (alg, rules, set)) in cases.iter().enumerate() {
            for (way, (tier, command)) in [(&functions, "fcall"), (&scripts, "evalsha")]
                .into_iter()
                .enumerate()
            {
                let (counted, per_call) = rt.block_on(async {
                    query(&mut admin, redis::cmd("CONFIG").arg("RESETSTAT")).await;
                    for k in 0..keys {
                        let key = format!("r{round}:{command}:k{k}");
                        for _ in 0..per_key {
                            let v = tier.check(&key, set, 1).await.expect("Redis answers");
                            assert!(v.decision.allowed, "{alg:?} x{rules} denied: {v:?}");
                        }
                    }
                    command_stats(&mut admin, command).await
                });
                assert_eq!(
                    counted, calls as u64,
                    "{command} calls counted: a reload or a retry would skew usec_per_call"
                );
                usec[i][way].push(per_call);
            }
            let sha = &minimal[(alg.code() - 1) as usize];
            let (counted, per_call) = rt.block_on(async {
                query(&mut admin, redis::cmd("CONFIG").arg("RESETSTAT")).await;
                for k in 0..keys {
                    let key = format!("r{round}:minimal:k{k}");
                    let mut cmd = redis::cmd("EVALSHA");
                    cmd.arg(sha).arg(set.rules().len());
                    for r in 0..set.rules().len() {
                        cmd.arg(set.storage_key(&key, r));
                    }
                    cmd.arg("0").arg(1).arg(42);
                    // The minimal scripts read each rule as its five
                    // numbers, as tierlimit's did before stop 33.
                    for r in 0..set.rules().len() {
                        for arg in set.script_arg(r).split(':') {
                            cmd.arg(arg);
                        }
                    }
                    for _ in 0..per_key {
                        let reply: Vec<i64> = cmd
                            .query_async(&mut admin)
                            .await
                            .unwrap_or_else(|e| panic!("minimal {alg:?}: {e}"));
                        assert_eq!(reply[0], 1, "minimal {alg:?} x{rules} denied");
                    }
                }
                command_stats(&mut admin, "evalsha").await
            });
            assert_eq!(counted, calls as u64, "minimal EVALSHA calls counted");
            usec[i][2].push(per_call);
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
    let spread = |v: &[f64]| Spread::of(v).expect("at least one round");
    let ratio =
        |a: &[f64], b: &[f64]| -> Vec<f64> { a.iter().zip(b).map(|(a, b)| a / b).collect() };
    for ((alg, rules, _), [fcall, evalsha, minimal]) in cases.iter().zip(&usec) {
        let s = spread(fcall);
        let e = spread(evalsha);
        let m = spread(minimal);
        // Each round's cost over the same round's floor, EVALSHA, minimal: a
        // ratio of two things measured on the same server moments apart.
        let r = spread(&ratio(fcall, &floor_rounds));
        let per_evalsha = spread(&ratio(fcall, evalsha));
        let per_minimal = spread(&ratio(fcall, minimal));
        let evalsha_per_minimal = spread(&ratio(evalsha, minimal));
        println!(
            "script_cost/{alg:?}/{rules}: FCALL {:.2} us [{:.2}-{:.2}], EVALSHA {:.2} us [{:.2}-{:.2}], \
             minimal {:.2} us [{:.2}-{:.2}]; FCALL/EVALSHA {:.2} [{:.2}-{:.2}], \
             FCALL/minimal {:.2} [{:.2}-{:.2}], EVALSHA/minimal {:.2}; {:.1}x the empty script",
            s.median,
            s.min,
            s.max,
            e.median,
            e.min,
            e.max,
            m.median,
            m.min,
            m.max,
            per_evalsha.median,
            per_evalsha.min,
            per_evalsha.max,
            per_minimal.median,
            per_minimal.min,
            per_minimal.max,
            evalsha_per_minimal.median,
            r.median
        );
        harness.record(serde_json::json!({
            "kind": "script_cost",
            "algorithm": format!("{alg:?}"),
            "rules": rules,
            "rounds": rounds,
            "calls_per_round": calls,
            "how": "FCALL",
            "usec_per_call": { "median": s.median, "min": s.min, "max": s.max },
            "per_empty_script": { "median": r.median, "min": r.min, "max": r.max },
            "evalsha_usec_per_call": { "median": e.median, "min": e.min, "max": e.max },
            "minimal_usec_per_call": { "median": m.median, "min": m.min, "max": m.max },
            "per_evalsha": { "median": per_evalsha.median, "min": per_evalsha.min, "max": per_evalsha.max },
            "per_minimal": { "median": per_minimal.median, "min": per_minimal.min, "max": per_minimal.max },
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

/// `command`'s calls and microseconds per call since the last reset, from
/// `INFO commandstats` (per call computed from the total, for more digits).
async fn command_stats(conn: &mut MultiplexedConnection, command: &str) -> (u64, f64) {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .expect("INFO commandstats failed");
    let prefix = format!("cmdstat_{command}:");
    let line = info
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("INFO commandstats has no {command} line after the checks"));
    let field = |name: &str| -> f64 {
        line.split(',')
            .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {line}"))
    };
    let calls = field("calls");
    (calls as u64, field("usec") / calls.max(1.0))
}
