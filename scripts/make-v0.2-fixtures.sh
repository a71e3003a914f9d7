#!/usr/bin/env bash
# Writes tests/fixtures/v0.2/: files written by the module as of commit 00e48ee (the
# "v0.2" format: RDB encoding 2, LOCK.REPL in the AOF), for tests/upgrade_v02.rs. Run by
# hand, never by CI:
#
#   bash scripts/make-v0.2-fixtures.sh            # builds 00e48ee in a temporary worktree
#
# Three fixtures, each with the same locks, and a `<name>.expected` file of what LOCK.INFO
# showed just before the files were written:
#   dump.rdb                  SAVE (RDB encoding 2)
#   aof-plain/appendonlydir   appendonly, aof-use-rdb-preamble no: LOCK.REPL commands
#   aof-preamble/appendonlydir appendonly + BGREWRITEAOF with the RDB preamble, then
#                             more LOCK.REPL commands in the incr file
# Locks: lock:excl (exclusive, OWNER, client over IPv4), lock:shared (SHARED, two holders:
# IPv6 and a unix socket client), lock:limit (LIMIT 3, two holders), lock:lifted (a renew
# with MINFENCE that lifts the counter), lock:short (a 60 s lease: ended when the tests
# load the files) and lock:classic (SET NX PX). Long leases are ten years.
#
# Needs Redis 7.0.15 (/usr/bin/redis-server), redis-cli and python3.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$ROOT/tests/fixtures/v0.2"
COMMIT=00e48ee
WT="$(mktemp -d)"
trap 'git -C "$ROOT" worktree remove --force "$WT/src" >/dev/null 2>&1 || true; rm -rf "$WT"' EXIT
git -C "$ROOT" worktree add -q "$WT/src" "$COMMIT"
(cd "$WT/src" && CARGO_TARGET_DIR="$WT/target" cargo build --release -q -p redis-lock)
MODULE="$WT/target/release/libredis_lock.so"
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
TEN_YEARS=315360000000
SOCK="$WT/redis.sock"

run() { # run <dir> <extra server args...>
    local dir=$1; shift
    mkdir -p "$dir"
    /usr/bin/redis-server --port "$PORT" --bind "127.0.0.1 ::1" --unixsocket "$SOCK" \
        --dir "$dir" --save "" --daemonize no --logfile "$dir/server.log" "$@" \
        --loadmodule "$MODULE" max-ttl "$TEN_YEARS" >/dev/null &
    SERVER_PID=$!
    for _ in $(seq 100); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && return; sleep 0.1; done
    echo "server did not start" >&2; exit 1
}
cli() { redis-cli -h 127.0.0.1 -p "$PORT" "$@"; }
cli6() { redis-cli -h ::1 -p "$PORT" "$@"; }
clis() { redis-cli -s "$SOCK" "$@"; }
stop() { cli shutdown nosave >/dev/null 2>&1 || true; wait "$SERVER_PID" 2>/dev/null || true; }

locks() {
    cli LOCK.ACQUIRE lock:excl PX "$TEN_YEARS" TOKEN fixture-token-excl-0001 OWNER svc-excl >/dev/null
    cli6 LOCK.ACQUIRE lock:shared SHARED PX "$TEN_YEARS" TOKEN fixture-token-shr6-0001 OWNER reader-v6 >/dev/null
    clis LOCK.ACQUIRE lock:shared SHARED PX "$TEN_YEARS" TOKEN fixture-token-shru-0002 OWNER reader-unix >/dev/null
    cli LOCK.ACQUIRE lock:limit LIMIT 3 PX "$TEN_YEARS" TOKEN fixture-token-lim1-0001 OWNER permit-1 >/dev/null
    cli LOCK.ACQUIRE lock:limit LIMIT 3 PX "$TEN_YEARS" TOKEN fixture-token-lim2-0002 >/dev/null
    cli LOCK.ACQUIRE lock:short PX 60000 TOKEN fixture-token-short-001 >/dev/null
    cli LOCK.ACQUIRE lock:lifted PX "$TEN_YEARS" TOKEN fixture-token-lift-0001 >/dev/null
    # The renew lifts the counter: MINFENCE 2 s of clock term above the last fence (the
    # first fence after a start is already an hour ahead; the cap is an hour ahead of now,
    # so wait 3 s after the start first).
    sleep 3
    local last; last=$(cli INFO lock | sed -n 's/^lock_last_fence:\([0-9]*\).*/\1/p')
    local floor=$(( last + (2000 << 10) ))
    cli LOCK.ACQUIRE lock:lifted PX "$TEN_YEARS" TOKEN fixture-token-lift-0001 MINFENCE "$floor" >/dev/null
    cli SET lock:classic classic-token-0001 PX "$TEN_YEARS" >/dev/null
}

# `key field value` lines for every top-level field, `key holder<i> field value` for each
# holder of holder-list (redis-cli's raw output: one element per line, nil as empty).
record() {
    for k in lock:excl lock:shared lock:limit lock:short lock:lifted lock:classic; do
        cli LOCK.INFO "$k" | python3 -c '
import sys
key = sys.argv[1]
lines = sys.stdin.read().split("\n")
if lines and lines[-1] == "":
    lines.pop()
i = 0
while i + 1 < len(lines):
    f, v = lines[i], lines[i + 1]
    if f == "holder-list":
        rest = lines[i + 1:]
        for h in range(len(rest) // 14):
            item = rest[h * 14:(h + 1) * 14]
            for j in range(0, 14, 2):
                print(key, "holder%d" % h, item[j], item[j + 1] if item[j + 1] != "" else "-")
        break
    print(key, f, v if v != "" else "-")
    i += 2
' "$k"
    done
    echo "counter $(cli INFO lock | sed -n 's/^lock_last_fence:\([0-9]*\).*/\1/p')"
    echo "written-at $(date +%s%3N)"
}

rm -rf "$OUT"; mkdir -p "$OUT"
# 1. An RDB file.
run "$WT/rdb"
locks
record > "$OUT/rdb.expected"
cli SAVE >/dev/null
stop
cp "$WT/rdb/dump.rdb" "$OUT/dump.rdb"
# 2. An AOF without RDB preamble: LOCK.REPL commands.
run "$WT/aof-plain" --appendonly yes --aof-use-rdb-preamble no --appendfsync always
locks
record > "$OUT/aof-plain.expected"
stop
mkdir -p "$OUT/aof-plain"; cp -r "$WT/aof-plain/appendonlydir" "$OUT/aof-plain/"
# 3. An AOF with an RDB preamble (rewritten once the locks exist) and an incr part.
run "$WT/aof-preamble" --appendonly yes --aof-use-rdb-preamble yes --appendfsync always
locks
cli BGREWRITEAOF >/dev/null
for _ in $(seq 100); do
    [ "$(cli INFO persistence | sed -n 's/^aof_rewrite_in_progress:\([0-9]\).*/\1/p')" = 0 ] &&
    [ "$(cli INFO persistence | sed -n 's/^aof_rewrite_scheduled:\([0-9]\).*/\1/p')" = 0 ] && break
    sleep 0.1
done
cli LOCK.EXTEND lock:excl fixture-token-excl-0001 PX "$TEN_YEARS" >/dev/null
record > "$OUT/aof-preamble.expected"
stop
mkdir -p "$OUT/aof-preamble"; cp -r "$WT/aof-preamble/appendonlydir" "$OUT/aof-preamble/"
echo "written: $(cd "$OUT" && find . -type f | sort | tr '\n' ' ')"
