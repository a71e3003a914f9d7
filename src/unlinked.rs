//! Which lock key the server unlinked last, so that the `expired` / `evicted`
//! notification that follows can be counted as a lock's. The module's own deletes
//! (release, reaping) are not expiries and are left out.

use std::cell::{Cell, RefCell};

use crate::ffi::MainThread;

type DbKey = (i32, Vec<u8>);
static LAST: MainThread<RefCell<Option<DbKey>>> = MainThread(RefCell::new(None));
static SUPPRESS: MainThread<Cell<bool>> = MainThread(Cell::new(false));

/// Called by the type's unlink hook.
pub fn note(db: i32, key: &[u8]) {
    if !SUPPRESS.get() {
        if let Ok(mut g) = LAST.try_borrow_mut() {
            *g = Some((db, key.to_vec()));
        }
    }
}

/// Runs one of the module's own deletes.
pub fn ours<R>(f: impl FnOnce() -> R) -> R {
    let prev = SUPPRESS.replace(true);
    let r = f();
    SUPPRESS.set(prev);
    r
}

/// True (once) if `key` was the last lock the server unlinked.
pub fn was_lock(db: i32, key: &[u8]) -> bool {
    match LAST.try_borrow_mut() {
        Ok(mut g) => match g.as_ref() {
            Some((d, k)) if *d == db && k == key => {
                *g = None;
                true
            }
            _ => false,
        },
        Err(_) => false,
    }
}
