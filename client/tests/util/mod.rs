//! Helpers shared by the client's integration tests; servers come from the shared test
//! kit (`redis-lock-testkit`).
#![allow(dead_code, unused_imports)]

use std::time::Duration;

use redis_lock_client::{LockClient, LossReason, Redlock, RedlockOptions};
use redis_lock_testkit::{Resp, Server, ServerBuilder};

pub mod proxy;

pub use redis_lock_testkit::Stopped;

/// The `redis-lock` binary, stdin closed, with none of the settings it reads from the
/// environment (REDIS_*, SSL_CERT_FILE) inherited from the test's.
pub fn cli_cmd() -> std::process::Command {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_redis-lock"));
    for name in [
        "REDIS_LOCK_URL",
        "REDIS_URL",
        "REDIS_LOCK_PASSWORD",
        "REDISCLI_AUTH",
        "REDIS_LOCK_USER",
        "REDIS_LOCK_TOKEN",
        "REDIS_LOCK_REPLICAS",
        "SSL_CERT_FILE",
    ] {
        c.env_remove(name);
    }
    c.stdin(std::process::Stdio::null());
    c
}

/// Fails early, with the build command in the message, when the module is not built
/// (the kit finds the workspace's `target/release/libredis_lock.so` by itself).
pub fn setup() {
    redis_lock_testkit::module_path();
}

/// `LOCK.INFO key` on a connection, as the raw value (nil when free).
pub fn lock_info(c: &mut redis::Connection, key: &str) -> redis::Value {
    redis::cmd("LOCK.INFO").arg(key).query(c).unwrap()
}

/// The fences of every holder of `key`, from the raw RESP2 `LOCK.INFO` (sorted; empty
/// when free).
pub fn raw_fences(server: &Server, key: &str) -> Vec<u64> {
    let r = server.raw().cmd(&["LOCK.INFO", key]);
    if r == Resp::Nil {
        return Vec::new();
    }
    let list = r.field("holder-list").expect("a holder-list");
    let mut fences: Vec<u64> = list
        .items()
        .into_iter()
        .map(|h| {
            let fence = h.field("fence").and_then(|f| f.as_int());
            fence.expect("a fence per holder") as u64
        })
        .collect();
    fences.sort_unstable();
    fences
}

/// The `fence` field of `LOCK.INFO key`, `None` when free.
pub fn held_fence(c: &mut redis::Connection, key: &str) -> Option<u64> {
    match lock_info(c, key) {
        redis::Value::Nil => None,
        redis::Value::Array(items) => items.chunks(2).find_map(|kv| match (&kv[0], &kv[1]) {
            (redis::Value::BulkString(k), redis::Value::Int(f)) if k == b"fence" => Some(*f as u64),
            _ => None,
        }),
        other => panic!("unexpected LOCK.INFO reply {other:?}"),
    }
}

pub fn is_free(c: &mut redis::Connection, key: &str) -> bool {
    matches!(lock_info(c, key), redis::Value::Nil)
}

pub const MS: Duration = Duration::from_millis(1);

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A lease of `ttl_ms`, renewed for up to a minute.
pub fn renewing(ttl_ms: u64) -> redis_lock_client::AcquireOptions {
    redis_lock_client::AcquireOptions::new(ms(ttl_ms)).auto_renew(Duration::from_secs(60))
}

/// Renewal for a minute, every 500 ms, the loss signal 300 ms before the lease can end:
/// with a 3 s TTL a renewal may come 2.2 s late (a loaded machine's pause) before the
/// guard gives the lease up (a third of the TTL each, the default, leaves 1 s).
pub fn steady_renewal() -> redis_lock_client::Renewal {
    redis_lock_client::Renewal {
        max_hold: Duration::from_secs(60),
        interval: Some(ms(500)),
        margin: Some(ms(300)),
    }
}

/// The guard of an acquisition that must be granted.
pub async fn granted(
    acquisition: impl std::future::Future<
        Output = redis_lock_client::Result<Option<redis_lock_client::LockGuard>>,
    >,
) -> redis_lock_client::LockGuard {
    acquisition.await.unwrap().expect("granted")
}

