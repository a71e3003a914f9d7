//! The few raw Redis Module API calls the module needs, each wrapped once. Everything
//! `unsafe` about talking to the server lives here or in the type callbacks.

use std::ffi::{c_char, c_int, c_void, CString};
use std::ptr;
use std::slice;

use std::cell::RefCell;

use redis_module::raw;

use crate::state::MainThread;

pub type Ctx = *mut raw::RedisModuleCtx;
pub type RStr = *mut raw::RedisModuleString;

/// Calls a function pointer the server filled in at load time.
macro_rules! api {
    ($name:ident) => {{
        #[allow(unused_unsafe)]
        let f = unsafe { redis_module::raw::$name };
        f.expect(concat!(
            stringify!($name),
            " is not available on this server"
        ))
    }};
}
pub(crate) use api;

pub fn now_ms() -> i64 {
    unsafe { api!(RedisModule_Milliseconds)() }
}

/// The bytes of a server string. The slice lives as long as the string.
pub fn bytes<'a>(s: RStr) -> &'a [u8] {
    let mut len = 0usize;
    let p = unsafe { api!(RedisModule_StringPtrLen)(s, &mut len) };
    if p.is_null() {
        return &[];
    }
    unsafe { slice::from_raw_parts(p.cast::<u8>(), len) }
}

/// A server string the module owns (not tied to a context); freed on drop.
pub struct OwnedStr(RStr);

impl OwnedStr {
    pub fn new(b: &[u8]) -> Self {
        OwnedStr(unsafe {
            api!(RedisModule_CreateString)(ptr::null_mut(), b.as_ptr().cast(), b.len())
        })
    }
    pub fn ptr(&self) -> RStr {
        self.0
    }
}

impl Drop for OwnedStr {
    fn drop(&mut self) {
        unsafe { api!(RedisModule_FreeString)(ptr::null_mut(), self.0) }
    }
}

pub fn context_flags(ctx: Ctx) -> u32 {
    unsafe { api!(RedisModule_GetContextFlags)(ctx) as u32 }
}

pub fn flag(ctx: Ctx, f: u32) -> bool {
    context_flags(ctx) & f != 0
}

pub const FLAG_SLAVE: u32 = raw::REDISMODULE_CTX_FLAGS_SLAVE;
pub const FLAG_REPLICATED: u32 = raw::REDISMODULE_CTX_FLAGS_REPLICATED;
pub const FLAG_LOADING: u32 = raw::REDISMODULE_CTX_FLAGS_LOADING;
pub const FLAG_DENY_BLOCKING: u32 = raw::REDISMODULE_CTX_FLAGS_DENY_BLOCKING;
pub const FLAG_MULTI: u32 = raw::REDISMODULE_CTX_FLAGS_MULTI;
pub const FLAG_LUA: u32 = raw::REDISMODULE_CTX_FLAGS_LUA;

pub fn client_id(ctx: Ctx) -> u64 {
    unsafe { api!(RedisModule_GetClientId)(ctx) }
}

/// Addresses of recent clients by id. Client ids are never reused while the server
/// runs and a connection's peer address never changes, so an entry is never stale;
/// the cache spares a lookup and a getpeername() syscall per grant.
const ADDR_CACHE_SLOTS: usize = 512;
type AddrSlots = Vec<(u64, Vec<u8>)>;
static ADDR_CACHE: MainThread<RefCell<AddrSlots>> = MainThread(RefCell::new(Vec::new()));

/// `ip:port` of a connected client, or empty when unknown (AOF loading, timers).
pub fn client_addr(id: u64) -> Vec<u8> {
    if id == 0 {
        return Vec::new();
    }
    let slot = (id % ADDR_CACHE_SLOTS as u64) as usize;
    if let Ok(cache) = ADDR_CACHE.try_borrow() {
        if let Some((cid, addr)) = cache.get(slot) {
            if *cid == id {
                return addr.clone();
            }
        }
    }
    let addr = lookup_client_addr(id);
    if !addr.is_empty() {
        if let Ok(mut cache) = ADDR_CACHE.try_borrow_mut() {
            if cache.is_empty() {
                cache.resize(ADDR_CACHE_SLOTS, (0, Vec::new()));
            }
            cache[slot] = (id, addr.clone());
        }
    }
    addr
}

fn lookup_client_addr(id: u64) -> Vec<u8> {
    let mut info: raw::RedisModuleClientInfo = unsafe { std::mem::zeroed() };
    info.version = 1;
    let ok = unsafe {
        api!(RedisModule_GetClientInfoById)(
            (&mut info as *mut raw::RedisModuleClientInfo).cast(),
            id,
        )
    };
    if ok != raw::REDISMODULE_OK as c_int {
        return Vec::new();
    }
    let addr: Vec<u8> = info
        .addr
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    let mut out = addr;
    out.push(b':');
    out.extend_from_slice(info.port.to_string().as_bytes());
    out
}

pub fn selected_db(ctx: Ctx) -> i32 {
    unsafe { api!(RedisModule_GetSelectedDb)(ctx) }
}

pub fn select_db(ctx: Ctx, db: i32) -> bool {
    unsafe { api!(RedisModule_SelectDb)(ctx, db) == raw::REDISMODULE_OK as c_int }
}

pub fn log(ctx: Ctx, level: &str, msg: &str) {
    let (Ok(level), Ok(fmt), Ok(msg)) = (
        CString::new(level),
        CString::new("%s"),
        CString::new(msg.replace('\0', "\\0")),
    ) else {
        return;
    };
    if let Some(f) = unsafe { raw::RedisModule_Log } {
        unsafe { f(ctx, level.as_ptr(), fmt.as_ptr(), msg.as_ptr()) }
    }
}

