#!/usr/bin/env python3
"""Renders BENCHMARKS.md from the benches' JSON lines (see benches/src/lib.rs).

usage: render.py RESULTS_DIR OUTPUT_MD [--seconds N]

RESULTS_DIR holds <bench>.jsonl files, commands.txt (the commands that
produced them) and git.txt (the commit they measured), all written by
benches/run.sh; the machine is described from
this machine (it is the one the benches just ran on). Standard library only.
"""

import argparse
import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

BENCHES = ["local", "breaker", "allocations", "script_cost", "tower"]

# How to read the script-parts table (benches/src/bin/script-parts.rs).
PARTS_NOTES = [
    "Reading it: the cumulative rows are the batch script run by `EVALSHA`, where"
    " the memos of checked arguments are off (a script would start them empty on"
    " every call), so the argument-check row there is the per-request checks"
    " only; the rule set's numbers are checked once per call. The tier runs the"
    " same code as a Functions library on Redis 7 (the last rows), where a rule"
    " set's numbers and the costs seen are checked once per server. What a GCRA"
    " check costs above the minimal GET + SET PX loop is then the generic"
    " decision: the dispatch through CHECKS/COMMITS, the per-request layout,"
    " and the `<TAT>@<limit>` string (before stop 32 also a `pcall` per request"
    " and per rule). Since stop 28 the batch answers one flat array"
    " of integers (`lua/check_batch.lua`), and so do the floors here: a table"
    " per check made Redis ask each for its special fields and write its"
    " length after its items, about a third of a batched check's server time"
    " (the shipped batch 10.3–11.8 µs per check before, 6.8–7.4 after, in"
    " `--quick` runs on stop 28's machine). Since stop 31 a batched request"
    " carries two arguments (now, cost; the nonce comes once per call, the rule"
    " set's number only when the call holds several) instead of four, and a"
    " one-rule request answers three integers (retry-after, 0 when admitted;"
    " remaining; reset-after; the server time once per call) instead of six:"
    " Redis pays about as much per argument and per reply integer as for a few"
    " lines of Lua, and callgrind counted 51.3k instructions per batched"
    " fixed-window check before stop 31 and 43.5k after, the state passed as"
    " values (no table per check) included (16 checks per call, 1-hour"
    " windows, a `redis-server` 7.0.15 built with symbols). Since stop 32 a"
    " batch decides its requests under one `pcall`, resumed after a request"
    " that raises, instead of two per request (one around the request, one"
    " around each rule's read): 43.8k → 40.6k instructions per batched"
    " fixed-window check, 48.8k → 45.6k sliding window, 47.2k → 44.0k GCRA,"
    " 57.5k → 54.4k token bucket (Debian's `redis-server` 7.0.15, same load);"
    " then a request's now and cost looked up in their memos inline, without"
    " a call of `check_call_args` and `call_now` unless they miss: 39.8k,"
    " 44.8k, 43.2k and 53.6k; then the batch's counts checked through the"
    " memo of checked integers, without making the text of a number (a"
    " `sprintf` in Redis) unless refusing: 38.7k, 43.8k, 42.2k and 52.5k. A"
    " batch of one request cost its call 114.7k instructions before that"
    " last change and 97.6k after, against 75.3k for the same GCRA check by"
    " `check.lua`: 31k of it was the batch's prologue, and parsing or"
    " printing numbers (the pattern match, `strtod`, `sprintf`) is what"
    " costs there. Since stop 33 a rule is one argument"
    " (`code:limit:period_us:capacity:utc_offset_us`) instead of five, found"
    " in the library's memo by one lookup, and `check.lua` answers what the"
    " batch answers for one request (the server time, retry-after, then the"
    " rules' states; no allowed flag, no deciding rule for one rule): a"
    " one-rule check by `check.lua` cost Redis 75.0k → 68.7k instructions"
    " (GCRA; redis_rate's script 71.2k), 70.9k → 64.9k (fixed window;"
    " rate-limiter-flexible's 37.0k), 69.9k (sliding window; upstash's"
    " 53.4k) and 78.7k (token bucket), and a batched check 38.4k → 37.8k"
    " (fixed window) and 41.6k → 41.1k (GCRA) (callgrind, 20,000 calls"
    " pipelined 16 deep over 1,000 keys, Debian's `redis-server` 7.0.15)."
    " Then a batch carries one now for all its requests (the server's time,"
    " or the latest of a client clock's), so a request carries only its cost:"
    " 36.7k per batched fixed-window check (the peer's call 37.0k), 39.9k"
    " GCRA, 42.3k sliding window, 50.3k token bucket."
    " `benches/script-instructions.sh` counts the same at its end (hour-long"
    " windows, keys in use): one check per call 68.7k GCRA (redis_rate 70.5k),"
    " 78.9k token bucket (Spring Cloud Gateway 82.3k), 69.6k sliding window"
    " (upstash 48.9k), 64.5k fixed window (rate-limiter-flexible 36.8k);"
    " batched 40.4k, 51.0k, 41.8k and 36.6k. An"
    " empty `FCALL` with the key and the eight arguments of a one-rule check"
    " before stop 33 cost 19.9k instructions, with the rule joined into one"
    " argument 16.3k."
    " One check per call, measured once by hand with"
    " stub functions, not by this command (an earlier session's machine, about"
    " twice as fast as stop 27's; server µs per call, median of 2,400): an `FCALL` with the"
    " check's 8 arguments and a 6-integer reply (before stop 33) costs 1.4 µs doing nothing, TIME"
    " 0.8, a GET 0.6, a SET with PX 1.4; the minimal GCRA function adds 1.2 µs of"
    " Lua to those, tierlimit's check 2.5 µs (about 6.8 against 5.5 µs in all).",
    "",
]

