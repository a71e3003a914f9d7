//! A module data type behind a safe trait. The server's C callbacks are generic
//! trampolines here; they turn raw pointers into typed, borrowed values and call the
//! [`DataType`] implementation, which never sees a pointer. Values live in a `Box<T>`
//! that the server owns between `put` and `free`.

use std::ffi::{c_int, c_void, CString};
use std::marker::PhantomData;
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};

use redis_module::raw;

use super::guard::catch;
use super::{api, api_opt, Ctx, Str, OK};

/// Reading an RDB value (or a DUMP payload) field by field. Every read checks the
/// server's I/O error flag, so a truncated payload reads as `None`, never as zeroes.
pub struct RdbIn(*mut raw::RedisModuleIO);

impl RdbIn {
    fn ok<T>(&self, v: T) -> Option<T> {
        // SAFETY: a live IO handle (only built inside the load callbacks).
        (unsafe { api!(RedisModule_IsIOError)(self.0) } == 0).then_some(v)
    }
    pub fn u64(&mut self) -> Option<u64> {
        // SAFETY: a live IO handle.
        let v = unsafe { api!(RedisModule_LoadUnsigned)(self.0) };
        self.ok(v)
    }
    pub fn i64(&mut self) -> Option<i64> {
        // SAFETY: a live IO handle.
        let v = unsafe { api!(RedisModule_LoadSigned)(self.0) };
        self.ok(v)
    }
    pub fn bytes(&mut self) -> Option<Vec<u8>> {
        let mut len = 0usize;
        // SAFETY: a live IO handle; the buffer returned is ours to free.
        let p = unsafe { api!(RedisModule_LoadStringBuffer)(self.0, &mut len) };
        if p.is_null() {
            return None;
        }
        // SAFETY: the server returned `len` readable bytes at `p`.
        let v = unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) }.to_vec();
        // SAFETY: allocated by the server's allocator for us.
        unsafe { api!(RedisModule_Free)(p.cast()) };
        self.ok(v)
    }
    /// The key being loaded and its db, when the server says (RDB load, RESTORE).
    pub fn key(&self) -> Option<(i32, Vec<u8>)> {
        let (name, db) = (
            api_opt!(RedisModule_GetKeyNameFromIO),
            api_opt!(RedisModule_GetDbIdFromIO),
        );
        let (name, db) = (name?, db?);
        // SAFETY: a live IO handle; the name (if any) lives as long as it does.
        let (s, d) = unsafe { (name(self.0), db(self.0)) };
        if s.is_null() || d < 0 {
            return None;
        }
        // SAFETY: a live string owned by the server for the callback.
        Some((d, unsafe { Str::from_raw(s.cast_mut()) }.bytes().to_vec()))
    }
}

/// Writing an RDB value field by field.
pub struct RdbOut(*mut raw::RedisModuleIO);

impl RdbOut {
    pub fn u64(&mut self, v: u64) {
        // SAFETY: a live IO handle (only built inside the save callbacks).
        unsafe { api!(RedisModule_SaveUnsigned)(self.0, v) }
    }
    pub fn i64(&mut self, v: i64) {
        // SAFETY: as above.
        unsafe { api!(RedisModule_SaveSigned)(self.0, v) }
    }
    pub fn bytes(&mut self, b: &[u8]) {
        // SAFETY: as above; the buffer is copied.
        unsafe { api!(RedisModule_SaveStringBuffer)(self.0, b.as_ptr().cast(), b.len()) }
    }
}

/// An AOF being rewritten: commands go in one by one.
pub struct AofOut(*mut raw::RedisModuleIO);

impl AofOut {
    /// Emits `cmd key args...` (each argument binary-safe, at most six).
    pub fn emit(&mut self, cmd: &std::ffi::CStr, key: Str<'_>, args: &[&[u8]]) {
        super::emit(super::Emit::Aof(self.0), cmd, key, args);
    }

