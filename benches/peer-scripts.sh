#!/usr/bin/env bash
# Puts the four peer scripts the `peer-scripts` bench compares against into a
# directory outside the repository (they are other projects' code and are not
# committed here), each taken from a pinned commit of its project:
#
#   benches/peer-scripts.sh /work/peer-scripts
#   TIERLIMIT_PEER_SCRIPTS=/work/peer-scripts cargo run --release -p tierlimit-benches --bin peer-scripts
#
# It clones each repository from GitHub, unless PEER_CLONES names a directory
# that already holds clones as <owner>/<name> (e.g. PEER_CLONES=~/src).
# The scripts that live inside a source file (a Go raw string, a TypeScript or
# JavaScript template literal) are cut out of it and written as the string's
# value. Which file comes from where is listed in the bench's docs
# (benches/src/bin/peer-scripts.rs) and below.
set -euo pipefail
out=${1:?usage: benches/peer-scripts.sh OUT_DIR}
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# repo <owner/name> <commit>: a checkout-free clone at <commit>; prints its git dir.
repo() {
    local name=$1 commit=$2 dir
    if [ -n "${PEER_CLONES:-}" ] && [ -e "$PEER_CLONES/$1" ]; then
        dir=$PEER_CLONES/$1
    else
        dir=$work/${name//\//+}
        git clone --quiet --bare --filter=blob:none "https://github.com/$name" "$dir" >&2
    fi
    git -C "$dir" cat-file -e "$commit^{commit}" || {
        echo "peer-scripts.sh: $name has no commit $commit" >&2
        exit 1
    }
    echo "$dir"
}

# go-redis/redis_rate v10, lua.go: the raw string of `var allowN` (GCRA).
d=$(repo go-redis/redis_rate 8eadf45ee4d9d7a53189c2a968ead40521a76322)
git -C "$d" show 8eadf45ee4d9d7a53189c2a968ead40521a76322:lua.go |
    awk '/^var allowN = redis.NewScript\(`/ {on=1; next} on && /^`\)/ {exit} on' \
    > "$out/redis_rate_gcra.lua"

# spring-cloud/spring-cloud-gateway, the token bucket script as shipped.
d=$(repo spring-cloud/spring-cloud-gateway 5227205c743d6d2b743bedf2f58cc76c65ca7408)
git -C "$d" show 5227205c743d6d2b743bedf2f58cc76c65ca7408:spring-cloud-gateway-server-webflux/src/main/resources/META-INF/scripts/request_rate_limiter.lua \
    > "$out/scg_token_bucket.lua"

# upstash/ratelimit-js 1.1.2, src/lua-scripts/single.ts: the template literal
# `slidingWindowLimitScript` (single region).
d=$(repo upstash/ratelimit-js 5b5448a5f0bae809cd624a7c639771a8b2e227cb)
git -C "$d" show 5b5448a5f0bae809cd624a7c639771a8b2e227cb:src/lua-scripts/single.ts |
    awk '/^export const slidingWindowLimitScript = `/ {on=1; next} on && /^`;/ {exit} on' \
    > "$out/upstash_sliding_window.lua"

# animir/node-rate-limiter-flexible 11.1.0, lib/RateLimiterRedis.js: the
# template literal `incrTtlLuaScript`; its lines end in `\`, a JavaScript line
# continuation, so the string is one line: joined here the same way.
d=$(repo animir/node-rate-limiter-flexible 3c9c826248cd470960740c89e25a1277dc98fbf4)
git -C "$d" show 3c9c826248cd470960740c89e25a1277dc98fbf4:lib/RateLimiterRedis.js |
    awk '/^const incrTtlLuaScript = `/ {on=1; sub(/^const incrTtlLuaScript = `/, ""); }
         on && /^`;/ {exit}
         on { if (sub(/\\$/, "")) printf "%s", $0; else print }' \
    > "$out/rlflexible_fixed_window.lua"

for f in redis_rate_gcra scg_token_bucket upstash_sliding_window rlflexible_fixed_window; do
    [ -s "$out/$f.lua" ] || { echo "peer-scripts.sh: $out/$f.lua came out empty" >&2; exit 1; }
done
ls -l "$out"
