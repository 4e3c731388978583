//! Server time per check of tierlimit's check, run from its Redis Functions
//! library (`FCALL`, one check per call), against the peer script of the same
//! algorithm that issue 11 names (`EVALSHA`, sent as its own project sends
//! it), both driven by `redis-benchmark` against one private `redis-server`:
//! the target "server µs per check ÷ the best peer script of the same
//! algorithm ≤ 1.0 each".
//!
//! ```sh
//! benches/peer-scripts.sh /work/peer-scripts     # once: fetch the peers' scripts
//! TIERLIMIT_PEER_SCRIPTS=/work/peer-scripts \
//!     cargo run --release -p tierlimit-benches --bin peer-scripts            # 7 pairs
//! TIERLIMIT_PEER_SCRIPTS=/work/peer-scripts \
//!     cargo run --release -p tierlimit-benches --bin peer-scripts -- --quick # writes nothing
//! ```
//!
//! # The peers' scripts
//!
//! They are other projects' code, so they are not in this repository: the
//! bench reads them at run time from the directory `$TIERLIMIT_PEER_SCRIPTS`,
//! one file each, named as below. `benches/peer-scripts.sh DIR` fetches them
//! from these commits (cutting the three that live inside a source file out
//! of it, as the string's value):
//!
//! | file | algorithm | project | path | commit |
//! |---|---|---|---|---|
//! | `redis_rate_gcra.lua` | GCRA | `go-redis/redis_rate` v10 | `lua.go`, the raw string of `var allowN` | `8eadf45ee4d9d7a53189c2a968ead40521a76322` |
//! | `scg_token_bucket.lua` | token bucket | `spring-cloud/spring-cloud-gateway` | `spring-cloud-gateway-server-webflux/src/main/resources/META-INF/scripts/request_rate_limiter.lua` (whole file) | `5227205c743d6d2b743bedf2f58cc76c65ca7408` |
//! | `upstash_sliding_window.lua` | sliding window counter | `upstash/ratelimit-js` 1.1.2 | `src/lua-scripts/single.ts`, the template literal `slidingWindowLimitScript` | `5b5448a5f0bae809cd624a7c639771a8b2e227cb` |
//! | `rlflexible_fixed_window.lua` | fixed window | `animir/node-rate-limiter-flexible` 11.1.0 | `lib/RateLimiterRedis.js`, the template literal `incrTtlLuaScript` (its `\`-continued lines joined, as JavaScript does) | `3c9c826248cd470960740c89e25a1277dc98fbf4` |
//!
//! When the variable is unset, or a file is missing or refused by the server,
//! that algorithm is reported `not measured: <reason>` (on stdout and in the
//! JSON) and the bench still exits 0, so `benches/run.sh` runs without them.
//!
//! # What is measured
//!
//! One rule per algorithm: 1,000 per second (burst 1,000 for GCRA and the
//! token bucket), which every peer can say natively (`redis_rate.PerSecond(1000)`;
//! Spring Cloud Gateway's `replenishRate = burstCapacity = 1000`; upstash's
//! `slidingWindow(1000, "1 s")`; rate-limiter-flexible's `points: 1000,
//! duration: 1`). Each peer's call carries its project's own keys and
//! arguments (see [`Peer::args`]): its key prefix, its argument order, the
//! server's clock where the project uses it and the client's where it sends
//! one (upstash: `now` in ms, read once per sample). tierlimit's side is
//! `FCALL tierlimit_check_<id> 1 tl:{<key>}:peer:<rule> 0 1 42 <the rule's
//! numbers joined by ':'>`, exactly what `RedisTier::check` sends for one check in
//! Functions mode, with the library loaded by a `RedisTier`.
//!
//! A sample is `redis-benchmark -c 50 -r 10000 -P 1|16` of one side: 30,000
//! (P1) or 100,000 (P16) calls on random user keys `s<sample>:<12 digits>`
//! from a space of 10,000, fresh for every sample (every key lives at most
//! 3 s). All are admitted: the busiest key sees well under 1,000 calls per
//! second, and after each sample one more call on one of its keys must be
//! admitted. Server time is `usec ÷ calls` of the side's command (`evalsha`
//! or `fcall`) in `INFO commandstats`, after `CONFIG RESETSTAT`; a sample
//! with a failed or rejected call stops the bench. Each pair is tierlimit,
//! then the peer, on the same server; pairs go round all algorithms and both
//! pipeline depths in turn. The report is the median of the per-pair ratios
//! tierlimit ÷ peer with their spread, and each side's median µs per call.
//! The server is pinned to core 0 and `redis-benchmark` to core 1 when
//! `taskset` is present and there are two cores.
//!
//! `redis-benchmark` draws every `__rand_int__` of a command on its own, so
//! a peer call with two keys of one user (Spring Cloud Gateway's tokens and
//! timestamp, upstash's current and previous window) names two random users.
//! The server does the same work either way (each key read and written as
//! for one user, all on the admitted path); only the peer's arithmetic sees
//! another user's number.
//!
//! # As the tier sends checks under load
//!
//! One call per check is the design the peers share; under concurrency the
//! tier packs checks into calls of its batch function instead (at c = 50 in
//! the load bench, about 16 checks a call). So each pair also measures a
//! third side, between the two above: `FCALL tierlimit_check_batch_<id>` of
//! `BATCH` checks (each on its own random user key, as the tier's batch
//! protocol carries them), with as many checks per sample as the other
//! sides, its server µs per call ÷ `BATCH` being µs per check. It runs
//! unpipelined only (`-P 1`, in the P1 rows): the tier keeps at most a few
//! calls in flight per connection, and 16-deep pipelines of 16-check calls
//! (12,800 checks in flight) measure nothing it does. The report gives
//! tierlimit's µs per check both ways and both ratios; the target is judged
//! for each.
//!
//! # On the caller's clock
//!
//! Two peers read no server clock: upstash takes the caller's time, and
//! rate-limiter-flexible keeps none (a window is a key's TTL). tierlimit's
//! check reads Redis' `TIME` unless the limiter is built with
//! `client_time(true)`, which sends the caller's µs instead (`ARGV[1]`). For
//! those two peers each pair also times tierlimit's check that way, one
//! check per call at both depths: the comparison with the same source of
//! time on both sides. The target is judged on the server's clock, the
//! limiter's default. (What the clock itself costs is too small beside
//! the spread of these timings to show here; `benches/render.py` gives it
//! in instructions.)
//!
//! Output: stdout, and `<out>/peer_scripts.jsonl` (`<out>` is
//! `$TIERLIMIT_BENCH_OUT` or `target/tierlimit-benches`), one line per
//! algorithm and pipeline depth (`"kind": "peer_script"`, with `"measured":
//! false` and a `"reason"` when not measured), which `benches/render.py`
//! turns into the section "Server µs per check against peers' scripts".

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use serde_json::json;
use tierlimit::{Algorithm, Rule, RuleSet};
use tierlimit_benches::{
    Harness, Spread, fcall_args, library_function, pin_server_and_load, redis_tool, runtime,
};
use tierlimit_redis::{RedisTier, RedisTierConfig, ScriptMode};
use tierlimit_test::RedisServer;