# What the load bench's missed targets come from (issue 11), as measured
# beside it; the numbers above are this run's, these are the reasons.
LOAD_NOTES = [
    "### What the load targets come from",
    "",
    "* **A ÷ B16 at c = 50 (2.0).** Met in stop 23's run (2.04; pairs"
    " 1.80–2.17), stop 24's (2.10) and stop 25's (2.17), missed in every run before"
    " (1.37–1.92); stop 26's three runs measured 2.01, 2.10 and 1.83, on a"
    " machine whose Redis answered an empty script in 0.6 µs against stop"
    " 25's 4.1, so the client's core, not the server's, bounds A there; stop"
    " 27's, on a machine about twice as slow whose server's core bounds A,"
    " 2.14, 2.19 and 2.72. Stop 28's, an AMD EPYC about twice as fast as"
    " stop 27's, measured 1.81, 1.85 and 1.82; with every sample on an"
    " empty keyspace (below) 1.74 and 1.71 in runs of `redis-load` alone and"
    " 2.13 in `benches/run.sh`; then with the batch's flat reply (below)"
    " 1.94, 1.84 and 2.05 alone, 1.39 in a `benches/run.sh` run during which"
    " the machine ran everything slower (an empty script 3.7 against 3.2 µs,"
    " A's p99 3.7 ms), and 2.08 in its last `benches/run.sh`; stop 31's, after a batched"
    " check took two arguments and answered three integers instead of four"
    " and six (\"Where a check's server time goes\"), 2.35; stop 32's, after a"
    " batch took one `pcall` instead of two per request, its own; 2.28 in stop"
    " 33's; 2.63 in stop 34's (a machine whose Redis answered an empty script"
    " in 0.62 µs); 2.72 in stop 35's (one whose Redis answered it in"
    " about 5 µs, and whose timed rows spread far wider). In stop 28's runs alone its Redis was 88–97 %"
    " busy at c = 50, and before the flat reply A's batches cost it 7–9 µs of"
    " CPU per check against B16's 15–16: there the server's cost per check"
    " alone held A ÷ B16 under 2.0. Deciding one-rule GCRA"
    " checks inline in the batch loop, without the decide / CHECKS / COMMITS"
    " layers, saved 0.6–0.9 of about 11 µs per check in `script-parts` (two"
    " quick runs, stop 28): too little to reach 2.0 there, and not kept, as"
    " it is a second copy of GCRA's decision. The batch's reply made one"
    " flat array instead of a table per check (stop 28, see \"Where a"
    " check's server time goes\") cut a third of a batched check's server time"
    " in batches of 100, less in the load bench's of about 16: its best"
    " samples of A's script µs per check went from 5.1–5.8 to 5.0–5.4."
    " Since stop 28 every sample"
    " starts on an empty keyspace (`FLUSHALL`, the hot keys spent again): a"
    " check's key expires a millisecond after it, expired keys piled up"
    " across samples, and Redis' active expiry then moved a sample's server"
    " CPU per check by up to half, whichever side it fell on (7.8 against"
    " 11.3 µs for one side at c = 50). B16 and M16 now spread by a few"
    " percent between samples instead of a quarter; B16 lost fewer samples"
    " to the expiry, so A ÷ B16 reads lower than before on the same machine."
    " The earlier notes"
    " called A server-bound; it was not: at c = 50 the server was about 79 %"
    " busy and the client about half of its core, because a queue waited for"
    " one of the two calls in flight to end unless it reached `max_batch`, so"
    " a third of the checks sat in the queue while the server ran out of"
    " work. Since stop 23 a queue as large as the calls in flight (at least"
    " 4 checks) goes at once (`crates/tierlimit-redis/src/batch.rs`): A about"
    " 1.3× at c = 50 and 1.35× at c = 8, the same at c = 200. With a median"
    " this close to 2.0 and pairs 1.80–2.17, a noisier run can fall under it."
    " Tried and not kept, as no better within the noise: three or four calls"
    " in flight before queueing (smaller batches: the server's cost per check"
    " rises as much as the overlap gains), handing the queue on before waking"
    " the answered callers (stops 21 and 23), GCRA's limit text memoised and"
    " its TTL passed as a number (stop 22).",
    "* **Lowest A ÷ B16 over c (1.0).** Not reachable at c = 1 by any design"
    " that waits for its answer: with one check in flight A is bound by one"
    " round trip, while B16 keeps 16 requests in flight on its one connection."
    " At c = 8, B16 has 128 requests in flight against A's 8: A reaches"
    " 0.6–0.85× B16 in stop 23's runs (0.4–0.6× before, once 1.1×), 1.28×"
    " in stop 24's, 0.96× in stop 25's (an AMD EPYC machine; stop 24's was"
    " an Intel Xeon), 0.92× and 0.88× in stop 26's, 0.80× and 0.85× in"
    " stop 27's first two and 0.67–0.79× in stop 28's: at c = 8 the target"
    " is met in some runs and not others.",
    "* **A p50 ÷ B1 p50 at c = 1 (1.25).** At c = 1 a check is one round trip"
    " and the client sleeps between round trips. `perf` of the client alone"
    " at c = 1 (stop 28) put 70 % of its samples in the kernel (the socket,"
    " going to sleep and waking up) and 24 % in user space, for A and T"
    " alike; what separates A from B1 is mostly tokio's and redis-rs's path"
    " per round trip against redis-benchmark's C loop, not the facade: the"
    " bare tier's p50 was 0.92–1.22× B1's in the same runs. A ÷ B1 measured"
    " 1.10, 1.08 and 1.44 in stop 27's runs, 1.30, 1.15, 1.13, 1.28 and"
    " 1.09 in stop 28's before this one: met in some runs and not others.",
    "* **A ÷ T (0.98).** The facade's own work per healthy check is not small"
    " beside the bare tier's client work; it shows in checks/s where the"
    " client's core bounds both sides, and hardly where the server's does."
    " The row \"A ÷ T client CPU µs per check\" (since stop 27) measures it:"
    " A's one thread spent 1.18× T's CPU per check in stop 27's run before the"
    " change below and 1.21× in its run after. `perf` of each side alone (600,000 checks at"
    " c = 50, stop 27) put half of A's extra samples in one map lookup, the"
    " warm-start record every healthy check writes (`LocalTier::remember`),"
    " and skipping that record took the CPU ratio from 1.25 and 1.32 to 1.11"
    " and 1.18 (two runs each, medians of 7 pairs). Since stop 27 a key of"
    " up to 23 bytes and a one-rule record live inline in the map entry"
    " (`crates/tierlimit-local/src/key.rs`): that lookup then took a fifth of"
    " the samples (737 against 3,756, a cold run, most of the saving the new"
    " keys' two allocations), but the load bench's ratio did not move beyond"
    " its noise. The rest is the facade's other per-check work: its boxed"
    " Redis future, its clock reads, the metrics. So A ÷ T measured 1.14,"
    " 1.26 and 0.87 on stop 28's machine before samples started on an empty"
    " keyspace (the 0.87 a run whose pairs ranged 0.77–1.52 as the expiry"
    " fell on one side or the other), 1.19, 1.06 and 1.05 after (the last in stop 28's final `benches/run.sh`), 1.05 in stop 31's and stop 32's, 0.975 and 0.886 in stop 33's, 0.978 in stop 34's, 1.10 in stop 35's (client CPU per check 1.08×, and 1.09× in instructions by callgrind, one check at a time: the boxed Redis future's allocation and copy, about 640 instructions of A's 23k, and the warm-start record, about 520, are most of the difference);"
    " 0.974, 0.910 and 1.12 on stop 27's (server-bound: Redis"
    " took about two thirds of all `perf` samples), 0.91, 1.02 and 0.86 on"
    " stop 26's (its Redis answered an empty script in 0.6 µs, so the client"
    " bounded A; the notes then put the spread down to drift, but it was this"
    " CPU), and 0.96–1.40 in stops 21–25.",
    "* **Server script µs per check ÷ the minimal script.** A's batches cost the"
    " server 1.1–1.4× what the minimal GCRA script costs sent one per check"
    " (M16; 1.43 in stop 24's run, on a machine that ran about twice as slow"
    " as stop 23's and with spreads of ±30 % in the server rows; 1.26 in stop"
    " 25's; 1.07, 1.08 and 1.04 in stop 26's three runs, as GCRA's state parse"
    " and clamps got cheaper, all within one run's spread; 1.08 and 1.03 in"
    " stop 27's first two, 0.83 in its third: on that noisy machine the server"
    " rows spread by a quarter between runs of the same code; 1.11, 1.19 and"
    " 1.17 on stop 28's, then 1.09, 1.23 and 0.96 (its final run) on an empty"
    " keyspace per sample, and stop 31's, after it cut a batched check's"
    " arguments and reply, about a sixth of its instructions by callgrind,"
    " 1.015, which one run of this row, spread as it is, neither shows nor"
    " hides; and stop 32's, after it took another 9–12 % off: one"
    " `pcall` per batch instead of two per request, fewer Lua calls and"
    " number conversions); 0.96 in stop 33's run, 0.83 in stop 34's and 0.90 in"
    " stop 35's;"
    " B16, the check script by"
    " `EVALSHA` one per check, costs 2.4–3.1×:"
    " every `EVALSHA` runs the whole joined file again and checks every argument"
    " (the memos need a library). What the tier's checks still cost above the"
    " minimal one is in \"Where a check's server time goes\".",
    "",
]


