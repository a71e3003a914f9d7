#!/usr/bin/env bash
# `make integration` on a server between the oldest and the newest of TEST_SERVERS: every
# tests/*.rs file, without the files and tests listed in tests/bracket-only.txt (they run
# on the oldest and the newest only; the rule is in that file).
# Usage: scripts/integration-between.sh LIST [test binary arguments (TEST_ARGS)...]
# Env: CARGO, LOCK_SERVER_BIN, LOCK_MODULE (as for the rest of the suite).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
list=$1
shift
cargo=${CARGO:-cargo}
declare -A whole=() skips=()
while read -r file test rest; do
    [[ -z $file || $file == \#* ]] && continue
    [[ -f tests/$file.rs && -z $rest ]] || { echo "$list: bad line: $file $test $rest" >&2; exit 1; }
    if [[ -z $test ]]; then
        whole[$file]=1
        continue
    fi
    # libtest's --skip matches a part of a name: the name must be in the file, and be part
    # of no other name there.
    names=$(grep -ow "[a-z0-9_]*${test}[a-z0-9_]*" "tests/$file.rs" | sort -u)
    [[ $names == "$test" ]] || {
        echo "$list: '$test' must name one test of tests/$file.rs; found: ${names:-nothing}" >&2
        exit 1
    }
    skips[$file]+=" --skip $test"
done <"$list"
plain=()
for f in tests/*.rs; do
    n=$(basename "$f" .rs)
    [[ -n ${whole[$n]:-} || -n ${skips[$n]:-} ]] || plain+=(--test "$n")
done
echo "== not here (oldest and newest only): ${!whole[*]}, and $(grep -cvE '^(#|$)|^[a-z0-9_]+$' "$list") tests of ${!skips[*]}"
"$cargo" test --release -p redis-lock "${plain[@]}" -- "$@"
for n in $(printf '%s\n' "${!skips[@]}" | sort); do
    [[ -n ${whole[$n]:-} ]] && continue
    # shellcheck disable=SC2086 # the --skip pairs split on purpose
    "$cargo" test --release -p redis-lock --test "$n" -- ${skips[$n]} "$@"
done