/// The variable naming the directory that holds the peers' scripts.
const DIR_VAR: &str = "TIERLIMIT_PEER_SCRIPTS";
/// Concurrency of every sample, as in issue 11.
const CLIENTS: usize = 50;
/// The random key space.
const KEYS: u64 = 10_000;
/// The rule: `LIMIT` per second (and a burst of `LIMIT`).
const LIMIT: u64 = 1_000;
const PIPELINES: [usize; 2] = [1, 16];
/// The target: tierlimit's server µs per check ÷ the peer's, at most this.
const TARGET: f64 = 1.0;
/// Checks per call on the batched side: what the load bench's batches hold
/// at c = 50.
const BATCH: usize = 16;

/// One peer script and how its project calls it.
struct Peer {
    /// Its file in `$TIERLIMIT_PEER_SCRIPTS`.
    file: &'static str,
    /// Short name in the report.
    name: &'static str,
    repo: &'static str,
    version: &'static str,
    path: &'static str,
    commit: &'static str,
    algorithm: Algorithm,
    /// `<numkeys> KEYS... ARGV...` of one check of user `key` (a pattern
    /// holding `__rand_int__`) at client time `now_ms`, as the project
    /// builds them for the rule of this bench.
    args: fn(key: &str, now_ms: u64) -> Vec<String>,
    /// Whether the first element of the script's reply means admitted.
    admitted: fn(first: i64) -> bool,
    /// Whether the script reads the server's clock (`TIME`). When it does
    /// not (it takes the caller's time, or keeps no time at all), the bench
    /// also times tierlimit's check on the caller's clock, as
    /// `client_time(true)` sends it: the same source of time on both sides.
    server_time: bool,
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

const PEERS: [Peer; 4] = [
    Peer {
        file: "redis_rate_gcra.lua",
        name: "redis_rate allowN",
        repo: "go-redis/redis_rate",
        version: "v10",
        path: "lua.go (var allowN)",
        commit: "8eadf45ee4d9d7a53189c2a968ead40521a76322",
        algorithm: Algorithm::Gcra,
        // rate.go AllowN: key "rate:" + key; burst, rate, period in seconds
        // (a float64, which go-redis writes as "1"), cost.
        args: |key, _| {
            let key = format!("rate:{key}");
            strings(&["1", &key, "1000", "1000", "1", "1"])
        },
        // The reply starts with the units admitted (0 when denied).
        admitted: |first| first == 1,
        server_time: true,
    },
    Peer {
        file: "scg_token_bucket.lua",
        name: "Spring Cloud Gateway request_rate_limiter.lua",
        repo: "spring-cloud/spring-cloud-gateway",
        version: "main, Aug 2026",
        path: "spring-cloud-gateway-server-webflux/src/main/resources/META-INF/scripts/request_rate_limiter.lua",
        commit: "5227205c743d6d2b743bedf2f58cc76c65ca7408",
        algorithm: Algorithm::TokenBucket,
        // RedisRateLimiter.getKeys(id, routeId): request_rate_limiter.{<route>.<id>}.tokens
        // and .timestamp; ARGV replenishRate, burstCapacity, "" (the script
        // then reads the server's TIME), requestedTokens.
        args: |key, _| {
            let tokens = format!("request_rate_limiter.{{peer.{key}}}.tokens");
            let stamp = format!("request_rate_limiter.{{peer.{key}}}.timestamp");
            strings(&["2", &tokens, &stamp, "1000", "1000", "", "1"])
        },
        admitted: |first| first == 1,
        server_time: true,
    },
    Peer {
        file: "upstash_sliding_window.lua",
        name: "upstash slidingWindow",
        repo: "upstash/ratelimit-js",
        version: "1.1.2",
        path: "src/lua-scripts/single.ts (slidingWindowLimitScript)",
        commit: "5b5448a5f0bae809cd624a7c639771a8b2e227cb",
        algorithm: Algorithm::SlidingWindow,
        // single.ts slidingWindow: keys <prefix>:<id>:<window> of now and of
        // the window before, and "" for the dynamic limit (off by default);
        // ARGV tokens, now in ms (the client's), window in ms, incrementBy.
        args: |key, now_ms| {
            let window = now_ms / 1000;
            let current = format!("@upstash/ratelimit:{key}:{window}");
            let previous = format!("@upstash/ratelimit:{key}:{}", window - 1);
            let now = now_ms.to_string();
            strings(&["3", &current, &previous, "", "1000", &now, "1000", "1"])
        },
        // The reply starts with the tokens remaining, -1 when denied.
        admitted: |first| first >= 0,
        server_time: false,
    },
    Peer {
        file: "rlflexible_fixed_window.lua",
        name: "rate-limiter-flexible RateLimiterRedis",
        repo: "animir/node-rate-limiter-flexible",
        version: "11.1.0",
        path: "lib/RateLimiterRedis.js (incrTtlLuaScript)",
        commit: "3c9c826248cd470960740c89e25a1277dc98fbf4",
        algorithm: Algorithm::FixedWindow,
        // RateLimiterRedis._upsert: key "rlflx:" + key; ARGV points consumed,
        // duration in s, then the limiter's points and duration.
        args: |key, _| {
            let key = format!("rlflx:{key}");
            strings(&["1", &key, "1", "1", "1000", "1"])
        },
        // The reply starts with the points consumed in the window.
        admitted: |first| (1..=1000).contains(&first),
        server_time: false,
    },
];

/// What one side of one sample measured.
#[derive(Clone, Copy)]
struct Sample {
    usec_per_call: f64,
    rps: f64,
}

/// One pair's samples at one pipeline depth.
#[derive(Clone, Copy)]
struct Pair {
    /// tierlimit, one check per call, on the server's clock.
    ours: Sample,
    /// tierlimit batched, per check (unpipelined rows only).
    batched: Option<Sample>,
    /// tierlimit, one check per call, on the caller's clock (peers that
    /// read no server clock only).
    caller_clock: Option<Sample>,
    peer: Sample,
}

/// A peer ready to run: its script's SHA1 and tierlimit's rule.
struct Ready<'a> {
    peer: &'a Peer,
    sha: String,
    set: RuleSet,
    /// Per pipeline depth, pair by pair.
    samples: Vec<Vec<Pair>>,
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let (pairs, calls) = if quick {
        (2, [2_000, 4_000])
    } else {
        (7, [30_000, 100_000])
    };
    let mut harness = Harness::for_binary("peer_scripts", quick);