def load(results_dir):
    records = {b: [] for b in BENCHES}
    for bench in BENCHES:
        path = Path(results_dir) / f"{bench}.jsonl"
        if not path.exists():
            sys.exit(f"render.py: {path} is missing: did `cargo bench --bench {bench}` run?")
        for line in path.read_text().splitlines():
            if line.strip():
                records[bench].append(json.loads(line))
        if not records[bench]:
            sys.exit(f"render.py: {path} is empty: the bench did not finish")
    return records


def load_optional(results_dir, bench):
    """The records of `<bench>.jsonl`, or None when that bench did not run
    (the peer scripts are not in this repository, so their bench may not)."""
    path = Path(results_dir) / f"{bench}.jsonl"
    if not path.exists():
        return None
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def floor_line(rows):
    floors = [r for r in rows if r["kind"] == "script_floor"]
    if not floors:
        return []
    u = floors[0]["usec_per_call"]
    return [
        f"Empty script (`{floors[0]['script']}`): {u['median']:.2f} µs per call"
        f" ({u['min']:.2f}–{u['max']:.2f}).",
        "",
    ]


def command_output(args):
    try:
        out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
        return out.strip().splitlines()[0] if out.strip() else "unknown"
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def machine():
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    redis = os.environ.get("TIERLIMIT_REDIS_SERVER", "redis-server")
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu,
        "nproc": command_output(["nproc"]),
        "rustc": command_output(["rustc", "--version"]),
        "redis": command_output([redis, "--version"]),
    }


def ratio_verdict(r):
    target = r.get("target_max")
    median = r["ratio"]["median"]
    if target is None:
        return "(no target)"
    if median <= target:
        return f"met (≤ {target:.2f})"
    return f"**MISSED**: {telling(median, target)} > {target:.2f}"


def telling(value, target, p=2):
    """`value` with as many decimals as it takes to differ from `target` as
    printed: a median of 1.1004 against 1.10 reads 1.1004, not 1.10."""
    while p < 6 and f"{value:.{p}f}" == f"{target:.{p}f}":
        p += 1
    return f"{value:.{p}f}"


def rng(d, p=2):
    """A spread record as `median (min–max)`, `p` decimals."""
    return f"{d['median']:.{p}f} ({d['min']:.{p}f}–{d['max']:.{p}f})"


def fmt_ns(ns):
    if ns >= 10_000:
        return f"{ns / 1000:,.1f} µs"
    return f"{ns:,.1f} ns"


def ratio_table(rows):
    out = [
        "| case | A | B | A ÷ B (median) | spread (min–max) | pairs | A per op | B per op | target |",
        "|---|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        out.append(
            "| {title} | {a} | {b} | **{med:.2f}** | {lo:.2f}–{hi:.2f} | {pairs} | {an} | {bn} | {verdict} |".format(
                title=r["title"],
                a=f"`{r['a']}`",
                b=f"`{r['b']}`",
                med=r["ratio"]["median"],
                lo=r["ratio"]["min"],
                hi=r["ratio"]["max"],
                pairs=r["pairs"],
                an=fmt_ns(r["a_ns"]["median"]),
                bn=fmt_ns(r["b_ns"]["median"]),
                verdict=ratio_verdict(r),
            )
        )
    return out


