//! Where a check's server time goes: the batch and the single check script,
//! measured whole and with one part taken away at a time (cumulatively), on
//! one private `redis-server`.
//!
//! ```sh
//! cargo run --release -p tierlimit-benches --bin script-parts            # 7 rounds
//! cargo run --release -p tierlimit-benches --bin script-parts -- --quick # 3 rounds
//! ```
//!
//! Each variant is the shipped Lua with one more part removed by a textual
//! edit of its source (see `variants`), so the difference between two
//! adjacent rows is what that part costs. Every call is a batch of
//! `BATCH` GCRA checks (1000/s, burst 1000, the load bench's rule) on fresh
//! keys, server time; each call's own server time (`SLOWLOG`, with every
//! command logged) ÷ checks is the µs per check. Variants are interleaved
//! call by call; the table holds the median over all calls. The variants after "no TAT string" are not tierlimit's
//! decision any more: they are floors (a minimal GET + SET PX per check, the
//! loop alone, an empty script).
//!
//! Output: the section "Where a check's server time goes" of `BENCHMARKS.md`,
//! on stdout and in `<out>/script_parts.md` (`<out>` is `$TIERLIMIT_BENCH_OUT`
//! or `target/tierlimit-benches`), which `benches/render.py` puts in.

use redis::Commands as _;
use tierlimit_test::RedisServer;

/// Checks per batch call (the load bench's batches at c = 50 hold 10-30).
const BATCH: usize = 100;
/// Calls per variant and round.
const CALLS: usize = 100;

const COMMON: &str = include_str!("../../../crates/tierlimit-redis/lua/common.lua");
const ALGORITHMS: [&str; 5] = [
    include_str!("../../../crates/tierlimit-redis/lua/gcra.lua"),
    include_str!("../../../crates/tierlimit-redis/lua/token_bucket.lua"),
    include_str!("../../../crates/tierlimit-redis/lua/sliding_log.lua"),
    include_str!("../../../crates/tierlimit-redis/lua/sliding_window.lua"),
    include_str!("../../../crates/tierlimit-redis/lua/fixed_window.lua"),
];
const DECIDE: &str = include_str!("../../../crates/tierlimit-redis/lua/decide.lua");
const BATCH_MAIN: &str = include_str!("../../../crates/tierlimit-redis/lua/check_batch.lua");
const CHECK_MAIN: &str = include_str!("../../../crates/tierlimit-redis/lua/check.lua");

/// A GCRA check written minimally as a script of its own (check.lua's KEYS
/// and ARGV): one GET, one SET PX.
const MINIMAL_ONE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local key = KEYS[1]
local tat = tonumber(redis.call('GET', key)) or now
if tat < now then tat = now end
tat = tat + 1000
local rel = tat - now
if rel <= 1000000 then
  redis.call('SET', key, string.format('%d', tat), 'PX', string.format('%d', math.ceil(rel / 1000)))
  return { 1, 0, 0, now, math.floor((1000000 - rel) / 1000), rel }
end
return { 0, 0, rel - 1000000, now, 0, rel }
";

/// A GCRA check written minimally in the batch script's loop (same KEYS and
/// ARGV): one GET, one SET PX per check, the reply the batch script gives
/// (the server time, then each check's three integers, in one flat array).
const MINIMAL_LOOP: &str = r"
local n = tonumber(ARGV[1])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local out = { now }
for j = 1, n do
  local key = KEYS[j]
  local tat = tonumber(redis.call('GET', key)) or now
  if tat < now then tat = now end
  tat = tat + 1000
  local rel = tat - now
  local o = 1 + 3 * (j - 1)
  if rel <= 1000000 then
    redis.call('SET', key, string.format('%d', tat), 'PX', string.format('%d', math.ceil(rel / 1000)))
    out[o + 1], out[o + 2], out[o + 3] = 0, math.floor((1000000 - rel) / 1000), rel
  else
    out[o + 1], out[o + 2], out[o + 3] = rel - 1000000, 0, rel
  end
end
return out
";

/// The same loop and reply without the two `redis.call`s.
const EMPTY_LOOP: &str = r"
local n = tonumber(ARGV[1])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local out = { now }
for j = 1, n do
  local key = KEYS[j]
  local rel = 1000
  local o = 1 + 3 * (j - 1)
  out[o + 1], out[o + 2], out[o + 3] = 0, math.floor((1000000 - rel) / 1000), rel
end
return out
";

