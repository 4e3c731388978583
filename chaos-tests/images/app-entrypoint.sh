#!/bin/sh
# Entrypoint of the proxy and app containers:
#   app-entrypoint.sh chaos-app /chaos/<plan>.json
#   app-entrypoint.sh chaos-proxy --listen .. --upstream .. --control ..
#   app-entrypoint.sh --build-only
#
# * In the local image (images/build.sh) both programs are on PATH: run one.
# * In an official Rust image (CHAOS_APP_IMAGE=rust:1.88, the compose default)
#   build them from the workspace mounted read-only at $CHAOS_SRC first.
#   The target directory and cargo's registry live in a bind-mounted cache, so
#   only the first container builds for real; run.sh builds once before the
#   suite (`app-entrypoint.sh --build-only`) so no scenario waits for it.
# Plain POSIX sh: the local image's /bin/sh is dash.
set -eu

prog=${1:-}
case "$prog" in
    chaos-app | chaos-proxy | --build-only) ;;
    *)
        echo "app-entrypoint: usage: app-entrypoint.sh chaos-app|chaos-proxy ARGS.. | --build-only" >&2
        exit 2
        ;;
esac
shift

if command -v chaos-app >/dev/null 2>&1 && command -v chaos-proxy >/dev/null 2>&1; then
    [ "$prog" = --build-only ] && exit 0
    exec "$prog" "$@"
fi

command -v cargo >/dev/null 2>&1 || {
    echo "app-entrypoint: neither chaos-app and chaos-proxy nor cargo is on PATH in this image" >&2
    exit 127
}
src=${CHAOS_SRC:-/src}
cache=${CHAOS_CARGO_CACHE:-/cargo-cache}
[ -f "$src/Cargo.toml" ] || {
    echo "app-entrypoint: no workspace at $src (mount the repository there)" >&2
    exit 2
}
export CARGO_TARGET_DIR="$cache/target"
# Keep the registry in the cache too; CARGO_HOME's binaries stay in the image.
mkdir -p "$cache/registry"
if [ -n "${CARGO_HOME:-}" ] && [ ! -L "$CARGO_HOME/registry" ] && [ -w "$CARGO_HOME" ]; then
    rm -rf "$CARGO_HOME/registry"
    ln -s "$cache/registry" "$CARGO_HOME/registry"
fi
# Containers start together: cargo's lock on the target directory makes the
# others wait for the first build and then find it fresh.
cargo build --release --locked --manifest-path "$src/Cargo.toml" -p chaos-tests \
    --bin chaos-app --bin chaos-proxy >&2

if [ "$prog" = --build-only ]; then
    exit 0
fi
exec "$CARGO_TARGET_DIR/release/$prog" "$@"
