//! No panic may cross into the server: every entry point runs inside `catch`, and a
//! caught panic becomes an error reply plus a line in the server log.

use std::ffi::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};

use redis_module::raw;

use crate::error::LockError;
use crate::ffi::{self, Ctx};
use crate::info::{bump, STATS};

pub fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let msg = format!("redis-lock: caught a panic, the command fails with an error: {info}");
        ffi::log(std::ptr::null_mut(), "warning", &msg);
    }));
}

/// Runs `f`, turning a panic into `None`.
pub fn catch<R>(f: impl FnOnce() -> R) -> Option<R> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => Some(r),
        Err(_) => {
            bump(&STATS.panics);
            None
        }
    }
}

/// The body of every command: the handler replies on success; errors and panics are
/// replied here, each with an error code.
pub fn command(ctx: Ctx, name: &'static str, f: impl FnOnce() -> Result<(), LockError>) -> c_int {
    match catch(f) {
        Some(Ok(())) => {}
        Some(Err(e)) => ffi::reply_error(ctx, &e.to_string()),
        None => ffi::reply_error(ctx, &LockError::Internal(name).to_string()),
    }
    raw::REDISMODULE_OK as c_int
}
