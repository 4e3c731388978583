#!/usr/bin/env bash
# Regenerates BENCHMARKS.md at the repository root: builds the benches in
# release, runs each (they start their own redis-server on free loopback ports
# and write JSON lines under the target dir), then renders the report.
#
#   benches/run.sh
#   TIERLIMIT_PEER_SCRIPTS=/path/to/peer-scripts benches/run.sh   # with the peers' scripts
#
# CARGO_TARGET_DIR is honoured; the results land in $CARGO_TARGET_DIR/tierlimit-benches
# (default target/tierlimit-benches).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
scripts/ensure-redis
command -v python3 >/dev/null || { echo "run.sh: python3 renders the report; install it (apt-get install -y python3)" >&2; exit 1; }
# Before minutes of benches, not after them: the peer and load benches need it.
command -v redis-benchmark >/dev/null || { echo "run.sh: redis-benchmark is not on PATH: install it (apt-get install -y redis-tools)" >&2; exit 1; }

out=${CARGO_TARGET_DIR:-$root/target}/tierlimit-benches
rm -rf "$out"
mkdir -p "$out"
export TIERLIMIT_BENCH_OUT=$out

# The commit measured; "modified" when the code differs from it (this run's
# own outputs, the report and the sweep chart, do not count).
git_state=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
if [ -n "$(git status --porcelain --untracked-files=no -- . ':(exclude)BENCHMARKS.md' ':(exclude)benches/redis-load-sweep.svg' 2>/dev/null)" ]; then
    git_state="$git_state with uncommitted changes"
fi
echo "$git_state on $(git rev-parse --abbrev-ref HEAD 2>/dev/null || echo unknown)" > "$out/git.txt"

# Build first, so the bench time below is the benches' alone.
cargo bench -p tierlimit-benches --no-run
cargo build --release -p tierlimit-benches --bin redis-load --bin script-parts --bin peer-scripts

commands=()
start=$(date +%s)
for bench in local breaker allocations script_cost tower; do
    cmd="cargo bench -p tierlimit-benches --bench $bench"
    commands+=("$cmd")
    echo "=== $cmd" >&2
    $cmd
done
# Where a check's server time goes (writes script_parts.md).
cmd="cargo run --release -p tierlimit-benches --bin script-parts"
commands+=("$cmd")
echo "=== $cmd" >&2
$cmd >/dev/null
# Server time per check against the peers' scripts, read from
# $TIERLIMIT_PEER_SCRIPTS (benches/peer-scripts.sh DIR fetches them); without
# them it records "not measured" and exits 0.
cmd="cargo run --release -p tierlimit-benches --bin peer-scripts"
commands+=("${TIERLIMIT_PEER_SCRIPTS:+TIERLIMIT_PEER_SCRIPTS=$TIERLIMIT_PEER_SCRIPTS }$cmd")
echo "=== $cmd" >&2
$cmd
# The load bench (writes redis_load.md and benches/redis-load-sweep.svg).
cmd="cargo run --release -p tierlimit-benches --bin redis-load"
commands+=("$cmd")
echo "=== $cmd" >&2
$cmd >/dev/null
seconds=$(( $(date +%s) - start ))

printf '%s\n' "${commands[@]}" > "$out/commands.txt"
python3 benches/render.py "$out" BENCHMARKS.md --seconds "$seconds"
