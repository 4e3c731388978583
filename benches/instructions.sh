#!/usr/bin/env bash
# Instructions per check of the local path against governor's keyed check:
# a steady measure where timings drift (see benches/src/bin/local-instructions.rs).
# Runs each side under valgrind's cachegrind for 100,000 and 300,000 checks
# and prints (difference) / 200,000, and each side's ratio to governor's.
#
#   benches/instructions.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
command -v valgrind >/dev/null || {
    echo "instructions.sh: needs valgrind (apt-get install -y valgrind)" >&2
    exit 1
}
cargo build --release -q -p tierlimit-benches --bin local-instructions
bin=${CARGO_TARGET_DIR:-target}/release/local-instructions
count() {
    valgrind --tool=cachegrind --cache-sim=no --cachegrind-out-file=/dev/null "$bin" "$1" "$2" 2>&1 |
        awk '/I *refs:/ { gsub(",", "", $NF); print $NF }'
}
per_check() {
    local low high
    low=$(count "$1" 100000)
    high=$(count "$1" 300000)
    echo $(( (high - low) / 200000 ))
}
governor=$(per_check governor)
printf '%-12s %6s instructions per check\n' governor "$governor"
for side in fallback fail-open fail-closed; do
    n=$(per_check "$side")
    printf '%-12s %6s instructions per check, %s x governor\n' "$side" "$n" \
        "$(awk -v a="$n" -v b="$governor" 'BEGIN { printf "%.2f", a / b }')"
done
