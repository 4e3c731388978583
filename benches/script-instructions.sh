#!/usr/bin/env bash
# Redis' instructions per check of tierlimit's Functions library, of the
# minimal script of each algorithm (tierlimit_benches::MINIMAL_SCRIPTS, the
# baseline of benches/script_cost.rs) and of the peers' scripts (see
# benches/src/bin/peer-scripts.rs): a steady measure where the server's time
# per call spreads by a third from sample to sample.
#
# Starts its own redis-server under valgrind's callgrind on a free loopback
# port, loads the library and the minimal scripts (and the peers' scripts
# from $TIERLIMIT_PEER_SCRIPTS, which benches/peer-scripts.sh DIR fetches;
# without it no peer rows), then for each case: warms 1,000 keys with
# redis-benchmark, zeroes the counters, sends 20,000 checks (one per call, or
# 1,250 calls of 16) pipelined 16 deep over the same keys and prints the
# server's instructions per call and per check, and tierlimit's over the
# minimal script's (about 9 minutes in all). A one-rule set is 1,000 per
# hour-long period (or burst 1,000 at 1,000 per second for GCRA and the token
# bucket), so nothing is denied and every window key stays open: the steady
# state of a key in use. (A key's checks come about a second apart under
# valgrind, so a GCRA or token-bucket key of 1,000 per second is full again
# and gone at each of them.) A three-rule set is script_cost's: 100 per
# second, 500 per minute, 1,000 per hour. The minimal scripts take each rule as five
# arguments, as they do in script_cost. Peers' calls carry their own keys and
# arguments, with hour-long durations where they take one.
#
#   benches/script-instructions.sh
#   TIERLIMIT_PEER_SCRIPTS=/path/to/peer-scripts benches/script-instructions.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
for tool in valgrind callgrind_control redis-server redis-cli redis-benchmark python3; do
    command -v "$tool" >/dev/null || {
        echo "script-instructions.sh: needs $tool (apt-get install -y valgrind redis-server redis-tools python3)" >&2
        exit 1
    }
done
cargo build --release -q -p tierlimit-benches --bin library-source
library=$(mktemp)
work=$(mktemp -d)
"${CARGO_TARGET_DIR:-target}/release/library-source" >"$library"
id=$(grep -o "tierlimit_check_[0-9a-f]*" "$library" | head -1 | sed 's/tierlimit_check_//')
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cli() { redis-cli -p "$port" "$@"; }
valgrind --tool=callgrind --callgrind-out-file="$work/cg.out" \
    redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no >"$work/valgrind.log" 2>&1 &
server=$!
trap 'cli shutdown nosave >/dev/null 2>&1 || kill $server 2>/dev/null; rm -rf "$work" "$library"' EXIT
until cli ping >/dev/null 2>&1; do
    kill -0 $server 2>/dev/null || { cat "$work/valgrind.log" >&2; exit 1; }
    sleep 0.3
done
cli -x FUNCTION LOAD REPLACE <"$library" >/dev/null

checks=20000
# measure <checks per call> <label> <command...>
measure() {
    local per_call=$1 label=$2
    shift 2
    local calls=$((checks / per_call))
    redis-benchmark -p "$port" -c 4 -P 16 -r 1000 -n "$calls" "$@" >/dev/null
    callgrind_control -z "$server" >/dev/null 2>&1
    redis-benchmark -p "$port" -c 1 -P 16 -r 1000 -n "$calls" "$@" >/dev/null
    callgrind_control -d "$server" >/dev/null 2>&1
    local dump total
    dump=$(ls -t "$work"/cg.out.* | head -1)
    total=$(grep -E '^(summary|totals):' "$dump" | head -1 | awk '{print $2}')
    rm -f "$dump"
    per_check=$((total / checks))
    printf '%-52s %8d per call %8d per check' "$label" $((total / calls)) "$per_check"
}

# over <tierlimit's per check> <whose> [<tierlimit's per check batched>]:
# ends measure's line with the ratio of tierlimit's instructions per check to
# the check just measured (and of the batched ones').
over() {
    awk -v a="$1" -v b="$per_check" -v whose="$2" -v batched="${3:-}" 'BEGIN {
        printf "   tierlimit / %s %.2f", whose, a / b
        if (batched != "") printf ", batched %.2f", batched / b
        printf "\n"
    }'
}

