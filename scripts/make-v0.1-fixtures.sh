#!/usr/bin/env bash
# Writes tests/fixtures/v0.1/: an RDB file and an AOF directory written by release 0.1
# (commit a01d003) of the module, for tests/upgrade.rs. Run by hand, never by CI:
#
#   bash scripts/make-v0.1-fixtures.sh            # builds a01d003 in a temporary worktree
#
# Needs Redis 7.0.15 (/usr/bin/redis-server) and redis-cli. The leases are ten years long
# so that the locks are still held when the tests load the files.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$ROOT/tests/fixtures/v0.1"
WT="$(mktemp -d)"
trap 'git -C "$ROOT" worktree remove --force "$WT/src" >/dev/null 2>&1 || true; rm -rf "$WT"' EXIT
git -C "$ROOT" worktree add -q "$WT/src" a01d003
(cd "$WT/src" && CARGO_TARGET_DIR="$WT/target" cargo build --release -q -p redis-lock)
MODULE="$WT/target/release/libredis_lock.so"
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
TEN_YEARS=315360000000

run() { # run <dir> <extra server args...>
    local dir=$1; shift
    mkdir -p "$dir"
    /usr/bin/redis-server --port "$PORT" --bind 127.0.0.1 --dir "$dir" --save "" \
        --daemonize no --logfile "$dir/server.log" "$@" \
        --loadmodule "$MODULE" max-ttl "$TEN_YEARS" >/dev/null &
    SERVER_PID=$!
    for _ in $(seq 100); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && return; sleep 0.1; done
    echo "server did not start" >&2; exit 1
}
cli() { redis-cli -p "$PORT" "$@"; }
stop() { cli shutdown nosave >/dev/null 2>&1 || true; wait "$SERVER_PID" 2>/dev/null || true; }

locks() {
    cli LOCK.ACQUIRE lock:owner PX "$TEN_YEARS" TOKEN tok-owner OWNER svc-1 >/dev/null
    cli LOCK.ACQUIRE lock:plain PX "$TEN_YEARS" TOKEN tok-plain >/dev/null
    # A renew that lifts the counter (MINFENCE, an hour ahead of the clock).
    local floor=$(( ( $(date +%s%3N) + 3600000 ) << 20 ))
    cli LOCK.ACQUIRE lock:plain PX "$TEN_YEARS" TOKEN tok-plain MINFENCE "$floor" >/dev/null
    cli SET lock:classic classic-token PX "$TEN_YEARS" >/dev/null
}

record() { # the state the tests compare against
    {
        for k in lock:owner lock:plain; do
            echo "$k fence $(cli LOCK.INFO $k | sed -n '/^fence$/{n;p}')"
            echo "$k expires-at $(cli LOCK.INFO $k | sed -n '/^expires-at$/{n;p}')"
            echo "$k acquired-at $(cli LOCK.INFO $k | sed -n '/^acquired-at$/{n;p}')"
        done
        echo "counter $(cli INFO lock | sed -n 's/^lock_last_fence:\([0-9]*\).*/\1/p')"
    } > "$1"
}

rm -rf "$OUT"; mkdir -p "$OUT"
# 1. An RDB file.
run "$WT/rdb"
locks
record "$OUT/rdb.expected"
cli SAVE >/dev/null
stop
cp "$WT/rdb/dump.rdb" "$OUT/dump.rdb"
# 2. An AOF without RDB preamble (LOCK.SYNC commands with the tokens in clear).
run "$WT/aof" --appendonly yes --aof-use-rdb-preamble no --appendfsync always
locks
record "$OUT/aof.expected"
stop
cp -r "$WT/aof/appendonlydir" "$OUT/appendonlydir"
echo "written: $(ls "$OUT")"
