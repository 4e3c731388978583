#!/usr/bin/env bash
# Builds the chaos suite's two images from this machine's own binaries, with no
# registry and no Dockerfile (a `FROM` or `# syntax=` line would pull):
#
#   tierlimit-chaos-redis:local  the host's redis-server + the libraries ldd lists
#   tierlimit-chaos-app:local    the release chaos-app and chaos-proxy + /bin/sh +
#                                their libraries (the app and proxy containers)
#
# Each rootfs is packed as a reproducible tar and imported with `docker import`.
# The tar's sha256 is stored in a label; when the image with that tag already
# carries the same hash nothing is imported, so running this twice is cheap.
# The tags are never `latest`: compose would try to pull a missing `latest`.
#
# Environment (all optional):
#   CHAOS_LOCAL_REDIS_IMAGE  tag of the Redis image  (tierlimit-chaos-redis:local)
#   CHAOS_LOCAL_APP_IMAGE    tag of the app image    (tierlimit-chaos-app:local)
#   CHAOS_REDIS_SERVER       redis-server to package (the one on PATH)
#   CHAOS_BIN_DIR            a directory with chaos-app and chaos-proxy to package
#                            instead of running `cargo build --release -p
#                            chaos-tests --bin chaos-app --bin chaos-proxy`
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
redis_tag=${CHAOS_LOCAL_REDIS_IMAGE:-tierlimit-chaos-redis:local}
app_tag=${CHAOS_LOCAL_APP_IMAGE:-tierlimit-chaos-app:local}
label=org.tierlimit.chaos.rootfs-sha256

die() { echo "build.sh: $*" >&2; exit 1; }

for tag in "$redis_tag" "$app_tag"; do
    case "$tag" in
        *:*) ;;
        *) die "tag $tag has no explicit version; use name:local (compose pulls a missing :latest)" ;;
    esac
    case "$tag" in
        *:latest) die "tag $tag: use anything but latest (compose pulls a missing :latest)" ;;
    esac
done
for tool in docker ldd tar sha256sum; do
    command -v "$tool" >/dev/null || die "$tool is not installed"
done
docker info >/dev/null 2>&1 || die "the docker engine does not answer (docker info failed)"

redis_server=${CHAOS_REDIS_SERVER:-$(command -v redis-server || true)}
[ -n "$redis_server" ] && [ -x "$redis_server" ] ||
    die "redis-server not found: install it (apt-get install redis-server) or set CHAOS_REDIS_SERVER"
shell=$(readlink -f /bin/sh)

if [ -n "${CHAOS_BIN_DIR:-}" ]; then
    bin_dir=$CHAOS_BIN_DIR
