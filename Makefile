# redis-lock: build, run and test the module.
#
#   make deps    install packages + fetch the extra server binaries (scripts/deps.sh)
#   make build   cargo build --release  -> target/release/libredis_lock.so
#   make run     start redis-server in the foreground on 127.0.0.1:$(PORT) with the module
#   make test    fmt, clippy, build, unit tests, then the integration suite once per server
#   make check   the same checks without root or network: fmt, clippy, unit and model
#                tests, the integration suite against the redis-server on PATH
#   make docs    render docs/BENCHMARKS.md, docs/RELIABILITY.md and the charts from the
#                measurements saved in docs/data/ (seconds; no measurement is rerun)
#   make docs-sessions   rerun the redis-cli sessions of docs/sessions/ and rewrite their
#                blocks in docs/commands.md and README.md (docs/sessions/README.md)
#   make clean   remove build output

SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c

PORT     ?= 6379
CARGO    ?= cargo
MODULE   := $(CURDIR)/target/release/libredis_lock.so

# Servers the integration suite runs against, in this order.
SERVER_SYSTEM := /usr/bin/redis-server
SERVER_REDIS8 := $(CURDIR)/.servers/redis-8.2.3/redis-server
SERVER_VALKEY := $(CURDIR)/.servers/valkey-8.1.8/valkey-server
SERVER_VALKEY9 := $(CURDIR)/.servers/valkey-9.1.2/valkey-server
# Which suite runs where (`make test`, ~40 min on 2 cores); the project's rule: run the
# variants of a test where they can differ, not all of them everywhere:
# - TEST_SERVERS, all four: the module's integration suite (tests/*.rs, every path a command
#   can take: tests/paths.rs), since the module's behaviour is what differs between servers
#   (module API, scripts, cluster bus, slot migration); tests/cluster_asm.rs on Valkey 9+.
#   The servers between the first and the last skip tests/bracket-only.txt (module logic
#   only; the rule is in that file).
# - PKG_TEST_SERVERS, the oldest and the newest: the client crate, the Python and Node
#   packages. They speak plain RESP to the module's commands and differ by server only in
#   ROLE/INFO/CONFIG, WAIT, ACL, TLS/Sentinel and cluster replies, which the oldest (Redis
#   7.0) and the newest (Valkey 9.1) bracket. The first server runs every test; the others
#   only the files that read those replies (CLIENT_TESTS_EVERY_SERVER, PY_TESTS_EVERY_SERVER,
#   NODE_TESTS_EVERY_SERVER): the rest is the library's own logic over the same RESP. A
#   client-library variant (redis-py 4.5.0, redis-py's own Lock tests) runs on the first
#   server; their packaging checks (wheel, sdist, npm tarball, quick starts) run once.
TEST_SERVERS  ?= $(SERVER_SYSTEM) $(SERVER_REDIS8) $(SERVER_VALKEY) $(SERVER_VALKEY9)
PKG_TEST_SERVERS ?= $(SERVER_SYSTEM) $(SERVER_VALKEY9)
# Server used by `make run` (e.g. make run RUN_SERVER=$(SERVER_VALKEY)).
RUN_SERVER    ?= $(SERVER_SYSTEM)
# Extra arguments for the test binaries, e.g. make test TEST_ARGS='some_test_name'
TEST_ARGS ?=

.PHONY: all deps build run test unit integration lint clean check docs docs-sessions docs-sessions-check

# `$(APT_INSTALL) pkg...` in a recipe: installs Debian packages (through sudo unless root),
# for the targets below that install what they need when it is missing.
APT_INSTALL = SUDO=""; [ "$$(id -u)" -eq 0 ] || SUDO=sudo; $$SUDO apt-get update -qq; \
	DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends

all: build

deps:
	bash scripts/deps.sh

build:
	$(CARGO) build --release

run: deps build
	cd $(CURDIR) && exec $(RUN_SERVER) redis.conf.example --port $(PORT)

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

# Everything in release mode so that dependencies are compiled once for the module,
# the unit tests and the integration tests alike.
unit:
	$(CARGO) test --release --lib

