#!/usr/bin/env bash
# Runs the any-client examples against a freshly spawned server with the module loaded
# (used by `make test-examples`). Installs what the examples need on a clean machine:
# a Python venv (python3-venv from Debian if `python3 -m venv` is missing) with redis-py
# and the package in clients/python; node-redis and the package in clients/node (built
# by `make node-deps` and `npm run build` there, which `make test-examples` does first).
#
#   EXAMPLE_SERVER   server binary (default /usr/bin/redis-server)
#   LOCK_MODULE      module .so (default target/release/libredis_lock.so)
#   EXAMPLES_VENV    venv directory (default target/venv-examples)
#   EXAMPLES_NODE    where the Node examples' npm packages go (default target/node-examples)
#   RUST_EXAMPLE     the Rust election example's binary (default
#                    target/release/examples/election: cargo build --release -p
#                    redis-lock-client --example election, which make test-examples runs)
# The Node examples (node-redis from the npm registry) run when `node` and `npm` exist.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SERVER="${EXAMPLE_SERVER:-/usr/bin/redis-server}"
MODULE="${LOCK_MODULE:-$ROOT/target/release/libredis_lock.so}"
VENV="${EXAMPLES_VENV:-$ROOT/target/venv-examples}"
NODE_DIR="${EXAMPLES_NODE:-$ROOT/target/node-examples}"
RUST_EXAMPLE="${RUST_EXAMPLE:-$ROOT/target/release/examples/election}"
REDIS_PY="redis==5.2.1"

log() { printf '[examples] %s\n' "$*"; }

[ -f "$MODULE" ] || { log "module not built: $MODULE (run make build)"; exit 1; }
[ -x "$SERVER" ] || { log "server not found: $SERVER (run make deps)"; exit 1; }
[ -x "$RUST_EXAMPLE" ] || { log "Rust example not built: $RUST_EXAMPLE (cargo build --release -p redis-lock-client --example election)"; exit 1; }

# ---------------------------------------------------------------- Python venv
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c 'import redis, redis_lock_module' 2>/dev/null; then
    rm -rf "$VENV"
    if ! python3 -m venv "$VENV" 2>/dev/null; then
        log "python3 -m venv failed: installing python3-venv"
        rm -rf "$VENV"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends python3-venv
        python3 -m venv "$VENV"
    fi
    log "installing $REDIS_PY into $VENV"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$REDIS_PY"
fi
# The package itself, always (its source may have changed); redis-py stays at $REDIS_PY.
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps "$ROOT/clients/python"
rm -rf "$ROOT/clients/python/build"

# ---------------------------------------------------------------- Node packages
have_node=0
if command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1; then
    have_node=1
    [ -f "$ROOT/clients/node/dist/index.js" ] || { log "clients/node is not built (make node-deps; cd clients/node && npm run build)"; exit 1; }
    # The example's package.json, with the package linked from this checkout.
    mkdir -p "$NODE_DIR"
    sed "s|file:../../clients/node|file:$ROOT/clients/node|" "$ROOT/examples/node/package.json" > "$NODE_DIR/package.json.new"
    if [ ! -d "$NODE_DIR/node_modules/redis" ] || ! cmp -s "$NODE_DIR/package.json.new" "$NODE_DIR/package.json"; then
        log "installing node-redis and clients/node into $NODE_DIR"
        mv "$NODE_DIR/package.json.new" "$NODE_DIR/package.json"
        (cd "$NODE_DIR" && npm install --silent --no-audit --no-fund --no-package-lock >/dev/null)
    fi
    rm -f "$NODE_DIR/package.json.new"
    cp "$ROOT/examples/node/"*.mjs "$NODE_DIR/"
else
    log "node/npm not found: skipping the Node example"
fi

# ---------------------------------------------------------------- server
DIR="$(mktemp -d)"
PORT="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
"$SERVER" --bind 127.0.0.1 --port "$PORT" --dir "$DIR" --save "" --appendonly no \
    --daemonize no --logfile "$DIR/server.log" --loadmodule "$MODULE" &
SERVER_PID=$!
cleanup() {
    kill "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
    rm -rf "$DIR"
}
trap cleanup EXIT

up=0
for _ in $(seq 1 100); do
    if "$VENV/bin/python" -c "import redis, sys; sys.exit(0 if redis.Redis(port=$PORT, socket_timeout=1).ping() else 1)" 2>/dev/null; then
        up=1
        break
    fi
    sleep 0.1
done
if [ "$up" -ne 1 ]; then
    log "server did not start; log:"
    tail -n 30 "$DIR/server.log" || true
    exit 1
fi
log "server $("$SERVER" --version | cut -d' ' -f1-3) on port $PORT"

# ---------------------------------------------------------------- examples
export REDIS_URL="redis://127.0.0.1:$PORT"
for py in inventory election; do
    log "python: examples/python/$py.py"
    timeout 120 "$VENV/bin/python" "$ROOT/examples/python/$py.py"
done
if [ "$have_node" -eq 1 ]; then
    for js in daily-report inventory election; do
        log "node: examples/node/$js.mjs"
        timeout 120 node "$NODE_DIR/$js.mjs"
    done
fi
log "rust: examples/rust/election.rs"
timeout 120 "$RUST_EXAMPLE"
log "all examples passed"