pub async fn client(url: &str) -> LockClient {
    LockClient::connect(url).await.expect("connect")
}

/// A server started from `builder` (after `setup`), a connection to it and a lock
/// client of it.
pub async fn server_with_client(builder: ServerBuilder) -> (Server, redis::Connection, LockClient) {
    setup();
    let server = builder.start();
    let conn = server.conn();
    let locks = client(&server.url()).await;
    (server, conn, locks)
}

/// `n` servers with the module.
pub fn servers(n: usize) -> Vec<Server> {
    (0..n).map(|_| ServerBuilder::new().start()).collect()
}

pub fn urls(servers: &[Server]) -> Vec<String> {
    servers.iter().map(|s| s.url()).collect()
}

/// A Redlock over `urls` whose nodes must answer within `node_timeout`.
pub fn redlock(urls: &[String], node_timeout: Duration) -> Redlock {
    Redlock::with_options(
        urls,
        RedlockOptions {
            node_timeout: Some(node_timeout),
            ..RedlockOptions::default()
        },
    )
    .unwrap()
}

/// A direct grant on `server`: its fence (to read the node's counter).
pub fn probe_fence(server: &Server) -> u64 {
    let key = format!("probe:{}", uuid::Uuid::new_v4());
    let v: (String, u64) = redis::cmd("LOCK.ACQUIRE")
        .arg(&key)
        .arg("PX")
        .arg(1_000)
        .query(&mut server.conn())
        .unwrap();
    v.1
}

/// Lifts `server`'s fence counter as far as MINFENCE may: `margin_ms` short of an hour
/// ahead of its clock term (`unix_ms << 10`), like a node whose clock runs fast.
/// Returns that fence.
pub fn lift_fence_counter(server: &Server, margin_ms: u64) -> u64 {
    let now_ms = redis_lock_testkit::unix_ms() as u64;
    let ahead = (now_ms + 3_600_000 - margin_ms) << redis_lock_testkit::lock::FENCE_SHIFT;
    let lifted: redis::Value = redis::cmd("LOCK.ACQUIRE")
        .arg("other")
        .arg("PX")
        .arg(1_000)
        .arg("MINFENCE")
        .arg(ahead)
        .query(&mut server.conn())
        .unwrap();
    assert!(matches!(lifted, redis::Value::Array(_)), "{lifted:?}");
    ahead
}

/// What a loss signal says within `limit`; panics when it does not fire in time or
/// the guard was released instead.
pub async fn lost_within(
    limit: Duration,
    lost: impl std::future::Future<Output = Option<LossReason>>,
) -> LossReason {
    tokio::time::timeout(limit, lost)
        .await
        .expect("the loss signal fires in time")
        .expect("lost, not released")
}

/// One numeric field of `server`'s `INFO lock` (`lock_` prefix optional).
pub fn lock_stat(server: &Server, field: &str) -> i64 {
    redis_lock_testkit::lock::lock_stat(&mut server.raw(), field)
}

/// The server's own lease deadline of `key` (`expires-at` of `LOCK.INFO`, unix ms) for an
/// exclusive lock; `None` when free.
pub fn expires_at(server: &Server, key: &str) -> Option<i64> {
    let r = server.raw().cmd(&["LOCK.INFO", key]);
    r.get("expires-at").and_then(|v| v.as_int())
}

/// True while process `pid` exists and is not a zombie (one whose parent died is reaped
/// by init, or stays a zombie until then).
pub fn process_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name in parentheses: "pid (comm) S ...".
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// `n` servers with the module that require the password `pw` (set once they run: the
/// kit's start-up check talks to them without one).
pub fn servers_with_password(n: usize, pw: &str) -> Vec<Server> {
    let s = servers(n);
    for x in &s {
        let r = x.raw().cmd(&["CONFIG", "SET", "requirepass", pw]);
        assert!(!r.is_error(), "{r:?}");
    }
    s
}