def raw_table(rows):
    out = [
        "| bench | case | ops per sample | A ns/op: median (min–max) | B ns/op: median (min–max) | per-pair ratios |",
        "|---|---|---:|---:|---:|---|",
    ]
    for r in rows:
        a, b = r["a_ns"], r["b_ns"]
        out.append(
            f"| {r['bench']} | `{r['id']}` | {r['ops_per_sample']:,} "
            f"| {a['median']:,.1f} ({a['min']:,.1f}–{a['max']:,.1f}) "
            f"| {b['median']:,.1f} ({b['min']:,.1f}–{b['max']:,.1f}) "
            f"| {', '.join(f'{x:.2f}' for x in r['ratios'])} |"
        )
    return out


def alloc_table(rows):
    out = [
        "| path | `HybridLimiter::check` allocs / bytes | layer under it | its allocs / bytes | facade's own share: allocs / bytes |",
        "|---|---:|---|---:|---:|",
    ]
    for r in rows:
        f = r["facade"]
        u = r.get("under")
        if u:
            under = f"`{u['what']}`"
            under_nums = f"{u['allocs']:.1f} / {u['bytes']:,.0f}"
            # Rounded before it is shown: a difference of two averages that
            # agree to the digit would print as "-0.0".
            share = f"{round(f['allocs'] - u['allocs'], 1) + 0.0:.1f} / {f['bytes'] - u['bytes']:,.0f}"
        else:
            under, under_nums, share = "none", "–", f"{f['allocs']:.1f} / {f['bytes']:,.0f}"
        out.append(
            f"| {r['title']} | {f['allocs']:.1f} / {f['bytes']:,.0f} | {under} | {under_nums} | {share} |"
        )
    return out


