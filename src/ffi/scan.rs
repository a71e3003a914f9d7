//! Walking a db's keys with `RedisModule_Scan`, a bounded step at a time (the cursor
//! survives between steps, and the server's SCAN guarantees hold: every key present for
//! the whole walk is seen at least once).

use std::ffi::c_void;

use redis_module::raw;

use super::datatype::TypeHandle;
use super::guard::catch;
use super::{api, Ctx, Str};

/// A walk over the selected db's keys.
pub struct Scan {
    cursor: *mut raw::RedisModuleScanCursor,
}

impl Default for Scan {
    fn default() -> Self {
        Scan::new()
    }
}

struct Visit<'f> {
    ty: *mut raw::RedisModuleType,
    seen: usize,
    f: &'f mut dyn FnMut(&[u8], usize),
}

extern "C" fn visit_cb(
    _ctx: *mut raw::RedisModuleCtx,
    name: *mut raw::RedisModuleString,
    key: *mut raw::RedisModuleKey,
    data: *mut c_void,
) {
    // SAFETY: `data` is the `Visit` that `step` passed, alive for the call of RM_Scan.
    let v = unsafe { &mut *data.cast::<Visit<'_>>() };
    v.seen += 1;
    if key.is_null() || name.is_null() {
        return;
    }
    // SAFETY: a key handle the server opened for this callback.
    let t = unsafe { api!(RedisModule_ModuleTypeGetType)(key) };
    if t.is_null() || t != v.ty {
        return;
    }
    // SAFETY: as above; the value pointer is only compared, never dereferenced here.
    let value = unsafe { api!(RedisModule_ModuleTypeGetValue)(key) } as usize;
    // SAFETY: the key name, live for the callback.
    let name = unsafe { Str::from_raw(name) }.bytes();
    let f = &mut v.f;
    catch(|| f(name, value));
}

impl Scan {
    pub fn new() -> Scan {
        // SAFETY: no arguments; the cursor is destroyed on drop.
        let cursor = unsafe { api!(RedisModule_ScanCursorCreate)() };
        Scan { cursor }
    }

    /// Visits keys of `ctx`'s selected db until about `budget` were seen or the db is
    /// done: `f(name, value address)` for each key holding a value of type `ty`. Returns
    /// whether keys are left, and how many were seen.
    pub fn step<T: 'static>(
        &mut self,
        ctx: Ctx<'_>,
        ty: &'static TypeHandle<T>,
        budget: usize,
        f: &mut dyn FnMut(&[u8], usize),
    ) -> (bool, usize) {
        if self.cursor.is_null() {
            return (false, 0);
        }
        let mut v = Visit {
            ty: ty.raw(),
            seen: 0,
            f,
        };
        while v.seen < budget {
            // SAFETY: a valid context and cursor; the callback matches the server's
            // signature and `v` outlives the call.
            let more = unsafe {
                api!(RedisModule_Scan)(
                    ctx.raw(),
                    self.cursor,
                    Some(visit_cb),
                    (&mut v as *mut Visit<'_>).cast(),
                )
            };
            if more == 0 {
                return (false, v.seen);
            }
        }
        (true, v.seen)
    }
}

impl Drop for Scan {
    fn drop(&mut self) {
        if !self.cursor.is_null() {
            // SAFETY: a cursor created by `new`, destroyed once.
            unsafe { api!(RedisModule_ScanCursorDestroy)(self.cursor) };
        }
    }
}
