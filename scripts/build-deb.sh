#!/usr/bin/env bash
# Builds the Debian package of the module and the CLI with dpkg-deb (no debhelper, no
# Rust toolchain needed to install it):
#
#   scripts/build-deb.sh --so target/release/libredis_lock.so \
#       --cli target/release/redis-lock --out target/dist
#
# -> target/dist/redis-lock_<version>_<arch>.deb, holding
#   /usr/lib/redis/modules/redis-lock.so      the module (stripped)
#   /etc/redis/modules/redis-lock.conf        `loadmodule` of it (a conffile): add
#                                             `include /etc/redis/modules/redis-lock.conf`
#                                             to redis.conf, or start a server with it
#   /usr/bin/redis-lock                       the CLI (stripped)
#   /usr/share/man/man1/redis-lock.1.gz       its man page (docs/man/redis-lock.1)
#   /usr/share/redis-lock/redis-exporter-lock.lua   INFO lock for prometheus-redis-exporter
#   /usr/share/redis-lock/grafana/redis-lock.json    a dashboard of `redis-lock metrics`
#   /usr/share/doc/redis-lock/{copyright,README.Debian,MONITORING.md}
# Depends are read from the binaries (libc6 >= the newest GLIBC_ symbol, libgcc-s1).
# `make dist-deb` calls it with the release builds; client/tests/dist.rs too.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
so="" cli="" out="" version="" compress=(-Zxz)
while [ $# -gt 0 ]; do
    case "$1" in
        --so) so=$2; shift 2 ;;
        --cli) cli=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        --version) version=$2; shift 2 ;;
        # For tests: the same package, compressed faster (gzip -1 instead of xz -6).
        --fast) compress=(-Zgzip -z1); shift ;;
        *) echo "build-deb.sh: unknown argument $1" >&2; exit 64 ;;
    esac
done
[ -f "$so" ] && [ -f "$cli" ] && [ -n "$out" ] || {
    echo "usage: build-deb.sh --so MODULE.so --cli redis-lock --out DIR [--version V] [--fast]" >&2
    exit 64
}
for tool in dpkg-deb dpkg readelf objdump; do
    command -v "$tool" >/dev/null || { echo "build-deb.sh: $tool is missing" >&2; exit 69; }
done
if [ -z "$version" ]; then
    version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$root/Cargo.toml" | head -n1)
fi
arch=$(dpkg --print-architecture)

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
pkg=$stage/redis-lock
# Executable: Redis 7 refuses to load a module without the execute permission.
install -D -m 0755 "$so" "$pkg/usr/lib/redis/modules/redis-lock.so"
install -D -m 0755 "$cli" "$pkg/usr/bin/redis-lock"
if command -v strip >/dev/null; then
    # Keeps the dynamic symbols (RedisModule_OnLoad); drops the debug info of the
    # release profile (debug = 1), which is most of the size.
    strip --strip-unneeded "$pkg/usr/lib/redis/modules/redis-lock.so" "$pkg/usr/bin/redis-lock"
else
    echo "build-deb.sh: strip (binutils) not found: the binaries keep their debug info" >&2
fi

# The man page, compressed as Debian's policy asks (gzip -9n: no name, no time stamp).
install -d -m 0755 "$pkg/usr/share/man/man1"
gzip -9n < "$root/docs/man/redis-lock.1" > "$pkg/usr/share/man/man1/redis-lock.1.gz"
chmod 0644 "$pkg/usr/share/man/man1/redis-lock.1.gz"
# Monitoring (docs/MONITORING.md): the exporter script and the Grafana dashboard.
install -D -m 0644 "$root/scripts/monitoring/redis-exporter-lock.lua" \
    "$pkg/usr/share/redis-lock/redis-exporter-lock.lua"
install -D -m 0644 "$root/docs/grafana/redis-lock.json" \
    "$pkg/usr/share/redis-lock/grafana/redis-lock.json"

install -d -m 0755 "$pkg/etc/redis/modules"
cat > "$pkg/etc/redis/modules/redis-lock.conf" <<'EOF'
# redis-lock: native lock commands (LOCK.ACQUIRE, LOCK.RELEASE, LOCK.EXTEND, LOCK.INFO,
# LOCK.FORCERELEASE) for Redis 7.0+ and Valkey 8.
#
# To load it into your server, add this line to /etc/redis/redis.conf and restart Redis
# (sudo systemctl restart redis-server):
#
#   include /etc/redis/modules/redis-lock.conf
#
# or start a server of its own with this file as its configuration:
#
#   redis-server /etc/redis/modules/redis-lock.conf --port 6399
loadmodule /usr/lib/redis/modules/redis-lock.so
EOF
chmod 0644 "$pkg/etc/redis/modules/redis-lock.conf"

