//! Helpers shared by the client's integration tests; servers come from the shared test
//! kit (`redis-lock-testkit`).
#![allow(dead_code, unused_imports)]

use std::time::Duration;

pub use redis_lock_testkit::Stopped;

/// Fails early, with the build command in the message, when the module is not built
/// (the kit finds the workspace's `target/release/libredis_lock.so` by itself).
pub fn setup() {
    redis_lock_testkit::module_path();
}

/// `LOCK.INFO key` on a connection, as the raw value (nil when free).
pub fn lock_info(c: &mut redis::Connection, key: &str) -> redis::Value {
    redis::cmd("LOCK.INFO").arg(key).query(c).unwrap()
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

/// The guard of an acquisition that must be granted.
pub async fn granted(
    acquisition: impl std::future::Future<
        Output = redis_lock_client::Result<Option<redis_lock_client::LockGuard>>,
    >,
) -> redis_lock_client::LockGuard {
    acquisition.await.unwrap().expect("granted")
}