    // Which peers can run, and why not the others.
    let mut sources = Vec::new();
    let dir = std::env::var_os(DIR_VAR).map(PathBuf::from);
    for peer in &PEERS {
        match read_peer(dir.as_deref(), peer) {
            Ok(source) => sources.push((peer, source)),
            Err(reason) => not_measured(&mut harness, peer, &reason),
        }
    }
    if sources.is_empty() {
        return;
    }
    if let Err(reason) = redis_tool("redis-benchmark") {
        for (peer, _) in &sources {
            not_measured(&mut harness, peer, &reason);
        }
        return;
    }

    let server = RedisServer::start();
    let pinned = pin_server_and_load(server.pid());
    let rt = runtime();
    let mut conn = redis::Client::open(server.url())
        .and_then(|c| c.get_connection())
        .expect("a connection to the bench's redis-server");

    // Load tierlimit's library the way the tier does, and find its check.
    let tier = {
        let _entered = rt.enter();
        RedisTier::new(RedisTierConfig::new(server.url())).expect("a valid tier config")
    };
    let warm = RuleSet::new("peer", [Rule::per_second(LIMIT).expect("a valid rule")])
        .expect("a valid rule set");
    rt.block_on(tier.check("warm", &warm, 1))
        .expect("the tier's first check");
    assert_eq!(
        tier.script_mode(),
        Some(ScriptMode::Functions),
        "the tier did not load its Functions library (Redis 7 or later is needed)"
    );
    let function = library_function("tierlimit_check_");
    let batch_function = library_function("tierlimit_check_batch_");