/// `from` replaced by `to` in `src`, which must contain it.
fn edit(src: &str, from: &str, to: &str) -> String {
    assert!(
        src.contains(from),
        "the variant's edit no longer applies: {from:?}"
    );
    src.replace(from, to)
}

/// (what the row has removed, source), cumulative.
fn variants() -> Vec<(&'static str, String)> {
    let joined = |common: &str, gcra: &str, decide: &str, main: &str| {
        let mut s = String::from(common);
        s.push_str(gcra);
        for alg in &ALGORITHMS[1..] {
            s.push_str(alg);
        }
        s.push_str(decide);
        s.push_str(main);
        s
    };
    let full = joined(COMMON, ALGORITHMS[0], DECIDE, BATCH_MAIN);
    // 1. Argument checks: every int_arg is a bare tonumber.
    let common1 = edit(
        COMMON,
        "local function int_arg(script, name, s, lo, hi)\n",
        "local function int_arg(script, name, s, lo, hi)\n  do return tonumber(s) end\n",
    );
    let no_checks = joined(&common1, ALGORITHMS[0], DECIDE, BATCH_MAIN);
    // 2. The batch's one pcall (two per check before stop 32: one around
    // the request, one around each rule's read).
    let main2 = edit(BATCH_MAIN, "pcall(run)", "true, run()");
    let no_pcall = joined(&common1, ALGORITHMS[0], DECIDE, &main2);
    // 3. The "<TAT>@<limit>" string: store the integer TAT only.
    let gcra3 = edit(
        ALGORITHMS[0],
        "  if rel > whole then\n    value = format('%d%s@%d', now + whole, sub(format('%.17f', rel - whole), 2), limit)\n  else\n    value = format('%d@%d', now + whole, limit)\n  end\n",
        "  value = format('%d', now + whole)\n",
    );
    let no_string = joined(&common1, &gcra3, DECIDE, &main2);
    // 4. The four other algorithms' definitions (re-created on every call).
    let mut gcra_only = String::from(&common1);
    gcra_only.push_str(&gcra3);
    for name in [
        "token_bucket",
        "sliding_log",
        "sliding_window",
        "fixed_window",
    ] {
        gcra_only.push_str(&format!(
            "local function {name}_check() end\nlocal function {name}_commit() end\n"
        ));
    }
    gcra_only.push_str(DECIDE);
    gcra_only.push_str(&main2);
    vec![
        ("shipped batch script", full),
        ("- argument checks (int_arg = tonumber)", no_checks),
        ("- the pcall (one per batch)", no_pcall),
        ("- TAT string (integer TAT, no '@limit')", no_string),
        ("- the other four algorithms' definitions", gcra_only),
        ("minimal GCRA loop (GET + SET PX)", MINIMAL_LOOP.to_string()),
        (
            "loop and reply only (no redis.call)",
            EMPTY_LOOP.to_string(),
        ),
        ("`return 1` with the same arguments", "return 1".to_string()),
    ]
}