    /// Emits `cmd args...`, a command without a key.
    pub fn emit_keyless(&mut self, cmd: &std::ffi::CStr, args: &[&[u8]]) {
        super::emit_all(super::Emit::Aof(self.0), cmd, args);
    }
}

/// Feeds DEBUG DIGEST.
pub struct DigestOut(*mut raw::RedisModuleDigest);

impl DigestOut {
    pub fn bytes(&mut self, b: &[u8]) {
        // SAFETY: a live digest context (only built inside the digest callback).
        unsafe { api!(RedisModule_DigestAddStringBuffer)(self.0, b.as_ptr().cast(), b.len()) }
    }
    pub fn int(&mut self, v: i64) {
        // SAFETY: as above.
        unsafe { api!(RedisModule_DigestAddLongLong)(self.0, v) }
    }
    pub fn end(&mut self) {
        // SAFETY: as above.
        unsafe { api!(RedisModule_DigestEndSequence)(self.0) }
    }
}

/// What the module's data type does; the trampolines below call it.
pub trait DataType: 'static {
    type Value: 'static;
    const NAME: &'static str;
    const ENCODING: c_int;
    /// Decodes a value (None fails the load or the RESTORE).
    fn load(io: &mut RdbIn, encver: c_int) -> Option<Box<Self::Value>>;
    fn save(v: &Self::Value, io: &mut RdbOut);
    fn rewrite(v: &Self::Value, key: Str<'_>, aof: &mut AofOut);
    fn mem_usage(v: &Self::Value) -> usize;
    fn digest(v: &Self::Value, d: &mut DigestOut);
    /// The value left the keyspace (`db`, `key`); it may live on (RENAME, MOVE).
    fn unlinked(db: i32, key: &[u8], v: &Self::Value);
    /// Whether unlinks are not news now (the module's own deletes): the key's name is
    /// then not even asked for.
    fn unlink_ignored() -> bool {
        false
    }
    /// The server frees the value (possibly on a background thread).
    fn freed(v: Box<Self::Value>);
    fn aux_save(io: &mut RdbOut);
    fn aux_load(io: &mut RdbIn, encver: c_int) -> bool;
}

/// The registered type, for the keys that hold its values.
pub struct TypeHandle<T> {
    raw: AtomicPtr<raw::RedisModuleType>,
    _t: PhantomData<fn(T)>,
}

impl<T> TypeHandle<T> {
    pub const fn new() -> Self {
        TypeHandle {
            raw: AtomicPtr::new(ptr::null_mut()),
            _t: PhantomData,
        }
    }

    pub(super) fn raw(&self) -> *mut raw::RedisModuleType {
        self.raw.load(Ordering::Relaxed)
    }
}

impl<T> Default for TypeHandle<T> {
    fn default() -> Self {
        Self::new()
    }
}

/// Creates the data type `D` and records it in `handle`.
pub fn create<D: DataType>(ctx: Ctx<'_>, handle: &TypeHandle<D::Value>) -> bool {
    let mut methods = raw::RedisModuleTypeMethods {
        // Version 4 is what Redis 7.0 knows (unlink2 and friends).
        version: 4,
        rdb_load: Some(rdb_load::<D>),
        rdb_save: Some(rdb_save::<D>),
        aof_rewrite: Some(aof_rewrite::<D>),
        mem_usage: Some(mem_usage::<D>),
        digest: Some(digest::<D>),
        free: Some(free::<D>),
        aux_load: Some(aux_load::<D>),
        aux_save: Some(aux_save::<D>),
        aux_save_triggers: raw::REDISMODULE_AUX_AFTER_RDB as c_int,
        free_effort: None,
        unlink: None,
        copy: None,
        defrag: None,
        mem_usage2: None,
        free_effort2: None,
        unlink2: Some(unlink2::<D>),
        copy2: None,
        aux_save2: None,
    };
    let Ok(name) = CString::new(D::NAME) else {
        return false;
    };
    // SAFETY: a load-time context; the methods struct is copied by the server and the
    // callbacks below match its signatures.
    let t = unsafe {
        api!(RedisModule_CreateDataType)(ctx.raw(), name.as_ptr(), D::ENCODING, &mut methods)
    };
    handle.raw.store(t, Ordering::Relaxed);
    !t.is_null()
}