    let mut ready = Vec::new();
    for (peer, source) in sources {
        let loaded: redis::RedisResult<String> = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(&source)
            .query(&mut conn);
        match loaded {
            Ok(sha) => {
                let set = RuleSet::new(
                    "peer",
                    [Rule::per_second(LIMIT)
                        .and_then(|r| r.with_algorithm(peer.algorithm))
                        .expect("a valid rule")],
                )
                .expect("a valid rule set");
                ready.push(Ready {
                    peer,
                    sha,
                    set,
                    samples: vec![Vec::new(); PIPELINES.len()],
                });
            }
            Err(e) => not_measured(
                &mut harness,
                peer,
                &format!("the server refused {} (SCRIPT LOAD: {e})", peer.file),
            ),
        }
    }

    let started = Instant::now();
    let mut sample_id = 0u64;
    for pair in 0..pairs {
        for r in ready.iter_mut() {
            for (p, &pipeline) in PIPELINES.iter().enumerate() {
                let n = calls[p];
                sample_id += 1;
                let key = format!("s{sample_id}:__rand_int__");
                let ours = fcall_args(&function, &r.set, &key, 0);
                let a = side(&server, &mut conn, "fcall", &ours, pipeline, n);
                probe_tierlimit(&mut conn, &ours, &key);
                let caller_clock = (!r.peer.server_time).then(|| {
                    sample_id += 1;
                    let key = format!("s{sample_id}:__rand_int__");
                    let args = fcall_args(&function, &r.set, &key, unix_micros());
                    let sample = side(&server, &mut conn, "fcall", &args, pipeline, n);
                    probe_tierlimit(&mut conn, &args, &key);
                    sample
                });
                let per_check = (pipeline == 1).then(|| {
                    sample_id += 1;
                    let key = format!("s{sample_id}:__rand_int__");
                    let batched = batch_args(&batch_function, &r.set, &key);
                    let calls = side(&server, &mut conn, "fcall", &batched, 1, n / BATCH as u64);
                    probe_batch(&mut conn, &batched, &key);
                    Sample {
                        usec_per_call: calls.usec_per_call / BATCH as f64,
                        rps: calls.rps * BATCH as f64,
                    }
                });
                sample_id += 1;
                let key = format!("s{sample_id}:__rand_int__");
                let theirs = peer_args(r, &key);
                let b = side(&server, &mut conn, "evalsha", &theirs, pipeline, n);
                probe_peer(&mut conn, r.peer, &r.sha, &key);
                eprintln!(
                    "pair {}/{pairs} {:?} P{pipeline}: tierlimit {:.2} µs/call ({:.0}/s), batched {:?} µs/check, \
                     caller's clock {:?} µs/call, {} {:.2} µs/call ({:.0}/s)",
                    pair + 1,
                    r.peer.algorithm,
                    a.usec_per_call,
                    a.rps,
                    per_check.map(|m| m.usec_per_call),
                    caller_clock.map(|m| m.usec_per_call),
                    r.peer.name,
                    b.usec_per_call,
                    b.rps
                );
                r.samples[p].push(Pair {
                    ours: a,
                    batched: per_check,
                    caller_clock,
                    peer: b,
                });
            }
        }
    }
    let seconds = started.elapsed().as_secs();

