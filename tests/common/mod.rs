//! The integration tests' harness: a thin layer over the shared test kit
//! (`testkit/`, crate `redis-lock-testkit`), which starts throw-away `redis-server` /
//! `valkey-server` processes on free loopback ports, speaks RESP by hand and knows the
//! lock commands. This file keeps the names every `tests/*.rs` file (and the client
//! crate's tests, which include it) has always used; the environment variables are the
//! kit's: `LOCK_SERVER_BIN`, `LOCK_MODULE`, `LOCK_REDIS_CLI`, `LOCK_KEEP_DIRS`.
//!
//! Each integration test file uses `mod common;` and only some of this API.
#![allow(dead_code, unused_imports)]

pub use redis_lock_testkit::lock::{info_map, lock_stat};
pub use redis_lock_testkit::{
    free_port, key_slot, module_path, parse_flavor, redis_cli_bin, server_bin, server_flavor,
    starts_with_error_code, temp_dir, unix_ms, wait_until, Cluster, Flavor, RawConn, Resp, Server,
    ServerBuilder, CLUSTER_TIMEOUT, IO_TIMEOUT, START_TIMEOUT,
};