def script_table(rows):
    """The script-cost table, with issue 11's verdict on each row: FCALL, one
    check per call, ÷ the minimal script of the same algorithm ≤ 1.0."""
    by = {(r["algorithm"], r["rules"]): r for r in rows}
    out = [
        "| algorithm | rules | FCALL µs per call (min–max) | ÷ empty script | EVALSHA µs | FCALL ÷ EVALSHA (min–max) | minimal script µs | FCALL ÷ minimal (min–max) | rounds × calls | target ≤ 1.0 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    algorithms = []
    for r in rows:
        if r["algorithm"] not in algorithms:
            algorithms.append(r["algorithm"])
    judged = met = 0
    for alg in algorithms:
        for rules in (1, 3):
            r = by.get((alg, rules))
            if r is None:
                continue
            cells = [f"`{alg}`", str(rules), rng(r["usec_per_call"], 2),
                     f"{r['per_empty_script']['median']:.1f}"]
            verdict = "–"
            if "evalsha_usec_per_call" in r:
                cells += [f"{r['evalsha_usec_per_call']['median']:.2f}", f"**{rng(r['per_evalsha'], 2)}**",
                          f"{r['minimal_usec_per_call']['median']:.2f}", f"**{rng(r['per_minimal'], 2)}**"]
                ratio = r["per_minimal"]["median"]
                judged += 1
                if ratio <= 1.0:
                    met += 1
                    verdict = "met"
                else:
                    verdict = f"**MISSED**: {telling(ratio, 1.0)} > 1.00"
            else:
                cells += ["–"] * 4
            cells.append(f"{r['rounds']} × {r['calls_per_round']:,}")
            cells.append(verdict)
            out.append("| " + " | ".join(cells) + " |")
    out += ["", f"FCALL ÷ minimal ≤ 1.0 (issue 11), one check per call: {met} of {judged} rows met."
            " The load bench below judges the same target as the tier sends checks under load,"
            " in batches (A ÷ M16)."]
    return out


# Why the script cost stands where it does against the minimal scripts
# (issue 11), counted in instructions, which do not drift as the times above do.
SCRIPT_NOTES = [
    "Counted in Redis' instructions per check instead of its time"
    " (`benches/script-instructions.sh`, stop 35, keys in use, callgrind,"
    " Debian's `redis-server` 7.0.15), tierlimit's check over the minimal"
    " script's, one rule and three: GCRA 0.94 and 1.09, token bucket 0.94 and"
    " 1.02 (1.00 and 1.12 since stop 48: see below), sliding log 1.18 and 1.25, sliding window 0.78 and 0.88, fixed"
    " window 0.84 and 0.95 (stop 34: 0.98 and 1.13, 0.97 and 1.03, 1.22 and"
    " 1.30, 0.81 and 0.86, 0.87 and 0.96). Against the peers' scripts, one"
    " check per call and batched by 16: redis_rate's GCRA 0.93 and 0.57,"
    " Spring Cloud Gateway's token bucket 0.92 and 0.62, upstash's sliding"
    " window 1.35 and 0.84, rate-limiter-flexible's fixed window 1.65 and"
    " 0.97. Where a ratio is above 1.0:",
    "",
    "* **GCRA.** tierlimit keeps a key's TAT with its fraction and the limit it"
    " was written under (`<TAT>.<fraction>@<limit>`: no unit lost to rounding,"
    " and a changed limit rescales what was used); reading that text (a"
    " `find`, a `match`, the parts converted by arithmetic) costs Redis about"
    " 6.5k instructions per rule whose key holds a TAT (a one-rule check of"
    " 1,000 per hour: 73.2k, and 66.7k with the read taken out; 8k by stop"
    " 34's `find`s, `sub`s and `tonumber`s), where the minimal script reads a"
    " bare integer. In the instruction count's one-rule row (1,000 per second)"
    " and in two of its three-rule rows' rules, a key's TAT has passed and the"
    " key expired between its checks, so nothing is read there: 0.94 of the"
    " minimal script with one rule, 1.09 with three. The timed rows here, whose"
    " keys all hold a TAT (ten checks in a row), come out above those.",
    "* **Token bucket.** Since stop 48 a key keeps the limit its used units"
    " were written under (a third hash field), and they drain at it until an"
    " admission rewrites them, as GCRA's TAT does: the key's expiry is set by"
    " that rate, and after a lowered limit a denial answered a retry-after"
    " its key did not live to see (10 used at 10/s, lowered to 1/s: retry in"
    " 9 s, the bucket full again after 1 s). The field costs Redis about 5k"
    " instructions per rule (`benches/script-instructions.sh`'s token-bucket"
    " rows, the library built before and after the change: one rule 77.4k →"
    " 82.3k per check, three rules 191.6k → 209.2k, batched 51.1k → 56.3k):"
    " the `HMGET` of a third field, the `HSET` of a third pair and its"
    " `format`. Passing the limit as a Lua number instead of formatting it"
    " cost more (83.0k): Redis 7.0 prints numbers with a conversion of its"
    " own.",
    "* **Sliding log.** tierlimit reads the log's newest unit (`ZRANGE`) to"
    " answer an exact reset-after and to keep a key whose newest unit came"
    " from a clock ahead of this one until that unit leaves; the minimal script"
    " sends no such fifth command.",
    "* **Three rules.** Each rule past the first goes through the decision's"
    " tables (its check's outcome, its commit, its two items of the reply):"
    " 41.5k instructions per further fixed-window rule against the minimal"
    " script's 40.4k in stop 34, though that one takes four arguments more per"
    " rule (each costs Redis about 0.9k). Stop 34 cut what did"
    " not need to be there: the reply is written in place into `check.lua`'s"
    " (made at its full size) or the batch's, keys are compared pairwise"
    " instead of through a table of the keys seen, the outcome and argument"
    " tables are reused from call to call (GCRA 173.7k → 163.9k, fixed window"
    " 158.4k → 147.8k; batched by 16: 141.8k → 128.2k and 127.4k → 111.6k),"
    " and the sliding log's commit takes the check's window bound as text and"
    " adds one unit without a table (301.9k → 277.3k).",
    "* **Number conversions (stop 35).** Lua 5.1's `tonumber` converts its"
    " text twice (it tests it, then converts it), and `strtod` is most of a"
    " 16-digit number's cost. Where the text is known to be digits (`TIME`'s"
    " two fields, a sorted set's scores, an argument `int_arg` has matched,"
    " GCRA's state once its `match` passed) arithmetic converts it, once:"
    " GCRA 163.1k → 158.0k with three rules and 69.1k → 66.6k with one, the"
    " sliding log 270.6k → 263.9k and 118.0k → 116.9k, the fixed window 65.0k"
    " → 63.3k (the `TIME` part, which every algorithm shares). Hash fields"
    " (the token bucket's and the windows') keep `tonumber`: a value no script"
    " of ours wrote holds no state there, and checking its digits first costs"
    " more than the second conversion.",
    "",
]


# What each peer's script leaves out that tierlimit's check does, read from
# the scripts at the commits `benches/peer-scripts.sh` pins (in our words):
# the why of a missed peer target, beside the same run's numbers.
PEER_DIFFERENCES = {
    "Gcra": "redis_rate reads `TIME`, one `GET` and one `SET EX` as tierlimit does;"
    " it checks no argument, keeps the TAT as a bare float of seconds (a changed"
    " limit misreads it, where tierlimit stores the limit with the TAT and"
    " rescales); it takes a key and 4 arguments and answers 4 values, as"
    " tierlimit's check does since stop 33 (now, cost, nonce and the rule as"
    " one argument; the server time, retry-after, remaining, reset-after; a"
    " batched check takes 2 arguments and answers 3).",
    "TokenBucket": "Spring Cloud Gateway takes the time from the caller (no"
    " `TIME`), keeps tokens and timestamp in two keys (two `GET`s, two"
    " `SETEX`es, written on denials too) and checks no argument.",
    "SlidingWindow": "upstash takes the time from the caller in milliseconds"
    " (no `TIME`; tierlimit reads the server's, so instances whose clocks"
    " disagree still count one window), keeps each window in a string key the"
    " caller names (`GET` of the current and previous window, `INCRBY`, and a"
    " `PEXPIRE` once per window) where tierlimit keeps one hash per key"
    " (`HMGET` of three fields, `HSET`), checks no argument, and answers 2"
    " integers where tierlimit's check answers 4 (a batched one 3). The clock"
    " is a small part of it: counted in instructions (callgrind, stop 38,"
    " one check per call, hour-long windows, keys in use), tierlimit's check"
    " costs Redis 68.1k reading `TIME` and 63.9k on the caller's clock"
    " (`client_time(true)`; the caller's µs must be checked and converted),"
    " against upstash's 48.6k: 1.40× and 1.31×.",
    "FixedWindow": "rate-limiter-flexible reads no clock: a window starts at"
    " a key's first request and lasts its TTL (`SET NX EX`, `INCRBY`, `PTTL`),"
    " so its windows are not aligned to the clock (no calendar hours or days,"
    " no UTC offset, as tierlimit's are); it counts denied requests too (the"
    " `INCRBY` comes before the caller compares), checks no argument and"
    " answers 2 integers. tierlimit reads `TIME`, `HMGET`s two fields and, when"
    " it admits, `HSET`s one (two and a `PEXPIRE` in a new window). Counted"
    " in instructions (`benches/script-instructions.sh`, stop 33: keys whose"
    " window is open) a batched tierlimit check costs Redis 36.6k, the peer's"
    " call 36.8k, one check per call 64.5k; on new keys (callgrind by hand, 16"
    " checks per batch, 1-minute windows) 46.2k batched (the `PEXPIRE`)"
    " against the peer's 42.8k, and 84.6k one per call: the bench's"
    " short-lived keys open a window on about a third of their checks, and"
    " its time per call spreads by a third from pair to pair, so the batched"
    " ratio lands on either side of 1.0 from run to run (0.97 and 1.02 in"
    " stop 33's two runs). A hash has no write that sets its TTL too in Redis 7.0,"
    " so a new window costs one more command than the peer's `SET NX EX`"
    " unless the window is stored as a string, a storage change not made."
    " Nor is it the clock, mostly: counted the same way (callgrind, stop 38,"
    " one check per call, hour-long windows, keys in use), tierlimit's check"
    " costs Redis 62.9k reading `TIME` and 58.7k on the caller's clock,"
    " against the peer's 37.4k (1.68× and 1.57×). Taken apart with stub"
    " functions (on a server already warm, where the check cost 63.8k): the"
    " call with a reply of 4 integers 23.8k (with a reply of 1, 17.0k), the"
    " argument checks 2.7k, `TIME` 9.6k, the `HMGET` and its conversions"
    " 14.0k, the `HSET` 10.0k, the decision around them 3.7k; the peer's"
    " whole call is 37.4k.",
}


# The two ways tierlimit's check is timed against a peer: the ratio's key in
# a `peer-scripts` record, and its name in the report.
PEER_WAYS = (("ratio", "one check per call"), ("batched_ratio", "batched"))


def peer_misses(rows):
    """Why each missed algorithm misses: the same run's medians and what the
    peer's script leaves out."""
    gaps = {}
    for r in rows:
        if r.get("kind") != "peer_script" or not r["measured"]:
            continue
        for key, way in PEER_WAYS:
            if r.get(key) is not None and r[key]["median"] > r["target_max"]:
                mine = (
                    r["tierlimit_usec_per_call"]
                    if key == "ratio"
                    else r["tierlimit_batched_usec_per_check"]
                )
                gaps.setdefault(r["algorithm"], []).append(
                    f"{way}, P{r['pipeline']}: {mine['median']:.2f} against"
                    f" {r['peer_usec_per_call']['median']:.2f} µs, per-pair"
                    f" ratio {r[key]['median']:.2f}"
                )
    if not gaps:
        return []
    out = [
        "",
        "Why the misses (this run's median µs per check, tierlimit's against the"
        " peer's, and the median of the per-pair ratios; what each part of a"
        " check costs, measured with stub functions, is in \"Where a check's"
        " server time goes\"):",
        "",
    ]
    for alg, lines in gaps.items():
        out.append(f"* `{alg}` ({'; '.join(lines)}): {PEER_DIFFERENCES.get(alg, '')}")
    return out


def peer_section(rows):
    """The section of benches/src/bin/peer-scripts.rs: tierlimit's check by
    FCALL against each algorithm's peer script by EVALSHA."""
    out = [
        "## Server µs per check against peers' scripts",
        "",
        "`cargo run --release -p tierlimit-benches --bin peer-scripts`"
        " ([`benches/src/bin/peer-scripts.rs`](benches/src/bin/peer-scripts.rs)),"
        " with `TIERLIMIT_PEER_SCRIPTS` naming a directory that holds the peers'"
        " scripts (not in this repository; `benches/peer-scripts.sh DIR` fetches"
        " them from the commits listed below). One private `redis-server`;"
        " `redis-benchmark -c 50 -r 10000 -P 1|16` sends tierlimit's check as"
        " `FCALL` of its Functions library (one check per call, as"
        " `RedisTier::check` sends it) and the peer's script as `EVALSHA` with the"
        " peer's own keys and arguments, alternately, on fresh random keys, all"
        " admitted; the rule is 1,000 per second (burst 1,000) in both. µs per"
        " call is the server's `usec ÷ calls` of `fcall` or `evalsha` in `INFO"
        " commandstats` after `CONFIG RESETSTAT`. Each pair also times tierlimit"
        " as the tier sends checks under load: its batch function by `FCALL`, 16"
        " checks per call (what batches hold at c = 50 in the load bench below),"
        " µs per call ÷ 16. Target of issue 11: tierlimit ÷ peer ≤ 1.0 for each"
        " algorithm (the median of the per-pair ratios), judged for each way.",
        "",
    ]
    if rows is None:
        return out + ["Not run: `peer_scripts.jsonl` is missing.", ""]
    out += [
        "| algorithm | peer script | P | peer µs/call (min–max) | tierlimit µs/call, one check per call (min–max) | ÷ peer (min–max) | tierlimit µs/check, batches of 16 (min–max) | ÷ peer (min–max) | pairs | target ≤ 1.0: one per call; batched |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    sources = []
    met = {}
    counted = {}
    total = 0
    by_alg = {}
    for r in rows:
        if r.get("kind") != "peer_script":
            continue
        peer = r["peer"]
        if peer not in sources:
            sources.append(peer)
        if not r["measured"]:
            out.append(
                f"| `{r['algorithm']}` | {peer['name']} | – | – | – | – | – | – | – | not measured: {r['reason']} |"
            )
            continue
        total += 1
        oks = []
        for key, _ in PEER_WAYS:
            if r.get(key) is None:
                oks.append("–")
                continue
            ok = r[key]["median"] <= r["target_max"]
            oks.append("met" if ok else f"**MISSED**: {r[key]['median']:.2f} > {r['target_max']:.1f}")
            met[key] = met.get(key, 0) + ok
            counted[key] = counted.get(key, 0) + 1
            by_alg.setdefault((r["algorithm"], key), []).append(ok)
        batched = r.get("tierlimit_batched_usec_per_check")
        out.append(
            f"| `{r['algorithm']}` | {peer['name']} | {r['pipeline']} | {rng(r['peer_usec_per_call'])}"
            f" | {rng(r['tierlimit_usec_per_call'])} | **{rng(r['ratio'])}**"
            f" | {rng(batched) if batched else '–'}"
            f" | {'**' + rng(r['batched_ratio']) + '**' if batched else '–'}"
            f" | {r['pairs']} | {oks[0]}; {oks[1]} |"
        )
    if total:
        for key, way in PEER_WAYS:
            algs = dict.fromkeys(alg for alg, k in by_alg if k == key)
            verdicts = [
                f"`{alg}` {'met' if all(by_alg[(alg, key)]) else '**MISSED**'}" for alg in algs
            ]
            out += [
                "",
                f"{way.capitalize()}: {met.get(key, 0)} of {counted.get(key, 0)} measured rows meet the target;"
                f" per algorithm (met when every pipeline depth meets it): {', '.join(verdicts)}.",
            ]
        out += peer_misses(rows)
        out += caller_clock_rows(rows)
    else:
        out += ["", "No algorithm measured: the peers' scripts were not given (see above)."]
    out += ["", "The peers' scripts:", ""]
    for peer in sources:
        out.append(
            f"* `{peer['file']}`: {peer['repo']} {peer['version']}, `{peer['path']}`,"
            f" commit `{peer['commit']}`"
        )
    return out + [""]


def caller_clock_rows(rows):
    """tierlimit's check on the caller's clock against the peers that read no
    server clock: the same source of time on both sides (not judged)."""
    clocked = [
        r
        for r in rows
        if r.get("kind") == "peer_script"
        and r["measured"]
        and r.get("caller_clock_ratio") is not None
    ]
    if not clocked:
        return []
    out = [
        "",
        "On the caller's clock: two peers read no server clock (upstash takes the"
        " caller's time, rate-limiter-flexible keeps none), so each of their"
        " pairs also times tierlimit's check as a limiter built with"
        " `client_time(true)` sends it, the caller's µs in place of Redis' `TIME`"
        " (one check per call). Not judged: the target is on the server's clock,"
        " the default. The last column is the server-clock median over this one"
        " in this run; time per call spreads by a third from sample to sample,"
        " so the instruction counts in the \"why\" above say more.",
        "",
        "| algorithm | peer script | P | tierlimit µs/call, caller's clock (min–max) | ÷ peer (min–max) | server's clock ÷ caller's |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in clocked:
        c = r["tierlimit_caller_clock_usec_per_call"]
        out.append(
            f"| `{r['algorithm']}` | {r['peer']['name']} | {r['pipeline']} | {rng(c)}"
            f" | **{rng(r['caller_clock_ratio'])}**"
            f" | {r['tierlimit_usec_per_call']['median'] / c['median']:.2f} |"
        )
    return out


def missed_why(r, allocs, ratios):
    """What the numbers say about a missed target: the extra time, and for the
    local path the allocations per check against governor's and what the
    facade costs around a bucket (its FailClosed answer, which asks none)."""
    extra = r["a_ns"]["median"] - r["b_ns"]["median"]
    why = f"{fmt_ns(extra)} more per check than `{r['b']}`"
    local = allocs.get("local/existing-key")
    if r["bench"] == "local" and local and local.get("under"):
        f, u = local["facade"], local["under"]
        why += (
            f"; on a key that has a bucket the check makes {f['allocs']:.1f} allocations"
            f" ({f['bytes']:,.0f} bytes) where `{u['what']}` makes {u['allocs']:.1f}"
        )
    if r["bench"] == "local":
        closed = [
            x
            for x in ratios
            if x["bench"] == "local" and x["title"].startswith("FailClosed, ")
        ]
        alone = [x for x in ratios if x["title"].startswith("the local tier alone")]
        if closed:
            why += "; `FailClosed`, which answers without any bucket, measured " + " and ".join(
                f"{x['ratio']['median']:.2f} ({x['title'].split(', ')[1]})" for x in closed
            ) + " × governor in this run: the facade's work around the bucket (key validation, the policy, the breaker, the metrics, the Decision)"
            if min(x["ratio"]["median"] for x in closed) >= 0.9:
                why += (
                    " costs about governor's whole check, so no local tier, however fast,"
                    f" brings this check within {r['target_max']:.2f}× of governor"
                    " (`benches/instructions.sh` counts the same in instructions)"
                )
            else:
                why += " takes that share of governor's check"
        if alone:
            why += f"; the local tier alone measured {alone[0]['ratio']['median']:.2f}×"
    return why


def main():
    parser = argparse.ArgumentParser(description="Renders BENCHMARKS.md")
    parser.add_argument("results_dir")
    parser.add_argument("output")
    parser.add_argument("--seconds", default="unknown", help="how long the benches ran")
    args = parser.parse_args()
    records = load(args.results_dir)
    output = args.output
    info = machine()
    info["seconds"] = args.seconds
    git_file = Path(args.results_dir) / "git.txt"
    info["git"] = git_file.read_text().strip() if git_file.exists() else "unknown"
    commands_file = Path(args.results_dir) / "commands.txt"
    info["commands"] = (
        commands_file.read_text().splitlines() if commands_file.exists() else []
    )
    allocs = {r["id"]: r for r in records["allocations"] if r["kind"] == "allocations"}
    ratios = [r for b in ("local", "breaker", "tower") for r in records[b] if r["kind"] == "ratio"]
    targets = [r for r in ratios if r.get("target_max") is not None]
    missed = [r for r in targets if r["ratio"]["median"] > r["target_max"]]

    md = []
    md += [
        "# Benchmarks",
        "",
        "Generated by `benches/run.sh` from the benches in [`benches/`](benches/);"
        " do not edit by hand. Absolute times on these machines drift by ±30 %"
        " between runs, so every target is a **ratio of two things measured side by"
        " side in one run**, alternately A, B, A, B…, with the same number of"
        " operations per sample: the median of the per-pair ratios, its spread"
        " (smallest and largest per-pair ratio), and each side's median time per"
        " operation. How the harness works and why it is not criterion or divan:"
        " [`benches/src/lib.rs`](benches/src/lib.rs).",
        "",
        "## Machine",
        "",
        f"* date: {info['date']}",
        f"* CPU: {info['cpu']} ({info['nproc']} cores online, `nproc`)",
        f"* rustc: {info['rustc']}",
        f"* redis-server: {info['redis']}",
        f"* git: {info['git']}",
        f"* total bench time: {info['seconds']} s",
        "",
        "## Commands",
        "",
        "```sh",
        "benches/run.sh    # all of the below, then renders this file",
        *info["commands"],
        "```",
        "",
        "## Targets",
        "",
    ]
    if not targets:
        md.append("No case of this run has a target.")
    for r in targets:
        line = (
            f"{r['title']}: `{r['a']}` ÷ `{r['b']}` = "
            f"{r['ratio']['median']:.2f} (spread {r['ratio']['min']:.2f}–{r['ratio']['max']:.2f}),"
            f" target ≤ {r['target_max']:.2f}"
        )
        if r in missed:
            md.append(f"* **MISSED**: {line}. Why: {missed_why(r, allocs, ratios)}.")
        else:
            md.append(f"* met: {line}.")
    md += [
        "",
        f"Issue 10's local-tier targets: {len(targets) - len(missed)} of {len(targets)} met."
        + (
            " A missed target is reported as measured: the baseline is never tuned."
            if missed
            else ""
        ),
        "",
        "Issue 11's targets are judged where they are measured: server µs per check against"
        " the minimal scripts (\"Script cost on the server\", one check per call), against the"
        " peers' scripts (\"Server µs per check against peers' scripts\"), and the load"
        " targets (\"Targets of issue 11 (this run)\" under \"Redis path under load\").",
        "",
        "## Local tier: `HybridLimiter::check` with the breaker Open vs bare governor",
        "",
        "The limiter is built against a dead loopback port with one fixed instance"
        " (so `LocalFallback`'s share is the whole limit) and tripped before the"
        " samples; its cool-down is an hour, so no probe runs meanwhile. Rule and"
        " quota: 1e6 per second with a burst of `u32::MAX` on both sides (the admit"
        " path), except the deny case (1 per hour, spent). `String` keys, built"
        " beforehand, each already holding a bucket on both sides. governor 0.10,"
        " `RateLimiter::keyed` (DashMap store, quanta clock), `check_key(&String)`."
        " Checks are polled once each (they do no I/O while Open). With 2 threads,"
        " both hammer one key at once and a time is wall time ÷ checks per thread.",
        "",
        *ratio_table([r for r in records["local"] if r["kind"] == "ratio"]),
        "",
        "## Healthy path: `HybridLimiter::check` vs `RedisTier::check`",
        "",
        "Same rule set (1e6/s, plus 6e7/min and 3.6e9/h for three rules), same"
        " script, same private `redis-server` on loopback, same key, one call at a"
        " time on one current-thread runtime. The ratio is what the facade adds to a"
        " Redis round trip on this 2-core machine (the server shares the cores).",
        "",
        *ratio_table([r for r in records["breaker"] if r["kind"] == "ratio"]),
        "",
        "## Tower layer: `RateLimit::call` vs `HybridLimiter::check`",
        "",
        "The limiter of the local-tier section (breaker Open, `LocalFallback`, one"
        " fixed instance), one key. Both sides build the same request (`GET"
        " /api/items` with an `x-api-key` header) per operation; A passes it through"
        " `tierlimit-tower`'s layer (route match, key extraction, the check, the"
        " headers rendered onto the inner service's empty response), B checks the key"
        " directly. The ratio is the layer's whole cost over the bare check.",
        "",
        *ratio_table([r for r in records["tower"] if r["kind"] == "ratio"]),
        "",
        "## Allocations per check",
        "",
        "A counting global allocator (`stats_alloc`) in the bench binary; each"
        " figure is a total over many checks ÷ their number (allocs = `alloc` +"
        " `realloc` calls, bytes = bytes asked for). Everything runs on one"
        " current-thread runtime, so the Redis rows include redis-rs's connection"
        " driver. The facade's own share is the difference to the layer under it.",
        "",
        *alloc_table([r for r in records["allocations"] if r["kind"] == "allocations"]),
        "",
        "## Script cost on the server",
        "",
        "`usec_per_call` from `INFO commandstats` after `CONFIG RESETSTAT`:"
        " Redis' own time in the check, per call, through `RedisTier::check`: by"
        " `FCALL` (Redis Functions, the tier's default on Redis 7), by `EVALSHA`"
        " (the tier as a user refused Functions runs it), and a minimal script of"
        " the same algorithm written in the bench (one read and one write with its"
        " expiry per rule; the sliding log also trims, counts and adds; every rule"
        " checked before any is written), measured one after the other in each"
        " round. The target of issue 11 is FCALL ÷ minimal ≤ 1.0. Each round: 200 fresh keys × 10 checks, all admitted"
        " (1 rule: 1,000/min; 3 rules: 100/s, 500/min, 1,000/h, all of the row's"
        " algorithm); rounds go through every case in turn; median over the rounds."
        " Server time is absolute, so each round also times an empty script"
        " (`return 1`) on the same server, and each case is divided by its round's"
        " floor: that ratio carries from one machine to another.",
        "",
        *floor_line(records["script_cost"]),
        *script_table([r for r in records["script_cost"] if r["kind"] == "script_cost"]),
        "",
        *SCRIPT_NOTES,
        *peer_section(load_optional(args.results_dir, "peer_scripts")),
        "## Raw medians",
        "",
        "Nanoseconds per operation of each side over the pairs, and every per-pair"
        " ratio, for the record.",
        "",
        *raw_table(ratios),
        "",
    ]
    # The script's server time by part (benches/src/bin/script-parts.rs).
    parts_md = Path(args.results_dir) / "script_parts.md"
    if parts_md.exists():
        md += [parts_md.read_text(), *PARTS_NOTES]
    else:
        md += ["## Where a check's server time goes", "", "Not run: `script_parts.md` is missing.", ""]
    # The load bench writes its own section (benches/src/bin/redis-load.rs).
    load_md = Path(args.results_dir) / "redis_load.md"
    if load_md.exists():
        md += [load_md.read_text(), *LOAD_NOTES]
    else:
        md += ["## Redis path under load", "", "Not run: `redis_load.md` is missing.", ""]
    baseline = Path(__file__).parent / "redis-load-baseline.md"
    if baseline.exists():
        md += [
            "One run of the load bench before batching existed, kept as measured."
            " Its c = 200 row of A is not a Redis measurement: that version of the"
            " bench left the breaker's slow-call threshold at 40 ms, queueing at"
            " c = 200 tripped it, and most checks were answered by the fallback"
            " (the 'fallbacks' line says how many). Every later run also measures"
            " A1, the limiter with batching off, beside A.",
            "",
            baseline.read_text(),
        ]
    Path(output).write_text("\n".join(md))
    print(f"render.py: wrote {output}: {len(targets) - len(missed)} of {len(targets)} local-tier targets met")


if __name__ == "__main__":
    main()
