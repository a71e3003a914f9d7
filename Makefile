# redis-lock: build, run and test the module.
#
#   make deps    install packages + fetch the extra server binaries (scripts/deps.sh)
#   make build   cargo build --release  -> target/release/libredis_lock.so
#   make run     start redis-server in the foreground on 127.0.0.1:$(PORT) with the module
#   make test    fmt, clippy, build, unit tests, then the integration suite once per server
#   make clean   remove build output

SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c

PORT     ?= 6379
CARGO    ?= cargo
MODULE   := $(CURDIR)/target/release/libredis_lock.so
REDIS_CLI ?= /usr/bin/redis-cli

# Servers the integration suite runs against, in this order.
SERVER_SYSTEM := /usr/bin/redis-server
SERVER_REDIS8 := $(CURDIR)/.servers/redis-8.2.3/redis-server
SERVER_VALKEY := $(CURDIR)/.servers/valkey-8.1.8/valkey-server
TEST_SERVERS  ?= $(SERVER_SYSTEM) $(SERVER_REDIS8) $(SERVER_VALKEY)
# Server used by `make run` (e.g. make run RUN_SERVER=$(SERVER_VALKEY)).
RUN_SERVER    ?= $(SERVER_SYSTEM)
# Extra arguments for the test binaries, e.g. make test TEST_ARGS='some_test_name'
TEST_ARGS ?=

.PHONY: all deps build run test unit integration lint clean

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

integration: build
	export LOCK_MODULE=$(MODULE) LOCK_REDIS_CLI=$(REDIS_CLI); \
	for bin in $(TEST_SERVERS); do \
	    ver=$$($$bin --version); \
	    echo; \
	    echo "=================================================================="; \
	    echo "== integration tests against $$bin"; \
	    echo "== $$ver"; \
	    echo "=================================================================="; \
	    LOCK_SERVER_BIN=$$bin $(CARGO) test --release -p redis-lock --test '*' -- $(TEST_ARGS); \
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

clean:
	$(CARGO) clean
	rm -rf appendonlydir dump.rdb