batch() {
    local suffix=$1 rule=$2 keys=() costs=()
    for _ in $(seq 16); do
        keys+=("tl:{u:__rand_int__}:b:$suffix")
        costs+=(1)
    done
    echo FCALL "tierlimit_check_batch_$id" 16 "${keys[@]}" 16 1 42 0 1 "$rule" "${costs[@]}"
}

# minimal_args <rule>...: each rule's five numbers apart, as the minimal scripts take them.
minimal_args() {
    local rule
    for rule in "$@"; do
        echo "${rule//:/ }"
    done
}

declare -a one_per_call batched
for alg in "GCRA g 1" "TokenBucket t 2" "SlidingLog l 3" "SlidingWindow s 4" "FixedWindow f 5"; do
    set -- $alg
    name=$1 tag=$2 code=$3
    case $code in
    1 | 2) one="$code:1000:1000000:1000:0" ;;
    *) one="$code:1000:3600000000:1000:0" ;;
    esac
    three=("$code:100:1000000:100:0" "$code:500:60000000:500:0" "$code:1000:3600000000:1000:0")
    minimal=$(cli -x SCRIPT LOAD < <("${CARGO_TARGET_DIR:-target}/release/library-source" minimal "$code"))
    k="tl:{u:__rand_int__}"
    measure 1 "tierlimit $name, one check per call" \
        FCALL "tierlimit_check_$id" 1 "$k:o:$tag" 0 1 42 "$one"
    echo
    ours=$per_check
    one_per_call[$code]=$per_check
    # shellcheck disable=SC2046
    measure 1 "minimal $name, one check per call" \
        EVALSHA "$minimal" 1 "$k:m:$tag" 0 1 42 $(minimal_args "$one")
    over "$ours" minimal
    if [ "$code" != 3 ]; then
        # shellcheck disable=SC2046
        measure 16 "tierlimit $name, batches of 16" $(batch "$tag" "$one")
        echo
        batched[$code]=$per_check
    fi
    measure 1 "tierlimit $name, 3 rules, one check per call" \
        FCALL "tierlimit_check_$id" 3 "$k:o:${tag}1" "$k:o:${tag}2" "$k:o:${tag}3" 0 1 42 "${three[@]}"
    echo
    ours=$per_check
    # shellcheck disable=SC2046
    measure 1 "minimal $name, 3 rules, one check per call" \
        EVALSHA "$minimal" 3 "$k:m:${tag}1" "$k:m:${tag}2" "$k:m:${tag}3" 0 1 42 \
        $(minimal_args "${three[@]}")
    over "$ours" minimal
done

dir=${TIERLIMIT_PEER_SCRIPTS:-}
if [ -z "$dir" ]; then
    echo "(peers not measured: TIERLIMIT_PEER_SCRIPTS names no directory; benches/peer-scripts.sh DIR fetches their scripts)"
    exit 0
fi
sha() { cli -x SCRIPT LOAD <"$dir/$1"; }
hour_window=$(( $(date +%s) / 3600 ))
now_ms=$(( $(date +%s) * 1000 ))
measure 1 "redis_rate GCRA" EVALSHA "$(sha redis_rate_gcra.lua)" \
    1 "rate:__rand_int__" 1000 1000 1 1
over "${one_per_call[1]}" peer "${batched[1]}"
measure 1 "Spring Cloud Gateway token bucket" EVALSHA "$(sha scg_token_bucket.lua)" \
    2 "request_rate_limiter.{p.__rand_int__}.tokens" "request_rate_limiter.{p.__rand_int__}.timestamp" 1000 1000 "" 1
over "${one_per_call[2]}" peer "${batched[2]}"
measure 1 "upstash sliding window" EVALSHA "$(sha upstash_sliding_window.lua)" \
    3 "@upstash/ratelimit:__rand_int__:$hour_window" "@upstash/ratelimit:__rand_int__:$((hour_window - 1))" "" 1000 "$now_ms" 3600000 1
over "${one_per_call[4]}" peer "${batched[4]}"
measure 1 "rate-limiter-flexible fixed window" EVALSHA "$(sha rlflexible_fixed_window.lua)" \
    1 "rlflx:__rand_int__" 1 3600
over "${one_per_call[5]}" peer "${batched[5]}"
