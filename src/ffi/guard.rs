//! No panic may cross into the server: every entry point runs inside [`catch`], and a
//! caught panic becomes an error reply plus a line in the server log.

use std::ffi::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};

use super::{log_raw, Ctx, OK};
use crate::error::LockError;
use crate::reply::Reply;

/// Panics caught so far (`lock_panics` in INFO).
pub static PANICS: AtomicU64 = AtomicU64::new(0);

pub fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let msg = format!("redis-lock: caught a panic, the command fails with an error: {info}");
        log_raw(std::ptr::null_mut(), "warning", &msg);
    }));
}

/// Runs `f`, turning a panic into `None`.
pub fn catch<R>(f: impl FnOnce() -> R) -> Option<R> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => Some(r),
        Err(_) => {
            PANICS.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

/// The body of every command: it answers with a reply value (None: the client was
/// blocked and is answered later), written here in one piece; errors and panics are
/// replied here too, each with an error code. Nothing is written before the value is
/// whole, so a panic cannot leave half a reply on the connection.
pub fn command<'a>(
    ctx: Ctx<'_>,
    name: &'static str,
    f: impl FnOnce() -> Result<Option<Reply<'a>>, LockError>,
) -> c_int {
    let reply = match catch(f) {
        Some(Ok(Some(r))) => r,
        Some(Ok(None)) => return OK,
        Some(Err(e)) => Reply::Error(e),
        None => Reply::Error(LockError::Internal(name)),
    };
    super::reply::send(ctx, &reply);
    OK
}
