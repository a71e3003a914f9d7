//! An open key, closed on drop, generic over the module value it may hold.

use std::ffi::c_int;
use std::marker::PhantomData;
use std::slice;

use redis_module::raw;

use super::datatype::TypeHandle;
use super::{api, OK};

/// What an open key holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyKind {
    Empty,
    String,
    /// A value of the given module type.
    Ours,
    Other,
}

/// An open key, closed on drop. What it holds (and where its module value is) is looked
/// up once and remembered until the module changes the key through this handle.
pub struct Key<'a, T: 'static> {
    raw: *mut raw::RedisModuleKey,
    kind: std::cell::Cell<Option<KeyKind>>,
    value: *mut T,
    ty: &'static TypeHandle<T>,
    _ctx: PhantomData<&'a ()>,
}

impl<T: 'static> Key<'_, T> {
    /// Wraps a handle `RedisModule_OpenKey` returned (NULL for a missing key opened
    /// read-only); closed on drop.
    pub(super) fn new(raw: *mut raw::RedisModuleKey, ty: &'static TypeHandle<T>) -> Self {
        Key {
            raw,
            kind: std::cell::Cell::new(None),
            value: std::ptr::null_mut(),
            ty,
            _ctx: PhantomData,
        }
    }

    pub fn kind(&self) -> KeyKind {
        if let Some(k) = self.kind.get() {
            return k;
        }
        let k = self.lookup_kind();
        self.kind.set(Some(k));
        k
    }

    fn lookup_kind(&self) -> KeyKind {
        if self.raw.is_null() {
            return KeyKind::Empty;
        }
        // SAFETY: an open key handle.
        let t = unsafe { api!(RedisModule_KeyType)(self.raw) };
        const EMPTY: c_int = raw::REDISMODULE_KEYTYPE_EMPTY as c_int;
        const STRING: c_int = raw::REDISMODULE_KEYTYPE_STRING as c_int;
        const MODULE: c_int = raw::REDISMODULE_KEYTYPE_MODULE as c_int;
        match t {
            EMPTY => KeyKind::Empty,
            STRING => KeyKind::String,
            MODULE => {
                // SAFETY: an open key holding a module value.
                let mt = unsafe { api!(RedisModule_ModuleTypeGetType)(self.raw) };
                if mt == self.ty.raw() && !mt.is_null() {
                    KeyKind::Ours
                } else {
                    KeyKind::Other
                }
            }
            _ => KeyKind::Other,
        }
    }

    /// The module value, if the key holds one of the type; borrowed as long as the key is.
    pub fn value(&mut self) -> Option<&mut T> {
        if self.kind() != KeyKind::Ours {
            return None;
        }
        if self.value.is_null() {
            // SAFETY: an open key holding a value of our type.
            self.value = unsafe { api!(RedisModule_ModuleTypeGetValue)(self.raw) }.cast::<T>();
        }
        // SAFETY: the key holds a value of our type, which is always a `Box<T>` given to
        // the server by `put` or the type's load callback; the server keeps it while the
        // key is open and unchanged (every change through this handle forgets the
        // pointer), and `&mut self` keeps anyone else from changing it.
        unsafe { self.value.as_mut() }
    }

    /// Stores a module value (replacing what the key holds); false if the server refused.
    pub fn put(&mut self, v: Box<T>) -> bool {
        let p = Box::into_raw(v);
        // SAFETY: a key opened for writing; on success the server owns `p`.
        let ok = unsafe { api!(RedisModule_ModuleTypeSetValue)(self.raw, self.ty.raw(), p.cast()) }
            == OK;
        self.kind.set(None);
        self.value = std::ptr::null_mut();
        if !ok {
            // SAFETY: the server refused it, so `p` is still ours alone.
            drop(unsafe { Box::from_raw(p) });
        }
        ok
    }

    /// Whether the string value equals `b`. Write paths only: the server's direct access
    /// turns a shared or integer encoding into a plain one.
    pub fn string_eq(&mut self, b: &[u8]) -> bool {
        let mut len = 0usize;
        // SAFETY: an open key holding a string (callers check `kind()`).
        let p = unsafe {
            api!(RedisModule_StringDMA)(self.raw, &mut len, raw::REDISMODULE_READ as c_int)
        };
        if p.is_null() {
            return false;
        }
        // SAFETY: `p` points at the `len` bytes of the value while the key is open.
        unsafe { slice::from_raw_parts(p.cast::<u8>(), len) == b }
    }

    pub fn delete(&mut self) {
        // SAFETY: an open key (a no-op if opened read-only or empty).
        unsafe { api!(RedisModule_DeleteKey)(self.raw) };
        self.kind.set(None);
        self.value = std::ptr::null_mut();
    }

    /// Sets the key's expiry (nothing for an empty key: Redis 8 does not check).
    pub fn set_abs_expire(&mut self, at_ms: i64) {
        if self.kind() == KeyKind::Empty {
            return;
        }
        // SAFETY: an open key holding a value.
        unsafe { api!(RedisModule_SetAbsExpire)(self.raw, at_ms) };
    }

    /// Absolute expiry in unix ms, or None without one (or for an empty key, which
    /// Redis 8 does not check for).
    pub fn abs_expire(&self) -> Option<i64> {
        if self.kind() == KeyKind::Empty {
            return None;
        }
        // SAFETY: an open key holding a value.
        let v = unsafe { api!(RedisModule_GetAbsExpire)(self.raw) };
        (v >= 0).then_some(v)
    }
}

impl<T: 'static> Drop for Key<'_, T> {
    fn drop(&mut self) {
        if !self.raw.is_null() {
            // SAFETY: opened by `Ctx::open_key`, closed exactly once here.
            unsafe { api!(RedisModule_CloseKey)(self.raw) };
        }
    }
}