doc=$pkg/usr/share/doc/redis-lock
install -d -m 0755 "$doc"
{
    echo "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/"
    echo "Upstream-Name: redis-lock"
    echo
    echo "Files: *"
    echo "Copyright: 2026 The redis-lock contributors"
    echo "License: MIT"
    sed -e 's/^$/./' -e 's/^/ /' "$root/LICENSE"
} > "$doc/copyright"
cat > "$doc/README.Debian" <<'EOF'
redis-lock for Debian
=====================

This package holds the redis-lock module and the redis-lock command-line tool.

- /usr/lib/redis/modules/redis-lock.so: the module. Nothing loads it by itself: add
      include /etc/redis/modules/redis-lock.conf
  to /etc/redis/redis.conf and restart Redis (sudo systemctl restart redis-server).
  Check with: redis-cli MODULE LIST
- /usr/bin/redis-lock: locks from the shell and cron, like flock(1) across machines
  (man redis-lock, redis-lock --help). It is in the same package so that one file
  serves the Redis host and the hosts that run jobs; it needs nothing but libc.
- Monitoring (MONITORING.md here): `redis-lock metrics` serves the module's counters
  and per-lock waiting figures to Prometheus; /usr/share/redis-lock/grafana/ has a
  dashboard of them. prometheus-redis-exporter exports the counters with
      -script /usr/share/redis-lock/redis-exporter-lock.lua

Removing the package does not edit redis.conf: remove the include line first.
EOF
install -m 0644 "$root/docs/MONITORING.md" "$doc/MONITORING.md"
chmod 0644 "$doc/copyright" "$doc/README.Debian"

# Depends from what the binaries link.
glibc=$(objdump -T "$pkg/usr/lib/redis/modules/redis-lock.so" "$pkg/usr/bin/redis-lock" \
    | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -Vu | tail -n1)
depends="libc6 (>= $glibc)"
needed=$(readelf -d "$pkg/usr/lib/redis/modules/redis-lock.so" "$pkg/usr/bin/redis-lock" \
    | sed -n 's/.*NEEDED.*\[\(.*\)\]/\1/p' | sort -u)
for lib in $needed; do
    case "$lib" in
        libc.so.6 | libm.so.6 | ld-linux*.so.* | libdl.so.2 | libpthread.so.0 | librt.so.1) ;;
        libgcc_s.so.1) depends="$depends, libgcc-s1" ;;
        *) echo "build-deb.sh: no Debian package known for $lib" >&2; exit 69 ;;
    esac
done

install -d -m 0755 "$pkg/DEBIAN"
size=$(du -sk --exclude=DEBIAN "$pkg" | cut -f1)
cat > "$pkg/DEBIAN/control" <<EOF
Package: redis-lock
Version: $version
Architecture: $arch
Maintainer: The redis-lock contributors <noreply@redis-lock.invalid>
Installed-Size: $size
Depends: $depends
Suggests: redis-server (>= 5:7.0)
Section: database
Priority: optional
Description: native distributed-lock commands for Redis and Valkey
 A server module that adds LOCK.ACQUIRE, LOCK.RELEASE, LOCK.EXTEND, LOCK.INFO and
 LOCK.FORCERELEASE: owner-checked release, leases, fencing tokens, FIFO waiting,
 shared (read-write) and counted (semaphore) locks, replication and cluster support.
 Also the redis-lock command-line tool (flock(1) across machines, for cron).
 .
 Load the module with "include /etc/redis/modules/redis-lock.conf" in redis.conf.
EOF
echo "/etc/redis/modules/redis-lock.conf" > "$pkg/DEBIAN/conffiles"
(cd "$pkg" && find usr etc -type f -print0 | sort -z | xargs -0 md5sum) > "$pkg/DEBIAN/md5sums"
chmod 0644 "$pkg/DEBIAN/control" "$pkg/DEBIAN/conffiles" "$pkg/DEBIAN/md5sums"

mkdir -p "$out"
deb="$out/redis-lock_${version}_${arch}.deb"
dpkg-deb --root-owner-group "${compress[@]}" --build "$pkg" "$deb" >/dev/null
echo "$deb"