    for r in &ready {
        for (p, &pipeline) in PIPELINES.iter().enumerate() {
            let s = &r.samples[p];
            let ours: Vec<f64> = s.iter().map(|x| x.ours.usec_per_call).collect();
            let theirs: Vec<f64> = s.iter().map(|x| x.peer.usec_per_call).collect();
            let ratios: Vec<f64> = s
                .iter()
                .map(|x| x.ours.usec_per_call / x.peer.usec_per_call)
                .collect();
            // An optional side's µs per check and its per-pair ratios to the peer.
            let optional = |side: fn(&Pair) -> Option<Sample>| -> (Vec<f64>, Vec<f64>) {
                s.iter()
                    .filter_map(|x| {
                        side(x).map(|m| (m.usec_per_call, m.usec_per_call / x.peer.usec_per_call))
                    })
                    .unzip()
            };
            let (batched, batched_ratios) = optional(|x| x.batched);
            let (clocked, clocked_ratios) = optional(|x| x.caller_clock);
            let spread = |v: &[f64]| Spread::of(v).expect("at least one pair");
            let (o, t, ratio) = (spread(&ours), spread(&theirs), spread(&ratios));
            let (m, batched_ratio) = (Spread::of(&batched), Spread::of(&batched_ratios));
            let (c, clocked_ratio) = (Spread::of(&clocked), Spread::of(&clocked_ratios));
            let rps_a = spread(&s.iter().map(|x| x.ours.rps).collect::<Vec<_>>()).median;
            let rps_b = spread(&s.iter().map(|x| x.peer.rps).collect::<Vec<_>>()).median;
            let verdict = |r: Spread| if r.median <= TARGET { "met" } else { "MISSED" };
            let batched_text = match (m, batched_ratio) {
                (Some(m), Some(r)) => format!(
                    "batched {:.2} µs/check [{:.2}-{:.2}], ratio {:.3} [{:.3}-{:.3}] ({})",
                    m.median,
                    m.min,
                    m.max,
                    r.median,
                    r.min,
                    r.max,
                    verdict(r)
                ),
                _ => "batched: not run at this depth".to_string(),
            };
            let clocked_text = match (c, clocked_ratio) {
                (Some(c), Some(r)) => format!(
                    "; on the caller's clock {:.2} µs/call [{:.2}-{:.2}], ratio {:.3} [{:.3}-{:.3}]",
                    c.median, c.min, c.max, r.median, r.min, r.max
                ),
                _ => String::new(),
            };
            println!(
                "peer-scripts/{:?}/P{pipeline}: tierlimit FCALL {:.2} µs/call [{:.2}-{:.2}] vs {} EVALSHA {:.2} µs/call [{:.2}-{:.2}]: \
                 ratio {:.3} [{:.3}-{:.3}] over {} pairs (target <= {TARGET:.2}: {}); {batched_text}{clocked_text}",
                r.peer.algorithm,
                o.median,
                o.min,
                o.max,
                r.peer.name,
                t.median,
                t.min,
                t.max,
                ratio.median,
                ratio.min,
                ratio.max,
                s.len(),
                verdict(ratio),
            );
            harness.record(json!({
                "kind": "peer_script",
                "measured": true,
                "algorithm": format!("{:?}", r.peer.algorithm),
                "peer": peer_json(r.peer),
                "rule": format!("{LIMIT} per second (burst {LIMIT})"),
                "pipeline": pipeline,
                "clients": CLIENTS,
                "keys": KEYS,
                "calls_per_sample": calls[p],
                "pairs": s.len(),
                "target_max": TARGET,
                "tierlimit_usec_per_call": spread_json(o),
                "peer_usec_per_call": spread_json(t),
                "ratio": spread_json(ratio),
                "ratios": ratios,
                "batch": BATCH,
                "tierlimit_batched_usec_per_check": m.map(spread_json),
                "batched_ratio": batched_ratio.map(spread_json),
                "batched_ratios": batched_ratios,
                "tierlimit_caller_clock_usec_per_call": c.map(spread_json),
                "caller_clock_ratio": clocked_ratio.map(spread_json),
                "caller_clock_ratios": clocked_ratios,
                "tierlimit_usec_samples": ours,
                "peer_usec_samples": theirs,
                "tierlimit_rps": rps_a,
                "peer_rps": rps_b,
                "pinned": pinned,
                "seconds": seconds,
            }));
        }
    }
    eprintln!(
        "peer-scripts: {seconds} s; server {}",
        if pinned {
            "pinned to core 0, redis-benchmark to core 1"
        } else {
            "not pinned (no taskset or one core)"
        }
    );
}

