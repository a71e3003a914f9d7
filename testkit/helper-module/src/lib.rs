//! A test-only module (`tests/paths.rs`, `tests/holes.rs`; loads on Redis 7.0):
//! `HELPER.CALL cmd arg...` answers what `RedisModule_Call` (`v!`) of it answered;
//! `HELPER.ONEVENT event cmd arg...` runs it once from inside the next generic keyspace
//! notification `event` (re-entrance); `HELPER.LAST` answers `[ran 0/1, reply-or-nil]`.

use std::cell::RefCell;

use redis_module::{
    redis_module, CallOptionsBuilder, CallReply, CallResult, Context, NotifyEvent, RedisError,
    RedisResult, RedisString, RedisValue,
};

thread_local! {
    /// The armed hook: (event name, command line).
    static HOOK: RefCell<Option<(String, Vec<Vec<u8>>)>> = const { RefCell::new(None) };
    /// What the hook's call answered, once it ran.
    static LAST: RefCell<Option<RedisValue>> = const { RefCell::new(None) };
}

fn run(ctx: &Context, argv: &[Vec<u8>]) -> RedisValue {
    let Some((cmd, rest)) = argv.split_first() else {
        return RedisValue::StringBuffer(b"ERR no command".to_vec());
    };
    let cmd = String::from_utf8_lossy(cmd).into_owned();
    let args: Vec<&[u8]> = rest.iter().map(Vec::as_slice).collect();
    let opts = CallOptionsBuilder::new().replicate().build();
    let res: CallResult = ctx.call_ext(&cmd, &opts, args.as_slice());
    value_of(&res)
}

/// The reply to send back: `RedisModule_Call` loses the status/bulk distinction, so
/// "OK", "QUEUED" and "PONG" go back as status replies, other strings as bulk strings.
fn value_of(res: &CallResult) -> RedisValue {
    let reply = match res {
        Ok(reply) => reply,
        Err(e) => return RedisValue::StaticError(leak(e.to_utf8_string().unwrap_or_default())),
    };
    match reply {
        CallReply::String(s) => match s.as_bytes() {
            b"OK" => RedisValue::SimpleStringStatic("OK"),
            b"QUEUED" => RedisValue::SimpleStringStatic("QUEUED"),
            b"PONG" => RedisValue::SimpleStringStatic("PONG"),
            b => RedisValue::StringBuffer(b.to_vec()),
        },
        CallReply::Array(a) => RedisValue::Array(a.iter().map(|x| value_of(&x)).collect()),
        other => other.into(),
    }
}

/// Error texts are few in a test server; a leaked copy travels as a `RedisValue`.
fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

fn helper_call(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if args.len() < 2 {
        return Err(RedisError::WrongArity);
    }
    let argv: Vec<Vec<u8>> = args[1..].iter().map(|a| a.as_slice().to_vec()).collect();
    match run(ctx, &argv) {
        RedisValue::StaticError(e) => Err(RedisError::String(e.to_string())),
        v => Ok(v),
    }
}

fn helper_onevent(_ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if args.len() < 3 {
        return Err(RedisError::WrongArity);
    }
    let event = args[1].to_string_lossy();
    let argv: Vec<Vec<u8>> = args[2..].iter().map(|a| a.as_slice().to_vec()).collect();
    HOOK.with(|h| *h.borrow_mut() = Some((event, argv)));
    LAST.with(|l| *l.borrow_mut() = None);
    Ok(RedisValue::SimpleStringStatic("OK"))
}

fn helper_last(_ctx: &Context, _args: Vec<RedisString>) -> RedisResult {
    let last = LAST.with(|l| l.borrow().clone());
    Ok(match last {
        None => RedisValue::Array(vec![RedisValue::Integer(0), RedisValue::Null]),
        Some(RedisValue::StaticError(e)) => RedisValue::Array(vec![
            RedisValue::Integer(1),
            RedisValue::SimpleString(format!("error: {e}")),
        ]),
        Some(v) => RedisValue::Array(vec![RedisValue::Integer(1), v]),
    })
}

fn on_generic(ctx: &Context, _t: NotifyEvent, event: &str, _key: &[u8]) {
    let hook = HOOK.with(|h| {
        let mut h = h.borrow_mut();
        match h.as_ref() {
            Some((want, _)) if want == event => h.take(),
            _ => None,
        }
    });
    if let Some((_, argv)) = hook {
        let v = run(ctx, &argv);
        LAST.with(|l| *l.borrow_mut() = Some(v));
    }
}

redis_module! {
    name: "lockhelper",
    version: 1,
    allocator: (redis_module::alloc::RedisAlloc, redis_module::alloc::RedisAlloc),
    data_types: [],
    commands: [
        ["helper.call", helper_call, "write", 0, 0, 0, ""],
        ["helper.onevent", helper_onevent, "", 0, 0, 0, ""],
        ["helper.last", helper_last, "", 0, 0, 0, ""],
    ],
    event_handlers: [
        [@GENERIC: on_generic],
    ],
}
