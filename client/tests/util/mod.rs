//! Helpers shared by the client's integration tests (the server harness itself is the
//! root crate's tests/common/mod.rs, included by each test file).
#![allow(dead_code)]

use std::path::Path;
use std::sync::Once;
use std::time::Duration;

/// Points the harness at the module built by the workspace (`target/release/`): its
/// default looks under the including crate's directory, which is `client/` here.
pub fn setup() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if std::env::var_os("LOCK_MODULE").is_none_or(|v| v.is_empty()) {
            let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
            let target = std::env::var_os("CARGO_TARGET_DIR")
                .filter(|v| !v.is_empty())
                .map(std::path::PathBuf::from)
                .unwrap_or_else(|| root.join("target"));
            let so = target.join("release").join("libredis_lock.so");
            // Set once, before any test thread reads the environment (all go through here).
            std::env::set_var("LOCK_MODULE", so);
        }
    });
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

/// Sends a signal to a server process.
pub fn signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) on a child process the harness started.
    unsafe {
        libc::kill(pid as libc::pid_t, sig);
    }
}

/// SIGSTOPs a process and SIGCONTs it when dropped (also when a test panics).
pub struct Stopped(pub u32);

impl Stopped {
    pub fn new(pid: u32) -> Stopped {
        signal(pid, libc::SIGSTOP);
        Stopped(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        signal(self.0, libc::SIGCONT);
    }
}

pub const MS: Duration = Duration::from_millis(1);

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}