else
    echo "build.sh: cargo build --release -p chaos-tests --bin chaos-app --bin chaos-proxy" >&2
    (cd "$root" && cargo build --release -p chaos-tests --bin chaos-app --bin chaos-proxy) >&2
    target=${CARGO_TARGET_DIR:-$root/target}
    case "$target" in /*) ;; *) target=$root/$target ;; esac
    bin_dir=$target/release
fi
for bin in chaos-app chaos-proxy; do
    [ -x "$bin_dir/$bin" ] || die "$bin not found in $bin_dir"
done

work=$(mktemp -d "${TMPDIR:-/tmp}/tierlimit-chaos-images.XXXXXX")
trap 'rm -rf "$work"' EXIT

# Copies `src` (following links) to `rootfs/dest` with mode `mode`.
put() {
    local rootfs=$1 src=$2 dest=$3 mode=$4
    mkdir -p "$rootfs$(dirname "$dest")"
    cp -L "$src" "$rootfs$dest"
    chmod "$mode" "$rootfs$dest"
}

# Copies every shared library `ldd` lists for `bin`, and the dynamic loader,
# each to the exact path ldd prints (the loader's path is compiled into the
# binary, the libraries are found in the loader's default directories).
put_libs() {
    local rootfs=$1 bin=$2 lib out
    out=$(ldd "$bin") || die "ldd $bin failed (not a dynamic executable?)"
    if grep -q 'not found' <<<"$out"; then
        die "ldd $bin: missing libraries:"$'\n'"$(grep 'not found' <<<"$out")"
    fi
    while read -r lib; do
        [ -n "$lib" ] && put "$rootfs" "$lib" "$lib" 0755
    done < <(awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' <<<"$out")
}

# The files every image needs: users, name resolution (glibc 2.34+ has the
# files and dns NSS modules built in), /tmp. Docker bind-mounts its own
# /etc/hosts, /etc/resolv.conf and /etc/hostname over the empty ones.
base() {
    local rootfs=$1
    mkdir -p "$rootfs"/{etc,tmp,usr/local/bin}
    chmod 1777 "$rootfs/tmp"
    printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$rootfs/etc/passwd"
    printf 'root:x:0:\nnogroup:x:65534:\n' >"$rootfs/etc/group"
    printf 'hosts: files dns\n' >"$rootfs/etc/nsswitch.conf"
    : >"$rootfs/etc/hosts"
    : >"$rootfs/etc/resolv.conf"
    : >"$rootfs/etc/hostname"
}

# Packs `rootfs` reproducibly and imports it as `tag` unless that image already
# has the same content; prints one line saying which.
import() {
    local rootfs=$1 tag=$2 what=$3
    shift 3
    local tarball=$work/$(basename "$rootfs").tar sha old size
    tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --format=gnu \
        -C "$rootfs" -cf "$tarball" .
    sha=$(sha256sum "$tarball" | cut -d' ' -f1)
    size=$(du -h "$tarball" | cut -f1)
    old=$(docker image inspect -f '{{.Id}} {{index .Config.Labels "'"$label"'"}}' "$tag" 2>/dev/null || true)
    if [ "${old#* }" = "$sha" ]; then
        echo "up to date: $tag (${old%% *}, $size) $what"
        return
    fi
    local id
    id=$(docker import "$@" --change "LABEL $label=$sha" -m "tierlimit chaos: $what" "$tarball" "$tag")
    echo "built:      $tag ($id, $size) $what"
    # The image the tag pointed at before is unnamed now: remove it, unless a
    # container still uses it.
    if [ -n "$old" ] && [ "${old%% *}" != "$id" ]; then
        docker image rm "${old%% *}" >/dev/null 2>&1 || true
    fi
}

env_path='ENV PATH=/usr/local/bin:/usr/local/sbin:/usr/bin:/usr/sbin:/bin:/sbin'

# Redis. redis-server is often a link to redis-check-rdb (one binary that acts
# by its name): copy the real file under the name redis-server.
r=$work/redis
base "$r"
mkdir -p "$r/data"
put "$r" "$redis_server" /usr/local/bin/redis-server 0755
put_libs "$r" "$redis_server"
import "$r" "$redis_tag" "$("$redis_server" --version | cut -d' ' -f1-3) from $redis_server" \
    --change "$env_path" \
    --change 'WORKDIR /data' \
    --change 'EXPOSE 6379' \
    --change 'CMD ["redis-server", "--save", "", "--appendonly", "no", "--protected-mode", "no"]'

# The app and the proxy. /bin/sh runs images/app-entrypoint.sh, the entrypoint
# compose uses for this image and for an official Rust image alike.
a=$work/app
base "$a"
for bin in chaos-app chaos-proxy; do
    put "$a" "$bin_dir/$bin" /usr/local/bin/$bin 0755
    put_libs "$a" "$bin_dir/$bin"
done
mkdir -p "$a/bin"
put "$a" "$shell" /bin/sh 0755
put_libs "$a" "$shell"
put "$a" "$here/app-entrypoint.sh" /usr/local/bin/chaos-app-entrypoint 0755
import "$a" "$app_tag" "chaos-app and chaos-proxy from $bin_dir" \
    --change "$env_path" \
    --change 'WORKDIR /chaos' \
    --change 'ENTRYPOINT ["/bin/sh", "/usr/local/bin/chaos-app-entrypoint"]'