/// The source of `peer`'s script, or why it cannot run.
fn read_peer(dir: Option<&Path>, peer: &Peer) -> Result<String, String> {
    let Some(dir) = dir else {
        return Err(format!("{DIR_VAR} is not set"));
    };
    if !dir.is_dir() {
        return Err(format!("{DIR_VAR}={} is not a directory", dir.display()));
    }
    let path = dir.join(peer.file);
    match fs::read_to_string(&path) {
        Ok(source) if !source.trim().is_empty() => Ok(source),
        Ok(_) => Err(format!("{} is empty", path.display())),
        Err(e) => Err(format!("{} cannot be read ({e})", path.display())),
    }
}

/// Reports `peer` not measured, saying why and what to put where.
fn not_measured(harness: &mut Harness, peer: &Peer, reason: &str) {
    let fix = format!(
        "set {DIR_VAR} to a directory outside the repository holding {} ({} {}, {} at commit {}); \
         `benches/peer-scripts.sh DIR` fetches all four",
        peer.file, peer.repo, peer.version, peer.path, peer.commit
    );
    println!(
        "peer-scripts/{:?}: not measured: {reason}; {fix}",
        peer.algorithm
    );
    harness.record(json!({
        "kind": "peer_script",
        "measured": false,
        "algorithm": format!("{:?}", peer.algorithm),
        "peer": peer_json(peer),
        "reason": reason,
        "fix": fix,
        "target_max": TARGET,
    }));
}