# tests/cluster_asm.rs: the atomic slot migration tests are #[ignore]d (they need
# CLUSTER MIGRATESLOTS) and run with --ignored on Valkey 9 and later only, so that no
# other server counts them as passing.
# The first and the last of TEST_SERVERS (the oldest and the newest: Redis 7.0.15 and
# Valkey 9.1.2) run every test; the servers between skip the tests of
# tests/bracket-only.txt (the module's own logic, the same code on every server; the rule
# for what goes there is in that file) through scripts/integration-between.sh.
# Integration tests mostly wait on the servers they start, so they run 4 at a time even
# on 2 cores (libtest's default is one per core).
INTEGRATION_TEST_THREADS ?= 4
integration: build
	export LOCK_MODULE=$(MODULE) RUST_TEST_THREADS=$(INTEGRATION_TEST_THREADS); \
	servers=($(TEST_SERVERS)); last=$$(( $${#servers[@]} - 1 )); \
	for i in "$${!servers[@]}"; do \
	    bin=$${servers[$$i]}; \
	    ver=$$($$bin --version); \
	    echo; \
	    echo "=================================================================="; \
	    echo "== integration tests against $$bin"; \
	    echo "== $$ver"; \
	    echo "=================================================================="; \
	    if [ "$$i" -eq 0 ] || [ "$$i" -eq "$$last" ]; then \
	        LOCK_SERVER_BIN=$$bin $(CARGO) test --release -p redis-lock --test '*' -- $(TEST_ARGS); \
	    else \
	        LOCK_SERVER_BIN=$$bin CARGO=$(CARGO) bash scripts/integration-between.sh \
	            tests/bracket-only.txt $(TEST_ARGS); \
	    fi; \
	    case "$$ver" in \
	    Valkey*v=9.*|Valkey*v=[1-9][0-9].*) \
	        echo "== atomic slot migration (CLUSTER MIGRATESLOTS, Valkey 9+): tests/cluster_asm.rs --ignored"; \
	        LOCK_SERVER_BIN=$$bin $(CARGO) test --release -p redis-lock --test cluster_asm -- --ignored $(TEST_ARGS);; \
	    esac; \
	done; \
	echo; echo "== integration tests passed against: $(TEST_SERVERS)"

# Further suites (client crate, short reliability run) add themselves here with
# `EXTRA_TESTS += target` next to their own targets below.
EXTRA_TESTS :=

test: deps
	$(MAKE) --no-print-directory lint
	$(MAKE) --no-print-directory build
	$(MAKE) --no-print-directory unit
	$(MAKE) --no-print-directory integration
	for t in $(EXTRA_TESTS); do $(MAKE) --no-print-directory $$t; done

# The unit tests of the test kit, the renderer and the tools (no server), and the kit's
# own checks against a server.
TOOL_CRATES := -p redis-lock-testkit -p redis-lock-report -p redis-lock-bench \
	-p redis-lock-contention -p redis-lock-reliability -p redis-lock-docsessions
tools-unit: build
	LOCK_MODULE=$(MODULE) $(CARGO) test --release $(TOOL_CRATES)
EXTRA_TESTS += tools-unit

# The test kit's launcher, `redis-lock-testkit serve` (testkit/src/bin/): the Python and
# Node suites start every server through it (clients/*/test*/servers.*).
.PHONY: testkit
testkit:
	$(CARGO) build --release -p redis-lock-testkit --bin redis-lock-testkit

# For a contributor without root or network (the crates must be in cargo's cache, as
# after any earlier build): no package installs, no downloads, one server.
check:
	@command -v redis-server >/dev/null || { echo "make check needs redis-server on PATH"; exit 1; }
	$(MAKE) --no-print-directory lint
	$(MAKE) --no-print-directory unit tools-unit
	$(MAKE) --no-print-directory integration TEST_SERVERS="$$(command -v redis-server)"

# The measured docs, rendered from docs/data/*.json (written by bench, bench-contention
# and reliability); prose and layout live in docs/templates/*.j2, the figures, goals and
# charts in tools/report (which builds the templates in, so an edited one needs only this).
docs:
	$(CARGO) run --release -q -p redis-lock-report --bin redis-lock-docs -- --root $(CURDIR)

# The redis-cli transcripts of docs/commands.md and README.md, from docs/sessions/*.txt:
# one fresh $(RUN_SERVER) with the module per doc, every command run by redis-cli --no-raw
# (about 10 s). tests/docs_sessions.rs compares the same runs with the docs on every server;
# docs-sessions-check does it here and writes nothing.
DOCS_SESSIONS = LOCK_MODULE=$(MODULE) LOCK_SERVER_BIN=$(RUN_SERVER) \
	$(CARGO) run --release -q -p redis-lock-docsessions --

docs-sessions: build
	$(DOCS_SESSIONS) --root $(CURDIR) $(DOCS_SESSIONS_ARGS)

docs-sessions-check: build
	$(DOCS_SESSIONS) --root $(CURDIR) --check

clean:
	$(CARGO) clean
	rm -rf appendonlydir dump.rdb

# ---------------------------------------------------------------- bench-contention
# N clients contend for one lock, each holding it c ms: the module's LOCK.ACQUIRE BLOCK
# (server-side FIFO hand-off) against the client-side waiting of redis-py, node-redlock/
# redsync and python-redis-lock; then 8 readers + 1 writer (SHARED BLOCK against one mutex
# for all and a Lua read-write lock that polls) and 16 clients on a semaphore (LIMIT 4
# BLOCK against the sorted-set recipe). Starts its own redis-server 7.0.15 with the module,
# saves docs/data/contention.json, then renders the section between
# <!-- contention:begin --> and <!-- contention:end --> in docs/BENCHMARKS.md,
# docs/contention.png and docs/contention-kinds.png from it. Not part of `make test`;
# takes about 3 minutes.
# Env: CONTENTION_SECS (per cell, default 3), CONTENTION_N (1,2,8,64),
# CONTENTION_HOLD_MS (0,1), CONTENTION_METHODS (module,poll100,jitter,blpop),
# CONTENTION_CELLS (mutex,rw,sem), CONTENTION_RW (readers,writers: 8,1),
# CONTENTION_RW_METHODS (shared,module,jitter,rw-script,rw-script-wfirst),
# CONTENTION_SEM (clients,permits: 16,4), CONTENTION_SEM_METHODS (limit,zset),
# CONTENTION_JSON (another file, e.g. in a scratch dir, leaves the published figures).
.PHONY: bench-contention contention-unit tools-unit
bench-contention: deps build
	$(CARGO) build --release -p redis-lock-contention
	CONTENTION_COMMAND="make bench-contention" LOCK_MODULE=$(MODULE) LOCK_SERVER_BIN=$(SERVER_SYSTEM) \
	    CONTENTION_JSON="$${CONTENTION_JSON:-$(CURDIR)/docs/data/contention.json}" \
	    $(CURDIR)/target/release/redis-lock-contention

# The benchmark's own unit tests (statistics); no server. Part of tools-unit.
contention-unit:
	$(CARGO) test --release -p redis-lock-contention

# ---- performance (issue 6); not part of `make test` -------------------------------------
#   make bench                      every suite on all four servers (about an hour here): saves
#                                   docs/data/perf.json and renders the perf section of
#                                   docs/BENCHMARKS.md and docs/perf.png from it; throughput
#                                   with redis-benchmark (server-bound: PING beside it)
#   make bench-callgrind            only the instructions per command (table 5 of that
#                                   section) on every server, the deciding figures
#   make bench-callgrind-baseline   same, and record the counts as the "before" column
#   make bench-guarded              only section 7 (issue 23: LOCK.IFHELD against WATCH/MULTI,
#                                   observe hand-off latency; ~8 min here), replaced in perf.json
#                                   and rendered; `make bench` measures it with the rest
#   make bench-keepalive            only section 7 (issue 30: keepalive traffic of 1,000 locks,
#                                   one session against per-lock LOCK.EXTEND, under callgrind
#                                   on the first server; ~1 min), replaced in perf.json and
#                                   rendered; `make bench` measures it with the rest
# Sizes and durations: BENCH_ROUNDS, BENCH_OPS_P1, BENCH_OPS_P16, BENCH_LAT_OPS,
# BENCH_MEM_LOCKS, BENCH_WAITERS, BENCH_LEVELS, BENCH_CG_OPS, BENCH_SUITES, BENCH_SERVERS,
# BENCH_OBS_HANDOFFS, BENCH_OBS_WATCHERS, BENCH_POLL_HANDOFFS, BENCH_POLL_MS
# (`target/release/redis-lock-bench --help`), e.g. `BENCH_ROUNDS=3 make bench`;
# BENCH_JSON=/tmp/x/docs/data/perf.json measures into a scratch dir and renders there.
.PHONY: bench bench-deps bench-callgrind bench-callgrind-baseline bench-floor bench-guarded \
	bench-keepalive

BENCH_RUN = BENCH_ROOT=$(CURDIR) LOCK_MODULE=$(MODULE) \
	BENCH_SERVERS="$${BENCH_SERVERS:-$(SERVER_SYSTEM),$(SERVER_REDIS8),$(SERVER_VALKEY),$(SERVER_VALKEY9)}" \
	$(CARGO) run --release -q -p redis-lock-bench --

# redis-benchmark comes with redis-tools (scripts/deps.sh); callgrind with valgrind.
bench-deps: deps
	command -v redis-benchmark >/dev/null
	if ! command -v valgrind >/dev/null 2>&1 || ! command -v callgrind_control >/dev/null 2>&1; then \
	    $(APT_INSTALL) valgrind; \
	fi

# The floor the module is set beside: a bench-only scratch module (bench/floor, never
# shipped) whose FLOOR.ACQUIRE does only what a module-type acquire cannot avoid.
bench-floor:
	$(CARGO) build --release -p redis-lock-floor

bench: bench-deps build bench-floor
	$(BENCH_RUN) all

bench-callgrind: bench-deps build bench-floor
	$(BENCH_RUN) callgrind

bench-guarded: bench-deps build bench-floor
	$(BENCH_RUN) guarded

bench-keepalive: bench-deps build
	$(BENCH_RUN) keepalive

# Issue 27: grants/s and cluster-bus messages per grant on 1 and 3 primaries, and grants/s
# on a node that keeps receiving slots (CLUSTER SETSLOT) against the same load with nothing
# moving, on all four servers (~3 min here); saves docs/data/cluster.json and renders the
# cluster section of docs/BENCHMARKS.md. Env: BENCH_CLUSTER_SECS, BENCH_CLUSTER_CLIENTS,
# BENCH_CLUSTER_WINDOW_MS, BENCH_CLUSTER_GAP_MS, BENCH_CLUSTER_JSON, BENCH_SERVERS. Not part
# of `make test`.
.PHONY: bench-cluster
bench-cluster: deps build
	BENCH_SERVERS="$${BENCH_SERVERS:-$(SERVER_SYSTEM),$(SERVER_REDIS8),$(SERVER_VALKEY),$(SERVER_VALKEY9)}" \
	    $(BENCH_RUN) cluster

bench-callgrind-baseline: bench-deps build bench-floor
	$(BENCH_RUN) callgrind --save-baseline

# The instruction-count guard of `make test` (about a minute): callgrind counts, on Redis
# 7.0.15 with and without the module, LOCK.ACQUIRE, EXTEND and RELEASE inside call() as
# ratios to SET NX PX without the module, and SET PX, SET, GET, EXPIRE, DEL inside
# processCommand with the module against without it (the module's tax on them); it fails
# when a ratio rises above bench/callgrind-guard.tsv by more than the tolerance recorded
# there. Ratios of counts made in the same run do not move with the machine, its load or
# the server build. A deliberate change of the cost updates the baseline with its
# reason, in the same commit:
#   make perf-guard-baseline REASON="why the cost changed"
.PHONY: perf-guard perf-guard-baseline
PERF_GUARD = BENCH_ROOT=$(CURDIR) LOCK_MODULE=$(MODULE) BENCH_SERVERS=$(SERVER_SYSTEM) \
	$(CARGO) run --release -q -p redis-lock-bench -- guard

perf-guard: bench-deps build
	$(PERF_GUARD)
EXTRA_TESTS += perf-guard

perf-guard-baseline: bench-deps build
	@test -n "$(REASON)" || { echo 'give the reason: make perf-guard-baseline REASON="..."'; exit 1; }
	$(PERF_GUARD) --save-baseline "$(REASON)"

# ---- client crate, CLI and any-client examples (issue 5) --------------------------------
#   make test-client     the client crate's tests (single server, sessions, Redlock on 5 servers,
#                        the redis-lock CLI, a 3-master cluster, the metrics exporter and
#                        Debian's redis exporter: monitoring-tools) on the first server of
#                        CLIENT_TEST_SERVERS, CLIENT_TESTS_EVERY_SERVER on the others
#   make test-examples   examples/run.sh: examples/python/{inventory,election}.py (redis-py,
#                        in a venv under target/venv-examples), examples/node/{daily-report,
#                        inventory,election}.mjs (node-redis, under target/node-examples;
#                        skipped without node/npm) and examples/rust/election.rs against a
#                        freshly spawned server
.PHONY: test-client test-examples
CLIENT_TEST_SERVERS ?= $(PKG_TEST_SERVERS)
# client/tests/*.rs that also run on the servers after the first (see PKG_TEST_SERVERS)
CLIENT_TESTS_EVERY_SERVER := cli cluster confirm connect metrics secrets

test-client: build monitoring-tools
	export LOCK_MODULE=$(MODULE) REDIS_EXPORTER_BIN=$(MONITORING_DIR)/usr/bin/prometheus-redis-exporter \
	    PROMTOOL_BIN=$(MONITORING_DIR)/usr/bin/promtool PROMETHEUS_BIN=$(MONITORING_DIR)/usr/bin/prometheus; \
	only=""; for bin in $(CLIENT_TEST_SERVERS); do \
	    echo; echo "== client tests against $$bin ($$($$bin --version | cut -d' ' -f1-3))$${only:+: $(CLIENT_TESTS_EVERY_SERVER)}"; \
	    LOCK_SERVER_BIN=$$bin $(CARGO) test --release -p redis-lock-client $$only -- $(TEST_ARGS); \
	    only="$(addprefix --test ,$(CLIENT_TESTS_EVERY_SERVER))"; \
	done; \
	echo; echo "== client tests passed against: $(CLIENT_TEST_SERVERS)"
EXTRA_TESTS += test-client

# prometheus-redis-exporter and promtool (client/tests/metrics.rs: Debian's exporter with
# scripts/monitoring/redis-exporter-lock.lua, and `redis-lock metrics` output linted by
# promtool), unpacked from Debian's packages into target/monitoring: nothing installed,
# no service started.
.PHONY: monitoring-tools
MONITORING_DIR := $(CURDIR)/target/monitoring
MONITORING_DEBS := prometheus-redis-exporter prometheus

monitoring-tools: $(MONITORING_DIR)/.unpacked

$(MONITORING_DIR)/.unpacked:
	rm -rf $(MONITORING_DIR) && mkdir -p $(MONITORING_DIR)/debs
	cd $(MONITORING_DIR)/debs && { apt-get download $(MONITORING_DEBS) 2>/dev/null || { \
	    SUDO=""; [ "$$(id -u)" -eq 0 ] || SUDO=sudo; $$SUDO apt-get update -qq; \
	    apt-get download $(MONITORING_DEBS); }; }
	for d in $(MONITORING_DIR)/debs/*.deb; do dpkg-deb -x $$d $(MONITORING_DIR); done
	$(MONITORING_DIR)/usr/bin/prometheus-redis-exporter -version 2>&1 | head -n1
	touch $@

test-examples: build node-deps
	$(CARGO) build --release -p redis-lock-client --example election
	cd $(NODE_DIR) && npm run --silent build
	LOCK_MODULE=$(MODULE) EXAMPLE_SERVER=$(SERVER_SYSTEM) bash examples/run.sh
EXTRA_TESTS += test-examples

# ---- packages (issue 22) ------------------------------------------------------------------
#   make dist       every package: the Python wheel and sdist (dist-python), the npm tarball
#                   (dist-node), each when this Makefile has that target, and the Debian
#                   package of the module and the CLI (dist-deb)
#   make dist-deb   target/dist/redis-lock_<version>_<arch>.deb (scripts/build-deb.sh, with
#                   dpkg-deb): /usr/lib/redis/modules/redis-lock.so, the snippet
#                   /etc/redis/modules/redis-lock.conf (a `loadmodule` line) and
#                   /usr/bin/redis-lock; installing it needs no Rust toolchain
#   make test-deb   docs/quickstart-cli.md against that package, unpacked, and its man page
#                   against its CLI (scripts/check-man.sh); as root also
#                   with a real `apt install ./redis-lock_*.deb`, purged at the end, and a
#                   check that nothing is left (scripts/test-deb.sh)
.PHONY: dist dist-deb test-deb
DIST_DIR := $(CURDIR)/target/dist
CLI_BIN  := $(CURDIR)/target/release/redis-lock

dist:
	for t in dist-python dist-node; do \
	    if grep -qE "^$$t:" $(firstword $(MAKEFILE_LIST)); then \
	        $(MAKE) --no-print-directory $$t; \
	    else \
	        echo "== make dist: this Makefile has no $$t target; skipped"; \
	    fi; \
	done
	$(MAKE) --no-print-directory dist-deb
	ls -l $(DIST_DIR)

dist-deb: build
	$(CARGO) build --release -p redis-lock-client --bin redis-lock
	rm -f $(DIST_DIR)/redis-lock_*.deb
	bash scripts/build-deb.sh --so $(MODULE) --cli $(CLI_BIN) --out $(DIST_DIR)

test-deb: dist-deb
	if ! command -v groff >/dev/null || ! command -v man >/dev/null; then \
	    $(APT_INSTALL) groff-base man-db; \
	fi
	bash scripts/test-deb.sh $(DIST_DIR)/redis-lock_*.deb
EXTRA_TESTS += test-deb

# ---- reliability under faults (issue 4) --------------------------------------------------
#   make reliability        every scenario at full size (about 23 min at SCALE=1), saves
#                           docs/data/reliability.json and renders docs/RELIABILITY.md from
#                           it; exits non-zero when a target is missed or a
#                           scenario could not run (needs root: ip netns + nft, valgrind)
#       SCALE=0.1..10       multiplies operation counts and time budgets
#       ONLY=mutex,clock    some scenarios only (prints rows, leaves the doc alone); keys:
#                           mutex durability leases failover stale guarded clock fuzz
#                           memory chaos kinds sessions
#       SAVE=1              with ONLY: their rows replace theirs in docs/data/reliability.json
#                           (the other rows stay as measured) and the doc is rendered again
#       SEED=n              the run's random seed (printed by every run)
#       RELIABILITY_SERVER  server binary (default Debian's redis-server, which valgrind needs)
#       RELIABILITY_SERVERS the servers of the scenarios that run on every server (leases:
#                           leases across AOF/RDB restarts; guarded: LOCK.IFHELD writes of
#                           paused holders; clock: +/-10 min wall-clock steps; chaos: server
#                           operations under load; kinds: SHARED and LIMIT keys;
#                           sessions: kill -9 of session holders), one row
#                           each; default all three
#   make reliability-short  the same code and assertions with fewer operations (CI, ~2 min),
#                           the every-server scenarios on RELIABILITY_SHORT_SERVERS only
#                           (default Redis 7.0.15: the integration suite checks what each
#                           server does, `make reliability` measures them on all three);
#   bounds a loaded 2-core machine's 1-2 s pauses break are wider there: a waiter may be
#   answered 3 s after its BLOCK (1 s), the clock and sessions rows' hand-offs 2 s late
#   (150 and 500 ms), the chaos row's cluster rate 0.25x the standalone one (0.5x)
#   (mutex and chaos rows: every history is also checked by stateright's linearizability
#   tester, tools/reliability/src/linear.rs; its figures are in those rows' notes; the short
#   run checks the mutex row's only: a chaos row's check takes minutes of CPU)
.PHONY: reliability reliability-short reliability-build
SCALE ?= 1
ONLY ?=
SAVE ?=
SEED ?=
RELIABILITY_SERVER ?= $(SERVER_SYSTEM)
RELIABILITY_SERVERS ?= $(SERVER_SYSTEM),$(SERVER_REDIS8),$(SERVER_VALKEY)
RELIABILITY_BIN := $(CURDIR)/target/release/redis-lock-reliability
RELIABILITY_JSON := $(CURDIR)/docs/data/reliability.json
RELIABILITY_SHORT_SERVERS ?= $(SERVER_SYSTEM)
RELIABILITY_ARGS = --server $(RELIABILITY_SERVER) \
	--module $(MODULE) $(if $(SEED),--seed $(SEED))

reliability-build: build
	bash scripts/deps-reliability.sh $(RELIABILITY_DEPS_ARGS)
	$(CARGO) build --release -p redis-lock-reliability

reliability: deps
	$(MAKE) --no-print-directory reliability-build \
	    RELIABILITY_DEPS_ARGS="$(if $(ONLY),$(if $(findstring fuzz,$(ONLY)),--fuzz),--fuzz)"
	$(RELIABILITY_BIN) run --scale $(SCALE) $(RELIABILITY_ARGS) --servers $(RELIABILITY_SERVERS) \
	    $(if $(ONLY),--only $(ONLY) $(if $(SAVE),--json $(RELIABILITY_JSON)),--json $(RELIABILITY_JSON))

reliability-short: deps reliability-build
	$(RELIABILITY_BIN) run --short $(RELIABILITY_ARGS) --servers $(RELIABILITY_SHORT_SERVERS)
EXTRA_TESTS += reliability-short

# ---- Python and Node packages (issues 12, 22) -------------------------------------------
#   make test-python   clients/python (redis-py Lock on the module): on the first server of
#                      PKG_TEST_SERVERS the package's suite (sync, asyncio, defaults, Redlock,
#                      sessions, 3-master cluster) and redis-py's own Lock tests on the newest
#                      redis-py (target/venv-python), the API tests (PY_TESTS_OLDEST) and
#                      redis-py's Lock tests on the oldest declared (target/venv-python-oldest);
#                      on the others PY_TESTS_EVERY_SERVER on the newest redis-py; then, once,
#                      the built wheel and sdist installed into fresh venvs and used
#   make test-node     clients/node (node-redis 4/5/6, ioredis 5/6): npm ci, the ESM and
#                      CommonJS builds, tsc on the types of both, node --test (standalone,
#                      cluster, defaults, Redlock, ACL, sessions) on the first server of
#                      PKG_TEST_SERVERS, NODE_TESTS_EVERY_SERVER on the others; then, once, the
#                      npm tarball installed into a fresh npm project and used (ESM, CJS, tsc),
#                      docs/quickstart-node.md and examples/node/daily-report.mjs
#   make dist-python   wheel + sdist into target/dist
#   make dist-node     the npm tarball into target/dist
.PHONY: test-python test-node python-venv python-venv-oldest node-deps dist-python dist-node
PY_VENV := $(CURDIR)/target/venv-python
PY_VENV_OLDEST := $(CURDIR)/target/venv-python-oldest
# The oldest redis-py the package declares (pyproject.toml: redis>=4.5.0); the newest is
# pinned in clients/python/requirements-test.txt.
PY_REDIS_OLDEST := 4.5.0
PY_SRC  := $(wildcard $(CURDIR)/clients/python/src/redis_lock_module/*.py) \
           $(CURDIR)/clients/python/pyproject.toml $(CURDIR)/clients/python/requirements-test.txt
PY_TEST_ARGS ?=
# The smaller set on the oldest redis-py: the API and its error paths (sync, asyncio,
# shared and counted). Not the cluster file: the test launcher's Cluster reads replies
# the way redis-py 5+ parses them.
PY_TESTS_OLDEST := tests/test_lock.py tests/test_asyncio.py tests/test_kinds.py tests/test_args.py \
                   tests/test_election.py
DIST := $(CURDIR)/target/dist
NODE_DIR := $(CURDIR)/clients/node
# A hung test fails after 2 min instead of holding CI. No --test-force-exit: every test
# file ends by itself (that the package leaves no handle behind is also checked in child
# processes: test/exit-child.mjs), as `npm test` in clients/node does.
NODE_TEST_FLAGS := --test-timeout=120000
NODE_TESTS ?= test/lock.test.mjs test/cluster.test.mjs test/kinds.test.mjs test/defaults.test.mjs \
              test/replies.test.mjs test/redlock.test.mjs test/election.test.mjs test/acl.test.mjs \
              test/session.test.mjs
# The files of the package suites that also run on the servers after the first of
# PKG_TEST_SERVERS (the rule is at PKG_TEST_SERVERS): ACL users, the cluster, and the
# defaults that read the server's own replies (grants confirmed on the replicas: ROLE,
# WAIT; its errors: AUTH, an unknown command), kept apart from the other defaults for this.
PY_TESTS_EVERY_SERVER := tests/test_acl.py tests/test_cluster.py tests/test_replies.py
NODE_TESTS_EVERY_SERVER := test/acl.test.mjs test/cluster.test.mjs test/replies.test.mjs

# $(call py_venv,dir,redis requirement): a venv with the package, pytest and that redis-py.
define py_venv
	if [ ! -x $(1)/bin/python ]; then \
	    if ! python3 -m venv $(1) 2>/dev/null; then \
	        rm -rf $(1); $(APT_INSTALL) python3-venv; \
	        python3 -m venv $(1); \
	    fi; \
	fi
	$(1)/bin/python -m pip install -q --disable-pip-version-check \
	    $$(grep -v '^redis==' clients/python/requirements-test.txt | grep -v '^#') "$(2)" ./clients/python
	rm -rf clients/python/build
	touch $(1)/.installed
endef

$(PY_VENV)/.installed: $(PY_SRC)
	$(call py_venv,$(PY_VENV),$$(grep '^redis==' clients/python/requirements-test.txt))

$(PY_VENV_OLDEST)/.installed: $(PY_SRC)
	$(call py_venv,$(PY_VENV_OLDEST),redis==$(PY_REDIS_OLDEST))

python-venv: $(PY_VENV)/.installed
python-venv-oldest: $(PY_VENV_OLDEST)/.installed

dist-python: python-venv
	mkdir -p $(DIST)
	rm -f $(DIST)/redis_lock_module-*
	$(PY_VENV)/bin/python -m build -q --sdist --wheel --outdir $(DIST) clients/python
	rm -rf clients/python/build clients/python/src/*.egg-info

test-python: build testkit python-venv python-venv-oldest dist-python
	export LOCK_MODULE=$(MODULE); \
	first=1; for bin in $(PKG_TEST_SERVERS); do \
	    v=$$($$bin --version | cut -d' ' -f1-3); \
	    pyv=$$($(PY_VENV)/bin/python -c 'import redis; print(redis.__version__)'); \
	    if [ -z "$$first" ]; then \
	        echo; echo "== Python package tests against $$bin ($$v), redis-py $$pyv: $(PY_TESTS_EVERY_SERVER)"; \
	        ( cd clients/python && LOCK_SERVER_BIN=$$bin $(PY_VENV)/bin/python -m pytest -q \
	            $(PY_TESTS_EVERY_SERVER) $(PY_TEST_ARGS) ); \
	        continue; \
	    fi; \
	    first=; \
	    echo; echo "== Python package tests against $$bin ($$v), redis-py $$pyv"; \
	    ( cd clients/python && LOCK_SERVER_BIN=$$bin $(PY_VENV)/bin/python -m pytest -q \
	        tests $(PY_TEST_ARGS) && \
	      LOCK_SERVER_BIN=$$bin $(PY_VENV)/bin/python tests/redis_py/run.py ); \
	    echo; echo "== Python package tests against $$bin ($$v), redis-py $(PY_REDIS_OLDEST)"; \
	    ( cd clients/python && LOCK_SERVER_BIN=$$bin $(PY_VENV_OLDEST)/bin/python -m pytest -q \
	        $(PY_TESTS_OLDEST) $(PY_TEST_ARGS) && \
	      LOCK_SERVER_BIN=$$bin $(PY_VENV_OLDEST)/bin/python tests/redis_py/run.py ); \
	done; \
	echo; echo "== the wheel and the sdist of $(DIST), installed into fresh venvs"; \
	cd clients/python && LOCK_SERVER_BIN=$(SERVER_SYSTEM) REDIS_LOCK_DIST=$(DIST) \
	    $(PY_VENV)/bin/python -m pytest -q tests/dist
EXTRA_TESTS += test-python

$(NODE_DIR)/node_modules/.installed: $(NODE_DIR)/package-lock.json $(NODE_DIR)/package.json
	if ! command -v node >/dev/null || ! command -v npm >/dev/null; then \
	    $(APT_INSTALL) nodejs npm; \
	fi
	cd $(NODE_DIR) && npm ci --no-audit --no-fund --loglevel=error
	touch $@

node-deps: $(NODE_DIR)/node_modules/.installed

dist-node: node-deps
	mkdir -p $(DIST)
	rm -f $(DIST)/redis-lock-module-*.tgz
	cd $(NODE_DIR) && npm pack --silent --pack-destination $(DIST) >/dev/null
	ls $(DIST)/redis-lock-module-*.tgz

test-node: build testkit node-deps dist-node
	cd $(NODE_DIR) && npm run --silent build && npm run --silent typecheck
	export LOCK_MODULE=$(MODULE); \
	tests="$(NODE_TESTS)"; for bin in $(PKG_TEST_SERVERS); do \
	    echo; echo "== Node package tests against $$bin ($$($$bin --version | cut -d' ' -f1-3)): $$tests"; \
	    if [ -n "$$tests" ]; then \
	        ( cd $(NODE_DIR) && LOCK_SERVER_BIN=$$bin node --test --test-concurrency=1 $(NODE_TEST_FLAGS) $$tests ); \
	    fi; \
	    tests="$(filter $(NODE_TESTS),$(NODE_TESTS_EVERY_SERVER))"; \
	done; \
	echo; echo "== the npm tarball of $(DIST), installed into a fresh npm project"; \
	cd $(NODE_DIR) && LOCK_SERVER_BIN=$(SERVER_SYSTEM) REDIS_LOCK_DIST=$(DIST) node --test --test-concurrency=1 test/dist/dist.test.mjs test/dist/quickstart.test.mjs \
	    test/dist/examples.test.mjs
EXTRA_TESTS += test-node