/// The value behind a pointer the server hands to a type callback.
///
/// # Safety
/// `v` must be a live value of this type (a `Box<D::Value>` given to the server).
unsafe fn value<'a, D: DataType>(v: *const c_void) -> &'a D::Value {
    // SAFETY: caller's contract.
    unsafe { &*v.cast::<D::Value>() }
}

extern "C" fn rdb_load<D: DataType>(io: *mut raw::RedisModuleIO, encver: c_int) -> *mut c_void {
    catch(|| D::load(&mut RdbIn(io), encver))
        .flatten()
        .map_or(ptr::null_mut(), |b| Box::into_raw(b).cast())
}

extern "C" fn rdb_save<D: DataType>(io: *mut raw::RedisModuleIO, v: *mut c_void) {
    // SAFETY: the server passes a live value of this type.
    let v = unsafe { value::<D>(v) };
    catch(|| D::save(v, &mut RdbOut(io)));
}

extern "C" fn aof_rewrite<D: DataType>(
    aof: *mut raw::RedisModuleIO,
    key: *mut raw::RedisModuleString,
    v: *mut c_void,
) {
    // SAFETY: the server passes the key's name and its live value of this type.
    let (key, v) = unsafe { (Str::from_raw(key), value::<D>(v)) };
    catch(|| D::rewrite(v, key, &mut AofOut(aof)));
}

extern "C" fn mem_usage<D: DataType>(v: *const c_void) -> usize {
    // SAFETY: the server passes a live value of this type.
    let v = unsafe { value::<D>(v) };
    catch(|| D::mem_usage(v)).unwrap_or(0)
}

extern "C" fn digest<D: DataType>(md: *mut raw::RedisModuleDigest, v: *mut c_void) {
    // SAFETY: the server passes a live value of this type.
    let v = unsafe { value::<D>(v) };
    catch(|| D::digest(v, &mut DigestOut(md)));
}

extern "C" fn free<D: DataType>(v: *mut c_void) {
    if v.is_null() {
        return;
    }
    // SAFETY: the server gives up a value of this type, exactly once.
    let b = unsafe { Box::from_raw(v.cast::<D::Value>()) };
    catch(move || D::freed(b));
}

extern "C" fn unlink2<D: DataType>(ctx: *mut raw::RedisModuleKeyOptCtx, v: *const c_void) {
    if D::unlink_ignored() {
        return;
    }
    // SAFETY: a live key-operation context and a live value of this type; the name lives
    // as long as the context does.
    let (name, db, v) = unsafe {
        (
            Str::from_raw(api!(RedisModule_GetKeyNameFromOptCtx)(ctx).cast_mut()),
            api!(RedisModule_GetDbIdFromOptCtx)(ctx),
            value::<D>(v),
        )
    };
    catch(|| D::unlinked(db, name.bytes(), v));
}

extern "C" fn aux_save<D: DataType>(io: *mut raw::RedisModuleIO, when: c_int) {
    if when == raw::REDISMODULE_AUX_AFTER_RDB as c_int {
        catch(|| D::aux_save(&mut RdbOut(io)));
    }
}

extern "C" fn aux_load<D: DataType>(
    io: *mut raw::RedisModuleIO,
    encver: c_int,
    when: c_int,
) -> c_int {
    let ok = when == raw::REDISMODULE_AUX_AFTER_RDB as c_int
        && catch(|| D::aux_load(&mut RdbIn(io), encver)) == Some(true);
    if ok {
        OK
    } else {
        raw::REDISMODULE_ERR as c_int
    }
}