fn peer_json(peer: &Peer) -> serde_json::Value {
    json!({
        "name": peer.name,
        "file": peer.file,
        "repo": peer.repo,
        "version": peer.version,
        "path": peer.path,
        "commit": peer.commit,
    })
}

fn spread_json(s: Spread) -> serde_json::Value {
    json!({ "median": s.median, "min": s.min, "max": s.max })
}

/// `FCALL <batch function> 16 <16 storage keys> 16 1 42 0 <the set's rules>
/// then per check 1`: what the tier sends for a batch of `BATCH` checks of
/// one rule set at server time, cost 1 (see lua/check_batch.lua).
/// Every key holds `__rand_int__`, which redis-benchmark draws anew for each
/// occurrence: `BATCH` random users.
fn batch_args(function: &str, set: &RuleSet, key: &str) -> Vec<String> {
    let mut args = vec!["FCALL".to_string(), function.to_string(), BATCH.to_string()];
    args.extend((0..BATCH).map(|_| set.storage_key(key, 0)));
    args.extend([
        BATCH.to_string(),
        "1".into(),
        "42".into(),
        "0".into(),
        set.rules().len().to_string(),
    ]);
    args.push(set.script_arg(0).to_string());
    args.extend((0..BATCH).map(|_| "1".to_string()));
    args
}

/// The caller's clock: µs since the Unix epoch.
fn unix_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("a clock after 1970")
        .as_micros() as u64
}

fn peer_args(r: &Ready<'_>, key: &str) -> Vec<String> {
    let mut args = vec!["EVALSHA".to_string(), r.sha.clone()];
    args.extend((r.peer.args)(key, unix_micros() / 1_000));
    args
}

/// `args` with `__rand_int__` replaced by one key of the space, as
/// redis-benchmark writes it (12 digits).
fn one_call(args: &[String]) -> redis::Cmd {
    let k = format!("{:012}", fastrand::u64(..KEYS));
    let mut cmd = redis::cmd(&args[0]);
    for a in &args[1..] {
        cmd.arg(a.replace("__rand_int__", &k));
    }
    cmd
}

/// The first integer of a script's reply.
fn first(reply: &redis::Value) -> Option<i64> {
    match reply {
        redis::Value::Array(items) => match items.first()? {
            redis::Value::Int(i) => Some(*i),
            _ => None,
        },
        _ => None,
    }
}

/// One more check on a key the sample just used must still be admitted.
fn probe_tierlimit(conn: &mut redis::Connection, args: &[String], key: &str) {
    let reply: redis::Value = one_call(args)
        .query(conn)
        .unwrap_or_else(|e| panic!("FCALL of tierlimit's check on {key}: {e}"));
    // The server time, then a retry-after of 0 when admitted.
    let retry = match &reply {
        redis::Value::Array(items) => items.get(1),
        _ => None,
    };
    assert_eq!(
        retry,
        Some(&redis::Value::Int(0)),
        "tierlimit denied a check after a sample: {reply:?}"
    );
}

