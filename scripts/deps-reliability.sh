#!/usr/bin/env bash
# Installs what the reliability runs (make reliability / reliability-short) need on top of
# scripts/deps.sh, on Debian 12, as root. Idempotent: installs only what is missing.
#
#   Debian packages: nftables (link cuts), iproute2 (ip netns), valgrind (memory run),
#                    gcc + libc6-dev (the LD_PRELOAD clock shim), procps.
#   --fuzz           also installs cargo-fuzz from crates.io (only the full run uses it).
#
# Then it compiles the clock shim (scripts/reliability/clockshift.c) into
# target/reliability/libclockshift.so when the source is newer than the library.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export DEBIAN_FRONTEND=noninteractive
log() { printf '[deps-reliability] %s\n' "$*"; }

want_fuzz=0
for a in "$@"; do
    case "$a" in
        --fuzz) want_fuzz=1 ;;
        *) log "unknown argument $a"; exit 2 ;;
    esac
done

SUDO=""
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi

pkg_installed() {
    dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q '^install ok installed$'
}

missing=()
for p in nftables iproute2 valgrind gcc libc6-dev procps; do
    pkg_installed "$p" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
    log "installing: ${missing[*]}"
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
    log "Debian packages present"
fi

if [ "$want_fuzz" -eq 1 ]; then
    if cargo fuzz --version >/dev/null 2>&1; then
        log "cargo-fuzz present ($(cargo fuzz --version 2>/dev/null))"
    else
        log "installing cargo-fuzz from crates.io (a few minutes, once)"
        # A failure here is reported by the run as 'cargo fuzz: not run', not hidden.
        cargo install --locked cargo-fuzz || log "cargo install cargo-fuzz failed"
    fi
fi

# The clock shim: C, raw syscalls only (no dlsym), so it is safe under jemalloc.
src="$ROOT/scripts/reliability/clockshift.c"
out_dir="$ROOT/target/reliability"
lib="$out_dir/libclockshift.so"
mkdir -p "$out_dir"
if [ ! -f "$lib" ] || [ "$src" -nt "$lib" ]; then
    gcc -O2 -Wall -Wextra -Werror -shared -fPIC -o "$lib.part" "$src"
    mv -f "$lib.part" "$lib"
    log "built $lib"
fi
