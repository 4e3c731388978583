#!/usr/bin/env bash
# Runs the chaos suite:
#
#   chaos-tests/run.sh [--driver docker|process] [--scenario NAME[,NAME..]] [--quick] [chaos options..]
#
# Every argument but --driver goes to the controller (`chaos --help`). The
# report lands in chaos-tests/report/. See chaos-tests/README.md.
#
# CHAOS_BIN_DIR (optional): a directory holding chaos, chaos-app and
# chaos-proxy already built (e.g. target/debug after `scripts/test`, which
# builds them); they run from there and nothing is built. Unset, run.sh builds
# them: the controller and the process driver's apps in the dev profile, the
# docker images' in release.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)

usage() {
    echo "usage: chaos-tests/run.sh [--driver docker|process] [--scenario NAME[,NAME..]] [--quick] [chaos options..]" >&2
    exit 2
}

driver=process
args=()
while [ $# -gt 0 ]; do
    case "$1" in
        --driver) [ $# -ge 2 ] || usage; driver=$2; shift 2 ;;
        --driver=*) driver=${1#--driver=}; shift ;;
        -h | --help) usage ;;
        *) args+=("$1"); shift ;;
    esac
done

if [ -n "${CHAOS_BIN_DIR:-}" ]; then
    # Absolute, so it holds after the `cd` below and in images/build.sh.
    [ -d "$CHAOS_BIN_DIR" ] ||
        { echo "run.sh: CHAOS_BIN_DIR=$CHAOS_BIN_DIR is not a directory" >&2; exit 2; }
    CHAOS_BIN_DIR=$(cd "$CHAOS_BIN_DIR" && pwd)
    for bin in chaos chaos-app chaos-proxy; do
        [ -x "$CHAOS_BIN_DIR/$bin" ] ||
            { echo "run.sh: $bin not found in CHAOS_BIN_DIR=$CHAOS_BIN_DIR (cargo build -p chaos-tests --bins builds it)" >&2; exit 2; }
    done
    export CHAOS_BIN_DIR
fi

cd "$root"

# The controller, built first unless CHAOS_BIN_DIR has it. Every binary: the
# controller starts chaos-app from beside itself, and `cargo run --bin chaos`
# alone would leave a stale one there. The dev profile is optimised (see
# Cargo.toml). Run by path, not `cargo run`: `cargo run -p chaos-tests`
# resolves the features of chaos-tests alone, which differ from a workspace
# build's, and would rebuild much of the tree over the binaries given.
if [ -n "${CHAOS_BIN_DIR:-}" ]; then
    chaos=$CHAOS_BIN_DIR/chaos