/// Durations in µs of the `EVALSHA` and `FCALL` calls the slow log holds, by
/// script hash or function name; empties it.
fn drain_slowlog(conn: &mut redis::Connection, shas: &[(String, f64)], into: &mut [Vec<f64>]) {
    let entries: Vec<redis::Value> = redis::cmd("SLOWLOG")
        .arg("GET")
        .arg(-1)
        .query(conn)
        .expect("SLOWLOG GET");
    let _: () = redis::cmd("SLOWLOG")
        .arg("RESET")
        .query(conn)
        .expect("SLOWLOG RESET");
    for entry in entries {
        let redis::Value::Array(fields) = entry else {
            continue;
        };
        let (Some(redis::Value::Int(us)), Some(redis::Value::Array(args))) =
            (fields.get(2), fields.get(3))
        else {
            continue;
        };
        let Some(redis::Value::BulkString(sha)) = args.get(1) else {
            continue;
        };
        if let Some(v) = shas.iter().position(|s| s.0.as_bytes() == sha.as_slice()) {
            into[v].push(*us as f64 / shas[v].1);
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let rounds = if quick { 3 } else { 7 };
    let server = RedisServer::start();
    let client = server.client();
    let mut conn = client.get_connection().expect("a connection");
    let mut variants = variants();
    let batch_variants = variants.len();
    let mut single = String::from(COMMON);
    for alg in ALGORITHMS {
        single.push_str(alg);
    }
    single.push_str(DECIDE);
    single.push_str(CHECK_MAIN);
    variants.push(("shipped check script, 1 check per call", single));
    variants.push(("minimal GCRA script, 1 check per call", MINIMAL_ONE.into()));
    variants.push((
        "`return 1`, 1 check per call",
        "return 1 -- one check per call".into(),
    ));
    let scripts = variants.len();
    let mut shas = Vec::new();
    for (name, src) in &variants {
        let sha: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(src)
            .query(&mut conn)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let checks = if shas.len() < batch_variants {
            BATCH
        } else {
            1
        };
        shas.push((sha, checks as f64));
    }
    // The same single check and minimal script as Redis Functions (FCALL):
    // loaded once, so a call runs only the registered function, not the
    // definitions of the whole file. The check is the shipped library
    // (`library_source`, memos of checked arguments included), called as the
    // tier calls it; a copy of it, renamed, has its argument checks cut (the
    // batch rows' first cut), to say what they still cost a function call.
    // Told apart in the slow log by name.
    let shipped = tierlimit_redis::library_source();
    let id = shipped
        .lines()
        .next()
        .and_then(|line| line.strip_prefix("#!lua name=tierlimit_"))
        .expect("the library's first line names it");
    let lean = edit(
        shipped,
        "local function int_arg(script, name, s, lo, hi)\n",
        "local function int_arg(script, name, s, lo, hi)\n  do return tonumber(s) end\n",
    )
    .replace(id, "lean");
    let minimal = format!(
        "#!lua name=parts\nredis.register_function('parts_minimal', function(keys, args)\n\
         local KEYS, ARGV = keys, args\n{MINIMAL_ONE}\nend)\n"
    );
    for library in [shipped, &lean, &minimal] {
        let _: String = redis::cmd("FUNCTION")
            .arg("LOAD")
            .arg("REPLACE")
            .arg(library)
            .query(&mut conn)
            .expect("FUNCTION LOAD");
    }
    let (check_fn, batch_fn) = (
        format!("tierlimit_check_{id}"),
        format!("tierlimit_check_batch_{id}"),
    );
    for (name, function) in [
        (
            "shipped check as a function (FCALL), 1 check per call",
            check_fn.as_str(),
        ),
        (
            "- argument checks (int_arg = tonumber), as a function",
            "tierlimit_check_lean",
        ),
        (
            "minimal GCRA as a function (FCALL), 1 check per call",
            "parts_minimal",
        ),
    ] {
        variants.push((name, String::new()));
        shas.push((function.to_string(), 1.0));
    }
    // The shipped batch as the tier sends it on Redis 7, in the batch phase.
    let batch_function = variants.len();
    variants.push((
        "shipped batch as a function (FCALL), per check of a batch",
        String::new(),
    ));
    shas.push((batch_fn, BATCH as f64));
    // Every command goes to the slow log with its own server time.
    for (k, v) in [
        ("slowlog-log-slower-than", "0"),
        ("slowlog-max-len", "100000"),
    ] {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg(k)
            .arg(v)
            .query(&mut conn)
            .expect("CONFIG SET");
    }
    let mut per_check: Vec<Vec<f64>> = vec![Vec::new(); variants.len()];
    let mut serial = 0u64;
    for _ in 0..rounds {
        let _: () = redis::cmd("SLOWLOG")
            .arg("RESET")
            .query(&mut conn)
            .expect("SLOWLOG RESET");
        // Variants interleaved call by call, so noise from the machine falls
        // on all of them alike.
        for _ in 0..CALLS {
            let singles = shas.iter().enumerate().take(batch_function);
            for (v, (sha, _)) in singles.skip(batch_variants) {
                serial += 1;
                let mut cmd = redis::cmd(if v < scripts { "EVALSHA" } else { "FCALL" });
                cmd.arg(sha).arg(1);
                cmd.arg(format!("tl:{{k:{serial:012}}}:parts:g1000000"));
                cmd.arg("0").arg(1).arg(42);
                cmd.arg("1:1000:1000000:1000:0");
                let _: redis::Value = cmd.query(&mut conn).expect("EVALSHA");
            }
        }
        drain_slowlog(&mut conn, &shas, &mut per_check);
        // The batches in a phase of their own: a small call right after a
        // batch would pay for collecting the batch's garbage.
        for _ in 0..CALLS {
            let batches = shas[..batch_variants].iter().enumerate();
            for (v, (sha, _)) in batches.chain([(batch_function, &shas[batch_function])]) {
                let mut cmd = redis::cmd(if v < batch_variants {
                    "EVALSHA"
                } else {
                    "FCALL"
                });
                cmd.arg(sha).arg(BATCH);
                for _ in 0..BATCH {
                    serial += 1;
                    cmd.arg(format!("tl:{{k:{serial:012}}}:parts:g1000000"));
                }
                cmd.arg(BATCH).arg(1).arg(42).arg("0").arg(1);
                cmd.arg("1:1000:1000000:1000:0");
                for _ in 0..BATCH {
                    cmd.arg(1);
                }
                let reply: redis::Value = cmd.query(&mut conn).expect("EVALSHA");
                if v == 0 || v == batch_function {
                    assert!(
                        matches!(&reply, redis::Value::Array(r) if r.len() == 1 + 3 * BATCH),
                        "the shipped script answers every check, three integers each: {reply:?}"
                    );
                }
            }
        }
        drain_slowlog(&mut conn, &shas, &mut per_check);
        let _: () = conn.flushall().expect("FLUSHALL");
    }
    let mut md = String::from("## Where a check's server time goes\n\n");
    md.push_str(&format!(
        "`cargo run --release -p tierlimit-benches --bin script-parts`: {rounds} rounds × {CALLS} calls × {BATCH} GCRA checks per variant, variants interleaved call by call; server µs per check (each call's duration in `SLOWLOG` ÷ checks), median and 10th–90th percentile over the calls. Each row removes one more part from the row above (the edit is in `benches/src/bin/script-parts.rs`); \"µs saved\" is the row above's median minus this row's: what the part this row removes costs (for the minimal loop: everything of tierlimit's decision the cuts above left; for the loop alone: the GET and SET; for `return 1`: the loop and the reply; `return 1` itself is the call's fixed cost ÷ 100). Rows from the minimal loop down are floors, not tierlimit's decision. The next three rows are one check per call: the single check script (`lua/check.lua`), a minimal GCRA script, and `return 1` with its arguments; then the same check (whole, then without its argument checks) and minimal script as Redis Functions (`FCALL` of a library loaded once: the check is the shipped library, `tierlimit_redis::library_source()`, as the tier runs it on Redis 7, its memos of checked arguments warm); last, the shipped batch as a function, per check of a batch of {BATCH} (timed in the batch phase): what a check costs the server when the tier batches. The one-check rows are interleaved call by call among themselves, in each round before the batch rows (interleaved among themselves): a small call right after a batch would pay for collecting the batch's garbage.\n\n"
    ));
    md.push_str("| variant (cumulative) | µs per check (p10–p90) | µs saved |\n");
    md.push_str("|---|---:|---:|\n");
    let meds: Vec<f64> = per_check.iter().map(|v| median(v.clone())).collect();
    for (v, (name, _)) in variants.iter().enumerate() {
        let mut sorted = per_check[v].clone();
        sorted.sort_by(f64::total_cmp);
        let lo = sorted[sorted.len() / 10];
        let hi = sorted[sorted.len() * 9 / 10];
        let part = match v.checked_sub(1) {
            Some(before) if v != batch_variants && v != scripts && v != batch_function => {
                format!("{:.2}", meds[before] - meds[v])
            }
            _ => "–".to_string(),
        };
        md.push_str(&format!(
            "| {name} | {:.2} ({lo:.2}–{hi:.2}) | {part} |\n",
            meds[v]
        ));
    }
    let (check, minimal) = (meds[batch_variants], meds[batch_variants + 1]);
    let (fcall, fcall_minimal) = (meds[scripts], meds[scripts + 2]);
    let minimal_loop = variants
        .iter()
        .position(|(name, _)| name.starts_with("minimal GCRA loop"))
        .expect("the minimal loop is a variant");
    md.push_str(&format!(
        "\nOne check per call, medians: the check as a function ÷ as a script {:.2}; \
         as a function ÷ the minimal GCRA script {:.2}; ÷ the minimal GCRA function {:.2} \
         (as a script: ÷ the minimal script {:.2}). In a batch, as a function, per check \
         ÷ the minimal GCRA script (one check per call) {:.2}; ÷ the minimal loop {:.2}.\n",
        fcall / check,
        fcall / minimal,
        fcall / fcall_minimal,
        check / minimal,
        meds[batch_function] / minimal,
        meds[batch_function] / meds[minimal_loop],
    ));
    print!("{md}");
    let dir = std::env::var_os("TIERLIMIT_BENCH_OUT")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from("target/tierlimit-benches"));
    std::fs::create_dir_all(&dir).expect("the output folder");
    std::fs::write(dir.join("script_parts.md"), md).expect("script_parts.md");
}