pub fn notify(ctx: Ctx, class: c_int, event: &'static [u8], key: RStr) {
    // `event` literals end in NUL; see the call sites.
    debug_assert!(event.ends_with(b"\0"));
    unsafe {
        api!(RedisModule_NotifyKeyspaceEvent)(ctx, class, event.as_ptr().cast::<c_char>(), key);
    }
}

// ---- replies ---------------------------------------------------------------------

pub fn reply_error(ctx: Ctx, text: &str) {
    let c = CString::new(text.replace('\0', " ")).unwrap_or_default();
    unsafe { api!(RedisModule_ReplyWithError)(ctx, c.as_ptr()) };
}
pub fn reply_int(ctx: Ctx, v: i64) {
    unsafe { api!(RedisModule_ReplyWithLongLong)(ctx, v) };
}
pub fn reply_null(ctx: Ctx) {
    unsafe { api!(RedisModule_ReplyWithNull)(ctx) };
}
pub fn reply_bytes(ctx: Ctx, b: &[u8]) {
    unsafe { api!(RedisModule_ReplyWithStringBuffer)(ctx, b.as_ptr().cast(), b.len()) };
}
pub fn reply_array(ctx: Ctx, len: usize) {
    unsafe { api!(RedisModule_ReplyWithArray)(ctx, len as _) };
}
/// A map in RESP3, a flat field/value array in RESP2.
pub fn reply_map(ctx: Ctx, pairs: usize) {
    unsafe { api!(RedisModule_ReplyWithMap)(ctx, pairs as _) };
}
pub fn reply_simple(ctx: Ctx, s: &'static [u8]) {
    debug_assert!(s.ends_with(b"\0"));
    unsafe { api!(RedisModule_ReplyWithSimpleString)(ctx, s.as_ptr().cast()) };
}

/// `[token, fence]`, the reply of a successful acquire.
pub fn reply_grant(ctx: Ctx, token: &[u8], fence: u64) {
    reply_array(ctx, 2);
    reply_bytes(ctx, token);
    reply_int(ctx, fence as i64);
}

// ---- keys ------------------------------------------------------------------------

/// An open key, closed on drop.
pub struct Key {
    pub ptr: *mut raw::RedisModuleKey,
}

impl Key {
    pub fn open_write(ctx: Ctx, name: RStr) -> Key {
        let mode = (raw::REDISMODULE_READ | raw::REDISMODULE_WRITE) as c_int;
        let ptr = unsafe { api!(RedisModule_OpenKey)(ctx, name, mode) }.cast();
        Key { ptr }
    }
    pub fn open_read(ctx: Ctx, name: RStr) -> Key {
        let ptr =
            unsafe { api!(RedisModule_OpenKey)(ctx, name, raw::REDISMODULE_READ as c_int) }.cast();
        Key { ptr }
    }
    pub fn key_type(&self) -> c_int {
        if self.ptr.is_null() {
            return raw::REDISMODULE_KEYTYPE_EMPTY as c_int;
        }
        unsafe { api!(RedisModule_KeyType)(self.ptr) }
    }
    pub fn module_type(&self) -> *mut raw::RedisModuleType {
        unsafe { api!(RedisModule_ModuleTypeGetType)(self.ptr) }
    }
    pub fn module_value(&self) -> *mut c_void {
        unsafe { api!(RedisModule_ModuleTypeGetValue)(self.ptr) }
    }
    pub fn set_module_value(&self, t: *mut raw::RedisModuleType, v: *mut c_void) -> bool {
        unsafe {
            api!(RedisModule_ModuleTypeSetValue)(self.ptr, t, v) == raw::REDISMODULE_OK as c_int
        }
    }
    /// The string value, read-only. Empty slice if the DMA fails.
    pub fn string(&self) -> &[u8] {
        let mut len = 0usize;
        let p = unsafe {
            api!(RedisModule_StringDMA)(self.ptr, &mut len, raw::REDISMODULE_READ as c_int)
        };
        if p.is_null() {
            return &[];
        }
        unsafe { slice::from_raw_parts(p.cast::<u8>(), len) }
    }
    pub fn delete(&self) {
        unsafe { api!(RedisModule_DeleteKey)(self.ptr) };
    }
    pub fn set_abs_expire(&self, at_ms: i64) {
        unsafe { api!(RedisModule_SetAbsExpire)(self.ptr, at_ms) };
    }
    /// Absolute expiry in unix ms, or None without one.
    pub fn abs_expire(&self) -> Option<i64> {
        let v = unsafe { api!(RedisModule_GetAbsExpire)(self.ptr) };
        (v >= 0).then_some(v)
    }
}

impl Drop for Key {
    fn drop(&mut self) {
        if !self.ptr.is_null() {
            unsafe { api!(RedisModule_CloseKey)(self.ptr) };
        }
    }
}

// ---- timers ----------------------------------------------------------------------

pub type TimerId = raw::RedisModuleTimerID;
pub type TimerCb = extern "C" fn(Ctx, *mut c_void);

pub fn create_timer(ctx: Ctx, ms: i64, cb: TimerCb, data: *mut c_void) -> TimerId {
    unsafe { api!(RedisModule_CreateTimer)(ctx, ms.max(0), Some(cb), data) }
}

/// Stops a timer and gives back its data pointer if it had not fired yet.
pub fn stop_timer(ctx: Ctx, id: TimerId) -> Option<*mut c_void> {
    let mut data: *mut c_void = ptr::null_mut();
    let ok = unsafe { api!(RedisModule_StopTimer)(ctx, id, &mut data) };
    (ok == raw::REDISMODULE_OK as c_int).then_some(data)
}