else
    cargo build -p chaos-tests --bins
    target=${CARGO_TARGET_DIR:-target}
    case "$target" in /*) ;; *) target=$root/$target ;; esac
    chaos=$target/debug/chaos
fi

# The controller runs in a process group of its own (setsid), waited for in
# the background: bash runs a trap only once its foreground command ends, so
# a controller in the foreground would run on for minutes after a SIGTERM,
# SIGHUP or Ctrl-C. On any, the whole group goes (the controller, its redis-servers
# and apps, or its compose commands), then the docker driver's cleanup runs.
controller=
run_controller() {
    if command -v setsid >/dev/null; then
        setsid "$chaos" "$@" &
    else
        "$chaos" "$@" &
    fi
    controller=$!
    wait "$controller"
}
stop_controller() {
    if [ -n "$controller" ]; then
        # CONT after TERM: a redis-server the scenario paused (SIGSTOP)
        # takes its TERM only once it runs again.
        kill -TERM -- "-$controller" 2>/dev/null || kill -TERM "$controller" 2>/dev/null || true
        kill -CONT -- "-$controller" 2>/dev/null || true
        wait "$controller" 2>/dev/null || true
    fi
    exit "$1"
}
trap 'stop_controller 129' HUP
trap 'stop_controller 130' INT
trap 'stop_controller 143' TERM

case "$driver" in
    process)
        run_controller --driver process ${args[@]+"${args[@]}"}
        ;;

    docker)
        # Images: CHAOS_IMAGES=local (the default) builds them from this
        # machine's redis-server, chaos-app and chaos-proxy (images/build.sh;
        # no registry needed). CHAOS_IMAGES=registry uses CHAOS_REDIS_IMAGE
        # and CHAOS_APP_IMAGE as set, or the compose file's defaults
        # (redis:7.4, rust:1.88 building both programs from this workspace).
        command -v docker >/dev/null || { echo "run.sh: docker is not installed: apt-get install -y docker.io docker-compose (Debian/Ubuntu), or use --driver process, which needs only redis-server" >&2; exit 2; }
        docker info >/dev/null 2>&1 || { echo "run.sh: the docker engine does not answer (docker info): start it (systemctl start docker, or dockerd &), or use --driver process" >&2; exit 2; }
        if [ -z "${CHAOS_COMPOSE:-}" ]; then
            if docker compose version >/dev/null 2>&1; then
                CHAOS_COMPOSE="docker compose"
            elif docker-compose version >/dev/null 2>&1; then
                CHAOS_COMPOSE=docker-compose
            else
                echo "run.sh: neither \`docker compose\` nor \`docker-compose\` works; install one or set CHAOS_COMPOSE" >&2
                exit 2
            fi
        fi
        export CHAOS_COMPOSE
        echo "run.sh: compose command: $CHAOS_COMPOSE" >&2

        # The driver names its projects ${CHAOS_PROJECT}x<n>; if the controller
        # dies without cleaning up (Ctrl-C, SIGKILL), remove what it left.
        # The pid and a random number: runs in two containers of one CI host
        # may share a pid, and one's cleanup would remove the other's.
        export CHAOS_PROJECT=tlchaos$$r$RANDOM
        cleanup() {
            local rc=$? id project
            set +e
            docker ps -a --filter label=com.docker.compose.project \
                --format '{{.ID}} {{.Label "com.docker.compose.project"}}' |
                while read -r id project; do
                    [[ $project =~ ^${CHAOS_PROJECT}x[0-9]+$ ]] && docker rm -f -v "$id" >/dev/null || true
                done
            docker network ls --filter label=com.docker.compose.project \
                --format '{{.ID}} {{.Label "com.docker.compose.project"}}' |
                while read -r id project; do
                    [[ $project =~ ^${CHAOS_PROJECT}x[0-9]+$ ]] && docker network rm "$id" >/dev/null || true
                done
            exit "$rc"
        }
        trap cleanup EXIT

        case "${CHAOS_IMAGES:-local}" in
            local)
                export CHAOS_REDIS_IMAGE=${CHAOS_LOCAL_REDIS_IMAGE:-tierlimit-chaos-redis:local}
                export CHAOS_APP_IMAGE=${CHAOS_LOCAL_APP_IMAGE:-tierlimit-chaos-app:local}
                CHAOS_LOCAL_REDIS_IMAGE=$CHAOS_REDIS_IMAGE CHAOS_LOCAL_APP_IMAGE=$CHAOS_APP_IMAGE \
                    "$here/images/build.sh"
                # Compose must never pull these: they exist only here.
                export CHAOS_PULL_POLICY=never
                ;;
            registry)
                export CHAOS_REDIS_IMAGE=${CHAOS_REDIS_IMAGE:-redis:7.4}
                export CHAOS_APP_IMAGE=${CHAOS_APP_IMAGE:-rust:1.88}
                export CHAOS_PULL_POLICY=${CHAOS_PULL_POLICY:-if_not_present}
                # Compose pulls a missing image itself (here, and for Redis
                # when the first scenario starts). A builder image compiles
                # chaos-app and chaos-proxy in each app and proxy container:
                # compile once now into the shared cache so no scenario's
                # containers spend their lead time on it.
                compose=($CHAOS_COMPOSE -f "$here/docker-compose.yml" -p "${CHAOS_PROJECT}x0")
                echo "run.sh: building chaos-app and chaos-proxy in $CHAOS_APP_IMAGE (once; cached in target/chaos-docker)" >&2
                CHAOS_DIR=$(mktemp -d) "${compose[@]}" run --rm --no-deps app0 --build-only
                "${compose[@]}" down -v --remove-orphans -t 1 >/dev/null 2>&1
                ;;
            *)
                echo "run.sh: CHAOS_IMAGES must be local or registry, not ${CHAOS_IMAGES}" >&2
                exit 2
                ;;
        esac
        echo "run.sh: images: $CHAOS_REDIS_IMAGE, $CHAOS_APP_IMAGE (pull_policy $CHAOS_PULL_POLICY)" >&2

        # Not `exec`: the EXIT trap must run after the controller.
        run_controller --driver docker ${args[@]+"${args[@]}"}
        ;;

    *)
        echo "run.sh: unknown driver \"$driver\" (docker or process)" >&2
        usage
        ;;
esac