/// One more batch on one key the sample used must have every check admitted
/// (its `BATCH` checks fit the rule's burst).
fn probe_batch(conn: &mut redis::Connection, args: &[String], key: &str) {
    let reply: redis::Value = one_call(args)
        .query(conn)
        .unwrap_or_else(|e| panic!("FCALL of tierlimit's batch on {key}: {e}"));
    // One flat array: the server time, then each check's three integers
    // (one rule) in a row, a retry-after of 0 first when admitted.
    let admitted = match &reply {
        redis::Value::Array(items) => items
            .get(1..)
            .unwrap_or_default()
            .chunks(3)
            .filter(|c| matches!(c.first(), Some(redis::Value::Int(0))))
            .count(),
        _ => 0,
    };
    assert_eq!(
        admitted, BATCH,
        "tierlimit's batch denied a check after a sample: {reply:?}"
    );
}

fn probe_peer(conn: &mut redis::Connection, peer: &Peer, sha: &str, key: &str) {
    let mut args = vec!["EVALSHA".to_string(), sha.to_string()];
    args.extend((peer.args)(key, unix_micros() / 1_000));
    let reply: redis::Value = one_call(&args)
        .query(conn)
        .unwrap_or_else(|e| panic!("EVALSHA of {} on {key}: {e}", peer.file));
    let admitted = first(&reply).is_some_and(peer.admitted);
    assert!(
        admitted,
        "{} denied a call after a sample (the bench measures the admitted path): {reply:?}",
        peer.name
    );
}

/// One sample of one side: `redis-benchmark -c 50 -n <n> -r 10000 -P <p>
/// <args>`, and the server's µs per call of `command` over it.
fn side(
    server: &RedisServer,
    conn: &mut redis::Connection,
    command: &str,
    args: &[String],
    pipeline: usize,
    n: u64,
) -> Sample {
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(conn)
        .expect("CONFIG RESETSTAT");
    let out = Command::new("redis-benchmark")
        .args(["-h", "127.0.0.1", "-p", &server.port().to_string()])
        .args(["-c", &CLIENTS.to_string(), "-n", &n.to_string()])
        .args(["-r", &KEYS.to_string(), "-P", &pipeline.to_string()])
        .arg("--csv")
        .args(args)
        .output()
        .expect("cannot run redis-benchmark");
    let text = String::from_utf8_lossy(&out.stdout);
    let rps = rps(&text).unwrap_or_else(|| {
        panic!(
            "redis-benchmark printed no result: {text} {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(conn)
        .expect("INFO commandstats");
    let prefix = format!("cmdstat_{command}:");
    let line = info
        .lines()
        .find_map(|l| l.trim().strip_prefix(prefix.as_str()))
        .unwrap_or_else(|| panic!("no {command} in INFO commandstats: {info}"));
    let field = |name: &str| -> u64 {
        line.split(',')
            .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let (calls, usec) = (field("calls"), field("usec"));
    let failed = field("failed_calls") + field("rejected_calls");
    assert_eq!(
        failed, 0,
        "{command}: {failed} calls failed or were rejected: {line}"
    );
    assert!(calls >= n, "{command}: {calls} calls counted, {n} sent");
    Sample {
        usec_per_call: usec as f64 / calls as f64,
        rps,
    }
}

/// Requests per second from redis-benchmark's `--csv` output: the second
/// field of the last line (the test name, quoted, may hold commas, so the
/// fields are counted from the right).
fn rps(text: &str) -> Option<f64> {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let header: Vec<&str> = lines.next()?.split(',').collect();
    let row = lines.next()?;
    let fields: Vec<&str> = row.rsplitn(header.len(), ',').collect();
    // rsplitn yields right to left: "rps" is the second from the left.
    fields
        .get(header.len().checked_sub(2)?)?
        .trim_matches('"')
        .parse()
        .ok()
}
